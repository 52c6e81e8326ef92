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
 * before it reads any data, and each section when it reads it.  A file of
 * one of several ranks also holds its "rank" and "world", and each tensor
 * the "first" of its elements in the whole tensor and the "total"; a file
 * of one rank holding whole tensors holds neither, as before.
 *
 * Streaming: the writer knows every offset up front (from the specs), so it
 * writes the header first with each "xxh3" pending ("----------------", as
 * wide as 16 hex digits), streams the data through one XXH3 state per
 * section, and at finish rewrites the header in place (same length) with
 * the checksums, then the prefix with the header's own XXH3.  Memory stays
 * at one piece; a file whose writer died says "pending" and is refused. */

/* One tensor of the file.  A rank of a ZeRO run writes only its partition
 * of each tensor: elements [@first, @first + @n) of @total.  @total 0 (what
 * a caller that sets neither gets) is the whole tensor, @first 0 and @total
 * @n; such a file is the same bytes as before partitions existed. */
typedef struct
{
  const char *name;        /* the parameter's HF name */
  guint64 n;               /* elements in this file */
  guint n_sections;        /* 2 (m, v) or 3 (master, m, v) */
  const char *sections[4]; /* "master", "m", "v" */
  guint64 first;           /* the tensor's element at this file's 0 */
  guint64 total;           /* the tensor's elements; 0: @n, whole */
} StowOptimStateSpec;

/* The file of rank @rank of @world in a checkpoint directory (free it):
 * "optimizer.stow" for one rank, else "optimizer-rank00002-of-00004.stow"
 * (five digits, more past 99999). */
char *stow_optim_state_file_name (guint rank, guint world);

typedef struct _StowOptimStateWriter StowOptimStateWriter;

/* Writes @path (directly: it lives in a checkpoint's temporary directory).
 * @state is the caller's JSON object, copied (deeply) into the header.
 * Section names must be unique within a tensor, tensor names unique. */
StowOptimStateWriter *
stow_optim_state_writer_new (const char *path, const StowOptimStateSpec *specs,
                             guint n_specs, JsonObject *state, GError **error);
/* The same for rank @rank of @world (@rank < @world), recorded in the
 * header as "rank" and "world" when @world > 1, with every tensor's
 * "first" and "total"; rank 0 of 1 is stow_optim_state_writer_new.  Each
 * spec's @first + @n must not pass its @total
 * (STOW_CHECKPOINT_ERROR_INVALID naming the tensor). */
StowOptimStateWriter *stow_optim_state_writer_new_rank (
    const char *path, guint rank, guint world, const StowOptimStateSpec *specs,
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
/* Element count of tensor @name in this file, 0 when absent. */
guint64 stow_optim_state_tensor_n (const StowOptimState *s, const char *name);
/* The header's "rank" and "world" (0 and 1 when it has none). */
guint stow_optim_state_rank (const StowOptimState *s);
guint stow_optim_state_world (const StowOptimState *s);
/* Where this file's elements of tensor @name lie in the whole tensor: its
 * 0 is the tensor's @first, of @total (0 and n when the header says
 * nothing).  FALSE when absent. */
gboolean stow_optim_state_tensor_range (const StowOptimState *s,
                                        const char *name, guint64 *first,
                                        guint64 *total);
gboolean stow_optim_state_has_section (const StowOptimState *s,
                                       const char *name, const char *section);
/* Reads floats [@first, @first + @n) of a section into @dst, counted
 * from this file's first element (not the tensor's: see the set below).  The
 * section's checksum is verified when the read covers it whole (first 0,
 * n all), or when consecutive reads of it from float 0 reach its end (a
 * section streamed through a small buffer); STOW_CHECKPOINT_ERROR_CHECKSUM
 * names the file, tensor, section and offset.  An unknown tensor or
 * section, or a range past the tensor, is STOW_CHECKPOINT_ERROR_MISMATCH. */
gboolean stow_optim_state_read (StowOptimState *s, const char *name,
                                const char *section, guint64 first, guint64 n,
                                float *dst, GError **error);

/* ---- a checkpoint's files together ---------------------------------------
 * One optimizer.stow, or the N files optimizer-rankR-of-N.stow of a run of
 * N ranks, each holding its rank's partition of every tensor; read as one
 * file of whole tensors, whatever the number of ranks reading it. */

typedef struct _StowOptimStateSet StowOptimStateSet;

/* Opens optimizer.stow in @dir, or else every optimizer-rank*-of-N.stow.
 * Checks, before any data: one kind of file, never both; one N, and every
 * rank 0..N-1 present; each header's rank and world its name's; every file
 * with the same tensors, the same totals and the same sections; and for
 * every tensor, the N files' ranges covering [0, total) exactly once.
 * Errors (STOW_CHECKPOINT_ERROR_INVALID; _IO when none can be read) name
 * the file, the tensor and the elements: "optimizer-rank00002-of-00004.stow
 * missing", "tensor \"x\": elements [96, 128) are in no file", ... */
StowOptimStateSet *stow_optim_state_set_open (const char *dir, GError **error);
void stow_optim_state_set_close (StowOptimStateSet *set);
/* N, the ranks that wrote the files (1 for optimizer.stow). */
guint stow_optim_state_set_world (const StowOptimStateSet *set);
/* Rank 0's "state" object (owned by @set). */
JsonObject *stow_optim_state_set_get_state (const StowOptimStateSet *set);
/* The tensors, in rank 0's order; names owned by @set. */
guint stow_optim_state_set_n_tensors (const StowOptimStateSet *set);
const char *stow_optim_state_set_tensor_name (const StowOptimStateSet *set,
                                              guint i);
/* Tensor @name's elements (all ranks' together), 0 when absent. */
guint64 stow_optim_state_set_tensor_total (const StowOptimStateSet *set,
                                           const char *name);
gboolean stow_optim_state_set_has_section (const StowOptimStateSet *set,
                                           const char *name,
                                           const char *section);
/* Reads elements [@first, @first + @n) of the whole tensor into @dst,
 * from the files that hold them.  Every section of every file is verified
 * the first time any of it is read: a read of all of it hashes what it
 * reads; a read of part of it hashes the whole section once (the rest
 * passing through a 1 MiB buffer), so a range that cuts another rank's
 * partition, as repartitioning does, is never served unchecked.  A
 * section streamed in pieces is therefore read about twice; later reads
 * of a verified section are plain reads.  STOW_CHECKPOINT_ERROR_CHECKSUM
 * names the file, tensor and section; an unknown tensor or section, or a
 * range past the tensor, is STOW_CHECKPOINT_ERROR_MISMATCH. */
gboolean stow_optim_state_set_read (StowOptimStateSet *set, const char *name,
                                    const char *section, guint64 first,
                                    guint64 n, float *dst, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimStateSet, stow_optim_state_set_close)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimStateWriter,
                               stow_optim_state_writer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowOptimState, stow_optim_state_close)

G_END_DECLS
