/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/attention-mma.cu: the bf16 runtime's causal
 * grouped-query attention for head_dim 64 and 128 on tensor cores with
 * the warp-level mma.sync (m16n8k16, bf16 in, fp32 accumulation), the
 * flash-attention-2 design: each warp owns 16 rows, its scores, softmax
 * state and output stay in registers (the accumulator fragment of one
 * product is the operand fragment of the next), K and V tiles come into
 * shared memory by cp.async, two tiles in flight, and ldmatrix feeds the
 * fragments.  attention-tc.cu's WMMA kernels kept every tile in shared
 * fp32 and ran at 21 TFLOP/s forward and 15 backward on an H100
 * (bench/results/gpu-h100-20261126-1101); they remain the path for the
 * other head sizes.
 *
 * The arithmetic is that of attention-tc.cu: P rounded to bf16 for P V,
 * the row sums l of the unrounded P, the backward's dS = P (dP - D)
 * rounded to bf16; exponentials in base 2 with the scale folded in.  The
 * backward is a dQ kernel over key tiles and a dK/dV kernel over the
 * group's query heads and query tiles in a fixed order: no atomics, the
 * same bits every run.
 */
#include <cmath>

#include <cuda_bf16.h>

#include "executor/backends/cuda/llama-cuda-private.h"

#define MMA_THREADS 128 /* 4 warps, 16 rows each */
#define MMA_ROWS 64     /* a block's query (forward, dQ) or key (dK/dV) rows */
#define MMA_KTILE 64    /* keys per tile (forward, dQ) */
#define MMA_QTILE 32    /* queries per tile (dK/dV) */

/* ---- the warp-level primitives ---------------------------------------- */

static __device__ __forceinline__ uint32_t
smem_addr (const void *p)
{
  return (uint32_t)__cvta_generic_to_shared (p);
}

/* Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix
 * l / 8.  Register i holds matrix i's elements (row lane / 4, columns 2
 * (lane % 4) + {0, 1}), or with .trans those of its transpose. */
static __device__ __forceinline__ void
ldsm4 (uint32_t r[4], const void *p)
{
  asm volatile ("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, "
                "[%4];\n"
                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                : "r"(smem_addr (p)));
}

static __device__ __forceinline__ void
ldsm4_t (uint32_t r[4], const void *p)
{
  asm volatile ("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, "
                "%2, %3}, [%4];\n"
                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                : "r"(smem_addr (p)));
}

/* c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col). */
static __device__ __forceinline__ void
mma (float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
  asm volatile ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                "{%0, %1, %2, %3};\n"
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                  "r"(b1));
}

/* Two floats as the bf16 pair (lo, hi) of one register, rounded to
 * nearest even as stow_cuda_bf16_round does. */
static __device__ __forceinline__ uint32_t
pack_bf16 (float lo, float hi)
{
  return (uint32_t)stow_cuda_bf16_round (lo)
         | ((uint32_t)stow_cuda_bf16_round (hi) << 16);
}

/* 16 bytes from global to shared memory, zeros where !@in. */
static __device__ __forceinline__ void
cp16 (void *dst, const void *src, bool in)
{
  asm volatile ("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                    smem_addr (dst)),
                "l"(src), "r"(in ? 16 : 0));
}

static __device__ __forceinline__ void
cp_commit (void)
{
  asm volatile ("cp.async.commit_group;\n" ::);
}

template <int N>
static __device__ __forceinline__ void
cp_wait (void)
{
  asm volatile ("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Rows [r0, r0 + R) of head column @col of p (bf16, @ld elements a row)
 * into dst (R, D + 8), rows at or past @end as zeros; the whole block
 * issues, nobody waits. */
template <int D, int R>
static __device__ __forceinline__ void
load_tile (uint16_t *dst, const uint16_t *p, guint64 ld, guint64 r0,
           guint64 end, guint64 col)
{
  constexpr int V = D / 8; /* 16-byte vectors a row */
  for (int i = threadIdx.x; i < R * V; i += MMA_THREADS)
    {
      int r = i / V, c = (i % V) * 8;
      bool in = r0 + r < end;
      const uint16_t *src = p + (in ? (r0 + r) * ld : 0) + col + c;
      cp16 (dst + r * (D + 8) + c, src, in);
    }
}

/* The A fragment (16x16) at rows [r, r + 16), columns [c, c + 16) of a
 * row-major bf16 tile with @ld elements a row. */
static __device__ __forceinline__ void
frag_a (uint32_t a[4], const uint16_t *t, int ld, int r, int c)
{
  int l = threadIdx.x % 32, m = l / 8;
  ldsm4 (a, t + (r + (m & 1) * 8 + l % 8) * ld + c + (m >> 1) * 8);
}

/* B fragments of two n8 tiles, B[k][n] = t[n][k] (t row-major, rows are
 * n): n in [n0, n0 + 16), k in [k0, k0 + 16).  b[0], b[1] for n0, b[2],
 * b[3] for n0 + 8. */
static __device__ __forceinline__ void
frag_bt (uint32_t b[4], const uint16_t *t, int ld, int n0, int k0)
{
  int l = threadIdx.x % 32, m = l / 8;
  ldsm4 (b, t + (n0 + (m >> 1) * 8 + l % 8) * ld + k0 + (m & 1) * 8);
}

/* B fragments of two n8 tiles, B[k][n] = t[k][n] (t row-major, rows are
 * k): k in [k0, k0 + 16), n in [n0, n0 + 16). */
static __device__ __forceinline__ void
frag_b (uint32_t b[4], const uint16_t *t, int ld, int k0, int n0)
{
  int l = threadIdx.x % 32, m = l / 8;
  ldsm4_t (b, t + (k0 + (m & 1) * 8 + l % 8) * ld + n0 + (m >> 1) * 8);
}

static __device__ __forceinline__ float
quad_max (float x)
{
  x = fmaxf (x, __shfl_xor_sync (0xffffffffu, x, 1));
  return fmaxf (x, __shfl_xor_sync (0xffffffffu, x, 2));
}

static __device__ __forceinline__ float
quad_sum (float x)
{
  x += __shfl_xor_sync (0xffffffffu, x, 1);
  return x + __shfl_xor_sync (0xffffffffu, x, 2);
}

/* The K and V tiles of rows [r, r + MMA_KTILE) of kv head column @col into
 * buffer @buf (of two) of Ks and Vs, rows at or past @end as zeros. */
template <int D>
static __device__ __forceinline__ void
load_kv (uint16_t *Ks, uint16_t *Vs, int buf, const uint16_t *k,
         const uint16_t *v, guint64 ldk, guint64 r, guint64 end, guint64 col)
{
  load_tile<D, MMA_KTILE> (Ks + buf * MMA_KTILE * (D + 8), k, ldk, r, end,
                           col);
  load_tile<D, MMA_KTILE> (Vs + buf * MMA_KTILE * (D + 8), v, ldk, r, end,
                           col);
}

template <int N>
static __device__ __forceinline__ void
zero (float (&A)[N][4])
{
  for (int i = 0; i < N; i++)
    A[i][0] = A[i][1] = A[i][2] = A[i][3] = 0;
}

/* The block's next tile is in: every cp.async group but the newest one
 * done, and seen by every thread. */
static __device__ __forceinline__ void
tile_ready (void)
{
  cp_commit ();
  cp_wait<1> ();
  __syncthreads ();
}

/* S = A0 B0^T and T = A1 B1^T for the warp's 16 rows from @row0 of A0 and
 * A1 against the N rows of B0 and B1, over D columns (row-major tiles of
 * D + 8 elements a row): the backward's scores and dP. */
template <int D, int N>
static __device__ __forceinline__ void
two_products (float (&S)[N / 8][4], float (&T)[N / 8][4], const uint16_t *A0,
              const uint16_t *A1, int row0, const uint16_t *B0,
              const uint16_t *B1)
{
  constexpr int LD = D + 8;
  zero (S);
  zero (T);
  for (int c = 0; c < D / 16; c++)
    {
      uint32_t a0[4], a1[4];
      frag_a (a0, A0, LD, row0, c * 16);
      frag_a (a1, A1, LD, row0, c * 16);
      for (int n = 0; n < N / 8; n += 2)
        {
          uint32_t b0[4], b1[4];
          frag_bt (b0, B0, LD, n * 8, c * 16);
          frag_bt (b1, B1, LD, n * 8, c * 16);
          mma (S[n], a0, b0[0], b0[1]);
          mma (S[n + 1], a0, b0[2], b0[3]);
          mma (T[n], a1, b1[0], b1[1]);
          mma (T[n + 1], a1, b1[2], b1[3]);
        }
    }
}

/* C += P B: P the warp's (16, N) probabilities as bf16 pairs (the
 * accumulator pairs of the product that made them are the A fragments
 * over 16 of the N), B (N, D) a row-major tile of D + 8 elements a row. */
template <int D, int N>
static __device__ __forceinline__ void
acc_pb (float (&C)[D / 8][4], const uint32_t (&P)[N / 8][2],
        const uint16_t *B)
{
  for (int c = 0; c < N / 16; c++)
    {
      uint32_t pa[4] = { P[2 * c][0], P[2 * c][1], P[2 * c + 1][0],
                         P[2 * c + 1][1] };
      for (int n = 0; n < D / 8; n += 2)
        {
          uint32_t bf[4];
          frag_b (bf, B, D + 8, c * 16, n * 8);
          mma (C[n], pa, bf[0], bf[1]);
          mma (C[n + 1], pa, bf[2], bf[3]);
        }
    }
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ---- forward ------------------------------------------------------------- */

/* Shared memory: Q (64, D + 8), then two K and two V tiles (64, D + 8). */
template <int D>
static constexpr guint64
fwd_smem (void)
{
  return (guint64)5 * MMA_ROWS * (D + 8) * 2;
}

/* One block per (query tile, query head, sequence), the longest first.
 * Warp w's rows are q0 + 16 w + {g, g + 8} (g = lane / 4); per key tile,
 * S = Q K^T (16 x 64 per warp, in registers), the online softmax in base 2
 * over each row's quad of lanes, O = O alpha + P V.  o = O / l, lse = (m
 * + log2 l) ln 2. */
template <int D>
static __global__ void
__launch_bounds__ (MMA_THREADS)
attn_mma_forward_kernel (guint64 T, guint64 a, guint64 kv, float scale,
                         const uint16_t *q, const uint16_t *k,
                         const uint16_t *v, uint16_t *o, float *lse)
{
  constexpr int LD = D + 8, KT = MMA_KTILE / 8, DT = D / 8;
  extern __shared__ __align__ (128) unsigned char mma_smem[];
  uint16_t *Qs = (uint16_t *)mma_smem;
  uint16_t *Ks = Qs + MMA_ROWS * LD, *Vs = Ks + 2 * MMA_KTILE * LD;
  guint64 b = blockIdx.z, j = blockIdx.y;
  guint64 qt = gridDim.x - 1 - blockIdx.x, q0 = qt * MMA_ROWS;
  guint64 g = j / (a / kv), r0 = b * T, ldq = a * D, ldk = kv * D;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int gr = lane / 4, tq = lane % 4;
  float sl2 = scale * LOG2E;

  load_tile<D, MMA_ROWS> (Qs, q, ldq, r0 + q0, r0 + T, j * D);
  cp_commit ();
  guint64 n_kt = qt + 1; /* key tiles 0 .. the diagonal (64 = 64) */
  load_kv<D> (Ks, Vs, 0, k, v, ldk, r0, r0 + T, g * D);
  cp_commit ();
  cp_wait<1> (); /* Q is in */
  __syncthreads ();
  uint32_t Qf[D / 16][4];
  for (int c = 0; c < D / 16; c++)
    frag_a (Qf[c], Qs, LD, warp * 16, c * 16);

  float O[DT][4];
  zero (O);
  float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0, 0 };
  guint64 row[2] = { q0 + warp * 16 + gr, q0 + warp * 16 + gr + 8 };

  for (guint64 kt = 0; kt < n_kt; kt++)
    {
      int buf = kt & 1;
      if (kt + 1 < n_kt)
        load_kv<D> (Ks, Vs, buf ^ 1, k, v, ldk, r0 + (kt + 1) * MMA_KTILE,
                    r0 + T, g * D);
      tile_ready ();
      const uint16_t *Kt = Ks + buf * MMA_KTILE * LD;
      const uint16_t *Vt = Vs + buf * MMA_KTILE * LD;
      guint64 k0 = kt * MMA_KTILE;

      float S[KT][4];
      zero (S);
      for (int c = 0; c < D / 16; c++)
        for (int n = 0; n < KT; n += 2)
          {
            uint32_t bf[4];
            frag_bt (bf, Kt, LD, n * 8, c * 16);
            mma (S[n], Qf[c], bf[0], bf[1]);
            mma (S[n + 1], Qf[c], bf[2], bf[3]);
          }
      /* Scale to base 2, mask (the diagonal tile; rows past T), max. */
      float mx[2] = { -INFINITY, -INFINITY };
      for (int n = 0; n < KT; n++)
        for (int e = 0; e < 4; e++)
          {
            int h = e / 2;
            guint64 col = k0 + n * 8 + 2 * tq + (e & 1);
            float x = S[n][e] * sl2;
            if (col > row[h] || row[h] >= T)
              x = -INFINITY;
            S[n][e] = x;
            mx[h] = fmaxf (mx[h], x);
          }
      float alpha[2];
      for (int h = 0; h < 2; h++)
        {
          float mn = fmaxf (m[h], quad_max (mx[h]));
          alpha[h] = mn == -INFINITY || m[h] == -INFINITY
                         ? (mn == -INFINITY ? 1.0f : 0.0f)
                         : exp2f (m[h] - mn);
          m[h] = mn;
        }
      float sum[2] = { 0, 0 };
      uint32_t P[KT][2];
      for (int n = 0; n < KT; n++)
        {
          float p[4];
          for (int e = 0; e < 4; e++)
            {
              int h = e / 2;
              p[e] = S[n][e] == -INFINITY ? 0.0f : exp2f (S[n][e] - m[h]);
              sum[h] += p[e];
            }
          P[n][0] = pack_bf16 (p[0], p[1]);
          P[n][1] = pack_bf16 (p[2], p[3]);
        }
      for (int h = 0; h < 2; h++)
        l[h] = l[h] * alpha[h] + sum[h];
      for (int i = 0; i < DT; i++)
        {
          O[i][0] *= alpha[0];
          O[i][1] *= alpha[0];
          O[i][2] *= alpha[1];
          O[i][3] *= alpha[1];
        }
      acc_pb<D, MMA_KTILE> (O, P, Vt); /* O += P V */
      __syncthreads (); /* the buffer is refilled next iteration */
    }
  for (int h = 0; h < 2; h++)
    {
      float lt = quad_sum (l[h]);
      if (row[h] >= T)
        continue;
      guint64 at = (r0 + row[h]) * ldq + j * D + 2 * tq;
      for (int n = 0; n < DT; n++)
        *(uint32_t *)(o + at + n * 8)
            = pack_bf16 (O[n][2 * h] / lt, O[n][2 * h + 1] / lt);
      if (tq == 0)
        lse[(r0 + row[h]) * a + j] = (m[h] + log2f (lt)) * LN2;
    }
}

/* ---- backward: dQ ----------------------------------------------------------- */

/* Q and dO (64, D + 8), two K and two V tiles (64, D + 8). */
template <int D>
static constexpr guint64
dq_smem (void)
{
  return (guint64)6 * MMA_ROWS * (D + 8) * 2;
}

/* One block per (query tile, query head, sequence), the longest first;
 * per key tile: S = Q K^T and dP = dO V^T (registers), P = 2^(S scale
 * log2e - lse log2e), dS = P (dP - D) rounded to bf16, dQ += dS K. dq =
 * scale dQ. */
template <int D>
static __global__ void
__launch_bounds__ (MMA_THREADS)
attn_mma_dq_kernel (guint64 T, guint64 a, guint64 kv, float scale,
                    const uint16_t *q, const uint16_t *k, const uint16_t *v,
                    const float *lse, const float *Dl, const uint16_t *dout,
                    uint16_t *dq)
{
  constexpr int LD = D + 8, KT = MMA_KTILE / 8, DT = D / 8;
  extern __shared__ __align__ (128) unsigned char mma_smem[];
  uint16_t *Qs = (uint16_t *)mma_smem, *dOs = Qs + MMA_ROWS * LD;
  uint16_t *Ks = dOs + MMA_ROWS * LD, *Vs = Ks + 2 * MMA_KTILE * LD;
  guint64 b = blockIdx.z, j = blockIdx.y;
  guint64 qt = gridDim.x - 1 - blockIdx.x, q0 = qt * MMA_ROWS;
  guint64 g = j / (a / kv), r0 = b * T, ldq = a * D, ldk = kv * D;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int gr = lane / 4, tq = lane % 4;
  float sl2 = scale * LOG2E;

  load_tile<D, MMA_ROWS> (Qs, q, ldq, r0 + q0, r0 + T, j * D);
  load_tile<D, MMA_ROWS> (dOs, dout, ldq, r0 + q0, r0 + T, j * D);
  cp_commit ();
  guint64 n_kt = qt + 1;
  load_kv<D> (Ks, Vs, 0, k, v, ldk, r0, r0 + T, g * D);
  cp_commit ();

  guint64 row[2] = { q0 + warp * 16 + gr, q0 + warp * 16 + gr + 8 };
  float ls[2], Dr[2];
  for (int h = 0; h < 2; h++)
    {
      bool in = row[h] < T;
      ls[h] = in ? lse[(r0 + row[h]) * a + j] * LOG2E : 0.0f;
      Dr[h] = in ? Dl[(r0 + row[h]) * a + j] : 0.0f;
    }
  float dQ[DT][4];
  zero (dQ);

  for (guint64 kt = 0; kt < n_kt; kt++)
    {
      int buf = kt & 1;
      if (kt + 1 < n_kt)
        load_kv<D> (Ks, Vs, buf ^ 1, k, v, ldk, r0 + (kt + 1) * MMA_KTILE,
                    r0 + T, g * D);
      tile_ready ();
      const uint16_t *Kt = Ks + buf * MMA_KTILE * LD;
      const uint16_t *Vt = Vs + buf * MMA_KTILE * LD;
      guint64 k0 = kt * MMA_KTILE;

      float S[KT][4], dP[KT][4]; /* Q K^T, dO V^T */
      two_products<D, MMA_KTILE> (S, dP, Qs, dOs, warp * 16, Kt, Vt);
      uint32_t dS[KT][2];
      for (int n = 0; n < KT; n++)
        {
          float ds[4];
          for (int e = 0; e < 4; e++)
            {
              int h = e / 2;
              guint64 col = k0 + n * 8 + 2 * tq + (e & 1);
              float p = 0;
              if (col <= row[h] && row[h] < T)
                p = exp2f (S[n][e] * sl2 - ls[h]);
              ds[e] = p * (dP[n][e] - Dr[h]);
            }
          dS[n][0] = pack_bf16 (ds[0], ds[1]);
          dS[n][1] = pack_bf16 (ds[2], ds[3]);
        }
      acc_pb<D, MMA_KTILE> (dQ, dS, Kt); /* dQ += dS K */
      __syncthreads ();
    }
  for (int h = 0; h < 2; h++)
    {
      if (row[h] >= T)
        continue;
      guint64 at = (r0 + row[h]) * ldq + j * D + 2 * tq;
      for (int n = 0; n < DT; n++)
        *(uint32_t *)(dq + at + n * 8) = pack_bf16 (scale * dQ[n][2 * h],
                                                   scale * dQ[n][2 * h + 1]);
    }
}

/* ---- backward: dK and dV -------------------------------------------------- */

/* K and V (64, D + 8); two Q and two dO tiles (32, D + 8); two lse and two
 * D rows (32 fp32 each). */
template <int D>
static constexpr guint64
dkv_smem (void)
{
  return (guint64)2 * MMA_ROWS * (D + 8) * 2
         + (guint64)4 * MMA_QTILE * (D + 8) * 2 + 4 * MMA_QTILE * 4;
}

/* One block per (key tile, kv head, sequence); warp w's keys are k0 + 16
 * w + {g, g + 8}.  Over the group's query heads in order, then the query
 * tiles from the key tile's first on: S^T = K Q^T and dP^T = V dO^T
 * (16 keys x 32 queries per warp), P^T = 2^(S^T scale log2e - lse
 * log2e), dV += P^T dO, dS^T = P^T (dP^T - D), dK += dS^T Q.  dk = scale
 * dK, dv = dV. */
template <int D>
static __global__ void
__launch_bounds__ (MMA_THREADS)
attn_mma_dkv_kernel (guint64 T, guint64 a, guint64 kv, float scale,
                     const uint16_t *q, const uint16_t *k, const uint16_t *v,
                     const float *lse, const float *Dl, const uint16_t *dout,
                     uint16_t *dk, uint16_t *dv)
{
  constexpr int LD = D + 8, QT = MMA_QTILE / 8, DT = D / 8;
  extern __shared__ __align__ (128) unsigned char mma_smem[];
  uint16_t *Ks = (uint16_t *)mma_smem, *Vs = Ks + MMA_ROWS * LD;
  uint16_t *Qs = Vs + MMA_ROWS * LD, *dOs = Qs + 2 * MMA_QTILE * LD;
  float *Ls = (float *)(dOs + 2 * MMA_QTILE * LD), *Ds = Ls + 2 * MMA_QTILE;
  guint64 b = blockIdx.z, g = blockIdx.y, k0 = (guint64)blockIdx.x * MMA_ROWS;
  guint64 group = a / kv, r0 = b * T, ldq = a * D, ldk = kv * D;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int gr = lane / 4, tq = lane % 4;
  float sl2 = scale * LOG2E;

  load_tile<D, MMA_ROWS> (Ks, k, ldk, r0 + k0, r0 + T, g * D);
  load_tile<D, MMA_ROWS> (Vs, v, ldk, r0 + k0, r0 + T, g * D);
  cp_commit ();

  /* The (head, query tile) pairs in order: heads of the group, then the
   * tiles from k0 on. */
  guint64 tiles_per_head = (T - k0 + MMA_QTILE - 1) / MMA_QTILE;
  guint64 n_it = group * tiles_per_head;
  auto issue = [&] (guint64 it, int buf) {
    guint64 j = g * group + it / tiles_per_head;
    guint64 q0 = k0 + (it % tiles_per_head) * MMA_QTILE;
    load_tile<D, MMA_QTILE> (Qs + buf * MMA_QTILE * LD, q, ldq, r0 + q0,
                             r0 + T, j * D);
    load_tile<D, MMA_QTILE> (dOs + buf * MMA_QTILE * LD, dout, ldq, r0 + q0,
                             r0 + T, j * D);
    for (int i = threadIdx.x; i < MMA_QTILE; i += MMA_THREADS)
      {
        bool in = q0 + i < T;
        Ls[buf * MMA_QTILE + i] = in ? lse[(r0 + q0 + i) * a + j] * LOG2E
                                     : 0.0f;
        Ds[buf * MMA_QTILE + i] = in ? Dl[(r0 + q0 + i) * a + j] : 0.0f;
      }
  };
  issue (0, 0);
  cp_commit ();

  guint64 key[2] = { k0 + warp * 16 + gr, k0 + warp * 16 + gr + 8 };
  float dK[DT][4], dV[DT][4];
  zero (dK);
  zero (dV);

  for (guint64 it = 0; it < n_it; it++)
    {
      int buf = it & 1;
      /* The lse and D rows are plain stores: the barrier that ends the
       * previous iteration has every reader of buf ^ 1 done. */
      if (it + 1 < n_it)
        issue (it + 1, buf ^ 1);
      tile_ready ();
      const uint16_t *Qt = Qs + buf * MMA_QTILE * LD;
      const uint16_t *dOt = dOs + buf * MMA_QTILE * LD;
      const float *Lt = Ls + buf * MMA_QTILE, *Dt = Ds + buf * MMA_QTILE;
      guint64 q0 = k0 + (it % tiles_per_head) * MMA_QTILE;

      float S[QT][4], dP[QT][4]; /* K Q^T, V dO^T */
      two_products<D, MMA_QTILE> (S, dP, Ks, Vs, warp * 16, Qt, dOt);
      uint32_t P[QT][2], dS[QT][2];
      for (int n = 0; n < QT; n++)
        {
          float p[4], ds[4];
          for (int e = 0; e < 4; e++)
            {
              int h = e / 2, ci = n * 8 + 2 * tq + (e & 1);
              guint64 qi = q0 + ci;
              p[e] = 0;
              if (key[h] <= qi && qi < T)
                p[e] = exp2f (S[n][e] * sl2 - Lt[ci]);
              ds[e] = p[e] * (dP[n][e] - Dt[ci]);
            }
          P[n][0] = pack_bf16 (p[0], p[1]);
          P[n][1] = pack_bf16 (p[2], p[3]);
          dS[n][0] = pack_bf16 (ds[0], ds[1]);
          dS[n][1] = pack_bf16 (ds[2], ds[3]);
        }
      acc_pb<D, MMA_QTILE> (dV, P, dOt); /* dV += P^T dO */
      acc_pb<D, MMA_QTILE> (dK, dS, Qt); /* dK += dS^T Q */
      __syncthreads ();
    }
  for (int h = 0; h < 2; h++)
    {
      if (key[h] >= T)
        continue;
      guint64 at = (r0 + key[h]) * ldk + g * D + 2 * tq;
      for (int n = 0; n < DT; n++)
        {
          *(uint32_t *)(dk + at + n * 8) = pack_bf16 (
              scale * dK[n][2 * h], scale * dK[n][2 * h + 1]);
          *(uint32_t *)(dv + at + n * 8)
              = pack_bf16 (dV[n][2 * h], dV[n][2 * h + 1]);
        }
    }
}

/* ---- the entry points ----------------------------------------------------- */

template <int D>
static gboolean
init_d (StowLlamaCuda *L, int limit)
{
  if (fwd_smem<D> () > (guint64)limit || dq_smem<D> () > (guint64)limit
      || dkv_smem<D> () > (guint64)limit)
    return FALSE;
  return stow_cuda_smem_opt_in (L, attn_mma_forward_kernel<D>, fwd_smem<D> (),
                                "attention forward (mma): shared memory")
         && stow_cuda_smem_opt_in (L, attn_mma_dq_kernel<D>, dq_smem<D> (),
                                   "attention dq (mma): shared memory")
         && stow_cuda_smem_opt_in (L, attn_mma_dkv_kernel<D>, dkv_smem<D> (),
                                   "attention dk/dv (mma): shared memory");
}

gboolean
stow_cuda_attention_mma_init (StowLlamaCuda *L, int major, int limit)
{
  guint64 d = L->config.head_dim;
  L->attn_mma = false;
  if (!stow_llama_cuda_layout_ok (L))
    return FALSE;
  if (!L->bf16 || major < 8 || (d != 64 && d != 128))
    return TRUE;
  gboolean ok = d == 64 ? init_d<64> (L, limit) : init_d<128> (L, limit);
  if (L->error != NULL)
    return FALSE;
  L->attn_mma = ok;
  return TRUE;
}

/* The kernels read and write whole 16-byte vectors of rows: each tensor's
 * base on 16 bytes (the head columns then are, d being 64 or 128). */
static bool
aligned16 (const void *p)
{
  return ((uintptr_t)p & 15) == 0;
}

bool
stow_cuda_attention_mma_takes (const StowLlamaCuda *L, const void *q,
                               const void *k, const void *v, const void *o)
{
  return L->attn_mma && aligned16 (q) && aligned16 (k) && aligned16 (v)
         && aligned16 (o);
}

void
stow_cuda_attention_mma_forward (StowLlamaCuda *L, guint64 batch,
                                 guint64 seq, const void *q, const void *k,
                                 const void *v, void *o, float *lse)
{
  const StowLlamaConfig *c = &L->config;
  float scale = 1.0f / sqrtf ((float)c->head_dim);
  dim3 grid ((unsigned)((seq + MMA_ROWS - 1) / MMA_ROWS),
             (unsigned)c->n_heads, (unsigned)batch);
#define FWD(D)                                                                 \
  attn_mma_forward_kernel<D><<<grid, MMA_THREADS, fwd_smem<D> (), L->stream>>> ( \
      seq, c->n_heads, c->n_kv_heads, scale, (const uint16_t *)q,             \
      (const uint16_t *)k, (const uint16_t *)v, (uint16_t *)o, lse)
  if (c->head_dim == 64)
    FWD (64);
  else
    FWD (128);
#undef FWD
  stow_llama_cuda_launched (L, "attention forward (mma)");
}

void
stow_cuda_attention_mma_backward (StowLlamaCuda *L, guint64 batch,
                                  guint64 seq, const void *q, const void *k,
                                  const void *v, const float *lse,
                                  const float *D, const void *dout, void *dq,
                                  void *dk, void *dv)
{
  const StowLlamaConfig *c = &L->config;
  float scale = 1.0f / sqrtf ((float)c->head_dim);
  guint64 a = c->n_heads, kvh = c->n_kv_heads;
  unsigned tiles = (unsigned)((seq + MMA_ROWS - 1) / MMA_ROWS);
  dim3 gq (tiles, (unsigned)a, (unsigned)batch);
  dim3 gk (tiles, (unsigned)kvh, (unsigned)batch);
#define BWD(DH)                                                                \
  do                                                                           \
    {                                                                          \
      attn_mma_dq_kernel<DH><<<gq, MMA_THREADS, dq_smem<DH> (), L->stream>>> ( \
          seq, a, kvh, scale, (const uint16_t *)q, (const uint16_t *)k,       \
          (const uint16_t *)v, lse, D, (const uint16_t *)dout,                \
          (uint16_t *)dq);                                                     \
      stow_llama_cuda_launched (L, "attention backward: dq (mma)");           \
      attn_mma_dkv_kernel<DH>                                                  \
          <<<gk, MMA_THREADS, dkv_smem<DH> (), L->stream>>> (                 \
              seq, a, kvh, scale, (const uint16_t *)q, (const uint16_t *)k,   \
              (const uint16_t *)v, lse, D, (const uint16_t *)dout,            \
              (uint16_t *)dk, (uint16_t *)dv);                                 \
      stow_llama_cuda_launched (L, "attention backward: dk, dv (mma)");       \
    }                                                                          \
  while (0)
  if (c->head_dim == 64)
    BWD (64);
  else
    BWD (128);
#undef BWD
}
