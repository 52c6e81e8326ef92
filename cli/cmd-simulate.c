/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-simulate.c: `stowage simulate`: lower one layout to its step
 * program and run it on the sim backend: step time, time per stream and
 * how much of it compute does not hide, the critical path, and peak memory
 * per tier with the op at which it occurs; --trace writes Chrome
 * trace-event JSON.  (Reading a plan file is left to the plan-file work.)
 */
#include <stdio.h>
#include <string.h>

#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan-options.h"
#include "cli/report-options.h"
#include "core/json.h"
#include "core/units.h"
#include "planner/cost.h"
#include "planner/lower.h"
#include "planner/sim.h"
#include "program/backend.h"
#include "program/driver.h"
#include "reports/memory-report.h"
#include "reports/report.h"
#include "reports/sim-report.h"

/* Micro-batches x layers one simulated step may hold: about 6.5 ops each,
 * so a program of some 850,000 ops, simulated in a quarter of a second
 * and listed op by op (--json, --format csv, --trace) in a few seconds
 * and some 170 MB.  A 1024-GPU llama-65b step at global batch 4096 needs
 * 42,000. */
#define STOW_SIM_MAX_LAYER_PASSES ((guint64)1 << 17)

typedef struct
{
  StowPlanOptions po;
  char *trace, *format, *output, *plan;
  gboolean layer_major, delayed_update;
} SimOptions;

/* To -o FILE (core/json.h's writer) or standard output, or for the
 * server into the answer; @ok_code on success. */
static int
emit_output (const SimOptions *so, const char *text, int ok_code)
{
  return stow_cli_call_answer (so->po.call, so->output, text, ok_code);
}

static void
peak_json (JsonBuilder *b, const StowTrace *t, const StowProgram *p)
{
  json_builder_set_member_name (b, "peak_bytes");
  json_builder_begin_object (b);
  for (guint tier = 0; tier < STOW_N_TIERS; tier++)
    {
      stow_json_set_i64 (
          b, tier == STOW_TIER_PINNED ? "pinned_host" : stow_tier_name (tier),
          (gint64)t->peak_bytes[tier]);
    }
  json_builder_end_object (b);
  json_builder_set_member_name (b, "peak_at");
  json_builder_begin_object (b);
  for (guint tier = 0; tier < STOW_N_TIERS; tier++)
    {
      g_autofree char *what = t->peak_op[tier] != STOW_NONE
                                  ? stow_op_describe (p, t->peak_op[tier])
                                  : g_strdup ("step start (persistent state)");
      json_builder_set_member_name (
          b, tier == STOW_TIER_PINNED ? "pinned_host" : stow_tier_name (tier));
      json_builder_begin_object (b);
      stow_json_set_string (b, "op", what);
      stow_json_set_double (b, "time_s", t->peak_time_s[tier]);
      stow_json_set_i64 (b, "rank", t->peak_rank[tier]);
      json_builder_end_object (b);
    }
  json_builder_end_object (b);
}

static int
run (SimOptions *so, int argc, char **argv)
{
  StowPlanOptions *po = &so->po;
  g_autoptr (GError) error = NULL;
  const GOptionEntry entries[] = {
    { "trace", 0, 0, G_OPTION_ARG_FILENAME, &so->trace,
      "Write a Chrome trace-event JSON of the step (ui.perfetto.dev)", "FILE" },
    { "layer-major", 0, 0, G_OPTION_ARG_NONE, &so->layer_major,
      "Load each streamed layer once for all micro-batches (one stage)", NULL },
    { "delayed-update", 0, 0, G_OPTION_ARG_NONE, &so->delayed_update,
      "ZeRO-Offload's one-step delayed parameter update", NULL },
    { "plan", 0, 0, G_OPTION_ARG_FILENAME, &so->plan,
      "Simulate the layout of a plan file (stowage fit --emit plan) in "
      "place of MODEL and the layout flags",
      "FILE" },
    { "format", 0, 0, G_OPTION_ARG_STRING, &so->format,
      "text (default), json, csv (one row per op), md or html (with a "
      "Gantt chart of the step)",
      "FORMAT" },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &so->output,
      "Write to FILE (atomically) instead of standard output", "FILE" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      po->call, "simulate", "MODEL",
      "Lower one layout to its per-rank step program and run it in virtual "
      "time: step time, exposed time per stream, the critical path and peak "
      "memory per tier.  Dimensions left out are filled in as by 'mem' (as "
      "'stowage fit' chooses them).  Exit status: 0 the step stays within "
      "the device budget, 1 it exceeds it, 2 bad input.");
  stow_cli_add_entries (po->call, ctx, entries);
  stow_plan_options_add (ctx, po);
  if (!stow_cli_call_parse (po->call, ctx, "simulate", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 2)
    return stow_cli_call_failf (po->call, "see 'stowage simulate --help'",
                                "simulate: unexpected argument \"%s\"",
                                argv[2]);
  if (argc < 2 && so->plan == NULL)
    return stow_cli_call_failf (po->call, "see 'stowage simulate --help'",
                                "simulate: which model? (e.g. llama-7b, or "
                                "--plan FILE)");
  g_auto (GStrv) filled = NULL;
  StowFormat format = po->json ? STOW_FORMAT_JSON : STOW_FORMAT_TEXT;
  if (so->format
      && !stow_format_parse (so->format, "--format", &format, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  if (po->json && format != STOW_FORMAT_JSON)
    return stow_cli_call_failf (
        po->call, NULL, "--json and --format %s both given", so->format);
  if (so->plan != NULL)
    {
      /* The plan fixes model, cluster, training and layout; the loader
       * refuses any of those flags beside it. */
      StowReportOptions ro = { 0 };
      ro.plan = so->plan;
      gboolean ok = stow_report_options_load_plan (
          &ro, po, argc > 1 ? argv[1] : NULL, &error);
      ro.plan = NULL; /* borrowed from so */
      stow_report_options_clear (&ro);
      if (!ok)
        return stow_cli_call_fail (po->call, error, NULL);
      if (po->model == NULL)
        return stow_cli_call_failf (po->call, NULL,
                                    "--plan %s: the plan has no model (a "
                                    "peer convention's --params plan)",
                                    so->plan);
    }
  else
    {
      if (!stow_plan_options_resolve (po, argv[1], &error))
        return stow_cli_call_fail (po->call, error, NULL);
      if (po->model == NULL)
        return stow_cli_call_failf (po->call, NULL,
                                    "simulate needs a model: name one from "
                                    "'stowage models' or a config.json");
      filled = stow_plan_options_fill_like_fit (po);
    }

  /* The step program holds a few ops per layer per micro-batch: bound it
   * before lowering allocates it (--global-batch 1G at --seq 7 asked for
   * 125 million micro-batches and ran out of memory). */
  guint64 passes = po->plan.layout.grad_accum * (po->model->n_layers + 2);
  guint64 max_passes
      = stow_cli_call_bound (po->call, STOW_SIM_MAX_LAYER_PASSES,
                             po->call ? po->call->max_sim_passes : 0);
  if (po->plan.layout.grad_accum > max_passes || passes > max_passes)
    {
      char a[STOW_FORMAT_BUF], b[STOW_FORMAT_BUF];
      return stow_cli_call_failf (
          po->call,
          "lower --global-batch or --grad-accum, or raise --micro-batch",
          "simulate: %s micro-batches per step through %" G_GUINT64_FORMAT
          " layers: over the simulator's limit of %s micro-batch x layer "
          "passes (about 850,000 ops)",
          stow_format_grouped_into (a, sizeof a, po->plan.layout.grad_accum),
          po->model->n_layers,
          stow_format_grouped_into (b, sizeof b, max_passes));
    }

  po->plan.lower.layer_major = so->layer_major;
  po->plan.lower.delayed_update = so->delayed_update;

  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (StowProgram) prog = stow_lower (&po->plan, &error);
  if (prog == NULL)
    return stow_cli_call_fail (po->call, error, NULL);
  g_autoptr (StowBackend) sim = stow_backend_sim_new (&po->plan, NULL);
  g_autoptr (StowTrace) tr = stow_program_run (prog, sim, &error);
  if (tr == NULL)
    return stow_cli_call_fail (po->call, error, NULL);
  double wall = (double)(g_get_monotonic_time () - t0) / 1e6;
  /* The planner's closed-form step for the same layout, side by side. */
  StowCostOptions co;
  stow_cost_options_init (&co);
  co.delayed_update = po->plan.lower.delayed_update;
  StowCost cost;
  stow_cost_estimate (&po->plan, &co, &cost);

  /* As fit: 1 when the step does not fit the device budget. */
  gboolean exceeded
      = tr->peak_bytes[STOW_TIER_DEVICE] > prog->device_capacity_bytes;
  int rc = exceeded ? STOW_EXIT_NO : STOW_EXIT_OK;
  g_autofree char *note
      = stow_memory_report_filled_note ((const char *const *)filled);

  if (so->trace)
    {
      g_autofree char *js = stow_trace_to_chrome_json (tr, prog);
      if (!stow_file_write_atomic (so->trace, js, -1, &error))
        return stow_cli_call_fail (po->call, error, NULL);
    }

  if (format == STOW_FORMAT_CSV || format == STOW_FORMAT_MD
      || format == STOW_FORMAT_HTML)
    {
      g_autoptr (GString) t = g_string_new (NULL);
      g_autofree char *title = g_strdup_printf ("%s on %s", po->model->name,
                                                po->cluster_obj->spec);
      if (format == STOW_FORMAT_CSV)
        stow_report_sim_csv (t, tr, prog);
      else if (format == STOW_FORMAT_MD)
        stow_report_sim_md (t, tr, prog, title);
      else
        stow_report_sim_html (t, tr, prog, title);
      return emit_output (so, t->str, rc);
    }
  if (format == STOW_FORMAT_JSON)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_string (b, "program", prog->description);
      if (filled)
        {
          json_builder_set_member_name (b, "filled_like_fit");
          json_builder_begin_array (b);
          for (guint i = 0; filled[i]; i++)
            json_builder_add_string_value (b, filled[i]);
          json_builder_end_array (b);
        }
      stow_json_set_bool (b, "exceeded", exceeded);
      stow_json_set_double (b, "step_time_s", tr->step_time_s);
      stow_json_set_double (b, "predicted_step_time_s", cost.step_time_s);
      json_builder_set_member_name (b, "exposed_s");
      json_builder_begin_object (b);
      for (guint s = 0; s < STOW_N_STREAMS; s++)
        {
          stow_json_set_double (b, stow_stream_name (s), tr->exposed_s[s]);
        }
      json_builder_end_object (b);
      json_builder_set_member_name (b, "busy_s");
      json_builder_begin_object (b);
      for (guint s = 0; s < STOW_N_STREAMS; s++)
        {
          stow_json_set_double (b, stow_stream_name (s), tr->busy_s[s]);
        }
      json_builder_end_object (b);
      peak_json (b, tr, prog);
      stow_json_set_i64 (b, "device_budget_bytes",
                         (gint64)prog->device_capacity_bytes);
      stow_json_set_i64 (b, "resident_layers", prog->resident_layers);
      stow_json_set_i64 (b, "streamed_layers", prog->streamed_layers);
      stow_json_set_i64 (b, "ranks", prog->n_ranks);
      stow_json_set_i64 (b, "n_ops", prog->ops->len);
      /* Every op that takes time, in program order (allocs and frees are
       * in the memory peaks and the trace's counters). */
      json_builder_set_member_name (b, "ops");
      json_builder_begin_array (b);
      for (guint i = 0; i < prog->ops->len; i++)
        {
          const StowOp *op = &g_array_index (prog->ops, StowOp, i);
          if (op->kind == STOW_OP_ALLOC || op->kind == STOW_OP_FREE)
            continue;
          g_autofree char *what = stow_op_describe (prog, i);
          json_builder_begin_object (b);
          stow_json_set_string (b, "op", what);
          stow_json_set_string (b, "kind", stow_op_kind_name (op->kind));
          stow_json_set_string (b, "stream", stow_stream_name (op->stream));
          stow_json_set_i64 (b, "rank", op->rank);
          stow_json_set_double (b, "start_s", tr->ops[i].start_s);
          stow_json_set_double (b, "end_s", tr->ops[i].end_s);
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      stow_json_set_double (b, "simulated_in_s", wall);
      json_builder_end_object (b);
      g_autoptr (JsonNode) root = json_builder_get_root (b);
      g_autofree char *s = stow_json_to_string (root, TRUE);
      return emit_output (so, s, rc);
    }

  g_autoptr (GString) out = g_string_new (NULL);
  g_string_append_printf (out, "%s\n", prog->description);
  if (note)
    g_string_append_printf (out, "filled: %s\n", note);
  g_autofree char *host = stow_report_host_line (po->cluster_obj);
  g_string_append_printf (out, "host: %s\n", host);
  g_string_append_printf (out,
                          "step time: %.4f s  (%u ranks, %u ops, simulated "
                          "in %.3f s)\n",
                          tr->step_time_s, prog->n_ranks, prog->ops->len, wall);
  g_string_append_printf (
      out,
      "time model: %.4f s per step (simulated / "
      "predicted %.3f)\n",
      cost.step_time_s,
      cost.step_time_s > 0 ? tr->step_time_s / cost.step_time_s : 0.0);
  g_string_append_printf (out, "streams (rank %u): busy / exposed\n",
                          tr->critical_rank);
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (tr->busy_s[s] > 0)
      g_string_append_printf (out, "  %-10s %10.4f s %10.4f s\n",
                              stow_stream_name (s), tr->busy_s[s],
                              tr->exposed_s[s]);
  g_string_append (out, "critical path:\n");
  stow_trace_critical_summary (tr, prog, out, 6);
  g_string_append (out, "peak memory (per GPU / its host share):\n");
  for (guint tier = 0; tier < STOW_N_TIERS; tier++)
    {
      if (tr->peak_bytes[tier] == 0)
        continue;
      g_autofree char *b = stow_format_bytes (tr->peak_bytes[tier]);
      g_autofree char *what = tr->peak_op[tier] != STOW_NONE
                                  ? stow_op_describe (prog, tr->peak_op[tier])
                                  : g_strdup ("step start (persistent state)");
      g_string_append_printf (out, "  %-11s %12s  at %.4f s, %s\n",
                              stow_tier_name (tier), b, tr->peak_time_s[tier],
                              what);
    }
  g_autofree char *budget = stow_format_bytes (prog->device_capacity_bytes);
  g_string_append_printf (out,
                          "device tensor budget: %s (capacity less context, "
                          "workspaces, NCCL and allocator slack)%s\n",
                          budget, exceeded ? "  EXCEEDED" : "");
  return emit_output (so, out->str, rc);
}

int
stow_simulate_run (StowCliCall *call, int argc, char **argv)
{
  SimOptions so = { .po.call = call };
  int rc = run (&so, argc, argv);
  stow_plan_options_clear (&so.po);
  g_free (so.trace);
  g_free (so.format);
  g_free (so.output);
  g_free (so.plan);
  return rc;
}

int
stow_cmd_simulate (int argc, char **argv)
{
  return stow_simulate_run (NULL, argc, argv);
}
