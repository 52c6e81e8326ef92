/* SPDX-License-Identifier: MIT
 *
 * executor/fileio.h: the few POSIX I/O loops that safetensors, token data
 * and checkpoints share: whole writes and reads that retry on EINTR and
 * short transfers, and fsync of a path.  liburing style: they return 0 (or
 * a byte count) or a negative errno and never allocate; callers make the
 * GError, naming the file.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Writes all @bytes of @data at the file position: 0 or -errno. */
int stow_fd_write_all (int fd, const void *data, guint64 bytes);
/* Writes all @bytes of @data at @offset: 0 or -errno. */
int stow_fd_pwrite_all (int fd, const void *data, guint64 bytes,
                        guint64 offset);
/* Reads @bytes at @offset into @dst: the count read (fewer than @bytes only
 * at end of file) or -errno. */
gint64 stow_fd_pread_all (int fd, void *dst, guint64 bytes, guint64 offset);
/* Opens @path (a file or a directory) read-only and fsyncs it: 0 or -errno.
 * A directory is fsynced so that the names created, renamed or removed in
 * it are durable, not only the files' data. */
int stow_fsync_path (const char *path);

G_END_DECLS
