/* SPDX-License-Identifier: MIT
 *
 * cli/plan-options.h: the model, cluster, training and layout flags shared
 * by `mem`, `fit`, `plan` and `simulate`, and their conversion into planner
 * types with errors that name the flag and the value; and the training
 * settings' flags (the optimizer, its schedule, clipping and the run's
 * length), which `train` shares with them.
 */
#pragma once

#include <glib.h>

#include "cli/call.h"
#include "hw/hw.h"
#include "models/model.h"
#include "planner/memory.h"
#include "planner/plan.h"
#include "planner/search.h"

G_BEGIN_DECLS

/* The optimizer settings' flags (core/optim.h), raw (NULL when not given):
 * --lr, --min-lr, --warmup, --lr-schedule, --weight-decay,
 * --weight-decay-on, --beta1, --beta2, --eps, --max-grad-norm, --steps. */
typedef struct
{
  char *lr, *min_lr, *warmup, *lr_schedule, *weight_decay, *weight_decay_on,
      *beta1, *beta2, *eps, *max_grad_norm, *steps;
} StowOptimFlags;

/* Adds the flags to @ctx's main group, each with its default in --help,
 * as flags @call's request may name (stow_cli_add_entries). */
void stow_optim_flags_add (StowCliCall *call, GOptionContext *ctx,
                           StowOptimFlags *f);
/* The flags given in @f over the settings in @o (the defaults, or a plan
 * file's), then stow_optim_settings_check; errors name the flag and the
 * value. */
gboolean stow_optim_flags_apply (const StowOptimFlags *f, StowOptimSettings *o,
                                 GError **error);
void stow_optim_flags_clear (StowOptimFlags *f);

typedef struct
{
  /* The training settings' flags, over the defaults into
   * plan.training.optim (over a plan file's with --plan). */
  StowOptimFlags optim;
  /* The run of the command these options are for (NULL: the terminal):
   * where its flags come from and where its answer and failures go. */
  StowCliCall *call;
  /* raw option strings (NULL when not given) */
  char *gpus, *cluster;
  char *dp, *tp, *pp, *vpp, *cp, *ep, *etp, *zero, *offload_optimizer,
      *offload_params, *offload_activations, *recompute, *micro_batch,
      *global_batch, *grad_accum, *seq, *decoder_seq, *precision, *optimizer,
      *finetune, *lora_rank, *engine, *schedule, *convention, *params,
      *largest_layer, *zero_init, *context, *fragmentation, *nccl, *margin,
      *reduce_bucket, *prefetch_bucket, *reuse_distance, *free_grads,
      *lora_targets, *workspace, *host_process, *cpu_opt_buffers, *host_ram,
      *nvme, *resident_layers, *revision;
  gboolean sp, no_sp, pp_split_ends, no_flash, chunked_loss, fused_loss,
      dropout, lora_dropout, json, explain, overlap_comm, opt_in_bwd, compile;

  /* results: the plan every stage of the command takes, built here once
   * (its model and cluster are the two below, which own them) */
  StowModel *model; /* NULL only under --params */
  StowCluster *cluster_obj;
  StowPlan plan;
  StowPins pins;
  /* What every search of the command searches besides the layout flags,
   * set by --emit (cli/report-options.c): the engines whose memory models
   * are searched, a bit set of 1 << StowEngine (0: the layout's), and the
   * filter of layouts the config can express (NULL: none). */
  guint search_engines;
  gboolean (*search_accept) (const StowPlan *candidate, gpointer data);
  gpointer search_accept_data;
} StowPlanOptions;

/* Adds the flags to @ctx (one group), the optimizer settings' with them. */
void stow_plan_options_add (GOptionContext *ctx, StowPlanOptions *po);
/* Resolves the model (argument @model_arg, may be NULL under --params),
 * the cluster and every flag; on error returns FALSE with @error naming
 * the flag. */
gboolean stow_plan_options_resolve (StowPlanOptions *po, const char *model_arg,
                                    GError **error);
/* The layout and training flags alone (degrees, ZeRO, offloads,
 * recomputation, batch and sequence, precision, optimizer and its
 * settings, fine-tuning, engine, pipeline schedule, loss kernels) into
 * po->plan's layout and training and po->pins, from their defaults: no
 * model or GPU is consulted (what `stowage train` shares with the
 * planner's commands). */
gboolean stow_plan_options_parse_shape (StowPlanOptions *po, GError **error);
/* Fills the dimensions the user left out (dp fills the GPUs). */
void stow_plan_options_default_layout (StowPlanOptions *po);
/* Fills the dimensions the flags leave open the way `fit` chooses them: a
 * search pinned to what was given, its fastest layout that fits, or the
 * closest when none fits.  Returns the filled dimensions as a
 * NULL-terminated list of flag names without "--" ("zero", "micro-batch",
 * ...; free with g_strfreev), or NULL when nothing was left to choose or
 * it did not search: every dimension given, a peer --convention or
 * --params, or no valid layout, and then the layout holds
 * stow_plan_options_default_layout's plain defaults. */
char **stow_plan_options_fill_like_fit (StowPlanOptions *po);
/* A search from po->plan's layout with @pins, keeping the @max_keep
 * fastest (0: all), on @cluster with @training (po's own when NULL), over
 * the engines and through the filter --emit set. */
StowSearch *stow_plan_options_search (const StowPlanOptions *po,
                                      const StowCluster *cluster,
                                      const StowTraining *training,
                                      StowPins pins, guint max_keep);
void stow_plan_options_clear (StowPlanOptions *po);
/* For a search that found no valid layout: the memory model's reason the
 * requested layout cannot run (naming the field) when it has one, else
 * "no valid layout of MODEL on CLUSTER"; returns the exit status. */
int stow_plan_options_fail_no_layout (const StowPlanOptions *po);

G_END_DECLS
