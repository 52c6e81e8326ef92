/* SPDX-License-Identifier: MIT
 *
 * tests/test-gemm.c: the cpu backend's matrix-product kernels
 * (executor/gemm.h).  The OpenBLAS core type each feature set gets; the
 * feature probe against libgcc's; the kernel chosen here against a plain
 * triple loop in double on odd shapes, every transpose, alpha and beta
 * (run a second time with STOWAGE_GEMM=openblas, tests/meson.build); and
 * what OpenBLAS's own threads do to the bits of one product, the reason
 * the callers tile.
 */
#include <dlfcn.h>
#include <math.h>
#include <string.h>

#include "executor/gemm.h"
#include "executor/llama-private.h" /* the bf16 conversions */

/* ---- the core type each CPU gets ------------------------------------------
 */

static void
test_core_for (void)
{
  struct
  {
    const char *cpu;
    StowCpuFeatures f;
    const char *core;
  } cases[] = {
    /* Sapphire Rapids and later (the model 0.3.21 does not list falls back
     * to Prescott): AVX-512 with BF16 and AMX. */
    { "Xeon with AMX",
      { .avx2 = 1, .avx512 = 1, .bf16 = 1, .amx = 1 },
      "Cooperlake" },
    { "Cooper Lake", { .avx2 = 1, .avx512 = 1, .bf16 = 1 }, "Cooperlake" },
    { "Skylake-SP / Ice Lake", { .avx2 = 1, .avx512 = 1 }, "SkylakeX" },
    { "Zen 4", { .amd = 1, .avx2 = 1, .avx512 = 1, .bf16 = 1 }, "Cooperlake" },
    { "Haswell .. Alder Lake", { .avx2 = 1 }, "Haswell" },
    { "Zen 1-3", { .amd = 1, .avx2 = 1 }, "Zen" },
    { "no AVX2", { 0 }, NULL },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const char *got = stow_openblas_core_for (&cases[i].f);
      g_test_message ("%s: %s", cases[i].cpu, got ? got : "(OpenBLAS's)");
      g_assert_cmpstr (got, ==, cases[i].core);
    }
}

/* The cpuid reading against libgcc's (which also checks XCR0). */
static void
test_features (void)
{
  StowCpuFeatures f;
  stow_cpu_features_probe (&f);
  g_autofree char *s = stow_cpu_features_string (&f);
  g_test_message ("this CPU: %s", s);
  __builtin_cpu_init ();
  gboolean avx2
      = __builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma");
  gboolean avx512 = __builtin_cpu_supports ("avx512f")
                    && __builtin_cpu_supports ("avx512dq")
                    && __builtin_cpu_supports ("avx512cd")
                    && __builtin_cpu_supports ("avx512bw")
                    && __builtin_cpu_supports ("avx512vl");
  g_assert_cmpint (f.avx2, ==, avx2);
  g_assert_cmpint (f.avx512, ==, avx512);
  g_assert_cmpint (f.bf16, ==, avx512 && __builtin_cpu_supports ("avx512bf16"));
}

/* ---- the chosen kernel --------------------------------------------------- */

static void
test_choice (void)
{
  GError *error = NULL;
  g_assert_true (stow_gemm_init (&error));
  g_assert_no_error (error);
  const StowGemmChoice *c = stow_gemm_choice ();
  g_autofree char *d = stow_gemm_describe ();
  g_test_message ("kernels: %s", d);
  StowCpuFeatures f;
  stow_cpu_features_probe (&f);
  const char *force = g_getenv ("STOWAGE_GEMM");
  if (c->f32 == STOW_GEMM_OPENBLAS)
    {
      /* OpenBLAS runs the core the features call for (unless the user
       * set one): the variable reached its constructor. */
      const char *want = g_getenv ("OPENBLAS_CORETYPE");
      if (want == NULL)
        want = stow_openblas_core_for (&f);
      g_assert_true (g_str_has_prefix (c->f32_kernel, "OpenBLAS "));
      if (want != NULL)
        g_assert_nonnull (strstr (c->f32_kernel, want));
      g_assert_false (c->bf16_native);
    }
  else
    {
      g_assert_true (g_str_has_prefix (c->f32_kernel, "oneDNN "));
      /* Chosen by itself only where oneDNN has a brgemm kernel. */
      if (force == NULL)
        g_assert_nonnull (strstr (c->f32_kernel, "brg:"));
    }
  if (force != NULL && g_str_equal (force, "openblas"))
    g_assert_cmpint (c->f32, ==, STOW_GEMM_OPENBLAS);
}

/* A deterministic pseudo-random fill in [-1, 1). */
static void
fill (float *x, guint64 n, guint32 seed)
{
  guint32 s = seed * 2654435761u + 1;
  for (guint64 i = 0; i < n; i++)
    {
      s = s * 1664525u + 1013904223u;
      x[i] = (float)((double)(s >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    }
}

/* @n floats rounded to bf16, newly allocated. */
static guint16 *
to_bf16 (const float *x, guint64 n)
{
  guint16 *h = g_new (guint16, n);
  for (guint64 i = 0; i < n; i++)
    h[i] = stow_f32_to_bf16 (x[i]);
  return h;
}

/* C (M, N) = alpha op(A) op(B) + beta C0 in double, with each element's
 * sum of |terms| (the scale of its rounding error) in @mag. */
static void
reference (gboolean ta, gboolean tb, guint64 M, guint64 N, guint64 K,
           double alpha, const float *A, guint64 lda, const float *B,
           guint64 ldb, double beta, const float *C0, guint64 ldc, double *C,
           double *mag)
{
  for (guint64 i = 0; i < M; i++)
    for (guint64 j = 0; j < N; j++)
      {
        double s = 0, m = 0;
        for (guint64 k = 0; k < K; k++)
          {
            double a = ta ? A[k * lda + i] : A[i * lda + k];
            double b = tb ? B[j * ldb + k] : B[k * ldb + j];
            s += a * b;
            m += fabs (a * b);
          }
        double c0 = C0[i * ldc + j];
        C[i * N + j] = alpha * s + beta * c0;
        mag[i * N + j] = fabs (alpha) * m + fabs (beta * c0);
      }
}

typedef struct
{
  guint64 M, N, K;
} Shape;

/* Odd sizes: edges of every register block, a K past one cache block, a
 * single row and column; more columns than a tile of the callers (512)
 * and a K past 2048. */
static const Shape shapes[] = {
  { 1, 1, 1 },       { 7, 13, 5 },    { 1, 67, 300 },
  { 33, 1, 129 },    { 33, 17, 129 }, { 130, 67, 300 },
  { 257, 129, 771 }, { 35, 530, 70 }, { 19, 45, 2101 },
};

/* @bf16: operands rounded to bf16 and multiplied by stow_gemm_bf16. */
/* The kernel under test: bf16 operands (Ah, Bh) or fp32 (A, B). */
static void
product (gboolean bf16, gboolean ta, gboolean tb, guint64 M, guint64 N,
         guint64 K, float alpha, const float *A, const guint16 *Ah, guint64 lda,
         const float *B, const guint16 *Bh, guint64 ldb, float beta, float *C,
         guint64 ldc)
{
  if (bf16)
    stow_gemm_bf16 (ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, beta, C, ldc);
  else
    stow_gemm_f32 (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void
check_products (gboolean bf16)
{
  GError *error = NULL;
  g_assert_true (stow_gemm_init (&error));
  if (bf16 && !stow_gemm_choice ()->bf16_native)
    {
      g_test_skip ("the kernel chosen here does not multiply bf16");
      return;
    }
  double worst = 0;
  for (guint s = 0; s < G_N_ELEMENTS (shapes); s++)
    for (guint t = 0; t < 4; t++)
      for (guint ab = 0; ab < 2; ab++)
        {
          guint64 M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
          gboolean ta = t & 1, tb = t >> 1;
          /* Leading dimensions wider than the matrices: a tile of a
           * larger operand, as the callers pass. */
          guint64 lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          float alpha = ab ? 0.5f : 1.0f, beta = ab ? 1.0f : 0.0f;
          guint64 na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
          g_autofree float *A = g_new (float, na);
          g_autofree float *B = g_new (float, nb);
          g_autofree float *C = g_new (float, M *ldc);
          g_autofree float *C0 = g_new (float, M *ldc);
          g_autofree guint16 *Ah = g_new (guint16, na);
          g_autofree guint16 *Bh = g_new (guint16, nb);
          g_autofree double *want = g_new (double, M *N);
          g_autofree double *mag = g_new (double, M *N);
          fill (A, na, 3 * s + t + 1);
          fill (B, nb, 5 * s + t + 2);
          fill (C0, M * ldc, 7 * s + t + 3);
          if (bf16)
            {
              /* The reference multiplies the values the kernel sees. */
              for (guint64 i = 0; i < na; i++)
                A[i] = stow_bf16_to_f32 (Ah[i] = stow_f32_to_bf16 (A[i]));
              for (guint64 i = 0; i < nb; i++)
                B[i] = stow_bf16_to_f32 (Bh[i] = stow_f32_to_bf16 (B[i]));
            }
          memcpy (C, C0, M * ldc * sizeof (float));
          reference (ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc,
                     want, mag);
          product (bf16, ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta,
                   C, ldc);
          for (guint64 i = 0; i < M; i++)
            for (guint64 j = 0; j < N; j++)
              {
                /* An fp32 sum of K products, in any order, is within
                 * (K + 2) u of the sum of their magnitudes (Higham,
                 * Accuracy and Stability, 3.1), u = 2^-24. */
                double err = fabs (C[i * ldc + j] - want[i * N + j]);
                double bound
                    = (double)(K + 2) * ldexp (1.0, -24) * mag[i * N + j];
                if (mag[i * N + j] > 0)
                  worst = MAX (worst, err / mag[i * N + j]);
                if (err > bound)
                  g_test_message ("%s %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT
                                  "x%" G_GUINT64_FORMAT
                                  " %c%c alpha %g beta %g: "
                                  "C[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT
                                  "] = %.9g, double says %.9g (bound %.3g)",
                                  bf16 ? "bf16" : "fp32", M, N, K,
                                  ta ? 'T' : 'N', tb ? 'T' : 'N', alpha, beta,
                                  i, j, C[i * ldc + j], want[i * N + j], bound);
                g_assert_cmpfloat (err, <=, bound);
              }
          /* Columns past N are not the product's: untouched. */
          for (guint64 i = 0; i < M; i++)
            g_assert_cmpmem (C + i * ldc + N, 2 * sizeof (float),
                             C0 + i * ldc + N, 2 * sizeof (float));
          /* The same call again: the same bits. */
          g_autofree float *C2 = g_memdup2 (C0, M * ldc * sizeof (float));
          product (bf16, ta, tb, M, N, K, alpha, A, Ah, lda, B, Bh, ldb, beta,
                   C2, ldc);
          g_assert_cmpmem (C, M * ldc * sizeof (float), C2,
                           M * ldc * sizeof (float));
        }
  g_autofree char *d = stow_gemm_describe ();
  g_test_message ("%s: worst error %.3g of the terms' magnitude (%s)",
                  bf16 ? "bf16" : "fp32", worst, d);
}

static void
test_f32 (void)
{
  check_products (FALSE);
}

static void
test_bf16 (void)
{
  check_products (TRUE);
}

/* ---- the runtime's products with bf16 in them ------------------------------
 */

/* One case of stow_llama_gemm in a bf16 runtime: which of A, B and C are
 * bf16, whether A and B are transposed, and what C starts from. */
typedef struct
{
  guint64 M, N, K;
  gboolean a_bf16, b_bf16, c_bf16, ta, tb;
  gboolean accumulate, with_r, with_bias;
} Mixed;

/* A runtime of @dtype on @threads threads, only for its GEMM (the config
 * is a stub). */
static StowLlama *
gemm_runtime (StowDtype dtype, guint threads)
{
  StowLlamaConfig c = { .hidden = 64,
                        .n_layers = 1,
                        .n_heads = 1,
                        .n_kv_heads = 1,
                        .head_dim = 64,
                        .ffn = 64,
                        .vocab = 64,
                        .rope_theta = 1e4,
                        .rms_norm_eps = 1e-6 };
  GError *error = NULL;
  StowLlama *L = stow_llama_new (&c, dtype, 64, threads, &error);
  g_assert_no_error (error);
  return L;
}

/* The bf16 runtime's product of @m on @threads threads; C (M, N + 2) of
 * C's type, its last two columns not the product's. */
static void *
mixed_run (const Mixed *m, guint threads, const float *A, const guint16 *Ah,
           guint64 lda, const float *B, const guint16 *Bh, guint64 ldb,
           const void *C0, const void *R, const guint16 *bias)
{
  g_autoptr (StowLlama) L = gemm_runtime (STOW_DTYPE_BF16, threads);
  guint64 ldc = m->N + 2, csize = m->c_bf16 ? 2 : 4;
  void *C = g_memdup2 (C0, m->M * ldc * csize);
  StowMat a = { m->a_bf16 ? (const void *)Ah : A, m->a_bf16, lda, m->ta };
  StowMat b = { m->b_bf16 ? (const void *)Bh : B, m->b_bf16, ldb, m->tb };
  stow_llama_gemm (L, m->M, m->N, m->K, 0.5f, a, b, C, m->c_bf16, ldc,
                   m->accumulate, m->with_r ? R : NULL, ldc,
                   m->with_bias ? bias : NULL);
  return C;
}

/* The products with a bf16 operand or C (the loss's at bf16: an fp32
 * operand beside the bf16 head; every bf16 product where the kernel does
 * not multiply bf16, as under STOWAGE_GEMM=openblas) against double, on
 * shapes with ragged tiles and K past one staging panel (512); the same
 * bits on 1 and 2 threads. */
static void
test_runtime_mixed (void)
{
  const Mixed cases[] = {
    /* logits = xn head^T: fp32 xn, bf16 head */
    { 250, 1100, 96, FALSE, TRUE, FALSE, FALSE, TRUE, FALSE, FALSE, FALSE },
    /* the same from a bf16 xn (loss_lowp): a fresh fp32 C of the bf16
     * kernel, summed in the tile and streamed out */
    { 250, 1100, 96, TRUE, TRUE, FALSE, FALSE, TRUE, FALSE, FALSE, FALSE },
    /* dhead (+)= dlogits^T xn into bf16 */
    { 700, 96, 250, FALSE, FALSE, TRUE, TRUE, FALSE, TRUE, FALSE, FALSE },
    { 700, 96, 250, FALSE, FALSE, TRUE, TRUE, FALSE, FALSE, FALSE, FALSE },
    /* dxn = dlogits head: K the vocabulary, past two panels */
    { 250, 96, 1100, FALSE, TRUE, FALSE, FALSE, FALSE, FALSE, FALSE, FALSE },
    /* bf16 throughout, from R and a bias, and accumulating */
    { 300, 700, 600, TRUE, TRUE, TRUE, FALSE, TRUE, FALSE, TRUE, TRUE },
    { 130, 67, 1030, TRUE, TRUE, TRUE, TRUE, FALSE, TRUE, FALSE, FALSE },
    { 33, 17, 5, TRUE, FALSE, FALSE, TRUE, TRUE, FALSE, FALSE, TRUE },
    { 1, 1, 0, TRUE, TRUE, TRUE, FALSE, FALSE, FALSE, TRUE, TRUE },
  };
  GError *error = NULL;
  g_assert_true (stow_gemm_init (&error));
  for (guint ci = 0; ci < G_N_ELEMENTS (cases); ci++)
    {
      const Mixed *m = &cases[ci];
      guint64 M = m->M, N = m->N, K = m->K, ldc = N + 2;
      guint64 lda = (m->ta ? M : K) + 3, ldb = (m->tb ? K : N) + 5;
      guint64 na = (m->ta ? K : M) * lda, nb = (m->tb ? N : K) * ldb;
      g_autofree float *A = g_new (float, MAX (na, 1));
      g_autofree float *B = g_new (float, MAX (nb, 1));
      g_autofree guint16 *Ah = g_new (guint16, MAX (na, 1));
      g_autofree guint16 *Bh = g_new (guint16, MAX (nb, 1));
      g_autofree float *Cf = g_new (float, M *ldc);
      g_autofree guint16 *Ch = g_new (guint16, M * ldc);
      g_autofree float *bf = g_new (float, N);
      g_autofree guint16 *bh = g_new (guint16, N);
      fill (A, na, 11 * ci + 1);
      fill (B, nb, 11 * ci + 2);
      fill (Cf, M * ldc, 11 * ci + 3);
      fill (bf, N, 11 * ci + 4);
      /* Every value bf16-exact: the reference sees what the kernel does
       * whichever type an operand is passed as. */
      for (guint64 i = 0; i < na; i++)
        A[i] = stow_bf16_to_f32 (Ah[i] = stow_f32_to_bf16 (A[i]));
      for (guint64 i = 0; i < nb; i++)
        B[i] = stow_bf16_to_f32 (Bh[i] = stow_f32_to_bf16 (B[i]));
      for (guint64 i = 0; i < M * ldc; i++)
        Cf[i] = stow_bf16_to_f32 (Ch[i] = stow_f32_to_bf16 (Cf[i]));
      for (guint64 i = 0; i < N; i++)
        bf[i] = stow_bf16_to_f32 (bh[i] = stow_f32_to_bf16 (bf[i]));
      const void *C0 = m->c_bf16 ? (const void *)Ch : Cf;
      g_autofree void *c1
          = mixed_run (m, 1, A, Ah, lda, B, Bh, ldb, C0, C0, bh);
      g_autofree void *c2
          = mixed_run (m, 2, A, Ah, lda, B, Bh, ldb, C0, C0, bh);
      guint64 csize = m->c_bf16 ? 2 : 4;
      g_assert_cmpmem (c1, M * ldc * csize, c2, M * ldc * csize);
      g_autofree double *want = g_new (double, M *N);
      g_autofree double *mag = g_new (double, M *N);
      /* Starting from C0 (accumulate, or R: R is C0 here) plus the bias. */
      gboolean from_c = m->accumulate || m->with_r;
      reference (m->ta, m->tb, M, N, K, 0.5, A, lda, B, ldb, from_c ? 1.0 : 0.0,
                 Cf, ldc, want, mag);
      for (guint64 i = 0; i < M; i++)
        for (guint64 j = 0; j < N; j++)
          {
            double w = want[i * N + j], bound;
            double mg = mag[i * N + j];
            if (m->with_bias && !m->accumulate)
              {
                w += bf[j];
                mg += fabs (bf[j]);
              }
            /* fp32 sums (test_f32's bound), then one rounding to bf16. */
            bound = (double)(K + 3) * ldexp (1.0, -24) * mg;
            double got
                = m->c_bf16
                      ? stow_bf16_to_f32 (((const guint16 *)c1)[i * ldc + j])
                      : ((const float *)c1)[i * ldc + j];
            if (m->c_bf16)
              bound += ldexp (1.0, -8) * (fabs (w) + bound);
            if (fabs (got - w) > bound)
              g_test_message ("case %u: C[%" G_GUINT64_FORMAT
                              ",%" G_GUINT64_FORMAT "] = %.9g, double says "
                              "%.9g (bound %.3g)",
                              ci, i, j, got, w, bound);
            g_assert_cmpfloat (fabs (got - w), <=, bound);
          }
      /* Columns past N are not the product's: untouched. */
      for (guint64 i = 0; i < M; i++)
        g_assert_cmpmem ((const guint8 *)c1 + (i * ldc + N) * csize, 2 * csize,
                         (const guint8 *)C0 + (i * ldc + N) * csize, 2 * csize);
    }
}

/* The runtime's products on the shapes of a training step of a 768-wide
 * model (a 32,000-token vocabulary, 512 tokens: the layers' and the loss's
 * products, K up to the vocabulary), fp32 and bf16, give the same bits on 1
 * thread as on 2.  The kernel runs whole on the calling thread: on 1
 * thread, whose team OpenMP does not count as active, oneDNN used to open
 * a team of its own inside some calls and split them differently (the
 * vocabulary-long K among them). */
static void
test_thread_bits (void)
{
  const struct
  {
    guint64 M, N, K;
    gboolean ta, tb, accumulate;
  } steps[] = {
    /* the layers' forward (x W^T, onto the residual), dX (dY W) and dW
     * (dY^T x) */
    { 512, 768, 768, FALSE, TRUE, FALSE },
    { 512, 768, 2048, FALSE, TRUE, TRUE },
    { 512, 2048, 768, FALSE, TRUE, FALSE },
    { 512, 768, 2048, FALSE, FALSE, FALSE },
    { 768, 768, 512, TRUE, FALSE, TRUE },
    { 2048, 768, 512, TRUE, FALSE, TRUE },
    /* the loss's: logits, dxn (K the vocabulary), the head's gradient */
    { 262, 32000, 768, FALSE, TRUE, FALSE },
    { 262, 768, 32000, FALSE, FALSE, FALSE },
    { 32000, 768, 262, TRUE, FALSE, TRUE },
  };
  GError *error = NULL;
  g_assert_true (stow_gemm_init (&error));
  for (guint bf16 = 0; bf16 < 2; bf16++)
    {
      if (bf16 && !stow_gemm_choice ()->bf16_native)
        continue;
      StowDtype dt = bf16 ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
      g_autoptr (StowLlama) L1 = gemm_runtime (dt, 1);
      g_autoptr (StowLlama) L2 = gemm_runtime (dt, 2);
      for (guint si = 0; si < G_N_ELEMENTS (steps); si++)
        {
          guint64 M = steps[si].M, N = steps[si].N, K = steps[si].K;
          guint64 esize = bf16 ? 2 : 4;
          g_autofree float *A = g_new (float, M *K);
          g_autofree float *B = g_new (float, K *N);
          fill (A, M * K, 7 * si + 1);
          fill (B, K * N, 7 * si + 2);
          g_autofree guint16 *Ah = to_bf16 (A, M * K);
          g_autofree guint16 *Bh = to_bf16 (B, K * N);
          StowMat a = { bf16 ? (const void *)Ah : A, bf16, steps[si].ta ? M : K,
                        steps[si].ta };
          StowMat b = { bf16 ? (const void *)Bh : B, bf16, steps[si].tb ? K : N,
                        steps[si].tb };
          /* C from earlier values where the product adds to it. */
          g_autofree float *C0 = g_new (float, M *N);
          fill (C0, M * N, 7 * si + 3);
          g_autofree void *c1 = g_malloc (M * N * esize);
          for (guint64 i = 0; i < M * N; i++)
            if (bf16)
              ((guint16 *)c1)[i] = stow_f32_to_bf16 (C0[i]);
            else
              ((float *)c1)[i] = C0[i];
          g_autofree void *c2 = g_memdup2 (c1, M * N * esize);
          gboolean acc = steps[si].accumulate;
          stow_llama_gemm (L1, M, N, K, 1.0f, a, b, c1, bf16, N, acc, NULL, 0,
                           NULL);
          stow_llama_gemm (L2, M, N, K, 1.0f, a, b, c2, bf16, N, acc, NULL, 0,
                           NULL);
          if (memcmp (c1, c2, M * N * esize) != 0)
            g_test_message ("%s %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
                            " x %" G_GUINT64_FORMAT ": 1 and 2 threads differ",
                            bf16 ? "bf16" : "fp32", M, N, K);
          g_assert_cmpmem (c1, M * N * esize, c2, M * N * esize);
        }
    }
}

/* A fresh fp32 C of the bf16 kernel is summed in the thread's tile and
 * copied out past the caches: the bits the kernel writes into C itself
 * (the same product added onto zeros, which it sums in place), on every
 * element of rows that start at every alignment, the columns past N
 * untouched. */
static void
test_fresh_f32_tile (void)
{
  GError *error = NULL;
  g_assert_true (stow_gemm_init (&error));
  if (!stow_gemm_choice ()->bf16_native)
    {
      g_test_skip ("the GEMM kernel does not multiply bf16 here");
      return;
    }
  const struct
  {
    guint64 M, N, K;
    gboolean ta, tb;
  } cases[] = { { 262, 1100, 96, FALSE, TRUE },
                { 37, 515, 70, FALSE, FALSE },
                { 130, 67, 1030, TRUE, FALSE } };
  g_autoptr (StowLlama) L = gemm_runtime (STOW_DTYPE_BF16, 2);
  for (guint ci = 0; ci < G_N_ELEMENTS (cases); ci++)
    {
      guint64 M = cases[ci].M, N = cases[ci].N, K = cases[ci].K;
      guint64 ldc = N + 3; /* rows start at every alignment */
      g_autofree float *A = g_new (float, M *K);
      g_autofree float *B = g_new (float, K *N);
      fill (A, M * K, 11 * ci + 1);
      fill (B, K * N, 11 * ci + 2);
      g_autofree guint16 *Ah = to_bf16 (A, M * K);
      g_autofree guint16 *Bh = to_bf16 (B, K * N);
      StowMat a = { Ah, TRUE, cases[ci].ta ? M : K, cases[ci].ta };
      StowMat b = { Bh, TRUE, cases[ci].tb ? K : N, cases[ci].tb };
      g_autofree float *fresh = g_new (float, M *ldc);
      g_autofree float *added = g_new0 (float, M *ldc);
      for (guint64 i = 0; i < M * ldc; i++)
        fresh[i] = 1e30f; /* what the product must overwrite */
      stow_llama_gemm (L, M, N, K, 0.5f, a, b, fresh, FALSE, ldc, FALSE, NULL,
                       0, NULL);
      stow_llama_gemm (L, M, N, K, 0.5f, a, b, added, FALSE, ldc, TRUE, NULL, 0,
                       NULL);
      for (guint64 i = 0; i < M; i++)
        {
          for (guint64 j = 0; j < N; j++)
            g_assert_cmpfloat (fresh[i * ldc + j], ==, added[i * ldc + j]);
          for (guint64 j = N; j < ldc; j++)
            g_assert_cmpfloat (fresh[i * ldc + j], ==, 1e30f);
        }
    }
}

/* ---- why the callers tile ------------------------------------------------ */

/* What OpenBLAS's own threads do to the bits of one product (a
 * measurement, reported in docs/executor.md; only the run-to-run
 * determinism at a fixed count is asserted).  OpenBLAS is loaded here as
 * executor/gemm.c loads it, with the core the features call for. */
static void
test_openblas_threads (void)
{
  guint64 M = 1024, N = 768, K = 768;
  if (g_getenv ("STOW_VALGRIND"))
    {
      g_test_skip ("a measurement of OpenBLAS, not of this code: slow under "
                   "valgrind");
      return;
    }
  StowCpuFeatures f;
  stow_cpu_features_probe (&f);
  const char *core = stow_openblas_core_for (&f);
  if (core != NULL && g_getenv ("OPENBLAS_CORETYPE") == NULL)
    g_setenv ("OPENBLAS_CORETYPE", core, TRUE);
  void *lib = dlopen ("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    {
      g_test_skip ("no libopenblas.so.0");
      return;
    }
  typedef void (*SgemmFn) (int, int, int, int, int, int, float, const float *,
                           int, const float *, int, float, float *, int);
  SgemmFn sgemm = (SgemmFn)dlsym (lib, "cblas_sgemm");
  void (*set_threads) (int)
      = (void (*) (int))dlsym (lib, "openblas_set_num_threads");
  char *(*corename) (void)
      = (char *(*)(void))dlsym (lib, "openblas_get_corename");
  g_assert_nonnull (sgemm);
  g_assert_nonnull (set_threads);
  g_assert_nonnull (corename);
  g_autofree float *A = g_new (float, M *K);
  g_autofree float *B = g_new (float, K *N);
  g_autofree float *C1 = g_new (float, M *N);
  g_autofree float *C2 = g_new (float, M *N);
  g_autofree float *C3 = g_new (float, M *N);
  fill (A, M * K, 9);
  fill (B, K * N, 10);
  float *out[3] = { C1, C2, C3 };
  int threads[3] = { 1, 2, 2 };
  for (guint i = 0; i < 3; i++)
    {
      set_threads (threads[i]);
      sgemm (101, 111, 111, (int)M, (int)N, (int)K, 1.0f, A, (int)K, B, (int)N,
             0.0f, out[i], (int)N);
    }
  set_threads (1);
  guint64 differ = 0;
  double worst = 0, top = 0;
  for (guint64 i = 0; i < M * N; i++)
    {
      differ += memcmp (&C1[i], &C2[i], 4) != 0;
      worst = MAX (worst, fabs ((double)C2[i] - C1[i]));
      top = MAX (top, fabs ((double)C1[i]));
    }
  g_test_message (
      "OpenBLAS %s sgemm (%" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
      " x %" G_GUINT64_FORMAT "), 1 vs 2 threads: %" G_GUINT64_FORMAT
      " of %" G_GUINT64_FORMAT " elements differ, max relative %.2g",
      corename (), M, N, K, differ, M * N, worst / top);
  g_assert_cmpmem (C2, 4 * M * N, C3, 4 * M * N);
  g_assert_cmpfloat (worst / top, <, 1e-5);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/gemm/core-for", test_core_for);
  g_test_add_func ("/gemm/features", test_features);
  g_test_add_func ("/gemm/choice", test_choice);
  g_test_add_func ("/gemm/f32", test_f32);
  g_test_add_func ("/gemm/bf16", test_bf16);
  g_test_add_func ("/gemm/runtime-mixed", test_runtime_mixed);
  g_test_add_func ("/gemm/fresh-f32-tile", test_fresh_f32_tile);
  g_test_add_func ("/gemm/thread-bits", test_thread_bits);
  g_test_add_func ("/gemm/openblas-threads", test_openblas_threads);
  return g_test_run ();
}
