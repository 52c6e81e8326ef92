/* SPDX-License-Identifier: MIT
 *
 * tests/test-model-io.c: a model's weights between safetensors files and
 * a step program's units (executor/model-io.h): the shard rule against
 * huggingface_hub's own test case, sharded saves read back bit for bit,
 * dtype conversion, an earlier save's files removed, and every way a
 * checkpoint can disagree with its model refused by name.
 */
#include <math.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "core/json.h"
#include "executor/model-io.h"
#include "models/model.h"
#include "offload/adam.h"
#include "testutil-io.h"

/* A two-layer llama with biases (GQA, untied head) or a tied one. */
static StowModel *
tiny_model (gboolean tied)
{
  const char *json = tied
                         ? "{\"model_type\":\"llama\",\"hidden_size\":32,"
                           "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                           "\"num_key_value_heads\":2,\"intermediate_size\":48,"
                           "\"vocab_size\":96,\"tie_word_embeddings\":true}"
                         : "{\"model_type\":\"qwen2\",\"hidden_size\":32,"
                           "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                           "\"num_key_value_heads\":2,\"intermediate_size\":48,"
                           "\"vocab_size\":96,\"tie_word_embeddings\":false}";
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = stow_json_parse_data (json, -1, "tiny", &error);
  g_assert_no_error (error);
  StowModel *m
      = stow_model_new_from_json (json_node_get_object (root), "tiny", &error);
  g_assert_no_error (error);
  return m;
}

/* The program's tensor names are the model's: it lives as long. */
static StowModel *models[2];

static StowProgram *
tiny_program (gboolean tied)
{
  if (models[tied] == NULL)
    models[tied] = tiny_model (tied);
  StowProgram *p = stow_program_new (1);
  stow_program_set_units (p, models[tied]);
  return p;
}

/* Every unit's weights, one buffer each, in one dtype. */
typedef struct
{
  GPtrArray *units;
} Weights;

static void *
unit_of (gpointer user, guint unit)
{
  Weights *w = user;
  return g_ptr_array_index (w->units, unit);
}

static Weights
weights_new (const StowProgram *p, StowDtype dtype, guint64 seed)
{
  Weights w = { g_ptr_array_new_with_free_func (g_free) };
  for (guint u = 0; u < p->units->len; u++)
    {
      guint64 n = g_array_index (p->units, StowUnit, u).numel;
      void *buf = g_malloc0 (n * stow_dtype_size (dtype));
      if (seed != 0)
        stow_model_io_init_unit (p, u, 0.02, seed, dtype, buf);
      g_ptr_array_add (w.units, buf);
    }
  return w;
}

static void
save (const StowProgram *p, const char *dir, StowDtype dtype, guint64 max,
      Weights *w)
{
  g_autoptr (GError) error = NULL;
  gboolean ok = stow_model_io_save (p, dir, dtype, max, unit_of, w, &error);
  g_assert_no_error (error);
  g_assert_true (ok);
}

static StowWeightFiles *
open_dir (const char *dir)
{
  g_autoptr (GError) error = NULL;
  StowWeightFiles *f = stow_weight_files_open (dir, &error);
  g_assert_no_error (error);
  return f;
}

static void
assert_same_weights (const StowProgram *p, Weights *a, Weights *b,
                     StowDtype dtype)
{
  for (guint u = 0; u < p->units->len; u++)
    {
      guint64 n = g_array_index (p->units, StowUnit, u).numel;
      g_assert_cmpmem (
          g_ptr_array_index (a->units, u), n * stow_dtype_size (dtype),
          g_ptr_array_index (b->units, u), n * stow_dtype_size (dtype));
    }
}

/* huggingface_hub's tests/test_serialization.py, test_multiple_shards:
 * tensor sizes 6, 10, 30, 2, 2 with max_shard_size 10 go to files
 * [layer_1], [layer_3], [layer_2], [layer_4, layer_5]. */
static void
test_cut_shards_hub_case (void)
{
  const guint64 bytes[] = { 6, 10, 30, 2, 2 };
  guint shard[5];
  g_assert_cmpuint (stow_model_io_cut_shards (bytes, 5, 10, shard), ==, 4);
  const guint want[] = { 0, 2, 1, 3, 3 };
  for (guint i = 0; i < 5; i++)
    g_assert_cmpuint (shard[i], ==, want[i]);
  /* test_single_shard: max_shard_size 100 keeps one file; so does 0. */
  g_assert_cmpuint (stow_model_io_cut_shards (bytes, 5, 100, shard), ==, 1);
  g_assert_cmpuint (stow_model_io_cut_shards (bytes, 5, 0, shard), ==, 1);
  for (guint i = 0; i < 5; i++)
    g_assert_cmpuint (shard[i], ==, 0);
  /* Exactly full shards close only when the next tensor would pass. */
  const guint64 even[] = { 5, 5, 5, 5 };
  g_assert_cmpuint (stow_model_io_cut_shards (even, 4, 10, shard), ==, 2);
  g_assert_cmpuint (shard[1], ==, 0);
  g_assert_cmpuint (shard[2], ==, 1);
}

/* A sharded fp32 save: the index as save_pretrained writes it (total_size,
 * every name to its shard), no shard past the limit unless it holds one
 * larger tensor, and every byte back on load. */
static void
test_sharded_round_trip (void)
{
  g_autoptr (StowProgram) p = tiny_program (FALSE);
  g_autofree char *dir = stow_test_tmpdir ("model-io-shards");
  Weights w = weights_new (p, STOW_DTYPE_F32, 7);
  const guint64 max = 10000;
  save (p, dir, STOW_DTYPE_F32, max, &w);

  g_autofree char *index
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root
      = stow_json_parse_file (index, STOW_JSON_MAX_BYTES, &error);
  g_assert_no_error (error);
  JsonObject *o = json_node_get_object (root);
  JsonObject *meta = json_object_get_object_member (o, "metadata");
  JsonObject *map = json_object_get_object_member (o, "weight_map");
  guint64 total = 0, biggest = 0;
  for (guint i = 0; i < p->unit_tensors->len; i++)
    {
      const StowUnitTensor *t
          = &g_array_index (p->unit_tensors, StowUnitTensor, i);
      total += t->numel * 4;
      biggest = MAX (biggest, t->numel * 4);
      g_assert_true (json_object_has_member (map, t->name));
    }
  g_assert_cmpuint (json_object_get_size (map), ==, p->unit_tensors->len);
  g_assert_cmpint (json_object_get_int_member (meta, "total_size"), ==,
                   (gint64)total);
  /* transformers 5's metadata: total_parameters before total_size, as
   * tests/data/hf-tiny's index (save_pretrained's) has them. */
  g_assert_cmpint (json_object_get_int_member (meta, "total_parameters"), ==,
                   (gint64)(total / 4));
  g_assert_cmpuint (biggest, >, max); /* the embedding gets a file alone */

  /* Each shard: within the limit unless it is one tensor. */
  g_autoptr (StowWeightFiles) f = open_dir (dir);
  g_auto (GStrv) names = stow_weight_files_names (f);
  g_assert_cmpuint (g_strv_length (names), ==, p->unit_tensors->len);
  for (guint i = 1; names[i] != NULL; i++)
    g_assert_cmpint (strcmp (names[i - 1], names[i]), <, 0);
  g_autoptr (GHashTable) in_file
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  g_autoptr (GList) members = json_object_get_members (map);
  guint n_files = 0;
  for (GList *l = members; l != NULL; l = l->next)
    {
      const char *file = json_object_get_string_member (map, l->data);
      g_assert_true (g_str_has_prefix (file, "model-000"));
      StowSafetensors *st = NULL;
      const StowSafetensor *t = stow_weight_files_find (f, l->data, &st);
      g_assert_nonnull (t);
      g_assert_true (g_str_has_suffix (stow_safetensors_path (st), file));
      guint64 *sum = g_hash_table_lookup (in_file, file);
      if (sum == NULL)
        {
          sum = g_new0 (guint64, 2);
          g_hash_table_insert (in_file, g_strdup (file), sum);
          n_files++;
        }
      sum[0] += t->nbytes, sum[1]++;
    }
  g_assert_cmpuint (n_files, >=, 3);
  GHashTableIter it;
  gpointer key, value;
  g_hash_table_iter_init (&it, in_file);
  while (g_hash_table_iter_next (&it, &key, &value))
    {
      const guint64 *sum = value;
      g_assert_true (sum[0] <= max || sum[1] == 1);
      g_autofree char *want = g_strdup_printf ("-of-%05u.safetensors", n_files);
      g_assert_true (g_str_has_suffix (key, want));
    }
  g_autofree char *single = g_build_filename (dir, "model.safetensors", NULL);
  g_assert_false (g_file_test (single, G_FILE_TEST_EXISTS));

  Weights back = weights_new (p, STOW_DTYPE_F32, 0);
  g_assert_true (
      stow_model_io_load (p, f, STOW_DTYPE_F32, unit_of, &back, &error));
  g_assert_no_error (error);
  assert_same_weights (p, &w, &back, STOW_DTYPE_F32);
  g_assert_true (stow_model_io_check_extra (p, f, FALSE, NULL, &error));
  g_assert_no_error (error);
  g_ptr_array_unref (back.units);
  g_ptr_array_unref (w.units);
  stow_test_rm_rf (dir);
}

/* bf16 files into fp32 training weights exactly, fp32 files into bf16
 * rounded to nearest even, as the file's values would be by torch. */
static void
test_dtype_conversion (void)
{
  g_autoptr (StowProgram) p = tiny_program (FALSE);
  g_autofree char *dir = stow_test_tmpdir ("model-io-dtype");
  Weights w32 = weights_new (p, STOW_DTYPE_F32, 11);
  save (p, dir, STOW_DTYPE_F32, 0, &w32);
  g_autoptr (StowWeightFiles) f = open_dir (dir);
  Weights w16 = weights_new (p, STOW_DTYPE_BF16, 0);
  g_autoptr (GError) error = NULL;
  g_assert_true (
      stow_model_io_load (p, f, STOW_DTYPE_BF16, unit_of, &w16, &error));
  g_assert_no_error (error);
  for (guint u = 0; u < p->units->len; u++)
    {
      guint64 n = g_array_index (p->units, StowUnit, u).numel;
      const float *a = g_ptr_array_index (w32.units, u);
      const guint16 *b = g_ptr_array_index (w16.units, u);
      for (guint64 i = 0; i < n; i++)
        g_assert_cmphex (b[i], ==, stow_f32_to_bf16 (a[i]));
    }
  /* And back: bf16 saved, fp32 loaded, the same values. */
  g_clear_pointer (&f, stow_weight_files_free);
  save (p, dir, STOW_DTYPE_BF16, 0, &w16);
  f = open_dir (dir);
  Weights again = weights_new (p, STOW_DTYPE_F32, 0);
  g_assert_true (
      stow_model_io_load (p, f, STOW_DTYPE_F32, unit_of, &again, &error));
  g_assert_no_error (error);
  for (guint u = 0; u < p->units->len; u++)
    {
      guint64 n = g_array_index (p->units, StowUnit, u).numel;
      const float *a = g_ptr_array_index (again.units, u);
      const guint16 *b = g_ptr_array_index (w16.units, u);
      for (guint64 i = 0; i < n; i++)
        g_assert_cmpfloat (a[i], ==, stow_bf16_to_f32 (b[i]));
    }
  g_ptr_array_unref (w32.units);
  g_ptr_array_unref (w16.units);
  g_ptr_array_unref (again.units);
  stow_test_rm_rf (dir);
}

/* A save over an earlier one leaves only its own weights files: a stale
 * model.safetensors would be what transformers reads first. */
static void
test_stale_files_removed (void)
{
  g_autoptr (StowProgram) p = tiny_program (FALSE);
  g_autofree char *dir = stow_test_tmpdir ("model-io-stale");
  Weights w = weights_new (p, STOW_DTYPE_F32, 3);
  g_autofree char *keep = g_build_filename (dir, "config.json", NULL);
  stow_test_write_file (keep, "{}", 2);
  save (p, dir, STOW_DTYPE_F32, 0, &w);
  save (p, dir, STOW_DTYPE_F32, 10000, &w);
  g_autofree char *listing = stow_test_list_dir (dir);
  g_assert_null (strstr (listing, "model.safetensors "));
  g_assert_nonnull (strstr (listing, "model.safetensors.index.json"));
  g_assert_nonnull (strstr (listing, "config.json"));
  save (p, dir, STOW_DTYPE_F32, 0, &w);
  g_free (listing);
  listing = stow_test_list_dir (dir);
  g_assert_cmpstr (listing, ==, "config.json model.safetensors");
  g_ptr_array_unref (w.units);
  stow_test_rm_rf (dir);
}

/* One file holding @names (F32, shape [n]) with @values each. */
static void
write_st (const char *path, const char *const *names, const guint64 *n,
          guint count, float value)
{
  StowSafetensorSpec specs[8];
  for (guint i = 0; i < count; i++)
    specs[i] = (StowSafetensorSpec){ names[i], "F32", { n[i] }, 1 };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensorsWriter) w
      = stow_safetensors_writer_new (path, specs, count, NULL, &error);
  g_assert_no_error (error);
  for (guint i = 0; i < count; i++)
    {
      g_autofree float *v = g_new (float, n[i]);
      for (guint64 j = 0; j < n[i]; j++)
        v[j] = value;
      g_assert_true (stow_safetensors_writer_write (w, v, n[i] * 4, &error));
    }
  g_assert_true (stow_safetensors_writer_finish (w, &error));
  g_assert_no_error (error);
}

static void
write_index (const char *dir, const char *text)
{
  g_autofree char *path
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  stow_test_write_file (path, text, strlen (text));
}

/* The index's mistakes, each named: a file outside the directory, a name
 * the file does not hold, a file that is missing; and a directory with
 * neither file (pytorch_model.bin named as unreadable). */
static void
test_index_refused (void)
{
  g_autofree char *dir = stow_test_tmpdir ("model-io-index");
  g_autofree char *a = g_build_filename (dir, "a.safetensors", NULL);
  const char *names[] = { "x.weight" };
  const guint64 n[] = { 4 };
  write_st (a, names, n, 1, 1.0f);
  static const struct
  {
    const char *index, *says;
    int code;
  } cases[] = {
    { "{\"weight_map\":{\"x.weight\":\"../a.safetensors\"}}",
      "\"x.weight\": expected the name of a .safetensors file in the same "
      "directory",
      STOW_SAFETENSORS_ERROR_INVALID },
    { "{\"weight_map\":{\"y.weight\":\"a.safetensors\"}}",
      "tensor \"y.weight\" is mapped to", STOW_SAFETENSORS_ERROR_MISSING },
    { "{\"weight_map\":{\"x.weight\":\"b.safetensors\"}}",
      "names b.safetensors", -1 },
    { "{\"weight_map\":[]}", "weight_map", -1 },
    { "{\"metadata\":{}}", "weight_map", -1 },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      write_index (dir, cases[i].index);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowWeightFiles) f = stow_weight_files_open (dir, &error);
      g_assert_null (f);
      g_assert_nonnull (error);
      if (cases[i].code >= 0)
        g_assert_error (error, STOW_SAFETENSORS_ERROR, cases[i].code);
      if (strstr (error->message, cases[i].says) == NULL)
        g_error ("case %u: \"%s\" lacks \"%s\"", i, error->message,
                 cases[i].says);
    }
  g_autofree char *index
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  g_unlink (index);
  g_autofree char *bin = g_build_filename (dir, "pytorch_model.bin", NULL);
  stow_test_write_file (bin, "x", 1);
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_weight_files_open (dir, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO);
  g_assert_nonnull (strstr (error->message, "pytorch_model.bin"));
  stow_test_rm_rf (dir);
}

/* The model's tensors copied from a save into files of our own making,
 * plus @extra (F32 [4]) with @value, and the embedding as lm_head.weight
 * when @head (@head_value added to every element). */
static char *
doctored (const StowProgram *p, const char *extra, float value, gboolean head,
          float head_value)
{
  g_autofree char *src = stow_test_tmpdir ("model-io-src");
  Weights w = weights_new (p, STOW_DTYPE_F32, 5);
  save (p, src, STOW_DTYPE_F32, 0, &w);
  g_ptr_array_unref (w.units);
  g_autoptr (StowWeightFiles) f = open_dir (src);
  char *dir = stow_test_tmpdir ("model-io-doctored");
  g_autofree char *main_st
      = g_build_filename (dir, "model-00001-of-00002.safetensors", NULL);
  g_autofree char *more
      = g_build_filename (dir, "model-00002-of-00002.safetensors", NULL);
  /* The model's own tensors, copied as they are. */
  g_auto (GStrv) names = stow_weight_files_names (f);
  guint nt = g_strv_length (names);
  g_autofree StowSafetensorSpec *specs = g_new0 (StowSafetensorSpec, nt);
  for (guint i = 0; i < nt; i++)
    {
      const StowSafetensor *t = stow_weight_files_find (f, names[i], NULL);
      specs[i] = (StowSafetensorSpec){ t->name, t->dtype, { 0 }, t->n_dims };
      memcpy (specs[i].shape, t->shape, sizeof t->shape);
    }
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensorsWriter) sw
      = stow_safetensors_writer_new (main_st, specs, nt, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (GString) index = g_string_new ("{\"weight_map\":{");
  for (guint i = 0; i < nt; i++)
    {
      StowSafetensors *st = NULL;
      const StowSafetensor *t = stow_weight_files_find (f, names[i], &st);
      g_autofree guint8 *buf = g_malloc (t->nbytes);
      g_assert_true (stow_safetensors_read (st, t, 0, buf, t->nbytes, &error));
      g_assert_true (
          stow_safetensors_writer_write (sw, buf, t->nbytes, &error));
      g_string_append_printf (
          index, "\"%s\":\"model-00001-of-00002.safetensors\",", names[i]);
    }
  g_assert_true (stow_safetensors_writer_finish (sw, &error));
  g_assert_no_error (error);
  /* The second shard: the extra tensor and the head copy. */
  StowSafetensors *est = NULL;
  const StowSafetensor *emb
      = stow_weight_files_find (f, "model.embed_tokens.weight", &est);
  StowSafetensorSpec more_specs[2];
  guint nm = 0;
  if (extra)
    more_specs[nm++] = (StowSafetensorSpec){ extra, "F32", { 4 }, 1 };
  if (head)
    more_specs[nm++] = (StowSafetensorSpec){
      "lm_head.weight", emb->dtype, { emb->shape[0], emb->shape[1] }, 2
    };
  g_autoptr (StowSafetensorsWriter) mw
      = stow_safetensors_writer_new (more, more_specs, nm, NULL, &error);
  g_assert_no_error (error);
  if (extra)
    {
      float v[4] = { value, value, value, value };
      g_assert_true (stow_safetensors_writer_write (mw, v, sizeof v, &error));
      g_string_append_printf (
          index, "\"%s\":\"model-00002-of-00002.safetensors\",", extra);
    }
  if (head)
    {
      g_autofree float *buf = g_malloc (emb->nbytes);
      g_assert_true (
          stow_safetensors_read (est, emb, 0, buf, emb->nbytes, &error));
      for (guint64 j = 0; j < emb->numel; j++)
        buf[j] += head_value;
      g_assert_true (
          stow_safetensors_writer_write (mw, buf, emb->nbytes, &error));
      g_string_append (
          index, "\"lm_head.weight\":\"model-00002-of-00002.safetensors\",");
    }
  g_assert_true (stow_safetensors_writer_finish (mw, &error));
  g_assert_no_error (error);
  g_string_truncate (index, index->len - 1);
  g_string_append (index, "}}");
  write_index (dir, index->str);
  stow_test_rm_rf (src);
  return dir;
}

/* lm_head.bias in a checkpoint of a model without one: refused by name,
 * or dropped and described with ignore. */
static void
test_extra_tensors (void)
{
  g_autoptr (StowProgram) p = tiny_program (FALSE);
  g_autofree char *dir = doctored (p, "lm_head.bias", 1.0f, FALSE, 0);
  g_autoptr (StowWeightFiles) f = open_dir (dir);
  g_autoptr (GError) error = NULL;
  g_assert_false (stow_model_io_check_extra (p, f, FALSE, NULL, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR,
                  STOW_SAFETENSORS_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "1 tensor "));
  g_assert_nonnull (strstr (error->message, "\"lm_head.bias\""));
  g_assert_nonnull (strstr (error->message, "--ignore-extra-tensors"));
  g_clear_error (&error);
  g_autofree char *dropped = NULL;
  g_assert_true (stow_model_io_check_extra (p, f, TRUE, &dropped, &error));
  g_assert_no_error (error);
  g_assert_cmpstr (dropped, ==,
                   "1 tensor the model does not have: \"lm_head.bias\"");
  /* The model's own tensors still load. */
  Weights w = weights_new (p, STOW_DTYPE_F32, 0);
  g_assert_true (
      stow_model_io_load (p, f, STOW_DTYPE_F32, unit_of, &w, &error));
  g_assert_no_error (error);
  g_ptr_array_unref (w.units);
  stow_test_rm_rf (dir);
}

/* A tied model: a stored lm_head.weight equal to the embedding is the
 * model's own; one that differs means the config lies. */
static void
test_tied_head (void)
{
  g_autoptr (StowProgram) p = tiny_program (TRUE);
  g_autofree char *same = doctored (p, NULL, 0, TRUE, 0.0f);
  g_autoptr (StowWeightFiles) f = open_dir (same);
  g_autoptr (GError) error = NULL;
  char *dropped = NULL;
  g_assert_true (stow_model_io_check_extra (p, f, FALSE, &dropped, &error));
  g_assert_no_error (error);
  g_assert_null (dropped);
  g_autofree char *differs = doctored (p, NULL, 0, TRUE, 0.5f);
  g_autoptr (StowWeightFiles) g = open_dir (differs);
  g_assert_false (stow_model_io_check_extra (p, g, TRUE, NULL, &error));
  g_assert_error (error, STOW_SAFETENSORS_ERROR,
                  STOW_SAFETENSORS_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "tie_word_embeddings"));
  stow_test_rm_rf (same);
  stow_test_rm_rf (differs);
}

/* A weight that is NaN or infinite: refused by file, tensor and element,
 * whichever dtype it is converted to. */
static void
test_nonfinite_refused (void)
{
  g_autoptr (StowProgram) p = tiny_program (FALSE);
  g_autofree char *dir = stow_test_tmpdir ("model-io-nan");
  Weights w = weights_new (p, STOW_DTYPE_F32, 9);
  /* Unit 1 (layer 0), its first tensor, element 3. */
  const StowUnit *u1 = &g_array_index (p->units, StowUnit, 1);
  const StowUnitTensor *t
      = &g_array_index (p->unit_tensors, StowUnitTensor, u1->first_tensor);
  const float bad[] = { NAN, INFINITY, -INFINITY };
  for (guint b = 0; b < G_N_ELEMENTS (bad); b++)
    for (guint d = 0; d < 2; d++)
      {
        ((float *)g_ptr_array_index (w.units, 1))[t->offset + 3] = bad[b];
        save (p, dir, STOW_DTYPE_F32, 0, &w);
        g_autoptr (StowWeightFiles) f = open_dir (dir);
        StowDtype into = d ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
        Weights back = weights_new (p, into, 0);
        g_autoptr (GError) error = NULL;
        g_assert_false (
            stow_model_io_load (p, f, into, unit_of, &back, &error));
        g_assert_nonnull (error);
        g_autofree char *want = g_strdup_printf ("\"%s\"", t->name);
        g_assert_nonnull (strstr (error->message, want));
        g_assert_nonnull (strstr (error->message, "element 3"));
        g_ptr_array_unref (back.units);
      }
  g_ptr_array_unref (w.units);
  stow_test_rm_rf (dir);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/model-io/cut-shards/hub-case", test_cut_shards_hub_case);
  g_test_add_func ("/model-io/sharded/round-trip", test_sharded_round_trip);
  g_test_add_func ("/model-io/dtype-conversion", test_dtype_conversion);
  g_test_add_func ("/model-io/save/stale-files-removed",
                   test_stale_files_removed);
  g_test_add_func ("/model-io/index/refused", test_index_refused);
  g_test_add_func ("/model-io/extra-tensors", test_extra_tensors);
  g_test_add_func ("/model-io/tied-head", test_tied_head);
  g_test_add_func ("/model-io/nonfinite-refused", test_nonfinite_refused);
  int rc = g_test_run ();
  for (guint i = 0; i < G_N_ELEMENTS (models); i++)
    g_clear_pointer (&models[i], stow_model_unref);
  return rc;
}
