/* SPDX-License-Identifier: MIT
 *
 * program/driver.c: the step-program interpreter.  Each (rank, stream) is
 * a queue issued in program order; an op is issued to its backend once
 * every event it waits on has been issued, with an event_wait per event,
 * so real backends run the streams concurrently and the driver never
 * blocks.  Under virtual time (the sim) ready ops are issued in order of
 * their start times, so memory is accounted as it happens and every check
 * (slot reuse, reads of buffers not loaded, frees under a running op, a
 * wait that can never be satisfied) names the op at fault.
 */
#include "program/driver.h"

typedef struct
{
  gboolean live, ever_written;
  double ready_s;       /* end of the last write */
  double last_access_s; /* end of the last op touching it */
  guint writer;         /* that write's op */
} BufState;

static gboolean fail_op (GError **error, gint code, const StowProgram *p,
                         guint op, const char *format, ...)
    G_GNUC_PRINTF (5, 6);

static gboolean
fail_op (GError **error, gint code, const StowProgram *p, guint op,
         const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_autofree char *what = stow_op_describe (p, op);
  g_set_error (error, STOW_BACKEND_ERROR, code, "op %s: %s", what, msg);
  return FALSE;
}

static const char *
buf_name (const StowProgram *p, guint b)
{
  return g_array_index (p->buffers, StowBuffer, b).name;
}

/* Busy time of sorted, disjoint intervals @a not covered by @c. */
static double
uncovered (GArray *a, GArray *c)
{
  double s = 0;
  guint j = 0;
  for (guint i = 0; i < a->len; i += 2)
    {
      double lo = g_array_index (a, double, i),
             hi = g_array_index (a, double, i + 1);
      double cov = 0;
      while (j < c->len && g_array_index (c, double, j + 1) <= lo)
        j += 2;
      for (guint k = j; k < c->len && g_array_index (c, double, k) < hi; k += 2)
        {
          double clo = MAX (lo, g_array_index (c, double, k));
          double chi = MIN (hi, g_array_index (c, double, k + 1));
          if (chi > clo)
            cov += chi - clo;
        }
      s += (hi - lo) - cov;
    }
  return s;
}

static void
mem_change (StowTrace *t, guint64 *cur, const StowBuffer *b, gboolean add,
            double time_s, guint op)
{
  guint idx = b->rank * STOW_N_TIERS + b->tier;
  if (add)
    cur[idx] += b->bytes;
  else
    cur[idx] -= MIN (cur[idx], b->bytes);
  GArray *s = t->samples[idx];
  StowMemSample sm = { time_s, cur[idx] };
  if (s->len > 0
      && g_array_index (s, StowMemSample, s->len - 1).time_s == time_s)
    g_array_index (s, StowMemSample, s->len - 1).bytes = cur[idx];
  else
    g_array_append_val (s, sm);
  if (add && cur[idx] > t->peak_bytes[b->tier])
    {
      t->peak_bytes[b->tier] = cur[idx];
      t->peak_time_s[b->tier] = time_s;
      t->peak_op[b->tier] = op;
      t->peak_rank[b->tier] = b->rank;
    }
}

/* The slot-table key of a slot buffer: one per (rank, slot, tier). */
static gpointer
slot_key (const StowBuffer *buf)
{
  return GUINT_TO_POINTER ((buf->rank * 64 + (guint)buf->slot) * STOW_N_TIERS
                           + buf->tier + 1);
}

/* Names each stuck queue head and the event it waits on. */
static void
set_deadlock (GError **error, const StowProgram *p, const guint *qops,
              const guint *qstart, const guint *qhead, const guint *qlen,
              guint nq, const gboolean *issued)
{
  GString *msg = g_string_new ("deadlock: ");
  guint shown = 0;
  for (guint q = 0; q < nq && shown < 4; q++)
    {
      if (qhead[q] >= qlen[q])
        continue;
      guint i = qops[qstart[q] + qhead[q]];
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      for (guint w = 0; w < op->n_waits; w++)
        {
          guint e = g_array_index (p->waits, guint, op->wait_first + w);
          if (issued[e])
            continue;
          g_autofree char *what = stow_op_describe (p, i);
          g_string_append_printf (
              msg, "%sop %s waits on event \"%s\", never recorded",
              shown ? "; " : "", what,
              g_array_index (p->events, StowEvent, e).name);
          shown++;
          break;
        }
    }
  g_set_error_literal (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_DEADLOCK,
                       msg->str);
  g_string_free (msg, TRUE);
}

/* Checks an op against the buffers' states at its virtual @start. */
static gboolean
check_virtual (const StowProgram *p, guint i, double start, BufState *bs,
               GHashTable *slots, GError **error)
{
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  for (guint r = 0; r < op->n_reads; r++)
    {
      guint b = op->reads[r];
      if (!bs[b].live)
        return fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                        "reads \"%s\", which is not resident (not "
                        "allocated, or already freed)",
                        buf_name (p, b));
      if (!bs[b].ever_written)
        return fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                        "reads \"%s\" before anything has loaded it",
                        buf_name (p, b));
      /* Persistent state is written region by region (one layer's
       * gradients while another's are reduced): only transient buffers
       * are checked for a load still in flight. */
      if (!g_array_index (p->buffers, StowBuffer, b).persistent
          && bs[b].ready_s > start + 1e-12)
        {
          g_autofree char *w = stow_op_describe (p, bs[b].writer);
          return fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                          "reads \"%s\" at %.6f s, before op %s loads it "
                          "(ends %.6f s)",
                          buf_name (p, b), start, w, bs[b].ready_s);
        }
    }
  for (guint w = 0; w < op->n_writes; w++)
    if (!bs[op->writes[w]].live)
      return fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                      "writes \"%s\", which is not allocated",
                      buf_name (p, op->writes[w]));
  if (op->kind == STOW_OP_ALLOC)
    {
      const StowBuffer *buf
          = &g_array_index (p->buffers, StowBuffer, op->buffer);
      if (bs[op->buffer].live)
        return fail_op (error, STOW_BACKEND_ERROR_INVALID, p, i,
                        "allocates \"%s\", which is already allocated",
                        buf->name);
      if (buf->slot >= 0)
        {
          gpointer holder = g_hash_table_lookup (slots, slot_key (buf));
          if (holder != NULL)
            return fail_op (
                error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                "slot %d already holds \"%s\" when \"%s\" is allocated",
                buf->slot, buf_name (p, GPOINTER_TO_UINT (holder) - 1),
                buf->name);
        }
    }
  else if (op->kind == STOW_OP_FREE)
    {
      const StowBuffer *buf
          = &g_array_index (p->buffers, StowBuffer, op->buffer);
      if (!bs[op->buffer].live)
        return fail_op (error, STOW_BACKEND_ERROR_INVALID, p, i,
                        "frees \"%s\", which is not allocated", buf->name);
      if (bs[op->buffer].last_access_s > start + 1e-12)
        return fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                        "frees \"%s\" at %.6f s while an op still uses it "
                        "(until %.6f s)",
                        buf->name, start, bs[op->buffer].last_access_s);
    }
  return TRUE;
}

/* After a virtual op ran over [start, end]: buffers' liveness, readiness
 * and the memory samples. */
static void
update_virtual (const StowProgram *p, guint i, double start, double end,
                BufState *bs, GHashTable *slots, StowTrace *t, guint64 *cur)
{
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  if (op->kind == STOW_OP_ALLOC || op->kind == STOW_OP_FREE)
    {
      const StowBuffer *buf
          = &g_array_index (p->buffers, StowBuffer, op->buffer);
      gboolean add = op->kind == STOW_OP_ALLOC;
      if (buf->slot >= 0 && add)
        g_hash_table_insert (slots, slot_key (buf),
                             GUINT_TO_POINTER (op->buffer + 1));
      else if (buf->slot >= 0)
        g_hash_table_remove (slots, slot_key (buf));
      bs[op->buffer].live = add;
      mem_change (t, cur, buf, add, start, i);
    }
  for (guint r = 0; r < op->n_reads; r++)
    bs[op->reads[r]].last_access_s = MAX (bs[op->reads[r]].last_access_s, end);
  for (guint w = 0; w < op->n_writes; w++)
    {
      BufState *s = &bs[op->writes[w]];
      s->ever_written = TRUE;
      s->ready_s = MAX (s->ready_s, end);
      s->writer = i;
      s->last_access_s = MAX (s->last_access_s, end);
    }
}

/* The op whose end decided @i's start, from measured times: the op before
 * it on its stream or the recorder of an event it waited on, whichever
 * ended last. */
static guint
measured_pred (const StowProgram *p, const StowTrace *t, guint i,
               guint stream_prev, const guint *ev_op)
{
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  guint pred = stream_prev;
  double best = stream_prev != STOW_NONE ? t->ops[stream_prev].end_s : -1;
  for (guint w = 0; w < op->n_waits; w++)
    {
      guint e = g_array_index (p->waits, guint, op->wait_first + w);
      guint r = ev_op[e];
      if (r != STOW_NONE && t->ops[r].end_s > best)
        best = t->ops[r].end_s, pred = r;
    }
  return pred;
}

/* Step time, busy and exposed seconds per stream of the rank that ends
 * last, and the critical path, from every op's times and predecessor. */
static void
summarise (const StowProgram *p, StowTrace *t, const guint *qops,
           const guint *qstart, const guint *qlen)
{
  guint nops = p->ops->len;
  guint last = STOW_NONE;
  for (guint i = 0; i < nops; i++)
    if (last == STOW_NONE || t->ops[i].end_s > t->ops[last].end_s)
      last = i;
  t->step_time_s = last != STOW_NONE ? t->ops[last].end_s : 0;
  t->critical_rank
      = last != STOW_NONE ? g_array_index (p->ops, StowOp, last).rank : 0;
  guint r = t->critical_rank;
  GArray *busy[STOW_N_STREAMS];
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      guint q = r * STOW_N_STREAMS + s;
      busy[s] = g_array_new (FALSE, FALSE, sizeof (double));
      for (guint k = 0; k < qlen[q]; k++)
        {
          const StowTraceOp *to = &t->ops[qops[qstart[q] + k]];
          if (to->end_s > to->start_s)
            {
              g_array_append_val (busy[s], to->start_s);
              g_array_append_val (busy[s], to->end_s);
            }
        }
    }
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      GArray *a = busy[s];
      for (guint k = 0; k < a->len; k += 2)
        t->busy_s[s]
            += g_array_index (a, double, k + 1) - g_array_index (a, double, k);
      t->exposed_s[s] = s == STOW_STREAM_COMPUTE
                            ? t->busy_s[s]
                            : uncovered (a, busy[STOW_STREAM_COMPUTE]);
    }
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    g_array_unref (busy[s]);
  t->critical_path = g_array_new (FALSE, FALSE, sizeof (guint));
  for (guint i = last; i != STOW_NONE; i = t->ops[i].pred)
    g_array_append_val (t->critical_path, i);
  for (guint a = 0, n = t->critical_path->len; a < n / 2; a++)
    {
      guint *v = (guint *)t->critical_path->data;
      guint tmp = v[a];
      v[a] = v[n - 1 - a], v[n - 1 - a] = tmp;
    }
}

static StowTrace *
run (const StowProgram *p, StowBackend *backend, gboolean eval, GError **error)
{
  if (!stow_program_validate (p, error))
    return NULL;
  const StowBackendVtable *vt = backend->vt;
  gboolean virt = vt->virtual_time;
  guint nq = p->n_ranks * STOW_N_STREAMS;
  guint nops = p->ops->len, nbuf = p->buffers->len, nev = p->events->len;
  g_autoptr (StowTrace) t = g_new0 (StowTrace, 1);
  t->n_ops = nops;
  t->n_ranks = p->n_ranks;
  t->ops = g_new0 (StowTraceOp, nops);
  t->samples = g_new0 (GArray *, p->n_ranks * STOW_N_TIERS);
  for (guint i = 0; i < p->n_ranks * STOW_N_TIERS; i++)
    t->samples[i] = g_array_new (FALSE, FALSE, sizeof (StowMemSample));
  for (guint i = 0; i < STOW_N_TIERS; i++)
    t->peak_op[i] = STOW_NONE;

  /* Queues: op indices per (rank, stream) in program order. */
  g_autofree guint *qlen = g_new0 (guint, nq);
  g_autofree guint *qstart = g_new0 (guint, nq + 1);
  g_autofree guint *qops = g_new (guint, MAX (nops, 1));
  g_autofree guint *qhead = g_new0 (guint, nq);
  g_autofree guint *qprev = g_new (guint, MAX (nops, 1));
  for (guint i = 0; i < nops; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      qlen[op->rank * STOW_N_STREAMS + op->stream]++;
    }
  for (guint q = 0; q < nq; q++)
    qstart[q + 1] = qstart[q] + qlen[q];
  {
    g_autofree guint *fill = g_new0 (guint, nq);
    for (guint i = 0; i < nops; i++)
      {
        const StowOp *op = &g_array_index (p->ops, StowOp, i);
        guint q = op->rank * STOW_N_STREAMS + op->stream;
        qprev[i] = fill[q] ? qops[qstart[q] + fill[q] - 1] : STOW_NONE;
        qops[qstart[q] + fill[q]++] = i;
      }
  }
  g_autofree gboolean *issued = g_new0 (gboolean, MAX (nev, 1));
  g_autofree guint *ev_op = g_new (guint, MAX (nev, 1));
  for (guint e = 0; e < nev; e++)
    ev_op[e] = STOW_NONE;
  g_autofree BufState *bs = g_new0 (BufState, MAX (nbuf, 1));
  g_autofree guint64 *cur = g_new0 (guint64, p->n_ranks * STOW_N_TIERS);
  g_autoptr (GHashTable) slots
      = g_hash_table_new (g_direct_hash, g_direct_equal);
  gboolean ok = TRUE;

  /* The persistent state is there when the step begins. */
  for (guint b = 0; b < nbuf && ok; b++)
    {
      const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
      if (!buf->persistent)
        continue;
      if (!vt->buffer_alloc (backend, p, b, STOW_NONE, error))
        ok = FALSE;
      bs[b].live = bs[b].ever_written = TRUE;
      if (virt)
        mem_change (t, cur, buf, TRUE, 0.0, STOW_NONE);
    }

  for (guint done = 0; ok && done < nops; done++)
    {
      /* A head whose events are all issued: under virtual time the one
       * that starts first, else the first in program order. */
      guint best_q = STOW_NONE, best_i = STOW_NONE, best_pred = STOW_NONE;
      double best_start = 0;
      for (guint q = 0; q < nq; q++)
        {
          if (qhead[q] >= qlen[q])
            continue;
          guint i = qops[qstart[q] + qhead[q]];
          const StowOp *op = &g_array_index (p->ops, StowOp, i);
          gboolean ready = TRUE;
          for (guint w = 0; ready && w < op->n_waits; w++)
            ready = issued[g_array_index (p->waits, guint, op->wait_first + w)];
          if (!ready)
            continue;
          guint pred = STOW_NONE;
          double start = virt ? vt->start_time (backend, p, i, &pred) : 0;
          gboolean better
              = best_q == STOW_NONE || (virt ? start < best_start : i < best_i);
          if (better)
            best_q = q, best_i = i, best_start = start, best_pred = pred;
        }
      if (best_q == STOW_NONE)
        {
          set_deadlock (error, p, qops, qstart, qhead, qlen, nq, issued);
          ok = FALSE;
          break;
        }
      guint i = best_i;
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (virt && !check_virtual (p, i, best_start, bs, slots, error))
        {
          ok = FALSE;
          break;
        }
      for (guint w = 0; w < op->n_waits; w++)
        vt->event_wait (backend, op->rank, op->stream,
                        g_array_index (p->waits, guint, op->wait_first + w));
      if (op->kind == STOW_OP_ALLOC)
        {
          if (!vt->buffer_alloc (backend, p, op->buffer, i, error))
            {
              g_autofree char *what = stow_op_describe (p, i);
              g_prefix_error (error, "op %s: out of memory: ", what);
              ok = FALSE;
              break;
            }
        }
      else if (op->kind == STOW_OP_FREE)
        vt->buffer_free (backend, p, op->buffer, i);
      else if (eval && !stow_op_in_eval (op))
        ; /* not run: its event still marks its place in its stream */
      else if (!vt->issue (backend, p, i, error))
        {
          ok = FALSE;
          break;
        }
      if (op->record != STOW_NONE)
        {
          vt->event_record (backend, op->rank, op->stream, op->record, i);
          issued[op->record] = TRUE;
          ev_op[op->record] = i;
        }
      if (virt)
        {
          double start, end;
          vt->op_times (backend, i, &start, &end);
          update_virtual (p, i, start, end, bs, slots, t, cur);
          t->ops[i].start_s = start;
          t->ops[i].end_s = end;
          t->ops[i].pred = best_pred;
        }
      qhead[best_q]++;
    }
  if (!vt->synchronize (backend, ok ? error : NULL))
    ok = FALSE;
  if (!ok)
    return NULL;
  for (guint i = 0; i < nops; i++)
    {
      if (!virt)
        {
          vt->op_times (backend, i, &t->ops[i].start_s, &t->ops[i].end_s);
          t->ops[i].pred = measured_pred (p, t, i, qprev[i], ev_op);
        }
      t->ops[i].flops = vt->op_flops ? vt->op_flops (backend, i) : 0;
    }
  if (!virt && vt->fill_memory)
    vt->fill_memory (backend, p, t);
  summarise (p, t, qops, qstart, qlen);
  return g_steal_pointer (&t);
}

StowTrace *
stow_program_run (const StowProgram *p, StowBackend *backend, GError **error)
{
  g_return_val_if_fail (p != NULL && backend != NULL, NULL);
  return run (p, backend, FALSE, error);
}

StowTrace *
stow_program_run_eval (const StowProgram *p, StowBackend *backend,
                       GError **error)
{
  g_return_val_if_fail (p != NULL && backend != NULL, NULL);
  if (backend->vt->begin_eval == NULL || backend->vt->virtual_time)
    {
      g_set_error_literal (error, STOW_BACKEND_ERROR,
                           STOW_BACKEND_ERROR_UNSUPPORTED,
                           "this backend does not run evaluation");
      return NULL;
    }
  return run (p, backend, TRUE, error);
}
