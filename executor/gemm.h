/* SPDX-License-Identifier: MIT
 *
 * executor/gemm.h: the cpu backend's matrix-product kernels, chosen once
 * per process from the CPU's features (cpuid), never from its model
 * number: oneDNN's matmul where it has a brgemm kernel for the CPU
 * (AVX-512; bf16 products in bf16 with AVX512-BF16 or AMX), else OpenBLAS's
 * sgemm with OPENBLAS_CORETYPE set from the features before the library is
 * loaded.  Every call runs on the calling thread only: the callers tile.
 * Not here: the tiling (llama-kernels.c), which fixes the bits.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* What cpuid (and XCR0, for the state the OS saves) says about this CPU. */
typedef struct
{
  gboolean amd;    /* vendor AuthenticAMD (or HygonGenuine) */
  gboolean avx2;   /* AVX2 and FMA, with the OS saving the ymm state */
  gboolean avx512; /* AVX-512 F, CD, DQ, BW and VL, zmm state saved */
  gboolean bf16;   /* AVX512_BF16 (with avx512) */
  gboolean amx;    /* AMX-TILE and AMX-BF16, tile state enabled */
} StowCpuFeatures;

/* Fills @f from this CPU. */
void stow_cpu_features_probe (StowCpuFeatures *f);
/* "avx2 avx512 avx512_bf16 amx_bf16" (the set ones; "none"); free it. */
char *stow_cpu_features_string (const StowCpuFeatures *f);

/* The OpenBLAS core type (OPENBLAS_CORETYPE) whose sgemm kernel @f runs
 * best among those a DYNAMIC_ARCH build of OpenBLAS 0.3.21 carries, or
 * NULL to leave the choice to OpenBLAS (a CPU with neither AVX2 nor
 * AVX-512).  A pure function of @f. */
const char *stow_openblas_core_for (const StowCpuFeatures *f);

typedef enum
{
  STOW_GEMM_ONEDNN,
  STOW_GEMM_OPENBLAS,
} StowGemmLib;

/* The process's choice, made once by stow_gemm_init. */
typedef struct
{
  StowGemmLib f32;      /* who runs fp32 products */
  gboolean bf16_native; /* bf16 products run in bf16 (oneDNN), fp32 sums */
  /* "oneDNN 2.6.3 brg:avx512_core", "OpenBLAS 0.3.21 SkylakeX"; the bf16
   * one is "" where bf16 operands are widened to fp32 first. */
  char f32_kernel[96], bf16_kernel[96];
  /* How the kernels were chosen: "cpuid: avx2 avx512 ...", or the
   * variable that overrode it. */
  char reason[160];
} StowGemmChoice;

/* Chooses and loads the kernels (once; later calls return the first
 * result).  STOWAGE_GEMM=openblas or onednn overrides the choice (for
 * comparisons); OPENBLAS_CORETYPE, when set, is left as it is.  Sets
 * STOW_BACKEND_ERROR_FAILED when no kernel can be loaded or the override
 * is unknown. */
gboolean stow_gemm_init (GError **error);
/* The choice; stow_gemm_init must have succeeded. */
const StowGemmChoice *stow_gemm_choice (void);
/* One line for logs: "fp32 oneDNN 2.6.3 brg:avx512_core, bf16 ... (cpuid:
 * ...)"; free it. */
char *stow_gemm_describe (void);

/* C (M, N) = alpha op(A) op(B) + beta C, row-major, fp32, on the calling
 * thread: op(A) (M, K) is A stored (M, K) with row stride @lda, or
 * stored (K, M) when @ta; op(B) (K, N) likewise with @tb.  The same
 * arguments give the same bits on every call. */
void stow_gemm_f32 (gboolean ta, gboolean tb, guint64 M, guint64 N, guint64 K,
                    float alpha, const float *A, guint64 lda, const float *B,
                    guint64 ldb, float beta, float *C, guint64 ldc);
/* The same with bf16 A and B (products and sums in fp32), where
 * stow_gemm_choice ()->bf16_native; C stays fp32. */
void stow_gemm_bf16 (gboolean ta, gboolean tb, guint64 M, guint64 N, guint64 K,
                     float alpha, const guint16 *A, guint64 lda,
                     const guint16 *B, guint64 ldb, float beta, float *C,
                     guint64 ldc);

G_END_DECLS
