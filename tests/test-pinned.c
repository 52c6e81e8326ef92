/* SPDX-License-Identifier: MIT
 *
 * tests/test-pinned.c: the pinned host pool: alignment, accounting, NUMA
 * binding, and the fallback to unpinned memory (with the how-to-fix
 * warning) when RLIMIT_MEMLOCK is too low, checked in a subprocess that
 * lowers the limit and drops CAP_IPC_LOCK; the page kind (THP, hugetlb,
 * ordinary) and its fallbacks: THP "never" (by STOWAGE_THP and by
 * PR_SET_THP_DISABLE), hugetlb with too few pages reserved.
 */
#include "config.h"

#include <linux/capability.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
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

/* The VmFlags line of the mapping that holds @addr in /proc/self/smaps. */
static char *
vm_flags_of (const void *addr)
{
  g_autofree char *smaps = NULL;
  g_assert_true (g_file_get_contents ("/proc/self/smaps", &smaps, NULL, NULL));
  g_auto (GStrv) lines = g_strsplit (smaps, "\n", -1);
  gboolean inside = FALSE;
  for (guint i = 0; lines[i]; i++)
    {
      guint64 s0, e0;
      char c;
      if (sscanf (lines[i],
                  "%" G_GINT64_MODIFIER "x-%" G_GINT64_MODIFIER "x %c", &s0,
                  &e0, &c)
          == 3)
        inside = (guintptr)addr >= s0 && (guintptr)addr < e0;
      else if (inside && g_str_has_prefix (lines[i], "VmFlags:"))
        return g_strdup (lines[i]);
    }
  return g_strdup ("");
}

static guint64
meminfo (const char *key)
{
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents ("/proc/meminfo", &text, NULL, NULL));
  const char *p = strstr (text, key);
  return p ? g_ascii_strtoull (p + strlen (key), NULL, 10) : 0;
}

static void
test_page_names (void)
{
  StowHugePages h;
  const char *names[] = { "auto", "thp", "hugetlb", "off" };
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      g_assert_true (stow_huge_pages_parse (names[i], &h));
      g_assert_cmpstr (stow_huge_pages_name (h), ==, names[i]);
    }
  g_assert_false (stow_huge_pages_parse ("huge", &h));
  g_assert_false (stow_huge_pages_parse (NULL, &h));
  g_assert_cmpstr (stow_page_kind_name (STOW_PAGE_SMALL), ==, "small");
  g_assert_cmpstr (stow_page_kind_name (STOW_PAGE_HUGETLB), ==, "hugetlb");
  g_setenv (STOW_THP_ENV, "madvise", TRUE);
  g_assert_cmpstr (stow_thp_mode (), ==, "madvise");
  g_unsetenv (STOW_THP_ENV);
  const char *m = stow_thp_mode ();
  g_assert_true (g_str_equal (m, "always") || g_str_equal (m, "madvise")
                 || g_str_equal (m, "never"));
}

/* A pool with THP on: slabs start on a 2 MiB boundary and are advised
 * (VmFlags "hg"), and the kind reported is what smaps measures. */
static void
test_thp (void)
{
  if (g_str_equal (stow_thp_mode (), "never"))
    {
      g_test_skip ("transparent huge pages are \"never\" here");
      return;
    }
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  StowPinnedOptions o = { .slab_bytes = 4 << 20,
                          .numa_node = -1,
                          .no_cuda = TRUE,
                          .huge_pages = STOW_HUGE_PAGES_THP };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  guint8 *p = stow_pinned_pool_alloc (pool, 4 << 20, &error);
  g_assert_no_error (error);
  g_assert_cmpuint ((guintptr)p % (2 << 20), ==, 0);
  memset (p, 5, 4 << 20);
  g_autofree char *flags = vm_flags_of (p);
  g_assert_nonnull (strstr (flags, " hg"));
  g_assert_null (stow_pinned_pool_get_page_note (pool));
  guint64 huge = 0;
  StowPageKind k = stow_pinned_pool_get_page_kind (pool, &huge);
  g_assert_cmpuint (huge, <=, 4 << 20);
  g_assert_cmpint (k, !=, STOW_PAGE_HUGETLB);
  g_assert_cmpint (k == STOW_PAGE_SMALL, ==, huge == 0);
  g_assert_cmpint (k == STOW_PAGE_THP, ==, huge == 4 << 20);
  /* Compaction may fail on a fragmented host; then it says so honestly. */
  if (k != STOW_PAGE_THP)
    g_test_message ("THP asked for, %" G_GUINT64_FORMAT " bytes got", huge);
  g_autofree char *text = stow_pinned_pool_describe (pool);
  g_assert_nonnull (strstr (text, stow_page_kind_name (k)));
  g_assert_cmpuint (p[(4 << 20) - 1], ==, 5);
}

/* THP "never" (by the environment): ordinary pages, advised against, a
 * note when THP was asked for by name, and no failure. */
static void
test_thp_never (void)
{
  if (g_test_subprocess ())
    {
      g_setenv (STOW_THP_ENV, "never", TRUE);
      StowPinnedOptions o = { .slab_bytes = 4 << 20,
                              .numa_node = -1,
                              .no_cuda = TRUE,
                              .huge_pages = STOW_HUGE_PAGES_THP };
      g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
      g_autoptr (GError) error = NULL;
      guint8 *p = stow_pinned_pool_alloc (pool, 4 << 20, &error);
      g_assert_no_error (error);
      memset (p, 9, 4 << 20);
      g_autofree char *flags = vm_flags_of (p);
      g_assert_nonnull (strstr (flags, " nh"));
      guint64 huge = 1;
      g_assert_cmpint (stow_pinned_pool_get_page_kind (pool, &huge), ==,
                       STOW_PAGE_SMALL);
      g_assert_cmpuint (huge, ==, 0);
      g_assert_nonnull (
          strstr (stow_pinned_pool_get_page_note (pool), "never"));
      g_autofree char *text = stow_pinned_pool_describe (pool);
      g_assert_nonnull (strstr (text, "(small)"));
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
}

/* THP refused by the kernel for this process (PR_SET_THP_DISABLE): the
 * pool asks, gets ordinary pages, and reports them. */
static void
test_thp_disabled (void)
{
  if (g_test_subprocess ())
    {
      g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
      if (prctl (PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0)
        return;
      StowPinnedOptions o
          = { .slab_bytes = 4 << 20, .numa_node = -1, .no_cuda = TRUE };
      g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
      g_autoptr (GError) error = NULL;
      guint8 *p = stow_pinned_pool_alloc (pool, 4 << 20, &error);
      g_assert_no_error (error);
      memset (p, 3, 4 << 20);
      g_assert_cmpuint (p[12345], ==, 3);
      guint64 huge = 1;
      g_assert_cmpint (stow_pinned_pool_get_page_kind (pool, &huge), ==,
                       STOW_PAGE_SMALL);
      g_assert_cmpuint (huge, ==, 0);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
}

/* hugetlb asked for with too few pages reserved: the pool falls back to
 * THP or ordinary pages, says why, and the memory works. */
static void
test_hugetlb_fallback (void)
{
  g_autofree char *over = NULL;
  if (g_file_get_contents ("/proc/sys/vm/nr_overcommit_hugepages", &over, NULL,
                           NULL)
      && g_ascii_strtoull (over, NULL, 10) > 0)
    {
      g_test_skip ("hugetlb overcommit is on: a big map may succeed");
      return;
    }
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  /* One page more than are free (virtual only: the fallback is touched
   * in one 4 KiB buffer). */
  guint64 slab = (meminfo ("HugePages_Free:") + 1) * (2 << 20);
  StowPinnedOptions o = { .slab_bytes = slab,
                          .numa_node = -1,
                          .no_cuda = TRUE,
                          .defer_pin = TRUE,
                          .huge_pages = STOW_HUGE_PAGES_HUGETLB };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  guint8 *p = stow_pinned_pool_alloc (pool, 4096, &error);
  g_assert_no_error (error);
  g_assert_nonnull (p);
  memset (p, 1, 4096);
  g_assert_cmpint (stow_pinned_pool_get_page_kind (pool, NULL), !=,
                   STOW_PAGE_HUGETLB);
  const char *note = stow_pinned_pool_get_page_note (pool);
  g_assert_nonnull (note);
  g_assert_nonnull (strstr (note, "hugetlb: cannot map"));
  g_assert_nonnull (strstr (note, "nr_hugepages"));
  /* Asked once: a second slab does not try again. */
  g_assert_nonnull (stow_pinned_pool_alloc (pool, slab, &error));
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  g_assert_cmpuint (st.n_slabs, ==, 2);
}

/* hugetlb with pages reserved (skipped where none are). */
static void
test_hugetlb (void)
{
  if (meminfo ("HugePages_Free:") < 2)
    {
      g_test_skip ("no hugetlb pages reserved (/proc/sys/vm/nr_hugepages)");
      return;
    }
  g_test_log_set_fatal_handler (allow_pool_warnings, NULL);
  StowPinnedOptions o = { .slab_bytes = 3 << 20,
                          .numa_node = -1,
                          .no_cuda = TRUE,
                          .huge_pages = STOW_HUGE_PAGES_HUGETLB };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  g_autoptr (GError) error = NULL;
  guint8 *p = stow_pinned_pool_alloc (pool, 4096, &error);
  g_assert_no_error (error);
  memset (p, 1, 4096);
  g_assert_cmpint (stow_pinned_pool_get_page_kind (pool, NULL), ==,
                   STOW_PAGE_HUGETLB);
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  /* Rounded up to whole huge pages. */
  g_assert_cmpuint (st.reserved_bytes, ==, 4 << 20);
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
  g_test_add_func ("/pinned/page-names", test_page_names);
  g_test_add_func ("/pinned/thp", test_thp);
  g_test_add_func ("/pinned/thp-never", test_thp_never);
  g_test_add_func ("/pinned/thp-disabled", test_thp_disabled);
  g_test_add_func ("/pinned/hugetlb-fallback", test_hugetlb_fallback);
  g_test_add_func ("/pinned/hugetlb", test_hugetlb);
  return g_test_run ();
}
