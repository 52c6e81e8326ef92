/* SPDX-License-Identifier: MIT
 *
 * core/zero.h: how ZeRO splits a unit's elements over N data-parallel
 * ranks, and the gradient norm's blocks that split is aligned to, so that
 * N ranks' partial sums of squares are one rank's.  One rule for the
 * lowering (planner/), the optimizer (offload/adam.c), the backends and
 * the collectives (executor/comm/).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The gradient norm's block for a tensor or unit of @numel elements: at
 * least 8192 elements, a multiple of 64, and never more than 4096 blocks.
 * The sum of squares is accumulated per block in double and the blocks
 * are added in order (stow_adam_grad_sumsq). */
#define STOW_NORM_MIN_BLOCK  8192
#define STOW_NORM_MAX_BLOCKS 4096
guint64 stow_norm_block (guint64 numel);

/* ceil(@count / @world) rounded up to a multiple of @align (0 or 1: no
 * rounding); 0 for count 0. */
guint64 stow_partition_numel (guint64 count, guint world, guint64 align);

/* Each rank's share of a unit of @numel elements over @world ranks:
 * flat, padded with zeros at the end, rank r holding elements [r part,
 * (r + 1) part), part aligned to the unit's norm block so that no block
 * straddles two ranks.  @numel for one rank. */
guint64 stow_zero_part (guint64 numel, guint world);

/* The elements of rank @rank's partition that lie inside the unit (the
 * rest is padding), and where they start. */
guint64 stow_zero_valid (guint64 numel, guint world, guint rank,
                         guint64 *first);

G_END_DECLS
