/* SPDX-License-Identifier: MIT
 *
 * cli/commands.c: the subcommand table and the small built-in commands
 * (help, version).  Only commands that work are listed.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"

static int cmd_help (int argc, char **argv);
static int cmd_version (int argc, char **argv);

static const StowCommand commands[] = {
  { "fit", "Does a model train on these GPUs, and with which layout?",
    stow_cmd_fit },
  { "plan", "Rank every layout that fits by predicted throughput",
    stow_cmd_plan },
  { "mem", "One layout's memory per GPU, host and NVMe, term by term",
    stow_cmd_mem },
  { "simulate", "Run one layout's step program in virtual time",
    stow_cmd_simulate },
  { "train", "Train a LLaMA-family model for real, as the plan lays it out",
    stow_cmd_train },
  { "init-model", "Write a randomly initialised checkpoint of a config.json",
    stow_cmd_init_model },
  { "tokenize", "Text and JSONL to token shards, with the model's tokenizer",
    stow_cmd_tokenize },
  { "serve", "The planner as a web page and a JSON API", stow_cmd_serve },
  { "models", "List the built-in model catalog", stow_cmd_models },
  { "model", "Show one model: exact parameter counts, per layer and role",
    stow_cmd_model },
  { "gpus", "List the GPU catalog and node presets; resolve --gpus specs",
    stow_cmd_gpus },
  { "hw", "Describe this machine: CPUs, memory, GPUs, drives", stow_cmd_hw },
  { "bench", "Benchmark the offload engine against the machine's limits",
    stow_cmd_bench },
  { "help", "Show help for a command", cmd_help },
  { "version", "Print the version and the features built in", cmd_version },
};

const StowCommand *
stow_cli_commands (gsize *n)
{
  *n = G_N_ELEMENTS (commands);
  return commands;
}

static int
cmd_version (int argc, char **argv)
{
  g_autoptr (GOptionContext) ctx
      = stow_cli_context_new ("version", NULL,
                              "Print the version and the optional features "
                              "this binary was built with.");
  if (!stow_cli_parse (ctx, "version", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage version --help'",
                           "version: unexpected argument \"%s\"", argv[1]);
  printf ("stowage %s\n", STOW_VERSION);
  printf ("features: io_uring=%s cairo=%s cuda=%s\n",
          STOW_HAVE_IO_URING ? "yes" : "no", STOW_HAVE_CAIRO ? "yes" : "no",
          STOW_HAVE_CUDA ? "yes" : "no");
  return STOW_EXIT_OK;
}

static int
cmd_help (int argc, char **argv)
{
  gsize n;
  const StowCommand *cmds = stow_cli_commands (&n);
  if (argc < 2)
    {
      printf ("Usage: stowage help COMMAND\n\nCommands:\n");
      for (gsize i = 0; i < n; i++)
        printf ("  %-10s  %s\n", cmds[i].name, cmds[i].summary);
      return STOW_EXIT_OK;
    }
  for (gsize i = 0; i < n; i++)
    if (strcmp (cmds[i].name, argv[1]) == 0)
      {
        char *args[] = { argv[1], (char *)"--help", NULL };
        return cmds[i].run (2, args);
      }
  return stow_cli_failf ("see 'stowage --help'", "help: unknown command \"%s\"",
                         argv[1]);
}
