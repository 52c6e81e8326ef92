/* SPDX-License-Identifier: MIT
 *
 * tests/test-adam.c: CPU Adam against a double-precision reference written
 * here from the algorithm (Kingma & Ba 2015, Alg. 1; Loshchilov & Hutter
 * 2019 for the decoupled decay; PyTorch's AdamW docs for the eps placement),
 * on every ISA path this CPU runs; bit-identity across ISAs, thread counts
 * and a resume; skipped steps on NaN/Inf; bf16/fp16 rounding against an
 * independent nearest-value search.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "offload/adam.h"

/* ---- an independent reference for the conversions ------------------------ */

/* Value of a bf16 or fp16 magnitude code, decoded from first principles;
 * the code just past the largest finite one stands for the next power of
 * two, which is what overflowing rounds towards. */
static double
bf16_value (guint32 code)
{
  guint32 e = code >> 7, m = code & 0x7f;
  if (e == 0)
    return ldexp ((double)m, -133);
  return ldexp (1.0 + m / 128.0, (int)e - 127);
}

static double
f16_value (guint32 code)
{
  guint32 e = code >> 10, m = code & 0x3ff;
  if (e == 0)
    return ldexp ((double)m, -24);
  return ldexp (1.0 + m / 1024.0, (int)e - 15);
}

/* Nearest code to |x| among 0..top (top = the infinity code), ties to the
 * even code, by bisection over the monotonic code -> value map. */
static guint32
nearest_code (double ax, guint32 top, double (*value) (guint32))
{
  guint32 lo = 0, hi = top;
  while (hi - lo > 1)
    {
      guint32 mid = (lo + hi) / 2;
      if (value (mid) <= ax)
        lo = mid;
      else
        hi = mid;
    }
  if (value (hi) <= ax)
    return hi;
  double dlo = ax - value (lo), dhi = value (hi) - ax;
  if (dlo < dhi)
    return lo;
  if (dhi < dlo)
    return hi;
  return (lo & 1) ? hi : lo;
}

static guint16
ref_bf16 (float x)
{
  if (isnan (x))
    return 0x7fc0;
  guint32 code
      = isinf (x) ? 0x7f80 : nearest_code (fabs (x), 0x7f80, bf16_value);
  return (guint16)(code | (signbit (x) ? 0x8000 : 0));
}

static guint16
ref_f16 (float x)
{
  if (isnan (x))
    return 0x7e00;
  guint32 code
      = isinf (x) ? 0x7c00 : nearest_code (fabs (x), 0x7c00, f16_value);
  return (guint16)(code | (signbit (x) ? 0x8000 : 0));
}

static float
from_bits (guint32 b)
{
  float x;
  memcpy (&x, &b, 4);
  return x;
}

static guint32
to_bits (float x)
{
  guint32 b;
  memcpy (&b, &x, 4);
  return b;
}

/* Floats that exercise rounding: exact ties, subnormals, the overflow
 * boundaries, signed zeros, then random bit patterns. */
static float *
tricky_floats (guint n, guint32 seed)
{
  static const guint32 special[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00008000, 0x00018000,
    0x00007fff, 0x007fffff, 0x00800000, 0x3f808000, 0x3f818000, 0x3f80ffff,
    0x3f800001, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x477ff000, 0x477fefff,
    0x477fe000, 0x477ff001, 0x38800000, 0x387fffff, 0x33000000, 0x33000001,
    0x33800000, 0x33c00000, 0x34000000, 0x3f801000, 0x3f803000, 0x3f802fff,
    0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345, 0x3a001000,
  };
  float *x = g_new (float, n);
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  for (guint i = 0; i < n; i++)
    {
      if (i < G_N_ELEMENTS (special))
        x[i] = from_bits (special[i]);
      else if (i % 3 == 0) /* values near the fp16 range */
        x[i] = (float)g_rand_double_range (r, -70000, 70000)
               * (float)ldexp (1.0, -g_rand_int_range (r, 0, 30));
      else
        x[i] = from_bits (g_rand_int (r));
    }
  return x;
}

static void
test_conversions (void)
{
  guint n = 200000;
  g_autofree float *x = tricky_floats (n, 7);
  for (guint i = 0; i < n; i++)
    {
      guint16 b = stow_f32_to_bf16 (x[i]);
      guint16 h = stow_f32_to_f16 (x[i]);
      if (b != ref_bf16 (x[i]) || h != ref_f16 (x[i]))
        g_error ("x = %a (0x%08x): bf16 0x%04x want 0x%04x, fp16 0x%04x want "
                 "0x%04x",
                 (double)x[i], to_bits (x[i]), b, ref_bf16 (x[i]), h,
                 ref_f16 (x[i]));
    }
  /* Widening is exact: every code round-trips. */
  for (guint32 c = 0; c < 0x10000; c++)
    {
      float fb = stow_bf16_to_f32 ((guint16)c);
      float fh = stow_f16_to_f32 ((guint16)c);
      if (!isnan (fb))
        g_assert_cmpuint (stow_f32_to_bf16 (fb), ==, c);
      if (!isnan (fh))
        {
          g_assert_cmpuint (stow_f32_to_f16 (fh), ==, c);
          double want = f16_value (c & 0x7fff) * ((c & 0x8000) ? -1 : 1);
          if ((c & 0x7fff) < 0x7c00)
            g_assert_cmpfloat (fh, ==, want);
        }
    }
  /* Published anchors: 65504 is fp16's largest finite value; 1 + 2^-8 is the
   * bf16 tie between 1 and 1 + 2^-7 and rounds to even (1.0). */
  g_assert_cmpuint (stow_f32_to_f16 (65504.0f), ==, 0x7bff);
  g_assert_cmpuint (stow_f32_to_f16 (65520.0f), ==, 0x7c00);
  g_assert_cmpuint (stow_f32_to_bf16 (1.00390625f), ==, 0x3f80);
  g_assert_cmpuint (stow_f32_to_bf16 (1.01171875f), ==, 0x3f82);
}

/* ---- a test problem ---------------------------------------------------- */

typedef struct
{
  guint64 n;
  float *p, *m, *v;
  void *g;
  void *out;
  StowDtype gt, ot;
} Problem;

static void
problem_free (Problem *pb)
{
  g_free (pb->p);
  g_free (pb->m);
  g_free (pb->v);
  g_free (pb->g);
  g_free (pb->out);
  g_free (pb);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC (Problem, problem_free)

static Problem *
problem_new (guint64 n, StowDtype gt, StowDtype ot, guint32 seed)
{
  Problem *pb = g_new0 (Problem, 1);
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  pb->n = n;
  pb->gt = gt;
  pb->ot = ot;
  pb->p = g_new (float, n);
  pb->m = g_new (float, n);
  pb->v = g_new (float, n);
  pb->g = g_malloc (n * stow_dtype_size (gt));
  if (ot != STOW_DTYPE_NONE)
    pb->out = g_malloc0 (n * stow_dtype_size (ot));
  for (guint64 i = 0; i < n; i++)
    {
      pb->p[i] = (float)g_rand_double_range (r, -2, 2);
      pb->m[i] = (float)g_rand_double_range (r, -1e-2, 1e-2);
      pb->v[i] = (float)g_rand_double_range (r, 0, 1e-4);
    }
  return pb;
}

static Problem *
problem_copy (const Problem *src)
{
  Problem *pb = g_new0 (Problem, 1);
  *pb = *src;
  pb->p = g_memdup2 (src->p, src->n * 4);
  pb->m = g_memdup2 (src->m, src->n * 4);
  pb->v = g_memdup2 (src->v, src->n * 4);
  pb->g = g_memdup2 (src->g, src->n * stow_dtype_size (src->gt));
  if (src->out != NULL)
    pb->out = g_memdup2 (src->out, src->n * stow_dtype_size (src->ot));
  return pb;
}

/* Sets gradient i to x, rounded into the gradient type. */
static void
set_grad (Problem *pb, guint64 i, float x)
{
  switch (pb->gt)
    {
    case STOW_DTYPE_BF16:
      ((guint16 *)pb->g)[i] = ref_bf16 (x);
      break;
    case STOW_DTYPE_F16:
      ((guint16 *)pb->g)[i] = ref_f16 (x);
      break;
    default:
      ((float *)pb->g)[i] = x;
    }
}

static double
get_grad (const Problem *pb, guint64 i)
{
  switch (pb->gt)
    {
    case STOW_DTYPE_BF16:
      return (double)from_bits ((guint32)((guint16 *)pb->g)[i] << 16);
    case STOW_DTYPE_F16:
      {
        guint16 h = ((guint16 *)pb->g)[i];
        return f16_value (h & 0x7fff) * ((h & 0x8000) ? -1 : 1);
      }
    default:
      return ((float *)pb->g)[i];
    }
}

static void
fill_grads (Problem *pb, double scale, guint32 seed)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  for (guint64 i = 0; i < pb->n; i++)
    set_grad (pb, i, (float)(g_rand_double_range (r, -1, 1) * scale));
}

static StowAdamTensor
tensor_of (Problem *pb)
{
  return (StowAdamTensor){ .param = pb->p,
                           .m = pb->m,
                           .v = pb->v,
                           .grad = pb->g,
                           .grad_type = pb->gt,
                           .param_out = pb->out,
                           .out_type = pb->ot,
                           .n = pb->n };
}

static gboolean
same_state (const Problem *a, const Problem *b)
{
  gsize os = stow_dtype_size (a->ot);
  return memcmp (a->p, b->p, a->n * 4) == 0
         && memcmp (a->m, b->m, a->n * 4) == 0
         && memcmp (a->v, b->v, a->n * 4) == 0
         && (a->out == NULL || memcmp (a->out, b->out, a->n * os) == 0);
}

/* The reference: one step in double from the float inputs. */
static void
check_against_reference (const Problem *before, const Problem *after,
                         const StowAdamConfig *c, const StowAdamStep *s)
{
  double t = (double)s->step;
  double bc1 = c->bias_correction ? 1 - pow (c->beta1, t) : 1;
  double bc2 = c->bias_correction ? 1 - pow (c->beta2, t) : 1;
  double gs = s->clip_coef / s->loss_scale;
  for (guint64 i = 0; i < before->n; i++)
    {
      double p = before->p[i];
      double g = get_grad (before, i) * gs;
      /* fp32 carries the gradient with a few ulps of each of its terms (the
       * L2 term can cancel the gradient: absolute, not relative, error). */
      double tol_g = 1e-7 * fabs (g);
      if (c->mode == STOW_ADAM_L2)
        {
          tol_g += 1e-7 * fabs (c->weight_decay * p);
          g += c->weight_decay * p;
        }
      double m = c->beta1 * before->m[i] + (1 - c->beta1) * g;
      double v = c->beta2 * before->v[i] + (1 - c->beta2) * g * g;
      double denom = sqrt (v) / sqrt (bc2) + c->eps;
      double upd = (c->lr / bc1) * m / denom;
      if (c->mode == STOW_ADAM_ADAMW)
        p *= 1 - c->lr * c->weight_decay;
      p -= upd;

      /* A few ulps of each term, plus absolute slack at the bottom of the
       * float range. */
      double tol_m = 1e-6 * (fabs (m) + fabs (before->m[i]))
                     + (1 - c->beta1) * tol_g + 1e-37;
      double tol_v = 1e-6 * (fabs (v) + fabs (before->v[i]))
                     + (1 - c->beta2) * 2.1 * fabs (g) * tol_g + 1e-37;
      double tol_p = 1e-6 * fabs (p) + 1e-5 * fabs (upd)
                     + (c->lr / bc1)
                           * (tol_m / denom
                              + fabs (m) * tol_v
                                    / (2 * sqrt (v) * denom * denom * sqrt (bc2)
                                       + 1e-300))
                     + 1e-37;
      if (fabs (after->m[i] - m) > tol_m || fabs (after->v[i] - v) > tol_v
          || fabs (after->p[i] - p) > tol_p)
        g_error (
            "element %" G_GUINT64_FORMAT ": got p %.9g m %.9g v %.9g, "
            "want p %.9g m %.9g v %.9g (g %.9g; before p %.9g m %.9g v %.9g; "
            "grad %s, mode %d)",
            i, (double)after->p[i], (double)after->m[i], (double)after->v[i], p,
            m, v, g, (double)before->p[i], (double)before->m[i],
            (double)before->v[i], stow_dtype_nick (before->gt), (int)c->mode);
      /* The low-precision copy is the kernel's own fp32 result, rounded. */
      switch (after->ot)
        {
        case STOW_DTYPE_F32:
          g_assert_cmpuint (to_bits (((float *)after->out)[i]), ==,
                            to_bits (after->p[i]));
          break;
        case STOW_DTYPE_BF16:
          g_assert_cmpuint (((guint16 *)after->out)[i], ==,
                            ref_bf16 (after->p[i]));
          break;
        case STOW_DTYPE_F16:
          g_assert_cmpuint (((guint16 *)after->out)[i], ==,
                            ref_f16 (after->p[i]));
          break;
        default:
          break;
        }
    }
}

static StowAdam *
adam_or_skip (guint threads, StowIsa isa)
{
  if (!stow_isa_supported (isa))
    {
      g_autofree char *msg
          = g_strdup_printf ("this CPU lacks %s", stow_isa_name (isa));
      g_test_skip (msg);
      return NULL;
    }
  g_autoptr (GError) error = NULL;
  StowAdam *adam = stow_adam_new (threads, isa, &error);
  g_assert_no_error (error);
  g_assert_nonnull (adam);
  g_assert_cmpint (stow_adam_get_isa (adam), ==, isa);
  return adam;
}

/* n crosses Adam blocks and leaves a vector tail. */
#define N_TEST (3 * STOW_ADAM_BLOCK + 37)

/* Each ISA: reference agreement for every grad/output type in both modes,
 * then bit-identity with the scalar oracle. */
static void
test_isa (gconstpointer data)
{
  StowIsa isa = GPOINTER_TO_INT (data);
  g_autoptr (StowAdam) adam = adam_or_skip (2, isa);
  if (adam == NULL)
    return;
  g_autoptr (StowAdam) oracle = stow_adam_new (1, STOW_ISA_SCALAR, NULL);
  const StowDtype gts[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  const StowDtype ots[]
      = { STOW_DTYPE_NONE, STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  for (int mode = 0; mode < 2; mode++)
    for (gsize gi = 0; gi < G_N_ELEMENTS (gts); gi++)
      for (gsize oi = 0; oi < G_N_ELEMENTS (ots); oi++)
        {
          g_autoptr (Problem) pb = problem_new (N_TEST, gts[gi], ots[oi], 11);
          fill_grads (pb, 300.0, 12 + mode);
          g_autoptr (Problem) before = problem_copy (pb);
          g_autoptr (Problem) scalar = problem_copy (pb);
          StowAdamConfig c;
          stow_adam_config_init (&c);
          c.mode = mode ? STOW_ADAM_L2 : STOW_ADAM_ADAMW;
          c.weight_decay = 0.1;
          StowAdamStep s = { .step = 7, .loss_scale = 256, .clip_coef = 0.75 };
          StowAdamTensor t = tensor_of (pb);
          g_autoptr (GError) error = NULL;
          g_assert_true (stow_adam_step (adam, &c, &s, &t, &error));
          g_assert_no_error (error);
          check_against_reference (before, pb, &c, &s);

          StowAdamTensor ts = tensor_of (scalar);
          g_assert_cmpint (stow_adam_step_raw (oracle, &c, &s, &ts), ==, 0);
          g_assert_true (same_state (pb, scalar));
        }
}

/* The updated weights written over the gradients they came from (the
 * executor's NVMe parameters: offload/adam.h allows the alias for one
 * type): the same bits as into a buffer of their own, in one call and in
 * pieces across threads, verified gradients or not. */
static void
test_isa_out_over_grad (gconstpointer data)
{
  StowIsa isa = GPOINTER_TO_INT (data);
  g_autoptr (StowAdam) adam = adam_or_skip (2, isa);
  if (adam == NULL)
    return;
  const StowDtype ts[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  for (gsize ti = 0; ti < G_N_ELEMENTS (ts); ti++)
    for (int verified = 0; verified < 2; verified++)
      {
        g_autoptr (Problem) pb = problem_new (N_TEST, ts[ti], ts[ti], 21);
        fill_grads (pb, 3.0, 22);
        g_autoptr (Problem) alias = problem_copy (pb);
        StowAdamConfig c;
        stow_adam_config_init (&c);
        c.weight_decay = 0.1;
        StowAdamStep s = { .step = 3,
                           .loss_scale = 1,
                           .clip_coef = 0.5,
                           .grads_verified = verified };
        StowAdamTensor t = tensor_of (pb);
        g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, 0);
        StowAdamTensor ta = tensor_of (alias);
        ta.param_out = alias->g;
        g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &ta), ==, 0);
        gsize es = stow_dtype_size (ts[ti]);
        g_assert_cmpmem (alias->p, N_TEST * 4, pb->p, N_TEST * 4);
        g_assert_cmpmem (alias->m, N_TEST * 4, pb->m, N_TEST * 4);
        g_assert_cmpmem (alias->v, N_TEST * 4, pb->v, N_TEST * 4);
        g_assert_cmpmem (alias->g, N_TEST * es, pb->out, N_TEST * es);
      }
}

/* The output conversion inside each kernel, on values that stress it: with
 * lr = 0 the master weight passes through unchanged and the copy must be
 * its correctly rounded bf16/fp16 value, subnormals and NaN included. */
static void
test_isa_output_rounding (gconstpointer data)
{
  StowIsa isa = GPOINTER_TO_INT (data);
  g_autoptr (StowAdam) adam = adam_or_skip (2, isa);
  if (adam == NULL)
    return;
  guint n = 50000;
  g_autofree float *x = tricky_floats (n, 99);
  for (guint i = 0; i < n; i++) /* the master weights stay finite */
    if (!isfinite (x[i]) || (x[i] == 0 && signbit (x[i])))
      x[i] = from_bits (0x00000001u + i); /* -0 + (+0) would be +0 */
  const StowDtype ots[] = { STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  for (gsize oi = 0; oi < G_N_ELEMENTS (ots); oi++)
    {
      g_autoptr (Problem) pb = problem_new (n, STOW_DTYPE_F32, ots[oi], 5);
      memcpy (pb->p, x, n * 4);
      fill_grads (pb, 1.0, 6);
      StowAdamConfig c;
      stow_adam_config_init (&c);
      c.lr = 0;
      StowAdamStep s = { .step = 1, .loss_scale = 1, .clip_coef = 1 };
      StowAdamTensor t = tensor_of (pb);
      g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, 0);
      for (guint i = 0; i < n; i++)
        {
          g_assert_cmpuint (to_bits (pb->p[i]), ==, to_bits (x[i]));
          guint16 got = ((guint16 *)pb->out)[i];
          guint16 want
              = ots[oi] == STOW_DTYPE_BF16 ? ref_bf16 (x[i]) : ref_f16 (x[i]);
          if (got != want)
            g_error ("%s %s: x = %a: got 0x%04x want 0x%04x",
                     stow_isa_name (isa), stow_dtype_nick (ots[oi]),
                     (double)x[i], got, want);
        }
    }
}

/* Zero, tiny and huge gradients against the reference. */
static void
test_edge_values (void)
{
  g_autoptr (StowAdam) adam = stow_adam_new (2, STOW_ISA_AUTO, NULL);
  const double scales[] = { 0.0, 1e-30, 1e-20, 1e15, 1e18 };
  for (gsize k = 0; k < G_N_ELEMENTS (scales); k++)
    {
      g_autoptr (Problem) pb
          = problem_new (N_TEST, STOW_DTYPE_F32, STOW_DTYPE_BF16, 21);
      fill_grads (pb, scales[k], 22);
      if (scales[k] == 0)
        memset (pb->m, 0, pb->n * 4); /* all-zero state too */
      g_autoptr (Problem) before = problem_copy (pb);
      StowAdamConfig c;
      stow_adam_config_init (&c);
      StowAdamStep s = { .step = 3, .loss_scale = 1, .clip_coef = 1 };
      StowAdamTensor t = tensor_of (pb);
      g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, 0);
      check_against_reference (before, pb, &c, &s);
    }
}

/* Kingma & Ba: with bias correction the first step moves each weight by
 * about lr, whatever the gradient's scale: m_hat = g, v_hat = g^2. */
static void
test_first_step_is_lr (void)
{
  g_autoptr (StowAdam) adam = stow_adam_new (1, STOW_ISA_AUTO, NULL);
  float p[4] = { 1, 1, 1, 1 }, m[4] = { 0 }, v[4] = { 0 };
  float g[4] = { 0.5f, -3e-3f, 40.0f, 1e-6f };
  StowAdamConfig c;
  stow_adam_config_init (&c);
  c.weight_decay = 0;
  StowAdamStep s = { .step = 1, .loss_scale = 1, .clip_coef = 1 };
  StowAdamTensor t = { p, m, v, g, STOW_DTYPE_F32, NULL, STOW_DTYPE_NONE, 4 };
  g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, 0);
  for (int i = 0; i < 4; i++)
    {
      double want
          = 1 - 1e-3 * copysign (1, g[i]) * fabs (g[i]) / (fabs (g[i]) + 1e-8);
      g_assert_cmpfloat_with_epsilon (p[i], want, 2e-7);
    }
}

/* NaN, Inf and overflowing gradients: nothing written, reported. */
static void
test_nonfinite_skips (void)
{
  const StowIsa isas[] = { STOW_ISA_SCALAR, STOW_ISA_AVX2, STOW_ISA_AVX512,
                           STOW_ISA_AVX512_BF16 };
  const float bad[] = { NAN, INFINITY, -INFINITY, 1e30f };
  for (gsize k = 0; k < G_N_ELEMENTS (isas); k++)
    {
      if (!stow_isa_supported (isas[k]))
        continue;
      g_autoptr (StowAdam) adam = stow_adam_new (3, isas[k], NULL);
      for (gsize b = 0; b < G_N_ELEMENTS (bad); b++)
        {
          StowDtype gt = b == 3 ? STOW_DTYPE_F32 : STOW_DTYPE_BF16;
          g_autoptr (Problem) pb = problem_new (N_TEST, gt, STOW_DTYPE_BF16, 3);
          fill_grads (pb, 1.0, 4);
          memset (pb->out, 0x5a, pb->n * 2);
          guint64 where = N_TEST - 5 - b * 4097;
          set_grad (pb, where, bad[b]);
          g_autoptr (Problem) before = problem_copy (pb);
          StowAdamConfig c;
          stow_adam_config_init (&c);
          StowAdamStep s = { .step = 9, .loss_scale = 1, .clip_coef = 1 };
          StowAdamTensor t = tensor_of (pb);
          g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, -ERANGE);
          g_assert_true (same_state (pb, before));

          g_autoptr (GError) error = NULL;
          g_assert_false (stow_adam_step (adam, &c, &s, &t, &error));
          g_assert_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_NONFINITE);
          g_autofree char *frag
              = g_strdup_printf ("gradient %" G_GUINT64_FORMAT " of", where);
          g_assert_nonnull (strstr (error->message, frag));
          g_assert_nonnull (strstr (error->message, "step skipped"));
          g_assert_true (same_state (pb, before));

          /* The grad norm sees it too, so a verified step is refused. */
          double sumsq;
          g_assert_cmpint (
              stow_adam_grad_sumsq (adam, pb->g, gt, pb->n, &sumsq), ==, 0);
          g_assert_false (stow_adam_grads_ok (sumsq, 1, 1));
        }
    }
}

static void
run_steps (StowAdam *adam, Problem *pb, guint64 first, guint64 last)
{
  StowAdamConfig c;
  stow_adam_config_init (&c);
  for (guint64 k = first; k <= last; k++)
    {
      fill_grads (pb, 5.0, 100 + (guint32)k);
      StowAdamStep s = { .step = k, .loss_scale = 8, .clip_coef = 0.9 };
      StowAdamTensor t = tensor_of (pb);
      g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, 0);
    }
}

static void
test_thread_invariance (void)
{
  const guint threads[] = { 1, 2, 3, 7 };
  g_autoptr (Problem) first = NULL;
  double first_sumsq = 0;
  for (gsize k = 0; k < G_N_ELEMENTS (threads); k++)
    {
      g_autoptr (StowAdam) adam
          = stow_adam_new (threads[k], STOW_ISA_AUTO, NULL);
      g_assert_cmpuint (stow_adam_get_n_threads (adam), ==, threads[k]);
      g_autoptr (Problem) pb = problem_new (
          7 * STOW_ADAM_BLOCK + 3, STOW_DTYPE_BF16, STOW_DTYPE_BF16, 31);
      run_steps (adam, pb, 1, 3);
      double sumsq;
      g_assert_cmpint (
          stow_adam_grad_sumsq (adam, pb->g, pb->gt, pb->n, &sumsq), ==, 0);
      if (first == NULL)
        {
          first = g_steal_pointer (&pb);
          first_sumsq = sumsq;
        }
      else
        {
          g_assert_true (same_state (first, pb));
          g_assert_cmpuint (memcmp (&sumsq, &first_sumsq, 8), ==, 0);
        }
    }
}

/* k steps, a "checkpoint" (the arrays copied into a new engine), then step
 * k+1, equals k+1 straight steps bit for bit. */
static void
test_resume (void)
{
  g_autoptr (StowAdam) a = stow_adam_new (2, STOW_ISA_AUTO, NULL);
  g_autoptr (Problem) straight
      = problem_new (N_TEST, STOW_DTYPE_F16, STOW_DTYPE_BF16, 41);
  g_autoptr (Problem) resumed = problem_copy (straight);
  run_steps (a, straight, 1, 6);

  run_steps (a, resumed, 1, 5);
  g_autoptr (Problem) ckpt = problem_copy (resumed);
  g_autoptr (StowAdam) b = stow_adam_new (3, STOW_ISA_AUTO, NULL);
  run_steps (b, ckpt, 6, 6);
  g_assert_true (same_state (straight, ckpt));

  /* The step number matters: resuming with the wrong one differs. */
  g_autoptr (Problem) wrong = problem_copy (resumed);
  fill_grads (wrong, 5.0, 106);
  StowAdamConfig c;
  stow_adam_config_init (&c);
  StowAdamStep s = { .step = 5, .loss_scale = 8, .clip_coef = 0.9 };
  StowAdamTensor t = tensor_of (wrong);
  g_assert_cmpint (stow_adam_step_raw (b, &c, &s, &t), ==, 0);
  g_assert_false (same_state (straight, wrong));
}

static void
test_grad_sumsq (void)
{
  guint64 n = 200003;
  g_autoptr (Problem) pb = problem_new (n, STOW_DTYPE_F32, STOW_DTYPE_NONE, 51);
  fill_grads (pb, 3.0, 52);
  double want = 0;
  for (guint64 i = 0; i < n; i++)
    want += get_grad (pb, i) * get_grad (pb, i);
  double bits0 = 0;
  gboolean have = FALSE;
  const guint threads[] = { 1, 2, 3, 7 };
  for (int isa = STOW_ISA_SCALAR; isa < STOW_ISA_N; isa++)
    {
      if (!stow_isa_supported (isa))
        continue;
      for (gsize k = 0; k < G_N_ELEMENTS (threads); k++)
        {
          g_autoptr (StowAdam) adam = stow_adam_new (threads[k], isa, NULL);
          double s;
          g_assert_cmpint (stow_adam_grad_sumsq (adam, pb->g, pb->gt, n, &s),
                           ==, 0);
          g_assert_cmpfloat_with_epsilon (s, want, want * 1e-12);
          if (!have)
            {
              bits0 = s;
              have = TRUE;
            }
          /* Same bits on every ISA and thread count. */
          g_assert_cmpuint (memcmp (&s, &bits0, 8), ==, 0);
        }
    }
  /* clip_grad_norm_'s coefficient. */
  g_assert_cmpfloat_with_epsilon (stow_adam_clip_coef (4.0, 1.0),
                                  1.0 / (4.0 + 1e-6), 1e-15);
  g_assert_cmpfloat (stow_adam_clip_coef (0.5, 1.0), ==, 1.0);
  g_assert_cmpfloat (stow_adam_clip_coef (5.0, 0.0), ==, 1.0);
  g_assert_true (stow_adam_grads_ok (want, 1, 1));
  g_assert_false (stow_adam_grads_ok (INFINITY, 1, 1));
  g_assert_false (stow_adam_grads_ok (1e40, 1, 1)); /* |g| up to 1e20 */
  g_assert_true (stow_adam_grads_ok (1e40, 1e4, 1));
}

static void
test_invalid (void)
{
  g_autoptr (StowAdam) adam = stow_adam_new (1, STOW_ISA_AUTO, NULL);
  g_autoptr (Problem) pb = problem_new (64, STOW_DTYPE_F32, STOW_DTYPE_BF16, 1);
  fill_grads (pb, 1, 2);
  g_autoptr (Problem) before = problem_copy (pb);
  StowAdamConfig c;
  stow_adam_config_init (&c);
  StowAdamStep s = { .step = 1, .loss_scale = 1, .clip_coef = 1 };
  StowAdamTensor t = tensor_of (pb);
  g_autoptr (GError) error = NULL;

  c.beta2 = 1.5;
  g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, -EINVAL);
  g_assert_false (stow_adam_step (adam, &c, &s, &t, &error));
  g_assert_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "beta2 (1.5)"));
  g_clear_error (&error);
  stow_adam_config_init (&c);

  s.step = 0;
  g_assert_false (stow_adam_step (adam, &c, &s, &t, &error));
  g_assert_nonnull (strstr (error->message, "step number (0)"));
  g_clear_error (&error);
  s.step = 1;

  s.loss_scale = 0;
  g_assert_false (stow_adam_step (adam, &c, &s, &t, &error));
  g_assert_nonnull (strstr (error->message, "loss_scale (0)"));
  g_clear_error (&error);
  s.loss_scale = 1;

  t.out_type = STOW_DTYPE_NONE; /* with an output pointer */
  g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, -EINVAL);
  t = tensor_of (pb);
  t.grad = NULL;
  g_assert_cmpint (stow_adam_step_raw (adam, &c, &s, &t), ==, -EINVAL);
  g_assert_true (same_state (pb, before));

  double sumsq;
  g_assert_cmpint (
      stow_adam_grad_sumsq (adam, pb->g, STOW_DTYPE_NONE, 64, &sumsq), ==,
      -EINVAL);
  /* An ISA this CPU lacks is refused by name. */
  for (int isa = STOW_ISA_SCALAR; isa < STOW_ISA_N; isa++)
    if (!stow_isa_supported (isa))
      {
        StowAdam *none = stow_adam_new (1, isa, &error);
        g_assert_null (none);
        g_assert_error (error, STOW_ADAM_ERROR, STOW_ADAM_ERROR_UNSUPPORTED);
        g_clear_error (&error);
      }
  g_assert_cmpuint (
      stow_adam_bytes_per_param (STOW_DTYPE_BF16, STOW_DTYPE_BF16, TRUE), ==,
      28);
  g_assert_cmpuint (
      stow_adam_bytes_per_param (STOW_DTYPE_F32, STOW_DTYPE_NONE, TRUE), ==,
      28); /* DeepSpeed's all-fp32 count, offload.md §0 */
}

/* The ISA detection agrees with /proc/cpuinfo. */
static void
test_isa_detection (void)
{
  g_autofree char *info = NULL;
  /* valgrind's virtual CPU hides AVX-512 from cpuid, while /proc/cpuinfo
   * describes the host (tests/meson.build's valgrind setup sets this). */
  if (g_getenv ("STOW_VALGRIND"))
    {
      g_test_skip ("under valgrind, cpuid is valgrind's, not the host's");
      return;
    }
  if (!g_file_get_contents ("/proc/cpuinfo", &info, NULL, NULL))
    {
      g_test_skip ("no /proc/cpuinfo");
      return;
    }
  const char *flags = strstr (info, "\nflags");
  g_assert_nonnull (flags);
  g_autofree char *line = g_strndup (flags, strcspn (flags + 1, "\n") + 1);
  g_autofree char *padded = g_strconcat (line, " ", NULL);
  gboolean f512 = strstr (padded, " avx512f ") != NULL;
  gboolean bf16 = strstr (padded, " avx512_bf16 ") != NULL;
  gboolean avx2 = strstr (padded, " avx2 ") != NULL
                  && strstr (padded, " fma ") != NULL
                  && strstr (padded, " f16c ") != NULL;
  g_assert_cmpint (stow_isa_supported (STOW_ISA_AVX2), ==, avx2);
  g_assert_cmpint (stow_isa_supported (STOW_ISA_AVX512), ==, f512);
  g_assert_cmpint (stow_isa_supported (STOW_ISA_AVX512_BF16), ==, f512 && bf16);
  StowIsa isa;
  g_assert_true (stow_isa_from_name ("avx512-bf16", &isa));
  g_assert_cmpint (isa, ==, STOW_ISA_AVX512_BF16);
  g_assert_false (stow_isa_from_name ("sse9", &isa));
}

static void
count_job (gpointer data, guint index, guint n_threads)
{
  gint *hits = data;
  g_assert_cmpuint (index, <, n_threads);
  g_atomic_int_inc (&hits[index]);
}

/* Every worker runs every job exactly once, job after job; the static
 * partition covers all blocks without overlap. */
static void
test_pool (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCpuPool) pool = stow_cpu_pool_new (7, TRUE, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_cpu_pool_n_threads (pool), ==, 7);
  g_assert_cmpuint (stow_cpu_pool_n_bound (pool), <=, 7);
  gint hits[7] = { 0 };
  for (int r = 0; r < 100; r++)
    stow_cpu_pool_run (pool, count_job, hits);
  for (int i = 0; i < 7; i++)
    g_assert_cmpint (hits[i], ==, 100);

  const guint64 blocks[] = { 0, 1, 5, 7, 1000003 };
  for (gsize b = 0; b < G_N_ELEMENTS (blocks); b++)
    for (guint t = 1; t <= 9; t++)
      {
        guint64 next = 0;
        for (guint i = 0; i < t; i++)
          {
            guint64 lo, hi;
            stow_cpu_partition (blocks[b], i, t, &lo, &hi);
            g_assert_cmpuint (lo, ==, next);
            g_assert_cmpuint (hi, >=, lo);
            next = hi;
          }
        g_assert_cmpuint (next, ==, blocks[b]);
      }

  /* An empty tensor is a no-op, not an error. */
  g_autoptr (StowAdam) adam = stow_adam_new (2, STOW_ISA_AUTO, NULL);
  StowAdamConfig c;
  stow_adam_config_init (&c);
  StowAdamStep s = { .step = 1, .loss_scale = 1, .clip_coef = 1 };
  StowAdamTensor t
      = { .grad_type = STOW_DTYPE_BF16, .out_type = STOW_DTYPE_NONE };
  g_assert_true (stow_adam_step (adam, &c, &s, &t, &error));
  g_assert_no_error (error);
}

/* The rate the cuda backend's simulated cpu_optim stream takes: parameters
 * a second, agreeing with a step timed here on arrays of the same size
 * (within 5x either way: the machine may be shared; a rate in bytes or
 * a time would be off by 28x or more). */
static void
test_measure (void)
{
  g_autoptr (GError) error = NULL;
  StowAdam *adam = stow_adam_new (0, STOW_ISA_AUTO, &error);
  g_assert_no_error (error);
  guint64 n = (guint64)1 << 20;
  double rate = stow_adam_measure (adam, n, 3, &error);
  g_assert_no_error (error);
  g_assert_true (isfinite (rate));
  g_assert_cmpfloat (rate, >, 0);
  float *f = g_new0 (float, 3 * n);
  guint16 *h = g_new0 (guint16, 2 * n);
  for (guint64 i = 0; i < n; i++)
    h[i] = 0x3c00;
  StowAdamConfig cfg;
  stow_adam_config_init (&cfg);
  StowAdamTensor t
      = { f, f + n, f + 2 * n, h, STOW_DTYPE_BF16, h + n, STOW_DTYPE_BF16, n };
  double best = G_MAXDOUBLE;
  for (guint r = 0; r < 4; r++)
    {
      StowAdamStep st = { r + 1, 1.0, 1.0, FALSE };
      gint64 t0 = g_get_monotonic_time ();
      g_assert_cmpint (stow_adam_step_raw (adam, &cfg, &st, &t), ==, 0);
      if (r > 0)
        best = MIN (best, (double)(g_get_monotonic_time () - t0) * 1e-6);
    }
  double here = (double)n / MAX (best, 1e-9);
  g_test_message ("measured %.3g parameters/s, timed here %.3g", rate, here);
  g_assert_cmpfloat (rate, >, here / 5);
  g_assert_cmpfloat (rate, <, here * 5);
  g_free (f);
  g_free (h);
  stow_adam_free (adam);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/adam/conversions", test_conversions);
  g_test_add_func ("/adam/isa-detection", test_isa_detection);
  g_test_add_func ("/adam/pool", test_pool);
  for (int isa = STOW_ISA_SCALAR; isa < STOW_ISA_N; isa++)
    {
      g_autofree char *p1
          = g_strdup_printf ("/adam/isa/%s/reference", stow_isa_name (isa));
      g_autofree char *p2 = g_strdup_printf ("/adam/isa/%s/output-rounding",
                                             stow_isa_name (isa));
      g_test_add_data_func (p1, GINT_TO_POINTER (isa), test_isa);
      g_test_add_data_func (p2, GINT_TO_POINTER (isa),
                            test_isa_output_rounding);
      g_autofree char *p3
          = g_strdup_printf ("/adam/isa/%s/out-over-grad", stow_isa_name (isa));
      g_test_add_data_func (p3, GINT_TO_POINTER (isa), test_isa_out_over_grad);
    }
  g_test_add_func ("/adam/edge-values", test_edge_values);
  g_test_add_func ("/adam/first-step-is-lr", test_first_step_is_lr);
  g_test_add_func ("/adam/nonfinite-skips", test_nonfinite_skips);
  g_test_add_func ("/adam/thread-invariance", test_thread_invariance);
  g_test_add_func ("/adam/resume", test_resume);
  g_test_add_func ("/adam/grad-sumsq", test_grad_sumsq);
  g_test_add_func ("/adam/invalid", test_invalid);
  g_test_add_func ("/adam/measure", test_measure);
  return g_test_run ();
}
