/* SPDX-License-Identifier: MIT
 *
 * reports/plan-report.h: the ranked table of `stowage plan` as CSV (raw
 * bytes and seconds, one row per layout) and as Markdown (IEC units).
 */
#pragma once

#include "planner/search.h"

G_BEGIN_DECLS

/* At most @top rows of @s->fits, best first. */
void stow_report_plan_csv (GString *out, const StowSearch *s, guint top);
void stow_report_plan_md (GString *out, const StowSearch *s, const char *model,
                          const char *gpus, guint top);

G_END_DECLS
