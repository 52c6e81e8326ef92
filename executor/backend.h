/* SPDX-License-Identifier: MIT
 *
 * executor/backend.h: the table of functions a backend gives the driver
 * (in the style of ggml's backend interface): stream-ordered buffers from
 * an arena with a hard capacity per tier, ops issued on streams, events
 * recorded on one stream and waited on by another, synchronize, a clock.
 * The driver (executor/driver.c) issues each rank's ops in program order
 * per stream; only events order work across streams.  Backends:
 *   sim   virtual time from the cluster's numbers and the time model; no
 *         data (executor/backends/sim.c);
 *   cpu   real tensors in a capacity-limited arena of host RAM, one worker
 *         thread per stream (executor/backends/cpu.c).
 */
#pragma once

#include <glib.h>

#include "planner/program.h"

G_BEGIN_DECLS

#define STOW_BACKEND_ERROR (stow_backend_error_quark ())
GQuark stow_backend_error_quark (void);

typedef enum
{
  STOW_BACKEND_ERROR_OUT_OF_MEMORY, /* an alloc beyond a tier's capacity */
  STOW_BACKEND_ERROR_DEADLOCK,      /* waits that can never be satisfied */
  STOW_BACKEND_ERROR_NOT_RESIDENT,  /* an op reads a buffer not loaded */
  STOW_BACKEND_ERROR_INVALID,       /* a malformed program */
  STOW_BACKEND_ERROR_UNSUPPORTED,   /* an op or layout the backend lacks */
  STOW_BACKEND_ERROR_FAILED,        /* the work itself failed (I/O, ...) */
} StowBackendError;

typedef struct _StowBackend StowBackend;
typedef struct _StowTrace StowTrace;

/* Every function but the optional ones must be set.  Stream-ordered means
 * the work happens when the stream reaches it, after what was issued on
 * the stream before and after the events it was told to wait on; a real
 * backend returns from the call at once. */
typedef struct
{
  const char *name;
  /* TRUE when an op's times are known as soon as it is issued (the sim's
   * virtual clock): the driver then issues ready ops in order of their
   * start and checks each read and free against those times. */
  gboolean virtual_time;
  /* Virtual time only: when @op would start if issued now (its stream,
   * its waits, a drive it shares), and the op whose end decided it. */
  double (*start_time) (StowBackend *b, const StowProgram *p, guint op,
                        guint *pred);
  /* Makes @stream of @rank wait for @event (recorded earlier in issue
   * order, on another stream). */
  void (*event_wait) (StowBackend *b, guint rank, StowStream stream,
                      guint event);
  /* Takes program buffer @buffer's bytes from its tier's arena, stream
   * ordered by the alloc op @op (STOW_NONE: a persistent buffer, there
   * when the step begins).  Fails with _OUT_OF_MEMORY naming the buffer
   * and the figures; a real backend may report it from synchronize. */
  gboolean (*buffer_alloc) (StowBackend *b, const StowProgram *p,
                            guint buffer, guint op, GError **error);
  void (*buffer_free) (StowBackend *b, const StowProgram *p, guint buffer,
                       guint op);
  /* Issues op @op: copy, forward, backward, recompute, loss, optim_step,
   * collective, data or grad_norm.  _UNSUPPORTED for what the backend
   * cannot run. */
  gboolean (*issue) (StowBackend *b, const StowProgram *p, guint op,
                     GError **error);
  /* Records @event on @stream once the work issued on it so far is done
   * (op @op is the last of it). */
  void (*event_record) (StowBackend *b, guint rank, StowStream stream,
                        guint event, guint op);
  /* Waits for everything issued; returns the first failure of any op. */
  gboolean (*synchronize) (StowBackend *b, GError **error);
  /* Seconds on the backend's clock since it was made. */
  double (*now) (StowBackend *b);
  /* When op @op ran, after synchronize (at once for virtual time). */
  void (*op_times) (StowBackend *b, guint op, double *start_s, double *end_s);
  /* Optional: fills @trace's memory samples and peaks per tier (what the
   * arena saw), after synchronize. */
  void (*fill_memory) (StowBackend *b, const StowProgram *p, StowTrace *trace);
  /* Optional: FLOPs the backend priced @op at (reports), 0 if none. */
  double (*op_flops) (StowBackend *b, guint op);
  void (*destroy) (StowBackend *b);
} StowBackendVtable;

struct _StowBackend
{
  const StowBackendVtable *vt;
};

void stow_backend_free (StowBackend *b);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBackend, stow_backend_free)

G_END_DECLS
