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
#include "executor/backends/cpu-private.h"

#include "core/zero.h"

#include <math.h>
#include <string.h>

#include "program/trace.h"

/* ---- buffers ------------------------------------------------------------- */

static gboolean
alloc_buffer (CpuBackend *b, guint bi, GError **error)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->map.addr[bi] != NULL)
    return TRUE; /* persistent, from an earlier step */
  if (stow_buffer_is_occupant (buf)
      && (gsize)buf->slot < G_N_ELEMENTS (b->map.slot_buf)
      && b->map.slot_buf[buf->slot] != STOW_NONE)
    {
      /* A slot's occupant: the slot buffer's bytes (persistent). */
      b->map.addr[bi] = b->map.addr[b->map.slot_buf[buf->slot]];
      g_assert (b->map.addr[bi] != NULL);
      return TRUE;
    }
  if (stow_buffer_is_occupant (buf))
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
          g_set_error (
              error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
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
      g_autofree char *need
          = g_format_size_full (buf->bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *used
          = g_format_size_full (in_use, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *cap = g_format_size_full (stow_arena_capacity (b->arena),
                                                 G_FORMAT_SIZE_IEC_UNITS);
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "device memory: \"%s\" (%s) does not fit%s: %s in use of "
                   "%s (--device-memory)",
                   buf->name, need, frag ? " in one free run (fragmented)" : "",
                   used, cap);
      return FALSE;
    }
  /* A persistent buffer (weights, gradients, optimizer states) gets its
   * pages now, written: left to the kernel's lazy zero pages, the first
   * step's Adam reads a page (the shared zero page) and then writes it, a
   * copy-on-write fault with a TLB shootdown across the step's threads
   * per 4 KiB: on bench/cpu-train.py's 110M model in bf16 the first step
   * took 5.1-5.4 s against 1.2-1.7 s written first, and a 2-step run 11-12
   * s of system time against 3.6-6.3 (perf: ptep_clear_flush's IPIs). */
  if (buf->persistent)
    memset (p, 0, buf->bytes);
  b->map.addr[bi] = p;
  return TRUE;
}

static void
free_buffer (CpuBackend *b, guint bi)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->map.addr[bi] == NULL)
    return;
  if (stow_buffer_is_occupant (buf))
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

/* ---- workers --------------------------------------------------------------
 */

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
                ok = stow_cpu_run_op (b, t->index, &e);
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

/* ---- the table ------------------------------------------------------------
 */

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
  /* Each of the delayed update's two gradient buffers back in its own
   * slot, so each is freed as the buffer it was allocated for. */
  stow_delayed_restore (&b->delayed, &b->map);
  for (guint i = 0; b->map.addr && i < b->n_buffers; i++)
    if (b->map.addr[i] && buf_of (b, i)->tier != STOW_TIER_DEVICE
        && !stow_buffer_is_occupant (buf_of (b, i))
        && !in_pool (b, buf_of (b, i))
        && !(is_swap_buffer (buf_of (b, i)) && b->swap != NULL))
      g_aligned_free (b->map.addr[i]);
  if (b->pinned_pool)
    stow_pinned_pool_free (b->pinned_pool);
  if (b->swap)
    stow_state_swap_free (b->swap);
  if (b->params)
    stow_param_swap_free (b->params);
  g_clear_error (&b->access_error);
  g_aligned_free (b->map.acc_scratch);
  stow_cpu_ranks_free (b);
  stow_tensor_map_clear (&b->map);
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

static gboolean
cpu_alloc_persistent (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  /* The persistent pinned buffers in one pool of ordinary pages, locked
   * once they are all in it (train's preflight has checked
   * RLIMIT_MEMLOCK; --allow-unpinned leaves them pageable). */
  if (b->pinned_pool == NULL)
    b->pinned_pool = stow_tensor_map_pinned_pool (&b->map, FALSE);
  for (guint i = 0; i < b->n_buffers; i++)
    if (buf_of (b, i)->persistent && !alloc_buffer (b, i, error))
      return FALSE;
  if (b->pinned_pool != NULL && !b->no_pin)
    stow_pinned_pool_pin (b->pinned_pool);
  if (!stow_delayed_init (&b->delayed, &b->map, error))
    return FALSE;
  /* The program's host buffer of the weights: what CPU Adam writes (and,
   * streamed, where the weights live). */
  if (b->map.host_weights_buf != STOW_NONE)
    b->map.host_weights = b->map.addr[b->map.host_weights_buf];
  /* With the weights on NVMe CPU Adam writes the updated ones over the
   * gradients they came from (planner/lower.c, adam_out). */
  if (b->params != NULL)
    b->map.host_weights = b->map.addr[b->map.host_grads_buf];
  return TRUE;
}

static void
cpu_begin_step (StowBackend *bb, guint64 step)
{
  CpuBackend *b = (CpuBackend *)bb;
  b->step = step;
  b->eval = FALSE;
  b->loss_sum = 0;
  if (b->mb_loss)
    memset (b->mb_loss, 0, sizeof (double) * b->p->grad_accum);
  b->loss_scale = stow_batches_loss_scale (b->data, step);
  b->grad_norm = NAN;
  b->clip_coef = 1.0;
  b->skip = FALSE;
  b->grads_ok = FALSE;
  b->lr = stow_optim_lr_at (&b->p->optim, step);
  /* The gradients the last step left go aside for this step's update;
   * this step's go where they were. */
  stow_delayed_begin_step (&b->delayed, &b->map, step);
  memset (b->recorded, 0, sizeof (gboolean) * MAX (b->p->events->len, 1));
  memset (b->op_start, 0, sizeof (double) * MAX (b->p->ops->len, 1));
  memset (b->op_end, 0, sizeof (double) * MAX (b->p->ops->len, 1));
}

static void
cpu_begin_eval (StowBackend *bb, guint64 batch)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_return_if_fail (b->eval_data != NULL && batch >= 1);
  b->eval = TRUE;
  b->step = batch;
  b->loss_sum = 0;
  b->loss_scale = stow_batches_loss_scale (b->eval_data, batch);
  memset (b->recorded, 0, sizeof (gboolean) * MAX (b->p->events->len, 1));
  memset (b->op_start, 0, sizeof (double) * MAX (b->p->ops->len, 1));
  memset (b->op_end, 0, sizeof (double) * MAX (b->p->ops->len, 1));
}

static gboolean
cpu_step_stats (StowBackend *bb, StowStepStats *out, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (b->mb_loss != NULL && !b->eval && !stow_cpu_ranks_loss (b, error))
    return FALSE;
  out->loss = b->loss_sum * b->loss_scale;
  out->loss_sum = b->loss_sum;
  out->grad_norm = b->grad_norm;
  out->skipped = b->skip;
  out->lr = b->lr;
  return TRUE;
}

static guint64
cpu_peak_bytes (StowBackend *bb)
{
  return stow_arena_peak (((CpuBackend *)bb)->arena);
}

static void
cpu_reset_peak (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  stow_arena_reset_peak (b->arena);
  g_mutex_lock (&b->lock);
  b->pinned_peak = b->pinned_in_use;
  g_mutex_unlock (&b->lock);
}

static guint64
cpu_pinned_peak_bytes (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_mutex_lock (&b->lock);
  guint64 n = b->pinned_peak;
  g_mutex_unlock (&b->lock);
  return n;
}

static void *
cpu_weights (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  void *whole = m->dp > 1 ? stow_cpu_ranks_weights (b, unit) : NULL;
  if (whole != NULL)
    return whole;
  if (b->params != NULL)
    {
      g_autoptr (GError) e = NULL;
      void *w = stow_param_swap_unit (b->params, unit, &e);
      if (w == NULL && b->access_error == NULL)
        b->access_error = g_steal_pointer (&e);
      return w;
    }
  if (m->weights_buf == STOW_NONE)
    return m->host_weights ? stow_tensor_map_host_weights (m, unit) : NULL;
  return m->addr[m->weights_buf]
             ? stow_tensor_map_unit (m, m->weights_buf, unit)
             : NULL;
}

static float *
cpu_master (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (!b->p->master_weights || m->states_nvme
      || m->addr[m->states_master ? m->states_buf : m->master_buf] == NULL)
    return NULL;
  float *whole = m->dp > 1 ? stow_cpu_ranks_state (b, unit, 0) : NULL;
  return whole ? whole : stow_tensor_map_state (m, unit, 0);
}

static float *
cpu_moment (StowBackend *bb, guint unit, guint which)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (m->states_nvme || m->addr[m->states_buf] == NULL)
    return NULL;
  float *whole = m->dp > 1 ? stow_cpu_ranks_state (b, unit, 1 + which) : NULL;
  return whole ? whole : stow_tensor_map_state (m, unit, 1 + which);
}

static gboolean
cpu_states (StowBackend *bb, gboolean write, guint unit, guint which,
            guint64 first, guint64 n, float *data, GError **error)
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

static void *
cpu_pending (StowBackend *bb, guint unit, gboolean *pending)
{
  CpuBackend *b = (CpuBackend *)bb;
  return stow_delayed_pending (&b->delayed, &b->map, unit, pending);
}

static void
cpu_set_pending (StowBackend *bb, gboolean pending)
{
  ((CpuBackend *)bb)->delayed.have_grads = pending;
}

static char *
cpu_describe_pinned (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  return b->pinned_pool ? stow_pinned_pool_describe (b->pinned_pool) : NULL;
}

static GError *
cpu_take_access_error (StowBackend *bb)
{
  return g_steal_pointer (&((CpuBackend *)bb)->access_error);
}

static char *
cpu_describe_swap (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_autofree char *s = b->swap ? stow_state_swap_describe (b->swap) : NULL;
  g_autofree char *w = b->params ? stow_param_swap_describe (b->params) : NULL;
  if (s && w)
    return g_strdup_printf ("%s\n%s", w, s);
  return g_strdup (s ? s : w);
}

/* Several ranks: the partitioned states gathered whole for a checkpoint
 * (every rank takes part; rank 0 writes them). */
static gboolean
cpu_pull (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  return b->map.dp <= 1 || stow_cpu_ranks_pull (b, error);
}

static void
cpu_ranks (StowBackend *bb, guint *rank, guint *world)
{
  stow_cpu_ranks_describe ((CpuBackend *)bb, rank, world);
}

static guint64
cpu_partition (StowBackend *bb, guint unit, guint64 *first)
{
  return stow_cpu_ranks_partition ((CpuBackend *)bb, unit, first);
}

static gboolean
cpu_push (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  StowTensorMap *m = &b->map;
  if (m->dp > 1 && !stow_cpu_ranks_push (b, error))
    return FALSE;
  if (b->swap != NULL && !stow_state_swap_flush (b->swap, error))
    return FALSE;
  if (b->params != NULL)
    {
      /* The resident units take their weights from the store (on several
       * ranks, whole from the copy the partitions came from). */
      for (guint u = 0; u < b->p->units->len; u++)
        if (m->unit_weights[u] != STOW_NONE)
          {
            void *w = m->dp > 1 ? stow_cpu_ranks_weights (b, u)
                                : stow_param_swap_unit (b->params, u, error);
            if (w == NULL)
              return FALSE;
            memcpy (m->addr[m->unit_weights[u]], w,
                    unit_numel (b, u) * m->esize);
          }
      return stow_param_swap_flush (b->params, error);
    }
  if (m->weights_buf == STOW_NONE)
    {
      /* The resident units take their weights from the host (on several
       * ranks, whole from the copy the partitions came from). */
      for (guint u = 0; u < b->p->units->len; u++)
        if (m->unit_weights[u] != STOW_NONE)
          memcpy (m->addr[m->unit_weights[u]],
                  m->dp > 1 ? stow_cpu_ranks_weights (b, u)
                            : stow_tensor_map_host_weights (m, u),
                  unit_numel (b, u) * m->esize);
      return TRUE;
    }
  if (m->host_weights == NULL || m->addr[m->weights_buf] == NULL)
    return TRUE;
  if (m->dp > 1)
    {
      /* The rank's partitions of the weights, padding zero. */
      for (guint u = 0; u < b->p->units->len; u++)
        {
          guint64 pf = 0, pv = stow_tensor_map_part (m, u, &pf);
          guint64 part = stow_zero_part (unit_numel (b, u), m->dp);
          stow_comm_pad_copy (stow_tensor_map_host_weights (m, u),
                              stow_tensor_map_elem (m, m->weights_buf, u, pf),
                              pv * m->esize, part * m->esize);
        }
      return TRUE;
    }
  memcpy (m->host_weights, m->addr[m->weights_buf], m->numel * m->esize);
  return TRUE;
}

/* ---- the table ------------------------------------------------------------
 */

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
  .alloc_persistent = cpu_alloc_persistent,
  .begin_step = cpu_begin_step,
  .begin_eval = cpu_begin_eval,
  .step_stats = cpu_step_stats,
  .peak_bytes = cpu_peak_bytes,
  .reset_peak = cpu_reset_peak,
  .pinned_peak_bytes = cpu_pinned_peak_bytes,
  .weights = cpu_weights,
  .master = cpu_master,
  .moment = cpu_moment,
  .pull = cpu_pull,
  .push = cpu_push,
  .ranks = cpu_ranks,
  .partition = cpu_partition,
  .states = cpu_states,
  .take_access_error = cpu_take_access_error,
  .pending = cpu_pending,
  .set_pending = cpu_set_pending,
  .describe_swap = cpu_describe_swap,
  .describe_pinned = cpu_describe_pinned,
};

/* Room for an op's fresh gradients (tensors.h's acc_scratch): the
 * largest unit's, plus the embedding's for a tied loss, which writes the
 * head's and the embedding's.  Host memory beside the arena: what a
 * device would keep in its gradient slot. */
static void
acc_scratch_init (StowTensorMap *m)
{
  guint64 most = 0;
  for (guint u = 0; u < m->p->units->len; u++)
    most = MAX (most, g_array_index (m->p->units, StowUnit, u).numel);
  if (m->head_lm == G_MAXUINT64 && m->emb_unit != G_MAXUINT)
    most += g_array_index (m->p->units, StowUnit, m->emb_unit).numel;
  m->acc_scratch_bytes = most * stow_dtype_size (m->p->grad_dtype);
  m->acc_scratch = g_aligned_alloc (MAX (m->acc_scratch_bytes, 1), 1, 64);
}

/* Several ranks: this one's place among them, and what they run. */
static gboolean
ranks_init (CpuBackend *b, const StowBackendSetup *setup, GError **error)
{
  StowTensorMap *m = &b->map;
  int world = setup->comm ? stow_comm_world_size (setup->comm) : 1;
  if (m->dp <= 1 && world <= 1)
    return TRUE;
  if ((int)m->dp != world)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "the program is for %u data-parallel ranks; %d ran", m->dp,
                   world);
      return FALSE;
    }
  b->comm = setup->comm;
  m->dp_rank = (guint)stow_comm_rank (setup->comm);
  b->mb_loss = g_new0 (double, MAX (b->p->grad_accum, 1));
  return TRUE;
}

StowBackend *
stow_backend_cpu_new (const StowBackendSetup *setup, GError **error)
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
  b->eval_data = setup->eval_data;
  b->copy_delay_us = setup->copy_delay_us;
  b->delayed.on = setup->delayed_update;
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
  acc_scratch_init (&b->map);
  b->map.add_threads = MAX (setup->n_threads, 1);
  if (!ranks_init (b, setup, error))
    {
      cpu_destroy (&b->parent);
      return NULL;
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
