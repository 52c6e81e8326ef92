/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint.c: the checkpoint directory protocol (temporary
 * directory, fsync, rename, `latest` replaced by a renamed symbolic link;
 * see checkpoint.h and docs/checkpoint-format.md).  The optimizer-state
 * file is optim-state.c's.
 */
#include "executor/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "executor/checkpoint-private.h"
#include "executor/fileio.h"

/* clang-format off */
G_DEFINE_QUARK (stow-checkpoint-error-quark, stow_checkpoint_error)
/* clang-format on */

gboolean stow_checkpoint_use_exchange = TRUE;

static gboolean G_GNUC_PRINTF (4, 5)
    fail (GError **error, StowCheckpointError code, const char *path,
          const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_CHECKPOINT_ERROR, code, "%s: %s", path, what);
  return FALSE;
}

/* ---- the checkpoint directory -------------------------------------------- */

struct _StowCheckpointWriter
{
  char *out_dir;
  char *step_name; /* "step-000012" */
  char *tmp_dir;   /* OUT/.step-000012.tmp-XXXXXX */
  gboolean committed;
};

static int
rm_entry (const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
  return (type == FTW_DP ? rmdir (path) : unlink (path)) < 0 ? -1 : 0;
}

/* rm -rf, never following symbolic links: 0 or -errno. */
static int
rm_rf (const char *path)
{
  if (nftw (path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) < 0)
    return -errno;
  return 0;
}

/* fsyncs every regular file under @dir, then each directory below it and
 * @dir itself (a directory's fsync makes its entries durable). */
static int
sync_tree (const char *dir)
{
  DIR *d = opendir (dir);
  if (d == NULL)
    return -errno;
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (errno = 0, e = readdir (d)) != NULL)
    {
      if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
        continue;
      g_autofree char *path = g_build_filename (dir, e->d_name, NULL);
      struct stat sb;
      if (lstat (path, &sb) < 0)
        rc = -errno;
      else if (S_ISDIR (sb.st_mode))
        rc = sync_tree (path);
      else if (S_ISREG (sb.st_mode))
        rc = stow_fsync_path (path);
    }
  if (rc == 0 && errno != 0)
    rc = -errno;
  closedir (d);
  return rc == 0 ? stow_fsync_path (dir) : rc;
}

/* "step-" and digits only: a committed checkpoint's name. */
static gboolean
is_step_name (const char *name, gsize len)
{
  if (len <= 5 || strncmp (name, "step-", 5) != 0)
    return FALSE;
  for (gsize i = 5; i < len; i++)
    if (!g_ascii_isdigit (name[i]))
      return FALSE;
  return TRUE;
}

/* What earlier runs that died left in OUT: temporary step directories
 * (some hold a replaced checkpoint, renamed there by the exchange), links
 * about to become `latest`, and checkpoints moved aside while one of the
 * same step replaced them, which go back if the replacement never landed. */
static gboolean
remove_leftovers (const char *out_dir, GError **error)
{
  g_autoptr (GDir) d = g_dir_open (out_dir, 0, NULL);
  if (d == NULL)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, out_dir, "%s",
                 g_strerror (errno));
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    if (g_str_has_prefix (name, ".step-")
        || g_str_has_prefix (name, ".latest.tmp-"))
      g_ptr_array_add (names, g_strdup (name));
  for (guint i = 0; i < names->len; i++)
    {
      name = names->pdata[i];
      g_autofree char *path = g_build_filename (out_dir, name, NULL);
      const char *old = strstr (name, ".old-");
      int rc = 0;
      if (g_str_has_prefix (name, ".latest.tmp-"))
        rc = unlink (path) < 0 ? -errno : 0;
      else if (old != NULL && is_step_name (name + 1, old - (name + 1)))
        {
          g_autofree char *step = g_strndup (name + 1, old - (name + 1));
          g_autofree char *target = g_build_filename (out_dir, step, NULL);
          struct stat sb;
          if (lstat (target, &sb) < 0 && errno == ENOENT)
            rc = rename (path, target) < 0 ? -errno : 0;
          else
            rc = rm_rf (path);
        }
      else if (strstr (name, ".tmp-") != NULL)
        rc = rm_rf (path);
      if (rc < 0 && rc != -ENOENT)
        return fail (error, STOW_CHECKPOINT_ERROR_IO, path,
                     "removing what an earlier run left: %s", g_strerror (-rc));
    }
  return TRUE;
}

StowCheckpointWriter *
stow_checkpoint_begin (const char *out_dir, guint64 step, GError **error)
{
  g_return_val_if_fail (out_dir != NULL, NULL);
  if (g_mkdir_with_parents (out_dir, 0755) < 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, out_dir, "creating it: %s",
            g_strerror (errno));
      return NULL;
    }
  if (!remove_leftovers (out_dir, error))
    return NULL;
  g_autoptr (StowCheckpointWriter) w = g_new0 (StowCheckpointWriter, 1);
  w->out_dir = g_strdup (out_dir);
  w->step_name = g_strdup_printf ("step-%06" G_GUINT64_FORMAT, step);
  char *tmpl = g_strdup_printf ("%s/.%s.tmp-XXXXXX", out_dir, w->step_name);
  if (g_mkdtemp_full (tmpl, 0755) == NULL)
    {
      int e = errno;
      fail (error, STOW_CHECKPOINT_ERROR_IO, tmpl, "creating it: %s",
            g_strerror (e));
      g_free (tmpl);
      return NULL;
    }
  w->tmp_dir = tmpl;
  return g_steal_pointer (&w);
}

const char *
stow_checkpoint_writer_dir (const StowCheckpointWriter *w)
{
  g_return_val_if_fail (w != NULL, NULL);
  return w->tmp_dir;
}

/* OUT/latest -> @target, atomically: a new link renamed over the old one
 * (symlink(2) alone cannot replace an existing name).  0 or -errno. */
static int
replace_latest (const char *out_dir, const char *target)
{
  g_autofree char *tmp = NULL;
  for (guint attempt = 0;; attempt++)
    {
      g_free (tmp);
      tmp = g_strdup_printf ("%s/.latest.tmp-%08x", out_dir, g_random_int ());
      if (symlink (target, tmp) == 0)
        break;
      if (errno != EEXIST || attempt == 100)
        return -errno;
    }
  g_autofree char *latest = g_build_filename (out_dir, "latest", NULL);
  if (rename (tmp, latest) < 0)
    {
      int rc = -errno;
      unlink (tmp);
      return rc;
    }
  return 0;
}

/* How the new step directory took its place, so that it can be undone. */
typedef enum
{
  PLACED_NEW,       /* renamed to a name that was free */
  PLACED_EXCHANGED, /* swapped with the old one, now at tmp_dir */
  PLACED_ASIDE,     /* the old one renamed aside first */
} Placement;

/* Puts tmp_dir at @target; *@aside gets where a replaced checkpoint went.
 * 0 or -errno, with nothing changed on failure. */
static int
place_step (StowCheckpointWriter *w, const char *target, Placement *how,
            char **aside)
{
  struct stat sb;
  if (lstat (target, &sb) < 0)
    {
      if (errno != ENOENT)
        return -errno;
      *how = PLACED_NEW;
      return rename (w->tmp_dir, target) < 0 ? -errno : 0;
    }
  if (!S_ISDIR (sb.st_mode))
    return -ENOTDIR;
  /* One atomic swap: `latest` may point at this very step, and must never
   * see it missing. */
  if (stow_checkpoint_use_exchange
      && renameat2 (AT_FDCWD, w->tmp_dir, AT_FDCWD, target, RENAME_EXCHANGE)
             == 0)
    {
      *how = PLACED_EXCHANGED;
      *aside = g_strdup (w->tmp_dir);
      return 0;
    }
  if (stow_checkpoint_use_exchange && errno != EINVAL && errno != ENOSYS
      && errno != ENOTSUP)
    return -errno;
  /* A file system without RENAME_EXCHANGE: move the old one aside (renaming
   * a directory over an empty one replaces it), then the new one in.  A
   * crash in between is repaired by the next begin, which moves the old one
   * back (remove_leftovers). */
  g_autofree char *tmpl
      = g_strdup_printf ("%s/.%s.old-XXXXXX", w->out_dir, w->step_name);
  if (g_mkdtemp_full (tmpl, 0755) == NULL)
    return -errno;
  if (rename (target, tmpl) < 0)
    {
      int rc = -errno;
      rmdir (tmpl);
      return rc;
    }
  if (rename (w->tmp_dir, target) < 0)
    {
      int rc = -errno;
      rename (tmpl, target);
      return rc;
    }
  *how = PLACED_ASIDE;
  *aside = g_steal_pointer (&tmpl);
  return 0;
}

static void
unplace_step (StowCheckpointWriter *w, const char *target, Placement how,
              const char *aside)
{
  switch (how)
    {
    case PLACED_NEW:
      rename (target, w->tmp_dir);
      break;
    case PLACED_EXCHANGED:
      renameat2 (AT_FDCWD, w->tmp_dir, AT_FDCWD, target, RENAME_EXCHANGE);
      break;
    case PLACED_ASIDE:
      if (rename (target, w->tmp_dir) == 0)
        rename (aside, target);
      break;
    }
}

gboolean
stow_checkpoint_commit (StowCheckpointWriter *w, GError **error)
{
  g_return_val_if_fail (w != NULL && !w->committed, FALSE);
  int rc = sync_tree (w->tmp_dir);
  if (rc < 0)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, w->tmp_dir, "fsync: %s",
                 g_strerror (-rc));
  g_autofree char *target = g_build_filename (w->out_dir, w->step_name, NULL);
  Placement how = PLACED_NEW;
  g_autofree char *aside = NULL;
  rc = place_step (w, target, &how, &aside);
  if (rc < 0)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, target,
                 "renaming %s to it: %s", w->tmp_dir, g_strerror (-rc));
  /* The step directory's name must be durable before a `latest` that
   * names it can be. */
  const char *doing = "fsync";
  rc = stow_fsync_path (w->out_dir);
  if (rc == 0)
    {
      doing = "replacing latest";
      rc = replace_latest (w->out_dir, w->step_name);
    }
  if (rc < 0)
    {
      unplace_step (w, target, how, aside);
      return fail (error, STOW_CHECKPOINT_ERROR_IO, w->out_dir, "%s: %s", doing,
                   g_strerror (-rc));
    }
  w->committed = TRUE;
  /* The replaced checkpoint goes only now; if this fails the next begin
   * removes it. */
  if (aside != NULL)
    rm_rf (aside);
  rc = stow_fsync_path (w->out_dir);
  if (rc < 0)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, w->out_dir,
                 "fsync after replacing latest: %s", g_strerror (-rc));
  return TRUE;
}

void
stow_checkpoint_writer_free (StowCheckpointWriter *w)
{
  if (w == NULL)
    return;
  if (!w->committed && w->tmp_dir != NULL)
    rm_rf (w->tmp_dir);
  g_free (w->tmp_dir);
  g_free (w->step_name);
  g_free (w->out_dir);
  g_free (w);
}

/* A checkpoint moved aside (place_step without RENAME_EXCHANGE) whose
 * replacement named @step never landed: the link still names @step. */
static char *
find_aside (const char *out_dir, const char *step)
{
  g_autoptr (GDir) d = g_dir_open (out_dir, 0, NULL);
  g_autofree char *prefix = g_strdup_printf (".%s.old-", step);
  const char *name;
  while (d != NULL && (name = g_dir_read_name (d)) != NULL)
    if (g_str_has_prefix (name, prefix))
      {
        char *path = g_build_filename (out_dir, name, NULL);
        if (g_file_test (path, G_FILE_TEST_IS_DIR))
          return path;
        g_free (path);
      }
  return NULL;
}

char *
stow_checkpoint_latest (const char *out_dir, GError **error)
{
  g_return_val_if_fail (out_dir != NULL, NULL);
  g_autofree char *link = g_build_filename (out_dir, "latest", NULL);
  char buf[4096];
  ssize_t n = readlink (link, buf, sizeof buf - 1);
  if (n < 0)
    {
      if (errno == ENOENT || errno == ENOTDIR)
        return NULL;
      fail (error,
            errno == EINVAL ? STOW_CHECKPOINT_ERROR_INVALID
                            : STOW_CHECKPOINT_ERROR_IO,
            link, "%s",
            errno == EINVAL ? "not a symbolic link" : g_strerror (errno));
      return NULL;
    }
  buf[n] = '\0';
  g_autofree char *path = g_path_is_absolute (buf)
                              ? g_strdup (buf)
                              : g_build_filename (out_dir, buf, NULL);
  g_autofree char *base = g_path_get_basename (buf);
  struct stat sb;
  if (stat (path, &sb) < 0)
    {
      /* Killed between moving the old step aside and renaming the new one
       * in: the old one is whole, and the next begin puts it back. */
      char *aside
          = !g_path_is_absolute (buf) && is_step_name (buf, strlen (buf))
                ? find_aside (out_dir, buf)
                : NULL;
      if (aside != NULL)
        return aside;
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, link,
            "points to %s, which does not exist", buf);
      return NULL;
    }
  /* Only commit names a directory step-N, and only once it is complete. */
  if (!S_ISDIR (sb.st_mode) || !is_step_name (base, strlen (base)))
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, link,
            "points to %s, which is not a complete checkpoint directory "
            "(step-NNNNNN)",
            buf);
      return NULL;
    }
  return g_steal_pointer (&path);
}

/* ---- the committed checkpoints ------------------------------------------- */

guint64
stow_checkpoint_name_step (const char *name)
{
  g_return_val_if_fail (name != NULL, 0);
  return g_ascii_strtoull (name + 5, NULL, 10);
}

static gint
by_step (gconstpointer a, gconstpointer b)
{
  guint64 x = stow_checkpoint_name_step (*(const char *const *)a);
  guint64 y = stow_checkpoint_name_step (*(const char *const *)b);
  return x < y ? -1 : x > y;
}

char **
stow_checkpoint_list (const char *out_dir, GError **error)
{
  g_return_val_if_fail (out_dir != NULL, NULL);
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  DIR *d = opendir (out_dir);
  if (d == NULL && errno != ENOENT && errno != ENOTDIR)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, out_dir, "%s", g_strerror (errno));
      return NULL;
    }
  struct dirent *e;
  while (d != NULL && (e = readdir (d)) != NULL)
    {
      if (!is_step_name (e->d_name, strlen (e->d_name)))
        continue;
      g_autofree char *path = g_build_filename (out_dir, e->d_name, NULL);
      struct stat sb;
      if (lstat (path, &sb) == 0 && S_ISDIR (sb.st_mode))
        g_ptr_array_add (names, g_strdup (e->d_name));
    }
  if (d != NULL)
    closedir (d);
  g_ptr_array_sort (names, by_step);
  g_ptr_array_add (names, NULL);
  return (char **)g_ptr_array_free (g_steal_pointer (&names), FALSE);
}

/* Removes committed checkpoint @name of @out_dir: renamed to a temporary
 * name first (which the next begin clears), so that a crash midway never
 * leaves a half-removed step-N that would pass for a committed one. */
static gboolean
remove_step (const char *out_dir, const char *name, const char *why,
             GError **error)
{
  g_autofree char *path = g_build_filename (out_dir, name, NULL);
  g_autofree char *aside
      = g_strdup_printf ("%s/.%s.tmp-%08x", out_dir, name, g_random_int ());
  int rc = rename (path, aside) < 0 ? -errno : rm_rf (aside);
  if (rc < 0 && rc != -ENOENT)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, path, "removing it (%s): %s",
                 why, g_strerror (-rc));
  return TRUE;
}

gboolean
stow_checkpoint_prune (const char *out_dir, guint keep, GError **error)
{
  g_return_val_if_fail (out_dir != NULL, FALSE);
  g_autofree char *latest = stow_checkpoint_latest (out_dir, error);
  if (latest == NULL && error != NULL && *error != NULL)
    return FALSE;
  g_autofree char *latest_name = latest ? g_path_get_basename (latest) : NULL;
  g_auto (GStrv) names = stow_checkpoint_list (out_dir, error);
  if (names == NULL)
    return FALSE;
  guint n = g_strv_length (names);
  for (guint i = 0; i + keep < n; i++)
    if (g_strcmp0 (names[i], latest_name) != 0
        && !remove_step (out_dir, names[i], "--keep-last", error))
      return FALSE;
  return TRUE;
}

gboolean
stow_checkpoint_remove_others (const char *out_dir, const char *keep,
                               GError **error)
{
  g_return_val_if_fail (out_dir != NULL && keep != NULL, FALSE);
  g_auto (GStrv) names = stow_checkpoint_list (out_dir, error);
  if (names == NULL)
    return FALSE;
  for (guint i = 0; names[i]; i++)
    if (!g_str_equal (names[i], keep)
        && !remove_step (out_dir, names[i], "--overwrite", error))
      return FALSE;
  int rc = stow_fsync_path (out_dir);
  if (rc < 0)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, out_dir, "fsync: %s",
                 g_strerror (-rc));
  return TRUE;
}

/* ---- one writer per run directory -----------------------------------------
 */

struct _StowRunLock
{
  char *out_dir;
  char *path; /* OUT/.lock */
  int fd;
  gboolean created_dir;
};

/* The holder's line for a refusal, from what it wrote into the file (a
 * holder that has just taken the lock writes it within microseconds: a
 * moment is given). */
static char *
describe_holder (const char *path)
{
  g_autofree char *text = NULL;
  for (guint i = 0; i < 50; i++)
    {
      g_clear_pointer (&text, g_free);
      if (g_file_get_contents (path, &text, NULL, NULL)
          && strstr (text, "started ") != NULL)
        break;
      g_usleep (2000);
    }
  if (text == NULL || text[0] == '\0')
    return g_strdup ("another process");
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  const char *pid = NULL, *host = NULL, *started = NULL;
  for (guint i = 0; lines[i]; i++)
    {
      if (g_str_has_prefix (lines[i], "pid "))
        pid = lines[i] + 4;
      else if (g_str_has_prefix (lines[i], "host "))
        host = lines[i] + 5;
      else if (g_str_has_prefix (lines[i], "started "))
        started = lines[i] + 8;
    }
  if (pid == NULL)
    return g_strdup ("another process");
  return g_strdup_printf ("pid %s%s%s%s%s%s", pid, host ? " on " : "",
                          host ? host : "", started ? " (started " : "",
                          started ? started : "", started ? ")" : "");
}

/* pid, host and start time, for the refusal another run prints. */
static void
write_holder (int fd)
{
  g_autoptr (GDateTime) now = g_date_time_new_now_local ();
  g_autofree char *when = g_date_time_format (now, "%Y-%m-%d %H:%M:%S %z");
  g_autofree char *text
      = g_strdup_printf ("pid %d\nhost %s\nstarted %s\n", (int)getpid (),
                         g_get_host_name (), when);
  if (ftruncate (fd, 0) == 0)
    (void)stow_fd_write_all (fd, text, strlen (text));
}

StowRunLock *
stow_run_lock_take (const char *out_dir, GError **error)
{
  g_return_val_if_fail (out_dir != NULL, NULL);
  gboolean created = !g_file_test (out_dir, G_FILE_TEST_EXISTS);
  if (g_mkdir_with_parents (out_dir, 0755) < 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, out_dir, "creating it: %s",
            g_strerror (errno));
      return NULL;
    }
  g_autofree char *path = g_build_filename (out_dir, ".lock", NULL);
  /* The file may be removed by its holder as it releases it (run_lock_
   * release): a lock taken on a file no longer at the path is no lock. */
  for (guint attempt = 0;; attempt++)
    {
      int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0)
        {
          fail (error, STOW_CHECKPOINT_ERROR_IO, path, "%s",
                g_strerror (errno));
          return NULL;
        }
      if (flock (fd, LOCK_EX | LOCK_NB) < 0)
        {
          int e = errno;
          close (fd);
          if (e == EWOULDBLOCK)
            {
              g_autofree char *who = describe_holder (path);
              g_set_error (error, STOW_CHECKPOINT_ERROR,
                           STOW_CHECKPOINT_ERROR_BUSY,
                           "%s is being trained by %s; wait for it or use "
                           "another --out",
                           out_dir, who);
            }
          else
            fail (error, STOW_CHECKPOINT_ERROR_IO, path,
                  "locking it (one run per directory): %s", g_strerror (e));
          return NULL;
        }
      struct stat held, named;
      if (fstat (fd, &held) == 0 && stat (path, &named) == 0
          && held.st_dev == named.st_dev && held.st_ino == named.st_ino)
        {
          write_holder (fd);
          StowRunLock *l = g_new0 (StowRunLock, 1);
          l->out_dir = g_strdup (out_dir);
          l->path = g_steal_pointer (&path);
          l->fd = fd;
          l->created_dir = created;
          return l;
        }
      close (fd);
      if (attempt == 100)
        {
          fail (error, STOW_CHECKPOINT_ERROR_IO, path,
                "replaced 100 times while locking it");
          return NULL;
        }
    }
}

gboolean
stow_run_lock_created_dir (const StowRunLock *lock)
{
  g_return_val_if_fail (lock != NULL, FALSE);
  return lock->created_dir;
}

void
stow_run_lock_release (StowRunLock *lock, gboolean remove_dir)
{
  if (lock == NULL)
    return;
  unlink (lock->path);
  close (lock->fd);
  if (remove_dir && lock->created_dir)
    rmdir (lock->out_dir);
  g_free (lock->path);
  g_free (lock->out_dir);
  g_free (lock);
}
