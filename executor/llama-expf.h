/* SPDX-License-Identifier: MIT
 *
 * executor/llama-expf.h: the decoder runtimes' exp, one definition for the
 * cpu runtime (C) and the cuda one (CUDA C++, device code built with
 * -fmad=false), so that both compute the same bits operation for
 * operation.
 *
 * exp(x) in fp32 to about 1 ulp (Cephes expf's reduction and polynomial),
 * branch-free so that `omp simd` loops of it vectorise: glibc's expf has
 * no vector variant without -ffast-math.  Inputs are clamped to
 * [-87.3, 88.3], where 2^n stays a normal float: exp of a masked or very
 * negative score comes out ~1e-38, not 0, which no sum here can see, and
 * a huge input gives 2e38, not infinity.
 */
#pragma once

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define STOW_EXPF_INLINE static __host__ __device__ __forceinline__
#else
#define STOW_EXPF_INLINE static inline
#endif

STOW_EXPF_INLINE float
stow_llama_expf (float x)
{
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  /* n = round (x / ln 2) by the 1.5 * 2^23 trick (round to nearest). */
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy (&scale, &bits, sizeof scale);
  return p * scale;
}
