/* SPDX-License-Identifier: MIT
 *
 * reports/emit.c: DeepSpeed, Megatron-LM, FSDP and accelerate configs for a
 * plan.  Keys, flags and defaults are those of the engines' sources as
 * summarised in /work/shared/reference/ecosystem.md §2 (DeepSpeed
 * zero/config.py and offload_config.py, Megatron-LM arguments.py, torch
 * FSDP/FSDP2 docs, accelerate commands/config/cluster.py).
 */
#include "reports/emit.h"

#include <math.h>
#include <string.h>

#include "core/json.h"
#include "reports/emit-private.h"

GQuark
stow_emit_error_quark (void)
{
  return g_quark_from_static_string ("stow-emit-error-quark");
}

static const char *const kind_names[] = {
  [STOW_EMIT_DEEPSPEED] = "deepspeed", [STOW_EMIT_MEGATRON] = "megatron",
  [STOW_EMIT_FSDP] = "fsdp",           [STOW_EMIT_ACCELERATE] = "accelerate",
  [STOW_EMIT_PLAN] = "plan",
};

const char *
stow_emit_kind_name (StowEmitKind kind)
{
  g_return_val_if_fail ((guint)kind < G_N_ELEMENTS (kind_names), "?");
  return kind_names[kind];
}

gboolean
stow_emit_kind_parse (const char *s, const char *field, StowEmitKind *out,
                      GError **error)
{
  for (guint i = 0; i < G_N_ELEMENTS (kind_names); i++)
    if (g_ascii_strcasecmp (s, kind_names[i]) == 0)
      {
        *out = (StowEmitKind)i;
        return TRUE;
      }
  g_set_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_PARSE,
               "%s \"%s\": expected deepspeed, megatron, fsdp, accelerate or "
               "plan",
               field, s);
  return FALSE;
}

/* Why no engine config but a plan file carries --recompute selective-op. */
#define OP_AC_UNSUPPORTED                                                      \
  "torchtitan's selective op checkpointing (its activation_checkpoint mode "   \
  "selective, selective_ac_option op) has no DeepSpeed, Megatron-LM, FSDP "    \
  "or accelerate setting; set it in torchtitan's job config (--emit plan "     \
  "keeps it)"

static gboolean G_GNUC_PRINTF (3, 4)
    unsupported (GError **error, const char *engine, const char *format, ...)
{
  /* A search asks only yes or no: nothing to format. */
  if (error == NULL)
    return FALSE;
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_EMIT_ERROR, STOW_EMIT_ERROR_UNSUPPORTED,
               "--emit %s: %s", engine, msg);
  return FALSE;
}

/* Pure bf16 (no fp32 master copy, bf16 optimizer states) is torchtune's
 * mode; these engines keep fp32 master weights (DeepSpeed's BF16_Optimizer,
 * Megatron's main params, FSDP and accelerate's mixed precision). */
static gboolean
precision_check (const StowPlanFile *p, const char *engine, GError **error)
{
  if (p->training.precision == STOW_PRECISION_BF16_PURE)
    return unsupported (error, engine,
                        "--precision bf16-pure (no fp32 master weights) "
                        "cannot be expressed; the engine keeps an fp32 "
                        "master copy (use --precision bf16)");
  return TRUE;
}

static guint64
global_batch (const StowLayout *l)
{
  return l->micro_batch * l->grad_accum * l->dp;
}

static const char *
nvme_path (const StowPlanFile *p)
{
  return p->streaming.nvme_paths && p->streaming.nvme_paths[0]
             ? p->streaming.nvme_paths[0]
             : STOW_PLAN_NVME_PLACEHOLDER;
}

/* Full recomputation of only the first K layers (--recompute full:K with
 * K below the run it counts in); 0 for none or all. */
static guint
partial_recompute_layers (const StowPlanFile *p)
{
  const StowLayout *l = &p->layout;
  if (l->recompute != STOW_RECOMPUTE_FULL || l->recompute_layers == 0)
    return 0;
  if (p->model != NULL
      && l->recompute_layers
             >= stow_layout_recompute_run (l, p->model->n_layers))
    return 0;
  return l->recompute_layers;
}

/* Expert tensor parallelism apart from --tp is Megatron-core's own
 * setting: every other config @e writes has no place for it. */
static gboolean
etp_check (const StowPlanFile *p, const char *e, GError **error)
{
  if (stow_layout_etp (&p->layout) == p->layout.tp)
    return TRUE;
  return unsupported (error, e,
                      "expert tensor parallelism apart from --tp (--etp %u) "
                      "is Megatron-core's; use --emit megatron",
                      stow_layout_etp (&p->layout));
}

/* ---- DeepSpeed ---- */

/* What ds_config.json (with a plain model, no Megatron-DeepSpeed) can
 * express: ZeRO data parallelism, offload, activation checkpointing, and
 * pipeline stages of a PipelineModule up to ZeRO-1. */
static gboolean
deepspeed_check (const StowPlanFile *p, const char *e, GError **error)
{
  const StowLayout *l = &p->layout;
  if (!etp_check (p, e, error))
    return FALSE;
  if (l->tp > 1)
    return unsupported (error, e,
                        "tensor parallelism (--tp %u) is not a ds_config.json "
                        "setting (it needs Megatron-DeepSpeed); use --emit "
                        "megatron or a layout with --tp 1",
                        l->tp);
  if (l->cp > 1)
    return unsupported (error, e,
                        "DeepSpeed has no context parallelism (--cp %u); use "
                        "--emit megatron",
                        l->cp);
  if (l->ep > 1)
    return unsupported (error, e,
                        "expert parallelism (--ep %u) is set in the model's "
                        "deepspeed.moe layers, not in ds_config.json",
                        l->ep);
  if (l->pp > 1 && l->zero > 1)
    return unsupported (error, e,
                        "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 "
                        "only, the layout has pp %u with ZeRO %u",
                        l->pp, l->zero);
  if (l->vpp > 1 || (l->pp > 1 && l->schedule != STOW_SCHEDULE_1F1B))
    return unsupported (error, e, "DeepSpeed's pipeline runs 1F1B only, not %s",
                        stow_schedule_name (l->schedule));
  if (l->hybrid_shard)
    return unsupported (error, e,
                        "hybrid sharding (HSDP) has no DeepSpeed equivalent "
                        "(ZeRO++ hpZ still shards optimizer states "
                        "globally)");
  if (l->recompute == STOW_RECOMPUTE_SELECTIVE)
    return unsupported (error, e,
                        "selective recomputation (core attention only) is "
                        "Megatron's; DeepSpeed checkpoints whole layers");
  if (l->recompute == STOW_RECOMPUTE_OP)
    return unsupported (error, e, "%s", OP_AC_UNSUPPORTED);
  if (p->training.precision == STOW_PRECISION_FP8)
    return unsupported (error, e,
                        "ds_config.json has no fp8 training setting (it "
                        "comes from Transformer Engine in the model)");
  return TRUE;
}

static void
set_int (JsonObject *o, const char *k, guint64 v)
{
  json_object_set_int_member (o, k, (gint64)MIN (v, (guint64)G_MAXINT64));
}

JsonNode *
stow_emit_deepspeed (const StowPlanFile *p, GError **error)
{
  if (!precision_check (p, "deepspeed", error))
    return NULL;
  const StowLayout *l = &p->layout;
  const StowPlanStreaming *s = &p->streaming;
  if (!deepspeed_check (p, "deepspeed", error))
    return NULL;

  JsonObject *root = json_object_new ();
  set_int (root, "train_batch_size", global_batch (l));
  set_int (root, "train_micro_batch_size_per_gpu", l->micro_batch);
  set_int (root, "gradient_accumulation_steps", l->grad_accum);

  JsonObject *bf16 = json_object_new ();
  json_object_set_boolean_member (bf16, "enabled",
                                  p->training.precision == STOW_PRECISION_BF16);
  JsonObject *fp16 = json_object_new ();
  json_object_set_boolean_member (fp16, "enabled",
                                  p->training.precision == STOW_PRECISION_FP16);
  if (p->training.precision == STOW_PRECISION_FP16)
    {
      /* Dynamic loss scaling with DeepSpeed's defaults. */
      set_int (fp16, "loss_scale", 0);
      set_int (fp16, "initial_scale_power", 16);
      set_int (fp16, "loss_scale_window", 1000);
      set_int (fp16, "hysteresis", 2);
      set_int (fp16, "min_loss_scale", 1);
    }
  json_object_set_object_member (root, "bf16", bf16);
  json_object_set_object_member (root, "fp16", fp16);

  /* Bucket sizes in elements: the values the memory model charged
   * (planner/memory.c, engine_buffers), DeepSpeed's defaults. */
  JsonObject *z = json_object_new ();
  set_int (z, "stage", l->zero);
  if (l->zero >= 1)
    {
      json_object_set_boolean_member (z, "contiguous_gradients", TRUE);
      json_object_set_boolean_member (
          z, "overlap_comm", l->zero >= 3 || p->mem_options.overlap_comm > 0);
      json_object_set_boolean_member (z, "reduce_scatter", TRUE);
      set_int (z, "reduce_bucket_size", p->mem_options.reduce_bucket_elements);
      json_object_set_boolean_member (z, "allgather_partitions", TRUE);
      set_int (z, "allgather_bucket_size", 500000000);
    }
  if (l->zero >= 3)
    {
      set_int (z, "stage3_prefetch_bucket_size",
               p->mem_options.prefetch_bucket_elements);
      set_int (z, "stage3_param_persistence_threshold", 100000);
      set_int (z, "stage3_max_live_parameters", 1000000000);
      set_int (z, "stage3_max_reuse_distance",
               p->mem_options.reuse_distance_elements);
      json_object_set_boolean_member (
          z, "stage3_gather_16bit_weights_on_model_save", TRUE);
    }
  if (l->offload_optimizer != STOW_OFFLOAD_NONE)
    {
      JsonObject *o = json_object_new ();
      gboolean nvme = l->offload_optimizer == STOW_OFFLOAD_NVME;
      json_object_set_string_member (o, "device", nvme ? "nvme" : "cpu");
      if (nvme)
        {
          json_object_set_string_member (o, "nvme_path", nvme_path (p));
          /* DeepSpeed needs at least 4 (Adam's states); stowage's own
           * pipeline plans 3. */
          set_int (o, "buffer_count", MAX (s->optimizer_swap_buffers, 4u));
        }
      /* The memory model counts DeepSpeed's CPU optimizer states as
       * pageable memory (its default), swap buffers as pinned. */
      json_object_set_boolean_member (o, "pin_memory", nvme);
      json_object_set_boolean_member (o, "pipeline_read", FALSE);
      json_object_set_boolean_member (o, "pipeline_write", FALSE);
      json_object_set_boolean_member (o, "fast_init", FALSE);
      json_object_set_object_member (z, "offload_optimizer", o);
      set_int (z, "sub_group_size", 1000000000);
    }
  if (l->offload_params != STOW_OFFLOAD_NONE)
    {
      JsonObject *o = json_object_new ();
      gboolean nvme = l->offload_params == STOW_OFFLOAD_NVME;
      json_object_set_string_member (o, "device", nvme ? "nvme" : "cpu");
      if (nvme)
        {
          json_object_set_string_member (o, "nvme_path", nvme_path (p));
          set_int (o, "buffer_count", s->param_swap_buffers);
          set_int (o, "buffer_size", s->param_buffer_elems);
          set_int (o, "max_in_cpu", 1000000000);
        }
      json_object_set_boolean_member (o, "pin_memory", TRUE);
      json_object_set_object_member (z, "offload_param", o);
    }
  json_object_set_object_member (root, "zero_optimization", z);

  if (l->offload_optimizer == STOW_OFFLOAD_NVME
      || l->offload_params == STOW_OFFLOAD_NVME)
    {
      JsonObject *aio = json_object_new ();
      set_int (aio, "block_size", s->io_block_bytes);
      set_int (aio, "queue_depth", s->io_queue_depth);
      set_int (aio, "thread_count", 1);
      json_object_set_boolean_member (aio, "single_submit", FALSE);
      json_object_set_boolean_member (aio, "overlap_events", TRUE);
      json_object_set_object_member (root, "aio", aio);
    }

  if (l->recompute == STOW_RECOMPUTE_FULL)
    {
      JsonObject *ac = json_object_new ();
      json_object_set_boolean_member (ac, "partition_activations", FALSE);
      json_object_set_boolean_member (ac, "cpu_checkpointing",
                                      l->offload_activations);
      json_object_set_boolean_member (ac, "contiguous_memory_optimization",
                                      FALSE);
      /* Layers checkpointed per pipeline stage; all when 0. */
      guint64 per_stage
          = p->model ? (p->model->n_layers + l->pp - 1) / l->pp : 0;
      guint64 n = l->recompute_layers ? l->recompute_layers : per_stage;
      if (n)
        set_int (ac, "number_checkpoints", n);
      json_object_set_boolean_member (ac, "synchronize_checkpoint_boundary",
                                      FALSE);
      json_object_set_boolean_member (ac, "profile", FALSE);
      json_object_set_object_member (root, "activation_checkpointing", ac);
    }
  stow_emit_deepspeed_optim (root, p);
  json_object_set_boolean_member (root, "wall_clock_breakdown", FALSE);

  JsonNode *node = json_node_new (JSON_NODE_OBJECT);
  json_node_take_object (node, root);
  return node;
}

/* ---- Megatron-LM ---- */

static gboolean
megatron_check (const StowPlanFile *p, const char *e, GError **error)
{
  const StowLayout *l = &p->layout;
  const StowModel *m = p->model;
  if (m == NULL)
    return unsupported (error, e, "the plan has no model (only --params)");
  if (m->n_encoder_layers > 0)
    return unsupported (error, e,
                        "%s is an encoder-decoder model; pretrain_gpt.py "
                        "trains decoder-only models",
                        m->name);
  if (l->zero >= 2)
    return unsupported (error, e,
                        "ZeRO %u: Megatron-LM's distributed optimizer shards "
                        "optimizer states only (ZeRO 1); use --emit fsdp or "
                        "--emit deepspeed, or --zero 1",
                        l->zero);
  if (l->offload_params != STOW_OFFLOAD_NONE
      || l->offload_optimizer == STOW_OFFLOAD_NVME)
    return unsupported (
        error, e, "Megatron-LM cannot offload %s to %s",
        l->offload_params != STOW_OFFLOAD_NONE ? "parameters" : "the optimizer",
        l->offload_params != STOW_OFFLOAD_NONE
            ? stow_offload_name (l->offload_params)
            : "NVMe");
  if (l->offload_optimizer == STOW_OFFLOAD_CPU && l->zero != 1)
    return unsupported (error, e,
                        "--optimizer-cpu-offload runs inside the distributed "
                        "optimizer, which the layout lacks (--zero 1)");
  if (l->offload_activations)
    return unsupported (error, e,
                        "moving activation checkpoints to the CPU has no "
                        "Megatron-LM flag that matches the plan");
  if (l->hybrid_shard)
    return unsupported (error, e, "hybrid sharding (HSDP) is FSDP's");
  if (l->pp > 1 && l->schedule == STOW_SCHEDULE_GPIPE)
    return unsupported (error, e,
                        "Megatron-LM schedules 1F1B and interleaved 1F1B, "
                        "not GPipe");
  if (m->n_layers % l->pp != 0 && !l->pp_split_ends)
    return unsupported (error, e,
                        "%" G_GUINT64_FORMAT " layers on %u stages: the plan "
                        "puts the extra layers on middle stages, Megatron-LM "
                        "only on the first and last",
                        m->n_layers, l->pp);
  if (m->max_positions == 0 && m->rope_free)
    return unsupported (error, e,
                        "%s has neither learned positions nor rotary "
                        "embeddings (ALiBi, or none), and Megatron-LM's GPT "
                        "model has no such --position-embedding-type",
                        m->name);
  /* RoPE as Megatron-LM's GPT model applies it: an integer base
   * (--rotary-base, type=int in arguments.py) and, of HF's rope_scaling
   * types, Llama 3's only, with its low/high frequency factors and
   * original context fixed at 1, 4 and 8192 (RotaryEmbedding._apply_scaling
   * in megatron/core/models/common/embeddings/rotary_pos_embedding.py). */
  if (m->max_positions == 0 && m->rope_theta > 0
      && m->rope_theta != floor (m->rope_theta))
    return unsupported (error, e,
                        "rope_theta %g: Megatron-LM's --rotary-base takes a "
                        "whole number",
                        m->rope_theta);
  if (m->max_positions == 0 && m->rope_type != NULL
      && !g_str_equal (m->rope_type, "default"))
    {
      if (!g_str_equal (m->rope_type, "llama3"))
        return unsupported (error, e,
                            "%s's rope_scaling type \"%s\" has no Megatron-LM "
                            "GPT flag (--use-rope-scaling is Llama 3's)",
                            m->name, m->rope_type);
      if (m->rope_low_freq_factor != 1.0 || m->rope_high_freq_factor != 4.0
          || m->rope_original_max_positions != 8192)
        return unsupported (
            error, e,
            "%s's Llama 3 rope scaling has low_freq_factor %g, "
            "high_freq_factor %g, original_max_position_embeddings "
            "%" G_GUINT64_FORMAT "; Megatron-LM fixes them at 1, 4 and 8192",
            m->name, m->rope_low_freq_factor, m->rope_high_freq_factor,
            m->rope_original_max_positions);
    }
  /* HF's Gemma modules (modeling_gemma*.py): the MLP gated by
   * tanh-approximated GELU (hidden_activation), the embedding scaled by
   * sqrt(hidden), RMSNorm as x (1 + w); Gemma 2 adds logit soft-capping
   * and sliding-window layers, Gemma 3 sliding-window layers and q/k
   * norms.  --swiglu and Megatron's RMSNorm would train another model. */
  if (m->family != NULL && g_str_has_prefix (m->family, "gemma"))
    return unsupported (
        error, e,
        "%s (%s) has no Megatron-LM GPT flags: its MLP is gated by GELU "
        "(GeGLU), not SiLU (--swiglu), its embedding is scaled by "
        "sqrt(hidden) and its RMSNorm multiplies by 1 + weight%s",
        m->name, m->family,
        g_str_equal (m->family, "gemma2")
            ? "; it also soft-caps logits and has sliding-window layers"
        : g_str_equal (m->family, "gemma") ? ""
                                           : "; it also has sliding-window "
                                             "layers and q/k norms");
  if (l->recompute == STOW_RECOMPUTE_OP)
    return unsupported (error, e, "%s", OP_AC_UNSUPPORTED);
  if (p->training.finetune != STOW_FINETUNE_FULL)
    return unsupported (error, e, "Megatron-LM has no %s fine-tuning",
                        stow_finetune_name (p->training.finetune));
  if (p->training.optimizer != STOW_OPTIMIZER_ADAMW
      && p->training.optimizer != STOW_OPTIMIZER_SGD)
    return unsupported (error, e,
                        "Megatron-LM's optimizers are adam (AdamW) and sgd, "
                        "not %s",
                        stow_optimizer_name (p->training.optimizer));
  return TRUE;
}

static void
flag (GString *s, const char *name)
{
  g_string_append_printf (s, "%s\n", name);
}

static void
flag_u (GString *s, const char *name, guint64 v)
{
  g_string_append_printf (s, "%s %" G_GUINT64_FORMAT "\n", name, v);
}

static void
flag_s (GString *s, const char *name, const char *v)
{
  g_string_append_printf (s, "%s %s\n", name, v);
}

char *
stow_emit_megatron (const StowPlanFile *p, GError **error)
{
  if (!precision_check (p, "megatron", error))
    return NULL;
  const StowLayout *l = &p->layout;
  const StowModel *m = p->model;
  const StowCluster *c = p->cluster;
  const StowTraining *t = &p->training;
  if (!megatron_check (p, "megatron", error))
    return NULL;

  GString *s = g_string_new (NULL);
  g_string_append_printf (s,
                          "# Megatron-LM arguments for %s on %s, written by "
                          "stowage (one flag per line).\n",
                          m->name, c->spec);
  g_string_append_printf (
      s,
      "# World size %u (dp %u x tp %u x pp %u x cp %u): torchrun --nnodes %u "
      "--nproc-per-node %u pretrain_gpt.py $(grep -v '^#' THIS_FILE) plus "
      "data and tokenizer flags.\n",
      c->n_gpus, l->dp, l->tp, l->pp, l->cp, c->n_nodes, c->node.gpus_per_node);

  flag_u (s, "--tensor-model-parallel-size", l->tp);
  flag_u (s, "--pipeline-model-parallel-size", l->pp);
  flag_u (s, "--context-parallel-size", l->cp);
  if (m->n_experts)
    {
      flag_u (s, "--expert-model-parallel-size", l->ep);
      /* Megatron-core's default is --tensor-model-parallel-size: written
       * out so the file says what the plan priced. */
      flag_u (s, "--expert-tensor-parallel-size", stow_layout_etp (l));
    }
  if (l->vpp > 1)
    flag_u (s, "--num-layers-per-virtual-pipeline-stage",
            stow_layout_split_slots (l, m->n_layers)
                / ((guint64)l->pp * l->vpp));
  if (l->pp_split_ends)
    {
      flag (s, "--account-for-embedding-in-pipeline-split");
      flag (s, "--account-for-loss-in-pipeline-split");
    }
  if (l->sp && l->tp > 1)
    flag (s, "--sequence-parallel");
  if (l->zero == 1)
    {
      flag (s, "--use-distributed-optimizer");
      flag (s, "--overlap-grad-reduce");
      flag (s, "--overlap-param-gather");
    }
  if (l->offload_optimizer == STOW_OFFLOAD_CPU)
    {
      g_string_append (s, "# --optimizer-cpu-offload needs Megatron-LM "
                          "core_v0.12.0 or later (ADLR/megatron-lm!2526, "
                          "February 2025).\n");
      flag (s, "--optimizer-cpu-offload");
      flag_s (s, "--optimizer-offload-fraction", "1.0");
    }
  switch (l->recompute)
    {
    case STOW_RECOMPUTE_SELECTIVE:
      flag_s (s, "--recompute-granularity", "selective");
      break;
    case STOW_RECOMPUTE_FULL:
      flag_s (s, "--recompute-granularity", "full");
      if (l->recompute_layers)
        {
          /* The first k layers of each stage (each model chunk under
           * interleaving): Megatron's "block". */
          flag_s (s, "--recompute-method", "block");
          flag_u (s, "--recompute-num-layers", l->recompute_layers);
        }
      else
        {
          flag_s (s, "--recompute-method", "uniform");
          flag_u (s, "--recompute-num-layers", 1);
        }
      break;
    case STOW_RECOMPUTE_NONE:
    case STOW_RECOMPUTE_OP: /* refused by megatron_check */
      break;
    }

  flag_u (s, "--micro-batch-size", l->micro_batch);
  flag_u (s, "--global-batch-size", global_batch (l));
  flag_u (s, "--seq-length", t->seq_len);
  switch (t->precision)
    {
    case STOW_PRECISION_BF16:
      flag (s, "--bf16");
      break;
    case STOW_PRECISION_FP16:
      flag (s, "--fp16");
      break;
    case STOW_PRECISION_FP8:
      flag (s, "--bf16");
      flag_s (s, "--fp8-format", "hybrid");
      break;
    case STOW_PRECISION_FP32:
    case STOW_PRECISION_BF16_PURE: /* refused by precision_check */
      break;
    }
  flag_s (s, "--optimizer",
          t->optimizer == STOW_OPTIMIZER_SGD ? "sgd" : "adam");
  stow_emit_megatron_optim (s, p);
  if (!t->dropout)
    {
      /* Megatron's defaults are 0.1; the plan counted no dropout masks. */
      flag_s (s, "--attention-dropout", "0.0");
      flag_s (s, "--hidden-dropout", "0.0");
    }

  /* The model's shape. */
  flag_u (s, "--num-layers", m->n_layers);
  flag_u (s, "--hidden-size", m->hidden);
  flag_u (s, "--ffn-hidden-size", m->ffn);
  flag_u (s, "--num-attention-heads", m->n_heads);
  if (m->n_kv_heads && m->n_kv_heads != m->n_heads)
    {
      flag (s, "--group-query-attention");
      flag_u (s, "--num-query-groups", m->n_kv_heads);
    }
  if (m->head_dim && m->head_dim * m->n_heads != m->hidden)
    flag_u (s, "--kv-channels", m->head_dim);
  if (m->gated_mlp)
    flag (s, "--swiglu");
  if (m->norm == STOW_NORM_RMSNORM)
    flag_s (s, "--normalization", "RMSNorm");
  /* rms_norm_eps where the config gives one (Megatron's default 1e-5 is
   * LLaMA-1/2's and Qwen's 1e-6 otherwise). */
  if (m->norm_eps > 0)
    g_string_append_printf (s, "--norm-epsilon %g\n", m->norm_eps);
  if (!m->linear_bias)
    flag (s, "--disable-bias-linear");
  if (!m->tied_embeddings)
    flag (s, "--untie-embeddings-and-output-weights");
  if (m->max_positions == 0)
    {
      flag_s (s, "--position-embedding-type", "rope");
      flag_u (s, "--max-position-embeddings", t->seq_len);
      /* The model's RoPE base: Megatron's default of 10000 is wrong for
       * Llama 3 (500000) and Mixtral (1e6). */
      if (m->rope_theta > 0)
        g_string_append_printf (s, "--rotary-base %.0f\n", m->rope_theta);
      else
        g_string_append (s, "# rope_theta is not in the model's config as "
                            "read: Megatron-LM's --rotary-base 10000 "
                            "applies\n");
      if (m->rope_type != NULL && g_str_equal (m->rope_type, "llama3"))
        {
          flag (s, "--use-rope-scaling");
          g_string_append_printf (s, "--rope-scaling-factor %g\n",
                                  m->rope_factor);
        }
    }
  else
    {
      flag_s (s, "--position-embedding-type", "learned_absolute");
      flag_u (s, "--max-position-embeddings", m->max_positions);
    }
  if (p->mem_options.vocab_multiple)
    flag_u (s, "--make-vocab-size-divisible-by", p->mem_options.vocab_multiple);
  if (m->n_experts)
    {
      flag_u (s, "--num-experts", m->n_experts);
      flag_u (s, "--moe-router-topk", m->experts_per_token);
      flag_u (s, "--moe-ffn-hidden-size", m->moe_ffn ? m->moe_ffn : m->ffn);
      if (m->n_shared_experts)
        flag_u (s, "--moe-shared-expert-intermediate-size",
                m->n_shared_experts * (m->moe_ffn ? m->moe_ffn : m->ffn));
      if (m->first_dense_layers)
        g_string_append_printf (s,
                                "--moe-layer-freq ([0]*%" G_GUINT64_FORMAT
                                "+[1]*%" G_GUINT64_FORMAT ")\n",
                                m->first_dense_layers,
                                m->n_layers - m->first_dense_layers);
    }
  if (m->kv_lora_rank)
    {
      flag (s, "--multi-latent-attention");
      if (m->q_lora_rank)
        flag_u (s, "--q-lora-rank", m->q_lora_rank);
      flag_u (s, "--kv-lora-rank", m->kv_lora_rank);
      flag_u (s, "--qk-head-dim", m->qk_nope_head_dim);
      flag_u (s, "--qk-pos-emb-head-dim", m->qk_rope_head_dim);
      flag_u (s, "--v-head-dim", m->v_head_dim);
    }
  g_string_append_printf (s,
                          "# tokenizer vocabulary: %" G_GUINT64_FORMAT
                          " (Megatron pads it to the multiple above x tp)\n",
                          m->vocab);
  return g_string_free (s, FALSE);
}

/* ---- FSDP ---- */

static const char *
torch_dtype (StowPrecision p)
{
  switch (p)
    {
    case STOW_PRECISION_FP16:
      return "torch.float16";
    case STOW_PRECISION_BF16:
      return "torch.bfloat16";
    default:
      return "torch.float32";
    }
}

static gboolean
fsdp_check (const StowPlanFile *p, const char *e, GError **error)
{
  const StowLayout *l = &p->layout;
  if (!etp_check (p, e, error))
    return FALSE;
  if (l->tp > 1 || l->pp > 1 || l->cp > 1 || l->ep > 1)
    return unsupported (error, e,
                        "FSDP shards data-parallel ranks only; tp %u pp %u cp "
                        "%u ep %u need a composed setup (e.g. torchtitan) or "
                        "--emit megatron",
                        l->tp, l->pp, l->cp, l->ep);
  if (l->zero == 1)
    return unsupported (error, e,
                        "FSDP has no ZeRO-1 strategy (NO_SHARD, "
                        "SHARD_GRAD_OP, FULL_SHARD)");
  if (l->offload_optimizer == STOW_OFFLOAD_NVME
      || l->offload_params == STOW_OFFLOAD_NVME)
    return unsupported (error, e, "FSDP cannot offload to NVMe");
  if ((l->offload_optimizer == STOW_OFFLOAD_CPU)
      != (l->offload_params == STOW_OFFLOAD_CPU))
    return unsupported (error, e,
                        "FSDP's CPU offload moves parameters, gradients and "
                        "the optimizer step together; the layout offloads "
                        "only the %s",
                        l->offload_params == STOW_OFFLOAD_CPU ? "parameters"
                                                              : "optimizer");
  if (l->recompute == STOW_RECOMPUTE_SELECTIVE)
    return unsupported (error, e,
                        "selective recomputation is Megatron's; FSDP "
                        "checkpoints whole blocks");
  if (l->recompute == STOW_RECOMPUTE_OP)
    return unsupported (error, e, "%s", OP_AC_UNSUPPORTED);
  if (l->offload_activations)
    return unsupported (error, e,
                        "activation checkpoints on the CPU are not part of "
                        "FSDP's arguments");
  if (p->training.precision == STOW_PRECISION_FP8)
    return unsupported (error, e,
                        "fp8 comes from torchao's float8 training, not "
                        "FSDP's MixedPrecisionPolicy");
  if (l->hybrid_shard && p->cluster->n_nodes < 2)
    return unsupported (error, e,
                        "hybrid sharding needs more than one node "
                        "(replicate across nodes, shard within)");
  return TRUE;
}

char *
stow_emit_fsdp (const StowPlanFile *p, GError **error)
{
  if (!precision_check (p, "fsdp", error))
    return NULL;
  const StowLayout *l = &p->layout;
  const StowCluster *c = p->cluster;
  if (!fsdp_check (p, "fsdp", error))
    return NULL;
  gboolean offload = l->offload_params == STOW_OFFLOAD_CPU;
  gboolean mp = p->training.precision != STOW_PRECISION_FP32;
  const char *dtype = torch_dtype (p->training.precision);
  /* HSDP: replicate across nodes, shard within one; ZeRO 0: replicate
   * every rank (a shard group of one). */
  guint replicate = l->zero == 0      ? l->dp
                    : l->hybrid_shard ? l->dp / c->node.gpus_per_node
                                      : 1;
  guint shard = l->dp / replicate;
  const char *strategy
      = l->zero == 0 ? "NO_SHARD"
        : l->zero == 2
            ? (l->hybrid_shard ? "_HYBRID_SHARD_ZERO2" : "SHARD_GRAD_OP")
        : l->hybrid_shard ? "HYBRID_SHARD"
                          : "FULL_SHARD";

  GString *s = g_string_new (NULL);
  g_string_append_printf (
      s,
      "# PyTorch FSDP for %s on %s (dp %u, ZeRO %u%s%s), written by "
      "stowage.\n"
      "# Micro-batch %" G_GUINT64_FORMAT " per GPU, %" G_GUINT64_FORMAT
      " accumulation steps: %" G_GUINT64_FORMAT " sequences per step.\n",
      p->model ? p->model->name : "the model", c->spec, l->dp, l->zero,
      l->hybrid_shard ? ", hybrid" : "", offload ? ", CPU offload" : "",
      l->micro_batch, l->grad_accum, global_batch (l));
  g_string_append (s, "import torch\n"
                      "from torch.distributed.device_mesh import "
                      "init_device_mesh\n\n");
  g_string_append (s, "MICRO_BATCH_SIZE = ");
  g_string_append_printf (s, "%" G_GUINT64_FORMAT "\n", l->micro_batch);
  g_string_append_printf (
      s, "GRADIENT_ACCUMULATION_STEPS = %" G_GUINT64_FORMAT "\n",
      l->grad_accum);
  g_string_append_printf (s, "ACTIVATION_CHECKPOINTING = %s\n",
                          l->recompute == STOW_RECOMPUTE_FULL ? "True"
                                                              : "False");
  if (l->recompute == STOW_RECOMPUTE_FULL)
    {
      /* --recompute full:K: the memory model keeps the activations of all
       * but the first K blocks, so only those K are wrapped, with the
       * check_fn FSDP's tutorials pass to apply_activation_checkpointing
       * (torch.distributed.algorithms._checkpoint.checkpoint_wrapper). */
      guint k = partial_recompute_layers (p);
      guint64 n = p->model ? p->model->n_layers : 0;
      if (k)
        g_string_append_printf (s,
                                "CHECKPOINTED_BLOCKS = %u  # the first %u "
                                "of %" G_GUINT64_FORMAT
                                " transformer blocks (recompute full:%u)\n",
                                k, k, n, k);
      else
        g_string_append (s, "CHECKPOINTED_BLOCKS = None  # every "
                            "transformer block\n");
      g_string_append (
          s,
          "\n# Activation checkpointing, before fully_shard (FSDP2) or "
          "FullyShardedDataParallel (FSDP1):\n"
          "#   apply_checkpointing(model, model.model.layers)  # the "
          "block list of an HF Llama\n"
          "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper "
          "import apply_activation_checkpointing, checkpoint_wrapper\n\n"
          "def apply_checkpointing(model, blocks):\n"
          "    chosen = set(blocks[:CHECKPOINTED_BLOCKS])\n"
          "    apply_activation_checkpointing(model, "
          "checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: m in "
          "chosen)\n");
    }
  g_string_append (s, "\n");

  g_string_append (s, "# FSDP2 (torch >= 2.6): fully_shard each transformer "
                      "block, then the root module.\n"
                      "from torch.distributed.fsdp import fully_shard, "
                      "MixedPrecisionPolicy, CPUOffloadPolicy, "
                      "OffloadPolicy\n\n");
  if (replicate > 1)
    g_string_append_printf (s,
                            "mesh = init_device_mesh(\"cuda\", (%u, %u), "
                            "mesh_dim_names=(\"replicate\", \"shard\"))\n",
                            replicate, shard);
  else
    g_string_append_printf (s,
                            "mesh = init_device_mesh(\"cuda\", (%u,), "
                            "mesh_dim_names=(\"shard\",))\n",
                            shard);
  g_string_append (s, "FSDP2_KWARGS = dict(\n    mesh=mesh,\n");
  g_string_append_printf (s, "    reshard_after_forward=%s,\n",
                          l->zero == 3 ? "True" : "False");
  if (mp)
    g_string_append_printf (s,
                            "    mp_policy=MixedPrecisionPolicy("
                            "param_dtype=%s, reduce_dtype=torch.float32),\n",
                            dtype);
  g_string_append_printf (s, "    offload_policy=%s,\n)\n\n",
                          offload ? "CPUOffloadPolicy(pin_memory=True)"
                                  : "OffloadPolicy()");

  g_string_append (s, "# FSDP1 equivalent: FullyShardedDataParallel(model, "
                      "**FSDP1_KWARGS)\n"
                      "from torch.distributed.fsdp import (BackwardPrefetch, "
                      "CPUOffload, MixedPrecision, ShardingStrategy)\n\n");
  g_string_append (s, "FSDP1_KWARGS = dict(\n");
  g_string_append_printf (s, "    sharding_strategy=ShardingStrategy.%s,\n",
                          strategy);
  if (replicate > 1 && l->hybrid_shard)
    g_string_append (s, "    device_mesh=mesh,\n");
  g_string_append_printf (s, "    cpu_offload=CPUOffload(offload_params=%s),\n",
                          offload ? "True" : "False");
  if (mp)
    g_string_append_printf (s,
                            "    mixed_precision=MixedPrecision(param_dtype=%s,"
                            " reduce_dtype=torch.float32, buffer_dtype=%s),\n",
                            dtype, dtype);
  g_string_append (s, "    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
                      "    limit_all_gathers=True,\n"
                      "    use_orig_params=True,\n)\n");
  stow_emit_fsdp_optim (s, p);
  return g_string_free (s, FALSE);
}

/* ---- accelerate ---- */

static const char *
accelerate_precision (StowPrecision p)
{
  switch (p)
    {
    case STOW_PRECISION_FP16:
      return "fp16";
    case STOW_PRECISION_BF16:
      return "bf16";
    case STOW_PRECISION_FP8:
      return "fp8";
    default:
      return "'no'";
    }
}

/* The distributed_type accelerate runs @p with (and the label its errors
 * carry): the engine the plan was made for picks the backend; stowage's
 * own plans go to DeepSpeed when they shard or offload. */
static gboolean
accelerate_type (const StowPlanFile *p, const char **type_out,
                 const char **label_out, GError **error)
{
  const StowLayout *l = &p->layout;
  const StowCluster *c = p->cluster;
  const char *type;
  const char *label = "accelerate";

  switch (l->engine)
    {
    case STOW_ENGINE_FSDP:
      type = "FSDP";
      label = "accelerate (distributed_type FSDP)";
      if (!fsdp_check (p, label, error))
        return FALSE;
      /* NO_SHARD is plain data parallelism: accelerate's DDP. */
      if (l->zero == 0)
        type = c->n_gpus > 1 ? "MULTI_GPU" : "NO";
      break;
    case STOW_ENGINE_MEGATRON:
    case STOW_ENGINE_NEMO: /* the same Megatron-core layout */
      type = "MEGATRON_LM";
      label = "accelerate (distributed_type MEGATRON_LM)";
      if (!megatron_check (p, label, error) || !etp_check (p, label, error))
        return FALSE;
      /* megatron_lm_config has tp, pp and micro-batches only. */
      if (l->vpp > 1 || l->cp > 1 || l->ep > 1)
        return unsupported (error, label,
                            "megatron_lm_config has no setting for %s; use "
                            "--emit megatron",
                            l->vpp > 1  ? "virtual pipeline stages (vpp)"
                            : l->cp > 1 ? "context parallelism"
                                        : "expert parallelism");
      break;
    case STOW_ENGINE_DEEPSPEED:
      type = "DEEPSPEED";
      label = "accelerate (distributed_type DEEPSPEED)";
      if (!deepspeed_check (p, label, error))
        return FALSE;
      break;
    default:
      if (l->zero == 0 && l->offload_optimizer == STOW_OFFLOAD_NONE
          && l->tp * l->pp * l->cp * l->ep == 1)
        type = c->n_gpus > 1 ? "MULTI_GPU" : "NO";
      else
        {
          type = "DEEPSPEED";
          label = "accelerate (distributed_type DEEPSPEED)";
          if (!deepspeed_check (p, label, error))
            return FALSE;
        }
      break;
    }

  if (strcmp (type, "DEEPSPEED") == 0 && l->pp > 1)
    return unsupported (error, label,
                        "accelerate's DeepSpeed integration has no pipeline "
                        "stages (pp %u); use --emit deepspeed with a "
                        "PipelineModule",
                        l->pp);
  /* accelerate's MegatronLMPlugin turns megatron_lm_recompute_activations
   * into recompute_granularity "selective" (utils/dataclasses.py). */
  if (strcmp (type, "MEGATRON_LM") == 0 && l->recompute == STOW_RECOMPUTE_FULL)
    return unsupported (error, label,
                        "megatron_lm_recompute_activations is selective "
                        "recomputation; the layout recomputes whole layers "
                        "(--recompute full): use --emit megatron");
  /* fsdp_activation_checkpointing, and the gradient checkpointing a
   * script turns on for the other types, wrap every block. */
  if (strcmp (type, "MEGATRON_LM") != 0 && partial_recompute_layers (p))
    return unsupported (error, label,
                        "accelerate checkpoints every transformer block or "
                        "none; the layout recomputes the first %u "
                        "(--recompute full:%u): use --emit fsdp, or "
                        "--recompute full",
                        l->recompute_layers, l->recompute_layers);
  *type_out = type;
  *label_out = label;
  return TRUE;
}

char *
stow_emit_accelerate (const StowPlanFile *p, GError **error)
{
  if (!precision_check (p, "accelerate", error))
    return NULL;
  const StowLayout *l = &p->layout;
  const StowCluster *c = p->cluster;
  const char *type, *label;
  if (!accelerate_type (p, &type, &label, error))
    return NULL;

  GString *s = g_string_new (NULL);
  g_string_append_printf (s,
                          "# accelerate config for %s on %s, written by "
                          "stowage: accelerate launch --config_file THIS_FILE "
                          "train.py\n",
                          p->model ? p->model->name : "the model", c->spec);
  if (c->n_nodes > 1)
    g_string_append (s, "# On each node set machine_rank (0..num_machines-1) "
                        "and main_process_ip.\n");
  /* Only fsdp_config has a key for activation checkpointing; the plan's
   * memory counts on it, so say where it goes. */
  if (l->recompute == STOW_RECOMPUTE_FULL && strcmp (type, "FSDP") != 0
      && strcmp (type, "MEGATRON_LM") != 0)
    g_string_append (s, "# The plan recomputes every layer (--recompute "
                        "full): turn activation checkpointing on in train.py "
                        "(model.gradient_checkpointing_enable() for a "
                        "transformers model); this distributed_type has no "
                        "key for it.\n");
  g_string_append (s, "compute_environment: LOCAL_MACHINE\n");
  g_string_append_printf (s, "distributed_type: %s\n", type);
  g_string_append_printf (s, "mixed_precision: %s\n",
                          accelerate_precision (p->training.precision));
  g_string_append_printf (s, "num_machines: %u\n", c->n_nodes);
  g_string_append_printf (s, "num_processes: %u\n", c->n_gpus);
  g_string_append (s, "machine_rank: 0\n");
  if (c->n_nodes > 1)
    g_string_append (s, "main_process_ip: null\n"
                        "main_process_port: 29500\n"
                        "rdzv_backend: static\n"
                        "same_network: true\n");
  g_string_append (s, "use_cpu: false\n");
  if (strcmp (type, "DEEPSPEED") == 0)
    {
      g_string_append (s, "deepspeed_config:\n");
      g_string_append_printf (s, "  zero_stage: %u\n", l->zero);
      g_string_append_printf (
          s, "  gradient_accumulation_steps: %" G_GUINT64_FORMAT "\n",
          l->grad_accum);
      g_string_append_printf (s, "  offload_optimizer_device: %s\n",
                              stow_offload_name (l->offload_optimizer));
      g_string_append_printf (s, "  offload_param_device: %s\n",
                              stow_offload_name (l->offload_params));
      if (l->offload_optimizer == STOW_OFFLOAD_NVME)
        g_string_append_printf (s, "  offload_optimizer_nvme_path: %s\n",
                                nvme_path (p));
      if (l->offload_params == STOW_OFFLOAD_NVME)
        g_string_append_printf (s, "  offload_param_nvme_path: %s\n",
                                nvme_path (p));
      g_string_append_printf (s, "  zero3_init_flag: %s\n",
                              l->zero == 3 ? "true" : "false");
      g_string_append (s, "  gradient_clipping: ");
      stow_emit_append_double (s, MAX (p->training.optim.max_grad_norm, 0.0));
      g_string_append_c (s, '\n');
      if (l->zero == 3)
        g_string_append (s, "  zero3_save_16bit_model: true\n");
      if (c->n_nodes > 1)
        g_string_append (s, "  deepspeed_multinode_launcher: standard\n");
    }
  else if (strcmp (type, "FSDP") == 0)
    {
      g_string_append (s, "fsdp_config:\n  fsdp_version: 2\n");
      g_string_append_printf (s, "  fsdp_reshard_after_forward: %s\n",
                              l->zero == 3 ? "true" : "false");
      g_string_append_printf (s, "  fsdp_offload_params: %s\n",
                              l->offload_params == STOW_OFFLOAD_CPU ? "true"
                                                                    : "false");
      g_string_append (s, "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                          "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                          "  fsdp_cpu_ram_efficient_loading: true\n");
      g_string_append_printf (s, "  fsdp_activation_checkpointing: %s\n",
                              l->recompute == STOW_RECOMPUTE_FULL ? "true"
                                                                  : "false");
      if (l->hybrid_shard)
        g_string_append_printf (s,
                                "parallelism_config:\n"
                                "  parallelism_config_dp_replicate_size: %u\n"
                                "  parallelism_config_dp_shard_size: %u\n",
                                c->n_nodes, l->dp / c->n_nodes);
    }
  else if (strcmp (type, "MEGATRON_LM") == 0)
    {
      g_string_append (s, "megatron_lm_config:\n");
      g_string_append_printf (s, "  megatron_lm_tp_degree: %u\n", l->tp);
      g_string_append_printf (s, "  megatron_lm_pp_degree: %u\n", l->pp);
      g_string_append_printf (
          s, "  megatron_lm_num_micro_batches: %" G_GUINT64_FORMAT "\n",
          l->grad_accum);
      g_string_append_printf (s, "  megatron_lm_sequence_parallelism: %s\n",
                              l->sp ? "true" : "false");
      g_string_append_printf (
          s, "  megatron_lm_recompute_activations: %s\n",
          l->recompute == STOW_RECOMPUTE_SELECTIVE ? "true" : "false");
      g_string_append_printf (s,
                              "  megatron_lm_use_distributed_optimizer: %s\n",
                              l->zero == 1 ? "true" : "false");
      g_string_append (s, "  megatron_lm_gradient_clipping: ");
      stow_emit_append_double (s, MAX (p->training.optim.max_grad_norm, 0.0));
      g_string_append_c (s, '\n');
    }
  return g_string_free (s, FALSE);
}

gboolean
stow_emit_check (StowEmitKind kind, const StowModel *model,
                 const StowCluster *cluster, const StowTraining *training,
                 const StowLayout *layout, GError **error)
{
  g_return_val_if_fail (cluster != NULL && training != NULL && layout != NULL,
                        FALSE);
  /* The checks read the model, cluster, training and layout of a plan and
   * nothing else: a view on the stack, owning nothing, stands in for one
   * (this runs for every layout a search visits). */
  StowPlanFile view;
  memset (&view, 0, sizeof view);
  view.model = (StowModel *)model;
  view.cluster = (StowCluster *)cluster;
  view.training = *training;
  view.layout = *layout;
  const char *name = stow_emit_kind_name (kind);
  const char *type, *label;
  switch (kind)
    {
    case STOW_EMIT_DEEPSPEED:
      return precision_check (&view, name, error)
             && deepspeed_check (&view, name, error);
    case STOW_EMIT_MEGATRON:
      return precision_check (&view, name, error)
             && megatron_check (&view, name, error);
    case STOW_EMIT_FSDP:
      return precision_check (&view, name, error)
             && fsdp_check (&view, name, error);
    case STOW_EMIT_ACCELERATE:
      return precision_check (&view, name, error)
             && accelerate_type (&view, &type, &label, error);
    case STOW_EMIT_PLAN:
      return TRUE;
    }
  g_return_val_if_reached (FALSE);
}

guint
stow_emit_kind_engines (StowEmitKind kind)
{
  switch (kind)
    {
    case STOW_EMIT_DEEPSPEED:
      return 1u << STOW_ENGINE_DEEPSPEED;
    case STOW_EMIT_MEGATRON:
      return 1u << STOW_ENGINE_MEGATRON;
    case STOW_EMIT_FSDP:
      return 1u << STOW_ENGINE_FSDP;
    case STOW_EMIT_ACCELERATE:
      /* distributed_type DEEPSPEED, FSDP (MULTI_GPU for NO_SHARD) and
       * MEGATRON_LM; NO, plain PyTorch, on one GPU. */
      return (1u << STOW_ENGINE_DEEPSPEED) | (1u << STOW_ENGINE_FSDP)
             | (1u << STOW_ENGINE_MEGATRON) | (1u << STOW_ENGINE_PYTORCH);
    case STOW_EMIT_PLAN:
      return 0;
    }
  g_return_val_if_reached (0);
}

char **
stow_emit_warnings (StowEmitKind kind, const StowPlanFile *p)
{
  const StowLayout *l = &p->layout;
  GPtrArray *w = g_ptr_array_new ();
  gboolean nvme = l->offload_optimizer == STOW_OFFLOAD_NVME
                  || l->offload_params == STOW_OFFLOAD_NVME;
  /* DeepSpeed's swapper writes where nvme_path says; a placeholder on a
   * machine without it fails at start-up or fills the root disk. */
  if (nvme && stow_plan_streaming_nvme_placeholder (&p->streaming)
      && (kind == STOW_EMIT_DEEPSPEED || kind == STOW_EMIT_ACCELERATE
          || kind == STOW_EMIT_PLAN))
    g_ptr_array_add (
        w, g_strdup_printf (
               "--emit %s: the NVMe swap directory (%s) is %s, a placeholder: "
               "%s names no NVMe mount point; give --nvme-path DIR (or "
               "\"path\" for the drives in a cluster.json) before launching",
               stow_emit_kind_name (kind),
               kind == STOW_EMIT_DEEPSPEED    ? "nvme_path"
               : kind == STOW_EMIT_ACCELERATE ? "offload_*_nvme_path"
                                              : "nvme_paths",
               STOW_PLAN_NVME_PLACEHOLDER, p->cluster->spec));
  /* The loss is the training script's, which no config sets: a plan that
   * counted flash-attn's fused cross-entropy holds only if the script
   * calls it. */
  if (p->training.fused_loss && kind != STOW_EMIT_PLAN)
    g_ptr_array_add (
        w, g_strdup_printf (
               "--emit %s: the plan counts the loss as flash-attn's fused "
               "cross-entropy (--fused-loss, 2 + 2 B a logit); the config "
               "cannot set it: call flash_attn.losses.cross_entropy."
               "CrossEntropyLoss in the training script, or PyTorch's "
               "cross-entropy keeps 10 B a logit",
               stow_emit_kind_name (kind)));
  /* DeepSpeed pipelines a model built as a PipelineModule; its JSON has
   * no key for the stages. */
  if (kind == STOW_EMIT_DEEPSPEED && l->pp > 1)
    g_ptr_array_add (
        w, g_strdup_printf (
               "--emit deepspeed: the layout has %u pipeline stages, which "
               "no DeepSpeed config key sets: build the model as "
               "deepspeed.pipe.PipelineModule (layers, num_stages=%u) and "
               "train with engine.train_batch ()",
               l->pp, l->pp));
  g_ptr_array_add (w, NULL);
  return (char **)g_ptr_array_free (w, FALSE);
}

char **
stow_emit_notes (StowEmitKind kind, const StowPlanFile *p)
{
  GPtrArray *notes = g_ptr_array_new ();
  const char *type = NULL, *label = NULL;
  if (kind == STOW_EMIT_ACCELERATE && !accelerate_type (p, &type, &label, NULL))
    type = NULL; /* not expressible: the emitter says so */
  if (kind != STOW_EMIT_ACCELERATE || type != NULL)
    stow_emit_optim_notes (kind, p, type, notes);
  g_ptr_array_add (notes, NULL);
  return (char **)g_ptr_array_free (notes, FALSE);
}

char *
stow_emit (StowEmitKind kind, const StowPlanFile *plan, const StowMemory *mem,
           GError **error)
{
  switch (kind)
    {
    case STOW_EMIT_DEEPSPEED:
      {
        g_autoptr (JsonNode) n = stow_emit_deepspeed (plan, error);
        return n ? stow_json_to_string (n, TRUE) : NULL;
      }
    case STOW_EMIT_MEGATRON:
      return stow_emit_megatron (plan, error);
    case STOW_EMIT_FSDP:
      return stow_emit_fsdp (plan, error);
    case STOW_EMIT_ACCELERATE:
      return stow_emit_accelerate (plan, error);
    case STOW_EMIT_PLAN:
      {
        g_autoptr (JsonNode) n = stow_plan_file_to_json (plan, mem);
        return stow_json_to_string (n, TRUE);
      }
    }
  g_return_val_if_reached (NULL);
}
