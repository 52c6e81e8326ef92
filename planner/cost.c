/* SPDX-License-Identifier: MIT
 *
 * planner/cost.c: the time model.  One micro-batch of each pipeline stage
 * is priced layer by layer (GEMMs at a shape-dependent efficiency,
 * attention, memory-bound kernels, tensor/context/expert communication),
 * the pipeline turns those into a step with its bubble, and the once-per-
 * step terms (data-parallel reduction, ZeRO gathers, the optimizer, offload
 * traffic) are added with the part that overlaps compute hidden.  FLOP
 * counts follow Narayanan et al. 2021 (eq. 3) and Korthikanti et al. 2022
 * (Appendix), so MFU means what those papers mean.  Constants and their
 * sources: docs/time-model.md.
 */
#include "planner/cost.h"

#include <math.h>
#include <string.h>

#include "planner/cost-private.h"
#include "planner/memory-private.h"
#include "planner/plan.h"

const char *
stow_cost_kind_name (StowCostKind kind)
{
  static const char *const names[] = {
    "compute",       "recompute", "tp", "cp",        "ep",
    "pp_bubble",     "pp_p2p",    "dp", "optimizer", "offload_pcie",
    "cpu_optimizer", "nvme",
  };
  G_STATIC_ASSERT (G_N_ELEMENTS (names) == STOW_N_COSTS);
  g_return_val_if_fail (kind < STOW_N_COSTS, "?");
  return names[kind];
}

void
stow_cost_options_init (StowCostOptions *o)
{
  memset (o, 0, sizeof *o);
  /* cuBLAS bf16 GEMMs of 8k-class shapes reach about 80% of the A100's
   * dense peak (250-270 of 312 TFLOP/s); a dimension of 256 costs half
   * of its share.  Fitted together with hbm_eff and kernel_overhead_s on
   * the Korthikanti et al. 2022 Table 5 rows (docs/time-model.md). */
  o->gemm_eff_max = 0.80;
  o->gemm_half_dim = 96;
  /* Without a measurement of the GPU's own, fp8 GEMMs at the bf16 ceiling
   * (of the fp8 peak). */
  o->gemm_fp8_eff_max = 0.80;
  /* FlashAttention-2 forward+backward on A100: 50-70% of peak (its paper).
   * As one number, 0.55 of the model-counted work (backward twice the
   * forward); in the papers' counting, where the backward recomputes the
   * scores and does 2.5x the forward's FLOPs, that is a forward at 0.55
   * and a backward at 0.55 x 2.5 / 2.  No sequence curve is sourced for
   * the A100: flat. */
  o->attn_fwd_eff = 0.55;
  o->attn_bwd_eff = 0.55 * 2.5 / 2.0;
  o->attn_half_seq = 0;
  o->gpu_profiles = TRUE;
  /* Elementwise/normalisation kernels: ~70% of HBM bandwidth. */
  o->hbm_eff = 0.70;
  /* nccl-tests: ~230 GB/s bus bandwidth on 300 GB/s NVLink3 (0.77),
   * ~0.85 of the NIC line rate across nodes. */
  o->nvlink_eff = 0.77;
  o->net_eff = 0.85;
  o->nvlink_latency_s = 5e-6;
  /* NCCL v2.18.3-1, src/graph/tuning.cc (the cost model NCCL chooses its
   * algorithm and protocol by): the Ring/Simple protocol (messages of
   * megabytes) has a base latency of 8.4 us and per step 3.4 us over
   * NVLink, 5.7 us over PCIe and 14.0 us across the network (hwLat; the
   * InfiniBand plugin adds none, net_ib.cc).  Inside a node a multi-node
   * ring's step costs at least 3x the network post overhead, 1 us on Intel
   * hosts: 3.0 us, below the NVLink step. */
  o->nccl_ring_base_s = 8.4e-6;
  o->nccl_intra_step_s = 3.4e-6;
  o->nccl_pci_step_s = 5.7e-6;
  o->nccl_inter_step_s = 14.0e-6;
  o->kernel_overhead_s = 20e-6;
  /* Overlapped NCCL kernels occupy SMs (8-32 channels of the A100's 108
   * SMs) and HBM bandwidth: hidden communication still slows compute by
   * about a tenth of its duration. */
  o->overlap_slowdown = 0.10;
  /* Streaming a layer's parameters from the host or NVMe: the fetch is
   * coordinated per layer on the critical path (ZeRO-Infinity's parameter
   * coordinator): ~50 us from host memory, ~150 us from NVMe. */
  o->offload_fetch_s = 50e-6;
  o->nvme_fetch_s = 150e-6;
  /* ZeRO-Offload's CPU Adam streams fp32 master, momentum and variance in
   * and out (24 B) and reads a 4 B gradient: 28 B per parameter. */
  o->cpu_adam_bytes_per_param = 28.0;
  o->delayed_update = FALSE;
  o->tp_comm_overlap = -1;
  o->p2p_overlap = -1;
}

/* ---- each GPU's own measurements ------------------------------------ */

/* GPUs whose kernels have published measurements of their own
 * (docs/time-model.md, "Constants per GPU").  The A100 is the defaults.
 *
 * Hopper (GH100 at SXM power; MAMF: "H200 is the same").  The bf16 GEMM
 * ceiling, 0.64, is fitted on the nine GEMM-bound llm-foundry H100 runs
 * (MPT 13B/30B/70B, 128-512 GPUs, sequence 2048, activation
 * checkpointing; tests/data/published-runs/h100-heldout.json, group
 * "calibration"), as the A100's 0.80 was on Korthikanti Table 5: the
 * two-decimal value whose mean signed error over the nine is nearest
 * zero, with MPT modelled as llm-foundry builds it (learned positions, no
 * rotary embeddings, its fused cross-entropy; 0.66 when they were rotary
 * gpt_neox shapes with an fp32 loss).  For
 * scale: the Maximum Achievable Matmul FLOPS finder measured 794.5 of
 * 989 TFLOP/s (80.3%) in short bursts, the A100 271.2 of 312 (86.9%)
 * (stas00/ml-engineering, compute/accelerator/README.md, commit 744d01e),
 * and the A100's fitted-to-burst ratio would give 0.74: the runs sustain
 * about 13% less, as a GPU held at its 700 W limit would.  fp8: the
 * same finder's 1402.6 of 1979 (70.9%), so 0.64 x 70.9 / 80.3 = 0.57:
 * fp8 GEMMs run 1.77x bf16 ones at best, not 2x.  The size curve: XLA's
 * measured sm_90 GEMM table (openxla/xla xla/service/gpu/model/
 * matmul_interpolator_data.h, commit 71feeddf) fits x_half 64-96 once a
 * few microseconds per call are set apart: the A100's 96 holds.
 * Attention: FlashAttention-2 on H100 SXM5, head dim 128 (Shah et al.
 * 2024, FlashAttention-3, its forward and backward speed charts): causal
 * forward 298 / 319 / 335 TFLOP/s at 2k / 4k / 16k tokens, backward
 * 291 / 310 / 322, i.e. x / (x + 256) of 0.345 and 0.33 of the bf16
 * peak.  FlashAttention-2 is
 * the kernel of PyTorch's SDPA, of the flash-attn package and of NeMo's
 * 2024 launcher (NVTE_FUSED_ATTN=0 from February to August 2024); cuDNN 9
 * and FlashAttention-3 reach 1.6-1.8x it (539 / 516, 616 / 561 at 16k)
 * and are not assumed. */
static const struct
{
  const char *names[6];
  StowGpuEfficiency e;
} gpu_profiles[] = {
  { { "H100-SXM", "H800", "H200", "GH200", NULL },
    { .gpu = "H100-SXM",
      .gemm_eff_max = 0.64,
      .gemm_fp8_eff_max = 0.57,
      .gemm_half_dim = 96,
      .attn_fwd_eff = 0.345,
      .attn_bwd_eff = 0.33,
      .attn_half_seq = 256 } },
};

void
stow_cost_gpu_efficiency (const StowGpu *gpu, const StowCostOptions *o,
                          StowGpuEfficiency *out)
{
  StowCostOptions defaults;
  if (o == NULL)
    stow_cost_options_init (&defaults), o = &defaults;
  g_return_if_fail (out != NULL);
  *out = (StowGpuEfficiency){
    .gpu = "default",
    .gemm_eff_max = o->gemm_eff_max,
    .gemm_fp8_eff_max = o->gemm_fp8_eff_max,
    .gemm_half_dim = o->gemm_half_dim,
    .attn_fwd_eff = o->attn_fwd_eff,
    .attn_bwd_eff = o->attn_bwd_eff,
    .attn_half_seq = o->attn_half_seq,
  };
  if (!o->gpu_profiles || gpu == NULL || gpu->name == NULL)
    return;
  for (gsize i = 0; i < G_N_ELEMENTS (gpu_profiles); i++)
    for (const char *const *n = gpu_profiles[i].names; *n; n++)
      if (g_ascii_strcasecmp (*n, gpu->name) == 0)
        {
          *out = gpu_profiles[i].e;
          return;
        }
}

struct _StowCostPrep
{
  const StowModel *model;
  guint64 n_layers;
  guint64 *moe_prefix;       /* MoE layers before index i (n_layers + 1) */
  double *params_prefix;     /* parameters of the layers before index i */
  double *moe_params_prefix; /* of which in MoE layers */
};

StowCostPrep *
stow_cost_prepare (const StowModel *m)
{
  g_return_val_if_fail (m != NULL, NULL);
  StowCostPrep *p = g_new0 (StowCostPrep, 1);
  p->model = m;
  p->n_layers = m->n_layers;
  p->moe_prefix = g_new0 (guint64, m->n_layers + 1);
  p->params_prefix = g_new0 (double, m->n_layers + 1);
  p->moe_params_prefix = g_new0 (double, m->n_layers + 1);
  for (guint64 i = 0; i < m->n_layers; i++)
    {
      gboolean moe = m->layers[i].is_moe;
      double lp = (double)m->layers[i].params;
      p->moe_prefix[i + 1] = p->moe_prefix[i] + (moe ? 1 : 0);
      p->params_prefix[i + 1] = p->params_prefix[i] + lp;
      p->moe_params_prefix[i + 1] = p->moe_params_prefix[i] + (moe ? lp : 0);
    }
  return p;
}

void
stow_cost_prep_free (StowCostPrep *p)
{
  if (p == NULL)
    return;
  g_free (p->moe_prefix);
  g_free (p->params_prefix);
  g_free (p->moe_params_prefix);
  g_free (p);
}

/* ---- hardware rates ------------------------------------------------- */

double
stow_cost_peak_flops (const StowGpu *g, StowPrecision p)
{
  double f = 0;
  switch (p)
    {
    case STOW_PRECISION_FP8:
      f = g->fp8_flops > 0 ? g->fp8_flops : g->bf16_flops;
      break;
    case STOW_PRECISION_BF16:
    case STOW_PRECISION_BF16_PURE:
      f = g->bf16_flops > 0 ? g->bf16_flops : g->fp16_flops;
      break;
    case STOW_PRECISION_FP16:
      f = g->fp16_flops > 0 ? g->fp16_flops : g->bf16_flops;
      break;
    case STOW_PRECISION_FP32:
      f = g->tf32_flops > 0 ? g->tf32_flops : g->fp32_flops;
      break;
    }
  if (f <= 0)
    f = g->fp32_flops > 0 ? g->fp32_flops : 1e12;
  return f;
}

/* Fraction of a GEMM's share of peak that a dimension of size @x keeps:
 * tiles along a short dimension are partly empty and the wave count is
 * small (x / (x + x_half): half at x_half, 1 in the limit). */
static inline double
dim_share (double x, double half)
{
  return x / (x + half);
}

/* The rates a plan's kernels run at on its GPU. */
typedef struct
{
  StowGpuEfficiency e;
  double peak;      /* the layers' GEMMs: the training precision's peak */
  double gemm_max;  /* their ceiling, of that peak */
  double peak_bf16; /* attention and the output layer: bf16 under fp8
                       (Transformer Engine runs them in bf16), else peak */
  gboolean fp8;     /* fp8 GEMMs with their casts */
} Rates;

static void
rates_init (const StowGpu *gpu, const StowTraining *t, const StowCostOptions *o,
            Rates *r)
{
  stow_cost_gpu_efficiency (gpu, o, &r->e);
  r->peak = stow_cost_peak_flops (gpu, t->precision);
  r->fp8 = t->precision == STOW_PRECISION_FP8 && gpu->fp8_flops > 0;
  r->gemm_max = r->fp8 ? r->e.gemm_fp8_eff_max : r->e.gemm_eff_max;
  r->peak_bf16 = t->precision == STOW_PRECISION_FP8
                     ? stow_cost_peak_flops (gpu, STOW_PRECISION_BF16)
                     : r->peak;
}

/* A GEMM's share of @peak at its shape, under ceiling @max. */
static inline double
gemm_eff_at (const Rates *r, double max, double m, double n, double k)
{
  double half = r->e.gemm_half_dim;
  return max * dim_share (m, half) * dim_share (n, half) * dim_share (k, half);
}

/* The layers' GEMMs (fp8 under --precision fp8). */
static inline double
gemm_eff (const Rates *r, double m, double n, double k)
{
  return gemm_eff_at (r, r->gemm_max, m, n, k);
}

/* Seconds of one of the layers' GEMMs of @flops FLOPs, shape m x n x k. */
static inline double
gemm_s (const Rates *r, double flops, double m, double n, double k)
{
  return flops / (r->peak * gemm_eff (r, m, n, k));
}

/* ---- the model's shapes -------------------------------------------- */

typedef struct
{
  /* one layer, per GPU, one micro-batch */
  double fwd_gemm_s, fwd_elem_s; /* compute pieces of the forward */
  double bwd_gemm_s;             /* the backward's GEMMs */
  double fwd_attn_s, bwd_attn_s; /* the attention core, each way */
  double fwd_cast_s, bwd_cast_s; /* fp8: casting and transposing operands */
  double core_elem_s;            /* the attention-core share of fwd_elem_s */
  double op_rec_s, op_rec_flops; /* what selective op checkpointing rebuilds
                                    in backward, and its FLOPs */
  double fwd_s, bwd_s;           /* compute of a forward and of its backward */
  double tp_pass_s;              /* one pass's TP communication, in full */
  double tp_fwd_s;               /* of which exposed in the forward */
  double tp_bwd_s;               /* and in the backward */
  double cp_fwd_s;               /* exposed CP exchange, forward */
  double ep_fwd_s;               /* expert all-to-all, forward */
  double flops_fwd;      /* model FLOPs of the forward, whole layer (not /tp) */
  double attn_flops_fwd; /* of which the attention core */
} LayerCost;

static double
elem_bytes (StowPrecision p)
{
  return p == STOW_PRECISION_FP32 ? 4.0 : 2.0;
}

/* An overlap switch of StowCostOptions (-1 the engine's default, 0 off,
 * 1 on): on by default for the Megatron-core engines. */
static gboolean
mcore_default (gint flag, StowEngine engine)
{
  return flag > 0 || (flag < 0 && stow_engine_is_mcore (engine));
}

/* Whether the layout's TP traffic hides under its GEMMs: Megatron-core
 * with Transformer Engine's userbuffers (--tp-comm-overlap), which needs
 * sequence parallelism. */
static gboolean
tp_overlapped (const StowCostOptions *o, const StowLayout *l)
{
  return l->tp > 1 && l->sp && mcore_default (o->tp_comm_overlap, l->engine);
}

/* What shows of @comm seconds of a pass's tensor-parallel traffic (half
 * all-gathers, half reduce-scatters) overlapped with @gemm seconds of the
 * GEMMs beside it: the ring exchange hides all of an all-gather, the
 * pipelined reduce-scatter all but its last of 4 chunks (an eighth of the
 * traffic); then what outlasts the GEMMs, and the slowdown of the rest. */
static double
tp_hidden_exposed (const StowCostOptions *o, double comm, double gemm)
{
  double edge = comm / 8.0, rest = comm - edge;
  return edge + MAX (0.0, rest - gemm) + o->overlap_slowdown * MIN (rest, gemm);
}

/* One layer on one GPU for one micro-batch: its dimensions, the shapes of
 * its GEMMs after tensor-parallel splitting and their FLOPs, what the
 * pieces of layer_cost price. */
typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowLayout *l;
  const StowCostOptions *o;
  const Rates *r;
  gboolean moe;
  double s, sl, b;
  double T; /* tokens of a micro-batch on this GPU */
  double h, a, kv, dq, dv, tp;
  double eb, hbm;
  /* GEMM shapes (Megatron: column-parallel QKV and MLP-up, row-parallel
   * output and MLP-down) */
  double qkv_n, o_k, f, mlp_T, n_mlp, mlp_tp, up_n, down_k;
  /* FLOPs on this GPU: each GEMM's, the attention core's */
  double fl_qkv, fl_o, fl_up, fl_down, fl_shared, fl_router, fl_attn;
  guint etp;        /* the routed experts' tensor parallelism */
  gboolean own_etp; /* ... apart from --tp */
} LayerShape;

static void
layer_shape_init (LayerShape *x, const StowModel *m, const StowCluster *c,
                  const StowTraining *t, const StowLayout *l,
                  const StowCostOptions *o, gboolean moe, const Rates *r)
{
  double s = (double)t->seq_len, sl = s / l->cp;
  double b = (double)l->micro_batch;
  double T = sl * b; /* tokens of a micro-batch on this GPU */
  double h = (double)m->hidden, a = (double)m->n_heads;
  double kv = (double)m->n_kv_heads, d = (double)m->head_dim;
  double tp = (double)l->tp;
  double dq = d, dv = d;
  if (m->qk_nope_head_dim + m->qk_rope_head_dim > 0)
    {
      dq = (double)(m->qk_nope_head_dim + m->qk_rope_head_dim);
      dv = (double)m->v_head_dim;
      kv = a;
    }

  /* GEMM shapes after tensor-parallel splitting (Megatron: column-parallel
   * QKV and MLP-up, row-parallel output and MLP-down). */
  double qkv_n = (a * dq + kv * dq + kv * dv) / tp;
  double o_k = a * dv / tp;
  double f = (double)m->ffn, mlp_T = T, n_mlp = 1, mlp_tp = tp;
  if (moe && m->n_experts > 0)
    {
      f = (double)(m->moe_ffn ? m->moe_ffn : m->ffn);
      /* The routed experts' linears are split etp ways (--etp, Megatron-
       * core's --expert-tensor-parallel-size, default --tp).  Tokens one
       * expert sees on a rank: T top-k / E, gathered from the ep ranks
       * that share it and, when etp differs from tp, from the etp ranks
       * that split it (of the tp ranks whose tokens it serves): the
       * FLOPs per GPU stay T top-k f / tp whatever etp is. */
      mlp_tp = (double)stow_layout_etp (l);
      mlp_T = T * (double)m->experts_per_token * (double)l->ep * mlp_tp
              / (tp * (double)m->n_experts);
      n_mlp = (double)m->experts_per_token;
    }
  double up_n = (m->gated_mlp ? 2.0 : 1.0) * f / mlp_tp, down_k = f / mlp_tp;
  /* FLOPs of each GEMM on this GPU for one micro-batch. */
  double fl_qkv = 2 * T * h * qkv_n, fl_o = 2 * T * o_k * h;
  double fl_up = 2 * T * n_mlp * h * up_n * mlp_tp / tp;
  double fl_down = 2 * T * n_mlp * down_k * h * mlp_tp / tp;
  double fl_shared = 0;
  if (moe && m->n_shared_experts > 0)
    fl_shared = 2 * T * h * (double)m->n_shared_experts
                * (m->gated_mlp ? 3.0 : 2.0) * f / tp;
  double fl_router = moe ? 2 * T * h * (double)m->n_experts : 0;
  /* The attention core: Q K^T and A V, 4 s_local s a d per sequence,
   * counted in full as the papers count it. */
  double fl_attn = 2 * b * sl * s * a * (dq + dv) / tp;
  guint etp = stow_layout_etp (l);

  x->m = m, x->c = c, x->t = t, x->l = l, x->o = o, x->r = r, x->moe = moe;
  x->s = s, x->sl = sl, x->b = b, x->T = T;
  x->h = h, x->a = a, x->kv = kv, x->dq = dq, x->dv = dv, x->tp = tp;
  x->eb = elem_bytes (t->precision);
  x->hbm = c->node.gpu.hbm_bw * o->hbm_eff;
  x->qkv_n = qkv_n, x->o_k = o_k, x->f = f, x->mlp_T = mlp_T;
  x->n_mlp = n_mlp, x->mlp_tp = mlp_tp, x->up_n = up_n, x->down_k = down_k;
  x->fl_qkv = fl_qkv, x->fl_o = fl_o, x->fl_up = fl_up, x->fl_down = fl_down;
  x->fl_shared = fl_shared, x->fl_router = fl_router, x->fl_attn = fl_attn;
  x->etp = etp;
  x->own_etp = moe && m->n_experts > 0 && etp != l->tp;
}

/* The GEMMs, forward and backward. */
static void
layer_gemm_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowModel *m = x->m;
  const StowLayout *l = x->l;
  const Rates *r = x->r;
  gboolean moe = x->moe;
  double T = x->T, h = x->h, tp = x->tp, f = x->f;
  double qkv_n = x->qkv_n, o_k = x->o_k, mlp_T = x->mlp_T;
  double up_n = x->up_n, down_k = x->down_k;
  double fl_qkv = x->fl_qkv, fl_o = x->fl_o, fl_up = x->fl_up;
  double fl_down = x->fl_down, fl_shared = x->fl_shared;
  double fl_router = x->fl_router;
  /* Shared experts are dense MLPs split by --tp. */
  double t_rest
      = gemm_s (r, fl_shared, T, (m->gated_mlp ? 2.0 : 1.0) * f / tp, h);
  if (fl_router > 0)
    t_rest += gemm_s (r, fl_router, T, (double)m->n_experts, h);
  double full = gemm_s (r, fl_qkv, T, qkv_n, h) + gemm_s (r, fl_o, T, h, o_k)
                + gemm_s (r, fl_up, mlp_T, up_n, h)
                + gemm_s (r, fl_down, mlp_T, h, down_k) + t_rest;
  lc->fwd_gemm_s = full;
  lc->bwd_gemm_s = 2.0 * full; /* the input gradients, then the weights' */
  if (tp_overlapped (x->o, l))
    {
      /* Transformer Engine overlaps TP traffic by splitting the GEMM next
       * to it along the tokens (transformer_engine/pytorch/module/base.py,
       * initialize_ub defaults): a ring exchange of tp chunks under the
       * GEMMs that read all-gathered input (QKV and MLP-up forward, the
       * output and down projections' input gradients), a pipeline of 4
       * chunks under those whose output is reduce-scattered (the output
       * and down projections forward); the rest overlap in bulk.  Smaller
       * GEMMs run less efficiently. */
      double ring = T / tp, pipe = T / 4.0;
      /* Routed experts' GEMMs are grouped, not split. */
      double mlp_ring = moe ? mlp_T : mlp_T / tp;
      double mlp_pipe = moe ? mlp_T : mlp_T / 4.0;
      lc->fwd_gemm_s = gemm_s (r, fl_qkv, ring, qkv_n, h)
                       + gemm_s (r, fl_o, pipe, h, o_k)
                       + gemm_s (r, fl_up, mlp_ring, up_n, h)
                       + gemm_s (r, fl_down, mlp_pipe, h, down_k) + t_rest;
      /* the weights' gradients whole, the input gradients as split */
      lc->bwd_gemm_s = full + gemm_s (r, fl_qkv, T, qkv_n, h)
                       + gemm_s (r, fl_o, ring, h, o_k)
                       + gemm_s (r, fl_up, mlp_T, up_n, h)
                       + gemm_s (r, fl_down, mlp_ring, h, down_k) + t_rest;
    }
}

/* Attention core: Q K^T and A V, 4 s_local s a d per sequence, counted
 * in full as the papers count it, in bf16 under fp8 (Transformer
 * Engine's DotProductAttention; torchao leaves it alone too).  Flash
 * kernels skip the masked half of a causal mask and recompute the
 * scores in backward, which does 2.5x the forward's FLOPs
 * (FlashAttention-2, Dao 2023, §3.1); their rates grow with the keys a
 * kernel sees (a chunk of s / cp under context parallelism).  The
 * unfused path computes all of it as batched GEMMs with a short inner
 * dimension (d), backward twice the forward. */
static void
layer_attention_seconds (const LayerShape *x, LayerCost *lc)
{
  const Rates *r = x->r;
  double s = x->s, sl = x->sl, dq = x->dq, fl_attn = x->fl_attn;
  double peak_attn = r->peak_bf16;
  if (x->t->flash_attention)
    {
      double seq
          = r->e.attn_half_seq > 0 ? dim_share (sl, r->e.attn_half_seq) : 1.0;
      lc->fwd_attn_s = 0.5 * fl_attn / (peak_attn * r->e.attn_fwd_eff * seq);
      lc->bwd_attn_s
          = 2.5 * 0.5 * fl_attn / (peak_attn * r->e.attn_bwd_eff * seq);
    }
  else
    {
      lc->fwd_attn_s
          = fl_attn
            / (peak_attn * gemm_eff_at (r, r->e.gemm_eff_max, sl, s, dq));
      lc->bwd_attn_s = 2.0 * lc->fwd_attn_s;
    }
}

/* Memory-bound kernels (norms, activations, dropout, residuals, softmax):
 * every tensor saved for backward is written by one kernel and read by
 * the next, so a forward moves about twice the layer's activation bytes
 * (Korthikanti et al. Table 2, as the memory model counts them). */
static void
layer_memory_bound_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowModel *m = x->m;
  const StowTraining *t = x->t;
  double hbm = x->hbm;
  StowLayout nl = *x->l;
  nl.recompute = STOW_RECOMPUTE_NONE;
  double act = (double)stow_mem_layer_activations (m, t, &nl);
  nl.recompute = STOW_RECOMPUTE_SELECTIVE;
  double act_sel = (double)stow_mem_layer_activations (m, t, &nl);
  lc->fwd_elem_s = 2.0 * act / hbm + x->o->kernel_overhead_s;
  lc->core_elem_s = 2.0 * (act - act_sel) / hbm;
}

/* fp8: a GEMM operand is cast to fp8 and transposed (read 2 B, write 1 B
 * twice) unless the kernel that makes it does so.  Transformer Engine
 * (Megatron) fuses the cast into the layer norms, the activation and its
 * gradient (LayerNormLinear, LayerNormMLP): what is left is the input of
 * the attention's output projection forward, and backward the output
 * gradients of QKV, the output projection and the MLP's down projection.
 * Others (torchao's Float8Linear, te.Linear alone) cast every linear's
 * input and output gradient. */
static void
layer_fp8_cast_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowLayout *l = x->l;
  double T = x->T, h = x->h, hbm = x->hbm;
  double qkv_n = x->qkv_n, o_k = x->o_k, mlp_T = x->mlp_T, n_mlp = x->n_mlp;
  double up_n = x->up_n, down_k = x->down_k;
  if (!x->r->fp8)
    return;
  const double cast = 4.0;
  double fwd_el, bwd_el;
  if (stow_engine_is_mcore (l->engine))
    {
      fwd_el = T * o_k;
      bwd_el = T * (qkv_n + h) + mlp_T * n_mlp * h;
    }
  else
    {
      fwd_el = T * (h + o_k) + mlp_T * n_mlp * (h + down_k);
      bwd_el = T * (qkv_n + h) + mlp_T * n_mlp * (up_n + h);
    }
  lc->fwd_cast_s = cast * fwd_el / hbm;
  lc->bwd_cast_s = cast * bwd_el / hbm;
}

/* Selective op checkpointing (--recompute selective-op, torchtitan's
 * policy; stow_mem_op_checkpoint_bytes in planner/activations.c) keeps the
 * outputs of the 1st, 3rd, ... matmul and the attention's; backward reruns
 * the others and every element-wise op of the forward. */
static void
layer_op_recompute_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowModel *m = x->m;
  const Rates *r = x->r;
  double T = x->T, tp = x->tp;
  if (x->l->recompute != STOW_RECOMPUTE_OP)
    return;
  StowMatmul mm[STOW_MAX_LAYER_MATMULS];
  guint n = stow_mem_layer_matmuls (m, mm);
  for (guint i = 1; i < n; i += 2) /* the 2nd, 4th, ... */
    {
      double in = mm[i].row_parallel ? mm[i].in / tp : mm[i].in;
      double out = mm[i].row_parallel ? mm[i].out : mm[i].out / tp;
      double fl = 2 * T * in * out;
      lc->op_rec_s += gemm_s (r, fl, T, out, in);
      lc->op_rec_flops += fl * tp;
    }
  lc->op_rec_s += lc->fwd_elem_s + lc->fwd_cast_s;
}

/* Tensor parallelism: two all-reduces of the layer's output per pass
 * (attention and MLP), or with sequence parallelism an all-gather and a
 * reduce-scatter each: the same bytes (Korthikanti et al. §4.2.2).
 * Megatron-core overlaps them chunk by chunk with the GEMMs beside them
 * (Transformer Engine userbuffers); Megatron-LM 2021-22 did not.
 * @bwd_gemm: the backward's GEMM seconds. */
static void
layer_tp_seconds (const LayerShape *x, LayerCost *lc, double bwd_gemm)
{
  const StowModel *m = x->m;
  const StowCluster *c = x->c;
  const StowLayout *l = x->l;
  const StowCostOptions *o = x->o;
  double T = x->T, h = x->h, tp = x->tp, eb = x->eb;
  guint etp = x->etp;
  gboolean own_etp = x->own_etp;
  if (l->tp > 1)
    {
      StowLink tl = stow_comm_link (c, o, l->tp, 1);
      double bytes = T * h * eb;
      /* With experts split apart from --tp (--etp), an MoE layer's MLP
       * leaves the tp group: only the attention's pair stays on it. */
      lc->tp_pass_s
          = (own_etp ? 1.0 : 2.0) * stow_comm_ring_allreduce (bytes, l->tp, tl);
      if (tp_overlapped (o, l))
        {
          lc->tp_fwd_s = tp_hidden_exposed (o, lc->tp_pass_s, lc->fwd_gemm_s);
          lc->tp_bwd_s = tp_hidden_exposed (o, lc->tp_pass_s, bwd_gemm);
        }
      else
        lc->tp_fwd_s = lc->tp_bwd_s = lc->tp_pass_s;
    }
  if (own_etp && etp > 1)
    {
      /* The experts' own tensor parallelism: the etp ranks that split an
       * expert all-gather the tokens routed to it (top-k copies of the
       * rank's T / tp tokens, from each of them) and reduce-scatter its
       * output, around the grouped GEMMs, which Transformer Engine's
       * userbuffers do not overlap: exposed, forward and backward. */
      StowLink xl = stow_comm_link (c, o, etp, 1);
      double bytes = T / tp * (double)m->experts_per_token * etp * h * eb;
      double pass = stow_comm_ring_allreduce (bytes, etp, xl);
      lc->tp_pass_s += pass;
      lc->tp_fwd_s += pass;
      lc->tp_bwd_s += pass;
    }
}

/* Context parallelism: a ring passes each rank's K and V to the others
 * (cp - 1 steps), overlapped with the attention of the chunk in hand. */
static void
layer_cp_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowLayout *l = x->l;
  const StowCostOptions *o = x->o;
  double T = x->T, kv = x->kv, dq = x->dq, dv = x->dv, tp = x->tp;
  double eb = x->eb;
  if (l->cp < 2)
    return;
  StowLink cl = stow_comm_link (x->c, o, l->cp, l->tp);
  double kvb = T * kv * (dq + dv) * eb / MAX (1.0, tp > kv ? kv : tp);
  double comm = (double)(l->cp - 1) * (kvb / cl.bw + cl.lat);
  lc->cp_fwd_s = MAX (0.0, comm - lc->fwd_attn_s)
                 + o->overlap_slowdown * MIN (comm, lc->fwd_attn_s);
}

/* Expert parallelism: dispatch and combine all-to-alls, each moving the
 * routed tokens' hidden states, (ep-1)/ep of them off the GPU. */
static void
layer_ep_seconds (const LayerShape *x, LayerCost *lc)
{
  const StowModel *m = x->m;
  const StowLayout *l = x->l;
  double T = x->T, h = x->h, tp = x->tp, eb = x->eb;
  guint etp = x->etp;
  if (!x->moe || l->ep < 2)
    return;
  /* ep is carved out of dp x cp (stride tp x cp) while etp = tp;
   * Megatron-core's own expert grid (tp-ep-dp-pp order, parallel_
   * state.py) puts it next to the etp ranks otherwise. */
  guint64 ep_stride = x->own_etp ? etp : (guint64)l->tp * l->cp;
  StowLink el = stow_comm_link (x->c, x->o, l->ep, ep_stride);
  double bytes = T * (double)m->experts_per_token * h * eb / tp;
  lc->ep_fwd_s = 2.0
                 * ((double)(l->ep - 1) / (double)l->ep * bytes / el.bw
                    + el.lat * (double)(l->ep - 1));
}

static void
layer_cost (const StowModel *m, const StowCluster *c, const StowTraining *t,
            const StowLayout *l, const StowCostOptions *o, gboolean moe,
            const Rates *r, LayerCost *lc)
{
  LayerShape x;
  layer_shape_init (&x, m, c, t, l, o, moe, r);
  gboolean lora = t->finetune != STOW_FINETUNE_FULL;
  memset (lc, 0, sizeof *lc);
  layer_gemm_seconds (&x, lc);
  layer_attention_seconds (&x, lc);
  layer_memory_bound_seconds (&x, lc);
  layer_fp8_cast_seconds (&x, lc);
  layer_op_recompute_seconds (&x, lc);

  /* A forward's compute, and its backward's: two forwards of GEMMs and
   * memory-bound work (one under LoRA: frozen weights need no weight
   * gradient), the attention's own backward. */
  double w = lora ? 1.0 : 2.0;
  double bwd_gemm = lora ? 0.5 * lc->bwd_gemm_s : lc->bwd_gemm_s;
  lc->fwd_s = lc->fwd_gemm_s + lc->fwd_attn_s + lc->fwd_elem_s + lc->fwd_cast_s;
  lc->bwd_s = bwd_gemm + w * lc->fwd_elem_s + lc->bwd_attn_s + lc->bwd_cast_s;

  layer_tp_seconds (&x, lc, bwd_gemm);
  layer_cp_seconds (&x, lc);
  layer_ep_seconds (&x, lc);

  /* Model FLOPs of the forward for the whole layer (Narayanan et al.
   * eq. 3 counting: 2 x active linear params x tokens + attention). */
  double tp = x.tp;
  lc->flops_fwd
      = (x.fl_qkv + x.fl_o + x.fl_up + x.fl_down + x.fl_shared + x.fl_router)
            * tp
        + x.fl_attn * tp;
  lc->attn_flops_fwd = x.fl_attn * tp;
}

/* One layer's forward and backward for one micro-batch, compute and the
 * in-layer communication that is not hidden: the same TP and EP traffic
 * both ways, the CP exchange twice in backward. */
static void
layer_pass_seconds (const LayerCost *lc, double *fwd, double *bwd)
{
  *fwd = lc->fwd_s + lc->tp_fwd_s + lc->cp_fwd_s + lc->ep_fwd_s;
  *bwd = lc->bwd_s + lc->tp_bwd_s + 2.0 * lc->cp_fwd_s + lc->ep_fwd_s;
}

/* ---- the step -------------------------------------------------------- */

/* The embedding (a lookup: its output written, then read back in
 * backward) and the output layer with its fp32 cross-entropy, one
 * micro-batch on one GPU.  The output layer runs over the decoder's
 * tokens (--decoder-seq), in bf16 under fp8 (Megatron's output layer is
 * not a Transformer Engine module; torchao skips it too). */
static void
ends_cost (const StowModel *m, const StowCluster *c, const StowTraining *t,
           const StowLayout *l, const StowCostOptions *o, const Rates *r,
           StowEndsSeconds *out)
{
  double eb = elem_bytes (t->precision);
  double hbm = c->node.gpu.hbm_bw * o->hbm_eff;
  double T = (double)t->seq_len / l->cp * (double)l->micro_batch;
  double h = (double)m->hidden;
  double e = 2.0 * T * h * eb / hbm;
  out->embedding_fwd_s = e;
  out->embedding_bwd_s = 2.0 * e;
  out->embedding_tp_s = 0;
  if (l->tp > 1 && !l->sp)
    {
      /* vocab-parallel embedding: one all-reduce of its output */
      StowLink tl = stow_comm_link (c, o, l->tp, 1);
      out->embedding_tp_s = stow_comm_ring_allreduce (T * h * eb, l->tp, tl);
    }
  double vn = (double)m->vocab / l->tp;
  double To
      = (double)stow_mem_decoder_seq (m, t) / l->cp * (double)l->micro_batch;
  double g = 2.0 * To * h * vn
             / (r->peak_bf16 * gemm_eff_at (r, r->e.gemm_eff_max, To, vn, h));
  /* The loss over s b V / tp logits.  Megatron's vocab-parallel cross-
   * entropy (megatron/core/tensor_parallel/cross_entropy.py, core 0.8)
   * runs one kernel per step in fp32: the upcast (read 2 B, write 4),
   * the max (read 4), subtracting it, exp and dividing by the sum (read
   * and write 4 each), the sum (read 4): 38 B per logit forward; backward
   * scales the saved softmax in place (8) and casts the gradient back to
   * bf16 (6): 14 B.  A fused loss (--fused-loss) reads the 16-bit logits
   * once forward, and reads them and writes their gradient backward.
   * Otherwise an fp32 softmax and its gradient, 12 B each way. */
  double ce_fwd = 12.0, ce_bwd = 12.0;
  if (stow_engine_is_mcore (l->engine))
    ce_fwd = 38.0, ce_bwd = 14.0;
  else if (t->fused_loss)
    ce_fwd = eb, ce_bwd = 2.0 * eb;
  out->head_fwd_s = g + To * vn * ce_fwd / hbm;
  out->head_bwd_s = 2.0 * g + To * vn * ce_bwd / hbm;
}

/* What the terms of one step's estimate share: the plan, the rates its
 * kernels run at, the prices of one layer's and of the ends' passes, and
 * what the stages add up to for one micro-batch (the slowest stage's
 * where a name ends in _max). */
typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowLayout *l;
  const StowCostOptions *o;
  const StowGpu *gpu;
  Rates rates;
  double eb;  /* bytes per element of the activations and weights */
  double hbm; /* memory-bound kernels' bandwidth, bytes/s */
  guint per_node;
  guint64 mb; /* micro-batches per step */
  double v;   /* model chunks per stage: interleaving shortens the bubble */
  double s, T, h, V; /* sequence, a micro-batch's tokens on a GPU, hidden,
                        vocabulary */
  gboolean lora;
  guint64 n_shard; /* ZeRO's shard degree */
  StowEndsSeconds ends;
  LayerCost dense, moe;
  const guint64 *counts; /* layers per stage */

  /* Per stage, one micro-batch: components of forward + backward. */
  double t_max, t_sum;
  double comp_max[STOW_N_COSTS];
  double tp_total_max; /* the slowest stage's TP traffic, hidden or not */
  double stage_fwd_max, stage_bwd_max, stage_params_max;
  guint64 stage_layers_max;
  double expert_params_max;
  double model_fwd_flops; /* one micro-batch of one replica, all layers */
  double recompute_flops;
  double act_offload_s;
  double param_stream_s, param_stream_total_s;
  double pp_time; /* the pipeline: steady state and bubble */

  /* The model states' bytes per parameter (state_bytes) and the
   * parameters the gradients and the optimizer step cover. */
  double w_b, g_b, master, states, grad_b;
  double trainable, ex_trainable;
} Estimate;

/* One stage, one micro-batch. */
typedef struct
{
  double comp[STOW_N_COSTS];
  double tp_total;
  double fwd, bwd, params, expert_params;
} StageCost;

static void
estimate_init (Estimate *E, const StowModel *m, const StowCluster *c,
               const StowTraining *t, const StowLayout *l,
               const StowCostOptions *o)
{
  memset (E, 0, sizeof *E);
  E->m = m, E->c = c, E->t = t, E->l = l, E->o = o;
  E->gpu = &c->node.gpu;
  rates_init (E->gpu, t, o, &E->rates);
  E->eb = elem_bytes (t->precision);
  E->hbm = E->gpu->hbm_bw * o->hbm_eff;
  E->per_node = MAX (c->node.gpus_per_node, 1);
  E->mb = MAX (l->grad_accum, 1);
  E->v = l->schedule == STOW_SCHEDULE_INTERLEAVED ? MAX (l->vpp, 1) : 1;
  double s = (double)t->seq_len, sl = s / l->cp;
  E->s = s;
  E->T = sl * (double)l->micro_batch;
  E->h = (double)m->hidden, E->V = (double)m->vocab;
  E->lora = t->finetune != STOW_FINETUNE_FULL;
  gboolean any_moe = m->n_experts > 0;

  ends_cost (m, c, t, l, o, &E->rates, &E->ends);
  layer_cost (m, c, t, l, o, FALSE, &E->rates, &E->dense);
  if (any_moe)
    layer_cost (m, c, t, l, o, TRUE, &E->rates, &E->moe);
  else
    E->moe = E->dense;

  guint per_node = E->per_node;
  guint64 n_shard = (guint64)l->dp * l->cp;
  if (l->hybrid_shard) /* shards inside a node, as the memory model has it */
    n_shard = MIN ((guint64)l->dp, MAX (1, per_node / ((guint64)l->tp * l->cp)))
              * l->cp;
  E->n_shard = n_shard;
}

/* Stage @st's layers by kind (0 dense, 1 MoE): how many, how many of them
 * recomputed (the first @n_rec), their parameters. */
static void
stage_layer_kinds (const Estimate *E, guint st, guint64 first, guint64 n_rec,
                   guint64 nk[2], guint64 nr[2], double lpk[2])
{
  const StowModel *m = E->m;
  const guint64 *counts = E->counts;
  const StowCostPrep *pr = E->o->prep;
  if (pr != NULL && pr->model == m && pr->n_layers == m->n_layers)
    {
      guint64 a = first, z = first + counts[st], r = first + n_rec;
      nk[1] = pr->moe_prefix[z] - pr->moe_prefix[a];
      nk[0] = counts[st] - nk[1];
      nr[1] = pr->moe_prefix[r] - pr->moe_prefix[a];
      nr[0] = n_rec - nr[1];
      lpk[1] = pr->moe_params_prefix[z] - pr->moe_params_prefix[a];
      lpk[0] = pr->params_prefix[z] - pr->params_prefix[a] - lpk[1];
    }
  else
    for (guint64 i = first; i < first + counts[st]; i++)
      {
        int k = m->layers[i].is_moe ? 1 : 0;
        nk[k]++;
        nr[k] += (i - first) < n_rec;
        lpk[k] += (double)m->layers[i].params;
      }
}

/* ZeRO-Infinity parameter streaming: each rank fetches its shard of the
 * layer over PCIe (or from NVMe) once per forward and once per backward;
 * two layers prefetched, so only a layer whose transfer outlasts its
 * compute is exposed.  Layers the plan keeps resident (planner/
 * resident.c) are not fetched.  @n layers of stage @st priced @lc, with
 * @lp parameters. */
static void
param_stream (Estimate *E, const LayerCost *lc, guint st, double n, double lp)
{
  const StowCluster *c = E->c;
  const StowLayout *l = E->l;
  const StowCostOptions *o = E->o;
  const guint64 *counts = E->counts;
  double f = lc->fwd_s;
  guint64 kept = l->resident_layers == STOW_RESIDENT_AUTO
                         || l->engine != STOW_ENGINE_STOWAGE
                     ? 0
                     : MIN ((guint64)l->resident_layers, counts[st]);
  double streamed = n * (double)(counts[st] - kept) / (double)counts[st];
  double bw = E->gpu->pcie_bw;
  if (l->offload_params == STOW_OFFLOAD_NVME)
    {
      double rd = 0;
      for (guint q = 0; q < c->node.n_nvme; q++)
        rd += c->node.nvme[q].read_bw;
      bw = MIN (bw, rd > 0 ? rd / E->per_node : 1e9);
    }
  double shard = lp / n / l->tp / (double)MAX (E->n_shard, 1) * E->eb;
  double x = shard / bw;
  double fetch = l->offload_params == STOW_OFFLOAD_NVME ? o->nvme_fetch_s
                                                        : o->offload_fetch_s;
  E->param_stream_total_s += streamed * 2.0 * (x + fetch);
  E->param_stream_s
      += streamed * (MAX (0.0, x - f) + MAX (0.0, x - lc->bwd_s) + 2.0 * fetch);
}

/* Stage @st's layers (the model's from @first), each kind priced once. */
static void
stage_layers (Estimate *E, guint st, guint64 first, StageCost *S)
{
  const StowModel *m = E->m;
  const StowLayout *l = E->l;
  const guint64 *counts = E->counts;
  double *comp = S->comp;
  guint64 n_rec = 0;
  if (l->recompute == STOW_RECOMPUTE_FULL)
    n_rec = stow_layout_recomputed_layers (l, m->n_layers, counts[st]);
  /* Count the stage's layers by kind (recomputed ones are the first
   * n_rec), then price each kind once. */
  guint64 nk[2] = { 0, 0 }, nr[2] = { 0, 0 };
  double lpk[2] = { 0, 0 };
  stage_layer_kinds (E, st, first, n_rec, nk, nr, lpk);
  for (int k = 0; k < 2; k++)
    {
      if (nk[k] == 0)
        continue;
      const LayerCost *lc = k ? &E->moe : &E->dense;
      double n = (double)nk[k], n_full = (double)nr[k];
      double f = lc->fwd_s;
      comp[STOW_COST_COMPUTE] += n * (lc->fwd_s + lc->bwd_s);
      comp[STOW_COST_TP] += n * (lc->tp_fwd_s + lc->tp_bwd_s);
      S->tp_total += (2.0 * n + n_full) * lc->tp_pass_s;
      comp[STOW_COST_CP] += n * 3.0 * lc->cp_fwd_s;
      comp[STOW_COST_EP] += n * 2.0 * lc->ep_fwd_s;
      E->model_fwd_flops += n * lc->flops_fwd;
      /* Recomputation: full repeats a layer's forward (with its TP
       * communication) for the recomputed layers; selective repeats the
       * attention core only (Korthikanti et al. §5). */
      comp[STOW_COST_RECOMPUTE] += n_full * f;
      comp[STOW_COST_TP] += n_full * lc->tp_fwd_s;
      comp[STOW_COST_CP] += n_full * lc->cp_fwd_s;
      comp[STOW_COST_EP] += n_full * lc->ep_fwd_s;
      E->recompute_flops += n_full * lc->flops_fwd;
      if (l->recompute == STOW_RECOMPUTE_SELECTIVE)
        {
          comp[STOW_COST_RECOMPUTE] += n * (lc->fwd_attn_s + lc->core_elem_s);
          E->recompute_flops += n * lc->attn_flops_fwd;
        }
      if (l->recompute == STOW_RECOMPUTE_OP)
        {
          comp[STOW_COST_RECOMPUTE] += n * lc->op_rec_s;
          E->recompute_flops += n * lc->op_rec_flops;
        }
      double pass_fwd, pass_bwd;
      layer_pass_seconds (lc, &pass_fwd, &pass_bwd);
      S->fwd += n * pass_fwd;
      S->bwd += n * pass_bwd;
      /* Parameters on this GPU: experts split over ep and tp. */
      double lp = lpk[k];
      if (k == 1 && m->n_experts > 0)
        {
          double ex = (double)m->by_role[STOW_ROLE_EXPERT]
                      / (double)MAX (m->n_layers - m->first_dense_layers, 1)
                      * n;
          ex = MIN (ex, lp);
          S->params += (lp - ex) / l->tp;
          S->expert_params
              += ex / ((double)l->ep * (double)stow_layout_etp (l));
        }
      else
        S->params += lp / l->tp;
      /* Activation checkpoints to the host: down in forward, up in
       * backward, overlapped with the layer's compute (exposed only
       * when the copy outlasts it). */
      if (l->offload_activations && n_full > 0)
        {
          double ck = 2.0 * E->T * E->h / (l->sp ? l->tp : 1);
          E->act_offload_s
              += n_full * 2.0 * MAX (0.0, ck / E->gpu->pcie_bw - f);
        }
      if (l->offload_params != STOW_OFFLOAD_NONE)
        param_stream (E, lc, st, n, lp);
    }
}

/* Embedding (first stage) and output layer + loss (last stage). */
static void
stage_ends (Estimate *E, guint st, StageCost *S)
{
  const StowModel *m = E->m;
  const StowLayout *l = E->l;
  const StowEndsSeconds *ends = &E->ends;
  double *comp = S->comp;
  if (st == 0)
    {
      comp[STOW_COST_COMPUTE] += ends->embedding_fwd_s + ends->embedding_bwd_s;
      S->fwd += ends->embedding_fwd_s, S->bwd += ends->embedding_bwd_s;
      S->params += (double)m->embedding_params / l->tp;
      comp[STOW_COST_TP] += ends->embedding_tp_s;
      S->tp_total += ends->embedding_tp_s;
    }
  if (st + 1 == l->pp)
    {
      comp[STOW_COST_COMPUTE] += ends->head_fwd_s + ends->head_bwd_s;
      S->fwd += ends->head_fwd_s, S->bwd += ends->head_bwd_s;
      E->model_fwd_flops += 2.0 * E->T * E->h * E->V;
      S->params
          += (double)(m->head_params ? m->head_params
                                     : (l->pp > 1 ? m->vocab * m->hidden : 0))
             / l->tp;
    }
}

/* Every stage's micro-batch; the slowest one's terms. */
static void
price_stages (Estimate *E)
{
  const StowLayout *l = E->l;
  const guint64 *counts = E->counts;
  guint64 first = 0;
  for (guint st = 0; st < l->pp; st++)
    {
      StageCost S = { { 0 } };
      stage_layers (E, st, first, &S);
      stage_ends (E, st, &S);
      double total = 0;
      for (int k = 0; k < STOW_N_COSTS; k++)
        total += S.comp[k];
      E->t_sum += total;
      if (total > E->t_max)
        {
          E->t_max = total;
          memcpy (E->comp_max, S.comp, sizeof S.comp);
          E->tp_total_max = S.tp_total;
          E->stage_fwd_max = S.fwd;
          E->stage_bwd_max = S.bwd;
        }
      E->stage_params_max = MAX (E->stage_params_max, S.params);
      E->stage_layers_max = MAX (E->stage_layers_max, counts[st]);
      E->expert_params_max = MAX (E->expert_params_max, S.expert_params);
      first += counts[st];
    }
  /* model_fwd_flops summed every stage's layers once: the whole model. */
}

/* Pipeline: m micro-batches through the slowest stage, plus the fill and
 * drain through the others, shortened v-fold by interleaving (Narayanan
 * et al. 2021: bubble (p-1)/(v m)). */
static void
pipeline_terms (Estimate *E, StowCost *out)
{
  const StowLayout *l = E->l;
  guint64 mb = E->mb;
  double steady = (double)mb * E->t_max;
  double bubble = (E->t_sum - E->t_max) / E->v;
  if (l->schedule == STOW_SCHEDULE_GPIPE)
    bubble = E->t_sum - E->t_max;
  for (int k = 0; k < STOW_N_COSTS; k++)
    out->total_s[k] = out->exposed_s[k] = (double)mb * E->comp_max[k];
  out->total_s[STOW_COST_TP] = (double)mb * E->tp_total_max;
  out->total_s[STOW_COST_PP_BUBBLE] = out->exposed_s[STOW_COST_PP_BUBBLE]
      = bubble;
  E->pp_time = steady + bubble;
}

/* Point-to-point: the activation (or its gradient) of one micro-batch
 * crosses each stage boundary; Megatron's scatter-gather sends 1/tp of
 * it per rank.  Sends are blocking in Megatron's 1F1B steady state: two
 * per micro-batch and chunk, plus the fill and drain hops.  Megatron-
 * core's interleaved schedule posts them ahead and computes meanwhile
 * (overlap_p2p_comm, on by default): only the fill and drain hops, on
 * the critical path, show, and the slowdown of the rest.  Interleaved,
 * the fill is the first micro-batch's forward through all v·p model
 * chunks in turn and the drain the last one's backward back, each
 * chunk waiting for its predecessor's send: 2 (v p - 1) hops, not
 * 2 (p - 1) (interleaving multiplies the communication by v, Narayanan
 * et al. 2021 §2.2; an event simulation of core_r0.8's
 * forward_backward_pipelining_with_interleaving gives exactly this
 * while a hop is shorter than a chunk's forward). */
static void
p2p_terms (const Estimate *E, StowCost *out)
{
  const StowLayout *l = E->l;
  const StowCostOptions *o = E->o;
  double v = E->v;
  if (l->pp > 1)
    {
      double one = stow_cost_p2p_seconds (E->c, o, E->T * E->h * E->eb / l->tp,
                                          (guint64)l->tp * l->cp * l->dp);
      double n = 2.0 * ((double)E->mb * v + (double)l->pp - 1.0);
      double total = n * one, exposed = total;
      gboolean overlap = v > 1 && mcore_default (o->p2p_overlap, l->engine);
      if (overlap)
        {
          double edge = 2.0 * (v * (double)l->pp - 1.0) * one;
          exposed = edge + o->overlap_slowdown * (total - edge);
        }
      out->total_s[STOW_COST_PP_P2P] = total;
      out->exposed_s[STOW_COST_PP_P2P] = exposed;
    }
}

/* The bytes per parameter of the model states under this engine, as
 * memory.c holds them: the gradients are reduced in their own dtype
 * (Megatron-LM's fp32 main grads, NeMo's at --zero 0 too; NeMo's
 * distributed Adam's bf16; FSDP's and autocast's fp32), and the step
 * reads and writes the engine's master and states. */
static void
state_bytes (Estimate *E)
{
  stow_mem_engine_state_bytes (E->m, E->t, E->l, &E->w_b, &E->g_b, &E->master,
                               &E->states);
  E->grad_b = E->lora ? E->eb : E->g_b;
  E->trainable = E->lora ? 0.01 * E->stage_params_max : E->stage_params_max;
  E->ex_trainable = E->lora ? 0 : E->expert_params_max;
}

/* Data parallelism and ZeRO over the dp x cp replicas (stride tp). */
static void
dp_terms (const Estimate *E, StowCost *out)
{
  const StowCluster *c = E->c;
  const StowLayout *l = E->l;
  const StowCostOptions *o = E->o;
  guint64 mb = E->mb, n_shard = E->n_shard;
  double v = E->v, eb = E->eb;
  guint64 ndp = (guint64)l->dp * l->cp;
  guint64 stride = l->tp;
  double grad_b = E->grad_b;
  double trainable = E->trainable, ex_trainable = E->ex_trainable;
  double stage_params_max = E->stage_params_max;
  double expert_params_max = E->expert_params_max;
  double mb_fwd = E->stage_fwd_max, mb_bwd = E->stage_bwd_max;
  double dp_total = 0, dp_exposed = 0;
  if (ndp > 1)
    {
      /* The experts' data-parallel group: world / (etp x ep x pp), its
       * ranks etp x ep apart (with etp = tp: dp x cp / ep, tp x ep). */
      guint64 ex_n = stow_layout_expert_dp (l, ndp);
      guint64 ex_stride = (guint64)stow_layout_etp (l) * MAX (l->ep, 1);
      /* How many collectives carry them, each paying NCCL's latency: the
       * experts' go in buckets of their own, over their own group. */
      guint64 nl = E->stage_layers_max;
      double n_g = stow_comm_dp_buckets (l, ndp, trainable, grad_b, v, nl);
      double n_w = stow_comm_dp_buckets (l, ndp, stage_params_max, eb, v, nl);
      double ne_g = stow_comm_dp_buckets (l, ex_n, ex_trainable, grad_b, v, nl);
      double ne_w
          = stow_comm_dp_buckets (l, ex_n, expert_params_max, eb, v, nl);
      double g_bytes = trainable * grad_b, ge_bytes = ex_trainable * grad_b;
      double w_bytes = stage_params_max * eb, we_bytes = expert_params_max * eb;
      double ar
          = stow_comm_dp_n (c, o, g_bytes, n_g, ndp, stride, FALSE)
            + stow_comm_dp_n (c, o, ge_bytes, ne_g, ex_n, ex_stride, FALSE);
      double rs
          = stow_comm_dp_n (c, o, g_bytes, n_g, n_shard, stride, TRUE)
            + stow_comm_dp_n (c, o, ge_bytes, ne_g, ex_n, ex_stride, TRUE);
      double ag
          = stow_comm_dp_n (c, o, w_bytes, n_w, n_shard, stride, TRUE)
            + stow_comm_dp_n (c, o, we_bytes, ne_w, ex_n, ex_stride, TRUE);
      /* HSDP: the shards reduce inside a node, then replicas all-reduce
       * the sharded gradients across nodes once per step, unit by unit. */
      double hsdp = 0;
      if (l->hybrid_shard && ndp > n_shard)
        hsdp = stow_comm_dp_n (c, o, g_bytes / n_shard, n_g, ndp / n_shard,
                               stride * n_shard, FALSE);
      switch (l->zero)
        {
        case 0:
          /* Bucketed all-reduce overlapped with the last backward. */
          dp_total = ar;
          dp_exposed = MAX (0.0, ar - mb_bwd);
          break;
        case 1:
        case 2:
          {
            /* ZeRO-1 (Megatron's distributed optimizer) reduce-scatters
             * once per step; ZeRO-2 in DeepSpeed after every micro-batch
             * (the gradients are partitioned).  The updated parameters
             * are all-gathered after the step, overlapped with the next
             * step's first forward.  FSDP's SHARD_GRAD_OP reshards the
             * parameters after each backward, so every micro-batch's
             * forward gathers them again and its backward reduce-scatters
             * (PyTorch's ShardingStrategy docstring). */
            gboolean fsdp = l->engine == STOW_ENGINE_FSDP;
            double nrs
                = (l->zero == 2 && (fsdp || l->engine == STOW_ENGINE_DEEPSPEED))
                      ? (double)mb
                      : 1.0;
            double nag = fsdp ? (double)mb : 1.0;
            dp_total = nrs * rs + nag * ag + hsdp;
            dp_exposed = nrs * MAX (0.0, rs - mb_bwd)
                         + nag * MAX (0.0, ag - mb_fwd) + hsdp;
            break;
          }
        default:
          /* ZeRO-3: every micro-batch gathers the parameters for forward
           * and again for backward and reduce-scatters the gradients:
           * 1.5x the data of ZeRO-1/2 (Rajbhandari et al. 2020 §7),
           * prefetched under the compute of the same pass. */
          dp_total = (double)mb * (2.0 * ag + rs) + hsdp;
          dp_exposed
              = (double)mb
                    * (MAX (0.0, ag - mb_fwd) + MAX (0.0, ag + rs - mb_bwd))
                + hsdp;
          break;
        }
    }
  out->total_s[STOW_COST_DP] = dp_total;
  out->exposed_s[STOW_COST_DP]
      = dp_exposed + o->overlap_slowdown * (dp_total - dp_exposed);
}

/* ZeRO-Offload: gradients go down as each micro-batch's backward
 * produces them, updated parameters come up after the CPU step (and the
 * states through the drives, from NVMe).  @opt_params: the parameters
 * this GPU updates; @comp_step: the step's compute, under which a
 * delayed update hides. */
static void
offload_optimizer_terms (const Estimate *E, StowCost *out, double opt_params,
                         double comp_step)
{
  const StowModel *m = E->m;
  const StowCluster *c = E->c;
  const StowLayout *l = E->l;
  const StowCostOptions *o = E->o;
  const StowGpu *gpu = E->gpu;
  guint per_node = E->per_node;
  guint64 mb = E->mb, stage_layers_max = E->stage_layers_max;
  double eb = E->eb, master = E->master, states = E->states;
  double mb_bwd = E->stage_bwd_max, stage_params_max = E->stage_params_max;
  double down = opt_params * eb / gpu->pcie_bw;
  double up = opt_params * eb / gpu->pcie_bw;
  double cpu = (double)per_node * opt_params
               * (o->cpu_adam_bytes_per_param * (states + master) / 12.0)
               / MAX (c->node.host_mem_bw, 1e9);
  double nvme = 0, phase = cpu;
  if (l->offload_optimizer == STOW_OFFLOAD_NVME)
    {
      /* master weights and states (12 B for Adam) read and written
       * per step through the node's drives, pipelined with the CPU
       * update (read i+1, update i, write i-1).  A drive's reads and
       * writes share its queue, the busiest drive sets the pace, and
       * the update overlaps: core/drives.h, the rule the simulator
       * and `stowage bench swapper` use too. */
      double bytes = (double)per_node * opt_params * (master + states);
      StowDriveSeconds drives[MAX (c->node.n_nvme, 1)];
      guint nd = stow_cost_nvme_drive_seconds (&c->node, bytes, bytes, drives);
      nvme = stow_drives_io_s (drives, nd, NULL);
      phase = stow_drives_step_bound_s (drives, nd, cpu, NULL);
    }
  out->total_s[STOW_COST_OFFLOAD_PCIE] = (double)mb * down + up;
  out->total_s[STOW_COST_CPU_OPTIMIZER] = cpu;
  out->total_s[STOW_COST_NVME] = nvme;
  double down_exposed = (double)mb * MAX (0.0, down - mb_bwd);
  if (o->delayed_update)
    {
      /* One-step delayed update (ZeRO-Offload §4.3): the CPU step and
       * the upload run under the next step's forward and backward. */
      double hidden = MAX (0.0, phase + up - comp_step);
      out->exposed_s[STOW_COST_OFFLOAD_PCIE] = down_exposed;
      out->exposed_s[STOW_COST_CPU_OPTIMIZER]
          = phase > 0 ? hidden * cpu / (phase + up) : 0;
      out->exposed_s[STOW_COST_NVME]
          = phase > 0 ? hidden * (phase - cpu) / (phase + up) : 0;
      out->exposed_s[STOW_COST_OFFLOAD_PCIE] += hidden * up / (phase + up);
    }
  else if (l->engine == STOW_ENGINE_STOWAGE
           && l->offload_optimizer == STOW_OFFLOAD_CPU)
    {
      /* Our engine updates each layer's shard as soon as the last
       * micro-batch's backward has brought its gradients down, and
       * uploads it when done (the step program's lowering): the CPU
       * step hides behind that backward, but not the update of the
       * unit whose gradients come last (the first stage's embedding,
       * a third of a small model), nor its upload. */
      double units = (double)MAX (stage_layers_max, 1);
      double window = mb_bwd * (1.0 - 1.0 / units);
      double last = 1.0 / units;
      if (stage_params_max > 0)
        last = MAX (last,
                    (double)m->embedding_params / l->tp / stage_params_max);
      last = MIN (last, 1.0);
      out->exposed_s[STOW_COST_OFFLOAD_PCIE] = down_exposed + up * last;
      out->exposed_s[STOW_COST_CPU_OPTIMIZER] = MAX (cpu * last, cpu - window);
    }
  else
    {
      /* DeepSpeed (and our NVMe swapper) step after the backward:
       * ZeRO-Infinity lists the optimizer states as not overlapped. */
      out->exposed_s[STOW_COST_OFFLOAD_PCIE] = down_exposed + up;
      out->exposed_s[STOW_COST_CPU_OPTIMIZER] = cpu;
      out->exposed_s[STOW_COST_NVME] = phase - cpu;
    }
}

/* The optimizer step.  Each GPU updates its shard (ZeRO >= 1): the
 * routed experts' only over their expert-data-parallel group, as the
 * memory model holds them (planner/memory.c, sharded_params). */
static void
optimizer_terms (const Estimate *E, StowCost *out)
{
  const StowLayout *l = E->l;
  guint64 n_shard = E->n_shard;
  double eb = E->eb, hbm = E->hbm, grad_b = E->grad_b;
  double w_b = E->w_b, master = E->master, states = E->states;
  double trainable = E->trainable, ex_trainable = E->ex_trainable;
  double shard_div = l->zero >= 1 ? (double)MAX (n_shard, 1) : 1.0;
  double ex_shard_div
      = l->zero >= 1 ? (double)stow_layout_expert_dp (l, n_shard) : 1.0;
  double opt_params = trainable / shard_div + ex_trainable / ex_shard_div;
  double comp_step = E->pp_time + out->exposed_s[STOW_COST_PP_P2P];
  if (l->offload_optimizer == STOW_OFFLOAD_NONE)
    {
      /* master weights and states read and written, the gradient read,
       * the low-precision weights written; without a master (fp32
       * parameters) the weights themselves read and written */
      double bytes
          = 2.0 * (master + states) + grad_b + (master > 0 ? eb : 2.0 * w_b);
      out->total_s[STOW_COST_OPTIMIZER] = out->exposed_s[STOW_COST_OPTIMIZER]
          = opt_params * bytes / hbm;
    }
  else
    offload_optimizer_terms (E, out, opt_params, comp_step);
}

/* Parameter streaming and checkpoint offload, per micro-batch. */
static void
offload_traffic_terms (const Estimate *E, StowCost *out)
{
  double mb = (double)E->mb;
  out->total_s[STOW_COST_OFFLOAD_PCIE]
      += mb * (E->param_stream_total_s + E->act_offload_s);
  out->exposed_s[STOW_COST_OFFLOAD_PCIE]
      += mb * (E->param_stream_s + E->act_offload_s);
}

/* The step and the rates. */
static void
step_rates (const Estimate *E, StowCost *out)
{
  const StowCluster *c = E->c;
  const StowTraining *t = E->t;
  const StowLayout *l = E->l;
  guint64 mb = E->mb;
  double s = E->s, peak = E->rates.peak;
  double model_fwd_flops = E->model_fwd_flops;
  double recompute_flops = E->recompute_flops;
  gboolean lora = E->lora;
  double step = 0;
  for (int k = 0; k < STOW_N_COSTS; k++)
    step += out->exposed_s[k];
  out->step_time_s = step;
  out->microbatch_s = E->t_max;
  double replicas_tokens
      = t->global_batch
            ? (double)t->global_batch * s
            : (double)l->dp * (double)l->micro_batch * (double)mb * s;
  double seqs_per_mb_replica = (double)l->micro_batch;
  /* model_fwd_flops is one micro-batch on one replica's cp-slice and tp
   * rank multiplied back by tp: scale by cp to the whole sequence, then
   * by the micro-batches of the step. */
  double per_token = model_fwd_flops * l->cp / (seqs_per_mb_replica * s);
  double rec_per_token = recompute_flops * l->cp / (seqs_per_mb_replica * s);
  double bwd_mult = lora ? 2.0 : 3.0;
  out->tokens_per_step = replicas_tokens;
  out->model_flops_per_step = bwd_mult * per_token * replicas_tokens;
  out->hw_flops_per_step
      = out->model_flops_per_step + rec_per_token * replicas_tokens;
  guint64 gpus = MAX (c->n_gpus, 1);
  out->tokens_per_s = step > 0 ? replicas_tokens / step : 0;
  out->tokens_per_s_per_gpu = out->tokens_per_s / (double)gpus;
  out->tflops_per_gpu
      = step > 0 ? out->model_flops_per_step / step / (double)gpus / 1e12 : 0;
  out->hw_tflops_per_gpu
      = step > 0 ? out->hw_flops_per_step / step / (double)gpus / 1e12 : 0;
  out->peak_flops = peak;
  out->mfu = out->tflops_per_gpu * 1e12 / peak;
  out->hfu = out->hw_tflops_per_gpu * 1e12 / peak;
  out->dominant = STOW_COST_COMPUTE;
  out->dominant_overhead = STOW_COST_RECOMPUTE;
  double best_over = -1;
  for (int k = 0; k < STOW_N_COSTS; k++)
    {
      if (out->exposed_s[k] > out->exposed_s[out->dominant])
        out->dominant = k;
      if (k != STOW_COST_COMPUTE && out->exposed_s[k] > best_over)
        best_over = out->exposed_s[k], out->dominant_overhead = k;
    }
}

void
stow_cost_estimate_parts (const StowModel *m, const StowCluster *c,
                          const StowTraining *t, const StowLayout *l,
                          const StowCostOptions *options, StowCost *out)
{
  StowCostOptions defaults;
  const StowCostOptions *o = options;
  if (o == NULL)
    {
      stow_cost_options_init (&defaults);
      o = &defaults;
    }
  memset (out, 0, sizeof *out);
  g_return_if_fail (m != NULL && c != NULL && t != NULL && l != NULL);

  Estimate E;
  estimate_init (&E, m, c, t, l, o);
  guint64 counts_stack[512];
  g_autofree guint64 *counts_heap = NULL;
  guint64 *counts = counts_stack;
  if (l->pp > G_N_ELEMENTS (counts_stack))
    counts = counts_heap = g_new0 (guint64, l->pp);
  stow_layout_stage_layers (l, m->n_layers, counts);
  E.counts = counts;

  price_stages (&E);
  pipeline_terms (&E, out);
  p2p_terms (&E, out);
  state_bytes (&E);
  dp_terms (&E, out);
  optimizer_terms (&E, out);
  offload_traffic_terms (&E, out);
  step_rates (&E, out);
}

gboolean
stow_cost_estimate_checked (const StowPlan *p, const StowCostOptions *o,
                            StowCost *out, GError **error)
{
  g_return_val_if_fail (p != NULL && p->model != NULL && p->cluster != NULL
                            && out != NULL,
                        FALSE);
  if (!stow_layout_validate (&p->layout, &p->training, p->model, p->cluster,
                             error))
    return FALSE;
  stow_cost_estimate (p, o, out);
  return TRUE;
}

void
stow_cost_estimate (const StowPlan *p, const StowCostOptions *options,
                    StowCost *out)
{
  g_return_if_fail (p != NULL);
  stow_cost_estimate_parts (p->model, p->cluster, &p->training, &p->layout,
                            options, out);
}

/* ---- explaining a ranking ---------------------------------------------- */

static void
diff_u (GString *s, const char *name, guint64 a, guint64 b, gboolean *first)
{
  if (a == b)
    return;
  g_string_append_printf (s, "%s%s %" G_GUINT64_FORMAT " vs %" G_GUINT64_FORMAT,
                          *first ? "" : ", ", name, a, b);
  *first = FALSE;
}

static void
diff_s (GString *s, const char *name, const char *a, const char *b,
        gboolean *first)
{
  if (strcmp (a, b) == 0)
    return;
  g_string_append_printf (s, "%s%s %s vs %s", *first ? "" : ", ", name, a, b);
  *first = FALSE;
}

static const char *
recompute_label (const StowLayout *l, char *buf, gsize n)
{
  if (l->recompute == STOW_RECOMPUTE_FULL && l->recompute_layers)
    g_snprintf (buf, n, "full:%u", l->recompute_layers);
  else
    g_strlcpy (buf, stow_recompute_name (l->recompute), n);
  return buf;
}

void
stow_cost_explain_difference (GString *out, const StowLayout *a,
                              const StowCost *ca, const StowLayout *b,
                              const StowCost *cb)
{
  gboolean first = TRUE;
  char ra[32], rb[32];
  g_string_append (out, "layout: ");
  diff_u (out, "tp", a->tp, b->tp, &first);
  diff_u (out, "pp", a->pp, b->pp, &first);
  diff_u (out, "vpp", a->vpp, b->vpp, &first);
  diff_u (out, "dp", a->dp, b->dp, &first);
  diff_u (out, "cp", a->cp, b->cp, &first);
  diff_u (out, "ep", a->ep, b->ep, &first);
  diff_u (out, "etp", stow_layout_etp (a), stow_layout_etp (b), &first);
  diff_s (out, "sp", a->sp ? "on" : "off", b->sp ? "on" : "off", &first);
  diff_u (out, "zero", a->zero, b->zero, &first);
  diff_s (out, "optimizer offload", stow_offload_name (a->offload_optimizer),
          stow_offload_name (b->offload_optimizer), &first);
  diff_s (out, "param offload", stow_offload_name (a->offload_params),
          stow_offload_name (b->offload_params), &first);
  diff_s (out, "checkpoint offload", a->offload_activations ? "cpu" : "none",
          b->offload_activations ? "cpu" : "none", &first);
  diff_s (out, "recompute", recompute_label (a, ra, sizeof ra),
          recompute_label (b, rb, sizeof rb), &first);
  diff_u (out, "micro-batch", a->micro_batch, b->micro_batch, &first);
  diff_u (out, "accumulation", a->grad_accum, b->grad_accum, &first);
  if (first)
    g_string_append (out, "same");
  g_string_append_printf (out, "; step %.4g s vs %.4g s", ca->step_time_s,
                          cb->step_time_s);
  /* The exposed terms that moved, largest change first. */
  int order[STOW_N_COSTS];
  for (int k = 0; k < STOW_N_COSTS; k++)
    order[k] = k;
  for (int i = 1; i < STOW_N_COSTS; i++)
    for (int j = i; j > 0; j--)
      {
        double dj = fabs (ca->exposed_s[order[j]] - cb->exposed_s[order[j]]);
        double dp
            = fabs (ca->exposed_s[order[j - 1]] - cb->exposed_s[order[j - 1]]);
        if (dj <= dp)
          break;
        int tmp = order[j];
        order[j] = order[j - 1];
        order[j - 1] = tmp;
      }
  gboolean any = FALSE;
  for (int i = 0; i < STOW_N_COSTS; i++)
    {
      int k = order[i];
      double d = ca->exposed_s[k] - cb->exposed_s[k];
      if (fabs (d) < 1e-4 * MAX (cb->step_time_s, 1e-9))
        continue;
      g_string_append_printf (out, "%s%s %+.4g s", any ? ", " : "; ",
                              stow_cost_kind_name (k), d);
      any = TRUE;
    }
  if (!any)
    g_string_append (out, "; the same predicted time (ties go to the "
                          "layout with more memory headroom)");
}

void
stow_cost_ends_seconds (const StowPlan *p, StowEndsSeconds *out)
{
  g_return_if_fail (p != NULL && p->model != NULL);
  const StowModel *m = p->model;
  const StowCluster *c = p->cluster;
  const StowTraining *t = &p->training;
  const StowLayout *l = &p->layout;
  StowCostOptions o;
  Rates r;
  stow_cost_options_init (&o);
  rates_init (&c->node.gpu, t, &o, &r);
  ends_cost (m, c, t, l, &o, &r, out);
}

void
stow_cost_layer_seconds (const StowPlan *p, gboolean moe, StowLayerSeconds *out)
{
  g_return_if_fail (p != NULL && p->model != NULL);
  const StowModel *m = p->model;
  const StowCluster *c = p->cluster;
  const StowTraining *t = &p->training;
  const StowLayout *l = &p->layout;
  StowCostOptions o;
  LayerCost lc;
  Rates r;
  stow_cost_options_init (&o);
  rates_init (&c->node.gpu, t, &o, &r);
  layer_cost (m, c, t, l, &o, moe && m->n_experts > 0, &r, &lc);
  layer_pass_seconds (&lc, &out->forward_s, &out->backward_s);
  out->selective_s = lc.fwd_attn_s + lc.core_elem_s;
}

guint
stow_cost_nvme_drive_seconds (const StowNode *node, double read_bytes,
                              double write_bytes, StowDriveSeconds *out)
{
  g_return_val_if_fail (node != NULL && out != NULL, 0);
  /* A floor for drives without a rate (and a node without drives): a
   * slow disk, not a free one. */
  const double floor_bw = 1e8;
  guint n = MAX (node->n_nvme, 1);
  for (guint i = 0; i < n; i++)
    {
      double rd = i < node->n_nvme ? node->nvme[i].read_bw : 0;
      double wr = i < node->n_nvme ? node->nvme[i].write_bw : 0;
      out[i].read_s = read_bytes / n / MAX (rd, floor_bw);
      out[i].write_s = write_bytes / n / MAX (wr, floor_bw);
    }
  return n;
}
