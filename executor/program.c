/* SPDX-License-Identifier: MIT
 *
 * executor/program.c: the step-program interpreter.  Each (rank, stream)
 * is a queue run in program order; an op starts once its stream is free
 * and every event it waits on is recorded.  Ops are started in order of
 * their start times, so memory is accounted as it happens and every check
 * (slot reuse, reads of buffers not loaded, frees under a running op, a
 * wait that can never be satisfied) names the op at fault.
 */
#include "executor/backend.h"
#include "executor/trace.h"

typedef struct
{
  gboolean live, ever_written;
  double ready_s;       /* end of the last write */
  double last_access_s; /* end of the last op touching it */
  guint writer;         /* that write's op */
} BufState;

void
stow_trace_free (StowTrace *t)
{
  if (t == NULL)
    return;
  g_free (t->ops);
  for (guint i = 0; t->samples && i < t->n_ranks * STOW_N_TIERS; i++)
    g_array_unref (t->samples[i]);
  g_free (t->samples);
  if (t->critical_path)
    g_array_unref (t->critical_path);
  g_free (t);
}

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

static gboolean
is_drive_stream (StowStream s)
{
  return s == STOW_STREAM_NVME_READ || s == STOW_STREAM_NVME_WRITE;
}

StowTrace *
stow_program_run (const StowProgram *p, StowBackend *backend, GError **error)
{
  g_return_val_if_fail (p != NULL && backend != NULL, NULL);
  if (!stow_program_validate (p, error))
    return NULL;
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
  g_autofree double *qtime = g_new0 (double, nq);
  g_autofree guint *qlast = g_new (guint, nq);
  for (guint i = 0; i < nops; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      qlen[op->rank * STOW_N_STREAMS + op->stream]++;
    }
  for (guint q = 0; q < nq; q++)
    qstart[q + 1] = qstart[q] + qlen[q], qlast[q] = STOW_NONE;
  {
    g_autofree guint *fill = g_new0 (guint, nq);
    for (guint i = 0; i < nops; i++)
      {
        const StowOp *op = &g_array_index (p->ops, StowOp, i);
        guint q = op->rank * STOW_N_STREAMS + op->stream;
        qops[qstart[q] + fill[q]++] = i;
      }
  }
  /* A rank's nvme_read and nvme_write queues share its drives: one op at
   * a time across the two, since a drive's read and write bandwidths do
   * not add (the time model charges bytes/read + bytes/write). */
  g_autofree double *drive_time = g_new0 (double, p->n_ranks);
  g_autofree guint *drive_last = g_new (guint, p->n_ranks);
  for (guint r = 0; r < p->n_ranks; r++)
    drive_last[r] = STOW_NONE;
  g_autofree double *ev_time = g_new (double, MAX (nev, 1));
  g_autofree guint *ev_op = g_new (guint, MAX (nev, 1));
  for (guint e = 0; e < nev; e++)
    ev_time[e] = -1, ev_op[e] = STOW_NONE;
  g_autofree BufState *bs = g_new0 (BufState, MAX (nbuf, 1));
  g_autofree guint64 *cur = g_new0 (guint64, p->n_ranks * STOW_N_TIERS);
  GHashTable *slots = g_hash_table_new (g_direct_hash, g_direct_equal);
  g_autofree GArray **busy = g_new0 (GArray *, nq);
  for (guint q = 0; q < nq; q++)
    busy[q] = g_array_new (FALSE, FALSE, sizeof (double));
  gboolean ok = TRUE;

  /* The persistent state is there when the step begins. */
  for (guint b = 0; b < nbuf && ok; b++)
    {
      const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
      if (!buf->persistent)
        continue;
      if (backend->vt->buffer_alloc
          && !backend->vt->buffer_alloc (backend, buf, error))
        ok = FALSE;
      bs[b].live = bs[b].ever_written = TRUE;
      mem_change (t, cur, buf, TRUE, 0.0, STOW_NONE);
    }

  for (guint done = 0; ok && done < nops; done++)
    {
      /* The ready head with the earliest start. */
      guint best_q = STOW_NONE, best_pred = STOW_NONE;
      double best_start = 0;
      for (guint q = 0; q < nq; q++)
        {
          if (qhead[q] >= qlen[q])
            continue;
          guint i = qops[qstart[q] + qhead[q]];
          const StowOp *op = &g_array_index (p->ops, StowOp, i);
          double start = qtime[q];
          guint pred = qlast[q];
          if (is_drive_stream (op->stream) && drive_time[op->rank] > start)
            start = drive_time[op->rank], pred = drive_last[op->rank];
          gboolean ready = TRUE;
          for (guint w = 0; w < op->n_waits; w++)
            {
              guint e = g_array_index (p->waits, guint, op->wait_first + w);
              if (ev_time[e] < 0)
                {
                  ready = FALSE;
                  break;
                }
              if (ev_time[e] > start)
                start = ev_time[e], pred = ev_op[e];
            }
          if (ready && (best_q == STOW_NONE || start < best_start))
            best_q = q, best_start = start, best_pred = pred;
        }
      if (best_q == STOW_NONE)
        {
          /* Nothing can start: name each stuck head and what it waits on. */
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
                  if (ev_time[e] >= 0)
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
          g_set_error_literal (error, STOW_BACKEND_ERROR,
                               STOW_BACKEND_ERROR_DEADLOCK, msg->str);
          g_string_free (msg, TRUE);
          ok = FALSE;
          break;
        }
      guint i = qops[qstart[best_q] + qhead[best_q]];
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      double start = best_start;
      double dur = backend->vt->op_seconds (backend, p, op);
      double end = start + MAX (dur, 0.0);

      /* Checks and memory. */
      for (guint r = 0; ok && r < op->n_reads; r++)
        {
          guint b = op->reads[r];
          if (!bs[b].live)
            ok = fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                          "reads \"%s\", which is not resident (not "
                          "allocated, or already freed)",
                          buf_name (p, b));
          else if (!bs[b].ever_written)
            ok = fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                          "reads \"%s\" before anything has loaded it",
                          buf_name (p, b));
          /* Persistent state is written region by region (one layer's
           * gradients while another's are reduced): only transient
           * buffers are checked for a load still in flight. */
          else if (!g_array_index (p->buffers, StowBuffer, b).persistent
                   && bs[b].ready_s > start + 1e-12)
            {
              g_autofree char *w = stow_op_describe (p, bs[b].writer);
              ok = fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                            "reads \"%s\" at %.6f s, before op %s loads it "
                            "(ends %.6f s)",
                            buf_name (p, b), start, w, bs[b].ready_s);
            }
        }
      for (guint w = 0; ok && w < op->n_writes; w++)
        if (!bs[op->writes[w]].live)
          ok = fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                        "writes \"%s\", which is not allocated",
                        buf_name (p, op->writes[w]));
      if (!ok)
        break;
      if (op->kind == STOW_OP_ALLOC)
        {
          const StowBuffer *buf
              = &g_array_index (p->buffers, StowBuffer, op->buffer);
          if (bs[op->buffer].live)
            {
              ok = fail_op (error, STOW_BACKEND_ERROR_INVALID, p, i,
                            "allocates \"%s\", which is already allocated",
                            buf->name);
              break;
            }
          if (buf->slot >= 0)
            {
              gpointer key = GUINT_TO_POINTER (
                  (buf->rank * 64 + (guint)buf->slot) * STOW_N_TIERS + buf->tier
                  + 1);
              gpointer holder = g_hash_table_lookup (slots, key);
              if (holder != NULL)
                {
                  ok = fail_op (
                      error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                      "slot %d already holds \"%s\" when \"%s\" is allocated",
                      buf->slot, buf_name (p, GPOINTER_TO_UINT (holder) - 1),
                      buf->name);
                  break;
                }
              g_hash_table_insert (slots, key,
                                   GUINT_TO_POINTER (op->buffer + 1));
            }
          if (backend->vt->buffer_alloc
              && !backend->vt->buffer_alloc (backend, buf, error))
            {
              g_autofree char *what = stow_op_describe (p, i);
              g_prefix_error (error, "op %s: out of memory: ", what);
              ok = FALSE;
              break;
            }
          bs[op->buffer].live = TRUE;
          mem_change (t, cur, buf, TRUE, start, i);
        }
      else if (op->kind == STOW_OP_FREE)
        {
          const StowBuffer *buf
              = &g_array_index (p->buffers, StowBuffer, op->buffer);
          if (!bs[op->buffer].live)
            {
              ok = fail_op (error, STOW_BACKEND_ERROR_INVALID, p, i,
                            "frees \"%s\", which is not allocated", buf->name);
              break;
            }
          if (bs[op->buffer].last_access_s > start + 1e-12)
            {
              ok = fail_op (error, STOW_BACKEND_ERROR_NOT_RESIDENT, p, i,
                            "frees \"%s\" at %.6f s while an op still uses it "
                            "(until %.6f s)",
                            buf->name, start, bs[op->buffer].last_access_s);
              break;
            }
          if (buf->slot >= 0)
            g_hash_table_remove (
                slots, GUINT_TO_POINTER ((buf->rank * 64 + (guint)buf->slot)
                                             * STOW_N_TIERS
                                         + buf->tier + 1));
          if (backend->vt->buffer_free)
            backend->vt->buffer_free (backend, buf);
          bs[op->buffer].live = FALSE;
          mem_change (t, cur, buf, FALSE, start, i);
        }
      for (guint r = 0; r < op->n_reads; r++)
        bs[op->reads[r]].last_access_s
            = MAX (bs[op->reads[r]].last_access_s, end);
      for (guint w = 0; w < op->n_writes; w++)
        {
          BufState *s = &bs[op->writes[w]];
          s->ever_written = TRUE;
          s->ready_s = MAX (s->ready_s, end);
          s->writer = i;
          s->last_access_s = MAX (s->last_access_s, end);
        }

      t->ops[i].start_s = start;
      t->ops[i].end_s = end;
      t->ops[i].pred = best_pred;
      if (op->record != STOW_NONE)
        ev_time[op->record] = end, ev_op[op->record] = i;
      qtime[best_q] = end;
      qlast[best_q] = i;
      if (is_drive_stream (op->stream))
        drive_time[op->rank] = end, drive_last[op->rank] = i;
      qhead[best_q]++;
      if (end > start)
        {
          g_array_append_val (busy[best_q], start);
          g_array_append_val (busy[best_q], end);
        }
    }
  g_hash_table_unref (slots);

  if (ok)
    {
      guint last = STOW_NONE;
      for (guint i = 0; i < nops; i++)
        if (last == STOW_NONE || t->ops[i].end_s > t->ops[last].end_s)
          last = i;
      t->step_time_s = last != STOW_NONE ? t->ops[last].end_s : 0;
      t->critical_rank
          = last != STOW_NONE ? g_array_index (p->ops, StowOp, last).rank : 0;
      guint r = t->critical_rank;
      GArray *comp = busy[r * STOW_N_STREAMS + STOW_STREAM_COMPUTE];
      for (guint s = 0; s < STOW_N_STREAMS; s++)
        {
          GArray *a = busy[r * STOW_N_STREAMS + s];
          for (guint k = 0; k < a->len; k += 2)
            t->busy_s[s] += g_array_index (a, double, k + 1)
                            - g_array_index (a, double, k);
          t->exposed_s[s]
              = s == STOW_STREAM_COMPUTE ? t->busy_s[s] : uncovered (a, comp);
        }
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
  for (guint q = 0; q < nq; q++)
    g_array_unref (busy[q]);
  if (!ok)
    return NULL;
  return g_steal_pointer (&t);
}
