/* SPDX-License-Identifier: MIT
 *
 * tests/test-strutil.c: edit distance and "did you mean" suggestions.
 */
#include "core/strutil.h"

static void
test_distance (void)
{
  g_assert_cmpuint (stow_edit_distance ("", ""), ==, 0);
  g_assert_cmpuint (stow_edit_distance ("abc", ""), ==, 3);
  g_assert_cmpuint (stow_edit_distance ("kitten", "sitting"), ==, 3);
  g_assert_cmpuint (stow_edit_distance ("A100", "a100"), ==, 0);
  g_assert_cmpuint (stow_edit_distance ("flaw", "lawn"), ==, 2);
}

static void
test_suggest (void)
{
  static const char *const gpus[]
      = { "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "RTX-4090" };
  g_assert_cmpstr (stow_suggest ("A100-80G", gpus, 5), ==, "A100-80GB");
  g_assert_cmpstr (stow_suggest ("h100-sxm5", gpus, 5), ==, "H100-SXM");
  g_assert_cmpstr (stow_suggest ("4090", gpus, 5), ==, "RTX-4090");
  g_assert_null (stow_suggest ("TPUv4", gpus, 5));
  g_assert_null (stow_suggest ("x", gpus, 0));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/strutil/distance", test_distance);
  g_test_add_func ("/strutil/suggest", test_suggest);
  return g_test_run ();
}
