/* SPDX-License-Identifier: MIT
 *
 * planner/cost.h: the time model.  Predicts one optimizer step of a layout:
 * compute per GEMM shape at a shape-dependent efficiency, tensor/context/
 * expert/pipeline/data-parallel communication from ring costs, the pipeline
 * bubble, the optimizer step and offload traffic (PCIe, CPU Adam, NVMe),
 * each split into the part hidden behind compute and the part exposed.
 * Closed form, no allocation: about a microsecond per layout.  The sources
 * of every constant are in docs/time-model.md.
 */
#pragma once

#include <glib.h>

#include "core/drives.h"
#include "hw/hw.h"
#include "models/model.h"
#include "planner/layout.h"
#include "planner/memory.h" /* StowPlan (planner/plan.h) */

G_BEGIN_DECLS

typedef enum
{
  STOW_COST_COMPUTE,       /* forward and backward: GEMMs, attention, rest */
  STOW_COST_RECOMPUTE,     /* the extra forward of activation recomputation */
  STOW_COST_TP,            /* tensor-parallel all-reduce / AG+RS (SP) */
  STOW_COST_CP,            /* context-parallel K/V ring exchange */
  STOW_COST_EP,            /* expert all-to-all */
  STOW_COST_PP_BUBBLE,     /* pipeline fill and drain */
  STOW_COST_PP_P2P,        /* pipeline point-to-point sends */
  STOW_COST_DP,            /* gradient reduction, ZeRO gathers */
  STOW_COST_OPTIMIZER,     /* the optimizer step on the GPU */
  STOW_COST_OFFLOAD_PCIE,  /* host <-> device: grads, params, checkpoints */
  STOW_COST_CPU_OPTIMIZER, /* the optimizer step on the host's cores */
  STOW_COST_NVME,          /* optimizer states or parameters on NVMe */
  STOW_N_COSTS
} StowCostKind;

/* "compute", "tp", "pp_bubble", ... as used in JSON. */
const char *stow_cost_kind_name (StowCostKind kind);

/* Efficiency constants; stow_cost_options_init sets the documented
 * defaults (docs/time-model.md says where each comes from). */
typedef struct
{
  /* GPUs with a profile of their own (stow_cost_gpu_efficiency) use it in
   * place of the next six; these are the A100-fitted defaults. */
  double gemm_eff_max;     /* fraction of peak a large GEMM reaches */
  double gemm_fp8_eff_max; /* the same for fp8 GEMMs, of the fp8 peak */
  double gemm_half_dim;  /* a dimension of this size halves that dim's share */
  double attn_fwd_eff;   /* flash attention forward, fraction of bf16 peak */
  double attn_bwd_eff;   /* its backward, 2.5x the forward's FLOPs */
  double attn_half_seq;  /* keys per kernel that halve both; 0: flat */
  gboolean gpu_profiles; /* use a GPU's own profile where it has one */
  double hbm_eff;        /* memory-bound kernels, fraction of HBM bandwidth */
  double nvlink_eff;     /* NCCL bus bandwidth / link bandwidth */
  double net_eff;        /* the same across nodes */
  double nvlink_latency_s; /* per ring step */
  /* Data-parallel rings as NCCL's own cost model prices one (tuning.cc,
   * Ring/Simple): a launch, then a latency per step, a step that crosses
   * nodes dearer than one inside a node. */
  double nccl_ring_base_s;         /* per collective */
  double nccl_intra_step_s;        /* per step inside a node, over NVLink */
  double nccl_pci_step_s;          /* the same between PCIe peers */
  double nccl_inter_step_s;        /* per step across nodes */
  double kernel_overhead_s;        /* launch and sync per layer pass */
  double overlap_slowdown;         /* compute lost per second of hidden comm */
  double offload_fetch_s;          /* per layer fetch from host memory */
  double nvme_fetch_s;             /* the same from NVMe */
  double cpu_adam_bytes_per_param; /* host memory traffic per parameter */
  gboolean delayed_update; /* one-step delayed parameter update (offload) */
  /* Megatron-core's overlaps: -1 as the engine runs by default (on for
   * --engine megatron), 0 off (Megatron-LM 2021-22), 1 on.
   * tp_comm_overlap: Transformer Engine's userbuffers run each tensor-
   * parallel all-gather / reduce-scatter (sequence parallelism) in chunks
   * under the GEMM that needs or makes it (--tp-comm-overlap).
   * p2p_overlap: the interleaved schedule posts its pipeline sends and
   * receives ahead and computes meanwhile (overlap_p2p_comm). */
  gint tp_comm_overlap;
  gint p2p_overlap;
  /* Optional, set by the search: prefix sums over the model's layers
   * (stow_cost_prepare) so a stage is priced without walking its layers.
   * Must belong to the model being estimated. */
  const struct _StowCostPrep *prep;
} StowCostOptions;

void stow_cost_options_init (StowCostOptions *options);

/* What a GPU's kernels reach, as fractions of its catalog peaks: the GEMM
 * ceiling (bf16/fp16 and fp8) and size curve, and flash attention's
 * forward and backward rates as the FlashAttention papers count them
 * (causal forward 2 s^2 a d per sequence, backward 2.5x that).  From the
 * GPU's own published measurements where stowage has them
 * (docs/time-model.md, "Constants per GPU"), else @options' defaults. */
typedef struct
{
  const char *gpu;     /* the profile's GPU, "default" without one */
  double gemm_eff_max; /* bf16/fp16/tf32 GEMMs */
  double gemm_fp8_eff_max;
  double gemm_half_dim;
  double attn_fwd_eff, attn_bwd_eff, attn_half_seq;
} StowGpuEfficiency;

void stow_cost_gpu_efficiency (const StowGpu *gpu,
                               const StowCostOptions *options,
                               StowGpuEfficiency *out);

/* Per-model sums the search reuses across layouts (see StowCostOptions). */
typedef struct _StowCostPrep StowCostPrep;
StowCostPrep *stow_cost_prepare (const StowModel *model);
void stow_cost_prep_free (StowCostPrep *prep);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowCostPrep, stow_cost_prep_free)

typedef struct
{
  double step_time_s;
  double tokens_per_step;
  double tokens_per_s; /* whole job */
  double tokens_per_s_per_gpu;
  double model_flops_per_step; /* whole job: 6 Phi tokens + attention */
  double hw_flops_per_step;    /* + the recomputed forward */
  double tflops_per_gpu;       /* model FLOPs, 1e12/s */
  double hw_tflops_per_gpu;
  double mfu, hfu;                /* of the GPU's dense peak at the precision */
  double peak_flops;              /* that peak, FLOP/s per GPU */
  double microbatch_s;            /* slowest stage, one micro-batch, fwd+bwd */
  double total_s[STOW_N_COSTS];   /* each term in full, hidden or not */
  double exposed_s[STOW_N_COSTS]; /* the part that adds to the step */
  StowCostKind dominant;          /* the largest exposed term */
  StowCostKind dominant_overhead; /* the largest exposed term but compute */
} StowCost;

/* Predicts @plan's step.  Its layout must be valid
 * (stow_layout_validate): the search calls this after the memory model
 * has checked it.  @options may be NULL for the defaults. */
void stow_cost_estimate (const StowPlan *plan, const StowCostOptions *options,
                         StowCost *out);

/* The same after validating the layout; FALSE with STOW_PLAN_ERROR_INVALID
 * naming the field when it cannot run. */
gboolean stow_cost_estimate_checked (const StowPlan *plan,
                                     const StowCostOptions *options,
                                     StowCost *out, GError **error);

/* The GPU's dense peak FLOP/s at @precision (falling back to the nearest
 * rate the catalog gives). */
double stow_cost_peak_flops (const StowGpu *gpu, StowPrecision precision);

/* One transformer layer's passes for one micro-batch on one GPU, priced
 * as stow_cost_estimate prices them: compute (GEMMs at their shapes, the
 * attention core, memory-bound kernels) and the pass's tensor-, context-
 * and expert-parallel communication.  For the step program's op costs. */
typedef struct
{
  double forward_s;   /* also a full recomputation */
  double backward_s;  /* without recomputation */
  double selective_s; /* what selective recomputation repeats: the core */
} StowLayerSeconds;

void stow_cost_layer_seconds (const StowPlan *plan, gboolean moe,
                              StowLayerSeconds *out);

/* A data-parallel collective as stow_cost_estimate prices it: @bytes over
 * @n ranks @stride apart, over NVLink inside a node first and then across
 * nodes, each GPU moving 1/local of the data over its own NIC.  @half: a
 * reduce-scatter or all-gather (n-1)/n of the data, else an all-reduce.
 * @options may be NULL for the defaults. */
double stow_cost_dp_collective_seconds (const StowCluster *cluster,
                                        const StowCostOptions *options,
                                        double bytes, guint64 n, guint64 stride,
                                        gboolean half);

/* One pipeline send of @bytes to a rank @stride ranks away. */
double stow_cost_p2p_seconds (const StowCluster *cluster,
                              const StowCostOptions *options, double bytes,
                              guint64 stride);

/* Seconds each of the node's drives spends on its share of @read_bytes read
 * and @write_bytes written, striped evenly over them (the NVMe store's
 * round-robin stripes), each at its catalog rate with a floor of 100 MB/s.
 * Fills @out, which must hold MAX (node->n_nvme, 1) entries (a node that
 * lists no drive gets one of 100 MB/s), and returns how many it filled.
 * The step's I/O and bound then follow core/drives.h's rule, as in
 * stow_cost_estimate and the sim backend. */
guint stow_cost_nvme_drive_seconds (const StowNode *node, double read_bytes,
                                    double write_bytes, StowDriveSeconds *out);

/* The embedding and the output layer with its loss, one micro-batch on
 * one GPU, as stow_cost_estimate prices them. */
typedef struct
{
  double embedding_fwd_s, embedding_bwd_s;
  double embedding_tp_s; /* vocab-parallel all-reduce of its output */
  double head_fwd_s, head_bwd_s;
} StowEndsSeconds;

void stow_cost_ends_seconds (const StowPlan *plan, StowEndsSeconds *out);

/* Appends to @out why @a is predicted faster (or slower) than @b: the
 * layout fields that differ and the exposed terms that moved, largest
 * first ("tp 8 -> 4: tp -1.20 s, compute +0.30 s"). */
void stow_cost_explain_difference (GString *out, const StowLayout *a,
                                   const StowCost *ca, const StowLayout *b,
                                   const StowCost *cb);

G_END_DECLS
