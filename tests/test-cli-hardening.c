/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-hardening.c: issue 24, as a user meets it: hostile and
 * careless inputs (deep JSON, huge numbers, odd -o targets, a cluster file
 * with only the required fields) end in a clear answer, a clean exit code
 * and valid output, never a crash, a hang or a NaN.
 */
#include <glib/gstdio.h>
#include <string.h>

#include "tests/testutil.h"

typedef struct
{
  char *dir;
} Tmp;

static void
tmp_setup (Tmp *t, gconstpointer data)
{
  t->dir = g_dir_make_tmp ("stow-harden-XXXXXX", NULL);
  g_assert_nonnull (t->dir);
}

static void
tmp_teardown (Tmp *t, gconstpointer data)
{
  g_autoptr (GDir) d = g_dir_open (t->dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (t->dir, name, NULL);
      g_unlink (p);
    }
  g_rmdir (t->dir);
  g_free (t->dir);
}

static char *
tmp_file (Tmp *t, const char *name, const char *text)
{
  char *path = g_build_filename (t->dir, name, NULL);
  g_assert_true (g_file_set_contents (path, text, -1, NULL));
  return path;
}

/* 1. Every JSON reader (model config, cluster file, plan file, a cluster's
 * profile) refuses input nested 100,000 deep with one line naming the file
 * and the limit; json-glib used to overflow the stack (SIGSEGV). */
static void
test_deep_json (Tmp *t, gconstpointer data)
{
  gsize n = 100000;
  g_autofree char *deep = g_malloc (2 * n + 2);
  memset (deep, '[', n);
  memset (deep + n, ']', n);
  deep[2 * n] = '\n';
  deep[2 * n + 1] = '\0';
  g_autofree char *path = tmp_file (t, "d.json", deep);
  g_autofree char *with_profile = g_strdup_printf (
      "{\"preset\": \"dgx-a100\", \"profile\": \"%s\"}", path);
  g_autofree char *cluster = tmp_file (t, "c.json", with_profile);
  const char *const runs[][8] = {
    { "model", path, NULL },
    { "gpus", "--cluster", path, NULL },
    { "fit", "--plan", path, NULL },
    { "mem", "--plan", path, NULL },
    { "simulate", "--plan", path, NULL },
    { "plan", "llama-7b", "--cluster", path, NULL },
    { "fit", "llama-7b", "--cluster", cluster, NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (runs); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_runv (&r, runs[i]);
      g_assert_cmpint (r.status, ==, 2);
      g_assert_cmpstr (r.out, ==, "");
      g_assert_nonnull (strstr (r.err, "d.json:1:65: nested deeper than 64"));
      g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
    }
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add ("/hardening/deep-json", Tmp, NULL, tmp_setup, test_deep_json,
              tmp_teardown);
  return g_test_run ();
}
