/* SPDX-License-Identifier: MIT
 *
 * core/zero.c: ZeRO's partitions and the gradient norm's blocks (zero.h).
 */
#include "core/zero.h"

guint64
stow_norm_block (guint64 numel)
{
  guint64 block = (numel + STOW_NORM_MAX_BLOCKS - 1) / STOW_NORM_MAX_BLOCKS;
  block = (block + 63) / 64 * 64;
  return MAX (block, STOW_NORM_MIN_BLOCK);
}

guint64
stow_partition_numel (guint64 count, guint world, guint64 align)
{
  g_return_val_if_fail (world > 0, 0);
  align = MAX (align, 1);
  guint64 part = (count + world - 1) / world;
  return (part + align - 1) / align * align;
}

guint64
stow_zero_part (guint64 numel, guint world)
{
  if (world <= 1)
    return numel;
  return stow_partition_numel (numel, world, stow_norm_block (numel));
}

guint64
stow_zero_valid (guint64 numel, guint world, guint rank, guint64 *first)
{
  guint64 part = stow_zero_part (numel, world);
  guint64 start = (guint64)rank * part;
  if (first)
    *first = start;
  return start >= numel ? 0 : MIN (part, numel - start);
}
