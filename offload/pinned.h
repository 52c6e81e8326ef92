/* SPDX-License-Identifier: MIT
 *
 * offload/pinned.h: the pinned host pool.  Page-aligned buffers carved from a
 * few large slabs that are placed on one NUMA node (hwloc) and locked: by
 * CUDA (cudaHostRegister) when a device is present, else by mlock.  When the
 * memory-lock limit is too low it says how to raise it and goes on with
 * unpinned memory.  Buffers live as long as the pool: size them up front and
 * reuse them (a small ring), do not pin per tensor.
 *
 * Slabs are backed by 2 MiB pages where the kernel gives them: transparent
 * huge pages (madvise on 2 MiB-aligned slabs) when THP is "always" or
 * "madvise", hugetlb pages when asked for and reserved, ordinary pages
 * otherwise.  O_DIRECT requests into physically contiguous buffers cost the
 * disk less per byte (issue 26: 3.7-4.9 GB/s on 2 MiB pages against 0.7-2.1
 * on 4 KiB ones, on the virtio disk we measured), so the page kind decides
 * the NVMe figure.  The pool never fails for lack of huge pages: it falls
 * back and says what it got (stow_pinned_pool_get_page_kind).
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

/* What the pool asks the kernel for. */
typedef enum
{
  STOW_HUGE_PAGES_AUTO,    /* THP where the kernel offers it, else ordinary */
  STOW_HUGE_PAGES_THP,     /* the same, said when it cannot be had */
  STOW_HUGE_PAGES_HUGETLB, /* reserved hugetlb pages (MAP_HUGETLB); without
                              enough of them, as AUTO */
  STOW_HUGE_PAGES_OFF,     /* ordinary pages only (MADV_NOHUGEPAGE) */
} StowHugePages;

/* What the pool got, measured on its resident pages. */
typedef enum
{
  STOW_PAGE_SMALL,   /* the base page (4 KiB) everywhere */
  STOW_PAGE_MIXED,   /* some, not all, bytes on 2 MiB pages */
  STOW_PAGE_THP,     /* every byte on 2 MiB pages, some or all THP */
  STOW_PAGE_HUGETLB, /* every slab from the hugetlb pool */
} StowPageKind;

/* The environment variable that stands in for
 * /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise" or
 * "never"): tests and comparisons take the "never" path with it on a
 * machine where THP is on. */
#define STOW_THP_ENV "STOWAGE_THP"

typedef struct
{
  guint64 slab_bytes; /* each large allocation; 0 = 256 MiB; slabs of
                         2 MiB multiples can lie wholly on huge pages */
  int numa_node;      /* OS index of the node to bind to (e.g. the GPU's);
                         -1 = the calling thread's */
  gboolean no_cuda;   /* do not try cudaHostRegister */
  gboolean defer_pin; /* leave slabs unlocked until stow_pinned_pool_pin():
                         register them with io_uring first, so that the
                         registration is what faults their pages in (on the
                         VM we measured, O_DIRECT reads into such buffers
                         ran 1.7x faster than into mlock-populated ones) */
  StowHugePages huge_pages; /* 0 = AUTO */
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

/* What a buffer of @bytes takes of a slab: @bytes rounded up to the page,
 * at least one page (for sizing a pool before allocating from it). */
guint64 stow_pinned_span (guint64 bytes);

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

/* The page kind of the pool's slabs, measured: hugetlb slabs are known at
 * mmap time; THP is read from /proc/self/smaps (AnonHugePages over each
 * slab's range), so ask after the pages are in (pinned or touched): a slab
 * not faulted yet counts as small.  @huge_bytes (may be NULL) gets the bytes
 * on 2 MiB pages.  One read of smaps per call: not for hot paths.  An empty
 * pool is STOW_PAGE_SMALL. */
StowPageKind stow_pinned_pool_get_page_kind (StowPinnedPool *pool,
                                             guint64 *huge_bytes);
/* Why the pool got less than it asked for ("hugetlb: no free pages
 * reserved (HugePages_Free 0); THP instead"), or NULL.  Owned by the pool. */
const char *stow_pinned_pool_get_page_note (StowPinnedPool *pool);
/* "small", "mixed", "thp", "hugetlb" (the JSON spelling). */
const char *stow_page_kind_name (StowPageKind kind);
/* "auto", "thp", "hugetlb", "off"; the parser returns FALSE on anything
 * else. */
const char *stow_huge_pages_name (StowHugePages mode);
gboolean stow_huge_pages_parse (const char *text, StowHugePages *out);
/* The kernel's THP mode: "always", "madvise" or "never" (STOW_THP_ENV
 * first, then sysfs; "never" when neither can be read). */
const char *stow_thp_mode (void);
/* One line for logs: "pinned pool: 1.00 GiB in 4 slabs (1.00 GiB used),
 * mlock, NUMA node 0, 2 MiB pages (thp)" */
char *stow_pinned_pool_describe (StowPinnedPool *pool);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowPinnedPool, stow_pinned_pool_free)

/* Implemented in pinned-cuda.c when built with CUDA: TRUE if a device is
 * present and the range was registered. */
gboolean stow_pinned_cuda_register (void *addr, guint64 bytes);
void stow_pinned_cuda_unregister (void *addr);

G_END_DECLS
