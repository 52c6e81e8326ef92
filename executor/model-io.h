/* SPDX-License-Identifier: MIT
 *
 * executor/model-io.h: a model's weights between safetensors files and the
 * step program's units (program/program.h): loading with every name, shape
 * and dtype checked against the units' flat layouts, saving unit by unit
 * (a model streams through one unit's worth of memory), and the random
 * initialisation `stowage init-model` writes.
 */
#pragma once

#include <glib.h>

#include "program/program.h"

G_BEGIN_DECLS

/* Where unit @unit's weights are (in the dtype the caller asked for), or
 * NULL to skip it.  Called in unit order. */
typedef void *(*StowUnitWeightsFn) (gpointer user, guint unit);

/* Reads every tensor of @p's units from the safetensors file @path into
 * the memory @get returns, converting F32, BF16 or F16 to @dtype (round to
 * nearest even).  STOW_SAFETENSORS_ERROR_* name the file, the tensor and
 * the field: a missing tensor, a shape or dtype that does not match the
 * model, a short read.  Tensors the model does not have are ignored. */
gboolean stow_model_io_load (const StowProgram *p, const char *path,
                             StowDtype dtype, StowUnitWeightsFn get,
                             gpointer user, GError **error);

/* Writes every tensor of @p's units, in unit order, as @dtype (the memory
 * @get returns holds @dtype), atomically (executor/safetensors.h). */
gboolean stow_model_io_save (const StowProgram *p, const char *path,
                             StowDtype dtype, StowUnitWeightsFn get,
                             gpointer user, GError **error);

/* Fills @unit's weights (@dtype) as HF transformers' _init_weights does
 * for LLaMA-family models: linear weights and embeddings normal(0,
 * @std), biases 0, norm weights 1; the numbers come from @seed and the
 * unit's index alone (xoshiro256** seeded through SplitMix64, Box-Muller),
 * so any unit can be made on its own. */
void stow_model_io_init_unit (const StowProgram *p, guint unit, double std,
                              guint64 seed, StowDtype dtype, void *dst);

G_END_DECLS
