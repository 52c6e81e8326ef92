/* SPDX-License-Identifier: MIT
 *
 * executor/eval.h: the validation loss of `stowage train --val-data`: the
 * first batches of a token stream, each a global batch as a step reads
 * it (the data convention, no shuffling), run forward on the training
 * program (stow_program_run_eval), the same batches every time, so that
 * evaluations through a run compare.  Not here: when to evaluate (the
 * training loop's).
 */
#pragma once

#include <glib.h>

#include "executor/data.h"
#include "program/backend.h"

G_BEGIN_DECLS

typedef struct _StowEval StowEval;

/* The validation data @spec (a path, glob or list, as --data), checked
 * against @vocab as the training data is; @batches global batches of @p's
 * shape per evaluation, 0 for every whole one the stream holds (at least
 * one).  STOW_DATA_ERROR_* naming the files. */
StowEval *stow_eval_open (const char *spec, StowTokenizer tokenizer,
                          guint64 vocab, const StowProgram *p, guint64 batches,
                          GError **error);
void stow_eval_free (StowEval *e);
/* The batches the backend's evaluation runs read (StowBackendSetup's
 * eval_data). */
StowBatches *stow_eval_batches (StowEval *e);
guint64 stow_eval_n_batches (const StowEval *e);
/* Targets counted per evaluation (the mean's denominator). */
guint64 stow_eval_n_targets (StowEval *e);
/* Runs every batch forward on @be (made with stow_eval_batches) and
 * gives the mean token cross-entropy over all their targets in *@loss.
 * The weights, gradients and optimizer states are left as they were. */
gboolean stow_eval_run (StowEval *e, const StowProgram *p, StowBackend *be,
                        double *loss, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowEval, stow_eval_free)

G_END_DECLS
