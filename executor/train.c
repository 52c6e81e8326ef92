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
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
  /* What identifies the run's inputs in its checkpoints' state: SHA-256 of
   * the config.json, and of the token count and a sample of the tokens. */
  char *config_sha256, *data_sha256;
  FILE *log;
  StowRunLock *lock;
  /* The checkpoint the run continues (resume_dir's optimizer.stow, its
   * header checked); NULL when it starts from the model. */
  char *resume_dir;
  StowOptimStateSet *resume_os;
  guint commits; /* checkpoints this run committed */
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
  if (r->resume_os)
    stow_optim_state_set_close (r->resume_os);
  /* After the backend: its swap files are gone before another run may
   * take the directory. */
  stow_run_lock_release (r->lock, TRUE);
  g_free (r->resume_dir);
  g_free (r->config_json);
  g_free (r->config_sha256);
  g_free (r->data_sha256);
}

/* SHA-256 of the stream's token count and of 64 runs of 64 tokens spread
 * evenly over it: cheap at any size, and another file, another order of
 * the shards or an edit of more than a few tokens changes it. */
static char *
data_digest (const StowTokenData *d)
{
  enum
  {
    RUNS = 64,
    RUN_TOKENS = 64
  };
  GChecksum *sum = g_checksum_new (G_CHECKSUM_SHA256);
  guint64 n = stow_token_data_n_tokens (d);
  guint64 n_le = GUINT64_TO_LE (n);
  g_checksum_update (sum, (const guchar *)&n_le, sizeof n_le);
  gint32 run[RUN_TOKENS];
  for (guint i = 0; i < RUNS; i++)
    {
      stow_token_data_read (d, n / RUNS * i, RUN_TOKENS, run);
      for (guint j = 0; j < RUN_TOKENS; j++)
        run[j] = GINT32_TO_LE (run[j]);
      g_checksum_update (sum, (const guchar *)run, sizeof run);
    }
  char *hex = g_strdup (g_checksum_get_string (sum));
  g_checksum_free (sum);
  return hex;
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
  /* Every rank reads the step's micro-batches as one rank with the
   * global accumulation would: rank r those of index r, r + N, ... */
  r->batches
      = stow_batches_new (r->data, window, p->grad_accum * MAX (p->dp, 1),
                          c->shuffle, p->optim.seed);
  r->config_sha256 = g_compute_checksum_for_data (
      G_CHECKSUM_SHA256, (const guchar *)r->config_json, r->config_len);
  r->data_sha256 = data_digest (r->data);
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

/* run.json beside optimizer.stow: the rest of what a resume compares
 * (settings the state header never held, what identifies the inputs) and
 * what it may change (the run's length, the placement, the data's name).
 * Apart from the header, so that optimizer.stow stays the same bytes as
 * before it existed, and under every placement. */
#define RUN_FILE   "run.json"
#define RUN_FORMAT "stowage-train-run"

static JsonObject *
run_object (Run *r, guint64 step)
{
  const StowTrainConfig *c = r->c;
  const StowProgram *p = r->prog;
  const StowOptimSettings *o = &p->optim;
  JsonObject *s = json_object_new ();
  json_object_set_string_member (s, "format", RUN_FORMAT);
  json_object_set_int_member (s, "version", 1);
  json_object_set_int_member (s, "step", (gint64)step);
  json_object_set_double_member (s, "min_lr", o->min_lr);
  json_object_set_int_member (s, "warmup", (gint64)o->warmup_steps);
  json_object_set_string_member (s, "lr_schedule",
                                 stow_lr_schedule_name (o->schedule));
  json_object_set_double_member (s, "beta1", o->beta1);
  json_object_set_double_member (s, "beta2", o->beta2);
  json_object_set_double_member (s, "eps", o->eps);
  json_object_set_string_member (
      s, "tokenizer", c->tokenizer == STOW_TOKENIZER_BYTES ? "bytes" : "none");
  json_object_set_int_member (s, "data_tokens",
                              (gint64)stow_token_data_n_tokens (r->data));
  json_object_set_string_member (s, "data_sha256", r->data_sha256);
  json_object_set_int_member (s, "model_params", (gint64)c->model->params);
  json_object_set_string_member (s, "model_config_sha256", r->config_sha256);
  json_object_set_int_member (s, "total_steps", (gint64)c->steps);
  /* "dp 1 tp 1 ... recompute none, micro-batch 2 x 1, ...", without the
   * model's name before it. */
  const char *colon = p->description ? strstr (p->description, ": ") : NULL;
  json_object_set_string_member (s, "placement",
                                 colon ? colon + 2 : p->description);
  json_object_set_string_member (s, "data", c->data);
  return s;
}

static gboolean save_checkpoint_here (Run *r, guint64 step, GError **error);
static gboolean write_checkpoint (Run *r, const char *dir, guint64 step,
                                  gboolean model, GError **error);
static gboolean after_commit (Run *r, guint64 step, GError **error);

static gboolean
comm_ok (StowComm *c, StowCommRequest *q, GError **error)
{
  return q != NULL && stow_comm_wait (c, q, error);
}

/* Whether every rank's @ok holds; the first rank that failed in *@bad. */
static gboolean
all_ok (StowComm *c, gboolean ok, int *bad, GError **error)
{
  int n = stow_comm_world_size (c);
  float mine = ok ? 1.0f : 0.0f;
  g_autofree float *all = g_new0 (float, n);
  if (!comm_ok (c,
                stow_comm_all_gather (c, &mine, all, n, STOW_DTYPE_F32, error),
                error))
    return FALSE;
  for (int i = 0; i < n; i++)
    if (all[i] == 0.0f)
      {
        *bad = i;
        return FALSE;
      }
  return TRUE;
}

/* Whether every rank's @ok holds; else FALSE with this rank's own error
 * (*@local), or one naming the first rank that failed to @what. */
static gboolean
agreed (StowComm *c, gboolean ok, GError **local, guint64 step,
        const char *what, GError **error)
{
  int bad = -1;
  if (all_ok (c, ok, &bad, error))
    return TRUE;
  if (error && *error)
    return FALSE;
  if (*local != NULL)
    g_propagate_error (error, g_steal_pointer (local));
  else
    g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                 "step %" G_GUINT64_FORMAT ": rank %d could not %s", step, bad,
                 what);
  return FALSE;
}

/* Several ranks whose optimizer states are partitioned: rank 0 makes the
 * checkpoint's temporary directory and says where; every rank writes its
 * own states' file there (rank 0 the weights, once, and the rest); once
 * every rank has, rank 0 commits.  A rank that failed fails them all,
 * and the checkpoint is not committed (its directory goes). */
static gboolean
save_checkpoint_ranks (Run *r, guint64 step, GError **error)
{
  StowComm *c = r->c->comm;
  int rank = stow_comm_rank (c);
  g_autoptr (StowCheckpointWriter) w = NULL;
  g_autoptr (GError) local = NULL;
  /* The directory's name, as 16-bit words (a broadcast moves bytes). */
  guint16 words[2048] = { 0 };
  if (rank == 0)
    {
      w = stow_checkpoint_begin (r->c->out_dir, step, &local);
      if (w != NULL)
        g_strlcpy ((char *)words, stow_checkpoint_writer_dir (w), sizeof words);
    }
  if (!comm_ok (c,
                stow_comm_broadcast (c, words, G_N_ELEMENTS (words),
                                     STOW_DTYPE_BF16, 0, error),
                error))
    return FALSE;
  const char *dir = (const char *)words;
  gboolean ok = dir[0] != '\0' && local == NULL
                && write_checkpoint (r, dir, step, rank == 0, &local);
  if (!agreed (c, ok, &local, step, "write its part of the checkpoint", error))
    return FALSE;
  ok = rank != 0
       || (stow_checkpoint_commit (w, &local)
           && after_commit (r, step, &local));
  if (!agreed (c, ok, &local, step, "commit the checkpoint", error))
    return FALSE;
  r->out->saved_step = step;
  return TRUE;
}

/* Rank 0 (or the one rank) writes the checkpoint.  With several ranks
 * whose states are partitioned, each writes its own part
 * (save_checkpoint_ranks); with whole states (ZeRO 0) rank 0 writes it
 * all.  Every rank waits for the commit, so that none runs ahead of a
 * checkpoint that may yet fail. */
static gboolean
save_checkpoint (Run *r, guint64 step, GError **error)
{
  if (r->c->comm == NULL)
    return save_checkpoint_here (r, step, error);
  guint rank = 0, world = 1;
  if (r->ops->ranks)
    r->ops->ranks (r->be, &rank, &world);
  if (world > 1)
    return save_checkpoint_ranks (r, step, error);
  gboolean ok = stow_comm_rank (r->c->comm) == 0
                    ? save_checkpoint_here (r, step, error)
                    : r->ops->pull == NULL || r->ops->pull (r->be, error);
  if (!ok)
    return FALSE;
  if (stow_comm_rank (r->c->comm) != 0)
    r->out->saved_step = step;
  return comm_ok (r->c->comm, stow_comm_barrier (r->c->comm, error), error);
}

/* Checkpoint @dir's files for @step: with @model the model's files and
 * run.json too (the one rank, or rank 0); the states this rank holds. */
static gboolean
write_checkpoint (Run *r, const char *dir, guint64 step, gboolean model,
                  GError **error)
{
  const StowWeightsFormat *f = &r->c->save_format;
  g_autofree char *run = g_build_filename (dir, RUN_FILE, NULL);
  g_autoptr (JsonObject) state = state_object (r, step);
  g_autoptr (JsonNode) run_node = json_node_new (JSON_NODE_OBJECT);
  json_node_take_object (run_node, run_object (r, step));
  g_autofree char *run_text = stow_json_to_string (run_node, TRUE);
  return (!model
          || (stow_checkpoint_save_model_files (
                  dir, r->c->model_dir, r->config_json, r->config_len,
                  f->dtype == STOW_DTYPE_NONE ? r->prog->weight_dtype
                                              : f->dtype,
                  error)
              && g_file_set_contents (run, run_text, -1, error)))
         && stow_checkpoint_save_tensors (r->be, r->prog, dir, state,
                                          r->c->delayed_update, f, error);
}

static gboolean
save_checkpoint_here (Run *r, guint64 step, GError **error)
{
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (r->c->out_dir, step, error);
  if (w == NULL)
    return FALSE;
  if (!write_checkpoint (r, stow_checkpoint_writer_dir (w), step, TRUE, error)
      || !stow_checkpoint_commit (w, error))
    return FALSE;
  r->out->saved_step = step;
  return after_commit (r, step, error);
}

/* --overwrite: the checkpoints this run replaces go only now that it has
 * one of its own, so that a run that fails or is stopped before then
 * loses nothing (OUT/latest still names the old run's newest); then
 * --keep-last. */
static gboolean
after_commit (Run *r, guint64 step, GError **error)
{
  if (r->commits++ == 0 && r->c->overwrite)
    {
      g_autofree char *name
          = g_strdup_printf ("step-%06" G_GUINT64_FORMAT, step);
      if (!stow_checkpoint_remove_others (r->c->out_dir, name, error))
        return FALSE;
    }
  return r->c->keep_last == 0
         || stow_checkpoint_prune (r->c->out_dir, r->c->keep_last, error);
}

/* ---- what a resume checks ---------------------------------------------------
 */

/* A setting of the state header: @key, the flag that sets it, and whether
 * a resumed run may change it (logged) or must keep it (refused). */
typedef struct
{
  const char *key, *flag;
  gboolean may_change;
  /* Around a value as a message shows it: "20000" " tokens". */
  const char *before, *after;
} ResumeRule;

/* Everything that changes the arithmetic or the data order must stay; the
 * run's length and its placement (the same bytes under every placement,
 * docs/executor.md) may change. */
static const ResumeRule resume_rules[] = {
  { .key = "seed", .flag = "--seed" },
  { .key = "shuffle", .flag = "--shuffle" },
  { .key = "tokenizer", .flag = "--tokenizer" },
  { .key = "data_tokens", .flag = "--data", .after = " tokens" },
  { .key = "data_sha256",
    .flag = "--data",
    .before = "tokens whose sample has " },
  { .key = "model_params", .flag = "--model", .after = " parameters" },
  { .key = "model_config_sha256",
    .flag = "--model",
    .before = "a config.json of " },
  { .key = "precision", .flag = "--precision" },
  { .key = "seq", .flag = "--seq" },
  { .key = "micro_batch", .flag = "--micro-batch" },
  { .key = "global_batch", .flag = "--global-batch" },
  { .key = "lr", .flag = "--lr" },
  { .key = "min_lr", .flag = "--min-lr" },
  { .key = "warmup", .flag = "--warmup" },
  { .key = "lr_schedule", .flag = "--lr-schedule" },
  { .key = "weight_decay", .flag = "--weight-decay" },
  { .key = "beta1", .flag = "--beta1" },
  { .key = "beta2", .flag = "--beta2" },
  { .key = "eps", .flag = "--eps" },
  { .key = "max_grad_norm", .flag = "--max-grad-norm" },
  { .key = "delayed_update", .flag = "--delayed-update" },
  { .key = "total_steps", .flag = "--steps", .may_change = TRUE },
  { .key = "placement", .flag = "the layout", .may_change = TRUE },
};

/* A header value as the user reads it: strings as they are (a digest
 * shortened), booleans as on and off, numbers in their shortest exact
 * form. */
static char *
value_text (JsonNode *n, const char *key)
{
  if (n == NULL || !JSON_NODE_HOLDS_VALUE (n))
    return g_strdup ("?");
  switch (json_node_get_value_type (n) == G_TYPE_STRING    ? 's'
          : json_node_get_value_type (n) == G_TYPE_BOOLEAN ? 'b'
          : json_node_get_value_type (n) == G_TYPE_INT64   ? 'i'
                                                           : 'd')
    {
    case 's':
      return g_str_has_suffix (key, "_sha256")
                 ? g_strdup_printf ("sha256 %.12s...", json_node_get_string (n))
                 : g_strdup (json_node_get_string (n));
    case 'b':
      return g_strdup (json_node_get_boolean (n) ? "on" : "off");
    case 'i':
      return g_strdup_printf ("%" G_GINT64_FORMAT, json_node_get_int (n));
    default:
      {
        /* The fewest digits that read back as the same double: 0.003,
         * not 0.0030000000000000001. */
        double x = json_node_get_double (n);
        char buf[G_ASCII_DTOSTR_BUF_SIZE];
        for (int digits = 1; digits <= 17; digits++)
          {
            char fmt[8];
            g_snprintf (fmt, sizeof fmt, "%%.%dg", digits);
            g_ascii_formatd (buf, sizeof buf, fmt, x);
            if (g_ascii_strtod (buf, NULL) == x)
              break;
          }
        return g_strdup (buf);
      }
    }
}

/* Notes what a resumed run changes that it may: a longer or shorter run
 * (with a decaying schedule, the learning rates from here follow the new
 * end), another placement. */
static void note (const StowTrainConfig *c, const char *format, ...)
    G_GNUC_PRINTF (2, 3);

static void
note_change (Run *r, const ResumeRule *rule, const char *was, const char *now)
{
  const StowProgram *p = r->prog;
  if (g_str_equal (rule->key, "total_steps"))
    note (r->c, "--steps %s: the checkpoint's run was for %s steps%s%s%s", now,
          was, p->optim.schedule != STOW_LR_CONSTANT ? "; the " : "",
          p->optim.schedule != STOW_LR_CONSTANT
              ? stow_lr_schedule_name (p->optim.schedule)
              : "",
          p->optim.schedule != STOW_LR_CONSTANT
              ? " schedule now decays to the new last step"
              : "");
  else
    note (r->c, "the layout is now %s (the checkpoint ran %s)", now, was);
}

/* @key from @a, else from @b (either NULL); delayed_update, which the
 * header holds only when on, is off when absent from both. */
static JsonNode *
setting (JsonObject *a, JsonObject *b, const char *key, JsonNode **off)
{
  JsonNode *n = a ? json_object_get_member (a, key) : NULL;
  if (n == NULL && b != NULL)
    n = json_object_get_member (b, key);
  if (n == NULL && g_str_equal (key, "delayed_update"))
    {
      *off = json_node_new (JSON_NODE_VALUE);
      json_node_set_boolean (*off, FALSE);
      n = *off;
    }
  return n;
}

/* The checkpoint's settings (its header @s and its run.json @run, NULL for
 * a checkpoint from before run.json) against this run's: every rule's
 * value, or for a key the checkpoint does not hold, a note of what was
 * not compared. */
static gboolean
check_resume_settings (Run *r, const char *dir, JsonObject *s, JsonObject *run,
                       guint64 step, GError **error)
{
  g_autoptr (JsonObject) now_state = state_object (r, step);
  g_autoptr (JsonObject) now_run = run_object (r, step);
  g_autoptr (GString) unrecorded = g_string_new (NULL);
  for (guint i = 0; i < G_N_ELEMENTS (resume_rules); i++)
    {
      const ResumeRule *rule = &resume_rules[i];
      g_autoptr (JsonNode) off_was = NULL, off_now = NULL;
      JsonNode *was_node = setting (s, run, rule->key, &off_was);
      if (was_node == NULL)
        {
          if (!rule->may_change && strstr (unrecorded->str, rule->flag) == NULL)
            g_string_append_printf (unrecorded, "%s%s",
                                    unrecorded->len ? ", " : "", rule->flag);
          continue;
        }
      g_autofree char *was = value_text (was_node, rule->key);
      g_autofree char *is = value_text (
          setting (now_state, now_run, rule->key, &off_now), rule->key);
      if (g_str_equal (was, is))
        continue;
      if (rule->may_change)
        {
          note_change (r, rule, was, is);
          continue;
        }
      const char *b = rule->before ? rule->before : "";
      const char *a = rule->after ? rule->after : "";
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
                   "%s: the checkpoint ran with %s %s%s%s; this run has "
                   "%s%s%s. A resume continues the same run, with the same "
                   "flags; start a new one with --overwrite or another --out",
                   dir, rule->flag, b, was, a, b, is, a);
      return FALSE;
    }
  if (unrecorded->len > 0)
    note (r->c,
          "%s predates the record of %s: not compared (pass them as that "
          "run did)",
          dir, unrecorded->str);
  /* The same tokens under another name: said, not refused. */
  const char *was_data = NULL;
  if (run != NULL && json_object_has_member (run, "data")
      && stow_json_get_string (run, dir, "data", FALSE, &was_data, NULL)
      && was_data && g_strcmp0 (was_data, r->c->data) != 0)
    note (r->c, "--data %s: the checkpoint ran on %s, the same tokens",
          r->c->data, was_data);
  return TRUE;
}

/* Where checkpoint @dir's optimizer states are, for messages: its
 * optimizer.stow, or the ranks' optimizer-rank*-of-N.stow. */
static char *
optimizer_state_path (const char *dir)
{
  g_autofree char *one = g_build_filename (dir, "optimizer.stow", NULL);
  if (g_file_test (one, G_FILE_TEST_EXISTS))
    return g_steal_pointer (&one);
  return g_build_filename (dir, "optimizer-rank*.stow", NULL);
}

/* Whether @dir holds optimizer states, one rank's or several ranks'. */
static gboolean
has_optimizer_state (const char *dir)
{
  g_autofree char *one = g_build_filename (dir, "optimizer.stow", NULL);
  if (g_file_test (one, G_FILE_TEST_IS_REGULAR))
    return TRUE;
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  for (const char *n; d && (n = g_dir_read_name (d)) != NULL;)
    if (g_str_has_prefix (n, "optimizer-rank") && g_str_has_suffix (n, ".stow"))
      return TRUE;
  return FALSE;
}

/* Opens checkpoint @dir's optimizer states and run.json and checks them
 * against this run (r->resume_os); *@done gets its step. */
static gboolean
inspect_checkpoint (Run *r, const char *dir, guint64 *done, GError **error)
{
  g_autofree char *opt = optimizer_state_path (dir);
  r->resume_os = stow_optim_state_set_open (dir, error);
  if (r->resume_os == NULL)
    return FALSE;
  JsonObject *s = stow_optim_state_set_get_state (r->resume_os);
  const char *fmt = NULL;
  guint64 step = 0;
  if (!stow_json_get_string (s, opt, "format", TRUE, &fmt, error)
      || !stow_json_get_u64 (s, opt, "step", TRUE, &step, error))
    return FALSE;
  if (!g_str_equal (fmt, STATE_FORMAT))
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
                   "%s: state format \"%s\", expected \"%s\"", opt, fmt,
                   STATE_FORMAT);
      return FALSE;
    }
  g_autofree char *run_path = g_build_filename (dir, RUN_FILE, NULL);
  g_autoptr (JsonNode) run_root = NULL;
  JsonObject *run = NULL;
  if (g_file_test (run_path, G_FILE_TEST_EXISTS))
    {
      guint64 run_step = 0;
      const char *run_fmt = NULL;
      run_root = stow_json_parse_file (run_path, 1 << 20, error);
      run = run_root ? stow_json_root_object (run_root, run_path, error) : NULL;
      if (run == NULL
          || !stow_json_get_string (run, run_path, "format", TRUE, &run_fmt,
                                    error)
          || !stow_json_get_u64 (run, run_path, "step", TRUE, &run_step, error))
        return FALSE;
      if (!g_str_equal (run_fmt, RUN_FORMAT) || run_step != step)
        {
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
                       "%s: format \"%s\" of step %" G_GUINT64_FORMAT
                       ", expected \"%s\" of step %" G_GUINT64_FORMAT " (%s)",
                       run_path, run_fmt, run_step, RUN_FORMAT, step, opt);
          return FALSE;
        }
    }
  if (!check_resume_settings (r, dir, s, run, step, error))
    return FALSE;
  *done = step;
  return TRUE;
}

/* The weights and optimizer state of the inspected checkpoint. */
static gboolean
load_checkpoint (Run *r, guint64 step, GError **error)
{
  g_autofree char *opt = optimizer_state_path (r->resume_dir);
  return stow_checkpoint_load_tensors (r->be, r->prog, r->resume_dir,
                                       r->resume_os, opt, r->c->delayed_update,
                                       step, error);
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

static int
stop_requested (const StowTrainConfig *c)
{
  return c->stop_signal ? (int)*c->stop_signal : 0;
}

/* Several ranks stop after the same step: rank 0's word goes to all (a
 * rank that stopped alone would leave the others in a collective). */
static int
stop_agreed (const StowTrainConfig *c, GError **error)
{
  int stop = stop_requested (c);
  if (c->comm == NULL)
    return stop;
  float word = (float)stop;
  StowCommRequest *q
      = stow_comm_broadcast (c->comm, &word, 1, STOW_DTYPE_F32, 0, error);
  if (q == NULL || !stow_comm_wait (c->comm, q, error))
    return -1;
  return (int)word;
}

static gboolean
train_loop (Run *r, guint64 first, GError **error)
{
  const StowTrainConfig *c = r->c;
  double tokens = (double)r->prog->global_batch * (double)r->prog->seq_len;
  gint64 t_start = g_get_monotonic_time ();
  g_autoptr (StowTrace) last = NULL;
  r->out->last_step = first - 1;
  guint64 skipped_in_a_row = 0;
  for (guint64 step = first; step <= c->steps; step++)
    {
      /* A stop asked for between steps: the last step is saved (the
       * check after it may have come just before the signal), or none
       * ran since the start. */
      int agreed = stop_agreed (c, error);
      if (agreed < 0)
        return FALSE;
      if (agreed)
        {
          if (r->out->last_step > r->out->saved_step
              && !save_checkpoint (r, r->out->last_step, error))
            return FALSE;
          break;
        }
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
      r->out->last_step = step;
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
      /* The log first: a run killed before the checkpoint is committed
       * has a line past it, which the resume drops (truncate_log); one
       * killed after it has the line. */
      log_step (r, &s);
      if (c->test_die_step == step
          && (c->comm ? (guint)stow_comm_rank (c->comm) : 0)
                 == c->test_die_rank)
        raise (SIGKILL);
      int after = stop_agreed (c, error);
      if (after < 0)
        return FALSE;
      gboolean stop = after != 0;
      if ((c->save_every && step % c->save_every == 0) || step == c->steps
          || stop)
        {
          if (!save_checkpoint (r, step, error))
            return FALSE;
          s.saved = TRUE;
        }
      if (c->progress)
        c->progress (&s, c->progress_user);
      skipped_in_a_row = st.skipped ? skipped_in_a_row + 1 : 0;
      if (c->max_skipped_steps && skipped_in_a_row >= c->max_skipped_steps)
        {
          /* Skipped steps leave the weights as they were: no use going
           * on, and the checkpoints are what they were. */
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_NONFINITE,
                       "steps %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT
                       ": %" G_GUINT64_FORMAT
                       " steps in a row skipped for non-finite gradients "
                       "(--max-skipped-steps %" G_GUINT64_FORMAT
                       "); lower --lr or check the data and the weights",
                       step - skipped_in_a_row + 1, step, skipped_in_a_row,
                       c->max_skipped_steps);
          return FALSE;
        }
    }
  if (r->out->last_step < c->steps)
    r->out->stopped_by = stop_requested (c);
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
  if (c->comm != NULL)
    {
      stow_comm_set_mode (c->comm, c->reduction);
      if (c->reduction == STOW_COMM_NATIVE
          && stow_comm_world_size (c->comm) > 1)
        note (c, "the gradients are reduce-scattered in MPI's order "
                 "(--reduction native): not one rank's bytes from 3 ranks "
                 "on, or 2 accumulating micro-batches");
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
    .comm = c->comm,
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

/* Whether directory @a is @dir_b or directly inside it. */
static gboolean
inside (const char *a, const char *dir_b)
{
  g_autofree char *parent = g_path_get_dirname (a);
  char *x = realpath (parent, NULL), *y = realpath (dir_b, NULL);
  char *z = realpath (a, NULL);
  gboolean in = y != NULL
                && ((x != NULL && g_str_equal (x, y))
                    || (z != NULL && g_str_equal (z, y)));
  free (x);
  free (y);
  free (z);
  return in;
}

/* "step-000003 to step-000006" or "step-000003": what OUT holds. */
static char *
describe_held (char **names)
{
  guint n = g_strv_length (names);
  if (n == 1)
    return g_strdup (names[0]);
  return g_strdup_printf ("%u checkpoints, %s to %s", n, names[0],
                          names[n - 1]);
}

/* The checkpoint the run continues (r->resume_dir), or none: --resume-from,
 * or with --resume OUT/latest, else OUT's newest committed checkpoint (a
 * link removed by hand), else none. */
static gboolean
find_resume (Run *r, char **held, GError **error)
{
  const StowTrainConfig *c = r->c;
  if (c->resume_from != NULL)
    {
      const char *f = c->resume_from;
      gboolean step = f[0] != '\0' && strspn (f, "0123456789") == strlen (f);
      g_autofree char *dir
          = step ? g_strdup_printf ("%s/step-%06" G_GUINT64_FORMAT, c->out_dir,
                                    g_ascii_strtoull (f, NULL, 10))
                 : g_strdup (f);
      if (!has_optimizer_state (dir))
        {
          g_autofree char *have
              = held[0] ? describe_held (held) : g_strdup ("no checkpoint");
          g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                       "--resume-from %s: %s is not a checkpoint (no "
                       "optimizer.stow); %s holds %s",
                       f, dir, c->out_dir, have);
          return FALSE;
        }
      r->resume_dir = g_steal_pointer (&dir);
      return TRUE;
    }
  if (!c->resume)
    return TRUE;
  r->resume_dir = stow_checkpoint_latest (c->out_dir, error);
  if (r->resume_dir == NULL && error && *error)
    return FALSE;
  guint n = g_strv_length (held);
  if (r->resume_dir == NULL && n > 0)
    {
      r->resume_dir = g_build_filename (c->out_dir, held[n - 1], NULL);
      note (c,
            "--resume: %s/latest is missing; resuming from the newest "
            "complete checkpoint, %s",
            c->out_dir, r->resume_dir);
    }
  else if (r->resume_dir == NULL)
    note (c, "--resume: no checkpoint in %s; starting from step 0", c->out_dir);
  return TRUE;
}

/* Under OUT's lock: where the run starts (*@done: the steps done), and
 * whether OUT may take its checkpoints.  A run that does not continue
 * OUT's checkpoints would replace them: refused without --overwrite. */
static gboolean
choose_start (Run *r, guint64 *done, GError **error)
{
  const StowTrainConfig *c = r->c;
  g_auto (GStrv) held = stow_checkpoint_list (c->out_dir, error);
  if (held == NULL || !find_resume (r, held, error))
    return FALSE;
  gboolean continues = r->resume_dir && inside (r->resume_dir, c->out_dir);
  if (held[0] != NULL && !continues && !c->overwrite)
    {
      g_autofree char *have = describe_held (held);
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_EXISTS,
                   "--out %s already holds checkpoints (%s)%s; continue "
                   "that run with --resume, replace them with --overwrite "
                   "(removed once this run has a checkpoint of its own), or "
                   "use another --out",
                   c->out_dir, have,
                   r->resume_dir ? ", not --resume-from's run" : "");
      return FALSE;
    }
  *done = 0;
  if (r->resume_dir == NULL)
    return TRUE;
  if (!inspect_checkpoint (r, r->resume_dir, done, error))
    return FALSE;
  note (c, "resuming from step %" G_GUINT64_FORMAT " (%s)", *done,
        r->resume_dir);
  return TRUE;
}

/* The weights and states the run starts from: the chosen checkpoint's, or
 * the model's. */
static gboolean
load_start (Run *r, guint64 done, GError **error)
{
  const StowTrainConfig *c = r->c;
  if (r->resume_dir != NULL)
    {
      if (!load_checkpoint (r, done, error))
        return FALSE;
    }
  else
    {
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

/* --log-json after a resume: the lines of the steps the checkpoint has
 * seen, so that the log says what the weights saw (a run stopped after
 * its last checkpoint logged steps the resume runs again).  Lines that do
 * not parse (a write cut by a kill) go too. */
static gboolean
truncate_log (const char *path, guint64 done, GError **error)
{
  g_autofree char *text = NULL;
  gsize len = 0;
  g_autoptr (GError) local = NULL;
  if (!g_file_get_contents (path, &text, &len, &local))
    {
      if (g_error_matches (local, G_FILE_ERROR, G_FILE_ERROR_NOENT))
        return TRUE;
      g_propagate_prefixed_error (error, g_steal_pointer (&local),
                                  "--log-json: ");
      return FALSE;
    }
  g_autoptr (GString) kept = g_string_sized_new (len);
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  for (guint i = 0; lines[i]; i++)
    {
      g_autoptr (JsonNode) n
          = lines[i][0] ? stow_json_parse_data (lines[i], -1, path, NULL)
                        : NULL;
      JsonObject *o
          = n && JSON_NODE_HOLDS_OBJECT (n) ? json_node_get_object (n) : NULL;
      guint64 step = 0;
      if (o && stow_json_get_u64 (o, path, "step", TRUE, &step, NULL)
          && step <= done)
        g_string_append_printf (kept, "%s\n", lines[i]);
    }
  if (kept->len == len)
    return TRUE;
  if (!stow_file_write_atomic (path, kept->str, (gssize)kept->len, error))
    {
      g_prefix_error (error, "--log-json: ");
      return FALSE;
    }
  return TRUE;
}

/* The files the run writes outside OUT, checked before the first step:
 * --log-json opened (cut to the resumed step), --trace's directory. */
static gboolean
open_outputs (Run *r, guint64 done, GError **error)
{
  const StowTrainConfig *c = r->c;
  if (c->trace_path)
    {
      g_autofree char *dir = g_path_get_dirname (c->trace_path);
      if (access (dir, W_OK | X_OK) != 0)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "--trace %s: %s: %s", c->trace_path, dir,
                       g_strerror (e));
          return FALSE;
        }
    }
  if (c->log_json == NULL)
    return TRUE;
  if (done > 0 && !truncate_log (c->log_json, done, error))
    return FALSE;
  r->log = fopen (c->log_json, done > 0 ? "a" : "w");
  if (r->log == NULL)
    {
      int e = errno;
      g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                   "--log-json %s: %s", c->log_json, g_strerror (e));
      return FALSE;
    }
  return TRUE;
}

/* OUT's lock (rank 0's alone: the other ranks never write there) and
 * where the run starts, which every rank must agree on. */
static gboolean
lock_and_start (Run *r, guint64 *done, GError **error)
{
  const StowTrainConfig *c = r->c;
  int rank = c->comm ? stow_comm_rank (c->comm) : 0;
  if (rank == 0)
    {
      r->lock = stow_run_lock_take (c->out_dir, error);
      if (r->lock == NULL)
        return FALSE;
    }
  if (c->comm != NULL)
    {
      /* Rank 0 looked at OUT first (it may have cleared what a killed run
       * left). */
      StowCommRequest *q = stow_comm_barrier (c->comm, error);
      if (q == NULL || !stow_comm_wait (c->comm, q, error))
        return FALSE;
    }
  if (!choose_start (r, done, error))
    return FALSE;
  if (c->comm == NULL)
    return TRUE;
  float words[2] = { (float)(*done >> 24), (float)(*done & 0xffffff) };
  float mine[2] = { words[0], words[1] };
  StowCommRequest *q
      = stow_comm_broadcast (c->comm, words, 2, STOW_DTYPE_F32, 0, error);
  if (q == NULL || !stow_comm_wait (c->comm, q, error))
    return FALSE;
  if (words[0] != mine[0] || words[1] != mine[1])
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_MISMATCH,
                   "rank %d of %d: starts at step %" G_GUINT64_FORMAT
                   " and rank 0 at step %" G_GUINT64_FORMAT
                   "; every rank must see the same --out %s",
                   rank, stow_comm_world_size (c->comm), *done,
                   ((guint64)words[0] << 24) | (guint64)words[1], c->out_dir);
      return FALSE;
    }
  return TRUE;
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
  /* The inputs first (a bad file is refused before OUT exists), then OUT's
   * lock before anything in it is read. */
  if (!open_inputs (&r, error))
    goto out;
  if (!lock_and_start (&r, &done, error))
    goto out;
  out->first_step = done + 1;
  out->last_step = done;
  out->saved_step = done;
  if (done >= c->steps)
    {
      note (c,
            "%s is at step %" G_GUINT64_FORMAT "; --steps %" G_GUINT64_FORMAT
            ": nothing to do",
            r.resume_dir, done, c->steps);
      out->nothing_to_do = TRUE;
      ok = TRUE;
      goto out;
    }
  /* Stopped while it planned or looked at OUT: nothing to load or save. */
  if ((out->stopped_by = stop_requested (c)) != 0)
    {
      ok = TRUE;
      goto out;
    }
  if (!make_backend (&r, error) || !load_start (&r, done, error)
      || !open_outputs (&r, done, error))
    goto out;
  r.ops->reset_peak (r.be);
  ok = train_loop (&r, done + 1, error);
out:
  run_clear (&r);
  return ok;
}
