/* SPDX-License-Identifier: MIT
 *
 * data/tokenizer.h: a model's own tokenizer, read from its tokenizer.json
 * (and, from a model directory, tokenizer_config.json and
 * generation_config.json) and applied as HF tokenizers applies it, id for
 * id: added and special tokens, the normalizers, the pre-tokenizers (Split
 * with the file's regex through GRegex, ByteLevel, Metaspace), the BPE
 * model (byte-level as GPT-2, Llama 3 and Qwen2; SentencePiece-style with
 * byte_fallback as Llama 2, Mistral and Phi-3), the post-processor's
 * special tokens and the decoders.  Other model types (Unigram,
 * WordPiece) and components stowage does not implement are refused by
 * name when the file is read, never approximated.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_TOKENIZER_ERROR (stow_tokenizer_error_quark ())
GQuark stow_tokenizer_error_quark (void);

typedef enum
{
  STOW_TOKENIZER_ERROR_IO,           /* a file cannot be read */
  STOW_TOKENIZER_ERROR_PARSE,        /* not JSON, or a member missing or
                                        wrong: the message names file and
                                        member */
  STOW_TOKENIZER_ERROR_UNSUPPORTED,  /* a model, normalizer, pre-tokenizer,
                                        post-processor or decoder type that
                                        stowage does not implement */
  STOW_TOKENIZER_ERROR_INVALID_UTF8, /* text to encode is not UTF-8: the
                                        message names the byte offset */
} StowTokenizerError;

/* A tokenizer.json tokenizer.  Shared (ref-counted) and immutable once
 * read, so that several threads encode with it, each through its own
 * StowHfEncoder. */
typedef struct _StowHfTokenizer StowHfTokenizer;
/* One thread's encoder: the cache of words already encoded and scratch
 * buffers.  Not thread-safe; make one per thread. */
typedef struct _StowHfEncoder StowHfEncoder;

/* Reads @path: a model directory (its tokenizer.json, and
 * tokenizer_config.json, generation_config.json and config.json when
 * present) or a tokenizer.json file (the configs beside it are read when
 * the file is named tokenizer.json).  The added tokens of
 * tokenizer_config.json's added_tokens_decoder that tokenizer.json lacks
 * are added, as transformers' AutoTokenizer adds them.  Errors name the
 * file and the member: STOW_TOKENIZER_ERROR_IO, _PARSE, _UNSUPPORTED. */
StowHfTokenizer *stow_hf_tokenizer_new_from_path (const char *path,
                                                  GError **error);
/* Reads @len bytes (-1: NUL-terminated) of tokenizer.json text; @name
 * stands for the file in messages.  No configs: BOS and EOS come from the
 * post-processor's template only. */
StowHfTokenizer *stow_hf_tokenizer_new_from_data (const char *json, gssize len,
                                                  const char *name,
                                                  GError **error);
StowHfTokenizer *stow_hf_tokenizer_ref (StowHfTokenizer *t);
void stow_hf_tokenizer_unref (StowHfTokenizer *t);

/* The file read (tokenizer.json's path, or @name), for messages. */
const char *stow_hf_tokenizer_name (const StowHfTokenizer *t);
/* One more than the largest id, added tokens included: the vocabulary a
 * model needs (ids are below it). */
guint32 stow_hf_tokenizer_n_ids (const StowHfTokenizer *t);
/* The id of @token (an added token or a vocabulary entry), or -1. */
gint64 stow_hf_tokenizer_token_to_id (const StowHfTokenizer *t,
                                      const char *token);
/* The string of @id (borrowed), or NULL. */
const char *stow_hf_tokenizer_id_to_token (const StowHfTokenizer *t,
                                           guint32 id);
/* TRUE when @id is a special added token (decode skips it). */
gboolean stow_hf_tokenizer_is_special (const StowHfTokenizer *t, guint32 id);

/* BOS and EOS, as transformers reads them: the bos_token / eos_token of
 * tokenizer_config.json, else generation_config.json's bos_token_id /
 * eos_token_id (the first of a list), else config.json's; -1 when none
 * names one.  Whether encoding a document starts it with BOS (ends it
 * with EOS): tokenizer_config.json's add_bos_token (add_eos_token) when
 * set, else whether the post-processor's template puts that token there. */
gint64 stow_hf_tokenizer_bos_id (const StowHfTokenizer *t);
gint64 stow_hf_tokenizer_eos_id (const StowHfTokenizer *t);
gboolean stow_hf_tokenizer_adds_bos (const StowHfTokenizer *t);
gboolean stow_hf_tokenizer_adds_eos (const StowHfTokenizer *t);

/* Appends to @ids (a GArray of guint32) the ids of @len bytes (-1:
 * NUL-terminated) of @text, as HF's encode(text, add_special_tokens)
 * gives them: with @add_special, the post-processor's tokens around them.
 * Text that is not valid UTF-8 is refused (STOW_TOKENIZER_ERROR_INVALID_UTF8
 * naming the byte offset; HF's Python API takes only valid strings) and
 * @ids is left as it was.  Thread-safe (through one shared encoder and a
 * lock: threads that encode a lot make their own StowHfEncoder). */
gboolean stow_hf_tokenizer_encode (StowHfTokenizer *t, const char *text,
                                   gssize len, gboolean add_special,
                                   GArray *ids, GError **error);
/* The text of @n @ids, as HF's decode(ids, skip_special_tokens) gives it:
 * through the decoders (ByteLevel, ByteFallback, Metaspace, Replace, Fuse,
 * Strip); invalid UTF-8 that byte tokens make becomes U+FFFD as HF makes
 * it.  Ids no token has are skipped.  Returns a NUL-terminated string
 * (which may hold NULs: its length in @out_len when not NULL). */
char *stow_hf_tokenizer_decode (const StowHfTokenizer *t, const guint32 *ids,
                                gsize n, gboolean skip_special, gsize *out_len);

StowHfEncoder *stow_hf_encoder_new (StowHfTokenizer *t);
void stow_hf_encoder_free (StowHfEncoder *e);
/* stow_hf_tokenizer_encode through @e (one thread's). */
gboolean stow_hf_encoder_encode (StowHfEncoder *e, const char *text, gssize len,
                                 gboolean add_special, GArray *ids,
                                 GError **error);

/* The offset of the first byte of @s that begins no valid UTF-8 character
 * (NUL is valid, unlike for g_utf8_validate with a length), or @len. */
gsize stow_utf8_valid_up_to (const char *s, gsize len);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowHfTokenizer, stow_hf_tokenizer_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowHfEncoder, stow_hf_encoder_free)

G_END_DECLS
