/* SPDX-License-Identifier: MIT
 *
 * executor/trace.c: a trace as Chrome trace-event JSON (the format
 * chrome://tracing and ui.perfetto.dev open: "X" complete events in
 * microseconds, "M" metadata naming processes and threads, "C" counters)
 * and the critical path summarised in a few lines.
 */
#include "executor/trace.h"

#include <json-glib/json-glib.h>

#include "core/json.h"

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

char *
stow_trace_to_chrome_json (const StowTrace *t, const StowProgram *p)
{
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
      if (op->kind == STOW_OP_ALLOC || op->kind == STOW_OP_FREE)
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
