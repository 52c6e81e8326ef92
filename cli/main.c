/* SPDX-License-Identifier: MIT
 *
 * cli/main.c: the `stowage` command: global options, then a git-style
 * subcommand from the table in cli/commands.c.  The only place that decides
 * the process's exit code.
 */
#include "config.h"

#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/strutil.h"
#include "offload/nvme.h"

static void
print_usage (FILE *out)
{
  gsize n;
  const StowCommand *cmds = stow_cli_commands (&n);
  fprintf (out, "Usage: stowage [-v|--verbose] [-q|--quiet] COMMAND [ARGS...]\n"
                "\n"
                "Will this model fit on these GPUs, and how should I run it?\n"
                "\n"
                "Commands:\n");
  for (gsize i = 0; i < n; i++)
    fprintf (out, "  %-10s  %s\n", cmds[i].name, cmds[i].summary);
  fprintf (out, "\n"
                "Options:\n"
                "  -h, --help     Show this help\n"
                "  --version      Print the version\n"
                "  -v, --verbose  Say more (twice for debug output)\n"
                "  -q, --quiet    Print errors only\n"
                "\n"
                "Run 'stowage COMMAND --help' for a command's options.\n");
}

/* Ctrl-C or a kill: the NVMe store's swap files (gigabytes, for the
 * benchmarks and ZeRO-Infinity runs) go with the process, then the signal
 * ends it as it would have (exit status 128 + signal for the shell). */
static void
on_fatal_signal (int sig)
{
  stow_nvme_remove_files_on_signal ();
  signal (sig, SIG_DFL);
  raise (sig);
}

static void
install_signal_cleanup (void)
{
  static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
  for (gsize i = 0; i < G_N_ELEMENTS (sigs); i++)
    {
      struct sigaction sa, old;
      memset (&sa, 0, sizeof sa);
      sa.sa_handler = on_fatal_signal;
      sigemptyset (&sa.sa_mask);
      /* A signal ignored by the parent (nohup, background jobs of a
       * non-interactive shell) stays ignored. */
      if (sigaction (sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
        continue;
      sigaction (sigs[i], &sa, NULL);
    }
}

static const StowCommand *
find_command (const char *name)
{
  gsize n;
  const StowCommand *cmds = stow_cli_commands (&n);
  for (gsize i = 0; i < n; i++)
    if (strcmp (cmds[i].name, name) == 0)
      return &cmds[i];
  return NULL;
}

static int
unknown_command (const char *name)
{
  gsize n;
  const StowCommand *cmds = stow_cli_commands (&n);
  g_autofree const char **names = g_new0 (const char *, n);
  for (gsize i = 0; i < n; i++)
    names[i] = cmds[i].name;
  const char *near = stow_suggest (name, names, n);
  if (near != NULL)
    fprintf (stderr, "stowage: unknown command \"%s\"; did you mean \"%s\"?\n",
             name, near);
  else
    fprintf (stderr, "stowage: unknown command \"%s\" (see 'stowage --help')\n",
             name);
  return STOW_EXIT_FAILURE;
}

int
main (int argc, char **argv)
{
  StowLogLevel level = STOW_LOG_NORMAL;
  int i;

  setlocale (LC_ALL, "");
  stow_log_init (STOW_LOG_NORMAL);

  for (i = 1; i < argc && argv[i][0] == '-'; i++)
    {
      const char *a = argv[i];
      if (strcmp (a, "-h") == 0 || strcmp (a, "--help") == 0)
        {
          print_usage (stdout);
          return STOW_EXIT_OK;
        }
      else if (strcmp (a, "--version") == 0)
        {
          printf ("stowage %s\n", STOW_VERSION);
          return STOW_EXIT_OK;
        }
      else if (strcmp (a, "-v") == 0 || strcmp (a, "--verbose") == 0)
        level = level >= STOW_LOG_VERBOSE ? STOW_LOG_DEBUG : STOW_LOG_VERBOSE;
      else if (strcmp (a, "-vv") == 0)
        level = STOW_LOG_DEBUG;
      else if (strcmp (a, "-q") == 0 || strcmp (a, "--quiet") == 0)
        level = STOW_LOG_QUIET;
      else
        {
          fprintf (stderr,
                   "stowage: unknown option \"%s\" (see 'stowage --help')\n",
                   a);
          return STOW_EXIT_FAILURE;
        }
    }
  stow_log_init (level);
  if (i >= argc)
    {
      print_usage (stderr);
      return STOW_EXIT_FAILURE;
    }

  const StowCommand *cmd = find_command (argv[i]);
  if (cmd == NULL)
    return unknown_command (argv[i]);
  install_signal_cleanup ();
  return cmd->run (argc - i, argv + i);
}
