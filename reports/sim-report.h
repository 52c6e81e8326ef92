/* SPDX-License-Identifier: MIT
 *
 * reports/sim-report.h: a simulated step as CSV (one row per op, raw
 * seconds and bytes), Markdown (IEC units) and a self-contained HTML page
 * whose Gantt chart shows each stream of the critical rank over the step.
 */
#pragma once

#include "planner/lower.h"
#include "program/trace.h"

G_BEGIN_DECLS

void stow_report_sim_csv (GString *out, const StowTrace *t,
                          const StowProgram *p);
void stow_report_sim_md (GString *out, const StowTrace *t, const StowProgram *p,
                         const char *title);
void stow_report_sim_html (GString *out, const StowTrace *t,
                           const StowProgram *p, const char *title);

G_END_DECLS
