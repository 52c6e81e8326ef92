/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-io.h: what the file-format tests share: a scratch
 * directory under the build tree, whole-file reads and writes, and a
 * listing to check that nothing was left behind.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* A new empty directory under $G_TEST_BUILDDIR (or the current one). */
char *stow_test_tmpdir (const char *prefix);
/* rm -rf @path, never following symbolic links. */
void stow_test_rm_rf (const char *path);
void stow_test_write_file (const char *path, const void *data, gsize len);
/* The contents of @path; asserts it can be read. */
GBytes *stow_test_read_file (const char *path);
/* The entries of @dir, sorted, joined by ' ' ("" when empty). */
char *stow_test_list_dir (const char *dir);
/* The path of fixture @name under $G_TEST_SRCDIR/data. */
char *stow_test_fixture (const char *first, ...) G_GNUC_NULL_TERMINATED;

G_END_DECLS
