/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-trace.c: see testutil-trace.h.
 */
#include "testutil-trace.h"

#include <json-glib/json-glib.h>

#include "core/json.h"

static int
by_op (gconstpointer a, gconstpointer b)
{
  const TraceOp *x = a, *y = b;
  return x->op < y->op ? -1 : x->op > y->op;
}

TraceOps *
trace_ops_load (const char *path)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = stow_json_parse_file (path, 1 << 28, &error);
  g_assert_no_error (error);
  JsonArray *ev = json_object_get_array_member (json_node_get_object (root),
                                                "traceEvents");
  g_assert_nonnull (ev);
  /* Thread names first: (pid, tid) -> stream. */
  g_autoptr (GHashTable) threads
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  for (guint k = 0; k < json_array_get_length (ev); k++)
    {
      JsonObject *e = json_array_get_object_element (ev, k);
      if (g_strcmp0 (json_object_get_string_member (e, "ph"), "M") != 0
          || g_strcmp0 (json_object_get_string_member (e, "name"),
                        "thread_name")
                 != 0)
        continue;
      JsonObject *args = json_object_get_object_member (e, "args");
      g_hash_table_insert (
          threads,
          g_strdup_printf ("%" G_GINT64_FORMAT " %" G_GINT64_FORMAT,
                           json_object_get_int_member (e, "pid"),
                           json_object_get_int_member (e, "tid")),
          g_strdup (json_object_get_string_member (args, "name")));
    }
  TraceOps *t = g_new0 (TraceOps, 1);
  t->ops = g_array_new (FALSE, TRUE, sizeof (TraceOp));
  g_autoptr (GPtrArray) dep_lists = g_ptr_array_new ();
  for (guint k = 0; k < json_array_get_length (ev); k++)
    {
      JsonObject *e = json_array_get_object_element (ev, k);
      if (g_strcmp0 (json_object_get_string_member (e, "ph"), "X") != 0)
        continue;
      JsonObject *args = json_object_get_object_member (e, "args");
      g_assert_nonnull (args);
      g_assert_true (json_object_has_member (args, "op"));
      g_assert_true (json_object_has_member (args, "deps"));
      g_autofree char *key
          = g_strdup_printf ("%" G_GINT64_FORMAT " %" G_GINT64_FORMAT,
                             json_object_get_int_member (e, "pid"),
                             json_object_get_int_member (e, "tid"));
      const char *stream = g_hash_table_lookup (threads, key);
      g_assert_nonnull (stream);
      TraceOp o = { 0 };
      o.op = (guint)json_object_get_int_member (args, "op");
      o.name = g_strdup (json_object_get_string_member (e, "name"));
      o.kind = g_strdup (json_object_get_string_member (e, "cat"));
      o.stream = g_strdup (stream);
      o.rank = (guint)json_object_get_int_member (e, "pid");
      o.start_us = json_object_get_double_member (e, "ts");
      o.end_us = o.start_us + json_object_get_double_member (e, "dur");
      /* For now the program indices of the deps; made trace indices
       * below, once the ops are in order. */
      o.deps = g_array_new (FALSE, FALSE, sizeof (guint));
      JsonArray *d = json_object_get_array_member (args, "deps");
      for (guint j = 0; j < json_array_get_length (d); j++)
        {
          guint x = (guint)json_array_get_int_element (d, j);
          g_array_append_val (o.deps, x);
        }
      g_array_append_val (t->ops, o);
    }
  g_array_sort (t->ops, by_op);
  g_autoptr (GHashTable) index
      = g_hash_table_new (g_direct_hash, g_direct_equal);
  t->first_start_us = G_MAXDOUBLE;
  for (guint i = 0; i < t->ops->len; i++)
    {
      TraceOp *o = trace_op (t, i);
      g_assert_false (g_hash_table_contains (index, GUINT_TO_POINTER (o->op)));
      g_hash_table_insert (index, GUINT_TO_POINTER (o->op),
                           GUINT_TO_POINTER (i + 1));
      t->first_start_us = MIN (t->first_start_us, o->start_us);
    }
  for (guint i = 0; i < t->ops->len; i++)
    {
      TraceOp *o = trace_op (t, i);
      for (guint j = 0; j < o->deps->len; j++)
        {
          guint *x = &g_array_index (o->deps, guint, j);
          guint at = GPOINTER_TO_UINT (
              g_hash_table_lookup (index, GUINT_TO_POINTER (*x)));
          if (at == 0)
            g_error ("%s: dep #%u is not an op of the trace", o->name, *x);
          *x = at - 1;
        }
    }
  return t;
}

void
trace_ops_free (TraceOps *t)
{
  if (t == NULL)
    return;
  for (guint i = 0; i < t->ops->len; i++)
    {
      TraceOp *o = trace_op (t, i);
      g_free (o->name);
      g_free (o->kind);
      g_free (o->stream);
      g_array_unref (o->deps);
    }
  g_array_unref (t->ops);
  g_free (t);
}

double
trace_op_ready_us (const TraceOps *t, guint i)
{
  const TraceOp *o = trace_op (t, i);
  if (o->deps->len == 0)
    return t->first_start_us;
  double ready = -G_MAXDOUBLE;
  for (guint j = 0; j < o->deps->len; j++)
    ready
        = MAX (ready, trace_op (t, g_array_index (o->deps, guint, j))->end_us);
  return ready;
}

gboolean
trace_op_depends (const TraceOps *t, guint y, guint x)
{
  g_autofree gboolean *seen = g_new0 (gboolean, t->ops->len);
  g_autoptr (GArray) todo = g_array_new (FALSE, FALSE, sizeof (guint));
  g_array_append_val (todo, y);
  while (todo->len > 0)
    {
      guint i = g_array_index (todo, guint, todo->len - 1);
      g_array_set_size (todo, todo->len - 1);
      const TraceOp *o = trace_op (t, i);
      for (guint j = 0; j < o->deps->len; j++)
        {
          guint d = g_array_index (o->deps, guint, j);
          if (d == x)
            return TRUE;
          if (!seen[d])
            {
              seen[d] = TRUE;
              g_array_append_val (todo, d);
            }
        }
    }
  return FALSE;
}

double
trace_ops_overlap_us (const TraceOps *t, guint a, guint b)
{
  const TraceOp *x = trace_op (t, a), *y = trace_op (t, b);
  return MIN (x->end_us, y->end_us) - MAX (x->start_us, y->start_us);
}
