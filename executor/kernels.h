/* SPDX-License-Identifier: MIT
 *
 * executor/kernels.h: the kernels the decoder recipe (executor/llama.c)
 * calls, as a table each device fills in (in the style of ggml's backend
 * interface).  Two providers: the cpu runtime (executor/llama-cpu.c over
 * llama-kernels.c and llama-attention.c) and the cuda runtime
 * (executor/backends/cuda/llama-cuda.cu).  Not here: the order of the
 * kernels (the recipe's), where tensors live (the step program's).
 *
 * Conventions every entry keeps:
 * - @ctx is the provider's runtime; every pointer is the provider's memory
 *   (host for cpu, device for cuda); on cuda the call is ordered on the
 *   runtime's stream and returns at once.
 * - Tensors are row-major; n rows are tokens, token-major (row b T + t).
 *   "dtype" is the runtime's element type (fp32, or bf16 storage); a flag
 *   named *_f32 says that tensor is fp32 whatever the dtype.  Products
 *   and sums are in fp32 (or double where said), a bf16 result is rounded
 *   to nearest even once, when stored.
 * - "=" overwrites, "+=" accumulates; (+)= is "+=" when @accumulate.
 * - Determinism: the same inputs give the same bits on every call, at any
 *   thread count: reductions run over partitions fixed by the shapes.
 * - Outputs may not alias inputs unless the entry says so.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* One operand of a matrix product: @p points at element (0, 0) of the
 * stored matrix, which is op's argument transposed when @trans; @bf16:
 * bf16 storage (else fp32); @ld its row stride in elements. */
typedef struct
{
  const void *p;
  gboolean bf16;
  guint64 ld;
  gboolean trans;
} StowMat;

typedef struct
{
  const char *name;

  /* C (M, N) = R + bias + alpha op(A) op(B) when !@accumulate (R and bias
   * may be NULL: zero; K may be 0), C += alpha op(A) op(B) when
   * @accumulate (R and bias NULL).  C is bf16 when @c_bf16, with @ldc; R
   * has C's element type, (M, N) with @ldr; bias (N) has the dtype.  The
   * whole K sum is rounded once into a bf16 C. */
  void (*gemm) (void *ctx, guint64 M, guint64 N, guint64 K, float alpha,
                StowMat A, StowMat B, void *C, gboolean c_bf16, guint64 ldc,
                gboolean accumulate, const void *R, guint64 ldr,
                const void *bias);

  /* y (n, h) = w * x / sqrt (mean (x^2) + eps), HF's order (w times the
   * normalised x); y fp32 when @y_f32, else the dtype. */
  void (*rmsnorm) (void *ctx, guint64 n, const void *x, const void *w, void *y,
                   gboolean y_f32);
  /* rstd (n) fp32 = 1 / sqrt (mean (x^2) + eps) of each row of x (n, h). */
  void (*rms_rstd) (void *ctx, guint64 n, const void *x, float *rstd);
  /* dx (n, h) = dres + RMSNorm's input gradient from dy (fp32 when
   * @dy_f32), x, w and the rows' rstd; @dres (the dtype) may be NULL.  dx
   * may alias x or dres: each row is read whole before it is written. */
  void (*rmsnorm_backward) (void *ctx, guint64 n, const void *dy,
                            gboolean dy_f32, const void *x, const void *w,
                            const float *rstd, const void *dres, void *dx);
  /* Rotary embeddings in place on p (n, heads d), HF's rotate-half
   * convention, row r at position r % seq; @inverse rotates back (the
   * rotation's backward). */
  void (*rope) (void *ctx, guint64 n, guint64 seq, guint64 heads, void *p,
                gboolean inverse);
  /* act (n, f) = silu (gate) * up. */
  void (*swiglu) (void *ctx, guint64 n, const void *gate, const void *up,
                  void *act);
  /* From dact, gate and up (n, f): dL/dgate over gate, dL/dup over up. */
  void (*swiglu_backward) (void *ctx, guint64 n, const void *dact, void *gate,
                           void *up);
  /* g (cols) (+)= the sum over the n rows of y (n, cols) [* x * rstd of
   * the row]: a bias gradient when @x is NULL, a norm weight's otherwise.
   * y fp32 when @y_f32; sums in double, rows in an order fixed by n. */
  void (*colsum) (void *ctx, guint64 n, guint64 cols, const void *y,
                  gboolean y_f32, const void *x, const float *rstd, void *g,
                  gboolean accumulate);
  /* The same sums into the runtime's own (hidden) doubles, across calls:
   * zeroed by colsum_acc_zero, added to by colsum_acc, and rounded once
   * into g (cols) by colsum_acc_store ((+)=).  The fused loss sums its
   * norm gradient over chunks of tokens this way. */
  void (*colsum_acc_zero) (void *ctx);
  void (*colsum_acc) (void *ctx, guint64 n, guint64 cols, const void *y,
                      gboolean y_f32, const void *x, const float *rstd);
  void (*colsum_acc_store) (void *ctx, guint64 cols, void *g,
                            gboolean accumulate);

  /* Causal GQA attention over @batch sequences of @seq tokens: from q
   * (n, a d), k and v (n, k d) after rotary, o (n, a d) and lse (n, a)
   * fp32, the logsumexp of each query's scaled scores (flash attention's
   * saved statistic, in place of the probabilities). */
  void (*attention_forward) (void *ctx, guint64 batch, guint64 seq,
                             const void *q, const void *k, const void *v,
                             void *o, float *lse);
  /* Its backward: dq (n, a d), dk and dv (n, k d) (=) from dout (n, a d)
   * and the forward's q, k, v, o and lse. */
  void (*attention_backward) (void *ctx, guint64 batch, guint64 seq,
                              const void *q, const void *k, const void *v,
                              const void *o, const float *lse, const void *dout,
                              void *dq, void *dk, void *dv);

  /* x (n, h) = embed (V, h) [tokens (n) int32]. */
  void (*embed_forward) (void *ctx, const void *embed, const gint32 *tokens,
                         guint64 n, void *x);
  /* dembed (V, h) (+)= the rows of dx (n, h) scattered by token, each
   * token's rows added in position order. */
  void (*embed_backward) (void *ctx, const gint32 *tokens, guint64 n,
                          const void *dx, void *dembed, gboolean accumulate);

  /* Softmax cross-entropy of logits (n, V) fp32, in place: row i becomes
   * scale (softmax - onehot (targets[i])), as fp32, or, where the
   * decoder's loss_lowp says so, in the dtype in the first half of its own
   * row (ld 2 V elements).  loss (n) fp32 gets logsumexp - logit[target]
   * of each row, and *@loss_sum (a double of the provider's) += their sum,
   * in an order fixed by n.  Targets are in [0, V), or negative: an
   * ignored target (a masked one, executor/data.h), whose row becomes 0
   * and loss 0. */
  void (*xent) (void *ctx, guint64 n, float *logits, const gint32 *targets,
                float scale, float *loss, double *loss_sum);

  /* @bytes of @p = 0. */
  void (*zero) (void *ctx, void *p, guint64 bytes);
  /* Optional: TRUE once an earlier call failed (the recipe then issues
   * nothing more; the provider reports why).  NULL: kernels never fail. */
  gboolean (*failed) (void *ctx);
} StowKernels;

G_END_DECLS
