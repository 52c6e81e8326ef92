/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cuda/llama-cuda-private.h: what the cuda runtime's
 * files share (CUDA C++ only): the runtime's struct and workspace, the
 * sticky error, the element loads and stores, cuBLAS loaded by dlopen,
 * the row-major GEMM front end and the attention kernels' entry points.
 * Not a public interface: llama-cuda.h is.
 */
#pragma once

#include <cstdint>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "executor/backends/cuda/llama-cuda.h"
#include "executor/llama-expf.h"

/* ---- cuBLAS, resolved by dlopen (cublas-dl.cu) -------------------------- */

typedef struct
{
  cublasStatus_t (*create) (cublasHandle_t *handle);
  cublasStatus_t (*destroy) (cublasHandle_t handle);
  cublasStatus_t (*set_stream) (cublasHandle_t handle, cudaStream_t stream);
  cublasStatus_t (*set_workspace) (cublasHandle_t handle, void *ws,
                                   size_t bytes);
  cublasStatus_t (*set_math_mode) (cublasHandle_t handle, cublasMath_t mode);
  cublasStatus_t (*gemm_ex) (cublasHandle_t handle, cublasOperation_t ta,
                             cublasOperation_t tb, int m, int n, int k,
                             const void *alpha, const void *A,
                             cudaDataType_t a_type, int lda, const void *B,
                             cudaDataType_t b_type, int ldb, const void *beta,
                             void *C, cudaDataType_t c_type, int ldc,
                             cublasComputeType_t compute,
                             cublasGemmAlgo_t algo);
  const char *(*status_string) (cublasStatus_t status);
} StowCublas;

/* The process's cuBLAS (loaded once, never unloaded), or NULL and why. */
const StowCublas *stow_cublas_load (GError **error);

/* A bool template argument (BF: bf16 storage) from a runtime bool. */
#define DISPATCH_BF(bf, ...)                                                   \
  do                                                                           \
    {                                                                          \
      if (bf)                                                                  \
        {                                                                      \
          constexpr bool BF = true;                                            \
          __VA_ARGS__;                                                         \
        }                                                                      \
      else                                                                     \
        {                                                                      \
          constexpr bool BF = false;                                           \
          __VA_ARGS__;                                                         \
        }                                                                      \
    }                                                                          \
  while (0)

/* ---- the runtime --------------------------------------------------------- */

/* Threads of the row kernels' blocks; the block reductions' trees are
 * fixed by it (determinism). */
#define STOW_CUDA_ROW_THREADS 256
/* Rows a column reduction's thread sums before its partial is kept: the
 * partition is fixed by n alone. */
#define STOW_CUDA_COL_ROWS 256
/* cuBLAS's workspace: NVIDIA's recommendation for Hopper. */
#define STOW_CUDA_CUBLAS_WS_BYTES ((guint64)32 << 20)
/* The gradient norm's partition, as offload/adam.c's SUMSQ_MIN_BLOCK,
 * SUMSQ_MAX_BLOCKS and SUMSQ_LANES: the same blocks give the same bits. */
#define STOW_CUDA_SUMSQ_MIN_BLOCK  8192
#define STOW_CUDA_SUMSQ_MAX_BLOCKS 4096
#define STOW_CUDA_SUMSQ_LANES      16

struct StowLlamaCuda
{
  /* sizeof (StowLlamaCuda) where it was allocated (llama-cuda.cu): the
   * other files check it against their own, because meson (1.0) does not
   * rebuild .cu files when this header changes, and a stale object would
   * read and write past the allocation. */
  size_t struct_bytes;
  StowDecoder decoder; /* this runtime's kernels (llama-cuda.cu) */
  StowLlamaConfig config;
  StowDtype dtype;
  bool bf16;
  guint64 esize;
  guint64 max_tokens, max_seq;
  cudaStream_t stream;
  int device;
  const StowCublas *cublas;
  cublasHandle_t handle;

  /* Device workspace: one cudaMalloc, carved (see stow_llama_cuda_new). */
  void *ws;
  guint64 ws_bytes;
  float *rope_cos, *rope_sin; /* (max_seq, d/2) */
  void *cublas_ws;            /* STOW_CUDA_CUBLAS_WS_BYTES */
  float *attn_delta;          /* (max_tokens, a): rowsum (dO * O) */
  double *col_part;           /* (ceil (max_tokens / COL_ROWS), max cols) */
  double *col_acc;            /* (h): the fused loss's norm gradient */
  double *sumsq_part;         /* (SUMSQ_MAX_BLOCKS) */
  guint32 *sort_keys_in, *sort_keys_out, *sort_vals_in, *sort_vals_out;
  void *sort_tmp; /* cub's radix sort storage for max_tokens */
  size_t sort_tmp_bytes;
  int sort_bits; /* bits of the largest token id */
  int attn_tile; /* queries/keys per attention tile (32, 16 when d > 128) */
  /* The bf16 tensor-core attention (attention-tc.cu): whether it is taken
   * and its kernels' tiles (64 or 32 rows, by what the device's shared
   * memory holds at this head_dim). */
  bool attn_tc;
  bool attn_tc_off; /* stow_llama_cuda_attention_use_tc (L, FALSE) */
  int attn_tc_fwd_tile, attn_tc_dq_tile, attn_tc_dkv_tile;
  /* The mma.sync kernels (attention-mma.cu) for head_dim 64 and 128,
   * taken before the WMMA ones where the tensors are 16-byte aligned. */
  bool attn_mma;

  /* The first failure, sticky. */
  GError *error;
};

/* Whether this object file agrees with the one that allocated @L on the
 * runtime's layout (each file compiles its own sizeof); if not, records
 * why in L->error and returns FALSE. */
static inline gboolean
stow_llama_cuda_layout_ok (StowLlamaCuda *L)
{
  if (L->struct_bytes == sizeof (StowLlamaCuda))
    return TRUE;
  g_set_error (&L->error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
               "the cuda runtime's objects disagree on its layout (%zu and "
               "%zu bytes): a stale build; touch "
               "executor/backends/cuda/*.cu and rebuild",
               L->struct_bytes, sizeof (StowLlamaCuda));
  return FALSE;
}

/* Records @what's failure (the first one only) and returns FALSE, or
 * returns TRUE on cudaSuccess. */
gboolean stow_llama_cuda_ok (StowLlamaCuda *L, cudaError_t e, const char *what);
/* The same for the last kernel launch (cudaGetLastError). */
gboolean stow_llama_cuda_launched (StowLlamaCuda *L, const char *what);
/* Lets @kernel launch with @bytes of dynamic shared memory (above the 48
 * KiB default), reporting a failure as @what. */
template <typename F>
static inline gboolean
stow_cuda_smem_opt_in (StowLlamaCuda *L, F kernel, guint64 bytes,
                       const char *what)
{
  return stow_llama_cuda_ok (
      L,
      cudaFuncSetAttribute (kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)bytes),
      what);
}

/* ---- elements -------------------------------------------------------------
 */

/* Bit-identical to stow_f32_to_bf16 / stow_bf16_to_f32 (offload/adam.c). */
static __device__ __forceinline__ float
stow_cuda_bf16_load (uint16_t h)
{
  return __uint_as_float ((uint32_t)h << 16);
}

static __device__ __forceinline__ uint16_t
stow_cuda_bf16_round (float x)
{
  uint32_t b = __float_as_uint (x);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return 0x7fc0;
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* Element @i of a tensor of the runtime's dtype (bf16 when BF). */
template <bool BF>
static __device__ __forceinline__ float
ld_el (const void *p, guint64 i)
{
  if (BF)
    return stow_cuda_bf16_load (((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

template <bool BF>
static __device__ __forceinline__ void
st_el (void *p, guint64 i, float x)
{
  if (BF)
    ((uint16_t *)p)[i] = stow_cuda_bf16_round (x);
  else
    ((float *)p)[i] = x;
}

/* ---- GEMM -----------------------------------------------------------------
 */

/* Row-major C (M, N) = alpha op(A) op(B) + beta C, as cblas_sgemm with
 * CblasRowMajor: A is stored (M, K) with @lda, or (K, M) when @ta; B is
 * (K, N) with @ldb, or (N, K) when @tb.  Types: each of A, B, C fp32 or
 * bf16 (@a_bf16...), compute fp32.  Issued on the runtime's stream. */
void stow_cuda_gemm_rm (StowLlamaCuda *L, bool ta, bool tb, guint64 M,
                        guint64 N, guint64 K, float alpha, const void *A,
                        bool a_bf16, guint64 lda, const void *B, bool b_bf16,
                        guint64 ldb, float beta, void *C, bool c_bf16,
                        guint64 ldc);

/* ---- attention (attention.cu) ------------------------------------------- */

/* Raises the attention kernels' dynamic shared memory limits to what the
 * runtime's head_dim and tile need (once, in stow_llama_cuda_new); a
 * failure is recorded in L->error. */
gboolean stow_cuda_attention_init (StowLlamaCuda *L);
void stow_cuda_attention_forward (StowLlamaCuda *L, guint64 batch, guint64 seq,
                                  const void *q, const void *k, const void *v,
                                  void *o, float *lse);
void stow_cuda_attention_backward (StowLlamaCuda *L, guint64 batch, guint64 seq,
                                   const void *q, const void *k, const void *v,
                                   const void *o, const float *lse,
                                   const void *dout, void *dq, void *dk,
                                   void *dv);

/* The mma.sync path (attention-mma.cu), tried first by the tensor-core
 * path: init decides L->attn_mma from the compute capability @major and
 * the opt-in shared memory per block @limit (FALSE and L->error only when
 * CUDA fails); takes says whether these tensors can go through it. */
gboolean stow_cuda_attention_mma_init (StowLlamaCuda *L, int major, int limit);
bool stow_cuda_attention_mma_takes (const StowLlamaCuda *L, const void *q,
                                    const void *k, const void *v,
                                    const void *o);
void stow_cuda_attention_mma_forward (StowLlamaCuda *L, guint64 batch,
                                      guint64 seq, const void *q, const void *k,
                                      const void *v, void *o, float *lse);
void stow_cuda_attention_mma_backward (StowLlamaCuda *L, guint64 batch,
                                       guint64 seq, const void *q,
                                       const void *k, const void *v,
                                       const float *lse, const float *D,
                                       const void *dout, void *dq, void *dk,
                                       void *dv);

/* The tensor-core path (attention-tc.cu), taken by the two above when
 * L->attn_tc.  Init decides attn_tc (FALSE and L->error only when CUDA
 * fails); the backward takes D = rowsum (dO * O) (n, a) already computed. */
gboolean stow_cuda_attention_tc_init (StowLlamaCuda *L);
void stow_cuda_attention_tc_forward (StowLlamaCuda *L, guint64 batch,
                                     guint64 seq, const void *q, const void *k,
                                     const void *v, void *o, float *lse);
void stow_cuda_attention_tc_backward (StowLlamaCuda *L, guint64 batch,
                                      guint64 seq, const void *q, const void *k,
                                      const void *v, const float *lse,
                                      const float *D, const void *dout,
                                      void *dq, void *dk, void *dv);
