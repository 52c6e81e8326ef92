/* SPDX-License-Identifier: MIT
 *
 * cli/all-offloads.c: `stowage fit MODEL --gpus SPEC --all-offloads`, the
 * table DeepSpeed's estimate_zero3_model_states_mem_needs_all_live prints,
 * widened to every ZeRO stage and every offload choice and priced by
 * stowage's whole memory and time models: per row the fastest layout that
 * fits with that choice (else the closest), its per-GPU memory, host RAM
 * and NVMe per node, and its predicted step.
 */
#include "cli/all-offloads.h"
#include "cli/cli.h"
#include "core/json.h"
#include "core/units.h"
#include "planner/memory.h"
#include "planner/search.h"

typedef struct
{
  guint zero;
  StowOffload opt, params;
  gboolean valid;      /* some layout with this choice can run */
  gboolean same_lower; /* one data-parallel rank: the stage below's layout */
  gboolean fits;
  StowCandidate cand;
} Row;

static void
run_row (const StowPlanOptions *po, Row *row)
{
  StowLayout base = po->plan.layout;
  base.zero = row->zero;
  base.offload_optimizer = row->opt;
  base.offload_params = row->params;
  StowPins pins = po->pins | STOW_PIN_ZERO | STOW_PIN_OFFLOAD_OPTIMIZER
                  | STOW_PIN_OFFLOAD_PARAMS;
  StowPlan plan = po->plan;
  plan.layout = base;
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = 1;
  g_autoptr (StowSearch) s = stow_search_run (&plan, pins, &so);
  row->same_lower = s->evaluated == 0 && s->same_as_lower_zero > 0;
  row->valid = s->evaluated > 0;
  row->fits = s->fits->len > 0;
  if (row->fits)
    row->cand = g_array_index (s->fits, StowCandidate, 0);
  else if (s->have_miss)
    row->cand = s->best_miss;
  else
    row->valid = FALSE;
}

static const char *
gib (char *buf, gsize size, guint64 bytes)
{
  g_snprintf (buf, size, "%.2f", (double)bytes / (double)(1ull << 30));
  return buf;
}

/* Under --convention deepspeed-estimator(-docs): DeepSpeed's own rows and
 * print format (stage3.py / stage_1_and_2.py, the *_all_live functions),
 * ZeRO-3 then ZeRO-2, digit for digit. */
static int
deepspeed_rows (StowPlanOptions *po)
{
  static const struct
  {
    guint zero;
    StowOffload params, opt;
    int zero_init;
  } rows[] = {
    { 3, STOW_OFFLOAD_CPU, STOW_OFFLOAD_CPU, 1 },
    { 3, STOW_OFFLOAD_CPU, STOW_OFFLOAD_CPU, 0 },
    { 3, STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, 1 },
    { 3, STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, 0 },
    { 3, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 1 },
    { 3, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 0 },
    { 2, STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, 1 },
    { 2, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 1 },
  };
  const StowCluster *c = po->cluster_obj;
  guint64 P = po->plan.mem.params_override ? po->plan.mem.params_override
                                           : po->model->params;
  guint64 LL = po->plan.mem.largest_layer_override
                   ? po->plan.mem.largest_layer_override
                   : (po->model ? po->model->largest_module_params : 0);
  gboolean any_fits = FALSE;
  g_autoptr (GString) text = g_string_new (NULL);
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "convention",
                        stow_convention_name (po->plan.mem.convention));
  stow_json_set_u64 (b, "params", P);
  stow_json_set_u64 (b, "largest_layer_params", LL);
  stow_json_set_u64 (b, "nodes", c->n_nodes);
  stow_json_set_u64 (b, "gpus_per_node", c->node.gpus_per_node);
  json_builder_set_member_name (b, "rows");
  json_builder_begin_array (b);
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    {
      g_autoptr (GError) error = NULL;
      StowPlan plan = po->plan;
      plan.cluster = c;
      plan.layout.zero = rows[i].zero;
      plan.layout.offload_params = rows[i].params;
      plan.layout.offload_optimizer = rows[i].opt;
      plan.mem.zero_init = rows[i].zero_init;
      g_autoptr (StowMemory) mem = stow_memory_estimate (&plan, &error);
      if (mem == NULL)
        return stow_cli_call_fail (po->call, error, NULL);
      any_fits |= mem->fits;
      if (i == 0 || rows[i].zero != rows[i - 1].zero)
        {
          if (!po->json)
            g_string_append_printf (
                text,
                "%sEstimated memory needed for params, optim states and "
                "gradients for a:\n"
                "HW: Setup with %u node%s, %u GPU%s per node.\n"
                "SW: Model with %" G_GUINT64_FORMAT "M total params%s",
                i ? "\n" : "", c->n_nodes, c->n_nodes > 1 ? "s" : "",
                c->node.gpus_per_node, c->node.gpus_per_node > 1 ? "s" : "",
                P / 1000000, rows[i].zero == 3 ? ", " : ".\n");
          if (!po->json && rows[i].zero == 3)
            g_string_append_printf (
                text, "%" G_GUINT64_FORMAT "M largest layer params.\n",
                LL / 1000000);
          if (!po->json)
            g_string_append_printf (text,
                                    "  per CPU  |  per GPU |   Options\n");
        }
      double cpu = (double)mem->host_total_bytes / (double)(1ull << 30);
      double gpu = (double)mem->total_bytes / (double)(1ull << 30);
      if (!po->json && rows[i].zero == 3)
        g_string_append_printf (text,
                                " %7.2fGB | %6.2fGB | offload_param=%-4s, "
                                "offload_optimizer=%-4s, zero_init=%d\n",
                                cpu, gpu, stow_offload_name (rows[i].params),
                                stow_offload_name (rows[i].opt),
                                rows[i].zero_init);
      else if (!po->json)
        g_string_append_printf (text,
                                " %7.2fGB | %6.2fGB | offload_optimizer=%-4s\n",
                                cpu, gpu, stow_offload_name (rows[i].opt));
      json_builder_begin_object (b);
      stow_json_set_u64 (b, "zero", rows[i].zero);
      stow_json_set_string (b, "offload_params",
                            stow_offload_name (rows[i].params));
      stow_json_set_string (b, "offload_optimizer",
                            stow_offload_name (rows[i].opt));
      stow_json_set_bool (b, "zero_init", rows[i].zero_init);
      stow_json_set_u64 (b, "gpu_bytes", mem->total_bytes);
      stow_json_set_u64 (b, "host_bytes_per_node", mem->host_total_bytes);
      stow_json_set_bool (b, "fits", mem->fits);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  stow_json_set_bool (b, "fits", any_fits);
  json_builder_end_object (b);
  int code = any_fits ? STOW_EXIT_OK : STOW_EXIT_NO;
  if (po->json)
    return stow_cli_call_answer_json (po->call, json_builder_get_root (b),
                                      code);
  return stow_cli_call_answer (po->call, NULL, text->str, code);
}

int
stow_all_offloads_run (StowPlanOptions *po)
{
  if (po->plan.mem.convention == STOW_CONVENTION_DEEPSPEED_ESTIMATOR
      || po->plan.mem.convention == STOW_CONVENTION_DEEPSPEED_ESTIMATOR_DOCS)
    return deepspeed_rows (po);
  if (po->plan.mem.convention != STOW_CONVENTION_STOWAGE)
    return stow_cli_call_failf (
        po->call, NULL,
        "--all-offloads: --convention %s has no offload "
        "choices; use stowage (default) or "
        "deepspeed-estimator",
        stow_convention_name (po->plan.mem.convention));
  if (po->model == NULL)
    return stow_cli_call_failf (po->call, NULL,
                                "--all-offloads needs a model (--params "
                                "stands in only under --convention "
                                "deepspeed-estimator)");

  static const StowOffload offloads[]
      = { STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, STOW_OFFLOAD_NVME };
  g_autoptr (GArray) rows = g_array_new (FALSE, TRUE, sizeof (Row));
  gboolean any_fits = FALSE;

  for (guint z = 0; z <= 3; z++)
    for (gsize p = 0; p < G_N_ELEMENTS (offloads); p++)
      for (gsize o = 0; o < G_N_ELEMENTS (offloads); o++)
        {
          /* Parameters are offloaded shard by shard: ZeRO-3 only. */
          if (z < 3 && offloads[p] != STOW_OFFLOAD_NONE)
            continue;
          Row row = { .zero = z, .opt = offloads[o], .params = offloads[p] };
          run_row (po, &row);
          if (!row.valid && !row.same_lower)
            continue;
          any_fits |= row.fits;
          g_array_append_val (rows, row);
        }

  if (po->json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_string (b, "model", po->model->name);
      stow_json_set_u64 (b, "params", po->model->params);
      stow_json_set_u64 (b, "largest_layer_params",
                         po->model->largest_module_params);
      stow_json_set_string (b, "gpus", po->cluster_obj->spec);
      stow_json_set_u64 (b, "nodes", po->cluster_obj->n_nodes);
      stow_json_set_u64 (b, "gpus_per_node",
                         po->cluster_obj->node.gpus_per_node);
      stow_json_set_bool (b, "fits", any_fits);
      json_builder_set_member_name (b, "rows");
      json_builder_begin_array (b);
      for (guint i = 0; i < rows->len; i++)
        {
          const Row *r = &g_array_index (rows, Row, i);
          json_builder_begin_object (b);
          stow_json_set_u64 (b, "zero", r->zero);
          stow_json_set_string (b, "offload_optimizer",
                                stow_offload_name (r->opt));
          stow_json_set_string (b, "offload_params",
                                stow_offload_name (r->params));
          stow_json_set_bool (b, "same_as_lower_stage", r->same_lower);
          if (!r->same_lower)
            {
              stow_json_set_bool (b, "fits", r->fits);
              stow_json_set_u64 (b, "gpu_bytes", r->cand.total_bytes);
              stow_json_set_u64 (b, "host_bytes_per_node", r->cand.host_bytes);
              stow_json_set_u64 (b, "nvme_bytes_per_node", r->cand.nvme_bytes);
              stow_json_set_double (b, "step_time_s", r->cand.cost.step_time_s);
              stow_json_set_u64 (b, "dp", r->cand.layout.dp);
              stow_json_set_u64 (b, "tp", r->cand.layout.tp);
              stow_json_set_u64 (b, "pp", r->cand.layout.pp);
              stow_json_set_u64 (b, "micro_batch", r->cand.layout.micro_batch);
              stow_json_set_string (
                  b, "recompute",
                  stow_recompute_name (r->cand.layout.recompute));
            }
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      json_builder_end_object (b);
      return stow_cli_call_answer_json (po->call, json_builder_get_root (b),
                                        any_fits ? STOW_EXIT_OK : STOW_EXIT_NO);
    }

  g_autoptr (GString) text = g_string_new (NULL);
  char g[STOW_FORMAT_BUF];
  g_autofree char *shortp = stow_format_count_short (po->model->params);
  g_autofree char *shortl
      = stow_format_count_short (po->model->largest_module_params);
  g_string_append_printf (
      text,
      "Memory of every ZeRO stage and offload choice, in GiB (DeepSpeed's "
      "estimate_zero3_model_states_mem_needs_all_live, with activations, "
      "buffers and time):\n");
  g_string_append_printf (
      text, "HW: %s, %u node%s of %u GPUs (%s GiB each)\n",
      po->cluster_obj->spec, po->cluster_obj->n_nodes,
      po->cluster_obj->n_nodes == 1 ? "" : "s",
      po->cluster_obj->node.gpus_per_node,
      gib (g, sizeof g, po->cluster_obj->node.gpu.total_bytes));
  g_string_append_printf (text,
                          "SW: %s, %s total params, %s largest layer params\n",
                          po->model->name, shortp, shortl);
  g_string_append_printf (
      text, "  %4s  %-8s %-8s %9s %13s %13s  %-4s  %10s  %s\n", "ZeRO", "optim",
      "params", "per GPU", "RAM per node", "NVMe per node", "fits", "step",
      "layout (fastest that fits, else closest)");
  for (guint i = 0; i < rows->len; i++)
    {
      const Row *r = &g_array_index (rows, Row, i);
      char a[32], h[32], n[32];
      if (r->same_lower)
        {
          g_string_append_printf (
              text,
              "  %4u  %-8s %-8s  same as ZeRO %u: one data-parallel "
              "rank\n",
              r->zero, stow_offload_name (r->opt),
              stow_offload_name (r->params), r->zero - 1);
          continue;
        }
      g_autofree char *step = stow_format_duration (r->cand.cost.step_time_s);
      g_string_append_printf (
          text,
          "  %4u  %-8s %-8s %9s %13s %13s  %-4s  %10s  dp %u tp %u pp "
          "%u, micro-batch %" G_GUINT64_FORMAT ", recompute %s\n",
          r->zero, stow_offload_name (r->opt), stow_offload_name (r->params),
          gib (a, sizeof a, r->cand.total_bytes),
          gib (h, sizeof h, r->cand.host_bytes),
          gib (n, sizeof n, r->cand.nvme_bytes), r->fits ? "yes" : "no", step,
          r->cand.layout.dp, r->cand.layout.tp, r->cand.layout.pp,
          r->cand.layout.micro_batch,
          stow_recompute_name (r->cand.layout.recompute));
    }
  return stow_cli_call_answer (po->call, NULL, text->str,
                               any_fits ? STOW_EXIT_OK : STOW_EXIT_NO);
}
