/* SPDX-License-Identifier: MIT
 *
 * reports/html.c: the report as one self-contained HTML page to attach to
 * a ticket: the verdict, the layout, the charts (inline SVG from cairo),
 * host RAM and NVMe, and every term with its formula.  No scripts, no
 * external fonts or styles, nothing fetched from the network.
 */
#include "reports/report.h"

#include "core/units.h"
#include "reports/chart.h"

static void
esc (GString *out, const char *s)
{
  g_autofree char *e = g_markup_escape_text (s ? s : "", -1);
  g_string_append (out, e);
}

static void
gib (GString *out, guint64 bytes)
{
  g_autofree char *g = stow_format_gib (bytes);
  g_string_append (out, g);
}

static const char css[]
    = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;"
      "margin:0 auto;max-width:1100px;padding:16px 24px;color:#1b1b1b;"
      "line-height:1.45}"
      "h1{font-size:1.6em;margin:.3em 0}h2{font-size:1.25em;margin-top:1.6em;"
      "border-bottom:1px solid #ddd;padding-bottom:.2em}"
      ".verdict{display:inline-block;padding:.25em .8em;border-radius:6px;"
      "font-weight:700;color:#fff}.fits{background:#2e7d32}"
      ".nofit{background:#c62828}"
      "table{border-collapse:collapse;margin:.6em 0;width:100%}"
      "th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;"
      "vertical-align:top}th{background:#f4f4f4}"
      "td.n{text-align:right;font-variant-numeric:tabular-nums;"
      "white-space:nowrap}"
      "td.f{font-family:ui-monospace,Menlo,Consolas,monospace;"
      "font-size:.85em;color:#333}"
      "dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px}"
      "dt{font-weight:600}dd{margin:0}"
      ".chart{border:1px solid #e4e4e4;border-radius:6px;padding:8px;"
      "margin:.6em 0;overflow-x:auto}"
      ".note{background:#fff8e1;border:1px solid #f0d48a;padding:8px 12px;"
      "border-radius:6px}"
      ".bar{background:#e8eef5;border-radius:3px;height:12px;min-width:120px}"
      ".bar>span{display:block;height:12px;border-radius:3px;"
      "background:#4e79a7}.bar>span.over{background:#c62828}"
      "footer{margin-top:2em;color:#666;font-size:.85em}";

static void
terms_table (GString *out, GArray *terms)
{
  g_string_append (out, "<table><tr><th>term</th><th>tier</th>"
                        "<th>GiB</th><th>formula</th></tr>\n");
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      g_string_append (out, "<tr><td>");
      esc (out, t->name);
      g_string_append_printf (out, "</td><td>%s</td><td class=\"n\">",
                              stow_tier_name (t->tier));
      gib (out, t->bytes);
      g_string_append (out, "</td><td class=\"f\">");
      esc (out, t->formula);
      g_string_append (out, "</td></tr>\n");
    }
  g_string_append (out, "</table>\n");
}

/* A used-of-capacity row with a small bar. */
static void
usage_row (GString *out, const char *what, guint64 used, guint64 cap)
{
  double frac = cap ? (double)used / (double)cap : 0;
  g_string_append (out, "<tr><td>");
  esc (out, what);
  g_string_append (out, "</td><td class=\"n\">");
  gib (out, used);
  g_string_append (out, "</td><td class=\"n\">");
  if (cap)
    gib (out, cap);
  else
    g_string_append (out, "unknown");
  g_string_append_printf (out,
                          "</td><td><div class=\"bar\"><span%s "
                          "style=\"width:%.1f%%\"></span></div></td></tr>\n",
                          frac > 1 ? " class=\"over\"" : "",
                          MIN (frac, 1.0) * 100);
}

static void
chart (GString *out, StowChartKind kind, const StowReport *r,
       const char *prefix, const char *caption)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GString) svg = g_string_new (NULL);
  if (stow_chart_svg (svg, kind, r, prefix, &error))
    {
      g_string_append_printf (out, "<figure class=\"chart\" aria-label=\"");
      esc (out, caption);
      g_string_append (out, "\">");
      g_string_append (out, svg->str);
      g_string_append (out, "</figure>\n");
    }
  else
    {
      g_string_append (out, "<p class=\"note\">Chart not drawn: ");
      esc (out, error->message);
      g_string_append (out, ". The numbers are in the tables below.</p>\n");
    }
}

void
stow_report_html (GString *out, const StowReport *r)
{
  const StowMemoryReport *mr = &r->mem;
  const StowMemory *m = mr->memory;
  const StowCluster *c = mr->cluster;
  gboolean fits = r->search ? r->fits : m->fits;
  g_autofree char *layout = stow_layout_describe (mr->layout);
  char buf[STOW_FORMAT_BUF];

  g_string_append (out, "<!DOCTYPE html>\n<html lang=\"en\"><head>"
                        "<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
                        "content=\"width=device-width,initial-scale=1\">\n"
                        "<title>stowage ");
  esc (out, r->command ? r->command : "report");
  g_string_append (out, ": ");
  esc (out, mr->model ? mr->model->name : "model");
  g_string_append (out, " on ");
  esc (out, c->spec);
  g_string_append_printf (out, "</title>\n<style>%s</style></head><body>\n",
                          css);

  g_string_append (out, "<h1>");
  esc (out, mr->model ? mr->model->name : "model");
  g_string_append (out, " on ");
  esc (out, c->spec);
  g_string_append_printf (out, "</h1>\n<p><span class=\"verdict %s\">%s</span>",
                          fits ? "fits" : "nofit",
                          fits ? "FITS" : "DOES NOT FIT");
  if (!m->fits)
    {
      g_autofree char *what = stow_memory_short_of (m);
      g_string_append_printf (out, " &nbsp;short of %s", what);
    }
  g_string_append (out, "</p>\n");
  if (r->search)
    {
      g_autoptr (GString) counts = g_string_new (NULL);
      stow_report_search_counts (counts, r->search, -1);
      g_string_append (out, "<p>");
      esc (out, counts->str);
      g_string_append (out, ".</p>\n");
    }

  g_string_append (out, "<h2>Layout</h2>\n<dl>");
  if (mr->model)
    {
      g_string_append (out, "<dt>model</dt><dd>");
      esc (out, mr->model->name);
      g_string_append_printf (
          out, " (%s, %s parameters)</dd>", mr->model->family,
          stow_format_grouped_into (buf, sizeof buf, mr->model->params));
    }
  g_string_append (out, "<dt>cluster</dt><dd>");
  esc (out, c->spec);
  g_string_append_printf (out, ": %u node%s x %u ", c->n_nodes,
                          c->n_nodes == 1 ? "" : "s", c->node.gpus_per_node);
  esc (out, c->node.gpu.name);
  g_autofree char *host = stow_report_host_line (c);
  g_string_append (out, "</dd><dt>host</dt><dd>");
  esc (out, host);
  g_string_append (out, "</dd><dt>layout</dt><dd>");
  esc (out, layout);
  g_string_append_printf (
      out,
      "</dd><dt>training</dt><dd>seq %" G_GUINT64_FORMAT
      ", %s, %s, %s, %" G_GUINT64_FORMAT " sequences per step</dd>",
      mr->training->seq_len, stow_precision_name (mr->training->precision),
      stow_optimizer_name (mr->training->optimizer),
      stow_finetune_name (mr->training->finetune),
      mr->layout->micro_batch * mr->layout->grad_accum * mr->layout->dp);
  if (m->convention != STOW_CONVENTION_STOWAGE)
    g_string_append_printf (out, "<dt>convention</dt><dd>%s</dd>",
                            stow_convention_name (m->convention));
  g_string_append (out, "</dl>\n<p>Sizes are in GiB (2<sup>30</sup> "
                        "bytes).</p>\n");

  g_string_append (out, "<h2>GPU memory</h2>\n");
  chart (out, STOW_CHART_STAGES, r, "stages-",
         "Memory per GPU by pipeline stage");
  g_string_append (out, "<table><tr><th>stage</th><th>layers</th>"
                        "<th>allocated GiB</th><th>reserved GiB</th>"
                        "<th>total GiB</th></tr>\n");
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      g_string_append_printf (
          out,
          "<tr><td>%u%s</td><td class=\"n\">%" G_GUINT64_FORMAT
          "</td><td class=\"n\">",
          i, i == m->peak_stage ? " (peak)" : "", s->layers);
      gib (out, s->allocated_bytes);
      g_string_append (out, "</td><td class=\"n\">");
      gib (out, s->reserved_bytes);
      g_string_append (out, "</td><td class=\"n\">");
      gib (out, s->total_bytes);
      g_string_append (out, "</td></tr>\n");
    }
  g_string_append (out, "</table>\n");

  guint n = stow_report_n_candidates (r, 8);
  if (n > 0)
    {
      g_string_append (out, "<h2>Top candidates</h2>\n");
      g_string_append (out, "<p>Ranked by predicted throughput, fastest "
                            "first: the time model's step time, tokens per "
                            "second and model FLOPs utilisation "
                            "(docs/time-model.md).</p>\n");
      chart (out, STOW_CHART_CANDIDATES, r, "cands-",
             "Top candidates: memory per GPU");
      g_string_append (out, "<table><tr><th>#</th><th>layout</th>"
                            "<th>GPU GiB</th><th>headroom GiB</th>"
                            "<th>step</th><th>tokens/s</th><th>MFU</th>");
      g_string_append (out, "</tr>\n");
      for (guint i = 0; i < n; i++)
        {
          const StowCandidate *cand
              = &g_array_index (r->search->fits, StowCandidate, i);
          g_autofree char *d = stow_layout_describe (&cand->layout);
          g_string_append_printf (out, "<tr><td class=\"n\">%u</td><td>",
                                  i + 1);
          esc (out, d);
          g_string_append (out, "</td><td class=\"n\">");
          gib (out, cand->total_bytes);
          g_string_append (out, "</td><td class=\"n\">");
          gib (out, (guint64)MAX (cand->headroom_bytes, 0));
          g_autofree char *step
              = stow_report_format_step (cand->cost.step_time_s);
          g_string_append_printf (
              out,
              "</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
              "<td class=\"n\">%.1f%%",
              step,
              stow_format_grouped_into (
                  buf, sizeof buf, (guint64)(cand->cost.tokens_per_s + 0.5)),
              100 * cand->cost.mfu);
          g_string_append (out, "</td></tr>\n");
        }
      g_string_append (out, "</table>\n");
    }

  g_string_append (out, "<h2>Host RAM and NVMe per node</h2>\n"
                        "<table><tr><th></th><th>needed GiB</th>"
                        "<th>available GiB</th><th>use</th></tr>\n");
  usage_row (out, "GPU (peak stage)", m->total_bytes, m->capacity_bytes);
  usage_row (out, "host RAM", m->host_total_bytes, m->host_capacity_bytes);
  usage_row (out, "NVMe", m->nvme_bytes, m->nvme_capacity_bytes);
  g_string_append (out, "</table>\n");
  if (m->host_terms->len)
    {
      g_string_append (out, "<h3>Host RAM terms</h3>\n");
      terms_table (out, m->host_terms);
    }
  if (m->nvme_terms->len)
    {
      g_string_append (out, "<h3>NVMe terms</h3>\n");
      terms_table (out, m->nvme_terms);
    }

  g_string_append (out, "<h2>Every term and its formula</h2>\n");
  for (guint i = 0; i < m->n_stages; i++)
    {
      if (m->n_stages > 1)
        g_string_append_printf (out, "<h3>Stage %u%s, per GPU</h3>\n", i,
                                i == m->peak_stage ? " (peak)" : "");
      terms_table (out, m->stages[i].terms);
    }
  if (r->alternatives && r->alternatives[0])
    {
      g_string_append (out, "<h2>What would fit</h2>\n<ul>\n");
      for (const char *const *a = r->alternatives; *a; a++)
        {
          g_string_append (out, "<li>");
          esc (out, *a);
          g_string_append (out, "</li>\n");
        }
      g_string_append (out, "</ul>\n");
    }
  g_string_append (out, "<footer>Written by stowage. The memory model and "
                        "its sources: docs/memory-model.md.</footer>\n"
                        "</body></html>\n");
}
