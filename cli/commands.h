/* SPDX-License-Identifier: MIT
 *
 * cli/commands.h: entry points of the subcommands that live in their own
 * files (cli/cmd-*.c).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* cli/cmd-bench-io.c: I/O benchmarks (to be folded under "stowage bench"). */
int stow_bench_nvme (int argc, char **argv);
int stow_bench_swapper (int argc, char **argv);
/* Temporary dispatcher: "stowage bench-io nvme|swapper ...". */
int stow_cmd_bench_io (int argc, char **argv);

G_END_DECLS
