/* SPDX-License-Identifier: MIT
 *
 * data/bpe.h: the BPE model of a tokenizer.json ("model": {"type": "BPE"}),
 * as HF tokenizers applies it to one pre-token at a time: the vocabulary,
 * the merges with their ranks, byte_fallback, unk and fuse_unk,
 * ignore_merges, continuing_subword_prefix and end_of_word_suffix.  Private
 * to data/: data/tokenizer.c is its only user.  Not the pipeline around it
 * (normalizers, pre-tokenizers, added tokens: data/tokenizer.c).
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

typedef struct _StowBpe StowBpe;
/* A cache of pre-tokens already encoded, and the scratch of the merge
 * loop: one per thread. */
typedef struct _StowBpeCache StowBpeCache;

/* Reads @model (the tokenizer.json's "model" object); @name is the file,
 * for messages ("tokenizer.json: model.merges[12]: ...").  Errors:
 * STOW_TOKENIZER_ERROR_PARSE (a member missing or of the wrong type, a
 * merge of tokens that are not in the vocabulary), _UNSUPPORTED (a model
 * type other than BPE). */
StowBpe *stow_bpe_new (JsonObject *model, const char *name, GError **error);
void stow_bpe_free (StowBpe *b);

/* Entries in the vocabulary (HF's get_vocab_size), and the largest id + 1. */
guint32 stow_bpe_vocab_entries (const StowBpe *b);
guint32 stow_bpe_n_ids (const StowBpe *b);
/* The id of @len bytes of @token, or -1. */
gint64 stow_bpe_token_to_id (const StowBpe *b, const char *token, gsize len);
/* The string of @id (borrowed, NUL-terminated, its length in @len), or NULL
 * when no token has that id. */
const char *stow_bpe_id_to_token (const StowBpe *b, guint32 id, gsize *len);
/* TRUE when ignore_merges is set. */
gboolean stow_bpe_ignores_merges (const StowBpe *b);

StowBpeCache *stow_bpe_cache_new (void);
void stow_bpe_cache_free (StowBpeCache *c);

/* Appends the ids of the pre-token @word (@len bytes of valid UTF-8) to
 * @out (guint32).  With @raw_bytes, @word is the text before the ByteLevel
 * pre-tokenizer's mapping of each byte to a character, which the model
 * applies itself (the result is that of the mapped word).  Never fails:
 * characters the vocabulary lacks become byte tokens, unk or nothing, as
 * HF does. */
void stow_bpe_encode_word (const StowBpe *b, StowBpeCache *c, const char *word,
                           gsize len, gboolean raw_bytes, GArray *out);

/* GPT-2's byte-to-character table (HF's bytes_char): the UTF-8 of the
 * character byte @b stands for, in @out (at most 2 bytes); returns its
 * length. */
guint stow_bpe_byte_char (guint8 b, char out[2]);
/* The byte character @c stands for, or -1 when it stands for none. */
int stow_bpe_char_byte (gunichar c);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBpe, stow_bpe_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowBpeCache, stow_bpe_cache_free)

G_END_DECLS
