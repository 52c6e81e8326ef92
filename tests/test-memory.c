/* SPDX-License-Identifier: MIT
 *
 * tests/test-memory.c: the memory model against published numbers (the
 * ZeRO paper's Table 1, DeepSpeed's estimator outputs, Megatron's worked
 * LLaMA-65B example, Korthikanti et al. Table 2 and Figure 1), against
 * measured runs (the /memory/calibration cases: each row within a bound
 * its case states, on both sides, and the figures README.md quotes
 * printed as claims; docs/testing.md), then properties over random
 * layouts.
 */
#include <math.h>
#include <string.h>

#include "core/json.h"
#include "core/units.h"
#include "hw/hw.h"
#include "models/model.h"
#include "planner/memory.h"
#include "tests/testutil-claim.h"
#include "tests/testutil-planner.h"

#define GiB 1073741824.0

static StowModel *
model_from_json (const char *json)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = stow_json_parse_data (json, -1, "test", &error);
  g_assert_no_error (error);
  StowModel *m
      = stow_model_new_from_json (json_node_get_object (root), "test", &error);
  g_assert_no_error (error);
  g_assert_nonnull (m);
  return m;
}

static StowModel *
llama_65b (void)
{
  return model_from_json (
      "{\"model_type\": \"llama\", \"hidden_size\": 8192,"
      " \"num_hidden_layers\": 80, \"num_attention_heads\": 64,"
      " \"num_key_value_heads\": 64, \"intermediate_size\": 22016,"
      " \"vocab_size\": 32000, \"rms_norm_eps\": 1e-5,"
      " \"tie_word_embeddings\": false}");
}

/* A Megatron GPT: 4h MLP, learned positions for 2,048 tokens, tied
 * embeddings, a vocabulary of @vocab. */
static StowModel *
gpt_vocab (guint64 h, guint64 layers, guint64 heads, guint64 vocab)
{
  g_autofree char *json = g_strdup_printf (
      "{\"model_type\": \"gpt2\", \"n_embd\": %" G_GUINT64_FORMAT
      ", \"n_layer\": %" G_GUINT64_FORMAT ", \"n_head\": %" G_GUINT64_FORMAT
      ", \"vocab_size\": %" G_GUINT64_FORMAT ", \"n_positions\": 2048}",
      h, layers, heads, vocab);
  return model_from_json (json);
}

/* The GPT of Korthikanti et al. / Narayanan et al.: V = 51,200. */
static StowModel *
gpt (guint64 h, guint64 layers, guint64 heads)
{
  return gpt_vocab (h, layers, heads, 51200);
}

static StowMemory *
estimate (const StowModel *m, const StowCluster *c, const StowTraining *t,
          const StowLayout *l, const StowMemOptions *o)
{
  g_autoptr (GError) error = NULL;
  StowMemory *mem = stow_memory_estimate (TEST_PLAN (m, c, t, l, o), &error);
  g_assert_no_error (error);
  g_assert_nonnull (mem);
  return mem;
}

/* The estimate refuses the layout (STOW_PLAN_ERROR_INVALID) with a message
 * holding @fragment. */
static void
assert_refused (const StowModel *m, const StowCluster *c, const StowTraining *t,
                const StowLayout *l, const StowMemOptions *o,
                const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_memory_estimate (TEST_PLAN (m, c, t, l, o), &error));
  g_assert_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID);
  g_test_message ("%s", error->message);
  if (strstr (error->message, fragment) == NULL)
    g_error ("\"%s\" does not say \"%s\"", error->message, fragment);
}

/* Compares @bytes / @unit printed with as many decimals as @expected has
 * (the published figure), so "22.99" matches 22.987... exactly as the
 * source printed it. */
static void
assert_printed (double bytes, double unit, const char *expected)
{
  const char *dot = strchr (expected, '.');
  int decimals = dot ? (int)strlen (dot + 1) : 0;
  g_autofree char *got = g_strdup_printf ("%.*f", decimals, bytes / unit);
  g_test_message ("expected %s, got %s (%.6f)", expected, got, bytes / unit);
  g_assert_cmpstr (got, ==, expected);
}

static guint64
term_bytes (GArray *terms, const char *name)
{
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      if (strcmp (t->name, name) == 0)
        return t->bytes;
    }
  return 0;
}

/* ---- ZeRO paper, Table 1 (GB = 1e9 bytes) ------------------------------ */

static void
test_zero_paper_table1 (void)
{
  static const struct
  {
    const char *params;
    guint nd;
    const char *cells[3];
  } rows[] = {
    { "7.5B", 1, { "120", "120", "120" } },
    { "7.5B", 4, { "52.5", "41.25", "30" } },
    { "7.5B", 16, { "35.6", "21.6", "7.5" } },
    { "7.5B", 64, { "31.4", "16.6", "1.88" } },
    { "7.5B", 256, { "30.4", "15.4", "0.47" } },
    { "7.5B", 1024, { "30.1", "15.1", "0.12" } },
    { "128B", 1, { "2048", "2048", "2048" } },
    { "128B", 4, { "896", "704", "512" } },
    { "128B", 16, { "608", "368", "128" } },
    { "128B", 64, { "536", "284", "32" } },
    { "128B", 256, { "518", "263", "8" } },
    { "128B", 1024, { "513.5", "257.75", "2" } },
    { "1T", 1, { "16000", "16000", "16000" } },
    { "1T", 4, { "7000", "5500", "4000" } },
    { "1T", 16, { "4750", "2875", "1000" } },
    { "1T", 64, { "4187.5", "2218.75", "250" } },
    { "1T", 256, { "4046.9", "2054.7", "62.5" } },
    { "1T", 1024, { "4011.7", "2013.7", "15.6" } },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    for (guint z = 1; z <= 3; z++)
      {
        g_autofree char *spec = g_strdup_printf ("%uxV100-32GB", rows[i].nd);
        g_autoptr (StowCluster) c = stow_test_cluster (spec);
        StowTraining t;
        StowLayout l;
        StowMemOptions o;
        stow_test_defaults (&t, &l, &o);
        o.convention = STOW_CONVENTION_ZERO_PAPER;
        g_assert_true (
            stow_parse_count (rows[i].params, &o.params_override, NULL));
        l.dp = rows[i].nd;
        l.zero = z;
        g_autoptr (StowMemory) mem = estimate (NULL, c, &t, &l, &o);
        assert_printed ((double)mem->total_bytes, 1e9, rows[i].cells[z - 1]);
      }
}

/* ---- DeepSpeed's estimators (planner.md §1.1) ---------------------------- */

typedef struct
{
  guint zero;
  StowOffload params, optimizer;
  int zero_init;
  const char *cpu_gib, *gpu_gib;
} DsRow;

static void
check_deepspeed (StowConvention conv, const char *params, const char *ll,
                 const char *spec, const DsRow *rows, gsize n)
{
  g_autoptr (StowCluster) c = stow_test_cluster (spec);
  for (gsize i = 0; i < n; i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_defaults (&t, &l, &o);
      o.convention = conv;
      g_assert_true (stow_parse_count (params, &o.params_override, NULL));
      g_assert_true (stow_parse_count (ll, &o.largest_layer_override, NULL));
      o.zero_init = rows[i].zero_init;
      l.dp = c->n_gpus;
      l.zero = rows[i].zero;
      l.offload_params = rows[i].params;
      l.offload_optimizer = rows[i].optimizer;
      g_autoptr (StowMemory) mem = estimate (NULL, c, &t, &l, &o);
      g_test_message ("row %" G_GSIZE_FORMAT, i);
      assert_printed ((double)mem->total_bytes, GiB, rows[i].gpu_gib);
      assert_printed ((double)mem->host_total_bytes, GiB, rows[i].cpu_gib);
    }
}

static void
test_deepspeed_t5_3b (void)
{
  const StowOffload C = STOW_OFFLOAD_CPU, N = STOW_OFFLOAD_NONE;
  /* docs/code-docs/source/memory.rst, t5-3b on 1 node x 8 GPUs. */
  const DsRow z3[] = {
    { 3, C, C, 1, "71.69", "0.12" },  { 3, C, C, 0, "127.45", "0.12" },
    { 3, N, C, 1, "63.72", "0.78" },  { 3, N, C, 0, "127.45", "0.78" },
    { 3, N, N, 1, "1.43", "6.09" },   { 3, N, N, 0, "127.45", "6.09" },
    { 2, N, C, 1, "127.45", "5.31" }, { 2, N, N, 1, "127.45", "11.28" },
  };
  check_deepspeed (STOW_CONVENTION_DEEPSPEED_ESTIMATOR, "2851M", "32M",
                   "8xA100-80GB", z3, G_N_ELEMENTS (z3));
  /* The docs still print the pre-#5099 ZeRO-2 formula. */
  const DsRow docs[] = {
    { 2, N, C, 1, "127.45", "5.31" },
    { 2, N, N, 1, "127.45", "15.93" },
  };
  check_deepspeed (STOW_CONVENTION_DEEPSPEED_ESTIMATOR_DOCS, "2851M", "32M",
                   "8xA100-80GB", docs, G_N_ELEMENTS (docs));
}

static void
test_deepspeed_llama_65b (void)
{
  const StowOffload C = STOW_OFFLOAD_CPU, N = STOW_OFFLOAD_NONE;
  const DsRow one[] = {
    { 3, C, C, 1, "1641.65", "0.98" },  { 3, N, C, 1, "1459.25", "16.18" },
    { 3, N, N, 1, "11.72", "137.78" },  { 2, N, C, 1, "2918.5", "121.6" },
    { 2, N, N, 1, "2918.5", "258.41" },
  };
  check_deepspeed (STOW_CONVENTION_DEEPSPEED_ESTIMATOR, "65285660672",
                   "262144000", "8xA100-80GB", one, G_N_ELEMENTS (one));
  const DsRow eight[] = {
    { 3, C, C, 1, "205.21", "0.98" },  { 3, N, C, 1, "182.41", "2.88" },
    { 3, N, N, 1, "11.72", "18.08" },  { 2, N, C, 1, "23347.97", "121.6" },
    { 2, N, N, 1, "2918.5", "138.7" },
  };
  check_deepspeed (STOW_CONVENTION_DEEPSPEED_ESTIMATOR, "65285660672",
                   "262144000", "8x8xA100-80GB", eight, G_N_ELEMENTS (eight));

  /* The largest layer comes from the model when --largest-layer is not
   * given: LLaMA-65B's embed_tokens, 262,144,000. */
  g_autoptr (StowModel) m = llama_65b ();
  g_assert_cmpuint (m->largest_module_params, ==, 262144000);
}

static void
test_deepspeed_uncovered (void)
{
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-80GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  o.convention = STOW_CONVENTION_DEEPSPEED_ESTIMATOR;
  o.params_override = 1000000000;
  l.dp = 8;
  l.zero = 1;
  assert_refused (NULL, c, &t, &l, &o, "ZeRO-1");
}

/* ---- Megatron's theoretical memory, worked LLaMA-65B example ------------ */

static void
test_megatron_llama_65b (void)
{
  g_autoptr (StowModel) m = llama_65b ();
  g_autoptr (StowCluster) c = stow_test_cluster ("8x8xA100-80GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  o.convention = STOW_CONVENTION_MEGATRON_THEORETICAL;
  t.seq_len = 2048;
  l.tp = 8, l.pp = 4, l.dp = 2, l.sp = TRUE, l.zero = 1;
  l.recompute = STOW_RECOMPUTE_SELECTIVE;
  l.micro_batch = 1, l.grad_accum = 4;
  g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
  GArray *terms = mem->stages[0].terms;
  /* 2.057B params x 12 B = 22.99 GiB; activations 4.50 GiB (57.5 MiB per
   * layer per GPU). */
  assert_printed ((double)term_bytes (terms, "weights and optimizer states"),
                  GiB, "22.99");
  assert_printed ((double)term_bytes (terms, "activations"), GiB, "4.50");
  g_assert_cmpuint (mem->stages[0].params / 1000000, ==, 2056);
}

/* ---- Korthikanti et al. 2022 -------------------------------------------- */

typedef struct
{
  guint64 h, layers, heads, tp, pp, vpp, gpus, batch, mbs;
  const char *fig1_none, *fig1_sp_sel;
} KorthikantiRow;

/* Table 3 configurations; Figure 1's activation GiB per GPU. */
static const KorthikantiRow korthikanti[] = {
  { 6144, 48, 64, 8, 1, 1, 8, 4, 4, "59.25", "9.56" },
  { 12288, 96, 96, 8, 8, 3, 64, 64, 1, "66.84", "12.35" },
  { 20480, 105, 128, 8, 35, 3, 280, 280, 1, "114.02", "23.08" },
  { 25600, 128, 160, 8, 64, 1, 512, 512, 1, "131.25", "26.56" },
};

static void
korthikanti_setup (const KorthikantiRow *r, StowTraining *t, StowLayout *l,
                   StowMemOptions *o)
{
  stow_training_init (t);
  stow_layout_init (l);
  stow_mem_options_init (o);
  t->seq_len = 2048;
  t->flash_attention = FALSE; /* the paper predates it */
  t->dropout = TRUE;
  t->global_batch = r->batch;
  l->tp = r->tp, l->pp = r->pp, l->vpp = r->vpp;
  l->dp = (guint)(r->gpus / (r->tp * r->pp));
  l->micro_batch = r->mbs;
  l->grad_accum = r->batch / (r->mbs * l->dp);
  l->schedule = r->vpp > 1 ? STOW_SCHEDULE_INTERLEAVED : STOW_SCHEDULE_1F1B;
  l->engine = STOW_ENGINE_MEGATRON;
}

/* Table 2: per-layer bytes from the paper's closed forms, against the
 * tensor-by-tensor count. */
static void
test_korthikanti_table2 (void)
{
  for (gsize i = 0; i < G_N_ELEMENTS (korthikanti); i++)
    {
      const KorthikantiRow *r = &korthikanti[i];
      g_autoptr (StowModel) m = gpt (r->h, r->layers, r->heads);
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      korthikanti_setup (r, &t, &l, &o);
      double s = 2048, b = (double)r->mbs, h = (double)r->h,
             a = (double)r->heads, tp = (double)r->tp;
      double sbh = s * b * h;
      struct
      {
        guint tp;
        gboolean sp;
        StowRecompute rc;
        double expected;
      } cases[] = {
        { 1, FALSE, STOW_RECOMPUTE_NONE, sbh * (34 + 5 * a * s / h) },
        { (guint)tp, FALSE, STOW_RECOMPUTE_NONE,
          sbh * (10 + 24 / tp + 5 * a * s / (h * tp)) },
        { (guint)tp, TRUE, STOW_RECOMPUTE_NONE,
          sbh * (34 / tp + 5 * a * s / (h * tp)) },
        { (guint)tp, FALSE, STOW_RECOMPUTE_SELECTIVE, sbh * (10 + 24 / tp) },
        { (guint)tp, TRUE, STOW_RECOMPUTE_SELECTIVE, sbh * 34 / tp },
      };
      for (gsize k = 0; k < G_N_ELEMENTS (cases); k++)
        {
          l.tp = cases[k].tp;
          l.sp = cases[k].sp;
          l.recompute = cases[k].rc;
          guint64 got = stow_memory_layer_activations (
              TEST_PLAN (m, NULL, &t, &l, NULL));
          g_test_message ("model %" G_GSIZE_FORMAT " case %" G_GSIZE_FORMAT
                          ": %" G_GUINT64_FORMAT " vs %.1f",
                          i, k, got, cases[k].expected);
          g_assert_cmpfloat (fabs ((double)got - cases[k].expected), <=, 1.0);
        }
    }
}

/* Figure 1: the first stage's activations for all four models, TP only and
 * SP + selective recomputation, including the interleaving penalty. */
static void
test_korthikanti_figure1 (void)
{
  for (gsize i = 0; i < G_N_ELEMENTS (korthikanti); i++)
    {
      const KorthikantiRow *r = &korthikanti[i];
      g_autoptr (StowModel) m = gpt (r->h, r->layers, r->heads);
      g_autofree char *spec
          = g_strdup_printf ("%" G_GUINT64_FORMAT "x8xA100-80GB", r->gpus / 8);
      g_autoptr (StowCluster) c = stow_test_cluster (spec);
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      korthikanti_setup (r, &t, &l, &o);
      g_autoptr (StowMemory) none = estimate (m, c, &t, &l, &o);
      assert_printed ((double)term_bytes (none->stages[0].terms, "activations"),
                      GiB, r->fig1_none);
      l.sp = TRUE;
      l.recompute = STOW_RECOMPUTE_SELECTIVE;
      g_autoptr (StowMemory) sel = estimate (m, c, &t, &l, &o);
      assert_printed ((double)term_bytes (sel->stages[0].terms, "activations"),
                      GiB, r->fig1_sp_sel);
    }
}

/* ---- calibration against measured runs (planner.md §4.2) --------------- */

/* Case 1: bert-large-uncased, AdamW, batch 4, sequence 512, HF Trainer on
 * one V100-16GB (transformers docs: model_memory_anatomy.md for the first
 * row, and its 2022 predecessor perf_train_gpu_one.mdx for all nine).  The
 * source measured nvidia-smi's used memory through pynvml, of which 1,343
 * MiB is the CUDA context and kernels it measured on its own; that context
 * is an input here (its stack predates lazy loading), the rest is
 * predicted.  Attention is eager (no flash), with BERT's dropout; the
 * gradients persist between steps on that PyTorch (zero_grad() kept them
 * until 2.0).  The rows vary what the guide varied, one Trainer flag at a
 * time: batch 1 with 4 accumulation steps, gradient checkpointing (full
 * recompute), fp16 (autocast over fp32 weights), Adafactor (HF's, without
 * a first moment) and bitsandbytes' Adam8bit on every parameter.  The
 * 8-bit rows check the 8-bit states against the world: Adam8bit saved
 * 1,864 MiB over AdamW at batch 4, where the model's states shrink by
 * 2,003 MiB.  fp16 at batch 4 falls 10.4% short, checked within 11%: the
 * model has no term for the fp32 gradients of the attention scores that
 * autocast's backward holds, nor for the allocator's reserve beyond 5%. */
static void
test_calibration_bert_large (void)
{
  static const struct
  {
    const char *row;
    guint64 micro_batch, grad_accum;
    gboolean ckpt;
    StowPrecision precision;
    StowOptimizer optimizer;
    double measured_mib, tolerance;
  } rows[] = {
    { "vanilla", 4, 1, FALSE, STOW_PRECISION_FP32, STOW_OPTIMIZER_ADAMW, 14949,
      0.10 },
    { "grad. accum.", 1, 4, FALSE, STOW_PRECISION_FP32, STOW_OPTIMIZER_ADAMW,
      8681, 0.10 },
    { "+ grad. ckpt", 1, 4, TRUE, STOW_PRECISION_FP32, STOW_OPTIMIZER_ADAMW,
      6775, 0.10 },
    { "fp16", 4, 1, FALSE, STOW_PRECISION_FP16, STOW_OPTIMIZER_ADAMW, 13939,
      0.11 },
    { "accum. + ckpt + fp16", 1, 4, TRUE, STOW_PRECISION_FP16,
      STOW_OPTIMIZER_ADAMW, 7275, 0.10 },
    { "Adafactor", 4, 1, FALSE, STOW_PRECISION_FP32, STOW_OPTIMIZER_ADAFACTOR,
      12295, 0.10 },
    { "Adafactor + accum. + ckpt + fp16", 1, 4, TRUE, STOW_PRECISION_FP16,
      STOW_OPTIMIZER_ADAFACTOR, 4847, 0.10 },
    { "Adam8bit", 4, 1, FALSE, STOW_PRECISION_FP32, STOW_OPTIMIZER_ADAMW_8BIT,
      13085, 0.10 },
    { "Adam8bit + accum. + ckpt + fp16", 1, 4, TRUE, STOW_PRECISION_FP16,
      STOW_OPTIMIZER_ADAMW_8BIT, 5363, 0.10 },
  };
  g_autoptr (StowModel) m = stow_test_model ("bert-large-uncased");
  g_autoptr (StowCluster) c = stow_test_cluster ("1xV100-16GB");
  double total[G_N_ELEMENTS (rows)];
  double worst = 0; /* the rows held to 10% */
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_eager_run (&t, &l, &o, rows[i].precision, 512,
                           STOW_ENGINE_PYTORCH, rows[i].micro_batch);
      t.optimizer = rows[i].optimizer;
      l.grad_accum = rows[i].grad_accum;
      l.recompute = rows[i].ckpt ? STOW_RECOMPUTE_FULL : STOW_RECOMPUTE_NONE;
      o.cuda_context_bytes = (guint64)1343 << 20;
      o.free_grads = 0;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      total[i] = (double)mem->total_bytes / 1048576.0;
      double err = (total[i] - rows[i].measured_mib) / rows[i].measured_mib;
      g_test_message ("bert-large %s: predicted %.0f MiB (nvidia-smi), "
                      "measured %.0f MiB: %+.1f%%",
                      rows[i].row, total[i], rows[i].measured_mib, 100 * err);
      g_assert_cmpfloat (fabs (err), <=, rows[i].tolerance);
      if (rows[i].precision == STOW_PRECISION_FP16 && rows[i].grad_accum == 1)
        stow_test_claim ("memory.bert-large.fp16-batch-4-pct", 100 * err);
      else
        worst = MAX (worst, fabs (err));
      if (i == 0)
        {
          /* "after weights 2,631 MB": the context plus fp32 weights. */
          double weights
              = (double)term_bytes (mem->stages[0].terms, "parameters")
                + (double)o.cuda_context_bytes;
          g_assert_cmpfloat (fabs (weights / 1048576.0 - 2631.0) / 2631.0, <=,
                             0.01);
        }
    }
  stow_test_claim ("memory.bert-large.worst-pct", 100 * worst);
  /* What Adam8bit saves over AdamW at batch 4 (rows 0 and 7). */
  double saved = total[0] - total[7], measured = 14949.0 - 13085.0;
  g_test_message ("Adam8bit saves %.0f MiB, measured %.0f MiB", saved,
                  measured);
  g_assert_cmpfloat (fabs (saved - measured) / measured, <=, 0.10);
}

/* Case 6: torchtune, Llama-3.2-3B on one A100, batch 2, sequence 4096,
 * pure bf16 (bf16 AdamW states, no fp32 master); each row adds to the one
 * before.  The source reports "peak memory active", torch's active-bytes
 * peak: compared with the allocated peak.  The baseline (unpacked, padded
 * to each batch's longest sample of a dataset not at hand) is not
 * modelled; from packing on every row is.  Packing runs the eager modules
 * (torchtune's RMSNorm and rotary embeddings in fp32, GQA's K and V
 * repeated, SwiGLU's silu output kept); "+ compile" fuses them, and every
 * row after it is compiled.  The LoRA and QLoRA rows use torchtune's 3B
 * LoRA config (rank 64 on q, v, output and the MLP), with activation
 * checkpointing and offloading and plain AdamW (its LoRA recipe has no
 * optimizer-in-backward).  They pin down the loss phase: the frozen
 * weights, the adapters' states and the bf16 logits alone come to 8.4 and
 * 4.5 GiB, so the logits cannot coexist with a rebuilt layer's backward,
 * and the chunked loss keeps no fp32 copy.
 *
 * The 8-bit AdamW row is under-predicted: measured, it saves 4.2 GiB over
 * the row before, where the states shrink by 5.9 GiB (4 to 2.03 B per
 * parameter), so 1.7 GiB appears that the model has no term for.  The row
 * does not say whose AdamW8bit ran (torchtune offers bitsandbytes' and
 * torchao's); bitsandbytes' states match the bert-large rows above, so the
 * gap is not in them.  Nor is it torchao's step: its one fp32 buffer the
 * size of the parameter (bench/torchao-step.py) is largest for the tied
 * embedding, which steps after backward, below the peak.  It is checked
 * within 18% (its -14.3% and a quarter) until a GPU run says what it is. */
static void
test_calibration_torchtune (void)
{
  static const struct
  {
    const char *row;
    gboolean compiled, chunked, ckpt, opt_in_bwd, offload_act, adam8;
    StowFinetune ft;
    double measured_gib, tolerance;
  } rows[] = {
    { "+ packing", FALSE, FALSE, FALSE, FALSE, FALSE, FALSE, STOW_FINETUNE_FULL,
      60.0, 0.10 },
    { "+ compile", TRUE, FALSE, FALSE, FALSE, FALSE, FALSE, STOW_FINETUNE_FULL,
      51.0, 0.10 },
    { "+ chunked CE", TRUE, TRUE, FALSE, FALSE, FALSE, FALSE,
      STOW_FINETUNE_FULL, 42.9, 0.10 },
    { "+ act. ckpt", TRUE, TRUE, TRUE, FALSE, FALSE, FALSE, STOW_FINETUNE_FULL,
      24.9, 0.10 },
    { "+ opt. in bwd", TRUE, TRUE, TRUE, TRUE, FALSE, FALSE, STOW_FINETUNE_FULL,
      23.1, 0.10 },
    { "+ act. offload", TRUE, TRUE, TRUE, TRUE, TRUE, FALSE, STOW_FINETUNE_FULL,
      21.8, 0.10 },
    /* -14.3% when issue 42 set the bound: 1.25 times that, rounded up. */
    { "+ 8-bit AdamW", TRUE, TRUE, TRUE, TRUE, TRUE, TRUE, STOW_FINETUNE_FULL,
      17.6, 0.18 },
    { "LoRA", TRUE, TRUE, TRUE, FALSE, TRUE, FALSE, STOW_FINETUNE_LORA, 8.5,
      0.10 },
    { "QLoRA", TRUE, TRUE, TRUE, FALSE, TRUE, FALSE, STOW_FINETUNE_QLORA, 4.6,
      0.10 },
  };
  g_autoptr (StowModel) m = stow_test_model ("llama-3.2-3b");
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  double worst = 0; /* the rows held to 10% */
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      t.precision = STOW_PRECISION_BF16_PURE;
      t.seq_len = 4096;
      t.compiled = rows[i].compiled;
      t.chunked_loss = rows[i].chunked;
      t.optimizer_in_backward = rows[i].opt_in_bwd;
      t.optimizer
          = rows[i].adam8 ? STOW_OPTIMIZER_ADAMW_8BIT : STOW_OPTIMIZER_ADAMW;
      t.finetune = rows[i].ft;
      if (rows[i].ft != STOW_FINETUNE_FULL)
        {
          g_autoptr (GError) error = NULL;
          t.lora_rank = 64;
          g_assert_true (stow_lora_targets_parse ("q,v,o,gate,up,down", "t",
                                                  &t.lora_targets, &error));
        }
      l.engine = STOW_ENGINE_PYTORCH;
      l.micro_batch = 2;
      l.recompute = rows[i].ckpt ? STOW_RECOMPUTE_FULL : STOW_RECOMPUTE_NONE;
      l.offload_activations = rows[i].offload_act;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, NULL);
      double got = (double)mem->allocated_peak_bytes / GiB;
      double err = (got - rows[i].measured_gib) / rows[i].measured_gib;
      g_test_message ("torchtune %s: predicted %.2f GiB, measured %.1f GiB: "
                      "%+.1f%%",
                      rows[i].row, got, rows[i].measured_gib, 100 * err);
      g_assert_cmpfloat (fabs (err), <=, rows[i].tolerance);
      if (rows[i].adam8)
        stow_test_claim ("memory.torchtune.adamw-8bit-pct", 100 * err);
      else
        worst = MAX (worst, fabs (err));
    }
  stow_test_claim ("memory.torchtune.worst-pct", 100 * worst);
}

/* A model from tests/data/hf/@file. */
static StowModel *
hf_fixture (const char *file)
{
  g_autofree char *path
      = g_test_build_filename (G_TEST_DIST, "data", "hf", file, NULL);
  return stow_test_model (path);
}

/* A source's "GB" that may be the printed MiB over 1024 (GiB) or over
 * 1000 (PEFT's and torchao's tables do not say): prints the error in both
 * readings and holds both within @tolerance, on either side.  A miss not
 * yet explained is checked with the tolerance its case states (its error
 * when issue 42 bounded it, and a quarter) and @is_short: below both
 * readings, as documented.  With @claim, prints the error in each reading
 * as the claims @claim.gib-pct and @claim.gb-pct.  Returns the larger
 * |error| of the two readings. */
static double
check_gb (const char *what, double got, double measured_gb, double tolerance,
          gboolean is_short, const char *claim)
{
  double gib = measured_gb * GiB, gb = measured_gb * 1000.0 * 1048576.0;
  g_test_message ("%s: predicted %.2f GiB, measured %.2f GB: %+.1f%% (GiB) / "
                  "%+.1f%% (1000 MiB)",
                  what, got / GiB, measured_gb, 100 * (got - gib) / gib,
                  100 * (got - gb) / gb);
  if (claim != NULL)
    {
      g_autofree char *a = g_strdup_printf ("%s.gib-pct", claim);
      g_autofree char *b = g_strdup_printf ("%s.gb-pct", claim);
      stow_test_claim (a, 100 * (got - gib) / gib);
      stow_test_claim (b, 100 * (got - gb) / gb);
    }
  if (is_short)
    g_assert_cmpfloat (got, <, gb);
  g_assert_cmpfloat (fabs (got - gib) / gib, <=, tolerance);
  g_assert_cmpfloat (fabs (got - gb) / gb, <=, tolerance);
  return MAX (fabs (got - gib) / gib, fabs (got - gb) / gb);
}

/* torchao's low-bit optimizer README (PR #812): Llama-2-7B fine-tuned
 * with torchtune in pure bf16 on one A100, "Peak memory allocated (GB)":
 * fused AdamW 51.6, bitsandbytes' 8-bit 39.3, torchao's 8-bit 39.1.  The
 * sequence lengths (Alpaca, unpacked) are not given, so only the drop is
 * checked: 12.3 and 12.5 GB, the states shrinking from 4 to 2.03 B per
 * parameter with every gradient alive at the peak (51.6 is weights,
 * gradients and bf16 AdamW states, 50.2 GiB, and the checkpointed
 * activations, so the run kept its gradients: no optimizer-in-backward).
 * Here the 8-bit saving is what the model says; in torchtune's 3B table
 * above, under optimizer-in-backward, it is not. */
static void
test_calibration_torchao_llama2 (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-2-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  static const double drops[] = { 51.6 - 39.3, 51.6 - 39.1 };
  for (guint64 seq = 512; seq <= 2048; seq *= 4)
    {
      double peak[2];
      for (int k = 0; k < 2; k++)
        {
          StowTraining t;
          StowLayout l;
          stow_training_init (&t);
          stow_layout_init (&l);
          t.precision = STOW_PRECISION_BF16_PURE;
          t.seq_len = seq;
          t.chunked_loss = TRUE;
          t.optimizer = k ? STOW_OPTIMIZER_ADAMW_8BIT : STOW_OPTIMIZER_ADAMW;
          l.engine = STOW_ENGINE_PYTORCH;
          l.micro_batch = 2;
          l.recompute = STOW_RECOMPUTE_FULL;
          g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, NULL);
          peak[k] = (double)mem->allocated_peak_bytes;
        }
      g_autofree char *what = g_strdup_printf (
          "Llama-2-7B seq %" G_GUINT64_FORMAT " (AdamW %.2f, 8-bit %.2f GiB), "
          "the drop",
          seq, peak[0] / GiB, peak[1] / GiB);
      for (gsize i = 0; i < G_N_ELEMENTS (drops); i++)
        check_gb (what, peak[0] - peak[1], drops[i], 0.10, FALSE, NULL);
    }
}

/* PEFT's scripts as its README ran them: fp32 weights (from_pretrained's
 * default; accelerate's mixed_precision 'no'), torch AdamW, batch 8, eager
 * attention with dropout, PyTorch 1.13 (early 2023), whose zero_grad()
 * kept the gradients, and LoRA adapters with lora_dropout 0.1; an
 * encoder-decoder's targets are the class label, 3 tokens.  With
 * @deepspeed, accelerate's ZeRO-3 config with offload_optimizer and
 * offload_param on the CPU, which leaves every bucket at DeepSpeed's
 * default (reduce_bucket_size 5e8, stage3_max_reuse_distance 1e9).  The
 * caller sets the fine-tuning mode. */
static void
peft_run (const StowModel *m, guint64 seq, gboolean deepspeed, StowTraining *t,
          StowLayout *l, StowMemOptions *o)
{
  stow_test_eager_run (t, l, o, STOW_PRECISION_FP32, seq, STOW_ENGINE_PYTORCH,
                       8);
  if (m->n_encoder_layers > 0)
    t->decoder_seq_len = 3;
  t->lora_dropout = TRUE;
  o->free_grads = 0;
  if (deepspeed)
    {
      l->engine = STOW_ENGINE_DEEPSPEED;
      l->zero = 3;
      l->offload_optimizer = STOW_OFFLOAD_CPU;
      l->offload_params = STOW_OFFLOAD_CPU;
    }
}

/* Case 2: PEFT's README, bigscience/T0_3B on one A100-80GB, three columns:
 * full fine-tuning 47.14 GB, LoRA 14.4 GB, LoRA with DeepSpeed ZeRO-3 and
 * CPU offload 9.8 GB of GPU memory.  Its script
 * (examples/conditional_generation/peft_lora_seq2seq_accelerate_ds_zero3_
 * offload.py) reports torch.cuda.max_memory_allocated through b2mb
 * (x / 2**20), so the source measured the allocated peak; whether the
 * table's "GB" divided those MiB by 1024 or 1000 is not said, so both
 * readings are checked.  The README also prints one DeepSpeed run's log:
 * 1,916 MiB before training, 9,404 MiB at the peak (MiB for certain; a
 * different run from the table's, which it is checked against too).
 *
 * The run is peft_run's, with T5's dropout and LoRA rank 8 on q and v
 * (PEFT's T5 default).  Targets are the class label padded to the
 * longest, 3 tokens; inputs are
 * tweets padded to the longest in the batch, so the peak comes from the
 * batch holding the longest of the 50 training tweets.  That length is the
 * one input we do not have (the data is not at hand; a tweet has 280
 * characters at most).  It is taken as 84 and 92 T5 tokens, inside the
 * band where all three columns, in both readings, hold within 10% (81 to 95
 * tokens; at 80 the DeepSpeed column leaves it, at 96 the LoRA one).  That
 * fits one number to six, so the GPU columns keep the 10% the length was
 * fitted in (their worst is 8.9%).  The host columns without offload
 * (+1.4%, +3.8%) and the log's run (-1.6%, +3.8%) are held within 5%. */
static void
test_calibration_peft_t0 (void)
{
  g_autoptr (StowModel) m = hf_fixture ("t0-3b.json");
  g_assert_cmpuint (m->params, ==, 2849757184);
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  static const struct
  {
    const char *column;
    StowFinetune ft;
    gboolean deepspeed;
    double measured_gb;
  } rows[] = { { "full", STOW_FINETUNE_FULL, FALSE, 47.14 },
               { "lora", STOW_FINETUNE_LORA, FALSE, 14.4 },
               { "lora + ZeRO-3 offload", STOW_FINETUNE_LORA, TRUE, 9.8 } };
  double worst = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    for (guint64 seq = 84; seq <= 92; seq += 8)
      {
        StowTraining t;
        StowLayout l;
        StowMemOptions o;
        peft_run (m, seq, rows[i].deepspeed, &t, &l, &o);
        t.finetune = rows[i].ft;
        g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
        double got = (double)mem->allocated_peak_bytes;
        g_autofree char *what = g_strdup_printf (
            "T0_3B %s, longest tweet %" G_GUINT64_FORMAT " tokens",
            rows[i].column, seq);
        worst = MAX (worst, check_gb (what, got, rows[i].measured_gb, 0.10,
                                      FALSE, NULL));
        double host = (double)mem->host_total_bytes;
        if (rows[i].deepspeed)
          {
            /* The log's run: 9,404 MiB at the peak. */
            double log = 9404.0 * 1048576.0;
            g_test_message ("T0_3B %s, the log's run: predicted %.0f MiB, "
                            "measured 9404 MiB: %+.1f%%",
                            rows[i].column, got / 1048576.0,
                            100 * (got - log) / log);
            g_assert_cmpfloat (fabs (got - log) / log, <=, 0.05);
            /* Its 1,916 MiB before training: the reduce bucket, 5e8 fp32
             * elements (1,907 MiB), and the persistent small parameters. */
            guint64 bucket
                = term_bytes (mem->stages[0].terms, "reduce buckets");
            g_assert_cmpuint (bucket, ==, 2000000000);
            g_assert_cmpuint (bucket, <=, 1916 * 1048576ull);
            /* Host: the README gives 17.8 GB of CPU memory (the log 19,411
             * MiB of resident memory at the start of training).  The model
             * accounts for the offloaded fp32 weights (10.6 GiB), the
             * adapters' states, DeepSpeedCPUAdam's pinned buffers (1 GiB)
             * and the process's own 3 GiB: 14.7 GiB, 15.5 to 17.5% short
             * of the table (22.5% of the log).  What holds the rest is not
             * known, so the prediction is checked short, within 22% (its
             * -17.5% and a quarter).  The candidate has the right size:
             * the log's 4,372 MiB missing against the checkpoint's 4,608
             * MiB of 16 MiB attention matrices, which glibc's heap can keep
             * after the load (bench/load-residue.py).  The same column for
             * mt0-xxl, whose matrices are all 32 MiB or more, holds within
             * 3% (peft-mt0-bloomz below). */
            g_autofree char *host_what = g_strdup_printf (
                "T0_3B %s host (the log: 19411 MiB)", rows[i].column);
            check_gb (host_what, host, 17.8, 0.22, TRUE,
                      "memory.peft-t0.offload-host");
            g_assert_cmpfloat (host, >, (double)m->params * 4.0);
            continue;
          }
        /* Host: the same script's peak process RSS (psutil), "2.96GB"
         * in both columns; nothing is offloaded, so the rank's own
         * memory is all of it. */
        g_autofree char *host_what
            = g_strdup_printf ("T0_3B %s host", rows[i].column);
        check_gb (host_what, host, 2.96, 0.05, FALSE, NULL);
      }
  stow_test_claim ("memory.peft-t0.gpu.worst-pct", 100 * worst);
}

/* The same README table's other two models, one A100-80GB (not in
 * planner.md's list; what they show about the model is in
 * docs/memory-model.md).  Full fine-tuning: "OOM GPU" for both.
 *
 * bigscience/mt0-xxl (mT5-XXL, 12.9B), the T0_3B script with the model
 * swapped: "56GB GPU / 3GB CPU" with LoRA, "22GB GPU / 52GB CPU" with
 * DeepSpeed.  Its tweets go through mT5's tokenizer, whose lengths we do
 * not have, so only the host columns (which do not depend on them) are
 * checked: the DeepSpeed column's 52 GB is the offloaded fp32 weights,
 * the CPU optimizer's buffers and the process.
 *
 * bigscience/bloomz-7b1, bloom-7b1's shape (examples/causal_language_
 * modeling/peft_lora_clm_accelerate_ds_zero3_offload.py): every sequence
 * padded to max_length 64, batch 8, fp32; BLOOM's configs set no dropout.
 * LoRA: "32GB GPU / 3.8GB CPU"; DeepSpeed: "18.1GB GPU / 35GB CPU".  The
 * LoRA column's GPU memory holds (within 10%, -5.1% today).  Three numbers
 * are short and not explained: the DeepSpeed column's GPU (by 21.5 to
 * 23.4%) and host (11.1 to 13.2%), and the LoRA column's host (19.2 to
 * 21.1%, against 2.96 and 3 GB for the other two models).  They are
 * checked short, each within its worst reading's miss and a quarter (30%,
 * 17% and 27%), so that a prediction that falls further (or to nothing)
 * fails.  mt0-xxl's host columns (+2.4% and +2.9% at worst) within 4%. */
static void
test_calibration_peft_mt0_bloomz (void)
{
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  static const struct
  {
    const char *model;
    guint64 seq;
    gboolean dropout, deepspeed;
    double gpu_gb, host_gb; /* 0: not checked */
    double gpu_tolerance, host_tolerance;
    gboolean gpu_short, host_short;
    const char *gpu_claim, *host_claim;
  } rows[] = {
    { "mt0-xxl.json", 84, TRUE, FALSE, 0, 3.0, 0, 0.04, FALSE, FALSE, NULL,
      NULL },
    { "mt0-xxl.json", 84, TRUE, TRUE, 0, 52.0, 0, 0.04, FALSE, FALSE, NULL,
      NULL },
    { "bloom-7b1", 64, FALSE, FALSE, 32.0, 3.8, 0.10, 0.27, FALSE, TRUE,
      "memory.peft-bloom.lora-gpu", "memory.peft-bloom.lora-host" },
    { "bloom-7b1", 64, FALSE, TRUE, 18.1, 35.0, 0.30, 0.17, TRUE, TRUE,
      "memory.peft-bloom.offload-gpu", "memory.peft-bloom.offload-host" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      g_autoptr (StowModel) m = g_str_has_suffix (rows[i].model, ".json")
                                    ? hf_fixture (rows[i].model)
                                    : stow_test_model (rows[i].model);
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      peft_run (m, rows[i].seq, rows[i].deepspeed, &t, &l, &o);
      t.dropout = rows[i].dropout;
      if (i % 2 == 0)
        {
          /* Full fine-tuning first: out of memory. */
          g_autoptr (StowMemory) full = estimate (m, c, &t, &l, &o);
          g_assert_false (full->fits);
        }
      t.finetune = STOW_FINETUNE_LORA;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      const double measured[2] = { rows[i].gpu_gb, rows[i].host_gb };
      const double got[2] = { (double)mem->allocated_peak_bytes,
                              (double)mem->host_total_bytes };
      const gboolean shorts[2] = { rows[i].gpu_short, rows[i].host_short };
      const double tolerances[2]
          = { rows[i].gpu_tolerance, rows[i].host_tolerance };
      const char *const claims[2] = { rows[i].gpu_claim, rows[i].host_claim };
      for (int k = 0; k < 2; k++)
        {
          if (measured[k] == 0)
            continue;
          g_autofree char *what = g_strdup_printf (
              "%s %s %s", m->name,
              rows[i].deepspeed ? "lora + ZeRO-3 offload" : "lora",
              k ? "host" : "GPU");
          check_gb (what, got[k], measured[k], tolerances[k], shorts[k],
                    claims[k]);
        }
    }
}

/* HF's "gelu_new" (GPT-2's default) run eagerly keeps three more ffn-wide
 * tensors per layer than "gelu" (a fused kernel keeping its input): the
 * tanh, 0.5 x and 1 + tanh.  Compiled, the two are alike. */
static void
test_gelu_new (void)
{
  static const char *const acts[] = { "gelu", "gelu_new" };
  guint64 bytes[2][2];
  for (int a = 0; a < 2; a++)
    for (int compiled = 0; compiled < 2; compiled++)
      {
        g_autofree char *json = g_strdup_printf (
            "{\"model_type\": \"gpt2\", \"n_embd\": 768, \"n_layer\": 12,"
            " \"n_head\": 12, \"vocab_size\": 50257, \"n_positions\": 1024,"
            " \"activation_function\": \"%s\"}",
            acts[a]);
        g_autoptr (StowModel) m = model_from_json (json);
        g_assert_true (m->gelu_new == (a == 1));
        g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
        StowTraining t;
        StowLayout l;
        StowMemOptions o;
        stow_test_defaults (&t, &l, &o);
        t.precision = STOW_PRECISION_FP32;
        t.seq_len = 1024;
        t.flash_attention = FALSE;
        t.compiled = compiled;
        l.engine = STOW_ENGINE_PYTORCH;
        l.micro_batch = 2;
        g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
        bytes[a][compiled] = term_bytes (mem->stages[0].terms, "activations");
      }
  /* 3 tensors x 4 B x ffn 3072 x 2048 tokens x 12 layers. */
  g_assert_cmpuint (bytes[1][0] - bytes[0][0], ==, 3ull * 4 * 3072 * 2048 * 12);
  g_assert_cmpuint (bytes[1][1], ==, bytes[0][1]);
}

/* DeepSpeed's buffers: one reduce bucket at its full size in the
 * parameters' dtype at stage 3 (two at stage 2 with overlap_comm); at
 * stage 3 the parameters kept within stage3_max_reuse_distance of their
 * reuse (half of it, or the output layer when larger) plus the prefetch
 * bucket, and the gather's transient copy: the prefetch bucket, or with the
 * parameters offloaded the output layer's partition staged on the device
 * beyond what exists only after the forward.  An offloaded optimizer adds
 * DeepSpeedCPUAdam's two pinned buffers of 128 Mi floats per rank. */
static void
test_deepspeed_buffers (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-2-7b");
  guint64 head = m->vocab * m->hidden;
  g_assert_cmpuint (head, ==, 32000ull * 4096);
  for (int fp32 = 0; fp32 < 2; fp32++)
    for (guint zero = 2; zero <= 3; zero++)
      for (guint64 reuse = 0; reuse <= 2000000000; reuse += 1000000000)
        for (guint dp = 1; dp <= 8; dp += 7)
          {
            g_autoptr (StowCluster) c
                = stow_test_cluster (dp == 8 ? "8xA100-80GB" : "1xA100-80GB");
            StowTraining t;
            StowLayout l;
            StowMemOptions o;
            stow_test_defaults (&t, &l, &o);
            t.precision = fp32 ? STOW_PRECISION_FP32 : STOW_PRECISION_BF16;
            /* Short enough that the output layer's staging outgrows the
             * logits: 12 B x 256 x 32000. */
            t.seq_len = 256;
            l.engine = STOW_ENGINE_DEEPSPEED;
            l.zero = zero;
            l.dp = dp;
            /* Offloaded on one GPU, resident on eight. */
            l.offload_optimizer
                = dp == 1 ? STOW_OFFLOAD_CPU : STOW_OFFLOAD_NONE;
            l.offload_params
                = dp == 1 && zero == 3 ? STOW_OFFLOAD_CPU : STOW_OFFLOAD_NONE;
            o.overlap_comm = 1;
            o.reuse_distance_elements = reuse;
            g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
            GArray *terms = mem->stages[0].terms;
            guint64 wb = fp32 ? 4 : 2;
            g_assert_cmpuint (term_bytes (terms, "reduce buckets"), ==,
                              (zero == 2 ? 2 : 1) * 500000000ull * wb);
            guint64 gathered
                = zero == 3 ? wb * (MAX (reuse / 2, head) + 50000000) : 0;
            g_assert_cmpuint (term_bytes (terms, "gathered parameters"), ==,
                              gathered);
            guint64 transient = zero == 3 ? wb * 50000000 : 0;
            if (l.offload_params == STOW_OFFLOAD_CPU)
              {
                guint64 after = term_bytes (terms, "logits and loss")
                                + term_bytes (terms, "backward working set")
                                + term_bytes (terms, "recomputed layer");
                g_assert_cmpuint (wb * head, >, after + wb * 50000000);
                transient = wb * head - after;
              }
            g_assert_cmpuint (term_bytes (terms, "gather transients"), ==,
                              transient);
            g_assert_cmpuint (
                term_bytes (mem->host_terms, "CPU optimizer buffers"), ==,
                dp == 1 ? 2ull * 128 * 1048576 * 4 : 0);
          }
  /* Only DeepSpeed's CPU optimizer pins them. */
  g_autoptr (StowCluster) c1 = stow_test_cluster ("1xA100-80GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  l.engine = STOW_ENGINE_STOWAGE;
  l.zero = 3;
  l.offload_optimizer = STOW_OFFLOAD_CPU;
  g_autoptr (StowMemory) mem = estimate (m, c1, &t, &l, &o);
  g_assert_cmpuint (term_bytes (mem->host_terms, "CPU optimizer buffers"), ==,
                    0);
}

/* LoRA: a frozen linear keeps no input, so the inputs only frozen linears
 * read are not charged, except under DeepSpeed ZeRO-3 (whose linear saves
 * every input); lora_dropout adds each adapter's dropped copy and mask. */
static void
test_lora_frozen_inputs (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-2-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-80GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  guint64 act[2][2];
  for (int ds = 0; ds < 2; ds++)
    for (int drop = 0; drop < 2; drop++)
      {
        stow_test_defaults (&t, &l, &o);
        t.precision = STOW_PRECISION_FP32;
        t.seq_len = 1024;
        t.finetune = STOW_FINETUNE_LORA;
        t.lora_dropout = drop;
        l.engine = ds ? STOW_ENGINE_DEEPSPEED : STOW_ENGINE_PYTORCH;
        l.zero = ds ? 3 : 0;
        l.dp = ds ? 8 : 1;
        l.micro_batch = 1;
        g_autoptr (StowCluster) c1 = stow_test_cluster ("1xA100-80GB");
        g_autoptr (StowMemory) mem = estimate (m, ds ? c : c1, &t, &l, &o);
        act[ds][drop] = term_bytes (mem->stages[0].terms, "activations");
      }
  /* Per token and layer, q and v adapted (rank 8), h 4096, ffn 11008, 4 B:
   * without dropout pytorch drops o's, the MLP's and down's inputs (4 (h +
   * h + f) B); with it the attention input gives way to two dropped copies
   * and masks (2 x 5 h - 4 h B). */
  double h = 4096, f = 11008, tokens = 1024.0 * 32;
  g_assert_cmpfloat ((double)(act[1][0] - act[0][0]), ==,
                     tokens * 4.0 * (h + h + f));
  g_assert_cmpfloat ((double)(act[0][1] - act[0][0]), ==, tokens * 6.0 * h);
  g_assert_cmpfloat ((double)(act[1][1] - act[1][0]), ==, tokens * 10.0 * h);

  /* Offload under LoRA: DeepSpeed's frozen weights go to the host; the
   * other engines refuse it. */
  stow_test_defaults (&t, &l, &o);
  t.finetune = STOW_FINETUNE_LORA;
  l.offload_params = STOW_OFFLOAD_CPU;
  l.offload_optimizer = STOW_OFFLOAD_CPU;
  l.zero = 3;
  l.dp = 8;
  l.engine = STOW_ENGINE_FSDP;
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_memory_estimate (TEST_PLAN (m, c, &t, &l, &o), &error));
  g_assert_nonnull (strstr (error->message, "only --engine deepspeed"));
  l.engine = STOW_ENGINE_DEEPSPEED;
  g_autoptr (StowMemory) off = estimate (m, c, &t, &l, &o);
  l.offload_params = l.offload_optimizer = STOW_OFFLOAD_NONE;
  g_autoptr (StowMemory) on = estimate (m, c, &t, &l, &o);
  g_assert_cmpuint (term_bytes (off->stages[0].terms, "parameters"), ==, 0);
  g_assert_cmpuint (off->allocated_peak_bytes, <, on->allocated_peak_bytes);
  g_assert_cmpuint (off->host_total_bytes, >, on->host_total_bytes);

  /* To NVMe (ZeRO-Infinity), the frozen weights and the adapters' states
   * land on the drives, not in host memory, and a node without drives
   * does not fit. */
  l.offload_params = l.offload_optimizer = STOW_OFFLOAD_NVME;
  g_autoptr (StowMemory) nv = estimate (m, c, &t, &l, &o);
  guint64 frozen = term_bytes (off->host_terms, "offloaded parameters");
  g_assert_cmpuint (frozen, >, 0);
  g_assert_cmpuint (term_bytes (nv->nvme_terms, "offloaded parameters"), ==,
                    frozen);
  g_assert_cmpuint (term_bytes (nv->host_terms, "offloaded parameters"), ==, 0);
  g_assert_cmpuint (
      term_bytes (nv->nvme_terms, "master weights and optimizer states"), >, 0);
  g_assert_cmpuint (term_bytes (nv->host_terms, "parameter staging buffers"), >,
                    0);
  g_assert_cmpuint (nv->host_total_bytes, <, off->host_total_bytes);
  g_autoptr (StowCluster) bare = stow_test_cluster ("8xA100-80GB");
  bare->node.n_nvme = 0;
  g_autoptr (StowMemory) none = estimate (m, bare, &t, &l, &o);
  g_assert_false (none->fits_nvme);
  g_assert_false (none->fits);
}

/* FSDP's sharding strategies, as PyTorch's ShardingStrategy docstring
 * (torch/distributed/fsdp/api.py) states them: FULL_SHARD (--zero 3)
 * shards parameters, gradients and optimizer states; SHARD_GRAD_OP
 * (--zero 2) shards gradients and optimizer states during computation and
 * parameters outside it, so the fp32 flat parameter is a shard and only
 * its bf16 unsharded copy lives from forward to backward; NO_SHARD
 * (--zero 0) shards nothing. */
static void
test_fsdp_sharding (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  l.dp = 8, l.engine = STOW_ENGINE_FSDP;
  double N = (double)m->params;
  const struct
  {
    guint zero;
    double params, unsharded, opt; /* bytes per parameter */
  } rows[] = {
    { 0, 4.0, 0.0, 8.0 },
    { 2, 4.0 / 8, 2.0, 8.0 / 8 },
    { 3, 4.0 / 8, 0.0, 8.0 / 8 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      l.zero = rows[i].zero;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      GArray *terms = mem->stages[0].terms;
      g_assert_cmpfloat (
          fabs ((double)term_bytes (terms, "parameters") - rows[i].params * N),
          <=, 8.0);
      g_assert_cmpfloat ((double)term_bytes (terms, "unsharded parameters"), ==,
                         rows[i].unsharded * N);
      g_assert_cmpfloat (fabs ((double)term_bytes (terms, "optimizer states")
                               - rows[i].opt * N),
                         <=, 8.0);
    }
}

/* Case 21: bigcode-project/Megatron-LM issue #20 (January 2023), "Adam
 * Peak (MB)" of small GPTs on one GPU: vocabulary 49,280, batch 1,
 * sequence 2048, Megatron's AdamW.  The issue gives heads, layers, width
 * and the model size in millions of parameters (81 to 209, which these
 * models match) but not the precision, the counter or the unit.
 *
 * Precision: from 6 to 12 heads the peak rises by 1,358, 2,718 and 5,451
 * MB at 6, 12 and 24 layers: 37.8 MB per head and layer, with no per-head
 * constant.  A head holds s^2 = 4,194,304 attention scores per layer, so
 * that is 9.0 B per score at 10^6 B per MB (9.45 at 2^20): fp32's eager
 * softmax output (4 B), dropout mask (1 B) and dropout output (4 B).  A
 * 16-bit run keeps 5 B (Megatron's fused softmax) or 7 B (its unfused fp32
 * softmax), so the run is taken as fp32, eager, with dropout.
 *
 * Counter and unit: Megatron's report_memory prints max allocated in MiB;
 * the issue does not say what it used.  Compared with the allocated peak,
 * both readings of "MB" (10^6 and 2^20 B) are checked, and so is the
 * per-head rise that fixed the precision. */
/* The ten rows' worst reading was +5.8% when issue 42 set this: 1.25
 * times that, rounded up (the rises' worst is -4.9%). */
#define BIGCODE_BOUND 0.08

static void
test_calibration_bigcode_gpt (void)
{
  static const struct
  {
    guint64 heads, layers, h, size_m;
    double measured_mb;
  } rows[] = {
    { 6, 6, 768, 81, 4490 },    { 12, 6, 768, 81, 5848 },
    { 16, 6, 768, 81, 6776 },   { 6, 12, 768, 124, 7151 },
    { 12, 12, 768, 124, 9869 }, { 16, 12, 768, 124, 11733 },
    { 16, 6, 1024, 128, 7302 }, { 16, 12, 1024, 203, 12719 },
    { 6, 24, 768, 209, 12471 }, { 12, 24, 768, 209, 17922 },
  };
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  double predicted[G_N_ELEMENTS (rows)];
  double worst = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      g_autoptr (StowModel) m
          = gpt_vocab (rows[i].h, rows[i].layers, rows[i].heads, 49280);
      /* "Model Size (MB)": millions of parameters, truncated. */
      g_assert_cmpuint (m->params / 1000000, ==, rows[i].size_m);
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_eager_run (&t, &l, &o, STOW_PRECISION_FP32, 2048,
                           STOW_ENGINE_MEGATRON, 1);
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      predicted[i] = (double)mem->allocated_peak_bytes;
      double mb = rows[i].measured_mb * 1e6,
             mib = rows[i].measured_mb * 1048576.0;
      g_test_message (
          "bigcode GPT %" G_GUINT64_FORMAT " heads, %" G_GUINT64_FORMAT
          " layers, h %" G_GUINT64_FORMAT ": predicted %.0f MB "
          "(%.0f MiB), measured %.0f: %+.1f%% (10^6 B) / %+.1f%% "
          "(2^20 B)",
          rows[i].heads, rows[i].layers, rows[i].h, predicted[i] / 1e6,
          predicted[i] / 1048576.0, rows[i].measured_mb,
          100 * (predicted[i] - mb) / mb, 100 * (predicted[i] - mib) / mib);
      g_assert_cmpfloat (fabs (predicted[i] - mb) / mb, <=, BIGCODE_BOUND);
      g_assert_cmpfloat (fabs (predicted[i] - mib) / mib, <=, BIGCODE_BOUND);
      worst = MAX (worst, fabs (predicted[i] - mb) / mb);
      worst = MAX (worst, fabs (predicted[i] - mib) / mib);
    }
  stow_test_claim ("memory.bigcode.worst-pct", 100 * worst);
  /* The rise from 6 to 12 heads at 6, 12 and 24 layers (rows 0/1, 3/4, 8/9). */
  static const gsize pairs[][2] = { { 0, 1 }, { 3, 4 }, { 8, 9 } };
  for (gsize k = 0; k < G_N_ELEMENTS (pairs); k++)
    {
      gsize a = pairs[k][0], b = pairs[k][1];
      double got = predicted[b] - predicted[a];
      double rise = rows[b].measured_mb - rows[a].measured_mb;
      g_test_message ("bigcode GPT %" G_GUINT64_FORMAT
                      " layers, 6 -> 12 heads: "
                      "predicted +%.0f MB, measured +%.0f: %+.1f%% (10^6 B) / "
                      "%+.1f%% (2^20 B)",
                      rows[a].layers, got / 1e6, rise,
                      100 * (got - rise * 1e6) / (rise * 1e6),
                      100 * (got - rise * 1048576.0) / (rise * 1048576.0));
      g_assert_cmpfloat (fabs (got - rise * 1e6) / (rise * 1e6), <=,
                         BIGCODE_BOUND);
      g_assert_cmpfloat (fabs (got - rise * 1048576.0) / (rise * 1048576.0), <=,
                         BIGCODE_BOUND);
    }
}

/* LoRA adapters against PEFT's print_trainable_parameters for
 * Llama-2-7B: rank 8 on q_proj and v_proj, 4,194,304; rank 16 on every
 * linear (q, k, v, o, gate, up, down), 39,976,960.  The adapters train in
 * fp32: 4 B each. */
static void
test_lora_adapters (void)
{
  static const struct
  {
    guint64 rank;
    const char *targets;
    guint64 trainable;
  } cases[] = {
    { 8, "q,v", 4194304 },
    { 16, "all", 39976960 },
    { 16, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", 39976960 },
  };
  g_autoptr (StowModel) m = stow_test_model ("llama-2-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("1xA100-80GB");
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_defaults (&t, &l, &o);
      t.finetune = STOW_FINETUNE_LORA;
      t.lora_rank = cases[i].rank;
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_lora_targets_parse (cases[i].targets, "t",
                                              &t.lora_targets, &error));
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      g_assert_cmpuint (term_bytes (mem->stages[0].terms, "lora adapters"), ==,
                        4 * cases[i].trainable);
    }

  /* An encoder-decoder: PEFT's README prints, for bigscience/mt0-large
   * with rank 8 on q and v, "trainable params: 2359296 || all params:
   * 1231940608".  "q" and "v" name the decoder's cross-attention matrices
   * too: 72 attention blocks (24 encoder, 2 x 24 decoder) x 2 x 8 x
   * (1024 + 1024). */
  g_autoptr (StowModel) mt0 = hf_fixture ("mt0-large.json");
  g_assert_cmpuint (mt0->params + 2359296, ==, 1231940608);
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  t.finetune = STOW_FINETUNE_LORA;
  g_autoptr (StowMemory) mem = estimate (mt0, c, &t, &l, &o);
  g_assert_cmpuint (term_bytes (mem->stages[0].terms, "lora adapters"), ==,
                    4 * 2359296);
}

/* The seed (HF blog "Fit More and Train Faster With ZeRO via DeepSpeed and
 * FairScale", 2021): t5-3b, fp16, on one 24 GB RTX 3090.  Without
 * DeepSpeed it does not fit even at batch 1; with ZeRO-2 and the optimizer
 * on the CPU it trains at batch 20 and runs out of memory at 30.  Its
 * command (transformers #8771) caps sequences at 128 tokens but trims
 * padding per batch (--sortish_sampler), so the effective length is the
 * longest sentence pair of each batch; we do not have that run's data, so
 * the labels are checked over a band of effective lengths, 72 to 96
 * tokens.  DeepSpeed's buckets are those of the transformers docs' ZeRO-2
 * example of that time: reduce_bucket_size 2e8 with overlap_comm. */
static void
test_seed_t5_3b_labels (void)
{
  g_autoptr (StowModel) m = stow_test_model ("t5-3b");
  g_autoptr (StowCluster) c = stow_test_cluster ("1xRTX-3090");
  for (guint64 seq = 72; seq <= 96; seq += 8)
    for (guint bs = 20; bs <= 30; bs += 10)
      {
        StowTraining t;
        StowLayout l;
        StowMemOptions o;
        stow_test_eager_run (&t, &l, &o, STOW_PRECISION_FP16, seq,
                             STOW_ENGINE_DEEPSPEED, bs);
        l.zero = 2;
        l.offload_optimizer = STOW_OFFLOAD_CPU;
        o.reduce_bucket_elements = 200000000;
        o.overlap_comm = 1;
        g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
        g_test_message ("t5-3b seq %" G_GUINT64_FORMAT " batch %u: %.2f GiB "
                        "of %.2f",
                        seq, bs, (double)mem->total_bytes / GiB,
                        (double)mem->capacity_bytes / GiB);
        if (bs == 20)
          g_assert_true (mem->fits);
        else
          g_assert_false (mem->fits_device);
      }

  /* The baseline: the HF Trainer with fp16 and no DeepSpeed, batch 1, at
   * any length up to the cap. */
  for (guint64 seq = 16; seq <= 128; seq *= 2)
    {
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      t.precision = STOW_PRECISION_FP16;
      t.seq_len = seq;
      t.flash_attention = FALSE;
      t.dropout = TRUE;
      l.engine = STOW_ENGINE_PYTORCH;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, NULL);
      g_assert_false (mem->fits_device);
    }
}

/* ---- properties -----------------------------------------------------------
 */

static const char *const property_models[] = {
  "{\"model_type\": \"llama\", \"hidden_size\": 4096, \"num_hidden_layers\": "
  "32,"
  " \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
  " \"intermediate_size\": 14336, \"vocab_size\": 128256}",
  "{\"model_type\": \"mixtral\", \"hidden_size\": 4096, \"num_hidden_layers\": "
  "32,"
  " \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
  " \"intermediate_size\": 14336, \"vocab_size\": 32000,"
  " \"num_local_experts\": 8, \"num_experts_per_tok\": 2}",
  "{\"model_type\": \"gpt2\", \"n_embd\": 1600, \"n_layer\": 48,"
  " \"n_head\": 25, \"vocab_size\": 50257, \"n_positions\": 1024}",
};

static guint
pick (GRand *r, const guint *choices, gsize n)
{
  return choices[g_rand_int_range (r, 0, (gint32)n)];
}

/* A random valid layout of @m on @c, or FALSE after a few tries. */
static gboolean
random_layout (GRand *r, const StowModel *m, const StowCluster *c,
               StowTraining *t, StowLayout *l)
{
  static const guint degrees[] = { 1, 1, 2, 4, 8 };
  for (int attempt = 0; attempt < 50; attempt++)
    {
      stow_training_init (t);
      stow_layout_init (l);
      t->seq_len = pick (r, (const guint[]){ 512, 2048, 4096 }, 3);
      t->flash_attention = g_rand_boolean (r);
      t->precision = (StowPrecision)g_rand_int_range (r, 0, 4);
      t->optimizer = (StowOptimizer)g_rand_int_range (r, 0, 5);
      l->tp = pick (r, degrees, G_N_ELEMENTS (degrees));
      l->pp = pick (r, degrees, G_N_ELEMENTS (degrees));
      l->ep = m->n_experts ? pick (r, degrees, 4) : 1;
      if (c->n_gpus % (l->tp * l->pp) != 0)
        continue;
      l->dp = c->n_gpus / (l->tp * l->pp);
      l->sp = l->tp > 1 && g_rand_boolean (r);
      l->zero = g_rand_int_range (r, 0, 4);
      l->engine = (StowEngine)g_rand_int_range (r, 0, STOW_ENGINE_NEMO + 1);
      l->offload_optimizer = (StowOffload)g_rand_int_range (r, 0, 3);
      l->offload_params = l->zero == 3 ? (StowOffload)g_rand_int_range (r, 0, 3)
                                       : STOW_OFFLOAD_NONE;
      l->recompute
          = (StowRecompute)g_rand_int_range (r, 0, STOW_RECOMPUTE_OP + 1);
      l->micro_batch = pick (r, (const guint[]){ 1, 2, 4 }, 3);
      l->grad_accum = pick (r, (const guint[]){ 1, 4, 16 }, 3);
      if (stow_layout_validate (l, t, m, c, NULL))
        return TRUE;
    }
  return FALSE;
}

static guint64
sum_terms (GArray *terms)
{
  guint64 s = 0;
  for (guint i = 0; i < terms->len; i++)
    s += g_array_index (terms, StowMemTerm, i).bytes;
  return s;
}

static guint64
sum_named (GArray *terms, const char *const *names)
{
  guint64 s = 0;
  for (gsize i = 0; names[i]; i++)
    s += term_bytes (terms, names[i]);
  return s;
}

static const char *const model_state_terms[] = {
  "parameters",
  "gradients",
  "master weights",
  "optimizer states",
  "fp32 gradient partition",
  NULL,
};
static const char *const activation_terms[] = {
  "activations",
  "activation checkpoints",
  "recomputed layer",
  NULL,
};

/* ---- mixture of experts: ZeRO over the expert-data-parallel group ------ */

/* Mixtral 8x7B (Mistral AI, "Mixtral of experts", 2023: 46.7B parameters,
 * 12.9B active per token).  Each expert is a SwiGLU MLP of 3 h f
 * parameters, h 4096 and f 14336: 176,160,768 per expert per layer, so
 * the routed experts are 32 layers x 8 experts x 176,160,768
 * = 45,097,156,608 and the rest (attention 32 x 41,943,040, embedding and
 * head 2 x 32000 x 4096, routers 32 x 8 x 4096, norms 65 x 4096) is
 * 1,605,636,096.  Check: 1,605,636,096 + 2 of the 8 experts
 * (11,274,289,152) = 12,879,925,248, the published 12.9B active.
 *
 * EP carves the 8 data-parallel ranks into groups of ep: a GPU holds
 * 8 / ep of the experts, 45,097,156,608 / ep parameters, and each expert
 * is held by only 8 / ep ranks, its expert-data-parallel group.  ZeRO
 * shards the dense 1,605,636,096 over all 8 ranks but the experts only over
 * those 8 / ep (Megatron-core: the expert data parallel group, world /
 * (etp x ep x pp); the Megatron Bridge MoE guide's table: EP divides the
 * MoE weights and their optimizer states, DP only the optimizer states
 * under the distributed optimizer; DeepSpeed-MoE: the
 * expert_data_parallel_group of deepspeed/utils/groups.py).  At ep 8 the
 * group is one GPU: ZeRO cannot shard the 5,637,144,576 expert parameters
 * a GPU holds, and Adam's 12 B of each stay whole, 63 GiB per GPU. */
static void
test_moe_expert_data_parallel (void)
{
  g_autoptr (StowModel) m = stow_test_model ("mixtral-8x7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  const guint64 expert = 45097156608ull, dense = 1605636096ull;
  g_assert_cmpuint (m->params, ==, expert + dense);
  g_assert_cmpuint (m->by_role[STOW_ROLE_EXPERT], ==, expert);

  static const guint eps[] = { 1, 2, 8 };
  for (guint z = 1; z <= 3; z++)
    for (gsize i = 0; i < G_N_ELEMENTS (eps); i++)
      {
        StowTraining t;
        StowLayout l;
        StowMemOptions o;
        stow_test_defaults (&t, &l, &o);
        l.dp = 8, l.ep = eps[i], l.zero = z;
        g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
        GArray *terms = mem->stages[0].terms;
        guint64 held = dense + expert / l.ep; /* on one GPU */
        guint64 edp = 8 / l.ep;               /* expert-data-parallel */
        guint64 shard = dense / 8 + expert / l.ep / edp;
        g_test_message ("ZeRO %u, ep %u: %" G_GUINT64_FORMAT
                        " params held, %" G_GUINT64_FORMAT " per shard",
                        z, l.ep, held, shard);
        /* bf16 weights and gradients, fp32 master, Adam's two fp32
         * moments (stowage's engine). */
        g_assert_cmpuint (mem->stages[0].params, ==, held);
        g_assert_cmpuint (term_bytes (terms, "parameters"), ==,
                          2 * (z >= 3 ? shard : held));
        g_assert_cmpuint (term_bytes (terms, "gradients"), ==,
                          2 * (z >= 2 ? shard : held));
        g_assert_cmpuint (term_bytes (terms, "master weights"), ==, 4 * shard);
        g_assert_cmpuint (term_bytes (terms, "optimizer states"), ==,
                          8 * shard);
      }

  /* The issue's case: ZeRO 2, ep 8.  The experts' gradients, master
   * weights and states are whole: (2 + 4 + 8) B x 5,637,144,576 = 73.5 GiB
   * of them alone, more than an H100 holds beside the rest. */
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  l.dp = 8, l.ep = 8, l.zero = 2;
  g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
  g_assert_cmpuint (sum_named (mem->stages[0].terms, model_state_terms), >=,
                    14 * (expert / 8) + 2 * dense + 14 * (dense / 8));
  g_assert_false (mem->fits_device);

  /* Every multi-GPU engine shards the optimizer states the same way
   * (plain PyTorch runs on one GPU). */
  static const StowEngine engines[] = {
    STOW_ENGINE_STOWAGE,
    STOW_ENGINE_DEEPSPEED,
    STOW_ENGINE_MEGATRON,
    STOW_ENGINE_FSDP,
  };
  for (gsize e = 0; e < G_N_ELEMENTS (engines); e++)
    {
      l.engine = engines[e];
      /* Megatron's distributed optimizer is its ZeRO 1. */
      l.zero = l.engine == STOW_ENGINE_MEGATRON ? 1 : 2;
      g_autoptr (StowMemory) me = estimate (m, c, &t, &l, &o);
      g_assert_cmpuint (term_bytes (me->stages[0].terms, "optimizer states"),
                        ==, 8 * (dense / 8 + expert / 8));
    }
}

/* DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437: 671B parameters, 37B
 * active): 58 MoE layers of 256 routed experts of 3 x 7168 x 2048
 * = 653,908,770,816 routed-expert parameters, the rest (MLA attention,
 * the shared expert, three dense layers, embedding and head) 17.1B.  On
 * 256 GPUs with ep 64 a GPU holds 1/64 of the experts and each expert is
 * held by 4 GPUs: under ZeRO 1 and 2, weights alone are at least
 * 2 B x (expert / 64 + dense); under ZeRO 3 the model states at least
 * 16 B x (expert / 64 / 4 + dense / 256), 38 GiB, where stowage used to
 * show 1.29 GiB. */
static void
test_moe_deepseek_v3_bound (void)
{
  g_autoptr (StowModel) m = stow_test_model ("deepseek-v3");
  g_autoptr (StowCluster) c = stow_test_cluster ("256xH100-SXM");
  const guint64 expert = 58ull * 256 * 3 * 7168 * 2048;
  g_assert_cmpuint (m->by_role[STOW_ROLE_EXPERT], ==, expert);
  const guint64 dense = m->params - expert;
  g_assert_cmpuint (dense, >, 17000000000ull);
  g_assert_cmpuint (dense, <, 17200000000ull);
  for (guint z = 1; z <= 3; z++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_defaults (&t, &l, &o);
      l.dp = 256, l.ep = 64, l.zero = z;
      l.offload_optimizer = STOW_OFFLOAD_NONE;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      guint64 states = sum_named (mem->stages[0].terms, model_state_terms);
      guint64 floor = 16 * (expert / 64 / 4 + dense / 256);
      if (z < 3)
        floor
            += 2 * (expert / 64 + dense) - 2 * (expert / 64 / 4 + dense / 256);
      g_test_message ("ZeRO %u: model states %.2f GiB, at least %.2f", z,
                      states / GiB, floor / GiB);
      g_assert_cmpuint (states, >=, floor);
      g_assert_cmpfloat (states / GiB, >, 38.0);
    }
}

/* Expert tensor parallelism apart from --tp (--etp, Megatron-core's
 * --expert-tensor-parallel-size).  Mixtral 8x7B as above on 16 H100s,
 * tp 2, ep 8, dp 8, Megatron's distributed optimizer.  A GPU holds
 * 1/ep of the experts, each split etp ways
 * (megatron/training/theoretical_memory_usage.py divides the routed
 * experts by etp x ep): 45,097,156,608 / 16 = 2,818,572,288 with etp = tp
 * = 2, 45,097,156,608 / 8 = 5,637,144,576 with etp 1, twice as many, so
 * its bf16 weights and fp32 main gradients double.  Its expert data-
 * parallel group is world / (etp x ep x pp): 1 rank with etp 2, 2 with
 * etp 1; the distributed optimizer shards the fp32 master weights and
 * Adam's moments over it, so they stay 45,097,156,608 / 16 per GPU
 * either way.  The dense 1,605,636,096 are split by tp 2 and sharded over
 * all 8 dp ranks as before. */
static void
test_moe_expert_tensor_parallel (void)
{
  g_autoptr (StowModel) m = stow_test_model ("mixtral-8x7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("16xH100-SXM");
  const guint64 expert = 45097156608ull;
  guint64 w[2], g[2], master[2], opt[2];
  for (guint i = 0; i < 2; i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_test_defaults (&t, &l, &o);
      l.engine = STOW_ENGINE_MEGATRON;
      l.tp = 2, l.sp = TRUE, l.dp = 8, l.ep = 8, l.zero = 1;
      l.etp = i == 0 ? 0 : 1; /* 0: as --tp */
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_layout_validate (&l, &t, m, c, &error));
      g_assert_no_error (error);
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      GArray *terms = mem->stages[0].terms;
      w[i] = term_bytes (terms, "parameters");
      g[i] = term_bytes (terms, "gradients");
      master[i] = term_bytes (terms, "master weights");
      opt[i] = term_bytes (terms, "optimizer states");
    }
  /* etp 1 holds expert / 8 - expert / 16 more expert parameters. */
  const guint64 more = expert / 8 - expert / 16;
  g_assert_cmpuint (more, ==, 2818572288ull);
  g_assert_cmpuint (w[1] - w[0], ==, 2 * more); /* bf16 */
  g_assert_cmpuint (g[1] - g[0], ==, 4 * more); /* fp32 main grads */
  g_assert_cmpuint (master[1], ==, master[0]);
  g_assert_cmpuint (opt[1], ==, opt[0]);

  /* Megatron's rule: etp x ep x pp divides the world. */
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  l.engine = STOW_ENGINE_MEGATRON;
  l.tp = 2, l.sp = TRUE, l.dp = 8, l.ep = 8, l.zero = 1, l.etp = 4;
  g_autoptr (GError) error = NULL;
  g_assert_false (stow_layout_validate (&l, &t, m, c, &error));
  g_assert_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "--etp 4"));

  /* DeepSpeed-MoE keeps its experts whole on each tensor-parallel rank by
   * default (deepspeed/moe/layer.py, enable_expert_tensor_parallelism =
   * False), which is not modelled: refused by name rather than priced as
   * split. */
  l.engine = STOW_ENGINE_DEEPSPEED, l.etp = 0, l.sp = FALSE, l.zero = 2;
  assert_refused (m, c, &t, &l, &o, "enable_expert_tensor_parallelism");
  l.tp = 1, l.dp = 16;
  g_autoptr (StowMemory) ds = estimate (m, c, &t, &l, &o);
  g_assert_cmpuint (ds->n_stages, ==, 1);
}

/* ---- Engine defaults: Megatron-core and NeMo (issue 23) ---------------- */

/* Llama 3 8B (meta-llama/Meta-Llama-3-8B config.json): h 4096, 32 layers
 * of 32 query heads and 8 KV heads of 128, ffn 14,336, vocabulary 128,256
 * (a multiple of 128: Megatron pads none), 8,030,261,248 parameters.  A
 * layer's linears hold 2 h^2 + 2 h (8 x 128) + 3 h f = 218,103,808. */
#define L3_PARAMS 8030261248ull
#define L3_LINEAR (32ull * 218103808ull)
#define L3_H      4096.0
#define L3_F      14336.0
#define L3_V      128256ull

/* NeMo 24.07's Llama 3 8B run (NVIDIA/NeMo docs/source/performance/
 * performance_summary.md at 9c5c5e9709, NeMo-Framework-Launcher 24.07
 * examples/training/llama/h100/llama3_8b_fp8.sh): 8 H100, tp 1, pp 1,
 * cp 2, dp 4, micro-batch 1, global batch 128, sequence 8192, no
 * recomputation, the distributed optimizer. */
static void
llama3_8b_run (StowTraining *t, StowLayout *l, StowMemOptions *o,
               StowEngine engine, StowPrecision precision)
{
  stow_test_defaults (t, l, o);
  t->precision = precision;
  t->seq_len = 8192;
  t->global_batch = 128;
  l->engine = engine;
  l->dp = 4, l->cp = 2, l->zero = 1;
  l->micro_batch = 1, l->grad_accum = 32;
}

/* ZeRO's shard: the distributed optimizers shard over dp x cp. */
static guint64
l3_shard (guint64 n)
{
  return (L3_PARAMS + n - 1) / n;
}

/* Megatron-core's vocab-parallel cross-entropy takes one fp32 copy of the
 * logits and works in place on it (core_r0.8.0, 9634c0e4a3): 2 + 4 B a
 * logit at either pass's peak, not the 2 + 4 + 4 of a loss that keeps an
 * fp32 gradient apart.  Without recomputation the "logits and loss" term
 * keeps what the logits add beyond the working set of the last layer's
 * backward, so the two add up to the logits.  fp32 keeps the general
 * count (the bigcode rows calibrate it). */
static void
test_mcore_cross_entropy (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3-8b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  static const struct
  {
    StowEngine engine;
    StowPrecision precision;
    gboolean fused; /* --fused-loss: flash-attn's kernel, e + e B */
    guint64 bytes_per_logit;
  } rows[] = {
    { STOW_ENGINE_MEGATRON, STOW_PRECISION_BF16, FALSE, 6 },
    { STOW_ENGINE_MEGATRON, STOW_PRECISION_FP8, FALSE, 6 },
    { STOW_ENGINE_NEMO, STOW_PRECISION_FP8, FALSE, 6 },
    { STOW_ENGINE_MEGATRON, STOW_PRECISION_FP32, FALSE, 12 },
    { STOW_ENGINE_FSDP, STOW_PRECISION_BF16, FALSE, 10 },
    { STOW_ENGINE_FSDP, STOW_PRECISION_BF16, TRUE, 4 },
    { STOW_ENGINE_FSDP, STOW_PRECISION_FP32, TRUE, 8 },
  };
  guint64 logits = 8192 / 2 * L3_V; /* s / cp x b x V */
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      llama3_8b_run (&t, &l, &o, rows[i].engine, rows[i].precision);
      if (rows[i].engine == STOW_ENGINE_FSDP)
        l.zero = 3;
      t.fused_loss = rows[i].fused;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      GArray *terms = mem->stages[0].terms;
      g_assert_cmpuint (term_bytes (terms, "logits and loss")
                            + term_bytes (terms, "backward working set"),
                        ==, rows[i].bytes_per_logit * logits);
    }

  /* The fused kernel is called from PyTorch training code: Megatron-core
   * and the stowage engine run their own loss, and one loss runs one way. */
  static const struct
  {
    StowEngine engine;
    gboolean chunked;
    const char *fragment;
  } refused[] = {
    { STOW_ENGINE_MEGATRON, FALSE, "--engine megatron runs its own loss" },
    { STOW_ENGINE_STOWAGE, FALSE, "--engine stowage runs its own loss" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (refused); i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      llama3_8b_run (&t, &l, &o, refused[i].engine, STOW_PRECISION_BF16);
      t.fused_loss = TRUE;
      assert_refused (m, c, &t, &l, &o, refused[i].fragment);
    }
}

/* torchtitan's selective op checkpointing (--recompute selective-op): its
 * policy (torchtitan/models/llama/parallelize_llama.py at 9dec370, Dec
 * 2024) saves the flash SDPA output and every second aten.mm's output of
 * each block, which its checkpoint wrapper keeps beside the block's input.
 * Llama 3 8B runs wq, wk, wv, wo, w1, w3, w2, so it keeps wq (4096), wv
 * (1024), w1 (14336) and w2 (4096) a token in bf16, the SDPA output (4096)
 * and its fp32 log-sum-exp (32 heads), and the input (4096): 63,616 B a
 * token a layer, counted by hand here.  Phi-3's fused qkv_proj and
 * gate_up_proj make four matmuls, of which qkv and gate_up are kept. */
static void
test_selective_op (void)
{
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  static const struct
  {
    const char *model;
    guint64 per_token; /* B a token a layer, by hand */
  } rows[] = {
    { "llama-3-8b", 2 * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32 },
    /* phi-3-mini: h 3072, 32 heads of 96, ffn 8192: qkv 9216, gate_up
     * 16384, SDPA output 3072, input 3072. */
    { "phi-3-mini", 2 * (9216 + 16384 + 3072 + 3072) + 4 * 32 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      g_autoptr (StowModel) m = stow_test_model (rows[i].model);
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      t.seq_len = 8192;
      t.global_batch = 16;
      l.engine = STOW_ENGINE_FSDP;
      l.dp = 8, l.zero = 3, l.micro_batch = 2;
      guint64 tokens = 2 * 8192;
      guint64 peaks[3];
      static const StowRecompute modes[]
          = { STOW_RECOMPUTE_NONE, STOW_RECOMPUTE_OP, STOW_RECOMPUTE_FULL };
      for (gsize k = 0; k < G_N_ELEMENTS (modes); k++)
        {
          l.recompute = modes[k];
          g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, NULL);
          peaks[k] = mem->allocated_peak_bytes;
          if (modes[k] != STOW_RECOMPUTE_OP)
            continue;
          GArray *terms = mem->stages[0].terms;
          g_assert_cmpuint (term_bytes (terms, "activations"), ==,
                            m->n_layers * tokens * rows[i].per_token);
          g_assert_cmpuint (term_bytes (terms, "recomputed layer"), >, 0);
        }
      g_test_message ("%s: allocated peak none %.2f, selective-op %.2f, full "
                      "%.2f GiB",
                      rows[i].model, (double)peaks[0] / GiB,
                      (double)peaks[1] / GiB, (double)peaks[2] / GiB);
      g_assert_cmpuint (peaks[0], >, peaks[1]);
      g_assert_cmpuint (peaks[1], >, peaks[2]);
    }

  /* What the policy is not modelled for, or is not, is refused by name. */
  g_autoptr (StowModel) l8 = stow_test_model ("llama-3-8b");
  g_autoptr (StowModel) mix = stow_test_model ("mixtral-8x7b");
  static const struct
  {
    StowEngine engine;
    gboolean moe, no_flash, lora;
    const char *fragment;
  } bad[] = {
    { STOW_ENGINE_MEGATRON, FALSE, FALSE, FALSE, "not --engine megatron's" },
    { STOW_ENGINE_STOWAGE, FALSE, FALSE, FALSE, "not --engine stowage's" },
    { STOW_ENGINE_FSDP, FALSE, TRUE, FALSE, "drop --no-flash" },
    { STOW_ENGINE_FSDP, TRUE, FALSE, FALSE, "not aten.mm" },
    { STOW_ENGINE_FSDP, FALSE, FALSE, TRUE, "LoRA's adapters" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      t.seq_len = 4096;
      t.flash_attention = !bad[i].no_flash;
      if (bad[i].lora)
        t.finetune = STOW_FINETUNE_LORA, t.lora_rank = 16;
      l.engine = bad[i].engine;
      l.dp = 8, l.zero = bad[i].engine == STOW_ENGINE_FSDP ? 3 : 1;
      l.recompute = STOW_RECOMPUTE_OP;
      assert_refused (bad[i].moe ? mix : l8, c, &t, &l, NULL, bad[i].fragment);
    }
}

/* torchtitan's Llama 3.1 8B benchmarks (pytorch/torchtitan benchmarks/
 * llama3_h100_202412_torchtitan.md, Tables 1 and 3: FSDP, local batch 2,
 * sequence 8192, selective op checkpointing, on Grand Teton H100s of 96
 * GB; torchtitan logs max_memory_reserved): 82.4, 77.0 and 76.8 GiB on 8
 * GPUs (eager, compiled, compiled with Float8), 67.0, 62.0 and 61.8 on
 * 128.  The model predicts them 11-20% low, eager worst: it charges the
 * eager and compiled runs alike (the peak is the loss's, which neither
 * compiles), and torchtitan's loss over fp32 logits (the model returns
 * output(h).float()) and FSDP2's unsharded output-layer gradient are not
 * in it; the bounds hold it to that gap, on both sides, until a
 * measurement on a GPU splits it (docs/memory-model.md): from the
 * furthest (-20.0% when issue 42 set them) and a quarter to the nearest
 * (-11.2%) less a quarter, so that neither a worse prediction nor one
 * that is no longer low passes unnoticed. */
#define TORCHTITAN_LOWEST  -0.25
#define TORCHTITAN_HIGHEST -0.084

static void
test_calibration_torchtitan (void)
{
  double lowest = 0, highest = -1;
  g_autoptr (StowModel) m = stow_test_model ("llama-3.1-8b");
  static const struct
  {
    const char *cluster;
    guint dp;
    gboolean compiled, fp8;
    double published_gib;
  } rows[] = {
    { "grand-teton-h100-1node.json", 8, FALSE, FALSE, 82.4 },
    { "grand-teton-h100-1node.json", 8, TRUE, FALSE, 77.0 },
    { "grand-teton-h100-1node.json", 8, TRUE, TRUE, 76.8 },
    { "grand-teton-h100-16node.json", 128, FALSE, FALSE, 67.0 },
    { "grand-teton-h100-16node.json", 128, TRUE, FALSE, 62.0 },
    { "grand-teton-h100-16node.json", 128, TRUE, TRUE, 61.8 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      g_autofree char *path
          = g_test_build_filename (G_TEST_DIST, "data", "published-runs",
                                   "configs", rows[i].cluster, NULL);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowCluster) c = stow_cluster_new_from_file (path, &error);
      g_assert_no_error (error);
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      t.seq_len = 8192;
      t.global_batch = 2 * rows[i].dp;
      t.compiled = rows[i].compiled;
      t.precision = rows[i].fp8 ? STOW_PRECISION_FP8 : STOW_PRECISION_BF16;
      l.engine = STOW_ENGINE_FSDP;
      l.dp = rows[i].dp, l.zero = 3, l.micro_batch = 2;
      l.recompute = STOW_RECOMPUTE_OP;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, NULL);
      double got = (double)mem->reserved_bytes / GiB;
      double err = got / rows[i].published_gib - 1.0;
      g_test_message ("torchtitan %u GPUs%s%s: reserved %.2f GiB, published "
                      "%.1f: %+.1f%%",
                      rows[i].dp, rows[i].compiled ? ", compiled" : "",
                      rows[i].fp8 ? ", Float8" : "", got, rows[i].published_gib,
                      100 * err);
      g_assert_true (mem->fits_device);
      g_assert_cmpfloat (err, >=, TORCHTITAN_LOWEST);
      g_assert_cmpfloat (err, <=, TORCHTITAN_HIGHEST);
      lowest = MIN (lowest, err);
      highest = MAX (highest, err);
    }
  stow_test_claim ("memory.torchtitan.lowest-pct", 100 * lowest);
  stow_test_claim ("memory.torchtitan.highest-pct", 100 * highest);
}

/* llm-foundry's MPT benchmark runs (mosaicml/llm-foundry scripts/train/
 * benchmarking/README.md, "H100 80GB BF16"): MPT-760M at sequence 2048,
 * micro-batch 24, FSDP FULL_SHARD over 8 H100, no activation checkpointing,
 * ran.  As llm-foundry builds it (learned positions, no rotary products;
 * its default fused cross-entropy) it fits; counted with an fp32 loss
 * copy, or as the rotary gpt_neox shape the published-runs tests once
 * used, it would not. */
static void
test_mpt_fused_loss (void)
{
  g_autofree char *path = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                 "mpt-760m.json", NULL);
  g_autoptr (StowModel) m = stow_test_model (path);
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout l;
  stow_training_init (&t);
  stow_layout_init (&l);
  t.seq_len = 2048;
  t.global_batch = 384;
  l.engine = STOW_ENGINE_FSDP;
  l.dp = 8;
  l.zero = 3;
  l.micro_batch = 24;
  l.grad_accum = 2;
  t.fused_loss = TRUE;
  g_autoptr (StowMemory) fused = estimate (m, c, &t, &l, NULL);
  g_test_message ("mpt-760m, micro-batch 24, fused loss: %.2f of %.2f GiB",
                  (double)fused->total_bytes / GiB,
                  (double)fused->capacity_bytes / GiB);
  g_assert_true (fused->fits_device);
  t.fused_loss = FALSE;
  g_autoptr (StowMemory) plain = estimate (m, c, &t, &l, NULL);
  g_assert_false (plain->fits_device);
  /* 24 x 2048 tokens x 50368 logits: 2 + 2 B fused, 2 + 4 + 4 B plain. */
  guint64 logits = 24ull * 2048 * 50368;
  g_assert_cmpuint (
      term_bytes (plain->stages[0].terms, "logits and loss")
          - term_bytes (fused->stages[0].terms, "logits and loss"),
      ==, 6 * logits);
}

/* The distributed optimizers shard over the data-parallel ranks with
 * context parallelism folded in: Megatron-LM core_r0.8.0 hands its
 * DistributedOptimizer get_data_parallel_group (with_context_parallel=
 * True) (megatron/core/optimizer/__init__.py), NeMo's
 * MegatronDistributedFusedAdam takes the same group
 * (nemo/core/optim/distributed_adam.py, 2.0.0rc1).  dp 4 x cp 2 shards
 * like dp 8. */
static void
test_mcore_shards_over_dp_cp (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3-8b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  g_assert_cmpuint (m->params, ==, L3_PARAMS);
  static const StowEngine engines[]
      = { STOW_ENGINE_MEGATRON, STOW_ENGINE_NEMO };
  for (gsize e = 0; e < G_N_ELEMENTS (engines); e++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      llama3_8b_run (&t, &l, &o, engines[e], STOW_PRECISION_BF16);
      g_autoptr (StowMemory) cp2 = estimate (m, c, &t, &l, &o);
      g_assert_cmpuint (term_bytes (cp2->stages[0].terms, "optimizer states"),
                        ==, 8 * l3_shard (8));
      l.dp = 8, l.cp = 1, l.grad_accum = 16;
      g_autoptr (StowMemory) dp8 = estimate (m, c, &t, &l, &o);
      g_assert_cmpuint (term_bytes (dp8->stages[0].terms, "optimizer states"),
                        ==, 8 * l3_shard (8));
    }
}

/* Transformer Engine under fp8, as Megatron-core runs it (TE v1.8,
 * Megatron-LM core_r0.8.0): bf16 parameters; a cached fp8 copy of every
 * TE linear's weight and of its transpose, 2 B per linear parameter
 * (get_fp8_workspace, cache_name "weight", with_transpose); an amax
 * history per fp8 tensor (5 per GEMM: Megatron-LM's length 1, NeMo's
 * 1024), plus scale and scale_inv; and the linears' inputs saved as fp8.
 *
 * Per token and layer in bf16 (flash attention): two norm inputs 4 h,
 * the qkv and fc1 inputs 2 h + 2 h, q 2 h, k and v 2 x 2 x 1024 = h, the
 * attention output 2 h, gate, up and their product 3 x 2 f, and a fp32
 * log-sum-exp per head, 4 a: 13 h + 6 f + 128 B.  Under fp8 the qkv and
 * fc1 inputs and the product (fc2's input) cost 1 B an element and
 * o_proj keeps a 1-B copy beside the attention kernel's 16-bit output:
 * 12 h + 5 f + 128 B.  4,096 tokens a GPU (cp 2), 32 layers. */
static void
test_mcore_fp8_transformer_engine (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3-8b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  const double tokens = 4096.0 * 32.0;
  const guint64 act_bf16 = (guint64)(tokens * (13 * L3_H + 6 * L3_F + 128));
  const guint64 act_fp8 = (guint64)(tokens * (12 * L3_H + 5 * L3_F + 128));
  static const struct
  {
    StowEngine engine;
    guint64 amax_history;
  } rows[] = { { STOW_ENGINE_MEGATRON, 1 }, { STOW_ENGINE_NEMO, 1024 } };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      llama3_8b_run (&t, &l, &o, rows[i].engine, STOW_PRECISION_BF16);
      g_autoptr (StowMemory) bf16 = estimate (m, c, &t, &l, &o);
      guint64 layer16
          = stow_memory_layer_activations (TEST_PLAN (m, NULL, &t, &l, NULL));
      t.precision = STOW_PRECISION_FP8;
      g_autoptr (StowMemory) fp8 = estimate (m, c, &t, &l, &o);
      GArray *terms = fp8->stages[0].terms;
      g_assert_cmpuint (term_bytes (terms, "parameters"), ==, 2 * L3_PARAMS);
      /* stowage spreads the final norm's 4,096 parameters over the
       * layers' norms, so it counts that many fewer linear ones. */
      guint64 caches = term_bytes (terms, "fp8 weight caches");
      g_assert_cmpuint (caches, <=, 2 * L3_LINEAR);
      g_assert_cmpuint (caches, >=, 2 * (L3_LINEAR - 4096));
      g_assert_cmpuint (term_bytes (terms, "fp8 scaling state"), ==,
                        32 * 4 * 5 * (rows[i].amax_history + 2) * 4);
      g_assert_cmpuint (term_bytes (bf16->stages[0].terms, "activations"), ==,
                        act_bf16);
      g_assert_cmpuint (term_bytes (terms, "activations"), ==, act_fp8);
      /* The time model reads a layer's activations as its element-wise
       * traffic, which the fp8 copies do not shrink. */
      g_assert_cmpuint (
          stow_memory_layer_activations (TEST_PLAN (m, NULL, &t, &l, NULL)), ==,
          layer16);
      /* The backward's working set holds 16-bit activation gradients. */
      g_assert_cmpuint (
          term_bytes (terms, "backward working set"), ==,
          term_bytes (bf16->stages[0].terms, "backward working set"));
    }
}

/* NeMo's --zero 1 is Apex's DistributedFusedAdam (NeMo 2.0.0rc1,
 * megatron_base_model.py; apex 810ffae): one contiguous bf16 gradient
 * buffer of the whole model (grad_sync_dtype=bf16 in every GPT and Llama
 * recipe of NeMo-Framework-Launcher 24.07), each bucket's bf16
 * reduce-scattered shard kept for the step, an int16 remainder per
 * parameter for the fp32 master of a bf16 model (store_param_remainders)
 * and Adam's fp32 moments: 2 + 2 + (2 + 2 + 8) / d B.  Megatron-LM keeps
 * fp32 main grads (arguments.py forces accumulate_allreduce_grads_in_fp32
 * for bf16) and an fp32 master: 2 + 4 + 12 / d.  Without distributed
 * Adam (--zero 0) NeMo's MainParamsOptimizerWrapper accumulates fp32
 * grads too; fp16 models keep an fp32 master (store_params). */
static void
test_nemo_distributed_adam (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3-8b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  const guint64 shard = l3_shard (8);
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  llama3_8b_run (&t, &l, &o, STOW_ENGINE_NEMO, STOW_PRECISION_BF16);
  g_autoptr (StowMemory) nemo = estimate (m, c, &t, &l, &o);
  GArray *terms = nemo->stages[0].terms;
  g_assert_cmpuint (term_bytes (terms, "parameters"), ==, 2 * L3_PARAMS);
  g_assert_cmpuint (term_bytes (terms, "gradients"), ==, 2 * L3_PARAMS);
  g_assert_cmpuint (term_bytes (terms, "gradient shards"), ==, 2 * shard);
  g_assert_cmpuint (term_bytes (terms, "master weights"), ==, 2 * shard);
  g_assert_cmpuint (term_bytes (terms, "optimizer states"), ==, 8 * shard);

  l.engine = STOW_ENGINE_MEGATRON;
  g_autoptr (StowMemory) meg = estimate (m, c, &t, &l, &o);
  terms = meg->stages[0].terms;
  g_assert_cmpuint (term_bytes (terms, "gradients"), ==, 4 * L3_PARAMS);
  g_assert_cmpuint (term_bytes (terms, "gradient shards"), ==, 0);
  g_assert_cmpuint (term_bytes (terms, "master weights"), ==, 4 * shard);

  l.engine = STOW_ENGINE_NEMO;
  t.precision = STOW_PRECISION_FP16;
  g_autoptr (StowMemory) fp16 = estimate (m, c, &t, &l, &o);
  g_assert_cmpuint (term_bytes (fp16->stages[0].terms, "master weights"), ==,
                    4 * shard);

  t.precision = STOW_PRECISION_BF16;
  l.zero = 0;
  g_autoptr (StowMemory) z0 = estimate (m, c, &t, &l, &o);
  terms = z0->stages[0].terms;
  g_assert_cmpuint (term_bytes (terms, "gradients"), ==, 4 * L3_PARAMS);
  g_assert_cmpuint (term_bytes (terms, "gradient shards"), ==, 0);
  g_assert_cmpuint (term_bytes (terms, "master weights"), ==, 4 * L3_PARAMS);

  /* Its state lives on the GPU: no optimizer offload. */
  l.zero = 1;
  l.offload_optimizer = STOW_OFFLOAD_CPU;
  assert_refused (m, c, &t, &l, &o,
                  "--engine nemo keeps the optimizer on the GPU");
}

/* The issue's case: NeMo 24.07 ran Llama 3 8B in fp8 on 8 H100 (tp 1,
 * cp 2, dp 4, micro-batch 1, sequence 8192) at 12,273 tokens/s a GPU, so
 * it fit in 80 GB.  No memory figure was published; this one is derived,
 * term by term, from the model's published shapes and the sources' rules
 * (each cited with its test above):
 *
 *   bf16 parameters              2 B x 8,030,261,248
 *   TE fp8 weight + transpose    2 B x 6,979,321,856 linear parameters
 *   TE scaling state             128 GEMMs x 5 x (1024 + 2) x 4 B
 *   bf16 gradient buffer         2 B x 8,030,261,248
 *   gradient shards, remainders  (2 + 2) B x 8,030,261,248 / 8
 *   Adam moments                 8 B x 8,030,261,248 / 8
 *   activations                  32 x 4,096 x (12 h + 5 f + 128) B
 *   the last layer's backward    4,096 x (13 h + 6 f) B of 16-bit gradients
 *   token ids and embeddings     4,096 x (8 + 2 h) B
 *   logits beyond that backward  6 B x 4,096 x 128,256 less the above
 *
 * 71.87 GiB allocated; with stowage's overheads (5% allocator slack, the
 * CUDA context, workspaces and two NCCL communicators) 76.52 GiB, within
 * the H100's 79.18.  Before, stowage charged 3 B parameters, 4 B
 * gradients and 10 B logits and no fp8 caches: 85.5 GiB allocated, "does
 * not fit"; Megatron-LM's own defaults (fp32 main grads) still do not. */
static void
test_nemo_llama3_8b_fp8 (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3-8b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  llama3_8b_run (&t, &l, &o, STOW_ENGINE_NEMO, STOW_PRECISION_FP8);
  g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
  const guint64 tokens = 4096;
  const guint64 shard = l3_shard (8);
  guint64 working = (guint64)(tokens * (13 * L3_H + 6 * L3_F));
  guint64 derived = 2 * L3_PARAMS + 2 * L3_LINEAR + 128 * 5 * 1026 * 4
                    + 2 * L3_PARAMS + (2 + 2 + 8) * shard
                    + (guint64)(32.0 * tokens * (12 * L3_H + 5 * L3_F + 128))
                    + working + tokens * (8 + 2 * (guint64)L3_H)
                    + 6 * tokens * L3_V - working;
  g_test_message ("allocated %.2f GiB, derived %.2f GiB; total %.2f GiB of "
                  "%.2f usable",
                  mem->allocated_peak_bytes / GiB, derived / GiB,
                  mem->total_bytes / GiB, mem->capacity_bytes / GiB);
  /* Within the final norm's 4,096 parameters (test above). */
  g_assert_cmpuint (mem->allocated_peak_bytes, <=, derived);
  g_assert_cmpuint (mem->allocated_peak_bytes, >=, derived - 2 * 4096);
  g_assert_true (mem->fits);
  g_assert_cmpfloat (mem->allocated_peak_bytes / GiB, <, 72.0);

  l.engine = STOW_ENGINE_MEGATRON;
  g_autoptr (StowMemory) meg = estimate (m, c, &t, &l, &o);
  g_test_message ("Megatron-LM's defaults: %.2f GiB allocated",
                  meg->allocated_peak_bytes / GiB);
  g_assert_false (meg->fits);
}

static void
test_properties (void)
{
  GRand *r = g_rand_new_with_seed (1122);
  static const char *const specs[]
      = { "8xA100-80GB", "16xH100-SXM", "4x8xA100-80GB" };
  guint checked = 0;
  for (int iter = 0; iter < 600; iter++)
    {
      g_autoptr (StowModel) m = model_from_json (
          property_models[iter % G_N_ELEMENTS (property_models)]);
      g_autoptr (StowCluster) c
          = stow_test_cluster (specs[iter % G_N_ELEMENTS (specs)]);
      StowTraining t;
      StowLayout l;
      StowMemOptions o;
      stow_mem_options_init (&o);
      if (!random_layout (r, m, c, &t, &l))
        continue;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      checked++;

      /* The search's totals-only path says what the full estimate says
       * (`plan` and `fit` rank by it, `mem` prints the other). */
      StowMemTotals tot;
      g_assert_true (stow_memory_estimate_totals (TEST_PLAN (m, c, &t, &l, &o),
                                                  NULL, &tot, NULL));
      g_assert_cmpuint (tot.total_bytes, ==, mem->total_bytes);
      g_assert_cmpuint (tot.allocated_peak_bytes, ==,
                        mem->allocated_peak_bytes);
      g_assert_cmpuint (tot.host_total_bytes, ==, mem->host_total_bytes);
      g_assert_cmpuint (tot.nvme_bytes, ==, mem->nvme_bytes);
      g_assert_cmpint (tot.fits, ==, mem->fits);

      /* The terms add up to the totals. */
      for (guint s = 0; s < mem->n_stages; s++)
        {
          g_assert_cmpuint (sum_terms (mem->stages[s].terms), ==,
                            mem->stages[s].total_bytes);
          g_assert_cmpuint (mem->stages[s].allocated_bytes, <=,
                            mem->stages[s].reserved_bytes);
          g_assert_cmpuint (mem->stages[s].reserved_bytes, <=,
                            mem->stages[s].total_bytes);
        }
      g_assert_cmpuint (sum_terms (mem->host_terms), ==, mem->host_total_bytes);
      g_assert_cmpuint (sum_terms (mem->nvme_terms), ==, mem->nvme_bytes);

      /* Offloading never raises device bytes. */
      if (l.offload_optimizer != STOW_OFFLOAD_NONE
          || l.offload_params != STOW_OFFLOAD_NONE)
        {
          StowLayout k = l;
          k.offload_optimizer = STOW_OFFLOAD_NONE;
          k.offload_params = STOW_OFFLOAD_NONE;
          g_autoptr (StowMemory) kept = estimate (m, c, &t, &k, &o);
          for (guint s = 0; s < mem->n_stages; s++)
            g_assert_cmpuint (mem->stages[s].total_bytes, <=,
                              kept->stages[s].total_bytes);
        }

      /* Recomputation never raises activation bytes. */
      if (l.recompute != STOW_RECOMPUTE_NONE)
        {
          StowLayout k = l;
          k.recompute = STOW_RECOMPUTE_NONE;
          k.offload_activations = FALSE;
          g_autoptr (StowMemory) kept = estimate (m, c, &t, &k, &o);
          for (guint s = 0; s < mem->n_stages; s++)
            g_assert_cmpuint (
                sum_named (mem->stages[s].terms, activation_terms), <=,
                sum_named (kept->stages[s].terms, activation_terms));
        }

      /* Under ZeRO-3, more data-parallel GPUs never raise per-GPU model
       * states. */
      if (l.zero == 3)
        {
          g_autofree char *spec2
              = g_strdup_printf ("%ux%u%s%s", c->n_nodes * 2,
                                 c->node.gpus_per_node, "x", c->node.gpu.name);
          g_autoptr (StowCluster) c2 = stow_test_cluster (spec2);
          StowLayout k = l;
          k.dp = l.dp * 2;
          g_autoptr (StowMemory) more = estimate (m, c2, &t, &k, &o);
          for (guint s = 0; s < mem->n_stages; s++)
            g_assert_cmpuint (
                sum_named (more->stages[s].terms, model_state_terms), <=,
                sum_named (mem->stages[s].terms, model_state_terms));
        }
    }
  g_assert_cmpuint (checked, >=, 300);
  g_rand_free (r);
}

/* 10T parameters on 100,000 GPUs: no 64-bit overflow anywhere. */
static void
test_no_overflow (void)
{
  g_autoptr (StowModel) m = model_from_json (
      "{\"model_type\": \"llama\", \"hidden_size\": 65536,"
      " \"num_hidden_layers\": 192, \"num_attention_heads\": 512,"
      " \"intermediate_size\": 262144, \"vocab_size\": 256000}");
  g_assert_cmpuint (m->params, >, 9000000000000ull);
  g_autoptr (StowCluster) c = stow_test_cluster ("12500x8xH100-SXM");
  g_assert_cmpuint (c->n_gpus, ==, 100000);
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  t.seq_len = 131072;
  static const guint zs[] = { 0, 3 };
  for (gsize i = 0; i < G_N_ELEMENTS (zs); i++)
    {
      l.tp = 8, l.pp = 4, l.dp = 100000 / 32, l.sp = TRUE, l.zero = zs[i];
      l.micro_batch = 64, l.grad_accum = 64;
      l.offload_optimizer = STOW_OFFLOAD_NVME;
      g_autoptr (StowMemory) mem = estimate (m, c, &t, &l, &o);
      for (guint s = 0; s < mem->n_stages; s++)
        {
          GArray *terms = mem->stages[s].terms;
          guint64 sum = 0;
          for (guint k = 0; k < terms->len; k++)
            {
              guint64 b = g_array_index (terms, StowMemTerm, k).bytes;
              g_assert_cmpuint (b, <, (guint64)1 << 62);
              sum += b;
            }
          g_assert_cmpuint (sum, ==, mem->stages[s].total_bytes);
        }
      g_assert_cmpuint (mem->nvme_bytes, <, (guint64)1 << 62);
      g_assert_cmpuint (mem->host_total_bytes, <, (guint64)1 << 62);
    }
}

static void
test_validation_errors (void)
{
  g_autoptr (StowModel) m = llama_65b ();
  static const struct
  {
    const char *spec;
    guint dp, tp, pp;
    const char *fragment;
  } bad[] = {
    { "8xA100-80GB", 8, 3, 1,
      "--tp 3 does not divide "
      "num_attention_heads 64" },
    { "8xA100-80GB", 1, 8, 3, "--dp 1 x --tp 8 x --pp 3" },
    { "1x6xA100-80GB", 2, 3, 1,
      "--tp 3 does not divide "
      "num_attention_heads 64" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (StowCluster) c = stow_test_cluster (bad[i].spec);
      StowTraining t;
      StowLayout l;
      stow_training_init (&t);
      stow_layout_init (&l);
      l.dp = bad[i].dp, l.tp = bad[i].tp, l.pp = bad[i].pp;
      g_autoptr (GError) error = NULL;
      g_assert_null (
          stow_memory_estimate (TEST_PLAN (m, c, &t, &l, NULL), &error));
      g_assert_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID);
      g_test_message ("%s", error->message);
      if (bad[i].fragment)
        g_assert_nonnull (strstr (error->message, bad[i].fragment));
    }

  /* full:K counts in a model chunk under interleaving (Megatron's
   * recompute_num_layers with virtual stages): 80 layers over pp 4 x vpp 5
   * leave 4 per chunk, 20 per stage. */
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-80GB");
  StowTraining t;
  StowLayout l;
  stow_training_init (&t);
  t.global_batch = 16;
  stow_layout_init (&l);
  l.dp = 2, l.pp = 4, l.vpp = 5, l.schedule = STOW_SCHEDULE_INTERLEAVED;
  l.micro_batch = 1, l.grad_accum = 8;
  l.recompute = STOW_RECOMPUTE_FULL, l.recompute_layers = 4;
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMemory) ok
      = stow_memory_estimate (TEST_PLAN (m, c, &t, &l, NULL), &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_layout_recomputed_layers (&l, 80, 20), ==, 20);
  l.recompute_layers = 1;
  g_assert_cmpuint (stow_layout_recomputed_layers (&l, 80, 20), ==, 5);
  l.recompute_layers = 5;
  g_assert_null (stow_memory_estimate (TEST_PLAN (m, c, &t, &l, NULL), &error));
  g_assert_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "--recompute full:5 is more than "
                                            "the 4 layers of a model chunk"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/memory/zero-paper/table1", test_zero_paper_table1);
  g_test_add_func ("/memory/deepspeed/t5-3b", test_deepspeed_t5_3b);
  g_test_add_func ("/memory/deepspeed/llama-65b", test_deepspeed_llama_65b);
  g_test_add_func ("/memory/deepspeed/uncovered", test_deepspeed_uncovered);
  g_test_add_func ("/memory/megatron/llama-65b", test_megatron_llama_65b);
  g_test_add_func ("/memory/korthikanti/table2", test_korthikanti_table2);
  g_test_add_func ("/memory/korthikanti/figure1", test_korthikanti_figure1);
  g_test_add_func ("/memory/calibration/bert-large",
                   test_calibration_bert_large);
  g_test_add_func ("/memory/calibration/torchao-llama-2-7b",
                   test_calibration_torchao_llama2);
  g_test_add_func ("/memory/calibration/peft-t0-3b", test_calibration_peft_t0);
  g_test_add_func ("/memory/calibration/peft-mt0-bloomz",
                   test_calibration_peft_mt0_bloomz);
  g_test_add_func ("/memory/gelu-new", test_gelu_new);
  g_test_add_func ("/memory/deepspeed-buffers", test_deepspeed_buffers);
  g_test_add_func ("/memory/lora-frozen-inputs", test_lora_frozen_inputs);
  g_test_add_func ("/memory/calibration/torchtune-llama-3.2-3b",
                   test_calibration_torchtune);
  g_test_add_func ("/memory/calibration/bigcode-gpt",
                   test_calibration_bigcode_gpt);
  g_test_add_func ("/memory/calibration/seed-t5-3b", test_seed_t5_3b_labels);
  g_test_add_func ("/memory/lora-adapters", test_lora_adapters);
  g_test_add_func ("/memory/moe/expert-data-parallel",
                   test_moe_expert_data_parallel);
  g_test_add_func ("/memory/moe/deepseek-v3", test_moe_deepseek_v3_bound);
  g_test_add_func ("/memory/moe/expert-tensor-parallel",
                   test_moe_expert_tensor_parallel);
  g_test_add_func ("/memory/mcore/cross-entropy", test_mcore_cross_entropy);
  g_test_add_func ("/memory/mpt-fused-loss", test_mpt_fused_loss);
  g_test_add_func ("/memory/selective-op", test_selective_op);
  g_test_add_func ("/memory/calibration/torchtitan-llama-3.1-8b",
                   test_calibration_torchtitan);
  g_test_add_func ("/memory/mcore/shards-over-dp-cp",
                   test_mcore_shards_over_dp_cp);
  g_test_add_func ("/memory/mcore/fp8-transformer-engine",
                   test_mcore_fp8_transformer_engine);
  g_test_add_func ("/memory/nemo/distributed-adam", test_nemo_distributed_adam);
  g_test_add_func ("/memory/nemo/llama-3-8b-fp8", test_nemo_llama3_8b_fp8);
  g_test_add_func ("/memory/fsdp/sharding", test_fsdp_sharding);
  g_test_add_func ("/memory/properties", test_properties);
  g_test_add_func ("/memory/no-overflow", test_no_overflow);
  g_test_add_func ("/memory/validation", test_validation_errors);
  return g_test_run ();
}
