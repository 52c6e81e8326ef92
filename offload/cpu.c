/* SPDX-License-Identifier: MIT
 *
 * offload/cpu.c: run-time ISA detection and the persistent, hwloc-bound
 * worker pool behind CPU Adam and the memory benchmarks.  A job is handed to
 * the workers by bumping a generation counter under one mutex; the caller
 * sleeps until the last worker reports.  Dispatch costs a few microseconds,
 * nothing next to a step over millions of parameters.
 */
#include "config.h"

#include <hwloc.h>
#include <string.h>

#include "offload/cpu.h"

static const char *const isa_names[STOW_ISA_N]
    = { "scalar", "avx2", "avx512", "avx512-bf16" };

const char *
stow_isa_name (StowIsa isa)
{
  if (isa == STOW_ISA_AUTO)
    return "auto";
  g_return_val_if_fail (isa >= 0 && isa < STOW_ISA_N, "?");
  return isa_names[isa];
}

gboolean
stow_isa_from_name (const char *name, StowIsa *out)
{
  g_return_val_if_fail (name != NULL && out != NULL, FALSE);
  if (strcmp (name, "auto") == 0)
    {
      *out = STOW_ISA_AUTO;
      return TRUE;
    }
  for (int i = 0; i < STOW_ISA_N; i++)
    if (strcmp (name, isa_names[i]) == 0)
      {
        *out = (StowIsa)i;
        return TRUE;
      }
  return FALSE;
}

gboolean
stow_isa_supported (StowIsa isa)
{
  /* __builtin_cpu_supports reads cpuid once (libgcc) and, for the AVX
   * families, also checks XCR0, i.e. that the OS saves the wide registers. */
  __builtin_cpu_init ();
  switch (isa)
    {
    case STOW_ISA_AUTO:
    case STOW_ISA_SCALAR:
      return TRUE;
    case STOW_ISA_AVX2:
      return __builtin_cpu_supports ("avx2") != 0
             && __builtin_cpu_supports ("fma") != 0
             && __builtin_cpu_supports ("f16c") != 0;
    case STOW_ISA_AVX512:
      return __builtin_cpu_supports ("avx512f") != 0;
    case STOW_ISA_AVX512_BF16:
      return __builtin_cpu_supports ("avx512f") != 0
             && __builtin_cpu_supports ("avx512bf16") != 0;
    default:
      return FALSE;
    }
}

StowIsa
stow_isa_best (void)
{
  for (int i = STOW_ISA_N - 1; i > STOW_ISA_SCALAR; i--)
    if (stow_isa_supported ((StowIsa)i))
      return (StowIsa)i;
  return STOW_ISA_SCALAR;
}

void
stow_cpu_partition (guint64 n_blocks, guint index, guint n_threads,
                    guint64 *begin, guint64 *end)
{
  g_assert (n_threads > 0 && index < n_threads);
  /* n_blocks * index stays far below 2^64: blocks are >= 64 elements. */
  *begin = n_blocks * index / n_threads;
  *end = n_blocks * (index + 1) / n_threads;
}

typedef struct
{
  StowCpuPool *pool;
  guint index;
  GThread *thread;
  hwloc_bitmap_t cpuset; /* NULL: not bound */
} Worker;

struct StowCpuPool
{
  guint n_threads;
  guint n_bound;
  hwloc_topology_t topo; /* NULL when binding is off */
  Worker *workers;

  GMutex lock;
  GCond start; /* workers wait here for a new generation */
  GCond done;  /* the caller waits here for pending == 0 */
  guint64 generation;
  guint pending;
  gboolean quit;
  StowCpuJob job;
  gpointer data;
};

static gpointer
worker_main (gpointer data)
{
  Worker *w = data;
  StowCpuPool *pool = w->pool;
  guint64 seen = 0;

  if (w->cpuset != NULL)
    {
      if (hwloc_set_cpubind (pool->topo, w->cpuset, HWLOC_CPUBIND_THREAD) == 0)
        g_atomic_int_inc ((gint *)&pool->n_bound);
      else
        g_debug ("cpu pool: worker %u could not be bound", w->index);
    }

  g_mutex_lock (&pool->lock);
  /* Report readiness (and the binding result) to stow_cpu_pool_new. */
  if (--pool->pending == 0)
    g_cond_signal (&pool->done);
  for (;;)
    {
      while (!pool->quit && pool->generation == seen)
        g_cond_wait (&pool->start, &pool->lock);
      if (pool->quit)
        break;
      seen = pool->generation;
      StowCpuJob job = pool->job;
      gpointer job_data = pool->data;
      g_mutex_unlock (&pool->lock);

      job (job_data, w->index, pool->n_threads);

      g_mutex_lock (&pool->lock);
      if (--pool->pending == 0)
        g_cond_signal (&pool->done);
    }
  g_mutex_unlock (&pool->lock);
  return NULL;
}

static guint
count_cores (hwloc_topology_t topo)
{
  int n = hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_CORE);
  if (n <= 0)
    n = hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_PU);
  return n > 0 ? (guint)n : 1;
}

StowCpuPool *
stow_cpu_pool_new (guint n_threads, gboolean bind, GError **error)
{
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  StowCpuPool *pool = g_new0 (StowCpuPool, 1);
  g_mutex_init (&pool->lock);
  g_cond_init (&pool->start);
  g_cond_init (&pool->done);

  hwloc_topology_t topo = NULL;
  guint n_cores = (guint)g_get_num_processors ();
  if (hwloc_topology_init (&topo) == 0 && hwloc_topology_load (topo) == 0)
    n_cores = count_cores (topo);
  else if (topo != NULL)
    {
      hwloc_topology_destroy (topo);
      topo = NULL;
    }
  if (n_threads == 0)
    n_threads = n_cores;
  pool->n_threads = n_threads;
  if (bind && topo != NULL)
    pool->topo = topo;
  else if (topo != NULL)
    hwloc_topology_destroy (topo);

  pool->workers = g_new0 (Worker, n_threads);
  hwloc_obj_type_t unit
      = pool->topo != NULL
                && hwloc_get_nbobjs_by_type (pool->topo, HWLOC_OBJ_CORE) > 0
            ? HWLOC_OBJ_CORE
            : HWLOC_OBJ_PU;
  for (guint i = 0; i < n_threads; i++)
    {
      Worker *w = &pool->workers[i];
      w->pool = pool;
      w->index = i;
      if (pool->topo != NULL)
        {
          hwloc_obj_t obj
              = hwloc_get_obj_by_type (pool->topo, unit, i % n_cores);
          if (obj != NULL && obj->cpuset != NULL)
            w->cpuset = hwloc_bitmap_dup (obj->cpuset);
        }
    }

  g_mutex_lock (&pool->lock);
  pool->pending = n_threads;
  g_mutex_unlock (&pool->lock);
  for (guint i = 0; i < n_threads; i++)
    {
      Worker *w = &pool->workers[i];
      g_autofree char *name = g_strdup_printf ("stow-cpu-%u", i);
      w->thread = g_thread_try_new (name, worker_main, w, error);
      if (w->thread == NULL)
        {
          /* Threads already started still count down pending; account for
           * the ones that never will, wait, and tear down. */
          g_mutex_lock (&pool->lock);
          pool->pending -= n_threads - i;
          while (pool->pending > 0)
            g_cond_wait (&pool->done, &pool->lock);
          g_mutex_unlock (&pool->lock);
          stow_cpu_pool_free (pool);
          return NULL;
        }
    }
  /* Wait until every worker has tried its binding, so n_bound is final. */
  g_mutex_lock (&pool->lock);
  while (pool->pending > 0)
    g_cond_wait (&pool->done, &pool->lock);
  g_mutex_unlock (&pool->lock);
  return pool;
}

void
stow_cpu_pool_free (StowCpuPool *pool)
{
  if (pool == NULL)
    return;
  g_mutex_lock (&pool->lock);
  pool->quit = TRUE;
  g_cond_broadcast (&pool->start);
  g_mutex_unlock (&pool->lock);
  for (guint i = 0; i < pool->n_threads; i++)
    {
      if (pool->workers[i].thread != NULL)
        g_thread_join (pool->workers[i].thread);
      if (pool->workers[i].cpuset != NULL)
        hwloc_bitmap_free (pool->workers[i].cpuset);
    }
  g_free (pool->workers);
  if (pool->topo != NULL)
    hwloc_topology_destroy (pool->topo);
  g_mutex_clear (&pool->lock);
  g_cond_clear (&pool->start);
  g_cond_clear (&pool->done);
  g_free (pool);
}

guint
stow_cpu_pool_n_threads (const StowCpuPool *pool)
{
  g_return_val_if_fail (pool != NULL, 0);
  return pool->n_threads;
}

guint
stow_cpu_pool_n_bound (const StowCpuPool *pool)
{
  g_return_val_if_fail (pool != NULL, 0);
  return g_atomic_int_get ((gint *)&pool->n_bound);
}

void
stow_cpu_pool_run (StowCpuPool *pool, StowCpuJob job, gpointer data)
{
  g_return_if_fail (pool != NULL && job != NULL);
  g_mutex_lock (&pool->lock);
  g_assert (pool->pending == 0);
  pool->job = job;
  pool->data = data;
  pool->pending = pool->n_threads;
  pool->generation++;
  g_cond_broadcast (&pool->start);
  while (pool->pending > 0)
    g_cond_wait (&pool->done, &pool->lock);
  g_mutex_unlock (&pool->lock);
}
