/* SPDX-License-Identifier: MIT
 *
 * tests/testutil.c: running the stowage binary from tests.
 */
#include "tests/testutil.h"

#include <stdarg.h>
#include <sys/wait.h>

void
stow_run_clear (StowRun *run)
{
  g_clear_pointer (&run->out, g_free);
  g_clear_pointer (&run->err, g_free);
}

void
stow_runv (StowRun *run, const char *const *args)
{
  const char *exe = g_getenv ("STOWAGE");
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_autoptr (GError) error = NULL;
  int wait_status = 0;

  g_assert_nonnull (exe);
  g_ptr_array_add (argv, (gpointer)exe);
  for (gsize i = 0; args[i] != NULL; i++)
    g_ptr_array_add (argv, (gpointer)args[i]);
  g_ptr_array_add (argv, NULL);
  run->out = run->err = NULL;
  g_spawn_sync (NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL,
                &run->out, &run->err, &wait_status, &error);
  g_assert_no_error (error);
  run->status = WIFEXITED (wait_status) ? WEXITSTATUS (wait_status) : -1;
  g_test_message ("stowage %s -> %d\nstdout: %s\nstderr: %s",
                  args[0] ? args[0] : "", run->status, run->out, run->err);
}

void
stow_run (StowRun *run, const char *first_arg, ...)
{
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  va_list ap;
  va_start (ap, first_arg);
  for (const char *a = first_arg; a != NULL; a = va_arg (ap, const char *))
    g_ptr_array_add (args, (gpointer)a);
  va_end (ap);
  g_ptr_array_add (args, NULL);
  stow_runv (run, (const char *const *)args->pdata);
}

guint
stow_count_lines (const char *text)
{
  guint n = 0;
  for (const char *p = text; p && *p; p++)
    if (*p == '\n')
      n++;
  return n;
}
