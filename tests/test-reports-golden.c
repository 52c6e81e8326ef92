/* SPDX-License-Identifier: MIT
 *
 * tests/test-reports-golden.c: every output format and every --emit config
 * for three layouts (1 GPU with CPU offload, 8 GPUs ZeRO-3, 64 GPUs TP8
 * PP4 interleaved), compared byte for byte with tests/data/golden/; each
 * engine's config with the case's --engine set to that engine.  Any
 * change of output fails here; regenerate on purpose with
 *   STOW_UPDATE_GOLDEN=1 meson test -C build reports-golden
 * and review the diff (docs/reports.md).  This checks for change, not for
 * correctness: a golden file holds what stowage printed when it was last
 * regenerated, so no documented figure may rest on it (docs/testing.md).
 * Charts are cut out of the HTML before comparing: their glyph paths
 * depend on the machine's fonts.
 * Plan files an earlier stowage wrote (tests/data/plan-files/) must still
 * read and give the same memory.
 */
#include <glib/gstdio.h>
#include <string.h>

#include "core/json.h"
#include "tests/testutil.h"

typedef struct
{
  const char *name;
  const char *const args[24];
} Case;

static const Case cases[] = {
  { "1gpu-cpu-offload",
    { "mem", "llama-7b", "--gpus", "1xA100-80GB", "--zero", "1",
      "--offload-optimizer", "cpu", "--engine", "deepspeed", "--recompute",
      "full", "--offload-activations", "none", NULL } },
  { "8gpu-zero3",
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--zero", "3", "--tp", "1",
      "--pp", "1", "--engine", "fsdp", NULL } },
  { "64gpu-tp8-pp4-vpp2",
    { "fit", "llama-65b", "--gpus", "64xH100-SXM", "--tp", "8", "--pp", "4",
      "--vpp", "2", "--zero", "1", "--engine", "megatron", NULL } },
};

typedef struct
{
  const char *ext; /* golden file suffix */
  const char *flag, *value;
} Output;

static const Output outputs[] = {
  { "txt", NULL, NULL },
  { "json", "--format", "json" },
  { "csv", "--format", "csv" },
  { "md", "--format", "md" },
  { "html", "--format", "html" },
  { "ds_config.json", "--emit", "deepspeed" },
  { "megatron.args", "--emit", "megatron" },
  { "fsdp.py", "--emit", "fsdp" },
  { "accelerate.yaml", "--emit", "accelerate" },
  { "plan.json", "--emit", "plan" },
};

/* The HTML without its charts: each <svg>...</svg> becomes "<svg/>", and
 * the note a cairo-less build writes becomes the same. */
static char *
strip_charts (const char *html)
{
  GString *s = g_string_new (NULL);
  const char *p = html;
  for (;;)
    {
      const char *a = strstr (p, "<figure class=\"chart\"");
      const char *n = strstr (p, "<p class=\"note\">Chart not drawn");
      const char *first = a && (!n || a < n) ? a : n;
      if (first == NULL)
        break;
      g_string_append_len (s, p, first - p);
      const char *end
          = first == a ? strstr (first, "</figure>") : strstr (first, "</p>");
      g_assert_nonnull (end);
      g_string_append (s, "[chart]");
      p = end + (first == a ? strlen ("</figure>") : strlen ("</p>"));
    }
  g_string_append (s, p);
  return g_string_free (s, FALSE);
}

static void
check_golden (const char *file, const char *actual)
{
  g_autofree char *path
      = g_test_build_filename (G_TEST_DIST, "data", "golden", file, NULL);
  if (g_getenv ("STOW_UPDATE_GOLDEN"))
    {
      g_autoptr (GError) error = NULL;
      g_file_set_contents (path, actual, -1, &error);
      g_assert_no_error (error);
      return;
    }
  g_autofree char *expected = NULL;
  g_autoptr (GError) error = NULL;
  if (!g_file_get_contents (path, &expected, NULL, &error))
    g_error ("%s: %s (regenerate with STOW_UPDATE_GOLDEN=1)", file,
             error->message);
  if (strcmp (expected, actual) != 0)
    {
      /* Name the first differing line: the whole file is too long. */
      g_auto (GStrv) e = g_strsplit (expected, "\n", -1);
      g_auto (GStrv) a = g_strsplit (actual, "\n", -1);
      guint i = 0;
      while (e[i] && a[i] && strcmp (e[i], a[i]) == 0)
        i++;
      g_test_message ("%s: line %u differs:\n  golden: %s\n  now:    %s", file,
                      i + 1, e[i] ? e[i] : "(end)", a[i] ? a[i] : "(end)");
      g_test_fail ();
    }
}

static void
test_case (gconstpointer data)
{
  const Case *c = data;
  for (gsize k = 0; k < G_N_ELEMENTS (outputs); k++)
    {
      const Output *o = &outputs[k];
      const char *args[32];
      guint n = 0;
      /* A config is planned with its engine's memory model: the emitters
       * of one engine run each case with --engine set to theirs. */
      gboolean own_engine = o->flag && g_str_equal (o->flag, "--emit")
                            && (g_str_equal (o->value, "deepspeed")
                                || g_str_equal (o->value, "megatron")
                                || g_str_equal (o->value, "fsdp"));
      for (; c->args[n]; n++)
        args[n]
            = own_engine && n > 0 && g_str_equal (c->args[n - 1], "--engine")
                  ? o->value
                  : c->args[n];
      if (o->flag)
        {
          args[n++] = o->flag;
          args[n++] = o->value;
        }
      args[n] = NULL;
      g_auto (StowRun) r = { 0 };
      stow_runv (&r, args);
      g_autofree char *file = g_strdup_printf ("%s.%s", c->name, o->ext);
      /* An engine that cannot express the layout: the golden file holds
       * the exit status and the one-line error. */
      g_autofree char *actual
          = r.status == 0 ? (g_str_equal (o->ext, "html") ? strip_charts (r.out)
                                                          : g_strdup (r.out))
                          : g_strdup_printf ("exit %d\n%s", r.status, r.err);
      if (r.status != 0)
        g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
      check_golden (file, actual);
    }
}

/* Two --json documents give the same memory and layout. */
static void
assert_same_memory (const char *expected, const char *actual)
{
  g_autoptr (JsonNode) a = stow_json_parse_data (expected, -1, "exp", NULL);
  g_autoptr (JsonNode) b = stow_json_parse_data (actual, -1, "act", NULL);
  g_assert_nonnull (a);
  g_assert_nonnull (b);
  const char *keys[] = { "device", "host", "nvme", "layout" };
  for (gsize i = 0; i < G_N_ELEMENTS (keys); i++)
    {
      JsonNode *x = json_object_get_member (json_node_get_object (a), keys[i]);
      JsonNode *y = json_object_get_member (json_node_get_object (b), keys[i]);
      g_autofree char *xs = stow_json_to_string (x, TRUE);
      g_autofree char *ys = stow_json_to_string (y, TRUE);
      g_assert_cmpstr (xs, ==, ys);
    }
}

/* The plan file reproduces the numbers: mem --plan gives the same JSON
 * memory as the flags it was written from. */
static void
test_plan_round_trip (gconstpointer data)
{
  const Case *c = data;
  g_autofree char *dir = g_dir_make_tmp ("stow-golden-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename (dir, "plan.json", NULL);
  const char *args[32];
  guint n = 0;
  for (; c->args[n]; n++)
    args[n] = c->args[n];
  args[n++] = "--emit";
  args[n++] = "plan";
  args[n++] = "-o";
  args[n++] = plan;
  args[n] = NULL;
  g_auto (StowRun) w = { 0 };
  stow_runv (&w, args);
  g_assert_cmpint (w.status, ==, 0);
  g_assert_cmpstr (w.out, ==, "");

  /* The original's JSON, and the plan's through mem and fit. */
  args[n - 4] = "--json";
  args[n - 3] = NULL;
  g_auto (StowRun) orig = { 0 };
  stow_runv (&orig, args);
  g_assert_cmpint (orig.status, ==, 0);
  g_auto (StowRun) back = { 0 };
  stow_run (&back, "mem", "--plan", plan, "--json", NULL);
  g_assert_cmpint (back.status, ==, 0);
  g_assert_cmpstr (back.err, ==, "");
  g_auto (StowRun) fit = { 0 };
  stow_run (&fit, "fit", "--plan", plan, "--json", NULL);
  g_assert_cmpint (fit.status, ==, 0);

  assert_same_memory (orig.out, back.out);
  assert_same_memory (orig.out, fit.out);
  /* So does the plan an earlier stowage wrote from these flags, before
   * the plan's "memory" gained the figures only the reports had (kept as
   * it was in tests/data/plan-files/). */
  g_autofree char *file = g_strdup_printf ("%s.plan.json", c->name);
  g_autofree char *previous = g_test_build_filename (
      G_TEST_DIST, "data", "plan-files", "before-memory-figures", file, NULL);
  g_auto (StowRun) prev = { 0 };
  stow_run (&prev, "mem", "--plan", previous, "--json", NULL);
  g_assert_cmpint (prev.status, ==, 0);
  assert_same_memory (orig.out, prev.out);
  /* A plan whose predicted numbers differ from this build's warns. */
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (plan, &text, NULL, NULL));
  const char *key = "\"device_total_bytes\" : ";
  char *at = strstr (text, key);
  g_assert_nonnull (at);
  at[strlen (key)] = at[strlen (key)] == '9' ? '8' : '9';
  g_assert_true (g_file_set_contents (plan, text, -1, NULL));
  g_auto (StowRun) warn = { 0 };
  stow_run (&warn, "mem", "--plan", plan, NULL);
  g_assert_cmpint (warn.status, ==, 0);
  g_assert_nonnull (strstr (warn.err, "memory model changed"));

  /* A flag beside --plan is refused, not ignored. */
  g_auto (StowRun) mixed = { 0 };
  stow_run (&mixed, "mem", "--plan", plan, "--tp", "2", NULL);
  g_assert_cmpint (mixed.status, ==, 2);
  g_assert_nonnull (strstr (mixed.err, "--tp cannot be combined"));
  g_unlink (plan);
  g_rmdir (dir);
}

static void
test_output_errors (void)
{
  /* A failed -o leaves nothing behind and says why in one line. */
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "mem", "llama-7b", "--gpus", "8xA100-80GB", "--format", "csv",
            "-o", "/nonexistent-dir/x.csv", NULL);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "mem", "llama-7b", "--gpus", "8xA100-80GB", "--format", "xml",
            NULL);
  g_assert_cmpint (f.status, ==, 2);
  g_assert_nonnull (strstr (f.err, "--format \"xml\""));
  g_auto (StowRun) j = { 0 };
  stow_run (&j, "mem", "llama-7b", "--gpus", "8xA100-80GB", "--json",
            "--format", "md", NULL);
  g_assert_cmpint (j.status, ==, 2);
  g_auto (StowRun) e = { 0 };
  stow_run (&e, "mem", "llama-7b", "--gpus", "8xA100-80GB", "--emit", "jax",
            NULL);
  g_assert_cmpint (e.status, ==, 2);
  g_assert_nonnull (strstr (e.err, "--emit \"jax\""));
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "mem", "llama-7b", "--gpus", "8xA100-80GB", "--chart", "x.gif",
            NULL);
  g_assert_cmpint (c.status, ==, 2);
  g_assert_nonnull (strstr (c.err, "x.gif"));
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "mem", "--plan", "/nonexistent/plan.json", NULL);
  g_assert_cmpint (p.status, ==, 2);
  g_assert_nonnull (strstr (p.err, "/nonexistent/plan.json"));
  /* fit emits nothing for a layout that does not fit. */
  g_auto (StowRun) nf = { 0 };
  stow_run (&nf, "fit", "llama-65b", "--gpus", "1xA100-80GB",
            "--offload-optimizer", "none", "--offload-params", "none", "--emit",
            "deepspeed", NULL);
  g_assert_cmpint (nf.status, ==, 1);
  g_assert_cmpstr (nf.out, ==, "");
}

static void
test_chart_files (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-chart-XXXXXX", NULL);
  const char *exts[] = { "svg", "png", "pdf" };
  const char *magic[] = { "<?xml", "\x89PNG", "%PDF" };
  for (gsize i = 0; i < G_N_ELEMENTS (exts); i++)
    {
      g_autofree char *name = g_strdup_printf ("chart.%s", exts[i]);
      g_autofree char *path = g_build_filename (dir, name, NULL);
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "fit", "llama-65b", "--gpus", "64xH100-SXM", "--tp", "8",
                "--pp", "4", "--chart", path, NULL);
      if (r.status == 2 && strstr (r.err, "without cairo"))
        {
          g_test_skip ("built without cairo");
          return;
        }
      g_assert_cmpint (r.status, ==, 0);
      g_autofree char *data = NULL;
      gsize len = 0;
      g_assert_true (g_file_get_contents (path, &data, &len, NULL));
      g_assert_cmpuint (len, >, 1000);
      g_assert_true (memcmp (data, magic[i], strlen (magic[i])) == 0);
      g_unlink (path);
    }
  g_rmdir (dir);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *p
          = g_strdup_printf ("/reports/golden/%s", cases[i].name);
      g_test_add_data_func (p, &cases[i], test_case);
      g_autofree char *q
          = g_strdup_printf ("/reports/plan-round-trip/%s", cases[i].name);
      g_test_add_data_func (q, &cases[i], test_plan_round_trip);
    }
  g_test_add_func ("/reports/output-errors", test_output_errors);
  g_test_add_func ("/reports/chart-files", test_chart_files);
  return g_test_run ();
}
