/* SPDX-License-Identifier: MIT
 *
 * executor/backends/param-swap.h: the weights on NVMe (ZeRO-Infinity's
 * parameter offload) for a backend that runs a step program.  Each unit's
 * weights, in the training dtype, are one tensor of an NVMe store
 * (offload/nvme.h: striped over the --nvme-dir directories, O_DIRECT
 * through io_uring, XXH3 per block).  In a step the program's loads read a
 * unit into a pinned staging buffer ("staged") and its updated weights go
 * back through the "parameter write buffer" ("stored"); both are whole
 * units, so no read-modify-write of a block is ever needed.  On several
 * ranks each rank's store holds its partitions of the units (core/zero.h),
 * and "a unit" below means the rank's partition of it.
 *
 * Outside a step (loading, checkpoints, the resident units' first copy)
 * one unit at a time is held in a cached buffer, written back only when
 * its bytes changed.
 */
#pragma once

#include "executor/backends/swap.h"

G_BEGIN_DECLS

typedef struct _StowParamSwap StowParamSwap;

/* A store holding every unit of @map's program under @setup->dirs, its
 * space reserved (the preflight: STOW_IO_ERROR_NO_SPACE names the
 * directory, the bytes needed and free).  @setup's fault, if any, is armed
 * at the first read from it. */
StowParamSwap *stow_param_swap_new (const StowTensorMap *map,
                                    const StowSwapSetup *setup, GError **error);
void stow_param_swap_free (StowParamSwap *ps);

/* "weights on NVMe: 14 units in /a,/b (io_uring, O_DIRECT)" */
char *stow_param_swap_describe (const StowParamSwap *ps);

/* The ops: @unit's weights between the store and @buf (4 KiB-aligned,
 * holding the unit's bytes); errors name the file and offset. */
gboolean stow_param_swap_read (StowParamSwap *ps, guint unit, void *buf,
                               GError **error);
gboolean stow_param_swap_write (StowParamSwap *ps, guint unit, const void *buf,
                                GError **error);

/* Outside a step: @unit's weights, to read or change in place until the
 * next call or stow_param_swap_flush (a unit never stored reads as
 * zeros). */
void *stow_param_swap_unit (StowParamSwap *ps, guint unit, GError **error);
/* Writes the cached unit back if its bytes changed. */
gboolean stow_param_swap_flush (StowParamSwap *ps, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowParamSwap, stow_param_swap_free)

G_END_DECLS
