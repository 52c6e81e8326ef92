/* SPDX-License-Identifier: MIT
 *
 * tests/test-nvme.c: the NVMe store.  Every test body runs once per engine
 * (io_uring, threads); the io_uring runs skip where the kernel refuses it.
 * Stores are made under the build directory, which sits on a real disk.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "offload/nvme.h"

typedef struct
{
  StowNvmeEngine engine;
  char *base; /* holds the store's private directories */
  char *dirs[4];
} Fixture;

static gboolean
allow_direct_warning (const char *domain, GLogLevelFlags level,
                      const char *message, gpointer data)
{
  /* Buffered fallback on a filesystem without O_DIRECT is not a failure. */
  return strstr (message, "refuses O_DIRECT") == NULL;
}

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  f->engine = GPOINTER_TO_INT (data);
  const char *build = g_getenv ("G_TEST_BUILDDIR");
  f->base = g_build_filename (build ? build : ".", "nvme-test-XXXXXX", NULL);
  g_assert_nonnull (g_mkdtemp (f->base));
  for (guint i = 0; i < 3; i++)
    {
      f->dirs[i] = g_strdup_printf ("%s/d%u", f->base, i);
      g_assert_cmpint (g_mkdir (f->dirs[i], 0700), ==, 0);
    }
  g_test_log_set_fatal_handler (allow_direct_warning, NULL);
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  /* Each store removed its private directory, so these are empty. */
  for (guint i = 0; i < 3; i++)
    {
      g_assert_cmpint (g_rmdir (f->dirs[i]), ==, 0);
      g_free (f->dirs[i]);
    }
  g_assert_cmpint (g_rmdir (f->base), ==, 0);
  g_free (f->base);
}

/* A store over @n_dirs directories, or NULL after g_test_skip when the
 * engine is refused here. */
static StowNvmeStore *
make_store (Fixture *f, guint n_dirs, guint64 block, guint64 stripe, guint qd,
            gboolean checksum)
{
  const char *dirs[4] = { NULL };
  for (guint i = 0; i < n_dirs; i++)
    dirs[i] = f->dirs[i];
  StowNvmeOptions o = { 0 };
  o.dirs = dirs;
  o.block_bytes = block;
  o.stripe_bytes = stripe;
  o.queue_depth = qd;
  o.engine = f->engine;
  o.checksum = checksum;
  g_autoptr (GError) error = NULL;
  StowNvmeStore *store = stow_nvme_store_new (&o, &error);
  if (store == NULL
      && g_error_matches (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED))
    {
      g_test_skip (error->message);
      return NULL;
    }
  g_assert_no_error (error);
  g_assert_cmpint (stow_nvme_store_get_engine (store), ==, f->engine);
  return store;
}

/* Page-aligned buffer of exactly @bytes followed by a guard page pattern,
 * so a read that wrote past the caller's bytes is caught. */
#define GUARD 4096
static guint8 *
buf_new (guint64 bytes)
{
  guint8 *b = g_aligned_alloc (1, bytes + GUARD, STOW_NVME_ALIGN);
  memset (b + bytes, 0xA5, GUARD);
  return b;
}

static void
buf_check_guard (const guint8 *b, guint64 bytes)
{
  for (guint i = 0; i < GUARD; i++)
    g_assert_cmpuint (b[bytes + i], ==, 0xA5);
}

static void
fill_random (GRand *r, guint8 *b, guint64 bytes)
{
  for (guint64 i = 0; i < bytes; i++)
    b[i] = (guint8)g_rand_int (r);
}

/* Adds the tensor @name of @bytes to @store and prepares the store;
 * returns the tensor's id. */
static guint
add_prepared (StowNvmeStore *store, const char *name, guint64 bytes)
{
  g_autoptr (GError) error = NULL;
  guint id = stow_nvme_store_add_tensor (store, name, bytes);
  g_assert_true (stow_nvme_store_prepare (store, &error));
  return id;
}

/* A source buffer of @bytes filled from @seed and an empty destination
 * one, both guarded (see buf_new). */
static void
src_dst_new (guint64 bytes, guint32 seed, guint8 **src, guint8 **dst)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  *src = buf_new (bytes);
  *dst = buf_new (bytes);
  fill_random (r, *src, bytes);
}

static void
test_roundtrip (Fixture *f, gconstpointer data)
{
  g_autoptr (StowNvmeStore) store
      = make_store (f, 1, 64 << 10, 128 << 10, 8, TRUE);
  if (store == NULL)
    return;
  g_autoptr (GRand) r = g_rand_new_with_seed (42);
  /* Sizes around every boundary: sub-page, page, block, stripe. */
  guint64 sizes[] = {
    1, 100, 4095, 4096, 4097, 65535, 65536, 65537, 131072 + 17, 3 * 65536 + 517,
    0, 0,   0,    0
  };
  for (guint i = 10; i < G_N_ELEMENTS (sizes); i++)
    sizes[i] = g_rand_int_range (r, 1, 700000);
  guint n = G_N_ELEMENTS (sizes);
  guint ids[G_N_ELEMENTS (sizes)];
  for (guint i = 0; i < n; i++)
    {
      g_autofree char *name = g_strdup_printf ("t%u", i);
      ids[i] = stow_nvme_store_add_tensor (store, name, sizes[i]);
    }
  g_autoptr (GError) error = NULL;
  g_assert_true (stow_nvme_store_prepare (store, &error));
  g_assert_no_error (error);
  for (guint i = 0; i < n; i++)
    {
      guint8 *src = buf_new (sizes[i]), *dst = buf_new (sizes[i]);
      fill_random (r, src, sizes[i]);
      g_assert_true (stow_nvme_store_write (store, ids[i], src, &error));
      g_assert_no_error (error);
      g_assert_true (stow_nvme_store_read (store, ids[i], dst, &error));
      g_assert_no_error (error);
      g_assert_cmpmem (src, sizes[i], dst, sizes[i]);
      buf_check_guard (dst, sizes[i]);
      g_aligned_free (src);
      g_aligned_free (dst);
    }
}

static void
test_concurrent (Fixture *f, gconstpointer data)
{
  g_autoptr (StowNvmeStore) store
      = make_store (f, 2, 16 << 10, 32 << 10, 8, TRUE);
  if (store == NULL)
    return;
  g_autoptr (GRand) r = g_rand_new_with_seed (7);
  enum
  {
    N = 48
  };
  guint64 sizes[N];
  guint ids[N];
  guint8 *src[N], *dst[N];
  StowNvmeRequest *reqs[N];
  for (guint i = 0; i < N; i++)
    {
      sizes[i] = g_rand_int_range (r, 1, 300000);
      g_autofree char *name = g_strdup_printf ("c%u", i);
      ids[i] = stow_nvme_store_add_tensor (store, name, sizes[i]);
      src[i] = buf_new (sizes[i]);
      dst[i] = buf_new (sizes[i]);
      fill_random (r, src[i], sizes[i]);
    }
  g_autoptr (GError) error = NULL;
  g_assert_true (stow_nvme_store_prepare (store, &error));
  /* All writes in flight at once, then all reads. */
  for (guint i = 0; i < N; i++)
    g_assert_cmpint (
        stow_nvme_write_async (store, ids[i], 0, src[i], sizes[i], &reqs[i]),
        ==, 0);
  for (guint i = 0; i < N; i++)
    {
      g_assert_true (stow_nvme_request_wait (store, reqs[i], &error));
      g_assert_no_error (error);
    }
  for (guint i = 0; i < N; i++)
    g_assert_cmpint (
        stow_nvme_read_async (store, ids[i], 0, dst[i], sizes[i], &reqs[i]), ==,
        0);
  /* Waited on in reverse order: completion order must not matter. */
  for (guint i = N; i-- > 0;)
    {
      g_assert_true (stow_nvme_request_wait (store, reqs[i], &error));
      g_assert_no_error (error);
    }
  for (guint i = 0; i < N; i++)
    {
      g_assert_cmpmem (src[i], sizes[i], dst[i], sizes[i]);
      buf_check_guard (dst[i], sizes[i]);
      g_aligned_free (src[i]);
      g_aligned_free (dst[i]);
    }
}

static void
test_partial_ranges (Fixture *f, gconstpointer data)
{
  guint64 block = 8192;
  g_autoptr (StowNvmeStore) store = make_store (f, 1, block, block, 4, TRUE);
  if (store == NULL)
    return;
  guint64 bytes = 5 * block + 1000;
  guint id = add_prepared (store, "p", bytes);
  g_autoptr (GError) error = NULL;
  guint8 *src, *dst;
  src_dst_new (bytes, 3, &src, &dst);
  StowNvmeRequest *req;
  /* Written as two pieces, the second ending at the unaligned end. */
  g_assert_cmpint (stow_nvme_write_async (store, id, 0, src, 2 * block, &req),
                   ==, 0);
  g_assert_true (stow_nvme_request_wait (store, req, &error));
  /* The unwritten rest cannot be read yet. */
  g_assert_cmpint (stow_nvme_read_async (store, id, 0, dst, bytes, &req), ==,
                   0);
  g_assert_false (stow_nvme_request_wait (store, req, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_DATA);
  g_assert_nonnull (strstr (error->message, "\"p\" block 2"));
  g_clear_error (&error);
  g_assert_cmpint (stow_nvme_write_async (store, id, 2 * block, src + 2 * block,
                                          bytes - 2 * block, &req),
                   ==, 0);
  g_assert_true (stow_nvme_request_wait (store, req, &error));
  g_assert_no_error (error);
  g_assert_cmpint (
      stow_nvme_read_async (store, id, 4 * block, dst, bytes - 4 * block, &req),
      ==, 0);
  g_assert_true (stow_nvme_request_wait (store, req, &error));
  g_assert_cmpmem (src + 4 * block, bytes - 4 * block, dst, bytes - 4 * block);
  g_assert_true (stow_nvme_store_read (store, id, dst, &error));
  g_assert_cmpmem (src, bytes, dst, bytes);
  buf_check_guard (dst, bytes);
  /* Misaligned ranges and buffers are refused up front. */
  g_assert_cmpint (stow_nvme_read_async (store, id, 100, dst, block, &req), ==,
                   -EINVAL);
  g_assert_cmpint (stow_nvme_read_async (store, id, 0, dst, 1000, &req), ==,
                   -EINVAL);
  g_assert_cmpint (stow_nvme_read_async (store, id, 0, dst + 8, block, &req),
                   ==, -EINVAL);
  g_assert_cmpint (stow_nvme_read_async (store, id, 0, dst, bytes + 1, &req),
                   ==, -EINVAL);
  g_aligned_free (src);
  g_aligned_free (dst);
}

static void
test_striping (Fixture *f, gconstpointer data)
{
  guint64 block = 16 << 10;
  g_autoptr (StowNvmeStore) store = make_store (f, 3, block, block, 8, FALSE);
  if (store == NULL)
    return;
  g_assert_cmpuint (stow_nvme_store_get_n_dirs (store), ==, 3);
  guint64 bytes = 10 * block + 333;
  guint id0 = stow_nvme_store_add_tensor (store, "a", 3 * block);
  guint id = add_prepared (store, "s", bytes);
  g_autoptr (GError) error = NULL;
  guint8 *src, *dst;
  src_dst_new (bytes, 11, &src, &dst);
  g_assert_true (stow_nvme_store_write (store, id, src, &error));
  g_assert_true (stow_nvme_store_read (store, id, dst, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (src, bytes, dst, bytes);

  /* Tensor "a" took stripes 0-2, so block b of "s" is stripe 3 + b: it must
   * be in directory (3 + b) mod 3, at row (3 + b) div 3, and hold the
   * bytes written there. */
  for (guint64 b = 0; b < 11; b++)
    {
      const char *path;
      guint64 off;
      stow_nvme_store_locate (store, id, b, &path, &off);
      g_assert_cmpstr (path, ==, stow_nvme_store_get_file (store, b % 3));
      g_assert_cmpuint (off, ==, (3 + b) / 3 * block);
      int fd = open (path, O_RDONLY);
      g_assert_cmpint (fd, >=, 0);
      guint8 raw[256];
      g_assert_cmpint (pread (fd, raw, sizeof raw, (off_t)off), ==, sizeof raw);
      g_assert_cmpmem (raw, sizeof raw, src + b * block, sizeof raw);
      close (fd);
    }
  /* Each directory holds a third of the 14 stripes (5, 5, 4). */
  for (guint d = 0; d < 3; d++)
    {
      struct stat st;
      g_assert_cmpint (stat (stow_nvme_store_get_file (store, d), &st), ==, 0);
      g_assert_cmpuint (st.st_size, ==, (d < 2 ? 5 : 4) * block);
    }
  (void)id0;
  g_aligned_free (src);
  g_aligned_free (dst);
}

static void
test_checksum (Fixture *f, gconstpointer data)
{
  guint64 block = 8192;
  g_autoptr (StowNvmeStore) store = make_store (f, 1, block, block, 4, TRUE);
  if (store == NULL)
    return;
  guint64 bytes = 4 * block + 10;
  guint id = add_prepared (store, "m.layer3", bytes);
  g_autoptr (GError) error = NULL;
  guint8 *src, *dst;
  src_dst_new (bytes, 5, &src, &dst);
  g_assert_true (stow_nvme_store_write (store, id, src, &error));

  /* Flip one byte of block 2 behind the store's back. */
  const char *path;
  guint64 off;
  stow_nvme_store_locate (store, id, 2, &path, &off);
  int fd = open (path, O_RDWR);
  g_assert_cmpint (fd, >=, 0);
  guint8 byte;
  g_assert_cmpint (pread (fd, &byte, 1, (off_t)off + 77), ==, 1);
  byte ^= 0x10;
  g_assert_cmpint (pwrite (fd, &byte, 1, (off_t)off + 77), ==, 1);
  g_assert_cmpint (fsync (fd), ==, 0);
  close (fd);

  g_assert_false (stow_nvme_store_read (store, id, dst, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_CHECKSUM);
  g_assert_nonnull (strstr (error->message, "\"m.layer3\" block 2"));
  g_assert_nonnull (strstr (error->message, path));
  g_aligned_free (src);
  g_aligned_free (dst);
}

static void
test_faults (Fixture *f, gconstpointer data)
{
  guint64 block = 8192;
  g_autoptr (StowNvmeStore) store
      = make_store (f, 1, block, 2 * block, 4, TRUE);
  if (store == NULL)
    return;
  guint64 bytes = 6 * block + 100;
  guint a = stow_nvme_store_add_tensor (store, "a", bytes);
  guint b = stow_nvme_store_add_tensor (store, "b", bytes);
  g_autoptr (GError) error = NULL;
  g_assert_true (stow_nvme_store_prepare (store, &error));
  guint8 *sa = buf_new (bytes), *sb = buf_new (bytes), *dst = buf_new (bytes);
  g_autoptr (GRand) r = g_rand_new_with_seed (9);
  fill_random (r, sa, bytes);
  fill_random (r, sb, bytes);
  g_assert_true (stow_nvme_store_write (store, a, sa, &error));

  /* EIO in the middle of writing b: an error naming b; a is untouched. */
  stow_nvme_store_inject_fault (store, 3, STOW_NVME_FAULT_EIO);
  g_assert_false (stow_nvme_store_write (store, b, sb, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED);
  g_assert_nonnull (strstr (error->message, "\"b\""));
  g_assert_nonnull (strstr (error->message, "write failed"));
  g_clear_error (&error);
  g_assert_true (stow_nvme_store_read (store, a, dst, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (sa, bytes, dst, bytes);
  /* b's failed write left nothing readable, not garbage. */
  g_assert_false (stow_nvme_store_read (store, b, dst, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_DATA);
  g_clear_error (&error);

  /* ENOSPC the same way. */
  stow_nvme_store_inject_fault (store, 1, STOW_NVME_FAULT_ENOSPC);
  g_assert_false (stow_nvme_store_write (store, b, sb, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_SPACE);
  g_clear_error (&error);
  g_assert_true (stow_nvme_store_read (store, a, dst, &error));
  g_assert_cmpmem (sa, bytes, dst, bytes);

  /* EIO on a read fails that read only. */
  stow_nvme_store_inject_fault (store, 2, STOW_NVME_FAULT_EIO);
  g_assert_false (stow_nvme_store_read (store, a, dst, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED);
  g_assert_nonnull (strstr (error->message, "read failed"));
  g_clear_error (&error);

  /* A short transfer is resumed: same bytes. */
  stow_nvme_store_inject_fault (store, 2, STOW_NVME_FAULT_SHORT);
  memset (dst, 0, bytes);
  g_assert_true (stow_nvme_store_read (store, a, dst, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (sa, bytes, dst, bytes);
  stow_nvme_store_inject_fault (store, 4, STOW_NVME_FAULT_SHORT);
  g_assert_true (stow_nvme_store_write (store, b, sb, &error));
  g_assert_true (stow_nvme_store_read (store, b, dst, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (sb, bytes, dst, bytes);

  /* A short read that then meets the end of the file is an error. */
  stow_nvme_store_inject_fault (store, 1, STOW_NVME_FAULT_SHORT_EOF);
  g_assert_false (stow_nvme_store_read (store, a, dst, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED);
  g_assert_nonnull (strstr (error->message, "end of file"));
  g_clear_error (&error);

  /* Afterwards both tensors still read back whole. */
  g_assert_true (stow_nvme_store_read (store, a, dst, &error));
  g_assert_cmpmem (sa, bytes, dst, bytes);
  g_assert_true (stow_nvme_store_read (store, b, dst, &error));
  g_assert_cmpmem (sb, bytes, dst, bytes);
  g_aligned_free (sa);
  g_aligned_free (sb);
  g_aligned_free (dst);
}

static void
test_files (Fixture *f, gconstpointer data)
{
  g_autofree char *dir0 = NULL, *file0 = NULL, *file1 = NULL;
  {
    g_autoptr (StowNvmeStore) store = make_store (f, 2, 0, 0, 0, FALSE);
    if (store == NULL)
      return;
    g_assert_cmpuint (stow_nvme_store_get_block_bytes (store), ==, 1 << 20);
    g_assert_cmpuint (stow_nvme_store_get_queue_depth (store), ==, 32);
    dir0 = g_strdup (stow_nvme_store_get_private_dir (store, 0));
    file0 = g_strdup (stow_nvme_store_get_file (store, 0));
    file1 = g_strdup (stow_nvme_store_get_file (store, 1));
    g_assert_true (g_str_has_prefix (dir0, f->dirs[0]));
    struct stat st;
    g_assert_cmpint (lstat (dir0, &st), ==, 0);
    g_assert_true (S_ISDIR (st.st_mode));
    g_assert_cmpuint (st.st_mode & 07777, ==, 0700);
    g_assert_cmpuint (st.st_uid, ==, getuid ());
    for (guint i = 0; i < 2; i++)
      {
        g_assert_cmpint (lstat (i ? file1 : file0, &st), ==, 0);
        g_assert_true (S_ISREG (st.st_mode));
        g_assert_cmpuint (st.st_mode & 07777, ==, 0600);
      }
  }
  g_assert_false (g_file_test (file0, G_FILE_TEST_EXISTS));
  g_assert_false (g_file_test (file1, G_FILE_TEST_EXISTS));
  g_assert_false (g_file_test (dir0, G_FILE_TEST_EXISTS));
}

/* What a killed run leaves ("stowage-PID-XXXXXX" of a process that is
 * gone, its swap file inside) is removed by the next store in that
 * directory and said; a live process's directory, a name not of that
 * form and a link are left. */
static void
test_stale (Fixture *f, gconstpointer data)
{
  /* PIDs never exceed 2^22 (pid_max's ceiling) */
  g_autofree char *dead
      = g_build_filename (f->dirs[0], "stowage-99999999-Ab12Cd", NULL);
  g_autofree char *dead_file = g_build_filename (dead, "store.swp", NULL);
  g_autofree char *alive_name
      = g_strdup_printf ("stowage-%ld-Xy34Zw", (long)getppid ());
  g_autofree char *alive = g_build_filename (f->dirs[0], alive_name, NULL);
  g_autofree char *other = g_build_filename (f->dirs[0], "stowage-notes", NULL);
  g_autofree char *link
      = g_build_filename (f->dirs[0], "stowage-99999998-Ab12Cd", NULL);
  g_assert_cmpint (g_mkdir (dead, 0700), ==, 0);
  g_assert_true (g_file_set_contents (dead_file, "x", 1, NULL));
  g_assert_cmpint (g_mkdir (alive, 0700), ==, 0);
  g_assert_cmpint (g_mkdir (other, 0700), ==, 0);
  g_assert_cmpint (symlink (other, link), ==, 0);
  {
    g_autoptr (StowNvmeStore) store = make_store (f, 1, 0, 0, 0, FALSE);
    if (store == NULL)
      return;
    const char *note = stow_nvme_store_get_note (store);
    g_assert_nonnull (note);
    g_assert_nonnull (strstr (note, dead));
    g_assert_nonnull (strstr (note, "process 99999999 is gone"));
    g_assert_null (strstr (note, alive));
    /* its own directory carries its PID */
    g_autofree char *mine = g_strdup_printf ("/stowage-%ld-", (long)getpid ());
    g_assert_nonnull (
        strstr (stow_nvme_store_get_private_dir (store, 0), mine));
  }
  g_assert_false (g_file_test (dead, G_FILE_TEST_EXISTS));
  g_assert_true (g_file_test (alive, G_FILE_TEST_IS_DIR));
  g_assert_true (g_file_test (other, G_FILE_TEST_IS_DIR));
  g_assert_true (g_file_test (link, G_FILE_TEST_IS_SYMLINK));
  g_unlink (link);
  g_rmdir (other);
  g_rmdir (alive);
}

static void
test_bad_input (Fixture *f, gconstpointer data)
{
  const char *dirs[] = { f->dirs[0], NULL };
  StowNvmeOptions o = { 0 };
  o.dirs = dirs;
  o.engine = f->engine;
  g_autoptr (GError) error = NULL;
  o.block_bytes = 5000;
  g_assert_null (stow_nvme_store_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "5000"));
  g_clear_error (&error);
  o.block_bytes = 8192;
  o.stripe_bytes = 12288;
  g_assert_null (stow_nvme_store_new (&o, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID);
  g_clear_error (&error);
  const char *missing[] = { "/nonexistent/stowage-test", NULL };
  o.dirs = missing;
  o.stripe_bytes = 0;
  g_assert_null (stow_nvme_store_new (&o, &error));
  g_assert_error (error, G_FILE_ERROR, G_FILE_ERROR_NOENT);
  g_assert_nonnull (strstr (error->message, "/nonexistent/stowage-test"));
  g_clear_error (&error);

  g_autoptr (StowNvmeStore) store = make_store (f, 1, 8192, 0, 2, FALSE);
  if (store == NULL)
    return;
  guint8 *buf = buf_new (8192);
  guint id = stow_nvme_store_add_tensor (store, "x", 8192);
  StowNvmeRequest *req;
  /* Not prepared yet. */
  g_assert_cmpint (stow_nvme_write_async (store, id, 0, buf, 8192, &req), ==,
                   -EINVAL);
  g_assert_false (stow_nvme_store_write (store, id, buf, &error));
  g_assert_nonnull (strstr (error->message, "stow_nvme_store_prepare"));
  g_clear_error (&error);
  /* More than the disk holds: refused by the preflight, by name. */
  stow_nvme_store_add_tensor (store, "huge", G_GUINT64_CONSTANT (1) << 60);
  g_assert_false (stow_nvme_store_prepare (store, &error));
  g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_SPACE);
  g_assert_nonnull (
      strstr (error->message, stow_nvme_store_get_private_dir (store, 0)));
  g_aligned_free (buf);
}

static void
test_exhaustion (Fixture *f, gconstpointer data)
{
  const char *dirs[] = { f->dirs[0], NULL };
  StowNvmeOptions o = { 0 };
  o.dirs = dirs;
  o.engine = f->engine;
  o.block_bytes = 4096;
  o.queue_depth = 1;
  o.max_requests = 2;
  g_autoptr (GError) error = NULL;
  g_autoptr (StowNvmeStore) store = stow_nvme_store_new (&o, &error);
  if (store == NULL)
    {
      g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
      return;
    }
  guint id = add_prepared (store, "x", 64 << 10);
  guint8 *buf = buf_new (64 << 10);
  memset (buf, 1, 64 << 10);
  StowNvmeRequest *r1, *r2, *r3;
  g_assert_cmpint (stow_nvme_write_async (store, id, 0, buf, 32 << 10, &r1), ==,
                   0);
  g_assert_cmpint (
      stow_nvme_write_async (store, id, 32 << 10, buf, 32 << 10, &r2), ==, 0);
  g_assert_cmpint (stow_nvme_write_async (store, id, 0, buf, 4096, &r3), ==,
                   -EAGAIN);
  g_assert_true (stow_nvme_request_wait (store, r1, &error));
  g_assert_true (stow_nvme_request_wait (store, r2, &error));
  g_assert_cmpint (stow_nvme_read_async (store, id, 0, buf, 4096, &r3), ==, 0);
  g_assert_true (stow_nvme_request_wait (store, r3, &error));
  g_assert_no_error (error);
  g_aligned_free (buf);
}

static void
test_buffered (Fixture *f, gconstpointer data)
{
  const char *dirs[] = { f->dirs[0], NULL };
  StowNvmeOptions o = { 0 };
  o.dirs = dirs;
  o.engine = f->engine;
  o.block_bytes = 8192;
  o.buffered = TRUE;
  o.checksum = TRUE;
  g_autoptr (GError) error = NULL;
  g_autoptr (StowNvmeStore) store = stow_nvme_store_new (&o, &error);
  if (store == NULL)
    {
      g_assert_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED);
      g_test_skip (error->message);
      return;
    }
  g_assert_false (stow_nvme_store_is_direct (store));
  guint64 bytes = 3 * 8192 + 5;
  guint id = add_prepared (store, "x", bytes);
  guint8 *src, *dst;
  src_dst_new (bytes, 1, &src, &dst);
  g_assert_true (stow_nvme_store_write (store, id, src, &error));
  g_assert_true (stow_nvme_store_read (store, id, dst, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (src, bytes, dst, bytes);
  g_aligned_free (src);
  g_aligned_free (dst);
}

static void
add (const char *name, StowNvmeEngine engine,
     void (*fn) (Fixture *, gconstpointer))
{
  g_autofree char *path
      = g_strdup_printf ("/nvme/%s/%s", stow_nvme_engine_name (engine), name);
  g_test_add (path, Fixture, GINT_TO_POINTER (engine), fixture_set_up, fn,
              fixture_tear_down);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  StowNvmeEngine engines[]
      = { STOW_NVME_ENGINE_IO_URING, STOW_NVME_ENGINE_THREADS };
  for (guint i = 0; i < G_N_ELEMENTS (engines); i++)
    {
      add ("roundtrip", engines[i], test_roundtrip);
      add ("concurrent", engines[i], test_concurrent);
      add ("partial-ranges", engines[i], test_partial_ranges);
      add ("striping", engines[i], test_striping);
      add ("checksum", engines[i], test_checksum);
      add ("faults", engines[i], test_faults);
      add ("files", engines[i], test_files);
      add ("stale", engines[i], test_stale);
      add ("bad-input", engines[i], test_bad_input);
      add ("exhaustion", engines[i], test_exhaustion);
      add ("buffered", engines[i], test_buffered);
    }
  return g_test_run ();
}
