/* SPDX-License-Identifier: MIT
 *
 * serve/answer.c: one request to the API, from its method, path, query and
 * body to its reply: routing, bounds, parsing, the endpoint's run, and a
 * failure as JSON.  No sockets here: the server's workers call it, and so
 * do the tests and the fuzzer.
 */
#include <string.h>

#include "core/json.h"
#include "serve-page-resource.h"
#include "serve/serve.h"

void
stow_serve_options_init (StowServeOptions *o)
{
  memset (o, 0, sizeof *o);
  o->workers = MAX (1, g_get_num_processors ());
  /* A team at once: each client waits for at most one answer. */
  o->queue = MAX (64, 8 * o->workers);
  o->timeout_s = 60;
  /* A pasted config.json may be as large as a file may (4 MiB), with
   * room for the other parameters. */
  o->max_body_bytes = ((gsize)4 << 20) + ((gsize)64 << 10);
  o->max_query_bytes = 8 << 10;
  o->max_params = 64;
  o->max_answer_bytes = (gsize)32 << 20;
  /* simulate's JSON lists every op: some 6.5 ops and 1.3 KB per pass */
  o->max_sim_passes = 16384;
  o->max_top = 1000;
}

void
stow_serve_options_complete (StowServeOptions *o)
{
  StowServeOptions d;
  stow_serve_options_init (&d);
#define DEFAULT(f)                                                             \
  if (o->f == 0)                                                               \
  o->f = d.f
  DEFAULT (workers);
  DEFAULT (queue);
  DEFAULT (timeout_s);
  DEFAULT (max_body_bytes);
  DEFAULT (max_query_bytes);
  DEFAULT (max_params);
  DEFAULT (max_answer_bytes);
  DEFAULT (max_sim_passes);
  DEFAULT (max_top);
#undef DEFAULT
}

void
stow_serve_reply_init (StowServeReply *r)
{
  memset (r, 0, sizeof *r);
  r->body = g_string_new (NULL);
  r->warnings = g_ptr_array_new_with_free_func (g_free);
}

void
stow_serve_reply_clear (StowServeReply *r)
{
  if (r->body)
    g_string_free (g_steal_pointer (&r->body), TRUE);
  g_clear_pointer (&r->filename, g_free);
  g_clear_pointer (&r->warnings, g_ptr_array_unref);
  g_clear_error (&r->error);
  g_clear_pointer (&r->hint, g_free);
  g_clear_pointer (&r->field, g_free);
}

void
stow_serve_reply_fail (StowServeReply *r, guint status, const GError *error,
                       const char *hint, const char *field)
{
  r->status = status;
  g_clear_error (&r->error);
  r->error = g_error_copy (error);
  g_free (r->hint);
  r->hint = g_strdup (hint);
  g_free (r->field);
  r->field = g_strdup (field);
  if (r->exit_code == 0)
    r->exit_code = 2;
}

static guint
status_of (const GError *error)
{
  if (error->domain != STOW_SERVE_ERROR)
    return 400;
  switch ((StowServeError)error->code)
    {
    case STOW_SERVE_ERROR_BAD_REQUEST:
      return 400;
    case STOW_SERVE_ERROR_NOT_FOUND:
      return 404;
    case STOW_SERVE_ERROR_METHOD:
      return 405;
    case STOW_SERVE_ERROR_TOO_LARGE:
      return 413;
    case STOW_SERVE_ERROR_URI_TOO_LONG:
      return 414;
    case STOW_SERVE_ERROR_MEDIA_TYPE:
      return 415;
    case STOW_SERVE_ERROR_BUSY:
    case STOW_SERVE_ERROR_TIMEOUT:
      return 503;
    }
  return 400;
}

static void
fail (StowServeReply *r, const GError *error)
{
  stow_serve_reply_fail (r, status_of (error), error, NULL, NULL);
}

void
stow_serve_reply_error_json (StowServeReply *r)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "error", r->error ? r->error->message : "failed");
  stow_json_set_i64 (b, "status", r->status);
  stow_json_set_i64 (b, "exit", r->exit_code);
  if (r->field)
    stow_json_set_string (b, "field", r->field);
  if (r->hint)
    stow_json_set_string (b, "hint", r->hint);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *s = stow_json_to_string (root, TRUE);
  g_string_assign (r->body, s);
  r->content_type = "application/json; charset=utf-8";
  g_clear_pointer (&r->filename, g_free);
}

void
stow_serve_answer (const StowServeEndpoint *endpoints, gsize n_endpoints,
                   const StowServeOptions *options, const char *method,
                   const char *path, const char *query, const char *body,
                   gsize len, const char *content_type, StowServeReply *reply)
{
  g_autoptr (GError) error = NULL;
  StowServeOptions o;
  if (options != NULL)
    o = *options;
  else
    stow_serve_options_init (&o);
  stow_serve_options_complete (&o);
  const StowServeEndpoint *ep = NULL;
  if (g_str_has_prefix (path, "/api/"))
    for (gsize i = 0; i < n_endpoints; i++)
      if (strcmp (path + 5, endpoints[i].name) == 0)
        ep = &endpoints[i];
  gboolean is_post = strcmp (method, "POST") == 0;
  if (ep == NULL)
    {
      g_autoptr (GString) names = g_string_new (NULL);
      for (gsize i = 0; i < n_endpoints; i++)
        g_string_append_printf (names, "%s/api/%s", i ? ", " : "",
                                endpoints[i].name);
      g_autofree char *esc = g_strescape (path, NULL);
      error = g_error_new (STOW_SERVE_ERROR, STOW_SERVE_ERROR_NOT_FOUND,
                           "no endpoint \"%.120s\" (the API has %s)", esc,
                           names->str);
    }
  else if (!is_post && strcmp (method, "GET") != 0
           && strcmp (method, "HEAD") != 0)
    {
      g_autofree char *esc = g_strescape (method, NULL);
      error
          = g_error_new (STOW_SERVE_ERROR, STOW_SERVE_ERROR_METHOD,
                         "method %.20s: the API takes GET, HEAD and POST", esc);
    }
  else if (query && strlen (query) > o.max_query_bytes)
    error = g_error_new (STOW_SERVE_ERROR, STOW_SERVE_ERROR_URI_TOO_LONG,
                         "the query is %" G_GSIZE_FORMAT
                         " bytes, over the server's bound of %" G_GSIZE_FORMAT
                         "; send the parameters as a JSON body (POST)",
                         strlen (query), o.max_query_bytes);
  else if (is_post && len > o.max_body_bytes)
    error = g_error_new (STOW_SERVE_ERROR, STOW_SERVE_ERROR_TOO_LARGE,
                         "the body is %" G_GSIZE_FORMAT
                         " bytes, over the server's bound of %" G_GSIZE_FORMAT,
                         len, o.max_body_bytes);
  if (error != NULL)
    {
      fail (reply, error);
      stow_serve_reply_error_json (reply);
      return;
    }

  StowServeParams params;
  stow_serve_params_init (&params);
  if (!stow_serve_params_parse_query (&params, query, o.max_params, &error)
      || (is_post
          && !stow_serve_params_parse_body (&params, body, len, content_type,
                                            o.max_params, &error)))
    fail (reply, error);
  else
    {
      ep->run (ep, &params, &o, reply);
      if (reply->status == 0)
        reply->status = 200;
    }
  stow_serve_params_clear (&params);
  if (reply->status >= 400)
    stow_serve_reply_error_json (reply);
}

GBytes *
stow_serve_page (const char *path, const char **content_type)
{
  static const struct
  {
    const char *path, *file, *type;
  } files[] = {
    { "/", "index.html", "text/html; charset=utf-8" },
    { "/index.html", "index.html", "text/html; charset=utf-8" },
    { "/app.js", "app.js", "text/javascript; charset=utf-8" },
    { "/style.css", "style.css", "text/css; charset=utf-8" },
    { "/favicon.svg", "favicon.svg", "image/svg+xml" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (files); i++)
    if (strcmp (path, files[i].path) == 0)
      {
        g_autofree char *name
            = g_strconcat ("/org/stowage/serve/", files[i].file, NULL);
        GBytes *b = g_resource_lookup_data (stow_serve_page_get_resource (),
                                            name, 0, NULL);
        if (b != NULL)
          *content_type = files[i].type;
        return b;
      }
  return NULL;
}
