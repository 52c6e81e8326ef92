/* SPDX-License-Identifier: MIT
 *
 * cli/commands.h: entry points of the subcommands that live in their own
 * files (cli/cmd-*.c).
 */
#pragma once

G_BEGIN_DECLS

G_END_DECLS
