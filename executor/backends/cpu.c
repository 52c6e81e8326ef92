/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu.c: the cpu backend (executor/backends/cpu.h).  The
 * driver issues each stream's ops in program order; here each stream is a
 * worker thread with a queue of tasks (wait for an event, alloc, free, an
 * op, record an event), so the streams run concurrently as the program's
 * events allow.  Tensors live in program buffers: the buffers say which
 * units, layer and micro-batch they hold, the units' flat layouts say
 * where each tensor is.
 */
#include "executor/backends/cpu.h"

#include <math.h>
#include <string.h>

#include "executor/arena.h"
#include "executor/backends/param-swap.h"
#include "executor/backends/tensors.h"
#include "executor/trace.h"
#include "offload/adam.h"
#include "offload/pinned.h"

/* ---- the backend ---------------------------------------------------------- */

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
  StowCpuDataFn data;
  gpointer data_user;
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
  /* the step */
  guint64 step;
  double loss_sum; /* sum of token losses, scaled at the end */
  double grad_norm, clip_coef, lr;
  gboolean skip;
  /* ZeRO-Infinity: the optimizer states on NVMe, in chunks. */
  StowStateSwap *swap;
  StowParamSwap *params; /* the weights on NVMe, or NULL */
  GError *access_error;  /* why stow_backend_cpu_weights gave NULL */
  /* The program's persistent pinned buffers, locked in host memory. */
  StowPinnedPool *pinned_pool;
  gboolean no_pin;
  /* The delayed update: the previous step's gradients (host gradients'
   * layout), and whether the host gradients hold a step's that the next
   * step applies. */
  gboolean delayed;
  guint8 *prev_grads;
  guint8 *own_grads; /* the program's host gradients, whichever is where */
  gboolean have_grads, apply_prev;
  /* Program buffers in the pinned tier: bytes held now and the peak (a
   * swap buffer counts as the ring buffer it takes). */
  guint64 pinned_in_use, pinned_peak;
};

static double
now_s (CpuBackend *b)
{
  return (double)(g_get_monotonic_time () - b->t0_us) / 1e6;
}

static void
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

static gboolean
failed (CpuBackend *b)
{
  g_mutex_lock (&b->lock);
  gboolean f = b->error != NULL;
  g_mutex_unlock (&b->lock);
  return f;
}

static const StowBuffer *
buf_of (CpuBackend *b, guint i)
{
  return stow_tensor_map_buffer (&b->map, i);
}

/* Host buffers are 4 KiB-aligned, as O_DIRECT wants the ones NVMe reads
 * land in and writes leave from (offload/nvme.h). */
static void *
host_alloc (guint64 bytes)
{
  return g_aligned_alloc0 (1, MAX (bytes, 1), STOW_NVME_ALIGN);
}

/* A persistent pinned buffer: from the backend's locked pool. */
static gboolean
in_pool (const CpuBackend *b, const StowBuffer *buf)
{
  return b->pinned_pool != NULL && buf->persistent
         && buf->tier == STOW_TIER_PINNED;
}

/* A slot's occupant: the bytes of the slot's persistent buffer. */
static gboolean
is_occupant (const StowBuffer *buf)
{
  return buf->slot >= 0 && buf->bytes == 0;
}

/* A "swap buffer": one chunk of the states on their way to and from NVMe
 * (a ring buffer of the swap's pinned pool). */
static gboolean
is_swap_buffer (const StowBuffer *buf)
{
  return buf->kind == STOW_BUF_STATES && !buf->persistent
         && buf->tier != STOW_TIER_DEVICE && buf->tier != STOW_TIER_NVME;
}

static void
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

/* ---- the ops ---------------------------------------------------------------- */

static guint64
unit_numel (CpuBackend *b, guint unit)
{
  return g_array_index (b->p->units, StowUnit, unit).numel;
}

/* The gradients op @op writes: a gradient slot's occupant or the
 * persistent gradients. */
static guint
grads_of (CpuBackend *b, const StowOp *op)
{
  guint g = stow_tensor_map_io (&b->map, op, TRUE, STOW_BUF_GRADS);
  return g != STOW_NONE ? g : b->map.grads_buf;
}

static gboolean
run_forward (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint8 *w = stow_tensor_map_unit (m, stow_tensor_map_weights_of (m, op),
                                    op->unit);
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = m->addr[m->input_of[op->micro_batch]];
      stow_llama_embed_forward (b->llama, w, (gint32 *)in, m->n_tokens,
                                in + 8 * m->n_tokens);
      return TRUE;
    }
  StowLlamaLayerWeights lw;
  stow_tensor_map_layer (m, w, op->unit, m->esize, &lw);
  StowLlamaSaved s;
  stow_tensor_map_saved (m, op, FALSE, &s);
  if (op->kind == STOW_OP_RECOMPUTE)
    s.out = NULL; /* kept in the checkpoint, which now holds its gradient */
  stow_llama_layer_forward (
      b->llama, b->p->micro_batch, b->p->seq_len, &lw,
      stow_tensor_map_layer_output (m, op->layer - 1, op->micro_batch), &s);
  return TRUE;
}

static gboolean
run_loss (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint64 n = m->n_tokens;
  guint8 *in = m->addr[m->input_of[op->micro_batch]];
  void *norm, *lm, *dnorm, *dlm;
  guint gbuf = grads_of (b, op);
  gboolean acc = op->accumulate;
  stow_tensor_map_head_in (m, stow_tensor_map_weights_of (m, op), &norm, &lm);
  stow_tensor_map_head_in (m, gbuf, &dnorm, &dlm);
  guint logits = stow_tensor_map_io (m, op, TRUE, STOW_BUF_LOGITS);
  g_assert (logits != STOW_NONE);
  guint8 *x = stow_tensor_map_layer_output (m, (gint)b->model->n_layers - 1,
                                            op->micro_batch);
  double sum = stow_llama_head_loss (
      b->llama, n, norm, lm, x, (gint32 *)(in + 4 * n), b->p->loss_scale, dnorm,
      dlm, acc, x, m->addr[logits], m->chunk);
  b->loss_sum += sum;
  return TRUE;
}

static gboolean
run_backward (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint gbuf = grads_of (b, op);
  gboolean acc = op->accumulate;
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = m->addr[m->input_of[op->micro_batch]];
      stow_llama_embed_backward (b->llama, (gint32 *)in, m->n_tokens,
                                 in + 8 * m->n_tokens,
                                 stow_tensor_map_unit (m, gbuf, op->unit), acc);
      return TRUE;
    }
  StowLlamaLayerWeights lw, lg;
  stow_tensor_map_layer (
      m, stow_tensor_map_unit (m, stow_tensor_map_weights_of (m, op), op->unit),
      op->unit, m->esize, &lw);
  stow_tensor_map_layer (m, stow_tensor_map_unit (m, gbuf, op->unit), op->unit,
                         stow_dtype_size (b->p->grad_dtype), &lg);
  StowLlamaSaved s;
  stow_tensor_map_saved (m, op, TRUE, &s);
  guint ws = stow_tensor_map_io (m, op, TRUE, STOW_BUF_WORKSPACE);
  g_assert (ws != STOW_NONE);
  guint8 *x = stow_tensor_map_layer_output (m, op->layer - 1, op->micro_batch);
  stow_llama_layer_backward (b->llama, b->p->micro_batch, b->p->seq_len, &lw, x,
                             &s, &lg, acc, m->addr[ws], x);
  return TRUE;
}

/* The global L2 norm of every unit's gradients (sums of squares in
 * double, in unit order: the same bits for any thread count), the clip
 * coefficient and whether the step must be skipped. */
static gboolean
run_grad_norm (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  double total = 0;
  StowFloatType gt = stow_float_type_of_dtype (b->p->grad_dtype);
  /* The gradients it reads: on the device, or the host copy (an
   * offloaded optimizer, on the cpu_optim stream). */
  guint gbuf = stow_tensor_map_io (m, op, FALSE, STOW_BUF_GRADS);
  if (gbuf == STOW_NONE)
    gbuf = m->grads_buf;
  for (guint u = 0; u < b->p->units->len; u++)
    {
      double s = 0;
      stow_adam_grad_sumsq (b->adam, stow_tensor_map_unit (m, gbuf, u), gt,
                            g_array_index (b->p->units, StowUnit, u).numel, &s);
      total += s;
    }
  b->grad_norm = sqrt (total);
  b->skip = !isfinite (b->grad_norm);
  b->clip_coef = stow_adam_clip_coef (b->grad_norm, b->p->optim.max_grad_norm);
  return TRUE;
}

/* The delayed update of one unit: step s - 1's update (its learning rate,
 * Adam's t = s - 1) with its gradients, kept aside when step s began;
 * nothing in the run's first step.  No clipping: the norm would wait for
 * the whole backward, which the delay exists to overlap. */
static gboolean
run_delayed (CpuBackend *b, const StowOp *op, GError **error)
{
  if (!b->apply_prev)
    return TRUE;
  const StowTensorMap *m = &b->map;
  const StowUnit *u = &g_array_index (b->p->units, StowUnit, op->unit);
  guint64 off = u->offset - g_array_index (b->p->units, StowUnit, 0).offset;
  gsize gsz = stow_dtype_size (b->p->grad_dtype);
  StowAdamStep st = { b->step - 1, 1.0, 1.0, FALSE };
  double lr = stow_optim_lr_at (&b->p->optim, b->step - 1);
  for (guint k = 0; k < u->n_tensors; k++)
    {
      const StowUnitTensor *t = &g_array_index (
          b->p->unit_tensors, StowUnitTensor, u->first_tensor + k);
      StowAdamConfig cfg;
      StowAdamTensor at;
      stow_tensor_map_adam (m, op->unit, k, lr, &cfg, &at);
      at.grad = b->prev_grads + (off + t->offset) * gsz;
      if (!stow_adam_step (b->adam, &cfg, &st, &at, error))
        return FALSE;
    }
  return TRUE;
}

/* AdamW on one unit, tensor by tensor: on the device's tensors, or
 * (!on_gpu, ZeRO-Offload) CPU Adam on the host gradients, master and
 * moments, writing the host copy of the weights that the "updated up"
 * copy takes to the device.  The same stow_adam_step either way: the same
 * bits. */
static gboolean
run_optim (CpuBackend *b, const StowOp *op, GError **error)
{
  if (!op->on_gpu && b->map.host_weights == NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "a host optimizer step without host optimizer states "
                   "(the program keeps them on the device)");
      return FALSE;
    }
  if (op->on_gpu && b->map.host_weights != NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "a device optimizer step with the optimizer states in "
                   "host memory");
      return FALSE;
    }
  if (op->unit == STOW_NONE && b->swap == NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs optimizer steps of whole units or "
                   "of NVMe chunks (not a delayed update)");
      return FALSE;
    }
  if (b->skip)
    return TRUE;
  StowAdamStep st = { b->step, 1.0, b->clip_coef, FALSE };
  if (b->delayed)
    return run_delayed (b, op, error);
  if (op->unit == STOW_NONE)
    {
      /* A chunk of the NVMe states, in its swap buffer. */
      guint sb = stow_tensor_map_io (&b->map, op, TRUE, STOW_BUF_STATES);
      if (sb == STOW_NONE || b->map.addr[sb] == NULL)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "an optimizer step over chunk %u writes no swap buffer",
                       op->shard);
          return FALSE;
        }
      return stow_state_swap_update (b->swap, b->adam, &st, b->lr, op->first,
                                     op->count, b->map.addr[sb], error);
    }
  const StowUnit *u = &g_array_index (b->p->units, StowUnit, op->unit);
  for (guint k = 0; k < u->n_tensors; k++)
    {
      StowAdamConfig cfg;
      StowAdamTensor at;
      stow_tensor_map_adam (&b->map, op->unit, k, b->lr, &cfg, &at);
      if (!stow_adam_step (b->adam, &cfg, &st, &at, error))
        return FALSE;
    }
  return TRUE;
}

/* The weights on NVMe: a unit read into its staging buffer, or a unit's
 * updated weights (CPU Adam left them where its gradients were) through
 * the write buffer to the store. */
static gboolean
param_io (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint unit = op->unit;
  if (unit == STOW_NONE || unit >= b->p->units->len
      || op->bytes != unit_numel (b, unit) * m->esize)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "a copy of %" G_GUINT64_FORMAT " B %s NVMe names no "
                   "unit's weights (unit %d)",
                   op->bytes, op->src == STOW_TIER_NVME ? "from" : "to",
                   unit == STOW_NONE ? -1 : (gint)unit);
      return FALSE;
    }
  if (op->src == STOW_TIER_NVME && op->n_writes == 1
      && m->addr[op->writes[0]] != NULL)
    return stow_param_swap_read (b->params, unit, m->addr[op->writes[0]],
                                 error);
  if (op->dst == STOW_TIER_NVME && op->n_reads == 2
      && op->reads[0] == m->host_grads_buf && m->addr[op->reads[1]] != NULL)
    {
      guint64 off = g_array_index (b->p->units, StowUnit, unit).offset
                    - g_array_index (b->p->units, StowUnit, 0).offset;
      memcpy (m->addr[op->reads[1]], m->host_weights + off * m->esize,
              op->bytes);
      return stow_param_swap_write (b->params, unit, m->addr[op->reads[1]],
                                    error);
    }
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
               "the cpu backend reads a unit's weights from NVMe into a "
               "staging buffer and writes its updated weights through the "
               "write buffer; not this copy (%s to %s)",
               stow_tier_name (op->src), stow_tier_name (op->dst));
  return FALSE;
}

/* A copy between the device arena and a host buffer, exactly the unit
 * range the op names: a unit's gradients down from its gradient slot
 * (after its backward of a micro-batch) into the host gradients, or a
 * unit's updated weights up from the host copy CPU Adam wrote. */
static gboolean
run_copy (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint dst = op->n_writes == 1 ? op->writes[0] : STOW_NONE;
  guint src = op->n_reads == 1 ? op->reads[0] : STOW_NONE;
  guint unit = STOW_NONE;
  const guint8 *from = NULL;
  guint8 *to = NULL;
  gsize elem = 0;
  if (b->swap != NULL && op->src == STOW_TIER_NVME && dst != STOW_NONE
      && is_swap_buffer (buf_of (b, dst)))
    return stow_state_swap_read (b->swap, op->shard, m->addr[dst], op->bytes,
                                 error);
  if (b->swap != NULL && op->dst == STOW_TIER_NVME && src != STOW_NONE
      && is_swap_buffer (buf_of (b, src)))
    return stow_state_swap_write (b->swap, op->shard, m->addr[src], op->bytes,
                                  error);
  if (b->params != NULL && (op->src == STOW_TIER_NVME || op->dst == STOW_TIER_NVME))
    return param_io (b, op, error);
  if (b->swap != NULL && dst == m->weights_buf && src == STOW_NONE
      && op->unit == STOW_NONE && op->layer == STOW_LAYER_NONE
      && op->count > 0)
    {
      /* A chunk's updated weights up: flat parameters [first, first +
       * count), units contiguous in the weights as in the host copy. */
      guint64 total = m->numel;
      if (op->first + op->count > total || op->bytes != op->count * m->esize)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "a chunk's copy up of %" G_GUINT64_FORMAT
                       " B from parameter %" G_GUINT64_FORMAT
                       " (%" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT ")",
                       op->bytes, op->first, op->count, total);
          return FALSE;
        }
      memcpy (stow_tensor_map_unit (m, dst, 0) + op->first * m->esize,
              m->host_weights + op->first * m->esize, op->count * m->esize);
      return TRUE;
    }
  if (src != STOW_NONE && src == m->host_grads_buf && dst != STOW_NONE
      && buf_of (b, dst)->kind == STOW_BUF_GRADS && buf_of (b, dst)->slot >= 2)
    {
      /* A unit's earlier micro-batches' gradients back up into its
       * gradient slot, which the next write adds to. */
      unit = buf_of (b, dst)->unit_first;
      elem = stow_dtype_size (b->p->grad_dtype);
      from = stow_tensor_map_unit (m, src, unit);
      to = stow_tensor_map_unit (m, dst, unit);
    }
  else if (dst != STOW_NONE && dst == m->host_grads_buf && src != STOW_NONE
      && buf_of (b, src)->kind == STOW_BUF_GRADS && buf_of (b, src)->slot >= 2)
    {
      unit = buf_of (b, src)->unit_first;
      elem = stow_dtype_size (b->p->grad_dtype);
      from = stow_tensor_map_unit (m, src, unit);
      to = stow_tensor_map_unit (m, dst, unit);
    }
  else if (dst != STOW_NONE && buf_of (b, dst)->kind == STOW_BUF_WEIGHTS
           && buf_of (b, dst)->tier == STOW_TIER_DEVICE && src != STOW_NONE
           && is_occupant (buf_of (b, src)) && op->unit != STOW_NONE
           && buf_of (b, src)->tier != STOW_TIER_DEVICE)
    {
      /* A unit staged from NVMe, up into its slot. */
      unit = op->unit;
      elem = m->esize;
      from = m->addr[src];
      to = stow_tensor_map_unit (m, dst, unit);
    }
  else if (dst != STOW_NONE && buf_of (b, dst)->kind == STOW_BUF_WEIGHTS
           && buf_of (b, dst)->tier == STOW_TIER_DEVICE
           && (src == STOW_NONE
               || (b->params != NULL && src == m->host_grads_buf))
           && op->src != STOW_TIER_DEVICE && m->host_weights != NULL)
    {
      unit = op->unit != STOW_NONE
                 ? op->unit
                 : stow_program_unit_of_layer (b->p, op->layer);
      if (unit == STOW_NONE)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "a copy up of weights names no unit (layer %d)",
                       op->layer);
          return FALSE;
        }
      elem = m->esize;
      guint64 off = g_array_index (b->p->units, StowUnit, unit).offset
                    - g_array_index (b->p->units, StowUnit, 0).offset;
      from = m->host_weights + off * elem;
      to = stow_tensor_map_unit (m, dst, unit);
    }
  else
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend copies a unit's gradients down, its "
                   "weights up (ZeRO-Offload, streamed layers) and optimizer "
                   "chunks to and from NVMe; not this copy (%s to %s)",
                   stow_tier_name (op->src), stow_tier_name (op->dst));
      return FALSE;
    }
  guint64 bytes = unit_numel (b, unit) * elem;
  if (op->bytes != bytes)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "the copy moves %" G_GUINT64_FORMAT
                   " B; unit %u holds %" G_GUINT64_FORMAT " B",
                   op->bytes, unit, bytes);
      return FALSE;
    }
  memcpy (to, from, bytes);
  return TRUE;
}

static gboolean
run_op (CpuBackend *b, guint i, GError **error)
{
  const StowOp *op = &g_array_index (b->p->ops, StowOp, i);
  switch (op->kind)
    {
    case STOW_OP_DATA:
      {
        guint8 *in = b->map.addr[b->map.input_of[op->micro_batch]];
        guint64 n = b->map.n_tokens;
        return b->data (b->data_user, b->step, op->micro_batch, (gint32 *)in,
                        (gint32 *)(in + 4 * n), n, error);
      }
    case STOW_OP_FORWARD:
    case STOW_OP_RECOMPUTE:
      return run_forward (b, op, error);
    case STOW_OP_LOSS:
      return run_loss (b, op, error);
    case STOW_OP_BACKWARD:
      return run_backward (b, op, error);
    case STOW_OP_GRAD_NORM:
      return run_grad_norm (b, op, error);
    case STOW_OP_OPTIM_STEP:
      return run_optim (b, op, error);
    case STOW_OP_COPY:
      return run_copy (b, op, error);
    default:
      {
        g_autofree char *what = stow_op_describe (b->p, i);
        g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                     "op %s: the cpu backend does not run %s ops yet "
                     "(multi-device layouts)",
                     what, stow_op_kind_name (op->kind));
        return FALSE;
      }
    }
}

/* ---- buffers ------------------------------------------------------------- */

static gboolean
alloc_buffer (CpuBackend *b, guint bi, GError **error)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->map.addr[bi] != NULL)
    return TRUE; /* persistent, from an earlier step */
  if (is_occupant (buf) && (gsize)buf->slot < G_N_ELEMENTS (b->map.slot_buf)
      && b->map.slot_buf[buf->slot] != STOW_NONE)
    {
      /* A slot's occupant: the slot buffer's bytes (persistent). */
      b->map.addr[bi] = b->map.addr[b->map.slot_buf[buf->slot]];
      g_assert (b->map.addr[bi] != NULL);
      return TRUE;
    }
  if (is_occupant (buf))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "\"%s\": slot %d has no persistent buffer in the program",
                   buf->name, buf->slot);
      return FALSE;
    }
  if (buf->tier == STOW_TIER_NVME)
    return TRUE; /* the swap's files hold it; no address */
  if (is_swap_buffer (buf) && b->swap != NULL)
    {
      b->map.addr[bi] = stow_state_swap_take (b->swap, buf->bytes, error);
      if (b->map.addr[bi] != NULL)
        count_pinned (b, buf, TRUE);
      return b->map.addr[bi] != NULL;
    }
  if (buf->tier != STOW_TIER_DEVICE)
    {
      /* Host tiers, not counted against the device: the persistent pinned
       * buffers from the locked pool, the rest plain memory. */
      if (buf->persistent && buf->tier == STOW_TIER_PINNED
          && b->pinned_pool != NULL)
        {
          b->map.addr[bi]
              = stow_pinned_pool_alloc (b->pinned_pool, buf->bytes, error);
          if (b->map.addr[bi] == NULL)
            return FALSE;
          count_pinned (b, buf, TRUE);
          return TRUE;
        }
      b->map.addr[bi] = host_alloc (buf->bytes);
      if (b->map.addr[bi] == NULL)
        {
          g_set_error (error, STOW_BACKEND_ERROR,
                       STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                       "%s \"%s\" (%" G_GUINT64_FORMAT " B): out of host memory",
                       stow_tier_name (buf->tier), buf->name, buf->bytes);
          return FALSE;
        }
      count_pinned (b, buf, TRUE);
      return TRUE;
    }
  g_mutex_lock (&b->lock);
  gboolean frag = FALSE;
  void *p = stow_arena_alloc (b->arena, buf->bytes, &frag);
  guint64 in_use = stow_arena_in_use (b->arena);
  g_mutex_unlock (&b->lock);
  if (p == NULL)
    {
      g_autofree char *need = g_format_size_full (buf->bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *used = g_format_size_full (in_use, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *cap = g_format_size_full (stow_arena_capacity (b->arena),
                                                 G_FORMAT_SIZE_IEC_UNITS);
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "device memory: \"%s\" (%s) does not fit%s: %s in use of "
                   "%s (--device-memory)",
                   buf->name, need,
                   frag ? " in one free run (fragmented)" : "", used, cap);
      return FALSE;
    }
  b->map.addr[bi] = p;
  return TRUE;
}

static void
free_buffer (CpuBackend *b, guint bi)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->map.addr[bi] == NULL)
    return;
  if (is_occupant (buf))
    ; /* a slot's occupant: the slot stays */
  else if (in_pool (b, buf))
    count_pinned (b, buf, FALSE); /* the pool's, until the end */
  else if (is_swap_buffer (buf) && b->swap != NULL)
    {
      stow_state_swap_give (b->swap, b->map.addr[bi]);
      count_pinned (b, buf, FALSE);
    }
  else if (buf->tier != STOW_TIER_DEVICE)
    {
      g_aligned_free (b->map.addr[bi]);
      count_pinned (b, buf, FALSE);
    }
  else
    {
      g_mutex_lock (&b->lock);
      stow_arena_release (b->arena, b->map.addr[bi]);
      g_mutex_unlock (&b->lock);
    }
  b->map.addr[bi] = NULL;
}

/* ---- workers -------------------------------------------------------------- */

static void
push (CpuBackend *b, StowStream s, TaskKind kind, guint index, guint op)
{
  Task *t = g_new (Task, 1);
  t->kind = kind, t->index = index, t->op = op;
  g_async_queue_push (b->workers[s].queue, t);
}

static gpointer
worker_main (gpointer data)
{
  Worker *w = data;
  CpuBackend *b = w->b;
  for (;;)
    {
      g_autofree Task *t = g_async_queue_pop (w->queue);
      if (t->kind == TASK_STOP)
        break;
      switch (t->kind)
        {
        case TASK_WAIT:
          g_mutex_lock (&b->lock);
          while (!b->recorded[t->index] && b->error == NULL)
            g_cond_wait (&b->cond, &b->lock);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_RECORD:
          g_mutex_lock (&b->lock);
          b->recorded[t->index] = TRUE;
          g_cond_broadcast (&b->cond);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_FENCE:
          g_mutex_lock (&b->lock);
          b->fences++;
          g_cond_broadcast (&b->cond);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_ALLOC:
        case TASK_FREE:
        case TASK_OP:
          {
            if (failed (b))
              break;
            double t0 = now_s (b);
            GError *e = NULL;
            gboolean ok = TRUE;
            if (t->kind == TASK_ALLOC)
              ok = alloc_buffer (b, t->index, &e);
            else if (t->kind == TASK_FREE)
              free_buffer (b, t->index);
            else
              {
                const StowOp *op = &g_array_index (b->p->ops, StowOp, t->index);
                if (op->kind == STOW_OP_COPY && b->copy_delay_us)
                  g_usleep (b->copy_delay_us);
                ok = run_op (b, t->index, &e);
              }
            if (!ok)
              {
                guint at = t->kind == TASK_OP ? t->index : t->op;
                if (at != STOW_NONE)
                  {
                    g_autofree char *what = stow_op_describe (b->p, at);
                    g_prefix_error (&e, "op %s: ", what);
                  }
                fail (b, e);
              }
            guint at = t->kind == TASK_OP ? t->index : t->op;
            if (at != STOW_NONE)
              {
                b->op_start[at] = t0;
                b->op_end[at] = now_s (b);
              }
          }
          break;
        case TASK_STOP:
          break;
        }
    }
  return NULL;
}

/* ---- the table ------------------------------------------------------------ */

static void
cpu_event_wait (StowBackend *bb, guint rank, StowStream s, guint event)
{
  push ((CpuBackend *)bb, s, TASK_WAIT, event, STOW_NONE);
}

static gboolean
cpu_buffer_alloc (StowBackend *bb, const StowProgram *p, guint buffer, guint op,
                  GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (op == STOW_NONE)
    return alloc_buffer (b, buffer, error); /* persistent: now */
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  push (b, o->stream, TASK_ALLOC, buffer, op);
  return TRUE;
}

static void
cpu_buffer_free (StowBackend *bb, const StowProgram *p, guint buffer, guint op)
{
  CpuBackend *b = (CpuBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  push (b, o->stream, TASK_FREE, buffer, op);
}

static gboolean
cpu_issue (StowBackend *bb, const StowProgram *p, guint op, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  if (o->rank != 0)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs one rank; the program has %u",
                   p->n_ranks);
      return FALSE;
    }
  push (b, o->stream, TASK_OP, op, op);
  return TRUE;
}

static void
cpu_event_record (StowBackend *bb, guint rank, StowStream s, guint event,
                  guint op)
{
  push ((CpuBackend *)bb, s, TASK_RECORD, event, op);
}

static gboolean
cpu_synchronize (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_mutex_lock (&b->lock);
  b->fences = 0;
  g_mutex_unlock (&b->lock);
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    push (b, s, TASK_FENCE, 0, STOW_NONE);
  g_mutex_lock (&b->lock);
  while (b->fences < STOW_N_STREAMS)
    g_cond_wait (&b->cond, &b->lock);
  GError *e = b->error;
  b->error = NULL;
  g_mutex_unlock (&b->lock);
  if (e != NULL)
    {
      g_propagate_error (error, e);
      return FALSE;
    }
  return TRUE;
}

static double
cpu_now (StowBackend *bb)
{
  return now_s ((CpuBackend *)bb);
}

static void
cpu_op_times (StowBackend *bb, guint op, double *start, double *end)
{
  CpuBackend *b = (CpuBackend *)bb;
  *start = b->op_start[op];
  *end = MAX (b->op_end[op], b->op_start[op]);
}

static void
cpu_fill_memory (StowBackend *bb, const StowProgram *p, StowTrace *t)
{
  CpuBackend *b = (CpuBackend *)bb;
  t->peak_bytes[STOW_TIER_DEVICE] = stow_arena_peak (b->arena);
}

static void
cpu_destroy (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (b->workers[s].thread)
      {
        push (b, s, TASK_STOP, 0, STOW_NONE);
        g_thread_join (b->workers[s].thread);
        g_async_queue_unref (b->workers[s].queue);
      }
  /* The delayed update swaps the host gradients with prev_grads: each
   * goes back to whoever allocated it. */
  if (b->own_grads != NULL && b->map.addr[b->map.host_grads_buf] != b->own_grads)
    {
      b->prev_grads = b->map.addr[b->map.host_grads_buf];
      b->map.addr[b->map.host_grads_buf] = b->own_grads;
    }
  for (guint i = 0; b->map.addr && i < b->n_buffers; i++)
    if (b->map.addr[i] && buf_of (b, i)->tier != STOW_TIER_DEVICE
        && !is_occupant (buf_of (b, i)) && !in_pool (b, buf_of (b, i))
        && !(is_swap_buffer (buf_of (b, i)) && b->swap != NULL))
      g_aligned_free (b->map.addr[i]);
  if (b->pinned_pool)
    stow_pinned_pool_free (b->pinned_pool);
  if (b->swap)
    stow_state_swap_free (b->swap);
  if (b->params)
    stow_param_swap_free (b->params);
  g_clear_error (&b->access_error);
  stow_tensor_map_clear (&b->map);
  g_aligned_free (b->prev_grads);
  g_free (b->recorded);
  g_free (b->op_start);
  g_free (b->op_end);
  if (b->error)
    g_error_free (b->error);
  if (b->arena)
    stow_arena_free (b->arena);
  if (b->adam)
    stow_adam_free (b->adam);
  if (b->llama)
    stow_llama_free (b->llama);
  if (b->model)
    stow_model_unref (b->model);
  g_mutex_clear (&b->lock);
  g_cond_clear (&b->cond);
  g_free (b);
}

static const StowBackendVtable cpu_vtable = {
  .name = "cpu",
  .virtual_time = FALSE,
  .event_wait = cpu_event_wait,
  .buffer_alloc = cpu_buffer_alloc,
  .buffer_free = cpu_buffer_free,
  .issue = cpu_issue,
  .event_record = cpu_event_record,
  .synchronize = cpu_synchronize,
  .now = cpu_now,
  .op_times = cpu_op_times,
  .fill_memory = cpu_fill_memory,
  .destroy = cpu_destroy,
};

StowBackend *
stow_backend_cpu_new (const StowCpuSetup *setup, GError **error)
{
  g_return_val_if_fail (setup != NULL && setup->program != NULL
                            && setup->model != NULL && setup->data != NULL,
                        NULL);
  const StowProgram *p = setup->program;
  CpuBackend *b = g_new0 (CpuBackend, 1);
  b->parent.vt = &cpu_vtable;
  g_mutex_init (&b->lock);
  g_cond_init (&b->cond);
  b->p = p;
  b->model = stow_model_ref ((StowModel *)setup->model);
  b->data = setup->data;
  b->data_user = setup->data_user;
  b->copy_delay_us = setup->copy_delay_us;
  b->delayed = setup->delayed_update;
  b->no_pin = setup->no_pin;
  b->n_buffers = p->buffers->len;
  b->recorded = g_new0 (gboolean, MAX (p->events->len, 1));
  b->op_start = g_new0 (double, MAX (p->ops->len, 1));
  b->op_end = g_new0 (double, MAX (p->ops->len, 1));
  b->t0_us = g_get_monotonic_time ();
  if (!stow_tensor_map_init (&b->map, p, b->model, "cpu", error))
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  if (b->delayed)
    {
      guint64 numel = b->map.numel;
      b->prev_grads = b->map.host_grads_buf != STOW_NONE
                          ? host_alloc (numel * stow_dtype_size (p->grad_dtype))
                          : NULL;
      if (b->prev_grads == NULL)
        {
          g_set_error (error, STOW_BACKEND_ERROR,
                       b->map.host_grads_buf == STOW_NONE
                           ? STOW_BACKEND_ERROR_UNSUPPORTED
                           : STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                       b->map.host_grads_buf == STOW_NONE
                           ? "the delayed update is ZeRO-Offload's: it needs "
                             "the optimizer in host memory"
                           : "the delayed update's gradients: out of host "
                             "memory");
          cpu_destroy (&b->parent);
          return NULL;
        }
    }
  if (b->map.params_nvme && !p->master_weights)
    {
      /* CPU Adam leaves the updated weights where the gradients were (no
       * host copy of weights on NVMe); fp32 training updates the weights
       * themselves, which would first have to be read back. */
      g_set_error_literal (
          error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
          "--offload-params nvme runs with --precision bf16 (fp32 master "
          "weights in the optimizer's states); fp32 training keeps its "
          "weights in host memory: --offload-params cpu");
      cpu_destroy (&b->parent);
      return NULL;
    }
  if (b->map.params_nvme)
    {
      b->params = stow_param_swap_new (&b->map, &setup->swap, error);
      if (b->params == NULL)
        {
          cpu_destroy (&b->parent);
          return NULL;
        }
    }
  if (b->map.states_nvme)
    {
      /* A test's fault goes to the weights' store when there is one. */
      StowSwapSetup ss = setup->swap;
      if (b->params != NULL)
        ss.fault = STOW_NVME_FAULT_NONE;
      b->swap = stow_state_swap_new (&b->map, &ss, error);
      if (b->swap == NULL)
        {
          cpu_destroy (&b->parent);
          return NULL;
        }
    }
  b->llama = stow_llama_new (&b->map.config, b->map.ftype, p->seq_len,
                             setup->n_threads, error);
  if (b->llama == NULL)
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  b->adam = stow_adam_new (setup->n_threads, STOW_ISA_AUTO, error);
  if (b->adam == NULL)
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  b->arena = stow_arena_new (setup->device_capacity_bytes, error);
  if (b->arena == NULL)
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      Worker *w = &b->workers[s];
      w->b = b;
      w->stream = s;
      w->queue = g_async_queue_new ();
      g_autofree char *name = g_strdup_printf ("stow-%s", stow_stream_name (s));
      w->thread = g_thread_new (name, worker_main, w);
    }
  return &b->parent;
}

gboolean
stow_backend_cpu_alloc_persistent (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  /* The persistent pinned buffers in one pool of ordinary pages, locked
   * once they are all in it (train's preflight has checked
   * RLIMIT_MEMLOCK; --allow-unpinned leaves them pageable). */
  guint64 pinned = 0;
  for (guint i = 0; i < b->n_buffers; i++)
    {
      const StowBuffer *buf = buf_of (b, i);
      if (buf->persistent && buf->tier == STOW_TIER_PINNED)
        pinned += (MAX (buf->bytes, 1) + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN
                  * STOW_NVME_ALIGN;
    }
  if (pinned > 0 && b->pinned_pool == NULL)
    {
      StowPinnedOptions po = { 0 };
      po.slab_bytes = pinned;
      po.numa_node = -1;
      po.no_cuda = TRUE;
      po.defer_pin = TRUE;
      po.huge_pages = STOW_HUGE_PAGES_OFF;
      b->pinned_pool = stow_pinned_pool_new (&po);
    }
  for (guint i = 0; i < b->n_buffers; i++)
    if (buf_of (b, i)->persistent && !alloc_buffer (b, i, error))
      return FALSE;
  if (b->pinned_pool != NULL && !b->no_pin)
    stow_pinned_pool_pin (b->pinned_pool);
  if (b->map.host_grads_buf != STOW_NONE)
    b->own_grads = b->map.addr[b->map.host_grads_buf];
  /* The program's host buffer of the weights: what CPU Adam writes (and,
   * streamed, where the weights live). */
  if (b->map.host_weights_buf != STOW_NONE)
    b->map.host_weights = b->map.addr[b->map.host_weights_buf];
  /* With the weights on NVMe CPU Adam writes the updated ones over the
   * gradients they came from (planner/schedule.c, adam_out). */
  if (b->params != NULL)
    b->map.host_weights = b->map.addr[b->map.host_grads_buf];
  return TRUE;
}

void
stow_backend_cpu_begin_step (StowBackend *bb, guint64 step)
{
  CpuBackend *b = (CpuBackend *)bb;
  b->step = step;
  b->loss_sum = 0;
  b->grad_norm = NAN;
  b->clip_coef = 1.0;
  b->skip = FALSE;
  b->lr = stow_optim_lr_at (&b->p->optim, step);
  if (b->delayed)
    {
      /* The gradients the last step left go aside for this step's update;
       * this step's go where they were. */
      StowTensorMap *m = &b->map;
      guint8 *t = m->addr[m->host_grads_buf];
      m->addr[m->host_grads_buf] = b->prev_grads;
      b->prev_grads = t;
      b->apply_prev = b->have_grads && step > 1;
      b->have_grads = TRUE;
    }
  memset (b->recorded, 0, sizeof (gboolean) * MAX (b->p->events->len, 1));
  memset (b->op_start, 0, sizeof (double) * MAX (b->p->ops->len, 1));
  memset (b->op_end, 0, sizeof (double) * MAX (b->p->ops->len, 1));
}

void
stow_backend_cpu_step_stats (StowBackend *bb, StowStepStats *out)
{
  CpuBackend *b = (CpuBackend *)bb;
  out->loss = b->loss_sum * b->p->loss_scale;
  out->grad_norm = b->grad_norm;
  out->skipped = b->skip;
  out->lr = b->lr;
}

guint64
stow_backend_cpu_peak_bytes (StowBackend *bb)
{
  return stow_arena_peak (((CpuBackend *)bb)->arena);
}

void
stow_backend_cpu_reset_peak (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  stow_arena_reset_peak (b->arena);
  g_mutex_lock (&b->lock);
  b->pinned_peak = b->pinned_in_use;
  g_mutex_unlock (&b->lock);
}

guint64
stow_backend_cpu_pinned_peak_bytes (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_mutex_lock (&b->lock);
  guint64 n = b->pinned_peak;
  g_mutex_unlock (&b->lock);
  return n;
}

void *
stow_backend_cpu_weights (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (b->params != NULL)
    {
      g_autoptr (GError) e = NULL;
      void *w = stow_param_swap_unit (b->params, unit, &e);
      if (w == NULL && b->access_error == NULL)
        b->access_error = g_steal_pointer (&e);
      return w;
    }
  if (m->weights_buf == STOW_NONE)
    return m->addr[m->host_weights_buf]
               ? stow_tensor_map_unit (m, m->host_weights_buf, unit)
               : NULL;
  return m->addr[m->weights_buf] ? stow_tensor_map_unit (m, m->weights_buf, unit)
                                 : NULL;
}

float *
stow_backend_cpu_master (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (!b->p->master_weights || m->states_nvme
      || m->addr[m->states_master ? m->states_buf : m->master_buf] == NULL)
    return NULL;
  return stow_tensor_map_state (m, unit, 0);
}

float *
stow_backend_cpu_moment (StowBackend *bb, guint unit, guint which)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (m->states_nvme || m->addr[m->states_buf] == NULL)
    return NULL;
  return stow_tensor_map_state (m, unit, 1 + which);
}

gboolean
stow_backend_cpu_states (StowBackend *bb, gboolean write, guint unit,
                         guint which, guint64 first, guint64 n, float *data,
                         GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (b->swap == NULL)
    {
      g_set_error_literal (error, STOW_BACKEND_ERROR,
                           STOW_BACKEND_ERROR_INVALID,
                           "the optimizer states are not on NVMe");
      return FALSE;
    }
  return stow_state_swap_access (b->swap, write, unit, which, first, n, data,
                                 error);
}

void *
stow_backend_cpu_pending (StowBackend *bb, guint unit, gboolean *pending)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (!b->delayed || m->addr[m->host_grads_buf] == NULL)
    return NULL;
  if (pending)
    *pending = b->have_grads;
  return stow_tensor_map_unit (m, m->host_grads_buf, unit);
}

void
stow_backend_cpu_set_pending (StowBackend *bb, gboolean pending)
{
  ((CpuBackend *)bb)->have_grads = pending;
}

char *
stow_backend_cpu_describe_pinned (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  return b->pinned_pool ? stow_pinned_pool_describe (b->pinned_pool) : NULL;
}

GError *
stow_backend_cpu_take_access_error (StowBackend *bb)
{
  return g_steal_pointer (&((CpuBackend *)bb)->access_error);
}

char *
stow_backend_cpu_describe_swap (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_autofree char *s = b->swap ? stow_state_swap_describe (b->swap) : NULL;
  g_autofree char *w = b->params ? stow_param_swap_describe (b->params) : NULL;
  if (s && w)
    return g_strdup_printf ("%s\n%s", w, s);
  return g_strdup (s ? s : w);
}

gboolean
stow_backend_cpu_push (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (b->swap != NULL && !stow_state_swap_flush (b->swap, error))
    return FALSE;
  if (b->params != NULL)
    {
      /* The resident units take their weights from the store. */
      for (guint u = 0; u < b->p->units->len; u++)
        if (m->unit_weights[u] != STOW_NONE)
          {
            void *w = stow_param_swap_unit (b->params, u, error);
            if (w == NULL)
              return FALSE;
            memcpy (m->addr[m->unit_weights[u]], w,
                    unit_numel (b, u) * m->esize);
          }
      return stow_param_swap_flush (b->params, error);
    }
  if (m->weights_buf == STOW_NONE)
    {
      /* The resident units take their weights from the host. */
      for (guint u = 0; u < b->p->units->len; u++)
        if (m->unit_weights[u] != STOW_NONE)
          memcpy (m->addr[m->unit_weights[u]],
                  stow_tensor_map_unit (m, m->host_weights_buf, u),
                  unit_numel (b, u) * m->esize);
      return TRUE;
    }
  if (m->host_weights == NULL || m->addr[m->weights_buf] == NULL)
    return TRUE;
  memcpy (m->host_weights, m->addr[m->weights_buf], m->numel * m->esize);
  return TRUE;
}
