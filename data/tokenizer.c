/* SPDX-License-Identifier: MIT
 *
 * data/tokenizer.c: reading a tokenizer.json (and a model directory's
 * tokenizer_config.json, generation_config.json and config.json) into a
 * StowHfTokenizer; the accessors.  Encoding is data/encode.c's, decoding
 * data/decode.c's.  Every component is checked when the file is read, so
 * that encoding cannot fail on anything but its input.
 */
#include "data/tokenizer-private.h"

#include <string.h>

#include "core/error.h"
#include "core/json.h"

/* clang-format off */
G_DEFINE_QUARK (stow-tokenizer-error-quark, stow_tokenizer_error)
/* clang-format on */

/* tokenizer.json files run to tens of MB (Gemma's is 34 MB). */
#define TOKENIZER_JSON_MAX_BYTES ((gsize)256 << 20)

/* GPT-2's pre-tokenizer regex, as HF's ByteLevel uses it (use_regex). */
#define GPT2_REGEX                                                             \
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"         \
  "\\s+(?!\\S)|\\s+"

gboolean
stow_tokenizer_fail (GError **error, StowTokenizerError code, const char *name,
                     const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_TOKENIZER_ERROR, code, "%s: %s", name, what);
  return FALSE;
}

/* core/json's getters set STOW_CORE_ERROR; a tokenizer's file errors are
 * STOW_TOKENIZER_ERROR_PARSE, with the same message. */
static gboolean
retag (GError **error)
{
  if (error && *error && (*error)->domain == STOW_CORE_ERROR)
    {
      (*error)->domain = STOW_TOKENIZER_ERROR;
      (*error)->code = STOW_TOKENIZER_ERROR_PARSE;
    }
  return FALSE;
}

/* Typed members of a component at @path ("normalizer.normalizers[1]"). */
typedef struct
{
  const char *name; /* the file */
  GError **error;
} Reader;

static gboolean
get_string (Reader *r, JsonObject *o, const char *path, const char *member,
            gboolean required, const char **out)
{
  g_autofree char *where
      = path ? g_strdup_printf ("%s: %s", r->name, path) : g_strdup (r->name);
  if (!stow_json_get_string (o, where, member, required, out, r->error))
    return retag (r->error);
  return TRUE;
}

static gboolean
get_bool (Reader *r, JsonObject *o, const char *path, const char *member,
          gboolean *out)
{
  g_autofree char *where
      = path ? g_strdup_printf ("%s: %s", r->name, path) : g_strdup (r->name);
  if (!stow_json_get_bool (o, where, member, FALSE, out, r->error))
    return retag (r->error);
  return TRUE;
}

static gboolean
get_u64 (Reader *r, JsonObject *o, const char *path, const char *member,
         gboolean required, guint64 *out)
{
  g_autofree char *where
      = path ? g_strdup_printf ("%s: %s", r->name, path) : g_strdup (r->name);
  if (!stow_json_get_u64 (o, where, member, required, out, r->error))
    return retag (r->error);
  return TRUE;
}

static gboolean
get_array (Reader *r, JsonObject *o, const char *path, const char *member,
           JsonArray **out)
{
  g_autofree char *where
      = path ? g_strdup_printf ("%s: %s", r->name, path) : g_strdup (r->name);
  if (!stow_json_get_array (o, where, member, TRUE, out, r->error))
    return retag (r->error);
  return TRUE;
}

/* The object at @node, or an error naming @path. */
static JsonObject *
as_object (Reader *r, JsonNode *node, const char *path)
{
  if (node == NULL || !JSON_NODE_HOLDS_OBJECT (node))
    {
      stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                           "%s: expected an object", path);
      return NULL;
    }
  return json_node_get_object (node);
}

static const char *
component_type (Reader *r, JsonObject *o, const char *path)
{
  const char *type = NULL;
  if (!get_string (r, o, path, "type", TRUE, &type))
    return NULL;
  return type;
}

static void
pattern_clear (Pattern *p)
{
  g_free (p->literal);
  if (p->regex)
    g_regex_unref (p->regex);
  memset (p, 0, sizeof *p);
}

/* {"String": s} or {"Regex": r}; the regex through GRegex (PCRE2 with
 * Unicode properties, JIT-compiled), as Oniguruma reads it (data/regex.c). */
static gboolean
read_pattern (Reader *r, JsonObject *o, const char *path, Pattern *out)
{
  g_autofree char *ppath = g_strdup_printf ("%s.pattern", path);
  JsonObject *po = as_object (r, json_object_get_member (o, "pattern"), ppath);
  if (po == NULL)
    return FALSE;
  const char *s = NULL;
  if (json_object_has_member (po, "String"))
    {
      if (!get_string (r, po, ppath, "String", TRUE, &s))
        return FALSE;
      out->literal = g_strdup (s);
      out->literal_len = strlen (s);
      return TRUE;
    }
  if (!json_object_has_member (po, "Regex"))
    return stow_tokenizer_fail (
        r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
        "%s: expected {\"String\": ...} or {\"Regex\": ...}", ppath);
  if (!get_string (r, po, ppath, "Regex", TRUE, &s))
    return FALSE;
  g_autoptr (GError) local = NULL;
  out->regex = stow_onig_regex_new (s, &local);
  if (out->regex == NULL)
    return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                                "%s.Regex: not a regex GRegex reads: %s", ppath,
                                local->message);
  return TRUE;
}

/* ---- normalizers -------------------------------------------------------- */

static gboolean read_normalizer (Reader *r, JsonNode *node, const char *path,
                                 GArray *out);

static gboolean
read_normalizer (Reader *r, JsonNode *node, const char *path, GArray *out)
{
  JsonObject *o = as_object (r, node, path);
  const char *type = o ? component_type (r, o, path) : NULL;
  if (type == NULL)
    return FALSE;
  Normalizer n = { 0 };
  if (strcmp (type, "Sequence") == 0)
    {
      JsonArray *a;
      if (!get_array (r, o, path, "normalizers", &a))
        return FALSE;
      for (guint i = 0; i < json_array_get_length (a); i++)
        {
          g_autofree char *sub
              = g_strdup_printf ("%s.normalizers[%u]", path, i);
          if (!read_normalizer (r, json_array_get_element (a, i), sub, out))
            return FALSE;
        }
      return TRUE;
    }
  if (strcmp (type, "NFC") == 0)
    n.kind = NORM_NFC;
  else if (strcmp (type, "NFD") == 0)
    n.kind = NORM_NFD;
  else if (strcmp (type, "NFKC") == 0)
    n.kind = NORM_NFKC;
  else if (strcmp (type, "NFKD") == 0)
    n.kind = NORM_NFKD;
  else if (strcmp (type, "Prepend") == 0)
    {
      const char *s;
      if (!get_string (r, o, path, "prepend", TRUE, &s))
        return FALSE;
      n.kind = NORM_PREPEND;
      n.text = g_strdup (s);
      n.text_len = strlen (s);
    }
  else if (strcmp (type, "Replace") == 0)
    {
      const char *s;
      if (!get_string (r, o, path, "content", TRUE, &s))
        return FALSE;
      n.kind = NORM_REPLACE;
      n.text = g_strdup (s);
      n.text_len = strlen (s);
      if (!read_pattern (r, o, path, &n.pattern))
        {
          g_free (n.text);
          return FALSE;
        }
    }
  else
    return stow_tokenizer_fail (
        r->error, STOW_TOKENIZER_ERROR_UNSUPPORTED, r->name,
        "%s.type \"%s\" is not supported (stowage reads NFC, NFD, "
        "NFKC, NFKD, Prepend, Replace and Sequence)",
        path, type);
  g_array_append_val (out, n);
  return TRUE;
}

/* ---- pre-tokenizers ----------------------------------------------------- */

static gboolean
read_behavior (Reader *r, JsonObject *o, const char *path, SplitBehavior *out)
{
  static const struct
  {
    const char *name;
    SplitBehavior b;
  } names[] = {
    { .name = "Isolated", .b = SPLIT_ISOLATED },
    { .name = "Removed", .b = SPLIT_REMOVED },
    { .name = "MergedWithPrevious", .b = SPLIT_MERGED_WITH_PREVIOUS },
    { .name = "MergedWithNext", .b = SPLIT_MERGED_WITH_NEXT },
    { .name = "Contiguous", .b = SPLIT_CONTIGUOUS },
  };
  const char *s;
  if (!get_string (r, o, path, "behavior", TRUE, &s))
    return FALSE;
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    if (strcmp (s, names[i].name) == 0)
      {
        *out = names[i].b;
        return TRUE;
      }
  return stow_tokenizer_fail (
      r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
      "%s.behavior: \"%s\" is not Isolated, Removed, "
      "MergedWithPrevious, MergedWithNext or Contiguous",
      path, s);
}

/* Metaspace's replacement (one character) and prepend_scheme, shared by
 * the pre-tokenizer and the decoder. */
static gboolean
read_metaspace (Reader *r, JsonObject *o, const char *path, char *repl,
                gsize *repl_len, gunichar *repl_char, PrependScheme *scheme)
{
  const char *s;
  if (!get_string (r, o, path, "replacement", TRUE, &s))
    return FALSE;
  if (g_utf8_strlen (s, -1) != 1)
    return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                                "%s.replacement: \"%s\" is not one character",
                                path, s);
  *repl_len = strlen (s);
  memcpy (repl, s, *repl_len);
  *repl_char = g_utf8_get_char (s);
  /* HF: prepend_scheme defaults to always; the older add_prefix_space
   * false means never. */
  *scheme = PREPEND_ALWAYS;
  const char *ps = NULL;
  if (!get_string (r, o, path, "prepend_scheme", FALSE, &ps))
    return FALSE;
  if (ps != NULL)
    {
      if (strcmp (ps, "always") == 0)
        *scheme = PREPEND_ALWAYS;
      else if (strcmp (ps, "first") == 0)
        *scheme = PREPEND_FIRST;
      else if (strcmp (ps, "never") == 0)
        *scheme = PREPEND_NEVER;
      else
        return stow_tokenizer_fail (
            r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
            "%s.prepend_scheme: \"%s\" is not always, first or never", path,
            ps);
    }
  gboolean add_prefix_space = TRUE;
  if (!get_bool (r, o, path, "add_prefix_space", &add_prefix_space))
    return FALSE;
  if (!add_prefix_space)
    {
      if (*scheme != PREPEND_NEVER && ps != NULL && strcmp (ps, "never") != 0)
        return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE,
                                    r->name,
                                    "%s: add_prefix_space false does not match "
                                    "prepend_scheme \"%s\"",
                                    path, ps);
      *scheme = PREPEND_NEVER;
    }
  return TRUE;
}

static gboolean
read_pre_tokenizer (Reader *r, JsonNode *node, const char *path, GArray *out)
{
  JsonObject *o = as_object (r, node, path);
  const char *type = o ? component_type (r, o, path) : NULL;
  if (type == NULL)
    return FALSE;
  PreTokenizer p = { 0 };
  if (strcmp (type, "Sequence") == 0)
    {
      JsonArray *a;
      if (!get_array (r, o, path, "pretokenizers", &a))
        return FALSE;
      for (guint i = 0; i < json_array_get_length (a); i++)
        {
          g_autofree char *sub
              = g_strdup_printf ("%s.pretokenizers[%u]", path, i);
          if (!read_pre_tokenizer (r, json_array_get_element (a, i), sub, out))
            return FALSE;
        }
      return TRUE;
    }
  if (strcmp (type, "Split") == 0)
    {
      p.kind = PRE_SPLIT;
      if (!read_behavior (r, o, path, &p.behavior)
          || !get_bool (r, o, path, "invert", &p.invert)
          || !read_pattern (r, o, path, &p.pattern))
        return FALSE;
    }
  else if (strcmp (type, "ByteLevel") == 0)
    {
      p.kind = PRE_BYTE_LEVEL;
      p.add_prefix_space = TRUE;
      p.use_regex = TRUE;
      if (!get_bool (r, o, path, "add_prefix_space", &p.add_prefix_space)
          || !get_bool (r, o, path, "use_regex", &p.use_regex))
        return FALSE;
      if (p.use_regex)
        {
          p.pattern.regex = stow_onig_regex_new (GPT2_REGEX, NULL);
          g_assert (p.pattern.regex != NULL);
          p.behavior = SPLIT_ISOLATED;
        }
    }
  else if (strcmp (type, "Metaspace") == 0)
    {
      gunichar c;
      p.kind = PRE_METASPACE;
      p.split = TRUE;
      if (!read_metaspace (r, o, path, p.replacement, &p.replacement_len, &c,
                           &p.prepend)
          || !get_bool (r, o, path, "split", &p.split))
        return FALSE;
    }
  else
    return stow_tokenizer_fail (
        r->error, STOW_TOKENIZER_ERROR_UNSUPPORTED, r->name,
        "%s.type \"%s\" is not supported (stowage reads Split, "
        "ByteLevel, Metaspace and Sequence)",
        path, type);
  g_array_append_val (out, p);
  return TRUE;
}

/* ---- decoders ----------------------------------------------------------- */

static gboolean
read_decoder (Reader *r, JsonNode *node, const char *path, GArray *out)
{
  JsonObject *o = as_object (r, node, path);
  const char *type = o ? component_type (r, o, path) : NULL;
  if (type == NULL)
    return FALSE;
  Decoder d = { 0 };
  if (strcmp (type, "Sequence") == 0)
    {
      JsonArray *a;
      if (!get_array (r, o, path, "decoders", &a))
        return FALSE;
      for (guint i = 0; i < json_array_get_length (a); i++)
        {
          g_autofree char *sub = g_strdup_printf ("%s.decoders[%u]", path, i);
          if (!read_decoder (r, json_array_get_element (a, i), sub, out))
            return FALSE;
        }
      return TRUE;
    }
  if (strcmp (type, "ByteLevel") == 0)
    d.kind = DEC_BYTE_LEVEL;
  else if (strcmp (type, "ByteFallback") == 0)
    d.kind = DEC_BYTE_FALLBACK;
  else if (strcmp (type, "Fuse") == 0)
    d.kind = DEC_FUSE;
  else if (strcmp (type, "Replace") == 0)
    {
      const char *s;
      d.kind = DEC_REPLACE;
      if (!get_string (r, o, path, "content", TRUE, &s))
        return FALSE;
      d.text = g_strdup (s);
      d.text_len = strlen (s);
      if (!read_pattern (r, o, path, &d.pattern))
        {
          g_free (d.text);
          return FALSE;
        }
    }
  else if (strcmp (type, "Strip") == 0)
    {
      const char *s;
      guint64 start = 0, stop = 0;
      d.kind = DEC_STRIP;
      if (!get_string (r, o, path, "content", TRUE, &s)
          || !get_u64 (r, o, path, "start", TRUE, &start)
          || !get_u64 (r, o, path, "stop", TRUE, &stop))
        return FALSE;
      if (g_utf8_strlen (s, -1) != 1)
        return stow_tokenizer_fail (
            r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
            "%s.content: \"%s\" is not one character", path, s);
      d.strip_char = g_utf8_get_char (s);
      d.strip_start = (guint)MIN (start, G_MAXUINT);
      d.strip_stop = (guint)MIN (stop, G_MAXUINT);
    }
  else if (strcmp (type, "Metaspace") == 0)
    {
      char repl[8];
      gsize len;
      d.kind = DEC_METASPACE;
      if (!read_metaspace (r, o, path, repl, &len, &d.strip_char, &d.prepend))
        return FALSE;
    }
  else
    return stow_tokenizer_fail (
        r->error, STOW_TOKENIZER_ERROR_UNSUPPORTED, r->name,
        "%s.type \"%s\" is not supported (stowage reads ByteLevel, "
        "ByteFallback, Fuse, Replace, Strip, Metaspace and Sequence)",
        path, type);
  g_array_append_val (out, d);
  return TRUE;
}

/* ---- added tokens ------------------------------------------------------- */

static void
added_token_free (gpointer p)
{
  AddedToken *a = p;
  g_free (a->content);
  g_free (a->normalized_form);
  g_free (a);
}

/* The id of @token: an added token's, else the model's; -1. */
static gint64
token_id (const StowHfTokenizer *t, const char *token)
{
  AddedToken *a = g_hash_table_lookup (t->added_by_content, token);
  if (a != NULL)
    return a->id;
  return stow_bpe_token_to_id (t->bpe, token, strlen (token));
}

/* HF's AddedVocabulary::add_tokens: a token already in the vocabulary keeps
 * its id; a new one takes the next id past the model's entries and the
 * added tokens so far.  The id the file gives is not used (HF warns when it
 * differs; so do we, at debug level). */
static void
add_token (StowHfTokenizer *t, const AddedToken *tmpl, gint64 file_id)
{
  if (tmpl->len == 0)
    return;
  AddedToken *old = g_hash_table_lookup (t->added_by_content, tmpl->content);
  if (old != NULL && old->special == tmpl->special
      && old->lstrip == tmpl->lstrip && old->rstrip == tmpl->rstrip
      && old->single_word == tmpl->single_word
      && old->normalized == tmpl->normalized)
    return;
  guint32 max_added = 0;
  gboolean any = FALSE;
  for (guint i = 0; i < t->added->len; i++)
    {
      AddedToken *a = g_ptr_array_index (t->added, i);
      max_added = any ? MAX (max_added, a->id) : a->id;
      any = TRUE;
    }
  guint32 entries = stow_bpe_vocab_entries (t->bpe);
  guint32 next = !any                                     ? entries
                 : (max_added >= entries || entries == 0) ? max_added + 1
                                                          : entries;
  gint64 known = token_id (t, tmpl->content);
  /* A token added again with other options replaces the first. */
  if (old != NULL)
    {
      g_hash_table_remove (t->added_by_id, GUINT_TO_POINTER (old->id));
      g_hash_table_remove (t->added_by_content, old->content);
      g_ptr_array_remove (t->added, old);
    }
  AddedToken *a = g_new0 (AddedToken, 1);
  *a = *tmpl;
  a->content = g_strdup (tmpl->content);
  a->normalized_form = NULL;
  a->id = known >= 0 ? (guint32)known : next;
  if (file_id >= 0 && (gint64)a->id != file_id)
    g_debug ("%s: added token \"%s\" has id %" G_GINT64_FORMAT
             " in the file, %u as HF tokenizers numbers it",
             t->name, a->content, file_id, a->id);
  if (a->normalized)
    {
      gsize n;
      char *norm = stow_normalize (t, a->content, a->len, &n);
      if (norm != NULL && (n != a->len || memcmp (norm, a->content, n) != 0))
        {
          a->normalized_form = norm;
          a->normalized_len = n;
        }
      else
        g_free (norm);
    }
  g_ptr_array_add (t->added, a);
  g_hash_table_replace (t->added_by_content, a->content, a);
  g_hash_table_replace (t->added_by_id, GUINT_TO_POINTER (a->id), a);
  if (a->special)
    g_hash_table_add (t->special_strings, g_strdup (a->content));
}

/* One {"content": ..., "lstrip": ...} object of added_tokens (or of
 * tokenizer_config.json's added_tokens_decoder). */
static gboolean
read_added_token (Reader *r, JsonObject *o, const char *path, AddedToken *a,
                  gboolean normalized_default)
{
  const char *content;
  memset (a, 0, sizeof *a);
  a->normalized = normalized_default;
  if (!get_string (r, o, path, "content", TRUE, &content)
      || !get_bool (r, o, path, "single_word", &a->single_word)
      || !get_bool (r, o, path, "lstrip", &a->lstrip)
      || !get_bool (r, o, path, "rstrip", &a->rstrip)
      || !get_bool (r, o, path, "special", &a->special))
    return FALSE;
  /* HF: special tokens are not normalized unless the file says so. */
  if (!json_object_has_member (o, "normalized"))
    a->normalized = !a->special;
  if (!get_bool (r, o, path, "normalized", &a->normalized))
    return FALSE;
  a->content = (char *)content; /* borrowed until add_token copies it */
  a->len = strlen (content);
  return TRUE;
}

static gboolean
read_added_tokens (StowHfTokenizer *t, Reader *r, JsonObject *root)
{
  JsonNode *n = json_object_get_member (root, "added_tokens");
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    return TRUE;
  if (!JSON_NODE_HOLDS_ARRAY (n))
    return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                                "added_tokens: expected an array");
  JsonArray *a = json_node_get_array (n);
  for (guint i = 0; i < json_array_get_length (a); i++)
    {
      g_autofree char *path = g_strdup_printf ("added_tokens[%u]", i);
      JsonObject *o = as_object (r, json_array_get_element (a, i), path);
      AddedToken tmpl;
      guint64 id = 0;
      if (o == NULL || !read_added_token (r, o, path, &tmpl, TRUE)
          || !get_u64 (r, o, path, "id", TRUE, &id))
        return FALSE;
      add_token (t, &tmpl, (gint64)MIN (id, (guint64)G_MAXINT64));
    }
  return TRUE;
}

/* ---- post-processor ----------------------------------------------------- */

/* The ids a post-processor puts before (@pre) and after (@post) a single
 * sequence. */
static gboolean
read_post_processor (StowHfTokenizer *t, Reader *r, JsonNode *node,
                     const char *path, GArray *pre, GArray *post)
{
  JsonObject *o = as_object (r, node, path);
  const char *type = o ? component_type (r, o, path) : NULL;
  if (type == NULL)
    return FALSE;
  if (strcmp (type, "Sequence") == 0)
    {
      JsonArray *a;
      if (!get_array (r, o, path, "processors", &a))
        return FALSE;
      /* Each processor wraps what the ones before it made. */
      for (guint i = 0; i < json_array_get_length (a); i++)
        {
          g_autofree char *sub = g_strdup_printf ("%s.processors[%u]", path, i);
          g_autoptr (GArray) p = g_array_new (FALSE, FALSE, sizeof (guint32));
          g_autoptr (GArray) q = g_array_new (FALSE, FALSE, sizeof (guint32));
          if (!read_post_processor (t, r, json_array_get_element (a, i), sub, p,
                                    q))
            return FALSE;
          g_array_prepend_vals (pre, p->data, p->len);
          g_array_append_vals (post, q->data, q->len);
        }
      return TRUE;
    }
  if (strcmp (type, "ByteLevel") == 0)
    return TRUE; /* offsets only */
  if (strcmp (type, "RobertaProcessing") == 0
      || strcmp (type, "BertProcessing") == 0)
    {
      /* "cls": ["<s>", 0], "sep": ["</s>", 2] */
      const char *members[] = { "cls", "sep" };
      for (guint k = 0; k < 2; k++)
        {
          JsonArray *a;
          if (!get_array (r, o, path, members[k], &a))
            return FALSE;
          JsonNode *idn = json_array_get_length (a) == 2
                              ? json_array_get_element (a, 1)
                              : NULL;
          if (idn == NULL || !JSON_NODE_HOLDS_VALUE (idn)
              || json_node_get_value_type (idn) != G_TYPE_INT64
              || json_node_get_int (idn) < 0
              || json_node_get_int (idn) > G_MAXUINT32)
            return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE,
                                        r->name, "%s.%s: expected [token, id]",
                                        path, members[k]);
          guint32 id = (guint32)json_node_get_int (idn);
          g_array_append_val (k == 0 ? pre : post, id);
        }
      return TRUE;
    }
  if (strcmp (type, "TemplateProcessing") != 0)
    return stow_tokenizer_fail (
        r->error, STOW_TOKENIZER_ERROR_UNSUPPORTED, r->name,
        "%s.type \"%s\" is not supported (stowage reads "
        "TemplateProcessing, ByteLevel, RobertaProcessing, "
        "BertProcessing and Sequence)",
        path, type);
  JsonArray *single;
  g_autofree char *spath = g_strdup_printf ("%s.special_tokens", path);
  JsonObject *specials
      = as_object (r, json_object_get_member (o, "special_tokens"), spath);
  if (specials == NULL || !get_array (r, o, path, "single", &single))
    return FALSE;
  gboolean seen_sequence = FALSE;
  for (guint i = 0; i < json_array_get_length (single); i++)
    {
      g_autofree char *ipath = g_strdup_printf ("%s.single[%u]", path, i);
      JsonObject *item
          = as_object (r, json_array_get_element (single, i), ipath);
      if (item == NULL)
        return FALSE;
      if (json_object_has_member (item, "Sequence"))
        {
          seen_sequence = TRUE;
          continue;
        }
      g_autofree char *tpath = g_strdup_printf ("%s.SpecialToken", ipath);
      JsonObject *st
          = as_object (r, json_object_get_member (item, "SpecialToken"), tpath);
      const char *name;
      if (st == NULL || !get_string (r, st, tpath, "id", TRUE, &name))
        return FALSE;
      g_autofree char *kpath = g_strdup_printf ("%s.%s", spath, name);
      JsonObject *sp
          = as_object (r, json_object_get_member (specials, name), kpath);
      JsonArray *ids;
      if (sp == NULL || !get_array (r, sp, kpath, "ids", &ids))
        return FALSE;
      for (guint k = 0; k < json_array_get_length (ids); k++)
        {
          JsonNode *idn = json_array_get_element (ids, k);
          if (!JSON_NODE_HOLDS_VALUE (idn)
              || json_node_get_value_type (idn) != G_TYPE_INT64
              || json_node_get_int (idn) < 0
              || json_node_get_int (idn) > G_MAXUINT32)
            return stow_tokenizer_fail (
                r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                "%s.ids[%u]: expected a token id", kpath, k);
          guint32 id = (guint32)json_node_get_int (idn);
          g_array_append_val (seen_sequence ? post : pre, id);
        }
    }
  return TRUE;
}

/* ---- the whole file ----------------------------------------------------- */

static StowHfTokenizer *
tokenizer_alloc (const char *name)
{
  StowHfTokenizer *t = g_new0 (StowHfTokenizer, 1);
  t->ref_count = 1;
  t->name = g_strdup (name);
  t->added = g_ptr_array_new_with_free_func (added_token_free);
  t->added_by_content = g_hash_table_new (g_str_hash, g_str_equal);
  t->added_by_id = g_hash_table_new (NULL, NULL);
  t->special_strings
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  t->prefix_ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  t->suffix_ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  t->bos_id = t->eos_id = -1;
  g_mutex_init (&t->lock);
  return t;
}

/* Without configs, BOS and EOS are what the post-processor's template
 * puts around a sequence. */
static void
specials_from_template (StowHfTokenizer *t)
{
  if (t->prefix_ids->len > 0)
    {
      t->bos_id = g_array_index (t->prefix_ids, guint32, 0);
      t->adds_bos = TRUE;
    }
  if (t->suffix_ids->len > 0)
    {
      t->eos_id
          = g_array_index (t->suffix_ids, guint32, t->suffix_ids->len - 1);
      t->adds_eos = TRUE;
    }
}

/* A component that may be null. */
static JsonNode *
optional_member (JsonObject *root, const char *member)
{
  JsonNode *n = json_object_get_member (root, member);
  return n == NULL || JSON_NODE_HOLDS_NULL (n) ? NULL : n;
}

/* The largest id + 1 and the matchers: after every added token is in. */
static void
tokenizer_finish (StowHfTokenizer *t)
{
  t->n_ids = stow_bpe_n_ids (t->bpe);
  for (guint i = 0; i < t->added->len; i++)
    {
      AddedToken *a = g_ptr_array_index (t->added, i);
      t->n_ids = MAX (t->n_ids, a->id + 1);
    }
  stow_matcher_clear (&t->raw_matcher);
  stow_matcher_clear (&t->normalized_matcher);
  stow_matcher_build (&t->raw_matcher, t->added, FALSE);
  stow_matcher_build (&t->normalized_matcher, t->added, TRUE);
}

static StowHfTokenizer *
tokenizer_from_root (JsonNode *root, const char *name, GError **error)
{
  Reader r = { .name = name, .error = error };
  JsonObject *o = as_object (&r, root, "the file");
  if (o == NULL)
    return NULL;
  g_autoptr (StowHfTokenizer) t = tokenizer_alloc (name);
  JsonObject *model
      = as_object (&r, json_object_get_member (o, "model"), "model");
  if (model == NULL)
    return NULL;
  t->bpe = stow_bpe_new (model, name, error);
  if (t->bpe == NULL)
    return NULL;

  g_autoptr (GArray) norms = g_array_new (FALSE, TRUE, sizeof (Normalizer));
  g_autoptr (GArray) pres = g_array_new (FALSE, TRUE, sizeof (PreTokenizer));
  g_autoptr (GArray) decs = g_array_new (FALSE, TRUE, sizeof (Decoder));
  JsonNode *n;
  gboolean ok = TRUE;
  if ((n = optional_member (o, "normalizer")))
    ok = read_normalizer (&r, n, "normalizer", norms);
  /* Own what was read so far, whatever happens next. */
  t->n_norms = norms->len;
  t->norms = (Normalizer *)g_array_free (g_steal_pointer (&norms), FALSE);
  if (ok && (n = optional_member (o, "pre_tokenizer")))
    ok = read_pre_tokenizer (&r, n, "pre_tokenizer", pres);
  t->n_pres = pres->len;
  t->pres = (PreTokenizer *)g_array_free (g_steal_pointer (&pres), FALSE);
  if (ok && (n = optional_member (o, "decoder")))
    {
      t->has_decoder = TRUE;
      ok = read_decoder (&r, n, "decoder", decs);
    }
  t->n_decs = decs->len;
  t->decs = (Decoder *)g_array_free (g_steal_pointer (&decs), FALSE);
  if (!ok)
    return NULL;
  t->raw_bytes = t->n_pres > 0 && t->pres[t->n_pres - 1].kind == PRE_BYTE_LEVEL;
  if (!read_added_tokens (t, &r, o))
    return NULL;
  if ((n = optional_member (o, "post_processor"))
      && !read_post_processor (t, &r, n, "post_processor", t->prefix_ids,
                               t->suffix_ids))
    return NULL;
  tokenizer_finish (t);
  return g_steal_pointer (&t);
}

StowHfTokenizer *
stow_hf_tokenizer_new_from_data (const char *json, gssize len, const char *name,
                                 GError **error)
{
  g_return_val_if_fail (json != NULL && name != NULL, NULL);
  g_autoptr (JsonNode) root = stow_json_parse_data_limit (
      json, len, name, TOKENIZER_JSON_MAX_BYTES, error);
  if (root == NULL)
    {
      retag (error);
      return NULL;
    }
  StowHfTokenizer *t = tokenizer_from_root (root, name, error);
  if (t != NULL)
    specials_from_template (t);
  return t;
}

/* ---- a model directory's configs ---------------------------------------- */

/* @path's JSON object, or NULL (no error) when the file does not exist. */
static JsonNode *
read_optional_json (const char *path, gboolean *failed, GError **error)
{
  *failed = FALSE;
  if (!g_file_test (path, G_FILE_TEST_EXISTS))
    return NULL;
  g_autofree char *data = NULL;
  gsize len;
  g_autoptr (GError) local = NULL;
  if (!g_file_get_contents (path, &data, &len, &local))
    {
      g_set_error_literal (error, STOW_TOKENIZER_ERROR, STOW_TOKENIZER_ERROR_IO,
                           local->message);
      *failed = TRUE;
      return NULL;
    }
  JsonNode *root = stow_json_parse_data (data, (gssize)len, path, error);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      if (root != NULL)
        {
          stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, path,
                               "expected a JSON object");
          json_node_unref (root);
        }
      retag (error);
      *failed = TRUE;
      return NULL;
    }
  return root;
}

/* A token in tokenizer_config.json: "<s>", or {"content": "<s>", ...}, or
 * null. */
static gboolean
config_token (Reader *r, JsonObject *cfg, const char *member, const char **out)
{
  *out = NULL;
  JsonNode *n = json_object_get_member (cfg, member);
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    return TRUE;
  if (JSON_NODE_HOLDS_OBJECT (n))
    return get_string (r, json_node_get_object (n), member, "content", TRUE,
                       out);
  return get_string (r, cfg, NULL, member, FALSE, out);
}

/* bos_token_id / eos_token_id of generation_config.json or config.json: an
 * id or a list of ids (the first). */
static gboolean
config_id (Reader *r, JsonObject *cfg, const char *member, gint64 *out)
{
  JsonNode *n = json_object_get_member (cfg, member);
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    return TRUE;
  if (JSON_NODE_HOLDS_ARRAY (n)
      && json_array_get_length (json_node_get_array (n)) > 0)
    n = json_array_get_element (json_node_get_array (n), 0);
  if (!JSON_NODE_HOLDS_VALUE (n) || json_node_get_value_type (n) != G_TYPE_INT64
      || json_node_get_int (n) < 0 || json_node_get_int (n) > G_MAXUINT32)
    return stow_tokenizer_fail (r->error, STOW_TOKENIZER_ERROR_PARSE, r->name,
                                "%s: expected a token id or a list of them",
                                member);
  *out = json_node_get_int (n);
  return TRUE;
}

static gint
compare_i64 (gconstpointer a, gconstpointer b)
{
  gint64 x = *(const gint64 *)a, y = *(const gint64 *)b;
  return x < y ? -1 : x > y;
}

static gboolean
array_has (GArray *a, gint64 id)
{
  for (guint i = 0; i < a->len; i++)
    if (g_array_index (a, guint32, i) == id)
      return TRUE;
  return FALSE;
}

/* tokenizer_config.json: added tokens, BOS/EOS and whether they are added;
 * then generation_config.json and config.json for ids it leaves unset. */
static gboolean
read_configs (StowHfTokenizer *t, const char *dir, GError **error)
{
  g_autofree char *tc_path
      = g_build_filename (dir, "tokenizer_config.json", NULL);
  g_autofree char *gc_path
      = g_build_filename (dir, "generation_config.json", NULL);
  g_autofree char *mc_path = g_build_filename (dir, "config.json", NULL);
  gboolean failed;
  g_autoptr (JsonNode) tc = read_optional_json (tc_path, &failed, error);
  if (failed)
    return FALSE;
  g_autoptr (JsonNode) gc = read_optional_json (gc_path, &failed, error);
  if (failed)
    return FALSE;
  g_autoptr (JsonNode) mc = read_optional_json (mc_path, &failed, error);
  if (failed)
    return FALSE;

  gboolean add_bos_set = FALSE, add_eos_set = FALSE;
  gboolean add_bos = FALSE, add_eos = FALSE;
  const char *bos = NULL, *eos = NULL;
  if (tc != NULL)
    {
      Reader r = { .name = tc_path, .error = error };
      JsonObject *o = json_node_get_object (tc);
      JsonNode *atd = optional_member (o, "added_tokens_decoder");
      if (atd != NULL)
        {
          JsonObject *ao = as_object (&r, atd, "added_tokens_decoder");
          if (ao == NULL)
            return FALSE;
          /* In id order, as transformers adds them. */
          g_autoptr (GList) keys = json_object_get_members (ao);
          g_autoptr (GArray) order
              = g_array_new (FALSE, FALSE, sizeof (gint64));
          for (GList *l = keys; l; l = l->next)
            {
              char *end;
              gint64 id = g_ascii_strtoll (l->data, &end, 10);
              if (*(const char *)l->data == '\0' || *end != '\0' || id < 0)
                return stow_tokenizer_fail (
                    error, STOW_TOKENIZER_ERROR_PARSE, tc_path,
                    "added_tokens_decoder: \"%s\" is not a token id",
                    (const char *)l->data);
              g_array_append_val (order, id);
            }
          g_array_sort (order, compare_i64);
          for (guint i = 0; i < order->len; i++)
            {
              gint64 id = g_array_index (order, gint64, i);
              char key[32];
              g_snprintf (key, sizeof key, "%" G_GINT64_FORMAT, id);
              g_autofree char *path
                  = g_strdup_printf ("added_tokens_decoder.%s", key);
              JsonObject *to
                  = as_object (&r, json_object_get_member (ao, key), path);
              AddedToken tmpl;
              if (to == NULL || !read_added_token (&r, to, path, &tmpl, TRUE))
                return FALSE;
              if (!g_hash_table_contains (t->added_by_content, tmpl.content))
                add_token (t, &tmpl, id);
            }
        }
      if (!config_token (&r, o, "bos_token", &bos)
          || !config_token (&r, o, "eos_token", &eos))
        return FALSE;
      add_bos_set = stow_json_has (o, "add_bos_token");
      add_eos_set = stow_json_has (o, "add_eos_token");
      if (!get_bool (&r, o, NULL, "add_bos_token", &add_bos)
          || !get_bool (&r, o, NULL, "add_eos_token", &add_eos))
        return FALSE;
      if (bos != NULL && (t->bos_id = token_id (t, bos)) < 0)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, tc_path,
            "bos_token \"%s\" is neither an added token nor in the "
            "vocabulary",
            bos);
      if (eos != NULL && (t->eos_id = token_id (t, eos)) < 0)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, tc_path,
            "eos_token \"%s\" is neither an added token nor in the "
            "vocabulary",
            eos);
    }
  for (guint k = 0; k < 2; k++)
    {
      JsonNode *cfg = k == 0 ? gc : mc;
      Reader r = { .name = k == 0 ? gc_path : mc_path, .error = error };
      if (cfg == NULL)
        continue;
      JsonObject *o = json_node_get_object (cfg);
      if ((t->bos_id < 0 && !config_id (&r, o, "bos_token_id", &t->bos_id))
          || (t->eos_id < 0 && !config_id (&r, o, "eos_token_id", &t->eos_id)))
        return FALSE;
    }
  tokenizer_finish (t);
  t->adds_bos = add_bos_set
                    ? add_bos
                    : t->bos_id >= 0 && array_has (t->prefix_ids, t->bos_id);
  t->adds_eos = add_eos_set
                    ? add_eos
                    : t->eos_id >= 0 && array_has (t->suffix_ids, t->eos_id);
  if (t->adds_bos && t->bos_id < 0)
    return stow_tokenizer_fail (
        error, STOW_TOKENIZER_ERROR_PARSE, tc_path,
        "add_bos_token is true but no bos_token is named");
  if (t->adds_eos && t->eos_id < 0)
    return stow_tokenizer_fail (
        error, STOW_TOKENIZER_ERROR_PARSE, tc_path,
        "add_eos_token is true but no eos_token is named");
  return TRUE;
}

StowHfTokenizer *
stow_hf_tokenizer_new_from_path (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  gboolean is_dir = g_file_test (path, G_FILE_TEST_IS_DIR);
  g_autofree char *file = is_dir
                              ? g_build_filename (path, "tokenizer.json", NULL)
                              : g_strdup (path);
  g_autofree char *data = NULL;
  gsize len;
  g_autoptr (GError) local = NULL;
  if (!g_file_get_contents (file, &data, &len, &local))
    {
      g_set_error (error, STOW_TOKENIZER_ERROR, STOW_TOKENIZER_ERROR_IO,
                   "%s: %s%s", file, local->message,
                   is_dir ? " (a model directory holds its tokenizer.json)"
                          : "");
      return NULL;
    }
  g_autoptr (JsonNode) root = stow_json_parse_data_limit (
      data, (gssize)len, file, TOKENIZER_JSON_MAX_BYTES, error);
  if (root == NULL)
    {
      retag (error);
      return NULL;
    }
  g_clear_pointer (&data, g_free);
  g_autoptr (StowHfTokenizer) t = tokenizer_from_root (root, file, error);
  if (t == NULL)
    return NULL;
  g_autofree char *base = g_path_get_basename (file);
  if (is_dir || strcmp (base, "tokenizer.json") == 0)
    {
      g_autofree char *dir
          = is_dir ? g_strdup (path) : g_path_get_dirname (file);
      if (!read_configs (t, dir, error))
        return NULL;
    }
  else
    specials_from_template (t);
  return g_steal_pointer (&t);
}

StowHfTokenizer *
stow_hf_tokenizer_ref (StowHfTokenizer *t)
{
  g_return_val_if_fail (t != NULL, NULL);
  g_atomic_int_inc (&t->ref_count);
  return t;
}

void
stow_hf_tokenizer_unref (StowHfTokenizer *t)
{
  if (t == NULL || !g_atomic_int_dec_and_test (&t->ref_count))
    return;
  if (t->shared)
    stow_hf_encoder_free (t->shared);
  g_mutex_clear (&t->lock);
  for (guint i = 0; i < t->n_norms; i++)
    {
      g_free (t->norms[i].text);
      pattern_clear (&t->norms[i].pattern);
    }
  g_free (t->norms);
  for (guint i = 0; i < t->n_pres; i++)
    pattern_clear (&t->pres[i].pattern);
  g_free (t->pres);
  for (guint i = 0; i < t->n_decs; i++)
    {
      g_free (t->decs[i].text);
      pattern_clear (&t->decs[i].pattern);
    }
  g_free (t->decs);
  stow_matcher_clear (&t->raw_matcher);
  stow_matcher_clear (&t->normalized_matcher);
  g_hash_table_unref (t->added_by_content);
  g_hash_table_unref (t->added_by_id);
  g_hash_table_unref (t->special_strings);
  g_ptr_array_unref (t->added);
  g_array_unref (t->prefix_ids);
  g_array_unref (t->suffix_ids);
  stow_bpe_free (t->bpe);
  g_free (t->name);
  g_free (t);
}

const char *
stow_hf_tokenizer_name (const StowHfTokenizer *t)
{
  return t->name;
}

guint32
stow_hf_tokenizer_n_ids (const StowHfTokenizer *t)
{
  return t->n_ids;
}

gint64
stow_hf_tokenizer_token_to_id (const StowHfTokenizer *t, const char *token)
{
  g_return_val_if_fail (t != NULL && token != NULL, -1);
  return token_id (t, token);
}

const char *
stow_hf_tokenizer_id_to_token (const StowHfTokenizer *t, guint32 id)
{
  AddedToken *a = g_hash_table_lookup (t->added_by_id, GUINT_TO_POINTER (id));
  if (a != NULL)
    return a->content;
  return stow_bpe_id_to_token (t->bpe, id, NULL);
}

gboolean
stow_hf_tokenizer_is_special (const StowHfTokenizer *t, guint32 id)
{
  AddedToken *a = g_hash_table_lookup (t->added_by_id, GUINT_TO_POINTER (id));
  return a != NULL && a->special;
}

gint64
stow_hf_tokenizer_bos_id (const StowHfTokenizer *t)
{
  return t->bos_id;
}

gint64
stow_hf_tokenizer_eos_id (const StowHfTokenizer *t)
{
  return t->eos_id;
}

gboolean
stow_hf_tokenizer_adds_bos (const StowHfTokenizer *t)
{
  return t->adds_bos;
}

gboolean
stow_hf_tokenizer_adds_eos (const StowHfTokenizer *t)
{
  return t->adds_eos;
}
