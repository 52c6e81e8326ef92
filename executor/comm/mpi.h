/* SPDX-License-Identifier: MIT
 *
 * executor/comm/mpi.h: comm.h over MPI (Open MPI), the cpu backend's
 * transport and every launch's bootstrap.  Host buffers.  Builds without
 * MPI (meson -Dmpi=disabled): then stow_comm_mpi_new says so.
 */
#pragma once

#include "executor/comm/comm.h"

G_BEGIN_DECLS

/* Whether this build has MPI. */
gboolean stow_comm_mpi_available (void);

/* A communicator over MPI_COMM_WORLD: initialises MPI (thread level
 * MPI_THREAD_SERIALIZED: the collectives run on the communicator's own
 * thread) unless the caller did, and finalises it in stow_comm_free when
 * it did.  One per process.  Mode DETERMINISTIC.  NULL with
 * STOW_COMM_ERROR_UNAVAILABLE without MPI or with too low a thread level,
 * STOW_COMM_ERROR_FAILED when MPI_Init_thread fails. */
StowComm *stow_comm_mpi_new (GError **error);

/* Without finalising MPI: ends every rank of the job now (MPI_Abort), for
 * a rank that cannot go on and must not leave the others waiting. */
G_NORETURN void stow_comm_mpi_abort (int code);

G_END_DECLS
