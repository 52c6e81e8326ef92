/* SPDX-License-Identifier: MIT
 *
 * executor/comm/nccl-private.h: the one kernel the NCCL transport needs
 * (nccl-sum.cu), shared by nccl.c and nccl-sum.cu.
 */
#pragma once

#include <cuda_runtime_api.h>
#include <glib.h>

G_BEGIN_DECLS

/* out[i] = ((c0[i] + c1[i]) + ...) + c(n-1)[i] for i < @part, each
 * addition rounded to fp32 or (@bf16) to bf16, nearest even, as
 * stow_comm_sum_rank_order on the host; contribution q is @own for q ==
 * @me, else @in + q * part.  Queued on @stream.  Returns the launch's
 * cudaError_t. */
int stow_comm_nccl_sum_rank_order (void *out, const void *own, const void *in,
                                   int n, int me, guint64 part, gboolean bf16,
                                   cudaStream_t stream);

G_END_DECLS
