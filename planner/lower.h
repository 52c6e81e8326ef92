/* SPDX-License-Identifier: MIT
 *
 * planner/lower.h: the lowering of a plan (planner/plan.h) to its step
 * program (program/program.h), one program rank per
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
#include "planner/plan.h"
#include "program/program.h"

G_BEGIN_DECLS

/* Lowers @plan (its layout, with its memory options sizing the buffers
 * and its lowering options).  Fails (STOW_PLAN_ERROR_INVALID) for a
 * layout that does not validate, or one the lowering does not cover yet
 * (engines other than stowage; LoRA with ZeRO 3 or offload), naming it. */
StowProgram *stow_lower (const StowPlan *plan, GError **error);

G_END_DECLS
