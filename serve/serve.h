/* SPDX-License-Identifier: MIT
 *
 * serve/serve.h: `stowage serve`, the planner as a web page and a JSON API,
 * over libsoup 3 on GLib's main loop.  This room parses and bounds each
 * request, runs it on a thread pool, answers failures as JSON with the HTTP
 * status that fits, and serves the page (serve/page/, compiled in as a
 * GResource).  What an endpoint answers is its caller's: the CLI gives its
 * own commands (cli/api.c), so the API's JSON is the CLI's, byte for byte.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_SERVE_ERROR (stow_serve_error_quark ())
GQuark stow_serve_error_quark (void);

typedef enum
{
  STOW_SERVE_ERROR_BAD_REQUEST,  /* 400: a malformed query or body */
  STOW_SERVE_ERROR_NOT_FOUND,    /* 404: no such endpoint or page */
  STOW_SERVE_ERROR_METHOD,       /* 405: not GET, HEAD or POST */
  STOW_SERVE_ERROR_TOO_LARGE,    /* 413: a body over the bound */
  STOW_SERVE_ERROR_URI_TOO_LONG, /* 414: a query over the bound */
  STOW_SERVE_ERROR_MEDIA_TYPE,   /* 415: a body neither JSON nor a form */
  STOW_SERVE_ERROR_BUSY,         /* 503: every worker busy, queue full */
  STOW_SERVE_ERROR_TIMEOUT,      /* 503: over the time bound */
} StowServeError;

/* Bounds and sizes.  Zero fields take the defaults below. */
typedef struct
{
  guint workers;          /* questions answered at once (processors) */
  guint queue;            /* waiting beyond those before 503 (64, or 8x
                             workers) */
  double timeout_s;       /* one answer, then 503 (60) */
  gsize max_body_bytes;   /* a request's body, then 413 (a config.json's
                             bound and 64 KiB: 4.06 MiB) */
  gsize max_query_bytes;  /* a request's query string, then 414 (8 KiB) */
  guint max_params;       /* parameters in one request, then 400 (64) */
  gsize max_answer_bytes; /* one answer, then 400 (32 MiB) */
  guint64 max_sim_passes; /* micro-batch x layer passes of one simulated
                             step (16,384: about 20 MB of JSON) */
  guint max_top;          /* plan's top (1,000: some 2 MB of JSON; the
                             CLI's 100,000 took 15 s and 600 MB) */
} StowServeOptions;

void stow_serve_options_init (StowServeOptions *o);
/* Zero fields of @o take the defaults. */
void stow_serve_options_complete (StowServeOptions *o);

/* A request's parameters, names without "--", in the order given (the
 * query's, then the body's), each name once; and a pasted config.json's
 * text (the body's "config", NULL when none). */
typedef struct
{
  GPtrArray *names;  /* char *, owned */
  GPtrArray *values; /* char *, owned */
  char *config;
} StowServeParams;

void stow_serve_params_init (StowServeParams *p);
void stow_serve_params_clear (StowServeParams *p);
const char *stow_serve_params_get (const StowServeParams *p, const char *name);
/* Adds the parameters of @query ("a=1&b=x%20y", '+' is a space): a
 * malformed escape, a name that is empty, longer than 64 or not visible
 * ASCII, a value that is not UTF-8 or holds NUL, a name given twice and
 * more than @max_params parameters are STOW_SERVE_ERROR_BAD_REQUEST naming
 * the parameter.  "config" is the pasted config.json. */
gboolean stow_serve_params_parse_query (StowServeParams *p, const char *query,
                                        guint max_params, GError **error);
/* Adds the parameters of a body of @content_type: a JSON object (strings,
 * numbers and booleans; null is absent; "config" holds a config.json as a
 * string or an object) or a form (as a query).  Another type is
 * STOW_SERVE_ERROR_MEDIA_TYPE; bad JSON, other values and the query's
 * errors are STOW_SERVE_ERROR_BAD_REQUEST. */
gboolean stow_serve_params_parse_body (StowServeParams *p, const char *body,
                                       gsize len, const char *content_type,
                                       guint max_params, GError **error);

/* What one request is answered. */
typedef struct
{
  guint status;             /* 200, or the failure's */
  GString *body;            /* the answer, or the error's JSON */
  const char *content_type; /* static */
  char *filename;           /* a download's name, or NULL */
  int exit_code;            /* the CLI's: 0, 1 ("no"), 2 (failure) */
  GPtrArray *warnings;      /* char *: what the CLI would warn */
  /* A failure, before it becomes the body: its message, the hint and
   * the parameter at fault (each may be NULL). */
  GError *error;
  char *hint, *field;
} StowServeReply;

void stow_serve_reply_init (StowServeReply *r);
void stow_serve_reply_clear (StowServeReply *r);
/* Fails @r with @status and @error (copied), @hint and @field. */
void stow_serve_reply_fail (StowServeReply *r, guint status,
                            const GError *error, const char *hint,
                            const char *field);
/* A failed @r's body becomes its JSON: {"error": MESSAGE, "status",
 * "exit", and "field" and "hint" when known}. */
void stow_serve_reply_error_json (StowServeReply *r);

typedef struct StowServeEndpoint StowServeEndpoint;

/* An endpoint, /api/NAME: fills @reply from @params (status 200 with a
 * body and content type, or a failure) within the bounds of @options.
 * Called on a worker thread, several at once. */
typedef void (*StowServeRunFunc) (const StowServeEndpoint *endpoint,
                                  const StowServeParams *params,
                                  const StowServeOptions *options,
                                  StowServeReply *reply);

struct StowServeEndpoint
{
  const char *name;
  StowServeRunFunc run;
  const void *data; /* the endpoint's own */
};

/* What the server answers @method on @path with @query (may be NULL) and
 * @body (@len bytes of @content_type, may be NULL) at /api/: routing,
 * parsing, the endpoint's run, and a failure's JSON ({"error", "status",
 * "exit", and "hint" and "field" when known}).  Synchronous, on the
 * caller's thread: the server's workers call it, and the tests do
 * without a socket. */
void stow_serve_answer (const StowServeEndpoint *endpoints, gsize n_endpoints,
                        const StowServeOptions *options, const char *method,
                        const char *path, const char *query, const char *body,
                        gsize len, const char *content_type,
                        StowServeReply *reply);

/* The page and its assets: the resource's bytes for @path ("/",
 * "/app.js", "/style.css") and their content type, or NULL. */
GBytes *stow_serve_page (const char *path, const char **content_type);

typedef struct StowServer StowServer;

/* A server of @endpoints (borrowed; they must outlive it) and the page,
 * on the thread-default main context. */
StowServer *stow_server_new (const StowServeEndpoint *endpoints,
                             gsize n_endpoints,
                             const StowServeOptions *options);
/* Listens on @host (an IP address: 127.0.0.1, ::1, 0.0.0.0) and @port
 * (0: a free one).  G_IO_ERROR on failure, naming the address. */
gboolean stow_server_listen (StowServer *s, const char *host, guint port,
                             GError **error);
/* "http://HOST:PORT/" after a successful listen (free with g_free). */
char *stow_server_get_url (StowServer *s);
/* Stops listening, finishes the questions being answered, frees. */
void stow_server_free (StowServer *s);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowServer, stow_server_free)

G_END_DECLS
