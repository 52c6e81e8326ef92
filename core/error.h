/* SPDX-License-Identifier: MIT
 *
 * core/error.h: the core GError domain.  Other rooms define their own domain
 * (STOW_MODEL_ERROR, STOW_HW_ERROR, STOW_PLAN_ERROR, ...) beside their code.
 * Messages name the offending input: `size "80XB": unknown unit "XB"`.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_CORE_ERROR (stow_core_error_quark ())
GQuark stow_core_error_quark (void);

typedef enum
{
  STOW_CORE_ERROR_PARSE,     /* malformed text: empty, junk, unknown unit */
  STOW_CORE_ERROR_RANGE,     /* negative, zero where not allowed, overflow */
  STOW_CORE_ERROR_IO,        /* a file could not be read or written */
  STOW_CORE_ERROR_TOO_LARGE, /* an input file over its size limit */
  STOW_CORE_ERROR_JSON,      /* not JSON, or a JSON value of the wrong type */
  STOW_CORE_ERROR_MISSING,   /* a required JSON member is absent */
} StowCoreError;

G_END_DECLS
