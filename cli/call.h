/* SPDX-License-Identifier: MIT
 *
 * cli/call.h: one run of a command, and whom it answers.  From the terminal
 * (a NULL call) the flags come from argv, the answer goes to stdout or -o
 * FILE and a failure is one line on stderr.  For the server (cli/api.c) the
 * flags come from a request's parameters, checked against the command's own
 * option table, the answer is collected in a string and a failure in a
 * GError, and no flag may name a file to read or write.  The same command
 * code runs either way, so the API's JSON is the CLI's, byte for byte.
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

#include "models/model.h"

G_BEGIN_DECLS

#define STOW_CLI_ERROR (stow_cli_error_quark ())
GQuark stow_cli_error_quark (void);

typedef enum
{
  STOW_CLI_ERROR_PARAM,   /* a parameter the command does not take, or a
                             bad value for a switch; the message names it */
  STOW_CLI_ERROR_NO_FILE, /* a parameter that would read or write a file */
  STOW_CLI_ERROR_NO_FIT,  /* nothing fits, so there is nothing to emit */
  STOW_CLI_ERROR_TOO_BIG, /* over the server's bound on one answer */
} StowCliError;

typedef struct
{
  /* The request: its parameters in order, names without "--" ("model" is
   * the MODEL argument of the commands that take one), and the model a
   * pasted config.json describes (NULL when none was pasted). */
  const char *const *names;
  const char *const *values;
  guint n_params;
  gboolean takes_model;
  StowModel *model;
  /* Bounds on one answer: micro-batch x layer passes of one simulated
   * step, plan's --top, and the answer's bytes (0: the CLI's). */
  guint64 max_sim_passes;
  guint max_top;
  gsize max_answer_bytes;

  /* What the command answered: the answer, or the failure (@error, with
   * @hint when the CLI would print one); warnings the CLI would print on
   * stderr beside an answer; the parameter at fault when known. */
  GString *answer;
  GError *error;
  char *hint;
  GPtrArray *warnings;
  char *field;

  /* private */
  GArray *entries;       /* GOptionEntry: what the command's flags are */
  GPtrArray *argv_owned; /* the strings of the argv built from the request */
} StowCliCall;

/* Sets up @call for a request: @names and @values (@n of each) stay
 * borrowed, @model is referenced when not NULL. */
void stow_cli_call_init (StowCliCall *call, const char *const *names,
                         const char *const *values, guint n,
                         gboolean takes_model, StowModel *model);
void stow_cli_call_clear (StowCliCall *call);

/* stow_cli_context_new for @call (the server's calls neither rename the
 * process nor take --verbose and --quiet). */
GOptionContext *stow_cli_call_context_new (StowCliCall *call, const char *name,
                                           const char *params,
                                           const char *summary);
/* g_option_context_add_main_entries, remembering @entries as flags the
 * request may name. */
void stow_cli_add_entries (StowCliCall *call, GOptionContext *ctx,
                           const GOptionEntry *entries);
/* stow_cli_parse for @call: the terminal's argv; or the request's
 * parameters made into "--name=value" flags, switches from true or false,
 * "model" into the MODEL argument, and --json added unless json, format or
 * emit is named.  An unknown parameter (with a did-you-mean), a switch
 * neither true nor false, and a flag that names a file (output, chart,
 * plan, cluster, trace) or this machine (gpus=local) fail as
 * STOW_CLI_ERROR naming the parameter.  On failure returns FALSE (the
 * command exits 2); @argc and @argv are then those GOption left. */
gboolean stow_cli_call_parse (StowCliCall *call, GOptionContext *ctx,
                              const char *name, int *argc, char ***argv);

/* stow_cli_fail and stow_cli_failf for @call: the server's keep @error
 * (copied) and @hint.  Return STOW_EXIT_FAILURE. */
int stow_cli_call_fail (StowCliCall *call, const GError *error,
                        const char *hint);
int stow_cli_call_failf (StowCliCall *call, const char *hint,
                         const char *format, ...) G_GNUC_PRINTF (3, 4);
/* A clean "no" with nothing to answer (fit --emit when no layout fits):
 * @message and each of @hints (NULL-terminated, may be NULL) on stderr as
 * "stowage: MESSAGE" and "hint: HINT" lines, or STOW_CLI_ERROR_NO_FIT.
 * Returns STOW_EXIT_NO. */
int stow_cli_call_no_answer (StowCliCall *call, const char *message,
                             const char *const *hints);
/* "stowage: warning: MESSAGE" on stderr, or one of the call's warnings. */
void stow_cli_call_warning (StowCliCall *call, const char *format, ...)
    G_GNUC_PRINTF (2, 3);
/* The same through g_warning for the terminal (so --quiet silences it). */
void stow_cli_call_log_warning (StowCliCall *call, const char *message);
/* "note: MESSAGE" through g_message for the terminal (--quiet silences
 * it), or one of the call's warnings for the server. */
void stow_cli_call_log_note (StowCliCall *call, const char *message);

/* The answer @data: to @output (-o FILE; NULL or "-" is standard output)
 * for the terminal, into the call's answer for the server.  Returns
 * @ok_code, or STOW_EXIT_FAILURE after saying why the file could not be
 * written or why the answer is over the server's bound. */
int stow_cli_call_answer (StowCliCall *call, const char *output,
                          const char *data, int ok_code);
/* The answer as indented JSON with a final newline (stow_cli_print_json);
 * unrefs @node.  Returns @ok_code as stow_cli_call_answer. */
int stow_cli_call_answer_json (StowCliCall *call, JsonNode *node, int ok_code);

/* The model a command names: for the terminal a catalog name, a Hub id or
 * a config.json path (stow_model_lookup_revision); for the server a
 * catalog name or a Hub id (stow_model_lookup_named), never a file, or
 * the pasted config's model.  Returns a new reference. */
StowModel *stow_cli_call_model (StowCliCall *call, const char *name,
                                const char *revision, GError **error);

/* A bound for @call: the CLI's @cli_max, or the server's @server_max
 * when it is smaller (0: none of its own). */
guint64 stow_cli_call_bound (StowCliCall *call, guint64 cli_max,
                             guint64 server_max);

G_END_DECLS
