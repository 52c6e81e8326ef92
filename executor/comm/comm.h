/* SPDX-License-Identifier: MIT
 *
 * executor/comm/comm.h: the communication interface several ranks train
 * over: all-reduce (sum), reduce-scatter, all-gather, broadcast and barrier
 * on fp32 and bf16 buffers, started asynchronously and waited on, in the
 * order started (a stream), with MPI (mpi.h) and NCCL (nccl.h) behind it.
 * Not here: launching ranks (launch.h) or which buffers a step reduces.
 */
#pragma once

#include <glib.h>

#include "core/dtype.h"

G_BEGIN_DECLS

#define STOW_COMM_ERROR (stow_comm_error_quark ())
GQuark stow_comm_error_quark (void);

typedef enum
{
  STOW_COMM_ERROR_INVALID,     /* a bad argument: dtype, count, root, rank */
  STOW_COMM_ERROR_UNAVAILABLE, /* MPI or NCCL missing here */
  STOW_COMM_ERROR_FAILED,      /* the transport reported an error */
} StowCommErrorCode;

/* How reductions add the ranks' contributions.
 *
 * DETERMINISTIC: every element is summed by its owner in rank order,
 * ((c0 + c1) + c2) + ... + c(N-1), each addition rounded to the buffer's
 * dtype (bf16: round to nearest even after each addition, as one rank
 * adding the N contributions into a bf16 accumulator would).  The result's
 * bytes are those of one rank adding the same contributions in that order,
 * for any N, and are the same on every rank.
 *
 * NATIVE: the transport's own reduction (MPI_Allreduce,
 * MPI_Reduce_scatter_block, ncclAllReduce, ncclReduceScatter): faster on
 * many ranks, its order of summation is the library's (ring, tree), so the
 * result moves in the last bits from N = 3 on. */
typedef enum
{
  STOW_COMM_DETERMINISTIC = 0,
  STOW_COMM_NATIVE,
} StowCommMode;

typedef struct _StowComm StowComm;
typedef struct _StowCommRequest StowCommRequest;

/* Partitions are flat and padded to the world size as DeepSpeed's ZeRO-3
 * pads a parameter (stage3's _padding_size): a buffer of @count elements is
 * padded with zeros to part * N elements, part = ceil(count / N), and rank r
 * owns elements [r * part, (r + 1) * part) of the padded buffer.  With
 * @align > 1, part is rounded up to a multiple of @align: DeepSpeed's ZeRO
 * 1 and 2 align each rank's start to nccl_start_alignment_factor = 2
 * elements (flatten_dense_tensors_aligned to 2 * N).  The collectives below
 * use align = 1.  Returns 0 for count 0. */
guint64 stow_comm_partition_numel (guint64 count, int world, guint align);

int stow_comm_rank (const StowComm *c);
int stow_comm_world_size (const StowComm *c);
/* "mpi" or "nccl". */
const char *stow_comm_backend_name (const StowComm *c);
StowCommMode stow_comm_mode (const StowComm *c);
/* Applies to the reductions started afterwards. */
void stow_comm_set_mode (StowComm *c, StowCommMode mode);

/* Starting.  Each function queues one collective and returns its request
 * at once; every rank must start the same collectives in the same order,
 * with the same count, dtype and root.  The buffers belong to the
 * collective until stow_comm_wait returns: neither read nor written by
 * the caller meanwhile.  Buffers are host memory for "mpi" and device
 * memory for "nccl".  Collectives run one after another in the order
 * started (one comm stream per communicator).  Returns NULL and sets
 * STOW_COMM_ERROR_INVALID for a dtype other than F32 or BF16, a root out
 * of range or a count over the transport's limit; nothing is queued then.
 * @dtype is F32 or BF16 everywhere below. */

/* In place: @buf (@count elements) becomes the sum over ranks, on every
 * rank.  DETERMINISTIC: the reduce-scatter below, then an all-gather. */
StowCommRequest *stow_comm_all_reduce (StowComm *c, void *buf, guint64 count,
                                       StowDtype dtype, GError **error);
/* @send holds @count elements; @recv (part = stow_comm_partition_numel
 * (count, N, 1) elements) receives this rank's partition of the sum; the
 * padding past @count (on the last ranks) is written as zeros.  @send and
 * @recv must not overlap. */
StowCommRequest *stow_comm_reduce_scatter (StowComm *c, const void *send,
                                           void *recv, guint64 count,
                                           StowDtype dtype, GError **error);
/* ZeRO's form (core/zero.h): partitions of part = stow_comm_partition_numel
 * (count, N, @align) elements, and with @accumulate the sum is added to
 * what @recv holds: DETERMINISTIC, ((recv + c0) + c1) + ..., in rank
 * order, which is how one rank adds N micro-batches' gradients to its
 * accumulated ones (executor/backends/tensors.h's acc_scratch); NATIVE,
 * recv + (the transport's sum), so that from 2 ranks on the result is
 * not the rank order's. */
StowCommRequest *stow_comm_reduce_scatter_ex (StowComm *c, const void *send,
                                              void *recv, guint64 count,
                                              guint64 align,
                                              gboolean accumulate,
                                              StowDtype dtype, GError **error);
/* The partitions to their owners, unsummed: rank q's partition q of
 * @send (@count elements, partitions as stow_comm_reduce_scatter_ex's)
 * arrives in @recv (N x part elements) at q x part, so that the owner can
 * add them in an order of its own (two gradients per rank, say).  No
 * arithmetic; mpi only. */
StowCommRequest *stow_comm_all_to_all_ex (StowComm *c, const void *send,
                                          void *recv, guint64 count,
                                          guint64 align, StowDtype dtype,
                                          GError **error);
/* stow_comm_all_gather with partitions of stow_comm_partition_numel (count,
 * N, @align) elements. */
StowCommRequest *stow_comm_all_gather_ex (StowComm *c, const void *send,
                                          void *recv, guint64 count,
                                          guint64 align, StowDtype dtype,
                                          GError **error);
/* The inverse: @send holds this rank's part elements (its partition of a
 * @count-element buffer, padded as above); @recv (@count elements) receives
 * every rank's partition, the padding dropped.  No arithmetic. */
StowCommRequest *stow_comm_all_gather (StowComm *c, const void *send,
                                       void *recv, guint64 count,
                                       StowDtype dtype, GError **error);
/* In place: @buf on every rank becomes @root's @buf. */
StowCommRequest *stow_comm_broadcast (StowComm *c, void *buf, guint64 count,
                                      StowDtype dtype, int root,
                                      GError **error);
/* Completes once every rank has started its barrier. */
StowCommRequest *stow_comm_barrier (StowComm *c, GError **error);

/* Blocks until @r has completed and frees it (every request is waited on
 * exactly once).  FALSE with STOW_COMM_ERROR_FAILED and the transport's
 * message when the collective failed.  A peer that died does not make this
 * hang under mpirun: Open MPI ends the whole job (tests/comm-mpi-rank.c). */
gboolean stow_comm_wait (StowComm *c, StowCommRequest *r, GError **error);
/* stow_comm_wait over @n requests, in order; all are freed, the first
 * error is kept. */
gboolean stow_comm_wait_all (StowComm *c, StowCommRequest **r, guint n,
                             GError **error);

/* Waits for the queued collectives and releases the transport. */
void stow_comm_free (StowComm *c);

/* A grow-only working buffer of a transport's or a backend's collectives,
 * kept between operations: a multi-megabyte malloc per collective comes
 * from a fresh mmap whose every page faults in again (24,000 faults a
 * step on each of 2 ranks of a 110M model).  One thread's at a time. */
typedef struct
{
  guint8 *p;
  gsize bytes;
} StowScratch;

/* @s's buffer of at least @bytes (what it held is lost when it grows). */
guint8 *stow_scratch_get (StowScratch *s, gsize bytes);
void stow_scratch_clear (StowScratch *s);

/* A padded partition: @valid bytes of @src, then zeros up to @bytes; each
 * byte written once.  Returns @dst. */
guint8 *stow_comm_pad_copy (guint8 *dst, const void *src, gsize valid,
                            gsize bytes);

/* acc[i] += c[i] for @n bf16 elements, each sum rounded to bf16 (the
 * one element rule of the rank-order sum and of MPI's native bf16 sum). */
void stow_comm_add_bf16 (guint16 *acc, const guint16 *c, guint64 n);

/* The deterministic sum of @n contributions of @count elements each,
 * contributions[0] first: out = ((c0 + c1) + c2) + ...  (@out may be
 * contributions[0]).  What the owner of a partition computes; exposed as
 * the serial reference the tests compare against. */
void stow_comm_sum_rank_order (void *out, const void *const *contributions,
                               guint n, guint64 count, StowDtype dtype);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowComm, stow_comm_free)

G_END_DECLS
