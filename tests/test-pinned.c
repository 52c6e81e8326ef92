/* SPDX-License-Identifier: MIT
 *
 * tests/test-pinned.c: the pinned host pool: alignment, accounting, NUMA
 * binding, and the fallback to unpinned memory (with the how-to-fix
 * warning) when RLIMIT_MEMLOCK is too low, checked in a subprocess that
 * lowers the limit and drops CAP_IPC_LOCK.
 */
#include "config.h"

#include <linux/capability.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <glib.h>

#include "offload/pinned.h"

static gboolean
allow_pool_warnings (const char *domain, GLogLevelFlags level,
                     const char *message, gpointer data)
{
  return strstr (message, "pinned pool:") == NULL;
}

static void
test_alignment_accounting (void)
{
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  StowPinnedOptions o
      = { .slab_bytes = 1 << 20, .numa_node = -1, .no_cuda = TRUE };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  guint64 page = (guint64)sysconf (_SC_PAGESIZE);
  g_autoptr (GError) error = NULL;
  guint8 *a = stow_pinned_pool_alloc (pool, 100, &error);
  guint8 *b = stow_pinned_pool_alloc (pool, page + 1, &error);
  guint8 *c = stow_pinned_pool_alloc (pool, 3 << 20, &error);
  g_assert_no_error (error);
  g_assert_nonnull (a);
  g_assert_nonnull (b);
  g_assert_nonnull (c);
  g_assert_cmpuint ((guintptr)a % page, ==, 0);
  g_assert_cmpuint ((guintptr)b % page, ==, 0);
  g_assert_cmpuint ((guintptr)c % page, ==, 0);
  /* Carved from one slab, page after page; the big one has its own. */
  g_assert_true (b == a + page);
  for (guint i = 0; i < 100; i++)
    g_assert_cmpuint (a[i], ==, 0);
  memset (a, 1, 100);
  memset (b, 2, page + 1);
  memset (c, 3, 3 << 20);
  g_assert_cmpuint (a[99], ==, 1);

  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  g_assert_cmpuint (st.n_slabs, ==, 2);
  g_assert_cmpuint (st.reserved_bytes, ==, (1 << 20) + (3 << 20));
  g_assert_cmpuint (st.used_bytes, ==, page + 2 * page + (3 << 20));
  if (st.kind == STOW_PIN_NONE)
    g_assert_cmpuint (st.pinned_bytes, <, st.reserved_bytes);
  else
    g_assert_cmpuint (st.pinned_bytes, ==, st.reserved_bytes);

  /* A small request after the big one goes back into the first slab. */
  guint8 *d = stow_pinned_pool_alloc (pool, 10, &error);
  g_assert_true (d == a + 3 * page);
  g_autofree char *text = stow_pinned_pool_describe (pool);
  g_assert_nonnull (strstr (text, "4.00 MiB in 2 slabs"));
}

static void
test_numa (void)
{
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  /* Node 0 exists on every Linux machine; binding may still be refused
   * (no NUMA support), in which case the pool says it is not bound. */
  StowPinnedOptions o
      = { .slab_bytes = 1 << 20, .numa_node = 0, .no_cuda = TRUE };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  g_assert_nonnull (stow_pinned_pool_alloc (pool, 4096, &error));
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  g_assert_true (st.numa_node == 0 || st.numa_node == -1);
  g_autofree char *text = stow_pinned_pool_describe (pool);
  g_assert_nonnull (
      strstr (text, st.numa_node == 0 ? "NUMA node 0" : "no NUMA binding"));

  /* A node that is not there: the calling thread's node instead. */
  if (g_test_subprocess ())
    {
      o.numa_node = 4000;
      g_autoptr (StowPinnedPool) p2 = stow_pinned_pool_new (&o);
      StowPinnedStats s2;
      stow_pinned_pool_get_stats (p2, &s2);
      g_assert_cmpint (s2.numa_node, !=, 4000);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  g_test_trap_assert_stderr ("*NUMA node 4000 does not exist*");
}

static void
drop_ipc_lock (void)
{
  /* Root (CAP_IPC_LOCK) ignores RLIMIT_MEMLOCK; drop the capability so
   * the limit bites as it does for an ordinary user. */
  struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
  struct __user_cap_data_struct d[2];
  g_assert_cmpint (syscall (SYS_capget, &h, d), ==, 0);
  d[CAP_TO_INDEX (CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK (CAP_IPC_LOCK);
  d[CAP_TO_INDEX (CAP_IPC_LOCK)].permitted &= ~CAP_TO_MASK (CAP_IPC_LOCK);
  g_assert_cmpint (syscall (SYS_capset, &h, d), ==, 0);
}

static void
test_memlock_fallback (void)
{
  if (g_test_subprocess ())
    {
      g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
      drop_ipc_lock ();
      struct rlimit rl;
      g_assert_cmpint (getrlimit (RLIMIT_MEMLOCK, &rl), ==, 0);
      rl.rlim_cur = 64 << 10;
      g_assert_cmpint (setrlimit (RLIMIT_MEMLOCK, &rl), ==, 0);

      StowPinnedOptions o
          = { .slab_bytes = 2 << 20, .numa_node = -1, .no_cuda = TRUE };
      g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
      g_autoptr (GError) error = NULL;
      guint8 *p = stow_pinned_pool_alloc (pool, 1 << 20, &error);
      g_assert_no_error (error);
      g_assert_nonnull (p);
      memset (p, 7, 1 << 20);
      g_assert_cmpuint (p[(1 << 20) - 1], ==, 7);
      /* The warning is given once, not per slab. */
      g_assert_nonnull (stow_pinned_pool_alloc (pool, 3 << 20, &error));
      StowPinnedStats st;
      stow_pinned_pool_get_stats (pool, &st);
      g_assert_cmpint (st.kind, ==, STOW_PIN_NONE);
      g_assert_cmpuint (st.pinned_bytes, ==, 0);
      g_assert_cmpuint (st.used_bytes, ==, (1 << 20) + (3 << 20));
      g_autofree char *text = stow_pinned_pool_describe (pool);
      g_assert_nonnull (strstr (text, "not pinned"));
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  /* Names the limit, the bytes needed and the three ways to raise it. */
  g_test_trap_assert_stderr ("*cannot lock 2.00 MiB*RLIMIT_MEMLOCK is 64.00 "
                             "KiB*at least * bytes are needed*ulimit -l*"
                             "limits.conf*LimitMEMLOCK*unpinned*");
  g_test_trap_assert_stderr_unmatched ("*cannot lock*cannot lock*");
}

static void
test_defer_pin (void)
{
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  StowPinnedOptions o = {
    .slab_bytes = 1 << 20, .numa_node = -1, .no_cuda = TRUE, .defer_pin = TRUE
  };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  g_assert_nonnull (stow_pinned_pool_alloc (pool, 4096, &error));
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  /* Nothing is locked until asked. */
  g_assert_cmpint (st.kind, ==, STOW_PIN_NONE);
  g_assert_cmpuint (st.pinned_bytes, ==, 0);
  stow_pinned_pool_pin (pool);
  stow_pinned_pool_get_stats (pool, &st);
  struct rlimit rl;
  g_assert_cmpint (getrlimit (RLIMIT_MEMLOCK, &rl), ==, 0);
  /* With room under the limit (and nothing else of ours locked), the
   * slab must now be locked. */
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (8u << 20))
    {
      g_assert_cmpint (st.kind, ==, STOW_PIN_MLOCK);
      g_assert_cmpuint (st.pinned_bytes, ==, 1 << 20);
    }
  /* A slab made later waits for the next call too. */
  g_assert_nonnull (stow_pinned_pool_alloc (pool, 2 << 20, &error));
  stow_pinned_pool_get_stats (pool, &st);
  g_assert_cmpint (st.kind, ==, STOW_PIN_NONE);
  g_assert_cmpuint (st.pinned_bytes, <, st.reserved_bytes);
}

static void
test_cuda (void)
{
  if (!STOW_HAVE_CUDA)
    {
      g_test_skip ("built without CUDA");
      return;
    }
  if (!g_file_test ("/dev/nvidia0", G_FILE_TEST_EXISTS))
    {
      g_test_skip ("no NVIDIA device here");
      return;
    }
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  StowPinnedOptions o = { .slab_bytes = 8 << 20, .numa_node = -1 };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  guint8 *p = stow_pinned_pool_alloc (pool, 1 << 20, &error);
  g_assert_nonnull (p);
  memset (p, 1, 1 << 20);
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  /* With a device, slabs are registered with CUDA, not just mlocked. */
  g_assert_cmpint (st.kind, ==, STOW_PIN_CUDA);
  g_assert_cmpuint (st.pinned_bytes, ==, 8 << 20);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/pinned/alignment-accounting", test_alignment_accounting);
  g_test_add_func ("/pinned/numa", test_numa);
  g_test_add_func ("/pinned/memlock-fallback", test_memlock_fallback);
  g_test_add_func ("/pinned/defer-pin", test_defer_pin);
  g_test_add_func ("/pinned/cuda", test_cuda);
  return g_test_run ();
}
