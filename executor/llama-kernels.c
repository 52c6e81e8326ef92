/* SPDX-License-Identifier: MIT
 *
 * executor/llama-kernels.c: the decoder runtime's building blocks: the GEMM
 * front end (tiles of executor/gemm.h's kernels; bf16 operands in bf16
 * where the kernel multiplies bf16, else staged to fp32 in bounded blocks), the
 * row kernels (RMSNorm, rotary, SwiGLU, forward and backward) and the column
 * reductions behind bias and norm-weight gradients.  Each kernel's result
 * depends on its inputs only, never on the thread count nor on which
 * thread runs which part: every loop's items (tiles, rows, column blocks)
 * are computed whole by one thread each, handed out dynamically, so that
 * a thread a loaded machine deschedules holds the others up for one item,
 * not for its whole static share.
 */
#include "executor/llama-private.h"

#include <omp.h>

#include "core/dtype-simd.h"

/* ---- staging ------------------------------------------------------------- */

STOW_LLAMA_VEC static void
bf16_to_f32_n (const guint16 *src, float *dst, guint64 n)
{
#pragma omp simd
  for (guint64 i = 0; i < n; i++)
    dst[i] = stow_bf16_to_f32 (src[i]);
}

STOW_LLAMA_VEC static void
f32_to_bf16_n (const float *src, guint16 *dst, guint64 n)
{
#pragma omp simd
  for (guint64 i = 0; i < n; i++)
    dst[i] = stow_f32_to_bf16 (src[i]);
}

/* The whole 16-element blocks of @n floats, rounded to bf16 at @dst
 * (32-byte aligned) with non-temporal stores (core/dtype-simd.h: the
 * scalar rule's bits); the elements done. */
__attribute__ ((target ("avx512f"))) static guint64
stream_blocks_avx512 (const float *src, guint16 *dst, guint64 n)
{
  guint64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_stream_si256 ((__m256i *)(dst + i),
                         stow_bf16_round_16 (_mm512_loadu_ps (src + i)));
  return i;
}

/* The same with AVX2: two vectors of 8, packed into one. */
__attribute__ ((target ("avx2"))) static guint64
stream_blocks_avx2 (const float *src, guint16 *dst, guint64 n)
{
  guint64 i = 0;
  for (; i + 16 <= n; i += 16)
    {
      __m256i lo = stow_bf16_round_8 (_mm256_loadu_ps (src + i));
      __m256i hi = stow_bf16_round_8 (_mm256_loadu_ps (src + i + 8));
      /* Each lane is at most 0xffff: the saturating pack is exact; it
       * interleaves the 128-bit halves, which the permutation undoes. */
      __m256i h = _mm256_permute4x64_epi64 (_mm256_packus_epi32 (lo, hi),
                                            _MM_SHUFFLE (3, 1, 2, 0));
      _mm256_stream_si256 ((__m256i *)(dst + i), h);
    }
  return i;
}

/* The whole 16-float blocks of @n floats copied to @dst (64-byte
 * aligned) with non-temporal stores; the elements done. */
__attribute__ ((target ("avx512f"))) static guint64
copy_blocks_avx512 (const float *src, float *dst, guint64 n)
{
  guint64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_stream_ps (dst + i, _mm512_loadu_ps (src + i));
  return i;
}

void
stow_llama_copy_stream (const float *src, float *dst, guint64 n)
{
  guint64 i = 0;
  if (__builtin_cpu_supports ("avx512f"))
    {
      for (; i < n && ((guintptr)(dst + i) & 63) != 0; i++)
        dst[i] = src[i];
      i += copy_blocks_avx512 (src + i, dst + i, n - i);
    }
  memcpy (dst + i, src + i, (n - i) * sizeof (float));
}

/* @blocks between the plain rule's unaligned head and tail. */
static void
round_stream_with (guint64 (*blocks) (const float *, guint16 *, guint64),
                   const float *src, guint16 *dst, guint64 n)
{
  guint64 i = 0;
  for (; i < n && ((guintptr)(dst + i) & 31) != 0; i++)
    dst[i] = stow_f32_to_bf16 (src[i]);
  i += blocks (src + i, dst + i, n - i);
  for (; i < n; i++)
    dst[i] = stow_f32_to_bf16 (src[i]);
}

void
stow_llama_round_stream_avx2 (const float *src, guint16 *dst, guint64 n)
{
  round_stream_with (stream_blocks_avx2, src, dst, n);
}

void
stow_llama_round_stream (const float *src, guint16 *dst, guint64 n)
{
  if (__builtin_cpu_supports ("avx512f"))
    round_stream_with (stream_blocks_avx512, src, dst, n);
  else if (__builtin_cpu_supports ("avx2"))
    round_stream_with (stream_blocks_avx2, src, dst, n);
  else
    f32_to_bf16_n (src, dst, n);
}

const float *
stow_llama_row_in (const StowLlama *L, const void *p, guint64 ld, guint64 r,
                   guint64 width, float *tmp)
{
  if (!L->bf16)
    return (const float *)p + r * ld;
  bf16_to_f32_n ((const guint16 *)p + r * ld, tmp, width);
  return tmp;
}

void
stow_llama_store (const StowLlama *L, const float *src, void *dst, guint64 n)
{
  if (L->bf16)
    f32_to_bf16_n (src, dst, n);
  else if (src != dst)
    memcpy (dst, src, n * sizeof (float));
}

float
stow_llama_load1 (const StowLlama *L, const void *p, guint64 i)
{
  return L->bf16 ? stow_bf16_to_f32 (((const guint16 *)p)[i])
                 : ((const float *)p)[i];
}

float *
stow_llama_thread_ws (const StowLlama *L, guint t)
{
  return L->thread_ws + (guint64)t * L->thread_floats;
}

/* ---- GEMM ---------------------------------------------------------------- */

/* Row @r of a C block, columns [c0, c0 + cols), fp32: R's row + bias, or
 * zero when neither. */
static void
init_row (const StowLlama *L, float *c, const void *R, gboolean r_bf16,
          guint64 ldr, guint64 r, guint64 c0, guint64 cols, const void *bias)
{
  if (R == NULL)
    memset (c, 0, cols * sizeof (float));
  else if (r_bf16)
    bf16_to_f32_n ((const guint16 *)R + r * ldr + c0, c, cols);
  else if ((const float *)R + r * ldr + c0 != c)
    memcpy (c, (const float *)R + r * ldr + c0, cols * sizeof (float));
  if (bias == NULL)
    return;
  if (L->bf16)
    {
      const guint16 *b = (const guint16 *)bias + c0;
#pragma omp simd
      for (guint64 j = 0; j < cols; j++)
        c[j] += stow_bf16_to_f32 (b[j]);
    }
  else
    {
      const float *b = (const float *)bias + c0;
#pragma omp simd
      for (guint64 j = 0; j < cols; j++)
        c[j] += b[j];
    }
}

/* C block (rows, cols) fp32 = R block + bias, or the old C when
 * @from_c; zero when neither. */
static void
init_block (const StowLlama *L, float *cf, guint64 ldcf, guint64 rows,
            guint64 cols, const void *R, gboolean r_bf16, guint64 ldr,
            guint64 m0, guint64 n0, const void *bias)
{
#pragma omp parallel for schedule(dynamic, 16) num_threads(L->n_threads)
  for (guint64 i = 0; i < rows; i++)
    init_row (L, cf + i * ldcf, R, r_bf16, ldr, m0 + i, n0, cols, bias);
}

/* The tiles of a product (M, N) that one thread each computes with a
 * single-threaded kernel.  The tiling depends on the shape (and the
 * kernel) alone: a library's sums depend on how a product is split (and
 * its own threads split it by their count), so this keeps the bits
 * independent of the thread count, and keeps one thread pool (OpenMP's)
 * busy instead of two spinning against each other.
 *
 * OpenBLAS: 128 rows by 1024 columns, narrower while the product has
 * fewer than 16 tiles so that a short one (the loss's chunk of tokens)
 * still spreads over the threads.  oneDNN: up to 256 by 512, equal sizes
 * in steps of 16 rows or 64 columns, split further while there are fewer
 * than 4: its kernels pack B once per tile, so fewer, larger tiles run
 * nearer its peak (on the bench model's twelve shapes, 2 threads, 6% less
 * CPU time than splitting to 8); fewer tiles than threads would leave
 * threads idle. */
static void
tile_shape (guint64 M, guint64 N, guint64 *tm, guint64 *tn)
{
#define TILES(a, b) (((M + (a)-1) / (a)) * ((N + (b)-1) / (b)))
  if (stow_gemm_choice ()->f32 == STOW_GEMM_OPENBLAS)
    {
      guint64 pm = 128, pn = 1024;
      while (pn > 128 && TILES (pm, pn) < 16)
        pn /= 2;
      while (pm > 32 && TILES (pm, pn) < 16)
        pm /= 2;
      *tm = pm, *tn = pn;
      return;
    }
  guint64 pm = STOW_LLAMA_TILE_M, pn = STOW_LLAMA_TILE_N;
  while (pn > 128 && TILES (pm, pn) < 4)
    pn /= 2;
  while (pm > 64 && TILES (pm, pn) < 4)
    pm /= 2;
#undef TILES
  /* The same count of tiles, of equal sizes: no sliver of a few rows. */
  guint64 nm = (M + pm - 1) / pm, nn = (N + pn - 1) / pn;
  *tm = MIN (pm, ((M + nm - 1) / nm + 15) / 16 * 16);
  *tn = MIN (pn, ((N + nn - 1) / nn + 63) / 64 * 64);
}

static void
tiled_sgemm (const StowLlama *L, gboolean ta, gboolean tb, guint64 M, guint64 N,
             guint64 K, float alpha, const float *A, guint64 lda,
             const float *B, guint64 ldb, float beta, float *C, guint64 ldc)
{
  guint64 tm, tn;
  tile_shape (M, N, &tm, &tn);
  guint64 n_m = (M + tm - 1) / tm, n_n = (N + tn - 1) / tn;
#pragma omp parallel for schedule(dynamic) num_threads(L->n_threads)
  for (guint64 t = 0; t < n_m * n_n; t++)
    {
      guint64 m0 = t / n_n * tm, n0 = t % n_n * tn;
      guint64 mb = MIN (tm, M - m0), nb = MIN (tn, N - n0);
      const float *a = A + (ta ? m0 : m0 * lda);
      const float *b = B + (tb ? n0 * ldb : n0);
      stow_gemm_f32 (ta, tb, mb, nb, K, alpha, a, lda, b, ldb, beta,
                     C + m0 * ldc + n0, ldc);
    }
}

/* Rows [r0, r0 + rows) and columns [c0, c0 + cols) of a stored matrix
 * (bf16 when @bf16) to @dst (rows, cols) fp32, on the calling thread. */
static void
stage_panel (const void *src, gboolean bf16, guint64 ld, guint64 r0, guint64 c0,
             guint64 rows, guint64 cols, float *dst)
{
  for (guint64 i = 0; i < rows; i++)
    {
      if (bf16)
        bf16_to_f32_n ((const guint16 *)src + (r0 + i) * ld + c0,
                       dst + i * cols, cols);
      else
        memcpy (dst + i * cols, (const float *)src + (r0 + i) * ld + c0,
                cols * sizeof (float));
    }
}

/* Operand @X's stored block for op(X) rows [r0, r0 + rows) and columns
 * [c0, c0 + cols), in fp32: a pointer into X (fp32) or staged in @panel
 * (bf16), with its row stride in *@ld. */
static const float *
operand_panel (StowMat X, guint64 r0, guint64 c0, guint64 rows, guint64 cols,
               float *panel, guint64 *ld)
{
  guint64 sr = X.trans ? c0 : r0, sc = X.trans ? r0 : c0;
  guint64 nr = X.trans ? cols : rows, nc = X.trans ? rows : cols;
  if (!X.bf16)
    {
      *ld = X.ld;
      return (const float *)X.p + sr * X.ld + sc;
    }
  stage_panel (X.p, TRUE, X.ld, sr, sc, nr, nc, panel);
  *ld = nc;
  return panel;
}

/* A product with a bf16 operand or C: tiles of C (tile_shape), each one
 * thread's, in one parallel region.  A tile is summed in fp32 (in C when
 * it is fp32, else in the thread's tile buffer, rounded once at the end;
 * a fresh fp32 C of the bf16 kernel in the tile too, copied out):
 * by one call of the bf16 kernel over the whole K when both operands are
 * bf16 and the kernel multiplies bf16; else by the fp32 kernel, over the
 * whole K when both operands are fp32 and over blocks of
 * STOW_LLAMA_STAGE_K of K, staged to fp32 in the thread's panels, when one
 * is bf16 (a bf16 value is exact in fp32).  Every sum's order follows the
 * shape: the bits do not depend on the thread count. */
static void
tiled_product (StowLlama *L, guint64 M, guint64 N, guint64 K, float alpha,
               StowMat A, StowMat B, void *C, gboolean c_bf16, guint64 ldc,
               gboolean accumulate, gboolean init, const void *R, guint64 ldr,
               const void *bias)
{
  gboolean native
      = A.bf16 && B.bf16 && K > 0 && stow_gemm_choice ()->bf16_native;
  /* Summed in the thread's tile: a bf16 C, and a fresh fp32 C of the bf16
   * kernel, which is then streamed past the caches (the loss's logits:
   * oneDNN's plain stores read each line in first; 613-639 -> 953-1022
   * GFLOP/s on 262 x 32000 x 768 with cold operands, and bf16 GEMMs
   * 0.299-0.316 -> 0.289-0.296 s a step of the bench model in 3
   * alternating runs, the softmax's read of the logits 1 ms slower; the
   * same bits). */
  gboolean in_tile
      = c_bf16 || (native && !accumulate && !init && L->tile_ws != NULL);
  guint64 kb_max = A.bf16 || B.bf16 ? STOW_LLAMA_STAGE_K : MAX (K, 1);
  guint64 tm, tn;
  tile_shape (M, N, &tm, &tn);
  /* OpenBLAS's tiles are wider than the buffers: narrowed (still by the
   * shape alone). */
  tm = MIN (tm, STOW_LLAMA_TILE_M);
  tn = MIN (tn, STOW_LLAMA_TILE_N);
  guint64 n_m = (M + tm - 1) / tm, n_n = (N + tn - 1) / tn;
  const guint64 TILE = (guint64)STOW_LLAMA_TILE_M * STOW_LLAMA_TILE_N;
  const guint64 PANEL
      = (guint64)(STOW_LLAMA_TILE_M + STOW_LLAMA_TILE_N) * STOW_LLAMA_STAGE_K;
#pragma omp parallel num_threads(L->n_threads)
  {
    guint64 th = (guint64)omp_get_thread_num ();
    float *tile = L->tile_ws + th * TILE;
    float *pa = L->panel_ws + th * PANEL;
    float *pb = pa + (guint64)STOW_LLAMA_TILE_M * STOW_LLAMA_STAGE_K;
#pragma omp for schedule(dynamic)
    for (guint64 t = 0; t < n_m * n_n; t++)
      {
        guint64 m0 = t / n_n * tm, n0 = t % n_n * tn;
        guint64 mb = MIN (tm, M - m0), nb = MIN (tn, N - n0);
        float *cf = in_tile ? tile : (float *)C + m0 * ldc + n0;
        guint64 ldcf = in_tile ? nb : ldc;
        for (guint64 i = 0; i < mb; i++)
          {
            float *c = cf + i * ldcf;
            if (accumulate && c_bf16)
              bf16_to_f32_n ((const guint16 *)C + (m0 + i) * ldc + n0, c, nb);
            else if (init || (!accumulate && K == 0))
              init_row (L, c, R, c_bf16, ldr, m0 + i, n0, nb, bias);
          }
        gboolean have = init || accumulate;
        if (native)
          stow_gemm_bf16 (A.trans, B.trans, mb, nb, K, alpha,
                          (const guint16 *)A.p + (A.trans ? m0 : m0 * A.ld),
                          A.ld,
                          (const guint16 *)B.p + (B.trans ? n0 * B.ld : n0),
                          B.ld, have ? 1.0f : 0.0f, cf, ldcf);
        else
          for (guint64 k0 = 0; k0 < K; k0 += kb_max)
            {
              guint64 kb = MIN (kb_max, K - k0), lda, ldb;
              const float *ap = operand_panel (A, m0, k0, mb, kb, pa, &lda);
              const float *bp = operand_panel (B, k0, n0, kb, nb, pb, &ldb);
              stow_gemm_f32 (A.trans, B.trans, mb, nb, kb, alpha, ap, lda, bp,
                             ldb, have || k0 > 0 ? 1.0f : 0.0f, cf, ldcf);
            }
        if (in_tile)
          {
            /* A bf16 C that was added to was read in above: stored in
             * place; a fresh C goes past the caches. */
            for (guint64 i = 0; i < mb; i++)
              {
                const float *row = cf + i * nb;
                guint64 at = (m0 + i) * ldc + n0;
                if (!c_bf16)
                  stow_llama_copy_stream (row, (float *)C + at, nb);
                else if (accumulate)
                  f32_to_bf16_n (row, (guint16 *)C + at, nb);
                else
                  stow_llama_round_stream (row, (guint16 *)C + at, nb);
              }
            /* The streamed rows reach memory before any thread reads them
             * (non-temporal stores are not ordered with the others). */
            _mm_sfence ();
          }
      }
  }
}

void
stow_llama_gemm (StowLlama *L, guint64 M, guint64 N, guint64 K, float alpha,
                 StowMat A, StowMat B, void *C, gboolean c_bf16, guint64 ldc,
                 gboolean accumulate, const void *R, guint64 ldr,
                 const void *bias)
{
  if (M == 0 || N == 0)
    return;
  gboolean ta = A.trans, tb = B.trans;
  gboolean init = !accumulate && (R != NULL || bias != NULL);

  if (!A.bf16 && !B.bf16 && !c_bf16)
    {
      float *c = C;
      if (init)
        init_block (L, c, ldc, M, N, R, FALSE, ldr, 0, 0, bias);
      if (K == 0)
        {
          if (!init && !accumulate)
            init_block (L, c, ldc, M, N, NULL, FALSE, 0, 0, 0, NULL);
          return;
        }
      tiled_sgemm (L, ta, tb, M, N, K, alpha, A.p, A.ld, B.p, B.ld,
                   init || accumulate ? 1.0f : 0.0f, c, ldc);
      return;
    }
  if (K == 0 && accumulate)
    return;
  tiled_product (L, M, N, K, alpha, A, B, C, c_bf16, ldc, accumulate, init, R,
                 ldr, bias);
}

/* ---- softmax rows -------------------------------------------------------- */

float STOW_LLAMA_VEC
stow_llama_row_max (const float *s, guint64 n)
{
  float m = s[0];
#pragma omp simd reduction(max : m)
  for (guint64 j = 0; j < n; j++)
    m = s[j] > m ? s[j] : m;
  return m;
}

void STOW_LLAMA_VEC
stow_llama_row_exp (float *s, guint64 n, float m)
{
#pragma omp simd
  for (guint64 j = 0; j < n; j++)
    s[j] = stow_llama_expf (s[j] - m);
}

void STOW_LLAMA_VEC
stow_llama_row_scale (float *s, guint64 n, float k)
{
#pragma omp simd
  for (guint64 j = 0; j < n; j++)
    s[j] *= k;
}

float
stow_llama_row_sum (const float *s, guint64 n)
{
  float l = 0;
#pragma omp simd reduction(+ : l)
  for (guint64 j = 0; j < n; j++)
    l += s[j];
  return l;
}

/* ---- RMSNorm ------------------------------------------------------------- */

static float
row_rstd (const float *x, guint64 h, float eps)
{
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (guint64 j = 0; j < h; j++)
    ss += x[j] * x[j];
  /* HF LlamaRMSNorm: rsqrt (mean (x^2) + eps) in fp32. */
  return 1.0f / sqrtf (ss / (float)h + eps);
}

/* y = w * (x * rs), in HF's order. */
STOW_LLAMA_VEC static void
norm_row (const float *w, const float *x, float rs, float *y, guint64 h)
{
#pragma omp simd
  for (guint64 j = 0; j < h; j++)
    y[j] = w[j] * (x[j] * rs);
}

/* out = [dres +] rs (w dy) - x coef. */
STOW_LLAMA_VEC static void
norm_backward_row (const float *w, const float *dy, const float *x,
                   const float *dres, float rs, float coef, float *out,
                   guint64 h)
{
  if (dres != NULL)
    {
#pragma omp simd
      for (guint64 j = 0; j < h; j++)
        out[j] = dres[j] + (rs * (w[j] * dy[j]) - x[j] * coef);
    }
  else
    {
#pragma omp simd
      for (guint64 j = 0; j < h; j++)
        out[j] = rs * (w[j] * dy[j]) - x[j] * coef;
    }
}

void
stow_llama_rms_rstd (StowLlama *L, guint64 n, guint64 h, const void *x,
                     float *rstd)
{
  float eps = (float)L->config.rms_norm_eps;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *tmp = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      rstd[r] = row_rstd (stow_llama_row_in (L, x, h, r, h, tmp), h, eps);
  }
}

void
stow_llama_rmsnorm (StowLlama *L, guint64 n, guint64 h, const void *x,
                    const void *w, void *y, gboolean y_f32, float *rstd)
{
  guint64 W = L->row_floats;
  g_assert (h <= W);
  float eps = (float)L->config.rms_norm_eps;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
    const float *wf = stow_llama_row_in (L, w, 0, 0, h, ws);
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      {
        const float *xr = stow_llama_row_in (L, x, h, r, h, ws + W);
        float rs = row_rstd (xr, h, eps);
        gboolean direct = y_f32 || !L->bf16;
        float *yr = direct ? (float *)y + r * h : ws + 2 * W;
        norm_row (wf, xr, rs, yr, h);
        if (!direct)
          stow_llama_store (L, yr, (guint16 *)y + r * h, h);
        if (rstd != NULL)
          rstd[r] = rs;
      }
  }
}

void
stow_llama_rmsnorm_backward (StowLlama *L, guint64 n, guint64 h, const void *dy,
                             gboolean dy_f32, const void *x, const void *w,
                             const float *rstd, const void *dres, void *dx)
{
  guint64 W = L->row_floats;
  g_assert (h <= W);
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
    const float *wf = stow_llama_row_in (L, w, 0, 0, h, ws);
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      {
        const float *dyr = dy_f32 ? (const float *)dy + r * h
                                  : stow_llama_row_in (L, dy, h, r, h, ws + W);
        const float *xr = stow_llama_row_in (L, x, h, r, h, ws + 2 * W);
        float rs = rstd[r];
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (guint64 j = 0; j < h; j++)
          dot += wf[j] * dyr[j] * xr[j];
        /* d/dx_j of w_j x_j r with r = (mean (x^2) + eps)^-1/2:
         * r w_j dy_j - x_j r^3 / h sum_i w_i dy_i x_i. */
        float coef = dot * rs * rs * rs / (float)h;
        float *out = L->bf16 ? ws + 3 * W : (float *)dx + r * h;
        const float *dr = NULL;
        if (dres != NULL)
          dr = L->bf16 ? stow_llama_row_in (L, dres, h, r, h, out)
                       : (const float *)dres + r * h;
        norm_backward_row (wf, dyr, xr, dr, rs, coef, out, h);
        if (L->bf16)
          stow_llama_store (L, out, (guint16 *)dx + r * h, h);
      }
  }
}

/* ---- rotary embeddings --------------------------------------------------- */

/* HF's rotate-half: for i < d/2, out_i = x_i cos - x_{i+d/2} sin and
 * out_{i+d/2} = x_{i+d/2} cos + x_i sin; the inverse rotates by -angle,
 * which is also the rotation's transpose (its backward). */
STOW_LLAMA_VEC static void
rope_row (float *x, const float *cs, const float *sn, guint64 heads, guint64 d,
          gboolean inverse)
{
  guint64 half = d / 2;
  float sign = inverse ? -1.0f : 1.0f;
  for (guint64 hd = 0; hd < heads; hd++)
    {
      float *a = x + hd * d, *b = a + half;
#pragma omp simd
      for (guint64 i = 0; i < half; i++)
        {
          float x1 = a[i], x2 = b[i], s = sign * sn[i];
          a[i] = x1 * cs[i] - x2 * s;
          b[i] = x2 * cs[i] + x1 * s;
        }
    }
}

void
stow_llama_rope (StowLlama *L, guint64 n, guint64 seq, guint64 heads, void *p,
                 gboolean inverse)
{
  guint64 d = L->config.head_dim, half = d / 2, width = heads * d;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      {
        guint64 t = r % seq;
        float *row = L->bf16 ? ws : (float *)p + r * width;
        if (L->bf16)
          stow_llama_row_in (L, p, width, r, width, ws);
        rope_row (row, L->rope_cos + t * half, L->rope_sin + t * half, heads, d,
                  inverse);
        if (L->bf16)
          stow_llama_store (L, row, (guint16 *)p + r * width, width);
      }
  }
}

/* ---- SwiGLU -------------------------------------------------------------- */

/* a = silu (g) u, silu (g) = g / (1 + exp (-g)) as torch computes it. */
STOW_LLAMA_VEC static void
swiglu_row (const float *g, const float *u, float *a, guint64 f)
{
#pragma omp simd
  for (guint64 j = 0; j < f; j++)
    a[j] = g[j] / (1.0f + stow_llama_expf (-g[j])) * u[j];
}

/* From da: g becomes dL/dgate and u dL/dup, with s = sigmoid (g) and
 * d silu/dg = s (1 + g (1 - s)). */
STOW_LLAMA_VEC static void
swiglu_backward_row (const float *da, float *g, float *u, guint64 f)
{
#pragma omp simd
  for (guint64 j = 0; j < f; j++)
    {
      float s = 1.0f / (1.0f + stow_llama_expf (-g[j]));
      float dg = da[j] * u[j] * (s * (1.0f + g[j] * (1.0f - s)));
      u[j] = da[j] * (g[j] * s);
      g[j] = dg;
    }
}

void
stow_llama_swiglu (StowLlama *L, guint64 n, const void *gate, const void *up,
                   void *act)
{
  guint64 f = L->config.ffn, W = L->row_floats;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      {
        const float *g = stow_llama_row_in (L, gate, f, r, f, ws);
        const float *u = stow_llama_row_in (L, up, f, r, f, ws + W);
        float *a = L->bf16 ? ws + 2 * W : (float *)act + r * f;
        swiglu_row (g, u, a, f);
        if (L->bf16)
          stow_llama_store (L, a, (guint16 *)act + r * f, f);
      }
  }
}

void
stow_llama_swiglu_backward (StowLlama *L, guint64 n, const void *dact,
                            void *gate, void *up)
{
  guint64 f = L->config.ffn, W = L->row_floats;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(dynamic, 16)
    for (guint64 r = 0; r < n; r++)
      {
        const float *da = stow_llama_row_in (L, dact, f, r, f, ws);
        float *g = L->bf16 ? ws + W : (float *)gate + r * f;
        float *u = L->bf16 ? ws + 2 * W : (float *)up + r * f;
        if (L->bf16)
          {
            stow_llama_row_in (L, gate, f, r, f, g);
            stow_llama_row_in (L, up, f, r, f, u);
          }
        swiglu_backward_row (da, g, u, f);
        if (L->bf16)
          {
            stow_llama_store (L, g, (guint16 *)gate + r * f, f);
            stow_llama_store (L, u, (guint16 *)up + r * f, f);
          }
      }
  }
}

/* ---- column reductions --------------------------------------------------- */

/* Adds to acc (cw) the column sums of columns [c0, c0 + cw) of y.  Each
 * column sums its rows in order, whatever the vector width. */
STOW_LLAMA_VEC static void
colsum_block (const StowLlama *L, guint64 n, guint64 cols, const void *y,
              gboolean y_bf16, const void *x, const float *rstd, guint64 c0,
              guint64 cw, double *acc)
{
  float xs[STOW_LLAMA_COL_BLOCK], ys[STOW_LLAMA_COL_BLOCK];
  for (guint64 r = 0; r < n; r++)
    {
      guint64 o = r * cols + c0;
      if (y_bf16)
#pragma omp simd
        for (guint64 c = 0; c < cw; c++)
          ys[c] = stow_bf16_to_f32 (((const guint16 *)y)[o + c]);
      else
        memcpy (ys, (const float *)y + o, cw * sizeof (float));
      if (x != NULL)
        {
          /* x * rstd rounded to fp32 as the forward's normalised x was. */
          float rs = rstd[r];
          if (L->bf16)
#pragma omp simd
            for (guint64 c = 0; c < cw; c++)
              xs[c] = stow_bf16_to_f32 (((const guint16 *)x)[o + c]) * rs;
          else
#pragma omp simd
            for (guint64 c = 0; c < cw; c++)
              xs[c] = ((const float *)x)[o + c] * rs;
#pragma omp simd
          for (guint64 c = 0; c < cw; c++)
            acc[c] += (double)ys[c] * (double)xs[c];
        }
      else
#pragma omp simd
        for (guint64 c = 0; c < cw; c++)
          acc[c] += (double)ys[c];
    }
}

void
stow_llama_colsum_acc (StowLlama *L, guint64 n, guint64 cols, const void *y,
                       gboolean y_f32, const void *x, const float *rstd,
                       double *acc)
{
  const guint64 CB = STOW_LLAMA_COL_BLOCK;
  guint64 n_blocks = (cols + CB - 1) / CB;
#pragma omp parallel for schedule(dynamic) num_threads(L->n_threads)
  for (guint64 cb = 0; cb < n_blocks; cb++)
    colsum_block (L, n, cols, y, L->bf16 && !y_f32, x, rstd, cb * CB,
                  MIN (CB, cols - cb * CB), acc + cb * CB);
}

void
stow_llama_colsum (StowLlama *L, guint64 n, guint64 cols, const void *y,
                   gboolean y_f32, const void *x, const float *rstd, void *g,
                   gboolean accumulate)
{
  const guint64 CB = STOW_LLAMA_COL_BLOCK;
  guint64 n_blocks = (cols + CB - 1) / CB;
  /* One thread sums a block of columns over every row, in row order: the
   * bits depend on n and cols only. */
#pragma omp parallel for schedule(dynamic) num_threads(L->n_threads)
  for (guint64 cb = 0; cb < n_blocks; cb++)
    {
      double acc[STOW_LLAMA_COL_BLOCK] = { 0 };
      guint64 c0 = cb * CB, cw = MIN (CB, cols - c0);
      colsum_block (L, n, cols, y, L->bf16 && !y_f32, x, rstd, c0, cw, acc);
      for (guint64 c = 0; c < cw; c++)
        {
          double v = acc[c];
          if (accumulate)
            v += stow_llama_load1 (L, g, c0 + c);
          if (L->bf16)
            ((guint16 *)g)[c0 + c] = stow_f32_to_bf16 ((float)v);
          else
            ((float *)g)[c0 + c] = (float)v;
        }
    }
}
