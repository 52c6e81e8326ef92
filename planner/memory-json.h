/* SPDX-License-Identifier: MIT
 *
 * planner/memory-json.h: a StowMemory as JSON, written by one function in
 * the two shapes its readers know: the reports' (`mem --json`, `fit
 * --json`: "device", "host" and "nvme" objects, docs/json.md) and the plan
 * file's (one flat "memory" object, docs/plan-file.md).
 */
#pragma once

#include <json-glib/json-glib.h>

#include "planner/memory.h"

G_BEGIN_DECLS

typedef enum
{
  /* Members "device", "host" and "nvme" of the report's document, each
   * an object ("device": {"total_bytes", ..., "stages"}); the report
   * writes "fits" itself, at its top. */
  STOW_MEMORY_JSON_REPORT,
  /* The members of the plan file's "memory" object: "fits", then the
   * same figures with the tier in the name ("device_total_bytes",
   * "host_terms"; "peak_stage" and "stages" as they are). */
  STOW_MEMORY_JSON_PLAN,
} StowMemoryJsonShape;

/* Adds @mem's figures, stages and terms to the object @b is building, in
 * @shape.  Both shapes carry every figure; a term is {name, bytes, tier,
 * formula}. */
void stow_memory_json_members (JsonBuilder *b, const StowMemory *mem,
                               StowMemoryJsonShape shape);

G_END_DECLS
