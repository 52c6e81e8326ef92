/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-mem.c: `stowage mem` (one layout's memory, term by term) and
 * `stowage fit` (does it fit, with which layout, and if not, what would).
 */
#include <stdio.h>
#include <string.h>

#include "cli/all-offloads.h"
#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan-options.h"
#include "cli/report-options.h"
#include "core/json.h"
#include "core/units.h"
#include "reports/memory-report.h"
#include "reports/report.h"

static int
run_mem (StowPlanOptions *po, StowReportOptions *ro, int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      po->call, "mem", "MODEL",
      "The memory of one layout, per GPU (each pipeline stage), per host and "
      "per node's NVMe, term by term.  Dimensions left out are filled in as "
      "'stowage fit' chooses them (the fastest layout that fits), and the "
      "output says which; under a peer --convention, dp takes the GPUs left "
      "and the rest stay off.  Exit status: 0 it fits, 1 it does not, 2 bad "
      "input.");
  stow_plan_options_add (ctx, po);
  stow_report_options_add (ctx, ro, po->call);
  if (!stow_cli_call_parse (po->call, ctx, "mem", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 2)
    return stow_cli_call_failf (po->call, "see 'stowage mem --help'",
                                "mem: unexpected argument \"%s\"", argv[2]);
  if (ro->plan != NULL
          ? !stow_report_options_load_plan (ro, po, argc > 1 ? argv[1] : NULL,
                                            &error)
          : !stow_plan_options_resolve (po, argc > 1 ? argv[1] : NULL, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (!stow_report_options_resolve (ro, po, &error)
      || !stow_report_options_plan_engine (ro, po, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  /* What the flags leave open is filled as fit fills it (issue 24: ZeRO 0
   * everywhere reported 1,065 GiB for llama-65b on 8 A100s). */
  g_auto (GStrv) filled
      = ro->plan == NULL ? stow_plan_options_fill_like_fit (po) : NULL;
  g_autoptr (StowMemory) mem = stow_memory_estimate (&po->plan, &error);
  if (mem == NULL)
    return stow_cli_call_fail (po->call, error, NULL);
  stow_report_options_check_plan (ro, mem);
  StowMemoryReport r = { po->model,
                         po->cluster_obj,
                         &po->plan.training,
                         &po->plan.layout,
                         &po->plan.mem,
                         mem,
                         (const char *const *)filled };
  StowReport report = { .mem = r, .command = "mem", .fits = mem->fits };
  g_autoptr (JsonNode) node = stow_memory_report_json (&r);
  g_autoptr (GString) s = g_string_new (NULL);
  stow_memory_report_text (s, &r, po->explain);
  /* As fit: 1 when the layout does not fit. */
  return stow_report_options_finish (ro, po, &report, s->str, node,
                                     mem->fits ? STOW_EXIT_OK : STOW_EXIT_NO);
}

int
stow_mem_run (StowCliCall *call, int argc, char **argv)
{
  StowPlanOptions po = { .call = call };
  StowReportOptions ro = { 0 };
  int rc = run_mem (&po, &ro, argc, argv);
  stow_plan_options_clear (&po);
  stow_report_options_clear (&ro);
  return rc;
}

/* What would fit instead: the JSON array's objects, and for the other
 * formats one line each with its kind beside it (static strings). */
typedef struct
{
  JsonBuilder *jb;
  GPtrArray *lines; /* owned strings */
  GPtrArray *kinds;
} Alternatives;

/* Searches @cluster for @training; when something fits, records it as an
 * alternative of @kind ("more_gpus", "larger_gpu", "finetune") with the
 * label shown to the user and in JSON under @key.  TRUE if it fits. */
static gboolean
try_alternative (StowPlanOptions *po, const StowCluster *cluster,
                 const StowTraining *training, StowPins pins, const char *kind,
                 const char *key, const char *value, const char *label,
                 Alternatives *out)
{
  g_autoptr (StowSearch) s
      = stow_plan_options_search (po, cluster, training, pins, 1);
  if (s->fits->len == 0)
    return FALSE;
  StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
  g_autofree char *d = stow_layout_describe (&cand->layout);
  g_autofree char *tot = stow_format_bytes (cand->total_bytes);
  g_ptr_array_add (out->lines,
                   g_strdup_printf ("%s: %s (%s per GPU)", label, d, tot));
  g_ptr_array_add (out->kinds, (char *)kind);
  JsonBuilder *jb = out->jb;
  json_builder_begin_object (jb);
  stow_json_set_string (jb, "kind", kind);
  stow_json_set_string (jb, key, value);
  stow_json_set_i64 (jb, "total_bytes", (gint64)cand->total_bytes);
  json_builder_set_member_name (jb, "layout");
  json_builder_add_value (jb, stow_layout_to_json (&cand->layout, training));
  json_builder_end_object (jb);
  return TRUE;
}

/* What would make it fit: more GPUs of this kind, a larger GPU, LoRA or
 * QLoRA.  Each alternative is a full search on the changed setup. */
static void
alternatives (StowPlanOptions *po, gboolean host_limited, Alternatives *out)
{
  const StowCluster *c = po->cluster_obj;
  const StowGpu *gpu = &c->node.gpu;

  /* Layouts that fit the GPUs but not the host RAM or NVMe: search again
   * with room to spare on both and say how much the best one needs. */
  if (host_limited)
    {
      StowNode node;
      stow_node_copy (&c->node, &node);
      node.host_ram_bytes = (guint64)1 << 50;
      for (guint i = 0; i < node.n_nvme; i++)
        node.nvme[i].capacity_bytes = (guint64)1 << 50;
      g_autoptr (StowCluster) roomy
          = stow_cluster_new (&node, c->n_nodes, c->spec);
      stow_node_clear (&node);
      g_autoptr (StowSearch) s
          = stow_plan_options_search (po, roomy, NULL, po->pins, 1);
      if (s->fits->len > 0)
        {
          StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
          g_autofree char *d = stow_layout_describe (&cand->layout);
          g_autofree char *host = stow_format_bytes (cand->host_bytes);
          g_autofree char *have = stow_format_bytes (c->node.host_ram_bytes);
          g_autofree char *nv = stow_format_bytes (cand->nvme_bytes);
          g_ptr_array_add (
              out->lines,
              g_strdup_printf ("%s host RAM per node (it has "
                               "%s)%s%s: %s",
                               host, have,
                               cand->nvme_bytes ? " and NVMe of " : "",
                               cand->nvme_bytes ? nv : "", d));
          g_ptr_array_add (out->kinds, "more_host_memory");
          JsonBuilder *jb = out->jb;
          json_builder_begin_object (jb);
          stow_json_set_string (jb, "kind", "more_host_memory");
          stow_json_set_i64 (jb, "host_bytes", (gint64)cand->host_bytes);
          stow_json_set_i64 (jb, "nvme_bytes", (gint64)cand->nvme_bytes);
          stow_json_set_i64 (jb, "total_bytes", (gint64)cand->total_bytes);
          json_builder_set_member_name (jb, "layout");
          json_builder_add_value (
              jb, stow_layout_to_json (&cand->layout, &po->plan.training));
          json_builder_end_object (jb);
        }
    }

  /* More GPUs: double until it fits, up to 65,536, in nodes of the
   * GPU's preset (the spec "NxGPU" picks them); dp takes the new GPUs. */
  for (guint64 n = (guint64)c->n_gpus * 2; n <= 65536; n *= 2)
    {
      g_autofree char *spec
          = g_strdup_printf ("%" G_GUINT64_FORMAT "x%s", n, gpu->name);
      g_autoptr (StowCluster) bigger = stow_cluster_new_from_spec (spec, NULL);
      if (bigger != NULL
          && try_alternative (po, bigger, &po->plan.training,
                              po->pins & ~(StowPins)STOW_PIN_DP, "more_gpus",
                              "gpus", spec, spec, out))
        break;
    }

  /* A larger GPU, same count, in the same nodes (host RAM, NVMe and
   * network unchanged, so only the GPU's memory makes the difference). */
  gsize n_gpus;
  const StowGpu *const *cat = stow_gpu_catalog (&n_gpus);
  for (gsize i = 0; i < n_gpus; i++)
    {
      /* Larger, and able to run the precision (no fp8 on an A100). */
      if ((double)cat[i]->total_bytes < 1.02 * (double)gpu->total_bytes
          || !stow_training_check_gpu (&po->plan.training, cat[i], NULL, NULL))
        continue;
      StowNode node;
      stow_node_copy (&c->node, &node);
      stow_gpu_clear (&node.gpu);
      stow_gpu_copy (cat[i], &node.gpu);
      g_autofree char *spec
          = g_strdup_printf ("%ux%s", c->n_gpus, cat[i]->name);
      g_autoptr (StowCluster) other
          = stow_cluster_new (&node, c->n_nodes, spec);
      stow_node_clear (&node);
      g_autofree char *label = g_strdup_printf ("%s in the same nodes", spec);
      try_alternative (po, other, &po->plan.training, po->pins, "larger_gpu",
                       "gpus", spec, label, out);
    }

  /* LoRA, then QLoRA, on the same GPUs. */
  static const StowFinetune modes[]
      = { STOW_FINETUNE_LORA, STOW_FINETUNE_QLORA };
  for (gsize i = 0; po->plan.training.finetune == STOW_FINETUNE_FULL
                    && i < G_N_ELEMENTS (modes);
       i++)
    {
      StowTraining t = po->plan.training;
      t.finetune = modes[i];
      const char *name = stow_finetune_name (modes[i]);
      g_autofree char *label = g_strdup_printf (
          "--finetune %s (rank %" G_GUINT64_FORMAT ")", name, t.lora_rank);
      if (try_alternative (po, c, &t, po->pins, "finetune", "finetune", name,
                           label, out))
        break;
    }
}

static int
run_fit (StowPlanOptions *po, StowReportOptions *ro, int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  gboolean all_offloads = FALSE;
  const GOptionEntry extra[] = {
    { "all-offloads", 0, 0, G_OPTION_ARG_NONE, &all_offloads,
      "One row per ZeRO stage and offload choice (DeepSpeed's "
      "estimate_zero3_model_states_mem_needs_all_live): per-GPU memory, "
      "RAM and NVMe per node, fits, predicted step",
      NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      po->call, "fit", "MODEL",
      "Does MODEL train on these GPUs?  Searches the layouts (parallel "
      "degrees, ZeRO stage, offload, recomputation, micro-batch) that the "
      "flags leave open and shows the best that fits, term by term.  Exit "
      "status: 0 it fits, 1 it does not, 2 bad input.");
  stow_plan_options_add (ctx, po);
  stow_report_options_add (ctx, ro, po->call);
  stow_cli_add_entries (po->call, ctx, extra);
  if (!stow_cli_call_parse (po->call, ctx, "fit", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (all_offloads)
    {
      const char *clash = po->zero                ? "--zero"
                          : po->offload_optimizer ? "--offload-optimizer"
                          : po->offload_params    ? "--offload-params"
                          : ro->format            ? "--format"
                          : ro->output            ? "--output"
                          : ro->chart             ? "--chart"
                          : ro->emit              ? "--emit"
                          : ro->plan              ? "--plan"
                                                  : NULL;
      if (clash)
        return stow_cli_call_failf (po->call, "see 'stowage fit --help'",
                                    "--all-offloads shows every ZeRO stage and "
                                    "offload choice as text or --json; drop %s",
                                    clash);
    }
  if (argc > 2)
    return stow_cli_call_failf (po->call, "see 'stowage fit --help'",
                                "fit: unexpected argument \"%s\"", argv[2]);
  if (ro->plan != NULL
          ? !stow_report_options_load_plan (ro, po, argc > 1 ? argv[1] : NULL,
                                            &error)
          : !stow_plan_options_resolve (po, argc > 1 ? argv[1] : NULL, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (!stow_report_options_resolve (ro, po, &error)
      || !stow_report_options_plan_engine (ro, po, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (all_offloads)
    {
      stow_plan_options_default_layout (po);
      return stow_all_offloads_run (po);
    }
  if (po->model == NULL)
    return stow_cli_call_failf (
        po->call, NULL,
        "fit searches layouts of a real model; use "
        "'stowage mem --params N --convention ...' for a "
        "peer's formula");
  if (po->plan.mem.convention != STOW_CONVENTION_STOWAGE)
    return stow_cli_call_failf (po->call, "use 'stowage mem --convention ...'",
                                "fit uses stowage's own memory model");
  if (ro->plan == NULL)
    stow_plan_options_default_layout (po);

  /* With every dimension pinned and nothing valid, report why that one
   * layout is invalid rather than "no layout". */
  g_autoptr (StowSearch) search
      = stow_plan_options_search (po, NULL, NULL, po->pins, 8);
  gboolean fits = search->fits->len > 0;
  StowCandidate *best = fits ? &g_array_index (search->fits, StowCandidate, 0)
                             : (search->have_miss ? &search->best_miss : NULL);
  if (best == NULL)
    return stow_report_options_fail_no_layout (ro, po);
  StowPlan plan = po->plan;
  plan.layout = best->layout;
  g_autoptr (StowMemory) mem = stow_memory_estimate (&plan, &error);
  if (mem == NULL)
    return stow_cli_call_fail (po->call, error, NULL);
  StowMemoryReport r = { po->model,     po->cluster_obj, &po->plan.training,
                         &best->layout, &po->plan.mem,   mem };

  g_autoptr (JsonBuilder) jb = json_builder_new ();
  g_autoptr (GPtrArray) alt_lines = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GPtrArray) alt_kinds = g_ptr_array_new ();
  Alternatives alts = { jb, alt_lines, alt_kinds };
  json_builder_begin_array (jb);
  if (!fits)
    alternatives (po, search->host_or_nvme > 0, &alts);
  json_builder_end_array (jb);
  g_autoptr (JsonNode) alt_node = json_builder_get_root (jb);

  g_autoptr (JsonNode) node = stow_memory_report_json (&r);
  JsonObject *o = json_node_get_object (node);
  json_object_set_boolean_member (o, "fits", fits);
  json_object_set_int_member (o, "layouts_evaluated",
                              (gint64)search->evaluated);
  json_object_set_int_member (o, "layouts_fitting", (gint64)search->fitting);
  if (fits)
    {
      /* the time model's prediction for the chosen layout */
      JsonObject *p = json_object_new ();
      json_object_set_double_member (p, "step_time_s", best->cost.step_time_s);
      json_object_set_double_member (p, "tokens_per_s",
                                     best->cost.tokens_per_s);
      json_object_set_double_member (p, "mfu", best->cost.mfu);
      json_object_set_object_member (o, "predicted", p);
    }
  if (!fits)
    json_object_set_member (o, "alternatives", json_node_ref (alt_node));

  g_autoptr (GString) text = g_string_new (NULL);
  char tok[STOW_FORMAT_BUF];
  g_string_append_printf (text, "%s: %s on %s\n",
                          fits ? "FITS" : "DOES NOT FIT", po->model->name,
                          po->cluster_obj->spec);
  stow_report_search_counts (text, search, -1);
  g_string_append (text, "\n\n");
  if (fits)
    {
      g_autofree char *step = stow_report_format_step (best->cost.step_time_s);
      g_string_append_printf (
          text,
          "Fastest layout that fits (predicted %s per step, %s tokens/s, "
          "MFU %.1f%%; 'stowage plan' ranks the others):\n",
          step,
          stow_format_grouped_into (tok, sizeof tok,
                                    (guint64)(best->cost.tokens_per_s + 0.5)),
          100 * best->cost.mfu);
    }
  else
    g_string_append (text, "Closest layout (does not fit):\n");
  stow_memory_report_text (text, &r, po->explain);
  if (!fits && alt_lines->len)
    {
      g_string_append (text, "\nWhat would fit:\n");
      for (guint i = 0; i < alt_lines->len; i++)
        g_string_append_printf (text, "  - %s\n",
                                (const char *)g_ptr_array_index (alt_lines, i));
    }
  else if (!fits)
    g_string_append (text, "\nNo alternative found with more GPUs, a "
                           "larger GPU or LoRA/QLoRA.\n");
  /* The alternatives and their kinds, NULL-terminated, for the other
   * formats and the --emit hint. */
  g_ptr_array_add (alt_lines, NULL);
  g_ptr_array_add (alt_kinds, NULL);
  /* The time model's throughput of each candidate, for the chart. */
  g_autofree double *tput = g_new0 (double, MAX (search->fits->len, 1));
  for (guint i = 0; i < search->fits->len; i++)
    tput[i] = g_array_index (search->fits, StowCandidate, i).cost.tokens_per_s;
  StowReport report
      = { .mem = r,
          .command = "fit",
          .search = search,
          .fits = fits,
          .throughput = fits ? tput : NULL,
          .n_throughput = search->fits->len,
          .alternatives = (const char *const *)alt_lines->pdata,
          .alternative_kinds = (const char *const *)alt_kinds->pdata };
  return stow_report_options_finish (ro, po, &report, text->str, node,
                                     fits ? STOW_EXIT_OK : STOW_EXIT_NO);
}

int
stow_fit_run (StowCliCall *call, int argc, char **argv)
{
  StowPlanOptions po = { .call = call };
  StowReportOptions ro = { 0 };
  int rc = run_fit (&po, &ro, argc, argv);
  stow_plan_options_clear (&po);
  stow_report_options_clear (&ro);
  return rc;
}

int
stow_cmd_mem (int argc, char **argv)
{
  return stow_mem_run (NULL, argc, argv);
}

int
stow_cmd_fit (int argc, char **argv)
{
  return stow_fit_run (NULL, argc, argv);
}
