/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu-ranks.c: what the cpu backend does when a program
 * runs on several data-parallel ranks (the program's dp > 1): its
 * collective ops over the communicator (each micro-batch's gradients
 * reduce-scattered into the rank's partitions, the partitions gathered),
 * the global gradient norm and the step's loss summed in the one rank's
 * order, and the whole copies of the partitioned states the checkpoints
 * read and write.  The partitions are core/zero.h's.
 */
#include "executor/backends/cpu-private.h"

#include <string.h>

#include "core/zero.h"

static guint64
align_of (CpuBackend *b, guint unit)
{
  return stow_norm_block (unit_numel (b, unit));
}

static gboolean
wait_one (CpuBackend *b, StowCommRequest *r, GError **error)
{
  return r != NULL && stow_comm_wait (b->comm, r, error);
}

/* A gradient slot's occupant whose unit's partition waits behind it for
 * the host (the optimizer there: stow_tensor_map_slot_tail). */
static gboolean
slot_tail (CpuBackend *b, guint bi)
{
  const StowBuffer *buf = buf_of (b, bi);
  return b->map.host_grads_buf != STOW_NONE && buf->kind == STOW_BUF_GRADS
         && !buf->persistent && buf->slot >= STOW_SLOT_GRADS;
}

/* Where the rank's partition of @unit is in persistent buffer @bi (or a
 * gradient slot's tail, which holds the step's so far): a
 * partitioned buffer holds it whole (padding included); a whole one
 * holds its valid elements at their place, which @tmp (part elements,
 * padding zero) stands in for when @copy_in brings them there. */
static guint8 *
partition_at (CpuBackend *b, guint bi, guint unit, guint8 *tmp,
              gboolean copy_in, gsize esize)
{
  StowTensorMap *m = &b->map;
  const StowBuffer *buf = buf_of (b, bi);
  if (buf->partitions > 1)
    return stow_tensor_map_unit (m, bi, unit);
  if (slot_tail (b, bi))
    return stow_tensor_map_slot_tail (m, bi);
  guint64 pf = 0, pv = stow_tensor_map_part (m, unit, &pf);
  guint64 part = stow_zero_part (unit_numel (b, unit), m->dp);
  return stow_comm_pad_copy (tmp,
                             stow_tensor_map_unit (m, bi, unit) + pf * esize,
                             copy_in ? pv * esize : 0, part * esize);
}

/* The whole buffer's valid elements of the partition back from @tmp. */
static void
partition_back (CpuBackend *b, guint bi, guint unit, const guint8 *tmp,
                gsize esize)
{
  StowTensorMap *m = &b->map;
  if (buf_of (b, bi)->partitions > 1 || slot_tail (b, bi))
    return;
  guint64 pf = 0, pv = stow_tensor_map_part (m, unit, &pf);
  if (pv > 0)
    memcpy (stow_tensor_map_unit (m, bi, unit) + pf * esize, tmp, pv * esize);
}

/* A persistent buffer's unit, or a slot occupant's bytes. */
static guint8 *
whole_at (CpuBackend *b, guint bi, guint unit)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (buf->persistent && buf->n_units > 1)
    return stow_tensor_map_unit (&b->map, bi, unit);
  return b->map.addr[bi];
}

/* A tied embedding's micro-batch: the loss's write of its gradients
 * (reads[1]) and the embedding backward's (reads[0]), every rank's pair
 * added to this rank's partition as one rank adds them: loss_0, emb_0,
 * loss_1, emb_1, ... (after what it holds, from the second micro-batch
 * on). */
static gboolean
reduce_pair (CpuBackend *b, const StowOp *op, guint8 *tmp, StowDtype dt,
             GError **error)
{
  StowTensorMap *m = &b->map;
  guint unit = op->unit;
  guint64 count = op->count, align = align_of (b, unit);
  guint64 part = stow_zero_part (count, m->dp);
  gsize es = stow_dtype_size (dt), pb = part * es;
  guint8 *in_loss = stow_scratch_get (&b->coll_in[0], pb * m->dp);
  guint8 *in_emb = stow_scratch_get (&b->coll_in[1], pb * m->dp);
  if (!wait_one (b,
                 stow_comm_all_to_all_ex (b->comm, m->addr[op->reads[1]],
                                          in_loss, count, align, dt, error),
                 error)
      || !wait_one (b,
                    stow_comm_all_to_all_ex (b->comm, m->addr[op->reads[0]],
                                             in_emb, count, align, dt, error),
                    error))
    return FALSE;
  guint8 *recv = partition_at (b, op->writes[0], unit, tmp, op->accumulate, es);
  guint acc = op->accumulate ? 1 : 0;
  g_autofree const void **c = g_new (const void *, 2 * m->dp + acc);
  if (acc)
    c[0] = recv;
  for (guint q = 0; q < m->dp; q++)
    {
      c[acc + 2 * q] = in_loss + q * pb;
      c[acc + 2 * q + 1] = in_emb + q * pb;
    }
  stow_comm_sum_rank_order (recv, c, 2 * m->dp + acc, part, dt);
  partition_back (b, op->writes[0], unit, recv, es);
  return TRUE;
}

/* Unit @unit's partitions (@dt) gathered whole at @to: this rank's from
 * buffer @rb (partitioned, or whole with the valid elements at their
 * place), or, @rb STOW_NONE, from its place in @to, where it was copied
 * up. */
static gboolean
gather_unit (CpuBackend *b, guint rb, guint unit, guint8 *to, StowDtype dt,
             GError **error)
{
  StowTensorMap *m = &b->map;
  guint64 count = unit_numel (b, unit);
  gsize es = stow_dtype_size (dt), pb = stow_zero_part (count, m->dp) * es;
  guint8 *tmp = stow_scratch_get (&b->coll_part, pb);
  const guint8 *send;
  if (rb != STOW_NONE)
    send = partition_at (b, rb, unit, tmp, TRUE, es);
  else
    {
      guint64 pf = 0, pv = stow_tensor_map_part (m, unit, &pf);
      send = stow_comm_pad_copy (tmp, to + pf * es, pv * es, pb);
    }
  if (send == to)
    send = memcpy (tmp, send, pb); /* a partition gathered onto itself */
  return wait_one (b,
                   stow_comm_all_gather_ex (b->comm, send, to, count,
                                            align_of (b, unit), dt, error),
                   error);
}

/* ZeRO 3 of a model whose output layer is its embedding: the head's
 * slot takes the head's weights, then the embedding's
 * (stow_tensor_map_head_in reads them there). */
static gboolean
gather_tied_head (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  if (b->comm == NULL || op->n_reads != 1 || op->n_writes != 1
      || buf_of (b, op->writes[0])->n_units != 1)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend gathers a tied output layer from the "
                   "weights' partitions into one layer slot; not this op");
      return FALSE;
    }
  guint8 *slot = m->addr[op->writes[0]];
  /* From the ZeRO-3 shards, or in place (the parts copied up from the
   * host or NVMe, stow_tensor_map_tied_head_copy). */
  guint rb = op->reads[0] == op->writes[0] ? STOW_NONE : op->reads[0];
  return gather_unit (b, rb, m->head_unit, slot, m->ftype, error)
         && gather_unit (b, rb, m->emb_unit,
                         slot + unit_numel (b, m->head_unit) * m->esize,
                         m->ftype, error);
}

gboolean
stow_cpu_run_collective (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint unit = op->unit;
  gboolean pair = op->coll == STOW_COLL_REDUCE_SCATTER && op->n_reads == 2;
  /* A tied output layer gathered into its slot: the head, then the
   * embedding it reads (the lowering's gparams). */
  gboolean tied_head
      = op->coll == STOW_COLL_ALL_GATHER && unit != STOW_NONE
        && unit == m->head_unit && m->head_lm == G_MAXUINT64
        && op->count == unit_numel (b, unit) + unit_numel (b, m->emb_unit);
  if (tied_head)
    return gather_tied_head (b, op, error);
  if (b->comm == NULL || unit == STOW_NONE || (op->n_reads != 1 && !pair)
      || op->n_writes != 1 || op->group != STOW_GROUP_DP
      || unit_numel (b, unit) != op->count)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs the data-parallel collectives of a "
                   "unit over several ranks (mpirun); not this one");
      return FALSE;
    }
  guint rb = op->reads[0], wb = op->writes[0];
  const StowBuffer *w = buf_of (b, wb);
  StowDtype dt = w->kind == STOW_BUF_GRADS ? b->p->grad_dtype : m->ftype;
  gsize es = stow_dtype_size (dt);
  guint64 count = op->count, align = align_of (b, unit);
  guint8 *tmp;
  switch (op->coll)
    {
    case STOW_COLL_REDUCE_SCATTER:
      tmp = stow_scratch_get (&b->coll_part,
                              stow_zero_part (count, m->dp) * es);
      if (pair)
        return reduce_pair (b, op, tmp, dt, error);
      {
        /* A micro-batch's gradients (the slot, whole) into this rank's
         * partition of the step's, added to them after the first. */
        guint8 *recv = partition_at (b, wb, unit, tmp, op->accumulate, es);
        if (!wait_one (b,
                       stow_comm_reduce_scatter_ex (b->comm, m->addr[rb], recv,
                                                    count, align,
                                                    op->accumulate, dt, error),
                       error))
          return FALSE;
        partition_back (b, wb, unit, recv, es);
        return TRUE;
      }
    case STOW_COLL_ALL_GATHER:
      {
        /* Every rank's partition of the unit (gradients, updated
         * weights, a ZeRO-3 shard) into the whole unit. */
        return gather_unit (b, rb, unit, whole_at (b, wb, unit), dt, error);
      }
    default:
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs reduce-scatters and all-gathers "
                   "between data-parallel ranks; not a %s",
                   stow_collective_name (op->coll));
      return FALSE;
    }
}

/* Doubles travel as pairs of fp32 words: an all-gather moves bytes. */
static gboolean
gather_doubles (CpuBackend *b, const double *mine, double *all, guint64 n,
                GError **error)
{
  guint64 count = 2 * n * b->map.dp;
  return wait_one (b,
                   stow_comm_all_gather_ex (b->comm, mine, all, count, 1,
                                            STOW_DTYPE_F32, error),
                   error);
}

gboolean
stow_cpu_ranks_grad_norm (CpuBackend *b, guint buffer, GError **error)
{
  StowTensorMap *m = &b->map;
  guint64 n = stow_tensor_map_norm_blocks (m);
  g_autofree double *mine = g_new0 (double, MAX (n, 1));
  g_autofree double *all = g_new0 (double, MAX (n * m->dp, 1));
  stow_tensor_map_norm_partials (m, b->adam, buffer, mine);
  if (!gather_doubles (b, mine, all, n, error))
    return FALSE;
  b->grad_norm = stow_tensor_map_norm_combine (
      m, all, b->p->optim.max_grad_norm, &b->clip_coef, &b->skip);
  return TRUE;
}

gboolean
stow_cpu_ranks_loss (CpuBackend *b, GError **error)
{
  StowTensorMap *m = &b->map;
  guint64 a = b->p->grad_accum;
  g_autofree double *all = g_new0 (double, a * m->dp);
  if (!gather_doubles (b, b->mb_loss, all, a, error))
    return FALSE;
  /* Rank r's micro-batch j is the step's micro-batch j N + r: the one
   * rank adds them in that order. */
  double sum = 0;
  for (guint64 g = 0; g < a * m->dp; g++)
    sum += all[(g % m->dp) * a + g / m->dp];
  b->loss_sum = sum;
  return TRUE;
}

/* ---- the states, whole, for the checkpoints ---------------------------- */

static gboolean
partitioned (CpuBackend *b, guint bi)
{
  return bi != STOW_NONE && buf_of (b, bi)->partitions > 1;
}

/* The buffer holding state @which (0 master, 1 m, 2 v). */
static guint
state_buffer (CpuBackend *b, guint which)
{
  StowTensorMap *m = &b->map;
  return which == 0 && !m->states_master ? m->master_buf : m->states_buf;
}

static guint64
unit_offset (CpuBackend *b, guint unit)
{
  return g_array_index (b->p->units, StowUnit, unit).offset
         - g_array_index (b->p->units, StowUnit, 0).offset;
}

/* The weights are partitioned: a ZeRO-3 shard on the device, or the
 * rank's part of them in host memory (--offload-params cpu). */
static gboolean
weights_partitioned (CpuBackend *b)
{
  StowTensorMap *m = &b->map;
  return partitioned (b, m->weights_buf)
         || (m->weights_buf == STOW_NONE
             && (partitioned (b, m->host_weights_buf) || m->params_nvme));
}

void *
stow_cpu_ranks_weights (CpuBackend *b, guint unit)
{
  StowTensorMap *m = &b->map;
  if (!weights_partitioned (b))
    return NULL;
  if (b->mirror_weights == NULL)
    b->mirror_weights = g_malloc0 (MAX (m->numel * m->esize, 1));
  return b->mirror_weights + unit_offset (b, unit) * m->esize;
}

float *
stow_cpu_ranks_state (CpuBackend *b, guint unit, guint which)
{
  StowTensorMap *m = &b->map;
  /* (States on NVMe are read and written in place, by range.) */
  if (m->states_nvme || !partitioned (b, state_buffer (b, which)))
    return NULL;
  if (b->mirror_states[which] == NULL)
    b->mirror_states[which] = g_new0 (float, MAX (m->numel, 1));
  return b->mirror_states[which] + unit_offset (b, unit);
}

/* State @which's partition of @unit (master or a moment), or the
 * weights' (@which 3). */
static guint8 *
own_partition (CpuBackend *b, guint unit, guint which)
{
  StowTensorMap *m = &b->map;
  if (which == 3 && b->params != NULL)
    {
      /* From the rank's store (its partition, changed in place until the
       * next unit's). */
      g_autoptr (GError) e = NULL;
      guint8 *w = stow_param_swap_unit (b->params, unit, &e);
      if (w == NULL && b->access_error == NULL)
        b->access_error = g_steal_pointer (&e);
      return w;
    }
  if (which == 3)
    return m->weights_buf != STOW_NONE
               ? stow_tensor_map_unit (m, m->weights_buf, unit)
               : stow_tensor_map_host_weights (m, unit);
  return (guint8 *)stow_tensor_map_state (m, unit, which);
}

gboolean
stow_cpu_ranks_pull (CpuBackend *b, GError **error)
{
  StowTensorMap *m = &b->map;
  for (guint which = 0; which < 4; which++)
    for (guint u = 0; u < b->p->units->len; u++)
      {
        guint8 *whole = which == 3
                            ? stow_cpu_ranks_weights (b, u)
                            : (guint8 *)stow_cpu_ranks_state (b, u, which);
        if (whole == NULL || (which == 0 && !b->p->master_weights))
          break;
        StowDtype dt = which == 3 ? m->ftype : STOW_DTYPE_F32;
        gsize es = stow_dtype_size (dt);
        guint64 pf = 0, pv = stow_tensor_map_part (m, u, &pf);
        if (which < 3)
          {
            /* Each rank writes its own states' partition: only it is
             * copied (the mirror's other pages are never touched). */
            memcpy (whole + pf * es, own_partition (b, u, which), pv * es);
            continue;
          }
        /* ZeRO 3's weights, written once by rank 0: gathered whole. */
        guint64 part = stow_zero_part (unit_numel (b, u), m->dp);
        const guint8 *own = own_partition (b, u, which);
        if (own == NULL)
          {
            g_propagate_error (error, g_steal_pointer (&b->access_error));
            return FALSE;
          }
        g_autofree guint8 *send = g_memdup2 (own, part * es);
        if (!wait_one (b,
                       stow_comm_all_gather_ex (b->comm, send, whole,
                                                unit_numel (b, u),
                                                align_of (b, u), dt, error),
                       error))
          return FALSE;
      }
  return TRUE;
}

void
stow_cpu_ranks_describe (CpuBackend *b, guint *rank, guint *world)
{
  StowTensorMap *m = &b->map;
  *rank = m->dp_rank;
  *world = partitioned (b, m->states_buf) ? m->dp : 1;
}

guint64
stow_cpu_ranks_partition (CpuBackend *b, guint unit, guint64 *first)
{
  StowTensorMap *m = &b->map;
  if (!partitioned (b, m->states_buf))
    {
      *first = 0;
      return unit_numel (b, unit);
    }
  return stow_tensor_map_part (m, unit, first);
}

gboolean
stow_cpu_ranks_push (CpuBackend *b, GError **error)
{
  StowTensorMap *m = &b->map;
  for (guint which = 0; which < 4; which++)
    for (guint u = 0; u < b->p->units->len; u++)
      {
        const guint8 *whole
            = which == 3 ? stow_cpu_ranks_weights (b, u)
                         : (const guint8 *)stow_cpu_ranks_state (b, u, which);
        if (whole == NULL || (which == 0 && !b->p->master_weights))
          break;
        gsize es = which == 3 ? m->esize : 4;
        guint64 pf = 0, pv = stow_tensor_map_part (m, u, &pf);
        guint64 part = stow_zero_part (unit_numel (b, u), m->dp);
        guint8 *own = own_partition (b, u, which);
        if (own == NULL)
          {
            g_propagate_error (error, g_steal_pointer (&b->access_error));
            return FALSE;
          }
        stow_comm_pad_copy (own, whole + pf * es, pv * es, part * es);
      }
  return TRUE;
}

void
stow_cpu_ranks_free (CpuBackend *b)
{
  g_clear_pointer (&b->mirror_weights, g_free);
  for (guint i = 0; i < 3; i++)
    g_clear_pointer (&b->mirror_states[i], g_free);
  g_clear_pointer (&b->mb_loss, g_free);
  stow_scratch_clear (&b->coll_part);
  stow_scratch_clear (&b->coll_in[0]);
  stow_scratch_clear (&b->coll_in[1]);
}
