/* SPDX-License-Identifier: MIT
 *
 * bench/attention-gpu.c: times the cuda runtime's causal attention alone,
 * forward and backward, bf16 on tensor cores against bf16 on the CUDA-core
 * kernels (and the fp32 runtime), and prints ms and TFLOP/s.  FLOPs
 * counted causal: forward 2 * 2 * B a T^2 d / 2, backward 2.5 times that.
 * Built only with the CUDA toolkit; never run by `meson test`.
 *
 * Usage: attention-gpu [B T a kv d [iterations]]  (default 8 1024 16 16 128 20)
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "executor/backends/cuda/llama-cuda.h"

static int
check (cudaError_t e, const char *what)
{
  if (e != cudaSuccess)
    {
      fprintf (stderr, "attention-gpu: %s: %s\n", what, cudaGetErrorString (e));
      return 0;
    }
  return 1;
}

/* Mean ms per call of forward (@bwd FALSE) or backward, after a warm-up. */
static double
time_ms (StowLlamaCuda *L, cudaStream_t s, gboolean bwd, int iters, guint64 B,
         guint64 T, void **t, float *lse)
{
  cudaEvent_t e0, e1;
  cudaEventCreate (&e0);
  cudaEventCreate (&e1);
  for (int i = -2; i < iters; i++)
    {
      if (i == 0)
        cudaEventRecord (e0, s);
      if (bwd)
        stow_llama_cuda_attention_backward (L, B, T, t[0], t[1], t[2], t[3],
                                            lse, t[4], t[5], t[6], t[7]);
      else
        stow_llama_cuda_attention_forward (L, B, T, t[0], t[1], t[2], t[3],
                                           lse);
    }
  cudaEventRecord (e1, s);
  cudaEventSynchronize (e1);
  float ms = 0;
  cudaEventElapsedTime (&ms, e0, e1);
  cudaEventDestroy (e0);
  cudaEventDestroy (e1);
  return ms / iters;
}

int
main (int argc, char **argv)
{
  guint64 B = 8, T = 1024, a = 16, kv = 16, d = 128;
  int iters = 20;
  if (argc >= 6)
    {
      B = strtoull (argv[1], NULL, 10);
      T = strtoull (argv[2], NULL, 10);
      a = strtoull (argv[3], NULL, 10);
      kv = strtoull (argv[4], NULL, 10);
      d = strtoull (argv[5], NULL, 10);
    }
  if (argc >= 7)
    iters = atoi (argv[6]);
  g_autoptr (GError) error = NULL;
  if (!stow_cuda_available (&error))
    {
      fprintf (stderr, "attention-gpu: %s\n", error->message);
      return 77;
    }
  cudaStream_t s;
  if (!check (cudaStreamCreate (&s), "cudaStreamCreate"))
    return 2;
  StowLlamaConfig cfg = { .hidden = a * d,
                          .n_layers = 1,
                          .n_heads = a,
                          .n_kv_heads = kv,
                          .head_dim = d,
                          .ffn = 64,
                          .vocab = 64,
                          .rope_theta = 10000,
                          .rms_norm_eps = 1e-5 };
  guint64 n = B * T;
  double fwd_flop = 2.0 * 2.0 * B * a * T * T * d / 2,
         bwd_flop = 2.5 * fwd_flop;
  printf ("attention B %" G_GUINT64_FORMAT " T %" G_GUINT64_FORMAT
          " a %" G_GUINT64_FORMAT " kv %" G_GUINT64_FORMAT
          " d %" G_GUINT64_FORMAT
          ", %d iterations; causal GFLOP forward %.1f, backward %.1f\n",
          B, T, a, kv, d, iters, fwd_flop / 1e9, bwd_flop / 1e9);
  const struct
  {
    const char *name;
    StowDtype type;
    gboolean tc;
  } runs[] = { { "bf16 tensor cores", STOW_DTYPE_BF16, TRUE },
               { "bf16 CUDA cores", STOW_DTYPE_BF16, FALSE },
               { "fp32 CUDA cores", STOW_DTYPE_F32, FALSE } };
  for (guint r = 0; r < G_N_ELEMENTS (runs); r++)
    {
      g_autoptr (StowLlamaCuda) L
          = stow_llama_cuda_new (&cfg, runs[r].type, n, T, s, &error);
      if (L == NULL)
        {
          fprintf (stderr, "attention-gpu: %s\n", error->message);
          return 2;
        }
      gboolean tc = stow_llama_cuda_attention_use_tc (L, runs[r].tc);
      guint64 e = runs[r].type == STOW_DTYPE_BF16 ? 2 : 4;
      /* q k v o dout dq dk dv */
      guint64 el[8]
          = { a * d, kv * d, kv * d, a * d, a * d, a * d, kv * d, kv * d };
      void *t[8];
      for (int i = 0; i < 8; i++)
        {
          if (!check (cudaMalloc (&t[i], n * el[i] * e), "cudaMalloc"))
            return 2;
          /* Small values (0x3c00 bf16 is 2^-7; fp32 bit patterns tiny). */
          cudaMemset (t[i], 0x3c, n * el[i] * e);
        }
      float *lse;
      if (!check (cudaMalloc ((void **)&lse, 4 * n * a), "cudaMalloc"))
        return 2;
      double f = time_ms (L, s, FALSE, iters, B, T, t, lse);
      double b = time_ms (L, s, TRUE, iters, B, T, t, lse);
      if (!stow_llama_cuda_check (L, &error))
        {
          fprintf (stderr, "attention-gpu: %s\n", error->message);
          return 2;
        }
      printf ("%-18s (tensor cores %s): forward %8.3f ms %6.1f TFLOP/s, "
              "backward %8.3f ms %6.1f TFLOP/s\n",
              runs[r].name, tc ? "yes" : "no", f, fwd_flop / f / 1e9, b,
              bwd_flop / b / 1e9);
      for (int i = 0; i < 8; i++)
        cudaFree (t[i]);
      cudaFree (lse);
    }
  cudaStreamDestroy (s);
  return 0;
}
