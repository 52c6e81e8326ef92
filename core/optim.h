/* SPDX-License-Identifier: MIT
 *
 * core/optim.h: the optimizer settings of a training run: AdamW's
 * hyperparameters and the tensors its weight decay applies to, the
 * learning-rate schedule, clipping and the run's length.  One value with
 * one set of defaults: every command parses it the same way
 * (cli/plan-options.c), the plan carries it (StowTraining), the lowering
 * copies it into the step program, and the engine configs write it out
 * (reports/emit.c).  Not the optimizer's kind or precision (planner/layout.h).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  STOW_LR_CONSTANT,
  STOW_LR_COSINE, /* warmup, then cosine from lr to min_lr at the last step */
  STOW_LR_LINEAR, /* warmup, then linear from lr to min_lr */
} StowLrSchedule;

const char *stow_lr_schedule_name (StowLrSchedule s);
/* "constant", "cosine" or "linear"; else FALSE with STOW_CORE_ERROR_PARSE
 * naming --lr-schedule and @s. */
gboolean stow_lr_schedule_parse (const char *s, StowLrSchedule *out,
                                 GError **error);

/* The tensors AdamW's decoupled weight decay applies to. */
typedef enum
{
  /* Tensors of 2+ dimensions: the linear weights and the embeddings, not
   * the norms' weights or biases (Megatron-LM's default no_weight_decay_cond:
   * biases and 1-D parameters; the HF Trainer leaves out the same ones). */
  STOW_DECAY_MATRICES,
  /* Every tensor (torch.optim.AdamW over model.parameters ()). */
  STOW_DECAY_ALL,
} StowDecayScope;

const char *stow_decay_scope_name (StowDecayScope s);
/* "matrices" or "all"; else FALSE with STOW_CORE_ERROR_PARSE naming
 * --weight-decay-on and @s. */
gboolean stow_decay_scope_parse (const char *s, StowDecayScope *out,
                                 GError **error);

typedef struct
{
  double lr, min_lr;
  guint64 warmup_steps;
  /* Optimizer steps of the run: where cosine and linear reach min_lr.
   * 0: not given (a constant schedule needs none). */
  guint64 total_steps;
  StowLrSchedule schedule;
  double weight_decay; /* decoupled (AdamW), on the tensors of decay_on */
  StowDecayScope decay_on;
  double beta1, beta2, eps;
  double max_grad_norm; /* the global L2 norm's bound; <= 0: no clipping */
  guint64 seed;         /* the data order's (`stowage train --shuffle`) */
} StowOptimSettings;

/* The defaults of every command: torch.optim.AdamW's hyperparameters (lr
 * 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01) on the matrices, a
 * constant schedule without warmup (min lr 0), clipping at a global norm
 * of 1.0 (the HF Trainer's max_grad_norm and Megatron-LM's --clip-grad),
 * no length given, seed 0. */
void stow_optim_settings_init (StowOptimSettings *o);
/* Settings that cannot train, as the flags that set them: betas outside
 * [0, 1), an eps of 0, a min lr above the lr, a decaying schedule without
 * a length.
 * FALSE with STOW_CORE_ERROR_RANGE naming the flags and values. */
gboolean stow_optim_settings_check (const StowOptimSettings *o, GError **error);
/* The learning rate of 1-based step @step: linear warmup over
 * warmup_steps from lr / warmup_steps (step k of the warmup: lr k / W, as
 * llm.c), then the schedule from lr at the warmup's last step to min_lr
 * at total_steps.  Computed in double from @step alone, so a resumed run
 * gets the same bits. */
double stow_optim_lr_at (const StowOptimSettings *o, guint64 step);
/* The weight decay of a tensor of @n_dims dimensions. */
double stow_optim_decay_of (const StowOptimSettings *o, guint n_dims);

G_END_DECLS
