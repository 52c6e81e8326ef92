/* SPDX-License-Identifier: MIT
 *
 * executor/backends/registry.h: the backends that hold real tensors, by
 * name ("cpu", "cuda"), and the one setup they are made from.  The only
 * place that knows whether this build has CUDA (the one #if); everything
 * else asks here.  The sim is made by the planner's side
 * (planner/sim.h): it prices a plan rather than running it.
 */
#pragma once

#include "executor/backends/swap.h"
#include "executor/comm/comm.h"
#include "executor/data.h"
#include "program/backend.h"

G_BEGIN_DECLS

typedef struct
{
  const StowProgram *program; /* borrowed: must outlive the backend */
  const StowModel *model;     /* the model the program was lowered for */
  /* The device tier's capacity (cuda: cudaMalloc'd at once, so it must
   * fit the card's free memory). */
  guint64 device_capacity_bytes;
  guint n_threads; /* cpu: compute and Adam threads; 0: one per core */
  /* The micro-batches the data ops read (borrowed); the cpu backend reads
   * them on the compute stream's worker, the cuda backend on the host
   * when the op is issued. */
  StowBatches *data;
  /* The batches evaluation runs read (borrowed), or NULL. */
  StowBatches *eval_data;
  /* ZeRO-Offload's one-step delayed parameter update (the program lowered
   * with it): step s's host optimizer applies step s - 1's gradients,
   * kept aside when step s begins, while step s computes. */
  gboolean delayed_update;
  /* cpu: where the optimizer states and weights go when the program keeps
   * them on NVMe. */
  StowSwapSetup swap;
  /* cpu: leave the program's pinned host buffers pageable (train's
   * --allow-unpinned, where RLIMIT_MEMLOCK is too low to lock them). */
  gboolean no_pin;
  /* cpu, tests: every copy sleeps this long first (0: none), so that
   * tests of overlap on a small machine can see it. */
  guint copy_delay_us;
  /* cpu: the data-parallel ranks a program with dp > 1 runs over
   * (borrowed; its world size is the program's dp), or NULL. */
  StowComm *comm;
} StowBackendSetup;

typedef struct
{
  const char *name;
  /* Whether this machine can run it; the reason if not. */
  gboolean (*available) (GError **error);
  /* Optional: the device's name and its free and total memory.  NULL: the
   * device is a region of host RAM. */
  gboolean (*device_info) (char **name, guint64 *free_bytes,
                           guint64 *total_bytes, GError **error);
  /* Checks that every buffer of @setup->program holds what the backend
   * keeps in it (STOW_BACKEND_ERROR_INVALID naming the buffer and both
   * sizes) and makes the backend; _UNSUPPORTED for what it cannot run. */
  StowBackend *(*create) (const StowBackendSetup *setup, GError **error);
} StowBackendKind;

/* The backend called @name.  STOW_BACKEND_ERROR_UNSUPPORTED when there is
 * none ("NAME: the backends are cpu and cuda"), or when this build lacks
 * it ("cuda: this build has no CUDA ..."). */
const StowBackendKind *stow_backend_kind_find (const char *name,
                                               GError **error);
/* Whether this build has the backend called @name. */
gboolean stow_backend_kind_built (const char *name);

G_END_DECLS
