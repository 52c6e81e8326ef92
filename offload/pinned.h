/* SPDX-License-Identifier: MIT
 *
 * offload/pinned.h: the pinned host pool.  Page-aligned buffers carved from a
 * few large slabs that are placed on one NUMA node (hwloc) and locked: by
 * CUDA (cudaHostRegister) when a device is present, else by mlock.  When the
 * memory-lock limit is too low it says how to raise it and goes on with
 * unpinned memory.  Buffers live as long as the pool: size them up front and
 * reuse them (a small ring), do not pin per tensor.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  STOW_PIN_NONE,  /* ordinary pageable memory */
  STOW_PIN_MLOCK, /* locked with mlock */
  STOW_PIN_CUDA,  /* registered with cudaHostRegister (also locked) */
} StowPinKind;

typedef struct
{
  guint64 slab_bytes; /* each large allocation; 0 = 256 MiB */
  int numa_node;      /* OS index of the node to bind to (e.g. the GPU's);
                         -1 = the calling thread's */
  gboolean no_cuda;   /* do not try cudaHostRegister */
  gboolean defer_pin; /* leave slabs unlocked until stow_pinned_pool_pin():
                         register them with io_uring first, so that the
                         registration is what faults their pages in (on the
                         VM we measured, O_DIRECT reads into such buffers
                         ran 1.7x faster than into mlock-populated ones) */
} StowPinnedOptions;

typedef struct
{
  guint64 reserved_bytes; /* in slabs */
  guint64 used_bytes;     /* handed out, page-rounded */
  guint64 pinned_bytes;   /* of reserved, locked or registered */
  guint n_slabs;
  int numa_node;    /* where the slabs are bound; -1 = not bound */
  StowPinKind kind; /* the weakest kind over the slabs */
} StowPinnedStats;

typedef struct _StowPinnedPool StowPinnedPool;

/* @opts may be NULL for the defaults.  Never fails: binding and pinning are
 * best effort and what was obtained is in the stats. */
StowPinnedPool *stow_pinned_pool_new (const StowPinnedOptions *opts);
void stow_pinned_pool_free (StowPinnedPool *pool);

/* A zero-filled buffer of @bytes, page-aligned (its usable size is @bytes
 * rounded up to the page).  A request over slab_bytes gets its own slab.
 * Returns NULL and sets G_FILE_ERROR_NOMEM when the host is out of memory. */
void *stow_pinned_pool_alloc (StowPinnedPool *pool, guint64 bytes,
                              GError **error);

/* Locks (CUDA or mlock) every slab not locked yet; for defer_pin pools.
 * Best effort, like allocation: see the stats for what was obtained. */
void stow_pinned_pool_pin (StowPinnedPool *pool);

void stow_pinned_pool_get_stats (StowPinnedPool *pool, StowPinnedStats *out);
const char *stow_pin_kind_name (StowPinKind kind);
/* One line for logs: "pinned pool: 1.00 GiB in 4 slabs, mlock, NUMA node 0" */
char *stow_pinned_pool_describe (StowPinnedPool *pool);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowPinnedPool, stow_pinned_pool_free)

/* Implemented in pinned-cuda.c when built with CUDA: TRUE if a device is
 * present and the range was registered. */
gboolean stow_pinned_cuda_register (void *addr, guint64 bytes);
void stow_pinned_cuda_unregister (void *addr);

G_END_DECLS
