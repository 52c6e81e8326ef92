/* SPDX-License-Identifier: MIT
 *
 * data/bpe.c: the BPE model (see bpe.h).  The merge loop is HF's
 * (tokenizers/src/models/bpe/word.rs, merge_all): a min-heap of the
 * adjacent pairs that have a merge, by rank then position; a popped pair
 * that is no longer there is skipped.  Words already encoded are cached
 * per thread, which is where the speed comes from: text repeats its words.
 */
#include "data/bpe.h"

#include <string.h>

#include "data/tokenizer-private.h"

/* U+2581, SentencePiece's space. */
#define SP_SPACE     "\xe2\x96\x81"
#define SP_SPACE_LEN 3

/* ---- hashing ------------------------------------------------------------ */

static inline guint64
mix64 (guint64 x)
{
  /* MurmurHash3's finaliser. */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static guint64
hash_bytes (const char *p, gsize n)
{
  guint64 h = 0x9e3779b97f4a7c15ULL ^ (guint64)n;
  while (n >= 8)
    {
      guint64 v;
      memcpy (&v, p, 8);
      h = mix64 (h ^ v);
      p += 8;
      n -= 8;
    }
  if (n > 0)
    {
      guint64 v = 0;
      memcpy (&v, p, n);
      h = mix64 (h ^ v ^ 0xa5a5a5a5a5a5a5a5ULL);
    }
  /* 0 marks an empty slot. */
  return h | 1;
}

/* String keys in an arena -> a 32-bit value; open addressing. */
typedef struct
{
  guint64 hash; /* 0: empty */
  guint32 off, len;
  guint32 value;
  guint32 extra;
} StrSlot;

typedef struct
{
  StrSlot *slots;
  guint32 mask;
  guint32 n;
} StrMap;

static void
strmap_init (StrMap *m, guint32 capacity)
{
  guint32 size = 16;
  while (size < capacity * 2)
    size *= 2;
  m->slots = g_new0 (StrSlot, size);
  m->mask = size - 1;
  m->n = 0;
}

static void
strmap_clear (StrMap *m)
{
  g_free (m->slots);
  m->slots = NULL;
  m->mask = 0;
  m->n = 0;
}

/* The slot of @key (found, or where it would go). */
static StrSlot *
strmap_slot (const StrMap *m, const char *arena, const char *key, gsize len,
             guint64 h)
{
  guint32 i = (guint32)h & m->mask;
  for (;;)
    {
      StrSlot *s = &m->slots[i];
      if (s->hash == 0
          || (s->hash == h && s->len == len
              && memcmp (arena + s->off, key, len) == 0))
        return s;
      i = (i + 1) & m->mask;
    }
}

static void
strmap_grow (StrMap *m)
{
  StrMap bigger;
  strmap_init (&bigger, (m->mask + 1));
  for (guint32 i = 0; i <= m->mask; i++)
    if (m->slots[i].hash != 0)
      {
        guint32 j = (guint32)m->slots[i].hash & bigger.mask;
        while (bigger.slots[j].hash != 0)
          j = (j + 1) & bigger.mask;
        bigger.slots[j] = m->slots[i];
      }
  bigger.n = m->n;
  strmap_clear (m);
  *m = bigger;
}

/* (left id, right id) -> (rank << 32 | merged id); open addressing. */
typedef struct
{
  guint64 key; /* G_MAXUINT64: empty */
  guint64 value;
} PairSlot;

typedef struct
{
  PairSlot *slots;
  guint64 mask;
} PairMap;

static inline guint64
pair_key (guint32 a, guint32 b)
{
  return ((guint64)a << 32) | b;
}

static inline guint64
pair_hash (guint64 key)
{
  return (key * 0x9e3779b97f4a7c15ULL) >> 17;
}

static gboolean
pair_get (const PairMap *m, guint32 a, guint32 b, guint64 *value)
{
  guint64 key = pair_key (a, b);
  guint64 i = pair_hash (key) & m->mask;
  for (;;)
    {
      const PairSlot *s = &m->slots[i];
      if (s->key == key)
        {
          *value = s->value;
          return TRUE;
        }
      if (s->key == G_MAXUINT64)
        return FALSE;
      i = (i + 1) & m->mask;
    }
}

/* Inserts or, for a pair listed twice, overwrites: HF collects the merges
 * into a map, so the last rank of a pair wins. */
static void
pair_put (PairMap *m, guint32 a, guint32 b, guint64 value)
{
  guint64 key = pair_key (a, b);
  guint64 i = pair_hash (key) & m->mask;
  while (m->slots[i].key != G_MAXUINT64 && m->slots[i].key != key)
    i = (i + 1) & m->mask;
  m->slots[i].key = key;
  m->slots[i].value = value;
}

/* ---- the model ---------------------------------------------------------- */

struct _StowBpe
{
  GByteArray *arena; /* every vocabulary string, NUL-terminated */
  StrMap vocab;      /* string -> id */
  guint32 n_entries;
  guint32 n_ids;   /* largest id + 1 */
  guint32 *id_off; /* n_ids; G_MAXUINT32 where no token has the id */
  guint32 *id_len;
  PairMap merges;

  char *unk;
  gint64 unk_id;
  char *prefix; /* continuing_subword_prefix */
  char *suffix; /* end_of_word_suffix */
  gboolean fuse_unk, byte_fallback, ignore_merges;

  /* The id of the character byte b stands for (ByteLevel), -1 if none;
   * TRUE when all 256 have one, so raw words skip the mapping. */
  gint64 byte_char_id[256];
  gboolean byte_chars_complete;
  /* The id of "<0xXX>" for byte_fallback, -1 if none. */
  gint64 fallback_id[256];
  /* A word may be cut before each U+2581 that follows another character:
   * no token holds U+2581 after another character, so no merge crosses
   * such a point, and the merges on each side are those of the whole
   * (see sp_split_is_safe).  SentencePiece-style files have no
   * pre-tokenizer: the whole text is one word, and this is what lets
   * the cache work on them. */
  gboolean sp_split;
};

gint64
stow_bpe_token_to_id (const StowBpe *b, const char *token, gsize len)
{
  if (len > G_MAXUINT32)
    return -1;
  guint64 h = hash_bytes (token, len);
  const StrSlot *s
      = strmap_slot (&b->vocab, (const char *)b->arena->data, token, len, h);
  return s->hash ? (gint64)s->value : -1;
}

const char *
stow_bpe_id_to_token (const StowBpe *b, guint32 id, gsize *len)
{
  if (id >= b->n_ids || b->id_off[id] == G_MAXUINT32)
    return NULL;
  if (len)
    *len = b->id_len[id];
  return (const char *)b->arena->data + b->id_off[id];
}

guint32
stow_bpe_vocab_entries (const StowBpe *b)
{
  return b->n_entries;
}

guint32
stow_bpe_n_ids (const StowBpe *b)
{
  return b->n_ids;
}

gboolean
stow_bpe_ignores_merges (const StowBpe *b)
{
  return b->ignore_merges;
}

/* GPT-2's bytes_to_unicode (HF's bytes_char): printable Latin-1 bytes
 * stand for themselves, the others for 256 + n in byte order.  Both
 * directions, built once. */
static struct
{
  char utf8[256][2];
  guint8 len[256];
  gint16 byte_of[256 + 68]; /* -1: no byte */
} byte_chars;

static void
byte_chars_init (void)
{
  static gsize once;
  if (!g_once_init_enter (&once))
    return;
  guint n = 0;
  for (guint i = 0; i < G_N_ELEMENTS (byte_chars.byte_of); i++)
    byte_chars.byte_of[i] = -1;
  for (guint b = 0; b < 256; b++)
    {
      gboolean printable
          = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      gunichar c = printable ? b : 256 + n++;
      char buf[6];
      byte_chars.len[b] = (guint8)g_unichar_to_utf8 (c, buf);
      memcpy (byte_chars.utf8[b], buf, byte_chars.len[b]);
      byte_chars.byte_of[c] = (gint16)b;
    }
  g_once_init_leave (&once, 1);
}

guint
stow_bpe_byte_char (guint8 b, char out[2])
{
  byte_chars_init ();
  memcpy (out, byte_chars.utf8[b], byte_chars.len[b]);
  return byte_chars.len[b];
}

int
stow_bpe_char_byte (gunichar c)
{
  byte_chars_init ();
  return c < G_N_ELEMENTS (byte_chars.byte_of) ? byte_chars.byte_of[c] : -1;
}

static gboolean
get_optional_string (JsonObject *model, const char *name, const char *member,
                     char **out, GError **error)
{
  JsonNode *n = json_object_get_member (model, member);
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_STRING)
    return stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                                "model.%s: expected a string or null", member);
  *out = g_strdup (json_node_get_string (n));
  return TRUE;
}

static gboolean
get_optional_bool (JsonObject *model, const char *name, const char *member,
                   gboolean *out, GError **error)
{
  JsonNode *n = json_object_get_member (model, member);
  if (n == NULL || JSON_NODE_HOLDS_NULL (n))
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_BOOLEAN)
    return stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                                "model.%s: expected true, false or null",
                                member);
  *out = json_node_get_boolean (n);
  return TRUE;
}

static gboolean
read_vocab (StowBpe *b, JsonObject *model, const char *name, GError **error)
{
  JsonNode *vn = json_object_get_member (model, "vocab");
  if (vn == NULL || !JSON_NODE_HOLDS_OBJECT (vn))
    return stow_tokenizer_fail (
        error, STOW_TOKENIZER_ERROR_PARSE, name,
        vn == NULL ? "model.vocab: missing"
                   : "model.vocab: expected an object of token: id");
  JsonObject *vocab = json_node_get_object (vn);
  guint n = json_object_get_size (vocab);
  strmap_init (&b->vocab, n);
  b->arena = g_byte_array_sized_new (n * 8);
  g_autoptr (GArray) ids
      = g_array_sized_new (FALSE, FALSE, sizeof (guint32), n);
  g_autoptr (GList) members = json_object_get_members (vocab);
  for (GList *l = members; l; l = l->next)
    {
      const char *tok = l->data;
      JsonNode *idn = json_object_get_member (vocab, tok);
      if (!JSON_NODE_HOLDS_VALUE (idn)
          || json_node_get_value_type (idn) != G_TYPE_INT64)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, name,
            "model.vocab: \"%s\": expected an integer id", tok);
      gint64 id = json_node_get_int (idn);
      if (id < 0 || id >= G_MAXINT32)
        return stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                                    "model.vocab: \"%s\": id %" G_GINT64_FORMAT
                                    " is outside [0, 2^31 - 1)",
                                    tok, id);
      gsize len = strlen (tok);
      guint64 h = hash_bytes (tok, len);
      StrSlot *s
          = strmap_slot (&b->vocab, (const char *)b->arena->data, tok, len, h);
      if (s->hash != 0)
        {
          s->value = (guint32)id; /* json-glib keeps the last; so does HF */
          continue;
        }
      s->hash = h;
      s->off = b->arena->len;
      s->len = (guint32)len;
      s->value = (guint32)id;
      b->vocab.n++;
      g_byte_array_append (b->arena, (const guint8 *)tok, (guint)len + 1);
      b->n_ids = MAX (b->n_ids, (guint32)id + 1);
    }
  b->n_entries = b->vocab.n;
  b->id_off = g_new (guint32, MAX (b->n_ids, 1));
  b->id_len = g_new0 (guint32, MAX (b->n_ids, 1));
  memset (b->id_off, 0xff, sizeof (guint32) * MAX (b->n_ids, 1));
  for (guint32 i = 0; i <= b->vocab.mask; i++)
    {
      const StrSlot *s = &b->vocab.slots[i];
      if (s->hash == 0)
        continue;
      /* Two tokens with one id: the first in the arena (file order) is
       * the one decode gives. */
      if (b->id_off[s->value] == G_MAXUINT32 || s->off < b->id_off[s->value])
        {
          b->id_off[s->value] = s->off;
          b->id_len[s->value] = s->len;
        }
    }
  return TRUE;
}

/* One merge, "a b" or ["a", "b"], into @a and @b (borrowed or in @buf). */
static gboolean
read_merge (JsonNode *m, guint index, const char *name, const char **a,
            const char **b, char **owned, GError **error)
{
  if (JSON_NODE_HOLDS_VALUE (m)
      && json_node_get_value_type (m) == G_TYPE_STRING)
    {
      /* HF: line.split(' ') must give exactly two parts. */
      const char *s = json_node_get_string (m);
      const char *sp = strchr (s, ' ');
      if (sp == NULL || strchr (sp + 1, ' ') != NULL)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, name,
            "model.merges[%u]: \"%s\" is not two tokens separated "
            "by one space",
            index, s);
      *owned = g_strdup (s);
      (*owned)[sp - s] = '\0';
      *a = *owned;
      *b = *owned + (sp - s) + 1;
      return TRUE;
    }
  if (JSON_NODE_HOLDS_ARRAY (m))
    {
      JsonArray *pair = json_node_get_array (m);
      if (json_array_get_length (pair) == 2)
        {
          JsonNode *x = json_array_get_element (pair, 0);
          JsonNode *y = json_array_get_element (pair, 1);
          if (JSON_NODE_HOLDS_VALUE (x) && JSON_NODE_HOLDS_VALUE (y)
              && json_node_get_value_type (x) == G_TYPE_STRING
              && json_node_get_value_type (y) == G_TYPE_STRING)
            {
              *a = json_node_get_string (x);
              *b = json_node_get_string (y);
              return TRUE;
            }
        }
    }
  return stow_tokenizer_fail (
      error, STOW_TOKENIZER_ERROR_PARSE, name,
      "model.merges[%u]: expected \"a b\" or [\"a\", \"b\"]", index);
}

static gboolean
read_merges (StowBpe *b, JsonObject *model, const char *name, GError **error)
{
  JsonNode *mn = json_object_get_member (model, "merges");
  if (mn == NULL || !JSON_NODE_HOLDS_ARRAY (mn))
    return stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                                mn == NULL ? "model.merges: missing"
                                           : "model.merges: expected an array");
  JsonArray *merges = json_node_get_array (mn);
  guint n = json_array_get_length (merges);
  guint64 size = 16;
  while (size < (guint64)n * 2)
    size *= 2;
  b->merges.slots = g_new (PairSlot, size);
  memset (b->merges.slots, 0xff, sizeof (PairSlot) * size);
  b->merges.mask = size - 1;
  gsize prefix_len = b->prefix ? strlen (b->prefix) : 0;
  g_autoptr (GString) joined = g_string_new (NULL);
  guint rank = 0;
  for (guint i = 0; i < n; i++)
    {
      const char *x = NULL, *y = NULL;
      g_autofree char *owned = NULL;
      if (!read_merge (json_array_get_element (merges, i), i, name, &x, &y,
                       &owned, error))
        return FALSE;
      /* merges.txt's "#version" header line, when a file kept it, is no
       * merge (HF skips it without counting a rank). */
      if (owned != NULL && g_str_has_prefix (x, "#version"))
        continue;
      gint64 ia = stow_bpe_token_to_id (b, x, strlen (x));
      gint64 ib = stow_bpe_token_to_id (b, y, strlen (y));
      if (ia < 0 || ib < 0)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, name,
            "model.merges[%u]: \"%s\" is not in model.vocab", i,
            ia < 0 ? x : y);
      gsize ylen = strlen (y);
      g_string_assign (joined, x);
      if (ylen >= prefix_len)
        g_string_append (joined, y + prefix_len);
      gint64 merged = stow_bpe_token_to_id (b, joined->str, joined->len);
      if (merged < 0)
        return stow_tokenizer_fail (
            error, STOW_TOKENIZER_ERROR_PARSE, name,
            "model.merges[%u]: the merged token \"%s\" is not in "
            "model.vocab",
            i, joined->str);
      pair_put (&b->merges, (guint32)ia, (guint32)ib,
                ((guint64)rank << 32) | (guint64)merged);
      rank++;
    }
  return TRUE;
}

/* TRUE when no vocabulary string holds U+2581 right after a character
 * other than U+2581.  Then no merge joins a symbol that ends in another
 * character (byte and unk tokens end in '>') to one that starts with
 * U+2581, and a word cut at such points merges as the whole does. */
static gboolean
sp_split_is_safe (const StowBpe *b)
{
  if (stow_bpe_token_to_id (b, SP_SPACE, SP_SPACE_LEN) < 0 || b->prefix
      || b->suffix || b->ignore_merges)
    return FALSE;
  for (guint32 i = 0; i <= b->vocab.mask; i++)
    {
      const StrSlot *s = &b->vocab.slots[i];
      if (s->hash == 0 || s->len <= SP_SPACE_LEN)
        continue;
      const char *t = (const char *)b->arena->data + s->off;
      const char *end = t + s->len;
      for (const char *p = t + 1; p + SP_SPACE_LEN <= end; p++)
        {
          p = memmem (p, end - p, SP_SPACE, SP_SPACE_LEN);
          if (p == NULL)
            break;
          if (p - t < SP_SPACE_LEN
              || memcmp (p - SP_SPACE_LEN, SP_SPACE, SP_SPACE_LEN) != 0)
            return FALSE;
        }
    }
  return TRUE;
}

StowBpe *
stow_bpe_new (JsonObject *model, const char *name, GError **error)
{
  JsonNode *tn = json_object_get_member (model, "type");
  if (tn != NULL && !JSON_NODE_HOLDS_NULL (tn))
    {
      const char *type
          = JSON_NODE_HOLDS_VALUE (tn)
                    && json_node_get_value_type (tn) == G_TYPE_STRING
                ? json_node_get_string (tn)
                : NULL;
      if (type == NULL)
        {
          stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                               "model.type: expected a string");
          return NULL;
        }
      if (strcmp (type, "BPE") != 0)
        {
          stow_tokenizer_fail (
              error, STOW_TOKENIZER_ERROR_UNSUPPORTED, name,
              "model.type \"%s\" is not supported (stowage reads BPE "
              "models)",
              type);
          return NULL;
        }
    }
  g_autoptr (StowBpe) b = g_new0 (StowBpe, 1);
  b->unk_id = -1;
  if (!get_optional_string (model, name, "unk_token", &b->unk, error)
      || !get_optional_string (model, name, "continuing_subword_prefix",
                               &b->prefix, error)
      || !get_optional_string (model, name, "end_of_word_suffix", &b->suffix,
                               error)
      || !get_optional_bool (model, name, "fuse_unk", &b->fuse_unk, error)
      || !get_optional_bool (model, name, "byte_fallback", &b->byte_fallback,
                             error)
      || !get_optional_bool (model, name, "ignore_merges", &b->ignore_merges,
                             error))
    return NULL;
  JsonNode *dn = json_object_get_member (model, "dropout");
  if (dn != NULL && !JSON_NODE_HOLDS_NULL (dn))
    {
      if (!JSON_NODE_HOLDS_VALUE (dn)
          || (json_node_get_value_type (dn) != G_TYPE_DOUBLE
              && json_node_get_value_type (dn) != G_TYPE_INT64))
        {
          stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                               "model.dropout: expected a number or null");
          return NULL;
        }
      /* BPE-dropout is a training-time randomisation; data preparation
       * wants the deterministic encoding, which is dropout 0. */
      if (json_node_get_double (dn) > 0)
        g_info ("%s: model.dropout %g ignored: encoding is deterministic", name,
                json_node_get_double (dn));
    }
  if (!read_vocab (b, model, name, error)
      || !read_merges (b, model, name, error))
    return NULL;
  if (b->unk != NULL)
    {
      b->unk_id = stow_bpe_token_to_id (b, b->unk, strlen (b->unk));
      if (b->unk_id < 0)
        {
          stow_tokenizer_fail (error, STOW_TOKENIZER_ERROR_PARSE, name,
                               "model.unk_token \"%s\" is not in model.vocab",
                               b->unk);
          return NULL;
        }
    }
  b->byte_chars_complete = TRUE;
  for (guint i = 0; i < 256; i++)
    {
      char ch[2];
      guint n = stow_bpe_byte_char ((guint8)i, ch);
      b->byte_char_id[i] = stow_bpe_token_to_id (b, ch, n);
      if (b->byte_char_id[i] < 0)
        b->byte_chars_complete = FALSE;
      char code[8];
      /* Rust's format!("<{b:#04X}>"): "<0x0A>". */
      g_snprintf (code, sizeof code, "<0x%02X>", i);
      b->fallback_id[i] = stow_bpe_token_to_id (b, code, 6);
    }
  b->sp_split = sp_split_is_safe (b);
  return g_steal_pointer (&b);
}

void
stow_bpe_free (StowBpe *b)
{
  if (b == NULL)
    return;
  strmap_clear (&b->vocab);
  if (b->arena)
    g_byte_array_unref (b->arena);
  g_free (b->id_off);
  g_free (b->id_len);
  g_free (b->merges.slots);
  g_free (b->unk);
  g_free (b->prefix);
  g_free (b->suffix);
  g_free (b);
}

/* ---- encoding one word -------------------------------------------------- */

typedef struct
{
  guint32 id;
  gint32 prev, next;
  guint32 alive;
} Sym;

/* Bounds of the word cache: past either it starts again empty. */
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_BYTES   ((guint)64 << 20)
/* HF caches words shorter than 256 bytes (utils/cache.rs MAX_LENGTH);
 * longer ones rarely repeat. */
#define CACHE_MAX_WORD 256

struct _StowBpeCache
{
  StrMap map;       /* word -> (extra: first id in ids, value: count) */
  GByteArray *keys; /* the words */
  GArray *ids;      /* guint32 */
  GArray *syms;     /* Sym */
  GArray *heap;     /* guint64: rank << 32 | position */
  GString *buf;     /* a word mapped to its byte characters */
};

StowBpeCache *
stow_bpe_cache_new (void)
{
  StowBpeCache *c = g_new0 (StowBpeCache, 1);
  strmap_init (&c->map, 4096);
  c->keys = g_byte_array_new ();
  c->ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  c->syms = g_array_new (FALSE, FALSE, sizeof (Sym));
  c->heap = g_array_new (FALSE, FALSE, sizeof (guint64));
  c->buf = g_string_new (NULL);
  return c;
}

void
stow_bpe_cache_free (StowBpeCache *c)
{
  if (c == NULL)
    return;
  strmap_clear (&c->map);
  g_byte_array_unref (c->keys);
  g_array_unref (c->ids);
  g_array_unref (c->syms);
  g_array_unref (c->heap);
  g_string_free (c->buf, TRUE);
  g_free (c);
}

static void
heap_push (GArray *h, guint64 v)
{
  g_array_append_val (h, v);
  guint64 *a = (guint64 *)h->data;
  guint i = h->len - 1;
  while (i > 0)
    {
      guint p = (i - 1) / 2;
      if (a[p] <= v)
        break;
      a[i] = a[p];
      i = p;
    }
  a[i] = v;
}

static guint64
heap_pop (GArray *h)
{
  guint64 *a = (guint64 *)h->data;
  guint64 top = a[0];
  guint64 v = a[h->len - 1];
  guint n = --h->len;
  guint i = 0;
  for (;;)
    {
      guint l = 2 * i + 1;
      if (l >= n)
        break;
      guint m = (l + 1 < n && a[l + 1] < a[l]) ? l + 1 : l;
      if (a[m] >= v)
        break;
      a[i] = a[m];
      i = m;
    }
  if (n > 0)
    a[i] = v;
  return top;
}

static void
add_sym (GArray *syms, guint32 id)
{
  Sym s = { id, (gint32)syms->len - 1, -1, 1 };
  if (syms->len > 0)
    g_array_index (syms, Sym, syms->len - 1).next = (gint32)syms->len;
  g_array_append_val (syms, s);
}

/* HF's merge_all: the lowest (rank, position) pair first. */
static void
merge_all (const StowBpe *b, StowBpeCache *c)
{
  Sym *s = (Sym *)c->syms->data;
  guint n = c->syms->len;
  const guint64 hi = 0xffffffff00000000ULL;
  guint64 v;
  g_array_set_size (c->heap, 0);
  for (guint i = 0; i + 1 < n; i++)
    if (pair_get (&b->merges, s[i].id, s[i + 1].id, &v))
      heap_push (c->heap, (v & hi) | i);
  while (c->heap->len > 0)
    {
      guint64 top = heap_pop (c->heap);
      guint32 pos = (guint32)top;
      if (!s[pos].alive || s[pos].next < 0)
        continue;
      gint32 nx = s[pos].next;
      /* A pair that changed since it was queued: the rank identifies the
       * pair (each merge line is one rank), as HF's new_id check does. */
      if (!pair_get (&b->merges, s[pos].id, s[nx].id, &v)
          || (v & hi) != (top & hi))
        continue;
      s[pos].id = (guint32)v;
      s[pos].next = s[nx].next;
      s[nx].alive = 0;
      if (s[pos].next >= 0)
        s[s[pos].next].prev = (gint32)pos;
      if (s[pos].prev >= 0
          && pair_get (&b->merges, s[s[pos].prev].id, s[pos].id, &v))
        heap_push (c->heap, (v & hi) | (guint32)s[pos].prev);
      if (s[pos].next >= 0
          && pair_get (&b->merges, s[pos].id, s[s[pos].next].id, &v))
        heap_push (c->heap, (v & hi) | pos);
    }
}

/* HF's merge_word: one symbol per character (with the prefix and suffix
 * where they apply), byte tokens or unk for characters the vocabulary
 * lacks, then the merges.  @w is text (mapped byte characters, when the
 * word came through ByteLevel). */
static void
symbols_of_text (const StowBpe *b, StowBpeCache *c, const char *w, gsize len)
{
  g_autoptr (GString) s = NULL;
  gboolean unk_pending = FALSE;
  g_array_set_size (c->syms, 0);
  for (const char *p = w; p < w + len;)
    {
      const char *q = g_utf8_next_char (p);
      gboolean first = p == w, last = q >= w + len;
      const char *str = p;
      gsize slen = (gsize)(q - p);
      if ((b->prefix && !first) || (b->suffix && last))
        {
          if (s == NULL)
            s = g_string_new (NULL);
          g_string_truncate (s, 0);
          if (b->prefix && !first)
            g_string_append (s, b->prefix);
          g_string_append_len (s, p, (gssize)(q - p));
          if (b->suffix && last)
            g_string_append (s, b->suffix);
          str = s->str;
          slen = s->len;
        }
      gint64 id = stow_bpe_token_to_id (b, str, slen);
      p = q;
      if (id >= 0)
        {
          if (unk_pending)
            add_sym (c->syms, (guint32)b->unk_id);
          unk_pending = FALSE;
          add_sym (c->syms, (guint32)id);
          continue;
        }
      if (b->byte_fallback)
        {
          gboolean all = TRUE;
          for (gsize i = 0; i < slen; i++)
            all = all && b->fallback_id[(guint8)str[i]] >= 0;
          if (all)
            {
              /* HF adds the bytes before a pending unk (its `continue`
               * skips the flush). */
              for (gsize i = 0; i < slen; i++)
                add_sym (c->syms, (guint32)b->fallback_id[(guint8)str[i]]);
              continue;
            }
        }
      if (b->unk_id >= 0)
        {
          if (unk_pending && !b->fuse_unk)
            add_sym (c->syms, (guint32)b->unk_id);
          unk_pending = TRUE;
        }
    }
  if (unk_pending)
    add_sym (c->syms, (guint32)b->unk_id);
}

/* The word's ids, appended to @out. */
static void
encode_uncached (const StowBpe *b, StowBpeCache *c, const char *w, gsize len,
                 gboolean raw_bytes, GArray *out)
{
  gboolean direct
      = raw_bytes && b->byte_chars_complete && !b->prefix && !b->suffix;
  if (raw_bytes && (!direct || b->ignore_merges))
    {
      g_string_truncate (c->buf, 0);
      for (gsize i = 0; i < len; i++)
        {
          char ch[2];
          guint n = stow_bpe_byte_char ((guint8)w[i], ch);
          g_string_append_len (c->buf, ch, n);
        }
    }
  if (b->ignore_merges)
    {
      const char *t = raw_bytes ? c->buf->str : w;
      gsize tlen = raw_bytes ? c->buf->len : len;
      gint64 id = stow_bpe_token_to_id (b, t, tlen);
      if (id >= 0)
        {
          guint32 id32 = (guint32)id;
          g_array_append_val (out, id32);
          return;
        }
    }
  if (direct)
    {
      g_array_set_size (c->syms, 0);
      for (gsize i = 0; i < len; i++)
        add_sym (c->syms, (guint32)b->byte_char_id[(guint8)w[i]]);
    }
  else if (raw_bytes)
    {
      /* Keep the mapped word: symbols_of_text reads it, and c->buf may
       * be needed again by nobody else meanwhile. */
      g_autofree char *mapped = g_strndup (c->buf->str, c->buf->len);
      symbols_of_text (b, c, mapped, c->buf->len);
    }
  else
    symbols_of_text (b, c, w, len);
  merge_all (b, c);
  const Sym *s = (const Sym *)c->syms->data;
  for (guint i = 0; i < c->syms->len; i++)
    if (s[i].alive)
      g_array_append_val (out, s[i].id);
}

static void
encode_cached (const StowBpe *b, StowBpeCache *c, const char *w, gsize len,
               gboolean raw_bytes, GArray *out)
{
  if (len >= CACHE_MAX_WORD)
    {
      encode_uncached (b, c, w, len, raw_bytes, out);
      return;
    }
  guint64 h = hash_bytes (w, len);
  StrSlot *slot = strmap_slot (&c->map, (const char *)c->keys->data, w, len, h);
  if (slot->hash != 0)
    {
      g_array_append_vals (out, &g_array_index (c->ids, guint32, slot->extra),
                           slot->value);
      return;
    }
  guint first = out->len;
  encode_uncached (b, c, w, len, raw_bytes, out);
  if (c->map.n >= CACHE_MAX_ENTRIES || c->keys->len + len > CACHE_MAX_BYTES
      || c->ids->len > CACHE_MAX_BYTES / 4)
    {
      strmap_clear (&c->map);
      strmap_init (&c->map, 4096);
      g_byte_array_set_size (c->keys, 0);
      g_array_set_size (c->ids, 0);
      slot = strmap_slot (&c->map, (const char *)c->keys->data, w, len, h);
    }
  slot->hash = h;
  slot->off = c->keys->len;
  slot->len = (guint32)len;
  slot->extra = c->ids->len;
  slot->value = out->len - first;
  g_byte_array_append (c->keys, (const guint8 *)w, (guint)len);
  g_array_append_vals (c->ids, &g_array_index (out, guint32, first),
                       out->len - first);
  if (++c->map.n * 2 > c->map.mask)
    strmap_grow (&c->map);
}

void
stow_bpe_encode_word (const StowBpe *b, StowBpeCache *c, const char *word,
                      gsize len, gboolean raw_bytes, GArray *out)
{
  if (len == 0)
    return;
  if (!b->sp_split || raw_bytes)
    {
      encode_cached (b, c, word, len, raw_bytes, out);
      return;
    }
  /* Cut before each U+2581 that follows another character. */
  const char *start = word, *end = word + len;
  const char *p = word + 1;
  while (p < end)
    {
      const char *sp = memmem (p, (gsize)(end - p), SP_SPACE, SP_SPACE_LEN);
      if (sp == NULL)
        break;
      if (sp > start
          && (sp - start < SP_SPACE_LEN
              || memcmp (sp - SP_SPACE_LEN, SP_SPACE, SP_SPACE_LEN) != 0))
        {
          encode_cached (b, c, start, (gsize)(sp - start), FALSE, out);
          start = sp;
        }
      p = sp + SP_SPACE_LEN;
    }
  encode_cached (b, c, start, (gsize)(end - start), FALSE, out);
}
