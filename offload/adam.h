/* SPDX-License-Identifier: MIT
 *
 * offload/adam.h: the CPU optimizer of the offload engine.  Adam and AdamW
 * over fp32 master weights and moments kept in host memory; gradients come
 * in as fp32, bf16 or fp16 and the updated weights also go out, in the same
 * pass, as the bf16/fp16/fp32 copy that is shipped back to the GPU.  Loss
 * unscaling and global-norm clipping are fused in.  One pass reads and writes
 * every byte once: the step is memory-bound (offload.md §0), so the kernels
 * aim at the STREAM bandwidth, not at FLOPs.
 *
 * Not here: moving data to the GPU or NVMe (offload/swapper.c does that).
 */
#pragma once

#include <glib.h>

#include "core/dtype.h" /* gradients' and the parameter copy's types */

#include "offload/cpu.h"

G_BEGIN_DECLS

#define STOW_ADAM_ERROR (stow_adam_error_quark ())
GQuark stow_adam_error_quark (void);

typedef enum
{
  STOW_ADAM_ERROR_INVALID,     /* a bad hyperparameter, step or tensor */
  STOW_ADAM_ERROR_NONFINITE,   /* a gradient is NaN/Inf or too large */
  STOW_ADAM_ERROR_UNSUPPORTED, /* the ISA asked for is not on this CPU */
} StowAdamError;

/* Round-to-nearest-even conversions, the reference the kernels match bit
 * for bit (bf16's are core/dtype.h's).  A NaN becomes the quiet NaN 0x7fc0
 * (bf16) / 0x7e00 (fp16); overflow becomes infinity; subnormals are kept,
 * not flushed. */
guint16 stow_f32_to_f16 (float x);
float stow_f16_to_f32 (guint16 h);

typedef enum
{
  STOW_ADAM_ADAMW = 0, /* decoupled weight decay (Loshchilov & Hutter) */
  STOW_ADAM_L2,        /* classic Adam: weight_decay * p added to the grad */
} StowAdamMode;

/* Hyperparameters, as torch.optim.AdamW names them. */
typedef struct
{
  StowAdamMode mode;
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  gboolean bias_correction;
} StowAdamConfig;

/* PyTorch's AdamW defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
 * weight_decay 1e-2, bias correction on. */
void stow_adam_config_init (StowAdamConfig *config);

/* One flat tensor (or shard).  All arrays hold @n elements and must not
 * overlap, except that @param_out may be @grad itself when both are of one
 * type (each element's gradient is read before its output is written: the
 * updated weights replace the gradients they came from).  @param_out may
 * not alias @param. */
typedef struct
{
  float *param;        /* (n) fp32 master weights, updated in place */
  float *m;            /* (n) first moment, updated in place */
  float *v;            /* (n) second moment, updated in place */
  const void *grad;    /* (n) gradients, scaled by the loss scale */
  StowDtype grad_type; /* F32, BF16 or F16 */
  void *param_out;     /* (n) updated weights in @out_type, or NULL */
  StowDtype out_type;  /* NONE when @param_out is NULL */
  guint64 n;
} StowAdamTensor;

/* Per-step values.  The effective gradient is
 *   g = grad * (float) (clip_coef / loss_scale)
 * so unscaling and clipping cost one multiply. */
typedef struct
{
  guint64 step;      /* 1-based number of this step: t in beta^t */
  double loss_scale; /* > 0; 1 when not using loss scaling */
  double clip_coef;  /* in [0, 1]; see stow_adam_clip_coef; 1 = no clip */
  /* TRUE when the caller has already checked these exact gradients with
   * stow_adam_grads_ok (after stow_adam_grad_sumsq), which lets the step skip
   * its own checking pass over the gradients (2 or 4 bytes per parameter). */
  gboolean grads_verified;
} StowAdamStep;

/* Largest |g| the update accepts.  Above it g*g overflows fp32 and the
 * second moment would become infinite, freezing the weight for ever; such a
 * gradient is treated like an Inf. */
#define STOW_ADAM_GRAD_LIMIT 4611686018427387904.0 /* 2^62 */

typedef struct StowAdam StowAdam;

/* A CPU Adam engine: a pool of @n_threads workers (0: one per core) bound
 * to cores, and the kernels of @isa (STOW_ISA_AUTO: the best this CPU runs).
 * Sets STOW_ADAM_ERROR_UNSUPPORTED when the CPU lacks @isa. */
StowAdam *stow_adam_new (guint n_threads, StowIsa isa, GError **error);
void stow_adam_free (StowAdam *adam);
StowIsa stow_adam_get_isa (const StowAdam *adam);
guint stow_adam_get_n_threads (const StowAdam *adam);
/* The engine's worker pool, for callers that want to first-touch their
 * arrays with the same partition (stow_cpu_partition on
 * stow_adam_n_blocks blocks of STOW_ADAM_BLOCK elements). */
StowCpuPool *stow_adam_get_pool (StowAdam *adam);

/* Elements per unit of work handed to a thread by the step. */
#define STOW_ADAM_BLOCK 4096

/* Hot path: one optimizer step on @tensor.  Never allocates, never logs.
 * Returns 0, or
 *   -EINVAL  bad arguments (nothing written);
 *   -ERANGE  a gradient is NaN, Inf or above STOW_ADAM_GRAD_LIMIT after
 *            scaling: the step is skipped and nothing is written, as
 *            mixed-precision training expects (lower the loss scale, redo).
 * Bias corrections are computed from @step->step in double every call, so
 * a resumed run at step k+1 reproduces a straight run bit for bit.  Each
 * element's update depends only on its own data: results are identical for
 * any thread count, and identical between the ISA paths. */
int stow_adam_step_raw (StowAdam *adam, const StowAdamConfig *config,
                        const StowAdamStep *step, const StowAdamTensor *tensor);

/* The boundary wrapper: validates with messages naming the bad value, runs
 * stow_adam_step_raw, and on a skipped step names the first bad gradient:
 * "adam step 12: gradient 3 of 1000 is nan; step skipped, nothing written"
 * (STOW_ADAM_ERROR_NONFINITE). */
gboolean stow_adam_step (StowAdam *adam, const StowAdamConfig *config,
                         const StowAdamStep *step, const StowAdamTensor *tensor,
                         GError **error);

/* This host's CPU Adam rate, in parameters a second: the fastest of @reps
 * updates of @n parameters laid out as ZeRO-Offload's step has them (fp32
 * master and moments, bf16 gradients and updated weights), on @adam's
 * threads.  0 and @error when the arrays cannot be had. */
double stow_adam_measure (StowAdam *adam, guint64 n, guint reps,
                          GError **error);

/* Hot path: the sum of squares of the raw gradients, accumulated in double
 * over fixed blocks that depend only on @n and added in block order: the
 * same bits for any thread count and any ISA.  NaN or Inf when a gradient
 * is not finite.  Returns 0 or -EINVAL.  For the global norm of a model,
 * add the tensors' sums in a fixed order and take sqrt(sum) / loss_scale. */
int stow_adam_grad_sumsq (StowAdam *adam, const void *grad, StowDtype grad_type,
                          guint64 n, double *out_sumsq);
/* The per-block sums stow_adam_grad_sumsq adds, for blocks of @block
 * elements (core/zero.h's stow_norm_block of the whole tensor): ceil(@n /
 * @block) of them into @partials.  A rank holding blocks [k, k + j) of a
 * tensor (ZeRO's partitions are aligned to them) gets the very sums one
 * rank gets for them.  Returns 0 or -EINVAL. */
int stow_adam_grad_sumsq_blocks (StowAdam *adam, const void *grad,
                                 StowDtype grad_type, guint64 n, guint64 block,
                                 double *partials);

/* PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6)).
 * @max_norm <= 0 means no clipping (1). */
double stow_adam_clip_coef (double total_norm, double max_norm);

/* Whether gradients whose raw sum of squares is @sumsq can be stepped with
 * @loss_scale and @clip_coef with grads_verified = TRUE: every scaled
 * gradient is then finite and below STOW_ADAM_GRAD_LIMIT. */
gboolean stow_adam_grads_ok (double sumsq, double loss_scale, double clip_coef);

/* Bytes one step moves per parameter: read param, m, v, grad; write param,
 * m, v and the output copy; plus one more read of the gradients for the
 * checking pass unless @grads_verified.  AdamW with bf16 grads and a bf16
 * copy: 14 read + 14 written = 28. */
guint stow_adam_bytes_per_param (StowDtype grad_type, StowDtype out_type,
                                 gboolean grads_verified);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowAdam, stow_adam_free)

G_END_DECLS
