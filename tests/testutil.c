/* SPDX-License-Identifier: MIT
 *
 * tests/testutil.c: running the stowage binary from tests.
 */
#include "tests/testutil.h"

#include <glib/gstdio.h>
#include <stdarg.h>
#include <string.h>
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

/* Appends @first_arg and the rest of @ap, up to its NULL, to @args. */
static void
add_args (GPtrArray *args, const char *first_arg, va_list ap)
{
  for (const char *a = first_arg; a != NULL; a = va_arg (ap, const char *))
    g_ptr_array_add (args, (gpointer)a);
}

void
stow_run (StowRun *run, const char *first_arg, ...)
{
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  va_list ap;
  va_start (ap, first_arg);
  add_args (args, first_arg, ap);
  va_end (ap);
  g_ptr_array_add (args, NULL);
  stow_runv (run, (const char *const *)args->pdata);
}

void
stow_assert_usage_error (const char *const *args, const char *fragment)
{
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, args);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpstr (r.out, ==, "");
  g_assert_nonnull (strstr (r.err, fragment));
  g_assert_cmpuint (stow_count_lines (r.err), <=, 2);
}

char *
stow_run_to_file (const char *file_name, const char *first_arg, ...)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-test-XXXXXX", NULL);
  g_assert_nonnull (dir);
  g_autofree char *path = g_build_filename (dir, file_name, NULL);
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  va_list ap;
  va_start (ap, first_arg);
  add_args (args, first_arg, ap);
  va_end (ap);
  g_ptr_array_add (args, (gpointer) "-o");
  g_ptr_array_add (args, path);
  g_ptr_array_add (args, NULL);

  g_auto (StowRun) r = { 0 };
  stow_runv (&r, (const char *const *)args->pdata);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.out, ==, "");
  char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  g_assert_cmpint (g_unlink (path), ==, 0);
  g_assert_cmpint (g_rmdir (dir), ==, 0); /* nothing else was left */
  return text;
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
