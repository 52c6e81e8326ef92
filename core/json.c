/* SPDX-License-Identifier: MIT
 *
 * core/json.c: bounded JSON input, typed getters with named members, and
 * atomic output.
 */
#include "core/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* An integer literal of @len digits (no sign) is within a gint64: at most
 * 9223372036854775807, or ...808 when negative. */
static gboolean
integer_fits (const char *digits, gsize len, gboolean negative)
{
  static const char max[] = "9223372036854775807";
  while (len > 1 && digits[0] == '0')
    digits++, len--;
  if (len != sizeof max - 1)
    return len < sizeof max - 1;
  int c = memcmp (digits, max, len);
  return c <= 0
         || (negative && memcmp (digits, "9223372036854775808", len) == 0);
}

/* One pass over the text before json-glib sees it: the nesting depth (its
 * parser recurses per level and a deep input overflows the stack) and the
 * range of integer literals (it reads 2^64 as -1).  Strings are skipped
 * with their escapes; anything else malformed is left for json-glib to
 * report. */
static gboolean
prescan (const char *data, gsize len, const char *name, GError **error)
{
  guint depth = 0;
  gsize line = 1, line_start = 0;
  for (gsize i = 0; i < len; i++)
    {
      char ch = data[i];
      if (ch == '\n')
        line++, line_start = i + 1;
      else if (ch == '"')
        {
          for (i++; i < len && data[i] != '"'; i++)
            if (data[i] == '\\')
              i++;
            else if (data[i] == '\n')
              line++, line_start = i + 1;
        }
      else if (ch == '[' || ch == '{')
        {
          if (++depth > STOW_JSON_MAX_DEPTH)
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                           "%s:%" G_GSIZE_FORMAT ":%" G_GSIZE_FORMAT
                           ": nested deeper than %d arrays and objects (the "
                           "limit)",
                           name, line, i - line_start + 1, STOW_JSON_MAX_DEPTH);
              return FALSE;
            }
        }
      else if (ch == ']' || ch == '}')
        depth = depth ? depth - 1 : 0;
      else if (ch == '-' || g_ascii_isdigit (ch))
        {
          gsize start = i, d0 = ch == '-' ? i + 1 : i, j = d0;
          while (j < len && g_ascii_isdigit (data[j]))
            j++;
          gboolean integer
              = j >= len
                || (data[j] != '.' && data[j] != 'e' && data[j] != 'E');
          if (integer && j > d0 && !integer_fits (data + d0, j - d0, ch == '-'))
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                           "%s:%" G_GSIZE_FORMAT ":%" G_GSIZE_FORMAT
                           ": the integer %.*s is out of range (64-bit "
                           "integers run from -9223372036854775808 to "
                           "9223372036854775807)",
                           name, line, start - line_start + 1,
                           (int)MIN (j - start, 40), data + start);
              return FALSE;
            }
          /* the rest of a number (fraction, exponent) holds no brackets */
          while (j < len
                 && (g_ascii_isalnum (data[j]) || data[j] == '.'
                     || data[j] == '+' || data[j] == '-'))
            j++;
          i = j - 1;
        }
    }
  return TRUE;
}

JsonNode *
stow_json_parse_data (const char *data, gssize len, const char *name,
                      GError **error)
{
  return stow_json_parse_data_limit (data, len, name, STOW_JSON_MAX_BYTES,
                                     error);
}

JsonNode *
stow_json_parse_data_limit (const char *data, gssize len, const char *name,
                            gsize max_bytes, GError **error)
{
  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  g_autoptr (GError) local = NULL;
  g_return_val_if_fail (data != NULL, NULL);
  if (len < 0)
    len = (gssize)strlen (data);
  if (len == 0)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                   "%s: empty input, expected JSON", name);
      return NULL;
    }
  if ((gsize)len > max_bytes)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_TOO_LARGE,
                   "%s: %" G_GSIZE_FORMAT " bytes of JSON, over the limit of "
                   "%" G_GSIZE_FORMAT " bytes",
                   name, (gsize)len, max_bytes);
      return NULL;
    }
  if (!prescan (data, (gsize)len, name, error))
    return NULL;
  if (!json_parser_load_from_data (parser, data, len, &local))
    {
      /* json-glib says "<data>:LINE:COL: Parse error: ..."; name the file. */
      const char *msg = local->message;
      if (g_str_has_prefix (msg, "<data>"))
        msg += strlen ("<data>");
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON, "%s%s%s", name,
                   msg[0] == ':' ? "" : ": ", msg);
      return NULL;
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                   "%s: empty input, expected JSON", name);
      return NULL;
    }
  return json_node_copy (root);
}

JsonNode *
stow_json_parse_file (const char *path, gsize max_bytes, GError **error)
{
  struct stat st;
  g_autofree char *data = NULL;
  gsize got = 0;
  int fd;

  g_return_val_if_fail (path != NULL, NULL);
  fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    {
      int e = errno;
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO, "%s: %s", path,
                   g_strerror (e));
      return NULL;
    }
  if (fstat (fd, &st) != 0 || !S_ISREG (st.st_mode))
    {
      close (fd);
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
                   "%s: not a regular file", path);
      return NULL;
    }
  if ((guint64)st.st_size > max_bytes)
    {
      close (fd);
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_TOO_LARGE,
                   "%s: file is %" G_GUINT64_FORMAT
                   " bytes, over the limit of %" G_GSIZE_FORMAT " bytes",
                   path, (guint64)st.st_size, max_bytes);
      return NULL;
    }
  /* Read at most max_bytes + 1 so a file that grows meanwhile is caught. */
  data = g_malloc ((gsize)st.st_size + 2);
  while (got <= (gsize)st.st_size)
    {
      ssize_t n = read (fd, data + got, (gsize)st.st_size + 1 - got);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        {
          int e = errno;
          close (fd);
          g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO, "%s: %s",
                       path, g_strerror (e));
          return NULL;
        }
      if (n == 0)
        break;
      got += (gsize)n;
    }
  close (fd);
  if (got > max_bytes)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_TOO_LARGE,
                   "%s: file is over the limit of %" G_GSIZE_FORMAT " bytes",
                   path, max_bytes);
      return NULL;
    }
  data[got] = '\0';
  return stow_json_parse_data (data, (gssize)got, path, error);
}

JsonObject *
stow_json_root_object (JsonNode *root, const char *name, GError **error)
{
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      g_autofree char *desc = root ? stow_json_describe (root) : NULL;
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                   "%s: expected a JSON object at the top, got %s", name,
                   desc ? desc : "nothing");
      return NULL;
    }
  return json_node_get_object (root);
}

gboolean
stow_json_has (JsonObject *obj, const char *member)
{
  JsonNode *n = json_object_get_member (obj, member);
  return n != NULL && !JSON_NODE_HOLDS_NULL (n);
}

char *
stow_json_describe (JsonNode *node)
{
  switch (json_node_get_node_type (node))
    {
    case JSON_NODE_OBJECT:
      return g_strdup ("an object");
    case JSON_NODE_ARRAY:
      return g_strdup ("an array");
    case JSON_NODE_NULL:
      return g_strdup ("null");
    case JSON_NODE_VALUE:
      break;
    }
  GType t = json_node_get_value_type (node);
  if (t == G_TYPE_STRING)
    {
      const char *s = json_node_get_string (node);
      g_autofree char *esc = g_strescape (s, NULL);
      if (strlen (esc) > 40)
        return g_strdup_printf ("string \"%.40s...\"", esc);
      return g_strdup_printf ("string \"%s\"", esc);
    }
  if (t == G_TYPE_BOOLEAN)
    return g_strdup_printf ("boolean %s",
                            json_node_get_boolean (node) ? "true" : "false");
  if (t == G_TYPE_INT64)
    return g_strdup_printf ("number %" G_GINT64_FORMAT,
                            json_node_get_int (node));
  if (t == G_TYPE_DOUBLE)
    return g_strdup_printf ("number %g", json_node_get_double (node));
  return g_strdup ("a value");
}

/* Looks up a member: FALSE with an error when required and absent, FALSE
 * without an error when optional and absent, TRUE with *node otherwise. */
static gboolean
lookup (JsonObject *obj, const char *where, const char *member,
        gboolean required, JsonNode **node, GError **error)
{
  JsonNode *n = json_object_get_member (obj, member);
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    {
      if (required)
        g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_MISSING,
                     "%s: %s: required field is missing", where, member);
      *node = NULL;
      return FALSE;
    }
  *node = n;
  return TRUE;
}

static gboolean
wrong_type (JsonNode *n, const char *where, const char *member,
            const char *expected, GError **error)
{
  g_autofree char *desc = stow_json_describe (n);
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
               "%s: %s: expected %s, got %s", where, member, expected, desc);
  return FALSE;
}

static gboolean
holds_number (JsonNode *n)
{
  if (!JSON_NODE_HOLDS_VALUE (n))
    return FALSE;
  GType t = json_node_get_value_type (n);
  return t == G_TYPE_INT64 || t == G_TYPE_DOUBLE;
}

gboolean
stow_json_get_i64 (JsonObject *obj, const char *where, const char *member,
                   gboolean required, gint64 *out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!holds_number (n))
    return wrong_type (n, where, member, "an integer", error);
  if (json_node_get_value_type (n) == G_TYPE_DOUBLE)
    {
      double d = json_node_get_double (n);
      /* 2^63 itself does not fit a gint64. */
      if (!isfinite (d) || floor (d) != d || d < -9223372036854775808.0
          || d >= 9223372036854775808.0)
        return wrong_type (n, where, member, "an integer", error);
      *out = (gint64)d;
      return TRUE;
    }
  *out = json_node_get_int (n);
  return TRUE;
}

gboolean
stow_json_get_u64 (JsonObject *obj, const char *where, const char *member,
                   gboolean required, guint64 *out, GError **error)
{
  JsonNode *n;
  gint64 v;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!holds_number (n))
    return wrong_type (n, where, member, "a non-negative integer", error);
  if (json_node_get_value_type (n) == G_TYPE_DOUBLE)
    {
      double d = json_node_get_double (n);
      if (!isfinite (d) || floor (d) != d || d < 0.0
          || d >= 18446744073709551616.0)
        return wrong_type (n, where, member, "a non-negative integer", error);
      *out = (guint64)d;
      return TRUE;
    }
  v = json_node_get_int (n);
  if (v < 0)
    return wrong_type (n, where, member, "a non-negative integer", error);
  *out = (guint64)v;
  return TRUE;
}

gboolean
stow_json_get_double (JsonObject *obj, const char *where, const char *member,
                      gboolean required, double *out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!holds_number (n))
    return wrong_type (n, where, member, "a number", error);
  *out = json_node_get_double (n);
  if (!isfinite (*out))
    return wrong_type (n, where, member, "a finite number", error);
  return TRUE;
}

gboolean
stow_json_get_bool (JsonObject *obj, const char *where, const char *member,
                    gboolean required, gboolean *out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_BOOLEAN)
    return wrong_type (n, where, member, "true or false", error);
  *out = json_node_get_boolean (n);
  return TRUE;
}

gboolean
stow_json_get_string (JsonObject *obj, const char *where, const char *member,
                      gboolean required, const char **out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_STRING)
    return wrong_type (n, where, member, "a string", error);
  *out = json_node_get_string (n);
  return TRUE;
}

gboolean
stow_json_get_object (JsonObject *obj, const char *where, const char *member,
                      gboolean required, JsonObject **out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!JSON_NODE_HOLDS_OBJECT (n))
    return wrong_type (n, where, member, "an object", error);
  *out = json_node_get_object (n);
  return TRUE;
}

gboolean
stow_json_get_array (JsonObject *obj, const char *where, const char *member,
                     gboolean required, JsonArray **out, GError **error)
{
  JsonNode *n;
  if (!lookup (obj, where, member, required, &n, error))
    return !required;
  if (!JSON_NODE_HOLDS_ARRAY (n))
    return wrong_type (n, where, member, "an array", error);
  *out = json_node_get_array (n);
  return TRUE;
}

void
stow_json_set_u64 (JsonBuilder *b, const char *member, guint64 v)
{
  json_builder_set_member_name (b, member);
  json_builder_add_int_value (b, (gint64)MIN (v, (guint64)G_MAXINT64));
}

void
stow_json_set_i64 (JsonBuilder *b, const char *member, gint64 v)
{
  json_builder_set_member_name (b, member);
  json_builder_add_int_value (b, v);
}

void
stow_json_set_double (JsonBuilder *b, const char *member, double v)
{
  json_builder_set_member_name (b, member);
  json_builder_add_double_value (b, v);
}

void
stow_json_set_bool (JsonBuilder *b, const char *member, gboolean v)
{
  json_builder_set_member_name (b, member);
  json_builder_add_boolean_value (b, v);
}

void
stow_json_set_string (JsonBuilder *b, const char *member, const char *v)
{
  json_builder_set_member_name (b, member);
  if (v)
    json_builder_add_string_value (b, v);
  else
    json_builder_add_null_value (b);
}

/* ---- writing ---- */

/* A JSON string: the escapes json-glib writes (\" \\ \b \f \n \r \t,
 * \u00XX for other control characters and DEL), and U+FFFD for each byte
 * that is not UTF-8 (a path from the command line need not be), since
 * JSON text is UTF-8. */
static void
write_string (GString *out, const char *s)
{
  g_string_append_c (out, '"');
  const char *p = s;
  while (*p)
    {
      /* the valid run from p, then one replacement for the bad byte */
      const char *stop = NULL;
      g_utf8_validate (p, -1, &stop);
      for (const char *q = p; q < stop; q++)
        {
          unsigned char c = (unsigned char)*q;
          switch (c)
            {
            case '"':
              g_string_append (out, "\\\"");
              break;
            case '\\':
              g_string_append (out, "\\\\");
              break;
            case '\b':
              g_string_append (out, "\\b");
              break;
            case '\f':
              g_string_append (out, "\\f");
              break;
            case '\n':
              g_string_append (out, "\\n");
              break;
            case '\r':
              g_string_append (out, "\\r");
              break;
            case '\t':
              g_string_append (out, "\\t");
              break;
            default:
              if (c < 0x20 || c == 0x7f)
                g_string_append_printf (out, "\\u%04x", c);
              else
                g_string_append_c (out, (char)c);
            }
        }
      p = stop;
      if (*p)
        {
          g_string_append (out, "\\ufffd");
          p++;
        }
    }
  g_string_append_c (out, '"');
}

/* A number JSON can carry: 17 significant digits as json-glib writes them,
 * ".0" after an integral value so that it reads back as a double, and null
 * for NaN and the infinities, which JSON has no words for (json-glib would
 * write "-nan.0", "inf.0" and "1e+42.0"). */
static void
write_double (GString *out, double d)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  if (!isfinite (d))
    {
      g_string_append (out, "null");
      return;
    }
  g_ascii_dtostr (buf, sizeof buf, d);
  g_string_append (out, buf);
  if (strpbrk (buf, ".eE") == NULL)
    g_string_append (out, ".0");
}

static void
write_indent (GString *out, gboolean pretty, guint level)
{
  if (!pretty)
    return;
  g_string_append_c (out, '\n');
  for (guint i = 0; i < level; i++)
    g_string_append (out, "  ");
}

static void
write_node (GString *out, JsonNode *node, gboolean pretty, guint level)
{
  switch (json_node_get_node_type (node))
    {
    case JSON_NODE_NULL:
      g_string_append (out, "null");
      return;
    case JSON_NODE_OBJECT:
      {
        JsonObject *o = json_node_get_object (node);
        g_autoptr (GList) names = json_object_get_members (o);
        if (names == NULL)
          {
            g_string_append (out, "{}");
            return;
          }
        g_string_append_c (out, '{');
        for (GList *l = names; l; l = l->next)
          {
            write_indent (out, pretty, level + 1);
            write_string (out, l->data);
            g_string_append (out, pretty ? " : " : ":");
            write_node (out, json_object_get_member (o, l->data), pretty,
                        level + 1);
            if (l->next)
              g_string_append_c (out, ',');
          }
        write_indent (out, pretty, level);
        g_string_append_c (out, '}');
        return;
      }
    case JSON_NODE_ARRAY:
      {
        JsonArray *a = json_node_get_array (node);
        guint n = json_array_get_length (a);
        if (n == 0)
          {
            g_string_append (out, "[]");
            return;
          }
        g_string_append_c (out, '[');
        for (guint i = 0; i < n; i++)
          {
            write_indent (out, pretty, level + 1);
            write_node (out, json_array_get_element (a, i), pretty, level + 1);
            if (i + 1 < n)
              g_string_append_c (out, ',');
          }
        write_indent (out, pretty, level);
        g_string_append_c (out, ']');
        return;
      }
    case JSON_NODE_VALUE:
      break;
    }
  GType t = json_node_get_value_type (node);
  if (t == G_TYPE_INT64)
    g_string_append_printf (out, "%" G_GINT64_FORMAT, json_node_get_int (node));
  else if (t == G_TYPE_DOUBLE)
    write_double (out, json_node_get_double (node));
  else if (t == G_TYPE_BOOLEAN)
    g_string_append (out, json_node_get_boolean (node) ? "true" : "false");
  else if (t == G_TYPE_STRING)
    write_string (out, json_node_get_string (node));
  else
    g_string_append (out, "null");
}

char *
stow_json_to_string (JsonNode *node, gboolean pretty)
{
  g_return_val_if_fail (node != NULL, NULL);
  /* Our own writer, not json-glib's: json-glib 1.6 writes NaN as "-nan.0",
   * 1e42 as "1e+42.0", U+001F and bytes that are not UTF-8 unescaped, none
   * of which parses.  The layout is json-glib's, so files stay as they
   * were. */
  GString *out = g_string_new (NULL);
  write_node (out, node, pretty, 0);
  if (pretty)
    g_string_append_c (out, '\n');
  return g_string_free (out, FALSE);
}

/* ---- output files ---- */

static gboolean
io_error (GError **error, const char *path, const char *what, int err)
{
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO, "%s: %s%s%s", path,
               what ? what : "", what ? ": " : "", g_strerror (err));
  return FALSE;
}

/* write(2) until done; 0 or an errno. */
static int
write_all (int fd, const char *data, gsize len)
{
  while (len > 0)
    {
      ssize_t n = write (fd, data, MIN (len, (gsize)1 << 30));
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return errno;
      data += n, len -= (gsize)n;
    }
  return 0;
}

/* A device or FIFO: opened and written in place, since there is nothing to
 * replace (a terminal, /dev/null, a pipe behind /dev/stdout). */
static gboolean
write_through (const char *path, const char *data, gsize len, GError **error)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return io_error (error, path, "cannot open", errno);
  int e = write_all (fd, data, len);
  if (close (fd) != 0 && e == 0 && errno != EINTR)
    e = errno;
  return e ? io_error (error, path, "cannot write", e) : TRUE;
}

/* A regular file at @target (which @shown names to the user): a temporary
 * beside it, fsync, rename over it; an existing file keeps its mode. */
static gboolean
replace_file (const char *target, const char *shown, const char *data,
              gsize len, GError **error)
{
  struct stat st;
  gboolean exists = stat (target, &st) == 0;
  g_autofree char *dir = g_path_get_dirname (target);
  g_autofree char *base = g_path_get_basename (target);
  g_autofree char *tmp = g_strdup_printf ("%s/.%s.XXXXXX", dir, base);
  int fd = g_mkstemp_full (tmp, O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0)
    {
      int e = errno;
      g_autofree char *what
          = g_strdup_printf ("cannot create a file in %s", dir);
      return io_error (error, shown, what, e);
    }
  int e = 0;
  if (exists && fchmod (fd, st.st_mode & 07777) != 0)
    e = errno;
  if (e == 0)
    e = write_all (fd, data, len);
  if (e == 0 && fsync (fd) != 0 && errno != EINVAL)
    e = errno;
  if (close (fd) != 0 && e == 0 && errno != EINTR)
    e = errno;
  if (e == 0 && rename (tmp, target) != 0)
    e = errno;
  if (e != 0)
    {
      unlink (tmp);
      return io_error (error, shown, "cannot write", e);
    }
  return TRUE;
}

/* Where a chain of symbolic links ends, when it ends at nothing yet (a
 * dangling link names the file to create).  NULL on a loop. */
static char *
link_end (const char *path)
{
  g_autofree char *cur = g_strdup (path);
  for (int hops = 0; hops < 40; hops++)
    {
      struct stat st;
      if (lstat (cur, &st) != 0 || !S_ISLNK (st.st_mode))
        return g_steal_pointer (&cur);
      g_autofree char *to = g_file_read_link (cur, NULL);
      if (to == NULL)
        return NULL;
      if (!g_path_is_absolute (to))
        {
          g_autofree char *dir = g_path_get_dirname (cur);
          g_free (cur);
          cur = g_build_filename (dir, to, NULL);
        }
      else
        {
          g_free (cur);
          cur = g_steal_pointer (&to);
        }
    }
  return NULL;
}

gboolean
stow_file_write_atomic (const char *path, const char *data, gssize len,
                        GError **error)
{
  struct stat lst, st;
  g_return_val_if_fail (path != NULL && data != NULL, FALSE);
  gsize n = len < 0 ? strlen (data) : (gsize)len;
  if (*path == '\0')
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
                   "an empty file name (give a path, or leave -o out for "
                   "standard output)");
      return FALSE;
    }
  if (lstat (path, &lst) != 0)
    {
      if (errno != ENOENT)
        return io_error (error, path, NULL, errno);
      return replace_file (path, path, data, n, error);
    }
  if (S_ISREG (lst.st_mode))
    return replace_file (path, path, data, n, error);
  if (S_ISLNK (lst.st_mode))
    {
      /* Through the link: its target is what the user means. */
      if (stat (path, &st) != 0)
        {
          int e = errno;
          g_autofree char *end = e == ENOENT ? link_end (path) : NULL;
          if (end == NULL)
            return io_error (error, path, NULL, e == ENOENT ? ELOOP : e);
          return replace_file (end, path, data, n, error);
        }
      if (S_ISREG (st.st_mode))
        {
          g_autofree char *real = realpath (path, NULL);
          if (real == NULL)
            return io_error (error, path, NULL, errno);
          return replace_file (real, path, data, n, error);
        }
      lst = st;
    }
  if (S_ISCHR (lst.st_mode) || S_ISFIFO (lst.st_mode))
    return write_through (path, data, n, error);
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
               "%s: is %s; stowage writes regular files, character devices "
               "and FIFOs only",
               path,
               S_ISDIR (lst.st_mode)    ? "a directory"
               : S_ISBLK (lst.st_mode)  ? "a block device"
               : S_ISSOCK (lst.st_mode) ? "a socket"
                                        : "not a file");
  return FALSE;
}

/* The bytes that may stand outside a string in strict JSON: white space,
 * punctuation, and the letters and signs of numbers, true, false and null. */
static gboolean
json_bare_byte (guchar c)
{
  return c != '\0' && strchr (" \t\r\n:,-+.0123456789eEtrufalsn", c) != NULL;
}

gboolean
stow_json_check_nesting (const char *data, gsize len, guint max_depth,
                         const char *name, GError **error)
{
  gboolean in_string = FALSE;
  guint depth = 0;
  g_return_val_if_fail (data != NULL || len == 0, FALSE);
  for (gsize i = 0; i < len; i++)
    {
      guchar c = (guchar)data[i];
      if (in_string)
        {
          if (c == '\\')
            i++; /* an escaped byte never ends the string */
          else if (c == '"')
            in_string = FALSE;
          continue;
        }
      switch (c)
        {
        case '"':
          in_string = TRUE;
          break;
        case '[':
        case '{':
          if (++depth > max_depth)
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                           "%s: byte %" G_GSIZE_FORMAT
                           ": JSON nested deeper than %u levels",
                           name, i, max_depth);
              return FALSE;
            }
          break;
        case ']':
        case '}':
          /* An unbalanced close is json-glib's to report. */
          if (depth > 0)
            depth--;
          break;
        default:
          if (!json_bare_byte (c))
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON,
                           "%s: byte %" G_GSIZE_FORMAT
                           ": unexpected character 0x%02x outside a string",
                           name, i, c);
              return FALSE;
            }
        }
    }
  return TRUE;
}
