/* SPDX-License-Identifier: MIT
 *
 * tests/test-llama.c: the decoder runtime (executor/llama.h).  Sizes
 * against the memory model's formula worked by hand; errors that name the
 * field; gradients against central finite differences; recomputation bit
 * for bit; dx over x; accumulate against overwrite; the same bits at 1 and
 * 2 threads; bf16 against fp32; and the PyTorch oracle
 * (tests/oracle/llama_oracle.py), skipped where no python imports torch.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include <glib/gstdio.h>

#include "executor/llama-private.h"
#include "tests/testutil-llama.h"

/* ---- configs ------------------------------------------------------------- */

/* Every feature: GQA, llama3 rope scaling, all biases, untied. */
static StowLlamaConfig
tiny_all (void)
{
  return (StowLlamaConfig){
    .hidden = 16,
    .n_layers = 2,
    .n_heads = 4,
    .n_kv_heads = 2,
    .head_dim = 4,
    .ffn = 24,
    .vocab = 19,
    .rope_theta = 500000,
    .rms_norm_eps = 1e-5,
    .rope_factor = 4,
    .rope_low_freq_factor = 1,
    .rope_high_freq_factor = 4,
    .rope_original_max_positions = 16,
    .qkv_bias = TRUE,
    .o_bias = TRUE,
    .mlp_bias = TRUE,
  };
}

/* MHA, no biases, tied. */
static StowLlamaConfig
tiny_tied (void)
{
  return (StowLlamaConfig){
    .hidden = 24,
    .n_layers = 2,
    .n_heads = 3,
    .n_kv_heads = 3,
    .head_dim = 8,
    .ffn = 40,
    .vocab = 23,
    .rope_theta = 10000,
    .rms_norm_eps = 1e-6,
    .tied = TRUE,
  };
}

/* Qwen3: per-head q/k norms, head_dim 6 against hidden / heads 4, GQA. */
static StowLlamaConfig
tiny_qwen3 (void)
{
  return (StowLlamaConfig){
    .hidden = 16,
    .n_layers = 2,
    .n_heads = 4,
    .n_kv_heads = 2,
    .head_dim = 6,
    .ffn = 24,
    .vocab = 19,
    .rope_theta = 1000000,
    .rms_norm_eps = 1e-6,
    .qk_norm = TRUE,
  };
}

static StowLlamaConfig
qk_norm (StowLlamaConfig c)
{
  c.qk_norm = TRUE;
  return c;
}

static StowLlamaConfig
shape (guint64 h, guint64 a, guint64 k, guint64 d, guint64 f, guint64 V)
{
  return (StowLlamaConfig){ .hidden = h,
                            .n_layers = 1,
                            .n_heads = a,
                            .n_kv_heads = k,
                            .head_dim = d,
                            .ffn = f,
                            .vocab = V,
                            .rope_theta = 10000,
                            .rms_norm_eps = 1e-6 };
}

/* max |a - b| / max |b| over @n floats. */
static double
rel_err (const float *a, const float *b, guint64 n)
{
  double err = 0, scale = 0;
  for (guint64 i = 0; i < n; i++)
    {
      err = MAX (err, fabs ((double)a[i] - (double)b[i]));
      scale = MAX (scale, fabs ((double)b[i]));
    }
  return scale > 0 ? err / scale : err;
}

/* ---- sizes
 * ------------------------------------------------------------------- */

/* e n (4 h + 2 a d + 2 k d + 3 f) + 4 n a, and e n (a d + k d) more with
 * Qwen3's q/k norms, worked by hand for four published shapes. */
static void
test_saved_bytes (void)
{
  struct
  {
    const char *what;
    StowLlamaConfig c;
    StowDtype dt;
    guint64 n, saved, out;
  } cases[] = {
    /* Llama-2-7B: 4096 (16384 + 8192 + 8192 + 33024) 2 + 4 4096 32 */
    { "llama-2-7b bf16", shape (4096, 32, 32, 128, 11008, 32000),
      STOW_DTYPE_BF16, 4096, 539492352, 33554432 },
    /* Llama-3-8B: 2048 (16384 + 8192 + 2048 + 43008) 4 + 4 2048 32 */
    { "llama-3-8b fp32", shape (4096, 32, 8, 128, 14336, 128256),
      STOW_DTYPE_F32, 2048, 570687488, 33554432 },
    /* Qwen2-0.5B: 1000 (3584 + 1792 + 256 + 14592) 2 + 4 1000 14 */
    { "qwen2-0.5b bf16", shape (896, 14, 2, 64, 4864, 151936), STOW_DTYPE_BF16,
      1000, 40504000, 1792000 },
    /* Qwen3-0.6B (head_dim 128, not 1024 / 16): 1000 (4096 + 4096 + 2048
     * + 9216 + 2048 + 1024) 2 + 4 1000 16 */
    { "qwen3-0.6b bf16", qk_norm (shape (1024, 16, 8, 128, 3072, 151936)),
      STOW_DTYPE_BF16, 1000, 45120000, 2048000 },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (StowLlama) L
          = stow_llama_new (&cases[i].c, cases[i].dt, 8, 1, &error);
      g_assert_no_error (error);
      g_test_message ("%s", cases[i].what);
      g_assert_cmpuint (stow_llama_saved_bytes (L, cases[i].n), ==,
                        cases[i].saved);
      g_assert_cmpuint (stow_llama_out_bytes (L, cases[i].n), ==, cases[i].out);
      /* The working set is the saved tensors less the logsumexp. */
      g_assert_cmpuint (stow_llama_backward_ws_bytes (L, cases[i].n), ==,
                        cases[i].saved - 4 * cases[i].n * cases[i].c.n_heads);
    }
}

/* The carve packs the tensors with no gap and no overlap, each aligned to
 * its element type, for any n. */
static void
test_carve (void)
{
  for (int qk = 0; qk < 2; qk++)
    for (int bf = 0; bf < 2; bf++)
      for (guint64 n = 1; n < 40; n += 3)
        {
          StowLlamaConfig c = tiny_all ();
          c.qk_norm = qk;
          g_autoptr (StowLlama) L = stow_llama_new (
              &c, bf ? STOW_DTYPE_BF16 : STOW_DTYPE_F32, 8, 1, NULL);
          guint64 e = bf ? 2 : 4, h = c.hidden, f = c.ffn;
          guint64 ad = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
          guint64 rest
              = stow_llama_saved_bytes (L, n) - stow_llama_out_bytes (L, n);
          g_autofree guint8 *buf = g_malloc (rest);
          guint8 out;
          StowLlamaSaved s;
          stow_llama_saved_carve (L, n, buf, &out, &s);
          g_assert_true (s.out == &out);
          struct
          {
            void *p;
            guint64 bytes, align;
          } t[] = {
            { s.lse, 4 * n * c.n_heads, 4 },  { s.xn1, e * n * h, e },
            { s.q, e * n * ad, e },           { s.k, e * n * kd, e },
            { s.v, e * n * kd, e },           { s.o, e * n * ad, e },
            { s.h1, e * n * h, e },           { s.xn2, e * n * h, e },
            { s.gate, e * n * f, e },         { s.up, e * n * f, e },
            { s.act, e * n * f, e },          { s.qr, qk ? e * n * ad : 0, e },
            { s.kr, qk ? e * n * kd : 0, e },
          };
          if (!qk)
            {
              g_assert_null (s.qr);
              g_assert_null (s.kr);
            }
          guint8 *at = buf;
          for (guint i = 0; i < G_N_ELEMENTS (t) - (qk ? 0 : 2); i++)
            {
              g_assert_true ((guint8 *)t[i].p == at);
              g_assert_cmpuint ((guintptr)t[i].p % t[i].align, ==, 0);
              at += t[i].bytes;
            }
          g_assert_cmpuint (at - buf, ==, rest);
          stow_llama_saved_carve (L, n, NULL, &out, &s);
          g_assert_null (s.q);
          g_assert_true (s.out == &out);
        }
}

static void
test_workspace_bytes (void)
{
  StowLlamaConfig c = shape (64, 4, 2, 16, 96, 101);
  g_autoptr (StowLlama) a = stow_llama_new (&c, STOW_DTYPE_F32, 100, 1, NULL);
  g_autoptr (StowLlama) b = stow_llama_new (&c, STOW_DTYPE_F32, 100, 2, NULL);
  g_autoptr (StowLlama) s = stow_llama_new (&c, STOW_DTYPE_BF16, 100, 1, NULL);
  g_autoptr (StowLlama) t = stow_llama_new (&c, STOW_DTYPE_F32, 1000, 1, NULL);
  guint64 wa = stow_llama_workspace_bytes (a);
  /* Rotary tables (2 T d/2 floats) and at least one thread's score tile
   * (128 T floats). */
  g_assert_cmpuint (wa, >=, 4 * (100 * 16 + 100 * 100));
  g_assert_cmpuint (stow_llama_workspace_bytes (b), >, wa);
  /* bf16 adds, per thread, one 256 x 512 fp32 tile (a bf16 C before its
   * rounding) and the staging panels of 256 + 512 rows of 512 floats.
   * Where the kernel multiplies bf16, attention's products take bf16
   * operands: its backward's four (T, d) heads take half the floats, and
   * P and dS rounded, two (BQ, T) bf16 tiles (BQ = T = 100 here), are
   * added (each region in whole cache lines: up to 4 x 16 floats more). */
  guint64 tiles = 256 * 512 * 4 + (256 + 512) * 512 * 4;
  guint64 ws = stow_llama_workspace_bytes (s);
  if (stow_gemm_choice ()->bf16_native)
    {
      guint64 extra = 4 * (100 * 100 - 2 * 100 * 16);
      g_assert_cmpuint (ws, >=, wa + tiles + extra);
      g_assert_cmpuint (ws, <=, wa + tiles + extra + 4 * 4 * 16);
    }
  else
    g_assert_cmpuint (ws, ==, wa + tiles);
  /* Linear in T, not quadratic: the scores are (128, T) tiles. */
  g_assert_cmpuint (stow_llama_workspace_bytes (t), <, 12 * wa);
  g_assert_cmpuint (stow_llama_get_n_threads (b), ==, 2);
  g_assert_cmpint (stow_llama_get_dtype (s), ==, STOW_DTYPE_BF16);
  g_assert_cmpuint (stow_llama_get_config (s)->ffn, ==, 96);
}

static void
test_chunk (void)
{
  /* 32 MiB of fp32 logits: 2^25 / (4 V) tokens. */
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (32000, 4096, 8192), ==, 262);
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (128256, 4096, 8192), ==, 65);
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (151936, 896, 8192), ==, 55);
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (32000, 4096, 100), ==, 100);
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (1 << 24, 64, 100), ==, 1);
  g_assert_cmpuint (stow_llama_loss_chunk_tokens (101, 64, 0), ==, 1);
  g_assert_cmpuint (stow_llama_loss_scratch_floats (32000, 4096, 262), ==,
                    262 * (2 * 4096 + 32000));
}

/* ---- errors
 * ------------------------------------------------------------------- */

static void
expect_error (StowLlamaConfig c, StowDtype dt, guint64 max_seq,
              const char *const *words)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowLlama) L = stow_llama_new (&c, dt, max_seq, 1, &error);
  g_assert_null (L);
  g_assert_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID);
  g_test_message ("%s", error->message);
  for (; *words; words++)
    g_assert_nonnull (strstr (error->message, *words));
}

static void
test_errors (void)
{
  StowLlamaConfig c = shape (64, 32, 7, 2, 96, 101);
  expect_error (c, STOW_DTYPE_F32, 8,
                (const char *[]){ "n_kv_heads (7)", "n_heads (32)", NULL });
  c = shape (64, 4, 2, 15, 96, 101);
  expect_error (c, STOW_DTYPE_F32, 8,
                (const char *[]){ "head_dim (15)", "even", NULL });
  c = shape (0, 4, 2, 16, 96, 101);
  expect_error (c, STOW_DTYPE_F32, 8, (const char *[]){ "hidden", NULL });
  c = shape (64, 4, 0, 16, 96, 101);
  expect_error (c, STOW_DTYPE_F32, 8, (const char *[]){ "n_kv_heads", NULL });
  c = shape (64, 4, 2, 16, 96, 0);
  expect_error (c, STOW_DTYPE_F32, 8, (const char *[]){ "vocab", NULL });
  c = shape (64, 4, 2, 16, 96, 101);
  expect_error (c, STOW_DTYPE_F32, 0, (const char *[]){ "max_seq", NULL });
  expect_error (c, STOW_DTYPE_F16, 8, (const char *[]){ "fp16", NULL });
  c.rope_theta = 0;
  expect_error (c, STOW_DTYPE_F32, 8, (const char *[]){ "rope_theta", NULL });
  c = shape (64, 4, 2, 16, 96, 101);
  c.rope_factor = 8, c.rope_low_freq_factor = 4, c.rope_high_freq_factor = 1;
  c.rope_original_max_positions = 8192;
  expect_error (c, STOW_DTYPE_F32, 8,
                (const char *[]){ "rope_high_freq_factor", NULL });
}

/* ---- conversions and exp ----------------------------------------------------
 */

/* Rounding to bf16 spelled out, not core/dtype.h's add-and-shift: the
 * upper 16 bits, one more when the 16 dropped are over half or exactly
 * half with the kept ones odd (a carry may reach infinity); a NaN is the
 * quiet 0x7fc0. */
static guint16
reference_round (float x)
{
  if (isnan (x))
    return 0x7fc0;
  guint32 b;
  memcpy (&b, &x, 4);
  guint32 hi = b >> 16, lo = b & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
    hi++;
  return (guint16)hi;
}

/* A bf16 code's value from its fields: sign, 8 bits of exponent (bias
 * 127), 7 of fraction. */
static double
reference_widen (guint16 h)
{
  int e = (h >> 7) & 0xff, f = h & 0x7f;
  double v = e == 0xff ? (f ? NAN : INFINITY)
             : e == 0  ? ldexp (f, -133)          /* f 2^-7 2^-126 */
                       : ldexp (128 + f, e - 134); /* (1 + f/128) 2^(e-127) */
  return (h >> 15) ? -v : v;
}

static void
check_round (float x)
{
  guint32 b;
  memcpy (&b, &x, 4);
  if (stow_f32_to_bf16 (x) != reference_round (x))
    g_error ("bf16 of 0x%08x: 0x%04x, the reference says 0x%04x", b,
             stow_f32_to_bf16 (x), reference_round (x));
}

/* core/dtype.h's conversions (the runtime's, CPU Adam's and the
 * collectives') against the references: every bf16 code up, specials and
 * 2^20 random fp32 patterns down. */
static void
test_bf16_conversions (void)
{
  for (guint32 h = 0; h < 65536; h++)
    {
      float a = stow_bf16_to_f32 ((guint16)h);
      double want = reference_widen ((guint16)h);
      guint32 bits;
      memcpy (&bits, &a, 4);
      /* Exact: the code's 16 bits on top, zeros below (a NaN's payload
       * kept). */
      g_assert_cmpuint (bits, ==, h << 16);
      if (isnan (want))
        g_assert_true (isnan (a));
      else
        {
          g_assert_cmpfloat ((double)a, ==, want);
          g_assert_cmpint (signbit (a) != 0, ==, (h >> 15) != 0);
        }
    }
  const guint32 special[]
      = { 0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
          0x7f800001, 0xffffffff, 0x7fbfffff, 0x00000001, 0x807fffff,
          0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x3f808000, 0x3f818000,
          0x3f80c000, 0x3f817fff, 0x00008000, 0x00018000 };
  for (guint i = 0; i < G_N_ELEMENTS (special); i++)
    {
      float x;
      memcpy (&x, &special[i], 4);
      check_round (x);
    }
  g_autoptr (GRand) r = g_rand_new_with_seed (7);
  /* Fewer under valgrind (tests/meson.build sets STOW_VALGRIND). */
  guint n_random = g_getenv ("STOW_VALGRIND") ? 1u << 14 : 1u << 20;
  for (guint i = 0; i < n_random; i++)
    {
      guint32 b = g_rand_int (r);
      float x;
      memcpy (&x, &b, 4);
      check_round (x);
    }
}

/* The element-wise row loops run as the widest clone this CPU has
 * (STOW_LLAMA_VEC: AVX-512, AVX2 or the baseline); each must give the bits
 * of the same operations one element at a time, or the bytes would depend
 * on the CPU.  The references are scalar and contract nothing. */
__attribute__ ((optimize ("fp-contract=off", "no-tree-vectorize"))) static void
widths_reference (guint64 n, guint64 h, guint64 f, guint64 heads, guint64 d,
                  const float *x, const float *w, const float *rstd,
                  float *norm, const float *g, const float *u, const float *da,
                  float *act, float *dg, float *du, float *rot, const float *cs,
                  const float *sn, guint64 seq)
{
  for (guint64 r = 0; r < n; r++)
    for (guint64 j = 0; j < h; j++)
      norm[r * h + j] = w[j] * (x[r * h + j] * rstd[r]);
  for (guint64 j = 0; j < n * f; j++)
    {
      act[j] = g[j] / (1.0f + stow_llama_expf (-g[j])) * u[j];
      float s = 1.0f / (1.0f + stow_llama_expf (-g[j]));
      dg[j] = da[j] * u[j] * (s * (1.0f + g[j] * (1.0f - s)));
      du[j] = da[j] * (g[j] * s);
    }
  for (guint64 r = 0; r < n; r++)
    for (guint64 hd = 0; hd < heads; hd++)
      for (guint64 i = 0; i < d / 2; i++)
        {
          float *a = rot + r * heads * d + hd * d, *b = a + d / 2;
          float c = cs[r % seq * (d / 2) + i], sv = sn[r % seq * (d / 2) + i];
          float x1 = a[i], x2 = b[i];
          a[i] = x1 * c - x2 * sv;
          b[i] = x2 * c + x1 * sv;
        }
}

/* The column sums of the norms' weight gradients: each column's rows in
 * order, in double, of y times x rstd rounded to fp32. */
__attribute__ ((optimize ("fp-contract=off", "no-tree-vectorize"))) static void
colsum_reference (guint64 n, guint64 h, const float *y, const float *x,
                  const float *rstd, float *out)
{
  for (guint64 c = 0; c < h; c++)
    {
      double acc = 0;
      for (guint64 r = 0; r < n; r++)
        {
          float xs = x[r * h + c] * rstd[r];
          acc += (double)y[r * h + c] * (double)xs;
        }
      out[c] = (float)acc;
    }
}

static void
test_vector_widths (void)
{
  /* Odd widths: every clone's remainder loop runs too. */
  guint64 n = 5, h = 75, f = 203, heads = 3, d = 22, seq = 4;
  StowLlamaConfig c = shape (h, heads, heads, d, f, 101);
  g_autoptr (StowLlama) L = stow_llama_new (&c, STOW_DTYPE_F32, 8, 2, NULL);
  g_assert_nonnull (L);
  GRand *rng = g_rand_new_with_seed (40);
  float *x = g_new (float, n *h), *w = g_new (float, h);
  float *g = g_new (float, n *f), *u = g_new (float, n *f);
  float *da = g_new (float, n *f), *rot = g_new (float, n *heads *d);
  for (guint64 i = 0; i < n * h; i++)
    x[i] = (float)g_rand_double_range (rng, -3, 3);
  for (guint64 i = 0; i < h; i++)
    w[i] = (float)g_rand_double_range (rng, 0.5, 1.5);
  for (guint64 i = 0; i < n * f; i++)
    {
      /* Past exp's clamps at both ends too. */
      g[i] = (float)g_rand_double_range (rng, -100, 100);
      g[i] = i % 3 ? g[i] / 20 : g[i];
      u[i] = (float)g_rand_double_range (rng, -2, 2);
      da[i] = (float)g_rand_double_range (rng, -1, 1);
    }
  for (guint64 i = 0; i < n * heads * d; i++)
    rot[i] = (float)g_rand_double_range (rng, -2, 2);
  float *rstd = g_new (float, n), *norm = g_new (float, n *h);
  float *act = g_new (float, n *f), *rot_k = g_memdup2 (rot, n * heads * d * 4);
  float *gk = g_memdup2 (g, n * f * 4), *uk = g_memdup2 (u, n * f * 4);
  stow_llama_rmsnorm (L, n, h, x, w, norm, TRUE, rstd);
  stow_llama_swiglu (L, n, g, u, act);
  stow_llama_swiglu_backward (L, n, da, gk, uk);
  stow_llama_rope (L, n, seq, heads, rot_k, FALSE);

  float *norm_r = g_new (float, n *h), *act_r = g_new (float, n *f);
  float *dg_r = g_new (float, n *f), *du_r = g_new (float, n *f);
  widths_reference (n, h, f, heads, d, x, w, rstd, norm_r, g, u, da, act_r,
                    dg_r, du_r, rot, L->rope_cos, L->rope_sin, seq);
  g_assert_cmpmem (norm, n * h * 4, norm_r, n * h * 4);
  g_assert_cmpmem (act, n * f * 4, act_r, n * f * 4);
  g_assert_cmpmem (gk, n * f * 4, dg_r, n * f * 4);
  g_assert_cmpmem (uk, n * f * 4, du_r, n * f * 4);
  g_assert_cmpmem (rot_k, n * heads * d * 4, rot, n * heads * d * 4);
  /* h 75: a block of 64 columns and one of 11. */
  float *gw = g_new (float, h), *gw_r = g_new (float, h);
  stow_llama_colsum (L, n, h, act, FALSE, x, rstd, gw, FALSE);
  colsum_reference (n, h, act, x, rstd, gw_r);
  g_assert_cmpmem (gw, h * 4, gw_r, h * 4);
  g_free (gw), g_free (gw_r);
  g_rand_free (rng);
  g_free (x), g_free (w), g_free (g), g_free (u), g_free (da), g_free (rot);
  g_free (rstd), g_free (norm), g_free (act), g_free (rot_k), g_free (gk);
  g_free (uk), g_free (norm_r), g_free (act_r), g_free (dg_r), g_free (du_r);
}

/* The streamed rounding of products' rows (non-temporal stores on
 * AVX-512 or AVX2) gives core/dtype.h's bits: every bf16 code's neighbourhood
 * (ties, NaN payloads, infinities, subnormals) and random patterns, at
 * every alignment of the destination and lengths around the 16-wide body;
 * bytes past the end untouched. */
static void
check_bf16_stream (void (*round) (const float *, guint16 *, guint64))
{
  enum
  {
    N = 1 << 17
  };
  g_autofree float *src = g_new (float, N);
  g_autofree guint16 *got = g_new (guint16, N + 64);
  g_autoptr (GRand) r = g_rand_new_with_seed (8);
  for (guint32 i = 0; i < N; i++)
    {
      /* Half: a bf16 code with each low half that decides its rounding;
       * half random. */
      guint32 b = i < N / 2 ? (i << 16)
                                  | (i % 3 == 0   ? 0x8000u
                                     : i % 3 == 1 ? 0x7fffu
                                                  : (i * 2654435761u) & 0xffffu)
                            : g_rand_int (r);
      memcpy (&src[i], &b, 4);
    }
  round (src, got, N);
  _mm_sfence ();
  for (guint32 i = 0; i < N; i++)
    if (got[i] != stow_f32_to_bf16 (src[i]))
      {
        g_test_message ("element %u: %04x, the rule says %04x", i, got[i],
                        stow_f32_to_bf16 (src[i]));
        g_assert_cmpuint (got[i], ==, stow_f32_to_bf16 (src[i]));
      }
  for (guint off = 0; off < 16; off++)
    for (guint64 n = 0; n <= 70; n++)
      {
        memset (got, 0xab, (N + 64) * sizeof (guint16));
        round (src + 1000 + n, got + off, n);
        _mm_sfence ();
        for (guint64 i = 0; i < n; i++)
          g_assert_cmpuint (got[off + i], ==,
                            stow_f32_to_bf16 (src[1000 + n + i]));
        g_assert_cmpuint (got[off + n], ==, 0xabab);
        if (off > 0)
          g_assert_cmpuint (got[off - 1], ==, 0xabab);
      }
}

/* What this CPU runs, and the AVX2 body (CPUs without AVX-512) where it
 * can run here. */
static void
test_bf16_stream (void)
{
  check_bf16_stream (stow_llama_round_stream);
  if (__builtin_cpu_supports ("avx2"))
    check_bf16_stream (stow_llama_round_stream_avx2);
}

/* A row times @k, one element at a time. */
__attribute__ ((optimize ("fp-contract=off", "no-tree-vectorize"))) static void
scale_reference (float *s, guint64 n, float k)
{
  for (guint64 j = 0; j < n; j++)
    s[j] *= k;
}

/* A softmax row's maximum and exp, one element at a time. */
__attribute__ ((optimize ("fp-contract=off", "no-tree-vectorize"))) static float
softmax_reference (const float *s, guint64 n, float *e)
{
  float m = s[0];
  for (guint64 j = 0; j < n; j++)
    m = s[j] > m ? s[j] : m;
  for (guint64 j = 0; j < n; j++)
    e[j] = stow_llama_expf (s[j] - m);
  return m;
}

/* The softmax rows' parts built per width (attention's and the loss's):
 * the maximum, exp and scaling of the clone this CPU runs give the scalar
 * bits, on rows of every length up to 70 (each clone's remainder loop)
 * with values past exp's clamps. */
static void
test_softmax_widths (void)
{
  GRand *rng = g_rand_new_with_seed (41);
  float s[70], e[70], want[70];
  for (guint64 n = 1; n <= G_N_ELEMENTS (s); n++)
    {
      for (guint64 j = 0; j < n; j++)
        s[j] = (float)g_rand_double_range (rng, -150, 150)
               / (j % 4 ? 30.0f : 1.0f);
      float m = stow_llama_row_max (s, n);
      g_assert_cmpfloat (m, ==, softmax_reference (s, n, want));
      memcpy (e, s, n * sizeof (float));
      stow_llama_row_exp (e, n, m);
      g_assert_cmpmem (e, n * sizeof (float), want, n * sizeof (float));
      /* Scaled by 1 / 3, not exact in binary: each product rounds. */
      stow_llama_row_scale (e, n, 1.0f / 3.0f);
      scale_reference (want, n, 1.0f / 3.0f);
      g_assert_cmpmem (e, n * sizeof (float), want, n * sizeof (float));
    }
  g_rand_free (rng);
}

/* Attention's dS row, one element at a time: P = exp (s - lse) and P
 * (dp - D), in fp32 (over s and dp) or rounded to bf16. */
__attribute__ ((optimize ("fp-contract=off", "no-tree-vectorize"))) static void
ds_reference (float *p, float *dp, guint64 nk, guint64 width, float lse,
              float Di, guint16 *pl, guint16 *dsl)
{
  for (guint64 x = 0; x < width; x++)
    {
      float pv = x < nk ? stow_llama_expf (p[x] - lse) : 0.0f;
      float ds = x < nk ? pv * (dp[x] - Di) : 0.0f;
      if (pl == NULL)
        p[x] = pv, dp[x] = ds;
      else
        pl[x] = stow_f32_to_bf16 (pv), dsl[x] = stow_f32_to_bf16 (ds);
    }
}

/* stow_llama_row_ds (16 lanes where the CPU has AVX-512) and its 8-lane
 * clone give the scalar bits in fp32 and in bf16, on rows of
 * every length up to 70 (each body's remainder loop) with zeros past
 * them, scores past exp's clamps included. */
static void
test_ds_widths (void)
{
  GRand *rng = g_rand_new_with_seed (43);
  enum
  {
    W = 80
  };
  float s[W], dp[W], p1[W], dp1[W], p2[W], dp2[W];
  guint16 pl1[W], dsl1[W], pl2[W], dsl2[W];
  void (*const bodies[]) (float *, float *, guint64, guint64, float, float,
                          guint16 *, guint16 *)
      = { stow_llama_row_ds, stow_llama_row_ds_vec };
  for (guint bi = 0; bi < G_N_ELEMENTS (bodies); bi++)
    for (guint64 n = 1; n <= 70; n++)
      {
        guint64 width = n + (n % 11);
        for (guint64 j = 0; j < W; j++)
          {
            s[j] = (float)g_rand_double_range (rng, -150, 150)
                   / (j % 4 ? 30.0f : 1.0f);
            dp[j] = (float)g_rand_double_range (rng, -3, 3);
          }
        float lse = (float)g_rand_double_range (rng, -2, 2), Di = 0.25f;
        memcpy (p1, s, sizeof s), memcpy (dp1, dp, sizeof dp);
        memcpy (p2, s, sizeof s), memcpy (dp2, dp, sizeof dp);
        bodies[bi](p1, dp1, n, width, lse, Di, NULL, NULL);
        ds_reference (p2, dp2, n, width, lse, Di, NULL, NULL);
        g_assert_cmpmem (p1, width * 4, p2, width * 4);
        g_assert_cmpmem (dp1, width * 4, dp2, width * 4);
        bodies[bi](s, dp, n, width, lse, Di, pl1, dsl1);
        ds_reference (s, dp, n, width, lse, Di, pl2, dsl2);
        g_assert_cmpmem (pl1, width * 2, pl2, width * 2);
        g_assert_cmpmem (dsl1, width * 2, dsl2, width * 2);
      }
  g_rand_free (rng);
}

static void
test_expf (void)
{
  double worst = 0;
  int steps = g_getenv ("STOW_VALGRIND") ? 10000 : 1000000;
  for (int i = 0; i <= steps; i++)
    {
      float x = -87.0f + 175.0f * (float)i / (float)steps;
      double ref = exp ((double)x);
      worst = MAX (worst, fabs (stow_llama_expf (x) - ref) / ref);
    }
  g_test_message ("stow_llama_expf: worst relative error %.3g", worst);
  /* About one ulp of fp32 (2^-23 = 1.2e-7). */
  g_assert_cmpfloat (worst, <, 2.5e-7);
  g_assert_cmpfloat (stow_llama_expf (0), ==, 1.0f);
  g_assert_cmpfloat (stow_llama_expf (-1e30f), <, 1e-37);
  g_assert_true (isfinite (stow_llama_expf (1e30f)));
  g_assert_cmpfloat (stow_llama_expf (1e30f), >, 1e38);
}

/* ---- gradients against finite differences -----------------------------------
 */

/* For each parameter tensor P and a direction u: the directional
 * derivative <dL/dP, u> against (L(P + eps u) - L(P - eps u)) / 2 eps.
 * u = g / rms (g) + r with r random ±1: the gradient's own direction keeps
 * <g, u> well above the fp32 noise of the loss (1e-7 of a loss near 3,
 * over 2 eps = 2e-2), the random part tests the other directions too. */
static void
gradcheck (StowLlamaConfig c, guint64 B, guint64 T, guint32 seed)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (TestLlamaModel) m
      = test_llama_model_new (&c, STOW_DTYPE_F32, B, T, 2, 0, &error);
  g_assert_no_error (error);
  test_llama_model_randomize (m, seed);
  test_llama_model_step (m, FALSE);
  /* Keep the gradients: the loss evaluations below overwrite the head's. */
  GPtrArray *grads = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      g_ptr_array_add (grads, g_memdup2 (p->g, 4 * p->rows * p->cols));
    }
  g_autoptr (GRand) r = g_rand_new_with_seed (seed + 1);
  const double eps = 2e-3;
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      guint64 k = p->rows * p->cols;
      const float *g = grads->pdata[i];
      g_autofree float *w0 = g_memdup2 (p->w, 4 * k);
      g_autofree float *u = g_new (float, k);
      double an = 0, rms = 0;
      for (guint64 j = 0; j < k; j++)
        rms += (double)g[j] * g[j];
      rms = sqrt (rms / (double)k);
      for (guint64 j = 0; j < k; j++)
        {
          u[j] = (float)(g[j] / rms) + (g_rand_boolean (r) ? 1.0f : -1.0f);
          an += (double)g[j] * u[j];
        }
      /* Central differences at eps and eps / 2, Richardson-combined:
       * the eps^2 term cancels, which the tied model's curvature needs. */
      double d[2], lmax = 0;
      for (int e = 0; e < 2; e++)
        {
          double h = e ? eps / 2 : eps, lp, lm;
          for (guint64 j = 0; j < k; j++)
            ((float *)p->w)[j] = (float)(w0[j] + h * u[j]);
          lp = test_llama_model_loss (m);
          for (guint64 j = 0; j < k; j++)
            ((float *)p->w)[j] = (float)(w0[j] - h * u[j]);
          lm = test_llama_model_loss (m);
          lmax = MAX (lmax, MAX (fabs (lp), fabs (lm)));
          /* The step actually taken, after rounding to fp32. */
          double taken = 0, uu = 0;
          for (guint64 j = 0; j < k; j++)
            {
              taken += ((double)(float)(w0[j] + h * u[j])
                        - (double)(float)(w0[j] - h * u[j]))
                       * u[j];
              uu += (double)u[j] * u[j];
            }
          d[e] = (lp - lm) / (taken / uu);
        }
      memcpy (p->w, w0, 4 * k);
      double fd = (4 * d[1] - d[0]) / 3;
      /* The finite difference cannot be closer than the fp32 loss's own
       * rounding allows: each loss is off by about half an ulp of |L|,
       * which the combination above turns into 3 |L| FLT_EPSILON / (2 eps)
       * of the derivative.  For a small gradient (a bias) that floor is the
       * error's: the sanitizer build, which vectorises less and so
       * rounds the loss otherwise, showed 1.3e-4 against 0.041 (a
       * relative 3.2e-3) for one layer's bk on an Intel Xeon VM. */
      double noise = 3 * lmax * FLT_EPSILON / (2 * eps);
      double err = fabs (fd - an) / MAX (fabs (an), 1e-3);
      g_test_message ("%-10s (%3" G_GUINT64_FORMAT " x %2" G_GUINT64_FORMAT
                      ") analytic %+.6e  finite diff %+.6e  rel %.1e"
                      "  (rounding floor %.1e)",
                      p->name, p->rows, p->cols, an, fd, err,
                      noise / MAX (fabs (an), 1e-3));
      g_assert_cmpfloat (err, <, 2e-3 + noise / MAX (fabs (an), 1e-3));
    }
  g_ptr_array_unref (grads);
}

static void
test_gradcheck_all (void)
{
  gradcheck (tiny_all (), 2, 5, 11);
}

static void
test_gradcheck_tied (void)
{
  gradcheck (tiny_tied (), 1, 7, 12);
}

static void
test_gradcheck_qwen3 (void)
{
  gradcheck (tiny_qwen3 (), 2, 5, 13);
}

/* ---- one layer's contracts
 * ----------------------------------------------------- */

/* A runtime and one layer's weights, input and saved tensors. */
typedef struct
{
  TestLlamaModel *m;
  guint64 rest_bytes, out_bytes, n;
  guint8 *x;
} Layer;

static void
layer_init (Layer *y, StowLlamaConfig c, StowDtype dt, guint64 B, guint64 T,
            guint n_threads, guint32 seed)
{
  c.n_layers = 1;
  y->m = test_llama_model_new (&c, dt, B, T, n_threads, 0, NULL);
  g_assert_nonnull (y->m);
  test_llama_model_randomize (y->m, seed);
  y->n = B * T;
  y->out_bytes = stow_llama_out_bytes (y->m->rt, y->n);
  y->rest_bytes = stow_llama_saved_bytes (y->m->rt, y->n) - y->out_bytes;
  /* The layer's input: the embedding of the random tokens. */
  y->x = g_malloc (y->out_bytes);
  TestLlamaParam *e = &g_array_index (y->m->params, TestLlamaParam, 0);
  stow_decoder_embed_forward (stow_llama_decoder (y->m->rt), e->w, y->m->tokens,
                              y->n, y->x);
}

static void
layer_clear (Layer *y)
{
  test_llama_model_free (y->m);
  g_free (y->x);
}

static void
layer_forward (Layer *y, guint8 *rest, guint8 *out)
{
  StowLlamaSaved s;
  StowLlamaLayerWeights w;
  stow_llama_saved_carve (y->m->rt, y->n, rest, out, &s);
  test_llama_model_layer (y->m, 0, FALSE, &w);
  stow_decoder_layer_forward (stow_llama_decoder (y->m->rt), y->m->batch,
                              y->m->seq, &w, y->x, &s);
}

/* A seeded dL/d(out) in @out. */
static void
fill_dout (Layer *y, guint8 *out, guint32 seed)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  guint64 k = y->n * y->m->cfg.hidden;
  for (guint64 i = 0; i < k; i++)
    {
      float v = (float)g_rand_double_range (r, -1, 1);
      if (y->m->dtype == STOW_DTYPE_BF16)
        ((guint16 *)out)[i] = stow_f32_to_bf16 (v);
      else
        ((float *)out)[i] = v;
    }
}

/* Forward twice (the second a recomputation with out NULL): every saved
 * tensor the same bits, out untouched. */
static void
test_recompute (void)
{
  for (int qk = 0; qk < 2; qk++)
    for (int bf = 0; bf < 2; bf++)
      {
        Layer y;
        layer_init (&y, qk ? tiny_qwen3 () : tiny_all (),
                    bf ? STOW_DTYPE_BF16 : STOW_DTYPE_F32, 2, 9, 2, 21);
        g_autofree guint8 *r1 = g_malloc (y.rest_bytes);
        g_autofree guint8 *r2 = g_malloc (y.rest_bytes);
        g_autofree guint8 *o1 = g_malloc (y.out_bytes);
        g_autofree guint8 *o2 = g_malloc (y.out_bytes);
        memset (r2, 0xa5, y.rest_bytes);
        layer_forward (&y, r1, o1);
        StowLlamaSaved s;
        StowLlamaLayerWeights w;
        stow_llama_saved_carve (y.m->rt, y.n, r2, NULL, &s);
        test_llama_model_layer (y.m, 0, FALSE, &w);
        stow_decoder_layer_forward (stow_llama_decoder (y.m->rt), 2, 9, &w, y.x,
                                    &s);
        g_assert_cmpint (memcmp (r1, r2, y.rest_bytes), ==, 0);
        /* And a full forward again: the output too. */
        layer_forward (&y, r2, o2);
        g_assert_cmpint (memcmp (r1, r2, y.rest_bytes), ==, 0);
        g_assert_cmpint (memcmp (o1, o2, y.out_bytes), ==, 0);
        layer_clear (&y);
      }
}

/* Gradients of a layer's backward into fresh (zero or @init) buffers;
 * returns them concatenated in fp32, with dx last. */
static float *
layer_backward (Layer *y, gboolean alias, gboolean accumulate,
                const float *init, guint64 *n_out)
{
  g_autofree guint8 *rest = g_malloc (y->rest_bytes);
  g_autofree guint8 *out = g_malloc (y->out_bytes);
  g_autofree guint8 *x = g_memdup2 (y->x, y->out_bytes);
  g_autofree guint8 *dx = g_malloc (y->out_bytes);
  layer_forward (y, rest, out);
  fill_dout (y, out, 5);
  TestLlamaModel *m = y->m;
  guint64 k = 0;
  for (guint i = 1; i < 1 + m->per_layer; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      for (guint64 j = 0; j < p->rows * p->cols; j++, k++)
        {
          float v = init ? init[k] : 0.0f;
          if (m->dtype == STOW_DTYPE_BF16)
            ((guint16 *)p->g)[j] = stow_f32_to_bf16 (v);
          else
            ((float *)p->g)[j] = v;
        }
    }
  StowLlamaSaved s;
  StowLlamaLayerWeights w, g;
  stow_llama_saved_carve (m->rt, y->n, rest, out, &s);
  test_llama_model_layer (m, 0, FALSE, &w);
  test_llama_model_layer (m, 0, TRUE, &g);
  g_autofree guint8 *ws = g_malloc (stow_llama_backward_ws_bytes (m->rt, y->n));
  stow_decoder_layer_backward (stow_llama_decoder (m->rt), m->batch, m->seq, &w,
                               x, &s, &g, accumulate, ws, alias ? x : dx);
  guint64 nh = y->n * m->cfg.hidden;
  float *all = g_new (float, k + nh);
  k = 0;
  for (guint i = 1; i < 1 + m->per_layer; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      for (guint64 j = 0; j < p->rows * p->cols; j++)
        all[k++] = test_llama_param_get (m, p, TRUE, j);
    }
  for (guint64 j = 0; j < nh; j++)
    all[k++] = m->dtype == STOW_DTYPE_BF16
                   ? stow_bf16_to_f32 (((guint16 *)(alias ? x : dx))[j])
                   : ((float *)(alias ? x : dx))[j];
  *n_out = k;
  return all;
}

/* dx written over x gives the same bits as a separate dx. */
static void
test_alias (void)
{
  for (int bf = 0; bf < 2; bf++)
    {
      Layer y;
      layer_init (&y, tiny_all (), bf ? STOW_DTYPE_BF16 : STOW_DTYPE_F32, 2, 7,
                  2, 22);
      guint64 n1, n2;
      g_autofree float *a = layer_backward (&y, FALSE, FALSE, NULL, &n1);
      g_autofree float *b = layer_backward (&y, TRUE, FALSE, NULL, &n2);
      g_assert_cmpuint (n1, ==, n2);
      g_assert_cmpint (memcmp (a, b, 4 * n1), ==, 0);
      layer_clear (&y);
    }
}

/* Accumulating onto G0 gives G0 + the overwritten gradients (to fp32
 * rounding: a GEMM adds into C, the column sums add in double). */
static void
test_accumulate (void)
{
  Layer y;
  layer_init (&y, tiny_all (), STOW_DTYPE_F32, 2, 7, 2, 23);
  guint64 n1, n2;
  g_autofree float *g1 = layer_backward (&y, FALSE, FALSE, NULL, &n1);
  guint64 nh = y.n * y.m->cfg.hidden, k = n1 - nh;
  g_autofree float *g0 = g_new (float, k);
  g_autoptr (GRand) r = g_rand_new_with_seed (3);
  for (guint64 i = 0; i < k; i++)
    g0[i] = (float)g_rand_double_range (r, -1, 1);
  g_autofree float *g2 = layer_backward (&y, FALSE, TRUE, g0, &n2);
  g_autofree float *want = g_new (float, k);
  for (guint64 i = 0; i < k; i++)
    want[i] = g0[i] + g1[i];
  g_assert_cmpfloat (rel_err (g2, want, k), <, 1e-6);
  /* dx does not accumulate. */
  g_assert_cmpint (memcmp (g1 + k, g2 + k, 4 * nh), ==, 0);
  layer_clear (&y);
}

/* The embedding's backward adds rows in token order (bit for bit in fp32);
 * overwrite zeroes the rows no token touches, accumulate keeps them. */
static void
test_embed (void)
{
  StowLlamaConfig c = tiny_tied ();
  g_autoptr (StowLlama) L = stow_llama_new (&c, STOW_DTYPE_F32, 8, 2, NULL);
  guint64 h = c.hidden, V = c.vocab, n = 9;
  gint32 tok[9] = { 3, 0, 3, 22, 7, 3, 0, 11, 3 };
  g_autofree float *emb = g_new (float, V *h);
  g_autofree float *x = g_new (float, n *h);
  g_autofree float *de = g_new (float, V *h);
  g_autofree float *want = g_new (float, V *h);
  for (guint64 i = 0; i < V * h; i++)
    emb[i] = (float)i * 0.25f - 3.0f;
  stow_decoder_embed_forward (stow_llama_decoder (L), emb, tok, n, x);
  for (guint64 r = 0; r < n; r++)
    g_assert_cmpint (memcmp (x + r * h, emb + tok[r] * h, 4 * h), ==, 0);
  for (guint64 i = 0; i < n * h; i++)
    x[i] = (float)sin ((double)i);
  for (int acc = 0; acc < 2; acc++)
    {
      for (guint64 i = 0; i < V * h; i++)
        want[i] = de[i] = acc ? 0.5f + (float)i : 123.0f;
      if (!acc)
        memset (want, 0, 4 * V * h);
      for (guint64 r = 0; r < n; r++)
        for (guint64 j = 0; j < h; j++)
          want[tok[r] * h + j] += x[r * h + j];
      stow_decoder_embed_backward (stow_llama_decoder (L), tok, n, x, de, acc);
      g_assert_cmpint (memcmp (de, want, 4 * V * h), ==, 0);
    }
}

/* The fused loss: the same loss and gradients for any chunk (to fp32
 * rounding), dx over x the same bits as apart, accumulate adds. */
static void
test_head_loss (void)
{
  StowLlamaConfig c = tiny_all ();
  c.n_layers = 0;
  g_autoptr (TestLlamaModel) m
      = test_llama_model_new (&c, STOW_DTYPE_F32, 2, 7, 2, 0, NULL);
  test_llama_model_randomize (m, 31);
  guint64 n = m->n, h = c.hidden, V = c.vocab;
  TestLlamaParam *norm = &g_array_index (m->params, TestLlamaParam, 1);
  TestLlamaParam *head = &g_array_index (m->params, TestLlamaParam, 2);
  TestLlamaParam *emb = &g_array_index (m->params, TestLlamaParam, 0);
  g_autofree float *x = g_new (float, n *h);
  stow_decoder_embed_forward (stow_llama_decoder (m->rt), emb->w, m->tokens, n,
                              x);
  double loss1 = 0;
  g_autofree float *dn1 = g_new (float, h);
  g_autofree float *dh1 = g_new (float, V *h);
  g_autofree float *dx1 = g_new (float, n *h);
  guint64 chunks[] = { n, 1, 3, 5 };
  for (guint i = 0; i < G_N_ELEMENTS (chunks); i++)
    {
      g_autofree float *scratch
          = g_new (float, stow_llama_loss_scratch_floats (V, h, chunks[i]));
      g_autofree float *dn = g_new (float, h);
      g_autofree float *dh = g_new (float, V *h);
      g_autofree float *dx = g_new (float, n *h);
      double loss
          = test_llama_head_loss (m->rt, n, norm->w, head->w, x, m->targets,
                                  0.5, dn, dh, FALSE, dx, scratch, chunks[i]);
      if (i == 0)
        {
          loss1 = loss;
          memcpy (dn1, dn, 4 * h);
          memcpy (dh1, dh, 4 * V * h);
          memcpy (dx1, dx, 4 * n * h);
          /* The logits of stow_llama_head_logits give the same loss. */
          g_autofree float *lg = g_new (float, n *V);
          test_llama_head_logits (m->rt, n, norm->w, head->w, x, lg);
          double ref = 0;
          for (guint64 r = 0; r < n; r++)
            {
              double mx = lg[r * V], s = 0;
              for (guint64 j = 0; j < V; j++)
                mx = MAX (mx, lg[r * V + j]);
              for (guint64 j = 0; j < V; j++)
                s += exp (lg[r * V + j] - mx);
              ref += mx + log (s) - lg[r * V + m->targets[r]];
            }
          g_assert_cmpfloat (fabs (loss - ref), <, 1e-6 * ref);
          continue;
        }
      g_assert_cmpfloat (fabs (loss - loss1), <, 1e-6 * loss1);
      g_assert_cmpfloat (rel_err (dn, dn1, h), <, 1e-6);
      g_assert_cmpfloat (rel_err (dh, dh1, V * h), <, 1e-6);
      g_assert_cmpfloat (rel_err (dx, dx1, n * h), <, 1e-6);
    }
  /* dx over x; accumulate onto the first gradients doubles them. */
  g_autofree float *scratch
      = g_new (float, stow_llama_loss_scratch_floats (V, h, 4));
  g_autofree float *dn = g_memdup2 (dn1, 4 * h);
  g_autofree float *dh = g_memdup2 (dh1, 4 * V * h);
  double loss = test_llama_head_loss (m->rt, n, norm->w, head->w, x, m->targets,
                                      0.5, dn, dh, TRUE, x, scratch, 4);
  g_assert_cmpfloat (fabs (loss - loss1), <, 1e-6 * loss1);
  g_assert_cmpfloat (rel_err (x, dx1, n * h), <, 1e-6);
  for (guint64 j = 0; j < h; j++)
    dn1[j] *= 2;
  for (guint64 j = 0; j < V * h; j++)
    dh1[j] *= 2;
  g_assert_cmpfloat (rel_err (dn, dn1, h), <, 1e-6);
  g_assert_cmpfloat (rel_err (dh, dh1, V * h), <, 1e-6);
  /* No tokens: a zero loss, and "=" still zeroes the gradients. */
  g_assert_cmpfloat (test_llama_head_loss (m->rt, 0, norm->w, head->w, x,
                                           m->targets, 0.5, dn, dh, FALSE, x,
                                           scratch, 4),
                     ==, 0.0);
  for (guint64 j = 0; j < h; j++)
    g_assert_cmpfloat (dn[j], ==, 0.0f);
  for (guint64 j = 0; j < V * h; j++)
    g_assert_cmpfloat (dh[j], ==, 0.0f);
}

/* The workspace bound holds for shapes whose parts are lopsided: a
 * guard past stow_llama_backward_ws_bytes stays untouched. */
static void
test_ws_bound (void)
{
  StowLlamaConfig cs[]
      = { shape (8, 8, 8, 16, 8, 5), shape (8, 2, 1, 2, 200, 5),
          shape (96, 2, 1, 2, 2, 5), qk_norm (shape (8, 8, 8, 2, 8, 5)),
          qk_norm (shape (96, 2, 1, 2, 2, 5)) };
  for (guint i = 0; i < G_N_ELEMENTS (cs); i++)
    for (int bf = 0; bf < 2; bf++)
      {
        Layer y;
        layer_init (&y, cs[i], bf ? STOW_DTYPE_BF16 : STOW_DTYPE_F32, 1, 3, 1,
                    40 + i);
        guint64 wsb = stow_llama_backward_ws_bytes (y.m->rt, y.n);
        g_autofree guint8 *rest = g_malloc (y.rest_bytes);
        g_autofree guint8 *out = g_malloc (y.out_bytes);
        g_autofree guint8 *ws = g_malloc (wsb + 256);
        memset (ws + wsb, 0x5a, 256);
        layer_forward (&y, rest, out);
        StowLlamaSaved s;
        StowLlamaLayerWeights w, g;
        stow_llama_saved_carve (y.m->rt, y.n, rest, out, &s);
        test_llama_model_layer (y.m, 0, FALSE, &w);
        test_llama_model_layer (y.m, 0, TRUE, &g);
        stow_decoder_layer_backward (stow_llama_decoder (y.m->rt), 1, 3, &w,
                                     y.x, &s, &g, FALSE, ws, y.x);
        for (guint j = 0; j < 256; j++)
          g_assert_cmpuint (ws[wsb + j], ==, 0x5a);
        layer_clear (&y);
      }
}

/* ---- threads, bf16
 * ------------------------------------------------------------- */

static float *
model_outputs (TestLlamaModel *m, guint64 *n_out)
{
  double loss = test_llama_model_step (m, TRUE);
  GArray *a = g_array_new (FALSE, FALSE, sizeof (float));
  float l = (float)loss;
  g_array_append_val (a, l);
  g_array_append_vals (a, m->logits, (guint)(m->n * m->cfg.vocab));
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      for (guint64 j = 0; j < p->rows * p->cols; j++)
        {
          float v = test_llama_param_get (m, p, TRUE, j);
          g_array_append_val (a, v);
        }
    }
  *n_out = a->len;
  return (float *)g_array_free (a, FALSE);
}

/* 1 and 2 threads give the same bits, GEMMs included (their tiles are
 * fixed by the shapes): row kernels, column sums, attention tiles, the
 * embedding's scatter.  T 150 spans two attention tiles; B 3 splits the
 * (sequence, head) items unevenly; h 256 and f 512 make products of many
 * GEMM tiles. */
static void
test_threads (void)
{
  StowLlamaConfig cs[2] = { tiny_all (), shape (256, 4, 2, 64, 512, 300) };
  cs[1].qkv_bias = TRUE;
  cs[1].qk_norm = TRUE; /* q/k norm rows: tokens times heads */
  guint64 seqs[2] = { 150, 200 };
  /* The many-tile model takes minutes under valgrind: the tiny one there. */
  guint n_cases = g_getenv ("STOW_VALGRIND") ? 1 : 2;
  /* fp32, and bf16, whose products run in bf16 where the kernel has it
   * (AMX, AVX512-BF16): tiles fixed by the shape either way. */
  StowDtype dtypes[2] = { STOW_DTYPE_F32, STOW_DTYPE_BF16 };
  for (guint di = 0; di < 2; di++)
    for (guint i = 0; i < n_cases; i++)
      {
        guint64 n1, n2;
        g_autoptr (TestLlamaModel) a
            = test_llama_model_new (&cs[i], dtypes[di], 3, seqs[i], 1, 7, NULL);
        g_autoptr (TestLlamaModel) b
            = test_llama_model_new (&cs[i], dtypes[di], 3, seqs[i], 2, 7, NULL);
        test_llama_model_randomize (a, 51);
        test_llama_model_copy_params (b, a);
        g_autofree float *oa = model_outputs (a, &n1);
        g_autofree float *ob = model_outputs (b, &n2);
        g_assert_cmpuint (n1, ==, n2);
        g_assert_cmpint (memcmp (oa, ob, 4 * n1), ==, 0);
        /* Same runtime, again: the same bits every call. */
        g_autofree float *ob2 = model_outputs (b, &n2);
        g_assert_cmpint (memcmp (ob, ob2, 4 * n1), ==, 0);
      }
}

/* bf16 storage against fp32 on the same (bf16-exact) weights: within
 * bf16's precision (2^-8 relative per rounding, a few roundings deep). */
static void
test_bf16 (void)
{
  StowLlamaConfig c = tiny_all ();
  guint64 n1, n2;
  g_autoptr (TestLlamaModel) b
      = test_llama_model_new (&c, STOW_DTYPE_BF16, 2, 9, 2, 0, NULL);
  g_autoptr (TestLlamaModel) f
      = test_llama_model_new (&c, STOW_DTYPE_F32, 2, 9, 2, 0, NULL);
  test_llama_model_randomize (b, 61);
  test_llama_model_copy_params (f, b);
  g_autofree float *ob = model_outputs (b, &n1);
  g_autofree float *of = model_outputs (f, &n2);
  g_assert_cmpuint (n1, ==, n2);
  g_test_message ("loss fp32 %.6f bf16 %.6f", of[0], ob[0]);
  g_assert_cmpfloat (fabs (ob[0] - of[0]), <, 1e-2 * of[0]);
  guint64 k = 1, nl = b->n * c.vocab;
  g_assert_cmpfloat (rel_err (ob + k, of + k, nl), <, 2e-2);
  k += nl;
  for (guint i = 0; i < b->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (b->params, TestLlamaParam, i);
      guint64 m = p->rows * p->cols;
      double e = rel_err (ob + k, of + k, m);
      g_test_message ("%-10s bf16 vs fp32 %.2e", p->name, e);
      g_assert_cmpfloat (e, <, 5e-2);
      k += m;
    }
}

/* STOWAGE_KERNEL_TIMES (executor/kernel-times.h): the runtime's every
 * kernel call timed and written out when it is freed, with the same bits
 * as untimed; the GEMMs' FLOPs in the file those of the decoder worked by
 * hand: forward 2 n (h (a d + 2 k d) + a d h + 3 h f) per layer and
 * 2 n V h for the head, the backward twice the forward.  At bf16, no
 * product has an fp32 operand. */
static void
test_kernel_times (void)
{
  StowLlamaConfig c = tiny_all ();
  g_autofree char *dir = g_dir_make_tmp ("stow-kt-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "kt.jsonl", NULL);
  g_autoptr (TestLlamaModel) plain
      = test_llama_model_new (&c, STOW_DTYPE_F32, 2, 9, 2, 0, NULL);
  g_setenv ("STOWAGE_KERNEL_TIMES", path, TRUE);
  TestLlamaModel *timed
      = test_llama_model_new (&c, STOW_DTYPE_F32, 2, 9, 2, 0, NULL);
  g_unsetenv ("STOWAGE_KERNEL_TIMES");
  g_assert_cmpstr (stow_llama_decoder (timed->rt)->k->name, ==, "timed");
  g_assert_cmpstr (stow_llama_decoder (plain->rt)->k->name, ==, "cpu");
  test_llama_model_randomize (plain, 71);
  test_llama_model_copy_params (timed, plain);
  double lp = test_llama_model_step (plain, FALSE);
  double lt = test_llama_model_step (timed, FALSE);
  g_assert_cmpmem (&lp, sizeof lp, &lt, sizeof lt);
  for (guint i = 0; i < plain->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (plain->params, TestLlamaParam, i);
      TestLlamaParam *q = &g_array_index (timed->params, TestLlamaParam, i);
      g_assert_cmpmem (p->g, p->rows * p->cols * 4, q->g,
                       q->rows * q->cols * 4);
    }
  test_llama_model_free (timed);

  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  g_assert_nonnull (strstr (lines[0], "\"kernel_times\": 1"));
  g_assert_nonnull (strstr (lines[0], "\"dtype\": \"fp32\""));
  double flops = 0;
  guint64 gemms = 0, attention = 0, embed = 0, timed_ns = 0;
  for (guint i = 1; lines[i] != NULL && lines[i][0] != '\0'; i++)
    {
      const char *ns = strstr (lines[i], "\"ns\": ");
      g_assert_nonnull (ns);
      timed_ns += g_ascii_strtoull (ns + 6, NULL, 10);
      g_assert_nonnull (strstr (lines[i], "\"cpu_ns\": "));
      if (strstr (lines[i], "\"entry\": \"attention_forward\""))
        attention++;
      if (strstr (lines[i], "\"entry\": \"embed_forward\""))
        embed++;
      if (!strstr (lines[i], "\"entry\": \"gemm\""))
        continue;
      guint64 m = 0, n = 0, k = 0;
      const char *at = strstr (lines[i], "\"m\": ");
      g_assert_nonnull (at);
      g_assert_cmpint (sscanf (at,
                               "\"m\": %" G_GUINT64_FORMAT
                               ", \"n\": %" G_GUINT64_FORMAT
                               ", \"k\": %" G_GUINT64_FORMAT,
                               &m, &n, &k),
                       ==, 3);
      flops += 2.0 * (double)m * (double)n * (double)k;
      gemms++;
    }
  guint64 n = 2 * 9, h = c.hidden, f = c.ffn, V = c.vocab;
  guint64 ad = c.n_heads * c.head_dim, kd = c.n_kv_heads * c.head_dim;
  double layer = 2.0 * n * (h * (ad + 2 * kd) + ad * h + 3 * h * f);
  double head = 2.0 * n * V * h;
  g_assert_cmpfloat (flops, ==, 3 * (c.n_layers * layer + head));
  /* Seven products a layer forward, fourteen backward; three for the
   * head's one chunk. */
  g_assert_cmpuint (gemms, ==, 21 * c.n_layers + 3);
  g_assert_cmpuint (attention, ==, c.n_layers);
  g_assert_cmpuint (embed, ==, 1);
  g_assert_cmpuint (timed_ns, >, 0);
  g_remove (path);

  /* At bf16 every product, the fused loss's too (loss_lowp), has bf16
   * operands: none is staged to fp32 beside the bf16 head. */
  g_setenv ("STOWAGE_KERNEL_TIMES", path, TRUE);
  TestLlamaModel *b
      = test_llama_model_new (&c, STOW_DTYPE_BF16, 2, 9, 2, 0, NULL);
  g_unsetenv ("STOWAGE_KERNEL_TIMES");
  test_llama_model_randomize (b, 72);
  test_llama_model_step (b, FALSE);
  test_llama_model_free (b);
  g_autofree char *text16 = NULL;
  g_assert_true (g_file_get_contents (path, &text16, NULL, NULL));
  g_auto (GStrv) lines16 = g_strsplit (text16, "\n", -1);
  guint64 gemms16 = 0;
  for (guint i = 1; lines16[i] != NULL && lines16[i][0] != '\0'; i++)
    if (strstr (lines16[i], "\"entry\": \"gemm\""))
      {
        gemms16++;
        g_assert_nonnull (strstr (lines16[i], "\"a_bf16\": true"));
        g_assert_nonnull (strstr (lines16[i], "\"b_bf16\": true"));
      }
  g_assert_cmpuint (gemms16, ==, 21 * c.n_layers + 3);
  g_remove (path);
  g_rmdir (dir);
}

/* ---- the PyTorch oracle
 * ------------------------------------------------------ */

/* A python that imports torch: $STOW_PYTHON, Debian's /usr/bin/python3
 * (python3-torch), or python3 on PATH; NULL when none does. */
static const char *
torch_python (void)
{
  static gsize once = 0;
  static char *found = NULL;
  if (g_once_init_enter (&once))
    {
      const char *cands[]
          = { g_getenv ("STOW_PYTHON"), "/usr/bin/python3", "python3" };
      for (guint i = 0; i < G_N_ELEMENTS (cands) && found == NULL; i++)
        {
          if (cands[i] == NULL || *cands[i] == '\0')
            continue;
          g_autofree char *path = g_find_program_in_path (cands[i]);
          if (path == NULL)
            continue;
          const char *argv[] = { path, "-c", "import torch", NULL };
          gint status = -1;
          if (g_spawn_sync (NULL, (char **)argv, NULL,
                            G_SPAWN_STDOUT_TO_DEV_NULL
                                | G_SPAWN_STDERR_TO_DEV_NULL,
                            NULL, NULL, NULL, NULL, &status, NULL)
              && g_spawn_check_wait_status (status, NULL))
            found = g_steal_pointer (&path);
        }
      g_once_init_leave (&once, 1);
    }
  return found;
}

static void
test_oracle (gconstpointer data)
{
  const char *name = data;
  const char *py = torch_python ();
  if (py == NULL)
    {
      g_test_skip ("python3 with torch not found");
      return;
    }
  g_autofree char *script
      = g_test_build_filename (G_TEST_DIST, "oracle", "llama_oracle.py", NULL);
  g_autofree char *runner
      = g_test_build_filename (G_TEST_BUILT, "llama-oracle-run", NULL);
  const char *argv[] = { py, script, "--runner", runner, "--case", name, NULL };
  g_autofree char *out = NULL, *err = NULL;
  gint status = -1;
  g_autoptr (GError) error = NULL;
  g_assert_true (g_spawn_sync (NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL,
                               NULL, &out, &err, &status, &error));
  g_assert_no_error (error);
  g_auto (GStrv) lines = g_strsplit (out, "\n", -1);
  for (char **l = lines; *l; l++)
    if (**l)
      g_test_message ("%s", *l + (**l == '#' ? 2 : 0));
  if (WIFEXITED (status) && WEXITSTATUS (status) == 77)
    {
      g_test_skip ("python3 with torch not found");
      return;
    }
  if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
    g_error ("oracle case %s failed (status %d):\n%s%s", name, status, out,
             err);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/llama/sizes/saved-bytes", test_saved_bytes);
  g_test_add_func ("/llama/sizes/carve", test_carve);
  g_test_add_func ("/llama/sizes/workspace", test_workspace_bytes);
  g_test_add_func ("/llama/sizes/loss-chunk", test_chunk);
  g_test_add_func ("/llama/errors", test_errors);
  g_test_add_func ("/llama/bf16-conversions", test_bf16_conversions);
  g_test_add_func ("/llama/bf16-stream", test_bf16_stream);
  g_test_add_func ("/llama/expf", test_expf);
  g_test_add_func ("/llama/vector-widths", test_vector_widths);
  g_test_add_func ("/llama/softmax-widths", test_softmax_widths);
  g_test_add_func ("/llama/ds-widths", test_ds_widths);
  g_test_add_func ("/llama/gradcheck/all-features", test_gradcheck_all);
  g_test_add_func ("/llama/gradcheck/tied", test_gradcheck_tied);
  g_test_add_func ("/llama/gradcheck/qwen3", test_gradcheck_qwen3);
  g_test_add_func ("/llama/recompute", test_recompute);
  g_test_add_func ("/llama/alias", test_alias);
  g_test_add_func ("/llama/accumulate", test_accumulate);
  g_test_add_func ("/llama/embed", test_embed);
  g_test_add_func ("/llama/head-loss", test_head_loss);
  g_test_add_func ("/llama/ws-bound", test_ws_bound);
  g_test_add_func ("/llama/threads", test_threads);
  g_test_add_func ("/llama/bf16", test_bf16);
  g_test_add_func ("/llama/kernel-times", test_kernel_times);
  /* The cases of tests/oracle/llama_oracle.py (--list). */
  static const char *cases[] = { "gqa-untied",
                                 "mha-tied-theta500k",
                                 "llama3-rope-scaling",
                                 "qwen2-qkv-bias",
                                 "qwen3-qk-norm",
                                 "qwen3-bf16",
                                 "llama-all-biases-tied",
                                 "long-seq-chunked-loss",
                                 "one-thread",
                                 "bf16" };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/llama/oracle/%s", cases[i]);
      g_test_add_data_func (path, cases[i], test_oracle);
    }
  return g_test_run ();
}
