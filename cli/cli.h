/* SPDX-License-Identifier: MIT
 *
 * cli/cli.h: what the subcommands share: the command table, option contexts
 * with the common --verbose/--quiet, and turning errors into one line on
 * stderr with the exit code.  Exit codes: 0 success, 1 a clean "no" (fit),
 * 2 usage error or failure.
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

enum
{
  STOW_EXIT_OK = 0,
  STOW_EXIT_NO = 1,
  STOW_EXIT_FAILURE = 2,
};

typedef struct
{
  const char *name;
  const char *summary;
  /* argv[0] is the command's name; returns an exit code. */
  int (*run) (int argc, char **argv);
} StowCommand;

/* The table of working subcommands, in the order --help lists them. */
const StowCommand *stow_cli_commands (gsize *n);

/* An option context for "stowage NAME PARAMS" with the shared options
 * (--verbose, --quiet) already added. */
GOptionContext *stow_cli_context_new (const char *name, const char *params,
                                      const char *summary);
/* Parses and applies the shared options.  On a usage error prints one line
 * and returns FALSE (exit 2). */
gboolean stow_cli_parse (GOptionContext *ctx, const char *name, int *argc,
                         char ***argv);

/* Prints "stowage: MESSAGE" (and "hint: ..." when @hint is set) on stderr and
 * returns STOW_EXIT_FAILURE. */
int stow_cli_fail (GError *error, const char *hint);
int stow_cli_failf (const char *hint, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

/* Prints @node on stdout as indented JSON with a final newline, and
 * unrefs it. */
void stow_cli_print_json (JsonNode *node);

G_END_DECLS
