/* SPDX-License-Identifier: MIT
 *
 * cli/common.c: option contexts, the shared options and error reporting.
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli/cli.h"
#include "core/json.h"
#include "core/log.h"

static gboolean opt_quiet;
static int opt_verbose;

static gboolean
count_verbose (const char *name, const char *value, gpointer data,
               GError **error)
{
  opt_verbose++;
  return TRUE;
}

static const GOptionEntry shared_entries[] = {
  { "verbose", 'v', G_OPTION_FLAG_NO_ARG, G_OPTION_ARG_CALLBACK,
    (gpointer)count_verbose, "Say more (twice for debug output)", NULL },
  { "quiet", 'q', 0, G_OPTION_ARG_NONE, &opt_quiet,
    "Print errors only, no warnings", NULL },
  { NULL },
};

GOptionContext *
stow_cli_context_new (const char *name, const char *params, const char *summary)
{
  /* GOption prints "Usage: PRGNAME [OPTION...] PARAMS"; one subcommand runs
   * per process, so the program name is set once, here. */
  g_autofree char *prgname = g_strdup_printf ("stowage %s", name);
  g_set_prgname (prgname);
  GOptionContext *ctx = g_option_context_new (params);
  g_option_context_set_summary (ctx, summary);
  g_option_context_add_main_entries (ctx, shared_entries, NULL);
  return ctx;
}

gboolean
stow_cli_parse (GOptionContext *ctx, const char *name, int *argc, char ***argv)
{
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx, argc, argv, &error))
    {
      fprintf (stderr, "stowage %s: %s\nhint: see 'stowage %s --help'\n", name,
               error->message, name);
      return FALSE;
    }
  if (opt_quiet)
    stow_log_init (STOW_LOG_QUIET);
  else if (opt_verbose > 0)
    stow_log_init (opt_verbose > 1 ? STOW_LOG_DEBUG : STOW_LOG_VERBOSE);
  return TRUE;
}

int
stow_cli_fail (GError *error, const char *hint)
{
  fprintf (stderr, "stowage: %s\n", error ? error->message : "failed");
  if (hint != NULL)
    fprintf (stderr, "hint: %s\n", hint);
  return STOW_EXIT_FAILURE;
}

int
stow_cli_failf (const char *hint, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  fprintf (stderr, "stowage: %s\n", msg);
  if (hint != NULL)
    fprintf (stderr, "hint: %s\n", hint);
  return STOW_EXIT_FAILURE;
}

void
stow_cli_print_json (JsonNode *node)
{
  g_autofree char *s = stow_json_to_string (node, TRUE);
  fputs (s, stdout);
  json_node_unref (node);
}
