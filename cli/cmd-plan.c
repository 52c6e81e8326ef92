/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-plan.c: `stowage plan MODEL --gpus SPEC`: every layout the flags
 * leave open, pruned by memory and ranked by the time model's predicted
 * throughput; a table (or JSON) of the best, the counts of what was
 * rejected and why, and with --explain what dominates the winner and what
 * the runner-up trades.
 */
#include <stdio.h>
#include <string.h>

#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan-options.h"
#include "core/json.h"
#include "core/units.h"
#include "planner/cost.h"
#include "reports/memory-report.h"
#include "reports/plan-report.h"
#include "reports/report.h"

typedef struct
{
  StowPlanOptions po;
  char *top, *format, *output;
  gboolean cross_node_tp, delayed_update;
} PlanArgs;

/* Writes @text to -o FILE (atomically: a temporary, then rename) or to
 * standard output, or for the server into the answer; returns @ok_code, or
 * STOW_EXIT_FAILURE after saying why it could not be written. */
static int
emit_output (const PlanArgs *a, const char *text, int ok_code)
{
  return stow_cli_call_answer (a->po.call, a->output, text, ok_code);
}

/* "tp 8 pp 8/3 dp 1 z1 mb 1x64 sel" */
static char *
compact_layout (const StowLayout *l)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "tp%u", l->tp);
  if (l->sp)
    g_string_append (s, "+sp");
  g_string_append_printf (s, " pp%u", l->pp);
  if (l->vpp > 1)
    g_string_append_printf (s, "/v%u", l->vpp);
  if (l->pp_split_ends)
    g_string_append (s, "+ends");
  g_string_append_printf (s, " dp%u", l->dp);
  if (l->cp > 1)
    g_string_append_printf (s, " cp%u", l->cp);
  if (l->ep > 1)
    g_string_append_printf (s, " ep%u", l->ep);
  if (stow_layout_etp (l) != l->tp)
    g_string_append_printf (s, " etp%u", stow_layout_etp (l));
  g_string_append_printf (s, " z%u%s", l->zero, l->hybrid_shard ? "h" : "");
  g_string_append_printf (s, " mb%" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT,
                          l->micro_batch, l->grad_accum);
  if (l->recompute == STOW_RECOMPUTE_FULL && l->recompute_layers)
    g_string_append_printf (s, " rc:full:%u", l->recompute_layers);
  else if (l->recompute == STOW_RECOMPUTE_FULL)
    g_string_append (s, " rc:full");
  else if (l->recompute == STOW_RECOMPUTE_SELECTIVE)
    g_string_append (s, " rc:sel");
  else if (l->recompute == STOW_RECOMPUTE_OP)
    g_string_append (s, " rc:op");
  if (l->offload_optimizer != STOW_OFFLOAD_NONE)
    g_string_append_printf (s, " opt:%s",
                            stow_offload_name (l->offload_optimizer));
  if (l->offload_params != STOW_OFFLOAD_NONE)
    g_string_append_printf (s, " par:%s",
                            stow_offload_name (l->offload_params));
  if (l->offload_activations)
    g_string_append (s, " ckpt:cpu");
  return g_string_free (s, FALSE);
}

static void
add_costs (JsonBuilder *b, const char *name, const double *v)
{
  json_builder_set_member_name (b, name);
  json_builder_begin_object (b);
  for (int k = 0; k < STOW_N_COSTS; k++)
    {
      stow_json_set_double (b, stow_cost_kind_name (k), v[k]);
    }
  json_builder_end_object (b);
}

/* The winner's terms, exposed and total, largest first. */
static void
explain_terms (GString *s, const StowCost *c)
{
  int order[STOW_N_COSTS];
  for (int k = 0; k < STOW_N_COSTS; k++)
    order[k] = k;
  for (int i = 1; i < STOW_N_COSTS; i++)
    for (int j = i;
         j > 0 && c->exposed_s[order[j]] > c->exposed_s[order[j - 1]]; j--)
      {
        int t = order[j];
        order[j] = order[j - 1];
        order[j - 1] = t;
      }
  g_string_append (s, "  term            exposed s   total s   share\n");
  for (int i = 0; i < STOW_N_COSTS; i++)
    {
      int k = order[i];
      if (c->total_s[k] <= 0)
        continue;
      g_string_append_printf (
          s, "  %-14s %10.4g %9.4g %6.1f%%%s\n", stow_cost_kind_name (k),
          c->exposed_s[k], c->total_s[k],
          100.0 * c->exposed_s[k] / c->step_time_s,
          c->exposed_s[k] < c->total_s[k] * 0.999 ? "  (partly hidden)" : "");
    }
}

static int
run_plan (PlanArgs *a, int argc, char **argv)
{
  StowPlanOptions *po = &a->po;
  g_autoptr (GError) error = NULL;
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      po->call, "plan", "MODEL",
      "Every layout of MODEL on these GPUs (tp, pp, vpp, cp, ep, dp, ZeRO "
      "stage, offload, recomputation, micro-batch) that the flags leave "
      "open, pruned by memory and ranked by predicted throughput.  Layout "
      "flags pin a dimension.  Exit status: 0 a layout fits, 1 none does, "
      "2 bad input.");
  const GOptionEntry extra[] = {
    { "top", 0, 0, G_OPTION_ARG_STRING, &a->top,
      "Show the N fastest layouts (default 10)", "N" },
    { "allow-cross-node-tp", 0, 0, G_OPTION_ARG_NONE, &a->cross_node_tp,
      "Let tensor parallelism leave the NVLink domain", NULL },
    { "delayed-update", 0, 0, G_OPTION_ARG_NONE, &a->delayed_update,
      "Offloaded optimizer: one-step delayed parameter update", NULL },
    { "format", 0, 0, G_OPTION_ARG_STRING, &a->format,
      "text (default), json, csv, md or html", "FORMAT" },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &a->output,
      "Write to FILE (atomically) instead of standard output", "FILE" },
    { NULL },
  };
  stow_plan_options_add (ctx, po);
  stow_cli_add_entries (po->call, ctx, extra);
  if (!stow_cli_call_parse (po->call, ctx, "plan", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 2)
    return stow_cli_call_failf (po->call, "see 'stowage plan --help'",
                                "plan: unexpected argument \"%s\"", argv[2]);
  guint64 top = 10;
  guint64 max_top = stow_cli_call_bound (po->call, 100000,
                                         po->call ? po->call->max_top : 0);
  if (a->top
      && !g_ascii_string_to_unsigned (a->top, 10, 1, max_top, &top, NULL))
    return stow_cli_call_failf (po->call, NULL,
                                "--top \"%s\": expected a whole number from 1 "
                                "to %" G_GUINT64_FORMAT,
                                a->top, max_top);
  StowFormat format = po->json ? STOW_FORMAT_JSON : STOW_FORMAT_TEXT;
  if (a->format && !stow_format_parse (a->format, "--format", &format, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (po->json && format != STOW_FORMAT_JSON)
    return stow_cli_call_failf (po->call, NULL,
                                "--json and --format %s both given", a->format);
  if (!stow_plan_options_resolve (po, argc > 1 ? argv[1] : NULL, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (po->model == NULL)
    return stow_cli_call_failf (po->call, NULL,
                                "plan needs a model: name one from "
                                "'stowage models' or a config.json");
  if (po->plan.mem.convention != STOW_CONVENTION_STOWAGE)
    return stow_cli_call_failf (po->call, "use 'stowage mem --convention ...'",
                                "plan uses stowage's own memory model");
  stow_plan_options_default_layout (po);

  StowCostOptions co;
  stow_cost_options_init (&co);
  co.delayed_update = a->delayed_update;
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = (guint)top;
  so.allow_cross_node_tp = a->cross_node_tp;
  so.cost = &co;
  /* --explain compares the winner with the runner-up. */
  if (po->explain && so.max_keep < 2)
    so.max_keep = 2;
  g_autoptr (StowSearch) s = stow_search_run (&po->plan, po->pins, &so);
  guint shown = MIN (s->fits->len, (guint)top);

  /* Everything pinned and nothing valid: say why that layout is invalid. */
  /* Nothing passed the divisibility rules: the defaults of the layout
   * show which rule (a pinned flag, or the global batch). */
  if (s->evaluated == 0)
    {
      if (!stow_layout_validate (&po->plan.layout, &po->plan.training,
                                 po->model, po->cluster_obj, &error))
        return stow_cli_call_fail (
            po->call, error,
            strstr (error->message, "--global-batch")
                ? "no layout divides the batch: --global-batch must "
                  "be a multiple of dp x micro-batch, dp = GPUs / (tp "
                  "x pp x cp)"
                : "no layout is valid (the dimensions left open were "
                  "searched too)");
      return stow_cli_call_failf (
          po->call, NULL,
          "no valid layout of %s on %s: all %" G_GUINT64_FORMAT
          " combinations break a divisibility rule",
          po->model->name, po->cluster_obj->spec, s->invalid);
    }
  if (s->fitting == 0 && !s->have_miss)
    return stow_plan_options_fail_no_layout (po);

  int found = s->fitting ? STOW_EXIT_OK : STOW_EXIT_NO;
  if (format == STOW_FORMAT_CSV || format == STOW_FORMAT_MD)
    {
      g_autoptr (GString) t = g_string_new (NULL);
      if (format == STOW_FORMAT_CSV)
        stow_report_plan_csv (t, s, (guint)top);
      else
        stow_report_plan_md (t, s, po->model->name, po->cluster_obj->spec,
                             (guint)top);
      return emit_output (a, t->str, found);
    }
  if (format == STOW_FORMAT_HTML)
    {
      /* The report page of the fastest layout (or the closest miss), its
       * candidates charted memory against predicted throughput. */
      const StowLayout *chosen
          = s->fits->len ? &g_array_index (s->fits, StowCandidate, 0).layout
                         : &s->best_miss.layout;
      StowPlan plan = po->plan;
      plan.layout = *chosen;
      g_autoptr (StowMemory) mem = stow_memory_estimate (&plan, &error);
      if (mem == NULL)
        return stow_cli_call_fail (po->call, error, NULL);
      g_autofree double *tput = g_new0 (double, MAX (s->fits->len, 1));
      for (guint i = 0; i < s->fits->len; i++)
        tput[i] = g_array_index (s->fits, StowCandidate, i).cost.tokens_per_s;
      StowReport r = { { po->model, po->cluster_obj, &po->plan.training, chosen,
                         &po->plan.mem, mem },
                       "plan",
                       s,
                       s->fits->len > 0,
                       tput,
                       s->fits->len,
                       NULL };
      g_autoptr (GString) t = g_string_new (NULL);
      stow_report_html (t, &r);
      return emit_output (a, t->str, found);
    }
  if (format == STOW_FORMAT_JSON)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "version", STOW_JSON_VERSION);
      stow_json_set_string (b, "model", po->model->name);
      stow_json_set_string (b, "gpus", po->cluster_obj->spec);
      stow_json_set_i64 (b, "n_gpus", po->cluster_obj->n_gpus);
      stow_json_set_i64 (b, "candidates_evaluated", (gint64)s->evaluated);
      stow_json_set_i64 (b, "fitting", (gint64)s->fitting);
      stow_json_set_i64 (b, "out_of_memory", (gint64)s->out_of_memory);
      stow_json_set_i64 (b, "out_of_host_or_nvme", (gint64)s->host_or_nvme);
      stow_json_set_i64 (b, "invalid", (gint64)s->invalid);
      stow_json_set_i64 (b, "same_as_lower_zero",
                         (gint64)s->same_as_lower_zero);
      stow_json_set_double (b, "search_time_s", s->search_time_s);
      json_builder_set_member_name (b, "plans");
      json_builder_begin_array (b);
      for (guint i = 0; i < shown; i++)
        {
          const StowCandidate *c = &g_array_index (s->fits, StowCandidate, i);
          json_builder_begin_object (b);
          stow_json_set_i64 (b, "rank", i + 1);
          json_builder_set_member_name (b, "layout");
          json_builder_add_value (
              b, stow_layout_to_json (&c->layout, &po->plan.training));
          stow_json_set_i64 (b, "total_bytes", (gint64)c->total_bytes);
          stow_json_set_i64 (b, "headroom_bytes", c->headroom_bytes);
          stow_json_set_double (b, "step_time_s", c->cost.step_time_s);
          stow_json_set_double (b, "tokens_per_s", c->cost.tokens_per_s);
          stow_json_set_double (b, "tokens_per_s_per_gpu",
                                c->cost.tokens_per_s_per_gpu);
          stow_json_set_double (b, "tflops_per_gpu", c->cost.tflops_per_gpu);
          stow_json_set_double (b, "hw_tflops_per_gpu",
                                c->cost.hw_tflops_per_gpu);
          stow_json_set_double (b, "mfu", c->cost.mfu);
          stow_json_set_double (b, "hfu", c->cost.hfu);
          stow_json_set_string (
              b, "dominant", stow_cost_kind_name (c->cost.dominant_overhead));
          add_costs (b, "exposed_s", c->cost.exposed_s);
          add_costs (b, "total_s", c->cost.total_s);
          if (po->explain && i + 1 < s->fits->len)
            {
              const StowCandidate *n
                  = &g_array_index (s->fits, StowCandidate, i + 1);
              g_autoptr (GString) e = g_string_new (NULL);
              stow_cost_explain_difference (e, &c->layout, &c->cost, &n->layout,
                                            &n->cost);
              stow_json_set_string (b, "versus_next", e->str);
            }
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      json_builder_end_object (b);
      g_autoptr (JsonNode) root = json_builder_get_root (b);
      g_autofree char *text = stow_json_to_string (root, TRUE);
      return emit_output (a, text, found);
    }

  g_autoptr (GString) out = g_string_new (NULL);
  g_string_append_printf (out, "%s on %s: seq %" G_GUINT64_FORMAT,
                          po->model->name, po->cluster_obj->spec,
                          po->plan.training.seq_len);
  if (po->plan.training.global_batch)
    g_string_append_printf (out, ", global batch %" G_GUINT64_FORMAT "\n",
                            po->plan.training.global_batch);
  else
    g_string_append (out, ", no --global-batch (micro-batch 1, "
                          "accumulation = pp)\n");
  g_autofree char *host = stow_report_host_line (po->cluster_obj);
  g_string_append_printf (out, "host: %s\n", host);
  stow_report_search_counts (out, s, s->search_time_s);
  g_string_append (out, "\n\n");
  if (shown == 0)
    {
      g_string_append (out, "No layout fits.");
      if (s->have_miss)
        {
          g_autofree char *d = compact_layout (&s->best_miss.layout);
          g_autofree char *tot = stow_format_bytes (s->best_miss.total_bytes);
          g_string_append_printf (out, "  Closest: %s needs %s per GPU.", d,
                                  tot);
        }
      g_string_append (out, "  See 'stowage fit' for what would fit.\n");
      return emit_output (a, out->str, STOW_EXIT_NO);
    }
  g_string_append_printf (out, "%3s  %-44s %10s %10s %9s %12s %6s  %s\n", "#",
                          "layout", "per GPU", "headroom", "step s", "tokens/s",
                          "MFU", "dominant overhead");
  for (guint i = 0; i < shown; i++)
    {
      const StowCandidate *c = &g_array_index (s->fits, StowCandidate, i);
      g_autofree char *d = compact_layout (&c->layout);
      char tot[STOW_FORMAT_BUF], head[STOW_FORMAT_BUF], tok[STOW_FORMAT_BUF];
      stow_format_bytes_into (tot, sizeof tot, c->total_bytes);
      stow_format_bytes_into (head, sizeof head,
                              (guint64)MAX (c->headroom_bytes, 0));
      stow_format_grouped_into (tok, sizeof tok,
                                (guint64)(c->cost.tokens_per_s + 0.5));
      StowCostKind k = c->cost.dominant_overhead;
      g_string_append_printf (
          out, "%3u  %-44s %10s %10s %9.4g %12s %5.1f%%  %s %.3g s (%.0f%%)\n",
          i + 1, d, tot, head, c->cost.step_time_s, tok, 100 * c->cost.mfu,
          stow_cost_kind_name (k), c->cost.exposed_s[k],
          100 * c->cost.exposed_s[k] / c->cost.step_time_s);
    }
  if (po->explain)
    {
      const StowCandidate *w = &g_array_index (s->fits, StowCandidate, 0);
      g_autofree char *d = stow_layout_describe (&w->layout);
      g_string_append_printf (
          out,
          "\nBest: %s\n  %.4g s per step, %.4g TFLOP/s per GPU of model "
          "FLOPs (%.4g with recomputation), MFU %.1f%%, HFU %.1f%%\n",
          d, w->cost.step_time_s, w->cost.tflops_per_gpu,
          w->cost.hw_tflops_per_gpu, 100 * w->cost.mfu, 100 * w->cost.hfu);
      g_string_append_printf (out,
                              "  dominant term: %s; largest overhead: %s\n",
                              stow_cost_kind_name (w->cost.dominant),
                              stow_cost_kind_name (w->cost.dominant_overhead));
      explain_terms (out, &w->cost);
      for (guint i = 1; i < MIN (s->fits->len, 3); i++)
        {
          const StowCandidate *n = &g_array_index (s->fits, StowCandidate, i);
          g_autoptr (GString) e = g_string_new (NULL);
          stow_cost_explain_difference (e, &w->layout, &w->cost, &n->layout,
                                        &n->cost);
          g_string_append_printf (
              out, "\nversus #%u (%.1f%% slower): %s\n", i + 1,
              100.0 * (n->cost.step_time_s / w->cost.step_time_s - 1.0),
              e->str);
        }
    }
  return emit_output (a, out->str, STOW_EXIT_OK);
}

int
stow_plan_run (StowCliCall *call, int argc, char **argv)
{
  PlanArgs a;
  memset (&a, 0, sizeof a);
  a.po.call = call;
  int rc = run_plan (&a, argc, argv);
  g_free (a.top);
  g_free (a.format);
  g_free (a.output);
  stow_plan_options_clear (&a.po);
  return rc;
}

int
stow_cmd_plan (int argc, char **argv)
{
  return stow_plan_run (NULL, argc, argv);
}
