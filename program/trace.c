/* SPDX-License-Identifier: MIT
 *
 * program/trace.c: a trace as Chrome trace-event JSON (the format
 * chrome://tracing and ui.perfetto.dev open: "X" complete events in
 * microseconds, "M" metadata naming processes and threads, "C" counters)
 * and the critical path summarised in a few lines.
 */
#include "program/trace.h"

#include <json-glib/json-glib.h>

#include "core/json.h"

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

static void
meta (JsonBuilder *b, const char *what, guint pid, guint tid, const char *name)
{
  json_builder_begin_object (b);
  stow_json_set_string (b, "ph", "M");
  stow_json_set_string (b, "name", what);
  stow_json_set_i64 (b, "pid", pid);
  stow_json_set_i64 (b, "tid", tid);
  json_builder_set_member_name (b, "args");
  json_builder_begin_object (b);
  stow_json_set_string (b, "name", name);
  json_builder_end_object (b);
  json_builder_end_object (b);
}

/* Whether the trace shows op @i: allocs and frees take no time under the
 * sim and are left out. */
static gboolean
traced (const StowProgram *p, guint i)
{
  StowOpKind k = g_array_index (p->ops, StowOp, i).kind;
  return k != STOW_OP_ALLOC && k != STOW_OP_FREE;
}

static void
add_dep (GArray *a, guint op)
{
  for (guint k = 0; k < a->len; k++)
    if (g_array_index (a, guint, k) == op)
      return;
  g_array_append_val (a, op);
}

typedef struct
{
  const StowProgram *p;
  guint *stream_prev; /* [op]: the op before it on its (rank, stream) */
  guint *recorder;    /* [event]: the op that records it */
  GArray **deps;      /* [op]: memo of deps_of, NULL until computed */
  gboolean *visiting;
} Deps;

static GArray *deps_of (Deps *d, guint i);

/* The traced ops that must end before anything after @j on its stream
 * (or waiting on @j's event) may start: @j itself, or when @j is left
 * out, what @j had to wait for. */
static void
add_through (Deps *d, GArray *out, guint j)
{
  if (traced (d->p, j))
    {
      add_dep (out, j);
      return;
    }
  GArray *a = deps_of (d, j);
  for (guint k = 0; a != NULL && k < a->len; k++)
    add_dep (out, g_array_index (a, guint, k));
}

/* The traced ops op @i waits for: the op before it on its stream and the
 * recorders of its events, seen through allocs and frees.  Memoised; a
 * cycle (a program that could not have run) is cut: NULL. */
static GArray *
deps_of (Deps *d, guint i)
{
  if (d->deps[i] != NULL || d->visiting[i])
    return d->deps[i];
  d->visiting[i] = TRUE;
  GArray *a = g_array_new (FALSE, FALSE, sizeof (guint));
  const StowOp *op = &g_array_index (d->p->ops, StowOp, i);
  if (d->stream_prev[i] != STOW_NONE)
    add_through (d, a, d->stream_prev[i]);
  for (guint w = 0; w < op->n_waits; w++)
    {
      guint e = g_array_index (d->p->waits, guint, op->wait_first + w);
      if (d->recorder[e] != STOW_NONE)
        add_through (d, a, d->recorder[e]);
    }
  d->visiting[i] = FALSE;
  return d->deps[i] = a;
}

static void
deps_init (Deps *d, const StowProgram *p)
{
  guint nops = p->ops->len, nev = p->events->len;
  d->p = p;
  d->stream_prev = g_new (guint, MAX (nops, 1));
  d->recorder = g_new (guint, MAX (nev, 1));
  d->deps = g_new0 (GArray *, MAX (nops, 1));
  d->visiting = g_new0 (gboolean, MAX (nops, 1));
  for (guint e = 0; e < nev; e++)
    d->recorder[e] = STOW_NONE;
  g_autofree guint *last = g_new (guint, p->n_ranks * STOW_N_STREAMS);
  for (guint q = 0; q < p->n_ranks * STOW_N_STREAMS; q++)
    last[q] = STOW_NONE;
  for (guint i = 0; i < nops; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      guint q = op->rank * STOW_N_STREAMS + op->stream;
      d->stream_prev[i] = last[q];
      last[q] = i;
      if (op->record != STOW_NONE)
        d->recorder[op->record] = i;
    }
}

static void
deps_clear (Deps *d)
{
  for (guint i = 0; i < d->p->ops->len; i++)
    if (d->deps[i])
      g_array_unref (d->deps[i]);
  g_free (d->deps);
  g_free (d->visiting);
  g_free (d->stream_prev);
  g_free (d->recorder);
}

char *
stow_trace_to_chrome_json (const StowTrace *t, const StowProgram *p)
{
  Deps deps;
  deps_init (&deps, p);
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "displayTimeUnit", "ms");
  json_builder_set_member_name (b, "traceEvents");
  json_builder_begin_array (b);
  for (guint r = 0; r < p->n_ranks; r++)
    {
      g_autofree char *pname = g_strdup_printf ("rank %u (stage %u)", r, r);
      meta (b, "process_name", r, 0, pname);
      for (guint s = 0; s < STOW_N_STREAMS; s++)
        meta (b, "thread_name", r, s, stow_stream_name (s));
    }
  for (guint i = 0; i < t->n_ops; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      const StowTraceOp *to = &t->ops[i];
      if (!traced (p, i))
        continue;
      g_autofree char *name = stow_op_describe (p, i);
      json_builder_begin_object (b);
      stow_json_set_string (b, "name", name);
      stow_json_set_string (b, "cat", stow_op_kind_name (op->kind));
      stow_json_set_string (b, "ph", "X");
      stow_json_set_double (b, "ts", to->start_s * 1e6);
      stow_json_set_double (b, "dur", (to->end_s - to->start_s) * 1e6);
      stow_json_set_i64 (b, "pid", op->rank);
      stow_json_set_i64 (b, "tid", op->stream);
      json_builder_set_member_name (b, "args");
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "op", i);
      GArray *dep = deps_of (&deps, i);
      json_builder_set_member_name (b, "deps");
      json_builder_begin_array (b);
      for (guint k = 0; dep != NULL && k < dep->len; k++)
        json_builder_add_int_value (b, g_array_index (dep, guint, k));
      json_builder_end_array (b);
      if (op->bytes)
        {
          stow_json_set_i64 (b, "bytes", (gint64)op->bytes);
        }
      if (to->flops > 0)
        {
          stow_json_set_double (b, "flops", to->flops);
        }
      json_builder_end_object (b);
      json_builder_end_object (b);
    }
  for (guint r = 0; r < p->n_ranks; r++)
    for (guint tier = 0; tier < STOW_N_TIERS; tier++)
      {
        GArray *s = t->samples[r * STOW_N_TIERS + tier];
        g_autofree char *cname
            = g_strdup_printf ("%s memory", stow_tier_name (tier));
        for (guint k = 0; k < s->len; k++)
          {
            StowMemSample *sm = &g_array_index (s, StowMemSample, k);
            json_builder_begin_object (b);
            stow_json_set_string (b, "name", cname);
            stow_json_set_string (b, "ph", "C");
            stow_json_set_double (b, "ts", sm->time_s * 1e6);
            stow_json_set_i64 (b, "pid", r);
            json_builder_set_member_name (b, "args");
            json_builder_begin_object (b);
            stow_json_set_i64 (b, "bytes", (gint64)sm->bytes);
            json_builder_end_object (b);
            json_builder_end_object (b);
          }
      }
  json_builder_end_array (b);
  json_builder_end_object (b);
  deps_clear (&deps);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  return stow_json_to_string (root, FALSE);
}

typedef struct
{
  StowStream stream;
  StowOpKind kind;
  guint count;
  guint first_rank, last_rank;
  double seconds;
} Group;

static int
by_seconds (gconstpointer a, gconstpointer b)
{
  const Group *x = a, *y = b;
  return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : 0;
}

void
stow_trace_critical_summary (const StowTrace *t, const StowProgram *p,
                             GString *out, guint max_lines)
{
  g_autoptr (GArray) groups = g_array_new (FALSE, FALSE, sizeof (Group));
  double waited = 0, prev_end = 0;
  for (guint k = 0; t->critical_path && k < t->critical_path->len; k++)
    {
      guint i = g_array_index (t->critical_path, guint, k);
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      double d = t->ops[i].end_s - t->ops[i].start_s;
      waited += MAX (0.0, t->ops[i].start_s - prev_end);
      prev_end = t->ops[i].end_s;
      if (d <= 0)
        continue;
      guint g;
      for (g = 0; g < groups->len; g++)
        {
          Group *x = &g_array_index (groups, Group, g);
          if (x->stream == op->stream && x->kind == op->kind)
            break;
        }
      if (g == groups->len)
        {
          Group x = { op->stream, op->kind, 0, op->rank, op->rank, 0 };
          g_array_append_val (groups, x);
        }
      Group *x = &g_array_index (groups, Group, g);
      x->count++;
      x->seconds += d;
      x->first_rank = MIN (x->first_rank, op->rank);
      x->last_rank = MAX (x->last_rank, op->rank);
    }
  g_array_sort (groups, by_seconds);
  for (guint g = 0; g < groups->len && g < max_lines; g++)
    {
      Group *x = &g_array_index (groups, Group, g);
      g_autofree char *ranks
          = x->first_rank == x->last_rank
                ? g_strdup_printf ("rank %u", x->first_rank)
                : g_strdup_printf ("ranks %u-%u", x->first_rank, x->last_rank);
      g_string_append_printf (out, "  %-10s %-10s x%-6u %10.4f s  (%s)\n",
                              stow_stream_name (x->stream),
                              stow_op_kind_name (x->kind), x->count, x->seconds,
                              ranks);
    }
  if (waited > 1e-9)
    g_string_append_printf (out, "  (idle gaps on the path: %.4f s)\n", waited);
}
