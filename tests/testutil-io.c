/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-io.c: scratch directories and whole files for the
 * file-format tests (see testutil-io.h).
 */
#include "testutil-io.h"

#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <glib/gstdio.h>

char *
stow_test_tmpdir (const char *prefix)
{
  const char *build = g_getenv ("G_TEST_BUILDDIR");
  g_autofree char *tmpl = g_strdup_printf ("%s-XXXXXX", prefix);
  char *dir = g_build_filename (build ? build : ".", tmpl, NULL);
  g_assert_nonnull (g_mkdtemp (dir));
  return dir;
}

static int
rm_entry (const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
  if (type == FTW_DP)
    rmdir (path);
  else
    unlink (path);
  return 0;
}

void
stow_test_rm_rf (const char *path)
{
  nftw (path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void
stow_test_write_file (const char *path, const void *data, gsize len)
{
  g_autoptr (GError) error = NULL;
  g_file_set_contents (path, len ? data : "", (gssize)len, &error);
  g_assert_no_error (error);
}

GBytes *
stow_test_read_file (const char *path)
{
  g_autoptr (GError) error = NULL;
  char *data = NULL;
  gsize len = 0;
  g_file_get_contents (path, &data, &len, &error);
  g_assert_no_error (error);
  return g_bytes_new_take (data, len);
}

static gint
compare_names (gconstpointer a, gconstpointer b)
{
  return g_strcmp0 (*(const char *const *)a, *(const char *const *)b);
}

char *
stow_test_list_dir (const char *dir)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GDir) d = g_dir_open (dir, 0, &error);
  g_assert_no_error (error);
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    g_ptr_array_add (names, g_strdup (name));
  g_ptr_array_sort (names, compare_names);
  g_ptr_array_add (names, NULL);
  return g_strjoinv (" ", (char **)names->pdata);
}

char *
stow_test_fixture (const char *first, ...)
{
  const char *src = g_getenv ("G_TEST_SRCDIR");
  g_autofree char *data = g_build_filename (src ? src : ".", "data", NULL);
  va_list ap;
  va_start (ap, first);
  g_autofree char *rest = g_build_filename_valist (first, &ap);
  va_end (ap);
  return g_build_filename (data, rest, NULL);
}
