/* SPDX-License-Identifier: MIT
 *
 * program/trace.h: what running a step program produced: each op's start
 * and end, memory per rank and tier over time with the op at each peak,
 * time per stream (busy and exposed behind compute), the critical path.
 * Written as Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev).
 */
#pragma once

#include <glib.h>

#include "program/backend.h"
#include "program/program.h"

G_BEGIN_DECLS

typedef struct
{
  double start_s, end_s;
  guint pred;   /* the op whose end decided this start, or STOW_NONE */
  double flops; /* what the backend priced it at (sim), 0 if none */
} StowTraceOp;

typedef struct
{
  double time_s;
  guint64 bytes;
} StowMemSample;

struct _StowTrace
{
  guint n_ops, n_ranks;
  StowTraceOp *ops;
  double step_time_s;
  guint critical_rank; /* the rank that finishes last */
  /* of the critical rank: time each stream is busy, and busy while its
   * rank's compute stream is idle (for compute: its busy time) */
  double busy_s[STOW_N_STREAMS];
  double exposed_s[STOW_N_STREAMS];
  /* per tier, the largest over ranks */
  guint64 peak_bytes[STOW_N_TIERS];
  double peak_time_s[STOW_N_TIERS];
  guint peak_op[STOW_N_TIERS]; /* STOW_NONE: the persistent state */
  guint peak_rank[STOW_N_TIERS];
  GArray **samples;      /* [rank * STOW_N_TIERS + tier]: StowMemSample */
  GArray *critical_path; /* guint op indices, first to last */
};

void stow_trace_free (StowTrace *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowTrace, stow_trace_free)

/* Chrome trace-event JSON: one process per rank, one thread per stream,
 * counters for memory per tier.  Each op that takes time is an "X" event
 * named by stow_op_describe, its args: "op" (its index in @p), "deps"
 * (the ops that must end before it may start: the one before it on its
 * stream and the recorders of the events it waits on, seen through the
 * allocs and frees the trace leaves out, which wait in their turn) and
 * "bytes" and "flops" where it has them. */
char *stow_trace_to_chrome_json (const StowTrace *t, const StowProgram *p);

/* "compute backward x80 4.2 s (ranks 0-3)" lines along the critical path,
 * grouped by stream and op kind, longest first (at most @max_lines). */
void stow_trace_critical_summary (const StowTrace *t, const StowProgram *p,
                                  GString *out, guint max_lines);

G_END_DECLS
