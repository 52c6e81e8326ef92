/* SPDX-License-Identifier: MIT
 *
 * tests/llama-oracle-run.c: the C side of the PyTorch oracle
 * (tests/oracle/llama_oracle.py).  Reads a model, tokens and targets from
 * the script's input file, runs a whole decoder's forward and backward
 * through executor/llama.h as the cpu backend chains it (each layer's
 * output is the next one's input and, in backward, its gradient), and
 * writes the loss, the logits and every parameter gradient back.
 *
 * Input (little-endian): "STOWLLM1", 16 int64 (hidden, n_layers, n_heads,
 * n_kv_heads, head_dim, ffn, vocab, rope_original_max_positions, qkv_bias,
 * o_bias, mlp_bias, tied, batch, seq, dtype 0 fp32 / 1 bf16, loss chunk or
 * 0 for the runtime's rule), 8 doubles (rope_theta, rms_norm_eps,
 * rope_factor, rope_low_freq_factor, rope_high_freq_factor, 3 unused),
 * int32 n_threads and int32 qk_norm (qwen3), then tokens and targets (n int32
 * each) and the parameters in fp32, in param_order () order.  Output:
 * "STOWOUT1", the mean loss (double), logits (n, V) fp32, the gradients in
 * the same order, fp32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil-llama.h"

int
main (int argc, char **argv)
{
  if (argc != 3)
    {
      fprintf (stderr, "usage: llama-oracle-run IN OUT\n");
      return 2;
    }
  g_autofree char *buf = NULL;
  gsize len = 0;
  g_autoptr (GError) error = NULL;
  if (!g_file_get_contents (argv[1], &buf, &len, &error))
    {
      fprintf (stderr, "llama-oracle-run: %s\n", error->message);
      return 2;
    }
  gint64 iv[16];
  double dv[8];
  gint32 n_threads, qk_norm;
  if (len < 8 + sizeof iv + sizeof dv + 8 || memcmp (buf, "STOWLLM1", 8) != 0)
    {
      fprintf (stderr, "llama-oracle-run: %s: not an oracle input\n", argv[1]);
      return 2;
    }
  memcpy (iv, buf + 8, sizeof iv);
  memcpy (dv, buf + 8 + sizeof iv, sizeof dv);
  memcpy (&n_threads, buf + 8 + sizeof iv + sizeof dv, 4);
  memcpy (&qk_norm, buf + 8 + sizeof iv + sizeof dv + 4, 4);
  const char *p = buf + 8 + sizeof iv + sizeof dv + 8;
  StowLlamaConfig cfg = {
    .hidden = (guint64)iv[0],
    .n_layers = (guint64)iv[1],
    .n_heads = (guint64)iv[2],
    .n_kv_heads = (guint64)iv[3],
    .head_dim = (guint64)iv[4],
    .ffn = (guint64)iv[5],
    .vocab = (guint64)iv[6],
    .rope_original_max_positions = (guint64)iv[7],
    .qkv_bias = iv[8] != 0,
    .o_bias = iv[9] != 0,
    .mlp_bias = iv[10] != 0,
    .qk_norm = qk_norm != 0,
    .tied = iv[11] != 0,
    .rope_theta = dv[0],
    .rms_norm_eps = dv[1],
    .rope_factor = dv[2],
    .rope_low_freq_factor = dv[3],
    .rope_high_freq_factor = dv[4],
  };
  StowDtype dtype = iv[14] ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
  g_autoptr (TestLlamaModel) m = test_llama_model_new (
      &cfg, dtype, (guint64)iv[12], (guint64)iv[13], (guint)n_threads,
      iv[15] > 0 ? (guint64)iv[15] : 0, &error);
  if (m == NULL)
    {
      fprintf (stderr, "llama-oracle-run: %s\n", error->message);
      return 2;
    }
  guint64 n = m->n, V = cfg.vocab;
  guint64 need = (guint64)(p - buf) + 8 * n;
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *q = &g_array_index (m->params, TestLlamaParam, i);
      need += 4 * q->rows * q->cols;
    }
  if (len != need)
    {
      fprintf (stderr,
               "llama-oracle-run: %s: %" G_GSIZE_FORMAT
               " bytes, expected %" G_GUINT64_FORMAT "\n",
               argv[1], len, need);
      return 2;
    }
  memcpy (m->tokens, p, 4 * n);
  memcpy (m->targets, p + 4 * n, 4 * n);
  p += 8 * n;
  for (guint64 i = 0; i < n; i++)
    if (m->tokens[i] < 0 || (guint64)m->tokens[i] >= V || m->targets[i] < 0
        || (guint64)m->targets[i] >= V)
      {
        fprintf (stderr,
                 "llama-oracle-run: token %" G_GUINT64_FORMAT
                 " outside the vocabulary\n",
                 i);
        return 2;
      }
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *q = &g_array_index (m->params, TestLlamaParam, i);
      for (guint64 j = 0; j < q->rows * q->cols; j++, p += 4)
        {
          float v;
          memcpy (&v, p, 4);
          test_llama_param_set (m, q, j, v);
        }
    }

  double loss = test_llama_model_step (m, TRUE);

  FILE *out = fopen (argv[2], "wb");
  if (out == NULL)
    {
      perror (argv[2]);
      return 2;
    }
  fwrite ("STOWOUT1", 1, 8, out);
  fwrite (&loss, sizeof loss, 1, out);
  fwrite (m->logits, sizeof (float), n * V, out);
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *q = &g_array_index (m->params, TestLlamaParam, i);
      for (guint64 j = 0; j < q->rows * q->cols; j++)
        {
          float v = test_llama_param_get (m, q, TRUE, j);
          fwrite (&v, sizeof v, 1, out);
        }
    }
  if (fclose (out) != 0)
    {
      perror (argv[2]);
      return 2;
    }
  return 0;
}
