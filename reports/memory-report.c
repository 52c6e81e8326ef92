/* SPDX-License-Identifier: MIT
 *
 * reports/memory-report.c: text and JSON for one layout's memory.
 */
#include "reports/memory-report.h"

#include "core/json.h"
#include "core/units.h"
#include "planner/memory-json.h"
#include "planner/plan-file.h"

char *
stow_layout_describe (const StowLayout *l)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "dp %u, tp %u, pp %u", l->dp, l->tp, l->pp);
  if (l->vpp > 1)
    g_string_append_printf (s, " (vpp %u)", l->vpp);
  if (l->pp_split_ends)
    g_string_append (s, ", embedding and loss in the pipeline split");
  if (l->cp > 1)
    g_string_append_printf (s, ", cp %u", l->cp);
  if (l->ep > 1)
    g_string_append_printf (s, ", ep %u", l->ep);
  if (stow_layout_etp (l) != l->tp)
    g_string_append_printf (s, ", etp %u", stow_layout_etp (l));
  if (l->sp)
    g_string_append (s, ", sp");
  g_string_append_printf (s, ", ZeRO %u%s", l->zero,
                          l->hybrid_shard ? " (hybrid)" : "");
  if (l->offload_optimizer != STOW_OFFLOAD_NONE)
    g_string_append_printf (s, ", optimizer on %s",
                            stow_offload_name (l->offload_optimizer));
  if (l->offload_params != STOW_OFFLOAD_NONE)
    g_string_append_printf (s, ", params on %s",
                            stow_offload_name (l->offload_params));
  if (l->offload_activations)
    g_string_append (s, ", checkpoints on cpu");
  if (l->recompute == STOW_RECOMPUTE_FULL && l->recompute_layers)
    g_string_append_printf (s, ", recompute full:%u", l->recompute_layers);
  else if (l->recompute != STOW_RECOMPUTE_NONE)
    g_string_append_printf (s, ", recompute %s",
                            stow_recompute_name (l->recompute));
  g_string_append_printf (
      s, ", micro-batch %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT,
      l->micro_batch, l->grad_accum);
  if (l->pp > 1)
    g_string_append_printf (s, ", %s", stow_schedule_name (l->schedule));
  g_string_append_printf (s, ", %s", stow_engine_name (l->engine));
  return g_string_free (s, FALSE);
}

char *
stow_report_host_line (const StowCluster *c)
{
  const StowNode *n = &c->node;
  char ram[STOW_FORMAT_BUF], cap[STOW_FORMAT_BUF];
  GString *s = g_string_new (NULL);
  g_string_append_printf (
      s, "%s RAM and ",
      stow_format_bytes_into (ram, sizeof ram, n->host_ram_bytes));
  gboolean same = TRUE;
  guint64 total = 0;
  for (guint i = 0; i < n->n_nvme; i++)
    {
      total += n->nvme[i].capacity_bytes;
      same = same && n->nvme[i].capacity_bytes == n->nvme[0].capacity_bytes;
    }
  if (n->n_nvme == 0)
    g_string_append (s, "no NVMe drive");
  else if (same)
    g_string_append_printf (
        s, "%u NVMe drive%s of %s", n->n_nvme, n->n_nvme == 1 ? "" : "s",
        stow_format_bytes_into (cap, sizeof cap, n->nvme[0].capacity_bytes));
  else
    g_string_append_printf (s, "%u NVMe drives, %s in all", n->n_nvme,
                            stow_format_bytes_into (cap, sizeof cap, total));
  g_string_append (s, " per node");
  const char *preset = n->name ? n->name : "node";
  if (c->host_ram_assumed && c->nvme_assumed)
    g_string_append_printf (s,
                            " (assumed: the %s preset's; give --host-ram and "
                            "--nvme for yours)",
                            preset);
  else if (c->host_ram_assumed)
    g_string_append_printf (s,
                            " (the RAM is assumed: the %s preset's; give "
                            "--host-ram for yours)",
                            preset);
  else if (c->nvme_assumed)
    g_string_append_printf (s,
                            " (the drives are assumed: the %s preset's; give "
                            "--nvme for yours)",
                            preset);
  return g_string_free (s, FALSE);
}

char *
stow_memory_short_of (const StowMemory *m)
{
  const char *parts[3];
  guint n = 0;
  if (!m->fits_device)
    parts[n++] = "GPU memory";
  if (!m->fits_host)
    parts[n++] = "host RAM";
  if (!m->fits_nvme)
    parts[n++] = "NVMe";
  if (n == 0)
    return g_strdup ("nothing");
  if (n == 1)
    return g_strdup (parts[0]);
  if (n == 2)
    return g_strdup_printf ("%s and %s", parts[0], parts[1]);
  return g_strdup_printf ("%s, %s and %s", parts[0], parts[1], parts[2]);
}

char *
stow_memory_report_filled_note (const char *const *filled)
{
  if (filled == NULL || filled[0] == NULL)
    return NULL;
  GString *s = g_string_new ("as 'stowage fit' would (the fastest layout "
                             "that fits): ");
  for (guint i = 0; filled[i]; i++)
    g_string_append_printf (s, "%s--%s", i == 0 ? "" : " ", filled[i]);
  g_string_append (s, "; give a flag to pin it");
  return g_string_free (s, FALSE);
}

JsonNode *
stow_layout_to_json (const StowLayout *l, const StowTraining *t)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_layout_json_members (b, l);
  stow_json_set_u64 (b, "global_batch", l->micro_batch * l->grad_accum * l->dp);
  stow_json_set_string (b, "schedule", stow_schedule_name (l->schedule));
  stow_json_set_string (b, "engine", stow_engine_name (l->engine));
  if (t != NULL)
    {
      stow_json_set_u64 (b, "seq_len", t->seq_len);
      if (t->decoder_seq_len)
        stow_json_set_u64 (b, "decoder_seq_len", t->decoder_seq_len);
      stow_json_set_string (b, "precision", stow_precision_name (t->precision));
      stow_json_set_string (b, "optimizer", stow_optimizer_name (t->optimizer));
      stow_json_set_string (b, "finetune", stow_finetune_name (t->finetune));
      if (t->finetune != STOW_FINETUNE_FULL)
        {
          g_autofree char *targets = stow_lora_targets_name (t->lora_targets);
          stow_json_set_u64 (b, "lora_rank", t->lora_rank);
          stow_json_set_string (b, "lora_targets", targets);
        }
      stow_json_set_bool (b, "flash_attention", t->flash_attention);
      stow_json_set_bool (b, "chunked_loss", t->chunked_loss);
      stow_json_set_bool (b, "fused_loss", t->fused_loss);
      stow_json_set_bool (b, "optimizer_in_backward", t->optimizer_in_backward);
      stow_json_set_bool (b, "compile", t->compiled);
    }
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

JsonNode *
stow_memory_report_json (const StowMemoryReport *r)
{
  const StowMemory *mem = r->memory;
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_u64 (b, "version", STOW_JSON_VERSION);
  stow_json_set_bool (b, "fits", mem->fits);
  stow_json_set_string (b, "convention",
                        stow_convention_name (mem->convention));
  if (r->model)
    {
      json_builder_set_member_name (b, "model");
      json_builder_begin_object (b);
      stow_json_set_string (b, "name", r->model->name);
      stow_json_set_u64 (b, "params", r->model->params);
      json_builder_end_object (b);
    }
  json_builder_set_member_name (b, "cluster");
  json_builder_begin_object (b);
  stow_json_set_string (b, "spec", r->cluster->spec);
  stow_json_set_string (b, "gpu", r->cluster->node.gpu.name);
  stow_json_set_u64 (b, "nodes", r->cluster->n_nodes);
  stow_json_set_u64 (b, "gpus_per_node", r->cluster->node.gpus_per_node);
  /* The host side, and whether it is a preset's guess. */
  guint64 nvme_total = 0;
  for (guint i = 0; i < r->cluster->node.n_nvme; i++)
    nvme_total += r->cluster->node.nvme[i].capacity_bytes;
  stow_json_set_u64 (b, "host_ram_bytes", r->cluster->node.host_ram_bytes);
  stow_json_set_u64 (b, "nvme_drives", r->cluster->node.n_nvme);
  stow_json_set_u64 (b, "nvme_capacity_bytes", nvme_total);
  stow_json_set_bool (b, "host_ram_assumed", r->cluster->host_ram_assumed);
  stow_json_set_bool (b, "nvme_assumed", r->cluster->nvme_assumed);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "layout");
  json_builder_add_value (b, stow_layout_to_json (r->layout, r->training));
  if (r->filled)
    {
      json_builder_set_member_name (b, "filled_like_fit");
      json_builder_begin_array (b);
      for (guint i = 0; r->filled[i]; i++)
        json_builder_add_string_value (b, r->filled[i]);
      json_builder_end_array (b);
    }

  stow_memory_json_members (b, mem, STOW_MEMORY_JSON_REPORT);
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

static void
table (GString *out, const char *title, GArray *terms, gboolean explain)
{
  g_string_append_printf (out, "%-38s %10s\n", title, "GiB");
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      g_autofree char *gib = stow_format_gib (t->bytes);
      g_string_append_printf (out, "  %-36s %10s", t->name, gib);
      if (explain)
        g_string_append_printf (out, "   %s", t->formula);
      g_string_append_c (out, '\n');
    }
}

static void
line (GString *out, const char *label, guint64 bytes, const char *note)
{
  g_autofree char *gib = stow_format_gib (bytes);
  g_string_append_printf (out, "  %-36s %10s%s%s\n", label, gib,
                          note ? "   " : "", note ? note : "");
}

void
stow_memory_report_text (GString *out, const StowMemoryReport *r,
                         gboolean explain)
{
  const StowMemory *mem = r->memory;
  const StowCluster *c = r->cluster;
  g_autofree char *layout = stow_layout_describe (r->layout);
  char buf[STOW_FORMAT_BUF];

  if (r->model)
    g_string_append_printf (
        out, "model:   %s (%s, %s params)\n", r->model->name, r->model->family,
        stow_format_grouped_into (buf, sizeof buf, r->model->params));
  g_string_append_printf (out, "cluster: %s: %u node%s x %u %s\n", c->spec,
                          c->n_nodes, c->n_nodes == 1 ? "" : "s",
                          c->node.gpus_per_node, c->node.gpu.name);
  g_autofree char *host = stow_report_host_line (c);
  g_string_append_printf (out, "host:    %s\n", host);
  g_string_append_printf (out, "layout:  %s\n", layout);
  g_autofree char *note = stow_memory_report_filled_note (r->filled);
  if (note)
    g_string_append_printf (out, "filled:  %s\n", note);
  g_string_append_printf (
      out, "train:   seq %" G_GUINT64_FORMAT ", %s, %s%s%s\n",
      r->training->seq_len, stow_precision_name (r->training->precision),
      stow_optimizer_name (r->training->optimizer),
      r->training->finetune != STOW_FINETUNE_FULL ? ", " : "",
      r->training->finetune != STOW_FINETUNE_FULL
          ? stow_finetune_name (r->training->finetune)
          : "");
  if (mem->convention != STOW_CONVENTION_STOWAGE)
    g_string_append_printf (out, "convention: %s (the peer's own formula)\n",
                            stow_convention_name (mem->convention));
  g_string_append_c (out, '\n');

  if (mem->n_stages > 1)
    {
      g_string_append_printf (out, "%-38s %10s\n", "Per GPU by pipeline stage",
                              "GiB");
      for (guint i = 0; i < mem->n_stages; i++)
        {
          char label[64];
          g_snprintf (label, sizeof label,
                      "stage %u (%" G_GUINT64_FORMAT " layers)", i,
                      mem->stages[i].layers);
          line (out, label, mem->stages[i].total_bytes,
                i == mem->peak_stage ? "<- peak" : NULL);
        }
      g_string_append_c (out, '\n');
    }
  for (guint i = 0; i < mem->n_stages; i++)
    {
      if (i != mem->peak_stage && !explain)
        continue;
      char title[64];
      if (mem->n_stages > 1)
        g_snprintf (title, sizeof title, "Per GPU, stage %u", i);
      else
        g_snprintf (title, sizeof title, "Per GPU");
      table (out, title, mem->stages[i].terms, explain);
      g_string_append_c (out, '\n');
    }
  if (mem->convention == STOW_CONVENTION_STOWAGE)
    {
      line (out, "allocated peak", mem->allocated_peak_bytes,
            "max_memory_allocated");
      line (out, "reserved", mem->reserved_bytes, "max_memory_reserved");
    }
  line (out, "total", mem->total_bytes,
        mem->convention == STOW_CONVENTION_STOWAGE ? "nvidia-smi" : NULL);
  g_autofree char *cap = stow_format_gib (mem->capacity_bytes);
  gint64 head = (gint64)mem->capacity_bytes - (gint64)mem->total_bytes;
  g_autofree char *headroom
      = stow_format_bytes ((guint64)(head < 0 ? -head : head));
  g_string_append_printf (out, "  %-36s %10s   %s %s\n", "usable on the GPU",
                          cap, head >= 0 ? "headroom" : "over by", headroom);
  g_string_append_c (out, '\n');

  if (mem->host_terms->len > 0)
    {
      table (out, "Host RAM per node", mem->host_terms, explain);
      line (out, "total", mem->host_total_bytes, NULL);
      if (mem->host_capacity_bytes)
        line (out, "installed", mem->host_capacity_bytes, NULL);
      g_string_append_c (out, '\n');
    }
  if (mem->nvme_terms->len > 0)
    {
      table (out, "NVMe per node", mem->nvme_terms, explain);
      line (out, "total", mem->nvme_bytes, NULL);
      line (out, "capacity", mem->nvme_capacity_bytes, NULL);
      g_string_append_c (out, '\n');
    }
  if (mem->fits)
    g_string_append (out, "FITS\n");
  else
    {
      g_autofree char *what = stow_memory_short_of (mem);
      g_string_append_printf (out, "DOES NOT FIT: %s\n", what);
    }
  g_string_append (out, "(GiB = 2^30 bytes)\n");
}
