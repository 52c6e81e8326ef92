/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu.h: the cpu backend: real tensors, the "device" a
 * capacity-limited arena of host RAM (executor/arena.h), one worker thread
 * per stream joined only by the program's events, the decoder's kernels
 * from executor/llama.h and Adam from offload/adam.c.  It is the oracle
 * the other backends are compared against.  It runs one rank (one device)
 * of a LLaMA-family model; ops it cannot run yet (copies between tiers,
 * collectives, a host optimizer) are refused by name when issued.
 */
#pragma once

#include "executor/backends/registry.h"

G_BEGIN_DECLS

/* Makes a cpu backend (registry.h's create): checks that every buffer of
 * @setup->program holds what the runtime keeps in it
 * (STOW_BACKEND_ERROR_INVALID naming the buffer and both sizes), makes the
 * arena and starts the workers.  The training entries of its table are
 * set; the tensors they give are host memory. */
StowBackend *stow_backend_cpu_new (const StowBackendSetup *setup,
                                   GError **error);

G_END_DECLS
