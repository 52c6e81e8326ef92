/* SPDX-License-Identifier: MIT
 *
 * planner/memory.c: stowage's own memory model.  Per pipeline stage it
 * counts the parameters one GPU holds (tensor, pipeline and expert
 * sharding), charges model states by engine, precision, optimizer and ZeRO
 * stage, moves what is offloaded to host or NVMe, adds activations for the
 * micro-batches in flight, then the engine's buffers, the CUDA context,
 * library workspaces, NCCL and the allocator's slack.  Peer conventions live
 * in planner/conventions.c.  The sources of every default are in
 * docs/memory-model.md.
 */
#include "planner/memory.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "core/units.h"
#include "core/zero.h"
#include "planner/memory-private.h"
#include "planner/plan.h"

#define MiB ((guint64)1 << 20)
#define GiB ((guint64)1 << 30)

void
stow_mem_options_init (StowMemOptions *o)
{
  memset (o, 0, sizeof *o);
  o->convention = STOW_CONVENTION_STOWAGE;
  o->zero_init = 1;
  /* CUDA >= 11.7 lazy module loading: 250-500 MiB per process
   * (pytorch#86509 measured 287 MB lazy, 667 MB eager). */
  o->cuda_context_bytes = 512 * MiB;
  /* cuBLAS/cuBLASLt workspaces outside the caching allocator's view. */
  o->workspace_bytes = 64 * MiB;
  /* NCCL channel buffers per communicator; users report up to several
   * GiB across groups (verl#5979); a configurable reserve. */
  o->nccl_bytes_per_group = 256 * MiB;
  /* 5% of the peak: vllm compressed-tensors' margin after a measured
   * 1.83 GiB reserved-but-unallocated at 78 GiB in use. */
  o->fragmentation = 0.05;
  o->safety_margin_bytes = 0;
  /* A PyTorch rank's own resident memory (CUDA, NCCL, Python): PEFT's
   * README measured a peak of 2.96 GB (psutil RSS) for one T0_3B rank. */
  o->host_process_bytes = 3 * GiB;
  /* csrc/includes/cpu_adam.h: two buffers of TILE (128 Mi) floats. */
  o->cpu_optimizer_buffer_bytes = 2 * 128 * MiB * 4;
  o->vocab_multiple = 128; /* Megatron --make-vocab-size-divisible-by */
  o->swap_shard_params = (guint64)1 << 26;
  /* DeepSpeed zero/config.py defaults, in elements. */
  o->reduce_bucket_elements = 500000000;
  o->prefetch_bucket_elements = 50000000;
  o->reuse_distance_elements = 1000000000;
  o->overlap_comm = -1;
  o->free_grads = -1;
}

static const struct
{
  const char *name;
  StowConvention value;
} convention_names[] = {
  { "stowage", STOW_CONVENTION_STOWAGE },
  { "zero-paper", STOW_CONVENTION_ZERO_PAPER },
  { "deepspeed-estimator", STOW_CONVENTION_DEEPSPEED_ESTIMATOR },
  { "deepspeed-estimator-docs", STOW_CONVENTION_DEEPSPEED_ESTIMATOR_DOCS },
  { "megatron-theoretical", STOW_CONVENTION_MEGATRON_THEORETICAL },
};

const char *
stow_convention_name (StowConvention c)
{
  for (gsize i = 0; i < G_N_ELEMENTS (convention_names); i++)
    if (convention_names[i].value == c)
      return convention_names[i].name;
  return "?";
}

gboolean
stow_convention_parse (const char *s, const char *field, StowConvention *out,
                       GError **error)
{
  for (gsize i = 0; s && i < G_N_ELEMENTS (convention_names); i++)
    if (g_ascii_strcasecmp (s, convention_names[i].name) == 0)
      {
        *out = convention_names[i].value;
        return TRUE;
      }
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s \"%s\": expected stowage, zero-paper, deepspeed-estimator, "
               "deepspeed-estimator-docs or megatron-theoretical",
               field, s ? s : "");
  return FALSE;
}

/* ---- terms ------------------------------------------------------------- */

static void
clear_term (gpointer p)
{
  g_free (((StowMemTerm *)p)->formula);
}

GArray *
stow_mem_terms_new (void)
{
  GArray *a = g_array_new (FALSE, TRUE, sizeof (StowMemTerm));
  g_array_set_clear_func (a, clear_term);
  return a;
}

/* The terms a layer's backward trades against each other when gradients
 * are freed between steps (free_gradients, below). */
static const char *const act_names[] = {
  "activations",     "activation checkpoints",   "recomputed layer",
  "logits and loss", "input ids and embeddings", "autocast weight copies"
};
static const char *const grad_names[] = { "gradients", "gradient slots" };

static gboolean
named (const char *name, const char *const *names, gsize n)
{
  for (gsize k = 0; k < n; k++)
    if (g_str_equal (name, names[k]))
      return TRUE;
  return FALSE;
}

/* A "sink" is an array of STOW_N_TIERS guint64 sums instead of terms: the
 * totals-only path (stow_memory_estimate_totals) runs the same arithmetic
 * through it without formatting a formula or allocating per term.  Two
 * more sums follow the tiers: the activation and the gradient terms, which
 * free_gradients weighs against each other.  They are kept only when the
 * last slot says so (sink_clear): telling them apart compares names, which
 * cost the search more than the arithmetic when done for every term. */
enum
{
  SINK_ACTS = STOW_N_TIERS,
  SINK_GRADS,
  SINK_CLASSIFY,
  SINK_LEN
};

GArray *
stow_mem_sink_new (void)
{
  GArray *a = g_array_sized_new (FALSE, TRUE, sizeof (guint64), SINK_LEN);
  g_array_set_size (a, SINK_LEN);
  return a;
}

static inline gboolean
is_sink (GArray *terms)
{
  return g_array_get_element_size (terms) == sizeof (guint64);
}

/* Zeroes @sink; @classify: keep the activation and gradient sums. */
static inline void
sink_clear (GArray *sink, gboolean classify)
{
  memset (sink->data, 0, sizeof (guint64) * sink->len);
  g_array_index (sink, guint64, SINK_CLASSIFY) = classify;
}

static inline void
sink_add (GArray *sink, const char *name, guint64 bytes, StowTier tier)
{
  g_array_index (sink, guint64, tier) += bytes;
  if (bytes == 0 || !g_array_index (sink, guint64, SINK_CLASSIFY))
    return;
  if (named (name, act_names, G_N_ELEMENTS (act_names)))
    g_array_index (sink, guint64, SINK_ACTS) += bytes;
  else if (named (name, grad_names, G_N_ELEMENTS (grad_names)))
    g_array_index (sink, guint64, SINK_GRADS) += bytes;
}

void
stow_mem_add (GArray *terms, const char *name, guint64 bytes, StowTier tier,
              const char *format, ...)
{
  StowMemTerm t = { name, bytes, NULL, tier };
  va_list ap;
  if (bytes == 0)
    return;
  if (is_sink (terms))
    {
      sink_add (terms, name, bytes, tier);
      return;
    }
  va_start (ap, format);
  t.formula = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_array_append_val (terms, t);
}

/* stow_mem_add for this file's terms: into a sink the sum is taken without
 * the variadic call, and the formula's arguments are never evaluated (the
 * search's totals add about a million terms).  @terms is read twice. */
#define mem_add_term(terms, name, bytes, tier, ...)                            \
  (is_sink (terms)                                                             \
       ? sink_add ((terms), (name), (bytes), (tier))                           \
       : stow_mem_add ((terms), (name), (bytes), (tier), __VA_ARGS__))

guint64
stow_mem_sum (GArray *terms, int tier)
{
  guint64 s = 0;
  if (is_sink (terms) && tier >= 0)
    return g_array_index (terms, guint64, tier);
  if (is_sink (terms))
    {
      for (int i = 0; i < STOW_N_TIERS; i++)
        s += g_array_index (terms, guint64, i);
      return s;
    }
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      if (tier < 0 || (int)t->tier == tier)
        s += t->bytes;
    }
  return s;
}

/* Bytes = count x per-element bytes (fractional), rounded to nearest. */
guint64
stow_bytes (guint64 count, double bytes_per)
{
  double v = (double)count * bytes_per;
  if (v >= 1.8e19)
    return G_MAXUINT64 / 4; /* saturate far beyond any real cluster */
  return stow_mem_round (v);
}

StowMemory *
stow_memory_alloc (guint n_stages)
{
  StowMemory *mem = g_new0 (StowMemory, 1);
  mem->n_stages = n_stages;
  mem->stages = g_new0 (StowStageMemory, n_stages);
  for (guint i = 0; i < n_stages; i++)
    {
      mem->stages[i].stage = i;
      mem->stages[i].terms = stow_mem_terms_new ();
    }
  mem->host_terms = stow_mem_terms_new ();
  mem->nvme_terms = stow_mem_terms_new ();
  return mem;
}

void
stow_memory_free (StowMemory *mem)
{
  if (mem == NULL)
    return;
  for (guint i = 0; i < mem->n_stages; i++)
    g_array_unref (mem->stages[i].terms);
  g_free (mem->stages);
  g_array_unref (mem->host_terms);
  g_array_unref (mem->nvme_terms);
  g_free (mem);
}

/* Totals from the terms: the property tests check they always add up. */
void
stow_memory_finish (StowMemory *mem, const StowCluster *c,
                    const StowMemOptions *o)
{
  guint64 cap = c ? c->node.gpu.total_bytes : 0;
  mem->capacity_bytes
      = cap > o->safety_margin_bytes ? cap - o->safety_margin_bytes : 0;
  mem->peak_stage = 0;
  for (guint i = 0; i < mem->n_stages; i++)
    {
      StowStageMemory *s = &mem->stages[i];
      s->total_bytes = stow_mem_sum (s->terms, STOW_TIER_DEVICE);
      if (s->allocated_bytes == 0 || s->allocated_bytes > s->total_bytes)
        s->allocated_bytes = s->total_bytes;
      if (s->reserved_bytes == 0 || s->reserved_bytes > s->total_bytes)
        s->reserved_bytes = s->total_bytes;
      if (s->total_bytes > mem->stages[mem->peak_stage].total_bytes)
        mem->peak_stage = i;
    }
  StowStageMemory *peak = &mem->stages[mem->peak_stage];
  mem->allocated_peak_bytes = peak->allocated_bytes;
  mem->reserved_bytes = peak->reserved_bytes;
  mem->total_bytes = peak->total_bytes;
  mem->host_pinned_bytes = stow_mem_sum (mem->host_terms, STOW_TIER_PINNED);
  mem->host_pageable_bytes = stow_mem_sum (mem->host_terms, STOW_TIER_HOST);
  mem->host_total_bytes = mem->host_pinned_bytes + mem->host_pageable_bytes;
  mem->nvme_bytes = stow_mem_sum (mem->nvme_terms, -1);
  if (c)
    {
      mem->host_capacity_bytes = c->node.host_ram_bytes;
      for (guint i = 0; i < c->node.n_nvme; i++)
        mem->nvme_capacity_bytes += c->node.nvme[i].capacity_bytes;
    }
  mem->fits_device = mem->total_bytes <= mem->capacity_bytes;
  mem->fits_host = mem->host_capacity_bytes == 0
                   || mem->host_total_bytes <= mem->host_capacity_bytes;
  mem->fits_nvme
      = mem->nvme_bytes == 0 || mem->nvme_bytes <= mem->nvme_capacity_bytes;
  mem->fits = mem->fits_device && mem->fits_host && mem->fits_nvme;
}

/* ---- the stowage model ----------------------------------------------- */

typedef struct
{
  double w;      /* low-precision weights used by compute */
  double g;      /* gradients as produced by backward */
  double master; /* fp32 master weights (0 when training in fp32) */
  double opt;    /* optimizer states */
} Bpp;

static double
optimizer_bytes (const StowModel *m, StowOptimizer opt)
{
  switch (opt)
    {
    case STOW_OPTIMIZER_ADAMW:
      return 8.0; /* fp32 exp_avg and exp_avg_sq */
    case STOW_OPTIMIZER_ADAMW_8BIT:
      /* bitsandbytes' blockwise AdamW8bit: two uint8 states, each with an
       * fp32 absmax per block of 256 (optim/optimizer.py init_state). */
      return 2.0 + 2.0 * 4.0 / 256.0;
    case STOW_OPTIMIZER_SGD:
      return 4.0; /* fp32 momentum */
    case STOW_OPTIMIZER_LION:
      return 4.0; /* fp32 momentum only */
    case STOW_OPTIMIZER_ADAFACTOR:
      /* Factored second moment: 4 (rows + cols) bytes per h x f matrix,
       * i.e. 4/f + 4/h per parameter; no first moment by default. */
      return 4.0 / (double)MAX (m->hidden, 1) + 4.0 / (double)MAX (m->ffn, 1);
    }
  return 8.0;
}

static Bpp
full_bpp (const StowModel *m, const StowTraining *t)
{
  Bpp b = { 2, 2, 4, optimizer_bytes (m, t->optimizer) };
  if (t->precision == STOW_PRECISION_FP32)
    b.w = 4, b.g = 4, b.master = 0;
  else if (t->precision == STOW_PRECISION_FP8)
    b.w = 3; /* bf16 weights plus their fp8 copy for the GEMMs */
  else if (t->precision == STOW_PRECISION_BF16_PURE)
    {
      /* Optimizer states take the parameters' dtype (torch.optim): fp32
       * moments become bf16; 8-bit states stay 8-bit. */
      b.master = 0;
      if (t->optimizer != STOW_OPTIMIZER_ADAMW_8BIT)
        b.opt /= 2;
    }
  return b;
}

/* Bytes per frozen linear weight under LoRA: the model's dtype, or
 * QLoRA's NF4 (4 bits + an 8-bit absmax per 64 weights + an fp32 scale
 * per 256 blocks, double quantisation).  A quantized checkpoint loads as
 * it is stored (models/quant.c), whichever of the two. */
double
stow_mem_frozen_weight_bytes (const StowModel *m, const StowTraining *t,
                              double w)
{
  if (m != NULL && m->quant.method != STOW_QUANT_NONE)
    return m->quant.linear_bytes_per_param;
  return t->finetune == STOW_FINETUNE_QLORA
             ? 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0)
             : w;
}

double
stow_mem_frozen_other_bytes (const StowModel *m, const StowTraining *t,
                             double w)
{
  if (m != NULL && m->quant.method != STOW_QUANT_NONE)
    {
      guint db = stow_dtype_bytes (m->torch_dtype);
      return db ? MIN ((double)db, 4.0) : 2.0;
    }
  return t->finetune == STOW_FINETUNE_QLORA ? 2.0 : MIN (w, 4.0);
}

/* The dtype DeepSpeed holds parameters in, which its reduce bucket takes
 * too: fp32 unless fp16 or bf16 is enabled. */
static double
deepspeed_weight_bytes (const StowTraining *t, Bpp b)
{
  return t->precision == STOW_PRECISION_FP32 ? 4.0 : MIN (b.w, 2.0);
}

/* The bytes a layer's gathered (or streamed) parameters take on the
 * device: the compute precision, which is fp32 for fp32 training. */
double
stow_mem_gathered_weight_bytes (const StowTraining *t, double w)
{
  return t->precision == STOW_PRECISION_FP32 ? MIN (w, 4.0) : MIN (w, 2.0);
}

/* NVMe swapping (ZeRO-Infinity): parameters pass through four pinned
 * staging buffers of the largest layer (or unit); DeepSpeed's optimizer
 * swaps through four buffers of at most sub_group_size (1e9) parameters
 * each, stowage's through three. */
#define PARAM_STAGING_BUFFERS 4
#define DS_SWAP_BUFFERS       4
#define DS_SUB_GROUP_PARAMS   ((guint64)1000000000)

/* How an engine keeps the model states (weights, gradients, master
 * weights, optimizer states), for the version it names: what departs from
 * the precision's bytes per parameter (full_bpp), which of them ZeRO
 * shards, which buffers hold them, and the text its formulas add.  One row
 * per engine (engine_states); engine_bpp and model_states read the rows
 * instead of branching on the engine. */
typedef struct
{
  /* Under 16-bit compute over fp32 weights (stow_mem_mixed_over_fp32) the
   * weights are fp32 and are themselves the master copy: 4 B weights and
   * gradients, no separate master. */
  gboolean weights_are_master;
  /* Bytes per parameter of the gradients whatever the precision (fp32
   * main grads); 0: the precision's. */
  double grad_bytes;
  /* The gradient buffer stays full size whatever the ZeRO stage. */
  gboolean full_grad_buffer;
  /* From --zero 1 in mixed precision, a distributed optimizer keeping the
   * gradients and each bucket's reduce-scattered shard in grad_bytes, and
   * the master as the 16-bit weights plus remainders of master_bytes (not
   * under fp16); the notes close the two terms' formulas.  grad_bytes 0:
   * none. */
  struct
  {
    double grad_bytes, master_bytes;
    const char *grad_shards_note, *master_note;
  } distributed_adam;
  /* The ZeRO stage from which the weights are sharded. */
  guint weights_sharded_from;
  /* Gradients pass through the engine's reduce buckets (engine_buffers)
   * rather than two layer slots. */
  gboolean reduce_buckets;
  /* Non-NULL: gradients are upcast into an fp32 partition, sharded as the
   * optimizer states, before the step; the note closes its formula. */
  const char *fp32_grad_partition_note;
  /* The gradient slots and the parameter staging buffers hold any unit
   * (the embedding and the output layer too), and each rank stages its
   * own shard of a unit, not a whole layer. */
  gboolean unit_slots;
  /* An offloaded optimizer: the CPU optimizer's pinned buffers (non-NULL:
   * what the formula calls them); the bytes per parameter of the
   * gradients it reads (0: the gradients' own); whether those and the
   * states sit in pageable rather than pinned host memory; and whether it
   * writes the updated weights back through host memory. */
  const char *cpu_optimizer_buffers;
  double offloaded_grad_bytes;
  gboolean offloaded_pageable;
  gboolean cpu_optimizer_writes_weights;
  /* An optimizer swapped to NVMe: the buffers in flight, each of
   * swap_chunk_params parameters at most (0: the options'
   * swap_shard_params), fewer and no larger than the shard needs when
   * swap_trims. */
  guint swap_buffers;
  guint64 swap_chunk_params;
  gboolean swap_trims;
  /* Gradients freed between steps unless --free-grads says otherwise. */
  gboolean frees_gradients;
} EngineStates;

static const EngineStates engine_states[] = {
  [STOW_ENGINE_STOWAGE] = {
    .weights_sharded_from = 3,
    /* stowage gathers and reduces the embedding and the output layer
     * through the same slots as the layers, and its ranks each read their
     * own shard of a unit (then all-gather it on the GPUs), so a staging
     * buffer holds 1/n of the largest unit (found by the simulator). */
    .unit_slots = TRUE,
    /* Its CPU Adam writes the updated weights (with fp32 training:
     * updates the parameters) in host memory, from where they are copied
     * up; on NVMe, in the host gradients' place, each unit going to the
     * store through one aligned buffer (O_DIRECT). */
    .cpu_optimizer_writes_weights = TRUE,
    /* It cuts the shard into chunks and keeps at most three in flight
     * (read i+1, update i, write i-1): a shard of one or two chunks needs
     * only those (found by the simulator). */
    .swap_buffers = 3,
    .swap_trims = TRUE,
  },
  [STOW_ENGINE_PYTORCH] = {
    /* Trainer-style autocast: fp32 parameters and gradients, the 16-bit
     * copies autocast makes are charged with the activations.  PyTorch
     * frees gradients between steps (zero_grad(set_to_none=True), its
     * default since 2.0). */
    .weights_are_master = TRUE,
    .weights_sharded_from = 3,
    .swap_buffers = 3,
    .frees_gradients = TRUE,
  },
  [STOW_ENGINE_DEEPSPEED] = {
    .weights_sharded_from = 3,
    /* DeepSpeed reduces gradients through its reduce buckets, and upcasts
     * them into an fp32 partition before the step (stage_1_and_2.py; PR
     * #5099 counts 4 B). */
    .reduce_buckets = TRUE,
    .fp32_grad_partition_note
    = " (DeepSpeed upcasts gradients before the step)",
    /* It steps an offloaded optimizer with its CPU optimizer (accelerate
     * swaps torch's AdamW for DeepSpeedCPUAdam), which pins two copy
     * buffers of TILE (128 Mi) floats when it is built
     * (csrc/includes/cpu_adam.h), whatever the model's size, and reads
     * fp32 gradients from pageable host memory. */
    .cpu_optimizer_buffers = "DeepSpeedCPUAdam's 2 pinned copy buffers",
    .offloaded_grad_bytes = 4,
    .offloaded_pageable = TRUE,
    .swap_buffers = DS_SWAP_BUFFERS,
    .swap_chunk_params = DS_SUB_GROUP_PARAMS,
  },
  [STOW_ENGINE_MEGATRON] = {
    /* Megatron-LM core_r0.8.0 turns --accumulate-allreduce-grads-in-fp32
     * on for --bf16 (megatron/training/arguments.py), which its DDP takes
     * as grad_reduce_in_fp32: the grad buffer holds fp32 main grads
     * (megatron/core/distributed/distributed_data_parallel.py), full size
     * with the distributed optimizer too, which reduce-scatters inside
     * it. */
    .grad_bytes = 4,
    .full_grad_buffer = TRUE,
    .weights_sharded_from = 3,
    .swap_buffers = 3,
  },
  [STOW_ENGINE_FSDP] = {
    /* FSDP mixed precision keeps the sharded parameters in fp32 (they are
     * the master copy) and reduces gradients into fp32 shards.  Its
     * SHARD_GRAD_OP (--zero 2) keeps the fp32 flat parameters sharded
     * outside forward and backward like FULL_SHARD; only the 16-bit
     * unsharded copy lives from forward to backward (engine_buffers). */
    .weights_are_master = TRUE,
    .weights_sharded_from = 2,
    .swap_buffers = 3,
    .frees_gradients = TRUE,
  },
  [STOW_ENGINE_NEMO] = {
    /* Without distributed Adam, megatron_amp_O2 wraps the optimizer in
     * MainParamsOptimizerWrapper with fp32_grad_accum for bf16 (NeMo
     * 2.0.0rc1, megatron_base_model.py configure_optimizers): fp32 main
     * grads, as Megatron-LM, full size. */
    .grad_bytes = 4,
    .full_grad_buffer = TRUE,
    /* --zero 1 is NeMo's distributed_fused_adam, Apex's
     * DistributedFusedAdam (nemo/core/optim/distributed_adam.py; apex
     * 810ffae, the commit NeMo 2.0.0rc1's Dockerfile.ci pins).  Every GPT
     * and Llama recipe of NeMo-Framework-Launcher 24.07 (the scripts in
     * examples/training/gpt/h100 and llama/h100, and
     * conf/training/gpt3/175b_fp8.yaml) sets optim.grad_sync_dtype=bf16
     * and contiguous_grad_buffer: the whole model's gradients sit in one
     * bf16 buffer (_init_grad_buffer), and each bucket's reduce-scattered
     * shard is kept, in bf16 too, until the step (grads_shard).  For a
     * bf16 model under an fp32 optimizer NeMo turns store_params off and
     * store_param_remainders on (megatron_base_model.py
     * setup_optimization): the fp32 master is the bf16 weight plus an
     * int16 remainder, 2 B a parameter, sharded with the Adam moments. */
    .distributed_adam = {
      .grad_bytes = 2,
      .master_bytes = 2,
      .grad_shards_note = " (Apex DistributedFusedAdam keeps each bucket's "
                          "reduce-scattered shard for the step)",
      .master_note = " (int16 remainders of the bf16 weights: Apex's "
                     "store_param_remainders)",
    },
    .weights_sharded_from = 3,
    .swap_buffers = 3,
  },
};

/* A row for every engine. */
G_STATIC_ASSERT (G_N_ELEMENTS (engine_states) == STOW_ENGINE_NEMO + 1);

static const EngineStates *
engine_states_of (StowEngine e)
{
  g_assert ((guint)e < G_N_ELEMENTS (engine_states));
  return &engine_states[e];
}

/* Whether @l runs @es's distributed optimizer. */
static gboolean
runs_distributed_adam (const EngineStates *es, const StowTraining *t,
                       const StowLayout *l)
{
  return es->distributed_adam.grad_bytes > 0 && l->zero >= 1
         && stow_mem_mixed_over_fp32 (t);
}

/* The bytes per parameter of the weights, gradients, master and optimizer
 * states under @l's engine (its row of engine_states, on top of full_bpp's
 * precision rules).  @full_grads: the gradient buffer stays full size
 * whatever the ZeRO stage; @dfa: a distributed optimizer keeps gradient
 * shards until the step. */
static Bpp
engine_bpp (const StowModel *m, const StowTraining *t, const StowLayout *l,
            gboolean *full_grads, gboolean *dfa)
{
  const EngineStates *es = engine_states_of (l->engine);
  Bpp b = full_bpp (m, t);
  *full_grads = es->full_grad_buffer;
  *dfa = runs_distributed_adam (es, t, l);
  if (es->weights_are_master && stow_mem_mixed_over_fp32 (t))
    b.w = 4, b.g = 4, b.master = 0;
  if (es->grad_bytes > 0)
    b.g = es->grad_bytes;
  if (*dfa)
    {
      b.g = es->distributed_adam.grad_bytes;
      if (t->precision != STOW_PRECISION_FP16)
        b.master = es->distributed_adam.master_bytes;
    }
  /* Megatron-core keeps its parameters in bf16 under fp8 (no
   * --fp8-param-gather); Transformer Engine's fp8 copies are charged
   * apart (te_fp8_state). */
  if (stow_mem_te_fp8_layers (t, l))
    b.w = 2;
  return b;
}

/* LoRA adapter parameters of one layer on one TP rank: r (in + out) per
 * targeted matrix.  A decoder layer of an encoder-decoder model has its
 * attention matrices twice: PEFT's names ("q", "v") match the
 * cross-attention's as well as the self-attention's. */
static guint64
lora_layer_params (const StowModel *m, const StowTraining *t, guint tp,
                   gboolean cross)
{
  guint targets
      = t->lora_targets ? t->lora_targets : (STOW_LORA_Q | STOW_LORA_V);
  guint64 h = m->hidden, qd = m->n_heads * m->head_dim,
          kd = m->n_kv_heads * m->head_dim, f = m->ffn, sum = 0;
  if (targets & STOW_LORA_Q)
    sum += h + qd;
  if (targets & STOW_LORA_K)
    sum += h + kd;
  if (targets & STOW_LORA_V)
    sum += h + kd;
  if (targets & STOW_LORA_O)
    sum += qd + h;
  if (cross)
    sum *= 2;
  if (m->gated_mlp && (targets & STOW_LORA_GATE))
    sum += h + f;
  if (targets & STOW_LORA_UP)
    sum += h + f;
  if (targets & STOW_LORA_DOWN)
    sum += f + h;
  return t->lora_rank * sum / tp;
}

typedef StowStageParams StageParams;

static guint64
padded_vocab (const StowModel *m, const StowLayout *l, const StowMemOptions *o)
{
  if (!stow_engine_is_mcore (l->engine) || o->vocab_multiple == 0)
    return m->vocab;
  guint64 mult = o->vocab_multiple * l->tp;
  return (m->vocab + mult - 1) / mult * mult;
}

/* What the memory model needs from the model's layer stack, which
 * depends on the model alone: the per-layer shares of the experts and the
 * norms, and the stack as runs of consecutive identical layers (the same
 * parameters, routed experts and kind).  Built once per model (a search's
 * scratch keeps one, stow_mem_scratch_new), so that a layout's stages are
 * summed a run at a time instead of a layer at a time, and no layout walks
 * the whole stack. */
typedef struct
{
  guint64 first, count; /* layers [first, first + count) */
  guint64 params;       /* of one layer */
  gboolean is_moe;
  StowLayerKind kind;
} LayerRun;

typedef struct
{
  const StowModel *m;
  guint64 n_moe;            /* layers with routed experts */
  guint64 expert_per_layer; /* routed-expert parameters of one of them */
  guint64 norm_per_layer;
  guint64 in_layers; /* parameters of every layer together */
  LayerRun *runs;    /* in layer order */
  guint64 n_runs;
} LayerTable;

static void
layer_table_init (LayerTable *lt, const StowModel *m)
{
  memset (lt, 0, sizeof *lt);
  lt->m = m;
  lt->runs = g_new (LayerRun, MAX (m->n_layers, 1));
  for (guint64 i = 0; i < m->n_layers; i++)
    {
      const StowLayerInfo *li = &m->layers[i];
      StowLayerKind kind = stow_mem_layer_kind (m, i);
      LayerRun *r = lt->n_runs ? &lt->runs[lt->n_runs - 1] : NULL;
      lt->n_moe += li->is_moe ? 1 : 0;
      lt->in_layers += li->params;
      if (r != NULL && r->params == li->params && r->is_moe == li->is_moe
          && r->kind == kind)
        r->count++;
      else
        lt->runs[lt->n_runs++] = (LayerRun){ .first = i,
                                             .count = 1,
                                             .params = li->params,
                                             .is_moe = li->is_moe,
                                             .kind = kind };
    }
  lt->expert_per_layer
      = lt->n_moe ? m->by_role[STOW_ROLE_EXPERT] / lt->n_moe : 0;
  lt->norm_per_layer = m->by_role[STOW_ROLE_NORM] / MAX (m->n_layers, 1);
}

static void
layer_table_clear (LayerTable *lt)
{
  g_clear_pointer (&lt->runs, g_free);
}

/* The run holding layer @i (< n_layers). */
static const LayerRun *
layer_run_at (const LayerTable *lt, guint64 i)
{
  guint64 lo = 0, hi = lt->n_runs;
  while (hi - lo > 1)
    {
      guint64 mid = lo + (hi - lo) / 2;
      if (lt->runs[mid].first <= i)
        lo = mid;
      else
        hi = mid;
    }
  return &lt->runs[lo];
}

/* The runs holding layers [@first, @first + @n): [*@begin, *@end). */
static void
layer_runs_of (const LayerTable *lt, guint64 first, guint64 n,
               const LayerRun **begin, const LayerRun **end)
{
  if (n == 0)
    {
      *begin = *end = lt->runs;
      return;
    }
  *begin = layer_run_at (lt, first);
  *end = layer_run_at (lt, first + n - 1) + 1;
}

/* Of @r's layers, those in [@a, @b). */
static guint64
run_overlap (const LayerRun *r, guint64 a, guint64 b)
{
  guint64 lo = MAX (r->first, a), hi = MIN (r->first + r->count, b);
  return hi > lo ? hi - lo : 0;
}

/* Parameters of a layer of run @r on one GPU: TP splits the linears, EP x
 * ETP the routed experts (--etp, Megatron-core's
 * --expert-tensor-parallel-size, which defaults to --tp;
 * megatron/training/theoretical_memory_usage.py divides the routed experts
 * by etp x ep); norms are replicated.  @experts_out: of which routed
 * experts. */
static guint64
layer_on_gpu (const LayerTable *lt, const StowLayout *l, const LayerRun *r,
              guint64 *norms_out, guint64 *experts_out)
{
  guint64 experts = r->is_moe && lt->n_moe ? lt->expert_per_layer : 0;
  guint64 norms = MIN (lt->norm_per_layer, r->params - experts);
  guint64 shardable = r->params - experts - norms;
  *norms_out = norms;
  *experts_out = experts / ((guint64)l->ep * stow_layout_etp (l));
  return shardable / l->tp + norms + *experts_out;
}

guint64
stow_mem_layer_params_on_gpu (const StowModel *m, const StowLayout *l,
                              guint64 layer)
{
  LayerTable lt;
  guint64 norms, experts;
  layer_table_init (&lt, m);
  guint64 on_gpu
      = layer_on_gpu (&lt, l, layer_run_at (&lt, layer), &norms, &experts);
  layer_table_clear (&lt);
  return on_gpu;
}

static guint64
largest_layer_on_gpu (const LayerTable *lt, const StowLayout *l)
{
  guint64 most = 0, norms, experts;
  for (guint64 r = 0; r < lt->n_runs; r++)
    most = MAX (most, layer_on_gpu (lt, l, &lt->runs[r], &norms, &experts));
  return most;
}

static StageParams
stage_params (const LayerTable *lt, const StowTraining *t, const StowLayout *l,
              const StowMemOptions *o, guint stage, guint64 first_layer,
              guint64 n_layers)
{
  const StowModel *m = lt->m;
  StageParams p = { 0 };

  p.first_layer = first_layer;
  p.layers = n_layers;
  p.first = stage == 0;
  p.last = stage + 1 == l->pp;
  guint64 cross = 0, end = first_layer + n_layers;
  const LayerRun *rb, *re;
  layer_runs_of (lt, first_layer, n_layers, &rb, &re);
  for (const LayerRun *r = rb; r < re; r++)
    {
      guint64 k = run_overlap (r, first_layer, end), norms, experts;
      guint64 on_gpu = layer_on_gpu (lt, l, r, &norms, &experts);
      cross += r->kind == STOW_LAYER_CROSS ? k : 0;
      p.params += k * on_gpu;
      p.experts += k * experts;
      p.linear += k * (on_gpu - norms);
      p.max_layer = MAX (p.max_layer, on_gpu);
    }
  guint64 emb = m->embedding_params;
  if (stow_engine_is_mcore (l->engine))
    emb += (padded_vocab (m, l, o) - m->vocab) * m->hidden;
  p.max_unit = p.max_layer;
  if (p.first)
    {
      p.params += emb / l->tp;
      p.max_unit = MAX (p.max_unit, emb / l->tp);
      p.max_end = emb / l->tp;
    }
  if (p.last)
    {
      /* What is neither a layer, the embedding nor the output layer: the
       * final norm, replicated under TP.  Counted on one stage, where the
       * step program holds each unit's exact tensors (planner/lower.c);
       * with several stages the program shares this count, which leaves
       * it out (a few kB). */
      if (l->pp == 1)
        {
          guint64 outside
              = m->embedding_params + m->head_params + lt->in_layers;
          p.params += m->params > outside ? m->params - outside : 0;
        }
      guint64 head = 0;
      if (m->head_params)
        head
            = (m->head_params + (padded_vocab (m, l, o) - m->vocab) * m->hidden)
              / l->tp;
      else if (l->pp > 1)
        /* Tied: the last stage keeps its own copy of the word embedding
         * for the output layer and all-reduces its gradient with stage 0. */
        head = padded_vocab (m, l, o) * m->hidden / l->tp;
      p.params += head;
      /* Tied on one stage, the output layer gathers the embedding. */
      p.max_unit = MAX (p.max_unit, head ? head : emb / l->tp);
      p.max_end = MAX (p.max_end, head ? head : emb / l->tp);
    }
  p.trainable = p.params;
  if (t->finetune != STOW_FINETUNE_FULL)
    p.trainable = (n_layers - cross) * lora_layer_params (m, t, l->tp, FALSE)
                  + cross * lora_layer_params (m, t, l->tp, TRUE);
  return p;
}

/* Data-parallel ranks that ZeRO shards over: dp x cp, the group the
 * engines build with context parallelism folded in (Megatron-LM
 * core_r0.8.0's DistributedOptimizer takes get_data_parallel_group
 * (with_context_parallel=True), megatron/core/optimizer/__init__.py;
 * NeMo 2.0.0rc1's distributed Adam the same group,
 * nemo/core/optim/distributed_adam.py). */
static guint64
shard_degree (const StowLayout *l, const StowCluster *c)
{
  guint64 dp = (guint64)l->dp * l->cp;
  if (l->hybrid_shard)
    {
      guint64 per_node = MAX (1, c->node.gpus_per_node / (l->tp * l->cp));
      return MIN (dp, per_node) * l->cp;
    }
  return dp;
}

/* Of @params parameters (@experts of them routed experts), the count one
 * rank keeps of a state that ZeRO shards @n ways: the dense part over @n,
 * the experts over their expert-data-parallel group. */
static guint64
sharded_params (const StowLayout *l, guint64 params, guint64 experts, guint64 n)
{
  if (n <= 1)
    return params;
  guint64 ne = stow_layout_expert_dp (l, n);
  if (experts == 0 || ne == n)
    return (params + n - 1) / n;
  return (params - experts + n - 1) / n + (experts + ne - 1) / ne;
}

/* " / 16 ZeRO shards" or "", for formulas. */
static const char *
shards (GArray *terms, char *buf, gsize size, guint64 d)
{
  if (d <= 1 || is_sink (terms))
    return ""; /* a sink keeps no formula */
  g_snprintf (buf, size, " / %" G_GUINT64_FORMAT " ZeRO shards", d);
  return buf;
}

static guint64
div_ceil (guint64 a, guint64 b)
{
  return (a + b - 1) / b;
}

/* How a dense model's formula names its shards: " / n ZeRO shards" when
 * n > 1 (SHARDS_IF_SPLIT), always (SHARDS_ALWAYS), or " / n" (SHARDS_BARE). */
typedef enum
{
  SHARDS_IF_SPLIT,
  SHARDS_ALWAYS,
  SHARDS_BARE,
} ShardsStyle;

/* For formulas: "N params / n ZeRO shards", and for a mixture of experts
 * both parts, "(D dense params / n ZeRO shards + E expert params / ne
 * expert-DP shards)" (@n 1: unsharded). */
static const char *
params_desc (GArray *terms, char *buf, gsize size, const StowLayout *l,
             guint64 params, guint64 experts, guint64 n, ShardsStyle style)
{
  char sbuf[48];
  if (is_sink (terms))
    return ""; /* a sink keeps no formula */
  if (experts == 0 && style == SHARDS_IF_SPLIT)
    g_snprintf (buf, size, "%" G_GUINT64_FORMAT " params%s", params,
                shards (terms, sbuf, sizeof sbuf, n));
  else if (experts == 0)
    g_snprintf (buf, size,
                "%" G_GUINT64_FORMAT " params / %" G_GUINT64_FORMAT "%s",
                params, n, style == SHARDS_ALWAYS ? " ZeRO shards" : "");
  else if (n <= 1)
    g_snprintf (buf, size,
                "%" G_GUINT64_FORMAT " params (%" G_GUINT64_FORMAT
                " dense + %" G_GUINT64_FORMAT " expert)",
                params, params - experts, experts);
  else
    g_snprintf (buf, size,
                "(%" G_GUINT64_FORMAT " dense params%s + %" G_GUINT64_FORMAT
                " expert params / %" G_GUINT64_FORMAT " expert-DP shards)",
                params - experts, shards (terms, sbuf, sizeof sbuf, n), experts,
                stow_layout_expert_dp (l, n));
  return buf;
}

/* What one micro-batch of a layout keeps, whatever the stage. */
typedef struct
{
  guint64 kind_bytes[STOW_N_LAYER_KINDS]; /* a layer's activations */
  guint64 kind_block[STOW_N_LAYER_KINDS]; /* its backward working set */
  guint64 input, logits, loss_grad;       /* stow_mem_end_sizes */
  guint64 ckpt;     /* what full recompute keeps of a layer */
  guint64 op_bytes; /* what selective op checkpointing keeps, or 0 */
} LayerSizes;

typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowLayout *l;
  const StowMemOptions *o;
  const LayerTable *lt; /* m's */
  /* What depends on the layout alone, computed once per estimate
   * (model_init) whatever the number of stages. */
  LayerSizes sizes;       /* one micro-batch (layer_sizes_init) */
  const EngineStates *es; /* the engine's rules */
  Bpp bpp;                /* the precision's bytes per parameter (full_bpp) */
  Bpp eng_bpp;            /* the engine's (engine_bpp), and its flags: */
  gboolean full_grads, dfa;
  guint64 n; /* shard degree */
  /* per-GPU host and NVMe bytes, summed over the worst stage */
  GArray *host;
  GArray *nvme;
  /* Device bytes of the stage's terms that exist only once its forward
   * has ended (logits and loss, backward working set, recomputed layer):
   * a peak inside the forward does not hold them.  Set by activations. */
  guint64 after_forward;
} Model;

/* Transformer Engine state an fp8 run keeps beside the bf16 weights.
 *
 * Weight caches: Megatron-core's TE wrappers pass is_first_microbatch to
 * every linear unless disable_parameter_transpose_cache is set (default
 * False; megatron/core/transformer/custom_layers/transformer_engine.py,
 * Megatron-LM core_r0.8.0, and 338af51, the commit NeMo 2.0.0rc1 pins),
 * and the schedules set it for each step's first micro-batch
 * (pipeline_parallel/schedules.py, set_is_first_microbatch).  TE then casts
 * each weight once a step into a workspace it keeps (get_fp8_workspace,
 * cache_name "weight"), with its transpose for the backward's dgrad GEMM
 * (with_transpose while grad is enabled): 1 + 1 B per parameter of every
 * TE linear, i.e. the layers' linear weights (TransformerEngine v1.8,
 * transformer_engine/pytorch/module/linear.py and base.py).  The
 * embedding and the output layer are not TE modules and stay bf16.
 *
 * Scaling state: each TE module keeps an amax history of amax_history_len
 * rows and a scale and scale_inv per fp8 tensor, 3 per GEMM forward
 * (input, weight, output) and 2 backward, in fp32 (base.py
 * set_meta_tensor).  Megatron-LM's --fp8-amax-history-len defaults to 1
 * (core_r0.8.0 arguments.py); NeMo's recipes set fp8_amax_history_len
 * 1024 (NeMo-Framework-Launcher 24.07, the gpt3 and llama training
 * configs).  A few MiB. */
static void
te_fp8_state (Model *ms, const StageParams *p, GArray *dev)
{
  const StowModel *m = ms->m;
  const StowLayout *l = ms->l;
  mem_add_term (dev, "fp8 weight caches", stow_bytes (p->linear, 2.0),
                STOW_TIER_DEVICE,
                "(1 B fp8 + 1 B fp8 transpose) x %" G_GUINT64_FORMAT
                " linear params (Transformer Engine's cached casts)",
                p->linear);
  /* GEMMs in the stage's TE modules: qkv, proj, fc1, fc2 per layer; an
   * MoE layer's fc1 and fc2 per local and shared expert. */
  guint64 gemms = 0, end = p->first_layer + p->layers;
  guint64 local = MAX (m->n_experts / MAX (l->ep, 1), 1);
  const LayerRun *rb, *re;
  layer_runs_of (ms->lt, p->first_layer, p->layers, &rb, &re);
  for (const LayerRun *r = rb; r < re; r++)
    gemms += run_overlap (r, p->first_layer, end)
             * (r->is_moe && m->n_experts > 0
                    ? 2 + 2 * (local + m->n_shared_experts)
                    : 4);
  guint64 hist = l->engine == STOW_ENGINE_NEMO ? 1024 : 1;
  mem_add_term (dev, "fp8 scaling state", gemms * 5 * (hist + 2) * 4,
                STOW_TIER_DEVICE,
                "%" G_GUINT64_FORMAT
                " GEMMs x 5 fp8 tensors x (amax history %" G_GUINT64_FORMAT
                " + scale + scale_inv) x 4 B",
                gemms, hist);
}

/* One stage's model states, as the steps of model_states share them. */
typedef struct
{
  Model *ms;
  const StageParams *p;
  const EngineStates *es;
  Bpp b; /* bytes per parameter */
  /* Parameters, trainable ones (LoRA's adapters, or all), and routed
   * experts, which are sharded over their expert-data-parallel group
   * (sharded_params); a dense model has none. */
  guint64 N, T, E;
  /* The ways ZeRO shards the weights, gradients and optimizer states (1:
   * not at all). */
  guint64 wdiv, gdiv, odiv;
  gboolean off_opt, off_par;
  GArray *dev, *host, *nvme; /* host and nvme NULL: not charged here */
} States;

/* LoRA: frozen weights, the adapters and their gradients and states. */
static void
lora_states (States *s)
{
  Model *ms = s->ms;
  const StowLayout *l = ms->l;
  const StowTraining *t = ms->t;
  const StageParams *p = s->p;
  Bpp b = s->b;
  guint64 N = s->N, T = s->T, E = s->E;
  GArray *dev = s->dev, *host = s->host, *nvme = s->nvme;
  char sbuf[48], pbuf[160];

  /* DeepSpeed (the one engine that offloads under LoRA) moves the frozen
   * weights' shards to the host with --offload-params, and the adapters'
   * gradients and states with --offload-optimizer. */
  gboolean par_nvme = l->offload_params == STOW_OFFLOAD_NVME;
  gboolean opt_nvme = l->offload_optimizer == STOW_OFFLOAD_NVME;
  GArray *wdev = s->off_par ? (par_nvme ? nvme : host) : dev;
  GArray *odev = s->off_opt ? host : dev;
  StowTier wtier = s->off_par ? (par_nvme ? STOW_TIER_NVME : STOW_TIER_PINNED)
                              : STOW_TIER_DEVICE;
  StowTier otier = s->off_opt ? STOW_TIER_HOST : STOW_TIER_DEVICE;
  double wb = stow_mem_frozen_weight_bytes (ms->m, t, b.w);
  guint64 linear = p->linear;
  guint64 frozen = stow_mem_frozen_linear_bytes (l, linear, E, wb, s->wdiv);
  if (wdev && E == 0)
    mem_add_term (wdev, s->off_par ? "offloaded parameters" : "parameters",
                  frozen, wtier,
                  "%.4g B x %" G_GUINT64_FORMAT " frozen linear params%s", wb,
                  linear, shards (dev, sbuf, sizeof sbuf, s->wdiv));
  else if (wdev)
    mem_add_term (wdev, s->off_par ? "offloaded parameters" : "parameters",
                  frozen, wtier, "%.4g B x %s, frozen linear", wb,
                  params_desc (dev, pbuf, sizeof pbuf, l, linear, E, s->wdiv,
                               SHARDS_IF_SPLIT));
  /* Embeddings and norms stay in the model's dtype; QLoRA's in bf16, its
   * compute dtype. */
  double nb = stow_mem_frozen_other_bytes (ms->m, t, b.w);
  if (wdev)
    mem_add_term (wdev,
                  s->off_par ? "offloaded parameters (non-linear)"
                             : "parameters (non-linear)",
                  stow_bytes (N - linear, nb) / s->wdiv, wtier,
                  "%.4g B x %" G_GUINT64_FORMAT
                  " embedding and norm params (frozen)",
                  nb, N - linear);
  /* Adapters train in fp32 (PEFT's default under autocast): weights,
   * gradients and optimizer states, no separate master.  Pure bf16
   * (torchtune) keeps them in bf16 like the rest of the model. */
  double ab = t->precision == STOW_PRECISION_BF16_PURE ? 2.0 : 4.0;
  if (wdev)
    mem_add_term (wdev, "lora adapters", stow_bytes (T, ab) / s->wdiv, wtier,
                  "%.4g B x %" G_GUINT64_FORMAT
                  " adapter params (rank %" G_GUINT64_FORMAT ")",
                  ab, T, t->lora_rank);
  /* Swapped to NVMe (ZeRO-Infinity), the frozen weights pass through
   * pinned staging buffers as in full training. */
  if (s->off_par && par_nvme && host)
    mem_add_term (
        host, "parameter staging buffers",
        PARAM_STAGING_BUFFERS * stow_bytes (p->max_layer, wb), STOW_TIER_PINNED,
        "%d x %.4g B x %" G_GUINT64_FORMAT " params (the largest layer)",
        PARAM_STAGING_BUFFERS, wb, p->max_layer);
  if (odev == NULL)
    return;
  mem_add_term (odev, s->off_opt ? "offloaded gradients" : "gradients",
                stow_bytes (T, ab) / s->gdiv, otier,
                "%.4g B x %" G_GUINT64_FORMAT " adapter params", ab, T);
  /* On NVMe the adapters' states are swapped through DeepSpeed's four
   * buffers of them, at most sub_group_size each. */
  GArray *sdev = opt_nvme ? nvme : odev;
  if (sdev)
    mem_add_term (
        sdev,
        s->off_opt ? "master weights and optimizer states" : "optimizer states",
        stow_bytes (T, b.opt) / s->odiv, opt_nvme ? STOW_TIER_NVME : otier,
        "%.4g B x %" G_GUINT64_FORMAT " adapter params (%s)", b.opt, T,
        stow_optimizer_name (t->optimizer));
  if (opt_nvme)
    {
      guint64 sp = MIN (T / s->odiv, DS_SUB_GROUP_PARAMS);
      mem_add_term (odev, "optimizer swap buffers",
                    DS_SWAP_BUFFERS * stow_bytes (sp, b.opt), STOW_TIER_PINNED,
                    "%d buffers x %.4g B x %" G_GUINT64_FORMAT
                    " adapter params",
                    DS_SWAP_BUFFERS, b.opt, sp);
    }
}

static gboolean ranks_reduce_each_micro_batch (const Model *ms);

/* Weights: on the device, or offloaded.  Offloaded parameters keep no
 * resident copy: the working set they are gathered into is the engine's
 * buffer. */
static void
weight_states (States *s)
{
  Model *ms = s->ms;
  const StowLayout *l = ms->l;
  const StowTraining *t = ms->t;
  const StageParams *p = s->p;
  const EngineStates *es = s->es;
  Bpp b = s->b;
  guint64 N = s->N, E = s->E, n = ms->n;
  GArray *dev = s->dev, *host = s->host, *nvme = s->nvme;
  char pbuf[160];

  if (!s->off_par)
    {
      mem_add_term (dev, "parameters",
                    stow_bytes (sharded_params (l, N, E, s->wdiv), b.w),
                    STOW_TIER_DEVICE, "%.4g B x %s", b.w,
                    params_desc (dev, pbuf, sizeof pbuf, l, N, E, s->wdiv,
                                 SHARDS_IF_SPLIT));
      if (s->off_opt && host && es->cpu_optimizer_writes_weights
          && t->finetune == STOW_FINETUNE_FULL)
        mem_add_term (
            host, "host copy of the weights",
            stow_bytes (sharded_params (l, N, E, n), b.w), STOW_TIER_PINNED,
            "%.4g B x %s", b.w,
            params_desc (host, pbuf, sizeof pbuf, l, N, E, n, SHARDS_ALWAYS));
      return;
    }
  guint64 shard = stow_bytes (sharded_params (l, N, E, n), b.w);
  if (l->offload_params == STOW_OFFLOAD_CPU)
    {
      if (host)
        mem_add_term (
            host, "offloaded parameters", shard, STOW_TIER_PINNED,
            "%.4g B x %s", b.w,
            params_desc (host, pbuf, sizeof pbuf, l, N, E, n, SHARDS_ALWAYS));
      return;
    }
  if (nvme)
    mem_add_term (
        nvme, "offloaded parameters", shard, STOW_TIER_NVME, "%.4g B x %s", b.w,
        params_desc (nvme, pbuf, sizeof pbuf, l, N, E, n, SHARDS_ALWAYS));
  /* (On stowage's ranks, the unit's ZeRO partition, padding included.) */
  guint64 staged = !es->unit_slots ? p->max_layer
                   : ranks_reduce_each_micro_batch (s->ms)
                       ? stow_zero_part (p->max_unit, (guint)n)
                       : div_ceil (p->max_unit, n);
  if (host)
    mem_add_term (
        host, "parameter staging buffers",
        PARAM_STAGING_BUFFERS * stow_bytes (staged, b.w), STOW_TIER_PINNED,
        "%d x %.4g B x %" G_GUINT64_FORMAT " params (the largest unit's shard)",
        PARAM_STAGING_BUFFERS, b.w, staged);
  if (host && s->off_opt && es->cpu_optimizer_writes_weights
      && t->finetune == STOW_FINETUNE_FULL)
    mem_add_term (host, "parameter write buffer", stow_bytes (staged, b.w),
                  STOW_TIER_PINNED,
                  "%.4g B x %" G_GUINT64_FORMAT
                  " params (the largest unit's shard)",
                  b.w, staged);
}

/* stowage's own ranks over exact units (planner/lower.c's exact): each
 * micro-batch's gradients pass through the gradient slots and are reduced
 * on their own, at every ZeRO stage, rather than through buckets. */
static gboolean
ranks_reduce_each_micro_batch (const Model *ms)
{
  const StowLayout *l = ms->l;
  return l->engine == STOW_ENGINE_STOWAGE && ms->n > 1 && l->tp == 1
         && l->ep == 1 && l->pp == 1 && l->vpp == 1 && l->cp == 1
         && ms->t->finetune == STOW_FINETUNE_FULL;
}

/* Gradients on the device.  A layer's full gradients exist before they
 * are reduce-scattered (ZeRO >= 2) or copied to the host (offload): two
 * layer slots, one being produced and one in flight, unless the engine
 * reduces through its buckets (charged with the engine's buffers). */
static void
gradient_states (States *s)
{
  Model *ms = s->ms;
  const StowLayout *l = ms->l;
  const StowTraining *t = ms->t;
  const StageParams *p = s->p;
  const EngineStates *es = s->es;
  Bpp b = s->b;
  guint64 N = s->N, E = s->E, gdiv = s->gdiv, odiv = s->odiv;
  GArray *dev = s->dev;
  char pbuf[160];

  gboolean bucketed = es->reduce_buckets;
  /* A tied output layer on the embedding's stage writes the embedding's
   * gradient in its loss, and the embedding's backward adds to it: that
   * gradient has a buffer of its own from one to the other (the step
   * program's "embedding gradients (tied head)"), the slots hold the
   * rest.  The program does so where its units are exact
   * (planner/lower.c, build_units), as the executor runs it: on one rank,
   * or on several, where the embedding's backward writes a slot and both
   * are reduced together; other layouts keep the simpler schedule of
   * before, which leaves that write out (planner/lower.c, tied_unit). */
  gboolean ranks = ranks_reduce_each_micro_batch (ms);
  gboolean tied = es->unit_slots && !bucketed && p->first && p->last
                  && (ms->n == 1 || ranks) && l->tp == 1 && l->ep == 1
                  && l->pp == 1 && l->vpp == 1
                  && t->finetune == STOW_FINETUNE_FULL
                  && ms->m->head_params == 0;
  guint64 tied_params = tied ? ms->m->embedding_params / l->tp : 0;
  /* (On several ranks the embedding's backward uses the slots too.) */
  guint64 slot_params = !es->unit_slots      ? p->max_layer
                        : tied && ms->n == 1 ? p->max_layer
                                             : p->max_unit;
  /* On stowage's ranks with the optimizer on the host, each slot holds
   * the rank's partition of the step's gradients behind the unit's
   * (planner/lower-optim.c, stow_lower_slot_tail). */
  guint64 tail
      = ranks && s->off_opt ? stow_zero_part (slot_params, (guint)ms->n) : 0;
  guint64 slots
      = MIN (2, MAX (p->layers, 1)) * stow_bytes (slot_params + tail, b.g);
  if ((s->off_opt || s->off_par || gdiv > 1 || ranks) && tied)
    mem_add_term (dev, "tied embedding gradients",
                  stow_bytes (tied_params, b.g), STOW_TIER_DEVICE,
                  "%.4g B x %" G_GUINT64_FORMAT
                  " params of the embedding, from the loss to its backward",
                  b.g, tied_params);
  if (s->off_opt || s->off_par)
    {
      if (!bucketed && tail > 0)
        mem_add_term (dev, "gradient slots", slots, STOW_TIER_DEVICE,
                      "%" G_GUINT64_FORMAT
                      " layers x %.4g B x (%" G_GUINT64_FORMAT
                      " params of the largest layer + its %" G_GUINT64_FORMAT
                      "-param partition)",
                      MIN (2, MAX (p->layers, 1)), b.g, slot_params, tail);
      else if (!bucketed)
        mem_add_term (dev, "gradient slots", slots, STOW_TIER_DEVICE,
                      "%" G_GUINT64_FORMAT
                      " layers x %.4g B x %" G_GUINT64_FORMAT
                      " params of the largest layer",
                      MIN (2, MAX (p->layers, 1)), b.g, slot_params);
      /* Parameters offloaded but the optimizer on the GPU: the reduced
       * gradient shard stays on the device for the step (found by the
       * simulator: nothing else held it). */
      if (!s->off_opt)
        mem_add_term (dev, "gradients",
                      stow_bytes (sharded_params (l, N, E, gdiv), b.g),
                      STOW_TIER_DEVICE, "%.4g B x %s", b.g,
                      params_desc (dev, pbuf, sizeof pbuf, l, N, E, gdiv,
                                   SHARDS_IF_SPLIT));
    }
  else if (t->optimizer_in_backward)
    {
      /* Each parameter is stepped and its gradient freed as soon as it is
       * produced: one tensor's gradient at a time, the largest module's. */
      guint64 ll = MIN (N, ms->m->largest_module_params / l->tp);
      mem_add_term (dev, "gradients", stow_bytes (ll, b.g), STOW_TIER_DEVICE,
                    "%.4g B x %" G_GUINT64_FORMAT
                    " params of the largest module (optimizer in backward)",
                    b.g, ll);
    }
  else
    {
      mem_add_term (
          dev, "gradients", stow_bytes (sharded_params (l, N, E, gdiv), b.g),
          STOW_TIER_DEVICE, "%.4g B x %s", b.g,
          params_desc (dev, pbuf, sizeof pbuf, l, N, E, gdiv, SHARDS_IF_SPLIT));
      if ((gdiv > 1 || ranks_reduce_each_micro_batch (ms)) && !bucketed)
        mem_add_term (dev, "gradient slots", slots, STOW_TIER_DEVICE,
                      "%" G_GUINT64_FORMAT
                      " layers x %.4g B x %" G_GUINT64_FORMAT
                      " params before reduce-scatter",
                      MIN (2, MAX (p->layers, 1)), b.g, slot_params);
    }
  if (es->fp32_grad_partition_note && t->precision != STOW_PRECISION_FP32
      && !s->off_opt)
    mem_add_term (
        dev, "fp32 gradient partition", sharded_params (l, N, E, odiv) * 4,
        STOW_TIER_DEVICE, "4 B x %s%s",
        params_desc (dev, pbuf, sizeof pbuf, l, N, E, odiv, SHARDS_BARE),
        es->fp32_grad_partition_note);
  if (ms->dfa && !s->off_opt)
    mem_add_term (
        dev, "gradient shards",
        stow_bytes (sharded_params (l, N, E, odiv), b.g), STOW_TIER_DEVICE,
        "%.4g B x %s%s", b.g,
        params_desc (dev, pbuf, sizeof pbuf, l, N, E, odiv, SHARDS_BARE),
        es->distributed_adam.grad_shards_note);
}

/* Master weights and optimizer states: on the device, or with the CPU
 * optimizer in host memory (and the gradients it reads), or swapped to
 * NVMe through pinned buffers. */
static void
optimizer_states (States *s)
{
  Model *ms = s->ms;
  const StowLayout *l = ms->l;
  const StowTraining *t = ms->t;
  const EngineStates *es = s->es;
  Bpp b = s->b;
  guint64 N = s->N, E = s->E, n = ms->n;
  GArray *dev = s->dev, *host = s->host, *nvme = s->nvme;
  char pbuf[160];

  if (!s->off_opt)
    {
      guint64 sharded = sharded_params (l, N, E, s->odiv);
      params_desc (dev, pbuf, sizeof pbuf, l, N, E, s->odiv, SHARDS_IF_SPLIT);
      mem_add_term (dev, "master weights", stow_bytes (sharded, b.master),
                    STOW_TIER_DEVICE, "%.4g B x %s%s", b.master, pbuf,
                    ms->dfa && b.master < 4 ? es->distributed_adam.master_note
                                            : "");
      mem_add_term (dev, "optimizer states", stow_bytes (sharded, b.opt),
                    STOW_TIER_DEVICE, "%.4g B x %s (%s)", b.opt, pbuf,
                    stow_optimizer_name (t->optimizer));
      return;
    }
  guint64 shard = sharded_params (l, N, E, n);
  params_desc (host ? host : dev, pbuf, sizeof pbuf, l, N, E, n, SHARDS_ALWAYS);
  double gb = es->offloaded_grad_bytes > 0 ? es->offloaded_grad_bytes : b.g;
  StowTier tier = es->offloaded_pageable ? STOW_TIER_HOST : STOW_TIER_PINNED;
  if (host)
    mem_add_term (host, "offloaded gradients", stow_bytes (shard, gb), tier,
                  "%.4g B x %s", gb, pbuf);
  if (l->offload_optimizer == STOW_OFFLOAD_CPU)
    {
      if (host)
        mem_add_term (host, "master weights and optimizer states",
                      stow_bytes (shard, b.master + b.opt), tier, "%.4g B x %s",
                      b.master + b.opt, pbuf);
      return;
    }
  if (nvme)
    mem_add_term (
        nvme, "master weights and optimizer states",
        stow_bytes (shard, b.master + b.opt), STOW_TIER_NVME, "%.4g B x %s",
        b.master + b.opt,
        params_desc (nvme, pbuf, sizeof pbuf, l, N, E, n, SHARDS_ALWAYS));
  guint64 sp = MIN (shard, es->swap_chunk_params ? es->swap_chunk_params
                                                 : ms->o->swap_shard_params);
  guint64 nbuf = es->swap_buffers, swapped = nbuf * sp;
  if (es->swap_trims)
    {
      nbuf = MIN (nbuf, div_ceil (shard, sp));
      swapped = MIN (shard, nbuf * sp);
    }
  if (host)
    mem_add_term (host, "optimizer swap buffers",
                  stow_bytes (swapped, b.master + b.opt), STOW_TIER_PINNED,
                  "%" G_GUINT64_FORMAT " buffers x %.4g B, %" G_GUINT64_FORMAT
                  " params in flight (chunks of %" G_GUINT64_FORMAT ")",
                  nbuf, b.master + b.opt, swapped, sp);
}

/* stowage's ranks keep each unit's ZeRO partition whole and aligned to
 * the gradient norm's blocks (core/zero.h): the partitioned states hold
 * the padding beyond N / n, per tier, as the step program sizes them. */
static void
partition_padding (States *s)
{
  Model *ms = s->ms;
  const StowLayout *l = ms->l;
  guint64 n = ms->n;
  if (!ranks_reduce_each_micro_batch (ms))
    return;
  /* The units' elements as program/program.c's stow_program_set_units
   * groups the tensors (the embedding, each layer, the rest), in one pass. */
  const StowModel *m = ms->m;
  g_autofree guint64 *unit = g_new0 (guint64, m->n_layers + 2);
  for (guint i = 0; i < m->tensors->len; i++)
    {
      const StowTensor *t = g_ptr_array_index (m->tensors, i);
      if (t->tied || (t->layer >= 0 && (guint64)t->layer >= m->n_layers))
        continue;
      guint64 k = t->layer >= 0                    ? (guint64)t->layer + 1
                  : t->role == STOW_ROLE_EMBEDDING ? 0
                                                   : m->n_layers + 1;
      unit[k] += t->numel;
    }
  guint64 padded = 0;
  for (guint64 u = 0; u < m->n_layers + 2; u++)
    padded += stow_zero_part (unit[u], (guint)n);
  guint64 even = sharded_params (l, s->N, s->E, n);
  if (padded <= even)
    return;
  guint64 pad = padded - even;
  Bpp b = s->b;
  double dev = 0, host = 0, nvme = 0;
  if (!s->off_par && s->wdiv > 1)
    dev += b.w;
  if (!s->off_opt)
    dev += (s->gdiv > 1 ? b.g : 0) + (s->odiv > 1 ? b.master + b.opt : 0);
  else
    {
      host += b.g + (s->off_par ? 0 : b.w);
      if (l->offload_optimizer == STOW_OFFLOAD_CPU)
        host += b.master + b.opt;
      else
        nvme += b.master + b.opt;
    }
  if (l->offload_params == STOW_OFFLOAD_CPU)
    host += b.w;
  else if (l->offload_params == STOW_OFFLOAD_NVME)
    nvme += b.w;
#define PADDING_WHY                                                            \
  "%.4g B x %" G_GUINT64_FORMAT " params: each unit's partition aligned to "   \
  "the gradient norm's blocks"
  if (dev > 0)
    mem_add_term (s->dev, "ZeRO partition padding", stow_bytes (pad, dev),
                  STOW_TIER_DEVICE, PADDING_WHY, dev, pad);
  if (host > 0 && s->host)
    mem_add_term (s->host, "ZeRO partition padding", stow_bytes (pad, host),
                  STOW_TIER_PINNED, PADDING_WHY, host, pad);
  if (nvme > 0 && s->nvme)
    mem_add_term (s->nvme, "ZeRO partition padding", stow_bytes (pad, nvme),
                  STOW_TIER_NVME, PADDING_WHY, nvme, pad);
#undef PADDING_WHY
}

/* Model states of one stage: weights, gradients, master weights and
 * optimizer states on the device, or offloaded, by the engine's rules
 * (engine_states). */
static void
model_states (Model *ms, const StageParams *p, GArray *dev,
              gboolean charge_host)
{
  const StowLayout *l = ms->l;
  guint z = l->zero;
  const EngineStates *es = ms->es;
  guint64 n = ms->n;
  States s = {
    .ms = ms,
    .p = p,
    .es = es,
    .b = ms->bpp,
    .N = p->params,
    .T = p->trainable,
    .E = p->experts,
    .wdiv = z >= es->weights_sharded_from ? n : 1,
    .gdiv = z >= 2 ? n : 1,
    .odiv = z >= 1 ? n : 1,
    .off_opt = l->offload_optimizer != STOW_OFFLOAD_NONE,
    .off_par = l->offload_params != STOW_OFFLOAD_NONE,
    .dev = dev,
    .host = charge_host ? ms->host : NULL,
    .nvme = charge_host ? ms->nvme : NULL,
  };

  if (s.host && s.off_opt && es->cpu_optimizer_buffers)
    mem_add_term (s.host, "CPU optimizer buffers",
                  ms->o->cpu_optimizer_buffer_bytes, STOW_TIER_PINNED,
                  "%s: %" G_GUINT64_FORMAT " B", es->cpu_optimizer_buffers,
                  ms->o->cpu_optimizer_buffer_bytes);
  if (ms->t->finetune != STOW_FINETUNE_FULL)
    {
      lora_states (&s);
      return;
    }
  s.b = ms->eng_bpp;
  if (ms->full_grads)
    s.gdiv = 1;
  weight_states (&s);
  if (stow_mem_te_fp8_layers (ms->t, l))
    te_fp8_state (ms, p, dev);
  gradient_states (&s);
  optimizer_states (&s);
  partition_padding (&s);
}

/* What one micro-batch of the layout keeps, whatever the stage: each
 * layer kind's activations and backward working set, the ends' tensors and
 * the checkpoints.  Computed once per estimate (layer_sizes_init), not per
 * stage. */
static void
layer_sizes_init (LayerSizes *z, const StowModel *m, const StowTraining *t,
                  const StowLayout *l)
{
  guint64 *kind_bytes = z->kind_bytes, *kind_block = z->kind_block;
  /* Per-layer activations by kind (dense, MoE, decoder with
   * cross-attention); a stage sums its own layers.  Kinds the model does
   * not have cost nothing to skip. */
  for (int k = 0; k < STOW_N_LAYER_KINDS; k++)
    {
      if ((k == STOW_LAYER_MOE && m->n_experts == 0)
          || (k == STOW_LAYER_CROSS && m->n_encoder_layers == 0))
        {
          kind_block[k] = kind_block[STOW_LAYER_DENSE];
          kind_bytes[k] = kind_bytes[STOW_LAYER_DENSE];
          continue;
        }
      guint64 block, core;
      stow_mem_layer_activation_parts (m, t, l, (StowLayerKind)k, &block,
                                       &core);
      if (l->recompute == STOW_RECOMPUTE_SELECTIVE && !t->flash_attention)
        core = 0;
      kind_block[k] = block;
      if (stow_mem_te_fp8_layers (t, l))
        {
          /* The gradients of the activations are 16-bit where TE saved
           * fp8 copies of them: size the working set as in bf16. */
          StowTraining t16 = *t;
          guint64 core16;
          t16.precision = STOW_PRECISION_BF16;
          stow_mem_layer_activation_parts (m, &t16, l, (StowLayerKind)k,
                                           &kind_block[k], &core16);
        }
      kind_bytes[k] = block + core;
    }
  stow_mem_end_sizes (m, t, l, &z->input, &z->logits, &z->loss_grad);
  z->ckpt = stow_mem_checkpoint_bytes (m, t, l);
  z->op_bytes = l->recompute == STOW_RECOMPUTE_OP
                    ? stow_mem_op_checkpoint_bytes (m, t, l)
                    : 0;
}

/* Interleaved 1F1B: the model chunks @stage has run forward when its
 * first backward starts: Megatron's warm-up of 2 (p - i - 1) + (v - 1) p
 * chunks plus one in the steady state, at most all m v of them. */
static guint64
interleaved_warmup (const StowLayout *l, guint stage)
{
  guint64 m = l->grad_accum, p = l->pp, v = l->vpp;
  return MIN (2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
}

/* Micro-batches whose activations a stage holds at its peak. */
static double
in_flight (const StowLayout *l, guint stage)
{
  guint64 m = l->grad_accum, p = l->pp, v = l->vpp;
  switch (l->schedule)
    {
    case STOW_SCHEDULE_GPIPE:
      return (double)m; /* all forwards before any backward */
    case STOW_SCHEDULE_INTERLEAVED:
      {
        /* A chunk is 1/v of the stage's layers.  Stage 0 gets
         * p (1 + (p - 1) / (p v)), the factor in Korthikanti et al. */
        return (double)interleaved_warmup (l, stage) / (double)v;
      }
    case STOW_SCHEDULE_1F1B:
      break;
    }
  return (double)MIN (m, p - stage); /* 1F1B: stage i holds p - i */
}

/* Before backward k (< p v) of a stage that has run w + k forwards: the
 * micro-batches whose forward through the chunk placed at @fwd_at of a
 * period has run, less those whose backward through it (at @bwd_at) has. */
static gint64
chunk_forwards_ahead (gint64 w, gint64 k, gint64 p, gint64 pv, gint64 fwd_at,
                      gint64 bwd_at)
{
  gint64 f = (w + k) / pv * p + CLAMP ((w + k) % pv - fwd_at, 0, p);
  gint64 b = k / pv * p + CLAMP (k % pv - bwd_at, 0, p);
  return f - b;
}

/* Interleaved 1F1B: the most micro-batches whose forward through model
 * chunk @chunk has run on @stage and whose backward has not.  Megatron's
 * order runs groups of p micro-batches through the chunks in turn, and
 * backward the same with the chunks reversed; before backward k the stage
 * has run w + k forwards (w: interleaved_warmup).  Both counts grow by p
 * every p v steps, so one period of the steady state holds the largest
 * difference.  In k the difference is piecewise linear: each count is flat,
 * grows by one a step, or (the forwards, at a period's end) jumps.  So its
 * largest value is at an end of a piece, and those ends are all the k the
 * search needs to look at, not the p v of a period. */
static guint64
interleaved_chunk_in_flight (const StowLayout *l, guint stage, guint chunk)
{
  gint64 m = (gint64)l->grad_accum, p = l->pp, v = l->vpp;
  gint64 n = m * v, pv = p * v;
  gint64 w = (gint64)interleaved_warmup (l, stage);
  gint64 fwd_at = (gint64)chunk * p, bwd_at = (v - 1 - chunk) * p, best = 0;
  gint64 last = MIN (n - w, pv - 1);
  /* k where the forwards' period holding w + 0 begins (<= 0) */
  gint64 q = w / pv * pv - w;
  gint64 ends[] = { 0,
                    last,
                    bwd_at,
                    bwd_at + p,
                    q + fwd_at,
                    q + fwd_at + p,
                    q + pv - 1,
                    q + pv,
                    q + pv + fwd_at,
                    q + pv + fwd_at + p };
  /* A period no longer than the list of ends is cheaper walked. */
  if (last < (gint64)G_N_ELEMENTS (ends))
    for (gint64 k = 0; k <= last; k++)
      best = MAX (best, chunk_forwards_ahead (w, k, p, pv, fwd_at, bwd_at));
  else
    for (guint i = 0; i < G_N_ELEMENTS (ends); i++)
      if (ends[i] >= 0 && ends[i] <= last)
        best = MAX (best,
                    chunk_forwards_ahead (w, ends[i], p, pv, fwd_at, bwd_at));
  return (guint64)MIN (best, m);
}

/* Of a stage's first @x layers, those that store their activations when
 * the first @k of every @run are recomputed. */
static guint64
stored_layers (guint64 x, guint64 run, guint64 k)
{
  guint64 kept = k < run ? run - k : 0, rest = x % run;
  return x / run * kept + (rest > k ? rest - k : 0);
}

static void
activations (Model *ms, const StageParams *p, guint stage, GArray *dev,
             gboolean charge_host)
{
  const StowModel *m = ms->m;
  const StowTraining *t = ms->t;
  const StowLayout *l = ms->l;
  const LayerSizes *z = &ms->sizes;
  double mb = in_flight (l, stage);
  guint64 input = z->input, lg = z->logits, dh = z->loss_grad;
  guint64 ckpt = z->ckpt;
  guint64 n_full_recompute
      = stow_layout_recomputed_layers (l, m->n_layers, p->layers);
  guint64 n_stored = p->layers - n_full_recompute;
  /* The first K layers of the stage (of each model chunk when
   * interleaved) are recomputed, the rest stored; the largest layer sets
   * the rebuilt and working sets. */
  guint64 run
      = l->vpp > 1 ? stow_layout_recompute_run (l, m->n_layers) : p->layers;
  guint64 k_run = n_full_recompute / (l->vpp > 1 ? l->vpp : 1);
  guint64 stored_bytes = 0, full = 0, block = 0, rebuilt_extra = 0;
  /* Offloaded checkpoints the backward holds on the device beyond what the
   * loss finds there (the prefetched one). */
  guint64 ckpt_prefetch = 0;
  /* Selective op checkpointing stores what its policy saves of every
   * layer and rebuilds the rest of one layer at a time in backward. */
  guint64 op_bytes = z->op_bytes;
  guint64 end = p->first_layer + p->layers;
  const LayerRun *rb, *re;
  layer_runs_of (ms->lt, p->first_layer, p->layers, &rb, &re);
  for (const LayerRun *r = rb; r < re; r++)
    {
      StowLayerKind k = r->kind;
      guint64 lo = MAX (r->first, p->first_layer) - p->first_layer;
      guint64 hi = MIN (r->first + r->count, end) - p->first_layer;
      guint64 stored = stored_layers (hi, MAX (run, 1), k_run)
                       - stored_layers (lo, MAX (run, 1), k_run);
      stored_bytes
          += stored
             * (op_bytes ? MIN (op_bytes, z->kind_bytes[k]) : z->kind_bytes[k]);
      full = MAX (full, z->kind_bytes[k]);
      block = MAX (block, z->kind_block[k]);
    }

  if (n_stored > 0)
    mem_add_term (
        dev, "activations", stow_mem_round ((double)stored_bytes * mb),
        STOW_TIER_DEVICE,
        "%.4g micro-batches in flight x %" G_GUINT64_FORMAT
        " layers, %" G_GUINT64_FORMAT " B per micro-batch (%s%s%s)",
        mb, n_stored, stored_bytes,
        t->flash_attention ? "flash attention" : "s^2 scores",
        l->recompute == STOW_RECOMPUTE_SELECTIVE ? ", selective recompute"
        : op_bytes ? ", selective op checkpointing: input, attention output, "
                     "every second matmul's"
                   : "",
        l->sp ? ", sequence parallel" : "");
  if (op_bytes)
    {
      /* Backward rebuilds one layer's unsaved tensors beside its saved
       * ones. */
      rebuilt_extra = full - MIN (op_bytes, full);
      mem_add_term (dev, "recomputed layer", rebuilt_extra, STOW_TIER_DEVICE,
                    "one layer's activations rebuilt during backward: "
                    "%" G_GUINT64_FORMAT " B less the %" G_GUINT64_FORMAT
                    " B selective op checkpointing kept",
                    full, op_bytes);
    }
  if (n_full_recompute > 0)
    {
      guint64 bytes = stow_mem_round ((double)(ckpt * n_full_recompute) * mb);
      if (l->offload_activations)
        {
          /* Checkpoints go to pinned host memory; the device keeps two
           * layers' worth (the one in use and the next prefetched).
           * stowage's own schedule brings one back for the layer it
           * rebuilds once the compute before it is done; forward holds a
           * second while it goes down, but beside a working set smaller
           * than backward's, so its peak holds one (found by the
           * simulator once the fused loss no longer dominated the last
           * stage). */
          guint64 kept = l->engine == STOW_ENGINE_STOWAGE ? 1 : 2;
          ckpt_prefetch = MIN (kept * ckpt, bytes) - MIN (ckpt, bytes);
          mem_add_term (dev, "activation checkpoints", MIN (kept * ckpt, bytes),
                        STOW_TIER_DEVICE,
                        "%" G_GUINT64_FORMAT " layers x %" G_GUINT64_FORMAT
                        " B (rest offloaded)",
                        kept, ckpt);
          if (charge_host)
            mem_add_term (ms->host, "activation checkpoints", bytes,
                          STOW_TIER_PINNED,
                          "%.4g micro-batches x %" G_GUINT64_FORMAT
                          " layers x %" G_GUINT64_FORMAT " B",
                          mb, n_full_recompute, ckpt);
        }
      else
        mem_add_term (dev, "activation checkpoints", bytes, STOW_TIER_DEVICE,
                      "%.4g micro-batches in flight x %" G_GUINT64_FORMAT
                      " layers x s b h elements = %" G_GUINT64_FORMAT " B",
                      mb, n_full_recompute, ckpt);
      /* The rebuilt layer's input is its checkpoint, already counted.
       * Backward reaches the recomputed (first) layers of a stage after it
       * has freed this micro-batch's stored ones, so the rebuilt layer only
       * adds what it exceeds them by (found by the simulator). */
      guint64 rebuilt = full - MIN (ckpt, full);
      rebuilt_extra = rebuilt > stored_bytes ? rebuilt - stored_bytes : 0;
      mem_add_term (
          dev, "recomputed layer", rebuilt_extra, STOW_TIER_DEVICE,
          "one layer's activations rebuilt during backward: %" G_GUINT64_FORMAT
          " B less its checkpoint, less the %" G_GUINT64_FORMAT
          " B of stored layers freed before it",
          full, stored_bytes);
    }
  /* Backward of a layer holds the gradients of its activations while the
   * saved ones are still alive: about one layer's worth. */
  mem_add_term (dev, "backward working set", block, STOW_TIER_DEVICE,
                "gradients of one layer's activations: %" G_GUINT64_FORMAT " B",
                block);
  ms->after_forward = block + rebuilt_extra;

  if (p->first)
    {
      /* int64 token ids and the embedding output for each micro-batch in
       * flight (Megatron's 8 s b p and s b h p terms).  Interleaved: those
       * whose first model chunk is in flight, more than the stage's
       * average (found by the simulator). */
      double mb_in = mb;
      if (l->schedule == STOW_SCHEDULE_INTERLEAVED)
        mb_in = (double)interleaved_chunk_in_flight (l, stage, 0);
      mem_add_term (dev, "input ids and embeddings",
                    stow_mem_round ((double)input * mb_in), STOW_TIER_DEVICE,
                    "%.4g micro-batches x (8 s b + %.0f s b h)", mb_in,
                    stow_mem_residual_bytes (t, l));
    }
  if (p->last && !m->no_lm_head)
    {
      double per = stow_mem_logits_element_bytes (t, l);
      /* GPipe runs every forward before any backward, so the last stage
       * keeps every micro-batch's logits until its backward (found by the
       * simulator); 1F1B's last stage runs each backward right after.
       * Interleaved: those whose last model chunk is in flight. */
      guint64 nlog = l->schedule == STOW_SCHEDULE_GPIPE ? l->grad_accum : 1;
      if (l->schedule == STOW_SCHEDULE_INTERLEAVED)
        nlog = MAX (interleaved_chunk_in_flight (l, stage, l->vpp - 1), 1);
      /* A micro-batch's loss and output layer finish their backward, and
       * free its logits, before its last layer's backward starts; that
       * backward holds the loss gradient (s b h), the rebuilt layer, the
       * working set and a prefetched offloaded checkpoint instead.  The
       * stage's peak has the larger of the two, so this term keeps what
       * the logits add beyond the other. */
      guint64 others = rebuilt_extra + block + ckpt_prefetch;
      guint64 bwd = dh + others;
      guint64 last = lg > bwd ? lg - others : dh;
      ms->after_forward += last;
      if (stow_mem_fused_head_loss (t, l))
        mem_add_term (
            dev, "logits and loss", (nlog - 1) * lg + last, STOW_TIER_DEVICE,
            "%" G_GUINT64_FORMAT " micro-batches x %" G_GUINT64_FORMAT
            " B (the fused loss's chunk: 4 B x %" G_GUINT64_FORMAT
            " tokens x (V / tp + 2 h)), the last only beyond its "
            "backward's %" G_GUINT64_FORMAT " B: max(%" G_GUINT64_FORMAT
            ", %" G_GUINT64_FORMAT ") - %" G_GUINT64_FORMAT,
            nlog, lg,
            stow_loss_chunk_tokens (
                m->vocab / l->tp,
                stow_mem_round ((double)stow_mem_decoder_seq (m, t) / l->cp
                                * (double)l->micro_batch)),
            bwd, lg, bwd, others);
      else
        mem_add_term (dev, "logits and loss", (nlog - 1) * lg + last,
                      STOW_TIER_DEVICE,
                      "%" G_GUINT64_FORMAT " micro-batches x %" G_GUINT64_FORMAT
                      " B (%.4g B x s b V / tp%s), the last only beyond its "
                      "backward's %" G_GUINT64_FORMAT
                      " B (loss gradient, rebuilt layer, working set, "
                      "prefetched checkpoint): max(%" G_GUINT64_FORMAT
                      ", %" G_GUINT64_FORMAT ") - %" G_GUINT64_FORMAT,
                      nlog, lg, per,
                      t->chunked_loss ? ", chunked loss"
                      : t->fused_loss ? ", fused loss"
                                      : "",
                      bwd, lg, bwd, others);
    }
  if (stow_mem_autocast (t, l) && t->finetune == STOW_FINETUNE_FULL)
    mem_add_term (
        dev, "autocast weight copies", 2 * p->params, STOW_TIER_DEVICE,
        "2 B x %" G_GUINT64_FORMAT " params: 16-bit casts saved for backward",
        p->params);
}

/* Gradients freed between steps (zero_grad(set_to_none=True), PyTorch's
 * default since 2.0): with one micro-batch per step, backward frees each
 * layer's activations as it creates that layer's gradients, so the peak
 * holds max(A, G) of the two, not A + G.  The "gradients" term keeps only
 * what G adds beyond the activations it replaces. */
static gboolean
frees_gradients (const Model *ms)
{
  const StowLayout *l = ms->l;
  gboolean enabled
      = ms->o->free_grads >= 0 ? ms->o->free_grads : ms->es->frees_gradients;
  return enabled && l->grad_accum <= 1 && !ms->t->optimizer_in_backward;
}

static void
free_gradients (Model *ms, GArray *dev)
{
  if (!frees_gradients (ms))
    return;
  if (is_sink (dev))
    {
      /* the gradient terms are all on the device */
      guint64 cut = MIN (g_array_index (dev, guint64, SINK_ACTS),
                         g_array_index (dev, guint64, SINK_GRADS));
      g_array_index (dev, guint64, STOW_TIER_DEVICE) -= cut;
      return;
    }
  guint64 acts = 0, grads = 0;
  for (guint i = 0; i < dev->len; i++)
    {
      StowMemTerm *t = &g_array_index (dev, StowMemTerm, i);
      if (named (t->name, act_names, G_N_ELEMENTS (act_names)))
        acts += t->bytes;
      else if (named (t->name, grad_names, G_N_ELEMENTS (grad_names)))
        grads += t->bytes;
    }
  /* Take the activations' share off the gradient terms, in order. */
  guint64 cut = MIN (acts, grads);
  for (guint i = 0; i < dev->len && grads > 0; i++)
    {
      StowMemTerm *t = &g_array_index (dev, StowMemTerm, i);
      if (!named (t->name, grad_names, G_N_ELEMENTS (grad_names)))
        continue;
      guint64 take = MIN (cut, t->bytes);
      char *formula = g_strdup_printf (
          "%s; freed between steps, so backward trades them for "
          "activations: max(A, G) - A with G = %" G_GUINT64_FORMAT
          " B, A = %" G_GUINT64_FORMAT " B",
          t->formula, grads, acts);
      g_free (t->formula);
      t->formula = formula;
      t->bytes -= take;
      cut -= take;
    }
}

/* Communication buckets and gathered parameters: the engine's buffers. */
static void
engine_buffers (Model *ms, const StageParams *p, GArray *dev)
{
  const StowLayout *l = ms->l;
  const StowModel *m = ms->m;
  guint64 N = p->params;
  gboolean multi = ms->n > 1;
  Bpp b = ms->bpp;
  guint64 slots = MIN (2, MAX (p->layers, 1));

  switch (l->engine)
    {
    case STOW_ENGINE_DEEPSPEED:
      {
        /* DeepSpeed allocates its reduce bucket at the full
         * reduce_bucket_size, in the parameters' dtype, whatever the
         * model's size (stage_1_and_2.py ipg_buffer, stage3.py
         * __ipg_bucket_flat_buffer): PEFT's T0_3B LoRA run holds 1,916 MiB
         * before training, 5e8 fp32 elements being 1,907 MiB.  Stages 1
         * and 2 double it with overlap_comm; stage 3 keeps one. */
        double wb = deepspeed_weight_bytes (ms->t, b);
        gboolean overlap = ms->o->overlap_comm > 0;
        guint64 nreduce = l->zero <= 2 && overlap ? 2 : 1;
        guint64 reduce = ms->o->reduce_bucket_elements;
        if (l->zero >= 1)
          mem_add_term (dev, "reduce buckets",
                        stow_bytes (nreduce * reduce, wb), STOW_TIER_DEVICE,
                        "%" G_GUINT64_FORMAT
                        " x reduce_bucket_size %" G_GUINT64_FORMAT
                        " elements x %.4g B",
                        nreduce, reduce, wb);
        if (l->zero >= 3)
          {
            /* At the turn from forward to backward: the parameters the
             * coordinator does not release because backward reuses them
             * within stage3_max_reuse_distance elements of trace
             * (partitioned_param_coordinator.py __params_to_release).  A
             * module followed by F elements of forward comes back after
             * about 2 F, so the forward's last half of the distance stays,
             * give or take the module at the edge; the output layer, whose
             * backward comes next, stays whatever its size.  The prefetch
             * bucket is gathered beyond them. */
            guint64 turn = (m->no_lm_head ? m->largest_module_params
                                          : m->vocab * m->hidden)
                           / l->tp;
            guint64 prefetch = ms->o->prefetch_bucket_elements;
            guint64 reuse = ms->o->reuse_distance_elements / 2;
            guint64 live = MIN (N, MAX (reuse, turn) + prefetch);
            mem_add_term (
                dev, "gathered parameters", stow_bytes (live, wb),
                STOW_TIER_DEVICE,
                "%.4g B x min(%" G_GUINT64_FORMAT
                " params, max(stage3_max_reuse_distance / 2 %" G_GUINT64_FORMAT
                ", output layer %" G_GUINT64_FORMAT
                ") + prefetch bucket %" G_GUINT64_FORMAT ")",
                wb, N, reuse, turn, prefetch);
            /* Gathering leaves a transient copy: a prefetched group is
             * gathered into one flat buffer, then each parameter is cut out
             * of it with torch.cat while the buffer lives
             * (AllGatherCoalescedHandle.wait), up to the prefetch bucket.
             * Offloaded, a partition is also copied to the device before
             * it is gathered (all_gather_coalesced's ds_tensor.to(device)):
             * fetching the output layer at the end of the forward holds its
             * partition twice, before the logits and the backward's
             * buffers exist. */
            guint64 copy = stow_bytes (prefetch, wb), extra = 0;
            guint64 staged = stow_bytes (div_ceil (turn, ms->n), wb);
            if (l->offload_params != STOW_OFFLOAD_NONE
                && staged > ms->after_forward)
              extra = staged - ms->after_forward;
            if (l->offload_params != STOW_OFFLOAD_NONE)
              mem_add_term (dev, "gather transients", MAX (copy, extra),
                            STOW_TIER_DEVICE,
                            "max(%" G_GUINT64_FORMAT
                            " B: the prefetch bucket cut out of its flat "
                            "buffer, %" G_GUINT64_FORMAT
                            " B: the output layer's partition staged on the "
                            "device, less the %" G_GUINT64_FORMAT
                            " B that exist only after the forward)",
                            copy, staged, ms->after_forward);
            else
              mem_add_term (dev, "gather transients", copy, STOW_TIER_DEVICE,
                            "prefetch bucket %" G_GUINT64_FORMAT
                            " x %.4g B cut out of its flat buffer",
                            prefetch, wb);
          }
        break;
      }
    case STOW_ENGINE_FSDP:
    case STOW_ENGINE_STOWAGE:
      {
        /* What passes through the two slots: every unit, or with every
         * layer of the stage resident, only the embedding and output
         * layer. */
        guint64 slot_unit = ms->es->unit_slots ? p->max_unit : p->max_layer;
        double gw = stow_mem_gathered_weight_bytes (ms->t, b.w);
        if (l->engine == STOW_ENGINE_STOWAGE
            && l->offload_params != STOW_OFFLOAD_NONE
            && l->resident_layers != STOW_RESIDENT_AUTO
            && l->resident_layers >= p->layers)
          slot_unit = p->max_end;
        if (l->engine == STOW_ENGINE_STOWAGE
            && l->offload_params != STOW_OFFLOAD_NONE
            && l->resident_layers != STOW_RESIDENT_AUTO
            && l->resident_layers > 0)
          {
            /* Streamed layers kept on the device, as the plan decided them
             * (planner/resident.c): each a whole layer in compute
             * precision. */
            guint64 k = MIN ((guint64)l->resident_layers, p->layers);
            mem_add_term (dev, "resident layers",
                          k * stow_bytes (p->max_layer, gw), STOW_TIER_DEVICE,
                          "%" G_GUINT64_FORMAT
                          " layers x %.4g B x %" G_GUINT64_FORMAT
                          " params kept on the device",
                          k, gw, p->max_layer);
          }
        if (l->zero >= 3)
          /* The layer in use and the one prefetched, gathered (or, with
           * parameter offload, streamed) in compute precision. */
          mem_add_term (dev, "gathered parameters",
                        slots * stow_bytes (slot_unit, gw), STOW_TIER_DEVICE,
                        "%" G_GUINT64_FORMAT
                        " layers x %.4g B x %" G_GUINT64_FORMAT
                        " params (in use and prefetched)",
                        slots, gw, slot_unit);
        else if (l->engine == STOW_ENGINE_FSDP && l->zero == 2)
          mem_add_term (dev, "unsharded parameters", 2 * N, STOW_TIER_DEVICE,
                        "2 B x %" G_GUINT64_FORMAT
                        " params kept between forward and backward",
                        N);
        if (l->zero < 2 && multi && !ranks_reduce_each_micro_batch (ms))
          mem_add_term (dev, "gradient buckets", 2 * 25 * MiB, STOW_TIER_DEVICE,
                        "2 x bucket_cap_mb 25 MiB");
        break;
      }
    case STOW_ENGINE_MEGATRON:
      /* The fp32 main-grad buffer is the bucket; nothing more. */
      break;
    case STOW_ENGINE_NEMO:
      /* Distributed Adam's buckets are views of its contiguous grad and
       * param buffers; their reduce-scattered shards are the "gradient
       * shards" term. */
      break;
    case STOW_ENGINE_PYTORCH:
      break;
    }
}

static guint
communicators (const StowLayout *l)
{
  /* Megatron-core builds the experts' tensor-parallel group apart from
   * the attention's when --etp differs from --tp. */
  guint etp = stow_layout_etp (l);
  return (l->dp > 1) + (l->tp > 1) + (l->pp > 1) + (l->cp > 1) + (l->ep > 1)
         + (etp > 1 && etp != l->tp);
}

static void
overheads (Model *ms, StowStageMemory *s)
{
  const StowMemOptions *o = ms->o;
  guint64 allocated = stow_mem_sum (s->terms, STOW_TIER_DEVICE);
  guint64 frag = stow_bytes (allocated, o->fragmentation);
  s->allocated_bytes = allocated;
  s->reserved_bytes = allocated + frag;
  mem_add_term (s->terms, "allocator fragmentation", frag, STOW_TIER_DEVICE,
                "%.3g x %" G_GUINT64_FORMAT " B allocated "
                "(reserved but unallocated)",
                o->fragmentation, allocated);
  mem_add_term (s->terms, "cuda context", o->cuda_context_bytes,
                STOW_TIER_DEVICE, "per process (lazy module loading)");
  mem_add_term (s->terms, "library workspaces", o->workspace_bytes,
                STOW_TIER_DEVICE, "cuBLAS / cuBLASLt");
  guint groups = communicators (ms->l);
  mem_add_term (s->terms, "nccl buffers",
                (guint64)groups * o->nccl_bytes_per_group, STOW_TIER_DEVICE,
                "%u communicators x %" G_GUINT64_FORMAT " B", groups,
                o->nccl_bytes_per_group);
}

static void
model_init (Model *ms, const StowModel *m, const StowCluster *c,
            const StowTraining *t, const StowLayout *l, const StowMemOptions *o,
            const LayerTable *lt)
{
  memset (ms, 0, sizeof *ms);
  ms->m = m, ms->c = c, ms->t = t, ms->l = l, ms->o = o, ms->lt = lt;
  ms->n = shard_degree (l, c);
  layer_sizes_init (&ms->sizes, m, t, l);
  ms->bpp = full_bpp (m, t);
  ms->es = engine_states_of (l->engine);
  ms->eng_bpp = engine_bpp (m, t, l, &ms->full_grads, &ms->dfa);
}

static StowMemory *
estimate_stowage (const StowModel *m, const StowCluster *c,
                  const StowTraining *t, const StowLayout *l,
                  const StowMemOptions *o)
{
  StowMemory *mem = stow_memory_alloc (l->pp);
  g_autofree guint64 *counts = g_new0 (guint64, l->pp);
  guint64 first = 0, worst = 0;
  guint worst_stage = 0;
  LayerTable lt;
  layer_table_init (&lt, m);
  Model ms;
  model_init (&ms, m, c, t, l, o, &lt);

  stow_layout_stage_layers (l, m->n_layers, counts);
  /* Host and NVMe are charged per GPU for the stage holding the most
   * parameters, then multiplied by the GPUs of a node. */
  for (guint s = 0; s < l->pp; s++)
    {
      StageParams p = stage_params (&lt, t, l, o, s, first, counts[s]);
      if (p.params > worst)
        worst = p.params, worst_stage = s;
      first += counts[s];
    }
  first = 0;
  g_autoptr (GArray) host = stow_mem_terms_new ();
  g_autoptr (GArray) nvme = stow_mem_terms_new ();
  for (guint s = 0; s < l->pp; s++)
    {
      StowStageMemory *st = &mem->stages[s];
      StageParams p = stage_params (&lt, t, l, o, s, first, counts[s]);
      gboolean charge = s == worst_stage;
      ms.host = host;
      ms.nvme = nvme;
      st->layers = counts[s];
      st->params = p.params;
      model_states (&ms, &p, st->terms, charge);
      activations (&ms, &p, s, st->terms, charge);
      free_gradients (&ms, st->terms);
      engine_buffers (&ms, &p, st->terms);
      overheads (&ms, st);
      first += counts[s];
    }

  /* Per node: each of its GPUs' host and NVMe terms, plus each rank's
   * process. */
  guint g = c->node.gpus_per_node ? c->node.gpus_per_node : 1;
  for (guint i = 0; i < host->len; i++)
    {
      StowMemTerm *h = &g_array_index (host, StowMemTerm, i);
      mem_add_term (mem->host_terms, h->name, h->bytes * g, h->tier,
                    "%u GPUs x (%s)", g, h->formula);
    }
  mem_add_term (mem->host_terms, "framework processes",
                o->host_process_bytes * g, STOW_TIER_HOST,
                "%u ranks x %" G_GUINT64_FORMAT " B", g, o->host_process_bytes);
  for (guint i = 0; i < nvme->len; i++)
    {
      StowMemTerm *n = &g_array_index (nvme, StowMemTerm, i);
      mem_add_term (mem->nvme_terms, n->name, n->bytes * g, n->tier,
                    "%u GPUs x (%s)", g, n->formula);
    }
  stow_memory_finish (mem, c, o);
  layer_table_clear (&lt);
  return mem;
}

/* The totals of estimate_stowage without its terms: the same functions
 * write into sinks (tier sums).  A stage that repeats the one before it
 * (same layer count and parameters, neither first nor last) never holds
 * more, since the micro-batches in flight do not grow with the stage index
 * (in_flight), so only the first stage of each run of stages is evaluated;
 * the scratch keeps the sinks and the model's layer table (LayerTable). */
struct _StowMemScratch
{
  GArray *dev, *host, *nvme;
  LayerTable lt; /* lt.m NULL: made without a model */
};

StowMemScratch *
stow_mem_scratch_new (const StowModel *m)
{
  StowMemScratch *s = g_new0 (StowMemScratch, 1);
  s->dev = stow_mem_sink_new ();
  s->host = stow_mem_sink_new ();
  s->nvme = stow_mem_sink_new ();
  if (m != NULL)
    layer_table_init (&s->lt, m);
  return s;
}

void
stow_mem_scratch_free (StowMemScratch *s)
{
  if (s == NULL)
    return;
  g_array_unref (s->dev);
  g_array_unref (s->host);
  g_array_unref (s->nvme);
  layer_table_clear (&s->lt);
  g_free (s);
}

static void
estimate_stowage_totals (const StowModel *m, const StowCluster *c,
                         const StowTraining *t, const StowLayout *l,
                         const StowMemOptions *o, StowMemScratch *scratch,
                         StowMemTotals *out)
{
  guint64 counts_stack[256];
  g_autofree guint64 *counts_heap = NULL;
  guint64 *counts = counts_stack;
  guint64 first = 0, worst = 0;
  guint worst_stage = 0;
  Model ms;
  model_init (&ms, m, c, t, l, o, &scratch->lt);

  if (l->pp > G_N_ELEMENTS (counts_stack))
    counts = counts_heap = g_new0 (guint64, l->pp);
  stow_layout_stage_layers (l, m->n_layers, counts);
  /* The stages to evaluate, each with its parameters and whether it
   * repeats the stage before it (the same layer count and parameters). */
  typedef struct
  {
    guint stage;
    gboolean same_as_before;
    StageParams p;
  } Eval;
  Eval eval_stack[256];
  g_autofree Eval *eval_heap = NULL;
  Eval *eval = eval_stack;
  guint n_eval = 0;
  if (l->pp > G_N_ELEMENTS (eval_stack))
    eval = eval_heap = g_new0 (Eval, l->pp);
  /* The run holding the first layer of the last stage whose parameters
   * were counted. */
  const LayerRun *run = NULL;
  for (guint s = 0; s < l->pp; s++)
    {
      /* A middle stage as long as the one before it, both inside one run
       * of identical layers, holds what that one holds: a repeat, which
       * is neither counted nor evaluated. */
      if (s > 1 && s + 1 < l->pp && counts[s] > 0 && counts[s] == counts[s - 1]
          && first + counts[s] <= run->first + run->count)
        {
          first += counts[s];
          continue;
        }
      Eval *e = &eval[n_eval++];
      const StageParams *before = n_eval > 1 ? &eval[n_eval - 2].p : NULL;
      e->stage = s;
      e->p = stage_params (&scratch->lt, t, l, o, s, first, counts[s]);
      e->same_as_before = s > 0 && s + 1 < l->pp && counts[s] == counts[s - 1]
                          && e->p.params == before->params
                          && e->p.experts == before->experts
                          && e->p.max_layer == before->max_layer
                          && e->p.linear == before->linear;
      run = counts[s] > 0 ? layer_run_at (&scratch->lt, first) : NULL;
      if (e->p.params > worst)
        worst = e->p.params, worst_stage = s;
      first += counts[s];
    }
  GArray *dev = scratch->dev, *host = scratch->host, *nvme = scratch->nvme;
  sink_clear (host, FALSE);
  sink_clear (nvme, FALSE);
  memset (out, 0, sizeof *out);
  ms.host = host;
  ms.nvme = nvme;
  gboolean classify = frees_gradients (&ms);
  for (guint i = 0; i < n_eval; i++)
    {
      guint s = eval[i].stage;
      const StageParams *p = &eval[i].p;
      if (eval[i].same_as_before && s != worst_stage)
        continue;
      StowStageMemory st = { 0 };
      sink_clear (dev, classify);
      st.terms = dev;
      model_states (&ms, p, dev, s == worst_stage);
      activations (&ms, p, s, dev, s == worst_stage);
      free_gradients (&ms, dev);
      engine_buffers (&ms, p, dev);
      overheads (&ms, &st);
      guint64 total = stow_mem_sum (dev, STOW_TIER_DEVICE);
      if (s == 0 || total > out->total_bytes)
        {
          out->total_bytes = total;
          out->allocated_peak_bytes = MIN (st.allocated_bytes, total);
          out->peak_stage = s;
        }
    }
  guint g = c->node.gpus_per_node ? c->node.gpus_per_node : 1;
  out->host_total_bytes
      = g
        * (stow_mem_sum (host, STOW_TIER_PINNED)
           + stow_mem_sum (host, STOW_TIER_HOST) + o->host_process_bytes);
  out->nvme_bytes = g * stow_mem_sum (nvme, -1);
  guint64 cap = c->node.gpu.total_bytes;
  out->capacity_bytes
      = cap > o->safety_margin_bytes ? cap - o->safety_margin_bytes : 0;
  out->host_capacity_bytes = c->node.host_ram_bytes;
  for (guint i = 0; i < c->node.n_nvme; i++)
    out->nvme_capacity_bytes += c->node.nvme[i].capacity_bytes;
  out->fits_device = out->total_bytes <= out->capacity_bytes;
  out->fits_host = out->host_capacity_bytes == 0
                   || out->host_total_bytes <= out->host_capacity_bytes;
  out->fits_nvme
      = out->nvme_bytes == 0 || out->nvme_bytes <= out->nvme_capacity_bytes;
  out->fits = out->fits_device && out->fits_host && out->fits_nvme;
}

gboolean
stow_mem_estimate_totals (const StowModel *m, const StowCluster *c,
                          const StowTraining *t, const StowLayout *l,
                          const StowMemOptions *o, StowMemScratch *scratch,
                          StowMemTotals *out, GError **error)
{
  StowMemOptions defaults;
  g_return_val_if_fail (c != NULL && t != NULL && l != NULL && out != NULL,
                        FALSE);
  if (o == NULL)
    {
      stow_mem_options_init (&defaults);
      o = &defaults;
    }
  if (o->convention != STOW_CONVENTION_STOWAGE || m == NULL)
    {
      /* Peer conventions are single formulas: the full path is cheap. */
      g_autoptr (StowMemory) mem = stow_mem_estimate (m, c, t, l, o, error);
      if (mem == NULL)
        return FALSE;
      out->total_bytes = mem->total_bytes;
      out->allocated_peak_bytes = mem->allocated_peak_bytes;
      out->capacity_bytes = mem->capacity_bytes;
      out->peak_stage = mem->peak_stage;
      out->host_total_bytes = mem->host_total_bytes;
      out->host_capacity_bytes = mem->host_capacity_bytes;
      out->nvme_bytes = mem->nvme_bytes;
      out->nvme_capacity_bytes = mem->nvme_capacity_bytes;
      out->fits_device = mem->fits_device;
      out->fits_host = mem->fits_host;
      out->fits_nvme = mem->fits_nvme;
      out->fits = mem->fits;
      return TRUE;
    }
  g_return_val_if_fail (scratch == NULL || scratch->lt.m == m, FALSE);
  if (!stow_layout_validate (l, t, m, c, error))
    return FALSE;
  if (scratch != NULL)
    estimate_stowage_totals (m, c, t, l, o, scratch, out);
  else
    {
      g_autoptr (StowMemScratch) own = stow_mem_scratch_new (m);
      estimate_stowage_totals (m, c, t, l, o, own, out);
    }
  return TRUE;
}

StowMemory *
stow_mem_estimate (const StowModel *m, const StowCluster *c,
                   const StowTraining *t, const StowLayout *l,
                   const StowMemOptions *o, GError **error)
{
  StowMemOptions defaults;
  g_return_val_if_fail (c != NULL && t != NULL && l != NULL, NULL);
  if (o == NULL)
    {
      stow_mem_options_init (&defaults);
      o = &defaults;
    }
  if (o->convention != STOW_CONVENTION_STOWAGE)
    return stow_memory_estimate_convention (m, c, t, l, o, error);
  if (m == NULL)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--params stands in for a model only under a peer "
                   "--convention; stowage's own model needs the architecture");
      return NULL;
    }
  if (!stow_layout_validate (l, t, m, c, error))
    return NULL;
  return estimate_stowage (m, c, t, l, o);
}

gboolean
stow_memory_estimate_totals (const StowPlan *p, StowMemScratch *scratch,
                             StowMemTotals *out, GError **error)
{
  g_return_val_if_fail (p != NULL, FALSE);
  return stow_mem_estimate_totals (p->model, p->cluster, &p->training,
                                   &p->layout, &p->mem, scratch, out, error);
}

StowMemory *
stow_memory_estimate (const StowPlan *p, GError **error)
{
  g_return_val_if_fail (p != NULL, NULL);
  return stow_mem_estimate (p->model, p->cluster, &p->training, &p->layout,
                            &p->mem, error);
}

/* ---- exports for the step program (memory-private.h) ------------------- */

StowStageParams
stow_mem_stage_params (const StowModel *m, const StowTraining *t,
                       const StowLayout *l, const StowMemOptions *o,
                       guint stage, guint64 first_layer, guint64 n_layers)
{
  LayerTable lt;
  layer_table_init (&lt, m);
  StageParams p = stage_params (&lt, t, l, o, stage, first_layer, n_layers);
  layer_table_clear (&lt);
  return p;
}

guint64
stow_mem_largest_layer_params_on_gpu (const StowModel *m, const StowLayout *l,
                                      StowMemScratch *scratch)
{
  if (scratch != NULL && scratch->lt.m == m)
    return largest_layer_on_gpu (&scratch->lt, l);
  LayerTable lt;
  layer_table_init (&lt, m);
  guint64 most = largest_layer_on_gpu (&lt, l);
  layer_table_clear (&lt);
  return most;
}

guint64
stow_mem_shard_degree (const StowLayout *l, const StowCluster *c)
{
  return shard_degree (l, c);
}

guint64
stow_mem_sharded_params (const StowLayout *l, guint64 params, guint64 experts,
                         guint64 n)
{
  return sharded_params (l, params, experts, n);
}

guint64
stow_mem_frozen_linear_bytes (const StowLayout *l, guint64 linear,
                              guint64 experts, double wb, guint64 wdiv)
{
  guint64 ediv = wdiv > 1 ? stow_layout_expert_dp (l, wdiv) : 1;
  return stow_bytes (linear - experts, wb) / wdiv
         + stow_bytes (experts, wb) / ediv;
}

void
stow_mem_state_bytes (const StowModel *m, const StowTraining *t, double *w,
                      double *g, double *master, double *opt)
{
  Bpp b = full_bpp (m, t);
  *w = b.w, *g = b.g, *master = b.master, *opt = b.opt;
}

void
stow_mem_engine_state_bytes (const StowModel *m, const StowTraining *t,
                             const StowLayout *l, double *w, double *g,
                             double *master, double *opt)
{
  gboolean full_grads, dfa;
  Bpp b = engine_bpp (m, t, l, &full_grads, &dfa);
  *w = b.w, *g = b.g, *master = b.master, *opt = b.opt;
}
