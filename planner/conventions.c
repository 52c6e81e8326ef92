/* SPDX-License-Identifier: MIT
 *
 * planner/conventions.c: peers' published memory estimators, reproduced
 * digit for digit so stowage can be cross-checked against them:
 *  - zero-paper: Rajbhandari et al. 2020, §5 (model states 2+2+K, K=12);
 *  - deepspeed-estimator: estimate_zero{2,3}_model_states_mem_needs in
 *    DeepSpeed's stage_1_and_2.py / stage3.py after PR #5099;
 *  - deepspeed-estimator-docs: the ZeRO-2 formula memory.rst still prints;
 *  - megatron-theoretical: theoretical_memory_usage.py (first stage).
 * Quirks are kept on purpose (integer truncation where Python truncates,
 * total GPUs where the docs say GPUs per node).
 */
#include <math.h>

#include "core/units.h"
#include "planner/memory-private.h"

static StowMemory *
one_stage (void)
{
  return stow_memory_alloc (1);
}

static guint64
param_count (const StowModel *m, const StowMemOptions *o)
{
  return o->params_override ? o->params_override : (m ? m->params : 0);
}

static StowMemory *
zero_paper (const StowModel *m, const StowCluster *c, const StowLayout *l,
            const StowMemOptions *o, GError **error)
{
  guint64 P = param_count (m, o);
  guint64 nd = l->dp;
  guint z = l->zero;
  if (P == 0)
    goto no_params;
  if (l->tp * l->pp * l->cp != 1 || nd != c->n_gpus)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--convention zero-paper covers data parallelism only: "
                   "--dp must be the %u GPUs and --tp/--pp/--cp 1",
                   c->n_gpus);
      return NULL;
    }
  StowMemory *mem = one_stage ();
  GArray *t = mem->stages[0].terms;
  /* Psi = parameters; fp16 weights 2 Psi, fp16 gradients 2 Psi, Adam's
   * fp32 master, momentum and variance K Psi = 12 Psi; stage 1 shards the
   * K part, stage 2 the gradients too, stage 3 everything over Nd. */
  stow_mem_add (t, "parameters", z >= 3 ? 2 * P / nd : 2 * P, STOW_TIER_DEVICE,
                "2 Psi%s (Psi = %" G_GUINT64_FORMAT ")", z >= 3 ? " / Nd" : "",
                P);
  stow_mem_add (t, "gradients", z >= 2 ? 2 * P / nd : 2 * P, STOW_TIER_DEVICE,
                "2 Psi%s", z >= 2 ? " / Nd" : "");
  stow_mem_add (t, "optimizer states", z >= 1 ? 12 * P / nd : 12 * P,
                STOW_TIER_DEVICE, "K Psi%s, K = 12", z >= 1 ? " / Nd" : "");
  stow_memory_finish (mem, c, o);
  return mem;

no_params:
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
               "--convention zero-paper needs a model or --params");
  return NULL;
}

/* DeepSpeed's estimators: per-GPU bytes and per-node CPU bytes, as the
 * Python computes them (floats, then int()). */
static StowMemory *
deepspeed (const StowModel *m, const StowCluster *c, const StowLayout *l,
           const StowMemOptions *o, gboolean docs, GError **error)
{
  double P = (double)param_count (m, o);
  double LL = (double)(o->largest_layer_override
                           ? o->largest_layer_override
                           : (m ? m->largest_module_params : 0));
  double G = c->node.gpus_per_node, N = c->n_nodes;
  double total_gpus = G * N;
  const double abf = 1.5; /* additional_buffer_factor */
  gboolean cpu_offload = l->offload_optimizer == STOW_OFFLOAD_CPU;
  gboolean cpu_offload_params = l->offload_params == STOW_OFFLOAD_CPU;
  double gpu, cpu;
  const char *gpu_f, *cpu_f;

  if (P == 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--convention %s needs a model or --params",
                   docs ? "deepspeed-estimator-docs" : "deepspeed-estimator");
      return NULL;
    }
  if (l->zero < 2)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "DeepSpeed's estimator covers ZeRO stages 2 and 3 only "
                   "(there is no ZeRO-%u estimate; DeepSpeed #5102)",
                   l->zero);
      return NULL;
    }
  if (l->offload_optimizer == STOW_OFFLOAD_NVME
      || l->offload_params == STOW_OFFLOAD_NVME)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "DeepSpeed's estimator does not cover NVMe offload");
      return NULL;
    }
  if (l->zero == 2)
    {
      if (cpu_offload_params)
        goto skipped;
      if (cpu_offload)
        {
          gpu = 2 * P;
          gpu_f = "2 P";
          /* The code multiplies by all GPUs; the docs by a node's. */
          double gpus = docs ? G : total_gpus;
          cpu = P * MAX (4 * gpus, 16) * abf;
          cpu_f = docs ? "P x max(4 G, 16) x 1.5"
                       : "P x max(4 x total GPUs, 16) x 1.5";
        }
      else
        {
          if (docs)
            {
              gpu = 4 * P + trunc (16 * P / total_gpus);
              gpu_f = "4 P + int(16 P / total GPUs)";
            }
          else
            {
              gpu = 2 * P + trunc (18 * P / total_gpus);
              gpu_f = "2 P + int(18 P / total GPUs)";
            }
          cpu = P * 4 * G * abf;
          cpu_f = "P x 4 x G x 1.5";
        }
    }
  else
    {
      double gpus_factor = 1 / N;
      double llm = 4 * LL;
      if (LL == 0)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "DeepSpeed's ZeRO-3 estimator needs the largest "
                       "layer (--largest-layer N)");
          return NULL;
        }
      if (cpu_offload && cpu_offload_params)
        {
          gpu = llm;
          gpu_f = "4 LL";
          if (o->zero_init)
            cpu = P * 18 * gpus_factor * abf, cpu_f = "P x 18 / nodes x 1.5";
          else
            cpu = P * MAX (4 * G, 18 * gpus_factor) * abf,
            cpu_f = "P x max(4 G, 18 / nodes) x 1.5";
        }
      else if (cpu_offload)
        {
          gpu = llm + trunc (2 * P / total_gpus);
          gpu_f = "4 LL + int(2 P / total GPUs)";
          if (o->zero_init)
            cpu = P * 16 * gpus_factor * abf, cpu_f = "P x 16 / nodes x 1.5";
          else
            cpu = P * MAX (4 * G, 16 * gpus_factor) * abf,
            cpu_f = "P x max(4 G, 16 / nodes) x 1.5";
        }
      else if (cpu_offload_params)
        goto skipped;
      else
        {
          gpu = llm + trunc (18 * P / total_gpus);
          gpu_f = "4 LL + int(18 P / total GPUs)";
          if (o->zero_init)
            cpu = LL * 4 * G * abf, cpu_f = "LL x 4 x G x 1.5";
          else
            cpu = P * 4 * G * abf, cpu_f = "P x 4 x G x 1.5";
        }
    }

  StowMemory *mem = one_stage ();
  stow_mem_add (mem->stages[0].terms, "model states", (guint64)trunc (gpu),
                STOW_TIER_DEVICE,
                "%s (P = %.0f, LL = %.0f, G = %.0f, nodes = %.0f)", gpu_f, P,
                LL, G, N);
  stow_mem_add (
      mem->host_terms, "model states (per node)", (guint64)trunc (cpu),
      STOW_TIER_HOST, "%s%s", cpu_f,
      l->zero == 3 ? (o->zero_init ? ", zero_init=1" : ", zero_init=0") : "");
  stow_memory_finish (mem, c, o);
  return mem;

skipped:
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
               "DeepSpeed's estimator skips offload_param=cpu without "
               "offload_optimizer=cpu");
  return NULL;
}

/* Megatron-LM theoretical_memory_usage.py: weights and optimizer of the
 * most-loaded shard (the first pipeline stage) plus its activations. */
static StowMemory *
megatron (const StowModel *m, const StowCluster *c, const StowTraining *t,
          const StowLayout *l, const StowMemOptions *o, GError **error)
{
  if (m == NULL)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--convention megatron-theoretical needs a model's "
                   "shape, not just --params");
      return NULL;
    }
  if ((guint64)l->dp * l->tp * l->pp * l->cp != c->n_gpus)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--dp %u x --tp %u x --pp %u x --cp %u does not match "
                   "the %u GPUs of \"%s\"",
                   l->dp, l->tp, l->pp, l->cp, c->n_gpus, c->spec);
      return NULL;
    }
  double h = (double)m->hidden, L = (double)m->n_layers;
  double a = (double)m->n_heads, g = (double)m->n_kv_heads;
  double kv = (double)m->head_dim, F = (double)m->ffn;
  double V = (double)m->vocab;
  double tp = l->tp, pp = l->pp, dp = l->dp;
  double norm_size = m->norm == STOW_NORM_RMSNORM ? 1 : 2;
  double gated = m->gated_mlp ? 1.5 : 1.0;

  double attn = 2 * h * h * (1 + g / a) * (kv * a / h);
  double mlp = 2 * h * F * gated;
  double norms = 2 * h * norm_size;
  double embedding = h * V;
  double shard = ((attn + mlp) * L / pp + embedding) / tp + norms * L / pp;
  if (!m->tied_embeddings && l->pp == 1)
    shard += embedding / tp;
  gboolean distopt = l->zero >= 1;
  double bpp = distopt ? 6 + 12 / dp : 18;
  double weights = shard * bpp;

  double s = (double)t->seq_len, b = (double)l->micro_batch;
  double mb = (double)l->grad_accum;
  double act;
  const char *act_f;
  if (l->sp && l->recompute == STOW_RECOMPUTE_SELECTIVE)
    {
      act = s * b * h * (18 + 4 * F / h) * L;
      act += 8 * s * b * pp;
      act += s * b * h * pp;
      if (l->vpp > 1)
        act *= 1 + (pp - 1) / (pp * l->vpp);
      else if (l->pp > 1)
        act *= MIN (1, mb / pp);
      if (l->pp == 1)
        act += s * b * h * 4 * (1 + V / h);
      act /= tp;
      act_f = "(s b h (18 + 4 F / h) L + 8 s b p + s b h p) x schedule / t";
    }
  else
    {
      act = s * b * h * (10 + 24 / tp) * L;
      act += 8 * s * b * pp;
      act += s * b * h * pp;
      if (l->vpp > 1)
        act *= 1 + (pp - 1) / (pp * l->vpp);
      else if (l->pp > 1)
        act *= MIN (1, mb / pp);
      if (l->pp == 1)
        act += 2 * (s * b * V / tp + s * b * h);
      act *= 1.05;
      act_f = "(s b h (10 + 24 / t) L + 8 s b p + s b h p) x schedule x 1.05";
    }

  StowMemory *mem = one_stage ();
  mem->stages[0].params = (guint64)llround (shard);
  stow_mem_add (mem->stages[0].terms, "weights and optimizer states",
                (guint64)llround (weights), STOW_TIER_DEVICE,
                "%.4g B x %.0f params on the most-loaded shard "
                "(((attn + mlp) L / p + h V) / t + norms L / p)",
                bpp, shard);
  stow_mem_add (mem->stages[0].terms, "activations", (guint64)llround (act),
                STOW_TIER_DEVICE, "%s", act_f);
  stow_memory_finish (mem, c, o);
  return mem;
}

StowMemory *
stow_memory_estimate_convention (const StowModel *m, const StowCluster *c,
                                 const StowTraining *t, const StowLayout *l,
                                 const StowMemOptions *o, GError **error)
{
  StowMemory *mem = NULL;
  switch (o->convention)
    {
    case STOW_CONVENTION_ZERO_PAPER:
      mem = zero_paper (m, c, l, o, error);
      break;
    case STOW_CONVENTION_DEEPSPEED_ESTIMATOR:
      mem = deepspeed (m, c, l, o, FALSE, error);
      break;
    case STOW_CONVENTION_DEEPSPEED_ESTIMATOR_DOCS:
      mem = deepspeed (m, c, l, o, TRUE, error);
      break;
    case STOW_CONVENTION_MEGATRON_THEORETICAL:
      mem = megatron (m, c, t, l, o, error);
      break;
    case STOW_CONVENTION_STOWAGE:
      g_return_val_if_reached (NULL);
    }
  if (mem != NULL)
    mem->convention = o->convention;
  return mem;
}

/* Buffers the transformers modules register beside their parameters,
 * which accelerate's sizes include: BERT's position_ids and token_type_ids
 * (int64, one per position), and RoPE's inv_freq (fp32, head_dim / 2; one
 * rotary embedding per model since transformers 4.45).  Other families'
 * buffers are not modelled. */
static double
accelerate_buffer_bytes (const StowModel *m)
{
  static const char *const rope[]
      = { "llama",     "mistral", "mixtral", "qwen2",       "qwen3",
          "qwen3_moe", "gemma",   "gemma2",  "gemma3_text", "phi3" };
  if (g_str_equal (m->family, "bert"))
    return 2.0 * 8.0 * (double)m->max_positions;
  for (gsize i = 0; i < G_N_ELEMENTS (rope); i++)
    if (g_str_equal (m->family, rope[i]))
      return 4.0 * (double)(m->head_dim / 2);
  return 0;
}

void
stow_accelerate_estimate (const StowModel *m,
                          StowAccelerateRow rows[STOW_ACCELERATE_ROWS])
{
  static const char *const dtypes[STOW_ACCELERATE_ROWS]
      = { "float32", "float16", "int8", "int4" };
  static const double divisor[STOW_ACCELERATE_ROWS] = { 1, 2, 4, 8 };
  g_return_if_fail (m != NULL);
  double total = 4.0 * (double)m->params + accelerate_buffer_bytes (m);
  guint64 largest = m->largest_module_params;
  if (!g_str_equal (m->family, "bert"))
    for (guint64 i = 0; i < m->n_layers; i++)
      largest = MAX (largest, m->layers[i].params);
  for (int i = 0; i < STOW_ACCELERATE_ROWS; i++)
    {
      rows[i].dtype = dtypes[i];
      rows[i].total_bytes = total / divisor[i];
      rows[i].largest_layer_bytes = 4.0 * (double)largest / divisor[i];
      rows[i].training_bytes = i == 0 ? 4 * total : i == 1 ? 2 * total : -1;
    }
}
