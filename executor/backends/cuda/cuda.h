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

#include "executor/backends/registry.h"

G_BEGIN_DECLS

/* Whether a device, its driver and cuBLAS are usable; the reason if not. */
gboolean stow_backend_cuda_available (GError **error);
/* The device's name and its free and total memory, for messages. */
gboolean stow_backend_cuda_device_info (char **name, guint64 *free_bytes,
                                        guint64 *total_bytes, GError **error);

/* Makes a cuda backend (registry.h's create): @setup's device capacity is
 * cudaMalloc'd at once, the data ops read @setup->data on the host when
 * issued.  The training entries of its table are set; the tensors they
 * give are host copies (pull and push move them). */
StowBackend *stow_backend_cuda_new (const StowBackendSetup *setup,
                                    GError **error);

G_END_DECLS
