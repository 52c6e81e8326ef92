/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-models.c: "stowage models" and "stowage model" as a user
 * runs them: tables and JSON with the published counts, catalog names from
 * any directory, config.json paths, and one-line errors with exit code 2.
 */
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "tests/testutil.h"

static JsonObject *
parse_object (const char *text, JsonParser *parser)
{
  g_autoptr (GError) error = NULL;
  json_parser_load_from_data (parser, text, -1, &error);
  g_assert_no_error (error);
  JsonNode *root = json_parser_get_root (parser);
  g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
  return json_node_get_object (root);
}

/* Exit 2, nothing on stdout, exactly one line on stderr holding @fragment. */
static void
check_error (const StowRun *r, const char *fragment)
{
  g_assert_cmpint (r->status, ==, 2);
  g_assert_cmpstr (r->out, ==, "");
  g_assert_cmpuint (stow_count_lines (r->err), ==, 1);
  g_assert_nonnull (strstr (r->err, fragment));
}

static void
test_models_table (void)
{
  g_auto (StowRun) r = { 0 };
  /* From a directory with no catalog in it: the catalog is compiled in. */
  g_autofree char *cwd = g_get_current_dir ();
  g_assert_cmpint (chdir ("/"), ==, 0);
  stow_run (&r, "models", NULL);
  g_assert_cmpint (chdir (cwd), ==, 0);

  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.err, ==, "");
  g_assert_true (g_str_has_prefix (r.out, "NAME"));
  g_assert_cmpuint (stow_count_lines (r.out), >=, 61);
  /* Published counts, with thousands separators. */
  g_assert_nonnull (strstr (r.out, "llama-65b"));
  g_assert_nonnull (strstr (r.out, "65,285,660,672"));
  g_assert_nonnull (strstr (r.out, "176,247,271,424"));
  g_assert_nonnull (strstr (r.out, "2,851,598,336"));
  g_assert_nonnull (strstr (r.out, "64/8"));
}

static void
test_models_json (void)
{
  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  stow_run (&r, "models", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  JsonObject *o = parse_object (r.out, p);
  JsonArray *models = json_object_get_array_member (o, "models");
  g_assert_nonnull (models);
  g_assert_cmpuint (json_array_get_length (models), >=, 60);
  gboolean seen = FALSE;
  for (guint i = 0; i < json_array_get_length (models); i++)
    {
      JsonObject *m = json_array_get_object_element (models, i);
      static const char *const keys[]
          = { "name",   "family", "params",   "active_params", "layers",
              "hidden", "heads",  "kv_heads", "vocab" };
      for (gsize k = 0; k < G_N_ELEMENTS (keys); k++)
        g_assert_true (json_object_has_member (m, keys[k]));
      if (g_str_equal (json_object_get_string_member (m, "name"),
                       "mixtral-8x7b"))
        {
          seen = TRUE;
          g_assert_cmpint (json_object_get_int_member (m, "params"), ==,
                           46702792704);
          g_assert_cmpint (json_object_get_int_member (m, "active_params"), ==,
                           12879925248);
          g_assert_cmpint (json_object_get_int_member (m, "kv_heads"), ==, 8);
        }
    }
  g_assert_true (seen);
}

static void
test_model_text (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "model", "llama-65b", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.err, ==, "");
  g_assert_nonnull (strstr (r.out, "65,285,660,672"));
  /* Per layer: 809,517,056 params = 1.51 GiB at 16 bits. */
  g_assert_nonnull (strstr (r.out, "layers 0-79"));
  g_assert_nonnull (strstr (r.out, "809,517,056"));
  g_assert_nonnull (strstr (r.out, "1.51 GiB"));
  /* DeepSpeed's largest layer: the token embedding. */
  g_assert_nonnull (strstr (r.out, "model.embed_tokens, 262,144,000"));
  g_assert_nonnull (strstr (r.out, "attention"));

  g_auto (StowRun) t = { 0 };
  stow_run (&t, "model", "gpt2", "--tensors", NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_assert_nonnull (strstr (t.out, "transformer.h.11.mlp.c_proj.bias"));
  g_assert_nonnull (strstr (t.out, "(tied)"));
}

static void
test_model_json (void)
{
  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  /* Aliases are case-insensitive. */
  stow_run (&r, "model", "LLaMA-1-65B", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  JsonObject *o = parse_object (r.out, p);
  g_assert_cmpstr (json_object_get_string_member (o, "name"), ==, "llama-65b");
  g_assert_cmpstr (json_object_get_string_member (o, "family"), ==, "llama");
  g_assert_cmpint (json_object_get_int_member (o, "params"), ==, 65285660672);
  g_assert_cmpint (json_object_get_int_member (o, "active_params"), ==,
                   65285660672);
  g_assert_cmpint (json_object_get_int_member (o, "layers"), ==, 80);
  g_assert_cmpint (json_object_get_int_member (o, "hidden"), ==, 8192);
  g_assert_cmpint (json_object_get_int_member (o, "heads"), ==, 64);
  g_assert_cmpint (json_object_get_int_member (o, "kv_heads"), ==, 64);
  g_assert_cmpint (json_object_get_int_member (o, "vocab"), ==, 32000);
  g_assert_cmpint (json_object_get_int_member (o, "largest_module_params"), ==,
                   262144000);
  JsonObject *roles = json_object_get_object_member (o, "by_role");
  g_assert_nonnull (roles);
  gint64 sum = 0;
  g_autoptr (GList) names = json_object_get_members (roles);
  for (GList *l = names; l; l = l->next)
    sum += json_object_get_int_member (roles, l->data);
  g_assert_cmpint (sum, ==, 65285660672);
  g_assert_cmpint (json_object_get_int_member (roles, "embedding"), ==,
                   262144000);
}

static void
test_model_path (void)
{
  g_autofree char *path = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                 "deepseek-v3.json", NULL);
  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  gint64 t0 = g_get_monotonic_time ();
  stow_run (&r, "model", path, "--json", NULL);
  double ms = (double)(g_get_monotonic_time () - t0) / 1000.0;
  g_test_message ("stowage model deepseek-v3.json: %.1f ms", ms);
  g_assert_cmpint (r.status, ==, 0);
  JsonObject *o = parse_object (r.out, p);
  g_assert_cmpstr (json_object_get_string_member (o, "name"), ==,
                   "deepseek-v3");
  g_assert_cmpint (json_object_get_int_member (o, "params"), ==, 671026419200);
  g_assert_cmpint (json_object_get_int_member (o, "layers"), ==, 61);
}

static void
test_errors (void)
{
  g_auto (StowRun) typo = { 0 };
  stow_run (&typo, "model", "lama-65b", NULL);
  check_error (&typo, "did you mean \"llama-65b\"");

  g_auto (StowRun) missing = { 0 };
  stow_run (&missing, "model", "/nonexistent/dir/config.json", NULL);
  check_error (&missing, "/nonexistent/dir/config.json");

  g_auto (StowRun) none = { 0 };
  stow_run (&none, "model", NULL);
  g_assert_cmpint (none.status, ==, 2);

  g_auto (StowRun) extra = { 0 };
  stow_run (&extra, "models", "llama", NULL);
  g_assert_cmpint (extra.status, ==, 2);

  /* A malformed config: one line naming the file and the field. */
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = g_dir_make_tmp ("stow-cli-models-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *bad = g_build_filename (dir, "config.json", NULL);
  g_file_set_contents (bad,
                       "{\"model_type\": \"llama\", \"hidden_size\": 4096, "
                       "\"num_hidden_layers\": 32, \"num_attention_heads\": "
                       "32, \"num_key_value_heads\": 7, "
                       "\"intermediate_size\": 11008, \"vocab_size\": 32000}",
                       -1, &error);
  g_assert_no_error (error);
  g_auto (StowRun) kv = { 0 };
  stow_run (&kv, "model", dir, NULL);
  check_error (&kv, "num_key_value_heads (7) must divide "
                    "num_attention_heads (32)");
  g_assert_nonnull (strstr (kv.err, bad));

  g_file_set_contents (bad, "{\"model_type\": \"llama\",", -1, &error);
  g_assert_no_error (error);
  g_auto (StowRun) trunc = { 0 };
  stow_run (&trunc, "model", bad, "--json", NULL);
  check_error (&trunc, bad);

  g_unlink (bad);
  g_rmdir (dir);
}

/* Writes tests/data/hf/llama-2-7b.json with @quant as its
 * quantization_config into @dir; returns the path. */
static char *
write_quantized (const char *dir, const char *quant)
{
  g_autofree char *src = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                "llama-2-7b.json", NULL);
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (src, &text, NULL, NULL));
  char *end = strrchr (text, '}');
  g_assert_nonnull (end);
  *end = '\0';
  g_autofree char *out
      = g_strdup_printf ("%s, \"quantization_config\": %s}", text, quant);
  char *path = g_build_filename (dir, "config.json", NULL);
  g_assert_true (g_file_set_contents (path, out, -1, NULL));
  return path;
}

static gint64
term_bytes (JsonObject *o, const char *name)
{
  JsonObject *dev = json_object_get_object_member (o, "device");
  JsonArray *stages = json_object_get_array_member (dev, "stages");
  JsonArray *terms = json_object_get_array_member (
      json_array_get_object_element (stages, 0), "terms");
  for (guint i = 0; i < json_array_get_length (terms); i++)
    {
      JsonObject *t = json_array_get_object_element (terms, i);
      if (g_str_equal (json_object_get_string_member (t, "name"), name))
        return json_object_get_int_member (t, "bytes");
    }
  g_assert_not_reached ();
}

/* A GPTQ checkpoint: shown with its width and size, planned with its
 * frozen base at that width under LoRA, refused for full fine-tuning. */
static void
test_quantized (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = g_dir_make_tmp ("stow-quant-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *cfg = write_quantized (
      dir, "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}");

  g_auto (StowRun) m = { 0 };
  stow_run (&m, "model", cfg, NULL);
  g_assert_cmpint (m.status, ==, 0);
  /* TheBloke/Llama-2-7B-GPTQ (main: 4-bit, group 128) lists its
   * model.safetensors at 3.90 GB; 3.63 GiB is 3.90e9 bytes. */
  g_assert_nonnull (strstr (m.out, "gptq 4-bit int, group 128"));
  g_assert_nonnull (strstr (m.out, "3.63 GiB"));

  /* The frozen linears at GPTQ's width, LoRA or QLoRA alike:
   * Llama-2-7B's 6,476,005,376 linear weights x (0.5 + 2.5/128 + 4/4096). */
  const char *modes[] = { "lora", "qlora" };
  for (gsize i = 0; i < G_N_ELEMENTS (modes); i++)
    {
      g_auto (StowRun) r = { 0 };
      g_autoptr (JsonParser) p = json_parser_new ();
      stow_run (&r, "mem", cfg, "--gpus", "1xA100-80GB", "--finetune", modes[i],
                "--zero", "0", "--micro-batch", "1", "--recompute", "none",
                "--offload-optimizer", "none", "--json", NULL);
      g_assert_cmpint (r.status, ==, 0);
      JsonObject *o = parse_object (r.out, p);
      /* The memory model spreads the norms evenly over the layers, the
       * final norm's 4096 included: within 1e-5. */
      double want = 6476005376.0 * (0.5 + 2.5 / 128 + 4.0 / 4096);
      g_assert_cmpfloat_with_epsilon (
          (double)term_bytes (o, "parameters") / want, 1.0, 1e-5);
      /* Embeddings and norms at the checkpoint's bf16. */
      g_assert_cmpfloat_with_epsilon (
          (double)term_bytes (o, "parameters (non-linear)")
              / ((2.0 * 32000 * 4096 + 65 * 4096) * 2),
          1.0, 1e-4);
    }

  /* Full fine-tuning is refused, by default too, with the reason. */
  const char *full[][8] = {
    { "fit", cfg, "--gpus", "8xA100-80GB", NULL },
    { "mem", cfg, "--gpus", "8xA100-80GB", "--finetune", "full", NULL },
    { "plan", cfg, "--gpus", "8xA100-80GB", NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (full); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_runv (&r, full[i]);
      check_error (&r, "gptq 4-bit checkpoint");
      g_assert_nonnull (strstr (r.err, "--finetune lora"));
    }

  /* A bad quantization_config is one line naming the field. */
  g_autofree char *bad = write_quantized (
      dir, "{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
           "\"bnb_4bit_quant_type\": \"int3\"}");
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "model", bad, NULL);
  check_error (&b, "bnb_4bit_quant_type \"int3\"");
  g_unlink (bad);
  g_rmdir (dir);
}

/* accelerate's docs (usage_guides/model_size_estimator.md) print for
 * `accelerate estimate-memory bert-base-cased`, in MiB ("MB") and GiB
 * ("GB"), 1024-based:
 *   float32 | 84.95 MB | 418.18 MB | 1.61 GB
 *   float16 | 42.47 MB | 206.59 MB | 826.36 MB
 *   int8    | 21.24 MB | 103.29 MB | 413.18 MB
 *   int4    | 10.62 MB | 51.65 MB  | 206.59 MB
 * bert-base-cased is bert-base-uncased with a 28,996-token vocabulary.
 * The float32 total is the docs' one inconsistency: their own training
 * column (1.61 GB = 4 x 413.18 MiB) and float16 row (206.59 = 413.18 / 2)
 * say 413.18, which is what stowage gives.  The int8 and int4 training
 * sizes come from an older accelerate; today's prints N/A for them, as
 * stowage does. */
static void
test_accelerate_table (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = g_dir_make_tmp ("stow-acc-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *src = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                "bert-base-uncased.json", NULL);
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (src, &text, NULL, NULL));
  g_autofree char *cased = NULL;
  {
    g_auto (GStrv) parts = g_strsplit (text, "30522", 2);
    g_assert_cmpuint (g_strv_length (parts), ==, 2);
    cased = g_strjoinv ("28996", parts);
  }
  g_autofree char *cfg = g_build_filename (dir, "config.json", NULL);
  g_assert_true (g_file_set_contents (cfg, cased, -1, NULL));

  g_auto (StowRun) r = { 0 };
  g_autoptr (JsonParser) p = json_parser_new ();
  stow_run (&r, "model", cfg, "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  JsonArray *rows = json_object_get_array_member (parse_object (r.out, p),
                                                  "accelerate_estimate");
  g_assert_cmpuint (json_array_get_length (rows), ==, 4);
  static const struct
  {
    const char *dtype, *largest_mib, *total_mib, *training;
  } want[] = {
    { "float32", "84.95", "413.18", "1.61 GB" },
    { "float16", "42.47", "206.59", "826.36 MB" },
    { "int8", "21.24", "103.29", NULL },
    { "int4", "10.62", "51.65", NULL },
  };
  for (guint i = 0; i < 4; i++)
    {
      JsonObject *o = json_array_get_object_element (rows, i);
      char buf[64];
      g_assert_cmpstr (json_object_get_string_member (o, "dtype"), ==,
                       want[i].dtype);
      g_snprintf (buf, sizeof buf, "%.2f",
                  json_object_get_int_member (o, "largest_layer_bytes")
                      / 1048576.0);
      g_assert_cmpstr (buf, ==, want[i].largest_mib);
      g_snprintf (buf, sizeof buf, "%.2f",
                  json_object_get_int_member (o, "total_bytes") / 1048576.0);
      g_assert_cmpstr (buf, ==, want[i].total_mib);
      if (want[i].training == NULL)
        {
          g_assert_false (json_object_has_member (o, "training_bytes"));
          continue;
        }
      double t = (double)json_object_get_int_member (o, "training_bytes");
      if (t >= 1 << 30)
        g_snprintf (buf, sizeof buf, "%.2f GB", t / 1073741824.0);
      else
        g_snprintf (buf, sizeof buf, "%.2f MB", t / 1048576.0);
      g_assert_cmpstr (buf, ==, want[i].training);
    }

  /* The text table, in GiB. */
  g_auto (StowRun) t = { 0 };
  stow_run (&t, "model", cfg, NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_assert_nonnull (strstr (t.out, "accelerate estimate-memory (GiB"));
  g_assert_nonnull (strstr (t.out, "float16            0.04         0.20"));
  g_unlink (cfg);
  g_rmdir (dir);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-models/models-table", test_models_table);
  g_test_add_func ("/cli-models/models-json", test_models_json);
  g_test_add_func ("/cli-models/model-text", test_model_text);
  g_test_add_func ("/cli-models/model-json", test_model_json);
  g_test_add_func ("/cli-models/model-path", test_model_path);
  g_test_add_func ("/cli-models/errors", test_errors);
  g_test_add_func ("/cli-models/quantized", test_quantized);
  g_test_add_func ("/cli-models/accelerate-table", test_accelerate_table);
  return g_test_run ();
}
