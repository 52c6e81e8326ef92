/* SPDX-License-Identifier: MIT
 *
 * reports/chart.h: the report's charts, drawn with cairo: per-GPU memory
 * by term for each pipeline stage (stacked bars against the usable
 * capacity) and the top candidates (memory against throughput when a time
 * model gives it, else memory and headroom).  cairo is optional: without
 * it every function fails with STOW_CHART_ERROR_NO_CAIRO.
 */
#pragma once

#include "reports/report.h"

G_BEGIN_DECLS

#define STOW_CHART_ERROR (stow_chart_error_quark ())
GQuark stow_chart_error_quark (void);

typedef enum
{
  STOW_CHART_ERROR_NO_CAIRO, /* built without cairo */
  STOW_CHART_ERROR_FORMAT,   /* a file name without .svg, .png or .pdf */
  STOW_CHART_ERROR_EMPTY,    /* nothing to draw (no candidates) */
} StowChartError;

typedef enum
{
  STOW_CHART_STAGES,     /* the main chart */
  STOW_CHART_CANDIDATES, /* needs r->search with fitting layouts */
} StowChartKind;

/* TRUE when this build draws charts. */
gboolean stow_chart_available (void);

/* Appends an <svg> element (no XML declaration) for inlining in HTML; its
 * ids start with @id_prefix so that several charts share one page. */
gboolean stow_chart_svg (GString *out, StowChartKind kind, const StowReport *r,
                         const char *id_prefix, GError **error);

/* Draws with @draw (called with a cairo_t * as @cr, and the size) into an
 * inline <svg> element appended to @out, ids prefixed by @id_prefix: for
 * charts drawn elsewhere in reports/ (the simulator's Gantt chart). */
typedef void (*StowChartDrawFunc) (void *cr, double width, double height,
                                   gpointer data);
gboolean stow_chart_svg_custom (GString *out, double width, double height,
                                StowChartDrawFunc draw, gpointer data,
                                const char *id_prefix, GError **error);

/* Writes the main chart to @path, the format from its extension (.svg,
 * .png, .pdf), atomically (core/json.h's stow_file_write_atomic). */
gboolean stow_chart_write (const char *path, const StowReport *r,
                           GError **error);

G_END_DECLS
