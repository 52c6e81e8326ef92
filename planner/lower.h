/* SPDX-License-Identifier: MIT
 *
 * planner/lower.h: the lowering of a plan (model, cluster, training,
 * layout) to its step program (program/program.h), one program rank per
 * pipeline stage, each standing for its data- and tensor-parallel peers.
 * The lowering never looks at time, only at bytes and order; backends in
 * executor/ run the program.
 */
#pragma once

#include <glib.h>

#include "hw/hw.h"
#include "models/model.h"
#include "planner/layout.h"
#include "planner/memory.h"
#include "program/program.h"

G_BEGIN_DECLS

/* Schedule parameters a plan carries beside its layout. */
typedef struct
{
  /* Streamed layers kept resident: G_MAXUINT chooses from the device
   * budget (capacity less the memory model's total), 0 streams all. */
  guint resident_layers;
  /* Gradient accumulation over streamed layers: each streamed layer is
   * loaded once for all micro-batches (pp = 1 only). */
  gboolean layer_major;
  /* ZeRO-Offload's one-step delayed parameter update. */
  gboolean delayed_update;
  /* What the program carries for real training: optimizer, schedule of
   * the learning rate, clipping, seed (program/program.h's defaults). */
  StowOptimSettings optim;
} StowLowerOptions;

void stow_lower_options_init (StowLowerOptions *o);

/* Lowers a plan.  Fails (STOW_PLAN_ERROR_INVALID) for a layout that does
 * not validate, or one the lowering does not cover yet (engines other
 * than stowage; LoRA with ZeRO 3 or offload), naming it. */
StowProgram *
stow_lower (const StowModel *model, const StowCluster *cluster,
                     const StowTraining *training, const StowLayout *layout,
                     const StowMemOptions *mem_options,
                     const StowLowerOptions *options, GError **error);

G_END_DECLS
