/* SPDX-License-Identifier: MIT
 *
 * data/encode.c: text to ids, in HF tokenizers' order (Tokenizer::encode):
 * added tokens with normalized false are matched in the raw text; each
 * piece between them is normalized and searched for the normalized added
 * tokens; the pieces left are pre-tokenized into words, and each word goes
 * to the BPE model; the post-processor's tokens go around.  Pieces flow
 * through the steps one at a time (no list of the whole text's words is
 * built), and words that ByteLevel would map byte by byte reach the model
 * unmapped (data/bpe.c maps them, or finds them in its cache first).
 */
#include "data/tokenizer-private.h"

#include <string.h>

struct _StowHfEncoder
{
  StowHfTokenizer *t;
  StowBpeCache *cache;
};

/* Texts of 2 GiB and more: GRegex's offsets are gint. */
#define MAX_TEXT_BYTES ((gsize)G_MAXINT)

gboolean
stow_is_white_space (gunichar c)
{
  /* Unicode's White_Space property (PropList.txt), which is what Rust's
   * char::is_whitespace and its regex's \s test. */
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0
         || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028
         || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Rust regex's \w: Alphabetic, marks, decimal digits, connector
 * punctuation and the joiners. */
static gboolean
is_word_char (gunichar c)
{
  GUnicodeType type = g_unichar_type (c);
  return g_unichar_isalpha (c) || g_unichar_ismark (c)
         || type == G_UNICODE_DECIMAL_NUMBER || type == G_UNICODE_LETTER_NUMBER
         || type == G_UNICODE_CONNECT_PUNCTUATION || c == 0x200c || c == 0x200d;
}

gsize
stow_utf8_valid_up_to (const char *s, gsize len)
{
  const guint8 *p = (const guint8 *)s;
  gsize i = 0;
  while (i < len)
    {
      guint8 b = p[i];
      if (b < 0x80)
        {
          i++;
          continue;
        }
      guint need;
      guint8 lo = 0x80, hi = 0xbf;
      if (b >= 0xc2 && b <= 0xdf)
        need = 1;
      else if (b >= 0xe0 && b <= 0xef)
        {
          need = 2;
          if (b == 0xe0)
            lo = 0xa0;
          else if (b == 0xed)
            hi = 0x9f; /* no surrogates */
        }
      else if (b >= 0xf0 && b <= 0xf4)
        {
          need = 3;
          if (b == 0xf0)
            lo = 0x90;
          else if (b == 0xf4)
            hi = 0x8f;
        }
      else
        return i;
      if (i + need >= len || p[i + 1] < lo || p[i + 1] > hi)
        return i;
      for (guint k = 2; k <= need; k++)
        if ((p[i + k] & 0xc0) != 0x80)
          return i;
      i += need + 1;
    }
  return len;
}

/* ---- added tokens ------------------------------------------------------- */

static gint
longer_first (gconstpointer a, gconstpointer b)
{
  const AddedToken *x = *(AddedToken *const *)a, *y = *(AddedToken *const *)b;
  gsize lx = x->normalized_form ? x->normalized_len : x->len;
  gsize ly = y->normalized_form ? y->normalized_len : y->len;
  return lx > ly ? -1 : lx < ly;
}

void
stow_matcher_build (Matcher *m, GPtrArray *added, gboolean normalized)
{
  memset (m, 0, sizeof *m);
  for (guint i = 0; i < added->len; i++)
    {
      AddedToken *a = g_ptr_array_index (added, i);
      if (a->normalized != normalized)
        continue;
      const char *p
          = normalized && a->normalized_form ? a->normalized_form : a->content;
      guint8 first = (guint8)p[0];
      if (m->by_first[first] == NULL)
        m->by_first[first] = g_ptr_array_new ();
      g_ptr_array_add (m->by_first[first], a);
      m->first[first] = 1;
    }
  for (guint i = 0; i < 256; i++)
    if (m->by_first[i])
      g_ptr_array_sort (m->by_first[i], longer_first);
}

void
stow_matcher_clear (Matcher *m)
{
  for (guint i = 0; i < 256; i++)
    if (m->by_first[i])
      g_ptr_array_unref (m->by_first[i]);
  memset (m, 0, sizeof *m);
}

/* The leftmost-longest match at or after @from: its token, @start and
 * @end; NULL when none. */
static const AddedToken *
matcher_next (const Matcher *m, gboolean normalized, const char *s, gsize len,
              gsize from, gsize *start, gsize *end)
{
  for (gsize i = from; i < len; i++)
    {
      guint8 c = (guint8)s[i];
      if (!m->first[c])
        continue;
      GPtrArray *cands = m->by_first[c];
      for (guint k = 0; k < cands->len; k++)
        {
          const AddedToken *a = g_ptr_array_index (cands, k);
          const char *p = normalized && a->normalized_form ? a->normalized_form
                                                           : a->content;
          gsize n
              = normalized && a->normalized_form ? a->normalized_len : a->len;
          if (n <= len - i && memcmp (s + i, p, n) == 0)
            {
              *start = i;
              *end = i + n;
              return a;
            }
        }
    }
  return NULL;
}

/* ---- normalizers -------------------------------------------------------- */

/* NFC and friends through GLib, which stops at a NUL: normalize between
 * NULs (a NUL neither composes nor reorders, so this is the whole's
 * normal form). */
static void
append_normalized (GString *out, const char *s, gsize len, GNormalizeMode mode)
{
  const char *end = s + len;
  while (s <= end)
    {
      const char *nul = memchr (s, '\0', (gsize)(end - s));
      const char *stop = nul ? nul : end;
      if (stop > s)
        {
          g_autofree char *n = g_utf8_normalize (s, stop - s, mode);
          g_string_append (out, n);
        }
      if (nul == NULL)
        break;
      g_string_append_c (out, '\0');
      s = nul + 1;
    }
}

/* Below U+0300 every character is in NFC and NFD and none composes with
 * what follows it (the first combining marks are at U+0300): such text is
 * its own normal form, and most text is such text. */
static gboolean
below_combining_marks (const char *s, gsize len)
{
  for (gsize i = 0; i < len; i++)
    if ((guint8)s[i] >= 0xcc)
      return FALSE;
  return TRUE;
}

static void
replace_all (GString *out, const Pattern *p, const char *content,
             gsize content_len, const char *s, gsize len)
{
  if (p->regex != NULL)
    {
      GMatchInfo *mi = NULL;
      gsize prev = 0;
      g_regex_match_full (p->regex, s, (gssize)len, 0, 0, &mi, NULL);
      while (g_match_info_matches (mi))
        {
          gint a, b;
          g_match_info_fetch_pos (mi, 0, &a, &b);
          g_string_append_len (out, s + prev, (gssize)((gsize)a - prev));
          g_string_append_len (out, content, (gssize)content_len);
          prev = (gsize)b;
          g_match_info_next (mi, NULL);
        }
      g_match_info_free (mi);
      g_string_append_len (out, s + prev, (gssize)(len - prev));
      return;
    }
  gsize prev = 0;
  while (p->literal_len > 0 && prev < len)
    {
      const char *hit
          = memmem (s + prev, len - prev, p->literal, p->literal_len);
      if (hit == NULL)
        break;
      g_string_append_len (out, s + prev, hit - (s + prev));
      g_string_append_len (out, content, (gssize)content_len);
      prev = (gsize)(hit - s) + p->literal_len;
    }
  g_string_append_len (out, s + prev, (gssize)(len - prev));
}

char *
stow_normalize (const StowHfTokenizer *t, const char *s, gsize len,
                gsize *out_len)
{
  if (t->n_norms == 0)
    return NULL;
  g_autoptr (GString) cur = g_string_new_len (s, (gssize)len);
  g_autoptr (GString) next = g_string_new (NULL);
  for (guint i = 0; i < t->n_norms; i++)
    {
      const Normalizer *n = &t->norms[i];
      g_string_truncate (next, 0);
      switch (n->kind)
        {
        case NORM_NFC:
        case NORM_NFD:
        case NORM_NFKC:
        case NORM_NFKD:
          {
            static const GNormalizeMode modes[] = {
              [NORM_NFC] = G_NORMALIZE_NFC,
              [NORM_NFD] = G_NORMALIZE_NFD,
              [NORM_NFKC] = G_NORMALIZE_NFKC,
              [NORM_NFKD] = G_NORMALIZE_NFKD,
            };
            /* NFKC maps some characters below U+0300 (U+00A0, U+00BD):
             * only the canonical forms may skip. */
            if ((n->kind == NORM_NFC || n->kind == NORM_NFD)
                && below_combining_marks (cur->str, cur->len))
              continue;
            append_normalized (next, cur->str, cur->len, modes[n->kind]);
            break;
          }
        case NORM_PREPEND:
          if (cur->len == 0)
            continue;
          g_string_append_len (next, n->text, (gssize)n->text_len);
          g_string_append_len (next, cur->str, (gssize)cur->len);
          break;
        case NORM_REPLACE:
          replace_all (next, &n->pattern, n->text, n->text_len, cur->str,
                       cur->len);
          break;
        }
      GString *tmp = cur;
      cur = next;
      next = tmp;
    }
  *out_len = cur->len;
  return g_string_free (g_steal_pointer (&cur), FALSE);
}

/* ---- pre-tokenizers ----------------------------------------------------- */

typedef struct
{
  gsize start, end;
  gboolean match;
} Span;

static void pre_tokenize (StowHfEncoder *e, guint step, const char *s,
                          gsize len, gboolean at_start, gboolean mapped,
                          GArray *ids);

/* HF's Pattern::find_matches: the spans of @s, each a match or not, that
 * cover it. */
static void
find_spans (const Pattern *p, gunichar ch, const char *s, gsize len,
            GArray *spans)
{
  gsize prev = 0;
  Span sp;
  if (len == 0)
    return;
  if (p == NULL)
    {
      /* A character: each of its occurrences is a match. */
      for (const char *c = s; c < s + len; c = g_utf8_next_char (c))
        if (g_utf8_get_char (c) == ch)
          {
            gsize at = (gsize)(c - s), clen = (gsize)(g_utf8_next_char (c) - c);
            if (prev < at)
              {
                sp = (Span){ prev, at, FALSE };
                g_array_append_val (spans, sp);
              }
            sp = (Span){ at, at + clen, TRUE };
            g_array_append_val (spans, sp);
            prev = at + clen;
          }
    }
  else if (p->regex != NULL)
    {
      GMatchInfo *mi = NULL;
      g_regex_match_full (p->regex, s, (gssize)len, 0, 0, &mi, NULL);
      while (g_match_info_matches (mi))
        {
          gint a, b;
          g_match_info_fetch_pos (mi, 0, &a, &b);
          if (prev != (gsize)a)
            {
              sp = (Span){ prev, (gsize)a, FALSE };
              g_array_append_val (spans, sp);
            }
          sp = (Span){ (gsize)a, (gsize)b, TRUE };
          g_array_append_val (spans, sp);
          prev = (gsize)b;
          g_match_info_next (mi, NULL);
        }
      g_match_info_free (mi);
    }
  else
    {
      while (p->literal_len > 0 && prev < len)
        {
          const char *hit
              = memmem (s + prev, len - prev, p->literal, p->literal_len);
          if (hit == NULL)
            break;
          gsize at = (gsize)(hit - s);
          if (prev != at)
            {
              sp = (Span){ prev, at, FALSE };
              g_array_append_val (spans, sp);
            }
          sp = (Span){ at, at + p->literal_len, TRUE };
          g_array_append_val (spans, sp);
          prev = at + p->literal_len;
        }
    }
  if (prev != len)
    {
      sp = (Span){ prev, len, FALSE };
      g_array_append_val (spans, sp);
    }
}

/* HF's NormalizedString::split: the spans kept under @behavior (their
 * match flag now means "remove"). */
static void
apply_behavior (GArray *spans, SplitBehavior behavior)
{
  Span *v = (Span *)spans->data;
  guint n = spans->len, out = 0;
  gboolean previous_match = FALSE;
  switch (behavior)
    {
    case SPLIT_ISOLATED:
      for (guint i = 0; i < n; i++)
        v[i].match = FALSE;
      return;
    case SPLIT_REMOVED:
      return;
    case SPLIT_CONTIGUOUS:
      for (guint i = 0; i < n; i++)
        {
          gboolean m = v[i].match;
          if (m == previous_match && out > 0)
            v[out - 1].end = v[i].end;
          else
            v[out++] = (Span){ v[i].start, v[i].end, FALSE };
          previous_match = m;
        }
      break;
    case SPLIT_MERGED_WITH_PREVIOUS:
      for (guint i = 0; i < n; i++)
        {
          gboolean m = v[i].match;
          if (m && !previous_match && out > 0)
            v[out - 1].end = v[i].end;
          else
            v[out++] = (Span){ v[i].start, v[i].end, FALSE };
          previous_match = m;
        }
      break;
    case SPLIT_MERGED_WITH_NEXT:
      {
        /* From the end: a match joins the span after it. */
        guint w = n;
        for (guint k = n; k-- > 0;)
          {
            gboolean m = v[k].match;
            if (m && !previous_match && w < n)
              v[w].start = v[k].start;
            else
              v[--w] = (Span){ v[k].start, v[k].end, FALSE };
            previous_match = m;
          }
        memmove (v, v + w, (n - w) * sizeof (Span));
        out = n - w;
        break;
      }
    }
  g_array_set_size (spans, out);
}

/* The spans of @s under a pattern (or the character @ch), with
 * @behavior and @invert, each passed to the next step. */
static void
split_step (StowHfEncoder *e, guint step, const Pattern *p, gunichar ch,
            SplitBehavior behavior, gboolean invert, const char *s, gsize len,
            gboolean at_start, gboolean mapped, GArray *ids)
{
  g_autoptr (GArray) spans = g_array_new (FALSE, FALSE, sizeof (Span));
  find_spans (p, ch, s, len, spans);
  if (invert)
    for (guint i = 0; i < spans->len; i++)
      g_array_index (spans, Span, i).match
          = !g_array_index (spans, Span, i).match;
  apply_behavior (spans, behavior);
  for (guint i = 0; i < spans->len; i++)
    {
      const Span *sp = &g_array_index (spans, Span, i);
      if (sp->match || sp->end == sp->start)
        continue;
      pre_tokenize (e, step + 1, s + sp->start, sp->end - sp->start,
                    at_start && sp->start == 0, mapped, ids);
    }
}

/* ByteLevel's mapping of each byte to its character. */
static char *
map_bytes (const char *s, gsize len, gsize *out_len)
{
  GString *m = g_string_sized_new (len * 2);
  for (gsize i = 0; i < len; i++)
    {
      char ch[2];
      guint n = stow_bpe_byte_char ((guint8)s[i], ch);
      g_string_append_len (m, ch, n);
    }
  *out_len = m->len;
  return g_string_free (m, FALSE);
}

/* Step @step of the pre-tokenizers on the piece @s; past the last, the
 * model.  @at_start: the piece begins the original text (Metaspace's
 * "first"); @mapped: its bytes were mapped by a ByteLevel before. */
static void
pre_tokenize (StowHfEncoder *e, guint step, const char *s, gsize len,
              gboolean at_start, gboolean mapped, GArray *ids)
{
  const StowHfTokenizer *t = e->t;
  if (len == 0)
    return;
  if (step == t->n_pres)
    {
      stow_bpe_encode_word (t->bpe, e->cache, s, len, t->raw_bytes && !mapped,
                            ids);
      return;
    }
  const PreTokenizer *p = &t->pres[step];
  switch (p->kind)
    {
    case PRE_SPLIT:
      split_step (e, step, &p->pattern, 0, p->behavior, p->invert, s, len,
                  at_start, mapped, ids);
      return;
    case PRE_BYTE_LEVEL:
      {
        g_autofree char *prefixed = NULL;
        if (p->add_prefix_space && s[0] != ' ')
          {
            prefixed = g_malloc (len + 1);
            prefixed[0] = ' ';
            memcpy (prefixed + 1, s, len);
            s = prefixed;
            len++;
          }
        gboolean last = step + 1 == t->n_pres;
        if (last)
          {
            /* The model maps the bytes (raw_bytes). */
            if (p->use_regex)
              split_step (e, step, &p->pattern, 0, SPLIT_ISOLATED, FALSE, s,
                          len, at_start, mapped, ids);
            else
              pre_tokenize (e, step + 1, s, len, at_start, mapped, ids);
            return;
          }
        /* Not the last step: split, then map each piece, then go on. */
        g_autoptr (GArray) spans = g_array_new (FALSE, FALSE, sizeof (Span));
        if (p->use_regex)
          find_spans (&p->pattern, 0, s, len, spans);
        else
          g_array_append_val (spans, ((Span){ 0, len, FALSE }));
        for (guint i = 0; i < spans->len; i++)
          {
            const Span *sp = &g_array_index (spans, Span, i);
            gsize mlen;
            g_autofree char *m
                = map_bytes (s + sp->start, sp->end - sp->start, &mlen);
            pre_tokenize (e, step + 1, m, mlen, at_start && sp->start == 0,
                          TRUE, ids);
          }
        return;
      }
    case PRE_METASPACE:
      {
        GString *r = g_string_sized_new (len + p->replacement_len);
        gboolean starts
            = len >= p->replacement_len
              && memcmp (s, p->replacement, p->replacement_len) == 0;
        for (gsize i = 0; i < len; i++)
          if (s[i] == ' ')
            g_string_append_len (r, p->replacement, (gssize)p->replacement_len);
          else
            g_string_append_c (r, s[i]);
        /* A space at the start became the replacement too. */
        starts = starts || s[0] == ' ';
        if (!starts
            && (p->prepend == PREPEND_ALWAYS
                || (p->prepend == PREPEND_FIRST && at_start)))
          g_string_prepend_len (r, p->replacement, (gssize)p->replacement_len);
        if (p->split)
          split_step (e, step, NULL, g_utf8_get_char (p->replacement),
                      SPLIT_MERGED_WITH_NEXT, FALSE, r->str, r->len, at_start,
                      mapped, ids);
        else
          pre_tokenize (e, step + 1, r->str, r->len, at_start, mapped, ids);
        g_string_free (r, TRUE);
        return;
      }
    }
}

/* ---- the pipeline ------------------------------------------------------- */

/* HF's AddedVocabulary::find_matches over @s with one matcher: each
 * matched token's id goes to @ids, each piece between them to @piece. */
typedef void (*PieceFunc) (StowHfEncoder *e, const char *s, gsize len,
                           gboolean at_start, GArray *ids);

static gboolean
ends_with_word (const char *s, gsize len)
{
  if (len == 0)
    return FALSE;
  const char *last = g_utf8_find_prev_char (s, s + len);
  return last != NULL && is_word_char (g_utf8_get_char (last));
}

static void
split_added (StowHfEncoder *e, const Matcher *m, gboolean normalized,
             const char *s, gsize len, gboolean at_start, PieceFunc piece,
             GArray *ids)
{
  gsize start_offset = 0, from = 0, start, stop;
  const AddedToken *a;
  while ((a = matcher_next (m, normalized, s, len, from, &start, &stop)))
    {
      from = stop;
      if (a->single_word)
        {
          gboolean start_space = start == 0 || !ends_with_word (s, start);
          gboolean stop_space
              = stop == len || !is_word_char (g_utf8_get_char (s + stop));
          if (!start_space || !stop_space)
            continue;
        }
      if (a->lstrip)
        {
          /* Back over the white space before it, not into what an
           * earlier match took. */
          gsize ns = start;
          while (ns > 0)
            {
              const char *prev = g_utf8_find_prev_char (s, s + ns);
              if (!stow_is_white_space (g_utf8_get_char (prev)))
                break;
              ns = (gsize)(prev - s);
            }
          start = MAX (ns, start_offset);
        }
      if (a->rstrip)
        while (stop < len && stow_is_white_space (g_utf8_get_char (s + stop)))
          stop = (gsize)(g_utf8_next_char (s + stop) - s);
      if (start_offset < start)
        piece (e, s + start_offset, start - start_offset,
               at_start && start_offset == 0, ids);
      g_array_append_val (ids, a->id);
      start_offset = stop;
    }
  if (start_offset < len)
    piece (e, s + start_offset, len - start_offset,
           at_start && start_offset == 0, ids);
}

static void
normalized_piece (StowHfEncoder *e, const char *s, gsize len, gboolean at_start,
                  GArray *ids)
{
  pre_tokenize (e, 0, s, len, at_start, FALSE, ids);
}

static void
raw_piece (StowHfEncoder *e, const char *s, gsize len, gboolean at_start,
           GArray *ids)
{
  gsize nlen = len;
  g_autofree char *norm = stow_normalize (e->t, s, len, &nlen);
  split_added (e, &e->t->normalized_matcher, TRUE, norm ? norm : s, nlen,
               at_start, normalized_piece, ids);
}

StowHfEncoder *
stow_hf_encoder_new (StowHfTokenizer *t)
{
  g_return_val_if_fail (t != NULL, NULL);
  StowHfEncoder *e = g_new0 (StowHfEncoder, 1);
  e->t = stow_hf_tokenizer_ref (t);
  e->cache = stow_bpe_cache_new ();
  return e;
}

void
stow_hf_encoder_free (StowHfEncoder *e)
{
  if (e == NULL)
    return;
  stow_bpe_cache_free (e->cache);
  /* The tokenizer's own shared encoder holds no reference to it. */
  if (e->t->shared != e)
    stow_hf_tokenizer_unref (e->t);
  g_free (e);
}

gboolean
stow_hf_encoder_encode (StowHfEncoder *e, const char *text, gssize len,
                        gboolean add_special, GArray *ids, GError **error)
{
  g_return_val_if_fail (e != NULL && text != NULL && ids != NULL, FALSE);
  gsize n = len < 0 ? strlen (text) : (gsize)len;
  if (n >= MAX_TEXT_BYTES)
    {
      g_set_error (error, STOW_TOKENIZER_ERROR,
                   STOW_TOKENIZER_ERROR_INVALID_UTF8,
                   "text of %" G_GSIZE_FORMAT " bytes: over the 2 GiB one "
                   "text may have",
                   n);
      return FALSE;
    }
  gsize valid = stow_utf8_valid_up_to (text, n);
  if (valid < n)
    {
      g_set_error (error, STOW_TOKENIZER_ERROR,
                   STOW_TOKENIZER_ERROR_INVALID_UTF8,
                   "not UTF-8: byte %" G_GSIZE_FORMAT " (0x%02x) begins no "
                   "valid character",
                   valid, (guint8)text[valid]);
      return FALSE;
    }
  const StowHfTokenizer *t = e->t;
  if (add_special)
    g_array_append_vals (ids, t->prefix_ids->data, t->prefix_ids->len);
  split_added (e, &t->raw_matcher, FALSE, text, n, TRUE, raw_piece, ids);
  if (add_special)
    g_array_append_vals (ids, t->suffix_ids->data, t->suffix_ids->len);
  return TRUE;
}

gboolean
stow_hf_tokenizer_encode (StowHfTokenizer *t, const char *text, gssize len,
                          gboolean add_special, GArray *ids, GError **error)
{
  g_return_val_if_fail (t != NULL, FALSE);
  g_mutex_lock (&t->lock);
  if (t->shared == NULL)
    {
      /* Owned by @t: no reference back, or @t would never be freed. */
      t->shared = g_new0 (StowHfEncoder, 1);
      t->shared->t = t;
      t->shared->cache = stow_bpe_cache_new ();
    }
  gboolean ok
      = stow_hf_encoder_encode (t->shared, text, len, add_special, ids, error);
  g_mutex_unlock (&t->lock);
  return ok;
}
