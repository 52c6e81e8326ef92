/* SPDX-License-Identifier: MIT
 *
 * reports/emit-private.h: the optimizer settings (core/optim.h) in each
 * engine's own terms, shared by the emitters in emit.c: DeepSpeed's
 * optimizer, scheduler and gradient_clipping, Megatron-LM's flags, the
 * FSDP snippet's optimizer and schedule, and the notes on stderr for what
 * a config cannot carry.
 */
#pragma once

#include <json-glib/json-glib.h>

#include "reports/emit.h"

G_BEGIN_DECLS

/* @v as the shortest text that reads back as the same double, with a
 * decimal point. */
void stow_emit_append_double (GString *s, double v);
/* ds_config.json's gradient_clipping, optimizer and scheduler. */
void stow_emit_deepspeed_optim (JsonObject *root, const StowPlanFile *p);
/* Megatron-LM's optimizer, schedule, clipping and length flags. */
void stow_emit_megatron_optim (GString *s, const StowPlanFile *p);
/* The FSDP snippet's optimizer, schedule and clipping, in Python. */
void stow_emit_fsdp_optim (GString *s, const StowPlanFile *p);
/* Adds to @notes (strings, owned) one line per optimizer setting the
 * config of @kind cannot carry, with what the user must do; @accelerate_type
 * is accelerate's distributed_type (kind accelerate only). */
void stow_emit_optim_notes (StowEmitKind kind, const StowPlanFile *p,
                            const char *accelerate_type, GPtrArray *notes);

G_END_DECLS
