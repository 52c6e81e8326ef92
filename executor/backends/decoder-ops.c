/* SPDX-License-Identifier: MIT
 *
 * executor/backends/decoder-ops.c: a compute op of the step program run by
 * the decoder recipe (decoder-ops.h): which buffers hold the op's weights,
 * gradients, saved activations, input and working set, by the tensor map.
 */
#include "executor/backends/decoder-ops.h"

#include "executor/comm/comm.h" /* stow_comm_sum_rank_order */

static guint64
unit_numel (const StowTensorMap *m, guint unit)
{
  return g_array_index (m->p->units, StowUnit, unit).numel;
}

/* Whether op @op's gradients go to the map's scratch first (tensors.h's
 * acc_scratch): it adds to gradients, and the backend asks for addition. */
static gboolean
fresh_then_add (const StowTensorMap *m, const StowOp *op)
{
  return op->accumulate && m->acc_scratch != NULL;
}

/* @dst (@n gradients) += @src, each sum rounded to the gradient dtype:
 * the rank-order sum of the collectives (executor/comm/comm.h), so that
 * one rank adds micro-batches as N ranks add them.  Element by element,
 * so the backend's threads take chunks of it with the same bits (on one
 * thread it was 7.7% of a perf profile's samples of the bench model
 * accumulating 4 micro-batches, the other thread waiting; threaded, its
 * step went from 2.29-2.38 to 2.08-2.26 s). */
static void
grads_add (const StowTensorMap *m, guint8 *dst, const guint8 *src, guint64 n)
{
  enum
  {
    CHUNK = 1 << 16
  };
  guint64 es = stow_dtype_size (m->p->grad_dtype);
  guint64 chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(dynamic)                                     \
    num_threads(MAX(m->add_threads, 1)) if (chunks > 1)
  for (guint64 c = 0; c < chunks; c++)
    {
      guint64 i0 = c * CHUNK, nc = MIN ((guint64)CHUNK, n - i0);
      const void *two[2] = { dst + i0 * es, src + i0 * es };
      stow_comm_sum_rank_order (dst + i0 * es, two, 2, nc, m->p->grad_dtype);
    }
}

/* Where op @op writes the gradients of @unit: the gradient slot's
 * occupant (or a tied embedding's buffer) holding it, or the persistent
 * gradients. */
static guint8 *
grads_of (const StowTensorMap *m, const StowOp *op, guint unit)
{
  for (guint i = 0; i < op->n_writes; i++)
    {
      const StowBuffer *b = stow_tensor_map_buffer (m, op->writes[i]);
      if (b->kind == STOW_BUF_GRADS && unit >= b->unit_first
          && unit < b->unit_first + b->n_units)
        return stow_tensor_map_unit (m, op->writes[i], unit);
    }
  return stow_tensor_map_unit (m, m->grads_buf, unit);
}

/* The micro-batch's INPUT buffer (m->input says where it keeps its
 * tokens, targets and the embedding's output). */
static guint8 *
input_of (const StowTensorMap *m, const StowOp *op)
{
  return m->addr[m->input_of[op->micro_batch]];
}

static void
run_forward (const StowDecoder *d, const StowTensorMap *m, const StowOp *op)
{
  guint8 *w
      = stow_tensor_map_unit (m, stow_tensor_map_weights_of (m, op), op->unit);
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = input_of (m, op);
      stow_decoder_embed_forward (d, w, (gint32 *)(in + m->input.tokens),
                                  m->n_tokens, in + m->input.x);
      return;
    }
  StowLlamaLayerWeights lw;
  stow_tensor_map_layer (m, w, op->unit, m->esize, &lw);
  StowLlamaSaved s;
  stow_tensor_map_saved (m, op, FALSE, &s);
  if (op->kind == STOW_OP_RECOMPUTE)
    s.out = NULL; /* kept in the checkpoint, which now holds its gradient */
  stow_decoder_layer_forward (
      d, m->p->micro_batch, m->p->seq_len, &lw,
      stow_tensor_map_layer_output (m, op->layer - 1, op->micro_batch), &s);
}

static void
run_loss (const StowDecoder *d, const StowTensorMap *m, const StowOp *op,
          double scale, double *loss_sum)
{
  guint64 n = m->n_tokens;
  guint8 *in = input_of (m, op);
  void *norm, *lm, *dnorm, *dlm;
  stow_tensor_map_head_in (m, stow_tensor_map_weights_of (m, op), &norm, &lm);
  /* The head's gradients, and a tied head's into the embedding's, which
   * may sit in another buffer (a gradient slot holds one unit). */
  gsize ge = stow_dtype_size (m->p->grad_dtype);
  guint8 *head = grads_of (m, op, m->head_unit);
  guint8 *emb
      = m->head_lm != G_MAXUINT64 ? NULL : grads_of (m, op, m->emb_unit);
  /* Fresh into the scratch: the head unit, then a tied embedding. */
  gboolean fresh = fresh_then_add (m, op);
  guint64 nh = unit_numel (m, m->head_unit);
  guint8 *h = fresh ? m->acc_scratch : head;
  dnorm = h + m->head_norm * ge;
  dlm = emb == NULL ? h + m->head_lm * ge
        : fresh     ? m->acc_scratch + nh * ge
                    : emb;
  guint logits = stow_tensor_map_io (m, op, TRUE, STOW_BUF_LOGITS);
  g_assert (logits != STOW_NONE);
  guint8 *x = stow_tensor_map_layer_output (m, (gint)m->model->n_layers - 1,
                                            op->micro_batch);
  stow_decoder_head_loss (d, n, norm, lm, x, (gint32 *)(in + m->input.targets),
                          scale, dnorm, dlm, op->accumulate && !fresh, x,
                          m->addr[logits], m->chunk, loss_sum);
  if (fresh)
    {
      grads_add (m, head, m->acc_scratch, nh);
      if (emb)
        grads_add (m, emb, m->acc_scratch + nh * ge,
                   unit_numel (m, m->emb_unit));
    }
}

void
stow_decoder_run_eval_loss (const StowDecoder *d, const StowTensorMap *m,
                            const StowOp *op, double *loss_sum)
{
  g_return_if_fail (op->kind == STOW_OP_LOSS && loss_sum != NULL);
  guint8 *in = input_of (m, op);
  void *norm, *lm;
  stow_tensor_map_head_in (m, stow_tensor_map_weights_of (m, op), &norm, &lm);
  guint logits = stow_tensor_map_io (m, op, TRUE, STOW_BUF_LOGITS);
  g_assert (logits != STOW_NONE);
  guint8 *x = stow_tensor_map_layer_output (m, (gint)m->model->n_layers - 1,
                                            op->micro_batch);
  stow_decoder_head_eval_loss (d, m->n_tokens, norm, lm, x,
                               (gint32 *)(in + m->input.targets),
                               m->addr[logits], m->chunk, loss_sum);
}

static void run_layer_backward (const StowDecoder *d, const StowTensorMap *m,
                                const StowOp *op, guint8 *g,
                                gboolean accumulate);

static void
run_backward (const StowDecoder *d, const StowTensorMap *m, const StowOp *op)
{
  guint8 *into = grads_of (m, op, op->unit);
  gboolean fresh = fresh_then_add (m, op);
  guint8 *g = fresh ? m->acc_scratch : into;
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = input_of (m, op);
      stow_decoder_embed_backward (d, (gint32 *)(in + m->input.tokens),
                                   m->n_tokens, in + m->input.x, g,
                                   op->accumulate && !fresh);
    }
  else
    run_layer_backward (d, m, op, g, op->accumulate && !fresh);
  if (fresh)
    grads_add (m, into, g, unit_numel (m, op->unit));
}

static void
run_layer_backward (const StowDecoder *d, const StowTensorMap *m,
                    const StowOp *op, guint8 *g, gboolean accumulate)
{
  StowLlamaLayerWeights lw, lg;
  stow_tensor_map_layer (
      m, stow_tensor_map_unit (m, stow_tensor_map_weights_of (m, op), op->unit),
      op->unit, m->esize, &lw);
  stow_tensor_map_layer (m, g, op->unit, stow_dtype_size (m->p->grad_dtype),
                         &lg);
  StowLlamaSaved s;
  stow_tensor_map_saved (m, op, TRUE, &s);
  guint ws = stow_tensor_map_io (m, op, TRUE, STOW_BUF_WORKSPACE);
  g_assert (ws != STOW_NONE);
  guint8 *x = stow_tensor_map_layer_output (m, op->layer - 1, op->micro_batch);
  stow_decoder_layer_backward (d, m->p->micro_batch, m->p->seq_len, &lw, x, &s,
                               &lg, accumulate, m->addr[ws], x);
}

gboolean
stow_decoder_run_op (const StowDecoder *d, const StowTensorMap *m,
                     const StowOp *op, double loss_scale, double *loss_sum)
{
  g_return_val_if_fail (d != NULL && m != NULL && op != NULL, FALSE);
  switch (op->kind)
    {
    case STOW_OP_FORWARD:
    case STOW_OP_RECOMPUTE:
      run_forward (d, m, op);
      return TRUE;
    case STOW_OP_LOSS:
      g_return_val_if_fail (loss_sum != NULL, FALSE);
      run_loss (d, m, op, loss_scale, loss_sum);
      return TRUE;
    case STOW_OP_BACKWARD:
      run_backward (d, m, op);
      return TRUE;
    default:
      return FALSE;
    }
}
