/* SPDX-License-Identifier: MIT
 *
 * bench/llama-layer.c: times one decoder layer's forward and backward
 * through executor/llama.h on random weights, for bench/llama-layer.py,
 * which runs PyTorch eager on the same shape beside it.  Prints one JSON
 * object: the shape, the threads and the best and median seconds of the
 * forward, the backward and both.  Not a test: nothing is checked.
 *
 * usage: llama-layer-bench --hidden 768 --heads 12 --kv-heads 4 --ffn 2048
 *          --seq 512 --batch 2 --threads 2 [--bf16]
 *          [--reps 10]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor/llama.h"

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void
fill (void *p, guint64 n, gboolean bf16, double scale, GRand *r)
{
  for (guint64 i = 0; i < n; i++)
    {
      float v = (float)(scale * g_rand_double_range (r, -1, 1));
      if (bf16)
        ((guint16 *)p)[i] = stow_f32_to_bf16 (v);
      else
        ((float *)p)[i] = v;
    }
}

int
main (int argc, char **argv)
{
  gint64 hidden = 768, heads = 12, kv_heads = 12, ffn = 2048, seq = 512;
  gint64 batch = 1, reps = 10;
  gint threads = 2;
  gboolean bf16 = FALSE;
  GOptionEntry entries[]
      = { { "hidden", 0, 0, G_OPTION_ARG_INT64, &hidden, "h", "N" },
          { "heads", 0, 0, G_OPTION_ARG_INT64, &heads, "a", "N" },
          { "kv-heads", 0, 0, G_OPTION_ARG_INT64, &kv_heads, "k", "N" },
          { "ffn", 0, 0, G_OPTION_ARG_INT64, &ffn, "f", "N" },
          { "seq", 0, 0, G_OPTION_ARG_INT64, &seq, "T", "N" },
          { "batch", 0, 0, G_OPTION_ARG_INT64, &batch, "B", "N" },
          { "threads", 0, 0, G_OPTION_ARG_INT, &threads, "threads", "N" },
          { "bf16", 0, 0, G_OPTION_ARG_NONE, &bf16, "bf16 storage", NULL },
          { "reps", 0, 0, G_OPTION_ARG_INT64, &reps, "timed repetitions", "N" },
          { NULL } };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (ctx, &argc, &argv, &error) || heads <= 0
      || hidden % heads != 0 || reps < 1 || batch < 1 || seq < 1)
    {
      fprintf (stderr, "llama-layer-bench: %s\n",
               error ? error->message : "bad shape");
      return 2;
    }
  StowLlamaConfig c = { .hidden = (guint64)hidden,
                        .n_layers = 1,
                        .n_heads = (guint64)heads,
                        .n_kv_heads = (guint64)kv_heads,
                        .head_dim = (guint64)(hidden / heads),
                        .ffn = (guint64)ffn,
                        .vocab = 32000,
                        .rope_theta = 10000,
                        .rms_norm_eps = 1e-6 };
  StowDtype dt = bf16 ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
  g_autoptr (StowLlama) L
      = stow_llama_new (&c, dt, (guint64)seq, (guint)threads, &error);
  if (L == NULL)
    {
      fprintf (stderr, "llama-layer-bench: %s\n", error->message);
      return 2;
    }
  guint64 e = bf16 ? 2 : 4, h = c.hidden, f = c.ffn, n = (guint64)(batch * seq);
  guint64 ad = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  guint64 sizes[]
      = { h, ad * h, kd * h, kd * h, h * ad, h, f * h, f * h, h * f };
  void *w[9], *g[9];
  g_autoptr (GRand) r = g_rand_new_with_seed (1);
  for (guint i = 0; i < 9; i++)
    {
      w[i] = g_malloc (sizes[i] * e);
      g[i] = g_malloc (sizes[i] * e);
      gboolean norm = i == 0 || i == 5;
      guint64 in = i == 4 ? ad : i == 8 ? f : h;
      fill (w[i], sizes[i], bf16, norm ? 1.0 : 1.7 / sqrt ((double)in), r);
      if (norm)
        for (guint64 j = 0; j < sizes[i]; j++)
          {
            if (bf16)
              ((guint16 *)w[i])[j] = stow_f32_to_bf16 (1.0f);
            else
              ((float *)w[i])[j] = 1.0f;
          }
    }
  StowLlamaLayerWeights lw = { .attn_norm = w[0],
                               .wq = w[1],
                               .wk = w[2],
                               .wv = w[3],
                               .wo = w[4],
                               .mlp_norm = w[5],
                               .wg = w[6],
                               .wu = w[7],
                               .wd = w[8] };
  StowLlamaLayerWeights lg = { .attn_norm = g[0],
                               .wq = g[1],
                               .wk = g[2],
                               .wv = g[3],
                               .wo = g[4],
                               .mlp_norm = g[5],
                               .wg = g[6],
                               .wu = g[7],
                               .wd = g[8] };
  guint64 out_b = stow_llama_out_bytes (L, n);
  guint64 rest_b = stow_llama_saved_bytes (L, n) - out_b;
  g_autofree void *x0 = g_malloc (out_b);
  g_autofree void *x = g_malloc (out_b);
  g_autofree void *rest = g_malloc (rest_b);
  g_autofree void *out = g_malloc (out_b);
  g_autofree void *dout = g_malloc (out_b);
  g_autofree void *ws = g_malloc (stow_llama_backward_ws_bytes (L, n));
  fill (x0, n * h, bf16, 1.0, r);
  fill (dout, n * h, bf16, 1e-3, r);
  StowLlamaSaved s;
  stow_llama_saved_carve (L, n, rest, out, &s);

  guint64 total = (guint64)reps + 2;
  g_autofree double *tf = g_new (double, total);
  g_autofree double *tb = g_new (double, total);
  g_autofree double *tt = g_new (double, total);
  for (guint64 it = 0; it < total; it++)
    {
      memcpy (x, x0, out_b);
      gint64 t0 = g_get_monotonic_time ();
      stow_decoder_layer_forward (stow_llama_decoder (L), (guint64)batch,
                                  (guint64)seq, &lw, x, &s);
      gint64 t1 = g_get_monotonic_time ();
      memcpy (out, dout, out_b); /* dL/d(out), where backward reads it */
      gint64 t2 = g_get_monotonic_time ();
      stow_decoder_layer_backward (stow_llama_decoder (L), (guint64)batch,
                                   (guint64)seq, &lw, x, &s, &lg, FALSE, ws, x);
      gint64 t3 = g_get_monotonic_time ();
      tf[it] = (double)(t1 - t0) / 1e6;
      tb[it] = (double)(t3 - t2) / 1e6;
      tt[it] = tf[it] + tb[it];
    }
  /* The first two are warm-up (page faults, OpenBLAS's thread start). */
  qsort (tf + 2, (size_t)reps, sizeof (double), cmp_double);
  qsort (tb + 2, (size_t)reps, sizeof (double), cmp_double);
  qsort (tt + 2, (size_t)reps, sizeof (double), cmp_double);
  guint64 mid = 2 + (guint64)reps / 2;
  printf ("{\"hidden\": %" G_GINT64_FORMAT ", \"heads\": %" G_GINT64_FORMAT
          ", \"kv_heads\": %" G_GINT64_FORMAT ", \"ffn\": %" G_GINT64_FORMAT
          ", \"seq\": %" G_GINT64_FORMAT ", \"batch\": %" G_GINT64_FORMAT
          ", \"dtype\": \"%s\", \"threads\": %u, "
          "\"reps\": %" G_GINT64_FORMAT ", \"fwd_best_s\": %.6f, "
          "\"fwd_median_s\": %.6f, \"bwd_best_s\": %.6f, \"bwd_median_s\": "
          "%.6f, \"total_best_s\": %.6f, \"total_median_s\": %.6f, "
          "\"workspace_bytes\": %" G_GUINT64_FORMAT "}\n",
          hidden, heads, kv_heads, ffn, seq, batch, bf16 ? "bf16" : "fp32",
          stow_llama_get_n_threads (L), reps, tf[2], tf[mid], tb[2], tb[mid],
          tt[2], tt[mid], stow_llama_workspace_bytes (L));
  for (guint i = 0; i < 9; i++)
    {
      g_free (w[i]);
      g_free (g[i]);
    }
  return 0;
}
