/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint.h: training checkpoints that no crash can damage.
 * A checkpoint is a directory OUT/step-NNNNNN/ holding config.json,
 * model.safetensors and optimizer.stow (this module's optimizer-state
 * format: versioned, every section checksummed with XXH3-64); it is
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
} StowCheckpointError;

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

/* ---- the optimizer-state file (optimizer.stow) --------------------------
 * Layout (docs/checkpoint-format.md): 8 bytes "STOWOPT\0", a little-endian
 * uint32 version (1), a uint64 header length, the uint64 XXH3-64 of the
 * header, a JSON header padded with spaces so that the data begins at a
 * multiple of 64, then the sections' raw little-endian fp32 data, each
 * 64-byte aligned.  The header holds the caller's JSON object ("state":
 * step, data position, RNG, hyperparameters) and per tensor its name,
 * element count and sections (name, offset from the start of the data,
 * bytes, xxh3 as 16 hex digits), so a reader can check names and sizes
 * before it reads any data, and each section when it reads it.
 *
 * Streaming: the writer knows every offset up front (from the specs), so it
 * writes the header first with each "xxh3" pending ("----------------", as
 * wide as 16 hex digits), streams the data through one XXH3 state per
 * section, and at finish rewrites the header in place (same length) with
 * the checksums, then the prefix with the header's own XXH3.  Memory stays
 * at one piece; a file whose writer died says "pending" and is refused. */

typedef struct
{
  const char *name;        /* the parameter's HF name */
  guint64 n;               /* elements */
  guint n_sections;        /* 2 (m, v) or 3 (master, m, v) */
  const char *sections[4]; /* "master", "m", "v" */
} StowOptimStateSpec;

typedef struct _StowOptimStateWriter StowOptimStateWriter;

/* Writes @path (directly: it lives in a checkpoint's temporary directory).
 * @state is the caller's JSON object, copied (deeply) into the header.
 * Section names must be unique within a tensor, tensor names unique. */
StowOptimStateWriter *
stow_optim_state_writer_new (const char *path, const StowOptimStateSpec *specs,
                             guint n_specs, JsonObject *state, GError **error);
/* Appends @n floats of the current section: sections are written in spec
 * order (tensor 0's sections, then tensor 1's, ...), each in one or more
 * pieces; a piece may run on into the next section.  Writing past the
 * declared sections is STOW_CHECKPOINT_ERROR_INVALID; after any failure
 * the writer refuses further calls. */
gboolean stow_optim_state_writer_write (StowOptimStateWriter *w,
                                        const float *data, guint64 n,
                                        GError **error);
/* Checks every section was written, writes the checksums, fsyncs. */
gboolean stow_optim_state_writer_finish (StowOptimStateWriter *w,
                                         GError **error);
/* Removes @path unless finished; NULL-safe. */
void stow_optim_state_writer_free (StowOptimStateWriter *w);

typedef struct _StowOptimState StowOptimState;

/* Opens and validates the header (magic, version, the header's checksum:
 * STOW_CHECKPOINT_ERROR_CHECKSUM, offsets within the file and not
 * overlapping, sizes = 4 n, checksums not pending): errors name the file,
 * the tensor, the section and the field. */
StowOptimState *stow_optim_state_open (const char *path, GError **error);
void stow_optim_state_close (StowOptimState *s);
/* The caller's "state" object (owned by @s). */
JsonObject *stow_optim_state_get_state (const StowOptimState *s);
guint stow_optim_state_n_tensors (const StowOptimState *s);
/* Element count of tensor @name, 0 when absent. */
guint64 stow_optim_state_tensor_n (const StowOptimState *s, const char *name);
gboolean stow_optim_state_has_section (const StowOptimState *s,
                                       const char *name, const char *section);
/* Reads floats [@first, @first + @n) of a section into @dst.  The
 * section's checksum is verified when the read covers it whole (first 0,
 * n all), or when consecutive reads of it from float 0 reach its end (a
 * section streamed through a small buffer); STOW_CHECKPOINT_ERROR_CHECKSUM
 * names the file, tensor, section and offset.  An unknown tensor or
 * section, or a range past the tensor, is STOW_CHECKPOINT_ERROR_MISMATCH. */
gboolean stow_optim_state_read (StowOptimState *s, const char *name,
                                const char *section, guint64 first, guint64 n,
                                float *dst, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowCheckpointWriter,
                               stow_checkpoint_writer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimStateWriter,
                               stow_optim_state_writer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimState, stow_optim_state_close)

G_END_DECLS
