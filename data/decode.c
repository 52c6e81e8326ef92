/* SPDX-License-Identifier: MIT
 *
 * data/decode.c: ids to text, as HF tokenizers' Tokenizer::decode: each id
 * to its token string (an added token's, or the vocabulary's), special
 * tokens left out when asked, then the decoders in order over the list of
 * strings, joined.  Invalid UTF-8 that byte tokens make becomes U+FFFD the
 * way Rust makes it.
 */
#include "data/tokenizer-private.h"

#include <string.h>

#define REPLACEMENT_CHAR "\xef\xbf\xbd"

void
stow_append_utf8_lossy (GString *out, const char *s, gsize len)
{
  /* Rust's Utf8Chunks: the longest prefix of a valid sequence that is
   * cut short or broken counts as one invalid sequence. */
  const guint8 *p = (const guint8 *)s;
  gsize i = 0, valid_from = 0;
  while (i < len)
    {
      guint8 b = p[i];
      if (b < 0x80)
        {
          i++;
          continue;
        }
      guint need = 0;
      guint8 lo = 0x80, hi = 0xbf;
      if (b >= 0xc2 && b <= 0xdf)
        need = 1;
      else if (b >= 0xe0 && b <= 0xef)
        {
          need = 2;
          lo = b == 0xe0 ? 0xa0 : 0x80;
          hi = b == 0xed ? 0x9f : 0xbf;
        }
      else if (b >= 0xf0 && b <= 0xf4)
        {
          need = 3;
          lo = b == 0xf0 ? 0x90 : 0x80;
          hi = b == 0xf4 ? 0x8f : 0xbf;
        }
      /* How many bytes of a valid sequence are there. */
      gsize got = 1;
      if (need > 0 && i + 1 < len && p[i + 1] >= lo && p[i + 1] <= hi)
        {
          got = 2;
          while (got <= need && i + got < len && (p[i + got] & 0xc0) == 0x80)
            got++;
        }
      if (need > 0 && got == need + 1)
        {
          i += got;
          continue;
        }
      g_string_append_len (out, s + valid_from, (gssize)(i - valid_from));
      g_string_append (out, REPLACEMENT_CHAR);
      i += got;
      valid_from = i;
    }
  g_string_append_len (out, s + valid_from, (gssize)(len - valid_from));
}

static gboolean
is_valid_utf8 (const char *s, gsize len)
{
  g_autoptr (GString) t = g_string_new (NULL);
  stow_append_utf8_lossy (t, s, len);
  return t->len == len && memcmp (t->str, s, len) == 0;
}

/* "<0xAB>" (either case of hex digits, as Rust's from_str_radix reads). */
static gboolean
byte_token (const GString *t, guint8 *out)
{
  if (t->len != 6 || memcmp (t->str, "<0x", 3) != 0 || t->str[5] != '>')
    return FALSE;
  int hi = g_ascii_xdigit_value (t->str[3]),
      lo = g_ascii_xdigit_value (t->str[4]);
  if (hi < 0 || lo < 0)
    return FALSE;
  *out = (guint8)(hi * 16 + lo);
  return TRUE;
}

static void
free_gstring (gpointer p)
{
  g_string_free (p, TRUE);
}

static GPtrArray *
new_tokens (void)
{
  return g_ptr_array_new_with_free_func (free_gstring);
}

static GPtrArray *
decode_byte_level (GPtrArray *toks)
{
  GString *bytes = g_string_new (NULL);
  for (guint i = 0; i < toks->len; i++)
    {
      const GString *t = g_ptr_array_index (toks, i);
      gsize before = bytes->len;
      gboolean all = TRUE;
      for (const char *c = t->str; c < t->str + t->len;
           c = g_utf8_next_char (c))
        {
          int b = stow_bpe_char_byte (g_utf8_get_char (c));
          if (b < 0)
            {
              all = FALSE;
              break;
            }
          g_string_append_c (bytes, (char)b);
        }
      /* A token with a character that stands for no byte is its own
       * UTF-8 (an added token's text). */
      if (!all)
        {
          g_string_truncate (bytes, before);
          g_string_append_len (bytes, t->str, (gssize)t->len);
        }
    }
  GPtrArray *out = new_tokens ();
  GString *s = g_string_new (NULL);
  stow_append_utf8_lossy (s, bytes->str, bytes->len);
  g_string_free (bytes, TRUE);
  g_ptr_array_add (out, s);
  return out;
}

static void
flush_bytes (GPtrArray *out, GString *bytes)
{
  if (bytes->len == 0)
    return;
  if (is_valid_utf8 (bytes->str, bytes->len))
    g_ptr_array_add (out, g_string_new_len (bytes->str, (gssize)bytes->len));
  else
    for (gsize i = 0; i < bytes->len; i++)
      g_ptr_array_add (out, g_string_new (REPLACEMENT_CHAR));
  g_string_truncate (bytes, 0);
}

static GPtrArray *
decode_byte_fallback (GPtrArray *toks)
{
  GPtrArray *out = new_tokens ();
  g_autoptr (GString) bytes = g_string_new (NULL);
  for (guint i = 0; i < toks->len; i++)
    {
      GString *t = g_ptr_array_index (toks, i);
      guint8 b;
      if (byte_token (t, &b))
        {
          g_string_append_c (bytes, (char)b);
          continue;
        }
      flush_bytes (out, bytes);
      g_ptr_array_add (out, g_string_new_len (t->str, (gssize)t->len));
    }
  flush_bytes (out, bytes);
  return out;
}

static GPtrArray *
decode_fuse (GPtrArray *toks)
{
  GPtrArray *out = new_tokens ();
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < toks->len; i++)
    {
      const GString *t = g_ptr_array_index (toks, i);
      g_string_append_len (s, t->str, (gssize)t->len);
    }
  g_ptr_array_add (out, s);
  return out;
}

static void
strip_token (const Decoder *d, GString *t)
{
  /* Up to strip_start characters equal to the content at the start, up to
   * strip_stop at the end. */
  gsize cut_start = 0;
  const char *p = t->str;
  for (guint k = 0; k < d->strip_start && p < t->str + t->len; k++)
    {
      if (g_utf8_get_char (p) != d->strip_char)
        break;
      p = g_utf8_next_char (p);
      cut_start = (gsize)(p - t->str);
    }
  gsize cut_stop = t->len;
  for (guint k = 0; k < d->strip_stop && cut_stop > cut_start; k++)
    {
      const char *prev = g_utf8_find_prev_char (t->str, t->str + cut_stop);
      if (prev == NULL || g_utf8_get_char (prev) != d->strip_char)
        break;
      cut_stop = (gsize)(prev - t->str);
    }
  g_string_truncate (t, cut_stop);
  g_string_erase (t, 0, (gssize)cut_start);
}

static void
replace_token (const Decoder *d, GString *t)
{
  GString *r = g_string_new (NULL);
  gsize prev = 0;
  if (d->pattern.regex != NULL)
    {
      GMatchInfo *mi = NULL;
      g_regex_match_full (d->pattern.regex, t->str, (gssize)t->len, 0, 0, &mi,
                          NULL);
      while (g_match_info_matches (mi))
        {
          gint a, b;
          g_match_info_fetch_pos (mi, 0, &a, &b);
          g_string_append_len (r, t->str + prev, (gssize)((gsize)a - prev));
          g_string_append_len (r, d->text, (gssize)d->text_len);
          prev = (gsize)b;
          g_match_info_next (mi, NULL);
        }
      g_match_info_free (mi);
    }
  else
    while (d->pattern.literal_len > 0 && prev < t->len)
      {
        const char *hit = memmem (t->str + prev, t->len - prev,
                                  d->pattern.literal, d->pattern.literal_len);
        if (hit == NULL)
          break;
        g_string_append_len (r, t->str + prev, hit - (t->str + prev));
        g_string_append_len (r, d->text, (gssize)d->text_len);
        prev = (gsize)(hit - t->str) + d->pattern.literal_len;
      }
  g_string_append_len (r, t->str + prev, (gssize)(t->len - prev));
  g_string_assign (t, "");
  g_string_append_len (t, r->str, (gssize)r->len);
  g_string_free (r, TRUE);
}

static void
metaspace_token (const Decoder *d, GString *t, gboolean first)
{
  GString *r = g_string_new (NULL);
  for (const char *c = t->str; c < t->str + t->len; c = g_utf8_next_char (c))
    {
      gunichar ch = g_utf8_get_char (c);
      if (ch != d->strip_char)
        g_string_append_len (r, c, g_utf8_next_char (c) - c);
      else if (!(first && d->prepend != PREPEND_NEVER))
        g_string_append_c (r, ' ');
    }
  g_string_assign (t, "");
  g_string_append_len (t, r->str, (gssize)r->len);
  g_string_free (r, TRUE);
}

char *
stow_hf_tokenizer_decode (const StowHfTokenizer *t, const guint32 *ids, gsize n,
                          gboolean skip_special, gsize *out_len)
{
  g_return_val_if_fail (t != NULL && (ids != NULL || n == 0), NULL);
  GPtrArray *toks = new_tokens ();
  for (gsize i = 0; i < n; i++)
    {
      AddedToken *a
          = g_hash_table_lookup (t->added_by_id, GUINT_TO_POINTER (ids[i]));
      const char *s;
      gsize len;
      if (a != NULL)
        {
          s = a->normalized_form ? a->normalized_form : a->content;
          len = a->normalized_form ? a->normalized_len : a->len;
        }
      else if ((s = stow_bpe_id_to_token (t->bpe, ids[i], &len)) == NULL)
        continue;
      /* HF asks whether the string is a special token's. */
      if (skip_special && g_hash_table_contains (t->special_strings, s))
        continue;
      g_ptr_array_add (toks, g_string_new_len (s, (gssize)len));
    }
  GString *out = g_string_new (NULL);
  if (!t->has_decoder)
    {
      for (guint i = 0; i < toks->len; i++)
        {
          const GString *s = g_ptr_array_index (toks, i);
          if (i > 0)
            g_string_append_c (out, ' ');
          g_string_append_len (out, s->str, (gssize)s->len);
        }
      g_ptr_array_unref (toks);
      if (out_len)
        *out_len = out->len;
      return g_string_free (out, FALSE);
    }
  for (guint k = 0; k < t->n_decs; k++)
    {
      const Decoder *d = &t->decs[k];
      GPtrArray *next = NULL;
      switch (d->kind)
        {
        case DEC_BYTE_LEVEL:
          next = decode_byte_level (toks);
          break;
        case DEC_BYTE_FALLBACK:
          next = decode_byte_fallback (toks);
          break;
        case DEC_FUSE:
          next = decode_fuse (toks);
          break;
        case DEC_STRIP:
          for (guint i = 0; i < toks->len; i++)
            strip_token (d, g_ptr_array_index (toks, i));
          break;
        case DEC_REPLACE:
          for (guint i = 0; i < toks->len; i++)
            replace_token (d, g_ptr_array_index (toks, i));
          break;
        case DEC_METASPACE:
          for (guint i = 0; i < toks->len; i++)
            metaspace_token (d, g_ptr_array_index (toks, i), i == 0);
          break;
        }
      if (next != NULL)
        {
          g_ptr_array_unref (toks);
          toks = next;
        }
    }
  for (guint i = 0; i < toks->len; i++)
    {
      const GString *s = g_ptr_array_index (toks, i);
      g_string_append_len (out, s->str, (gssize)s->len);
    }
  g_ptr_array_unref (toks);
  if (out_len)
    *out_len = out->len;
  return g_string_free (out, FALSE);
}
