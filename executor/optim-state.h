/* SPDX-License-Identifier: MIT
 *
 * executor/optim-state.h: the optimizer-state file of a checkpoint
 * (optimizer.stow), written as a stream and read back by range with every
 * section checked.  Not here: where the file lives (the checkpoint
 * directory protocol, executor/checkpoint.h, whose error domain this
 * shares).
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

#include "executor/checkpoint.h" /* STOW_CHECKPOINT_ERROR */

G_BEGIN_DECLS

/* Layout (docs/checkpoint-format.md): 8 bytes "STOWOPT\0", a little-endian
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

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimStateWriter,
                               stow_optim_state_writer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimState, stow_optim_state_close)

G_END_DECLS
