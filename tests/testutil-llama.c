/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-llama.c: a whole decoder over executor/llama.h for the
 * tests (see testutil-llama.h).  Not a reference: the references are the
 * finite differences in test-llama.c and the PyTorch oracle.
 */
#include "tests/testutil-llama.h"

#include <math.h>
#include <string.h>

static void
add (TestLlamaModel *m, const char *name, guint64 rows, guint64 cols)
{
  TestLlamaParam p = { name, rows, cols, NULL, NULL };
  p.w = g_malloc0 (rows * cols * m->esize);
  p.g = g_malloc0 (rows * cols * m->esize);
  g_array_append_val (m->params, p);
}

/* embed, per layer (attn_norm, wq, wk, wv, [bq, bk, bv], [q_norm, k_norm],
 * wo, [bo], mlp_norm, wg, wu, wd, [bg, bu, bd]), norm, [lm_head]: the order of
 * tests/oracle/llama_oracle.py's param_shapes. */
static void
add_params (TestLlamaModel *m)
{
  const StowLlamaConfig *c = &m->cfg;
  guint64 h = c->hidden, f = c->ffn, V = c->vocab;
  guint64 ad = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
  add (m, "embed", V, h);
  for (guint64 l = 0; l < c->n_layers; l++)
    {
      guint before = m->params->len;
      add (m, "attn_norm", h, 1);
      add (m, "wq", ad, h);
      add (m, "wk", kd, h);
      add (m, "wv", kd, h);
      if (c->qkv_bias)
        {
          add (m, "bq", ad, 1);
          add (m, "bk", kd, 1);
          add (m, "bv", kd, 1);
        }
      if (c->qk_norm)
        {
          add (m, "q_norm", c->head_dim, 1);
          add (m, "k_norm", c->head_dim, 1);
        }
      add (m, "wo", h, ad);
      if (c->o_bias)
        add (m, "bo", h, 1);
      add (m, "mlp_norm", h, 1);
      add (m, "wg", f, h);
      add (m, "wu", f, h);
      add (m, "wd", h, f);
      if (c->mlp_bias)
        {
          add (m, "bg", f, 1);
          add (m, "bu", f, 1);
          add (m, "bd", h, 1);
        }
      m->per_layer = m->params->len - before;
    }
  add (m, "norm", h, 1);
  if (!c->tied)
    add (m, "lm_head", V, h);
}

TestLlamaModel *
test_llama_model_new (const StowLlamaConfig *cfg, StowDtype dtype,
                      guint64 batch, guint64 seq, guint n_threads,
                      guint64 chunk, GError **error)
{
  g_autoptr (StowLlama) rt = stow_llama_new (cfg, dtype, seq, n_threads, error);
  if (rt == NULL)
    return NULL;
  TestLlamaModel *m = g_new0 (TestLlamaModel, 1);
  m->cfg = *cfg;
  m->dtype = dtype;
  m->esize = stow_dtype_size (dtype);
  m->batch = batch;
  m->seq = seq;
  m->n = batch * seq;
  m->rt = g_steal_pointer (&rt);
  m->chunk = chunk
                 ? chunk
                 : stow_llama_loss_chunk_tokens (cfg->vocab, cfg->hidden, m->n);
  m->params = g_array_new (FALSE, FALSE, sizeof (TestLlamaParam));
  add_params (m);
  guint64 n = m->n, L = cfg->n_layers;
  m->tokens = g_new0 (gint32, n);
  m->targets = g_new0 (gint32, n);
  m->logits = g_new0 (float, n * cfg->vocab);
  /* Exact sizes, so that ASan sees any write past them. */
  guint64 out = stow_llama_out_bytes (m->rt, n);
  guint64 rest = stow_llama_saved_bytes (m->rt, n) - out;
  m->x0 = g_malloc (out);
  m->rest = g_new0 (void *, MAX (L, 1));
  m->outs = g_new0 (void *, MAX (L, 1));
  m->saved = g_new0 (StowLlamaSaved, MAX (L, 1));
  for (guint64 l = 0; l < L; l++)
    {
      m->rest[l] = g_malloc (rest);
      m->outs[l] = g_malloc (out);
      stow_llama_saved_carve (m->rt, n, m->rest[l], m->outs[l], &m->saved[l]);
    }
  m->ws = g_malloc (stow_llama_backward_ws_bytes (m->rt, n));
  m->scratch = g_new (float, stow_llama_loss_scratch_floats (
                                 cfg->vocab, cfg->hidden, m->chunk));
  return m;
}

void
test_llama_model_free (TestLlamaModel *m)
{
  if (m == NULL)
    return;
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      g_free (p->w);
      g_free (p->g);
    }
  g_array_unref (m->params);
  for (guint64 l = 0; l < m->cfg.n_layers; l++)
    {
      g_free (m->rest[l]);
      g_free (m->outs[l]);
    }
  g_free (m->rest);
  g_free (m->outs);
  g_free (m->saved);
  g_free (m->x0);
  g_free (m->ws);
  g_free (m->scratch);
  g_free (m->tokens);
  g_free (m->targets);
  g_free (m->logits);
  stow_llama_free (m->rt);
  g_free (m);
}

float
test_llama_param_get (const TestLlamaModel *m, const TestLlamaParam *p,
                      gboolean grad, guint64 i)
{
  const void *a = grad ? p->g : p->w;
  if (m->dtype == STOW_DTYPE_BF16)
    return stow_bf16_to_f32 (((const guint16 *)a)[i]);
  return ((const float *)a)[i];
}

void
test_llama_param_set (const TestLlamaModel *m, TestLlamaParam *p, guint64 i,
                      float v)
{
  if (m->dtype == STOW_DTYPE_BF16)
    ((guint16 *)p->w)[i] = stow_f32_to_bf16 (v);
  else
    ((float *)p->w)[i] = v;
}

void
test_llama_model_randomize (TestLlamaModel *m, guint32 seed)
{
  g_autoptr (GRand) r = g_rand_new_with_seed (seed);
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      gboolean norm = g_str_has_suffix (p->name, "norm");
      gboolean embed = g_str_equal (p->name, "embed");
      gboolean bias = p->cols == 1 && !norm;
      double s = embed ? 1.0 : bias ? 0.2 : 1.0 / sqrt ((double)p->cols);
      for (guint64 j = 0; j < p->rows * p->cols; j++)
        {
          /* Sum of three uniforms: bell-shaped, unit variance. */
          double u = g_rand_double_range (r, -1, 1)
                     + g_rand_double_range (r, -1, 1)
                     + g_rand_double_range (r, -1, 1);
          test_llama_param_set (m, p, j,
                                norm ? 1.0f + 0.2f * (float)u : (float)(s * u));
        }
    }
  for (guint64 i = 0; i < m->n; i++)
    {
      m->tokens[i] = g_rand_int_range (r, 0, (gint32)m->cfg.vocab);
      m->targets[i] = g_rand_int_range (r, 0, (gint32)m->cfg.vocab);
    }
  if (m->n > 1)
    m->tokens[m->n - 1] = m->tokens[0];
}

void
test_llama_model_copy_params (TestLlamaModel *m, const TestLlamaModel *src)
{
  g_assert_cmpuint (m->params->len, ==, src->params->len);
  for (guint i = 0; i < m->params->len; i++)
    {
      TestLlamaParam *p = &g_array_index (m->params, TestLlamaParam, i);
      const TestLlamaParam *q = &g_array_index (src->params, TestLlamaParam, i);
      for (guint64 j = 0; j < p->rows * p->cols; j++)
        test_llama_param_set (m, p, j, test_llama_param_get (src, q, FALSE, j));
    }
  memcpy (m->tokens, src->tokens, 4 * m->n);
  memcpy (m->targets, src->targets, 4 * m->n);
}

void
test_llama_model_layer (const TestLlamaModel *m, guint64 l, gboolean grads,
                        StowLlamaLayerWeights *lw)
{
  guint k = 1 + (guint)l * m->per_layer;
  const StowLlamaConfig *c = &m->cfg;
  memset (lw, 0, sizeof *lw);
#define NEXT()                                                                 \
  (grads ? g_array_index (m->params, TestLlamaParam, k++).g                    \
         : g_array_index (m->params, TestLlamaParam, k++).w)
  lw->attn_norm = NEXT ();
  lw->wq = NEXT ();
  lw->wk = NEXT ();
  lw->wv = NEXT ();
  if (c->qkv_bias)
    {
      lw->bq = NEXT ();
      lw->bk = NEXT ();
      lw->bv = NEXT ();
    }
  if (c->qk_norm)
    {
      lw->q_norm = NEXT ();
      lw->k_norm = NEXT ();
    }
  lw->wo = NEXT ();
  if (c->o_bias)
    lw->bo = NEXT ();
  lw->mlp_norm = NEXT ();
  lw->wg = NEXT ();
  lw->wu = NEXT ();
  lw->wd = NEXT ();
  if (c->mlp_bias)
    {
      lw->bg = NEXT ();
      lw->bu = NEXT ();
      lw->bd = NEXT ();
    }
#undef NEXT
}

static TestLlamaParam *
param (const TestLlamaModel *m, guint i)
{
  return &g_array_index (m->params, TestLlamaParam, i);
}

static TestLlamaParam *
norm_param (const TestLlamaModel *m)
{
  return param (m, m->params->len - (m->cfg.tied ? 1 : 2));
}

static TestLlamaParam *
head_param (const TestLlamaModel *m)
{
  return m->cfg.tied ? param (m, 0) : param (m, m->params->len - 1);
}

static double
forward_and_loss (TestLlamaModel *m, gboolean logits)
{
  guint64 n = m->n, L = m->cfg.n_layers;
  stow_decoder_embed_forward (stow_llama_decoder (m->rt), param (m, 0)->w,
                              m->tokens, n, m->x0);
  for (guint64 l = 0; l < L; l++)
    {
      StowLlamaLayerWeights lw;
      test_llama_model_layer (m, l, FALSE, &lw);
      stow_decoder_layer_forward (stow_llama_decoder (m->rt), m->batch, m->seq,
                                  &lw, l ? m->outs[l - 1] : m->x0,
                                  &m->saved[l]);
    }
  void *last = L ? m->outs[L - 1] : m->x0;
  TestLlamaParam *norm = norm_param (m), *head = head_param (m);
  if (logits)
    test_llama_head_logits (m->rt, n, norm->w, head->w, last, m->logits);
  /* The head's gradient lands in the embedding's when tied; the
   * embedding's backward then adds to it. */
  return test_llama_head_loss (m->rt, n, norm->w, head->w, last, m->targets,
                               1.0 / (double)n, norm->g, head->g, FALSE, last,
                               m->scratch, m->chunk)
         / (double)n;
}

double
test_llama_model_loss (TestLlamaModel *m)
{
  return forward_and_loss (m, FALSE);
}

double
test_llama_model_step (TestLlamaModel *m, gboolean logits)
{
  double loss = forward_and_loss (m, logits);
  for (guint64 l = m->cfg.n_layers; l-- > 0;)
    {
      StowLlamaLayerWeights lw, lg;
      test_llama_model_layer (m, l, FALSE, &lw);
      test_llama_model_layer (m, l, TRUE, &lg);
      void *x = l ? m->outs[l - 1] : m->x0;
      stow_decoder_layer_backward (stow_llama_decoder (m->rt), m->batch, m->seq,
                                   &lw, x, &m->saved[l], &lg, FALSE, m->ws, x);
    }
  stow_decoder_embed_backward (stow_llama_decoder (m->rt), m->tokens, m->n,
                               m->x0, param (m, 0)->g, m->cfg.tied);
  return loss;
}

double
test_llama_head_loss (StowLlama *rt, guint64 n, const void *norm,
                      const void *head, const void *x, const gint32 *targets,
                      double scale, void *dnorm, void *dhead,
                      gboolean accumulate, void *dx, float *scratch,
                      guint64 chunk)
{
  double sum = 0;
  stow_decoder_head_loss (stow_llama_decoder (rt), n, norm, head, x, targets,
                          scale, dnorm, dhead, accumulate, dx, scratch, chunk,
                          &sum);
  return sum;
}

void
test_llama_head_logits (StowLlama *rt, guint64 n, const void *norm,
                        const void *head, const void *x, float *logits)
{
  guint64 h = stow_llama_get_config (rt)->hidden;
  g_autofree float *xn = g_new (float, MAX (n * h, 1));
  stow_decoder_head_logits (stow_llama_decoder (rt), n, norm, head, x, logits,
                            xn);
}
