/* SPDX-License-Identifier: MIT
 *
 * tests/checkpoint-killer.c: an LD_PRELOAD library for test-train-resume's
 * fault injection.  It counts the calls that change anything under
 * $STOW_KILL_DIR (an open that may create or write, write, pwrite,
 * ftruncate, fsync and fdatasync of a file opened there; mkdir, rename,
 * renameat2, symlink, unlink and rmdir of a path there) and raises SIGKILL
 * in place of the $STOW_KILL_AT-th (1-based; 0 or unset: never).  At exit
 * the count goes to the file $STOW_KILL_COUNT, so that a sweep knows how
 * many points a run has.  $STOW_FULL_AT=N: from the N-th write (write,
 * pwrite) of a file there on, every write fails with ENOSPC, as on a disk
 * that filled.  Every checkpoint syscall goes through libc's
 * symbols (executor/checkpoint.c, fileio.c, optim-state.c, safetensors.c
 * and GLib's g_file_set_contents), so every one is a point.
 */
/* The plain symbols: the build's -D_FILE_OFFSET_BITS=64 would rename
 * open, pwrite and ftruncate to their *64 twins, which are defined below
 * in their own right (the binary calls those). */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FDS 4096

static const char *kill_dir;
static size_t kill_dir_len;
static long kill_at;
static int trace;            /* $STOW_KILL_TRACE: each point's call on stderr */
static long full_at;         /* $STOW_FULL_AT */
static volatile long writes; /* writes of tracked files so far */
static volatile long calls;
static unsigned char tracked[MAX_FDS]; /* fds opened under kill_dir */

__attribute__ ((constructor)) static void
killer_init (void)
{
  kill_dir = getenv ("STOW_KILL_DIR");
  kill_dir_len = kill_dir ? strlen (kill_dir) : 0;
  const char *at = getenv ("STOW_KILL_AT");
  kill_at = at ? atol (at) : 0;
  trace = getenv ("STOW_KILL_TRACE") != NULL;
  const char *full = getenv ("STOW_FULL_AT");
  full_at = full ? atol (full) : 0;
}

/* A write of a tracked file on a disk that filled at $STOW_FULL_AT. */
static int
disk_full (void)
{
  if (full_at <= 0
      || __atomic_add_fetch (&writes, 1, __ATOMIC_SEQ_CST) < full_at)
    return 0;
  errno = ENOSPC;
  return 1;
}

__attribute__ ((destructor)) static void
killer_fini (void)
{
  const char *path = getenv ("STOW_KILL_COUNT");
  if (path == NULL)
    return;
  FILE *f = fopen (path, "w");
  if (f)
    {
      fprintf (f, "%ld\n", (long)calls);
      fclose (f);
    }
}

static int
under (const char *path)
{
  return kill_dir_len > 0 && path != NULL
         && strncmp (path, kill_dir, kill_dir_len) == 0
         && (path[kill_dir_len] == '/' || path[kill_dir_len] == '\0');
}

static int
is_tracked (int fd)
{
  return fd >= 0 && fd < MAX_FDS && tracked[fd];
}

/* One more point: this call is the one to die at, or it goes ahead. */
static void
point (const char *call)
{
  long n = __atomic_add_fetch (&calls, 1, __ATOMIC_SEQ_CST);
  if (trace)
    {
      char line[64];
      int len = snprintf (line, sizeof line, "kill point %ld: %s\n", n, call);
      ssize_t w = ((ssize_t (*) (int, const void *, size_t))dlsym (
          RTLD_NEXT, "write")) (2, line, (size_t)len);
      (void)w;
    }
  if (kill_at > 0 && n == kill_at)
    raise (SIGKILL);
}

#define NEXT(name) ((__typeof__ (&name))dlsym (RTLD_NEXT, #name))

static int
open_common (const char *sym, int dirfd, const char *path, int flags,
             mode_t mode)
{
  int changes = (flags & (O_CREAT | O_TRUNC | O_WRONLY | O_RDWR)) != 0;
  if (under (path) && changes)
    point (sym);
  int fd;
  if (dirfd == AT_FDCWD && strcmp (sym, "open") == 0)
    fd = ((int (*) (const char *, int, ...))dlsym (RTLD_NEXT, "open")) (
        path, flags, mode);
  else if (dirfd == AT_FDCWD && strcmp (sym, "open64") == 0)
    fd = ((int (*) (const char *, int, ...))dlsym (RTLD_NEXT, "open64")) (
        path, flags, mode);
  else
    fd = ((int (*) (int, const char *, int, ...))dlsym (RTLD_NEXT, sym)) (
        dirfd, path, flags, mode);
  if (fd >= 0 && fd < MAX_FDS)
    tracked[fd] = (unsigned char)under (path);
  return fd;
}

static mode_t
mode_arg (int flags, va_list ap)
{
  return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg (ap, int) : 0;
}

int
open (const char *path, int flags, ...)
{
  va_list ap;
  va_start (ap, flags);
  mode_t mode = mode_arg (flags, ap);
  va_end (ap);
  return open_common ("open", AT_FDCWD, path, flags, mode);
}

int
open64 (const char *path, int flags, ...)
{
  va_list ap;
  va_start (ap, flags);
  mode_t mode = mode_arg (flags, ap);
  va_end (ap);
  return open_common ("open64", AT_FDCWD, path, flags, mode);
}

int
openat (int dirfd, const char *path, int flags, ...)
{
  va_list ap;
  va_start (ap, flags);
  mode_t mode = mode_arg (flags, ap);
  va_end (ap);
  return open_common ("openat", dirfd, path, flags, mode);
}

int
openat64 (int dirfd, const char *path, int flags, ...)
{
  va_list ap;
  va_start (ap, flags);
  mode_t mode = mode_arg (flags, ap);
  va_end (ap);
  return open_common ("openat64", dirfd, path, flags, mode);
}

int
close (int fd)
{
  if (fd >= 0 && fd < MAX_FDS)
    tracked[fd] = 0;
  return NEXT (close) (fd);
}

ssize_t
write (int fd, const void *buf, size_t n)
{
  if (is_tracked (fd))
    {
      point ("write");
      if (disk_full ())
        return -1;
    }
  return NEXT (write) (fd, buf, n);
}

ssize_t
pwrite (int fd, const void *buf, size_t n, off_t off)
{
  if (is_tracked (fd))
    {
      point ("pwrite");
      if (disk_full ())
        return -1;
    }
  return NEXT (pwrite) (fd, buf, n, off);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t n, off64_t off)
{
  if (is_tracked (fd))
    {
      point ("pwrite64");
      if (disk_full ())
        return -1;
    }
  return NEXT (pwrite64) (fd, buf, n, off);
}

int
ftruncate (int fd, off_t len)
{
  if (is_tracked (fd))
    point ("ftruncate");
  return NEXT (ftruncate) (fd, len);
}

int
ftruncate64 (int fd, off64_t len)
{
  if (is_tracked (fd))
    point ("ftruncate64");
  return NEXT (ftruncate64) (fd, len);
}

int
fsync (int fd)
{
  if (is_tracked (fd))
    point ("fsync");
  return NEXT (fsync) (fd);
}

int
fdatasync (int fd)
{
  if (is_tracked (fd))
    point ("fdatasync");
  return NEXT (fdatasync) (fd);
}

int
mkdir (const char *path, mode_t mode)
{
  if (under (path))
    point ("mkdir");
  return NEXT (mkdir) (path, mode);
}

int
rename (const char *from, const char *to)
{
  if (under (from) || under (to))
    point ("rename");
  return NEXT (rename) (from, to);
}

int
renameat2 (int fd1, const char *from, int fd2, const char *to,
           unsigned int flags)
{
  if (under (from) || under (to))
    point ("renameat2");
  return NEXT (renameat2) (fd1, from, fd2, to, flags);
}

int
symlink (const char *target, const char *path)
{
  if (under (path))
    point ("symlink");
  return NEXT (symlink) (target, path);
}

int
unlink (const char *path)
{
  if (under (path))
    point ("unlink");
  return NEXT (unlink) (path);
}

int
rmdir (const char *path)
{
  if (under (path))
    point ("rmdir");
  return NEXT (rmdir) (path);
}
