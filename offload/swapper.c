/* SPDX-License-Identifier: MIT
 *
 * offload/swapper.c: the optimizer-state swapper (see swapper.h).  Shard i
 * uses buffer i mod N; before shard i+1 is read into its buffer the write of
 * shard i+1-N, which last used it, must be done.  With N = 3 that leaves
 * read i+1 and write i-1 in flight while the update runs on shard i.
 */
#include "config.h"

#include "offload/swapper.h"

#include <errno.h>
#include <string.h>

struct _StowSwapper
{
  StowSwapMode mode;
  guint64 total_bytes;
  guint64 shard_bytes;
  guint n_shards;
  StowNvmeStore *store;
  guint first_tensor; /* shard i is tensor first_tensor + i */
  guint n_buffers;
  guint8 **bufs; /* NVMe: (n_buffers) pinned shard buffers */
  guint8 *host;  /* host mode: the whole state */
};

StowSwapper *
stow_swapper_new (const StowSwapperOptions *opts, GError **error)
{
  g_return_val_if_fail (opts != NULL && opts->pool != NULL, NULL);
  if (opts->total_bytes == 0 || opts->shard_bytes == 0)
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
  guint64 n = opts->total_bytes / opts->shard_bytes
              + (opts->total_bytes % opts->shard_bytes != 0);
  if (n > STOW_SWAPPER_MAX_SHARDS)
    {
      guint64 least = opts->total_bytes / STOW_SWAPPER_MAX_SHARDS
                      + (opts->total_bytes % STOW_SWAPPER_MAX_SHARDS != 0);
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "swapper: %" G_GUINT64_FORMAT " bytes in shards of %"
                   G_GUINT64_FORMAT " bytes is %" G_GUINT64_FORMAT
                   " shards, over the limit of %u (shards of at least %"
                   G_GUINT64_FORMAT " bytes)",
                   opts->total_bytes, opts->shard_bytes, n,
                   STOW_SWAPPER_MAX_SHARDS, least);
      return NULL;
    }
  g_autoptr (StowSwapper) sw = g_new0 (StowSwapper, 1);
  sw->mode = opts->mode;
  sw->total_bytes = opts->total_bytes;
  sw->shard_bytes = MIN (opts->shard_bytes, opts->total_bytes);
  sw->n_shards = (guint)n;

  if (sw->mode == STOW_SWAP_HOST)
    {
      /* Shards are page-aligned so the update sees the same alignment in
       * both modes. */
      guint64 stride = (sw->shard_bytes + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN
                       * STOW_NVME_ALIGN;
      sw->host = stow_pinned_pool_alloc (opts->pool, stride * n, error);
      if (sw->host == NULL)
        return NULL;
      stow_pinned_pool_pin (opts->pool);
      return g_steal_pointer (&sw);
    }

  sw->store = opts->store;
  sw->n_buffers = MAX (opts->n_buffers, 3);
  for (guint i = 0; i < sw->n_shards; i++)
    {
      g_autofree char *name = g_strdup_printf ("optim.shard.%u", i);
      guint id = stow_nvme_store_add_tensor (
          sw->store, name, stow_swapper_get_shard_bytes (sw, i));
      if (i == 0)
        sw->first_tensor = id;
    }
  if (!stow_nvme_store_prepare (sw->store, error))
    return NULL;
  guint64 stride = (sw->shard_bytes + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN
                   * STOW_NVME_ALIGN;
  guint8 *ring
      = stow_pinned_pool_alloc (opts->pool, stride * sw->n_buffers, error);
  if (ring == NULL)
    return NULL;
  /* Registered before it is locked, so that io_uring faults the pages in
   * (see StowPinnedOptions.defer_pin); a no-op for pools pinned already. */
  stow_nvme_store_register_buffer (sw->store, ring, stride * sw->n_buffers);
  stow_pinned_pool_pin (opts->pool);
  sw->bufs = g_new0 (guint8 *, sw->n_buffers);
  for (guint b = 0; b < sw->n_buffers; b++)
    sw->bufs[b] = ring + b * stride;
  return g_steal_pointer (&sw);
}

void
stow_swapper_free (StowSwapper *sw)
{
  if (sw == NULL)
    return;
  g_free (sw->bufs);
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
  guint64 start = (guint64)shard * sw->shard_bytes;
  return MIN (sw->shard_bytes, sw->total_bytes - start);
}

static guint8 *
host_shard (StowSwapper *sw, guint shard)
{
  guint64 stride = (sw->shard_bytes + STOW_NVME_ALIGN - 1) / STOW_NVME_ALIGN
                   * STOW_NVME_ALIGN;
  return sw->host + (guint64)shard * stride;
}

static gboolean
start_failed (StowSwapper *sw, guint shard, const char *op, int ret,
              GError **error)
{
  g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED,
               "swapper: cannot start the %s of shard %u: %s", op, shard,
               g_strerror (-ret));
  return FALSE;
}

gboolean
stow_swapper_store_shard (StowSwapper *sw, guint shard, const void *src,
                          GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  guint64 bytes = stow_swapper_get_shard_bytes (sw, shard);
  if (sw->mode == STOW_SWAP_HOST)
    {
      memcpy (host_shard (sw, shard), src, bytes);
      return TRUE;
    }
  memcpy (sw->bufs[0], src, bytes);
  return stow_nvme_store_write (sw->store, sw->first_tensor + shard,
                                sw->bufs[0], error);
}

gboolean
stow_swapper_load_shard (StowSwapper *sw, guint shard, void *dst,
                         GError **error)
{
  g_return_val_if_fail (sw != NULL && shard < sw->n_shards, FALSE);
  guint64 bytes = stow_swapper_get_shard_bytes (sw, shard);
  if (sw->mode == STOW_SWAP_HOST)
    {
      memcpy (dst, host_shard (sw, shard), bytes);
      return TRUE;
    }
  if (!stow_nvme_store_read (sw->store, sw->first_tensor + shard, sw->bufs[0],
                             error))
    return FALSE;
  memcpy (dst, sw->bufs[0], bytes);
  return TRUE;
}

/* A step over shards held in host memory: nothing to read or write. */
static gboolean
host_step (StowSwapper *sw, StowSwapUpdateFunc update, gpointer user_data,
           StowSwapStats *stats)
{
  StowSwapStats st = { 0 };
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < sw->n_shards; i++)
    update (host_shard (sw, i), stow_swapper_get_shard_bytes (sw, i), i,
            user_data);
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
  StowSwapStats st = { 0 };

  guint N = sw->n_buffers;
  StowNvmeRequest *reads[N], *writes[N];
  memset (reads, 0, sizeof reads);
  memset (writes, 0, sizeof writes);
  GError *first = NULL;
  gint64 t0 = g_get_monotonic_time ();
  guint tensor0 = sw->first_tensor;

  int ret
      = stow_nvme_read_async (sw->store, tensor0, 0, sw->bufs[0],
                              stow_swapper_get_shard_bytes (sw, 0), &reads[0]);
  if (ret < 0)
    return start_failed (sw, 0, "read", ret, error);
  for (guint i = 0; i < sw->n_shards && first == NULL; i++)
    {
      guint b = i % N;
      guint64 bytes = stow_swapper_get_shard_bytes (sw, i);
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
          ret = stow_nvme_read_async (
              sw->store, tensor0 + i + 1, 0, sw->bufs[nb],
              stow_swapper_get_shard_bytes (sw, i + 1), &reads[nb]);
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
  StowSwapStats st = { 0 };
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < sw->n_shards; i++)
    {
      guint64 bytes = stow_swapper_get_shard_bytes (sw, i);
      gint64 a = g_get_monotonic_time ();
      if (!stow_nvme_store_read (sw->store, sw->first_tensor + i, sw->bufs[0],
                                 error))
        return FALSE;
      gint64 b = g_get_monotonic_time ();
      update (sw->bufs[0], bytes, i, user_data);
      gint64 c = g_get_monotonic_time ();
      if (!stow_nvme_store_write (sw->store, sw->first_tensor + i, sw->bufs[0],
                                  error))
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
