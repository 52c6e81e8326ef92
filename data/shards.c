/* SPDX-License-Identifier: MIT
 *
 * data/shards.c: writing a shard and its mask (see shards.h).  Tokens go
 * through a stdio buffer to a temporary file; the header, whose count is
 * known only at the end, is written last, then the file is synced; the
 * rename makes it visible.
 */
#include "data/shards.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

/* clang-format off */
G_DEFINE_QUARK (stow-shard-error-quark, stow_shard_error)
/* clang-format on */

#define HEADER_BYTES (STOW_SHARD_HEADER_INTS * 4)

typedef struct
{
  char *path; /* final name */
  char *tmp;  /* temporary name, NULL once renamed */
  FILE *f;
} OutFile;

struct _StowShardWriter
{
  OutFile shard, mask;
  guint token_bytes;
  guint64 n_tokens;
  gboolean finished;
};

guint
stow_shard_token_bytes (guint32 n_ids)
{
  return n_ids <= 65536 ? 2 : 4;
}

static gboolean
io_error (GError **error, const char *path, const char *what, int err)
{
  g_set_error (error, STOW_SHARD_ERROR, STOW_SHARD_ERROR_IO, "%s: %s: %s", path,
               what, g_strerror (err));
  return FALSE;
}

static gboolean
out_open (OutFile *o, const char *path, GError **error)
{
  o->path = g_strdup (path);
  o->tmp = g_strdup_printf ("%s.tmp-XXXXXX", path);
  int fd = g_mkstemp_full (o->tmp, O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0)
    {
      int err = errno;
      g_clear_pointer (&o->tmp, g_free);
      return io_error (error, path, "cannot create", err);
    }
  o->f = fdopen (fd, "w+b");
  if (o->f == NULL)
    {
      int err = errno;
      close (fd);
      return io_error (error, path, "cannot open", err);
    }
  /* The header's place; its values come at the end. */
  static const guint8 zeros[HEADER_BYTES];
  if (fwrite (zeros, 1, sizeof zeros, o->f) != sizeof zeros)
    return io_error (error, path, "write", errno);
  return TRUE;
}

static void
out_close (OutFile *o)
{
  if (o->f)
    fclose (o->f);
  o->f = NULL;
  if (o->tmp)
    g_unlink (o->tmp);
  g_clear_pointer (&o->tmp, g_free);
  g_clear_pointer (&o->path, g_free);
}

StowShardWriter *
stow_shard_writer_new (const char *path, const char *mask_path,
                       guint token_bytes, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (token_bytes == 2 || token_bytes == 4, NULL);
  g_autoptr (StowShardWriter) w = g_new0 (StowShardWriter, 1);
  w->token_bytes = token_bytes;
  if (!out_open (&w->shard, path, error)
      || (mask_path != NULL && !out_open (&w->mask, mask_path, error)))
    return NULL;
  return g_steal_pointer (&w);
}

gboolean
stow_shard_writer_append (StowShardWriter *w, const guint32 *ids,
                          const guint8 *mask, gsize n, GError **error)
{
  g_return_val_if_fail (w != NULL && !w->finished, FALSE);
  if (w->n_tokens + n > STOW_SHARD_MAX_TOKENS)
    {
      g_set_error (error, STOW_SHARD_ERROR, STOW_SHARD_ERROR_TOO_MANY,
                   "%s: over %" G_GUINT64_FORMAT " tokens, the most an llm.c "
                   "shard's header counts: split the input",
                   w->shard.path, STOW_SHARD_MAX_TOKENS);
      return FALSE;
    }
  guint8 buf[8192];
  gsize per = sizeof buf / w->token_bytes;
  for (gsize i = 0; i < n; i += per)
    {
      gsize k = MIN (per, n - i);
      for (gsize j = 0; j < k; j++)
        {
          guint32 v = ids[i + j];
          if (w->token_bytes == 2)
            {
              g_assert (v <= G_MAXUINT16);
              guint16 le = GUINT16_TO_LE ((guint16)v);
              memcpy (buf + 2 * j, &le, 2);
            }
          else
            {
              guint32 le = GUINT32_TO_LE (v);
              memcpy (buf + 4 * j, &le, 4);
            }
        }
      if (fwrite (buf, w->token_bytes, k, w->shard.f) != k)
        return io_error (error, w->shard.path, "write", errno);
    }
  if (w->mask.f != NULL)
    {
      if (mask != NULL)
        {
          if (fwrite (mask, 1, n, w->mask.f) != n)
            return io_error (error, w->mask.path, "write", errno);
        }
      else
        {
          memset (buf, 1, sizeof buf);
          for (gsize i = 0; i < n; i += sizeof buf)
            {
              gsize k = MIN (sizeof buf, n - i);
              if (fwrite (buf, 1, k, w->mask.f) != k)
                return io_error (error, w->mask.path, "write", errno);
            }
        }
    }
  w->n_tokens += n;
  return TRUE;
}

guint64
stow_shard_writer_n_tokens (const StowShardWriter *w)
{
  return w->n_tokens;
}

static gboolean
out_finish (OutFile *o, gint32 magic, gint32 version, guint64 count,
            GError **error)
{
  gint32 header[3] = { GINT32_TO_LE (magic), GINT32_TO_LE (version),
                       GINT32_TO_LE ((gint32)count) };
  if (fflush (o->f) != 0)
    return io_error (error, o->path, "write", errno);
  if (fseek (o->f, 0, SEEK_SET) != 0
      || fwrite (header, sizeof header, 1, o->f) != 1 || fflush (o->f) != 0)
    return io_error (error, o->path, "write", errno);
  if (fsync (fileno (o->f)) != 0)
    return io_error (error, o->path, "fsync", errno);
  return TRUE;
}

gboolean
stow_shard_writer_finish (StowShardWriter *w, GError **error)
{
  g_return_val_if_fail (w != NULL && !w->finished, FALSE);
  gboolean u16 = w->token_bytes == 2;
  if (!out_finish (&w->shard, u16 ? STOW_SHARD_MAGIC_U16 : STOW_SHARD_MAGIC_U32,
                   u16 ? STOW_SHARD_VERSION_U16 : STOW_SHARD_VERSION_U32,
                   w->n_tokens, error)
      || (w->mask.f != NULL
          && !out_finish (&w->mask, STOW_MASK_MAGIC, STOW_MASK_VERSION,
                          w->n_tokens, error)))
    return FALSE;
  w->finished = TRUE;
  return TRUE;
}

static gboolean
out_commit (OutFile *o, GError **error)
{
  if (o->tmp == NULL)
    return TRUE;
  if (g_rename (o->tmp, o->path) != 0)
    return io_error (error, o->path, "rename", errno);
  g_clear_pointer (&o->tmp, g_free);
  return TRUE;
}

gboolean
stow_shard_writer_commit (StowShardWriter *w, GError **error)
{
  g_return_val_if_fail (w != NULL && w->finished, FALSE);
  return out_commit (&w->shard, error) && out_commit (&w->mask, error);
}

void
stow_shard_writer_free (StowShardWriter *w)
{
  if (w == NULL)
    return;
  out_close (&w->shard);
  out_close (&w->mask);
  g_free (w);
}
