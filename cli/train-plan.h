/* SPDX-License-Identifier: MIT
 *
 * cli/train-plan.h: what `stowage train` runs, decided before anything is
 * loaded: the device and the cluster standing for it, the model, the
 * layout (a plan file's, or the fastest that fits the device), the step
 * program it lowers to, its simulated step (the predicted peaks and
 * timeline the run is compared with) and the host's preflight.  The CLI
 * composes the planner and the executor here, so that the executor runs
 * a program and never plans.
 */
#pragma once

#include "cli/plan-options.h"
#include "executor/train.h"
#include "hw/hw.h"
#include "planner/layout.h"
#include "planner/memory.h"
#include "planner/plan.h"

G_BEGIN_DECLS

typedef struct
{
  /* In: the flags. */
  const char *model_dir;
  const char *plan_path; /* NULL: plan from the flags below */
  const char *backend;   /* "cpu" or "cuda" */
  guint64 device_memory; /* 0: half of the host's RAM (cpu), the GPU's
                          * free memory less a reserve (cuda) */
  guint threads;
  char **nvme_dirs;
  /* The layout: with any pins, those dimensions as given; the rest (and
   * everything without pins) planned for the device (the fastest that
   * fits, as `stowage fit` chooses). */
  StowLayout layout;
  guint pins; /* StowPins */
  guint64 seq, micro_batch, global_batch;
  StowPrecision precision;
  /* The optimizer settings from the flags over the defaults, with the
   * run's length and seed; with a plan file, the flags given
   * (@optim_flags, borrowed; NULL: none) go over the plan's instead. */
  StowOptimSettings optim;
  const StowOptimFlags *optim_flags;
  gboolean delayed_update;
  guint64 test_memlock_limit;   /* see stow_preflight_memlock */
  guint64 test_nvme_free_bytes; /* test knob: each --nvme-dir's free space */
  gboolean allow_unpinned;
  /* Data-parallel ranks the run was launched with (0 or 1: one): each a
   * device of --device-memory. */
  guint ranks;
  StowTrainNotice notice;
  gpointer notice_user;

  /* Out: what was decided.  The plan's model and cluster are the two
   * below, which own them; its layout is the one planned (the plan
   * file's, or the search's). */
  StowModel *model;
  guint64 max_positions; /* config.json's max_position_embeddings; 0 */
  StowCluster *cluster;
  StowPlan plan;
  StowProgram *prog;
  guint64 device_bytes;
  /* The --nvme-dir with the least free space, and that space. */
  const char *nvme_least_dir;
  guint64 nvme_least_bytes;
  gboolean no_pin; /* RLIMIT_MEMLOCK too low, --allow-unpinned */
  guint64 predicted_peak_bytes, predicted_pinned_bytes;
  double predicted_step_s;
  double simulated_busy_s[STOW_N_STREAMS];
  double simulated_exposed_s[STOW_N_STREAMS];
} StowTrainPlan;

void stow_train_plan_init (StowTrainPlan *tp);
void stow_train_plan_clear (StowTrainPlan *tp);
/* Decides it all; errors name the flag, file and field at fault. */
gboolean stow_train_plan (StowTrainPlan *tp, GError **error);

G_END_DECLS
