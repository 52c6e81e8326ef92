/* SPDX-License-Identifier: MIT
 *
 * offload/cpu.h: what the CPU-side offload kernels need from the host: which
 * vector ISA this CPU runs (decided at run time through cpuid, never by build
 * flags) and a persistent pool of worker threads, each bound to one core
 * through hwloc so the same thread touches the same pages every step.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Vector instruction sets the kernels are written for, weakest first.
 * STOW_ISA_AVX2 means AVX2 + FMA + F16C; STOW_ISA_AVX512 means AVX-512F
 * (bf16 rounding done with integer ops); STOW_ISA_AVX512_BF16 adds the
 * AVX512_BF16 conversion instruction. */
typedef enum
{
  STOW_ISA_AUTO = -1, /* the best this CPU supports */
  STOW_ISA_SCALAR = 0,
  STOW_ISA_AVX2,
  STOW_ISA_AVX512,
  STOW_ISA_AVX512_BF16,
  STOW_ISA_N
} StowIsa;

/* "scalar", "avx2", "avx512", "avx512-bf16"; "auto" for STOW_ISA_AUTO. */
const char *stow_isa_name (StowIsa isa);
/* Parses a name above; returns FALSE for an unknown name. */
gboolean stow_isa_from_name (const char *name, StowIsa *out);
/* Whether this CPU (and its OS, which must save the wide registers) can run
 * @isa.  STOW_ISA_SCALAR and STOW_ISA_AUTO are always supported. */
gboolean stow_isa_supported (StowIsa isa);
/* The best ISA this CPU supports. */
StowIsa stow_isa_best (void);

/* A fixed set of worker threads that run one job at a time.  Worker i is
 * bound (when binding is asked for and hwloc allows it) to the i-th core of
 * the process's allowed cpuset, round-robin when there are more workers than
 * cores; the caller's thread is never re-bound.  A pool is not re-entrant:
 * one job at a time, from one caller thread. */
typedef struct StowCpuPool StowCpuPool;

/* Body of a job: worker @index of @n_threads does its share of @data. */
typedef void (*StowCpuJob) (gpointer data, guint index, guint n_threads);

/* @n_threads 0 means one per core of the allowed cpuset.  Sets
 * G_THREAD_ERROR_AGAIN (from GLib) when a thread cannot be created. */
StowCpuPool *stow_cpu_pool_new (guint n_threads, gboolean bind, GError **error);
void stow_cpu_pool_free (StowCpuPool *pool);
guint stow_cpu_pool_n_threads (const StowCpuPool *pool);
/* How many workers hwloc bound to a core (0 when binding was off or the
 * system refused it). */
guint stow_cpu_pool_n_bound (const StowCpuPool *pool);
/* Runs @job on every worker and waits for all of them.  Never allocates. */
void stow_cpu_pool_run (StowCpuPool *pool, StowCpuJob job, gpointer data);

/* The static partition every kernel uses: @n_blocks blocks split into
 * @n_threads contiguous ranges; worker @index gets [*begin, *end).  The same
 * worker therefore always sees the same pages (first touch puts them on its
 * NUMA node). */
void stow_cpu_partition (guint64 n_blocks, guint index, guint n_threads,
                         guint64 *begin, guint64 *end);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowCpuPool, stow_cpu_pool_free)

G_END_DECLS
