/* SPDX-License-Identifier: MIT
 *
 * planner/memory-private.h: helpers shared by the memory model
 * (memory.c), the peer conventions (conventions.c), the step program
 * (schedule.c) and the time model (cost.c).
 */
#pragma once

#include <math.h>

#include "planner/memory.h"

/* (guint64) llround (@v), rounding halves away from zero, without libm's
 * call where that is exact: a non-negative @v below 2^63 has an exact
 * integer part and fraction.  The search rounds a few million counts. */
static inline guint64
stow_mem_round (double v)
{
  if (v >= 0 && v < 0x1p63)
    {
      guint64 whole = (guint64)v;
      return v - (double)whole >= 0.5 ? whole + 1 : whole;
    }
  return (guint64)llround (v);
}

GArray *stow_mem_terms_new (void);
GArray *stow_mem_sink_new (void);
void stow_mem_add (GArray *terms, const char *name, guint64 bytes,
                   StowTier tier, const char *format, ...) G_GNUC_PRINTF (5, 6);
guint64 stow_mem_sum (GArray *terms, int tier);
guint64 stow_bytes (guint64 count, double bytes_per);
StowMemory *stow_memory_alloc (guint n_stages);
void stow_memory_finish (StowMemory *mem, const StowCluster *c,
                         const StowMemOptions *o);
StowMemory *
stow_memory_estimate_convention (const StowModel *m, const StowCluster *c,
                                 const StowTraining *t, const StowLayout *l,
                                 const StowMemOptions *o, GError **error);

/* What a layer keeps for backward (planner/activations.c), shared by the
 * memory model's stages (memory.c). */
typedef enum
{
  STOW_LAYER_DENSE,
  STOW_LAYER_MOE,
  STOW_LAYER_CROSS, /* encoder-decoder: a decoder layer with cross-attention */
  STOW_N_LAYER_KINDS
} StowLayerKind;

/* 16-bit compute over fp32 weights that are themselves the master copy. */
gboolean stow_mem_mixed_over_fp32 (const StowTraining *t);
/* torch.autocast over fp32 weights (the pytorch engine, mixed precision). */
gboolean stow_mem_autocast (const StowTraining *t, const StowLayout *l);
/* Bytes per element of the residual stream. */
double stow_mem_residual_bytes (const StowTraining *t, const StowLayout *l);
/* Bytes a logit costs at the loss's peak. */
double stow_mem_logits_element_bytes (const StowTraining *t,
                                      const StowLayout *l);
/* The stowage engine runs its output layer and cross-entropy fused (not
 * --fused-loss, which fuses the cross-entropy alone). */
gboolean stow_mem_fused_head_loss (const StowTraining *t, const StowLayout *l);
StowLayerKind stow_mem_layer_kind (const StowModel *m, guint64 i);
/* Transformer Engine's fp8 linears (Megatron-core engines, fp8). */
gboolean stow_mem_te_fp8_layers (const StowTraining *t, const StowLayout *l);
/* One layer of @kind, one micro-batch: @block, what it keeps outside the
 * attention core; @core, the core's (scores or log-sum-exp). */
void stow_mem_layer_activation_parts (const StowModel *m, const StowTraining *t,
                                      const StowLayout *l, StowLayerKind kind,
                                      guint64 *block, guint64 *core);
/* What full recompute keeps of a layer: its input. */
guint64 stow_mem_checkpoint_bytes (const StowModel *m, const StowTraining *t,
                                   const StowLayout *l);
/* A dense layer's matmuls in the order its forward runs them (q, k, v or
 * one qkv; o; gate and up, one gate_up, or up; down): input and output
 * widths a token, before TP, and whether TP splits the input (row-parallel:
 * o and down) or the output.  Selective op checkpointing keeps every
 * second one's output; the memory and time models read the same list. */
typedef struct
{
  double in, out;
  gboolean row_parallel;
} StowMatmul;
#define STOW_MAX_LAYER_MATMULS 7
guint stow_mem_layer_matmuls (const StowModel *m, StowMatmul *mm);
/* What selective op checkpointing keeps of a layer. */
guint64 stow_mem_op_checkpoint_bytes (const StowModel *m, const StowTraining *t,
                                      const StowLayout *l);

/* Shared with the step program (planner/lower.c), so that the program
 * allocates exactly the tensors the memory model counts. */

/* Parameters one GPU of a pipeline stage holds, before ZeRO sharding. */
typedef struct
{
  guint64 first_layer; /* index of the stage's first layer */
  guint64 layers;      /* transformer layers on the stage */
  guint64 params;      /* all parameters on the GPU */
  guint64 experts;     /* of which routed experts (ZeRO shards them over the
                          expert-data-parallel group only) */
  guint64 linear;      /* of which in linear layers (QLoRA quantises these) */
  guint64 max_layer;   /* largest layer on the GPU (streaming slots) */
  guint64 max_unit;    /* largest of those, the embedding and output layer */
  guint64 max_end;     /* largest of the embedding and output layer here */
  guint64 trainable;   /* LoRA adapters, or = params */
  gboolean first, last;
} StowStageParams;

StowStageParams stow_mem_stage_params (const StowModel *m,
                                       const StowTraining *t,
                                       const StowLayout *l,
                                       const StowMemOptions *o, guint stage,
                                       guint64 first_layer, guint64 n_layers);
/* Layer @layer's parameters on one GPU (TP and EP splits).  Walks the
 * model's layers: a caller asking for every layer wants
 * stow_mem_largest_layer_params_on_gpu. */
guint64 stow_mem_layer_params_on_gpu (const StowModel *m, const StowLayout *l,
                                      guint64 layer);
/* The largest of those over the model's layers, from @scratch's layer
 * table when it was made for @m (else built for the call). */
guint64 stow_mem_largest_layer_params_on_gpu (const StowModel *m,
                                              const StowLayout *l,
                                              StowMemScratch *scratch);
/* Data-parallel ranks ZeRO shards over. */
guint64 stow_mem_shard_degree (const StowLayout *l, const StowCluster *c);
/* Of @params parameters (@experts of them routed experts, as in
 * StowStageParams), the count one rank keeps of a state ZeRO shards @n
 * ways (@n 1: all of them): the dense part over @n, the experts over their
 * expert-data-parallel group, @n / ep ranks. */
guint64 stow_mem_sharded_params (const StowLayout *l, guint64 params,
                                 guint64 experts, guint64 n);
/* Bytes one rank keeps of @linear frozen linear weights (@experts of them
 * routed experts) at @wb bytes each under LoRA, sharded @wdiv ways. */
guint64 stow_mem_frozen_linear_bytes (const StowLayout *l, guint64 linear,
                                      guint64 experts, double wb, guint64 wdiv);
/* Bytes per parameter of weights gathered or streamed for compute: the
 * compute precision's (4 under fp32 training, else at most 2), whatever
 * the weights are stored in. */
double stow_mem_gathered_weight_bytes (const StowTraining *t, double w);

/* The resident layers of @l given the totals @mt of the same layout with
 * none resident (planner/resident.c); @scratch (may be NULL) as for
 * stow_memory_estimate_totals_with. */
guint64 stow_mem_resident_from_totals (
    const StowModel *m, const StowTraining *t, const StowLayout *l,
    const StowMemOptions *o, const StowMemTotals *mt, StowMemScratch *scratch);
/* Bytes per parameter: compute weights, gradients, fp32 master, optimizer
 * states (stowage engine, full fine-tuning). */
void stow_mem_state_bytes (const StowModel *m, const StowTraining *t, double *w,
                           double *g, double *master, double *opt);
/* The same under @l's engine and its defaults (memory.c's model states:
 * FSDP's fp32 parameters as the master, Megatron's fp32 main grads, NeMo's
 * distributed Adam's 2 B master remainder and bf16 gradients). */
void stow_mem_engine_state_bytes (const StowModel *m, const StowTraining *t,
                                  const StowLayout *l, double *w, double *g,
                                  double *master, double *opt);
/* Bytes per frozen linear weight under LoRA (@w, the model's weight
 * bytes) or QLoRA (NF4 with double quantisation); a quantized checkpoint's
 * own width (scales included) under either. */
double stow_mem_frozen_weight_bytes (const StowModel *m, const StowTraining *t,
                                     double w);
/* Bytes per frozen parameter outside the linears (embeddings, norms):
 * the compute dtype's 2 under QLoRA and for a quantized checkpoint (its
 * torch_dtype), else the model's weight bytes up to 4. */
double stow_mem_frozen_other_bytes (const StowModel *m, const StowTraining *t,
                                    double w);
/* Per-layer activation bytes of one micro-batch (planner/activations.c). */
void stow_mem_activation_sizes (const StowModel *m, const StowTraining *t,
                                const StowLayout *l, guint64 *full,
                                guint64 *block, guint64 *ckpt);
/* Tokens per sequence the decoder and the loss see: --decoder-seq for an
 * encoder-decoder model, else the sequence length (shared with the time
 * model, planner/cost.c). */
guint64 stow_mem_decoder_seq (const StowModel *m, const StowTraining *t);
/* One micro-batch's input, logits and loss gradient (planner/activations.c). */
void stow_mem_end_sizes (const StowModel *m, const StowTraining *t,
                         const StowLayout *l, guint64 *input, guint64 *logits,
                         guint64 *loss_grad);

/* ---- the memory model on a plan's parts -------------------------------------
 * What the public entry points (memory.h, on a StowPlan) run, for the
 * planner's own hot paths (the search varies one layout in place) and
 * callers that hold the parts.  @o may be NULL (the defaults). */
StowMemory *stow_mem_estimate (const StowModel *m, const StowCluster *c,
                               const StowTraining *t, const StowLayout *l,
                               const StowMemOptions *o, GError **error);
gboolean stow_mem_estimate_totals (const StowModel *m, const StowCluster *c,
                                   const StowTraining *t, const StowLayout *l,
                                   const StowMemOptions *o,
                                   StowMemScratch *scratch, StowMemTotals *out,
                                   GError **error);
guint64 stow_mem_layer_activations (const StowModel *m, const StowTraining *t,
                                    const StowLayout *l);
gboolean stow_mem_resolve_resident (const StowModel *m, const StowCluster *c,
                                    const StowTraining *t, StowLayout *l,
                                    const StowMemOptions *o, GError **error);
