/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-hub.c: models by Hub id as a user runs them, against an
 * HTTP server this test starts on 127.0.0.1 (GIO, one thread per
 * connection) that answers as the Hub does: a public repository, a gated
 * one, a missing one, a slow one, redirects (a renamed repository, LFS
 * files on a CDN), a malformed config, safetensors indices and a real
 * safetensors file read by HTTP Range.  No network.
 */
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

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

/* Qwen2-7B's model.safetensors.index.json total_size: 7,615,616,512
 * parameters (tests/test-models.c, published) at bfloat16. */
static const char *const qwen_index
    = "{\"metadata\":{\"total_size\":15231233024},\"weight_map\":{}}";
static const char *const qwen_index_off
    = "{\"metadata\":{\"total_size\":15231233000},\"weight_map\":{}}";

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
  if (len)
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

/* Serves @b, or the byte range "bytes=A-B" of it. */
static void
serve_bytes (GOutputStream *out, GBytes *b, const char *range)
{
  gsize len;
  const guint8 *data = g_bytes_get_data (b, &len);
  guint64 a, z;
  if (range
      && sscanf (range, "bytes=%" G_GUINT64_FORMAT "-%" G_GUINT64_FORMAT, &a,
                 &z)
             == 2)
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
      respond (out, 206, "Partial Content", h, data + a, (gsize)(z - a + 1));
      return;
    }
  respond (out, 200, "OK", NULL, data, len);
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
  if (g_strv_length (parts) < 2 || strcmp (parts[0], "GET") != 0)
    {
      respond_text (out, 400, "Bad Request", NULL, "");
      return FALSE;
    }
  const char *path = parts[1];
  const char *commit = "X-Repo-Commit: " COMMIT "\r\n";

  if (g_str_equal (path, "/acme/tiny/resolve/main/config.json")
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
    serve_bytes (out, srv.tiny_st, range);
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
      serve_bytes (out, b, range);
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
  int status = g_test_run ();

  g_main_loop_quit (srv.loop);
  g_thread_join (srv.thread);
  g_main_loop_unref (srv.loop);
  g_object_unref (srv.service);
  g_bytes_unref (srv.tiny_st);
  g_free (srv.qwen_config);
  {
    g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", srv.dir);
    g_assert_true (g_spawn_command_line_sync (rm, NULL, NULL, NULL, NULL));
  }
  g_free (srv.dir);
  return status;
}
