/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli.c: the stowage command's contract: --help, --version, exit
 * codes, one-line errors for unknown commands and options.
 */
#include <string.h>
#include <sys/wait.h>

#include "tests/testutil.h"

static void
test_help (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "--help", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (g_str_has_prefix (r.out, "Usage: stowage"));
  g_assert_nonnull (strstr (r.out, "Commands:"));
  g_assert_nonnull (strstr (r.out, "version"));
  g_assert_cmpstr (r.err, ==, "");
}

static void
test_version (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "--version", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (g_str_has_prefix (r.out, "stowage "));
  g_assert_cmpuint (stow_count_lines (r.out), ==, 1);

  g_auto (StowRun) v = { 0 };
  stow_run (&v, "version", NULL);
  g_assert_cmpint (v.status, ==, 0);
  g_assert_nonnull (strstr (v.out, "features: io_uring="));
}

static void
test_subcommand_help (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "version", "--help", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "stowage version"));
  g_assert_nonnull (strstr (r.out, "--verbose"));

  g_auto (StowRun) h = { 0 };
  stow_run (&h, "help", "version", NULL);
  g_assert_cmpint (h.status, ==, 0);
  g_assert_nonnull (strstr (h.out, "stowage version"));
}

/* Usage errors: exit 2 and exactly one line naming what was wrong (plus an
 * optional hint line). */
static void
check_usage_error (const char *const *args, const char *fragment)
{
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, args);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpstr (r.out, ==, "");
  g_assert_nonnull (strstr (r.err, fragment));
  guint lines = stow_count_lines (r.err);
  g_assert_cmpuint (lines, >=, 1);
  g_assert_cmpuint (lines, <=, 2);
  if (lines == 2)
    g_assert_nonnull (strstr (r.err, "\nhint: "));
}

static void
test_usage_errors (void)
{
  const char *const unknown_cmd[] = { "frobnicate", NULL };
  check_usage_error (unknown_cmd, "unknown command \"frobnicate\"");
  const char *const typo[] = { "verson", NULL };
  check_usage_error (typo, "did you mean \"version\"");
  const char *const unknown_opt[] = { "--frob", NULL };
  check_usage_error (unknown_opt, "unknown option \"--frob\"");
  const char *const sub_opt[] = { "version", "--frob", NULL };
  check_usage_error (sub_opt, "--frob");
  const char *const extra[] = { "version", "extra", NULL };
  check_usage_error (extra, "unexpected argument \"extra\"");
  const char *const help_unknown[] = { "help", "nope", NULL };
  check_usage_error (help_unknown, "unknown command \"nope\"");
}

static void
test_no_command (void)
{
  g_auto (StowRun) r = { 0 };
  const char *const none[] = { NULL };
  stow_runv (&r, none);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_true (g_str_has_prefix (r.err, "Usage: stowage"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli/help", test_help);
  g_test_add_func ("/cli/version", test_version);
  g_test_add_func ("/cli/subcommand-help", test_subcommand_help);
  g_test_add_func ("/cli/usage-errors", test_usage_errors);
  g_test_add_func ("/cli/no-command", test_no_command);
  return g_test_run ();
}
