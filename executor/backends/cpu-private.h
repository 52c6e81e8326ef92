/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu-private.h: the cpu backend's state, shared by its
 * stream workers and buffers (cpu.c) and its ops (cpu-ops.c).
 */
#pragma once

#include "executor/arena.h"
#include "executor/backends/cpu.h"
#include "executor/backends/param-swap.h"
#include "executor/backends/tensors.h"
#include "offload/adam.h"
#include "offload/pinned.h"

G_BEGIN_DECLS

/* ---- the backend ----------------------------------------------------------
 */

typedef enum
{
  TASK_WAIT,
  TASK_RECORD,
  TASK_ALLOC,
  TASK_FREE,
  TASK_OP,
  TASK_FENCE,
  TASK_STOP,
} TaskKind;

typedef struct
{
  TaskKind kind;
  guint index; /* event, buffer or op */
  guint op;    /* alloc/free: the op; STOW_NONE for persistent buffers */
} Task;

typedef struct _CpuBackend CpuBackend;

typedef struct
{
  CpuBackend *b;
  StowStream stream;
  GThread *thread;
  GAsyncQueue *queue;
} Worker;

struct _CpuBackend
{
  StowBackend parent;
  const StowProgram *p;
  StowModel *model;
  StowLlama *llama;
  StowAdam *adam;
  StowArena *arena;
  StowBatches *data;
  StowBatches *eval_data; /* or NULL */
  guint copy_delay_us;
  StowTensorMap map; /* where each tensor is; map.addr: the buffers */
  guint n_buffers;
  /* streams */
  Worker workers[STOW_N_STREAMS];
  GMutex lock;
  GCond cond;
  gboolean *recorded; /* [event] */
  guint fences;
  GError *error; /* the first failure */
  /* timing */
  gint64 t0_us;
  double *op_start, *op_end;
  /* the step, or with eval the evaluation batch (begin_eval) */
  guint64 step;
  gboolean eval;
  double loss_sum;   /* sum of token losses, scaled at the end */
  double loss_scale; /* the step's: 1 / its targets (stow_batches_loss_scale) */
  double grad_norm, clip_coef, lr;
  gboolean skip;
  /* The step's norm covered every gradient and is small enough that
   * Adam need not check them again (stow_adam_grads_ok). */
  gboolean grads_ok;
  /* ZeRO-Infinity: the optimizer states on NVMe, in chunks. */
  StowStateSwap *swap;
  StowParamSwap *params; /* the weights on NVMe, or NULL */
  GError *access_error;  /* why stow_backend_cpu_weights gave NULL */
  /* The program's persistent pinned buffers, locked in host memory. */
  StowPinnedPool *pinned_pool;
  gboolean no_pin;
  /* The delayed update (tensors.h). */
  StowDelayed delayed;
  /* Program buffers in the pinned tier: bytes held now and the peak (a
   * swap buffer counts as the ring buffer it takes). */
  guint64 pinned_in_use, pinned_peak;
  /* Several ranks (cpu-ranks.c): the communicator, and per micro-batch
   * of the rank its loss sum, which the step's loss adds in the one
   * rank's order.  The mirror: whole copies of the partitioned states,
   * which the checkpoint's accessors read and write (NULL until used). */
  StowComm *comm;
  double *mb_loss;
  guint8 *mirror_weights;
  float *mirror_states[3]; /* master, m, v */
  /* The collectives' working buffers (the comm stream's, one op at a
   * time): a unit's partition, and what a tied embedding's pair of
   * exchanges receives. */
  StowScratch coll_part, coll_in[2];
};

static inline double
now_s (CpuBackend *b)
{
  return (double)(g_get_monotonic_time () - b->t0_us) / 1e6;
}

static inline void
fail (CpuBackend *b, GError *e)
{
  g_mutex_lock (&b->lock);
  if (b->error == NULL)
    b->error = e;
  else
    g_error_free (e);
  g_cond_broadcast (&b->cond);
  g_mutex_unlock (&b->lock);
}

static inline gboolean
failed (CpuBackend *b)
{
  g_mutex_lock (&b->lock);
  gboolean f = b->error != NULL;
  g_mutex_unlock (&b->lock);
  return f;
}

static inline const StowBuffer *
buf_of (CpuBackend *b, guint i)
{
  return stow_tensor_map_buffer (&b->map, i);
}

/* Host buffers are 4 KiB-aligned, as O_DIRECT wants the ones NVMe reads
 * land in and writes leave from (offload/nvme.h). */
static inline void *
host_alloc (guint64 bytes)
{
  return g_aligned_alloc0 (1, MAX (bytes, 1), STOW_NVME_ALIGN);
}

/* A persistent pinned buffer: from the backend's locked pool. */
static inline gboolean
in_pool (const CpuBackend *b, const StowBuffer *buf)
{
  return b->pinned_pool != NULL && buf->persistent
         && buf->tier == STOW_TIER_PINNED;
}

/* A "swap buffer": one chunk of the states on their way to and from NVMe
 * (a ring buffer of the swap's pinned pool). */
static inline gboolean
is_swap_buffer (const StowBuffer *buf)
{
  return buf->role == STOW_ROLE_SWAP;
}

static inline void
count_pinned (CpuBackend *b, const StowBuffer *buf, gboolean alloc)
{
  if (buf->tier != STOW_TIER_PINNED)
    return;
  guint64 n = is_swap_buffer (buf) && b->swap != NULL
                  ? stow_state_swap_buffer_bytes (b->swap)
                  : buf->bytes;
  g_mutex_lock (&b->lock);
  if (alloc)
    b->pinned_in_use += n;
  else
    b->pinned_in_use -= MIN (n, b->pinned_in_use);
  b->pinned_peak = MAX (b->pinned_peak, b->pinned_in_use);
  g_mutex_unlock (&b->lock);
}

static inline guint64
unit_numel (CpuBackend *b, guint unit)
{
  return g_array_index (b->p->units, StowUnit, unit).numel;
}

/* Runs op @i of the program on the calling stream's worker. */
gboolean stow_cpu_run_op (CpuBackend *b, guint i, GError **error);

/* cpu-ranks.c: what several ranks add to the backend. */
gboolean stow_cpu_run_collective (CpuBackend *b, const StowOp *op,
                                  GError **error);
gboolean stow_cpu_ranks_grad_norm (CpuBackend *b, guint buffer, GError **error);
gboolean stow_cpu_ranks_loss (CpuBackend *b, GError **error);
/* The checkpoint's accessors over the mirror, and the gathers and
 * scatters between it and the partitions.  NULL: not partitioned (the
 * buffer itself is whole). */
void *stow_cpu_ranks_weights (CpuBackend *b, guint unit);
float *stow_cpu_ranks_state (CpuBackend *b, guint unit, guint which);
gboolean stow_cpu_ranks_pull (CpuBackend *b, GError **error);
gboolean stow_cpu_ranks_push (CpuBackend *b, GError **error);
void stow_cpu_ranks_free (CpuBackend *b);
void stow_cpu_ranks_describe (CpuBackend *b, guint *rank, guint *world);
guint64 stow_cpu_ranks_partition (CpuBackend *b, guint unit, guint64 *first);

G_END_DECLS
