/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-settings.c: one set of training settings (issue 43): the
 * optimizer's flags read the same, with the same defaults and the same
 * errors, in fit, mem, plan, simulate and train; precision defaults to bf16
 * in each; a plan file carries the settings into `train --plan`;
 * --weight-decay-on says which tensors decay; and train's progress line
 * says "clipping off" when it does not clip.
 */
#include <math.h>
#include <string.h>

#include "core/json.h"
#include "executor/safetensors.h"
#include "testutil-train.h"

static const char *const commands[]
    = { "fit", "mem", "plan", "simulate", "train" };

static const char *const optim_flags[]
    = { "--lr",           "--min-lr",          "--warmup", "--lr-schedule",
        "--weight-decay", "--weight-decay-on", "--beta1",  "--beta2",
        "--eps",          "--max-grad-norm",   "--steps" };

/* The --help line of @flag (from "  --flag=" to the line's end). */
static char *
help_line (const char *help, const char *flag)
{
  g_autofree char *key = g_strdup_printf ("\n  %s=", flag);
  const char *p = strstr (help, key);
  g_assert_nonnull (p);
  p++;
  /* The description, after the column of flag names. */
  const char *eq = strchr (p, '=');
  const char *desc = strstr (eq, "  ");
  while (*desc == ' ')
    desc++;
  return g_strndup (desc, strcspn (desc, "\n"));
}

/* Every command lists the same flags with the same words, each with its
 * default. */
static void
test_help (void)
{
  /* (g_autofree on an array frees its first element only.) */
  char *first[G_N_ELEMENTS (optim_flags)] = { NULL };
  for (gsize c = 0; c < G_N_ELEMENTS (commands); c++)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, commands[c], "--help", NULL);
      g_assert_cmpint (r.status, ==, 0);
      for (gsize i = 0; i < G_N_ELEMENTS (optim_flags); i++)
        {
          g_autofree char *line = help_line (r.out, optim_flags[i]);
          g_test_message ("%s %s: %s", commands[c], optim_flags[i], line);
          if (first[i] == NULL)
            first[i] = g_strdup (line);
          g_assert_cmpstr (line, ==, first[i]);
          if (!g_str_equal (optim_flags[i], "--steps"))
            g_assert_nonnull (strstr (line, "default"));
        }
      /* One precision default, said in each. */
      g_autofree char *precision = help_line (r.out, "--precision");
      g_assert_nonnull (strstr (precision, "bf16 (default"));
    }
  for (gsize i = 0; i < G_N_ELEMENTS (optim_flags); i++)
    g_free (first[i]);
}

/* The command's arguments before the flags under test. */
static GPtrArray *
command_args (const char *command)
{
  GPtrArray *a = g_ptr_array_new ();
  g_ptr_array_add (a, (gpointer)command);
  if (!g_str_equal (command, "train"))
    {
      g_ptr_array_add (a, (gpointer) "llama-7b");
      g_ptr_array_add (a, (gpointer) "--gpus");
      g_ptr_array_add (a, (gpointer) "8xA100-80GB");
    }
  return a;
}

/* Settings that cannot train are refused by every command with the same
 * words, naming the flags. */
static void
test_errors (void)
{
  static const struct
  {
    const char *flags[5];
    const char *message;
  } bad[] = {
    { { "--beta1", "1", NULL },
      "--beta1 1, --beta2 0.999: each must be "
      "below 1" },
    { { "--lr", "1e-4", "--min-lr", "1e-3", NULL },
      "--min-lr 0.001 is above --lr 0.0001" },
    { { "--lr-schedule", "cosine", NULL },
      "--lr-schedule cosine decays to --min-lr at the run's last step: give "
      "--steps N" },
    { { "--lr", "fast", NULL }, "--lr \"fast\": expected a number >= 0" },
    { { "--steps", "0", NULL },
      "--steps \"0\": expected a count of at "
      "least 1" },
    { { "--weight-decay-on", "norms", NULL },
      "--weight-decay-on \"norms\": expected matrices" },
  };
  for (gsize c = 0; c < G_N_ELEMENTS (commands); c++)
    for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
      {
        g_autoptr (GPtrArray) a = command_args (commands[c]);
        for (guint k = 0; bad[i].flags[k]; k++)
          g_ptr_array_add (a, (gpointer)bad[i].flags[k]);
        g_ptr_array_add (a, NULL);
        stow_assert_usage_error ((const char *const *)a->pdata, bad[i].message);
      }
}

/* The lr column of a --log-json file. */
static GArray *
logged_lrs (const char *path)
{
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  GArray *lrs = g_array_new (FALSE, FALSE, sizeof (double));
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l; l++)
    {
      if (**l == '\0')
        continue;
      g_autoptr (JsonNode) n = stow_json_parse_data (*l, -1, "log", NULL);
      g_assert_nonnull (n);
      JsonObject *o = json_node_get_object (n);
      double lr = json_object_get_double_member (o, "lr");
      g_array_append_val (lrs, lr);
      /* No clipping: no norm computed, null in the log. */
      g_assert_true (json_object_get_null_member (o, "grad_norm"));
    }
  return lrs;
}

/* train defaults to bf16 as the planner does; --max-grad-norm 0 prints
 * "clipping off", not a NaN norm; a plan file from fit carries the
 * settings into train --plan (its schedule, no clipping; train's own
 * --steps is required), and the optimizer's flags beside --plan replace
 * the plan's. */
static void
test_train (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  const char *const plain[]
      = { "train", "--model",         f.model, "--data", f.shard, "--seq",
          "16",    "--micro-batch",   "2",     "--out",  out,     "--steps",
          "2",     "--max-grad-norm", "0",     NULL };
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, plain);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.err, "step 2/2  loss "));
  g_assert_nonnull (strstr (r.err, "  clipping off  lr "));
  g_assert_null (strstr (r.err, "nan"));
  g_autofree char *cfg = contents (out, "config.json");
  g_assert_nonnull (strstr (cfg, "\"torch_dtype\" : \"bfloat16\""));
  g_auto (StowRun) fit = { 0 };
  stow_run (&fit, "fit", f.config, "--gpus", "1xA100-80GB", NULL);
  g_assert_nonnull (strstr (fit.out, "seq 2048, bf16, adamw"));

  g_autofree char *plan = g_build_filename (f.dir, "plan.json", NULL);
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "fit", f.config, "--gpus", "1xA100-80GB", "--zero", "0",
            "--seq", "16", "--micro-batch", "2", "--global-batch", "4", "--lr",
            "0.01", "--min-lr", "0.001", "--lr-schedule", "linear", "--steps",
            "3", "--max-grad-norm", "0", "--emit", "plan", "-o", plan, NULL);
  g_assert_cmpint (p.status, ==, 0);
  g_autofree char *run = g_build_filename (f.dir, "run", NULL);
  g_autofree char *log = g_build_filename (f.dir, "run.jsonl", NULL);
  g_auto (StowRun) t = { 0 };
  stow_run (&t, "train", "--model", f.model, "--data", f.shard, "--plan", plan,
            "--steps", "3", "--out", run, "--log-json", log, NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_assert_nonnull (strstr (t.err, "step 3/3  loss "));
  g_assert_nonnull (strstr (t.err, "clipping off"));
  g_autoptr (GArray) lrs = logged_lrs (log);
  g_assert_cmpuint (lrs->len, ==, 3);
  /* linear from 0.01 to 0.001 over 3 steps: step k at 0.001 + 0.009 (1 -
   * k/3) */
  for (guint k = 1; k <= 3; k++)
    g_assert_cmpfloat_with_epsilon (g_array_index (lrs, double, k - 1),
                                    0.001 + 0.009 * (1.0 - k / 3.0), 1e-12);

  g_autofree char *over = g_build_filename (f.dir, "over", NULL);
  g_autofree char *olog = g_build_filename (f.dir, "over.jsonl", NULL);
  g_auto (StowRun) o = { 0 };
  stow_run (&o, "train", "--model", f.model, "--data", f.shard, "--plan", plan,
            "--out", over, "--log-json", olog, "--lr-schedule", "constant",
            "--steps", "2", NULL);
  g_assert_cmpint (o.status, ==, 0);
  g_autoptr (GArray) olrs = logged_lrs (olog);
  g_assert_cmpuint (olrs->len, ==, 2);
  g_assert_cmpfloat (g_array_index (olrs, double, 1), ==, 0.01);
  fixture_clear (&f);
}

/* The first element of @name in @out's latest checkpoint (fp32). */
static float
first_element (const char *out, const char *name)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *path
      = g_build_filename (out, "latest", "model.safetensors", NULL);
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
  g_assert_no_error (error);
  const StowSafetensor *t = stow_safetensors_find (st, name);
  g_assert_nonnull (t);
  g_assert_cmpstr (t->dtype, ==, "F32");
  float v = 0;
  g_assert_true (stow_safetensors_read (st, t, 0, &v, sizeof v, &error));
  return v;
}

/* --weight-decay-on all decays the norms' weights too: after one step of
 * AdamW (decoupled decay, p (1 - lr wd) beside the same Adam update) a norm
 * weight, initialised to 1, is lr wd lower than with the default
 * (matrices), and a matrix is the same. */
static void
test_decay_on (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *mat = g_build_filename (f.dir, "matrices", NULL);
  g_autofree char *all = g_build_filename (f.dir, "all", NULL);
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, mat, "--steps", "1", "--lr", "0.01", "--weight-decay", "0.5",
         "--max-grad-norm", "0", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, all, "--steps", "1", "--lr", "0.01", "--weight-decay", "0.5",
         "--max-grad-norm", "0", "--weight-decay-on", "all", NULL);
  g_assert_cmpint (r2.status, ==, 0);
  const char *norm = "model.norm.weight";
  g_assert_cmpfloat_with_epsilon (
      first_element (mat, norm) - first_element (all, norm), 0.01 * 0.5, 1e-6);
  const char *q = "model.layers.0.self_attn.q_proj.weight";
  g_assert_cmpfloat (first_element (mat, q), ==, first_element (all, q));
  fixture_clear (&f);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-settings/help", test_help);
  g_test_add_func ("/cli-settings/errors", test_errors);
  g_test_add_func ("/cli-settings/train", test_train);
  g_test_add_func ("/cli-settings/decay-on", test_decay_on);
  return g_test_run ();
}
