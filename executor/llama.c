/* SPDX-License-Identifier: MIT
 *
 * executor/llama.c: the LLaMA-family decoder runtime (executor/llama.h):
 * its workspace, the sizes and carving of the saved tensors, the embedding,
 * one decoder layer's forward and backward as a sequence of GEMMs and row
 * kernels, and the output layer fused with the cross-entropy.  The kernels
 * live in llama-kernels.c and llama-attention.c.
 */
#include "executor/llama-private.h"
#include "planner/program.h" /* the fused loss's chunk rule */

#include <omp.h>

/* clang-format off */
G_DEFINE_QUARK (stow-llama-error-quark, stow_llama_error)
/* clang-format on */

/* ---- configuration and workspace ----------------------------------------- */

static gboolean
check_config (const StowLlamaConfig *c, StowFloatType dtype, guint64 max_seq,
              GError **error)
{
  struct
  {
    const char *name;
    guint64 v;
  } sizes[] = {
    { "hidden", c->hidden },
    { "n_heads", c->n_heads },
    { "n_kv_heads", c->n_kv_heads },
    { "head_dim", c->head_dim },
    { "ffn", c->ffn },
    { "vocab", c->vocab },
    { "max_seq", max_seq },
  };
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    if (sizes[i].v == 0)
      {
        g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                     "llama config: %s is 0", sizes[i].name);
        return FALSE;
      }
  if (c->n_heads % c->n_kv_heads != 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: n_kv_heads (%" G_GUINT64_FORMAT
                   ") must divide n_heads (%" G_GUINT64_FORMAT ")",
                   c->n_kv_heads, c->n_heads);
      return FALSE;
    }
  if (c->head_dim % 2 != 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: head_dim (%" G_GUINT64_FORMAT
                   ") must be even (rotary embeddings rotate pairs)",
                   c->head_dim);
      return FALSE;
    }
  /* cblas takes int sizes: every GEMM dimension must fit one. */
  guint64 big = MAX (MAX (c->hidden, c->ffn), MAX (c->vocab, max_seq));
  if (big > G_MAXINT || c->n_heads * c->head_dim > G_MAXINT)
    {
      g_set_error (
          error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
          "llama config: a dimension above %d (hidden %" G_GUINT64_FORMAT
          ", ffn %" G_GUINT64_FORMAT ", vocab %" G_GUINT64_FORMAT
          ", max_seq %" G_GUINT64_FORMAT ")",
          G_MAXINT, c->hidden, c->ffn, c->vocab, max_seq);
      return FALSE;
    }
  if (!(c->rope_theta > 0))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: rope_theta (%g) must be positive",
                   c->rope_theta);
      return FALSE;
    }
  if (!(c->rms_norm_eps >= 0))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: rms_norm_eps (%g) must not be negative",
                   c->rms_norm_eps);
      return FALSE;
    }
  if (c->rope_factor != 0
      && (!(c->rope_factor > 0)
          || !(c->rope_high_freq_factor > c->rope_low_freq_factor)
          || !(c->rope_low_freq_factor > 0)
          || c->rope_original_max_positions == 0))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: rope_scaling (llama3) needs rope_factor > "
                   "0, 0 < rope_low_freq_factor < rope_high_freq_factor and "
                   "rope_original_max_positions > 0 (got %g, %g, %g, "
                   "%" G_GUINT64_FORMAT ")",
                   c->rope_factor, c->rope_low_freq_factor,
                   c->rope_high_freq_factor, c->rope_original_max_positions);
      return FALSE;
    }
  if (dtype != STOW_FLOAT_F32 && dtype != STOW_FLOAT_BF16)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama runtime: dtype %s: runs fp32 and bf16",
                   stow_float_type_name (dtype));
      return FALSE;
    }
  return TRUE;
}

/* Inverse frequency i of d/2, with Llama 3's scaling as HF's
 * _compute_llama3_parameters applies it: long wavelengths divided by the
 * factor, short ones kept, the band between interpolated. */
static double
rope_inv_freq (const StowLlamaConfig *c, guint64 i)
{
  double d = (double)c->head_dim;
  double inv = 1.0 / pow (c->rope_theta, (double)(2 * i) / d);
  if (c->rope_factor == 0)
    return inv;
  double old = (double)c->rope_original_max_positions;
  double low_wavelen = old / c->rope_low_freq_factor;
  double high_wavelen = old / c->rope_high_freq_factor;
  double wavelen = 2 * G_PI / inv;
  if (wavelen < high_wavelen)
    return inv;
  if (wavelen > low_wavelen)
    return inv / c->rope_factor;
  double smooth = (old / wavelen - c->rope_low_freq_factor)
                  / (c->rope_high_freq_factor - c->rope_low_freq_factor);
  return (1 - smooth) * inv / c->rope_factor + smooth * inv;
}

StowLlama *
stow_llama_new (const StowLlamaConfig *config, StowFloatType dtype,
                guint64 max_seq, guint n_threads, GError **error)
{
  g_return_val_if_fail (config != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  if (!check_config (config, dtype, max_seq, error))
    return NULL;

  StowLlama *L = g_new0 (StowLlama, 1);
  const StowLlamaConfig *c = &L->config;
  L->config = *config;
  L->dtype = dtype;
  L->bf16 = dtype == STOW_FLOAT_BF16;
  L->esize = stow_float_type_size (dtype);
  L->max_seq = max_seq;
  L->n_threads = n_threads ? n_threads : g_get_num_processors ();

  guint64 d = c->head_dim, half = d / 2;
  L->row_floats = MAX (MAX (c->hidden, c->ffn), c->n_heads * d);
  guint64 per_thread = MAX (4 * L->row_floats,
                            stow_llama_attention_thread_floats (max_seq, d));
  /* Whole cache lines per thread: no two threads share one. */
  L->thread_floats = (per_thread + 15) / 16 * 16;
  L->thread_ws
      = g_aligned_alloc (L->thread_floats * L->n_threads, sizeof (float), 64);
  L->rope_cos = g_aligned_alloc (max_seq * half, sizeof (float), 64);
  L->rope_sin = g_aligned_alloc (max_seq * half, sizeof (float), 64);
  L->col_acc = g_aligned_alloc (c->hidden, sizeof (double), 64);
  guint64 gemm_floats = 0;
  if (L->bf16)
    {
      gemm_floats = 3 * (guint64)STOW_LLAMA_GEMM_BLOCK * STOW_LLAMA_GEMM_BLOCK;
      L->gemm_ws = g_aligned_alloc (gemm_floats, sizeof (float), 64);
    }
  L->ws_bytes
      = 4 * (L->thread_floats * L->n_threads + 2 * max_seq * half + gemm_floats)
        + 8 * c->hidden;

  /* Angles in double, rounded once: positions times frequencies stay
   * exact far past where an fp32 product would lose the phase. */
  for (guint64 i = 0; i < half; i++)
    {
      double inv = rope_inv_freq (c, i);
      for (guint64 t = 0; t < max_seq; t++)
        {
          L->rope_cos[t * half + i] = (float)cos ((double)t * inv);
          L->rope_sin[t * half + i] = (float)sin ((double)t * inv);
        }
    }
  return L;
}

void
stow_llama_free (StowLlama *L)
{
  if (L == NULL)
    return;
  g_aligned_free (L->thread_ws);
  g_aligned_free (L->rope_cos);
  g_aligned_free (L->rope_sin);
  g_aligned_free (L->col_acc);
  g_aligned_free (L->gemm_ws);
  g_free (L);
}

const StowLlamaConfig *
stow_llama_get_config (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, NULL);
  return &L->config;
}

StowFloatType
stow_llama_get_dtype (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, STOW_FLOAT_NONE);
  return L->dtype;
}

guint
stow_llama_get_n_threads (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, 0);
  return L->n_threads;
}

guint64
stow_llama_workspace_bytes (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, 0);
  return L->ws_bytes;
}

/* ---- sizes --------------------------------------------------------------- */

/* Elements per token of the saved tensors of the runtime's dtype:
 * 4 h + 2 a d + 2 k d + 3 f (xn1, q, k, v, o, h1, xn2, gate, up, act,
 * out). */
static guint64
saved_elems_per_token (const StowLlamaConfig *c)
{
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
  return 4 * c->hidden + 2 * ad + 2 * kd + 3 * c->ffn;
}

guint64
stow_llama_config_saved_bytes (const StowLlamaConfig *c, guint64 esize,
                               guint64 n_tokens)
{
  return esize * n_tokens * saved_elems_per_token (c)
         + 4 * n_tokens * c->n_heads;
}

guint64
stow_llama_config_out_bytes (const StowLlamaConfig *c, guint64 esize,
                             guint64 n_tokens)
{
  return esize * n_tokens * c->hidden;
}

guint64
stow_llama_config_backward_ws_bytes (const StowLlamaConfig *c, guint64 esize,
                                     guint64 n_tokens)
{
  return esize * n_tokens * saved_elems_per_token (c);
}

void
stow_llama_config_saved_carve (const StowLlamaConfig *c, guint64 e,
                               guint64 n, void *rest, void *out,
                               StowLlamaSaved *s)
{
  g_return_if_fail (c != NULL && s != NULL);
  g_return_if_fail (((guintptr)rest & 3) == 0);
  guint64 h = c->hidden, f = c->ffn;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
  memset (s, 0, sizeof *s);
  s->out = out;
  if (rest == NULL)
    return;
  /* lse first: fp32 at the start keeps every tensor aligned to its
   * element type with no padding whatever n is. */
  guint8 *p = rest;
  s->lse = (float *)p, p += 4 * n * c->n_heads;
  s->xn1 = p, p += e * n * h;
  s->q = p, p += e * n * ad;
  s->k = p, p += e * n * kd;
  s->v = p, p += e * n * kd;
  s->o = p, p += e * n * ad;
  s->h1 = p, p += e * n * h;
  s->xn2 = p, p += e * n * h;
  s->gate = p, p += e * n * f;
  s->up = p, p += e * n * f;
  s->act = p, p += e * n * f;
  g_assert ((guint64)(p - (guint8 *)rest)
            == stow_llama_config_saved_bytes (c, e, n)
                   - stow_llama_config_out_bytes (c, e, n));
}

guint64
stow_llama_saved_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_saved_bytes (&L->config, L->esize, n_tokens);
}

guint64
stow_llama_out_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_out_bytes (&L->config, L->esize, n_tokens);
}

guint64
stow_llama_backward_ws_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_backward_ws_bytes (&L->config, L->esize, n_tokens);
}

void
stow_llama_saved_carve (const StowLlama *L, guint64 n, void *rest, void *out,
                        StowLlamaSaved *s)
{
  g_return_if_fail (L != NULL);
  stow_llama_config_saved_carve (&L->config, L->esize, n, rest, out, s);
}

/* ---- embedding ----------------------------------------------------------- */

static gboolean
tokens_ok (const StowLlama *L, const gint32 *tokens, guint64 n)
{
  for (guint64 i = 0; i < n; i++)
    if (tokens[i] < 0 || (guint64)tokens[i] >= L->config.vocab)
      {
        g_critical ("llama: token %" G_GUINT64_FORMAT " is %d, outside the "
                    "vocabulary [0, %" G_GUINT64_FORMAT ")",
                    i, tokens[i], L->config.vocab);
        return FALSE;
      }
  return TRUE;
}

void
stow_llama_embed_forward (StowLlama *L, const void *embed, const gint32 *tokens,
                          guint64 n, void *x)
{
  g_return_if_fail (L != NULL && embed != NULL && tokens != NULL && x != NULL);
  g_return_if_fail (tokens_ok (L, tokens, n));
  guint64 row = L->esize * L->config.hidden;
#pragma omp parallel for schedule(static) num_threads(L->n_threads)
  for (guint64 r = 0; r < n; r++)
    memcpy ((guint8 *)x + r * row,
            (const guint8 *)embed + (guint64)tokens[r] * row, row);
}

typedef struct
{
  gint32 token;
  guint32 pos;
} TokenPos;

static int
token_pos_cmp (const void *a, const void *b)
{
  const TokenPos *x = a, *y = b;
  if (x->token != y->token)
    return x->token < y->token ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

void
stow_llama_embed_backward (StowLlama *L, const gint32 *tokens, guint64 n,
                           const void *dx, void *dembed, gboolean accumulate)
{
  g_return_if_fail (L != NULL && tokens != NULL && dx != NULL
                    && dembed != NULL);
  g_return_if_fail (n <= G_MAXUINT32);
  g_return_if_fail (tokens_ok (L, tokens, n));
  guint64 h = L->config.hidden, V = L->config.vocab, e = L->esize;
  if (!accumulate)
    {
#pragma omp parallel for schedule(static) num_threads(L->n_threads)
      for (guint64 r = 0; r < V; r++)
        memset ((guint8 *)dembed + r * h * e, 0, h * e);
    }
  /* Positions grouped by token, in token order within a group: each row
   * of dembed is one thread's, summed in fp32 in position order and
   * rounded once. */
  g_autofree TokenPos *tp = g_new (TokenPos, MAX (n, 1));
  for (guint64 i = 0; i < n; i++)
    tp[i] = (TokenPos){ tokens[i], (guint32)i };
  qsort (tp, n, sizeof *tp, token_pos_cmp);
  g_autofree guint64 *starts = g_new (guint64, n + 1);
  guint64 n_groups = 0;
  for (guint64 i = 0; i < n; i++)
    if (i == 0 || tp[i].token != tp[i - 1].token)
      starts[n_groups++] = i;
  starts[n_groups] = n;
  guint64 W = L->row_floats;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(static)
    for (guint64 gi = 0; gi < n_groups; gi++)
      {
        guint64 tok = (guint64)tp[starts[gi]].token;
        void *drow = (guint8 *)dembed + tok * h * e;
        float *acc = ws;
        if (L->bf16)
          stow_llama_row_in (L, drow, h, 0, h, acc);
        else
          acc = drow;
        for (guint64 i = starts[gi]; i < starts[gi + 1]; i++)
          {
            const float *g = stow_llama_row_in (L, dx, h, tp[i].pos, h, ws + W);
#pragma omp simd
            for (guint64 j = 0; j < h; j++)
              acc[j] += g[j];
          }
        if (L->bf16)
          stow_llama_store (L, acc, drow, h);
      }
  }
}

/* ---- one decoder layer --------------------------------------------------- */

/* An operand of the runtime's dtype. */
static StowLlamaMat
mat (const StowLlama *L, const void *p, guint64 ld, gboolean trans)
{
  return (StowLlamaMat){ .p = p, .bf16 = L->bf16, .ld = ld, .trans = trans };
}

static StowLlamaMat
mat_f32 (const float *p, guint64 ld, gboolean trans)
{
  return (StowLlamaMat){ .p = p, .bf16 = FALSE, .ld = ld, .trans = trans };
}

/* y (n, out) = x (n, in) W^T (+ b) (+ R): a linear layer, W (out, in). */
static void
linear (StowLlama *L, guint64 n, guint64 in, guint64 out, const void *x,
        const void *W, const void *b, const void *R, void *y)
{
  stow_llama_gemm (L, n, out, in, 1.0f, mat (L, x, in, FALSE),
                   mat (L, W, in, TRUE), y, L->bf16, out, FALSE, R, out, b);
}

static gboolean
layer_args_ok (const StowLlama *L, guint64 batch, guint64 seq,
               const StowLlamaLayerWeights *w)
{
  const StowLlamaConfig *c = &L->config;
  if (seq == 0 || seq > L->max_seq || batch == 0)
    return FALSE;
  if (!w->attn_norm || !w->wq || !w->wk || !w->wv || !w->wo || !w->mlp_norm
      || !w->wg || !w->wu || !w->wd)
    return FALSE;
  if (c->qkv_bias && (!w->bq || !w->bk || !w->bv))
    return FALSE;
  if (c->o_bias && !w->bo)
    return FALSE;
  if (c->mlp_bias && (!w->bg || !w->bu || !w->bd))
    return FALSE;
  return TRUE;
}

void
stow_llama_layer_forward (StowLlama *L, guint64 batch, guint64 seq,
                          const StowLlamaLayerWeights *w, const void *x,
                          StowLlamaSaved *s)
{
  g_return_if_fail (L != NULL && w != NULL && x != NULL && s != NULL);
  g_return_if_fail (layer_args_ok (L, batch, seq, w));
  g_return_if_fail (s->xn1 && s->q && s->k && s->v && s->o && s->lse && s->h1
                    && s->xn2 && s->gate && s->up && s->act);
  const StowLlamaConfig *c = &L->config;
  guint64 n = batch * seq, h = c->hidden, f = c->ffn;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;

  stow_llama_rmsnorm (L, n, x, w->attn_norm, s->xn1, FALSE, NULL);
  linear (L, n, h, ad, s->xn1, w->wq, c->qkv_bias ? w->bq : NULL, NULL, s->q);
  linear (L, n, h, kd, s->xn1, w->wk, c->qkv_bias ? w->bk : NULL, NULL, s->k);
  linear (L, n, h, kd, s->xn1, w->wv, c->qkv_bias ? w->bv : NULL, NULL, s->v);
  stow_llama_rope (L, n, seq, c->n_heads, s->q, FALSE);
  stow_llama_rope (L, n, seq, c->n_kv_heads, s->k, FALSE);
  stow_llama_attention_forward (L, batch, seq, s->q, s->k, s->v, s->o, s->lse);
  /* h1 = x + o_proj (o) */
  linear (L, n, ad, h, s->o, w->wo, c->o_bias ? w->bo : NULL, x, s->h1);
  stow_llama_rmsnorm (L, n, s->h1, w->mlp_norm, s->xn2, FALSE, NULL);
  linear (L, n, h, f, s->xn2, w->wg, c->mlp_bias ? w->bg : NULL, NULL, s->gate);
  linear (L, n, h, f, s->xn2, w->wu, c->mlp_bias ? w->bu : NULL, NULL, s->up);
  stow_llama_swiglu (L, n, s->gate, s->up, s->act);
  /* out = h1 + down (act); skipped when recomputing (out is kept). */
  if (s->out != NULL)
    linear (L, n, f, h, s->act, w->wd, c->mlp_bias ? w->bd : NULL, s->h1,
            s->out);
}

/* dW (out, in) (+)= dy^T (out, n) x (n, in). */
static void
weight_grad (StowLlama *L, guint64 n, guint64 in, guint64 out, const void *dy,
             const void *x, void *dW, gboolean accumulate)
{
  stow_llama_gemm (L, out, in, n, 1.0f, mat (L, dy, out, TRUE),
                   mat (L, x, in, FALSE), dW, L->bf16, in, accumulate, NULL, 0,
                   NULL);
}

/* dx (n, in) (+)= dy (n, out) W (out, in), into fp32 when @dx_f32. */
static void
input_grad (StowLlama *L, guint64 n, guint64 in, guint64 out, const void *dy,
            const void *W, void *dx, gboolean dx_f32, gboolean accumulate)
{
  stow_llama_gemm (L, n, in, out, 1.0f, mat (L, dy, out, FALSE),
                   mat (L, W, in, FALSE), dx, L->bf16 && !dx_f32, in,
                   accumulate, NULL, 0, NULL);
}

void
stow_llama_layer_backward (StowLlama *L, guint64 batch, guint64 seq,
                           const StowLlamaLayerWeights *w, const void *x,
                           StowLlamaSaved *s, const StowLlamaLayerWeights *gr,
                           gboolean accumulate, void *ws, void *dx)
{
  g_return_if_fail (L != NULL && w != NULL && x != NULL && s != NULL
                    && gr != NULL && ws != NULL && dx != NULL);
  g_return_if_fail (layer_args_ok (L, batch, seq, w));
  g_return_if_fail (layer_args_ok (L, batch, seq, gr));
  g_return_if_fail (s->out != NULL && s->lse != NULL);
  g_return_if_fail (((guintptr)ws & 3) == 0);
  const StowLlamaConfig *c = &L->config;
  guint64 n = batch * seq, h = c->hidden, f = c->ffn, e = L->esize;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
  gboolean acc = accumulate;

  /* The working set: fp32 parts first so that each part is aligned to its
   * element type.  In all 4 n (h + 1) + e n (f + 2 a d + 2 k d) bytes,
   * within stow_llama_backward_ws_bytes for any shape. */
  guint8 *p = ws;
  float *dxn = (float *)p; /* (n, h) fp32: dL/d(norm output) */
  p += 4 * n * h;
  float *rstd = (float *)p; /* (n) */
  p += 4 * n;
  void *dact = p; /* (n, f) */
  p += e * n * f;
  void *dout_attn = p; /* (n, a d): dL/do */
  p += e * n * ad;
  void *dq = p; /* (n, a d) */
  p += e * n * ad;
  void *dk = p; /* (n, k d) */
  p += e * n * kd;
  void *dv = p; /* (n, k d) */
  p += e * n * kd;
  g_assert ((guint64)(p - (guint8 *)ws) <= stow_llama_backward_ws_bytes (L, n));
  void *dout = s->out; /* (n, h): dL/d(out); becomes dL/dh1 */

  /* MLP: out = h1 + down (silu (gate) * up) (+ bd). */
  input_grad (L, n, f, h, dout, w->wd, dact, FALSE, FALSE);
  weight_grad (L, n, f, h, dout, s->act, gr->wd, acc);
  if (c->mlp_bias)
    stow_llama_colsum (L, n, h, dout, FALSE, NULL, NULL, gr->bd, acc);
  stow_llama_swiglu_backward (L, n, dact, s->gate, s->up); /* dgate, dup */
  input_grad (L, n, h, f, s->gate, w->wg, dxn, TRUE, FALSE);
  input_grad (L, n, h, f, s->up, w->wu, dxn, TRUE, TRUE);
  weight_grad (L, n, h, f, s->gate, s->xn2, gr->wg, acc);
  weight_grad (L, n, h, f, s->up, s->xn2, gr->wu, acc);
  if (c->mlp_bias)
    {
      stow_llama_colsum (L, n, f, s->gate, FALSE, NULL, NULL, gr->bg, acc);
      stow_llama_colsum (L, n, f, s->up, FALSE, NULL, NULL, gr->bu, acc);
    }
  /* xn2 = RMSNorm (h1): the norm's weight gradient, then dh1 = dout +
   * RMSNorm' (dxn2) over dout. */
  stow_llama_rms_rstd (L, n, s->h1, rstd);
  stow_llama_colsum (L, n, h, dxn, TRUE, s->h1, rstd, gr->mlp_norm, acc);
  stow_llama_rmsnorm_backward (L, n, dxn, TRUE, s->h1, w->mlp_norm, rstd, dout,
                               dout);

  /* Attention: h1 = x + o_proj (o) (+ bo). */
  input_grad (L, n, ad, h, dout, w->wo, dout_attn, FALSE, FALSE);
  weight_grad (L, n, ad, h, dout, s->o, gr->wo, acc);
  if (c->o_bias)
    stow_llama_colsum (L, n, h, dout, FALSE, NULL, NULL, gr->bo, acc);
  stow_llama_attention_backward (L, batch, seq, s->q, s->k, s->v, s->o, s->lse,
                                 dout_attn, dq, dk, dv);
  stow_llama_rope (L, n, seq, c->n_heads, dq, TRUE);
  stow_llama_rope (L, n, seq, c->n_kv_heads, dk, TRUE);
  if (c->qkv_bias)
    {
      stow_llama_colsum (L, n, ad, dq, FALSE, NULL, NULL, gr->bq, acc);
      stow_llama_colsum (L, n, kd, dk, FALSE, NULL, NULL, gr->bk, acc);
      stow_llama_colsum (L, n, kd, dv, FALSE, NULL, NULL, gr->bv, acc);
    }
  input_grad (L, n, h, ad, dq, w->wq, dxn, TRUE, FALSE);
  input_grad (L, n, h, kd, dk, w->wk, dxn, TRUE, TRUE);
  input_grad (L, n, h, kd, dv, w->wv, dxn, TRUE, TRUE);
  weight_grad (L, n, h, ad, dq, s->xn1, gr->wq, acc);
  weight_grad (L, n, h, kd, dk, s->xn1, gr->wk, acc);
  weight_grad (L, n, h, kd, dv, s->xn1, gr->wv, acc);
  /* xn1 = RMSNorm (x): every read of x happens before dx (which may be x)
   * is written, row by row, last. */
  stow_llama_rms_rstd (L, n, x, rstd);
  stow_llama_colsum (L, n, h, dxn, TRUE, x, rstd, gr->attn_norm, acc);
  stow_llama_rmsnorm_backward (L, n, dxn, TRUE, x, w->attn_norm, rstd, dout,
                               dx);
}

/* ---- output layer and loss ----------------------------------------------- */

guint64
stow_llama_loss_chunk_tokens (guint64 vocab, guint64 hidden, guint64 n)
{
  g_return_val_if_fail (vocab > 0, 1);
  /* The planner's rule (planner/program.h), which sizes the buffer. */
  return stow_loss_chunk_tokens (vocab, n);
}

guint64
stow_llama_loss_scratch_floats (guint64 vocab, guint64 hidden, guint64 chunk)
{
  return chunk * (2 * hidden + vocab);
}

/* Softmax cross-entropy of rows [0, cn) of logits (cn, V), in place: each
 * row becomes scale (softmax - onehot (target)) and loss[i] gets
 * logsumexp - logit[target]. */
static void
softmax_xent (StowLlama *L, guint64 cn, float *logits, const gint32 *targets,
              float scale, float *loss)
{
  guint64 V = L->config.vocab;
#pragma omp parallel for schedule(static) num_threads(L->n_threads)
  for (guint64 i = 0; i < cn; i++)
    {
      float *l = logits + i * V;
      guint64 t = (guint64)targets[i];
      float lt = l[t], m = l[0];
#pragma omp simd reduction(max : m)
      for (guint64 j = 0; j < V; j++)
        m = l[j] > m ? l[j] : m;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (guint64 j = 0; j < V; j++)
        {
          float pj = stow_llama_expf (l[j] - m);
          l[j] = pj;
          sum += pj;
        }
      loss[i] = (m - lt) + logf (sum);
      float k = scale / sum;
#pragma omp simd
      for (guint64 j = 0; j < V; j++)
        l[j] *= k;
      l[t] -= scale;
    }
}

static gboolean
targets_ok (const StowLlama *L, const gint32 *t, guint64 n)
{
  for (guint64 i = 0; i < n; i++)
    if (t[i] < 0 || (guint64)t[i] >= L->config.vocab)
      return FALSE;
  return TRUE;
}

double
stow_llama_head_loss (StowLlama *L, guint64 n, const void *norm,
                      const void *head, const void *x, const gint32 *targets,
                      double scale, void *dnorm, void *dhead,
                      gboolean accumulate, void *dx, float *scratch,
                      guint64 chunk)
{
  g_return_val_if_fail (L != NULL && norm != NULL && head != NULL, 0);
  g_return_val_if_fail (x != NULL && targets != NULL && dnorm != NULL, 0);
  g_return_val_if_fail (dhead != NULL && dx != NULL && scratch != NULL, 0);
  g_return_val_if_fail (chunk > 0, 0);
  g_return_val_if_fail (targets_ok (L, targets, n), 0);
  guint64 h = L->config.hidden, V = L->config.vocab, e = L->esize;
  /* scratch: xn (chunk, h) fp32, logits (chunk, V) fp32, dxn (chunk, h)
   * fp32. */
  float *xn = scratch, *logits = xn + chunk * h, *dxn = logits + chunk * V;
  double loss = 0;

  memset (L->col_acc, 0, h * sizeof (double));
  if (n == 0 && !accumulate)
    stow_llama_gemm (L, V, h, 0, 1.0f, mat_f32 (logits, V, TRUE),
                     mat_f32 (xn, h, FALSE), dhead, L->bf16, h, FALSE, NULL, 0,
                     NULL); /* no tokens: "=" still zeroes dhead */
  for (guint64 c0 = 0; c0 < n; c0 += chunk)
    {
      guint64 cn = MIN (chunk, n - c0);
      const guint8 *xc = (const guint8 *)x + c0 * h * e;
      stow_llama_rmsnorm (L, cn, xc, norm, xn, TRUE, NULL);
      stow_llama_gemm (L, cn, V, h, 1.0f, mat_f32 (xn, h, FALSE),
                       mat (L, head, h, TRUE), logits, FALSE, V, FALSE, NULL, 0,
                       NULL);
      /* Token losses go to dxn's first floats, free until dxn is. */
      softmax_xent (L, cn, logits, targets + c0, (float)scale, dxn);
      for (guint64 i = 0; i < cn; i++)
        loss += dxn[i];
      /* dhead (V, h) (+)= dlogits^T xn; dxn (cn, h) = dlogits head. */
      stow_llama_gemm (L, V, h, cn, 1.0f, mat_f32 (logits, V, TRUE),
                       mat_f32 (xn, h, FALSE), dhead, L->bf16, h,
                       accumulate || c0 > 0, NULL, 0, NULL);
      stow_llama_gemm (L, cn, h, V, 1.0f, mat_f32 (logits, V, FALSE),
                       mat (L, head, h, FALSE), dxn, FALSE, h, FALSE, NULL, 0,
                       NULL);
      /* The logits are spent: their first floats hold the rows' rstd.
       * x's rows are read (norm gradient, then each row's own dx) before
       * dx, which may be x, overwrites them. */
      float *rstd = logits;
      stow_llama_rms_rstd (L, cn, xc, rstd);
      stow_llama_colsum_acc (L, cn, h, dxn, TRUE, xc, rstd, L->col_acc);
      stow_llama_rmsnorm_backward (L, cn, dxn, TRUE, xc, norm, rstd, NULL,
                                   (guint8 *)dx + c0 * h * e);
    }
  for (guint64 j = 0; j < h; j++)
    {
      double v = L->col_acc[j];
      if (accumulate)
        v += stow_llama_load1 (L, dnorm, j);
      if (L->bf16)
        ((guint16 *)dnorm)[j] = stow_llama_bf16_round ((float)v);
      else
        ((float *)dnorm)[j] = (float)v;
    }
  return loss;
}

void
stow_llama_head_logits (StowLlama *L, guint64 n, const void *norm,
                        const void *head, const void *x, float *logits)
{
  g_return_if_fail (L != NULL && norm != NULL && head != NULL && x != NULL
                    && logits != NULL);
  guint64 h = L->config.hidden, V = L->config.vocab;
  g_autofree float *xn = g_new (float, MAX (n * h, 1));
  stow_llama_rmsnorm (L, n, x, norm, xn, TRUE, NULL);
  stow_llama_gemm (L, n, V, h, 1.0f, mat_f32 (xn, h, FALSE),
                   mat (L, head, h, TRUE), logits, FALSE, V, FALSE, NULL, 0,
                   NULL);
}
