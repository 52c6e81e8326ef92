/* SPDX-License-Identifier: MIT
 *
 * cli/report-options.h: the output flags shared by `mem`, `fit` (and, once
 * they exist, `plan` and `simulate`): --format, -o, --chart, --emit,
 * --nvme-path, and --plan FILE, which stands in for the model, cluster and
 * layout flags.
 */
#pragma once

#include "cli/plan-options.h"
#include "reports/emit.h"
#include "reports/report.h"

G_BEGIN_DECLS

typedef struct
{
  char *format, *output, *chart, *emit, *plan, *nvme_path; /* raw flags */
  StowFormat format_v;
  gboolean have_emit;
  StowEmitKind emit_v;
  /* From --plan: what the file predicted (0 when it says nothing). */
  guint64 plan_device_bytes, plan_host_bytes, plan_nvme_bytes;
} StowReportOptions;

/* Adds the flags to @ctx for the run @call (NULL: the terminal). */
void stow_report_options_add (GOptionContext *ctx, StowReportOptions *ro,
                              StowCliCall *call);
/* Parses the flags; --json (po->json) is --format json. */
gboolean stow_report_options_resolve (StowReportOptions *ro,
                                      const StowPlanOptions *po,
                                      GError **error);

/* --plan FILE: fills @po's model, cluster, training, layout, memory
 * options and pins every layout field.  A model argument or a model,
 * cluster or layout flag beside it is an error; the optimizer settings'
 * flags (po->optim) go over the plan's. */
gboolean stow_report_options_load_plan (StowReportOptions *ro,
                                        StowPlanOptions *po,
                                        const char *model_arg, GError **error);
/* --emit deepspeed, megatron, fsdp or accelerate: every search of the
 * command goes over the engines the config is planned with (its own
 * memory model, not stowage's) and keeps only layouts the config can
 * express; with one engine, the layout takes it.  An --engine, or a plan
 * file's engine, that the config does not run under is an error. */
gboolean stow_report_options_plan_engine (StowReportOptions *ro,
                                          StowPlanOptions *po, GError **error);
/* For a search that found no valid layout: under --emit, the config's
 * reason the flags' layout cannot be expressed, if it has one; else
 * stow_plan_options_fail_no_layout.  Returns the exit status. */
int stow_report_options_fail_no_layout (const StowReportOptions *ro,
                                        const StowPlanOptions *po);

/* With --plan: warns on stderr when this build's numbers differ from
 * those the plan predicted. */
void stow_report_options_check_plan (const StowReportOptions *ro,
                                     const StowMemory *mem);

/* Writes the answer: the --emit config, or the report in --format (@text
 * and @json are the text and JSON renderings the command made), to -o
 * FILE (atomically) or stdout, plus the --chart file; for the server, into
 * po->call's answer.  Returns an exit
 * code: @ok_code on success, STOW_EXIT_NO when --emit asks for a layout
 * that does not fit under `fit`, STOW_EXIT_FAILURE after printing the
 * error. */
int stow_report_options_finish (StowReportOptions *ro, StowPlanOptions *po,
                                const StowReport *report, const char *text,
                                JsonNode *json, int ok_code);

void stow_report_options_clear (StowReportOptions *ro);

G_END_DECLS
