/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu.h: the cpu backend: real tensors, the "device" a
 * capacity-limited arena of host RAM (executor/arena.h), one worker thread
 * per stream joined only by the program's events, the decoder's kernels
 * from executor/llama.h and Adam from offload/adam.c.  It is the oracle
 * the other backends are compared against.  It runs one rank (one device)
 * of a LLaMA-family model; ops it cannot run yet (copies between tiers,
 * collectives, a host optimizer) are refused by name when issued.
 */
#pragma once

#include "executor/backend.h"
#include "executor/backends/swap.h"
#include "executor/backends/tensors.h"
#include "executor/llama.h"

G_BEGIN_DECLS

/* Fills the tokens and targets (@n each) of micro-batch @micro_batch of
 * step @step (1-based).  Runs on the compute stream's worker. */
typedef gboolean (*StowCpuDataFn) (gpointer user, guint64 step,
                                   guint micro_batch, gint32 *tokens,
                                   gint32 *targets, guint64 n, GError **error);

typedef struct
{
  const StowProgram *program; /* borrowed: must outlive the backend */
  const StowModel *model;     /* the model the program was lowered for */
  guint64 device_capacity_bytes;
  guint n_threads; /* compute and Adam threads; 0: one per core */
  StowCpuDataFn data;
  gpointer data_user;
  /* Test knob: every copy sleeps this long first (0: none), so that tests
   * of overlap on a small machine can see it. */
  guint copy_delay_us;
  /* Where the optimizer states go when the program keeps them on NVMe. */
  StowSwapSetup swap;
  /* ZeRO-Offload's delayed parameter update (the program lowered with
   * it): step s's host optimizer applies step s - 1's gradients, kept
   * aside when step s begins, while step s computes. */
  gboolean delayed_update;
  /* Leave the program's pinned host buffers pageable (train's
   * --allow-unpinned, where RLIMIT_MEMLOCK is too low to lock them). */
  gboolean no_pin;
} StowCpuSetup;

/* Checks that every buffer of @setup->program holds what the runtime
 * keeps in it (STOW_BACKEND_ERROR_INVALID naming the buffer and both
 * sizes), makes the arena and starts the workers. */
StowBackend *stow_backend_cpu_new (const StowCpuSetup *setup, GError **error);

/* Allocates the program's persistent buffers (weights, gradients, master
 * weights, optimizer states) now, at the bottom of the arena, so they can
 * be loaded before the first step; they stay allocated across steps. */
gboolean stow_backend_cpu_alloc_persistent (StowBackend *cpu, GError **error);

/* Before each run of the program: the 1-based step (Adam's t and the
 * learning rate) and the loss scale's bookkeeping start afresh. */
void stow_backend_cpu_begin_step (StowBackend *cpu, guint64 step);

typedef struct
{
  double loss;      /* mean token cross-entropy over the global batch */
  double grad_norm; /* global L2 norm before clipping; NaN/Inf if so */
  gboolean skipped; /* a non-finite gradient: no weight was written */
  double lr;
} StowStepStats;

void stow_backend_cpu_step_stats (StowBackend *cpu, StowStepStats *out);
guint64 stow_backend_cpu_peak_bytes (StowBackend *cpu);
void stow_backend_cpu_reset_peak (StowBackend *cpu);
/* The peak of the program's pinned-tier buffers held at once (host memory
 * on the cpu backend; a swap buffer counts as its ring buffer). */
guint64 stow_backend_cpu_pinned_peak_bytes (StowBackend *cpu);

/* The persistent tensors of @unit, for loading and saving: its weights
 * (program->weight_dtype), its fp32 master copy (NULL without one), its
 * Adam moments; NULL before stow_backend_cpu_alloc_persistent, and the
 * master and moments NULL when they live on NVMe (then
 * stow_backend_cpu_states). */
void *stow_backend_cpu_weights (StowBackend *cpu, guint unit);
float *stow_backend_cpu_master (StowBackend *cpu, guint unit);
float *stow_backend_cpu_moment (StowBackend *cpu, guint unit, guint which);
/* States on NVMe, between steps: floats [@first, @first + @n) of state
 * @which (0 master, 1 m, 2 v) of @unit read into (or written from)
 * @data.  STOW_BACKEND_ERROR_INVALID when the states are not on NVMe. */
gboolean stow_backend_cpu_states (StowBackend *cpu, gboolean write, guint unit,
                                  guint which, guint64 first, guint64 n,
                                  float *data, GError **error);
/* After the weights (and states) were loaded: with an offloaded
 * optimizer, the host copy CPU Adam updates takes the weights (fp32
 * training updates that copy in place), and states written to NVMe are
 * flushed.  TRUE; nothing without one. */
gboolean stow_backend_cpu_push (StowBackend *cpu, GError **error);
/* --delayed-update: the gradients of @unit the next step will apply (the
 * training dtype; the host gradients), and whether there are any.  For
 * checkpoints, which save them, and resumption, which restores them and
 * then calls stow_backend_cpu_set_pending (TRUE).  NULL without a
 * delayed update. */
void *stow_backend_cpu_pending (StowBackend *cpu, guint unit,
                                gboolean *pending);
void stow_backend_cpu_set_pending (StowBackend *cpu, gboolean pending);
/* One line on where the optimizer states are swapped, or NULL. */
char *stow_backend_cpu_describe_swap (StowBackend *cpu);
/* Why stow_backend_cpu_weights gave NULL (a read from the weights' NVMe
 * store failed), or NULL; the caller owns it. */
GError *stow_backend_cpu_take_access_error (StowBackend *cpu);
/* "pinned pool: 1.6 MiB in 1 slab (...), mlock, ..." for the program's
 * persistent pinned buffers, or NULL when it has none. */
char *stow_backend_cpu_describe_pinned (StowBackend *cpu);

G_END_DECLS
