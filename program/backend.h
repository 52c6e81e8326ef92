/* SPDX-License-Identifier: MIT
 *
 * program/backend.h: the table of functions a backend gives the driver
 * (in the style of ggml's backend interface): stream-ordered buffers from
 * an arena with a hard capacity per tier, ops issued on streams, events
 * recorded on one stream and waited on by another, synchronize, a clock.
 * The driver (program/driver.c) issues each rank's ops in program order
 * per stream; only events order work across streams.  Backends:
 *   sim   virtual time from the cluster's numbers and the time model; no
 *         data (planner/sim.c);
 *   cpu   real tensors in a capacity-limited arena of host RAM, one worker
 *         thread per stream (executor/backends/cpu.c);
 *   cuda  real tensors in a cudaMalloc'd arena, one CUDA stream per
 *         program stream (executor/backends/cuda/cuda.c).
 * The backends that hold real tensors also give the training loop what it
 * needs between steps (loads, saves, the step's loss): the optional
 * entries at the end of the table.  executor/backends/registry.h makes
 * them by name.
 */
#pragma once

#include <glib.h>

#include "program/program.h"

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

/* What a step computed, after its synchronize. */
typedef struct
{
  double loss;      /* mean token cross-entropy over the global batch */
  double loss_sum;  /* the sum it is the mean of (loss = loss_sum x the
                       step's scale, 1 / its targets) */
  double grad_norm; /* global L2 norm before clipping; NaN/Inf if so */
  gboolean skipped; /* a non-finite gradient: no weight was written */
  double lr;
} StowStepStats;

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
  gboolean (*buffer_alloc) (StowBackend *b, const StowProgram *p, guint buffer,
                            guint op, GError **error);
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

  /* ---- real tensors: set by the backends that hold them, NULL in the
   * sim.  All of them between steps, never while the program runs. */

  /* Allocates the program's persistent buffers (weights, gradients,
   * master weights, optimizer states) now, so they can be loaded before
   * the first step; they stay allocated across steps. */
  gboolean (*alloc_persistent) (StowBackend *b, GError **error);
  /* Before each run of the program: the 1-based step (Adam's t and the
   * learning rate); the step's sums start afresh. */
  void (*begin_step) (StowBackend *b, guint64 step);
  /* Optional (NULL: no evaluation): before a run of the program in
   * evaluation mode (stow_program_run_eval), instead of begin_step: the
   * data ops read batch @batch (1-based, as a step) of the evaluation data
   * the backend was made with, the run's loss sum starts afresh, and its
   * loss ops compute the loss alone, writing no gradient.  step_stats
   * then gives that batch's mean loss over its targets.  The next
   * begin_step goes back to training. */
  void (*begin_eval) (StowBackend *b, guint64 batch);
  /* After the step's synchronize: its loss, norm and learning rate. */
  gboolean (*step_stats) (StowBackend *b, StowStepStats *out, GError **error);
  /* The device arena's peak since the last reset_peak. */
  guint64 (*peak_bytes) (StowBackend *b);
  void (*reset_peak) (StowBackend *b);
  /* Optional: the peak of the program's pinned host buffers held at once;
   * NULL: not measured. */
  guint64 (*pinned_peak_bytes) (StowBackend *b);
  /* The persistent tensors of @unit, for loading and saving, in host
   * memory: its weights (the program's weight_dtype), its fp32 master
   * copy (NULL without one), its Adam moments (@which 0: m, 1: v); NULL
   * before alloc_persistent, and the master and moments NULL where they
   * have no address (on NVMe: then states). */
  void *(*weights) (StowBackend *b, guint unit);
  float *(*master) (StowBackend *b, guint unit);
  float *(*moment) (StowBackend *b, guint unit, guint which);
  /* Optional, where the tensors above are host copies of the device's:
   * pull fills them from the device, push sends them up (after a load).
   * Where the accessors are the backend's own memory pull is NULL and
   * push does what a load needs afterwards (host copies, flushes). */
  gboolean (*pull) (StowBackend *b, GError **error);
  gboolean (*push) (StowBackend *b, GError **error);
  /* Optional: states with no address (on NVMe), by range: floats [@first,
   * @first + @n) of state @which (0 master, 1 m, 2 v) of @unit read into
   * (or written from) @data.  NULL: no such states. */
  gboolean (*states) (StowBackend *b, gboolean write, guint unit, guint which,
                      guint64 first, guint64 n, float *data, GError **error);
  /* Optional: why weights() gave NULL (a read from the weights' NVMe store
   * failed), or NULL; the caller owns it. */
  /* Several data-parallel ranks whose optimizer states are partitioned
   * (ZeRO 1-3): this rank and their number (NULL, or *world 1: whole
   * states), and the elements of @unit this rank's states hold: the
   * count, and the first in *@first. */
  void (*ranks) (StowBackend *b, guint *rank, guint *world);
  guint64 (*partition) (StowBackend *b, guint unit, guint64 *first);
  GError *(*take_access_error) (StowBackend *b);
  /* The delayed update's pending gradients of @unit (the training dtype;
   * the next step applies them) and in @pending whether there are any;
   * NULL without a delayed update.  set_pending says a resumed run has
   * them. */
  void *(*pending) (StowBackend *b, guint unit, gboolean *pending);
  void (*set_pending) (StowBackend *b, gboolean pending);
  /* Optional: lines for the user on where the backend keeps the program's
   * NVMe swap files and its pinned host buffers, or NULL (the caller
   * frees them). */
  char *(*describe_swap) (StowBackend *b);
  char *(*describe_pinned) (StowBackend *b);
} StowBackendVtable;

struct _StowBackend
{
  const StowBackendVtable *vt;
};

void stow_backend_free (StowBackend *b);

/* Sets @error to STOW_BACKEND_ERROR_UNSUPPORTED for op @op of @p, which
 * backend @backend does not run ("op #12 collective ...: the cpu backend
 * does not run collective ops yet (@why)"); returns FALSE. */
gboolean stow_backend_unsupported_op (const StowProgram *p, guint op,
                                      const char *backend, const char *why,
                                      GError **error);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBackend, stow_backend_free)

G_END_DECLS
