/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/attention.cu: causal grouped-query attention on
 * the GPU, forward and backward, flash-style in what it keeps (o and the
 * fp32 logsumexp of each (token, head); the backward recomputes the
 * probabilities).  Deliberately simple: fp32 arithmetic on tiles of B
 * queries and B keys in shared memory, one thread block per tile of
 * output, every sum in a fixed order, no atomics: the fp32 runtime's
 * kernels (the oracle), and the bf16 runtime's where the tensor-core path
 * (attention-tc.cu) does not take the shape.  Not here: the projections
 * and rotary (llama-cuda.cu).
 */
#include <cmath>

#include "executor/backends/cuda/llama-cuda-private.h"

#define ATTN_THREADS 256

/* Floats of shared memory per kernel at head_dim @d and tile @B: tiles
 * that dot products read along d are padded to d + 1 floats per row, so
 * a warp's 32 rows fall in 32 different banks. */
static guint64
fwd_floats (guint64 d, guint64 B)
{
  return 3 * B * (d + 1) + B * d + B * B + 3 * B;
}

static guint64
dq_floats (guint64 d, guint64 B)
{
  return 4 * B * (d + 1) + B * d + B * B + 2 * B;
}

static guint64
dkv_floats (guint64 d, guint64 B)
{
  return 4 * B * (d + 1) + 2 * B * d + 2 * B * B + 2 * B;
}

/* Loads rows [r0, r0 + rows) of head column @col (width d) of p (ld
 * elements per row) into dst (rows, ds) fp32. */
template <bool BF>
static __device__ void
load_tile (const void *p, guint64 ld, guint64 r0, guint64 rows, guint64 col,
           guint64 d, float *dst, guint64 ds)
{
  for (guint64 idx = threadIdx.x; idx < rows * d; idx += blockDim.x)
    {
      guint64 t = idx / d, c = idx % d;
      dst[t * ds + c] = ld_el<BF> (p, (r0 + t) * ld + col + c);
    }
}

/* One block per (query tile, query head, sequence): the online softmax
 * over key tiles 0 .. the tile's last query, O and the row max and sum
 * kept in shared memory; o = O / l, lse = m + log l at the end. */
template <bool BF>
static __global__ void
attn_forward_kernel (guint64 T, guint64 a, guint64 kv, guint64 d, guint64 B,
                     float scale, const void *q, const void *k, const void *v,
                     void *o, float *lse)
{
  extern __shared__ float smem[];
  guint64 ds = d + 1;
  float *Q = smem, *K = Q + B * ds, *V = K + B * ds, *O = V + B * ds;
  float *S = O + B * d, *mrow = S + B * B, *lrow = mrow + B;
  float *alpha = lrow + B;
  guint64 b = blockIdx.z, j = blockIdx.y, q0 = (guint64)blockIdx.x * B;
  guint64 g = j / (a / kv), r0 = b * T, qn = MIN (B, T - q0);
  guint64 ldq = a * d, ldk = kv * d;
  unsigned tid = threadIdx.x;

  load_tile<BF> (q, ldq, r0 + q0, qn, j * d, d, Q, ds);
  for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
    O[idx] = 0;
  if (tid < qn)
    {
      mrow[tid] = -INFINITY;
      lrow[tid] = 0;
    }
  __syncthreads ();
  guint64 kend = q0 + qn;
  for (guint64 k0 = 0; k0 < kend; k0 += B)
    {
      guint64 kn = MIN (B, kend - k0);
      load_tile<BF> (k, ldk, r0 + k0, kn, g * d, d, K, ds);
      load_tile<BF> (v, ldk, r0 + k0, kn, g * d, d, V, ds);
      __syncthreads ();
      /* S (qn, kn) = scale Q K^T; a key after the query is masked. */
      for (guint64 idx = tid; idx < qn * kn; idx += blockDim.x)
        {
          guint64 qi = idx / kn, ki = idx % kn;
          float s = -INFINITY;
          if (k0 + ki <= q0 + qi)
            {
              float dot = 0;
              for (guint64 c = 0; c < d; c++)
                dot += Q[qi * ds + c] * K[ki * ds + c];
              s = dot * scale;
            }
          S[qi * B + ki] = s;
        }
      __syncthreads ();
      /* Per query: the new max, the rescaling of what came before, the
       * probabilities (relative to the new max) and their sum. */
      if (tid < qn)
        {
          guint64 qi = tid;
          float m_old = mrow[qi], m = m_old;
          for (guint64 ki = 0; ki < kn; ki++)
            if (k0 + ki <= q0 + qi)
              m = S[qi * B + ki] > m ? S[qi * B + ki] : m;
          float al = 1.0f, sum = 0;
          if (m == -INFINITY) /* no key yet: cannot happen past tile 0 */
            for (guint64 ki = 0; ki < kn; ki++)
              S[qi * B + ki] = 0;
          else
            {
              al = m_old == -INFINITY ? 0.0f : stow_llama_expf (m_old - m);
              for (guint64 ki = 0; ki < kn; ki++)
                {
                  float p = k0 + ki <= q0 + qi
                                ? stow_llama_expf (S[qi * B + ki] - m)
                                : 0.0f;
                  S[qi * B + ki] = p;
                  sum += p;
                }
            }
          lrow[qi] = lrow[qi] * al + sum;
          mrow[qi] = m;
          alpha[qi] = al;
        }
      __syncthreads ();
      /* O = alpha O + P V */
      for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
        {
          guint64 qi = idx / d, c = idx % d;
          float acc = O[idx] * alpha[qi];
          for (guint64 ki = 0; ki < kn; ki++)
            acc += S[qi * B + ki] * V[ki * ds + c];
          O[idx] = acc;
        }
      __syncthreads ();
    }
  for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
    {
      guint64 qi = idx / d, c = idx % d;
      st_el<BF> (o, (r0 + q0 + qi) * ldq + j * d + c, O[idx] / lrow[qi]);
    }
  if (tid < qn)
    lse[(r0 + q0 + tid) * a + j] = mrow[tid] + logf (lrow[tid]);
}

/* D (n, a) = rowsum (dO * O) per (token, head), one thread each, in
 * order over d. */
template <bool BF>
static __global__ void
attn_delta_kernel (guint64 n, guint64 a, guint64 d, const void *dout,
                   const void *o, float *D)
{
  guint64 total = n * a;
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (guint64)gridDim.x * blockDim.x)
    {
      float s = 0;
      for (guint64 c = 0; c < d; c++)
        s += ld_el<BF> (dout, i * d + c) * ld_el<BF> (o, i * d + c);
      D[i] = s;
    }
}

/* One block per (query tile, query head, sequence): dQ = scale sum over
 * key tiles of dS K, dS = P (dP - D), P = exp (S - lse), dP = dO V^T. */
template <bool BF>
static __global__ void
attn_dq_kernel (guint64 T, guint64 a, guint64 kv, guint64 d, guint64 B,
                float scale, const void *q, const void *k, const void *v,
                const float *lse, const float *D, const void *dout, void *dq)
{
  extern __shared__ float smem[];
  guint64 ds = d + 1;
  float *Q = smem, *dO = Q + B * ds, *K = dO + B * ds, *V = K + B * ds;
  float *dQ = V + B * ds, *dS = dQ + B * d, *lseT = dS + B * B;
  float *DT = lseT + B;
  guint64 b = blockIdx.z, j = blockIdx.y, q0 = (guint64)blockIdx.x * B;
  guint64 g = j / (a / kv), r0 = b * T, qn = MIN (B, T - q0);
  guint64 ldq = a * d, ldk = kv * d;
  unsigned tid = threadIdx.x;

  load_tile<BF> (q, ldq, r0 + q0, qn, j * d, d, Q, ds);
  load_tile<BF> (dout, ldq, r0 + q0, qn, j * d, d, dO, ds);
  for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
    dQ[idx] = 0;
  if (tid < qn)
    {
      lseT[tid] = lse[(r0 + q0 + tid) * a + j];
      DT[tid] = D[(r0 + q0 + tid) * a + j];
    }
  __syncthreads ();
  guint64 kend = q0 + qn;
  for (guint64 k0 = 0; k0 < kend; k0 += B)
    {
      guint64 kn = MIN (B, kend - k0);
      load_tile<BF> (k, ldk, r0 + k0, kn, g * d, d, K, ds);
      load_tile<BF> (v, ldk, r0 + k0, kn, g * d, d, V, ds);
      __syncthreads ();
      for (guint64 idx = tid; idx < qn * kn; idx += blockDim.x)
        {
          guint64 qi = idx / kn, ki = idx % kn;
          float r = 0;
          if (k0 + ki <= q0 + qi)
            {
              float s = 0, dp = 0;
              for (guint64 c = 0; c < d; c++)
                {
                  s += Q[qi * ds + c] * K[ki * ds + c];
                  dp += dO[qi * ds + c] * V[ki * ds + c];
                }
              float p = stow_llama_expf (s * scale - lseT[qi]);
              r = p * (dp - DT[qi]);
            }
          dS[qi * B + ki] = r;
        }
      __syncthreads ();
      for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
        {
          guint64 qi = idx / d, c = idx % d;
          float acc = dQ[idx];
          for (guint64 ki = 0; ki < kn; ki++)
            acc += dS[qi * B + ki] * K[ki * ds + c];
          dQ[idx] = acc;
        }
      __syncthreads ();
    }
  for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
    {
      guint64 qi = idx / d, c = idx % d;
      st_el<BF> (dq, (r0 + q0 + qi) * ldq + j * d + c, scale * dQ[idx]);
    }
}

/* One block per (key tile, kv head, sequence): dK = scale sum of dS^T Q
 * and dV = sum of P^T dO over the group's query heads in head order, then
 * over the query tiles from the key tile's own on (causal), in order. */
template <bool BF>
static __global__ void
attn_dkv_kernel (guint64 T, guint64 a, guint64 kv, guint64 d, guint64 B,
                 float scale, const void *q, const void *k, const void *v,
                 const float *lse, const float *D, const void *dout, void *dk,
                 void *dv)
{
  extern __shared__ float smem[];
  guint64 ds = d + 1;
  float *K = smem, *V = K + B * ds, *Q = V + B * ds, *dO = Q + B * ds;
  float *dK = dO + B * ds, *dV = dK + B * d, *P = dV + B * d;
  float *dS = P + B * B, *lseT = dS + B * B, *DT = lseT + B;
  guint64 b = blockIdx.z, g = blockIdx.y, k0 = (guint64)blockIdx.x * B;
  guint64 group = a / kv, r0 = b * T, kn = MIN (B, T - k0);
  guint64 ldq = a * d, ldk = kv * d;
  unsigned tid = threadIdx.x;

  load_tile<BF> (k, ldk, r0 + k0, kn, g * d, d, K, ds);
  load_tile<BF> (v, ldk, r0 + k0, kn, g * d, d, V, ds);
  for (guint64 idx = tid; idx < kn * d; idx += blockDim.x)
    {
      dK[idx] = 0;
      dV[idx] = 0;
    }
  __syncthreads ();
  for (guint64 j = g * group; j < (g + 1) * group; j++)
    for (guint64 q0 = k0; q0 < T; q0 += B)
      {
        guint64 qn = MIN (B, T - q0);
        load_tile<BF> (q, ldq, r0 + q0, qn, j * d, d, Q, ds);
        load_tile<BF> (dout, ldq, r0 + q0, qn, j * d, d, dO, ds);
        if (tid < qn)
          {
            lseT[tid] = lse[(r0 + q0 + tid) * a + j];
            DT[tid] = D[(r0 + q0 + tid) * a + j];
          }
        __syncthreads ();
        for (guint64 idx = tid; idx < qn * kn; idx += blockDim.x)
          {
            guint64 qi = idx / kn, ki = idx % kn;
            float p = 0, r = 0;
            if (k0 + ki <= q0 + qi)
              {
                float s = 0, dp = 0;
                for (guint64 c = 0; c < d; c++)
                  {
                    s += Q[qi * ds + c] * K[ki * ds + c];
                    dp += dO[qi * ds + c] * V[ki * ds + c];
                  }
                p = stow_llama_expf (s * scale - lseT[qi]);
                r = p * (dp - DT[qi]);
              }
            P[qi * B + ki] = p;
            dS[qi * B + ki] = r;
          }
        __syncthreads ();
        for (guint64 idx = tid; idx < kn * d; idx += blockDim.x)
          {
            guint64 ki = idx / d, c = idx % d;
            float av = dV[idx], ak = dK[idx];
            for (guint64 qi = 0; qi < qn; qi++)
              {
                av += P[qi * B + ki] * dO[qi * ds + c];
                ak += dS[qi * B + ki] * Q[qi * ds + c];
              }
            dV[idx] = av;
            dK[idx] = ak;
          }
        __syncthreads ();
      }
  for (guint64 idx = tid; idx < kn * d; idx += blockDim.x)
    {
      guint64 ki = idx / d, c = idx % d;
      st_el<BF> (dk, (r0 + k0 + ki) * ldk + g * d + c, scale * dK[idx]);
      st_el<BF> (dv, (r0 + k0 + ki) * ldk + g * d + c, dV[idx]);
    }
}

gboolean
stow_cuda_attention_init (StowLlamaCuda *L)
{
  if (!stow_llama_cuda_layout_ok (L))
    return FALSE;
  guint64 d = L->config.head_dim, B = (guint64)L->attn_tile;
  /* Both instantiations: a runtime uses one, the attributes are per
   * kernel. */
  gboolean ok = stow_cuda_smem_opt_in (L, attn_forward_kernel<false>,
                                       fwd_floats (d, B) * sizeof (float),
                                       "attention forward: shared memory")
                && stow_cuda_smem_opt_in (L, attn_forward_kernel<true>,
                                          fwd_floats (d, B) * sizeof (float),
                                          "attention forward: shared memory")
                && stow_cuda_smem_opt_in (L, attn_dq_kernel<false>,
                                          dq_floats (d, B) * sizeof (float),
                                          "attention dq: shared memory")
                && stow_cuda_smem_opt_in (L, attn_dq_kernel<true>,
                                          dq_floats (d, B) * sizeof (float),
                                          "attention dq: shared memory")
                && stow_cuda_smem_opt_in (L, attn_dkv_kernel<false>,
                                          dkv_floats (d, B) * sizeof (float),
                                          "attention dk/dv: shared memory")
                && stow_cuda_smem_opt_in (L, attn_dkv_kernel<true>,
                                          dkv_floats (d, B) * sizeof (float),
                                          "attention dk/dv: shared memory");
  return ok && stow_cuda_attention_tc_init (L);
}

static bool
use_tc (const StowLlamaCuda *L)
{
  return L->attn_tc && !L->attn_tc_off;
}

gboolean
stow_llama_cuda_attention_use_tc (StowLlamaCuda *L, gboolean enable)
{
  g_return_val_if_fail (L != NULL, FALSE);
  L->attn_tc_off = !enable;
  return use_tc (L);
}

void
stow_llama_cuda_attention_forward (StowLlamaCuda *L, guint64 batch,
                                   guint64 seq, const void *q, const void *k,
                                   const void *v, void *o, float *lse)
{
  g_return_if_fail (L != NULL);
  g_return_if_fail (batch * seq <= L->max_tokens && seq <= L->max_seq);
  stow_cuda_attention_forward (L, batch, seq, q, k, v, o, lse);
}

void
stow_llama_cuda_attention_backward (StowLlamaCuda *L, guint64 batch,
                                    guint64 seq, const void *q, const void *k,
                                    const void *v, const void *o,
                                    const float *lse, const void *dout,
                                    void *dq, void *dk, void *dv)
{
  g_return_if_fail (L != NULL);
  g_return_if_fail (batch * seq <= L->max_tokens && seq <= L->max_seq);
  stow_cuda_attention_backward (L, batch, seq, q, k, v, o, lse, dout, dq, dk,
                                dv);
}

void
stow_cuda_attention_forward (StowLlamaCuda *L, guint64 batch, guint64 seq,
                             const void *q, const void *k, const void *v,
                             void *o, float *lse)
{
  if (L->error != NULL)
    return;
  if (use_tc (L))
    {
      stow_cuda_attention_tc_forward (L, batch, seq, q, k, v, o, lse);
      return;
    }
  const StowLlamaConfig *c = &L->config;
  guint64 d = c->head_dim, B = (guint64)L->attn_tile;
  float scale = 1.0f / sqrtf ((float)d);
  dim3 grid ((unsigned)((seq + B - 1) / B), (unsigned)c->n_heads,
             (unsigned)batch);
  size_t smem = fwd_floats (d, B) * sizeof (float);
  DISPATCH_BF (L->bf16, attn_forward_kernel<BF>
               <<<grid, ATTN_THREADS, smem, L->stream>>> (
                   seq, c->n_heads, c->n_kv_heads, d, B, scale, q, k, v, o,
                   lse));
  stow_llama_cuda_launched (L, "attention forward");
}

void
stow_cuda_attention_backward (StowLlamaCuda *L, guint64 batch, guint64 seq,
                              const void *q, const void *k, const void *v,
                              const void *o, const float *lse,
                              const void *dout, void *dq, void *dk, void *dv)
{
  if (L->error != NULL)
    return;
  const StowLlamaConfig *c = &L->config;
  guint64 d = c->head_dim, B = (guint64)L->attn_tile, a = c->n_heads;
  guint64 n = batch * seq;
  float scale = 1.0f / sqrtf ((float)d);
  float *D = L->attn_delta;
  guint64 total = n * a;
  unsigned blocks = (unsigned)MAX (1, MIN ((total + 255) / 256, 1 << 16));
  DISPATCH_BF (L->bf16, attn_delta_kernel<BF>
               <<<blocks, 256, 0, L->stream>>> (n, a, d, dout, o, D));
  stow_llama_cuda_launched (L, "attention backward: D");
  if (use_tc (L))
    {
      stow_cuda_attention_tc_backward (L, batch, seq, q, k, v, lse, D, dout,
                                       dq, dk, dv);
      return;
    }
  dim3 gq ((unsigned)((seq + B - 1) / B), (unsigned)a, (unsigned)batch);
  DISPATCH_BF (L->bf16, attn_dq_kernel<BF>
               <<<gq, ATTN_THREADS, dq_floats (d, B) * sizeof (float),
                  L->stream>>> (seq, a, c->n_kv_heads, d, B, scale, q, k, v,
                                lse, D, dout, dq));
  stow_llama_cuda_launched (L, "attention backward: dq");
  dim3 gk ((unsigned)((seq + B - 1) / B), (unsigned)c->n_kv_heads,
           (unsigned)batch);
  DISPATCH_BF (L->bf16, attn_dkv_kernel<BF>
               <<<gk, ATTN_THREADS, dkv_floats (d, B) * sizeof (float),
                  L->stream>>> (seq, a, c->n_kv_heads, d, B, scale, q, k, v,
                                lse, D, dout, dk, dv));
  stow_llama_cuda_launched (L, "attention backward: dk, dv");
}
