/* SPDX-License-Identifier: MIT
 *
 * data/tokenizer-private.h: the parts of a StowHfTokenizer, as
 * data/tokenizer.c reads them from tokenizer.json and data/encode.c and
 * data/decode.c apply them.  Each component is HF tokenizers' of the same
 * name (tokenizers/src/{normalizers,pre_tokenizers,decoders,processors});
 * the comments say where ours differs in how, never in what.
 */
#pragma once

#include "data/bpe.h"
#include "data/tokenizer.h"

G_BEGIN_DECLS

typedef enum
{
  NORM_NFC,
  NORM_NFD,
  NORM_NFKC,
  NORM_NFKD,
  NORM_PREPEND, /* @text before a non-empty string */
  NORM_REPLACE, /* every match of @pattern by @text */
} NormKind;

/* A pattern of Split or Replace: a literal string or a regex. */
typedef struct
{
  char *literal; /* NULL for a regex */
  gsize literal_len;
  GRegex *regex;
} Pattern;

typedef struct
{
  NormKind kind;
  char *text;
  gsize text_len;
  Pattern pattern;
} Normalizer;

typedef enum
{
  SPLIT_ISOLATED,
  SPLIT_REMOVED,
  SPLIT_MERGED_WITH_PREVIOUS,
  SPLIT_MERGED_WITH_NEXT,
  SPLIT_CONTIGUOUS,
} SplitBehavior;

typedef enum
{
  PREPEND_ALWAYS,
  PREPEND_FIRST,
  PREPEND_NEVER,
} PrependScheme;

typedef enum
{
  PRE_SPLIT,
  PRE_BYTE_LEVEL,
  PRE_METASPACE,
} PreKind;

typedef struct
{
  PreKind kind;
  /* Split; ByteLevel with use_regex (GPT-2's regex) */
  Pattern pattern;
  SplitBehavior behavior;
  gboolean invert;
  /* ByteLevel */
  gboolean add_prefix_space;
  gboolean use_regex;
  /* Metaspace */
  char replacement[8];
  gsize replacement_len;
  PrependScheme prepend;
  gboolean split;
} PreTokenizer;

typedef enum
{
  DEC_BYTE_LEVEL,
  DEC_REPLACE,
  DEC_BYTE_FALLBACK,
  DEC_FUSE,
  DEC_STRIP,
  DEC_METASPACE,
} DecKind;

typedef struct
{
  DecKind kind;
  Pattern pattern; /* Replace */
  char *text;      /* Replace's content */
  gsize text_len;
  gunichar strip_char; /* Strip's content; Metaspace's replacement */
  guint strip_start, strip_stop;
  PrependScheme prepend; /* Metaspace */
} Decoder;

typedef struct
{
  char *content;
  gsize len;
  /* The normalizer's output for normalized tokens (what they match in
   * normalized text, and what decode gives); NULL when the same. */
  char *normalized_form;
  gsize normalized_len;
  guint32 id;
  gboolean special, lstrip, rstrip, single_word, normalized;
} AddedToken;

/* Added tokens by first byte, longest first: leftmost-longest matching
 * (HF's Aho-Corasick with MatchKind::LeftmostLongest). */
typedef struct
{
  guint8 first[256];
  GPtrArray *by_first[256]; /* AddedToken *, borrowed */
} Matcher;

struct _StowHfTokenizer
{
  gint ref_count;
  char *name;
  StowBpe *bpe;
  Normalizer *norms;
  guint n_norms;
  PreTokenizer *pres;
  guint n_pres;
  /* The last pre-tokenizer is ByteLevel: words reach the model as text
   * and the model maps their bytes itself. */
  gboolean raw_bytes;
  Decoder *decs;
  guint n_decs;
  gboolean has_decoder;

  GPtrArray *added;             /* AddedToken *, owned, in file order */
  GHashTable *added_by_content; /* char * -> AddedToken * */
  GHashTable *added_by_id;      /* GUINT_TO_POINTER (id) -> AddedToken * */
  GHashTable *special_strings;  /* contents of special tokens */
  Matcher raw_matcher;          /* tokens with normalized false */
  Matcher normalized_matcher;   /* tokens with normalized true */

  /* The post-processor's tokens around one sequence. */
  GArray *prefix_ids; /* guint32 */
  GArray *suffix_ids;

  guint32 n_ids;
  gint64 bos_id, eos_id;
  gboolean adds_bos, adds_eos;

  GMutex lock; /* for the shared encoder */
  StowHfEncoder *shared;
};

/* data/tokenizer.c: sets "@name: MESSAGE" in @error; returns FALSE. */
gboolean stow_tokenizer_fail (GError **error, StowTokenizerError code,
                              const char *name, const char *format, ...)
    G_GNUC_PRINTF (4, 5);

/* data/regex.c: @pattern, written for Oniguruma, compiled by GRegex to
 * match what Oniguruma matches. */
GRegex *stow_onig_regex_new (const char *pattern, GError **error);

/* data/encode.c */
void stow_matcher_build (Matcher *m, GPtrArray *added, gboolean normalized);
void stow_matcher_clear (Matcher *m);
/* Applies the normalizers to @len bytes of @s: a new string (its length
 * in @out_len), or NULL when they leave it as it is. */
char *stow_normalize (const StowHfTokenizer *t, const char *s, gsize len,
                      gsize *out_len);

/* data/decode.c: Rust's String::from_utf8_lossy: each maximal invalid
 * subsequence becomes one U+FFFD. */
void stow_append_utf8_lossy (GString *out, const char *s, gsize len);

/* Unicode's White_Space property (Rust's char::is_whitespace and regex \s). */
gboolean stow_is_white_space (gunichar c);

G_END_DECLS
