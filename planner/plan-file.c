/* SPDX-License-Identifier: MIT
 *
 * planner/plan-file.c: writing and reading stowage plan files.  The cluster
 * is written in the cluster.json vocabulary (hw/cluster.c reads it back), a
 * config.json model is embedded, and every field read is range-checked with
 * the file and the field in the message.  docs/plan-file.md is the schema.
 */
#include "planner/plan-file.h"

#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/strutil.h"
#include "planner/memory-json.h"
#include "planner/memory-private.h"

/* DeepSpeed's defaults (offload_config.py, aio constants; see
 * docs/plan-file.md): 4 optimizer swap buffers (at least Adam's states),
 * 5 parameter buffers of 1e8 elements, 1 MiB blocks at queue depth 8. */
#define OPT_SWAP_BUFFERS   4
#define PARAM_SWAP_BUFFERS 5
#define PARAM_BUFFER_ELEMS ((guint64)100000000)
#define IO_QUEUE_DEPTH     8
#define IO_BLOCK_BYTES     ((guint64)1 << 20)

void
stow_plan_streaming_init (StowPlanStreaming *s, const StowModel *model,
                          const StowCluster *cluster, const StowLayout *l,
                          const StowMemory *mem, const char *nvme_path)
{
  memset (s, 0, sizeof *s);
  const StowStageMemory *peak = &mem->stages[mem->peak_stage];
  guint64 stage_layers = peak->layers;

  /* Without parameter streaming every layer stays.  With it, the layout
   * carries the count decided once (planner/resident.c) that the memory
   * model charged; engines other than stowage's keep none. */
  gboolean streamed = l->offload_params != STOW_OFFLOAD_NONE;
  if (!streamed)
    s->resident_layers = stage_layers;
  else if (l->engine != STOW_ENGINE_STOWAGE
           || l->resident_layers == STOW_RESIDENT_AUTO)
    s->resident_layers = 0;
  else
    s->resident_layers = MIN (stage_layers, (guint64)l->resident_layers);
  s->prefetch_depth = streamed || l->zero >= 3 ? 2 : 0;

  gboolean opt_nvme = l->offload_optimizer == STOW_OFFLOAD_NVME;
  gboolean par_nvme = l->offload_params == STOW_OFFLOAD_NVME;
  /* The memory model's swap buffers: DeepSpeed keeps buffer_count 4,
   * stowage's pipeline three (read i+1, update i, write i-1). */
  s->optimizer_swap_buffers
      = opt_nvme ? (l->engine == STOW_ENGINE_DEEPSPEED ? OPT_SWAP_BUFFERS : 3)
                 : 0;
  s->param_swap_buffers = par_nvme ? PARAM_SWAP_BUFFERS : 0;
  /* DeepSpeed needs a buffer to hold the largest parameter. */
  s->param_buffer_elems
      = par_nvme
            ? MAX (PARAM_BUFFER_ELEMS,
                   model ? model->largest_module_params / MAX (l->tp, 1u) : 0)
            : 0;
  GPtrArray *paths = g_ptr_array_new ();
  if (opt_nvme || par_nvme)
    {
      if (nvme_path != NULL)
        g_ptr_array_add (paths, g_strdup (nvme_path));
      else
        for (guint i = 0; i < cluster->node.n_nvme; i++)
          if (cluster->node.nvme[i].path)
            g_ptr_array_add (paths, g_strdup (cluster->node.nvme[i].path));
      if (paths->len == 0)
        g_ptr_array_add (paths, g_strdup (STOW_PLAN_NVME_PLACEHOLDER));
      s->io_queue_depth = IO_QUEUE_DEPTH;
      s->io_block_bytes = IO_BLOCK_BYTES;
    }
  g_ptr_array_add (paths, NULL);
  s->nvme_paths = (char **)g_ptr_array_free (paths, FALSE);
}

void
stow_plan_streaming_clear (StowPlanStreaming *s)
{
  g_clear_pointer (&s->nvme_paths, g_strfreev);
}

StowPlanFile *
stow_plan_file_new (StowModel *model, StowCluster *cluster,
                    const StowTraining *training, const StowLayout *layout,
                    const StowMemOptions *options, const StowMemory *mem,
                    const char *nvme_path)
{
  g_return_val_if_fail (cluster && training && layout && options && mem, NULL);
  StowPlanFile *p = g_new0 (StowPlanFile, 1);
  p->model = model ? stow_model_ref (model) : NULL;
  p->cluster = stow_cluster_ref (cluster);
  p->training = *training;
  p->layout = *layout;
  p->mem_options = *options;
  /* A plan carries its resident layers decided (a layout from the search
   * already has them). */
  if (model != NULL
      && !stow_mem_resolve_resident (model, cluster, training, &p->layout,
                                     options, NULL))
    p->layout.resident_layers = 0;
  stow_plan_streaming_init (&p->streaming, model, cluster, &p->layout, mem,
                            nvme_path);
  p->predicted_device_bytes = mem->total_bytes;
  p->predicted_host_bytes = mem->host_total_bytes;
  p->predicted_nvme_bytes = mem->nvme_bytes;
  return p;
}

void
stow_plan_file_free (StowPlanFile *p)
{
  if (p == NULL)
    return;
  g_clear_pointer (&p->model, stow_model_unref);
  g_clear_pointer (&p->cluster, stow_cluster_unref);
  stow_plan_streaming_clear (&p->streaming);
  g_free (p);
}

/* ---- writing ---- */

/* The GPU: a catalog name plus whatever differs from the catalog, or every
 * field of a GPU the catalog lacks. */
static void
gpu_json (JsonBuilder *b, const StowGpu *g)
{
  const StowGpu *cat = stow_gpu_lookup (g->name, NULL);
  json_builder_set_member_name (b, "gpu");
  json_builder_begin_object (b);
  if (cat != NULL)
    stow_json_set_string (b, "name", cat->name);
  if (cat == NULL || cat->total_bytes != g->total_bytes)
    stow_json_set_u64 (b, "total_memory", g->total_bytes);
  struct
  {
    const char *k;
    double v, c;
  } tf[] = {
    { "bf16_tflops", g->bf16_flops, cat ? cat->bf16_flops : -1 },
    { "fp16_tflops", g->fp16_flops, cat ? cat->fp16_flops : -1 },
    { "fp32_tflops", g->fp32_flops, cat ? cat->fp32_flops : -1 },
    { "tf32_tflops", g->tf32_flops, cat ? cat->tf32_flops : -1 },
    { "fp8_tflops", g->fp8_flops, cat ? cat->fp8_flops : -1 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (tf); i++)
    if (tf[i].v != tf[i].c && (tf[i].v > 0 || i == 0))
      stow_json_set_double (b, tf[i].k, tf[i].v / 1e12);
  if (g->hbm_bw > 0 && (cat == NULL || cat->hbm_bw != g->hbm_bw))
    stow_json_set_double (b, "hbm_bw", g->hbm_bw);
  if (cat == NULL || cat->nvlink_bw != g->nvlink_bw)
    stow_json_set_double (b, "nvlink_bw", g->nvlink_bw);
  if (cat == NULL || cat->nvlink_domain != g->nvlink_domain)
    stow_json_set_u64 (b, "nvlink_domain", g->nvlink_domain);
  if (g->pcie_gen && (cat == NULL || cat->pcie_gen != g->pcie_gen))
    stow_json_set_u64 (b, "pcie_gen", g->pcie_gen);
  if (g->pcie_bw > 0 && (cat == NULL || cat->pcie_bw != g->pcie_bw))
    stow_json_set_double (b, "pcie_bw", g->pcie_bw);
  json_builder_end_object (b);
}

/* The resolved cluster in the cluster.json vocabulary (docs/hardware.md),
 * every host field explicit so no preset can change it later. */
static JsonNode *
cluster_json (const StowCluster *c)
{
  const StowNode *n = &c->node;
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  if (n->name)
    stow_json_set_string (b, "name", n->name);
  if (n->description)
    stow_json_set_string (b, "description", n->description);
  gpu_json (b, &n->gpu);
  stow_json_set_u64 (b, "nodes", c->n_nodes);
  stow_json_set_u64 (b, "gpus_per_node", n->gpus_per_node);
  if (n->host_ram_bytes)
    stow_json_set_u64 (b, "host_ram", n->host_ram_bytes);
  if (n->host_mem_bw > 0)
    stow_json_set_double (b, "host_mem_bw", n->host_mem_bw);
  if (n->cpu_cores)
    stow_json_set_u64 (b, "cpu_cores", n->cpu_cores);
  if (n->sockets)
    stow_json_set_u64 (b, "sockets", n->sockets);
  if (n->numa_nodes)
    stow_json_set_u64 (b, "numa_nodes", n->numa_nodes);
  json_builder_set_member_name (b, "nvme");
  json_builder_begin_array (b);
  for (guint i = 0; i < n->n_nvme; i++)
    {
      const StowNvme *d = &n->nvme[i];
      json_builder_begin_object (b);
      if (d->path)
        stow_json_set_string (b, "path", d->path);
      stow_json_set_u64 (b, "capacity", d->capacity_bytes);
      stow_json_set_double (b, "read_bw", d->read_bw);
      stow_json_set_double (b, "write_bw", d->write_bw);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  json_builder_set_member_name (b, "network");
  json_builder_begin_object (b);
  stow_json_set_double (b, "per_gpu", n->net_bw_per_gpu);
  stow_json_set_double (b, "latency", n->net_latency_s);
  if (n->net_kind)
    stow_json_set_string (b, "kind", n->net_kind);
  json_builder_end_object (b);
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

void
stow_layout_json_members (JsonBuilder *b, const StowLayout *l)
{
  stow_json_set_u64 (b, "dp", l->dp);
  stow_json_set_u64 (b, "tp", l->tp);
  stow_json_set_u64 (b, "pp", l->pp);
  stow_json_set_u64 (b, "vpp", l->vpp);
  stow_json_set_u64 (b, "cp", l->cp);
  stow_json_set_u64 (b, "ep", l->ep);
  stow_json_set_u64 (b, "etp", stow_layout_etp (l));
  stow_json_set_bool (b, "sp", l->sp);
  stow_json_set_bool (b, "pp_split_ends", l->pp_split_ends);
  stow_json_set_u64 (b, "zero", l->zero);
  stow_json_set_bool (b, "hybrid_shard", l->hybrid_shard);
  stow_json_set_string (b, "offload_optimizer",
                        stow_offload_name (l->offload_optimizer));
  stow_json_set_string (b, "offload_params",
                        stow_offload_name (l->offload_params));
  stow_json_set_string (b, "offload_activations",
                        l->offload_activations ? "cpu" : "none");
  stow_json_set_string (b, "recompute", stow_recompute_name (l->recompute));
  stow_json_set_u64 (b, "recompute_layers", l->recompute_layers);
  stow_json_set_u64 (b, "micro_batch", l->micro_batch);
  stow_json_set_u64 (b, "grad_accum", l->grad_accum);
}

/* The optimizer settings (core/optim.h) as training.optim: what the run
 * trains with, which the engine configs write out.  Not the data order's
 * seed, which is the run's (`stowage train --seed`). */
static void
optim_json (JsonBuilder *b, const StowOptimSettings *o)
{
  json_builder_set_member_name (b, "optim");
  json_builder_begin_object (b);
  stow_json_set_double (b, "lr", o->lr);
  stow_json_set_double (b, "min_lr", o->min_lr);
  stow_json_set_u64 (b, "warmup_steps", o->warmup_steps);
  stow_json_set_string (b, "lr_schedule", stow_lr_schedule_name (o->schedule));
  stow_json_set_u64 (b, "steps", o->total_steps);
  stow_json_set_double (b, "weight_decay", o->weight_decay);
  stow_json_set_string (b, "weight_decay_on",
                        stow_decay_scope_name (o->decay_on));
  stow_json_set_double (b, "beta1", o->beta1);
  stow_json_set_double (b, "beta2", o->beta2);
  stow_json_set_double (b, "eps", o->eps);
  stow_json_set_double (b, "max_grad_norm", o->max_grad_norm);
  json_builder_end_object (b);
}

JsonNode *
stow_plan_file_to_json (const StowPlanFile *p, const StowMemory *mem)
{
  const StowLayout *l = &p->layout;
  const StowTraining *t = &p->training;
  const StowMemOptions *o = &p->mem_options;
  const StowPlanStreaming *s = &p->streaming;
  g_autoptr (JsonBuilder) b = json_builder_new ();

  json_builder_begin_object (b);
  stow_json_set_string (b, "format", STOW_PLAN_FILE_FORMAT);
  stow_json_set_u64 (b, "version", STOW_PLAN_FILE_VERSION);

  json_builder_set_member_name (b, "model");
  json_builder_begin_object (b);
  if (p->model)
    {
      stow_json_set_string (b, "name", p->model->name);
      stow_json_set_u64 (b, "params", p->model->params);
      gboolean catalog = g_strcmp0 (p->model->source, "catalog") == 0;
      stow_json_set_string (b, "source", catalog ? "catalog" : "config.json");
      if (!catalog && p->model->source)
        {
          stow_json_set_string (b, "path", p->model->source);
          /* Embedded so that the plan reloads on a machine without the
           * file; the path is informative then. */
          g_autoptr (JsonNode) cfg = stow_json_parse_file (
              p->model->source, STOW_JSON_MAX_BYTES, NULL);
          if (cfg && JSON_NODE_HOLDS_OBJECT (cfg))
            {
              json_builder_set_member_name (b, "config");
              json_builder_add_value (b, json_node_copy (cfg));
            }
        }
    }
  else
    stow_json_set_u64 (b, "params", o->params_override);
  json_builder_end_object (b);

  json_builder_set_member_name (b, "cluster");
  json_builder_begin_object (b);
  stow_json_set_string (b, "spec", p->cluster->spec);
  stow_json_set_u64 (b, "gpus", p->cluster->n_gpus);
  json_builder_set_member_name (b, "config");
  json_builder_add_value (b, cluster_json (p->cluster));
  json_builder_end_object (b);

  json_builder_set_member_name (b, "training");
  json_builder_begin_object (b);
  stow_json_set_u64 (b, "seq_len", t->seq_len);
  if (t->decoder_seq_len)
    stow_json_set_u64 (b, "decoder_seq_len", t->decoder_seq_len);
  stow_json_set_u64 (b, "global_batch", t->global_batch);
  stow_json_set_string (b, "precision", stow_precision_name (t->precision));
  stow_json_set_string (b, "optimizer", stow_optimizer_name (t->optimizer));
  stow_json_set_string (b, "finetune", stow_finetune_name (t->finetune));
  stow_json_set_u64 (b, "lora_rank", t->lora_rank);
  stow_json_set_u64 (b, "lora_targets", t->lora_targets);
  stow_json_set_bool (b, "flash_attention", t->flash_attention);
  stow_json_set_bool (b, "chunked_loss", t->chunked_loss);
  stow_json_set_bool (b, "fused_loss", t->fused_loss);
  stow_json_set_bool (b, "dropout", t->dropout);
  stow_json_set_bool (b, "lora_dropout", t->lora_dropout);
  stow_json_set_bool (b, "optimizer_in_backward", t->optimizer_in_backward);
  stow_json_set_bool (b, "compile", t->compiled);
  optim_json (b, &t->optim);
  json_builder_end_object (b);

  json_builder_set_member_name (b, "layout");
  json_builder_begin_object (b);
  stow_layout_json_members (b, l);
  stow_json_set_string (b, "schedule", stow_schedule_name (l->schedule));
  stow_json_set_string (b, "engine", stow_engine_name (l->engine));
  json_builder_end_object (b);

  json_builder_set_member_name (b, "memory_options");
  json_builder_begin_object (b);
  stow_json_set_string (b, "convention", stow_convention_name (o->convention));
  stow_json_set_u64 (b, "zero_init", (guint64)MAX (o->zero_init, 0));
  stow_json_set_u64 (b, "params_override", o->params_override);
  stow_json_set_u64 (b, "largest_layer_override", o->largest_layer_override);
  stow_json_set_u64 (b, "cuda_context_bytes", o->cuda_context_bytes);
  stow_json_set_u64 (b, "workspace_bytes", o->workspace_bytes);
  stow_json_set_u64 (b, "nccl_bytes_per_group", o->nccl_bytes_per_group);
  stow_json_set_double (b, "fragmentation", o->fragmentation);
  stow_json_set_u64 (b, "safety_margin_bytes", o->safety_margin_bytes);
  stow_json_set_u64 (b, "host_process_bytes", o->host_process_bytes);
  stow_json_set_u64 (b, "cpu_optimizer_buffer_bytes",
                     o->cpu_optimizer_buffer_bytes);
  stow_json_set_u64 (b, "vocab_multiple", o->vocab_multiple);
  stow_json_set_u64 (b, "swap_shard_params", o->swap_shard_params);
  stow_json_set_u64 (b, "reduce_bucket_elements", o->reduce_bucket_elements);
  stow_json_set_u64 (b, "prefetch_bucket_elements",
                     o->prefetch_bucket_elements);
  stow_json_set_u64 (b, "reuse_distance_elements", o->reuse_distance_elements);
  stow_json_set_i64 (b, "overlap_comm", o->overlap_comm);
  stow_json_set_i64 (b, "free_grads", o->free_grads);
  json_builder_end_object (b);

  json_builder_set_member_name (b, "memory");
  json_builder_begin_object (b);
  stow_memory_json_members (b, mem, STOW_MEMORY_JSON_PLAN);
  json_builder_end_object (b);

  json_builder_set_member_name (b, "schedule");
  json_builder_begin_object (b);
  stow_json_set_u64 (b, "resident_layers", s->resident_layers);
  stow_json_set_u64 (b, "prefetch_depth", s->prefetch_depth);
  stow_json_set_u64 (b, "optimizer_swap_buffers", s->optimizer_swap_buffers);
  stow_json_set_u64 (b, "param_swap_buffers", s->param_swap_buffers);
  stow_json_set_u64 (b, "param_buffer_elems", s->param_buffer_elems);
  json_builder_set_member_name (b, "nvme_paths");
  json_builder_begin_array (b);
  for (char **q = s->nvme_paths; q && *q; q++)
    json_builder_add_string_value (b, *q);
  json_builder_end_array (b);
  stow_json_set_u64 (b, "io_queue_depth", s->io_queue_depth);
  stow_json_set_u64 (b, "io_block_bytes", s->io_block_bytes);
  json_builder_end_object (b);

  json_builder_end_object (b);
  return json_builder_get_root (b);
}

gboolean
stow_plan_file_write (const StowPlanFile *plan, const StowMemory *mem,
                      const char *path, GError **error)
{
  g_autoptr (JsonNode) node = stow_plan_file_to_json (plan, mem);
  g_autofree char *s = stow_json_to_string (node, TRUE);
  return stow_file_write_atomic (path, s, -1, error);
}

/* ---- reading ---- */

static gboolean
check_members (JsonObject *obj, const char *where, const char *const *allowed,
               GError **error)
{
  g_autoptr (GList) names = json_object_get_members (obj);
  for (GList *l = names; l; l = l->next)
    {
      const char *name = l->data;
      if (g_strv_contains (allowed, name))
        continue;
      const char *hint
          = stow_suggest (name, allowed, g_strv_length ((char **)allowed));
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: unknown field \"%s\"%s%s%s", where, name,
                   hint ? " (did you mean \"" : "", hint ? hint : "",
                   hint ? "\"?)" : "");
      return FALSE;
    }
  return TRUE;
}

/* An integer in [lo, hi]; absent leaves *out. */
static gboolean
get_range (JsonObject *o, const char *where, const char *member,
           gboolean required, guint64 lo, guint64 hi, guint64 *out,
           GError **error)
{
  guint64 v = *out;
  if (!stow_json_get_u64 (o, where, member, required, &v, error))
    return FALSE;
  if (stow_json_has (o, member) && (v < lo || v > hi))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: %s: %" G_GUINT64_FORMAT
                   " is out of range (%" G_GUINT64_FORMAT
                   " to %" G_GUINT64_FORMAT ")",
                   where, member, v, lo, hi);
      return FALSE;
    }
  *out = v;
  return TRUE;
}

static gboolean
get_uint (JsonObject *o, const char *where, const char *member, guint lo,
          guint hi, guint *out, GError **error)
{
  guint64 v = *out;
  if (!get_range (o, where, member, TRUE, lo, hi, &v, error))
    return FALSE;
  *out = (guint)v;
  return TRUE;
}

/* A name parsed by one of layout.h's parsers; @parse's own message already
 * names the field we pass as "where: member".  The parsers are wrapped to
 * one signature (calling them through a cast pointer would be undefined). */
typedef gboolean (*NameParser) (const char *s, const char *field, void *out,
                                GError **error);

#define WRAP(fn, T)                                                            \
  static gboolean fn##_any (const char *s, const char *field, void *out,       \
                            GError **error)                                    \
  {                                                                            \
    return fn (s, field, (T *)out, error);                                     \
  }
WRAP (stow_precision_parse, StowPrecision)
WRAP (stow_optimizer_parse, StowOptimizer)
WRAP (stow_finetune_parse, StowFinetune)
WRAP (stow_offload_parse, StowOffload)
WRAP (stow_schedule_parse, StowSchedule)
WRAP (stow_engine_parse, StowEngine)
WRAP (stow_convention_parse, StowConvention)

static gboolean
get_name (JsonObject *o, const char *where, const char *member,
          NameParser parse, void *out, GError **error)
{
  const char *s = NULL;
  if (!stow_json_get_string (o, where, member, TRUE, &s, error))
    return FALSE;
  g_autofree char *field = g_strdup_printf ("%s: %s", where, member);
  return parse (s, field, out, error);
}

#define NAME(o, w, m, fn, out, err) get_name (o, w, m, fn##_any, out, err)

static const char *const top_fields[]
    = { "format",   "version", "model",          "cluster",
        "training", "layout",  "memory_options", "memory",
        "schedule", "time",    "comment",        NULL };
static const char *const model_fields[]
    = { "name", "params", "source", "path", "config", NULL };
static const char *const cluster_fields[] = { "spec", "gpus", "config", NULL };
static const char *const training_fields[] = { "seq_len",
                                               "decoder_seq_len",
                                               "global_batch",
                                               "precision",
                                               "optimizer",
                                               "finetune",
                                               "lora_rank",
                                               "lora_targets",
                                               "flash_attention",
                                               "chunked_loss",
                                               "dropout",
                                               "optimizer_in_backward",
                                               "compile",
                                               "lora_dropout",
                                               "fused_loss",
                                               "optim",
                                               NULL };
static const char *const optim_fields[]
    = { "lr",    "min_lr",       "warmup_steps",    "lr_schedule",
        "steps", "weight_decay", "weight_decay_on", "beta1",
        "beta2", "eps",          "max_grad_norm",   NULL };
static const char *const layout_fields[] = { "dp",
                                             "tp",
                                             "pp",
                                             "vpp",
                                             "cp",
                                             "ep",
                                             "etp",
                                             "sp",
                                             "pp_split_ends",
                                             "zero",
                                             "hybrid_shard",
                                             "offload_optimizer",
                                             "offload_params",
                                             "offload_activations",
                                             "recompute",
                                             "recompute_layers",
                                             "micro_batch",
                                             "grad_accum",
                                             "schedule",
                                             "engine",
                                             NULL };
static const char *const memopt_fields[] = { "convention",
                                             "zero_init",
                                             "params_override",
                                             "largest_layer_override",
                                             "cuda_context_bytes",
                                             "workspace_bytes",
                                             "nccl_bytes_per_group",
                                             "fragmentation",
                                             "safety_margin_bytes",
                                             "host_process_bytes",
                                             "vocab_multiple",
                                             "swap_shard_params",
                                             "reduce_bucket_elements",
                                             "prefetch_bucket_elements",
                                             "reuse_distance_elements",
                                             "cpu_optimizer_buffer_bytes",
                                             "overlap_comm",
                                             "free_grads",
                                             NULL };
static const char *const schedule_fields[]
    = { "resident_layers",    "prefetch_depth",     "optimizer_swap_buffers",
        "param_swap_buffers", "param_buffer_elems", "nvme_paths",
        "io_queue_depth",     "io_block_bytes",     NULL };

#define MAX_DEGREE (1u << 20)
#define MAX_BYTES  ((guint64)1 << 60)

static gboolean
read_model (StowPlanFile *p, JsonObject *root, const char *name,
            guint64 *params_out, GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: model", name);
  JsonObject *o = NULL;
  const char *mname = NULL, *source = NULL, *path = NULL;
  JsonObject *config = NULL;
  guint64 params = 0;
  if (!stow_json_get_object (root, name, "model", TRUE, &o, error)
      || !check_members (o, w, model_fields, error)
      || !stow_json_get_string (o, w, "name", FALSE, &mname, error)
      || !get_range (o, w, "params", TRUE, 1, G_MAXINT64, &params, error)
      || !stow_json_get_string (o, w, "source", FALSE, &source, error)
      || !stow_json_get_string (o, w, "path", FALSE, &path, error)
      || !stow_json_get_object (o, w, "config", FALSE, &config, error))
    return FALSE;
  *params_out = params;
  if (mname == NULL && config == NULL && path == NULL)
    return TRUE; /* --params under a peer convention */

  g_autoptr (GError) local = NULL;
  g_autoptr (StowModel) m = NULL;
  if (config != NULL)
    {
      g_autofree char *cw = g_strdup_printf ("%s.config", w);
      m = stow_model_new_from_json (config, cw, &local);
    }
  else
    m = stow_model_lookup (path ? path : mname, &local);
  if (m == NULL)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID, "%s: %s", w,
                   local->message);
      return FALSE;
    }
  if (m->params != params)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: params: the plan says %" G_GUINT64_FORMAT
                   " but the model loads with %" G_GUINT64_FORMAT,
                   w, params, m->params);
      return FALSE;
    }
  if (mname && g_strcmp0 (m->name, mname) != 0)
    {
      g_free (m->name);
      m->name = g_strdup (mname);
    }
  p->model = g_steal_pointer (&m);
  return TRUE;
}

static gboolean
read_cluster (StowPlanFile *p, JsonObject *root, const char *name,
              GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: cluster", name);
  g_autofree char *cw = g_strdup_printf ("%s: cluster.config", name);
  JsonObject *o = NULL, *config = NULL;
  const char *spec = NULL;
  guint64 gpus = 0;
  if (!stow_json_get_object (root, name, "cluster", TRUE, &o, error)
      || !check_members (o, w, cluster_fields, error)
      || !stow_json_get_string (o, w, "spec", FALSE, &spec, error)
      || !get_range (o, w, "gpus", FALSE, 1, G_MAXUINT, &gpus, error)
      || !stow_json_get_object (o, w, "config", TRUE, &config, error))
    return FALSE;
  p->cluster = stow_cluster_new_from_json (config, cw, error);
  if (p->cluster == NULL)
    return FALSE;
  if (gpus && gpus != p->cluster->n_gpus)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: gpus: %" G_GUINT64_FORMAT
                   " does not match the cluster's %u",
                   w, gpus, p->cluster->n_gpus);
      return FALSE;
    }
  if (spec)
    {
      g_free (p->cluster->spec);
      p->cluster->spec = g_strdup (spec);
    }
  return TRUE;
}

/* A finite number of at least 0; absent leaves *out. */
static gboolean
get_nonneg (JsonObject *o, const char *where, const char *member, double *out,
            GError **error)
{
  double v = *out;
  if (!stow_json_get_double (o, where, member, FALSE, &v, error))
    return FALSE;
  if (v < 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: %s: %g is below 0", where, member, v);
      return FALSE;
    }
  *out = v;
  return TRUE;
}

/* training.optim (added within version 1): absent, or any member absent,
 * is the default (stow_optim_settings_init). */
static gboolean
read_optim (JsonObject *training, const char *tw, StowOptimSettings *o,
            GError **error)
{
  stow_optim_settings_init (o);
  if (!stow_json_has (training, "optim"))
    return TRUE;
  g_autofree char *w = g_strdup_printf ("%s.optim", tw);
  JsonObject *j = NULL;
  const char *schedule = NULL, *decay_on = NULL;
  GError *local = NULL;
  if (!stow_json_get_object (training, tw, "optim", TRUE, &j, error)
      || !check_members (j, w, optim_fields, error)
      || !get_nonneg (j, w, "lr", &o->lr, error)
      || !get_nonneg (j, w, "min_lr", &o->min_lr, error)
      || !get_range (j, w, "warmup_steps", FALSE, 0, G_MAXINT64,
                     &o->warmup_steps, error)
      || !get_range (j, w, "steps", FALSE, 0, G_MAXINT64, &o->total_steps,
                     error)
      || !get_nonneg (j, w, "weight_decay", &o->weight_decay, error)
      || !get_nonneg (j, w, "beta1", &o->beta1, error)
      || !get_nonneg (j, w, "beta2", &o->beta2, error)
      || !get_nonneg (j, w, "eps", &o->eps, error)
      || !get_nonneg (j, w, "max_grad_norm", &o->max_grad_norm, error)
      || !stow_json_get_string (j, w, "lr_schedule", FALSE, &schedule, error)
      || !stow_json_get_string (j, w, "weight_decay_on", FALSE, &decay_on,
                                error))
    return FALSE;
  if ((schedule && !stow_lr_schedule_parse (schedule, &o->schedule, &local))
      || (decay_on && !stow_decay_scope_parse (decay_on, &o->decay_on, &local))
      || !stow_optim_settings_check (o, &local))
    {
      /* The checks name the flags that set each field. */
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID, "%s: %s", w,
                   local->message);
      g_error_free (local);
      return FALSE;
    }
  return TRUE;
}

static gboolean
read_training (StowPlanFile *p, JsonObject *root, const char *name,
               GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: training", name);
  StowTraining *t = &p->training;
  JsonObject *o = NULL;
  guint targets = t->lora_targets;
  stow_training_init (t);
  if (!stow_json_get_object (root, name, "training", TRUE, &o, error)
      || !check_members (o, w, training_fields, error)
      || !get_range (o, w, "seq_len", TRUE, 1, (guint64)1 << 32, &t->seq_len,
                     error)
      /* added within version 1: optional, the encoder's length when absent */
      || !get_range (o, w, "decoder_seq_len", FALSE, 1, (guint64)1 << 32,
                     &t->decoder_seq_len, error)
      || !get_range (o, w, "global_batch", TRUE, 0, (guint64)1 << 40,
                     &t->global_batch, error)
      || !NAME (o, w, "precision", stow_precision_parse, &t->precision, error)
      || !NAME (o, w, "optimizer", stow_optimizer_parse, &t->optimizer, error)
      || !NAME (o, w, "finetune", stow_finetune_parse, &t->finetune, error)
      || !get_range (o, w, "lora_rank", TRUE, 1, 1 << 20, &t->lora_rank, error)
      || !get_uint (o, w, "lora_targets", 0, STOW_LORA_ALL, &targets, error)
      || !stow_json_get_bool (o, w, "flash_attention", TRUE,
                              &t->flash_attention, error)
      || !stow_json_get_bool (o, w, "chunked_loss", TRUE, &t->chunked_loss,
                              error)
      || !stow_json_get_bool (o, w, "dropout", TRUE, &t->dropout, error)
      /* added within version 1: optional, off when absent */
      || !stow_json_get_bool (o, w, "optimizer_in_backward", FALSE,
                              &t->optimizer_in_backward, error)
      || !stow_json_get_bool (o, w, "fused_loss", FALSE, &t->fused_loss, error)
      /* added within version 1: optional, eager when absent */
      || !stow_json_get_bool (o, w, "compile", FALSE, &t->compiled, error)
      /* added within version 1: optional, off when absent */
      || !stow_json_get_bool (o, w, "lora_dropout", FALSE, &t->lora_dropout,
                              error)
      || !read_optim (o, w, &t->optim, error))
    return FALSE;
  if (t->chunked_loss && t->fused_loss)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: chunked_loss and fused_loss are both true; a "
                   "cross-entropy runs one way",
                   w);
      return FALSE;
    }
  t->lora_targets = targets;
  return TRUE;
}

static gboolean
parse_activations_any (const char *s, const char *field, void *out,
                       GError **error)
{
  if (g_ascii_strcasecmp (s, "none") == 0 || g_ascii_strcasecmp (s, "cpu") == 0)
    {
      *(gboolean *)out = g_ascii_strcasecmp (s, "cpu") == 0;
      return TRUE;
    }
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s \"%s\": expected none or cpu", field, s);
  return FALSE;
}

static gboolean
parse_recompute_mode_any (const char *s, const char *field, void *out,
                          GError **error)
{
  guint layers = 0;
  StowRecompute r;
  if (strchr (s, ':') != NULL)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "%s \"%s\": expected none, selective or full (the layer "
                   "count is recompute_layers)",
                   field, s);
      return FALSE;
    }
  if (!stow_recompute_parse (s, field, &r, &layers, error))
    return FALSE;
  *(StowRecompute *)out = r;
  return TRUE;
}

static gboolean
read_layout (StowPlanFile *p, JsonObject *root, const char *name,
             GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: layout", name);
  StowLayout *l = &p->layout;
  JsonObject *o = NULL;
  gboolean act = FALSE;
  guint64 rl = 0;
  stow_layout_init (l);
  if (!stow_json_get_object (root, name, "layout", TRUE, &o, error)
      || !check_members (o, w, layout_fields, error)
      || !get_uint (o, w, "dp", 1, MAX_DEGREE, &l->dp, error)
      || !get_uint (o, w, "tp", 1, MAX_DEGREE, &l->tp, error)
      || !get_uint (o, w, "pp", 1, MAX_DEGREE, &l->pp, error)
      || !get_uint (o, w, "vpp", 1, MAX_DEGREE, &l->vpp, error)
      || !get_uint (o, w, "cp", 1, MAX_DEGREE, &l->cp, error)
      || !get_uint (o, w, "ep", 1, MAX_DEGREE, &l->ep, error)
      /* absent (plan files before --etp): as tp */
      || !get_uint (o, w, "etp", 0, MAX_DEGREE, &l->etp, error)
      || !stow_json_get_bool (o, w, "sp", TRUE, &l->sp, error)
      || !stow_json_get_bool (o, w, "pp_split_ends", FALSE, &l->pp_split_ends,
                              error)
      || !get_uint (o, w, "zero", 0, 3, &l->zero, error)
      || !stow_json_get_bool (o, w, "hybrid_shard", TRUE, &l->hybrid_shard,
                              error)
      || !NAME (o, w, "offload_optimizer", stow_offload_parse,
                &l->offload_optimizer, error)
      || !NAME (o, w, "offload_params", stow_offload_parse, &l->offload_params,
                error)
      || !NAME (o, w, "offload_activations", parse_activations, &act, error)
      || !NAME (o, w, "recompute", parse_recompute_mode, &l->recompute, error)
      || !get_range (o, w, "recompute_layers", TRUE, 0, 1 << 20, &rl, error)
      || !get_range (o, w, "micro_batch", TRUE, 1, (guint64)1 << 32,
                     &l->micro_batch, error)
      || !get_range (o, w, "grad_accum", TRUE, 1, (guint64)1 << 32,
                     &l->grad_accum, error)
      || !NAME (o, w, "schedule", stow_schedule_parse, &l->schedule, error)
      || !NAME (o, w, "engine", stow_engine_parse, &l->engine, error))
    return FALSE;
  l->offload_activations = act;
  l->recompute_layers = (guint)rl;
  if (l->etp == l->tp)
    l->etp = 0; /* the default, as stow_layout_init leaves it */
  return TRUE;
}

static gboolean
read_mem_options (StowPlanFile *p, JsonObject *root, const char *name,
                  guint64 model_params, GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: memory_options", name);
  StowMemOptions *m = &p->mem_options;
  JsonObject *o = NULL;
  guint64 zi = 1;
  stow_mem_options_init (m);
  if (!stow_json_get_object (root, name, "memory_options", TRUE, &o, error)
      || !check_members (o, w, memopt_fields, error)
      || !NAME (o, w, "convention", stow_convention_parse, &m->convention,
                error)
      || !get_range (o, w, "zero_init", TRUE, 0, 1, &zi, error)
      || !get_range (o, w, "params_override", TRUE, 0, G_MAXINT64,
                     &m->params_override, error)
      || !get_range (o, w, "largest_layer_override", TRUE, 0, G_MAXINT64,
                     &m->largest_layer_override, error)
      || !get_range (o, w, "cuda_context_bytes", TRUE, 0, MAX_BYTES,
                     &m->cuda_context_bytes, error)
      || !get_range (o, w, "workspace_bytes", TRUE, 0, MAX_BYTES,
                     &m->workspace_bytes, error)
      || !get_range (o, w, "nccl_bytes_per_group", TRUE, 0, MAX_BYTES,
                     &m->nccl_bytes_per_group, error)
      || !stow_json_get_double (o, w, "fragmentation", TRUE, &m->fragmentation,
                                error)
      || !get_range (o, w, "safety_margin_bytes", TRUE, 0, MAX_BYTES,
                     &m->safety_margin_bytes, error)
      || !get_range (o, w, "host_process_bytes", TRUE, 0, MAX_BYTES,
                     &m->host_process_bytes, error)
      || !get_range (o, w, "vocab_multiple", TRUE, 0, 1 << 20,
                     &m->vocab_multiple, error)
      || !get_range (o, w, "swap_shard_params", TRUE, 1, G_MAXINT64,
                     &m->swap_shard_params, error)
      /* added within version 1: optional, defaults when absent */
      || !get_range (o, w, "reduce_bucket_elements", FALSE, 1, G_MAXINT64,
                     &m->reduce_bucket_elements, error)
      || !get_range (o, w, "prefetch_bucket_elements", FALSE, 0, G_MAXINT64,
                     &m->prefetch_bucket_elements, error)
      || !get_range (o, w, "reuse_distance_elements", FALSE, 0, G_MAXINT64,
                     &m->reuse_distance_elements, error)
      || !get_range (o, w, "cpu_optimizer_buffer_bytes", FALSE, 0, MAX_BYTES,
                     &m->cpu_optimizer_buffer_bytes, error))
    return FALSE;
  static const char *const tristate[] = { "overlap_comm", "free_grads" };
  gint *tri_out[] = { &m->overlap_comm, &m->free_grads };
  for (gsize i = 0; i < G_N_ELEMENTS (tristate); i++)
    {
      gint64 v = *tri_out[i];
      if (!stow_json_get_i64 (o, w, tristate[i], FALSE, &v, error))
        return FALSE;
      if (v < -1 || v > 1)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "%s: %s: %" G_GINT64_FORMAT
                       " is not -1 (default), 0 or 1",
                       w, tristate[i], v);
          return FALSE;
        }
      *tri_out[i] = (gint)v;
    }
  m->zero_init = (gint)zi;
  if (!(m->fragmentation >= 0 && m->fragmentation <= 1))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: fragmentation: %g is not a fraction from 0 to 1", w,
                   m->fragmentation);
      return FALSE;
    }
  if (p->model == NULL
      && (m->params_override != model_params
          || m->convention == STOW_CONVENTION_STOWAGE))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: model: a plan without a model name needs a peer "
                   "convention and params_override equal to model.params",
                   name);
      return FALSE;
    }
  return TRUE;
}

static gboolean
read_schedule (StowPlanFile *p, JsonObject *root, const char *name,
               GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: schedule", name);
  StowPlanStreaming *s = &p->streaming;
  JsonObject *o = NULL;
  JsonArray *paths = NULL;
  if (!stow_json_get_object (root, name, "schedule", TRUE, &o, error)
      || !check_members (o, w, schedule_fields, error)
      || !get_range (o, w, "resident_layers", TRUE, 0, 1 << 20,
                     &s->resident_layers, error)
      || !get_uint (o, w, "prefetch_depth", 0, 64, &s->prefetch_depth, error)
      || !get_uint (o, w, "optimizer_swap_buffers", 0, 1024,
                    &s->optimizer_swap_buffers, error)
      || !get_uint (o, w, "param_swap_buffers", 0, 1024, &s->param_swap_buffers,
                    error)
      || !get_range (o, w, "param_buffer_elems", TRUE, 0, (guint64)1 << 40,
                     &s->param_buffer_elems, error)
      || !stow_json_get_array (o, w, "nvme_paths", TRUE, &paths, error)
      || !get_uint (o, w, "io_queue_depth", 0, 4096, &s->io_queue_depth, error)
      || !get_range (o, w, "io_block_bytes", TRUE, 0, (guint64)1 << 30,
                     &s->io_block_bytes, error))
    return FALSE;
  guint n = json_array_get_length (paths);
  s->nvme_paths = g_new0 (char *, n + 1);
  for (guint i = 0; i < n; i++)
    {
      JsonNode *e = json_array_get_element (paths, i);
      if (!JSON_NODE_HOLDS_VALUE (e)
          || json_node_get_value_type (e) != G_TYPE_STRING
          || *json_node_get_string (e) == '\0')
        {
          g_autofree char *d = stow_json_describe (e);
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "%s: nvme_paths[%u]: expected a directory path, got %s",
                       w, i, d);
          return FALSE;
        }
      s->nvme_paths[i] = g_strdup (json_node_get_string (e));
    }
  if (s->io_block_bytes && (s->io_block_bytes & 4095) != 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: io_block_bytes: %" G_GUINT64_FORMAT
                   " is not a multiple of 4096 (O_DIRECT)",
                   w, s->io_block_bytes);
      return FALSE;
    }
  gboolean nvme = p->layout.offload_optimizer == STOW_OFFLOAD_NVME
                  || p->layout.offload_params == STOW_OFFLOAD_NVME;
  if (nvme && (n == 0 || s->io_queue_depth == 0 || s->io_block_bytes == 0))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: %s: NVMe offload needs nvme_paths, io_queue_depth and "
                   "io_block_bytes",
                   w,
                   n == 0                   ? "nvme_paths"
                   : s->io_queue_depth == 0 ? "io_queue_depth"
                                            : "io_block_bytes");
      return FALSE;
    }
  return TRUE;
}

/* The predicted totals only; the terms are for people and other tools. */
static gboolean
read_memory (StowPlanFile *p, JsonObject *root, const char *name,
             GError **error)
{
  g_autofree char *w = g_strdup_printf ("%s: memory", name);
  JsonObject *o = NULL;
  if (!stow_json_get_object (root, name, "memory", FALSE, &o, error))
    return FALSE;
  if (o == NULL)
    return TRUE;
  return get_range (o, w, "device_total_bytes", FALSE, 0, G_MAXINT64,
                    &p->predicted_device_bytes, error)
         && get_range (o, w, "host_total_bytes", FALSE, 0, G_MAXINT64,
                       &p->predicted_host_bytes, error)
         && get_range (o, w, "nvme_bytes", FALSE, 0, G_MAXINT64,
                       &p->predicted_nvme_bytes, error);
}

StowPlanFile *
stow_plan_file_from_json (JsonNode *root_node, const char *name, GError **error)
{
  g_return_val_if_fail (root_node != NULL && name != NULL, NULL);
  JsonObject *root = stow_json_root_object (root_node, name, error);
  if (root == NULL)
    return NULL;
  const char *format = NULL;
  guint64 version = 0, params = 0;
  if (!stow_json_get_string (root, name, "format", TRUE, &format, error))
    return NULL;
  if (strcmp (format, STOW_PLAN_FILE_FORMAT) != 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: format: expected \"%s\", got \"%s\"", name,
                   STOW_PLAN_FILE_FORMAT, format);
      return NULL;
    }
  if (!stow_json_get_u64 (root, name, "version", TRUE, &version, error))
    return NULL;
  if (version != STOW_PLAN_FILE_VERSION)
    {
      g_set_error (
          error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
          "%s: version: this stowage reads version %d, got %" G_GUINT64_FORMAT,
          name, STOW_PLAN_FILE_VERSION, version);
      return NULL;
    }
  g_autoptr (StowPlanFile) p = g_new0 (StowPlanFile, 1);
  if (!check_members (root, name, top_fields, error)
      || !read_model (p, root, name, &params, error)
      || !read_cluster (p, root, name, error)
      || !read_training (p, root, name, error)
      || !read_layout (p, root, name, error)
      || !read_mem_options (p, root, name, params, error)
      || !read_schedule (p, root, name, error)
      || !read_memory (p, root, name, error))
    return NULL;

  /* A layout that cannot run on this model and cluster is refused here,
   * with the file named, rather than later by the executor. */
  g_autoptr (GError) local = NULL;
  if (p->model != NULL
      && !stow_layout_validate (&p->layout, &p->training, p->model, p->cluster,
                                &local))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: layout: %s", name, local->message);
      return NULL;
    }
  if (p->streaming.resident_layers
      > (p->model ? p->model->n_layers : G_MAXUINT))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "%s: schedule: resident_layers: %" G_GUINT64_FORMAT
                   " is more than the model's %" G_GUINT64_FORMAT " layers",
                   name, p->streaming.resident_layers, p->model->n_layers);
      return NULL;
    }
  /* The plan's resident layers are the layout's: every command that
   * reads the plan keeps the same ones. */
  if (p->layout.offload_params != STOW_OFFLOAD_NONE
      && p->layout.engine == STOW_ENGINE_STOWAGE)
    p->layout.resident_layers = (guint)p->streaming.resident_layers;
  return g_steal_pointer (&p);
}

StowPlanFile *
stow_plan_file_from_data (const char *data, gssize len, const char *name,
                          GError **error)
{
  g_autoptr (JsonNode) root = stow_json_parse_data (data, len, name, error);
  if (root == NULL)
    return NULL;
  return stow_plan_file_from_json (root, name, error);
}

StowPlanFile *
stow_plan_file_read (const char *path, GError **error)
{
  g_autoptr (JsonNode) root
      = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, error);
  if (root == NULL)
    return NULL;
  return stow_plan_file_from_json (root, path, error);
}

gboolean
stow_plan_streaming_nvme_placeholder (const StowPlanStreaming *s)
{
  return s->nvme_paths != NULL && s->nvme_paths[0] != NULL
         && g_str_equal (s->nvme_paths[0], STOW_PLAN_NVME_PLACEHOLDER);
}
