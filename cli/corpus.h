/* SPDX-License-Identifier: MIT
 *
 * cli/corpus.h: text and JSONL to the token shards `stowage train` reads,
 * with a model's own tokenizer: the tokenizer and the ids each document
 * starts and ends with (shared by `stowage tokenize`), and --data /
 * --val-data tokenized once into stowage's cache.
 */
#pragma once

#include <glib.h>

#include "data/tokenize.h"

G_BEGIN_DECLS

/* The tokenizer at @path (a model directory or a tokenizer.json) and its
 * document ends: *@bos the id each document starts with when the
 * tokenizer adds one (-1 otherwise), *@eos the one each ends with (a
 * tokenizer that names none but has exactly one special token ends with
 * it, said on stderr).  Errors name the file; one without an EOS is
 * STOW_TOKENIZER_ERROR_UNSUPPORTED. */
StowHfTokenizer *stow_cli_tokenizer_open (const char *path, gint64 *bos,
                                          gint64 *eos, GError **error);

/* The spec `stowage train` reads for @flag (--data or --val-data) @spec:
 * NULL (read @spec as it is) when it names llm.c shards (every file
 * *.bin); else its text and JSONL files tokenized (as `stowage tokenize`
 * does, prompt/completion records with their loss masks) with
 * @tokenizer (a model directory or a tokenizer.json; NULL: @model_dir's)
 * into $XDG_CACHE_HOME/stowage/tokens/KEY/ (KEY a hash of the tokenizer
 * files and the inputs' names, sizes and times), once, and the shard
 * there.  @threads: 0 for one per core.  Errors name the flag, the file
 * and the line; nothing is left in the cache then. */
char *stow_cli_train_tokens (const char *flag, const char *spec,
                             const char *tokenizer, const char *model_dir,
                             guint threads, GError **error);

G_END_DECLS
