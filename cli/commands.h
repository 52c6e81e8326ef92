/* SPDX-License-Identifier: MIT
 *
 * cli/commands.h: entry points of the subcommands that live in their own
 * files (cli/cmd-*.c).
 */
#pragma once

#include <glib.h>

#include "cli/call.h"

G_BEGIN_DECLS

/* The commands the server runs too (cli/call.h): the same code with the
 * request's parameters for flags; the stow_cmd_ entries are these with a
 * NULL call. */
int stow_fit_run (StowCliCall *call, int argc, char **argv);
int stow_mem_run (StowCliCall *call, int argc, char **argv);
int stow_plan_run (StowCliCall *call, int argc, char **argv);
int stow_simulate_run (StowCliCall *call, int argc, char **argv);
int stow_model_run (StowCliCall *call, int argc, char **argv);
int stow_models_run (StowCliCall *call, int argc, char **argv);
int stow_gpus_run (StowCliCall *call, int argc, char **argv);

int stow_cmd_models (int argc, char **argv);
int stow_cmd_model (int argc, char **argv);
int stow_cmd_bench (int argc, char **argv);
int stow_cmd_hw (int argc, char **argv);   /* cli/cmd-hw.c */
int stow_cmd_gpus (int argc, char **argv); /* cli/cmd-hw.c */
int stow_cmd_mem (int argc, char **argv);  /* cli/cmd-mem.c */
int stow_cmd_fit (int argc, char **argv);  /* cli/cmd-mem.c */
/* cli/cmd-bench-io.c: I/O benchmarks, under "stowage bench". */
int stow_bench_nvme (int argc, char **argv);
int stow_bench_swapper (int argc, char **argv);
int stow_cmd_plan (int argc, char **argv);       /* cli/cmd-plan.c */
int stow_cmd_simulate (int argc, char **argv);   /* cli/cmd-simulate.c */
int stow_cmd_train (int argc, char **argv);      /* cli/cmd-train.c */
int stow_cmd_init_model (int argc, char **argv); /* cli/cmd-train.c */
int stow_cmd_tokenize (int argc, char **argv);   /* cli/cmd-tokenize.c */
int stow_cmd_serve (int argc, char **argv);      /* cli/cmd-serve.c */

G_END_DECLS
