/* SPDX-License-Identifier: MIT
 *
 * executor/data.h: the token stream `stowage train` reads.  llm.c's token
 * shards (a header of 256 int32: magic, version, token count; then the
 * tokens: magic 20240520 uint16, 20240801 uint32), one file or a glob of
 * them concatenated in sorted name order; or a plain file read as bytes
 * (--tokenizer bytes: token = byte, for models with V >= 256).  Every
 * shard is validated, and every token checked against the vocabulary,
 * when the stream is opened: before any step runs.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_DATA_ERROR (stow_data_error_quark ())
GQuark stow_data_error_quark (void);

typedef enum
{
  STOW_DATA_ERROR_IO,      /* a file cannot be opened or read */
  STOW_DATA_ERROR_INVALID, /* bad magic, truncated, count mismatch */
  STOW_DATA_ERROR_TOKEN,   /* a token id >= vocab: file and position */
  STOW_DATA_ERROR_EMPTY,   /* no file matches, or too few tokens */
} StowDataError;

#define STOW_DATA_MAGIC_U16   20240520
#define STOW_DATA_MAGIC_U32   20240801
#define STOW_DATA_HEADER_INTS 256

typedef enum
{
  STOW_TOKENIZER_NONE,  /* llm.c shards */
  STOW_TOKENIZER_BYTES, /* a plain file, one token per byte */
} StowTokenizer;

typedef struct _StowTokenData StowTokenData;

/* Opens @spec: a path, a glob ("data/train_*.bin"), or several of either
 * joined by ','; all the files named are read in sorted name order, each
 * once (empty parts are ignored; a glob that matches nothing is
 * STOW_DATA_ERROR_EMPTY).  Checks each shard (magic; version 1 with magic
 * 20240520 and 7 with 20240801, as llm.c's data_common.py writes them; the
 * count in the header against the file's size: errors name the file and
 * the field, "header[2] (token count)") and each token id against @vocab
 * (STOW_DATA_ERROR_TOKEN: "train.bin: token 1234 of 5000 (byte 3492) is
 * 50257, vocab_size is 32000", counted from 0 within the file).  @vocab
 * must be in [1, 2^31] (ids leave as int32), and at least 256 for
 * STOW_TOKENIZER_BYTES: STOW_DATA_ERROR_INVALID otherwise.  No token at all
 * is STOW_DATA_ERROR_EMPTY.  The files are mapped read-only and must not
 * change while open. */
StowTokenData *stow_token_data_open (const char *spec, StowTokenizer tokenizer,
                                     guint64 vocab, GError **error);
void stow_token_data_free (StowTokenData *d);
/* Tokens in the whole stream (all shards). */
guint64 stow_token_data_n_tokens (const StowTokenData *d);
/* The files, in stream order, NULL-terminated. */
const char *const *stow_token_data_files (const StowTokenData *d);
/* Copies tokens [@start, @start + @count) of the stream to @out, wrapping
 * to the stream's beginning past its end (the next epoch).  Never fails:
 * the stream was validated at open. */
void stow_token_data_read (const StowTokenData *d, guint64 start, guint64 count,
                           gint32 *out);
/* Whether a shard has a loss mask beside it: X.mask for X.bin
 * (data/shards.h; supervised fine-tuning), checked at open: magic,
 * version, the shard's token count, every byte 0 or 1. */
gboolean stow_token_data_has_mask (const StowTokenData *d);
/* The mask bytes of tokens [@start, @start + @count), as read does (1 for
 * the tokens of shards without a mask). */
void stow_token_data_read_mask (const StowTokenData *d, guint64 start,
                                guint64 count, guint8 *out);

/* ---- micro-batches --------------------------------------------------------
 * The data convention (docs/executor.md): micro-batch g of the run (g =
 * (step - 1) x grad_accum + i) reads tokens [g B T, g B T + B T + 1) of
 * the stream, row b its tokens [b T, b T + T) and targets one further;
 * with shuffling the whole windows of each pass over the stream are
 * permuted from the seed.  The component a backend's data op reads. */
typedef struct _StowBatches StowBatches;

/* Micro-batches of @window (B T) tokens from @data (borrowed: it must
 * outlive them), @grad_accum per step.  The stream must hold at least
 * @window + 1 tokens (the caller checks, naming its files). */
StowBatches *stow_batches_new (const StowTokenData *data, guint64 window,
                               guint64 grad_accum, gboolean shuffle,
                               guint64 seed);
void stow_batches_free (StowBatches *b);
/* A target the loss leaves out (its mask byte is 0): no loss, no
 * gradient (executor/kernels.h's xent). */
#define STOW_TARGET_IGNORE (-1)

/* The tokens and targets (@n each, at most the window) of micro-batch
 * @micro_batch of step @step (1-based); a target whose mask byte is 0 is
 * STOW_TARGET_IGNORE.  Not thread-safe: one stream's worker calls it.
 * Never fails (the stream was validated at open). */
void stow_batches_fill (StowBatches *b, guint64 step, guint micro_batch,
                        gint32 *tokens, gint32 *targets, guint64 n);
/* The targets of step @step's whole global batch that count (mask 1;
 * without masks every one: grad_accum x window). */
guint64 stow_batches_targets (StowBatches *b, guint64 step);
/* The whole steps the stream holds without wrapping (0 when less). */
guint64 stow_batches_n_steps (const StowBatches *b);
/* The step's loss scale: 1 / the targets of its whole global batch (the
 * loss is the mean over them; without masks 1 / (global batch x seq)),
 * NaN when every target of the step is masked (the step is then skipped
 * as a non-finite one). */
double stow_batches_loss_scale (StowBatches *b, guint64 step);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowTokenData, stow_token_data_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBatches, stow_batches_free)

G_END_DECLS
