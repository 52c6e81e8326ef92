/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-hub.c: models by Hub id as a user runs them, against an
 * HTTP server this test starts on 127.0.0.1 (GIO, one thread per
 * connection) that answers as the Hub does: a public repository, a gated
 * one, a missing one, a slow one, redirects (a renamed repository, LFS
 * files on a CDN), a malformed config, safetensors indices and a real
 * safetensors file read by HTTP Range; and, for `train --model ORG/NAME`,
 * repositories served file by file as the Hub serves them to
 * huggingface_hub (HEAD with etags and sizes, LFS files redirected to a CDN
 * on another host name, Range requests, a connection cut once, a damaged
 * file).  No network.
 */
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "tests/testutil-io.h"
#include "tests/testutil-train.h"
#include "tests/testutil.h"

#define TOKEN  "hf_test_token_0123"
#define COMMIT "0123456789abcdef0123456789abcdef01234567"

/* A small LLaMA that `stowage init-model` writes a checkpoint of. */
static const char *const tiny_config
    = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
      "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"intermediate_size\":96,\"vocab_size\":300,"
      "\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";
/* The same with one more vocabulary row than its checkpoint holds. */
static const char *const tiny_wide_config
    = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
      "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"intermediate_size\":96,\"vocab_size\":301,"
      "\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";

/* The tokenizer.json acme/train carries (copied, never read, by train on
 * token shards). */
static const char *const repo_tokenizer
    = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", "
      "\"vocab\": {\"a\": 0}, \"merges\": []}}";

/* Qwen2-7B's model.safetensors.index.json total_size: 7,615,616,512
 * parameters (tests/test-models.c, published) at bfloat16. */
static const char *const qwen_index
    = "{\"metadata\":{\"total_size\":15231233024},\"weight_map\":{}}";
static const char *const qwen_index_off
    = "{\"metadata\":{\"total_size\":15231233000},\"weight_map\":{}}";

/* A repository served file by file (HEAD and GET). */
typedef struct
{
  char *name;
  GBytes *data;
  gboolean lfs; /* on the CDN; the etag a sha256 */
  char *etag;   /* sha256 (LFS) or git's blob sha1 of data */
} RepoFile;

typedef struct
{
  const char *repo; /* ORG/NAME */
  GPtrArray *files; /* RepoFile */
  gboolean damaged; /* the CDN sends its LFS files with a byte flipped */
  gboolean gated;   /* only with the token */
  gboolean no_etag; /* answers without an ETag */
} Repo;

typedef struct
{
  GSocketService *service;
  GMainLoop *loop;
  GThread *thread;
  gint port;           /* atomic; 0 until the server listens */
  gint requests;       /* atomic */
  gint range_requests; /* atomic */
  GBytes *tiny_st;     /* model.safetensors of tiny_config */
  char *qwen_config;
  char *dir;
  guint cache_n;
  GPtrArray *repos;    /* Repo, served file by file */
  gint cdn_requests;   /* atomic */
  gint cdn_with_token; /* atomic: CDN requests that carried a token */
  gint hub_with_token; /* atomic: Hub requests that carried it */
  gint by_branch;      /* atomic: resolve/main/ requests, not by commit */
  GMutex lock;         /* guards the three below */
  char *cut_file;      /* the next CDN GET of it is cut ... */
  gsize cut_after;     /* ... after this many bytes of body */
  char *last_range;    /* the last CDN Range header */
} Server;

static Server srv;

static void
respond (GOutputStream *out, int status, const char *reason,
         const char *extra_headers, const void *body, gsize len)
{
  g_autofree char *head = g_strdup_printf (
      "HTTP/1.1 %d %s\r\nContent-Length: %" G_GSIZE_FORMAT
      "\r\nConnection: close\r\n%s\r\n",
      status, reason, len, extra_headers ? extra_headers : "");
  g_output_stream_write_all (out, head, strlen (head), NULL, NULL, NULL);
  /* A HEAD gets the headers a GET would. */
  if (len && g_object_get_data (G_OBJECT (out), "head") == NULL)
    g_output_stream_write_all (out, body, len, NULL, NULL, NULL);
}

static void
respond_text (GOutputStream *out, int status, const char *reason,
              const char *extra, const char *text)
{
  respond (out, status, reason, extra, text, strlen (text));
}

static void
not_found (GOutputStream *out, const char *code)
{
  g_autofree char *h = g_strdup_printf ("X-Error-Code: %s\r\n", code);
  respond_text (out, 404, "Not Found", h, "not found");
}

/* Announces @len bytes of body but sends only @cut of them, then the
 * connection closes: a transfer cut on the way. */
static void
cut_short (GOutputStream *out, int status, const char *extra,
           const guint8 *body, gsize len, gsize cut)
{
  g_autofree char *head
      = g_strdup_printf ("HTTP/1.1 %d %s\r\nContent-Length: %" G_GSIZE_FORMAT
                         "\r\nConnection: close\r\n%s\r\n",
                         status, status == 206 ? "Partial Content" : "OK", len,
                         extra ? extra : "");
  g_output_stream_write_all (out, head, strlen (head), NULL, NULL, NULL);
  g_output_stream_write_all (out, body, MIN (cut, len), NULL, NULL, NULL);
}

/* Serves @b, or the byte range "bytes=A-B" or "bytes=A-" of it; with
 * @cut, only that many bytes of the body before the connection closes. */
static void
serve_bytes (GOutputStream *out, GBytes *b, const char *range, gsize cut)
{
  gsize len;
  const guint8 *data = g_bytes_get_data (b, &len);
  guint64 a, z = G_MAXUINT64;
  int fields
      = range ? sscanf (range, "bytes=%" G_GUINT64_FORMAT "-%" G_GUINT64_FORMAT,
                        &a, &z)
              : 0;
  if (fields >= 1)
    {
      g_atomic_int_inc (&srv.range_requests);
      if (a >= len || z < a)
        {
          respond_text (out, 416, "Range Not Satisfiable", NULL, "");
          return;
        }
      if (z >= len)
        z = len - 1;
      g_autofree char *h
          = g_strdup_printf ("Content-Range: bytes %" G_GUINT64_FORMAT
                             "-%" G_GUINT64_FORMAT "/%" G_GSIZE_FORMAT "\r\n",
                             a, z, len);
      if (cut)
        cut_short (out, 206, h, data + a, (gsize)(z - a + 1), cut);
      else
        respond (out, 206, "Partial Content", h, data + a, (gsize)(z - a + 1));
      return;
    }
  if (cut)
    cut_short (out, 200, NULL, data, len, cut);
  else
    respond (out, 200, "OK", NULL, data, len);
}

/* git's object id of a file's contents (git hash-object). */
static char *
git_blob_sha1 (GBytes *b)
{
  gsize len;
  const guint8 *data = g_bytes_get_data (b, &len);
  g_autoptr (GChecksum) sum = g_checksum_new (G_CHECKSUM_SHA1);
  g_autofree char *head = g_strdup_printf ("blob %" G_GSIZE_FORMAT, len);
  g_checksum_update (sum, (const guchar *)head, (gssize)strlen (head) + 1);
  g_checksum_update (sum, data, (gssize)len);
  return g_strdup (g_checksum_get_string (sum));
}

static Repo *
find_repo (const char *path, const char *prefix, const char **rest)
{
  for (guint i = 0; srv.repos && i < srv.repos->len; i++)
    {
      Repo *r = g_ptr_array_index (srv.repos, i);
      g_autofree char *p = g_strdup_printf ("%s%s/", prefix, r->repo);
      if (g_str_has_prefix (path, p))
        {
          *rest = path + strlen (p);
          return r;
        }
    }
  return NULL;
}

static RepoFile *
find_file (const Repo *r, const char *name)
{
  for (guint i = 0; i < r->files->len; i++)
    {
      RepoFile *f = g_ptr_array_index (r->files, i);
      if (g_str_equal (f->name, name))
        return f;
    }
  return NULL;
}

/* The Hub's answers for the repositories in srv.repos: resolve/REV/FILE
 * as the Hub answers huggingface_hub, LFS files redirected to a CDN on
 * another host name (localhost, not 127.0.0.1), and the CDN.  FALSE for
 * a path of no such repository. */
static gboolean
serve_repo (GOutputStream *out, const char *path, const char *auth,
            const char *range)
{
  const char *rest = NULL;
  Repo *r = find_repo (path, "/cdn/", &rest);
  if (r != NULL)
    {
      RepoFile *f = find_file (r, rest);
      g_atomic_int_inc (&srv.cdn_requests);
      if (auth != NULL)
        g_atomic_int_inc (&srv.cdn_with_token);
      gsize cut = 0;
      g_mutex_lock (&srv.lock);
      if (range != NULL)
        {
          g_free (srv.last_range);
          srv.last_range = g_strdup (range);
        }
      if (f && g_strcmp0 (srv.cut_file, f->name) == 0)
        {
          cut = srv.cut_after;
          g_clear_pointer (&srv.cut_file, g_free);
        }
      g_mutex_unlock (&srv.lock);
      if (f == NULL)
        respond_text (out, 404, "Not Found", NULL, "");
      else if (r->damaged)
        {
          gsize len;
          g_autofree guint8 *bad = g_memdup2 (g_bytes_get_data (f->data, &len),
                                              g_bytes_get_size (f->data));
          bad[len / 2] ^= 0x40;
          g_autoptr (GBytes) b = g_bytes_new (bad, len);
          serve_bytes (out, b, range, cut);
        }
      else
        serve_bytes (out, f->data, range, cut);
      return TRUE;
    }
  r = find_repo (path, "/", &rest);
  if (r == NULL || !g_str_has_prefix (rest, "resolve/"))
    return FALSE;
  rest += strlen ("resolve/");
  if (g_strcmp0 (auth, "Bearer " TOKEN) == 0)
    g_atomic_int_inc (&srv.hub_with_token);
  const char *slash = strchr (rest, '/');
  if (g_str_has_prefix (rest, "main/"))
    g_atomic_int_inc (&srv.by_branch);
  if (slash == NULL
      || (strncmp (rest, "main/", 5) != 0
          && strncmp (rest, COMMIT "/", 41) != 0))
    {
      not_found (out, "RevisionNotFound");
      return TRUE;
    }
  RepoFile *f = find_file (r, slash + 1);
  if (f == NULL)
    {
      not_found (out, "EntryNotFound");
      return TRUE;
    }
  if (!f->lfs)
    {
      g_autofree char *h = g_strdup_printf (
          "X-Repo-Commit: " COMMIT "\r\n%s%s%s", r->no_etag ? "" : "ETag: \"",
          r->no_etag ? "" : f->etag, r->no_etag ? "" : "\"\r\n");
      respond (out, 200, "OK", h, g_bytes_get_data (f->data, NULL),
               g_bytes_get_size (f->data));
      return TRUE;
    }
  /* The pointer's own ETag beside the file's: huggingface_hub takes
   * X-Linked-Etag and X-Linked-Size over ETag and Content-Length. */
  g_autofree char *h = g_strdup_printf (
      "X-Repo-Commit: " COMMIT "\r\n"
      "ETag: \"0000000000000000000000000000000000000000\"\r\n"
      "X-Linked-Etag: \"%s\"\r\nX-Linked-Size: %" G_GSIZE_FORMAT "\r\n"
      "Location: http://localhost:%d/cdn/%s/%s\r\n",
      f->etag, g_bytes_get_size (f->data), srv.port, r->repo, f->name);
  respond_text (out, 302, "Found", h, "");
  return TRUE;
}

static gboolean
on_run (GThreadedSocketService *service, GSocketConnection *conn,
        GObject *source, gpointer user)
{
  GOutputStream *out = g_io_stream_get_output_stream (G_IO_STREAM (conn));
  g_autoptr (GDataInputStream) in = g_data_input_stream_new (
      g_io_stream_get_input_stream (G_IO_STREAM (conn)));
  g_data_input_stream_set_newline_type (in, G_DATA_STREAM_NEWLINE_TYPE_CR_LF);
  g_autofree char *line = g_data_input_stream_read_line (in, NULL, NULL, NULL);
  g_autofree char *auth = NULL, *range = NULL;
  if (line == NULL)
    return FALSE;
  for (;;)
    {
      g_autofree char *h = g_data_input_stream_read_line (in, NULL, NULL, NULL);
      if (h == NULL || h[0] == '\0')
        break;
      if (g_ascii_strncasecmp (h, "Authorization:", 14) == 0)
        auth = g_strdup (g_strstrip (h + 14));
      else if (g_ascii_strncasecmp (h, "Range:", 6) == 0)
        range = g_strdup (g_strstrip (h + 6));
    }
  g_atomic_int_inc (&srv.requests);
  g_auto (GStrv) parts = g_strsplit (line, " ", 3);
  if (g_strv_length (parts) < 2
      || (strcmp (parts[0], "GET") != 0 && strcmp (parts[0], "HEAD") != 0))
    {
      respond_text (out, 400, "Bad Request", NULL, "");
      return FALSE;
    }
  if (g_str_equal (parts[0], "HEAD"))
    g_object_set_data (G_OBJECT (out), "head", GINT_TO_POINTER (1));
  const char *path = parts[1];
  const char *commit = "X-Repo-Commit: " COMMIT "\r\n";

  if (serve_repo (out, path, auth, range))
    ;
  else if (g_str_equal (path, "/acme/tiny/resolve/main/config.json")
           || g_str_equal (path, "/acme/tiny/resolve/v1/config.json"))
    respond_text (out, 200, "OK", commit, tiny_config);
  else if (g_str_equal (path, "/acme/tiny-wide/resolve/main/config.json"))
    respond_text (out, 200, "OK", commit, tiny_wide_config);
  else if (g_str_equal (path, "/acme/tiny/resolve/main/model.safetensors")
           || g_str_equal (path,
                           "/acme/tiny-wide/resolve/main/model.safetensors"))
    /* The Hub sends LFS files from a CDN. */
    respond_text (out, 302, "Found",
                  "Location: /cdn/lfs/tiny.safetensors?sig=1\r\n", "");
  else if (g_str_equal (path, "/cdn/lfs/tiny.safetensors?sig=1"))
    serve_bytes (out, srv.tiny_st, range, 0);
  else if (g_str_has_prefix (path, "/acme/tiny/resolve/nope/"))
    not_found (out, "RevisionNotFound");
  else if (g_str_equal (path, "/acme/qwen/resolve/main/config.json")
           || g_str_equal (path, "/acme/qwen-off/resolve/main/config.json"))
    respond_text (out, 200, "OK", commit, srv.qwen_config);
  else if (g_str_equal (path,
                        "/acme/qwen/resolve/main/model.safetensors.index.json"))
    respond_text (out, 200, "OK", NULL, qwen_index);
  else if (g_str_equal (
               path,
               "/acme/qwen-off/resolve/main/model.safetensors.index.json"))
    respond_text (out, 200, "OK", NULL, qwen_index_off);
  else if (g_str_equal (path, "/acme/bad-index/resolve/main/config.json")
           || g_str_equal (path, "/acme/bad-header/resolve/main/config.json"))
    respond_text (out, 200, "OK", commit, tiny_config);
  else if (g_str_equal (
               path,
               "/acme/bad-index/resolve/main/model.safetensors.index.json"))
    respond_text (
        out, 200, "OK", NULL,
        "{\"metadata\": {\"total_size\": [1, {}]}, \"weight_map\": 7}");
  else if (g_str_equal (path,
                        "/acme/bad-header/resolve/main/model.safetensors"))
    {
      /* A header whose shapes are not integers. */
      static const char json[]
          = "{\"a\": {\"dtype\": \"F32\", \"shape\": [[1], {}], "
            "\"data_offsets\": [0, \"x\"]}}";
      guint8 buf[8 + sizeof json];
      guint64 n = sizeof json - 1;
      for (int i = 0; i < 8; i++)
        buf[i] = (guint8)(n >> (8 * i));
      memcpy (buf + 8, json, n);
      g_autoptr (GBytes) b = g_bytes_new (buf, 8 + n);
      serve_bytes (out, b, range, 0);
    }
  else if (g_str_equal (path, "/acme/gated/resolve/main/config.json"))
    {
      if (g_strcmp0 (auth, "Bearer " TOKEN) == 0)
        respond_text (out, 200, "OK", commit, tiny_config);
      else if (auth != NULL)
        respond_text (out, 403, "Forbidden", "X-Error-Code: GatedRepo\r\n",
                      "no access");
      else
        respond_text (out, 401, "Unauthorized", "X-Error-Code: GatedRepo\r\n",
                      "gated");
    }
  else if (g_str_has_prefix (path, "/acme/private/"))
    respond_text (out, 401, "Unauthorized", "X-Error-Code: RepoNotFound\r\n",
                  "");
  else if (g_str_has_prefix (path, "/acme/missing/"))
    not_found (out, "RepoNotFound");
  else if (g_str_has_prefix (path, "/acme/slow/"))
    {
      g_usleep (3 * G_USEC_PER_SEC);
      respond_text (out, 200, "OK", NULL, tiny_config);
    }
  else if (g_str_equal (path, "/acme/moved/resolve/main/config.json"))
    /* A renamed repository. */
    respond_text (out, 307, "Temporary Redirect",
                  "Location: /acme/tiny/resolve/main/config.json\r\n", "");
  else if (g_str_equal (path, "/acme/broken/resolve/main/config.json"))
    respond_text (out, 200, "OK", NULL,
                  "{\"model_type\": \"llama\", \"hidden_size\": 64,");
  else if (g_str_equal (path, "/acme/badfield/resolve/main/config.json"))
    respond_text (out, 200, "OK", NULL,
                  "{\"model_type\":\"llama\",\"hidden_size\":\"big\"}");
  else if (g_str_equal (path, "/acme/server-error/resolve/main/config.json"))
    respond_text (out, 500, "Internal Server Error", NULL, "oops");
  else if (strstr (path, "/resolve/") != NULL)
    not_found (out, "EntryNotFound");
  else
    not_found (out, "RepoNotFound");
  return FALSE;
}

/* The service accepts in the main context of the thread that starts it;
 * the test's own thread blocks in g_spawn_sync, so the server has a thread
 * and a main loop of its own. */
static gpointer
server_thread (gpointer ready)
{
  g_autoptr (GMainContext) ctx = g_main_context_new ();
  g_autoptr (GError) error = NULL;
  g_main_context_push_thread_default (ctx);
  srv.service = g_threaded_socket_service_new (16);
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocketAddress) addr = g_inet_socket_address_new (lo, 0);
  g_autoptr (GSocketAddress) bound = NULL;
  g_socket_listener_add_address (G_SOCKET_LISTENER (srv.service), addr,
                                 G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP,
                                 NULL, &bound, &error);
  g_assert_no_error (error);
  g_signal_connect (srv.service, "run", G_CALLBACK (on_run), NULL);
  g_socket_service_start (srv.service);
  srv.loop = g_main_loop_new (ctx, FALSE);
  g_atomic_int_set (&srv.port, g_inet_socket_address_get_port (
                                   G_INET_SOCKET_ADDRESS (bound)));
  g_main_loop_run (srv.loop);
  g_socket_service_stop (srv.service);
  g_socket_listener_close (G_SOCKET_LISTENER (srv.service));
  g_main_context_pop_thread_default (ctx);
  return NULL;
}

static void
server_start (void)
{
  srv.thread = g_thread_new ("hub-server", server_thread, NULL);
  while (g_atomic_int_get (&srv.port) == 0)
    g_usleep (1000);
}

static void
set_endpoint (void)
{
  g_autofree char *ep = g_strdup_printf ("http://127.0.0.1:%d", srv.port);
  g_setenv ("HF_ENDPOINT", ep, TRUE);
}

/* Each test starts with empty caches, no token, online, the test server. */
static void
fresh_env (void)
{
  g_autofree char *hf = g_strdup_printf ("%s/hf-%u", srv.dir, ++srv.cache_n);
  g_autofree char *xdg = g_strdup_printf ("%s/xdg-%u", srv.dir, srv.cache_n);
  g_setenv ("HF_HOME", hf, TRUE);
  g_setenv ("XDG_CACHE_HOME", xdg, TRUE);
  g_unsetenv ("HF_HUB_CACHE");
  g_unsetenv ("HF_TOKEN");
  g_unsetenv ("HF_TOKEN_PATH");
  g_unsetenv ("HF_HUB_OFFLINE");
  g_setenv ("STOW_HUB_TIMEOUT", "5", TRUE);
  set_endpoint ();
}

/* Exit 2, nothing on stdout, exactly one line on stderr holding each
 * fragment. */
static void
check_error (const StowRun *r, const char *fragment, const char *fragment2)
{
  g_assert_cmpint (r->status, ==, 2);
  g_assert_cmpstr (r->out, ==, "");
  g_assert_cmpuint (stow_count_lines (r->err), ==, 1);
  g_assert_nonnull (strstr (r->err, fragment));
  if (fragment2)
    g_assert_nonnull (strstr (r->err, fragment2));
}

static JsonObject *
parse_object (const char *text, JsonParser *parser)
{
  g_autoptr (GError) error = NULL;
  json_parser_load_from_data (parser, text, -1, &error);
  g_assert_no_error (error);
  return json_node_get_object (json_parser_get_root (parser));
}

/* tiny_config's parameters: embeddings and lm_head 2 x 300 x 64, per
 * layer q and o 64 x 64, k and v 32 x 64, gate, up and down 96 x 64 each
 * and two norms of 64, then the final norm; init-model's checkpoint holds
 * exactly these tensors. */
#define TINY_PARAMS                                                            \
  (2 * 300 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 96 * 64 + 2 * 64) + 64)

static void
test_public (void)
{
  fresh_env ();
  gint ranges = g_atomic_int_get (&srv.range_requests);
  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  stow_run (&r, "model", "acme/tiny", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  /* The count agrees with the checkpoint's own tensor table, read by two
   * Range requests through the CDN redirect: no warning. */
  g_assert_cmpstr (r.err, ==, "");
  g_assert_cmpint (g_atomic_int_get (&srv.range_requests) - ranges, ==, 2);
  JsonObject *o = parse_object (r.out, p);
  g_assert_cmpstr (json_object_get_string_member (o, "name"), ==, "acme/tiny");
  g_assert_cmpstr (json_object_get_string_member (o, "hub_id"), ==,
                   "acme/tiny");
  g_assert_cmpstr (json_object_get_string_member (o, "revision"), ==, "main");
  g_assert_cmpint (json_object_get_int_member (o, "params"), ==, TINY_PARAMS);
  /* The checkpoint's bytes as its header says: the last tensor's end. */
  gsize st_len = g_bytes_get_size (srv.tiny_st);
  g_assert_cmpint (json_object_get_int_member (o, "checkpoint_bytes"), <,
                   (gint64)st_len);
  g_assert_cmpint (json_object_get_int_member (o, "checkpoint_bytes"), ==,
                   4 * TINY_PARAMS);
  /* Cached in stowage's cache (XDG), config and header. */
  const char *src = json_object_get_string_member (o, "source");
  g_assert_true (g_str_has_prefix (src, g_getenv ("XDG_CACHE_HOME")));
  g_assert_true (g_file_test (src, G_FILE_TEST_IS_REGULAR));
  g_autofree char *dir = g_path_get_dirname (src);
  g_autofree char *hdr
      = g_build_filename (dir, "model.safetensors.header.json", NULL);
  g_assert_true (g_file_test (hdr, G_FILE_TEST_IS_REGULAR));

  /* fit takes the Hub id too. */
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "fit", "acme/tiny", "--gpus", "1xA100-80GB", NULL);
  g_assert_cmpint (f.status, ==, 0);
  g_assert_nonnull (strstr (f.out, "acme/tiny"));
}

static void
test_cache_hit (void)
{
  fresh_env ();
  g_auto (StowRun) r1 = { 0 };
  stow_run (&r1, "model", "acme/tiny", NULL);
  g_assert_cmpint (r1.status, ==, 0);

  /* Offline, and the server out of reach: stowage's cache answers. */
  gint before = g_atomic_int_get (&srv.requests);
  g_setenv ("HF_HUB_OFFLINE", "1", TRUE);
  g_setenv ("HF_ENDPOINT", "http://127.0.0.1:1", TRUE);
  g_auto (StowRun) r2 = { 0 };
  stow_run (&r2, "model", "acme/tiny", NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_assert_cmpstr (r2.err, ==, "");
  g_assert_cmpstr (r2.out, ==, r1.out);
  /* Online again: still the cache, no request. */
  g_unsetenv ("HF_HUB_OFFLINE");
  set_endpoint ();
  g_auto (StowRun) r3 = { 0 };
  stow_run (&r3, "model", "acme/tiny", NULL);
  g_assert_cmpint (r3.status, ==, 0);
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);

  /* Not cached and offline: says so. */
  g_setenv ("HF_HUB_OFFLINE", "1", TRUE);
  g_auto (StowRun) r4 = { 0 };
  stow_run (&r4, "model", "acme/qwen", NULL);
  check_error (&r4, "HF_HUB_OFFLINE", "acme/qwen");
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);
}

/* The layout huggingface_hub writes: refs/main holds the commit, the
 * snapshot folder holds the files. */
static void
test_hf_cache (void)
{
  fresh_env ();
  g_autofree char *repo = g_build_filename (g_getenv ("HF_HOME"), "hub",
                                            "models--acme--downloaded", NULL);
  g_autofree char *refs = g_build_filename (repo, "refs", NULL);
  g_autofree char *snap = g_build_filename (repo, "snapshots", COMMIT, NULL);
  g_assert_cmpint (g_mkdir_with_parents (refs, 0755), ==, 0);
  g_assert_cmpint (g_mkdir_with_parents (snap, 0755), ==, 0);
  g_autofree char *ref = g_build_filename (refs, "main", NULL);
  g_autofree char *cfg = g_build_filename (snap, "config.json", NULL);
  g_autofree char *st = g_build_filename (snap, "model.safetensors", NULL);
  g_assert_true (g_file_set_contents (ref, COMMIT, -1, NULL));
  g_assert_true (g_file_set_contents (cfg, tiny_wide_config, -1, NULL));
  g_assert_true (g_file_set_contents (st, g_bytes_get_data (srv.tiny_st, NULL),
                                      (gssize)g_bytes_get_size (srv.tiny_st),
                                      NULL));
  gint before = g_atomic_int_get (&srv.requests);
  g_setenv ("HF_HUB_OFFLINE", "1", TRUE);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/downloaded", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, snap));
  /* The local model.safetensors' header disagrees with the config (one
   * vocabulary row): a warning, one line. */
  g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
  g_assert_nonnull (strstr (r.err, "warning"));
  g_assert_nonnull (strstr (r.err, "model.safetensors holds"));

  /* A commit as the revision reads its snapshot directly. */
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "model", "acme/downloaded", "--revision", COMMIT, NULL);
  g_assert_cmpint (c.status, ==, 0);
  /* HF_HUB_CACHE wins over HF_HOME. */
  g_setenv ("HF_HUB_CACHE", "/nonexistent-stow-test", TRUE);
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "model", "acme/downloaded", NULL);
  check_error (&m, "/nonexistent-stow-test", NULL);
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);
}

static void
test_header_mismatch (void)
{
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/tiny-wide", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
  g_autofree char *n = g_strdup_printf ("holds %" G_GINT64_FORMAT " parameters",
                                        (gint64)TINY_PARAMS);
  g_assert_nonnull (strstr (r.err, n));
}

static void
test_index (void)
{
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  stow_run (&r, "model", "acme/qwen", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.err, ==, "");
  JsonObject *o = parse_object (r.out, p);
  /* Qwen2-7B, published: 7,615,616,512 parameters. */
  g_assert_cmpint (json_object_get_int_member (o, "params"), ==, 7615616512);
  g_assert_cmpint (json_object_get_int_member (o, "checkpoint_bytes"), ==,
                   15231233024);

  g_auto (StowRun) w = { 0 };
  stow_run (&w, "model", "acme/qwen-off", NULL);
  g_assert_cmpint (w.status, ==, 0);
  g_assert_cmpuint (stow_count_lines (w.err), ==, 1);
  g_assert_nonnull (strstr (w.err, "total_size is 15231233000"));
}

/* A malformed index or header only means no check: no warning, no
 * critical from json-glib. */
static void
test_bad_checkpoint_files (void)
{
  fresh_env ();
  const char *repos[] = { "acme/bad-index", "acme/bad-header" };
  for (gsize i = 0; i < G_N_ELEMENTS (repos); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "model", repos[i], NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_assert_cmpstr (r.err, ==, "");
    }
}

static void
test_gated (void)
{
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/gated", NULL);
  check_error (&r, "acme/gated is gated", "HF_TOKEN");

  g_setenv ("HF_TOKEN", "hf_wrong", TRUE);
  g_auto (StowRun) w = { 0 };
  stow_run (&w, "model", "acme/gated", NULL);
  check_error (&w, "your token has no access", "request access");

  g_setenv ("HF_TOKEN", TOKEN, TRUE);
  g_auto (StowRun) ok = { 0 };
  stow_run (&ok, "model", "acme/gated", NULL);
  g_assert_cmpint (ok.status, ==, 0);

  /* The token file huggingface-cli login writes. */
  fresh_env ();
  g_autofree char *home = g_strdup (g_getenv ("HF_HOME"));
  g_assert_cmpint (g_mkdir_with_parents (home, 0700), ==, 0);
  g_autofree char *tok = g_build_filename (home, "token", NULL);
  g_assert_true (g_file_set_contents (tok, TOKEN "\n", -1, NULL));
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "model", "acme/gated", NULL);
  g_assert_cmpint (f.status, ==, 0);
}

static void
test_missing_private (void)
{
  fresh_env ();
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "model", "acme/missing", NULL);
  check_error (&m, "acme/missing: no such model", "HTTP 404");
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "model", "acme/private", NULL);
  check_error (&p, "not found, private or gated", "set HF_TOKEN");
  g_setenv ("HF_TOKEN", TOKEN, TRUE);
  g_auto (StowRun) t = { 0 };
  stow_run (&t, "model", "acme/private", NULL);
  check_error (&t, "HF_TOKEN was refused", NULL);
  g_auto (StowRun) e = { 0 };
  stow_run (&e, "model", "acme/server-error", NULL);
  check_error (&e, "HTTP 500", NULL);
  /* A repository without a config.json. */
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "model", "acme/dataset-like", NULL);
  check_error (&n, "has no config.json", NULL);
}

static void
test_revision (void)
{
  fresh_env ();
  g_auto (StowRun) v = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  stow_run (&v, "model", "acme/tiny", "--revision", "v1", "--json", NULL);
  g_assert_cmpint (v.status, ==, 0);
  g_assert_cmpstr (
      json_object_get_string_member (parse_object (v.out, p), "revision"), ==,
      "v1");
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "model", "acme/tiny", "--revision", "nope", NULL);
  check_error (&n, "no revision \"nope\"", "--revision");
  const char *bad[][6] = {
    { "model", "acme/tiny", "--revision", "../x", NULL },
    { "model", "llama-2-7b", "--revision", "main", NULL },
    { "fit", "llama-2-7b", "--gpus", "8xA100-80GB", "--revision", "main" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_auto (StowRun) b = { 0 };
      const char *args[8] = { 0 };
      for (gsize j = 0; j < 6 && bad[i][j]; j++)
        args[j] = bad[i][j];
      stow_runv (&b, args);
      check_error (&b, "--revision", NULL);
    }
}

static void
test_slow (void)
{
  fresh_env ();
  g_setenv ("STOW_HUB_TIMEOUT", "0.5", TRUE);
  gint64 t0 = g_get_monotonic_time ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/slow", NULL);
  check_error (&r, "did not answer within 0.5 s", "STOW_HUB_TIMEOUT");
  g_assert_cmpint (g_get_monotonic_time () - t0, <, 2 * G_USEC_PER_SEC);
}

static void
test_redirect (void)
{
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/moved", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (g_str_has_prefix (r.out, "acme/moved (llama)"));
}

static void
test_malformed (void)
{
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/broken", NULL);
  check_error (&r, "acme/broken@main: config.json", NULL);
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "model", "acme/badfield", NULL);
  check_error (&f, "hidden_size", NULL);
  /* Neither was cached. */
  g_setenv ("HF_HUB_OFFLINE", "1", TRUE);
  g_auto (StowRun) o = { 0 };
  stow_run (&o, "model", "acme/broken", NULL);
  check_error (&o, "HF_HUB_OFFLINE", NULL);
}

static void
test_no_network (void)
{
  fresh_env ();
  g_setenv ("HF_ENDPOINT", "http://127.0.0.1:1", TRUE);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "acme/tiny", NULL);
  check_error (&r, "cannot reach http://127.0.0.1:1", "HF_HUB_OFFLINE=1");
}

static void
test_bad_environment (void)
{
  static const struct
  {
    const char *var, *value, *fragment;
  } cases[] = {
    { "HF_ENDPOINT", "ftp://example.org", "HF_ENDPOINT" },
    { "HF_ENDPOINT", "http://a b", "HF_ENDPOINT" },
    { "STOW_HUB_TIMEOUT", "soon", "STOW_HUB_TIMEOUT \"soon\"" },
    { "STOW_HUB_TIMEOUT", "-1", "STOW_HUB_TIMEOUT" },
    { "HF_TOKEN", "a\nb", "HF_TOKEN" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      fresh_env ();
      g_setenv (cases[i].var, cases[i].value, TRUE);
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "model", "acme/tiny", NULL);
      check_error (&r, cases[i].fragment, NULL);
    }
  /* Not a Hub id and not a file: the old error. */
  fresh_env ();
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "./no/such/config", NULL);
  g_assert_cmpint (r.status, ==, 2);
}

/* ---- train --model ORG/NAME: the snapshot download ------------------------
 */

static Repo *
repo_named (const char *name)
{
  for (guint i = 0; i < srv.repos->len; i++)
    {
      Repo *r = g_ptr_array_index (srv.repos, i);
      if (g_str_equal (r->repo, name))
        return r;
    }
  g_assert_not_reached ();
}

static void
repo_file_free (gpointer p)
{
  RepoFile *f = p;
  g_free (f->name);
  g_bytes_unref (f->data);
  g_free (f->etag);
  g_free (f);
}

static void
repo_add_file (Repo *r, const char *name, GBytes *data)
{
  RepoFile *f = g_new0 (RepoFile, 1);
  f->name = g_strdup (name);
  f->data = g_bytes_ref (data);
  /* The Hub keeps weights in LFS, small text files in git. */
  f->lfs = g_str_has_suffix (name, ".safetensors");
  f->etag = f->lfs ? g_compute_checksum_for_bytes (G_CHECKSUM_SHA256, data)
                   : git_blob_sha1 (data);
  g_ptr_array_add (r->files, f);
}

static void
repo_add_text (Repo *r, const char *name, const char *text)
{
  g_autoptr (GBytes) b = g_bytes_new (text, strlen (text));
  repo_add_file (r, name, b);
}

/* A repository of every file in @dir (a checkpoint init-model wrote). */
static Repo *
repo_new (const char *name, const char *dir)
{
  Repo *r = g_new0 (Repo, 1);
  r->repo = name;
  r->files = g_ptr_array_new_with_free_func (repo_file_free);
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  g_assert_nonnull (d);
  const char *e;
  while ((e = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *path = g_build_filename (dir, e, NULL);
      char *data = NULL;
      gsize len = 0;
      g_assert_true (g_file_get_contents (path, &data, &len, NULL));
      g_autoptr (GBytes) b = g_bytes_new_take (data, len);
      repo_add_file (r, e, b);
    }
  g_ptr_array_add (srv.repos, r);
  return r;
}

static void
repo_free (gpointer p)
{
  Repo *r = p;
  g_ptr_array_unref (r->files);
  g_free (r);
}

/* The shard the tests train on, written once. */
static const char *
data_shard (void)
{
  static char *path;
  if (path == NULL)
    {
      path = g_build_filename (srv.dir, "train.bin", NULL);
      write_shard (path, 20240520, 1, 4096, 4096, 300);
    }
  return path;
}

/* One step of train on @model into a fresh directory (returned). */
static char *
train_hub (StowRun *r, const char *model, const char *extra)
{
  static guint n;
  char *out = g_strdup_printf ("%s/out-%u", srv.dir, ++n);
  const char *args[]
      = { "train", "--model",   model,     "--data", data_shard (),
          "--out", out,         "--steps", "1",      "--seq",
          "16",    "--threads", "1",       extra,    extra ? "x" : NULL,
          NULL };
  if (extra && g_str_equal (extra, "--revision"))
    args[14] = COMMIT;
  stow_runv (r, args);
  return out;
}

static char *repo_path (const char *repo, const char *first,
                        ...) G_GNUC_NULL_TERMINATED;

/* HF_HOME/hub/models--ORG--NAME/FIRST/... */
static char *
repo_path (const char *repo, const char *first, ...)
{
  g_autofree char *fixed
      = g_strdup_printf ("models--%.*s--%s", (int)(strchr (repo, '/') - repo),
                         repo, strchr (repo, '/') + 1);
  GString *p = g_string_new (NULL);
  g_string_append_printf (p, "%s/hub/%s", g_getenv ("HF_HOME"), fixed);
  va_list ap;
  va_start (ap, first);
  for (const char *s = first; s; s = va_arg (ap, const char *))
    g_string_append_printf (p, "/%s", s);
  va_end (ap);
  return g_string_free (p, FALSE);
}

static gboolean
path_exists_no_follow (const char *path)
{
  GStatBuf st;
  return g_lstat (path, &st) == 0;
}

/* huggingface_hub's layout: refs/main the commit; each file a relative
 * link from the snapshot to blobs/ETAG holding its bytes; the optional
 * files the repository lacks marked in .no_exist; nothing half done. */
static void
assert_cache_layout (const Repo *r)
{
  g_autofree char *ref = repo_path (r->repo, "refs", "main", NULL);
  g_autofree char *commit = NULL;
  g_assert_true (g_file_get_contents (ref, &commit, NULL, NULL));
  g_assert_cmpstr (commit, ==, COMMIT);
  for (guint i = 0; i < r->files->len; i++)
    {
      const RepoFile *f = g_ptr_array_index (r->files, i);
      g_autofree char *link
          = repo_path (r->repo, "snapshots", COMMIT, f->name, NULL);
      g_autofree char *target = g_file_read_link (link, NULL);
      g_autofree char *want = g_strdup_printf ("../../blobs/%s", f->etag);
      g_assert_cmpstr (target, ==, want);
      g_autofree char *blob = repo_path (r->repo, "blobs", f->etag, NULL);
      char *data = NULL;
      gsize len = 0;
      g_assert_true (g_file_get_contents (blob, &data, &len, NULL));
      g_autoptr (GBytes) b = g_bytes_new_take (data, len);
      g_assert_true (g_bytes_equal (b, f->data));
    }
  static const char *const absent[]
      = { "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.model" };
  for (gsize i = 0; i < G_N_ELEMENTS (absent); i++)
    {
      g_autofree char *mark
          = repo_path (r->repo, ".no_exist", COMMIT, absent[i], NULL);
      g_assert_true (g_file_test (mark, G_FILE_TEST_IS_REGULAR));
    }
  g_autofree char *blobs = repo_path (r->repo, "blobs", NULL);
  g_autoptr (GDir) d = g_dir_open (blobs, 0, NULL);
  g_assert_nonnull (d);
  guint n = 0;
  for (const char *e; (e = g_dir_read_name (d)) != NULL; n++)
    g_assert_false (g_str_has_suffix (e, ".incomplete"));
  g_assert_cmpuint (n, ==, r->files->len);
}

/* The blob sha1 is git's own: `git hash-object /dev/null` prints it. */
static void
test_git_blob_sha1 (void)
{
  g_autoptr (GBytes) empty = g_bytes_new (NULL, 0);
  g_autofree char *id = git_blob_sha1 (empty);
  g_assert_cmpstr (id, ==, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

static void
test_download (void)
{
  fresh_env ();
  g_setenv ("HF_TOKEN", TOKEN, TRUE);
  const Repo *repo = repo_named ("acme/train");
  gint cdn = g_atomic_int_get (&srv.cdn_requests);
  gint cdn_token = g_atomic_int_get (&srv.cdn_with_token);
  gint hub_token = g_atomic_int_get (&srv.hub_with_token);
  gint by_branch = g_atomic_int_get (&srv.by_branch);
  g_auto (StowRun) r = { 0 };
  g_autofree char *out = train_hub (&r, "acme/train", NULL);
  g_assert_cmpint (r.status, ==, 0);
  /* A line per file on a pipe, and each LFS file once from the CDN,
   * without the token the Hub got. */
  guint lfs = 0;
  for (guint i = 0; i < repo->files->len; i++)
    {
      const RepoFile *f = g_ptr_array_index (repo->files, i);
      g_autofree char *line
          = g_strdup_printf ("acme/train: downloaded %s, ", f->name);
      g_assert_nonnull (strstr (r.err, line));
      lfs += f->lfs;
    }
  g_assert_cmpuint (lfs, >=, 2);
  g_assert_cmpint (g_atomic_int_get (&srv.cdn_requests) - cdn, ==, lfs);
  g_assert_cmpint (g_atomic_int_get (&srv.cdn_with_token), ==, cdn_token);
  g_assert_cmpint (g_atomic_int_get (&srv.hub_with_token), >, hub_token);
  /* main is resolved once (the config's HEAD); every other file is asked
   * for at that commit. */
  g_assert_cmpint (g_atomic_int_get (&srv.by_branch) - by_branch, ==, 1);
  assert_cache_layout (repo);
  /* It trained, named as the Hub names it, and the checkpoint carries the
   * model's tokenizer. */
  g_assert_nonnull (strstr (r.err, "planned layout: acme/train on cpu"));
  g_assert_cmpuint (latest_step (out), ==, 1);
  g_autofree char *tok = contents (out, "tokenizer.json");
  g_assert_cmpstr (tok, ==, repo_tokenizer);

  /* Again: the snapshot is complete, no request at all. */
  gint before = g_atomic_int_get (&srv.requests);
  g_auto (StowRun) again = { 0 };
  g_autofree char *out2 = train_hub (&again, "acme/train", NULL);
  g_assert_cmpint (again.status, ==, 0);
  g_assert_null (strstr (again.err, "downloaded"));
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);
  /* --revision names the same snapshot by its commit. */
  g_auto (StowRun) rev = { 0 };
  g_autofree char *out3 = train_hub (&rev, "acme/train", "--revision");
  g_assert_cmpint (rev.status, ==, 0);
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);
}

/* A snapshot `huggingface-cli download` left (plain files, no .no_exist
 * marks) is used as it is: online with no request for what it has,
 * offline with none at all; without a shard, offline, it is refused by
 * name. */
static void
test_download_offline (void)
{
  fresh_env ();
  const Repo *repo = repo_named ("acme/train");
  g_autofree char *snap = repo_path (repo->repo, "snapshots", COMMIT, NULL);
  g_autofree char *refs = repo_path (repo->repo, "refs", NULL);
  g_assert_cmpint (g_mkdir_with_parents (snap, 0755), ==, 0);
  g_assert_cmpint (g_mkdir_with_parents (refs, 0755), ==, 0);
  g_autofree char *ref = g_build_filename (refs, "main", NULL);
  g_assert_true (g_file_set_contents (ref, COMMIT, -1, NULL));
  const char *shard = NULL;
  for (guint i = 0; i < repo->files->len; i++)
    {
      const RepoFile *f = g_ptr_array_index (repo->files, i);
      g_autofree char *path = g_build_filename (snap, f->name, NULL);
      g_assert_true (
          g_file_set_contents (path, g_bytes_get_data (f->data, NULL),
                               (gssize)g_bytes_get_size (f->data), NULL));
      if (f->lfs)
        shard = f->name;
    }
  /* Online, only the optional files it may lack are asked about (a HEAD
   * each, at the snapshot's commit), then marked absent. */
  gint before = g_atomic_int_get (&srv.requests);
  gint cdn = g_atomic_int_get (&srv.cdn_requests);
  gint by_branch = g_atomic_int_get (&srv.by_branch);
  g_auto (StowRun) online = { 0 };
  g_autofree char *out0 = train_hub (&online, "acme/train", NULL);
  g_assert_cmpint (online.status, ==, 0);
  g_assert_cmpint (g_atomic_int_get (&srv.requests) - before, ==, 3);
  g_assert_cmpint (g_atomic_int_get (&srv.cdn_requests), ==, cdn);
  g_assert_cmpint (g_atomic_int_get (&srv.by_branch), ==, by_branch);
  g_autofree char *mark
      = repo_path (repo->repo, ".no_exist", COMMIT, "tokenizer.model", NULL);
  g_assert_true (g_file_test (mark, G_FILE_TEST_IS_REGULAR));

  g_setenv ("HF_HUB_OFFLINE", "1", TRUE);
  g_setenv ("HF_ENDPOINT", "http://127.0.0.1:1", TRUE);
  before = g_atomic_int_get (&srv.requests);
  g_auto (StowRun) r = { 0 };
  g_autofree char *out = train_hub (&r, "acme/train", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpuint (latest_step (out), ==, 1);

  g_autofree char *gone = g_build_filename (snap, shard, NULL);
  g_assert_cmpint (g_unlink (gone), ==, 0);
  g_auto (StowRun) m = { 0 };
  g_autofree char *out2 = train_hub (&m, "acme/train", NULL);
  check_error (&m, shard, "HF_HUB_OFFLINE");
  g_assert_nonnull (strstr (m.err, snap));
  g_assert_cmpint (g_atomic_int_get (&srv.requests), ==, before);
  /* And a model never downloaded. */
  g_auto (StowRun) n = { 0 };
  g_autofree char *out3 = train_hub (&n, "acme/other", NULL);
  check_error (&n, "acme/other@main is not in the Hugging Face cache",
               "HF_HUB_OFFLINE");
}

/* The last line of @err. */
static const char *
last_line (const char *err)
{
  gsize n = strlen (err);
  while (n > 0 && err[n - 1] == '\n')
    n--;
  while (n > 0 && err[n - 1] != '\n')
    n--;
  return err + n;
}

/* A transfer cut half way is resumed by the next run from where it
 * stopped (HTTP Range), and the blob is the file, byte for byte. */
static void
test_download_resume (void)
{
  fresh_env ();
  const Repo *repo = repo_named ("acme/train");
  const RepoFile *shard = NULL;
  for (guint i = 0; i < repo->files->len && shard == NULL; i++)
    if (((const RepoFile *)g_ptr_array_index (repo->files, i))->lfs)
      shard = g_ptr_array_index (repo->files, i);
  gsize cut = g_bytes_get_size (shard->data) / 3;
  g_mutex_lock (&srv.lock);
  srv.cut_file = g_strdup (shard->name);
  srv.cut_after = cut;
  g_mutex_unlock (&srv.lock);

  g_auto (StowRun) r = { 0 };
  g_autofree char *out = train_hub (&r, "acme/train", NULL);
  g_assert_cmpint (r.status, ==, 2);
  const char *err = last_line (r.err);
  g_assert_nonnull (strstr (err, shard->name));
  g_assert_nonnull (strstr (err, "the transfer stopped after"));
  g_assert_nonnull (strstr (err, "run the command again to resume"));
  g_autofree char *part_name = g_strconcat (shard->etag, ".incomplete", NULL);
  g_autofree char *part = repo_path (repo->repo, "blobs", part_name, NULL);
  GStatBuf st;
  g_assert_cmpint (g_stat (part, &st), ==, 0);
  g_assert_cmpint (st.st_size, ==, (goffset)cut);
  g_autofree char *link
      = repo_path (repo->repo, "snapshots", COMMIT, shard->name, NULL);
  g_assert_false (path_exists_no_follow (link));

  g_auto (StowRun) again = { 0 };
  g_autofree char *out2 = train_hub (&again, "acme/train", NULL);
  g_assert_cmpint (again.status, ==, 0);
  g_autofree char *resumed = NULL;
  guint64 from = 0;
  g_mutex_lock (&srv.lock);
  resumed = g_strdup (srv.last_range);
  g_mutex_unlock (&srv.lock);
  /* The one request with a Range. */
  g_assert_nonnull (resumed);
  g_assert_cmpint (sscanf (resumed, "bytes=%" G_GUINT64_FORMAT "-", &from), ==,
                   1);
  g_assert_cmpuint (from, >, 0);
  g_assert_cmpuint (from, ==, cut);
  g_assert_nonnull (strstr (again.err, "resumed at"));
  g_assert_false (path_exists_no_follow (part));
  assert_cache_layout (repo);
}

/* A file whose bytes do not match its etag is refused by name and leaves
 * nothing behind: no blob, no .incomplete, no link. */
static void
test_download_damaged (void)
{
  fresh_env ();
  const Repo *repo = repo_named ("acme/damaged");
  const RepoFile *st = NULL;
  for (guint i = 0; i < repo->files->len; i++)
    if (((const RepoFile *)g_ptr_array_index (repo->files, i))->lfs)
      st = g_ptr_array_index (repo->files, i);
  g_auto (StowRun) r = { 0 };
  g_autofree char *out = train_hub (&r, "acme/damaged", NULL);
  g_assert_cmpint (r.status, ==, 2);
  const char *err = last_line (r.err);
  g_assert_nonnull (strstr (err, "acme/damaged: model.safetensors:"));
  g_assert_nonnull (strstr (err, "sha256"));
  g_assert_nonnull (strstr (err, st->etag));
  g_autofree char *blob = repo_path (repo->repo, "blobs", st->etag, NULL);
  g_autofree char *part = g_strconcat (blob, ".incomplete", NULL);
  g_autofree char *link
      = repo_path (repo->repo, "snapshots", COMMIT, st->name, NULL);
  g_assert_false (path_exists_no_follow (blob));
  g_assert_false (path_exists_no_follow (part));
  g_assert_false (path_exists_no_follow (link));
  g_assert_false (g_file_test (out, G_FILE_TEST_EXISTS));
}

/* Refusals before any weights: gated without a token (by name, saying
 * what to do), a Hub that sends no ETag (as huggingface_hub refuses), a
 * config train cannot run, a bad --model or --revision. */
static void
test_download_refused (void)
{
  fresh_env ();
  g_auto (StowRun) g = { 0 };
  g_autofree char *o1 = train_hub (&g, "acme/gated", NULL);
  check_error (&g, "acme/gated is gated (HTTP 401)", "set HF_TOKEN");
  g_assert_nonnull (strstr (g.err, "a local model directory"));

  g_auto (StowRun) e = { 0 };
  g_autofree char *o2 = train_hub (&e, "acme/no-etag", NULL);
  check_error (&e, "acme/no-etag", "without an ETag");

  gint cdn = g_atomic_int_get (&srv.cdn_requests);
  g_auto (StowRun) c = { 0 };
  g_autofree char *o3 = train_hub (&c, "acme/gelu", NULL);
  g_assert_cmpint (c.status, ==, 2);
  g_assert_true (g_str_has_prefix (last_line (c.err),
                                   "stowage: acme/gelu: hidden_act \"gelu\""));
  g_assert_cmpint (g_atomic_int_get (&srv.cdn_requests), ==, cdn);

  g_auto (StowRun) n = { 0 };
  g_autofree char *o4 = train_hub (&n, "./no/such/dir", NULL);
  check_error (&n, "--model \"./no/such/dir\": no such directory", NULL);
  g_auto (StowRun) v = { 0 };
  g_autofree char *o5 = train_hub (&v, srv.dir, "--revision");
  check_error (&v, "--revision applies to Hub ids", NULL);
}

/* init-model takes a Hub id: only its config.json is fetched. */
static void
test_init_model (void)
{
  fresh_env ();
  g_autofree char *out = g_build_filename (srv.dir, "init-hub", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "init-model", "acme/tiny", "--revision", "v1", "-o", out, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *st = g_build_filename (out, "model.safetensors", NULL);
  g_assert_true (g_file_test (st, G_FILE_TEST_IS_REGULAR));
  /* The same weights as init-model from the file (seed 0). */
  char *data = NULL;
  gsize len = 0;
  g_assert_true (g_file_get_contents (st, &data, &len, NULL));
  g_autoptr (GBytes) b = g_bytes_new_take (data, len);
  g_assert_true (g_bytes_equal (b, srv.tiny_st));

  g_autofree char *cfg = g_build_filename (srv.dir, "tiny.json", NULL);
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "init-model", cfg, "--revision", "v1", "-o", out, NULL);
  check_error (&f, "--revision applies to Hub ids", NULL);
}

/* tokenize takes a Hub id: its config and tokenizer files come into the
 * Hugging Face cache, the weights do not (train --model fetches them). */
static void
test_tokenize (void)
{
  fresh_env ();
  gint cdn = g_atomic_int_get (&srv.cdn_requests);
  g_autofree char *text = g_build_filename (srv.dir, "words.txt", NULL);
  const char *words = "The model fits on one GPU with its optimizer offloaded.";
  g_assert_true (g_file_set_contents (text, words, -1, NULL));
  g_autofree char *prefix = g_build_filename (srv.dir, "tok-hub", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", "acme/tok", "--out", prefix, text,
            NULL);
  g_test_message ("%s", r.err);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.err, "acme/tok: downloaded tokenizer.json"));
  g_assert_cmpint (g_atomic_int_get (&srv.cdn_requests), ==, cdn);
  g_autofree char *tok
      = repo_path ("acme/tok", "snapshots", COMMIT, "tokenizer.json", NULL);
  g_assert_true (g_file_test (tok, G_FILE_TEST_IS_REGULAR));
  g_autofree char *st
      = repo_path ("acme/tok", "snapshots", COMMIT, "model.safetensors", NULL);
  g_assert_false (path_exists_no_follow (st));
  /* The same tokens as from the tokenizer's own file. */
  g_autofree char *prefix2 = g_build_filename (srv.dir, "tok-file", NULL);
  g_auto (StowRun) r2 = { 0 };
  stow_run (&r2, "tokenize", "--tokenizer", tok, "--out", prefix2, text, NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_autofree char *a = g_strconcat (prefix, "_train.bin", NULL);
  g_autofree char *b = g_strconcat (prefix2, "_train.bin", NULL);
  g_autoptr (GBytes) ba = stow_test_read_file (a);
  g_autoptr (GBytes) bb = stow_test_read_file (b);
  g_assert_true (g_bytes_equal (ba, bb));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_autoptr (GError) error = NULL;
  srv.dir = g_dir_make_tmp ("stow-hub-XXXXXX", &error);
  g_assert_no_error (error);

  /* A real checkpoint of the tiny model, as stowage writes it. */
  g_autofree char *cfg = g_build_filename (srv.dir, "tiny.json", NULL);
  g_autofree char *out = g_build_filename (srv.dir, "tiny", NULL);
  g_autofree char *st = g_build_filename (out, "model.safetensors", NULL);
  g_assert_true (g_file_set_contents (cfg, tiny_config, -1, NULL));
  {
    g_auto (StowRun) r = { 0 };
    stow_run (&r, "init-model", cfg, "-o", out, NULL);
    g_assert_cmpint (r.status, ==, 0);
  }
  char *data = NULL;
  gsize len = 0;
  g_assert_true (g_file_get_contents (st, &data, &len, NULL));
  srv.tiny_st = g_bytes_new_take (data, len);
  g_autofree char *qwen = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                 "qwen2-7b.json", NULL);
  g_assert_true (g_file_get_contents (qwen, &srv.qwen_config, NULL, NULL));

  /* Repositories served file by file: the tiny model in shards with a
   * tokenizer, and the same model damaged on the CDN, without etags, and
   * with a config train does not run. */
  srv.repos = g_ptr_array_new_with_free_func (repo_free);
  g_autofree char *sharded = g_build_filename (srv.dir, "sharded", NULL);
  {
    g_auto (StowRun) r = { 0 };
    stow_run (&r, "init-model", cfg, "-o", sharded, "--max-shard-size", "150KB",
              NULL);
    g_assert_cmpint (r.status, ==, 0);
  }
  Repo *train = repo_new ("acme/train", sharded);
  repo_add_text (train, "tokenizer.json", repo_tokenizer);
  repo_add_text (train, "generation_config.json",
                 "{\"bos_token_id\": 1, \"eos_token_id\": 2}");
  repo_new ("acme/damaged", out)->damaged = TRUE;
  repo_new ("acme/no-etag", out)->no_etag = TRUE;
  /* A model whose tokenizer is real (Phi-3-mini's). */
  Repo *tok = repo_new ("acme/tok", out);
  const char *const tok_files[] = { "tokenizer.json", "tokenizer_config.json" };
  for (guint i = 0; i < G_N_ELEMENTS (tok_files); i++)
    {
      g_autofree char *path
          = stow_test_fixture ("tokenizers", "phi3-mini", tok_files[i], NULL);
      g_autoptr (GBytes) bytes = stow_test_read_file (path);
      repo_add_file (tok, tok_files[i], bytes);
    }
  Repo *gelu = repo_new ("acme/gelu", out);
  for (guint i = 0; i < gelu->files->len; i++)
    if (g_str_equal (((RepoFile *)g_ptr_array_index (gelu->files, i))->name,
                     "config.json"))
      g_ptr_array_remove_index (gelu->files, i--);
  g_autofree char *gelu_cfg = g_strdup (tiny_config);
  gelu_cfg[strlen (gelu_cfg) - 1] = '\0';
  g_autofree char *gelu_text
      = g_strdup_printf ("%s,\"hidden_act\":\"gelu\"}", gelu_cfg);
  repo_add_text (gelu, "config.json", gelu_text);
  server_start ();

  g_test_add_func ("/hub/public", test_public);
  g_test_add_func ("/hub/cache-hit", test_cache_hit);
  g_test_add_func ("/hub/hf-cache", test_hf_cache);
  g_test_add_func ("/hub/header-mismatch", test_header_mismatch);
  g_test_add_func ("/hub/index", test_index);
  g_test_add_func ("/hub/bad-checkpoint-files", test_bad_checkpoint_files);
  g_test_add_func ("/hub/gated", test_gated);
  g_test_add_func ("/hub/missing-private", test_missing_private);
  g_test_add_func ("/hub/revision", test_revision);
  g_test_add_func ("/hub/slow", test_slow);
  g_test_add_func ("/hub/redirect", test_redirect);
  g_test_add_func ("/hub/malformed", test_malformed);
  g_test_add_func ("/hub/no-network", test_no_network);
  g_test_add_func ("/hub/bad-environment", test_bad_environment);
  g_test_add_func ("/hub/git-blob-sha1", test_git_blob_sha1);
  g_test_add_func ("/hub/tokenize", test_tokenize);
  g_test_add_func ("/hub/download", test_download);
  g_test_add_func ("/hub/download-offline", test_download_offline);
  g_test_add_func ("/hub/download-resume", test_download_resume);
  g_test_add_func ("/hub/download-damaged", test_download_damaged);
  g_test_add_func ("/hub/download-refused", test_download_refused);
  g_test_add_func ("/hub/init-model", test_init_model);
  int status = g_test_run ();

  g_main_loop_quit (srv.loop);
  g_thread_join (srv.thread);
  g_main_loop_unref (srv.loop);
  g_object_unref (srv.service);
  g_bytes_unref (srv.tiny_st);
  g_ptr_array_unref (srv.repos);
  g_free (srv.last_range);
  g_free (srv.cut_file);
  g_free (srv.qwen_config);
  {
    g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", srv.dir);
    g_assert_true (g_spawn_command_line_sync (rm, NULL, NULL, NULL, NULL));
  }
  g_free (srv.dir);
  return status;
}
