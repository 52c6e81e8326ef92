/* SPDX-License-Identifier: MIT
 *
 * executor/backends/tensors.h: where every tensor of a step program is, for
 * the backends that hold real tensors (cpu, cuda).  From the program's
 * buffers (which units, layer and micro-batch each holds) and the units'
 * flat layouts it finds, given each buffer's base address, a layer's weights
 * and gradients, a micro-batch's tokens and layer outputs, the saved
 * activations an op reads, and the optimizer's view of a tensor.  It checks
 * once that every buffer holds what the decoder runtime keeps there (the
 * memory model's sizes against the runtime's).  The addresses are the
 * backend's: host or device, this file never dereferences them.
 */
#pragma once

#include "executor/llama.h"
#include "offload/adam.h"
#include "offload/pinned.h"
#include "program/program.h"

G_BEGIN_DECLS

typedef struct
{
  const StowProgram *p;
  const StowModel *model;
  StowLlamaConfig config;
  StowDtype ftype; /* weights and activations */
  gsize esize;
  guint64 n_tokens;               /* per micro-batch: B T */
  guint64 numel;                  /* every unit's parameters, in unit order */
  guint64 chunk;                  /* the fused loss's tokens per chunk */
  guint64 saved_bytes, out_bytes; /* a layer's activations, its output */
  /* per unit of a layer: element offsets of its tensors within the unit
   * in StowLlamaLayerWeights order, G_MAXUINT64 when absent */
  guint64 *slot_offset;       /* [unit * STOW_LAYER_SLOTS + slot] */
  guint64 head_norm, head_lm; /* offsets in the head unit; lm: MAXUINT64 tied */
  guint emb_unit, head_unit;
  guint *act_of;   /* [layer * m + mb]: its ACTIVATIONS or CHECKPOINT buffer */
  guint *input_of; /* [mb]: its INPUT buffer (tokens, targets, x) */
  StowInputLayout input; /* where an INPUT buffer keeps them */
  guint weights_buf, grads_buf, master_buf, states_buf;
  /* An offloaded optimizer (ZeRO-Offload): the host copy of the gradients
   * (grads_buf is then STOW_NONE: backward writes gradient slots), and
   * states_buf is the host STATES buffer, per unit its master (with
   * master weights), m and v. */
  guint host_grads_buf;
  /* The host buffer of every unit's weights: with streamed parameters
   * (ZeRO-3 with --offload-params; weights_buf is then STOW_NONE) where
   * they live, with an offloaded optimizer the copy CPU Adam writes.
   * [unit]: the device buffer of a unit resident on the device while the
   * others stream through the layer slots, or STOW_NONE. */
  guint host_weights_buf;
  guint *unit_weights;
  gboolean states_master; /* states_buf holds the master weights too */
  /* ZeRO-Infinity: states_buf lives on NVMe (no address; the backend
   * swaps it in chunks, stow_tensor_map_state does not apply). */
  gboolean states_nvme;
  /* ZeRO-Infinity's parameter offload: the weights live on NVMe
   * (host_weights_buf is then STOW_NONE); loads stage a unit in pinned
   * memory first, and CPU Adam's updated weights, written over the host
   * gradients, go to the store through write_buf. */
  gboolean params_nvme;
  guint write_buf;
  /* The delayed update's second host copy of the gradients
   * (STOW_DELAYED_GRADS_NAME), or STOW_NONE. */
  guint delayed_grads_buf;
  /* [slot] (STOW_SLOT_*): the persistent buffer whose bytes a slot's
   * occupant uses, STOW_NONE: none */
  guint slot_buf[STOW_N_SLOTS];
  /* The host copy of the weights CPU Adam writes and the "updated up"
   * copies read (unit layout as weights_buf); NULL: Adam writes the
   * device weights.  Set by the backend. */
  guint8 *host_weights;
  /* Gradient accumulation by addition (set by the cpu backend; NULL: the
   * kernels add into the old gradients, as the cuda backend's do): an op
   * that adds to a unit's gradients writes its micro-batch's gradients
   * afresh here, then they are added in, element by element, rounded to
   * the gradient dtype: the sum over micro-batches is then ((g0 + g1) +
   * g2) + ..., which N ranks reproduce by adding their micro-batches'
   * gradients in rank order (executor/comm/comm.h), and PyTorch forms
   * (AccumulateGrad).  Room for the largest unit's gradients plus the
   * embedding's (a tied loss writes both). */
  guint8 *acc_scratch;
  guint64 acc_scratch_bytes;
  /* The threads that add them in (the backend's compute threads). */
  guint add_threads;
  /* Data-parallel ranks (the program's dp) and this one's rank, set by
   * the backend; part_off[u]: where unit u's partition starts in a
   * partitioned buffer, in elements (core/zero.h). */
  guint dp, dp_rank;
  guint64 *part_off;
  /* [buffer]: base addresses while allocated, kept by the backend */
  void **addr;
} StowTensorMap;

#define STOW_LAYER_SLOTS 18 /* the pointers of StowLlamaLayerWeights */

/* Indexes @program for @model and checks every buffer's size; @backend
 * names the backend in messages.  STOW_BACKEND_ERROR_INVALID names a
 * buffer and both sizes; _UNSUPPORTED a program the backends cannot run
 * (several ranks, fp16, a persistent buffer of a part of the units). */
gboolean stow_tensor_map_init (StowTensorMap *map, const StowProgram *program,
                               const StowModel *model, const char *backend,
                               GError **error);
void stow_tensor_map_clear (StowTensorMap *map);

const StowBuffer *stow_tensor_map_buffer (const StowTensorMap *map,
                                          guint buffer);
/* Bytes per element of what a persistent buffer of @kind holds. */
gsize stow_tensor_map_kind_elem (const StowTensorMap *map, StowBufferKind kind);
/* Where @unit starts in persistent buffer @buffer (a run of units). */
guint8 *stow_tensor_map_unit (const StowTensorMap *map, guint buffer,
                              guint unit);
/* A pool of ordinary pages (offload/pinned.h) with room for every
 * persistent pinned buffer of the program, each page-rounded, or NULL
 * when it has none: registered with CUDA as it grows when @cuda, else
 * unlocked until stow_pinned_pool_pin (mlock). */
StowPinnedPool *stow_tensor_map_pinned_pool (const StowTensorMap *map,
                                             gboolean cuda);

/* Where @unit starts in the host copy of the weights CPU Adam writes
 * (map->host_weights, laid out as the units). */
guint8 *stow_tensor_map_host_weights (const StowTensorMap *map, guint unit);
/* Element @e (unit coordinates) of @unit there: in this rank's partition
 * on several ranks. */
guint8 *stow_tensor_map_host_weight (const StowTensorMap *map, guint unit,
                                     guint64 e);
/* Several ranks, the gradients going to the host: where gradient slot
 * occupant @buffer keeps the rank's partition of its unit's step
 * gradients, behind the unit's (planner/lower-private.h,
 * stow_lower_slot_tail). */
guint8 *stow_tensor_map_slot_tail (const StowTensorMap *map, guint buffer);
/* The rank's flat parameters, which the host buffers and the optimizer's
 * NVMe chunks lay out: the units in order, each whole on one rank, its
 * partition (padding included) on several.  Returns where @unit starts
 * there, and in *@first, *@count the elements of the unit that the rank
 * holds (unit coordinates; the rest of its partition is padding). */
guint64 stow_tensor_map_flat_unit (const StowTensorMap *map, guint unit,
                                   guint64 *first, guint64 *count);
/* Their number. */
guint64 stow_tensor_map_flat_numel (const StowTensorMap *map);
/* Several ranks: an optimizer chunk's updated weights (@op, a
 * STOW_COPY_CHUNK_UP of the rank's flat parameters [first, first +
 * count)) from the host copy into the device weights: each unit's part at
 * its place, or a ZeRO-3 shard as it is. */
gboolean stow_tensor_map_chunk_up_ranks (const StowTensorMap *map,
                                         const StowOp *op, GError **error);
/* A model whose output layer is its embedding, the weights off the device
 * (--offload-params): the output layer's layer slot takes the head's
 * weights and then the embedding's.  Their parts on this rank (the
 * partitions of both, or both whole on one rank), in elements; whether
 * @op is the copy up into such a slot (from the host copy, or staged from
 * NVMe with the head's part first), and that copy, each part to its
 * place (a gather follows on several ranks). */
guint64 stow_tensor_map_tied_head_part (const StowTensorMap *map);
gboolean stow_tensor_map_is_tied_head_copy (const StowTensorMap *map,
                                            const StowOp *op);
gboolean stow_tensor_map_tied_head_copy (const StowTensorMap *map,
                                         const StowOp *op, GError **error);
/* The tensors of layer unit @unit whose storage starts at @base, elements
 * of @elem bytes. */
void stow_tensor_map_layer (const StowTensorMap *map, guint8 *base, guint unit,
                            gsize elem, StowLlamaLayerWeights *w);
/* The output of layer @layer for micro-batch @mb (the next layer's
 * input); for layer -1 the embedding's. */
guint8 *stow_tensor_map_layer_output (const StowTensorMap *map, gint layer,
                                      guint mb);
/* The buffer holding the weights compute op @op reads: a layer slot's
 * occupant, a resident unit's, or the persistent weights. */
guint stow_tensor_map_weights_of (const StowTensorMap *map, const StowOp *op);
/* A buffer of @kind among op @op's reads (or writes), or STOW_NONE. */
guint stow_tensor_map_io (const StowTensorMap *map, const StowOp *op,
                          gboolean writes, StowBufferKind kind);
/* The saved activations of a layer op (forward, recompute, backward);
 * @rebuilt: the op reads the recomputed part rather than writing it. */
void stow_tensor_map_saved (const StowTensorMap *map, const StowOp *op,
                            gboolean rebuilt, StowLlamaSaved *saved);
/* The head's norm and lm_head weights (or gradients, from @grads), with a
 * tied head the embedding's. */
void stow_tensor_map_head (const StowTensorMap *map, gboolean grads,
                           void **norm, void **lm);
/* The same in buffer @buffer (weights or gradients, a gradient slot's
 * occupant included), of the head unit. */
void stow_tensor_map_head_in (const StowTensorMap *map, guint buffer,
                              void **norm, void **lm);

/* Where a copy between the device and host memory (not NVMe) reads and
 * writes, and its bytes, exactly the range the op names: a unit's
 * gradients down from its gradient slot into the host gradients, or back
 * up (partial gradients); a unit's weights up from the host copy CPU Adam
 * wrote (with the weights on NVMe, from the host gradients it wrote them
 * over), or from the staging buffer a load read it into; a chunk's
 * updated weights up (flat parameters [first, first + count)): the op's
 * StowCopyKind says which.  The addresses are @map's;
 * STOW_BACKEND_ERROR_INVALID when the op's bytes are not the range's,
 * _UNSUPPORTED for another copy. */
gboolean stow_tensor_map_copy_ends (const StowTensorMap *map, const StowOp *op,
                                    const guint8 **from, guint8 **to,
                                    guint64 *bytes, GError **error);

/* The fp32 optimizer state of @unit: @which 0 the master weights, 1 m,
 * 2 v, wherever the program keeps them (device or host). */
float *stow_tensor_map_state (const StowTensorMap *map, guint unit,
                              guint which);

/* CPU Adam (stow_adam_step) on every tensor of @unit, where the map
 * keeps its states, gradients and weights: the host's arrays for every
 * backend that runs the optimizer on the host. */
gboolean stow_tensor_map_adam_unit (const StowTensorMap *map, StowAdam *adam,
                                    guint unit, const StowAdamStep *step,
                                    double lr, GError **error);
/* ZeRO-Offload's delayed update, as the backends that run it keep it: the
 * last step's host gradients go aside (prev_grads) when a step begins and
 * CPU Adam applies them while this step's come down where they were. */
typedef struct
{
  gboolean on;
  gboolean apply_prev; /* this step applies the last one's gradients */
  gboolean have_grads; /* the host gradients hold a step's (pending) */
  guint8 *prev_grads;  /* the whole model's, laid out as the host's */
} StowDelayed;

/* Once the persistent buffers have addresses: prev_grads is the program's
 * STOW_DELAYED_GRADS_NAME buffer.  Sets @error when the delayed update is
 * on and the program has no such buffer or no host gradients. */
gboolean stow_delayed_init (StowDelayed *d, const StowTensorMap *map,
                            GError **error);
/* At step @step's start: trades the host gradients with prev_grads. */
void stow_delayed_begin_step (StowDelayed *d, StowTensorMap *map, guint64 step);
/* Before the buffers are freed: the host gradients back in their own slot
 * (stow_delayed_begin_step trades them with prev_grads each step). */
void stow_delayed_restore (StowDelayed *d, StowTensorMap *map);
/* The pending gradients of @unit (which the next step applies), and in
 * @pending whether there are any; NULL without a delayed update. */
void *stow_delayed_pending (const StowDelayed *d, const StowTensorMap *map,
                            guint unit, gboolean *pending);

/* ZeRO-Offload's delayed update of @unit in step @step: step - 1's update
 * (its learning rate, Adam's t = step - 1, unclipped) with the gradients
 * set aside when @step began; nothing when there are none (the run's first
 * step). */
gboolean stow_delayed_apply (const StowDelayed *d, const StowTensorMap *map,
                             StowAdam *adam, guint unit, guint64 step,
                             GError **error);

/* The global L2 norm of the host gradients in @buffer, unit by unit in
 * unit order (stow_adam_grad_sumsq's sums, so every backend gets the same
 * bits); *@clip the coefficient for @max_norm, *@skip whether it is not
 * finite. */
double stow_tensor_map_grad_norm (const StowTensorMap *map, StowAdam *adam,
                                  guint buffer, double max_norm, double *clip,
                                  gboolean *skip);

/* Several ranks' gradient norm, the sum one rank forms: each rank's sums
 * of squares of its blocks of each unit (stow_tensor_map_norm_blocks of
 * them, unit by unit, zeros for padding blocks) into @out, then, every
 * rank's gathered (rank 0's first), added in the one rank's order. */
guint64 stow_tensor_map_norm_blocks (const StowTensorMap *map);
void stow_tensor_map_norm_partials (const StowTensorMap *map, StowAdam *adam,
                                    guint buffer, double *out);
double stow_tensor_map_norm_combine (const StowTensorMap *map,
                                     const double *all, double max_norm,
                                     double *clip, gboolean *skip);

/* Tensor @k of @unit's AdamW settings at learning rate @lr (weight decay
 * on tensors of two or more dimensions only). */
void stow_tensor_map_adam_config (const StowTensorMap *map, guint unit, guint k,
                                  double lr, StowAdamConfig *config);

/* The optimizer's view of tensor @k of @unit: its AdamW settings (weight
 * decay on tensors of two or more dimensions only, as nanoGPT and HF's
 * Trainer do) at learning rate @lr, and its arrays in the persistent
 * buffers: the part of the tensor in this rank's partition of the unit
 * (all of it on one rank).  FALSE when none of it is. */
gboolean stow_tensor_map_adam (const StowTensorMap *map, guint unit, guint k,
                               double lr, StowAdamConfig *config,
                               StowAdamTensor *tensor);
/* This rank's partition of @unit: its first element (in the unit) in
 * *@first and the elements of the unit it holds (the rest of the
 * partition is padding); the whole unit on one rank. */
guint64 stow_tensor_map_part (const StowTensorMap *map, guint unit,
                              guint64 *first);
/* The address of element @e of @unit in persistent buffer @buffer, whole
 * or this rank's partition (@e must then lie in it). */
guint8 *stow_tensor_map_elem (const StowTensorMap *map, guint buffer,
                              guint unit, guint64 e);

G_END_DECLS
