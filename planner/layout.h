/* SPDX-License-Identifier: MIT
 *
 * planner/layout.h: what is being trained (StowTraining) and how it is laid
 * out on the cluster (StowLayout): parallel degrees, ZeRO stage, offload,
 * recomputation, micro-batching and the engine that will run it.  Plain
 * value types with names for every enum value (used by the CLI, JSON and
 * plan files) and a validator that names the offending field.
 */
#pragma once

#include <glib.h>

#include "core/optim.h"
#include "hw/hw.h"
#include "models/model.h"

G_BEGIN_DECLS

#define STOW_PLAN_ERROR (stow_plan_error_quark ())
GQuark stow_plan_error_quark (void);

typedef enum
{
  STOW_PLAN_ERROR_INVALID, /* a layout or setting that cannot work */
  STOW_PLAN_ERROR_PARSE,   /* a value that is not one of the names */
} StowPlanError;

typedef enum
{
  STOW_PRECISION_FP32,
  STOW_PRECISION_FP16,      /* fp16 compute, fp32 master weights */
  STOW_PRECISION_BF16,      /* bf16 compute, fp32 master weights */
  STOW_PRECISION_FP8,       /* fp8 GEMMs, bf16 weights, fp32 master weights */
  STOW_PRECISION_BF16_PURE, /* bf16 weights and optimizer states, no master
                               copy (torchtune's default) */
} StowPrecision;

typedef enum
{
  STOW_OPTIMIZER_ADAMW,
  STOW_OPTIMIZER_ADAMW_8BIT,
  STOW_OPTIMIZER_SGD, /* with momentum */
  STOW_OPTIMIZER_ADAFACTOR,
  STOW_OPTIMIZER_LION,
} StowOptimizer;

typedef enum
{
  STOW_FINETUNE_FULL,
  STOW_FINETUNE_LORA,
  STOW_FINETUNE_QLORA, /* 4-bit NF4 base, double quantisation */
} StowFinetune;

typedef enum
{
  STOW_OFFLOAD_NONE,
  STOW_OFFLOAD_CPU,
  STOW_OFFLOAD_NVME,
} StowOffload;

typedef enum
{
  STOW_RECOMPUTE_NONE,
  STOW_RECOMPUTE_SELECTIVE, /* core attention only (Korthikanti et al.) */
  STOW_RECOMPUTE_FULL,      /* every layer, or the first k of each stage */
  STOW_RECOMPUTE_OP, /* torchtitan's selective op checkpointing: every layer
                        keeps its input, its attention output and every
                        second matmul's output, and rebuilds the rest */
} StowRecompute;

typedef enum
{
  STOW_SCHEDULE_1F1B,
  STOW_SCHEDULE_INTERLEAVED, /* interleaved 1F1B with vpp model chunks */
  STOW_SCHEDULE_GPIPE,
} StowSchedule;

typedef enum
{
  STOW_ENGINE_STOWAGE,
  STOW_ENGINE_PYTORCH, /* plain PyTorch + caching allocator, one device */
  STOW_ENGINE_DEEPSPEED,
  STOW_ENGINE_MEGATRON, /* Megatron-LM core_r0.8.0 */
  STOW_ENGINE_FSDP,
  STOW_ENGINE_NEMO, /* Megatron-core under NeMo 24.07's recipes */
} StowEngine;

/* Bounds on what a plan may ask for: far past any training run, and low
 * enough that no product in the memory and time models overflows 64 bits
 * (the s^2 attention scores of a micro-batch fit with room to spare).
 * stow_layout_validate and the command-line flags refuse values beyond
 * them, naming the limit. */
#define STOW_MAX_SEQ_TOKENS         ((guint64)1 << 24) /* 16,777,216 per sequence */
#define STOW_MAX_MICRO_BATCH        ((guint64)1 << 16) /* 65,536 sequences */
#define STOW_MAX_MICRO_BATCH_TOKENS ((guint64)1 << 30) /* 1,073,741,824 */
#define STOW_MAX_GLOBAL_BATCH       ((guint64)1 << 24) /* 16,777,216 sequences */
#define STOW_MAX_GRAD_ACCUM         ((guint64)1 << 24) /* micro-batches per step */
#define STOW_MAX_LORA_RANK          ((guint64)1 << 16)

typedef struct
{
  guint64 seq_len;         /* tokens per sequence */
  guint64 decoder_seq_len; /* encoder-decoder models: the decoder's tokens
                              per sequence; 0 = seq_len */
  guint64 global_batch;    /* sequences per optimizer step */
  StowPrecision precision;
  StowOptimizer optimizer;
  StowFinetune finetune;
  guint64 lora_rank;
  guint lora_targets;    /* bit set of StowLoraTarget; 0 = q and v */
  gboolean lora_dropout; /* dropout on each adapter's input (PEFT's
                            lora_dropout > 0): the adapter keeps its own
                            dropped copy of the input and the mask */
  gboolean flash_attention;
  gboolean chunked_loss; /* cross-entropy in chunks: no full fp32 logits */
  gboolean fused_loss;   /* one cross-entropy kernel over the 16-bit logits,
                            which keeps them and writes their 16-bit
                            gradient (flash-attn's CrossEntropyLoss, as
                            llm-foundry trains MPT) */
  gboolean dropout;      /* dropout masks are kept (1 byte per element) */
  gboolean optimizer_in_backward; /* each parameter steps as its gradient
                                     arrives; gradients never all live */
  gboolean compiled; /* torch.compile: eager modules' elementwise ops fused,
                        so they keep what fused kernels keep */
  /* The optimizer's hyperparameters, schedule, clipping and length: what
   * the lowering puts in the program and the engine configs write out
   * (memory and time do not depend on them). */
  StowOptimSettings optim;
} StowTraining;

typedef enum
{
  STOW_LORA_Q = 1 << 0,
  STOW_LORA_K = 1 << 1,
  STOW_LORA_V = 1 << 2,
  STOW_LORA_O = 1 << 3,
  STOW_LORA_GATE = 1 << 4,
  STOW_LORA_UP = 1 << 5,
  STOW_LORA_DOWN = 1 << 6,
  STOW_LORA_ALL = 0x7f,
} StowLoraTarget;

typedef struct
{
  guint dp, tp, pp, vpp, cp, ep; /* vpp = 1 without interleaving */
  guint etp;                     /* expert tensor parallelism (Megatron-core's
                                    --expert-tensor-parallel-size): the TP degree of the routed
                                    experts' linears; 0 = as --tp, Megatron's default.  Read it
                                    through stow_layout_etp. */
  gboolean sp;                   /* sequence parallel (needs tp > 1) */
  /* The embedding and the loss each take a layer's place in the pipeline
   * split (Megatron-core's --account-for-embedding-in-pipeline-split and
   * --account-for-loss-in-pipeline-split; Llama 3 405B: 126 layers + 2 on
   * 16 stages of 8, the first and last holding 7).  With it pp x vpp must
   * divide the layers + 2, and interleaving is allowed where the layers
   * alone do not divide. */
  gboolean pp_split_ends;
  guint zero;            /* 0..3 */
  gboolean hybrid_shard; /* HSDP: shard inside a node only */
  StowOffload offload_optimizer;
  StowOffload offload_params;
  gboolean offload_activations; /* checkpoints to pinned host memory */
  StowRecompute recompute;
  guint recompute_layers; /* FULL: first k layers of each stage, or of
                             each model chunk when interleaved; 0=all */
  guint64 micro_batch;
  guint64 grad_accum; /* micro-batches per step per replica */
  StowSchedule schedule;
  StowEngine engine;
  /* With --offload-params: layers per stage kept on the device, the rest
   * streamed through two slots.  STOW_RESIDENT_AUTO until decided, once,
   * by stow_layout_resolve_resident (planner/resident.c); memory, time,
   * lowering and the plan file all read the decided value. */
  guint resident_layers;
} StowLayout;

#define STOW_RESIDENT_AUTO G_MAXUINT

void stow_training_init (StowTraining *t);
void stow_layout_init (StowLayout *l);

/* Names used on the command line, in JSON and in plan files. */
const char *stow_precision_name (StowPrecision v);
const char *stow_optimizer_name (StowOptimizer v);
const char *stow_finetune_name (StowFinetune v);
const char *stow_offload_name (StowOffload v);
const char *stow_recompute_name (StowRecompute v);
const char *stow_schedule_name (StowSchedule v);
const char *stow_engine_name (StowEngine v);

/* Parse a name (case-insensitive; accepts the usual synonyms, e.g. "adam"
 * for AdamW, "bf16-mixed", FSDP's "FULL_SHARD" for ZeRO 3).  @field names
 * the option in the error ("--optimizer"). */
gboolean stow_precision_parse (const char *s, const char *field,
                               StowPrecision *out, GError **error);
gboolean stow_optimizer_parse (const char *s, const char *field,
                               StowOptimizer *out, GError **error);
gboolean stow_finetune_parse (const char *s, const char *field,
                              StowFinetune *out, GError **error);
gboolean stow_offload_parse (const char *s, const char *field, StowOffload *out,
                             GError **error);
gboolean stow_recompute_parse (const char *s, const char *field,
                               StowRecompute *out, guint *layers,
                               GError **error);
gboolean stow_schedule_parse (const char *s, const char *field,
                              StowSchedule *out, GError **error);
gboolean stow_engine_parse (const char *s, const char *field, StowEngine *out,
                            GError **error);
/* Whether @e runs Megatron-core's model code (Megatron-LM itself, or NeMo
 * on top of it): the same Transformer Engine layers, vocabulary padding,
 * loss and parallel groups; the engines differ in their optimizer and
 * gradient buffers (planner/memory.c). */
gboolean stow_engine_is_mcore (StowEngine e);
/* "q,v", "q,k,v,o,gate,up,down" or "all" into a StowLoraTarget set. */
gboolean stow_lora_targets_parse (const char *s, const char *field, guint *out,
                                  GError **error);
/* "q,v" for a set (owned by the caller). */
char *stow_lora_targets_name (guint targets);

/* "0".."3" or an FSDP strategy name (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD,
 * HYBRID_SHARD); sets *hybrid for HYBRID_SHARD. */
gboolean stow_zero_parse (const char *s, const char *field, guint *stage,
                          gboolean *hybrid, GError **error);

/* Checks that @layout can run @model on @cluster: degrees multiply to the
 * GPU count, tp divides heads and kv heads, pp divides layers, ep divides
 * experts, cp divides the sequence, the batch divides into micro-batches,
 * offload combinations are legal for the engine.  The message names the
 * field and the values ("--tp 3 does not divide num_attention_heads 64"). */
gboolean stow_layout_validate (const StowLayout *layout,
                               const StowTraining *training,
                               const StowModel *model,
                               const StowCluster *cluster, GError **error);

/* Checks that @training can run on @model's checkpoint: a quantized
 * checkpoint (GPTQ, AWQ, bitsandbytes, fp8) trains adapters only, since
 * its quantized weights take no gradient; full fine-tuning of one is
 * STOW_PLAN_ERROR_INVALID naming the quantization and what to do. */
gboolean stow_training_check_model (const StowTraining *training,
                                    const StowModel *model, GError **error);

/* Checks @training's precision against @gpu.  fp8 on a GPU without fp8
 * tensor cores (no fp8 rate: A100, V100, ...) is STOW_PLAN_ERROR_INVALID
 * naming the flag, the GPU and why (no engine runs it).  bf16 on one
 * without bf16 tensor cores (V100, T4) runs, emulated by PyTorch: TRUE,
 * with the reason in @warning (may be NULL; free it), else NULL there. */
gboolean stow_training_check_gpu (const StowTraining *training,
                                  const StowGpu *gpu, char **warning,
                                  GError **error);

/* The routed experts' tensor-parallel degree: layout->etp, or --tp when
 * it is 0 (Megatron-core's default).  Each expert's linears are split over
 * it, and the expert grid is etp x ep x (expert data parallel) x pp =
 * the world (megatron/core/parallel_state.py, the expert rank generator). */
guint stow_layout_etp (const StowLayout *layout);

/* Ranks that hold the same slice of a routed expert, out of the @n ranks
 * ZeRO shards the dense parameters over (dp x cp, or a node's share under
 * HSDP): Megatron-core's expert data-parallel group, world / (etp x ep x
 * pp) = n x tp / (etp x ep); rounded down, never below 1.  ZeRO shards a
 * routed expert's parameters, gradients and optimizer states only that
 * many ways (also DeepSpeed-MoE's expert_data_parallel_group, dp /
 * ep_size, and torchtitan's dp_shard_mod_ep mesh). */
guint64 stow_layout_expert_dp (const StowLayout *layout, guint64 n);

/* Number of layers on each pipeline stage (@counts has layout->pp entries),
 * as even as possible with the remainder on the middle stages; with
 * pp_split_ends, (layers + 2) / pp each, less one on the first and last. */
void stow_layout_stage_layers (const StowLayout *layout, guint64 n_layers,
                               guint64 *counts);

/* The run of layers `--recompute full:K` counts in: a stage, or under
 * interleaving one model chunk (Megatron's recompute_num_layers with
 * virtual stages).  The first K of each run are recomputed. */
guint64 stow_layout_recompute_run (const StowLayout *layout, guint64 n_layers);

/* The layer slots the pipeline split divides: the layers, plus the
 * embedding and the loss with pp_split_ends. */
guint64 stow_layout_split_slots (const StowLayout *layout, guint64 n_layers);

/* Layers recomputed on a stage of @stage_layers layers. */
guint64 stow_layout_recomputed_layers (const StowLayout *layout,
                                       guint64 n_layers, guint64 stage_layers);

G_END_DECLS
