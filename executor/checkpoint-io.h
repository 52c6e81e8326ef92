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

/* save_pretrained's default max_shard_size, "5GB". */
#define STOW_DEFAULT_MAX_SHARD_BYTES ((guint64)5000000000)

/* How a checkpoint's weights are written (note: a zeroed one saves fp32;
 * STOW_DTYPE_NONE is the training dtype). */
typedef struct
{
  StowDtype dtype;         /* STOW_DTYPE_NONE: the program's weight dtype */
  guint64 max_shard_bytes; /* shards of at most this many bytes; 0: one file */
} StowWeightsFormat;

/* Writes @be's weights into @dir as transformers saves a model (one
 * model.safetensors, or shards and their index: executor/model-io.h) in
 * @fmt's dtype, and its optimizer states to @dir/optimizer.stow, with
 * @state in the file's header; with @delayed the pending gradients too.
 * Host copies are pulled from the device first.  Weights saved as fp32
 * beside an fp32 master are the master; saved in fewer bits than the
 * training weights, the exact weights go into optimizer.stow too (section
 * "weights"), so that a resume continues bit for bit. */
gboolean stow_checkpoint_save_tensors (StowBackend *be, const StowProgram *p,
                                       const char *dir, JsonObject *state,
                                       gboolean delayed,
                                       const StowWeightsFormat *fmt,
                                       GError **error);
/* Loads them back: the weights from @dir's safetensors (or optimizer.stow's
 * exact copy), the states from @os (opened from @os_path: each tensor's
 * element count is checked first, STOW_CHECKPOINT_ERROR_MISMATCH naming
 * it), the pending gradients when @delayed, which are real when the
 * checkpoint's @step is past 0. */
gboolean stow_checkpoint_load_tensors (StowBackend *be, const StowProgram *p,
                                       const char *dir, StowOptimStateSet *os,
                                       const char *os_path, gboolean delayed,
                                       guint64 step, GError **error);
/* Fresh weights from the model directory @dir: with master weights the
 * fp32 master straight from the files and the training copy rounded from
 * it, one unit at a time when the master lives on NVMe.  Tensors the model
 * does not have are refused by name, or with @ignore_extra described in
 * *@dropped (stow_model_io_check_extra). */
gboolean stow_checkpoint_load_initial (StowBackend *be, const StowProgram *p,
                                       const char *dir, gboolean ignore_extra,
                                       char **dropped, GError **error);

/* The files beside a checkpoint's weights that make @dir a model
 * transformers loads: @config (the model's config.json text) with
 * torch_dtype set to @dtype, the dtype the weights were saved in, and the
 * generation and tokenizer files of @model_dir copied (those it has).
 * Each file is written atomically. */
gboolean stow_checkpoint_save_model_files (const char *dir,
                                           const char *model_dir,
                                           const char *config, gsize len,
                                           StowDtype dtype, GError **error);

G_END_DECLS
