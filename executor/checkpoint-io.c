/* SPDX-License-Identifier: MIT
 *
 * executor/checkpoint-io.c: a backend's persistent tensors to and from a
 * checkpoint's files (checkpoint-io.h), wherever the backend keeps them:
 * in its memory, as host copies it pulls and pushes, or on NVMe by range,
 * a piece at a time so that no copy of the states is made.
 */
#include "executor/checkpoint-io.h"

#include <string.h>

#include "core/json.h"
#include "executor/model-io.h"
#include "offload/adam.h"

/* The backend and program a transfer works on. */
typedef struct
{
  StowBackend *be;
  const StowBackendVtable *ops;
  const StowProgram *p;
  /* Several ranks whose optimizer states are partitioned: this one's
   * rank of @world (1: whole states, one file). */
  guint rank, world;
} Io;

static void
io_init (Io *r, StowBackend *be, const StowProgram *p)
{
  *r = (Io){ be, be->vt, p, 0, 1 };
  if (r->ops->ranks)
    r->ops->ranks (be, &r->rank, &r->world);
}

/* The elements [*lo, *hi) of tensor @t of @unit that this rank's states
 * hold (all of it with whole states), in unit coordinates; FALSE when
 * none. */
static gboolean
tensor_range (Io *r, guint unit, const StowUnitTensor *t, guint64 *lo,
              guint64 *hi)
{
  guint64 first = 0, count = t->offset + t->numel;
  if (r->world > 1)
    count = r->ops->partition (r->be, unit, &first);
  *lo = MAX (t->offset, first);
  *hi = MIN (t->offset + t->numel, first + count);
  if (*hi < *lo)
    *hi = *lo;
  return *hi > *lo;
}

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
pending_rw (Io *r, StowOptimStateWriter *ow, StowOptimStateSet *os, guint unit,
            const StowUnitTensor *t, float **piece, GError **error)
{
  gboolean have = FALSE;
  guint8 *g = r->ops->pending (r->be, unit, &have);
  g_return_val_if_fail (g != NULL, FALSE);
  /* The elements [lo, hi) this rank holds, from its partition's start
   * (the unit's on one rank). */
  guint64 lo = 0, hi = 0, first = 0;
  if (!tensor_range (r, unit, t, &lo, &hi))
    return TRUE;
  if (r->world > 1)
    r->ops->partition (r->be, unit, &first);
  StowDtype dt = r->p->grad_dtype;
  g += (lo - first) * stow_dtype_size (dt);
  if (*piece == NULL)
    *piece = g_new (float, STATE_PIECE);
  float *f = *piece;
  for (guint64 i = 0; i < hi - lo; i += STATE_PIECE)
    {
      guint64 n = MIN (STATE_PIECE, hi - lo - i);
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
      if (!stow_optim_state_set_read (os, t->name, "pending",
                                      lo - t->offset + i, n, f, error))
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
 * backend and a checkpoint: written to @ow, or read from @os, the
 * elements this rank holds (tensor_range).  From the backend's memory in
 * one piece; on NVMe a piece (*@piece, allocated on first use) at a time,
 * so no copy of the states is made. */
static gboolean
state_section (Io *r, StowOptimStateWriter *ow, StowOptimStateSet *os,
               guint unit, const StowUnitTensor *t, guint q, float **piece,
               GError **error)
{
  static const char *const sec[3] = { "master", "m", "v" };
  guint64 lo = 0, hi = 0;
  if (!tensor_range (r, unit, t, &lo, &hi))
    return TRUE;
  float *mem = state_ptr (r, unit, q);
  if (mem != NULL)
    return ow ? stow_optim_state_writer_write (ow, mem + lo, hi - lo, error)
              : stow_optim_state_set_read (os, t->name, sec[q], lo - t->offset,
                                           hi - lo, mem + lo, error);
  if (*piece == NULL)
    *piece = g_new (float, STATE_PIECE);
  for (guint64 i = lo; i < hi; i += STATE_PIECE)
    {
      guint64 n = MIN (STATE_PIECE, hi - i);
      gboolean ok
          = ow ? state_rw (r, FALSE, unit, q, i, n, *piece, error)
                     && stow_optim_state_writer_write (ow, *piece, n, error)
               : stow_optim_state_set_read (os, t->name, sec[q], i - t->offset,
                                            n, *piece, error)
                     && state_rw (r, TRUE, unit, q, i, n, *piece, error);
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
load_initial_staged (Io *r, const StowWeightFiles *st, GError **error)
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
      /* The master: the part of the unit this rank's states hold. */
      guint64 first = 0, count = u->numel;
      if (r->world > 1)
        count = r->ops->partition (r->be, ui, &first);
      if (!stow_model_io_load (p, st, STOW_DTYPE_F32, one_unit, &o, error)
          || (count > 0
              && !state_rw (r, TRUE, ui, 0, first, count, stage + first,
                            error)))
        return FALSE;
      guint16 *w = r->ops->weights (r->be, ui);
      if (w == NULL)
        return access_checked (r, FALSE, error);
      for (guint64 i = 0; i < u->numel; i++)
        w[i] = stow_f32_to_bf16 (stage[i]);
    }
  return TRUE;
}

gboolean
stow_checkpoint_load_initial (StowBackend *be, const StowProgram *p,
                              const char *dir, gboolean ignore_extra,
                              char **dropped, GError **error)
{
  Io io, *r = &io;
  io_init (r, be, p);
  g_autoptr (StowWeightFiles) st = stow_weight_files_open (dir, error);
  if (st == NULL
      || !stow_model_io_check_extra (p, st, ignore_extra, dropped, error))
    return FALSE;
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

/* The weights of a unit in a dtype other than the training weights',
 * for a save: the fp32 master as it is, or the weights converted into
 * @scratch (one unit's worth). */
typedef struct
{
  Io *r;
  StowDtype dtype;
  guint8 *scratch;
  GError *error; /* why a unit was not at hand */
} Converted;

static void *
converted_of (gpointer user, guint unit)
{
  Converted *c = user;
  Io *r = c->r;
  const StowProgram *p = r->p;
  const StowUnit *u = &g_array_index (p->units, StowUnit, unit);
  if (p->master_weights && c->dtype == STOW_DTYPE_F32)
    {
      float *m = state_ptr (r, unit, 0);
      if (m != NULL)
        return m;
      return state_rw (r, FALSE, unit, 0, 0, u->numel, (float *)c->scratch,
                       &c->error)
                 ? c->scratch
                 : NULL;
    }
  const void *w = r->ops->weights (r->be, unit);
  if (w == NULL)
    return NULL;
  if (p->weight_dtype == STOW_DTYPE_BF16 && c->dtype == STOW_DTYPE_F32)
    for (guint64 i = 0; i < u->numel; i++)
      ((float *)c->scratch)[i] = stow_bf16_to_f32 (((const guint16 *)w)[i]);
  else if (p->weight_dtype == STOW_DTYPE_F32 && c->dtype == STOW_DTYPE_BF16)
    for (guint64 i = 0; i < u->numel; i++)
      ((guint16 *)c->scratch)[i] = stow_f32_to_bf16 (((const float *)w)[i]);
  else
    g_return_val_if_reached (NULL);
  return c->scratch;
}

/* The weights into @dir in @dtype, converted unit by unit when that is
 * not the training weights' dtype. */
static gboolean
save_weights (Io *r, const char *dir, StowDtype dtype, guint64 max_shard,
              GError **error)
{
  const StowProgram *p = r->p;
  if (dtype == p->weight_dtype)
    return access_checked (
        r, stow_model_io_save (p, dir, dtype, max_shard, weights_of, r, error),
        error);
  guint64 most = 0;
  for (guint ui = 0; ui < p->units->len; ui++)
    most = MAX (most, g_array_index (p->units, StowUnit, ui).numel);
  Converted c = { r, dtype, g_try_malloc (MAX (most, 1) * 4), NULL };
  if (c.scratch == NULL)
    {
      g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                   "out of host memory converting %" G_GUINT64_FORMAT
                   " weights for the checkpoint",
                   most);
      return FALSE;
    }
  gboolean ok = access_checked (
      r, stow_model_io_save (p, dir, dtype, max_shard, converted_of, &c, error),
      error);
  g_free (c.scratch);
  if (c.error != NULL)
    {
      g_clear_error (error);
      g_propagate_error (error, c.error);
      return FALSE;
    }
  return ok;
}

/* The exact fp32 weights of tensor @t of @unit, between the backend and
 * optimizer.stow's "weights" section: kept there when the safetensors
 * hold them in fewer bits. */
static gboolean
exact_weights_rw (Io *r, StowOptimStateWriter *ow, StowOptimStateSet *os,
                  guint unit, const StowUnitTensor *t, GError **error)
{
  guint64 lo = 0, hi = 0;
  if (!tensor_range (r, unit, t, &lo, &hi))
    return TRUE;
  float *w = r->ops->weights (r->be, unit);
  if (w == NULL)
    return access_checked (r, FALSE, error);
  return ow ? stow_optim_state_writer_write (ow, w + lo, hi - lo, error)
            : stow_optim_state_set_read (os, t->name, "weights", lo - t->offset,
                                         hi - lo, w + lo, error);
}

gboolean
stow_checkpoint_save_tensors (StowBackend *be, const StowProgram *p,
                              const char *dir, JsonObject *state,
                              gboolean delayed, const StowWeightsFormat *fmt,
                              GError **error)
{
  Io io, *r = &io;
  io_init (r, be, p);
  if (r->ops->pull && !r->ops->pull (r->be, error))
    return FALSE;
  StowDtype dtype
      = fmt->dtype == STOW_DTYPE_NONE ? p->weight_dtype : fmt->dtype;
  /* Fewer bits than the weights train in (and no master holding them). */
  gboolean exact
      = !p->master_weights
        && stow_dtype_size (dtype) < stow_dtype_size (p->weight_dtype);
  g_autofree char *name = stow_optim_state_file_name (r->rank, r->world);
  g_autofree char *opt = g_build_filename (dir, name, NULL);
  /* The weights once: rank 0's (every rank holds them whole after the
   * pull). */
  if (r->rank == 0
      && !save_weights (r, dir, dtype, fmt->max_shard_bytes, error))
    return FALSE;
  /* The optimizer's state, tensor by tensor (no copy of it in RAM). */
  g_autoptr (GArray) specs
      = g_array_new (FALSE, TRUE, sizeof (StowOptimStateSpec));
  for (guint ui = 0; ui < p->units->len; ui++)
    for (guint k = 0; k < g_array_index (p->units, StowUnit, ui).n_tensors; k++)
      {
        const StowUnitTensor *t = &g_array_index (
            p->unit_tensors, StowUnitTensor,
            g_array_index (p->units, StowUnit, ui).first_tensor + k);
        guint64 lo = 0, hi = 0;
        tensor_range (r, ui, t, &lo, &hi);
        StowOptimStateSpec s = { t->name, hi - lo, 0, { NULL } };
        s.first = MIN (lo - MIN (lo, t->offset), t->numel);
        s.total = t->numel;
        if (p->master_weights)
          s.sections[s.n_sections++] = "master";
        else if (exact)
          s.sections[s.n_sections++] = "weights";
        s.sections[s.n_sections++] = "m";
        s.sections[s.n_sections++] = "v";
        if (delayed)
          s.sections[s.n_sections++] = "pending";
        g_array_append_val (specs, s);
      }
  g_autoptr (StowOptimStateWriter) ow = stow_optim_state_writer_new_rank (
      opt, r->rank, r->world, (StowOptimStateSpec *)specs->data, specs->len,
      state, error);
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
          if (exact && !exact_weights_rw (r, ow, NULL, ui, t, error))
            return FALSE;
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
                              const char *dir, StowOptimStateSet *os,
                              const char *opt, gboolean delayed, guint64 step,
                              GError **error)
{
  Io io, *r = &io;
  io_init (r, be, p);
  g_autoptr (StowWeightFiles) st = stow_weight_files_open (dir, error);
  if (st == NULL || !stow_model_io_check_extra (p, st, FALSE, NULL, error)
      || !access_checked (
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
          if (stow_optim_state_set_tensor_total (os, t->name) != t->numel)
            {
              g_set_error (
                  error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH,
                  "%s: tensor \"%s\": %" G_GUINT64_FORMAT
                  " elements, the model has %" G_GUINT64_FORMAT,
                  opt, t->name, stow_optim_state_set_tensor_total (os, t->name),
                  t->numel);
              return FALSE;
            }
          if (!p->master_weights
              && stow_optim_state_set_has_section (os, t->name, "weights")
              && !exact_weights_rw (r, NULL, os, ui, t, error))
            return FALSE;
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

/* The files of a model directory that are not its weights or config:
 * what generate() and AutoTokenizer read, copied into a checkpoint. */
static const char *const model_files[] = {
  "generation_config.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "tokenizer.model",
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "chat_template.jinja",
};

static const char *
torch_dtype_name (StowDtype dtype)
{
  switch (dtype)
    {
    case STOW_DTYPE_F32:
      return "float32";
    case STOW_DTYPE_BF16:
      return "bfloat16";
    case STOW_DTYPE_F16:
      return "float16";
    default:
      g_return_val_if_reached (NULL);
    }
}

gboolean
stow_checkpoint_save_model_files (const char *dir, const char *model_dir,
                                  const char *config, gsize len,
                                  StowDtype dtype, GError **error)
{
  g_autoptr (JsonNode) root
      = stow_json_parse_data (config, (gssize)len, "config.json", error);
  JsonObject *o
      = root ? stow_json_root_object (root, "config.json", error) : NULL;
  if (o == NULL)
    return FALSE;
  /* transformers reads torch_dtype (and, from 4.56, dtype) to choose the
   * dtype "auto" loads in: it must be the one the safetensors hold. */
  json_object_set_string_member (o, "torch_dtype", torch_dtype_name (dtype));
  if (json_object_has_member (o, "dtype"))
    json_object_set_string_member (o, "dtype", torch_dtype_name (dtype));
  g_autofree char *text = stow_json_to_string (root, TRUE);
  g_autofree char *cfg = g_build_filename (dir, "config.json", NULL);
  if (!stow_file_write_atomic (cfg, text, -1, error))
    return FALSE;
  for (guint i = 0; model_dir != NULL && i < G_N_ELEMENTS (model_files); i++)
    {
      g_autofree char *from
          = g_build_filename (model_dir, model_files[i], NULL);
      if (!g_file_test (from, G_FILE_TEST_IS_REGULAR))
        continue;
      g_autofree char *data = NULL;
      gsize n = 0;
      g_autofree char *to = g_build_filename (dir, model_files[i], NULL);
      if (!g_file_get_contents (from, &data, &n, error)
          || !stow_file_write_atomic (to, data, (gssize)n, error))
        return FALSE;
    }
  return TRUE;
}
