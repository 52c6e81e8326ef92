/* SPDX-License-Identifier: MIT
 *
 * offload/pinned.c: the pinned host pool (see pinned.h).  Slabs come from
 * hwloc_alloc_membind on the chosen NUMA node (plain mmap when binding is
 * not supported), are locked once, and are carved by a bump allocator: the
 * executor sizes its staging buffers once, so nothing is ever given back
 * before the pool goes.
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
  guint64 bytes;
  guint64 used;
  StowPinKind kind;
  gboolean from_hwloc;
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
  GArray *slabs; /* of Slab */
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

static gboolean
slab_new (StowPinnedPool *pool, guint64 bytes, Slab *out, GError **error)
{
  memset (out, 0, sizeof *out);
  out->bytes = bytes;
  if (pool->topo_ok && pool->numa_node >= 0)
    {
      hwloc_nodeset_t set = hwloc_bitmap_alloc ();
      hwloc_bitmap_only (set, (unsigned)pool->numa_node);
      out->addr = hwloc_alloc_membind (
          pool->topo, bytes, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
      hwloc_bitmap_free (set);
      if (out->addr != NULL)
        out->from_hwloc = TRUE;
      else
        {
          g_debug ("pinned pool: cannot bind to NUMA node %d: %s",
                   pool->numa_node, g_strerror (errno));
          pool->numa_node = -1;
        }
    }
  if (out->addr == NULL)
    {
      void *p = mmap (NULL, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        {
          g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                       "pinned pool: cannot allocate %" G_GUINT64_FORMAT
                       " bytes of host memory: %s",
                       bytes, g_strerror (errno));
          return FALSE;
        }
      out->addr = p;
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
  if (s->from_hwloc)
    hwloc_free (pool->topo, s->addr, s->bytes);
  else
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
  if (pool->topo_ok || pool->topo != NULL)
    hwloc_topology_destroy (pool->topo);
  g_mutex_clear (&pool->lock);
  g_free (pool);
}

void *
stow_pinned_pool_alloc (StowPinnedPool *pool, guint64 bytes, GError **error)
{
  g_return_val_if_fail (pool != NULL, NULL);
  guint64 page = page_bytes ();
  guint64 need = MAX ((bytes + page - 1) / page * page, page);
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

char *
stow_pinned_pool_describe (StowPinnedPool *pool)
{
  StowPinnedStats st;
  stow_pinned_pool_get_stats (pool, &st);
  char r[STOW_FORMAT_BUF], u[STOW_FORMAT_BUF], n[32];
  if (st.numa_node >= 0)
    g_snprintf (n, sizeof n, "NUMA node %d", st.numa_node);
  else
    g_strlcpy (n, "no NUMA binding", sizeof n);
  return g_strdup_printf (
      "pinned pool: %s in %u slab%s (%s used), %s, %s",
      stow_format_bytes_into (r, sizeof r, st.reserved_bytes), st.n_slabs,
      st.n_slabs == 1 ? "" : "s",
      stow_format_bytes_into (u, sizeof u, st.used_bytes),
      stow_pin_kind_name (st.kind), n);
}
