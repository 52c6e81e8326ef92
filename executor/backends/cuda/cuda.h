/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/cuda.h: the cuda backend: the step program on an
 * NVIDIA GPU.  The "device" tier is one cudaMalloc'd region with a hard
 * capacity, carved by the same arena bookkeeping as the cpu backend's
 * (executor/arena.h), so its peak is what the planner predicts; one CUDA
 * stream per program stream; a CUDA event per program event, and every
 * cross-stream wait is cudaStreamWaitEvent; nothing inside a step blocks
 * the host (no synchronous copy, no device-wide synchronize) until the
 * driver's synchronize at its end.  The compute is the GPU decoder runtime
 * (llama-cuda.h).  The cpu backend stays the oracle it is tested against.
 *
 * Built only where the CUDA toolkit is (STOW_HAVE_CUDA); the binary then
 * still starts, and plans, without a driver: the runtime is loaded on
 * first use.
 */
#pragma once

#include "executor/backends/cpu.h"

G_BEGIN_DECLS

typedef struct
{
  const StowProgram *program; /* borrowed: must outlive the backend */
  const StowModel *model;
  /* The device tier's capacity: cudaMalloc'd at once, so it must fit the
   * card's free memory. */
  guint64 device_capacity_bytes;
  StowCpuDataFn data; /* called on the host when the data op is issued */
  gpointer data_user;
  /* ZeRO-Offload's one-step delayed parameter update (--delayed-update),
   * as the cpu backend's: needs the optimizer in host memory. */
  gboolean delayed_update;
} StowCudaSetup;

/* Whether a device, its driver and cuBLAS are usable; the reason if not. */
gboolean stow_backend_cuda_available (GError **error);
/* The device's name and its free and total memory, for messages. */
gboolean stow_backend_cuda_device_info (char **name, guint64 *free_bytes,
                                        guint64 *total_bytes, GError **error);

StowBackend *stow_backend_cuda_new (const StowCudaSetup *setup,
                                    GError **error);
gboolean stow_backend_cuda_alloc_persistent (StowBackend *cuda,
                                             GError **error);
void stow_backend_cuda_begin_step (StowBackend *cuda, guint64 step);
/* After the step's synchronize: reads the loss and the norm back. */
gboolean stow_backend_cuda_step_stats (StowBackend *cuda, StowStepStats *out,
                                       GError **error);
guint64 stow_backend_cuda_peak_bytes (StowBackend *cuda);
void stow_backend_cuda_reset_peak (StowBackend *cuda);
/* The delayed update's pending gradients, as the cpu backend's
 * stow_backend_cpu_pending and stow_backend_cpu_set_pending. */
void *stow_backend_cuda_pending (StowBackend *cuda, guint unit,
                                 gboolean *pending);
void stow_backend_cuda_set_pending (StowBackend *cuda, gboolean pending);
/* The program's pinned host buffers' peak (all persistent). */
guint64 stow_backend_cuda_pinned_peak_bytes (StowBackend *cuda);

/* Host copies of the persistent tensors of @unit (as the cpu backend's
 * accessors), for loading and saving: stow_backend_cuda_pull fills them
 * from the device, stow_backend_cuda_push sends them up. */
void *stow_backend_cuda_weights (StowBackend *cuda, guint unit);
float *stow_backend_cuda_master (StowBackend *cuda, guint unit);
float *stow_backend_cuda_moment (StowBackend *cuda, guint unit, guint which);
gboolean stow_backend_cuda_pull (StowBackend *cuda, GError **error);
gboolean stow_backend_cuda_push (StowBackend *cuda, GError **error);

G_END_DECLS
