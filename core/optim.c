/* SPDX-License-Identifier: MIT
 *
 * core/optim.c: the optimizer settings' defaults, names, checks and
 * learning-rate schedule (optim.h).
 */
#include "core/optim.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

static const char *const schedule_names[] = {
  [STOW_LR_CONSTANT] = "constant",
  [STOW_LR_COSINE] = "cosine",
  [STOW_LR_LINEAR] = "linear",
};

const char *
stow_lr_schedule_name (StowLrSchedule s)
{
  g_return_val_if_fail ((guint)s < G_N_ELEMENTS (schedule_names), "?");
  return schedule_names[s];
}

/* @s among @names (@n of them): its index in @out, or FALSE naming @flag
 * and what it expects. */
static gboolean
parse_name (const char *const *names, guint n, const char *flag,
            const char *expected, const char *s, guint *out, GError **error)
{
  for (guint k = 0; k < n; k++)
    if (g_strcmp0 (s, names[k]) == 0)
      {
        *out = k;
        return TRUE;
      }
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
               "%s \"%s\": expected %s", flag, s ? s : "", expected);
  return FALSE;
}

gboolean
stow_lr_schedule_parse (const char *s, StowLrSchedule *out, GError **error)
{
  guint k;
  if (!parse_name (schedule_names, G_N_ELEMENTS (schedule_names),
                   "--lr-schedule", "constant, cosine or linear", s, &k, error))
    return FALSE;
  *out = (StowLrSchedule)k;
  return TRUE;
}

static const char *const decay_names[] = {
  [STOW_DECAY_MATRICES] = "matrices",
  [STOW_DECAY_ALL] = "all",
};

const char *
stow_decay_scope_name (StowDecayScope s)
{
  g_return_val_if_fail ((guint)s < G_N_ELEMENTS (decay_names), "?");
  return decay_names[s];
}

gboolean
stow_decay_scope_parse (const char *s, StowDecayScope *out, GError **error)
{
  guint k;
  if (!parse_name (decay_names, G_N_ELEMENTS (decay_names), "--weight-decay-on",
                   "matrices (tensors of 2+ dimensions) or all", s, &k, error))
    return FALSE;
  *out = (StowDecayScope)k;
  return TRUE;
}

void
stow_optim_settings_init (StowOptimSettings *o)
{
  memset (o, 0, sizeof *o);
  o->lr = 1e-3;
  o->schedule = STOW_LR_CONSTANT;
  o->weight_decay = 0.01;
  o->decay_on = STOW_DECAY_MATRICES;
  o->beta1 = 0.9, o->beta2 = 0.999, o->eps = 1e-8;
  o->max_grad_norm = 1.0;
}

gboolean
stow_optim_settings_check (const StowOptimSettings *o, GError **error)
{
  g_return_val_if_fail (o != NULL, FALSE);
  if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "--beta1 %g, --beta2 %g: each must be below 1", o->beta1,
                   o->beta2);
      return FALSE;
    }
  if (!(o->eps > 0))
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "--eps %g: Adam's epsilon must be above 0 (it divides by "
                   "sqrt(v) + eps)",
                   o->eps);
      return FALSE;
    }
  if (o->min_lr > o->lr)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "--min-lr %g is above --lr %g", o->min_lr, o->lr);
      return FALSE;
    }
  if (o->schedule != STOW_LR_CONSTANT && o->total_steps == 0)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "--lr-schedule %s decays to --min-lr at the run's last "
                   "step: give --steps N",
                   stow_lr_schedule_name (o->schedule));
      return FALSE;
    }
  return TRUE;
}

double
stow_optim_lr_at (const StowOptimSettings *o, guint64 step)
{
  g_return_val_if_fail (o != NULL, 0);
  if (step == 0)
    step = 1;
  if (o->warmup_steps > 0 && step <= o->warmup_steps)
    return o->lr * (double)step / (double)o->warmup_steps;
  if (o->schedule == STOW_LR_CONSTANT)
    return o->lr;
  /* Decay from the end of warmup to the last step. */
  guint64 span
      = o->total_steps > o->warmup_steps ? o->total_steps - o->warmup_steps : 1;
  double frac = MIN (1.0, (double)(step - o->warmup_steps) / (double)span);
  double k = o->schedule == STOW_LR_COSINE ? 0.5 * (1.0 + cos (G_PI * frac))
                                           : 1.0 - frac;
  return o->min_lr + (o->lr - o->min_lr) * k;
}

double
stow_optim_decay_of (const StowOptimSettings *o, guint n_dims)
{
  g_return_val_if_fail (o != NULL, 0);
  return n_dims >= 2 || o->decay_on == STOW_DECAY_ALL ? o->weight_decay : 0.0;
}
