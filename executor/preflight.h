/* SPDX-License-Identifier: MIT
 *
 * executor/preflight.h: what `stowage train` checks before anything is
 * loaded, from the simulated step (its host buffers at their peak), so
 * that a run the host cannot hold is refused with the figures rather
 * than found by the OOM killer or a failed mlock half way through.  The
 * NVMe directories are checked when a store reserves their space
 * (offload/nvme.h).
 */
#pragma once

#include "program/program.h"
#include "program/trace.h"

G_BEGIN_DECLS

#define STOW_PREFLIGHT_ERROR (stow_preflight_error_quark ())
GQuark stow_preflight_error_quark (void);

typedef enum
{
  STOW_PREFLIGHT_ERROR_HOST_MEMORY, /* the host cannot hold the buffers */
  STOW_PREFLIGHT_ERROR_MEMLOCK,     /* RLIMIT_MEMLOCK cannot cover them */
} StowPreflightError;

/* The simulated step's host memory at its peak (pinned and pageable
 * buffers; with the cpu backend, !@cuda, its device arena too) against
 * MemAvailable: STOW_PREFLIGHT_ERROR_HOST_MEMORY with the figures when
 * it does not fit. */
gboolean stow_preflight_host (const StowTrace *trace, gboolean cuda,
                              GError **error);

/* The cpu backend locks @program's pinned buffers: RLIMIT_MEMLOCK (or
 * @test_limit, soft and hard, with no CAP_IPC_LOCK, when not 0) must
 * cover the simulated pinned peak plus a page per buffer.  The soft limit
 * is raised to the hard one when that is enough; otherwise refused
 * (STOW_PREFLIGHT_ERROR_MEMLOCK) with the figures and the ways to raise
 * it, or, with @allow_unpinned, passed
 * with *@pageable set to a note saying so (NULL when locked). */
gboolean stow_preflight_memlock (const StowProgram *program,
                                 const StowTrace *trace, guint64 test_limit,
                                 gboolean allow_unpinned, char **pageable,
                                 GError **error);

G_END_DECLS
