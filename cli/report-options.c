/* SPDX-License-Identifier: MIT
 *
 * cli/report-options.c: output formats, files, charts, engine configs and
 * plan files for the planning commands.
 */
#include "cli/report-options.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/json.h"
#include "core/units.h"
#include "planner/plan-file.h"
#include "reports/chart.h"
#include "reports/memory-report.h"

void
stow_report_options_add (GOptionContext *ctx, StowReportOptions *ro,
                         StowCliCall *call)
{
  const GOptionEntry entries[] = {
    { "format", 0, 0, G_OPTION_ARG_STRING, &ro->format,
      "text (default), json, csv, md or html", "FMT" },
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &ro->output,
      "Write to FILE (atomically) instead of stdout", "FILE" },
    { "chart", 0, 0, G_OPTION_ARG_FILENAME, &ro->chart,
      "Write the memory chart to FILE.svg, .png or .pdf", "FILE" },
    { "emit", 0, 0, G_OPTION_ARG_STRING, &ro->emit,
      "A config for the layout: deepspeed, megatron, fsdp, accelerate or "
      "plan",
      "ENGINE" },
    { "nvme-path", 0, 0, G_OPTION_ARG_FILENAME, &ro->nvme_path,
      "Directory for NVMe swap files in emitted configs", "DIR" },
    { "plan", 0, 0, G_OPTION_ARG_FILENAME, &ro->plan,
      "Read the model, cluster and layout from a plan file", "FILE" },
    { NULL },
  };
  stow_cli_add_entries (call, ctx, entries);
}

gboolean
stow_report_options_resolve (StowReportOptions *ro, const StowPlanOptions *po,
                             GError **error)
{
  ro->format_v = po->json ? STOW_FORMAT_JSON : STOW_FORMAT_TEXT;
  if (ro->format)
    {
      if (!stow_format_parse (ro->format, "--format", &ro->format_v, error))
        return FALSE;
      if (po->json && ro->format_v != STOW_FORMAT_JSON)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "--json and --format %s both given; use one",
                       ro->format);
          return FALSE;
        }
    }
  if (ro->emit)
    {
      if (!stow_emit_kind_parse (ro->emit, "--emit", &ro->emit_v, error))
        return FALSE;
      ro->have_emit = TRUE;
      if (ro->format)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "--emit %s writes a config, not a report; drop "
                       "--format %s",
                       ro->emit, ro->format);
          return FALSE;
        }
    }
  if (ro->chart && !stow_chart_available ())
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--chart %s: this stowage was built without cairo, so it "
                   "draws no charts (install libcairo2-dev and reconfigure)",
                   ro->chart);
      return FALSE;
    }
  return TRUE;
}

/* The engine as the emitted config's users know it. */
static const char *
engine_title (StowEngine e)
{
  switch (e)
    {
    case STOW_ENGINE_DEEPSPEED:
      return "DeepSpeed";
    case STOW_ENGINE_MEGATRON:
      return "Megatron-LM";
    case STOW_ENGINE_NEMO:
      return "NeMo";
    case STOW_ENGINE_FSDP:
      return "FSDP";
    case STOW_ENGINE_PYTORCH:
      return "plain PyTorch";
    case STOW_ENGINE_STOWAGE:
      break;
    }
  return "stowage";
}

/* The search's filter: layouts the --emit config can express. */
static gboolean
emit_accepts (const StowPlan *candidate, gpointer data)
{
  const StowEmitKind *kind = data;
  return stow_emit_check (*kind, candidate->model, candidate->cluster,
                          &candidate->training, &candidate->layout, NULL);
}

gboolean
stow_report_options_plan_engine (StowReportOptions *ro, StowPlanOptions *po,
                                 GError **error)
{
  if (!ro->have_emit || ro->emit_v == STOW_EMIT_PLAN)
    return TRUE;
  const char *kind = stow_emit_kind_name (ro->emit_v);
  guint engines = stow_emit_kind_engines (ro->emit_v);
  StowEngine given = po->plan.layout.engine;
  gboolean runs_given = (engines & (1u << given)) != 0;
  if (ro->plan != NULL && !runs_given)
    {
      g_set_error (
          error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
          "--emit %s: %s was planned with %s's memory model "
          "(engine %s), which the config would not run under; "
          "write the plan with --engine %s, or use --emit %s "
          "without --plan",
          kind, ro->plan, engine_title (given), stow_engine_name (given),
          ro->emit_v == STOW_EMIT_ACCELERATE ? "deepspeed, fsdp or megatron"
                                             : kind,
          kind);
      return FALSE;
    }
  if (po->engine != NULL && !runs_given)
    {
      if (ro->emit_v == STOW_EMIT_ACCELERATE)
        g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                     "--emit accelerate runs under DeepSpeed, FSDP or "
                     "Megatron-LM (plain PyTorch on one GPU), and plans with "
                     "their memory models; --engine %s asks for %s's: drop "
                     "--engine, or give deepspeed, fsdp or megatron",
                     stow_engine_name (given), engine_title (given));
      else
        g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                     "--emit %s plans with %s's memory model, and --engine %s "
                     "asks for %s's: drop --engine, or give --engine %s",
                     kind,
                     engine_title ((StowEngine)g_bit_nth_lsf (engines, -1)),
                     stow_engine_name (given), engine_title (given), kind);
      return FALSE;
    }
  /* A plan file or --engine fixes the engine; otherwise the config's
   * engines are searched (one, or accelerate's several). */
  if (ro->plan != NULL || po->engine != NULL)
    engines = 1u << given;
  else if ((engines & (engines - 1)) == 0)
    po->plan.layout.engine = (StowEngine)g_bit_nth_lsf (engines, -1);
  po->search_engines = engines;
  po->search_accept = emit_accepts;
  po->search_accept_data = &ro->emit_v;
  return TRUE;
}

int
stow_report_options_fail_no_layout (const StowReportOptions *ro,
                                    const StowPlanOptions *po)
{
  g_autoptr (GError) error = NULL;
  if (ro->have_emit && po->model != NULL
      && !stow_emit_check (ro->emit_v, po->model, po->cluster_obj,
                           &po->plan.training, &po->plan.layout, &error))
    return stow_cli_call_fail (po->call, error, NULL);
  return stow_plan_options_fail_no_layout (po);
}

gboolean
stow_report_options_load_plan (StowReportOptions *ro, StowPlanOptions *po,
                               const char *model_arg, GError **error)
{
  /* The plan is the whole question; a flag beside it would be ignored or
   * would silently change the answer.  (The optimizer's flags, which
   * change neither memory nor time, go over the plan's settings.) */
  struct
  {
    const char *flag;
    const void *set;
  } flags[] = {
    { "MODEL", model_arg },
    { "--gpus", po->gpus },
    { "--cluster", po->cluster },
    { "--host-ram", po->host_ram },
    { "--nvme", po->nvme },
    { "--dp", po->dp },
    { "--tp", po->tp },
    { "--pp", po->pp },
    { "--vpp", po->vpp },
    { "--cp", po->cp },
    { "--ep", po->ep },
    { "--etp", po->etp },
    { "--zero", po->zero },
    { "--offload-optimizer", po->offload_optimizer },
    { "--offload-params", po->offload_params },
    { "--offload-activations", po->offload_activations },
    { "--recompute", po->recompute },
    { "--micro-batch", po->micro_batch },
    { "--global-batch", po->global_batch },
    { "--grad-accum", po->grad_accum },
    { "--seq", po->seq },
    { "--decoder-seq", po->decoder_seq },
    { "--precision", po->precision },
    { "--optimizer", po->optimizer },
    { "--finetune", po->finetune },
    { "--lora-rank", po->lora_rank },
    { "--engine", po->engine },
    { "--schedule", po->schedule },
    { "--convention", po->convention },
    { "--params", po->params },
    { "--largest-layer", po->largest_layer },
    { "--zero-init", po->zero_init },
    { "--context-memory", po->context },
    { "--fragmentation", po->fragmentation },
    { "--nccl-reserve", po->nccl },
    { "--safety-margin", po->margin },
    { "--lora-targets", po->lora_targets },
    { "--workspace-memory", po->workspace },
    { "--host-process-memory", po->host_process },
    { "--cpu-optimizer-buffers", po->cpu_opt_buffers },
    { "--free-grads", po->free_grads },
    { "--reduce-bucket", po->reduce_bucket },
    { "--prefetch-bucket", po->prefetch_bucket },
    { "--max-reuse-distance", po->reuse_distance },
    { "--overlap-comm", po->overlap_comm ? "" : NULL },
    { "--optimizer-in-backward", po->opt_in_bwd ? "" : NULL },
    { "--compile", po->compile ? "" : NULL },
    { "--sp", po->sp ? "" : NULL },
    { "--no-sp", po->no_sp ? "" : NULL },
    { "--pp-split-ends", po->pp_split_ends ? "" : NULL },
    { "--no-flash", po->no_flash ? "" : NULL },
    { "--chunked-loss", po->chunked_loss ? "" : NULL },
    { "--fused-loss", po->fused_loss ? "" : NULL },
    { "--dropout", po->dropout ? "" : NULL },
    { "--lora-dropout", po->lora_dropout ? "" : NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (flags); i++)
    if (flags[i].set != NULL)
      {
        g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                     "--plan %s: %s cannot be combined with a plan file (the "
                     "plan fixes the model, cluster and layout)",
                     ro->plan, flags[i].flag);
        return FALSE;
      }
  g_autoptr (StowPlanFile) plan = stow_plan_file_read (ro->plan, error);
  if (plan == NULL)
    return FALSE;
  po->model = plan->model ? stow_model_ref (plan->model) : NULL;
  po->cluster_obj = stow_cluster_ref (plan->cluster);
  stow_plan_init (&po->plan, po->model, po->cluster_obj);
  po->plan.training = plan->training;
  po->plan.layout = plan->layout;
  po->plan.mem = plan->mem_options;
  /* The optimizer's settings change no byte or second of the plan: the
   * flags given replace the plan's (as `train --plan` takes them). */
  if (!stow_optim_flags_apply (&po->optim, &po->plan.training.optim, error))
    return FALSE;
  po->pins = (StowPins)((STOW_PIN_SCHEDULE << 1) - 1);
  g_autofree char *warning = NULL;
  if (!stow_training_check_gpu (&po->plan.training, &po->cluster_obj->node.gpu,
                                &warning, error))
    return FALSE;
  if (warning != NULL)
    g_warning ("%s", warning);
  ro->plan_device_bytes = plan->predicted_device_bytes;
  ro->plan_host_bytes = plan->predicted_host_bytes;
  ro->plan_nvme_bytes = plan->predicted_nvme_bytes;
  return TRUE;
}

void
stow_report_options_check_plan (const StowReportOptions *ro,
                                const StowMemory *mem)
{
  if (ro->plan == NULL || ro->plan_device_bytes == 0)
    return;
  if (ro->plan_device_bytes != mem->total_bytes
      || ro->plan_host_bytes != mem->host_total_bytes
      || ro->plan_nvme_bytes != mem->nvme_bytes)
    fprintf (stderr,
             "stowage: warning: %s predicted %" G_GUINT64_FORMAT
             " B per GPU, %" G_GUINT64_FORMAT " B host, %" G_GUINT64_FORMAT
             " B NVMe; this stowage computes %" G_GUINT64_FORMAT
             ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
             " (the memory model changed since the plan was written)\n",
             ro->plan, ro->plan_device_bytes, ro->plan_host_bytes,
             ro->plan_nvme_bytes, mem->total_bytes, mem->host_total_bytes,
             mem->nvme_bytes);
}

int
stow_report_options_finish (StowReportOptions *ro, StowPlanOptions *po,
                            const StowReport *report, const char *text,
                            JsonNode *json, int ok_code)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *data = NULL;

  if (ro->chart && !stow_chart_write (ro->chart, report, &error))
    return stow_cli_call_fail (po->call, error, NULL);

  if (ro->have_emit)
    {
      const StowMemory *mem = report->mem.memory;
      if (report->search && !report->fits)
        {
          /* Searched with the config's own engines: say under which, how
           * close the nearest layout came and what would fit. */
          g_autofree char *d = stow_layout_describe (report->mem.layout);
          g_autofree char *need = stow_format_bytes (mem->total_bytes);
          g_autofree char *have = stow_format_bytes (mem->capacity_bytes);
          const char *kind = stow_emit_kind_name (ro->emit_v);
          g_autofree char *msg = g_strdup_printf (
              "no layout fits, so there is nothing to emit for %s (searched "
              "with %s's memory model; closest: %s, %s per GPU of %s "
              "usable%s)",
              kind,
              ro->emit_v == STOW_EMIT_ACCELERATE
                  ? "DeepSpeed's, FSDP's and Megatron-LM"
                  : engine_title (report->mem.layout->engine),
              d, need, have,
              mem->fits_device ? ", but not the host RAM or NVMe" : "");
          /* One larger GPU is enough to make the point; 'fit' without
           * --emit lists them all. */
          g_autoptr (GPtrArray) hints = g_ptr_array_new_with_free_func (g_free);
          guint larger = 0;
          for (guint i = 0; report->alternatives && report->alternatives[i];
               i++)
            {
              const char *alt_kind = report->alternative_kinds
                                         ? report->alternative_kinds[i]
                                         : NULL;
              if (g_strcmp0 (alt_kind, "larger_gpu") != 0 || larger++ == 0)
                g_ptr_array_add (
                    hints,
                    g_strdup_printf ("would fit: %s", report->alternatives[i]));
            }
          if (larger > 1)
            g_ptr_array_add (
                hints,
                g_strdup_printf (
                    "%u other GPUs would fit too: 'stowage fit' with "
                    "--engine %s in place of --emit lists them",
                    larger - 1,
                    ro->emit_v == STOW_EMIT_ACCELERATE
                        ? "deepspeed, fsdp or megatron"
                        : stow_engine_name (report->mem.layout->engine)));
          g_ptr_array_add (hints, NULL);
          return stow_cli_call_no_answer (po->call, msg,
                                          (const char *const *)hints->pdata);
        }
      if (!mem->fits)
        stow_cli_call_warning (po->call,
                               "this layout does not fit; the %s config is "
                               "written anyway",
                               stow_emit_kind_name (ro->emit_v));
      /* -v: the layout the config carries and its memory, under the
       * engine the config runs (what the search planned with). */
      if (report->mem.layout != NULL)
        {
          g_autofree char *d = stow_layout_describe (report->mem.layout);
          g_autofree char *need = stow_format_bytes (mem->total_bytes);
          g_autofree char *have = stow_format_bytes (mem->capacity_bytes);
          g_info ("--emit %s: %s; %s per GPU of %s usable (%s's memory "
                  "model)",
                  stow_emit_kind_name (ro->emit_v), d, need, have,
                  engine_title (report->mem.layout->engine));
        }
      g_autoptr (StowPlanFile) plan = stow_plan_file_new (
          po->model, po->cluster_obj, report->mem.training, report->mem.layout,
          report->mem.options, mem, ro->nvme_path);
      data = stow_emit (ro->emit_v, plan, mem, &error);
      if (data == NULL)
        return stow_cli_call_fail (po->call, error, NULL);
      g_auto (GStrv) warnings = stow_emit_warnings (ro->emit_v, plan);
      for (char **w = warnings; *w; w++)
        stow_cli_call_log_warning (po->call, *w);
      /* What the config cannot carry of the run's optimizer settings. */
      g_auto (GStrv) notes = stow_emit_notes (ro->emit_v, plan);
      for (char **n = notes; *n; n++)
        stow_cli_call_log_note (po->call, *n);
    }
  else
    {
      g_autoptr (GString) s = g_string_new (NULL);
      switch (ro->format_v)
        {
        case STOW_FORMAT_TEXT:
          g_string_append (s, text);
          break;
        case STOW_FORMAT_JSON:
          {
            if (report->search && JSON_NODE_HOLDS_OBJECT (json))
              json_object_set_member (json_node_get_object (json), "candidates",
                                      stow_report_candidates_json (report, 8));
            g_autofree char *j = stow_json_to_string (json, TRUE);
            g_string_append (s, j);
            break;
          }
        case STOW_FORMAT_CSV:
          stow_report_csv (s, report);
          break;
        case STOW_FORMAT_MD:
          stow_report_md (s, report);
          break;
        case STOW_FORMAT_HTML:
          stow_report_html (s, report);
          break;
        }
      data = g_string_free (g_steal_pointer (&s), FALSE);
    }
  return stow_cli_call_answer (po->call, ro->output, data, ok_code);
}

void
stow_report_options_clear (StowReportOptions *ro)
{
  g_clear_pointer (&ro->format, g_free);
  g_clear_pointer (&ro->output, g_free);
  g_clear_pointer (&ro->chart, g_free);
  g_clear_pointer (&ro->emit, g_free);
  g_clear_pointer (&ro->plan, g_free);
  g_clear_pointer (&ro->nvme_path, g_free);
}
