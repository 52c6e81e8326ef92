/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-models.c: "stowage models" (the built-in catalog as a table or
 * JSON) and "stowage model NAME|PATH" (one model's exact counts: total,
 * active per token, by role, per layer at 16 bits, largest module, and
 * optionally the tensor inventory).
 */
#include <stdio.h>
#include <string.h>

#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "core/json.h"
#include "core/units.h"
#include "models/model.h"
#include "planner/memory.h"

/* The fields both commands share. */
static void
add_summary (JsonBuilder *b, const StowModel *m)
{
  stow_json_set_string (b, "name", m->name);
  stow_json_set_string (b, "family", m->family);
  stow_json_set_u64 (b, "params", m->params);
  stow_json_set_u64 (b, "active_params", m->active_params);
  stow_json_set_u64 (b, "layers", m->n_layers);
  stow_json_set_u64 (b, "hidden", m->hidden);
  stow_json_set_u64 (b, "heads", m->n_heads);
  stow_json_set_u64 (b, "kv_heads", m->n_kv_heads);
  stow_json_set_u64 (b, "vocab", m->vocab);
}

static void
add_aliases (JsonBuilder *b, const StowModel *m)
{
  json_builder_set_member_name (b, "aliases");
  json_builder_begin_array (b);
  for (char **a = m->aliases; a && *a; a++)
    json_builder_add_string_value (b, *a);
  json_builder_end_array (b);
}

int
stow_models_run (StowCliCall *call, int argc, char **argv)
{
  gboolean opt_json = FALSE;
  const GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &opt_json, "Print JSON", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      call, "models", NULL,
      "List the built-in model catalog: name, family, exact parameter "
      "count, layers, hidden size, heads / kv heads and vocabulary.");
  stow_cli_add_entries (call, ctx, entries);
  if (!stow_cli_call_parse (call, ctx, "models", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_call_failf (call, "see 'stowage models --help'",
                                "models: unexpected argument \"%s\"", argv[1]);

  gsize n;
  const char *const *names = stow_model_catalog_names (&n);
  g_autoptr (GPtrArray) models
      = g_ptr_array_new_with_free_func ((GDestroyNotify)stow_model_unref);
  for (gsize i = 0; i < n; i++)
    {
      g_autoptr (GError) error = NULL;
      StowModel *m = stow_model_lookup (names[i], &error);
      if (m == NULL)
        return stow_cli_call_fail (call, error, NULL);
      g_ptr_array_add (models, m);
    }

  if (opt_json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "models");
      json_builder_begin_array (b);
      for (guint i = 0; i < models->len; i++)
        {
          const StowModel *m = g_ptr_array_index (models, i);
          json_builder_begin_object (b);
          add_summary (b, m);
          add_aliases (b, m);
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      json_builder_end_object (b);
      return stow_cli_call_answer_json (call, json_builder_get_root (b),
                                        STOW_EXIT_OK);
    }

  g_autoptr (GString) out = g_string_new (NULL);
  g_string_append_printf (out, "%-20s %-12s %18s %6s %7s %9s %7s\n", "NAME",
                          "FAMILY", "PARAMS", "LAYERS", "HIDDEN", "HEADS/KV",
                          "VOCAB");
  for (guint i = 0; i < models->len; i++)
    {
      const StowModel *m = g_ptr_array_index (models, i);
      char params[STOW_FORMAT_BUF], heads[48];
      g_snprintf (heads, sizeof heads,
                  "%" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT, m->n_heads,
                  m->n_kv_heads);
      g_string_append_printf (
          out,
          "%-20s %-12s %18s %6" G_GUINT64_FORMAT " %7" G_GUINT64_FORMAT
          " %9s %7" G_GUINT64_FORMAT "\n",
          m->name, m->family,
          stow_format_grouped_into (params, sizeof params, m->params),
          m->n_layers, m->hidden, heads, m->vocab);
    }
  return stow_cli_call_answer (call, NULL, out->str, STOW_EXIT_OK);
}

int
stow_cmd_models (int argc, char **argv)
{
  return stow_models_run (NULL, argc, argv);
}

/* The checkpoint as stored: dtype, quantization, bytes. */
static void
add_checkpoint_json (JsonBuilder *b, const StowModel *m)
{
  if (m->torch_dtype)
    stow_json_set_string (b, "torch_dtype", m->torch_dtype);
  stow_json_set_u64 (b, "checkpoint_bytes", m->checkpoint_bytes);
  stow_json_set_bool (b, "checkpoint_bytes_measured",
                      m->checkpoint_bytes_measured);
  json_builder_set_member_name (b, "quantization");
  json_builder_begin_object (b);
  stow_json_set_string (b, "method", stow_quant_method_name (m->quant.method));
  if (m->quant.method != STOW_QUANT_NONE)
    {
      stow_json_set_u64 (b, "bits", m->quant.bits);
      stow_json_set_u64 (b, "group_size", m->quant.group_size);
      stow_json_set_bool (b, "double_quant", m->quant.double_quant);
      stow_json_set_string (b, "type", m->quant.type);
      stow_json_set_double (b, "linear_bytes_per_param",
                            m->quant.linear_bytes_per_param);
    }
  json_builder_end_object (b);
  stow_json_set_u64 (b, "linear_params", m->linear_params);
}

/* "bf16, 2.30 GiB (from its safetensors index)" and, quantized, "GPTQ
 * 4-bit, group 128 (0.5195 B per linear weight); bf16 elsewhere". */
static void
print_checkpoint (GString *out, const StowModel *m)
{
  char by[STOW_FORMAT_BUF];
  const char *dtype = m->torch_dtype ? m->torch_dtype : "unknown dtype";
  stow_format_bytes_into (by, sizeof by, m->checkpoint_bytes);
  if (m->quant.method == STOW_QUANT_NONE)
    g_string_append_printf (out, "  checkpoint:  %s, %s%s\n", dtype, by,
                            m->checkpoint_bytes_measured ? " (its safetensors)"
                                                         : " (from the count)");
  else
    {
      char group[48] = "";
      if (m->quant.group_size)
        g_snprintf (group, sizeof group, ", group %" G_GUINT64_FORMAT,
                    m->quant.group_size);
      else if (m->quant.method == STOW_QUANT_GPTQ
               || m->quant.method == STOW_QUANT_AWQ)
        g_snprintf (group, sizeof group, ", per row");
      g_string_append_printf (
          out,
          "  checkpoint:  %s %u-bit %s%s%s (%.4g B per linear weight), "
          "%s elsewhere; %s%s\n",
          stow_quant_method_name (m->quant.method), m->quant.bits,
          m->quant.type ? m->quant.type : "", group,
          m->quant.double_quant ? ", double quant" : "",
          m->quant.linear_bytes_per_param, dtype, by,
          m->checkpoint_bytes_measured ? " (its safetensors)"
                                       : " (from the count)");
    }
}

/* Bytes of @params at 16 bits, with an IEC unit. */
static const char *
bytes16 (char *buf, gsize size, guint64 params)
{
  /* params * 2 cannot overflow: importers reject params * 20 overflowing. */
  return stow_format_bytes_into (buf, size, params * 2);
}

/* accelerate estimate-memory's table, in GiB. */
static void
print_accelerate (GString *out, const StowModel *m)
{
  StowAccelerateRow rows[STOW_ACCELERATE_ROWS];
  const double gib = (double)(1ull << 30);
  stow_accelerate_estimate (m, rows);
  g_string_append_printf (
      out, "\n  accelerate estimate-memory (GiB; training with Adam, before "
           "activations):\n");
  g_string_append_printf (out, "    %-8s %14s %12s %16s\n", "dtype",
                          "largest layer", "total size", "training (Adam)");
  for (int i = 0; i < STOW_ACCELERATE_ROWS; i++)
    {
      char train[32] = "-";
      if (rows[i].training_bytes >= 0)
        g_snprintf (train, sizeof train, "%.2f", rows[i].training_bytes / gib);
      g_string_append_printf (out, "    %-8s %14.2f %12.2f %16s\n",
                              rows[i].dtype, rows[i].largest_layer_bytes / gib,
                              rows[i].total_bytes / gib, train);
    }
}

static void
add_accelerate_json (JsonBuilder *b, const StowModel *m)
{
  StowAccelerateRow rows[STOW_ACCELERATE_ROWS];
  stow_accelerate_estimate (m, rows);
  json_builder_set_member_name (b, "accelerate_estimate");
  json_builder_begin_array (b);
  for (int i = 0; i < STOW_ACCELERATE_ROWS; i++)
    {
      json_builder_begin_object (b);
      stow_json_set_string (b, "dtype", rows[i].dtype);
      stow_json_set_u64 (b, "largest_layer_bytes",
                         (guint64)(rows[i].largest_layer_bytes + 0.5));
      stow_json_set_u64 (b, "total_bytes",
                         (guint64)(rows[i].total_bytes + 0.5));
      if (rows[i].training_bytes >= 0)
        stow_json_set_u64 (b, "training_bytes",
                           (guint64)(rows[i].training_bytes + 0.5));
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
}

static void
print_text (GString *out, const StowModel *m, gboolean tensors)
{
  char g[STOW_FORMAT_BUF], by[STOW_FORMAT_BUF];
  g_autofree char *shortp = stow_format_count_short (m->params);

  g_string_append_printf (out, "%s (%s)\n", m->name, m->family);
  if (m->aliases && m->aliases[0])
    {
      g_autofree char *al = g_strjoinv (", ", m->aliases);
      g_string_append_printf (out, "  aliases:     %s\n", al);
    }
  if (m->hub_id)
    g_string_append_printf (out, "  hub:         %s@%s\n", m->hub_id,
                            m->revision);
  g_string_append_printf (out, "  source:      %s\n", m->source);
  if (m->reference)
    g_string_append_printf (out, "  reference:   %s\n", m->reference);
  g_string_append_printf (out, "  shape:       %" G_GUINT64_FORMAT " layers",
                          m->n_layers);
  if (m->n_encoder_layers)
    g_string_append_printf (
        out, " (%" G_GUINT64_FORMAT " encoder + %" G_GUINT64_FORMAT " decoder)",
        m->n_encoder_layers, m->n_layers - m->n_encoder_layers);
  g_string_append_printf (
      out,
      ", hidden %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
      " heads / %" G_GUINT64_FORMAT " kv heads of %" G_GUINT64_FORMAT
      ", ffn %" G_GUINT64_FORMAT ", vocab %" G_GUINT64_FORMAT "\n",
      m->hidden, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn, m->vocab);
  if (m->n_experts)
    g_string_append_printf (
        out,
        "  experts:     %" G_GUINT64_FORMAT " routed (top %" G_GUINT64_FORMAT
        ") + %" G_GUINT64_FORMAT " shared\n",
        m->n_experts, m->experts_per_token, m->n_shared_experts);
  g_string_append_printf (out, "  parameters:  %s (%s)\n",
                          stow_format_grouped_into (g, sizeof g, m->params),
                          shortp);
  if (m->active_params != m->params)
    {
      g_autofree char *s = stow_format_count_short (m->active_params);
      g_string_append_printf (
          out, "  active:      %s (%s) per token\n",
          stow_format_grouped_into (g, sizeof g, m->active_params), s);
    }
  g_string_append_printf (out, "  at 16 bits:  %s\n",
                          bytes16 (by, sizeof by, m->params));
  print_checkpoint (out, m);

  g_string_append_printf (out, "\n  by role:\n");
  for (int r = 0; r < STOW_N_ROLES; r++)
    {
      if (m->by_role[r] == 0)
        continue;
      g_string_append_printf (
          out, "    %-10s %18s  %12s  %5.1f%%\n", stow_tensor_role_name (r),
          stow_format_grouped_into (g, sizeof g, m->by_role[r]),
          bytes16 (by, sizeof by, m->by_role[r]),
          100.0 * (double)m->by_role[r] / (double)m->params);
    }

  /* Runs of identical layers print as one line. */
  g_string_append_printf (out, "\n  per layer (16-bit):\n");
  for (guint64 i = 0; i < m->n_layers;)
    {
      guint64 j = i + 1;
      const StowLayerInfo *li = &m->layers[i];
      while (j < m->n_layers && m->layers[j].params == li->params
             && m->layers[j].active_params == li->active_params
             && m->layers[j].is_moe == li->is_moe
             && m->layers[j].is_decoder == li->is_decoder)
        j++;
      char range[48];
      if (j - i == 1)
        g_snprintf (range, sizeof range, "layer %" G_GUINT64_FORMAT, i);
      else
        g_snprintf (range, sizeof range,
                    "layers %" G_GUINT64_FORMAT "-%" G_GUINT64_FORMAT, i,
                    j - 1);
      g_string_append_printf (
          out, "    %-16s %18s params  %12s each", range,
          stow_format_grouped_into (g, sizeof g, li->params),
          bytes16 (by, sizeof by, li->params));
      if (li->is_moe)
        g_string_append_printf (
            out, "  (MoE, %s active)",
            stow_format_grouped_into (g, sizeof g, li->active_params));
      if (m->n_encoder_layers)
        g_string_append_printf (out, "  %s",
                                li->is_decoder ? "decoder" : "encoder");
      g_string_append_printf (out, "\n");
      i = j;
    }
  g_string_append_printf (
      out, "\n  largest module: %s, %s params (%s at 16 bits)\n",
      m->largest_module ? m->largest_module : "-",
      stow_format_grouped_into (g, sizeof g, m->largest_module_params),
      bytes16 (by, sizeof by, m->largest_module_params));
  g_string_append_printf (out, "  tensors:     %u\n", m->tensors->len);
  print_accelerate (out, m);

  if (tensors)
    {
      g_string_append_printf (out, "\n  %-64s %-24s %s\n", "TENSOR", "SHAPE",
                              "ROLE");
      for (guint i = 0; i < m->tensors->len; i++)
        {
          const StowTensor *t = g_ptr_array_index (m->tensors, i);
          char shape[64];
          if (t->n_dims == 1)
            g_snprintf (shape, sizeof shape, "[%" G_GUINT64_FORMAT "]",
                        t->shape[0]);
          else
            g_snprintf (shape, sizeof shape,
                        "[%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                        t->shape[0], t->shape[1]);
          g_string_append_printf (out, "  %-64s %-24s %s%s\n", t->name, shape,
                                  stow_tensor_role_name (t->role),
                                  t->tied ? " (tied)" : "");
        }
    }
}

static JsonNode *
model_json (const StowModel *m, gboolean tensors)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  add_summary (b, m);
  stow_json_set_u64 (b, "largest_module_params", m->largest_module_params);
  stow_json_set_string (b, "largest_module", m->largest_module);
  json_builder_set_member_name (b, "by_role");
  json_builder_begin_object (b);
  for (int r = 0; r < STOW_N_ROLES; r++)
    stow_json_set_u64 (b, stow_tensor_role_name (r), m->by_role[r]);
  json_builder_end_object (b);
  add_aliases (b, m);
  stow_json_set_string (b, "source", m->source);
  stow_json_set_string (b, "reference", m->reference);
  if (m->hub_id)
    {
      stow_json_set_string (b, "hub_id", m->hub_id);
      stow_json_set_string (b, "revision", m->revision);
    }
  add_checkpoint_json (b, m);
  stow_json_set_u64 (b, "head_dim", m->head_dim);
  stow_json_set_u64 (b, "ffn", m->ffn);
  stow_json_set_u64 (b, "encoder_layers", m->n_encoder_layers);
  stow_json_set_u64 (b, "experts", m->n_experts);
  stow_json_set_u64 (b, "experts_per_token", m->experts_per_token);
  stow_json_set_u64 (b, "shared_experts", m->n_shared_experts);
  stow_json_set_u64 (b, "embedding_params", m->embedding_params);
  stow_json_set_u64 (b, "head_params", m->head_params);
  stow_json_set_bool (b, "tied_embeddings", m->tied_embeddings);
  stow_json_set_string (
      b, "norm", m->norm == STOW_NORM_LAYERNORM ? "layernorm" : "rmsnorm");
  json_builder_set_member_name (b, "per_layer");
  json_builder_begin_array (b);
  for (guint64 i = 0; i < m->n_layers; i++)
    {
      const StowLayerInfo *li = &m->layers[i];
      json_builder_begin_object (b);
      stow_json_set_u64 (b, "params", li->params);
      stow_json_set_u64 (b, "active_params", li->active_params);
      stow_json_set_u64 (b, "bytes_16bit", li->params * 2);
      stow_json_set_bool (b, "moe", li->is_moe);
      stow_json_set_bool (b, "decoder", li->is_decoder);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  stow_json_set_u64 (b, "n_tensors", m->tensors->len);
  add_accelerate_json (b, m);
  if (tensors)
    {
      json_builder_set_member_name (b, "tensors");
      json_builder_begin_array (b);
      for (guint i = 0; i < m->tensors->len; i++)
        {
          const StowTensor *t = g_ptr_array_index (m->tensors, i);
          json_builder_begin_object (b);
          stow_json_set_string (b, "name", t->name);
          json_builder_set_member_name (b, "shape");
          json_builder_begin_array (b);
          for (guint d = 0; d < t->n_dims; d++)
            json_builder_add_int_value (b, (gint64)t->shape[d]);
          json_builder_end_array (b);
          stow_json_set_string (b, "role", stow_tensor_role_name (t->role));
          stow_json_set_i64 (b, "layer", t->layer);
          stow_json_set_bool (b, "tied", t->tied);
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
    }
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

int
stow_model_run (StowCliCall *call, int argc, char **argv)
{
  gboolean opt_json = FALSE, opt_tensors = FALSE;
  g_autofree char *opt_revision = NULL;
  const GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &opt_json, "Print JSON", NULL },
    { "revision", 0, 0, G_OPTION_ARG_STRING, &opt_revision,
      "With a Hub id (ORG/NAME): the branch, tag or commit (default main)",
      "REV" },
    { "tensors", 't', 0, G_OPTION_ARG_NONE, &opt_tensors,
      "Also list every tensor (checkpoint name, shape, role)", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      call, "model", "NAME|PATH|ORG/NAME",
      "Show one model from the catalog (see 'stowage models'), from a "
      "HuggingFace config.json (or a folder holding one), or by its Hub id "
      "(from the Hugging Face cache, stowage's cache or HF_ENDPOINT): the "
      "exact "
      "parameter count, active parameters per token, the breakdown by "
      "role, the size of each layer at 16 bits and the largest module.");
  stow_cli_add_entries (call, ctx, entries);
  if (!stow_cli_call_parse (call, ctx, "model", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc < 2)
    return stow_cli_call_failf (call, "see 'stowage models' for the catalog",
                                "model: expected a model name or a "
                                "config.json");
  if (argc > 2)
    return stow_cli_call_failf (call, "see 'stowage model --help'",
                                "model: unexpected argument \"%s\"", argv[2]);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m
      = stow_cli_call_model (call, argv[1], opt_revision, &error);
  if (m == NULL)
    return stow_cli_call_fail (call, error, NULL);
  if (opt_json)
    return stow_cli_call_answer_json (call, model_json (m, opt_tensors),
                                      STOW_EXIT_OK);
  g_autoptr (GString) out = g_string_new (NULL);
  print_text (out, m, opt_tensors);
  return stow_cli_call_answer (call, NULL, out->str, STOW_EXIT_OK);
}

int
stow_cmd_model (int argc, char **argv)
{
  return stow_model_run (NULL, argc, argv);
}
