/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-train.h: a small model, a token shard and `stowage train`
 * runs on them, shared by the cpu tests (test-train.c) and the GPU ones
 * (test-gpu-train.c).
 */
#pragma once

#include <glib.h>

#include "testutil.h"

/* A small LLaMA (GQA, untied), vocabulary 300. */
extern const char *const stow_train_small_config;

typedef struct
{
  char *dir, *config, *model, *shard, *text;
} Fixture;

/* A shard file of @written random tokens below @vocab under a header of
 * @magic, @version and @count (llm.c's layout). */
void write_shard (const char *path, guint32 magic, guint32 version,
                  guint32 count, guint32 written, guint32 vocab);
/* A temporary directory with the config, a model initialised from it
 * (seed 3) and a shard of 20000 tokens. */
void fixture_init (Fixture *f);
void fixture_clear (Fixture *f);
/* @first then @second (either NULL ended; @second may be NULL), as one
 * NULL-ended array borrowing their strings. */
GPtrArray *args_join (const char *const *first, const char *const *second);
/* Runs train on the fixture (seq 16, micro-batch 2, global batch 4, lr
 * 0.003, fp32 unless the extra flags give --precision) with @out and the
 * extra flags (NULL ended). */
void train (StowRun *r, Fixture *f, const char *out,
            ...) G_GNUC_NULL_TERMINATED;
/* The same with the extra flags in @extra (NULL ended). */
void trainv (StowRun *r, Fixture *f, const char *out, const char *const *extra);
/* The contents of @file in @dir's latest checkpoint. */
char *contents (const char *dir, const char *file);
/* Whether two runs' latest checkpoints hold the same bytes of @file. */
gboolean same_file (const char *a_dir, const char *b_dir, const char *file);
/* Runs tests/oracle/train_oracle.py with --backend @backend under the
 * first python with torch (STOW_PYTHON, then @pythons in order) and
 * asserts it passed; skips the test when none has torch. */
void stow_train_oracle (const char *backend, const char *const *pythons);
/* The latest checkpoints in @a and @b hold the same files, each the same
 * bytes (weights, optimizer state, config, the model's files), but for
 * run.json, which says how each run ran. */
void assert_same_checkpoint (const char *a, const char *b);
/* The run's "device peak:" line: the arena's measured peak within 2% of
 * the simulated one, same program. */
void assert_peak_as_simulated (const StowRun *r);
/* The run's "pinned host peak:" line (an offloaded placement's host
 * buffers): measured within 2% of the simulated one. */
void assert_pinned_as_simulated (const StowRun *r);
/* The step OUT/latest names, 0 without one. */
guint latest_step (const char *out);
/* A new directory @name in the fixture's. */
char *make_dir (const Fixture *f, const char *name);
/* Entries in @dir (a swap directory: none once a run has ended). */
guint entries (const char *dir);
/* Starts @argv (argv[0] a path), its output discarded, not reaped. */
GPid spawn_quiet (const char *const *argv);
/* The same with its stderr into the file @err_path. */
GPid spawn_logged (const char *const *argv, const char *err_path);
/* Waits up to @timeout_ms for the file @path to hold @text. */
gboolean wait_for_text (const char *path, const char *text, guint timeout_ms);
/* $STOWAGE train with the fixture's flags (as trainv), @out and @extra
 * (NULL ended): an argv for the spawn helpers, borrowing the strings. */
GPtrArray *train_argv (Fixture *f, const char *out, const char *const *extra);
/* Sends @sig to @pid, waits for it and returns its wait status. */
int kill_and_wait (GPid pid, int sig);
/* The "loss" of each line of a --log-json file, in step order (doubles). */
GArray *log_losses (const char *log);
