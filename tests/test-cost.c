/* SPDX-License-Identifier: MIT
 *
 * tests/test-cost.c: the time model against published measurements:
 * Korthikanti et al. 2022 Table 5 (seconds per iteration, full recompute
 * and sequence parallelism + selective recompute, A100-80GB Selene) and
 * Narayanan et al. 2021 Table 1 (TFLOP/s per GPU with recomputation).
 * Each table's rows within its bound (below); a summary prints each
 * table's worst as the claim README.md and docs/time-model.md quote.
 * Plus properties (more GPUs never slower per token on a comm-free
 * layout, bubble formula, exposed <= total).
 */
#include <math.h>
#include <string.h>

#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/search.h"
#include "tests/testutil-claim.h"
#include "tests/testutil-planner.h"

/* Each table's worst |error| when issue 42 set these (docs/time-model.md,
 * "Calibration and checks"), times 1.25, rounded up to a whole percent.
 * Korthikanti Table 5 is in-sample: gemm_eff_max, gemm_half_dim and
 * hbm_eff were fitted on its s/iter rows.  Narayanan Table 1 was not used
 * to fit anything. */
#define KORTHIKANTI_STEP_BOUND 0.11 /* s/iter: 8.7% (22B, SP + selective) */
#define KORTHIKANTI_MFU_BOUND  0.13 /* MFU and HFU: 10.0% (22B MFU) */
#define NARAYANAN_BOUND        0.14 /* TFLOP/s: 10.7% (1.7B) */

static StowCluster *
cluster (guint gpus)
{
  g_autofree char *spec = g_strdup_printf ("%uxA100-80GB", gpus);
  return stow_test_cluster (spec);
}

/* Megatron-LM as it ran in 2021-22: its TP all-reduces and pipeline
 * sends were not overlapped with compute (Megatron-core's userbuffers and
 * overlap_p2p_comm came later). */
static void
megatron_2022 (StowCostOptions *o)
{
  stow_cost_options_init (o);
  o->tp_comm_overlap = 0;
  o->p2p_overlap = 0;
}

/* Megatron-LM as run in the papers: fp16, no flash attention (2022 fused
 * softmax kernels), sequence 2048. */
static void
training (StowTraining *t, guint64 global_batch)
{
  stow_training_init (t);
  t->seq_len = 2048;
  t->global_batch = global_batch;
  t->precision = STOW_PRECISION_FP16;
  t->flash_attention = FALSE;
}

static void
layout (StowLayout *l, guint gpus, guint tp, guint pp, guint vpp, guint64 gb,
        guint64 mbs, StowRecompute rc, gboolean sp)
{
  stow_layout_init (l);
  l->tp = tp, l->pp = pp, l->vpp = vpp, l->cp = 1;
  l->dp = gpus / (tp * pp);
  l->sp = sp;
  l->micro_batch = mbs;
  l->grad_accum = gb / (mbs * l->dp);
  l->recompute = rc;
  l->schedule = vpp > 1 ? STOW_SCHEDULE_INTERLEAVED : STOW_SCHEDULE_1F1B;
  l->engine = STOW_ENGINE_MEGATRON;
}

typedef struct
{
  const char *model;
  guint gpus, tp, pp, vpp;
  guint64 gb, mbs;
  double full_s, sel_s; /* Table 5, s/iter */
  double mfu, hfu;      /* SP + selective (Megatron README) */
} KorthikantiRow;

static const KorthikantiRow korthikanti[] = {
  { "korthikanti-22b", 8, 8, 1, 1, 4, 4, 1.42, 1.10, 0.415, 0.437 },
  { "korthikanti-175b", 64, 8, 8, 3, 64, 1, 18.13, 13.75, 0.514, 0.528 },
  { "mt-nlg-530b", 280, 8, 35, 3, 280, 1, 49.05, 37.83, 0.560, 0.570 },
  { "korthikanti-1t", 512, 8, 64, 1, 512, 1, 94.42, 71.49, 0.563, 0.570 },
};

static double
rel_err (const char *what, double predicted, double published)
{
  double err = (predicted - published) / published;
  g_test_message ("%s: predicted %.4g, published %.4g (%+.1f%%)", what,
                  predicted, published, 100 * err);
  return err;
}

/* The row's errors: full recompute s/iter, SP + selective s/iter, its MFU
 * and its HFU. */
static void
korthikanti_errors (const KorthikantiRow *r, double err[4])
{
  g_autoptr (StowModel) m = stow_test_model (r->model);
  g_autoptr (StowCluster) c = cluster (r->gpus);
  StowTraining t;
  StowLayout l;
  StowCost cost;
  StowCostOptions o;
  g_autoptr (GError) error = NULL;
  training (&t, r->gb);
  megatron_2022 (&o);

  layout (&l, r->gpus, r->tp, r->pp, r->vpp, r->gb, r->mbs, STOW_RECOMPUTE_FULL,
          FALSE);
  g_assert_true (stow_cost_estimate_checked (TEST_PLAN (m, c, &t, &l, NULL), &o,
                                             &cost, &error));
  g_assert_no_error (error);
  g_autofree char *w1 = g_strdup_printf ("%s full recompute s/iter", r->model);
  err[0] = rel_err (w1, cost.step_time_s, r->full_s);
  double full_hfu = cost.hfu;

  layout (&l, r->gpus, r->tp, r->pp, r->vpp, r->gb, r->mbs,
          STOW_RECOMPUTE_SELECTIVE, TRUE);
  g_assert_true (stow_cost_estimate_checked (TEST_PLAN (m, c, &t, &l, NULL), &o,
                                             &cost, &error));
  g_autofree char *w2 = g_strdup_printf ("%s SP+selective s/iter", r->model);
  err[1] = rel_err (w2, cost.step_time_s, r->sel_s);
  g_autofree char *w3 = g_strdup_printf ("%s SP+selective MFU", r->model);
  err[2] = rel_err (w3, cost.mfu, r->mfu);
  g_autofree char *w4 = g_strdup_printf ("%s SP+selective HFU", r->model);
  err[3] = rel_err (w4, cost.hfu, r->hfu);
  /* Full recompute does more hardware work per model FLOP. */
  g_assert_cmpfloat (cost.hfu - cost.mfu, <, full_hfu);
}

static void
test_korthikanti (gconstpointer data)
{
  const KorthikantiRow *r = data;
  double err[4];
  korthikanti_errors (r, err);
  static const char *const what[] = { "full", "selective", "mfu", "hfu" };
  for (int k = 0; k < 4; k++)
    {
      g_autofree char *claim
          = g_strdup_printf ("cost.korthikanti.%s.%s-pct", r->model, what[k]);
      stow_test_claim (claim, 100 * err[k]);
      g_assert_cmpfloat (fabs (err[k]), <=,
                         k < 2 ? KORTHIKANTI_STEP_BOUND
                               : KORTHIKANTI_MFU_BOUND);
    }
}

typedef struct
{
  const char *model;
  guint gpus, tp, pp;
  guint64 gb;
  double tflops; /* per GPU, counting recomputation */
} NarayananRow;

static const NarayananRow narayanan[] = {
  { "megatron-1.7b", 32, 1, 1, 512, 137 },
  { "megatron-7.5b", 128, 4, 1, 512, 142 },
  { "megatron-39.1b", 512, 8, 2, 1536, 138 },
  { "megatron-145.6b", 1536, 8, 8, 2304, 148 },
  { "mt-nlg-530b", 2520, 8, 35, 2520, 163 },
};

/* Table 1 does not give the micro-batch size: the row's layout is pinned
 * (tp, pp, dp, full recompute, 1F1B) and the search picks the micro-batch,
 * as the authors picked the largest that ran well. */
static double
narayanan_error (const NarayananRow *r)
{
  g_autoptr (StowModel) m = stow_test_model (r->model);
  g_autoptr (StowCluster) c = cluster (r->gpus);
  StowTraining t;
  StowLayout l;
  StowMemOptions mo;
  training (&t, r->gb);
  layout (&l, r->gpus, r->tp, r->pp, 1, r->gb, 1, STOW_RECOMPUTE_FULL, FALSE);
  stow_mem_options_init (&mo);
  StowPins pins = STOW_PIN_TP | STOW_PIN_PP | STOW_PIN_DP | STOW_PIN_CP
                  | STOW_PIN_VPP | STOW_PIN_SP | STOW_PIN_ZERO
                  | STOW_PIN_OFFLOAD_OPTIMIZER | STOW_PIN_OFFLOAD_PARAMS
                  | STOW_PIN_OFFLOAD_ACTIVATIONS | STOW_PIN_RECOMPUTE
                  | STOW_PIN_SCHEDULE | STOW_PIN_EP;
  StowCostOptions o;
  StowSearchOptions so;
  megatron_2022 (&o);
  stow_search_options_init (&so);
  so.max_keep = 1;
  so.cost = &o;
  g_autoptr (StowSearch) s
      = stow_search_run (TEST_PLAN (m, c, &t, &l, &mo), pins, &so);
  g_assert_cmpuint (s->fits->len, ==, 1);
  const StowCandidate *best = &g_array_index (s->fits, StowCandidate, 0);
  g_autofree char *w = g_strdup_printf ("%s (micro-batch %" G_GUINT64_FORMAT
                                        ") TFLOP/s per GPU",
                                        r->model, best->layout.micro_batch);
  return rel_err (w, best->cost.hw_tflops_per_gpu, r->tflops);
}

static void
test_narayanan (gconstpointer data)
{
  const NarayananRow *r = data;
  double err = narayanan_error (r);
  g_autofree char *claim = g_strdup_printf ("cost.narayanan.%s-pct", r->model);
  stow_test_claim (claim, 100 * err);
  g_assert_cmpfloat (fabs (err), <=, NARAYANAN_BOUND);
}

/* Each table's worst |error| (every row again: this case may run alone),
 * the figures README.md quotes. */
static void
test_tables_summary (void)
{
  double step = 0, ratio = 0, tflops = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (korthikanti); i++)
    {
      double err[4];
      korthikanti_errors (&korthikanti[i], err);
      step = MAX (step, MAX (fabs (err[0]), fabs (err[1])));
      ratio = MAX (ratio, MAX (fabs (err[2]), fabs (err[3])));
    }
  for (gsize i = 0; i < G_N_ELEMENTS (narayanan); i++)
    tflops = MAX (tflops, fabs (narayanan_error (&narayanan[i])));
  stow_test_claim ("cost.korthikanti.step.worst-pct", 100 * step);
  stow_test_claim ("cost.korthikanti.mfu-hfu.worst-pct", 100 * ratio);
  stow_test_claim ("cost.narayanan.worst-pct", 100 * tflops);
  g_assert_cmpfloat (step, <=, KORTHIKANTI_STEP_BOUND);
  g_assert_cmpfloat (ratio, <=, KORTHIKANTI_MFU_BOUND);
  g_assert_cmpfloat (tflops, <=, NARAYANAN_BOUND);
  /* No bound wider than twice what it holds. */
  g_assert_cmpfloat (KORTHIKANTI_STEP_BOUND, <=, 2 * step);
  g_assert_cmpfloat (KORTHIKANTI_MFU_BOUND, <=, 2 * ratio);
  g_assert_cmpfloat (NARAYANAN_BOUND, <=, 2 * tflops);
}

/* Model FLOPs: 72 B s L h^2 (1 + s/6h + V/12hL) for GPT (Narayanan et al.
 * eq. 3 without the recomputation factor 4/3). */
static void
test_flops_formula (void)
{
  g_autoptr (StowModel) m = stow_test_model ("korthikanti-175b");
  g_autoptr (StowCluster) c = cluster (64);
  StowTraining t;
  StowLayout l;
  StowCost cost;
  training (&t, 64);
  layout (&l, 64, 8, 8, 3, 64, 1, STOW_RECOMPUTE_SELECTIVE, TRUE);
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &cost);
  double B = 64, s = 2048, L = 96, h = 12288, V = 51200;
  double expect = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  g_assert_cmpfloat (fabs (cost.model_flops_per_step / expect - 1), <, 1e-3);
  /* Published MFU for this row: 51.4% (Megatron README); the table's
   * bound, as for /cost/korthikanti-table5. */
  g_assert_cmpfloat (fabs (cost.mfu - 0.514), <, KORTHIKANTI_MFU_BOUND * 0.514);
}

/* Exposed never exceeds total; the step is the sum of exposed terms;
 * the bubble follows (p - 1) / (v m). */
static void
test_properties (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = cluster (64);
  StowTraining t;
  stow_training_init (&t);
  t.global_batch = 256;
  StowLayout l;
  layout (&l, 64, 8, 4, 1, 256, 1, STOW_RECOMPUTE_SELECTIVE, TRUE);
  l.engine = STOW_ENGINE_STOWAGE;
  StowCost one, two;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &one);
  double sum = 0;
  for (int k = 0; k < STOW_N_COSTS; k++)
    {
      g_assert_cmpfloat (one.exposed_s[k], <=, one.total_s[k] + 1e-12);
      g_assert_cmpfloat (one.exposed_s[k], >=, 0);
      sum += one.exposed_s[k];
    }
  g_assert_cmpfloat (fabs (sum - one.step_time_s), <, 1e-9);
  /* uniform stages (80 layers / 4): bubble = (p - 1) / m of the steady
   * state, within the first/last stage's extra work */
  double steady = 0;
  for (int k = 0; k < STOW_N_COSTS; k++)
    if (k != STOW_COST_PP_BUBBLE && k != STOW_COST_PP_P2P && k != STOW_COST_DP
        && k != STOW_COST_OPTIMIZER)
      steady += one.exposed_s[k];
  double ratio = one.exposed_s[STOW_COST_PP_BUBBLE] / steady;
  g_assert_cmpfloat (ratio, <=, 3.0 / (double)l.grad_accum + 1e-9);
  g_assert_cmpfloat (ratio, >, 0.8 * 3.0 / (double)l.grad_accum);
  /* interleaving with v = 2 halves it */
  l.vpp = 2;
  l.schedule = STOW_SCHEDULE_INTERLEAVED;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &two);
  g_assert_cmpfloat (fabs (two.exposed_s[STOW_COST_PP_BUBBLE] * 2
                           - one.exposed_s[STOW_COST_PP_BUBBLE]),
                     <, 1e-9 + 1e-6 * one.exposed_s[STOW_COST_PP_BUBBLE]);
  /* ZeRO-3 moves 1.5x the data of ZeRO-1 per step (one micro-batch) */
  layout (&l, 64, 1, 1, 1, 64, 1, STOW_RECOMPUTE_FULL, FALSE);
  l.engine = STOW_ENGINE_STOWAGE;
  l.zero = 1;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &one);
  l.zero = 3;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &two);
  g_assert_cmpfloat (
      fabs (two.total_s[STOW_COST_DP] / one.total_s[STOW_COST_DP] - 1.5), <,
      0.01);
  /* CPU offload makes the step longer on the same layout where the CPU
   * steps after the backward (DeepSpeed); our engine updates each layer
   * as the last backward brings its gradients down, so less of the CPU
   * step shows, but not the part that outlasts that backward. */
  l.engine = STOW_ENGINE_DEEPSPEED;
  StowCost ds, ds_off;
  l.offload_optimizer = STOW_OFFLOAD_NONE;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &ds);
  l.offload_optimizer = STOW_OFFLOAD_CPU;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &ds_off);
  g_assert_cmpfloat (ds_off.step_time_s, >, ds.step_time_s);
  g_assert_cmpfloat (ds_off.exposed_s[STOW_COST_CPU_OPTIMIZER], ==,
                     ds_off.total_s[STOW_COST_CPU_OPTIMIZER]);
  l.engine = STOW_ENGINE_STOWAGE;
  StowCost off;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &off);
  g_assert_cmpfloat (off.total_s[STOW_COST_CPU_OPTIMIZER], >, 0);
  g_assert_cmpfloat (off.exposed_s[STOW_COST_CPU_OPTIMIZER], <,
                     off.total_s[STOW_COST_CPU_OPTIMIZER]);
  g_assert_cmpfloat (off.step_time_s, <, ds_off.step_time_s);
  /* the delayed update hides the CPU step behind compute */
  StowCostOptions o;
  stow_cost_options_init (&o);
  o.delayed_update = TRUE;
  StowCost del;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), &o, &del);
  g_assert_cmpfloat (del.step_time_s, <, ds_off.step_time_s);
  g_assert_cmpfloat (del.step_time_s, <=, off.step_time_s + 1e-12);
}

/* A small GEMM after TP splitting runs below peak: the same layer at tp 8
 * costs more than 1/8 of tp 1 in compute. */
static void
test_gemm_efficiency (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) c = cluster (8);
  StowTraining t;
  stow_training_init (&t);
  t.global_batch = 8;
  StowLayout l;
  StowCost one, eight;
  layout (&l, 8, 1, 1, 1, 8, 1, STOW_RECOMPUTE_NONE, FALSE);
  l.engine = STOW_ENGINE_STOWAGE;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &one);
  layout (&l, 8, 8, 1, 1, 8, 1, STOW_RECOMPUTE_NONE, TRUE);
  l.engine = STOW_ENGINE_STOWAGE;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &eight);
  /* per micro-batch compute: tp 8 has 1/8 of the FLOPs per GPU but 8
   * micro-batches per GPU ... compare per-sequence compute */
  double per_seq_1 = one.exposed_s[STOW_COST_COMPUTE] / 1.0;
  double per_seq_8 = eight.exposed_s[STOW_COST_COMPUTE] / 8.0;
  g_assert_cmpfloat (per_seq_8, >, per_seq_1 / 8.0 * 1.05);
}

/* Expert and context parallelism show up as their own terms; NVMe
 * optimizer offload is slower than CPU offload on the same layout, and
 * parameter streaming adds PCIe time. */
static void
test_terms (void)
{
  g_autoptr (StowModel) mx = stow_test_model ("mixtral-8x7b");
  g_autoptr (StowCluster) c = cluster (32);
  StowTraining t;
  stow_training_init (&t);
  t.global_batch = 64;
  StowLayout l;
  StowCost k, n;
  layout (&l, 32, 1, 1, 1, 64, 1, STOW_RECOMPUTE_FULL, FALSE);
  l.engine = STOW_ENGINE_STOWAGE;
  l.ep = 8;
  stow_cost_estimate (TEST_PLAN (mx, c, &t, &l, NULL), NULL, &k);
  g_assert_cmpfloat (k.exposed_s[STOW_COST_EP], >, 0);
  /* context parallelism over 4 ranks of a dense model */
  StowCost cpc;
  g_autoptr (StowModel) ll = stow_test_model ("llama-7b");
  layout (&l, 32, 1, 1, 1, 64, 1, STOW_RECOMPUTE_FULL, FALSE);
  l.engine = STOW_ENGINE_STOWAGE;
  l.cp = 4;
  l.dp = 8;
  l.grad_accum = 64 / 8;
  stow_cost_estimate (TEST_PLAN (ll, c, &t, &l, NULL), NULL, &cpc);
  g_assert_cmpfloat (cpc.total_s[STOW_COST_CP], >, 0);
  g_assert_cmpfloat (cpc.exposed_s[STOW_COST_CP], <=,
                     cpc.total_s[STOW_COST_CP]);

  layout (&l, 32, 1, 1, 1, 64, 1, STOW_RECOMPUTE_FULL, FALSE);
  l.engine = STOW_ENGINE_STOWAGE;
  l.zero = 3;
  l.offload_optimizer = STOW_OFFLOAD_CPU;
  stow_cost_estimate (TEST_PLAN (ll, c, &t, &l, NULL), NULL, &k);
  l.offload_optimizer = STOW_OFFLOAD_NVME;
  stow_cost_estimate (TEST_PLAN (ll, c, &t, &l, NULL), NULL, &n);
  g_assert_cmpfloat (n.step_time_s, >=, k.step_time_s);
  g_assert_cmpfloat (n.total_s[STOW_COST_NVME], >, 0);
  l.offload_params = STOW_OFFLOAD_CPU;
  StowCost p;
  stow_cost_estimate (TEST_PLAN (ll, c, &t, &l, NULL), NULL, &p);
  g_assert_cmpfloat (p.total_s[STOW_COST_OFFLOAD_PCIE], >,
                     n.total_s[STOW_COST_OFFLOAD_PCIE]);
}

/* An encoder-decoder model's output layer and loss run over the decoder's
 * tokens: with 16 target tokens for 512 input ones the head's GEMM FLOPs
 * fall 32-fold, and its time at least 8-fold (small GEMMs run less
 * efficiently); the embedding still sees the encoder's tokens. */
static void
test_decoder_seq_head (void)
{
  g_autoptr (StowModel) m = stow_test_model ("t5-3b");
  g_autoptr (StowCluster) c = cluster (1);
  StowTraining t;
  StowLayout l;
  stow_training_init (&t);
  stow_layout_init (&l);
  t.seq_len = 512;
  l.micro_batch = 8;
  StowEndsSeconds full, dec;
  stow_cost_ends_seconds (TEST_PLAN (m, c, &t, &l, NULL), &full);
  t.decoder_seq_len = 16;
  stow_cost_ends_seconds (TEST_PLAN (m, c, &t, &l, NULL), &dec);
  g_assert_cmpfloat (dec.head_fwd_s * 8.0, <, full.head_fwd_s);
  g_assert_cmpfloat (dec.head_bwd_s * 8.0, <, full.head_bwd_s);
  g_assert_cmpfloat (dec.embedding_fwd_s, ==, full.embedding_fwd_s);
}

/* Each GPU's own kernel rates: the H100 class gets its published
 * profile, other GPUs the A100-fitted defaults, and turning profiles off
 * gives the defaults everywhere. */
static void
test_gpu_profile (void)
{
  g_autoptr (StowCluster) h100 = stow_test_cluster ("8xH100-SXM");
  g_autoptr (StowCluster) h200 = stow_test_cluster ("8xH200");
  g_autoptr (StowCluster) a100 = cluster (8);
  StowCostOptions o;
  StowGpuEfficiency e;
  stow_cost_options_init (&o);
  stow_cost_gpu_efficiency (&h100->node.gpu, &o, &e);
  g_assert_cmpstr (e.gpu, ==, "H100-SXM");
  /* fp8 GEMMs reach less of their peak than bf16 ones of theirs: the
   * MAMF finder's 70.9% against 80.3%. */
  g_assert_cmpfloat (e.gemm_fp8_eff_max, <, e.gemm_eff_max);
  g_assert_cmpfloat (fabs (e.gemm_fp8_eff_max / e.gemm_eff_max - 70.9 / 80.3),
                     <, 0.01);
  /* FlashAttention-2 on H100: 335 TFLOP/s causal forward at 16k tokens. */
  double fwd16k
      = 989.0 * e.attn_fwd_eff * 16384.0 / (16384.0 + e.attn_half_seq);
  g_assert_cmpfloat (fabs (fwd16k / 335.0 - 1.0), <, 0.02);
  stow_cost_gpu_efficiency (&h200->node.gpu, &o, &e);
  g_assert_cmpstr (e.gpu, ==, "H100-SXM");
  stow_cost_gpu_efficiency (&a100->node.gpu, &o, &e);
  g_assert_cmpstr (e.gpu, ==, "default");
  g_assert_cmpfloat (e.gemm_eff_max, ==, o.gemm_eff_max);
  o.gpu_profiles = FALSE;
  stow_cost_gpu_efficiency (&h100->node.gpu, &o, &e);
  g_assert_cmpstr (e.gpu, ==, "default");
}

/* fp8 speeds up the layers' GEMMs only: the attention core (what
 * selective recomputation repeats) costs what it costs in bf16, the
 * output layer too, and a layer gains less than the fp8/bf16 ceiling
 * ratio (1.77 on H100) because of the casts and the bf16 work. */
static void
test_fp8 (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-2-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout l;
  stow_training_init (&t);
  t.seq_len = 4096;
  layout (&l, 8, 1, 1, 1, 8, 1, STOW_RECOMPUTE_NONE, FALSE);
  StowLayerSeconds bf16, fp8;
  StowEndsSeconds ebf16, efp8;
  t.precision = STOW_PRECISION_BF16;
  stow_cost_layer_seconds (TEST_PLAN (m, c, &t, &l, NULL), FALSE, &bf16);
  stow_cost_ends_seconds (TEST_PLAN (m, c, &t, &l, NULL), &ebf16);
  t.precision = STOW_PRECISION_FP8;
  stow_cost_layer_seconds (TEST_PLAN (m, c, &t, &l, NULL), FALSE, &fp8);
  stow_cost_ends_seconds (TEST_PLAN (m, c, &t, &l, NULL), &efp8);
  g_assert_cmpfloat (fabs (fp8.selective_s - bf16.selective_s), <,
                     1e-12 + 1e-9 * bf16.selective_s);
  g_assert_cmpfloat (fabs (efp8.head_fwd_s - ebf16.head_fwd_s), <,
                     1e-12 + 1e-9 * ebf16.head_fwd_s);
  double speedup
      = (bf16.forward_s + bf16.backward_s) / (fp8.forward_s + fp8.backward_s);
  g_test_message ("llama-2-7b layer at 4k tokens: fp8 %.3fx bf16", speedup);
  g_assert_cmpfloat (speedup, >, 1.2);
  g_assert_cmpfloat (speedup, <, 1.6);
}

/* Megatron-core hides most of its TP traffic under the GEMMs beside it
 * (Transformer Engine userbuffers) and its interleaved pipeline's sends
 * under compute; with the overlaps off (Megatron-LM 2021-22) all of it
 * shows.  Other engines do not overlap TP traffic. */
static void
test_megatron_overlap (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = stow_test_cluster ("64xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowCost on, off;
  StowCostOptions o;
  stow_training_init (&t);
  t.global_batch = 64;
  layout (&l, 64, 8, 4, 2, 64, 1, STOW_RECOMPUTE_NONE, TRUE);
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &on);
  megatron_2022 (&o);
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), &o, &off);
  g_assert_cmpfloat (on.exposed_s[STOW_COST_TP], <,
                     0.5 * on.total_s[STOW_COST_TP]);
  g_assert_cmpfloat (off.exposed_s[STOW_COST_TP], ==,
                     off.total_s[STOW_COST_TP]);
  g_assert_cmpfloat (on.exposed_s[STOW_COST_PP_P2P], <,
                     on.total_s[STOW_COST_PP_P2P]);
  g_assert_cmpfloat (off.exposed_s[STOW_COST_PP_P2P], ==,
                     off.total_s[STOW_COST_PP_P2P]);
  g_assert_cmpfloat (on.step_time_s, <, off.step_time_s);
  /* The overlapped GEMMs run in chunks, a little slower. */
  g_assert_cmpfloat (on.exposed_s[STOW_COST_COMPUTE], >,
                     off.exposed_s[STOW_COST_COMPUTE]);
  l.engine = STOW_ENGINE_STOWAGE;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &on);
  g_assert_cmpfloat (on.exposed_s[STOW_COST_TP], ==, on.total_s[STOW_COST_TP]);
}

/* Interleaved 1F1B with overlapped sends (Megatron-core's default): the
 * first micro-batch's forward visits the v·p model chunks one after the
 * other, each waiting for its predecessor's send, and the last one's
 * backward visits them back, so 2 (v p - 1) hops are on the critical path
 * however the steady state hides the rest (Narayanan et al. 2021 §2.2:
 * interleaving multiplies the communication by v).  llama-65b, 80 layers
 * on pp 4: v 2, 4 and 10 chunks per stage. */
static void
test_interleaved_p2p_fill (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = stow_test_cluster ("64xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowCostOptions o;
  stow_cost_options_init (&o);
  stow_training_init (&t);
  t.global_batch = 64;
  const guint vs[] = { 2, 4, 10 };
  for (gsize i = 0; i < G_N_ELEMENTS (vs); i++)
    {
      guint v = vs[i];
      layout (&l, 64, 8, 4, v, 64, 1, STOW_RECOMPUTE_NONE, TRUE);
      StowCost cost;
      stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &cost);
      /* One send: the micro-batch's activation, split tp ways (SP). */
      double one = stow_cost_p2p_seconds (
          c, NULL, (double)t.seq_len * (double)m->hidden * 2.0 / l.tp,
          (guint64)l.tp * l.cp * l.dp);
      double mb = (double)l.grad_accum, p = (double)l.pp;
      double sends = 2.0 * (mb * v + p - 1.0);
      double fill = 2.0 * (v * p - 1.0);
      g_assert_cmpfloat (fabs (cost.total_s[STOW_COST_PP_P2P] - sends * one), <,
                         1e-9 * sends * one);
      double want = (fill + o.overlap_slowdown * (sends - fill)) * one;
      g_test_message ("v %u: %.0f sends, %.0f on the critical path, %.3g s", v,
                      sends, fill, want);
      g_assert_cmpfloat (fabs (cost.exposed_s[STOW_COST_PP_P2P] - want), <,
                         1e-9 * want);
    }
}

/* A data-parallel collective's latency is NCCL's own cost model's
 * (src/graph/tuning.cc at v2.18.3-1, Ring/Simple: 8.4 us a collective,
 * 3.4 us a step over NVLink, 14.0 us a step across nodes; the ring runs
 * through every rank), and each collective an engine launches pays it:
 * FSDP gathers and reduces per layer (plus the root), Megatron-core per
 * bucket. */
static void
test_nccl_ring_latency (void)
{
  g_autoptr (StowCluster) c = stow_test_cluster ("512xH100-SXM");
  const double us = 1e-6;
  struct
  {
    guint64 n, stride;
    gboolean half;
    double want; /* NCCL's latency, us */
  } rows[] = {
    /* all-gather inside a node: 7 NVLink steps */
    { 8, 1, TRUE, 8.4 + 7 * 3.4 },
    /* over 64 nodes: 511 steps, 63 of them across nodes */
    { 512, 1, TRUE, 8.4 + 448 * 3.4 + 63 * 14.0 },
    /* one GPU a node (tp 8 inside): every step across nodes */
    { 48, 8, TRUE, 8.4 + 47 * 14.0 },
    /* all-reduce over 2 nodes: 30 steps, 2 x 2 across nodes */
    { 16, 1, FALSE, 8.4 + 26 * 3.4 + 4 * 14.0 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      /* one byte: the bandwidth term vanishes */
      double got = stow_cost_dp_collective_seconds (
          c, NULL, 1.0, rows[i].n, rows[i].stride, rows[i].half);
      g_test_message ("%" G_GUINT64_FORMAT " ranks %" G_GUINT64_FORMAT
                      " apart: %.1f us, NCCL's model %.1f",
                      rows[i].n, rows[i].stride, got / us, rows[i].want);
      g_assert_cmpfloat (fabs (got - rows[i].want * us), <, 0.01 * us);
    }

  /* FSDP on 16 GPUs (two nodes), llama-7b's 32 layers: per micro-batch a
   * gather for forward, one for backward and a reduce-scatter, each per
   * layer and the root: 3 x 33 collectives, each paying the latency. */
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) c16 = stow_test_cluster ("16xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowCostOptions o;
  StowCost with, without;
  stow_training_init (&t);
  t.global_batch = 16;
  stow_layout_init (&l);
  l.dp = 16, l.zero = 3, l.engine = STOW_ENGINE_FSDP;
  l.micro_batch = 1, l.grad_accum = 1;
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), NULL, &with);
  stow_cost_options_init (&o);
  o.nccl_ring_base_s = o.nccl_intra_step_s = o.nccl_inter_step_s = 0;
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), &o, &without);
  double lat = stow_cost_dp_collective_seconds (c16, NULL, 1.0, 16, 1, TRUE);
  double added = with.total_s[STOW_COST_DP] - without.total_s[STOW_COST_DP];
  g_test_message ("FSDP latency: %.3f ms, %.0f collectives", added * 1e3,
                  added / lat);
  g_assert_cmpfloat (fabs (added - 3.0 * 33.0 * lat), <, 1e-3 * added);

  /* Megatron-core's distributed optimizer: a reduce-scatter and an
   * all-gather per bucket of max(40M, 1M x dp) parameters (core_r0.8). */
  l.engine = STOW_ENGINE_MEGATRON, l.zero = 1;
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), NULL, &with);
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), &o, &without);
  added = with.total_s[STOW_COST_DP] - without.total_s[STOW_COST_DP];
  double buckets = ceil ((double)m->params / 40e6);
  g_test_message ("Megatron latency: %.3f ms, %.1f collectives, %.0f buckets",
                  added * 1e3, added / lat, buckets);
  g_assert_cmpfloat (fabs (added / lat - 2.0 * buckets), <=, 2.0);

  /* FSDP's SHARD_GRAD_OP reshards after each backward: every micro-batch
   * gathers and reduce-scatters again, so four micro-batches a step move
   * four times one's traffic. */
  l.engine = STOW_ENGINE_FSDP, l.zero = 2;
  StowCost one, four;
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), NULL, &one);
  t.global_batch = 64, l.grad_accum = 4;
  stow_cost_estimate (TEST_PLAN (m, c16, &t, &l, NULL), NULL, &four);
  g_assert_cmpfloat (
      fabs (four.total_s[STOW_COST_DP] - 4.0 * one.total_s[STOW_COST_DP]), <,
      1e-9 * four.total_s[STOW_COST_DP]);
}

/* Properties of a data-parallel collective's time over random groups and
 * sizes: it grows with the bytes and with the ranks, an all-reduce costs
 * at least its reduce-scatter, and nothing is negative or not finite. */
static void
test_collective_properties (void)
{
  const char *clusters[] = { "1024xH100-SXM", "64xA100-80GB", "16xL40S" };
  for (gsize ci = 0; ci < G_N_ELEMENTS (clusters); ci++)
    {
      g_autoptr (StowCluster) c = stow_test_cluster (clusters[ci]);
      guint64 world = (guint64)c->n_nodes * c->node.gpus_per_node;
      for (int it = 0; it < 2000; it++)
        {
          guint64 stride = 1u << g_test_rand_int_range (0, 4);
          guint64 n
              = (guint64)g_test_rand_int_range (1, (gint)(world / stride) + 1);
          double bytes = exp (g_test_rand_double_range (0, 30));
          gboolean half = g_test_rand_bit ();
          double t = stow_cost_dp_collective_seconds (c, NULL, bytes, n, stride,
                                                      half);
          g_assert_true (isfinite (t) && t >= 0);
          if (n == 1)
            g_assert_cmpfloat (t, ==, 0);
          double more = stow_cost_dp_collective_seconds (c, NULL, 2 * bytes, n,
                                                         stride, half);
          g_assert_cmpfloat (more, >=, t);
          if ((n + 1) * stride <= world)
            g_assert_cmpfloat (stow_cost_dp_collective_seconds (
                                   c, NULL, bytes, n + 1, stride, half),
                               >=, t);
          if (half)
            g_assert_cmpfloat (stow_cost_dp_collective_seconds (
                                   c, NULL, bytes, n, stride, FALSE),
                               >=, t);
        }
    }
}

/* The pipelined NVMe optimizer step's bound (core/drives.h, issue 26): one
 * drive whose reads and writes share a queue is busy for read + write;
 * striped over several, the busiest drive's read + write; Adam overlaps. */
static void
test_nvme_bound_rule (void)
{
  StowDriveSeconds one[] = { { 2.0, 3.0 } };
  guint b = 7;
  g_assert_cmpfloat (stow_drives_io_s (one, 1, &b), ==, 5.0);
  g_assert_cmpuint (b, ==, 0);
  g_assert_cmpfloat (stow_drives_step_bound_s (one, 1, 4.0, NULL), ==, 5.0);
  g_assert_cmpfloat (stow_drives_step_bound_s (one, 1, 6.0, NULL), ==, 6.0);
  /* Not max (read, write, Adam) = 4: the sum bounds a shared queue. */
  g_assert_cmpfloat (stow_drives_step_bound_s (one, 1, 1.0, NULL), ==, 5.0);
  StowDriveSeconds three[] = { { 1.0, 1.0 }, { 2.0, 1.5 }, { 0.5, 3.0 } };
  g_assert_cmpfloat (stow_drives_io_s (three, 3, &b), ==, 3.5);
  g_assert_cmpuint (b, ==, 1);
  g_assert_cmpfloat (stow_drives_step_bound_s (three, 3, 2.0, NULL), ==, 3.5);
  g_assert_cmpfloat (stow_drives_step_bound_s (three, 3, 9.0, NULL), ==, 9.0);
  g_assert_cmpfloat (stow_drives_step_bound_s (NULL, 0, 1.5, &b), ==, 1.5);

  /* The time model: drives of 2 GB/s read, 1 GB/s write, each taking an
   * even share of the state. */
  StowNvme d[2]
      = { { NULL, 1ull << 40, 2e9, 1e9 }, { NULL, 1ull << 40, 2e9, 1e9 } };
  StowNode node = { 0 };
  node.nvme = d, node.n_nvme = 1;
  StowDriveSeconds out[2];
  g_assert_cmpuint (stow_cost_nvme_drive_seconds (&node, 4e9, 4e9, out), ==, 1);
  g_assert_cmpfloat_with_epsilon (out[0].read_s, 2.0, 1e-12);
  g_assert_cmpfloat_with_epsilon (out[0].write_s, 4.0, 1e-12);
  node.n_nvme = 2;
  d[1].write_bw = 0.5e9;
  g_assert_cmpuint (stow_cost_nvme_drive_seconds (&node, 4e9, 4e9, out), ==, 2);
  g_assert_cmpfloat_with_epsilon (stow_drives_io_s (out, 2, &b), 1.0 + 4.0,
                                  1e-12);
  g_assert_cmpuint (b, ==, 1);
  /* No drive listed: one at the 100 MB/s floor. */
  node.n_nvme = 0;
  g_assert_cmpuint (stow_cost_nvme_drive_seconds (&node, 1e8, 2e8, out), ==, 1);
  g_assert_cmpfloat_with_epsilon (out[0].read_s + out[0].write_s, 3.0, 1e-12);
}

/* Llama 3 405B as its paper laid it out (Llama Team, "The Llama 3 Herd of
 * Models", 2024, §3.3.2): 126 layers on tp 8 x pp 16 with the interleaved
 * schedule, one layer fewer on the first and last stages, whose first and
 * last model chunks hold only the embedding and only the output layer
 * and loss.  Megatron-core runs it with --account-for-embedding-in-
 * pipeline-split and --account-for-loss-in-pipeline-split (--pp-split-
 * ends here): 126 + 2 = 128 slots, 8 per stage, v 8 chunks of one.  Before,
 * pp x vpp had to divide 126, so a 16-stage pipeline could not interleave
 * and paid its whole bubble.  One replica (dp 1, 128 GPUs), 32
 * micro-batches of one 8k sequence (the paper's batch per data-parallel
 * group on 8,192 GPUs), full recomputation so both schedules fit alike. */
static void
test_uneven_interleaved (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-3.1-405b");
  g_autoptr (StowCluster) c = stow_test_cluster ("128xH100-SXM");
  g_assert_cmpuint (m->n_layers, ==, 126);
  StowTraining t;
  StowLayout l;
  StowMemOptions mo;
  stow_test_defaults (&t, &l, &mo);
  t.seq_len = 8192;
  t.global_batch = 32;
  l.engine = STOW_ENGINE_MEGATRON;
  l.tp = 8, l.sp = TRUE, l.pp = 16, l.dp = 1, l.zero = 1;
  l.micro_batch = 1, l.grad_accum = 32;
  l.recompute = STOW_RECOMPUTE_FULL;

  /* 126 layers: 7 on the first and last stages, 8 on the 14 between. */
  guint64 counts[16];
  stow_layout_stage_layers (&l, m->n_layers, counts);
  guint64 plain[16];
  memcpy (plain, counts, sizeof plain);
  l.pp_split_ends = TRUE;
  stow_layout_stage_layers (&l, m->n_layers, counts);
  for (guint s = 0; s < 16; s++)
    {
      g_assert_cmpuint (counts[s], ==, s == 0 || s == 15 ? 7 : 8);
      g_assert_cmpuint (plain[s], ==, counts[s]);
    }

  /* vpp 8 needs the ends in the split; the refusal says so. */
  g_autoptr (GError) error = NULL;
  l.pp_split_ends = FALSE;
  l.vpp = 8, l.schedule = STOW_SCHEDULE_INTERLEAVED;
  g_assert_false (stow_layout_validate (&l, &t, m, c, &error));
  g_assert_nonnull (strstr (error->message, "--pp-split-ends"));
  g_clear_error (&error);
  l.pp_split_ends = TRUE;
  g_assert_true (stow_layout_validate (&l, &t, m, c, &error));
  g_assert_no_error (error);

  /* The stages' work is the same either way, so the bubble is the 1F1B
   * one over v = 8 (Narayanan et al. 2021: (p - 1) / (v m)). */
  StowCost one, eight;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l, NULL), NULL, &eight);
  StowLayout l1 = l;
  l1.vpp = 1, l1.schedule = STOW_SCHEDULE_1F1B;
  stow_cost_estimate (TEST_PLAN (m, c, &t, &l1, NULL), NULL, &one);
  g_assert_cmpfloat (one.exposed_s[STOW_COST_PP_BUBBLE], >, 0);
  g_assert_cmpfloat_with_epsilon (eight.exposed_s[STOW_COST_PP_BUBBLE] * 8,
                                  one.exposed_s[STOW_COST_PP_BUBBLE],
                                  1e-9 * one.exposed_s[STOW_COST_PP_BUBBLE]);
  g_assert_cmpfloat (eight.step_time_s, <, one.step_time_s);

  /* Memory: a middle stage (8 layers) is the peak, not the first. */
  g_autoptr (StowMemory) mem
      = stow_memory_estimate (TEST_PLAN (m, c, &t, &l, &mo), &error);
  g_assert_no_error (error);
  guint peak = mem->peak_stage;
  g_assert_cmpuint (mem->n_stages, ==, 16);
  g_assert_cmpuint (peak, >, 0);
  g_assert_cmpuint (peak, <, 15);
  g_assert_cmpuint (mem->stages[peak].layers, ==, 8);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  for (gsize i = 0; i < G_N_ELEMENTS (korthikanti); i++)
    {
      g_autofree char *p = g_strdup_printf ("/cost/korthikanti-table5/%s",
                                            korthikanti[i].model);
      g_test_add_data_func (p, &korthikanti[i], test_korthikanti);
    }
  for (gsize i = 0; i < G_N_ELEMENTS (narayanan); i++)
    {
      g_autofree char *p
          = g_strdup_printf ("/cost/narayanan-table1/%s", narayanan[i].model);
      g_test_add_data_func (p, &narayanan[i], test_narayanan);
    }
  /* A sub-suite registered after the two tables runs after them. */
  g_test_add_func ("/cost/summary/tables", test_tables_summary);
  g_test_add_func ("/cost/nvme-bound-rule", test_nvme_bound_rule);
  g_test_add_func ("/cost/flops-formula", test_flops_formula);
  g_test_add_func ("/cost/properties", test_properties);
  g_test_add_func ("/cost/gemm-efficiency", test_gemm_efficiency);
  g_test_add_func ("/cost/terms", test_terms);
  g_test_add_func ("/cost/decoder-seq-head", test_decoder_seq_head);
  g_test_add_func ("/cost/gpu-profile", test_gpu_profile);
  g_test_add_func ("/cost/fp8", test_fp8);
  g_test_add_func ("/cost/megatron-overlap", test_megatron_overlap);
  g_test_add_func ("/cost/interleaved-p2p-fill", test_interleaved_p2p_fill);
  g_test_add_func ("/cost/uneven-interleaved", test_uneven_interleaved);
  g_test_add_func ("/cost/nccl-ring-latency", test_nccl_ring_latency);
  g_test_add_func ("/cost/collective-properties", test_collective_properties);
  return g_test_run ();
}
