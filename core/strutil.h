/* SPDX-License-Identifier: MIT
 *
 * core/strutil.h: small string helpers shared by the rooms: "did you mean"
 * suggestions for names typed on the command line.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Case-insensitive edit distance between two ASCII strings. */
guint stow_edit_distance (const char *a, const char *b);

/* The candidate closest to @word (case-insensitive), or NULL when none is
 * close enough to be a plausible typo (distance above a third of the
 * word's length, at least 2).  Returns a pointer into @candidates. */
const char *stow_suggest (const char *word, const char *const *candidates,
                          gsize n_candidates);

G_END_DECLS
