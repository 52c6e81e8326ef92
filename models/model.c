/* SPDX-License-Identifier: MIT
 *
 * models/model.c: the StowModel object, its tensor inventory and the counts
 * derived from it.  Every count (total, active per token, per layer, per
 * role, largest module) is a sum over the inventory with overflow-checked
 * arithmetic; the family-specific shapes live in hf.c.
 */
#include "models/hub.h"
#include "models/model-private.h"

#include <string.h>

#include "core/error.h"
#include "core/json.h"

/* clang-format off */
G_DEFINE_QUARK (stow-model-error-quark, stow_model_error)
/* clang-format on */

static const char *const role_names[STOW_N_ROLES] = {
  [STOW_ROLE_EMBEDDING] = "embedding",
  [STOW_ROLE_ATTENTION] = "attention",
  [STOW_ROLE_MLP] = "mlp",
  [STOW_ROLE_EXPERT] = "expert",
  [STOW_ROLE_ROUTER] = "router",
  [STOW_ROLE_NORM] = "norm",
  [STOW_ROLE_BIAS] = "bias",
  [STOW_ROLE_HEAD] = "head",
};

const char *
stow_tensor_role_name (StowTensorRole role)
{
  g_return_val_if_fail ((guint)role < STOW_N_ROLES, "unknown");
  return role_names[role];
}

static void
tensor_free (gpointer p)
{
  StowTensor *t = p;
  g_free (t->name);
  g_free (t);
}

StowModel *
stow_model_alloc (const char *family, const char *where)
{
  StowModel *m = g_new0 (StowModel, 1);
  m->ref_count = 1;
  m->family = g_strdup (family);
  m->source = g_strdup (where);
  m->aliases = g_new0 (char *, 1);
  m->tensors = g_ptr_array_new_with_free_func (tensor_free);
  m->norm = STOW_NORM_RMSNORM;
  return m;
}

StowModel *
stow_model_ref (StowModel *model)
{
  g_return_val_if_fail (model != NULL, NULL);
  g_atomic_int_inc (&model->ref_count);
  return model;
}

void
stow_model_unref (StowModel *model)
{
  if (model == NULL)
    return;
  if (!g_atomic_int_dec_and_test (&model->ref_count))
    return;
  g_free (model->name);
  g_free (model->family);
  g_strfreev (model->aliases);
  g_free (model->source);
  g_free (model->layers);
  g_ptr_array_unref (model->tensors);
  g_free (model->largest_module);
  g_free (model->reference);
  g_free (model->hidden_act);
  g_free (model->rope_type);
  g_free (model->torch_dtype);
  g_free (model->quant.type);
  g_free (model->hub_id);
  g_free (model->revision);
  g_free (model);
}

void
stow_model_add_tensor (StowModelBuilder *b, StowTensorRole role, gint layer,
                       gboolean tied, guint n_dims, guint64 d0, guint64 d1,
                       const char *fmt, ...)
{
  StowTensor *t = g_new0 (StowTensor, 1);
  va_list ap;

  g_assert (n_dims == 1 || n_dims == 2);
  va_start (ap, fmt);
  t->name = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  t->n_dims = n_dims;
  t->shape[0] = d0;
  t->numel = d0;
  if (n_dims == 2)
    {
      t->shape[1] = d1;
      if (!g_uint64_checked_mul (&t->numel, d0, d1))
        {
          t->numel = G_MAXUINT64;
          if (!b->overflow)
            b->overflow_name = t->name;
          b->overflow = TRUE;
        }
    }
  t->role = role;
  t->layer = layer;
  t->tied = tied;
  g_ptr_array_add (b->model->tensors, t);
}

/* Accumulates with an overflow check; remembers the first overflow. */
static inline void
acc (guint64 *sum, guint64 v, gboolean *overflow)
{
  if (!g_uint64_checked_add (sum, *sum, v))
    *overflow = TRUE;
}

static gboolean
overflow_error (StowModelBuilder *b, const char *what, GError **error)
{
  g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,
               "%s: sizes are absurd: %s overflows 64-bit counts", b->where,
               what);
  return FALSE;
}

/* The linears reading the attention's and the MLP's input, from the first
 * layer's weights: those whose input width (a Linear's second dimension) is
 * the hidden size, less the attention's output projection, which every
 * importer adds last.  GPT-2's Conv1D stores its weights transposed and
 * finds none; so does a first layer without a dense MLP: both fall back to
 * one, which is GPT-2's count (a fused c_attn, one c_fc). */
static void
input_linears (StowModel *m)
{
  guint attn = 0, mlp = 0;
  gboolean last_reads_input = FALSE;
  for (guint i = 0; i < m->tensors->len; i++)
    {
      const StowTensor *t = g_ptr_array_index (m->tensors, i);
      if (t->layer != 0 || t->n_dims != 2)
        continue;
      gboolean reads = t->shape[1] == m->hidden;
      if (t->role == STOW_ROLE_ATTENTION)
        {
          attn += reads;
          last_reads_input = reads;
        }
      else if (t->role == STOW_ROLE_MLP)
        mlp += reads;
    }
  attn -= last_reads_input;
  m->attn_input_linears = MAX (attn, 1);
  m->mlp_input_linears = MAX (mlp, 1);
}

gboolean
stow_model_finish (StowModelBuilder *b, GError **error)
{
  StowModel *m = b->model;
  gboolean of = FALSE;
  guint64 *expert_sum;
  guint64 cur_module = 0, product;
  const char *cur_name = NULL;
  gsize cur_len = 0;
  const StowTensor *best = NULL;
  guint64 best_params = 0;

  if (b->overflow)
    return overflow_error (b, b->overflow_name, error);

  g_assert (m->n_layers > 0 && m->n_layers <= STOW_MODEL_MAX_LAYERS);
  m->layers = g_new0 (StowLayerInfo, m->n_layers);
  expert_sum = g_new0 (guint64, m->n_layers);
  memset (m->by_role, 0, sizeof m->by_role);
  m->params = m->embedding_params = m->head_params = 0;

  for (guint i = 0; i < m->tensors->len; i++)
    {
      const StowTensor *t = g_ptr_array_index (m->tensors, i);
      const char *dot = strrchr (t->name, '.');
      gsize len = dot ? (gsize)(dot - t->name) : strlen (t->name);

      /* Largest leaf module: a module's tensors are adjacent in the
       * inventory (weight, then bias).  Tied tensors count here, as a
       * module's own parameters include a shared weight (DeepSpeed's
       * estimator takes max over modules of parameters(recurse=False)). */
      if (cur_name == NULL || len != cur_len
          || strncmp (cur_name, t->name, len) != 0)
        {
          cur_name = t->name;
          cur_len = len;
          cur_module = 0;
        }
      acc (&cur_module, t->numel, &of);
      if (cur_module > best_params)
        {
          best_params = cur_module;
          best = t;
        }

      if (t->tied)
        continue;
      acc (&m->params, t->numel, &of);
      acc (&m->by_role[t->role], t->numel, &of);
      if (t->role == STOW_ROLE_EMBEDDING && t->layer < 0)
        acc (&m->embedding_params, t->numel, &of);
      if (t->role == STOW_ROLE_HEAD)
        acc (&m->head_params, t->numel, &of);
      if (t->layer >= 0)
        {
          g_assert ((guint64)t->layer < m->n_layers);
          StowLayerInfo *li = &m->layers[t->layer];
          acc (&li->params, t->numel, &of);
          if (t->role == STOW_ROLE_EXPERT)
            {
              acc (&expert_sum[t->layer], t->numel, &of);
              li->is_moe = TRUE;
            }
          else
            acc (&li->active_params, t->numel, &of);
        }
    }
  if (best != NULL)
    {
      const char *dot = strrchr (best->name, '.');
      m->largest_module
          = dot ? g_strndup (best->name, (gsize)(dot - best->name))
                : g_strdup (best->name);
      m->largest_module_params = best_params;
    }

  input_linears (m);

  /* Active parameters per token: a routed expert's weights are used by the
   * tokens routed to it, so each token touches top-k of the n experts
   * (Mixtral and DeepSeek count it this way: router, shared experts,
   * attention, norms, embeddings and head in full). */
  m->active_params = m->params;
  for (guint64 l = 0; l < m->n_layers; l++)
    {
      StowLayerInfo *li = &m->layers[l];
      if (li->is_moe)
        {
          g_assert (m->n_experts > 0);
          /* Every expert in a layer has the same shapes. */
          guint64 per_expert = expert_sum[l] / m->n_experts;
          if (!g_uint64_checked_mul (&product, per_expert,
                                     m->experts_per_token))
            of = TRUE;
          acc (&li->active_params, product, &of);
          m->active_params -= expert_sum[l];
          acc (&m->active_params, product, &of);
        }
      else
        li->active_params = li->params;
      li->is_decoder = (l >= m->n_encoder_layers);
    }
  g_free (expert_sum);

  if (of)
    return overflow_error (b, "the parameter count", error);
  if (!g_uint64_checked_mul (&product, m->params,
                             STOW_MODEL_MAX_BYTES_PER_PARAM))
    {
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,
                   "%s: sizes are absurd: %" G_GUINT64_FORMAT
                   " parameters would overflow 64-bit byte counts",
                   b->where, m->params);
      return FALSE;
    }
  return TRUE;
}

/* Core errors (I/O, JSON, missing member) become model errors with the same
 * message, so callers see one domain. */
static void
to_model_error (GError **error)
{
  if (error == NULL || *error == NULL || (*error)->domain == STOW_MODEL_ERROR)
    return;
  GError *e = *error;
  int code = STOW_MODEL_ERROR_INVALID;
  if (e->domain == STOW_CORE_ERROR && e->code == STOW_CORE_ERROR_IO)
    code = STOW_MODEL_ERROR_NOT_FOUND;
  e->domain = STOW_MODEL_ERROR;
  e->code = code;
}

StowModel *
stow_model_new_from_json (JsonObject *config, const char *where, GError **error)
{
  const char *model_type = NULL;
  g_autoptr (StowModel) m = NULL;
  StowModelBuilder b = { 0 };

  g_return_val_if_fail (config != NULL, NULL);
  g_return_val_if_fail (where != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!stow_json_get_string (config, where, "model_type", TRUE, &model_type,
                             error))
    {
      to_model_error (error);
      return NULL;
    }
  m = stow_model_alloc (model_type, where);
  b.model = m;
  b.where = where;
  if (!stow_model_import (&b, config, model_type, error)
      || !stow_model_finish (&b, error)
      || !stow_model_read_quant (m, config, where, error))
    {
      to_model_error (error);
      return NULL;
    }
  stow_model_estimate_checkpoint (m);
  if (m->name == NULL)
    m->name = g_strdup (model_type);
  return g_steal_pointer (&m);
}

/* ORG/NAME for a snapshot of the Hugging Face cache,
 * models--ORG--NAME/snapshots/COMMIT (huggingface_hub's layout; neither
 * part of an id holds "--"), else NULL. */
static char *
hf_cache_repo (const char *snapshot)
{
  g_autofree char *snapshots = g_path_get_dirname (snapshot);
  g_autofree char *repo_dir = g_path_get_dirname (snapshots);
  g_autofree char *s = g_path_get_basename (snapshots);
  g_autofree char *r = g_path_get_basename (repo_dir);
  const char *sep;
  if (!g_str_equal (s, "snapshots") || !g_str_has_prefix (r, "models--")
      || (sep = strstr (r + 8, "--")) == NULL)
    return NULL;
  g_autofree char *id
      = g_strdup_printf ("%.*s/%s", (int)(sep - (r + 8)), r + 8, sep + 2);
  return stow_hub_is_repo_id (id) ? g_steal_pointer (&id) : NULL;
}

/* A model read from a file is named after its directory when the file is
 * called config.json (HF layout: Llama-2-7b-hf/config.json), or after its
 * repository when that directory is a Hugging Face cache snapshot; else
 * after the file itself. */
static char *
name_from_path (const char *path)
{
  g_autofree char *base = g_path_get_basename (path);
  if (g_ascii_strcasecmp (base, "config.json") == 0)
    {
      g_autofree char *dir = g_path_get_dirname (path);
      g_autofree char *abs = g_canonicalize_filename (dir, NULL);
      char *repo = hf_cache_repo (abs);
      return repo ? repo : g_path_get_basename (abs);
    }
  if (g_str_has_suffix (base, ".json"))
    base[strlen (base) - 5] = '\0';
  return g_steal_pointer (&base);
}

StowModel *
stow_model_new_from_file (const char *path, GError **error)
{
  g_autoptr (JsonNode) root = NULL;
  JsonObject *obj;
  StowModel *m;

  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  root = stow_json_parse_file (path, STOW_MODEL_MAX_CONFIG_BYTES, error);
  if (root == NULL || (obj = stow_json_root_object (root, path, error)) == NULL)
    {
      to_model_error (error);
      return NULL;
    }
  m = stow_model_new_from_json (obj, path, error);
  if (m != NULL)
    {
      g_free (m->name);
      m->name = name_from_path (path);
    }
  return m;
}

StowModel *
stow_model_new_from_data (const char *data, gssize len, const char *name,
                          GError **error)
{
  g_autoptr (JsonNode) root = NULL;
  JsonObject *obj;

  g_return_val_if_fail (data != NULL, NULL);
  g_return_val_if_fail (name != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  /* A file's bounds: stow_json_parse_file reads at most this much. */
  root = stow_json_parse_data_limit (data, len, name,
                                     STOW_MODEL_MAX_CONFIG_BYTES, error);
  if (root == NULL || (obj = stow_json_root_object (root, name, error)) == NULL)
    {
      to_model_error (error);
      return NULL;
    }
  StowModel *m = stow_model_new_from_json (obj, name, error);
  if (m != NULL)
    {
      g_free (m->name);
      m->name = g_strdup (name);
    }
  return m;
}
