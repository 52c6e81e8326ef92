/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu-ops.c: what each op of a step program does on the
 * cpu backend (executor/backends/cpu-private.h): the decoder's forward,
 * loss and backward on the buffers the op names, the gradient norm and
 * AdamW (on the device's tensors, or CPU Adam on the host's), and the
 * copies between the arena, the pinned buffers and the NVMe stores.
 */
#include "executor/backends/cpu-private.h"
#include "executor/backends/decoder-ops.h"

#include "core/zero.h"

#include <math.h>
#include <string.h>

/* ---- the ops ----------------------------------------------------------------
 */

/* The global L2 norm of every unit's gradients (sums of squares in
 * double, in unit order: the same bits for any thread count), the clip
 * coefficient and whether the step must be skipped. */
static gboolean
run_grad_norm (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  /* The gradients it reads: on the device, or the host copy (an
   * offloaded optimizer, on the cpu_optim stream). */
  guint gbuf = stow_tensor_map_io (m, op, FALSE, STOW_BUF_GRADS);
  if (gbuf == STOW_NONE)
    gbuf = m->grads_buf;
  if (m->dp > 1)
    {
      if (!stow_cpu_ranks_grad_norm (b, gbuf, error))
        return FALSE;
    }
  else
    b->grad_norm = stow_tensor_map_grad_norm (
        m, b->adam, gbuf, b->p->optim.max_grad_norm, &b->clip_coef, &b->skip);
  /* The norm read every gradient: Adam's own pass over them to check that
   * each is finite (a twelfth of its traffic) is then redundant. */
  b->grads_ok
      = !b->skip
        && stow_adam_grads_ok (b->grad_norm * b->grad_norm, 1.0, b->clip_coef);
  return TRUE;
}

/* The delayed update of one unit: step s - 1's update (its learning rate,
 * Adam's t = s - 1) with its gradients, kept aside when step s began;
 * nothing in the run's first step.  No clipping: the norm would wait for
 * the whole backward, which the delay exists to overlap. */
static gboolean
run_delayed (CpuBackend *b, const StowOp *op, GError **error)
{
  return stow_delayed_apply (&b->delayed, &b->map, b->adam, op->unit, b->step,
                             error);
}

/* AdamW on one unit, tensor by tensor: on the device's tensors, or
 * (!on_gpu, ZeRO-Offload) CPU Adam on the host gradients, master and
 * moments, writing the host copy of the weights that the "updated up"
 * copy takes to the device.  The same stow_adam_step either way: the same
 * bits. */
static gboolean
run_optim (CpuBackend *b, const StowOp *op, GError **error)
{
  if (!op->on_gpu && b->map.host_weights == NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "a host optimizer step without host optimizer states "
                   "(the program keeps them on the device)");
      return FALSE;
    }
  if (op->on_gpu && b->map.host_weights != NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "a device optimizer step with the optimizer states in "
                   "host memory");
      return FALSE;
    }
  if (op->unit == STOW_NONE && b->swap == NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs optimizer steps of whole units or "
                   "of NVMe chunks (not a delayed update)");
      return FALSE;
    }
  if (b->skip)
    return TRUE;
  StowAdamStep st = { b->step, 1.0, b->clip_coef, b->grads_ok };
  if (b->delayed.on)
    return run_delayed (b, op, error);
  if (op->unit == STOW_NONE)
    {
      /* A chunk of the NVMe states, in its swap buffer. */
      guint sb = stow_tensor_map_io (&b->map, op, TRUE, STOW_BUF_STATES);
      if (sb == STOW_NONE || b->map.addr[sb] == NULL)
        {
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "an optimizer step over chunk %u writes no swap buffer",
                       op->shard);
          return FALSE;
        }
      return stow_state_swap_update (b->swap, b->adam, &st, b->lr, op->first,
                                     op->count, b->map.addr[sb], error);
    }
  if (!stow_tensor_map_adam_unit (&b->map, b->adam, op->unit, &st, b->lr,
                                  error))
    return FALSE;
  return TRUE;
}

/* A tied output layer staged from NVMe: the head's part of its weights,
 * then the embedding's (stow_tensor_map_tied_head_copy takes them up).
 * The store reads into 4 KiB-aligned memory: the embedding's part comes
 * through a buffer of its own. */
static gboolean
read_tied_head (CpuBackend *b, guint8 *staging, GError **error)
{
  StowTensorMap *m = &b->map;
  gsize ph = stow_zero_part (unit_numel (b, m->head_unit), m->dp) * m->esize;
  gsize pe = stow_zero_part (unit_numel (b, m->emb_unit), m->dp) * m->esize;
  guint8 *emb = g_aligned_alloc (MAX (pe, 1), 1, STOW_NVME_ALIGN);
  gboolean ok = stow_param_swap_read (b->params, m->head_unit, staging, error)
                && stow_param_swap_read (b->params, m->emb_unit, emb, error);
  if (ok)
    memcpy (staging + ph, emb, pe);
  g_aligned_free (emb);
  return ok;
}

/* The weights on NVMe: a unit read into its staging buffer, or a unit's
 * updated weights (CPU Adam left them where its gradients were) through
 * the write buffer to the store. */
static gboolean
param_io (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  guint unit = op->unit;
  if (b->params != NULL && op->copy == STOW_COPY_PARAMS_READ
      && unit == m->head_unit && m->head_lm == G_MAXUINT64
      && op->bytes == stow_tensor_map_tied_head_part (m) * m->esize
      && op->n_writes == 1 && m->addr[op->writes[0]] != NULL)
    return read_tied_head (b, m->addr[op->writes[0]], error);
  if (b->params == NULL || unit == STOW_NONE || unit >= b->p->units->len
      || op->bytes != stow_zero_part (unit_numel (b, unit), m->dp) * m->esize)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "a copy of %" G_GUINT64_FORMAT " B %s NVMe names no "
                   "unit's weights (unit %d)",
                   op->bytes, op->src == STOW_TIER_NVME ? "from" : "to",
                   unit == STOW_NONE ? -1 : (gint)unit);
      return FALSE;
    }
  if (op->copy == STOW_COPY_PARAMS_READ && op->n_writes == 1
      && m->addr[op->writes[0]] != NULL)
    return stow_param_swap_read (b->params, unit, m->addr[op->writes[0]],
                                 error);
  if (op->copy == STOW_COPY_PARAMS_WRITE && op->n_reads == 2
      && op->reads[0] == m->host_grads_buf && m->addr[op->reads[1]] != NULL)
    {
      memcpy (m->addr[op->reads[1]], stow_tensor_map_host_weights (m, unit),
              op->bytes);
      return stow_param_swap_write (b->params, unit, m->addr[op->reads[1]],
                                    error);
    }
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
               "the cpu backend reads a unit's weights from NVMe into a "
               "staging buffer and writes its updated weights through the "
               "write buffer; not this copy (%s to %s)",
               stow_tier_name (op->src), stow_tier_name (op->dst));
  return FALSE;
}

/* An optimizer chunk's states between NVMe and its swap buffer. */
static gboolean
states_io (CpuBackend *b, const StowOp *op, GError **error)
{
  StowTensorMap *m = &b->map;
  gboolean read = op->copy == STOW_COPY_STATES_READ;
  guint buf = read ? (op->n_writes == 1 ? op->writes[0] : STOW_NONE)
                   : (op->n_reads == 1 ? op->reads[0] : STOW_NONE);
  if (b->swap == NULL || buf == STOW_NONE || !is_swap_buffer (buf_of (b, buf)))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "a copy of optimizer chunk %u %s NVMe with no swap "
                   "buffer or no states on NVMe",
                   op->shard, read ? "from" : "to");
      return FALSE;
    }
  return read ? stow_state_swap_read (b->swap, op->shard, m->addr[buf],
                                      op->bytes, error)
              : stow_state_swap_write (b->swap, op->shard, m->addr[buf],
                                       op->bytes, error);
}

/* A copy, by what the program says it moves: the states or weights on
 * NVMe, or exactly the unit range the op names between the device arena
 * and a host buffer (stow_tensor_map_copy_ends). */
static gboolean
run_copy (CpuBackend *b, const StowOp *op, GError **error)
{
  switch (op->copy)
    {
    case STOW_COPY_STATES_READ:
    case STOW_COPY_STATES_WRITE:
      return states_io (b, op, error);
    case STOW_COPY_PARAMS_READ:
    case STOW_COPY_PARAMS_WRITE:
      return param_io (b, op, error);
    default:
      break;
    }
  if (op->copy == STOW_COPY_CHUNK_UP && b->map.dp > 1)
    return stow_tensor_map_chunk_up_ranks (&b->map, op, error);
  if (stow_tensor_map_is_tied_head_copy (&b->map, op))
    return stow_tensor_map_tied_head_copy (&b->map, op, error);
  const guint8 *from = NULL;
  guint8 *to = NULL;
  guint64 bytes = 0;
  if (!stow_tensor_map_copy_ends (&b->map, op, &from, &to, &bytes, error))
    return FALSE;
  memcpy (to, from, bytes);
  return TRUE;
}

gboolean
stow_cpu_run_op (CpuBackend *b, guint i, GError **error)
{
  const StowOp *op = &g_array_index (b->p->ops, StowOp, i);
  switch (op->kind)
    {
    case STOW_OP_DATA:
      {
        guint8 *in = b->map.addr[b->map.input_of[op->micro_batch]];
        guint64 n = b->map.n_tokens;
        /* Rank r of N reads the step's micro-batches r, r + N, ...
         * (docs/executor.md); evaluation reads every batch on each. */
        guint mb = b->eval ? op->micro_batch
                           : op->micro_batch * b->map.dp + b->map.dp_rank;
        stow_batches_fill (b->eval ? b->eval_data : b->data, b->step, mb,
                           (gint32 *)(in + b->map.input.tokens),
                           (gint32 *)(in + b->map.input.targets), n);
        return TRUE;
      }
    case STOW_OP_FORWARD:
    case STOW_OP_RECOMPUTE:
    case STOW_OP_BACKWARD:
      return stow_decoder_run_op (stow_llama_decoder (b->llama), &b->map, op,
                                  b->loss_scale, NULL);
    case STOW_OP_LOSS:
      {
        /* This op's sum, then the step's: the order the step's loss has
         * always been summed in. */
        double sum = 0;
        if (b->eval)
          stow_decoder_run_eval_loss (stow_llama_decoder (b->llama), &b->map,
                                      op, &sum);
        else
          stow_decoder_run_op (stow_llama_decoder (b->llama), &b->map, op,
                               b->loss_scale, &sum);
        b->loss_sum += sum;
        if (b->mb_loss != NULL && !b->eval)
          b->mb_loss[op->micro_batch] += sum;
        return TRUE;
      }
    case STOW_OP_GRAD_NORM:
      return run_grad_norm (b, op, error);
    case STOW_OP_OPTIM_STEP:
      return run_optim (b, op, error);
    case STOW_OP_COPY:
      return run_copy (b, op, error);
    case STOW_OP_COLLECTIVE:
      return stow_cpu_run_collective (b, op, error);
    default:
      return stow_backend_unsupported_op (b->p, i, "cpu",
                                          "multi-device layouts", error);
    }
}
