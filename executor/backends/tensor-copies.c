/* SPDX-License-Identifier: MIT
 *
 * executor/backends/tensor-copies.c: the ends of the step program's copies
 * between the device arena, the host buffers and the staging buffers
 * (executor/backends/tensors.h): a unit's gradients or weights, a rank's
 * partition of them, an optimizer chunk, a tied output layer's two parts.
 */
#include "executor/backends/tensors.h"

#include "core/zero.h"

#include <string.h>

#include "program/backend.h"

static const StowUnit *
unit_of (const StowTensorMap *m, guint u)
{
  return &g_array_index (m->p->units, StowUnit, u);
}

/* ---- copies ------------------------------------------------------------- */

/* One unit's gradients of one micro-batch: a gradient slot's occupant or
 * a tied embedding's own buffer. */
static gboolean
is_grad_slot (const StowBuffer *buf)
{
  return buf->kind == STOW_BUF_GRADS && !buf->persistent
         && (buf->slot >= STOW_SLOT_GRADS || buf->n_units == 1);
}

/* A copy of one rank's partition of @unit (core/zero.h's, padding
 * included): the bytes the program says, or an error naming both. */
static gboolean
check_part_bytes (const StowOp *op, guint unit, guint64 bytes, GError **error)
{
  if (op->bytes == bytes)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
               "the copy moves %" G_GUINT64_FORMAT
               " B; the rank's partition of unit %u holds %" G_GUINT64_FORMAT
               " B",
               op->bytes, unit, bytes);
  return FALSE;
}

static gboolean
partition_ends (const StowTensorMap *m, const StowOp *op, guint unit,
                const guint8 *src, guint8 *dst, const guint8 **from,
                guint8 **to, guint64 *bytes, GError **error)
{
  *bytes = stow_zero_part (unit_of (m, unit)->numel, m->dp)
           * stow_dtype_size (m->p->grad_dtype);
  *from = src, *to = dst;
  return check_part_bytes (op, unit, *bytes, error);
}

guint64
stow_tensor_map_tied_head_part (const StowTensorMap *m)
{
  return stow_zero_part (unit_of (m, m->head_unit)->numel, m->dp)
         + stow_zero_part (unit_of (m, m->emb_unit)->numel, m->dp);
}

gboolean
stow_tensor_map_is_tied_head_copy (const StowTensorMap *m, const StowOp *op)
{
  if (m->head_lm != G_MAXUINT64 || op->n_writes != 1
      || (op->copy != STOW_COPY_WEIGHTS_UP && op->copy != STOW_COPY_STAGED_UP))
    return FALSE;
  const StowBuffer *db = stow_tensor_map_buffer (m, op->writes[0]);
  return db->kind == STOW_BUF_WEIGHTS && db->n_units == 1 && !db->persistent
         && db->unit_first == m->head_unit;
}

gboolean
stow_tensor_map_tied_head_copy (const StowTensorMap *m, const StowOp *op,
                                GError **error)
{
  guint h = m->head_unit, e = m->emb_unit;
  guint64 nh = unit_of (m, h)->numel;
  guint64 ph = stow_zero_part (nh, m->dp);
  guint64 want = stow_tensor_map_tied_head_part (m) * m->esize;
  guint src = op->n_reads == 1 ? op->reads[0] : STOW_NONE;
  gboolean staged = op->copy == STOW_COPY_STAGED_UP;
  if (op->bytes != want || (staged && src == STOW_NONE)
      || (!staged && m->host_weights == NULL))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "the tied output layer's copy up moves %" G_GUINT64_FORMAT
                   " B; the head's and the embedding's parts hold "
                   "%" G_GUINT64_FORMAT " B",
                   op->bytes, want);
      return FALSE;
    }
  guint8 *slot = m->addr[op->writes[0]];
  /* The rank's part of each (all of it on one rank), from the host copy
   * or the staging buffer (the head's part, then the embedding's), to
   * its place: the head's at the slot's start, the embedding's behind. */
  const guint units[2] = { h, e };
  const guint8 *staging = staged ? m->addr[src] : NULL;
  for (guint k = 0; k < 2; k++)
    {
      guint64 pf = 0, pv = stow_tensor_map_part (m, units[k], &pf);
      const guint8 *from = staged ? staging + (k ? ph * m->esize : 0)
                                  : stow_tensor_map_host_weights (m, units[k]);
      memcpy (slot + ((k ? nh : 0) + pf) * m->esize, from, pv * m->esize);
    }
  return TRUE;
}

gboolean
stow_tensor_map_copy_ends (const StowTensorMap *m, const StowOp *op,
                           const guint8 **from, guint8 **to, guint64 *bytes,
                           GError **error)
{
  const StowProgram *p = m->p;
  guint dst = op->n_writes == 1 ? op->writes[0] : STOW_NONE;
  guint src = op->n_reads == 1 ? op->reads[0] : STOW_NONE;
  const StowBuffer *db
      = dst != STOW_NONE ? stow_tensor_map_buffer (m, dst) : NULL;
  const StowBuffer *sb
      = src != STOW_NONE ? stow_tensor_map_buffer (m, src) : NULL;
  guint unit = STOW_NONE;
  gsize elem = 0;
  switch (op->copy)
    {
    case STOW_COPY_CHUNK_UP:
      /* A chunk's updated weights up: flat parameters [first, first +
       * count), units contiguous in the weights as in the host copy. */
      if (dst == STOW_NONE || dst != m->weights_buf || m->host_weights == NULL)
        break;
      if (op->first + op->count > m->numel || op->bytes != op->count * m->esize)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "a chunk's copy up of %" G_GUINT64_FORMAT
                       " B from parameter %" G_GUINT64_FORMAT
                       " (%" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT ")",
                       op->bytes, op->first, op->count, m->numel);
          return FALSE;
        }
      *from = m->host_weights + op->first * m->esize;
      *to = stow_tensor_map_unit (m, dst, 0) + op->first * m->esize;
      *bytes = op->count * m->esize;
      return TRUE;
    case STOW_COPY_GRADS_UP:
      /* A unit's earlier micro-batches' gradients back up into its
       * gradient slot, which the next write adds to; on several ranks the
       * rank's partition of them, behind the unit's. */
      if (!sb || src != m->host_grads_buf || !db || !is_grad_slot (db))
        break;
      if (m->dp > 1)
        return partition_ends (m, op, db->unit_first,
                               stow_tensor_map_unit (m, src, db->unit_first),
                               stow_tensor_map_slot_tail (m, dst), from, to,
                               bytes, error);
      unit = db->unit_first;
      elem = stow_dtype_size (p->grad_dtype);
      *from = stow_tensor_map_unit (m, src, unit);
      *to = stow_tensor_map_unit (m, dst, unit);
      break;
    case STOW_COPY_GRADS_DOWN:
      /* A unit's gradients of a micro-batch down. */
      if (!db || dst != m->host_grads_buf || !sb || !is_grad_slot (sb))
        break;
      if (m->dp > 1)
        return partition_ends (m, op, sb->unit_first,
                               stow_tensor_map_slot_tail (m, src),
                               stow_tensor_map_unit (m, dst, sb->unit_first),
                               from, to, bytes, error);
      unit = sb->unit_first;
      elem = stow_dtype_size (p->grad_dtype);
      *from = stow_tensor_map_unit (m, src, unit);
      *to = stow_tensor_map_unit (m, dst, unit);
      break;
    case STOW_COPY_STAGED_UP:
      /* A unit staged from NVMe, up into its slot. */
      if (!db || db->kind != STOW_BUF_WEIGHTS || db->tier != STOW_TIER_DEVICE
          || !sb || !stow_buffer_is_occupant (sb) || op->unit == STOW_NONE
          || sb->tier == STOW_TIER_DEVICE)
        break;
      unit = op->unit;
      elem = m->esize;
      *from = m->addr[src];
      *to = stow_tensor_map_unit (m, dst, unit);
      if (m->dp > 1)
        {
          /* The rank's partition, staged, into its place in the slot
           * (gathered there next). */
          guint64 pf = 0, pv = stow_tensor_map_part (m, unit, &pf);
          if (!check_part_bytes (
                  op, unit,
                  stow_zero_part (unit_of (m, unit)->numel, m->dp) * elem,
                  error))
            return FALSE;
          *to = stow_tensor_map_elem (m, dst, unit, pf), *bytes = pv * elem;
          return TRUE;
        }
      break;
    case STOW_COPY_WEIGHTS_UP:
      /* A unit's updated (or streamed) weights up from the host: the host
       * copy, or, with the weights on NVMe, where CPU Adam wrote them
       * over the host gradients (map->host_weights then points there). */
      if (!db || db->kind != STOW_BUF_WEIGHTS || db->tier != STOW_TIER_DEVICE
          || !(src == STOW_NONE || (m->params_nvme && src == m->host_grads_buf))
          || op->src == STOW_TIER_DEVICE || m->host_weights == NULL)
        break;
      unit = op->unit != STOW_NONE ? op->unit
                                   : stow_program_unit_of_layer (p, op->layer);
      if (unit == STOW_NONE)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "a copy up of weights names no unit (layer %d)",
                       op->layer);
          return FALSE;
        }
      elem = m->esize;
      *from = stow_tensor_map_host_weights (m, unit);
      *to = stow_tensor_map_unit (m, dst, unit);
      if (m->dp > 1)
        {
          /* The rank's updated partition: into the weights at its place,
           * or into a ZeRO-3 shard whole. */
          guint64 pf = 0, pv = stow_tensor_map_part (m, unit, &pf);
          guint64 part = stow_zero_part (unit_of (m, unit)->numel, m->dp);
          if (!check_part_bytes (op, unit, part * elem, error))
            return FALSE;
          if (db->partitions > 1)
            *bytes = part * elem;
          else
            *to = stow_tensor_map_elem (m, dst, unit, pf), *bytes = pv * elem;
          return TRUE;
        }
      break;
    default:
      break;
    }
  if (unit == STOW_NONE)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "copies run are a unit's gradients down, its weights up "
                   "(ZeRO-Offload, streamed layers) and optimizer chunks; "
                   "not this copy (%s to %s)",
                   stow_tier_name (op->src), stow_tier_name (op->dst));
      return FALSE;
    }
  *bytes = unit_of (m, unit)->numel * elem;
  if (op->bytes != *bytes)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "the copy moves %" G_GUINT64_FORMAT
                   " B; unit %u holds %" G_GUINT64_FORMAT " B",
                   op->bytes, unit, *bytes);
      return FALSE;
    }
  return TRUE;
}

gboolean
stow_tensor_map_chunk_up_ranks (const StowTensorMap *m, const StowOp *op,
                                GError **error)
{
  guint dst = op->n_writes == 1 ? op->writes[0] : STOW_NONE;
  if (dst == STOW_NONE || dst != m->weights_buf || m->host_weights == NULL
      || op->first + op->count > stow_tensor_map_flat_numel (m)
      || op->bytes != op->count * m->esize)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "a chunk's copy up of %" G_GUINT64_FORMAT
                   " B from parameter %" G_GUINT64_FORMAT " (%" G_GUINT64_FORMAT
                   " of the rank's %" G_GUINT64_FORMAT ")",
                   op->bytes, op->first, op->count,
                   stow_tensor_map_flat_numel (m));
      return FALSE;
    }
  const StowBuffer *db = stow_tensor_map_buffer (m, dst);
  guint64 lo = op->first, hi = op->first + op->count;
  if (db->partitions > 1)
    {
      /* A ZeRO-3 shard: the same partitions, in the same order. */
      memcpy (stow_tensor_map_unit (m, dst, 0) + lo * m->esize,
              m->host_weights + lo * m->esize, (hi - lo) * m->esize);
      return TRUE;
    }
  /* The whole weights: each unit's part of the chunk at its place. */
  for (guint u = 0; u < m->p->units->len; u++)
    {
      guint64 pf = 0, pv = 0;
      guint64 f0 = stow_tensor_map_flat_unit (m, u, &pf, &pv);
      guint64 a = MAX (lo, f0), z = MIN (hi, f0 + pv);
      if (a < z)
        memcpy (stow_tensor_map_elem (m, dst, u, pf + (a - f0)),
                m->host_weights + a * m->esize, (z - a) * m->esize);
    }
  return TRUE;
}
