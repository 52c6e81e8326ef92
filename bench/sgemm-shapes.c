/* SPDX-License-Identifier: MIT
 *
 * bench/sgemm-shapes.c: OpenBLAS's own rate on given GEMM shapes, for
 * bench/cpu-train.py: for each MxNxK, the best of 3 timed cblas_sgemm
 * calls (row-major C (M, N) = A (M, K) B (K, N)) on OpenBLAS's threads.
 * Prints {"seconds": [...], "gflops": [...]}.  Not a test.
 *
 * usage: sgemm-shapes --threads 2 512x768x768 512x2048x768 ...
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

int
main (int argc, char **argv)
{
  int threads = 2;
  GString *secs = g_string_new ("["), *rates = g_string_new ("[");
  for (int i = 1; i < argc; i++)
    {
      if (strcmp (argv[i], "--threads") == 0 && i + 1 < argc)
        {
          threads = atoi (argv[++i]);
          continue;
        }
      long m, n, k;
      if (sscanf (argv[i], "%ldx%ldx%ld", &m, &n, &k) != 3 || m <= 0 || n <= 0
          || k <= 0)
        {
          fprintf (stderr, "sgemm-shapes: \"%s\": expected MxNxK\n", argv[i]);
          return 2;
        }
      openblas_set_num_threads (threads);
      float *a = g_new (float, m *k), *b = g_new (float, k *n),
            *c = g_new (float, m *n);
      for (long j = 0; j < m * k; j++)
        a[j] = (float)(j % 7) * 0.1f;
      for (long j = 0; j < k * n; j++)
        b[j] = (float)(j % 5) * 0.1f;
      double best = 1e30;
      for (int rep = 0; rep < 4; rep++)
        {
          gint64 t0 = g_get_monotonic_time ();
          cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m,
                       (int)n, (int)k, 1.0f, a, (int)k, b, (int)n, 0.0f, c,
                       (int)n);
          double s = (double)(g_get_monotonic_time () - t0) / 1e6;
          if (rep > 0 && s < best) /* the first warms up */
            best = s;
        }
      g_string_append_printf (secs, "%s%.6g", secs->len > 1 ? ", " : "", best);
      g_string_append_printf (rates, "%s%.4g", rates->len > 1 ? ", " : "",
                              2.0 * m * n * k / best / 1e9);
      g_free (a), g_free (b), g_free (c);
    }
  printf ("{\"seconds\": %s], \"gflops\": %s]}\n", secs->str, rates->str);
  g_string_free (secs, TRUE);
  g_string_free (rates, TRUE);
  return 0;
}
