/* SPDX-License-Identifier: MIT
 *
 * bench/sgemm-shapes.c: the cpu runtime's own rate on given GEMM shapes,
 * for bench/cpu-train.py: for each [TT:]MxNxK, the best of 3 timed calls
 * of the runtime's GEMM (stow_llama_gemm: tiles of C on OpenMP threads,
 * each a call of the kernel executor/gemm.c chose), C (M, N) = op(A) op(B)
 * with op(A) transposed when the prefix's first letter is T, op(B) when the
 * second is (NN by default).  --bf16: bf16 operands and C, or as a suffix
 * :ABC says, b or f for each of A, B and C (the loss's products at bf16
 * have fp32 operands beside the bf16 head: "NT:512x32000x768:fbf").
 * Prints {"kernel": "...", "seconds": [...], "gflops": [...], "cpu_seconds":
 * [...]}: the best wall time of each (of --reps calls, 4 by default, the
 * first left out), and the best CPU time of the process
 * over the threads (what the wall time would be on a machine nothing else
 * loads, with the threads balanced).  --flush MIB: before each call the
 * threads write a buffer of MIB MiB, so the operands come from memory as
 * in a training step, where the kernels before a product have evicted them
 * (without it they stay in the caches between calls).  Not a test.
 *
 * usage: sgemm-shapes [--threads 2] [--reps 4] [--flush 256] [--bf16]
 * NT:512x768x768 512x2048x768[:fbf]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glib.h>

#include "executor/llama-private.h"

int
main (int argc, char **argv)
{
  guint threads = 2;
  gboolean bf16 = FALSE;
  int first = 1, reps = 4;
  guint64 flush = 0;
  for (; first < argc && argv[first][0] == '-'; first++)
    {
      if (strcmp (argv[first], "--threads") == 0 && first + 1 < argc)
        threads = (guint)atoi (argv[++first]);
      else if (strcmp (argv[first], "--bf16") == 0)
        bf16 = TRUE;
      else if (strcmp (argv[first], "--flush") == 0 && first + 1 < argc)
        flush = (guint64)g_ascii_strtoull (argv[++first], NULL, 10) << 20;
      else if (strcmp (argv[first], "--reps") == 0 && first + 1 < argc)
        {
          reps = atoi (argv[++first]);
          reps = MAX (2, reps);
        }
      else
        {
          fprintf (stderr, "sgemm-shapes: unknown option %s\n", argv[first]);
          return 2;
        }
    }
  /* A runtime only for its GEMM and workspace: the config is a stub. */
  StowLlamaConfig c = { .hidden = 64,
                        .n_layers = 1,
                        .n_heads = 1,
                        .n_kv_heads = 1,
                        .head_dim = 64,
                        .ffn = 64,
                        .vocab = 64,
                        .rope_theta = 1e4,
                        .rms_norm_eps = 1e-6 };
  GError *error = NULL;
  StowLlama *L = stow_llama_new (&c, bf16 ? STOW_DTYPE_BF16 : STOW_DTYPE_F32,
                                 64, threads, &error);
  if (L == NULL)
    {
      fprintf (stderr, "sgemm-shapes: %s\n", error->message);
      return 2;
    }
  g_autofree char *kernel = stow_gemm_describe ();
  guint8 *sweep = flush > 0 ? g_malloc (flush) : NULL;
  GString *secs = g_string_new ("["), *rates = g_string_new ("[");
  GString *cpus = g_string_new ("[");
  for (int i = first; i < argc; i++)
    {
      const char *spec = argv[i];
      gboolean ta = FALSE, tb = FALSE;
      if (strlen (spec) > 3 && spec[2] == ':')
        {
          ta = spec[0] == 'T';
          tb = spec[1] == 'T';
          spec += 3;
        }
      long m, n, k;
      char types[4] = "";
      int got = sscanf (spec, "%ldx%ldx%ld:%3[bf]", &m, &n, &k, types);
      if (got < 3 || m <= 0 || n <= 0 || k <= 0
          || (got == 4 && (strlen (types) != 3 || !bf16)))
        {
          fprintf (stderr,
                   "sgemm-shapes: \"%s\": expected [TT:]MxNxK[:ABC] (ABC: "
                   "b or f each, with --bf16)\n",
                   argv[i]);
          return 2;
        }
      /* Each operand's type: all the runtime's unless :ABC says. */
      gboolean ab = got == 4 ? types[0] == 'b' : bf16;
      gboolean bb = got == 4 ? types[1] == 'b' : bf16;
      gboolean cb = got == 4 ? types[2] == 'b' : bf16;
      guint8 *a = g_malloc ((ab ? 2 : 4) * m * k);
      guint8 *b = g_malloc ((bb ? 2 : 4) * k * n);
      guint8 *cc = g_malloc ((cb ? 2 : 4) * m * n);
      for (long j = 0; j < m * k; j++)
        {
          float v = (float)(j % 7) * 0.1f;
          if (ab)
            ((guint16 *)a)[j] = stow_f32_to_bf16 (v);
          else
            ((float *)a)[j] = v;
        }
      for (long j = 0; j < k * n; j++)
        {
          float v = (float)(j % 5) * 0.1f;
          if (bb)
            ((guint16 *)b)[j] = stow_f32_to_bf16 (v);
          else
            ((float *)b)[j] = v;
        }
      StowMat A = { .p = a, .bf16 = ab, .ld = ta ? m : k, .trans = ta };
      StowMat B = { .p = b, .bf16 = bb, .ld = tb ? k : n, .trans = tb };
      double best = 1e30, best_cpu = 1e30;
      for (int rep = 0; rep < reps; rep++)
        {
          struct timespec c0, c1;
          if (sweep != NULL)
            {
#pragma omp parallel for num_threads(threads)
              for (guint64 o = 0; o < flush; o += 4096)
                memset (sweep + o, rep, MIN (4096, flush - o));
            }
          clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &c0);
          gint64 t0 = g_get_monotonic_time ();
          stow_llama_gemm (L, m, n, k, 1.0f, A, B, cc, cb, n, FALSE, NULL, 0,
                           NULL);
          double s = (double)(g_get_monotonic_time () - t0) / 1e6;
          clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &c1);
          double cs = ((double)(c1.tv_sec - c0.tv_sec)
                       + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9)
                      / threads;
          if (rep > 0) /* the first warms up */
            best = MIN (best, s), best_cpu = MIN (best_cpu, cs);
        }
      g_string_append_printf (secs, "%s%.6g", secs->len > 1 ? ", " : "", best);
      g_string_append_printf (cpus, "%s%.6g", cpus->len > 1 ? ", " : "",
                              best_cpu);
      g_string_append_printf (rates, "%s%.4g", rates->len > 1 ? ", " : "",
                              2.0 * m * n * k / best / 1e9);
      g_free (a), g_free (b), g_free (cc);
    }
  printf ("{\"kernel\": \"%s\", \"seconds\": %s], \"gflops\": %s], "
          "\"cpu_seconds\": %s]}\n",
          kernel, secs->str, rates->str, cpus->str);
  g_string_free (secs, TRUE);
  g_string_free (cpus, TRUE);
  g_string_free (rates, TRUE);
  stow_llama_free (L);
  g_free (sweep);
  return 0;
}
