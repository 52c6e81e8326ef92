/* SPDX-License-Identifier: MIT
 *
 * executor/backend.h: the backend interface the step-program interpreter
 * drives (in the style of ggml's backend vtable): buffers from an arena
 * with a hard capacity per tier, ops that take time, and a clock.  The
 * `sim` backend (executor/backends/sim.c) answers with virtual time from
 * the cluster's numbers and keeps no data; `cpu` and `cuda` will run the
 * ops for real behind the same table.
 */
#pragma once

#include <glib.h>

#include "planner/schedule.h"

G_BEGIN_DECLS

#define STOW_BACKEND_ERROR (stow_backend_error_quark ())
GQuark stow_backend_error_quark (void);

typedef enum
{
  STOW_BACKEND_ERROR_OUT_OF_MEMORY, /* an alloc beyond a tier's capacity */
  STOW_BACKEND_ERROR_DEADLOCK,      /* waits that can never be satisfied */
  STOW_BACKEND_ERROR_NOT_RESIDENT,  /* an op reads a buffer not loaded */
  STOW_BACKEND_ERROR_INVALID,       /* a malformed program */
} StowBackendError;

typedef struct _StowBackend StowBackend;

typedef struct
{
  const char *name;
  /* Seconds @op takes.  A real backend issues it on its stream and
   * returns when it knows; the sim computes it.  Never NULL. */
  double (*op_seconds) (StowBackend *b, const StowProgram *p, const StowOp *op);
  /* Takes @buf's bytes from its tier's arena on @buf->rank; FALSE with
   * STOW_BACKEND_ERROR_OUT_OF_MEMORY beyond the capacity.  NULL: no
   * limit. */
  gboolean (*buffer_alloc) (StowBackend *b, const StowBuffer *buf,
                            GError **error);
  void (*buffer_free) (StowBackend *b, const StowBuffer *buf);
  void (*destroy) (StowBackend *b);
} StowBackendVtable;

struct _StowBackend
{
  const StowBackendVtable *vt;
};

void stow_backend_free (StowBackend *b);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBackend, stow_backend_free)

/* The sim backend: op times from planner/schedule-cost.c for @cluster and
 * @training (both copied or referenced; the caller may drop its own).
 * @capacity_bytes[tier] limits each rank's tier; 0 = unlimited. */
StowBackend *stow_backend_sim_new (const StowCluster *cluster,
                                   const StowTraining *training,
                                   const guint64 *capacity_bytes);

G_END_DECLS
