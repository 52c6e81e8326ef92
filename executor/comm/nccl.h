/* SPDX-License-Identifier: MIT
 *
 * executor/comm/nccl.h: comm.h over NCCL, the cuda backend's transport.
 * Device buffers.  libnccl.so.2 is loaded at run time (never linked), so
 * every binary starts where it is missing; built with the CUDA toolkit
 * only.  Not here: handing the unique id to the ranks (MPI or a TCP
 * rendezvous does, launch.h).
 */
#pragma once

#include "executor/comm/comm.h"

G_BEGIN_DECLS

#define STOW_COMM_NCCL_ID_BYTES 128 /* ncclUniqueId */

/* Loads libnccl.so.2 (once); FALSE with STOW_COMM_ERROR_UNAVAILABLE and
 * the loader's reasons when it cannot.  @version: NCCL_VERSION_CODE of the
 * library loaded (22803 for 2.28.3), or NULL. */
gboolean stow_comm_nccl_load (int *version, GError **error);

/* Rank 0's id for stow_comm_nccl_new, to be handed to every rank. */
gboolean stow_comm_nccl_unique_id (guint8 id[STOW_COMM_NCCL_ID_BYTES],
                                   GError **error);

/* Rank @rank of @world on CUDA device @device, joining the ranks that
 * were given the same @id (ncclCommInitRank: blocks until all have
 * joined).  Collectives are queued on @stream (a cudaStream_t; NULL: a
 * stream of its own), so that cudaStreamWaitEvent on it orders them after
 * the program's events, and a request's wait is the host waiting for an
 * event recorded after it.  Mode DETERMINISTIC.  NULL with
 * STOW_COMM_ERROR_UNAVAILABLE without NCCL or the device, _INVALID for a
 * rank out of range, _FAILED when NCCL fails. */
StowComm *stow_comm_nccl_new (int rank, int world,
                              const guint8 id[STOW_COMM_NCCL_ID_BYTES],
                              int device, void *stream, GError **error);

G_END_DECLS
