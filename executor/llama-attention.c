/* SPDX-License-Identifier: MIT
 *
 * executor/llama-attention.c: causal grouped-query attention, forward and
 * backward, flash-style in what it keeps: the forward leaves o and the
 * fp32 logsumexp of each (token, head); the backward recomputes the
 * probabilities from q, k and the logsumexp.  Scores exist only as one
 * thread's (BQ, T) tile at a time.  At bf16, where the GEMM kernel
 * multiplies bf16 (L->attn_lowp), the products take q, k, v and dO as they
 * are stored and P and dS rounded to bf16, as FlashAttention's bf16
 * kernels and the cuda runtime's attention-mma.cu do; the softmax, the
 * log-sum-exp, D and every sum stay fp32.  Not here: the projections and
 * rotary.
 */
#include "executor/llama-private.h"

#include <omp.h>

/* One thread's workspace, in floats from its start, each region in whole
 * cache lines: the forward's Q, K, V (T, d) in the products' type, O (BQ,
 * d), S (BQ, T) and, at bf16 products, P rounded (BQ, T); the backward's
 * K, V, Q, dO in the products' type, dK, dV, dQ (T, d), D (T), S/P and dP
 * (BQ, T) and, at bf16 products, P and dS rounded.  The sizing and the
 * kernels read the same offsets. */
typedef struct
{
  guint64 q, k, v, o, s, pl, end;
} FwdLayout;

typedef struct
{
  guint64 k, v, q, dout, dk, dv, dq, d, p, dp, pl, dsl, end;
} BwdLayout;

/* @at's region of @n elements of @esize bytes: its offset, and @at moved
 * past it. */
static guint64
take (guint64 *at, guint64 n, guint64 esize)
{
  guint64 o = *at;
  *at += (n * esize + 63) / 64 * 16;
  return o;
}

static FwdLayout
fwd_layout (guint64 T, guint64 d, gboolean lowp)
{
  guint64 bq = MIN ((guint64)STOW_LLAMA_ATTN_BQ, T), e = lowp ? 2 : 4, at = 0;
  FwdLayout w;
  w.q = take (&at, T * d, e), w.k = take (&at, T * d, e);
  w.v = take (&at, T * d, e), w.o = take (&at, bq * d, 4);
  w.s = take (&at, bq * T, 4), w.pl = take (&at, lowp ? bq * T : 0, 2);
  w.end = at;
  return w;
}

static BwdLayout
bwd_layout (guint64 T, guint64 d, gboolean lowp)
{
  guint64 bq = MIN ((guint64)STOW_LLAMA_ATTN_BQ, T), e = lowp ? 2 : 4, at = 0;
  BwdLayout w;
  w.k = take (&at, T * d, e), w.v = take (&at, T * d, e);
  w.q = take (&at, T * d, e), w.dout = take (&at, T * d, e);
  w.dk = take (&at, T * d, 4), w.dv = take (&at, T * d, 4);
  w.dq = take (&at, T * d, 4), w.d = take (&at, T, 4);
  w.p = take (&at, bq * T, 4), w.dp = take (&at, bq * T, 4);
  w.pl = take (&at, lowp ? bq * T : 0, 2);
  w.dsl = take (&at, lowp ? bq * T : 0, 2);
  w.end = at;
  return w;
}

guint64
stow_llama_attention_thread_floats (guint64 max_seq, guint64 head_dim,
                                    gboolean lowp)
{
  return MAX (fwd_layout (max_seq, head_dim, lowp).end,
              bwd_layout (max_seq, head_dim, lowp).end);
}

/* Head @col (width d) of rows [r0, r0 + T) of p (rows of @ld elements) to
 * dst (T, d) fp32. */
static void
load_head_f32 (const StowLlama *L, const void *p, guint64 ld, guint64 r0,
               guint64 T, guint64 col, guint64 d, float *dst)
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

/* The same in the products' type: as stored at bf16 with L->attn_lowp. */
static void
load_head (const StowLlama *L, const void *p, guint64 ld, guint64 r0, guint64 T,
           guint64 col, guint64 d, void *dst)
{
  if (!L->attn_lowp)
    {
      load_head_f32 (L, p, ld, r0, T, col, d, dst);
      return;
    }
  for (guint64 t = 0; t < T; t++)
    memcpy ((guint16 *)dst + t * d, (const guint16 *)p + (r0 + t) * ld + col,
            d * sizeof (guint16));
}

/* Element @i of a head in the products' type, in fp32. */
static inline float
head_at (const StowLlama *L, const void *h, guint64 i)
{
  return L->attn_lowp ? stow_bf16_to_f32 (((const guint16 *)h)[i])
                      : ((const float *)h)[i];
}

/* C (M, N) = alpha op(A) op(B) + beta C, A and B heads or tiles of the
 * products' type, one thread's kernel call. */
static void
product (const StowLlama *L, gboolean ta, gboolean tb, guint64 M, guint64 N,
         guint64 K, float alpha, const void *A, guint64 lda, const void *B,
         guint64 ldb, float beta, float *C, guint64 ldc)
{
  if (L->attn_lowp)
    stow_gemm_bf16 (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    stow_gemm_f32 (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
 * = scale Q K^T, one thread's product. */
static void
scores (const StowLlama *L, const void *Q, const void *K, guint64 q0,
        guint64 qn, guint64 d, float scale, float *S)
{
  guint64 kend = q0 + qn, e = L->attn_lowp ? 2 : 4;
  product (L, FALSE, TRUE, qn, kend, d, scale, (const guint8 *)Q + q0 * d * e,
           d, K, d, 0.0f, S, kend);
}

/* The row's probabilities s[j] inv for j < n and zeros up to @width:
 * over s in fp32, or rounded into @low (bf16 products; s is not read
 * again). */
STOW_LLAMA_VEC static void
row_probabilities (float *s, guint64 n, guint64 width, float inv, guint16 *low)
{
  if (low == NULL)
    {
      stow_llama_row_scale (s, n, inv);
      memset (s + n, 0, (width - n) * sizeof (float));
      return;
    }
#pragma omp simd
  for (guint64 j = 0; j < n; j++)
    low[j] = stow_f32_to_bf16 (s[j] * inv);
  memset (low + n, 0, (width - n) * sizeof (guint16));
}

/* Query t sees keys 0..t: the rest of its row of P is zero.  P (qn,
 * kend) over S, or rounded into @Pl when it is not NULL. */
static void
softmax_rows (float *S, guint16 *Pl, guint64 q0, guint64 qn, float *lse_out,
              guint64 lse_stride)
{
  guint64 kend = q0 + qn;
  for (guint64 i = 0; i < qn; i++)
    {
      float *s = S + i * kend;
      guint64 nk = q0 + i + 1;
      float m = stow_llama_row_max (s, nk);
      stow_llama_row_exp (s, nk, m);
      float l = stow_llama_row_sum (s, nk);
      row_probabilities (s, nk, kend, 1.0f / l, Pl ? Pl + i * kend : NULL);
      lse_out[i * lse_stride] = m + logf (l);
    }
}

/* stow_llama_row_ds's loops, built at each width below. */
static inline __attribute__ ((always_inline)) void
row_ds (float *p, float *dp, guint64 nk, guint64 width, float lse, float Di,
        guint16 *pl, guint16 *dsl)
{
  if (pl == NULL)
    {
#pragma omp simd
      for (guint64 x = 0; x < nk; x++)
        {
          float pv = stow_llama_expf (p[x] - lse);
          p[x] = pv;
          dp[x] = pv * (dp[x] - Di);
        }
      memset (p + nk, 0, (width - nk) * sizeof (float));
      memset (dp + nk, 0, (width - nk) * sizeof (float));
      return;
    }
#pragma omp simd
  for (guint64 x = 0; x < nk; x++)
    {
      float pv = stow_llama_expf (p[x] - lse);
      pl[x] = stow_f32_to_bf16 (pv);
      dsl[x] = stow_f32_to_bf16 (pv * (dp[x] - Di));
    }
  memset (pl + nk, 0, (width - nk) * sizeof (guint16));
  memset (dsl + nk, 0, (width - nk) * sizeof (guint16));
}

void STOW_LLAMA_VEC
stow_llama_row_ds_vec (float *p, float *dp, guint64 nk, guint64 width,
                       float lse, float Di, guint16 *pl, guint16 *dsl)
{
  row_ds (p, dp, nk, width, lse, Di, pl, dsl);
}

/* 16 lanes: attention 0.075-0.079 -> 0.065 s of a bf16 step of the bench
 * model in 3 alternating runs (the avx512f clone ran 8; fp32 no change). */
STOW_LLAMA_ZMM static void
row_ds_zmm (float *p, float *dp, guint64 nk, guint64 width, float lse, float Di,
            guint16 *pl, guint16 *dsl)
{
  row_ds (p, dp, nk, width, lse, Di, pl, dsl);
}

void
stow_llama_row_ds (float *p, float *dp, guint64 nk, guint64 width, float lse,
                   float Di, guint16 *pl, guint16 *dsl)
{
  if (__builtin_cpu_supports ("avx512bw") && __builtin_cpu_supports ("avx512dq")
      && __builtin_cpu_supports ("avx512vl"))
    row_ds_zmm (p, dp, nk, width, lse, Di, pl, dsl);
  else
    stow_llama_row_ds_vec (p, dp, nk, width, lse, Di, pl, dsl);
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
    FwdLayout w = fwd_layout (T, d, L->attn_lowp);
    void *Q = ws + w.q, *K = ws + w.k, *V = ws + w.v;
    float *O = ws + w.o, *S = ws + w.s;
    guint16 *Pl = (guint16 *)(ws + w.pl);
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
            scores (L, Q, K, q0, qn, d, scale, S);
            softmax_rows (S, L->attn_lowp ? Pl : NULL, q0, qn,
                          lse + (r0 + q0) * a + j, a);
            /* O (qn, d) = P (qn, kend) V (kend, d) */
            product (L, FALSE, FALSE, qn, d, kend, 1.0f,
                     L->attn_lowp ? (const void *)Pl : S, kend, V, d, 0.0f, O,
                     d);
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
  guint64 group = a / kv, BQ = STOW_LLAMA_ATTN_BQ;
  float scale = 1.0f / sqrtf ((float)d);
  /* One thread owns a (sequence, kv head) and its whole query group, so
   * dK and dV sum the group's heads in head order with no sharing. */
  guint64 items = batch * kv;

#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
    BwdLayout w = bwd_layout (T, d, L->attn_lowp);
    guint64 e = L->attn_lowp ? 2 : 4;
    void *K = ws + w.k, *V = ws + w.v, *Q = ws + w.q, *dO = ws + w.dout;
    float *dK = ws + w.dk, *dV = ws + w.dv, *dQ = ws + w.dq, *D = ws + w.d;
    float *P = ws + w.p, *dP = ws + w.dp;
    guint16 *Pl = (guint16 *)(ws + w.pl), *dSl = (guint16 *)(ws + w.dsl);
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
            /* D_i = rowsum (dO_i * O_i); O is read in fp32 into dQ, which
             * is free until the first block writes it. */
            load_head_f32 (L, o, a * d, r0, T, j * d, d, dQ);
            for (guint64 t = 0; t < T; t++)
              {
                float s = 0;
#pragma omp simd reduction(+ : s)
                for (guint64 x = 0; x < d; x++)
                  s += head_at (L, dO, t * d + x) * dQ[t * d + x];
                D[t] = s;
              }
            for (guint64 q0 = 0; q0 < T; q0 += BQ)
              {
                guint64 qn = MIN (BQ, T - q0), kend = q0 + qn;
                scores (L, Q, K, q0, qn, d, scale, P);
                /* dP (qn, kend) = dO V^T */
                product (L, FALSE, TRUE, qn, kend, d, 1.0f,
                         (const guint8 *)dO + q0 * d * e, d, V, d, 0.0f, dP,
                         kend);
                for (guint64 i = 0; i < qn; i++)
                  stow_llama_row_ds (P + i * kend, dP + i * kend, q0 + i + 1,
                                     kend, lse[(r0 + q0 + i) * a + j],
                                     D[q0 + i],
                                     L->attn_lowp ? Pl + i * kend : NULL,
                                     L->attn_lowp ? dSl + i * kend : NULL);
                /* dQ (qn, d) = scale dS K;  dK (kend, d) += scale dS^T Q;
                 * dV (kend, d) += P^T dO. */
                const void *dS = L->attn_lowp ? (const void *)dSl : dP;
                const void *Pp = L->attn_lowp ? (const void *)Pl : P;
                product (L, FALSE, FALSE, qn, d, kend, scale, dS, kend, K, d,
                         0.0f, dQ + q0 * d, d);
                product (L, TRUE, FALSE, kend, d, qn, scale, dS, kend,
                         (const guint8 *)Q + q0 * d * e, d, 1.0f, dK, d);
                product (L, TRUE, FALSE, kend, d, qn, 1.0f, Pp, kend,
                         (const guint8 *)dO + q0 * d * e, d, 1.0f, dV, d);
              }
            store_head (L, dQ, T, d, dq, a * d, r0, j * d);
          }
        store_head (L, dK, T, d, dk, kv * d, r0, g * d);
        store_head (L, dV, T, d, dv, kv * d, r0, g * d);
      }
  }
}
