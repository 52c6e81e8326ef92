/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-emit.c: `fit --emit ENGINE` as a user runs it: the config
 * is planned with that engine's own memory model (read back and priced
 * with `mem --engine ENGINE`, it fits), --engine or a plan file that
 * disagrees is refused, and nothing fitting says under which model and
 * what would fit (issue 23, "Configs planned for their engine").
 */
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

#include "core/json.h"
#include "core/optim.h"
#include "tests/testutil.h"

/* The case of issue 23: llama-65b on one DGX A100. */
#define MODEL "llama-65b"
#define GPUS  "8xA100-80GB"

static JsonObject *
parse (const char *text, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  *root = stow_json_parse_data (text, -1, "stdout", &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

/* "--flag value" lines of Megatron-LM arguments: the value of @flag, or
 * "" for a flag without one, or NULL when it is absent. */
static char *
arg_value (const char *args, const char *flag)
{
  g_auto (GStrv) lines = g_strsplit (args, "\n", -1);
  gsize n = strlen (flag);
  for (char **l = lines; *l; l++)
    if (strncmp (*l, flag, n) == 0 && ((*l)[n] == ' ' || (*l)[n] == '\0'))
      return g_strdup ((*l)[n] == ' ' ? *l + n + 1 : "");
  return NULL;
}

/* @err without the "stowage: note:" lines --emit adds for what a config
 * cannot carry of the optimizer settings (tested in /cli-emit/optim-*). */
static char *
without_notes (const char *err)
{
  g_auto (GStrv) lines = g_strsplit (err, "\n", -1);
  GString *s = g_string_new (NULL);
  for (char **l = lines; *l; l++)
    if (**l && !g_str_has_prefix (*l, "stowage: note: "))
      g_string_append_printf (s, "%s\n", *l);
  return g_string_free (s, FALSE);
}

/* Lines of @err that are not such notes. */
static guint
other_lines (const char *err)
{
  g_autofree char *rest = without_notes (err);
  return stow_count_lines (rest);
}

/* Runs `mem` on the layout an emitted config carries, pinned in full, with
 * the config's engine; returns its exit status (0: it fits). */
static int
mem_status (const char *const *layout)
{
  const char *args[48] = { "mem", MODEL, "--gpus", GPUS };
  guint n = 4;
  for (guint i = 0; layout[i]; i++)
    args[n++] = layout[i];
  args[n] = NULL;
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, args);
  g_test_message ("mem for the emitted layout: exit %d\n%s", r.status, r.out);
  return r.status;
}

/* Issue 23: the DeepSpeed config was ZeRO-3 with the optimizer on the CPU
 * and parameters on the GPU, which DeepSpeed's own model puts at 92.79 GiB
 * against 79.14 usable.  Now it is one that fits under that model. */
static void
test_deepspeed (void)
{
  const char *const old_layout[] = { "--engine",
                                     "deepspeed",
                                     "--dp",
                                     "8",
                                     "--tp",
                                     "1",
                                     "--pp",
                                     "1",
                                     "--cp",
                                     "1",
                                     "--zero",
                                     "3",
                                     "--offload-optimizer",
                                     "cpu",
                                     "--offload-params",
                                     "none",
                                     "--recompute",
                                     "none",
                                     "--offload-activations",
                                     "none",
                                     "--micro-batch",
                                     "1",
                                     NULL };
  g_assert_cmpint (mem_status (old_layout), ==, 1);

  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", MODEL, "--gpus", GPUS, "--emit", "deepspeed", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  JsonObject *z = json_object_get_object_member (o, "zero_optimization");
  gint64 stage = json_object_get_int_member (z, "stage");
  const char *opt
      = json_object_has_member (z, "offload_optimizer")
            ? json_object_get_string_member (
                json_object_get_object_member (z, "offload_optimizer"),
                "device")
            : "none";
  const char *par
      = json_object_has_member (z, "offload_param")
            ? json_object_get_string_member (
                json_object_get_object_member (z, "offload_param"), "device")
            : "none";
  gboolean ckpt = json_object_has_member (o, "activation_checkpointing");
  g_autofree char *zs = g_strdup_printf ("%" G_GINT64_FORMAT, stage);
  g_autofree char *mb = g_strdup_printf (
      "%" G_GINT64_FORMAT,
      json_object_get_int_member (o, "train_micro_batch_size_per_gpu"));
  g_assert_cmpint (
      json_object_get_int_member (o, "train_batch_size"), ==,
      8 * json_object_get_int_member (o, "train_micro_batch_size_per_gpu")
          * json_object_get_int_member (o, "gradient_accumulation_steps"));
  const char *const layout[] = { "--engine",
                                 "deepspeed",
                                 "--dp",
                                 "8",
                                 "--tp",
                                 "1",
                                 "--pp",
                                 "1",
                                 "--cp",
                                 "1",
                                 "--zero",
                                 zs,
                                 "--offload-optimizer",
                                 opt,
                                 "--offload-params",
                                 par,
                                 "--recompute",
                                 ckpt ? "full" : "none",
                                 "--offload-activations",
                                 "none",
                                 "--micro-batch",
                                 mb,
                                 NULL };
  g_assert_cmpint (mem_status (layout), ==, 0);
}

/* Megatron-LM refused (ZeRO 3 is not its); now its fastest layout under
 * Megatron's model, which `mem --engine megatron` confirms fits. */
static void
test_megatron (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", MODEL, "--gpus", GPUS, "--emit", "megatron", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *tp = arg_value (r.out, "--tensor-model-parallel-size");
  g_autofree char *pp = arg_value (r.out, "--pipeline-model-parallel-size");
  g_autofree char *cp = arg_value (r.out, "--context-parallel-size");
  g_autofree char *per_v
      = arg_value (r.out, "--num-layers-per-virtual-pipeline-stage");
  g_autofree char *mbs = arg_value (r.out, "--micro-batch-size");
  g_autofree char *gbs = arg_value (r.out, "--global-batch-size");
  g_autofree char *dist = arg_value (r.out, "--use-distributed-optimizer");
  g_autofree char *cpu = arg_value (r.out, "--optimizer-cpu-offload");
  g_autofree char *gran = arg_value (r.out, "--recompute-granularity");
  g_autofree char *method = arg_value (r.out, "--recompute-method");
  g_autofree char *k = arg_value (r.out, "--recompute-num-layers");
  g_autofree char *sp = arg_value (r.out, "--sequence-parallel");
  g_assert_nonnull (tp);
  g_assert_nonnull (pp);
  g_assert_nonnull (mbs);
  g_assert_nonnull (gbs);
  guint64 t = g_ascii_strtoull (tp, NULL, 10);
  guint64 p = g_ascii_strtoull (pp, NULL, 10);
  guint64 c = cp ? g_ascii_strtoull (cp, NULL, 10) : 1;
  guint64 d = 8 / (t * p * c);
  g_autofree char *dp = g_strdup_printf ("%" G_GUINT64_FORMAT, d);
  g_autofree char *vpp = g_strdup_printf (
      "%" G_GUINT64_FORMAT,
      per_v ? 80 / (p * g_ascii_strtoull (per_v, NULL, 10)) : 1);
  g_autofree char *accum = g_strdup_printf (
      "%" G_GUINT64_FORMAT, g_ascii_strtoull (gbs, NULL, 10)
                                / (g_ascii_strtoull (mbs, NULL, 10) * d));
  g_autofree char *rc
      = gran == NULL                      ? g_strdup ("none")
        : g_str_equal (gran, "selective") ? g_strdup ("selective")
        : g_str_equal (method, "block")   ? g_strdup_printf ("full:%s", k)
                                          : g_strdup ("full");
  const char *const layout[] = { "--engine",
                                 "megatron",
                                 "--dp",
                                 dp,
                                 "--tp",
                                 tp,
                                 "--pp",
                                 pp,
                                 "--cp",
                                 cp ? cp : "1",
                                 "--vpp",
                                 vpp,
                                 sp ? "--sp" : "--no-sp",
                                 "--zero",
                                 dist ? "1" : "0",
                                 "--offload-optimizer",
                                 cpu ? "cpu" : "none",
                                 "--offload-params",
                                 "none",
                                 "--offload-activations",
                                 "none",
                                 "--recompute",
                                 rc,
                                 "--micro-batch",
                                 mbs,
                                 "--grad-accum",
                                 accum,
                                 NULL };
  g_assert_cmpint (mem_status (layout), ==, 0);
}

/* The value after "NAME = " in a Python snippet, up to the end of the
 * line or a comment. */
static char *
py_value (const char *py, const char *name)
{
  g_autofree char *key = g_strdup_printf ("\n%s = ", name);
  const char *v = strstr (py, key);
  if (v == NULL)
    return NULL;
  v += strlen (key);
  gsize n = strcspn (v, "#\n");
  while (n > 0 && v[n - 1] == ' ')
    n--;
  return g_strndup (v, n);
}

/* The value of keyword argument @name in "    name=value," lines. */
static char *
kwarg_value (const char *py, const char *name)
{
  g_autofree char *key = g_strdup_printf ("\n    %s=", name);
  const char *v = strstr (py, key);
  if (v == NULL)
    return NULL;
  v += strlen (key);
  return g_strndup (v, strcspn (v, ",\n"));
}

/* FSDP refused (optimizer offload without parameters is not FSDP's); now
 * FSDP's fastest layout under FSDP's model: read back (sharding, offload,
 * the blocks checkpointed) and priced with mem --engine fsdp, it fits. */
static void
test_fsdp (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", MODEL, "--gpus", GPUS, "--emit", "fsdp", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *reshard = kwarg_value (r.out, "reshard_after_forward");
  g_autofree char *offload = kwarg_value (r.out, "offload_policy");
  g_autofree char *ckpt = py_value (r.out, "ACTIVATION_CHECKPOINTING");
  g_autofree char *blocks = py_value (r.out, "CHECKPOINTED_BLOCKS");
  g_assert_nonnull (reshard);
  g_assert_nonnull (offload);
  g_assert_nonnull (ckpt);
  gboolean cpu = g_str_has_prefix (offload, "CPUOffloadPolicy");
  g_autofree char *rc = !g_str_equal (ckpt, "True") ? g_strdup ("none")
                        : g_str_equal (blocks, "None")
                            ? g_strdup ("full")
                            : g_strdup_printf ("full:%s", blocks);
  g_autofree char *mb = py_value (r.out, "MICRO_BATCH_SIZE");
  const char *const layout[] = { "--engine",
                                 "fsdp",
                                 "--dp",
                                 "8",
                                 "--tp",
                                 "1",
                                 "--pp",
                                 "1",
                                 "--cp",
                                 "1",
                                 "--zero",
                                 g_str_equal (reshard, "True") ? "3" : "2",
                                 "--offload-optimizer",
                                 cpu ? "cpu" : "none",
                                 "--offload-params",
                                 cpu ? "cpu" : "none",
                                 "--recompute",
                                 rc,
                                 "--offload-activations",
                                 "none",
                                 "--micro-batch",
                                 mb,
                                 NULL };
  g_assert_cmpint (mem_status (layout), ==, 0);
}

/* --recompute full:K keeps the activations of all but K blocks: the FSDP
 * snippet wraps those K only (it wrapped every block before), with
 * apply_activation_checkpointing's check_fn; full wraps them all. */
static void
test_fsdp_partial_recompute (void)
{
  g_auto (StowRun) k = { 0 };
  stow_run (&k, "mem", "llama-7b", "--gpus", GPUS, "--engine", "fsdp", "--zero",
            "3", "--recompute", "full:5", "--emit", "fsdp", NULL);
  g_assert_cmpint (k.status, ==, 0);
  g_autofree char *five = py_value (k.out, "CHECKPOINTED_BLOCKS");
  g_assert_cmpstr (five, ==, "5");
  g_assert_nonnull (strstr (k.out, "the first 5 of 32 transformer blocks"));
  g_assert_nonnull (strstr (k.out, "check_fn=lambda m: m in chosen"));
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "llama-7b", "--gpus", GPUS, "--engine", "fsdp", "--zero",
            "3", "--recompute", "full", "--emit", "fsdp", NULL);
  g_assert_cmpint (a.status, ==, 0);
  g_autofree char *all = py_value (a.out, "CHECKPOINTED_BLOCKS");
  g_assert_cmpstr (all, ==, "None");
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "mem", "llama-7b", "--gpus", GPUS, "--engine", "fsdp", "--zero",
            "3", "--recompute", "none", "--emit", "fsdp", NULL);
  g_assert_cmpint (n.status, ==, 0);
  g_assert_null (strstr (n.out, "CHECKPOINTED_BLOCKS"));

  /* accelerate's fsdp_activation_checkpointing wraps every block: a
   * partial recomputation is refused there, and a fit --emit accelerate
   * picks a layout without one. */
  const char *const acc[]
      = { "mem",    "llama-7b",   "--gpus", GPUS,          "--engine",
          "fsdp",   "--zero",     "3",      "--recompute", "full:5",
          "--emit", "accelerate", NULL };
  stow_assert_usage_error (acc, "--recompute full:5");
}

/* accelerate's MegatronLMPlugin makes megatron_lm_recompute_activations
 * selective recomputation (accelerate utils/dataclasses.py): true only
 * for --recompute selective; full recomputation is refused. */
static void
test_accelerate_megatron_recompute (void)
{
  g_auto (StowRun) s = { 0 };
  stow_run (&s, "mem", "llama-7b", "--gpus", GPUS, "--engine", "megatron",
            "--tp", "2", "--zero", "1", "--recompute", "selective", "--emit",
            "accelerate", NULL);
  g_assert_cmpint (s.status, ==, 0);
  g_assert_nonnull (
      strstr (s.out, "  megatron_lm_recompute_activations: true\n"));
  const char *const full[]
      = { "mem",         "llama-7b", "--gpus", GPUS,         "--engine",
          "megatron",    "--tp",     "2",      "--zero",     "1",
          "--recompute", "full",     "--emit", "accelerate", NULL };
  stow_assert_usage_error (full, "selective");
}

/* accelerate runs under DeepSpeed, FSDP or Megatron-LM: the fastest of
 * the three that fits under its own model and that the YAML expresses. */
static void
test_accelerate (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", MODEL, "--gpus", GPUS, "--emit", "accelerate", "-v",
            NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (strstr (r.out, "distributed_type: DEEPSPEED\n")
                 || strstr (r.out, "distributed_type: FSDP\n")
                 || strstr (r.out, "distributed_type: MEGATRON_LM\n"));
  g_assert_null (strstr (r.err, "(stowage's memory model)"));
}

/* An --engine the config does not run under, or a plan file made for
 * another engine, is refused in one line naming both. */
static void
test_engine_conflicts (void)
{
  const char *const ds_fsdp[]
      = { "fit",  "llama-13b", "--gpus",    GPUS, "--engine",
          "fsdp", "--emit",    "deepspeed", NULL };
  stow_assert_usage_error (ds_fsdp, "--engine fsdp");
  const char *const acc_stow[]
      = { "fit",     "llama-13b", "--gpus",     GPUS, "--engine",
          "stowage", "--emit",    "accelerate", NULL };
  stow_assert_usage_error (acc_stow, "--engine stowage");

  g_autofree char *dir = g_dir_make_tmp ("stow-emit-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename (dir, "plan.json", NULL);
  g_auto (StowRun) w = { 0 };
  stow_run (&w, "fit", "llama-13b", "--gpus", GPUS, "--emit", "plan", "-o",
            plan, NULL);
  g_assert_cmpint (w.status, ==, 0);
  const char *const from_plan[]
      = { "mem", "--plan", plan, "--emit", "deepspeed", NULL };
  stow_assert_usage_error (from_plan, "engine stowage");
  /* A plan made for the engine is emitted as it is. */
  g_auto (StowRun) w2 = { 0 };
  stow_run (&w2, "fit", "llama-13b", "--gpus", GPUS, "--engine", "deepspeed",
            "--emit", "plan", "-o", plan, NULL);
  g_assert_cmpint (w2.status, ==, 0);
  g_auto (StowRun) e = { 0 };
  stow_run (&e, "mem", "--plan", plan, "--emit", "deepspeed", NULL);
  g_assert_cmpint (e.status, ==, 0);
  g_assert_nonnull (strstr (e.out, "\"zero_optimization\""));
  g_unlink (plan);
  g_rmdir (dir);
}

/* Nothing fits under the engine's model: nothing on stdout, and stderr
 * says which model was searched, how close the nearest layout came and
 * what would fit under that same model. */
static void
test_no_fit (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", MODEL, "--gpus", "8xV100-16GB", "--precision", "fp16",
            "--emit", "megatron", NULL);
  g_assert_cmpint (r.status, ==, 1);
  g_assert_cmpstr (r.out, ==, "");
  g_assert_nonnull (strstr (r.err, "nothing to emit for megatron"));
  g_assert_nonnull (strstr (r.err, "Megatron-LM's memory model"));
  g_assert_nonnull (strstr (r.err, "hint: would fit: 32xV100-16GB: "));
  g_assert_nonnull (strstr (r.err, ", megatron ("));
  /* One larger GPU named (the alternatives' kind, not their text, says
   * which are), the others counted. */
  guint same_nodes = 0;
  for (const char *p = r.err; (p = strstr (p, " in the same nodes: ")); p++)
    same_nodes++;
  g_assert_cmpuint (same_nodes, ==, 1);
  g_assert_nonnull (strstr (r.err, " other GPUs would fit too: "));
  g_assert_cmpuint (stow_count_lines (r.err), <=, 6);
}

/* What Megatron-LM needs to rebuild the model: the RoPE base and Llama 3's
 * rope scaling from each model's published config.json (Meta's
 * Meta-Llama-3-8B: rope_theta 500000, rms_norm_eps 1e-05; Mistral's
 * Mixtral-8x7B-v0.1: rope_theta 1e6; Meta's Llama-3.1-70B and -8B:
 * rope_scaling llama3, factor 8, low 1, high 4, original 8192; Llama-3.2-1B
 * and -3B: the same with factor 32; LLaMA-1 has no
 * rope_theta: HF LlamaConfig's 10000, rms_norm_eps 1e-06), not Megatron's
 * defaults (--rotary-base 10000, --norm-epsilon 1e-5). */
static void
test_megatron_rope (void)
{
  static const struct
  {
    const char *model, *base, *eps;
    const char *factor; /* --rope-scaling-factor, NULL: no scaling */
  } cases[] = {
    { "llama-3-8b", "500000", "1e-05", NULL },
    { "mixtral-8x7b", "1000000", "1e-05", NULL },
    { "llama-3.1-70b", "500000", "1e-05", "8" },
    { "llama-3.1-8b", "500000", "1e-05", "8" },
    { "llama-3.2-1b", "500000", "1e-05", "32" },
    { "llama-7b", "10000", "1e-06", NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "fit", cases[i].model, "--gpus", "64xH100-SXM", "--emit",
                "megatron", NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_autofree char *base = arg_value (r.out, "--rotary-base");
      g_autofree char *eps = arg_value (r.out, "--norm-epsilon");
      g_autofree char *use = arg_value (r.out, "--use-rope-scaling");
      g_autofree char *factor = arg_value (r.out, "--rope-scaling-factor");
      g_assert_cmpstr (base, ==, cases[i].base);
      g_assert_cmpstr (eps, ==, cases[i].eps);
      g_assert_cmpstr (factor, ==, cases[i].factor);
      g_assert_true ((use != NULL) == (cases[i].factor != NULL));
    }
  /* Scaling Megatron's GPT flags cannot express is refused, by name. */
  const char *const gemma[] = { "fit",    "gemma-3-4b", "--gpus", "8xH100-SXM",
                                "--emit", "megatron",   NULL };
  stow_assert_usage_error (gemma, "rope_scaling type \"linear\"");
  /* Gemma's GeGLU, scaled embedding and (1 + w) RMSNorm (Gemma 2: logit
   * soft-capping, sliding windows) are no GPT flags: refused, not written
   * as --swiglu. */
  const char *const gemma2[] = { "fit",    "gemma-2-9b", "--gpus", "8xH100-SXM",
                                 "--emit", "megatron",   NULL };
  stow_assert_usage_error (gemma2, "soft-caps logits");
  const char *const gemma1[] = { "fit",    "gemma-7b", "--gpus", "8xH100-SXM",
                                 "--emit", "megatron", NULL };
  stow_assert_usage_error (gemma1, "GeGLU");
  /* ALiBi (BLOOM) has no Megatron-LM GPT position type: refused, not
   * written as rotary. */
  const char *const bloom[] = { "fit",    "bloom-560m", "--gpus", "8xH100-SXM",
                                "--emit", "megatron",   NULL };
  stow_assert_usage_error (bloom, "neither learned positions nor rotary");
  /* MPT's learned position table keeps its size (max_seq_len). */
  g_autofree char *mpt = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                "mpt-760m.json", NULL);
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "fit", mpt, "--gpus", "8xH100-SXM", "--seq", "2048", "--emit",
            "megatron", NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_autofree char *kind = arg_value (m.out, "--position-embedding-type");
  g_autofree char *positions = arg_value (m.out, "--max-position-embeddings");
  g_assert_cmpstr (kind, ==, "learned_absolute");
  g_assert_cmpstr (positions, ==, "2048");
}

/* What the config cannot carry and the training script must do is said
 * beside it: flash-attn's fused cross-entropy (--fused-loss), DeepSpeed's
 * pipeline stages. */
static void
test_script_warnings (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-3.2-3b", "--gpus", "8xH100-SXM", "--engine",
            "fsdp", "--zero", "3", "--fused-loss", "--emit", "fsdp", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.err, "warning: --emit fsdp: the plan counts "
                                   "the loss as flash-attn's fused"));
  g_assert_cmpuint (other_lines (r.err), ==, 1);
  g_auto (StowRun) q = { 0 };
  stow_run (&q, "mem", "llama-3.2-3b", "--gpus", "8xH100-SXM", "--engine",
            "fsdp", "--zero", "3", "--emit", "fsdp", NULL);
  g_assert_cmpint (q.status, ==, 0);
  g_assert_cmpuint (other_lines (q.err), ==, 0);

  /* DeepSpeed's pipeline stages live in the script (PipelineModule), not
   * in its config: said once, with the stage count. */
  g_auto (StowRun) pp = { 0 };
  stow_run (&pp, "mem", "llama-7b", "--gpus", "8xH100-SXM", "--engine",
            "deepspeed", "--pp", "2", "--tp", "1", "--cp", "1", "--dp", "4",
            "--zero", "1", "--emit", "deepspeed", NULL);
  g_assert_cmpint (pp.status, ==, 0);
  g_assert_nonnull (strstr (pp.err, "PipelineModule (layers, num_stages=2)"));
  g_assert_cmpuint (other_lines (pp.err), ==, 1);
}

/* NVMe offload with no drive path named: the config's nvme_path is
 * stowage's placeholder, and stderr says so (once per config, naming the
 * key, the placeholder and the flag that fixes it); --nvme-path or a
 * cluster.json with drive paths leaves nothing to warn about. */
static void
test_nvme_placeholder (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-65b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "nvme",
            "--offload-params", "nvme", "--emit", "deepspeed", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "\"nvme_path\" : \"/local_nvme\""));
  g_assert_nonnull (strstr (r.err, "warning: --emit deepspeed: "));
  g_assert_nonnull (strstr (r.err, "(nvme_path) is /local_nvme, a "
                                   "placeholder"));
  g_assert_nonnull (strstr (r.err, "--nvme-path DIR"));
  g_assert_cmpuint (other_lines (r.err), ==, 1);

  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "llama-65b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "nvme",
            "--offload-params", "nvme", "--emit", "accelerate", NULL);
  g_assert_cmpint (a.status, ==, 0);
  g_assert_nonnull (strstr (a.err, "offload_*_nvme_path"));

  g_auto (StowRun) q = { 0 };
  stow_run (&q, "mem", "llama-65b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "nvme",
            "--offload-params", "nvme", "--emit", "deepspeed", "-q", NULL);
  g_assert_cmpuint (other_lines (q.err), ==, 0);

  g_auto (StowRun) n = { 0 };
  stow_run (&n, "mem", "llama-65b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "nvme",
            "--offload-params", "nvme", "--emit", "deepspeed", "--nvme-path",
            "/mnt/nvme0", NULL);
  g_assert_cmpint (n.status, ==, 0);
  g_assert_nonnull (strstr (n.out, "\"nvme_path\" : \"/mnt/nvme0\""));
  g_assert_cmpuint (other_lines (n.err), ==, 0);

  g_autofree char *cluster = g_test_build_filename (
      G_TEST_DIST, "data", "cluster", "dgx-h100-overrides.json", NULL);
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "fit", "llama-65b", "--cluster", cluster, "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "nvme",
            "--offload-params", "nvme", "--emit", "deepspeed", NULL);
  g_assert_cmpint (c.status, ==, 0);
  g_assert_nonnull (strstr (c.out, "\"nvme_path\" : \"/mnt/nvme0\""));
  g_assert_null (strstr (c.err, "placeholder"));
}

/* Precision against the GPU.  Transformer Engine runs fp8 from compute
 * capability 8.9 (H100 9.0, L40S 8.9) and refuses it below (A100 8.0,
 * V100 7.0), and nothing emulates it: every planning command refuses
 * --precision fp8 there, naming the flag, the GPU and why (it "fit" at
 * 74.5% MFU on V100 before).  bf16 tensor cores start at 8.0: on a V100
 * PyTorch emulates bf16, so an explicit --precision bf16 is planned with
 * a warning, and the default becomes fp16 there. */
static void
test_precision_gpu (void)
{
  static const char *const fp8_refused[] = { "8xV100", "8xA100-80GB", "8xT4" };
  for (gsize i = 0; i < G_N_ELEMENTS (fp8_refused); i++)
    {
      const char *const fit[]
          = { "fit",         "llama-7b", "--gpus", fp8_refused[i],
              "--precision", "fp8",      NULL };
      stow_assert_usage_error (fit, "--precision fp8: the ");
      const char *const plan[]
          = { "plan",        "llama-7b", "--gpus", fp8_refused[i],
              "--precision", "fp8",      NULL };
      stow_assert_usage_error (plan, "no fp8 tensor cores");
      const char *const mem[] = { "mem",          "llama-7b",    "--gpus",
                                  fp8_refused[i], "--precision", "fp8",
                                  "--emit",       "megatron",    NULL };
      stow_assert_usage_error (mem, "compute capability 8.9");
    }
  g_auto (StowRun) h = { 0 };
  stow_run (&h, "fit", "llama-7b", "--gpus", "8xH100-SXM", "--precision", "fp8",
            NULL);
  g_assert_cmpint (h.status, ==, 0);
  g_assert_cmpuint (other_lines (h.err), ==, 0);
  g_auto (StowRun) l = { 0 };
  stow_run (&l, "fit", "llama-7b", "--gpus", "8xL40S", "--precision", "fp8",
            NULL);
  g_assert_cmpint (l.status, ==, 0);

  g_auto (StowRun) b = { 0 };
  stow_run (&b, "fit", "llama-7b", "--gpus", "8xV100", "--precision", "bf16",
            "--emit", "deepspeed", NULL);
  g_assert_cmpint (b.status, ==, 0);
  g_assert_nonnull (strstr (b.err, "warning: --precision bf16: the "
                                   "V100-32GB has no bf16 tensor cores"));
  g_assert_nonnull (strstr (b.err, "PyTorch emulates bf16"));
  g_assert_nonnull (strstr (b.out, "\"bf16\" : {\n    \"enabled\" : true"));

  g_auto (StowRun) d = { 0 };
  stow_run (&d, "fit", "llama-7b", "--gpus", "8xV100", "--emit", "deepspeed",
            NULL);
  g_assert_cmpint (d.status, ==, 0);
  g_assert_cmpuint (other_lines (d.err), ==, 0);
  g_assert_nonnull (strstr (d.out, "\"fp16\" : {\n    \"enabled\" : true"));
  g_auto (StowRun) t = { 0 };
  stow_run (&t, "fit", "llama-7b", "--gpus", "8xV100", NULL);
  g_assert_nonnull (strstr (t.out, "train:   seq 2048, fp16, adamw"));
}

/* --etp, Megatron-core's --expert-tensor-parallel-size: written as that
 * flag, shown as "etp" in the plan's JSON, and a bad value is refused
 * naming the flag and the value. */
static void
test_megatron_etp (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--engine",
            "megatron", "--tp", "2", "--ep", "8", "--etp", "1", "--dp", "8",
            "--pp", "1", "--seq", "4096", "--global-batch", "64", "--emit",
            "megatron", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *etp = arg_value (r.out, "--expert-tensor-parallel-size");
  g_autofree char *tp = arg_value (r.out, "--tensor-model-parallel-size");
  g_assert_cmpstr (etp, ==, "1");
  g_assert_cmpstr (tp, ==, "2");

  /* Left to the default it is --tp's, and the emitted file says so. */
  g_auto (StowRun) d = { 0 };
  stow_run (&d, "fit", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--engine",
            "megatron", "--tp", "2", "--ep", "8", "--etp", "2", "--dp", "8",
            "--pp", "1", "--seq", "4096", "--global-batch", "64", "--emit",
            "megatron", NULL);
  g_assert_cmpint (d.status, ==, 0);
  g_autofree char *etp2 = arg_value (d.out, "--expert-tensor-parallel-size");
  g_assert_cmpstr (etp2, ==, "2");

  g_auto (StowRun) j = { 0 };
  stow_run (&j, "plan", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--engine",
            "megatron", "--tp", "2", "--ep", "8", "--etp", "1", "--dp", "8",
            "--pp", "1", "--seq", "4096", "--global-batch", "64", "--top", "1",
            "--json", NULL);
  g_assert_cmpint (j.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (j.out, &root);
  JsonObject *plan = json_array_get_object_element (
      json_object_get_array_member (o, "plans"), 0);
  JsonObject *layout = json_object_get_object_member (plan, "layout");
  g_assert_cmpint (json_object_get_int_member (layout, "etp"), ==, 1);
  g_assert_cmpint (json_object_get_int_member (layout, "tp"), ==, 2);

  /* A plan file with --etp apart from --tp: accelerate's
   * megatron_lm_config has no setting for it, so emitting it from the
   * plan is refused as from a search. */
  g_autofree char *dir = g_dir_make_tmp ("stow-etp-XXXXXX", NULL);
  g_autofree char *planf = g_build_filename (dir, "plan.json", NULL);
  g_autofree char *acc = g_build_filename (dir, "accelerate.yaml", NULL);
  g_auto (StowRun) pf = { 0 };
  stow_run (&pf, "mem", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--engine",
            "megatron", "--tp", "2", "--etp", "1", "--ep", "1", "--pp", "4",
            "--dp", "2", "--seq", "4096", "--global-batch", "64", "--emit",
            "plan", "-o", planf, NULL);
  g_assert_cmpint (pf.status, ==, 0);
  g_auto (StowRun) pa = { 0 };
  stow_run (&pa, "mem", "--plan", planf, "--emit", "accelerate", "-o", acc,
            NULL);
  g_assert_cmpint (pa.status, !=, 0);
  g_assert_nonnull (strstr (pa.err, "(--etp 1) is Megatron-core's"));
  g_assert_false (g_file_test (acc, G_FILE_TEST_EXISTS));
  g_remove (planf);
  g_rmdir (dir);

  static const struct
  {
    const char *model, *value, *fragment;
  } bad[] = {
    { "mixtral-8x7b", "0", "--etp \"0\"" },
    { "mixtral-8x7b", "two", "--etp \"two\"" },
    /* 4 x ep 8 = 32 does not tile 16 GPUs */
    { "mixtral-8x7b", "4", "--etp 4" },
    { "llama-2-7b", "1", "--etp 1 needs a mixture-of-experts model" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      gboolean moe = g_str_equal (bad[i].model, "mixtral-8x7b");
      const char *const args[] = { "mem",
                                   bad[i].model,
                                   "--gpus",
                                   "16xH100-SXM",
                                   "--engine",
                                   "megatron",
                                   "--tp",
                                   "2",
                                   "--dp",
                                   "8",
                                   "--etp",
                                   bad[i].value,
                                   moe ? "--ep" : NULL,
                                   "8",
                                   NULL };
      stow_assert_usage_error (args, bad[i].fragment);
    }
}

/* Llama 3 405B's pipeline (126 layers, tp 8, pp 16, interleaved with
 * chunks of one layer, the embedding and the loss in the split: the Llama
 * 3 paper, §3.3.2): Megatron-core's flags for it, and the refusals. */
static void
test_megatron_pp_split_ends (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "llama-3.1-405b", "--gpus", "128xH100-SXM", "--engine",
            "megatron", "--tp", "8", "--pp", "16", "--vpp", "8",
            "--pp-split-ends", "--dp", "1", "--seq", "8192", "--global-batch",
            "32", "--micro-batch", "1", "--recompute", "full", "--emit",
            "megatron", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *pp = arg_value (r.out, "--pipeline-model-parallel-size");
  g_autofree char *per_v
      = arg_value (r.out, "--num-layers-per-virtual-pipeline-stage");
  g_autofree char *emb
      = arg_value (r.out, "--account-for-embedding-in-pipeline-split");
  g_autofree char *loss
      = arg_value (r.out, "--account-for-loss-in-pipeline-split");
  g_assert_cmpstr (pp, ==, "16");
  g_assert_cmpstr (per_v, ==, "1"); /* (126 + 2) / (16 x 8) */
  g_assert_cmpstr (emb, ==, "");
  g_assert_cmpstr (loss, ==, "");

  const char *const stowage[] = {
    "mem", "llama-3.1-405b", "--gpus", "128xH100-SXM",    "--tp", "8", "--pp",
    "16",  "--dp",           "1",      "--pp-split-ends", NULL
  };
  stow_assert_usage_error (stowage, "--pp-split-ends is Megatron-core's");
  const char *const uneven[] = { "mem",
                                 "llama-3.1-405b",
                                 "--gpus",
                                 "128xH100-SXM",
                                 "--engine",
                                 "megatron",
                                 "--tp",
                                 "8",
                                 "--pp",
                                 "16",
                                 "--vpp",
                                 "3",
                                 "--dp",
                                 "1",
                                 "--pp-split-ends",
                                 NULL };
  stow_assert_usage_error (uneven, "--pp 16 x --vpp 3");
}

/* ---- the optimizer settings in each engine's terms (issue 43) ---------- */

#define OPTIM_FLAGS                                                            \
  "--lr", "3e-4", "--min-lr", "3e-5", "--warmup", "10", "--steps", "100",      \
      "--lr-schedule", "cosine", "--beta2", "0.95", "--eps", "1e-6",           \
      "--weight-decay", "0.1", "--max-grad-norm", "0.5"

static double
member_d (JsonObject *o, const char *name)
{
  g_assert_true (json_object_has_member (o, name));
  return json_object_get_double_member (o, name);
}

/* DeepSpeed: the optimizer DeepSpeed builds from "AdamW" (DeepSpeedCPUAdam,
 * adamw_mode, when offloaded), gradient_clipping, and the scheduler whose
 * lr matches stowage's after the warmup.  DeepSpeed 0.19.8's
 * WarmupCosineLR (runtime/lr_schedules.py) trains step k at iteration
 * i = k - 2 (its lr is set before step 1, stepped after each step), at
 * ratio cos_min + (1 - cos_min)(1 + cos (pi p))/2, p = (i - warmup + 1) /
 * (total - warmup) past the warmup. */
static void
test_optim_deepspeed (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "llama-7b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "cpu",
            OPTIM_FLAGS, "--emit", "deepspeed", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *c = parse (r.out, &root);
  g_assert_cmpfloat (member_d (c, "gradient_clipping"), ==, 0.5);
  JsonObject *opt = json_object_get_object_member (c, "optimizer");
  g_assert_cmpstr (json_object_get_string_member (opt, "type"), ==, "AdamW");
  JsonObject *op = json_object_get_object_member (opt, "params");
  g_assert_cmpfloat (member_d (op, "lr"), ==, 3e-4);
  g_assert_cmpfloat (member_d (op, "eps"), ==, 1e-6);
  g_assert_cmpfloat (member_d (op, "weight_decay"), ==, 0.1);
  g_assert_true (json_object_get_boolean_member (op, "adam_w_mode"));
  JsonArray *betas = json_object_get_array_member (op, "betas");
  g_assert_cmpfloat (json_array_get_double_element (betas, 0), ==, 0.9);
  g_assert_cmpfloat (json_array_get_double_element (betas, 1), ==, 0.95);
  JsonObject *sch = json_object_get_object_member (c, "scheduler");
  g_assert_cmpstr (json_object_get_string_member (sch, "type"), ==,
                   "WarmupCosineLR");
  JsonObject *sp = json_object_get_object_member (sch, "params");
  double total = member_d (sp, "total_num_steps");
  double warmup = member_d (sp, "warmup_num_steps");
  double cos_min = member_d (sp, "cos_min_ratio");
  g_assert_cmpstr (json_object_get_string_member (sp, "warmup_type"), ==,
                   "linear");
  StowOptimSettings o;
  stow_optim_settings_init (&o);
  o.lr = 3e-4, o.min_lr = 3e-5, o.warmup_steps = 10, o.total_steps = 100;
  o.schedule = STOW_LR_COSINE;
  for (guint k = 11; k <= 100; k++)
    {
      double p = MIN (1.0, ((k - 2.0) - warmup + 1.0) / (total - warmup));
      double ds = 3e-4 * (cos_min + (1 - cos_min) * (1 + cos (G_PI * p)) / 2);
      g_assert_cmpfloat_with_epsilon (ds, stow_optim_lr_at (&o, k), 1e-15);
    }
  /* The warmup, which WarmupCosineLR starts at 0 before step 1, is a step
   * behind: said on stderr, with the weight decay's tensors and the
   * run's length, which ds_config.json has no key for. */
  g_assert_nonnull (strstr (r.err, "note: --emit deepspeed: DeepSpeed's "
                                   "WarmupCosineLR sets the lr of step 1"));
  g_assert_nonnull (strstr (r.err, "10 of the run's 100 steps (steps 1 to "
                                   "10)"));
  g_assert_nonnull (strstr (r.err, "cannot say which tensors decay"));
  g_assert_nonnull (strstr (r.err, "100 optimizer steps are 100 micro-"));
  g_assert_cmpuint (stow_count_lines (r.err), ==, 3);

  /* A constant lr after 10 warmup steps: WarmupLR from 2 lr/W over W - 2
   * iterations is stowage's lr k/W from step 2 on (DeepSpeed's
   * warmup_min_lr + (max - min) i/warmup, i = k - 2); step 1 differs.
   * No clipping is gradient_clipping 0 (DeepSpeed 0.19.8's default is
   * 1.0); decay on every tensor is model.parameters (), no note. */
  g_auto (StowRun) w = { 0 };
  stow_run (&w, "fit", "llama-7b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "3", "--offload-optimizer", "cpu",
            "--warmup", "10", "--max-grad-norm", "0", "--weight-decay-on",
            "all", "--emit", "deepspeed", NULL);
  g_assert_cmpint (w.status, ==, 0);
  g_autoptr (JsonNode) wroot = NULL;
  JsonObject *wc = parse (w.out, &wroot);
  g_assert_cmpfloat (member_d (wc, "gradient_clipping"), ==, 0.0);
  JsonObject *wsch = json_object_get_object_member (wc, "scheduler");
  g_assert_cmpstr (json_object_get_string_member (wsch, "type"), ==,
                   "WarmupLR");
  JsonObject *wp = json_object_get_object_member (wsch, "params");
  double lo = member_d (wp, "warmup_min_lr"),
         hi = member_d (wp, "warmup_max_lr");
  double wn = member_d (wp, "warmup_num_steps");
  stow_optim_settings_init (&o);
  o.warmup_steps = 10;
  for (guint k = 2; k <= 20; k++)
    {
      double i = k - 2.0;
      double ds = i < wn ? lo + (hi - lo) * i / wn : hi;
      g_assert_cmpfloat_with_epsilon (ds, stow_optim_lr_at (&o, k), 1e-15);
    }
  g_assert_nonnull (strstr (w.err, "1 of the first 14 steps (step 1)"));
  g_assert_null (strstr (w.err, "which tensors decay"));
  g_assert_cmpuint (stow_count_lines (w.err), ==, 1);
}

/* Megatron-LM: every flag of the schedule, AdamW and clipping, and a
 * schedule that is stowage's at every step: Megatron's
 * OptimizerParamScheduler (get_lr) trains step k at num_steps n = k - 1,
 * warming up from --lr-warmup-init over --lr-warmup-iters, then decaying
 * over (n - warmup) / (decay - warmup). */
static void
test_optim_megatron (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "llama-7b", "--gpus", "8xA100-80GB", OPTIM_FLAGS,
            "--emit", "megatron", NULL);
  g_assert_cmpint (r.status, ==, 0);
  struct
  {
    const char *flag, *value;
  } want[] = {
    { "--lr", "0.0003" },
    { "--min-lr", "3e-05" },
    { "--lr-decay-style", "cosine" },
    { "--lr-warmup-iters", "9" },
    { "--train-iters", "100" },
    { "--lr-decay-iters", "99" },
    { "--weight-decay", "0.1" },
    { "--adam-beta1", "0.9" },
    { "--adam-beta2", "0.95" },
    { "--adam-eps", "1e-06" },
    { "--clip-grad", "0.5" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (want); i++)
    {
      g_autofree char *v = arg_value (r.out, want[i].flag);
      g_assert_cmpstr (v, ==, want[i].value);
    }
  g_autofree char *init_s = arg_value (r.out, "--lr-warmup-init");
  double init = g_ascii_strtod (init_s, NULL);
  StowOptimSettings o;
  stow_optim_settings_init (&o);
  o.lr = 3e-4, o.min_lr = 3e-5, o.warmup_steps = 10, o.total_steps = 100;
  o.schedule = STOW_LR_COSINE;
  for (guint k = 1; k <= 100; k++)
    {
      double n = k - 1.0, meg;
      if (n <= 9)
        meg = init + (3e-4 - init) * n / 9;
      else
        meg = 3e-5
              + 0.5 * (cos (G_PI * (n - 9) / (99 - 9)) + 1) * (3e-4 - 3e-5);
      g_assert_cmpfloat_with_epsilon (meg, stow_optim_lr_at (&o, k), 1e-15);
    }
  /* The same schedule: nothing to say but nothing missing. */
  g_assert_cmpuint (stow_count_lines (r.err), ==, 0);

  /* Without warmup Megatron-LM's decay starts a step later; without
   * --steps it has no --train-iters. */
  g_auto (StowRun) z = { 0 };
  stow_run (&z, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--lr-schedule",
            "linear", "--steps", "50", "--emit", "megatron", NULL);
  g_assert_cmpint (z.status, ==, 0);
  g_assert_nonnull (strstr (z.err, "note: --emit megatron: Megatron-LM's "
                                   "schedule starts its decay at step 1"));
  g_assert_nonnull (strstr (z.err, "49 of 50 steps (steps 1 to 49)"));
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--emit",
            "megatron", NULL);
  g_assert_cmpint (c.status, ==, 0);
  g_assert_nonnull (strstr (c.err, "add --train-iters N"));
  g_autofree char *iters = arg_value (c.out, "--train-iters");
  g_assert_null (iters);
}

/* accelerate: gradient clipping where its YAML has a key (deepspeed_config,
 * megatron_lm_config), and notes for the optimizer and schedule, which it
 * has none for, and for clipping under FSDP. */
static void
test_optim_accelerate (void)
{
  g_auto (StowRun) d = { 0 };
  stow_run (&d, "fit", "llama-7b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "2", "--offload-optimizer", "cpu",
            "--max-grad-norm", "0.5", "--emit", "accelerate", NULL);
  g_assert_cmpint (d.status, ==, 0);
  g_assert_nonnull (strstr (d.out, "\n  gradient_clipping: 0.5\n"));
  g_assert_nonnull (strstr (d.err, "note: --emit accelerate: accelerate's "
                                   "config has no optimizer or schedule keys"));
  g_assert_nonnull (strstr (d.err, "deepspeed_config_file"));
  g_assert_cmpuint (stow_count_lines (d.err), ==, 1);
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--engine", "fsdp",
            "--zero", "3", "--max-grad-norm", "0.5", "--emit", "accelerate",
            NULL);
  g_assert_cmpint (f.status, ==, 0);
  g_assert_nonnull (strstr (f.err, "distributed_type FSDP has no clipping key: "
                                   "call accelerator.clip_grad_norm_(model."
                                   "parameters(), 0.5)"));
  g_assert_cmpuint (stow_count_lines (f.err), ==, 2);
}

/* A plan file carries the settings into the configs emitted from it; the
 * optimizer's flags beside --plan replace the plan's. */
static void
test_optim_plan (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = g_dir_make_tmp ("stow-emit-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *plan = g_build_filename (dir, "plan.json", NULL);
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--engine",
            "megatron", OPTIM_FLAGS, "--emit", "plan", "-o", plan, NULL);
  g_assert_cmpint (p.status, ==, 0);
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "fit", "--plan", plan, "--emit", "megatron", NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_autofree char *lr = arg_value (m.out, "--lr");
  g_autofree char *clip = arg_value (m.out, "--clip-grad");
  g_assert_cmpstr (lr, ==, "0.0003");
  g_assert_cmpstr (clip, ==, "0.5");
  g_auto (StowRun) o = { 0 };
  stow_run (&o, "fit", "--plan", plan, "--lr", "1e-4", "--emit", "megatron",
            NULL);
  g_assert_cmpint (o.status, ==, 0);
  g_autofree char *lr2 = arg_value (o.out, "--lr");
  g_autofree char *clip2 = arg_value (o.out, "--clip-grad");
  g_assert_cmpstr (lr2, ==, "0.0001");
  g_assert_cmpstr (clip2, ==, "0.5");
  g_unlink (plan);
  g_rmdir (dir);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-emit/optim-deepspeed", test_optim_deepspeed);
  g_test_add_func ("/cli-emit/optim-megatron", test_optim_megatron);
  g_test_add_func ("/cli-emit/optim-accelerate", test_optim_accelerate);
  g_test_add_func ("/cli-emit/optim-plan", test_optim_plan);
  g_test_add_func ("/cli-emit/deepspeed-fits-its-model", test_deepspeed);
  g_test_add_func ("/cli-emit/megatron-fits-its-model", test_megatron);
  g_test_add_func ("/cli-emit/fsdp-fits-its-model", test_fsdp);
  g_test_add_func ("/cli-emit/fsdp-partial-recompute",
                   test_fsdp_partial_recompute);
  g_test_add_func ("/cli-emit/accelerate-megatron-recompute",
                   test_accelerate_megatron_recompute);
  g_test_add_func ("/cli-emit/accelerate-picks-an-engine", test_accelerate);
  g_test_add_func ("/cli-emit/engine-conflicts", test_engine_conflicts);
  g_test_add_func ("/cli-emit/no-fit", test_no_fit);
  g_test_add_func ("/cli-emit/megatron-rope", test_megatron_rope);
  g_test_add_func ("/cli-emit/nvme-placeholder", test_nvme_placeholder);
  g_test_add_func ("/cli-emit/script-warnings", test_script_warnings);
  g_test_add_func ("/cli-emit/precision-gpu", test_precision_gpu);
  g_test_add_func ("/cli-emit/megatron-etp", test_megatron_etp);
  g_test_add_func ("/cli-emit/megatron-pp-split-ends",
                   test_megatron_pp_split_ends);
  return g_test_run ();
}
