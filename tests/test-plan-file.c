/* SPDX-License-Identifier: MIT
 *
 * tests/test-plan-file.c: plan files round-trip (every field, and the
 * memory recomputed from the file equals the memory it was written from),
 * bad fields are refused with the file and the field named, and mutated
 * plan files (bytes flipped, values swapped for other types) never crash.
 */
#include <glib/gstdio.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "planner/memory-json.h"
#include "planner/plan-file.h"
#include "tests/testutil-planner.h"

typedef struct
{
  const char *model, *gpus;
  void (*set) (StowLayout *l, StowTraining *t);
} Case;

static void
one_gpu_nvme (StowLayout *l, StowTraining *t)
{
  l->zero = 3;
  l->offload_params = STOW_OFFLOAD_NVME;
  l->offload_optimizer = STOW_OFFLOAD_NVME;
  l->recompute = STOW_RECOMPUTE_FULL;
  (void)t;
}

static void
eight_zero3 (StowLayout *l, StowTraining *t)
{
  l->dp = 8;
  l->zero = 3;
  l->engine = STOW_ENGINE_DEEPSPEED;
  l->micro_batch = 2;
  l->grad_accum = 4;
  t->global_batch = 64;
  t->precision = STOW_PRECISION_FP16;
  /* Optimizer settings other than the defaults: each must survive. */
  t->optim.lr = 3e-4, t->optim.min_lr = 3e-5;
  t->optim.warmup_steps = 20, t->optim.total_steps = 1000;
  t->optim.schedule = STOW_LR_COSINE;
  t->optim.weight_decay = 0.1, t->optim.decay_on = STOW_DECAY_ALL;
  t->optim.beta2 = 0.95, t->optim.eps = 1e-6, t->optim.max_grad_norm = 0.5;
}

static void
tp8_pp4_vpp2 (StowLayout *l, StowTraining *t)
{
  l->dp = 2, l->tp = 8, l->pp = 4, l->vpp = 2, l->sp = TRUE, l->zero = 1;
  l->schedule = STOW_SCHEDULE_INTERLEAVED;
  l->grad_accum = 8;
  l->recompute = STOW_RECOMPUTE_SELECTIVE;
  l->engine = STOW_ENGINE_MEGATRON;
  t->seq_len = 4096;
}

static const Case cases[] = {
  { "llama-7b", "1xA100-80GB", one_gpu_nvme },
  { "llama-13b", "8xA100-80GB", eight_zero3 },
  { "llama-65b", "64xH100-SXM", tp8_pp4_vpp2 },
};

static StowPlanFile *
make_plan (const Case *c, StowMemory **mem_out)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) model = stow_test_model (c->model);
  g_autoptr (StowCluster) cluster = stow_test_cluster (c->gpus);
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  o.fragmentation = 0.07; /* not the default: must survive the trip */
  o.reduce_bucket_elements = 200000000;
  o.overlap_comm = 1;
  o.free_grads = 0;
  c->set (&l, &t);
  /* As every command does: the resident layers decided before the memory
   * is estimated, so the plan's terms include them. */
  g_assert_true (test_resolve_resident (model, cluster, &t, &l, &o, &error));
  StowMemory *mem
      = stow_memory_estimate (TEST_PLAN (model, cluster, &t, &l, &o), &error);
  g_assert_no_error (error);
  *mem_out = mem;
  return stow_plan_file_new (model, cluster, &t, &l, &o, mem, NULL);
}

static void
assert_terms_equal (GArray *a, GArray *b)
{
  g_assert_cmpuint (a->len, ==, b->len);
  for (guint i = 0; i < a->len; i++)
    {
      StowMemTerm *x = &g_array_index (a, StowMemTerm, i);
      StowMemTerm *y = &g_array_index (b, StowMemTerm, i);
      g_assert_cmpstr (x->name, ==, y->name);
      g_assert_cmpuint (x->bytes, ==, y->bytes);
      g_assert_cmpint (x->tier, ==, y->tier);
      g_assert_cmpstr (x->formula, ==, y->formula);
    }
}

static void
test_round_trip (gconstpointer data)
{
  const Case *c = data;
  g_autoptr (GError) error = NULL;
  StowMemory *mem = NULL;
  g_autoptr (StowPlanFile) p = make_plan (c, &mem);
  g_autofree char *dir = g_dir_make_tmp ("stow-plan-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *path = g_build_filename (dir, "plan.json", NULL);
  g_assert_true (stow_plan_file_write (p, mem, path, &error));
  g_assert_no_error (error);

  g_autoptr (StowPlanFile) q = stow_plan_file_read (path, &error);
  g_assert_no_error (error);
  g_assert_nonnull (q);
  g_assert_true (memcmp (&p->layout, &q->layout, sizeof p->layout) == 0);
  g_assert_true (memcmp (&p->training, &q->training, sizeof p->training) == 0);
  g_assert_true (
      memcmp (&p->mem_options, &q->mem_options, sizeof p->mem_options) == 0);
  g_assert_cmpstr (q->model->name, ==, c->model);
  g_assert_cmpuint (q->model->params, ==, p->model->params);
  g_assert_cmpstr (q->cluster->spec, ==, c->gpus);
  g_assert_cmpuint (q->cluster->n_gpus, ==, p->cluster->n_gpus);
  g_assert_cmpuint (q->cluster->node.gpu.total_bytes, ==,
                    p->cluster->node.gpu.total_bytes);
  g_assert_cmpuint (q->cluster->node.host_ram_bytes, ==,
                    p->cluster->node.host_ram_bytes);
  g_assert_cmpuint (q->cluster->node.n_nvme, ==, p->cluster->node.n_nvme);
  g_assert_cmpuint (q->streaming.resident_layers, ==,
                    p->streaming.resident_layers);
  g_assert_cmpuint (q->streaming.prefetch_depth, ==,
                    p->streaming.prefetch_depth);
  g_assert_cmpuint (q->streaming.optimizer_swap_buffers, ==,
                    p->streaming.optimizer_swap_buffers);
  g_assert_cmpuint (q->streaming.param_buffer_elems, ==,
                    p->streaming.param_buffer_elems);
  g_assert_cmpuint (q->streaming.io_queue_depth, ==,
                    p->streaming.io_queue_depth);
  g_assert_cmpuint (q->streaming.io_block_bytes, ==,
                    p->streaming.io_block_bytes);
  g_assert_cmpuint (g_strv_length (q->streaming.nvme_paths), ==,
                    g_strv_length (p->streaming.nvme_paths));
  g_assert_cmpuint (q->predicted_device_bytes, ==, mem->total_bytes);

  /* The numbers come back: every term of every stage, host and NVMe. */
  g_autoptr (StowMemory) m2
      = stow_memory_estimate (TEST_PLAN (q->model, q->cluster, &q->training,
                                         &q->layout, &q->mem_options),
                              &error);
  g_assert_no_error (error);
  g_assert_cmpuint (m2->n_stages, ==, mem->n_stages);
  for (guint i = 0; i < mem->n_stages; i++)
    assert_terms_equal (mem->stages[i].terms, m2->stages[i].terms);
  assert_terms_equal (mem->host_terms, m2->host_terms);
  assert_terms_equal (mem->nvme_terms, m2->nvme_terms);
  g_assert_cmpuint (m2->total_bytes, ==, mem->total_bytes);
  g_assert_cmpuint (m2->capacity_bytes, ==, mem->capacity_bytes);
  g_assert_cmpuint (m2->host_capacity_bytes, ==, mem->host_capacity_bytes);
  g_assert_cmpuint (m2->nvme_capacity_bytes, ==, mem->nvme_capacity_bytes);

  /* Written again, the file is the same bytes. */
  g_autoptr (JsonNode) n1 = stow_plan_file_to_json (p, mem);
  g_autoptr (JsonNode) n2 = stow_plan_file_to_json (q, m2);
  g_autofree char *s1 = stow_json_to_string (n1, TRUE);
  g_autofree char *s2 = stow_json_to_string (n2, TRUE);
  g_assert_cmpstr (s1, ==, s2);

  stow_memory_free (mem);
  g_unlink (path);
  g_rmdir (dir);
  g_unlink (path);
  g_rmdir (dir);
}

/* The plan's "memory" holds every figure of the memory: the reports'
 * (mem --json) with the tier in front of the name, the same stages and
 * the same terms.  Files written before it had them all still read
 * (tests/test-reports-golden.c, /reports/plan-previous). */
static void
test_memory_figures (gconstpointer data)
{
  StowMemory *mem = NULL;
  g_autoptr (StowPlanFile) p = make_plan (data, &mem);
  g_autoptr (JsonNode) plan = stow_plan_file_to_json (p, mem);
  JsonObject *m
      = json_object_get_object_member (json_node_get_object (plan), "memory");
  struct
  {
    const char *key;
    guint64 bytes;
  } want[] = {
    { "device_allocated_peak_bytes", mem->allocated_peak_bytes },
    { "device_reserved_bytes", mem->reserved_bytes },
    { "device_total_bytes", mem->total_bytes },
    { "device_capacity_bytes", mem->capacity_bytes },
    { "peak_stage", mem->peak_stage },
    { "host_pinned_bytes", mem->host_pinned_bytes },
    { "host_pageable_bytes", mem->host_pageable_bytes },
    { "host_total_bytes", mem->host_total_bytes },
    { "host_capacity_bytes", mem->host_capacity_bytes },
    { "nvme_bytes", mem->nvme_bytes },
    { "nvme_capacity_bytes", mem->nvme_capacity_bytes },
  };
  g_assert_cmpint (json_object_get_boolean_member (m, "fits"), ==, mem->fits);
  for (gsize i = 0; i < G_N_ELEMENTS (want); i++)
    g_assert_cmpuint (json_object_get_int_member (m, want[i].key), ==,
                      want[i].bytes);
  JsonArray *stages = json_object_get_array_member (m, "stages");
  g_assert_cmpuint (json_array_get_length (stages), ==, mem->n_stages);
  for (guint i = 0; i < mem->n_stages; i++)
    {
      JsonObject *s = json_array_get_object_element (stages, i);
      g_assert_cmpuint (json_object_get_int_member (s, "params"), ==,
                        mem->stages[i].params);
      g_assert_cmpuint (json_object_get_int_member (s, "allocated_bytes"), ==,
                        mem->stages[i].allocated_bytes);
      g_assert_cmpuint (json_object_get_int_member (s, "reserved_bytes"), ==,
                        mem->stages[i].reserved_bytes);
    }

  /* Every member of the reports' tier objects, under its plan name. */
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_memory_json_members (b, mem, STOW_MEMORY_JSON_REPORT);
  json_builder_end_object (b);
  g_autoptr (JsonNode) report = json_builder_get_root (b);
  const char *tiers[] = { "device", "host", "nvme" };
  guint n_members = 0;
  for (gsize t = 0; t < G_N_ELEMENTS (tiers); t++)
    {
      JsonObject *o = json_object_get_object_member (
          json_node_get_object (report), tiers[t]);
      g_autoptr (GList) names = json_object_get_members (o);
      for (GList *l = names; l; l = l->next, n_members++)
        {
          const char *key = l->data;
          g_autofree char *flat
              = g_str_equal (key, "peak_stage") || g_str_equal (key, "stages")
                    ? g_strdup (key)
                    : g_strdup_printf ("%s_%s", tiers[t], key);
          g_autofree char *x
              = stow_json_to_string (json_object_get_member (o, key), FALSE);
          g_autofree char *y
              = stow_json_to_string (json_object_get_member (m, flat), FALSE);
          g_assert_cmpstr (x, ==, y);
        }
    }
  /* And nothing else but "fits". */
  g_assert_cmpuint (json_object_get_size (m), ==, n_members + 1);
  stow_memory_free (mem);
}

/* The schedule follows the layout: streaming parameters means two slots
 * and fewer resident layers; NVMe means paths and an I/O shape. */
static void
test_schedule (void)
{
  StowMemory *mem = NULL;
  g_autoptr (StowPlanFile) p = make_plan (&cases[0], &mem);
  g_assert_cmpuint (p->streaming.prefetch_depth, ==, 2);
  g_assert_cmpuint (p->streaming.resident_layers, <=, 32);
  g_assert_cmpuint (p->streaming.optimizer_swap_buffers, ==, 3);
  g_assert_cmpuint (p->streaming.param_swap_buffers, ==, 5);
  g_assert_cmpuint (p->streaming.io_block_bytes, ==, 1 << 20);
  g_assert_cmpuint (p->streaming.io_queue_depth, ==, 8);
  g_assert_cmpuint (g_strv_length (p->streaming.nvme_paths), ==, 1);
  /* The largest parameter fits a swap buffer (DeepSpeed's requirement). */
  g_assert_cmpuint (p->streaming.param_buffer_elems, >=,
                    p->model->largest_module_params);
  stow_memory_free (mem);

  g_autoptr (StowPlanFile) q = make_plan (&cases[2], &mem);
  g_assert_cmpuint (q->streaming.prefetch_depth, ==, 0);
  g_assert_cmpuint (q->streaming.resident_layers, ==,
                    mem->stages[mem->peak_stage].layers);
  g_assert_cmpuint (g_strv_length (q->streaming.nvme_paths), ==, 0);
  stow_memory_free (mem);
}

static char *
valid_plan_text (void)
{
  StowMemory *mem = NULL;
  g_autoptr (StowPlanFile) p = make_plan (&cases[1], &mem);
  g_autoptr (JsonNode) n = stow_plan_file_to_json (p, mem);
  stow_memory_free (mem);
  return stow_json_to_string (n, TRUE);
}

/* Replaces the first occurrence of @from in @text. */
static char *
replace (const char *text, const char *from, const char *to)
{
  const char *at = strstr (text, from);
  g_assert_nonnull (at);
  return g_strdup_printf ("%.*s%s%s", (int)(at - text), text, to,
                          at + strlen (from));
}

static void
expect_error (const char *text, const char *needle)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowPlanFile) p
      = stow_plan_file_from_data (text, -1, "plan.json", &error);
  g_assert_null (p);
  g_assert_nonnull (error);
  if (!g_str_has_prefix (error->message, "plan.json")
      || strstr (error->message, needle) == NULL)
    g_error ("error \"%s\" should start with plan.json and name \"%s\"",
             error->message, needle);
}

static void
test_errors (void)
{
  g_autofree char *good = valid_plan_text ();
  struct
  {
    const char *from, *to, *needle;
  } bad[] = {
    { "\"stowage-plan\"", "\"ds-config\"", "format" },
    { "\"version\" : 1", "\"version\" : 2", "version" },
    { "\"version\" : 1", "\"versoin\" : 1", "version" },
    { "\"tp\" : 1", "\"tp\" : 0", "layout: tp" },
    { "\"tp\" : 1", "\"tp\" : \"one\"", "tp" },
    { "\"tp\" : 1", "\"tp\" : 3", "--tp 3" },
    { "\"zero\" : 3", "\"zero\" : 4", "zero" },
    { "\"offload_optimizer\" : \"none\"", "\"offload_optimizer\" : \"disk\"",
      "offload_optimizer" },
    { "\"precision\" : \"fp16\"", "\"precision\" : 16", "precision" },
    { "\"params\" : 13015864320", "\"params\" : 13015864321", "params" },
    { "\"name\" : \"llama-13b\"", "\"name\" : \"llama-14b\"", "model" },
    { "\"micro_batch\" : 2", "\"micro_btach\" : 2", "micro_batch" },
    { "\"fragmentation\" : 0.070000000000000007", "\"fragmentation\" : 1.5",
      "fragmentation" },
    { "\"gpus_per_node\" : 8", "\"gpus_per_node\" : -8", "gpus_per_node" },
    { "\"io_queue_depth\" : 0", "\"io_queue_depth\" : 99999",
      "io_queue_depth" },
    { "\"global_batch\" : 64", "\"global_batch\" : 65", "global-batch" },
    { "\"chunked_loss\" : false,\n    \"fused_loss\" : false",
      "\"chunked_loss\" : true,\n    \"fused_loss\" : true",
      "training: chunked_loss and fused_loss" },
    { "\"beta2\" : 0.94999999999999996", "\"beta2\" : 1.5",
      "training.optim: --beta1 0.9, --beta2 1.5: each must be below 1" },
    { "\"min_lr\" : 3.0000000000000001e-05", "\"min_lr\" : 0.01",
      "training.optim: --min-lr 0.01 is above --lr 0.0003" },
    { "\"steps\" : 1000", "\"steps\" : 0",
      "training.optim: --lr-schedule cosine decays to --min-lr" },
    { "\"lr_schedule\" : \"cosine\"", "\"lr_schedule\" : \"step\"",
      "training.optim: --lr-schedule \"step\"" },
    { "\"weight_decay_on\" : \"all\"", "\"weight_decay_on\" : \"norms\"",
      "training.optim: --weight-decay-on \"norms\"" },
    { "\"eps\" : 9.9999999999999995e-07", "\"eps\" : -1",
      "training.optim: eps: -1 is below 0" },
    { "\"max_grad_norm\" : 0.5", "\"max_grad_nrom\" : 0.5",
      "unknown field \"max_grad_nrom\" (did you mean \"max_grad_norm\"?)" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      if (strstr (good, bad[i].from) == NULL)
        g_error ("fixture lacks %s", bad[i].from);
      g_autofree char *text = replace (good, bad[i].from, bad[i].to);
      expect_error (text, bad[i].needle);
    }
  expect_error ("[1, 2]", "object");

  /* A plan without training.optim (written before it existed) trains
   * with the defaults; so does one without some of its members. */
  g_autoptr (JsonNode) root
      = stow_json_parse_data (good, -1, "plan.json", NULL);
  JsonObject *tr
      = json_object_get_object_member (json_node_get_object (root), "training");
  json_object_remove_member (json_object_get_object_member (tr, "optim"), "lr");
  g_autofree char *no_lr = stow_json_to_string (root, TRUE);
  json_object_remove_member (tr, "optim");
  g_autofree char *no_optim = stow_json_to_string (root, TRUE);
  StowOptimSettings def;
  stow_optim_settings_init (&def);
  g_autoptr (GError) e1 = NULL;
  g_autoptr (StowPlanFile) p1
      = stow_plan_file_from_data (no_lr, -1, "plan.json", &e1);
  g_assert_no_error (e1);
  g_assert_cmpfloat (p1->training.optim.lr, ==, def.lr);
  g_assert_cmpfloat (p1->training.optim.beta2, ==, 0.95);
  g_autoptr (StowPlanFile) p2
      = stow_plan_file_from_data (no_optim, -1, "plan.json", &e1);
  g_assert_no_error (e1);
  g_assert_true (memcmp (&p2->training.optim, &def, sizeof def) == 0);
  expect_error ("{\"format\": \"stowage-plan\", \"version\": 1}", "model");
  g_autoptr (GError) error = NULL;
  g_assert_null (stow_plan_file_read ("/nonexistent/plan.json", &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);
}

/* Every member, replaced by each value of another type or out of range,
 * is refused or accepted but never crashes; then random byte edits. */
static void
mutate_members (JsonNode *root, JsonNode *node, guint *tried)
{
  static const char *const values[]
      = { "null",  "-1",    "0",
          "1e300", "\"x\"", "[]",
          "{}",    "true",  "18446744073709551615",
          "4.5" };
  if (!JSON_NODE_HOLDS_OBJECT (node))
    return;
  JsonObject *o = json_node_get_object (node);
  g_autoptr (GList) names = json_object_get_members (o);
  for (GList *l = names; l; l = l->next)
    {
      /* Removing the member frees its name. */
      g_autofree char *name = g_strdup (l->data);
      JsonNode *saved = json_node_copy (json_object_get_member (o, name));
      for (gsize v = 0; v < G_N_ELEMENTS (values); v++)
        {
          JsonNode *val = json_from_string (values[v], NULL);
          json_object_set_member (o, name, val);
          g_autofree char *text = stow_json_to_string (root, FALSE);
          g_autoptr (GError) error = NULL;
          g_autoptr (StowPlanFile) p
              = stow_plan_file_from_data (text, -1, "fuzz.json", &error);
          g_assert_true ((p == NULL) != (error == NULL));
          if (error)
            g_assert_true (g_str_has_prefix (error->message, "fuzz.json"));
          (*tried)++;
        }
      json_object_remove_member (o, name);
      {
        g_autofree char *text = stow_json_to_string (root, FALSE);
        g_autoptr (GError) error = NULL;
        g_autoptr (StowPlanFile) p
            = stow_plan_file_from_data (text, -1, "fuzz.json", &error);
        g_assert_true ((p == NULL) != (error == NULL));
      }
      json_object_set_member (o, name, saved);
      mutate_members (root, saved, tried);
    }
}

static void
test_fuzz (void)
{
  g_autofree char *good = valid_plan_text ();
  g_autoptr (JsonNode) root = json_from_string (good, NULL);
  guint tried = 0;
  /* Only the plan's own sections: the embedded config.json and cluster
   * are their rooms' parsers (fuzzed in their own tests). */
  mutate_members (root, root, &tried);
  g_test_message ("%u member mutations", tried);
  g_assert_cmpuint (tried, >, 500);

  GRand *rand = g_rand_new_with_seed (20261122);
  gsize len = strlen (good);
  for (guint i = 0; i < 400; i++)
    {
      g_autofree char *text = g_strdup (good);
      guint edits = g_rand_int_range (rand, 1, 6);
      for (guint k = 0; k < edits; k++)
        {
          gsize at = g_rand_int_range (rand, 0, (gint32)len);
          static const char junk[] = "{}[]\",:0-9eE.x \n\\";
          text[at] = junk[g_rand_int_range (rand, 0, sizeof junk - 1)];
        }
      gssize cut = g_rand_boolean (rand)
                       ? (gssize)g_rand_int_range (rand, 0, (gint32)len)
                       : -1;
      g_autoptr (GError) error = NULL;
      g_autoptr (StowPlanFile) p
          = stow_plan_file_from_data (text, cut, "fuzz.json", &error);
      g_assert_true ((p == NULL) != (error == NULL));
    }
  g_rand_free (rand);
}

/* A model from a config.json is embedded: the plan reloads after the file
 * is gone, with the same name, count and memory. */
static void
test_embedded_config (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *src = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                                "llama-3-70b.json", NULL);
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (src, &text, NULL, &error));
  g_autofree char *dir = g_dir_make_tmp ("stow-plan-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *cfg = g_build_filename (dir, "config.json", NULL);
  g_autofree char *path = g_build_filename (dir, "plan.json", NULL);
  g_assert_true (g_file_set_contents (cfg, text, -1, &error));

  g_autoptr (StowModel) model = stow_model_new_from_file (cfg, &error);
  g_assert_no_error (error);
  g_autoptr (StowCluster) cluster = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout l;
  StowMemOptions o;
  stow_test_defaults (&t, &l, &o);
  l.dp = 8, l.zero = 2;
  g_autoptr (StowMemory) mem
      = stow_memory_estimate (TEST_PLAN (model, cluster, &t, &l, &o), &error);
  g_assert_no_error (error);
  g_autoptr (StowPlanFile) p
      = stow_plan_file_new (model, cluster, &t, &l, &o, mem, NULL);
  g_assert_true (stow_plan_file_write (p, mem, path, &error));
  g_unlink (cfg);

  g_autoptr (StowPlanFile) q = stow_plan_file_read (path, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (q->model->name, ==, model->name);
  g_assert_cmpuint (q->model->params, ==, model->params);
  g_autoptr (StowMemory) m2
      = stow_memory_estimate (TEST_PLAN (q->model, q->cluster, &q->training,
                                         &q->layout, &q->mem_options),
                              &error);
  g_assert_no_error (error);
  g_assert_cmpuint (m2->total_bytes, ==, mem->total_bytes);
  g_assert_cmpuint (m2->host_total_bytes, ==, mem->host_total_bytes);
  g_unlink (path);
  g_rmdir (dir);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/plan-file/round-trip/%s-%s",
                                               cases[i].model, cases[i].gpus);
      g_test_add_data_func (path, &cases[i], test_round_trip);
      g_autofree char *mpath = g_strdup_printf (
          "/plan-file/memory-figures/%s-%s", cases[i].model, cases[i].gpus);
      g_test_add_data_func (mpath, &cases[i], test_memory_figures);
    }
  g_test_add_func ("/plan-file/schedule", test_schedule);
  g_test_add_func ("/plan-file/embedded-config", test_embedded_config);
  g_test_add_func ("/plan-file/errors", test_errors);
  g_test_add_func ("/plan-file/fuzz", test_fuzz);
  return g_test_run ();
}
