/* SPDX-License-Identifier: MIT
 *
 * executor/comm/nccl.h: comm.h over NCCL, the cuda backend's transport.
 * Device buffers.  libnccl.so.2 is loaded at run time (never linked), so
 * every binary starts where it is missing; built with the CUDA toolkit
 * only.  The unique id reaches the ranks through the TCP rendezvous
 * (rendezvous.h) that stow_comm_nccl_join runs.
 */
#pragma once

#include "executor/comm/comm.h"
#include "executor/comm/launch.h"

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

/* stow_comm_nccl_new for the rank @launch says, the id handed out as
 * its init says: "tcp://HOST:PORT" (torchrun's), through
 * stow_rendezvous_exchange, every rank first loading NCCL and checking
 * @device, rank 0 then calling ncclGetUniqueId, so that a rank lacking
 * either makes every rank fail at once naming it (never a rank left in
 * ncclCommInitRank); "none" (one rank): the id made here.  @timeout_s
 * bounds each wait of the rendezvous (STOW_RENDEZVOUS_DEFAULT_TIMEOUT_S).
 * NULL with the rendezvous's errors (STOW_RENDEZVOUS_ERROR), or
 * stow_comm_nccl_new's, or STOW_COMM_ERROR_INVALID for another init
 * ("mpi": the id then goes over MPI, not here). */
StowComm *stow_comm_nccl_join (const StowLaunch *launch, int device,
                               void *stream, double timeout_s, GError **error);

G_END_DECLS
