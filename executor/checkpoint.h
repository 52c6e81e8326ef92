/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint.h: training checkpoints that no crash can damage.
 * A checkpoint is a directory OUT/step-NNNNNN/ holding config.json,
 * model.safetensors and optimizer.stow (executor/optim-state.h: versioned,
 * every section checksummed with XXH3-64); it is
 * written into a temporary directory OUT/.step-NNNNNN.tmp-XXXXXX, every
 * file and the directory fsynced, then renamed into place; then OUT/latest,
 * a symbolic link to the newest complete step, is replaced atomically
 * (a new link renamed over it) and OUT fsynced.  kill -9 at any moment
 * leaves the previous checkpoint and `latest` intact; leftover temporary
 * directories are removed by the next run.
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define STOW_CHECKPOINT_ERROR (stow_checkpoint_error_quark ())
GQuark stow_checkpoint_error_quark (void);

typedef enum
{
  STOW_CHECKPOINT_ERROR_IO,       /* create, write, fsync, rename, read */
  STOW_CHECKPOINT_ERROR_INVALID,  /* malformed, truncated, wrong version */
  STOW_CHECKPOINT_ERROR_CHECKSUM, /* a section's XXH3 does not match */
  STOW_CHECKPOINT_ERROR_MISMATCH, /* shapes or names differ from the model */
  STOW_CHECKPOINT_ERROR_BUSY,     /* another process holds OUT's lock */
} StowCheckpointError;

/* ---- one writer per run directory ----------------------------------------
 * An advisory lock (flock) on OUT/.lock, taken before anything in OUT is
 * read or touched and held for the run's life.  The kernel releases it
 * when the process ends, kill -9 included, so a lock is never stale; the
 * file holds the holder's pid, host and start time for the refusal. */

typedef struct _StowRunLock StowRunLock;

/* Creates @out_dir if needed (0755) and locks it.  Another process
 * holding it is STOW_CHECKPOINT_ERROR_BUSY: "OUT is being trained by pid N
 * on HOST (started ...); wait for it or use another --out"; a file system
 * that refuses locks is STOW_CHECKPOINT_ERROR_IO naming OUT. */
StowRunLock *stow_run_lock_take (const char *out_dir, GError **error);
/* Whether taking the lock created @out_dir. */
gboolean stow_run_lock_created_dir (const StowRunLock *lock);
/* Removes OUT/.lock (still holding it: a process that opened it meanwhile
 * sees it replaced and starts again) and releases the lock; with
 * @remove_dir, also OUT when the lock created it and it is empty again
 * (a run refused before it wrote anything leaves nothing).  NULL-safe. */
void stow_run_lock_release (StowRunLock *lock, gboolean remove_dir);

/* ---- the checkpoint directory ------------------------------------------ */

typedef struct _StowCheckpointWriter StowCheckpointWriter;

/* Creates @out_dir if needed (0755), removes leftover temporary
 * directories of earlier runs, and makes the temporary directory for
 * step @step. */
StowCheckpointWriter *stow_checkpoint_begin (const char *out_dir, guint64 step,
                                             GError **error);
/* The temporary directory to write the files into. */
const char *stow_checkpoint_writer_dir (const StowCheckpointWriter *w);
/* fsyncs every regular file in the temporary directory (and below) and
 * the directory, renames it to OUT/step-NNNNNN, points OUT/latest at it
 * atomically, fsyncs OUT.  An older directory of the same step is swapped
 * out with renameat2(RENAME_EXCHANGE), so `latest` never names a missing
 * directory, and removed after `latest` moved (file systems without the
 * exchange: moved aside first, put back by the next begin if a crash came
 * in between).  On failure nothing that existed before is changed.  One
 * writer per OUT at a time. */
gboolean stow_checkpoint_commit (StowCheckpointWriter *w, GError **error);
/* Removes the temporary directory unless committed; NULL-safe. */
void stow_checkpoint_writer_free (StowCheckpointWriter *w);

/* The directory OUT/latest points to (OUT/step-NNNNNN), or NULL with no
 * error when there is none (no OUT, no link).  If a run died while it
 * replaced that very step on a file system without RENAME_EXCHANGE, this
 * returns the old directory where it was moved aside
 * (OUT/.step-NNNNNN.old-XXXXXX: whole; the next begin renames it back).
 * A link to a missing directory, or to anything but a step-NNNNNN
 * directory (which only commit names, once complete), is
 * STOW_CHECKPOINT_ERROR_INVALID naming it. */
char *stow_checkpoint_latest (const char *out_dir, GError **error);

/* The committed checkpoints in @out_dir: the names step-NNNNNN, oldest
 * step first (NULL-terminated; empty when there are none or no OUT).
 * Only commit names a directory so, once it is complete. */
char **stow_checkpoint_list (const char *out_dir, GError **error);
/* The step a name of stow_checkpoint_list stands for. */
guint64 stow_checkpoint_name_step (const char *name);
/* Removes every committed checkpoint in @out_dir but @keep (a name
 * step-NNNNNN), then fsyncs OUT: what `--overwrite` replaces, once the
 * new run's first checkpoint is committed. */
gboolean stow_checkpoint_remove_others (const char *out_dir, const char *keep,
                                        GError **error);
/* Removes the committed checkpoints of @out_dir but the @keep newest and
 * the one `latest` names (--keep-last).  Each removed one is renamed to a
 * temporary name first, so a crash midway leaves no half-removed step-N
 * (the next begin clears the rest); so are remove_others'. */
gboolean stow_checkpoint_prune (const char *out_dir, guint keep,
                                GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowCheckpointWriter,
                               stow_checkpoint_writer_free)

G_END_DECLS
