/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-train.c: `stowage train` (executor/train.c runs it) and
 * `stowage init-model` (a randomly initialised checkpoint HF transformers
 * loads).  Flags are parsed and checked here, naming the flag and value.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/corpus.h"
#include "cli/model-source.h"
#include "cli/plan-options.h"
#include "cli/train-plan.h"
#include "core/json.h"
#include "core/units.h"
#include "executor/backends/registry.h"
#include "executor/backends/tensors.h"
#include "executor/comm/launch.h"
#include "executor/comm/mpi.h"
#include "executor/model-io.h"
#include "executor/train.h"
#include "offload/nvme.h"
#include "planner/search.h"

typedef struct
{
  /* The layout, shape and optimizer flags train shares with fit, mem,
   * plan and simulate (--seq, --micro-batch, --global-batch, --precision,
   * --recompute, --offload-optimizer, --offload-params, --resident-layers,
   * and --lr ... --steps in po.optim): parsed by the same code
   * (cli/plan-options.c). */
  StowPlanOptions po;
  char *model, *data, *plan, *seed, *out, *save_every, *max_skipped_steps,
      *log_json, *trace, *backend, *device_memory, *tokenizer, *resume_from,
      *save_on_signal, *threads, *test_copy_delay_us, *test_nvme_fault,
      *test_die_at, *test_memlock_limit, *test_nvme_free, *save_dtype,
      *max_shard_size, *keep_last, *val_data, *eval_every, *eval_batches, *rank,
      *world_size, *init, *reduction;
  char **nvme_dirs;
  char *revision; /* --revision: of a Hub id --model */
  gboolean resume, overwrite, shuffle, delayed_update, stream_times,
      allow_unpinned, ignore_extra_tensors;
} TrainOptions;

/* --test-nvme-fault KIND:N: the Nth I/O request to the optimizer's swap
 * files from the first step on fails as KIND, so that tests can check a
 * run stops with the file and offset named and its checkpoints intact. */
static gboolean
parse_nvme_fault (const char *v, StowTrainConfig *c, GError **error)
{
  static const struct
  {
    const char *name;
    StowNvmeFault fault;
  } kinds[] = { { "eio", STOW_NVME_FAULT_EIO },
                { "enospc", STOW_NVME_FAULT_ENOSPC },
                { "short", STOW_NVME_FAULT_SHORT },
                { "short-eof", STOW_NVME_FAULT_SHORT_EOF } };
  g_auto (GStrv) kv = g_strsplit (v, ":", 2);
  guint64 nth = 0;
  for (guint i = 0; kv[0] && kv[1] && i < G_N_ELEMENTS (kinds); i++)
    if (g_str_equal (kv[0], kinds[i].name)
        && stow_parse_count (kv[1], &nth, NULL) && nth > 0)
      {
        c->nvme_fault = kinds[i].fault, c->nvme_fault_nth = nth;
        return TRUE;
      }
  g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
               "--test-nvme-fault \"%s\": expected KIND:N, KIND one of eio, "
               "enospc, short, short-eof",
               v);
  return FALSE;
}

static gboolean
parse_u64 (const char *flag, const char *v, gboolean zero_ok, guint64 *out,
           GError **error)
{
  if (v == NULL)
    return TRUE;
  g_autoptr (GError) local = NULL;
  if (!stow_parse_count (v, out, &local) || (*out == 0 && !zero_ok))
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s \"%s\": expected a count%s", flag, v,
                   zero_ok ? "" : " of at least 1");
      return FALSE;
    }
  return TRUE;
}

/* --save-dtype, --max-shard-size, --keep-last: how checkpoints are
 * written and how many stay. */
static gboolean
parse_save (const TrainOptions *o, StowTrainConfig *run, GError **error)
{
  if (o->save_dtype != NULL)
    {
      StowDtype *d = &run->save_format.dtype;
      if (!stow_dtype_from_nick (o->save_dtype, d)
          || (*d != STOW_DTYPE_F32 && *d != STOW_DTYPE_BF16))
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--save-dtype \"%s\": expected fp32 or bf16",
                       o->save_dtype);
          return FALSE;
        }
    }
  if (o->max_shard_size != NULL)
    {
      g_autoptr (GError) local = NULL;
      if (!stow_parse_size (o->max_shard_size,
                            &run->save_format.max_shard_bytes, &local))
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--max-shard-size \"%s\": %s", o->max_shard_size,
                       local->message);
          return FALSE;
        }
    }
  guint64 keep = 0;
  if (!parse_u64 ("--keep-last", o->keep_last, TRUE, &keep, error))
    return FALSE;
  run->keep_last = (guint)MIN (keep, G_MAXUINT);
  run->ignore_extra_tensors = o->ignore_extra_tensors;
  run->val_data = o->val_data;
  if (!parse_u64 ("--eval-every", o->eval_every, TRUE, &run->eval_every, error)
      || !parse_u64 ("--eval-batches", o->eval_batches, TRUE,
                     &run->eval_batches, error))
    return FALSE;
  if ((o->eval_every || o->eval_batches) && o->val_data == NULL)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s needs --val-data FILES",
                   o->eval_every ? "--eval-every" : "--eval-batches");
      return FALSE;
    }
  return TRUE;
}

/* An output file @flag names can be written when the run gets there:
 * its directory takes new files (the trace is written atomically, a new
 * file renamed over the path), and the path is not a directory.  The
 * directory may be --out (@out), which the run creates.  Checked before
 * anything is planned, so that a run never fails after its last step
 * for a typo. */
static gboolean
check_writable (const char *flag, const char *path, const char *out,
                GError **error)
{
  if (path == NULL)
    return TRUE;
  g_autofree char *dir = g_path_get_dirname (path);
  g_autofree char *dir_c = g_canonicalize_filename (dir, NULL);
  g_autofree char *out_c = out ? g_canonicalize_filename (out, NULL) : NULL;
  /* --out's nearest existing ancestor stands for it. */
  g_autofree char *probe = g_strdup (dir);
  while (out_c && g_str_equal (dir_c, out_c)
         && !g_file_test (probe, G_FILE_TEST_EXISTS))
    {
      char *up = g_path_get_dirname (probe);
      gboolean top = g_str_equal (up, probe);
      g_free (probe);
      probe = up;
      if (top)
        break;
    }
  const char *why = NULL;
  int e = 0;
  if (path[0] == '\0')
    why = "an empty path";
  else if (g_file_test (path, G_FILE_TEST_IS_DIR))
    why = "a directory";
  else if (access (probe, W_OK | X_OK) != 0)
    e = errno;
  if (why == NULL && e == 0)
    return TRUE;
  g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
               "%s %s: %s%s%s", flag, path, why ? why : probe, why ? "" : ": ",
               why ? "" : g_strerror (e));
  return FALSE;
}

/* The flags a run cannot do without, checked before anything is planned;
 * the optimizer's schedule ends at the last step. */
static gboolean
check_required (const TrainOptions *o, StowTrainPlan *c,
                const StowTrainConfig *run, GError **error)
{
  const char *bad = NULL;
  if (run->model_dir == NULL)
    bad = "--model DIR is required";
  else if (run->data == NULL)
    bad = "--data FILES is required";
  else if (run->out_dir == NULL)
    bad = "--out DIR is required";
  else if (o->po.optim.steps == NULL)
    bad = "--steps N is required: the optimizer steps the run ends at";
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
  c->optim.total_steps = run->steps;
  return TRUE;
}

/* The flags into what to plan (@c) and how to run it (@run); errors name
 * the flag and the value. */
static gboolean
resolve (TrainOptions *o, StowTrainPlan *c, StowTrainConfig *run,
         GError **error)
{
  c->model_dir = run->model_dir = o->model;
  run->data = o->data;
  c->plan_path = o->plan;
  run->out_dir = o->out;
  run->resume = o->resume;
  run->resume_from = o->resume_from;
  run->overwrite = o->overwrite;
  if (o->overwrite && o->resume)
    {
      g_set_error_literal (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           "--overwrite and --resume: --resume continues "
                           "OUT's run, --overwrite replaces it; choose one");
      return FALSE;
    }
  if (o->resume_from && o->resume_from[0] == '\0')
    {
      g_set_error_literal (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           "--resume-from \"\": expected a checkpoint "
                           "directory or a step of --out");
      return FALSE;
    }
  if (o->save_on_signal && !g_str_equal (o->save_on_signal, "on")
      && !g_str_equal (o->save_on_signal, "off"))
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--save-on-signal \"%s\": expected on or off",
                   o->save_on_signal);
      return FALSE;
    }
  if (o->reduction && g_str_equal (o->reduction, "native"))
    run->reduction = STOW_COMM_NATIVE;
  else if (o->reduction && !g_str_equal (o->reduction, "deterministic"))
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--reduction \"%s\": expected deterministic or native",
                   o->reduction);
      return FALSE;
    }
  run->shuffle = o->shuffle;
  run->log_json = o->log_json;
  run->trace_path = o->trace;
  run->stream_times = o->stream_times;
  c->allow_unpinned = o->allow_unpinned;
  if (o->backend)
    c->backend = o->backend;
  run->backend = c->backend;
  guint64 threads = 0;
  guint64 seed = 0;
  if (!parse_save (o, run, error)
      || !parse_u64 ("--seed", o->seed, TRUE, &seed, error)
      || !parse_u64 ("--max-skipped-steps", o->max_skipped_steps, TRUE,
                     &run->max_skipped_steps, error)
      || !parse_u64 ("--save-every", o->save_every, TRUE, &run->save_every,
                     error)
      || !parse_u64 ("--threads", o->threads, TRUE, &threads, error))
    return FALSE;
  /* More compute threads than processors only take turns, and each holds
   * its own scratch. */
  guint procs = MAX (1u, g_get_num_processors ());
  if (threads > procs)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--threads %" G_GUINT64_FORMAT
                   ": this process may run on %u processors; 1 to %u",
                   threads, procs, procs);
      return FALSE;
    }
  if (!check_writable ("--trace", o->trace, o->out, error)
      || !check_writable ("--log-json", o->log_json, o->out, error))
    return FALSE;
  c->threads = run->threads = (guint)threads;
  if (o->test_nvme_fault && !parse_nvme_fault (o->test_nvme_fault, run, error))
    return FALSE;
  if (o->test_memlock_limit)
    {
      g_autoptr (GError) local = NULL;
      if (!stow_parse_size (o->test_memlock_limit, &c->test_memlock_limit,
                            &local)
          || c->test_memlock_limit == 0)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--test-memlock-limit \"%s\": %s", o->test_memlock_limit,
                       local ? local->message : "a size above 0");
          return FALSE;
        }
    }
  if (o->test_nvme_free)
    {
      g_autoptr (GError) local = NULL;
      if (!stow_parse_size (o->test_nvme_free, &c->test_nvme_free_bytes, &local)
          || c->test_nvme_free_bytes == 0)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--test-nvme-free \"%s\": %s", o->test_nvme_free,
                       local ? local->message : "a size above 0");
          return FALSE;
        }
    }
  if (o->test_die_at)
    {
      /* RANK:STEP */
      guint64 rank = 0, step = 0;
      g_auto (GStrv) rs = g_strsplit (o->test_die_at, ":", 2);
      if (g_strv_length (rs) != 2
          || !parse_u64 ("--test-die-at", rs[0], TRUE, &rank, error)
          || !parse_u64 ("--test-die-at", rs[1], FALSE, &step, error)
          || rank > G_MAXINT)
        {
          if (error && *error == NULL)
            g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                         "--test-die-at \"%s\": expected RANK:STEP",
                         o->test_die_at);
          return FALSE;
        }
      run->test_die_rank = (guint)rank, run->test_die_step = step;
    }
  if (o->test_copy_delay_us)
    {
      guint64 us = 0;
      if (!parse_u64 ("--test-copy-delay-us", o->test_copy_delay_us, TRUE, &us,
                      error))
        return FALSE;
      if (us > 10000000 || g_strcmp0 (c->backend, "cpu") != 0)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--test-copy-delay-us %s: a knob of the cpu backend, "
                       "at most 10 s",
                       o->test_copy_delay_us);
          return FALSE;
        }
      run->copy_delay_us = (guint)us;
    }
  /* The shape, placement and optimizer flags, as every planning command
   * parses them; train's own default --seq 256 where not given, one step
   * without --steps, and --seed (the data order). */
  StowPlanOptions *po = &o->po;
  if (!stow_plan_options_parse_shape (po, error))
    return FALSE;
  c->optim = po->plan.training.optim;
  c->optim.seed = seed;
  c->optim_flags = &po->optim;
  run->steps = c->optim.total_steps;
  c->layout = po->plan.layout;
  c->pins = po->pins;
  c->seq = po->seq ? po->plan.training.seq_len : 256;
  c->micro_batch = po->plan.layout.micro_batch;
  c->global_batch = po->plan.training.global_batch;
  c->precision = po->plan.training.precision;
  if (c->precision != STOW_PRECISION_FP32
      && c->precision != STOW_PRECISION_BF16)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--precision %s: stowage train runs fp32 or bf16",
                   po->precision);
      return FALSE;
    }
  if (o->device_memory)
    {
      g_autoptr (GError) local = NULL;
      if (!stow_parse_size (o->device_memory, &c->device_memory, &local)
          || c->device_memory == 0)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--device-memory \"%s\": %s", o->device_memory,
                       local ? local->message : "must be more than 0");
          return FALSE;
        }
    }
  if (o->tokenizer)
    {
      if (g_str_equal (o->tokenizer, "bytes"))
        run->tokenizer = STOW_TOKENIZER_BYTES;
      else if (g_str_equal (o->tokenizer, "none"))
        run->tokenizer = STOW_TOKENIZER_NONE;
      else if (!g_file_test (o->tokenizer, G_FILE_TEST_EXISTS))
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--tokenizer \"%s\": expected a model directory or a "
                       "tokenizer.json, bytes (a plain text file, one token "
                       "per byte) or none (llm.c token shards)",
                       o->tokenizer);
          return FALSE;
        }
    }
  if (c->layout.offload_params != STOW_OFFLOAD_NONE)
    {
      if (c->layout.offload_optimizer == STOW_OFFLOAD_NONE)
        {
          g_set_error_literal (
              error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
              "--offload-params needs --offload-optimizer cpu or nvme: "
              "the weights are updated where they live");
          return FALSE;
        }
      /* Parameters off the device are ZeRO stage 3's. */
      c->layout.zero = 3;
    }
  if (po->resident_layers && c->layout.offload_params == STOW_OFFLOAD_NONE)
    {
      g_set_error_literal (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           "--resident-layers is for --offload-params");
      return FALSE;
    }
  if (o->delayed_update)
    {
      if (c->layout.offload_optimizer != STOW_OFFLOAD_CPU
          || c->layout.offload_params != STOW_OFFLOAD_NONE)
        {
          g_set_error_literal (
              error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
              "--delayed-update is ZeRO-Offload's: it runs with "
              "--offload-optimizer cpu and the parameters on the device");
          return FALSE;
        }
      c->delayed_update = run->delayed_update = TRUE;
    }
  /* --nvme-dir A,B --nvme-dir C: every directory, in order. */
  g_autoptr (GPtrArray) dirs = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; o->nvme_dirs && o->nvme_dirs[i]; i++)
    {
      g_auto (GStrv) parts = g_strsplit (o->nvme_dirs[i], ",", -1);
      for (guint j = 0; parts[j]; j++)
        {
          if (parts[j][0] == '\0')
            {
              g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           "--nvme-dir \"%s\": an empty directory name",
                           o->nvme_dirs[i]);
              return FALSE;
            }
          g_ptr_array_add (dirs, g_strdup (parts[j]));
        }
    }
  gboolean nvme_opt = c->layout.offload_optimizer == STOW_OFFLOAD_NVME;
  gboolean nvme_par = c->layout.offload_params == STOW_OFFLOAD_NVME;
  if ((nvme_opt || nvme_par) != (dirs->len > 0))
    {
      g_set_error_literal (
          error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
          nvme_opt   ? "--offload-optimizer nvme needs --nvme-dir "
                       "DIR[,DIR...]: where the swap files go"
          : nvme_par ? "--offload-params nvme needs --nvme-dir DIR[,DIR...]: "
                       "where the swap files go"
                     : "--nvme-dir is for --offload-optimizer nvme and "
                       "--offload-params nvme");
      return FALSE;
    }
  if (dirs->len > 0)
    {
      g_ptr_array_add (dirs, NULL);
      c->nvme_dirs = run->nvme_dirs
          = (char **)g_ptr_array_free (g_steal_pointer (&dirs), FALSE);
    }
  return check_required (o, c, run, error);
}

/* ---- preemption ---------------------------------------------------------
 * SIGTERM (what Slurm and Kubernetes send before a kill) and SIGUSR1
 * (Slurm's --signal) ask the run to stop at the next step boundary with a
 * checkpoint: the handler only records the signal (async-signal-safe);
 * the loop finishes the step in flight, saves it and returns, everything
 * is freed (the NVMe swap files, OUT's lock), and then the signal is
 * raised again with its default action, so that the exit status is the
 * signal's.  A second signal ends the process at once, as main.c's
 * handler would (the swap files removed, the last complete checkpoint in
 * place). */

static volatile sig_atomic_t stop_signal;

static void
on_stop_signal (int sig)
{
  if (stop_signal != 0)
    {
      stow_nvme_remove_files_on_signal ();
      signal (sig, SIG_DFL);
      raise (sig);
      return;
    }
  stop_signal = sig;
  static const char msg[]
      = "stowage: stopping after this step with a checkpoint (a second "
        "signal stops at once)\n";
  ssize_t n = write (2, msg, sizeof msg - 1);
  (void)n;
}

static void
catch_stop_signals (void)
{
  static const int sigs[] = { SIGTERM, SIGUSR1 };
  for (gsize i = 0; i < G_N_ELEMENTS (sigs); i++)
    {
      struct sigaction sa, old;
      memset (&sa, 0, sizeof sa);
      sa.sa_handler = on_stop_signal;
      sa.sa_flags = SA_RESTART;
      sigemptyset (&sa.sa_mask);
      if (sigaction (sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
        continue;
      sigaction (sigs[i], &sa, NULL);
    }
}

typedef struct
{
  gboolean tty;
  gboolean clipping; /* else the norm is not computed: "clipping off" */
} Progress;

static void
progress (const StowTrainStep *s, gpointer user)
{
  Progress *p = user;
  g_autofree char *eta = stow_format_duration (s->eta_s);
  GString *line = g_string_new (NULL);
  if (p->tty)
    {
      /* A bar of 20 cells on a terminal. */
      guint filled = (guint)(20 * s->step / MAX (s->steps, 1));
      g_string_append_c (line, '[');
      for (guint i = 0; i < 20; i++)
        g_string_append_c (line, i < filled ? '#' : '.');
      g_string_append (line, "] ");
    }
  g_autofree char *norm = p->clipping
                              ? g_strdup_printf ("grad norm %.4g", s->grad_norm)
                              : g_strdup ("clipping off");
  g_string_append_printf (
      line,
      "step %" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT
      "  loss %.4f  %s  lr %.3g  %.0f tokens/s  ETA %s%s%s",
      s->step, s->steps, s->loss, norm, s->lr, s->tokens_per_s, eta,
      s->skipped ? "  (non-finite gradients: step skipped)" : "",
      s->saved ? "  saved" : "");
  if (!isnan (s->val_loss))
    g_string_append_printf (line, "  val loss %.4f  ppl %.4g", s->val_loss,
                            exp (s->val_loss));
  fprintf (stderr, "%s\n", line->str);
  g_string_free (line, TRUE);
}

static void
notice (const char *line, gpointer user)
{
  fprintf (stderr, "%s\n", line);
}

/* Busy and exposed seconds per stream of the last step, measured beside
 * simulated: the streams busy in either, then the step. */
static void
print_stream_times (const StowTrainPlan *tp, const StowTrainResult *m)
{
  if (m->step_s <= 0)
    {
      fprintf (stderr, "streams: no step ran\n");
      return;
    }
  fprintf (stderr, "streams (last step): busy / exposed s, measured | "
                   "simulated\n");
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      if (m->busy_s[s] <= 0 && tp->simulated_busy_s[s] <= 0)
        continue;
      fprintf (stderr, "  %-10s %10.4f %10.4f  | %10.4f %10.4f\n",
               stow_stream_name (s), m->busy_s[s], m->exposed_s[s],
               tp->simulated_busy_s[s], tp->simulated_exposed_s[s]);
    }
  fprintf (stderr, "  %-10s %10.4f %10s  | %10.4f\n", "step", m->step_s, "",
           tp->predicted_step_s);
}

/* The measured peaks beside the simulated ones. */
static void
print_peaks (const StowTrainPlan *tp, const StowTrainResult *m)
{
  g_autofree char *pred = stow_format_bytes (tp->predicted_peak_bytes);
  g_autofree char *meas = stow_format_bytes (m->peak_bytes);
  fprintf (stderr, "device peak: %s measured, %s simulated (%+.2f%%)\n", meas,
           pred,
           tp->predicted_peak_bytes
               ? 100.0
                     * ((double)m->peak_bytes / (double)tp->predicted_peak_bytes
                        - 1.0)
               : 0.0);
  if (tp->predicted_pinned_bytes > 0 && m->pinned_peak_bytes > 0)
    {
      g_autofree char *hp = stow_format_bytes (tp->predicted_pinned_bytes);
      g_autofree char *hm = stow_format_bytes (m->pinned_peak_bytes);
      fprintf (stderr,
               "pinned host peak: %s measured, %s simulated (%+.2f%%)\n", hm,
               hp,
               100.0
                   * ((double)m->pinned_peak_bytes
                          / (double)tp->predicted_pinned_bytes
                      - 1.0));
    }
}

/* --log-json and --trace on rank @rank: "{rank}" in @path becomes the
 * rank; a path without it is rank 0's alone (NULL elsewhere). */
static const char *
rank_path (const char *path, int rank, char **owned)
{
  if (path == NULL)
    return NULL;
  if (strstr (path, "{rank}") == NULL)
    return rank == 0 ? path : NULL;
  g_autofree char *r = g_strdup_printf ("%d", rank);
  g_auto (GStrv) parts = g_strsplit (path, "{rank}", -1);
  *owned = g_strjoinv (r, parts);
  return *owned;
}

/* Several ranks: the cpu backend's, over MPI (mpirun, or srun with
 * PMIx), whose rank and size must be the launcher's. */
static gboolean
join_ranks (StowTrainConfig *c, StowTrainPlan *tp, int world, int rank,
            const char *from, const char *init, GError **error)
{
  if (g_strcmp0 (c->backend, "cpu") != 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "train: %d ranks (from %s) with --backend %s: several "
                   "ranks run on the cpu backend over MPI; the cuda "
                   "backend's NCCL ranks are not run yet",
                   world, from, c->backend);
      return FALSE;
    }
  if (g_strcmp0 (from, "mpirun") != 0 && g_strcmp0 (from, "slurm") != 0
      && g_strcmp0 (init, "mpi") == 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "train: %d ranks (from %s): the cpu backend's ranks are "
                   "MPI processes; launch them with mpirun -np %d (or srun)",
                   world, from, world);
      return FALSE;
    }
  if (g_strcmp0 (init, "mpi") != 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "train: %d ranks (from %s) meeting at %s: the cpu "
                   "backend's ranks meet over MPI; launch them with mpirun "
                   "(or srun with PMIx), --init mpi",
                   world, from, init);
      return FALSE;
    }
  c->comm = stow_comm_mpi_new (error);
  if (c->comm == NULL)
    return FALSE;
  if (stow_comm_world_size (c->comm) != world
      || stow_comm_rank (c->comm) != rank)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "train: rank %d of %d (from %s), but MPI says rank %d of "
                   "%d; launch with mpirun -np %d, or leave --rank and "
                   "--world-size to it",
                   rank, world, from, stow_comm_rank (c->comm),
                   stow_comm_world_size (c->comm), world);
      return FALSE;
    }
  tp->ranks = (guint)world;
  return TRUE;
}

static int
train_main (TrainOptions *o, StowTrainPlan *tp, StowTrainConfig *c,
            const GOptionEntry *entries, int argc, char **argv, int *stopped_by)
{
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "train", NULL,
      "Train a LLaMA-family model on this machine: the plan (a plan file, or "
      "the fastest layout that fits the device) lowered to its step program "
      "and run for real, with checkpoints that survive any crash.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  stow_optim_flags_add (NULL, ctx, &o->po.optim);
  g_autoptr (GError) error = NULL;
  if (!stow_cli_parse (ctx, "train", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage train --help'",
                           "train: unexpected argument \"%s\"", argv[1]);
  /* Which rank of how many: the launcher's environment, the flags over
   * it.  One rank runs (issue 38's collectives are executor/comm/; the
   * training loop does not use them yet). */
  g_auto (GStrv) env = g_get_environ ();
  const StowLaunchFlags lf = { o->rank, o->world_size, o->init };
  StowLaunch launch;
  if (!stow_launch_resolve ((const char *const *)env, &lf, &launch, &error))
    return stow_cli_fail (error, "see 'stowage train --help'");
  int world = launch.world_size, rank = launch.rank;
  g_autofree char *from = g_strdup (stow_launch_source_name (launch.source));
  g_autofree char *init = g_strdup (launch.init);
  stow_launch_clear (&launch);
  if (!resolve (o, tp, c, &error))
    return stow_cli_fail (error, "see 'stowage train --help'");
  if (world > 1 && !join_ranks (c, tp, world, rank, from, init, &error))
    return stow_cli_fail (error, NULL);
  if (rank > 0)
    {
      /* Rank 0 prints; the others write their own log and trace where
       * the path says {rank}. */
      c->log_json = rank_path (o->log_json, rank, &c->log_json_owned);
      c->trace_path = rank_path (o->trace, rank, &c->trace_owned);
    }
  else
    {
      c->log_json = rank_path (o->log_json, 0, &c->log_json_owned);
      c->trace_path = rank_path (o->trace, 0, &c->trace_owned);
    }
  g_autofree char *model_dir
      = stow_cli_model_dir (o->model, o->revision, &error);
  if (model_dir == NULL)
    return stow_cli_fail (error, NULL);
  tp->model_dir = c->model_dir = model_dir;
  /* Text and JSONL: tokenized first, with the model's tokenizer. */
  g_autofree char *tokens = NULL, *val_tokens = NULL;
  if (c->tokenizer == STOW_TOKENIZER_NONE)
    {
      const char *tok = o->tokenizer && !g_str_equal (o->tokenizer, "none")
                            ? o->tokenizer
                            : NULL;
      tokens = stow_cli_train_tokens ("--data", c->data, tok, model_dir,
                                      c->threads, &error);
      if (tokens == NULL && error != NULL)
        return stow_cli_fail (error, NULL);
      if (c->val_data != NULL)
        val_tokens = stow_cli_train_tokens ("--val-data", c->val_data, tok,
                                            model_dir, c->threads, &error);
      if (val_tokens == NULL && error != NULL)
        return stow_cli_fail (error, NULL);
      c->data = tokens ? tokens : c->data;
      c->val_data = val_tokens ? val_tokens : c->val_data;
    }
  if (g_strcmp0 (o->save_on_signal, "off") != 0)
    {
      catch_stop_signals ();
      c->stop_signal = &stop_signal;
    }
  Progress pr = { isatty (2) };
  c->progress = rank == 0 ? progress : NULL;
  c->notice = tp->notice = rank == 0 ? notice : NULL;
  c->progress_user = tp->notice_user = &pr;
  const char *shared = g_getenv ("STOWAGE_SET_OMP_WAIT_POLICY");
  if (shared != NULL && rank == 0)
    notice ("OpenMP threads wait passively (OMP_WAIT_POLICY=passive): "
            "ranks on this node share its cores",
            &pr);
  if (!stow_train_plan (tp, &error))
    return stow_cli_fail (error, NULL);
  /* The run's settings as planned (a plan file's, with the flags over). */
  c->steps = tp->plan.training.optim.total_steps;
  pr.clipping
      = tp->plan.training.optim.max_grad_norm > 0 && !tp->delayed_update;
  c->program = tp->prog;
  c->model = tp->model;
  c->device_memory = tp->device_bytes;
  c->no_pin = tp->no_pin;
  memcpy (c->simulated_busy_s, tp->simulated_busy_s,
          sizeof c->simulated_busy_s);
  memcpy (c->simulated_exposed_s, tp->simulated_exposed_s,
          sizeof c->simulated_exposed_s);
  StowTrainResult m;
  if (!stow_train_run (c, &m, &error))
    return stow_cli_fail (error, NULL);
  if (m.stopped_by != 0)
    {
      if (m.saved_step > 0)
        fprintf (stderr,
                 "stopped at step %" G_GUINT64_FORMAT
                 "; continue with --resume\n",
                 m.saved_step);
      else
        fprintf (stderr, "stopped before step 1; nothing to save\n");
      *stopped_by = m.stopped_by;
    }
  if (m.last_step < m.first_step)
    return STOW_EXIT_OK; /* no step ran: no peaks to compare */
  print_peaks (tp, &m);
  if (c->stream_times)
    print_stream_times (tp, &m);
  if (!isnan (m.val_loss))
    fprintf (stderr,
             "validation: loss %.4f, perplexity %.4g (%" G_GUINT64_FORMAT
             " batches, %" G_GUINT64_FORMAT " targets of %s)\n",
             m.val_loss, exp (m.val_loss), m.val_batches, m.val_targets,
             c->val_data);
  return STOW_EXIT_OK;
}

/* Several ranks share a node's cores: OpenMP threads that spin while they
 * wait (libgomp's default) take the cores the other ranks compute on,
 * which made 4 ranks on 2 cores 28 times slower (62 against 1,748
 * tokens/s).  libgomp reads OMP_WAIT_POLICY once, when it is loaded, so a
 * rank launched without it sets it to passive and starts itself again
 * (the same process, before MPI is initialised).  Not when the user
 * chose a policy. */
static void
passive_waits_for_ranks (void)
{
  const char *size = g_getenv ("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (size == NULL)
    size = g_getenv ("LOCAL_WORLD_SIZE"); /* torchrun's */
  if (size == NULL || g_ascii_strtoull (size, NULL, 10) < 2
      || g_getenv ("OMP_WAIT_POLICY") != NULL)
    return;
  g_autofree char *cmdline = NULL;
  gsize len = 0;
  if (!g_file_get_contents ("/proc/self/cmdline", &cmdline, &len, NULL)
      || len == 0)
    return;
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  for (gsize i = 0; i < len; i += strlen (cmdline + i) + 1)
    g_ptr_array_add (args, cmdline + i);
  g_ptr_array_add (args, NULL);
  g_setenv ("OMP_WAIT_POLICY", "passive", TRUE);
  g_setenv ("STOWAGE_SET_OMP_WAIT_POLICY", size, TRUE);
  execv ("/proc/self/exe", (char **)args->pdata);
  /* Still here: the exec failed; run with what libgomp has. */
}

int
stow_cmd_train (int argc, char **argv)
{
  passive_waits_for_ranks ();
  TrainOptions o = { 0 };
  const GOptionEntry entries[] = {
    { "model", 0, 0, G_OPTION_ARG_FILENAME, &o.model,
      "Model directory (config.json and the safetensors: one file, or "
      "shards and their index), or a Hub id, whose files are downloaded "
      "into the Hugging Face cache (HF_HUB_CACHE or HF_HOME/hub) unless "
      "there already",
      "DIR|ORG/NAME" },
    { "revision", 0, 0, G_OPTION_ARG_STRING, &o.revision,
      "With a Hub id: a branch, tag or commit (main)", "REV" },
    { "data", 0, 0, G_OPTION_ARG_FILENAME, &o.data,
      "llm.c token shards (*.bin: a file, a glob, or several joined by ','), "
      "or text and JSONL files, tokenized first with the model's tokenizer "
      "(JSONL: a text field, or prompt and completion, trained on the "
      "completions)",
      "FILES" },
    { "tokenizer", 0, 0, G_OPTION_ARG_STRING, &o.tokenizer,
      "For text and JSONL --data: a model directory, tokenizer.json or "
      "Hub id (default: --model's tokenizer.json), or bytes: one token per "
      "byte (vocab >= 256)",
      "DIR|FILE|ORG/NAME|bytes" },
    { "shuffle", 0, 0, G_OPTION_ARG_NONE, &o.shuffle,
      "Permute the micro-batch windows of each pass over the data (seeded)",
      NULL },
    { "test-die-at", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING,
      &o.test_die_at,
      "Test knob: rank RANK kills itself (SIGKILL) after logging step STEP",
      "RANK:STEP" },
    { "zero", 0, 0, G_OPTION_ARG_STRING, &o.po.zero,
      "ZeRO stage 0-3 over the ranks the run was launched with, as stowage "
      "mem spells it (default: the plan's; one rank: 0)",
      "0|1|2|3" },
    { "plan", 0, 0, G_OPTION_ARG_FILENAME, &o.plan,
      "Run the layout of a plan file (stowage fit --emit plan)", "FILE" },
    { "recompute", 0, 0, G_OPTION_ARG_STRING, &o.po.recompute,
      "none, full or full:K (default: what fits fastest)", "MODE" },
    { "offload-optimizer", 0, 0, G_OPTION_ARG_STRING, &o.po.offload_optimizer,
      "none (default), cpu: fp32 master weights, Adam states and a copy "
      "of the gradients in host memory, CPU Adam (ZeRO-Offload), or nvme: "
      "the master weights and Adam states in swap files (ZeRO-Infinity)",
      "WHERE" },
    { "offload-params", 0, 0, G_OPTION_ARG_STRING, &o.po.offload_params,
      "none (default), cpu or nvme: the weights live in host memory or "
      "on NVMe (--nvme-dir, with --precision bf16) and stream through two "
      "layer slots on the device, but --resident-layers (ZeRO-3 with "
      "parameter offload; needs --offload-optimizer)",
      "WHERE" },
    { "delayed-update", 0, 0, G_OPTION_ARG_NONE, &o.delayed_update,
      "With --offload-optimizer cpu: each step's CPU Adam applies the "
      "previous step's gradients while this step computes (ZeRO-Offload's "
      "one-step delayed update; no clipping)",
      NULL },
    { "resident-layers", 0, 0, G_OPTION_ARG_STRING, &o.po.resident_layers,
      "With --offload-params: layers kept on the device (default: as "
      "many as fit, the plan's choice)",
      "K" },
    { "nvme-dir", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &o.nvme_dirs,
      "Where --offload-optimizer nvme and --offload-params nvme keep their "
      "swap files (a private 0700 "
      "directory in each, removed at exit); several, joined by ',' or "
      "repeated, are striped",
      "DIR[,DIR...]" },
    { "seq", 0, 0, G_OPTION_ARG_STRING, &o.po.seq,
      "Sequence length in tokens (default 256)", "T" },
    { "micro-batch", 0, 0, G_OPTION_ARG_STRING, &o.po.micro_batch,
      "Sequences per micro-batch (default 1)", "B" },
    { "global-batch", 0, 0, G_OPTION_ARG_STRING, &o.po.global_batch,
      "Sequences per optimizer step (default: one micro-batch)", "G" },
    { "precision", 0, 0, G_OPTION_ARG_STRING, &o.po.precision,
      "bf16 (default, as every command: bf16 weights, gradients and "
      "activations, fp32 master weights and Adam states) or fp32",
      "P" },
    { "seed", 0, 0, G_OPTION_ARG_STRING, &o.seed,
      "Seed of the data order (--shuffle) (0)", "S" },
    { "out", 0, 0, G_OPTION_ARG_FILENAME, &o.out,
      "Checkpoints go to DIR/step-NNNNNN, DIR/latest the newest", "DIR" },
    { "save-every", 0, 0, G_OPTION_ARG_STRING, &o.save_every,
      "Checkpoint every K steps (the last step is always saved)", "K" },
    { "save-dtype", 0, 0, G_OPTION_ARG_STRING, &o.save_dtype,
      "Checkpoints' weights in fp32 or bf16 (default: the training dtype; "
      "fp32 beside a master is the master)",
      "D" },
    { "max-shard-size", 0, 0, G_OPTION_ARG_STRING, &o.max_shard_size,
      "Checkpoints' safetensors shards of at most SIZE, as save_pretrained "
      "(5GB)",
      "SIZE" },
    { "keep-last", 0, 0, G_OPTION_ARG_STRING, &o.keep_last,
      "Remove all but the N newest checkpoints after each save (0: keep all)",
      "N" },
    { "ignore-extra-tensors", 0, 0, G_OPTION_ARG_NONE, &o.ignore_extra_tensors,
      "Drop, with a notice, tensors in --model the config does not make "
      "(refused by default)",
      NULL },
    { "val-data", 0, 0, G_OPTION_ARG_FILENAME, &o.val_data,
      "Validation tokens, as --data: the loss and perplexity at the end "
      "(and every --eval-every steps)",
      "FILES" },
    { "eval-every", 0, 0, G_OPTION_ARG_STRING, &o.eval_every,
      "Evaluate every N steps (0, the default: at the end only)", "N" },
    { "eval-batches", 0, 0, G_OPTION_ARG_STRING, &o.eval_batches,
      "Global batches per evaluation (default: every whole one in "
      "--val-data)",
      "K" },
    { "max-skipped-steps", 0, 0, G_OPTION_ARG_STRING, &o.max_skipped_steps,
      "Stop the run (exit 2) after N steps in a row skipped for non-finite "
      "gradients (5; 0: never)",
      "N" },
    { "resume", 0, 0, G_OPTION_ARG_NONE, &o.resume,
      "Continue from DIR/latest bit for bit (its newest checkpoint when the "
      "link is gone; from step 0 when there is none); the flags that change "
      "the arithmetic or the data order must be the checkpoint's",
      NULL },
    { "resume-from", 0, 0, G_OPTION_ARG_FILENAME, &o.resume_from,
      "Continue from this checkpoint: a directory, or a step of --out "
      "(12: DIR/step-000012) (default: none)",
      "DIR|STEP" },
    { "overwrite", 0, 0, G_OPTION_ARG_NONE, &o.overwrite,
      "Train into a --out holding another run's checkpoints, removing them "
      "once this run has saved its first (default: refuse)",
      NULL },
    { "save-on-signal", 0, 0, G_OPTION_ARG_STRING, &o.save_on_signal,
      "on (default): SIGTERM or SIGUSR1 stops the run after the step in "
      "flight with a checkpoint, and the exit status is the signal's; off: "
      "they stop it at once",
      "on|off" },
    { "log-json", 0, 0, G_OPTION_ARG_FILENAME, &o.log_json,
      "One JSON object per step (step, loss, grad_norm, lr, tokens_per_s); "
      "a resume cuts it to the checkpoint's step",
      "FILE" },
    { "trace", 0, 0, G_OPTION_ARG_FILENAME, &o.trace,
      "Chrome trace of the last step as it ran (ui.perfetto.dev)", "FILE" },
    { "backend", 0, 0, G_OPTION_ARG_STRING, &o.backend, "cpu (default)",
      "NAME" },
    { "device-memory", 0, 0, G_OPTION_ARG_STRING, &o.device_memory,
      "The device's capacity (default: half of this host's RAM)", "SIZE" },
    { "threads", 0, 0, G_OPTION_ARG_STRING, &o.threads,
      "Compute threads (default: one per core)", "N" },
    { "stream-times", 0, 0, G_OPTION_ARG_NONE, &o.stream_times,
      "After the run, print each stream's busy and exposed seconds in the "
      "last step, measured beside simulated (and add them to the last "
      "--log-json line)",
      NULL },
    { "rank", 0, 0, G_OPTION_ARG_STRING, &o.rank,
      "This process's rank (default: mpirun's OMPI_COMM_WORLD_RANK, "
      "torchrun's RANK or Slurm's SLURM_PROCID, else 0)",
      "R" },
    { "world-size", 0, 0, G_OPTION_ARG_STRING, &o.world_size,
      "Ranks in the job (default: the launcher's, else 1; one rank runs "
      "yet)",
      "N" },
    { "init", 0, 0, G_OPTION_ARG_STRING, &o.init,
      "How the ranks meet: mpi, env (torchrun's MASTER_ADDR and "
      "MASTER_PORT) or tcp://HOST:PORT (default: the launcher's)",
      "HOW" },
    { "reduction", 0, 0, G_OPTION_ARG_STRING, &o.reduction,
      "How several ranks sum the gradients they reduce-scatter: "
      "deterministic (default: in rank order, one rank's bytes) or native "
      "(MPI's order: from 3 ranks on, or 2 accumulating micro-batches, the "
      "bytes differ and the losses move in their last digits; "
      "docs/executor.md).  The tied embedding's gradients, the norm and the "
      "loss are summed in rank order either way; one rank sums nothing",
      "HOW" },
    { "allow-unpinned", 0, 0, G_OPTION_ARG_NONE, &o.allow_unpinned,
      "Where RLIMIT_MEMLOCK cannot cover the pinned host buffers, run them "
      "pageable instead of refusing (cpu backend)",
      NULL },
    /* Tests of overlap on a small machine: every copy of the cpu backend
     * sleeps this long first, so that copies last long enough to see. */
    { "test-nvme-fault", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING,
      &o.test_nvme_fault,
      "Test knob: the Nth swap-file request from the first step on fails as "
      "KIND (eio, enospc, short, short-eof)",
      "KIND:N" },
    { "test-copy-delay-us", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING,
      &o.test_copy_delay_us, "Test knob: each copy sleeps US first (cpu)",
      "US" },
    { "test-memlock-limit", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING,
      &o.test_memlock_limit,
      "Test knob: the preflight takes SIZE as RLIMIT_MEMLOCK (and no "
      "CAP_IPC_LOCK)",
      "SIZE" },
    { "test-nvme-free", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING,
      &o.test_nvme_free,
      "Test knob: the planner takes SIZE as each --nvme-dir's free space",
      "SIZE" },
    { NULL },
  };
  StowTrainPlan tp;
  stow_train_plan_init (&tp);
  StowTrainConfig c
      = { .backend = "cpu",
          .max_skipped_steps = 5,
          .save_format = { STOW_DTYPE_NONE, STOW_DEFAULT_MAX_SHARD_BYTES } };
  int stopped_by = 0;
  int status = train_main (&o, &tp, &c, entries, argc, argv, &stopped_by);
  if (c.comm != NULL)
    {
      /* A rank that failed must not leave the others in a collective:
       * the whole job ends (its message is printed). */
      if (status != STOW_EXIT_OK)
        {
          fflush (NULL);
          stow_comm_mpi_abort (status);
        }
      stow_comm_free (c.comm);
    }
  g_free (c.log_json_owned);
  g_free (c.trace_owned);
  g_strfreev (tp.nvme_dirs);
  stow_train_plan_clear (&tp);
  g_strfreev (o.nvme_dirs);
  stow_plan_options_clear (&o.po);
  char **strings[] = { &o.model,
                       &o.revision,
                       &o.data,
                       &o.plan,
                       &o.seed,
                       &o.out,
                       &o.save_every,
                       &o.max_skipped_steps,
                       &o.log_json,
                       &o.trace,
                       &o.backend,
                       &o.device_memory,
                       &o.tokenizer,
                       &o.threads,
                       &o.test_copy_delay_us,
                       &o.test_die_at,
                       &o.test_nvme_fault,
                       &o.test_memlock_limit,
                       &o.test_nvme_free,
                       &o.resume_from,
                       &o.save_on_signal,
                       &o.save_dtype,
                       &o.max_shard_size,
                       &o.keep_last,
                       &o.val_data,
                       &o.eval_every,
                       &o.eval_batches,
                       &o.rank,
                       &o.world_size,
                       &o.init,
                       &o.reduction };
  for (gsize i = 0; i < G_N_ELEMENTS (strings); i++)
    g_free (*strings[i]);
  if (stopped_by != 0)
    {
      /* Everything is freed and OUT unlocked: end as the signal would. */
      fflush (NULL);
      signal (stopped_by, SIG_DFL);
      raise (stopped_by);
    }
  return status;
}

/* ---- init-model ------------------------------------------------------------
 */

typedef struct
{
  const StowProgram *p;
  double std;
  guint64 seed;
  StowDtype dtype;
  guint8 *scratch; /* the largest unit */
} InitCtx;

static void *
init_unit (gpointer user, guint unit)
{
  InitCtx *x = user;
  stow_model_io_init_unit (x->p, unit, x->std, x->seed, x->dtype, x->scratch);
  return x->scratch;
}

/* init-model after its options: @out the directory. */
static int
init_main (const char *model, const char *revision, const char *out,
           const char *seed_s, const char *dtype_s, const char *shard_s)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *config_path
      = stow_cli_model_config (model, revision, &error);
  if (config_path == NULL)
    return stow_cli_fail (error, NULL);
  guint64 seed = 0, max_shard = STOW_DEFAULT_MAX_SHARD_BYTES;
  if (seed_s && !stow_parse_count (seed_s, &seed, &error))
    return stow_cli_failf (NULL, "--seed \"%s\": expected a count", seed_s);
  if (shard_s && !stow_parse_size (shard_s, &max_shard, &error))
    return stow_cli_failf (NULL, "--max-shard-size \"%s\": %s", shard_s,
                           error->message);
  StowDtype dtype = STOW_DTYPE_F32;
  if (dtype_s && g_str_equal (dtype_s, "bf16"))
    dtype = STOW_DTYPE_BF16;
  else if (dtype_s && !g_str_equal (dtype_s, "fp32"))
    return stow_cli_failf (NULL, "--dtype \"%s\": expected fp32 or bf16",
                           dtype_s);
  /* The rules train applies to the config (stow_llama_model_open). */
  StowLlamaConfig lc;
  g_autoptr (StowModel) m
      = stow_llama_model_open (config_path, &lc, NULL, &error);
  g_autofree char *text = NULL;
  gsize len = 0;
  if (m == NULL || !g_file_get_contents (config_path, &text, &len, &error))
    return stow_cli_fail (error, NULL);
  if (g_mkdir_with_parents (out, 0755) != 0)
    {
      int e = errno;
      return stow_cli_failf (NULL, "-o %s: %s", out, g_strerror (e));
    }
  g_autoptr (StowProgram) p = stow_program_new (1);
  stow_program_set_units (p, m);
  guint64 largest = 0;
  for (guint u = 0; u < p->units->len; u++)
    largest = MAX (largest, g_array_index (p->units, StowUnit, u).numel);
  InitCtx x = { p, m->initializer_range, seed, dtype, NULL };
  x.scratch = g_try_malloc (MAX (largest, 1) * stow_dtype_size (dtype));
  if (x.scratch == NULL)
    return stow_cli_failf (NULL,
                           "init-model: out of memory for a unit of "
                           "%" G_GUINT64_FORMAT " parameters",
                           largest);
  /* config.json as given, with the dtype the weights are stored in. */
  gboolean ok
      = stow_model_io_save (p, out, dtype, max_shard, init_unit, &x, &error)
        && stow_checkpoint_save_model_files (out, NULL, text, len, dtype,
                                             &error);
  g_free (x.scratch);
  if (!ok)
    return stow_cli_fail (error, NULL);
  printf ("%s: %s, %" G_GUINT64_FORMAT
          " parameters, %s, seed %" G_GUINT64_FORMAT "\n",
          out, m->name, m->params, dtype == STOW_DTYPE_F32 ? "fp32" : "bf16",
          seed);
  return STOW_EXIT_OK;
}

int
stow_cmd_init_model (int argc, char **argv)
{
  char *out = NULL, *seed_s = NULL, *dtype_s = NULL, *shard_s = NULL;
  char *revision = NULL;
  const GOptionEntry entries[] = {
    { "output", 'o', 0, G_OPTION_ARG_FILENAME, &out,
      "Directory for config.json and the safetensors", "DIR" },
    { "max-shard-size", 0, 0, G_OPTION_ARG_STRING, &shard_s,
      "Safetensors shards of at most SIZE, as save_pretrained (5GB)", "SIZE" },
    { "seed", 0, 0, G_OPTION_ARG_STRING, &seed_s, "Random seed (0)", "S" },
    { "dtype", 0, 0, G_OPTION_ARG_STRING, &dtype_s, "fp32 (default) or bf16",
      "D" },
    { "revision", 0, 0, G_OPTION_ARG_STRING, &revision,
      "With a Hub id: a branch, tag or commit (main)", "REV" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "init-model", "CONFIG.json|ORG/NAME",
      "Write a randomly initialised checkpoint of a LLaMA-family config: "
      "linear weights and embeddings normal(0, initializer_range), norms 1, "
      "biases 0, as HF transformers initialises them.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  int status;
  if (!stow_cli_parse (ctx, "init-model", &argc, &argv))
    status = STOW_EXIT_FAILURE;
  else if (argc != 2 || out == NULL)
    status = stow_cli_failf ("see 'stowage init-model --help'",
                             "init-model: expected CONFIG.json and -o DIR");
  else
    status = init_main (argv[1], revision, out, seed_s, dtype_s, shard_s);
  g_free (revision);
  g_free (out);
  g_free (shard_s);
  g_free (seed_s);
  g_free (dtype_s);
  return status;
}
