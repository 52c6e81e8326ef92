/* SPDX-License-Identifier: MIT
 *
 * executor/data.c: the token stream (see data.h).  Every file is mapped
 * read-only and checked whole at open (header, size, each token against the
 * vocabulary), so that reading a batch later is a copy that cannot fail.
 */
#include "executor/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* clang-format off */
G_DEFINE_QUARK (stow-data-error-quark, stow_data_error)
/* clang-format on */

#define HEADER_BYTES (STOW_DATA_HEADER_INTS * 4)

/* The version each magic comes with, as llm.c's dev/data/data_common.py
 * writes them (HEADERS_INFO: gpt-2 version 1, llama-3 version 7). */
#define VERSION_U16 1
#define VERSION_U32 7

typedef struct
{
  char *path;
  void *map; /* NULL for an empty file */
  gsize map_bytes;
  const guint8 *tokens; /* into map, past the header */
  guint64 n_tokens;
  guint token_bytes; /* 1 (bytes), 2 or 4 */
  guint64 first;     /* the stream index of its first token */
} Shard;

struct _StowTokenData
{
  GArray *shards; /* Shard, in stream order */
  char **files;   /* NULL-terminated */
  guint64 n_tokens;
};

static void
shard_clear (gpointer p)
{
  Shard *s = p;
  if (s->map != NULL)
    munmap (s->map, s->map_bytes);
  g_free (s->path);
}

static gboolean G_GNUC_PRINTF (4, 5)
    fail (GError **error, StowDataError code, const char *path,
          const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_DATA_ERROR, code, "%s: %s", path, what);
  return FALSE;
}

static gint32
header_int (const guint8 *map, guint i)
{
  gint32 v;
  memcpy (&v, map + 4 * i, 4);
  return GINT32_FROM_LE (v);
}

/* Whether the first bytes of a file read as UTF-8 text without control
 * characters but tab, newline, form feed and carriage return (an llm.c
 * header's magic has a 0x01 among its bytes). */
static gboolean
looks_like_text (const guint8 *p, gsize size)
{
  gsize n = MIN (size, (gsize)HEADER_BYTES);
  if (n == 0)
    return FALSE;
  const char *end = NULL;
  gsize good = n;
  if (!g_utf8_validate ((const char *)p, (gssize)n, &end))
    {
      /* Only a character cut by the end of the sample is still text: a
       * lead byte, then continuation bytes to the end. */
      good = (gsize)(end - (const char *)p);
      if (n == size || n - good >= 4 || p[good] < 0xc2 || p[good] > 0xf4)
        return FALSE;
      for (gsize i = good + 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
          return FALSE;
    }
  for (gsize i = 0; i < good; i++)
    if (p[i] < 0x20 && p[i] != '\t' && p[i] != '\n' && p[i] != '\r'
        && p[i] != '\f')
      return FALSE;
  return TRUE;
}

static gboolean
refuse_text (const Shard *s, GError **error)
{
  return fail (error, STOW_DATA_ERROR_INVALID, s->path,
               "this looks like text, not an llm.c token shard; train on it "
               "one token per byte with --tokenizer bytes, or make token "
               "shards with the model's tokenizer (stowage tokenize)");
}

/* An llm.c shard's header against its size: magic, version, count. */
static gboolean
check_shard_header (Shard *s, GError **error)
{
  if (looks_like_text (s->map, s->map_bytes))
    return refuse_text (s, error);
  if (s->map_bytes < HEADER_BYTES)
    return fail (error, STOW_DATA_ERROR_INVALID, s->path,
                 "%" G_GSIZE_FORMAT " bytes is shorter than the %d-byte "
                 "header of an llm.c token shard",
                 s->map_bytes, HEADER_BYTES);
  const guint8 *map = s->map;
  gint32 magic = header_int (map, 0), version = header_int (map, 1);
  gint32 expected_version;
  if (magic == STOW_DATA_MAGIC_U16)
    {
      s->token_bytes = 2;
      expected_version = VERSION_U16;
    }
  else if (magic == STOW_DATA_MAGIC_U32)
    {
      s->token_bytes = 4;
      expected_version = VERSION_U32;
    }
  else
    return fail (error, STOW_DATA_ERROR_INVALID, s->path,
                 "header[0] (magic) is %d, expected %d (uint16 tokens) or %d "
                 "(uint32 tokens)",
                 magic, STOW_DATA_MAGIC_U16, STOW_DATA_MAGIC_U32);
  if (version != expected_version)
    return fail (error, STOW_DATA_ERROR_INVALID, s->path,
                 "header[1] (version) is %d, expected %d for magic %d", version,
                 expected_version, magic);
  gint32 count = header_int (map, 2);
  if (count < 0)
    return fail (error, STOW_DATA_ERROR_INVALID, s->path,
                 "header[2] (token count) is %d", count);
  guint64 want = HEADER_BYTES + (guint64)count * s->token_bytes;
  if (want != s->map_bytes)
    return fail (
        error, STOW_DATA_ERROR_INVALID, s->path,
        "header[2] (token count) is %d, so the file should have "
        "%d + %d x %u = %" G_GUINT64_FORMAT " bytes; it has %" G_GSIZE_FORMAT,
        count, HEADER_BYTES, count, s->token_bytes, want, s->map_bytes);
  s->tokens = map + HEADER_BYTES;
  s->n_tokens = (guint64)count;
  return TRUE;
}

static guint32
shard_token (const Shard *s, guint64 i)
{
  switch (s->token_bytes)
    {
    case 1:
      return s->tokens[i];
    case 2:
      {
        guint16 v;
        memcpy (&v, s->tokens + 2 * i, 2);
        return GUINT16_FROM_LE (v);
      }
    default:
      {
        guint32 v;
        memcpy (&v, s->tokens + 4 * i, 4);
        return GUINT32_FROM_LE (v);
      }
    }
}

static gboolean
check_tokens (const Shard *s, guint64 vocab, GError **error)
{
  /* A byte is always below a vocabulary of 256 or more (checked at open). */
  if (s->token_bytes == 1)
    return TRUE;
  for (guint64 i = 0; i < s->n_tokens; i++)
    {
      guint32 t = shard_token (s, i);
      if (t >= vocab)
        return fail (error, STOW_DATA_ERROR_TOKEN, s->path,
                     "token %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT
                     " (byte %" G_GUINT64_FORMAT
                     ") is %u, vocab_size is %" G_GUINT64_FORMAT,
                     i, s->n_tokens, HEADER_BYTES + i * s->token_bytes, t,
                     vocab);
    }
  return TRUE;
}

static gboolean
open_shard (Shard *s, StowTokenizer tokenizer, guint64 vocab, GError **error)
{
  int fd = open (s->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail (error, STOW_DATA_ERROR_IO, s->path, "%s", g_strerror (errno));
  struct stat sb;
  if (fstat (fd, &sb) < 0)
    {
      int e = errno;
      close (fd);
      return fail (error, STOW_DATA_ERROR_IO, s->path, "%s", g_strerror (e));
    }
  if (!S_ISREG (sb.st_mode))
    {
      close (fd);
      return fail (error, STOW_DATA_ERROR_IO, s->path, "not a regular file");
    }
  s->map_bytes = (gsize)sb.st_size;
  if (s->map_bytes > 0)
    {
      s->map = mmap (NULL, s->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (s->map == MAP_FAILED)
        {
          int e = errno;
          s->map = NULL;
          close (fd);
          return fail (error, STOW_DATA_ERROR_IO, s->path, "mmap: %s",
                       g_strerror (e));
        }
    }
  close (fd); /* the mapping keeps the file */
  if (tokenizer == STOW_TOKENIZER_BYTES)
    {
      s->tokens = s->map;
      s->n_tokens = s->map_bytes;
      s->token_bytes = 1;
    }
  else if (!check_shard_header (s, error))
    return FALSE;
  if (s->map != NULL)
    madvise (s->map, s->map_bytes, MADV_SEQUENTIAL);
  return check_tokens (s, vocab, error);
}

static gboolean
has_glob_magic (const char *s)
{
  return strpbrk (s, "*?[") != NULL;
}

static gint
compare_paths (gconstpointer a, gconstpointer b)
{
  return strcmp (*(const char *const *)a, *(const char *const *)b);
}

/* The files @spec names: its parts between commas, each a path or a glob,
 * all sorted by name and each file taken once. */
static char **
expand_spec (const char *spec, GError **error)
{
  g_auto (GStrv) parts = g_strsplit (spec, ",", -1);
  g_autoptr (GPtrArray) files = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; parts[i] != NULL; i++)
    {
      const char *p = parts[i];
      if (p[0] == '\0')
        continue; /* "a.bin,,b.bin" or a trailing comma */
      if (!has_glob_magic (p))
        {
          g_ptr_array_add (files, g_strdup (p));
          continue;
        }
      glob_t g = { 0 };
      int rc = glob (p, 0, NULL, &g);
      if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0))
        {
          globfree (&g);
          fail (error, STOW_DATA_ERROR_EMPTY, p, "no file matches");
          return NULL;
        }
      if (rc != 0)
        {
          globfree (&g);
          fail (error, STOW_DATA_ERROR_IO, p, "glob failed (%s)",
                rc == GLOB_NOSPACE ? "out of memory" : "read error");
          return NULL;
        }
      for (gsize j = 0; j < g.gl_pathc; j++)
        g_ptr_array_add (files, g_strdup (g.gl_pathv[j]));
      globfree (&g);
    }
  if (files->len == 0)
    {
      fail (error, STOW_DATA_ERROR_EMPTY, spec, "names no file");
      return NULL;
    }
  g_ptr_array_sort (files, compare_paths);
  GPtrArray *unique = g_ptr_array_new ();
  for (guint i = 0; i < files->len; i++)
    if (i == 0 || strcmp (files->pdata[i], files->pdata[i - 1]) != 0)
      g_ptr_array_add (unique, g_strdup (files->pdata[i]));
  g_ptr_array_add (unique, NULL);
  return (char **)g_ptr_array_free (unique, FALSE);
}

StowTokenData *
stow_token_data_open (const char *spec, StowTokenizer tokenizer, guint64 vocab,
                      GError **error)
{
  g_return_val_if_fail (spec != NULL, NULL);
  g_return_val_if_fail (tokenizer == STOW_TOKENIZER_NONE
                            || tokenizer == STOW_TOKENIZER_BYTES,
                        NULL);
  /* Token ids leave as int32 (stow_token_data_read). */
  if (vocab == 0 || vocab > (guint64)G_MAXINT32 + 1)
    {
      fail (error, STOW_DATA_ERROR_INVALID, spec,
            "vocab_size %" G_GUINT64_FORMAT " is not in [1, 2^31]", vocab);
      return NULL;
    }
  if (tokenizer == STOW_TOKENIZER_BYTES && vocab < 256)
    {
      fail (error, STOW_DATA_ERROR_INVALID, spec,
            "--tokenizer bytes needs vocab_size >= 256 (one token per byte "
            "value), the model has %" G_GUINT64_FORMAT,
            vocab);
      return NULL;
    }
  g_autoptr (StowTokenData) d = g_new0 (StowTokenData, 1);
  d->shards = g_array_new (FALSE, TRUE, sizeof (Shard));
  g_array_set_clear_func (d->shards, shard_clear);
  d->files = expand_spec (spec, error);
  if (d->files == NULL)
    return NULL;
  for (guint i = 0; d->files[i] != NULL; i++)
    {
      Shard s = { .path = g_strdup (d->files[i]), .first = d->n_tokens };
      gboolean ok = open_shard (&s, tokenizer, vocab, error);
      g_array_append_val (d->shards, s);
      if (!ok)
        return NULL;
      d->n_tokens += s.n_tokens;
    }
  if (d->n_tokens == 0)
    {
      fail (error, STOW_DATA_ERROR_EMPTY, spec, "no tokens in %u file%s",
            d->shards->len, d->shards->len == 1 ? "" : "s");
      return NULL;
    }
  return g_steal_pointer (&d);
}

void
stow_token_data_free (StowTokenData *d)
{
  if (d == NULL)
    return;
  g_clear_pointer (&d->shards, g_array_unref);
  g_strfreev (d->files);
  g_free (d);
}

guint64
stow_token_data_n_tokens (const StowTokenData *d)
{
  g_return_val_if_fail (d != NULL, 0);
  return d->n_tokens;
}

const char *const *
stow_token_data_files (const StowTokenData *d)
{
  g_return_val_if_fail (d != NULL, NULL);
  return (const char *const *)d->files;
}

/* The shard holding stream token @i: the first whose end is past @i (so
 * never an empty one). */
static guint
find_shard (const StowTokenData *d, guint64 i)
{
  guint lo = 0, hi = d->shards->len - 1;
  while (lo < hi)
    {
      guint mid = lo + (hi - lo) / 2;
      const Shard *s = &g_array_index (d->shards, Shard, mid);
      if (s->first + s->n_tokens > i)
        hi = mid;
      else
        lo = mid + 1;
    }
  return lo;
}

void
stow_token_data_read (const StowTokenData *d, guint64 start, guint64 count,
                      gint32 *out)
{
  g_return_if_fail (d != NULL && (out != NULL || count == 0));
  guint64 pos = start % d->n_tokens;
  guint k = find_shard (d, pos);
  while (count > 0)
    {
      const Shard *s = &g_array_index (d->shards, Shard, k);
      guint64 in = pos - s->first;
      guint64 take = MIN (count, s->n_tokens - in);
      for (guint64 j = 0; j < take; j++)
        out[j] = (gint32)shard_token (s, in + j);
      out += take;
      count -= take;
      pos += take;
      if (pos == s->first + s->n_tokens)
        {
          /* The next non-empty shard, or the stream's start (next epoch). */
          do
            k = (k + 1) % d->shards->len;
          while (g_array_index (d->shards, Shard, k).n_tokens == 0);
          pos = g_array_index (d->shards, Shard, k).first;
        }
    }
}

/* ---- micro-batches --------------------------------------------------------
 */

struct _StowBatches
{
  const StowTokenData *data;
  guint64 window;    /* tokens per micro-batch: B T */
  guint64 n_windows; /* whole windows in the stream (shuffle) */
  guint64 grad_accum;
  gboolean shuffle;
  guint64 seed;
  gint32 *scratch; /* window + 1 tokens */
  guint64 perm_epoch;
  guint64 *perm;
};

StowBatches *
stow_batches_new (const StowTokenData *data, guint64 window, guint64 grad_accum,
                  gboolean shuffle, guint64 seed)
{
  g_return_val_if_fail (data != NULL && window > 0 && grad_accum > 0, NULL);
  g_return_val_if_fail (stow_token_data_n_tokens (data) >= window + 1, NULL);
  StowBatches *b = g_new0 (StowBatches, 1);
  b->data = data;
  b->window = window;
  b->n_windows = (stow_token_data_n_tokens (data) - 1) / window;
  b->grad_accum = grad_accum;
  b->shuffle = shuffle;
  b->seed = seed;
  b->scratch = g_new (gint32, window + 1);
  return b;
}

void
stow_batches_free (StowBatches *b)
{
  if (b == NULL)
    return;
  g_free (b->scratch);
  g_free (b->perm);
  g_free (b);
}

/* The permutation of the windows for pass @epoch over the stream. */
static void
make_perm (StowBatches *b, guint64 epoch)
{
  if (b->perm != NULL && b->perm_epoch == epoch)
    return;
  if (b->perm == NULL)
    b->perm = g_new (guint64, b->n_windows);
  for (guint64 i = 0; i < b->n_windows; i++)
    b->perm[i] = i;
  GRand *rng = g_rand_new_with_seed_array (
      (const guint32[]){ (guint32)b->seed, (guint32)(b->seed >> 32),
                         (guint32)epoch, (guint32)(epoch >> 32) },
      4);
  for (guint64 i = b->n_windows - 1; i > 0; i--)
    {
      guint64 j = (guint64)g_rand_double_range (rng, 0, (double)(i + 1));
      j = MIN (j, i);
      guint64 t = b->perm[i];
      b->perm[i] = b->perm[j], b->perm[j] = t;
    }
  g_rand_free (rng);
  b->perm_epoch = epoch;
}

void
stow_batches_fill (StowBatches *b, guint64 step, guint mb, gint32 *tokens,
                   gint32 *targets, guint64 n)
{
  g_return_if_fail (b != NULL && step >= 1 && n <= b->window);
  guint64 g = (step - 1) * b->grad_accum + mb;
  guint64 start = g * b->window;
  if (b->shuffle)
    {
      make_perm (b, g / b->n_windows);
      start = b->perm[g % b->n_windows] * b->window;
    }
  stow_token_data_read (b->data, start, n + 1, b->scratch);
  memcpy (tokens, b->scratch, n * sizeof (gint32));
  memcpy (targets, b->scratch + 1, n * sizeof (gint32));
}
