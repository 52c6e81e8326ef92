/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/cuda.c: the cuda backend (cuda.h).  The driver
 * issues each stream's ops in program order from one host thread; here
 * each op becomes work on its CUDA stream at once, and returns.  Buffers
 * are carved from one device region by the arena bookkeeping at issue
 * time; a block freed on one stream and handed out again on another waits
 * for an event recorded at the free (as stream-ordered allocators do), so
 * reuse never races the work still reading it.
 */
#include "executor/backends/cuda/cuda.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "executor/arena.h"
#include "executor/backends/cuda/llama-cuda.h"
#include "executor/backends/decoder-ops.h"
#include "executor/backends/tensors.h"
#include "offload/adam.h"
#include "offload/pinned.h"
#include "program/trace.h"

/* A block freed on @stream: a later alloc of bytes in [lo, hi) on another
 * stream waits for @event. */
typedef struct
{
  guint64 lo, hi;
  StowStream stream;
  cudaEvent_t event;
} PendingFree;

typedef struct _CudaBackend CudaBackend;

/* A host op (CPU Adam, the gradients' norm on the host) in its stream's
 * order: a host function on that CUDA stream, so that events order it
 * against the device's work as they order the device's ops. */
typedef struct
{
  CudaBackend *b;
  guint op;
} HostJob;

struct _CudaBackend
{
  StowBackend parent;
  const StowProgram *p;
  StowModel *model;
  StowTensorMap map; /* map.addr: device addresses of the buffers */
  StowLlamaCuda *llama;
  StowBatches *data;
  StowBatches *eval_data; /* or NULL */
  /* the device tier */
  void *dev_base;
  StowArena *arena;
  GArray *pending; /* PendingFree */
  GPtrArray *spare_events;
  cudaStream_t streams[STOW_N_STREAMS];
  cudaEvent_t *events; /* [program event] */
  cudaEvent_t *op_ev;  /* [2 op]: start, end of each op */
  gboolean *op_timed;  /* [op]: its events were recorded this step */
  cudaEvent_t t0;      /* the step's origin, on the compute stream */
  /* host side */
  gint32 *staging; /* pinned: m micro-batches' tokens and targets, each as
                     the INPUT buffer holds them (input.x bytes) */
  StowCudaOptimState *state_h; /* pinned */
  StowCudaOptimState *state_d;
  double *loss_h, *loss_d; /* pinned / device: the step's loss sum */
  void **shadow;           /* [buffer]: host copies of persistent ones */
  GError *error;           /* the first failure at issue time */
  guint64 step;            /* or with eval the evaluation batch (begin_eval) */
  gboolean eval;
  double loss_scale; /* the step's: 1 / its targets */
  double lr;
  /* ZeRO-Offload: the program's pinned buffers (registered with CUDA),
   * CPU Adam, and what the host ops found, under host_lock (they run on
   * CUDA's host-function thread). */
  StowPinnedPool *pinned_pool;
  guint64 pinned_bytes; /* the persistent pinned buffers taken so far */
  StowAdam *adam;
  HostJob *jobs; /* [op] */
  GMutex host_lock;
  GError *host_error;
  double host_norm, host_clip;
  gboolean host_skip;
  /* ZeRO-Offload's delayed update (tensors.h), its prev_grads pinned. */
  StowDelayed delayed;
};

static gboolean
cuda_ok (cudaError_t e, const char *what, GError **error)
{
  if (e == cudaSuccess)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_FAILED,
               "cuda: %s: %s (%s)", what, cudaGetErrorString (e),
               cudaGetErrorName (e));
  cudaGetLastError (); /* clear a non-sticky error */
  return FALSE;
}

/* Records the first failure of work issued without a GError to return. */
static void
check (CudaBackend *b, cudaError_t e, const char *what)
{
  GError *err = NULL;
  if (!cuda_ok (e, what, &err))
    {
      if (b->error == NULL)
        b->error = err;
      else
        g_error_free (err);
    }
}

gboolean
stow_backend_cuda_available (GError **error)
{
  return stow_cuda_available (error);
}

gboolean
stow_backend_cuda_device_info (char **name, guint64 *free_bytes,
                               guint64 *total_bytes, GError **error)
{
  int dev = 0;
  struct cudaDeviceProp prop;
  size_t fr = 0, tot = 0;
  if (!cuda_ok (cudaGetDevice (&dev), "cudaGetDevice", error)
      || !cuda_ok (cudaGetDeviceProperties (&prop, dev),
                   "cudaGetDeviceProperties", error)
      || !cuda_ok (cudaMemGetInfo (&fr, &tot), "cudaMemGetInfo", error))
    return FALSE;
  if (name)
    *name = g_strdup (prop.name);
  if (free_bytes)
    *free_bytes = fr;
  if (total_bytes)
    *total_bytes = tot;
  return TRUE;
}

static const StowBuffer *
buf_of (CudaBackend *b, guint i)
{
  return stow_tensor_map_buffer (&b->map, i);
}

static cudaStream_t
stream_of (CudaBackend *b, const StowOp *op)
{
  return b->streams[op->stream];
}

/* ---- buffers ---------------------------------------------------------- */

static cudaEvent_t
take_event (CudaBackend *b)
{
  if (b->spare_events->len > 0)
    return g_ptr_array_steal_index_fast (b->spare_events,
                                         b->spare_events->len - 1);
  cudaEvent_t e = NULL;
  check (b, cudaEventCreateWithFlags (&e, cudaEventDisableTiming),
         "cudaEventCreate");
  return e;
}

/* Makes @stream wait for earlier frees, on other streams, of the bytes
 * [lo, hi); forgets the frees whose work is done. */
static void
wait_for_frees (CudaBackend *b, StowStream stream, guint64 lo, guint64 hi)
{
  for (guint i = 0; i < b->pending->len;)
    {
      PendingFree *f = &g_array_index (b->pending, PendingFree, i);
      if (cudaEventQuery (f->event) == cudaSuccess)
        {
          g_ptr_array_add (b->spare_events, f->event);
          g_array_remove_index_fast (b->pending, i);
          continue;
        }
      cudaGetLastError (); /* cudaErrorNotReady is not an error */
      if (f->stream != stream && f->lo < hi && lo < f->hi)
        check (b, cudaStreamWaitEvent (b->streams[stream], f->event, 0),
               "cudaStreamWaitEvent (reuse)");
      i++;
    }
}

static gboolean
alloc_buffer (CudaBackend *b, guint bi, StowStream stream, GError **error)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->map.addr[bi] != NULL)
    return TRUE; /* persistent, from an earlier step */
  if (stow_buffer_is_occupant (buf)
      && (gsize)buf->slot < G_N_ELEMENTS (b->map.slot_buf)
      && b->map.slot_buf[buf->slot] != STOW_NONE
      && b->map.addr[b->map.slot_buf[buf->slot]] != NULL
      && buf->tier == STOW_TIER_DEVICE)
    {
      /* A slot's occupant: the persistent slot's bytes, which the
       * program's events hand from one occupant to the next. */
      b->map.addr[bi] = b->map.addr[b->map.slot_buf[buf->slot]];
      return TRUE;
    }
  if (buf->tier == STOW_TIER_PINNED && buf->persistent
      && b->pinned_pool != NULL)
    {
      b->map.addr[bi]
          = stow_pinned_pool_alloc (b->pinned_pool, buf->bytes, error);
      if (b->map.addr[bi] != NULL)
        b->pinned_bytes += buf->bytes;
      return b->map.addr[bi] != NULL;
    }
  if (buf->tier != STOW_TIER_DEVICE || stow_buffer_is_occupant (buf))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "\"%s\" (%s): the cuda backend runs the placements that "
                   "keep the weights on the device, with the optimizer there "
                   "or in host memory (--offload-optimizer cpu); NVMe and "
                   "streamed weights run on the cpu backend so far",
                   buf->name, stow_tier_name (buf->tier));
      return FALSE;
    }
  gboolean frag = FALSE;
  void *p = stow_arena_alloc (b->arena, buf->bytes, &frag);
  if (p == NULL)
    {
      g_autofree char *need
          = g_format_size_full (buf->bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *used = g_format_size_full (stow_arena_in_use (b->arena),
                                                  G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *cap = g_format_size_full (stow_arena_capacity (b->arena),
                                                 G_FORMAT_SIZE_IEC_UNITS);
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "device memory: \"%s\" (%s) does not fit%s: %s in use of "
                   "%s (--device-memory)",
                   buf->name, need, frag ? " in one free run (fragmented)" : "",
                   used, cap);
      return FALSE;
    }
  if (buf->bytes > 0)
    {
      guint64 lo = (guint64)((guint8 *)p - (guint8 *)b->dev_base);
      wait_for_frees (b, stream, lo, lo + buf->bytes);
    }
  b->map.addr[bi] = p;
  return TRUE;
}

static void
free_buffer (CudaBackend *b, guint bi, StowStream stream)
{
  const StowBuffer *buf = buf_of (b, bi);
  void *p = b->map.addr[bi];
  if (p == NULL)
    return;
  b->map.addr[bi] = NULL;
  if (buf->bytes == 0 || buf->tier != STOW_TIER_DEVICE)
    return; /* a slot's occupant, the arena's empty block, or host */
  PendingFree f;
  f.lo = (guint64)((guint8 *)p - (guint8 *)b->dev_base);
  f.hi = f.lo + MAX (buf->bytes, 1);
  f.stream = stream;
  f.event = take_event (b);
  check (b, cudaEventRecord (f.event, b->streams[stream]), "cudaEventRecord");
  g_array_append_val (b->pending, f);
  stow_arena_release (b->arena, p);
}

/* ---- the ops ------------------------------------------------------------ */

static gboolean
run_data (CudaBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint64 n = m->n_tokens;
  /* Tokens then targets, laid out as the INPUT buffer holds them: one
   * copy up. */
  guint8 *host = (guint8 *)b->staging + (gsize)op->micro_batch * m->input.x;
  stow_batches_fill (b->eval ? b->eval_data : b->data, b->step, op->micro_batch,
                     (gint32 *)(host + m->input.tokens),
                     (gint32 *)(host + m->input.targets), n);
  return cuda_ok (cudaMemcpyAsync (m->addr[m->input_of[op->micro_batch]], host,
                                   m->input.x, cudaMemcpyHostToDevice,
                                   stream_of (b, op)),
                  "tokens to the device", error);
}

/* The global norm: sums of squares in unit order, then the clip
 * coefficient and the skip flag, all on the device. */
static void
run_grad_norm (CudaBackend *b)
{
  StowTensorMap *m = &b->map;
  StowDtype gt = b->p->grad_dtype;
  check (b,
         cudaMemsetAsync (&b->state_d->sumsq, 0, sizeof (double),
                          b->streams[STOW_STREAM_COMPUTE]),
         "cudaMemsetAsync");
  for (guint u = 0; u < b->p->units->len; u++)
    stow_llama_cuda_grad_sumsq (
        b->llama, stow_tensor_map_unit (m, m->grads_buf, u), gt,
        g_array_index (b->p->units, StowUnit, u).numel, b->state_d);
  stow_llama_cuda_clip (b->llama, 1.0, b->p->optim.max_grad_norm, b->state_d);
}

/* ---- host ops (ZeRO-Offload) ----------------------------------------------
 */

static void
host_fail (CudaBackend *b, GError *e)
{
  g_mutex_lock (&b->host_lock);
  if (b->host_error == NULL)
    b->host_error = e;
  else
    g_error_free (e);
  g_mutex_unlock (&b->host_lock);
}

/* The global norm over the host gradients, unit by unit in unit order
 * (the cpu backend's sums), and from it the clip coefficient and skip. */
static void
host_grad_norm (CudaBackend *b, const StowOp *op)
{
  StowTensorMap *m = &b->map;
  guint gbuf = stow_tensor_map_io (m, op, FALSE, STOW_BUF_GRADS);
  if (gbuf == STOW_NONE)
    gbuf = m->host_grads_buf;
  double clip = 1.0;
  gboolean skip = FALSE;
  double norm = stow_tensor_map_grad_norm (
      m, b->adam, gbuf, b->p->optim.max_grad_norm, &clip, &skip);
  g_mutex_lock (&b->host_lock);
  b->host_norm = norm, b->host_clip = clip, b->host_skip = skip;
  g_mutex_unlock (&b->host_lock);
}

/* CPU Adam on one unit: the host gradients, master and moments, writing
 * the host copy of the weights that the "updated up" copy takes to the
 * device (stow_adam_step, as on the cpu backend: the same bits). */
static void
host_adam (CudaBackend *b, const StowOp *op)
{
  g_mutex_lock (&b->host_lock);
  StowAdamStep st = { b->step, 1.0, b->host_clip, FALSE };
  gboolean skip = b->host_skip;
  g_mutex_unlock (&b->host_lock);
  if (skip)
    return;
  GError *e = NULL;
  if (b->delayed.on)
    {
      if (!stow_delayed_apply (&b->delayed, &b->map, b->adam, op->unit, b->step,
                               &e))
        host_fail (b, e);
      return;
    }
  if (!stow_tensor_map_adam_unit (&b->map, b->adam, op->unit, &st, b->lr, &e))
    host_fail (b, e);
}

static void CUDART_CB
host_job (void *data)
{
  HostJob *j = data;
  const StowOp *op = &g_array_index (j->b->p->ops, StowOp, j->op);
  if (op->kind == STOW_OP_GRAD_NORM)
    host_grad_norm (j->b, op);
  else
    host_adam (j->b, op);
}

static gboolean
run_host (CudaBackend *b, guint i, GError **error)
{
  const StowOp *op = &g_array_index (b->p->ops, StowOp, i);
  if (b->adam == NULL || b->map.host_weights == NULL
      || (op->kind == STOW_OP_OPTIM_STEP && op->unit == STOW_NONE))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cuda backend runs CPU Adam on whole units with the "
                   "optimizer states in host memory (--offload-optimizer "
                   "cpu); not on NVMe chunks yet");
      return FALSE;
    }
  b->jobs[i].b = b, b->jobs[i].op = i;
  return cuda_ok (cudaLaunchHostFunc (stream_of (b, op), host_job, &b->jobs[i]),
                  "cudaLaunchHostFunc", error);
}

/* A copy between the arena and the pinned buffers, the range the program
 * names (stow_tensor_map_copy_ends, as the cpu backend), on the op's
 * stream. */
static gboolean
run_copy (CudaBackend *b, const StowOp *op, GError **error)
{
  const guint8 *from = NULL;
  guint8 *to = NULL;
  guint64 bytes = 0;
  if (op->src == STOW_TIER_NVME || op->dst == STOW_TIER_NVME)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cuda backend does not run NVMe placements yet");
      return FALSE;
    }
  if (!stow_tensor_map_copy_ends (&b->map, op, &from, &to, &bytes, error))
    return FALSE;
  return cuda_ok (
      cudaMemcpyAsync (to, from, bytes, cudaMemcpyDefault, stream_of (b, op)),
      "cudaMemcpyAsync (copy op)", error);
}

static gboolean
run_optim (CudaBackend *b, const StowOp *op, GError **error)
{
  const StowUnit *u = &g_array_index (b->p->units, StowUnit, op->unit);
  StowAdamStep st = { b->step, 1.0, 1.0, FALSE };
  for (guint k = 0; k < u->n_tensors; k++)
    {
      StowAdamConfig cfg;
      StowAdamTensor at;
      stow_tensor_map_adam (&b->map, op->unit, k, b->lr, &cfg, &at);
      stow_llama_cuda_adam (b->llama, &cfg, &st, &at, b->state_d);
    }
  return TRUE;
}

static gboolean
run_op (CudaBackend *b, guint i, GError **error)
{
  const StowOp *op = &g_array_index (b->p->ops, StowOp, i);
  gboolean host
      = !op->on_gpu
        && (op->kind == STOW_OP_GRAD_NORM || op->kind == STOW_OP_OPTIM_STEP);
  if (host)
    return run_host (b, i, error);
  if (op->stream != STOW_STREAM_COMPUTE && op->kind != STOW_OP_COPY)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cuda backend runs compute on the compute stream");
      return FALSE;
    }
  switch (op->kind)
    {
    case STOW_OP_DATA:
      return run_data (b, op, error);
    case STOW_OP_LOSS:
      if (!b->eval)
        return stow_decoder_run_op (stow_llama_cuda_decoder (b->llama), &b->map,
                                    op, b->loss_scale, b->loss_d);
      stow_decoder_run_eval_loss (stow_llama_cuda_decoder (b->llama), &b->map,
                                  op, b->loss_d);
      return TRUE;
    case STOW_OP_FORWARD:
    case STOW_OP_RECOMPUTE:
    case STOW_OP_BACKWARD:
      return stow_decoder_run_op (stow_llama_cuda_decoder (b->llama), &b->map,
                                  op, b->loss_scale, b->loss_d);
    case STOW_OP_GRAD_NORM:
      run_grad_norm (b);
      return TRUE;
    case STOW_OP_OPTIM_STEP:
      return run_optim (b, op, error);
    case STOW_OP_COPY:
      return run_copy (b, op, error);
    default:
      return stow_backend_unsupported_op (
          b->p, i, "cuda", "offloaded and multi-device layouts", error);
    }
}

/* ---- the table ------------------------------------------------------------
 */

static void
mark (CudaBackend *b, guint op, guint which)
{
  const StowOp *o = &g_array_index (b->p->ops, StowOp, op);
  check (b, cudaEventRecord (b->op_ev[2 * op + which], stream_of (b, o)),
         "cudaEventRecord");
  b->op_timed[op] = TRUE;
}

static void
cuda_event_wait (StowBackend *bb, guint rank, StowStream s, guint event)
{
  CudaBackend *b = (CudaBackend *)bb;
  check (b, cudaStreamWaitEvent (b->streams[s], b->events[event], 0),
         "cudaStreamWaitEvent");
}

static gboolean
cuda_buffer_alloc (StowBackend *bb, const StowProgram *p, guint buffer,
                   guint op, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  if (op == STOW_NONE)
    return alloc_buffer (b, buffer, STOW_STREAM_COMPUTE, error);
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  mark (b, op, 0);
  gboolean ok = alloc_buffer (b, buffer, o->stream, error);
  mark (b, op, 1);
  return ok;
}

static void
cuda_buffer_free (StowBackend *bb, const StowProgram *p, guint buffer, guint op)
{
  CudaBackend *b = (CudaBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  mark (b, op, 0);
  free_buffer (b, buffer, o->stream);
  mark (b, op, 1);
}

static gboolean
cuda_issue (StowBackend *bb, const StowProgram *p, guint op, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  if (o->rank != 0)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cuda backend runs one rank; the program has %u",
                   p->n_ranks);
      return FALSE;
    }
  mark (b, op, 0);
  if (!run_op (b, op, error))
    {
      g_autofree char *what = stow_op_describe (p, op);
      g_prefix_error (error, "op %s: ", what);
      return FALSE;
    }
  mark (b, op, 1);
  return TRUE;
}

static void
cuda_event_record (StowBackend *bb, guint rank, StowStream s, guint event,
                   guint op)
{
  CudaBackend *b = (CudaBackend *)bb;
  check (b, cudaEventRecord (b->events[event], b->streams[s]),
         "cudaEventRecord");
}

static gboolean
cuda_synchronize (StowBackend *bb, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    check (b, cudaStreamSynchronize (b->streams[s]), "cudaStreamSynchronize");
  GError *e = NULL;
  if (!stow_llama_cuda_check (b->llama, &e))
    {
      if (b->error == NULL)
        b->error = e;
      else
        g_error_free (e);
    }
  g_mutex_lock (&b->host_lock);
  if (b->host_error != NULL && b->error == NULL)
    b->error = g_steal_pointer (&b->host_error);
  g_clear_error (&b->host_error);
  g_mutex_unlock (&b->host_lock);
  if (b->error != NULL)
    {
      g_propagate_error (error, b->error);
      b->error = NULL;
      return FALSE;
    }
  return TRUE;
}

static double
cuda_now (StowBackend *bb)
{
  return (double)g_get_monotonic_time () / 1e6;
}

static void
cuda_op_times (StowBackend *bb, guint op, double *start, double *end)
{
  CudaBackend *b = (CudaBackend *)bb;
  float s = 0, e = 0;
  *start = *end = 0;
  if (!b->op_timed[op])
    return;
  if (cudaEventElapsedTime (&s, b->t0, b->op_ev[2 * op]) != cudaSuccess
      || cudaEventElapsedTime (&e, b->t0, b->op_ev[2 * op + 1]) != cudaSuccess)
    {
      cudaGetLastError ();
      return;
    }
  *start = s / 1e3;
  *end = MAX (e, s) / 1e3;
}

static void
cuda_fill_memory (StowBackend *bb, const StowProgram *p, StowTrace *t)
{
  t->peak_bytes[STOW_TIER_DEVICE]
      = stow_arena_peak (((CudaBackend *)bb)->arena);
}

static void
cuda_destroy (StowBackend *bb)
{
  CudaBackend *b = (CudaBackend *)bb;
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (b->streams[s])
      cudaStreamSynchronize (b->streams[s]);
  if (b->llama)
    stow_llama_cuda_free (b->llama);
  for (guint i = 0; b->events && i < b->p->events->len; i++)
    if (b->events[i])
      cudaEventDestroy (b->events[i]);
  for (guint i = 0; b->op_ev && i < 2 * b->p->ops->len; i++)
    if (b->op_ev[i])
      cudaEventDestroy (b->op_ev[i]);
  if (b->t0)
    cudaEventDestroy (b->t0);
  for (guint i = 0; b->pending && i < b->pending->len; i++)
    cudaEventDestroy (g_array_index (b->pending, PendingFree, i).event);
  for (guint i = 0; b->spare_events && i < b->spare_events->len; i++)
    cudaEventDestroy (g_ptr_array_index (b->spare_events, i));
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (b->streams[s])
      cudaStreamDestroy (b->streams[s]);
  if (b->pending)
    g_array_unref (b->pending);
  if (b->spare_events)
    g_ptr_array_unref (b->spare_events);
  if (b->staging)
    cudaFreeHost (b->staging);
  if (b->state_h)
    cudaFreeHost (b->state_h);
  if (b->loss_h)
    cudaFreeHost (b->loss_h);
  if (b->state_d)
    cudaFree (b->state_d);
  if (b->loss_d)
    cudaFree (b->loss_d);
  if (b->arena)
    stow_arena_free (b->arena);
  if (b->dev_base)
    cudaFree (b->dev_base);
  for (guint i = 0; b->shadow && i < b->p->buffers->len; i++)
    g_free (b->shadow[i]);
  g_free (b->shadow);
  g_free (b->events);
  g_free (b->op_ev);
  g_free (b->op_timed);
  stow_tensor_map_clear (&b->map);
  if (b->error)
    g_error_free (b->error);
  if (b->model)
    stow_model_unref (b->model);
  if (b->pinned_pool)
    stow_pinned_pool_free (b->pinned_pool);
  if (b->adam)
    stow_adam_free (b->adam);
  g_free (b->jobs);
  g_clear_error (&b->host_error);
  g_mutex_clear (&b->host_lock);
  g_free (b);
}

static gboolean
make_events (CudaBackend *b, GError **error)
{
  const StowProgram *p = b->p;
  b->events = g_new0 (cudaEvent_t, MAX (p->events->len, 1));
  for (guint i = 0; i < p->events->len; i++)
    if (!cuda_ok (
            cudaEventCreateWithFlags (&b->events[i], cudaEventDisableTiming),
            "cudaEventCreate", error))
      return FALSE;
  b->op_ev = g_new0 (cudaEvent_t, MAX (2 * p->ops->len, 1));
  b->op_timed = g_new0 (gboolean, MAX (p->ops->len, 1));
  for (guint i = 0; i < 2 * p->ops->len; i++)
    if (!cuda_ok (cudaEventCreate (&b->op_ev[i]), "cudaEventCreate", error))
      return FALSE;
  if (!cuda_ok (cudaEventCreate (&b->t0), "cudaEventCreate", error))
    return FALSE;
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (!cuda_ok (
            cudaStreamCreateWithFlags (&b->streams[s], cudaStreamNonBlocking),
            "cudaStreamCreate", error))
      return FALSE;
  return TRUE;
}

static gboolean
cuda_alloc_persistent (StowBackend *bb, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  /* The persistent pinned buffers (ZeRO-Offload's host gradients, states
   * and host copy of the weights) in one pool, registered with CUDA so
   * that copies to and from them are DMA (offload/pinned.h); zero-filled. */
  if (b->pinned_pool == NULL)
    b->pinned_pool = stow_tensor_map_pinned_pool (&b->map, TRUE);
  for (guint i = 0; i < b->p->buffers->len; i++)
    {
      const StowBuffer *buf = buf_of (b, i);
      if (!buf->persistent)
        continue;
      if (!alloc_buffer (b, i, STOW_STREAM_COMPUTE, error))
        return FALSE;
      /* The moments start at zero (and so does everything else that a
       * load does not fill): cudaMalloc'd memory holds anything. */
      if (buf->bytes > 0 && buf->tier == STOW_TIER_DEVICE
          && !cuda_ok (cudaMemset (b->map.addr[i], 0, buf->bytes), "cudaMemset",
                       error))
        return FALSE;
    }
  if (b->map.host_weights_buf != STOW_NONE)
    b->map.host_weights = b->map.addr[b->map.host_weights_buf];
  /* The delayed update's second host copy of the gradients: the
   * program's, pinned with the rest. */
  if (!stow_delayed_init (&b->delayed, &b->map, error))
    return FALSE;
  return TRUE;
}

/* Every stream starts after this point on the compute stream. */
static void
start_streams (CudaBackend *b)
{
  cudaStream_t cs = b->streams[STOW_STREAM_COMPUTE];
  check (b, cudaEventRecord (b->t0, cs), "cudaEventRecord");
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (s != STOW_STREAM_COMPUTE)
      check (b, cudaStreamWaitEvent (b->streams[s], b->t0, 0),
             "cudaStreamWaitEvent");
}

static void
cuda_begin_step (StowBackend *bb, guint64 step)
{
  CudaBackend *b = (CudaBackend *)bb;
  cudaStream_t cs = b->streams[STOW_STREAM_COMPUTE];
  b->step = step;
  b->eval = FALSE;
  b->loss_scale = stow_batches_loss_scale (b->data, step);
  b->lr = stow_optim_lr_at (&b->p->optim, step);
  memset (b->op_timed, 0, sizeof (gboolean) * MAX (b->p->ops->len, 1));
  /* No clipping and no skip unless the grad_norm op says otherwise. */
  memset (b->state_h, 0, sizeof *b->state_h);
  b->state_h->clip_coef = 1.0;
  b->state_h->norm = NAN;
  g_mutex_lock (&b->host_lock);
  b->host_norm = NAN;
  b->host_clip = 1.0;
  b->host_skip = FALSE;
  g_mutex_unlock (&b->host_lock);
  /* The last step's gradients go aside for this step's update; this
   * step's come down where they were.  The last step has been
   * synchronized: no copy or host function still uses either. */
  stow_delayed_begin_step (&b->delayed, &b->map, step);
  check (b,
         cudaMemcpyAsync (b->state_d, b->state_h, sizeof *b->state_h,
                          cudaMemcpyHostToDevice, cs),
         "cudaMemcpyAsync");
  check (b, cudaMemsetAsync (b->loss_d, 0, sizeof (double), cs),
         "cudaMemsetAsync");
  /* Every stream starts the step after this point. */
  start_streams (b);
}

static void
cuda_begin_eval (StowBackend *bb, guint64 batch)
{
  CudaBackend *b = (CudaBackend *)bb;
  g_return_if_fail (b->eval_data != NULL && batch >= 1);
  b->eval = TRUE;
  b->step = batch;
  b->loss_scale = stow_batches_loss_scale (b->eval_data, batch);
  memset (b->op_timed, 0, sizeof (gboolean) * MAX (b->p->ops->len, 1));
  check (b,
         cudaMemsetAsync (b->loss_d, 0, sizeof (double),
                          b->streams[STOW_STREAM_COMPUTE]),
         "cudaMemsetAsync");
  start_streams (b);
}

static gboolean
cuda_step_stats (StowBackend *bb, StowStepStats *out, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  cudaStream_t cs = b->streams[STOW_STREAM_COMPUTE];
  if (!cuda_ok (cudaMemcpyAsync (b->state_h, b->state_d, sizeof *b->state_h,
                                 cudaMemcpyDeviceToHost, cs),
                "cudaMemcpyAsync", error)
      || !cuda_ok (cudaMemcpyAsync (b->loss_h, b->loss_d, sizeof (double),
                                    cudaMemcpyDeviceToHost, cs),
                   "cudaMemcpyAsync", error)
      || !cuda_ok (cudaStreamSynchronize (cs), "cudaStreamSynchronize", error))
    return FALSE;
  out->loss = *b->loss_h * b->loss_scale;
  out->loss_sum = *b->loss_h;
  out->grad_norm = b->state_h->norm; /* NaN when no grad_norm op ran */
  out->skipped = b->state_h->skip != 0;
  out->lr = b->lr;
  if (b->adam != NULL)
    {
      /* The optimizer in host memory: the host's norm (the step's host
       * ops are done: the driver synchronized every stream). */
      g_mutex_lock (&b->host_lock);
      out->grad_norm = b->host_norm;
      out->skipped = b->host_skip;
      g_mutex_unlock (&b->host_lock);
    }
  return TRUE;
}

static guint64
cuda_peak_bytes (StowBackend *bb)
{
  return stow_arena_peak (((CudaBackend *)bb)->arena);
}

static void
cuda_reset_peak (StowBackend *bb)
{
  stow_arena_reset_peak (((CudaBackend *)bb)->arena);
}

/* ---- host copies of the persistent state ----------------------------------
 */

static guint8 *
shadow_unit (CudaBackend *b, guint bi, guint unit)
{
  StowTensorMap *m = &b->map;
  if (bi == STOW_NONE || m->addr[bi] == NULL)
    return NULL;
  if (b->shadow[bi] == NULL)
    b->shadow[bi] = g_malloc0 (buf_of (b, bi)->bytes);
  /* The same offset as on the device. */
  guint8 *dev = stow_tensor_map_unit (m, bi, unit);
  return (guint8 *)b->shadow[bi] + (dev - (guint8 *)m->addr[bi]);
}

static void *
cuda_pending (StowBackend *bb, guint unit, gboolean *pending)
{
  CudaBackend *b = (CudaBackend *)bb;
  return stow_delayed_pending (&b->delayed, &b->map, unit, pending);
}

static void
cuda_set_pending (StowBackend *bb, gboolean pending)
{
  ((CudaBackend *)bb)->delayed.have_grads = pending;
}

static guint64
cuda_pinned_peak_bytes (StowBackend *bb)
{
  /* Every pinned buffer the cuda backend runs is persistent: the peak is
   * their sum. */
  return ((CudaBackend *)bb)->pinned_bytes;
}

static void *
cuda_weights (StowBackend *bb, guint unit)
{
  CudaBackend *b = (CudaBackend *)bb;
  StowTensorMap *m = &b->map;
  /* Streamed weights (--offload-params cpu) live in pinned host memory,
   * which CPU Adam updates: no device copy of the whole model. */
  if (m->weights_buf == STOW_NONE)
    return m->host_weights ? stow_tensor_map_host_weights (m, unit) : NULL;
  return shadow_unit (b, m->weights_buf, unit);
}

/* The states of a host optimizer are host memory already. */
static gboolean
states_on_host (CudaBackend *b)
{
  return b->map.states_buf != STOW_NONE
         && buf_of (b, b->map.states_buf)->tier != STOW_TIER_DEVICE;
}

static float *
cuda_master (StowBackend *bb, guint unit)
{
  CudaBackend *b = (CudaBackend *)bb;
  if (!b->p->master_weights)
    return NULL;
  if (states_on_host (b))
    return b->map.addr[b->map.states_buf]
               ? stow_tensor_map_state (&b->map, unit, 0)
               : NULL;
  return (float *)shadow_unit (b, b->map.master_buf, unit);
}

static float *
cuda_moment (StowBackend *bb, guint unit, guint which)
{
  CudaBackend *b = (CudaBackend *)bb;
  if (states_on_host (b))
    return b->map.addr[b->map.states_buf]
               ? stow_tensor_map_state (&b->map, unit, 1 + which)
               : NULL;
  float *mv = (float *)shadow_unit (b, b->map.states_buf, unit);
  if (mv == NULL)
    return NULL;
  return which == 0 ? mv
                    : mv + g_array_index (b->p->units, StowUnit, unit).numel;
}

static gboolean
copy_persistent (CudaBackend *b, gboolean up, GError **error)
{
  StowTensorMap *m = &b->map;
  /* Not the gradients: every step starts them afresh. */
  guint bufs[3] = { m->weights_buf, m->master_buf, m->states_buf };
  for (guint i = 0; i < 3; i++)
    {
      guint bi = bufs[i];
      if (bi == STOW_NONE || m->addr[bi] == NULL || b->shadow[bi] == NULL
          || buf_of (b, bi)->tier != STOW_TIER_DEVICE)
        continue;
      gsize bytes = buf_of (b, bi)->bytes;
      cudaError_t e = up ? cudaMemcpy (m->addr[bi], b->shadow[bi], bytes,
                                       cudaMemcpyHostToDevice)
                         : cudaMemcpy (b->shadow[bi], m->addr[bi], bytes,
                                       cudaMemcpyDeviceToHost);
      if (!cuda_ok (e, up ? "state to the device" : "state from the device",
                    error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
cuda_pull (StowBackend *bb, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  StowTensorMap *m = &b->map;
  /* Make the host copies exist (unit 0 starts each buffer), then fill
   * them. */
  shadow_unit (b, m->weights_buf, 0);
  if (!states_on_host (b))
    {
      if (b->p->master_weights)
        shadow_unit (b, m->master_buf, 0);
      shadow_unit (b, m->states_buf, 0);
    }
  return copy_persistent (b, FALSE, error);
}

static gboolean
cuda_push (StowBackend *bb, GError **error)
{
  CudaBackend *b = (CudaBackend *)bb;
  StowTensorMap *m = &b->map;
  if (m->weights_buf == STOW_NONE)
    {
      /* Streamed weights: the resident units' device copies start as the
       * host weights; the others go up in each step. */
      for (guint u = 0; u < b->p->units->len; u++)
        if (m->unit_weights[u] != STOW_NONE
            && !cuda_ok (
                cudaMemcpy (m->addr[m->unit_weights[u]],
                            stow_tensor_map_host_weights (m, u),
                            g_array_index (b->p->units, StowUnit, u).numel
                                * m->esize,
                            cudaMemcpyHostToDevice),
                "resident weights to the device", error))
          return FALSE;
      return copy_persistent (b, TRUE, error);
    }
  /* CPU Adam's host copy of the weights starts as the loaded weights. */
  if (m->host_weights != NULL && m->weights_buf != STOW_NONE
      && b->shadow[m->weights_buf] != NULL)
    memcpy (m->host_weights, shadow_unit (b, m->weights_buf, 0),
            m->numel * m->esize);
  return copy_persistent (b, TRUE, error);
}

/* ---- the table ------------------------------------------------------------
 */

static const StowBackendVtable cuda_vtable = {
  .name = "cuda",
  .virtual_time = FALSE,
  .event_wait = cuda_event_wait,
  .buffer_alloc = cuda_buffer_alloc,
  .buffer_free = cuda_buffer_free,
  .issue = cuda_issue,
  .event_record = cuda_event_record,
  .synchronize = cuda_synchronize,
  .now = cuda_now,
  .op_times = cuda_op_times,
  .fill_memory = cuda_fill_memory,
  .destroy = cuda_destroy,
  .alloc_persistent = cuda_alloc_persistent,
  .begin_step = cuda_begin_step,
  .begin_eval = cuda_begin_eval,
  .step_stats = cuda_step_stats,
  .peak_bytes = cuda_peak_bytes,
  .reset_peak = cuda_reset_peak,
  .pinned_peak_bytes = cuda_pinned_peak_bytes,
  .weights = cuda_weights,
  .master = cuda_master,
  .moment = cuda_moment,
  .pull = cuda_pull,
  .push = cuda_push,
  .pending = cuda_pending,
  .set_pending = cuda_set_pending,
};

StowBackend *
stow_backend_cuda_new (const StowBackendSetup *setup, GError **error)
{
  g_return_val_if_fail (setup != NULL && setup->program != NULL
                            && setup->model != NULL && setup->data != NULL,
                        NULL);
  const StowProgram *p = setup->program;
  if (!stow_cuda_available (error))
    return NULL;
  CudaBackend *b = g_new0 (CudaBackend, 1);
  b->parent.vt = &cuda_vtable;
  b->p = p;
  b->model = stow_model_ref ((StowModel *)setup->model);
  b->data = setup->data;
  b->eval_data = setup->eval_data;
  b->delayed.on = setup->delayed_update;
  g_mutex_init (&b->host_lock);
  b->jobs = g_new0 (HostJob, MAX (p->ops->len, 1));
  b->pending = g_array_new (FALSE, FALSE, sizeof (PendingFree));
  b->spare_events = g_ptr_array_new ();
  b->shadow = g_new0 (void *, MAX (p->buffers->len, 1));
  if (!stow_tensor_map_init (&b->map, p, b->model, "cuda", error)
      || !make_events (b, error))
    goto fail;
  guint m = (guint)p->grad_accum;
  guint64 cap = (setup->device_capacity_bytes + STOW_ARENA_ALIGN - 1)
                / STOW_ARENA_ALIGN * STOW_ARENA_ALIGN;
  if (!cuda_ok (cudaMalloc (&b->dev_base, MAX (cap, STOW_ARENA_ALIGN)),
                "cudaMalloc of the device tier (--device-memory)", error)
      || !cuda_ok (
          cudaMallocHost ((void **)&b->staging, (gsize)m * b->map.input.x),
          "cudaMallocHost", error)
      || !cuda_ok (
          cudaMallocHost ((void **)&b->state_h, sizeof (StowCudaOptimState)),
          "cudaMallocHost", error)
      || !cuda_ok (cudaMallocHost ((void **)&b->loss_h, sizeof (double)),
                   "cudaMallocHost", error)
      || !cuda_ok (
          cudaMalloc ((void **)&b->state_d, sizeof (StowCudaOptimState)),
          "cudaMalloc", error)
      || !cuda_ok (cudaMalloc ((void **)&b->loss_d, sizeof (double)),
                   "cudaMalloc", error))
    goto fail;
  b->arena = stow_arena_new_over (b->dev_base, setup->device_capacity_bytes);
  b->llama = stow_llama_cuda_new (&b->map.config, b->map.ftype, b->map.n_tokens,
                                  p->seq_len, b->streams[STOW_STREAM_COMPUTE],
                                  error);
  if (b->llama == NULL)
    goto fail;
  if (b->map.host_grads_buf != STOW_NONE)
    {
      /* ZeRO-Offload: CPU Adam, on one thread per core. */
      b->adam = stow_adam_new (0, STOW_ISA_AUTO, error);
      if (b->adam == NULL)
        goto fail;
    }
  return &b->parent;
fail:
  cuda_destroy (&b->parent);
  return NULL;
}
