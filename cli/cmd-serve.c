/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-serve.c: `stowage serve [--host 127.0.0.1] [--port 8080]`: the
 * planner as a web page and a JSON API (serve/), whose endpoints are the
 * planning commands themselves (cli/api.c).  Prints its URL, then serves
 * until interrupted.
 */
#include <glib-unix.h>
#include <stdio.h>
#include <string.h>

#include "cli/api.h"
#include "cli/cli.h"
#include "cli/commands.h"

static gboolean
quit (gpointer loop)
{
  g_main_loop_quit (loop);
  return G_SOURCE_REMOVE;
}

int
stow_cmd_serve (int argc, char **argv)
{
  g_autofree char *host = NULL;
  int port = 8080, workers = 0, queue = 0;
  double timeout_s = 0;
  gboolean offline = FALSE;
  const GOptionEntry entries[] = {
    { "host", 0, 0, G_OPTION_ARG_STRING, &host,
      "The address to listen on (default 127.0.0.1: this machine only; "
      "0.0.0.0 lets anyone who can reach it in)",
      "ADDR" },
    { "port", 0, 0, G_OPTION_ARG_INT, &port,
      "The port (default 8080; 0 picks a free one and prints it)", "PORT" },
    { "workers", 0, 0, G_OPTION_ARG_INT, &workers,
      "Questions answered at once (default: one per processor)", "N" },
    { "queue", 0, 0, G_OPTION_ARG_INT, &queue,
      "Questions that may wait for a worker before the server answers 503 "
      "(default: 64, or 8 per worker)",
      "N" },
    { "timeout", 0, 0, G_OPTION_ARG_DOUBLE, &timeout_s,
      "Seconds one answer may take before the server answers 503 "
      "(default 60)",
      "S" },
    { "offline", 0, 0, G_OPTION_ARG_NONE, &offline,
      "Hub ids only from the caches, never the network (HF_HUB_OFFLINE=1)",
      NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "serve", NULL,
      "The planner as a web page and a JSON API: /api/fit, /api/plan, "
      "/api/mem, /api/simulate, /api/model, /api/gpus and /api/models take "
      "the commands' flags as query parameters without their dashes "
      "(/api/fit?model=llama-65b&gpus=8xA100-80GB) or as a JSON body, and "
      "answer what the command would print with --json.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!stow_cli_parse (ctx, "serve", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage serve --help'",
                           "serve: unexpected argument \"%s\"", argv[1]);
  if (port < 0 || port > 65535)
    return stow_cli_failf (NULL, "--port %d: expected 0 to 65535", port);
  if (workers < 0 || workers > 1024)
    return stow_cli_failf (NULL, "--workers %d: expected 1 to 1024", workers);
  if (queue < 0 || queue > 65536)
    return stow_cli_failf (NULL, "--queue %d: expected 1 to 65536", queue);
  if (timeout_s < 0 || !(timeout_s <= 86400))
    return stow_cli_failf (NULL, "--timeout %g: expected 1 to 86400 seconds",
                           timeout_s);
  /* Before any thread: the Hub code reads it on each lookup. */
  if (offline)
    g_setenv ("HF_HUB_OFFLINE", "1", TRUE);

  StowServeOptions o;
  stow_serve_options_init (&o);
  if (workers > 0)
    o.workers = (guint)workers;
  if (queue > 0)
    o.queue = (guint)queue;
  if (timeout_s > 0)
    o.timeout_s = timeout_s;
  gsize n;
  const StowServeEndpoint *endpoints = stow_cli_api_endpoints (&n);
  g_autoptr (GMainLoop) loop = g_main_loop_new (NULL, FALSE);
  g_autoptr (StowServer) server = stow_server_new (endpoints, n, &o);
  g_autoptr (GError) error = NULL;
  const char *addr = host ? host : "127.0.0.1";
  if (!stow_server_listen (server, addr, (guint)port, &error))
    return stow_cli_fail (error, port ? "pick another with --port, or 0 for "
                                        "a free one"
                                      : NULL);
  g_autoptr (GInetAddress) ia = g_inet_address_new_from_string (addr);
  if (!g_inet_address_get_is_loopback (ia))
    g_warning ("serving on %s: anyone who can reach this address can use "
               "the planner (it has no accounts)",
               addr);
  g_autofree char *url = stow_server_get_url (server);
  printf ("stowage serve: %s (the API under %sapi/; Ctrl-C stops)\n", url, url);
  fflush (stdout);
  g_unix_signal_add (SIGINT, quit, loop);
  g_unix_signal_add (SIGTERM, quit, loop);
  g_main_loop_run (loop);
  return STOW_EXIT_OK;
}
