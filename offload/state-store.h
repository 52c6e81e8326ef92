/* SPDX-License-Identifier: MIT
 *
 * offload/state-store.h: optimizer states on NVMe, cut into shards (the
 * lowering's chunks), each shard one tensor of an NVMe store, moved through
 * a ring of pinned buffers registered with it.  A step program takes ring
 * buffers and reads and writes shards as its ops say; outside a step the
 * states are read and written by byte range through one cached shard, so
 * no full copy of them is ever in RAM.  No knowledge of programs or tensors:
 * shard indices, byte ranges and buffers only.
 */
#pragma once

#include <glib.h>

#include "offload/nvme.h"
#include "offload/pinned.h"

G_BEGIN_DECLS

typedef struct
{
  const guint64 *shard_sizes; /* (n_shards) bytes of each shard, all > 0 */
  guint n_shards;
  StowNvmeStore *store;    /* where shards live (borrowed, outlives us) */
  const char *name_prefix; /* the shards' tensors are "PREFIX N" */
  gboolean zero_fill;      /* write every shard as zeros now */
} StowStateStoreOptions;

typedef struct _StowStateStore StowStateStore;

/* Declares one tensor per shard in @opts->store and reserves the space
 * (the preflight: STOW_IO_ERROR_NO_SPACE names the directory, the bytes
 * needed and free); then a ring of min (3, shards) buffers of the largest
 * shard, page-rounded, from a pinned pool of its own (no NUMA binding, no
 * CUDA), registered with the store before it is locked.  Errors: the
 * store's. */
StowStateStore *stow_state_store_new (const StowStateStoreOptions *opts,
                                      GError **error);
void stow_state_store_free (StowStateStore *ss);

guint stow_state_store_get_n_shards (StowStateStore *ss);
guint64 stow_state_store_get_shard_bytes (StowStateStore *ss, guint shard);
/* The ring: how many buffers, the bytes of each, the pool they are from
 * (for descriptions). */
guint stow_state_store_get_n_buffers (StowStateStore *ss);
guint64 stow_state_store_get_buffer_bytes (StowStateStore *ss);
StowPinnedPool *stow_state_store_get_pool (StowStateStore *ss);

/* A free ring buffer, or NULL when all are taken.  Thread-safe. */
void *stow_state_store_take_buffer (StowStateStore *ss);
void stow_state_store_give_buffer (StowStateStore *ss, void *buf);

/* Shard @shard, whole, between the store and @buf (4 KiB-aligned, holding
 * the shard: a ring buffer); errors name the file and offset
 * (offload/nvme.h).  Thread-safe for different buffers. */
gboolean stow_state_store_read (StowStateStore *ss, guint shard, void *buf,
                                GError **error);
gboolean stow_state_store_write (StowStateStore *ss, guint shard,
                                 const void *buf, GError **error);

/* Outside a step: @bytes at @offset of shard @shard, read into or written
 * from @data through one cached shard held in the first ring buffer. */
gboolean stow_state_store_access (StowStateStore *ss, gboolean write,
                                  guint shard, guint64 offset, guint64 bytes,
                                  void *data, GError **error);
/* Writes back the cached shard if it changed and gives its buffer back to
 * the ring.  Call after writing by range and before the next step. */
gboolean stow_state_store_flush (StowStateStore *ss, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowStateStore, stow_state_store_free)

G_END_DECLS
