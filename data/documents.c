/* SPDX-License-Identifier: MIT
 *
 * data/documents.c: records of a file and the documents in them (see
 * documents.h).  JSON lines go through core/json's reader, which bounds
 * their nesting before json-glib (which recurses) sees them.
 */
#include "data/documents.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "data/tokenizer.h"

/* clang-format off */
G_DEFINE_QUARK (stow-docs-error-quark, stow_docs_error)
/* clang-format on */

void
stow_document_clear (StowDocument *d)
{
  g_clear_pointer (&d->holder, json_node_unref);
  memset (d, 0, sizeof *d);
}

/* "path:line", or "path" for a whole file: made only for a message. */
static char *
where_of (const char *path, guint64 line)
{
  return line ? g_strdup_printf ("%s:%" G_GUINT64_FORMAT, path, line)
              : g_strdup (path);
}

static gboolean G_GNUC_PRINTF (5, 6)
    fail (GError **error, StowDocsError code, const char *path, guint64 line,
          const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_autofree char *where = where_of (path, line);
  g_set_error (error, STOW_DOCS_ERROR, code, "%s: %s", where, what);
  return FALSE;
}

static gboolean
check_utf8 (const char *s, gsize len, const char *path, guint64 line,
            const char *what, GError **error)
{
  gsize ok = stow_utf8_valid_up_to (s, len);
  if (ok == len)
    return TRUE;
  return fail (error, STOW_DOCS_ERROR_INVALID, path, line,
               "%s is not UTF-8: byte %" G_GSIZE_FORMAT " (0x%02x) begins "
               "no valid character",
               what, ok, (guint8)s[ok]);
}

/* The JSON object of a record. */
static JsonNode *
parse_object (const char *record, gsize len, const char *path, guint64 line,
              GError **error)
{
  static const char name[] = "<record>";
  g_autoptr (GError) local = NULL;
  JsonNode *root = stow_json_parse_data (record, (gssize)len, name, &local);
  if (root == NULL)
    {
      /* core/json names "<record>:LINE:COL" within the record, which is
       * one line: say the column. */
      const char *msg = local->message;
      if (g_str_has_prefix (msg, name))
        msg += strlen (name);
      if (g_str_has_prefix (msg, ":1:"))
        fail (error, STOW_DOCS_ERROR_INVALID, path, line, "not JSON: column %s",
              msg + 3);
      else
        fail (error, STOW_DOCS_ERROR_INVALID, path, line, "not JSON%s", msg);
      return NULL;
    }
  if (!JSON_NODE_HOLDS_OBJECT (root))
    {
      fail (error, STOW_DOCS_ERROR_INVALID, path, line,
            "expected a JSON object, one per line");
      json_node_unref (root);
      return NULL;
    }
  return root;
}

/* The string member @name of @o (borrowed from it). */
static gboolean
string_field (JsonObject *o, const char *name, const char *path, guint64 line,
              const char **out, gsize *out_len, GError **error)
{
  JsonNode *n = json_object_get_member (o, name);
  if (n == NULL)
    return fail (error, STOW_DOCS_ERROR_INVALID, path, line, "no \"%s\" field",
                 name);
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_STRING)
    {
      g_autofree char *desc = stow_json_describe (n);
      return fail (error, STOW_DOCS_ERROR_INVALID, path, line,
                   "\"%s\" is %s, not a string", name, desc);
    }
  *out = json_node_get_string (n);
  *out_len = strlen (*out);
  return TRUE;
}

gboolean
stow_document_parse (StowDocKind kind, const StowDocFields *fields,
                     const char *record, gsize len, const char *path,
                     guint64 line, StowDocument *out, GError **error)
{
  memset (out, 0, sizeof *out);
  if (!check_utf8 (record, len, path, line,
                   kind == STOW_DOC_TEXT ? "the text" : "the line", error))
    return FALSE;
  if (kind == STOW_DOC_TEXT)
    {
      if (len == 0)
        return fail (error, STOW_DOCS_ERROR_EMPTY, path, line,
                     "an empty document");
      out->text = record;
      out->text_len = len;
      return TRUE;
    }
  out->holder = parse_object (record, len, path, line, error);
  if (out->holder == NULL)
    return FALSE;
  JsonObject *o = json_node_get_object (out->holder);
  const char *field
      = kind == STOW_DOC_JSONL_SFT ? fields->completion : fields->text;
  if ((kind == STOW_DOC_JSONL_SFT
       && !string_field (o, fields->prompt, path, line, &out->prompt,
                         &out->prompt_len, error))
      || !string_field (o, field, path, line, &out->text, &out->text_len,
                        error))
    {
      stow_document_clear (out);
      return FALSE;
    }
  if (out->text_len == 0)
    {
      stow_document_clear (out);
      return fail (error, STOW_DOCS_ERROR_EMPTY, path, line, "\"%s\" is empty",
                   field);
    }
  return TRUE;
}

/* ---- records ------------------------------------------------------------ */

struct _StowRecordReader
{
  char *path;
  FILE *f;
  gboolean whole, whole_done;
  char *line;
  size_t cap;
  char *contents; /* the whole file */
  guint64 line_no, offset;
};

StowRecordReader *
stow_record_reader_open (const char *path, gboolean whole, GError **error)
{
  FILE *f = g_fopen (path, "rb");
  if (f == NULL)
    {
      int err = errno;
      g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_IO, "%s: %s", path,
                   g_strerror (err));
      return NULL;
    }
  StowRecordReader *r = g_new0 (StowRecordReader, 1);
  r->path = g_strdup (path);
  r->f = f;
  r->whole = whole;
  return r;
}

gboolean
stow_record_reader_next (StowRecordReader *r, const char **record, gsize *len,
                         guint64 *line, GError **error)
{
  if (r->whole)
    {
      if (r->whole_done)
        return FALSE;
      r->whole_done = TRUE;
      GString *all = g_string_new (NULL);
      char buf[65536];
      size_t n;
      while ((n = fread (buf, 1, sizeof buf, r->f)) > 0)
        g_string_append_len (all, buf, (gssize)n);
      if (ferror (r->f))
        {
          int err = errno;
          g_string_free (all, TRUE);
          g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_IO, "%s: %s",
                       r->path, g_strerror (err));
          return FALSE;
        }
      r->offset = all->len;
      *len = all->len;
      r->contents = g_string_free (all, FALSE);
      *record = r->contents;
      *line = 0;
      return TRUE;
    }
  for (;;)
    {
      errno = 0;
      ssize_t n = getline (&r->line, &r->cap, r->f);
      if (n < 0)
        {
          if (ferror (r->f))
            {
              int err = errno;
              g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_IO, "%s: %s",
                           r->path, g_strerror (err));
            }
          return FALSE;
        }
      r->offset += (guint64)n;
      r->line_no++;
      gsize l = (gsize)n;
      if (l > 0 && r->line[l - 1] == '\n')
        l--;
      if (l > 0 && r->line[l - 1] == '\r')
        l--;
      if (l == 0)
        continue;
      *record = r->line;
      *len = l;
      *line = r->line_no;
      return TRUE;
    }
}

char *
stow_record_reader_steal (StowRecordReader *r)
{
  return g_steal_pointer (&r->contents);
}

guint64
stow_record_reader_offset (const StowRecordReader *r)
{
  return r->offset;
}

void
stow_record_reader_free (StowRecordReader *r)
{
  if (r == NULL)
    return;
  if (r->f)
    fclose (r->f);
  free (r->line);
  g_free (r->contents);
  g_free (r->path);
  g_free (r);
}

gboolean
stow_jsonl_detect (const char *path, const StowDocFields *fields,
                   StowDocKind *out, GError **error)
{
  g_autoptr (StowRecordReader) r = stow_record_reader_open (path, FALSE, error);
  if (r == NULL)
    return FALSE;
  const char *rec;
  gsize len;
  guint64 line;
  if (!stow_record_reader_next (r, &rec, &len, &line, error))
    {
      if (error && *error == NULL)
        g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_EMPTY,
                     "%s: no record: an empty file", path);
      return FALSE;
    }
  if (!check_utf8 (rec, len, path, line, "the line", error))
    return FALSE;
  g_autoptr (JsonNode) root = parse_object (rec, len, path, line, error);
  if (root == NULL)
    return FALSE;
  JsonObject *o = json_node_get_object (root);
  *out = json_object_has_member (o, fields->prompt)
                 && json_object_has_member (o, fields->completion)
             ? STOW_DOC_JSONL_SFT
             : STOW_DOC_JSONL_TEXT;
  return TRUE;
}
