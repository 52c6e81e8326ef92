/* SPDX-License-Identifier: MIT
 *
 * executor/fileio.c: whole reads and writes, fsync of a path (see
 * fileio.h).
 */
#include "executor/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

/* One call moves at most this much: Linux caps a read or write at about
 * 2 GiB anyway, and a bounded size keeps the count inside ssize_t. */
#define CHUNK_BYTES ((guint64)1 << 30)

int
stow_fd_write_all (int fd, const void *data, guint64 bytes)
{
  const guint8 *p = data;
  while (bytes > 0)
    {
      ssize_t n = write (fd, p, MIN (bytes, CHUNK_BYTES));
      if (n < 0)
        {
          if (errno == EINTR)
            continue;
          return -errno;
        }
      if (n == 0)
        return -EIO;
      p += n;
      bytes -= (guint64)n;
    }
  return 0;
}

int
stow_fd_pwrite_all (int fd, const void *data, guint64 bytes, guint64 offset)
{
  const guint8 *p = data;
  while (bytes > 0)
    {
      if (offset > (guint64)G_MAXINT64)
        return -EFBIG;
      ssize_t n = pwrite (fd, p, MIN (bytes, CHUNK_BYTES), (off_t)offset);
      if (n < 0)
        {
          if (errno == EINTR)
            continue;
          return -errno;
        }
      if (n == 0)
        return -EIO;
      p += n;
      bytes -= (guint64)n;
      offset += (guint64)n;
    }
  return 0;
}

gint64
stow_fd_pread_all (int fd, void *dst, guint64 bytes, guint64 offset)
{
  guint8 *p = dst;
  guint64 got = 0;
  while (got < bytes)
    {
      if (offset + got > (guint64)G_MAXINT64)
        return -EFBIG;
      ssize_t n = pread (fd, p + got, MIN (bytes - got, CHUNK_BYTES),
                         (off_t)(offset + got));
      if (n < 0)
        {
          if (errno == EINTR)
            continue;
          return -errno;
        }
      if (n == 0)
        break; /* end of file */
      got += (guint64)n;
    }
  return (gint64)got;
}

int
stow_fsync_path (const char *path)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int rc = fsync (fd) < 0 ? -errno : 0;
  if (close (fd) < 0 && rc == 0)
    rc = -errno;
  return rc;
}
