/* SPDX-License-Identifier: MIT
 *
 * reports/emit.h: configs that run a plan elsewhere: a DeepSpeed
 * ds_config.json, Megatron-LM arguments, PyTorch FSDP2/FSDP1 arguments, an
 * accelerate config YAML, and stowage's own plan file.  A layout an engine
 * cannot express is an error naming what is missing, never a quietly
 * different config.  Keys and defaults: docs/reports.md.
 */
#pragma once

#include <json-glib/json-glib.h>

#include "planner/plan-file.h"

G_BEGIN_DECLS

#define STOW_EMIT_ERROR (stow_emit_error_quark ())
GQuark stow_emit_error_quark (void);

typedef enum
{
  STOW_EMIT_ERROR_UNSUPPORTED, /* the engine cannot express the layout */
  STOW_EMIT_ERROR_PARSE,       /* an unknown --emit name */
} StowEmitError;

typedef enum
{
  STOW_EMIT_DEEPSPEED,
  STOW_EMIT_MEGATRON,
  STOW_EMIT_FSDP,
  STOW_EMIT_ACCELERATE,
  STOW_EMIT_PLAN,
} StowEmitKind;

const char *stow_emit_kind_name (StowEmitKind kind);
gboolean stow_emit_kind_parse (const char *s, const char *field,
                               StowEmitKind *out, GError **error);

/* The ds_config.json object. */
JsonNode *stow_emit_deepspeed (const StowPlanFile *plan, GError **error);
/* Megatron-LM arguments, one flag (and its value) per line, after
 * '#' comment lines saying how to launch. */
char *stow_emit_megatron (const StowPlanFile *plan, GError **error);
/* A Python snippet: the device mesh, FSDP2 fully_shard keyword arguments
 * and the FSDP1 equivalent. */
char *stow_emit_fsdp (const StowPlanFile *plan, GError **error);
/* accelerate's config YAML (DEEPSPEED, FSDP, MEGATRON_LM, MULTI_GPU or NO
 * after the layout's engine). */
char *stow_emit_accelerate (const StowPlanFile *plan, GError **error);

/* Any kind as text ready to write; @mem is the plan's memory (the plan
 * file records its terms). */
char *stow_emit (StowEmitKind kind, const StowPlanFile *plan,
                 const StowMemory *mem, GError **error);

G_END_DECLS
