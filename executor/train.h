/* SPDX-License-Identifier: MIT
 *
 * executor/train.h: the training loop behind `stowage train`.  A plan (from
 * a plan file, from layout flags, or planned here for the local device) is
 * lowered to its step program, simulated once (the predicted peak and
 * step), then run step after step on a real backend: data per micro-batch
 * from the token stream, the program's ops, checkpoints that no crash can
 * damage, and resumption bit for bit.  Not here: printing (the caller gets
 * each step through a callback) and option parsing (cli/cmd-train.c).
 */
#pragma once

#include <glib.h>

#include "executor/data.h"
#include "offload/nvme.h"
#include "planner/layout.h"
#include "planner/memory.h"
#include "planner/program.h"

G_BEGIN_DECLS

#define STOW_TRAIN_ERROR (stow_train_error_quark ())
GQuark stow_train_error_quark (void);

typedef enum
{
  STOW_TRAIN_ERROR_INVALID,  /* settings that cannot run: names the flag */
  STOW_TRAIN_ERROR_MISMATCH, /* a checkpoint of another model or run */
  STOW_TRAIN_ERROR_NONFINITE, /* the loss itself is not finite */
} StowTrainError;

typedef struct
{
  guint64 step, steps; /* 1-based, of steps */
  double loss, grad_norm, lr;
  gboolean skipped; /* a non-finite gradient: no update */
  double step_s, tokens_per_s, elapsed_s, eta_s;
  guint64 peak_device_bytes;
  gboolean saved; /* a checkpoint was written after this step */
} StowTrainStep;

typedef void (*StowTrainProgress) (const StowTrainStep *s, gpointer user);
/* One line the user should see before the steps ("resuming from ..."). */
typedef void (*StowTrainNotice) (const char *line, gpointer user);

typedef struct
{
  const char *model_dir; /* config.json and model.safetensors */
  const char *data;      /* a token shard, a glob, or a text file */
  StowTokenizer tokenizer;
  const char *plan_path; /* NULL: plan from the flags below */
  /* The layout: with any pins, those dimensions as given; the rest (and
   * everything without pins) planned for the device (the fastest that
   * fits, as `stowage fit` chooses). */
  StowLayout layout;
  guint pins; /* StowPins */
  guint64 steps, seq, micro_batch, global_batch;
  StowPrecision precision;
  StowOptimSettings optim;
  gboolean shuffle;
  const char *out_dir;
  guint64 save_every; /* 0: only the last step */
  gboolean resume;
  const char *log_json;   /* one JSON object per step, or NULL */
  const char *trace_path; /* Chrome trace of the last step, or NULL */
  const char *backend;    /* "cpu" (default) or "cuda" */
  guint64 device_memory;  /* bytes; 0: half of the host's RAM (cpu), the
                           * GPU's free memory less a reserve (cuda) */
  guint threads;          /* 0: one per core */
  char **nvme_dirs;       /* --nvme-dir: where states on NVMe go, or NULL */
  gboolean delayed_update; /* ZeRO-Offload's one-step delayed update */
  gboolean stream_times;  /* the last --log-json line gets "streams" */
  guint copy_delay_us;    /* cpu backend's test knob (StowCpuSetup) */
  /* Test knob: the Nth I/O request to the optimizer's swap files from the
   * first step on fails so (StowSwapSetup); STOW_NVME_FAULT_NONE: none. */
  StowNvmeFault nvme_fault;
  guint64 nvme_fault_nth;
  /* Run with the pinned host buffers pageable when RLIMIT_MEMLOCK cannot
   * cover them (else the preflight refuses). */
  gboolean allow_unpinned;
  /* Test knob: the preflight takes this as RLIMIT_MEMLOCK, soft and hard,
   * and the process as one without CAP_IPC_LOCK; 0: the real ones. */
  guint64 test_memlock_limit;
  StowTrainProgress progress;
  StowTrainNotice notice;
  gpointer progress_user; /* of both */
  /* Out: what was planned and measured, for the caller to report. */
  char *layout_description;
  guint64 predicted_peak_bytes, measured_peak_bytes;
  /* the program's pinned host buffers (offloaded placements); measured
   * on the cpu backend, 0 elsewhere */
  guint64 predicted_pinned_bytes, measured_pinned_bytes;
  double predicted_step_s;
  guint64 first_step; /* 1 unless resumed */
  /* Out, of the last step run (measured: all 0 when none ran): per stream
   * seconds busy, and busy while the compute stream is idle (exposed, as
   * executor/trace.h defines it), measured on the backend and simulated
   * for the same program; the measured step from its first op's start to
   * its last op's end (the simulated one is predicted_step_s). */
  double measured_busy_s[STOW_N_STREAMS], measured_exposed_s[STOW_N_STREAMS];
  double simulated_busy_s[STOW_N_STREAMS], simulated_exposed_s[STOW_N_STREAMS];
  double measured_step_s;
} StowTrainConfig;

void stow_train_config_init (StowTrainConfig *c);
void stow_train_config_clear (StowTrainConfig *c);

/* Runs the training.  Errors name the flag, file and field at fault; a
 * failure leaves the last complete checkpoint in place. */
gboolean stow_train_run (StowTrainConfig *c, GError **error);

/* The cluster standing for this host's cpu backend: one "device" of
 * @device_bytes (an arena of host RAM) with the host's RAM and cores.
 * Its FLOP and bandwidth figures are nominal: the sim uses them for a
 * step's shape, not its length. */
StowCluster *stow_train_cpu_cluster (guint64 device_bytes, guint threads);
/* The cluster standing for this host's GPU under the cuda backend: the
 * catalog's figures for @device_name (as CUDA reports it) when it knows
 * the card, with @device_bytes as its memory. */
StowCluster *stow_train_gpu_cluster (guint64 device_bytes, guint threads,
                                     const char *device_name);

G_END_DECLS
