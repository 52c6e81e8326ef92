/* SPDX-License-Identifier: MIT
 *
 * executor/backends/decoder-ops.h: the one runner from a step program's
 * compute op (forward, recompute, loss, backward) to the decoder recipe
 * (executor/llama.h), for every backend that holds real tensors: the op's
 * buffers are found in the tensor map, the kernels are the backend's
 * decoder's.  Not here: copies, the optimizer, the data (each backend's).
 */
#pragma once

#include "executor/backends/tensors.h"
#include "executor/llama.h"

G_BEGIN_DECLS

/* Runs op @op of @map's program on @decoder, over the addresses in
 * @map->addr.  A loss op adds its tokens' losses (unscaled) to *@loss_sum,
 * a double in the decoder's memory, and its gradients are those of
 * @loss_scale times that sum (the step's: stow_batches_loss_scale).
 * Returns FALSE, touching nothing, for an op of another kind. */
gboolean stow_decoder_run_op (const StowDecoder *decoder,
                              const StowTensorMap *map, const StowOp *op,
                              double loss_scale, double *loss_sum);

/* Loss op @op for evaluation: its tokens' losses (unscaled) added to
 * *@loss_sum as stow_decoder_run_op adds them, and no gradient written
 * (stow_decoder_head_eval_loss). */
void stow_decoder_run_eval_loss (const StowDecoder *decoder,
                                 const StowTensorMap *map, const StowOp *op,
                                 double *loss_sum);

G_END_DECLS
