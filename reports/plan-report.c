/* SPDX-License-Identifier: MIT
 *
 * reports/plan-report.c: `stowage plan`'s ranking as CSV and Markdown.
 */
#include "reports/plan-report.h"

#include "core/units.h"
#include "reports/memory-report.h"
#include "reports/report.h"

static const char *csv_header
    = "rank,dp,tp,pp,vpp,cp,ep,sp,zero,offload_optimizer,offload_params,"
      "offload_activations,recompute,micro_batch,grad_accum,engine,"
      "total_bytes,headroom_bytes,step_time_s,tokens_per_s,"
      "tokens_per_s_per_gpu,tflops_per_gpu,mfu,dominant_overhead,"
      "dominant_overhead_s\n";

void
stow_report_plan_csv (GString *out, const StowSearch *s, guint top)
{
  g_string_append (out, csv_header);
  for (guint i = 0; i < MIN (s->fits->len, top); i++)
    {
      const StowCandidate *c = &g_array_index (s->fits, StowCandidate, i);
      const StowLayout *l = &c->layout;
      StowCostKind k = c->cost.dominant_overhead;
      /* %.9g keeps seconds and rates exact enough to re-rank. */
      g_string_append_printf (
          out,
          "%u,%u,%u,%u,%u,%u,%u,%s,%u,%s,%s,%s,%s,%" G_GUINT64_FORMAT
          ",%" G_GUINT64_FORMAT ",%s,%" G_GUINT64_FORMAT ",%" G_GINT64_FORMAT
          ",%.9g,%.9g,%.9g,%.9g,%.6f,%s,%.9g\n",
          i + 1, l->dp, l->tp, l->pp, l->vpp, l->cp, l->ep,
          l->sp ? "true" : "false", l->zero,
          stow_offload_name (l->offload_optimizer),
          stow_offload_name (l->offload_params),
          l->offload_activations ? "cpu" : "none",
          stow_recompute_name (l->recompute), l->micro_batch, l->grad_accum,
          stow_engine_name (l->engine), c->total_bytes, c->headroom_bytes,
          c->cost.step_time_s, c->cost.tokens_per_s,
          c->cost.tokens_per_s_per_gpu, c->cost.tflops_per_gpu, c->cost.mfu,
          stow_cost_kind_name (k), c->cost.exposed_s[k]);
    }
}

void
stow_report_plan_md (GString *out, const StowSearch *s, const char *model,
                     const char *gpus, guint top)
{
  g_string_append_printf (out, "# stowage plan: %s on %s\n\n", model, gpus);
  stow_report_search_counts (out, s, s->search_time_s);
  g_string_append (out, ".  Ranked by the time model's predicted "
                        "throughput, fastest first.  Sizes in GiB (2^30 "
                        "bytes).\n\n");
  if (s->fits->len == 0)
    {
      g_string_append (out, "No layout fits.\n");
      return;
    }
  g_string_append (out, "| # | layout | per GPU (GiB) | headroom (GiB) | "
                        "step (s) | tokens/s | MFU | dominant overhead |\n"
                        "|---:|---|---:|---:|---:|---:|---:|---|\n");
  for (guint i = 0; i < MIN (s->fits->len, top); i++)
    {
      const StowCandidate *c = &g_array_index (s->fits, StowCandidate, i);
      g_autofree char *d = stow_layout_describe (&c->layout);
      StowCostKind k = c->cost.dominant_overhead;
      g_string_append_printf (
          out, "| %u | %s | %.2f | %.2f | %.4g | %.0f | %.1f%% | %s %.3g s |\n",
          i + 1, d, (double)c->total_bytes / 1073741824.0,
          (double)MAX (c->headroom_bytes, 0) / 1073741824.0,
          c->cost.step_time_s, c->cost.tokens_per_s, 100 * c->cost.mfu,
          stow_cost_kind_name (k), c->cost.exposed_s[k]);
    }
}
