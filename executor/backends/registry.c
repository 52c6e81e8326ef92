/* SPDX-License-Identifier: MIT
 *
 * executor/backends/registry.c: the table of real backends
 * (registry.h), with the build's one #if for CUDA.
 */
#include "executor/backends/registry.h"

#include "config.h"
#include "executor/backends/cpu.h"
#if STOW_HAVE_CUDA
#include "executor/backends/cuda/cuda.h"
#endif

static gboolean
cpu_available (GError **error)
{
  return TRUE;
}

static const StowBackendKind kinds[] = {
  {
      .name = "cpu",
      .available = cpu_available,
      .create = stow_backend_cpu_new,
  },
#if STOW_HAVE_CUDA
  {
      .name = "cuda",
      .available = stow_backend_cuda_available,
      .device_info = stow_backend_cuda_device_info,
      .create = stow_backend_cuda_new,
  },
#endif
};

gboolean
stow_backend_kind_built (const char *name)
{
  for (guint i = 0; i < G_N_ELEMENTS (kinds); i++)
    if (g_strcmp0 (kinds[i].name, name) == 0)
      return TRUE;
  return FALSE;
}

const StowBackendKind *
stow_backend_kind_find (const char *name, GError **error)
{
  for (guint i = 0; i < G_N_ELEMENTS (kinds); i++)
    if (g_strcmp0 (kinds[i].name, name) == 0)
      return &kinds[i];
  if (g_strcmp0 (name, "cuda") == 0)
    g_set_error_literal (error, STOW_BACKEND_ERROR,
                         STOW_BACKEND_ERROR_UNSUPPORTED,
                         "cuda: this build has no CUDA (meson found no "
                         "toolkit; see -Dcudatoolkit)");
  else
    g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                 "%s: the backends are cpu and cuda", name ? name : "(null)");
  return NULL;
}
