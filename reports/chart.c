/* SPDX-License-Identifier: MIT
 *
 * reports/chart.c: charts with cairo (SVG for the HTML page, and SVG, PNG
 * or PDF files for --chart).  Text is drawn by cairo, so an SVG carries its
 * glyphs as paths and needs no fonts on the reader's side.
 */
#include "reports/chart.h"

#include <math.h>
#include <string.h>

#include "config.h"
#include "core/json.h"
#include "core/units.h"

#if STOW_HAVE_CAIRO
#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#endif

GQuark
stow_chart_error_quark (void)
{
  return g_quark_from_static_string ("stow-chart-error-quark");
}

gboolean
stow_chart_available (void)
{
  return STOW_HAVE_CAIRO;
}

#if STOW_HAVE_CAIRO

#define GIB ((double)(1ull << 30))

/* A qualitative palette (Tableau 10 and lighter tones), one colour per
 * term name, the same on every stage. */
static const double palette[][3] = {
  { 0.31, 0.47, 0.65 }, { 0.95, 0.56, 0.17 }, { 0.88, 0.34, 0.35 },
  { 0.46, 0.72, 0.70 }, { 0.35, 0.63, 0.31 }, { 0.93, 0.79, 0.28 },
  { 0.69, 0.48, 0.63 }, { 1.00, 0.62, 0.66 }, { 0.61, 0.46, 0.37 },
  { 0.73, 0.69, 0.67 }, { 0.63, 0.80, 0.93 }, { 0.60, 0.87, 0.54 },
  { 0.99, 0.75, 0.53 }, { 0.79, 0.70, 0.84 }, { 0.55, 0.55, 0.55 },
};

static void
set_colour (cairo_t *cr, guint i)
{
  const double *c = palette[i % G_N_ELEMENTS (palette)];
  cairo_set_source_rgb (cr, c[0], c[1], c[2]);
}

static void
text_at (cairo_t *cr, double x, double y, double size, double align,
         const char *s)
{
  cairo_text_extents_t e;
  cairo_set_font_size (cr, size);
  cairo_text_extents (cr, s, &e);
  cairo_move_to (cr, x - align * e.x_advance, y);
  cairo_show_text (cr, s);
}

/* A round step for about @n ticks up to @max. */
static double
nice_step (double max, int n)
{
  double raw = max / n;
  double p = pow (10, floor (log10 (raw)));
  double f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void
y_axis (cairo_t *cr, double x0, double y0, double w, double h, double max,
        const char *unit)
{
  double step = nice_step (max, 6);
  cairo_set_line_width (cr, 1);
  for (double v = 0; v <= max + 1e-9; v += step)
    {
      double y = y0 + h - v / max * h;
      cairo_set_source_rgb (cr, 0.88, 0.88, 0.88);
      cairo_move_to (cr, x0, y);
      cairo_line_to (cr, x0 + w, y);
      cairo_stroke (cr);
      char buf[32];
      g_snprintf (buf, sizeof buf, step < 1 ? "%.1f" : "%.0f", v);
      cairo_set_source_rgb (cr, 0.2, 0.2, 0.2);
      text_at (cr, x0 - 6, y + 4, 11, 1.0, buf);
    }
  cairo_save (cr);
  cairo_translate (cr, x0 - 44, y0 + h / 2);
  cairo_rotate (cr, -G_PI / 2);
  text_at (cr, 0, 0, 12, 0.5, unit);
  cairo_restore (cr);
}

static void
capacity_line (cairo_t *cr, double x0, double x1, double y, const char *label)
{
  static const double dash[] = { 6, 4 };
  cairo_set_source_rgb (cr, 0.80, 0.10, 0.10);
  cairo_set_line_width (cr, 1.5);
  cairo_set_dash (cr, dash, 2, 0);
  cairo_move_to (cr, x0, y);
  cairo_line_to (cr, x1, y);
  cairo_stroke (cr);
  cairo_set_dash (cr, NULL, 0, 0);
  text_at (cr, x1, y - 5, 11, 1.0, label);
}

#define STAGES_W 820.0

static double
stages_height (const StowReport *r)
{
  /* Tall enough for the legend: one line per distinct term. */
  guint n = 0;
  for (guint i = 0; i < r->mem.memory->n_stages; i++)
    n = MAX (n, r->mem.memory->stages[i].terms->len);
  return MAX (380.0, 90.0 + 18.0 * (n + 4));
}

/* Stacked bars of each stage's terms against the usable capacity. */
static void
draw_stages (cairo_t *cr, double W, double H, const StowReport *r)
{
  const StowMemory *m = r->mem.memory;
  const double left = 70, right = 250, top = 44, bottom = 48;
  double pw = W - left - right, ph = H - top - bottom;
  g_autoptr (GPtrArray) names = g_ptr_array_new ();

  cairo_set_source_rgb (cr, 1, 1, 1);
  cairo_paint (cr);
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_NORMAL);

  double max = (double)m->capacity_bytes;
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      guint64 sum = 0;
      for (guint k = 0; k < s->terms->len; k++)
        {
          StowMemTerm *t = &g_array_index (s->terms, StowMemTerm, k);
          sum += t->bytes;
          gboolean seen = FALSE;
          for (guint j = 0; j < names->len && !seen; j++)
            seen = strcmp (names->pdata[j], t->name) == 0;
          if (!seen)
            g_ptr_array_add (names, (gpointer)t->name);
        }
      max = MAX (max, (double)MAX (sum, s->total_bytes));
    }
  max = max * 1.08 / GIB;
  if (max <= 0)
    max = 1;

  cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_BOLD);
  text_at (cr, left, 24, 15, 0, "Memory per GPU by pipeline stage");
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_NORMAL);
  y_axis (cr, left, top, pw, ph, max, "GiB per GPU");

  double slot = pw / m->n_stages;
  double bw = MIN (slot * 0.6, 90);
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      double x = left + slot * i + (slot - bw) / 2;
      double acc = 0;
      for (guint k = 0; k < s->terms->len; k++)
        {
          StowMemTerm *t = &g_array_index (s->terms, StowMemTerm, k);
          guint ci = 0;
          while (ci < names->len && strcmp (names->pdata[ci], t->name) != 0)
            ci++;
          double h = (double)t->bytes / GIB / max * ph;
          double y = top + ph - acc - h;
          set_colour (cr, ci);
          cairo_rectangle (cr, x, y, bw, h);
          cairo_fill (cr);
          acc += h;
        }
      cairo_set_source_rgb (cr, 0.2, 0.2, 0.2);
      char buf[64];
      if (m->n_stages <= 16 || i % (m->n_stages / 16 + 1) == 0)
        {
          g_snprintf (buf, sizeof buf, m->n_stages > 1 ? "stage %u" : "GPU", i);
          text_at (cr, x + bw / 2, top + ph + 16, 11, 0.5, buf);
          g_snprintf (buf, sizeof buf, "%.1f GiB",
                      (double)s->total_bytes / GIB);
          text_at (cr, x + bw / 2, top + ph + 31, 10, 0.5, buf);
        }
    }
  char cap[64];
  g_snprintf (cap, sizeof cap, "usable %.1f GiB",
              (double)m->capacity_bytes / GIB);
  capacity_line (cr, left, left + pw,
                 top + ph - (double)m->capacity_bytes / GIB / max * ph, cap);

  /* The legend, in stacking order from the top. */
  double lx = left + pw + 24, ly = top + 6;
  for (guint j = names->len; j-- > 0;)
    {
      set_colour (cr, j);
      cairo_rectangle (cr, lx, ly, 12, 12);
      cairo_fill (cr);
      cairo_set_source_rgb (cr, 0.15, 0.15, 0.15);
      text_at (cr, lx + 18, ly + 10, 11, 0, names->pdata[j]);
      ly += 18;
    }
}

static double
candidates_height (const StowReport *r, guint n)
{
  return r->throughput ? 420.0 : 70.0 + 44.0 * n;
}

/* Memory against throughput (a scatter) when the time model supplies
 * throughput; otherwise each candidate's memory and headroom as bars. */
static void
draw_candidates (cairo_t *cr, double W, double H, const StowReport *r, guint n)
{
  const StowMemory *m = r->mem.memory;
  double cap = (double)m->capacity_bytes / GIB;
  cairo_set_source_rgb (cr, 1, 1, 1);
  cairo_paint (cr);
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
  text_at (cr, 70, 24, 15, 0,
           r->throughput ? "Top candidates: memory per GPU and throughput"
                         : "Top candidates: memory per GPU and headroom");
  cairo_select_font_face (cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                          CAIRO_FONT_WEIGHT_NORMAL);

  if (r->throughput)
    {
      const double left = 80, right = 30, top = 44, bottom = 50;
      double pw = W - left - right, ph = H - top - bottom;
      double maxt = 0;
      for (guint i = 0; i < n && i < r->n_throughput; i++)
        maxt = MAX (maxt, r->throughput[i]);
      maxt = maxt > 0 ? maxt * 1.1 : 1;
      double maxm = cap * 1.08;
      y_axis (cr, left, top, pw, ph, maxt, "tokens/s");
      double step = nice_step (maxm, 6);
      cairo_set_source_rgb (cr, 0.2, 0.2, 0.2);
      for (double v = 0; v <= maxm; v += step)
        {
          char buf[32];
          g_snprintf (buf, sizeof buf, "%.0f", v);
          text_at (cr, left + v / maxm * pw, top + ph + 16, 11, 0.5, buf);
        }
      text_at (cr, left + pw / 2, top + ph + 36, 12, 0.5, "GiB per GPU");
      for (guint i = 0; i < n && i < r->n_throughput; i++)
        {
          const StowCandidate *c
              = &g_array_index (r->search->fits, StowCandidate, i);
          double x = left + (double)c->total_bytes / GIB / maxm * pw;
          double y = top + ph - r->throughput[i] / maxt * ph;
          set_colour (cr, i);
          cairo_arc (cr, x, y, 6, 0, 2 * G_PI);
          cairo_fill (cr);
          char buf[16];
          g_snprintf (buf, sizeof buf, "#%u", i + 1);
          cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
          text_at (cr, x + 9, y + 4, 11, 0, buf);
        }
      char lab[64];
      g_snprintf (lab, sizeof lab, "usable %.1f GiB", cap);
      static const double dash[] = { 6, 4 };
      double xc = left + cap / maxm * pw;
      cairo_set_source_rgb (cr, 0.8, 0.1, 0.1);
      cairo_set_dash (cr, dash, 2, 0);
      cairo_move_to (cr, xc, top);
      cairo_line_to (cr, xc, top + ph);
      cairo_stroke (cr);
      cairo_set_dash (cr, NULL, 0, 0);
      text_at (cr, xc - 4, top + 12, 11, 1.0, lab);
      return;
    }

  const double left = 70, right = 30, top = 44;
  double pw = W - left - right;
  double max = cap * 1.02;
  for (guint i = 0; i < n; i++)
    {
      const StowCandidate *c
          = &g_array_index (r->search->fits, StowCandidate, i);
      double y = top + 44.0 * i;
      g_autofree char *d = stow_layout_describe (&c->layout);
      char buf[64];
      cairo_set_source_rgb (cr, 0.15, 0.15, 0.15);
      g_snprintf (buf, sizeof buf, "#%u", i + 1);
      text_at (cr, left - 8, y + 30, 12, 1.0, buf);
      text_at (cr, left, y + 12, 10.5, 0, d);
      double used = (double)c->total_bytes / GIB;
      /* Used memory, then the headroom up to the usable capacity. */
      set_colour (cr, 0);
      cairo_rectangle (cr, left, y + 18, used / max * pw, 16);
      cairo_fill (cr);
      cairo_set_source_rgb (cr, 0.85, 0.92, 0.85);
      cairo_rectangle (cr, left + used / max * pw, y + 18,
                       MAX (0, (cap - used)) / max * pw, 16);
      cairo_fill (cr);
      g_snprintf (buf, sizeof buf, "%.1f GiB, headroom %.1f GiB", used,
                  MAX (0.0, cap - used));
      cairo_set_source_rgb (cr, 1, 1, 1);
      if (used / max * pw > 190)
        text_at (cr, left + 6, y + 30, 10.5, 0, buf);
      else
        {
          cairo_set_source_rgb (cr, 0.1, 0.1, 0.1);
          text_at (cr, left + used / max * pw + 6, y + 30, 10.5, 0, buf);
        }
    }
  char lab[64];
  g_snprintf (lab, sizeof lab, "usable %.1f GiB", cap);
  cairo_set_source_rgb (cr, 0.3, 0.3, 0.3);
  text_at (cr, left + pw, H - 12, 11, 1.0, lab);
}

static cairo_status_t
append_gstring (void *closure, const unsigned char *data, unsigned int len)
{
  g_string_append_len (closure, (const char *)data, len);
  return CAIRO_STATUS_SUCCESS;
}

typedef enum
{
  OUT_SVG,
  OUT_PNG,
  OUT_PDF,
} OutKind;

/* Draws @kind into @out as a whole SVG document, PNG or PDF file. */
static gboolean
render (GString *out, OutKind ok, StowChartKind kind, const StowReport *r,
        GError **error)
{
  guint n = stow_report_n_candidates (r, 8);
  if (kind == STOW_CHART_CANDIDATES && n == 0)
    {
      g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_EMPTY,
                   "no fitting candidates to chart");
      return FALSE;
    }
  double w = STAGES_W;
  double h = kind == STOW_CHART_STAGES ? stages_height (r)
                                       : candidates_height (r, n);
  cairo_surface_t *surface;
  switch (ok)
    {
    case OUT_SVG:
      surface = cairo_svg_surface_create_for_stream (append_gstring, out, w, h);
#if CAIRO_VERSION >= CAIRO_VERSION_ENCODE(1, 16, 0)
      cairo_svg_surface_set_document_unit (surface, CAIRO_SVG_UNIT_PX);
#endif
      break;
    case OUT_PDF:
      surface = cairo_pdf_surface_create_for_stream (append_gstring, out, w, h);
      break;
    default:
      /* Twice the pixels, for sharp text on high-density screens. */
      surface = cairo_image_surface_create (CAIRO_FORMAT_RGB24, (int)w * 2,
                                            (int)h * 2);
      break;
    }
  cairo_t *cr = cairo_create (surface);
  if (ok == OUT_PNG)
    cairo_scale (cr, 2, 2);
  if (kind == STOW_CHART_STAGES)
    draw_stages (cr, w, h, r);
  else
    draw_candidates (cr, w, h, r, n);
  cairo_status_t st = cairo_status (cr);
  cairo_destroy (cr);
  if (st == CAIRO_STATUS_SUCCESS && ok == OUT_PNG)
    st = cairo_surface_write_to_png_stream (surface, append_gstring, out);
  cairo_surface_finish (surface);
  if (st == CAIRO_STATUS_SUCCESS)
    st = cairo_surface_status (surface);
  cairo_surface_destroy (surface);
  if (st != CAIRO_STATUS_SUCCESS)
    {
      g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_FORMAT,
                   "cairo: %s", cairo_status_to_string (st));
      return FALSE;
    }
  return TRUE;
}

/* Prefixes every id and reference to one, so that charts inlined in one
 * page keep their own glyph and clip definitions. */
static void
append_prefixed (GString *out, const char *svg, const char *prefix)
{
  static const char *const keys[] = { "id=\"", "href=\"#", "url(#" };
  const char *p = svg;
  while (*p)
    {
      gboolean hit = FALSE;
      for (gsize k = 0; k < G_N_ELEMENTS (keys) && !hit; k++)
        if (g_str_has_prefix (p, keys[k]))
          {
            g_string_append (out, keys[k]);
            g_string_append (out, prefix);
            p += strlen (keys[k]);
            hit = TRUE;
          }
      if (!hit)
        g_string_append_c (out, *p++);
    }
}

#endif /* STOW_HAVE_CAIRO */

#if !STOW_HAVE_CAIRO
static gboolean
no_cairo (GError **error)
{
  g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_NO_CAIRO,
               "this stowage was built without cairo, so it draws no charts "
               "(install libcairo2-dev and reconfigure)");
  return FALSE;
}
#endif

gboolean
stow_chart_svg (GString *out, StowChartKind kind, const StowReport *r,
                const char *id_prefix, GError **error)
{
#if STOW_HAVE_CAIRO
  g_autoptr (GString) svg = g_string_new (NULL);
  if (!render (svg, OUT_SVG, kind, r, error))
    return FALSE;
  const char *start = strstr (svg->str, "<svg");
  if (start == NULL)
    {
      g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_FORMAT,
                   "cairo wrote no <svg> element");
      return FALSE;
    }
  /* Scale down with the page on narrow screens. */
  g_string_append (out, "<svg style=\"max-width:100%;height:auto\"");
  append_prefixed (out, start + 4, id_prefix ? id_prefix : "");
  return TRUE;
#else
  (void)out, (void)kind, (void)r, (void)id_prefix;
  return no_cairo (error);
#endif
}

gboolean
stow_chart_svg_custom (GString *out, double width, double height,
                       StowChartDrawFunc draw, gpointer data,
                       const char *id_prefix, GError **error)
{
#if STOW_HAVE_CAIRO
  g_autoptr (GString) svg = g_string_new (NULL);
  cairo_surface_t *surface = cairo_svg_surface_create_for_stream (
      append_gstring, svg, width, height);
#if CAIRO_VERSION >= CAIRO_VERSION_ENCODE(1, 16, 0)
  cairo_svg_surface_set_document_unit (surface, CAIRO_SVG_UNIT_PX);
#endif
  cairo_t *cr = cairo_create (surface);
  draw (cr, width, height, data);
  cairo_status_t st = cairo_status (cr);
  cairo_destroy (cr);
  cairo_surface_finish (surface);
  if (st == CAIRO_STATUS_SUCCESS)
    st = cairo_surface_status (surface);
  cairo_surface_destroy (surface);
  const char *start = strstr (svg->str, "<svg");
  if (st != CAIRO_STATUS_SUCCESS || start == NULL)
    {
      g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_FORMAT,
                   "cairo: %s", cairo_status_to_string (st));
      return FALSE;
    }
  g_string_append (out, "<svg style=\"max-width:100%;height:auto\"");
  append_prefixed (out, start + 4, id_prefix ? id_prefix : "");
  return TRUE;
#else
  (void)out, (void)width, (void)height, (void)draw, (void)data;
  (void)id_prefix;
  return no_cairo (error);
#endif
}

gboolean
stow_chart_write (const char *path, const StowReport *r, GError **error)
{
#if STOW_HAVE_CAIRO
  OutKind ok;
  if (g_str_has_suffix (path, ".svg"))
    ok = OUT_SVG;
  else if (g_str_has_suffix (path, ".png"))
    ok = OUT_PNG;
  else if (g_str_has_suffix (path, ".pdf"))
    ok = OUT_PDF;
  else
    {
      g_set_error (error, STOW_CHART_ERROR, STOW_CHART_ERROR_FORMAT,
                   "--chart %s: the name must end in .svg, .png or .pdf", path);
      return FALSE;
    }
  g_autoptr (GString) data = g_string_new (NULL);
  if (!render (data, ok, STOW_CHART_STAGES, r, error))
    return FALSE;
  return stow_file_write_atomic (path, data->str, (gssize)data->len, error);
#else
  (void)path, (void)r;
  return no_cairo (error);
#endif
}
