/* SPDX-License-Identifier: MIT
 *
 * reports/memory-report.h: a memory breakdown as text (IEC units, a table
 * per tier, formulas with --explain) or as JSON (raw integer bytes; the
 * schema is in docs/json.md).
 */
#pragma once

#include <json-glib/json-glib.h>

#include "planner/memory.h"
#include "planner/search.h"

G_BEGIN_DECLS

#define STOW_JSON_VERSION 1

typedef struct
{
  const StowModel *model; /* may be NULL under --params */
  const StowCluster *cluster;
  const StowTraining *training;
  const StowLayout *layout;
  const StowMemOptions *options;
  const StowMemory *memory;
  /* The layout flags `mem` and `simulate` filled as `fit` would (names
   * without "--", NULL-terminated), or NULL when the flags gave it. */
  const char *const *filled;
} StowMemoryReport;

JsonNode *stow_layout_to_json (const StowLayout *layout,
                               const StowTraining *training);
JsonNode *stow_memory_report_json (const StowMemoryReport *r);
/* Appends the text report; @explain adds every term's formula and every
 * pipeline stage's breakdown. */
void stow_memory_report_text (GString *out, const StowMemoryReport *r,
                              gboolean explain);
/* "as 'stowage fit' would (...): --zero --micro-batch; ..." for
 * @filled (see StowMemoryReport), or NULL when nothing was filled. */
char *stow_memory_report_filled_note (const char *const *filled);
/* The host a plan assumes, in words: "1.00 TiB RAM and 4 NVMe drives of
 * 3.49 TiB per node (assumed: the pcie-8gpu preset's; give --host-ram and
 * --nvme for yours)". */
char *stow_report_host_line (const StowCluster *cluster);
/* What a layout that does not fit is short of, in words: "GPU memory",
 * "GPU memory and host RAM", "GPU memory, host RAM and NVMe". */
char *stow_memory_short_of (const StowMemory *memory);
/* One line: "dp 8 tp 1 pp 1 zero 3 ..." */
char *stow_layout_describe (const StowLayout *layout);

G_END_DECLS
