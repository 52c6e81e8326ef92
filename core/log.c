/* SPDX-License-Identifier: MIT
 *
 * core/log.c: a structured-log writer with stowage's verbosity levels.
 */
#include "core/log.h"

#include <stdio.h>

static StowLogLevel current_level = STOW_LOG_NORMAL;

static GLogWriterOutput
stow_log_writer (GLogLevelFlags flags, const GLogField *fields, gsize n_fields,
                 gpointer user_data)
{
  const char *message = NULL, *tag;
  int needed;

  if (flags & (G_LOG_LEVEL_ERROR | G_LOG_LEVEL_CRITICAL))
    needed = STOW_LOG_QUIET, tag = "error: ";
  else if (flags & G_LOG_LEVEL_WARNING)
    needed = STOW_LOG_NORMAL, tag = "warning: ";
  else if (flags & G_LOG_LEVEL_MESSAGE)
    needed = STOW_LOG_NORMAL, tag = "";
  else if (flags & G_LOG_LEVEL_INFO)
    needed = STOW_LOG_VERBOSE, tag = "";
  else
    needed = STOW_LOG_DEBUG, tag = "debug: ";
  if ((int)current_level < needed)
    return G_LOG_WRITER_HANDLED;

  for (gsize i = 0; i < n_fields; i++)
    if (g_strcmp0 (fields[i].key, "MESSAGE") == 0)
      message = fields[i].value;
  fprintf (stderr, "stowage: %s%s\n", tag, message ? message : "");
  fflush (stderr);
  return G_LOG_WRITER_HANDLED;
}

void
stow_log_init (StowLogLevel level)
{
  static gboolean installed;
  current_level = level;
  /* GLib accepts one writer per process; later calls only change the level. */
  if (!installed)
    g_log_set_writer_func (stow_log_writer, NULL, NULL);
  installed = TRUE;
}

StowLogLevel
stow_log_get_level (void)
{
  return current_level;
}
