/* SPDX-License-Identifier: MIT
 *
 * planner/layout.c: names, parsing and validation of training settings and
 * layouts.
 */
#include "planner/layout.h"

#include <string.h>

#include "core/strutil.h"

/* clang-format off */
G_DEFINE_QUARK (stow-plan-error-quark, stow_plan_error)
/* clang-format on */

void
stow_training_init (StowTraining *t)
{
  memset (t, 0, sizeof *t);
  t->seq_len = 2048;
  t->global_batch = 0; /* 0: one micro-batch per data-parallel replica */
  t->precision = STOW_PRECISION_BF16;
  t->optimizer = STOW_OPTIMIZER_ADAMW;
  t->finetune = STOW_FINETUNE_FULL;
  t->lora_rank = 8;
  t->flash_attention = TRUE;
  stow_optim_settings_init (&t->optim);
}

void
stow_layout_init (StowLayout *l)
{
  memset (l, 0, sizeof *l);
  l->dp = l->tp = l->pp = l->vpp = l->cp = l->ep = 1;
  l->micro_batch = 1;
  l->grad_accum = 1;
  l->schedule = STOW_SCHEDULE_1F1B;
  l->engine = STOW_ENGINE_STOWAGE;
  l->resident_layers = STOW_RESIDENT_AUTO;
}

typedef struct
{
  const char *name;
  int value;
} NameValue;

static const NameValue precision_names[] = {
  { "fp32", STOW_PRECISION_FP32 },
  { "fp16", STOW_PRECISION_FP16 },
  { "bf16", STOW_PRECISION_BF16 },
  { "fp8", STOW_PRECISION_FP8 },
  { "float32", STOW_PRECISION_FP32 },
  { "fp16-mixed", STOW_PRECISION_FP16 },
  { "bf16-mixed", STOW_PRECISION_BF16 },
  { "16-mixed", STOW_PRECISION_FP16 },
  { "bf16-pure", STOW_PRECISION_BF16_PURE },
  { "pure-bf16", STOW_PRECISION_BF16_PURE },
};
static const NameValue optimizer_names[] = {
  { "adamw", STOW_OPTIMIZER_ADAMW },
  { "adamw-8bit", STOW_OPTIMIZER_ADAMW_8BIT },
  { "sgd", STOW_OPTIMIZER_SGD },
  { "adafactor", STOW_OPTIMIZER_ADAFACTOR },
  { "lion", STOW_OPTIMIZER_LION },
  { "adam", STOW_OPTIMIZER_ADAMW },
  { "adamw8bit", STOW_OPTIMIZER_ADAMW_8BIT },
  { "adam8bit", STOW_OPTIMIZER_ADAMW_8BIT },
};
static const NameValue finetune_names[] = {
  { "full", STOW_FINETUNE_FULL },
  { "lora", STOW_FINETUNE_LORA },
  { "qlora", STOW_FINETUNE_QLORA },
};
static const NameValue offload_names[] = {
  { "none", STOW_OFFLOAD_NONE },
  { "cpu", STOW_OFFLOAD_CPU },
  { "nvme", STOW_OFFLOAD_NVME },
};
static const NameValue recompute_names[] = {
  { "none", STOW_RECOMPUTE_NONE },
  { "selective", STOW_RECOMPUTE_SELECTIVE },
  { "full", STOW_RECOMPUTE_FULL },
  { "selective-op", STOW_RECOMPUTE_OP },
};
static const NameValue schedule_names[] = {
  { "1f1b", STOW_SCHEDULE_1F1B },
  { "interleaved", STOW_SCHEDULE_INTERLEAVED },
  { "gpipe", STOW_SCHEDULE_GPIPE },
  { "interleaved-1f1b", STOW_SCHEDULE_INTERLEAVED },
};
static const NameValue engine_names[] = {
  { "stowage", STOW_ENGINE_STOWAGE },     { "pytorch", STOW_ENGINE_PYTORCH },
  { "deepspeed", STOW_ENGINE_DEEPSPEED }, { "megatron", STOW_ENGINE_MEGATRON },
  { "fsdp", STOW_ENGINE_FSDP },           { "nemo", STOW_ENGINE_NEMO },
};

/* The first entries of each table, up to the first synonym, are the
 * canonical names, in enum order. */
static const char *
value_name (const NameValue *t, gsize n, int v)
{
  for (gsize i = 0; i < n; i++)
    if (t[i].value == v)
      return t[i].name;
  return "?";
}

static gboolean
parse_name (const NameValue *t, gsize n, const char *s, const char *field,
            int *out, GError **error)
{
  g_autoptr (GPtrArray) names = g_ptr_array_new ();
  g_autoptr (GString) list = g_string_new (NULL);
  for (gsize i = 0; s != NULL && i < n; i++)
    if (g_ascii_strcasecmp (s, t[i].name) == 0)
      {
        *out = t[i].value;
        return TRUE;
      }
  for (gsize i = 0; i < n; i++)
    {
      g_ptr_array_add (names, (gpointer)t[i].name);
      gboolean canonical = TRUE;
      for (gsize j = 0; j < i; j++)
        if (t[j].value == t[i].value)
          canonical = FALSE;
      if (canonical)
        g_string_append_printf (list, "%s%s", list->len ? ", " : "", t[i].name);
    }
  const char *near
      = s ? stow_suggest (s, (const char *const *)names->pdata, names->len)
          : NULL;
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s \"%s\": not one of %s%s%s%s", field, s ? s : "", list->str,
               near ? " (did you mean " : "", near ? near : "",
               near ? "?)" : "");
  return FALSE;
}

#define NAME_FUNCS(lower, Type, table)                                         \
  const char *stow_##lower##_name (Type v)                                     \
  {                                                                            \
    return value_name (table, G_N_ELEMENTS (table), (int)v);                   \
  }                                                                            \
  gboolean stow_##lower##_parse (const char *s, const char *field, Type *out,  \
                                 GError **error)                               \
  {                                                                            \
    int v;                                                                     \
    if (!parse_name (table, G_N_ELEMENTS (table), s, field, &v, error))        \
      return FALSE;                                                            \
    *out = (Type)v;                                                            \
    return TRUE;                                                               \
  }

NAME_FUNCS (precision, StowPrecision, precision_names)
NAME_FUNCS (optimizer, StowOptimizer, optimizer_names)
NAME_FUNCS (finetune, StowFinetune, finetune_names)
NAME_FUNCS (offload, StowOffload, offload_names)
NAME_FUNCS (schedule, StowSchedule, schedule_names)
NAME_FUNCS (engine, StowEngine, engine_names)

gboolean
stow_engine_is_mcore (StowEngine e)
{
  return e == STOW_ENGINE_MEGATRON || e == STOW_ENGINE_NEMO;
}

const char *
stow_recompute_name (StowRecompute v)
{
  return value_name (recompute_names, G_N_ELEMENTS (recompute_names), (int)v);
}

/* "none", "selective", "full", "full:K" (the first K layers of each
 * stage) or "selective-op". */
gboolean
stow_recompute_parse (const char *s, const char *field, StowRecompute *out,
                      guint *layers, GError **error)
{
  int v;
  const char *colon = s ? strchr (s, ':') : NULL;
  if (colon != NULL)
    {
      g_autofree char *head = g_strndup (s, (gsize)(colon - s));
      guint64 k = 0;
      if (g_ascii_strcasecmp (head, "full") != 0
          || !g_ascii_string_to_unsigned (colon + 1, 10, 1, G_MAXUINT, &k,
                                          NULL))
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "%s \"%s\": expected none, selective, full, full:K "
                       "(K layers per stage, K >= 1) or selective-op",
                       field, s);
          return FALSE;
        }
      *out = STOW_RECOMPUTE_FULL;
      *layers = (guint)k;
      return TRUE;
    }
  if (!parse_name (recompute_names, G_N_ELEMENTS (recompute_names), s, field,
                   &v, error))
    return FALSE;
  *out = (StowRecompute)v;
  *layers = 0;
  return TRUE;
}

static const struct
{
  const char *name;
  guint bit;
} lora_target_names[] = {
  { "q", STOW_LORA_Q },       { "k", STOW_LORA_K },
  { "v", STOW_LORA_V },       { "o", STOW_LORA_O },
  { "gate", STOW_LORA_GATE }, { "up", STOW_LORA_UP },
  { "down", STOW_LORA_DOWN },
};

gboolean
stow_lora_targets_parse (const char *s, const char *field, guint *out,
                         GError **error)
{
  guint set = 0;
  if (s != NULL && g_ascii_strcasecmp (s, "all") == 0)
    {
      *out = STOW_LORA_ALL;
      return TRUE;
    }
  g_auto (GStrv) parts = g_strsplit (s ? s : "", ",", -1);
  for (guint i = 0; parts[i] != NULL; i++)
    {
      /* HF PEFT spells them q_proj, gate_proj, ...: accept both. */
      g_autofree char *name = g_strstrip (g_ascii_strdown (parts[i], -1));
      if (g_str_has_suffix (name, "_proj"))
        name[strlen (name) - 5] = '\0';
      gboolean found = FALSE;
      for (gsize k = 0; k < G_N_ELEMENTS (lora_target_names); k++)
        if (g_str_equal (name, lora_target_names[k].name))
          set |= lora_target_names[k].bit, found = TRUE;
      if (!found)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "%s \"%s\": unknown module \"%s\" (use q, k, v, o, "
                       "gate, up, down, or all)",
                       field, s ? s : "", parts[i]);
          return FALSE;
        }
    }
  *out = set;
  return TRUE;
}

char *
stow_lora_targets_name (guint targets)
{
  GString *s = g_string_new (NULL);
  if (targets == 0)
    targets = STOW_LORA_Q | STOW_LORA_V;
  for (gsize k = 0; k < G_N_ELEMENTS (lora_target_names); k++)
    if (targets & lora_target_names[k].bit)
      g_string_append_printf (s, "%s%s", s->len ? "," : "",
                              lora_target_names[k].name);
  return g_string_free (s, FALSE);
}

gboolean
stow_zero_parse (const char *s, const char *field, guint *stage,
                 gboolean *hybrid, GError **error)
{
  static const struct
  {
    const char *name;
    guint stage;
    gboolean hybrid;
  } names[] = {
    { "0", 0, FALSE },          { "1", 1, FALSE },
    { "2", 2, FALSE },          { "3", 3, FALSE },
    { "NO_SHARD", 0, FALSE },   { "SHARD_GRAD_OP", 2, FALSE },
    { "FULL_SHARD", 3, FALSE }, { "HYBRID_SHARD", 3, TRUE },
  };
  for (gsize i = 0; s != NULL && i < G_N_ELEMENTS (names); i++)
    if (g_ascii_strcasecmp (s, names[i].name) == 0)
      {
        *stage = names[i].stage;
        *hybrid = names[i].hybrid;
        return TRUE;
      }
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s \"%s\": expected 0, 1, 2, 3 or an FSDP strategy "
               "(NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD)",
               field, s ? s : "");
  return FALSE;
}

static gboolean invalid (GError **error, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static gboolean
invalid (GError **error, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error_literal (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID, msg);
  return FALSE;
}

gboolean
stow_training_check_model (const StowTraining *t, const StowModel *m,
                           GError **error)
{
  g_return_val_if_fail (t && m, FALSE);
  if (m->quant.method == STOW_QUANT_NONE || t->finetune != STOW_FINETUNE_FULL)
    return TRUE;
  /* PyTorch refuses gradients for integer tensors, and GPTQ / AWQ / bnb
   * store packed integers; transformers' Trainer refuses "purely
   * quantized models" without adapters for the same reason, and fp8
   * checkpoints have no optimizer that steps fp8 weights. */
  return invalid (error,
                  "%s is a %s %u-bit checkpoint (quantization_config): full "
                  "fine-tuning cannot update quantized weights; use "
                  "--finetune lora or qlora, or the unquantized model",
                  m->name, stow_quant_method_name (m->quant.method),
                  m->quant.bits);
}

gboolean
stow_training_check_gpu (const StowTraining *t, const StowGpu *gpu,
                         char **warning, GError **error)
{
  g_return_val_if_fail (t && gpu, FALSE);
  if (warning)
    *warning = NULL;
  /* fp8 GEMMs need fp8 tensor cores: Transformer Engine refuses fp8 below
   * compute capability 8.9 ("Device compute capability 8.9 or higher
   * required for FP8 execution", transformer_engine/pytorch/fp8.py), and
   * torchao's float8 training needs the same; nothing emulates it. */
  if (t->precision == STOW_PRECISION_FP8 && !(gpu->fp8_flops > 0))
    return invalid (error,
                    "--precision fp8: the %s has no fp8 tensor cores (no fp8 "
                    "rate in its GPU description); Transformer Engine runs "
                    "fp8 from compute capability 8.9 (Ada, Hopper) up and "
                    "no engine emulates it: use --precision %s",
                    gpu->name, gpu->bf16_flops > 0 ? "bf16" : "fp16");
  /* bf16 without bf16 tensor cores (before compute capability 8.0: V100,
   * T4): PyTorch still runs it, emulated (torch.cuda.is_bf16_supported
   * counts emulation as support), far below the fp16 rate the time model
   * prices it at. */
  if ((t->precision == STOW_PRECISION_BF16
       || t->precision == STOW_PRECISION_BF16_PURE)
      && !(gpu->bf16_flops > 0) && warning)
    *warning = g_strdup_printf (
        "--precision %s: the %s has no bf16 tensor cores (no bf16 rate in "
        "its GPU description; they came with compute capability 8.0, "
        "Ampere); PyTorch emulates bf16 there, much slower than the fp16 "
        "rate this prediction assumes: use --precision fp16",
        stow_precision_name (t->precision), gpu->name);
  return TRUE;
}

/* Every degree at least 1, every size within its bound. */
static gboolean
check_ranges (const StowLayout *l, const StowTraining *t, const StowModel *m,
              const StowCluster *c, GError **error)
{
  static const struct
  {
    const char *flag;
    gsize offset;
  } degrees[] = {
    { "--dp", G_STRUCT_OFFSET (StowLayout, dp) },
    { "--tp", G_STRUCT_OFFSET (StowLayout, tp) },
    { "--pp", G_STRUCT_OFFSET (StowLayout, pp) },
    { "--vpp", G_STRUCT_OFFSET (StowLayout, vpp) },
    { "--cp", G_STRUCT_OFFSET (StowLayout, cp) },
    { "--ep", G_STRUCT_OFFSET (StowLayout, ep) },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (degrees); i++)
    if (G_STRUCT_MEMBER (guint, l, degrees[i].offset) == 0)
      return invalid (error, "%s must be at least 1", degrees[i].flag);
  /* The bounds first: past them the products below would overflow. */
  static const struct
  {
    const char *flag, *unit;
    gsize offset;
    gboolean training;
    guint64 max;
  } bounds[] = {
    { "--seq", "tokens", G_STRUCT_OFFSET (StowTraining, seq_len), TRUE,
      STOW_MAX_SEQ_TOKENS },
    { "--decoder-seq", "tokens",
      G_STRUCT_OFFSET (StowTraining, decoder_seq_len), TRUE,
      STOW_MAX_SEQ_TOKENS },
    { "--global-batch", "sequences",
      G_STRUCT_OFFSET (StowTraining, global_batch), TRUE,
      STOW_MAX_GLOBAL_BATCH },
    { "--lora-rank", "", G_STRUCT_OFFSET (StowTraining, lora_rank), TRUE,
      STOW_MAX_LORA_RANK },
    { "--micro-batch", "sequences", G_STRUCT_OFFSET (StowLayout, micro_batch),
      FALSE, STOW_MAX_MICRO_BATCH },
    { "--grad-accum", "micro-batches", G_STRUCT_OFFSET (StowLayout, grad_accum),
      FALSE, STOW_MAX_GRAD_ACCUM },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bounds); i++)
    {
      guint64 v = G_STRUCT_MEMBER (
          guint64, bounds[i].training ? (gconstpointer)t : (gconstpointer)l,
          bounds[i].offset);
      if (v > bounds[i].max)
        return invalid (error,
                        "%s %" G_GUINT64_FORMAT ": at most %" G_GUINT64_FORMAT
                        "%s%s",
                        bounds[i].flag, v, bounds[i].max,
                        *bounds[i].unit ? " " : "", bounds[i].unit);
    }
  if (l->micro_batch * MAX (t->seq_len, t->decoder_seq_len)
      > STOW_MAX_MICRO_BATCH_TOKENS)
    return invalid (error,
                    "--micro-batch %" G_GUINT64_FORMAT
                    " x --seq %" G_GUINT64_FORMAT
                    ": at most 1,073,741,824 tokens per micro-batch",
                    l->micro_batch, MAX (t->seq_len, t->decoder_seq_len));
  return TRUE;
}

/* The degrees against the model's heads and layers and the cluster's
 * GPUs. */
static gboolean
check_shape (const StowLayout *l, const StowTraining *t, const StowModel *m,
             const StowCluster *c, GError **error)
{
  if (m->n_heads % l->tp != 0)
    return invalid (
        error, "--tp %u does not divide num_attention_heads %" G_GUINT64_FORMAT,
        l->tp, m->n_heads);
  if (m->n_kv_heads % l->tp != 0 && l->tp % m->n_kv_heads != 0)
    return invalid (error,
                    "--tp %u and num_key_value_heads %" G_GUINT64_FORMAT
                    " do not divide one another",
                    l->tp, m->n_kv_heads);
  /* In double: four degrees of up to 2^20 overflow 64 bits. */
  double world = (double)l->dp * l->tp * l->pp * l->cp;
  if (world != (double)c->n_gpus)
    return invalid (error,
                    "--dp %u x --tp %u x --pp %u x --cp %u = %.0f GPUs, but "
                    "the cluster \"%s\" has %u",
                    l->dp, l->tp, l->pp, l->cp, world, c->spec, c->n_gpus);
  if (l->tp > 1 && c->node.gpus_per_node % l->tp != 0)
    return invalid (error, "--tp %u does not divide the %u GPUs of a node",
                    l->tp, c->node.gpus_per_node);
  if (l->pp > m->n_layers)
    return invalid (
        error, "--pp %u is more than the model's %" G_GUINT64_FORMAT " layers",
        l->pp, m->n_layers);
  return TRUE;
}

/* --fused-loss is for the engines that run PyTorch's training code. */
static gboolean
check_loss_kernel (const StowLayout *l, const StowTraining *t,
                   const StowModel *m, const StowCluster *c, GError **error)
{
  if (t->fused_loss
      && (stow_engine_is_mcore (l->engine) || l->engine == STOW_ENGINE_STOWAGE))
    return invalid (error,
                    "--fused-loss is flash-attn's cross-entropy kernel, which "
                    "PyTorch training code calls (--engine pytorch, "
                    "deepspeed or fsdp); --engine %s runs its own loss",
                    stow_engine_name (l->engine));
  return TRUE;
}

/* The pipeline split: --pp-split-ends and interleaving against the
 * model's layers. */
static gboolean
check_pipeline_split (const StowLayout *l, const StowTraining *t,
                      const StowModel *m, const StowCluster *c, GError **error)
{
  if (l->pp_split_ends)
    {
      /* Megatron-core's account_for_{embedding,loss}_in_pipeline_split
       * (transformer_block.py, get_num_layers_to_build): layers + 2 divide
       * into pp stages, each stage's share into vpp chunks. */
      if (!stow_engine_is_mcore (l->engine))
        return invalid (error, "--pp-split-ends is Megatron-core's "
                               "--account-for-embedding-in-pipeline-split and "
                               "--account-for-loss-in-pipeline-split: it needs "
                               "--engine megatron or nemo");
      if (l->pp < 2)
        return invalid (error, "--pp-split-ends needs --pp > 1");
      if ((m->n_layers + 2) % ((guint64)l->pp * l->vpp) != 0)
        return invalid (error,
                        "--pp-split-ends: --pp %u x --vpp %u does not divide "
                        "the model's %" G_GUINT64_FORMAT
                        " layers + the embedding and the loss",
                        l->pp, l->vpp, m->n_layers);
    }
  if (l->vpp > 1)
    {
      if (l->pp == 1)
        return invalid (error, "--vpp %u needs --pp > 1", l->vpp);
      if (!l->pp_split_ends && m->n_layers % ((guint64)l->pp * l->vpp) != 0)
        return invalid (
            error,
            "--pp %u x --vpp %u does not divide the model's %" G_GUINT64_FORMAT
            " layers%s",
            l->pp, l->vpp, m->n_layers,
            stow_engine_is_mcore (l->engine)
                    && (m->n_layers + 2) % ((guint64)l->pp * l->vpp) == 0
                ? " (with the embedding and the loss in the split, "
                  "--pp-split-ends, they would)"
                : "");
    }
  return TRUE;
}

/* Sequence and context parallelism against the sequence lengths. */
static gboolean
check_sequence (const StowLayout *l, const StowTraining *t, const StowModel *m,
                const StowCluster *c, GError **error)
{
  if (l->sp && l->tp == 1)
    return invalid (error, "--sp needs --tp > 1");
  if (t->seq_len == 0)
    return invalid (error, "--seq must be at least 1");
  if (t->seq_len % l->cp != 0)
    return invalid (error, "--cp %u does not divide --seq %" G_GUINT64_FORMAT,
                    l->cp, t->seq_len);
  if (t->decoder_seq_len && m->n_encoder_layers == 0)
    return invalid (error,
                    "--decoder-seq %" G_GUINT64_FORMAT
                    " needs an encoder-decoder model; %s has no encoder",
                    t->decoder_seq_len, m->name);
  if (t->decoder_seq_len % l->cp != 0)
    return invalid (error,
                    "--cp %u does not divide --decoder-seq %" G_GUINT64_FORMAT,
                    l->cp, t->decoder_seq_len);
  return TRUE;
}

/* Expert parallelism and the experts' own tensor parallelism. */
static gboolean
check_experts (const StowLayout *l, const StowTraining *t, const StowModel *m,
               const StowCluster *c, GError **error)
{
  if (m->n_experts > 0 && l->tp > 1 && l->engine == STOW_ENGINE_DEEPSPEED)
    /* deepspeed/moe/layer.py: MoE (..., enable_expert_tensor_parallelism
     * = False); with tensor parallelism each rank keeps its experts whole
     * and drops the duplicate tokens (sharded_moe.py, drop_tokens). */
    return invalid (error,
                    "--tp %u with --engine deepspeed and a mixture of "
                    "experts (%s): DeepSpeed-MoE keeps every expert whole on "
                    "each tensor-parallel rank by default "
                    "(enable_expert_tensor_parallelism=False), which stowage "
                    "does not model; use --tp 1, or --engine megatron for "
                    "experts split by tensor parallelism",
                    l->tp, m->name);
  if (l->ep > 1)
    {
      if (m->n_experts == 0)
        return invalid (error,
                        "--ep %u needs a mixture-of-experts model; "
                        "%s has no experts",
                        l->ep, m->name);
      if (m->n_experts % l->ep != 0)
        return invalid (
            error, "--ep %u does not divide the %" G_GUINT64_FORMAT " experts",
            l->ep, m->n_experts);
      if (stow_layout_etp (l) == l->tp && (guint64)l->dp * l->cp % l->ep != 0)
        return invalid (error,
                        "--ep %u must divide --dp x --cp (%u); experts are "
                        "sharded across data-parallel ranks",
                        l->ep, l->dp * l->cp);
    }
  if (l->etp != 0 && l->etp != l->tp)
    {
      /* Megatron-core (the expert rank generator of parallel_state.py)
       * lays the experts out on a grid of their own, etp x ep x expert dp
       * x pp, which must tile the world: etp x ep divides tp x cp x dp. */
      if (m->n_experts == 0)
        return invalid (error,
                        "--etp %u needs a mixture-of-experts model; %s has "
                        "no experts (its linears follow --tp %u)",
                        l->etp, m->name, l->tp);
      if (!stow_engine_is_mcore (l->engine))
        return invalid (error,
                        "--etp %u is Megatron-core's "
                        "--expert-tensor-parallel-size: it needs --engine "
                        "megatron or nemo (--engine %s has no expert "
                        "tensor parallelism of its own)",
                        l->etp, stow_engine_name (l->engine));
      guint64 ranks = (guint64)l->tp * l->cp * l->dp;
      if (ranks % ((guint64)l->etp * l->ep) != 0)
        return invalid (error,
                        "--etp %u x --ep %u does not divide --tp x --cp x "
                        "--dp (%" G_GUINT64_FORMAT
                        "): the experts' grid (etp x ep x expert data "
                        "parallel x pp) must tile the GPUs",
                        l->etp, l->ep, ranks);
      guint64 f = m->moe_ffn ? m->moe_ffn : m->ffn;
      if (f % l->etp != 0)
        return invalid (error,
                        "--etp %u does not divide the experts' "
                        "intermediate size %" G_GUINT64_FORMAT,
                        l->etp, f);
    }
  return TRUE;
}

/* The ZeRO stage and the step's batch. */
static gboolean
check_step (const StowLayout *l, const StowTraining *t, const StowModel *m,
            const StowCluster *c, GError **error)
{
  if (l->zero > 3)
    return invalid (error, "--zero %u: the stages are 0, 1, 2 and 3", l->zero);
  if (l->micro_batch == 0)
    return invalid (error, "--micro-batch must be at least 1");
  if (l->grad_accum == 0)
    return invalid (error, "gradient accumulation must be at least 1");
  if (t->global_batch != 0
      && t->global_batch != l->micro_batch * l->grad_accum * l->dp)
    return invalid (error,
                    "--global-batch %" G_GUINT64_FORMAT
                    " is not --micro-batch %" G_GUINT64_FORMAT " x "
                    "accumulation %" G_GUINT64_FORMAT " x --dp %u",
                    t->global_batch, l->micro_batch, l->grad_accum, l->dp);
  if (t->optimizer_in_backward
      && (l->grad_accum > 1 || l->zero > 0
          || l->offload_optimizer != STOW_OFFLOAD_NONE))
    return invalid (error, "--optimizer-in-backward steps each parameter "
                           "during backward: it needs one micro-batch per "
                           "step and no ZeRO sharding or optimizer offload");
  return TRUE;
}

/* What offloading needs: ZeRO 3 for the parameters, an engine that
 * offloads under its pipeline or under LoRA. */
static gboolean
check_offload (const StowLayout *l, const StowTraining *t, const StowModel *m,
               const StowCluster *c, GError **error)
{
  if (l->offload_params != STOW_OFFLOAD_NONE && l->zero != 3)
    return invalid (error,
                    "--offload-params %s needs --zero 3 (parameters "
                    "are offloaded shard by shard)",
                    stow_offload_name (l->offload_params));
  /* DeepSpeed's PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3
   * are incompatible with pipeline parallelism"). */
  if (l->engine == STOW_ENGINE_DEEPSPEED && l->pp > 1 && l->zero >= 2)
    return invalid (error,
                    "--engine deepspeed runs --pp %u with ZeRO stage 0 or 1 "
                    "only (its pipeline engine refuses --zero %u)",
                    l->pp, l->zero);
  /* Only DeepSpeed offloads under LoRA (PEFT's ZeRO-3 CPU offload
   * example): its partitioner treats frozen weights like any other, and the
   * memory model prices that.  The other engines keep LoRA's frozen base
   * and its adapters' small states on the GPU, and stowage's lowering does
   * not run an offloaded LoRA. */
  if (t->finetune != STOW_FINETUNE_FULL && l->engine != STOW_ENGINE_DEEPSPEED
      && (l->offload_optimizer != STOW_OFFLOAD_NONE
          || l->offload_params != STOW_OFFLOAD_NONE))
    return invalid (error,
                    "--finetune %s keeps the frozen weights and the "
                    "adapters' optimizer states on the GPU (only --engine "
                    "deepspeed offloads them): drop %s %s",
                    stow_finetune_name (t->finetune),
                    l->offload_optimizer != STOW_OFFLOAD_NONE
                        ? "--offload-optimizer"
                        : "--offload-params",
                    stow_offload_name (l->offload_optimizer != STOW_OFFLOAD_NONE
                                           ? l->offload_optimizer
                                           : l->offload_params));
  return TRUE;
}

/* Recomputation: how many layers, checkpoint offload, torchtitan's
 * selective op checkpointing. */
static gboolean
check_recompute (const StowLayout *l, const StowTraining *t, const StowModel *m,
                 const StowCluster *c, GError **error)
{
  if (l->recompute == STOW_RECOMPUTE_FULL && l->recompute_layers > 0
      && l->recompute_layers > stow_layout_recompute_run (l, m->n_layers))
    return invalid (error,
                    "--recompute full:%u is more than the %" G_GUINT64_FORMAT
                    " layers of a %s: K runs from 1 to %" G_GUINT64_FORMAT
                    " (full alone recomputes them all)",
                    l->recompute_layers,
                    stow_layout_recompute_run (l, m->n_layers),
                    l->vpp > 1 ? "model chunk (--pp x --vpp)" : "stage",
                    stow_layout_recompute_run (l, m->n_layers));
  if (l->offload_activations && l->recompute != STOW_RECOMPUTE_FULL)
    return invalid (error, "--offload-activations cpu moves activation "
                           "checkpoints, so it needs --recompute full");
  if (l->recompute == STOW_RECOMPUTE_OP)
    {
      /* torchtitan's policy (torchtitan/models/llama/parallelize_llama.py,
       * _apply_ac_to_transformer_block, Dec 2024): PyTorch code, a dense
       * decoder's aten.mm and flash SDPA ops. */
      if (l->engine != STOW_ENGINE_PYTORCH && l->engine != STOW_ENGINE_FSDP)
        return invalid (error,
                        "--recompute selective-op is torchtitan's selective "
                        "op checkpointing, PyTorch code (--engine pytorch or "
                        "fsdp), not --engine %s's",
                        stow_engine_name (l->engine));
      if (!t->flash_attention)
        return invalid (error, "--recompute selective-op keeps the flash "
                               "SDPA kernel's output; it needs flash "
                               "attention (drop --no-flash)");
      if (m->n_experts > 0 || m->n_encoder_layers > 0
          || t->finetune != STOW_FINETUNE_FULL)
        return invalid (error,
                        "--recompute selective-op is modelled for full "
                        "training of dense decoders; %s",
                        t->finetune != STOW_FINETUNE_FULL
                            ? "LoRA's adapters change what it keeps"
                        : m->n_experts > 0
                            ? "grouped expert matmuls are not aten.mm"
                            : "an encoder-decoder model is not one");
    }
  return TRUE;
}

/* The pipeline schedule against the virtual stages and the micro-batches. */
static gboolean
check_schedule (const StowLayout *l, const StowTraining *t, const StowModel *m,
                const StowCluster *c, GError **error)
{
  if (l->schedule == STOW_SCHEDULE_INTERLEAVED && l->vpp < 2)
    return invalid (error, "--schedule interleaved needs --vpp >= 2");
  if (l->schedule == STOW_SCHEDULE_INTERLEAVED && l->grad_accum % l->pp != 0)
    return invalid (error,
                    "--schedule interleaved runs micro-batches in groups of "
                    "--pp %u: %" G_GUINT64_FORMAT
                    " micro-batches per step is not a multiple (Megatron's "
                    "interleaved 1F1B)",
                    l->pp, l->grad_accum);
  if (l->vpp > 1 && l->schedule != STOW_SCHEDULE_INTERLEAVED)
    return invalid (error, "--vpp %u needs --schedule interleaved", l->vpp);
  if (l->pp > 1 && l->grad_accum < l->pp && l->schedule != STOW_SCHEDULE_GPIPE)
    g_debug ("pp %u with only %" G_GUINT64_FORMAT
             " micro-batches per step: the pipeline never fills",
             l->pp, l->grad_accum);
  return TRUE;
}

/* What each engine cannot run. */
static gboolean
check_engine (const StowLayout *l, const StowTraining *t, const StowModel *m,
              const StowCluster *c, GError **error)
{
  switch (l->engine)
    {
    case STOW_ENGINE_MEGATRON:
    case STOW_ENGINE_NEMO:
      if (l->offload_optimizer == STOW_OFFLOAD_NVME
          || l->offload_params != STOW_OFFLOAD_NONE)
        return invalid (error,
                        "--engine %s cannot offload to NVMe or "
                        "offload parameters",
                        stow_engine_name (l->engine));
      if (l->zero > 1)
        return invalid (error,
                        "--engine %s shards optimizer states "
                        "only (--zero 0 or 1, the distributed optimizer)",
                        stow_engine_name (l->engine));
      /* Apex's DistributedFusedAdam, NeMo's --zero 1, keeps its state on
       * the GPU ("Currently only supports GPU", its docstring for
       * `device`, apex 810ffae, the commit NeMo 2.0.0rc1 pins). */
      if (l->engine == STOW_ENGINE_NEMO
          && l->offload_optimizer != STOW_OFFLOAD_NONE)
        return invalid (error, "--engine nemo keeps the optimizer on the "
                               "GPU (--offload-optimizer none)");
      break;
    case STOW_ENGINE_DEEPSPEED:
      if (l->offload_optimizer != STOW_OFFLOAD_NONE && l->zero == 0)
        return invalid (error, "--engine deepspeed offloads the optimizer "
                               "from ZeRO stage 1 up (--zero 1, 2 or 3)");
      if (l->cp > 1)
        return invalid (error, "--engine deepspeed has no context "
                               "parallelism (--cp 1)");
      break;
    case STOW_ENGINE_FSDP:
      if (l->zero == 1)
        return invalid (error, "--engine fsdp has no ZeRO-1 strategy "
                               "(NO_SHARD, SHARD_GRAD_OP, FULL_SHARD)");
      if (l->offload_optimizer == STOW_OFFLOAD_NVME
          || l->offload_params == STOW_OFFLOAD_NVME)
        return invalid (error, "--engine fsdp cannot offload to NVMe");
      break;
    case STOW_ENGINE_PYTORCH:
      if (c->n_gpus != 1)
        return invalid (error,
                        "--engine pytorch runs on one GPU; the "
                        "cluster has %u",
                        c->n_gpus);
      if (l->zero != 0 || l->offload_optimizer != STOW_OFFLOAD_NONE
          || l->offload_params != STOW_OFFLOAD_NONE)
        return invalid (error, "--engine pytorch has no ZeRO or offload");
      break;
    case STOW_ENGINE_STOWAGE:
      break;
    }
  return TRUE;
}

gboolean
stow_layout_validate (const StowLayout *l, const StowTraining *t,
                      const StowModel *m, const StowCluster *c, GError **error)
{
  g_return_val_if_fail (l && t && m && c, FALSE);
  if (!stow_training_check_model (t, m, error)
      || !stow_training_check_gpu (t, &c->node.gpu, NULL, error))
    return FALSE;
  /* In this order: the first check that fails names the problem. */
  if (!check_ranges (l, t, m, c, error))
    return FALSE;
  if (!check_shape (l, t, m, c, error))
    return FALSE;
  if (!check_loss_kernel (l, t, m, c, error))
    return FALSE;
  if (!check_pipeline_split (l, t, m, c, error))
    return FALSE;
  if (!check_sequence (l, t, m, c, error))
    return FALSE;
  if (!check_experts (l, t, m, c, error))
    return FALSE;
  if (!check_step (l, t, m, c, error))
    return FALSE;
  if (!check_offload (l, t, m, c, error))
    return FALSE;
  if (!check_recompute (l, t, m, c, error))
    return FALSE;
  if (!check_schedule (l, t, m, c, error))
    return FALSE;
  if (!check_engine (l, t, m, c, error))
    return FALSE;
  return TRUE;
}

guint64
stow_layout_split_slots (const StowLayout *layout, guint64 n_layers)
{
  return n_layers + (layout->pp_split_ends ? 2 : 0);
}

guint
stow_layout_etp (const StowLayout *layout)
{
  return layout->etp ? layout->etp : layout->tp;
}

guint64
stow_layout_expert_dp (const StowLayout *layout, guint64 n)
{
  guint64 grid = (guint64)stow_layout_etp (layout) * MAX (layout->ep, 1);
  return MAX (n * layout->tp / grid, 1);
}

void
stow_layout_stage_layers (const StowLayout *layout, guint64 n_layers,
                          guint64 *counts)
{
  guint pp = layout->pp;
  if (layout->pp_split_ends && pp >= 2)
    {
      /* The embedding takes a layer's place on the first stage, the loss
       * on the last (Megatron-core's account_for_*_in_pipeline_split). */
      guint64 per = (n_layers + 2) / pp;
      for (guint i = 0; i < pp; i++)
        counts[i] = per;
      counts[0] -= 1;
      counts[pp - 1] -= 1;
      return;
    }
  guint64 base = n_layers / pp, extra = n_layers % pp;
  /* The first stage holds the embedding and the most in-flight
   * micro-batches, the last the logits: give the remainder to the middle. */
  for (guint i = 0; i < pp; i++)
    counts[i] = base;
  for (guint i = 0; extra > 0; i++)
    {
      guint s = pp > 2 ? 1 + (i % (pp - 2)) : i % pp;
      counts[s]++;
      extra--;
    }
}

guint64
stow_layout_recompute_run (const StowLayout *layout, guint64 n_layers)
{
  guint64 pp = MAX (layout->pp, 1), v = MAX (layout->vpp, 1);
  if (v > 1)
    return stow_layout_split_slots (layout, n_layers) / (pp * v);
  return (n_layers + pp - 1) / pp;
}

guint64
stow_layout_recomputed_layers (const StowLayout *layout, guint64 n_layers,
                               guint64 stage_layers)
{
  if (layout->recompute != STOW_RECOMPUTE_FULL)
    return 0;
  if (layout->recompute_layers == 0)
    return stage_layers;
  guint64 v = MAX (layout->vpp, 1);
  guint64 run
      = v > 1 ? stow_layout_recompute_run (layout, n_layers) : stage_layers;
  guint64 runs = v > 1 ? v : 1;
  return MIN (stage_layers, runs * MIN (layout->recompute_layers, run));
}
