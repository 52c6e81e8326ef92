/* SPDX-License-Identifier: MIT
 *
 * executor/eval.c: the validation loss (eval.h): a batch at a time through
 * the program's forward, the batches' loss sums weighted back together so
 * the result is one mean over every target, as a single pass over them
 * would give.
 */
#include "executor/eval.h"

#include <math.h>

#include "program/driver.h"

struct _StowEval
{
  StowTokenData *data;
  StowBatches *batches;
  guint64 n_batches;
};

StowEval *
stow_eval_open (const char *spec, StowTokenizer tokenizer, guint64 vocab,
                const StowProgram *p, guint64 batches, GError **error)
{
  g_return_val_if_fail (spec != NULL && p != NULL, NULL);
  g_autoptr (StowEval) e = g_new0 (StowEval, 1);
  e->data = stow_token_data_open (spec, tokenizer, vocab, error);
  if (e->data == NULL)
    return NULL;
  guint64 window = p->micro_batch * p->seq_len;
  guint64 per_batch = window * p->grad_accum;
  guint64 n = stow_token_data_n_tokens (e->data);
  if (n < per_batch + 1)
    {
      g_set_error (
          error, STOW_DATA_ERROR, STOW_DATA_ERROR_EMPTY,
          "--val-data %s: %" G_GUINT64_FORMAT
          " tokens; one evaluation batch (a global batch of %" G_GUINT64_FORMAT
          " sequences of %" G_GUINT64_FORMAT ") reads %" G_GUINT64_FORMAT,
          spec, n, p->global_batch, p->seq_len, per_batch + 1);
      return NULL;
    }
  e->batches = stow_batches_new (e->data, window, p->grad_accum, FALSE, 0);
  guint64 whole = stow_batches_n_steps (e->batches);
  e->n_batches = batches ? batches : MAX (whole, 1);
  if (e->n_batches > whole)
    {
      g_set_error (error, STOW_DATA_ERROR, STOW_DATA_ERROR_EMPTY,
                   "--eval-batches %" G_GUINT64_FORMAT ": --val-data %s holds "
                   "%" G_GUINT64_FORMAT " whole batches of %" G_GUINT64_FORMAT
                   " tokens",
                   batches, spec, whole, per_batch);
      return NULL;
    }
  return g_steal_pointer (&e);
}

void
stow_eval_free (StowEval *e)
{
  if (e == NULL)
    return;
  if (e->batches)
    stow_batches_free (e->batches);
  if (e->data)
    stow_token_data_free (e->data);
  g_free (e);
}

StowBatches *
stow_eval_batches (StowEval *e)
{
  g_return_val_if_fail (e != NULL, NULL);
  return e->batches;
}

guint64
stow_eval_n_batches (const StowEval *e)
{
  g_return_val_if_fail (e != NULL, 0);
  return e->n_batches;
}

guint64
stow_eval_n_targets (StowEval *e)
{
  g_return_val_if_fail (e != NULL, 0);
  guint64 n = 0;
  for (guint64 k = 1; k <= e->n_batches; k++)
    n += stow_batches_targets (e->batches, k);
  return n;
}

gboolean
stow_eval_run (StowEval *e, const StowProgram *p, StowBackend *be, double *loss,
               GError **error)
{
  g_return_val_if_fail (e != NULL && p != NULL && be != NULL, FALSE);
  const StowBackendVtable *vt = be->vt;
  double sum = 0;
  guint64 targets = 0;
  for (guint64 k = 1; k <= e->n_batches; k++)
    {
      guint64 n = stow_batches_targets (e->batches, k);
      if (n == 0)
        continue; /* every target masked: nothing to add */
      vt->begin_eval (be, k);
      g_autoptr (StowTrace) t = stow_program_run_eval (p, be, error);
      StowStepStats st;
      if (t == NULL || !vt->step_stats (be, &st, error))
        {
          g_prefix_error (error, "evaluation batch %" G_GUINT64_FORMAT ": ", k);
          return FALSE;
        }
      sum += st.loss_sum;
      targets += n;
    }
  /* One mean of them all, scaled as a step's loss is (so one batch gives
   * the bits a step's loss would). */
  *loss = targets ? sum * (1.0 / (double)targets) : NAN;
  return TRUE;
}
