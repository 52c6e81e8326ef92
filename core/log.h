/* SPDX-License-Identifier: MIT
 *
 * core/log.h: messages through g_log, filtered by the CLI's --verbose and
 * --quiet.  Library code logs with g_warning / g_message / g_info / g_debug
 * and never prints directly; the CLI installs this writer once.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  STOW_LOG_QUIET = -1,  /* errors only */
  STOW_LOG_NORMAL = 0,  /* plus warnings and messages */
  STOW_LOG_VERBOSE = 1, /* plus info */
  STOW_LOG_DEBUG = 2,   /* plus debug */
} StowLogLevel;

/* Installs a writer that prints "stowage: warning: ..." lines on stderr for
 * the levels @level lets through.  May be called again to change
 * the level. */
void stow_log_init (StowLogLevel level);
StowLogLevel stow_log_get_level (void);

G_END_DECLS
