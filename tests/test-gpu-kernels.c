/* SPDX-License-Identifier: MIT
 *
 * tests/test-gpu-kernels.c: the cuda decoder runtime (executor/backends/
 * cuda/llama-cuda.h) against the cpu runtime (executor/llama.h) and the
 * CPU optimizer (offload/adam.h), kernel by kernel, on random inputs:
 * tolerances per tensor (max |gpu - cpu| / max |cpu|: 1e-5 at fp32, 2e-2
 * at bf16), bit-identical reruns, and a bit-identical AdamW.  Every
 * comparison prints the error it measured.  Exits 77 (skip) when there is
 * no CUDA device or no cuBLAS.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "executor/backends/cuda/llama-cuda.h"
#include "tests/testutil-llama.h"

#define TOL_F32  1e-5
#define TOL_BF16 2e-2

/* ---- device helpers ------------------------------------------------------ */

static cudaStream_t stream;

static void
cuda_check (cudaError_t e, const char *what)
{
  if (e != cudaSuccess)
    g_error ("%s: %s", what, cudaGetErrorString (e));
}

static void *
dev_alloc (guint64 bytes)
{
  void *p = NULL;
  cuda_check (cudaMalloc (&p, MAX (bytes, 1)), "cudaMalloc");
  return p;
}

/* A pageable upload may return before its DMA is done: wait for it, so
 * that the runtime's stream sees the data whatever its flags. */
static void
upload (void *dev, const void *host, guint64 bytes)
{
  if (bytes > 0)
    cuda_check (cudaMemcpy (dev, host, bytes, cudaMemcpyHostToDevice),
                "upload");
  cuda_check (cudaDeviceSynchronize (), "upload: cudaDeviceSynchronize");
}

static void *
dev_dup (const void *host, guint64 bytes)
{
  void *p = dev_alloc (bytes);
  upload (p, host, bytes);
  return p;
}

/* Waits for the stream, then copies: what the runtime issued is done. */
static void
download (void *host, const void *dev, guint64 bytes)
{
  cuda_check (cudaStreamSynchronize (stream), "cudaStreamSynchronize");
  if (bytes > 0)
    cuda_check (cudaMemcpy (host, dev, bytes, cudaMemcpyDeviceToHost),
                "download");
}

static void
runtime_ok (StowLlamaCuda *g)
{
  cuda_check (cudaStreamSynchronize (stream), "cudaStreamSynchronize");
  g_autoptr (GError) error = NULL;
  gboolean ok = stow_llama_cuda_check (g, &error);
  if (!ok)
    g_printerr ("  runtime error: %s\n", error->message);
  g_assert_no_error (error);
  g_assert_true (ok);
}

/* ---- comparisons -----------------------------------------------------------
 */

static float
load (const void *p, gboolean bf16, guint64 i)
{
  return bf16 ? stow_bf16_to_f32 (((const guint16 *)p)[i])
              : ((const float *)p)[i];
}

/* max |got - ref| / max |ref| over @n elements (bf16 when @bf16). */
static double
rel_err (const void *ref, const void *got, guint64 n, gboolean bf16)
{
  double err = 0, scale = 0;
  for (guint64 i = 0; i < n; i++)
    {
      double r = load (ref, bf16, i), g = load (got, bf16, i);
      double d = fabs (g - r);
      err = isnan (d) ? INFINITY : MAX (err, d);
      scale = MAX (scale, fabs (r));
    }
  return scale > 0 ? err / scale : err;
}

/* Counts the comparisons that failed; every one is printed. */
typedef struct
{
  const char *test;
  guint failures;
  double worst;
} Report;

static void
report (Report *r, const char *tensor, const void *ref, const void *got,
        guint64 n, gboolean bf16, double tol)
{
  double err = rel_err (ref, got, n, bf16);
  gboolean same = memcmp (ref, got, n * (bf16 ? 2 : 4)) == 0;
  gboolean ok = err <= tol;
  g_printerr ("  %-36s %-12s max rel err %.3e  tol %.0e  %s%s\n", r->test,
              tensor, err, tol, ok ? "ok" : "FAIL",
              same ? " (bit-identical)" : "");
  r->failures += !ok;
  r->worst = MAX (r->worst, err);
}

static void
report_done (Report *r)
{
  g_printerr ("  %-36s worst %.3e, %u failed\n", r->test, r->worst,
              r->failures);
  g_assert_cmpuint (r->failures, ==, 0);
}

static void
fill (void *p, guint64 n, gboolean bf16, GRand *rng, double scale)
{
  for (guint64 i = 0; i < n; i++)
    {
      float v = (float)(scale * g_rand_double_range (rng, -1, 1));
      if (bf16)
        ((guint16 *)p)[i] = stow_f32_to_bf16 (v);
      else
        ((float *)p)[i] = v;
    }
}

/* ---- cases -----------------------------------------------------------------
 */

typedef struct
{
  const char *name;
  StowLlamaConfig cfg;
  guint64 batch, seq;
} CaseDesc;

static const CaseDesc cases[] = {
  /* GQA, no biases, untied; seq odd on purpose (a partial tile). */
  { "base",
    { .hidden = 64,
      .n_layers = 1,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 16,
      .ffn = 160,
      .vocab = 300,
      .rope_theta = 10000,
      .rms_norm_eps = 1e-5 },
    2,
    33 },
  /* Every bias, tied, llama3 rope scaling (wavelengths of d = 16 fall in
   * all three bands of an original 16 positions). */
  { "bias-tied-llama3",
    { .hidden = 64,
      .n_layers = 1,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 16,
      .ffn = 160,
      .vocab = 300,
      .rope_theta = 10000,
      .rms_norm_eps = 1e-5,
      .rope_factor = 8,
      .rope_low_freq_factor = 1,
      .rope_high_freq_factor = 4,
      .rope_original_max_positions = 16,
      .qkv_bias = TRUE,
      .o_bias = TRUE,
      .mlp_bias = TRUE,
      .tied = TRUE },
    2,
    33 },
  /* Qwen3: per-head q/k RMSNorm (rows of head_dim 24, tokens x heads of
   * them; hidden / heads is 16), GQA. */
  { "qwen3-qk-norm",
    { .hidden = 64,
      .n_layers = 1,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 24,
      .ffn = 160,
      .vocab = 300,
      .rope_theta = 1000000,
      .rms_norm_eps = 1e-6,
      .qk_norm = TRUE },
    2,
    33 },
  /* head_dim 160 > 128: the attention's 16-token tiles, 7 of them, and a
   * group of 4 query heads per kv head. */
  { "wide-head",
    { .hidden = 96,
      .n_layers = 1,
      .n_heads = 4,
      .n_kv_heads = 1,
      .head_dim = 160,
      .ffn = 128,
      .vocab = 77,
      .rope_theta = 500000,
      .rms_norm_eps = 1e-6 },
    1,
    100 },
  /* Realistic heads for the bf16 runtime's tensor-core attention: d 128
   * (64-row tiles, 4 of them, a group of 2), and d 64 with seq 200 (not
   * a multiple of the tile). */
  { "head128",
    { .hidden = 256,
      .n_layers = 1,
      .n_heads = 2,
      .n_kv_heads = 1,
      .head_dim = 128,
      .ffn = 256,
      .vocab = 64,
      .rope_theta = 10000,
      .rms_norm_eps = 1e-5 },
    2,
    256 },
  { "head64-seq200",
    { .hidden = 256,
      .n_layers = 1,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 64,
      .ffn = 256,
      .vocab = 64,
      .rope_theta = 10000,
      .rms_norm_eps = 1e-5 },
    1,
    200 },
};

typedef struct
{
  const CaseDesc *desc;
  StowDtype dtype;
} CaseData;

typedef struct
{
  const CaseDesc *desc;
  StowLlamaConfig cfg;
  gboolean bf16;
  guint64 e, n, h, V;
  TestLlamaModel *m; /* the cpu runtime and its host parameters */
  StowLlamaCuda *g;
  void **dw, **dg; /* device copies of each parameter and gradient */
  gint32 *dtokens, *dtargets;
  GRand *rng;
  char *name;
} Case;

static Case *
case_new (const CaseData *cd)
{
  Case *c = g_new0 (Case, 1);
  c->desc = cd->desc;
  c->cfg = cd->desc->cfg;
  c->bf16 = cd->dtype == STOW_DTYPE_BF16;
  c->e = stow_dtype_size (cd->dtype);
  c->n = cd->desc->batch * cd->desc->seq;
  c->h = c->cfg.hidden;
  c->V = c->cfg.vocab;
  c->name
      = g_strdup_printf ("%s/%s", cd->desc->name, stow_dtype_nick (cd->dtype));
  g_autoptr (GError) error = NULL;
  c->m = test_llama_model_new (&c->cfg, cd->dtype, cd->desc->batch,
                               cd->desc->seq, 2, 0, &error);
  g_assert_no_error (error);
  test_llama_model_randomize (c->m, 1234);
  /* Repeated tokens: the embedding's backward sums groups. */
  for (guint64 i = 0; i < c->n; i += 5)
    c->m->tokens[i] = 7;
  c->g = stow_llama_cuda_new (&c->cfg, cd->dtype, c->n, cd->desc->seq, stream,
                              &error);
  g_assert_no_error (error);
  guint np = c->m->params->len;
  c->dw = g_new0 (void *, np);
  c->dg = g_new0 (void *, np);
  for (guint i = 0; i < np; i++)
    {
      TestLlamaParam *p = &g_array_index (c->m->params, TestLlamaParam, i);
      guint64 bytes = p->rows * p->cols * c->e;
      c->dw[i] = dev_dup (p->w, bytes);
      c->dg[i] = dev_dup (p->g, bytes);
    }
  c->dtokens = dev_dup (c->m->tokens, 4 * c->n);
  c->dtargets = dev_dup (c->m->targets, 4 * c->n);
  c->rng = g_rand_new_with_seed (99);
  return c;
}

static void
case_free (Case *c)
{
  for (guint i = 0; i < c->m->params->len; i++)
    {
      cudaFree (c->dw[i]);
      cudaFree (c->dg[i]);
    }
  g_free (c->dw);
  g_free (c->dg);
  cudaFree (c->dtokens);
  cudaFree (c->dtargets);
  stow_llama_cuda_free (c->g);
  test_llama_model_free (c->m);
  g_rand_free (c->rng);
  g_free (c->name);
  g_free (c);
}

static guint
param_index (const Case *c, const char *name)
{
  for (guint i = 0; i < c->m->params->len; i++)
    if (g_str_equal (g_array_index (c->m->params, TestLlamaParam, i).name,
                     name))
      return i;
  g_assert_not_reached ();
}

static TestLlamaParam *
param (const Case *c, guint i)
{
  return &g_array_index (c->m->params, TestLlamaParam, i);
}

static guint64
param_elems (const Case *c, guint i)
{
  return param (c, i)->rows * param (c, i)->cols;
}

/* The device twin of a host pointer to a parameter (or gradient). */
static void *
dev_of (const Case *c, const void *host)
{
  if (host == NULL)
    return NULL;
  for (guint i = 0; i < c->m->params->len; i++)
    {
      if (param (c, i)->w == host)
        return c->dw[i];
      if (param (c, i)->g == host)
        return c->dg[i];
    }
  g_assert_not_reached ();
}

static void
layer_pair (const Case *c, gboolean grads, StowLlamaLayerWeights *host,
            StowLlamaLayerWeights *dev)
{
  test_llama_model_layer (c->m, 0, grads, host);
  void **hp = (void **)host, **dp = (void **)dev;
  for (guint i = 0; i < sizeof *host / sizeof (void *); i++)
    dp[i] = dev_of (c, hp[i]);
}

/* Layer 0's parameter indices (the per-layer block after "embed"). */
static guint
layer_first (void)
{
  return 1;
}

/* ---- embedding -------------------------------------------------------------
 */

static void
test_embed (gconstpointer data)
{
  Case *c = case_new (data);
  Report r = { g_strconcat ("embed/", c->name, NULL), 0, 0 };
  guint64 n = c->n, h = c->h, V = c->V, e = c->e;
  guint ie = param_index (c, "embed");

  g_autofree void *x_cpu = g_malloc (n * h * e);
  g_autofree void *x_gpu = g_malloc (n * h * e);
  void *dx_dev = dev_alloc (n * h * e);
  stow_decoder_embed_forward (stow_llama_decoder (c->m->rt), param (c, ie)->w,
                              c->m->tokens, n, x_cpu);
  stow_decoder_embed_forward (stow_llama_cuda_decoder (c->g), c->dw[ie],
                              c->dtokens, n, dx_dev);
  download (x_gpu, dx_dev, n * h * e);
  runtime_ok (c->g);
  report (&r, "forward x", x_cpu, x_gpu, n * h, c->bf16, 0);

  g_autofree void *dxh = g_malloc (n * h * e);
  g_autofree void *d0 = g_malloc (V * h * e);
  g_autofree void *d_cpu = g_malloc (V * h * e);
  g_autofree void *d_gpu = g_malloc (V * h * e);
  fill (dxh, n * h, c->bf16, c->rng, 1);
  fill (d0, V * h, c->bf16, c->rng, 1);
  upload (dx_dev, dxh, n * h * e);
  void *dd = dev_alloc (V * h * e);
  for (int acc = 0; acc < 2; acc++)
    {
      memcpy (d_cpu, d0, V * h * e);
      upload (dd, d0, V * h * e);
      stow_decoder_embed_backward (stow_llama_decoder (c->m->rt), c->m->tokens,
                                   n, dxh, d_cpu, acc);
      stow_decoder_embed_backward (stow_llama_cuda_decoder (c->g), c->dtokens,
                                   n, dx_dev, dd, acc);
      download (d_gpu, dd, V * h * e);
      runtime_ok (c->g);
      report (&r, acc ? "dembed +=" : "dembed =", d_cpu, d_gpu, V * h, c->bf16,
              c->bf16 ? TOL_BF16 : TOL_F32);
    }
  cudaFree (dx_dev);
  cudaFree (dd);
  report_done (&r);
  g_free ((char *)r.test);
  case_free (c);
}

/* ---- layer forward
 * ----------------------------------------------------------- */

typedef struct
{
  const char *name;
  void *p;
  guint64 n;
  gboolean f32;
} Tensor;

/* The tensors of @s (carved for n tokens), named. */
static guint
saved_tensors (const Case *c, const StowLlamaSaved *s, Tensor *t)
{
  guint64 n = c->n, h = c->h, f = c->cfg.ffn;
  guint64 ad = c->cfg.n_heads * c->cfg.head_dim;
  guint64 kd = c->cfg.n_kv_heads * c->cfg.head_dim;
  Tensor all[] = {
    { "xn1", s->xn1, n * h, FALSE },
    { "q", s->q, n * ad, FALSE },
    { "k", s->k, n * kd, FALSE },
    { "v", s->v, n * kd, FALSE },
    { "o", s->o, n * ad, FALSE },
    { "lse", s->lse, n * c->cfg.n_heads, TRUE },
    { "h1", s->h1, n * h, FALSE },
    { "xn2", s->xn2, n * h, FALSE },
    { "gate", s->gate, n * f, FALSE },
    { "up", s->up, n * f, FALSE },
    { "act", s->act, n * f, FALSE },
    { "out", s->out, n * h, FALSE },
    /* Qwen3's q/k norm inputs, last: absent without qk_norm. */
    { "qr", s->qr, n * ad, FALSE },
    { "kr", s->kr, n * kd, FALSE },
  };
  memcpy (t, all, sizeof all);
  return G_N_ELEMENTS (all) - (c->cfg.qk_norm ? 0 : 2);
}

static void
test_layer_forward (gconstpointer data)
{
  Case *c = case_new (data);
  Report r = { g_strconcat ("layer-forward/", c->name, NULL), 0, 0 };
  guint64 n = c->n, h = c->h, e = c->e;
  StowLlama *rt = c->m->rt;
  guint64 out_b = stow_llama_out_bytes (rt, n);
  guint64 rest_b = stow_llama_saved_bytes (rt, n) - out_b;
  StowLlamaLayerWeights lw, lwd;
  layer_pair (c, FALSE, &lw, &lwd);

  g_autofree void *x = g_malloc (n * h * e);
  fill (x, n * h, c->bf16, c->rng, 1);
  void *xd = dev_dup (x, n * h * e);
  stow_decoder_layer_forward (stow_llama_decoder (rt), c->desc->batch,
                              c->desc->seq, &lw, x, &c->m->saved[0]);

  void *rest_d = dev_alloc (rest_b), *out_d = dev_alloc (out_b);
  StowLlamaSaved sd, sh;
  stow_llama_saved_carve (rt, n, rest_d, out_d, &sd);
  stow_decoder_layer_forward (stow_llama_cuda_decoder (c->g), c->desc->batch,
                              c->desc->seq, &lwd, xd, &sd);
  g_autofree void *rest_h = g_malloc (rest_b);
  g_autofree void *out_h = g_malloc (out_b);
  download (rest_h, rest_d, rest_b);
  download (out_h, out_d, out_b);
  runtime_ok (c->g);
  stow_llama_saved_carve (rt, n, rest_h, out_h, &sh);
  Tensor tc[16], tg[16];
  guint nt = saved_tensors (c, &c->m->saved[0], tc);
  saved_tensors (c, &sh, tg);
  for (guint i = 0; i < nt; i++)
    {
      gboolean bf = c->bf16 && !tc[i].f32;
      report (&r, tc[i].name, tc[i].p, tg[i].p, tc[i].n, bf,
              c->bf16 ? TOL_BF16 : TOL_F32);
    }

  /* Recomputation (out NULL): the same bits, out untouched. */
  g_autofree void *rest_h2 = g_malloc (rest_b);
  StowLlamaSaved sd2;
  stow_llama_saved_carve (rt, n, rest_d, NULL, &sd2);
  cuda_check (cudaMemset (rest_d, 0xff, rest_b), "memset");
  cuda_check (cudaDeviceSynchronize (), "memset: cudaDeviceSynchronize");
  stow_decoder_layer_forward (stow_llama_cuda_decoder (c->g), c->desc->batch,
                              c->desc->seq, &lwd, xd, &sd2);
  download (rest_h2, rest_d, rest_b);
  runtime_ok (c->g);
  gboolean same = memcmp (rest_h, rest_h2, rest_b) == 0;
  g_printerr ("  %-36s recompute (out NULL) bit-identical to the first "
              "forward: %s\n",
              r.test, same ? "yes" : "NO");
  r.failures += !same;

  cudaFree (xd);
  cudaFree (rest_d);
  cudaFree (out_d);
  report_done (&r);
  g_free ((char *)r.test);
  case_free (c);
}

/* ---- layer backward
 * ------------------------------------------------------------ */

/* One backward on both runtimes from the same saved tensors (the cpu
 * forward's, uploaded), the same dout and the same starting gradients
 * @g0 (per parameter of layer 0).  The GPU's dx goes to @x_dev itself when
 * @alias.  Leaves the GPU's dx in @dx_gpu and its gradients in c->dg. */
static void
backward_once (Case *c, const void *x, void *x_dev, const void *dout, void **g0,
               gboolean acc, gboolean alias, void *dx_cpu, void *dx_gpu)
{
  guint64 n = c->n, h = c->h, e = c->e;
  StowLlama *rt = c->m->rt;
  guint64 out_b = stow_llama_out_bytes (rt, n);
  guint64 rest_b = stow_llama_saved_bytes (rt, n) - out_b;
  StowLlamaLayerWeights lw, lwd, lg, lgd;
  layer_pair (c, FALSE, &lw, &lwd);
  layer_pair (c, TRUE, &lg, &lgd);

  stow_decoder_layer_forward (stow_llama_decoder (rt), c->desc->batch,
                              c->desc->seq, &lw, x, &c->m->saved[0]);
  memcpy (c->m->outs[0], dout, out_b);
  void *rest_d = dev_dup (c->m->rest[0], rest_b);
  void *out_d = dev_dup (dout, out_b);
  StowLlamaSaved sd;
  stow_llama_saved_carve (rt, n, rest_d, out_d, &sd);
  for (guint i = layer_first (); i < layer_first () + c->m->per_layer; i++)
    {
      memcpy (param (c, i)->g, g0[i], param_elems (c, i) * e);
      upload (c->dg[i], g0[i], param_elems (c, i) * e);
    }
  void *ws_d = dev_alloc (stow_llama_backward_ws_bytes (rt, n));
  void *dxd = alias ? x_dev : dev_alloc (n * h * e);

  stow_decoder_layer_backward (stow_llama_decoder (rt), c->desc->batch,
                               c->desc->seq, &lw, x, &c->m->saved[0], &lg, acc,
                               c->m->ws, dx_cpu);
  stow_decoder_layer_backward (stow_llama_cuda_decoder (c->g), c->desc->batch,
                               c->desc->seq, &lwd, x_dev, &sd, &lgd, acc, ws_d,
                               dxd);
  download (dx_gpu, dxd, n * h * e);
  runtime_ok (c->g);
  if (!alias)
    cudaFree (dxd);
  cudaFree (ws_d);
  cudaFree (rest_d);
  cudaFree (out_d);
}

static void
test_layer_backward (gconstpointer data)
{
  Case *c = case_new (data);
  Report r = { g_strconcat ("layer-backward/", c->name, NULL), 0, 0 };
  guint64 n = c->n, h = c->h, e = c->e;
  guint np = c->m->params->len;
  double tol = c->bf16 ? TOL_BF16 : TOL_F32;

  g_autofree void *x = g_malloc (n * h * e);
  g_autofree void *dout = g_malloc (n * h * e);
  fill (x, n * h, c->bf16, c->rng, 1);
  fill (dout, n * h, c->bf16, c->rng, 1);
  void *xd = dev_dup (x, n * h * e);
  g_autofree void *dx_cpu = g_malloc (n * h * e);
  g_autofree void *dx_gpu = g_malloc (n * h * e);
  g_autofree void *dx_gpu2 = g_malloc (n * h * e);
  g_autofree void **g0 = g_new0 (void *, np);
  g_autofree void **gg = g_new0 (void *, np);
  for (guint i = layer_first (); i < layer_first () + c->m->per_layer; i++)
    {
      g0[i] = g_malloc (param_elems (c, i) * e);
      gg[i] = g_malloc (param_elems (c, i) * e);
      fill (g0[i], param_elems (c, i), c->bf16, c->rng, 0.5);
    }

  for (int acc = 0; acc < 2; acc++)
    {
      /* "=" into gradients full of other values; "+=" onto them, with dx
       * written over x (aliasing). */
      upload (xd, x, n * h * e);
      backward_once (c, x, xd, dout, g0, acc, acc, dx_cpu, dx_gpu);
      g_autofree char *what
          = g_strdup_printf ("dx (%s)", acc ? "+=, aliased" : "=");
      report (&r, what, dx_cpu, dx_gpu, n * h, c->bf16, tol);
      for (guint i = layer_first (); i < layer_first () + c->m->per_layer; i++)
        {
          download (gg[i], c->dg[i], param_elems (c, i) * e);
          g_autofree char *name = g_strdup_printf ("d%s %s", param (c, i)->name,
                                                   acc ? "+=" : "=");
          report (&r, name, param (c, i)->g, gg[i], param_elems (c, i), c->bf16,
                  tol);
        }
    }

  /* Determinism: the same backward twice, the same bytes. */
  upload (xd, x, n * h * e);
  backward_once (c, x, xd, dout, g0, FALSE, FALSE, dx_cpu, dx_gpu);
  for (guint i = layer_first (); i < layer_first () + c->m->per_layer; i++)
    download (gg[i], c->dg[i], param_elems (c, i) * e);
  backward_once (c, x, xd, dout, g0, FALSE, FALSE, dx_cpu, dx_gpu2);
  gboolean same = memcmp (dx_gpu, dx_gpu2, n * h * e) == 0;
  for (guint i = layer_first (); i < layer_first () + c->m->per_layer; i++)
    {
      g_autofree void *again = g_malloc (param_elems (c, i) * e);
      download (again, c->dg[i], param_elems (c, i) * e);
      same = same && memcmp (again, gg[i], param_elems (c, i) * e) == 0;
    }
  g_printerr ("  %-36s two runs give identical dx and gradients: %s\n", r.test,
              same ? "yes" : "NO");
  r.failures += !same;

  for (guint i = 0; i < np; i++)
    {
      g_free (g0[i]);
      g_free (gg[i]);
    }
  cudaFree (xd);
  report_done (&r);
  g_free ((char *)r.test);
  case_free (c);
}

/* ---- attention alone: tensor cores against the fp32 kernels
 * -------------------- */

typedef struct
{
  guint64 batch, seq, a, kv, d;
} AttnShape;

/* GPU only, so it scales to long sequences: the bf16 runtime's attention
 * on tensor cores against the fp32 runtime's kernels (the oracle) on the
 * same inputs (bf16 values, exact in fp32), 2e-2 relative per tensor; the
 * bf16 runtime's CUDA-core kernels printed beside for scale; two runs of
 * the tensor-core forward and backward must give the same bytes. */
static void
test_attention_tc (gconstpointer data)
{
  const AttnShape *sh = data;
  guint64 B = sh->batch, T = sh->seq, a = sh->a, kv = sh->kv, d = sh->d;
  guint64 n = B * T, nq = n * a * d, nk = n * kv * d, nl = n * a;
  StowLlamaConfig cfg = { .hidden = a * d,
                          .n_layers = 1,
                          .n_heads = a,
                          .n_kv_heads = kv,
                          .head_dim = d,
                          .ffn = 64,
                          .vocab = 64,
                          .rope_theta = 10000,
                          .rms_norm_eps = 1e-5 };
  g_autofree char *name = g_strdup_printf (
      "attention-tc/b%" G_GUINT64_FORMAT "-t%" G_GUINT64_FORMAT
      "-a%" G_GUINT64_FORMAT "-kv%" G_GUINT64_FORMAT "-d%" G_GUINT64_FORMAT,
      B, T, a, kv, d);
  Report r = { name, 0, 0 };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowLlamaCuda) g16
      = stow_llama_cuda_new (&cfg, STOW_DTYPE_BF16, n, T, stream, &error);
  g_assert_no_error (error);
  g_autoptr (StowLlamaCuda) g32
      = stow_llama_cuda_new (&cfg, STOW_DTYPE_F32, n, T, stream, &error);
  g_assert_no_error (error);
  if (!stow_llama_cuda_attention_use_tc (g16, TRUE))
    {
      g_test_skip ("no tensor-core attention on this device");
      return;
    }
  g_assert_false (stow_llama_cuda_attention_use_tc (g32, TRUE));

  /* Inputs: bf16, their fp32 twins. Scores of a few units (q, k ~ 2). */
  g_autoptr (GRand) rng = g_rand_new_with_seed (7 + T + d);
  guint64 sizes[4] = { nq, nk, nk, nq }; /* q, k, v, dout */
  double amp[4] = { 2, 2, 1, 1 };
  guint16 *in16[4];
  float *in32[4];
  void *d16[4], *d32[4];
  for (guint t = 0; t < 4; t++)
    {
      in16[t] = g_new (guint16, sizes[t]);
      in32[t] = g_new (float, sizes[t]);
      fill (in16[t], sizes[t], TRUE, rng, amp[t]);
      for (guint64 i = 0; i < sizes[t]; i++)
        in32[t][i] = stow_bf16_to_f32 (in16[t][i]);
      d16[t] = dev_dup (in16[t], 2 * sizes[t]);
      d32[t] = dev_dup (in32[t], 4 * sizes[t]);
    }
  /* Outputs: o, dq, dk, dv per runtime and path, lse fp32. */
  guint64 osz[4] = { nq, nq, nk, nk };
  const char *onames[4] = { "o", "dq", "dk", "dv" };
  void *o32[4], *o16[4];
  float *lse32 = dev_alloc (4 * nl), *lse16 = dev_alloc (4 * nl);
  for (guint t = 0; t < 4; t++)
    {
      o32[t] = dev_alloc (4 * osz[t]);
      o16[t] = dev_alloc (2 * osz[t]);
    }

  /* fp32 oracle. */
  stow_llama_cuda_attention_forward (g32, B, T, d32[0], d32[1], d32[2], o32[0],
                                     lse32);
  stow_llama_cuda_attention_backward (g32, B, T, d32[0], d32[1], d32[2], o32[0],
                                      lse32, d32[3], o32[1], o32[2], o32[3]);
  float *ref[4];
  g_autofree float *lse_ref = g_new (float, nl);
  for (guint t = 0; t < 4; t++)
    {
      ref[t] = g_new (float, osz[t]);
      download (ref[t], o32[t], 4 * osz[t]);
    }
  download (lse_ref, lse32, 4 * nl);
  runtime_ok (g32);

  /* bf16: tensor cores (twice: the same bytes), then the CUDA cores. The
   * backward of each path from its own forward's o and lse. */
  guint16 *got[2][4];
  g_autofree float *lse_got = g_new (float, nl);
  g_autofree float *lse_again = g_new (float, nl);
  g_autofree float *lse_cc = g_new (float, nl);
  for (int run = 0; run < 3; run++)
    {
      stow_llama_cuda_attention_use_tc (g16, run < 2);
      for (guint t = 0; t < 4; t++)
        cuda_check (cudaMemsetAsync (o16[t], 0xff, 2 * osz[t], stream),
                    "memset");
      stow_llama_cuda_attention_forward (g16, B, T, d16[0], d16[1], d16[2],
                                         o16[0], lse16);
      stow_llama_cuda_attention_backward (g16, B, T, d16[0], d16[1], d16[2],
                                          o16[0], lse16, d16[3], o16[1], o16[2],
                                          o16[3]);
      guint slot = run == 0 ? 0 : 1;
      for (guint t = 0; t < 4; t++)
        {
          if (run != 1)
            got[slot][t] = g_new (guint16, osz[t]);
          guint16 *dst = run == 1 ? g_new (guint16, osz[t]) : got[slot][t];
          download (dst, o16[t], 2 * osz[t]);
          if (run == 1)
            {
              gboolean same = memcmp (dst, got[0][t], 2 * osz[t]) == 0;
              g_printerr ("  %-36s %-12s two tensor-core runs identical: %s\n",
                          r.test, onames[t], same ? "yes" : "NO");
              r.failures += !same;
              g_free (dst);
            }
        }
      download (run == 0   ? lse_got
                : run == 1 ? lse_again
                           : lse_cc,
                lse16, 4 * nl);
      runtime_ok (g16);
    }
  gboolean lse_same = memcmp (lse_got, lse_again, 4 * nl) == 0;
  g_printerr ("  %-36s %-12s two tensor-core runs identical: %s\n", r.test,
              "lse", lse_same ? "yes" : "NO");
  r.failures += !lse_same;

  for (guint t = 0; t < 4; t++)
    {
      g_autofree float *f = g_new (float, osz[t]);
      g_autofree float *fc = g_new (float, osz[t]);
      for (guint64 i = 0; i < osz[t]; i++)
        {
          f[i] = stow_bf16_to_f32 (got[0][t][i]);
          fc[i] = stow_bf16_to_f32 (got[1][t][i]);
        }
      g_autofree char *what = g_strdup_printf ("%s tc", onames[t]);
      report (&r, what, ref[t], f, osz[t], FALSE, TOL_BF16);
      g_printerr ("  %-36s %-12s (bf16 CUDA cores: max rel err %.3e)\n", r.test,
                  onames[t], rel_err (ref[t], fc, osz[t], FALSE));
    }
  report (&r, "lse tc", lse_ref, lse_got, nl, FALSE, TOL_BF16);
  g_printerr ("  %-36s %-12s (bf16 CUDA cores: max rel err %.3e)\n", r.test,
              "lse", rel_err (lse_ref, lse_cc, nl, FALSE));

  for (guint t = 0; t < 4; t++)
    {
      g_free (in16[t]);
      g_free (in32[t]);
      g_free (ref[t]);
      g_free (got[0][t]);
      g_free (got[1][t]);
      cudaFree (d16[t]);
      cudaFree (d32[t]);
      cudaFree (o16[t]);
      cudaFree (o32[t]);
    }
  cudaFree (lse16);
  cudaFree (lse32);
  report_done (&r);
}

/* ---- output layer and loss
 * ------------------------------------------------------- */

static void
test_head_loss (gconstpointer data)
{
  Case *c = case_new (data);
  Report r = { g_strconcat ("head-loss/", c->name, NULL), 0, 0 };
  guint64 n = c->n, h = c->h, V = c->V, e = c->e;
  double tol = c->bf16 ? TOL_BF16 : TOL_F32;
  guint inorm = param_index (c, "norm");
  guint ihead = param_index (c, c->cfg.tied ? "embed" : "lm_head");
  /* A chunk that does not divide n: several chunks, a short last one. */
  guint64 chunk = 7;
  double scale = 1.0 / (double)n;

  g_autofree void *x = g_malloc (n * h * e);
  fill (x, n * h, c->bf16, c->rng, 1);
  void *xd = dev_dup (x, n * h * e);
  g_autofree void *dn0 = g_malloc (h * e);
  g_autofree void *dh0 = g_malloc (V * h * e);
  fill (dn0, h, c->bf16, c->rng, 0.5);
  fill (dh0, V * h, c->bf16, c->rng, 0.5);
  g_autofree void *dn_c = g_malloc (h * e), *dn_g = g_malloc (h * e);
  g_autofree void *dh_c = g_malloc (V * h * e), *dh_g = g_malloc (V * h * e);
  g_autofree void *dx_c = g_malloc (n * h * e), *dx_g = g_malloc (n * h * e);
  guint64 sf = stow_llama_loss_scratch_floats (V, h, chunk);
  g_autofree float *scratch = g_new (float, sf);
  float *scratch_d = dev_alloc (4 * sf);
  void *dn_d = dev_alloc (h * e), *dh_d = dev_alloc (V * h * e);
  void *dx_d = dev_alloc (n * h * e);
  double *loss_d = dev_alloc (sizeof (double));

  for (int acc = 0; acc < 2; acc++)
    {
      memcpy (dn_c, dn0, h * e);
      memcpy (dh_c, dh0, V * h * e);
      upload (dn_d, dn0, h * e);
      upload (dh_d, dh0, V * h * e);
      upload (xd, x, n * h * e);
      /* The loss is added to what is there. */
      double start = 0.25;
      upload (loss_d, &start, sizeof start);
      double loss_c = test_llama_head_loss (
          c->m->rt, n, param (c, inorm)->w, param (c, ihead)->w, x,
          c->m->targets, scale, dn_c, dh_c, acc, dx_c, scratch, chunk);
      /* "+=" writes dx over x. */
      void *dxg = acc ? xd : dx_d;
      stow_decoder_head_loss (stow_llama_cuda_decoder (c->g), n, c->dw[inorm],
                              c->dw[ihead], xd, c->dtargets, scale, dn_d, dh_d,
                              acc, dxg, scratch_d, chunk, loss_d);
      double loss_g;
      download (&loss_g, loss_d, sizeof loss_g);
      download (dn_g, dn_d, h * e);
      download (dh_g, dh_d, V * h * e);
      download (dx_g, dxg, n * h * e);
      runtime_ok (c->g);
      double lerr = fabs ((loss_g - start) - loss_c) / fabs (loss_c);
      gboolean ok = lerr <= tol;
      g_printerr ("  %-36s %-12s max rel err %.3e  tol %.0e  %s (cpu %.9g, "
                  "gpu %.9g)\n",
                  r.test, acc ? "loss +=" : "loss =", lerr, tol,
                  ok ? "ok" : "FAIL", loss_c, loss_g - start);
      r.failures += !ok;
      r.worst = MAX (r.worst, lerr);
      report (&r, acc ? "dx (aliased)" : "dx", dx_c, dx_g, n * h, c->bf16, tol);
      report (&r, acc ? "dnorm +=" : "dnorm =", dn_c, dn_g, h, c->bf16, tol);
      report (&r, acc ? "dhead +=" : "dhead =", dh_c, dh_g, V * h, c->bf16,
              tol);
    }

  /* The logits alone. */
  g_autofree float *lg_c = g_new (float, n *V);
  g_autofree float *lg_g = g_new (float, n *V);
  float *lg_d = dev_alloc (4 * n * V);
  test_llama_head_logits (c->m->rt, n, param (c, inorm)->w, param (c, ihead)->w,
                          x, lg_c);
  upload (xd, x, n * h * e);
  float *xn_d = dev_alloc (4 * n * h);
  stow_decoder_head_logits (stow_llama_cuda_decoder (c->g), n, c->dw[inorm],
                            c->dw[ihead], xd, lg_d, xn_d);
  download (lg_g, lg_d, 4 * n * V);
  runtime_ok (c->g);
  report (&r, "logits", lg_c, lg_g, n * V, FALSE, tol);

  cudaFree (lg_d);
  cudaFree (xn_d);
  cudaFree (xd);
  cudaFree (scratch_d);
  cudaFree (dn_d);
  cudaFree (dh_d);
  cudaFree (dx_d);
  cudaFree (loss_d);
  report_done (&r);
  g_free ((char *)r.test);
  case_free (c);
}

/* ---- optimizer
 * --------------------------------------------------------------------- */

static StowLlamaCuda *
optim_runtime (void)
{
  g_autoptr (GError) error = NULL;
  StowLlamaConfig cfg = cases[0].cfg;
  StowLlamaCuda *g
      = stow_llama_cuda_new (&cfg, STOW_DTYPE_F32, 64, 64, stream, &error);
  g_assert_no_error (error);
  return g;
}

static void
fill_grad (void *p, StowDtype t, guint64 n, GRand *rng, double scale)
{
  for (guint64 i = 0; i < n; i++)
    {
      float v = (float)(scale * g_rand_double_range (rng, -1, 1));
      if (t == STOW_DTYPE_F32)
        ((float *)p)[i] = v;
      else if (t == STOW_DTYPE_BF16)
        ((guint16 *)p)[i] = stow_f32_to_bf16 (v);
      else
        ((guint16 *)p)[i] = stow_f32_to_f16 (v);
    }
}

static void
test_sumsq (void)
{
  g_autoptr (StowLlamaCuda) g = optim_runtime ();
  g_autoptr (StowAdam) adam = stow_adam_new (2, STOW_ISA_SCALAR, NULL);
  g_autoptr (GRand) rng = g_rand_new_with_seed (5);
  StowCudaOptimState *sd = dev_alloc (sizeof *sd);
  /* Past 4096 * 8192 elements the blocks grow beyond the minimum. */
  const guint64 sizes[] = { 5, 100003, 34000001 };
  const StowDtype types[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  guint failures = 0;
  for (guint si = 0; si < G_N_ELEMENTS (sizes); si++)
    for (guint ti = 0; ti < G_N_ELEMENTS (types); ti++)
      {
        guint64 n = sizes[si];
        StowDtype t = types[ti];
        if (n > 1000000 && t == STOW_DTYPE_F32)
          continue; /* the large size once per 16-bit type is enough */
        guint64 bytes = n * stow_dtype_size (t);
        g_autofree void *gr = g_malloc (bytes);
        fill_grad (gr, t, n, rng, 3);
        double ref = 0;
        g_assert_cmpint (stow_adam_grad_sumsq (adam, gr, t, n, &ref), ==, 0);
        void *gd = dev_dup (gr, bytes);
        StowCudaOptimState s0 = { 0 };
        upload (sd, &s0, sizeof s0);
        stow_llama_cuda_grad_sumsq (g, gd, t, n, sd);
        StowCudaOptimState s;
        download (&s, sd, sizeof s);
        runtime_ok (g);
        double err = fabs (s.sumsq - ref) / ref;
        gboolean ok = err <= 1e-12;
        g_printerr ("  sumsq %-6s n %-9" G_GUINT64_FORMAT
                    " rel err %.3e  tol 1e-12  %s%s\n",
                    stow_dtype_nick (t), n, err, ok ? "ok" : "FAIL",
                    s.sumsq == ref ? " (bit-identical)" : "");
        failures += !ok;
        cudaFree (gd);
      }
  cudaFree (sd);
  g_assert_cmpuint (failures, ==, 0);
}

/* One AdamW step on the GPU (sumsq, clip, adam) and on the CPU
 * (stow_adam_grad_sumsq, stow_adam_clip_coef, stow_adam_step): param, m,
 * v and the output copy must be the same bytes. */
static gboolean
adam_case (StowLlamaCuda *g, StowAdam *adam, GRand *rng, StowDtype gt,
           StowDtype ot, StowAdamMode mode, double wd, double max_norm,
           gboolean nan_grad)
{
  const guint64 n = 10007;
  const double loss_scale = 1024;
  guint64 gb = n * stow_dtype_size (gt), ob = n * stow_dtype_size (ot);
  g_autofree float *p = g_new (float, n), *m = g_new (float, n);
  g_autofree float *v = g_new (float, n);
  g_autofree void *gr = g_malloc (gb);
  g_autofree void *out = g_malloc (MAX (ob, 1));
  for (guint64 i = 0; i < n; i++)
    {
      p[i] = (float)g_rand_double_range (rng, -1, 1);
      m[i] = (float)g_rand_double_range (rng, -1e-2, 1e-2);
      v[i] = (float)g_rand_double_range (rng, 0, 1e-4);
    }
  fill_grad (gr, gt, n, rng, loss_scale);
  if (nan_grad)
    ((float *)gr)[17] = NAN;
  memset (out, 0x5a, MAX (ob, 1));
  float *pd = dev_dup (p, 4 * n), *md = dev_dup (m, 4 * n);
  float *vd = dev_dup (v, 4 * n);
  void *gd = dev_dup (gr, gb);
  void *od = ot != STOW_DTYPE_NONE ? dev_dup (out, ob) : NULL;

  StowAdamConfig cfg;
  stow_adam_config_init (&cfg);
  cfg.mode = mode;
  cfg.weight_decay = wd;
  cfg.lr = 3e-3;

  /* GPU */
  StowCudaOptimState *sd = dev_alloc (sizeof *sd);
  StowCudaOptimState s0 = { 0 }, s;
  upload (sd, &s0, sizeof s0);
  stow_llama_cuda_grad_sumsq (g, gd, gt, n, sd);
  stow_llama_cuda_clip (g, loss_scale, max_norm, sd);
  StowAdamStep st = { .step = 3, .loss_scale = loss_scale, .clip_coef = 99 };
  StowAdamTensor td = { pd, md, vd, gd, gt, od, ot, n };
  stow_llama_cuda_adam (g, &cfg, &st, &td, sd);
  download (&s, sd, sizeof s);
  g_autofree float *pg = g_new (float, n), *mg = g_new (float, n);
  g_autofree float *vg = g_new (float, n);
  g_autofree void *og = g_malloc (MAX (ob, 1));
  download (pg, pd, 4 * n);
  download (mg, md, 4 * n);
  download (vg, vd, 4 * n);
  if (ot != STOW_DTYPE_NONE)
    download (og, od, ob);
  runtime_ok (g);

  /* CPU */
  double sumsq = 0;
  g_assert_cmpint (stow_adam_grad_sumsq (adam, gr, gt, n, &sumsq), ==, 0);
  double norm = sqrt (sumsq) / loss_scale;
  double coef = stow_adam_clip_coef (norm, max_norm);
  gboolean skip = !stow_adam_grads_ok (sumsq, loss_scale, coef);
  g_autofree float *p0 = g_memdup2 (p, 4 * n), *m0 = g_memdup2 (m, 4 * n);
  g_autofree float *v0 = g_memdup2 (v, 4 * n);
  g_autofree void *o0 = g_memdup2 (out, MAX (ob, 1));
  if (!skip)
    {
      StowAdamStep cs = { 3, loss_scale, coef, FALSE };
      StowAdamTensor tc
          = { p, m, v, gr, gt, ot != STOW_DTYPE_NONE ? out : NULL, ot, n };
      g_autoptr (GError) error = NULL;
      stow_adam_step (adam, &cfg, &cs, &tc, &error);
      g_assert_no_error (error);
    }

  gboolean state_ok = (s.skip != 0) == skip
                      && (skip || (s.norm == norm && s.clip_coef == coef));
  gboolean same = memcmp (p, pg, 4 * n) == 0 && memcmp (m, mg, 4 * n) == 0
                  && memcmp (v, vg, 4 * n) == 0
                  && (ot == STOW_DTYPE_NONE || memcmp (out, og, ob) == 0);
  gboolean untouched
      = !skip
        || (memcmp (p0, pg, 4 * n) == 0 && memcmp (m0, mg, 4 * n) == 0
            && memcmp (v0, vg, 4 * n) == 0
            && (ot == STOW_DTYPE_NONE || memcmp (o0, og, ob) == 0));
  double perr = 0;
  for (guint64 i = 0; i < n; i++)
    perr = MAX (perr, fabs ((double)pg[i] - p[i]));
  g_printerr ("  adam grad %-4s out %-4s %-5s wd %-5g max_norm %-3g%s: "
              "clip %.6g skip %d (cpu %d), max |dparam| %.3e, "
              "bit-identical %s%s\n",
              stow_dtype_nick (gt), stow_dtype_nick (ot),
              mode == STOW_ADAM_ADAMW ? "adamw" : "l2", wd, max_norm,
              nan_grad ? " NaN grad" : "", s.clip_coef, s.skip, skip, perr,
              same ? "yes" : "NO",
              skip ? (untouched ? ", nothing written" : ", WRITTEN") : "");
  cudaFree (pd);
  cudaFree (md);
  cudaFree (vd);
  cudaFree (gd);
  cudaFree (od);
  cudaFree (sd);
  return state_ok && same && untouched;
}

static void
test_adam (void)
{
  g_autoptr (StowLlamaCuda) g = optim_runtime ();
  g_autoptr (StowAdam) adam = stow_adam_new (2, STOW_ISA_SCALAR, NULL);
  g_autoptr (GRand) rng = g_rand_new_with_seed (11);
  const StowDtype gts[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  const StowDtype ots[]
      = { STOW_DTYPE_NONE, STOW_DTYPE_F32, STOW_DTYPE_BF16, STOW_DTYPE_F16 };
  const struct
  {
    StowAdamMode mode;
    double wd;
  } modes[] = { { STOW_ADAM_ADAMW, 0.1 },
                { STOW_ADAM_ADAMW, 0 },
                { STOW_ADAM_L2, 0.01 } };
  guint failures = 0, k = 0;
  for (guint a = 0; a < G_N_ELEMENTS (gts); a++)
    for (guint b = 0; b < G_N_ELEMENTS (ots); b++)
      for (guint mi = 0; mi < G_N_ELEMENTS (modes); mi++, k++)
        /* Clipping on every other case (the norm is about 58: 1.0 clips). */
        failures += !adam_case (g, adam, rng, gts[a], ots[b], modes[mi].mode,
                                modes[mi].wd, k % 2 ? 0 : 1.0, FALSE);
  /* A NaN gradient: skip set, nothing written. */
  failures += !adam_case (g, adam, rng, STOW_DTYPE_F32, STOW_DTYPE_BF16,
                          STOW_ADAM_ADAMW, 0.1, 1.0, TRUE);
  g_assert_cmpuint (failures, ==, 0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_autoptr (GError) error = NULL;
  if (!stow_cuda_available (&error))
    {
      g_print ("skip: %s\n", error->message);
      return 77;
    }
  int dev = 0;
  struct cudaDeviceProp prop;
  cuda_check (cudaGetDevice (&dev), "cudaGetDevice");
  cuda_check (cudaGetDeviceProperties (&prop, dev), "cudaGetDeviceProperties");
  g_printerr ("# device %d: %s, sm_%d%d, %d SMs\n", dev, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount);
  cuda_check (cudaStreamCreate (&stream), "cudaStreamCreate");

  static CaseData data[G_N_ELEMENTS (cases) * 2];
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    for (guint j = 0; j < 2; j++)
      {
        CaseData *cd = &data[2 * i + j];
        cd->desc = &cases[i];
        cd->dtype = j ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
        const char *dt = stow_dtype_nick (cd->dtype);
        const char *nm = cases[i].name;
        struct
        {
          const char *what;
          GTestDataFunc fn;
        } tests[] = {
          { "embed", test_embed },
          { "layer-forward", test_layer_forward },
          { "layer-backward", test_layer_backward },
          { "head-loss", test_head_loss },
        };
        for (guint t = 0; t < G_N_ELEMENTS (tests); t++)
          {
            g_autofree char *path
                = g_strdup_printf ("/gpu/%s/%s/%s", tests[t].what, nm, dt);
            g_test_add_data_func (path, cd, tests[t].fn);
          }
      }
  static const AttnShape attn_shapes[] = {
    { 2, 256, 2, 1, 128 },  /* the layer case head128's shape */
    { 1, 200, 4, 2, 64 },   /* a partial last tile */
    { 2, 33, 4, 2, 16 },    /* the small cases' head */
    { 1, 100, 4, 1, 160 },  /* d > 128: 32-row tiles where 64 do not fit */
    { 1, 77, 2, 2, 256 },   /* the largest head_dim */
    { 1, 2048, 4, 1, 128 }, /* long: 32 query tiles, a group of 4 */
    { 2, 1024, 4, 4, 64 },
  };
  for (guint i = 0; i < G_N_ELEMENTS (attn_shapes); i++)
    {
      const AttnShape *a = &attn_shapes[i];
      g_autofree char *path = g_strdup_printf (
          "/gpu/attention-tc/b%" G_GUINT64_FORMAT "-t%" G_GUINT64_FORMAT
          "-a%" G_GUINT64_FORMAT "-kv%" G_GUINT64_FORMAT "-d%" G_GUINT64_FORMAT,
          a->batch, a->seq, a->a, a->kv, a->d);
      g_test_add_data_func (path, a, test_attention_tc);
    }
  g_test_add_func ("/gpu/optim/sumsq", test_sumsq);
  g_test_add_func ("/gpu/optim/adam", test_adam);
  int rc = g_test_run ();
  cudaStreamDestroy (stream);
  return rc;
}
