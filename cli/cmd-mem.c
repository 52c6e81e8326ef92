/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-mem.c: `stowage mem` (one layout's memory, term by term) and
 * `stowage fit` (does it fit, with which layout, and if not, what would).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan-options.h"
#include "core/json.h"
#include "core/units.h"
#include "reports/memory-report.h"

static int
print_json (JsonNode *node)
{
  g_autofree char *s = stow_json_to_string (node, TRUE);
  fputs (s, stdout);
  return STOW_EXIT_OK;
}

static int
run_mem (StowPlanOptions *po, int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "mem", "MODEL",
      "The memory of one layout, per GPU (each pipeline stage), per host and "
      "per node's NVMe, term by term.  Dimensions left out are filled in: "
      "dp takes the GPUs left.");
  stow_plan_options_add (ctx, po);
  if (!stow_cli_parse (ctx, "mem", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 2)
    return stow_cli_failf ("see 'stowage mem --help'",
                           "mem: unexpected argument \"%s\"", argv[2]);
  if (!stow_plan_options_resolve (po, argc > 1 ? argv[1] : NULL, &error))
    return stow_cli_fail (error, NULL);
  stow_plan_options_default_layout (po);
  g_autoptr (StowMemory) mem = stow_memory_estimate (
      po->model, po->cluster_obj, &po->training, &po->layout, &po->mem, &error);
  if (mem == NULL)
    return stow_cli_fail (error, NULL);
  StowMemoryReport r = { po->model,   po->cluster_obj, &po->training,
                         &po->layout, &po->mem,        mem };
  if (po->json)
    {
      g_autoptr (JsonNode) node = stow_memory_report_json (&r);
      return print_json (node);
    }
  g_autoptr (GString) s = g_string_new (NULL);
  stow_memory_report_text (s, &r, po->explain);
  fputs (s->str, stdout);
  return STOW_EXIT_OK;
}

int
stow_cmd_mem (int argc, char **argv)
{
  StowPlanOptions po = { 0 };
  int rc = run_mem (&po, argc, argv);
  stow_plan_options_clear (&po);
  return rc;
}

/* What would make it fit: more GPUs of this kind, a larger GPU, LoRA or
 * QLoRA.  Each alternative is a full search on the changed setup. */
static void
alternatives (StowPlanOptions *po, JsonBuilder *jb, GString *text)
{
  const StowCluster *c = po->cluster_obj;
  const StowGpu *gpu = &c->node.gpu;

  /* More GPUs: double until it fits, up to 65,536, in nodes of the
   * GPU's preset (the spec "NxGPU" picks them). */
  for (guint64 n = (guint64)c->n_gpus * 2; n <= 65536; n *= 2)
    {
      g_autofree char *spec
          = g_strdup_printf ("%" G_GUINT64_FORMAT "x%s", n, gpu->name);
      g_autoptr (StowCluster) bigger = stow_cluster_new_from_spec (spec, NULL);
      if (bigger == NULL)
        continue;
      StowLayout base = po->layout;
      g_autoptr (StowSearch) s
          = stow_search_run (po->model, bigger, &po->training, &base,
                             po->pins & ~(StowPins)STOW_PIN_DP, &po->mem, 1);
      if (s->fits->len > 0)
        {
          StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
          g_autofree char *d = stow_layout_describe (&cand->layout);
          g_autofree char *tot = stow_format_bytes (cand->total_bytes);
          g_string_append_printf (text, "  - %s: %s (%s per GPU)\n", spec, d,
                                  tot);
          json_builder_begin_object (jb);
          json_builder_set_member_name (jb, "kind");
          json_builder_add_string_value (jb, "more_gpus");
          json_builder_set_member_name (jb, "gpus");
          json_builder_add_string_value (jb, spec);
          json_builder_set_member_name (jb, "total_bytes");
          json_builder_add_int_value (jb, (gint64)cand->total_bytes);
          json_builder_set_member_name (jb, "layout");
          json_builder_add_value (
              jb, stow_layout_to_json (&cand->layout, &po->training));
          json_builder_end_object (jb);
          break;
        }
    }

  /* A larger GPU, same count. */
  gsize n_gpus;
  const StowGpu *const *cat = stow_gpu_catalog (&n_gpus);
  for (gsize i = 0; i < n_gpus; i++)
    {
      if (cat[i]->total_bytes <= gpu->total_bytes)
        continue;
      g_autofree char *spec
          = g_strdup_printf ("%ux%s", c->n_gpus, cat[i]->name);
      g_autoptr (StowCluster) other = stow_cluster_new_from_spec (spec, NULL);
      if (other == NULL)
        continue;
      StowLayout base = po->layout;
      g_autoptr (StowSearch) s = stow_search_run (
          po->model, other, &po->training, &base, po->pins, &po->mem, 1);
      if (s->fits->len == 0)
        continue;
      StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
      g_autofree char *d = stow_layout_describe (&cand->layout);
      g_autofree char *tot = stow_format_bytes (cand->total_bytes);
      g_string_append_printf (text, "  - %s: %s (%s per GPU)\n", spec, d, tot);
      json_builder_begin_object (jb);
      json_builder_set_member_name (jb, "kind");
      json_builder_add_string_value (jb, "larger_gpu");
      json_builder_set_member_name (jb, "gpus");
      json_builder_add_string_value (jb, spec);
      json_builder_set_member_name (jb, "total_bytes");
      json_builder_add_int_value (jb, (gint64)cand->total_bytes);
      json_builder_set_member_name (jb, "layout");
      json_builder_add_value (
          jb, stow_layout_to_json (&cand->layout, &po->training));
      json_builder_end_object (jb);
    }

  /* LoRA, then QLoRA, on the same GPUs. */
  static const StowFinetune modes[]
      = { STOW_FINETUNE_LORA, STOW_FINETUNE_QLORA };
  for (gsize i = 0;
       po->training.finetune == STOW_FINETUNE_FULL && i < G_N_ELEMENTS (modes);
       i++)
    {
      StowTraining t = po->training;
      t.finetune = modes[i];
      StowLayout base = po->layout;
      g_autoptr (StowSearch) s
          = stow_search_run (po->model, c, &t, &base, po->pins, &po->mem, 1);
      if (s->fits->len == 0)
        continue;
      StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
      g_autofree char *d = stow_layout_describe (&cand->layout);
      g_autofree char *tot = stow_format_bytes (cand->total_bytes);
      g_string_append_printf (
          text,
          "  - --finetune %s (rank %" G_GUINT64_FORMAT "): %s (%s per GPU)\n",
          stow_finetune_name (modes[i]), t.lora_rank, d, tot);
      json_builder_begin_object (jb);
      json_builder_set_member_name (jb, "kind");
      json_builder_add_string_value (jb, "finetune");
      json_builder_set_member_name (jb, "finetune");
      json_builder_add_string_value (jb, stow_finetune_name (modes[i]));
      json_builder_set_member_name (jb, "total_bytes");
      json_builder_add_int_value (jb, (gint64)cand->total_bytes);
      json_builder_set_member_name (jb, "layout");
      json_builder_add_value (jb, stow_layout_to_json (&cand->layout, &t));
      json_builder_end_object (jb);
      break;
    }
}

static int
run_fit (StowPlanOptions *po, int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "fit", "MODEL",
      "Does MODEL train on these GPUs?  Searches the layouts (parallel "
      "degrees, ZeRO stage, offload, recomputation, micro-batch) that the "
      "flags leave open and shows the best that fits, term by term.  Exit "
      "status: 0 it fits, 1 it does not, 2 bad input.");
  stow_plan_options_add (ctx, po);
  if (!stow_cli_parse (ctx, "fit", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 2)
    return stow_cli_failf ("see 'stowage fit --help'",
                           "fit: unexpected argument \"%s\"", argv[2]);
  if (!stow_plan_options_resolve (po, argc > 1 ? argv[1] : NULL, &error))
    return stow_cli_fail (error, NULL);
  if (po->model == NULL)
    return stow_cli_failf (NULL,
                           "fit searches layouts of a real model; use "
                           "'stowage mem --params N --convention ...' for a "
                           "peer's formula");
  if (po->mem.convention != STOW_CONVENTION_STOWAGE)
    return stow_cli_failf ("use 'stowage mem --convention ...'",
                           "fit uses stowage's own memory model");
  stow_plan_options_default_layout (po);

  /* With every dimension pinned and nothing valid, report why that one
   * layout is invalid rather than "no layout". */
  g_autoptr (StowSearch) search
      = stow_search_run (po->model, po->cluster_obj, &po->training, &po->layout,
                         po->pins, &po->mem, 8);
  gboolean fits = search->fits->len > 0;
  StowCandidate *best = fits ? &g_array_index (search->fits, StowCandidate, 0)
                             : (search->have_miss ? &search->best_miss : NULL);
  if (best == NULL)
    {
      g_autoptr (StowMemory) m
          = stow_memory_estimate (po->model, po->cluster_obj, &po->training,
                                  &po->layout, &po->mem, &error);
      if (m == NULL)
        return stow_cli_fail (error, NULL);
      return stow_cli_failf (NULL, "no valid layout of %s on %s",
                             po->model->name, po->cluster_obj->spec);
    }
  g_autoptr (StowMemory) mem
      = stow_memory_estimate (po->model, po->cluster_obj, &po->training,
                              &best->layout, &po->mem, &error);
  if (mem == NULL)
    return stow_cli_fail (error, NULL);
  StowMemoryReport r = { po->model,     po->cluster_obj, &po->training,
                         &best->layout, &po->mem,        mem };

  g_autoptr (JsonBuilder) jb = json_builder_new ();
  g_autoptr (GString) alts = g_string_new (NULL);
  json_builder_begin_array (jb);
  if (!fits)
    alternatives (po, jb, alts);
  json_builder_end_array (jb);
  g_autoptr (JsonNode) alt_node = json_builder_get_root (jb);

  if (po->json)
    {
      g_autoptr (JsonNode) node = stow_memory_report_json (&r);
      JsonObject *o = json_node_get_object (node);
      json_object_set_boolean_member (o, "fits", fits);
      json_object_set_int_member (o, "layouts_evaluated",
                                  (gint64)search->evaluated);
      json_object_set_int_member (o, "layouts_fitting",
                                  (gint64)search->fitting);
      if (fits)
        {
          /* the time model's prediction for the chosen layout */
          JsonObject *p = json_object_new ();
          json_object_set_double_member (p, "step_time_s",
                                         best->cost.step_time_s);
          json_object_set_double_member (p, "tokens_per_s",
                                         best->cost.tokens_per_s);
          json_object_set_double_member (p, "mfu", best->cost.mfu);
          json_object_set_object_member (o, "predicted", p);
        }
      if (!fits)
        json_object_set_member (o, "alternatives", json_node_ref (alt_node));
      print_json (node);
      return fits ? STOW_EXIT_OK : STOW_EXIT_NO;
    }

  g_autoptr (GString) text = g_string_new (NULL);
  char a[STOW_FORMAT_BUF], b[STOW_FORMAT_BUF], c[STOW_FORMAT_BUF],
      d[STOW_FORMAT_BUF], e[STOW_FORMAT_BUF];
  g_string_append_printf (text, "%s: %s on %s\n",
                          fits ? "FITS" : "DOES NOT FIT", po->model->name,
                          po->cluster_obj->spec);
  g_string_append_printf (
      text,
      "%s layouts evaluated: %s fit, %s out of GPU memory, %s out of host "
      "RAM or NVMe, %s invalid\n\n",
      stow_format_grouped_into (a, sizeof a, search->evaluated),
      stow_format_grouped_into (b, sizeof b, search->fitting),
      stow_format_grouped_into (c, sizeof c, search->out_of_memory),
      stow_format_grouped_into (d, sizeof d, search->host_or_nvme),
      stow_format_grouped_into (e, sizeof e, search->invalid));
  if (fits)
    g_string_append_printf (
        text,
        "Fastest layout that fits (predicted %.4g s per step, %.4g tokens/s, "
        "MFU %.1f%%; 'stowage plan' ranks the others):\n",
        best->cost.step_time_s, best->cost.tokens_per_s, 100 * best->cost.mfu);
  else
    g_string_append (text, "Closest layout (does not fit):\n");
  stow_memory_report_text (text, &r, po->explain);
  if (!fits && alts->len)
    g_string_append_printf (text, "\nWhat would fit:\n%s", alts->str);
  else if (!fits)
    g_string_append (text, "\nNo alternative found with more GPUs, a "
                           "larger GPU or LoRA/QLoRA.\n");
  fputs (text->str, stdout);
  return fits ? STOW_EXIT_OK : STOW_EXIT_NO;
}

int
stow_cmd_fit (int argc, char **argv)
{
  StowPlanOptions po = { 0 };
  int rc = run_fit (&po, argc, argv);
  stow_plan_options_clear (&po);
  return rc;
}
