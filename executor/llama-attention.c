/* SPDX-License-Identifier: MIT
 *
 * executor/llama-attention.c: causal grouped-query attention, forward and
 * backward, flash-style in what it keeps: the forward leaves o and the
 * fp32 logsumexp of each (token, head); the backward recomputes the
 * probabilities from q, k and the logsumexp.  Scores exist only as one
 * thread's (BQ, T) tile at a time.  Not here: the projections and rotary.
 */
#include "executor/llama-private.h"

#include <omp.h>

guint64
stow_llama_attention_thread_floats (guint64 max_seq, guint64 head_dim)
{
  guint64 bq = MIN ((guint64)STOW_LLAMA_ATTN_BQ, max_seq);
  /* Forward: Q, K, V (T, d), O (BQ, d), S (BQ, T).  Backward: K, V, dK,
   * dV, Q, dO, dQ (T, d), D (T), S/P and dP (BQ, T). */
  guint64 fwd = 3 * max_seq * head_dim + bq * head_dim + bq * max_seq;
  guint64 bwd = 7 * max_seq * head_dim + max_seq + 2 * bq * max_seq;
  return MAX (fwd, bwd);
}

/* Head @col (width d) of rows [r0, r0 + T) of p (rows of @ld elements) to
 * dst (T, d) fp32. */
static void
load_head (const StowLlama *L, const void *p, guint64 ld, guint64 r0, guint64 T,
           guint64 col, guint64 d, float *dst)
{
  for (guint64 t = 0; t < T; t++)
    {
      guint64 o = (r0 + t) * ld + col;
      if (L->bf16)
        {
          const guint16 *s = (const guint16 *)p + o;
#pragma omp simd
          for (guint64 c = 0; c < d; c++)
            dst[t * d + c] = stow_bf16_to_f32 (s[c]);
        }
      else
        memcpy (dst + t * d, (const float *)p + o, d * sizeof (float));
    }
}

static void
store_head (const StowLlama *L, const float *src, guint64 T, guint64 d, void *p,
            guint64 ld, guint64 r0, guint64 col)
{
  for (guint64 t = 0; t < T; t++)
    {
      guint64 o = (r0 + t) * ld + col;
      if (L->bf16)
        stow_llama_store (L, src + t * d, (guint16 *)p + o, d);
      else
        memcpy ((float *)p + o, src + t * d, d * sizeof (float));
    }
}

/* Scores of queries [q0, q0 + qn) against keys [0, q0 + qn): S (qn, kend)
 * = scale Q K^T, one thread's sgemm. */
static void
scores (const float *Q, const float *K, guint64 q0, guint64 qn, guint64 d,
        float scale, float *S)
{
  guint64 kend = q0 + qn;
  stow_gemm_f32 (FALSE, TRUE, qn, kend, d, scale, Q + q0 * d, d, K, d, 0.0f, S,
                 kend);
}

/* Query t sees keys 0..t: the rest of its row of S is zeroed (P = 0). */
static void
softmax_rows (float *S, guint64 q0, guint64 qn, float *lse_out,
              guint64 lse_stride)
{
  guint64 kend = q0 + qn;
  for (guint64 i = 0; i < qn; i++)
    {
      float *s = S + i * kend;
      guint64 nk = q0 + i + 1;
      float m = s[0];
#pragma omp simd reduction(max : m)
      for (guint64 j = 0; j < nk; j++)
        m = s[j] > m ? s[j] : m;
      float l = 0;
#pragma omp simd reduction(+ : l)
      for (guint64 j = 0; j < nk; j++)
        {
          float p = stow_llama_expf (s[j] - m);
          s[j] = p;
          l += p;
        }
      float inv = 1.0f / l;
#pragma omp simd
      for (guint64 j = 0; j < nk; j++)
        s[j] *= inv;
      memset (s + nk, 0, (kend - nk) * sizeof (float));
      lse_out[i * lse_stride] = m + logf (l);
    }
}

void
stow_llama_attention_forward (StowLlama *L, guint64 batch, guint64 seq,
                              const void *q, const void *k, const void *v,
                              void *o, float *lse)
{
  const StowLlamaConfig *c = &L->config;
  guint64 a = c->n_heads, kv = c->n_kv_heads, d = c->head_dim, T = seq;
  guint64 group = a / kv, BQ = STOW_LLAMA_ATTN_BQ;
  float scale = 1.0f / sqrtf ((float)d);
  guint64 items = batch * a;

  /* Each (sequence, query head) is one thread's, with single-threaded
   * products inside; handed out dynamically (llama-kernels.c says why). */
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
    float *Q = ws, *K = Q + T * d, *V = K + T * d, *O = V + T * d;
    float *S = O + MIN (BQ, T) * d;
#pragma omp for schedule(dynamic)
    for (guint64 it = 0; it < items; it++)
      {
        guint64 b = it / a, j = it % a, g = j / group, r0 = b * T;
        load_head (L, q, a * d, r0, T, j * d, d, Q);
        load_head (L, k, kv * d, r0, T, g * d, d, K);
        load_head (L, v, kv * d, r0, T, g * d, d, V);
        for (guint64 q0 = 0; q0 < T; q0 += BQ)
          {
            guint64 qn = MIN (BQ, T - q0), kend = q0 + qn;
            scores (Q, K, q0, qn, d, scale, S);
            softmax_rows (S, q0, qn, lse + (r0 + q0) * a + j, a);
            /* O (qn, d) = P (qn, kend) V (kend, d) */
            stow_gemm_f32 (FALSE, FALSE, qn, d, kend, 1.0f, S, kend, V, d, 0.0f,
                           O, d);
            store_head (L, O, qn, d, o, a * d, r0 + q0, j * d);
          }
      }
  }
}

void
stow_llama_attention_backward (StowLlama *L, guint64 batch, guint64 seq,
                               const void *q, const void *k, const void *v,
                               const void *o, const float *lse,
                               const void *dout, void *dq, void *dk, void *dv)
{
  const StowLlamaConfig *c = &L->config;
  guint64 a = c->n_heads, kv = c->n_kv_heads, d = c->head_dim, T = seq;
  guint64 group = a / kv, BQ = STOW_LLAMA_ATTN_BQ, bq = MIN (BQ, T);
  float scale = 1.0f / sqrtf ((float)d);
  /* One thread owns a (sequence, kv head) and its whole query group, so
   * dK and dV sum the group's heads in head order with no sharing. */
  guint64 items = batch * kv;

#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
    float *K = ws, *V = K + T * d, *dK = V + T * d, *dV = dK + T * d;
    float *Q = dV + T * d, *dO = Q + T * d, *dQ = dO + T * d;
    float *D = dQ + T * d, *P = D + T, *dP = P + bq * T;
#pragma omp for schedule(dynamic)
    for (guint64 it = 0; it < items; it++)
      {
        guint64 b = it / kv, g = it % kv, r0 = b * T;
        load_head (L, k, kv * d, r0, T, g * d, d, K);
        load_head (L, v, kv * d, r0, T, g * d, d, V);
        memset (dK, 0, T * d * sizeof (float));
        memset (dV, 0, T * d * sizeof (float));
        for (guint64 j = g * group; j < (g + 1) * group; j++)
          {
            load_head (L, q, a * d, r0, T, j * d, d, Q);
            load_head (L, dout, a * d, r0, T, j * d, d, dO);
            /* D_i = rowsum (dO_i * O_i); O is read a row at a time into
             * dQ, which is free until the first block writes it. */
            load_head (L, o, a * d, r0, T, j * d, d, dQ);
            for (guint64 t = 0; t < T; t++)
              {
                float s = 0;
#pragma omp simd reduction(+ : s)
                for (guint64 x = 0; x < d; x++)
                  s += dO[t * d + x] * dQ[t * d + x];
                D[t] = s;
              }
            for (guint64 q0 = 0; q0 < T; q0 += BQ)
              {
                guint64 qn = MIN (BQ, T - q0), kend = q0 + qn;
                scores (Q, K, q0, qn, d, scale, P);
                /* dP (qn, kend) = dO V^T */
                stow_gemm_f32 (FALSE, TRUE, qn, kend, d, 1.0f, dO + q0 * d, d,
                               V, d, 0.0f, dP, kend);
                for (guint64 i = 0; i < qn; i++)
                  {
                    float *p = P + i * kend, *dp = dP + i * kend;
                    guint64 nk = q0 + i + 1;
                    float l = lse[(r0 + q0 + i) * a + j], Di = D[q0 + i];
                    /* P = exp (S - lse); dS = P (dP - D). */
#pragma omp simd
                    for (guint64 x = 0; x < nk; x++)
                      {
                        float pv = stow_llama_expf (p[x] - l);
                        p[x] = pv;
                        dp[x] = pv * (dp[x] - Di);
                      }
                    memset (p + nk, 0, (kend - nk) * sizeof (float));
                    memset (dp + nk, 0, (kend - nk) * sizeof (float));
                  }
                /* dQ (qn, d) = scale dS K;  dK (kend, d) += scale dS^T Q;
                 * dV (kend, d) += P^T dO. */
                stow_gemm_f32 (FALSE, FALSE, qn, d, kend, scale, dP, kend, K, d,
                               0.0f, dQ + q0 * d, d);
                stow_gemm_f32 (TRUE, FALSE, kend, d, qn, scale, dP, kend,
                               Q + q0 * d, d, 1.0f, dK, d);
                stow_gemm_f32 (TRUE, FALSE, kend, d, qn, 1.0f, P, kend,
                               dO + q0 * d, d, 1.0f, dV, d);
              }
            store_head (L, dQ, T, d, dq, a * d, r0, j * d);
          }
        store_head (L, dK, T, d, dk, kv * d, r0, g * d);
        store_head (L, dV, T, d, dv, kv * d, r0, g * d);
      }
  }
}
