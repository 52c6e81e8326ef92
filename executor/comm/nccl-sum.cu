/* SPDX-License-Identifier: MIT
 *
 * executor/comm/nccl-sum.cu: the deterministic reductions' rank-order sum
 * on the device (nccl-private.h): one thread per element, the ranks'
 * contributions added in rank order.  Built with -fmad=false, as every
 * kernel of the executor; a sum has no multiply to fuse anyway.
 */
#include <cuda_bf16.h>

#include "executor/comm/nccl-private.h"

template <typename T>
static __device__ float
load (const T *p, guint64 i);

template <>
__device__ float
load<float> (const float *p, guint64 i)
{
  return p[i];
}

template <>
__device__ float
load<__nv_bfloat16> (const __nv_bfloat16 *p, guint64 i)
{
  return __bfloat162float (p[i]);
}

template <typename T>
static __global__ void
sum_rank_order (T *out, const T *own, const T *in, int n, int me,
                guint64 part)
{
  guint64 i = (guint64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= part)
    return;
  T acc = me == 0 ? own[i] : in[i];
  for (int q = 1; q < n; q++)
    {
      const T *c = q == me ? own : in + (guint64)q * part;
      float s = load<T> (&acc, 0) + load<T> (c, i);
      if constexpr (sizeof (T) == 2)
        acc = __float2bfloat16_rn (s);
      else
        acc = s;
    }
  out[i] = acc;
}

int
stow_comm_nccl_sum_rank_order (void *out, const void *own, const void *in,
                               int n, int me, guint64 part, gboolean bf16,
                               cudaStream_t stream)
{
  if (part == 0)
    return cudaSuccess;
  const unsigned threads = 256;
  unsigned blocks = (unsigned)((part + threads - 1) / threads);
  if (bf16)
    sum_rank_order<<<blocks, threads, 0, stream>>> (
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)own,
        (const __nv_bfloat16 *)in, n, me, part);
  else
    sum_rank_order<<<blocks, threads, 0, stream>>> (
        (float *)out, (const float *)own, (const float *)in, n, me, part);
  return cudaGetLastError ();
}
