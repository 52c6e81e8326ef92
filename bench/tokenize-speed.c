/* SPDX-License-Identifier: MIT
 *
 * bench/tokenize-speed.c: data/tokenizer.c's encoding speed on one thread,
 * for bench/tokenize-hf.py to set beside HF tokenizers': reads a text file,
 * encodes it (whole, or line by line with --lines, as documents), and
 * prints one JSON object: seconds to read the tokenizer, seconds to
 * encode, bytes, tokens, and a checksum of the ids so that the two
 * tokenizers' outputs can be compared without writing them out.
 *
 *   tokenize-speed TOKENIZER TEXT [--lines] [--repeat N]
 */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "data/tokenizer.h"

int
main (int argc, char **argv)
{
  if (argc < 3)
    {
      fprintf (stderr, "usage: tokenize-speed TOKENIZER TEXT [--lines] "
                       "[--repeat N]\n");
      return 2;
    }
  gboolean lines = FALSE;
  guint repeat = 1;
  for (int i = 3; i < argc; i++)
    if (strcmp (argv[i], "--lines") == 0)
      lines = TRUE;
    else if (strcmp (argv[i], "--repeat") == 0 && i + 1 < argc)
      {
        int n = atoi (argv[++i]);
        repeat = n > 1 ? (guint)n : 1;
      }
  g_autoptr (GError) error = NULL;
  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (StowHfTokenizer) t
      = stow_hf_tokenizer_new_from_path (argv[1], &error);
  if (t == NULL)
    {
      fprintf (stderr, "%s\n", error->message);
      return 2;
    }
  gint64 t1 = g_get_monotonic_time ();
  g_autofree char *text = NULL;
  gsize len;
  if (!g_file_get_contents (argv[2], &text, &len, &error))
    {
      fprintf (stderr, "%s\n", error->message);
      return 2;
    }
  double best = 1e30;
  guint64 tokens = 0, sum = 0;
  for (guint r = 0; r < repeat; r++)
    {
      /* A fresh encoder each time: its word cache starts empty, as HF's
       * does in a new process. */
      g_autoptr (StowHfEncoder) e = stow_hf_encoder_new (t);
      g_autoptr (GArray) ids = g_array_sized_new (
          FALSE, FALSE, sizeof (guint32), (guint)(len / 3));
      tokens = sum = 0;
      gint64 a = g_get_monotonic_time ();
      const char *p = text, *end = text + len;
      while (p < end)
        {
          const char *stop = lines ? memchr (p, '\n', (gsize)(end - p)) : NULL;
          gsize n = stop ? (gsize)(stop - p) : (gsize)(end - p);
          g_array_set_size (ids, 0);
          if (!stow_hf_encoder_encode (e, p, (gssize)n, FALSE, ids, &error))
            {
              fprintf (stderr, "%s\n", error->message);
              return 2;
            }
          for (guint i = 0; i < ids->len; i++)
            sum = sum * 1000003 + g_array_index (ids, guint32, i);
          tokens += ids->len;
          p += n + (stop ? 1 : 0);
        }
      double s = (double)(g_get_monotonic_time () - a) / 1e6;
      best = MIN (best, s);
    }
  printf ("{\"load_s\": %.4f, \"encode_s\": %.4f, \"bytes\": %" G_GSIZE_FORMAT
          ", \"tokens\": %" G_GUINT64_FORMAT
          ", \"checksum\": \"%016" G_GINT64_MODIFIER "x\"}\n",
          (double)(t1 - t0) / 1e6, best, len, tokens, sum);
  return 0;
}
