/* SPDX-License-Identifier: MIT
 *
 * executor/train.c: the training loop (executor/train.h).  Conventions
 * (docs/executor.md): micro-batch g of the run (g = (step - 1) x
 * grad_accum + i) reads tokens [g B T, g B T + B T + 1) of the stream,
 * row b its tokens [b T, b T + T) and targets one further; with --shuffle
 * the windows of each pass over the stream are permuted from the seed.
 * The loss is the mean token cross-entropy of the global batch.
 */
#include "executor/train.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/json.h"
#include "core/units.h"
#include "executor/backends/registry.h"
#include "executor/backends/sim.h"
#include "executor/checkpoint-io.h"
#include "executor/checkpoint.h"
#include "executor/preflight.h"
#include "executor/driver.h"
#include "offload/adam.h"
#include "planner/plan-file.h"
#include "planner/schedule.h"
#include "planner/search.h"

/* clang-format off */
G_DEFINE_QUARK (stow-train-error-quark, stow_train_error)
/* clang-format on */

#define STATE_FORMAT "stowage-train-state"

void
stow_train_config_init (StowTrainConfig *c)
{
  memset (c, 0, sizeof *c);
  stow_layout_init (&c->layout);
  stow_optim_settings_init (&c->optim);
  c->optim.max_grad_norm = 1.0; /* as the HF Trainer */
  c->precision = STOW_PRECISION_FP32;
  c->steps = 1;
  c->seq = 256;
  c->micro_batch = 1;
  c->backend = "cpu";
}

void
stow_train_config_clear (StowTrainConfig *c)
{
  g_clear_pointer (&c->layout_description, g_free);
}

StowCluster *
stow_train_cpu_cluster (guint64 device_bytes, guint threads)
{
  StowNode node;
  memset (&node, 0, sizeof node);
  guint cores = threads ? threads : MAX (1u, g_get_num_processors ());
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  guint64 ram = pages > 0 && page > 0 ? (guint64)pages * (guint64)page : 0;
  node.name = g_strdup ("cpu");
  node.description = g_strdup ("this host's cpu backend");
  node.gpu.name = g_strdup ("cpu-arena");
  node.gpu.vendor = g_strdup ("cpu");
  node.gpu.description
      = g_strdup ("host RAM as a capacity-limited device (cpu backend)");
  node.gpu.total_bytes = node.gpu.marketing_bytes = device_bytes;
  /* Nominal rates: the sim gives the step's shape from them, not a
   * measured length (a few tens of GFLOP/s a core with AVX-512 FMA). */
  node.gpu.fp32_flops = node.gpu.bf16_flops = node.gpu.fp16_flops
      = node.gpu.tf32_flops = 40e9 * cores;
  node.gpu.hbm_bw = 20e9;
  node.gpu.pcie_bw = 10e9;
  node.gpu.nvlink_domain = 1;
  node.gpus_per_node = 1;
  node.host_ram_bytes = ram;
  node.host_mem_bw = 20e9;
  node.cpu_cores = cores;
  node.numa_nodes = 1;
  node.sockets = 1;
  StowCluster *c = stow_cluster_new (&node, 1, "cpu");
  stow_node_clear (&node);
  return c;
}

StowCluster *
stow_train_gpu_cluster (guint64 device_bytes, guint threads,
                        const char *device_name)
{
  StowCluster *cpu = stow_train_cpu_cluster (device_bytes, threads);
  const StowGpu *known
      = device_name ? stow_gpu_find_device (device_name) : NULL;
  StowNode node;
  memset (&node, 0, sizeof node);
  stow_node_copy (&cpu->node, &node);
  stow_cluster_unref (cpu);
  if (known)
    {
      stow_gpu_clear (&node.gpu);
      stow_gpu_copy (known, &node.gpu);
    }
  else
    {
      g_free (node.gpu.name);
      node.gpu.name = g_strdup (device_name ? device_name : "cuda");
    }
  node.gpu.total_bytes = node.gpu.marketing_bytes = device_bytes;
  g_free (node.description);
  node.description = g_strdup ("this host's GPU (cuda backend)");
  StowCluster *c = stow_cluster_new (&node, 1, "cuda");
  stow_node_clear (&node);
  return c;
}

/* ---- the run ---------------------------------------------------------- */

typedef struct
{
  StowTrainConfig *c;
  StowModel *model;
  StowCluster *cluster;
  StowTraining training;
  StowLayout layout;
  StowMemOptions mo;
  StowProgram *prog;
  StowBackend *be;
  const StowBackendVtable *ops; /* be's table */
  StowTokenData *data;
  StowBatches *batches;
  char *config_json; /* the model's config.json, verbatim */
  gsize config_len;
  FILE *log;
} Run;

static void
run_clear (Run *r)
{
  if (r->be)
    stow_backend_free (r->be);
  if (r->prog)
    stow_program_free (r->prog);
  if (r->batches)
    stow_batches_free (r->batches);
  if (r->data)
    stow_token_data_free (r->data);
  if (r->model)
    stow_model_unref (r->model);
  if (r->cluster)
    stow_cluster_unref (r->cluster);
  if (r->log)
    fclose (r->log);
  g_free (r->config_json);
}

/* The model, its config.json and the data. */
static gboolean
open_inputs (Run *r, GError **error)
{
  StowTrainConfig *c = r->c;
  g_autofree char *cfg = g_build_filename (c->model_dir, "config.json", NULL);
  if (!g_file_get_contents (cfg, &r->config_json, &r->config_len, error))
    return FALSE;
  r->model = stow_model_new_from_file (cfg, error);
  if (r->model == NULL)
    return FALSE;
  StowLlamaConfig lc;
  if (!stow_llama_config_from_model (r->model, &lc, error))
    return FALSE;
  if (c->tokenizer == STOW_TOKENIZER_BYTES && r->model->vocab < 256)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--tokenizer bytes needs vocab_size >= 256; %s has "
                   "%" G_GUINT64_FORMAT,
                   cfg, r->model->vocab);
      return FALSE;
    }
  r->data = stow_token_data_open (c->data, c->tokenizer, r->model->vocab,
                                  error);
  if (r->data == NULL)
    return FALSE;
  return TRUE;
}

/* The layout: a plan file's, or the fastest that fits the device with
 * the pinned dimensions as given. */
static gboolean
plan (Run *r, GError **error)
{
  StowTrainConfig *c = r->c;
  stow_mem_options_init (&r->mo);
  /* The arena holds tensors only: no CUDA context, library workspaces or
   * communicators, and no caching allocator's slack. */
  r->mo.cuda_context_bytes = r->mo.workspace_bytes = 0;
  r->mo.nccl_bytes_per_group = 0;
  r->mo.fragmentation = 0;
  r->mo.safety_margin_bytes = 0;
  r->mo.host_process_bytes = 0;
  stow_training_init (&r->training);
  StowTraining *t = &r->training;
  t->seq_len = c->seq;
  t->global_batch = c->global_batch;
  t->precision = c->precision;
  if (c->plan_path)
    {
      g_autoptr (StowPlanFile) pf = stow_plan_file_read (c->plan_path, error);
      if (pf == NULL)
        return FALSE;
      r->layout = pf->layout;
      /* --resident-layers pins k over the plan's (streamed layouts). */
      if (c->layout.resident_layers != STOW_RESIDENT_AUTO
          && r->layout.offload_params != STOW_OFFLOAD_NONE)
        r->layout.resident_layers = c->layout.resident_layers;
      /* The plan's training shape; the model is the directory's. */
      *t = pf->training;
      c->seq = t->seq_len;
      c->global_batch = t->global_batch;
      c->micro_batch = r->layout.micro_batch;
      c->precision = t->precision;
      r->mo = pf->mem_options;
      if (pf->model && pf->model->params != r->model->params)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
                       "--plan %s is for %s (%" G_GUINT64_FORMAT
                       " parameters), --model %s has %" G_GUINT64_FORMAT,
                       c->plan_path, pf->model->name, pf->model->params,
                       c->model_dir, r->model->params);
          return FALSE;
        }
      return TRUE;
    }
  if (c->global_batch % c->micro_batch != 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--global-batch %" G_GUINT64_FORMAT
                   " is not a multiple of --micro-batch %" G_GUINT64_FORMAT,
                   c->global_batch, c->micro_batch);
      return FALSE;
    }
  StowLayout base = c->layout;
  base.micro_batch = c->micro_batch;
  base.grad_accum = c->global_batch / c->micro_batch;
  base.engine = STOW_ENGINE_STOWAGE;
  /* One device: everything but recomputation (and the offloads, where
   * the backend runs them) is fixed by it. */
  StowPins pins = (StowPins)c->pins | STOW_PIN_DP | STOW_PIN_TP | STOW_PIN_PP
                  | STOW_PIN_VPP | STOW_PIN_CP | STOW_PIN_EP | STOW_PIN_ETP
                  | STOW_PIN_SP | STOW_PIN_ZERO | STOW_PIN_MICRO_BATCH
                  | STOW_PIN_SCHEDULE | STOW_PIN_OFFLOAD_OPTIMIZER
                  | STOW_PIN_OFFLOAD_PARAMS | STOW_PIN_OFFLOAD_ACTIVATIONS;
  g_autoptr (StowSearch) s = stow_search_run (r->model, r->cluster, t, &base,
                                              pins, &r->mo, 1);
  if (s->fits->len == 0)
    {
      g_autofree char *cap = g_format_size_full (
          r->cluster->node.gpu.total_bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *need = s->have_miss ? g_format_size_full (
                                  s->best_miss.total_bytes,
                                  G_FORMAT_SIZE_IEC_UNITS)
                                           : g_strdup ("?");
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s does not fit a device of %s (--device-memory): the "
                   "closest layout needs %s; lower --micro-batch or --seq, "
                   "or raise --device-memory",
                   r->model->name, cap, need);
      return FALSE;
    }
  r->layout = g_array_index (s->fits, StowCandidate, 0).layout;
  return TRUE;
}

/* ---- checkpoints ---------------------------------------------------------- */

static JsonObject *
state_object (Run *r, guint64 step)
{
  const StowTrainConfig *c = r->c;
  const StowOptimSettings *o = &r->prog->optim;
  JsonObject *s = json_object_new ();
  json_object_set_string_member (s, "format", STATE_FORMAT);
  json_object_set_int_member (s, "version", 1);
  json_object_set_int_member (s, "step", (gint64)step);
  json_object_set_int_member (s, "tokens_seen",
                              (gint64)(step * c->global_batch * c->seq));
  /* A string: JSON numbers above 2^53 would not survive. */
  g_autofree char *seed = g_strdup_printf ("%" G_GUINT64_FORMAT, o->seed);
  json_object_set_string_member (s, "seed", seed);
  json_object_set_boolean_member (s, "shuffle", c->shuffle);
  json_object_set_string_member (s, "precision",
                                 stow_precision_name (c->precision));
  json_object_set_int_member (s, "seq", (gint64)c->seq);
  json_object_set_int_member (s, "micro_batch", (gint64)c->micro_batch);
  json_object_set_int_member (s, "global_batch", (gint64)c->global_batch);
  json_object_set_double_member (s, "lr", o->lr);
  json_object_set_double_member (s, "weight_decay", o->weight_decay);
  json_object_set_double_member (s, "max_grad_norm", o->max_grad_norm);
  if (c->delayed_update)
    json_object_set_boolean_member (s, "delayed_update", TRUE);
  return s;
}

static gboolean
save_checkpoint (Run *r, guint64 step, GError **error)
{
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (r->c->out_dir, step, error);
  if (w == NULL)
    return FALSE;
  const char *dir = stow_checkpoint_writer_dir (w);
  g_autofree char *cfg = g_build_filename (dir, "config.json", NULL);
  g_autoptr (JsonObject) state = state_object (r, step);
  if (!g_file_set_contents (cfg, r->config_json, (gssize)r->config_len, error)
      || !stow_checkpoint_save_tensors (r->be, r->prog, dir, state,
                                        r->c->delayed_update, error))
    return FALSE;
  return stow_checkpoint_commit (w, error);
}

static gboolean
state_u64 (JsonObject *s, const char *where, const char *name, guint64 *out,
           GError **error)
{
  return stow_json_get_u64 (s, where, name, TRUE, out, error);
}

static gboolean
same_str (const char *dir, const char *field, const char *was,
          const char *now, GError **error)
{
  if (g_strcmp0 (was, now) == 0)
    return TRUE;
  g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
               "%s: the checkpoint ran with %s %s; this run has %s (--resume "
               "continues the same run)",
               dir, field, was, now);
  return FALSE;
}

static gboolean
same_u64 (const char *dir, const char *field, guint64 was, guint64 now,
          GError **error)
{
  g_autofree char *a = g_strdup_printf ("%" G_GUINT64_FORMAT, was);
  g_autofree char *b = g_strdup_printf ("%" G_GUINT64_FORMAT, now);
  return same_str (dir, field, a, b, error);
}

/* The weights and optimizer state of checkpoint @dir; the steps done. */
static gboolean
load_checkpoint (Run *r, const char *dir, guint64 *done, GError **error)
{
  StowTrainConfig *c = r->c;
  g_autofree char *st = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *opt = g_build_filename (dir, "optimizer.stow", NULL);
  g_autoptr (StowOptimState) os = stow_optim_state_open (opt, error);
  if (os == NULL)
    return FALSE;
  JsonObject *s = stow_optim_state_get_state (os);
  guint64 step = 0, seq = 0, mb = 0, gb = 0;
  const char *prec = NULL, *seed = NULL, *fmt = NULL;
  if (!stow_json_get_string (s, opt, "format", TRUE, &fmt, error)
      || !state_u64 (s, opt, "step", &step, error)
      || !state_u64 (s, opt, "seq", &seq, error)
      || !state_u64 (s, opt, "micro_batch", &mb, error)
      || !state_u64 (s, opt, "global_batch", &gb, error)
      || !stow_json_get_string (s, opt, "precision", TRUE, &prec, error)
      || !stow_json_get_string (s, opt, "seed", TRUE, &seed, error))
    return FALSE;
  /* A run continues only as itself: the same data order and shapes. */
  g_autofree char *now_seed
      = g_strdup_printf ("%" G_GUINT64_FORMAT, c->optim.seed);
  if (!same_u64 (dir, "seq", seq, c->seq, error)
      || !same_u64 (dir, "micro_batch", mb, c->micro_batch, error)
      || !same_u64 (dir, "global_batch", gb, c->global_batch, error)
      || !same_str (dir, "precision", prec, stow_precision_name (c->precision),
                    error)
      || !same_str (dir, "seed", seed, now_seed, error))
    return FALSE;
  gboolean delayed = FALSE;
  if (json_object_has_member (s, "delayed_update"))
    delayed = json_object_get_boolean_member (s, "delayed_update");
  if (!same_str (dir, "--delayed-update", delayed ? "on" : "off",
                 c->delayed_update ? "on" : "off", error))
    return FALSE;
  if (!stow_checkpoint_load_tensors (r->be, r->prog, st, os, opt, delayed,
                                     step, error))
    return FALSE;
  *done = step;
  return TRUE;
}

/* The cluster with one drive per --nvme-dir, each of the smallest free
 * space among them, so that the search plans the NVMe tier the swap files
 * will really have (the store checks each directory again when it
 * reserves the space). */
static gboolean
with_nvme_dirs (Run *r, GError **error)
{
  guint n = g_strv_length (r->c->nvme_dirs);
  guint64 least = G_MAXUINT64;
  for (guint i = 0; i < n; i++)
    {
      const char *d = r->c->nvme_dirs[i];
      struct statvfs sv;
      if (statvfs (d, &sv) != 0)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "--nvme-dir %s: %s", d, g_strerror (e));
          return FALSE;
        }
      least = MIN (least, (guint64)sv.f_bavail * (guint64)sv.f_frsize);
    }
  StowCluster *with = stow_cluster_with_host (r->cluster, 0, TRUE, n, least);
  stow_cluster_unref (r->cluster);
  r->cluster = with;
  return TRUE;
}

/* ---- the loop --------------------------------------------------------------- */

/* The last step's busy and exposed seconds per stream, from its trace. */
static void
keep_stream_times (StowTrainConfig *c, const StowTrace *t)
{
  double first = G_MAXDOUBLE, last = 0;
  for (guint i = 0; i < t->n_ops; i++)
    {
      first = MIN (first, t->ops[i].start_s);
      last = MAX (last, t->ops[i].end_s);
    }
  c->measured_step_s = t->n_ops ? last - first : 0;
  memcpy (c->measured_busy_s, t->busy_s, sizeof c->measured_busy_s);
  memcpy (c->measured_exposed_s, t->exposed_s, sizeof c->measured_exposed_s);
}

/* "streams": {stream: {busy_s, exposed_s, simulated_busy_s,
 * simulated_exposed_s}} for the streams busy in either. */
static void
log_stream_times (JsonBuilder *b, const StowTrainConfig *c)
{
  json_builder_set_member_name (b, "streams");
  json_builder_begin_object (b);
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      if (c->measured_busy_s[s] <= 0 && c->simulated_busy_s[s] <= 0)
        continue;
      json_builder_set_member_name (b, stow_stream_name (s));
      json_builder_begin_object (b);
      stow_json_set_double (b, "busy_s", c->measured_busy_s[s]);
      stow_json_set_double (b, "exposed_s", c->measured_exposed_s[s]);
      stow_json_set_double (b, "simulated_busy_s", c->simulated_busy_s[s]);
      stow_json_set_double (b, "simulated_exposed_s",
                            c->simulated_exposed_s[s]);
      json_builder_end_object (b);
    }
  json_builder_end_object (b);
}

static void
log_step (Run *r, const StowTrainStep *s)
{
  if (r->log == NULL)
    return;
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_i64 (b, "step", (gint64)s->step);
  stow_json_set_double (b, "loss", s->loss);
  stow_json_set_double (b, "grad_norm", s->grad_norm);
  stow_json_set_double (b, "lr", s->lr);
  stow_json_set_double (b, "tokens_per_s", s->tokens_per_s);
  stow_json_set_double (b, "step_time_s", s->step_s);
  json_builder_set_member_name (b, "skipped");
  json_builder_add_boolean_value (b, s->skipped);
  stow_json_set_i64 (b, "peak_device_bytes", (gint64)s->peak_device_bytes);
  if (r->c->stream_times && s->step == s->steps)
    log_stream_times (b, r->c);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *line = stow_json_to_string (root, FALSE);
  fprintf (r->log, "%s\n", line);
  fflush (r->log);
}

static gboolean
train_loop (Run *r, guint64 first, GError **error)
{
  StowTrainConfig *c = r->c;
  double tokens = (double)c->global_batch * (double)c->seq;
  gint64 t_start = g_get_monotonic_time ();
  g_autoptr (StowTrace) last = NULL;
  for (guint64 step = first; step <= c->steps; step++)
    {
      gint64 t0 = g_get_monotonic_time ();
      r->ops->begin_step (r->be, step);
      g_clear_pointer (&last, stow_trace_free);
      last = stow_program_run (r->prog, r->be, error);
      if (last == NULL)
        return FALSE;
      keep_stream_times (c, last);
      StowStepStats st;
      if (!r->ops->step_stats (r->be, &st, error))
        return FALSE;
      double step_s = (double)(g_get_monotonic_time () - t0) / 1e6;
      StowTrainStep s = { 0 };
      s.step = step, s.steps = c->steps;
      s.loss = st.loss, s.grad_norm = st.grad_norm, s.lr = st.lr;
      s.skipped = st.skipped;
      s.step_s = step_s;
      s.tokens_per_s = step_s > 0 ? tokens / step_s : 0;
      s.elapsed_s = (double)(g_get_monotonic_time () - t_start) / 1e6;
      s.eta_s = s.elapsed_s / (double)(step - first + 1)
                * (double)(c->steps - step);
      s.peak_device_bytes = r->ops->peak_bytes (r->be);
      if ((c->save_every && step % c->save_every == 0) || step == c->steps)
        {
          if (!save_checkpoint (r, step, error))
            return FALSE;
          s.saved = TRUE;
        }
      log_step (r, &s);
      if (c->progress)
        c->progress (&s, c->progress_user);
    }
  c->measured_peak_bytes = r->ops->peak_bytes (r->be);
  if (r->ops->pinned_peak_bytes)
    c->measured_pinned_bytes = r->ops->pinned_peak_bytes (r->be);
  if (c->trace_path && last != NULL)
    {
      g_autofree char *json = stow_trace_to_chrome_json (last, r->prog);
      if (!stow_file_write_atomic (c->trace_path, json, -1, error))
        return FALSE;
    }
  return TRUE;
}

static void note (StowTrainConfig *c, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static void
note (StowTrainConfig *c, const char *format, ...)
{
  if (c->notice == NULL)
    return;
  va_list ap;
  va_start (ap, format);
  g_autofree char *line = g_strdup_vprintf (format, ap);
  va_end (ap);
  c->notice (line, c->progress_user);
}

static gboolean
check_config (StowTrainConfig *c, GError **error)
{
  const char *bad = NULL;
  if (c->model_dir == NULL)
    bad = "--model DIR is required";
  else if (c->data == NULL)
    bad = "--data FILES is required";
  else if (c->out_dir == NULL)
    bad = "--out DIR is required";
  else if (c->steps == 0)
    bad = "--steps must be at least 1";
  else if (!c->plan_path && (c->seq == 0 || c->micro_batch == 0))
    bad = "--seq and --micro-batch must be at least 1";
  if (bad)
    {
      g_set_error_literal (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           bad);
      return FALSE;
    }
  if (stow_backend_kind_find (c->backend, error) == NULL)
    {
      g_prefix_error (error, "--backend ");
      return FALSE;
    }
  if (c->global_batch == 0)
    c->global_batch = c->micro_batch;
  c->optim.total_steps = c->steps;
  return TRUE;
}

/* The simulated step and its per-stream busy and exposed seconds, which
 * the run's own are printed beside (--stream-times). */
static void
keep_timeline (StowTrainConfig *c, const StowTrace *tr)
{
  c->predicted_step_s = tr->step_time_s;
  memcpy (c->simulated_busy_s, tr->busy_s, sizeof c->simulated_busy_s);
  memcpy (c->simulated_exposed_s, tr->exposed_s,
          sizeof c->simulated_exposed_s);
}

/* The simulated timeline of a GPU run whose optimizer steps on the host,
 * again at this host's measured CPU Adam rate (stow_adam_measure) instead
 * of the nominal host bandwidth: its cpu_optim stream's busy time is then
 * comparable with the run's (--stream-times).  The peaks stay the first
 * simulation's.  Without a measurement, the nominal timeline stays. */
static void
time_at_host_rate (Run *r)
{
  StowTrainConfig *c = r->c;
  g_autoptr (GError) e = NULL;
  StowAdam *adam = stow_adam_new (c->threads, STOW_ISA_AUTO, &e);
  double rate = adam ? stow_adam_measure (adam, (guint64)1 << 22, 3, &e) : 0;
  g_clear_pointer (&adam, stow_adam_free);
  if (rate <= 0)
    {
      note (c, "CPU Adam's rate: %s; the simulated cpu_optim stream keeps "
               "the nominal host bandwidth",
            e ? e->message : "not measured");
      return;
    }
  StowNode node;
  memset (&node, 0, sizeof node);
  stow_node_copy (&r->cluster->node, &node);
  node.host_mem_bw = rate * STOW_SCHED_ADAM_BYTES_PER_PARAM
                     * MAX (node.gpus_per_node, 1);
  g_autoptr (StowCluster) at
      = stow_cluster_new (&node, r->cluster->n_nodes, r->cluster->spec);
  stow_node_clear (&node);
  StowSimSetup setup = { r->model, at, &r->training, &r->layout, NULL };
  g_autoptr (StowBackend) sim = stow_backend_sim_new (&setup);
  g_autoptr (StowTrace) tr = stow_program_run (r->prog, sim, NULL);
  if (tr == NULL)
    return;
  note (c, "CPU Adam on this host: %.2f G parameters/s (the simulated "
           "cpu_optim stream's rate)",
        rate / 1e9);
  keep_timeline (c, tr);
}

gboolean
stow_train_run (StowTrainConfig *c, GError **error)
{
  if (!check_config (c, error))
    return FALSE;
  Run r = { 0 };
  r.c = c;
  gboolean ok = FALSE;
  g_autofree char *unpinned = NULL;
  guint64 done = 0;
  char *latest = NULL;
  const StowBackendKind *kind = stow_backend_kind_find (c->backend, NULL);
  gboolean cuda = kind->device_info != NULL;
  g_autofree char *gpu_name = NULL;
  guint64 device = c->device_memory;
  if (kind->device_info != NULL)
    {
      guint64 free_b = 0, total_b = 0;
      if (!kind->available (error)
          || !kind->device_info (&gpu_name, &free_b, &total_b, error))
        {
          g_prefix_error (error, "--backend %s: ", kind->name);
          goto out;
        }
      /* Room for what the arena does not hold: the runtime's workspace
       * (cuBLAS's, rotary tables, scratch), a little of the driver's. */
      guint64 reserve = MAX ((guint64)1 << 30, free_b / 20);
      guint64 usable = free_b > reserve ? free_b - reserve : 0;
      if (device == 0)
        device = usable;
      else if (device > usable)
        {
          g_autofree char *want
              = g_format_size_full (device, G_FORMAT_SIZE_IEC_UNITS);
          g_autofree char *have
              = g_format_size_full (usable, G_FORMAT_SIZE_IEC_UNITS);
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--device-memory %s: %s has %s free for tensors",
                       want, gpu_name, have);
          goto out;
        }
    }
  if (device == 0)
    {
      long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
      device = pages > 0 && page > 0 ? (guint64)pages * (guint64)page / 2
                                     : (guint64)1 << 30;
    }
  r.cluster = cuda ? stow_train_gpu_cluster (device, c->threads, gpu_name)
                   : stow_train_cpu_cluster (device, c->threads);
  if (c->nvme_dirs != NULL && !with_nvme_dirs (&r, error))
    goto out;
  if (!open_inputs (&r, error) || !plan (&r, error))
    goto out;
  guint64 window = c->micro_batch * c->seq;
  if (stow_token_data_n_tokens (r.data) < window + 1)
    {
      g_set_error (error, STOW_DATA_ERROR, STOW_DATA_ERROR_EMPTY,
                   "%s: %" G_GUINT64_FORMAT
                   " tokens; a micro-batch reads %" G_GUINT64_FORMAT,
                   c->data, stow_token_data_n_tokens (r.data), window + 1);
      goto out;
    }
  r.batches = stow_batches_new (r.data, window, r.layout.grad_accum,
                                c->shuffle, c->optim.seed);

  /* Lower and simulate once: the program is validated, and the predicted
   * peak and step are there to compare with the run's. */
  StowScheduleOptions so;
  stow_schedule_options_init (&so);
  so.optim = c->optim;
  so.delayed_update = c->delayed_update;
  if (!stow_layout_resolve_resident (r.model, r.cluster, &r.training,
                                     &r.layout, &r.mo, error))
    goto out;
  r.prog = stow_schedule_lower (r.model, r.cluster, &r.training, &r.layout,
                                &r.mo, &so, error);
  if (r.prog == NULL)
    goto out;
  c->layout_description = g_strdup (r.prog->description);
  {
    StowSimSetup setup
        = { r.model, r.cluster, &r.training, &r.layout, NULL };
    g_autoptr (StowBackend) sim = stow_backend_sim_new (&setup);
    g_autoptr (StowTrace) tr = stow_program_run (r.prog, sim, error);
    if (tr == NULL)
      goto out;
    c->predicted_peak_bytes = tr->peak_bytes[STOW_TIER_DEVICE];
    c->predicted_pinned_bytes = tr->peak_bytes[STOW_TIER_PINNED];
    keep_timeline (c, tr);
    if (cuda && r.layout.offload_optimizer != STOW_OFFLOAD_NONE)
      time_at_host_rate (&r);
    if (!stow_preflight_host (tr, cuda, error)
        || (!cuda
            && !stow_preflight_memlock (r.prog, tr, c->test_memlock_limit,
                                        c->allow_unpinned, &unpinned, error)))
      goto out;
    if (unpinned != NULL)
      note (c, "%s", unpinned);
  }
  {
    g_autofree char *cap = g_format_size_full (device, G_FORMAT_SIZE_IEC_UNITS);
    g_autofree char *peak = g_format_size_full (c->predicted_peak_bytes,
                                                G_FORMAT_SIZE_IEC_UNITS);
    note (c, "%s layout: %s; device %s (--device-memory), predicted peak %s",
          c->plan_path ? "plan file's" : "planned", c->layout_description, cap,
          peak);
  }

  if (c->delayed_update && c->optim.max_grad_norm > 0)
    note (c, "--delayed-update: no gradient clipping (the norm would wait "
             "for the whole backward, which the delay overlaps)");
  {
    StowBackendSetup setup = {
      .program = r.prog,
      .model = r.model,
      .device_capacity_bytes = device,
      .n_threads = c->threads,
      .data = r.batches,
      .delayed_update = c->delayed_update,
      .swap = { .dirs = (const char *const *)c->nvme_dirs,
                .fault = c->nvme_fault,
                .fault_nth = c->nvme_fault_nth },
      .no_pin = unpinned != NULL,
      .copy_delay_us = c->copy_delay_us,
    };
    r.be = kind->create (&setup, error);
    if (r.be == NULL)
      goto out;
    r.ops = r.be->vt;
    g_autofree char *swap
        = r.ops->describe_swap ? r.ops->describe_swap (r.be) : NULL;
    if (swap != NULL)
      note (c, "%s", swap);
  }
  if (!r.ops->alloc_persistent (r.be, error))
    goto out;
  {
    g_autofree char *pool
        = r.ops->describe_pinned ? r.ops->describe_pinned (r.be) : NULL;
    if (pool != NULL)
      note (c, "host buffers of the program: %s", pool);
  }

  if (c->resume)
    {
      latest = stow_checkpoint_latest (c->out_dir, error);
      if (latest == NULL && error && *error)
        goto out;
    }
  if (latest != NULL)
    {
      if (!load_checkpoint (&r, latest, &done, error))
        goto out;
      note (c, "resuming from step %" G_GUINT64_FORMAT " (%s)", done, latest);
    }
  else
    {
      if (c->resume)
        note (c, "--resume: no checkpoint in %s; starting from step 0",
              c->out_dir);
      g_autofree char *st
          = g_build_filename (c->model_dir, "model.safetensors", NULL);
      if (!stow_checkpoint_load_initial (r.be, r.prog, st, error))
        goto out;
    }
  if (r.ops->push && !r.ops->push (r.be, error))
    goto out;
  c->first_step = done + 1;
  if (g_mkdir_with_parents (c->out_dir, 0755) != 0)
    {
      int e = errno;
      g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                   "--out %s: %s", c->out_dir, g_strerror (e));
      goto out;
    }
  if (c->log_json)
    {
      r.log = fopen (c->log_json, done > 0 ? "a" : "w");
      if (r.log == NULL)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "--log-json %s: %s", c->log_json, g_strerror (e));
          goto out;
        }
    }
  r.ops->reset_peak (r.be);
  ok = train_loop (&r, done + 1, error);
out:
  g_free (latest);
  run_clear (&r);
  return ok;
}
