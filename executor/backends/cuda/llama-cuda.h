/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/llama-cuda.h: the cuda runtime, the cuda
 * backend's provider of the decoder's kernels (executor/kernels.h): the
 * same contracts, shapes and tensor layouts as the cpu runtime's, over
 * device pointers, every call stream-ordered on the runtime's stream (no
 * blocking copy, no device-wide synchronize, no allocation after
 * stow_llama_cuda_new).  Plus what the cpu backend takes from offload/adam.h:
 * the gradients' sum of squares, the clip coefficient and AdamW, here on the
 * device, with the per-step values (clip coefficient, skip) read from device
 * memory so the host never waits for them.
 *
 * GEMMs go through cuBLAS, loaded with dlopen on first use (so the binary
 * starts, and plans, on machines without CUDA's libraries): fp32 operands
 * with fp32 compute (no TF32) for the oracle runs, bf16 operands with fp32
 * accumulation otherwise.  Everything else is this file's own kernels.
 * Determinism: the same inputs give the same bits on every run (no atomics
 * on floats; reductions over partitions fixed by the shapes).
 *
 * Built only where the CUDA toolkit is (STOW_HAVE_CUDA); the functions take
 * and return plain C types, so C code includes this header without CUDA's.
 */
#pragma once

#include <glib.h>

#include "executor/llama.h"
#include "offload/adam.h"

G_BEGIN_DECLS

typedef struct StowLlamaCuda StowLlamaCuda;

/* Whether a CUDA device and cuBLAS can be used here; when not, FALSE with
 * the reason (no driver, no device, libcublas not found) in @error. */
gboolean stow_cuda_available (GError **error);

/* A runtime on the current device for @config at @dtype (fp32 or bf16),
 * for micro-batches of up to @max_tokens tokens and sequences of up to
 * @max_seq, issuing on @stream (a cudaStream_t; NULL: the default stream).
 * Allocates its device workspace (rotary tables, cuBLAS workspace, scratch
 * for the embedding backward and the reductions) here and never again.
 * STOW_LLAMA_ERROR_INVALID for a config the runtime cannot run,
 * STOW_BACKEND_ERROR-like failures of CUDA as STOW_LLAMA_ERROR_INVALID
 * with CUDA's message. */
StowLlamaCuda *stow_llama_cuda_new (const StowLlamaConfig *config,
                                    StowDtype dtype, guint64 max_tokens,
                                    guint64 max_seq, void *stream,
                                    GError **error);
void stow_llama_cuda_free (StowLlamaCuda *L);
/* Device bytes the runtime holds outside the caller's tensors. */
guint64 stow_llama_cuda_workspace_bytes (const StowLlamaCuda *L);
/* The first CUDA or cuBLAS error of an earlier call (sticky), or TRUE. */
gboolean stow_llama_cuda_check (StowLlamaCuda *L, GError **error);

/* The decoder over this runtime's kernels (executor/llama.h's recipe runs
 * on it; owned by @L).  Its tensors are device memory, tokens and targets
 * device int32 arrays, the loss sum a device double; every call is
 * stream-ordered.  The bf16 runtime stages the fused loss in bf16
 * (loss_lowp). */
const StowDecoder *stow_llama_cuda_decoder (StowLlamaCuda *L);

/* For tests and benchmarks: the layer's attention alone, as the layer
 * calls it.  q (batch seq, a d), k and v (batch seq, kv d), o (batch seq,
 * a d) in the runtime's dtype, token-major (row b seq + t); lse (batch
 * seq, a) fp32, the logsumexp of each (token, head)'s scaled scores.  The
 * backward overwrites dq, dk and dv (the shapes of q, k, v) from dout
 * (the shape of o).  batch seq at most max_tokens, seq at most max_seq. */
void stow_llama_cuda_attention_forward (StowLlamaCuda *L, guint64 batch,
                                        guint64 seq, const void *q,
                                        const void *k, const void *v, void *o,
                                        float *lse);
void stow_llama_cuda_attention_backward (StowLlamaCuda *L, guint64 batch,
                                         guint64 seq, const void *q,
                                         const void *k, const void *v,
                                         const void *o, const float *lse,
                                         const void *dout, void *dq, void *dk,
                                         void *dv);
/* Whether the bf16 runtime's attention runs on tensor cores (WMMA): by
 * default where the device (sm_80 or later, enough shared memory) and the
 * shape (head_dim a multiple of 16) allow; @enable FALSE forces the fp32
 * CUDA-core kernels (the same the fp32 runtime runs) for comparisons.
 * Returns whether the tensor-core path is now taken (never for fp32). */
gboolean stow_llama_cuda_attention_use_tc (StowLlamaCuda *L, gboolean enable);

/* The optimizer's per-step values, in device memory, that the host sets
 * before a step and reads after it. */
typedef struct
{
  double sumsq;     /* sum of squares of every gradient (raw, unscaled) */
  double norm;      /* sqrt(sumsq) / loss_scale, after stow_llama_cuda_clip */
  double clip_coef; /* stow_adam_clip_coef (norm, max_norm) */
  gint32 skip;      /* 1: a gradient is not finite or too large; no update */
} StowCudaOptimState;

/* *@state.sumsq += the sum of squares of @n gradients of @type, in double
 * over blocks fixed by @n, added in block order (as stow_adam_grad_sumsq). */
void stow_llama_cuda_grad_sumsq (StowLlamaCuda *L, const void *grad,
                                 StowDtype type, guint64 n,
                                 StowCudaOptimState *state);
/* From state->sumsq: norm, clip_coef (max_norm <= 0: 1) and skip (as
 * stow_adam_grads_ok says), on the device. */
void stow_llama_cuda_clip (StowLlamaCuda *L, double loss_scale, double max_norm,
                           StowCudaOptimState *state);
/* One AdamW step on one tensor, all pointers device memory, unless
 * state->skip: the arithmetic of offload/adam.c's scalar path operation
 * for operation (the float multiplier clip_coef / loss_scale, the fp32
 * moment updates, sqrt then the explicit fused multiply-add where adam.c
 * writes fmaf, round-to-nearest-even outputs), so that the GPU optimizer and
 * the CPU one give the same bits.  @step->clip_coef is ignored: the
 * device's state->clip_coef is used. */
void stow_llama_cuda_adam (StowLlamaCuda *L, const StowAdamConfig *config,
                           const StowAdamStep *step,
                           const StowAdamTensor *tensor,
                           const StowCudaOptimState *state);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowLlamaCuda, stow_llama_cuda_free)

G_END_DECLS
