/* SPDX-License-Identifier: MIT
 *
 * executor/backends/swap.h: the optimizer states on NVMe (ZeRO-Infinity)
 * for a backend that runs a step program: the glue between the program and
 * the optimizer-state swapper (offload/swapper.h).  The lowering cuts the
 * rank's flat parameters into chunks (planner/lower.c: "states read",
 * "updated", "states written"); each chunk's states are one shard of the
 * swapper (in an NVMe store, offload/nvme.h: striped over the directories
 * given, O_DIRECT through io_uring, XXH3 per block), laid out as the
 * chunk's master weights (with 16-bit training), then m, then v, fp32.
 * The program's three "swap buffer" allocations take the swapper's ring of
 * pinned buffers; the stream workers read, update and write chunks as the
 * program's ops say, so the swapper's pipeline (read i+1, Adam on i, write
 * i-1) is the program's.  Here: finding the chunks in the program, their
 * Adam over the map's tensors, a test's fault, and the messages.
 *
 * Outside a step (loading, checkpoints) the states are read and written by
 * range through one cached chunk, so no full copy of them is ever in RAM.
 */
#pragma once

#include "executor/backends/tensors.h"
#include "offload/nvme.h"

G_BEGIN_DECLS

typedef struct
{
  const char *const *dirs; /* NULL-terminated: the --nvme-dir directories */
  /* Tests only: the nth I/O request from the first step on fails so. */
  StowNvmeFault fault;
  guint64 fault_nth;
} StowSwapSetup;

/* The NVMe store of @setup's directories, XXH3 per block (both swaps'
 * stores are one of these); STOW_BACKEND_ERROR_INVALID naming @flag when
 * no directory was given. */
StowNvmeStore *stow_swap_store_new (const StowSwapSetup *setup,
                                    const char *flag, GError **error);

typedef struct _StowStateSwap StowStateSwap;

/* The chunks of @map's program (its host optimizer steps over chunks), a
 * store for them under @setup->dirs with the space reserved (the
 * preflight: STOW_IO_ERROR_NO_SPACE names the directory, the bytes needed
 * and free) and the ring of swap buffers.  Every chunk starts as zeros. */
StowStateSwap *stow_state_swap_new (const StowTensorMap *map,
                                    const StowSwapSetup *setup, GError **error);
void stow_state_swap_free (StowStateSwap *sw);

/* "swap files: 2 in /a,/b (io_uring, O_DIRECT), 3 buffers of 1.2 MiB" */
char *stow_state_swap_describe (const StowStateSwap *sw);

/* Bytes of one ring buffer (the largest chunk, page-rounded). */
guint64 stow_state_swap_buffer_bytes (const StowStateSwap *sw);
/* A ring buffer for a "swap buffer" allocation of @bytes, or NULL with
 * STOW_BACKEND_ERROR_INVALID when the program holds more than the ring. */
void *stow_state_swap_take (StowStateSwap *sw, guint64 bytes, GError **error);
void stow_state_swap_give (StowStateSwap *sw, void *buf);

/* The ops: chunk @chunk between the store and @buf (a ring buffer);
 * errors name the file and offset (offload/nvme.h). */
gboolean stow_state_swap_read (StowStateSwap *sw, guint chunk, void *buf,
                               guint64 bytes, GError **error);
gboolean stow_state_swap_write (StowStateSwap *sw, guint chunk, const void *buf,
                                guint64 bytes, GError **error);
/* AdamW on the chunk of parameters [@first, @first + @count) whose states
 * are in @buf: tensor by tensor, the gradients and the weights from the
 * map's host copies, the same stow_adam_step calls (element for element)
 * as the whole-tensor update. */
gboolean stow_state_swap_update (StowStateSwap *sw, StowAdam *adam,
                                 const StowAdamStep *step, double lr,
                                 guint64 first, guint64 count, void *buf,
                                 GError **error);

/* Outside a step: floats [@first, @first + @n) of state @which (0 master,
 * 1 m, 2 v) of @unit, read into or written from @data. */
gboolean stow_state_swap_access (StowStateSwap *sw, gboolean write, guint unit,
                                 guint which, guint64 first, guint64 n,
                                 float *data, GError **error);
/* Writes back the cached chunk if it changed.  Call after writing states
 * and before the next step. */
gboolean stow_state_swap_flush (StowStateSwap *sw, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowStateSwap, stow_state_swap_free)

G_END_DECLS
