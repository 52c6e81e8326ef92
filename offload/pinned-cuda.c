/* SPDX-License-Identifier: MIT
 *
 * offload/pinned-cuda.c: page-locks host slabs through the CUDA runtime so
 * that copies from them run at full PCIe speed.  Linked only into builds
 * with CUDA; with no driver or no device at run time it declines and the
 * pool falls back to mlock.
 */
#include <cuda_runtime_api.h>

#include "offload/pinned.h"

gboolean
stow_pinned_cuda_register (void *addr, guint64 bytes)
{
  int n = 0;
  /* cudart_static loads the driver on first use; no driver or no device
   * shows up here as an error or a zero count. */
  if (cudaGetDeviceCount (&n) != cudaSuccess || n == 0)
    {
      cudaGetLastError ();
      return FALSE;
    }
  /* Portable: the pages count as pinned for every device and context. */
  cudaError_t e = cudaHostRegister (addr, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess)
    {
      g_info ("pinned pool: cudaHostRegister of %" G_GUINT64_FORMAT
              " bytes failed: %s; trying mlock",
              bytes, cudaGetErrorString (e));
      cudaGetLastError ();
      return FALSE;
    }
  return TRUE;
}

void
stow_pinned_cuda_unregister (void *addr)
{
  cudaHostUnregister (addr);
}
