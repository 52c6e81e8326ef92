/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/llama-cuda.cu: the cuda runtime (llama-cuda.h),
 * the cuda backend's provider of the decoder's kernels (executor/kernels.h):
 * the row kernels (RMSNorm, rotary, SwiGLU, their backwards), the column
 * reductions, the embedding, the GEMM front end over cuBLAS and the fused
 * loss's softmax cross-entropy, their table, the runtime's workspace, and
 * the optimizer's reductions and AdamW.  The recipe that calls them is
 * executor/llama.c; attention lives in attention*.cu.  No float atomics
 * anywhere: every sum runs over a partition fixed by the shapes, in a fixed
 * order.
 */
#include <cmath>
#include <cstring>

#include <cub/device/device_radix_sort.cuh>

#include "executor/backends/cuda/llama-cuda-private.h"

/* ---- errors -------------------------------------------------------------- */

gboolean
stow_llama_cuda_ok (StowLlamaCuda *L, cudaError_t e, const char *what)
{
  if (e == cudaSuccess)
    return TRUE;
  if (L->error == NULL)
    L->error = g_error_new (STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                            "cuda llama: %s: %s (%s)", what,
                            cudaGetErrorString (e), cudaGetErrorName (e));
  return FALSE;
}

gboolean
stow_llama_cuda_launched (StowLlamaCuda *L, const char *what)
{
  return stow_llama_cuda_ok (L, cudaGetLastError (), what);
}

static gboolean
cublas_ok (StowLlamaCuda *L, cublasStatus_t s, const char *what)
{
  if (s == CUBLAS_STATUS_SUCCESS)
    return TRUE;
  if (L->error == NULL)
    L->error = g_error_new (STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                            "cuda llama: %s: cuBLAS %s (%d)", what,
                            L->cublas->status_string (s), (int)s);
  return FALSE;
}

gboolean
stow_cuda_available (GError **error)
{
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);
  int n = 0;
  /* cudart_static loads the driver here: no driver, no device. */
  cudaError_t e = cudaGetDeviceCount (&n);
  if (e != cudaSuccess || n == 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "no CUDA device: %s",
                   e != cudaSuccess ? cudaGetErrorString (e)
                                    : "the driver sees no device");
      cudaGetLastError ();
      return FALSE;
    }
  return stow_cublas_load (error) != NULL;
}

/* ---- launch helpers -------------------------------------------------------- */

#define ROW_T STOW_CUDA_ROW_THREADS

/* Blocks of 256 threads for a grid-stride loop over @total items. */
static unsigned
grid_for (guint64 total)
{
  guint64 b = (total + 255) / 256;
  return (unsigned)MAX (1, MIN (b, (guint64)1 << 16));
}

/* Sum over the block (ROW_T threads, a power of two) by a fixed tree: the
 * order of the additions depends on ROW_T alone.  Every thread gets it. */
template <typename T>
static __device__ T
block_sum (T v, T *sh)
{
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads ();
  for (unsigned s = ROW_T / 2; s > 0; s >>= 1)
    {
      if (t < s)
        sh[t] = sh[t] + sh[t + s];
      __syncthreads ();
    }
  T r = sh[0];
  __syncthreads ();
  return r;
}

static __device__ float
block_max (float v, float *sh)
{
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads ();
  for (unsigned s = ROW_T / 2; s > 0; s >>= 1)
    {
      if (t < s)
        sh[t] = sh[t + s] > sh[t] ? sh[t + s] : sh[t];
      __syncthreads ();
    }
  float r = sh[0];
  __syncthreads ();
  return r;
}

/* ---- GEMM ------------------------------------------------------------------ */

void
stow_cuda_gemm_rm (StowLlamaCuda *L, bool ta, bool tb, guint64 M, guint64 N,
                   guint64 K, float alpha, const void *A, bool a_bf16,
                   guint64 lda, const void *B, bool b_bf16, guint64 ldb,
                   float beta, void *C, bool c_bf16, guint64 ldc)
{
  if (L->error != NULL || M == 0 || N == 0)
    return;
  if (K == 0)
    {
      /* No products: C = beta C, i.e. zero or unchanged. */
      if (beta == 0.0f)
        {
          guint64 e = c_bf16 ? 2 : 4;
          stow_llama_cuda_ok (L,
                              cudaMemset2DAsync (C, ldc * e, 0, N * e, M,
                                                 L->stream),
                              "gemm with K = 0: zeroing C");
        }
      return;
    }
  /* cuBLAS is column-major: a row-major X (r, c) with ld is the
   * column-major X^T with the same ld, so C^T = op(B)^T op(A)^T is
   * cublasGemmEx (opB, opA, N, M, K, B, A, C) with the same flags. */
  cudaDataType_t at = a_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cudaDataType_t bt = b_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cudaDataType_t ct = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublas_ok (L,
             L->cublas->gemm_ex (L->handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                                 (int)K, &alpha, B, bt, (int)ldb, A, at,
                                 (int)lda, &beta, C, ct, (int)ldc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

/* ---- row kernels ----------------------------------------------------------- */

/* y (n, h) = w * (x * rstd) with rstd = 1 / sqrt (mean (x^2) + eps), HF's
 * order; y fp32 when YF32, else the runtime's dtype.  One block per row. */
template <bool BF, bool YF32>
static __global__ void
rmsnorm_kernel (guint64 h, float eps, const void *x, const void *w, void *y,
                float *rstd)
{
  __shared__ float sh[ROW_T];
  guint64 r = blockIdx.x;
  float ss = 0;
  for (guint64 j = threadIdx.x; j < h; j += ROW_T)
    {
      float v = ld_el<BF> (x, r * h + j);
      ss += v * v;
    }
  ss = block_sum (ss, sh);
  float rs = 1.0f / sqrtf (ss / (float)h + eps);
  for (guint64 j = threadIdx.x; j < h; j += ROW_T)
    {
      float v = ld_el<BF> (w, j) * (ld_el<BF> (x, r * h + j) * rs);
      if (YF32)
        ((float *)y)[r * h + j] = v;
      else
        st_el<BF> (y, r * h + j, v);
    }
  if (rstd != NULL && threadIdx.x == 0)
    rstd[r] = rs;
}

static void
rmsnorm (void *ctx, guint64 n, const void *x, const void *w, void *y,
         gboolean y_f32)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  if (n == 0)
    return;
  guint64 h = L->config.hidden;
  float eps = (float)L->config.rms_norm_eps;
  DISPATCH_BF (L->bf16, if (y_f32) rmsnorm_kernel<BF, true>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (h, eps, x, w, y, NULL);
               else rmsnorm_kernel<BF, false>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (h, eps, x, w, y, NULL));
  stow_llama_cuda_launched (L, "rmsnorm");
}

/* 1 / sqrt (mean (x^2) + eps) of each row: the same bits as the forward's. */
template <bool BF>
static __global__ void
rms_rstd_kernel (guint64 h, float eps, const void *x, float *rstd)
{
  __shared__ float sh[ROW_T];
  guint64 r = blockIdx.x;
  float ss = 0;
  for (guint64 j = threadIdx.x; j < h; j += ROW_T)
    {
      float v = ld_el<BF> (x, r * h + j);
      ss += v * v;
    }
  ss = block_sum (ss, sh);
  if (threadIdx.x == 0)
    rstd[r] = 1.0f / sqrtf (ss / (float)h + eps);
}

static void
rms_rstd (void *ctx, guint64 n, const void *x, float *rstd)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  if (n == 0)
    return;
  guint64 h = L->config.hidden;
  float eps = (float)L->config.rms_norm_eps;
  DISPATCH_BF (L->bf16, rms_rstd_kernel<BF>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (h, eps, x, rstd));
  stow_llama_cuda_launched (L, "rms_rstd");
}

/* dx = dres + rstd (w dy) - x rstd^3 / h sum_i w_i dy_i x_i; dy fp32 when
 * DYF32.  Each thread reads and writes its own columns only, after the
 * block's reduction: dx may alias x or dres. */
template <bool BF, bool DYF32>
static __global__ void
rmsnorm_backward_kernel (guint64 h, const void *dy, const void *x,
                         const void *w, const float *rstd, const void *dres,
                         void *dx)
{
  __shared__ float sh[ROW_T];
  guint64 r = blockIdx.x;
  float dot = 0;
  for (guint64 j = threadIdx.x; j < h; j += ROW_T)
    {
      float dyj = DYF32 ? ((const float *)dy)[r * h + j]
                        : ld_el<BF> (dy, r * h + j);
      dot += ld_el<BF> (w, j) * dyj * ld_el<BF> (x, r * h + j);
    }
  dot = block_sum (dot, sh);
  float rs = rstd[r];
  float coef = dot * rs * rs * rs / (float)h;
  for (guint64 j = threadIdx.x; j < h; j += ROW_T)
    {
      float dyj = DYF32 ? ((const float *)dy)[r * h + j]
                        : ld_el<BF> (dy, r * h + j);
      float xj = ld_el<BF> (x, r * h + j);
      float v = rs * (ld_el<BF> (w, j) * dyj) - xj * coef;
      if (dres != NULL)
        v = ld_el<BF> (dres, r * h + j) + v;
      st_el<BF> (dx, r * h + j, v);
    }
}

static void
rmsnorm_backward (void *ctx, guint64 n, const void *dy, gboolean dy_f32,
                  const void *x, const void *w, const float *rstd,
                  const void *dres, void *dx)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  if (n == 0)
    return;
  guint64 h = L->config.hidden;
  DISPATCH_BF (L->bf16, if (dy_f32) rmsnorm_backward_kernel<BF, true>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (h, dy, x, w, rstd, dres,
                                                       dx);
               else rmsnorm_backward_kernel<BF, false>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (h, dy, x, w, rstd, dres,
                                                       dx));
  stow_llama_cuda_launched (L, "rmsnorm_backward");
}

/* HF's rotate-half on p (n, heads d) in place, row r at position r % seq;
 * one thread per pair (i, i + d/2); @sign -1 rotates back. */
template <bool BF>
static __global__ void
rope_kernel (guint64 n, guint64 seq, guint64 heads, guint64 d, void *p,
             const float *cs, const float *sn, float sign)
{
  guint64 half = d / 2, per_row = heads * half;
  guint64 total = n * per_row;
  for (guint64 idx = (guint64)blockIdx.x * blockDim.x + threadIdx.x;
       idx < total; idx += (guint64)gridDim.x * blockDim.x)
    {
      guint64 r = idx / per_row, rem = idx % per_row;
      guint64 hd = rem / half, i = rem % half, t = r % seq;
      guint64 a = r * heads * d + hd * d + i, b = a + half;
      float x1 = ld_el<BF> (p, a), x2 = ld_el<BF> (p, b);
      float c = cs[t * half + i], s = sign * sn[t * half + i];
      st_el<BF> (p, a, x1 * c - x2 * s);
      st_el<BF> (p, b, x2 * c + x1 * s);
    }
}

static void
rope (void *ctx, guint64 n, guint64 seq, guint64 heads, void *p,
      gboolean inverse)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  guint64 d = L->config.head_dim, total = n * heads * (d / 2);
  if (total == 0)
    return;
  float sign = inverse ? -1.0f : 1.0f;
  DISPATCH_BF (L->bf16, rope_kernel<BF>
               <<<grid_for (total), 256, 0, L->stream>>> (
                   n, seq, heads, d, p, L->rope_cos, L->rope_sin, sign));
  stow_llama_cuda_launched (L, "rope");
}

/* act = silu (gate) * up, silu (g) = g / (1 + exp (-g)) as torch does. */
template <bool BF>
static __global__ void
swiglu_kernel (guint64 total, const void *gate, const void *up, void *act)
{
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (guint64)gridDim.x * blockDim.x)
    {
      float g = ld_el<BF> (gate, i), u = ld_el<BF> (up, i);
      st_el<BF> (act, i, g / (1.0f + stow_llama_expf (-g)) * u);
    }
}

static void
swiglu (void *ctx, guint64 n, const void *gate, const void *up, void *act)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  guint64 total = n * L->config.ffn;
  if (total == 0)
    return;
  DISPATCH_BF (L->bf16, swiglu_kernel<BF>
               <<<grid_for (total), 256, 0, L->stream>>> (total, gate, up,
                                                          act));
  stow_llama_cuda_launched (L, "swiglu");
}

/* In place: gate becomes dgate, up becomes dup.  s = sigmoid (g):
 * d silu/dg = s (1 + g (1 - s)). */
template <bool BF>
static __global__ void
swiglu_backward_kernel (guint64 total, const void *dact, void *gate, void *up)
{
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (guint64)gridDim.x * blockDim.x)
    {
      float da = ld_el<BF> (dact, i), g = ld_el<BF> (gate, i);
      float u = ld_el<BF> (up, i);
      float s = 1.0f / (1.0f + stow_llama_expf (-g));
      float dg = da * u * (s * (1.0f + g * (1.0f - s)));
      st_el<BF> (up, i, da * (g * s));
      st_el<BF> (gate, i, dg);
    }
}

static void
swiglu_backward (void *ctx, guint64 n, const void *dact, void *gate, void *up)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  guint64 total = n * L->config.ffn;
  if (total == 0)
    return;
  DISPATCH_BF (L->bf16, swiglu_backward_kernel<BF>
               <<<grid_for (total), 256, 0, L->stream>>> (total, dact, gate,
                                                          up));
  stow_llama_cuda_launched (L, "swiglu_backward");
}

/* ---- column reductions ------------------------------------------------------ */

/* Stage 1: part[rc, c] = sum over rows [rc COL_ROWS, ..) of y[r, c] (times
 * x[r, c] rstd[r], rounded to fp32 as the forward's normalised x, when x is
 * not NULL), in double, rows in order.  y fp32 when YF32. */
template <bool BF, bool YF32>
static __global__ void
colsum_part_kernel (guint64 n, guint64 cols, const void *y, const void *x,
                    const float *rstd, double *part)
{
  guint64 c = (guint64)blockIdx.x * blockDim.x + threadIdx.x;
  guint64 rc = blockIdx.y;
  if (c >= cols)
    return;
  guint64 r0 = rc * STOW_CUDA_COL_ROWS;
  guint64 r1 = MIN (n, r0 + STOW_CUDA_COL_ROWS);
  double acc = 0;
  for (guint64 r = r0; r < r1; r++)
    {
      guint64 o = r * cols + c;
      float yv = YF32 ? ((const float *)y)[o] : ld_el<BF> (y, o);
      if (x != NULL)
        {
          float xs = ld_el<BF> (x, o) * rstd[r];
          acc = __dadd_rn (acc, __dmul_rn ((double)yv, (double)xs));
        }
      else
        acc = __dadd_rn (acc, (double)yv);
    }
  part[rc * cols + c] = acc;
}

/* Stage 2: the parts of each column in order; then either g (+)= the sum,
 * rounded once (@acc NULL), or acc[c] += the sum. */
template <bool BF>
static __global__ void
colsum_final_kernel (guint64 n_parts, guint64 cols, const double *part,
                     void *g, bool accumulate, double *acc)
{
  guint64 c = (guint64)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols)
    return;
  double v = 0;
  for (guint64 p = 0; p < n_parts; p++)
    v = __dadd_rn (v, part[p * cols + c]);
  if (acc != NULL)
    {
      acc[c] = __dadd_rn (acc[c], v);
      return;
    }
  if (accumulate)
    v = __dadd_rn (v, (double)ld_el<BF> (g, c));
  st_el<BF> (g, c, (float)v);
}

static void
colsum_any (StowLlamaCuda *L, guint64 n, guint64 cols, const void *y,
            bool y_f32, const void *x, const float *rstd, void *g,
            bool accumulate, double *acc)
{
  if (cols == 0)
    return;
  guint64 n_parts = (n + STOW_CUDA_COL_ROWS - 1) / STOW_CUDA_COL_ROWS;
  if (n_parts > 0)
    {
      dim3 grid ((unsigned)((cols + 127) / 128), (unsigned)n_parts);
      DISPATCH_BF (L->bf16, if (y_f32) colsum_part_kernel<BF, true>
                   <<<grid, 128, 0, L->stream>>> (n, cols, y, x, rstd,
                                                  L->col_part);
                   else colsum_part_kernel<BF, false>
                   <<<grid, 128, 0, L->stream>>> (n, cols, y, x, rstd,
                                                  L->col_part));
      stow_llama_cuda_launched (L, "colsum (rows)");
    }
  DISPATCH_BF (L->bf16, colsum_final_kernel<BF>
               <<<(unsigned)((cols + 127) / 128), 128, 0, L->stream>>> (
                   n_parts, cols, L->col_part, g, accumulate, acc));
  stow_llama_cuda_launched (L, "colsum (parts)");
}

/* g (cols) (+)= column sums of y [* x * rstd], as stow_llama_colsum. */
static void
colsum (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
        const void *x, const float *rstd, void *g, gboolean accumulate)
{
  colsum_any ((StowLlamaCuda *)ctx, n, cols, y, y_f32, x, rstd, g, accumulate,
              NULL);
}

/* The fused loss's norm gradient, summed over its chunks in L->col_acc. */
static void
colsum_acc_zero (void *ctx)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  stow_llama_cuda_ok (L,
                      cudaMemsetAsync (L->col_acc, 0, 8 * L->config.hidden,
                                       L->stream),
                      "colsum_acc: zeroing");
}

static void
colsum_acc (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
            const void *x, const float *rstd)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  g_return_if_fail (cols <= L->config.hidden);
  colsum_any (L, n, cols, y, y_f32, x, rstd, NULL, false, L->col_acc);
}

/* g (+)= the sums, rounded once. */
template <bool BF>
static __global__ void
colsum_acc_store_kernel (guint64 cols, const double *acc, void *g,
                         bool accumulate)
{
  guint64 j = (guint64)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols)
    return;
  double v = acc[j];
  if (accumulate)
    v = __dadd_rn (v, (double)ld_el<BF> (g, j));
  st_el<BF> (g, j, (float)v);
}

static void
colsum_acc_store (void *ctx, guint64 cols, void *g, gboolean accumulate)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  g_return_if_fail (cols <= L->config.hidden);
  if (cols == 0)
    return;
  DISPATCH_BF (L->bf16, colsum_acc_store_kernel<BF>
               <<<(unsigned)((cols + 127) / 128), 128, 0, L->stream>>> (
                   cols, L->col_acc, g, accumulate));
  stow_llama_cuda_launched (L, "colsum_acc: store");
}

/* ---- embedding --------------------------------------------------------------- */

/* Out-of-range tokens (the data loader rejects them) touch no memory. */
static __global__ void
embed_forward_kernel (guint64 V, guint64 row_u16, const uint16_t *embed,
                      const gint32 *tokens, uint16_t *x)
{
  guint64 r = blockIdx.x;
  gint32 t = tokens[r];
  if (t < 0 || (guint64)t >= V)
    return;
  for (guint64 j = threadIdx.x; j < row_u16; j += blockDim.x)
    x[r * row_u16 + j] = embed[(guint64)t * row_u16 + j];
}

static void
embed_forward (void *ctx, const void *embed, const gint32 *tokens, guint64 n,
               void *x)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  if (n == 0)
    return;
  /* Rows copied as 16-bit units: h e bytes is even at both dtypes. */
  guint64 row_u16 = L->config.hidden * L->esize / 2;
  embed_forward_kernel<<<(unsigned)n, 256, 0, L->stream>>> (
      L->config.vocab, row_u16, (const uint16_t *)embed, tokens,
      (uint16_t *)x);
  stow_llama_cuda_launched (L, "embed_forward");
}

static __global__ void
embed_keys_kernel (guint64 n, const gint32 *tokens, guint32 *keys,
                   guint32 *vals)
{
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (guint64)gridDim.x * blockDim.x)
    {
      keys[i] = (guint32)tokens[i];
      vals[i] = (guint32)i;
    }
}

/* Block i owns the group of equal tokens that starts at sorted position i
 * (the others return): the token's row += the group's rows of dx in
 * position order (the stable sort keeps it), in fp32, rounded once. */
template <bool BF>
static __global__ void
embed_backward_kernel (guint64 n, guint64 V, guint64 h, const guint32 *keys,
                       const guint32 *pos, const void *dx, void *dembed)
{
  guint64 i = blockIdx.x;
  guint32 tok = keys[i];
  if ((i > 0 && keys[i - 1] == tok) || tok >= V)
    return;
  for (guint64 j = threadIdx.x; j < h; j += blockDim.x)
    {
      float acc = ld_el<BF> (dembed, (guint64)tok * h + j);
      for (guint64 k = i; k < n && keys[k] == tok; k++)
        acc += ld_el<BF> (dx, (guint64)pos[k] * h + j);
      st_el<BF> (dembed, (guint64)tok * h + j, acc);
    }
}

static void
embed_backward (void *ctx, const gint32 *tokens, guint64 n, const void *dx,
                void *dembed, gboolean accumulate)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  guint64 h = L->config.hidden, V = L->config.vocab;
  if (!accumulate
      && !stow_llama_cuda_ok (L,
                              cudaMemsetAsync (dembed, 0, V * h * L->esize,
                                               L->stream),
                              "embed_backward: zeroing dembed"))
    return;
  if (n == 0)
    return;
  embed_keys_kernel<<<grid_for (n), 256, 0, L->stream>>> (
      n, tokens, L->sort_keys_in, L->sort_vals_in);
  if (!stow_llama_cuda_launched (L, "embed_backward: keys"))
    return;
  size_t bytes = L->sort_tmp_bytes;
  if (!stow_llama_cuda_ok (
          L,
          cub::DeviceRadixSort::SortPairs (
              L->sort_tmp, bytes, (const guint32 *)L->sort_keys_in,
              L->sort_keys_out, (const guint32 *)L->sort_vals_in,
              L->sort_vals_out, (int)n, 0, L->sort_bits, L->stream),
          "embed_backward: radix sort"))
    return;
  DISPATCH_BF (L->bf16, embed_backward_kernel<BF>
               <<<(unsigned)n, 256, 0, L->stream>>> (
                   n, V, h, L->sort_keys_out, L->sort_vals_out, dx, dembed));
  stow_llama_cuda_launched (L, "embed_backward");
}

/* ---- the table's GEMM ---------------------------------------------------------- */

/* C (n, out) = R + bias, the starting value of a linear layer's output
 * (fp32 sums, rounded once at bf16: exact whenever one of them is NULL). */
template <bool BF>
static __global__ void
init_rows_kernel (guint64 n, guint64 out, const void *R, const void *bias,
                  void *C)
{
  guint64 total = n * out;
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (guint64)gridDim.x * blockDim.x)
    {
      float v = R != NULL ? ld_el<BF> (R, i) : 0.0f;
      if (bias != NULL)
        v += ld_el<BF> (bias, i % out);
      st_el<BF> (C, i, v);
    }
}

/* The table's gemm over cuBLAS: C starts as R + bias (rounded once at
 * bf16: exact whenever one of them is NULL) and cuBLAS adds the product
 * (beta 1), so that at bf16 the sum is rounded once, as the cpu runtime
 * does; beta 1 also when accumulating, 0 otherwise. */
static void
gemm (void *ctx, guint64 M, guint64 N, guint64 K, float alpha, StowMat A,
      StowMat B, void *C, gboolean c_bf16, guint64 ldc, gboolean accumulate,
      const void *R, guint64 ldr, const void *bias)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  float beta = accumulate ? 1.0f : 0.0f;
  if (!accumulate && (R != NULL || bias != NULL))
    {
      /* Rows of the dtype, packed: what a linear layer's output is. */
      g_return_if_fail ((bool)c_bf16 == L->bf16 && ldc == N
                        && (R == NULL || ldr == N));
      guint64 total = M * N;
      if (total > 0)
        {
          DISPATCH_BF (L->bf16, init_rows_kernel<BF>
                       <<<grid_for (total), 256, 0, L->stream>>> (M, N, R,
                                                                  bias, C));
          stow_llama_cuda_launched (L, "gemm: residual and bias");
        }
      beta = 1.0f;
    }
  stow_cuda_gemm_rm (L, A.trans, B.trans, M, N, K, alpha, A.p, A.bf16, A.ld,
                     B.p, B.bf16, B.ld, beta, C, c_bf16, ldc);
}

/* ---- output layer and loss --------------------------------------------------- */

/* One block per row of logits (cn, V), in place: the row becomes
 * scale (softmax - onehot (target)) and loss[i] = logsumexp - logit[t]
 * (0 and 0 for a negative target, ignored).
 * At bf16 (BF) the row is stored as bf16 in the first half of its own
 * bytes (ld 2 V bf16 elements), a tile at a time: tile j0's 16-bit
 * results land on floats below j0 + ROW_T, all read before the barrier,
 * and no later tile reads them. */
template <bool BF>
static __global__ void
softmax_xent_kernel (guint64 V, float *logits, const gint32 *targets,
                     float scale, float *loss)
{
  __shared__ float sh[ROW_T];
  guint64 i = blockIdx.x;
  float *l = logits + i * V;
  gint32 t32 = targets[i];
  if (t32 < 0) /* ignored (a masked target): no loss, no gradient */
    {
      for (guint64 j = threadIdx.x; j < V; j += ROW_T)
        if (BF)
          ((uint16_t *)l)[j] = 0;
        else
          l[j] = 0;
      if (threadIdx.x == 0)
        loss[i] = 0;
      return;
    }
  guint64 t = (guint64)t32 >= V ? 0 : (guint64)t32;
  float lt = l[t];
  float m = -INFINITY;
  for (guint64 j = threadIdx.x; j < V; j += ROW_T)
    m = l[j] > m ? l[j] : m;
  m = block_max (m, sh);
  float sum = 0;
  for (guint64 j = threadIdx.x; j < V; j += ROW_T)
    {
      float pj = stow_llama_expf (l[j] - m);
      l[j] = pj;
      sum += pj;
    }
  sum = block_sum (sum, sh); /* its barriers order the writes above */
  if (threadIdx.x == 0)
    loss[i] = (m - lt) + logf (sum);
  float k = scale / sum;
  if (!BF)
    {
      for (guint64 j = threadIdx.x; j < V; j += ROW_T)
        {
          float v = l[j] * k;
          l[j] = j == t ? v - scale : v;
        }
      return;
    }
  uint16_t *o = (uint16_t *)l;
  for (guint64 j0 = 0; j0 < V; j0 += ROW_T)
    {
      guint64 j = j0 + threadIdx.x;
      float v = 0;
      if (j < V)
        {
          v = l[j] * k;
          v = j == t ? v - scale : v;
        }
      __syncthreads ();
      if (j < V)
        o[j] = stow_cuda_bf16_round (v);
      __syncthreads ();
    }
}

/* *loss_sum += the sum of loss[0 .. cn) in double (one block, a fixed
 * tree). */
static __global__ void
loss_sum_kernel (guint64 cn, const float *loss, double *loss_sum)
{
  __shared__ double sh[ROW_T];
  double s = 0;
  for (guint64 i = threadIdx.x; i < cn; i += ROW_T)
    s = __dadd_rn (s, (double)loss[i]);
  s = block_sum (s, sh);
  if (threadIdx.x == 0)
    *loss_sum = __dadd_rn (*loss_sum, s);
}

/* The table's xent: softmax_xent_kernel, then the losses' sum. */
static void
xent (void *ctx, guint64 n, float *logits, const gint32 *targets, float scale,
      float *loss, double *loss_sum)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  if (n == 0)
    return;
  DISPATCH_BF (L->bf16, softmax_xent_kernel<BF>
               <<<(unsigned)n, ROW_T, 0, L->stream>>> (
                   L->config.vocab, logits, targets, scale, loss));
  stow_llama_cuda_launched (L, "xent: softmax");
  loss_sum_kernel<<<1, ROW_T, 0, L->stream>>> (n, loss, loss_sum);
  stow_llama_cuda_launched (L, "xent: loss sum");
}

/* ---- the table ---------------------------------------------------------------- */

static void
attention_forward (void *ctx, guint64 batch, guint64 seq, const void *q,
                   const void *k, const void *v, void *o, float *lse)
{
  stow_cuda_attention_forward ((StowLlamaCuda *)ctx, batch, seq, q, k, v, o,
                               lse);
}

static void
attention_backward (void *ctx, guint64 batch, guint64 seq, const void *q,
                    const void *k, const void *v, const void *o,
                    const float *lse, const void *dout, void *dq, void *dk,
                    void *dv)
{
  stow_cuda_attention_backward ((StowLlamaCuda *)ctx, batch, seq, q, k, v, o,
                                lse, dout, dq, dk, dv);
}

static void
zero (void *ctx, void *p, guint64 bytes)
{
  StowLlamaCuda *L = (StowLlamaCuda *)ctx;
  stow_llama_cuda_ok (L, cudaMemsetAsync (p, 0, bytes, L->stream),
                      "zeroing a tensor");
}

static gboolean
failed (void *ctx)
{
  return ((StowLlamaCuda *)ctx)->error != NULL;
}

static const StowKernels cuda_kernels = {
  .name = "cuda",
  .gemm = gemm,
  .rmsnorm = rmsnorm,
  .rms_rstd = rms_rstd,
  .rmsnorm_backward = rmsnorm_backward,
  .rope = rope,
  .swiglu = swiglu,
  .swiglu_backward = swiglu_backward,
  .colsum = colsum,
  .colsum_acc_zero = colsum_acc_zero,
  .colsum_acc = colsum_acc,
  .colsum_acc_store = colsum_acc_store,
  .attention_forward = attention_forward,
  .attention_backward = attention_backward,
  .embed_forward = embed_forward,
  .embed_backward = embed_backward,
  .xent = xent,
  .zero = zero,
  .failed = failed,
};

const StowDecoder *
stow_llama_cuda_decoder (StowLlamaCuda *L)
{
  g_return_val_if_fail (L != NULL, NULL);
  return &L->decoder;
}

/* ---- runtime ------------------------------------------------------------------ */

static guint64
align256 (guint64 b)
{
  return (b + 255) / 256 * 256;
}

static void
ws_free (StowLlamaCuda *L)
{
  if (L->handle != NULL)
    L->cublas->destroy (L->handle);
  L->handle = NULL;
  if (L->ws != NULL)
    cudaFree (L->ws);
  L->ws = NULL;
}

StowLlamaCuda *
stow_llama_cuda_new (const StowLlamaConfig *config, StowDtype dtype,
                     guint64 max_tokens, guint64 max_seq, void *stream,
                     GError **error)
{
  g_return_val_if_fail (config != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* The cpu runtime checks the config as it must be (the same messages)
   * and computes the rotary tables this one uploads: the same bits. */
  g_autoptr (StowLlama) cpu = stow_llama_new (config, dtype, max_seq, 1, error);
  if (cpu == NULL)
    return NULL;
  const StowLlamaConfig *c = config;
  /* The attention's tiles hold head_dim floats per row in shared memory;
   * the column reductions' grid has a y dimension of max_tokens / 256
   * (at most 65535). */
  const guint64 max_tokens_limit = (guint64)65535 * STOW_CUDA_COL_ROWS;
  if (c->head_dim > 256)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "cuda llama: head_dim (%" G_GUINT64_FORMAT
                   ") must be at most 256",
                   c->head_dim);
      return NULL;
    }
  if (max_tokens < max_seq || max_tokens > max_tokens_limit)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "cuda llama: max_tokens (%" G_GUINT64_FORMAT
                   ") must be at least max_seq (%" G_GUINT64_FORMAT
                   ") and at most %" G_GUINT64_FORMAT,
                   max_tokens, max_seq, max_tokens_limit);
      return NULL;
    }
  const StowCublas *cublas = stow_cublas_load (error);
  if (cublas == NULL)
    return NULL;

  g_autoptr (StowLlamaCuda) L = g_new0 (StowLlamaCuda, 1);
  L->struct_bytes = sizeof (StowLlamaCuda);
  L->config = *config;
  L->dtype = dtype;
  L->bf16 = dtype == STOW_DTYPE_BF16;
  L->esize = stow_dtype_size (dtype);
  L->max_tokens = max_tokens;
  L->max_seq = max_seq;
  L->stream = (cudaStream_t)stream;
  L->cublas = cublas;
  L->attn_tile = c->head_dim > 128 ? 16 : 32;
  if (!stow_llama_cuda_ok (L, cudaGetDevice (&L->device), "cudaGetDevice"))
    {
      g_propagate_error (error, g_steal_pointer (&L->error));
      return NULL;
    }

  guint64 half = c->head_dim / 2, h = c->hidden;
  guint64 a = c->n_heads, ad = a * c->head_dim;
  guint64 cols_max = MAX (MAX (h, c->ffn), ad);
  guint64 n_parts = (max_tokens + STOW_CUDA_COL_ROWS - 1) / STOW_CUDA_COL_ROWS;
  L->sort_bits = 1;
  while (L->sort_bits < 32 && ((guint64)1 << L->sort_bits) < c->vocab)
    L->sort_bits++;
  cudaError_t e = cub::DeviceRadixSort::SortPairs (
      NULL, L->sort_tmp_bytes, (const guint32 *)NULL, (guint32 *)NULL,
      (const guint32 *)NULL, (guint32 *)NULL, (int)max_tokens, 0,
      L->sort_bits, L->stream);
  if (!stow_llama_cuda_ok (L, e, "cub radix sort: sizing"))
    {
      g_propagate_error (error, g_steal_pointer (&L->error));
      return NULL;
    }

  /* The workspace, one allocation, each part 256-byte aligned. */
  struct
  {
    void **p;
    guint64 bytes;
  } parts[] = {
    { (void **)&L->rope_cos, 4 * max_seq * half },
    { (void **)&L->rope_sin, 4 * max_seq * half },
    { &L->cublas_ws, STOW_CUDA_CUBLAS_WS_BYTES },
    { (void **)&L->attn_delta, 4 * max_tokens * a },
    { (void **)&L->col_part, 8 * n_parts * cols_max },
    { (void **)&L->col_acc, 8 * h },
    { (void **)&L->sumsq_part, 8 * STOW_CUDA_SUMSQ_MAX_BLOCKS },
    { (void **)&L->sort_keys_in, 4 * max_tokens },
    { (void **)&L->sort_keys_out, 4 * max_tokens },
    { (void **)&L->sort_vals_in, 4 * max_tokens },
    { (void **)&L->sort_vals_out, 4 * max_tokens },
    { &L->sort_tmp, L->sort_tmp_bytes },
  };
  guint64 total = 0;
  for (guint i = 0; i < G_N_ELEMENTS (parts); i++)
    total += align256 (parts[i].bytes);
  void *ws = NULL;
  if (!stow_llama_cuda_ok (L, cudaMalloc (&ws, total), "cudaMalloc workspace"))
    {
      g_prefix_error (&L->error, "%" G_GUINT64_FORMAT " bytes: ", total);
      g_propagate_error (error, g_steal_pointer (&L->error));
      return NULL;
    }
  L->ws = ws;
  L->ws_bytes = total;
  guint64 off = 0;
  for (guint i = 0; i < G_N_ELEMENTS (parts); i++)
    {
      *parts[i].p = (guint8 *)ws + off;
      off += align256 (parts[i].bytes);
    }

  /* Once, at creation: the tables, then the stream is the runtime's. */
  if (max_seq * half > 0)
    {
      stow_llama_cuda_ok (L,
                          cudaMemcpy (L->rope_cos,
                                      stow_llama_rope_table (cpu, FALSE),
                                      4 * max_seq * half,
                                      cudaMemcpyHostToDevice),
                          "uploading the rotary tables");
      stow_llama_cuda_ok (L,
                          cudaMemcpy (L->rope_sin,
                                      stow_llama_rope_table (cpu, TRUE),
                                      4 * max_seq * half,
                                      cudaMemcpyHostToDevice),
                          "uploading the rotary tables");
    }
  /* A pageable upload may return before its DMA lands: wait for it here,
   * the one place the runtime may, so that work on a non-blocking stream
   * sees the tables. */
  if (L->error == NULL)
    stow_llama_cuda_ok (L, cudaDeviceSynchronize (),
                        "uploading the rotary tables");
  if (L->error == NULL
      && cublas_ok (L, cublas->create (&L->handle), "cublasCreate"))
    {
      cublas_ok (L, cublas->set_stream (L->handle, L->stream),
                 "cublasSetStream");
      cublas_ok (L,
                 cublas->set_workspace (L->handle, L->cublas_ws,
                                        STOW_CUDA_CUBLAS_WS_BYTES),
                 "cublasSetWorkspace");
      /* fp32: pedantic math, never TF32 (the oracle runs); bf16: tensor
       * cores with fp32 accumulation. */
      cublas_ok (L,
                 cublas->set_math_mode (L->handle, L->bf16
                                                       ? CUBLAS_DEFAULT_MATH
                                                       : CUBLAS_PEDANTIC_MATH),
                 "cublasSetMathMode");
    }
  if (L->error == NULL)
    stow_cuda_attention_init (L);
  if (L->error != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&L->error));
      return NULL;
    }
  /* cuBLAS's bf16 GEMMs take bf16 operands: the fused loss stages its
   * normed input and dlogits in bf16 (xent's contract). */
  L->decoder = (StowDecoder){
    .k = &cuda_kernels,
    .ctx = L,
    .config = *config,
    .bf16 = L->bf16,
    .esize = L->esize,
    .max_seq = max_seq,
    .max_tokens = max_tokens,
    .max_batch = 65535,
    .loss_lowp = L->bf16,
  };
  return g_steal_pointer (&L);
}

void
stow_llama_cuda_free (StowLlamaCuda *L)
{
  if (L == NULL)
    return;
  ws_free (L);
  g_clear_error (&L->error);
  g_free (L);
}

guint64
stow_llama_cuda_workspace_bytes (const StowLlamaCuda *L)
{
  g_return_val_if_fail (L != NULL, 0);
  return L->ws_bytes;
}

gboolean
stow_llama_cuda_check (StowLlamaCuda *L, GError **error)
{
  g_return_val_if_fail (L != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);
  /* A fault of work already done shows here without waiting for the rest. */
  cudaError_t e = cudaStreamQuery (L->stream);
  if (e != cudaErrorNotReady)
    stow_llama_cuda_ok (L, e, "stream");
  if (L->error != NULL)
    {
      g_propagate_error (error, g_error_copy (L->error));
      return FALSE;
    }
  return TRUE;
}

/* ---- optimizer ---------------------------------------------------------------- */

/* stow_f16_to_f32 and stow_f32_to_f16 (offload/adam.c), integer for
 * integer. */
static __device__ float
f16_load (uint16_t h)
{
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f)
    return __uint_as_float (sign | 0x7f800000u | (m << 13));
  if (e == 0)
    {
      float f = __fmul_rn ((float)m, 5.9604644775390625e-8f);
      return sign ? -f : f;
    }
  return __uint_as_float (sign | ((e + 112) << 23) | (m << 13));
}

static __device__ uint16_t
f16_round (float x)
{
  uint32_t b = __float_as_uint (x);
  uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u)
    return 0x7e00;
  if (a >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u)
    {
      uint32_t r = a - (112u << 23);
      return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
  if (a <= 0x33000000u)
    return (uint16_t)sign;
  uint32_t e = a >> 23;
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e;
  uint32_t hv = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (hv & 1u)))
    hv++;
  return (uint16_t)(sign | hv);
}

static __device__ __forceinline__ float
grad_load (const void *g, int type, guint64 i)
{
  switch (type)
    {
    case STOW_DTYPE_BF16:
      return stow_cuda_bf16_load (((const uint16_t *)g)[i]);
    case STOW_DTYPE_F16:
      return f16_load (((const uint16_t *)g)[i]);
    default:
      return ((const float *)g)[i];
    }
}

/* One block of stow_adam_grad_sumsq: lane l (a thread) sums the squares of
 * elements begin + l, begin + l + 16, ... in order (begin is a multiple of
 * 64, so this is adam.c's i % 16), then thread 0 adds the lanes 0..15. */
static __global__ void
sumsq_block_kernel (const void *g, int type, guint64 n, guint64 block,
                    double *part)
{
  __shared__ double lanes[STOW_CUDA_SUMSQ_LANES];
  guint64 begin = (guint64)blockIdx.x * block;
  guint64 end = MIN (begin + block, n);
  double acc = 0;
  for (guint64 i = begin + threadIdx.x; i < end; i += STOW_CUDA_SUMSQ_LANES)
    {
      double x = (double)grad_load (g, type, i);
      acc = __dadd_rn (acc, __dmul_rn (x, x));
    }
  lanes[threadIdx.x] = acc;
  __syncthreads ();
  if (threadIdx.x == 0)
    {
      double s = 0;
      for (int l = 0; l < STOW_CUDA_SUMSQ_LANES; l++)
        s = __dadd_rn (s, lanes[l]);
      part[blockIdx.x] = s;
    }
}

static __global__ void
sumsq_final_kernel (guint64 n_blocks, const double *part,
                    StowCudaOptimState *state)
{
  double s = 0;
  for (guint64 b = 0; b < n_blocks; b++)
    s = __dadd_rn (s, part[b]);
  state->sumsq = __dadd_rn (state->sumsq, s);
}

void
stow_llama_cuda_grad_sumsq (StowLlamaCuda *L, const void *grad,
                            StowDtype type, guint64 n,
                            StowCudaOptimState *state)
{
  g_return_if_fail (L != NULL && state != NULL && (grad != NULL || n == 0));
  g_return_if_fail (type == STOW_DTYPE_F32 || type == STOW_DTYPE_BF16
                    || type == STOW_DTYPE_F16);
  if (L->error != NULL || n == 0)
    return;
  /* adam.c's blocks: a multiple of 64, at least SUMSQ_MIN_BLOCK, at most
   * SUMSQ_MAX_BLOCKS of them. */
  guint64 block = (n + STOW_CUDA_SUMSQ_MAX_BLOCKS - 1)
                  / STOW_CUDA_SUMSQ_MAX_BLOCKS;
  block = (block + 63) / 64 * 64;
  block = MAX (block, (guint64)STOW_CUDA_SUMSQ_MIN_BLOCK);
  guint64 n_blocks = (n + block - 1) / block;
  sumsq_block_kernel<<<(unsigned)n_blocks, STOW_CUDA_SUMSQ_LANES, 0,
                       L->stream>>> (grad, (int)type, n, block, L->sumsq_part);
  stow_llama_cuda_launched (L, "grad_sumsq (blocks)");
  sumsq_final_kernel<<<1, 1, 0, L->stream>>> (n_blocks, L->sumsq_part, state);
  stow_llama_cuda_launched (L, "grad_sumsq");
}

/* stow_adam_clip_coef and stow_adam_grads_ok, in double as there. */
static __global__ void
clip_kernel (double loss_scale, double max_norm, StowCudaOptimState *state)
{
  double sumsq = state->sumsq;
  double norm = __ddiv_rn (__dsqrt_rn (sumsq), loss_scale);
  double coef = 1.0;
  if (max_norm > 0)
    {
      double c = __ddiv_rn (max_norm, __dadd_rn (norm, 1e-6));
      coef = c < 1.0 ? c : 1.0;
    }
  bool ok = isfinite (sumsq) && loss_scale > 0 && coef >= 0;
  if (ok)
    {
      double gs = (double)(float)__ddiv_rn (coef, loss_scale);
      ok = __dmul_rn (__dsqrt_rn (sumsq), gs)
           <= STOW_ADAM_GRAD_LIMIT / 2;
    }
  state->norm = norm;
  state->clip_coef = coef;
  state->skip = ok ? 0 : 1;
}

void
stow_llama_cuda_clip (StowLlamaCuda *L, double loss_scale, double max_norm,
                      StowCudaOptimState *state)
{
  g_return_if_fail (L != NULL && state != NULL);
  if (L->error != NULL)
    return;
  clip_kernel<<<1, 1, 0, L->stream>>> (loss_scale, max_norm, state);
  stow_llama_cuda_launched (L, "clip");
}

/* adam.c's AdamArgs: the per-step constants, rounded once from double on
 * the host (gs, from the device's clip_coef, is rounded in the kernel). */
typedef struct
{
  double loss_scale;
  bool l2;
  float wd, b1, omb1, b2, omb2, rbc2, eps, decay, neg_step;
} AdamArgs;

/* adam_one (offload/adam.c), operation for operation. */
static __global__ void
adam_kernel (AdamArgs a, guint64 n, float *param, float *m, float *v,
             const void *grad, int grad_type, void *out, int out_type,
             const StowCudaOptimState *state)
{
  if (state->skip)
    return;
  float gs = (float)__ddiv_rn (state->clip_coef, a.loss_scale);
  for (guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (guint64)gridDim.x * blockDim.x)
    {
      float g = __fmul_rn (grad_load (grad, grad_type, i), gs);
      float p = param[i];
      if (a.l2)
        g = __fmaf_rn (a.wd, p, g);
      float mi = __fmaf_rn (a.b1, m[i], __fmul_rn (a.omb1, g));
      float vi = __fmaf_rn (a.b2, v[i], __fmul_rn (a.omb2, __fmul_rn (g, g)));
      float denom = __fmaf_rn (__fsqrt_rn (vi), a.rbc2, a.eps);
      p = __fmul_rn (p, a.decay);
      p = __fmaf_rn (a.neg_step, __fdiv_rn (mi, denom), p);
      param[i] = p;
      m[i] = mi;
      v[i] = vi;
      switch (out_type)
        {
        case STOW_DTYPE_F32:
          ((float *)out)[i] = p;
          break;
        case STOW_DTYPE_BF16:
          ((uint16_t *)out)[i] = stow_cuda_bf16_round (p);
          break;
        case STOW_DTYPE_F16:
          ((uint16_t *)out)[i] = f16_round (p);
          break;
        default:
          break;
        }
    }
}

void
stow_llama_cuda_adam (StowLlamaCuda *L, const StowAdamConfig *config,
                      const StowAdamStep *step, const StowAdamTensor *t,
                      const StowCudaOptimState *state)
{
  g_return_if_fail (L != NULL && config != NULL && step != NULL && t != NULL
                    && state != NULL);
  g_return_if_fail (step->step >= 1 && step->loss_scale > 0);
  g_return_if_fail (t->grad_type == STOW_DTYPE_F32
                    || t->grad_type == STOW_DTYPE_BF16
                    || t->grad_type == STOW_DTYPE_F16);
  g_return_if_fail ((t->out_type == STOW_DTYPE_NONE) == (t->param_out == NULL));
  if (L->error != NULL || t->n == 0)
    return;
  g_return_if_fail (t->param && t->m && t->v && t->grad);
  /* adam.c's stow_adam_step_raw, constant for constant. */
  double tt = (double)step->step;
  double bc1 = config->bias_correction ? 1.0 - pow (config->beta1, tt) : 1.0;
  double bc2 = config->bias_correction ? 1.0 - pow (config->beta2, tt) : 1.0;
  AdamArgs a;
  a.loss_scale = step->loss_scale;
  a.l2 = config->mode == STOW_ADAM_L2 && config->weight_decay > 0;
  a.wd = (float)config->weight_decay;
  a.b1 = (float)config->beta1;
  a.omb1 = (float)(1.0 - config->beta1);
  a.b2 = (float)config->beta2;
  a.omb2 = (float)(1.0 - config->beta2);
  a.rbc2 = (float)(1.0 / sqrt (bc2));
  a.eps = (float)config->eps;
  a.decay = config->mode == STOW_ADAM_ADAMW
                ? (float)(1.0 - config->lr * config->weight_decay)
                : 1.0f;
  a.neg_step = (float)(-config->lr / bc1);
  adam_kernel<<<grid_for (t->n), 256, 0, L->stream>>> (
      a, t->n, t->param, t->m, t->v, t->grad, (int)t->grad_type, t->param_out,
      (int)t->out_type, state);
  stow_llama_cuda_launched (L, "adam");
}
