/* SPDX-License-Identifier: MIT
 *
 * program/driver.h: the step-program interpreter: a program run on a
 * backend (program/backend.h) gives the trace of what ran
 * (program/trace.h).  Not here: what an op does (the backend's).
 */
#pragma once

#include "program/backend.h"
#include "program/trace.h"

G_BEGIN_DECLS

/* Runs @p on @backend: each (rank, stream) a queue in
 * program order; an op is issued once every event it waits on has been
 * issued (recorded, for virtual time), so a real backend never blocks the
 * driver.  Fails with STOW_BACKEND_ERROR_DEADLOCK (the stuck ops and the
 * event each waits on); under virtual time also _NOT_RESIDENT (an op reads
 * a buffer that is not allocated or not yet loaded, or a slot taken twice,
 * or a buffer freed under a running op); _OUT_OF_MEMORY and the others
 * from the backend; every message names the op. */
StowTrace *stow_program_run (const StowProgram *p, StowBackend *backend,
                             GError **error);

/* Runs @p's forward alone, for evaluation: after the backend's begin_eval,
 * only the ops stow_op_in_eval keeps are issued (their events recorded as
 * ever, the others' recorded where they stand), so the weights, the
 * gradients and the optimizer are left as they were.  A backend without
 * begin_eval, or one of virtual time, is STOW_BACKEND_ERROR_UNSUPPORTED. */
StowTrace *stow_program_run_eval (const StowProgram *p, StowBackend *backend,
                                  GError **error);

G_END_DECLS
