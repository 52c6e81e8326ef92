/* SPDX-License-Identifier: MIT
 *
 * planner/search.h: enumerate layouts for a model on a cluster, keep those
 * that fit, and rank them by predicted throughput (planner/cost.c).  Fields
 * of the layout that the caller pins are not searched.  Memory prunes
 * first (the totals-only path of the memory model), then the time model
 * ranks; ties go to the layout with more headroom.
 */
#pragma once

#include "planner/cost.h"
#include "planner/memory.h"

G_BEGIN_DECLS

/* Which fields of a StowLayout the user fixed. */
typedef enum
{
  STOW_PIN_DP = 1 << 0,
  STOW_PIN_TP = 1 << 1,
  STOW_PIN_PP = 1 << 2,
  STOW_PIN_VPP = 1 << 3,
  STOW_PIN_CP = 1 << 4,
  STOW_PIN_EP = 1 << 5,
  STOW_PIN_SP = 1 << 6,
  STOW_PIN_ZERO = 1 << 7,
  STOW_PIN_OFFLOAD_OPTIMIZER = 1 << 8,
  STOW_PIN_OFFLOAD_PARAMS = 1 << 9,
  STOW_PIN_OFFLOAD_ACTIVATIONS = 1 << 10,
  STOW_PIN_RECOMPUTE = 1 << 11,
  STOW_PIN_MICRO_BATCH = 1 << 12,
  STOW_PIN_SCHEDULE = 1 << 13,
  STOW_PIN_ETP = 1 << 14,
  STOW_PIN_PP_SPLIT_ENDS = 1 << 15,
  STOW_PIN_ALL = (1 << 16) - 1,
} StowPins;

typedef struct
{
  StowLayout layout;
  guint64 total_bytes; /* peak stage, device */
  guint64 host_bytes;
  guint64 nvme_bytes;
  gint64 headroom_bytes; /* capacity - total */
  double score;          /* lower is better: seconds per token */
  StowCost cost;         /* the time model's prediction */
} StowCandidate;

typedef struct
{
  GArray *fits;            /* StowCandidate, best first */
  StowCandidate best_miss; /* the layout closest to fitting */
  gboolean have_miss;
  /* evaluated = fitting + out_of_memory + host_or_nvme: the layouts the
   * memory model priced.  invalid and same_as_lower_zero were not. */
  guint64 evaluated;
  guint64 invalid; /* rejected by divisibility and legality */
  guint64 out_of_memory;
  guint64 host_or_nvme;       /* fit the GPU but not host RAM or NVMe */
  guint64 fitting;            /* all that fit (fits keeps the best max_keep) */
  guint64 same_as_lower_zero; /* ZeRO 1 or 2 over one data-parallel rank
                                 that costs what the stage below costs: the
                                 same layout, listed once */
  double search_time_s;       /* wall clock of the search */
} StowSearch;

typedef struct
{
  guint max_keep;               /* 0: keep every layout that fits */
  gboolean allow_cross_node_tp; /* tp beyond the NVLink domain */
  const StowCostOptions *cost;  /* NULL: the defaults */
  /* The engines whose memory models are searched, a bit set of
   * 1 << StowEngine; their layouts are ranked together.  0: the base
   * layout's engine alone. */
  guint engines;
  /* Called for each layout before its memory is priced, with the base
   * plan holding the candidate's layout (NULL: every valid layout is
   * priced).  A layout it returns FALSE for, such as one an engine's
   * config cannot express, is counted as invalid.  It runs for every
   * candidate, so it should be cheap. */
  gboolean (*accept) (const StowPlan *candidate, gpointer data);
  gpointer accept_data;
} StowSearchOptions;

void stow_search_options_init (StowSearchOptions *options);

/* Searches the layouts of @plan's layout that are not pinned in @pins,
 * for its model, cluster and training under its memory options.  The
 * layout carries the pinned values and the engine (unless @options name
 * engines).  @options may be NULL (keep every layout that fits). */
StowSearch *stow_search_run (const StowPlan *plan, StowPins pins,
                             const StowSearchOptions *options);
void stow_search_free (StowSearch *search);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowSearch, stow_search_free)

G_END_DECLS
