/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-bench.c: `stowage bench adam|memcpy --json` on tiny sizes:
 * the JSON has the documented members, its rates agree with its own time
 * and byte counts (28 bytes per parameter for bf16 grads and copy, as
 * offload.md §0 counts), and bad options are one-line errors.
 */
#include <json-glib/json-glib.h>
#include <string.h>

#include "tests/testutil.h"

static JsonObject *
parse_object (const char *text, JsonParser *parser)
{
  g_autoptr (GError) error = NULL;
  g_assert_true (json_parser_load_from_data (parser, text, -1, &error));
  g_assert_no_error (error);
  JsonNode *root = json_parser_get_root (parser);
  g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
  return json_node_get_object (root);
}

static void
check_adam (const char *grad, const char *check, gint64 want_bpp)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "bench", "adam", "--params", "100K", "--threads", "2", "--reps",
            "2", "--grad", grad, "--json", check, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) parser = json_parser_new ();
  JsonObject *o = parse_object (r.out, parser);
  const char *members[]
      = { "isa",         "threads",     "params", "seconds", "bytes_per_param",
          "bytes_per_s", "params_per_s" };
  for (gsize i = 0; i < G_N_ELEMENTS (members); i++)
    g_assert_true (json_object_has_member (o, members[i]));
  g_assert_cmpint (json_object_get_int_member (o, "threads"), ==, 2);
  g_assert_cmpint (json_object_get_int_member (o, "params"), ==, 100000);
  g_assert_cmpint (json_object_get_int_member (o, "bytes_per_param"), ==,
                   want_bpp);
  g_assert_cmpstr (json_object_get_string_member (o, "grad"), ==, grad);
  double s = json_object_get_double_member (o, "seconds");
  g_assert_cmpfloat (s, >, 0);
  g_assert_cmpfloat_with_epsilon (
      json_object_get_double_member (o, "params_per_s"), 100000 / s,
      100000 / s * 1e-9);
  g_assert_cmpfloat_with_epsilon (
      json_object_get_double_member (o, "bytes_per_s"),
      (double)want_bpp * 100000 / s, want_bpp * 100000 / s * 1e-9);
}

static void
test_adam_json (void)
{
  check_adam ("bf16", "--quiet", 28); /* 14 read + 14 written */
  check_adam ("fp32", "--quiet", 30); /* 16 read + 14 written */
  check_adam ("bf16", "--check", 30); /* plus the checking pass */
}

static void
test_memcpy_json (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "bench", "memcpy", "--size", "1MiB", "--threads", "2", "--reps",
            "2", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) parser = json_parser_new ();
  JsonObject *o = parse_object (r.out, parser);
  g_assert_cmpint (json_object_get_int_member (o, "threads"), ==, 2);
  g_assert_cmpint (json_object_get_int_member (o, "size"), ==, 1 << 20);
  double s = json_object_get_double_member (o, "seconds");
  double cs = json_object_get_double_member (o, "copy_seconds");
  g_assert_cmpfloat (s, >, 0);
  g_assert_cmpfloat (cs, >, 0);
  /* STREAM's counting: triad 3 x 4 bytes per element, copy 2 x 4. */
  double n = (1 << 20) / 4;
  g_assert_cmpfloat_with_epsilon (
      json_object_get_double_member (o, "bytes_per_s"), 12 * n / s,
      12 * n / s * 1e-9);
  g_assert_cmpfloat_with_epsilon (
      json_object_get_double_member (o, "copy_bytes_per_s"), 8 * n / cs,
      8 * n / cs * 1e-9);
}

static void
test_errors (void)
{
  const char *const typo[] = { "bench", "adma", NULL };
  stow_assert_usage_error (typo, "did you mean \"adam\"");
  const char *const grad[] = { "bench", "adam", "--grad", "int8", NULL };
  stow_assert_usage_error (grad, "--grad \"int8\"");
  const char *const zero[] = { "bench", "adam", "--params", "0", NULL };
  stow_assert_usage_error (zero, "--params (0) must be > 0");
  const char *const junk[] = { "bench", "adam", "--params", "12Q", NULL };
  stow_assert_usage_error (junk, "--params");
  const char *const isa[] = { "bench", "adam", "--isa", "sse9", NULL };
  stow_assert_usage_error (isa, "--isa \"sse9\"");
  const char *const size[] = { "bench", "memcpy", "--size", "2", NULL };
  stow_assert_usage_error (size, "must be >= 4 bytes");

  g_auto (StowRun) h = { 0 };
  stow_run (&h, "bench", "--help", NULL);
  g_assert_cmpint (h.status, ==, 0);
  g_assert_nonnull (strstr (h.out, "adam"));
  g_assert_nonnull (strstr (h.out, "memcpy"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-bench/adam-json", test_adam_json);
  g_test_add_func ("/cli-bench/memcpy-json", test_memcpy_json);
  g_test_add_func ("/cli-bench/errors", test_errors);
  return g_test_run ();
}
