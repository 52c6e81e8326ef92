/* SPDX-License-Identifier: MIT
 *
 * planner/lower-step.c: one rank's step, op by op: the loads of
 * streamed units into their slots and the item loop (forward, loss and
 * backward of each unit and micro-batch, with recomputation and
 * checkpoint offload).  The gradients' path and the optimizer are
 * lower-optim.c's; the rank's set-up is lower.c's.
 */
#include "planner/lower-private.h"

#include <math.h>

#include "core/zero.h"

/* The accumulate flag of an op that writes @u's gradients (and @v's, the
 * tied embedding a loss writes, or NULL): the first write of the step
 * overwrites, which is the zero-grad. */
static gboolean
grad_write (StowLowerUnit *u, StowLowerUnit *v)
{
  gboolean acc = u->grad_written;
  g_assert (v == NULL || v->grad_written == acc);
  u->grad_written = TRUE;
  if (v)
    v->grad_written = TRUE;
  return acc;
}

/* Loads use @k into its slot: read from NVMe into a staging buffer, copy
 * to the device, all-gather the shards (the stages present in this plan). */
static void
emit_load (StowLower *L, StowLowerRank *R, guint k)
{
  StowLowerUse *use = &g_array_index (R->uses, StowLowerUse, k);
  if (use->emitted)
    return;
  use->emitted = TRUE;
  const StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, use->unit);
  guint slot = k % 2;
  guint prev
      = k >= 2 ? g_array_index (R->uses, StowLowerUse, k - 2).freed : STOW_NONE;
  guint64 bytes = stow_bytes (u->gparams, L->wg);
  guint64 part = stow_lower_load_part (L, u);
  guint64 shard = stow_bytes (part, L->w);
  StowOp op;
  /* The slot's bytes are the persistent slot buffer's; this buffer names
   * its occupant, so that reuse and loads can be checked. */
  use->buffer = stow_program_buffer (
      L->p, R->rank, STOW_TIER_DEVICE, 0, STOW_SLOT_LAYER + (gint)slot, FALSE,
      "slot %u: %s%d", slot, u->layer >= 0 ? "L" : "unit ", u->layer);
  stow_lower_holds (L, use->buffer, STOW_BUF_WEIGHTS, u->pu, 1, L->wdt,
                    u->layer, 0);
  guint ready = STOW_NONE;
  if (L->off_par)
    {
      guint staging = STOW_NONE;
      if (L->nvme_par)
        {
          /* Four staging buffers in pinned memory (the memory model's
           * "parameter staging buffers"). */
          guint sprev
              = k >= 4
                    ? g_array_index (R->uses, StowLowerUse, k - 4).staging_freed
                    : STOW_NONE;
          staging
              = stow_program_buffer (L->p, R->rank, STOW_TIER_PINNED, 0,
                                     STOW_SLOT_STAGING + (gint)(k % 4), FALSE,
                                     "staging %u: %d", k % 4, u->layer);
          stow_lower_alloc (L, R->rank, STOW_STREAM_NVME_READ, staging, &sprev,
                            1);
          op = stow_lower_copy_op (R->rank, STOW_STREAM_NVME_READ,
                                   STOW_COPY_PARAMS_READ, STOW_TIER_NVME,
                                   STOW_TIER_PINNED, shard, u->layer);
          op.unit = u->pu, op.count = part;
          stow_lower_op_io (&op, STOW_NONE, STOW_NONE, staging);
          ready = stow_lower_emit (L, &op, NULL, 0, TRUE, "staged");
        }
      stow_lower_alloc (L, R->rank, STOW_STREAM_H2D, use->buffer, &prev, 1);
      op = stow_lower_copy_op (
          R->rank, STOW_STREAM_H2D,
          staging != STOW_NONE ? STOW_COPY_STAGED_UP : STOW_COPY_WEIGHTS_UP,
          STOW_TIER_PINNED, STOW_TIER_DEVICE, shard, u->layer);
      op.unit = u->pu, op.count = part;
      stow_lower_op_io (&op, staging, STOW_NONE, use->buffer);
      ready = stow_lower_emit (L, &op, &ready, 1, TRUE, "copied up");
      if (staging != STOW_NONE)
        use->staging_freed = stow_lower_free (L, R->rank, STOW_STREAM_H2D,
                                              staging, NULL, 0, TRUE);
      if (L->n > 1)
        {
          /* Every rank's part, copied up into its place, gathered. */
          op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER, bytes,
                                   u->layer);
          op.unit = u->pu, op.count = u->gparams;
          stow_lower_op_io (&op, use->buffer, STOW_NONE, use->buffer);
          ready = stow_lower_emit (L, &op, &ready, 1, TRUE, "gathered");
        }
    }
  else
    {
      stow_lower_alloc (L, R->rank, STOW_STREAM_COMM, use->buffer, &prev, 1);
      op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER, bytes,
                               u->layer);
      op.unit = u->pu, op.count = u->gparams;
      stow_lower_op_io (&op, R->params_buf, STOW_NONE, use->buffer);
      ready = stow_lower_emit (L, &op, NULL, 0, TRUE, "gathered");
    }
  use->loaded = ready;
  /* Updated weights queued since the last load go up behind this one, so
   * that they never hold up a prefetch. */
  stow_lower_flush_refreshes (L, R);
}

/* The buffer holding a unit's weights for an item. */
static guint
weights_of (StowLower *L, StowLowerRank *R, const StowLowerUnit *u,
            const StowLowerItem *it)
{
  if (!stow_lower_needs_weights (u, it))
    return STOW_NONE;
  if (it->use != STOW_NONE)
    return g_array_index (R->uses, StowLowerUse, it->use).buffer;
  if (u->resident != STOW_NONE)
    return u->resident;
  return R->params_buf;
}

/* ---- the item loop ------------------------------------------------------ */

/* The item being lowered and what its ops share. */
typedef struct
{
  guint i; /* its index in R->items */
  StowLowerItem *it;
  StowLowerUnit *u;
  StowLowerUse *use; /* the load of its weights, or NULL */
  guint vs;          /* its virtual stage */
  gboolean first_of_chunk, last_layer_of_chunk;
  guint waits[6]; /* what its compute op waits for */
  guint nw;
  guint wbuf; /* the buffer holding the unit's weights, or STOW_NONE */
  /* The gradient slot it writes and the copy of the unit's earlier
   * micro-batches into it (stow_lower_grad_slot), or STOW_NONE. */
  guint grad, up;
  /* A tied head's loss: the embedding's gradient buffer it writes too and
   * the copy up into it (R->tied_grad).  The embedding's backward: TRUE
   * when it adds to that buffer (grad). */
  guint tied_grad, tied_up;
  gboolean tied;
  guint act_idx; /* (unit, micro-batch) in R->acts */
} ItemCtx;

/* Allocates the item loop's state: per micro-batch and layer,
 * activations; per micro-batch, inputs and logits. */
static void
items_init (StowLower *L, StowLowerRank *R)
{
  const StowLayout *l = L->l;
  guint m = (guint)l->grad_accum;
  guint n_units = R->units->len;
  R->acts = g_new (guint, (gsize)n_units * m);
  R->host_acts = g_new (guint, (gsize)n_units * m);
  R->host_ready = g_new (guint, (gsize)n_units * m);
  R->last_compute = STOW_NONE;
  R->inputs = g_new (guint, m);
  R->logits = g_new (guint, m);
  R->ready_order = g_array_new (FALSE, FALSE, sizeof (guint));
  R->pending = g_array_new (FALSE, FALSE, sizeof (guint));
  for (guint i = 0; i < (guint)(n_units * m); i++)
    R->acts[i] = R->host_acts[i] = STOW_NONE;
  for (guint j = 0; j < m; j++)
    R->inputs[j] = R->logits[j] = STOW_NONE;
  /* The tied head and the embedding on this rank (emit_loss). */
  R->tied_grad = g_new (guint, m);
  for (guint j = 0; j < m; j++)
    R->tied_grad[j] = STOW_NONE;
  /* Two all-reduces of the s b h activations per layer and pass under
   * tensor parallelism (Shoeybi et al. 2019); reduce-scatter plus
   * all-gather under sequence parallelism move the same bytes. */
  R->tp_bytes
      = l->tp > 1 ? 2
                        * (guint64)llround (2.0 * (double)L->t->seq_len / l->cp
                                            * l->micro_batch * L->m->hidden)
                  : 0;
}

/* Sets up item @i: where it sits in its chunk, the gradient slot it
 * writes, the load of its weights (and the prefetch of the next). */
static void
item_begin (StowLower *L, StowLowerRank *R, guint i, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  StowLowerItem *it = &g_array_index (R->items, StowLowerItem, i);
  StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, it->unit);
  guint cfirst = g_array_index (R->chunk_first, guint, it->chunk);
  guint ccount = g_array_index (R->chunk_count, guint, it->chunk);
  *X = (ItemCtx){ .i = i, .it = it, .u = u };
  X->vs = it->chunk * l->pp + rank;
  X->first_of_chunk = it->unit == cfirst;
  X->last_layer_of_chunk
      = it->unit + 1 == cfirst + ccount
        || (it->unit + 2 == cfirst + ccount
            && g_array_index (R->units, StowLowerUnit, it->unit + 1).layer
                   == STOW_LAYER_HEAD);
  for (guint k = 0; k < G_N_ELEMENTS (X->waits); k++)
    X->waits[k] = STOW_NONE;
  X->use = it->use != STOW_NONE
               ? &g_array_index (R->uses, StowLowerUse, it->use)
               : NULL;
  /* The gradient slot this item writes (the head's loss, a layer's or
   * the embedding's backward), set up before the next use's prefetch
   * so that bringing earlier micro-batches up (stow_lower_grad_slot) is not
   * queued behind it on the h2d stream. */
  X->grad = X->up = X->tied_grad = X->tied_up = STOW_NONE;
  X->tied = R->tied_unit == it->unit && it->pass == STOW_PASS_B;
  if (X->tied && L->n == 1)
    X->grad = R->tied_grad[it->mb]; /* the loss started it */
  else if (stow_lower_uses_grad_slots (L) && u->params > 0
           && (it->pass == STOW_PASS_F ? u->layer == STOW_LAYER_HEAD
                                       : u->layer != STOW_LAYER_HEAD))
    {
      guint sl = R->grad_slot_count % 2;
      g_autofree char *what = u->layer == STOW_LAYER_HEAD ? g_strdup ("head")
                              : u->layer == STOW_LAYER_EMBEDDING
                                  ? g_strdup ("embedding")
                                  : g_strdup_printf ("L%d", u->layer);
      X->grad = stow_lower_holds (
          L,
          stow_program_buffer (p, rank, STOW_TIER_DEVICE, 0,
                               STOW_SLOT_GRADS + (gint)sl, FALSE,
                               "gradient slot %u: %s", sl, what),
          STOW_BUF_GRADS, u->pu, 1, L->gdt, u->layer, it->mb);
      X->up = stow_lower_grad_slot (L, R, u, X->grad, &R->grad_slot_freed[sl]);
    }
  if (R->tied_unit != STOW_NONE && it->pass == STOW_PASS_F
      && u->layer == STOW_LAYER_HEAD)
    {
      /* The embedding's gradient of this micro-batch, from the loss that
       * writes it first to the embedding's backward that adds to it: the
       * order in which the run that keeps the gradients on the device
       * sums them. */
      StowLowerUnit *e = &g_array_index (R->units, StowLowerUnit, R->tied_unit);
      X->tied_grad = R->tied_grad[it->mb] = stow_lower_holds (
          L,
          stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                               stow_bytes (e->params, L->g), -1, FALSE,
                               "embedding gradients mb%u (tied head)", it->mb),
          STOW_BUF_GRADS, e->pu, 1, L->gdt, e->layer, it->mb);
      X->tied_up = stow_lower_grad_slot (L, R, e, X->tied_grad, &R->tied_freed);
    }
  if (X->use)
    {
      emit_load (L, R, it->use);
      /* Prefetch: the next use's load is queued before this compute,
       * so its stream runs it as soon as its slot is free. */
      if (it->use + 1 < R->uses->len)
        emit_load (L, R, it->use + 1);
      X->waits[X->nw++] = X->use->loaded;
    }
  X->wbuf = weights_of (L, R, u, it);
  X->act_idx = it->unit * (guint)l->grad_accum + it->mb;
}

/* The gradient path of an op that wrote the item's gradients (@done):
 * reduced, copied down, the slot freed; the unit's gradients are ready
 * after its last. */
static void
item_grads (StowLower *L, StowLowerRank *R, ItemCtx *X, guint done)
{
  StowLowerUnit *u = X->u;
  /* Several ranks: the tied embedding's backward wrote a slot of its own,
   * reduced together with the loss's write of the same micro-batch. */
  guint pair = X->tied && L->n > 1 ? R->tied_grad[X->it->mb] : STOW_NONE;
  guint ev = stow_lower_grad_path (L, R, u, X->grad, X->tied && L->n == 1, pair,
                                   done, X->i == u->last_grad_item);
  if (X->i == u->last_grad_item)
    u->grads_ready = ev;
}

/* The embedding's forward: the micro-batch's tokens and targets into its
 * input buffer, then the lookup. */
static guint
emit_embedding_forward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  StowOp op;
  R->inputs[it->mb] = stow_lower_holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->input_bytes, -1, FALSE,
                           "input ids and embeddings mb%u", it->mb),
      STOW_BUF_INPUT, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, R->inputs[it->mb], NULL, 0);
  /* Tokens and targets of the micro-batch. */
  stow_op_init (&op, STOW_OP_DATA, STOW_STREAM_COMPUTE, rank);
  op.micro_batch = it->mb;
  stow_lower_op_io (&op, STOW_NONE, STOW_NONE, R->inputs[it->mb]);
  stow_lower_emit (L, &op, NULL, 0, FALSE, NULL);
  stow_op_init (&op, STOW_OP_FORWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  stow_lower_op_io (&op, X->wbuf, R->inputs[it->mb], R->inputs[it->mb]);
  return stow_lower_emit (L, &op, X->waits, X->nw, TRUE, "forward");
}

/* The loss: the output layer forward and backward into the logits, and
 * its gradients (a tied head's into the embedding's too). */
static guint
emit_loss (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  StowOp op;
  R->logits[it->mb] = stow_lower_holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->logits_bytes, -1,
                           FALSE, "logits mb%u", it->mb),
      STOW_BUF_LOGITS, STOW_NONE, 0, STOW_DTYPE_F32, u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, R->logits[it->mb], NULL, 0);
  guint grad = X->grad, up = X->up;
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_LOSS, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  /* A tied head writes the embedding's gradient too. */
  StowLowerUnit *tied = NULL;
  if (u->params < u->gparams)
    for (guint k = 0; k < R->units->len; k++)
      if (g_array_index (R->units, StowLowerUnit, k).layer
          == STOW_LAYER_EMBEDDING)
        tied = &g_array_index (R->units, StowLowerUnit, k);
  op.accumulate = grad_write (u, tied);
  if (X->tied_up != STOW_NONE)
    X->waits[X->nw++] = X->tied_up;
  /* Slots start afresh or add to the earlier micro-batches brought up;
   * a tied head's two buffers do the same at the same micro-batches. */
  if (grad != STOW_NONE)
    op.accumulate = up != STOW_NONE;
  else if (X->tied_grad != STOW_NONE)
    op.accumulate = X->tied_up != STOW_NONE;
  g_assert (grad == STOW_NONE || X->tied_grad == STOW_NONE
            || (up != STOW_NONE) == (X->tied_up != STOW_NONE));
  stow_lower_op_io (&op, X->wbuf, STOW_NONE, R->logits[it->mb]);
  if (grad != STOW_NONE)
    op.writes[op.n_writes++] = grad;
  else if (R->grads_buf != STOW_NONE && u->params > 0)
    op.writes[op.n_writes++] = R->grads_buf;
  if (X->tied_grad != STOW_NONE)
    op.writes[op.n_writes++] = X->tied_grad;
  guint done = stow_lower_emit (L, &op, X->waits, X->nw, TRUE, "loss");
  if (u->params > 0)
    item_grads (L, R, X, done);
  return done;
}

/* --offload-activations: the checkpoint goes down as soon as the layer's
 * forward (@done) has written it; the device copy is freed after. */
static void
emit_checkpoint_down (StowLower *L, StowLowerRank *R, ItemCtx *X, guint done)
{
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  guint a = X->act_idx;
  guint hb
      = stow_program_buffer (L->p, rank, STOW_TIER_PINNED, L->ckpt, -1, FALSE,
                             "checkpoint L%d mb%u (host)", u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, hb, NULL, 0);
  StowOp c = stow_lower_copy_op (rank, STOW_STREAM_D2H,
                                 STOW_COPY_CHECKPOINT_DOWN, STOW_TIER_DEVICE,
                                 STOW_TIER_PINNED, L->ckpt, u->layer);
  c.micro_batch = it->mb;
  stow_lower_op_io (&c, R->acts[a], STOW_NONE, hb);
  guint down = stow_lower_emit (L, &c, &done, 1, TRUE, "checkpoint down");
  stow_lower_free (L, rank, STOW_STREAM_D2H, R->acts[a], &down, 1, FALSE);
  R->acts[a] = STOW_NONE;
  R->host_acts[a] = hb;
  R->host_ready[a] = down;
}

/* A layer's forward: its activations (a checkpoint only, when it is
 * recomputed) kept for the backward. */
static guint
emit_layer_forward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  guint a = X->act_idx;
  StowOp op;
  guint64 bytes = u->recompute ? L->ckpt : L->full;
  R->acts[a] = stow_lower_holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, bytes, -1, FALSE,
                           "activations L%d mb%u", u->layer, it->mb),
      u->recompute ? STOW_BUF_CHECKPOINT : STOW_BUF_ACTIVATIONS, STOW_NONE, 0,
      L->wdt, u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, R->acts[a], NULL, 0);
  stow_op_init (&op, STOW_OP_FORWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  /* A recomputed layer's forward still computes what it does not keep: a
   * working set for it, freed at once. */
  guint fws = STOW_NONE;
  if (u->recompute && L->full > L->ckpt)
    {
      fws = stow_lower_holds (
          L,
          stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->full - L->ckpt, -1,
                               FALSE, "forward working set L%d mb%u", u->layer,
                               it->mb),
          STOW_BUF_RECOMPUTED, STOW_NONE, 0, L->wdt, u->layer, it->mb);
      stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, fws, NULL, 0);
    }
  stow_lower_op_io (&op, X->wbuf, STOW_NONE, R->acts[a]);
  if (fws != STOW_NONE)
    op.writes[op.n_writes++] = fws;
  guint done = stow_lower_emit (L, &op, X->waits, X->nw, TRUE, "forward");
  if (fws != STOW_NONE)
    stow_lower_free (L, rank, STOW_STREAM_COMPUTE, fws, NULL, 0, FALSE);
  R->last_compute = done;
  if (l->offload_activations && u->recompute)
    emit_checkpoint_down (L, R, X, done);
  return done;
}

/* A forward item: after the previous stage's activations, and its own
 * sent on to the next stage at the end of the chunk. */
static guint
emit_forward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  guint done;
  if (X->first_of_chunk && X->vs > 0)
    X->waits[X->nw++]
        = stow_lower_xevent (L, rank, STOW_PASS_F, X->vs - 1, it->mb);
  if (u->layer == STOW_LAYER_EMBEDDING)
    done = emit_embedding_forward (L, R, X);
  else if (u->layer == STOW_LAYER_HEAD)
    done = emit_loss (L, R, X);
  else
    done = emit_layer_forward (L, R, X);
  if (X->last_layer_of_chunk && X->vs + 1 < l->pp * l->vpp)
    {
      StowOp op = stow_lower_send_op (L, rank, u->layer, it->mb);
      op.record = stow_lower_xevent (L, rank, STOW_PASS_F, X->vs, it->mb);
      stow_lower_emit (L, &op, &done, 1, FALSE, NULL);
    }
  return done;
}

/* The embedding's backward: a scatter of the input gradient into its
 * gradients. */
static guint
emit_embedding_backward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  StowOp op;
  guint grad = X->grad, up = X->up;
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_BACKWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.accumulate = grad_write (u, NULL);
  if (grad != STOW_NONE)
    op.accumulate = (X->tied && L->n == 1) /* onto the loss's */
                    || up != STOW_NONE;
  stow_lower_op_io (&op, R->inputs[it->mb], STOW_NONE,
                    grad != STOW_NONE ? grad : R->grads_buf);
  guint done = stow_lower_emit (L, &op, X->waits, X->nw, TRUE, "backward");
  stow_lower_free (L, rank, STOW_STREAM_COMPUTE, R->inputs[it->mb], NULL, 0,
                   FALSE);
  if (u->params > 0)
    item_grads (L, R, X, done);
  return done;
}

/* The loss's backward has run: the last layer's backward frees the
 * logits and holds the loss gradient instead.  Returns that buffer, or
 * STOW_NONE. */
static guint
emit_loss_grad (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  guint n_units = R->units->len;
  if (R->logits[it->mb] == STOW_NONE || it->unit + 2 != n_units
      || g_array_index (R->units, StowLowerUnit, n_units - 1).layer
             != STOW_LAYER_HEAD)
    return STOW_NONE;
  /* The checkpoint upload waits for this free: the loss's peak does not
   * hold the prefetched checkpoint. */
  R->last_compute = stow_lower_free (L, rank, STOW_STREAM_COMPUTE,
                                     R->logits[it->mb], NULL, 0, TRUE);
  R->logits[it->mb] = STOW_NONE;
  guint dh = stow_lower_holds (
      L,
      stow_program_buffer (L->p, rank, STOW_TIER_DEVICE, L->loss_grad_bytes, -1,
                           FALSE, "loss gradient mb%u", it->mb),
      STOW_BUF_LOSS_GRAD, STOW_NONE, 0, L->wdt, X->u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, dh, NULL, 0);
  return dh;
}

/* Brings a checkpoint on the host back for its recomputation; the
 * backward waits for it. */
static void
emit_checkpoint_up (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  guint a = X->act_idx;
  if (R->host_acts[a] == STOW_NONE)
    return;
  R->acts[a] = stow_lower_holds (
      L,
      stow_program_buffer (L->p, rank, STOW_TIER_DEVICE, L->ckpt, -1, FALSE,
                           "checkpoint L%d mb%u", u->layer, it->mb),
      STOW_BUF_CHECKPOINT, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  /* One checkpoint of prefetch: the upload starts once the compute op
   * before this backward has (the memory model's two checkpoints on the
   * device). */
  guint gate[2] = { R->host_ready[a], R->last_compute };
  guint ngate = R->last_compute != STOW_NONE ? 2 : 1;
  stow_lower_alloc (L, rank, STOW_STREAM_H2D, R->acts[a], gate, ngate);
  StowOp c = stow_lower_copy_op (rank, STOW_STREAM_H2D, STOW_COPY_CHECKPOINT_UP,
                                 STOW_TIER_PINNED, STOW_TIER_DEVICE, L->ckpt,
                                 u->layer);
  c.micro_batch = it->mb;
  stow_lower_op_io (&c, R->host_acts[a], STOW_NONE, R->acts[a]);
  guint ck = stow_lower_emit (L, &c, gate, ngate, TRUE, "checkpoint up");
  stow_lower_free (L, rank, STOW_STREAM_H2D, R->host_acts[a], &ck, 1, FALSE);
  R->host_acts[a] = STOW_NONE;
  g_assert (X->nw < G_N_ELEMENTS (X->waits));
  X->waits[X->nw++] = ck;
}

/* Full recomputation: the layer's forward again from its checkpoint,
 * into a buffer of what it did not keep.  Returns that buffer. */
static guint
emit_recompute (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  StowOp op;
  guint rec = stow_lower_holds (
      L,
      stow_program_buffer (L->p, rank, STOW_TIER_DEVICE,
                           L->full - MIN (L->ckpt, L->full), -1, FALSE,
                           "recomputed L%d mb%u", u->layer, it->mb),
      STOW_BUF_RECOMPUTED, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, rec, NULL, 0);
  stow_op_init (&op, STOW_OP_RECOMPUTE, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  stow_lower_op_io (&op, X->wbuf, R->acts[X->act_idx], rec);
  stow_lower_emit (L, &op, X->waits, X->nw, FALSE, NULL);
  X->nw = 0; /* the stream orders the backward after it */
  return rec;
}

/* A layer's backward: the loss gradient or the next layer's, its
 * checkpoint back and recomputed when it was, a working set; then its
 * gradients' path and the input gradient sent to the previous stage at
 * the start of the chunk. */
static guint
emit_layer_backward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  guint a = X->act_idx;
  StowOp op;
  guint rec = STOW_NONE;
  guint dh = emit_loss_grad (L, R, X);
  emit_checkpoint_up (L, R, X);
  if (u->recompute)
    rec = emit_recompute (L, R, X);
  guint ws = stow_lower_holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->block, -1, FALSE,
                           "backward working set L%d mb%u", u->layer, it->mb),
      STOW_BUF_WORKSPACE, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  stow_lower_alloc (L, rank, STOW_STREAM_COMPUTE, ws, NULL, 0);
  guint grad = X->grad, up = X->up; /* up: partial gradients up */
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_BACKWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  /* A gradient slot holds this micro-batch's gradients, added to the
   * earlier ones brought up (stow_lower_grad_slot). */
  op.accumulate = grad != STOW_NONE ? up != STOW_NONE : grad_write (u, NULL);
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  stow_lower_op_io (&op, X->wbuf, R->acts[a],
                    grad != STOW_NONE ? grad : R->grads_buf);
  if (rec != STOW_NONE)
    op.reads[op.n_reads++] = rec;
  op.writes[op.n_writes++] = ws;
  guint done = stow_lower_emit (L, &op, X->waits, X->nw, TRUE, "backward");
  R->last_compute = done;
  stow_lower_free (L, rank, STOW_STREAM_COMPUTE, R->acts[a], NULL, 0, FALSE);
  if (rec != STOW_NONE)
    stow_lower_free (L, rank, STOW_STREAM_COMPUTE, rec, NULL, 0, FALSE);
  stow_lower_free (L, rank, STOW_STREAM_COMPUTE, ws, NULL, 0, FALSE);
  if (dh != STOW_NONE)
    stow_lower_free (L, rank, STOW_STREAM_COMPUTE, dh, NULL, 0, FALSE);
  item_grads (L, R, X, done);
  if (X->first_of_chunk && X->vs > 0)
    {
      op = stow_lower_send_op (L, rank, u->layer, it->mb);
      op.record = stow_lower_xevent (L, rank, STOW_PASS_B, X->vs, it->mb);
      stow_lower_emit (L, &op, &done, 1, FALSE, NULL);
    }
  return done;
}

/* A backward item: after the next stage's gradients at the end of the
 * chunk. */
static guint
emit_backward (StowLower *L, StowLowerRank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  if (X->last_layer_of_chunk && X->vs + 1 < l->pp * l->vpp)
    X->waits[X->nw++]
        = stow_lower_xevent (L, R->rank, STOW_PASS_B, X->vs + 1, X->it->mb);
  if (X->u->layer == STOW_LAYER_EMBEDDING)
    return emit_embedding_backward (L, R, X);
  return emit_layer_backward (L, R, X);
}

/* After item's compute (@done): its slot freed after the use's last
 * item; the unit's gradients complete after its last, and with
 * ZeRO-Offload CPU Adam on its shard as soon as they are down (Ren et
 * al. 2021, §4.1). */
static void
item_end (StowLower *L, StowLowerRank *R, ItemCtx *X, guint done)
{
  StowLowerItem *it = X->it;
  StowLowerUnit *u = X->u;
  StowLowerUse *use = X->use;
  if (use && X->i == use->last_item)
    use->freed = stow_lower_free (L, R->rank, STOW_STREAM_COMPUTE, use->buffer,
                                  NULL, 0, TRUE);
  u->last_use = done;
  if (X->i != u->last_grad_item || u->params == 0)
    return;
  g_array_append_val (R->ready_order, it->unit);
  if (L->off_opt && !L->nvme_opt && !L->so->delayed_update
      && !stow_lower_clipping (L))
    {
      StowOp op;
      guint64 shard = stow_lower_host_part (L, u);
      stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
      op.count = shard, op.layer = u->layer, op.unit = u->pu;
      stow_lower_op_io (&op, R->host_grads_buf, STOW_NONE,
                        stow_lower_adam_out (L, R));
      u->grads_ready
          = stow_lower_emit (L, &op, &u->grads_ready, 1, TRUE, "updated");
      u->last_use = done;
      g_array_append_val (R->pending, it->unit);
    }
}

void
stow_lower_step (StowLower *L, StowLowerRank *R)
{
  items_init (L, R);

  if (R->uses->len > 0)
    emit_load (L, R, 0);
  for (guint i = 0; i < R->items->len; i++)
    {
      ItemCtx X;
      item_begin (L, R, i, &X);
      guint done = X.it->pass == STOW_PASS_F ? emit_forward (L, R, &X)
                                             : emit_backward (L, R, &X);
      item_end (L, R, &X, done);
    }
  /* Logits not freed by a layer's backward (a stage with no layers). */
  for (guint j = 0; j < (guint)L->l->grad_accum; j++)
    if (R->logits[j] != STOW_NONE)
      stow_lower_free (L, R->rank, STOW_STREAM_COMPUTE, R->logits[j], NULL, 0,
                       FALSE);

  stow_lower_flush_refreshes (L, R);
  stow_lower_optimizer (L, R, R->ready_order);
  g_array_unref (R->pending);
  g_array_unref (R->ready_order);
  g_free (R->acts);
  g_free (R->host_acts);
  g_free (R->host_ready);
  g_free (R->inputs);
  g_free (R->logits);
  g_clear_pointer (&R->tied_grad, g_free);
}
