/* SPDX-License-Identifier: MIT
 *
 * planner/sim.h: the simulator backend.  Virtual time: each op
 * is priced from the cluster's FLOP rates and bandwidths and, for the ops
 * of a lowered plan, from the time model (planner/cost.c), so simulated
 * and predicted steps price the same work alike.  No data: buffers only
 * count bytes against a per-rank, per-tier capacity.
 */
#pragma once

#include "hw/hw.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "program/backend.h"

G_BEGIN_DECLS

/* Bytes of memory traffic per parameter of an Adam update, which the
 * simulator divides by the host's or the GPU's memory bandwidth: read fp32
 * master, exp_avg, exp_avg_sq and write them back (24), read the gradient
 * and write the low-precision weight (2 + 2).  CPU Adam streams at about
 * STREAM-triad speed (bench/results/adam-vm-*.md). */
#define STOW_SIM_ADAM_BYTES_PER_PARAM 28.0

/* The sim of @plan (copied; its model and cluster referenced): its ops
 * priced by the time model for its layout.  A plan with no model prices
 * a hand-built program's ops from the cluster alone (its layout is not
 * read).  @capacity_bytes, [STOW_N_TIERS] bytes each rank may hold per
 * tier (0 unlimited), may be NULL. */
StowBackend *stow_backend_sim_new (const StowPlan *plan,
                                   const guint64 *capacity_bytes);
/* Hand-built programs in tests: op @op takes @seconds, whatever it is. */
void stow_backend_sim_set_op_seconds (StowBackend *sim, guint op,
                                      double seconds);
/* What the sim prices @op at, in seconds; @flops (may be NULL) gets the
 * FLOPs it counts for a compute op. */
double stow_sim_op_seconds (StowBackend *sim, const StowProgram *p, guint op,
                            double *flops);

G_END_DECLS
