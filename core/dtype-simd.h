/* SPDX-License-Identifier: MIT
 *
 * core/dtype-simd.h: core/dtype.h's fp32 -> bf16 rounding in vector lanes
 * (round to nearest even, every NaN to 0x7fc0: stow_f32_to_bf16's bits),
 * for the kernels that round whole rows: the decoder runtime's streamed
 * product rows and CPU Adam's low-precision copy.  x86: each function is
 * built for its instruction set and inlines into callers built for it.
 */
#pragma once

#include <immintrin.h>

/* Eight floats' bf16 codes, each in the low half of its 32-bit lane. */
__attribute__ ((target ("avx2"))) static inline __m256i
stow_bf16_round_8 (__m256 p)
{
  __m256i b = _mm256_castps_si256 (p);
  __m256i odd
      = _mm256_and_si256 (_mm256_srli_epi32 (b, 16), _mm256_set1_epi32 (1));
  __m256i r = _mm256_srli_epi32 (
      _mm256_add_epi32 (_mm256_add_epi32 (b, _mm256_set1_epi32 (0x7fff)), odd),
      16);
  /* |b| is at most 0x7fffffff: a signed comparison finds the NaNs. */
  __m256i nan = _mm256_cmpgt_epi32 (
      _mm256_and_si256 (b, _mm256_set1_epi32 (0x7fffffff)),
      _mm256_set1_epi32 (0x7f800000));
  return _mm256_blendv_epi8 (r, _mm256_set1_epi32 (0x7fc0), nan);
}

/* Sixteen floats' bf16 codes. */
__attribute__ ((target ("avx512f"))) static inline __m256i
stow_bf16_round_16 (__m512 p)
{
  __m512i b = _mm512_castps_si512 (p);
  __m512i odd
      = _mm512_and_si512 (_mm512_srli_epi32 (b, 16), _mm512_set1_epi32 (1));
  __m512i r = _mm512_srli_epi32 (
      _mm512_add_epi32 (_mm512_add_epi32 (b, _mm512_set1_epi32 (0x7fff)), odd),
      16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask (
      _mm512_and_si512 (b, _mm512_set1_epi32 (0x7fffffff)),
      _mm512_set1_epi32 (0x7f800000));
  r = _mm512_mask_mov_epi32 (r, nan, _mm512_set1_epi32 (0x7fc0));
  return _mm512_cvtepi32_epi16 (r);
}
