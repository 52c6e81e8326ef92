/* SPDX-License-Identifier: MIT
 *
 * serve/params.c: a request's parameters from its query string and its
 * body (JSON or a form).  Everything here comes from a client: every
 * malformed byte is an error that names the parameter, never a crash, and
 * what passes is valid UTF-8 without NUL.
 */
#include <string.h>

#include "core/json.h"
#include "serve/serve.h"

/* clang-format off */
G_DEFINE_QUARK (stow-serve-error-quark, stow_serve_error)
/* clang-format on */

/* Longest parameter name: the longest flag is 22 characters. */
#define MAX_NAME 64

void
stow_serve_params_init (StowServeParams *p)
{
  p->names = g_ptr_array_new_with_free_func (g_free);
  p->values = g_ptr_array_new_with_free_func (g_free);
  p->config = NULL;
}

void
stow_serve_params_clear (StowServeParams *p)
{
  g_clear_pointer (&p->names, g_ptr_array_unref);
  g_clear_pointer (&p->values, g_ptr_array_unref);
  g_clear_pointer (&p->config, g_free);
}

const char *
stow_serve_params_get (const StowServeParams *p, const char *name)
{
  for (guint i = 0; i < p->names->len; i++)
    if (strcmp (p->names->pdata[i], name) == 0)
      return p->values->pdata[i];
  return NULL;
}

static gboolean bad (GError **error, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static gboolean
bad (GError **error, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error_literal (error, STOW_SERVE_ERROR, STOW_SERVE_ERROR_BAD_REQUEST,
                       msg);
  return FALSE;
}

/* Visible ASCII: whether it names a flag is the endpoint's to say (with a
 * did-you-mean for "micro_batch" or "GPUS"). */
static gboolean
name_ok (const char *name)
{
  gsize n = strlen (name);
  if (n == 0 || n > MAX_NAME)
    return FALSE;
  for (gsize i = 0; i < n; i++)
    if (!g_ascii_isgraph (name[i]))
      return FALSE;
  return TRUE;
}

/* Adds one parameter (taking @name and @value). */
static gboolean
add (StowServeParams *p, char *name, char *value, guint max_params,
     GError **error)
{
  g_autofree char *n = name, *v = value;
  g_autofree char *esc = g_strescape (n, NULL);
  if (!name_ok (n))
    return bad (error,
                "parameter \"%.80s\": a name is a flag's without its dashes "
                "(1 to 64 visible ASCII characters)",
                esc);
  if (!g_utf8_validate (v, -1, NULL))
    return bad (error, "parameter \"%s\": the value is not UTF-8", n);
  if (stow_serve_params_get (p, n) != NULL
      || (p->config != NULL && strcmp (n, "config") == 0))
    return bad (error, "parameter \"%s\" given twice", n);
  if (strcmp (n, "config") == 0)
    {
      p->config = g_steal_pointer (&v);
      return TRUE;
    }
  if (p->names->len >= max_params)
    return bad (error, "more than %u parameters", max_params);
  g_ptr_array_add (p->names, g_steal_pointer (&n));
  g_ptr_array_add (p->values, g_steal_pointer (&v));
  return TRUE;
}

/* %XX and '+' decoded; NULL (and an error naming @what) for a malformed
 * escape or a NUL. */
static char *
unescape (const char *s, gsize len, const char *what, GError **error)
{
  GString *out = g_string_sized_new (len);
  for (gsize i = 0; i < len; i++)
    {
      char c = s[i];
      if (c == '+')
        c = ' ';
      else if (c == '%')
        {
          int hi = i + 2 < len ? g_ascii_xdigit_value (s[i + 1]) : -1;
          int lo = hi >= 0 ? g_ascii_xdigit_value (s[i + 2]) : -1;
          if (hi < 0 || lo < 0)
            {
              g_string_free (out, TRUE);
              bad (error, "%s: a malformed %%-escape (%%XX, two hex digits)",
                   what);
              return NULL;
            }
          c = (char)(hi * 16 + lo);
          i += 2;
        }
      if (c == '\0')
        {
          g_string_free (out, TRUE);
          bad (error, "%s: a NUL byte (%%00)", what);
          return NULL;
        }
      g_string_append_c (out, c);
    }
  return g_string_free (out, FALSE);
}

gboolean
stow_serve_params_parse_query (StowServeParams *p, const char *query,
                               guint max_params, GError **error)
{
  if (query == NULL)
    return TRUE;
  const char *s = query;
  while (*s)
    {
      gsize len = strcspn (s, "&");
      if (len > 0)
        {
          const char *eq = memchr (s, '=', len);
          gsize name_len = eq ? (gsize)(eq - s) : len;
          char *name = unescape (s, name_len, "a parameter's name", error);
          if (name == NULL)
            return FALSE;
          g_autofree char *what = g_strdup_printf ("parameter \"%.64s\"", name);
          char *value = eq ? unescape (eq + 1, len - name_len - 1, what, error)
                           : g_strdup ("");
          if (value == NULL)
            {
              g_free (name);
              return FALSE;
            }
          if (!add (p, name, value, max_params, error))
            return FALSE;
        }
      s += len;
      if (*s == '&')
        s++;
    }
  return TRUE;
}

/* A JSON value as the text a flag takes. */
static char *
json_value (JsonNode *node, const char *name, GError **error)
{
  if (JSON_NODE_HOLDS_VALUE (node))
    {
      GType t = json_node_get_value_type (node);
      if (t == G_TYPE_STRING)
        return g_strdup (json_node_get_string (node));
      if (t == G_TYPE_BOOLEAN)
        return g_strdup (json_node_get_boolean (node) ? "true" : "false");
      if (t == G_TYPE_INT64)
        return g_strdup_printf ("%" G_GINT64_FORMAT, json_node_get_int (node));
      if (t == G_TYPE_DOUBLE)
        {
          char buf[G_ASCII_DTOSTR_BUF_SIZE];
          return g_strdup (
              g_ascii_dtostr (buf, sizeof buf, json_node_get_double (node)));
        }
    }
  g_autofree char *what = stow_json_describe (node);
  bad (error,
       "parameter \"%s\": expected a string, a number or true/false, got %s",
       name, what);
  return NULL;
}

static gboolean
parse_json_body (StowServeParams *p, const char *body, gsize len,
                 guint max_params, GError **error)
{
  g_autoptr (GError) local = NULL;
  /* The body's own bound was checked before it was read; the JSON's
   * nesting and numbers are checked here, as every input's are. */
  g_autoptr (JsonNode) root = stow_json_parse_data_limit (
      body, (gssize)len, "request body", G_MAXSIZE, &local);
  if (root == NULL)
    return bad (error, "%s", local->message);
  if (!JSON_NODE_HOLDS_OBJECT (root))
    return bad (error, "request body: expected a JSON object of parameters "
                       "({\"model\": \"llama-65b\", \"gpus\": ...})");
  JsonObject *o = json_node_get_object (root);
  g_autoptr (GList) members = json_object_get_members (o);
  for (GList *m = members; m != NULL; m = m->next)
    {
      const char *name = m->data;
      JsonNode *node = json_object_get_member (o, name);
      if (JSON_NODE_HOLDS_NULL (node))
        continue;
      if (strcmp (name, "config") == 0 && JSON_NODE_HOLDS_OBJECT (node))
        {
          if (!add (p, g_strdup (name), json_to_string (node, FALSE),
                    max_params, error))
            return FALSE;
          continue;
        }
      char *value = json_value (node, name, error);
      if (value == NULL)
        return FALSE;
      if (!add (p, g_strdup (name), value, max_params, error))
        return FALSE;
    }
  return TRUE;
}

gboolean
stow_serve_params_parse_body (StowServeParams *p, const char *body, gsize len,
                              const char *content_type, guint max_params,
                              GError **error)
{
  if (body == NULL || len == 0)
    return TRUE;
  /* "application/json; charset=utf-8": the type without its parameters */
  g_autofree char *type = g_strstrip (
      g_strndup (content_type ? content_type : "",
                 strcspn (content_type ? content_type : "", ";")));
  if (memchr (body, '\0', len) != NULL)
    return bad (error, "request body: a NUL byte");
  if (g_ascii_strcasecmp (type, "application/json") == 0)
    return parse_json_body (p, body, len, max_params, error);
  if (g_ascii_strcasecmp (type, "application/x-www-form-urlencoded") == 0)
    {
      g_autofree char *text = g_strndup (body, len);
      return stow_serve_params_parse_query (p, text, max_params, error);
    }
  g_autofree char *esc = g_strescape (type, NULL);
  g_set_error (error, STOW_SERVE_ERROR, STOW_SERVE_ERROR_MEDIA_TYPE,
               "request body of type \"%.80s\": send application/json (an "
               "object of parameters) or a form",
               esc);
  return FALSE;
}
