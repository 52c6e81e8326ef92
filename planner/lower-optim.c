/* SPDX-License-Identifier: MIT
 *
 * planner/lower-optim.c: the gradients' path of one rank's step (the
 * gradient slots, the reductions, the copies down and the partitions
 * brought back up) and the optimizer (on the device, CPU Adam, the NVMe
 * swap pipeline, the delayed update), with the updated weights' way back
 * to where they are read.  The item loop that calls it is lower-step.c's.
 */
#include "planner/lower-private.h"

#include "core/zero.h"

gboolean
stow_lower_slot_tail (const StowLower *L)
{
  return L->off_opt && L->exact && L->n > 1 && !L->lora;
}

gboolean
stow_lower_uses_grad_slots (StowLower *L)
{
  if (L->lora)
    return FALSE; /* adapters' gradients are small and persistent */
  guint64 gdiv = L->l->zero >= 2 ? L->n : 1;
  /* Exact units on several ranks: every micro-batch's gradients are
   * reduced on their own, whatever the stage (stow_lower_grad_path). */
  return L->off_opt || L->off_par || gdiv > 1 || (L->exact && L->n > 1);
}

/* The rank's part of @u that an offloaded optimizer keeps on the host:
 * core/zero.h's partition (padding included) where the units are exact,
 * else the even share. */
guint64
stow_lower_host_part (const StowLower *L, const StowLowerUnit *u)
{
  return stow_lower_slot_tail (L) ? stow_zero_part (u->params, (guint)L->n)
                                  : stow_lower_div_ceil (u->params, L->n);
}

/* Allocates gradient slot @grad for @u's next gradient write.  With the
 * optimizer on the host and one rank, the unit's earlier micro-batches
 * of the step are on the host: they go back up into the slot (on the
 * h2d stream, which then allocates it) so that the next write adds to
 * them, as the kernels add into the old gradients on the device, and the
 * sum is formed exactly as the device-resident run forms it.  One copy
 * of the unit's partial gradients per micro-batch after the first.
 * Returns that copy's event (the write waits for it and accumulates), or
 * STOW_NONE (the write starts the slot afresh). */
guint
stow_lower_grad_slot (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                      guint grad, guint *freed)
{
  /* Layer-major accumulation (simulate --layer-major) runs a unit's
   * micro-batches back to back, where a copy up behind each copy down
   * would serialise them: its program accumulates on the host (priced,
   * not run by the executor). */
  if (!L->off_opt || L->n > 1 || L->so->layer_major
      || u->last_down == STOW_NONE)
    {
      stow_lower_alloc (L, R->rank, STOW_STREAM_COMPUTE, grad, freed, 1);
      return STOW_NONE;
    }
  stow_lower_alloc (L, R->rank, STOW_STREAM_H2D, grad, freed, 1);
  StowOp op = stow_lower_copy_op (R->rank, STOW_STREAM_H2D, STOW_COPY_GRADS_UP,
                                  STOW_TIER_PINNED, STOW_TIER_DEVICE,
                                  stow_bytes (u->params, L->g), u->layer);
  op.unit = u->pu;
  stow_lower_op_io (&op, R->host_grads_buf, STOW_NONE, grad);
  return stow_lower_emit (L, &op, &u->last_down, 1, TRUE,
                          "partial gradients up");
}

/* After the backward (or loss) op of @u wrote its gradient to @slot (or to
 * the persistent gradients): reduce, copy down, free the slot (@tied: the
 * tied embedding's own buffer rather than a rotating slot).  Returns the
 * event after which the gradient of this micro-batch is in place. */
guint
stow_lower_grad_path (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                      guint slot, gboolean tied, guint pair, guint done,
                      gboolean last_mb)
{
  StowOp op;
  guint64 gbytes = stow_bytes (u->params, L->g);
  guint ev = done;
  if (slot == STOW_NONE)
    {
      /* Persistent full gradients: reduce once, after the last
       * micro-batch, through the gradient buckets. */
      if (last_mb && L->n > 1)
        {
          op = stow_lower_coll_op (L, R->rank,
                                   L->l->zero == 0 ? STOW_COLL_ALL_REDUCE
                                                   : STOW_COLL_REDUCE_SCATTER,
                                   gbytes, u->layer);
          stow_lower_op_io (&op, R->grads_buf, R->bucket_buf[0], R->grads_buf);
          ev = stow_lower_emit (L, &op, &done, 1, TRUE, "reduced");
        }
      return ev;
    }
  StowStream free_on = STOW_STREAM_COMPUTE;
  gboolean tail = stow_lower_slot_tail (L);
  guint64 down = stow_lower_host_part (L, u);
  if (L->n > 1)
    {
      guint w2[2] = { ev, STOW_NONE };
      if (tail && u->reduced)
        {
          /* The optimizer on the host: the rank's partition of the step's
           * gradients so far comes up behind the unit's in the slot, and
           * the reduction adds to it there (DeepSpeed's accumulation
           * through the GPU), in the order one rank adds. */
          op = stow_lower_copy_op (R->rank, STOW_STREAM_H2D, STOW_COPY_GRADS_UP,
                                   STOW_TIER_PINNED, STOW_TIER_DEVICE,
                                   stow_bytes (down, L->g), u->layer);
          op.unit = u->pu, op.count = down;
          stow_lower_op_io (&op, R->host_grads_buf, STOW_NONE, slot);
          guint w[2] = { ev, u->last_down };
          w2[0] = stow_lower_emit (L, &op, w, u->last_down != STOW_NONE ? 2 : 1,
                                   TRUE, "partition up");
        }
      /* Each rank's partition of the micro-batch's gradients, summed over
       * the ranks, is added to its shard (the first of the step starts
       * it): in rank order, the sum one rank forms over the global
       * micro-batches (executor/comm/comm.h). */
      op = stow_lower_coll_op (L, R->rank, STOW_COLL_REDUCE_SCATTER, gbytes,
                               u->layer);
      op.unit = u->pu, op.count = u->params, op.micro_batch = 0;
      op.accumulate = u->reduced;
      u->reduced = TRUE;
      stow_lower_op_io (&op, slot, STOW_NONE, L->off_opt ? slot : R->grads_buf);
      /* A tied embedding's: the loss's write (@pair), then the backward's,
       * per rank, as one rank adds them. */
      if (pair != STOW_NONE)
        op.reads[op.n_reads++] = pair;
      ev = stow_lower_emit (L, &op, w2, 1, TRUE, "reduce-scattered");
      free_on = STOW_STREAM_COMM;
      if (pair != STOW_NONE)
        R->tied_freed = stow_lower_free (L, R->rank, STOW_STREAM_COMM, pair,
                                         &ev, 1, TRUE);
    }
  if (L->off_opt)
    {
      op = stow_lower_copy_op (R->rank, STOW_STREAM_D2H, STOW_COPY_GRADS_DOWN,
                               STOW_TIER_DEVICE, STOW_TIER_PINNED,
                               stow_bytes (down, L->g), u->layer);
      if (tail)
        op.unit = u->pu, op.count = down;
      stow_lower_op_io (&op, slot, STOW_NONE, R->host_grads_buf);
      ev = stow_lower_emit (L, &op, &ev, 1, TRUE, "gradients down");
      u->last_down = ev;
      free_on = STOW_STREAM_D2H;
    }
  else if (L->n == 1)
    {
      /* Accumulate the slot into the gradients (device to device). */
      op = stow_lower_copy_op (R->rank, STOW_STREAM_COMPUTE,
                               STOW_COPY_GRADS_ACCUMULATE, STOW_TIER_DEVICE,
                               STOW_TIER_DEVICE, gbytes, u->layer);
      stow_lower_op_io (&op, slot, STOW_NONE, R->grads_buf);
      ev = stow_lower_emit (L, &op, &ev, 1, TRUE, "accumulated");
    }
  guint fr = stow_lower_free (L, R->rank, free_on, slot, &ev, 1, TRUE);
  if (L->exact && L->n > 1 && L->l->zero == 0 && !L->off_opt && last_mb)
    {
      /* ZeRO 0 keeps every gradient on every rank: the reduced
       * partitions gathered into the unit's full gradients. */
      op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER, gbytes,
                               u->layer);
      op.unit = u->pu, op.count = u->params;
      stow_lower_op_io (&op, R->grads_buf, STOW_NONE, R->grads_buf);
      ev = stow_lower_emit (L, &op, &ev, 1, TRUE, "gradients gathered");
    }
  if (tied)
    R->tied_freed = fr;
  else
    {
      R->grad_slot_freed[R->grad_slot_count % 2] = fr;
      R->grad_slot_count++;
    }
  return ev;
}

/* What CPU Adam writes besides the states: with the parameters on NVMe
 * there is no host copy of the weights, so the updated weights take the
 * place of the gradients they were computed from (same type, same unit
 * layout; offload/adam.h allows the alias), until stored. */
guint
stow_lower_adam_out (const StowLower *L, const StowLowerRank *R)
{
  return L->nvme_par && L->off_opt ? R->host_grads_buf : STOW_NONE;
}

/* Refreshes the device copy of a unit's weights after its update. */
static void
emit_param_refresh (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                    const guint *waits, guint nw, guint64 params,
                    StowStream up_stream)
{
  StowOp op;
  guint ev = STOW_NONE;
  guint64 shard_bytes = stow_bytes (params, L->w);
  if (L->off_par)
    {
      /* With CPU Adam and the parameters on NVMe, the updated weights are
       * in the host gradients' place (stow_lower_optimizer): from there to the
       * store, and up to a resident unit. */
      guint from = stow_lower_adam_out (L, R);
      if (L->nvme_par)
        {
          op = stow_lower_copy_op (R->rank, STOW_STREAM_NVME_WRITE,
                                   STOW_COPY_PARAMS_WRITE, STOW_TIER_PINNED,
                                   STOW_TIER_NVME, shard_bytes, u->layer);
          if (from != STOW_NONE)
            {
              op.unit = u->pu, op.count = params;
              stow_lower_op_io (&op, from, R->write_buf, STOW_NONE);
            }
          stow_lower_emit (L, &op, waits, nw, FALSE, NULL);
        }
      if (u->resident == STOW_NONE)
        return;
      op = stow_lower_copy_op (R->rank, STOW_STREAM_H2D, STOW_COPY_WEIGHTS_UP,
                               STOW_TIER_PINNED, STOW_TIER_DEVICE, shard_bytes,
                               u->layer);
      op.unit = u->pu;
      stow_lower_op_io (&op, from, STOW_NONE, u->resident);
      ev = stow_lower_emit (L, &op, waits, nw, TRUE, "updated up");
      if (L->n > 1)
        {
          op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                                   stow_bytes (u->gparams, L->wg), u->layer);
          op.unit = u->pu, op.count = u->gparams;
          stow_lower_op_io (&op, u->resident, STOW_NONE, u->resident);
          stow_lower_emit (L, &op, &ev, 1, FALSE, NULL);
        }
      return;
    }
  if (up_stream == STOW_STREAM_H2D)
    {
      op = stow_lower_copy_op (R->rank, STOW_STREAM_H2D, STOW_COPY_WEIGHTS_UP,
                               STOW_TIER_PINNED, STOW_TIER_DEVICE, shard_bytes,
                               u->layer);
      stow_lower_op_io (&op, STOW_NONE, STOW_NONE, R->params_buf);
      ev = stow_lower_emit (L, &op, waits, nw, TRUE, "updated up");
      waits = &ev, nw = 1;
    }
  /* ZeRO 1 and 2 keep full weights: gather the updated shards. */
  if (L->l->zero >= 1 && L->l->zero < 3 && L->n > 1)
    {
      op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                               stow_bytes (params * L->n, L->w), u->layer);
      op.unit = u->pu, op.count = u->params;
      stow_lower_op_io (&op, R->params_buf, STOW_NONE, R->params_buf);
      stow_lower_emit (L, &op, waits, nw, FALSE, NULL);
    }
}

/* CPU Adam's updated weights for the units in R->pending, after the last
 * read of the old ones. */
void
stow_lower_flush_refreshes (StowLower *L, StowLowerRank *R)
{
  for (guint i = 0; i < R->pending->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit,
                                         g_array_index (R->pending, guint, i));
      guint w2[2] = { u->grads_ready, u->last_use };
      emit_param_refresh (L, R, u, w2, 2, stow_lower_host_part (L, u),
                          STOW_STREAM_H2D);
    }
  g_array_set_size (R->pending, 0);
}

/* Clipping by the global gradient norm: every update waits for it. */
gboolean
stow_lower_clipping (const StowLower *L)
{
  return L->t->optim.max_grad_norm > 0 && !L->so->delayed_update;
}

/* The global norm of the step's gradients, once every unit's are in
 * place (on the host for an offloaded optimizer); returns its event. */
static guint
emit_grad_norm (StowLower *L, StowLowerRank *R, GArray *ready_order)
{
  StowOp op;
  gboolean host = L->off_opt;
  stow_op_init (&op, STOW_OP_GRAD_NORM,
                host ? STOW_STREAM_CPU_OPTIM : STOW_STREAM_COMPUTE, R->rank);
  op.on_gpu = !host;
  op.count
      = stow_lower_div_ceil (R->sp.params, L->l->zero >= 2 || host ? L->n : 1);
  stow_lower_op_io (&op, host ? R->host_grads_buf : R->grads_buf, STOW_NONE,
                    STOW_NONE);
  g_autofree guint *waits = g_new (guint, ready_order->len + 1);
  guint nw = 0;
  for (guint i = 0; i < ready_order->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit,
                                         g_array_index (ready_order, guint, i));
      if (u->grads_ready != STOW_NONE)
        waits[nw++] = u->grads_ready;
    }
  return stow_lower_emit (L, &op, waits, nw, TRUE, "gradient norm");
}

/* refresh_swap_chunk on several ranks over exact units, whose flat
 * parameters are the rank's partitions of the units in order: the chunk's
 * updated weights up into their places in the device weights (a ZeRO-3
 * shard takes them as they are), and under ZeRO 1 and 2 each unit whose
 * partition the chunk completes gathered.  With the weights in host
 * memory nothing goes up here (resident layers after the pipeline). */
static void
refresh_swap_chunk_ranks (StowLower *L, StowLowerRank *R, guint c,
                          guint nchunks, guint64 chunk, guint64 cp, guint up,
                          guint *done_units, guint64 *unit_end)
{
  if (L->off_par)
    return;
  StowOp op = stow_lower_copy_op (R->rank, STOW_STREAM_H2D, STOW_COPY_CHUNK_UP,
                                  STOW_TIER_PINNED, STOW_TIER_DEVICE,
                                  stow_bytes (cp, L->w), STOW_LAYER_NONE);
  op.first = (guint64)c * chunk, op.count = cp, op.shard = c;
  stow_lower_op_io (&op, STOW_NONE, STOW_NONE, R->params_buf);
  guint ev = stow_lower_emit (L, &op, &up, 1, TRUE, "updated up");
  for (; L->l->zero < 3 && *done_units < R->units->len; (*done_units)++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, *done_units);
      guint64 end = *unit_end + stow_lower_host_part (L, u);
      if (end > (guint64)c * chunk + cp && c + 1 < nchunks)
        break;
      *unit_end = end;
      if (u->params == 0)
        continue;
      op = stow_lower_coll_op (
          L, R->rank, STOW_COLL_ALL_GATHER,
          stow_bytes (stow_lower_host_part (L, u) * L->n, L->w), u->layer);
      op.unit = u->pu, op.count = u->params;
      stow_lower_op_io (&op, R->params_buf, STOW_NONE, R->params_buf);
      stow_lower_emit (L, &op, &ev, 1, FALSE, NULL);
    }
}

/* The updated weights of swap chunk @c (@cp parameters from c * @chunk
 * of the rank's flat parameters, updated by the op recording @up) back
 * where they live.  With the parameters on NVMe each unit the chunk
 * completes goes to the store (and up, resident) whole: the store holds
 * units, not chunks; @done_units and @unit_end carry the units done so
 * far from chunk to chunk. */
static void
refresh_swap_chunk (StowLower *L, StowLowerRank *R, guint c, guint nchunks,
                    guint64 chunk, guint64 cp, guint up, guint *done_units,
                    guint64 *unit_end)
{
  if (L->nvme_par)
    {
      for (; *done_units < R->units->len; (*done_units)++)
        {
          StowLowerUnit *u
              = &g_array_index (R->units, StowLowerUnit, *done_units);
          guint64 end = *unit_end + stow_lower_host_part (L, u);
          if (end > (guint64)c * chunk + cp && c + 1 < nchunks)
            break;
          *unit_end = end;
          if (u->params > 0)
            emit_param_refresh (L, R, u, &up, 1, stow_lower_host_part (L, u),
                                STOW_STREAM_H2D);
        }
      return;
    }
  if (stow_lower_slot_tail (L))
    {
      refresh_swap_chunk_ranks (L, R, c, nchunks, chunk, cp, up, done_units,
                                unit_end);
      return;
    }
  /* The chunk's updated weights go back to where they live. */
  StowLowerUnit dummy = { .layer = STOW_LAYER_NONE, .resident = STOW_NONE };
  guint first_op = L->p->ops->len;
  emit_param_refresh (L, R, &dummy, &up, 1, cp, STOW_STREAM_H2D);
  /* The copies say which parameters: the chunk's range. */
  for (guint o = first_op; o < L->p->ops->len; o++)
    {
      StowOp *e = &g_array_index (L->p->ops, StowOp, o);
      if (e->kind == STOW_OP_COPY)
        {
          e->copy = STOW_COPY_CHUNK_UP;
          e->first = (guint64)c * chunk, e->count = cp, e->shard = c;
        }
    }
}

/* The three-stage swap pipeline (ZeRO-Infinity; DeepSpeed's pipelined
 * optimizer swapper): read chunk i+1 while Adam updates chunk i while
 * chunk i-1 is written back; three pinned buffers.  Every chunk waits
 * for the last unit's gradients and for the gradient norm @norm. */
static void
emit_swap_pipeline (StowLower *L, StowLowerRank *R, GArray *ready_order,
                    guint norm)
{
  StowOp op;
  guint64 shard = stow_lower_div_ceil (R->sp.params, L->n);
  if (stow_lower_slot_tail (L))
    {
      /* The rank's partitions of the units, padding included. */
      shard = 0;
      for (guint i = 0; i < R->units->len; i++)
        shard += stow_lower_host_part (
            L, &g_array_index (R->units, StowLowerUnit, i));
    }
  guint64 chunk = MAX (1, MIN (shard, L->mo->swap_shard_params));
  guint nchunks = (guint)stow_lower_div_ceil (shard, chunk);
  guint last_grads = STOW_NONE;
  for (guint i = 0; i < ready_order->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit,
                                         g_array_index (ready_order, guint, i));
      if (u->grads_ready != STOW_NONE)
        last_grads = u->grads_ready;
    }
  g_autofree guint *freed = g_new (guint, nchunks);
  double per = L->master + L->opt;
  guint done_units = 0;
  guint64 unit_end = 0;
  for (guint c = 0; c < nchunks; c++)
    {
      guint64 cp = MIN (chunk, shard - (guint64)c * chunk);
      guint buf = stow_program_buffer (L->p, R->rank, STOW_TIER_PINNED,
                                       stow_bytes (cp, per), -1, FALSE,
                                       "swap buffer %u", c % 3);
      stow_program_buffer_role (L->p, buf, STOW_ROLE_SWAP, c % 3);
      /* A chunk of the states (master, if any, then m, then v of its
       * parameters), the rank's flat parameters [first, first + cp). */
      stow_lower_holds (L, buf, STOW_BUF_STATES, STOW_NONE, 0, STOW_DTYPE_F32,
                        STOW_LAYER_NONE, 0);
      guint prev = c >= 3 ? freed[c - 3] : STOW_NONE;
      stow_lower_alloc (L, R->rank, STOW_STREAM_NVME_READ, buf, &prev, 1);
      op = stow_lower_copy_op (
          R->rank, STOW_STREAM_NVME_READ, STOW_COPY_STATES_READ, STOW_TIER_NVME,
          STOW_TIER_PINNED, stow_bytes (cp, per), STOW_LAYER_NONE);
      op.shard = c;
      stow_lower_op_io (&op, STOW_NONE, STOW_NONE, buf);
      guint rd = stow_lower_emit (L, &op, NULL, 0, TRUE, "states read");
      stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
      op.count = cp, op.shard = c;
      op.first = (guint64)c * chunk;
      stow_lower_op_io (&op, buf, R->host_grads_buf, buf);
      if (stow_lower_adam_out (L, R) != STOW_NONE)
        op.writes[op.n_writes++] = stow_lower_adam_out (L, R);
      guint w3[3] = { rd, last_grads, norm };
      guint up = stow_lower_emit (L, &op, w3, 3, TRUE, "updated");
      op = stow_lower_copy_op (R->rank, STOW_STREAM_NVME_WRITE,
                               STOW_COPY_STATES_WRITE, STOW_TIER_PINNED,
                               STOW_TIER_NVME, stow_bytes (cp, per),
                               STOW_LAYER_NONE);
      op.shard = c;
      stow_lower_op_io (&op, buf, STOW_NONE, STOW_NONE);
      guint wr = stow_lower_emit (L, &op, &up, 1, TRUE, "states written");
      freed[c] = stow_lower_free (L, R->rank, STOW_STREAM_NVME_WRITE, buf, &wr,
                                  1, TRUE);
      refresh_swap_chunk (L, R, c, nchunks, chunk, cp, up, &done_units,
                          &unit_end);
    }
  /* Resident streamed layers take their updated weights from the host
   * once the pipeline is through. */
  for (guint i = 0; L->off_par && !L->nvme_par && i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      if (u->resident != STOW_NONE)
        emit_param_refresh (L, R, u, &freed[nchunks - 1], 1,
                            stow_lower_host_part (L, u), STOW_STREAM_H2D);
    }
}

/* Clipping with the optimizer on the host: CPU Adam on @u's shard once
 * the norm (@norm) is known, its updated weights up after the unit's
 * last use. */
static void
emit_clipped_host_step (StowLower *L, StowLowerRank *R, StowLowerUnit *u,
                        guint norm)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
  op.count = stow_lower_host_part (L, u), op.layer = u->layer;
  op.unit = u->pu;
  stow_lower_op_io (&op, R->host_grads_buf, STOW_NONE,
                    stow_lower_adam_out (L, R));
  guint w2[2] = { u->grads_ready, norm };
  guint up = stow_lower_emit (L, &op, w2, 2, TRUE, "updated");
  guint w3[2] = { up, u->last_use };
  emit_param_refresh (L, R, u, w3, 2, stow_lower_host_part (L, u),
                      STOW_STREAM_H2D);
}

/* One-step delayed update (ZeRO-Offload's DPU): the previous step's
 * gradients of @u are updated while this step runs; the new weights are
 * copied up after this step's last use. */
static void
emit_delayed_update (StowLower *L, StowLowerRank *R, StowLowerUnit *u)
{
  StowOp op;
  guint64 shard = stow_lower_host_part (L, u);
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
  op.count = shard, op.layer = u->layer, op.unit = u->pu;
  guint up = stow_lower_emit (L, &op, NULL, 0, TRUE, "updated (delayed)");
  guint w2[2] = { up, u->last_use };
  guint both = STOW_NONE;
  StowOp join;
  stow_op_init (&join, STOW_OP_COPY, STOW_STREAM_H2D, R->rank);
  join.copy = STOW_COPY_WEIGHTS_UP;
  join.src = STOW_TIER_PINNED, join.dst = STOW_TIER_DEVICE;
  join.bytes = stow_bytes (shard, L->w), join.layer = u->layer;
  if (!L->off_par)
    stow_lower_op_io (&join, STOW_NONE, STOW_NONE, R->params_buf);
  else if (u->resident != STOW_NONE)
    stow_lower_op_io (&join, STOW_NONE, STOW_NONE, u->resident);
  else
    return;
  both = stow_lower_emit (L, &join, w2, 2, TRUE, "updated up");
  if (L->l->zero >= 1 && L->l->zero < 3 && L->n > 1)
    {
      op = stow_lower_coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                               stow_bytes (shard * L->n, L->w), u->layer);
      op.unit = u->pu, op.count = u->params;
      stow_lower_op_io (&op, R->params_buf, STOW_NONE, R->params_buf);
      stow_lower_emit (L, &op, &both, 1, FALSE, NULL);
    }
}

/* Optimizer on the GPU, per unit as its gradients are reduced (and the
 * norm @norm is known, with clipping); with offloaded parameters the
 * updated shard goes back to the host copy. */
static void
emit_device_step (StowLower *L, StowLowerRank *R, StowLowerUnit *u, guint norm)
{
  StowOp op;
  guint64 odiv = L->l->zero >= 1 ? L->n : 1;
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_COMPUTE, R->rank);
  op.on_gpu = TRUE;
  op.layer = u->layer, op.unit = u->pu;
  op.count = stow_lower_div_ceil (u->params, odiv);
  stow_lower_op_io (&op, R->grads_buf, STOW_NONE,
                    L->off_par ? STOW_NONE : R->params_buf);
  guint w2[2] = { u->grads_ready, norm };
  guint up = stow_lower_emit (L, &op, w2, 2, TRUE, "updated");
  if (L->off_par)
    {
      /* The updated shard goes back to the host copy. */
      op = stow_lower_copy_op (
          R->rank, STOW_STREAM_D2H, STOW_COPY_WEIGHTS_DOWN, STOW_TIER_DEVICE,
          STOW_TIER_PINNED,
          stow_bytes (stow_lower_div_ceil (u->params, L->n), L->w), u->layer);
      guint down = stow_lower_emit (L, &op, &up, 1, TRUE, "updated down");
      emit_param_refresh (L, R, u, &down, 1,
                          stow_lower_div_ceil (u->params, L->n),
                          STOW_STREAM_D2H);
    }
  else
    emit_param_refresh (L, R, u, &up, 1, stow_lower_div_ceil (u->params, odiv),
                        STOW_STREAM_COMPUTE);
}

/* The optimizer step of the units in @ready_order (the order their
 * gradients completed), after the gradient norm when clipping. */
void
stow_lower_optimizer (StowLower *L, StowLowerRank *R, GArray *ready_order)
{
  guint norm = stow_lower_clipping (L) ? emit_grad_norm (L, R, ready_order)
                                       : STOW_NONE;
  if (L->nvme_opt)
    {
      emit_swap_pipeline (L, R, ready_order, norm);
      return;
    }
  for (guint i = 0; i < ready_order->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit,
                                         g_array_index (ready_order, guint, i));
      if (u->params == 0)
        continue;
      if (L->off_opt && !L->so->delayed_update && norm != STOW_NONE)
        emit_clipped_host_step (L, R, u, norm);
      else if (L->off_opt && L->so->delayed_update)
        emit_delayed_update (L, R, u);
      else if (L->off_opt)
        continue; /* emitted as the gradients arrived (item_end) */
      else
        emit_device_step (L, R, u, norm);
    }
}
