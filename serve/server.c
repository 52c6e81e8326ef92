/* SPDX-License-Identifier: MIT
 *
 * serve/server.c: the HTTP side.  libsoup reads requests on the main loop;
 * each API request is paused and answered by a worker of a bounded thread
 * pool (stow_serve_answer), so one slow search never holds up the page or
 * the other clients; the reply comes back to the main loop to be sent.
 * Past the workers and the queue a request is answered 503 at once, and
 * one that takes longer than the time bound is answered 503 while its
 * worker finishes in the background (a search cannot be interrupted, but
 * the pool bounds how many run).
 */
#include <libsoup/soup.h>
#include <string.h>

#include "serve/serve.h"

struct StowServer
{
  SoupServer *soup;
  GMainContext *context;
  GThreadPool *pool;
  const StowServeEndpoint *endpoints;
  gsize n_endpoints;
  StowServeOptions options;
  guint in_flight;  /* API requests queued or running (main thread only) */
  GHashTable *jobs; /* every Job not yet freed */
};

typedef struct
{
  StowServer *server;
  SoupServerMessage *msg; /* a reference */
  char *method, *path, *query, *content_type;
  GBytes *body;
  StowServeReply reply;
  gint64 start_us;
  GSource *timeout;
  gboolean responded; /* a reply (the answer or a 503) was set */
  gboolean gone;      /* the message finished without us (client left) */
  gulong finished_id, disconnected_id;
} Job;

/* What every response carries: no caching of answers that depend on the
 * build, and no sniffing of content types. */
static void
common_headers (SoupServerMessage *msg, const char *cache)
{
  SoupMessageHeaders *h = soup_server_message_get_response_headers (msg);
  soup_message_headers_replace (h, "Cache-Control", cache);
  soup_message_headers_replace (h, "X-Content-Type-Options", "nosniff");
  soup_message_headers_replace (h, "Referrer-Policy", "no-referrer");
  soup_message_headers_replace (h, "X-Frame-Options", "DENY");
}

static void
respond (SoupServerMessage *msg, const StowServeReply *r)
{
  SoupMessageHeaders *h = soup_server_message_get_response_headers (msg);
  common_headers (msg, "no-store");
  /* An answer opened on its own (format=html, the report) runs nothing
   * and loads nothing. */
  soup_message_headers_replace (h, "Content-Security-Policy",
                                "default-src 'none'; style-src "
                                "'unsafe-inline'; img-src data:; "
                                "frame-ancestors 'none'; sandbox");
  soup_message_headers_replace (h, "X-Stowage-Exit",
                                r->exit_code == 0   ? "0"
                                : r->exit_code == 1 ? "1"
                                                    : "2");
  if (r->filename)
    {
      g_autofree char *cd
          = g_strdup_printf ("attachment; filename=\"%s\"", r->filename);
      soup_message_headers_replace (h, "Content-Disposition", cd);
    }
  /* What the CLI would print on stderr beside the answer; header values
   * are one line of visible ASCII. */
  for (guint i = 0; r->warnings && i < r->warnings->len && i < 8; i++)
    {
      g_autofree char *v = g_strdup (r->warnings->pdata[i]);
      for (char *p = v; *p; p++)
        if (!g_ascii_isprint (*p))
          *p = '?';
      soup_message_headers_append (h, "X-Stowage-Warning", v);
    }
  if (r->status == 503)
    soup_message_headers_replace (h, "Retry-After", "2");
  soup_server_message_set_status (msg, r->status, NULL);
  soup_server_message_set_response (
      msg, r->content_type ? r->content_type : "text/plain; charset=utf-8",
      SOUP_MEMORY_COPY, r->body->str, r->body->len);
}

/* A failure answered at once, on the main thread. */
static void respond_error (SoupServerMessage *msg, int code, const char *format,
                           ...) G_GNUC_PRINTF (3, 4);

static void
respond_error (SoupServerMessage *msg, int code, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *m = g_strdup_vprintf (format, ap);
  va_end (ap);
  StowServeReply r;
  stow_serve_reply_init (&r);
  g_autoptr (GError) e = g_error_new_literal (STOW_SERVE_ERROR, code, m);
  guint status = code == STOW_SERVE_ERROR_TOO_LARGE ? 413
                 : code == STOW_SERVE_ERROR_METHOD  ? 405
                                                    : 503;
  stow_serve_reply_fail (&r, status, e, NULL, NULL);
  stow_serve_reply_error_json (&r);
  respond (msg, &r);
  stow_serve_reply_clear (&r);
}

static void
job_free (Job *job)
{
  g_hash_table_remove (job->server->jobs, job);
  if (job->timeout)
    {
      g_source_destroy (job->timeout);
      g_source_unref (job->timeout);
    }
  if (job->finished_id)
    g_signal_handler_disconnect (job->msg, job->finished_id);
  if (job->disconnected_id)
    g_signal_handler_disconnect (job->msg, job->disconnected_id);
  g_object_unref (job->msg);
  g_free (job->method);
  g_free (job->path);
  g_free (job->query);
  g_free (job->content_type);
  g_clear_pointer (&job->body, g_bytes_unref);
  stow_serve_reply_clear (&job->reply);
  g_free (job);
}

static void
log_request (const Job *job, guint status)
{
  g_info ("%s %s%s%.200s %u %.3f s", job->method, job->path,
          job->query ? "?" : "", job->query ? job->query : "", status,
          (double)(g_get_monotonic_time () - job->start_us) / 1e6);
}

/* The worker's answer, back on the main thread. */
static gboolean
job_done (gpointer data)
{
  Job *job = data;
  job->server->in_flight--;
  if (!job->responded && !job->gone)
    {
      respond (job->msg, &job->reply);
      soup_server_message_unpause (job->msg);
      log_request (job, job->reply.status);
    }
  job_free (job);
  return G_SOURCE_REMOVE;
}

static void
job_run (gpointer data, gpointer pool_data)
{
  Job *job = data;
  StowServer *s = job->server;
  gsize len = 0;
  const char *body = job->body ? g_bytes_get_data (job->body, &len) : NULL;
  stow_serve_answer (s->endpoints, s->n_endpoints, &s->options, job->method,
                     job->path, job->query, body, len, job->content_type,
                     &job->reply);
  g_main_context_invoke (s->context, job_done, job);
}

static gboolean
job_timeout (gpointer data)
{
  Job *job = data;
  g_clear_pointer (&job->timeout, g_source_unref);
  if (!job->responded && !job->gone)
    {
      job->responded = TRUE;
      respond_error (job->msg, STOW_SERVE_ERROR_TIMEOUT,
                     "no answer within the server's bound of %.0f s; ask "
                     "for less (fewer GPUs or open dimensions), or run the "
                     "stowage command",
                     job->server->options.timeout_s);
      soup_server_message_unpause (job->msg);
      log_request (job, 503);
    }
  return G_SOURCE_REMOVE;
}

static void
job_message_finished (SoupServerMessage *msg, gpointer data)
{
  Job *job = data;
  job->gone = TRUE;
}

static void
serve_api (StowServer *s, SoupServerMessage *msg, const char *path)
{
  if (s->in_flight >= s->options.workers + s->options.queue)
    {
      respond_error (msg, STOW_SERVE_ERROR_BUSY,
                     "every worker is busy and %u questions wait; ask again "
                     "in a moment",
                     s->options.queue);
      return;
    }
  GUri *uri = soup_server_message_get_uri (msg);
  SoupMessageBody *body = soup_server_message_get_request_body (msg);
  SoupMessageHeaders *rh = soup_server_message_get_request_headers (msg);
  Job *job = g_new0 (Job, 1);
  job->server = s;
  job->msg = g_object_ref (msg);
  job->method = g_strdup (soup_server_message_get_method (msg));
  job->path = g_strdup (path);
  job->query = g_strdup (g_uri_get_query (uri));
  job->content_type
      = g_strdup (soup_message_headers_get_one (rh, "Content-Type"));
  if (body->length > 0)
    job->body = soup_message_body_flatten (body);
  job->start_us = g_get_monotonic_time ();
  stow_serve_reply_init (&job->reply);
  g_hash_table_add (s->jobs, job);
  /* A client that leaves (a page that asks again aborts its fetches)
   * takes the message's connection with it: never unpaused after. */
  job->finished_id = g_signal_connect (msg, "finished",
                                       G_CALLBACK (job_message_finished), job);
  job->disconnected_id = g_signal_connect (
      msg, "disconnected", G_CALLBACK (job_message_finished), job);
  s->in_flight++;
  soup_server_message_pause (msg);
  job->timeout = g_timeout_source_new ((guint)(s->options.timeout_s * 1000));
  g_source_set_callback (job->timeout, job_timeout, job, NULL);
  g_source_attach (job->timeout, s->context);
  g_thread_pool_push (s->pool, job, NULL);
}

static void
serve_page (SoupServerMessage *msg, const char *path)
{
  const char *type = NULL;
  g_autoptr (GBytes) bytes = stow_serve_page (path, &type);
  if (bytes == NULL)
    {
      common_headers (msg, "no-store");
      soup_server_message_set_status (msg, 404, NULL);
      static const char text[] = "not found: the page is at /, the API under "
                                 "/api/\n";
      soup_server_message_set_response (msg, "text/plain; charset=utf-8",
                                        SOUP_MEMORY_STATIC, text,
                                        sizeof text - 1);
      return;
    }
  /* The page may be cached but must be revalidated: a new build serves
   * a new page. */
  common_headers (msg, "no-cache");
  SoupMessageHeaders *h = soup_server_message_get_response_headers (msg);
  /* Nothing from elsewhere, no inline script; the report's SVG chart
   * (drawn by cairo) carries style attributes. */
  soup_message_headers_replace (
      h, "Content-Security-Policy",
      "default-src 'none'; script-src 'self'; style-src 'self'; "
      "style-src-attr 'unsafe-inline'; img-src 'self' data:; "
      "connect-src 'self'; form-action 'self'; base-uri 'none'; "
      "frame-ancestors 'none'");
  gsize len;
  const char *data = g_bytes_get_data (bytes, &len);
  soup_server_message_set_status (msg, 200, NULL);
  soup_server_message_set_response (msg, type, SOUP_MEMORY_COPY, data, len);
}

/* A body over the bound is answered 413 but still read, so that the
 * client, which may be sending it whole before it reads, gets the answer;
 * what is read is dropped, and past this much more the connection is cut. */
#define DRAIN_MAX_BYTES ((guint64)16 << 20)

static const char too_large_key[] = "stow-body-too-large";
static const char read_key[] = "stow-body-read";

static void
body_too_large (SoupServerMessage *msg)
{
  g_object_set_data (G_OBJECT (msg), too_large_key, GINT_TO_POINTER (1));
  soup_message_body_set_accumulate (soup_server_message_get_request_body (msg),
                                    FALSE);
}

static void
respond_too_large (StowServer *s, SoupServerMessage *msg)
{
  soup_message_headers_replace (soup_server_message_get_response_headers (msg),
                                "Connection", "close");
  respond_error (msg, STOW_SERVE_ERROR_TOO_LARGE,
                 "the body is over the server's bound of %" G_GSIZE_FORMAT
                 " bytes",
                 s->options.max_body_bytes);
}

/* Before the body is read: a declared length over the bound. */
static void
early_handler (SoupServer *soup, SoupServerMessage *msg, const char *path,
               GHashTable *query, gpointer data)
{
  StowServer *s = data;
  SoupMessageHeaders *rh = soup_server_message_get_request_headers (msg);
  if (soup_message_headers_get_encoding (rh) == SOUP_ENCODING_CONTENT_LENGTH
      && soup_message_headers_get_content_length (rh)
             > (goffset)s->options.max_body_bytes)
    {
      body_too_large (msg);
      respond_too_large (s, msg);
    }
}

/* A body without a declared length, as it grows. */
static void
got_chunk (SoupServerMessage *msg, GBytes *chunk, gpointer data)
{
  StowServer *s = data;
  guint64 *n = g_object_get_data (G_OBJECT (msg), read_key);
  *n += g_bytes_get_size (chunk);
  if (*n > s->options.max_body_bytes
      && !g_object_get_data (G_OBJECT (msg), too_large_key))
    body_too_large (msg);
  if (*n > s->options.max_body_bytes + DRAIN_MAX_BYTES)
    {
      GSocket *sock = soup_server_message_get_socket (msg);
      if (sock != NULL)
        g_socket_shutdown (sock, TRUE, TRUE, NULL);
    }
}

static void
request_started (SoupServer *soup, SoupServerMessage *msg, gpointer data)
{
  g_object_set_data_full (G_OBJECT (msg), read_key, g_new0 (guint64, 1),
                          g_free);
  g_signal_connect (msg, "got-chunk", G_CALLBACK (got_chunk), data);
}

static void
handler (SoupServer *soup, SoupServerMessage *msg, const char *path,
         GHashTable *query, gpointer data)
{
  StowServer *s = data;
  const char *method = soup_server_message_get_method (msg);
  if (g_object_get_data (G_OBJECT (msg), too_large_key))
    {
      respond_too_large (s, msg);
      return;
    }
  if (g_str_has_prefix (path, "/api/"))
    {
      serve_api (s, msg, path);
      return;
    }
  if (strcmp (method, "GET") != 0 && strcmp (method, "HEAD") != 0)
    {
      soup_message_headers_replace (
          soup_server_message_get_response_headers (msg), "Allow", "GET, HEAD");
      respond_error (msg, STOW_SERVE_ERROR_METHOD,
                     "the page takes GET and HEAD");
      return;
    }
  serve_page (msg, path);
}

StowServer *
stow_server_new (const StowServeEndpoint *endpoints, gsize n_endpoints,
                 const StowServeOptions *options)
{
  StowServer *s = g_new0 (StowServer, 1);
  if (options != NULL)
    s->options = *options;
  else
    stow_serve_options_init (&s->options);
  stow_serve_options_complete (&s->options);
  s->endpoints = endpoints;
  s->n_endpoints = n_endpoints;
  s->context = g_main_context_ref_thread_default ();
  s->jobs = g_hash_table_new (NULL, NULL);
  /* The server header names no version: nothing for a scanner. */
  s->soup = soup_server_new ("server-header", "stowage", NULL);
  soup_server_add_early_handler (s->soup, NULL, early_handler, s, NULL);
  soup_server_add_handler (s->soup, NULL, handler, s, NULL);
  g_signal_connect (s->soup, "request-started", G_CALLBACK (request_started),
                    s);
  s->pool
      = g_thread_pool_new (job_run, s, (gint)s->options.workers, FALSE, NULL);
  return s;
}

gboolean
stow_server_listen (StowServer *s, const char *host, guint port, GError **error)
{
  g_autoptr (GInetAddress) addr = g_inet_address_new_from_string (host);
  if (addr == NULL)
    {
      g_autofree char *esc = g_strescape (host, NULL);
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                   "--host \"%.80s\": expected an IP address (127.0.0.1, "
                   "::1, 0.0.0.0)",
                   esc);
      return FALSE;
    }
  if (port > 65535)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                   "--port %u: expected 0 to 65535", port);
      return FALSE;
    }
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (addr, port);
  g_autoptr (GError) local = NULL;
  if (!soup_server_listen (s->soup, sa, 0, &local))
    {
      g_set_error (
          error, G_IO_ERROR,
          local->domain == G_IO_ERROR ? local->code : G_IO_ERROR_FAILED,
          "cannot listen on %s port %u: %s", host, port, local->message);
      return FALSE;
    }
  return TRUE;
}

char *
stow_server_get_url (StowServer *s)
{
  GSList *uris = soup_server_get_uris (s->soup);
  if (uris == NULL)
    return NULL;
  GUri *u = uris->data;
  const char *host = g_uri_get_host (u);
  char *url
      = strchr (host, ':') != NULL
            ? g_strdup_printf ("http://[%s]:%d/", host, g_uri_get_port (u))
            : g_strdup_printf ("http://%s:%d/", host, g_uri_get_port (u));
  g_slist_free_full (uris, (GDestroyNotify)g_uri_unref);
  return url;
}

void
stow_server_free (StowServer *s)
{
  if (s == NULL)
    return;
  soup_server_disconnect (s->soup);
  /* Every queued and running question finishes; their replies go to
   * the main loop, run here until the last is freed. */
  g_thread_pool_free (s->pool, FALSE, TRUE);
  while (g_hash_table_size (s->jobs) > 0)
    g_main_context_iteration (s->context, TRUE);
  g_hash_table_unref (s->jobs);
  g_object_unref (s->soup);
  g_main_context_unref (s->context);
  g_free (s);
}
