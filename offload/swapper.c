/* SPDX-License-Identifier: MIT
 *
 * offload/swapper.c: the optimizer-state swapper (see swapper.h).  In the
 * swapper's own step shard i uses buffer i mod N; before shard i+1 is read
 * into its buffer the write of shard i+1-N, which last used it, must be
 * done.  With N = 3 that leaves read i+1 and write i-1 in flight while the
 * update runs on shard i.  Outside a step the first ring buffer doubles as
 * the cache of one shard.
 */
#include "config.h"

#include "offload/swapper.h"

#include <errno.h>
#include <string.h>

#define RING 3 /* a step's buffers: read i+1, update i, write i-1 */

struct _StowSwapper
{
  StowSwapMode mode;
  guint n_shards;
  guint64 *bytes; /* (n_shards) */
  guint64 stride; /* the largest shard, page-rounded: a buffer, a host slot */
  StowPinnedPool *pool;     /* buffers and host slots are from here */
  StowPinnedPool *own_pool; /* NULL when the caller gave one */
  /* NVMe mode */
  StowNvmeStore *store;
  guint first_tensor; /* shard i is tensor first_tensor + i */
  guint n_buffers;
  guint8 **bufs;  /* (n_buffers) the ring */
  gboolean *busy; /* (n_buffers) taken by a program's step */
  GMutex lock;
  guint cached; /* outside a step: the shard in bufs[0]; G_MAXUINT none */
  gboolean dirty;
  /* host mode: the whole state, shard i at i * stride */
  guint8 *host;
};

/* The cut into shards, @opts's list or its even cut. */
static guint64 *
cut_shards (const StowSwapperOptions *opts, guint *n_out, GError **error)
{
  if (opts->shard_sizes != NULL)
    {
      for (guint i = 0; i < opts->n_shards; i++)
        if (opts->shard_sizes[i] == 0)
          {
            g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                         "swapper: shard %u holds no bytes", i);
            return NULL;
          }
      if (opts->n_shards == 0)
        {
          g_set_error_literal (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                               "swapper: no shards");
          return NULL;
        }
      *n_out = opts->n_shards;
      return g_memdup2 (opts->shard_sizes, sizeof (guint64) * opts->n_shards);
    }
  guint64 total = opts->total_bytes, shard = opts->shard_bytes;
  guint64 n = total / shard + (total % shard != 0);
  if (n > STOW_SWAPPER_MAX_SHARDS)
    {
      guint64 least = total / STOW_SWAPPER_MAX_SHARDS
                      + (total % STOW_SWAPPER_MAX_SHARDS != 0);
      g_set_error (
          error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
          "swapper: %" G_GUINT64_FORMAT " bytes in shards of %" G_GUINT64_FORMAT
          " bytes is %" G_GUINT64_FORMAT
          " shards, over the limit of %u (shards of at least %" G_GUINT64_FORMAT
          " bytes)",
          total, shard, n, STOW_SWAPPER_MAX_SHARDS, least);
      return NULL;
    }
  guint64 *bytes = g_new (guint64, n);
  for (guint64 i = 0; i < n; i++)
    bytes[i] = MIN (shard, total - i * shard);
  *n_out = (guint)n;
  return bytes;
}

/* @bytes from the caller's pool, or from a pool of our own of exactly that
 * size; one slab, so a small memlock limit is asked for no more. */
static guint8 *
pool_alloc (StowSwapper *sw, StowPinnedPool *given, guint64 bytes,
            gboolean defer_pin, GError **error)
{
  sw->pool = given;
  if (given == NULL)
    {
      StowPinnedOptions po = { .slab_bytes = bytes,
                               .numa_node = -1,
                               .no_cuda = TRUE,
                               .defer_pin = defer_pin };
      sw->pool = sw->own_pool = stow_pinned_pool_new (&po);
    }
  return stow_pinned_pool_alloc (sw->pool, bytes, error);
}

/* The shards as store tensors and the ring of buffers. */
static gboolean
nvme_new (StowSwapper *sw, const StowSwapperOptions *opts, GError **error)
{
  const char *prefix = opts->name_prefix ? opts->name_prefix : "optim.shard.";
  sw->store = opts->store;
  for (guint i = 0; i < sw->n_shards; i++)
    {
      g_autofree char *name = g_strdup_printf ("%s%u", prefix, i);
      guint id = stow_nvme_store_add_tensor (sw->store, name, sw->bytes[i]);
      if (i == 0)
        sw->first_tensor = id;
    }
  if (!stow_nvme_store_prepare (sw->store, error))
    return FALSE;
  sw->n_buffers = MAX (opts->n_buffers, MIN (RING, sw->n_shards));
  guint8 *ring
      = pool_alloc (sw, opts->pool, sw->stride * sw->n_buffers, TRUE, error);
  if (ring == NULL)
    return FALSE;
  sw->bufs = g_new0 (guint8 *, sw->n_buffers);
  sw->busy = g_new0 (gboolean, sw->n_buffers);
  /* Each buffer registered on its own, before the pool is locked, so that
   * io_uring faults the pages in (see StowPinnedOptions.defer_pin) and no
   * request straddles two registrations; a no-op for pools pinned
   * already. */
  for (guint b = 0; b < sw->n_buffers; b++)
    {
      sw->bufs[b] = ring + b * sw->stride;
      stow_nvme_store_register_buffer (sw->store, sw->bufs[b], sw->stride);
    }
  stow_pinned_pool_pin (sw->pool);
  if (opts->zero_fill)
    {
      memset (sw->bufs[0], 0, sw->stride);
      for (guint i = 0; i < sw->n_shards; i++)
        if (!stow_swapper_write (sw, i, sw->bufs[0], error))
          return FALSE;
    }
  return TRUE;
}

StowSwapper *
stow_swapper_new (const StowSwapperOptions *opts, GError **error)
{
  g_return_val_if_fail (opts != NULL, NULL);
  if (opts->shard_sizes == NULL
      && (opts->total_bytes == 0 || opts->shard_bytes == 0))
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "swapper: state bytes (%" G_GUINT64_FORMAT
                   ") and shard bytes (%" G_GUINT64_FORMAT ") must be positive",
                   opts->total_bytes, opts->shard_bytes);
      return NULL;
    }
  if (opts->mode == STOW_SWAP_NVME && opts->store == NULL)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "swapper: NVMe mode needs a store");
      return NULL;
    }
  g_autoptr (StowSwapper) sw = g_new0 (StowSwapper, 1);
  g_mutex_init (&sw->lock);
  sw->mode = opts->mode;
  sw->cached = G_MAXUINT;
  sw->bytes = cut_shards (opts, &sw->n_shards, error);
  if (sw->bytes == NULL)
    return NULL;
  guint64 most = 0;
  for (guint i = 0; i < sw->n_shards; i++)
    most = MAX (most, sw->bytes[i]);
  /* Page-aligned, so the update sees the same alignment in both modes. */
  sw->stride = (most + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN * STOW_NVME_ALIGN;

  if (sw->mode == STOW_SWAP_NVME)
    return nvme_new (sw, opts, error) ? g_steal_pointer (&sw) : NULL;
  sw->host
      = pool_alloc (sw, opts->pool, sw->stride * sw->n_shards, FALSE, error);
  if (sw->host == NULL)
    return NULL;
  stow_pinned_pool_pin (sw->pool);
  if (opts->zero_fill)
    memset (sw->host, 0, sw->stride * sw->n_shards);
  return g_steal_pointer (&sw);
}

void
stow_swapper_free (StowSwapper *sw)
{
  if (sw == NULL)
    return;
  if (sw->own_pool)
    stow_pinned_pool_free (sw->own_pool);
  g_free (sw->bufs);
  g_free (sw->busy);
  g_free (sw->bytes);
  g_mutex_clear (&sw->lock);
  g_free (sw);
}

guint
stow_swapper_get_n_shards (StowSwapper *sw)
{
  return sw->n_shards;
}

guint64
stow_swapper_get_shard_bytes (StowSwapper *sw, guint shard)
{
  g_return_val_if_fail (shard < sw->n_shards, 0);
  return sw->bytes[shard];
}

guint
stow_swapper_get_n_buffers (StowSwapper *sw)
{
  return sw->n_buffers;
}

guint64
stow_swapper_get_buffer_bytes (StowSwapper *sw)
{
  return sw->stride;
}

StowPinnedPool *
stow_swapper_get_pool (StowSwapper *sw)
{
  return sw->pool;
}

static guint8 *
host_shard (StowSwapper *sw, guint shard)
{
  return sw->host + (guint64)shard * sw->stride;
}

/* ---- a step driven by a program ------------------------------------------ */

void *
stow_swapper_take_buffer (StowSwapper *sw)
{
  g_mutex_lock (&sw->lock);
  void *got = NULL;
  for (guint i = 0; got == NULL && i < sw->n_buffers; i++)
    if (!sw->busy[i])
      {
        sw->busy[i] = TRUE;
        got = sw->bufs[i];
      }
  g_mutex_unlock (&sw->lock);
  return got;
}

void
stow_swapper_give_buffer (StowSwapper *sw, void *buf)
{
  g_mutex_lock (&sw->lock);
  for (guint i = 0; i < sw->n_buffers; i++)
    if (sw->bufs[i] == buf)
      sw->busy[i] = FALSE;
  g_mutex_unlock (&sw->lock);
}

gboolean
stow_swapper_read (StowSwapper *sw, guint shard, void *buf, GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  if (sw->mode == STOW_SWAP_HOST)
    {
      memcpy (buf, host_shard (sw, shard), sw->bytes[shard]);
      return TRUE;
    }
  return stow_nvme_store_read (sw->store, sw->first_tensor + shard, buf, error);
}

gboolean
stow_swapper_write (StowSwapper *sw, guint shard, const void *buf,
                    GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  if (sw->mode == STOW_SWAP_HOST)
    {
      memcpy (host_shard (sw, shard), buf, sw->bytes[shard]);
      return TRUE;
    }
  return stow_nvme_store_write (sw->store, sw->first_tensor + shard, buf,
                                error);
}

/* ---- a step driven by the swapper --------------------------------------- */

static gboolean
start_failed (StowSwapper *sw, guint shard, const char *op, int ret,
              GError **error)
{
  g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED,
               "swapper: cannot start the %s of shard %u: %s", op, shard,
               g_strerror (-ret));
  return FALSE;
}

/* A step over shards held in host memory: nothing to read or write. */
static gboolean
host_step (StowSwapper *sw, StowSwapUpdateFunc update, gpointer user_data,
           StowSwapStats *stats)
{
  StowSwapStats st = { 0 };
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < sw->n_shards; i++)
    update (host_shard (sw, i), sw->bytes[i], i, user_data);
  st.update_s = st.step_s = (g_get_monotonic_time () - t0) / 1e6;
  if (stats)
    *stats = st;
  return TRUE;
}

/* Waits for @req (if any), keeping the first error. */
static void
wait_keep (StowSwapper *sw, StowNvmeRequest **req, double *acc_s,
           GError **first)
{
  if (*req == NULL)
    return;
  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (GError) e = NULL;
  if (!stow_nvme_request_wait (sw->store, *req, &e) && *first == NULL)
    *first = g_steal_pointer (&e);
  *req = NULL;
  *acc_s += (g_get_monotonic_time () - t0) / 1e6;
}

gboolean
stow_swapper_step (StowSwapper *sw, StowSwapUpdateFunc update,
                   gpointer user_data, StowSwapStats *stats, GError **error)
{
  g_return_val_if_fail (sw != NULL && update != NULL, FALSE);
  if (sw->mode == STOW_SWAP_HOST)
    return host_step (sw, update, user_data, stats);
  if (!stow_swapper_flush (sw, error))
    return FALSE;
  StowSwapStats st = { 0 };

  guint N = sw->n_buffers;
  StowNvmeRequest *reads[N], *writes[N];
  memset (reads, 0, sizeof reads);
  memset (writes, 0, sizeof writes);
  GError *first = NULL;
  gint64 t0 = g_get_monotonic_time ();
  guint tensor0 = sw->first_tensor;

  int ret = stow_nvme_read_async (sw->store, tensor0, 0, sw->bufs[0],
                                  sw->bytes[0], &reads[0]);
  if (ret < 0)
    return start_failed (sw, 0, "read", ret, error);
  for (guint i = 0; i < sw->n_shards && first == NULL; i++)
    {
      guint b = i % N;
      guint64 bytes = sw->bytes[i];
      wait_keep (sw, &reads[b], &st.read_s, &first);
      if (first != NULL)
        break;
      st.bytes_read += bytes;
      if (i + 1 < sw->n_shards)
        {
          guint nb = (i + 1) % N;
          /* The buffer's last user was shard i+1-N; its write must land
           * before the read overwrites it. */
          wait_keep (sw, &writes[nb], &st.write_s, &first);
          if (first != NULL)
            break;
          ret = stow_nvme_read_async (sw->store, tensor0 + i + 1, 0,
                                      sw->bufs[nb], sw->bytes[i + 1],
                                      &reads[nb]);
          if (ret < 0)
            {
              start_failed (sw, i + 1, "read", ret, &first);
              break;
            }
        }
      gint64 u0 = g_get_monotonic_time ();
      update (sw->bufs[b], bytes, i, user_data);
      st.update_s += (g_get_monotonic_time () - u0) / 1e6;
      ret = stow_nvme_write_async (sw->store, tensor0 + i, 0, sw->bufs[b],
                                   bytes, &writes[b]);
      if (ret < 0)
        {
          start_failed (sw, i, "write", ret, &first);
          break;
        }
      st.bytes_written += bytes;
    }
  for (guint b = 0; b < N; b++)
    {
      wait_keep (sw, &reads[b], &st.read_s, &first);
      wait_keep (sw, &writes[b], &st.write_s, &first);
    }
  st.step_s = (g_get_monotonic_time () - t0) / 1e6;
  if (stats)
    *stats = st;
  if (first != NULL)
    {
      g_propagate_error (error, first);
      return FALSE;
    }
  return TRUE;
}

gboolean
stow_swapper_step_serial (StowSwapper *sw, StowSwapUpdateFunc update,
                          gpointer user_data, StowSwapStats *stats,
                          GError **error)
{
  g_return_val_if_fail (sw != NULL && update != NULL, FALSE);
  if (sw->mode == STOW_SWAP_HOST)
    return host_step (sw, update, user_data, stats);
  if (!stow_swapper_flush (sw, error))
    return FALSE;
  StowSwapStats st = { 0 };
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < sw->n_shards; i++)
    {
      guint64 bytes = sw->bytes[i];
      gint64 a = g_get_monotonic_time ();
      if (!stow_swapper_read (sw, i, sw->bufs[0], error))
        return FALSE;
      gint64 b = g_get_monotonic_time ();
      update (sw->bufs[0], bytes, i, user_data);
      gint64 c = g_get_monotonic_time ();
      if (!stow_swapper_write (sw, i, sw->bufs[0], error))
        return FALSE;
      gint64 d = g_get_monotonic_time ();
      st.read_s += (b - a) / 1e6;
      st.update_s += (c - b) / 1e6;
      st.write_s += (d - c) / 1e6;
      st.bytes_read += bytes;
      st.bytes_written += bytes;
    }
  st.step_s = (g_get_monotonic_time () - t0) / 1e6;
  if (stats)
    *stats = st;
  return TRUE;
}

/* ---- outside a step ----------------------------------------------------- */

static gboolean
cache_shard (StowSwapper *sw, guint shard, GError **error)
{
  if (sw->cached == shard)
    return TRUE;
  if (!stow_swapper_flush (sw, error))
    return FALSE;
  if (!stow_swapper_read (sw, shard, sw->bufs[0], error))
    return FALSE;
  sw->cached = shard;
  return TRUE;
}

gboolean
stow_swapper_access (StowSwapper *sw, gboolean write, guint shard,
                     guint64 offset, guint64 bytes, void *data, GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards
                            && offset + bytes <= sw->bytes[shard],
                        FALSE);
  guint8 *s;
  if (sw->mode == STOW_SWAP_HOST)
    s = host_shard (sw, shard) + offset;
  else if (cache_shard (sw, shard, error))
    s = sw->bufs[0] + offset;
  else
    return FALSE;
  if (write)
    {
      memcpy (s, data, bytes);
      if (sw->mode == STOW_SWAP_NVME)
        sw->dirty = TRUE;
    }
  else
    memcpy (data, s, bytes);
  return TRUE;
}

gboolean
stow_swapper_flush (StowSwapper *sw, GError **error)
{
  if (sw->cached == G_MAXUINT)
    return TRUE;
  if (sw->dirty)
    {
      if (!stow_swapper_write (sw, sw->cached, sw->bufs[0], error))
        return FALSE;
      sw->dirty = FALSE;
    }
  sw->cached = G_MAXUINT;
  return TRUE;
}

gboolean
stow_swapper_store_shard (StowSwapper *sw, guint shard, const void *src,
                          GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  if (sw->mode == STOW_SWAP_HOST)
    return stow_swapper_write (sw, shard, src, error);
  /* Written through the cache's buffer (O_DIRECT wants it aligned), at
   * once, never left dirty. */
  if (!stow_swapper_flush (sw, error))
    return FALSE;
  memcpy (sw->bufs[0], src, sw->bytes[shard]);
  return stow_swapper_write (sw, shard, sw->bufs[0], error);
}

gboolean
stow_swapper_load_shard (StowSwapper *sw, guint shard, void *dst,
                         GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  return stow_swapper_access (sw, FALSE, shard, 0, sw->bytes[shard], dst,
                              error);
}
