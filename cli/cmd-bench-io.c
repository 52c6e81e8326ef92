/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-bench-io.c: benchmarks of the offload I/O path.  "nvme" streams
 * one large tensor to and from the NVMe store the way fio's sequential jobs
 * do (same block size and queue depth), so the two can be compared side by
 * side; "swapper" times one optimizer step pipelined and each of its stages
 * alone.  Numbers only: no verdicts are printed.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <json-glib/json-glib.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "core/drives.h"
#include "core/json.h"
#include "core/units.h"
#include "offload/adam.h"
#include "offload/nvme.h"
#include "offload/pinned.h"
#include "offload/swapper.h"

/* Options shared by both benchmarks. */
typedef struct
{
  char **dirs;
  char *size;
  char *block_size;
  char *stripe_size;
  int queue_depth;
  char *engine;
  gboolean checksum;
  gboolean json;
  int repeat;
  char *huge_pages;
} IoOpts;

static gboolean
parse_huge_pages (const char *cmd, IoOpts *o, StowHugePages *out)
{
  *out = STOW_HUGE_PAGES_AUTO;
  if (o->huge_pages == NULL || stow_huge_pages_parse (o->huge_pages, out))
    return TRUE;
  stow_cli_failf ("kinds: auto, thp, hugetlb, off",
                  "%s: --huge-pages \"%s\": unknown kind", cmd, o->huge_pages);
  return FALSE;
}

/* The page kind of @pool's buffers, for text and JSON. */
typedef struct
{
  StowHugePages asked;
  StowPageKind got;
  guint64 huge_bytes, buffer_bytes;
  const char *note; /* owned by the pool */
} PageReport;

static void
page_report (StowPinnedPool *pool, StowHugePages asked, PageReport *out)
{
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  out->asked = asked;
  out->got = stow_pinned_pool_get_page_kind (pool, &out->huge_bytes);
  out->buffer_bytes = st.reserved_bytes;
  out->note = stow_pinned_pool_get_page_note (pool);
}

static void
page_report_json (JsonBuilder *b, const PageReport *r)
{
  stow_json_set_string (b, "huge_pages", stow_huge_pages_name (r->asked));
  stow_json_set_string (b, "page_kind", stow_page_kind_name (r->got));
  stow_json_set_u64 (b, "huge_bytes", r->huge_bytes);
  stow_json_set_u64 (b, "buffer_bytes", r->buffer_bytes);
  stow_json_set_string (b, "thp", stow_thp_mode ());
  if (r->note)
    stow_json_set_string (b, "page_note", r->note);
}

static void
page_report_print (const PageReport *r)
{
  char a[STOW_FORMAT_BUF], h[STOW_FORMAT_BUF];
  stow_format_bytes_into (a, sizeof a, r->buffer_bytes);
  stow_format_bytes_into (h, sizeof h, r->huge_bytes);
  printf ("buffers %s, pages %s (%s on 2 MiB pages; --huge-pages %s, THP "
          "%s)\n",
          a, stow_page_kind_name (r->got), h, stow_huge_pages_name (r->asked),
          stow_thp_mode ());
  if (r->note)
    printf ("note: %s\n", r->note);
}

static double
median (GArray *xs)
{
  if (xs->len == 0)
    return 0;
  g_autoptr (GArray) c = g_array_copy (xs);
  for (guint i = 1; i < c->len; i++)
    for (guint j = i;
         j > 0
         && g_array_index (c, double, j - 1) > g_array_index (c, double, j);
         j--)
      {
        double t = g_array_index (c, double, j);
        g_array_index (c, double, j) = g_array_index (c, double, j - 1);
        g_array_index (c, double, j - 1) = t;
      }
  guint n = c->len;
  return n % 2 ? g_array_index (c, double, n / 2)
               : 0.5
                     * (g_array_index (c, double, n / 2 - 1)
                        + g_array_index (c, double, n / 2));
}

static gboolean
parse_engine (const char *text, StowNvmeEngine *out)
{
  if (text == NULL || g_str_equal (text, "auto"))
    *out = STOW_NVME_ENGINE_AUTO;
  else if (g_str_equal (text, "io_uring"))
    *out = STOW_NVME_ENGINE_IO_URING;
  else if (g_str_equal (text, "threads"))
    *out = STOW_NVME_ENGINE_THREADS;
  else
    return FALSE;
  return TRUE;
}

/* Builds the store from the shared options; prints the error and returns
 * NULL on bad input. */
static StowNvmeStore *
open_store (const char *cmd, IoOpts *o, guint64 *block_out, int *rc)
{
  g_autoptr (GError) error = NULL;
  guint64 block = 1 << 20, stripe = 0;
  StowNvmeEngine engine;
  *rc = STOW_EXIT_FAILURE;
  if (o->dirs == NULL || o->dirs[0] == NULL)
    {
      stow_cli_failf ("give one --dir per drive", "%s: --dir is required", cmd);
      return NULL;
    }
  for (guint i = 0; o->dirs[i]; i++)
    if (o->dirs[i][0] == '\0')
      {
        /* not silently the current directory */
        stow_cli_failf ("write --dir . for the current directory",
                        "%s: --dir \"\": an empty directory name", cmd);
        return NULL;
      }
  if (o->block_size && !stow_parse_size (o->block_size, &block, &error))
    {
      g_prefix_error (&error, "%s: --block-size: ", cmd);
      stow_cli_fail (error, NULL);
      return NULL;
    }
  /* The store's own limits, said before anything is sized from them (0
   * used to reach a division and ask for 2^63 bytes). */
  if (block == 0 || block % 4096 != 0 || block > (64u << 20))
    {
      stow_cli_failf (NULL,
                      "%s: --block-size %s: must be a multiple of 4 KiB from "
                      "4 KiB to 64 MiB",
                      cmd, o->block_size);
      return NULL;
    }
  if (o->stripe_size && !stow_parse_size (o->stripe_size, &stripe, &error))
    {
      g_prefix_error (&error, "%s: --stripe-size: ", cmd);
      stow_cli_fail (error, NULL);
      return NULL;
    }
  if (o->queue_depth < 1 || o->queue_depth > 1024)
    {
      stow_cli_failf (NULL, "%s: --queue-depth %d: must be 1 to 1024", cmd,
                      o->queue_depth);
      return NULL;
    }
  if (!parse_engine (o->engine, &engine))
    {
      stow_cli_failf ("engines: io_uring, threads, auto",
                      "%s: --engine \"%s\": unknown engine", cmd, o->engine);
      return NULL;
    }
  StowNvmeOptions so = { 0 };
  so.dirs = (const char *const *)o->dirs;
  so.block_bytes = block;
  so.stripe_bytes = stripe;
  so.queue_depth = (guint)o->queue_depth;
  so.engine = engine;
  so.checksum = o->checksum;
  StowNvmeStore *store = stow_nvme_store_new (&so, &error);
  if (store == NULL)
    {
      stow_cli_fail (error, NULL);
      return NULL;
    }
  *block_out = block;
  *rc = STOW_EXIT_OK;
  return store;
}

/* Streams [0, size) of @tensor with @n_bufs requests of @chunk bytes in
 * flight; returns bytes/s, or a negative value after setting @error. */
static double
stream (StowNvmeStore *store, guint tensor, guint64 size, gboolean write,
        guint8 **bufs, guint n_bufs, guint64 chunk, GError **error)
{
  StowNvmeRequest *reqs[8] = { NULL };
  g_assert (n_bufs <= G_N_ELEMENTS (reqs));
  gint64 t0 = g_get_monotonic_time ();
  guint k = 0;
  gboolean ok = TRUE;
  for (guint64 off = 0; off < size && ok; off += chunk, k = (k + 1) % n_bufs)
    {
      if (reqs[k] && !stow_nvme_request_wait (store, reqs[k], error))
        ok = FALSE;
      reqs[k] = NULL;
      if (!ok)
        break;
      guint64 len = MIN (chunk, size - off);
      int ret = write ? stow_nvme_write_async (store, tensor, off, bufs[k], len,
                                               &reqs[k])
                      : stow_nvme_read_async (store, tensor, off, bufs[k], len,
                                              &reqs[k]);
      if (ret < 0)
        {
          g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED,
                       "cannot start a request: %s", g_strerror (-ret));
          ok = FALSE;
        }
    }
  for (guint i = 0; i < n_bufs; i++)
    if (reqs[i])
      {
        if (!ok)
          stow_nvme_request_wait (store, reqs[i], NULL);
        else if (!stow_nvme_request_wait (store, reqs[i], error))
          ok = FALSE;
      }
  double s = (g_get_monotonic_time () - t0) / 1e6;
  return ok ? size / s : -1;
}

static void
add_dirs (JsonBuilder *b, char **dirs)
{
  json_builder_set_member_name (b, "dirs");
  json_builder_begin_array (b);
  for (guint i = 0; dirs[i]; i++)
    json_builder_add_string_value (b, dirs[i]);
  json_builder_end_array (b);
}

static GOptionEntry *
io_entries (IoOpts *o)
{
  GOptionEntry e[] = {
    { "dir", 'd', 0, G_OPTION_ARG_FILENAME_ARRAY, &o->dirs,
      "Directory for the store (repeat to stripe over drives)", "DIR" },
    { "size", 's', 0, G_OPTION_ARG_STRING, &o->size,
      "Bytes to move (default 1GiB)", "BYTES" },
    { "block-size", 'b', 0, G_OPTION_ARG_STRING, &o->block_size,
      "Bytes per I/O request (default 1MiB)", "BYTES" },
    { "stripe-size", 0, 0, G_OPTION_ARG_STRING, &o->stripe_size,
      "Stripe across directories (default 4 blocks)", "BYTES" },
    { "queue-depth", 'Q', 0, G_OPTION_ARG_INT, &o->queue_depth,
      "Requests in flight (default 32)", "N" },
    { "engine", 'e', 0, G_OPTION_ARG_STRING, &o->engine,
      "io_uring, threads or auto (default)", "ENGINE" },
    { "checksum", 0, 0, G_OPTION_ARG_NONE, &o->checksum,
      "XXH3 per block, verified on read", NULL },
    { "repeat", 'r', 0, G_OPTION_ARG_INT, &o->repeat,
      "Runs; the best is reported (default 1)", "N" },
    { "huge-pages", 0, 0, G_OPTION_ARG_STRING, &o->huge_pages,
      "Buffer pages: auto (THP where the kernel offers it; default), thp, "
      "hugetlb (reserved pages) or off",
      "KIND" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &o->json, "Print JSON", NULL },
    { NULL },
  };
  return g_memdup2 (e, sizeof e);
}

static void
io_opts_clear (IoOpts *o)
{
  g_strfreev (o->dirs);
  g_free (o->size);
  g_free (o->block_size);
  g_free (o->stripe_size);
  g_free (o->engine);
  g_free (o->huge_pages);
}

int
stow_bench_nvme (int argc, char **argv)
{
  IoOpts o = { .queue_depth = 32, .repeat = 1 };
  g_autofree GOptionEntry *entries = io_entries (&o);
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "bench nvme", NULL,
      "Write then read one tensor through the NVMe store (O_DIRECT,\n"
      "sequential, --queue-depth requests of --block-size in flight) and\n"
      "report bytes per second, comparable with fio --ioengine=io_uring\n"
      "--direct=1 --rw=write/read at the same block size and depth, and\n"
      "with fio --mem=mmaphuge when the buffers got 2 MiB pages (see\n"
      "'Page kind' in the output; bench/nvme.sh runs both).");
  g_option_context_add_main_entries (ctx, entries, NULL);
  int rc = STOW_EXIT_FAILURE;
  g_autoptr (StowNvmeStore) store = NULL;
  g_autoptr (StowPinnedPool) pool = NULL;
  g_autoptr (GError) error = NULL;
  guint64 size = 1ull << 30, block = 0;
  StowHugePages huge = STOW_HUGE_PAGES_AUTO;
  PageReport pages = { 0 };
  if (!stow_cli_parse (ctx, "bench nvme", &argc, &argv))
    goto out;
  if (!parse_huge_pages ("bench nvme", &o, &huge))
    goto out;
  if (argc > 1)
    {
      rc = stow_cli_failf ("see 'stowage bench nvme --help'",
                           "bench nvme: unexpected argument \"%s\"", argv[1]);
      goto out;
    }
  if (o.size && !stow_parse_size (o.size, &size, &error))
    {
      g_prefix_error (&error, "bench nvme: --size: ");
      rc = stow_cli_fail (error, NULL);
      goto out;
    }
  if (size == 0 || o.repeat < 1)
    {
      rc = stow_cli_failf (NULL, "bench nvme: --size and --repeat must be "
                                 "positive");
      goto out;
    }
  store = open_store ("bench nvme", &o, &block, &rc);
  if (store == NULL)
    goto out;
  rc = STOW_EXIT_FAILURE;

  guint id = stow_nvme_store_add_tensor (store, "bench", size);
  if (!stow_nvme_store_prepare (store, &error))
    {
      rc = stow_cli_fail (error, NULL);
      goto out;
    }
  /* Three buffers of one full queue each keep the queue full while the
   * oldest request is being replaced. */
  guint64 chunk = block * (guint64)o.queue_depth;
  chunk = MIN (chunk, round (size / (double)block + 0.5) * block);
  enum
  {
    NBUF = 3
  };
  StowPinnedOptions po = { .slab_bytes = chunk * NBUF,
                           .numa_node = -1,
                           .defer_pin = TRUE,
                           .huge_pages = huge };
  pool = stow_pinned_pool_new (&po);
  guint8 *ring = stow_pinned_pool_alloc (pool, chunk * NBUF, &error);
  if (ring == NULL)
    {
      rc = stow_cli_fail (error, NULL);
      goto out;
    }
  /* Register, then lock, then touch: see StowPinnedOptions.defer_pin. */
  stow_nvme_store_register_buffer (store, ring, chunk * NBUF);
  stow_pinned_pool_pin (pool);
  {
    /* Random data (xorshift64), as fio writes by default: nothing for a
     * compressing or deduplicating layer to shortcut. */
    guint64 x = 0x9E3779B97F4A7C15ull, *w = (guint64 *)ring;
    for (guint64 i = 0; i < chunk * NBUF / 8; i++)
      {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = x;
      }
  }
  guint8 *bufs[NBUF] = { ring, ring + chunk, ring + 2 * chunk };
  page_report (pool, huge, &pages);

  double best_w = 0, best_r = 0;
  GArray *ws = g_array_new (FALSE, FALSE, sizeof (double));
  GArray *rs = g_array_new (FALSE, FALSE, sizeof (double));
  for (int r = 0; r < o.repeat; r++)
    {
      double w = stream (store, id, size, TRUE, bufs, NBUF, chunk, &error);
      double rd
          = w < 0 ? -1
                  : stream (store, id, size, FALSE, bufs, NBUF, chunk, &error);
      if (rd < 0)
        {
          g_array_unref (ws);
          g_array_unref (rs);
          rc = stow_cli_fail (error, NULL);
          goto out;
        }
      g_array_append_val (ws, w);
      g_array_append_val (rs, rd);
      best_w = MAX (best_w, w);
      best_r = MAX (best_r, rd);
    }
  const char *engine
      = stow_nvme_engine_name (stow_nvme_store_get_engine (store));
  if (o.json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_string (b, "engine", engine);
      stow_json_set_i64 (b, "block_size", (gint64)block);
      stow_json_set_i64 (b, "queue_depth", o.queue_depth);
      stow_json_set_i64 (b, "size", (gint64)size);
      add_dirs (b, o.dirs);
      stow_json_set_bool (b, "direct", stow_nvme_store_is_direct (store));
      stow_json_set_bool (b, "checksum", o.checksum);
      page_report_json (b, &pages);
      stow_json_set_double (b, "read_bytes_per_s", best_r);
      stow_json_set_double (b, "write_bytes_per_s", best_w);
      stow_json_set_double (b, "read_bytes_per_s_median", median (rs));
      stow_json_set_double (b, "write_bytes_per_s_median", median (ws));
      json_builder_set_member_name (b, "runs");
      json_builder_begin_array (b);
      for (guint i = 0; i < ws->len; i++)
        {
          json_builder_begin_object (b);
          stow_json_set_double (b, "read_bytes_per_s",
                                g_array_index (rs, double, i));
          stow_json_set_double (b, "write_bytes_per_s",
                                g_array_index (ws, double, i));
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      json_builder_end_object (b);
      stow_cli_print_json (json_builder_get_root (b));
    }
  else
    {
      g_autofree char *sz = stow_format_bytes (size);
      g_autofree char *bs = stow_format_bytes (block);
      g_autofree char *wbw = stow_format_bandwidth (best_w);
      g_autofree char *rbw = stow_format_bandwidth (best_r);
      printf ("engine %s, %s in blocks of %s, queue depth %d, %s\n", engine, sz,
              bs, o.queue_depth,
              stow_nvme_store_is_direct (store) ? "O_DIRECT" : "buffered");
      page_report_print (&pages);
      printf ("write  %s\nread   %s\n", wbw, rbw);
    }
  g_array_unref (ws);
  g_array_unref (rs);
  rc = STOW_EXIT_OK;
out:
  io_opts_clear (&o);
  return rc;
}

/* --- swapper -------------------------------------------------------------- */

/* The directories grouped by the device they are on (st_dev): reads and
 * writes of one device share its queue, so the bound is per device. */
static GPtrArray *
group_by_device (char **dirs)
{
  GPtrArray *groups
      = g_ptr_array_new_with_free_func ((GDestroyNotify)g_ptr_array_unref);
  g_autoptr (GArray) devs = g_array_new (FALSE, FALSE, sizeof (dev_t));
  for (guint i = 0; dirs[i]; i++)
    {
      struct stat st;
      dev_t d = stat (dirs[i], &st) == 0 ? st.st_dev : (dev_t)i;
      guint g = 0;
      while (g < devs->len && g_array_index (devs, dev_t, g) != d)
        g++;
      if (g == devs->len)
        {
          g_array_append_val (devs, d);
          g_ptr_array_add (groups, g_ptr_array_new ());
        }
      g_ptr_array_add (g_ptr_array_index (groups, g), dirs[i]);
    }
  return groups;
}

static void
noop_update (void *state_buf, gsize bytes, guint shard, gpointer user_data)
{
}

/* One device's share of the step, alone: its directories' share of the
 * state in a store of its own, read and written shard by shard as the
 * serial step does (best of @o->repeat).  FALSE after printing the error. */
static gboolean
measure_device (IoOpts *o, GPtrArray *dirs, guint n_all_dirs, guint64 size,
                guint64 shard, StowPinnedPool *pool, StowDriveSeconds *out)
{
  g_autoptr (GError) error = NULL;
  IoOpts sub = *o;
  g_autofree char **v = g_new0 (char *, dirs->len + 1);
  for (guint i = 0; i < dirs->len; i++)
    v[i] = g_ptr_array_index (dirs, i);
  sub.dirs = v;
  guint64 block = 0;
  int rc;
  g_autoptr (StowNvmeStore) store
      = open_store ("bench swapper", &sub, &block, &rc);
  if (store == NULL)
    return FALSE;
  /* Stripes go round the directories evenly: this device holds its
   * directories' part of every shard. */
  guint64 part = MAX (size / n_all_dirs * dirs->len, 1);
  guint64 sh = MAX (shard / n_all_dirs * dirs->len, 1);
  StowSwapperOptions so = { .mode = STOW_SWAP_NVME,
                            .total_bytes = part,
                            .shard_bytes = sh,
                            .pool = pool,
                            .store = store,
                            .n_buffers = 3,
                            .zero_fill = TRUE };
  g_autoptr (StowSwapper) sw = stow_swapper_new (&so, &error);
  if (sw == NULL)
    {
      stow_cli_fail (error, NULL);
      return FALSE;
    }
  out->read_s = out->write_s = INFINITY;
  for (int r = 0; r < o->repeat; r++)
    {
      StowSwapStats st;
      if (!stow_swapper_step_serial (sw, noop_update, NULL, &st, &error))
        {
          stow_cli_fail (error, NULL);
          return FALSE;
        }
      out->read_s = MIN (out->read_s, st.read_s);
      out->write_s = MIN (out->write_s, st.write_s);
    }
  return TRUE;
}

/* The update: stowage's CPU Adam on a shard laid out planar, p | m | v
 * (n fp32 each), with synthetic bf16 gradients in and the bf16 copy for
 * the GPU out: the work a ZeRO-Offload step does per shard. */
typedef struct
{
  StowAdam *adam;
  StowAdamConfig config;
  guint64 step;
  guint16 *grad; /* (cap) bf16 */
  guint16 *out;  /* (cap) bf16 */
  guint64 cap;
  int rc;
} BenchAdam;

static void
bench_adam_update (void *state_buf, gsize bytes, guint shard,
                   gpointer user_data)
{
  BenchAdam *a = user_data;
  float *s = state_buf;
  guint64 n = bytes / (3 * sizeof (float));
  if (n > a->cap)
    {
      a->rc = -EINVAL;
      return;
    }
  StowAdamTensor t
      = { s,      s + n,           s + 2 * n, a->grad, STOW_DTYPE_BF16,
          a->out, STOW_DTYPE_BF16, n };
  StowAdamStep st = { a->step, 1.0, 1.0, FALSE };
  int rc = stow_adam_step_raw (a->adam, &a->config, &st, &t);
  if (rc != 0)
    a->rc = rc;
}

static void
bench_adam_clear (BenchAdam *a)
{
  g_clear_pointer (&a->adam, stow_adam_free);
  g_clear_pointer (&a->grad, g_free);
  g_clear_pointer (&a->out, g_free);
}

/* `bench swapper`'s flags, parsed and checked. */
typedef struct
{
  IoOpts o;
  StowSwapMode mode;
  guint64 size;
  guint64 shard; /* whole p, m, v element triples */
  int n_buffers;
  int adam_threads;
  StowHugePages huge;
} SwapperArgs;

/* FALSE after printing the error. */
static gboolean
swapper_args_parse (int argc, char **argv, SwapperArgs *a)
{
  *a = (SwapperArgs){ .o = { .queue_depth = 32, .repeat = 3 },
                      .mode = STOW_SWAP_NVME,
                      .size = 1ull << 30,
                      .shard = 64ull << 20,
                      .n_buffers = 3 };
  IoOpts *o = &a->o;
  g_autofree char *shard_size = NULL, *mode = NULL;
  g_autofree GOptionEntry *entries = io_entries (o);
  GOptionEntry more[] = {
    { "shard-size", 0, 0, G_OPTION_ARG_STRING, &shard_size,
      "Bytes per shard (default 64MiB)", "BYTES" },
    { "buffers", 0, 0, G_OPTION_ARG_INT, &a->n_buffers,
      "Pinned shard buffers (default 3)", "N" },
    { "mode", 0, 0, G_OPTION_ARG_STRING, &mode, "nvme (default) or host",
      "MODE" },
    { "threads", 0, 0, G_OPTION_ARG_INT, &a->adam_threads,
      "Adam's threads (default 0: one per core)", "N" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "bench swapper", NULL,
      "Time one optimizer step over --size bytes of state (fp32 p, m, v)\n"
      "cut into shards: pipelined (read i+1 | update i | write i-1) and\n"
      "each stage alone.  The update is stowage's CPU Adam (bf16 gradients\n"
      "in, bf16 weights out).  --repeat steps of\n"
      "each kind are run and the best is reported.  The step is set against\n"
      "its bound: max (read + write, update) on one device, whose reads and\n"
      "writes share a queue; over several devices, the busiest device's\n"
      "read + write (each device's share measured alone) or the update.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_add_main_entries (ctx, more, NULL);
  g_autoptr (GError) error = NULL;
  if (!stow_cli_parse (ctx, "bench swapper", &argc, &argv))
    return FALSE;
  if (!parse_huge_pages ("bench swapper", o, &a->huge))
    return FALSE;
  if (argc > 1)
    {
      stow_cli_failf ("see 'stowage bench swapper --help'",
                      "bench swapper: unexpected argument \"%s\"", argv[1]);
      return FALSE;
    }
  if ((o->size && !stow_parse_size (o->size, &a->size, &error))
      || (shard_size && !stow_parse_size (shard_size, &a->shard, &error)))
    {
      g_prefix_error (&error, "bench swapper: ");
      stow_cli_fail (error, NULL);
      return FALSE;
    }
  if (mode && g_str_equal (mode, "host"))
    a->mode = STOW_SWAP_HOST;
  else if (mode && !g_str_equal (mode, "nvme"))
    {
      stow_cli_failf ("modes: nvme, host",
                      "bench swapper: --mode \"%s\": unknown mode", mode);
      return FALSE;
    }
  if (o->repeat < 1 || a->n_buffers < 3 || a->size == 0 || a->shard == 0)
    {
      stow_cli_failf (NULL, "bench swapper: --size, --shard-size and "
                            "--repeat must be positive, --buffers at "
                            "least 3");
      return FALSE;
    }
  a->shard = MAX (a->shard / 12 * 12, 12);
  return TRUE;
}

/* What the benchmark runs on: the store (NVMe mode), the pool of the
 * buffers, and the swapper over them. */
typedef struct
{
  StowNvmeStore *store;
  StowPinnedPool *pool;
  StowSwapper *sw;
  guint64 block; /* the store's block size; 0 in host mode */
} SwapperRig;

/* The rig with the initial state, p = 0.01 and m = v = 0, planar per
 * shard.  FALSE after printing the error. */
static gboolean
swapper_rig_open (SwapperArgs *a, SwapperRig *r)
{
  g_autoptr (GError) error = NULL;
  int rc;
  if (a->mode == STOW_SWAP_NVME)
    {
      r->store = open_store ("bench swapper", &a->o, &r->block, &rc);
      if (r->store == NULL)
        return FALSE;
    }
  StowPinnedOptions po = { .slab_bytes = 256u << 20,
                           .numa_node = -1,
                           .defer_pin = TRUE,
                           .huge_pages = a->huge };
  r->pool = stow_pinned_pool_new (&po);
  StowSwapperOptions so = { .mode = a->mode,
                            .total_bytes = a->size,
                            .shard_bytes = a->shard,
                            .pool = r->pool,
                            .store = r->store,
                            .n_buffers = (guint)a->n_buffers };
  r->sw = stow_swapper_new (&so, &error);
  if (r->sw == NULL)
    {
      stow_cli_fail (error, NULL);
      return FALSE;
    }
  guint64 sb = stow_swapper_get_shard_bytes (r->sw, 0);
  g_autofree float *init = g_malloc0 (sb);
  for (guint64 i = 0; i < sb / 12; i++)
    init[i] = 0.01f;
  for (guint i = 0; i < stow_swapper_get_n_shards (r->sw); i++)
    if (!stow_swapper_store_shard (r->sw, i, init, &error))
      {
        stow_cli_fail (error, NULL);
        return FALSE;
      }
  return TRUE;
}

static void
swapper_rig_clear (SwapperRig *r)
{
  g_clear_pointer (&r->sw, stow_swapper_free);
  g_clear_pointer (&r->pool, stow_pinned_pool_free);
  g_clear_pointer (&r->store, stow_nvme_store_free);
}

/* CPU Adam on @threads threads (0: one per core) and synthetic gradients
 * for the largest shard of @sw.  FALSE after printing the error. */
static gboolean
bench_adam_init (BenchAdam *adam, StowSwapper *sw, int threads)
{
  g_autoptr (GError) error = NULL;
  if (threads < 0 || threads > 4096)
    {
      stow_cli_failf (NULL, "bench swapper: --threads %d: expected 0 to 4096",
                      threads);
      return FALSE;
    }
  adam->adam = stow_adam_new ((guint)threads, STOW_ISA_AUTO, &error);
  if (adam->adam == NULL)
    {
      stow_cli_fail (error, NULL);
      return FALSE;
    }
  stow_adam_config_init (&adam->config);
  for (guint i = 0; i < stow_swapper_get_n_shards (sw); i++)
    adam->cap = MAX (adam->cap, stow_swapper_get_shard_bytes (sw, i) / 12);
  adam->grad = g_new (guint16, adam->cap);
  adam->out = g_new (guint16, adam->cap);
  for (guint64 i = 0; i < adam->cap; i++)
    {
      /* bf16 of a small gradient: the top half of its fp32 bits. */
      float g = (float)(i & 1023) * 1e-6f - 5e-4f;
      guint32 bits;
      memcpy (&bits, &g, sizeof bits);
      adam->grad[i] = (guint16)(bits >> 16);
    }
  return TRUE;
}

/* The best of the runs: the pipelined step, and each stage alone. */
typedef struct
{
  StowSwapStats pipe;
  double read_s, update_s, write_s;
  /* The one device's read and write from the same serial step (the one
   * with the least read + write): the minima of read and of write taken
   * from different steps would add up to less than any step's I/O. */
  StowDriveSeconds io;
} SwapperBest;

/* @repeat serial steps and as many pipelined ones, alternating.  FALSE
 * after printing the error. */
static gboolean
swapper_run (StowSwapper *sw, BenchAdam *adam, int repeat, SwapperBest *best)
{
  g_autoptr (GError) error = NULL;
  *best = (SwapperBest){ .pipe = { .step_s = INFINITY },
                         .read_s = INFINITY,
                         .update_s = INFINITY,
                         .write_s = INFINITY,
                         .io = { INFINITY, 0 } };
  for (int r = 0; r < repeat; r++)
    {
      StowSwapStats st;
      adam->step++;
      if (!stow_swapper_step_serial (sw, bench_adam_update, adam, &st, &error))
        {
          stow_cli_fail (error, NULL);
          return FALSE;
        }
      best->read_s = MIN (best->read_s, st.read_s);
      best->update_s = MIN (best->update_s, st.update_s);
      best->write_s = MIN (best->write_s, st.write_s);
      if (st.read_s + st.write_s < best->io.read_s + best->io.write_s)
        best->io = (StowDriveSeconds){ st.read_s, st.write_s };
      adam->step++;
      if (!stow_swapper_step (sw, bench_adam_update, adam, &st, &error))
        {
          stow_cli_fail (error, NULL);
          return FALSE;
        }
      if (adam->rc != 0)
        {
          stow_cli_failf (NULL, "bench swapper: the Adam step failed: %s",
                          g_strerror (-adam->rc));
          return FALSE;
        }
      if (st.step_s < best->pipe.step_s)
        best->pipe = st;
    }
  return TRUE;
}

static double
max_stage_s (const SwapperBest *best)
{
  return MAX (best->update_s, MAX (best->read_s, best->write_s));
}

/* The step's bound (core/drives.h) and the devices it comes from. */
typedef struct
{
  GPtrArray *groups; /* (n_devices) directories by device */
  StowDriveSeconds *devices;
  guint n_devices; /* 0 in host mode */
  guint busiest;
  double bound_s;
  const char *rule;
} SwapperBound;

/* The bound from stage times measured here: on one device its read and
 * write alone; on several, each device's share alone.  FALSE after
 * printing the error. */
static gboolean
swapper_bound (SwapperArgs *a, const SwapperRig *r, const SwapperBest *best,
               SwapperBound *out)
{
  if (a->mode == STOW_SWAP_NVME)
    {
      out->groups = group_by_device (a->o.dirs);
      out->n_devices = out->groups->len;
      out->devices = g_new0 (StowDriveSeconds, out->n_devices);
      if (out->n_devices == 1)
        out->devices[0] = best->io;
      else
        for (guint d = 0; d < out->n_devices; d++)
          if (!measure_device (&a->o, g_ptr_array_index (out->groups, d),
                               g_strv_length (a->o.dirs), a->size, a->shard,
                               r->pool, &out->devices[d]))
            return FALSE;
    }
  out->bound_s = stow_drives_step_bound_s (out->devices, out->n_devices,
                                           best->update_s, &out->busiest);
  out->rule = out->n_devices == 0   ? "host: the update alone"
              : out->n_devices == 1 ? "one device: max (read + write, update)"
                                    : "several devices: max (busiest "
                                      "device's read + write, update)";
  return TRUE;
}

static void
swapper_bound_clear (SwapperBound *b)
{
  g_clear_pointer (&b->groups, g_ptr_array_unref);
  g_clear_pointer (&b->devices, g_free);
}

static void
swapper_print_json (const SwapperArgs *a, const SwapperRig *r,
                    const PageReport *pages, const SwapperBest *best,
                    const SwapperBound *bd)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "mode", a->mode == STOW_SWAP_NVME ? "nvme" : "host");
  stow_json_set_string (
      b, "engine",
      r->store ? stow_nvme_engine_name (stow_nvme_store_get_engine (r->store))
               : "none");
  stow_json_set_i64 (b, "state_bytes", (gint64)a->size);
  stow_json_set_i64 (b, "shard_bytes", (gint64)a->shard);
  stow_json_set_i64 (b, "n_shards", stow_swapper_get_n_shards (r->sw));
  stow_json_set_i64 (b, "buffers", a->n_buffers);
  stow_json_set_i64 (b, "block_size", (gint64)r->block);
  stow_json_set_i64 (b, "queue_depth", a->o.queue_depth);
  page_report_json (b, pages);
  stow_json_set_double (b, "pipelined_step_s", best->pipe.step_s);
  stow_json_set_double (b, "read_alone_s", best->read_s);
  stow_json_set_double (b, "update_alone_s", best->update_s);
  stow_json_set_double (b, "write_alone_s", best->write_s);
  stow_json_set_double (b, "max_stage_s", max_stage_s (best));
  stow_json_set_double (b, "pipelined_over_max_stage",
                        best->pipe.step_s / max_stage_s (best));
  /* Reads and writes share the drive(s): with a fast update the step is
   * bound by both together, not by the slower of them. */
  if (best->read_s + best->write_s > 0)
    stow_json_set_double (b, "pipelined_over_read_plus_write",
                          best->pipe.step_s / (best->read_s + best->write_s));
  stow_json_set_string (b, "bound_rule", bd->rule);
  stow_json_set_double (b, "bound_s", bd->bound_s);
  stow_json_set_double (b, "step_over_bound", best->pipe.step_s / bd->bound_s);
  json_builder_set_member_name (b, "devices");
  json_builder_begin_array (b);
  for (guint d = 0; d < bd->n_devices; d++)
    {
      json_builder_begin_object (b);
      GPtrArray *g = g_ptr_array_index (bd->groups, d);
      json_builder_set_member_name (b, "dirs");
      json_builder_begin_array (b);
      for (guint i = 0; i < g->len; i++)
        json_builder_add_string_value (b, g_ptr_array_index (g, i));
      json_builder_end_array (b);
      stow_json_set_double (b, "read_s", bd->devices[d].read_s);
      stow_json_set_double (b, "write_s", bd->devices[d].write_s);
      stow_json_set_bool (b, "busiest", d == bd->busiest);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  stow_json_set_double (b, "pipelined_wait_read_s", best->pipe.read_s);
  stow_json_set_double (b, "pipelined_update_s", best->pipe.update_s);
  stow_json_set_double (b, "pipelined_wait_write_s", best->pipe.write_s);
  json_builder_end_object (b);
  stow_cli_print_json (json_builder_get_root (b));
}

static void
swapper_print_text (const PageReport *pages, const SwapperBest *best,
                    const SwapperBound *bd)
{
  page_report_print (pages);
  printf ("step pipelined  %.3f s\n", best->pipe.step_s);
  printf ("read alone      %.3f s\nupdate alone    %.3f s\n"
          "write alone     %.3f s\n",
          best->read_s, best->update_s, best->write_s);
  for (guint d = 0; bd->n_devices > 1 && d < bd->n_devices; d++)
    {
      GPtrArray *g = g_ptr_array_index (bd->groups, d);
      printf ("device %u (%s%s): read %.3f s + write %.3f s alone%s\n", d,
              (char *)g_ptr_array_index (g, 0), g->len > 1 ? ", ..." : "",
              bd->devices[d].read_s, bd->devices[d].write_s,
              d == bd->busiest ? " (busiest)" : "");
    }
  printf ("bound           %.3f s (%s)\n", bd->bound_s, bd->rule);
  printf ("step / bound = %.3f\n", best->pipe.step_s / bd->bound_s);
  printf ("pipelined / slowest stage = %.3f\n",
          best->pipe.step_s / max_stage_s (best));
}

int
stow_bench_swapper (int argc, char **argv)
{
  SwapperArgs a = { 0 };
  SwapperRig rig = { 0 };
  BenchAdam adam = { 0 };
  SwapperBest best;
  SwapperBound bound = { 0 };
  PageReport pages = { 0 };
  int rc = STOW_EXIT_FAILURE;
  if (!swapper_args_parse (argc, argv, &a) || !swapper_rig_open (&a, &rig)
      || !bench_adam_init (&adam, rig.sw, a.adam_threads)
      || !swapper_run (rig.sw, &adam, a.o.repeat, &best))
    goto out;
  /* Before the devices' own measurements take buffers from the pool. */
  page_report (rig.pool, a.huge, &pages);
  if (!swapper_bound (&a, &rig, &best, &bound))
    goto out;
  if (a.o.json)
    swapper_print_json (&a, &rig, &pages, &best, &bound);
  else
    swapper_print_text (&pages, &best, &bound);
  rc = STOW_EXIT_OK;
out:
  swapper_bound_clear (&bound);
  bench_adam_clear (&adam);
  swapper_rig_clear (&rig);
  io_opts_clear (&a.o);
  return rc;
}
