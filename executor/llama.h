/* SPDX-License-Identifier: MIT
 *
 * executor/llama.h: the LLaMA-family decoder, written once over a kernel
 * table (executor/kernels.h): forward and backward of the embedding, of
 * one decoder layer and of the output layer fused with the cross-entropy,
 * over tensors the caller places (the step program's buffers), on
 * whichever device provides the kernels.  Also the cpu runtime, the cpu
 * backend's provider of that table (executor/llama-cpu.c).  Not here:
 * where tensors live, the optimizer, the order of the ops (the step
 * program decides all three).
 *
 * Conventions (HF transformers' LlamaForCausalLM / Qwen2ForCausalLM /
 * Qwen3ForCausalLM):
 * weights are row-major [out, in] as the checkpoint stores them; a
 * micro-batch is B sequences of T tokens, n = B T rows, token-major
 * (row r = b T + t); each sequence is causal on its own and its positions
 * are 0 .. T-1.  RMSNorm y = w * x / sqrt(mean(x^2) + eps); rotary
 * embeddings in HF's rotate-half convention; SwiGLU down(silu(gate) * up);
 * Qwen3 RMS-normalises each head's query and key (over head_dim, weights
 * q_norm and k_norm) between the projection and the rotary embedding.
 *
 * Element types: every tensor the caller passes is of the runtime's
 * @dtype (fp32, or bf16 storage), except token ids (int32), the saved
 * logsumexp (fp32) and the loss scratch (fp32).  Products accumulate in
 * fp32; a bf16 result is rounded to nearest even once, when stored.
 * Determinism: the same inputs give the same bits on every call, at any
 * thread count (kernels.h).  The cpu runtime's GEMMs run as tiles fixed
 * by their shape, one single-threaded cblas_sgemm per tile, because
 * OpenBLAS's own threading gives different bits at different thread
 * counts (see docs/executor.md for what was measured).
 */
#pragma once

#include <glib.h>

#include "executor/kernels.h"
#include "models/model.h"
#include "offload/adam.h" /* StowDtype */

G_BEGIN_DECLS

#define STOW_LLAMA_ERROR (stow_llama_error_quark ())
GQuark stow_llama_error_quark (void);

typedef enum
{
  STOW_LLAMA_ERROR_INVALID, /* a shape or setting the runtime cannot run */
  STOW_LLAMA_ERROR_KERNEL,  /* no matrix-product kernel (executor/gemm.h) */
} StowLlamaError;

typedef struct
{
  guint64 hidden;     /* h */
  guint64 n_layers;   /* L */
  guint64 n_heads;    /* a: query heads */
  guint64 n_kv_heads; /* k: key/value heads; divides a (GQA) */
  guint64 head_dim;   /* d: even */
  guint64 ffn;        /* f: intermediate_size */
  guint64 vocab;      /* V */
  double rope_theta;
  double rms_norm_eps;
  /* Llama 3 rope_scaling ("rope_type": "llama3"); rope_factor 0: none. */
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  guint64 rope_original_max_positions;
  gboolean qkv_bias; /* q, k and v projections have biases (qwen2) */
  gboolean o_bias;   /* o_proj has a bias (llama attention_bias) */
  gboolean mlp_bias; /* gate, up and down have biases (mlp_bias) */
  gboolean qk_norm;  /* per-head RMSNorm of q and k before rotary (qwen3) */
  gboolean tied;     /* lm_head is embed_tokens */
} StowLlamaConfig;

/* One layer's weights (or gradients: the same shapes), each of the
 * runtime's dtype.  Biases and the q/k norms are NULL when the config has
 * none. */
typedef struct
{
  void *attn_norm;         /* (h)         input_layernorm */
  void *wq, *wk, *wv, *wo; /* (a d, h), (k d, h), (k d, h), (h, a d) */
  void *bq, *bk, *bv, *bo; /* (a d), (k d), (k d), (h) */
  void *mlp_norm;          /* (h)         post_attention_layernorm */
  void *wg, *wu, *wd;      /* (f, h), (f, h), (h, f) */
  void *bg, *bu, *bd;      /* (f), (f), (h) */
  void *q_norm, *k_norm;   /* (d), (d)    self_attn.q_norm, k_norm (qwen3) */
} StowLlamaLayerWeights;

/* What a layer's forward keeps for its backward, for one micro-batch of n
 * tokens.  Sizes, e = the dtype's bytes:
 *   xn1 (n, h)    attention RMSNorm output (q/k/v's input)
 *   q   (n, a d)  after rotary embeddings (and qwen3's q norm)
 *   k   (n, k d)  after rotary embeddings (and qwen3's k norm)
 *   v   (n, k d)
 *   o   (n, a d)  attention output, o_proj's input
 *   lse (n, a)    fp32: logsumexp of each query's scaled scores (flash
 *                 attention keeps this instead of the probabilities)
 *   h1  (n, h)    residual after attention: x + o_proj(o)
 *   xn2 (n, h)    MLP RMSNorm output (gate's and up's input)
 *   gate, up (n, f)  the two projections, before the activation
 *   act (n, f)    silu(gate) * up, down's input
 *   out (n, h)    the layer's output, h1 + down(act): the next layer's
 *                 input (and, during backward, the gradient with respect
 *                 to it: see stow_decoder_layer_backward)
 *   qr  (n, a d)  qwen3 only (qk_norm; else NULL): q and k as projected,
 *   kr  (n, k d)  the per-head norms' inputs
 * In all e n (4 h + 2 a d + 2 k d + 3 f) + 4 n a bytes, and e n (a d + k d)
 * more with qk_norm: the memory model's "activations" for the stowage
 * engine (planner/activations.c). */
typedef struct
{
  void *xn1, *q, *k, *v, *o;
  float *lse;
  void *h1, *xn2, *gate, *up, *act;
  void *qr, *kr;
  void *out;
} StowLlamaSaved;

/* The runtime config a model runs with, from its config.json fields;
 * STOW_LLAMA_ERROR_INVALID names what the runtime does not run (a family,
 * hidden_act, rope_type, a fused projection). */
gboolean stow_llama_config_from_model (const StowModel *model,
                                       StowLlamaConfig *out, GError **error);
/* The rules a config must meet to run, whatever the sequence (sizes above
 * 0, n_kv_heads divides n_heads, head_dim even, the GEMM dimensions an
 * int, rope_theta > 0, rms_norm_eps >= 0, a valid llama3 rope_scaling):
 * the one check init-model, train (through stow_llama_config_from_model)
 * and the runtimes apply.  STOW_LLAMA_ERROR_INVALID names the field. */
gboolean stow_llama_config_check (const StowLlamaConfig *config,
                                  GError **error);
/* A model the runtime runs, from @config_path: model_type checked first
 * (a family the runtime does not run is refused as such, before the
 * importer asks for that family's fields), then imported and
 * stow_llama_config_from_model.  *@max_positions gets the config's
 * max_position_embeddings, 0 when absent. */
StowModel *stow_llama_model_open (const char *config_path, StowLlamaConfig *out,
                                  guint64 *max_positions, GError **error);

/* ---- sizes ----------------------------------------------------------------
 * From a config and an element size @esize alone: the carving is pointer
 * arithmetic only, so it serves device addresses too. */

/* Bytes of StowLlamaSaved for @n_tokens, all of it and its `out` part. */
guint64 stow_llama_config_saved_bytes (const StowLlamaConfig *config,
                                       guint64 esize, guint64 n_tokens);
guint64 stow_llama_config_out_bytes (const StowLlamaConfig *config,
                                     guint64 esize, guint64 n_tokens);
/* Bytes of the backward working set: e n (4 h + 2 a d + 2 k d + 3 f), and
 * e n (a d + k d) more with qk_norm (the saved tensors' elements but lse):
 * the memory model's "backward working set". */
guint64 stow_llama_config_backward_ws_bytes (const StowLlamaConfig *config,
                                             guint64 esize, guint64 n_tokens);
/* Points @saved into @rest (saved_bytes - out_bytes) and @out (out_bytes).
 * @rest is packed with no padding: lse first, then the others in the order
 * of the struct (qr and kr with qk_norm only), so each tensor is aligned
 * to its element type whenever @rest is 4-byte aligned (required), and
 * 64-byte aligned when @rest is and the sizes before it are multiples of
 * 64 bytes (4 n a, and e n times h, a d, k d, f: true for every released
 * model's shapes and n a multiple of 16).  @rest may be NULL (then only `out`
 * is set). */
void stow_llama_config_saved_carve (const StowLlamaConfig *config,
                                    guint64 esize, guint64 n_tokens, void *rest,
                                    void *out, StowLlamaSaved *saved);

/* Tokens of the fused loss's chunk for @n tokens: the largest count whose
 * fp32 logits stay within STOW_LLAMA_LOSS_CHUNK_BYTES, at least 1, at most
 * @n.  The planner sizes the "logits" buffer from the same rule. */
#define STOW_LLAMA_LOSS_CHUNK_BYTES                                            \
  ((guint64)32 << 20) /* = STOW_LOSS_CHUNK_BYTES */
guint64 stow_llama_loss_chunk_tokens (guint64 vocab, guint64 hidden, guint64 n);
/* Floats of the loss scratch for @chunk tokens: normed input, logits and
 * the input's gradient, chunk (2 h + V). */
guint64 stow_llama_loss_scratch_floats (guint64 vocab, guint64 hidden,
                                        guint64 chunk);

/* ---- the decoder: the recipe over a kernel table ---------------------------
 */

/* A decoder on one device: its config and element type, the bounds its
 * provider runs, and the provider's kernels with their runtime.  Filled
 * by the provider (stow_llama_decoder, stow_llama_cuda_decoder) and owned
 * by it. */
typedef struct
{
  const StowKernels *k;
  void *ctx; /* the provider's runtime, the kernels' first argument */
  StowLlamaConfig config;
  gboolean bf16;      /* the dtype: bf16 storage (else fp32) */
  guint64 esize;      /* bytes of one element of the dtype */
  guint64 max_seq;    /* the longest sequence */
  guint64 max_tokens; /* the most tokens in one call; 0: any */
  guint64 max_batch;  /* the most sequences in one call; 0: any */
  /* The fused loss stages its normed input and the logits' gradient in
   * the dtype (tensor-core GEMMs) rather than fp32: see xent's contract. */
  gboolean loss_lowp;
} StowDecoder;

/* x (n, h) = embed[tokens]. */
void stow_decoder_embed_forward (const StowDecoder *d, const void *embed,
                                 const gint32 *tokens, guint64 n, void *x);
/* dembed (V, h) (+)= scatter of dx (n, h) by token; !@accumulate zeroes
 * dembed first.  Rows are added in token order, so the result does not
 * depend on threads. */
void stow_decoder_embed_backward (const StowDecoder *d, const gint32 *tokens,
                                  guint64 n, const void *dx, void *dembed,
                                  gboolean accumulate);

/* One layer forward over @batch sequences of @seq tokens: reads @x (n, h),
 * fills every tensor of @saved.  With saved->out == NULL (recomputation:
 * the output is already kept) the down projection is skipped and `out` is
 * not written; the other tensors come out bit-identical to the first
 * forward's. */
void stow_decoder_layer_forward (const StowDecoder *d, guint64 batch,
                                 guint64 seq, const StowLlamaLayerWeights *w,
                                 const void *x, StowLlamaSaved *saved);

/* One layer backward.  On entry saved->out holds dL/d(out) (n, h), written
 * there by the next layer's backward or the loss; @x is the layer's input.
 * Parameter gradients go to @grads (= when !@accumulate, += when
 * @accumulate); dL/dx (n, h) goes to @dx, which may alias @x (each row of x
 * is read before its gradient overwrites it).  @ws is the working set
 * (stow_llama_config_backward_ws_bytes, 4-byte aligned: it carves fp32
 * parts).  The saved tensors are clobbered. */
void stow_decoder_layer_backward (const StowDecoder *d, guint64 batch,
                                  guint64 seq, const StowLlamaLayerWeights *w,
                                  const void *x, StowLlamaSaved *saved,
                                  const StowLlamaLayerWeights *grads,
                                  gboolean accumulate, void *ws, void *dx);

/* The output layer fused with the cross-entropy, forward and backward, a
 * chunk of tokens at a time so that no (n, V) tensor exists: for each
 * token, xn = RMSNorm(x; norm), logits = xn head^T (fp32), loss_i =
 * logsumexp(logits) - logits[target_i].  Adds sum_i loss_i (unscaled, in
 * double) to *@loss_sum, a double in the provider's memory.  Gradients
 * are those of @scale * sum_i loss_i (the caller passes 1 / tokens of the
 * global batch): dnorm (h) and dhead (V, h) (= when !@accumulate, +=); dx
 * (n, h) may alias @x.  With a tied head, @head is the embedding and
 * @dhead its gradient.  @scratch holds stow_llama_loss_scratch_floats (V,
 * h, chunk) floats.  Targets are in [0, V) (the data loader checks) or
 * negative: ignored, no loss and no gradient (executor/kernels.h's xent). */
void stow_decoder_head_loss (const StowDecoder *d, guint64 n, const void *norm,
                             const void *head, const void *x,
                             const gint32 *targets, double scale, void *dnorm,
                             void *dhead, gboolean accumulate, void *dx,
                             float *scratch, guint64 chunk, double *loss_sum);

/* The loss alone, for evaluation: *@loss_sum += sum_i loss_i as
 * stow_decoder_head_loss adds it (the same chunks, so the same bits), and
 * no gradient is written anywhere but @scratch. */
void stow_decoder_head_eval_loss (const StowDecoder *d, guint64 n,
                                  const void *norm, const void *head,
                                  const void *x, const gint32 *targets,
                                  float *scratch, guint64 chunk,
                                  double *loss_sum);

/* For tests: the fp32 logits (n, V) of the output layer over @x; @xn is
 * staging of n h floats. */
void stow_decoder_head_logits (const StowDecoder *d, guint64 n,
                               const void *norm, const void *head,
                               const void *x, float *logits, float *xn);

/* ---- the cpu runtime: the cpu provider of the kernels ----------------------
 */

typedef struct StowLlama StowLlama;

/* A runtime for @config at @dtype (STOW_DTYPE_F32 or STOW_DTYPE_BF16), for
 * sequences of up to @max_seq tokens, on @n_threads threads (0: one per
 * core).  Precomputes the rotary tables and allocates its workspace (see
 * stow_llama_workspace_bytes).  STOW_LLAMA_ERROR_INVALID names a field that
 * cannot run (k not dividing a, odd head_dim, a zero size). */
StowLlama *stow_llama_new (const StowLlamaConfig *config, StowDtype dtype,
                           guint64 max_seq, guint n_threads, GError **error);
void stow_llama_free (StowLlama *llama);
/* The decoder over this runtime's kernels (owned by @llama). */
const StowDecoder *stow_llama_decoder (const StowLlama *llama);
const StowLlamaConfig *stow_llama_get_config (const StowLlama *llama);
StowDtype stow_llama_get_dtype (const StowLlama *llama);
/* The threads it runs on (@n_threads, or the cores when that was 0). */
guint stow_llama_get_n_threads (const StowLlama *llama);
/* Bytes the runtime holds outside the caller's tensors: rotary tables,
 * per-thread attention tiles, fp32 staging of bf16 GEMM operands.  The
 * analogue of a GPU's cuBLAS workspace: constant over a run. */
guint64 stow_llama_workspace_bytes (const StowLlama *llama);
/* The rotary tables (max_seq, head_dim / 2) fp32: cos and sin of position
 * t times the i-th inverse frequency (the cuda runtime uploads them). */
const float *stow_llama_rope_table (const StowLlama *llama, gboolean sin);

/* The sizes above at the runtime's config and dtype. */
guint64 stow_llama_saved_bytes (const StowLlama *llama, guint64 n_tokens);
guint64 stow_llama_out_bytes (const StowLlama *llama, guint64 n_tokens);
guint64 stow_llama_backward_ws_bytes (const StowLlama *llama, guint64 n_tokens);
void stow_llama_saved_carve (const StowLlama *llama, guint64 n_tokens,
                             void *rest, void *out, StowLlamaSaved *saved);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowLlama, stow_llama_free)

G_END_DECLS
