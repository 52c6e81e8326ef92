/* SPDX-License-Identifier: MIT
 *
 * tests/test-swapper.c: the optimizer-state swapper produces exactly the
 * states an in-memory update produces, with the state on NVMe (pipelined and
 * serial, both engines, several buffer counts) and in host RAM; an I/O
 * error in a step surfaces and leaves the shards written before it valid.
 * A step program's way (shards of its own sizes, ring buffers taken and
 * given back, reads and writes by shard, ranges outside a step) gives the
 * same bytes as the swapper's own step.
 */
#include "config.h"

#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "offload/swapper.h"

typedef struct
{
  GArray *order; /* shards in the order the update saw them */
  guint step;
} UpdateLog;

/* Deterministic and position-dependent, so a shard updated twice, skipped,
 * given the wrong bytes or the wrong index shows up in the comparison. */
static void
toy_update (void *state_buf, gsize bytes, guint shard, gpointer user_data)
{
  UpdateLog *log = user_data;
  guint8 *b = state_buf;
  for (gsize i = 0; i < bytes; i++)
    b[i] = (guint8)(b[i] * 31u + shard * 7u + (i & 0xff) + log->step + 1u);
  g_array_append_val (log->order, shard);
}

static void
oracle_step (guint8 *state, guint64 total, guint64 shard_bytes, guint step)
{
  UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), step };
  for (guint64 s = 0, i = 0; s < total; s += shard_bytes, i++)
    toy_update (state + s, MIN (shard_bytes, total - s), (guint)i, &log);
  g_array_unref (log.order);
}

typedef struct
{
  char *base;
  StowPinnedPool *pool;
} Fixture;

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  const char *build = g_getenv ("G_TEST_BUILDDIR");
  f->base = g_build_filename (build ? build : ".", "swap-test-XXXXXX", NULL);
  g_assert_nonnull (g_mkdtemp (f->base));
  StowPinnedOptions o
      = { .slab_bytes = 4 << 20, .numa_node = -1, .no_cuda = TRUE };
  f->pool = stow_pinned_pool_new (&o);
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  stow_pinned_pool_free (f->pool);
  g_assert_cmpint (g_rmdir (f->base), ==, 0);
  g_free (f->base);
}

static StowNvmeStore *
make_store (Fixture *f, StowNvmeEngine engine)
{
  const char *dirs[] = { f->base, NULL };
  StowNvmeOptions o = { .dirs = dirs,
                        .block_bytes = 16 << 10,
                        .queue_depth = 8,
                        .engine = engine,
                        .checksum = TRUE };
  g_autoptr (GError) error = NULL;
  StowNvmeStore *store = stow_nvme_store_new (&o, &error);
  if (store == NULL)
    {
      g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
    }
  return store;
}

static void
check_against_oracle (Fixture *f, StowSwapMode mode, StowNvmeEngine engine,
                      guint n_buffers, gboolean serial)
{
  g_autoptr (StowNvmeStore) store = NULL;
  if (mode == STOW_SWAP_NVME && (store = make_store (f, engine)) == NULL)
    return;
  /* 9 shards, the last one short and not a multiple of a page. */
  guint64 shard = 100 << 10, total = 8 * shard + 12345;
  StowSwapperOptions o = { .mode = mode,
                           .total_bytes = total,
                           .shard_bytes = shard,
                           .pool = f->pool,
                           .store = store,
                           .n_buffers = n_buffers };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSwapper) sw = stow_swapper_new (&o, &error);
  g_assert_no_error (error);
  guint n = stow_swapper_get_n_shards (sw);
  g_assert_cmpuint (n, ==, 9);
  g_assert_cmpuint (stow_swapper_get_shard_bytes (sw, 8), ==, 12345);

  guint8 *oracle = g_malloc (total), *got = g_malloc (total);
  g_autoptr (GRand) r = g_rand_new_with_seed (17);
  for (guint64 i = 0; i < total; i++)
    oracle[i] = (guint8)g_rand_int (r);
  for (guint i = 0; i < n; i++)
    g_assert_true (
        stow_swapper_store_shard (sw, i, oracle + (guint64)i * shard, &error));

  for (guint step = 0; step < 3; step++)
    {
      UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), step };
      StowSwapStats st;
      gboolean ok
          = serial
                ? stow_swapper_step_serial (sw, toy_update, &log, &st, &error)
                : stow_swapper_step (sw, toy_update, &log, &st, &error);
      g_assert_no_error (error);
      g_assert_true (ok);
      oracle_step (oracle, total, shard, step);
      /* Every shard once, in order. */
      g_assert_cmpuint (log.order->len, ==, n);
      for (guint i = 0; i < n; i++)
        g_assert_cmpuint (g_array_index (log.order, guint, i), ==, i);
      g_array_unref (log.order);
      g_assert_cmpfloat (st.step_s, >, 0.0);
      if (mode == STOW_SWAP_NVME)
        {
          g_assert_cmpuint (st.bytes_read, ==, total);
          g_assert_cmpuint (st.bytes_written, ==, total);
        }
    }
  for (guint i = 0; i < n; i++)
    g_assert_true (
        stow_swapper_load_shard (sw, i, got + (guint64)i * shard, &error));
  g_assert_cmpmem (oracle, total, got, total);
  g_free (oracle);
  g_free (got);
}

static void
test_nvme_uring (Fixture *f, gconstpointer d)
{
  check_against_oracle (f, STOW_SWAP_NVME, STOW_NVME_ENGINE_IO_URING, 3, FALSE);
}

static void
test_nvme_threads (Fixture *f, gconstpointer d)
{
  check_against_oracle (f, STOW_SWAP_NVME, STOW_NVME_ENGINE_THREADS, 3, FALSE);
}

static void
test_nvme_four_buffers (Fixture *f, gconstpointer d)
{
  check_against_oracle (f, STOW_SWAP_NVME, STOW_NVME_ENGINE_AUTO, 4, FALSE);
}

static void
test_nvme_serial (Fixture *f, gconstpointer d)
{
  check_against_oracle (f, STOW_SWAP_NVME, STOW_NVME_ENGINE_AUTO, 3, TRUE);
}

static void
test_host (Fixture *f, gconstpointer d)
{
  check_against_oracle (f, STOW_SWAP_HOST, STOW_NVME_ENGINE_AUTO, 0, FALSE);
}

static void
test_error (Fixture *f, gconstpointer d)
{
  g_autoptr (StowNvmeStore) store = make_store (f, STOW_NVME_ENGINE_AUTO);
  if (store == NULL)
    return;
  guint64 shard = 64 << 10, total = 6 * shard;
  StowSwapperOptions o = { .mode = STOW_SWAP_NVME,
                           .total_bytes = total,
                           .shard_bytes = shard,
                           .pool = f->pool,
                           .store = store };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSwapper) sw = stow_swapper_new (&o, &error);
  g_assert_no_error (error);
  guint8 *state = g_malloc0 (total), *got = g_malloc (shard);
  for (guint i = 0; i < 6; i++)
    g_assert_true (stow_swapper_store_shard (sw, i, state + i * shard, &error));
  /* Shards are 4 blocks each and operations are issued in request order:
   * read 0 (ops 1-4), read 1 (5-8), write 0 (9-12), read 2 (13-16), write 1
   * (17-20).  Op 18 fails the write of shard 1; the step notices when it
   * waits for that write before reusing its buffer (during shard 3). */
  stow_nvme_store_inject_fault (store, 18, STOW_NVME_FAULT_EIO);
  UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), 0 };
  g_assert_false (stow_swapper_step (sw, toy_update, &log, NULL, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED);
  g_assert_nonnull (strstr (error->message, "\"optim.shard.1\" block 1"));
  g_assert_nonnull (strstr (error->message, "write failed"));
  g_clear_error (&error);
  g_assert_cmpuint (log.order->len, ==, 3);
  /* Shards 0 and 2 were written whole and read back updated; shard 1 reads
   * as an error, never as stale or half-written bytes; the rest keep their
   * old state. */
  guint8 *before = g_memdup2 (state, total);
  oracle_step (state, total, shard, 0);
  for (guint i = 0; i < 6; i++)
    {
      gboolean ok = stow_swapper_load_shard (sw, i, got, &error);
      if (i == 1)
        {
          g_assert_false (ok);
          g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_DATA);
          g_clear_error (&error);
          continue;
        }
      g_assert_no_error (error);
      g_assert_cmpmem (i == 0 || i == 2 ? state + i * shard
                                        : before + i * shard,
                       shard, got, shard);
    }
  g_free (before);
  g_array_unref (log.order);
  g_free (state);
  g_free (got);
}

static void
test_bad_options (Fixture *f, gconstpointer d)
{
  StowSwapperOptions o = { .mode = STOW_SWAP_NVME,
                           .total_bytes = 1000,
                           .shard_bytes = 100,
                           .pool = f->pool };
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_swapper_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
  g_clear_error (&error);
  o.mode = STOW_SWAP_HOST;
  o.shard_bytes = 0;
  g_assert_null (stow_swapper_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
}

/* A step as a program drives it (executor/backends/swap.c): a cut of its
 * own sizes, the ring taken buffer by buffer, shards read, updated and
 * written one op at a time; the oracle's bytes, and a zero start. */
static void
test_program_driven (Fixture *f, gconstpointer d)
{
  g_autoptr (StowNvmeStore) store = make_store (f, STOW_NVME_ENGINE_AUTO);
  if (store == NULL)
    return;
  const guint64 sizes[] = { 40000, 100 << 10, 4096, 77777 };
  guint64 total = 0, offs[G_N_ELEMENTS (sizes)];
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    offs[i] = total, total += sizes[i];
  StowSwapperOptions o = { .mode = STOW_SWAP_NVME,
                           .shard_sizes = sizes,
                           .n_shards = G_N_ELEMENTS (sizes),
                           .store = store,
                           .name_prefix = "chunk ",
                           .zero_fill = TRUE };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSwapper) sw = stow_swapper_new (&o, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_swapper_get_n_shards (sw), ==, 4);
  g_assert_cmpuint (stow_swapper_get_shard_bytes (sw, 3), ==, 77777);
  g_assert_cmpuint (stow_swapper_get_n_buffers (sw), ==, 3);
  g_assert_cmpuint (stow_swapper_get_buffer_bytes (sw), ==, 100 << 10);
  g_assert_nonnull (stow_swapper_get_pool (sw));

  guint8 *oracle = g_malloc0 (total);
  UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), 0 };
  for (guint step = 0; step < 2; step++)
    {
      log.step = step;
      void *bufs[3];
      for (guint b = 0; b < 3; b++)
        {
          bufs[b] = stow_swapper_take_buffer (sw);
          g_assert_nonnull (bufs[b]);
        }
      g_assert_null (stow_swapper_take_buffer (sw));
      for (guint i = 0; i < 4; i++)
        {
          void *buf = bufs[i % 3];
          g_assert_true (stow_swapper_read (sw, i, buf, &error));
          g_assert_no_error (error);
          toy_update (buf, sizes[i], i, &log);
          toy_update (oracle + offs[i], sizes[i], i, &log);
          g_assert_true (stow_swapper_write (sw, i, buf, &error));
          g_assert_no_error (error);
        }
      for (guint b = 0; b < 3; b++)
        stow_swapper_give_buffer (sw, bufs[b]);
    }
  g_array_unref (log.order);
  guint8 *got = g_malloc (100 << 10);
  for (guint i = 0; i < 4; i++)
    {
      g_assert_true (stow_swapper_load_shard (sw, i, got, &error));
      g_assert_no_error (error);
      g_assert_cmpmem (oracle + offs[i], sizes[i], got, sizes[i]);
    }
  g_free (got);
  g_free (oracle);
}

/* Ranges outside a step, in both modes: what is written reads back, a
 * write reaches the store only when flushed (or when the cache moves on),
 * and a step afterwards updates the written bytes. */
static void
check_ranges (Fixture *f, StowSwapMode mode)
{
  g_autoptr (StowNvmeStore) store = NULL;
  if (mode == STOW_SWAP_NVME
      && (store = make_store (f, STOW_NVME_ENGINE_AUTO)) == NULL)
    return;
  guint64 shard = 64 << 10, total = 3 * shard;
  StowSwapperOptions o = { .mode = mode,
                           .total_bytes = total,
                           .shard_bytes = shard,
                           .store = store,
                           .zero_fill = TRUE };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSwapper) sw = stow_swapper_new (&o, &error);
  g_assert_no_error (error);
  guint8 *state = g_malloc0 (total), *got = g_malloc (shard);
  /* Pieces in shards 2, 0 and 1, the last one across a block boundary. */
  const struct
  {
    guint shard;
    guint64 offset, bytes;
  } piece[] = { { 2, 100, 3000 }, { 0, 0, 20 }, { 1, 16000, 9000 } };
  for (guint k = 0; k < G_N_ELEMENTS (piece); k++)
    {
      guint8 *at = state + piece[k].shard * shard + piece[k].offset;
      for (guint64 i = 0; i < piece[k].bytes; i++)
        at[i] = (guint8)(k * 50 + i);
      g_assert_true (stow_swapper_access (sw, TRUE, piece[k].shard,
                                          piece[k].offset, piece[k].bytes, at,
                                          &error));
      g_assert_no_error (error);
      g_assert_true (stow_swapper_access (sw, FALSE, piece[k].shard,
                                          piece[k].offset, piece[k].bytes, got,
                                          &error));
      g_assert_cmpmem (at, piece[k].bytes, got, piece[k].bytes);
    }
  g_assert_true (stow_swapper_flush (sw, &error));
  g_assert_no_error (error);
  UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), 0 };
  g_assert_true (stow_swapper_step (sw, toy_update, &log, NULL, &error));
  g_assert_no_error (error);
  g_array_unref (log.order);
  oracle_step (state, total, shard, 0);
  for (guint i = 0; i < 3; i++)
    {
      g_assert_true (stow_swapper_load_shard (sw, i, got, &error));
      g_assert_no_error (error);
      g_assert_cmpmem (state + i * shard, shard, got, shard);
    }
  g_free (state);
  g_free (got);
}

static void
test_ranges_nvme (Fixture *f, gconstpointer d)
{
  check_ranges (f, STOW_SWAP_NVME);
}

static void
test_ranges_host (Fixture *f, gconstpointer d)
{
  check_ranges (f, STOW_SWAP_HOST);
}

/* A program's cut of fewer shards than the pipeline's three buffers gets a
 * ring of one per shard, and a range written and not flushed is written
 * by the next step before it reads. */
static void
test_small_ring (Fixture *f, gconstpointer d)
{
  g_autoptr (StowNvmeStore) store = make_store (f, STOW_NVME_ENGINE_AUTO);
  if (store == NULL)
    return;
  const guint64 sizes[] = { 8192, 5000 };
  StowSwapperOptions o = { .mode = STOW_SWAP_NVME,
                           .shard_sizes = sizes,
                           .n_shards = 2,
                           .store = store,
                           .zero_fill = TRUE };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSwapper) sw = stow_swapper_new (&o, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_swapper_get_n_buffers (sw), ==, 2);
  guint8 one = 9, got = 0;
  g_assert_true (stow_swapper_access (sw, TRUE, 1, 4999, 1, &one, &error));
  UpdateLog log = { g_array_new (FALSE, FALSE, sizeof (guint)), 0 };
  g_assert_true (stow_swapper_step (sw, toy_update, &log, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (log.order->len, ==, 2);
  g_array_unref (log.order);
  g_assert_true (stow_swapper_access (sw, FALSE, 1, 4999, 1, &got, &error));
  /* toy_update on byte 4999 of shard 1 in step 0 */
  g_assert_cmpuint (got, ==, (guint8)(9 * 31u + 7u + (4999 & 0xff) + 1u));
}

static void
test_bad_cut (Fixture *f, gconstpointer d)
{
  const guint64 sizes[] = { 4096, 0 };
  StowSwapperOptions o
      = { .mode = STOW_SWAP_HOST, .shard_sizes = sizes, .n_shards = 2 };
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_swapper_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
  g_clear_error (&error);
  o.n_shards = 0;
  g_assert_null (stow_swapper_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
#define ADD(path, fn)                                                          \
  g_test_add (path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD ("/swapper/nvme/io_uring", test_nvme_uring);
  ADD ("/swapper/nvme/threads", test_nvme_threads);
  ADD ("/swapper/nvme/four-buffers", test_nvme_four_buffers);
  ADD ("/swapper/nvme/serial", test_nvme_serial);
  ADD ("/swapper/host", test_host);
  ADD ("/swapper/nvme/error", test_error);
  ADD ("/swapper/bad-options", test_bad_options);
  ADD ("/swapper/nvme/program-driven", test_program_driven);
  ADD ("/swapper/nvme/ranges", test_ranges_nvme);
  ADD ("/swapper/host/ranges", test_ranges_host);
  ADD ("/swapper/nvme/small-ring", test_small_ring);
  ADD ("/swapper/bad-cut", test_bad_cut);
  return g_test_run ();
}
