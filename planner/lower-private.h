/* SPDX-License-Identifier: MIT
 *
 * planner/lower-private.h: what the two halves of the lowering share.
 * schedule.c sets each rank up (its units, the order of its items, its
 * persistent state and slots); schedule-step.c emits the rank's step
 * (loads, the item loop, the gradients' path, the optimizer).  Nothing
 * outside the lowering includes it.
 */
#pragma once

#include "planner/lower.h"
#include "planner/memory-private.h"

G_BEGIN_DECLS

/* The pass an item belongs to. */
typedef enum
{
  STOW_PASS_F,
  STOW_PASS_B
} StowPass;

/* A unit of parameters that is gathered or streamed as one: the embedding,
 * a layer, the output layer. */
typedef struct
{
  gint layer;            /* model layer or STOW_LAYER_EMBEDDING / _HEAD */
  guint pu;              /* the program's unit (program/program.h) */
  gboolean grad_written; /* a gradient write of this step has happened */
  guint64 params;        /* owned on this GPU: gradients and updates */
  guint64 gparams;       /* gathered for compute (tied head: the embedding) */
  gboolean streamed;     /* gathered per use into a rotating slot */
  guint resident;        /* persistent gathered buffer, or STOW_NONE */
  gboolean recompute;
  guint last_grad_item; /* item index of its last gradient */
  guint grads_ready;    /* event: its gradients are complete */
  gboolean reduced;     /* a reduction of this step added to its shard */
  guint last_down;      /* event: its last micro-batch's gradients are
                           down on the host (optimizer offload), or none */
  guint last_use;       /* event: its last compute in the step */
} StowLowerUnit;

/* One entry of a rank's compute order: a unit's forward or backward
 * for one micro-batch of one model chunk. */
typedef struct
{
  guint chunk, unit; /* unit index within the rank's unit array */
  guint mb;
  StowPass pass;
  guint use; /* index into the rank's uses, or STOW_NONE */
} StowLowerItem;

/* A run of items on one streamed unit that share one load into a
 * slot. */
typedef struct
{
  guint unit;
  guint first_item, last_item;
  guint buffer;        /* slot buffer */
  guint loaded;        /* event */
  guint freed;         /* event */
  guint staging_freed; /* event (NVMe) */
  gboolean emitted;
} StowLowerUse;

/* The lowering of one plan: its inputs and what every rank shares. */
typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowLayout *l;
  const StowMemOptions *mo;
  const StowLowerOptions *so;
  StowProgram *p;
  double w, g, master, opt, wg; /* bytes per parameter; wg gathered */
  guint64 n;                    /* ZeRO shard degree */
  guint64 full, block, ckpt;
  guint64 input_bytes, logits_bytes, loss_grad_bytes, sbh_send;
  gboolean gather; /* ZeRO 3: units are gathered or streamed */
  gboolean lora;   /* frozen weights, fp32 adapters train */
  double wb;       /* frozen linear weights' bytes (QLoRA: NF4) */
  gboolean off_opt, off_par, nvme_opt, nvme_par;
  /* One stage, no tensor, context or expert split, every parameter
   * trained: units are exact (build_units), and with n > 1 the program
   * is what the executor's ranks run: ZeRO partitions per unit
   * (core/zero.h), each micro-batch's gradients reduced on their own. */
  gboolean exact;
  GHashTable *xevents; /* "F vs mb" -> event id, across ranks */
  guint k_resident;
  StowDtype wdt, gdt; /* weights' and gradients' element types */
} StowLower;

/* One rank (pipeline stage) being lowered. */
typedef struct
{
  guint rank;
  StowStageParams sp;
  GArray *units;                     /* StowLowerUnit */
  GArray *chunk_first, *chunk_count; /* guint: unit ranges per chunk */
  GArray *items;                     /* StowLowerItem */
  GArray *uses;                      /* StowLowerUse */
  guint params_buf, grads_buf, host_grads_buf, bucket_buf[2];
  /* Parameters on NVMe: the pinned buffer a unit's updated weights pass
   * through on their way to the store (O_DIRECT needs an aligned one). */
  guint write_buf;
  guint grad_slot_freed[2]; /* events of the last two gradient slots */
  guint grad_slot_count;
  /* A tied head's loss writes the embedding's gradient, which the
   * embedding's backward then adds to.  With gradient slots, that
   * gradient has a buffer of its own from the loss to the backward, per
   * micro-batch (tied_grad), which behaves as a slot does (brought up,
   * copied down).  tied_unit: the embedding's index in units, or
   * STOW_NONE when the rank has no tied head or no gradient slots. */
  guint tied_unit;
  guint *tied_grad;
  guint tied_freed; /* event: the last of them freed */
  GArray *pending;  /* guint units whose updated weights wait to go up */
  /* The item loop's state (items_init).  Per (unit, micro-batch): */
  guint *acts;            /* activations or checkpoint on the device */
  guint *host_acts;       /* checkpoints moved to pinned host memory
                             (--offload-activations) */
  guint *host_ready;      /* ... and the events of their copies down */
  guint *inputs, *logits; /* per micro-batch */
  guint last_compute;     /* the rank's latest forward or backward */
  GArray *ready_order;    /* guint units, as their gradients complete */
  guint64 tp_bytes;       /* TP traffic of one layer pass */
} StowLowerRank;

static inline guint64
stow_lower_div_ceil (guint64 a, guint64 b)
{
  return (a + b - 1) / b;
}

/* Says what buffer @b holds (stow_program_buffer_holds); returns @b. */
guint stow_lower_holds (StowLower *L, guint b, StowBufferKind kind, guint unit,
                        guint n_units, StowDtype dtype, gint layer, guint mb);
/* The event of the activations (@pass forward) or gradients sent from
 * virtual stage @vs for micro-batch @mb, one per pair across ranks. */
guint stow_lower_xevent (StowLower *L, guint rank, StowPass pass, guint vs,
                         guint mb);
/* Appends @op with @n waits; when @want, a fresh event it records. */
guint stow_lower_emit (StowLower *L, StowOp *op, const guint *waits, guint n,
                       gboolean want, const char *ename);
/* Allocates buffer @buf on stream @s after @waits; returns the op. */
/* The rank's part of @u's gathered weights (gparams) that a load brings
 * from the host or NVMe: core/zero.h's partition on exact units of several
 * ranks (a tied output layer: its own and the embedding's), else the even
 * share. */
guint64 stow_lower_load_part (const StowLower *L, const StowLowerUnit *u);
guint stow_lower_alloc (StowLower *L, guint rank, StowStream s, guint buf,
                        const guint *waits, guint n);
/* Frees buffer @buf on stream @s after @waits; when @want, returns the
 * event it records. */
guint stow_lower_free (StowLower *L, guint rank, StowStream s, guint buf,
                       const guint *waits, guint n, gboolean want);
/* Adds reads @r0, @r1 and write @w0 (each unless STOW_NONE) to @op. */
void stow_lower_op_io (StowOp *op, guint r0, guint r1, guint w0);
/* A copy of @bytes of @layer from @src to @dst. */
StowOp stow_lower_copy_op (guint rank, StowStream s, StowCopyKind what,
                           StowTier src, StowTier dst, guint64 bytes,
                           gint layer);
/* A data-parallel collective of @bytes of @layer. */
StowOp stow_lower_coll_op (StowLower *L, guint rank, StowCollective kind,
                           guint64 bytes, gint layer);
/* A stage's activation (or its gradient) to the next (previous) stage. */
StowOp stow_lower_send_op (StowLower *L, guint rank, gint layer, guint mb);
/* Whether @it needs @u's weights. */
gboolean stow_lower_needs_weights (const StowLowerUnit *u,
                                   const StowLowerItem *it);

/* Whether gradients pass through the two gradient slots
 * (schedule-step.c). */
gboolean stow_lower_uses_grad_slots (StowLower *L);
/* Several ranks over exact units with the optimizer on the host: a
 * gradient slot holds, behind the unit's gradients, the rank's partition
 * of the step's gradients so far (core/zero.h's, padding included), which
 * comes up before each reduction that adds to it and goes down after. */
gboolean stow_lower_slot_tail (const StowLower *L);

/* ---- planner/lower-optim.c: the gradients' path and the optimizer ---- */

/* The rank's part of @u that an offloaded optimizer keeps on the host:
 * core/zero.h's partition where the units are exact, else the even
 * share. */
guint64 stow_lower_host_part (const StowLower *L, const StowLowerUnit *u);
/* Clipping by the global gradient norm (every update waits for it). */
gboolean stow_lower_clipping (const StowLower *L);
/* What CPU Adam writes besides the states: the host gradients' place
 * when the weights are on NVMe, else STOW_NONE. */
guint stow_lower_adam_out (const StowLower *L, const StowLowerRank *R);
/* Gradient slot @grad allocated for @u's next gradient write (and, with
 * the optimizer on the host and one rank, the unit's earlier
 * micro-batches brought back up into it): that copy's event, which the
 * write waits for and accumulates onto, or STOW_NONE. */
guint stow_lower_grad_slot (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                            guint grad, guint *freed);
/* After an op (event @done) wrote @u's gradients into @slot (or the
 * persistent gradients): reduced, copied down, the slot freed; returns
 * the event after which the micro-batch's gradients are in place. */
guint stow_lower_grad_path (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                            guint slot, gboolean tied, guint pair, guint done,
                            gboolean last_mb);
/* CPU Adam's updated weights of R->pending's units, up behind the loads. */
void stow_lower_flush_refreshes (StowLower *L, StowLowerRank *R);
/* The optimizer step of the units in @ready_order. */
void stow_lower_optimizer (StowLower *L, StowLowerRank *R, GArray *ready_order);
/* Emits @R's step: its items in order, then the optimizer
 * (schedule-step.c). */
void stow_lower_step (StowLower *L, StowLowerRank *R);

G_END_DECLS
