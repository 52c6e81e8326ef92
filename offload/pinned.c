/* SPDX-License-Identifier: MIT
 *
 * offload/pinned.c: the pinned host pool (see pinned.h).  Slabs come from
 * mmap, 2 MiB-aligned and advised for transparent huge pages (or from the
 * hugetlb pool when asked), are bound to the chosen NUMA node through hwloc
 * before their first touch, are locked once, and are carved by a bump
 * allocator: the executor sizes its staging buffers once, so nothing is ever
 * given back before the pool goes.
 */
#include "config.h"

#include "offload/pinned.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <hwloc.h>

#include "core/units.h"

typedef struct
{
  guint8 *addr;
  guint64 bytes; /* usable; for hugetlb slabs a multiple of the huge page */
  guint64 used;
  StowPinKind kind;
  gboolean hugetlb; /* from the hugetlb pool */
} Slab;

struct _StowPinnedPool
{
  GMutex lock;
  hwloc_topology_t topo;
  gboolean topo_ok;
  int numa_node; /* bound to, or -1 */
  guint64 slab_bytes;
  gboolean no_cuda;
  gboolean defer_pin;
  gboolean warned;
  StowHugePages huge_pages;
  gboolean hugetlb_failed; /* stop asking after the first refusal */
  guint64 hpage;           /* the huge page, bytes (2 MiB on x86-64) */
  char *page_note;         /* why the pool got less than it asked for */
  GArray *slabs;           /* of Slab */
};

static guint64
page_bytes (void)
{
  long p = sysconf (_SC_PAGESIZE);
  return p > 0 ? (guint64)p : 4096;
}

const char *
stow_pin_kind_name (StowPinKind kind)
{
  switch (kind)
    {
    case STOW_PIN_CUDA:
      return "cudaHostRegister";
    case STOW_PIN_MLOCK:
      return "mlock";
    case STOW_PIN_NONE:
    default:
      return "not pinned";
    }
}

const char *
stow_page_kind_name (StowPageKind kind)
{
  switch (kind)
    {
    case STOW_PAGE_HUGETLB:
      return "hugetlb";
    case STOW_PAGE_THP:
      return "thp";
    case STOW_PAGE_MIXED:
      return "mixed";
    case STOW_PAGE_SMALL:
    default:
      return "small";
    }
}

static const char *const huge_names[] = {
  [STOW_HUGE_PAGES_AUTO] = "auto",
  [STOW_HUGE_PAGES_THP] = "thp",
  [STOW_HUGE_PAGES_HUGETLB] = "hugetlb",
  [STOW_HUGE_PAGES_OFF] = "off",
};

const char *
stow_huge_pages_name (StowHugePages mode)
{
  return (guint)mode < G_N_ELEMENTS (huge_names) ? huge_names[mode] : "?";
}

gboolean
stow_huge_pages_parse (const char *text, StowHugePages *out)
{
  g_return_val_if_fail (out != NULL, FALSE);
  for (guint i = 0; text != NULL && i < G_N_ELEMENTS (huge_names); i++)
    if (g_str_equal (text, huge_names[i]))
      {
        *out = (StowHugePages)i;
        return TRUE;
      }
  return FALSE;
}

const char *
stow_thp_mode (void)
{
  static const char *const modes[] = { "always", "madvise", "never" };
  const char *env = g_getenv (STOW_THP_ENV);
  g_autofree char *text = NULL;
  if (env == NULL
      && !g_file_get_contents ("/sys/kernel/mm/transparent_hugepage/enabled",
                               &text, NULL, NULL))
    return "never";
  for (guint i = 0; i < G_N_ELEMENTS (modes); i++)
    {
      if (env != NULL && g_str_equal (env, modes[i]))
        return modes[i];
      /* sysfs brackets the mode in force: "always [madvise] never" */
      g_autofree char *br = g_strdup_printf ("[%s]", modes[i]);
      if (text != NULL && strstr (text, br) != NULL)
        return modes[i];
    }
  return "never";
}

/* The PMD-sized huge page: THP's size, and the hugetlb default here. */
static guint64
huge_page_bytes (void)
{
  g_autofree char *text = NULL;
  guint64 v = 0;
  if (g_file_get_contents ("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size",
                           &text, NULL, NULL))
    v = g_ascii_strtoull (text, NULL, 10);
  return v >= 4096 && (v & (v - 1)) == 0 ? v : 2u << 20;
}

static guint64
meminfo_value (const char *key)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents ("/proc/meminfo", &text, NULL, NULL))
    return 0;
  const char *p = strstr (text, key);
  return p ? g_ascii_strtoull (p + strlen (key), NULL, 10) : 0;
}

static void
set_note (StowPinnedPool *pool, char *note)
{
  if (pool->page_note == NULL)
    {
      g_info ("pinned pool: %s", note);
      pool->page_note = note;
    }
  else
    g_free (note);
}

/* The node to bind to: the one asked for, else the node of the CPU the
 * calling thread last ran on. */
static int
choose_node (StowPinnedPool *pool, int wanted)
{
  if (!pool->topo_ok)
    return -1;
  if (wanted >= 0)
    {
      if (hwloc_get_numanode_obj_by_os_index (pool->topo, (unsigned)wanted)
          != NULL)
        return wanted;
      g_warning ("pinned pool: NUMA node %d does not exist here; binding to "
                 "the calling thread's node instead",
                 wanted);
    }
  int node = -1;
  hwloc_cpuset_t cpus = hwloc_bitmap_alloc ();
  hwloc_nodeset_t nodes = hwloc_bitmap_alloc ();
  if (hwloc_get_last_cpu_location (pool->topo, cpus, HWLOC_CPUBIND_THREAD) == 0)
    {
      hwloc_cpuset_to_nodeset (pool->topo, cpus, nodes);
      node = hwloc_bitmap_first (nodes);
    }
  hwloc_bitmap_free (cpus);
  hwloc_bitmap_free (nodes);
  return node;
}

StowPinnedPool *
stow_pinned_pool_new (const StowPinnedOptions *opts)
{
  StowPinnedPool *pool = g_new0 (StowPinnedPool, 1);
  g_mutex_init (&pool->lock);
  guint64 page = page_bytes ();
  guint64 slab = opts && opts->slab_bytes ? opts->slab_bytes : 256u << 20;
  pool->slab_bytes = (slab + page - 1) / page * page;
  pool->no_cuda = opts ? opts->no_cuda : FALSE;
  pool->defer_pin = opts ? opts->defer_pin : FALSE;
  pool->huge_pages = opts ? opts->huge_pages : STOW_HUGE_PAGES_AUTO;
  pool->hpage = huge_page_bytes ();
  pool->slabs = g_array_new (FALSE, TRUE, sizeof (Slab));
  pool->topo_ok = hwloc_topology_init (&pool->topo) == 0
                  && hwloc_topology_load (pool->topo) == 0;
  pool->numa_node = choose_node (pool, opts ? opts->numa_node : -1);
  return pool;
}

static guint64
locked_now (void)
{
  /* VmLck in /proc/self/status: what this process has locked already. */
  g_autofree char *status = NULL;
  if (!g_file_get_contents ("/proc/self/status", &status, NULL, NULL))
    return 0;
  const char *p = strstr (status, "VmLck:");
  return p ? g_ascii_strtoull (p + 6, NULL, 10) * 1024 : 0;
}

static void
warn_memlock (StowPinnedPool *pool, guint64 bytes, int err)
{
  if (pool->warned)
    return;
  pool->warned = TRUE;
  struct rlimit rl = { 0, 0 };
  getrlimit (RLIMIT_MEMLOCK, &rl);
  char lim[STOW_FORMAT_BUF], need[STOW_FORMAT_BUF], want[STOW_FORMAT_BUF];
  guint64 needed = locked_now () + bytes;
  if (rl.rlim_cur == RLIM_INFINITY)
    g_strlcpy (lim, "unlimited", sizeof lim);
  else
    stow_format_bytes_into (lim, sizeof lim, (guint64)rl.rlim_cur);
  stow_format_bytes_into (want, sizeof want, bytes);
  /* ulimit -l takes KiB. */
  g_snprintf (need, sizeof need, "%" G_GUINT64_FORMAT, (needed + 1023) / 1024);
  g_warning ("pinned pool: cannot lock %s of host memory (mlock: %s); "
             "RLIMIT_MEMLOCK is %s and at least %" G_GUINT64_FORMAT
             " bytes are needed.  Raise it with 'ulimit -l %s' (KiB) or "
             "'ulimit -l unlimited', a '* - memlock unlimited' line in "
             "/etc/security/limits.conf, or LimitMEMLOCK=infinity in the "
             "systemd unit.  Going on with unpinned memory: host-device "
             "copies will be slower and the pages may be swapped out",
             want, g_strerror (err), lim, needed, need);
}

static void
slab_pin (StowPinnedPool *pool, Slab *s)
{
  if (s->kind != STOW_PIN_NONE)
    return;
#if STOW_HAVE_CUDA
  if (!pool->no_cuda && stow_pinned_cuda_register (s->addr, s->bytes))
    {
      s->kind = STOW_PIN_CUDA;
      return;
    }
#endif
  /* The system call itself: sanitizers intercept mlock() and turn it
   * into a no-op that always succeeds. */
  if (syscall (SYS_mlock, s->addr, (size_t)s->bytes) == 0)
    s->kind = STOW_PIN_MLOCK;
  else
    warn_memlock (pool, s->bytes, errno);
}

/* Maps @bytes from the hugetlb pool, or returns NULL (and says why, once). */
static guint8 *
map_hugetlb (StowPinnedPool *pool, guint64 *bytes)
{
  if (pool->hugetlb_failed)
    return NULL;
  guint64 len = (*bytes + pool->hpage - 1) / pool->hpage * pool->hpage;
  void *p = mmap (NULL, len, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (p == MAP_FAILED)
    {
      int e = errno;
      pool->hugetlb_failed = TRUE;
      set_note (pool,
                g_strdup_printf ("hugetlb: cannot map %" G_GUINT64_FORMAT
                                 " bytes (%s; HugePages_Free %" G_GUINT64_FORMAT
                                 "); reserve pages with 'echo N > "
                                 "/proc/sys/vm/nr_hugepages'; using THP or "
                                 "ordinary pages instead",
                                 len, g_strerror (e),
                                 meminfo_value ("HugePages_Free:")));
      return NULL;
    }
  *bytes = len;
  return p;
}

/* Maps @bytes of anonymous memory starting on a huge-page boundary, so that
 * every whole 2 MiB of it can be one THP, and advises the kernel one way or
 * the other so that the kind does not depend on the neighbours. */
static guint8 *
map_thp_aligned (StowPinnedPool *pool, guint64 bytes, int *err)
{
  guint64 align = bytes >= pool->hpage ? pool->hpage : 0;
  guint8 *p = mmap (NULL, bytes + align, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    {
      *err = errno;
      return NULL;
    }
  guint8 *a = p;
  if (align)
    {
      a = (guint8 *)(((guintptr)p + align - 1) & ~(guintptr)(align - 1));
      if (a > p)
        munmap (p, a - p);
      if (p + align > a)
        munmap (a + bytes, (p + align) - a);
    }
  const char *thp = stow_thp_mode ();
  gboolean want
      = pool->huge_pages != STOW_HUGE_PAGES_OFF && !g_str_equal (thp, "never");
  if (pool->huge_pages != STOW_HUGE_PAGES_OFF && !want)
    {
      if (pool->huge_pages == STOW_HUGE_PAGES_THP
          || pool->huge_pages == STOW_HUGE_PAGES_HUGETLB)
        set_note (pool, g_strdup ("THP is \"never\" here; ordinary pages"));
    }
  if (madvise (a, bytes, want ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0 && want)
    set_note (pool, g_strdup_printf ("madvise (MADV_HUGEPAGE): %s; ordinary "
                                     "pages",
                                     g_strerror (errno)));
  return a;
}

static gboolean
slab_new (StowPinnedPool *pool, guint64 bytes, Slab *out, GError **error)
{
  memset (out, 0, sizeof *out);
  out->bytes = bytes;
  if (pool->huge_pages == STOW_HUGE_PAGES_HUGETLB)
    {
      out->addr = map_hugetlb (pool, &out->bytes);
      out->hugetlb = out->addr != NULL;
    }
  if (out->addr == NULL)
    {
      int e = 0;
      out->addr = map_thp_aligned (pool, bytes, &e);
      if (out->addr == NULL)
        {
          g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                       "pinned pool: cannot allocate %" G_GUINT64_FORMAT
                       " bytes of host memory: %s",
                       bytes, g_strerror (e));
          return FALSE;
        }
    }
  /* Bound before the first touch, so that the pages come from the node. */
  if (pool->topo_ok && pool->numa_node >= 0)
    {
      hwloc_nodeset_t set = hwloc_bitmap_alloc ();
      hwloc_bitmap_only (set, (unsigned)pool->numa_node);
      if (hwloc_set_area_membind (pool->topo, out->addr, out->bytes, set,
                                  HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET)
          != 0)
        {
          g_debug ("pinned pool: cannot bind to NUMA node %d: %s",
                   pool->numa_node, g_strerror (errno));
          pool->numa_node = -1;
        }
      hwloc_bitmap_free (set);
    }

  out->kind = STOW_PIN_NONE;
  if (!pool->defer_pin)
    slab_pin (pool, out);
  return TRUE;
}

static void
slab_free (StowPinnedPool *pool, Slab *s)
{
#if STOW_HAVE_CUDA
  if (s->kind == STOW_PIN_CUDA)
    stow_pinned_cuda_unregister (s->addr);
#endif
  if (s->kind == STOW_PIN_MLOCK)
    syscall (SYS_munlock, s->addr, (size_t)s->bytes);
  munmap (s->addr, s->bytes);
}

void
stow_pinned_pool_free (StowPinnedPool *pool)
{
  if (pool == NULL)
    return;
  for (guint i = 0; i < pool->slabs->len; i++)
    slab_free (pool, &g_array_index (pool->slabs, Slab, i));
  g_array_unref (pool->slabs);
  g_free (pool->page_note);
  if (pool->topo_ok || pool->topo != NULL)
    hwloc_topology_destroy (pool->topo);
  g_mutex_clear (&pool->lock);
  g_free (pool);
}

guint64
stow_pinned_span (guint64 bytes)
{
  guint64 page = page_bytes ();
  return MAX ((bytes + page - 1) / page * page, page);
}

void *
stow_pinned_pool_alloc (StowPinnedPool *pool, guint64 bytes, GError **error)
{
  g_return_val_if_fail (pool != NULL, NULL);
  guint64 need = stow_pinned_span (bytes);
  void *p = NULL;
  g_mutex_lock (&pool->lock);
  for (guint i = 0; i < pool->slabs->len && p == NULL; i++)
    {
      Slab *s = &g_array_index (pool->slabs, Slab, i);
      if (s->bytes - s->used >= need)
        {
          p = s->addr + s->used;
          s->used += need;
        }
    }
  if (p == NULL)
    {
      Slab s;
      if (slab_new (pool, MAX (need, pool->slab_bytes), &s, error))
        {
          s.used = need;
          p = s.addr;
          g_array_append_val (pool->slabs, s);
        }
    }
  g_mutex_unlock (&pool->lock);
  return p;
}

void
stow_pinned_pool_pin (StowPinnedPool *pool)
{
  g_return_if_fail (pool != NULL);
  g_mutex_lock (&pool->lock);
  for (guint i = 0; i < pool->slabs->len; i++)
    slab_pin (pool, &g_array_index (pool->slabs, Slab, i));
  g_mutex_unlock (&pool->lock);
}

void
stow_pinned_pool_get_stats (StowPinnedPool *pool, StowPinnedStats *out)
{
  g_return_if_fail (pool != NULL && out != NULL);
  memset (out, 0, sizeof *out);
  g_mutex_lock (&pool->lock);
  out->n_slabs = pool->slabs->len;
  out->numa_node = pool->numa_node;
  out->kind = pool->slabs->len ? STOW_PIN_CUDA : STOW_PIN_NONE;
  for (guint i = 0; i < pool->slabs->len; i++)
    {
      Slab *s = &g_array_index (pool->slabs, Slab, i);
      out->reserved_bytes += s->bytes;
      out->used_bytes += s->used;
      if (s->kind != STOW_PIN_NONE)
        out->pinned_bytes += s->bytes;
      out->kind = MIN (out->kind, s->kind);
    }
  g_mutex_unlock (&pool->lock);
}

/* Bytes of [@a, @a + @len) on transparent huge pages, from the text of
 * /proc/self/smaps: each mapping's AnonHugePages, shared out over the part
 * of the mapping that lies in the range (neighbouring slabs with the same
 * flags share one mapping). */
static guint64
smaps_huge_bytes (const char *smaps, guint64 a, guint64 len)
{
  guint64 total = 0, vs = 0, ve = 0;
  for (const char *line = smaps; line && *line;)
    {
      const char *nl = strchr (line, '\n');
      guint64 s0, e0;
      char c;
      if (sscanf (line, "%" G_GINT64_MODIFIER "x-%" G_GINT64_MODIFIER "x %c",
                  &s0, &e0, &c)
          == 3)
        vs = s0, ve = e0;
      else if (g_str_has_prefix (line, "AnonHugePages:") && ve > vs)
        {
          guint64 lo = MAX (vs, a), hi = MIN (ve, a + len);
          guint64 huge = g_ascii_strtoull (line + 14, NULL, 10) * 1024;
          if (hi > lo && huge > 0)
            total += (guint64)((double)huge * (hi - lo) / (ve - vs));
        }
      line = nl ? nl + 1 : NULL;
    }
  return MIN (total, len);
}

StowPageKind
stow_pinned_pool_get_page_kind (StowPinnedPool *pool, guint64 *huge_bytes)
{
  g_return_val_if_fail (pool != NULL, STOW_PAGE_SMALL);
  g_autofree char *smaps = NULL;
  guint64 huge = 0, total = 0;
  gboolean all_hugetlb = TRUE;
  g_mutex_lock (&pool->lock);
  for (guint i = 0; i < pool->slabs->len; i++)
    {
      Slab *s = &g_array_index (pool->slabs, Slab, i);
      total += s->bytes;
      if (s->hugetlb)
        {
          huge += s->bytes;
          continue;
        }
      all_hugetlb = FALSE;
      if (smaps == NULL
          && !g_file_get_contents ("/proc/self/smaps", &smaps, NULL, NULL))
        smaps = g_strdup ("");
      huge += smaps_huge_bytes (smaps, (guintptr)s->addr, s->bytes);
    }
  g_mutex_unlock (&pool->lock);
  if (huge_bytes)
    *huge_bytes = huge;
  if (total == 0 || huge == 0)
    return STOW_PAGE_SMALL;
  if (all_hugetlb)
    return STOW_PAGE_HUGETLB;
  return huge >= total ? STOW_PAGE_THP : STOW_PAGE_MIXED;
}

const char *
stow_pinned_pool_get_page_note (StowPinnedPool *pool)
{
  g_return_val_if_fail (pool != NULL, NULL);
  return pool->page_note;
}

char *
stow_pinned_pool_describe (StowPinnedPool *pool)
{
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  guint64 huge = 0;
  StowPageKind pk = stow_pinned_pool_get_page_kind (pool, &huge);
  char r[STOW_FORMAT_BUF], u[STOW_FORMAT_BUF], h[STOW_FORMAT_BUF], n[32];
  if (st.numa_node >= 0)
    g_snprintf (n, sizeof n, "NUMA node %d", st.numa_node);
  else
    g_strlcpy (n, "no NUMA binding", sizeof n);
  g_autofree char *pages = NULL;
  if (pk == STOW_PAGE_SMALL)
    pages
        = g_strdup_printf ("%s pages (small)",
                           stow_format_bytes_into (h, sizeof h, page_bytes ()));
  else if (pk == STOW_PAGE_MIXED)
    pages = g_strdup_printf ("%s on 2 MiB pages (mixed)",
                             stow_format_bytes_into (h, sizeof h, huge));
  else
    pages = g_strdup_printf ("2 MiB pages (%s)", stow_page_kind_name (pk));
  return g_strdup_printf (
      "pinned pool: %s in %u slab%s (%s used), %s, %s, %s",
      stow_format_bytes_into (r, sizeof r, st.reserved_bytes), st.n_slabs,
      st.n_slabs == 1 ? "" : "s",
      stow_format_bytes_into (u, sizeof u, st.used_bytes),
      stow_pin_kind_name (st.kind), n, pages);
}
