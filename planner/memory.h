/* SPDX-License-Identifier: MIT
 *
 * planner/memory.h: every byte of a training layout, per GPU for each
 * pipeline stage, per host and per node's NVMe, as a list of named terms
 * with the formula that produced each.  A pure closed-form model: no I/O,
 * no allocation beyond the result, microseconds per layout.  Conventions
 * reproduce peers' published estimators digit for digit.
 */
#pragma once

#include <glib.h>

#include "hw/hw.h"
#include "models/model.h"
#include "planner/layout.h"
#include "program/program.h" /* StowTier */

G_BEGIN_DECLS

/* planner/plan.h */
typedef struct StowPlan StowPlan;

typedef enum
{
  STOW_CONVENTION_STOWAGE,
  STOW_CONVENTION_ZERO_PAPER,               /* Rajbhandari et al. 2020, §5 */
  STOW_CONVENTION_DEEPSPEED_ESTIMATOR,      /* estimate_zero{2,3}_..., code */
  STOW_CONVENTION_DEEPSPEED_ESTIMATOR_DOCS, /* the formula memory.rst prints */
  STOW_CONVENTION_MEGATRON_THEORETICAL,     /* theoretical_memory_usage.py */
} StowConvention;

const char *stow_convention_name (StowConvention c);
gboolean stow_convention_parse (const char *s, const char *field,
                                StowConvention *out, GError **error);

/* Overheads and switches, each with a documented default (see
 * docs/memory-model.md for the sources). */
typedef struct
{
  StowConvention convention;
  gint zero_init;                     /* deepspeed-estimator: 0 or 1 (1) */
  guint64 params_override;            /* --params: stands in for the model */
  guint64 largest_layer_override;     /* --largest-layer */
  guint64 cuda_context_bytes;         /* per GPU process */
  guint64 workspace_bytes;            /* cuBLAS/cuBLASLt workspaces */
  guint64 nccl_bytes_per_group;       /* per communicator of size > 1 */
  double fragmentation;               /* allocator slack, fraction of peak */
  guint64 safety_margin_bytes;        /* subtracted from the GPU's capacity */
  guint64 host_process_bytes;         /* per rank: the framework's own RSS */
  guint64 cpu_optimizer_buffer_bytes; /* deepspeed: DeepSpeedCPUAdam's pinned
                                         copy buffers, per rank */
  guint64 vocab_multiple;             /* megatron: pad V to this x tp; 0 none */
  guint64 swap_shard_params;          /* optimizer swap shard, parameters */
  guint64 reduce_bucket_elements;     /* deepspeed reduce_bucket_size (5e8) */
  guint64 prefetch_bucket_elements;   /* stage3_prefetch_bucket_size (5e7) */
  guint64 reuse_distance_elements;    /* stage3_max_reuse_distance (1e9) */
  gint overlap_comm; /* deepspeed: -1 default (off), 0 off, 1 on: two
                        buckets at stages 1 and 2 */
  gint free_grads;   /* gradients freed between steps
                        (zero_grad(set_to_none=True)): -1 auto,
                        on for the pytorch and fsdp engines */
} StowMemOptions;

void stow_mem_options_init (StowMemOptions *o);

typedef struct
{
  const char *name; /* static: "parameters", "gradients", ... */
  guint64 bytes;
  char *formula; /* how the bytes came about, with the numbers */
  StowTier tier;
} StowMemTerm;

typedef struct
{
  guint stage;
  guint64 layers;          /* transformer layers on this stage */
  guint64 params;          /* parameters on one GPU of it, before ZeRO */
  GArray *terms;           /* StowMemTerm, device tier */
  guint64 allocated_bytes; /* tensors: max_memory_allocated */
  guint64 reserved_bytes;  /* + allocator slack: max_memory_reserved */
  guint64 total_bytes;     /* + context, workspaces, NCCL: nvidia-smi */
} StowStageMemory;

typedef struct
{
  StowConvention convention;
  StowStageMemory *stages;
  guint n_stages;
  guint peak_stage; /* the stage with the largest total */
  /* Device numbers are the peak stage's. */
  guint64 allocated_peak_bytes;
  guint64 reserved_bytes;
  guint64 total_bytes;
  guint64 capacity_bytes; /* usable: GPU total minus the margin */
  /* Per host (node). */
  GArray *host_terms; /* StowMemTerm, pinned or host tier */
  guint64 host_pinned_bytes;
  guint64 host_pageable_bytes;
  guint64 host_total_bytes;
  guint64 host_capacity_bytes;
  /* Per node's NVMe drives together. */
  GArray *nvme_terms;
  guint64 nvme_bytes;
  guint64 nvme_capacity_bytes;
  gboolean fits_device, fits_host, fits_nvme, fits;
} StowMemory;

/* Estimates @layout.  @model may be NULL only under a peer convention with
 * options->params_override set.  Fails with STOW_PLAN_ERROR_INVALID for a
 * layout that cannot run (see stow_layout_validate) or a convention that
 * does not cover it (e.g. ZeRO-1 under deepspeed-estimator). */
StowMemory *stow_memory_estimate (const StowPlan *plan, GError **error);
void stow_memory_free (StowMemory *mem);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowMemory, stow_memory_free)

/* The totals of stow_memory_estimate (stowage convention: the same
 * arithmetic run into per-tier sums, no terms, no formulas), for the
 * search: about a microsecond per layout. */
typedef struct
{
  guint64 total_bytes; /* peak stage, device (nvidia-smi view) */
  guint64 allocated_peak_bytes;
  guint64 capacity_bytes;
  guint peak_stage;
  guint64 host_total_bytes, host_capacity_bytes;
  guint64 nvme_bytes, nvme_capacity_bytes;
  gboolean fits_device, fits_host, fits_nvme, fits;
} StowMemTotals;

/* What the totals path reuses across calls for one model (a search holds
 * one): its sinks, so that it allocates nothing per layout, and the
 * model's layer table, built once, so that no layout walks the layers.
 * @model may be NULL (a peer convention's --params), and must outlive the
 * scratch; the scratch serves estimates of @model only. */
typedef struct _StowMemScratch StowMemScratch;
StowMemScratch *stow_mem_scratch_new (const StowModel *model);
void stow_mem_scratch_free (StowMemScratch *scratch);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowMemScratch, stow_mem_scratch_free)
/* The totals of @plan, with @scratch (may be NULL), made for its model. */
gboolean stow_memory_estimate_totals (const StowPlan *plan,
                                      StowMemScratch *scratch,
                                      StowMemTotals *out, GError **error);

/* The per-layer activation bytes of one micro-batch (Korthikanti et al.
 * 2022, Table 2, generalised to GQA, gated MLPs and flash attention), for
 * one GPU of a layout: exposed for tests and the time model.  Under
 * Transformer Engine fp8 (--engine megatron or nemo) it counts the
 * tensors as a bf16 run saves them; the memory totals charge TE's 1-byte
 * copies of the linear inputs instead. */
guint64 stow_memory_layer_activations (const StowPlan *plan);

/* With --offload-params and resident_layers STOW_RESIDENT_AUTO: decides
 * how many layers per stage stay on the device (the device budget left
 * after the peak with none, in whole layers) and sets it in @plan's
 * layout.  Otherwise leaves the layout as it is.  Fails as
 * stow_memory_estimate. */
gboolean stow_plan_resolve_resident (StowPlan *plan, GError **error);

/* accelerate's `estimate-memory` table (src/accelerate/commands/estimate.py
 * gather_data and estimate_training_usage; utils/modeling.py
 * calculate_maximum_sizes): the model built on the meta device in fp32,
 * its parameters and buffers summed, divided by 2, 4 and 8 for float16,
 * int8 and int4; training with Adam 4x the fp32 size for float32 (model,
 * gradients, two states) and 2x it, 4x the float16 size, for float16
 * (fp32 master, 1.5x for gradients, 2x for states, the max of them); none
 * for int8 and int4 (-1 in accelerate, "N/A").  The largest layer is the
 * largest module accelerate will not split: a whole decoder or encoder
 * layer (transformers' _no_split_modules), else the largest leaf module
 * (BERT, as accelerate's docs print it). */
typedef struct
{
  const char *dtype; /* "float32", "float16", "int8", "int4" */
  double largest_layer_bytes;
  double total_bytes;
  double training_bytes; /* < 0: not estimated (N/A) */
} StowAccelerateRow;

#define STOW_ACCELERATE_ROWS 4
void stow_accelerate_estimate (const StowModel *model,
                               StowAccelerateRow rows[STOW_ACCELERATE_ROWS]);

G_END_DECLS
