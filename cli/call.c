/* SPDX-License-Identifier: MIT
 *
 * cli/call.c: a command's flags, answer and failures, for the terminal or
 * for the server (cli/call.h).  The server's side makes a request's
 * parameters into the argv the command's own option table parses, so a
 * parameter means exactly what its flag means.
 */
#include "cli/call.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/json.h"
#include "core/strutil.h"

/* clang-format off */
G_DEFINE_QUARK (stow-cli-error-quark, stow_cli_error)
/* clang-format on */

void
stow_cli_call_init (StowCliCall *call, const char *const *names,
                    const char *const *values, guint n, gboolean takes_model,
                    StowModel *model)
{
  memset (call, 0, sizeof *call);
  call->names = names;
  call->values = values;
  call->n_params = n;
  call->takes_model = takes_model;
  call->model = model ? stow_model_ref (model) : NULL;
  call->answer = g_string_new (NULL);
  call->warnings = g_ptr_array_new_with_free_func (g_free);
  call->entries = g_array_new (FALSE, FALSE, sizeof (GOptionEntry));
  call->argv_owned = g_ptr_array_new_with_free_func (g_free);
}

void
stow_cli_call_clear (StowCliCall *call)
{
  g_clear_pointer (&call->model, stow_model_unref);
  if (call->answer)
    g_string_free (g_steal_pointer (&call->answer), TRUE);
  g_clear_error (&call->error);
  g_clear_pointer (&call->hint, g_free);
  g_clear_pointer (&call->field, g_free);
  g_clear_pointer (&call->warnings, g_ptr_array_unref);
  g_clear_pointer (&call->entries, g_array_unref);
  g_clear_pointer (&call->argv_owned, g_ptr_array_unref);
}

GOptionContext *
stow_cli_call_context_new (StowCliCall *call, const char *name,
                           const char *params, const char *summary)
{
  if (call == NULL)
    return stow_cli_context_new (name, params, summary);
  GOptionContext *ctx = g_option_context_new (params);
  g_option_context_set_summary (ctx, summary);
  /* --help prints and exits: never for a request. */
  g_option_context_set_help_enabled (ctx, FALSE);
  return ctx;
}

void
stow_cli_add_entries (StowCliCall *call, GOptionContext *ctx,
                      const GOptionEntry *entries)
{
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (call == NULL)
    return;
  for (const GOptionEntry *e = entries; e->long_name != NULL; e++)
    g_array_append_val (call->entries, *e);
}

static const GOptionEntry *
find_entry (const StowCliCall *call, const char *name)
{
  for (guint i = 0; i < call->entries->len; i++)
    {
      const GOptionEntry *e = &g_array_index (call->entries, GOptionEntry, i);
      if (strcmp (e->long_name, name) == 0)
        return e;
    }
  return NULL;
}

static gboolean
named (const StowCliCall *call, const char *name)
{
  for (guint i = 0; i < call->n_params; i++)
    if (strcmp (call->names[i], name) == 0)
      return TRUE;
  return FALSE;
}

static gboolean param_error (StowCliCall *call, const char *name, int code,
                             GError **error, const char *format, ...)
    G_GNUC_PRINTF (5, 6);

static gboolean
param_error (StowCliCall *call, const char *name, int code, GError **error,
             const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error_literal (error, STOW_CLI_ERROR, code, msg);
  g_free (call->field);
  call->field = g_strdup (name);
  return FALSE;
}

/* Flags whose value is a file the command would read or write, with what
 * the server does instead. */
static const struct
{
  const char *name, *instead;
} file_flags[] = {
  { "output", "the answer is the response" },
  { "chart", "the HTML format (format=html) holds the chart" },
  { "trace", "the JSON answer lists every op" },
  { "plan", "name the model, GPUs and layout instead" },
  { "cluster", "name the GPUs (gpus=8xA100-80GB) and the host (host-ram, "
               "nvme)" },
};

/* A switch's value: TRUE or FALSE in *on, or an error. */
static gboolean
parse_switch (StowCliCall *call, const char *name, const char *v, gboolean *on,
              GError **error)
{
  static const char *const yes[] = { "", "1", "true", "yes", "on" };
  static const char *const no[] = { "0", "false", "no", "off" };
  for (gsize i = 0; i < G_N_ELEMENTS (yes); i++)
    if (g_ascii_strcasecmp (v, yes[i]) == 0)
      {
        *on = TRUE;
        return TRUE;
      }
  for (gsize i = 0; i < G_N_ELEMENTS (no); i++)
    if (g_ascii_strcasecmp (v, no[i]) == 0)
      {
        *on = FALSE;
        return TRUE;
      }
  g_autofree char *esc = g_strescape (v, NULL);
  return param_error (call, name, STOW_CLI_ERROR_PARAM, error,
                      "parameter \"%s\" is a switch: true or false, not "
                      "\"%.80s\"",
                      name, esc);
}

/* The request as the argv the command's option table parses (into
 * call->argv_owned). */
static gboolean
request_argv (StowCliCall *call, const char *command, GError **error)
{
  GPtrArray *argv = call->argv_owned;
  const char *model = NULL;
  g_ptr_array_add (argv, g_strdup (command));
  for (guint i = 0; i < call->n_params; i++)
    {
      const char *name = call->names[i], *value = call->values[i];
      if (call->takes_model && strcmp (name, "model") == 0)
        {
          model = value;
          continue;
        }
      for (gsize k = 0; k < G_N_ELEMENTS (file_flags); k++)
        if (strcmp (name, file_flags[k].name) == 0)
          return param_error (call, name, STOW_CLI_ERROR_NO_FILE, error,
                              "parameter \"%s\": the server reads and writes "
                              "no files; %s",
                              name, file_flags[k].instead);
      const GOptionEntry *e = find_entry (call, name);
      if (e == NULL)
        {
          g_autofree const char **names
              = g_new0 (const char *, call->entries->len + 1);
          guint n = 0;
          for (guint k = 0; k < call->entries->len; k++)
            names[n++]
                = g_array_index (call->entries, GOptionEntry, k).long_name;
          if (call->takes_model)
            names[n++] = "model";
          const char *near = stow_suggest (name, names, n);
          g_autofree char *esc = g_strescape (name, NULL);
          if (near != NULL)
            return param_error (call, name, STOW_CLI_ERROR_PARAM, error,
                                "unknown parameter \"%.80s\"; did you mean "
                                "\"%s\"?",
                                esc, near);
          return param_error (call, name, STOW_CLI_ERROR_PARAM, error,
                              "unknown parameter \"%.80s\" (the command's "
                              "flags without their dashes)",
                              esc);
        }
      if (e->arg == G_OPTION_ARG_NONE)
        {
          gboolean on = FALSE;
          if (!parse_switch (call, name, value, &on, error))
            return FALSE;
          if (on)
            g_ptr_array_add (argv, g_strdup_printf ("--%s", name));
          continue;
        }
      /* `local` would probe the server's own hardware. */
      if (strcmp (name, "gpus") == 0
          && g_ascii_strcasecmp (value, "local") == 0)
        return param_error (call, name, STOW_CLI_ERROR_PARAM, error,
                            "parameter \"gpus\": local would describe the "
                            "server's machine; name the GPUs "
                            "(gpus=8xA100-80GB)");
      g_ptr_array_add (argv, g_strdup_printf ("--%s=%s", name, value));
    }
  /* The API answers JSON unless the request names another format. */
  if (!named (call, "json") && !named (call, "format") && !named (call, "emit")
      && find_entry (call, "json") != NULL)
    g_ptr_array_add (argv, g_strdup ("--json"));
  if (model == NULL && call->model != NULL)
    model = call->model->name;
  if (model != NULL)
    {
      /* After "--" a model that starts with a dash is not a flag. */
      g_ptr_array_add (argv, g_strdup ("--"));
      g_ptr_array_add (argv, g_strdup (model));
    }
  return TRUE;
}

gboolean
stow_cli_call_parse (StowCliCall *call, GOptionContext *ctx, const char *name,
                     int *argc, char ***argv)
{
  if (call == NULL)
    return stow_cli_parse (ctx, name, argc, argv);
  g_autoptr (GError) error = NULL;
  if (!request_argv (call, name, &error))
    {
      stow_cli_call_fail (call, error, NULL);
      return FALSE;
    }
  /* GOption rearranges the array it is given, not the strings: they stay
   * in argv_owned.  The array lives as long as the call. */
  guint n = call->argv_owned->len;
  char **work = g_new0 (char *, n + 1);
  memcpy (work, call->argv_owned->pdata, n * sizeof (char *));
  g_ptr_array_add (call->argv_owned, work); /* freed with the strings */
  *argc = (int)n;
  *argv = work;
  if (!g_option_context_parse (ctx, argc, argv, &error))
    {
      stow_cli_call_fail (call, error, NULL);
      return FALSE;
    }
  /* GOption leaves the "--" before the model in place. */
  for (int i = 1; i < *argc; i++)
    if (strcmp ((*argv)[i], "--") == 0)
      {
        memmove (*argv + i, *argv + i + 1,
                 (gsize)(*argc - i) * sizeof (char *));
        (*argc)--;
        break;
      }
  return TRUE;
}

/* The parameter an error is about: the first --FLAG in its message that is
 * one of the command's flags; the model (or its revision) for the model
 * room's errors, whose messages may quote a name that looks like a flag. */
static char *
field_of (const StowCliCall *call, const GError *error)
{
  if (error->domain == STOW_MODEL_ERROR)
    return g_strdup (strstr (error->message, "--revision") ? "revision"
                                                           : "model");
  for (const char *p = strstr (error->message, "--"); p != NULL;
       p = strstr (p + 2, "--"))
    {
      gsize len = strspn (p + 2, "abcdefghijklmnopqrstuvwxyz0123456789-");
      g_autofree char *flag = g_strndup (p + 2, len);
      if (len > 0 && find_entry (call, flag) != NULL)
        return g_steal_pointer (&flag);
    }
  return NULL;
}

int
stow_cli_call_fail (StowCliCall *call, const GError *error, const char *hint)
{
  if (call == NULL)
    return stow_cli_fail ((GError *)error, hint);
  /* The first failure is the one to report. */
  if (call->error == NULL)
    {
      call->error = error ? g_error_copy (error)
                          : g_error_new_literal (
                              STOW_CLI_ERROR, STOW_CLI_ERROR_PARAM, "failed");
      g_free (call->hint);
      call->hint = g_strdup (hint);
      if (call->field == NULL)
        call->field = field_of (call, call->error);
    }
  return STOW_EXIT_FAILURE;
}

int
stow_cli_call_failf (StowCliCall *call, const char *hint, const char *format,
                     ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  if (call == NULL)
    return stow_cli_failf (hint, "%s", msg);
  g_autoptr (GError) error
      = g_error_new_literal (STOW_CLI_ERROR, STOW_CLI_ERROR_PARAM, msg);
  return stow_cli_call_fail (call, error, hint);
}

int
stow_cli_call_no_answer (StowCliCall *call, const char *message,
                         const char *const *hints)
{
  if (call == NULL)
    {
      fprintf (stderr, "stowage: %s\n", message);
      for (guint i = 0; hints && hints[i]; i++)
        fprintf (stderr, "hint: %s\n", hints[i]);
      return STOW_EXIT_NO;
    }
  g_autoptr (GError) error
      = g_error_new_literal (STOW_CLI_ERROR, STOW_CLI_ERROR_NO_FIT, message);
  g_autofree char *hint
      = hints && hints[0] ? g_strjoinv ("; ", (char **)hints) : NULL;
  stow_cli_call_fail (call, error, hint);
  return STOW_EXIT_NO;
}

void
stow_cli_call_warning (StowCliCall *call, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  if (call == NULL)
    fprintf (stderr, "stowage: warning: %s\n", msg);
  else
    g_ptr_array_add (call->warnings, g_steal_pointer (&msg));
}

void
stow_cli_call_log_warning (StowCliCall *call, const char *message)
{
  if (call == NULL)
    g_warning ("%s", message);
  else
    g_ptr_array_add (call->warnings, g_strdup (message));
}

void
stow_cli_call_log_note (StowCliCall *call, const char *message)
{
  if (call == NULL)
    g_message ("note: %s", message);
  else
    g_ptr_array_add (call->warnings, g_strdup_printf ("note: %s", message));
}

int
stow_cli_call_answer (StowCliCall *call, const char *output, const char *data,
                      int ok_code)
{
  g_autoptr (GError) error = NULL;
  if (call == NULL)
    {
      if (output != NULL && strcmp (output, "-") != 0)
        {
          if (!stow_file_write_atomic (output, data, -1, &error))
            return stow_cli_fail (error, NULL);
          return ok_code;
        }
      fputs (data, stdout);
      return ok_code;
    }
  gsize len = strlen (data);
  if (call->max_answer_bytes
      && call->answer->len + len > call->max_answer_bytes)
    {
      error = g_error_new (STOW_CLI_ERROR, STOW_CLI_ERROR_TOO_BIG,
                           "the answer is %" G_GSIZE_FORMAT
                           " bytes, over the server's bound of %" G_GSIZE_FORMAT
                           "; ask for less (a smaller top, global-batch or "
                           "another format), or run the stowage command",
                           call->answer->len + len, call->max_answer_bytes);
      return stow_cli_call_fail (call, error, NULL);
    }
  g_string_append_len (call->answer, data, (gssize)len);
  return ok_code;
}

int
stow_cli_call_answer_json (StowCliCall *call, JsonNode *node, int ok_code)
{
  g_autofree char *s = stow_json_to_string (node, TRUE);
  json_node_unref (node);
  return stow_cli_call_answer (call, NULL, s, ok_code);
}

StowModel *
stow_cli_call_model (StowCliCall *call, const char *name, const char *revision,
                     GError **error)
{
  if (call == NULL)
    return stow_model_lookup_revision (name, revision, error);
  if (call->model != NULL)
    {
      if (revision != NULL)
        {
          g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,
                       "--revision applies to Hub ids (ORG/NAME), not to a "
                       "pasted config.json");
          return NULL;
        }
      return stow_model_ref (call->model);
    }
  return stow_model_lookup_named (name, revision, error);
}

guint64
stow_cli_call_bound (StowCliCall *call, guint64 cli_max, guint64 server_max)
{
  if (call == NULL || server_max == 0)
    return cli_max;
  return MIN (cli_max, server_max);
}
