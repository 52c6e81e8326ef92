/* SPDX-License-Identifier: MIT
 *
 * reports/report.h: one answer (a layout's memory, and for a search the
 * verdict and the top candidates) rendered as text, JSON, CSV, Markdown or
 * a self-contained HTML page with charts.  Commands fill a StowReport and
 * pick a format; nothing here prints or exits.
 */
#pragma once

#include "reports/memory-report.h"

G_BEGIN_DECLS

typedef enum
{
  STOW_FORMAT_TEXT,
  STOW_FORMAT_JSON,
  STOW_FORMAT_CSV,
  STOW_FORMAT_MD,
  STOW_FORMAT_HTML,
} StowFormat;

const char *stow_format_name (StowFormat f);
/* "text", "json", "csv", "md" (or "markdown"), "html". */
gboolean stow_format_parse (const char *s, const char *field, StowFormat *out,
                            GError **error);

typedef struct
{
  StowMemoryReport mem; /* the chosen layout (or the closest miss) */
  const char *command;  /* "fit", "mem", "plan": the page's title */
  /* From a search (fit, plan); search == NULL for one layout (mem). */
  const StowSearch *search;
  gboolean fits;
  /* Throughput of each of search->fits, in tokens/s; NULL until a time
   * model supplies it, and the charts then plot memory and headroom. */
  const double *throughput;
  guint n_throughput;
  /* What would fit instead, one line each (may be NULL), and beside each
   * its kind as the JSON's "kind" names it ("more_gpus", "larger_gpu",
   * "finetune", "more_host_memory"). */
  const char *const *alternatives;
  const char *const *alternative_kinds;
} StowReport;

/* Comma-separated values (RFC 4180): one row per term with raw bytes, then
 * the totals; the header names the columns. */
void stow_report_csv (GString *out, const StowReport *r);
/* GitHub-flavoured Markdown, IEC units. */
void stow_report_md (GString *out, const StowReport *r);
/* One self-contained HTML page (inline CSS and SVG, no scripts, no network
 * access).  Without cairo the charts are replaced by a note. */
void stow_report_html (GString *out, const StowReport *r);

/* The search's counts in one sentence that adds up: "2,808 layouts
 * evaluated[ in 0.058 s]: 2,796 fit, 12 out of GPU memory, 0 out of host
 * RAM or NVMe; 1,084 combinations invalid (divisibility, engine)", and
 * the ZeRO stages listed once when there were any.  @seconds < 0 leaves
 * the time out. */
void stow_report_search_counts (GString *out, const StowSearch *s,
                                double seconds);
/* Seconds for people: "0.5522 s", "12.35 min", "113.8 h" (never an
 * exponent). */
char *stow_report_format_step (double seconds);

/* How many of the search's fitting layouts the tables and charts show:
 * at most @max. */
guint stow_report_n_candidates (const StowReport *r, guint max);
/* The top @max candidates as a JSON array: {"rank", "layout",
 * "total_bytes", "host_bytes", "nvme_bytes", "headroom_bytes",
 * "step_time_s", "tokens_per_s", "mfu"}: the time model's prediction. */
JsonNode *stow_report_candidates_json (const StowReport *r, guint max);

G_END_DECLS
