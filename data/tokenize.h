/* SPDX-License-Identifier: MIT
 *
 * data/tokenize.h: a corpus to llm.c token shards, what `stowage tokenize`
 * runs.  Documents (data/documents.h) are read in order, tokenized by
 * worker threads (each with its own encoder), and written in order, each
 * as [BOS when the tokenizer adds it] + its tokens + [EOS], to
 * PREFIX_train.bin, or to PREFIX_val.bin for the documents a seeded hash of
 * their index holds out; with prompt/completion data, loss masks beside
 * them (PREFIX_train.mask).  Memory is bounded by the batches in flight
 * (a few MiB per thread) and the largest document, never by the corpus.
 * The output is the same bytes for any number of threads.
 */
#pragma once

#include <glib.h>

#include "data/documents.h"
#include "data/tokenizer.h"

G_BEGIN_DECLS

typedef enum
{
  STOW_INPUT_AUTO, /* JSONL for .jsonl and .ndjson, text otherwise */
  STOW_INPUT_TEXT,
  STOW_INPUT_JSONL,
} StowInputFormat;

typedef struct
{
  guint64 bytes_done, bytes_total;
  guint64 documents, tokens;
} StowTokenizeProgress;

typedef struct
{
  StowHfTokenizer *tokenizer;
  const char *const *inputs; /* NULL-terminated */
  const char *out_prefix;
  StowInputFormat format;
  gboolean split_lines; /* text files: one document per line */
  StowDocFields fields;
  guint threads;       /* 0: one per core */
  double val_fraction; /* of the documents, in [0, 1) */
  guint64 seed;
  /* The ids each document starts with (-1: none) and ends with (required). */
  gint64 bos_id, eos_id;
  /* Called after each batch is written, from the calling thread. */
  void (*progress) (const StowTokenizeProgress *p, gpointer user);
  gpointer user;
} StowTokenizeJob;

typedef struct
{
  /* The files written, [0] train and [1] val (NULL when not written). */
  char *shard[2];
  char *mask[2];
  guint64 documents[2], tokens[2];
  guint token_bytes;
  guint threads;
} StowTokenizeResult;

void stow_tokenize_result_clear (StowTokenizeResult *r);

/* Runs @job.  On any error (an input's, the tokenizer's, a write's) no
 * output file is left (the outputs are written under temporary names and
 * renamed at the end) and the error names the file and the line: the
 * first error in the inputs' order.  Errors: STOW_DOCS_ERROR_*,
 * STOW_SHARD_ERROR_*, STOW_TOKENIZER_ERROR_* (an id past a 2-byte shard's
 * range cannot happen: the width comes from the tokenizer). */
gboolean stow_tokenize_corpus (const StowTokenizeJob *job,
                               StowTokenizeResult *result, GError **error);

G_END_DECLS
