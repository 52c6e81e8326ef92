/* SPDX-License-Identifier: MIT
 *
 * reports/formats.c: the report as CSV (raw bytes, for spreadsheets) and
 * Markdown (IEC units, for tickets and pull requests).  The HTML page is in
 * reports/html.c, the charts in reports/chart.c.
 */
#include "reports/report.h"

#include <string.h>

#include "core/json.h"
#include "core/units.h"
#include "planner/layout.h"

static const char *const format_names[] = {
  [STOW_FORMAT_TEXT] = "text", [STOW_FORMAT_JSON] = "json",
  [STOW_FORMAT_CSV] = "csv",   [STOW_FORMAT_MD] = "md",
  [STOW_FORMAT_HTML] = "html",
};

const char *
stow_format_name (StowFormat f)
{
  g_return_val_if_fail ((guint)f < G_N_ELEMENTS (format_names), "?");
  return format_names[f];
}

gboolean
stow_format_parse (const char *s, const char *field, StowFormat *out,
                   GError **error)
{
  for (guint i = 0; i < G_N_ELEMENTS (format_names); i++)
    if (g_ascii_strcasecmp (s, format_names[i]) == 0)
      {
        *out = (StowFormat)i;
        return TRUE;
      }
  if (g_ascii_strcasecmp (s, "markdown") == 0)
    {
      *out = STOW_FORMAT_MD;
      return TRUE;
    }
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s \"%s\": expected text, json, csv, md or html", field, s);
  return FALSE;
}

void
stow_report_search_counts (GString *out, const StowSearch *s, double seconds)
{
  char a[STOW_FORMAT_BUF], b[STOW_FORMAT_BUF], c[STOW_FORMAT_BUF],
      d[STOW_FORMAT_BUF], e[STOW_FORMAT_BUF];
  g_string_append_printf (out, "%s layouts evaluated",
                          stow_format_grouped_into (a, sizeof a, s->evaluated));
  if (seconds >= 0)
    g_string_append_printf (out, " in %.3f s", seconds);
  g_string_append_printf (
      out,
      ": %s fit, %s out of GPU memory, %s out of host RAM or NVMe; %s "
      "combinations invalid (divisibility, engine)",
      stow_format_grouped_into (b, sizeof b, s->fitting),
      stow_format_grouped_into (c, sizeof c, s->out_of_memory),
      stow_format_grouped_into (d, sizeof d, s->host_or_nvme),
      stow_format_grouped_into (e, sizeof e, s->invalid));
  if (s->same_as_lower_zero)
    g_string_append_printf (
        out,
        "; %s skipped: ZeRO 1 or 2 over one data-parallel rank is the stage "
        "below",
        stow_format_grouped_into (a, sizeof a, s->same_as_lower_zero));
}

char *
stow_report_format_step (double seconds)
{
  if (seconds < 1000)
    return g_strdup_printf ("%.4g s", seconds);
  return stow_format_duration (seconds);
}

guint
stow_report_n_candidates (const StowReport *r, guint max)
{
  return r->search ? MIN (r->search->fits->len, max) : 0;
}

JsonNode *
stow_report_candidates_json (const StowReport *r, guint max)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  guint n = stow_report_n_candidates (r, max);
  json_builder_begin_array (b);
  for (guint i = 0; i < n; i++)
    {
      const StowCandidate *c
          = &g_array_index (r->search->fits, StowCandidate, i);
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "rank", i + 1);
      json_builder_set_member_name (b, "layout");
      json_builder_add_value (
          b, stow_layout_to_json (&c->layout, r->mem.training));
      stow_json_set_i64 (b, "total_bytes", (gint64)c->total_bytes);
      stow_json_set_i64 (b, "host_bytes", (gint64)c->host_bytes);
      stow_json_set_i64 (b, "nvme_bytes", (gint64)c->nvme_bytes);
      stow_json_set_i64 (b, "headroom_bytes", c->headroom_bytes);
      /* The search ranked them by the time model: its prediction. */
      stow_json_set_double (b, "step_time_s", c->cost.step_time_s);
      stow_json_set_double (b, "tokens_per_s",
                            r->throughput && i < r->n_throughput
                                ? r->throughput[i]
                                : c->cost.tokens_per_s);
      stow_json_set_double (b, "mfu", c->cost.mfu);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  return json_builder_get_root (b);
}

/* ---- CSV ---- */

static void
csv_field (GString *out, const char *s)
{
  if (strpbrk (s, ",\"\r\n") == NULL)
    {
      g_string_append (out, s);
      return;
    }
  g_string_append_c (out, '"');
  for (const char *p = s; *p; p++)
    {
      if (*p == '"')
        g_string_append_c (out, '"');
      g_string_append_c (out, *p);
    }
  g_string_append_c (out, '"');
}

static void
csv_row (GString *out, const char *scope, gint stage, const char *name,
         const char *tier, guint64 bytes, const char *formula)
{
  csv_field (out, scope);
  g_string_append_c (out, ',');
  if (stage >= 0)
    g_string_append_printf (out, "%d", stage);
  g_string_append_c (out, ',');
  csv_field (out, name);
  g_string_append_c (out, ',');
  csv_field (out, tier);
  g_string_append_printf (out, ",%" G_GUINT64_FORMAT ",", bytes);
  csv_field (out, formula ? formula : "");
  g_string_append (out, "\r\n");
}

static void
csv_terms (GString *out, const char *scope, gint stage, GArray *terms)
{
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      csv_row (out, scope, stage, t->name, stow_tier_name (t->tier), t->bytes,
               t->formula);
    }
}

void
stow_report_csv (GString *out, const StowReport *r)
{
  const StowMemory *m = r->mem.memory;
  /* CRLF line ends, as RFC 4180 asks; spreadsheets accept both. */
  g_string_append (out, "scope,stage,name,tier,bytes,formula\r\n");
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      csv_terms (out, "device", (gint)i, s->terms);
      csv_row (out, "device", (gint)i, "allocated", "device",
               s->allocated_bytes, "max_memory_allocated");
      csv_row (out, "device", (gint)i, "reserved", "device", s->reserved_bytes,
               "max_memory_reserved");
      csv_row (out, "device", (gint)i, "total", "device", s->total_bytes,
               "nvidia-smi");
    }
  csv_row (out, "device", -1, "capacity", "device", m->capacity_bytes,
           "usable per GPU");
  csv_terms (out, "host", -1, m->host_terms);
  csv_row (out, "host", -1, "total", "host", m->host_total_bytes, "per node");
  csv_row (out, "host", -1, "capacity", "host", m->host_capacity_bytes,
           "installed per node");
  csv_terms (out, "nvme", -1, m->nvme_terms);
  csv_row (out, "nvme", -1, "total", "nvme", m->nvme_bytes, "per node");
  csv_row (out, "nvme", -1, "capacity", "nvme", m->nvme_capacity_bytes,
           "per node");
}

/* ---- Markdown ---- */

static void
md_escape (GString *out, const char *s)
{
  for (const char *p = s; *p; p++)
    {
      if (strchr ("|\\*_`<>[]", *p))
        g_string_append_c (out, '\\');
      g_string_append_c (out, *p);
    }
}

static void
md_gib (GString *out, guint64 bytes)
{
  g_autofree char *g = stow_format_gib (bytes);
  g_string_append (out, g);
}

static void
md_terms (GString *out, GArray *terms)
{
  g_string_append (out, "| term | tier | GiB | formula |\n"
                        "|---|---|---:|---|\n");
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      g_string_append (out, "| ");
      md_escape (out, t->name);
      g_string_append_printf (out, " | %s | ", stow_tier_name (t->tier));
      md_gib (out, t->bytes);
      g_string_append (out, " | ");
      md_escape (out, t->formula);
      g_string_append (out, " |\n");
    }
}

void
stow_report_md (GString *out, const StowReport *r)
{
  const StowMemoryReport *mr = &r->mem;
  const StowMemory *m = mr->memory;
  const StowCluster *c = mr->cluster;
  g_autofree char *layout = stow_layout_describe (mr->layout);
  char buf[STOW_FORMAT_BUF];
  gboolean fits = r->search ? r->fits : m->fits;

  g_string_append_printf (out, "# stowage %s: %s\n\n",
                          r->command ? r->command : "report",
                          fits ? "FITS" : "DOES NOT FIT");
  if (mr->model)
    {
      g_string_append (out, "- **model**: ");
      md_escape (out, mr->model->name);
      g_string_append_printf (
          out, " (%s, %s parameters)\n", mr->model->family,
          stow_format_grouped_into (buf, sizeof buf, mr->model->params));
    }
  g_string_append (out, "- **cluster**: ");
  md_escape (out, c->spec);
  g_string_append_printf (out, ", %u node%s x %u %s\n", c->n_nodes,
                          c->n_nodes == 1 ? "" : "s", c->node.gpus_per_node,
                          c->node.gpu.name);
  g_autofree char *host = stow_report_host_line (c);
  g_string_append (out, "- **host**: ");
  md_escape (out, host);
  g_string_append (out, "\n- **layout**: ");
  md_escape (out, layout);
  g_string_append_printf (
      out, "\n- **training**: seq %" G_GUINT64_FORMAT ", %s, %s, %s\n",
      mr->training->seq_len, stow_precision_name (mr->training->precision),
      stow_optimizer_name (mr->training->optimizer),
      stow_finetune_name (mr->training->finetune));
  if (m->convention != STOW_CONVENTION_STOWAGE)
    g_string_append_printf (out, "- **convention**: %s\n",
                            stow_convention_name (m->convention));
  if (r->search)
    {
      g_string_append (out, "- **search**: ");
      stow_report_search_counts (out, r->search, -1);
      g_string_append (out, "; ranked by the time model's predicted "
                            "throughput\n");
    }
  g_string_append (out, "\nSizes in GiB (2^30 bytes).\n\n");

  g_string_append (out, "## GPU memory\n\n"
                        "| stage | layers | allocated GiB | reserved GiB | "
                        "total GiB |\n|---:|---:|---:|---:|---:|\n");
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      g_string_append_printf (out, "| %u%s | %" G_GUINT64_FORMAT " | ", i,
                              i == m->peak_stage ? " (peak)" : "", s->layers);
      md_gib (out, s->allocated_bytes);
      g_string_append (out, " | ");
      md_gib (out, s->reserved_bytes);
      g_string_append (out, " | ");
      md_gib (out, s->total_bytes);
      g_string_append (out, " |\n");
    }
  gint64 head = (gint64)m->capacity_bytes - (gint64)m->total_bytes;
  g_string_append (out, "\nUsable per GPU: ");
  md_gib (out, m->capacity_bytes);
  g_string_append_printf (out, " GiB, %s ", head >= 0 ? "headroom" : "over by");
  md_gib (out, (guint64)(head < 0 ? -head : head));
  g_string_append (out, " GiB.\n\n");
  for (guint i = 0; i < m->n_stages; i++)
    {
      if (m->n_stages > 1)
        g_string_append_printf (out, "### Stage %u%s\n\n", i,
                                i == m->peak_stage ? " (peak)" : "");
      md_terms (out, m->stages[i].terms);
      g_string_append_c (out, '\n');
    }
  if (m->host_terms->len)
    {
      g_string_append (out, "## Host RAM per node\n\n");
      md_terms (out, m->host_terms);
      g_string_append (out, "\nTotal ");
      md_gib (out, m->host_total_bytes);
      g_string_append (out, " GiB of ");
      md_gib (out, m->host_capacity_bytes);
      g_string_append (out, " GiB installed.\n\n");
    }
  if (m->nvme_terms->len)
    {
      g_string_append (out, "## NVMe per node\n\n");
      md_terms (out, m->nvme_terms);
      g_string_append (out, "\nTotal ");
      md_gib (out, m->nvme_bytes);
      g_string_append (out, " GiB of ");
      md_gib (out, m->nvme_capacity_bytes);
      g_string_append (out, " GiB.\n\n");
    }
  guint n = stow_report_n_candidates (r, 8);
  if (n)
    {
      g_string_append (out, "## Top candidates\n\nFastest first, as the "
                            "time model predicts them "
                            "(docs/time-model.md).\n\n"
                            "| # | layout | GPU GiB | headroom GiB | "
                            "step | tokens/s | MFU |\n"
                            "|---:|---|---:|---:|---:|---:|---:|\n");
      for (guint i = 0; i < n; i++)
        {
          const StowCandidate *cand
              = &g_array_index (r->search->fits, StowCandidate, i);
          g_autofree char *d = stow_layout_describe (&cand->layout);
          g_autofree char *step
              = stow_report_format_step (cand->cost.step_time_s);
          g_string_append_printf (out, "| %u | ", i + 1);
          md_escape (out, d);
          g_string_append (out, " | ");
          md_gib (out, cand->total_bytes);
          g_string_append (out, " | ");
          md_gib (out, (guint64)MAX (cand->headroom_bytes, 0));
          g_string_append_printf (
              out, " | %s | %s | %.1f%%", step,
              stow_format_grouped_into (
                  buf, sizeof buf, (guint64)(cand->cost.tokens_per_s + 0.5)),
              100 * cand->cost.mfu);
          g_string_append (out, " |\n");
        }
      g_string_append_c (out, '\n');
    }
  if (r->alternatives && r->alternatives[0])
    {
      g_string_append (out, "## What would fit\n\n");
      for (const char *const *a = r->alternatives; *a; a++)
        {
          g_string_append (out, "- ");
          md_escape (out, *a);
          g_string_append_c (out, '\n');
        }
      g_string_append_c (out, '\n');
    }
  g_string_append_printf (out, "**%s**", fits ? "FITS" : "DOES NOT FIT");
  if (!m->fits)
    {
      g_autofree char *what = stow_memory_short_of (m);
      g_string_append_printf (out, ": short of %s", what);
    }
  g_string_append_c (out, '\n');
}
