/* SPDX-License-Identifier: MIT
 *
 * executor/backends/tensors.c: where a step program's tensors are
 * (executor/backends/tensors.h).
 */
#include "executor/backends/tensors.h"

#include "core/zero.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "program/backend.h"

/* The slots of a layer's weights, in StowLlamaLayerWeights order. */
static const char *const layer_names[] = {
  "input_layernorm.weight",  "self_attn.q_proj.weight",
  "self_attn.k_proj.weight", "self_attn.v_proj.weight",
  "self_attn.o_proj.weight", "self_attn.q_proj.bias",
  "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
  "self_attn.o_proj.bias",   "post_attention_layernorm.weight",
  "mlp.gate_proj.weight",    "mlp.up_proj.weight",
  "mlp.down_proj.weight",    "mlp.gate_proj.bias",
  "mlp.up_proj.bias",        "mlp.down_proj.bias",
  "self_attn.q_norm.weight", "self_attn.k_norm.weight",
};
G_STATIC_ASSERT (G_N_ELEMENTS (layer_names) == STOW_LAYER_SLOTS);
G_STATIC_ASSERT (sizeof (StowLlamaLayerWeights)
                 == STOW_LAYER_SLOTS * sizeof (void *));

const StowBuffer *
stow_tensor_map_buffer (const StowTensorMap *m, guint i)
{
  return &g_array_index (m->p->buffers, StowBuffer, i);
}

static const StowUnit *
unit_of (const StowTensorMap *m, guint u)
{
  return &g_array_index (m->p->units, StowUnit, u);
}

gsize
stow_tensor_map_kind_elem (const StowTensorMap *m, StowBufferKind kind)
{
  switch (kind)
    {
    case STOW_BUF_WEIGHTS:
      return stow_dtype_size (m->p->weight_dtype);
    case STOW_BUF_GRADS:
      return stow_dtype_size (m->p->grad_dtype);
    case STOW_BUF_MASTER:
      return 4;
    case STOW_BUF_OPT_STATES:
      return 8; /* m and v */
    case STOW_BUF_STATES:
      return m->p->master_weights ? 12 : 8; /* master, m and v */
    default:
      return 0;
    }
}

guint8 *
stow_tensor_map_unit (const StowTensorMap *m, guint bi, guint unit)
{
  const StowBuffer *buf = stow_tensor_map_buffer (m, bi);
  g_assert (buf->unit_first != STOW_NONE && unit >= buf->unit_first
            && unit < buf->unit_first + buf->n_units);
  guint64 off
      = buf->partitions > 1
            ? m->part_off[unit] - m->part_off[buf->unit_first]
            : unit_of (m, unit)->offset - unit_of (m, buf->unit_first)->offset;
  return (guint8 *)m->addr[bi] + off * stow_tensor_map_kind_elem (m, buf->kind);
}

StowPinnedPool *
stow_tensor_map_pinned_pool (const StowTensorMap *m, gboolean cuda)
{
  guint64 bytes = 0;
  for (guint i = 0; i < m->p->buffers->len; i++)
    {
      const StowBuffer *buf = stow_tensor_map_buffer (m, i);
      if (buf->persistent && buf->tier == STOW_TIER_PINNED)
        bytes += stow_pinned_span (buf->bytes);
    }
  if (bytes == 0)
    return NULL;
  StowPinnedOptions po = { 0 };
  po.slab_bytes = bytes;
  po.numa_node = -1;
  po.no_cuda = !cuda;
  po.defer_pin = !cuda;
  po.huge_pages = STOW_HUGE_PAGES_OFF;
  return stow_pinned_pool_new (&po);
}

guint8 *
stow_tensor_map_host_weights (const StowTensorMap *m, guint unit)
{
  g_assert (m->host_weights != NULL && unit < m->p->units->len);
  /* Laid out as the rank's flat parameters (on several ranks, its
   * partitions: planner/lower.c, emit_host_states). */
  guint64 first = 0, count = 0;
  return m->host_weights
         + stow_tensor_map_flat_unit (m, unit, &first, &count) * m->esize;
}

guint8 *
stow_tensor_map_host_weight (const StowTensorMap *m, guint unit, guint64 e)
{
  g_assert (m->host_weights != NULL);
  guint64 first = 0, count = 0;
  guint64 at = stow_tensor_map_flat_unit (m, unit, &first, &count);
  g_assert (e >= first);
  return m->host_weights + (at + e - first) * m->esize;
}

guint64
stow_tensor_map_flat_unit (const StowTensorMap *m, guint unit, guint64 *first,
                           guint64 *count)
{
  if (m->dp > 1)
    {
      *count = stow_tensor_map_part (m, unit, first);
      return m->part_off[unit] - m->part_off[0];
    }
  *first = 0, *count = unit_of (m, unit)->numel;
  return unit_of (m, unit)->offset - unit_of (m, 0)->offset;
}

guint64
stow_tensor_map_flat_numel (const StowTensorMap *m)
{
  return m->dp > 1 ? m->part_off[m->p->units->len] - m->part_off[0] : m->numel;
}

guint8 *
stow_tensor_map_slot_tail (const StowTensorMap *m, guint buffer)
{
  const StowBuffer *buf = stow_tensor_map_buffer (m, buffer);
  g_assert (buf->kind == STOW_BUF_GRADS && !buf->persistent && buf->n_units == 1
            && m->dp > 1);
  return (guint8 *)m->addr[buffer]
         + unit_of (m, buf->unit_first)->numel
               * stow_dtype_size (m->p->grad_dtype);
}

void
stow_tensor_map_layer (const StowTensorMap *m, guint8 *base, guint unit,
                       gsize elem, StowLlamaLayerWeights *w)
{
  void **slots = (void **)w;
  memset (w, 0, sizeof *w);
  for (guint s = 0; s < STOW_LAYER_SLOTS; s++)
    {
      guint64 off = m->slot_offset[unit * STOW_LAYER_SLOTS + s];
      if (off != G_MAXUINT64)
        slots[s] = base + off * elem;
    }
}

/* ---- checks and layout ----------------------------------------------------
 */

static gboolean
check_size (const char *backend, const StowBuffer *buf, guint64 need,
            GError **error)
{
  if (buf->bytes >= need)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
               "program buffer \"%s\" has %" G_GUINT64_FORMAT
               " B; the %s backend keeps %" G_GUINT64_FORMAT " B there",
               buf->name, buf->bytes, backend, need);
  return FALSE;
}

/* The elements @buf keeps of each of its units: all, or (ZeRO) the rank's
 * partition. */
static guint64
unit_span (const StowTensorMap *m, const StowBuffer *buf, guint u)
{
  return buf->partitions > 1 ? stow_zero_part (unit_of (m, u)->numel, m->dp)
                             : unit_of (m, u)->numel;
}

static guint64
units_numel (const StowTensorMap *m, const StowBuffer *buf)
{
  guint64 n = 0;
  for (guint u = buf->unit_first; u < buf->unit_first + buf->n_units; u++)
    n += unit_span (m, buf, u);
  return n;
}

guint64
stow_tensor_map_part (const StowTensorMap *m, guint unit, guint64 *first)
{
  return stow_zero_valid (unit_of (m, unit)->numel, m->dp, m->dp_rank, first);
}

guint8 *
stow_tensor_map_elem (const StowTensorMap *m, guint buffer, guint unit,
                      guint64 e)
{
  const StowBuffer *buf = stow_tensor_map_buffer (m, buffer);
  guint64 first = 0;
  if (buf->partitions > 1)
    stow_tensor_map_part (m, unit, &first);
  g_assert (e >= first);
  return stow_tensor_map_unit (m, buffer, unit)
         + (e - first) * stow_tensor_map_kind_elem (m, buf->kind);
}

/* Indexes the program's buffers and checks each holds what the runtime
 * puts there: the memory model's sizes against the runtime's. */
static gboolean
index_buffers (StowTensorMap *m, const char *backend, GError **error)
{
  const StowProgram *p = m->p;
  guint nm = (guint)p->grad_accum;
  guint64 n = m->n_tokens;
  guint64 h = m->model->hidden;
  m->input = stow_input_layout (n, n * h * m->esize);
  guint L = (guint)m->model->n_layers;
  m->act_of = g_new (guint, (gsize)L * nm);
  m->input_of = g_new (guint, nm);
  for (guint i = 0; i < L * nm; i++)
    m->act_of[i] = STOW_NONE;
  for (guint i = 0; i < nm; i++)
    m->input_of[i] = STOW_NONE;
  m->weights_buf = m->grads_buf = m->master_buf = m->states_buf = STOW_NONE;
  m->host_grads_buf = m->host_weights_buf = m->write_buf = STOW_NONE;
  m->delayed_grads_buf = STOW_NONE;
  m->params_nvme = FALSE;
  m->unit_weights = g_new (guint, MAX (p->units->len, 1));
  for (guint u = 0; u < p->units->len; u++)
    m->unit_weights[u] = STOW_NONE;
  guint64 wmax = 0; /* the largest unit a layer slot takes */
  for (guint s = 0; s < G_N_ELEMENTS (m->slot_buf); s++)
    m->slot_buf[s] = STOW_NONE;
  /* A gradient slot holds the largest unit's gradients that pass through
   * it (a tied embedding's have a buffer of their own). */
  guint64 gmax = 0, umax = 0;
  for (guint u = 0; u < p->units->len; u++)
    umax = MAX (umax, unit_of (m, u)->numel);
  /* What a staging or write buffer of the weights on NVMe holds: the
   * largest unit, or on several ranks its partition. */
  guint64 upart = stow_zero_part (umax, m->dp);
  if (m->model->tied_embeddings && p->units->len > 1)
    upart = MAX (upart, stow_tensor_map_tied_head_part (m));
  /* On several ranks with the gradients going to the host, the rank's
   * partition of them follows the unit's (stow_tensor_map_slot_tail). */
  gboolean tail = FALSE;
  for (guint i = 0; i < p->buffers->len && m->dp > 1; i++)
    {
      const StowBuffer *buf = stow_tensor_map_buffer (m, i);
      tail = tail
             || (buf->kind == STOW_BUF_GRADS && buf->persistent
                 && buf->tier != STOW_TIER_DEVICE);
    }
  for (guint i = 0; i < p->buffers->len; i++)
    {
      const StowBuffer *buf = stow_tensor_map_buffer (m, i);
      guint64 un = buf->unit_first != STOW_NONE
                       ? unit_of (m, buf->unit_first)->numel
                       : 0;
      if (buf->kind == STOW_BUF_GRADS && !buf->persistent
          && buf->slot >= STOW_SLOT_GRADS && buf->unit_first != STOW_NONE)
        gmax = MAX (gmax, (un + (tail ? stow_zero_part (un, m->dp) : 0))
                              * stow_dtype_size (p->grad_dtype));
    }
  guint64 saved = m->saved_bytes;
  guint64 out = m->out_bytes;
  for (guint i = 0; i < p->buffers->len; i++)
    {
      const StowBuffer *buf = stow_tensor_map_buffer (m, i);
      if (buf->rank != 0)
        continue;
      gboolean ok = TRUE;
      switch (buf->kind)
        {
        case STOW_BUF_GRADS:
          if (!buf->persistent && buf->slot >= STOW_SLOT_GRADS)
            {
              /* A gradient slot's occupant: one unit's gradients of one
               * micro-batch. */
              break;
            }
          if (!buf->persistent && buf->n_units == 1)
            {
              /* A tied embedding's gradients of one micro-batch, from the
               * loss to the embedding's backward: a buffer of their own. */
              ok = check_size (backend, buf,
                               unit_of (m, buf->unit_first)->numel
                                   * stow_dtype_size (p->grad_dtype),
                               error);
              break;
            }
          /* fall through */
        case STOW_BUF_WEIGHTS:
          if (buf->kind == STOW_BUF_WEIGHTS && buf->tier == STOW_TIER_DEVICE
              && buf->n_units == 1)
            {
              /* One unit's weights: a resident streamed layer, or a
               * layer slot's occupant (its bytes are the slot's). */
              guint64 need = unit_of (m, buf->unit_first)->numel * m->esize;
              gboolean tied_head = m->model->tied_embeddings
                                   && buf->unit_first + 1 == p->units->len;
              if (tied_head && !buf->persistent)
                {
                  /* The output layer's slot holds the head's weights, then
                   * the embedding's (stow_tensor_map_head_in), brought
                   * there together (stow_tensor_map_tied_head_copy,
                   * stow_cpu_run_collective). */
                  need += unit_of (m, 0)->numel * m->esize;
                  tied_head = FALSE;
                }
              if (tied_head)
                {
                  /* A resident copy would go stale when the embedding
                   * is updated (the lowering keeps only layers resident). */
                  g_set_error (error, STOW_BACKEND_ERROR,
                               STOW_BACKEND_ERROR_UNSUPPORTED,
                               "program buffer \"%s\": the %s backend does "
                               "not keep the output layer of a model with "
                               "tied embeddings (tie_word_embeddings) as a "
                               "resident layer",
                               buf->name, backend);
                  return FALSE;
                }
              if (buf->persistent)
                {
                  ok = check_size (backend, buf, need, error);
                  m->unit_weights[buf->unit_first] = i;
                }
              else
                wmax = MAX (wmax, need);
              break;
            }
          if (buf->kind == STOW_BUF_WEIGHTS && buf->persistent
              && buf->tier == STOW_TIER_NVME && buf->unit_first == 0
              && buf->n_units == p->units->len)
            {
              m->params_nvme = TRUE; /* no address: the backend's store */
              break;
            }
          if (buf->kind == STOW_BUF_WEIGHTS && buf->persistent
              && buf->tier != STOW_TIER_DEVICE && buf->tier != STOW_TIER_NVME
              && buf->unit_first == 0 && buf->n_units == p->units->len)
            {
              /* The offloaded parameters, or the host copy CPU Adam
               * writes. */
              ok = check_size (backend, buf, units_numel (m, buf) * m->esize,
                               error);
              m->host_weights_buf = i;
              break;
            }
          /* fall through */
        case STOW_BUF_MASTER:
        case STOW_BUF_OPT_STATES:
        case STOW_BUF_STATES:
          if (!buf->persistent)
            break;
          if (buf->tier != STOW_TIER_DEVICE && buf->kind != STOW_BUF_STATES
              && !(buf->kind == STOW_BUF_GRADS && buf->tier != STOW_TIER_NVME))
            break;
          if (buf->unit_first != 0 || buf->n_units != p->units->len)
            {
              g_set_error (error, STOW_BACKEND_ERROR,
                           STOW_BACKEND_ERROR_UNSUPPORTED,
                           "program buffer \"%s\": the %s backend runs one "
                           "device holding every unit",
                           buf->name, backend);
              return FALSE;
            }
          if (buf->kind == STOW_BUF_MASTER && !p->master_weights)
            break;
          ok = check_size (backend, buf,
                           units_numel (m, buf)
                               * stow_tensor_map_kind_elem (m, buf->kind),
                           error);
          if (buf->kind == STOW_BUF_WEIGHTS)
            m->weights_buf = i;
          else if (buf->kind == STOW_BUF_GRADS && buf->tier == STOW_TIER_DEVICE)
            m->grads_buf = i;
          else if (buf->kind == STOW_BUF_GRADS)
            m->host_grads_buf = i;
          else if (buf->kind == STOW_BUF_MASTER)
            m->master_buf = i;
          else
            {
              m->states_buf = i;
              m->states_master
                  = buf->kind == STOW_BUF_STATES && p->master_weights;
              m->states_nvme = buf->tier == STOW_TIER_NVME;
            }
          break;
        case STOW_BUF_OTHER:
          if (!buf->persistent)
            break;
          if (buf->role == STOW_ROLE_GRAD_SLOT && buf->tier == STOW_TIER_DEVICE
              && buf->role_index < 2)
            {
              ok = check_size (backend, buf, gmax, error);
              m->slot_buf[STOW_SLOT_GRADS + buf->role_index] = i;
            }
          else if (buf->role == STOW_ROLE_LAYER_SLOT
                   && buf->tier == STOW_TIER_DEVICE && buf->role_index < 2)
            m->slot_buf[STOW_SLOT_LAYER + buf->role_index] = i;
          else if (buf->role == STOW_ROLE_PARAM_STAGING
                   && buf->tier != STOW_TIER_DEVICE && buf->role_index < 4)
            {
              ok = check_size (backend, buf, upart * m->esize, error);
              m->slot_buf[STOW_SLOT_STAGING + buf->role_index] = i;
            }
          else if (buf->role == STOW_ROLE_PARAM_WRITE
                   && buf->tier != STOW_TIER_DEVICE)
            {
              ok = check_size (backend, buf, upart * m->esize, error);
              m->write_buf = i;
            }
          else if (buf->role == STOW_ROLE_DELAYED_GRADS
                   && buf->tier != STOW_TIER_DEVICE)
            {
              ok = check_size (backend, buf,
                               stow_tensor_map_flat_numel (m)
                                   * stow_dtype_size (p->grad_dtype),
                               error);
              m->delayed_grads_buf = i;
            }
          break;
        case STOW_BUF_INPUT:
          ok = check_size (backend, buf, m->input.bytes, error);
          if (buf->micro_batch < nm)
            m->input_of[buf->micro_batch] = i;
          break;
        case STOW_BUF_ACTIVATIONS:
        case STOW_BUF_CHECKPOINT:
          ok = check_size (backend, buf,
                           buf->kind == STOW_BUF_ACTIVATIONS ? saved : out,
                           error);
          if (buf->layer >= 0 && (guint)buf->layer < L && buf->micro_batch < nm)
            m->act_of[buf->layer * nm + buf->micro_batch] = i;
          break;
        case STOW_BUF_RECOMPUTED:
          ok = check_size (backend, buf, saved - out, error);
          break;
        case STOW_BUF_WORKSPACE:
          ok = check_size (
              backend, buf,
              stow_llama_config_backward_ws_bytes (&m->config, m->esize, n),
              error);
          break;
        case STOW_BUF_LOGITS:
          ok = check_size (
              backend, buf,
              4 * stow_llama_loss_scratch_floats (m->model->vocab, h, m->chunk),
              error);
          break;
        default:
          break;
        }
      if (!ok)
        return FALSE;
    }
  for (guint s = 0; s < 2; s++)
    if (wmax > 0
        && (m->slot_buf[STOW_SLOT_LAYER + s] == STOW_NONE
            || !check_size (
                backend,
                stow_tensor_map_buffer (m, m->slot_buf[STOW_SLOT_LAYER + s]),
                wmax, error)))
      {
        if (m->slot_buf[STOW_SLOT_LAYER + s] == STOW_NONE)
          g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                       "the program streams layers through slot %u but has "
                       "no \"layer slot %u\"",
                       s, s);
        return FALSE;
      }
  gboolean offloaded = m->host_grads_buf != STOW_NONE;
  gboolean streamed = m->weights_buf == STOW_NONE;
  if ((offloaded && m->host_weights_buf == STOW_NONE
       && !(m->params_nvme && m->write_buf != STOW_NONE))
      || m->states_buf == STOW_NONE || (streamed && !offloaded)
      || (offloaded ? m->grads_buf != STOW_NONE
                          || m->slot_buf[STOW_SLOT_GRADS] == STOW_NONE
                    : m->grads_buf == STOW_NONE)
      || (p->master_weights && !m->states_master && m->master_buf == STOW_NONE))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the %s backend runs layouts that keep the weights on "
                   "the device (or in host memory, streamed, with the "
                   "optimizer there too) and the gradients and optimizer "
                   "states on the device, in host memory or on NVMe (%s)",
                   backend, p->description ? p->description : "this program");
      return FALSE;
    }
  return TRUE;
}

/* Element offsets of each layer's tensors and of the head's. */
static gboolean
index_units (StowTensorMap *m, GError **error)
{
  const StowProgram *p = m->p;
  m->slot_offset = g_new (guint64, (gsize)p->units->len * STOW_LAYER_SLOTS);
  for (gsize i = 0; i < (gsize)p->units->len * STOW_LAYER_SLOTS; i++)
    m->slot_offset[i] = G_MAXUINT64;
  m->emb_unit = stow_program_unit_of_layer (p, STOW_LAYER_EMBEDDING);
  m->head_unit = stow_program_unit_of_layer (p, STOW_LAYER_HEAD);
  for (guint u = 0; u < p->units->len; u++)
    {
      const StowUnit *unit = unit_of (m, u);
      if (unit->layer < 0)
        continue;
      g_autofree char *prefix
          = g_strdup_printf ("model.layers.%d.", unit->layer);
      for (guint k = 0; k < unit->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, unit->first_tensor + k);
          gboolean known = FALSE;
          if (g_str_has_prefix (t->name, prefix))
            for (guint s = 0; s < STOW_LAYER_SLOTS; s++)
              if (g_str_equal (t->name + strlen (prefix), layer_names[s]))
                {
                  m->slot_offset[u * STOW_LAYER_SLOTS + s] = t->offset;
                  known = TRUE;
                }
          if (!known)
            {
              g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                           "%s: tensor %s is not one the runtime runs",
                           m->model->name, t->name);
              return FALSE;
            }
        }
    }
  const StowUnitTensor *norm
      = stow_program_unit_tensor (p, m->head_unit, "model.norm.weight");
  const StowUnitTensor *lm
      = stow_program_unit_tensor (p, m->head_unit, "lm_head.weight");
  if (norm == NULL || (lm == NULL && !m->model->tied_embeddings))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: the output layer needs model.norm.weight and "
                   "lm_head.weight (or tied embeddings)",
                   m->model->name);
      return FALSE;
    }
  m->head_norm = norm->offset;
  m->head_lm = lm ? lm->offset : G_MAXUINT64;
  return TRUE;
}

/* ---- what an op reads and writes ---------------------------------------- */

guint8 *
stow_tensor_map_layer_output (const StowTensorMap *m, gint layer, guint mb)
{
  guint nm = (guint)m->p->grad_accum;
  if (layer < 0)
    return (guint8 *)m->addr[m->input_of[mb]] + m->input.x;
  guint bi = m->act_of[layer * nm + mb];
  guint8 *base = m->addr[bi];
  if (stow_tensor_map_buffer (m, bi)->kind == STOW_BUF_CHECKPOINT)
    return base;
  return base + m->saved_bytes - m->out_bytes;
}

guint
stow_tensor_map_io (const StowTensorMap *m, const StowOp *op, gboolean writes,
                    StowBufferKind kind)
{
  const guint *io = writes ? op->writes : op->reads;
  guint n = writes ? op->n_writes : op->n_reads;
  for (guint i = 0; i < n; i++)
    if (stow_tensor_map_buffer (m, io[i])->kind == kind)
      return io[i];
  return STOW_NONE;
}

void
stow_tensor_map_saved (const StowTensorMap *m, const StowOp *op,
                       gboolean rebuilt, StowLlamaSaved *s)
{
  guint nm = (guint)m->p->grad_accum;
  guint bi = m->act_of[op->layer * nm + op->micro_batch];
  guint8 *base = m->addr[bi];
  if (stow_tensor_map_buffer (m, bi)->kind == STOW_BUF_ACTIVATIONS)
    {
      stow_llama_config_saved_carve (&m->config, m->esize, m->n_tokens, base,
                                     base + m->saved_bytes - m->out_bytes, s);
      return;
    }
  /* Full recompute: the output in the checkpoint, the rest in the
   * rebuilt part (written by the forward's working set, or the
   * recomputation). */
  guint rest = stow_tensor_map_io (m, op, !rebuilt, STOW_BUF_RECOMPUTED);
  if (rest == STOW_NONE)
    rest = stow_tensor_map_io (m, op, rebuilt, STOW_BUF_RECOMPUTED);
  g_assert (rest != STOW_NONE);
  stow_llama_config_saved_carve (&m->config, m->esize, m->n_tokens,
                                 m->addr[rest], base, s);
}

void
stow_tensor_map_head (const StowTensorMap *m, gboolean grads, void **norm,
                      void **lm)
{
  stow_tensor_map_head_in (m, grads ? m->grads_buf : m->weights_buf, norm, lm);
}

guint
stow_tensor_map_weights_of (const StowTensorMap *m, const StowOp *op)
{
  guint w = stow_tensor_map_io (m, op, FALSE, STOW_BUF_WEIGHTS);
  return w != STOW_NONE ? w : m->weights_buf;
}

void
stow_tensor_map_head_in (const StowTensorMap *m, guint bi, void **norm,
                         void **lm)
{
  const StowBuffer *buf = stow_tensor_map_buffer (m, bi);
  gsize e = stow_tensor_map_kind_elem (m, buf->kind);
  guint8 *head = stow_tensor_map_unit (m, bi, m->head_unit);
  *norm = head + m->head_norm * e;
  if (m->head_lm != G_MAXUINT64)
    *lm = head + m->head_lm * e;
  else if (buf->n_units == 1)
    *lm = head + unit_of (m, m->head_unit)->numel * e; /* a slot: behind it */
  else
    *lm = stow_tensor_map_unit (m, bi, m->emb_unit);
}

float *
stow_tensor_map_state (const StowTensorMap *m, guint unit, guint which)
{
  guint64 numel
      = m->states_buf != STOW_NONE
            ? unit_span (m, stow_tensor_map_buffer (m, m->states_buf), unit)
            : unit_of (m, unit)->numel;
  if (m->states_master)
    return (float *)stow_tensor_map_unit (m, m->states_buf, unit)
           + which * numel;
  if (which == 0)
    return m->master_buf != STOW_NONE
               ? (float *)stow_tensor_map_unit (m, m->master_buf, unit)
               : NULL;
  return (float *)stow_tensor_map_unit (m, m->states_buf, unit)
         + (which - 1) * numel;
}

void
stow_tensor_map_adam_config (const StowTensorMap *m, guint unit, guint k,
                             double lr, StowAdamConfig *cfg)
{
  const StowProgram *p = m->p;
  const StowUnitTensor *t = &g_array_index (
      p->unit_tensors, StowUnitTensor, unit_of (m, unit)->first_tensor + k);
  stow_adam_config_init (cfg);
  cfg->lr = lr;
  cfg->beta1 = p->optim.beta1, cfg->beta2 = p->optim.beta2;
  cfg->eps = p->optim.eps;
  cfg->weight_decay = stow_optim_decay_of (&p->optim, t->n_dims);
}

/* Element @e of a unit in the optimizer's states, whose rank partition
 * starts at @pf: partitioned states keep only the partition. */
static guint64
state_part (const StowTensorMap *m, guint64 e, guint64 pf)
{
  const StowBuffer *sb = m->states_buf != STOW_NONE
                             ? stow_tensor_map_buffer (m, m->states_buf)
                             : NULL;
  return sb && sb->partitions > 1 ? e - pf : e;
}

gboolean
stow_tensor_map_adam (const StowTensorMap *m, guint unit, guint k, double lr,
                      StowAdamConfig *cfg, StowAdamTensor *at)
{
  const StowProgram *p = m->p;
  const StowUnit *u = unit_of (m, unit);
  const StowUnitTensor *t
      = &g_array_index (p->unit_tensors, StowUnitTensor, u->first_tensor + k);
  g_assert (!m->states_nvme);
  /* The tensor's elements in this rank's partition of the unit when the
   * states are partitioned (ZeRO 1-3; all of them on one rank, and under
   * ZeRO 0 on every rank), in unit coordinates. */
  const StowBuffer *sb = stow_tensor_map_buffer (m, m->states_buf);
  guint64 pf = 0, pv = sb->partitions > 1 ? stow_tensor_map_part (m, unit, &pf)
                                          : u->numel;
  guint64 lo = MAX (t->offset, pf), hi = MIN (t->offset + t->numel, pf + pv);
  stow_tensor_map_adam_config (m, unit, k, lr, cfg);
  memset (at, 0, sizeof *at);
  if (lo >= hi)
    return FALSE;
  guint gbuf
      = m->host_grads_buf != STOW_NONE ? m->host_grads_buf : m->grads_buf;
  guint64 s0 = state_part (m, lo, pf);
  at->m = stow_tensor_map_state (m, unit, 1) + s0;
  at->v = stow_tensor_map_state (m, unit, 2) + s0;
  at->grad = stow_tensor_map_elem (m, gbuf, unit, lo);
  at->grad_type = p->grad_dtype;
  at->n = hi - lo;
  guint8 *w;
  if (m->host_weights)
    w = stow_tensor_map_host_weight (m, unit, lo);
  else
    w = stow_tensor_map_elem (m, m->weights_buf, unit, lo);
  if (p->master_weights)
    {
      at->param = stow_tensor_map_state (m, unit, 0) + s0;
      at->param_out = w;
      at->out_type = m->ftype;
    }
  else
    {
      at->param = (float *)w;
      at->out_type = STOW_DTYPE_NONE;
    }
  return TRUE;
}

/* CPU Adam over @unit's tensors, with the gradients of @grads (the whole
 * model's, laid out as the host gradients) in place of the map's when not
 * NULL. */
static gboolean
adam_unit (const StowTensorMap *m, StowAdam *adam, guint unit,
           const StowAdamStep *step, double lr, const guint8 *grads,
           GError **error)
{
  const StowUnit *u = unit_of (m, unit);
  guint64 pf = 0, pv = 0;
  guint64 off = stow_tensor_map_flat_unit (m, unit, &pf, &pv);
  gsize gsz = stow_dtype_size (m->p->grad_dtype);
  for (guint k = 0; k < u->n_tensors; k++)
    {
      StowAdamConfig cfg;
      StowAdamTensor at;
      if (!stow_tensor_map_adam (m, unit, k, lr, &cfg, &at))
        continue; /* none of it in this rank's partition */
      if (grads != NULL)
        {
          /* Laid out as the host gradients: the rank's flat parameters. */
          const StowUnitTensor *t = &g_array_index (
              m->p->unit_tensors, StowUnitTensor, u->first_tensor + k);
          at.grad = grads + (off + MAX (t->offset, pf) - pf) * gsz;
        }
      if (!stow_adam_step (adam, &cfg, step, &at, error))
        return FALSE;
    }
  return TRUE;
}

gboolean
stow_tensor_map_adam_unit (const StowTensorMap *m, StowAdam *adam, guint unit,
                           const StowAdamStep *step, double lr, GError **error)
{
  return adam_unit (m, adam, unit, step, lr, NULL, error);
}

gboolean
stow_delayed_init (StowDelayed *d, const StowTensorMap *m, GError **error)
{
  if (!d->on)
    return TRUE;
  if (m->host_grads_buf == STOW_NONE || m->delayed_grads_buf == STOW_NONE
      || m->addr[m->delayed_grads_buf] == NULL)
    {
      g_set_error_literal (error, STOW_BACKEND_ERROR,
                           STOW_BACKEND_ERROR_UNSUPPORTED,
                           m->host_grads_buf == STOW_NONE
                               ? "the delayed update is ZeRO-Offload's: it "
                                 "needs the optimizer in host memory"
                               : "the program has no buffer for the delayed "
                                 "update's gradients (lowered without "
                                 "--delayed-update)");
      return FALSE;
    }
  d->prev_grads = m->addr[m->delayed_grads_buf];
  return TRUE;
}

void
stow_delayed_begin_step (StowDelayed *d, StowTensorMap *m, guint64 step)
{
  if (!d->on || d->prev_grads == NULL || m->host_grads_buf == STOW_NONE)
    return;
  guint8 *t = m->addr[m->host_grads_buf];
  m->addr[m->host_grads_buf] = d->prev_grads;
  d->prev_grads = t;
  d->apply_prev = d->have_grads && step > 1;
  d->have_grads = TRUE;
}

void
stow_delayed_restore (StowDelayed *d, StowTensorMap *m)
{
  /* The delayed-gradients slot never moves: prev_grads is either its
   * buffer or, after an odd number of steps, the host gradients'. */
  if (!d->on || d->prev_grads == NULL
      || d->prev_grads == m->addr[m->delayed_grads_buf])
    return;
  guint8 *t = m->addr[m->host_grads_buf];
  m->addr[m->host_grads_buf] = d->prev_grads;
  d->prev_grads = t;
}

void *
stow_delayed_pending (const StowDelayed *d, const StowTensorMap *m, guint unit,
                      gboolean *pending)
{
  if (!d->on || m->host_grads_buf == STOW_NONE
      || m->addr[m->host_grads_buf] == NULL)
    return NULL;
  if (pending)
    *pending = d->have_grads;
  return stow_tensor_map_unit (m, m->host_grads_buf, unit);
}

gboolean
stow_delayed_apply (const StowDelayed *d, const StowTensorMap *m,
                    StowAdam *adam, guint unit, guint64 step, GError **error)
{
  if (!d->apply_prev)
    return TRUE;
  StowAdamStep st = { step - 1, 1.0, 1.0, FALSE };
  return adam_unit (m, adam, unit, &st,
                    stow_optim_lr_at (&m->p->optim, step - 1), d->prev_grads,
                    error);
}

double
stow_tensor_map_grad_norm (const StowTensorMap *m, StowAdam *adam, guint buffer,
                           double max_norm, double *clip, gboolean *skip)
{
  StowDtype gt = m->p->grad_dtype;
  double total = 0;
  for (guint u = 0; u < m->p->units->len; u++)
    {
      double s = 0;
      stow_adam_grad_sumsq (adam, stow_tensor_map_unit (m, buffer, u), gt,
                            unit_of (m, u)->numel, &s);
      total += s;
    }
  double norm = sqrt (total);
  *skip = !isfinite (norm);
  *clip = stow_adam_clip_coef (norm, max_norm);
  return norm;
}

/* Of @unit's gradient-norm blocks, each rank holds part / block (core/zero.h
 * aligns the partitions to them). */
static guint64
unit_rank_blocks (const StowTensorMap *m, guint u)
{
  guint64 numel = unit_of (m, u)->numel;
  return stow_zero_part (numel, m->dp) / stow_norm_block (numel);
}

guint64
stow_tensor_map_norm_blocks (const StowTensorMap *m)
{
  guint64 n = 0;
  for (guint u = 0; u < m->p->units->len; u++)
    n += unit_rank_blocks (m, u);
  return n;
}

void
stow_tensor_map_norm_partials (const StowTensorMap *m, StowAdam *adam,
                               guint buffer, double *out)
{
  for (guint u = 0; u < m->p->units->len; u++)
    {
      guint64 block = stow_norm_block (unit_of (m, u)->numel);
      guint64 nb = unit_rank_blocks (m, u);
      guint64 pf = 0, pv = stow_tensor_map_part (m, u, &pf);
      for (guint64 j = 0; j < nb; j++)
        out[j] = 0;
      if (pv > 0)
        stow_adam_grad_sumsq_blocks (adam,
                                     stow_tensor_map_elem (m, buffer, u, pf),
                                     m->p->grad_dtype, pv, block, out);
      out += nb;
    }
}

double
stow_tensor_map_norm_combine (const StowTensorMap *m, const double *all,
                              double max_norm, double *clip, gboolean *skip)
{
  guint64 per_rank = stow_tensor_map_norm_blocks (m), off = 0;
  double total = 0;
  for (guint u = 0; u < m->p->units->len; u++)
    {
      guint64 numel = unit_of (m, u)->numel;
      guint64 block = stow_norm_block (numel);
      guint64 nb = unit_rank_blocks (m, u);
      guint64 real = (numel + block - 1) / block;
      /* One rank's sum: block by block from 0 (stow_adam_grad_sumsq). */
      double s = 0;
      for (guint64 b = 0; b < real; b++)
        s += all[(b / nb) * per_rank + off + b % nb];
      total += s;
      off += nb;
    }
  double norm = sqrt (total);
  *skip = !isfinite (norm);
  *clip = stow_adam_clip_coef (norm, max_norm);
  return norm;
}

/* ---- the map ------------------------------------------------------------- */

gboolean
stow_tensor_map_init (StowTensorMap *m, const StowProgram *p,
                      const StowModel *model, const char *backend,
                      GError **error)
{
  memset (m, 0, sizeof *m);
  m->p = p;
  m->model = model;
  if (p->n_ranks != 1)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the %s backend runs one device; the layout has %u "
                   "pipeline stages",
                   backend, p->n_ranks);
      return FALSE;
    }
  if (p->weight_dtype == STOW_DTYPE_F16)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "--precision fp16: the %s backend runs fp32 and bf16",
                   backend);
      return FALSE;
    }
  if (!stow_llama_config_from_model (model, &m->config, error))
    return FALSE;
  m->ftype = p->weight_dtype;
  m->esize = stow_dtype_size (p->weight_dtype);
  m->n_tokens = p->micro_batch * p->seq_len;
  for (guint u = 0; u < p->units->len; u++)
    m->numel += unit_of (m, u)->numel;
  m->chunk = stow_llama_loss_chunk_tokens (m->config.vocab, m->config.hidden,
                                           m->n_tokens);
  m->saved_bytes
      = stow_llama_config_saved_bytes (&m->config, m->esize, m->n_tokens);
  m->out_bytes
      = stow_llama_config_out_bytes (&m->config, m->esize, m->n_tokens);
  m->addr = g_new0 (void *, MAX (p->buffers->len, 1));
  m->dp = MAX (p->dp, 1), m->dp_rank = 0;
  m->part_off = g_new0 (guint64, p->units->len + 1);
  for (guint u = 0; u < p->units->len; u++)
    m->part_off[u + 1]
        = m->part_off[u] + stow_zero_part (unit_of (m, u)->numel, m->dp);
  return index_units (m, error) && index_buffers (m, backend, error);
}

void
stow_tensor_map_clear (StowTensorMap *m)
{
  g_clear_pointer (&m->addr, g_free);
  g_clear_pointer (&m->act_of, g_free);
  g_clear_pointer (&m->input_of, g_free);
  g_clear_pointer (&m->slot_offset, g_free);
  g_clear_pointer (&m->unit_weights, g_free);
  g_clear_pointer (&m->part_off, g_free);
}
