/* SPDX-License-Identifier: MIT
 *
 * offload/adam.c: CPU Adam/AdamW, scalar, AVX2+FMA+F16C and AVX-512 kernels
 * picked at run time, run on a pool of bound threads.  Every path performs
 * the same IEEE operations in the same order (explicit FMAs, correctly
 * rounded sqrt and divide; the build turns off FP contraction for this room),
 * so the paths agree bit for bit and the scalar one is the oracle.  The math
 * is PyTorch's AdamW (torch/optim/adamw.py, single-tensor path) in the FMA
 * form DeepSpeed uses (csrc/includes/cpu_adam.h, offload.md §1.1).
 */
#include "config.h"

#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "offload/adam.h"

#include "core/dtype-simd.h"
#include "core/zero.h"

/* clang-format off */
G_DEFINE_QUARK (stow-adam-error-quark, stow_adam_error)
/* clang-format on */

/* ---- element types --------------------------------------------------- */

guint16
stow_f32_to_f16 (float x)
{
  guint32 b = stow_f32_bits (x);
  guint32 sign = (b >> 16) & 0x8000u;
  guint32 a = b & 0x7fffffffu;

  if (a > 0x7f800000u)
    return 0x7e00;
  /* 65520 is halfway between 65504 (odd mantissa) and 65536: ties go to the
   * even one, infinity. */
  if (a >= 0x477ff000u)
    return (guint16)(sign | 0x7c00u);
  if (a >= 0x38800000u) /* normal half: rebias 127 -> 15 */
    {
      guint32 r = a - (112u << 23);
      return (guint16)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
  if (a <= 0x33000000u) /* <= 2^-25 rounds to zero (2^-25 is a tie) */
    return (guint16)sign;
  /* Subnormal half: the value is mant * 2^(e-150), the unit is 2^-24. */
  guint32 e = a >> 23;
  guint32 mant = (a & 0x7fffffu) | 0x800000u;
  guint32 shift = 126 - e; /* 14..24 */
  guint32 h = mant >> shift;
  guint32 rem = mant & ((1u << shift) - 1);
  guint32 half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u)))
    h++;
  return (guint16)(sign | h);
}

float
stow_f16_to_f32 (guint16 h)
{
  guint32 sign = ((guint32)h & 0x8000u) << 16;
  guint32 e = (h >> 10) & 0x1fu;
  guint32 m = h & 0x3ffu;
  if (e == 0x1f)
    return stow_bits_f32 (sign | 0x7f800000u | (m << 13));
  if (e == 0)
    {
      float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
      return sign ? -f : f;
    }
  return stow_bits_f32 (sign | ((e + 112) << 23) | (m << 13));
}

/* ---- configuration ---------------------------------------------------- */

void
stow_adam_config_init (StowAdamConfig *config)
{
  g_return_if_fail (config != NULL);
  *config = (StowAdamConfig){
    .mode = STOW_ADAM_ADAMW,
    .lr = 1e-3,
    .beta1 = 0.9,
    .beta2 = 0.999,
    .eps = 1e-8,
    .weight_decay = 1e-2,
    .bias_correction = TRUE,
  };
}

double
stow_adam_clip_coef (double total_norm, double max_norm)
{
  /* torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6),
   * clamped to 1. */
  if (!(max_norm > 0))
    return 1.0;
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

static float
grad_multiplier (double loss_scale, double clip_coef)
{
  return (float)(clip_coef / loss_scale);
}

gboolean
stow_adam_grads_ok (double sumsq, double loss_scale, double clip_coef)
{
  if (!isfinite (sumsq) || !(loss_scale > 0) || !(clip_coef >= 0))
    return FALSE;
  /* Every |g| <= sqrt(sumsq); keep a factor 2 below the limit for the
   * rounding of the float multiplier and product. */
  double gs = (double)grad_multiplier (loss_scale, clip_coef);
  return sqrt (sumsq) * gs <= STOW_ADAM_GRAD_LIMIT / 2;
}

guint
stow_adam_bytes_per_param (StowDtype grad_type, StowDtype out_type,
                           gboolean grads_verified)
{
  guint g = stow_dtype_size (grad_type);
  return 12 + g + 12 + stow_dtype_size (out_type) + (grads_verified ? 0 : g);
}

/* ---- kernels ----------------------------------------------------------- */

/* The per-step constants, rounded once from double. */
typedef struct
{
  float *p, *m, *v;
  const void *grad;
  void *out;
  StowDtype grad_type, out_type;
  gboolean l2;
  float gs;       /* clip_coef / loss_scale */
  float wd;       /* L2 mode: g += wd * p */
  float b1, omb1; /* beta1, 1 - beta1 */
  float b2, omb2; /* beta2, 1 - beta2 */
  float rbc2;     /* 1 / sqrt(1 - beta2^t) */
  float eps;
  float decay;    /* AdamW mode: p *= 1 - lr * wd */
  float neg_step; /* -lr / (1 - beta1^t) */
} AdamArgs;

static inline float
load_grad_1 (const void *g, StowDtype t, guint64 i)
{
  switch (t)
    {
    case STOW_DTYPE_BF16:
      return stow_bf16_to_f32 (((const guint16 *)g)[i]);
    case STOW_DTYPE_F16:
      return stow_f16_to_f32 (((const guint16 *)g)[i]);
    default:
      return ((const float *)g)[i];
    }
}

static inline void
store_out_1 (void *out, StowDtype t, guint64 i, float p)
{
  switch (t)
    {
    case STOW_DTYPE_F32:
      ((float *)out)[i] = p;
      break;
    case STOW_DTYPE_BF16:
      ((guint16 *)out)[i] = stow_f32_to_bf16 (p);
      break;
    case STOW_DTYPE_F16:
      ((guint16 *)out)[i] = stow_f32_to_f16 (p);
      break;
    default:
      break;
    }
}

/* The oracle: one element.  The vector kernels repeat these operations. */
static inline void
adam_one (const AdamArgs *a, guint64 i)
{
  float g = load_grad_1 (a->grad, a->grad_type, i) * a->gs;
  float p = a->p[i];
  if (a->l2)
    g = fmaf (a->wd, p, g);
  float m = fmaf (a->b1, a->m[i], a->omb1 * g);
  float v = fmaf (a->b2, a->v[i], a->omb2 * (g * g));
  float denom = fmaf (sqrtf (v), a->rbc2, a->eps);
  p = p * a->decay;
  p = fmaf (a->neg_step, m / denom, p);
  a->p[i] = p;
  a->m[i] = m;
  a->v[i] = v;
  store_out_1 (a->out, a->out_type, i, p);
}

static void
adam_range_scalar (const AdamArgs *a, guint64 i, guint64 end)
{
  for (; i < end; i++)
    adam_one (a, i);
}

static guint64
check_range_scalar (const void *g, StowDtype t, float gs, guint64 i,
                    guint64 end)
{
  guint64 bad = 0;
  for (; i < end; i++)
    {
      float x = fabsf (load_grad_1 (g, t, i)) * gs;
      bad += !(x <= (float)STOW_ADAM_GRAD_LIMIT);
    }
  return bad;
}

/* Sum of squares of one block: element i goes to lane i % 16, the lanes
 * are added 0..15 at the end.  Squares of floats are exact in double, so the
 * vector versions give the same bits. */
#define SUMSQ_LANES 16

static double
sum_lanes (const double *acc)
{
  double s = 0;
  for (int l = 0; l < SUMSQ_LANES; l++)
    s += acc[l];
  return s;
}

static void
sumsq_tail (double *acc, const void *g, StowDtype t, guint64 i, guint64 end)
{
  for (; i < end; i++)
    {
      double x = load_grad_1 (g, t, i);
      acc[i % SUMSQ_LANES] += x * x;
    }
}

static double
sumsq_block_scalar (const void *g, StowDtype t, guint64 i, guint64 end)
{
  double acc[SUMSQ_LANES] = { 0 };
  sumsq_tail (acc, g, t, i, end);
  return sum_lanes (acc);
}

/* AVX2 + FMA + F16C: 8 floats per vector. */
#define AVX2_TARGET "avx2,fma,f16c"

__attribute__ ((target (AVX2_TARGET))) static inline __m256
load_grad_8 (const void *g, StowDtype t, guint64 i)
{
  switch (t)
    {
    case STOW_DTYPE_BF16:
      {
        __m128i h = _mm_loadu_si128 ((const __m128i *)((const guint16 *)g + i));
        return _mm256_castsi256_ps (
            _mm256_slli_epi32 (_mm256_cvtepu16_epi32 (h), 16));
      }
    case STOW_DTYPE_F16:
      return _mm256_cvtph_ps (
          _mm_loadu_si128 ((const __m128i *)((const guint16 *)g + i)));
    default:
      return _mm256_loadu_ps ((const float *)g + i);
    }
}

__attribute__ ((target (AVX2_TARGET))) static inline void
store_out_8 (void *out, StowDtype t, guint64 i, __m256 p)
{
  __m256 nan = _mm256_cmp_ps (p, p, _CMP_UNORD_Q);
  switch (t)
    {
    case STOW_DTYPE_F32:
      _mm256_storeu_ps ((float *)out + i, p);
      break;
    case STOW_DTYPE_BF16:
      {
        __m256i r = stow_bf16_round_8 (p);
        /* packus works per 128-bit lane: [r0-3 r0-3 | r4-7 r4-7]; keep
         * quadwords 0 and 2. */
        __m256i packed = _mm256_packus_epi32 (r, r);
        packed = _mm256_permute4x64_epi64 (packed, 0x08);
        /* Past the caches where aligned, as the AVX-512 body does. */
        __m128i *dst = (__m128i *)((guint16 *)out + i);
        if (((guintptr)dst & 15) == 0)
          _mm_stream_si128 (dst, _mm256_castsi256_si128 (packed));
        else
          _mm_storeu_si128 (dst, _mm256_castsi256_si128 (packed));
        break;
      }
    case STOW_DTYPE_F16:
      {
        /* A quiet NaN 0x7fc00000 converts to the canonical 0x7e00. */
        __m256 q = _mm256_blendv_ps (
            p, _mm256_castsi256_ps (_mm256_set1_epi32 (0x7fc00000)), nan);
        _mm_storeu_si128 (
            (__m128i *)((guint16 *)out + i),
            _mm256_cvtps_ph (q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
      }
    default:
      break;
    }
}

__attribute__ ((target (AVX2_TARGET))) static void
adam_range_avx2 (const AdamArgs *a, guint64 i, guint64 end)
{
  const __m256 gs = _mm256_set1_ps (a->gs), wd = _mm256_set1_ps (a->wd);
  const __m256 b1 = _mm256_set1_ps (a->b1), omb1 = _mm256_set1_ps (a->omb1);
  const __m256 b2 = _mm256_set1_ps (a->b2), omb2 = _mm256_set1_ps (a->omb2);
  const __m256 rbc2 = _mm256_set1_ps (a->rbc2), eps = _mm256_set1_ps (a->eps);
  const __m256 decay = _mm256_set1_ps (a->decay);
  const __m256 neg_step = _mm256_set1_ps (a->neg_step);

  for (; i + 8 <= end; i += 8)
    {
      __m256 g = _mm256_mul_ps (load_grad_8 (a->grad, a->grad_type, i), gs);
      __m256 p = _mm256_loadu_ps (a->p + i);
      if (a->l2)
        g = _mm256_fmadd_ps (wd, p, g);
      __m256 m = _mm256_fmadd_ps (b1, _mm256_loadu_ps (a->m + i),
                                  _mm256_mul_ps (omb1, g));
      __m256 v = _mm256_fmadd_ps (b2, _mm256_loadu_ps (a->v + i),
                                  _mm256_mul_ps (omb2, _mm256_mul_ps (g, g)));
      __m256 denom = _mm256_fmadd_ps (_mm256_sqrt_ps (v), rbc2, eps);
      p = _mm256_mul_ps (p, decay);
      p = _mm256_fmadd_ps (neg_step, _mm256_div_ps (m, denom), p);
      _mm256_storeu_ps (a->p + i, p);
      _mm256_storeu_ps (a->m + i, m);
      _mm256_storeu_ps (a->v + i, v);
      store_out_8 (a->out, a->out_type, i, p);
    }
  _mm_sfence (); /* the streamed copy before the pool reports the range done */
  adam_range_scalar (a, i, end);
}

__attribute__ ((target (AVX2_TARGET))) static guint64
check_range_avx2 (const void *g, StowDtype t, float gs, guint64 i, guint64 end)
{
  const __m256 vgs = _mm256_set1_ps (gs);
  const __m256 limit = _mm256_set1_ps ((float)STOW_ADAM_GRAD_LIMIT);
  const __m256 absmask = _mm256_castsi256_ps (_mm256_set1_epi32 (0x7fffffff));
  guint64 bad = 0;
  for (; i + 8 <= end; i += 8)
    {
      __m256 x
          = _mm256_mul_ps (_mm256_and_ps (load_grad_8 (g, t, i), absmask), vgs);
      int ok = _mm256_movemask_ps (_mm256_cmp_ps (x, limit, _CMP_LE_OQ));
      bad += 8 - __builtin_popcount ((unsigned)ok);
    }
  return bad + check_range_scalar (g, t, gs, i, end);
}

__attribute__ ((target (AVX2_TARGET))) static double
sumsq_block_avx2 (const void *g, StowDtype t, guint64 i, guint64 end)
{
  __m256d acc[4] = { _mm256_setzero_pd (), _mm256_setzero_pd (),
                     _mm256_setzero_pd (), _mm256_setzero_pd () };
  for (; i + 16 <= end; i += 16)
    for (int h = 0; h < 2; h++)
      {
        __m256 x = load_grad_8 (g, t, i + 8 * h);
        __m256d lo = _mm256_cvtps_pd (_mm256_castps256_ps128 (x));
        __m256d hi = _mm256_cvtps_pd (_mm256_extractf128_ps (x, 1));
        acc[2 * h] = _mm256_add_pd (acc[2 * h], _mm256_mul_pd (lo, lo));
        acc[2 * h + 1] = _mm256_add_pd (acc[2 * h + 1], _mm256_mul_pd (hi, hi));
      }
  double lanes[SUMSQ_LANES];
  for (int k = 0; k < 4; k++)
    _mm256_storeu_pd (lanes + 4 * k, acc[k]);
  sumsq_tail (lanes, g, t, i, end);
  return sum_lanes (lanes);
}

/* AVX-512F: 16 floats per vector.  The kernels carry the avx512bf16 target
 * too so that one body serves both variants; with native_bf16 == 0 the
 * VCVTNEPS2BF16 branch is dead code, and GCC never synthesises AVX512_BF16
 * instructions on its own (C11 has no bf16 arithmetic), so the plain
 * variant runs on any AVX-512F CPU. */
#define AVX512_TARGET "avx512f,avx512bf16"

__attribute__ ((target (AVX512_TARGET))) static inline __m512
load_grad_16 (const void *g, StowDtype t, guint64 i)
{
  switch (t)
    {
    case STOW_DTYPE_BF16:
      {
        __m256i h
            = _mm256_loadu_si256 ((const __m256i *)((const guint16 *)g + i));
        return _mm512_castsi512_ps (
            _mm512_slli_epi32 (_mm512_cvtepu16_epi32 (h), 16));
      }
    case STOW_DTYPE_F16:
      return _mm512_cvtph_ps (
          _mm256_loadu_si256 ((const __m256i *)((const guint16 *)g + i)));
    default:
      return _mm512_loadu_ps ((const float *)g + i);
    }
}

/* VCVTNEPS2BF16 rounds to nearest even but flushes subnormal inputs to
 * zero and keeps NaN payloads: whether no lane of @p holds either, so that
 * it gives the integer path's bits. */
__attribute__ ((target (AVX512_TARGET))) static inline gboolean
cvtne_exact (__m512 p)
{
  __m512i ab = _mm512_and_si512 (_mm512_castps_si512 (p),
                                 _mm512_set1_epi32 (0x7fffffff));
  __mmask16 fix
      = _mm512_cmplt_epu32_mask (_mm512_sub_epi32 (ab, _mm512_set1_epi32 (1)),
                                 _mm512_set1_epi32 (0x7fffff))
        | _mm512_cmpgt_epu32_mask (ab, _mm512_set1_epi32 (0x7f800000));
  return fix == 0;
}

__attribute__ ((target (AVX512_TARGET))) static inline void
store_out_16 (void *out, StowDtype t, guint64 i, __m512 p,
              const int native_bf16)
{
  __m256i *dst16 = (__m256i *)((guint16 *)out + i);
  switch (t)
    {
    case STOW_DTYPE_F32:
      _mm512_storeu_ps ((float *)out + i, p);
      break;
    case STOW_DTYPE_BF16:
      {
        __m256i h = native_bf16 && G_LIKELY (cvtne_exact (p))
                        ? (__m256i)_mm512_cvtneps_pbh (p)
                        : stow_bf16_round_16 (p);
        /* The copy is written, never read here: past the caches where it
         * is aligned (a plain store reads each line in first; `stowage
         * bench adam -n 110M`, best of 7: 67-71 ms with plain stores,
         * 65-66 streamed).  The caller fences. */
        if (((guintptr)dst16 & 31) == 0)
          _mm256_stream_si256 (dst16, h);
        else
          _mm256_storeu_si256 (dst16, h);
        break;
      }
    case STOW_DTYPE_F16:
      {
        __mmask16 nan = _mm512_cmp_ps_mask (p, p, _CMP_UNORD_Q);
        __m512 q = _mm512_mask_mov_ps (
            p, nan, _mm512_castsi512_ps (_mm512_set1_epi32 (0x7fc00000)));
        _mm256_storeu_si256 (
            dst16,
            _mm512_cvtps_ph (q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
      }
    default:
      break;
    }
}

__attribute__ ((target (AVX512_TARGET), always_inline)) static inline void
adam_body_avx512 (const AdamArgs *a, guint64 i, guint64 end,
                  const int native_bf16)
{
  const __m512 gs = _mm512_set1_ps (a->gs), wd = _mm512_set1_ps (a->wd);
  const __m512 b1 = _mm512_set1_ps (a->b1), omb1 = _mm512_set1_ps (a->omb1);
  const __m512 b2 = _mm512_set1_ps (a->b2), omb2 = _mm512_set1_ps (a->omb2);
  const __m512 rbc2 = _mm512_set1_ps (a->rbc2), eps = _mm512_set1_ps (a->eps);
  const __m512 decay = _mm512_set1_ps (a->decay);
  const __m512 neg_step = _mm512_set1_ps (a->neg_step);

  for (; i + 16 <= end; i += 16)
    {
      __m512 g = _mm512_mul_ps (load_grad_16 (a->grad, a->grad_type, i), gs);
      __m512 p = _mm512_loadu_ps (a->p + i);
      if (a->l2)
        g = _mm512_fmadd_ps (wd, p, g);
      __m512 m = _mm512_fmadd_ps (b1, _mm512_loadu_ps (a->m + i),
                                  _mm512_mul_ps (omb1, g));
      __m512 v = _mm512_fmadd_ps (b2, _mm512_loadu_ps (a->v + i),
                                  _mm512_mul_ps (omb2, _mm512_mul_ps (g, g)));
      __m512 denom = _mm512_fmadd_ps (_mm512_sqrt_ps (v), rbc2, eps);
      p = _mm512_mul_ps (p, decay);
      p = _mm512_fmadd_ps (neg_step, _mm512_div_ps (m, denom), p);
      _mm512_storeu_ps (a->p + i, p);
      _mm512_storeu_ps (a->m + i, m);
      _mm512_storeu_ps (a->v + i, v);
      store_out_16 (a->out, a->out_type, i, p, native_bf16);
    }
  _mm_sfence (); /* the streamed copy before the pool reports the range done */
  adam_range_scalar (a, i, end);
}

__attribute__ ((target (AVX512_TARGET))) static void
adam_range_avx512 (const AdamArgs *a, guint64 i, guint64 end)
{
  adam_body_avx512 (a, i, end, 0);
}

__attribute__ ((target (AVX512_TARGET))) static void
adam_range_avx512_bf16 (const AdamArgs *a, guint64 i, guint64 end)
{
  adam_body_avx512 (a, i, end, 1);
}

__attribute__ ((target (AVX512_TARGET))) static guint64
check_range_avx512 (const void *g, StowDtype t, float gs, guint64 i,
                    guint64 end)
{
  const __m512 vgs = _mm512_set1_ps (gs);
  const __m512 limit = _mm512_set1_ps ((float)STOW_ADAM_GRAD_LIMIT);
  guint64 bad = 0;
  for (; i + 16 <= end; i += 16)
    {
      __m512 x = _mm512_mul_ps (_mm512_abs_ps (load_grad_16 (g, t, i)), vgs);
      __mmask16 ok = _mm512_cmp_ps_mask (x, limit, _CMP_LE_OQ);
      bad += 16 - __builtin_popcount ((unsigned)ok);
    }
  return bad + check_range_scalar (g, t, gs, i, end);
}

__attribute__ ((target (AVX512_TARGET))) static double
sumsq_block_avx512 (const void *g, StowDtype t, guint64 i, guint64 end)
{
  __m512d lo_acc = _mm512_setzero_pd (), hi_acc = _mm512_setzero_pd ();
  for (; i + 16 <= end; i += 16)
    {
      __m512 x = load_grad_16 (g, t, i);
      __m512d lo = _mm512_cvtps_pd (_mm512_castps512_ps256 (x));
      __m512d hi = _mm512_cvtps_pd (
          _mm256_castpd_ps (_mm512_extractf64x4_pd (_mm512_castps_pd (x), 1)));
      lo_acc = _mm512_add_pd (lo_acc, _mm512_mul_pd (lo, lo));
      hi_acc = _mm512_add_pd (hi_acc, _mm512_mul_pd (hi, hi));
    }
  double lanes[SUMSQ_LANES];
  _mm512_storeu_pd (lanes, lo_acc);
  _mm512_storeu_pd (lanes + 8, hi_acc);
  sumsq_tail (lanes, g, t, i, end);
  return sum_lanes (lanes);
}

typedef struct
{
  void (*adam) (const AdamArgs *a, guint64 i, guint64 end);
  guint64 (*check) (const void *g, StowDtype t, float gs, guint64 i,
                    guint64 end);
  double (*sumsq) (const void *g, StowDtype t, guint64 i, guint64 end);
} Kernels;

static const Kernels kernels[STOW_ISA_N] = {
  [STOW_ISA_SCALAR]
  = { adam_range_scalar, check_range_scalar, sumsq_block_scalar },
  [STOW_ISA_AVX2] = { adam_range_avx2, check_range_avx2, sumsq_block_avx2 },
  [STOW_ISA_AVX512]
  = { adam_range_avx512, check_range_avx512, sumsq_block_avx512 },
  [STOW_ISA_AVX512_BF16]
  = { adam_range_avx512_bf16, check_range_avx512, sumsq_block_avx512 },
};

/* ---- the engine -------------------------------------------------------- */

/* The grad norm's blocks: core/zero.h's stow_norm_block, never more than
 * SUMSQ_MAX_BLOCKS of them, so the partial sums fit in a buffer allocated
 * once.  The block size depends on n only. */
#define SUMSQ_MAX_BLOCKS STOW_NORM_MAX_BLOCKS

struct StowAdam
{
  StowCpuPool *pool;
  StowIsa isa;
  const Kernels *k;
  guint n_threads;
  guint64 *bad;     /* (n_threads) bad-gradient counts of the check pass */
  double *partials; /* (SUMSQ_MAX_BLOCKS) per-block sums of squares */
};

StowAdam *
stow_adam_new (guint n_threads, StowIsa isa, GError **error)
{
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  g_return_val_if_fail (isa >= STOW_ISA_AUTO && isa < STOW_ISA_N, NULL);
  if (isa == STOW_ISA_AUTO)
    isa = stow_isa_best ();
  else if (!stow_isa_supported (isa))
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_UNSUPPORTED,
                   "adam: this CPU cannot run the %s kernels",
                   stow_isa_name (isa));
      return NULL;
    }
  StowCpuPool *pool = stow_cpu_pool_new (n_threads, TRUE, error);
  if (pool == NULL)
    return NULL;
  StowAdam *adam = g_new0 (StowAdam, 1);
  adam->pool = pool;
  adam->isa = isa;
  adam->k = &kernels[isa];
  adam->n_threads = stow_cpu_pool_n_threads (pool);
  adam->bad = g_new0 (guint64, adam->n_threads);
  adam->partials = g_new0 (double, SUMSQ_MAX_BLOCKS);
  return adam;
}

void
stow_adam_free (StowAdam *adam)
{
  if (adam == NULL)
    return;
  stow_cpu_pool_free (adam->pool);
  g_free (adam->bad);
  g_free (adam->partials);
  g_free (adam);
}

StowIsa
stow_adam_get_isa (const StowAdam *adam)
{
  g_return_val_if_fail (adam != NULL, STOW_ISA_SCALAR);
  return adam->isa;
}

guint
stow_adam_get_n_threads (const StowAdam *adam)
{
  g_return_val_if_fail (adam != NULL, 0);
  return adam->n_threads;
}

StowCpuPool *
stow_adam_get_pool (StowAdam *adam)
{
  g_return_val_if_fail (adam != NULL, NULL);
  return adam->pool;
}

typedef struct
{
  StowAdam *adam;
  const AdamArgs *args;
  guint64 n;
} StepJob;

static void
check_job (gpointer data, guint index, guint n_threads)
{
  StepJob *j = data;
  const AdamArgs *a = j->args;
  guint64 b0, b1;
  guint64 n_blocks = (j->n + STOW_ADAM_BLOCK - 1) / STOW_ADAM_BLOCK;
  stow_cpu_partition (n_blocks, index, n_threads, &b0, &b1);
  guint64 end = MIN (b1 * STOW_ADAM_BLOCK, j->n);
  guint64 begin = MIN (b0 * STOW_ADAM_BLOCK, end);
  j->adam->bad[index]
      = j->adam->k->check (a->grad, a->grad_type, a->gs, begin, end);
}

static void
update_job (gpointer data, guint index, guint n_threads)
{
  StepJob *j = data;
  guint64 b0, b1;
  guint64 n_blocks = (j->n + STOW_ADAM_BLOCK - 1) / STOW_ADAM_BLOCK;
  stow_cpu_partition (n_blocks, index, n_threads, &b0, &b1);
  guint64 end = MIN (b1 * STOW_ADAM_BLOCK, j->n);
  guint64 begin = MIN (b0 * STOW_ADAM_BLOCK, end);
  j->adam->k->adam (j->args, begin, end);
}

static gboolean
hyper_ok (const StowAdamConfig *c)
{
  return (c->mode == STOW_ADAM_ADAMW || c->mode == STOW_ADAM_L2)
         && isfinite (c->lr) && c->lr >= 0 && c->beta1 >= 0 && c->beta1 < 1
         && c->beta2 >= 0 && c->beta2 < 1 && isfinite (c->eps) && c->eps > 0
         && isfinite (c->weight_decay) && c->weight_decay >= 0;
}

static gboolean
step_ok (const StowAdamStep *s)
{
  return s->step >= 1 && isfinite (s->loss_scale) && s->loss_scale > 0
         && isfinite (s->clip_coef) && s->clip_coef >= 0;
}

static gboolean
tensor_ok (const StowAdamTensor *t)
{
  if (t->grad_type != STOW_DTYPE_F32 && t->grad_type != STOW_DTYPE_BF16
      && t->grad_type != STOW_DTYPE_F16)
    return FALSE;
  if (t->out_type != STOW_DTYPE_NONE && t->out_type != STOW_DTYPE_F32
      && t->out_type != STOW_DTYPE_BF16 && t->out_type != STOW_DTYPE_F16)
    return FALSE;
  if ((t->out_type == STOW_DTYPE_NONE) != (t->param_out == NULL))
    return FALSE;
  if (t->n == 0)
    return TRUE;
  return t->param != NULL && t->m != NULL && t->v != NULL && t->grad != NULL
         && (void *)t->param != t->param_out;
}

int
stow_adam_step_raw (StowAdam *adam, const StowAdamConfig *config,
                    const StowAdamStep *step, const StowAdamTensor *tensor)
{
  if (adam == NULL || config == NULL || step == NULL || tensor == NULL
      || !hyper_ok (config) || !step_ok (step) || !tensor_ok (tensor))
    return -EINVAL;
  if (tensor->n == 0)
    return 0;

  /* Bias corrections from the step number alone, in double: a resumed run
   * computes exactly what a straight run did (offload.md §1.1 on
   * DeepSpeed's IncrementStep). */
  double t = (double)step->step;
  double bc1 = config->bias_correction ? 1.0 - pow (config->beta1, t) : 1.0;
  double bc2 = config->bias_correction ? 1.0 - pow (config->beta2, t) : 1.0;
  gboolean l2 = config->mode == STOW_ADAM_L2 && config->weight_decay > 0;
  AdamArgs a = {
    .p = tensor->param,
    .m = tensor->m,
    .v = tensor->v,
    .grad = tensor->grad,
    .out = tensor->param_out,
    .grad_type = tensor->grad_type,
    .out_type = tensor->out_type,
    .l2 = l2,
    .gs = grad_multiplier (step->loss_scale, step->clip_coef),
    .wd = (float)config->weight_decay,
    .b1 = (float)config->beta1,
    .omb1 = (float)(1.0 - config->beta1),
    .b2 = (float)config->beta2,
    .omb2 = (float)(1.0 - config->beta2),
    .rbc2 = (float)(1.0 / sqrt (bc2)),
    .eps = (float)config->eps,
    .decay = config->mode == STOW_ADAM_ADAMW
                 ? (float)(1.0 - config->lr * config->weight_decay)
                 : 1.0f,
    .neg_step = (float)(-config->lr / bc1),
  };
  StepJob job = { .adam = adam, .args = &a, .n = tensor->n };

  if (!step->grads_verified)
    {
      stow_cpu_pool_run (adam->pool, check_job, &job);
      guint64 bad = 0;
      for (guint i = 0; i < adam->n_threads; i++)
        bad += adam->bad[i];
      if (bad > 0)
        return -ERANGE;
    }
  stow_cpu_pool_run (adam->pool, update_job, &job);
  return 0;
}

typedef struct
{
  StowAdam *adam;
  const void *grad;
  StowDtype type;
  guint64 n;
  guint64 block;
  guint64 n_blocks;
  double *partials;
} SumsqJob;

static void
sumsq_job (gpointer data, guint index, guint n_threads)
{
  SumsqJob *j = data;
  guint64 b0, b1;
  stow_cpu_partition (j->n_blocks, index, n_threads, &b0, &b1);
  for (guint64 b = b0; b < b1; b++)
    {
      guint64 begin = b * j->block;
      guint64 end = MIN (begin + j->block, j->n);
      j->partials[b] = j->adam->k->sumsq (j->grad, j->type, begin, end);
    }
}

int
stow_adam_grad_sumsq (StowAdam *adam, const void *grad, StowDtype grad_type,
                      guint64 n, double *out_sumsq)
{
  if (adam == NULL || out_sumsq == NULL || (grad == NULL && n > 0)
      || (grad_type != STOW_DTYPE_F32 && grad_type != STOW_DTYPE_BF16
          && grad_type != STOW_DTYPE_F16))
    return -EINVAL;
  *out_sumsq = 0;
  if (n == 0)
    return 0;
  guint64 block = stow_norm_block (n), n_blocks = (n + block - 1) / block;
  int rc = stow_adam_grad_sumsq_blocks (adam, grad, grad_type, n, block,
                                        adam->partials);
  double s = 0;
  for (guint64 b = 0; rc == 0 && b < n_blocks; b++)
    s += adam->partials[b];
  *out_sumsq = s;
  return rc;
}

int
stow_adam_grad_sumsq_blocks (StowAdam *adam, const void *grad,
                             StowDtype grad_type, guint64 n, guint64 block,
                             double *partials)
{
  if (adam == NULL || (partials == NULL && n > 0) || (grad == NULL && n > 0)
      || block == 0
      || (grad_type != STOW_DTYPE_F32 && grad_type != STOW_DTYPE_BF16
          && grad_type != STOW_DTYPE_F16))
    return -EINVAL;
  if (n == 0)
    return 0;
  SumsqJob job = { .adam = adam,
                   .grad = grad,
                   .type = grad_type,
                   .n = n,
                   .block = block,
                   .n_blocks = (n + block - 1) / block,
                   .partials = partials };
  stow_cpu_pool_run (adam->pool, sumsq_job, &job);
  return 0;
}

/* ---- the GError boundary ---------------------------------------------- */

static gboolean
check_config (const StowAdamConfig *c, guint64 step, GError **error)
{
#define BAD(...)                                                               \
  do                                                                           \
    {                                                                          \
      g_autofree char *what = g_strdup_printf (__VA_ARGS__);                   \
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,            \
                   "adam step %" G_GUINT64_FORMAT ": %s", step, what);         \
      return FALSE;                                                            \
    }                                                                          \
  while (0)
  if (c->mode != STOW_ADAM_ADAMW && c->mode != STOW_ADAM_L2)
    BAD ("mode (%d) is neither AdamW nor Adam-L2", (int)c->mode);
  if (!(isfinite (c->lr) && c->lr >= 0))
    BAD ("lr (%g) must be finite and >= 0", c->lr);
  if (!(c->beta1 >= 0 && c->beta1 < 1))
    BAD ("beta1 (%g) must be in [0, 1)", c->beta1);
  if (!(c->beta2 >= 0 && c->beta2 < 1))
    BAD ("beta2 (%g) must be in [0, 1)", c->beta2);
  if (!(isfinite (c->eps) && c->eps > 0))
    BAD ("eps (%g) must be finite and > 0", c->eps);
  if (!(isfinite (c->weight_decay) && c->weight_decay >= 0))
    BAD ("weight_decay (%g) must be finite and >= 0", c->weight_decay);
  return TRUE;
#undef BAD
}

static gboolean
check_step (const StowAdamStep *s, GError **error)
{
  if (s->step < 1)
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,
                   "adam: step number (0) must start at 1");
      return FALSE;
    }
  if (!(isfinite (s->loss_scale) && s->loss_scale > 0))
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,
                   "adam step %" G_GUINT64_FORMAT
                   ": loss_scale (%g) must be finite and > 0",
                   s->step, s->loss_scale);
      return FALSE;
    }
  if (!(isfinite (s->clip_coef) && s->clip_coef >= 0))
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,
                   "adam step %" G_GUINT64_FORMAT
                   ": clip_coef (%g) must be finite and >= 0",
                   s->step, s->clip_coef);
      return FALSE;
    }
  return TRUE;
}

double
stow_adam_measure (StowAdam *adam, guint64 n, guint reps, GError **error)
{
  g_return_val_if_fail (adam != NULL && n > 0 && reps > 0, 0);
  float *f = g_try_malloc0_n (3 * n, sizeof (float));
  guint16 *h = g_try_malloc0_n (2 * n, sizeof (guint16));
  if (f == NULL || h == NULL)
    {
      g_free (f);
      g_free (h);
      g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                   "CPU Adam's rate: %" G_GUINT64_FORMAT
                   " parameters' arrays: out of memory",
                   n);
      return 0;
    }
  for (guint64 i = 0; i < n; i++)
    h[i] = 0x3c00 + (guint16)(i & 0xff); /* bf16 gradients near 0.008 */
  StowAdamConfig cfg;
  stow_adam_config_init (&cfg);
  StowAdamTensor t
      = { f, f + n, f + 2 * n, h, STOW_DTYPE_BF16, h + n, STOW_DTYPE_BF16, n };
  double best = G_MAXDOUBLE;
  for (guint r = 0; r <= reps; r++) /* the first touches the pages */
    {
      StowAdamStep st = { r + 1, 1.0, 1.0, FALSE };
      gint64 t0 = g_get_monotonic_time ();
      int rc = stow_adam_step_raw (adam, &cfg, &st, &t);
      gint64 t1 = g_get_monotonic_time ();
      if (rc == 0 && r > 0)
        best = MIN (best, (double)(t1 - t0) * 1e-6);
    }
  g_free (f);
  g_free (h);
  return best < G_MAXDOUBLE && best > 0 ? (double)n / best : 0;
}

gboolean
stow_adam_step (StowAdam *adam, const StowAdamConfig *config,
                const StowAdamStep *step, const StowAdamTensor *tensor,
                GError **error)
{
  g_return_val_if_fail (
      adam != NULL && config != NULL && step != NULL && tensor != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_step (step, error) || !check_config (config, step->step, error))
    return FALSE;
  if (!tensor_ok (tensor))
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,
                   "adam step %" G_GUINT64_FORMAT
                   ": bad tensor (grad %s, output %s%s, %" G_GUINT64_FORMAT
                   " elements): a NULL array, an unknown type or an output "
                   "aliasing the master weights",
                   step->step, stow_dtype_nick (tensor->grad_type),
                   stow_dtype_nick (tensor->out_type),
                   tensor->param_out ? "" : " (NULL)", tensor->n);
      return FALSE;
    }

  int rc = stow_adam_step_raw (adam, config, step, tensor);
  if (rc == -ERANGE)
    {
      /* Not the hot path any more: find the first offender to name it. */
      float gs = grad_multiplier (step->loss_scale, step->clip_coef);
      guint64 first = 0, count = 0;
      float value = 0;
      for (guint64 i = 0; i < tensor->n; i++)
        {
          float g = load_grad_1 (tensor->grad, tensor->grad_type, i);
          if (!(fabsf (g) * gs <= (float)STOW_ADAM_GRAD_LIMIT))
            {
              if (count++ == 0)
                {
                  first = i;
                  value = g;
                }
            }
        }
      g_set_error (
          error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_NONFINITE,
          "adam step %" G_GUINT64_FORMAT ": gradient %" G_GUINT64_FORMAT
          " of %" G_GUINT64_FORMAT " is %g (%" G_GUINT64_FORMAT
          " bad in all) after scaling by %g; step skipped, nothing "
          "written",
          step->step, first, tensor->n, (double)value, count, (double)gs);
      return FALSE;
    }
  if (rc < 0)
    {
      g_set_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID,
                   "adam step %" G_GUINT64_FORMAT ": %s", step->step,
                   g_strerror (-rc));
      return FALSE;
    }
  return TRUE;
}
