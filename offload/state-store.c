/* SPDX-License-Identifier: MIT
 *
 * offload/state-store.c: optimizer states on NVMe (see state-store.h).
 * The first ring buffer doubles as the cache of one shard outside a step.
 */
#include "config.h"

#include "offload/state-store.h"

#include <string.h>

#define RING 3 /* a step's swap buffers: read i+1, update i, write i-1 */

struct _StowStateStore
{
  guint n_shards;
  guint64 *bytes; /* (n_shards) */
  guint64 max_bytes;
  StowNvmeStore *store;
  guint first_tensor; /* shard i is tensor first_tensor + i */
  StowPinnedPool *pool;
  guint n_buffers;    /* min (RING, shards): a shard needs one at most */
  guint64 buffer_bytes;
  guint8 **bufs;      /* (n_buffers) */
  gboolean *busy;     /* (n_buffers) */
  GMutex lock;
  /* outside a step: one shard read into bufs[0] */
  guint cached; /* G_MAXUINT: none */
  gboolean dirty;
};

StowStateStore *
stow_state_store_new (const StowStateStoreOptions *opts, GError **error)
{
  g_return_val_if_fail (opts != NULL && opts->store != NULL
                            && opts->n_shards > 0 && opts->shard_sizes != NULL
                            && opts->name_prefix != NULL,
                        NULL);
  g_autoptr (StowStateStore) ss = g_new0 (StowStateStore, 1);
  g_mutex_init (&ss->lock);
  ss->cached = G_MAXUINT;
  ss->store = opts->store;
  ss->n_shards = opts->n_shards;
  ss->bytes = g_memdup2 (opts->shard_sizes, sizeof (guint64) * ss->n_shards);
  for (guint i = 0; i < ss->n_shards; i++)
    {
      g_return_val_if_fail (ss->bytes[i] > 0, NULL);
      ss->max_bytes = MAX (ss->max_bytes, ss->bytes[i]);
      g_autofree char *name = g_strdup_printf ("%s%u", opts->name_prefix, i);
      guint id = stow_nvme_store_add_tensor (ss->store, name, ss->bytes[i]);
      if (i == 0)
        ss->first_tensor = id;
    }
  if (!stow_nvme_store_prepare (ss->store, error))
    return NULL;
  /* One slab holds the ring, so a small memlock limit is asked for no more
   * than the ring. */
  ss->buffer_bytes = (ss->max_bytes + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN
                     * STOW_NVME_ALIGN;
  ss->n_buffers = MIN (RING, ss->n_shards);
  StowPinnedOptions po = { .slab_bytes = ss->buffer_bytes * ss->n_buffers,
                           .numa_node = -1,
                           .no_cuda = TRUE,
                           .defer_pin = TRUE };
  ss->pool = stow_pinned_pool_new (&po);
  guint8 *ring = stow_pinned_pool_alloc (
      ss->pool, ss->buffer_bytes * ss->n_buffers, error);
  if (ring == NULL)
    return NULL;
  ss->bufs = g_new0 (guint8 *, ss->n_buffers);
  ss->busy = g_new0 (gboolean, ss->n_buffers);
  /* Each buffer registered on its own, before the pool is locked, so that
   * io_uring faults the pages in (see StowPinnedOptions.defer_pin) and no
   * request straddles two registrations. */
  for (guint b = 0; b < ss->n_buffers; b++)
    {
      ss->bufs[b] = ring + b * ss->buffer_bytes;
      stow_nvme_store_register_buffer (ss->store, ss->bufs[b],
                                       ss->buffer_bytes);
    }
  stow_pinned_pool_pin (ss->pool);
  if (opts->zero_fill)
    {
      /* The moments of a fresh run, and data the store can read back
       * before the first load writes the master. */
      memset (ss->bufs[0], 0, ss->buffer_bytes);
      for (guint i = 0; i < ss->n_shards; i++)
        if (!stow_state_store_write (ss, i, ss->bufs[0], error))
          return NULL;
    }
  return g_steal_pointer (&ss);
}

void
stow_state_store_free (StowStateStore *ss)
{
  if (ss == NULL)
    return;
  if (ss->pool)
    stow_pinned_pool_free (ss->pool);
  g_free (ss->bufs);
  g_free (ss->busy);
  g_free (ss->bytes);
  g_mutex_clear (&ss->lock);
  g_free (ss);
}

guint
stow_state_store_get_n_shards (StowStateStore *ss)
{
  return ss->n_shards;
}

guint64
stow_state_store_get_shard_bytes (StowStateStore *ss, guint shard)
{
  g_return_val_if_fail (shard < ss->n_shards, 0);
  return ss->bytes[shard];
}

guint
stow_state_store_get_n_buffers (StowStateStore *ss)
{
  return ss->n_buffers;
}

guint64
stow_state_store_get_buffer_bytes (StowStateStore *ss)
{
  return ss->buffer_bytes;
}

StowPinnedPool *
stow_state_store_get_pool (StowStateStore *ss)
{
  return ss->pool;
}

/* ---- the ring ------------------------------------------------------------ */

void *
stow_state_store_take_buffer (StowStateStore *ss)
{
  g_mutex_lock (&ss->lock);
  void *got = NULL;
  for (guint i = 0; got == NULL && i < ss->n_buffers; i++)
    if (!ss->busy[i])
      {
        ss->busy[i] = TRUE;
        got = ss->bufs[i];
      }
  g_mutex_unlock (&ss->lock);
  return got;
}

void
stow_state_store_give_buffer (StowStateStore *ss, void *buf)
{
  g_mutex_lock (&ss->lock);
  for (guint i = 0; i < ss->n_buffers; i++)
    if (ss->bufs[i] == buf)
      ss->busy[i] = FALSE;
  g_mutex_unlock (&ss->lock);
}

/* ---- I/O ----------------------------------------------------------------- */

gboolean
stow_state_store_read (StowStateStore *ss, guint shard, void *buf,
                       GError **error)
{
  g_return_val_if_fail (shard < ss->n_shards, FALSE);
  return stow_nvme_store_read (ss->store, ss->first_tensor + shard, buf,
                               error);
}

gboolean
stow_state_store_write (StowStateStore *ss, guint shard, const void *buf,
                        GError **error)
{
  g_return_val_if_fail (shard < ss->n_shards, FALSE);
  return stow_nvme_store_write (ss->store, ss->first_tensor + shard, buf,
                                error);
}

/* ---- outside a step ------------------------------------------------------ */

static gboolean
cache_shard (StowStateStore *ss, guint shard, GError **error)
{
  if (ss->cached == shard)
    return TRUE;
  if (!stow_state_store_flush (ss, error))
    return FALSE;
  if (!stow_state_store_read (ss, shard, ss->bufs[0], error))
    return FALSE;
  ss->cached = shard;
  return TRUE;
}

gboolean
stow_state_store_access (StowStateStore *ss, gboolean write, guint shard,
                         guint64 offset, guint64 bytes, void *data,
                         GError **error)
{
  g_return_val_if_fail (shard < ss->n_shards
                            && offset + bytes <= ss->bytes[shard],
                        FALSE);
  if (!cache_shard (ss, shard, error))
    return FALSE;
  guint8 *s = ss->bufs[0] + offset;
  if (write)
    {
      memcpy (s, data, bytes);
      ss->dirty = TRUE;
    }
  else
    memcpy (data, s, bytes);
  return TRUE;
}

gboolean
stow_state_store_flush (StowStateStore *ss, GError **error)
{
  if (ss->cached == G_MAXUINT)
    return TRUE;
  if (ss->dirty)
    {
      if (!stow_state_store_write (ss, ss->cached, ss->bufs[0], error))
        return FALSE;
      ss->dirty = FALSE;
    }
  ss->cached = G_MAXUINT;
  return TRUE;
}
