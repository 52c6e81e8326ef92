/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-simulate.c: `stowage simulate` as a user runs it: the
 * text report, the documented JSON keys, the simulated peak against
 * `stowage mem` for the same flags, --trace writing Chrome trace-event
 * JSON atomically, LLaMA-65B with offload in well under a second, and
 * one-line errors for what cannot be simulated.
 */
#include <string.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "tests/testutil-trace.h"
#include "tests/testutil.h"

static JsonObject *
parse (const char *text, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  *root = stow_json_parse_data (text, -1, "stdout", &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

static void
test_text (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--zero", "3",
            "--offload-optimizer", "cpu", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "step time:"));
  g_assert_nonnull (strstr (r.out, "critical path:"));
  g_assert_nonnull (strstr (r.out, "cpu_optim"));
  g_assert_nonnull (strstr (r.out, "peak memory"));
  g_assert_nonnull (strstr (r.out, "GiB"));
}

/* The JSON keys of the issue, and the device peak equal to the memory
 * model's allocated bytes for the same flags. */
static void
test_json_matches_mem (void)
{
  const char *flags[]
      = { "--gpus", "8xA100-80GB",   "--zero", "2",           "--global-batch",
          "32",     "--micro-batch", "2",      "--recompute", "selective",
          NULL };
  g_autoptr (GPtrArray) a = g_ptr_array_new ();
  g_ptr_array_add (a, (char *)"simulate");
  g_ptr_array_add (a, (char *)"llama-7b");
  for (guint i = 0; flags[i]; i++)
    g_ptr_array_add (a, (char *)flags[i]);
  g_ptr_array_add (a, (char *)"--json");
  g_ptr_array_add (a, NULL);
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, (const char *const *)a->pdata);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  g_assert_cmpfloat (json_object_get_double_member (o, "step_time_s"), >, 0);
  /* The time model's step for the same layout, beside it. */
  g_assert_cmpfloat (json_object_get_double_member (o, "predicted_step_time_s"),
                     >, 0);
  JsonObject *ex = json_object_get_object_member (o, "exposed_s");
  for (const char *const *s
       = (const char *const[]){ "compute", "h2d", "d2h", "nvme_read",
                                "nvme_write", "cpu_optim", "comm", NULL };
       *s; s++)
    g_assert_true (json_object_has_member (ex, *s));
  JsonObject *peak = json_object_get_object_member (o, "peak_bytes");
  for (const char *const *s
       = (const char *const[]){ "device", "pinned_host", "host", "nvme", NULL };
       *s; s++)
    g_assert_true (json_object_has_member (peak, *s));
  g_assert_cmpint (json_object_get_int_member (o, "n_ops"), >, 100);
  JsonArray *ops = json_object_get_array_member (o, "ops");
  g_assert_cmpuint (json_array_get_length (ops), >, 50);
  double last_end = 0;
  for (guint i = 0; i < json_array_get_length (ops); i++)
    {
      JsonObject *op = json_array_get_object_element (ops, i);
      double st = json_object_get_double_member (op, "start_s");
      double en = json_object_get_double_member (op, "end_s");
      g_assert_cmpfloat (st, <=, en);
      g_assert_nonnull (json_object_get_string_member (op, "stream"));
      last_end = MAX (last_end, en);
    }
  g_assert_cmpfloat_with_epsilon (
      last_end, json_object_get_double_member (o, "step_time_s"), 1e-9);
  gint64 sim = json_object_get_int_member (peak, "device");

  g_ptr_array_index (a, 0) = (char *)"mem";
  g_auto (StowRun) m = { 0 };
  stow_runv (&m, (const char *const *)a->pdata);
  g_assert_cmpint (m.status, ==, 0);
  g_autoptr (JsonNode) mroot = NULL;
  JsonObject *mo = parse (m.out, &mroot);
  JsonObject *dev = json_object_get_object_member (mo, "device");
  g_assert_nonnull (dev);
  gint64 model = json_object_get_int_member (dev, "allocated_peak_bytes");
  g_assert_cmpint (sim, ==, model);
}

static void
test_trace_file (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-sim-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "step.json", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "simulate", "gpt2", "--gpus", "A100-80GB", "--zero", "3",
            "--offload-params", "cpu", "--offload-optimizer", "cpu",
            "--resident-layers", "6", "--trace", path, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = stow_json_parse_file (path, 1 << 28, &error);
  g_assert_no_error (error);
  JsonArray *ev = json_object_get_array_member (json_node_get_object (root),
                                                "traceEvents");
  g_assert_cmpuint (json_array_get_length (ev), >, 50);
  /* No temporary file left beside it. */
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  guint n = 0;
  while (g_dir_read_name (d))
    n++;
  g_assert_cmpuint (n, ==, 1);
  g_remove (path);
  g_rmdir (dir);
}

/* Each op's "deps" in the trace are what it waits for, seen through the
 * allocs and frees the trace leaves out (a slot's load waits on the free
 * of its last occupant, a pipeline stage on its neighbour's send): under
 * the sim's clocks every op starts exactly when the last of them ends, or
 * at 0 without any.  A rank's two NVMe streams also take turns on its
 * drive (planner/sim.c), so those may start later. */
static void
check_trace_deps (const char *const *flags)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-simdeps-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "step.json", NULL);
  g_autoptr (GPtrArray) a = g_ptr_array_new ();
  g_ptr_array_add (a, "simulate");
  for (guint i = 0; flags[i]; i++)
    g_ptr_array_add (a, (char *)flags[i]);
  g_ptr_array_add (a, "--trace");
  g_ptr_array_add (a, path);
  g_ptr_array_add (a, NULL);
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, (const char *const *)a->pdata);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (TraceOps) t = trace_ops_load (path);
  g_assert_cmpuint (t->ops->len, >, 50);
  guint exact = 0, with_deps = 0;
  for (guint i = 0; i < t->ops->len; i++)
    {
      const TraceOp *o = trace_op (t, i);
      double ready = o->deps->len ? trace_op_ready_us (t, i) : 0;
      double tol = 1e-3 + 1e-9 * ready;
      g_assert_cmpfloat (o->start_us, >=, ready - tol);
      if (g_str_has_prefix (o->stream, "nvme_"))
        continue;
      if (o->start_us > ready + tol)
        g_error ("%s starts at %.3f us; its deps end by %.3f us", o->name,
                 o->start_us, ready);
      exact++;
      with_deps += o->deps->len > 0;
    }
  g_test_message ("%s: %u ops start as their deps allow (%u with deps)",
                  flags[0], exact, with_deps);
  g_assert_cmpuint (with_deps, >, 0);
  g_assert_cmpint (g_unlink (path), ==, 0);
  g_assert_cmpint (g_rmdir (dir), ==, 0);
}

static void
test_trace_deps (void)
{
  /* Layer and gradient slots: loads wait on frees. */
  check_trace_deps ((const char *const[]){
      "gpt2", "--gpus", "A100-80GB", "--zero", "3", "--offload-params", "cpu",
      "--offload-optimizer", "cpu", "--resident-layers", "6", NULL });
  /* Four stages: events across ranks. */
  check_trace_deps ((const char *const[]){ "llama-7b", "--gpus", "8xA100-80GB",
                                           "--pp", "4", "--global-batch", "64",
                                           NULL });
  /* The NVMe optimizer's swap buffers. */
  check_trace_deps ((const char *const[]){
      "llama-7b", "--gpus", "1xA100-80GB", "--zero", "3", "--offload-params",
      "nvme", "--offload-optimizer", "nvme", "--global-batch", "8", NULL });
}

/* The benchmark: one step of LLaMA-65B on 8 GPUs with parameter
 * and optimizer offload, simulated in well under a second. */
static void
test_llama_65b_fast (void)
{
  g_auto (StowRun) r = { 0 };
  gint64 t0 = g_get_monotonic_time ();
  stow_run (&r, "simulate", "llama-65b", "--gpus", "8xA100-80GB", "--zero", "3",
            "--offload-params", "cpu", "--offload-optimizer", "cpu",
            "--global-batch", "64", "--json", NULL);
  double wall = (double)(g_get_monotonic_time () - t0) / 1e6;
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse (r.out, &root);
  g_test_message (
      "llama-65b, 8 GPUs, parameter and optimizer offload: %" G_GINT64_FORMAT
      " ops simulated in %.3f s (command %.3f s)",
      json_object_get_int_member (o, "n_ops"),
      json_object_get_double_member (o, "simulated_in_s"), wall);
  g_assert_cmpfloat (json_object_get_double_member (o, "simulated_in_s"), <,
                     1.0);
  g_assert_cmpint (json_object_get_int_member (o, "resident_layers")
                       + json_object_get_int_member (o, "streamed_layers"),
                   ==, 80);
}

static void
test_errors (void)
{
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--engine",
            "deepspeed", "--zero", "2", NULL);
  g_assert_cmpint (a.status, ==, 2);
  g_assert_nonnull (strstr (a.err, "--engine deepspeed"));
  g_assert_cmpuint (stow_count_lines (a.err), <=, 2);

  g_auto (StowRun) b = { 0 };
  stow_run (&b, "simulate", "llama-7b", "--gpus", "8xA100-80GB",
            "--layer-major", NULL);
  g_assert_cmpint (b.status, ==, 2);
  g_assert_nonnull (strstr (b.err, "--layer-major"));

  g_auto (StowRun) c = { 0 };
  stow_run (&c, "simulate", "--gpus", "8xA100-80GB", NULL);
  g_assert_cmpint (c.status, ==, 2);
  g_assert_nonnull (strstr (c.err, "which model"));

  g_auto (StowRun) d = { 0 };
  stow_run (&d, "simulate", "llama-7b", "--gpus", "8xA100-80GB",
            "--resident-layers", "many", NULL);
  g_assert_cmpint (d.status, ==, 2);
  g_assert_nonnull (strstr (d.err, "--resident-layers \"many\""));

  g_auto (StowRun) e = { 0 };
  stow_run (&e, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--trace",
            "/nonexistent-dir/x.json", NULL);
  g_assert_cmpint (e.status, ==, 2);
  g_assert_nonnull (strstr (e.err, "/nonexistent-dir"));
}

/* CSV (one row per op, times ordered within each stream), Markdown, and
 * the HTML page with its Gantt chart, written whole with -o. */
static void
test_formats (void)
{
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--pp", "2",
            "--global-batch", "16", "--format", "csv", NULL);
  g_assert_cmpint (c.status, ==, 0);
  g_auto (GStrv) lines = g_strsplit (c.out, "\n", -1);
  g_assert_true (g_str_has_prefix (lines[0], "op,rank,stream,kind,"));
  guint rows = 0;
  for (guint i = 1; lines[i] && *lines[i]; i++, rows++)
    {
      g_auto (GStrv) f = g_strsplit (lines[i], ",", -1);
      g_assert_cmpuint (g_strv_length (f), ==, 10);
      double start = g_ascii_strtod (f[6], NULL),
             end = g_ascii_strtod (f[7], NULL);
      g_assert_cmpfloat (end, >=, start);
    }
  g_assert_cmpuint (rows, >, 100);

  g_auto (StowRun) m = { 0 };
  stow_run (&m, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--format",
            "md", NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_assert_nonnull (strstr (m.out, "| stream | busy (s) | exposed (s) |"));

  g_autofree char *html
      = stow_run_to_file ("sim.html", "simulate", "llama-7b", "--gpus",
                          "8xA100-80GB", "--format", "html", NULL);
  g_assert_true (g_str_has_prefix (html, "<!DOCTYPE html>"));
  g_assert_true (strstr (html, "<svg") != NULL
                 || strstr (html, "No chart") != NULL);
}

/* A plan file from fit --emit plan simulates to the tensor peak that
 * mem --plan reports for the same file; flags beside --plan are refused. */
static void
test_plan_file (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-simplan-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "plan.json", NULL);
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--emit", "plan",
            "-o", path, NULL);
  g_assert_cmpint (f.status, ==, 0);

  g_auto (StowRun) s = { 0 };
  stow_run (&s, "simulate", "--plan", path, "--json", NULL);
  g_assert_cmpint (s.status, ==, 0);
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "mem", "--plan", path, "--json", NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) sj = stow_json_parse_data (s.out, -1, "sim", &error);
  g_assert_no_error (error);
  g_autoptr (JsonNode) mj = stow_json_parse_data (m.out, -1, "mem", &error);
  g_assert_no_error (error);
  JsonObject *peak
      = json_object_get_object_member (json_node_get_object (sj), "peak_bytes");
  JsonObject *dev
      = json_object_get_object_member (json_node_get_object (mj), "device");
  g_assert_cmpint (json_object_get_int_member (peak, "device"), ==,
                   json_object_get_int_member (dev, "allocated_peak_bytes"));

  g_auto (StowRun) bad = { 0 };
  stow_run (&bad, "simulate", "--plan", path, "--tp", "2", NULL);
  g_assert_cmpint (bad.status, ==, 2);
  g_assert_nonnull (strstr (bad.err, "--tp cannot be combined"));
  g_assert_cmpint (g_unlink (path), ==, 0);
  g_assert_cmpint (g_rmdir (dir), ==, 0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli/simulate/text", test_text);
  g_test_add_func ("/cli/simulate/json-matches-mem", test_json_matches_mem);
  g_test_add_func ("/cli/simulate/trace", test_trace_file);
  g_test_add_func ("/cli/simulate/trace-deps", test_trace_deps);
  g_test_add_func ("/cli/simulate/llama-65b", test_llama_65b_fast);
  g_test_add_func ("/cli/simulate/errors", test_errors);
  g_test_add_func ("/cli/simulate/formats", test_formats);
  g_test_add_func ("/cli/simulate/plan-file", test_plan_file);
  return g_test_run ();
}
