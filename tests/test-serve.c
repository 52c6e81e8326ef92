/* SPDX-License-Identifier: MIT
 *
 * tests/test-serve.c: `stowage serve` as its clients see it, over HTTP on
 * the loopback address: every endpoint's answer against the CLI's output
 * for the same question, byte for byte; failures as JSON with the status
 * that fits and the parameter named; the bounds (body, query, top,
 * simulated passes, workers, queue, time) answered 413/414/400/503 and
 * never a crash; the page served while the workers are busy; and a load
 * of 16 clients x 200 requests with no error, its p99 latency printed and
 * the server's memory flat across it.
 */
#include <libsoup/soup.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "tests/testutil.h"

/* ---- a server in a child process ---------------------------------------- */

typedef struct
{
  GSubprocess *proc;
  char *url; /* "http://127.0.0.1:PORT/" */
} Serve;

/* A failed assertion ends the test: the server goes with it, not on
 * holding the test's stderr open until the harness times out. */
static void
die_with_parent (gpointer data)
{
  prctl (PR_SET_PDEATHSIG, SIGKILL);
}

static void
serve_start (Serve *s, const char *const *extra)
{
  const char *exe = g_getenv ("STOWAGE");
  g_assert_nonnull (exe);
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_ptr_array_add (argv, (gpointer)exe);
  g_ptr_array_add (argv, "serve");
  g_ptr_array_add (argv, "--port");
  g_ptr_array_add (argv, "0");
  for (guint i = 0; extra && extra[i]; i++)
    g_ptr_array_add (argv, (gpointer)extra[i]);
  g_ptr_array_add (argv, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (GSubprocessLauncher) l
      = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_subprocess_launcher_set_child_setup (l, die_with_parent, NULL, NULL);
  /* A critical (a libsoup call on a message whose client left) is a bug:
   * the server aborts, and the next request here fails. */
  g_subprocess_launcher_setenv (l, "G_DEBUG", "gc-friendly,fatal-criticals",
                                TRUE);
  s->proc = g_subprocess_launcher_spawnv (l, (const char *const *)argv->pdata,
                                          &error);
  g_assert_no_error (error);
  /* The first line names the URL (the port was picked free). */
  g_autoptr (GDataInputStream) in
      = g_data_input_stream_new (g_subprocess_get_stdout_pipe (s->proc));
  g_autofree char *line
      = g_data_input_stream_read_line (in, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_nonnull (line);
  const char *u = strstr (line, "http://127.0.0.1:");
  g_assert_nonnull (u);
  s->url = g_strndup (u, strcspn (u, " "));
  g_assert_true (g_str_has_suffix (s->url, "/"));
  g_test_message ("server: %s", line);
}

/* SIGTERM ends it cleanly: exit 0 (and, under ASan, no leak). */
static void
serve_stop (Serve *s)
{
  g_autoptr (GError) error = NULL;
  g_subprocess_send_signal (s->proc, SIGTERM);
  g_assert_true (g_subprocess_wait (s->proc, NULL, &error));
  g_assert_no_error (error);
  g_assert_true (g_subprocess_get_if_exited (s->proc));
  g_assert_cmpint (g_subprocess_get_exit_status (s->proc), ==, 0);
  g_clear_object (&s->proc);
  g_clear_pointer (&s->url, g_free);
}

static guint64
serve_rss_bytes (const Serve *s)
{
  g_autofree char *path = g_strdup_printf (
      "/proc/%s/status", g_subprocess_get_identifier (s->proc));
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  const char *p = strstr (text, "VmRSS:");
  g_assert_nonnull (p);
  return g_ascii_strtoull (p + 6, NULL, 10) * 1024;
}

/* The server's user and system CPU seconds so far. */
static double
serve_cpu_s (const Serve *s)
{
  g_autofree char *path = g_strdup_printf (
      "/proc/%s/stat", g_subprocess_get_identifier (s->proc));
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  /* after "(comm) ": state, then utime and stime are the 12th and 13th */
  const char *p = strrchr (text, ')');
  g_assert_nonnull (p);
  g_auto (GStrv) f = g_strsplit (p + 2, " ", 16);
  g_assert_cmpuint (g_strv_length (f), >=, 13);
  double ticks = (double)sysconf (_SC_CLK_TCK);
  return (double)(g_ascii_strtoull (f[11], NULL, 10)
                  + g_ascii_strtoull (f[12], NULL, 10))
         / ticks;
}

/* ---- HTTP ---------------------------------------------------------------- */

typedef struct
{
  guint status;
  GBytes *body;
  SoupMessageHeaders *headers;
} Reply;

static void
reply_clear (Reply *r)
{
  g_clear_pointer (&r->body, g_bytes_unref);
  g_clear_pointer (&r->headers, soup_message_headers_unref);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Reply, reply_clear)

static char *
reply_string (const Reply *r)
{
  gsize n;
  const char *d = g_bytes_get_data (r->body, &n);
  return g_strndup (d, n);
}

static const char *
header (const Reply *r, const char *name)
{
  return soup_message_headers_get_one (r->headers, name);
}

static void
http (SoupSession *session, const char *method, const char *url,
      const char *content_type, const char *body, gsize len, Reply *r)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (SoupMessage) msg = soup_message_new (method, url);
  g_assert_nonnull (msg);
  if (body != NULL)
    {
      g_autoptr (GBytes) b = g_bytes_new (body, len);
      soup_message_set_request_body_from_bytes (msg, content_type, b);
    }
  r->body = soup_session_send_and_read (session, msg, NULL, &error);
  g_assert_no_error (error);
  r->status = soup_message_get_status (msg);
  r->headers
      = soup_message_headers_ref (soup_message_get_response_headers (msg));
}

static SoupSession *
session_new (void)
{
  return soup_session_new_with_options ("timeout", 120, "max-conns", 64,
                                        "max-conns-per-host", 64, NULL);
}

/* ---- the API against the CLI ----------------------------------------------
 */

/* Wall-clock measurements in an answer, the one thing two runs of the
 * same question do not share. */
static char *
without_timings (const char *text)
{
  g_autoptr (GRegex) re = g_regex_new (
      "(\"(search_time_s|simulated_in_s)\" : |layouts evaluated in )"
      "[-0-9.e+]+",
      0, 0, NULL);
  return g_regex_replace (re, text, -1, 0, "\\10", 0, NULL);
}

typedef struct
{
  const char *endpoint, *query;
  const char *args[20];
  const char *type; /* the content type's start */
} Question;

static const Question questions[] = {
  /* fit: fits; does not fit (what would); LoRA; an MoE under DeepSpeed;
   * every offload; the configs; the report's other formats */
  { "fit",
    "model=llama-65b&gpus=8xA100-80GB",
    { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--json" },
    "application/json" },
  { "fit",
    "model=llama-65b&gpus=1xA100-80GB&offload-optimizer=none&offload-params="
    "none",
    { "fit", "llama-65b", "--gpus", "1xA100-80GB", "--offload-optimizer",
      "none", "--offload-params", "none", "--json" },
    "application/json" },
  { "fit",
    "model=llama-7b&gpus=8xH100-SXM&finetune=lora&micro-batch=2&seq=4k",
    { "fit", "llama-7b", "--gpus", "8xH100-SXM", "--finetune", "lora",
      "--micro-batch", "2", "--seq", "4k", "--json" },
    "application/json" },
  { "fit",
    "model=mixtral-8x7b&gpus=16xH100-SXM&engine=deepspeed&global-batch=64",
    { "fit", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--engine", "deepspeed",
      "--global-batch", "64", "--json" },
    "application/json" },
  { "fit",
    "model=llama-13b&gpus=8xA100-80GB&all-offloads=true",
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--all-offloads", "--json" },
    "application/json" },
  { "fit",
    "model=llama-65b&gpus=8xA100-80GB&emit=deepspeed",
    { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--emit", "deepspeed" },
    "application/json" },
  { "fit",
    "model=llama-65b&gpus=64xH100-SXM&emit=megatron&nvme-path=/scratch",
    { "fit", "llama-65b", "--gpus", "64xH100-SXM", "--emit", "megatron",
      "--nvme-path", "/scratch" },
    "text/plain" },
  { "fit",
    "model=llama-13b&gpus=8xA100-80GB&emit=fsdp",
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--emit", "fsdp" },
    "text/x-python" },
  { "fit",
    "model=llama-13b&gpus=8xA100-80GB&emit=accelerate",
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--emit", "accelerate" },
    "application/yaml" },
  { "fit",
    "model=llama-65b&gpus=8xA100-80GB&emit=plan",
    { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--emit", "plan" },
    "application/json" },
  { "fit",
    "model=llama-65b&gpus=8xA100-80GB&format=html",
    { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--format", "html" },
    "text/html" },
  { "fit",
    "model=llama-13b&gpus=8xA100-80GB&format=csv",
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--format", "csv" },
    "text/csv" },
  { "fit",
    "model=gpt2&gpus=1xA100-80GB&json=false",
    { "fit", "gpt2", "--gpus", "1xA100-80GB" },
    "text/plain" },
  /* plan */
  { "plan",
    "model=llama-65b&gpus=8xA100-80GB",
    { "plan", "llama-65b", "--gpus", "8xA100-80GB", "--json" },
    "application/json" },
  { "plan",
    "model=llama-65b&gpus=64xH100-SXM&global-batch=512&top=5&explain=1",
    { "plan", "llama-65b", "--gpus", "64xH100-SXM", "--global-batch", "512",
      "--top", "5", "--explain", "--json" },
    "application/json" },
  { "plan",
    "model=gpt2&gpus=4xA100-80GB&format=md",
    { "plan", "gpt2", "--gpus", "4xA100-80GB", "--format", "md" },
    "text/markdown" },
  /* mem: a pinned layout, a peer's convention with no model, Megatron */
  { "mem",
    "model=llama-7b&gpus=8xA100-80GB&zero=3",
    { "mem", "llama-7b", "--gpus", "8xA100-80GB", "--zero", "3", "--json" },
    "application/json" },
  { "mem",
    "params=7.5B&convention=zero-paper&gpus=64xA100-80GB&zero=3",
    { "mem", "--params", "7.5B", "--convention", "zero-paper", "--gpus",
      "64xA100-80GB", "--zero", "3", "--json" },
    "application/json" },
  { "mem",
    "model=llama-65b&gpus=64xA100-80GB&engine=megatron&tp=8&pp=2&explain=on",
    { "mem", "llama-65b", "--gpus", "64xA100-80GB", "--engine", "megatron",
      "--tp", "8", "--pp", "2", "--explain", "--json" },
    "application/json" },
  /* simulate */
  { "simulate",
    "model=gpt2&gpus=4xA100-80GB",
    { "simulate", "gpt2", "--gpus", "4xA100-80GB", "--json" },
    "application/json" },
  { "simulate",
    "model=llama-7b&gpus=8xA100-80GB&zero=3&global-batch=16&layer-major=0",
    { "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--zero", "3",
      "--global-batch", "16", "--json" },
    "application/json" },
  /* model, gpus, models */
  { "model",
    "model=llama-65b",
    { "model", "llama-65b", "--json" },
    "application/json" },
  { "model",
    "model=mixtral-8x7b&tensors=true",
    { "model", "mixtral-8x7b", "--tensors", "--json" },
    "application/json" },
  { "model",
    "model=flan-t5-base&json=no",
    { "model", "flan-t5-base" },
    "text/plain" },
  { "gpus", "", { "gpus", "--json" }, "application/json" },
  { "gpus",
    "gpus=4x8xH100-SXM",
    { "gpus", "--gpus", "4x8xH100-SXM", "--json" },
    "application/json" },
  { "gpus",
    "gpus=16xA100-80GB&json=false",
    { "gpus", "--gpus", "16xA100-80GB" },
    "text/plain" },
  { "models", "", { "models", "--json" }, "application/json" },
  { "models", "json=0", { "models" }, "text/plain" },
};

static void
check_same (const Reply *r, const StowRun *run, const char *what,
            const char *type)
{
  g_autofree char *body = reply_string (r);
  g_autofree char *a = without_timings (body);
  g_autofree char *b = without_timings (run->out);
  if (strcmp (a, b) != 0)
    g_test_message ("%s: the API answered %zu bytes, the CLI printed %zu", what,
                    strlen (a), strlen (b));
  g_assert_cmpstr (a, ==, b);
  g_assert_true (g_str_has_prefix (header (r, "Content-Type"), type));
  g_autofree char *code = g_strdup_printf ("%d", run->status);
  g_assert_cmpstr (header (r, "X-Stowage-Exit"), ==, code);
}

static Serve server;
static SoupSession *session;

static void
test_api_vs_cli (void)
{
  for (gsize i = 0; i < G_N_ELEMENTS (questions); i++)
    {
      const Question *q = &questions[i];
      g_autofree char *url
          = g_strdup_printf ("%sapi/%s?%s", server.url, q->endpoint, q->query);
      g_auto (Reply) r = { 0 };
      http (session, "GET", url, NULL, NULL, 0, &r);
      g_auto (StowRun) run = { 0 };
      stow_runv (&run, q->args);
      g_assert_cmpint (run.status, <=, 1);
      g_assert_cmpuint (r.status, ==, 200);
      check_same (&r, &run, url, q->type);
      /* Answers are never cached, and say what they are. */
      g_assert_cmpstr (header (&r, "Cache-Control"), ==, "no-store");
      g_assert_cmpstr (header (&r, "X-Content-Type-Options"), ==, "nosniff");
      if (strstr (q->query, "emit="))
        g_assert_true (g_str_has_prefix (header (&r, "Content-Disposition"),
                                         "attachment"));
    }
}

/* The same questions as JSON bodies: the same bytes. */
static void
test_api_json_body (void)
{
  static const struct
  {
    const char *endpoint, *body;
    const char *args[12];
  } posts[] = {
    { "fit",
      "{\"model\": \"llama-65b\", \"gpus\": \"8xA100-80GB\", \"micro-batch\": "
      "2, \"json\": true}",
      { "fit", "llama-65b", "--gpus", "8xA100-80GB", "--micro-batch", "2",
        "--json" } },
    { "plan",
      "{\"model\": \"llama-65b\", \"gpus\": \"8xA100-80GB\", \"top\": 3, "
      "\"seq\": \"4k\", \"explain\": null}",
      { "plan", "llama-65b", "--gpus", "8xA100-80GB", "--top", "3", "--seq",
        "4k", "--json" } },
    { "mem",
      "{\"model\": \"llama-7b\", \"gpus\": \"8xA100-80GB\", \"zero\": 2, "
      "\"fragmentation\": 0.1}",
      { "mem", "llama-7b", "--gpus", "8xA100-80GB", "--zero", "2",
        "--fragmentation", "0.1", "--json" } },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (posts); i++)
    {
      g_autofree char *url
          = g_strdup_printf ("%sapi/%s", server.url, posts[i].endpoint);
      g_auto (Reply) r = { 0 };
      http (session, "POST", url, "application/json", posts[i].body,
            strlen (posts[i].body), &r);
      g_auto (StowRun) run = { 0 };
      stow_runv (&run, posts[i].args);
      g_assert_cmpuint (r.status, ==, 200);
      check_same (&r, &run, posts[i].body, "application/json");
    }
}

/* A pasted config.json is the model, as the same file would be: in a
 * folder named config.json so that the CLI names the model as the
 * server does. */
static void
test_api_pasted_config (void)
{
  g_autofree char *src = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                "llama-7b.json", NULL);
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (src, &text, NULL, NULL));
  g_autofree char *tmp = g_dir_make_tmp ("stow-serve-XXXXXX", NULL);
  g_autofree char *dir = g_build_filename (tmp, "config.json", NULL);
  g_assert_cmpint (g_mkdir (dir, 0700), ==, 0);
  g_autofree char *path = g_build_filename (dir, "config.json", NULL);
  g_assert_true (g_file_set_contents (path, text, -1, NULL));

  static const char *const endpoints[] = { "fit", "plan", "mem" };
  for (gsize i = 0; i < G_N_ELEMENTS (endpoints); i++)
    {
      /* as a string, and as an object */
      for (int as_object = 0; as_object < 2; as_object++)
        {
          g_autoptr (JsonBuilder) b = json_builder_new ();
          json_builder_begin_object (b);
          json_builder_set_member_name (b, "gpus");
          json_builder_add_string_value (b, "8xA100-80GB");
          json_builder_set_member_name (b, "config");
          if (as_object)
            {
              g_autoptr (JsonNode) cfg = json_from_string (text, NULL);
              json_builder_add_value (b, g_steal_pointer (&cfg));
            }
          else
            json_builder_add_string_value (b, text);
          json_builder_end_object (b);
          g_autoptr (JsonNode) root = json_builder_get_root (b);
          g_autofree char *body = json_to_string (root, FALSE);
          g_autofree char *url
              = g_strdup_printf ("%sapi/%s", server.url, endpoints[i]);
          g_auto (Reply) r = { 0 };
          http (session, "POST", url, "application/json", body, strlen (body),
                &r);
          const char *args[]
              = { endpoints[i], path, "--gpus", "8xA100-80GB", "--json", NULL };
          g_auto (StowRun) run = { 0 };
          stow_runv (&run, args);
          g_assert_cmpuint (r.status, ==, 200);
          check_same (&r, &run, endpoints[i], "application/json");
        }
    }
  g_unlink (path);
  g_rmdir (dir);
  g_rmdir (tmp);
}

/* What the CLI warns on stderr beside an answer comes back as a header. */
static void
test_warnings (void)
{
  g_autofree char *url = g_strdup_printf (
      "%sapi/mem?model=llama-7b&gpus=1xA100-80GB&zero=3&offload-optimizer="
      "nvme&offload-params=nvme&emit=deepspeed",
      server.url);
  g_auto (Reply) r = { 0 };
  http (session, "GET", url, NULL, NULL, 0, &r);
  const char *args[] = { "mem",
                         "llama-7b",
                         "--gpus",
                         "1xA100-80GB",
                         "--zero",
                         "3",
                         "--offload-optimizer",
                         "nvme",
                         "--offload-params",
                         "nvme",
                         "--emit",
                         "deepspeed",
                         NULL };
  g_auto (StowRun) run = { 0 };
  stow_runv (&run, args);
  g_assert_cmpuint (r.status, ==, 200);
  check_same (&r, &run, url, "application/json");
  g_assert_nonnull (strstr (run.err, "a placeholder"));
  /* One header each, the warnings before the notes. */
  const char *w
      = soup_message_headers_get_list (r.headers, "X-Stowage-Warning");
  g_assert_nonnull (w);
  g_assert_nonnull (strstr (w, "the NVMe swap directory (nvme_path) is "
                               "/local_nvme, a placeholder"));
  /* What the config cannot carry of the optimizer settings (issue 43):
   * "note: ..." on the CLI's stderr, a header here. */
  const char *decay = "note: --emit deepspeed: ds_config.json cannot say "
                      "which tensors decay";
  g_assert_nonnull (strstr (run.err, decay));
  g_assert_nonnull (strstr (w, decay));
  g_assert_cmpstr (header (&r, "X-Stowage-Warning"), !=, w);
}

/* The training settings' flags (issue 43) are the API's parameters too:
 * the same config as the CLI's (their refusals: /serve/errors). */
static void
test_optim_params (void)
{
  g_autofree char *url = g_strdup_printf (
      "%sapi/fit?model=llama-7b&gpus=8xA100-80GB&engine=deepspeed&emit="
      "deepspeed&lr=3e-4&warmup=10&lr-schedule=cosine&min-lr=3e-5&steps="
      "100&max-grad-norm=0.5&weight-decay-on=all",
      server.url);
  g_auto (Reply) r = { 0 };
  http (session, "GET", url, NULL, NULL, 0, &r);
  const char *args[] = { "fit",
                         "llama-7b",
                         "--gpus",
                         "8xA100-80GB",
                         "--engine",
                         "deepspeed",
                         "--emit",
                         "deepspeed",
                         "--lr",
                         "3e-4",
                         "--warmup",
                         "10",
                         "--lr-schedule",
                         "cosine",
                         "--min-lr",
                         "3e-5",
                         "--steps",
                         "100",
                         "--max-grad-norm",
                         "0.5",
                         "--weight-decay-on",
                         "all",
                         NULL };
  g_auto (StowRun) run = { 0 };
  stow_runv (&run, args);
  g_assert_cmpint (run.status, ==, 0);
  g_assert_cmpuint (r.status, ==, 200);
  check_same (&r, &run, url, "application/json");
  g_autofree char *body = reply_string (&r);
  g_assert_nonnull (strstr (body, "\"gradient_clipping\" : 0.5"));
  g_assert_nonnull (strstr (body, "\"WarmupCosineLR\""));
}

/* ---- failures --------------------------------------------------------------
 */

/* Asserts @r failed with @status as JSON naming @field (NULL: any) and
 * holding @fragment. */
static void
check_error (const Reply *r, guint status, const char *field,
             const char *fragment)
{
  g_autofree char *body = reply_string (r);
  g_test_message ("%u %s", r->status, body);
  g_assert_cmpuint (r->status, ==, status);
  g_assert_true (
      g_str_has_prefix (header (r, "Content-Type"), "application/json"));
  g_autoptr (JsonNode) root = json_from_string (body, NULL);
  g_assert_nonnull (root);
  JsonObject *o = json_node_get_object (root);
  g_assert_cmpint (json_object_get_int_member (o, "status"), ==, status);
  const char *msg = json_object_get_string_member (o, "error");
  g_assert_nonnull (strstr (msg, fragment));
  if (field != NULL)
    g_assert_cmpstr (
        json_object_get_string_member_with_default (o, "field", "(none)"), ==,
        field);
}

static void
get (const char *path, Reply *r)
{
  g_autofree char *url = g_strdup_printf ("%s%s", server.url, path);
  http (session, "GET", url, NULL, NULL, 0, r);
}

static void
post (const char *path, const char *type, const char *body, gsize len, Reply *r)
{
  g_autofree char *url = g_strdup_printf ("%s%s", server.url, path);
  http (session, "POST", url, type, body, len, r);
}

static void
test_errors (void)
{
  static const struct
  {
    const char *path;
    guint status;
    const char *field, *fragment;
  } cases[] = {
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&micro_batch=2", 400,
      "micro_batch", "did you mean \"micro-batch\"" },
    { "api/fit?model=llama-65b&gpus=8xFOO", 400, "gpus", "unknown GPU" },
    { "api/fit?model=llama-65b", 400, "gpus", "no GPUs given" },
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&seq=-5", 400, "seq", "--seq" },
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&json=maybe", 400, "json",
      "true or false" },
    { "api/fit?model=lama-65b&gpus=8xA100-80GB", 404, "model",
      "did you mean \"llama-65b\"" },
    { "api/model?model=no-such-org/no-such-model", 404, "model", "" },
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&output=/tmp/x", 400, "output",
      "no files" },
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&chart=/tmp/x.svg", 400, "chart",
      "no files" },
    { "api/fit?plan=/etc/passwd", 400, "plan", "no files" },
    { "api/fit?model=llama-65b&cluster=/etc/passwd", 400, "cluster",
      "no files" },
    { "api/simulate?model=gpt2&gpus=1xA100-80GB&trace=/tmp/t.json", 400,
      "trace", "no files" },
    { "api/fit?model=llama-65b&gpus=local", 400, "gpus", "local" },
    { "api/fit?model=llama-65b&gpus=8xA100-80GB&lr=fast", 400, "lr",
      "expected a number" },
    { "api/mem?model=llama-65b&gpus=8xA100-80GB&lr-schedule=cosine", 400,
      "lr-schedule", "give --steps N" },
    { "api/fit?model=--output=/tmp/x&gpus=8xA100-80GB", 404, "model",
      "unknown model" },
    { "api/fit?model=llama-65b&model=llama-7b&gpus=8xA100-80GB", 400, NULL,
      "given twice" },
    { "api/plan?model=llama-65b&gpus=8xA100-80GB&top=5000", 400, "top",
      "1 to 1000" },
    { "api/simulate?model=llama-65b&gpus=8xA100-80GB&global-batch=8192", 400,
      NULL, "16,384" },
    { "api/models?model=llama-7b", 400, "model", "unknown parameter" },
    { "api/nope", 404, NULL, "the API has /api/fit" },
    { "api/fit?model=llama-65b&gpus=1xA100-80GB&offload-optimizer=none&"
      "offload-params=none&emit=deepspeed",
      422, NULL, "nothing to emit" },
    { "api/fit?model=a%00b&gpus=8xA100-80GB", 400, NULL, "NUL" },
    { "api/fit?model=%ff&gpus=8xA100-80GB", 400, NULL, "UTF-8" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_auto (Reply) r = { 0 };
      get (cases[i].path, &r);
      check_error (&r, cases[i].status, cases[i].field, cases[i].fragment);
      g_assert_cmpstr (header (&r, "Cache-Control"), ==, "no-store");
    }

  /* A config.json the server would read if it read paths: never. */
  g_autofree char *file = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                 "llama-7b.json", NULL);
  g_autofree char *esc = g_uri_escape_string (file, NULL, TRUE);
  g_autofree char *q = g_strdup_printf ("api/model?model=%s", esc);
  g_auto (Reply) by_path = { 0 };
  get (q, &by_path);
  check_error (&by_path, 404, "model", "not in the catalog");

  /* The bounds: a body over 4 MiB and 64 KiB is refused before it is
   * read, a query over 8 KiB too. */
  gsize big = ((gsize)4 << 20) + ((gsize)65 << 10);
  g_autofree char *blob = g_malloc (big);
  memset (blob, ' ', big);
  g_auto (Reply) r413 = { 0 };
  post ("api/fit", "application/json", blob, big, &r413);
  check_error (&r413, 413, NULL, "over the server's bound");
  g_autofree char *long_q = g_strnfill (9000, 'x');
  g_autofree char *p414 = g_strdup_printf ("api/fit?model=%s", long_q);
  g_auto (Reply) r414 = { 0 };
  get (p414, &r414);
  check_error (&r414, 414, NULL, "over the server's bound");

  /* Bodies: another type, not JSON, nested past the bound, not an
   * object, a value of the wrong kind, a pasted config beside a model. */
  g_auto (Reply) r415 = { 0 };
  post ("api/fit", "text/plain", "model=x", 7, &r415);
  check_error (&r415, 415, NULL, "application/json");
  static const struct
  {
    const char *body, *field, *fragment;
  } bodies[] = {
    { "{\"model\": ", NULL, "request body" },
    { "[1, 2]", NULL, "a JSON object of parameters" },
    { "{\"gpus\": [\"8xA100-80GB\"]}", NULL, "expected a string" },
    { "{\"model\": \"llama-7b\", \"config\": {\"model_type\": \"llama\"}, "
      "\"gpus\": \"8xA100-80GB\"}",
      "config", "both given" },
    { "{\"config\": \"{\\\"model_type\\\": 7}\", \"gpus\": \"8xA100-80GB\"}",
      "config", "config.json" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bodies); i++)
    {
      g_auto (Reply) r = { 0 };
      post ("api/fit", "application/json", bodies[i].body,
            strlen (bodies[i].body), &r);
      check_error (&r, 400, bodies[i].field, bodies[i].fragment);
    }
  GString *deep = g_string_new ("{\"model\": ");
  for (int i = 0; i < 200; i++)
    g_string_append_c (deep, '[');
  g_auto (Reply) rdeep = { 0 };
  post ("api/fit", "application/json", deep->str, deep->len, &rdeep);
  g_string_free (deep, TRUE);
  check_error (&rdeep, 400, NULL, "nest");

  g_autofree char *url = g_strdup_printf ("%sapi/models", server.url);
  g_auto (Reply) r405 = { 0 };
  http (session, "DELETE", url, NULL, NULL, 0, &r405);
  check_error (&r405, 405, NULL, "GET, HEAD and POST");
}

/* The page and its assets: one origin, no caching surprises, a policy
 * that lets nothing in from elsewhere. */
static void
test_page (void)
{
  static const struct
  {
    const char *path, *type, *holds;
  } assets[] = {
    { "", "text/html", "<form id=\"question\"" },
    { "app.js", "text/javascript", "/api/fit" },
    { "style.css", "text/css", "@media" },
    { "favicon.svg", "image/svg+xml", "<svg" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (assets); i++)
    {
      g_auto (Reply) r = { 0 };
      get (assets[i].path, &r);
      g_assert_cmpuint (r.status, ==, 200);
      g_assert_true (
          g_str_has_prefix (header (&r, "Content-Type"), assets[i].type));
      g_assert_cmpstr (header (&r, "Cache-Control"), ==, "no-cache");
      g_assert_nonnull (strstr (header (&r, "Content-Security-Policy"),
                                "default-src 'none'"));
      g_autofree char *body = reply_string (&r);
      g_assert_nonnull (strstr (body, assets[i].holds));
      /* no external assets */
      g_assert_null (strstr (body, "https://"));
    }
  g_auto (Reply) missing = { 0 };
  get ("etc/passwd", &missing);
  g_assert_cmpuint (missing.status, ==, 404);
}

/* ---- bounds on work ------------------------------------------------------ */

typedef struct
{
  const char *url;
  guint status;
  char *body;
  gint64 done_us;
} Shot;

static gpointer
shoot (gpointer data)
{
  Shot *s = data;
  g_autoptr (SoupSession) ses = session_new ();
  g_auto (Reply) r = { 0 };
  http (ses, "GET", s->url, NULL, NULL, 0, &r);
  s->status = r.status;
  s->body = reply_string (&r);
  s->done_us = g_get_monotonic_time ();
  return NULL;
}

/* Searches on every worker (one per processor, some 0.3 s each): the page
 * is served meanwhile, by the main loop, before any search is done. */
static void
test_page_while_searching (void)
{
  g_autofree char *heavy = g_strdup_printf (
      "%sapi/plan?model=deepseek-v3&gpus=4096xH800&top=1000", server.url);
  guint n = MAX (1, g_get_num_processors ());
  g_autofree Shot *shots = g_new0 (Shot, n);
  g_autofree GThread **threads = g_new0 (GThread *, n);
  for (guint i = 0; i < n; i++)
    {
      shots[i] = (Shot){ .url = heavy };
      threads[i] = g_thread_new ("shot", shoot, &shots[i]);
    }
  g_usleep (20000);
  g_auto (Reply) page = { 0 };
  get ("", &page);
  gint64 page_us = g_get_monotonic_time ();
  g_assert_cmpuint (page.status, ==, 200);
  for (guint i = 0; i < n; i++)
    {
      g_thread_join (threads[i]);
      g_assert_cmpuint (shots[i].status, ==, 200);
      g_assert_cmpint (page_us, <, shots[i].done_us);
      g_free (shots[i].body);
    }
}

/* A connection that has sent @req (raw HTTP) and not read the answer. */
static GSocketConnection *
ask_raw (guint port, const char *req)
{
  g_autoptr (GSocketClient) sc = g_socket_client_new ();
  g_autoptr (GError) error = NULL;
  GSocketConnection *c = g_socket_client_connect_to_host (
      sc, "127.0.0.1", (guint16)port, NULL, &error);
  g_assert_no_error (error);
  GOutputStream *out = g_io_stream_get_output_stream (G_IO_STREAM (c));
  g_assert_true (
      g_output_stream_write_all (out, req, strlen (req), NULL, NULL, &error));
  g_assert_no_error (error);
  return c;
}

/* Stopped while a client waits for an answer: its connection closes, the
 * search finishes, nothing is answered into it, and the exit is clean. */
static void
test_stop_while_answering (void)
{
  Serve s = { 0 };
  serve_start (&s, NULL);
  guint port = (guint)g_ascii_strtoull (strrchr (s.url, ':') + 1, NULL, 10);
  GSocketConnection *c
      = ask_raw (port, "GET /api/plan?model=deepseek-v3&gpus=4096xH800&"
                       "top=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  g_usleep (50000); /* its question taken up: some 0.3 s of search */
  serve_stop (&s);
  g_object_unref (c);
}

/* One worker, one place in the queue, 50 ms per answer: of six searches
 * that each take longer, the ones past the queue are answered busy at
 * once, the one running is answered 503 at its time bound. */
static void
test_busy_and_timeout (void)
{
  Serve small = { 0 };
  const char *extra[]
      = { "--workers", "1", "--queue", "1", "--timeout", "0.05", NULL };
  serve_start (&small, extra);
  /* some 0.3 s each on an idle core */
  g_autofree char *heavy = g_strdup_printf (
      "%sapi/plan?model=deepseek-v3&gpus=4096xH800&top=1000", small.url);
  Shot shots[6];
  GThread *threads[G_N_ELEMENTS (shots)];
  for (gsize i = 0; i < G_N_ELEMENTS (shots); i++)
    {
      shots[i] = (Shot){ .url = heavy };
      threads[i] = g_thread_new ("shot", shoot, &shots[i]);
    }
  g_autoptr (SoupSession) ses = session_new ();
  guint busy = 0, timed_out = 0;
  for (gsize i = 0; i < G_N_ELEMENTS (shots); i++)
    {
      g_thread_join (threads[i]);
      g_test_message ("%u %.100s", shots[i].status, shots[i].body);
      g_assert_cmpuint (shots[i].status, ==, 503);
      busy += strstr (shots[i].body, "every worker is busy") != NULL;
      timed_out += strstr (shots[i].body, "no answer within") != NULL;
      g_free (shots[i].body);
    }
  g_assert_cmpuint (busy, >=, 1);
  g_assert_cmpuint (timed_out, >=, 1);
  g_assert_cmpuint (busy + timed_out, ==, G_N_ELEMENTS (shots));
  /* Clients that ask and leave before their answer: the server never
   * answers into a closed connection. */
  guint port = (guint)g_ascii_strtoull (strrchr (small.url, ':') + 1, NULL, 10);
  const char *path = strstr (heavy + strlen ("http://"), "/");
  g_autofree char *req
      = g_strdup_printf ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
  for (int i = 0; i < 3; i++)
    {
      GSocketConnection *c = ask_raw (port, req);
      g_usleep (20000); /* its question taken up */
      g_io_stream_close (G_IO_STREAM (c), NULL, NULL);
      g_object_unref (c);
    }
  /* Still answering, and a clean exit with searches in flight. */
  g_auto (Reply) again = { 0 };
  g_autofree char *models = g_strdup_printf ("%sapi/models", small.url);
  http (ses, "GET", models, NULL, NULL, 0, &again);
  g_assert_true (again.status == 200 || again.status == 503);
  serve_stop (&small);
}

/* ---- load -------------------------------------------------------------------
 */

#define LOAD_CLIENTS 16

typedef struct
{
  const char *base;
  guint n;
  guint errors;
  double *latency_s;
} Client;

/* What a page and its clients ask, a few ms each (not /api/models, which
 * builds all 94 models: 60 ms). */
static const char *const load_paths[] = {
  "",
  "app.js",
  "api/fit?model=llama-65b&gpus=8xA100-80GB",
  "api/gpus",
  "api/model?model=llama-7b",
  "api/gpus?gpus=4x8xH100-SXM",
  "api/fit?model=gpt2&gpus=1xA100-80GB",
  "api/mem?model=llama-7b&gpus=8xA100-80GB&zero=3&tp=1&pp=1&micro-batch=1&"
  "recompute=none&offload-optimizer=none&offload-params=none&"
  "offload-activations=none&cp=1&sp=false&dp=8",
};

static gpointer
client_run (gpointer data)
{
  Client *c = data;
  g_autoptr (SoupSession) ses = session_new ();
  for (guint i = 0; i < c->n; i++)
    {
      g_autofree char *url = g_strdup_printf (
          "%s%s", c->base, load_paths[i % G_N_ELEMENTS (load_paths)]);
      gint64 t0 = g_get_monotonic_time ();
      g_auto (Reply) r = { 0 };
      http (ses, "GET", url, NULL, NULL, 0, &r);
      c->latency_s[i] = (double)(g_get_monotonic_time () - t0) / 1e6;
      if (r.status != 200 || g_bytes_get_size (r.body) == 0)
        {
          g_autofree char *body = reply_string (&r);
          g_test_message ("load: %s: %u %.200s", url, r.status, body);
          c->errors++;
        }
    }
  return NULL;
}

static int
compare_double (gconstpointer a, gconstpointer b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* @n requests from each of LOAD_CLIENTS clients at once; returns the
 * errors, fills @latency_s (LOAD_CLIENTS x @n) and the wall time. */
static guint
load (guint n, double *latency_s, double *wall_s)
{
  Client clients[LOAD_CLIENTS];
  GThread *threads[LOAD_CLIENTS];
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < LOAD_CLIENTS; i++)
    {
      clients[i] = (Client){ .base = server.url,
                             .n = n,
                             .latency_s = latency_s + (gsize)i * n };
      threads[i] = g_thread_new ("client", client_run, &clients[i]);
    }
  guint errors = 0;
  for (guint i = 0; i < LOAD_CLIENTS; i++)
    {
      g_thread_join (threads[i]);
      errors += clients[i].errors;
    }
  *wall_s = (double)(g_get_monotonic_time () - t0) / 1e6;
  return errors;
}

static void
test_load (void)
{
  guint n = 200;
#if defined(__SANITIZE_ADDRESS__)
  /* A quarter under the sanitizers, which triple every request's cost
   * and leave the memory unmeasured (below). */
  n = 50;
#endif
  const char *env = g_getenv ("STOW_SERVE_LOAD_REQUESTS");
  if (env)
    n = (guint)g_ascii_strtoull (env, NULL, 10);
  /* Warm-up: every worker thread, its malloc arena and the catalogs. */
  g_autofree double *warm = g_new (double, LOAD_CLIENTS * 20);
  double wall;
  g_assert_cmpuint (load (20, warm, &wall), ==, 0);
  guint64 rss_before = serve_rss_bytes (&server);
  double cpu_before = serve_cpu_s (&server);

  gsize total = (gsize)LOAD_CLIENTS * n;
  g_autofree double *lat = g_new (double, total);
  guint errors = load (n, lat, &wall);
  guint64 rss_after = serve_rss_bytes (&server);
  double cpu_s = serve_cpu_s (&server) - cpu_before;
  qsort (lat, total, sizeof (double), compare_double);
  double p50 = lat[total / 2], p99 = lat[(total * 99) / 100],
         max = lat[total - 1];
  g_test_message ("load: %u clients x %u requests in %.2f s (%.0f/s, "
                  "server CPU %.2f ms each): %u errors; latency p50 %.1f ms, "
                  "p99 %.1f ms, max %.1f ms; server RSS %.1f MiB before, "
                  "%.1f MiB after",
                  LOAD_CLIENTS, n, wall, (double)total / wall,
                  cpu_s * 1e3 / (double)total, errors, p50 * 1e3, p99 * 1e3,
                  max * 1e3, (double)rss_before / (1 << 20),
                  (double)rss_after / (1 << 20));
  g_assert_cmpuint (errors, ==, 0);
  /* Flat: what one run of the mix leaves behind is freed, so the second
   * run ends where the warm-up did, within the allocator's slack.  Under
   * AddressSanitizer freed memory sits in quarantine (256 MiB). */
#if !defined(__SANITIZE_ADDRESS__)
  g_assert_cmpuint (rss_after, <=, rss_before + ((guint64)16 << 20));
#endif
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  /* The server's own warnings (a pasted config's unknown field) are
   * messages in its log, not failures here. */
  serve_start (&server, NULL);
  session = session_new ();
  g_test_add_func ("/serve/api-vs-cli", test_api_vs_cli);
  g_test_add_func ("/serve/json-body", test_api_json_body);
  g_test_add_func ("/serve/pasted-config", test_api_pasted_config);
  g_test_add_func ("/serve/warnings", test_warnings);
  g_test_add_func ("/serve/optim-params", test_optim_params);
  g_test_add_func ("/serve/errors", test_errors);
  g_test_add_func ("/serve/page", test_page);
  g_test_add_func ("/serve/page-while-searching", test_page_while_searching);
  g_test_add_func ("/serve/busy-and-timeout", test_busy_and_timeout);
  g_test_add_func ("/serve/stop-while-answering", test_stop_while_answering);
  g_test_add_func ("/serve/load", test_load);
  int rc = g_test_run ();
  g_object_unref (session);
  serve_stop (&server);
  return rc;
}
