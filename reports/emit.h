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

/* TRUE when --emit @kind can express @layout for @model (may be NULL under
 * --params) on @cluster with @training, as the emitter above would; else
 * FALSE with STOW_EMIT_ERROR_UNSUPPORTED naming what the engine lacks (the
 * emitter's own error).  Allocates nothing when @error is NULL, so a
 * search can ask it of every layout it visits.  Always TRUE for plan. */
gboolean stow_emit_check (StowEmitKind kind, const StowModel *model,
                          const StowCluster *cluster,
                          const StowTraining *training,
                          const StowLayout *layout, GError **error);
/* The engines whose memory models a config of @kind is planned with, a
 * bit set of 1 << StowEngine: one for deepspeed, megatron and fsdp; for
 * accelerate the engines behind its distributed types (DeepSpeed, FSDP,
 * Megatron-LM, and plain PyTorch on one GPU); 0 for plan. */
guint stow_emit_kind_engines (StowEmitKind kind);

/* What a user must know before running the config @kind writes for
 * @plan, one sentence each (NULL-terminated; free with g_strfreev): for
 * now, NVMe swap files going to STOW_PLAN_NVME_PLACEHOLDER because no
 * drive path was named. */
char **stow_emit_warnings (StowEmitKind kind, const StowPlanFile *plan);

/* What the config @kind writes for @plan cannot carry of the run's
 * optimizer settings, and what the user must do about it, one sentence
 * each, "--emit KIND: ..." (NULL-terminated; free with g_strfreev): a
 * schedule the engine computes a step apart, the tensors weight decay
 * skips, the run's length, an accelerate config's missing optimizer.
 * Empty for a layout the config cannot express. */
char **stow_emit_notes (StowEmitKind kind, const StowPlanFile *plan);

/* Any kind as text ready to write; @mem is the plan's memory (the plan
 * file records its terms). */
char *stow_emit (StowEmitKind kind, const StowPlanFile *plan,
                 const StowMemory *mem, GError **error);

G_END_DECLS
