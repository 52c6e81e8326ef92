/* SPDX-License-Identifier: MIT
 *
 * cli/train-plan.c: the plan `stowage train` runs (train-plan.h).
 */
#include "cli/train-plan.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/units.h"
#include "executor/backends/registry.h"
#include "executor/backends/tensors.h"
#include "executor/llama.h"
#include "executor/preflight.h"
#include "offload/adam.h"
#include "planner/lower.h"
#include "planner/plan-file.h"
#include "planner/search.h"
#include "planner/sim.h"
#include "program/driver.h"

static void note (StowTrainPlan *c, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static void
note (StowTrainPlan *c, const char *format, ...)
{
  if (c->notice == NULL)
    return;
  va_list ap;
  va_start (ap, format);
  g_autofree char *line = g_strdup_vprintf (format, ap);
  va_end (ap);
  c->notice (line, c->notice_user);
}

void
stow_train_plan_init (StowTrainPlan *tp)
{
  memset (tp, 0, sizeof *tp);
  stow_layout_init (&tp->layout);
  StowTraining t;
  stow_training_init (&t); /* every command's defaults */
  tp->optim = t.optim;
  tp->precision = t.precision;
  tp->seq = 256;
  tp->micro_batch = 1;
  tp->backend = "cpu";
}

void
stow_train_plan_clear (StowTrainPlan *tp)
{
  g_clear_pointer (&tp->prog, stow_program_free);
  g_clear_pointer (&tp->model, stow_model_unref);
  g_clear_pointer (&tp->cluster, stow_cluster_unref);
}

/* ---- the device ------------------------------------------------------------
 */

/* The cluster standing for this host's cpu backend: one "device" of
 * @device_bytes (an arena of host RAM) with the host's RAM and cores.
 * Its FLOP and bandwidth figures are nominal: the sim uses them for a
 * step's shape, not its length. */
static StowCluster *
cpu_cluster (guint64 device_bytes, guint threads, guint ranks)
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
  node.gpus_per_node = MAX (ranks, 1);
  node.host_ram_bytes = ram;
  node.host_mem_bw = 20e9;
  node.cpu_cores = cores;
  node.numa_nodes = 1;
  node.sockets = 1;
  StowCluster *c = stow_cluster_new (&node, 1, "cpu");
  stow_node_clear (&node);
  return c;
}

/* The cluster standing for this host's GPU under the cuda backend: the
 * catalog's figures for @device_name (as CUDA reports it) when it knows
 * the card, with @device_bytes as its memory. */
static StowCluster *
gpu_cluster (guint64 device_bytes, guint threads, const char *device_name)
{
  StowCluster *cpu = cpu_cluster (device_bytes, threads, 1);
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

/* The cluster with one drive per --nvme-dir, each of the smallest free
 * space among them, so that the search plans the NVMe tier the swap files
 * will really have (the store checks each directory again when it
 * reserves the space). */
static gboolean
with_nvme_dirs (StowTrainPlan *r, GError **error)
{
  guint n = g_strv_length (r->nvme_dirs);
  guint64 least = G_MAXUINT64;
  for (guint i = 0; i < n; i++)
    {
      const char *d = r->nvme_dirs[i];
      struct statvfs sv;
      if (statvfs (d, &sv) != 0)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "--nvme-dir %s: %s", d, g_strerror (e));
          return FALSE;
        }
      guint64 free_b = r->test_nvme_free_bytes
                           ? r->test_nvme_free_bytes
                           : (guint64)sv.f_bavail * (guint64)sv.f_frsize;
      if (free_b < least)
        least = free_b, r->nvme_least_dir = d;
    }
  r->nvme_least_bytes = least;
  StowCluster *with = stow_cluster_with_host (r->cluster, 0, TRUE, n, least);
  stow_cluster_unref (r->cluster);
  r->cluster = with;
  return TRUE;
}

/* The device's bytes for tensors: --device-memory, within what a GPU has
 * free, or half of the host's RAM; and the cluster standing for it. */
static gboolean
device_cluster (StowTrainPlan *tp, GError **error)
{
  const StowBackendKind *kind = stow_backend_kind_find (tp->backend, error);
  if (kind == NULL)
    {
      g_prefix_error (error, "--backend ");
      return FALSE;
    }
  g_autofree char *gpu_name = NULL;
  guint64 device = tp->device_memory;
  if (kind->device_info != NULL)
    {
      guint64 free_b = 0, total_b = 0;
      if (!kind->available (error)
          || !kind->device_info (&gpu_name, &free_b, &total_b, error))
        {
          g_prefix_error (error, "--backend %s: ", kind->name);
          return FALSE;
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
                       "--device-memory %s: %s has %s free for tensors", want,
                       gpu_name, have);
          return FALSE;
        }
    }
  if (device == 0)
    {
      long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
      device = pages > 0 && page > 0 ? (guint64)pages * (guint64)page / 2
                                     : (guint64)1 << 30;
    }
  tp->device_bytes = device;
  tp->cluster = kind->device_info != NULL
                    ? gpu_cluster (device, tp->threads, gpu_name)
                    : cpu_cluster (device, tp->threads, tp->ranks);
  return tp->nvme_dirs == NULL || with_nvme_dirs (tp, error);
}

/* ---- the model and the layout ----------------------------------------------
 */

static gboolean
open_model (StowTrainPlan *tp, GError **error)
{
  g_autofree char *cfg = g_build_filename (tp->model_dir, "config.json", NULL);
  StowLlamaConfig lc;
  tp->model = stow_llama_model_open (cfg, &lc, &tp->max_positions, error);
  return tp->model != NULL;
}

/* A sequence the model was not made for: rotary models would run it, but
 * past max_position_embeddings their positions were never trained. */
static gboolean
check_seq (StowTrainPlan *tp, GError **error)
{
  guint64 seq = tp->plan.training.seq_len;
  if (tp->max_positions == 0 || seq <= tp->max_positions)
    return TRUE;
  g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
               "%s %" G_GUINT64_FORMAT
               ": above max_position_embeddings (%" G_GUINT64_FORMAT
               ") of %s/config.json",
               tp->plan_path ? "the plan file's seq_len" : "--seq", seq,
               tp->max_positions, tp->model_dir);
  return FALSE;
}

/* Why a layout that fits the device does not fit this host: its host
 * buffers or its swap files, with the bytes needed and the bytes there
 * (the device's size is then beside the point). */
static gboolean
explain_host_or_nvme (const StowTrainPlan *r, const StowCandidate *miss,
                      GError **error)
{
  const StowNode *node = &r->cluster->node;
  guint64 nvme_cap = 0;
  for (guint i = 0; i < node->n_nvme; i++)
    nvme_cap += node->nvme[i].capacity_bytes;
  if (miss->nvme_bytes > nvme_cap && r->nvme_dirs != NULL)
    {
      guint n = g_strv_length (r->nvme_dirs);
      g_autofree char *need = stow_format_bytes (miss->nvme_bytes);
      g_autofree char *each = stow_format_bytes (miss->nvme_bytes / MAX (n, 1));
      g_autofree char *have = stow_format_bytes (r->nvme_least_bytes);
      g_autofree char *in_each
          = n > 1 ? g_strdup_printf (" (%s in each of %u directories)", each, n)
                  : g_strdup ("");
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--nvme-dir %s: the swap files need %s%s and %s has %s "
                   "free; free space there, stripe them over more "
                   "directories (--nvme-dir A,B), or keep the optimizer in "
                   "host memory (--offload-optimizer cpu)",
                   r->nvme_least_dir, need, in_each, r->nvme_least_dir, have);
      return FALSE;
    }
  g_autofree char *need = stow_format_bytes (miss->host_bytes);
  g_autofree char *have = stow_format_bytes (node->host_ram_bytes);
  g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
               "host memory: %s's layout fits the device but needs %s of "
               "host buffers and this host has %s of RAM; put the optimizer "
               "on NVMe (--offload-optimizer nvme --nvme-dir DIR)",
               r->model->name, need, have);
  return FALSE;
}

/* The layout: a plan file's, or the fastest that fits the device with
 * the pinned dimensions as given. */
static gboolean
plan (StowTrainPlan *r, GError **error)
{
  StowTrainPlan *c = r;
  StowPlan *plan = &r->plan;
  stow_plan_init (plan, r->model, r->cluster);
  /* The arena holds tensors only: no CUDA context, library workspaces or
   * communicators, and no caching allocator's slack. */
  StowMemOptions *mo = &plan->mem;
  mo->cuda_context_bytes = mo->workspace_bytes = 0;
  mo->nccl_bytes_per_group = 0;
  mo->fragmentation = 0;
  mo->safety_margin_bytes = 0;
  mo->host_process_bytes = 0;
  /* What the program carries for real training. */
  plan->lower.delayed_update = c->delayed_update;
  StowTraining *t = &plan->training;
  t->optim = c->optim;
  t->seq_len = c->seq;
  t->global_batch = c->global_batch;
  t->precision = c->precision;
  if (c->plan_path)
    {
      g_autoptr (StowPlanFile) pf = stow_plan_file_read (c->plan_path, error);
      if (pf == NULL)
        return FALSE;
      plan->layout = pf->layout;
      /* --resident-layers pins k over the plan's (streamed layouts). */
      if (c->layout.resident_layers != STOW_RESIDENT_AUTO
          && plan->layout.offload_params != STOW_OFFLOAD_NONE)
        plan->layout.resident_layers = c->layout.resident_layers;
      /* The plan's training shape and optimizer settings, the optimizer
       * flags given over them; the model is the directory's. */
      *t = pf->training;
      if (c->optim_flags
          && !stow_optim_flags_apply (c->optim_flags, &t->optim, error))
        return FALSE;
      t->optim.seed = c->optim.seed;
      t->optim.total_steps = MAX (t->optim.total_steps, 1);
      plan->mem = pf->mem_options;
      guint ranks = MAX (r->ranks, 1);
      if (plan->layout.dp != ranks || plan->layout.tp > 1 || plan->layout.pp > 1
          || plan->layout.cp > 1 || plan->layout.ep > 1)
        {
          g_set_error (
              error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
              "--plan %s: dp %u tp %u pp %u cp %u ep %u; this run has %u "
              "rank%s, and stowage train runs data parallelism alone (tp, "
              "pp, cp and ep 1): launch dp ranks (mpirun -np %u)",
              c->plan_path, plan->layout.dp, plan->layout.tp, plan->layout.pp,
              plan->layout.cp, plan->layout.ep, ranks, ranks == 1 ? "" : "s",
              plan->layout.dp);
          return FALSE;
        }
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
  guint ranks = MAX (c->ranks, 1);
  if (c->global_batch % (c->micro_batch * ranks) != 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--global-batch %" G_GUINT64_FORMAT
                   " is not a multiple of --micro-batch %" G_GUINT64_FORMAT
                   " x %u ranks",
                   c->global_batch, c->micro_batch, ranks);
      return FALSE;
    }
  plan->layout = c->layout;
  plan->layout.dp = ranks;
  plan->layout.micro_batch = c->micro_batch;
  plan->layout.grad_accum = c->global_batch / (c->micro_batch * ranks);
  plan->layout.engine = STOW_ENGINE_STOWAGE;
  /* The devices the run was launched on: everything but recomputation,
   * the ZeRO stage on several ranks (--zero pins it) and the offloads
   * (where the backend runs them) is fixed by them. */
  StowPins pins = (StowPins)c->pins | STOW_PIN_DP | STOW_PIN_TP | STOW_PIN_PP
                  | STOW_PIN_VPP | STOW_PIN_CP | STOW_PIN_EP | STOW_PIN_ETP
                  | STOW_PIN_SP | STOW_PIN_MICRO_BATCH | STOW_PIN_SCHEDULE
                  | STOW_PIN_OFFLOAD_OPTIMIZER | STOW_PIN_OFFLOAD_PARAMS
                  | STOW_PIN_OFFLOAD_ACTIVATIONS;
  if (ranks == 1)
    {
      /* One rank: nothing to shard (ZeRO 3 stays with streamed
       * parameters, --offload-params). */
      pins |= STOW_PIN_ZERO;
      if (plan->layout.offload_params == STOW_OFFLOAD_NONE)
        plan->layout.zero = 0;
    }
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = 1;
  g_autoptr (StowSearch) s = stow_search_run (plan, pins, &so);
  if (s->fits->len == 0)
    {
      /* The device is not always what is short. */
      if (s->have_miss && s->best_miss.headroom_bytes >= 0)
        return explain_host_or_nvme (r, &s->best_miss, error);
      if (!s->have_miss)
        {
          StowLayout pinned = plan->layout;
          if (!stow_layout_validate (&pinned, &plan->training, r->model,
                                     r->cluster, error))
            return FALSE;
        }
      g_autofree char *cap = g_format_size_full (
          r->cluster->node.gpu.total_bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *need
          = s->have_miss ? g_format_size_full (s->best_miss.total_bytes,
                                               G_FORMAT_SIZE_IEC_UNITS)
                         : g_strdup ("?");
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s does not fit a device of %s (--device-memory): the "
                   "closest layout needs %s; lower --micro-batch or --seq, "
                   "or raise --device-memory",
                   r->model->name, cap, need);
      return FALSE;
    }
  plan->layout = g_array_index (s->fits, StowCandidate, 0).layout;
  return TRUE;
}

/* The simulated step and its per-stream busy and exposed seconds, which
 * the run's own are printed beside (--stream-times). */
static void
keep_timeline (StowTrainPlan *c, const StowTrace *tr)
{
  c->predicted_step_s = tr->step_time_s;
  memcpy (c->simulated_busy_s, tr->busy_s, sizeof c->simulated_busy_s);
  memcpy (c->simulated_exposed_s, tr->exposed_s, sizeof c->simulated_exposed_s);
}

/* The simulated timeline of a GPU run whose optimizer steps on the host,
 * again at this host's measured CPU Adam rate (stow_adam_measure) instead
 * of the nominal host bandwidth: its cpu_optim stream's busy time is then
 * comparable with the run's (--stream-times).  The peaks stay the first
 * simulation's.  Without a measurement, the nominal timeline stays. */
static void
time_at_host_rate (StowTrainPlan *r)
{
  StowTrainPlan *c = r;
  g_autoptr (GError) e = NULL;
  StowAdam *adam = stow_adam_new (c->threads, STOW_ISA_AUTO, &e);
  double rate = adam ? stow_adam_measure (adam, (guint64)1 << 22, 3, &e) : 0;
  g_clear_pointer (&adam, stow_adam_free);
  if (rate <= 0)
    {
      note (c,
            "CPU Adam's rate: %s; the simulated cpu_optim stream keeps "
            "the nominal host bandwidth",
            e ? e->message : "not measured");
      return;
    }
  StowNode node;
  memset (&node, 0, sizeof node);
  stow_node_copy (&r->cluster->node, &node);
  node.host_mem_bw
      = rate * STOW_SIM_ADAM_BYTES_PER_PARAM * MAX (node.gpus_per_node, 1);
  g_autoptr (StowCluster) at
      = stow_cluster_new (&node, r->cluster->n_nodes, r->cluster->spec);
  stow_node_clear (&node);
  StowPlan on_host = r->plan;
  on_host.cluster = at;
  g_autoptr (StowBackend) sim = stow_backend_sim_new (&on_host, NULL);
  g_autoptr (StowTrace) tr = stow_program_run (r->prog, sim, NULL);
  if (tr == NULL)
    return;
  note (c,
        "CPU Adam on this host: %.2f G parameters/s (the simulated "
        "cpu_optim stream's rate)",
        rate / 1e9);
  keep_timeline (c, tr);
}

/* ---- the program and its simulated step ------------------------------------
 */

/* Lowers the layout and simulates the program once: it is validated, and
 * the predicted peaks and step are there to compare with the run's; then
 * the host's preflight on the simulated peaks. */
static gboolean
lower (StowTrainPlan *tp, GError **error)
{
  if (!stow_plan_resolve_resident (&tp->plan, error))
    return FALSE;
  tp->prog = stow_lower (&tp->plan, error);
  if (tp->prog == NULL)
    return FALSE;
  gboolean cuda = !g_str_equal (tp->backend, "cpu");
  g_autoptr (StowBackend) sim = stow_backend_sim_new (&tp->plan, NULL);
  g_autoptr (StowTrace) tr = stow_program_run (tp->prog, sim, error);
  if (tr == NULL)
    return FALSE;
  tp->predicted_peak_bytes = tr->peak_bytes[STOW_TIER_DEVICE];
  tp->predicted_pinned_bytes = tr->peak_bytes[STOW_TIER_PINNED];
  keep_timeline (tp, tr);
  if (cuda && tp->plan.layout.offload_optimizer != STOW_OFFLOAD_NONE)
    time_at_host_rate (tp);
  g_autofree char *unpinned = NULL;
  if (!stow_preflight_host (tr, cuda, error)
      || (!cuda
          && !stow_preflight_memlock (tp->prog, tr, tp->test_memlock_limit,
                                      tp->allow_unpinned, &unpinned, error)))
    return FALSE;
  if (unpinned != NULL)
    note (tp, "%s", unpinned);
  tp->no_pin = unpinned != NULL;
  return TRUE;
}

gboolean
stow_train_plan (StowTrainPlan *tp, GError **error)
{
  if (tp->global_batch == 0)
    tp->global_batch = tp->micro_batch * MAX (tp->ranks, 1);
  if (!device_cluster (tp, error) || !open_model (tp, error)
      || !plan (tp, error) || !check_seq (tp, error) || !lower (tp, error))
    return FALSE;
  g_autofree char *cap
      = g_format_size_full (tp->device_bytes, G_FORMAT_SIZE_IEC_UNITS);
  g_autofree char *peak
      = g_format_size_full (tp->predicted_peak_bytes, G_FORMAT_SIZE_IEC_UNITS);
  note (tp, "%s layout: %s; device %s (--device-memory), predicted peak %s",
        tp->plan_path ? "plan file's" : "planned", tp->prog->description, cap,
        peak);
  return TRUE;
}
