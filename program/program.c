/* SPDX-License-Identifier: MIT
 *
 * program/program.c: the step program's building blocks, names and static
 * checks and the model's units (one flat layout of tensors each).  The
 * lowering of a plan into a program is planner/lower.c; running one is
 * program/driver.c on a backend.
 */
#include "program/program.h"

#include <stdarg.h>
#include <string.h>

/* clang-format off */
G_DEFINE_QUARK (stow-program-error-quark, stow_program_error)
/* clang-format on */

const char *
stow_tier_name (StowTier tier)
{
  static const char *const names[]
      = { "device", "pinned_host", "host", "nvme" };
  g_return_val_if_fail (tier < STOW_N_TIERS, "?");
  return names[tier];
}

const char *
stow_buffer_kind_name (StowBufferKind k)
{
  static const char *const names[]
      = { "other",     "weights", "gradients",   "master",     "opt_states",
          "states",    "input",   "activations", "checkpoint", "recomputed",
          "workspace", "logits",  "loss_grad" };
  g_return_val_if_fail (k < STOW_N_BUF_KINDS, "?");
  return names[k];
}

/* ---- names --------------------------------------------------------------- */

const char *
stow_stream_name (StowStream s)
{
  static const char *const names[]
      = { "compute",    "h2d",       "d2h", "nvme_read",
          "nvme_write", "cpu_optim", "comm" };
  g_return_val_if_fail (s < STOW_N_STREAMS, "?");
  return names[s];
}

const char *
stow_op_kind_name (StowOpKind k)
{
  static const char *const names[]
      = { "alloc",      "free",      "copy",     "forward",
          "backward",   "recompute", "loss",     "optim_step",
          "collective", "data",      "grad_norm" };
  g_return_val_if_fail (k < STOW_N_OP_KINDS, "?");
  return names[k];
}

const char *
stow_collective_name (StowCollective c)
{
  static const char *const names[]
      = { "all_reduce", "reduce_scatter", "all_gather", "send" };
  return c <= STOW_COLL_SEND ? names[c] : "?";
}

/* ---- the program ------------------------------------------------------- */

static void
clear_buffer (gpointer p)
{
  g_free (((StowBuffer *)p)->name);
}

static void
clear_event (gpointer p)
{
  g_free (((StowEvent *)p)->name);
}

StowProgram *
stow_program_new (guint n_ranks)
{
  StowProgram *p = g_new0 (StowProgram, 1);
  p->n_ranks = n_ranks;
  p->dp = 1;
  p->ops = g_array_new (FALSE, TRUE, sizeof (StowOp));
  p->buffers = g_array_new (FALSE, TRUE, sizeof (StowBuffer));
  g_array_set_clear_func (p->buffers, clear_buffer);
  p->events = g_array_new (FALSE, TRUE, sizeof (StowEvent));
  g_array_set_clear_func (p->events, clear_event);
  p->waits = g_array_new (FALSE, FALSE, sizeof (guint));
  p->units = g_array_new (FALSE, TRUE, sizeof (StowUnit));
  p->unit_tensors = g_array_new (FALSE, TRUE, sizeof (StowUnitTensor));
  p->weight_dtype = p->grad_dtype = STOW_DTYPE_BF16;
  stow_optim_settings_init (&p->optim);
  return p;
}

void
stow_program_free (StowProgram *p)
{
  if (p == NULL)
    return;
  g_array_unref (p->ops);
  g_array_unref (p->buffers);
  g_array_unref (p->events);
  g_array_unref (p->waits);
  g_array_unref (p->units);
  g_array_unref (p->unit_tensors);
  g_free (p->description);
  g_free (p);
}

guint
stow_program_buffer (StowProgram *p, guint rank, StowTier tier, guint64 bytes,
                     gint slot, gboolean persistent, const char *format, ...)
{
  StowBuffer b = { NULL, tier, bytes, rank, slot, persistent };
  b.kind = STOW_BUF_OTHER;
  b.unit_first = STOW_NONE;
  b.layer = STOW_LAYER_NONE;
  va_list ap;
  va_start (ap, format);
  b.name = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_array_append_val (p->buffers, b);
  return p->buffers->len - 1;
}

void
stow_program_buffer_role (StowProgram *p, guint b, StowBufferRole role,
                          guint index)
{
  g_return_if_fail (p != NULL && b < p->buffers->len);
  StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
  buf->role = role;
  buf->role_index = index;
}

guint
stow_program_event (StowProgram *p, guint rank, const char *format, ...)
{
  StowEvent e = { NULL, rank };
  va_list ap;
  va_start (ap, format);
  e.name = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_array_append_val (p->events, e);
  return p->events->len - 1;
}

void
stow_op_init (StowOp *op, StowOpKind kind, StowStream stream, guint rank)
{
  memset (op, 0, sizeof *op);
  op->kind = kind;
  op->stream = stream;
  op->rank = rank;
  op->layer = STOW_LAYER_NONE;
  op->unit = STOW_NONE;
  op->buffer = STOW_NONE;
  op->record = STOW_NONE;
  op->src = op->dst = STOW_TIER_DEVICE;
}

guint
stow_program_add (StowProgram *p, const StowOp *op, const guint *waits,
                  guint n_waits)
{
  StowOp o = *op;
  o.wait_first = p->waits->len;
  o.n_waits = 0;
  for (guint i = 0; i < n_waits; i++)
    if (waits[i] != STOW_NONE)
      {
        g_array_append_val (p->waits, waits[i]);
        o.n_waits++;
      }
  g_array_append_val (p->ops, o);
  return p->ops->len - 1;
}

static void
describe_layer (GString *s, gint layer)
{
  if (layer == STOW_LAYER_EMBEDDING)
    g_string_append (s, " embedding");
  else if (layer == STOW_LAYER_HEAD)
    g_string_append (s, " head");
  else if (layer >= 0)
    g_string_append_printf (s, " L%d", layer);
}

gboolean
stow_op_in_eval (const StowOp *op)
{
  switch (op->kind)
    {
    case STOW_OP_ALLOC:
    case STOW_OP_FREE:
    case STOW_OP_DATA:
    case STOW_OP_FORWARD:
    case STOW_OP_LOSS:
      return TRUE;
    case STOW_OP_COPY:
      return op->copy == STOW_COPY_WEIGHTS_UP || op->copy == STOW_COPY_STAGED_UP
             || op->copy == STOW_COPY_PARAMS_READ;
    default:
      return FALSE;
    }
}

char *
stow_op_describe (const StowProgram *p, guint index)
{
  const StowOp *op = &g_array_index (p->ops, StowOp, index);
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "#%u %s", index, stow_op_kind_name (op->kind));
  switch (op->kind)
    {
    case STOW_OP_ALLOC:
    case STOW_OP_FREE:
      if (op->buffer < p->buffers->len)
        g_string_append_printf (
            s, " %s", g_array_index (p->buffers, StowBuffer, op->buffer).name);
      break;
    case STOW_OP_COPY:
      g_string_append_printf (s, " %s->%s", stow_tier_name (op->src),
                              stow_tier_name (op->dst));
      describe_layer (s, op->layer);
      break;
    case STOW_OP_COLLECTIVE:
      g_string_append_printf (s, " %s", stow_collective_name (op->coll));
      describe_layer (s, op->layer);
      break;
    case STOW_OP_OPTIM_STEP:
      g_string_append_printf (s, " %s", op->on_gpu ? "gpu" : "cpu");
      describe_layer (s, op->layer);
      if (op->layer == STOW_LAYER_NONE)
        g_string_append_printf (s, " shard %u", op->shard);
      break;
    default:
      describe_layer (s, op->layer);
      g_string_append_printf (s, " mb%u", op->micro_batch);
      break;
    }
  g_string_append_printf (s, " (rank %u %s)", op->rank,
                          stow_stream_name (op->stream));
  return g_string_free (s, FALSE);
}

gboolean
stow_program_validate (const StowProgram *p, GError **error)
{
  guint ne = p->events->len, nb = p->buffers->len;
  g_autofree gint *recorded = g_new0 (gint, ne);
  g_autofree guint *allocs = g_new0 (guint, nb);
  g_autofree guint *frees = g_new0 (guint, nb);
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      g_autofree char *what = NULL;
      gboolean bad = op->stream >= STOW_N_STREAMS || op->rank >= p->n_ranks
                     || op->n_reads > STOW_OP_MAX_IO
                     || op->n_writes > STOW_OP_MAX_IO;
      for (guint j = 0; !bad && j < op->n_reads; j++)
        bad = op->reads[j] >= nb;
      for (guint j = 0; !bad && j < op->n_writes; j++)
        bad = op->writes[j] >= nb;
      if ((op->kind == STOW_OP_ALLOC || op->kind == STOW_OP_FREE)
          && op->buffer >= nb)
        bad = TRUE;
      if (op->unit != STOW_NONE && op->unit >= p->units->len)
        bad = TRUE;
      for (guint j = 0; !bad && j < op->n_waits; j++)
        bad = g_array_index (p->waits, guint, op->wait_first + j) >= ne;
      if (!bad && op->record != STOW_NONE && op->record >= ne)
        bad = TRUE;
      if (bad)
        {
          what = stow_op_describe (p, i);
          g_set_error (error, STOW_PROGRAM_ERROR, STOW_PROGRAM_ERROR_INVALID,
                       "step program: op %s names a stream, rank, buffer, "
                       "unit or event that does not exist",
                       what);
          return FALSE;
        }
      if (op->record != STOW_NONE && recorded[op->record]++ > 0)
        {
          what = stow_op_describe (p, i);
          g_set_error (error, STOW_PROGRAM_ERROR, STOW_PROGRAM_ERROR_INVALID,
                       "step program: op %s records event \"%s\" a second "
                       "time",
                       what,
                       g_array_index (p->events, StowEvent, op->record).name);
          return FALSE;
        }
      if (op->kind == STOW_OP_ALLOC && allocs[op->buffer]++ > 0)
        {
          what = stow_op_describe (p, i);
          g_set_error (error, STOW_PROGRAM_ERROR, STOW_PROGRAM_ERROR_INVALID,
                       "step program: op %s allocates a buffer twice", what);
          return FALSE;
        }
      if (op->kind == STOW_OP_FREE && frees[op->buffer]++ > 0)
        {
          what = stow_op_describe (p, i);
          g_set_error (error, STOW_PROGRAM_ERROR, STOW_PROGRAM_ERROR_INVALID,
                       "step program: op %s frees a buffer twice", what);
          return FALSE;
        }
    }
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      for (guint j = 0; j < op->n_waits; j++)
        {
          guint e = g_array_index (p->waits, guint, op->wait_first + j);
          if (!recorded[e])
            {
              g_autofree char *what = stow_op_describe (p, i);
              g_set_error (error, STOW_PROGRAM_ERROR,
                           STOW_PROGRAM_ERROR_INVALID,
                           "step program: op %s waits on event \"%s\", which "
                           "no op records",
                           what, g_array_index (p->events, StowEvent, e).name);
              return FALSE;
            }
        }
    }
  return TRUE;
}

/* ---- units ----------------------------------------------------------------
 */

static guint
unit_index_of (GArray *units, gint layer)
{
  for (guint i = 0; i < units->len; i++)
    if (g_array_index (units, StowUnit, i).layer == layer)
      return i;
  return STOW_NONE;
}

static void
add_unit (StowProgram *p, const StowModel *m, gint layer)
{
  StowUnit u = { layer, p->unit_tensors->len, 0, 0, 0 };
  if (p->units->len > 0)
    {
      const StowUnit *prev
          = &g_array_index (p->units, StowUnit, p->units->len - 1);
      u.offset = prev->offset + prev->numel;
    }
  for (guint i = 0; i < m->tensors->len; i++)
    {
      const StowTensor *t = g_ptr_array_index (m->tensors, i);
      if (t->tied)
        continue;
      gboolean mine;
      if (layer >= 0)
        mine = t->layer == layer;
      else if (layer == STOW_LAYER_EMBEDDING)
        mine = t->layer < 0 && t->role == STOW_ROLE_EMBEDDING;
      else
        mine = t->layer < 0 && t->role != STOW_ROLE_EMBEDDING;
      if (!mine)
        continue;
      StowUnitTensor ut
          = { t->name, { 0 }, t->n_dims, t->numel, u.numel, t->role };
      memcpy (ut.shape, t->shape, sizeof ut.shape);
      g_array_append_val (p->unit_tensors, ut);
      u.n_tensors++;
      u.numel += t->numel;
    }
  g_array_append_val (p->units, u);
}

void
stow_program_set_units (StowProgram *p, const StowModel *m)
{
  g_return_if_fail (p != NULL && m != NULL);
  g_array_set_size (p->units, 0);
  g_array_set_size (p->unit_tensors, 0);
  add_unit (p, m, STOW_LAYER_EMBEDDING);
  for (guint64 i = 0; i < m->n_layers; i++)
    add_unit (p, m, (gint)i);
  add_unit (p, m, STOW_LAYER_HEAD);
}

guint
stow_program_unit_of_layer (const StowProgram *p, gint layer)
{
  return unit_index_of (p->units, layer);
}

const StowUnit *
stow_program_unit (const StowProgram *p, guint unit)
{
  g_return_val_if_fail (unit < p->units->len, NULL);
  return &g_array_index (p->units, StowUnit, unit);
}

const StowUnitTensor *
stow_program_unit_tensor (const StowProgram *p, guint unit, const char *name)
{
  const StowUnit *u = stow_program_unit (p, unit);
  for (guint i = 0; u && i < u->n_tensors; i++)
    {
      const StowUnitTensor *t = &g_array_index (p->unit_tensors, StowUnitTensor,
                                                u->first_tensor + i);
      if (g_str_equal (t->name, name))
        return t;
    }
  return NULL;
}

void
stow_program_buffer_holds (StowProgram *p, guint b, StowBufferKind kind,
                           guint unit_first, guint n_units, StowDtype dtype,
                           gint layer, guint mb)
{
  g_return_if_fail (b < p->buffers->len);
  StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
  buf->kind = kind;
  buf->unit_first = unit_first;
  buf->n_units = n_units;
  buf->dtype = dtype;
  buf->layer = layer;
  buf->micro_batch = mb;
}

void
stow_program_buffer_partition (StowProgram *p, guint b, guint n)
{
  g_return_if_fail (b < p->buffers->len);
  g_array_index (p->buffers, StowBuffer, b).partitions = n > 1 ? n : 0;
}

/* ---- the fused loss --------------------------------------------------------
 */

guint64
stow_loss_chunk_tokens (guint64 vocab, guint64 n)
{
  guint64 c = STOW_LOSS_CHUNK_BYTES / (4 * MAX (vocab, 1));
  return MIN (MAX (c, 1), MAX (n, 1));
}

guint64
stow_loss_scratch_bytes (guint64 vocab, guint64 hidden, guint64 n)
{
  return 4 * stow_loss_chunk_tokens (vocab, n) * (vocab + 2 * hidden);
}
