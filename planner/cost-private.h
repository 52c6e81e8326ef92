/* SPDX-License-Identifier: MIT
 *
 * planner/cost-private.h: the communication pricing (planner/
 * collectives.c) the time model (cost.c) builds on.
 */
#pragma once

#include "planner/cost.h"

/* A link: bandwidth per GPU per direction (bytes/s, efficiency applied)
 * and latency per ring step. */
typedef struct
{
  double bw, lat;
} StowLink;

/* The link a group of @size ranks, @stride apart in rank order, uses. */
StowLink stow_comm_link (const StowCluster *c, const StowCostOptions *o,
                         guint64 size, guint64 stride);

/* A ring all-reduce of @bytes over @n ranks on @l. */
double stow_comm_ring_allreduce (double bytes, guint64 n, StowLink l);

/* @bytes moved as @count equal data-parallel collectives over @n ranks
 * @stride apart (@half: reduce-scatters or all-gathers, else
 * all-reduces). */
double stow_comm_dp_n (const StowCluster *c, const StowCostOptions *o,
                       double bytes, double count, guint64 n, guint64 stride,
                       gboolean half);

/* How many collectives layout @l's engine moves @params parameters of
 * @elem bytes in, over @ndp ranks, with @v model chunks of @layers layers
 * in all. */
double stow_comm_dp_buckets (const StowLayout *l, guint64 ndp, double params,
                             double elem, double v, guint64 layers);

/* stow_cost_estimate on a plan's parts: the search's hot path varies one
 * layout in place rather than copying a plan per candidate. */
void stow_cost_estimate_parts (const StowModel *m, const StowCluster *c,
                               const StowTraining *t, const StowLayout *l,
                               const StowCostOptions *options, StowCost *out);
