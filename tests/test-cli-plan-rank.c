/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-plan-rank.c: `stowage plan` end to end: the JSON schema
 * (counts, plans ranked by throughput, per-term exposed seconds), a fully
 * pinned layout evaluates exactly one candidate, --explain names the
 * dominant term and the runner-up's trade, bad input exits 2.
 */
#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

static JsonObject *
parse (const char *text, JsonParser **keep)
{
  g_autoptr (GError) error = NULL;
  *keep = json_parser_new ();
  g_assert_true (json_parser_load_from_data (*keep, text, -1, &error));
  g_assert_no_error (error);
  return json_node_get_object (json_parser_get_root (*keep));
}

static void
test_json (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "plan", "llama-7b", "--gpus", "16xA100-80GB", "--global-batch",
            "64", "--top", "5", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse (r.out, &p);
  g_assert_cmpint (json_object_get_int_member (o, "candidates_evaluated"), >,
                   1000);
  g_assert_cmpfloat (json_object_get_double_member (o, "search_time_s"), >=, 0);
  JsonArray *plans = json_object_get_array_member (o, "plans");
  g_assert_cmpuint (json_array_get_length (plans), ==, 5);
  double prev = G_MAXDOUBLE;
  for (guint i = 0; i < 5; i++)
    {
      JsonObject *pl = json_array_get_object_element (plans, i);
      double tps = json_object_get_double_member (pl, "tokens_per_s");
      g_assert_cmpfloat (tps, <=, prev);
      prev = tps;
      /* tokens/s per GPU = tokens/s / 16 */
      g_assert_cmpfloat (
          fabs (json_object_get_double_member (pl, "tokens_per_s_per_gpu") * 16
                - tps),
          <, 1e-6 * tps);
      double mfu = json_object_get_double_member (pl, "mfu");
      g_assert_cmpfloat (mfu, >, 0.05);
      g_assert_cmpfloat (mfu, <, 1.0);
      g_assert_cmpfloat (
          json_object_get_double_member (pl, "hw_tflops_per_gpu"), >=,
          json_object_get_double_member (pl, "tflops_per_gpu"));
      JsonObject *ex = json_object_get_object_member (pl, "exposed_s");
      g_assert_true (json_object_has_member (ex, "pp_bubble"));
      g_assert_true (json_object_has_member (ex, "cpu_optimizer"));
      g_assert_true (json_object_has_member (pl, "layout"));
      g_assert_cmpint (json_object_get_int_member (pl, "total_bytes"), >, 0);
    }
}

static void
test_pinned (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "plan", "llama-65b", "--gpus", "64xA100-80GB", "--global-batch",
            "128", "--tp", "8", "--pp", "8", "--vpp", "1", "--cp", "1",
            "--zero", "1", "--micro-batch", "1", "--recompute", "selective",
            "--offload-optimizer", "none", "--offload-params", "none",
            "--offload-activations", "none", "--sp", "--schedule", "1f1b",
            "--top", "1", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse (r.out, &p);
  g_assert_cmpint (json_object_get_int_member (o, "candidates_evaluated"), ==,
                   1);
}

static void
test_explain (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "plan", "llama-7b", "--gpus", "16xA100-80GB", "--global-batch",
            "64", "--top", "3", "--explain", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "layouts evaluated"));
  g_assert_nonnull (strstr (r.out, "dominant term"));
  g_assert_nonnull (strstr (r.out, "versus #2"));
}

static void
test_bad_input (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "plan", "llama-7b", "--gpus", "8xA100-80GB", "--top", "zero",
            NULL);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_nonnull (strstr (r.err, "--top"));
  g_auto (StowRun) r2 = { 0 };
  stow_run (&r2, "plan", "llama-7b", "--gpus", "8xA100-80GB", "--tp", "3",
            "--pp", "1", "--dp", "1", "--cp", "1", NULL);
  g_assert_cmpint (r2.status, ==, 2);
  g_assert_nonnull (strstr (r2.err, "--tp 3"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli/plan/json", test_json);
  g_test_add_func ("/cli/plan/pinned", test_pinned);
  g_test_add_func ("/cli/plan/explain", test_explain);
  g_test_add_func ("/cli/plan/bad-input", test_bad_input);
  return g_test_run ();
}
