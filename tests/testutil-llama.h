/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-llama.h: a whole decoder (embedding, layers, fused loss)
 * over executor/llama.h, chained the way the cpu backend chains it: each
 * layer's `out` is the next layer's input and, during backward, its
 * gradient.  Shared by test-llama and the PyTorch oracle's runner.
 */
#pragma once

#include "executor/llama.h"

G_BEGIN_DECLS

typedef struct
{
  const char *name; /* "embed", "wq", ... (layer tensors repeat) */
  guint64 rows, cols;
  void *w, *g; /* (rows, cols) of the runtime's dtype */
} TestLlamaParam;

typedef struct
{
  StowLlamaConfig cfg;
  StowDtype dtype;
  guint64 esize, batch, seq, n, chunk;
  StowLlama *rt;
  GArray *params; /* TestLlamaParam: embed, layer 0.., norm, [lm_head] */
  guint per_layer;
  gint32 *tokens, *targets; /* (n) */
  float *logits;            /* (n, V), filled by test_llama_model_step */
  /* Activations: the embedding's output and each layer's saved tensors. */
  void *x0, **rest, **outs;
  StowLlamaSaved *saved;
  void *ws;
  float *scratch;
} TestLlamaModel;

/* A model for @cfg with zeroed parameters and tokens; NULL and @error when
 * the runtime refuses the config.  @chunk 0: the runtime's loss chunk. */
TestLlamaModel *test_llama_model_new (const StowLlamaConfig *cfg,
                                      StowDtype dtype, guint64 batch,
                                      guint64 seq, guint n_threads,
                                      guint64 chunk, GError **error);
void test_llama_model_free (TestLlamaModel *m);
/* Parameters from a seeded normal-ish draw (norms near 1, weights scaled
 * by 1/sqrt(in)), tokens and targets uniform; a repeated token. */
void test_llama_model_randomize (TestLlamaModel *m, guint32 seed);
/* Copies every parameter of @src (same config) into @m, and the tokens. */
void test_llama_model_copy_params (TestLlamaModel *m,
                                   const TestLlamaModel *src);
/* Layer @l's weights (or gradients, when @grads). */
void test_llama_model_layer (const TestLlamaModel *m, guint64 l, gboolean grads,
                             StowLlamaLayerWeights *lw);
/* Forward only: the mean loss (the head's gradients are written too). */
double test_llama_model_loss (TestLlamaModel *m);
/* Forward and backward: the mean loss, every gradient in params' g, and
 * with @logits the logits in m->logits. */
double test_llama_model_step (TestLlamaModel *m, gboolean logits);
/* Parameter element @i of @p in fp32 (or its gradient). */
/* The cpu runtime's fused output layer and loss (stow_decoder_head_loss
 * on @rt's decoder): the sum of the tokens' losses, as a return value. */
double test_llama_head_loss (StowLlama *rt, guint64 n, const void *norm,
                             const void *head, const void *x,
                             const gint32 *targets, double scale, void *dnorm,
                             void *dhead, gboolean accumulate, void *dx,
                             float *scratch, guint64 chunk);
/* The cpu runtime's logits (n, V) of the output layer (its staging
 * allocated here). */
void test_llama_head_logits (StowLlama *rt, guint64 n, const void *norm,
                             const void *head, const void *x, float *logits);
float test_llama_param_get (const TestLlamaModel *m, const TestLlamaParam *p,
                            gboolean grad, guint64 i);
void test_llama_param_set (const TestLlamaModel *m, TestLlamaParam *p,
                           guint64 i, float v);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (TestLlamaModel, test_llama_model_free)

G_END_DECLS
