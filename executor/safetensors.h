/* SPDX-License-Identifier: MIT
 *
 * executor/safetensors.h: reading and writing safetensors files, the format
 * HF transformers' from_pretrained loads (an 8-byte little-endian header
 * length, a JSON header naming each tensor's dtype, shape and byte range,
 * then the raw data).  Every header field is checked before any data is
 * read: sizes, offsets, overlaps and shapes against the file's length.
 * Not here: which tensors a model has (models/, the unit layouts).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_SAFETENSORS_ERROR (stow_safetensors_error_quark ())
GQuark stow_safetensors_error_quark (void);

typedef enum
{
  STOW_SAFETENSORS_ERROR_IO,      /* open, read, write, fsync, rename */
  STOW_SAFETENSORS_ERROR_INVALID, /* a malformed or truncated file */
  STOW_SAFETENSORS_ERROR_MISSING, /* no tensor of that name */
} StowSafetensorsError;

/* Largest header accepted (the format's own reference reader: 100 MB). */
#define STOW_SAFETENSORS_MAX_HEADER ((guint64)100 << 20)
#define STOW_SAFETENSORS_MAX_DIMS   8

typedef struct
{
  char *name;  /* "model.layers.0.self_attn.q_proj.weight" */
  char *dtype; /* "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8",
                  "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2" */
  guint64 shape[STOW_SAFETENSORS_MAX_DIMS];
  guint n_dims;
  guint64 numel;
  guint64 offset; /* from the start of the data section */
  guint64 nbytes; /* numel x the dtype's size */
} StowSafetensor;

/* Bytes per element of a safetensors dtype name; 0 if unknown. */
guint stow_safetensors_dtype_size (const char *dtype);

typedef struct _StowSafetensors StowSafetensors;

/* Opens @path and validates its header: STOW_SAFETENSORS_ERROR_INVALID
 * names the file and the field ("x.safetensors: tensor
 * \"lm_head.weight\": data_offsets [0, 96) hold 96 bytes, shape [4, 8] of
 * F32 needs 128"), including a file shorter than its header says, JSON
 * nested deeper than the format needs (refused before json-glib parses it),
 * and tensors whose bytes overlap.  Tensors need not be contiguous. */
StowSafetensors *stow_safetensors_open (const char *path, GError **error);
void stow_safetensors_close (StowSafetensors *st);
const char *stow_safetensors_path (const StowSafetensors *st);
guint stow_safetensors_n_tensors (const StowSafetensors *st);
/* In the header's order of data offsets. */
const StowSafetensor *stow_safetensors_nth (const StowSafetensors *st, guint i);
/* NULL when absent. */
const StowSafetensor *stow_safetensors_find (const StowSafetensors *st,
                                             const char *name);
/* "__metadata__"'s string value for @key, or NULL. */
const char *stow_safetensors_metadata (const StowSafetensors *st,
                                       const char *key);
/* Copies @bytes of @tensor's data, from @offset within the tensor, to
 * @dst.  A short read is STOW_SAFETENSORS_ERROR_IO naming the file and
 * the file offset. */
gboolean stow_safetensors_read (StowSafetensors *st,
                                const StowSafetensor *tensor, guint64 offset,
                                void *dst, guint64 bytes, GError **error);

/* What the writer is told up front, so the header can go first. */
typedef struct
{
  const char *name;
  const char *dtype;
  guint64 shape[STOW_SAFETENSORS_MAX_DIMS];
  guint n_dims;
} StowSafetensorSpec;

typedef struct _StowSafetensorsWriter StowSafetensorsWriter;

/* Starts writing @path: a temporary file beside it (same directory,
 * mode 0644) gets the header for @specs (in this order, data contiguous,
 * padded with spaces to a multiple of 8 bytes as the reference writer
 * does) and __metadata__ {"format": "pt"} plus @metadata (string to string,
 * may be NULL; its "format", if any, wins).  Names must be unique. */
StowSafetensorsWriter *
stow_safetensors_writer_new (const char *path, const StowSafetensorSpec *specs,
                             guint n_specs, GHashTable *metadata,
                             GError **error);
/* Appends @bytes of tensor data; tensors are written in spec order, each
 * in one or more pieces (so a large model streams through a small
 * buffer).  Writing past the declared sizes is an error; after any error
 * the writer refuses further calls and finish fails. */
gboolean stow_safetensors_writer_write (StowSafetensorsWriter *w,
                                        const void *data, guint64 bytes,
                                        GError **error);
/* Checks every declared byte was written, fsyncs and renames into place.
 * On any failure the temporary file is removed and @path is untouched. */
gboolean stow_safetensors_writer_finish (StowSafetensorsWriter *w,
                                         GError **error);
/* Removes the temporary file unless finished; NULL-safe. */
void stow_safetensors_writer_free (StowSafetensorsWriter *w);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowSafetensors, stow_safetensors_close)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowSafetensorsWriter,
                               stow_safetensors_writer_free)

G_END_DECLS
