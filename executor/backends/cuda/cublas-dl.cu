/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/cublas-dl.cu: cuBLAS loaded with dlopen on first
 * use, so that no binary links libcublas and every one starts (and plans)
 * on a machine without it.  Only the seven entry points the runtime calls
 * are resolved; their prototypes are cublas_api.h's.  Not here: any GEMM.
 */
#include <dlfcn.h>

#include "executor/backends/cuda/llama-cuda-private.h"
#include "executor/dl.h"

static StowDlOnce cublas_once;
static StowCublas cublas_fns;

static gboolean
resolve (void *lib, const char *name, void **out, GError **error)
{
  *out = dlsym (lib, name);
  if (*out == NULL)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "cuBLAS: symbol %s not found (%s)", name, dlerror ());
      return FALSE;
    }
  return TRUE;
}

static gboolean
load_locked (GError **error)
{
  /* The soname of CUDA 13's cuBLAS first, then whatever libcublas.so the
   * loader finds (a development install), then the toolkit this was built
   * with, whose lib64 is not always on the loader's path. */
  const char *names[] = {
    "libcublas.so.13",
    "libcublas.so",
#ifdef STOW_CUDA_LIBDIR
    STOW_CUDA_LIBDIR "/libcublas.so.13",
#endif
  };
  void *lib = stow_dlopen_first (names, G_N_ELEMENTS (names), "cuBLAS",
                                 STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                                 error);
  if (lib == NULL)
    return FALSE;
  StowCublas f;
  if (!resolve (lib, "cublasCreate_v2", (void **)&f.create, error)
      || !resolve (lib, "cublasDestroy_v2", (void **)&f.destroy, error)
      || !resolve (lib, "cublasSetStream_v2", (void **)&f.set_stream, error)
      || !resolve (lib, "cublasSetWorkspace_v2", (void **)&f.set_workspace,
                   error)
      || !resolve (lib, "cublasSetMathMode", (void **)&f.set_math_mode, error)
      || !resolve (lib, "cublasGemmEx", (void **)&f.gemm_ex, error)
      || !resolve (lib, "cublasGetStatusString", (void **)&f.status_string,
                   error))
    {
      dlclose (lib);
      return FALSE;
    }
  cublas_fns = f;
  return TRUE;
}

const StowCublas *
stow_cublas_load (GError **error)
{
  return stow_dl_once (&cublas_once, load_locked, STOW_LLAMA_ERROR,
                       STOW_LLAMA_ERROR_INVALID, error)
             ? &cublas_fns
             : NULL;
}
