/* SPDX-License-Identifier: MIT
 *
 * reports/sim-report.c: `stowage simulate` in CSV, Markdown and HTML with
 * a Gantt chart of the step (cairo, inline SVG).
 */
#include "config.h"

#include "reports/sim-report.h"

#include <math.h>

#include "core/units.h"
#include "reports/chart.h"

#if STOW_HAVE_CAIRO
#include <cairo.h>
#endif

void
stow_report_sim_csv (GString *out, const StowTrace *t, const StowProgram *p)
{
  g_string_append (out, "op,rank,stream,kind,layer,micro_batch,start_s,end_s,"
                        "bytes,flops\n");
  for (guint i = 0; i < p->ops->len && i < t->n_ops; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      g_string_append_printf (
          out, "%u,%u,%s,%s,%d,%u,%.9g,%.9g,%" G_GUINT64_FORMAT ",%.9g\n", i,
          op->rank, stow_stream_name (op->stream), stow_op_kind_name (op->kind),
          op->layer, op->micro_batch, t->ops[i].start_s, t->ops[i].end_s,
          op->bytes, t->ops[i].flops);
    }
}

void
stow_report_sim_md (GString *out, const StowTrace *t, const StowProgram *p,
                    const char *title)
{
  g_autofree char *step = stow_format_duration (t->step_time_s);
  g_string_append_printf (out, "# stowage simulate: %s\n\n%s\n\n", title,
                          p->description);
  g_string_append_printf (out,
                          "Step time **%s**; %u ops over %u ranks. "
                          "Sizes in GiB (2^30 bytes).\n\n",
                          step, t->n_ops, t->n_ranks);
  g_string_append (out, "| stream | busy (s) | exposed (s) |\n"
                        "|---|---:|---:|\n");
  for (int s = 0; s < STOW_N_STREAMS; s++)
    g_string_append_printf (out, "| %s | %.4g | %.4g |\n",
                            stow_stream_name ((StowStream)s), t->busy_s[s],
                            t->exposed_s[s]);
  g_string_append (out, "\n| tier | peak (GiB) | at (s) |\n|---|---:|---:|\n");
  for (int k = 0; k < STOW_N_TIERS; k++)
    g_string_append_printf (
        out, "| %s | %.2f | %.4g |\n", stow_tier_name ((StowTier)k),
        (double)t->peak_bytes[k] / 1073741824.0, t->peak_time_s[k]);
}

#if STOW_HAVE_CAIRO
typedef struct
{
  const StowTrace *t;
  const StowProgram *p;
  guint rank;
} Gantt;

static const double kind_rgb[STOW_N_OP_KINDS][3] = {
  [STOW_OP_ALLOC] = { 0.6, 0.6, 0.6 },
  [STOW_OP_FREE] = { 0.6, 0.6, 0.6 },
  [STOW_OP_COPY] = { 0.95, 0.6, 0.2 },
  [STOW_OP_FORWARD] = { 0.3, 0.5, 0.75 },
  [STOW_OP_BACKWARD] = { 0.2, 0.35, 0.6 },
  [STOW_OP_RECOMPUTE] = { 0.55, 0.7, 0.9 },
  [STOW_OP_LOSS] = { 0.85, 0.3, 0.3 },
  [STOW_OP_OPTIM_STEP] = { 0.35, 0.65, 0.35 },
  [STOW_OP_COLLECTIVE] = { 0.6, 0.4, 0.7 },
  [STOW_OP_DATA] = { 0.8, 0.8, 0.5 },
  [STOW_OP_GRAD_NORM] = { 0.5, 0.8, 0.5 },
};

/* Rows are the streams of one rank; x is time over the step. */
static void
draw_gantt (void *vcr, double w, double h, gpointer data)
{
  cairo_t *cr = vcr;
  const Gantt *g = data;
  double left = 90, right = 20, top = 30, row = 26, bottom = 40;
  double pw = w - left - right, step = MAX (g->t->step_time_s, 1e-12);
  cairo_set_source_rgb (cr, 1, 1, 1);
  cairo_paint (cr);
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size (cr, 12);
  cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
  char title[96];
  g_snprintf (title, sizeof title, "Step of rank %u, by stream (%.4g s)",
              g->rank, g->t->step_time_s);
  cairo_move_to (cr, left, 18);
  cairo_show_text (cr, title);
  cairo_set_font_size (cr, 11);
  for (int s = 0; s < STOW_N_STREAMS; s++)
    {
      double y = top + s * row;
      cairo_set_source_rgb (cr, s % 2 ? 0.97 : 0.93, s % 2 ? 0.97 : 0.93,
                            s % 2 ? 0.97 : 0.93);
      cairo_rectangle (cr, left, y, pw, row);
      cairo_fill (cr);
      cairo_set_source_rgb (cr, 0.2, 0.2, 0.2);
      cairo_move_to (cr, 6, y + row * 0.65);
      cairo_show_text (cr, stow_stream_name ((StowStream)s));
    }
  for (guint i = 0; i < g->p->ops->len && i < g->t->n_ops; i++)
    {
      const StowOp *op = &g_array_index (g->p->ops, StowOp, i);
      const StowTraceOp *to = &g->t->ops[i];
      if (op->rank != g->rank || op->kind == STOW_OP_ALLOC
          || op->kind == STOW_OP_FREE || to->end_s <= to->start_s)
        continue;
      double x0 = left + pw * to->start_s / step;
      double x1 = left + pw * to->end_s / step;
      double y = top + op->stream * row + 3;
      cairo_set_source_rgb (cr, kind_rgb[op->kind][0], kind_rgb[op->kind][1],
                            kind_rgb[op->kind][2]);
      cairo_rectangle (cr, x0, y, MAX (x1 - x0, 0.5), row - 6);
      cairo_fill (cr);
    }
  /* Time axis: five ticks. */
  double ybase = top + STOW_N_STREAMS * row;
  cairo_set_source_rgb (cr, 0.3, 0.3, 0.3);
  cairo_set_line_width (cr, 1);
  cairo_move_to (cr, left, ybase);
  cairo_line_to (cr, left + pw, ybase);
  cairo_stroke (cr);
  for (int k = 0; k <= 4; k++)
    {
      double x = left + pw * k / 4.0;
      char lab[32];
      g_snprintf (lab, sizeof lab, "%.3g s", step * k / 4.0);
      cairo_move_to (cr, x, ybase);
      cairo_line_to (cr, x, ybase + 4);
      cairo_stroke (cr);
      cairo_text_extents_t e;
      cairo_text_extents (cr, lab, &e);
      cairo_move_to (cr, MIN (x - e.width / 2, w - e.width - 2), ybase + 16);
      cairo_show_text (cr, lab);
    }
  /* Legend of op kinds. */
  static const StowOpKind shown[]
      = { STOW_OP_FORWARD, STOW_OP_BACKWARD,   STOW_OP_RECOMPUTE, STOW_OP_LOSS,
          STOW_OP_COPY,    STOW_OP_OPTIM_STEP, STOW_OP_COLLECTIVE };
  double x = left;
  for (gsize k = 0; k < G_N_ELEMENTS (shown); k++)
    {
      const char *name = stow_op_kind_name (shown[k]);
      cairo_set_source_rgb (cr, kind_rgb[shown[k]][0], kind_rgb[shown[k]][1],
                            kind_rgb[shown[k]][2]);
      cairo_rectangle (cr, x, h - bottom + 24, 10, 10);
      cairo_fill (cr);
      cairo_set_source_rgb (cr, 0.2, 0.2, 0.2);
      cairo_move_to (cr, x + 14, h - bottom + 33);
      cairo_show_text (cr, name);
      cairo_text_extents_t e;
      cairo_text_extents (cr, name, &e);
      x += 24 + e.width;
    }
}
#endif

void
stow_report_sim_html (GString *out, const StowTrace *t, const StowProgram *p,
                      const char *title)
{
  g_autofree char *etitle = g_markup_escape_text (title, -1);
  g_autofree char *edesc = g_markup_escape_text (p->description, -1);
  g_autofree char *step = stow_format_duration (t->step_time_s);
  g_string_append_printf (
      out,
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width\">\n"
      "<title>stowage simulate: %s</title>\n<style>\n"
      "body{font-family:sans-serif;max-width:1100px;margin:2em auto;"
      "padding:0 1em;color:#222}\n"
      "table{border-collapse:collapse;margin:1em 0}\n"
      "td,th{border:1px solid #ccc;padding:4px 10px}\n"
      "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
      "th{background:#f2f2f2;text-align:left}\n</style></head><body>\n"
      "<h1>%s</h1>\n<p>%s</p>\n<p>Step time <b>%s</b>; %u ops over %u "
      "ranks. Sizes in GiB (2<sup>30</sup> bytes).</p>\n",
      etitle, etitle, edesc, step, t->n_ops, t->n_ranks);

  g_string_append (out, "<h2>The step</h2>\n");
  g_autoptr (GError) error = NULL;
#if STOW_HAVE_CAIRO
  Gantt g = { t, p, t->critical_rank };
  if (!stow_chart_svg_custom (out, 1000, 30 + STOW_N_STREAMS * 26 + 60,
                              draw_gantt, &g, "gantt-", &error))
#else
  if (!stow_chart_svg_custom (out, 0, 0, NULL, NULL, NULL, &error))
#endif
    {
      g_autofree char *e = g_markup_escape_text (error->message, -1);
      g_string_append_printf (out, "<p><i>No chart: %s</i></p>\n", e);
    }

  g_string_append (out, "<h2>Streams of the critical rank</h2>\n<table>"
                        "<tr><th>stream</th><th>busy (s)</th>"
                        "<th>exposed (s)</th></tr>\n");
  for (int s = 0; s < STOW_N_STREAMS; s++)
    g_string_append_printf (out,
                            "<tr><td>%s</td><td class=\"n\">%.4g</td>"
                            "<td class=\"n\">%.4g</td></tr>\n",
                            stow_stream_name ((StowStream)s), t->busy_s[s],
                            t->exposed_s[s]);
  g_string_append (out, "</table>\n<h2>Peak memory</h2>\n<table><tr>"
                        "<th>tier</th><th>peak GiB</th><th>at (s)</th>"
                        "<th>rank</th><th>op</th></tr>\n");
  for (int k = 0; k < STOW_N_TIERS; k++)
    {
      g_autofree char *what
          = t->peak_op[k] != STOW_NONE && t->peak_op[k] < p->ops->len
                ? stow_op_describe (p, t->peak_op[k])
                : g_strdup ("persistent state");
      g_autofree char *lab = g_markup_escape_text (what, -1);
      g_string_append_printf (
          out,
          "<tr><td>%s</td><td class=\"n\">%.2f</td><td class=\"n\">%.4g</td>"
          "<td class=\"n\">%u</td><td>%s</td></tr>\n",
          stow_tier_name ((StowTier)k), (double)t->peak_bytes[k] / 1073741824.0,
          t->peak_time_s[k], t->peak_rank[k], lab);
    }
  g_string_append (out, "</table>\n<h2>Critical path</h2>\n<pre>");
  g_autoptr (GString) cp = g_string_new (NULL);
  stow_trace_critical_summary (t, p, cp, 12);
  g_autofree char *ecp = g_markup_escape_text (cp->str, -1);
  g_string_append_printf (out, "%s</pre>\n</body></html>\n", ecp);
}
