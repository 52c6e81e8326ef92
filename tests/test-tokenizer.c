/* SPDX-License-Identifier: MIT
 *
 * tests/test-tokenizer.c: data/tokenizer.c against HF tokenizers, id for
 * id: tests/data/tokenizers/expected.json holds what tokenizers gave for
 * ~300 strings (llama.cpp's tokenizer tests, scripts, whitespace, long
 * words, added tokens in text, random mixtures) on the three shipped
 * files and on variants of them (written by tests/oracle/
 * tokenizer_expected.py); and transformers' BOS/EOS for the model
 * directories.  Then the properties: decode(encode(x)) == x for random
 * text, random bytes never crash, invalid UTF-8 and corrupt files refused
 * by name, threads give the same ids.
 */
#include "config.h"

#include <string.h>

#include <gio/gio.h>
#include <glib.h>
#include <json-glib/json-glib.h>

#include "data/tokenizer.h"
#include "testutil-io.h"

/* The bytes of a fixture, gunzipped when its name ends in .gz (the
 * largest tokenizer.json is kept compressed). */
static GBytes *
read_fixture (const char *rel)
{
  g_autofree char *path = stow_test_fixture ("tokenizers", rel, NULL);
  GBytes *raw = stow_test_read_file (path);
  if (!g_str_has_suffix (rel, ".gz"))
    return raw;
  g_autoptr (GBytes) owned = raw;
  g_autoptr (GInputStream) mem = g_memory_input_stream_new_from_bytes (raw);
  g_autoptr (GConverter) z
      = G_CONVERTER (g_zlib_decompressor_new (G_ZLIB_COMPRESSOR_FORMAT_GZIP));
  g_autoptr (GInputStream) in = g_converter_input_stream_new (mem, z);
  g_autoptr (GByteArray) out = g_byte_array_new ();
  guint8 buf[65536];
  gssize n;
  g_autoptr (GError) error = NULL;
  while ((n = g_input_stream_read (in, buf, sizeof buf, NULL, &error)) > 0)
    g_byte_array_append (out, buf, (guint)n);
  g_assert_no_error (error);
  return g_byte_array_free_to_bytes (g_steal_pointer (&out));
}

static JsonNode *
parse_bytes (GBytes *b)
{
  g_autoptr (JsonParser) p = json_parser_new ();
  g_autoptr (GError) error = NULL;
  gsize len;
  const char *data = g_bytes_get_data (b, &len);
  g_assert_true (json_parser_load_from_data (p, data, (gssize)len, &error));
  g_assert_no_error (error);
  return json_node_copy (json_parser_get_root (p));
}

static JsonObject *expected_root;

static JsonObject *
expected (void)
{
  if (expected_root == NULL)
    {
      g_autoptr (GBytes) b = read_fixture ("expected.json");
      JsonNode *n = parse_bytes (b);
      expected_root = json_object_ref (json_node_get_object (n));
      json_node_unref (n);
    }
  return expected_root;
}

/* ---- the variants: a shipped file and the oracle's changes to it -------- */

static void
apply_patch (JsonObject *root, JsonArray *patch)
{
  for (guint i = 0; i < json_array_get_length (patch); i++)
    {
      JsonObject *op = json_array_get_object_element (patch, i);
      const char *kind = json_object_get_string_member (op, "op");
      if (strcmp (kind, "merges_to_strings") == 0)
        {
          JsonObject *model = json_object_get_object_member (root, "model");
          JsonArray *merges = json_object_get_array_member (model, "merges");
          JsonArray *strings = json_array_new ();
          for (guint k = 0; k < json_array_get_length (merges); k++)
            {
              JsonNode *m = json_array_get_element (merges, k);
              if (JSON_NODE_HOLDS_ARRAY (m))
                {
                  JsonArray *pair = json_node_get_array (m);
                  g_autofree char *s = g_strdup_printf (
                      "%s %s", json_array_get_string_element (pair, 0),
                      json_array_get_string_element (pair, 1));
                  json_array_add_string_element (strings, s);
                }
              else
                json_array_add_element (strings, json_node_copy (m));
            }
          json_object_set_array_member (model, "merges", strings);
          continue;
        }
      if (strcmp (kind, "add_vocab") == 0)
        {
          JsonObject *vocab = json_object_get_object_member (
              json_object_get_object_member (root, "model"), "vocab");
          gint64 next = 0;
          g_autoptr (GList) members = json_object_get_members (vocab);
          for (GList *l = members; l; l = l->next)
            next = MAX (next, json_object_get_int_member (vocab, l->data) + 1);
          JsonArray *tokens = json_object_get_array_member (op, "tokens");
          for (guint k = 0; k < json_array_get_length (tokens); k++)
            {
              const char *tok = json_array_get_string_element (tokens, k);
              if (!json_object_has_member (vocab, tok))
                json_object_set_int_member (vocab, tok, next++);
            }
          continue;
        }
      JsonArray *path = json_object_get_array_member (op, "path");
      JsonObject *obj = root;
      guint n = json_array_get_length (path);
      for (guint k = 0; k + 1 < n; k++)
        obj = json_object_get_object_member (
            obj, json_array_get_string_element (path, k));
      const char *last = json_array_get_string_element (path, n - 1);
      JsonNode *value = json_node_copy (json_object_get_member (op, "value"));
      if (strcmp (kind, "set") == 0)
        json_object_set_member (obj, last, value);
      else
        {
          g_assert_cmpstr (kind, ==, "append");
          json_array_add_element (json_object_get_array_member (obj, last),
                                  value);
        }
    }
}

static StowHfTokenizer *read_variant (const char *name);
static GHashTable *variants_loaded;

/* Variant @name, read once per process (a reference). */
static StowHfTokenizer *
load_variant (const char *name)
{
  if (variants_loaded == NULL)
    variants_loaded = g_hash_table_new_full (
        g_str_hash, g_str_equal, NULL, (GDestroyNotify)stow_hf_tokenizer_unref);
  StowHfTokenizer *t = g_hash_table_lookup (variants_loaded, name);
  if (t == NULL)
    {
      t = read_variant (name);
      g_hash_table_insert (variants_loaded, (gpointer)name, t);
    }
  return stow_hf_tokenizer_ref (t);
}

static StowHfTokenizer *
read_variant (const char *name)
{
  JsonObject *v = json_object_get_object_member (
      json_object_get_object_member (expected (), "variants"), name);
  const char *file = json_object_get_string_member (v, "file");
  g_autoptr (GBytes) b = read_fixture (file);
  g_autoptr (JsonNode) root = parse_bytes (b);
  apply_patch (json_node_get_object (root),
               json_object_get_array_member (v, "patch"));
  g_autofree char *text = json_to_string (root, FALSE);
  g_autoptr (GError) error = NULL;
  StowHfTokenizer *t = stow_hf_tokenizer_new_from_data (text, -1, file, &error);
  g_assert_no_error (error);
  g_assert_nonnull (t);
  return t;
}

static GArray *
ids_of (JsonArray *a)
{
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  for (guint i = 0; i < json_array_get_length (a); i++)
    {
      guint32 id = (guint32)json_array_get_int_element (a, i);
      g_array_append_val (ids, id);
    }
  return ids;
}

static char *
ids_string (GArray *ids)
{
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < ids->len && i < 40; i++)
    g_string_append_printf (s, "%s%u", i ? " " : "",
                            g_array_index (ids, guint32, i));
  if (ids->len > 40)
    g_string_append_printf (s, " ... (%u ids)", ids->len);
  return g_string_free (s, FALSE);
}

static gboolean
same_ids (GArray *a, GArray *b)
{
  return a->len == b->len
         && (a->len == 0
             || memcmp (a->data, b->data, a->len * sizeof (guint32)) == 0);
}

static guchar *
b64 (JsonObject *o, const char *member, gsize *len)
{
  return g_base64_decode (json_object_get_string_member (o, member), len);
}

/* Every string of expected.json through variant @data: the ids without and
 * with the post-processor's tokens, and the decoded text with and without
 * the special tokens. */
static void
test_hf_ids (gconstpointer data)
{
  const char *name = data;
  g_autoptr (StowHfTokenizer) t = load_variant (name);
  JsonArray *inputs = json_object_get_array_member (expected (), "inputs");
  JsonArray *rows = json_object_get_array_member (
      json_object_get_object_member (expected (), "expected"), name);
  guint n = json_array_get_length (inputs), bad = 0;
  g_assert_cmpuint (n, ==, json_array_get_length (rows));
  for (guint i = 0; i < n; i++)
    {
      JsonObject *in = json_array_get_object_element (inputs, i);
      JsonObject *row = json_array_get_object_element (rows, i);
      gsize len;
      g_autofree guchar *text = b64 (in, "b64", &len);
      g_autoptr (GArray) want
          = ids_of (json_object_get_array_member (row, "ids"));
      g_autoptr (GArray) want_special = ids_of (json_object_get_array_member (
          row,
          json_object_has_member (row, "ids_special") ? "ids_special" : "ids"));
      g_autoptr (GArray) got = g_array_new (FALSE, FALSE, sizeof (guint32));
      g_autoptr (GArray) got_special
          = g_array_new (FALSE, FALSE, sizeof (guint32));
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_hf_tokenizer_encode (
          t, (const char *)text, (gssize)len, FALSE, got, &error));
      g_assert_true (stow_hf_tokenizer_encode (
          t, (const char *)text, (gssize)len, TRUE, got_special, &error));
      g_assert_no_error (error);
      gsize want_len, want_kept_len, got_len, got_kept_len;
      g_autofree guchar *want_text
          = json_object_has_member (row, "decoded_b64")
                ? b64 (row, "decoded_b64", &want_len)
                : (guchar *)g_memdup2 (text, (want_len = len) + 1);
      g_autofree guchar *want_kept
          = json_object_has_member (row, "decoded_special_b64")
                ? b64 (row, "decoded_special_b64", &want_kept_len)
                : (guchar *)g_memdup2 (want_text,
                                       (want_kept_len = want_len) + 1);
      g_autofree char *got_text = stow_hf_tokenizer_decode (
          t, (guint32 *)want->data, want->len, TRUE, &got_len);
      g_autofree char *got_kept = stow_hf_tokenizer_decode (
          t, (guint32 *)want->data, want->len, FALSE, &got_kept_len);
      gboolean ok_ids = same_ids (got, want);
      gboolean ok_special = same_ids (got_special, want_special);
      gboolean ok_text
          = got_len == want_len && memcmp (got_text, want_text, got_len) == 0;
      gboolean ok_kept = got_kept_len == want_kept_len
                         && memcmp (got_kept, want_kept, got_kept_len) == 0;
      if (ok_ids && ok_special && ok_text && ok_kept)
        continue;
      if (bad++ < 8)
        {
          g_autofree char *esc = g_strescape ((const char *)text, NULL);
          g_autofree char *w = ids_string (want), *g = ids_string (got);
          g_test_message ("%s: input %u \"%.200s\": ids %s; want %s, got %s; "
                          "special ids %s; decoded %s; decoded with "
                          "specials %s",
                          name, i, esc, ok_ids ? "ok" : "DIFFER", w, g,
                          ok_special ? "ok" : "DIFFER",
                          ok_text ? "ok" : "DIFFER", ok_kept ? "ok" : "DIFFER");
        }
    }
  g_test_message (
      "%s: %u of %u strings as HF tokenizers %s", name, n - bad, n,
      json_object_get_string_member (expected (), "tokenizers_version"));
  g_assert_cmpuint (bad, ==, 0);
}

/* ---- model directories -------------------------------------------------- */

/* A model directory in a scratch place: the fixture's files, gunzipped. */
static char *
model_dir (const char *name)
{
  char *dir = stow_test_tmpdir ("tokenizer-dir");
  const char *files[] = { "tokenizer.json", "tokenizer.json.gz",
                          "tokenizer_config.json", "generation_config.json" };
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *rel = g_build_filename (name, files[i], NULL);
      g_autofree char *src = stow_test_fixture ("tokenizers", rel, NULL);
      if (!g_file_test (src, G_FILE_TEST_EXISTS))
        continue;
      g_autoptr (GBytes) b = read_fixture (rel);
      g_autofree char *base = g_strdup (files[i]);
      if (g_str_has_suffix (base, ".gz"))
        base[strlen (base) - 3] = '\0';
      g_autofree char *dst = g_build_filename (dir, base, NULL);
      stow_test_write_file (dst, g_bytes_get_data (b, NULL),
                            g_bytes_get_size (b));
    }
  return dir;
}

/* BOS, EOS, the vocabulary and the ids of a few texts as transformers'
 * AutoTokenizer gives them for the directory (tokenizer_config.json's added
 * tokens included): a document's ids are [BOS] + encode(text) + [EOS] as
 * the configs say. */
static void
test_model_dir (gconstpointer data)
{
  const char *name = data;
  JsonObject *dirs = json_object_get_object_member (expected (), "model_dirs");
  if (!json_object_has_member (dirs, name))
    {
      g_test_skip ("expected.json has no transformers results");
      return;
    }
  JsonObject *want = json_object_get_object_member (dirs, name);
  g_autofree char *dir = model_dir (name);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowHfTokenizer) t = stow_hf_tokenizer_new_from_path (dir, &error);
  g_assert_no_error (error);
  JsonNode *bos = json_object_get_member (want, "bos_id");
  JsonNode *eos = json_object_get_member (want, "eos_id");
  g_assert_cmpint (stow_hf_tokenizer_bos_id (t), ==,
                   JSON_NODE_HOLDS_NULL (bos) ? -1 : json_node_get_int (bos));
  g_assert_cmpint (stow_hf_tokenizer_eos_id (t), ==,
                   JSON_NODE_HOLDS_NULL (eos) ? -1 : json_node_get_int (eos));
  g_assert_cmpuint (stow_hf_tokenizer_n_ids (t), ==,
                    json_object_get_int_member (want, "vocab_size"));
  JsonArray *texts = json_object_get_array_member (want, "texts");
  for (guint i = 0; i < json_array_get_length (texts); i++)
    {
      JsonObject *o = json_array_get_object_element (texts, i);
      g_autoptr (GArray) w = ids_of (json_object_get_array_member (o, "ids"));
      g_autoptr (GArray) got = g_array_new (FALSE, FALSE, sizeof (guint32));
      if (stow_hf_tokenizer_adds_bos (t))
        {
          guint32 id = (guint32)stow_hf_tokenizer_bos_id (t);
          g_array_append_val (got, id);
        }
      g_assert_true (stow_hf_tokenizer_encode (
          t, json_object_get_string_member (o, "text"), -1, FALSE, got,
          &error));
      if (stow_hf_tokenizer_adds_eos (t))
        {
          guint32 id = (guint32)stow_hf_tokenizer_eos_id (t);
          g_array_append_val (got, id);
        }
      g_autofree char *ws = ids_string (w), *gs = ids_string (got);
      g_assert_cmpstr (gs, ==, ws);
    }
  stow_test_rm_rf (dir);
}

/* tokenizer_config.json and generation_config.json of every shape: tokens
 * as strings and as objects, ids as lists, add_bos_token over the
 * template, and the errors. */
static void
test_configs (void)
{
  g_autofree char *dir = model_dir ("phi3-mini");
  g_autofree char *tc = g_build_filename (dir, "tokenizer_config.json", NULL);
  g_autofree char *gc = g_build_filename (dir, "generation_config.json", NULL);
  g_autoptr (GError) error = NULL;

  const char *cfg1
      = "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false},"
        " \"eos_token\": \"</s>\", \"add_bos_token\": true}";
  stow_test_write_file (tc, cfg1, strlen (cfg1));
  StowHfTokenizer *t = stow_hf_tokenizer_new_from_path (dir, &error);
  g_assert_no_error (error);
  g_assert_cmpint (stow_hf_tokenizer_bos_id (t), ==, 1);
  g_assert_cmpint (stow_hf_tokenizer_eos_id (t), ==, 2);
  g_assert_true (stow_hf_tokenizer_adds_bos (t));
  g_assert_false (stow_hf_tokenizer_adds_eos (t));
  stow_hf_tokenizer_unref (t);

  /* No tokens in tokenizer_config.json: generation_config.json's ids, the
   * first of a list. */
  stow_test_write_file (tc, "{}", 2);
  const char *gen = "{\"bos_token_id\": 1, \"eos_token_id\": [32007, 32000]}";
  stow_test_write_file (gc, gen, strlen (gen));
  t = stow_hf_tokenizer_new_from_path (dir, &error);
  g_assert_no_error (error);
  g_assert_cmpint (stow_hf_tokenizer_bos_id (t), ==, 1);
  g_assert_cmpint (stow_hf_tokenizer_eos_id (t), ==, 32007);
  g_assert_false (stow_hf_tokenizer_adds_bos (t));
  stow_hf_tokenizer_unref (t);

  /* Errors name the file and the member. */
  const char *bad[][2] = {
    { "{\"eos_token\": \"<nope>\"}", "eos_token \"<nope>\" is neither" },
    { "{\"add_bos_token\": \"yes\"}", "add_bos_token" },
    { "{\"add_bos_token\": true, \"bos_token\": null}",
      "add_bos_token is true but no bos_token" },
    { "{\"added_tokens_decoder\": {\"x\": {}}}", "\"x\" is not a token id" },
    { "{\"added_tokens_decoder\": {\"40000\": {\"lstrip\": true}}}",
      "added_tokens_decoder.40000: content" },
    { "[1, 2", "tokenizer_config.json" },
  };
  stow_test_write_file (gc, "{}", 2);
  for (guint i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_clear_error (&error);
      stow_test_write_file (tc, bad[i][0], strlen (bad[i][0]));
      g_assert_null (stow_hf_tokenizer_new_from_path (dir, &error));
      g_assert_error (error, STOW_TOKENIZER_ERROR, STOW_TOKENIZER_ERROR_PARSE);
      g_assert_nonnull (strstr (error->message, "tokenizer_config.json"));
      g_assert_nonnull (strstr (error->message, bad[i][1]));
    }
  stow_test_rm_rf (dir);
}

/* ---- properties --------------------------------------------------------- */

/* A random valid UTF-8 string: ASCII most of the time, then letters of
 * several scripts, combining marks, emoji, white space of every kind.
 * @no_sp leaves out U+2581 (SentencePiece's space decodes as ' '). */
static char *
random_text (GRand *r, gboolean no_sp)
{
  static const gunichar ranges[][2] = {
    { 0x20, 0x7e },     { 0x20, 0x7e },       { 0x20, 0x7e },
    { 0x09, 0x0d },     { 0xa0, 0x24f },      { 0x300, 0x36f },
    { 0x370, 0x3ff },   { 0x400, 0x4ff },     { 0x590, 0x6ff },
    { 0x900, 0x97f },   { 0xe00, 0xe7f },     { 0x1780, 0x17ff },
    { 0x1100, 0x11ff }, { 0x2000, 0x206f },   { 0x3000, 0x30ff },
    { 0x4e00, 0x9fff }, { 0xac00, 0xd7a3 },   { 0xe000, 0xe0ff },
    { 0xff00, 0xffef }, { 0x1f300, 0x1faff }, { 0x10000, 0x10ffff },
  };
  GString *s = g_string_new (NULL);
  guint n = (guint)g_rand_int_range (r, 0, 120);
  for (guint i = 0; i < n; i++)
    {
      guint k = (guint)g_rand_int_range (r, 0, G_N_ELEMENTS (ranges));
      gunichar c = (gunichar)g_rand_int_range (r, (gint32)ranges[k][0],
                                               (gint32)ranges[k][1] + 1);
      if ((c >= 0xd800 && c <= 0xdfff) || (no_sp && c == 0x2581))
        c = 'x';
      g_string_append_unichar (s, c);
    }
  return g_string_free (s, FALSE);
}

/* decode(encode(x)) gives x back (its NFC for Qwen2, which normalizes). */
static void
test_roundtrip (gconstpointer data)
{
  const char *name = data;
  g_autoptr (StowHfTokenizer) t = load_variant (name);
  gboolean nfc = strcmp (name, "qwen2") == 0;
  gboolean sp = strcmp (name, "phi3") == 0;
  g_autoptr (GRand) r = g_rand_new_with_seed (20261128);
  for (guint i = 0; i < 300; i++)
    {
      g_autofree char *x = random_text (r, sp);
      g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (guint32));
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_hf_tokenizer_encode (t, x, -1, FALSE, ids, &error));
      g_assert_no_error (error);
      g_autofree char *back = stow_hf_tokenizer_decode (t, (guint32 *)ids->data,
                                                        ids->len, TRUE, NULL);
      g_autofree char *want
          = nfc ? g_utf8_normalize (x, -1, G_NORMALIZE_NFC) : g_strdup (x);
      g_assert_cmpstr (back, ==, want);
    }
}

/* Random bytes: encoded when they are UTF-8, refused by name otherwise;
 * never a crash. */
static void
test_random_bytes (gconstpointer data)
{
  g_autoptr (StowHfTokenizer) t = load_variant (data);
  g_autoptr (GRand) r = g_rand_new_with_seed (37);
  for (guint i = 0; i < 2000; i++)
    {
      guint8 buf[64];
      guint n = (guint)g_rand_int_range (r, 1, sizeof buf);
      for (guint k = 0; k < n; k++)
        {
          /* Mostly ASCII or UTF-8 lead and continuation bytes. */
          guint32 x = g_rand_int (r);
          buf[k] = (x & 3) == 0 ? (guint8)(x >> 8)
                                : (guint8)(0x20 + (x >> 8) % 0x5f);
          if (buf[k] == 0)
            buf[k] = 1;
        }
      g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (guint32));
      g_autoptr (GError) error = NULL;
      gboolean valid = g_utf8_validate_len ((const char *)buf, n, NULL);
      gboolean ok = stow_hf_tokenizer_encode (t, (const char *)buf, n, FALSE,
                                              ids, &error);
      g_assert_cmpint (ok, ==, valid);
      if (!ok)
        {
          g_assert_error (error, STOW_TOKENIZER_ERROR,
                          STOW_TOKENIZER_ERROR_INVALID_UTF8);
          g_assert_cmpuint (ids->len, ==, 0);
        }
    }
}

static void
test_invalid_utf8 (void)
{
  g_autoptr (StowHfTokenizer) t = load_variant ("gpt2");
  const struct
  {
    const char *text;
    const char *where;
  } cases[] = {
    { "abc\xff", "byte 3 (0xff)" },          { "\xc3(", "byte 0 (0xc3)" },
    { "ok \xed\xa0\x80", "byte 3 (0xed)" },  /* a surrogate */
    { "\xc0\xaf", "byte 0 (0xc0)" },         /* overlong */
    { "\xe2\x82", "byte 0 (0xe2)" },         /* cut short */
    { "\xf4\x90\x80\x80", "byte 0 (0xf4)" }, /* past U+10FFFF */
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (guint32));
      g_autoptr (GError) error = NULL;
      g_assert_false (
          stow_hf_tokenizer_encode (t, cases[i].text, -1, TRUE, ids, &error));
      g_assert_error (error, STOW_TOKENIZER_ERROR,
                      STOW_TOKENIZER_ERROR_INVALID_UTF8);
      g_assert_nonnull (strstr (error->message, cases[i].where));
      g_assert_cmpuint (ids->len, ==, 0);
    }
  /* NUL is UTF-8. */
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  g_assert_true (stow_hf_tokenizer_encode (t, "a\0b", 3, FALSE, ids, NULL));
  g_assert_cmpuint (ids->len, ==, 3);
}

/* Byte tokens that are no UTF-8 decode to U+FFFD as HF makes them: one per
 * byte for ByteFallback, one per maximal invalid sequence for ByteLevel. */
static void
test_decode_invalid (void)
{
  g_autoptr (StowHfTokenizer) phi = load_variant ("phi3");
  guint32 bytes[]
      = { 15043, /* "▁Hello" */ 229 /* <0xE2> */, 133 /* <0x82> */, 29871 };
  g_autofree char *s = stow_hf_tokenizer_decode (phi, bytes, 4, TRUE, NULL);
  g_assert_cmpstr (s, ==, "Hello\xef\xbf\xbd\xef\xbf\xbd ");
  g_autoptr (StowHfTokenizer) gpt2 = load_variant ("gpt2");
  /* "â" "Ĥ" are the byte characters of 0xE2 0x82; then "a". */
  gint64 e2 = stow_hf_tokenizer_token_to_id (gpt2, "\xc3\xa2");
  gint64 x82 = stow_hf_tokenizer_token_to_id (gpt2, "\xc4\xa4");
  gint64 a = stow_hf_tokenizer_token_to_id (gpt2, "a");
  g_assert_cmpint (e2, >=, 0);
  g_assert_cmpint (x82, >=, 0);
  guint32 ids[] = { (guint32)e2, (guint32)x82, (guint32)a };
  g_autofree char *g = stow_hf_tokenizer_decode (gpt2, ids, 3, TRUE, NULL);
  g_assert_cmpstr (g, ==,
                   "\xef\xbf\xbd"
                   "a");
}

/* ---- corrupt files ------------------------------------------------------ */

/* A small tokenizer.json with one member replaced (or removed, NULL). */
static char *
small_json (const char *member, const char *value)
{
  const char *parts[][2] = {
    { "version", "\"1.0\"" },
    { "added_tokens", "[{\"id\": 7, \"content\": \"<eos>\", \"single_word\": "
                      "false, \"lstrip\": false, \"rstrip\": false, "
                      "\"normalized\": false, \"special\": true}]" },
    { "normalizer", "null" },
    { "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                       "\"\\\\s+\"}, \"behavior\": \"Isolated\", "
                       "\"invert\": false}" },
    { "post_processor", "null" },
    { "decoder", "null" },
    { "model", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, "
               "\"ab\": 3, \"bc\": 4, \"abc\": 5, \" \": 6}, \"merges\": "
               "[\"a b\", [\"ab\", \"c\"]]}" },
  };
  GString *s = g_string_new ("{");
  for (guint i = 0; i < G_N_ELEMENTS (parts); i++)
    {
      const char *v = strcmp (parts[i][0], member) == 0 ? value : parts[i][1];
      if (v == NULL)
        continue;
      g_string_append_printf (s, "%s\"%s\": %s", s->len > 1 ? ", " : "",
                              parts[i][0], v);
    }
  g_string_append_c (s, '}');
  return g_string_free (s, FALSE);
}

static void
test_small (void)
{
  g_autofree char *json = small_json ("", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowHfTokenizer) t
      = stow_hf_tokenizer_new_from_data (json, -1, "small.json", &error);
  g_assert_no_error (error);
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  g_assert_true (
      stow_hf_tokenizer_encode (t, "abc ab<eos>cba", -1, FALSE, ids, &error));
  /* abc | " " | ab | <eos> | c b a: "a b" and "ab c" both merge. */
  g_autofree char *s = ids_string (ids);
  g_assert_cmpstr (s, ==, "5 6 3 7 2 1 0");
  g_assert_cmpuint (stow_hf_tokenizer_n_ids (t), ==, 8);
  g_assert_cmpint (stow_hf_tokenizer_token_to_id (t, "<eos>"), ==, 7);
  g_assert_cmpstr (stow_hf_tokenizer_id_to_token (t, 5), ==, "abc");
  g_assert_true (stow_hf_tokenizer_is_special (t, 7));
  g_assert_false (stow_hf_tokenizer_is_special (t, 5));
  /* No decoder: the tokens joined by spaces, as HF. */
  g_autofree char *d = stow_hf_tokenizer_decode (t, (guint32 *)ids->data,
                                                 ids->len, FALSE, NULL);
  g_assert_cmpstr (d, ==, "abc   ab <eos> c b a");
}

static void
test_corrupt (void)
{
  const struct
  {
    const char *member, *value;
    StowTokenizerError code;
    const char *says;
  } cases[] = {
    { "model", NULL, STOW_TOKENIZER_ERROR_PARSE, "model: expected an object" },
    { "model", "{\"type\": \"Unigram\", \"vocab\": []}",
      STOW_TOKENIZER_ERROR_UNSUPPORTED, "model.type \"Unigram\"" },
    { "model", "{\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}",
      STOW_TOKENIZER_ERROR_PARSE, "model.vocab: \"a\": expected an integer" },
    { "model", "{\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}",
      STOW_TOKENIZER_ERROR_PARSE, "model.vocab: \"a\": id -1" },
    { "model", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}}",
      STOW_TOKENIZER_ERROR_PARSE, "model.merges: missing" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}",
      STOW_TOKENIZER_ERROR_PARSE, "model.merges[0]: \"a b c\" is not two" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}",
      STOW_TOKENIZER_ERROR_PARSE, "model.merges[0]: expected" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}",
      STOW_TOKENIZER_ERROR_PARSE,
      "model.merges[0]: \"z\" is not in model.vocab" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}",
      STOW_TOKENIZER_ERROR_PARSE, "merged token \"aa\" is not in" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
      "\"unk_token\": \"<unk>\"}",
      STOW_TOKENIZER_ERROR_PARSE, "model.unk_token \"<unk>\"" },
    { "model",
      "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
      "\"byte_fallback\": 1}",
      STOW_TOKENIZER_ERROR_PARSE, "model.byte_fallback: expected" },
    { "normalizer", "{\"type\": \"Lowercase\"}",
      STOW_TOKENIZER_ERROR_UNSUPPORTED, "normalizer.type \"Lowercase\"" },
    { "normalizer",
      "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": "
      "\"NFC\"}, {\"type\": \"Prepend\"}]}",
      STOW_TOKENIZER_ERROR_PARSE, "normalizer.normalizers[1]: prepend" },
    { "normalizer",
      "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, "
      "\"content\": \"x\"}",
      STOW_TOKENIZER_ERROR_PARSE, "normalizer.pattern.Regex: not a regex" },
    { "pre_tokenizer", "{\"type\": \"Whitespace\"}",
      STOW_TOKENIZER_ERROR_UNSUPPORTED, "pre_tokenizer.type \"Whitespace\"" },
    { "pre_tokenizer",
      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, "
      "\"behavior\": \"Sideways\", \"invert\": false}",
      STOW_TOKENIZER_ERROR_PARSE, "pre_tokenizer.behavior: \"Sideways\"" },
    { "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}",
      STOW_TOKENIZER_ERROR_PARSE, "pre_tokenizer.replacement" },
    { "pre_tokenizer", "[1]", STOW_TOKENIZER_ERROR_PARSE,
      "pre_tokenizer: expected an object" },
    { "decoder", "{\"type\": \"WordPiece\"}", STOW_TOKENIZER_ERROR_UNSUPPORTED,
      "decoder.type \"WordPiece\"" },
    { "decoder",
      "{\"type\": \"Strip\", \"content\": \" \", \"start\": -1, "
      "\"stop\": 0}",
      STOW_TOKENIZER_ERROR_PARSE, "decoder: start" },
    { "post_processor",
      "{\"type\": \"TemplateProcessing\", \"single\": "
      "[{\"SpecialToken\": {\"id\": \"<bos>\"}}], "
      "\"special_tokens\": {}}",
      STOW_TOKENIZER_ERROR_PARSE, "post_processor.special_tokens.<bos>" },
    { "added_tokens", "{}", STOW_TOKENIZER_ERROR_PARSE,
      "added_tokens: expected an array" },
    { "added_tokens", "[{\"id\": 9}]", STOW_TOKENIZER_ERROR_PARSE,
      "added_tokens[0]: content" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *json = small_json (cases[i].member, cases[i].value);
      g_autoptr (GError) error = NULL;
      StowHfTokenizer *t
          = stow_hf_tokenizer_new_from_data (json, -1, "bad.json", &error);
      if (t != NULL || error == NULL
          || !g_error_matches (error, STOW_TOKENIZER_ERROR, cases[i].code)
          || !g_str_has_prefix (error->message, "bad.json: ")
          || strstr (error->message, cases[i].says) == NULL)
        g_error ("case %u (%s): %s", i, json,
                 error ? error->message : "no error");
    }
  /* Not JSON at all, and cut short: the file, line and column. */
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_hf_tokenizer_new_from_data ("{\"model\": {", -1,
                                                  "cut.json", &error));
  g_assert_error (error, STOW_TOKENIZER_ERROR, STOW_TOKENIZER_ERROR_PARSE);
  g_assert_true (g_str_has_prefix (error->message, "cut.json:1:"));
  g_clear_error (&error);
  g_assert_null (stow_hf_tokenizer_new_from_path ("/nonexistent/tok", &error));
  g_assert_error (error, STOW_TOKENIZER_ERROR, STOW_TOKENIZER_ERROR_IO);
  g_assert_nonnull (strstr (error->message, "/nonexistent/tok"));
}

/* ---- threads ------------------------------------------------------------ */

typedef struct
{
  StowHfTokenizer *t;
  const char *text;
  gsize len;
  GArray *ids;
} Job;

static gpointer
encode_job (gpointer data)
{
  Job *j = data;
  g_autoptr (StowHfEncoder) e = stow_hf_encoder_new (j->t);
  for (guint k = 0; k < 3; k++)
    {
      g_array_set_size (j->ids, 0);
      g_assert_true (stow_hf_encoder_encode (e, j->text, (gssize)j->len, FALSE,
                                             j->ids, NULL));
    }
  return NULL;
}

/* The long document in four threads, each its own encoder: the ids of
 * one. */
static void
test_threads (void)
{
  g_autoptr (StowHfTokenizer) t = load_variant ("qwen2");
  JsonArray *inputs = json_object_get_array_member (expected (), "inputs");
  guint last = json_array_get_length (inputs) - 1;
  gsize len;
  g_autofree guchar *text
      = b64 (json_array_get_object_element (inputs, last), "b64", &len);
  Job jobs[4];
  GThread *threads[4];
  for (guint i = 0; i < 4; i++)
    {
      jobs[i] = (Job){ t, (const char *)text, len,
                       g_array_new (FALSE, FALSE, sizeof (guint32)) };
      threads[i] = g_thread_new ("encode", encode_job, &jobs[i]);
    }
  for (guint i = 0; i < 4; i++)
    g_thread_join (threads[i]);
  JsonArray *rows = json_object_get_array_member (
      json_object_get_object_member (expected (), "expected"), "qwen2");
  g_autoptr (GArray) want = ids_of (json_object_get_array_member (
      json_array_get_object_element (rows, last), "ids"));
  for (guint i = 0; i < 4; i++)
    {
      g_assert_true (same_ids (jobs[i].ids, want));
      g_array_unref (jobs[i].ids);
    }
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  static const char *variants[] = {
    "gpt2",
    "qwen2",
    "phi3",
    "gpt2-llama3",
    "phi3-metaspace",
    "phi3-metaspace-split",
    "probe-qwen2-regex",
    "probe-gpt2-regex",
  };
  for (guint i = 0; i < G_N_ELEMENTS (variants); i++)
    {
      g_autofree char *path = g_strdup_printf ("/tokenizer/hf/%s", variants[i]);
      g_test_add_data_func (path, variants[i], test_hf_ids);
    }
  static const char *dirs[] = { "gpt2", "phi3-mini", "qwen2.5" };
  for (guint i = 0; i < G_N_ELEMENTS (dirs); i++)
    {
      g_autofree char *path
          = g_strdup_printf ("/tokenizer/model-dir/%s", dirs[i]);
      g_test_add_data_func (path, dirs[i], test_model_dir);
    }
  g_test_add_func ("/tokenizer/configs", test_configs);
  static const char *shipped[] = { "gpt2", "qwen2", "phi3" };
  for (guint i = 0; i < G_N_ELEMENTS (shipped); i++)
    {
      g_autofree char *p1
          = g_strdup_printf ("/tokenizer/roundtrip/%s", shipped[i]);
      g_test_add_data_func (p1, shipped[i], test_roundtrip);
      g_autofree char *p2
          = g_strdup_printf ("/tokenizer/random-bytes/%s", shipped[i]);
      g_test_add_data_func (p2, shipped[i], test_random_bytes);
    }
  g_test_add_func ("/tokenizer/invalid-utf8", test_invalid_utf8);
  g_test_add_func ("/tokenizer/decode-invalid", test_decode_invalid);
  g_test_add_func ("/tokenizer/small", test_small);
  g_test_add_func ("/tokenizer/corrupt", test_corrupt);
  g_test_add_func ("/tokenizer/threads", test_threads);
  int rc = g_test_run ();
  if (expected_root)
    json_object_unref (expected_root);
  if (variants_loaded)
    g_hash_table_unref (variants_loaded);
  return rc;
}
