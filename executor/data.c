/* SPDX-License-Identifier: MIT
 *
 * executor/data.c: the token stream (see data.h).  Every file is mapped
 * read-only and checked whole at open (header, size, each token against the
 * vocabulary), so that reading a batch later is a copy that cannot fail.
 */
#include "executor/data.h"

#include "data/shards.h" /* the loss mask's magic */

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
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
  /* The loss mask beside a shard X.bin, X.mask (data/shards.h), or NULL:
   * every token a target. */
  char *mask_path;
  void *mask_map;
  gsize mask_bytes;
  const guint8 *mask; /* into mask_map, past the header */
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
  if (s->mask_map != NULL)
    munmap (s->mask_map, s->mask_bytes);
  g_free (s->path);
  g_free (s->mask_path);
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

/* Maps @path read-only (*@map NULL for an empty file). */
static gboolean
map_file (const char *path, void **map, gsize *bytes, GError **error)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail (error, STOW_DATA_ERROR_IO, path, "%s", g_strerror (errno));
  struct stat sb;
  if (fstat (fd, &sb) < 0)
    {
      int e = errno;
      close (fd);
      return fail (error, STOW_DATA_ERROR_IO, path, "%s", g_strerror (e));
    }
  if (!S_ISREG (sb.st_mode))
    {
      close (fd);
      return fail (error, STOW_DATA_ERROR_IO, path, "not a regular file");
    }
  *bytes = (gsize)sb.st_size;
  *map = NULL;
  if (*bytes > 0)
    {
      *map = mmap (NULL, *bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (*map == MAP_FAILED)
        {
          int e = errno;
          *map = NULL;
          close (fd);
          return fail (error, STOW_DATA_ERROR_IO, path, "mmap: %s",
                       g_strerror (e));
        }
      madvise (*map, *bytes, MADV_SEQUENTIAL);
    }
  close (fd); /* the mapping keeps the file */
  return TRUE;
}

/* X.mask beside shard X.bin, when there is one: its header (magic,
 * version, the shard's token count) against its size, and every byte 0
 * or 1. */
static gboolean
open_mask (Shard *s, GError **error)
{
  if (!g_str_has_suffix (s->path, ".bin"))
    return TRUE;
  g_autofree char *stem = g_strndup (s->path, strlen (s->path) - 4);
  g_autofree char *path = g_strconcat (stem, ".mask", NULL);
  if (!g_file_test (path, G_FILE_TEST_EXISTS))
    return TRUE;
  s->mask_path = g_steal_pointer (&path);
  if (!map_file (s->mask_path, &s->mask_map, &s->mask_bytes, error))
    return FALSE;
  const char *p = s->mask_path;
  if (s->mask_bytes < HEADER_BYTES)
    return fail (error, STOW_DATA_ERROR_INVALID, p,
                 "%" G_GSIZE_FORMAT " bytes is shorter than the %d-byte "
                 "header of a loss mask",
                 s->mask_bytes, HEADER_BYTES);
  gint32 magic = header_int (s->mask_map, 0);
  gint32 version = header_int (s->mask_map, 1);
  gint32 count = header_int (s->mask_map, 2);
  if (magic != STOW_MASK_MAGIC)
    return fail (error, STOW_DATA_ERROR_INVALID, p,
                 "header[0] (magic) is %d, expected %d (a loss mask)", magic,
                 STOW_MASK_MAGIC);
  if (version != STOW_MASK_VERSION)
    return fail (error, STOW_DATA_ERROR_INVALID, p,
                 "header[1] (version) is %d, expected %d", version,
                 STOW_MASK_VERSION);
  if (count < 0 || (guint64)count != s->n_tokens)
    return fail (
        error, STOW_DATA_ERROR_INVALID, p,
        "header[2] (token count) is %d; its shard %s holds %" G_GUINT64_FORMAT
        " tokens",
        count, s->path, s->n_tokens);
  if (s->mask_bytes != HEADER_BYTES + (guint64)count)
    return fail (error, STOW_DATA_ERROR_INVALID, p,
                 "%" G_GSIZE_FORMAT " bytes; a mask of %d tokens has %d + %d",
                 s->mask_bytes, count, HEADER_BYTES, count);
  s->mask = (const guint8 *)s->mask_map + HEADER_BYTES;
  for (guint64 i = 0; i < s->n_tokens; i++)
    if (s->mask[i] > 1)
      return fail (error, STOW_DATA_ERROR_INVALID, p,
                   "token %" G_GUINT64_FORMAT " (byte %" G_GUINT64_FORMAT
                   ") is %u; a mask holds 0 or 1",
                   i, HEADER_BYTES + i, s->mask[i]);
  return TRUE;
}

static gboolean
open_shard (Shard *s, StowTokenizer tokenizer, guint64 vocab, GError **error)
{
  if (!map_file (s->path, &s->map, &s->map_bytes, error))
    return FALSE;
  if (tokenizer == STOW_TOKENIZER_BYTES)
    {
      s->tokens = s->map;
      s->n_tokens = s->map_bytes;
      s->token_bytes = 1;
    }
  else if (!check_shard_header (s, error) || !open_mask (s, error))
    return FALSE;
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

gboolean
stow_token_data_has_mask (const StowTokenData *d)
{
  g_return_val_if_fail (d != NULL, FALSE);
  for (guint k = 0; k < d->shards->len; k++)
    if (g_array_index (d->shards, Shard, k).mask != NULL)
      return TRUE;
  return FALSE;
}

/* Tokens [@start, @start + @count) of the stream, wrapping past its end,
 * as pieces within one shard each: @piece (@s, @in: the piece's first
 * index in @s, @n, @done: tokens before it, @out). */
static void
walk (const StowTokenData *d, guint64 start, guint64 count,
      void (*piece) (const Shard *s, guint64 in, guint64 n, guint64 done,
                     gpointer out),
      gpointer out)
{
  guint64 pos = start % d->n_tokens, done = 0;
  guint k = find_shard (d, pos);
  while (done < count)
    {
      const Shard *s = &g_array_index (d->shards, Shard, k);
      guint64 in = pos - s->first;
      guint64 take = MIN (count - done, s->n_tokens - in);
      piece (s, in, take, done, out);
      done += take;
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

static void
tokens_piece (const Shard *s, guint64 in, guint64 n, guint64 done, gpointer out)
{
  gint32 *o = (gint32 *)out + done;
  for (guint64 j = 0; j < n; j++)
    o[j] = (gint32)shard_token (s, in + j);
}

static void
mask_piece (const Shard *s, guint64 in, guint64 n, guint64 done, gpointer out)
{
  guint8 *o = (guint8 *)out + done;
  if (s->mask != NULL)
    memcpy (o, s->mask + in, n);
  else
    memset (o, 1, n);
}

void
stow_token_data_read (const StowTokenData *d, guint64 start, guint64 count,
                      gint32 *out)
{
  g_return_if_fail (d != NULL && (out != NULL || count == 0));
  walk (d, start, count, tokens_piece, out);
}

void
stow_token_data_read_mask (const StowTokenData *d, guint64 start, guint64 count,
                           guint8 *out)
{
  g_return_if_fail (d != NULL && (out != NULL || count == 0));
  walk (d, start, count, mask_piece, out);
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
  guint8 *mask;    /* window + 1 mask bytes; NULL when the data has none */
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
  if (stow_token_data_has_mask (data))
    b->mask = g_new (guint8, window + 1);
  return b;
}

void
stow_batches_free (StowBatches *b)
{
  if (b == NULL)
    return;
  g_free (b->scratch);
  g_free (b->mask);
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

/* The stream index of micro-batch @mb of step @step's first token. */
static guint64
window_start (StowBatches *b, guint64 step, guint mb)
{
  guint64 g = (step - 1) * b->grad_accum + mb;
  if (!b->shuffle)
    return g * b->window;
  make_perm (b, g / b->n_windows);
  return b->perm[g % b->n_windows] * b->window;
}

void
stow_batches_fill (StowBatches *b, guint64 step, guint mb, gint32 *tokens,
                   gint32 *targets, guint64 n)
{
  g_return_if_fail (b != NULL && step >= 1 && n <= b->window);
  guint64 start = window_start (b, step, mb);
  stow_token_data_read (b->data, start, n + 1, b->scratch);
  memcpy (tokens, b->scratch, n * sizeof (gint32));
  memcpy (targets, b->scratch + 1, n * sizeof (gint32));
  if (b->mask == NULL)
    return;
  stow_token_data_read_mask (b->data, start + 1, n, b->mask);
  for (guint64 i = 0; i < n; i++)
    if (!b->mask[i])
      targets[i] = STOW_TARGET_IGNORE;
}

guint64
stow_batches_targets (StowBatches *b, guint64 step)
{
  g_return_val_if_fail (b != NULL && step >= 1, 0);
  if (b->mask == NULL)
    return b->grad_accum * b->window;
  guint64 targets = 0;
  for (guint mb = 0; mb < b->grad_accum; mb++)
    {
      guint64 start = window_start (b, step, mb);
      stow_token_data_read_mask (b->data, start + 1, b->window, b->mask);
      for (guint64 i = 0; i < b->window; i++)
        targets += b->mask[i];
    }
  return targets;
}

double
stow_batches_loss_scale (StowBatches *b, guint64 step)
{
  guint64 targets = stow_batches_targets (b, step);
  return targets > 0 ? 1.0 / (double)targets : NAN;
}

guint64
stow_batches_n_steps (const StowBatches *b)
{
  g_return_val_if_fail (b != NULL, 0);
  guint64 per_step = b->window * b->grad_accum;
  return (stow_token_data_n_tokens (b->data) - 1) / per_step;
}
