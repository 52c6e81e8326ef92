/* SPDX-License-Identifier: MIT
 *
 * core/strutil.c: edit distance and suggestions.
 */
#include "core/strutil.h"

#include <string.h>

guint
stow_edit_distance (const char *a, const char *b)
{
  gsize la = strlen (a), lb = strlen (b);
  g_autofree guint *row = g_new (guint, lb + 1);
  for (gsize j = 0; j <= lb; j++)
    row[j] = (guint)j;
  for (gsize i = 1; i <= la; i++)
    {
      guint diag = row[0];
      row[0] = (guint)i;
      for (gsize j = 1; j <= lb; j++)
        {
          guint up = row[j];
          guint cost = g_ascii_tolower (a[i - 1]) == g_ascii_tolower (b[j - 1])
                           ? 0
                           : 1;
          guint best = MIN (row[j] + 1, row[j - 1] + 1);
          row[j] = MIN (best, diag + cost);
          diag = up;
        }
    }
  return row[lb];
}

const char *
stow_suggest (const char *word, const char *const *candidates,
              gsize n_candidates)
{
  const char *best = NULL;
  guint best_d = G_MAXUINT;
  guint limit = MAX (2, (guint)strlen (word) / 3);
  for (gsize i = 0; i < n_candidates; i++)
    {
      guint d = stow_edit_distance (word, candidates[i]);
      /* A candidate that contains the word ("a100" in "A100-80GB") is a
       * good suggestion even when far in edit distance. */
      g_autofree char *lw = g_ascii_strdown (word, -1);
      g_autofree char *lc = g_ascii_strdown (candidates[i], -1);
      if (strlen (lw) >= 3 && strstr (lc, lw) != NULL)
        d = MIN (d, 1);
      if (d < best_d)
        best_d = d, best = candidates[i];
    }
  return best_d <= limit ? best : NULL;
}
