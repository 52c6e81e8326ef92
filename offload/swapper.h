/* SPDX-License-Identifier: MIT
 *
 * offload/swapper.h: the optimizer-state swapper.  The state is cut into
 * shards; a step runs an update callback (CPU Adam) over every shard.  With
 * the state on NVMe a step is a three-stage pipeline over a fixed ring of
 * pinned buffers: read shard i+1 while the update runs on shard i while
 * shard i-1 is written back (DeepSpeed's pipeline_read/pipeline_write).
 * With the state in host RAM the same interface does no I/O.
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

/* Shards one swapper may cut the state into: each costs a store tensor (or
 * a page-aligned host slot) and its bookkeeping, so 12-byte shards of 1 GiB
 * (89 million of them) would take gigabytes before the first byte moves. */
#define STOW_SWAPPER_MAX_SHARDS 65536u

typedef struct
{
  StowSwapMode mode;
  guint64 total_bytes;  /* the whole optimizer state */
  guint64 shard_bytes;  /* every shard but the last */
  StowPinnedPool *pool; /* buffers (and host-mode shards) come from here */
  StowNvmeStore *store; /* NVMe mode: where shards live (borrowed) */
  guint n_buffers;      /* NVMe mode: pinned shard buffers; 0 = 3, min 3 */
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

/* Declares one tensor per shard in the store ("optim.shard.N") and reserves
 * its space.  Errors: STOW_IO_ERROR_INVALID for bad options (including more
 * than STOW_SWAPPER_MAX_SHARDS shards, checked before allocating), the store's
 * preflight errors, G_FILE_ERROR_NOMEM. */
StowSwapper *stow_swapper_new (const StowSwapperOptions *opts, GError **error);
void stow_swapper_free (StowSwapper *sw);

guint stow_swapper_get_n_shards (StowSwapper *sw);
guint64 stow_swapper_get_shard_bytes (StowSwapper *sw, guint shard);

/* Sets or reads back one shard's bytes (initialisation, checkpoints). */
gboolean stow_swapper_store_shard (StowSwapper *sw, guint shard,
                                   const void *src, GError **error);
gboolean stow_swapper_load_shard (StowSwapper *sw, guint shard, void *dst,
                                  GError **error);

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

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowSwapper, stow_swapper_free)

G_END_DECLS
