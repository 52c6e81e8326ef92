/* SPDX-License-Identifier: MIT
 *
 * executor/model-io.h: a model's weights between a checkpoint's safetensors
 * files (one, or shards with their index, as transformers saves them) and
 * the step program's units (program/program.h): loading with every name,
 * shape, dtype and value checked against the units' flat layouts, saving
 * unit by unit (a model streams through one unit's worth of memory), and
 * the random initialisation `stowage init-model` writes.
 */
#pragma once

#include <glib.h>

#include "executor/safetensors.h"
#include "program/program.h"

G_BEGIN_DECLS

/* Where unit @unit's weights are (in the dtype the caller asked for), or
 * NULL to skip it.  Called in unit order. */
typedef void *(*StowUnitWeightsFn) (gpointer user, guint unit);

/* ---- a checkpoint's files ---------------------------------------------------
 * A model directory's weights as transformers saves them: one
 * model.safetensors, or shards named by model.safetensors.index.json's
 * weight_map.  Every file is opened (and its header validated) once. */
typedef struct _StowWeightFiles StowWeightFiles;

/* Opens @dir's weights.  STOW_SAFETENSORS_ERROR_IO when it has neither
 * file (saying so when it has only pytorch_model.bin); _INVALID or
 * _MISSING naming the index, the file and the tensor when the index maps
 * a name to a file that lacks it, names a file outside @dir, or two files
 * hold one name. */
StowWeightFiles *stow_weight_files_open (const char *dir, GError **error);
void stow_weight_files_free (StowWeightFiles *w);
const char *stow_weight_files_dir (const StowWeightFiles *w);
/* The tensor @name and the file holding it, or NULL. */
const StowSafetensor *stow_weight_files_find (const StowWeightFiles *w,
                                              const char *name,
                                              StowSafetensors **file);
/* Every tensor name, sorted (g_strfreev). */
char **stow_weight_files_names (const StowWeightFiles *w);

/* Reads every tensor of @p's units from @w into the memory @get returns,
 * converting F32, BF16 or F16 to @dtype (round to nearest even), a tensor
 * at a time (a model streams through where its units live, never whole in
 * RAM).  STOW_SAFETENSORS_ERROR_* name the file, the tensor and the field:
 * a missing tensor, a shape or dtype that does not match the model, a
 * weight that is NaN or infinite (its element), a short read. */
gboolean stow_model_io_load (const StowProgram *p, const StowWeightFiles *w,
                             StowDtype dtype, StowUnitWeightsFn get,
                             gpointer user, GError **error);

/* The tensors of @w that @p's units do not have: refused by name
 * (STOW_SAFETENSORS_ERROR_INVALID, the first eight and how many more),
 * or with @ignore described in *@dropped ("2 tensors the model does not
 * have: ...", NULL when none).  When @p has no lm_head.weight (the head
 * is tied to the embedding), one in @w that is the embedding's copy byte
 * for byte is the model's own, and one that differs is refused. */
gboolean stow_model_io_check_extra (const StowProgram *p,
                                    const StowWeightFiles *w, gboolean ignore,
                                    char **dropped, GError **error);

/* Writes every tensor of @p's units, in unit order, as @dtype (the memory
 * @get returns holds @dtype) into directory @dir as transformers'
 * save_pretrained does: model.safetensors, or when the tensors pass
 * @max_shard_bytes (0: no limit) shards model-0000k-of-0000n.safetensors
 * (stow_model_io_cut_shards over the tensors in unit order), each at
 * most that large unless one tensor is larger, and
 * model.safetensors.index.json.  Each file is
 * written atomically (executor/safetensors.h); an earlier save's weights
 * files in @dir that this one did not replace are removed after it. */
gboolean stow_model_io_save (const StowProgram *p, const char *dir,
                             StowDtype dtype, guint64 max_shard_bytes,
                             StowUnitWeightsFn get, gpointer user,
                             GError **error);

/* The shard (from 0) of each of @n tensors of @bytes in order, cut by
 * huggingface_hub's rule (split_state_dict_into_shards_factory): a tensor
 * larger than @max_bytes gets a shard of its own, numbered when it is met;
 * otherwise the open shard closes (takes the next number) when the tensor
 * would take it past @max_bytes.  0: no limit.  Returns the shard count
 * (at least 1). */
guint stow_model_io_cut_shards (const guint64 *bytes, guint n,
                                guint64 max_bytes, guint *shard_of);

/* Fills @unit's weights (@dtype) as HF transformers' _init_weights does
 * for LLaMA-family models: linear weights and embeddings normal(0,
 * @std), biases 0, norm weights 1; the numbers come from @seed and the
 * unit's index alone (xoshiro256** seeded through SplitMix64, Box-Muller),
 * so any unit can be made on its own. */
void stow_model_io_init_unit (const StowProgram *p, guint unit, double std,
                              guint64 seed, StowDtype dtype, void *dst);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowWeightFiles, stow_weight_files_free)

G_END_DECLS
