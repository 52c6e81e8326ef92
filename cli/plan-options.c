/* SPDX-License-Identifier: MIT
 *
 * cli/plan-options.c: parsing the planner's flags.
 */
#include "cli/plan-options.h"

#include <math.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/units.h"

#define STR(name, var, desc, arg)                                              \
  {                                                                            \
    name, 0, 0, G_OPTION_ARG_STRING, &po->var, desc, arg                       \
  }

/* ---- the optimizer settings ---------------------------------------------
 */

#define OPT(name, var, desc, arg)                                              \
  {                                                                            \
    name, 0, 0, G_OPTION_ARG_STRING, &f->var, desc, arg                        \
  }

void
stow_optim_flags_add (StowCliCall *call, GOptionContext *ctx, StowOptimFlags *f)
{
  /* The defaults are stow_optim_settings_init's (core/optim.h). */
  const GOptionEntry entries[] = {
    OPT ("lr", lr, "Peak learning rate (default 1e-3, torch AdamW's)", "X"),
    OPT ("min-lr", min_lr,
         "Learning rate at the last step for cosine and linear (default 0)",
         "X"),
    OPT ("warmup", warmup,
         "Steps of linear warmup, step k at lr k/N (default 0)", "N"),
    OPT ("lr-schedule", lr_schedule,
         "constant (default), cosine or linear: after the warmup, from --lr "
         "to --min-lr at the last step (--steps)",
         "S"),
    OPT ("weight-decay", weight_decay,
         "AdamW's decoupled weight decay (default 0.01)", "W"),
    OPT ("weight-decay-on", weight_decay_on,
         "matrices (default: tensors of 2+ dimensions, not norms or biases, "
         "as Megatron-LM) or all",
         "WHICH"),
    OPT ("beta1", beta1, "Adam's beta1 (default 0.9)", "B1"),
    OPT ("beta2", beta2, "Adam's beta2 (default 0.999)", "B2"),
    OPT ("eps", eps, "Adam's epsilon (default 1e-8)", "E"),
    OPT ("max-grad-norm", max_grad_norm,
         "Clip by the global L2 norm (default 1.0; 0: no clipping)", "C"),
    OPT ("steps", steps,
         "Optimizer steps of the run, where cosine and linear end (train, "
         "cosine and linear need it; with --resume, counted from the run's "
         "start)",
         "N"),
    { NULL },
  };
  stow_cli_add_entries (call, ctx, entries);
}

/* A finite number of at least @lo, or FALSE naming the flag. */
static gboolean
parse_number_flag (const char *flag, const char *v, double lo, double *out,
                   GError **error)
{
  if (v == NULL)
    return TRUE;
  char *end = NULL;
  double x = g_ascii_strtod (v, &end);
  if (end == v || *end != '\0' || !isfinite (x) || x < lo)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "%s \"%s\": expected a number >= %g", flag, v, lo);
      return FALSE;
    }
  *out = x;
  return TRUE;
}

/* A count (of at least 1 unless @zero_ok), or FALSE naming the flag. */
static gboolean
parse_steps_flag (const char *flag, const char *v, gboolean zero_ok,
                  guint64 *out, GError **error)
{
  if (v == NULL)
    return TRUE;
  guint64 n = 0;
  if (!stow_parse_count (v, &n, NULL) || (n == 0 && !zero_ok))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "%s \"%s\": expected a count%s", flag, v,
                   zero_ok ? "" : " of at least 1");
      return FALSE;
    }
  *out = n;
  return TRUE;
}

gboolean
stow_optim_flags_apply (const StowOptimFlags *f, StowOptimSettings *o,
                        GError **error)
{
  if (!parse_number_flag ("--lr", f->lr, 0, &o->lr, error)
      || !parse_number_flag ("--min-lr", f->min_lr, 0, &o->min_lr, error)
      || !parse_steps_flag ("--warmup", f->warmup, TRUE, &o->warmup_steps,
                            error)
      || !parse_number_flag ("--weight-decay", f->weight_decay, 0,
                             &o->weight_decay, error)
      || !parse_number_flag ("--beta1", f->beta1, 0, &o->beta1, error)
      || !parse_number_flag ("--beta2", f->beta2, 0, &o->beta2, error)
      || !parse_number_flag ("--eps", f->eps, 0, &o->eps, error)
      || !parse_number_flag ("--max-grad-norm", f->max_grad_norm, 0,
                             &o->max_grad_norm, error)
      || !parse_steps_flag ("--steps", f->steps, FALSE, &o->total_steps, error))
    return FALSE;
  if (f->lr_schedule
      && !stow_lr_schedule_parse (f->lr_schedule, &o->schedule, error))
    return FALSE;
  if (f->weight_decay_on
      && !stow_decay_scope_parse (f->weight_decay_on, &o->decay_on, error))
    return FALSE;
  return stow_optim_settings_check (o, error);
}

void
stow_optim_flags_clear (StowOptimFlags *f)
{
  char **strings[]
      = { &f->lr,           &f->min_lr,          &f->warmup, &f->lr_schedule,
          &f->weight_decay, &f->weight_decay_on, &f->beta1,  &f->beta2,
          &f->eps,          &f->max_grad_norm,   &f->steps };
  for (gsize i = 0; i < G_N_ELEMENTS (strings); i++)
    g_clear_pointer (strings[i], g_free);
}

/* ---- the planner's flags --------------------------------------------------
 */

void
stow_plan_options_add (GOptionContext *ctx, StowPlanOptions *po)
{
  const GOptionEntry entries[] = {
    STR ("revision", revision,
         "With a Hub id (ORG/NAME): the branch, tag or commit (default "
         "main)",
         "REV"),
    STR ("gpus", gpus, "GPUs: 8xA100-80GB, 64xH100-SXM, 4x8xH200, local",
         "SPEC"),
    STR ("cluster", cluster, "A cluster.json instead of --gpus", "FILE"),
    STR ("host-ram", host_ram,
         "Host RAM per node (default: the node preset's, which the output "
         "names)",
         "SIZE"),
    STR ("nvme", nvme,
         "NVMe drives per node: none, SIZE (one drive) or COUNTxSIZE "
         "(2x3.84TB); default: the node preset's",
         "DRIVES"),
    STR ("dp", dp, "Data-parallel degree (default: the GPUs left)", "N"),
    STR ("tp", tp, "Tensor-parallel degree", "N"),
    STR ("pp", pp, "Pipeline stages", "N"),
    STR ("vpp", vpp, "Virtual stages per pipeline rank (interleaving)", "N"),
    STR ("cp", cp, "Context-parallel degree", "N"),
    STR ("ep", ep, "Expert-parallel degree", "N"),
    STR ("etp", etp,
         "Expert tensor-parallel degree: the routed experts' TP (Megatron-"
         "core's --expert-tensor-parallel-size; default: --tp)",
         "N"),
    { "sp", 0, 0, G_OPTION_ARG_NONE, &po->sp,
      "Sequence parallelism (default with --tp > 1)", NULL },
    { "no-sp", 0, 0, G_OPTION_ARG_NONE, &po->no_sp, "No sequence parallelism",
      NULL },
    { "pp-split-ends", 0, 0, G_OPTION_ARG_NONE, &po->pp_split_ends,
      "The embedding and the loss each take a layer's place in the pipeline "
      "split (Megatron-core's --account-for-embedding-in-pipeline-split and "
      "--account-for-loss-in-pipeline-split); lets --vpp interleave layers "
      "that --pp alone does not divide",
      NULL },
    STR ("zero", zero, "ZeRO stage 0-3 or FULL_SHARD, SHARD_GRAD_OP, ...",
         "STAGE"),
    STR ("offload-optimizer", offload_optimizer, "none, cpu or nvme", "WHERE"),
    STR ("offload-params", offload_params, "none, cpu or nvme (ZeRO 3)",
         "WHERE"),
    STR ("offload-activations", offload_activations,
         "none or cpu (checkpoints)", "WHERE"),
    STR ("resident-layers", resident_layers,
         "With --offload-params: streamed layers kept on the GPU (default: "
         "as many as the budget leaves room for)",
         "N"),
    STR ("recompute", recompute,
         "none, selective, full, full:K or selective-op", "MODE"),
    STR ("micro-batch", micro_batch, "Sequences per micro-batch", "N"),
    STR ("global-batch", global_batch, "Sequences per optimizer step", "N"),
    STR ("grad-accum", grad_accum, "Micro-batches per step per replica", "N"),
    STR ("seq", seq, "Sequence length in tokens (2048, 4k, 128k)", "TOKENS"),
    STR ("decoder-seq", decoder_seq,
         "Encoder-decoder models: the decoder's (target) length in tokens "
         "(default: --seq)",
         "TOKENS"),
    STR ("precision", precision,
         "fp32, fp16, bf16 (default, fp16 on GPUs without bf16; fp32 master "
         "weights), fp8 (GPUs with fp8 tensor cores) or bf16-pure (no master "
         "copy, bf16 optimizer states)",
         "P"),
    STR ("optimizer", optimizer, "adamw, adamw-8bit, sgd, adafactor, lion",
         "OPT"),
    STR ("finetune", finetune, "full, lora or qlora", "MODE"),
    STR ("lora-rank", lora_rank, "LoRA rank (default 8)", "R"),
    STR ("lora-targets", lora_targets,
         "Comma-separated modules LoRA adapts: q,k,v,o,gate,up,down or all "
         "(default q,v)",
         "LIST"),
    STR ("engine", engine, "stowage, pytorch, deepspeed, megatron, fsdp, nemo",
         "ENGINE"),
    STR ("schedule", schedule, "1f1b, interleaved or gpipe", "S"),
    { "no-flash", 0, 0, G_OPTION_ARG_NONE, &po->no_flash,
      "Attention without flash/SDPA kernels (s^2 scores kept)", NULL },
    { "chunked-loss", 0, 0, G_OPTION_ARG_NONE, &po->chunked_loss,
      "Cross-entropy in chunks (no full fp32 logits)", NULL },
    { "fused-loss", 0, 0, G_OPTION_ARG_NONE, &po->fused_loss,
      "Cross-entropy as one kernel over the 16-bit logits (flash-attn's, "
      "llm-foundry's default): no fp32 copy",
      NULL },
    { "dropout", 0, 0, G_OPTION_ARG_NONE, &po->dropout,
      "Keep dropout masks (1 byte per element)", NULL },
    { "lora-dropout", 0, 0, G_OPTION_ARG_NONE, &po->lora_dropout,
      "LoRA adapters drop out their input (PEFT lora_dropout > 0)", NULL },
    STR ("convention", convention,
         "stowage (default), zero-paper, "
         "deepspeed-estimator, deepspeed-estimator-docs, megatron-theoretical",
         "NAME"),
    STR ("params", params,
         "Parameter count standing in for a model under a "
         "peer convention (7.5B)",
         "N"),
    STR ("largest-layer", largest_layer, "DeepSpeed's largest layer (ZeRO-3)",
         "N"),
    STR ("zero-init", zero_init, "DeepSpeed estimator: 0 or 1 (default 1)",
         "0|1"),
    STR ("context-memory", context, "CUDA context per GPU (default 512MiB)",
         "SIZE"),
    STR ("fragmentation", fragmentation,
         "Allocator slack as a fraction of the peak (default 0.05)", "F"),
    STR ("nccl-reserve", nccl, "NCCL buffers per communicator (256MiB)",
         "SIZE"),
    STR ("safety-margin", margin, "Keep this much of each GPU free (0)",
         "SIZE"),
    STR ("workspace-memory", workspace,
         "cuBLAS/cuBLASLt workspaces per GPU (default 64MiB)", "SIZE"),
    STR ("host-process-memory", host_process,
         "Host RAM of each rank's own process (default 3GiB)", "SIZE"),
    STR ("cpu-optimizer-buffers", cpu_opt_buffers,
         "DeepSpeed's CPU optimizer pinned copy buffers per rank (1GiB)",
         "SIZE"),
    STR ("reduce-bucket", reduce_bucket,
         "DeepSpeed reduce_bucket_size in elements (5e8)", "N"),
    STR ("prefetch-bucket", prefetch_bucket,
         "DeepSpeed stage3_prefetch_bucket_size in elements (5e7)", "N"),
    STR ("max-reuse-distance", reuse_distance,
         "DeepSpeed stage3_max_reuse_distance in elements (1e9)", "N"),
    { "optimizer-in-backward", 0, 0, G_OPTION_ARG_NONE, &po->opt_in_bwd,
      "Step each parameter as its gradient arrives (torchtune)", NULL },
    { "compile", 0, 0, G_OPTION_ARG_NONE, &po->compile,
      "The model runs under torch.compile (pytorch, deepspeed and fsdp "
      "engines): its elementwise ops are fused",
      NULL },
    STR ("free-grads", free_grads,
         "Gradients freed between steps: 1 (PyTorch >= 2.0; default for "
         "pytorch and fsdp) or 0",
         "0|1"),
    { "overlap-comm", 0, 0, G_OPTION_ARG_NONE, &po->overlap_comm,
      "DeepSpeed overlap_comm: two reduce buckets at ZeRO 1 and 2", NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &po->json, "JSON output", NULL },
    { "explain", 0, 0, G_OPTION_ARG_NONE, &po->explain,
      "Show the formula behind every term and every stage", NULL },
    { NULL },
  };
  /* GLib copies the entries; their targets live in @po. */
  stow_cli_add_entries (po->call, ctx, entries);
  stow_optim_flags_add (po->call, ctx, &po->optim);
}

static gboolean
parse_degree (const char *flag, const char *v, guint *out, StowPins *pins,
              StowPins pin, GError **error)
{
  guint64 n;
  if (v == NULL)
    return TRUE;
  if (!g_ascii_string_to_unsigned (v, 10, 1, 1 << 20, &n, NULL))
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "%s \"%s\": expected a whole number from 1 to %u", flag, v,
                   1 << 20);
      return FALSE;
    }
  *out = (guint)n;
  *pins |= pin;
  return TRUE;
}

/* "--seq 4294967296: at most 16,777,216 tokens" */
static gboolean
over_limit (const char *flag, const char *v, guint64 max, const char *unit,
            GError **error)
{
  char buf[STOW_FORMAT_BUF];
  g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
               "%s %s: at most %s%s%s", flag, v,
               stow_format_grouped_into (buf, sizeof buf, max),
               *unit ? " " : "", unit);
  return FALSE;
}

/* A count of at least 1 and at most @max (a number too large for 64 bits
 * is over @max too, and said so). */
static gboolean
parse_count_flag (const char *flag, const char *v, gboolean tokens, guint64 max,
                  const char *unit, guint64 *out, GError **error)
{
  g_autoptr (GError) local = NULL;
  if (v == NULL)
    return TRUE;
  gboolean ok = tokens ? stow_parse_tokens (v, out, &local)
                       : stow_parse_count (v, out, &local);
  if ((!ok && g_error_matches (local, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE)
       && v[0] != '-')
      || (ok && *out > max))
    return over_limit (flag, v, max, unit, error);
  if (!ok || *out == 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE, "%s: %s",
                   flag, local ? local->message : "must be at least 1");
      return FALSE;
    }
  return TRUE;
}

/* Sizes of buffers and reserves: at most 1 PiB. */
#define MAX_SIZE_FLAG ((guint64)1 << 50)
/* Parameter and element counts standing in for a model: at most 2^50
 * (a thousand times the largest model trained). */
#define MAX_COUNT_FLAG ((guint64)1 << 50)

static gboolean
parse_size_flag (const char *flag, const char *v, guint64 *out, GError **error)
{
  g_autoptr (GError) local = NULL;
  if (v == NULL)
    return TRUE;
  if (!stow_parse_size (v, out, &local))
    {
      if (g_error_matches (local, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE)
          && v[0] != '-')
        return over_limit (flag, v, MAX_SIZE_FLAG, "bytes (1 PiB)", error);
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE, "%s: %s",
                   flag, local->message);
      return FALSE;
    }
  if (*out > MAX_SIZE_FLAG)
    return over_limit (flag, v, MAX_SIZE_FLAG, "bytes (1 PiB)", error);
  return TRUE;
}

/* --nvme: "none" or "0", "SIZE" (one drive) or "COUNTxSIZE". */
static gboolean
parse_nvme_flag (const char *v, guint *count, guint64 *capacity, GError **error)
{
  g_autoptr (GError) local = NULL;
  *count = 1;
  *capacity = 0;
  if (g_ascii_strcasecmp (v, "none") == 0 || strcmp (v, "0") == 0)
    {
      *count = 0;
      return TRUE;
    }
  const char *size = v;
  const char *x = strpbrk (v, "xX");
  if (x != NULL && x > v)
    {
      g_autofree char *digits = g_strndup (v, (gsize)(x - v));
      guint64 n;
      if (!g_ascii_string_to_unsigned (digits, 10, 1, 64, &n, NULL))
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "--nvme %s: the drive count must be 1 to 64", v);
          return FALSE;
        }
      *count = (guint)n;
      size = x + 1;
    }
  if (!stow_parse_size (size, capacity, &local) || *capacity == 0
      || *capacity > MAX_SIZE_FLAG)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "--nvme %s: expected none, SIZE or COUNTxSIZE such as "
                   "2x3.84TB (drives of up to 1 PiB)%s%s",
                   v, local ? ": " : "", local ? local->message : "");
      return FALSE;
    }
  return TRUE;
}

/* --host-ram and --nvme: the user's host in place of the preset's. */
static gboolean
apply_host_flags (StowPlanOptions *po, GError **error)
{
  guint64 ram = 0, capacity = 0;
  guint n_nvme = 0;
  if (po->host_ram == NULL && po->nvme == NULL)
    return TRUE;
  if (!parse_size_flag ("--host-ram", po->host_ram, &ram, error)
      || (po->nvme && !parse_nvme_flag (po->nvme, &n_nvme, &capacity, error)))
    return FALSE;
  if (po->host_ram && ram == 0)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                   "--host-ram %s: must be more than 0", po->host_ram);
      return FALSE;
    }
  StowCluster *c = stow_cluster_with_host (po->cluster_obj, ram,
                                           po->nvme != NULL, n_nvme, capacity);
  stow_cluster_unref (po->cluster_obj);
  po->cluster_obj = c;
  return TRUE;
}

/* The memory model's flags (convention, overheads, buckets). */
static gboolean
parse_mem_options (StowPlanOptions *po, GError **error)
{
  StowMemOptions *o = &po->plan.mem;
  stow_mem_options_init (o);
  if (po->convention
      && !stow_convention_parse (po->convention, "--convention", &o->convention,
                                 error))
    return FALSE;
  if (!parse_count_flag ("--params", po->params, FALSE, MAX_COUNT_FLAG,
                         "parameters", &o->params_override, error)
      || !parse_count_flag ("--largest-layer", po->largest_layer, FALSE,
                            MAX_COUNT_FLAG, "parameters",
                            &o->largest_layer_override, error))
    return FALSE;
  if (po->zero_init)
    {
      if (strcmp (po->zero_init, "0") != 0 && strcmp (po->zero_init, "1") != 0)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "--zero-init \"%s\": expected 0 or 1", po->zero_init);
          return FALSE;
        }
      o->zero_init = po->zero_init[0] == '1';
    }
  if (!parse_count_flag ("--reduce-bucket", po->reduce_bucket, FALSE,
                         MAX_COUNT_FLAG, "elements", &o->reduce_bucket_elements,
                         error)
      || !parse_count_flag ("--prefetch-bucket", po->prefetch_bucket, FALSE,
                            MAX_COUNT_FLAG, "elements",
                            &o->prefetch_bucket_elements, error)
      || !parse_count_flag ("--max-reuse-distance", po->reuse_distance, FALSE,
                            MAX_COUNT_FLAG, "elements",
                            &o->reuse_distance_elements, error))
    return FALSE;
  if (po->overlap_comm)
    o->overlap_comm = 1;
  if (po->free_grads)
    {
      if (strcmp (po->free_grads, "0") != 0
          && strcmp (po->free_grads, "1") != 0)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "--free-grads \"%s\": expected 0 or 1", po->free_grads);
          return FALSE;
        }
      o->free_grads = po->free_grads[0] == '1';
    }
  if (!parse_size_flag ("--workspace-memory", po->workspace,
                        &o->workspace_bytes, error)
      || !parse_size_flag ("--host-process-memory", po->host_process,
                           &o->host_process_bytes, error)
      || !parse_size_flag ("--cpu-optimizer-buffers", po->cpu_opt_buffers,
                           &o->cpu_optimizer_buffer_bytes, error))
    return FALSE;
  if (!parse_size_flag ("--context-memory", po->context, &o->cuda_context_bytes,
                        error)
      || !parse_size_flag ("--nccl-reserve", po->nccl, &o->nccl_bytes_per_group,
                           error)
      || !parse_size_flag ("--safety-margin", po->margin,
                           &o->safety_margin_bytes, error))
    return FALSE;
  if (po->fragmentation)
    {
      char *end = NULL;
      double f = g_ascii_strtod (po->fragmentation, &end);
      if (end == po->fragmentation || *end != '\0' || !(f >= 0 && f <= 1))
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "--fragmentation \"%s\": expected a fraction from 0 "
                       "to 1",
                       po->fragmentation);
          return FALSE;
        }
      o->fragmentation = f;
    }

  return TRUE;
}

/* The model (argument @model_arg) and the cluster (--gpus, --cluster,
 * --host-ram, --nvme). */
static gboolean
resolve_model_cluster (StowPlanOptions *po, const char *model_arg,
                       GError **error)
{
  StowMemOptions *o = &po->plan.mem;
  /* The model: a catalog name or a config.json; --params alone only
   * under a peer convention. */
  if (model_arg != NULL)
    {
      po->model
          = stow_cli_call_model (po->call, model_arg, po->revision, error);
      if (po->model == NULL)
        return FALSE;
    }
  else if (po->revision != NULL)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--revision needs a Hub id (ORG/NAME) as the model");
      return FALSE;
    }
  else if (o->params_override == 0 || o->convention == STOW_CONVENTION_STOWAGE)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "no model given: name one from 'stowage models' or a "
                   "config.json (--params N stands in only under a peer "
                   "--convention)");
      return FALSE;
    }

  if (po->gpus && po->cluster)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--gpus and --cluster both given; use one");
      return FALSE;
    }
  if (po->gpus)
    po->cluster_obj = stow_cluster_new_from_spec (po->gpus, error);
  else if (po->cluster)
    po->cluster_obj = stow_cluster_new_from_file (po->cluster, error);
  else
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "no GPUs given: add --gpus SPEC (e.g. --gpus 8xA100-80GB) "
                   "or --cluster FILE");
      return FALSE;
    }
  if (po->cluster_obj == NULL || !apply_host_flags (po, error))
    return FALSE;
  return TRUE;
}

gboolean
stow_plan_options_parse_shape (StowPlanOptions *po, GError **error)
{
  StowLayout *l = &po->plan.layout;
  StowTraining *t = &po->plan.training;
  stow_training_init (t);
  stow_layout_init (l);
  po->pins = 0;
  if (!parse_degree ("--dp", po->dp, &l->dp, &po->pins, STOW_PIN_DP, error)
      || !parse_degree ("--tp", po->tp, &l->tp, &po->pins, STOW_PIN_TP, error)
      || !parse_degree ("--pp", po->pp, &l->pp, &po->pins, STOW_PIN_PP, error)
      || !parse_degree ("--vpp", po->vpp, &l->vpp, &po->pins, STOW_PIN_VPP,
                        error)
      || !parse_degree ("--cp", po->cp, &l->cp, &po->pins, STOW_PIN_CP, error)
      || !parse_degree ("--ep", po->ep, &l->ep, &po->pins, STOW_PIN_EP, error)
      || !parse_degree ("--etp", po->etp, &l->etp, &po->pins, STOW_PIN_ETP,
                        error))
    return FALSE;
  if (po->sp && po->no_sp)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--sp and --no-sp both given");
      return FALSE;
    }
  if (po->sp || po->no_sp)
    l->sp = po->sp, po->pins |= STOW_PIN_SP;
  if (po->pp_split_ends)
    l->pp_split_ends = TRUE, po->pins |= STOW_PIN_PP_SPLIT_ENDS;
  if (po->zero)
    {
      if (!stow_zero_parse (po->zero, "--zero", &l->zero, &l->hybrid_shard,
                            error))
        return FALSE;
      po->pins |= STOW_PIN_ZERO;
    }
  if (po->offload_optimizer)
    {
      if (!stow_offload_parse (po->offload_optimizer, "--offload-optimizer",
                               &l->offload_optimizer, error))
        return FALSE;
      po->pins |= STOW_PIN_OFFLOAD_OPTIMIZER;
    }
  if (po->offload_params)
    {
      if (!stow_offload_parse (po->offload_params, "--offload-params",
                               &l->offload_params, error))
        return FALSE;
      po->pins |= STOW_PIN_OFFLOAD_PARAMS;
    }
  if (po->offload_activations)
    {
      StowOffload a;
      if (!stow_offload_parse (po->offload_activations, "--offload-activations",
                               &a, error))
        return FALSE;
      if (a == STOW_OFFLOAD_NVME)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                       "--offload-activations nvme: activation checkpoints "
                       "go to cpu only");
          return FALSE;
        }
      l->offload_activations = a == STOW_OFFLOAD_CPU;
      po->pins |= STOW_PIN_OFFLOAD_ACTIVATIONS;
    }
  if (po->resident_layers)
    {
      guint64 k;
      g_autoptr (GError) local = NULL;
      if (!stow_parse_count (po->resident_layers, &k, &local)
          || k >= STOW_RESIDENT_AUTO)
        {
          g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_PARSE,
                       "--resident-layers \"%s\": expected a count",
                       po->resident_layers);
          return FALSE;
        }
      l->resident_layers = (guint)k;
    }
  if (po->recompute)
    {
      if (!stow_recompute_parse (po->recompute, "--recompute", &l->recompute,
                                 &l->recompute_layers, error))
        return FALSE;
      po->pins |= STOW_PIN_RECOMPUTE;
    }
  if (po->micro_batch)
    {
      if (!parse_count_flag ("--micro-batch", po->micro_batch, FALSE,
                             STOW_MAX_MICRO_BATCH, "sequences", &l->micro_batch,
                             error))
        return FALSE;
      po->pins |= STOW_PIN_MICRO_BATCH;
    }
  if (!parse_count_flag ("--global-batch", po->global_batch, FALSE,
                         STOW_MAX_GLOBAL_BATCH, "sequences", &t->global_batch,
                         error)
      || !parse_count_flag ("--grad-accum", po->grad_accum, FALSE,
                            STOW_MAX_GRAD_ACCUM, "micro-batches",
                            &l->grad_accum, error)
      || !parse_count_flag ("--seq", po->seq, TRUE, STOW_MAX_SEQ_TOKENS,
                            "tokens", &t->seq_len, error)
      || !parse_count_flag ("--decoder-seq", po->decoder_seq, TRUE,
                            STOW_MAX_SEQ_TOKENS, "tokens", &t->decoder_seq_len,
                            error)
      || !parse_count_flag ("--lora-rank", po->lora_rank, FALSE,
                            STOW_MAX_LORA_RANK, "", &t->lora_rank, error))
    return FALSE;
  if (po->precision
      && !stow_precision_parse (po->precision, "--precision", &t->precision,
                                error))
    return FALSE;
  if (po->optimizer
      && !stow_optimizer_parse (po->optimizer, "--optimizer", &t->optimizer,
                                error))
    return FALSE;
  if (po->finetune
      && !stow_finetune_parse (po->finetune, "--finetune", &t->finetune, error))
    return FALSE;
  if (!stow_optim_flags_apply (&po->optim, &t->optim, error))
    return FALSE;
  if (po->engine
      && !stow_engine_parse (po->engine, "--engine", &l->engine, error))
    return FALSE;
  if (po->schedule)
    {
      if (!stow_schedule_parse (po->schedule, "--schedule", &l->schedule,
                                error))
        return FALSE;
      po->pins |= STOW_PIN_SCHEDULE;
    }
  t->flash_attention = !po->no_flash;
  t->chunked_loss = po->chunked_loss;
  t->fused_loss = po->fused_loss;
  if (po->chunked_loss && po->fused_loss)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--chunked-loss and --fused-loss name two ways to run "
                   "one cross-entropy: give one");
      return FALSE;
    }
  t->dropout = po->dropout;
  t->lora_dropout = po->lora_dropout;
  t->optimizer_in_backward = po->opt_in_bwd;
  t->compiled = po->compile;
  if (po->lora_targets
      && !stow_lora_targets_parse (po->lora_targets, "--lora-targets",
                                   &t->lora_targets, error))
    return FALSE;
  return TRUE;
}

gboolean
stow_plan_options_resolve (StowPlanOptions *po, const char *model_arg,
                           GError **error)
{
  StowTraining *t = &po->plan.training;
  stow_plan_init (&po->plan, NULL, NULL);
  if (!parse_mem_options (po, error)
      || !resolve_model_cluster (po, model_arg, error)
      || !stow_plan_options_parse_shape (po, error))
    return FALSE;
  po->plan.model = po->model;
  po->plan.cluster = po->cluster_obj;
  if (po->model && !stow_training_check_model (t, po->model, error))
    return FALSE;
  /* The default precision is bf16, or fp16 on a GPU without bf16 tensor
   * cores (V100, T4), where bf16 is only emulated. */
  const StowGpu *gpu = &po->cluster_obj->node.gpu;
  if (po->precision == NULL && t->precision == STOW_PRECISION_BF16
      && !(gpu->bf16_flops > 0) && gpu->fp16_flops > 0)
    t->precision = STOW_PRECISION_FP16;
  g_autofree char *warning = NULL;
  if (!stow_training_check_gpu (t, gpu, &warning, error))
    return FALSE;
  if (warning != NULL)
    stow_cli_call_log_warning (po->call, warning);
  return TRUE;
}

void
stow_plan_options_default_layout (StowPlanOptions *po)
{
  StowLayout *l = &po->plan.layout;
  const StowCluster *c = po->cluster_obj;
  if (!(po->pins & STOW_PIN_DP))
    {
      guint64 mp = (guint64)l->tp * l->pp * l->cp;
      l->dp = mp && c->n_gpus % mp == 0 ? (guint)(c->n_gpus / mp) : 1;
    }
  if (!(po->pins & STOW_PIN_SP))
    l->sp = l->tp > 1;
  if (!(po->pins & STOW_PIN_SCHEDULE) && l->vpp > 1)
    l->schedule = STOW_SCHEDULE_INTERLEAVED;
  if (po->plan.training.global_batch && po->grad_accum == NULL)
    {
      guint64 per = l->micro_batch * l->dp;
      if (per && po->plan.training.global_batch % per == 0)
        l->grad_accum = po->plan.training.global_batch / per;
    }
  else if (po->grad_accum == NULL)
    l->grad_accum = l->pp; /* enough micro-batches to fill the pipeline */
  /* Streamed layers kept resident: decided once, here, for the layout
   * every later stage (memory, time, lowering) reads. */
  if (po->model != NULL)
    stow_plan_resolve_resident (&po->plan, NULL);
}

StowSearch *
stow_plan_options_search (const StowPlanOptions *po, const StowCluster *cluster,
                          const StowTraining *training, StowPins pins,
                          guint max_keep)
{
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = max_keep;
  so.engines = po->search_engines;
  so.accept = po->search_accept;
  so.accept_data = po->search_accept_data;
  StowPlan plan = po->plan;
  if (cluster != NULL)
    plan.cluster = cluster;
  if (training != NULL)
    plan.training = *training;
  return stow_search_run (&plan, pins, &so);
}

char **
stow_plan_options_fill_like_fit (StowPlanOptions *po)
{
  static const struct
  {
    StowPins pin;
    const char *name;
  } dims[] = {
    { STOW_PIN_DP, "dp" },
    { STOW_PIN_TP, "tp" },
    { STOW_PIN_PP, "pp" },
    { STOW_PIN_VPP, "vpp" },
    { STOW_PIN_CP, "cp" },
    { STOW_PIN_EP, "ep" },
    { STOW_PIN_ETP, "etp" },
    { STOW_PIN_SP, "sp" },
    { STOW_PIN_ZERO, "zero" },
    { STOW_PIN_OFFLOAD_OPTIMIZER, "offload-optimizer" },
    { STOW_PIN_OFFLOAD_PARAMS, "offload-params" },
    { STOW_PIN_OFFLOAD_ACTIVATIONS, "offload-activations" },
    { STOW_PIN_RECOMPUTE, "recompute" },
    { STOW_PIN_MICRO_BATCH, "micro-batch" },
    { STOW_PIN_SCHEDULE, "schedule" },
    { STOW_PIN_PP_SPLIT_ENDS, "pp-split-ends" },
  };
  stow_plan_options_default_layout (po);
  /* Several engines (--emit accelerate): the search picks one even when
   * every dimension is given. */
  gboolean engine_open = (po->search_engines & (po->search_engines - 1)) != 0;
  if (po->model == NULL || po->plan.mem.convention != STOW_CONVENTION_STOWAGE
      || ((po->pins & STOW_PIN_ALL) == STOW_PIN_ALL && !engine_open))
    return NULL;
  g_autoptr (StowSearch) s
      = stow_plan_options_search (po, NULL, NULL, po->pins, 1);
  const StowCandidate *best = s->fits->len
                                  ? &g_array_index (s->fits, StowCandidate, 0)
                                  : (s->have_miss ? &s->best_miss : NULL);
  if (best == NULL)
    return NULL;
  po->plan.layout = best->layout;
  GPtrArray *names = g_ptr_array_new_with_free_func (g_free);
  for (gsize i = 0; i < G_N_ELEMENTS (dims); i++)
    {
      if (po->pins & dims[i].pin)
        continue;
      /* dimensions that had only one value to take here */
      const StowLayout *l = &po->plan.layout;
      StowPins p = dims[i].pin;
      if ((p & (STOW_PIN_DP | STOW_PIN_TP | STOW_PIN_PP | STOW_PIN_CP)
           && po->cluster_obj->n_gpus == 1)
          || ((p == STOW_PIN_EP || p == STOW_PIN_ETP)
              && po->model->n_experts == 0)
          || (p == STOW_PIN_ETP
              && (l->tp == 1 || !stow_engine_is_mcore (l->engine)))
          || ((p == STOW_PIN_SCHEDULE || p == STOW_PIN_VPP) && l->pp == 1)
          || (p == STOW_PIN_SP && l->tp == 1)
          || (p == STOW_PIN_PP_SPLIT_ENDS && !l->pp_split_ends)
          || (p == STOW_PIN_OFFLOAD_PARAMS && l->zero != 3)
          || (p == STOW_PIN_OFFLOAD_ACTIVATIONS
              && l->recompute != STOW_RECOMPUTE_FULL)
          || (p == STOW_PIN_MICRO_BATCH && po->plan.training.global_batch == 0))
        continue;
      g_ptr_array_add (names, g_strdup (dims[i].name));
    }
  if (engine_open)
    g_ptr_array_add (names, g_strdup ("engine"));
  if (names->len == 0)
    {
      g_ptr_array_free (names, TRUE);
      return NULL;
    }
  g_ptr_array_set_free_func (names, NULL);
  g_ptr_array_add (names, NULL);
  return (char **)g_ptr_array_free (names, FALSE);
}

void
stow_plan_options_clear (StowPlanOptions *po)
{
  char **strings[] = {
    &po->gpus,
    &po->cluster,
    &po->dp,
    &po->tp,
    &po->pp,
    &po->vpp,
    &po->cp,
    &po->ep,
    &po->etp,
    &po->zero,
    &po->offload_optimizer,
    &po->offload_params,
    &po->offload_activations,
    &po->recompute,
    &po->micro_batch,
    &po->resident_layers,
    &po->revision,
    &po->global_batch,
    &po->grad_accum,
    &po->seq,
    &po->decoder_seq,
    &po->precision,
    &po->optimizer,
    &po->finetune,
    &po->lora_rank,
    &po->engine,
    &po->schedule,
    &po->convention,
    &po->params,
    &po->largest_layer,
    &po->zero_init,
    &po->context,
    &po->fragmentation,
    &po->nccl,
    &po->margin,
    &po->reduce_bucket,
    &po->prefetch_bucket,
    &po->reuse_distance,
    &po->free_grads,
    &po->lora_targets,
    &po->workspace,
    &po->host_process,
    &po->cpu_opt_buffers,
    &po->host_ram,
    &po->nvme,
  };
  for (gsize i = 0; i < G_N_ELEMENTS (strings); i++)
    g_clear_pointer (strings[i], g_free);
  stow_optim_flags_clear (&po->optim);
  g_clear_pointer (&po->model, stow_model_unref);
  g_clear_pointer (&po->cluster_obj, stow_cluster_unref);
}

int
stow_plan_options_fail_no_layout (const StowPlanOptions *po)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMemory) m = stow_memory_estimate (&po->plan, &error);
  if (m == NULL)
    return stow_cli_call_fail (po->call, error, NULL);
  return stow_cli_call_failf (po->call, NULL, "no valid layout of %s on %s",
                              po->model->name, po->cluster_obj->spec);
}
