/* SPDX-License-Identifier: MIT
 *
 * tests/test-fuzz-io.c: a fixed-seed mutation fuzzer over the three parsers
 * of untrusted files: the safetensors header, llm.c token shards and the
 * optimizer-state file.  Each starts from valid files and applies bit
 * flips, truncations, insertions, deletions, copies and edits of the length
 * fields; every input must be accepted and readable, or refused with a
 * GError whose message names the file, never crash or hang.  Under ASan
 * and UBSan this covers every bounds and overflow check on the way.
 * STOW_FUZZ_ITERS scales the runs (default 3000 inputs per parser),
 * STOW_FUZZ_SEED changes the seed.
 */
#include "config.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <xxhash.h>

#include "executor/checkpoint.h"
#include "executor/data.h"
#include "executor/optim-state.h"
#include "executor/safetensors.h"
#include "testutil-io.h"

typedef struct
{
  guint offset, width; /* a length, count or version field to edit */
} Field;

typedef struct
{
  char *dir;
  GRand *rand;
  guint iters;
} Fuzz;

static void
fuzz_set_up (Fuzz *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("fuzz-io");
  const char *env = g_getenv ("STOW_FUZZ_ITERS");
  f->iters = env ? (guint)g_ascii_strtoull (env, NULL, 10) : 3000;
  const char *seed_env = g_getenv ("STOW_FUZZ_SEED");
  guint32 seed
      = seed_env ? (guint32)g_ascii_strtoull (seed_env, NULL, 10) : 20240520u;
  /* One stream per parser, so that adding inputs to one leaves the others
   * as they were. */
  f->rand = g_rand_new_with_seed (seed + GPOINTER_TO_UINT (data));
  g_test_message ("seed %u, %u inputs", seed, f->iters);
}

static void
fuzz_tear_down (Fuzz *f, gconstpointer data)
{
  g_rand_free (f->rand);
  stow_test_rm_rf (f->dir);
  g_free (f->dir);
}

/* Without the fsync of g_file_set_contents: thousands of inputs.  A new
 * file each time: ext4 flushes a file truncated and rewritten in place
 * (auto_da_alloc), which would cost a disk write per input. */
static void
write_input (const char *path, const guint8 *data, gsize len)
{
  g_unlink (path);
  int fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  g_assert_cmpint (fd, >=, 0);
  g_assert_cmpint (write (fd, data, len), ==, (gssize)len);
  g_assert_cmpint (close (fd), ==, 0);
}

static GBytes *
read_bytes (const char *path)
{
  return stow_test_read_file (path);
}

/* Bytes that matter to a JSON scanner or a length. */
static const guint8 interesting[]
    = { 0,   0xff, '[', '{',  '"', '\\', '}', ']',  ',',  ':',
        '-', '9',  ' ', 0x80, '0', 'e',  '.', 0x7f, '\n', 0xc3 };

static guint64
interesting_length (GRand *r, gsize len)
{
  switch (g_rand_int_range (r, 0, 12))
    {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return len;
    case 3:
      return len - MIN (len, 8);
    case 4:
      return len + 1;
    case 5:
      return G_MAXUINT64;
    case 6:
      return (guint64)G_MAXINT64;
    case 7:
      return (guint64)1 << 63;
    case 8:
      return STOW_SAFETENSORS_MAX_HEADER;
    case 9:
      return STOW_SAFETENSORS_MAX_HEADER + 1;
    case 10:
      return G_MAXUINT32;
    default:
      return g_rand_int (r);
    }
}

/* A position, in the first @hot bytes three times in four (the header,
 * where the parsing is). */
static gsize
position (GRand *r, gsize len, gsize hot)
{
  if (len == 0)
    return 0;
  if (hot > 0 && g_rand_int_range (r, 0, 4) != 0)
    return g_rand_int_range (r, 0, (gint32)MIN (hot, len));
  return g_rand_int_range (r, 0, (gint32)len);
}

static void
mutate (GRand *r, GByteArray *b, gsize hot, const Field *fields, guint n_fields)
{
  /* One edit half the time: more inputs get past the first check. */
  guint n_ops = g_rand_boolean (r) ? 1 : g_rand_int_range (r, 2, 5);
  for (guint op = 0; op < n_ops; op++)
    {
      gsize len = b->len;
      switch (g_rand_int_range (r, 0, 9))
        {
        case 0: /* flip a bit */
          if (len > 0)
            b->data[position (r, len, hot)] ^= 1u << g_rand_int_range (r, 0, 8);
          break;
        case 1: /* an interesting byte */
          if (len > 0)
            b->data[position (r, len, hot)]
                = interesting[g_rand_int_range (r, 0, sizeof interesting)];
          break;
        case 2: /* truncate */
          g_byte_array_set_size (b, len ? g_rand_int_range (r, 0, (gint32)len)
                                        : 0);
          break;
        case 3: /* insert bytes */
          {
            guint8 ins[16];
            guint n = g_rand_int_range (r, 1, 17);
            for (guint i = 0; i < n; i++)
              ins[i] = g_rand_boolean (r) ? interesting[g_rand_int_range (
                           r, 0, sizeof interesting)]
                                          : (guint8)g_rand_int (r);
            gsize at = position (r, len + 1, hot);
            g_byte_array_set_size (b, (guint)(len + n));
            memmove (b->data + at + n, b->data + at, len - at);
            memcpy (b->data + at, ins, n);
            break;
          }
        case 4: /* delete bytes */
          if (len > 0)
            {
              gsize at = position (r, len, hot);
              gsize n = g_rand_int_range (r, 1, 17); /* MIN evaluates twice */
              g_byte_array_remove_range (b, (guint)at,
                                         (guint)MIN (len - at, n));
            }
          break;
        case 5: /* copy a run over another place */
          if (len > 2)
            {
              gsize from = position (r, len, hot), to = position (r, len, hot);
              gsize n = g_rand_int_range (r, 1, 33);
              n = MIN (n, MIN (len - from, len - to));
              memmove (b->data + to, b->data + from, n);
            }
          break;
        case 6: /* another digit: numbers in a JSON header change */
          for (guint tries = 0; tries < 64 && len > 0; tries++)
            {
              gsize at = position (r, len, hot);
              if (g_ascii_isdigit (b->data[at]))
                {
                  b->data[at] = (guint8)('0' + g_rand_int_range (r, 0, 10));
                  break;
                }
            }
          break;
        default: /* a length, count or version field */
          {
            const Field *fl
                = &fields[g_rand_int_range (r, 0, (gint32)n_fields)];
            if (fl->offset + fl->width > len)
              break;
            guint64 v = interesting_length (r, len);
            if (fl->width == 4)
              {
                guint32 le = GUINT32_TO_LE ((guint32)v);
                memcpy (b->data + fl->offset, &le, 4);
              }
            else
              {
                guint64 le = GUINT64_TO_LE (v);
                memcpy (b->data + fl->offset, &le, 8);
              }
            break;
          }
        }
    }
}

/* A refusal: a GError whose message is not empty and names the file. */
static void
assert_refusal (const GError *error, const char *path)
{
  g_assert_nonnull (error);
  g_assert_nonnull (error->message);
  g_assert_cmpuint (strlen (error->message), >, 0);
  if (strstr (error->message, path) == NULL)
    g_error ("the message does not name %s: %s", path, error->message);
}

/* ---- safetensors --------------------------------------------------------- */

static GBytes *
safetensors_seed (Fuzz *f)
{
  g_autofree char *path = g_build_filename (f->dir, "seed.safetensors", NULL);
  static const StowSafetensorSpec specs[] = {
    { .name = "w", .dtype = "F32", .shape = { 2, 3 }, .n_dims = 2 },
    { .name = "model.norm.weight",
      .dtype = "BF16",
      .shape = { 5 },
      .n_dims = 1 },
    { .name = "s", .dtype = "I64", .n_dims = 0 },
    { .name = "e", .dtype = "U8", .shape = { 0, 4 }, .n_dims = 2 },
  };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensorsWriter) w = stow_safetensors_writer_new (
      path, specs, G_N_ELEMENTS (specs), NULL, &error);
  g_assert_no_error (error);
  guint8 data[24 + 10 + 8];
  for (guint i = 0; i < sizeof data; i++)
    data[i] = (guint8)(i * 37);
  g_assert_true (stow_safetensors_writer_write (w, data, sizeof data, &error));
  g_assert_true (stow_safetensors_writer_finish (w, &error));
  g_assert_no_error (error);
  return read_bytes (path);
}

static void
test_fuzz_safetensors (Fuzz *f, gconstpointer data)
{
  g_autoptr (GBytes) seed = safetensors_seed (f);
  gsize seed_len;
  const guint8 *seed_data = g_bytes_get_data (seed, &seed_len);
  static const Field fields[] = { { 0, 8 } };
  g_autofree char *path = g_build_filename (f->dir, "in.safetensors", NULL);
  guint accepted = 0;
  for (guint it = 0; it < f->iters; it++)
    {
      g_autoptr (GByteArray) b = g_byte_array_new ();
      g_byte_array_append (b, seed_data, (guint)seed_len);
      mutate (f->rand, b, seed_len - 42, fields, G_N_ELEMENTS (fields));
      write_input (path, b->data, b->len);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
      if (st == NULL)
        {
          assert_refusal (error, path);
          continue;
        }
      g_assert_no_error (error);
      accepted++;
      /* Whatever was accepted lies inside the file: every byte reads. */
      for (guint i = 0; i < stow_safetensors_n_tensors (st); i++)
        {
          const StowSafetensor *t = stow_safetensors_nth (st, i);
          g_assert_cmpuint (t->nbytes, <=, b->len);
          g_assert_true (stow_safetensors_find (st, t->name) == t);
          g_autofree guint8 *buf = g_malloc (t->nbytes + 1);
          g_assert_true (
              stow_safetensors_read (st, t, 0, buf, t->nbytes, &error));
          g_assert_no_error (error);
        }
    }
  g_test_message ("%u of %u inputs accepted", accepted, f->iters);
}

/* ---- token shards -------------------------------------------------------- */

static GBytes *
shard_seed (gint32 magic, gint32 version, guint token_bytes)
{
  guint n = 24;
  g_autoptr (GByteArray) b = g_byte_array_new ();
  g_byte_array_set_size (b, STOW_DATA_HEADER_INTS * 4 + n * token_bytes);
  memset (b->data, 0, b->len);
  gint32 header[3] = { GINT32_TO_LE (magic), GINT32_TO_LE (version),
                       GINT32_TO_LE ((gint32)n) };
  memcpy (b->data, header, sizeof header);
  for (guint i = 0; i < n; i++)
    {
      guint32 t = i * 2011u % 50257u;
      guint8 *p = b->data + STOW_DATA_HEADER_INTS * 4 + i * token_bytes;
      if (token_bytes == 2)
        {
          guint16 v = GUINT16_TO_LE ((guint16)t);
          memcpy (p, &v, 2);
        }
      else
        {
          guint32 v = GUINT32_TO_LE (t);
          memcpy (p, &v, 4);
        }
    }
  return g_byte_array_free_to_bytes (g_steal_pointer (&b));
}

static void
test_fuzz_shard (Fuzz *f, gconstpointer data)
{
  GBytes *seeds[2] = { shard_seed (STOW_DATA_MAGIC_U16, 1, 2),
                       shard_seed (STOW_DATA_MAGIC_U32, 7, 4) };
  static const Field fields[] = { { 0, 4 }, { 4, 4 }, { 8, 4 } };
  static const guint64 vocabs[] = { 50257, 65536, 128256, 300, 1 };
  g_autofree char *path = g_build_filename (f->dir, "in.bin", NULL);
  guint accepted = 0;
  for (guint it = 0; it < f->iters; it++)
    {
      gsize seed_len;
      const guint8 *seed_data = g_bytes_get_data (seeds[it % 2], &seed_len);
      g_autoptr (GByteArray) b = g_byte_array_new ();
      g_byte_array_append (b, seed_data, (guint)seed_len);
      /* Hot: the three header fields and the tokens; the rest of the
       * header is reserved. */
      mutate (f->rand, b, 12, fields, G_N_ELEMENTS (fields));
      if (g_rand_boolean (f->rand) && b->len > 1024)
        b->data[g_rand_int_range (f->rand, 1024, (gint32)b->len)]
            ^= 1u << g_rand_int_range (f->rand, 0, 8);
      write_input (path, b->data, b->len);
      guint64 vocab
          = vocabs[g_rand_int_range (f->rand, 0, G_N_ELEMENTS (vocabs))];
      g_autoptr (GError) error = NULL;
      g_autoptr (StowTokenData) d
          = stow_token_data_open (path, STOW_TOKENIZER_NONE, vocab, &error);
      if (d == NULL)
        {
          assert_refusal (error, path);
          continue;
        }
      g_assert_no_error (error);
      accepted++;
      /* Every token of an accepted stream is in the vocabulary, and reads
       * wrap around. */
      guint64 n = stow_token_data_n_tokens (d);
      g_assert_cmpuint (n, >, 0);
      g_assert_cmpuint (n, <=, b->len);
      g_autofree gint32 *out = g_new (gint32, 2 * n + 3);
      stow_token_data_read (d, g_rand_int (f->rand), 2 * n + 3, out);
      for (guint64 i = 0; i < 2 * n + 3; i++)
        {
          g_assert_cmpint (out[i], >=, 0);
          g_assert_cmpuint ((guint64)out[i], <, vocab);
        }
    }
  g_bytes_unref (seeds[0]);
  g_bytes_unref (seeds[1]);
  g_test_message ("%u of %u inputs accepted", accepted, f->iters);
}

/* ---- optimizer state ----------------------------------------------------- */

static const StowOptimStateSpec opt_specs[] = {
  { .name = "w", .n = 5, .n_sections = 2, .sections = { "m", "v" } },
  { .name = "model.norm.weight",
    .n = 3,
    .n_sections = 3,
    .sections = { "master", "m", "v" } },
  { .name = "e", .n = 0, .n_sections = 1, .sections = { "m" } },
};

static GBytes *
optim_seed (Fuzz *f)
{
  g_autofree char *path = g_build_filename (f->dir, "seed.stow", NULL);
  g_autoptr (JsonParser) p = json_parser_new ();
  g_assert_true (json_parser_load_from_data (
      p, "{\"step\": 7, \"lr\": 0.001, \"rng\": [1, 2], \"d\": {\"pos\": 9}}",
      -1, NULL));
  JsonObject *state = json_node_get_object (json_parser_get_root (p));
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimStateWriter) w = stow_optim_state_writer_new (
      path, opt_specs, G_N_ELEMENTS (opt_specs), state, &error);
  g_assert_no_error (error);
  float v[5 * 2 + 3 * 3];
  for (guint i = 0; i < G_N_ELEMENTS (v); i++)
    v[i] = (float)i * 0.5f;
  g_assert_true (
      stow_optim_state_writer_write (w, v, G_N_ELEMENTS (v), &error));
  g_assert_true (stow_optim_state_writer_finish (w, &error));
  g_assert_no_error (error);
  return read_bytes (path);
}

/* Makes the prefix's header checksum agree with a mutated header, so that
 * the JSON parser behind it is reached. */
static void
fix_header_sum (GByteArray *b)
{
  if (b->len < 28)
    return;
  guint64 hlen;
  memcpy (&hlen, b->data + 12, 8);
  hlen = GUINT64_FROM_LE (hlen);
  if (hlen > b->len - 28)
    return;
  guint64 sum = GUINT64_TO_LE ((guint64)XXH3_64bits (b->data + 28, hlen));
  memcpy (b->data + 20, &sum, 8);
}

static void
test_fuzz_optim_state (Fuzz *f, gconstpointer data)
{
  g_autoptr (GBytes) seed = optim_seed (f);
  gsize seed_len;
  const guint8 *seed_data = g_bytes_get_data (seed, &seed_len);
  guint64 hlen;
  memcpy (&hlen, seed_data + 12, 8);
  hlen = GUINT64_FROM_LE (hlen);
  static const Field fields[] = { { 8, 4 }, { 12, 8 } };
  g_autofree char *path = g_build_filename (f->dir, "in.stow", NULL);
  guint accepted = 0, refused_later = 0;
  for (guint it = 0; it < f->iters; it++)
    {
      g_autoptr (GByteArray) b = g_byte_array_new ();
      g_byte_array_append (b, seed_data, (guint)seed_len);
      mutate (f->rand, b, 28 + hlen, fields, G_N_ELEMENTS (fields));
      /* Mostly past the header checksum: the JSON parser is the target. */
      if (g_rand_int_range (f->rand, 0, 4) != 0)
        fix_header_sum (b);
      write_input (path, b->data, b->len);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
      if (s == NULL)
        {
          assert_refusal (error, path);
          continue;
        }
      g_assert_no_error (error);
      accepted++;
      g_assert_nonnull (stow_optim_state_get_state (s));
      /* Sections the header still names read whole, or fail their
       * checksum (a mutation in the data), naming the file. */
      for (guint t = 0; t < G_N_ELEMENTS (opt_specs); t++)
        for (guint k = 0; k < opt_specs[t].n_sections; k++)
          {
            const char *name = opt_specs[t].name;
            const char *sec = opt_specs[t].sections[k];
            if (!stow_optim_state_has_section (s, name, sec))
              continue;
            guint64 n = stow_optim_state_tensor_n (s, name);
            g_assert_cmpuint (n, <=, b->len / 4);
            g_autofree float *buf = g_new (float, n + 1);
            if (!stow_optim_state_read (s, name, sec, 0, n, buf, &error))
              {
                g_assert_error (error, STOW_CHECKPOINT_ERROR,
                                STOW_CHECKPOINT_ERROR_CHECKSUM);
                assert_refusal (error, path);
                g_clear_error (&error);
                refused_later++;
              }
          }
    }
  g_test_message ("%u of %u inputs accepted, %u section reads refused",
                  accepted, f->iters, refused_later);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add ("/fuzz/safetensors", Fuzz, GUINT_TO_POINTER (1), fuzz_set_up,
              test_fuzz_safetensors, fuzz_tear_down);
  g_test_add ("/fuzz/shard", Fuzz, GUINT_TO_POINTER (2), fuzz_set_up,
              test_fuzz_shard, fuzz_tear_down);
  g_test_add ("/fuzz/optim-state", Fuzz, GUINT_TO_POINTER (3), fuzz_set_up,
              test_fuzz_optim_state, fuzz_tear_down);
  return g_test_run ();
}
