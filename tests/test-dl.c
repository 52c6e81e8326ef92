/* SPDX-License-Identifier: MIT
 *
 * tests/test-dl.c: executor/dl.h, the run-time loading cuBLAS and NCCL go
 * through: the first soname that loads, every attempt named when none
 * does, and one load per process whose failure is told again.
 */
#include <glib.h>
#include <string.h>

#include "core/error.h"
#include "executor/dl.h"

static void
test_first (void)
{
  g_autoptr (GError) error = NULL;
  const char *names[] = { "libstow-missing.so.9", "libm.so.6" };
  void *lib = stow_dlopen_first (names, 2, "libm", STOW_CORE_ERROR, 0, &error);
  g_assert_no_error (error);
  g_assert_nonnull (lib);
  const char *none[] = { "libstow-missing.so.9", "libstow-missing.so" };
  g_assert_null (
      stow_dlopen_first (none, 2, "Missing", STOW_CORE_ERROR, 0, &error));
  g_assert_nonnull (error);
  g_test_message ("%s", error->message);
  g_assert_true (g_str_has_prefix (error->message, "Missing not found: "));
  g_assert_nonnull (strstr (error->message, "libstow-missing.so.9"));
  g_assert_nonnull (strstr (error->message, "; libstow-missing.so"));
}

static guint calls;

static gboolean
failing_load (GError **error)
{
  calls++;
  g_set_error (error, STOW_CORE_ERROR, 0, "no such library (call %u)", calls);
  return FALSE;
}

static gboolean
good_load (GError **error)
{
  calls++;
  return TRUE;
}

static void
test_once (void)
{
  static StowDlOnce bad, good;
  calls = 0;
  for (int i = 0; i < 3; i++)
    {
      g_autoptr (GError) error = NULL;
      g_assert_false (
          stow_dl_once (&bad, failing_load, STOW_CORE_ERROR, 7, &error));
      g_assert_error (error, STOW_CORE_ERROR, 7);
      g_assert_cmpstr (error->message, ==, "no such library (call 1)");
    }
  g_assert_cmpuint (calls, ==, 1);
  for (int i = 0; i < 3; i++)
    g_assert_true (stow_dl_once (&good, good_load, STOW_CORE_ERROR, 7, NULL));
  g_assert_cmpuint (calls, ==, 2);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/dl/first", test_first);
  g_test_add_func ("/dl/once", test_once);
  return g_test_run ();
}
