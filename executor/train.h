/* SPDX-License-Identifier: MIT
 *
 * executor/train.h: the training loop behind `stowage train`: a lowered
 * step program run step after step on a real backend, data per
 * micro-batch from the token stream, checkpoints that no crash can damage,
 * and resumption bit for bit.  Not here: planning, lowering and simulating
 * the program (the caller's: cli/train-plan.c), printing (the caller gets
 * each step through a callback) and option parsing (cli/cmd-train.c).
 */
#pragma once

#include <glib.h>
#include <signal.h>

#include "executor/checkpoint-io.h"
#include "executor/comm/comm.h"
#include "executor/data.h"
#include "offload/nvme.h"
#include "program/program.h"

G_BEGIN_DECLS

#define STOW_TRAIN_ERROR (stow_train_error_quark ())
GQuark stow_train_error_quark (void);

typedef enum
{
  STOW_TRAIN_ERROR_INVALID,   /* settings that cannot run: names the flag */
  STOW_TRAIN_ERROR_MISMATCH,  /* a checkpoint of another model or run */
  STOW_TRAIN_ERROR_NONFINITE, /* the loss itself is not finite */
  STOW_TRAIN_ERROR_EXISTS,    /* OUT holds checkpoints this run would
                                 replace (without --overwrite) */
} StowTrainError;

typedef struct
{
  guint64 step, steps; /* 1-based, of steps */
  double loss, grad_norm, lr;
  gboolean skipped; /* a non-finite gradient: no update */
  double step_s, tokens_per_s, elapsed_s, eta_s;
  guint64 peak_device_bytes;
  gboolean saved; /* a checkpoint was written after this step */
  /* The validation loss after this step (mean token cross-entropy over
   * the evaluation batches' targets), NaN when none ran. */
  double val_loss;
} StowTrainStep;

typedef void (*StowTrainProgress) (const StowTrainStep *s, gpointer user);
/* One line the user should see before the steps ("resuming from ..."). */
typedef void (*StowTrainNotice) (const char *line, gpointer user);

typedef struct
{
  /* What to run: a plan lowered for one device (the caller plans, lowers
   * and simulates; cli/train-plan.c), and the model it was lowered for. */
  const StowProgram *program;
  const StowModel *model;
  const char *model_dir; /* config.json and the weights (model-io.h) */
  /* Tensors in model_dir the model does not have: dropped with a notice
   * instead of refused. */
  gboolean ignore_extra_tensors;
  const char *data; /* a token shard, a glob, or a text file */
  StowTokenizer tokenizer;
  gboolean shuffle; /* the data order; seeded by program->optim.seed */
  /* Validation: the data (as @data, same tokenizer; NULL: none), a loss
   * every @eval_every steps (0: at the end only) over @eval_batches
   * global batches (0: every whole one the data holds). */
  const char *val_data;
  guint64 eval_every, eval_batches;
  guint64 steps; /* the last step to run (program->optim's total) */
  const char *out_dir;
  guint64 save_every;            /* 0: only the last step */
  StowWeightsFormat save_format; /* the checkpoints' weights */
  guint keep_last; /* older step-N removed after a save; 0: keep all */
  /* Steps in a row skipped for non-finite gradients after which the run
   * stops with STOW_TRAIN_ERROR_NONFINITE (its checkpoints as they were);
   * 0: never. */
  guint64 max_skipped_steps;
  /* Where the run starts.  @resume: OUT/latest, or OUT's newest
   * checkpoint when the link is gone, or step 0 when OUT holds none.
   * @resume_from: a checkpoint directory, or a step of OUT ("12":
   * OUT/step-000012).  Neither: step 0, and OUT must hold no checkpoint
   * unless @overwrite (they are removed once this run's first checkpoint
   * is committed).  A resumed checkpoint must have run with every setting
   * that changes the arithmetic or the data order as this run has it
   * (STOW_TRAIN_ERROR_MISMATCH names the flag and both values). */
  gboolean resume;
  const char *resume_from;
  gboolean overwrite;
  /* Set by the caller's signal handler (to the signal's number): the loop
   * finishes the step in flight, saves it and stops (StowTrainResult's
   * stopped_by).  NULL: never. */
  const volatile sig_atomic_t *stop_signal;
  const char *log_json;   /* one JSON object per step, or NULL */
  const char *trace_path; /* Chrome trace of the last step, or NULL */
  gboolean stream_times;  /* the last --log-json line gets "streams" */
  /* The simulated step's busy and exposed seconds per stream, which the
   * last --log-json line puts beside the measured ones. */
  double simulated_busy_s[STOW_N_STREAMS];
  double simulated_exposed_s[STOW_N_STREAMS];
  /* Where: a backend of executor/backends/registry.h and its setup. */
  const char *backend;     /* "cpu" or "cuda" */
  guint64 device_memory;   /* the device arena's bytes */
  guint threads;           /* 0: one per core */
  char **nvme_dirs;        /* where states and weights on NVMe go, or NULL */
  gboolean delayed_update; /* ZeRO-Offload's one-step delayed update */
  gboolean no_pin;         /* leave the pinned buffers pageable */
  guint copy_delay_us;     /* the cpu backend's test knob */
  /* Test knob: the Nth I/O request to the optimizer's swap files from the
   * first step on fails so (StowSwapSetup); STOW_NVME_FAULT_NONE: none. */
  StowNvmeFault nvme_fault;
  guint64 nvme_fault_nth;
  /* Several ranks (the program's dp > 1): the communicator they run over
   * (borrowed).  Every rank runs the loop on its micro-batches; rank 0
   * alone holds OUT's lock and writes the checkpoints, the others take
   * part in gathering the states for them and wait for each commit. */
  StowComm *comm;
  /* How the ranks' gradient reduce-scatters add (--reduction), set on
   * @comm for the run: DETERMINISTIC (0, the default) in rank order, one
   * rank's bytes; NATIVE in MPI's order.  The tied embedding's pair and
   * the norm's and loss's partial sums are added in rank order either
   * way.  Nothing on one rank. */
  StowCommMode reduction;
  char *log_json_owned, *trace_owned; /* the caller's, for its paths */
  /* Test knob: rank @test_die_rank kills itself (SIGKILL) once step
   * @test_die_step is logged, before its checkpoint; 0: never. */
  guint test_die_rank;
  guint64 test_die_step;
  StowTrainProgress progress;
  StowTrainNotice notice;
  gpointer progress_user; /* of both */
} StowTrainConfig;

/* What the run measured, for the caller to report. */
typedef struct
{
  guint64 first_step; /* 1 unless resumed */
  guint64 last_step;  /* the last step run; first_step - 1 when none ran */
  /* The step of the newest checkpoint in OUT when the run ended (this
   * run's or the one it resumed); 0: none. */
  guint64 saved_step;
  gboolean nothing_to_do; /* resumed at or past --steps: no step ran */
  int stopped_by;         /* the signal *stop_signal said; 0: not stopped */
  guint64 peak_bytes;     /* the device arena's peak */
  /* The program's pinned host buffers' peak; 0 where not measured. */
  guint64 pinned_peak_bytes;
  /* Of the last step run (all 0 when none ran): per stream seconds busy,
   * and busy while the compute stream is idle (exposed, as
   * program/trace.h defines it); the step from its first op's start to
   * its last op's end. */
  double busy_s[STOW_N_STREAMS], exposed_s[STOW_N_STREAMS];
  double step_s;
  /* The last validation loss, NaN without --val-data; over that many
   * batches and targets. */
  double val_loss;
  guint64 val_batches, val_targets;
} StowTrainResult;

/* Runs the training: @config is only read.  Errors name the flag, file
 * and field at fault; a failure leaves the last complete checkpoint in
 * place. */
gboolean stow_train_run (const StowTrainConfig *config, StowTrainResult *out,
                         GError **error);

G_END_DECLS
