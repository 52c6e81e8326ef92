/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-claim.h: a figure that README.md or docs/ quotes, printed
 * as the TAP comment "# claim NAME VALUE".  tests/check-claims.py runs the
 * test and compares VALUE with the figure before the marker
 * "<!-- claim NAME -->" in the documents (docs/testing.md).  Header only.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Prints @value (in the unit the documents quote it in: a percentage as
 * 8.7, not 0.087) under @name, to six significant digits. */
static inline void
stow_test_claim (const char *name, double value)
{
  g_test_message ("claim %s %.6g", name, value);
}

G_END_DECLS
