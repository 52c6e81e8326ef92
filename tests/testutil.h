/* SPDX-License-Identifier: MIT
 *
 * tests/testutil.h: helpers for integration tests that run the stowage
 * binary (its path comes from $STOWAGE, set by tests/meson.build).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  int status; /* exit code, or -1 if the process did not exit normally */
  char *out;
  char *err;
} StowRun;

void stow_run_clear (StowRun *run);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (StowRun, stow_run_clear)

/* Runs "$STOWAGE ARGS..." (NULL-terminated) and captures its output. */
void stow_run (StowRun *run, const char *first_arg, ...) G_GNUC_NULL_TERMINATED;
void stow_runv (StowRun *run, const char *const *args);

/* Runs "$STOWAGE ARGS..." and asserts it fails as a usage error: exit 2,
 * nothing on stdout, at most two lines on stderr, @fragment among them. */
void stow_assert_usage_error (const char *const *args, const char *fragment);

/* Runs "$STOWAGE ARGS... -o DIR/FILE_NAME" (NULL-terminated) with DIR a fresh
 * temporary directory, asserts it exits 0 printing nothing and leaves only
 * that file, and returns the file's contents; DIR is removed. */
char *stow_run_to_file (const char *file_name, const char *first_arg,
                        ...) G_GNUC_NULL_TERMINATED;

/* Asserts that @text is one JSON document json-glib parses (through
 * core/json.c, so within its depth and size bounds) and that no number
 * in it was NaN or infinite: stowage writes those as null, so a null
 * where a string may be unknown ("cuda_driver", "model", ...) is fine and
 * any other null fails, naming @what and the member. */
void stow_assert_json_valid (const char *text, const char *what);
/* The same check without asserting: NULL when @text is fine, else what is
 * wrong with it (free it). */
char *stow_json_problem (const char *text);

/* TRUE when @text holds "nan" or "inf" as a word of its own (any case):
 * a printf of a NaN or an infinity. */
gboolean stow_text_has_nonfinite (const char *text);

/* Counts the lines of @text. */
guint stow_count_lines (const char *text);

G_END_DECLS
