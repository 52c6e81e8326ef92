/* SPDX-License-Identifier: MIT
 *
 * tests/test-train-hf.c: `stowage train` with models as transformers saves
 * them: sharded weights in and out, the saved dtype (and config.json's
 * torch_dtype saying it), the tokenizer and generation files carried into
 * every checkpoint, --keep-last, and weights that cannot be the model's
 * (extra tensors, NaN) refused by name before any step.
 */
#include <math.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "core/json.h"
#include "executor/safetensors.h"
#include "testutil-io.h"
#include "testutil-train.h"

/* The fixture's model again, saved in shards of at most @max. */
static char *
sharded_model (Fixture *f, const char *max)
{
  char *dir = g_build_filename (f->dir, "sharded", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "init-model", f->config, "-o", dir, "--seed", "3",
            "--max-shard-size", max, NULL);
  g_assert_cmpint (r.status, ==, 0);
  return dir;
}

static JsonObject *
read_json (const char *path, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  *root = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

static guint
count_files (const char *dir, const char *suffix)
{
  g_autofree char *listing = stow_test_list_dir (dir);
  g_auto (GStrv) names = g_strsplit (listing, " ", -1);
  guint n = 0;
  for (guint i = 0; names[i] != NULL; i++)
    n += g_str_has_suffix (names[i], suffix);
  return n;
}

/* A model in shards trains exactly as the same model in one file; a
 * checkpoint written in shards (with its index) resumes bit for bit. */
static void
test_sharded_in_and_out (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *sharded = sharded_model (&f, "40KB");
  g_assert_cmpuint (count_files (sharded, ".safetensors"), >=, 4);
  g_autofree char *a = g_build_filename (f.dir, "a", NULL);
  g_autofree char *b = g_build_filename (f.dir, "b", NULL);
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, a, "--steps", "2", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_auto (StowRun) r2 = { 0 };
  const char *from_shards[]
      = { "train",   "--model", sharded,         "--data", f.shard,
          "--seq",   "16",      "--micro-batch", "2",      "--global-batch",
          "4",       "--lr",    "0.003",         "--out",  b,
          "--steps", "2",       "--precision",   "fp32",   NULL };
  stow_runv (&r2, from_shards);
  g_assert_cmpint (r2.status, ==, 0);
  assert_same_checkpoint (a, b);

  /* Out in shards: the index, no single file; then resume from them. */
  g_autofree char *c = g_build_filename (f.dir, "c", NULL);
  g_autofree char *d = g_build_filename (f.dir, "d", NULL);
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, c, "--steps", "2", "--max-shard-size", "40KB", NULL);
  g_assert_cmpint (r3.status, ==, 0);
  g_autofree char *latest = g_build_filename (c, "latest", NULL);
  g_assert_cmpuint (count_files (latest, ".safetensors"), >=, 4);
  g_assert_cmpuint (count_files (latest, "model.safetensors"), ==, 0);
  g_autofree char *index
      = g_build_filename (latest, "model.safetensors.index.json", NULL);
  g_assert_true (g_file_test (index, G_FILE_TEST_EXISTS));
  g_auto (StowRun) r4 = { 0 };
  train (&r4, &f, c, "--steps", "4", "--max-shard-size", "40KB", "--resume",
         NULL);
  g_assert_cmpint (r4.status, ==, 0);
  g_auto (StowRun) r5 = { 0 };
  train (&r5, &f, d, "--steps", "4", "--max-shard-size", "40KB", NULL);
  g_assert_cmpint (r5.status, ==, 0);
  assert_same_checkpoint (d, c);
  fixture_clear (&f);
}

static char *
torch_dtype_of (const char *out)
{
  g_autofree char *cfg = g_build_filename (out, "latest", "config.json", NULL);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = read_json (cfg, &root);
  return g_strdup (json_object_get_string_member (o, "torch_dtype"));
}

static char *
first_dtype (const char *out)
{
  g_autofree char *st
      = g_build_filename (out, "latest", "model.safetensors", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) s = stow_safetensors_open (st, &error);
  g_assert_no_error (error);
  return g_strdup (stow_safetensors_nth (s, 0)->dtype);
}

/* The losses of a --log-json file, one per line, as text. */
static char *
losses (const char *log)
{
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (log, &text, NULL, NULL));
  g_autoptr (GString) s = g_string_new (NULL);
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++)
    {
      const char *l = strstr (lines[i], "\"loss\"");
      if (l == NULL)
        continue;
      const char *end = strchr (l, ',');
      g_string_append_len (s, l, end ? end - l : (gssize)strlen (l));
      g_string_append_c (s, '\n');
    }
  return g_string_free (g_steal_pointer (&s), FALSE);
}

/* The saved dtype: the training one by default, whatever the input's
 * config said (item 8 of issue 36); --save-dtype bf16 of an fp32 run
 * writes bf16 files and says so, and still resumes bit for bit (the
 * exact weights ride in optimizer.stow); fp32 of a bf16 run is the
 * master. */
static void
test_save_dtype (void)
{
  Fixture f;
  fixture_init (&f);
  /* The model as bf16 with torch_dtype bfloat16; an fp32 run of it. */
  g_autofree char *bf = g_build_filename (f.dir, "bf16-model", NULL);
  g_auto (StowRun) init = { 0 };
  stow_run (&init, "init-model", f.config, "-o", bf, "--dtype", "bf16", NULL);
  g_assert_cmpint (init.status, ==, 0);
  g_autofree char *out = g_build_filename (f.dir, "fp32-run", NULL);
  g_auto (StowRun) r0 = { 0 };
  const char *args[] = { "train", "--model",        bf,     "--data",
                         f.shard, "--seq",          "16",   "--micro-batch",
                         "2",     "--global-batch", "4",    "--lr",
                         "0.003", "--out",          out,    "--steps",
                         "1",     "--precision",    "fp32", NULL };
  stow_runv (&r0, args);
  g_assert_cmpint (r0.status, ==, 0);
  g_autofree char *t0 = torch_dtype_of (out);
  g_assert_cmpstr (t0, ==, "float32");
  g_autofree char *d0 = first_dtype (out);
  g_assert_cmpstr (d0, ==, "F32");

  /* fp32 training saved as bf16: 2 steps, then resumed to 4, against 4
   * straight (both saving bf16) and against plain fp32's losses. */
  g_autofree char *p = g_build_filename (f.dir, "part", NULL);
  g_autofree char *w = g_build_filename (f.dir, "whole", NULL);
  g_autofree char *plain = g_build_filename (f.dir, "plain", NULL);
  g_autofree char *lp = g_build_filename (f.dir, "part.jsonl", NULL);
  g_autofree char *lw = g_build_filename (f.dir, "plain.jsonl", NULL);
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, p, "--steps", "2", "--save-dtype", "bf16", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_autofree char *t1 = torch_dtype_of (p);
  g_assert_cmpstr (t1, ==, "bfloat16");
  g_autofree char *d1 = first_dtype (p);
  g_assert_cmpstr (d1, ==, "BF16");
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, p, "--steps", "4", "--save-dtype", "bf16", "--resume",
         "--log-json", lp, NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, w, "--steps", "4", "--save-dtype", "bf16", NULL);
  g_assert_cmpint (r3.status, ==, 0);
  assert_same_checkpoint (w, p);
  g_auto (StowRun) r4 = { 0 };
  train (&r4, &f, plain, "--steps", "4", "--log-json", lw, NULL);
  g_assert_cmpint (r4.status, ==, 0);
  g_autofree char *resumed = losses (lp);
  g_autofree char *straight = losses (lw);
  /* The resumed run logs steps 3 and 4: the plain run's last two. */
  g_assert_cmpuint (stow_count_lines (resumed), ==, 2);
  g_assert_true (g_str_has_suffix (straight, resumed));

  /* bf16 training saved as fp32: the master, torch_dtype float32. */
  g_autofree char *m = g_build_filename (f.dir, "master", NULL);
  g_auto (StowRun) r5 = { 0 };
  train (&r5, &f, m, "--steps", "1", "--precision", "bf16", "--save-dtype",
         "fp32", NULL);
  g_assert_cmpint (r5.status, ==, 0);
  g_autofree char *t5 = torch_dtype_of (m);
  g_assert_cmpstr (t5, ==, "float32");
  g_autofree char *d5 = first_dtype (m);
  g_assert_cmpstr (d5, ==, "F32");

  const char *bad[]
      = { "train", "--model", f.model, "--data",       f.shard, "--out",
          out,     "--steps", "1",     "--save-dtype", "fp8",   NULL };
  stow_assert_usage_error (bad, "--save-dtype \"fp8\": expected fp32 or bf16");
  fixture_clear (&f);
}

/* generation_config.json and the tokenizer files beside the model go into
 * every checkpoint, as save_pretrained and the tokenizer's would. */
static void
test_model_files_copied (void)
{
  Fixture f;
  fixture_init (&f);
  const char *files[] = { "tokenizer.json", "tokenizer_config.json",
                          "generation_config.json", "special_tokens_map.json" };
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *path = g_build_filename (f.model, files[i], NULL);
      g_autofree char *text = g_strdup_printf ("{\"file\": \"%s\"}", files[i]);
      stow_test_write_file (path, text, strlen (text));
    }
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_auto (StowRun) r = { 0 };
  train (&r, &f, out, "--steps", "1", NULL);
  g_assert_cmpint (r.status, ==, 0);
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *got = contents (out, files[i]);
      g_autofree char *want = g_strdup_printf ("{\"file\": \"%s\"}", files[i]);
      g_assert_cmpstr (got, ==, want);
    }
  g_autofree char *latest = g_build_filename (out, "latest", NULL);
  g_autofree char *listing = stow_test_list_dir (latest);
  g_assert_cmpstr (listing, ==,
                   "config.json generation_config.json model.safetensors "
                   "optimizer.stow run.json special_tokens_map.json "
                   "tokenizer.json tokenizer_config.json");
  fixture_clear (&f);
}

/* --keep-last 2 with a save every step: the two newest stay. */
static void
test_keep_last (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_auto (StowRun) r = { 0 };
  train (&r, &f, out, "--steps", "4", "--save-every", "1", "--keep-last", "2",
         NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *listing = stow_test_list_dir (out);
  g_assert_cmpstr (listing, ==, "latest step-000003 step-000004");
  g_assert_cmpuint (latest_step (out), ==, 4);
  const char *bad[]
      = { "train", "--model", f.model, "--data",      f.shard, "--out",
          out,     "--steps", "1",     "--keep-last", "x",     NULL };
  stow_assert_usage_error (bad, "--keep-last \"x\"");
  fixture_clear (&f);
}

/* The fixture's model with @name (F32 [4]) added in a shard of its own. */
static char *
with_extra_tensor (Fixture *f, const char *name)
{
  char *dir = sharded_model (f, "5GB");
  /* The single file becomes shard 1 of 2, beside the extra one. */
  g_autofree char *single = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *one
      = g_build_filename (dir, "model-00001-of-00002.safetensors", NULL);
  g_autofree char *two
      = g_build_filename (dir, "model-00002-of-00002.safetensors", NULL);
  g_assert_cmpint (g_rename (single, one), ==, 0);
  g_autoptr (GError) error = NULL;
  StowSafetensorSpec spec = { name, "F32", { 4 }, 1 };
  g_autoptr (StowSafetensorsWriter) w
      = stow_safetensors_writer_new (two, &spec, 1, NULL, &error);
  g_assert_no_error (error);
  const float v[4] = { 1, 2, 3, 4 };
  g_assert_true (stow_safetensors_writer_write (w, v, sizeof v, &error));
  g_assert_true (stow_safetensors_writer_finish (w, &error));
  g_autoptr (StowSafetensors) st = stow_safetensors_open (one, &error);
  g_assert_no_error (error);
  g_autoptr (GString) index = g_string_new ("{\"weight_map\": {");
  for (guint i = 0; i < stow_safetensors_n_tensors (st); i++)
    g_string_append_printf (index,
                            "\"%s\": \"model-00001-of-00002.safetensors\", ",
                            stow_safetensors_nth (st, i)->name);
  g_string_append_printf (
      index, "\"%s\": \"model-00002-of-00002.safetensors\"}}", name);
  g_autofree char *ip
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  stow_test_write_file (ip, index->str, index->len);
  return dir;
}

/* An extra tensor: refused by name before anything is written, or with
 * --ignore-extra-tensors dropped with a notice. */
static void
test_extra_tensor (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *model = with_extra_tensor (&f, "lm_head.bias");
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  const char *base[] = { "train", "--model",        model, "--data",
                         f.shard, "--seq",          "16",  "--micro-batch",
                         "2",     "--global-batch", "4",   "--out",
                         out,     "--steps",        "1",   NULL };
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, base);
  g_assert_cmpint (r.status, !=, 0);
  g_assert_nonnull (strstr (r.err, "\"lm_head.bias\""));
  g_assert_nonnull (strstr (r.err, "--ignore-extra-tensors"));
  g_assert_cmpuint (latest_step (out), ==, 0);
  const char *more[] = { "--ignore-extra-tensors", NULL };
  g_autoptr (GPtrArray) a = args_join (base, more);
  g_auto (StowRun) r2 = { 0 };
  stow_runv (&r2, (const char *const *)a->pdata);
  g_assert_cmpint (r2.status, ==, 0);
  g_assert_nonnull (strstr (r2.err, "dropped 1 tensor the model does not "
                                    "have: \"lm_head.bias\""));
  /* The checkpoint holds the model's tensors alone. */
  g_autofree char *st
      = g_build_filename (out, "latest", "model.safetensors", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowSafetensors) s = stow_safetensors_open (st, &error);
  g_assert_no_error (error);
  g_assert_null (stow_safetensors_find (s, "lm_head.bias"));
  fixture_clear (&f);
}

/* A NaN weight: refused when loading, naming the tensor and element; no
 * step runs and no checkpoint is written. */
static void
test_nonfinite_weight (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *st = g_build_filename (f.model, "model.safetensors", NULL);
  g_autoptr (GError) error = NULL;
  const char *name = "model.layers.1.mlp.down_proj.weight";
  guint64 at = 0;
  {
    g_autoptr (StowSafetensors) s = stow_safetensors_open (st, &error);
    g_assert_no_error (error);
    const StowSafetensor *t = stow_safetensors_find (s, name);
    g_assert_nonnull (t);
    g_assert_cmpstr (t->dtype, ==, "F32");
    /* The data section follows the 8-byte length and the header. */
    GBytes *b = stow_test_read_file (st);
    guint64 hlen = 0;
    memcpy (&hlen, g_bytes_get_data (b, NULL), 8);
    at = 8 + hlen + t->offset + 5 * 4;
    g_bytes_unref (b);
  }
  FILE *fp = fopen (st, "r+b");
  g_assert_nonnull (fp);
  const float nan = NAN;
  g_assert_cmpint (fseek (fp, (long)at, SEEK_SET), ==, 0);
  g_assert_cmpuint (fwrite (&nan, 4, 1, fp), ==, 1);
  fclose (fp);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_auto (StowRun) r = { 0 };
  train (&r, &f, out, "--steps", "1", NULL);
  g_assert_cmpint (r.status, !=, 0);
  g_autofree char *want
      = g_strdup_printf ("\"%s\": element 5 is not finite", name);
  g_assert_nonnull (strstr (r.err, want));
  g_assert_cmpuint (latest_step (out), ==, 0);
  fixture_clear (&f);
}

/* ---- text and JSONL handed to train ------------------------------------
 */

/* tests/data/hf-tiny (transformers' bf16 shards) with Phi-3-mini's
 * tokenizer, in @dir/model. */
static char *
hf_tiny_model (const char *dir)
{
  char *model = g_build_filename (dir, "model", NULL);
  g_assert_cmpint (g_mkdir_with_parents (model, 0755), ==, 0);
  const char *const files[][2] = {
    { "hf-tiny", "config.json" },
    { "hf-tiny", "generation_config.json" },
    { "hf-tiny", "model.safetensors.index.json" },
    { "hf-tiny", "model-00001-of-00002.safetensors" },
    { "hf-tiny", "model-00002-of-00002.safetensors" },
    { "tokenizers/phi3-mini", "tokenizer.json" },
    { "tokenizers/phi3-mini", "tokenizer_config.json" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_auto (GStrv) parts = g_strsplit (files[i][0], "/", -1);
      g_autofree char *src
          = parts[1] ? stow_test_fixture (parts[0], parts[1], files[i][1], NULL)
                     : stow_test_fixture (parts[0], files[i][1], NULL);
      g_autoptr (GBytes) b = stow_test_read_file (src);
      g_autofree char *dst = g_build_filename (model, files[i][1], NULL);
      stow_test_write_file (dst, g_bytes_get_data (b, NULL),
                            g_bytes_get_size (b));
    }
  return model;
}

/* @n JSONL records: {"text": ...}, or (@sft) prompt and completion. */
static char *
write_jsonl (const char *dir, const char *name, guint n, gboolean sft)
{
  static const char *const words[]
      = { "the", "model", "fits",      "on",     "eight",  "GPUs",
          "and", "its",   "optimizer", "states", "stream", "from NVMe" };
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < n; i++)
    {
      GString *a = g_string_new (NULL), *b = g_string_new (NULL);
      for (guint k = 0; k < 6 + i % 7; k++)
        g_string_append_printf (k % 2 ? a : b, "%s%s", k > 1 ? " " : "",
                                words[(i * 7 + k * 3) % G_N_ELEMENTS (words)]);
      if (sft)
        g_string_append_printf (s,
                                "{\"prompt\": \"%s?\", \"completion\": "
                                "\" %s.\"}\n",
                                a->str, b->str);
      else
        g_string_append_printf (s, "{\"text\": \"%s, %s.\"}\n", a->str, b->str);
      g_string_free (a, TRUE);
      g_string_free (b, TRUE);
    }
  char *path = g_build_filename (dir, name, NULL);
  stow_test_write_file (path, s->str, s->len);
  g_string_free (s, TRUE);
  return path;
}

static void
train_on (StowRun *r, const char *model, const char *data, const char *out,
          const char *tokenizer)
{
  const char *const args[] = { "train",   "--model",
                               model,     "--data",
                               data,      "--out",
                               out,       "--steps",
                               "3",       "--seq",
                               "32",      "--micro-batch",
                               "2",       "--global-batch",
                               "4",       "--threads",
                               "2",       tokenizer ? "--tokenizer" : NULL,
                               tokenizer, NULL };
  stow_runv (r, args);
}

/* JSONL handed to train is tokenized with the model's own tokenizer into
 * the cache: the same bytes as `stowage tokenize` then train on its shard;
 * a second run takes the cached tokens; prompt/completion records train
 * with their prompts masked. */
static void
test_jsonl_data (void)
{
  g_autofree char *dir = stow_test_tmpdir ("stow-jsonl-XXXXXX");
  g_autofree char *cache = g_build_filename (dir, "cache", NULL);
  g_setenv ("XDG_CACHE_HOME", cache, TRUE);
  g_autofree char *model = hf_tiny_model (dir);
  g_autofree char *data = write_jsonl (dir, "data.jsonl", 120, FALSE);
  g_autofree char *a = g_build_filename (dir, "a", NULL);
  g_auto (StowRun) ra = { 0 };
  train_on (&ra, model, data, a, NULL);
  g_test_message ("%s", ra.err);
  g_assert_cmpint (ra.status, ==, 0);
  g_assert_nonnull (strstr (ra.err, "tokenized with"));
  g_autofree char *tokens = g_build_filename (cache, "stowage", "tokens", NULL);
  g_autofree char *keys = stow_test_list_dir (tokens);
  g_assert_cmpuint (strlen (keys), ==, 16); /* one entry */

  g_autofree char *prefix = g_build_filename (dir, "tok", NULL);
  g_auto (StowRun) rt = { 0 };
  stow_run (&rt, "tokenize", "--tokenizer", model, "--out", prefix, data, NULL);
  g_assert_cmpint (rt.status, ==, 0);
  g_autofree char *shard = g_strconcat (prefix, "_train.bin", NULL);
  g_autofree char *b = g_build_filename (dir, "b", NULL);
  g_auto (StowRun) rb = { 0 };
  train_on (&rb, model, shard, b, NULL);
  g_assert_cmpint (rb.status, ==, 0);
  assert_same_checkpoint (a, b);

  g_autofree char *c = g_build_filename (dir, "c", NULL);
  g_auto (StowRun) rc = { 0 };
  train_on (&rc, model, data, c, NULL);
  g_assert_cmpint (rc.status, ==, 0);
  g_assert_nonnull (strstr (rc.err, "tokenized before"));
  assert_same_checkpoint (a, c);

  /* The tokenizer named on its own: the same tokens. */
  g_autofree char *tok = g_build_filename (model, "tokenizer.json", NULL);
  g_autofree char *e = g_build_filename (dir, "e", NULL);
  g_auto (StowRun) re = { 0 };
  train_on (&re, model, data, e, tok);
  g_assert_cmpint (re.status, ==, 0);
  assert_same_checkpoint (a, e);

  g_autofree char *sft = write_jsonl (dir, "sft.jsonl", 120, TRUE);
  g_autofree char *s = g_build_filename (dir, "s", NULL);
  g_auto (StowRun) rs = { 0 };
  train_on (&rs, model, sft, s, NULL);
  g_assert_cmpint (rs.status, ==, 0);
  g_assert_nonnull (strstr (rs.err, "prompts masked"));
  stow_test_rm_rf (dir);
  g_unsetenv ("XDG_CACHE_HOME");
}

/* A bad record stops the run before it starts: the file and line named,
 * exit 2, no run directory and nothing left in the cache. */
static void
test_jsonl_bad (void)
{
  g_autofree char *dir = stow_test_tmpdir ("stow-jsonl-XXXXXX");
  g_autofree char *cache = g_build_filename (dir, "cache", NULL);
  g_setenv ("XDG_CACHE_HOME", cache, TRUE);
  g_autofree char *model = hf_tiny_model (dir);
  const char *const cases[][2] = {
    { "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": \"thr\n", ":3" },
    { "{\"text\": \"one\"}\n{\"body\": \"two\"}\n", ":2" },
    { "{\"text\": \"one\"}\n{\"text\": \"\"}\n", ":2" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *data = g_strdup_printf ("%s/bad%u.jsonl", dir, i);
      stow_test_write_file (data, cases[i][0], strlen (cases[i][0]));
      g_autofree char *out = g_strdup_printf ("%s/out%u", dir, i);
      g_auto (StowRun) r = { 0 };
      train_on (&r, model, data, out, NULL);
      g_test_message ("%s", r.err);
      g_assert_cmpint (r.status, ==, 2);
      g_autofree char *where
          = g_strdup_printf ("bad%u.jsonl%s", i, cases[i][1]);
      g_assert_nonnull (strstr (r.err, where));
      g_assert_false (g_file_test (out, G_FILE_TEST_EXISTS));
      g_autofree char *tokens
          = g_build_filename (cache, "stowage", "tokens", NULL);
      g_autofree char *left = g_file_test (tokens, G_FILE_TEST_IS_DIR)
                                  ? stow_test_list_dir (tokens)
                                  : g_strdup ("");
      g_assert_cmpstr (left, ==, "");
    }
  stow_test_rm_rf (dir);
  g_unsetenv ("XDG_CACHE_HOME");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/train-hf/sharded-in-and-out", test_sharded_in_and_out);
  g_test_add_func ("/train-hf/save-dtype", test_save_dtype);
  g_test_add_func ("/train-hf/model-files-copied", test_model_files_copied);
  g_test_add_func ("/train-hf/keep-last", test_keep_last);
  g_test_add_func ("/train-hf/extra-tensor", test_extra_tensor);
  g_test_add_func ("/train-hf/nonfinite-weight", test_nonfinite_weight);
  g_test_add_func ("/train-hf/jsonl-data", test_jsonl_data);
  g_test_add_func ("/train-hf/jsonl-bad", test_jsonl_bad);
  return g_test_run ();
}
