/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint-private.h: a switch for tests only.  Commit replaces
 * an existing step directory with one renameat2(RENAME_EXCHANGE); tests
 * turn it off to exercise the path taken on file systems without it (move
 * the old one aside, rename the new one in).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

extern gboolean stow_checkpoint_use_exchange;

G_END_DECLS
