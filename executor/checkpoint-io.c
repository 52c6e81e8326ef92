/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint-io.c: a backend's persistent tensors to and from a
 * checkpoint's files (checkpoint-io.h), wherever the backend keeps them:
 * in its memory, as host copies it pulls and pushes, or on NVMe by range,
 * a piece at a time so that no copy of the states is made.
 */
#include "executor/checkpoint-io.h"

#include <string.h>

#include "executor/model-io.h"
#include "offload/adam.h"

/* The backend and program a transfer works on. */
typedef struct
{
  StowBackend *be;
  const StowBackendVtable *ops;
  const StowProgram *p;
} Io;

static void *
weights_of (gpointer user, guint unit)
{
  Io *r = user;
  return r->ops->weights (r->be, unit);
}

static void *
master_of (gpointer user, guint unit)
{
  Io *r = user;
  return r->ops->master (r->be, unit);
}

/* @ok, unless the backend's weights accessor failed: then its error (a
 * read from the store naming the file and offset) in place of what the
 * caller made of the missing weights. */
static gboolean
access_checked (Io *r, gboolean ok, GError **error)
{
  GError *e
      = r->ops->take_access_error ? r->ops->take_access_error (r->be) : NULL;
  if (e == NULL)
    return ok;
  g_clear_error (error);
  g_propagate_error (error, e);
  return FALSE;
}

/* Floats streamed between a checkpoint file and states on NVMe per piece:
 * bounds the memory a save or load of them takes. */
#define STATE_PIECE ((guint64)1 << 20)

/* The delayed update's pending gradients of tensor @t of @unit (the next
 * step applies them), between the backend and a checkpoint: written to
 * @ow as fp32 (the training dtype's values, exactly), or read from @os.
 * Zeros when there are none (the run's first step comes next). */
static gboolean
pending_rw (Io *r, StowOptimStateWriter *ow, StowOptimState *os, guint unit,
            const StowUnitTensor *t, float **piece, GError **error)
{
  gboolean have = FALSE;
  guint8 *g = r->ops->pending (r->be, unit, &have);
  g_return_val_if_fail (g != NULL, FALSE);
  StowDtype dt = r->p->grad_dtype;
  g += t->offset * stow_dtype_size (dt);
  if (*piece == NULL)
    *piece = g_new (float, STATE_PIECE);
  float *f = *piece;
  for (guint64 i = 0; i < t->numel; i += STATE_PIECE)
    {
      guint64 n = MIN (STATE_PIECE, t->numel - i);
      if (ow != NULL)
        {
          for (guint64 j = 0; j < n; j++)
            f[j] = !have ? 0.0f
                   : dt == STOW_DTYPE_F32
                       ? ((const float *)g)[i + j]
                       : stow_bf16_to_f32 (((const guint16 *)g)[i + j]);
          if (!stow_optim_state_writer_write (ow, f, n, error))
            return FALSE;
          continue;
        }
      if (!stow_optim_state_read (os, t->name, "pending", i, n, f, error))
        return FALSE;
      for (guint64 j = 0; j < n; j++)
        if (dt == STOW_DTYPE_F32)
          ((float *)g)[i + j] = f[j];
        else
          ((guint16 *)g)[i + j] = stow_f32_to_bf16 (f[j]);
    }
  return TRUE;
}

/* State @which (0 master, 1 m, 2 v) of @unit where the backend keeps it
 * in memory, or NULL (on NVMe: stow's states accessor instead). */
static float *
state_ptr (Io *r, guint unit, guint which)
{
  return which == 0 ? r->ops->master (r->be, unit)
                    : r->ops->moment (r->be, unit, which - 1);
}

/* Floats [@first, @first + @n) of state @which of @unit, read into (or
 * written from) @data, wherever the backend keeps them. */
static gboolean
state_rw (Io *r, gboolean write, guint unit, guint which, guint64 first,
          guint64 n, float *data, GError **error)
{
  float *base = state_ptr (r, unit, which);
  if (base == NULL)
    return r->ops->states (r->be, write, unit, which, first, n, data, error);
  if (write)
    memcpy (base + first, data, n * sizeof (float));
  else
    memcpy (data, base + first, n * sizeof (float));
  return TRUE;
}

/* State @q (0 master, 1 m, 2 v) of tensor @t of @unit between the
 * backend and a checkpoint: written to @ow, or read from @os.  From the
 * backend's memory in one piece; on NVMe a piece (*@piece, allocated on
 * first use) at a time, so no copy of the states is made. */
static gboolean
state_section (Io *r, StowOptimStateWriter *ow, StowOptimState *os, guint unit,
               const StowUnitTensor *t, guint q, float **piece, GError **error)
{
  static const char *const sec[3] = { "master", "m", "v" };
  float *mem = state_ptr (r, unit, q);
  if (mem != NULL)
    return ow ? stow_optim_state_writer_write (ow, mem + t->offset, t->numel,
                                               error)
              : stow_optim_state_read (os, t->name, sec[q], 0, t->numel,
                                       mem + t->offset, error);
  if (*piece == NULL)
    *piece = g_new (float, STATE_PIECE);
  for (guint64 i = 0; i < t->numel; i += STATE_PIECE)
    {
      guint64 n = MIN (STATE_PIECE, t->numel - i);
      gboolean ok
          = ow ? state_rw (r, FALSE, unit, q, t->offset + i, n, *piece, error)
                     && stow_optim_state_writer_write (ow, *piece, n, error)
               : stow_optim_state_read (os, t->name, sec[q], i, n, *piece,
                                        error)
                     && state_rw (r, TRUE, unit, q, t->offset + i, n, *piece,
                                  error);
      if (!ok)
        return FALSE;
    }
  return TRUE;
}

typedef struct
{
  guint unit;
  float *stage;
} OneUnit;

static void *
one_unit (gpointer user, guint unit)
{
  OneUnit *o = user;
  return unit == o->unit ? o->stage : NULL;
}

/* load_initial with the master on NVMe: one unit at a time through a
 * staging buffer of the largest unit's fp32 weights. */
static gboolean
load_initial_staged (Io *r, const char *st, GError **error)
{
  const StowProgram *p = r->p;
  guint64 most = 0;
  for (guint ui = 0; ui < p->units->len; ui++)
    most = MAX (most, g_array_index (p->units, StowUnit, ui).numel);
  g_autofree float *stage = g_try_new (float, MAX (most, 1));
  if (stage == NULL)
    {
      g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                   "out of host memory staging %" G_GUINT64_FORMAT
                   " fp32 weights",
                   most);
      return FALSE;
    }
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      OneUnit o = { ui, stage };
      if (!stow_model_io_load (p, st, STOW_DTYPE_F32, one_unit, &o, error)
          || !state_rw (r, TRUE, ui, 0, 0, u->numel, stage, error))
        return FALSE;
      guint16 *w = r->ops->weights (r->be, ui);
      if (w == NULL)
        return access_checked (r, FALSE, error);
      for (guint64 i = 0; i < u->numel; i++)
        w[i] = stow_f32_to_bf16 (stage[i]);
    }
  return TRUE;
}

/* Fresh weights from the model directory: the fp32 master straight from
 * the file, the training copy rounded from it. */
gboolean
stow_checkpoint_load_initial (StowBackend *be, const StowProgram *p,
                              const char *st, GError **error)
{
  Io io = { be, be->vt, p }, *r = &io;
  if (!p->master_weights)
    return access_checked (
        r, stow_model_io_load (p, st, p->weight_dtype, weights_of, r, error),
        error);
  if (state_ptr (r, 0, 0) == NULL)
    return load_initial_staged (r, st, error);
  if (!stow_model_io_load (p, st, STOW_DTYPE_F32, master_of, r, error))
    return FALSE;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      const float *m = r->ops->master (r->be, ui);
      guint16 *w = r->ops->weights (r->be, ui);
      if (w == NULL)
        return access_checked (r, FALSE, error);
      for (guint64 i = 0; i < u->numel; i++)
        w[i] = stow_f32_to_bf16 (m[i]);
    }
  return TRUE;
}

gboolean
stow_checkpoint_save_tensors (StowBackend *be, const StowProgram *p,
                              const char *dir, JsonObject *state,
                              gboolean delayed, GError **error)
{
  Io io = { be, be->vt, p }, *r = &io;
  if (r->ops->pull && !r->ops->pull (r->be, error))
    return FALSE;
  g_autofree char *st = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *opt = g_build_filename (dir, "optimizer.stow", NULL);
  if (!access_checked (
          r, stow_model_io_save (p, st, p->weight_dtype, weights_of, r, error),
          error))
    return FALSE;
  /* The optimizer's state, tensor by tensor (no copy of it in RAM). */
  g_autoptr (GArray) specs
      = g_array_new (FALSE, TRUE, sizeof (StowOptimStateSpec));
  for (guint i = 0; i < p->unit_tensors->len; i++)
    {
      const StowUnitTensor *t
          = &g_array_index (p->unit_tensors, StowUnitTensor, i);
      StowOptimStateSpec s = { t->name, t->numel, 0, { NULL } };
      if (p->master_weights)
        s.sections[s.n_sections++] = "master";
      s.sections[s.n_sections++] = "m";
      s.sections[s.n_sections++] = "v";
      if (delayed)
        s.sections[s.n_sections++] = "pending";
      g_array_append_val (specs, s);
    }
  g_autoptr (StowOptimStateWriter) ow = stow_optim_state_writer_new (
      opt, (StowOptimStateSpec *)specs->data, specs->len, state, error);
  if (ow == NULL)
    return FALSE;
  g_autofree float *piece = NULL;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, u->first_tensor + k);
          for (guint q = p->master_weights ? 0 : 1; q < 3; q++)
            if (!state_section (r, ow, NULL, ui, t, q, &piece, error))
              return FALSE;
          if (delayed && !pending_rw (r, ow, NULL, ui, t, &piece, error))
            return FALSE;
        }
    }
  return stow_optim_state_writer_finish (ow, error);
}

gboolean
stow_checkpoint_load_tensors (StowBackend *be, const StowProgram *p,
                              const char *st, StowOptimState *os,
                              const char *opt, gboolean delayed, guint64 step,
                              GError **error)
{
  Io io = { be, be->vt, p }, *r = &io;
  if (!access_checked (
          r, stow_model_io_load (p, st, p->weight_dtype, weights_of, r, error),
          error))
    return FALSE;
  g_autofree float *piece = NULL;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, u->first_tensor + k);
          if (stow_optim_state_tensor_n (os, t->name) != t->numel)
            {
              g_set_error (error, STOW_CHECKPOINT_ERROR,
                           STOW_CHECKPOINT_ERROR_MISMATCH,
                           "%s: tensor \"%s\": %" G_GUINT64_FORMAT
                           " elements, the model has %" G_GUINT64_FORMAT,
                           opt, t->name,
                           stow_optim_state_tensor_n (os, t->name), t->numel);
              return FALSE;
            }
          for (guint q = p->master_weights ? 0 : 1; q < 3; q++)
            if (!state_section (r, NULL, os, ui, t, q, &piece, error))
              return FALSE;
          if (delayed && !pending_rw (r, NULL, os, ui, t, &piece, error))
            return FALSE;
        }
    }
  if (delayed)
    r->ops->set_pending (r->be, step > 0);
  return TRUE;
}
