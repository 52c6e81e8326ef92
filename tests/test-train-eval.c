/* SPDX-License-Identifier: MIT
 *
 * tests/test-train-eval.c: `stowage train --val-data`: the validation loss
 * is the loss a step would compute on the same batch (bit for bit, with
 * learning rate 0 so the weights stay), an evaluation leaves the training
 * run's bytes as they were in every placement, and the flags are checked.
 * Its agreement with PyTorch is the oracle's (tests/oracle/, the
 * gqa-untied and sft cases evaluate).
 */
#include <math.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "core/json.h"
#include "testutil-io.h"
#include "testutil-train.h"

/* Member @name of each line of the JSON log @path (NaN where absent). */
static GArray *
log_values (const char *path, const char *name)
{
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  GArray *v = g_array_new (FALSE, FALSE, sizeof (double));
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++)
    {
      if (lines[i][0] == '\0')
        continue;
      g_autoptr (GError) error = NULL;
      g_autoptr (JsonNode) root
          = stow_json_parse_data (lines[i], -1, path, &error);
      g_assert_no_error (error);
      JsonObject *o = json_node_get_object (root);
      double x = json_object_has_member (o, name)
                     ? json_object_get_double_member (o, name)
                     : NAN;
      g_array_append_val (v, x);
    }
  return v;
}

/* With learning rate 0 the weights stay, so evaluating the training
 * stream's first batch after step 1 computes what step 1 computed: the
 * same loss, bit for bit (the same chunks, sums and scale). */
static void
test_same_as_step (void)
{
  Fixture f;
  fixture_init (&f);
  for (guint p = 0; p < 2; p++)
    {
      g_autofree char *out = g_strdup_printf ("%s/out-%u", f.dir, p);
      g_autofree char *log = g_strdup_printf ("%s/log-%u.jsonl", f.dir, p);
      g_auto (StowRun) r = { 0 };
      train (&r, &f, out, "--steps", "1", "--lr", "0", "--val-data", f.shard,
             "--eval-batches", "1", "--log-json", log, "--precision",
             p ? "bf16" : "fp32", NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_autoptr (GArray) loss = log_values (log, "loss");
      g_autoptr (GArray) val = log_values (log, "val_loss");
      g_assert_cmpuint (loss->len, ==, 1);
      g_assert_cmpfloat (g_array_index (val, double, 0), ==,
                         g_array_index (loss, double, 0));
      g_assert_nonnull (strstr (r.err, "validation: loss "));
      g_assert_nonnull (strstr (r.err, "(1 batches, 64 targets of "));
      g_assert_nonnull (strstr (r.err, "  val loss "));
    }
  fixture_clear (&f);
}

/* Evaluating after every step changes nothing the run writes: the same
 * checkpoint bytes and training losses as without, whatever the
 * placement (optimizer on the host, the delayed update, weights streamed
 * from host memory, the optimizer on NVMe). */
static void
test_no_side_effects (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *swap = g_build_filename (f.dir, "swap", NULL);
  g_assert_cmpint (g_mkdir (swap, 0755), ==, 0);
  const char *const placements[][8] = {
    { NULL },
    { "--offload-optimizer", "cpu", NULL },
    { "--offload-optimizer", "cpu", "--delayed-update", NULL },
    { "--offload-optimizer", "cpu", "--offload-params", "cpu", "--precision",
      "bf16", NULL },
    { "--offload-optimizer", "nvme", "--nvme-dir", swap, NULL },
  };
  for (guint i = 0; i < G_N_ELEMENTS (placements); i++)
    {
      g_autofree char *a = g_strdup_printf ("%s/plain-%u", f.dir, i);
      g_autofree char *b = g_strdup_printf ("%s/eval-%u", f.dir, i);
      g_autofree char *la = g_strdup_printf ("%s/plain-%u.jsonl", f.dir, i);
      g_autofree char *lb = g_strdup_printf ("%s/eval-%u.jsonl", f.dir, i);
      const char *plain[] = { "--steps", "3", "--log-json", la, NULL };
      const char *eval[]
          = { "--steps",      "3", "--log-json",     lb,  "--val-data", f.shard,
              "--eval-every", "1", "--eval-batches", "2", NULL };
      g_autoptr (GPtrArray) pa = args_join (plain, placements[i]);
      g_autoptr (GPtrArray) pb = args_join (eval, placements[i]);
      g_auto (StowRun) ra = { 0 };
      g_auto (StowRun) rb = { 0 };
      trainv (&ra, &f, a, (const char *const *)pa->pdata);
      trainv (&rb, &f, b, (const char *const *)pb->pdata);
      g_assert_cmpint (ra.status, ==, 0);
      g_assert_cmpint (rb.status, ==, 0);
      assert_same_checkpoint (a, b);
      g_autoptr (GArray) x = log_values (la, "loss");
      g_autoptr (GArray) y = log_values (lb, "loss");
      g_autoptr (GArray) v = log_values (lb, "val_loss");
      g_assert_cmpuint (x->len, ==, 3);
      g_assert_cmpuint (y->len, ==, 3);
      for (guint s = 0; s < 3; s++)
        {
          g_assert_cmpfloat (g_array_index (x, double, s), ==,
                             g_array_index (y, double, s));
          g_assert_true (isfinite (g_array_index (v, double, s)));
        }
    }
  fixture_clear (&f);
}

/* Evaluation every N steps and at the end; the flags refused by name. */
static void
test_schedule_and_flags (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "log.jsonl", NULL);
  g_auto (StowRun) r = { 0 };
  train (&r, &f, out, "--steps", "5", "--val-data", f.shard, "--eval-every",
         "2", "--eval-batches", "3", "--log-json", log, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (GArray) v = log_values (log, "val_loss");
  g_assert_cmpuint (v->len, ==, 5);
  for (guint s = 0; s < 5; s++)
    g_assert_cmpint (isnan (g_array_index (v, double, s)), ==,
                     !(s == 1 || s == 3 || s == 4));
  g_assert_nonnull (strstr (r.err, "(3 batches, 192 targets of "));

  const char *no_val[]
      = { "train", "--model", f.model, "--data",       f.shard, "--out",
          out,     "--steps", "1",     "--eval-every", "2",     NULL };
  stow_assert_usage_error (no_val, "--eval-every needs --val-data FILES");
  g_autofree char *small = g_build_filename (f.dir, "small.bin", NULL);
  write_shard (small, 20240520, 1, 50, 50, 300);
  g_autofree char *out2 = g_build_filename (f.dir, "out2", NULL);
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, out2, "--steps", "1", "--val-data", small, NULL);
  g_assert_cmpint (r2.status, !=, 0);
  g_assert_nonnull (strstr (r2.err, "--val-data"));
  g_assert_nonnull (strstr (r2.err, "50 tokens; one evaluation batch"));
  g_autofree char *out3 = g_build_filename (f.dir, "out3", NULL);
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, out3, "--steps", "1", "--val-data", f.shard, "--eval-batches",
         "1000", NULL);
  g_assert_cmpint (r3.status, !=, 0);
  g_assert_nonnull (strstr (r3.err, "--eval-batches 1000: --val-data "));
  g_assert_nonnull (strstr (r3.err, "holds 312 whole batches of 64 tokens"));
  fixture_clear (&f);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/train-eval/same-as-step", test_same_as_step);
  g_test_add_func ("/train-eval/no-side-effects", test_no_side_effects);
  g_test_add_func ("/train-eval/schedule-and-flags", test_schedule_and_flags);
  return g_test_run ();
}
