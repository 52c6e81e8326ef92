/* SPDX-License-Identifier: MIT
 *
 * data/regex.c: the regexes of tokenizer.json files, written for
 * Oniguruma (which HF tokenizers uses), compiled by GRegex (PCRE2).  The
 * syntax is the same; two classes are not: PCRE2 10.42's \s takes U+180E,
 * which Unicode's White_Space (Oniguruma's \s) no longer has, and its
 * Unicode 14 tables lack the letters and digits Unicode 15 added, which
 * Oniguruma's \p{L} and \p{N} match.  Those are rewritten as classes that
 * say exactly what Oniguruma matches; tests/test-tokenizer.c's split
 * probes show the cuts agree.
 */
#include "data/tokenizer-private.h"

#include <string.h>

/* Unicode's White_Space (PropList.txt), inside a class. */
#define WHITE_SPACE                                                            \
  "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}"           \
  "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* The letters and digits of Unicode 15.0 that PCRE2 10.42 (Unicode 14.0)
 * does not know: Kawi, Nag Mundari, CJK Extension H and a few more.
 * Listed for a newer PCRE2 too, where they are no-ops. */
#define LETTERS_15                                                             \
  "\\x{1123f}-\\x{11240}\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}"  \
  "\\x{1342f}\\x{13441}-\\x{13446}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"   \
  "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{2b739}\\x{31350}-\\x{323af}"
#define DIGITS_15                                                              \
  "\\x{11f50}-\\x{11f59}\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}"

/* The class body @pattern's escape at @p stands for, with its length in
 * @len, when it is one we rewrite; NULL otherwise.  *@negated: \S, \P{..}. */
static const char *
rewritten_class (const char *p, gsize *len, gboolean *negated)
{
  static const struct
  {
    const char *escape;
    const char *body;
    gboolean negated;
  } table[] = {
    { .escape = "\\s", .body = WHITE_SPACE, .negated = FALSE },
    { .escape = "\\S", .body = WHITE_SPACE, .negated = TRUE },
    { .escape = "\\p{L}", .body = "\\p{L}" LETTERS_15, .negated = FALSE },
    { .escape = "\\P{L}", .body = "\\p{L}" LETTERS_15, .negated = TRUE },
    { .escape = "\\p{N}", .body = "\\p{N}" DIGITS_15, .negated = FALSE },
    { .escape = "\\P{N}", .body = "\\p{N}" DIGITS_15, .negated = TRUE },
  };
  for (guint i = 0; i < G_N_ELEMENTS (table); i++)
    {
      gsize n = strlen (table[i].escape);
      if (strncmp (p, table[i].escape, n) == 0)
        {
          *len = n;
          *negated = table[i].negated;
          return table[i].body;
        }
    }
  return NULL;
}

/* @pattern with its \s, \S, \p{L}, \P{L}, \p{N} and \P{N} as Oniguruma
 * means them.  Inside a class ([^\s\p{L}]) a class body is spliced in; a
 * negated one there stays as it was (no tokenizer regex has one). */
static char *
rewrite (const char *pattern)
{
  GString *out = g_string_new (NULL);
  gboolean in_class = FALSE;
  const char *p = pattern;
  while (*p)
    {
      if (*p == '\\' && p[1] != '\0')
        {
          gsize len = 0;
          gboolean negated = FALSE;
          const char *body = rewritten_class (p, &len, &negated);
          if (body != NULL && !in_class)
            g_string_append_printf (out, "[%s%s]", negated ? "^" : "", body);
          else if (body != NULL && !negated)
            g_string_append (out, body);
          else
            {
              /* Any other escape, whole: \x{...}, \p{...}, \\, \]. */
              len = (gsize)(g_utf8_next_char (p + 1) - p);
              if ((p[1] == 'p' || p[1] == 'P' || p[1] == 'x') && p[2] == '{')
                {
                  const char *close = strchr (p + 2, '}');
                  if (close != NULL)
                    len = (gsize)(close + 1 - p);
                }
              g_string_append_len (out, p, (gssize)len);
            }
          p += len;
          continue;
        }
      if (!in_class && *p == '[')
        {
          in_class = TRUE;
          g_string_append_c (out, *p++);
          if (*p == '^')
            g_string_append_c (out, *p++);
          /* A ']' first in a class is a literal. */
          if (*p == ']')
            g_string_append_c (out, *p++);
          continue;
        }
      if (in_class && *p == '[' && p[1] == ':')
        {
          /* A POSIX class, [:alpha:], whole. */
          const char *close = strstr (p + 2, ":]");
          gsize len = close ? (gsize)(close + 2 - p) : 1;
          g_string_append_len (out, p, (gssize)len);
          p += len;
          continue;
        }
      if (in_class && *p == ']')
        in_class = FALSE;
      g_string_append_c (out, *p++);
    }
  return g_string_free (out, FALSE);
}

GRegex *
stow_onig_regex_new (const char *pattern, GError **error)
{
  g_autofree char *pcre = rewrite (pattern);
  return g_regex_new (pcre, G_REGEX_OPTIMIZE, 0, error);
}
