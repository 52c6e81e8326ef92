/* SPDX-License-Identifier: MIT
 *
 * tests/test-data.c: the token stream: llm.c shards of both magics, as
 * llm.c's dev/data/data_common.py writes them (header of 256 int32: magic,
 * version, count), globs and comma lists read in sorted order, wrap-around,
 * every malformed shard refused with the file and the field named, token
 * ids checked against the vocabulary, and the bytes tokenizer.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "data/shards.h"
#include "executor/data.h"
#include "testutil-io.h"

typedef struct
{
  char *dir;
} Fixture;

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("data-test");
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  stow_test_rm_rf (f->dir);
  g_free (f->dir);
}

/* Writes an llm.c shard: the header's three fields, then @n tokens of
 * @token_bytes each (2 or 4). */
static char *
write_shard (Fixture *f, const char *name, gint32 magic, gint32 version,
             gint32 count, const guint32 *tokens, guint n, guint token_bytes)
{
  char *path = g_build_filename (f->dir, name, NULL);
  gsize len = STOW_DATA_HEADER_INTS * 4 + (gsize)n * token_bytes;
  g_autofree guint8 *buf = g_malloc0 (len);
  gint32 header[3]
      = { GINT32_TO_LE (magic), GINT32_TO_LE (version), GINT32_TO_LE (count) };
  memcpy (buf, header, sizeof header);
  for (guint i = 0; i < n; i++)
    {
      guint8 *p = buf + STOW_DATA_HEADER_INTS * 4 + (gsize)i * token_bytes;
      if (token_bytes == 2)
        {
          guint16 v = GUINT16_TO_LE ((guint16)tokens[i]);
          memcpy (p, &v, 2);
        }
      else
        {
          guint32 v = GUINT32_TO_LE (tokens[i]);
          memcpy (p, &v, 4);
        }
    }
  stow_test_write_file (path, buf, len);
  return path;
}

/* A gpt-2 shard (magic 20240520, version 1, uint16) of @n tokens from
 * @first on. */
static char *
write_u16 (Fixture *f, const char *name, guint32 first, guint n)
{
  g_autofree guint32 *t = g_new (guint32, n + 1);
  for (guint i = 0; i < n; i++)
    t[i] = first + i;
  return write_shard (f, name, STOW_DATA_MAGIC_U16, 1, (gint32)n, t, n, 2);
}

static StowTokenData *
open_ok (const char *spec, StowTokenizer tokenizer, guint64 vocab)
{
  g_autoptr (GError) error = NULL;
  StowTokenData *d = stow_token_data_open (spec, tokenizer, vocab, &error);
  g_assert_no_error (error);
  g_assert_nonnull (d);
  return d;
}

/* Refused with @code and a message that names @file and holds @fragment. */
static void
assert_refused (const char *spec, StowTokenizer tokenizer, guint64 vocab,
                gint code, const char *file, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTokenData) d
      = stow_token_data_open (spec, tokenizer, vocab, &error);
  g_assert_null (d);
  g_assert_error (error, STOW_DATA_ERROR, code);
  if (strstr (error->message, file) == NULL
      || strstr (error->message, fragment) == NULL)
    g_error ("expected \"%s\" and \"%s\" in: %s", file, fragment,
             error->message);
}

static void
test_u16 (Fixture *f, gconstpointer data)
{
  /* 50256 is GPT-2's <|endoftext|>, the largest id of its vocabulary. */
  static const guint32 tokens[] = { 15496, 11, 995, 0, 50256, 198, 7 };
  g_autofree char *path
      = write_shard (f, "gpt2.bin", STOW_DATA_MAGIC_U16, 1, 7, tokens, 7, 2);
  g_autoptr (StowTokenData) d = open_ok (path, STOW_TOKENIZER_NONE, 50257);
  g_assert_cmpuint (stow_token_data_n_tokens (d), ==, 7);
  const char *const *files = stow_token_data_files (d);
  g_assert_cmpstr (files[0], ==, path);
  g_assert_null (files[1]);
  gint32 out[7];
  stow_token_data_read (d, 0, 7, out);
  for (guint i = 0; i < 7; i++)
    g_assert_cmpint (out[i], ==, (gint32)tokens[i]);
}

static void
test_u32 (Fixture *f, gconstpointer data)
{
  /* Llama 3's vocabulary is 128256; ids past 65535 need uint32. */
  static const guint32 tokens[] = { 128000, 9906, 65536, 128255, 1 };
  g_autofree char *path
      = write_shard (f, "llama3.bin", STOW_DATA_MAGIC_U32, 7, 5, tokens, 5, 4);
  g_autoptr (StowTokenData) d = open_ok (path, STOW_TOKENIZER_NONE, 128256);
  g_assert_cmpuint (stow_token_data_n_tokens (d), ==, 5);
  gint32 out[5];
  stow_token_data_read (d, 0, 5, out);
  for (guint i = 0; i < 5; i++)
    g_assert_cmpint (out[i], ==, (gint32)tokens[i]);
}

static void
assert_files (const StowTokenData *d, const char *dir, const char *want)
{
  g_auto (GStrv) names = g_strsplit (want, " ", -1);
  const char *const *files = stow_token_data_files (d);
  guint i = 0;
  for (; names[i] != NULL; i++)
    {
      g_autofree char *path = g_build_filename (dir, names[i], NULL);
      g_assert_nonnull (files[i]);
      g_assert_cmpstr (files[i], ==, path);
    }
  g_assert_null (files[i]);
}

static void
test_globs_and_lists (Fixture *f, gconstpointer data)
{
  /* Shard k holds tokens 100 k, 100 k + 1, ...: order shows in the ids. */
  g_autofree char *c = write_u16 (f, "train_c.bin", 200, 3);
  g_autofree char *a = write_u16 (f, "train_a.bin", 0, 2);
  g_autofree char *d_ = write_u16 (f, "train_d.bin", 300, 1);
  g_autofree char *b = write_u16 (f, "train_b.bin", 100, 4);
  g_autofree char *v = write_u16 (f, "val.bin", 900, 1);

  g_autofree char *glob = g_build_filename (f->dir, "train_*.bin", NULL);
  g_autoptr (StowTokenData) all = open_ok (glob, STOW_TOKENIZER_NONE, 1000);
  assert_files (all, f->dir, "train_a.bin train_b.bin train_c.bin train_d.bin");
  g_assert_cmpuint (stow_token_data_n_tokens (all), ==, 10);
  static const gint32 want[] = { 0, 1, 100, 101, 102, 103, 200, 201, 202, 300 };
  gint32 out[10];
  stow_token_data_read (all, 0, 10, out);
  for (guint i = 0; i < 10; i++)
    g_assert_cmpint (out[i], ==, want[i]);
  /* A read that starts inside one shard and ends inside another. */
  stow_token_data_read (all, 3, 5, out);
  for (guint i = 0; i < 5; i++)
    g_assert_cmpint (out[i], ==, want[3 + i]);

  /* A list in any order, with a glob, a repeated file and an empty part:
   * sorted, each file once. */
  g_autofree char *bracket = g_build_filename (f->dir, "train_[ab].bin", NULL);
  g_autofree char *list = g_strdup_printf ("%s,%s,,%s,%s", v, bracket, c, a);
  g_autoptr (StowTokenData) some = open_ok (list, STOW_TOKENIZER_NONE, 1000);
  assert_files (some, f->dir, "train_a.bin train_b.bin train_c.bin val.bin");
  g_assert_cmpuint (stow_token_data_n_tokens (some), ==, 10);
  stow_token_data_read (some, 9, 1, out);
  g_assert_cmpint (out[0], ==, 900);

  /* A glob that matches nothing, a file that is not there. */
  g_autofree char *none = g_build_filename (f->dir, "test_*.bin", NULL);
  g_autofree char *with_none = g_strdup_printf ("%s,%s", a, none);
  assert_refused (with_none, STOW_TOKENIZER_NONE, 1000, STOW_DATA_ERROR_EMPTY,
                  none, "no file matches");
  g_autofree char *missing = g_build_filename (f->dir, "missing.bin", NULL);
  assert_refused (missing, STOW_TOKENIZER_NONE, 1000, STOW_DATA_ERROR_IO,
                  missing, "No such file");
  assert_refused ("", STOW_TOKENIZER_NONE, 1000, STOW_DATA_ERROR_EMPTY, "",
                  "names no file");
  assert_refused (",", STOW_TOKENIZER_NONE, 1000, STOW_DATA_ERROR_EMPTY, ",",
                  "names no file");
  /* A directory is not a shard. */
  assert_refused (f->dir, STOW_TOKENIZER_NONE, 1000, STOW_DATA_ERROR_IO, f->dir,
                  "not a regular file");
}

static void
test_wrap_around (Fixture *f, gconstpointer data)
{
  g_autofree char *a = write_u16 (f, "a.bin", 10, 3);
  g_autofree char *e = write_u16 (f, "b.bin", 0, 0); /* an empty shard */
  g_autofree char *c = write_u16 (f, "c.bin", 20, 2);
  g_autofree char *glob = g_build_filename (f->dir, "*.bin", NULL);
  g_autoptr (StowTokenData) d = open_ok (glob, STOW_TOKENIZER_NONE, 100);
  g_assert_cmpuint (stow_token_data_n_tokens (d), ==, 5);
  static const gint32 stream[] = { 10, 11, 12, 20, 21 };
  gint32 out[23];
  /* From the last token on: the next epoch starts at the first. */
  stow_token_data_read (d, 4, 23, out);
  for (guint i = 0; i < 23; i++)
    g_assert_cmpint (out[i], ==, stream[(4 + i) % 5]);
  /* A start past the end is taken modulo the stream. */
  stow_token_data_read (d, 5 * 1000003 + 2, 4, out);
  for (guint i = 0; i < 4; i++)
    g_assert_cmpint (out[i], ==, stream[(2 + i) % 5]);
  stow_token_data_read (d, G_MAXUINT64, 2, out);
  g_assert_cmpint (out[0], ==, stream[G_MAXUINT64 % 5]);
  g_assert_cmpint (out[1], ==, stream[(G_MAXUINT64 % 5 + 1) % 5]);
  stow_token_data_read (d, 3, 0, NULL);

  /* Only empty shards: no stream to read. */
  assert_refused (e, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_EMPTY, e,
                  "no tokens in 1 file");
}

static void
test_malformed (Fixture *f, gconstpointer data)
{
  static const guint32 tokens[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };

  /* Fewer tokens than the header says: the file was cut short. */
  g_autofree char *cut
      = write_shard (f, "cut.bin", STOW_DATA_MAGIC_U16, 1, 10, tokens, 9, 2);
  assert_refused (cut, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, cut,
                  "header[2] (token count) is 10, so the file should have "
                  "1024 + 10 x 2 = 1044 bytes; it has 1042");
  /* More than it says. */
  g_autofree char *more
      = write_shard (f, "more.bin", STOW_DATA_MAGIC_U32, 7, 5, tokens, 10, 4);
  assert_refused (more, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, more,
                  "header[2] (token count) is 5, so the file should "
                  "have 1024 + 5 x 4 = 1044 bytes; it has 1064");
  g_autofree char *negative
      = write_shard (f, "neg.bin", STOW_DATA_MAGIC_U16, 1, -3, tokens, 0, 2);
  assert_refused (negative, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID,
                  negative, "header[2] (token count) is -3");
  /* Shorter than the header itself. */
  g_autofree char *tiny = g_build_filename (f->dir, "tiny.bin", NULL);
  stow_test_write_file (tiny, "\x28\xf6\x34\x01", 4);
  assert_refused (tiny, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, tiny,
                  "4 bytes is shorter than the 1024-byte header");
  g_autofree char *empty = g_build_filename (f->dir, "empty.bin", NULL);
  stow_test_write_file (empty, "", 0);
  assert_refused (empty, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID,
                  empty, "0 bytes is shorter");

  /* Wrong magic; a magic with the other's version. */
  g_autofree char *magic
      = write_shard (f, "magic.bin", 20240522, 1, 10, tokens, 10, 2);
  assert_refused (magic, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID,
                  magic,
                  "header[0] (magic) is 20240522, expected 20240520 "
                  "(uint16 tokens) or 20240801 (uint32 tokens)");
  g_autofree char *v16
      = write_shard (f, "v16.bin", STOW_DATA_MAGIC_U16, 7, 10, tokens, 10, 2);
  assert_refused (v16, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, v16,
                  "header[1] (version) is 7, expected 1 for magic 20240520");
  g_autofree char *v32
      = write_shard (f, "v32.bin", STOW_DATA_MAGIC_U32, 1, 10, tokens, 10, 4);
  assert_refused (v32, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, v32,
                  "header[1] (version) is 1, expected 7 for magic 20240801");

  /* One bad shard among good ones is named. */
  g_autofree char *good = write_u16 (f, "a-good.bin", 0, 4);
  g_autofree char *list = g_strdup_printf ("%s,%s", good, magic);
  assert_refused (list, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID,
                  magic, "header[0] (magic)");
}

static void
test_token_vocab (Fixture *f, gconstpointer data)
{
  guint32 tokens[10];
  for (guint i = 0; i < 10; i++)
    tokens[i] = i * 9;
  tokens[7] = 150;
  g_autofree char *path
      = write_shard (f, "train.bin", STOW_DATA_MAGIC_U16, 1, 10, tokens, 10, 2);
  /* Position counted from 0 in the file; byte = 1024 + 7 x 2. */
  assert_refused (path, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_TOKEN, path,
                  "token 7 of 10 (byte 1038) is 150, vocab_size is 100");
  g_autoptr (StowTokenData) d = open_ok (path, STOW_TOKENIZER_NONE, 151);
  gint32 out;
  stow_token_data_read (d, 7, 1, &out);
  g_assert_cmpint (out, ==, 150);

  /* uint32 ids up to 2^31 - 1 leave as int32; a vocabulary past 2^31
   * could not. */
  tokens[7] = G_MAXINT32;
  g_autofree char *wide
      = write_shard (f, "wide.bin", STOW_DATA_MAGIC_U32, 7, 10, tokens, 10, 4);
  assert_refused (wide, STOW_TOKENIZER_NONE, 128256, STOW_DATA_ERROR_TOKEN,
                  wide,
                  "token 7 of 10 (byte 1052) is 2147483647, vocab_size "
                  "is 128256");
  g_autoptr (StowTokenData) w
      = open_ok (wide, STOW_TOKENIZER_NONE, (guint64)G_MAXINT32 + 1);
  stow_token_data_read (w, 7, 1, &out);
  g_assert_cmpint (out, ==, G_MAXINT32);
  assert_refused (wide, STOW_TOKENIZER_NONE, (guint64)G_MAXINT32 + 2,
                  STOW_DATA_ERROR_INVALID, wide, "is not in [1, 2^31]");
  assert_refused (wide, STOW_TOKENIZER_NONE, 0, STOW_DATA_ERROR_INVALID, wide,
                  "vocab_size 0");
}

static void
test_bytes (Fixture *f, gconstpointer data)
{
  g_autofree char *a = g_build_filename (f->dir, "a.txt", NULL);
  g_autofree char *b = g_build_filename (f->dir, "b.txt", NULL);
  stow_test_write_file (a, "Hi\n", 3);
  stow_test_write_file (b, "\xff\x00z", 3);
  g_autofree char *glob = g_build_filename (f->dir, "*.txt", NULL);
  g_autoptr (StowTokenData) d = open_ok (glob, STOW_TOKENIZER_BYTES, 256);
  g_assert_cmpuint (stow_token_data_n_tokens (d), ==, 6);
  static const gint32 want[] = { 'H', 'i', '\n', 255, 0, 'z' };
  gint32 out[8];
  stow_token_data_read (d, 0, 8, out);
  for (guint i = 0; i < 8; i++)
    g_assert_cmpint (out[i], ==, want[i % 6]);

  /* An llm.c shard read as bytes is just bytes: its header too. */
  g_autofree char *shard = write_u16 (f, "s.bin", 0, 2);
  g_autoptr (StowTokenData) s = open_ok (shard, STOW_TOKENIZER_BYTES, 32000);
  g_assert_cmpuint (stow_token_data_n_tokens (s), ==, 1024 + 4);

  /* A vocabulary that cannot hold every byte value. */
  assert_refused (glob, STOW_TOKENIZER_BYTES, 255, STOW_DATA_ERROR_INVALID,
                  glob, "--tokenizer bytes needs vocab_size >= 256");
  /* An empty file is no stream. */
  g_autofree char *e = g_build_filename (f->dir, "e.txt", NULL);
  stow_test_write_file (e, "", 0);
  assert_refused (e, STOW_TOKENIZER_BYTES, 256, STOW_DATA_ERROR_EMPTY, e,
                  "no tokens");
}

/* Shard @name.bin of tokens 0 .. n-1 and, unless @mask is NULL, its
 * loss mask @name.mask, written by data/'s writer as `stowage tokenize`
 * writes them. */
static char *
write_masked (Fixture *f, const char *name, guint n, const guint8 *mask)
{
  g_autofree char *bin = g_strdup_printf ("%s/%s.bin", f->dir, name);
  g_autofree char *mpath = g_strdup_printf ("%s/%s.mask", f->dir, name);
  g_autofree guint32 *ids = g_new (guint32, n);
  for (guint i = 0; i < n; i++)
    ids[i] = i;
  g_autoptr (GError) error = NULL;
  g_autoptr (StowShardWriter) w
      = stow_shard_writer_new (bin, mask ? mpath : NULL, 2, &error);
  g_assert_no_error (error);
  g_assert_true (stow_shard_writer_append (w, ids, mask, n, &error));
  g_assert_true (stow_shard_writer_finish (w, &error));
  g_assert_true (stow_shard_writer_commit (w, &error));
  g_assert_no_error (error);
  return g_steal_pointer (&bin);
}

/* Supervised fine-tuning's masks: a target whose mask byte is 0 is
 * ignored, and the step's loss scale is 1 / the targets of its whole
 * global batch (1 / (grad_accum x window) without masks); a shard with
 * no mask beside it counts every token. */
static void
test_masks (Fixture *f, gconstpointer data)
{
  guint8 mask[40];
  for (guint i = 0; i < 40; i++)
    mask[i] = i % 3 != 0; /* 0, 3, 6, ... are prompt tokens */
  g_autofree char *a = write_masked (f, "a", 40, mask);
  g_autofree char *b = write_masked (f, "b", 40, NULL);
  g_autoptr (StowTokenData) d = open_ok (a, STOW_TOKENIZER_NONE, 100);
  g_assert_true (stow_token_data_has_mask (d));
  g_autoptr (StowBatches) bt = stow_batches_new (d, 8, 2, FALSE, 0);
  gint32 tokens[8], targets[8];
  /* Step 2, micro-batch 1: window 3, tokens 24 .. 31, targets 25 .. 32. */
  stow_batches_fill (bt, 2, 1, tokens, targets, 8);
  for (guint i = 0; i < 8; i++)
    {
      g_assert_cmpint (tokens[i], ==, 24 + i);
      gint32 t = 25 + i;
      g_assert_cmpint (targets[i], ==, t % 3 ? t : STOW_TARGET_IGNORE);
    }
  /* Step 1 reads targets 1 .. 16: 11 of them are not multiples of 3. */
  g_assert_cmpfloat (stow_batches_loss_scale (bt, 1), ==, 1.0 / 11.0);

  g_autoptr (StowTokenData) u = open_ok (b, STOW_TOKENIZER_NONE, 100);
  g_assert_false (stow_token_data_has_mask (u));
  g_autoptr (StowBatches) ub = stow_batches_new (u, 8, 2, FALSE, 0);
  g_assert_cmpfloat (stow_batches_loss_scale (ub, 1), ==, 1.0 / 16.0);
  stow_batches_fill (ub, 1, 0, tokens, targets, 8);
  for (guint i = 0; i < 8; i++)
    g_assert_cmpint (targets[i], ==, 1 + i);

  /* Both: b's tokens (40 .. 79 of the stream) count whole. */
  g_autofree char *both = g_strdup_printf ("%s,%s", a, b);
  g_autoptr (StowTokenData) m = open_ok (both, STOW_TOKENIZER_NONE, 100);
  guint8 got[80];
  stow_token_data_read_mask (m, 0, 80, got);
  for (guint i = 0; i < 80; i++)
    g_assert_cmpuint (got[i], ==, i < 40 ? mask[i] : 1);

  /* A step whose every target is masked has no loss to take the mean of. */
  guint8 none[40] = { 0 };
  g_autofree char *z = write_masked (f, "z", 40, none);
  g_autoptr (StowTokenData) zd = open_ok (z, STOW_TOKENIZER_NONE, 100);
  g_autoptr (StowBatches) zb = stow_batches_new (zd, 8, 2, FALSE, 0);
  g_assert_true (isnan (stow_batches_loss_scale (zb, 1)));
}

/* A mask that is not its shard's: refused naming the mask file and the
 * field. */
static void
test_masks_malformed (Fixture *f, gconstpointer data)
{
  guint8 mask[10];
  memset (mask, 1, sizeof mask);
  g_autofree char *a = write_masked (f, "a", 10, mask);
  g_autofree char *mpath = g_strdup_printf ("%s/a.mask", f->dir);
  g_autoptr (GBytes) good = stow_test_read_file (mpath);
  gsize len = 0;
  const guint8 *orig = g_bytes_get_data (good, &len);
  g_assert_cmpuint (len, ==, STOW_DATA_HEADER_INTS * 4 + 10);
  static const struct
  {
    guint at;
    guint8 value;
    const char *says;
  } cases[] = {
    { 0, 0x01, "header[0] (magic)" },
    { 4, 0x02, "header[1] (version)" },
    { 8, 0x09, "header[2] (token count) is 9" },
    { STOW_DATA_HEADER_INTS * 4 + 4, 2, "token 4 (byte 1028) is 2" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree guint8 *bad = g_memdup2 (orig, len);
      bad[cases[i].at] = cases[i].value;
      stow_test_write_file (mpath, bad, len);
      assert_refused (a, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID,
                      mpath, cases[i].says);
    }
  stow_test_write_file (mpath, orig, len - 1);
  assert_refused (a, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, mpath,
                  "a mask of 10 tokens has 1024 + 10");
  stow_test_write_file (mpath, orig, 100);
  assert_refused (a, STOW_TOKENIZER_NONE, 100, STOW_DATA_ERROR_INVALID, mpath,
                  "shorter than the 1024-byte header");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
#define ADD(path, fn)                                                          \
  g_test_add (path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD ("/data/shard/u16", test_u16);
  ADD ("/data/shard/u32", test_u32);
  ADD ("/data/globs-and-lists", test_globs_and_lists);
  ADD ("/data/wrap-around", test_wrap_around);
  ADD ("/data/malformed", test_malformed);
  ADD ("/data/token-vocab", test_token_vocab);
  ADD ("/data/bytes", test_bytes);
  ADD ("/data/masks", test_masks);
  ADD ("/data/masks-malformed", test_masks_malformed);
#undef ADD
  return g_test_run ();
}
