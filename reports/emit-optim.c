/* SPDX-License-Identifier: MIT
 *
 * reports/emit-optim.c: the run's optimizer settings (core/optim.h) written
 * in each engine's terms (emit-private.h), and what each config cannot
 * carry.  The engines' learning-rate schedules are written out here as their
 * sources compute them, so that the notes can say which steps train at
 * another rate than stowage's; bench/engine-check.py runs DeepSpeed itself
 * against stowage train.
 */
#include "reports/emit-private.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* stowage's step k (1-based) trains at stow_optim_lr_at (k). */

/* ---- DeepSpeed ---------------------------------------------------------- */

/* DeepSpeed 0.19.8's schedulers (deepspeed/runtime/lr_schedules.py):
 * WarmupLR, WarmupDecayLR and WarmupCosineLR, linear warmup_type.  Each
 * sets the optimizer's lr at construction from last_batch_iteration -1
 * (WarmupLR and WarmupDecayLR: warmup_min_lr; WarmupCosineLR: 0), and the
 * engine steps it after each optimizer step (engine.py _take_model_step),
 * so step k trains at iteration k - 2; warmup_num_steps is taken as at
 * least 2. */
typedef enum
{
  DS_WARMUP_LR,
  DS_WARMUP_DECAY_LR,
  DS_WARMUP_COSINE_LR,
} DsKind;

typedef struct
{
  DsKind kind;
  double min_lr, max_lr;     /* WarmupLR, WarmupDecayLR */
  double min_ratio, cos_min; /* WarmupCosineLR: of the optimizer's lr */
  guint64 warmup, total;     /* warmup_num_steps, total_num_steps */
} DsSchedule;

static const char *const ds_names[] = {
  [DS_WARMUP_LR] = "WarmupLR",
  [DS_WARMUP_DECAY_LR] = "WarmupDecayLR",
  [DS_WARMUP_COSINE_LR] = "WarmupCosineLR",
};

/* The scheduler closest to stowage's schedule: with iteration k - 2 at step
 * k, a warmup of W steps from lr/W becomes DeepSpeed's warmup over W - 2
 * iterations from 2 lr/W (exact from step 2 on), and a decay over steps W
 * to T becomes one over iterations W - 2 to T - 2 (WarmupDecayLR) or, with
 * WarmupCosineLR's one-iteration offset (real_last_step = iteration -
 * warmup + 1), W - 1 to T - 1: exact after the warmup, the warmup then a
 * step behind.  What is left apart, the notes count. */
static void
ds_schedule (const StowOptimSettings *o, DsSchedule *d)
{
  double lr = o->lr;
  guint64 w = o->warmup_steps, t = o->total_steps;
  memset (d, 0, sizeof *d);
  d->max_lr = lr;
  switch (o->schedule)
    {
    case STOW_LR_CONSTANT:
      d->kind = DS_WARMUP_LR;
      d->min_lr = w <= 1 ? lr : 2.0 * lr / (double)w;
      d->warmup = w <= 1 ? 2 : MAX (w - 2, 2);
      break;
    case STOW_LR_LINEAR:
      d->kind = DS_WARMUP_DECAY_LR;
      d->min_lr = o->min_lr; /* where the decay ends */
      d->warmup = w >= 4 ? w - 2 : 2;
      d->total = t >= 3 ? t - 2 : 1;
      break;
    case STOW_LR_COSINE:
      d->kind = DS_WARMUP_COSINE_LR;
      d->warmup = w >= 3 ? w - 1 : 2;
      d->min_ratio = w >= 3 ? 1.0 / (double)w : 1.0;
      d->cos_min = lr > 0 ? o->min_lr / lr : 0.0;
      d->total = t >= 2 ? t - 1 : 1;
      break;
    }
}

/* The lr DeepSpeed trains step @k at (lr_schedules.py, as above). */
static double
ds_lr_at (const DsSchedule *d, double lr, guint64 k)
{
  double i = (double)k - 2.0;
  double wn = (double)MAX (d->warmup, 2);
  if (d->kind == DS_WARMUP_COSINE_LR)
    {
      if (i < 0)
        return 0.0;
      double ratio;
      if (i < wn)
        ratio = d->min_ratio + (1.0 - d->min_ratio) * i / wn;
      else
        {
          double p
              = MIN (1.0, (i - wn + 1.0) / MAX (1.0, (double)d->total - wn));
          ratio = MAX (0.0,
                       d->cos_min
                           + (1.0 - d->cos_min) * (1.0 + cos (G_PI * p)) / 2.0);
        }
      return lr * ratio;
    }
  if (i < 0)
    return d->min_lr;
  double gamma;
  if (i < wn)
    gamma = i / wn;
  else if (d->kind == DS_WARMUP_LR)
    gamma = 1.0;
  else
    gamma
        = MAX (0.0, ((double)d->total - i) / MAX (1.0, (double)d->total - wn));
  return d->min_lr + (d->max_lr - d->min_lr) * gamma;
}

void
stow_emit_deepspeed_optim (JsonObject *root, const StowPlanFile *p)
{
  const StowOptimSettings *o = &p->training.optim;
  /* DeepSpeed's default is 1.0 in 0.19.8 (runtime/constants.py
   * GRADIENT_CLIPPING_DEFAULT) and 0 in others: always written. */
  json_object_set_double_member (root, "gradient_clipping",
                                 MAX (o->max_grad_norm, 0.0));
  if (p->training.optimizer == STOW_OPTIMIZER_ADAMW)
    {
      /* "AdamW" builds FusedAdam on the device and, with the optimizer
       * offloaded, DeepSpeedCPUAdam (adamw_mode) on the host
       * (engine.py _configure_basic_optimizer, get_optimizer_configuration);
       * a client optimizer beside an offload is refused unless
       * zero_force_ds_cpu_optimizer is false. */
      JsonObject *opt = json_object_new ();
      json_object_set_string_member (opt, "type", "AdamW");
      JsonObject *params = json_object_new ();
      json_object_set_double_member (params, "lr", o->lr);
      JsonArray *betas = json_array_new ();
      json_array_add_double_element (betas, o->beta1);
      json_array_add_double_element (betas, o->beta2);
      json_object_set_array_member (params, "betas", betas);
      json_object_set_double_member (params, "eps", o->eps);
      json_object_set_double_member (params, "weight_decay", o->weight_decay);
      json_object_set_boolean_member (params, "adam_w_mode", TRUE);
      json_object_set_object_member (opt, "params", params);
      json_object_set_object_member (root, "optimizer", opt);
    }
  DsSchedule d;
  ds_schedule (o, &d);
  JsonObject *sch = json_object_new ();
  json_object_set_string_member (sch, "type", ds_names[d.kind]);
  JsonObject *sp = json_object_new ();
  if (d.kind != DS_WARMUP_LR)
    json_object_set_int_member (sp, "total_num_steps", (gint64)d.total);
  if (d.kind == DS_WARMUP_COSINE_LR)
    {
      json_object_set_double_member (sp, "warmup_min_ratio", d.min_ratio);
      json_object_set_double_member (sp, "cos_min_ratio", d.cos_min);
    }
  else
    {
      json_object_set_double_member (sp, "warmup_min_lr", d.min_lr);
      json_object_set_double_member (sp, "warmup_max_lr", d.max_lr);
    }
  json_object_set_int_member (sp, "warmup_num_steps", (gint64)d.warmup);
  json_object_set_string_member (sp, "warmup_type", "linear");
  json_object_set_object_member (sch, "params", sp);
  json_object_set_object_member (root, "scheduler", sch);
}

/* ---- Megatron-LM -------------------------------------------------------- */

/* Megatron-LM's OptimizerParamScheduler (megatron/core/
 * optimizer_param_scheduler.py get_lr): step(0) at construction and
 * step(increment) after each optimizer step, so step k trains at
 * num_steps k - 1 (in iterations: warmup and decay are counted in the same
 * samples).  Its warmup from --lr-warmup-init over --lr-warmup-iters W - 1
 * reaches lr k/W at step k, and its decay over --lr-decay-iters T - 1 is
 * stowage's from step W to T: exact for --warmup 1 or more. */
typedef struct
{
  double init, lr, min_lr;
  guint64 warmup, decay; /* --lr-warmup-iters, --lr-decay-iters */
  StowLrSchedule style;
} MegatronSchedule;

static void
megatron_schedule (const StowOptimSettings *o, MegatronSchedule *g)
{
  guint64 w = o->warmup_steps;
  g->lr = o->lr, g->min_lr = o->min_lr, g->style = o->schedule;
  g->warmup = w >= 2 ? w - 1 : 0;
  g->init = w >= 2 ? o->lr / (double)w : 0.0;
  g->decay = o->total_steps >= 2 ? o->total_steps - 1 : 1;
}

static double
megatron_lr_at (const MegatronSchedule *g, guint64 k)
{
  double n = (double)k - 1.0, wm = (double)g->warmup;
  if (g->warmup > 0 && n <= wm)
    return g->init + (g->lr - g->init) * n / wm;
  if (g->style == STOW_LR_CONSTANT)
    return g->lr;
  if (n > (double)g->decay)
    return g->min_lr;
  double ratio = (n - wm) / ((double)g->decay - wm);
  double coeff = g->style == STOW_LR_COSINE ? 0.5 * (cos (G_PI * ratio) + 1.0)
                                            : 1.0 - ratio;
  return g->min_lr + coeff * (g->lr - g->min_lr);
}

void
stow_emit_append_double (GString *s, double v)
{
  char buf[G_ASCII_DTOSTR_BUF_SIZE];
  for (int digits = 1; digits <= 17; digits++)
    {
      char fmt[8];
      g_snprintf (fmt, sizeof fmt, "%%.%dg", digits);
      g_ascii_formatd (buf, sizeof buf, fmt, v);
      if (g_ascii_strtod (buf, NULL) == v)
        break;
    }
  g_string_append (s, buf);
  /* "1.0", not "1": a float to Python, YAML and argparse's type=float
   * alike, and to a reader. */
  if (strpbrk (buf, ".eEni") == NULL)
    g_string_append (s, ".0");
}

static void
flag_d (GString *s, const char *name, double v)
{
  g_string_append_printf (s, "%s ", name);
  stow_emit_append_double (s, v);
  g_string_append_c (s, '\n');
}

void
stow_emit_megatron_optim (GString *s, const StowPlanFile *p)
{
  const StowOptimSettings *o = &p->training.optim;
  MegatronSchedule g;
  megatron_schedule (o, &g);
  flag_d (s, "--lr", o->lr);
  flag_d (s, "--min-lr", o->min_lr);
  g_string_append_printf (s, "--lr-decay-style %s\n",
                          stow_lr_schedule_name (o->schedule));
  if (g.warmup > 0)
    {
      g_string_append_printf (s, "--lr-warmup-iters %" G_GUINT64_FORMAT "\n",
                              g.warmup);
      flag_d (s, "--lr-warmup-init", g.init);
    }
  if (o->total_steps > 0)
    {
      g_string_append_printf (s, "--train-iters %" G_GUINT64_FORMAT "\n",
                              o->total_steps);
      if (o->schedule != STOW_LR_CONSTANT)
        g_string_append_printf (s, "--lr-decay-iters %" G_GUINT64_FORMAT "\n",
                                g.decay);
    }
  flag_d (s, "--weight-decay", o->weight_decay);
  if (p->training.optimizer == STOW_OPTIMIZER_ADAMW)
    {
      flag_d (s, "--adam-beta1", o->beta1);
      flag_d (s, "--adam-beta2", o->beta2);
      flag_d (s, "--adam-eps", o->eps);
    }
  /* 0 turns clipping off (megatron/core/optimizer: clip_grad > 0). */
  flag_d (s, "--clip-grad", MAX (o->max_grad_norm, 0.0));
}

/* ---- FSDP --------------------------------------------------------------- */

void
stow_emit_fsdp_optim (GString *s, const StowPlanFile *p)
{
  const StowOptimSettings *o = &p->training.optim;
  g_string_append (
      s, "\n# The optimizer, its schedule and clipping, as stowage plans the "
         "run:\n# AdamW, weight decay on the tensors of 2+ dimensions (all "
         "with DECAY_ALL);\n# step k at LR k / WARMUP_STEPS during the "
         "warmup, then LR_SCHEDULE from LR to\n# MIN_LR at TOTAL_STEPS.\n"
         "import math\n\n");
  g_string_append (s, "LR = ");
  stow_emit_append_double (s, o->lr);
  g_string_append (s, "\nMIN_LR = ");
  stow_emit_append_double (s, o->min_lr);
  g_string_append_printf (s,
                          "\nWARMUP_STEPS = %" G_GUINT64_FORMAT
                          "\nTOTAL_STEPS = %" G_GUINT64_FORMAT "%s\n",
                          o->warmup_steps, o->total_steps,
                          o->total_steps ? "" : "  # not set (--steps)");
  g_string_append_printf (s, "LR_SCHEDULE = \"%s\"\nBETAS = (",
                          stow_lr_schedule_name (o->schedule));
  stow_emit_append_double (s, o->beta1);
  g_string_append (s, ", ");
  stow_emit_append_double (s, o->beta2);
  g_string_append (s, ")\nEPS = ");
  stow_emit_append_double (s, o->eps);
  g_string_append (s, "\nWEIGHT_DECAY = ");
  stow_emit_append_double (s, o->weight_decay);
  g_string_append_printf (s, "\nDECAY_ALL = %s\nMAX_GRAD_NORM = ",
                          o->decay_on == STOW_DECAY_ALL ? "True" : "False");
  stow_emit_append_double (s, MAX (o->max_grad_norm, 0.0));
  g_string_append (
      s,
      "  # 0: no clipping\n\n"
      "def make_optimizer(model):\n"
      "    params = [p for p in model.parameters() if p.requires_grad]\n"
      "    decay = [p for p in params if DECAY_ALL or p.ndim >= 2]\n"
      "    rest = [p for p in params if not (DECAY_ALL or p.ndim >= 2)]\n"
      "    return torch.optim.AdamW(\n"
      "        [{\"params\": decay, \"weight_decay\": WEIGHT_DECAY},\n"
      "         {\"params\": rest, \"weight_decay\": 0.0}],\n"
      "        lr=LR, betas=BETAS, eps=EPS)\n\n"
      "def lr_at(step):  # the 1-based optimizer step\n"
      "    if WARMUP_STEPS and step <= WARMUP_STEPS:\n"
      "        return LR * step / WARMUP_STEPS\n"
      "    if LR_SCHEDULE == \"constant\":\n"
      "        return LR\n"
      "    frac = min(1.0, (step - WARMUP_STEPS) / max(1, TOTAL_STEPS - "
      "WARMUP_STEPS))\n"
      "    k = 0.5 * (1 + math.cos(math.pi * frac)) if LR_SCHEDULE == "
      "\"cosine\" else 1 - frac\n"
      "    return MIN_LR + (LR - MIN_LR) * k\n\n"
      "def make_scheduler(optimizer):\n"
      "    # LambdaLR's n (0 until the first scheduler.step()) sets the lr of "
      "step n + 1.\n"
      "    return torch.optim.lr_scheduler.LambdaLR(\n"
      "        optimizer, lambda n: lr_at(n + 1) / LR if LR else 0.0)\n\n"
      "# Each step, after the backward of its micro-batches:\n"
      "#   if MAX_GRAD_NORM > 0:\n"
      "#       torch.nn.utils.clip_grad_norm_(model.parameters(), "
      "MAX_GRAD_NORM)  # FSDP1: model.clip_grad_norm_(MAX_GRAD_NORM)\n"
      "#   optimizer.step(); scheduler.step(); optimizer.zero_grad()\n");
}

/* ---- what the configs cannot carry ---------------------------------------
 */

/* Steps 1..@n where @engine_lr differs from stowage's: how many, the first
 * and last, the largest difference. */
typedef struct
{
  guint64 n, differ, first, last;
  double worst;
} LrDiff;

static void
lr_diff_add (LrDiff *d, guint64 k, double mine, double theirs)
{
  double a = fabs (mine - theirs);
  if (a <= 1e-12 * MAX (fabs (mine), fabs (theirs)))
    return;
  if (d->differ++ == 0)
    d->first = k;
  d->last = k;
  d->worst = MAX (d->worst, a);
}

/* The steps compared: the run's, or without a length the warmup and a few
 * steps past it (after which both stay at lr). */
static guint64
steps_compared (const StowOptimSettings *o)
{
  return o->total_steps ? o->total_steps : o->warmup_steps + 4;
}

static void note (GPtrArray *notes, StowEmitKind kind, const char *format, ...)
    G_GNUC_PRINTF (3, 4);

static void
note (GPtrArray *notes, StowEmitKind kind, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_ptr_array_add (notes, g_strdup_printf ("--emit %s: %s",
                                           stow_emit_kind_name (kind), msg));
}

/* "steps 1 to 3" or "step 1" */
static char *
step_range (const LrDiff *d)
{
  return d->first == d->last
             ? g_strdup_printf ("step %" G_GUINT64_FORMAT, d->first)
             : g_strdup_printf ("steps %" G_GUINT64_FORMAT
                                " to %" G_GUINT64_FORMAT,
                                d->first, d->last);
}

static void
deepspeed_notes (const StowPlanFile *p, GPtrArray *notes, StowEmitKind kind)
{
  const StowOptimSettings *o = &p->training.optim;
  DsSchedule d;
  ds_schedule (o, &d);
  LrDiff diff = { .n = steps_compared (o) };
  for (guint64 k = 1; k <= diff.n; k++)
    lr_diff_add (&diff, k, stow_optim_lr_at (o, k), ds_lr_at (&d, o->lr, k));
  if (diff.differ)
    {
      g_autofree char *range = step_range (&diff);
      note (notes, kind,
            "DeepSpeed's %s sets the lr of step 1 before it runs and warms "
            "up over at least 2 steps: %" G_GUINT64_FORMAT
            " of %s %" G_GUINT64_FORMAT
            " steps (%s) train at another lr than stowage's, at most %.3g "
            "apart; the rest at the same",
            ds_names[d.kind], diff.differ,
            o->total_steps ? "the run's" : "the first", diff.n, range,
            diff.worst);
    }
  if (p->training.optimizer != STOW_OPTIMIZER_ADAMW)
    note (notes, kind,
          "--optimizer %s: the config names no optimizer (stowage's "
          "settings are AdamW's): pass yours to deepspeed.initialize "
          "(optimizer=...), and with the optimizer offloaded set "
          "\"zero_force_ds_cpu_optimizer\": false",
          stow_optimizer_name (p->training.optimizer));
  else if (o->decay_on == STOW_DECAY_MATRICES && o->weight_decay > 0)
    note (notes, kind,
          "ds_config.json cannot say which tensors decay: give "
          "deepspeed.initialize model_parameters=[{\"params\": the tensors "
          "of 2+ dimensions}, {\"params\": the rest, \"weight_decay\": 0.0}], "
          "as stowage leaves norms and biases undecayed (or plan with "
          "--weight-decay-on all)");
  if (o->total_steps)
    note (notes, kind,
          "the run's length is the training loop's (no ds_config.json key): "
          "%" G_GUINT64_FORMAT " optimizer steps are %" G_GUINT64_FORMAT
          " micro-batches through engine.backward () and engine.step ()",
          o->total_steps, o->total_steps * p->layout.grad_accum);
}

static void
megatron_notes (const StowPlanFile *p, GPtrArray *notes, StowEmitKind kind)
{
  const StowOptimSettings *o = &p->training.optim;
  MegatronSchedule g;
  megatron_schedule (o, &g);
  LrDiff diff = { .n = steps_compared (o) };
  for (guint64 k = 1; k <= diff.n; k++)
    lr_diff_add (&diff, k, stow_optim_lr_at (o, k), megatron_lr_at (&g, k));
  if (diff.differ)
    {
      g_autofree char *range = step_range (&diff);
      note (notes, kind,
            "Megatron-LM's schedule starts its decay at step 1 with the peak "
            "lr, stowage's (--warmup 0) one step into it: %" G_GUINT64_FORMAT
            " of %" G_GUINT64_FORMAT " steps (%s) differ, at most %.3g "
            "apart; --warmup 1 gives the same schedule",
            diff.differ, diff.n, range, diff.worst);
    }
  if (o->decay_on == STOW_DECAY_ALL && o->weight_decay > 0)
    note (notes, kind,
          "Megatron-LM decays only tensors of 2+ dimensions (its default "
          "no_weight_decay_cond): --weight-decay-on all has no flag; pass "
          "no_weight_decay_cond=lambda name, param: False to its optimizer "
          "setup, or plan with --weight-decay-on matrices");
  if (o->total_steps == 0)
    note (notes, kind,
          "the run's length is not set (--steps N): add --train-iters N, "
          "which Megatron-LM needs");
}

static void
accelerate_notes (const StowPlanFile *p, const char *type, GPtrArray *notes,
                  StowEmitKind kind)
{
  const StowOptimSettings *o = &p->training.optim;
  gboolean ds = g_strcmp0 (type, "DEEPSPEED") == 0;
  gboolean mg = g_strcmp0 (type, "MEGATRON_LM") == 0;
  GString *s = g_string_new ("AdamW lr ");
  stow_emit_append_double (s, o->lr);
  g_string_append (s, ", betas (");
  stow_emit_append_double (s, o->beta1);
  g_string_append (s, ", ");
  stow_emit_append_double (s, o->beta2);
  g_string_append (s, "), eps ");
  stow_emit_append_double (s, o->eps);
  g_string_append (s, ", weight decay ");
  stow_emit_append_double (s, o->weight_decay);
  g_string_append_printf (s, " on %s, a %s schedule",
                          o->decay_on == STOW_DECAY_ALL
                              ? "every tensor"
                              : "the tensors of 2+ dimensions",
                          stow_lr_schedule_name (o->schedule));
  if (o->warmup_steps)
    g_string_append_printf (s, " after %" G_GUINT64_FORMAT " warmup steps",
                            o->warmup_steps);
  if (o->total_steps)
    g_string_append_printf (s, " over %" G_GUINT64_FORMAT " steps",
                            o->total_steps);
  g_autofree char *what = g_string_free (s, FALSE);
  if (p->training.optimizer != STOW_OPTIMIZER_ADAMW)
    note (notes, kind,
          "accelerate's config has no optimizer or schedule keys: create "
          "--optimizer %s and its schedule in train.py",
          stow_optimizer_name (p->training.optimizer));
  else
    note (notes, kind,
          "accelerate's config has no optimizer or schedule keys: create "
          "them in train.py (%s; --emit fsdp writes both in Python)%s",
          what,
          ds ? ", or give deepspeed_config_file, the --emit deepspeed "
               "config, which holds them, in place of deepspeed_config's "
               "other keys"
             : "");
  if (!ds && !mg && o->max_grad_norm > 0)
    {
      GString *c = g_string_new (NULL);
      stow_emit_append_double (c, o->max_grad_norm);
      g_autofree char *cs = g_string_free (c, FALSE);
      note (notes, kind,
            "distributed_type %s has no clipping key: call "
            "accelerator.clip_grad_norm_(model.parameters(), %s) before each "
            "optimizer step",
            type, cs);
    }
}

void
stow_emit_optim_notes (StowEmitKind kind, const StowPlanFile *p,
                       const char *accelerate_type, GPtrArray *notes)
{
  switch (kind)
    {
    case STOW_EMIT_DEEPSPEED:
      deepspeed_notes (p, notes, kind);
      break;
    case STOW_EMIT_MEGATRON:
      megatron_notes (p, notes, kind);
      break;
    case STOW_EMIT_ACCELERATE:
      accelerate_notes (p, accelerate_type, notes, kind);
      break;
    case STOW_EMIT_FSDP: /* the snippet holds them all */
    case STOW_EMIT_PLAN:
      break;
    }
}
