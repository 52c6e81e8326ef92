/* SPDX-License-Identifier: MIT
 *
 * executor/llama-private.h: what the cpu runtime's files share (the
 * runtime's struct and workspace layout, the bf16 conversions, the GEMM
 * front end over executor/gemm.h, the row kernels and attention): the kernels
 * behind its table (executor/kernels.h).  Not a public interface:
 * executor/llama.h is.
 */
#pragma once

#include <math.h>
#include <string.h>

#include "executor/gemm.h"
#include "executor/kernel-times.h"
#include "executor/llama-expf.h"
#include "executor/llama.h"

G_BEGIN_DECLS

/* Rows of queries an attention tile holds: a (BQ, T) block of scores per
 * thread instead of (T, T), and causal blocks skip the keys past the
 * block's last query. */
#define STOW_LLAMA_ATTN_BQ 128
/* Elements of K a product with one bf16 and one fp32 operand (the loss's,
 * at bf16), or bf16 operands the kernel cannot multiply, stages to fp32 at
 * a time: each thread's panels, (TILE_M + TILE_N) STAGE_K floats, bound
 * the staging at 1.5 MiB a thread however large the operands are. */
#define STOW_LLAMA_STAGE_K 512
/* The largest tile of C one thread computes with oneDNN (llama-kernels.c's
 * tile_shape); at bf16 each thread keeps one such fp32 tile. */
#define STOW_LLAMA_TILE_M 256
#define STOW_LLAMA_TILE_N 512
/* Columns one thread sums over every row in the column reductions (bias
 * and norm-weight gradients): fixed, so the order of the additions never
 * depends on the thread count. */
#define STOW_LLAMA_COL_BLOCK 64

struct StowLlama
{
  StowDecoder decoder; /* this runtime's kernels (llama-cpu.c) */
  StowLlamaConfig config;
  StowDtype dtype;
  gboolean bf16; /* storage is bf16 (else fp32) */
  /* Attention's products in bf16 (llama-attention.c): storage is bf16 and
   * the GEMM kernel multiplies it. */
  gboolean attn_lowp;
  guint64 esize; /* bytes of one element of @dtype */
  guint64 max_seq;
  guint n_threads;

  /* Rotary tables (max_seq, d/2): cos and sin of position t times the
   * i-th inverse frequency, HF's cat(freqs, freqs) halves stored once. */
  float *rope_cos, *rope_sin;
  /* Per thread, thread_floats floats: row staging of the element-wise
   * kernels, or the attention tiles (never both at once). */
  float *thread_ws;
  guint64 thread_floats;
  guint64 row_floats; /* one row slot: max (h, f, a d) floats */
  /* Per thread, at bf16 (NULL at fp32, where operands go to the kernel
   * as they are): a STOW_LLAMA_TILE_M x STOW_LLAMA_TILE_N fp32 tile (a
   * bf16 C summed before its one rounding), and the panels an operand is
   * staged in, (TILE_M + TILE_N) STOW_LLAMA_STAGE_K floats. */
  float *tile_ws, *panel_ws;
  /* Column accumulators of the fused loss's norm gradient: (h) doubles. */
  double *col_acc;
  guint64 ws_bytes; /* everything above, as stow_llama_workspace_bytes says */
  /* STOWAGE_KERNEL_TIMES's timing table around this runtime's, and the
   * file it is written to when the runtime is freed (NULL: untimed). */
  StowKernelTimes *times;
  char *times_path;
};

/* Element-wise row loops built for AVX-512, AVX2 and the baseline, one
 * picked when the program loads (an ifunc).  Every width gives the same
 * bits: the build contracts no multiply-add (-ffp-contract=off) and each
 * element is the same IEEE operations at any width.  Loops that sum (the
 * norms' dot products, softmax's denominator) are not cloned: their order
 * of addition follows the vector width. */
#define STOW_LLAMA_VEC                                                         \
  __attribute__ ((target_clones ("avx512f", "avx2", "default")))
/* The same loop at AVX-512's full width.  The avx512f clone above keeps
 * gcc's generic tuning, which prefers 256-bit vectors (and a clone ignores
 * -mprefer-vector-width): a loop that rounds fp32 to bf16 comes out 8
 * lanes wide.  Such a loop, where the width pays, is built once more under
 * this target and run where the CPU has these AVX-512 sets; the same
 * bits, element by element. */
#define STOW_LLAMA_ZMM                                                         \
  __attribute__ ((target ("avx512f,avx512bw,avx512dq,avx512vl,"                \
                          "prefer-vector-width=512")))

/* A softmax row's parts: its largest element (exact in any order, so
 * built per width: STOW_LLAMA_VEC), s = exp (s - m) and s = k s element
 * by element (per width too), and its sum, which is not: the order of its
 * additions follows the width.  At the baseline's width gcc kept a fused
 * loop's running maximum on the stack. */
float stow_llama_row_max (const float *s, guint64 n);
void stow_llama_row_exp (float *s, guint64 n, float m);
void stow_llama_row_scale (float *s, guint64 n, float k);
float stow_llama_row_sum (const float *s, guint64 n);

/* Row i of attention's dS = P (dP - D) from S's row @p (P = exp (S -
 * lse)) over dP's @dp, zeros past @nk up to @width; P's row over S's.
 * With @pl and @dsl (bf16 products) both rounded there instead, the fp32
 * rows not written.  The STOW_LLAMA_ZMM build where the CPU has it. */
void stow_llama_row_ds (float *p, float *dp, guint64 nk, guint64 width,
                        float lse, float Di, guint16 *pl, guint16 *dsl);
/* Its STOW_LLAMA_VEC build, which other CPUs run (exposed for the tests). */
void stow_llama_row_ds_vec (float *p, float *dp, guint64 nk, guint64 width,
                            float lse, float Di, guint16 *pl, guint16 *dsl);

/* @n floats rounded to bf16 (core/dtype.h's rule, the same bits) at
 * @dst, past the caches where the CPU has AVX-512 or AVX2 (non-temporal
 * stores): a bf16 product's C, which the next kernel reads once.  A plain
 * store first reads each line in; streaming cut the bf16 products' time
 * on the bench model by 9%.  The caller fences (_mm_sfence) before
 * another thread reads @dst. */
void stow_llama_round_stream (const float *src, guint16 *dst, guint64 n);
/* Its AVX2 body, which CPUs without AVX-512 run (exposed for the tests). */
void stow_llama_round_stream_avx2 (const float *src, guint16 *dst, guint64 n);
/* @n floats copied to @dst past the caches where the CPU has AVX-512 (a
 * plain copy elsewhere): a bf16 product's fresh fp32 C, summed in the
 * thread's tile (the loss's logits).  The caller fences. */
void stow_llama_copy_stream (const float *src, float *dst, guint64 n);

/* Row @r of a (rows, width) tensor of the runtime's dtype in fp32: a
 * pointer into @p at fp32, else converted into @tmp (width floats). */
const float *stow_llama_row_in (const StowLlama *L, const void *p, guint64 ld,
                                guint64 r, guint64 width, float *tmp);
/* @n floats from @src to @dst (the runtime's dtype), rounding at bf16. */
void stow_llama_store (const StowLlama *L, const float *src, void *dst,
                       guint64 n);
/* Element @i of @p (the runtime's dtype) in fp32. */
float stow_llama_load1 (const StowLlama *L, const void *p, guint64 i);
/* Per-thread staging of thread @t: L->thread_floats floats, of which the
 * row kernels use four slots of L->row_floats. */
float *stow_llama_thread_ws (const StowLlama *L, guint t);

/* ---- GEMM -----------------------------------------------------------------
 */

/* C (M, N) = R + bias + alpha op(A) op(B) when !@accumulate (R and bias
 * may be NULL: zero), C += alpha op(A) op(B) when @accumulate.  R has C's
 * element type and @ldr; bias (N) has the runtime's dtype.  Two bf16
 * operands go to the kernel as they are where it multiplies bf16; else a
 * bf16 operand is staged to fp32 in panels; a bf16 C is rounded once,
 * after the whole K sum.  Tiles of C fixed by the shape run on L->n_threads
 * threads, each a single-threaded cblas_sgemm: the bits do not depend on the
 * thread count. */
void stow_llama_gemm (StowLlama *L, guint64 M, guint64 N, guint64 K,
                      float alpha, StowMat A, StowMat B, void *C,
                      gboolean c_bf16, guint64 ldc, gboolean accumulate,
                      const void *R, guint64 ldr, const void *bias);

/* ---- row kernels (n rows, each independent; any thread count) ------------ */

/* y (n, h) = RMSNorm (x; w) over rows of @h elements (the hidden size, or
 * head_dim for per-head norms); @rstd (n, may be NULL) gets 1/rms of each
 * row.  @y_f32: y is fp32 (else the runtime's dtype). */
void stow_llama_rmsnorm (StowLlama *L, guint64 n, guint64 h, const void *x,
                         const void *w, void *y, gboolean y_f32, float *rstd);
/* 1 / sqrt (mean (x^2) + eps) of each row of x (n, h) into @rstd (n). */
void stow_llama_rms_rstd (StowLlama *L, guint64 n, guint64 h, const void *x,
                          float *rstd);
/* dx (n, h) = @dres + d/dx of RMSNorm given dy (fp32 when @dy_f32),
 * x, w and the rows' @rstd; @dres (the runtime's dtype) may be NULL.  dx
 * may alias dy, x or dres: each row is read whole before it is written. */
void stow_llama_rmsnorm_backward (StowLlama *L, guint64 n, guint64 h,
                                  const void *dy, gboolean dy_f32,
                                  const void *x, const void *w,
                                  const float *rstd, const void *dres,
                                  void *dx);
/* Rotary embeddings in place on p (n, heads d), row r at position r % seq;
 * @inverse rotates back (the backward of the rotation). */
void stow_llama_rope (StowLlama *L, guint64 n, guint64 seq, guint64 heads,
                      void *p, gboolean inverse);
/* act (n, f) = silu (gate) * up. */
void stow_llama_swiglu (StowLlama *L, guint64 n, const void *gate,
                        const void *up, void *act);
/* From dact, gate and up (n, f): dgate over gate and dup over up. */
void stow_llama_swiglu_backward (StowLlama *L, guint64 n, const void *dact,
                                 void *gate, void *up);

/* ---- column reductions (fixed order over rows, any thread count) --------- */

/* g (cols) (+)= sum over the n rows of y (n, cols) [* x * rstd (row)]:
 * a bias gradient when @x is NULL, a norm-weight gradient otherwise.  @y
 * fp32 when @y_f32.  Rows are added in order, in double, per column. */
void stow_llama_colsum (StowLlama *L, guint64 n, guint64 cols, const void *y,
                        gboolean y_f32, const void *x, const float *rstd,
                        void *g, gboolean accumulate);
/* The same sums added to @acc (cols) doubles: the fused loss sums its
 * norm gradient over chunks this way before rounding it once. */
void stow_llama_colsum_acc (StowLlama *L, guint64 n, guint64 cols,
                            const void *y, gboolean y_f32, const void *x,
                            const float *rstd, double *acc);

/* ---- attention (executor/llama-attention.c) ------------------------------ */

/* Causal GQA attention forward over @batch sequences of @seq tokens: q
 * (n, a d), k and v (n, k d) after rotary; o (n, a d); lse (n, a). */
void stow_llama_attention_forward (StowLlama *L, guint64 batch, guint64 seq,
                                   const void *q, const void *k, const void *v,
                                   void *o, float *lse);
/* Its backward: dq (n, a d), dk and dv (n, k d) from do (n, a d) and the
 * forward's q, k, v, o and lse, recomputing the probabilities. */
void stow_llama_attention_backward (StowLlama *L, guint64 batch, guint64 seq,
                                    const void *q, const void *k, const void *v,
                                    const void *o, const float *lse,
                                    const void *dout, void *dq, void *dk,
                                    void *dv);
/* Floats of one thread's attention tiles for sequences of @max_seq. */
guint64 stow_llama_attention_thread_floats (guint64 max_seq, guint64 head_dim,
                                            gboolean lowp);

G_END_DECLS
