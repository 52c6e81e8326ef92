/* SPDX-License-Identifier: MIT
 *
 * data/shards.h: writing llm.c token shards, and the loss masks of
 * supervised fine-tuning beside them.  A shard is a header of 256 int32
 * (magic, version, token count; the rest 0) and the tokens: magic 20240520
 * version 1 with uint16 tokens when every id fits, 20240801 version 7 with
 * uint32 otherwise, as llm.c's dev/data/data_common.py writes them and
 * executor/data.c reads them.  A mask file has the same header with its own
 * magic (STOW_MASK_MAGIC, version 1, the count) and one byte per token of
 * its shard: 1 when the token counts in the loss as a target, 0 when not
 * (docs/executor.md, "Data").  Files are written under temporary names and
 * renamed only when every file of the set is complete: an error leaves
 * nothing behind.  Little-endian, as llm.c's numpy writes them.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_SHARD_ERROR (stow_shard_error_quark ())
GQuark stow_shard_error_quark (void);

typedef enum
{
  STOW_SHARD_ERROR_IO,       /* a file cannot be created or written */
  STOW_SHARD_ERROR_TOO_MANY, /* over the 2^31 - 1 tokens a header counts */
} StowShardError;

#define STOW_SHARD_MAGIC_U16   20240520
#define STOW_SHARD_VERSION_U16 1
#define STOW_SHARD_MAGIC_U32   20240801
#define STOW_SHARD_VERSION_U32 7
#define STOW_SHARD_HEADER_INTS 256
/* The loss mask beside a shard: a date, as llm.c's magics are. */
#define STOW_MASK_MAGIC       20261127
#define STOW_MASK_VERSION     1
#define STOW_SHARD_MAX_TOKENS ((guint64)G_MAXINT32)

/* Bytes per token for a vocabulary of @n_ids: 2 when every id fits
 * uint16, else 4. */
guint stow_shard_token_bytes (guint32 n_ids);

typedef struct _StowShardWriter StowShardWriter;

/* A shard at @path (and its mask at @mask_path, when not NULL), written
 * under temporary names in the same directory until
 * stow_shard_writer_commit.  @token_bytes: 2 or 4.  Errors:
 * STOW_SHARD_ERROR_IO naming @path. */
StowShardWriter *stow_shard_writer_new (const char *path, const char *mask_path,
                                        guint token_bytes, GError **error);
/* Appends @n tokens (each below 2^16 for 2-byte shards: the caller chose
 * the width from the vocabulary) and, for a writer with a mask, their @mask
 * bytes (NULL: all 1).  Errors: _IO, _TOO_MANY (the file would pass 2^31 -
 * 1 tokens). */
gboolean stow_shard_writer_append (StowShardWriter *w, const guint32 *ids,
                                   const guint8 *mask, gsize n, GError **error);
guint64 stow_shard_writer_n_tokens (const StowShardWriter *w);
/* Writes the headers and flushes the files to disk, still under their
 * temporary names. */
gboolean stow_shard_writer_finish (StowShardWriter *w, GError **error);
/* Renames the finished files to their names (after every writer of a set
 * finished).  Errors: _IO. */
gboolean stow_shard_writer_commit (StowShardWriter *w, GError **error);
/* Closes @w; the temporary files of a writer not committed are removed. */
void stow_shard_writer_free (StowShardWriter *w);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowShardWriter, stow_shard_writer_free)

G_END_DECLS
