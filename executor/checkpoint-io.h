/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint-io.h: a backend's persistent tensors to and from a
 * checkpoint's files: the weights as safetensors (executor/model-io.h),
 * the optimizer states (and the delayed update's pending gradients) as
 * optimizer.stow (executor/optim-state.h), from wherever the backend keeps
 * them (its table's real-tensor entries, program/backend.h).  Not here:
 * the checkpoint directory (executor/checkpoint.h) and what a run checks
 * before it resumes (executor/train.c).
 */
#pragma once

#include "executor/optim-state.h"
#include "program/backend.h"

G_BEGIN_DECLS

/* Writes @be's weights to @dir/model.safetensors (the program's weight
 * dtype) and its optimizer states to @dir/optimizer.stow, with @state in
 * the file's header; with @delayed the pending gradients too.  Host copies
 * are pulled from the device first. */
gboolean stow_checkpoint_save_tensors (StowBackend *be, const StowProgram *p,
                                       const char *dir, JsonObject *state,
                                       gboolean delayed, GError **error);
/* Loads them back: the weights from @safetensors, the states from @os
 * (opened from @os_path: each tensor's element count is checked first,
 * STOW_CHECKPOINT_ERROR_MISMATCH naming it), the pending gradients when
 * @delayed, which are real when the checkpoint's @step is past 0. */
gboolean stow_checkpoint_load_tensors (StowBackend *be, const StowProgram *p,
                                       const char *safetensors,
                                       StowOptimState *os, const char *os_path,
                                       gboolean delayed, guint64 step,
                                       GError **error);
/* Fresh weights from a model's @safetensors: with master weights the fp32
 * master straight from the file and the training copy rounded from it,
 * one unit at a time when the master lives on NVMe. */
gboolean stow_checkpoint_load_initial (StowBackend *be, const StowProgram *p,
                                       const char *safetensors, GError **error);

G_END_DECLS
