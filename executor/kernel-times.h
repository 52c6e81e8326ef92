/* SPDX-License-Identifier: MIT
 *
 * executor/kernel-times.h: a kernel table (executor/kernels.h) that times
 * every call of another one, for the benches: which entry, when, its wall
 * time and, for a GEMM, its shape and operand types, kept in memory and
 * written out as JSON lines.  The cpu runtime hands it out in place of its
 * own table when STOWAGE_KERNEL_TIMES names a file (llama-cpu.c), so the
 * untimed path costs nothing.  Wall time is the kernel's for a provider
 * whose calls return when done (the cpu's); not for cuda's.
 */
#pragma once

#include <glib.h>

#include "executor/kernels.h"

G_BEGIN_DECLS

typedef struct StowKernelTimes StowKernelTimes;

/* Times the calls of @inner's entries on @inner_ctx: give the decoder
 * stow_kernel_times_table () with the result as its ctx.  Calls may come
 * from several threads. */
StowKernelTimes *stow_kernel_times_new (const StowKernels *inner,
                                        void *inner_ctx);
void stow_kernel_times_free (StowKernelTimes *t);

/* The timing table; its ctx is a StowKernelTimes.  Its entries are those
 * of kernels.h, each calling the inner table's (failed too, untimed). */
const StowKernels *stow_kernel_times_table (void);

typedef struct
{
  guint64 calls;
  double seconds; /* wall time, summed over the calls */
  double flops;   /* 2 M N K summed, for gemm; 0 for the others */
} StowKernelTotal;

/* The totals of @entry ("gemm", "rmsnorm", ... as kernels.h names the
 * fields) so far; FALSE for a name the table does not have. */
gboolean stow_kernel_times_total (const StowKernelTimes *t, const char *entry,
                                  StowKernelTotal *total);

/* Appends to @path a line {"kernel_times": 1, @header's members} (@header:
 * "\"key\": value, ..." or NULL), then one line per call, in order:
 * {"entry": "gemm", "t0_ns": 12, "ns": 345, "cpu_ns": 678, "m": 512,
 * "n": 768, "k": 768, "a_bf16": false, "b_bf16": false, "c_bf16": false}
 * (the last six for gemm only; t0_ns from the monotonic clock, ns the
 * call's wall time, cpu_ns the process's CPU time over the call, every
 * thread's: on a machine other work loads, what the call would take on
 * cores of its own, times the threads).  FALSE and @error (the
 * path) when the file cannot be written. */
gboolean stow_kernel_times_write (const StowKernelTimes *t, const char *path,
                                  const char *header, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowKernelTimes, stow_kernel_times_free)

G_END_DECLS
