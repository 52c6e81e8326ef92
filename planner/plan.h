/* SPDX-License-Identifier: MIT
 *
 * planner/plan.h: the plan as a value: the model and cluster it is for,
 * the training shape, the layout, the memory model's options and the
 * lowering's.  Every stage takes one by pointer: memory (memory.h), time
 * (cost.h), the search (search.h, which varies its layout), the lowering
 * (lower.h) and the simulator (sim.h).  The CLI builds it once per command
 * from the same option code (cli/plan-options.c, cli/train-plan.c).
 *
 * A value: copy it freely.  The model and the cluster are borrowed: their
 * owner keeps them alive as long as any copy.
 */
#pragma once

#include <glib.h>

#include "hw/hw.h"
#include "models/model.h"
#include "planner/layout.h"
#include "planner/memory.h"
#include "program/program.h"

G_BEGIN_DECLS

/* What the lowering decides beside the layout. */
typedef struct
{
  /* Streamed layers kept resident: G_MAXUINT chooses from the device
   * budget (capacity less the memory model's total), 0 streams all. */
  guint resident_layers;
  /* Gradient accumulation over streamed layers: each streamed layer is
   * loaded once for all micro-batches (pp = 1 only). */
  gboolean layer_major;
  /* ZeRO-Offload's one-step delayed parameter update.  (The optimizer's
   * settings the program carries are the training's: StowTraining.optim.) */
  gboolean delayed_update;
} StowLowerOptions;

void stow_lower_options_init (StowLowerOptions *o);

struct StowPlan
{
  /* Borrowed.  The model is NULL only under a peer convention with
   * mem.params_override, or for the sim of a hand-built program. */
  const StowModel *model;
  const StowCluster *cluster;
  StowTraining training;
  StowLayout layout;
  StowMemOptions mem;
  StowLowerOptions lower;
};

/* A plan of @model on @cluster with every other part at its defaults
 * (stow_training_init, stow_layout_init, stow_mem_options_init,
 * stow_lower_options_init). */
void stow_plan_init (StowPlan *plan, const StowModel *model,
                     const StowCluster *cluster);
/* A plan of these parts (NULL: the part's defaults); the lowering's
 * options at their defaults.  For callers that hold the parts apart. */
StowPlan stow_plan_of (const StowModel *model, const StowCluster *cluster,
                       const StowTraining *training, const StowLayout *layout,
                       const StowMemOptions *mem);

G_END_DECLS
