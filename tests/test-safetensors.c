/* SPDX-License-Identifier: MIT
 *
 * tests/test-safetensors.c: the safetensors reader against a file the
 * reference implementation wrote, the writer against what the reference
 * reader read from its output (both committed: Debian has no package of
 * safetensors), a round trip streamed in odd pieces, and every malformed
 * header refused with the file, the tensor and the field named.
 */
#include "config.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "executor/safetensors.h"
#include "testutil-io.h"

typedef struct
{
  char *dir;
} Fixture;

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("safetensors-test");
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  stow_test_rm_rf (f->dir);
  g_free (f->dir);
}

/* Byte i of the round-trip data: position-dependent, so a piece written
 * twice, skipped or shifted shows. */
static guint8
pattern (guint64 i)
{
  return (guint8)(i * 131u + (i >> 8) * 7u + 1u);
}

static const StowSafetensorSpec round_trip_specs[] = {
  { .name = "model.embed_tokens.weight",
    .dtype = "F32",
    .shape = { 3, 5 },
    .n_dims = 2 },
  { .name = "model.norm.weight", .dtype = "BF16", .shape = { 7 }, .n_dims = 1 },
  { .name = "bytes", .dtype = "U8", .shape = { 13 }, .n_dims = 1 },
  { .name = "ids", .dtype = "I64", .shape = { 2, 2 }, .n_dims = 2 },
  { .name = "scalar", .dtype = "F32", .n_dims = 0 },
  { .name = "empty", .dtype = "F16", .shape = { 0, 3 }, .n_dims = 2 },
  { .name = "lm_head.weight",
    .dtype = "F16",
    .shape = { 1, 2, 3, 1 },
    .n_dims = 4 },
};

/* Writes the round-trip specs to @path in pieces of 1, 2, 3, ... 11 bytes
 * (so pieces straddle tensors); returns the total. */
static guint64
write_round_trip (const char *path, GHashTable *metadata)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensorsWriter) w = stow_safetensors_writer_new (
      path, round_trip_specs, G_N_ELEMENTS (round_trip_specs), metadata,
      &error);
  g_assert_no_error (error);
  g_assert_nonnull (w);
  guint64 total = 0;
  for (guint i = 0; i < G_N_ELEMENTS (round_trip_specs); i++)
    {
      const StowSafetensorSpec *s = &round_trip_specs[i];
      guint64 n = stow_safetensors_dtype_size (s->dtype);
      for (guint d = 0; d < s->n_dims; d++)
        n *= s->shape[d];
      total += n;
    }
  guint8 buf[16];
  guint64 done = 0;
  for (guint piece = 1; done < total; piece = piece % 11 + 1)
    {
      guint64 n = MIN (piece, total - done);
      for (guint64 j = 0; j < n; j++)
        buf[j] = pattern (done + j);
      g_assert_true (stow_safetensors_writer_write (w, buf, n, &error));
      g_assert_no_error (error);
      done += n;
    }
  g_assert_true (stow_safetensors_writer_finish (w, &error));
  g_assert_no_error (error);
  return total;
}

static void
test_round_trip (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "model.safetensors", NULL);
  g_autoptr (GHashTable) metadata = g_hash_table_new (g_str_hash, g_str_equal);
  g_hash_table_insert (metadata, "step", "12");
  guint64 total = write_round_trip (path, metadata);

  /* Only the target is left: the temporary file was renamed. */
  g_autofree char *listing = stow_test_list_dir (f->dir);
  g_assert_cmpstr (listing, ==, "model.safetensors");
  struct stat sb;
  g_assert_cmpint (g_stat (path, &sb), ==, 0);
  g_assert_cmpuint (sb.st_mode & 0777, ==, 0644); /* umask 022, in main */

  /* The header is padded with spaces to a multiple of 8, as the
   * reference writer does. */
  g_autoptr (GBytes) bytes = stow_test_read_file (path);
  gsize len;
  const guint8 *raw = g_bytes_get_data (bytes, &len);
  guint64 header_len;
  memcpy (&header_len, raw, 8);
  header_len = GUINT64_FROM_LE (header_len);
  g_assert_cmpuint (header_len % 8, ==, 0);
  g_assert_cmpuint (len, ==, 8 + header_len + total);
  gsize end = 8 + header_len;
  while (raw[end - 1] == ' ')
    end--;
  g_assert_cmpint (raw[end - 1], ==, '}');
  g_assert_cmpuint (8 + header_len - end, <, 8);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (stow_safetensors_path (st), ==, path);
  g_assert_cmpuint (stow_safetensors_n_tensors (st), ==,
                    G_N_ELEMENTS (round_trip_specs));
  g_assert_cmpstr (stow_safetensors_metadata (st, "format"), ==, "pt");
  g_assert_cmpstr (stow_safetensors_metadata (st, "step"), ==, "12");
  g_assert_null (stow_safetensors_metadata (st, "absent"));
  g_assert_null (stow_safetensors_find (st, "absent"));

  /* Specs are laid out in order and contiguous, so nth follows them
   * (except that an empty tensor sorts before one at the same offset). */
  guint64 offset = 0;
  for (guint i = 0; i < G_N_ELEMENTS (round_trip_specs); i++)
    {
      const StowSafetensorSpec *s = &round_trip_specs[i];
      const StowSafetensor *t = stow_safetensors_find (st, s->name);
      g_assert_nonnull (t);
      g_assert_cmpstr (t->name, ==, s->name);
      g_assert_cmpstr (t->dtype, ==, s->dtype);
      g_assert_cmpuint (t->n_dims, ==, s->n_dims);
      guint64 numel = 1;
      for (guint d = 0; d < s->n_dims; d++)
        {
          g_assert_cmpuint (t->shape[d], ==, s->shape[d]);
          numel *= s->shape[d];
        }
      g_assert_cmpuint (t->numel, ==, numel);
      g_assert_cmpuint (t->nbytes, ==,
                        numel * stow_safetensors_dtype_size (s->dtype));
      g_assert_cmpuint (t->offset, ==, offset);

      g_autofree guint8 *got = g_malloc (t->nbytes + 1);
      g_assert_true (stow_safetensors_read (st, t, 0, got, t->nbytes, &error));
      g_assert_no_error (error);
      for (guint64 j = 0; j < t->nbytes; j++)
        g_assert_cmpuint (got[j], ==, pattern (offset + j));
      if (t->nbytes > 4)
        {
          /* A piece from the middle. */
          guint8 mid[3];
          g_assert_true (stow_safetensors_read (st, t, 2, mid, 3, &error));
          for (guint j = 0; j < 3; j++)
            g_assert_cmpuint (mid[j], ==, pattern (offset + 2 + j));
        }
      offset += t->nbytes;
    }
  for (guint i = 1; i < stow_safetensors_n_tensors (st); i++)
    g_assert_cmpuint (stow_safetensors_nth (st, i)->offset, >=,
                      stow_safetensors_nth (st, i - 1)->offset);
}

static gboolean
bits_equal_f32 (const guint8 *p, float want)
{
  float v;
  memcpy (&v, p, 4);
  return v == want;
}

/* A file written by safetensors 0.8.0 through torch 1.13 (see
 * data/safetensors/make-reference.py): its values, dtypes and layout. */
static void
test_reference_fixture (void)
{
  g_autofree char *path
      = stow_test_fixture ("safetensors", "reference.safetensors", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_safetensors_n_tensors (st), ==, 8);
  g_assert_cmpstr (stow_safetensors_metadata (st, "format"), ==, "pt");
  g_assert_cmpstr (stow_safetensors_metadata (st, "writer"), ==,
                   "safetensors 0.8.0");

  const StowSafetensor *t = stow_safetensors_find (st, "embed.weight");
  g_assert_nonnull (t);
  g_assert_cmpstr (t->dtype, ==, "F32");
  g_assert_cmpuint (t->n_dims, ==, 2);
  g_assert_cmpuint (t->shape[0], ==, 3);
  g_assert_cmpuint (t->shape[1], ==, 4);
  g_assert_cmpuint (t->nbytes, ==, 48);
  guint8 buf[48];
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 48, &error));
  for (guint i = 0; i < 12; i++)
    g_assert_true (bits_equal_f32 (buf + 4 * i, 0.5f * (float)i));

  /* F16 1.0, -2.0, 0.5, 65504 (the largest half), 0. */
  static const guint16 f16[] = { 0x3c00, 0xc000, 0x3800, 0x7bff, 0x0000 };
  t = stow_safetensors_find (st, "norm.weight");
  g_assert_cmpstr (t->dtype, ==, "F16");
  g_assert_cmpuint (t->nbytes, ==, 10);
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 10, &error));
  for (guint i = 0; i < 5; i++)
    g_assert_cmpuint (GUINT16_FROM_LE (((guint16 *)buf)[i]), ==, f16[i]);

  /* BF16 is the top half of F32: 1.0, -2.0, 0.5, 3.0. */
  static const guint16 bf16[] = { 0x3f80, 0xc000, 0x3f00, 0x4040 };
  t = stow_safetensors_find (st, "layer.bf16");
  g_assert_cmpstr (t->dtype, ==, "BF16");
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 8, &error));
  for (guint i = 0; i < 4; i++)
    g_assert_cmpuint (GUINT16_FROM_LE (((guint16 *)buf)[i]), ==, bf16[i]);

  t = stow_safetensors_find (st, "ids");
  g_assert_cmpstr (t->dtype, ==, "I64");
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 24, &error));
  gint64 ids[3];
  memcpy (ids, buf, 24);
  g_assert_cmpint (GINT64_FROM_LE (ids[0]), ==, 1);
  g_assert_cmpint (GINT64_FROM_LE (ids[1]), ==, -2);
  g_assert_cmpint (GINT64_FROM_LE (ids[2]), ==, 3000000000);

  t = stow_safetensors_find (st, "mask");
  g_assert_cmpstr (t->dtype, ==, "BOOL");
  g_assert_cmpuint (t->nbytes, ==, 6);
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 6, &error));
  static const guint8 mask[] = { 1, 0, 1, 0, 0, 1 };
  g_assert_cmpmem (buf, 6, mask, 6);

  t = stow_safetensors_find (st, "scalar");
  g_assert_cmpuint (t->n_dims, ==, 0);
  g_assert_cmpuint (t->numel, ==, 1);
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 4, &error));
  g_assert_true (bits_equal_f32 (buf, 7.25f));

  t = stow_safetensors_find (st, "empty");
  g_assert_cmpuint (t->numel, ==, 0);
  g_assert_cmpuint (t->nbytes, ==, 0);

  t = stow_safetensors_find (st, "bytes");
  g_assert_true (stow_safetensors_read (st, t, 0, buf, 4, &error));
  static const guint8 u8[] = { 0, 1, 254, 255 };
  g_assert_cmpmem (buf, 4, u8, 4);
  g_assert_no_error (error);
}

/* Our writer's output as safetensors' own reader (safe_open, the code
 * under transformers' from_pretrained) loaded it.  Debian packages no
 * safetensors, so the reader is not run here: data/safetensors/
 * writer-output.safetensors is what the writer wrote when it was, and
 * writer-output.reference.json what check-reference.py printed for that
 * file with safetensors 0.8.0 and torch 1.13.  The writer must still write
 * those bytes, and the values the reference read are checked below.
 * After a deliberate change of the writer, STOW_SAFETENSORS_PYTHON set to
 * a Python with torch and safetensors rewrites both files from the
 * reference reader (docs/testing.md); without it nothing is skipped. */
static void
test_reference_reader (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "ours.safetensors", NULL);
  static const StowSafetensorSpec specs[] = {
    { .name = "w", .dtype = "F32", .shape = { 2, 3 }, .n_dims = 2 },
    { .name = "h", .dtype = "F16", .shape = { 3 }, .n_dims = 1 },
    { .name = "b", .dtype = "BF16", .shape = { 1 }, .n_dims = 1 },
    { .name = "i", .dtype = "I32", .shape = { 2 }, .n_dims = 1 },
    { .name = "s", .dtype = "F64", .n_dims = 0 },
    { .name = "e", .dtype = "F32", .shape = { 0 }, .n_dims = 1 },
  };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensorsWriter) w = stow_safetensors_writer_new (
      path, specs, G_N_ELEMENTS (specs), NULL, &error);
  g_assert_no_error (error);
  const float wv[] = { 1.5f, -2.0f, 0.25f, 4.0f, 5.0f, -6.5f };
  const guint16 hv[] = { GUINT16_TO_LE (0x3c00), GUINT16_TO_LE (0xc000),
                         GUINT16_TO_LE (0x3800) };
  const guint16 bv[] = { GUINT16_TO_LE (0x4040) };
  const gint32 iv[] = { GINT32_TO_LE (-7), GINT32_TO_LE (123456) };
  const double sv = 2.75;
  g_assert_true (stow_safetensors_writer_write (w, wv, sizeof wv, &error));
  g_assert_true (stow_safetensors_writer_write (w, hv, sizeof hv, &error));
  g_assert_true (stow_safetensors_writer_write (w, bv, sizeof bv, &error));
  g_assert_true (stow_safetensors_writer_write (w, iv, sizeof iv, &error));
  g_assert_true (stow_safetensors_writer_write (w, &sv, sizeof sv, &error));
  g_assert_true (stow_safetensors_writer_finish (w, &error));
  g_assert_no_error (error);

  g_autofree char *ours = NULL, *committed = NULL, *out = NULL;
  gsize n_ours = 0, n_committed = 0;
  g_assert_true (g_file_get_contents (path, &ours, &n_ours, &error));
  g_autofree char *bytes_path
      = stow_test_fixture ("safetensors", "writer-output.safetensors", NULL);
  g_autofree char *json_path
      = stow_test_fixture ("safetensors", "writer-output.reference.json", NULL);
  const char *python = g_getenv ("STOW_SAFETENSORS_PYTHON");
  if (python != NULL)
    {
      g_autofree char *script
          = stow_test_fixture ("safetensors", "check-reference.py", NULL);
      const char *argv[] = { python, script, path, NULL };
      int status = 0;
      g_assert_true (g_spawn_sync (NULL, (char **)argv, NULL, G_SPAWN_DEFAULT,
                                   NULL, NULL, &out, NULL, &status, &error));
      g_assert_true (g_spawn_check_wait_status (status, &error));
      g_assert_no_error (error);
      g_assert_true (g_file_set_contents (bytes_path, ours, n_ours, &error));
      g_assert_true (g_file_set_contents (json_path, out, -1, &error));
      g_assert_no_error (error);
    }
  g_assert_true (
      g_file_get_contents (bytes_path, &committed, &n_committed, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (ours, n_ours, committed, n_committed);
  g_clear_pointer (&out, g_free);
  g_assert_true (g_file_get_contents (json_path, &out, NULL, &error));
  g_assert_no_error (error);

  g_autoptr (JsonParser) parser = json_parser_new ();
  g_assert_true (json_parser_load_from_data (parser, out, -1, &error));
  JsonObject *root = json_node_get_object (json_parser_get_root (parser));
  JsonObject *meta = json_object_get_object_member (root, "metadata");
  g_assert_cmpstr (json_object_get_string_member (meta, "format"), ==, "pt");
  JsonObject *tensors = json_object_get_object_member (root, "tensors");
  g_assert_cmpuint (json_object_get_size (tensors), ==, G_N_ELEMENTS (specs));
  static const struct
  {
    const char *name, *dtype;
    guint n;
    double values[6];
  } want[] = {
    { "w", "float32", 6, { 1.5, -2.0, 0.25, 4.0, 5.0, -6.5 } },
    { "h", "float16", 3, { 1.0, -2.0, 0.5 } },
    { "b", "bfloat16", 1, { 3.0 } },
    { "i", "int32", 2, { -7, 123456 } },
    { "s", "float64", 1, { 2.75 } },
    { "e", "float32", 0, { 0 } },
  };
  for (guint i = 0; i < G_N_ELEMENTS (want); i++)
    {
      JsonObject *t = json_object_get_object_member (tensors, want[i].name);
      g_assert_nonnull (t);
      g_assert_cmpstr (json_object_get_string_member (t, "dtype"), ==,
                       want[i].dtype);
      JsonArray *v = json_object_get_array_member (t, "values");
      g_assert_cmpuint (json_array_get_length (v), ==, want[i].n);
      for (guint j = 0; j < want[i].n; j++)
        g_assert_cmpfloat (json_array_get_double_element (v, j), ==,
                           want[i].values[j]);
    }
  JsonArray *shape = json_object_get_array_member (
      json_object_get_object_member (tensors, "w"), "shape");
  g_assert_cmpuint (json_array_get_length (shape), ==, 2);
  g_assert_cmpint (json_array_get_int_element (shape, 0), ==, 2);
  g_assert_cmpint (json_array_get_int_element (shape, 1), ==, 3);
}

/* A file of an 8-byte length, @header, then @data_bytes bytes of data. */
static char *
write_raw (Fixture *f, const char *name, guint64 header_len, const char *header,
           gsize data_bytes)
{
  char *path = g_build_filename (f->dir, name, NULL);
  gsize hl = strlen (header);
  g_autofree guint8 *buf = g_malloc0 (8 + hl + data_bytes);
  guint64 le = GUINT64_TO_LE (header_len);
  memcpy (buf, &le, 8);
  memcpy (buf + 8, header, hl);
  stow_test_write_file (path, buf, 8 + hl + data_bytes);
  return path;
}

static void
assert_refused (const char *path, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
  g_assert_null (st);
  g_assert_error (error, STOW_SAFETENSORS_ERROR,
                  STOW_SAFETENSORS_ERROR_INVALID);
  if (!g_str_has_prefix (error->message, path)
      || strstr (error->message, fragment) == NULL)
    g_error ("%s: expected \"%s\" in: %s", path, fragment, error->message);
}

static void
test_malformed (Fixture *f, gconstpointer data)
{
  static const struct
  {
    const char *header;
    gsize data_bytes;
    const char *fragment;
  } cases[] = {
    { "{\"w\": ", 0, "header:1:" },
    { "[1, 2]", 0, "header: expected a JSON object, got an array" },
    { "", 0, "header: expected a JSON object, got nothing" },
    { "{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
      4, "tensor \"w\": dtype string \"F33\" is not a safetensors dtype" },
    { "{\"w\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
      "tensor \"w\": dtype: expected a string, got number 4" },
    { "{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
      "tensor \"w\": dtype is missing" },
    { "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4,
      "tensor \"w\": shape is missing" },
    { "{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4,
      "tensor \"w\": data_offsets is missing" },
    { "{\"w\": [1]}", 4, "tensor \"w\": expected an object, got an array" },
    { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
      " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, "
      "24]}}",
      24, "tensor \"b\": data_offsets [8, 24) overlap tensor \"a\" [0, 16)" },
    { "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
      " \"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}",
      8, "tensor \"a\": data_offsets [4, 6) overlap tensor \"b\" [0, 8)" },
    { "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, "
      "24]}}",
      16,
      "tensor \"w\": data_offsets [8, 24) end past the data section (16 "
      "bytes)" },
    { "{\"lm_head.weight\": {\"dtype\": \"F32\", \"shape\": [4, 8], "
      "\"data_offsets\": [0, 96]}}",
      96,
      "tensor \"lm_head.weight\": data_offsets [0, 96) hold 96 bytes, "
      "shape [4, 8] of F32 needs 128" },
    { "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], "
      "\"data_offsets\": [0, 0]}}",
      0,
      "tensor \"w\": shape [4294967296, 4294967296, 4] of F32 holds more "
      "than 2^63 bytes" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 0]}}",
      0,
      "tensor \"w\": shape[0]: expected a non-negative integer, got "
      "number -1" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [2.0], \"data_offsets\": [0, "
      "2]}}",
      2,
      "tensor \"w\": shape[0]: expected a non-negative integer, got "
      "number 2" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": 2, \"data_offsets\": [0, 2]}}", 2,
      "tensor \"w\": shape: expected an array of integers" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
      "\"data_offsets\": [0, 1]}}",
      1, "tensor \"w\": shape has 9 dimensions, at most 8" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}}", 1,
      "tensor \"w\": data_offsets: expected [begin, end]" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [-1, 0]}}",
      1, "tensor \"w\": data_offsets: expected [begin, end]" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [2, 1]}}",
      2, "tensor \"w\": data_offsets [2, 1): begin is past end" },
    { "{\"__metadata__\": {\"format\": 1}}", 0,
      "__metadata__: \"format\": expected a string, got number 1" },
    { "{\"__metadata__\": [\"pt\"]}", 0,
      "__metadata__: expected an object of strings" },
    { "{\"w\": {\"dtype\": \"U8\", \"shape\": [[[[[[[[[1]]]]]]]]], "
      "\"data_offsets\": [0, 1]}}",
      1, "header: byte 37: JSON nested deeper than 8 levels" },
    { "{\"w\": 1} // comment", 0, "unexpected character 0x2f" },
    { "{'w': 1}", 0, "unexpected character 0x27" },
    { "{\"w\xff\": 1}", 0, "header byte 3 is not UTF-8 text" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *name = g_strdup_printf ("case-%u.safetensors", i);
      g_autofree char *path = write_raw (f, name, strlen (cases[i].header),
                                         cases[i].header, cases[i].data_bytes);
      assert_refused (path, cases[i].fragment);
    }

  /* A NUL inside the header: json-glib would stop there silently. */
  static const char nul_header[] = "{\"w\": 1}\0   ";
  g_autofree char *path = g_build_filename (f->dir, "nul.safetensors", NULL);
  guint8 buf[8 + sizeof nul_header - 1];
  guint64 le = GUINT64_TO_LE (sizeof nul_header - 1);
  memcpy (buf, &le, 8);
  memcpy (buf + 8, nul_header, sizeof nul_header - 1);
  stow_test_write_file (path, buf, sizeof buf);
  assert_refused (path, "header byte 8 is not UTF-8 text");
}

static void
test_truncated (Fixture *f, gconstpointer data)
{
  g_autofree char *short_path
      = g_build_filename (f->dir, "5.safetensors", NULL);
  stow_test_write_file (short_path, "\x10\0\0\0\0", 5);
  assert_refused (short_path, "5 bytes is shorter than the 8-byte header "
                              "length");
  g_autofree char *empty = g_build_filename (f->dir, "0.safetensors", NULL);
  stow_test_write_file (empty, "", 0);
  assert_refused (empty, "0 bytes is shorter");

  const char *header = "{\"w\": {\"dtype\": \"U8\", \"shape\": [4], "
                       "\"data_offsets\": [0, 4]}}";
  g_autofree char *beyond
      = write_raw (f, "beyond.safetensors", 1000, header, 4);
  assert_refused (beyond, "header length 1000 runs past the end of the file");
  g_autofree char *huge = write_raw (
      f, "huge.safetensors", STOW_SAFETENSORS_MAX_HEADER + 1, header, 4);
  assert_refused (huge, "header length 104857601 is over the 104857600-byte "
                        "limit");
  g_autofree char *max
      = write_raw (f, "max.safetensors", G_MAXUINT64, header, 4);
  assert_refused (max, "is over the");
  /* The data section cut short: the file is shorter than its header says. */
  g_autofree char *cut
      = write_raw (f, "cut.safetensors", strlen (header), header, 3);
  assert_refused (cut, "tensor \"w\": data_offsets [0, 4) end past the data "
                       "section (3 bytes)");

  /* A file that shrinks after open: the read names the file offset. */
  g_autofree char *shrink
      = write_raw (f, "shrink.safetensors", strlen (header), header, 4);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) st = stow_safetensors_open (shrink, &error);
  g_assert_no_error (error);
  g_assert_cmpint (truncate (shrink, 8 + strlen (header) + 2), ==, 0);
  guint8 buf[4];
  g_assert_false (stow_safetensors_read (st, stow_safetensors_find (st, "w"), 0,
                                         buf, 4, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO);
  g_autofree char *want = g_strdup_printf (
      "tensor \"w\": short read at file offset %zu", 8 + strlen (header) + 2);
  g_assert_nonnull (strstr (error->message, want));
}

/* The stress case for json-glib's recursive parser: the largest header the
 * format allows, all '['.  Refused by the byte scan in microseconds. */
static void
test_deep_nesting (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "deep.safetensors", NULL);
  gsize len = 8 + STOW_SAFETENSORS_MAX_HEADER;
  g_autofree guint8 *buf = g_malloc (len);
  guint64 le = GUINT64_TO_LE (STOW_SAFETENSORS_MAX_HEADER);
  memcpy (buf, &le, 8);
  memset (buf + 8, '[', STOW_SAFETENSORS_MAX_HEADER);
  stow_test_write_file (path, buf, len);
  g_clear_pointer (&buf, g_free);
  assert_refused (path, "header: byte 8: JSON nested deeper than 8 levels");
  g_unlink (path);
}

/* Tensors need not be contiguous, and may come in any order. */
static void
test_gaps_allowed (Fixture *f, gconstpointer data)
{
  const char *header = "{\"b\": {\"dtype\": \"U8\", \"shape\": [2], "
                       "\"data_offsets\": [8, 10]},"
                       " \"a\": {\"dtype\": \"I16\", \"shape\": [1], "
                       "\"data_offsets\": [2, 4]},"
                       " \"e\": {\"dtype\": \"F32\", \"shape\": [0], "
                       "\"data_offsets\": [3, 3]},"
                       " \"__metadata__\": null}";
  g_autofree char *path
      = write_raw (f, "gaps.safetensors", strlen (header), header, 12);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_safetensors_n_tensors (st), ==, 3);
  g_assert_cmpstr (stow_safetensors_nth (st, 0)->name, ==, "a");
  g_assert_cmpstr (stow_safetensors_nth (st, 1)->name, ==, "e");
  g_assert_cmpstr (stow_safetensors_nth (st, 2)->name, ==, "b");
  g_assert_null (stow_safetensors_metadata (st, "format"));
}

static void
assert_target (const char *path, const char *contents)
{
  g_autoptr (GBytes) b = stow_test_read_file (path);
  g_assert_cmpmem (g_bytes_get_data (b, NULL), g_bytes_get_size (b), contents,
                   strlen (contents));
}

static void
test_writer_failures (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "model.safetensors", NULL);
  stow_test_write_file (path, "old", 3);
  static const StowSafetensorSpec specs[] = {
    { .name = "a", .dtype = "F32", .shape = { 3 }, .n_dims = 1 },
    { .name = "b", .dtype = "U8", .shape = { 2 }, .n_dims = 1 },
  };
  g_autoptr (GError) error = NULL;
  guint8 bytes[32] = { 0 };

  /* Freed before finish: the temporary file goes, the target stays. */
  StowSafetensorsWriter *w
      = stow_safetensors_writer_new (path, specs, 2, NULL, &error);
  g_assert_no_error (error);
  g_assert_true (stow_safetensors_writer_write (w, bytes, 5, &error));
  g_autofree char *during = stow_test_list_dir (f->dir);
  g_assert_true (g_str_has_prefix (during, ".model.safetensors.tmp-"));
  stow_safetensors_writer_free (w);
  g_autofree char *after_free = stow_test_list_dir (f->dir);
  g_assert_cmpstr (after_free, ==, "model.safetensors");
  assert_target (path, "old");

  /* Too few bytes: finish names the tensor, removes the temporary. */
  w = stow_safetensors_writer_new (path, specs, 2, NULL, &error);
  g_assert_true (stow_safetensors_writer_write (w, bytes, 13, &error));
  g_assert_false (stow_safetensors_writer_finish (w, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR,
                  STOW_SAFETENSORS_ERROR_INVALID);
  g_assert_nonnull (
      strstr (error->message, "tensor \"b\" got 1 of its 2 bytes"));
  g_clear_error (&error);
  g_autofree char *after_short = stow_test_list_dir (f->dir);
  g_assert_cmpstr (after_short, ==, "model.safetensors");
  stow_safetensors_writer_free (w);
  assert_target (path, "old");

  /* Too many: refused, and the writer stays failed. */
  w = stow_safetensors_writer_new (path, specs, 2, NULL, &error);
  g_assert_true (stow_safetensors_writer_write (w, bytes, 10, &error));
  g_assert_false (stow_safetensors_writer_write (w, bytes, 7, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR,
                  STOW_SAFETENSORS_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "3 bytes past the declared data "
                                            "(14 bytes in 2 tensors"));
  g_clear_error (&error);
  g_assert_false (stow_safetensors_writer_write (w, bytes, 4, &error));
  g_clear_error (&error);
  g_assert_false (stow_safetensors_writer_finish (w, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);
  stow_safetensors_writer_free (w);
  g_autofree char *after_long = stow_test_list_dir (f->dir);
  g_assert_cmpstr (after_long, ==, "model.safetensors");
  assert_target (path, "old");

  /* Bad specs: refused before any file is made. */
  static const StowSafetensorSpec twice[] = {
    { .name = "a", .dtype = "F32", .shape = { 1 }, .n_dims = 1 },
    { .name = "a", .dtype = "F32", .shape = { 1 }, .n_dims = 1 },
  };
  g_assert_null (stow_safetensors_writer_new (path, twice, 2, NULL, &error));
  g_assert_nonnull (strstr (error->message, "tensor \"a\" is named twice"));
  g_clear_error (&error);
  static const StowSafetensorSpec unknown[] = {
    { .name = "q", .dtype = "Q4", .shape = { 1 }, .n_dims = 1 },
  };
  g_assert_null (stow_safetensors_writer_new (path, unknown, 1, NULL, &error));
  g_assert_nonnull (strstr (error->message, "tensor \"q\": unknown dtype Q4"));
  g_clear_error (&error);
  static const StowSafetensorSpec huge[] = {
    { .name = "h",
      .dtype = "F64",
      .shape = { 1ull << 32, 1ull << 31 },
      .n_dims = 2 },
  };
  g_assert_null (stow_safetensors_writer_new (path, huge, 1, NULL, &error));
  g_assert_nonnull (strstr (error->message, "passes 2^63 bytes"));
  g_clear_error (&error);
  g_autofree char *after_specs = stow_test_list_dir (f->dir);
  g_assert_cmpstr (after_specs, ==, "model.safetensors");

  /* A directory that does not exist. */
  g_autofree char *nowhere
      = g_build_filename (f->dir, "missing", "x.safetensors", NULL);
  g_assert_null (stow_safetensors_writer_new (nowhere, specs, 2, NULL, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO);
  g_assert_true (g_str_has_prefix (error->message, nowhere));
  g_clear_error (&error);

  /* A file that cannot be opened. */
  g_assert_null (stow_safetensors_open (nowhere, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO);
  g_assert_true (g_str_has_prefix (error->message, nowhere));
}

static void
test_dtype_sizes (void)
{
  g_assert_cmpuint (stow_safetensors_dtype_size ("F32"), ==, 4);
  g_assert_cmpuint (stow_safetensors_dtype_size ("BF16"), ==, 2);
  g_assert_cmpuint (stow_safetensors_dtype_size ("F16"), ==, 2);
  g_assert_cmpuint (stow_safetensors_dtype_size ("F64"), ==, 8);
  g_assert_cmpuint (stow_safetensors_dtype_size ("I64"), ==, 8);
  g_assert_cmpuint (stow_safetensors_dtype_size ("BOOL"), ==, 1);
  g_assert_cmpuint (stow_safetensors_dtype_size ("F8_E4M3"), ==, 1);
  g_assert_cmpuint (stow_safetensors_dtype_size ("f32"), ==, 0);
  g_assert_cmpuint (stow_safetensors_dtype_size (""), ==, 0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  umask (022);
  g_test_add_func ("/safetensors/dtype-sizes", test_dtype_sizes);
  g_test_add_func ("/safetensors/reference-fixture", test_reference_fixture);
#define ADD(path, fn)                                                          \
  g_test_add (path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD ("/safetensors/round-trip", test_round_trip);
  ADD ("/safetensors/reference-reader", test_reference_reader);
  ADD ("/safetensors/malformed", test_malformed);
  ADD ("/safetensors/truncated", test_truncated);
  ADD ("/safetensors/deep-nesting", test_deep_nesting);
  ADD ("/safetensors/gaps-allowed", test_gaps_allowed);
  ADD ("/safetensors/writer-failures", test_writer_failures);
#undef ADD
  return g_test_run ();
}
