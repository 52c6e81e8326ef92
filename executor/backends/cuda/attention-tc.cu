/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/attention-tc.cu: the bf16 runtime's causal
 * grouped-query attention on tensor cores (WMMA, 16x16x16 bf16 fragments,
 * fp32 accumulation), flash-attention-2 style: the forward's online
 * softmax over key tiles, a dK/dV kernel over the query tiles and the
 * GQA group's heads in a fixed order, a dQ kernel over the key tiles; no
 * atomics, so every run gives the same bits.  The same tensors, layouts
 * and overwrite semantics as attention.cu's fp32 kernels, which remain the
 * oracle (fp32 runs) and the fallback (shapes this file does not take).
 */
#include <cmath>
#include <type_traits>

#include <cuda_bf16.h>
#include <mma.h>

#include "executor/backends/cuda/llama-cuda-private.h"

using namespace nvcuda;

#define TC_THREADS 256
#define TC_WARPS (TC_THREADS / 32)

/* Shared-memory row strides: bf16 rows of d + 8 elements, fp32 rows of
 * n + 4 (WMMA wants multiples of 16 bytes; the pad moves consecutive rows
 * to other banks).  Every buffer starts on 128 bytes, every fragment's
 * origin then sits on 32 bytes as load_matrix_sync requires (16 rows of
 * a multiple of 16 bytes, columns at multiples of 16 elements). */
static __host__ __device__ guint64
ldh (guint64 n)
{
  return n + 8;
}

static __host__ __device__ guint64
ldf (guint64 n)
{
  return n + 4;
}

static __host__ __device__ guint64
up128 (guint64 bytes)
{
  return (bytes + 127) & ~(guint64)127;
}

/* A bump allocator over the block's dynamic shared memory; the host side
 * runs the same sequence to size it. */
typedef struct
{
  unsigned char *base;
  guint64 off;
} Carve;

static __host__ __device__ void *
carve (Carve *c, guint64 bytes)
{
  void *p = (void *)((uintptr_t)c->base + c->off);
  c->off += up128 (bytes);
  return p;
}

/* Forward, tile B queries by B keys: Q, K, V (B, d) bf16; O (B, d) fp32;
 * S (B, B) fp32; P (B, B) bf16; m, l (B) fp32. */
typedef struct
{
  uint16_t *Q, *K, *V, *P;
  float *O, *S, *m, *l;
} FwdSmem;

static __host__ __device__ guint64
fwd_carve (Carve *c, guint64 d, guint64 B, FwdSmem *s)
{
  s->Q = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->K = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->V = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->O = (float *)carve (c, 4 * B * ldf (d));
  s->S = (float *)carve (c, 4 * B * ldf (B));
  s->P = (uint16_t *)carve (c, 2 * B * ldh (B));
  s->m = (float *)carve (c, 4 * B);
  s->l = (float *)carve (c, 4 * B);
  return c->off;
}

/* Backward (both kernels), tile B by B: Q, dO, K, V (B, d) bf16; the
 * accumulators (dQ, or dK and dV) (B, d) fp32; S and dP (B, B) fp32; P
 * and dS (B, B) bf16; lse and D (B) fp32.  dQ's kernel leaves A1 and P
 * unused (NULL). */
typedef struct
{
  uint16_t *Q, *dO, *K, *V, *P, *dS;
  float *A0, *A1, *S, *dP, *lse, *D;
} BwdSmem;

static __host__ __device__ guint64
bwd_carve (Carve *c, guint64 d, guint64 B, bool dkv, BwdSmem *s)
{
  s->Q = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->dO = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->K = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->V = (uint16_t *)carve (c, 2 * B * ldh (d));
  s->A0 = (float *)carve (c, 4 * B * ldf (d));
  s->A1 = dkv ? (float *)carve (c, 4 * B * ldf (d)) : NULL;
  s->S = (float *)carve (c, 4 * B * ldf (B));
  s->dP = (float *)carve (c, 4 * B * ldf (B));
  s->P = dkv ? (uint16_t *)carve (c, 2 * B * ldh (B)) : NULL;
  s->dS = (uint16_t *)carve (c, 2 * B * ldh (B));
  s->lse = (float *)carve (c, 4 * B);
  s->D = (float *)carve (c, 4 * B);
  return c->off;
}

static guint64
fwd_bytes (guint64 d, guint64 B)
{
  Carve c = { NULL, 0 };
  FwdSmem s;
  return fwd_carve (&c, d, B, &s);
}

static guint64
bwd_bytes (guint64 d, guint64 B, bool dkv)
{
  Carve c = { NULL, 0 };
  BwdSmem s;
  return bwd_carve (&c, d, B, dkv, &s);
}

/* Rows [r0, r0 + rows) of the head columns [col, col + d) of p (bf16, ld
 * elements per row) into dst (B, ldh (d)); rows from @rows to B are
 * zeros.  d is a multiple of 16: 16-byte vectors when p is aligned so. */
static __device__ void
tc_load (const void *p, guint64 ld, guint64 r0, guint64 rows, guint64 col,
         guint64 d, guint64 B, uint16_t *dst)
{
  const uint16_t *src = (const uint16_t *)p;
  guint64 ds = ldh (d);
  if ((((uintptr_t)p) & 15) == 0 && (ld & 7) == 0 && (col & 7) == 0)
    {
      guint64 vecs = d / 8;
      for (guint64 idx = threadIdx.x; idx < B * vecs; idx += blockDim.x)
        {
          guint64 t = idx / vecs, c = (idx % vecs) * 8;
          uint4 x = make_uint4 (0, 0, 0, 0);
          if (t < rows)
            x = *(const uint4 *)(src + (r0 + t) * ld + col + c);
          *(uint4 *)(dst + t * ds + c) = x;
        }
    }
  else
    for (guint64 idx = threadIdx.x; idx < B * d; idx += blockDim.x)
      {
        guint64 t = idx / d, c = idx % d;
        dst[t * ds + c] = t < rows ? src[(r0 + t) * ld + col + c] : 0;
      }
}

/* C (M, N) fp32 (ldc) = A (M, K) B (K, N) (+ C when @acc), bf16 operands,
 * the 16x16 output tiles dealt to the block's warps in turn; each tile's
 * sum runs over K in order (the same bits every run).  A is row-major
 * (element (m, k) at A[m lda + k]) or column-major (A[k lda + m]); B
 * row-major (B[k ldb + n]) or column-major (B[n ldb + k]). */
template <typename LA, typename LB>
static __device__ void
tc_mma (guint64 M, guint64 N, guint64 K, const uint16_t *A, guint64 lda,
        const uint16_t *B, guint64 ldb, float *C, guint64 ldc, bool acc)
{
  constexpr bool a_row = std::is_same<LA, wmma::row_major>::value;
  constexpr bool b_row = std::is_same<LB, wmma::row_major>::value;
  const __nv_bfloat16 *a = (const __nv_bfloat16 *)A;
  const __nv_bfloat16 *b = (const __nv_bfloat16 *)B;
  unsigned warp = threadIdx.x / 32, warps = blockDim.x / 32;
  guint64 tn = N / 16, tiles = (M / 16) * tn;
  for (guint64 t = warp; t < tiles; t += warps)
    {
      guint64 m0 = (t / tn) * 16, n0 = (t % tn) * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      if (acc)
        wmma::load_matrix_sync (c, C + m0 * ldc + n0, (unsigned)ldc,
                                wmma::mem_row_major);
      else
        wmma::fill_fragment (c, 0.0f);
      for (guint64 k0 = 0; k0 < K; k0 += 16)
        {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
          wmma::load_matrix_sync (fa, a_row ? a + m0 * lda + k0
                                            : a + k0 * lda + m0,
                                  (unsigned)lda);
          wmma::load_matrix_sync (fb, b_row ? b + k0 * ldb + n0
                                            : b + n0 * ldb + k0,
                                  (unsigned)ldb);
          wmma::mma_sync (c, fa, fb, c);
        }
      wmma::store_matrix_sync (C + m0 * ldc + n0, c, (unsigned)ldc,
                               wmma::mem_row_major);
    }
}

static __device__ __forceinline__ float
warp_max (float x)
{
  for (int o = 16; o > 0; o /= 2)
    x = fmaxf (x, __shfl_xor_sync (0xffffffffu, x, o));
  return x;
}

static __device__ __forceinline__ float
warp_sum (float x)
{
  for (int o = 16; o > 0; o /= 2)
    x += __shfl_xor_sync (0xffffffffu, x, o);
  return x;
}

/* One block per (query tile, query head, sequence), the tiles with the
 * most key tiles first; key tiles 0 .. the diagonal one.  Per key tile:
 * S = Q K^T (tensor cores), the online softmax per row (one warp a row:
 * the new max m, O's rescaling by exp (m_old - m), P = exp (S scale - m)
 * rounded to bf16, l += the fp32 sum of P), then O += P V (tensor cores,
 * O in shared fp32).  o = O / l, lse = m + log l.  Query rows past T are
 * zeros, fully masked and never written. */
static __global__ void
__launch_bounds__ (TC_THREADS)
attn_tc_forward_kernel (guint64 T, guint64 a, guint64 kv, guint64 d,
                        guint64 B, float scale, const void *q, const void *k,
                        const void *v, void *o, float *lse)
{
  extern __shared__ __align__ (128) unsigned char tc_smem[];
  Carve cv = { tc_smem, 0 };
  FwdSmem s;
  fwd_carve (&cv, d, B, &s);
  guint64 b = blockIdx.z, j = blockIdx.y;
  guint64 q0 = (guint64)(gridDim.x - 1 - blockIdx.x) * B;
  guint64 g = j / (a / kv), r0 = b * T, qn = MIN (B, T - q0);
  guint64 ldq = a * d, ldk = kv * d, dh = ldh (d), df = ldf (d);
  guint64 sf = ldf (B), ph = ldh (B);
  unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  tc_load (q, ldq, r0 + q0, qn, j * d, d, B, s.Q);
  for (guint64 idx = tid; idx < B * d; idx += blockDim.x)
    s.O[(idx / d) * df + idx % d] = 0;
  for (guint64 r = tid; r < B; r += blockDim.x)
    {
      s.m[r] = -INFINITY;
      s.l[r] = 0;
    }
  guint64 kend = q0 + qn;
  for (guint64 k0 = 0; k0 < kend; k0 += B)
    {
      guint64 kn = MIN (B, T - k0);
      tc_load (k, ldk, r0 + k0, kn, g * d, d, B, s.K);
      tc_load (v, ldk, r0 + k0, kn, g * d, d, B, s.V);
      __syncthreads ();
      tc_mma<wmma::row_major, wmma::col_major> (B, B, d, s.Q, dh, s.K, dh,
                                                s.S, sf, false);
      __syncthreads ();
      for (guint64 r = warp; r < B; r += TC_WARPS)
        {
          guint64 qi = q0 + r;
          float *Sr = s.S + r * sf;
          float mx = -INFINITY;
          for (guint64 c = lane; c < B; c += 32)
            {
              float x = -INFINITY;
              if (k0 + c <= qi && qi < T)
                x = Sr[c] * scale;
              Sr[c] = x;
              mx = fmaxf (mx, x);
            }
          float m_old = s.m[r], m = fmaxf (m_old, warp_max (mx));
          float al = 1.0f, sum = 0;
          if (m != -INFINITY)
            {
              al = m_old == -INFINITY ? 0.0f : stow_llama_expf (m_old - m);
              for (guint64 c = lane; c < B; c += 32)
                {
                  float p = Sr[c] == -INFINITY ? 0.0f
                                               : stow_llama_expf (Sr[c] - m);
                  s.P[r * ph + c] = stow_cuda_bf16_round (p);
                  sum += p;
                }
            }
          else
            for (guint64 c = lane; c < B; c += 32)
              s.P[r * ph + c] = 0;
          sum = warp_sum (sum);
          for (guint64 c = lane; c < d; c += 32)
            s.O[r * df + c] *= al;
          __syncwarp ();
          if (lane == 0)
            {
              s.l[r] = s.l[r] * al + sum;
              s.m[r] = m;
            }
        }
      __syncthreads ();
      tc_mma<wmma::row_major, wmma::row_major> (B, d, B, s.P, ph, s.V, dh,
                                                s.O, df, true);
      __syncthreads ();
    }
  for (guint64 idx = tid; idx < qn * d; idx += blockDim.x)
    {
      guint64 r = idx / d, c = idx % d;
      ((uint16_t *)o)[(r0 + q0 + r) * ldq + j * d + c]
          = stow_cuda_bf16_round (s.O[r * df + c] / s.l[r]);
    }
  for (guint64 r = tid; r < qn; r += blockDim.x)
    lse[(r0 + q0 + r) * a + j] = s.m[r] + logf (s.l[r]);
}

/* The probabilities and their gradient for one (query tile, key tile)
 * pair, from S = Q K^T and dP = dO V^T in shared fp32: P = exp (S scale -
 * lse) (zero past the diagonal and on query rows past T), dS = P (dP -
 * D), both rounded to bf16 for the next products (P only when @P). */
static __device__ void
tc_probs (guint64 T, guint64 B, float scale, guint64 q0, guint64 k0,
          const BwdSmem *s, uint16_t *P)
{
  guint64 sf = ldf (B), ph = ldh (B);
  for (guint64 idx = threadIdx.x; idx < B * B; idx += blockDim.x)
    {
      guint64 r = idx / B, c = idx % B;
      float p = 0, ds = 0;
      if (k0 + c <= q0 + r && q0 + r < T)
        {
          p = stow_llama_expf (s->S[r * sf + c] * scale - s->lse[r]);
          ds = p * (s->dP[r * sf + c] - s->D[r]);
        }
      if (P != NULL)
        P[r * ph + c] = stow_cuda_bf16_round (p);
      s->dS[r * ph + c] = stow_cuda_bf16_round (ds);
    }
}

/* lse and D of query rows [q0, q0 + B) of head j (zeros past T). */
static __device__ void
tc_load_rows (guint64 T, guint64 a, guint64 r0, guint64 q0, guint64 j,
              guint64 B, const float *lse, const float *D, const BwdSmem *s)
{
  for (guint64 r = threadIdx.x; r < B; r += blockDim.x)
    {
      bool in = q0 + r < T;
      s->lse[r] = in ? lse[(r0 + q0 + r) * a + j] : 0.0f;
      s->D[r] = in ? D[(r0 + q0 + r) * a + j] : 0.0f;
    }
}

/* One block per (query tile, query head, sequence), the longest first:
 * over key tiles 0 .. the diagonal, dQ += dS K (tensor cores, fp32 in
 * shared); dq = scale dQ. */
static __global__ void
__launch_bounds__ (TC_THREADS)
attn_tc_dq_kernel (guint64 T, guint64 a, guint64 kv, guint64 d, guint64 B,
                   float scale, const void *q, const void *k, const void *v,
                   const float *lse, const float *D, const void *dout,
                   void *dq)
{
  extern __shared__ __align__ (128) unsigned char tc_smem[];
  Carve cv = { tc_smem, 0 };
  BwdSmem s;
  bwd_carve (&cv, d, B, false, &s);
  guint64 b = blockIdx.z, j = blockIdx.y;
  guint64 q0 = (guint64)(gridDim.x - 1 - blockIdx.x) * B;
  guint64 g = j / (a / kv), r0 = b * T, qn = MIN (B, T - q0);
  guint64 ldq = a * d, ldk = kv * d, dh = ldh (d), df = ldf (d);
  guint64 sf = ldf (B), ph = ldh (B);

  tc_load (q, ldq, r0 + q0, qn, j * d, d, B, s.Q);
  tc_load (dout, ldq, r0 + q0, qn, j * d, d, B, s.dO);
  tc_load_rows (T, a, r0, q0, j, B, lse, D, &s);
  for (guint64 idx = threadIdx.x; idx < B * d; idx += blockDim.x)
    s.A0[(idx / d) * df + idx % d] = 0;
  guint64 kend = q0 + qn;
  for (guint64 k0 = 0; k0 < kend; k0 += B)
    {
      guint64 kn = MIN (B, T - k0);
      tc_load (k, ldk, r0 + k0, kn, g * d, d, B, s.K);
      tc_load (v, ldk, r0 + k0, kn, g * d, d, B, s.V);
      __syncthreads ();
      tc_mma<wmma::row_major, wmma::col_major> (B, B, d, s.Q, dh, s.K, dh,
                                                s.S, sf, false);
      tc_mma<wmma::row_major, wmma::col_major> (B, B, d, s.dO, dh, s.V, dh,
                                                s.dP, sf, false);
      __syncthreads ();
      tc_probs (T, B, scale, q0, k0, &s, NULL);
      __syncthreads ();
      tc_mma<wmma::row_major, wmma::row_major> (B, d, B, s.dS, ph, s.K, dh,
                                                s.A0, df, true);
      __syncthreads ();
    }
  for (guint64 idx = threadIdx.x; idx < qn * d; idx += blockDim.x)
    {
      guint64 r = idx / d, c = idx % d;
      ((uint16_t *)dq)[(r0 + q0 + r) * ldq + j * d + c]
          = stow_cuda_bf16_round (scale * s.A0[r * df + c]);
    }
}

/* One block per (key tile, kv head, sequence): over the group's query
 * heads in head order, then the query tiles from the key tile's own on,
 * dV += P^T dO and dK += dS^T Q (tensor cores, fp32 in shared); dk =
 * scale dK, dv = dV. */
static __global__ void
__launch_bounds__ (TC_THREADS)
attn_tc_dkv_kernel (guint64 T, guint64 a, guint64 kv, guint64 d, guint64 B,
                    float scale, const void *q, const void *k, const void *v,
                    const float *lse, const float *D, const void *dout,
                    void *dk, void *dv)
{
  extern __shared__ __align__ (128) unsigned char tc_smem[];
  Carve cv = { tc_smem, 0 };
  BwdSmem s;
  bwd_carve (&cv, d, B, true, &s);
  guint64 b = blockIdx.z, g = blockIdx.y, k0 = (guint64)blockIdx.x * B;
  guint64 group = a / kv, r0 = b * T, kn = MIN (B, T - k0);
  guint64 ldq = a * d, ldk = kv * d, dh = ldh (d), df = ldf (d);
  guint64 sf = ldf (B), ph = ldh (B);
  float *dK = s.A0, *dV = s.A1;

  tc_load (k, ldk, r0 + k0, kn, g * d, d, B, s.K);
  tc_load (v, ldk, r0 + k0, kn, g * d, d, B, s.V);
  for (guint64 idx = threadIdx.x; idx < B * d; idx += blockDim.x)
    {
      guint64 r = idx / d, c = idx % d;
      dK[r * df + c] = 0;
      dV[r * df + c] = 0;
    }
  for (guint64 j = g * group; j < (g + 1) * group; j++)
    for (guint64 q0 = k0; q0 < T; q0 += B)
      {
        guint64 qn = MIN (B, T - q0);
        tc_load (q, ldq, r0 + q0, qn, j * d, d, B, s.Q);
        tc_load (dout, ldq, r0 + q0, qn, j * d, d, B, s.dO);
        tc_load_rows (T, a, r0, q0, j, B, lse, D, &s);
        __syncthreads ();
        tc_mma<wmma::row_major, wmma::col_major> (B, B, d, s.Q, dh, s.K, dh,
                                                  s.S, sf, false);
        tc_mma<wmma::row_major, wmma::col_major> (B, B, d, s.dO, dh, s.V,
                                                  dh, s.dP, sf, false);
        __syncthreads ();
        tc_probs (T, B, scale, q0, k0, &s, s.P);
        __syncthreads ();
        /* P^T and dS^T: the (B queries, B keys) tiles read column-major. */
        tc_mma<wmma::col_major, wmma::row_major> (B, d, B, s.P, ph, s.dO, dh,
                                                  dV, df, true);
        tc_mma<wmma::col_major, wmma::row_major> (B, d, B, s.dS, ph, s.Q, dh,
                                                  dK, df, true);
        __syncthreads ();
      }
  for (guint64 idx = threadIdx.x; idx < kn * d; idx += blockDim.x)
    {
      guint64 r = idx / d, c = idx % d;
      guint64 at = (r0 + k0 + r) * ldk + g * d + c;
      ((uint16_t *)dk)[at] = stow_cuda_bf16_round (scale * dK[r * df + c]);
      ((uint16_t *)dv)[at] = stow_cuda_bf16_round (dV[r * df + c]);
    }
}

/* The largest tile (64, else 32 rows) whose shared memory fits the
 * device's per-block limit, or 0. */
static int
pick_tile (guint64 (*bytes) (guint64, guint64, bool), guint64 d, bool dkv,
           int limit)
{
  for (int B = 64; B >= 32; B /= 2)
    if (bytes (d, (guint64)B, dkv) <= (guint64)limit)
      return B;
  return 0;
}

static guint64
fwd_bytes3 (guint64 d, guint64 B, bool unused)
{
  (void)unused;
  return fwd_bytes (d, B);
}

gboolean
stow_cuda_attention_tc_init (StowLlamaCuda *L)
{
  guint64 d = L->config.head_dim;
  L->attn_tc = false;
  L->attn_tc_fwd_tile = L->attn_tc_dq_tile = L->attn_tc_dkv_tile = 0;
  /* bf16 only (fp32 runs keep the fp32 kernels: the oracle); head_dim a
   * multiple of the fragments' 16 and at most 256 (the runtime's limit);
   * sm_80 or later (bf16 WMMA).  Anything else takes attention.cu's
   * kernels. */
  if (!L->bf16 || d % 16 != 0 || d > 256)
    return TRUE;
  int major = 0, limit = 0;
  if (!stow_llama_cuda_ok (L,
                           cudaDeviceGetAttribute (
                               &major, cudaDevAttrComputeCapabilityMajor,
                               L->device),
                           "attention: compute capability")
      || !stow_llama_cuda_ok (
          L,
          cudaDeviceGetAttribute (
              &limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, L->device),
          "attention: shared memory per block"))
    return FALSE;
  if (major < 8)
    return TRUE;
  if (!stow_cuda_attention_mma_init (L, major, limit))
    return FALSE;
  int tf = pick_tile (fwd_bytes3, d, false, limit);
  int tq = pick_tile (bwd_bytes, d, false, limit);
  int tk = pick_tile (bwd_bytes, d, true, limit);
  if (tf == 0 || tq == 0 || tk == 0)
    return TRUE;
  gboolean ok = stow_cuda_smem_opt_in (
                    L, attn_tc_forward_kernel, fwd_bytes (d, tf),
                    "attention forward (tensor cores): shared memory")
                && stow_cuda_smem_opt_in (
                    L, attn_tc_dq_kernel, bwd_bytes (d, tq, false),
                    "attention dq (tensor cores): shared memory")
                && stow_cuda_smem_opt_in (
                    L, attn_tc_dkv_kernel, bwd_bytes (d, tk, true),
                    "attention dk/dv (tensor cores): shared memory");
  if (!ok)
    return FALSE;
  L->attn_tc_fwd_tile = tf;
  L->attn_tc_dq_tile = tq;
  L->attn_tc_dkv_tile = tk;
  L->attn_tc = true;
  return TRUE;
}

void
stow_cuda_attention_tc_forward (StowLlamaCuda *L, guint64 batch, guint64 seq,
                                const void *q, const void *k, const void *v,
                                void *o, float *lse)
{
  if (stow_cuda_attention_mma_takes (L, q, k, v, o))
    {
      stow_cuda_attention_mma_forward (L, batch, seq, q, k, v, o, lse);
      return;
    }
  const StowLlamaConfig *c = &L->config;
  guint64 d = c->head_dim, B = (guint64)L->attn_tc_fwd_tile;
  float scale = 1.0f / sqrtf ((float)d);
  dim3 grid ((unsigned)((seq + B - 1) / B), (unsigned)c->n_heads,
             (unsigned)batch);
  attn_tc_forward_kernel<<<grid, TC_THREADS, fwd_bytes (d, B), L->stream>>> (
      seq, c->n_heads, c->n_kv_heads, d, B, scale, q, k, v, o, lse);
  stow_llama_cuda_launched (L, "attention forward (tensor cores)");
}

void
stow_cuda_attention_tc_backward (StowLlamaCuda *L, guint64 batch,
                                 guint64 seq, const void *q, const void *k,
                                 const void *v, const float *lse,
                                 const float *D, const void *dout, void *dq,
                                 void *dk, void *dv)
{
  if (stow_cuda_attention_mma_takes (L, q, k, v, dout)
      && stow_cuda_attention_mma_takes (L, dq, dk, dv, dq))
    {
      stow_cuda_attention_mma_backward (L, batch, seq, q, k, v, lse, D, dout,
                                        dq, dk, dv);
      return;
    }
  const StowLlamaConfig *c = &L->config;
  guint64 d = c->head_dim, a = c->n_heads;
  float scale = 1.0f / sqrtf ((float)d);
  guint64 Bq = (guint64)L->attn_tc_dq_tile, Bk = (guint64)L->attn_tc_dkv_tile;
  dim3 gq ((unsigned)((seq + Bq - 1) / Bq), (unsigned)a, (unsigned)batch);
  attn_tc_dq_kernel<<<gq, TC_THREADS, bwd_bytes (d, Bq, false), L->stream>>> (
      seq, a, c->n_kv_heads, d, Bq, scale, q, k, v, lse, D, dout, dq);
  stow_llama_cuda_launched (L, "attention backward: dq (tensor cores)");
  dim3 gk ((unsigned)((seq + Bk - 1) / Bk), (unsigned)c->n_kv_heads,
           (unsigned)batch);
  attn_tc_dkv_kernel<<<gk, TC_THREADS, bwd_bytes (d, Bk, true), L->stream>>> (
      seq, a, c->n_kv_heads, d, Bk, scale, q, k, v, lse, D, dout, dk, dv);
  stow_llama_cuda_launched (L, "attention backward: dk, dv (tensor cores)");
}
