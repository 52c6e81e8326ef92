/* SPDX-License-Identifier: MIT
 *
 * executor/llama.c: the LLaMA-family decoder's one recipe (executor/llama.h):
 * the sizes and carving of the saved tensors, the embedding, one decoder
 * layer's forward and backward (with its working set's carve) as a sequence
 * of GEMMs and row kernels, and the output layer fused with the
 * cross-entropy, every step a call into the device's kernel table
 * (executor/kernels.h).  The kernels are the providers': the cpu runtime's
 * (llama-cpu.c) and the cuda runtime's (backends/cuda/llama-cuda.cu).
 */
#include "executor/llama.h"

#include <string.h>

#include "core/json.h"

#include "program/program.h" /* the fused loss's chunk rule */

/* clang-format off */
G_DEFINE_QUARK (stow-llama-error-quark, stow_llama_error)
/* clang-format on */

/* ---- the config a model runs with -----------------------------------------
 */

/* The most of a config.json read, as models/ reads one. */
#define CONFIG_MAX_BYTES ((gsize)4 << 20)

/* The model types the runtime runs (the families of
 * stow_llama_config_from_model). */
static const char *const runtime_types[] = { "llama", "mistral", "qwen2" };

static gboolean
runs_type (const char *type)
{
  for (guint i = 0; i < G_N_ELEMENTS (runtime_types); i++)
    if (g_strcmp0 (type, runtime_types[i]) == 0)
      return TRUE;
  return FALSE;
}

static gboolean
refuse_type (const char *where, const char *type, GError **error)
{
  g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
               "%s: model_type \"%s\": the executor runs LLaMA-family "
               "decoders (llama, mistral, qwen2); stowage fit and plan "
               "count it",
               where, type);
  return FALSE;
}

gboolean
stow_llama_config_check (const StowLlamaConfig *c, GError **error)
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
  guint64 big = MAX (MAX (c->hidden, c->ffn), c->vocab);
  if (big > G_MAXINT || c->n_heads * c->head_dim > G_MAXINT)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama config: a dimension above %d (hidden "
                   "%" G_GUINT64_FORMAT ", ffn %" G_GUINT64_FORMAT
                   ", vocab %" G_GUINT64_FORMAT ")",
                   G_MAXINT, c->hidden, c->ffn, c->vocab);
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
  return TRUE;
}

StowModel *
stow_llama_model_open (const char *config_path, StowLlamaConfig *out,
                       guint64 *max_positions, GError **error)
{
  g_return_val_if_fail (config_path != NULL && out != NULL, NULL);
  /* model_type first: a family the runtime does not run is named as such,
   * not by the first of its own fields the importer misses. */
  g_autoptr (JsonNode) root
      = stow_json_parse_file (config_path, CONFIG_MAX_BYTES, error);
  JsonObject *cfg
      = root ? stow_json_root_object (root, config_path, error) : NULL;
  if (cfg == NULL)
    return NULL;
  const char *type = NULL;
  if (json_object_has_member (cfg, "model_type")
      && !stow_json_get_string (cfg, config_path, "model_type", FALSE, &type,
                                error))
    return NULL;
  if (type != NULL && !runs_type (type))
    {
      refuse_type (config_path, type, error);
      return NULL;
    }
  guint64 max_pos = 0;
  if (!stow_json_get_u64 (cfg, config_path, "max_position_embeddings", FALSE,
                          &max_pos, error))
    return NULL;
  g_autoptr (StowModel) m = stow_model_new_from_file (config_path, error);
  if (m == NULL || !stow_llama_config_from_model (m, out, error))
    return NULL;
  if (max_positions)
    *max_positions = max_pos;
  return g_steal_pointer (&m);
}

gboolean
stow_llama_config_from_model (const StowModel *m, StowLlamaConfig *c,
                              GError **error)
{
  memset (c, 0, sizeof *c);
  const char *fam = m->family ? m->family : "?";
  if (!runs_type (fam))
    return refuse_type (m->name, fam, error);
  if (m->n_experts > 0 || !m->gated_mlp || m->norm != STOW_NORM_RMSNORM
      || m->n_encoder_layers > 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: mixture-of-experts and other variants of %s are not "
                   "run by the executor",
                   m->name, fam);
      return FALSE;
    }
  if (g_strcmp0 (m->hidden_act, "silu") != 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: hidden_act \"%s\": the executor runs silu (SwiGLU)",
                   m->name, m->hidden_act ? m->hidden_act : "");
      return FALSE;
    }
  if (m->rope_type != NULL && !g_str_equal (m->rope_type, "default")
      && !g_str_equal (m->rope_type, "llama3"))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: rope_scaling.rope_type \"%s\": the executor runs "
                   "default and llama3 rotary embeddings",
                   m->name, m->rope_type);
      return FALSE;
    }
  c->hidden = m->hidden;
  c->n_layers = m->n_layers;
  c->n_heads = m->n_heads;
  c->n_kv_heads = m->n_kv_heads;
  c->head_dim = m->head_dim;
  c->ffn = m->ffn;
  c->vocab = m->vocab;
  c->rope_theta = m->rope_theta;
  c->rms_norm_eps = m->norm_eps;
  if (g_strcmp0 (m->rope_type, "llama3") == 0)
    {
      c->rope_factor = m->rope_factor;
      c->rope_low_freq_factor = m->rope_low_freq_factor;
      c->rope_high_freq_factor = m->rope_high_freq_factor;
      c->rope_original_max_positions = m->rope_original_max_positions;
    }
  c->qkv_bias = m->qkv_bias;
  c->o_bias = m->o_bias;
  c->mlp_bias = m->mlp_bias;
  c->tied = m->tied_embeddings;
  if (!stow_llama_config_check (c, error))
    {
      g_prefix_error (error, "%s: ", m->source ? m->source : m->name);
      return FALSE;
    }
  return TRUE;
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
stow_llama_config_saved_carve (const StowLlamaConfig *c, guint64 e, guint64 n,
                               void *rest, void *out, StowLlamaSaved *s)
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

/* ---- embedding ----------------------------------------------------------- */

/* Whether the provider has failed (it then reports why): issue nothing. */
static gboolean
failed (const StowDecoder *d)
{
  return d->k->failed != NULL && d->k->failed (d->ctx);
}

void
stow_decoder_embed_forward (const StowDecoder *d, const void *embed,
                            const gint32 *tokens, guint64 n, void *x)
{
  g_return_if_fail (d != NULL && embed != NULL && tokens != NULL && x != NULL);
  g_return_if_fail (d->max_tokens == 0 || n <= d->max_tokens);
  if (!failed (d) && n > 0)
    d->k->embed_forward (d->ctx, embed, tokens, n, x);
}

void
stow_decoder_embed_backward (const StowDecoder *d, const gint32 *tokens,
                             guint64 n, const void *dx, void *dembed,
                             gboolean accumulate)
{
  g_return_if_fail (d != NULL && tokens != NULL && dx != NULL
                    && dembed != NULL);
  g_return_if_fail (d->max_tokens == 0 || n <= d->max_tokens);
  if (!failed (d))
    d->k->embed_backward (d->ctx, tokens, n, dx, dembed, accumulate);
}

/* ---- one decoder layer --------------------------------------------------- */

/* An operand of the dtype. */
static StowMat
mat (const StowDecoder *d, const void *p, guint64 ld, gboolean trans)
{
  return (StowMat){ .p = p, .bf16 = d->bf16, .ld = ld, .trans = trans };
}

/* An operand of the fused loss's staging: the dtype's where the provider
 * stages in it (loss_lowp), else fp32. */
static StowMat
mat_loss (const StowDecoder *d, const void *p, guint64 ld, gboolean trans)
{
  return (StowMat){ .p = p, .bf16 = d->loss_lowp, .ld = ld, .trans = trans };
}

/* y (n, out) = x (n, in) W^T (+ b) (+ R): a linear layer, W (out, in). */
static void
linear (const StowDecoder *d, guint64 n, guint64 in, guint64 out, const void *x,
        const void *W, const void *b, const void *R, void *y)
{
  d->k->gemm (d->ctx, n, out, in, 1.0f, mat (d, x, in, FALSE),
              mat (d, W, in, TRUE), y, d->bf16, out, FALSE, R, out, b);
}

/* dW (out, in) (+)= dy^T (out, n) x (n, in). */
static void
weight_grad (const StowDecoder *d, guint64 n, guint64 in, guint64 out,
             const void *dy, const void *x, void *dW, gboolean accumulate)
{
  d->k->gemm (d->ctx, out, in, n, 1.0f, mat (d, dy, out, TRUE),
              mat (d, x, in, FALSE), dW, d->bf16, in, accumulate, NULL, 0,
              NULL);
}

/* dx (n, in) (+)= dy (n, out) W (out, in), into fp32 when @dx_f32. */
static void
input_grad (const StowDecoder *d, guint64 n, guint64 in, guint64 out,
            const void *dy, const void *W, void *dx, gboolean dx_f32,
            gboolean accumulate)
{
  d->k->gemm (d->ctx, n, in, out, 1.0f, mat (d, dy, out, FALSE),
              mat (d, W, in, FALSE), dx, d->bf16 && !dx_f32, in, accumulate,
              NULL, 0, NULL);
}

static gboolean
layer_args_ok (const StowDecoder *d, guint64 batch, guint64 seq,
               const StowLlamaLayerWeights *w)
{
  const StowLlamaConfig *c = &d->config;
  if (seq == 0 || seq > d->max_seq || batch == 0)
    return FALSE;
  if ((d->max_batch && batch > d->max_batch)
      || (d->max_tokens && batch * seq > d->max_tokens))
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
stow_decoder_layer_forward (const StowDecoder *d, guint64 batch, guint64 seq,
                            const StowLlamaLayerWeights *w, const void *x,
                            StowLlamaSaved *s)
{
  g_return_if_fail (d != NULL && w != NULL && x != NULL && s != NULL);
  g_return_if_fail (layer_args_ok (d, batch, seq, w));
  g_return_if_fail (s->xn1 && s->q && s->k && s->v && s->o && s->lse && s->h1
                    && s->xn2 && s->gate && s->up && s->act);
  if (failed (d))
    return;
  const StowKernels *k = d->k;
  void *ctx = d->ctx;
  const StowLlamaConfig *c = &d->config;
  guint64 n = batch * seq, h = c->hidden, f = c->ffn;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;

  k->rmsnorm (ctx, n, x, w->attn_norm, s->xn1, FALSE);
  linear (d, n, h, ad, s->xn1, w->wq, c->qkv_bias ? w->bq : NULL, NULL, s->q);
  linear (d, n, h, kd, s->xn1, w->wk, c->qkv_bias ? w->bk : NULL, NULL, s->k);
  linear (d, n, h, kd, s->xn1, w->wv, c->qkv_bias ? w->bv : NULL, NULL, s->v);
  k->rope (ctx, n, seq, c->n_heads, s->q, FALSE);
  k->rope (ctx, n, seq, c->n_kv_heads, s->k, FALSE);
  k->attention_forward (ctx, batch, seq, s->q, s->k, s->v, s->o, s->lse);
  /* h1 = x + o_proj (o) */
  linear (d, n, ad, h, s->o, w->wo, c->o_bias ? w->bo : NULL, x, s->h1);
  k->rmsnorm (ctx, n, s->h1, w->mlp_norm, s->xn2, FALSE);
  linear (d, n, h, f, s->xn2, w->wg, c->mlp_bias ? w->bg : NULL, NULL, s->gate);
  linear (d, n, h, f, s->xn2, w->wu, c->mlp_bias ? w->bu : NULL, NULL, s->up);
  k->swiglu (ctx, n, s->gate, s->up, s->act);
  /* out = h1 + down (act); skipped when recomputing (out is kept). */
  if (s->out != NULL)
    linear (d, n, f, h, s->act, w->wd, c->mlp_bias ? w->bd : NULL, s->h1,
            s->out);
}

void
stow_decoder_layer_backward (const StowDecoder *d, guint64 batch, guint64 seq,
                             const StowLlamaLayerWeights *w, const void *x,
                             StowLlamaSaved *s, const StowLlamaLayerWeights *gr,
                             gboolean accumulate, void *ws, void *dx)
{
  g_return_if_fail (d != NULL && w != NULL && x != NULL && s != NULL
                    && gr != NULL && ws != NULL && dx != NULL);
  g_return_if_fail (layer_args_ok (d, batch, seq, w));
  g_return_if_fail (layer_args_ok (d, batch, seq, gr));
  g_return_if_fail (s->out != NULL && s->lse != NULL);
  g_return_if_fail (((guintptr)ws & 3) == 0);
  if (failed (d))
    return;
  const StowKernels *k = d->k;
  void *ctx = d->ctx;
  const StowLlamaConfig *c = &d->config;
  guint64 n = batch * seq, h = c->hidden, f = c->ffn, e = d->esize;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
  gboolean acc = accumulate;

  /* The working set: fp32 parts first so that each part is aligned to its
   * element type.  In all 4 n (h + 1) + e n (f + 2 a d + 2 k d) bytes,
   * within stow_llama_config_backward_ws_bytes for any shape. */
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
  g_assert ((guint64)(p - (guint8 *)ws)
            <= stow_llama_config_backward_ws_bytes (c, e, n));
  void *dout = s->out; /* (n, h): dL/d(out); becomes dL/dh1 */

  /* MLP: out = h1 + down (silu (gate) * up) (+ bd). */
  input_grad (d, n, f, h, dout, w->wd, dact, FALSE, FALSE);
  weight_grad (d, n, f, h, dout, s->act, gr->wd, acc);
  if (c->mlp_bias)
    k->colsum (ctx, n, h, dout, FALSE, NULL, NULL, gr->bd, acc);
  k->swiglu_backward (ctx, n, dact, s->gate, s->up); /* dgate, dup */
  input_grad (d, n, h, f, s->gate, w->wg, dxn, TRUE, FALSE);
  input_grad (d, n, h, f, s->up, w->wu, dxn, TRUE, TRUE);
  weight_grad (d, n, h, f, s->gate, s->xn2, gr->wg, acc);
  weight_grad (d, n, h, f, s->up, s->xn2, gr->wu, acc);
  if (c->mlp_bias)
    {
      k->colsum (ctx, n, f, s->gate, FALSE, NULL, NULL, gr->bg, acc);
      k->colsum (ctx, n, f, s->up, FALSE, NULL, NULL, gr->bu, acc);
    }
  /* xn2 = RMSNorm (h1): the norm's weight gradient, then dh1 = dout +
   * RMSNorm' (dxn2) over dout. */
  k->rms_rstd (ctx, n, s->h1, rstd);
  k->colsum (ctx, n, h, dxn, TRUE, s->h1, rstd, gr->mlp_norm, acc);
  k->rmsnorm_backward (ctx, n, dxn, TRUE, s->h1, w->mlp_norm, rstd, dout, dout);

  /* Attention: h1 = x + o_proj (o) (+ bo). */
  input_grad (d, n, ad, h, dout, w->wo, dout_attn, FALSE, FALSE);
  weight_grad (d, n, ad, h, dout, s->o, gr->wo, acc);
  if (c->o_bias)
    k->colsum (ctx, n, h, dout, FALSE, NULL, NULL, gr->bo, acc);
  k->attention_backward (ctx, batch, seq, s->q, s->k, s->v, s->o, s->lse,
                         dout_attn, dq, dk, dv);
  k->rope (ctx, n, seq, c->n_heads, dq, TRUE);
  k->rope (ctx, n, seq, c->n_kv_heads, dk, TRUE);
  if (c->qkv_bias)
    {
      k->colsum (ctx, n, ad, dq, FALSE, NULL, NULL, gr->bq, acc);
      k->colsum (ctx, n, kd, dk, FALSE, NULL, NULL, gr->bk, acc);
      k->colsum (ctx, n, kd, dv, FALSE, NULL, NULL, gr->bv, acc);
    }
  input_grad (d, n, h, ad, dq, w->wq, dxn, TRUE, FALSE);
  input_grad (d, n, h, kd, dk, w->wk, dxn, TRUE, TRUE);
  input_grad (d, n, h, kd, dv, w->wv, dxn, TRUE, TRUE);
  weight_grad (d, n, h, ad, dq, s->xn1, gr->wq, acc);
  weight_grad (d, n, h, kd, dk, s->xn1, gr->wk, acc);
  weight_grad (d, n, h, kd, dv, s->xn1, gr->wv, acc);
  /* xn1 = RMSNorm (x): every read of x happens before dx (which may be x)
   * is written, row by row, last. */
  k->rms_rstd (ctx, n, x, rstd);
  k->colsum (ctx, n, h, dxn, TRUE, x, rstd, gr->attn_norm, acc);
  k->rmsnorm_backward (ctx, n, dxn, TRUE, x, w->attn_norm, rstd, dout, dx);
}

/* ---- output layer and loss ----------------------------------------------- */

guint64
stow_llama_loss_chunk_tokens (guint64 vocab, guint64 hidden, guint64 n)
{
  g_return_val_if_fail (vocab > 0, 1);
  /* The planner's rule (program/program.h), which sizes the buffer. */
  return stow_loss_chunk_tokens (vocab, n);
}

guint64
stow_llama_loss_scratch_floats (guint64 vocab, guint64 hidden, guint64 chunk)
{
  return chunk * (2 * hidden + vocab);
}

void
stow_decoder_head_loss (const StowDecoder *d, guint64 n, const void *norm,
                        const void *head, const void *x, const gint32 *targets,
                        double scale, void *dnorm, void *dhead,
                        gboolean accumulate, void *dx, float *scratch,
                        guint64 chunk, double *loss_sum)
{
  g_return_if_fail (d != NULL && norm != NULL && head != NULL);
  g_return_if_fail (x != NULL && targets != NULL && dnorm != NULL);
  g_return_if_fail (dhead != NULL && dx != NULL && scratch != NULL);
  g_return_if_fail (chunk > 0 && loss_sum != NULL);
  g_return_if_fail (d->max_tokens == 0 || n <= d->max_tokens);
  if (failed (d))
    return;
  const StowKernels *k = d->k;
  void *ctx = d->ctx;
  guint64 h = d->config.hidden, V = d->config.vocab, e = d->esize;
  /* scratch: xn (chunk, h) fp32 (or the dtype's, in its first half, with
   * loss_lowp), logits (chunk, V) fp32 (then dlogits: fp32, or the
   * dtype's with ld 2 V), dxn (chunk, h) fp32. */
  float *xn = scratch, *logits = xn + chunk * h, *dxn = logits + chunk * V;
  guint64 ldl = d->loss_lowp ? 2 * V : V; /* dlogits' ld, in its elements */

  k->colsum_acc_zero (ctx);
  if (n == 0 && !accumulate) /* no tokens: "=" still zeroes dhead */
    k->zero (ctx, dhead, V * h * e);
  for (guint64 c0 = 0; c0 < n && !failed (d); c0 += chunk)
    {
      guint64 cn = MIN (chunk, n - c0);
      const guint8 *xc = (const guint8 *)x + c0 * h * e;
      k->rmsnorm (ctx, cn, xc, norm, xn, !d->loss_lowp);
      k->gemm (ctx, cn, V, h, 1.0f, mat_loss (d, xn, h, FALSE),
               mat (d, head, h, TRUE), logits, FALSE, V, FALSE, NULL, 0, NULL);
      /* Token losses go to dxn's first floats, free until dxn is. */
      k->xent (ctx, cn, logits, targets + c0, (float)scale, dxn, loss_sum);
      /* dhead (V, h) (+)= dlogits^T xn; dxn (cn, h) = dlogits head. */
      k->gemm (ctx, V, h, cn, 1.0f, mat_loss (d, logits, ldl, TRUE),
               mat_loss (d, xn, h, FALSE), dhead, d->bf16, h,
               accumulate || c0 > 0, NULL, 0, NULL);
      k->gemm (ctx, cn, h, V, 1.0f, mat_loss (d, logits, ldl, FALSE),
               mat (d, head, h, FALSE), dxn, FALSE, h, FALSE, NULL, 0, NULL);
      /* The logits are spent: their first floats hold the rows' rstd.
       * x's rows are read (norm gradient, then each row's own dx) before
       * dx, which may be x, overwrites them. */
      float *rstd = logits;
      k->rms_rstd (ctx, cn, xc, rstd);
      k->colsum_acc (ctx, cn, h, dxn, TRUE, xc, rstd);
      k->rmsnorm_backward (ctx, cn, dxn, TRUE, xc, norm, rstd, NULL,
                           (guint8 *)dx + c0 * h * e);
    }
  k->colsum_acc_store (ctx, h, dnorm, accumulate);
}

void
stow_decoder_head_eval_loss (const StowDecoder *d, guint64 n, const void *norm,
                             const void *head, const void *x,
                             const gint32 *targets, float *scratch,
                             guint64 chunk, double *loss_sum)
{
  g_return_if_fail (d != NULL && norm != NULL && head != NULL);
  g_return_if_fail (x != NULL && targets != NULL && scratch != NULL);
  g_return_if_fail (chunk > 0 && loss_sum != NULL);
  g_return_if_fail (d->max_tokens == 0 || n <= d->max_tokens);
  if (failed (d))
    return;
  const StowKernels *k = d->k;
  guint64 h = d->config.hidden, V = d->config.vocab;
  /* scratch as stow_decoder_head_loss lays it out. */
  float *xn = scratch, *logits = xn + chunk * h, *dxn = logits + chunk * V;
  for (guint64 c0 = 0; c0 < n && !failed (d); c0 += chunk)
    {
      guint64 cn = MIN (chunk, n - c0);
      const guint8 *xc = (const guint8 *)x + c0 * h * d->esize;
      k->rmsnorm (d->ctx, cn, xc, norm, xn, !d->loss_lowp);
      k->gemm (d->ctx, cn, V, h, 1.0f, mat_loss (d, xn, h, FALSE),
               mat (d, head, h, TRUE), logits, FALSE, V, FALSE, NULL, 0, NULL);
      /* The rows' gradients it leaves in the logits are not used. */
      k->xent (d->ctx, cn, logits, targets + c0, 1.0f, dxn, loss_sum);
    }
}

void
stow_decoder_head_logits (const StowDecoder *d, guint64 n, const void *norm,
                          const void *head, const void *x, float *logits,
                          float *xn)
{
  g_return_if_fail (d != NULL && norm != NULL && head != NULL && x != NULL
                    && logits != NULL && xn != NULL);
  if (failed (d) || n == 0)
    return;
  guint64 h = d->config.hidden, V = d->config.vocab;
  d->k->rmsnorm (d->ctx, n, x, norm, xn, !d->loss_lowp);
  d->k->gemm (d->ctx, n, V, h, 1.0f, mat_loss (d, xn, h, FALSE),
              mat (d, head, h, TRUE), logits, FALSE, V, FALSE, NULL, 0, NULL);
}
