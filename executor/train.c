/* SPDX-License-Identifier: MIT
 *
 * executor/train.c: the training loop (executor/train.h).  Conventions
 * (docs/executor.md): micro-batch g of the run (g = (step - 1) x
 * grad_accum + i) reads tokens [g B T, g B T + B T + 1) of the stream,
 * row b its tokens [b T, b T + T) and targets one further; with --shuffle
 * the windows of each pass over the stream are permuted from the seed
 * (StowBatches, executor/data.h).  The loss is the mean token
 * cross-entropy of the global batch.
 */
#include "executor/train.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "executor/backends/registry.h"
#include "executor/backends/tensors.h"
#include "executor/checkpoint-io.h"
#include "executor/checkpoint.h"
#include "executor/eval.h"
#include "executor/llama.h"
#include "program/driver.h"

/* clang-format off */
G_DEFINE_QUARK (stow-train-error-quark, stow_train_error)
/* clang-format on */

#define STATE_FORMAT "stowage-train-state"

/* ---- the run ---------------------------------------------------------- */

typedef struct
{
  const StowTrainConfig *c;
  StowTrainResult *out;
  const StowProgram *prog;
  StowBackend *be;
  const StowBackendVtable *ops; /* be's table */
  StowTokenData *data;
  StowBatches *batches;
  StowEval *eval;    /* or NULL */
  char *config_json; /* the model's config.json, verbatim */
  gsize config_len;
  FILE *log;
} Run;

static void
run_clear (Run *r)
{
  if (r->be)
    stow_backend_free (r->be);
  if (r->batches)
    stow_batches_free (r->batches);
  if (r->data)
    stow_token_data_free (r->data);
  if (r->eval)
    stow_eval_free (r->eval);
  if (r->log)
    fclose (r->log);
  g_free (r->config_json);
}

/* The model's config.json (copied into every checkpoint) and the data. */
static gboolean
open_inputs (Run *r, GError **error)
{
  const StowTrainConfig *c = r->c;
  const StowProgram *p = r->prog;
  g_autofree char *cfg = g_build_filename (c->model_dir, "config.json", NULL);
  if (!g_file_get_contents (cfg, &r->config_json, &r->config_len, error))
    return FALSE;
  if (c->tokenizer == STOW_TOKENIZER_BYTES && c->model->vocab < 256)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "--tokenizer bytes needs vocab_size >= 256; %s has "
                   "%" G_GUINT64_FORMAT,
                   cfg, c->model->vocab);
      return FALSE;
    }
  r->data
      = stow_token_data_open (c->data, c->tokenizer, c->model->vocab, error);
  if (r->data == NULL)
    return FALSE;
  guint64 window = p->micro_batch * p->seq_len;
  if (stow_token_data_n_tokens (r->data) < window + 1)
    {
      g_set_error (error, STOW_DATA_ERROR, STOW_DATA_ERROR_EMPTY,
                   "%s: %" G_GUINT64_FORMAT
                   " tokens; a micro-batch reads %" G_GUINT64_FORMAT,
                   c->data, stow_token_data_n_tokens (r->data), window + 1);
      return FALSE;
    }
  r->batches = stow_batches_new (r->data, window, p->grad_accum, c->shuffle,
                                 p->optim.seed);
  if (c->val_data == NULL)
    return TRUE;
  r->eval = stow_eval_open (c->val_data, c->tokenizer, c->model->vocab, p,
                            c->eval_batches, error);
  if (r->eval == NULL)
    return FALSE;
  r->out->val_batches = stow_eval_n_batches (r->eval);
  r->out->val_targets = stow_eval_n_targets (r->eval);
  return TRUE;
}

/* ---- checkpoints ----------------------------------------------------------
 */

/* The training precision as the run's flags name it. */
static const char *
precision_name (const StowProgram *p)
{
  return stow_dtype_nick (p->weight_dtype);
}

static JsonObject *
state_object (Run *r, guint64 step)
{
  const StowTrainConfig *c = r->c;
  const StowProgram *p = r->prog;
  const StowOptimSettings *o = &p->optim;
  JsonObject *s = json_object_new ();
  json_object_set_string_member (s, "format", STATE_FORMAT);
  json_object_set_int_member (s, "version", 1);
  json_object_set_int_member (s, "step", (gint64)step);
  json_object_set_int_member (s, "tokens_seen",
                              (gint64)(step * p->global_batch * p->seq_len));
  /* A string: JSON numbers above 2^53 would not survive. */
  g_autofree char *seed = g_strdup_printf ("%" G_GUINT64_FORMAT, o->seed);
  json_object_set_string_member (s, "seed", seed);
  json_object_set_boolean_member (s, "shuffle", c->shuffle);
  json_object_set_string_member (s, "precision", precision_name (p));
  json_object_set_int_member (s, "seq", (gint64)p->seq_len);
  json_object_set_int_member (s, "micro_batch", (gint64)p->micro_batch);
  json_object_set_int_member (s, "global_batch", (gint64)p->global_batch);
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
  const StowWeightsFormat *f = &r->c->save_format;
  g_autoptr (JsonObject) state = state_object (r, step);
  if (!stow_checkpoint_save_model_files (
          dir, r->c->model_dir, r->config_json, r->config_len,
          f->dtype == STOW_DTYPE_NONE ? r->prog->weight_dtype : f->dtype, error)
      || !stow_checkpoint_save_tensors (r->be, r->prog, dir, state,
                                        r->c->delayed_update, f, error)
      || !stow_checkpoint_commit (w, error))
    return FALSE;
  return r->c->keep_last == 0
         || stow_checkpoint_prune (r->c->out_dir, r->c->keep_last, error);
}

static gboolean
state_u64 (JsonObject *s, const char *where, const char *name, guint64 *out,
           GError **error)
{
  return stow_json_get_u64 (s, where, name, TRUE, out, error);
}

static gboolean
same_str (const char *dir, const char *field, const char *was, const char *now,
          GError **error)
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
  const StowTrainConfig *c = r->c;
  const StowProgram *p = r->prog;
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
      = g_strdup_printf ("%" G_GUINT64_FORMAT, p->optim.seed);
  if (!same_u64 (dir, "seq", seq, p->seq_len, error)
      || !same_u64 (dir, "micro_batch", mb, p->micro_batch, error)
      || !same_u64 (dir, "global_batch", gb, p->global_batch, error)
      || !same_str (dir, "precision", prec, precision_name (p), error)
      || !same_str (dir, "seed", seed, now_seed, error))
    return FALSE;
  gboolean delayed = FALSE;
  if (json_object_has_member (s, "delayed_update"))
    delayed = json_object_get_boolean_member (s, "delayed_update");
  if (!same_str (dir, "--delayed-update", delayed ? "on" : "off",
                 c->delayed_update ? "on" : "off", error))
    return FALSE;
  if (!stow_checkpoint_load_tensors (r->be, r->prog, dir, os, opt, delayed,
                                     step, error))
    return FALSE;
  *done = step;
  return TRUE;
}

/* ---- the loop ---------------------------------------------------------------
 */

/* The last step's busy and exposed seconds per stream, from its trace. */
static void
keep_stream_times (StowTrainResult *c, const StowTrace *t)
{
  double first = G_MAXDOUBLE, last = 0;
  for (guint i = 0; i < t->n_ops; i++)
    {
      first = MIN (first, t->ops[i].start_s);
      last = MAX (last, t->ops[i].end_s);
    }
  c->step_s = t->n_ops ? last - first : 0;
  memcpy (c->busy_s, t->busy_s, sizeof c->busy_s);
  memcpy (c->exposed_s, t->exposed_s, sizeof c->exposed_s);
}

/* "streams": {stream: {busy_s, exposed_s, simulated_busy_s,
 * simulated_exposed_s}} for the streams busy in either. */
static void
log_stream_times (JsonBuilder *b, const StowTrainConfig *c,
                  const StowTrainResult *m)
{
  json_builder_set_member_name (b, "streams");
  json_builder_begin_object (b);
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      if (m->busy_s[s] <= 0 && c->simulated_busy_s[s] <= 0)
        continue;
      json_builder_set_member_name (b, stow_stream_name (s));
      json_builder_begin_object (b);
      stow_json_set_double (b, "busy_s", m->busy_s[s]);
      stow_json_set_double (b, "exposed_s", m->exposed_s[s]);
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
  if (!isnan (s->val_loss))
    stow_json_set_double (b, "val_loss", s->val_loss);
  if (r->c->stream_times && s->step == s->steps)
    log_stream_times (b, r->c, r->out);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *line = stow_json_to_string (root, FALSE);
  fprintf (r->log, "%s\n", line);
  fflush (r->log);
}

static gboolean
train_loop (Run *r, guint64 first, GError **error)
{
  const StowTrainConfig *c = r->c;
  double tokens = (double)r->prog->global_batch * (double)r->prog->seq_len;
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
      keep_stream_times (r->out, last);
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
      s.val_loss = NAN;
      if (r->eval != NULL
          && ((c->eval_every && step % c->eval_every == 0) || step == c->steps))
        {
          if (!stow_eval_run (r->eval, r->prog, r->be, &s.val_loss, error))
            return FALSE;
          r->out->val_loss = s.val_loss;
        }
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
  r->out->peak_bytes = r->ops->peak_bytes (r->be);
  if (r->ops->pinned_peak_bytes)
    r->out->pinned_peak_bytes = r->ops->pinned_peak_bytes (r->be);
  if (c->trace_path && last != NULL)
    {
      g_autofree char *json = stow_trace_to_chrome_json (last, r->prog);
      if (!stow_file_write_atomic (c->trace_path, json, -1, error))
        return FALSE;
    }
  return TRUE;
}

static void note (const StowTrainConfig *c, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static void
note (const StowTrainConfig *c, const char *format, ...)
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
check_config (const StowTrainConfig *c, GError **error)
{
  g_return_val_if_fail (c->program != NULL && c->model != NULL, FALSE);
  const char *bad = NULL;
  if (c->model_dir == NULL)
    bad = "--model DIR is required";
  else if (c->data == NULL)
    bad = "--data FILES is required";
  else if (c->out_dir == NULL)
    bad = "--out DIR is required";
  else if (c->steps == 0)
    bad = "--steps must be at least 1";
  if (bad)
    {
      g_set_error_literal (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                           bad);
      return FALSE;
    }
  return TRUE;
}

/* The backend the program runs on, made from @c. */
static gboolean
make_backend (Run *r, GError **error)
{
  const StowTrainConfig *c = r->c;
  const StowBackendKind *kind = stow_backend_kind_find (c->backend, error);
  if (kind == NULL)
    {
      g_prefix_error (error, "--backend ");
      return FALSE;
    }
  StowBackendSetup setup = {
    .program = r->prog,
    .model = c->model,
    .device_capacity_bytes = c->device_memory,
    .n_threads = c->threads,
    .data = r->batches,
    .eval_data = r->eval ? stow_eval_batches (r->eval) : NULL,
    .delayed_update = c->delayed_update,
    .swap = { .dirs = (const char *const *)c->nvme_dirs,
              .fault = c->nvme_fault,
              .fault_nth = c->nvme_fault_nth },
    .no_pin = c->no_pin,
    .copy_delay_us = c->copy_delay_us,
  };
  r->be = kind->create (&setup, error);
  if (r->be == NULL)
    return FALSE;
  r->ops = r->be->vt;
  g_autofree char *swap
      = r->ops->describe_swap ? r->ops->describe_swap (r->be) : NULL;
  if (swap != NULL)
    note (c, "%s", swap);
  if (!r->ops->alloc_persistent (r->be, error))
    return FALSE;
  g_autofree char *pool
      = r->ops->describe_pinned ? r->ops->describe_pinned (r->be) : NULL;
  if (pool != NULL)
    note (c, "host buffers of the program: %s", pool);
  return TRUE;
}

/* The weights and states the run starts from: the newest checkpoint with
 * --resume, else the model's; the steps already done. */
static gboolean
load_start (Run *r, guint64 *done, GError **error)
{
  const StowTrainConfig *c = r->c;
  g_autofree char *latest = NULL;
  if (c->resume)
    {
      latest = stow_checkpoint_latest (c->out_dir, error);
      if (latest == NULL && error && *error)
        return FALSE;
    }
  if (latest != NULL)
    {
      if (!load_checkpoint (r, latest, done, error))
        return FALSE;
      note (c, "resuming from step %" G_GUINT64_FORMAT " (%s)", *done, latest);
    }
  else
    {
      if (c->resume)
        note (c, "--resume: no checkpoint in %s; starting from step 0",
              c->out_dir);
      g_autofree char *dropped = NULL;
      if (!stow_checkpoint_load_initial (r->be, r->prog, c->model_dir,
                                         c->ignore_extra_tensors, &dropped,
                                         error))
        return FALSE;
      if (dropped != NULL)
        note (c, "--ignore-extra-tensors: %s: dropped %s", c->model_dir,
              dropped);
    }
  return r->ops->push == NULL || r->ops->push (r->be, error);
}

gboolean
stow_train_run (const StowTrainConfig *c, StowTrainResult *out, GError **error)
{
  g_return_val_if_fail (c != NULL && out != NULL, FALSE);
  memset (out, 0, sizeof *out);
  out->val_loss = NAN;
  if (!check_config (c, error))
    return FALSE;
  Run r = { .c = c, .out = out, .prog = c->program };
  gboolean ok = FALSE;
  guint64 done = 0;
  if (c->delayed_update && c->program->optim.max_grad_norm > 0)
    note (c, "--delayed-update: no gradient clipping (the norm would wait "
             "for the whole backward, which the delay overlaps)");
  if (!open_inputs (&r, error) || !make_backend (&r, error)
      || !load_start (&r, &done, error))
    goto out;
  out->first_step = done + 1;
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
  run_clear (&r);
  return ok;
}
