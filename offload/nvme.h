/* SPDX-License-Identifier: MIT
 *
 * offload/nvme.h: the NVMe store.  Tensors live in one file per directory,
 * striped across the directories in fixed-size stripes so several drives add
 * up; I/O is O_DIRECT through io_uring (registered buffers, fixed files) or a
 * small pread/pwrite thread pool.  It is a swap space, not a file format: the
 * files are private to the process and removed when the store is freed.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_IO_ERROR (stow_io_error_quark ())
GQuark stow_io_error_quark (void);

typedef enum
{
  STOW_IO_ERROR_INVALID,     /* bad option or argument */
  STOW_IO_ERROR_UNSUPPORTED, /* the engine asked for is refused here */
  STOW_IO_ERROR_NO_SPACE,    /* preflight or a write found the disk full */
  STOW_IO_ERROR_FAILED,      /* an I/O request failed (EIO, short read) */
  STOW_IO_ERROR_CHECKSUM,    /* a block read back differs from what was
                                written */
  STOW_IO_ERROR_NO_DATA,     /* reading a block that holds no valid data */
} StowIoError;

typedef enum
{
  STOW_NVME_ENGINE_AUTO,     /* io_uring when the kernel allows it */
  STOW_NVME_ENGINE_IO_URING, /* io_uring or fail with _UNSUPPORTED */
  STOW_NVME_ENGINE_THREADS,  /* pread/pwrite on a thread pool */
} StowNvmeEngine;

/* O_DIRECT needs the buffer, the file offset and the length aligned to the
 * logical block size; 4 KiB covers every drive we meet. */
#define STOW_NVME_ALIGN 4096u

typedef struct
{
  const char *const *dirs; /* NULL-terminated, at least one */
  guint64 block_bytes;     /* one I/O request; multiple of 4 KiB; 0 = 1 MiB */
  guint64 stripe_bytes;    /* multiple of block_bytes; 0 = 4 * block */
  guint queue_depth;       /* requests in flight; 0 = 32 */
  guint max_requests;      /* handles outstanding at once; 0 = 64 */
  StowNvmeEngine engine;
  gboolean checksum; /* XXH3 per block, verified on read */
  gboolean buffered; /* skip O_DIRECT (tests on odd filesystems) */
} StowNvmeOptions;

typedef struct _StowNvmeStore StowNvmeStore;
typedef struct _StowNvmeRequest StowNvmeRequest;

/* Creates a private 0700 directory under each of @opts->dirs
 * ("stowage-PID-XXXXXX") and one 0600 file in each; first removes the
 * private directories of processes that are gone (a run killed with
 * SIGKILL), saying so in stow_nvme_store_get_note.  Sets STOW_IO_ERROR_INVALID
 * on bad options, _UNSUPPORTED when engine is IO_URING and the kernel refuses
 * it, G_FILE_ERROR on a directory that cannot be used. */
StowNvmeStore *stow_nvme_store_new (const StowNvmeOptions *opts,
                                    GError **error);
/* "removed DIR (its process N is gone)", or NULL. */
const char *stow_nvme_store_get_note (StowNvmeStore *store);
/* Waits for outstanding I/O, closes and removes the files and directories. */
void stow_nvme_store_free (StowNvmeStore *store);
/* Removes every live store's files and private directories now, with
 * unlink and rmdir only: async-signal-safe, for a SIGINT or SIGTERM handler
 * that then ends the process (the stores are unusable afterwards; open
 * descriptors keep the space until the process ends).  Up to 128 stores
 * with paths under 1 KiB are covered. */
void stow_nvme_remove_files_on_signal (void);

StowNvmeEngine stow_nvme_store_get_engine (StowNvmeStore *store);
const char *stow_nvme_engine_name (StowNvmeEngine engine);
guint64 stow_nvme_store_get_block_bytes (StowNvmeStore *store);
guint stow_nvme_store_get_queue_depth (StowNvmeStore *store);
/* TRUE when the files are open with O_DIRECT. */
gboolean stow_nvme_store_is_direct (StowNvmeStore *store);
guint stow_nvme_store_get_n_dirs (StowNvmeStore *store);
/* The private directory and the file made in dirs[i]. */
const char *stow_nvme_store_get_private_dir (StowNvmeStore *store, guint i);
const char *stow_nvme_store_get_file (StowNvmeStore *store, guint i);

/* Declares a tensor of @bytes; returns its id (0, 1, ...).  Its space is
 * claimed on the next stow_nvme_store_prepare(). */
guint stow_nvme_store_add_tensor (StowNvmeStore *store, const char *name,
                                  guint64 bytes);
guint64 stow_nvme_store_get_tensor_bytes (StowNvmeStore *store, guint tensor);
/* Preflight before the first write: checks with statvfs that every directory
 * has room for its share of all tensors declared so far, then reserves the
 * space (fallocate) so that a later write cannot run out of it.  Sets
 * STOW_IO_ERROR_NO_SPACE naming the directory, the bytes needed and free. */
gboolean stow_nvme_store_prepare (StowNvmeStore *store, GError **error);

/* Where block @block of @tensor lies on disk (for tests and messages). */
void stow_nvme_store_locate (StowNvmeStore *store, guint tensor, guint64 block,
                             const char **path, guint64 *file_offset);

/* Registers a host buffer (from the pinned pool) with io_uring so that
 * requests inside it use fixed buffers.  Optional; a no-op for the thread
 * engine; returns FALSE (and I/O still works) when the kernel refuses. */
gboolean stow_nvme_store_register_buffer (StowNvmeStore *store, void *addr,
                                          guint64 bytes);

/* The hot path.  Starts reading or writing @bytes of @tensor from @offset.
 * @buf must be 4 KiB-aligned and hold @bytes (no padding needed); @offset
 * must be a multiple of the block size and @offset + @bytes either the end
 * of the tensor or a block boundary.  Returns 0 and a handle in @out, or a
 * negative errno: -EINVAL (bad range, unprepared tensor), -EAGAIN (all
 * max_requests handles are in use: wait for one), -ESHUTDOWN.  Never
 * allocates.  Buffers must stay untouched until the request is waited on. */
int stow_nvme_read_async (StowNvmeStore *store, guint tensor, guint64 offset,
                          void *buf, guint64 bytes, StowNvmeRequest **out);
int stow_nvme_write_async (StowNvmeStore *store, guint tensor, guint64 offset,
                           const void *buf, guint64 bytes,
                           StowNvmeRequest **out);
/* Waits for @req and gives its handle back.  On failure sets an error that
 * names the tensor, the block, the file and offset: STOW_IO_ERROR_FAILED,
 * _NO_SPACE, _CHECKSUM (read back differs) or _NO_DATA (the block was never
 * written, or its last write failed).  A failed write never touches other
 * tensors' data. */
gboolean stow_nvme_request_wait (StowNvmeStore *store, StowNvmeRequest *req,
                                 GError **error);

/* Synchronous helpers over the above. */
gboolean stow_nvme_store_write (StowNvmeStore *store, guint tensor,
                                const void *buf, GError **error);
gboolean stow_nvme_store_read (StowNvmeStore *store, guint tensor, void *buf,
                               GError **error);

/* Fault injection, for tests only: the @nth I/O operation submitted from now
 * on (1 = the next) completes with the given fault. */
typedef enum
{
  STOW_NVME_FAULT_NONE,
  STOW_NVME_FAULT_EIO,       /* fails with -EIO */
  STOW_NVME_FAULT_ENOSPC,    /* fails with -ENOSPC */
  STOW_NVME_FAULT_SHORT,     /* transfers half (4 KiB-aligned); the rest
                                is retried */
  STOW_NVME_FAULT_SHORT_EOF, /* transfers half, then hits end of file */
} StowNvmeFault;
void stow_nvme_store_inject_fault (StowNvmeStore *store, guint64 nth,
                                   StowNvmeFault fault);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowNvmeStore, stow_nvme_store_free)

G_END_DECLS
