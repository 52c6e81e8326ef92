/* SPDX-License-Identifier: MIT
 *
 * cli/all-offloads.h: `fit --all-offloads`, one row per ZeRO stage and
 * offload choice (see all-offloads.c).
 */
#pragma once

#include "cli/plan-options.h"

G_BEGIN_DECLS

/* Answers the table (text, or JSON under --json) for the resolved @po; the
 * flags must leave --zero and both --offload flags open.  Under --convention
 * deepspeed-estimator (or -docs) the rows and format are DeepSpeed's own
 * (model states only; --params and --largest-layer may stand in for a
 * model).  Returns 0 when some row fits, 1 when none does, 2 on error. */
int stow_all_offloads_run (StowPlanOptions *po);

G_END_DECLS
