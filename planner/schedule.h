/* SPDX-License-Identifier: MIT
 *
 * planner/schedule.h: the step program.  A plan (model, cluster, training,
 * layout) lowers to one program per pipeline stage (a "rank" standing for
 * its data- and tensor-parallel peers): ops on streams, ordered in each
 * stream and joined across streams and ranks only by events, over named
 * buffers with a tier and a size.  Backends in executor/ run it; the
 * lowering here never looks at time, only at bytes and order.
 */
#pragma once

#include <glib.h>

#include "hw/hw.h"
#include "models/model.h"
#include "planner/layout.h"
#include "planner/memory.h"

G_BEGIN_DECLS

typedef enum
{
  STOW_STREAM_COMPUTE,
  STOW_STREAM_H2D,
  STOW_STREAM_D2H,
  STOW_STREAM_NVME_READ,
  STOW_STREAM_NVME_WRITE,
  STOW_STREAM_CPU_OPTIM,
  STOW_STREAM_COMM,
  STOW_N_STREAMS
} StowStream;

const char *stow_stream_name (StowStream s);

typedef enum
{
  STOW_OP_ALLOC,
  STOW_OP_FREE,
  STOW_OP_COPY, /* tier to tier: bytes, src and dst tiers */
  STOW_OP_FORWARD,
  STOW_OP_BACKWARD,
  STOW_OP_RECOMPUTE,
  STOW_OP_LOSS, /* output layer, loss and their backward */
  STOW_OP_OPTIM_STEP,
  STOW_OP_COLLECTIVE,
  STOW_N_OP_KINDS
} StowOpKind;

const char *stow_op_kind_name (StowOpKind k);

typedef enum
{
  STOW_COLL_ALL_REDUCE,
  STOW_COLL_REDUCE_SCATTER,
  STOW_COLL_ALL_GATHER,
  STOW_COLL_SEND, /* pipeline point-to-point */
} StowCollective;

const char *stow_collective_name (StowCollective c);

typedef enum
{
  STOW_GROUP_DP,
  STOW_GROUP_TP,
  STOW_GROUP_PP,
} StowGroup;

#define STOW_NONE            G_MAXUINT /* no buffer, no event */
#define STOW_LAYER_EMBEDDING (-1)
#define STOW_LAYER_HEAD      (-2)
#define STOW_OP_MAX_IO       3

typedef struct
{
  StowOpKind kind;
  StowStream stream;
  guint rank;
  gint layer; /* model layer, or STOW_LAYER_EMBEDDING/_HEAD, -3 none */
  guint micro_batch;
  guint shard; /* optimizer chunk */
  /* cost inputs */
  double flops;      /* forward/backward/recompute/loss */
  double seconds;    /* > 0: the duration the lowering priced, from the
                        time model (planner/cost.c); else from flops */
  guint64 bytes;     /* copy, collective: payload per GPU */
  guint64 params;    /* optim_step: parameters updated */
  StowTier src, dst; /* copy */
  gboolean on_gpu;   /* optim_step */
  StowCollective coll;
  StowGroup group;
  guint group_size;
  gboolean intra_node; /* the group stays inside one node */
  /* buffers: alloc/free name one in @buffer; others read and write */
  guint buffer;
  guint reads[STOW_OP_MAX_IO];
  guint n_reads;
  guint writes[STOW_OP_MAX_IO];
  guint n_writes;
  /* events: waits are a range of program->waits */
  guint wait_first, n_waits;
  guint record; /* event recorded when the op ends, or STOW_NONE */
} StowOp;

typedef struct
{
  char *name;
  StowTier tier;
  guint64 bytes;
  guint rank;
  /* Rotating slots: 0 and 1 hold layers' weights, 2 and 3 their
   * gradients.  A buffer with a slot names the slot's occupant for one
   * use and has no bytes of its own: the bytes are the persistent "layer
   * slot" and "gradient slot" buffers.  -1: not a slot. */
  gint slot;
  gboolean persistent; /* lives for the whole step, ready at the start */
} StowBuffer;

typedef struct
{
  char *name;
  guint rank;
} StowEvent;

/* Schedule parameters a plan carries beside its layout. */
typedef struct
{
  /* Streamed layers kept resident: G_MAXUINT chooses from the device
   * budget (capacity less the memory model's total), 0 streams all. */
  guint resident_layers;
  /* Gradient accumulation over streamed layers: each streamed layer is
   * loaded once for all micro-batches (pp = 1 only). */
  gboolean layer_major;
  /* ZeRO-Offload's one-step delayed parameter update. */
  gboolean delayed_update;
} StowScheduleOptions;

void stow_schedule_options_init (StowScheduleOptions *o);

typedef struct
{
  guint n_ranks;   /* pipeline stages */
  GArray *ops;     /* StowOp, every rank's ops in emission order */
  GArray *buffers; /* StowBuffer */
  GArray *events;  /* StowEvent */
  GArray *waits;   /* guint event ids, ranges of ops */
  /* what the lowering chose, for reports */
  guint resident_layers;         /* per rank, of the streamed kind */
  guint streamed_layers;         /* per rank */
  guint64 device_capacity_bytes; /* tensor budget the plan was made for */
  guint64 overhead_bytes; /* non-tensor device bytes the memory model adds */
  double fragmentation;
  char *description;
} StowProgram;

StowProgram *stow_program_new (guint n_ranks);
void stow_program_free (StowProgram *p);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowProgram, stow_program_free)

/* Building blocks (used by the lowering and by tests that build programs
 * by hand). */
guint stow_program_buffer (StowProgram *p, guint rank, StowTier tier,
                           guint64 bytes, gint slot, gboolean persistent,
                           const char *format, ...) G_GNUC_PRINTF (7, 8);
guint stow_program_event (StowProgram *p, guint rank, const char *format, ...)
    G_GNUC_PRINTF (3, 4);
/* Appends @op (copied; its wait range is set from @waits, @n_waits event
 * ids); returns its index. */
guint stow_program_add (StowProgram *p, const StowOp *op, const guint *waits,
                        guint n_waits);
/* An op initialised with no buffers, no events, layer -3. */
void stow_op_init (StowOp *op, StowOpKind kind, StowStream stream, guint rank);
/* "backward L12 mb3 (rank 0 compute)" */
char *stow_op_describe (const StowProgram *p, guint index);

/* Static checks: every waited event is recorded exactly once by some op,
 * every buffer is allocated and freed at most once, every op names valid
 * buffers.  The message names the op. */
gboolean stow_program_validate (const StowProgram *p, GError **error);

/* Lowers a plan.  Fails (STOW_PLAN_ERROR_INVALID) for a layout that does
 * not validate, or one the lowering does not cover yet (engines other
 * than stowage; LoRA with ZeRO 3 or offload), naming it. */
StowProgram *
stow_schedule_lower (const StowModel *model, const StowCluster *cluster,
                     const StowTraining *training, const StowLayout *layout,
                     const StowMemOptions *mem_options,
                     const StowScheduleOptions *options, GError **error);

/* ---- op costs (planner/schedule-cost.c) ---------------------------------
 * Seconds for one op from the cluster's numbers.  One small place, to be
 * replaced by the time model (planner/cost.c) when it lands. */
double stow_schedule_op_seconds (const StowCluster *cluster,
                                 const StowTraining *training,
                                 const StowOp *op);
/* Forward FLOPs of one layer for one micro-batch on one GPU (Narayanan et
 * al. 2021: 24 B s h^2 + 4 B s^2 h per layer, here from the layer's own
 * parameter count). */
double stow_schedule_layer_flops (const StowModel *model,
                                  const StowTraining *training,
                                  const StowLayout *layout, guint64 layer);

G_END_DECLS
