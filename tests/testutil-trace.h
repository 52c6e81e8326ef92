/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-trace.h: a Chrome trace written by `stowage simulate
 * --trace` or `stowage train --trace`, read back as the ops it shows:
 * each op's stream, interval and the ops it waits for (its "deps" arg),
 * for tests of causality and overlap.  Not a general trace reader.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  guint op;     /* index in the step program: the "#N" of its name */
  char *name;   /* "#24 backward L0 mb0 (rank 0 compute)" */
  char *kind;   /* the event's "cat": "copy", "backward", ... */
  char *stream; /* its thread's name: "compute", "d2h", ... */
  guint rank;
  double start_us, end_us;
  GArray *deps; /* guint: indices into TraceOps.ops */
} TraceOp;

typedef struct
{
  GArray *ops; /* TraceOp, in program order */
  double first_start_us;
} TraceOps;

/* Reads @path and asserts what the readers rely on: every "X" event has
 * "op" and "deps" args, and every dep is an op of the trace. */
TraceOps *trace_ops_load (const char *path);
void trace_ops_free (TraceOps *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (TraceOps, trace_ops_free)

static inline TraceOp *
trace_op (const TraceOps *t, guint i)
{
  return &g_array_index (t->ops, TraceOp, i);
}

/* When op @i could start as the program orders it: the last end of its
 * deps, or the trace's first start when it has none. */
double trace_op_ready_us (const TraceOps *t, guint i);
/* Whether op @y waits, directly or through other ops, for op @x. */
gboolean trace_op_depends (const TraceOps *t, guint y, guint x);
/* Microseconds both ops ran at once (negative: the gap between them). */
double trace_ops_overlap_us (const TraceOps *t, guint a, guint b);

G_END_DECLS
