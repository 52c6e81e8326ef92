/* SPDX-License-Identifier: MIT
 *
 * offload/swapper.h: the optimizer-state swapper.  The state is cut into
 * shards (the lowering's chunks); on NVMe each shard is one tensor of an
 * NVMe store, moved through a ring of pinned buffers registered with it.
 * Two drivers share it: a step program takes ring buffers and reads,
 * updates and writes shards as its ops say (executor/backends/swap.c), and
 * stow_swapper_step runs the same three-stage pipeline itself (read shard
 * i+1 while the update runs on shard i while shard i-1 is written back:
 * DeepSpeed's pipeline_read/pipeline_write) for `stowage bench swapper`.
 * With the state in host RAM the step does no I/O.  Outside a step shards
 * are read and written whole or by byte range through one cached shard.
 */
#pragma once

#include <glib.h>

#include "offload/nvme.h"
#include "offload/pinned.h"

G_BEGIN_DECLS

/* Updates one shard in place.  @state_buf is page-aligned. */
typedef void (*StowSwapUpdateFunc) (void *state_buf, gsize bytes, guint shard,
                                    gpointer user_data);

typedef enum
{
  STOW_SWAP_HOST, /* shards live in pinned host memory */
  STOW_SWAP_NVME, /* shards live in an NVMe store */
} StowSwapMode;

/* Shards an even cut (total_bytes / shard_bytes) may give: each costs a
 * store tensor (or a page-aligned host slot) and its bookkeeping, so
 * 12-byte shards of 1 GiB (89 million of them) would take gigabytes before
 * the first byte moves.  A cut given shard by shard is the caller's. */
#define STOW_SWAPPER_MAX_SHARDS 65536u

typedef struct
{
  StowSwapMode mode;
  /* The cut: @n_shards shards of @shard_sizes[i] bytes (the lowering's
   * chunks), or, with @shard_sizes NULL, @total_bytes in shards of
   * @shard_bytes, the last one short. */
  const guint64 *shard_sizes;
  guint n_shards;
  guint64 total_bytes;
  guint64 shard_bytes;
  /* Buffers (and host-mode shards) come from here; NULL: a pool of the
   * swapper's own, exactly their size, no NUMA binding, no CUDA. */
  StowPinnedPool *pool;
  StowNvmeStore *store;    /* NVMe mode: where shards live (borrowed) */
  const char *name_prefix; /* NVMe: tensors "PREFIX N"; NULL "optim.shard." */
  /* NVMe: ring buffers, at least min (3, shards) (0 = that): one each for
   * read i+1, update i, write i-1. */
  guint n_buffers;
  gboolean zero_fill; /* every shard starts as zeros (NVMe: written now) */
} StowSwapperOptions;

typedef struct
{
  double step_s;   /* wall time of the whole step */
  double read_s;   /* stow_swapper_step_serial: time in each stage; */
  double update_s; /* stow_swapper_step: time the step waited on reads, */
  double write_s;  /* ran updates, waited on writes */
  guint64 bytes_read;
  guint64 bytes_written;
} StowSwapStats;

typedef struct _StowSwapper StowSwapper;

/* Declares one tensor per shard in the store and reserves its space, then
 * the ring of buffers, each of the largest shard page-rounded, registered
 * with the store before the pool is locked.  Errors: STOW_IO_ERROR_INVALID
 * for bad options (including an even cut of more than
 * STOW_SWAPPER_MAX_SHARDS shards, checked before allocating), the store's
 * preflight errors (STOW_IO_ERROR_NO_SPACE names the directory, the bytes
 * needed and free), G_FILE_ERROR_NOMEM, and with @zero_fill the store's
 * write errors. */
StowSwapper *stow_swapper_new (const StowSwapperOptions *opts, GError **error);
void stow_swapper_free (StowSwapper *sw);

guint stow_swapper_get_n_shards (StowSwapper *sw);
guint64 stow_swapper_get_shard_bytes (StowSwapper *sw, guint shard);
/* The ring (NVMe mode): how many buffers, the bytes of each, and the pool
 * they are from (for descriptions). */
guint stow_swapper_get_n_buffers (StowSwapper *sw);
guint64 stow_swapper_get_buffer_bytes (StowSwapper *sw);
StowPinnedPool *stow_swapper_get_pool (StowSwapper *sw);

/* ---- a step driven by a program (NVMe mode) ---- */

/* A free ring buffer, or NULL when all are taken.  Thread-safe. */
void *stow_swapper_take_buffer (StowSwapper *sw);
void stow_swapper_give_buffer (StowSwapper *sw, void *buf);
/* Shard @shard, whole, between the store and @buf (4 KiB-aligned, holding
 * the shard: a ring buffer); errors name the file and offset
 * (offload/nvme.h).  Thread-safe for different buffers. */
gboolean stow_swapper_read (StowSwapper *sw, guint shard, void *buf,
                            GError **error);
gboolean stow_swapper_write (StowSwapper *sw, guint shard, const void *buf,
                             GError **error);

/* ---- a step driven by the swapper ---- */

/* One optimizer step over all shards, pipelined.  On an I/O error waits for
 * everything in flight, then fails with the store's error; shards written
 * before the failure stay valid. */
gboolean stow_swapper_step (StowSwapper *sw, StowSwapUpdateFunc update,
                            gpointer user_data, StowSwapStats *stats,
                            GError **error);
/* The same step with no overlap (read, update, write, shard after shard):
 * the time of each stage alone, and the oracle for the pipeline. */
gboolean stow_swapper_step_serial (StowSwapper *sw, StowSwapUpdateFunc update,
                                   gpointer user_data, StowSwapStats *stats,
                                   GError **error);

/* ---- outside a step ---- */

/* Sets or reads back one shard's bytes (initialisation, checkpoints). */
gboolean stow_swapper_store_shard (StowSwapper *sw, guint shard,
                                   const void *src, GError **error);
gboolean stow_swapper_load_shard (StowSwapper *sw, guint shard, void *dst,
                                  GError **error);
/* @bytes at @offset of shard @shard, read into or written from @data; on
 * NVMe through one cached shard held in the first ring buffer. */
gboolean stow_swapper_access (StowSwapper *sw, gboolean write, guint shard,
                              guint64 offset, guint64 bytes, void *data,
                              GError **error);
/* Writes back the cached shard if it changed and gives its buffer back to
 * the ring.  Call after writing by range and before a program's step (the
 * swapper's own steps call it). */
gboolean stow_swapper_flush (StowSwapper *sw, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowSwapper, stow_swapper_free)

G_END_DECLS
