/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-plan.c: `stowage fit` and `stowage mem` as a user runs
 * them: verdicts and exit codes, the documented JSON keys, terms adding up,
 * peers' numbers through the CLI, and one-line errors for bad input.
 */
#include <glib/gstdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "tests/testutil.h"

static JsonObject *
parse (const char *text, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  *root = stow_json_parse_data (text, -1, "stdout", &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

static gint64
member_int (JsonObject *o, const char *path)
{
  g_auto (GStrv) parts = g_strsplit (path, ".", -1);
  for (guint i = 0; parts[i + 1] != NULL; i++)
    {
      g_assert_true (json_object_has_member (o, parts[i]));
      o = json_object_get_object_member (o, parts[i]);
    }
  g_assert_true (json_object_has_member (o, parts[g_strv_length (parts) - 1]));
  return json_object_get_int_member (o, parts[g_strv_length (parts) - 1]);
}

static gint64
sum_terms (JsonArray *terms)
{
  gint64 s = 0;
  for (guint i = 0; i < json_array_get_length (terms); i++)
    {
      JsonObject *t = json_array_get_object_element (terms, i);
      g_assert_true (json_object_has_member (t, "name"));
      g_assert_true (json_object_has_member (t, "tier"));
      g_assert_true (json_object_has_member (t, "formula"));
      s += json_object_get_int_member (t, "bytes");
    }
  return s;
}

static void
test_fit_llama_65b (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "llama-65b", "--gpus", "8xA100-80GB", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (g_str_has_prefix (r.out, "FITS: llama-65b on 8xA100-80GB"));
  g_assert_nonnull (strstr (r.out, "allocated peak"));
  g_assert_nonnull (strstr (r.out, "GiB"));

  g_auto (StowRun) j = { 0 };
  stow_run (&j, "fit", "llama-65b", "--gpus", "8xA100-80GB", "--json", NULL);
  g_assert_cmpint (j.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (j.out, &root);
  g_assert_cmpint (member_int (o, "version"), ==, 1);
  g_assert_true (json_object_get_boolean_member (o, "fits"));
  g_assert_cmpint (member_int (o, "model.params"), ==, 65285660672);
  g_assert_cmpint (member_int (o, "layout.dp"), ==,
                   8 / member_int (o, "layout.tp")
                       / member_int (o, "layout.pp"));
  gint64 total = member_int (o, "device.total_bytes");
  gint64 cap = member_int (o, "device.capacity_bytes");
  g_assert_cmpint (total, <=, cap);
  g_assert_cmpint (member_int (o, "device.allocated_peak_bytes"), <=,
                   member_int (o, "device.reserved_bytes"));
  g_assert_cmpint (member_int (o, "device.reserved_bytes"), <=, total);
  /* Every stage's terms add up to its total; the peak is the maximum. */
  JsonArray *stages = json_object_get_array_member (
      json_object_get_object_member (o, "device"), "stages");
  gint64 peak = 0;
  for (guint i = 0; i < json_array_get_length (stages); i++)
    {
      JsonObject *s = json_array_get_object_element (stages, i);
      gint64 st = json_object_get_int_member (s, "total_bytes");
      g_assert_cmpint (sum_terms (json_object_get_array_member (s, "terms")),
                       ==, st);
      peak = MAX (peak, st);
    }
  g_assert_cmpint (peak, ==, total);
  JsonObject *host = json_object_get_object_member (o, "host");
  g_assert_cmpint (sum_terms (json_object_get_array_member (host, "terms")), ==,
                   json_object_get_int_member (host, "total_bytes"));
  g_assert_cmpint (json_object_get_int_member (host, "pinned_bytes")
                       + json_object_get_int_member (host, "pageable_bytes"),
                   ==, json_object_get_int_member (host, "total_bytes"));
  g_assert_true (json_object_has_member (o, "nvme"));
}

static void
test_fit_does_not_fit (void)
{
  g_auto (StowRun) r = { 0 };
  /* Llama-2-7B: 16 B x 6.7B parameters on one 24 GB GPU, no offload. */
  stow_run (&r, "fit", "llama-2-7b", "--gpus", "1xRTX-4090",
            "--offload-optimizer", "none", "--offload-params", "none", NULL);
  g_assert_cmpint (r.status, ==, 1);
  g_assert_true (g_str_has_prefix (r.out, "DOES NOT FIT"));
  g_assert_nonnull (strstr (r.out, "What would fit"));

  g_auto (StowRun) j = { 0 };
  stow_run (&j, "fit", "llama-2-7b", "--gpus", "1xRTX-4090",
            "--offload-optimizer", "none", "--offload-params", "none", "--json",
            NULL);
  g_assert_cmpint (j.status, ==, 1);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (j.out, &root);
  g_assert_false (json_object_get_boolean_member (o, "fits"));
  JsonArray *alts = json_object_get_array_member (o, "alternatives");
  g_assert_cmpuint (json_array_get_length (alts), >, 0);
  gboolean more = FALSE, lora = FALSE;
  for (guint i = 0; i < json_array_get_length (alts); i++)
    {
      JsonObject *a = json_array_get_object_element (alts, i);
      const char *kind = json_object_get_string_member (a, "kind");
      more |= g_strcmp0 (kind, "more_gpus") == 0;
      lora |= g_strcmp0 (kind, "finetune") == 0;
    }
  g_assert_true (more);
  g_assert_true (lora); /* LoRA: 13.5 GB of frozen bf16 weights */

  /* QLoRA 65B needs 33.7 GB of NF4 weights: not on a 24 GB GPU (the QLoRA
   * paper used a 48 GB one), so no finetune alternative is offered. */
  g_auto (StowRun) q = { 0 };
  stow_run (&q, "fit", "llama-65b", "--gpus", "1xRTX-4090",
            "--offload-optimizer", "none", "--offload-params", "none", "--json",
            NULL);
  g_assert_cmpint (q.status, ==, 1);
  g_assert_null (strstr (q.out, "\"finetune\" : \"qlora\""));
  g_auto (StowRun) q48 = { 0 };
  stow_run (&q48, "fit", "llama-65b", "--gpus", "1xL40S", "--finetune", "qlora",
            "--offload-optimizer", "none", "--offload-params", "none", NULL);
  g_assert_cmpint (q48.status, ==, 0);
}

static void
test_mem_explain (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-65b", "--gpus", "8xA100-80GB", "--tp", "8",
            "--pp", "4", "--explain", NULL);
  /* 8 GPUs cannot hold tp 8 x pp 4. */
  g_assert_cmpint (r.status, ==, 2);

  g_auto (StowRun) e = { 0 };
  stow_run (&e, "mem", "llama-65b", "--gpus", "8x8xA100-80GB", "--tp", "8",
            "--pp", "4", "--zero", "1", "--explain", NULL);
  g_assert_cmpint (e.status, ==, 0);
  g_assert_nonnull (strstr (e.out, "stage 3"));
  g_assert_nonnull (strstr (e.out, "ZeRO shards")); /* a formula */
  g_assert_nonnull (strstr (e.out, "micro-batches in flight"));
}

/* DeepSpeed's ZeRO-3 estimate for t5-3b through the CLI, in raw bytes:
 * 4 LL = 128,000,000 on the GPU, int(P x 18 x 1.5) on the CPU. */
static void
test_mem_convention_bytes (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "--params", "2851M", "--largest-layer", "32M",
            "--convention", "deepspeed-estimator", "--gpus", "8xA100-80GB",
            "--zero", "3", "--offload-optimizer", "cpu", "--offload-params",
            "cpu", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  g_assert_cmpint (member_int (o, "device.total_bytes"), ==, 128000000);
  g_assert_cmpint (member_int (o, "host.total_bytes"), ==, 76977000000);
  g_assert_cmpstr (json_object_get_string_member (o, "convention"), ==,
                   "deepspeed-estimator");
}

static void
test_bad_input (void)
{
  const char *const a[] = { "fit", "lama-65b", "--gpus", "8xA100-80GB", NULL };
  stow_assert_usage_error (a, "did you mean \"llama-65b\"");
  const char *const b[] = { "fit", "llama-65b", "--gpus", "8xA100-81GB", NULL };
  stow_assert_usage_error (b, "A100-80GB");
  const char *const c[]
      = { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--tp", "3", NULL };
  stow_assert_usage_error (c, "--tp 3 does not divide num_attention_heads 64");
  /* --pp and --cp given too: left open, they are filled as fit fills them. */
  const char *const d[]
      = { "mem", "llama-65b", "--gpus", "8xA100-80GB", "--dp", "2", "--tp",
          "2",   "--pp",      "1",      "--cp",        "1",    NULL };
  stow_assert_usage_error (d, "--dp 2 x --tp 2 x --pp 1 x --cp 1 = 4 GPUs");
  const char *const e[] = { "fit", "llama-65b", NULL };
  stow_assert_usage_error (e, "--gpus");
  const char *const f[]
      = { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--seq", "4x", NULL };
  stow_assert_usage_error (f, "--seq");
  const char *const g[] = { "mem",         "llama-65b", "--gpus", "8xA100-80GB",
                            "--recompute", "partial",   NULL };
  stow_assert_usage_error (g, "--recompute \"partial\"");
  const char *const h[] = { "mem", "--gpus", "8xA100-80GB", NULL };
  stow_assert_usage_error (h, "no model given");
  const char *const i[] = { "mem",
                            "--params",
                            "7B",
                            "--convention",
                            "deepspeed-estimator",
                            "--gpus",
                            "8xA100-80GB",
                            "--zero",
                            "1",
                            NULL };
  stow_assert_usage_error (i, "no ZeRO-1 estimate");
  const char *const j[]
      = { "mem",           "llama-65b", "--gpus", "8xA100-80GB",
          "--decoder-seq", "4",         NULL };
  stow_assert_usage_error (
      j, "--decoder-seq 4 needs an encoder-decoder model; llama-65b");
  const char *const k[]
      = { "mem",  "llama-65b", "--gpus", "8xA100-80GB", "--engine", "deepspeed",
          "--pp", "2",         "--zero", "3",           NULL };
  stow_assert_usage_error (
      k, "--engine deepspeed runs --pp 2 with ZeRO stage 0 or 1 only");
}

/* The integer at @path ("device.allocated_peak_bytes") of what a successful
 * `--json` run printed. */
static gint64
run_member (const StowRun *r, const char *path)
{
  g_assert_cmpint (r->status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  return member_int (parse (r->out, &root), path);
}

/* The allocated peak a `mem --json` run printed. */
static gint64
run_peak (const StowRun *r)
{
  return run_member (r, "device.allocated_peak_bytes");
}

/* Runs `mem ARGS... --emit plan` into a plan file named @name, then
 * `mem --plan` on it with --json into @out: what a plan file keeps. */
static void run_through_plan (StowRun *out, const char *name, const char *first,
                              ...) G_GNUC_NULL_TERMINATED;
static void
run_through_plan (StowRun *out, const char *name, const char *first, ...)
{
  g_autofree char *path = g_build_filename (g_get_tmp_dir (), name, NULL);
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  g_ptr_array_add (args, (gpointer) "mem");
  va_list ap;
  va_start (ap, first);
  for (const char *a = first; a != NULL; a = va_arg (ap, const char *))
    g_ptr_array_add (args, (gpointer)a);
  va_end (ap);
  const char *const tail[] = { "--emit", "plan", "-o", path, NULL };
  for (gsize i = 0; i < G_N_ELEMENTS (tail); i++)
    g_ptr_array_add (args, (gpointer)tail[i]);
  g_auto (StowRun) w = { 0 };
  stow_runv (&w, (const char *const *)args->pdata);
  g_assert_cmpint (w.status, ==, 0);
  stow_run (out, "mem", "--plan", path, "--json", NULL);
  g_unlink (path);
}

/* An encoder-decoder model's decoder length: shorter targets shrink the
 * decoder's activations and the logits, and a plan file keeps the length. */
static void
test_decoder_seq (void)
{
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "t5-3b", "--gpus", "1xA100-80GB", "--seq", "512",
            "--json", NULL);
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "mem", "t5-3b", "--gpus", "1xA100-80GB", "--seq", "512",
            "--decoder-seq", "16", "--json", NULL);
  g_assert_cmpint (run_peak (&b), <, run_peak (&a));
  g_auto (StowRun) r = { 0 };
  run_through_plan (&r, "stow-decoder-seq.plan.json", "t5-3b", "--gpus",
                    "1xA100-80GB", "--seq", "512", "--decoder-seq", "16", NULL);
  g_assert_cmpint (run_peak (&r), ==, run_peak (&b));
}

/* The allocated peak of llama-3.2-3b at 4096 tokens under @engine, with
 * --compile or without. */
static gint64
compile_peak (const char *engine, gboolean compiled)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-3.2-3b", "--gpus", "1xA100-80GB", "--engine",
            engine, "--seq", "4096", "--json", compiled ? "--compile" : NULL,
            NULL);
  return run_peak (&r);
}

/* --compile: eager modules (pytorch engine) keep more than compiled ones;
 * fused kernels (megatron) are the same either way; a plan file keeps it. */
static void
test_compile (void)
{
  gint64 comp = compile_peak ("pytorch", TRUE);
  g_assert_cmpint (comp, <, compile_peak ("pytorch", FALSE));
  g_assert_cmpint (compile_peak ("megatron", TRUE), ==,
                   compile_peak ("megatron", FALSE));

  g_auto (StowRun) r = { 0 };
  run_through_plan (&r, "stow-compile.plan.json", "llama-3.2-3b", "--gpus",
                    "1xA100-80GB", "--engine", "pytorch", "--seq", "4096",
                    "--compile", NULL);
  g_assert_cmpint (run_peak (&r), ==, comp);
  g_assert_nonnull (strstr (r.out, "\"compile\" : true"));
}

/* --fused-loss (flash-attn's cross-entropy over the 16-bit logits) keeps
 * 2 + 2 B a logit where the fp32 loss keeps 2 + 4 + 4; a plan file keeps
 * it; it cannot be asked for beside --chunked-loss, nor of an engine that
 * runs its own loss. */
static void
test_fused_loss (void)
{
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "llama-3.2-3b", "--gpus", "1xA100-80GB", "--engine",
            "fsdp", "--seq", "4096", "--json", NULL);
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "mem", "llama-3.2-3b", "--gpus", "1xA100-80GB", "--engine",
            "fsdp", "--seq", "4096", "--fused-loss", "--json", NULL);
  g_assert_cmpint (run_peak (&b), <, run_peak (&a));
  g_assert_nonnull (strstr (b.out, "\"fused_loss\" : true"));

  g_auto (StowRun) r = { 0 };
  run_through_plan (&r, "stow-fused-loss.plan.json", "llama-3.2-3b", "--gpus",
                    "1xA100-80GB", "--engine", "fsdp", "--seq", "4096",
                    "--fused-loss", NULL);
  g_assert_cmpint (run_peak (&r), ==, run_peak (&b));

  static const char *const both[]
      = { "mem",  "llama-3.2-3b",   "--gpus",       "1xA100-80GB", "--engine",
          "fsdp", "--chunked-loss", "--fused-loss", NULL };
  stow_assert_usage_error (both, "--chunked-loss and --fused-loss");
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "mem", "llama-3.2-3b", "--gpus", "1xA100-80GB", "--engine",
            "megatron", "--fused-loss", NULL);
  g_assert_cmpint (m.status, !=, 0);
  g_assert_nonnull (strstr (m.err, "--engine megatron runs its own loss"));
}

/* The recompute seconds of the best plan of llama-3-8b on 8 H100 under
 * FSDP with --recompute @mode. */
static double
recompute_seconds (const char *mode)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "plan", "llama-3-8b", "--gpus", "8xH100-SXM", "--engine",
            "fsdp", "--zero", "3", "--dp", "8", "--seq", "8192",
            "--micro-batch", "2", "--global-batch", "16", "--recompute", mode,
            "--top", "1", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  JsonObject *plan = json_array_get_object_element (
      json_object_get_array_member (o, "plans"), 0);
  g_assert_cmpstr (
      json_object_get_string_member (
          json_object_get_object_member (plan, "layout"), "recompute"),
      ==, mode);
  return json_object_get_double_member (
      json_object_get_object_member (plan, "total_s"), "recompute");
}

/* --recompute selective-op (torchtitan's selective op checkpointing)
 * reruns a layer's unsaved matmuls and its element-wise work: more than
 * nothing, less than the whole forward that full recompute reruns.  A plan
 * file keeps it; no engine config but the plan file can say it. */
static void
test_selective_op (void)
{
  double op = recompute_seconds ("selective-op");
  double full = recompute_seconds ("full");
  g_test_message ("recompute: selective-op %.4f s, full %.4f s", op, full);
  g_assert_cmpfloat (op, >, 0.0);
  g_assert_cmpfloat (op, <, full);

  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "llama-3-8b", "--gpus", "8xH100-SXM", "--engine", "fsdp",
            "--zero", "3", "--dp", "8", "--seq", "8192", "--recompute",
            "selective-op", "--json", NULL);
  g_auto (StowRun) r = { 0 };
  run_through_plan (&r, "stow-selective-op.plan.json", "llama-3-8b", "--gpus",
                    "8xH100-SXM", "--engine", "fsdp", "--zero", "3", "--dp",
                    "8", "--seq", "8192", "--recompute", "selective-op", NULL);
  g_assert_cmpint (run_peak (&r), ==, run_peak (&a));

  static const char *const emit[]
      = { "mem",    "llama-3-8b", "--gpus", "8xH100-SXM",  "--engine",
          "fsdp",   "--zero",     "3",      "--recompute", "selective-op",
          "--emit", "fsdp",       NULL };
  stow_assert_usage_error (emit, "selective_ac_option op");
  static const char *const bad[] = { "mem",        "llama-3-8b",  "--gpus",
                                     "8xH100-SXM", "--recompute", "op",
                                     NULL };
  stow_assert_usage_error (bad, "selective-op");
}

/* --cpu-optimizer-buffers sets DeepSpeed's pinned CPU Adam buffers (1 GiB
 * by default), and a plan file keeps it. */
static void
test_cpu_optimizer_buffers (void)
{
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "mem", "llama-7b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "2", "--offload-optimizer", "cpu", "--json",
            NULL);
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "mem", "llama-7b", "--gpus", "1xA100-80GB", "--engine",
            "deepspeed", "--zero", "2", "--offload-optimizer", "cpu",
            "--cpu-optimizer-buffers", "256MiB", "--json", NULL);
  g_assert_cmpint (run_member (&a, "host.total_bytes")
                       - run_member (&b, "host.total_bytes"),
                   ==, 768 * 1048576);

  g_auto (StowRun) r = { 0 };
  run_through_plan (&r, "stow-cpu-opt.plan.json", "llama-7b", "--gpus",
                    "1xA100-80GB", "--engine", "deepspeed", "--zero", "2",
                    "--offload-optimizer", "cpu", "--cpu-optimizer-buffers",
                    "256MiB", NULL);
  g_assert_cmpint (run_member (&r, "host.total_bytes"), ==,
                   run_member (&b, "host.total_bytes"));

  const char *const bad[] = {
    "mem",  "llama-7b", "--gpus", "1xA100-80GB", "--cpu-optimizer-buffers",
    "lots", NULL
  };
  stow_assert_usage_error (bad, "--cpu-optimizer-buffers");
}

/* `stowage plan` in CSV, Markdown and HTML, and -o writing a file whole. */
static void
test_plan_formats (void)
{
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "plan", "llama-65b", "--gpus", "8xA100-80GB", "--top", "5",
            "--format", "csv", NULL);
  g_assert_cmpint (c.status, ==, 0);
  g_auto (GStrv) lines = g_strsplit (c.out, "\n", -1);
  g_assert_true (g_str_has_prefix (lines[0], "rank,dp,tp,pp,"));
  g_auto (GStrv) head = g_strsplit (lines[0], ",", -1);
  int step_col = -1;
  for (int i = 0; head[i]; i++)
    if (g_str_equal (head[i], "step_time_s"))
      step_col = i;
  g_assert_cmpint (step_col, >=, 0);
  double prev = 0;
  guint rows = 0;
  for (guint i = 1; lines[i] && *lines[i]; i++, rows++)
    {
      g_auto (GStrv) f = g_strsplit (lines[i], ",", -1);
      g_assert_cmpuint (g_strv_length (f), ==, g_strv_length (head));
      g_assert_cmpint (atoi (f[0]), ==, (int)i); /* ranks in order */
      double step = g_ascii_strtod (f[step_col], NULL);
      g_assert_cmpfloat (step, >=, prev); /* fastest first */
      prev = step;
    }
  g_assert_cmpuint (rows, ==, 5);

  g_auto (StowRun) m = { 0 };
  stow_run (&m, "plan", "llama-65b", "--gpus", "8xA100-80GB", "--top", "3",
            "--format", "md", NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_assert_nonnull (strstr (m.out, "| # | layout |"));
  g_assert_nonnull (strstr (m.out, "GiB"));

  g_autofree char *html
      = stow_run_to_file ("plan.html", "plan", "llama-65b", "--gpus",
                          "8xA100-80GB", "--format", "html", NULL);
  g_assert_true (g_str_has_prefix (html, "<!DOCTYPE html>"));
  g_assert_nonnull (strstr (html, "tokens/s"));

  const char *const bad[] = { "plan",     "llama-65b", "--gpus", "8xA100-80GB",
                              "--format", "xml",       NULL };
  stow_assert_usage_error (bad, "--format \"xml\"");
}

/* fit --all-offloads under DeepSpeed's convention prints DeepSpeed's
 * estimate_zero{3,2}_model_states_mem_needs_all_live rows as its docs
 * (docs/code-docs/source/memory.rst) print them for t5-3b on 1 x 8 GPUs;
 * the ZeRO-2 no-offload row is the current code's 11.28 (the docs' 15.93
 * predates DeepSpeed PR #5099). */
static void
test_all_offloads_deepspeed (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "--params", "2851M", "--largest-layer", "32M",
            "--convention", "deepspeed-estimator", "--gpus", "8xA100-80GB",
            "--all-offloads", NULL);
  g_assert_cmpint (r.status, ==, 0);
  static const char *const lines[] = {
    "HW: Setup with 1 node, 8 GPUs per node.\n",
    "SW: Model with 2851M total params, 32M largest layer params.\n",
    "  per CPU  |  per GPU |   Options\n",
    "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , "
    "zero_init=1\n",
    "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , "
    "zero_init=0\n",
    "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , "
    "zero_init=1\n",
    "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , "
    "zero_init=0\n",
    "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, "
    "zero_init=1\n",
    "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, "
    "zero_init=0\n",
    "  127.45GB |   5.31GB | offload_optimizer=cpu \n",
    "  127.45GB |  11.28GB | offload_optimizer=none\n",
  };
  const char *at = r.out;
  for (gsize i = 0; i < G_N_ELEMENTS (lines); i++)
    {
      const char *hit = strstr (at, lines[i]);
      g_test_message ("line %" G_GSIZE_FORMAT ": %s", i, lines[i]);
      g_assert_nonnull (hit);
      at = hit + strlen (lines[i]);
    }
}

/* fit --all-offloads with stowage's own model: one row per ZeRO stage and
 * offload choice, each the layout `stowage mem` gives the same flags. */
static void
test_all_offloads_stowage (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "fit", "llama-2-7b", "--gpus", "8xA100-80GB", "--all-offloads",
            "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  JsonArray *rows = json_object_get_array_member (o, "rows");
  /* ZeRO 0-2 x 3 optimizer places; ZeRO-3 x 3 x 3 with parameters. */
  g_assert_cmpuint (json_array_get_length (rows), ==, 18);
  g_assert_true (json_object_get_boolean_member (o, "fits"));
  for (guint i = 0; i < json_array_get_length (rows); i += 17)
    {
      JsonObject *row = json_array_get_object_element (rows, i);
      char zero[8], dp[8], tp[8], pp[8], mb[8];
      g_snprintf (zero, sizeof zero, "%" G_GINT64_FORMAT,
                  json_object_get_int_member (row, "zero"));
      g_snprintf (dp, sizeof dp, "%" G_GINT64_FORMAT,
                  json_object_get_int_member (row, "dp"));
      g_snprintf (tp, sizeof tp, "%" G_GINT64_FORMAT,
                  json_object_get_int_member (row, "tp"));
      g_snprintf (pp, sizeof pp, "%" G_GINT64_FORMAT,
                  json_object_get_int_member (row, "pp"));
      g_snprintf (mb, sizeof mb, "%" G_GINT64_FORMAT,
                  json_object_get_int_member (row, "micro_batch"));
      g_auto (StowRun) m = { 0 };
      stow_run (&m, "mem", "llama-2-7b", "--gpus", "8xA100-80GB", "--zero",
                zero, "--offload-optimizer",
                json_object_get_string_member (row, "offload_optimizer"),
                "--offload-params",
                json_object_get_string_member (row, "offload_params"), "--dp",
                dp, "--tp", tp, "--pp", pp, "--micro-batch", mb, "--recompute",
                json_object_get_string_member (row, "recompute"), "--json",
                NULL);
      g_autoptr (JsonNode) mroot = NULL;
      JsonObject *mo = parse (m.out, &mroot);
      g_assert_cmpint (member_int (mo, "device.total_bytes"), ==,
                       json_object_get_int_member (row, "gpu_bytes"));
      g_assert_cmpint (member_int (mo, "host.total_bytes"), ==,
                       json_object_get_int_member (row, "host_bytes_per_node"));
      g_assert_cmpint (member_int (mo, "nvme.bytes"), ==,
                       json_object_get_int_member (row, "nvme_bytes_per_node"));
    }

  g_auto (StowRun) t = { 0 };
  stow_run (&t, "fit", "llama-2-7b", "--gpus", "8xA100-80GB", "--all-offloads",
            NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_assert_nonnull (strstr (t.out, "SW: llama-2-7b, 6.74B total params"));
  g_assert_cmpuint (stow_count_lines (t.out), ==, 4 + 18);

  const char *const bad[] = { "fit",
                              "llama-2-7b",
                              "--gpus",
                              "8xA100-80GB",
                              "--all-offloads",
                              "--offload-params",
                              "cpu",
                              NULL };
  stow_assert_usage_error (bad, "drop --offload-params");
}

/* The allocated peak of Llama 3 8B on 8 H100 (dp 4, cp 2, 2048 tokens,
 * the distributed optimizer, nothing recomputed) under @engine; with
 * @plan, also written to that plan file. */
static gint64
engine_peak (const char *engine, const char *plan)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-3-8b", "--gpus", "8xH100-SXM", "--dp", "4",
            "--cp", "2", "--tp", "1", "--pp", "1", "--micro-batch", "1",
            "--seq", "2048", "--zero", "1", "--recompute", "none",
            "--offload-optimizer", "none", "--offload-activations", "none",
            "--engine", engine, "--json", NULL);
  if (plan)
    {
      g_auto (StowRun) w = { 0 };
      stow_run (&w, "mem", "llama-3-8b", "--gpus", "8xH100-SXM", "--dp", "4",
                "--cp", "2", "--tp", "1", "--pp", "1", "--micro-batch", "1",
                "--seq", "2048", "--zero", "1", "--recompute", "none",
                "--offload-optimizer", "none", "--offload-activations", "none",
                "--engine", engine, "--emit", "plan", "-o", plan, NULL);
      g_assert_cmpint (w.status, ==, 0);
    }
  return run_peak (&r);
}

/* --engine nemo: NeMo 24.07's defaults (docs/memory-model.md).  Its bf16
 * gradient buffer makes a run smaller than Megatron-LM's fp32 main grads,
 * a plan file keeps the engine, and its distributed Adam keeps the
 * optimizer on the GPU. */
static void
test_engine_nemo (void)
{
  g_autofree char *path
      = g_build_filename (g_get_tmp_dir (), "stow-nemo.plan.json", NULL);
  gint64 nemo = engine_peak ("nemo", path);
  g_assert_cmpint (nemo, <, engine_peak ("megatron", NULL));
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "--plan", path, "--json", NULL);
  g_unlink (path);
  g_assert_cmpint (run_peak (&r), ==, nemo);
  g_assert_nonnull (strstr (r.out, "\"engine\" : \"nemo\""));

  const char *const off[] = {
    "mem", "llama-3-8b", "--gpus", "8xH100-SXM",          "--dp", "8", "--zero",
    "1",   "--engine",   "nemo",   "--offload-optimizer", "cpu",  NULL
  };
  stow_assert_usage_error (off, "--engine nemo keeps the optimizer on the GPU");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-plan/fit-llama-65b", test_fit_llama_65b);
  g_test_add_func ("/cli-plan/does-not-fit", test_fit_does_not_fit);
  g_test_add_func ("/cli-plan/mem-explain", test_mem_explain);
  g_test_add_func ("/cli-plan/convention-bytes", test_mem_convention_bytes);
  g_test_add_func ("/cli-plan/bad-input", test_bad_input);
  g_test_add_func ("/cli-plan/all-offloads-deepspeed",
                   test_all_offloads_deepspeed);
  g_test_add_func ("/cli-plan/all-offloads-stowage", test_all_offloads_stowage);
  g_test_add_func ("/cli-plan/decoder-seq", test_decoder_seq);
  g_test_add_func ("/cli-plan/compile", test_compile);
  g_test_add_func ("/cli-plan/fused-loss", test_fused_loss);
  g_test_add_func ("/cli-plan/selective-op", test_selective_op);
  g_test_add_func ("/cli-plan/cpu-optimizer-buffers",
                   test_cpu_optimizer_buffers);
  g_test_add_func ("/cli-plan/plan-formats", test_plan_formats);
  g_test_add_func ("/cli-plan/engine-nemo", test_engine_nemo);
  return g_test_run ();
}
