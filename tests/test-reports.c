/* SPDX-License-Identifier: MIT
 *
 * tests/test-reports.c: properties of the emitted configs over every layout
 * the search produces for a few models and clusters: DeepSpeed's batch
 * arithmetic, ZeRO stage and offload devices, and Megatron-LM's parallel
 * sizes, batch and sharding flags agree with the plan, or the emitter
 * refuses with an error naming what the engine lacks.  Also the CSV and
 * Markdown renderings against the memory they render.
 */
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "planner/search.h"
#include "reports/emit.h"
#include "reports/report.h"
#include "tests/testutil-planner.h"

typedef struct
{
  const char *model, *gpus;
} Setup;

static const Setup setups[] = {
  { "llama-7b", "1xA100-80GB" },  { "llama-7b", "8xA100-80GB" },
  { "llama-13b", "16xH100-SXM" }, { "mixtral-8x7b", "8xH100-SXM" },
  { "llama-65b", "64xH100-SXM" }, { "llama-3-8b", "8xA100-40GB" },
};

static const StowEngine engines[]
    = { STOW_ENGINE_STOWAGE, STOW_ENGINE_DEEPSPEED, STOW_ENGINE_MEGATRON,
        STOW_ENGINE_FSDP };

typedef void (*CheckFn) (const StowPlanFile *plan, guint *ok, guint *refused);

static gint64
obj_int (JsonObject *o, const char *k)
{
  g_assert_true (json_object_has_member (o, k));
  return json_object_get_int_member (o, k);
}

static void
check_deepspeed (const StowPlanFile *p, guint *ok, guint *refused)
{
  const StowLayout *l = &p->layout;
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) node = stow_emit_deepspeed (p, &error);
  gboolean expressible = l->tp == 1 && l->cp == 1 && l->ep == 1 && l->vpp == 1
                         && !(l->pp > 1 && l->zero > 1)
                         && !(l->pp > 1 && l->schedule != STOW_SCHEDULE_1F1B)
                         && !l->hybrid_shard
                         && l->recompute != STOW_RECOMPUTE_SELECTIVE
                         && p->training.precision != STOW_PRECISION_FP8;
  if (!expressible)
    {
      g_assert_null (node);
      g_assert_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED);
      g_assert_true (g_str_has_prefix (error->message, "--emit deepspeed: "));
      (*refused)++;
      return;
    }
  g_assert_no_error (error);
  (*ok)++;
  JsonObject *o = json_node_get_object (node);
  guint64 gb = l->micro_batch * l->grad_accum * l->dp;
  g_assert_cmpint (obj_int (o, "train_batch_size"), ==, (gint64)gb);
  if (p->training.global_batch)
    g_assert_cmpint (obj_int (o, "train_batch_size"), ==,
                     (gint64)p->training.global_batch);
  g_assert_cmpint (obj_int (o, "train_micro_batch_size_per_gpu"), ==,
                   (gint64)l->micro_batch);
  g_assert_cmpint (obj_int (o, "gradient_accumulation_steps"), ==,
                   (gint64)l->grad_accum);
  g_assert_cmpint (json_object_get_boolean_member (
                       json_object_get_object_member (o, "bf16"), "enabled"),
                   ==, p->training.precision == STOW_PRECISION_BF16);
  g_assert_cmpint (json_object_get_boolean_member (
                       json_object_get_object_member (o, "fp16"), "enabled"),
                   ==, p->training.precision == STOW_PRECISION_FP16);
  JsonObject *z = json_object_get_object_member (o, "zero_optimization");
  g_assert_cmpint (obj_int (z, "stage"), ==, l->zero);
  struct
  {
    const char *key;
    StowOffload where;
  } off[] = { { "offload_optimizer", l->offload_optimizer },
              { "offload_param", l->offload_params } };
  for (gsize i = 0; i < G_N_ELEMENTS (off); i++)
    {
      if (off[i].where == STOW_OFFLOAD_NONE)
        {
          g_assert_false (json_object_has_member (z, off[i].key));
          continue;
        }
      JsonObject *d = json_object_get_object_member (z, off[i].key);
      g_assert_cmpstr (json_object_get_string_member (d, "device"), ==,
                       stow_offload_name (off[i].where));
      if (off[i].where == STOW_OFFLOAD_NVME)
        {
          g_assert_cmpstr (json_object_get_string_member (d, "nvme_path"), ==,
                           p->streaming.nvme_paths[0]);
          g_assert_cmpint (obj_int (d, "buffer_count"), >=,
                           i == 0 ? 4
                                  : (gint64)p->streaming.param_swap_buffers);
        }
    }
  gboolean nvme = l->offload_optimizer == STOW_OFFLOAD_NVME
                  || l->offload_params == STOW_OFFLOAD_NVME;
  g_assert_cmpint (json_object_has_member (o, "aio"), ==, nvme);
  if (nvme)
    {
      JsonObject *aio = json_object_get_object_member (o, "aio");
      g_assert_cmpint (obj_int (aio, "block_size"), ==,
                       (gint64)p->streaming.io_block_bytes);
      g_assert_cmpint (obj_int (aio, "queue_depth"), ==,
                       (gint64)p->streaming.io_queue_depth);
    }
  g_assert_cmpint (json_object_has_member (o, "activation_checkpointing"), ==,
                   l->recompute == STOW_RECOMPUTE_FULL);
  if (l->recompute == STOW_RECOMPUTE_FULL)
    g_assert_cmpint (
        json_object_get_boolean_member (
            json_object_get_object_member (o, "activation_checkpointing"),
            "cpu_checkpointing"),
        ==, l->offload_activations);
}

/* "--flag value" lines into a table; flags without a value map to "". */
static GHashTable *
parse_args (const char *text)
{
  GHashTable *h
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l; l++)
    {
      if (**l == '\0' || **l == '#')
        continue;
      g_assert_true (g_str_has_prefix (*l, "--"));
      const char *sp = strchr (*l, ' ');
      char *k = sp ? g_strndup (*l, sp - *l) : g_strdup (*l);
      g_assert_false (g_hash_table_contains (h, k));
      g_hash_table_insert (h, k, g_strdup (sp ? sp + 1 : ""));
    }
  return h;
}

static guint64
arg_u64 (GHashTable *h, const char *k)
{
  const char *v = g_hash_table_lookup (h, k);
  g_assert_nonnull (v);
  guint64 n = 0;
  g_assert_true (g_ascii_string_to_unsigned (v, 10, 0, G_MAXUINT64, &n, NULL));
  return n;
}

static void
check_megatron (const StowPlanFile *p, guint *ok, guint *refused)
{
  const StowLayout *l = &p->layout;
  const StowModel *m = p->model;
  g_autoptr (GError) error = NULL;
  g_autofree char *args = stow_emit_megatron (p, &error);
  gboolean expressible
      = l->zero <= 1 && l->offload_params == STOW_OFFLOAD_NONE
        && l->offload_optimizer != STOW_OFFLOAD_NVME
        && !(l->offload_optimizer == STOW_OFFLOAD_CPU && l->zero != 1)
        && !l->offload_activations && !l->hybrid_shard
        && !(l->pp > 1 && l->schedule == STOW_SCHEDULE_GPIPE)
        && m->n_layers % l->pp == 0
        && p->training.finetune == STOW_FINETUNE_FULL
        && (p->training.optimizer == STOW_OPTIMIZER_ADAMW
            || p->training.optimizer == STOW_OPTIMIZER_SGD)
        && m->n_encoder_layers == 0;
  if (!expressible)
    {
      g_assert_null (args);
      g_assert_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED);
      g_assert_true (g_str_has_prefix (error->message, "--emit megatron: "));
      (*refused)++;
      return;
    }
  g_assert_no_error (error);
  (*ok)++;
  g_autoptr (GHashTable) h = parse_args (args);
  guint64 tp = arg_u64 (h, "--tensor-model-parallel-size");
  guint64 pp = arg_u64 (h, "--pipeline-model-parallel-size");
  guint64 cp = arg_u64 (h, "--context-parallel-size");
  g_assert_cmpuint (tp, ==, l->tp);
  g_assert_cmpuint (pp, ==, l->pp);
  g_assert_cmpuint (cp, ==, l->cp);
  /* Megatron derives dp from the world size. */
  g_assert_cmpuint (p->cluster->n_gpus / (tp * pp * cp), ==, l->dp);
  g_assert_cmpuint (arg_u64 (h, "--micro-batch-size"), ==, l->micro_batch);
  /* num_micro_batches = GBS / (MBS x DP) is the plan's accumulation. */
  guint64 gbs = arg_u64 (h, "--global-batch-size");
  g_assert_cmpuint (gbs / (l->micro_batch * l->dp), ==, l->grad_accum);
  g_assert_cmpuint (gbs % (l->micro_batch * l->dp), ==, 0);
  g_assert_cmpuint (arg_u64 (h, "--seq-length"), ==, p->training.seq_len);
  g_assert_cmpint (g_hash_table_contains (h, "--use-distributed-optimizer"), ==,
                   l->zero == 1);
  g_assert_cmpint (g_hash_table_contains (h, "--sequence-parallel"), ==,
                   l->sp && l->tp > 1);
  g_assert_cmpint (g_hash_table_contains (h, "--optimizer-cpu-offload"), ==,
                   l->offload_optimizer == STOW_OFFLOAD_CPU);
  if (l->vpp > 1)
    g_assert_cmpuint (arg_u64 (h, "--num-layers-per-virtual-pipeline-stage")
                          * pp * l->vpp,
                      ==, m->n_layers);
  else
    g_assert_false (
        g_hash_table_contains (h, "--num-layers-per-virtual-pipeline-stage"));
  const char *gran = g_hash_table_lookup (h, "--recompute-granularity");
  g_assert_cmpstr (gran, ==,
                   l->recompute == STOW_RECOMPUTE_NONE
                       ? NULL
                       : stow_recompute_name (l->recompute));
  g_assert_cmpuint (arg_u64 (h, "--num-layers"), ==, m->n_layers);
  g_assert_cmpuint (arg_u64 (h, "--hidden-size"), ==, m->hidden);
  g_assert_cmpuint (arg_u64 (h, "--num-attention-heads"), ==, m->n_heads);
  if (m->n_kv_heads != m->n_heads)
    g_assert_cmpuint (arg_u64 (h, "--num-query-groups"), ==, m->n_kv_heads);
  g_assert_cmpint (g_hash_table_contains (h, "--swiglu"), ==, m->gated_mlp);
  if (m->n_experts)
    {
      g_assert_cmpuint (arg_u64 (h, "--num-experts"), ==, m->n_experts);
      g_assert_cmpuint (arg_u64 (h, "--expert-model-parallel-size"), ==, l->ep);
    }
}

static void
check_fsdp (const StowPlanFile *p, guint *ok, guint *refused)
{
  const StowLayout *l = &p->layout;
  g_autoptr (GError) error = NULL;
  g_autofree char *py = stow_emit_fsdp (p, &error);
  if (py == NULL)
    {
      g_assert_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED);
      g_assert_true (l->tp * l->pp * l->cp * l->ep > 1 || l->zero == 1
                     || l->offload_optimizer != l->offload_params
                     || l->offload_params == STOW_OFFLOAD_NVME
                     || l->recompute == STOW_RECOMPUTE_SELECTIVE
                     || l->offload_activations || l->hybrid_shard
                     || p->training.precision == STOW_PRECISION_FP8);
      (*refused)++;
      return;
    }
  (*ok)++;
  g_assert_nonnull (strstr (py, l->zero == 3 ? "reshard_after_forward=True"
                                             : "reshard_after_forward=False"));
  g_assert_nonnull (
      strstr (py, l->offload_params == STOW_OFFLOAD_CPU
                      ? "offload_policy=CPUOffloadPolicy(pin_memory=True)"
                      : "offload_policy=OffloadPolicy()"));
  g_autofree char *ga = g_strdup_printf (
      "GRADIENT_ACCUMULATION_STEPS = %" G_GUINT64_FORMAT "\n", l->grad_accum);
  g_assert_nonnull (strstr (py, ga));
}

static void
check_accelerate (const StowPlanFile *p, guint *ok, guint *refused)
{
  const StowLayout *l = &p->layout;
  g_autoptr (GError) error = NULL;
  g_autofree char *y = stow_emit_accelerate (p, &error);
  if (y == NULL)
    {
      g_assert_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED);
      g_assert_true (g_str_has_prefix (error->message, "--emit accelerate"));
      (*refused)++;
      return;
    }
  (*ok)++;
  g_autofree char *np
      = g_strdup_printf ("\nnum_processes: %u\n", p->cluster->n_gpus);
  g_assert_nonnull (strstr (y, np));
  if (strstr (y, "distributed_type: DEEPSPEED\n"))
    {
      g_autofree char *z = g_strdup_printf ("  zero_stage: %u\n", l->zero);
      g_autofree char *ga = g_strdup_printf (
          "  gradient_accumulation_steps: %" G_GUINT64_FORMAT "\n",
          l->grad_accum);
      g_autofree char *oo
          = g_strdup_printf ("  offload_optimizer_device: %s\n",
                             stow_offload_name (l->offload_optimizer));
      g_assert_nonnull (strstr (y, z));
      g_assert_nonnull (strstr (y, ga));
      g_assert_nonnull (strstr (y, oo));
      g_assert_cmpuint (l->pp, ==, 1);
    }
  else if (strstr (y, "distributed_type: FSDP\n"))
    g_assert_nonnull (strstr (y, l->zero == 3
                                     ? "fsdp_reshard_after_forward: true"
                                     : "fsdp_reshard_after_forward: false"));
  else if (strstr (y, "distributed_type: MEGATRON_LM\n"))
    {
      g_autofree char *tp
          = g_strdup_printf ("  megatron_lm_tp_degree: %u\n", l->tp);
      g_autofree char *pp
          = g_strdup_printf ("  megatron_lm_pp_degree: %u\n", l->pp);
      g_assert_nonnull (strstr (y, tp));
      g_assert_nonnull (strstr (y, pp));
    }
  else
    /* DDP or one process: nothing sharded, offloaded or split. */
    g_assert_true (l->zero == 0 && l->offload_optimizer == STOW_OFFLOAD_NONE
                   && l->tp * l->pp * l->cp * l->ep == 1);
}

/* stow_emit_check, which a search asks of every layout, says yes exactly
 * when the emitter writes a config, and no with the emitter's error. */
static void
check_agrees (StowEmitKind kind, const StowModel *model,
              const StowCluster *cluster, const StowTraining *t,
              const StowPlanFile *plan, const StowMemory *mem)
{
  g_autoptr (GError) check_error = NULL;
  g_autoptr (GError) emit_error = NULL;
  gboolean can
      = stow_emit_check (kind, model, cluster, t, &plan->layout, &check_error);
  g_autofree char *out = stow_emit (kind, plan, mem, &emit_error);
  g_assert_cmpint (can, ==, out != NULL);
  g_assert_cmpint (
      can, ==, stow_emit_check (kind, model, cluster, t, &plan->layout, NULL));
  if (!can)
    g_assert_cmpstr (check_error->message, ==, emit_error->message);
}

static void
over_search (CheckFn check, StowEmitKind kind, const char *what)
{
  guint ok = 0, refused = 0;
  for (gsize s = 0; s < G_N_ELEMENTS (setups); s++)
    for (gsize e = 0; e < G_N_ELEMENTS (engines); e++)
      {
        g_autoptr (GError) error = NULL;
        g_autoptr (StowModel) model
            = stow_model_lookup (setups[s].model, &error);
        g_assert_no_error (error);
        g_autoptr (StowCluster) cluster
            = stow_cluster_new_from_spec (setups[s].gpus, &error);
        g_assert_no_error (error);
        StowTraining t;
        StowLayout base;
        StowMemOptions o;
        stow_training_init (&t);
        stow_layout_init (&base);
        stow_mem_options_init (&o);
        base.engine = engines[e];
        g_autoptr (StowSearch) search
            = test_search (TEST_PLAN (model, cluster, &t, &base, &o), 0, 64);
        for (guint i = 0; i < search->fits->len; i++)
          {
            StowCandidate *c = &g_array_index (search->fits, StowCandidate, i);
            g_autoptr (StowMemory) mem = stow_memory_estimate (
                TEST_PLAN (model, cluster, &t, &c->layout, &o), &error);
            g_assert_no_error (error);
            g_autoptr (StowPlanFile) plan = stow_plan_file_new (
                model, cluster, &t, &c->layout, &o, mem, NULL);
            check (plan, &ok, &refused);
            check_agrees (kind, model, cluster, &t, plan, mem);
          }
      }
  g_test_message ("%s: %u layouts emitted, %u refused", what, ok, refused);
  /* Both branches are exercised, or the property says little. */
  g_assert_cmpuint (ok, >, 20);
  g_assert_cmpuint (refused, >, 0);
}

static void
test_deepspeed_property (void)
{
  over_search (check_deepspeed, STOW_EMIT_DEEPSPEED, "deepspeed");
}

static void
test_megatron_property (void)
{
  over_search (check_megatron, STOW_EMIT_MEGATRON, "megatron");
}

static void
test_accelerate_property (void)
{
  over_search (check_accelerate, STOW_EMIT_ACCELERATE, "accelerate");
}

static void
test_fsdp_property (void)
{
  over_search (check_fsdp, STOW_EMIT_FSDP, "fsdp");
}

static StowPlanFile *
plan_for (const char *model_name, const char *gpus, StowLayout *l,
          StowMemory **mem_out)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) model = stow_model_lookup (model_name, &error);
  g_assert_no_error (error);
  g_autoptr (StowCluster) cluster = stow_cluster_new_from_spec (gpus, &error);
  g_assert_no_error (error);
  StowTraining t;
  StowMemOptions o;
  stow_training_init (&t);
  stow_mem_options_init (&o);
  StowMemory *mem
      = stow_memory_estimate (TEST_PLAN (model, cluster, &t, l, &o), &error);
  g_assert_no_error (error);
  StowPlanFile *p
      = stow_plan_file_new (model, cluster, &t, l, &o, mem, "/mnt/nvme0");
  *mem_out = mem;
  return p;
}

static void
expect_refusal (StowEmitKind kind, const StowPlanFile *p, const char *needle)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *s = stow_emit (kind, p, NULL, &error);
  g_assert_null (s);
  g_assert_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED);
  if (strstr (error->message, needle) == NULL)
    g_error ("\"%s\" lacks \"%s\"", error->message, needle);
}

static void
test_refusals (void)
{
  StowMemory *mem = NULL;
  StowLayout l;

  /* NVMe offload for Megatron; ZeRO-3 for Megatron; CP for DeepSpeed. */
  stow_layout_init (&l);
  l.dp = 8, l.zero = 3, l.offload_params = STOW_OFFLOAD_NVME,
  l.offload_optimizer = STOW_OFFLOAD_NVME, l.grad_accum = 1;
  g_autoptr (StowPlanFile) a = plan_for ("llama-7b", "8xA100-80GB", &l, &mem);
  expect_refusal (STOW_EMIT_MEGATRON, a, "ZeRO 3");
  expect_refusal (STOW_EMIT_FSDP, a, "NVMe");
  stow_memory_free (mem);

  stow_layout_init (&l);
  l.dp = 8, l.zero = 1, l.offload_optimizer = STOW_OFFLOAD_NVME;
  g_autoptr (StowPlanFile) b = plan_for ("llama-7b", "8xA100-80GB", &l, &mem);
  expect_refusal (STOW_EMIT_MEGATRON, b, "NVMe");
  g_autoptr (JsonNode) ds = stow_emit_deepspeed (b, NULL);
  g_assert_nonnull (ds);
  stow_memory_free (mem);

  stow_layout_init (&l);
  l.dp = 4, l.cp = 2, l.zero = 1;
  g_autoptr (StowPlanFile) c = plan_for ("llama-7b", "8xA100-80GB", &l, &mem);
  expect_refusal (STOW_EMIT_DEEPSPEED, c, "context parallelism");
  expect_refusal (STOW_EMIT_ACCELERATE, c, "context parallelism");
  g_autofree char *meg = stow_emit_megatron (c, NULL);
  g_assert_nonnull (strstr (meg, "--context-parallel-size 2\n"));
  stow_memory_free (mem);

  stow_layout_init (&l);
  l.dp = 8, l.zero = 1;
  g_autoptr (StowPlanFile) d = plan_for ("llama-7b", "8xA100-80GB", &l, &mem);
  expect_refusal (STOW_EMIT_FSDP, d, "ZeRO-1");
  stow_memory_free (mem);
}

static void
test_csv_md (void)
{
  StowMemory *mem = NULL;
  StowLayout l;
  stow_layout_init (&l);
  l.dp = 1, l.tp = 2, l.pp = 4, l.zero = 1, l.sp = TRUE, l.grad_accum = 4;
  g_autoptr (StowPlanFile) p = plan_for ("llama-13b", "8xA100-80GB", &l, &mem);
  StowReport r = { .mem = { p->model, p->cluster, &p->training, &p->layout,
                            &p->mem_options, mem },
                   .command = "mem" };
  g_autoptr (GString) csv = g_string_new (NULL);
  stow_report_csv (csv, &r);
  /* Every stage's terms are there with raw bytes summing to what the
   * memory model says for the stage's tensors plus the rest. */
  g_auto (GStrv) rows = g_strsplit (csv->str, "\r\n", -1);
  g_assert_cmpstr (rows[0], ==, "scope,stage,name,tier,bytes,formula");
  guint64 sums[8] = { 0 };
  for (char **row = rows + 1; *row && **row; row++)
    {
      g_auto (GStrv) f = g_strsplit (*row, ",", 6);
      g_assert_cmpuint (g_strv_length (f), ==, 6);
      if (strcmp (f[0], "device") == 0 && *f[1] && strcmp (f[2], "total") != 0
          && strcmp (f[2], "allocated") != 0 && strcmp (f[2], "reserved") != 0)
        sums[atoi (f[1])] += g_ascii_strtoull (f[4], NULL, 10);
    }
  for (guint s = 0; s < mem->n_stages; s++)
    {
      guint64 expect = 0;
      GArray *terms = mem->stages[s].terms;
      for (guint i = 0; i < terms->len; i++)
        expect += g_array_index (terms, StowMemTerm, i).bytes;
      g_assert_cmpuint (sums[s], ==, expect);
    }
  g_autoptr (GString) md = g_string_new (NULL);
  stow_report_md (md, &r);
  g_assert_nonnull (strstr (md->str, "### Stage 3\n"));
  g_assert_nonnull (strstr (md->str, "Sizes in GiB (2^30 bytes)"));
  g_autoptr (GString) html = g_string_new (NULL);
  stow_report_html (html, &r);
  g_assert_true (g_str_has_prefix (html->str, "<!DOCTYPE html>"));
  g_assert_null (strstr (html->str, "http://www.w3.org/1999/xlink\" href"));
  g_assert_null (strstr (html->str, "<script"));
  g_assert_null (strstr (html->str, "https://"));
  stow_memory_free (mem);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/reports/deepspeed-agrees", test_deepspeed_property);
  g_test_add_func ("/reports/megatron-agrees", test_megatron_property);
  g_test_add_func ("/reports/fsdp-agrees", test_fsdp_property);
  g_test_add_func ("/reports/accelerate-agrees", test_accelerate_property);
  g_test_add_func ("/reports/refusals", test_refusals);
  g_test_add_func ("/reports/csv-md-html", test_csv_md);
  return g_test_run ();
}
