/* SPDX-License-Identifier: MIT
 *
 * executor/model-io.c: weights between a checkpoint's safetensors files
 * (one model.safetensors, or shards with model.safetensors.index.json, as
 * transformers saves them) and units (executor/model-io.h).
 */
#include "executor/model-io.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "offload/adam.h" /* the bf16/fp16 conversions */

/* Elements converted per piece: bounds the staging memory. */
#define PIECE ((guint64)1 << 20)

static const StowUnitTensor *
tensor_at (const StowProgram *p, const StowUnit *u, guint k)
{
  return &g_array_index (p->unit_tensors, StowUnitTensor, u->first_tensor + k);
}

static void
convert (const void *src, const char *sdt, void *dst, StowDtype ddt, guint64 n)
{
  for (guint64 i = 0; i < n; i++)
    {
      float x;
      if (g_str_equal (sdt, "F32"))
        x = ((const float *)src)[i];
      else if (g_str_equal (sdt, "BF16"))
        x = stow_bf16_to_f32 (((const guint16 *)src)[i]);
      else
        x = stow_f16_to_f32 (((const guint16 *)src)[i]);
      if (ddt == STOW_DTYPE_F32)
        ((float *)dst)[i] = x;
      else if (ddt == STOW_DTYPE_BF16)
        ((guint16 *)dst)[i] = stow_f32_to_bf16 (x);
      else
        ((guint16 *)dst)[i] = stow_f32_to_f16 (x);
    }
}

static gboolean
same_dtype (const char *sdt, StowDtype d)
{
  return g_str_equal (sdt, stow_dtype_name (d));
}

/* ---- a checkpoint's files ---------------------------------------------------
 */

struct _StowWeightFiles
{
  char *dir;
  char *index_path; /* NULL: one model.safetensors */
  GPtrArray *files; /* StowSafetensors, one per file */
  /* tensor name -> the file holding it (index into files, plus one) */
  GHashTable *where;
};

void
stow_weight_files_free (StowWeightFiles *w)
{
  if (w == NULL)
    return;
  g_free (w->dir);
  g_free (w->index_path);
  if (w->files)
    g_ptr_array_unref (w->files);
  if (w->where)
    g_hash_table_unref (w->where);
  g_free (w);
}

static gboolean G_GNUC_PRINTF (3, 4)
    wf_fail (GError **error, int code, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *msg = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error_literal (error, STOW_SAFETENSORS_ERROR, code, msg);
  return FALSE;
}

/* Every tensor of file @fi into w->where; a name two files both hold is
 * refused. */
static gboolean
add_file_tensors (StowWeightFiles *w, guint fi, GError **error)
{
  StowSafetensors *st = g_ptr_array_index (w->files, fi);
  for (guint i = 0; i < stow_safetensors_n_tensors (st); i++)
    {
      const StowSafetensor *t = stow_safetensors_nth (st, i);
      gpointer had = g_hash_table_lookup (w->where, t->name);
      if (had != NULL && GPOINTER_TO_UINT (had) != fi + 1)
        return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                        "%s: tensor \"%s\" is in both %s and %s", w->dir,
                        t->name,
                        stow_safetensors_path (g_ptr_array_index (
                            w->files, GPOINTER_TO_UINT (had) - 1)),
                        stow_safetensors_path (st));
      g_hash_table_insert (w->where, g_strdup (t->name),
                           GUINT_TO_POINTER (fi + 1));
    }
  return TRUE;
}

/* A shard's name as the index gives it: a plain file name in the
 * checkpoint's directory, never a path out of it. */
static gboolean
shard_name_ok (const char *name)
{
  return name[0] != '\0' && name[0] != '.' && strchr (name, '/') == NULL
         && g_str_has_suffix (name, ".safetensors");
}

/* Reads model.safetensors.index.json: its weight_map's files, each
 * opened once, and each name it maps checked against its file. */
static gboolean
open_index (StowWeightFiles *w, GError **error)
{
  g_autoptr (JsonNode) root
      = stow_json_parse_file (w->index_path, STOW_JSON_MAX_BYTES, error);
  JsonObject *o
      = root ? stow_json_root_object (root, w->index_path, error) : NULL;
  JsonObject *map = NULL;
  if (o == NULL
      || !stow_json_get_object (o, w->index_path, "weight_map", TRUE, &map,
                                error))
    return FALSE;
  g_autoptr (GHashTable) file_of
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  g_autoptr (GList) names = json_object_get_members (map);
  for (GList *l = names; l != NULL; l = l->next)
    {
      const char *name = l->data;
      JsonNode *v = json_object_get_member (map, name);
      const char *file = JSON_NODE_HOLDS_VALUE (
                             v) && json_node_get_value_type (v) == G_TYPE_STRING
                             ? json_node_get_string (v)
                             : NULL;
      if (file == NULL || !shard_name_ok (file))
        return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                        "%s: weight_map: \"%s\": expected the name of a "
                        ".safetensors file in the same directory",
                        w->index_path, name);
      gpointer fi = g_hash_table_lookup (file_of, file);
      if (fi == NULL)
        {
          g_autofree char *path = g_build_filename (w->dir, file, NULL);
          StowSafetensors *st = stow_safetensors_open (path, error);
          if (st == NULL)
            {
              g_prefix_error (error, "%s names %s: ", w->index_path, file);
              return FALSE;
            }
          g_ptr_array_add (w->files, st);
          fi = GUINT_TO_POINTER (w->files->len);
          g_hash_table_insert (file_of, g_strdup (file), fi);
        }
      StowSafetensors *st
          = g_ptr_array_index (w->files, GPOINTER_TO_UINT (fi) - 1);
      if (stow_safetensors_find (st, name) == NULL)
        return wf_fail (error, STOW_SAFETENSORS_ERROR_MISSING,
                        "%s: tensor \"%s\" is mapped to %s, which does not "
                        "hold it",
                        w->index_path, name, stow_safetensors_path (st));
      g_hash_table_insert (w->where, g_strdup (name), fi);
    }
  return TRUE;
}

StowWeightFiles *
stow_weight_files_open (const char *dir, GError **error)
{
  g_return_val_if_fail (dir != NULL, NULL);
  g_autoptr (StowWeightFiles) w = g_new0 (StowWeightFiles, 1);
  w->dir = g_strdup (dir);
  w->files
      = g_ptr_array_new_with_free_func ((GDestroyNotify)stow_safetensors_close);
  w->where = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  g_autofree char *single = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *index
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  /* One file first, as transformers looks for them. */
  if (!g_file_test (single, G_FILE_TEST_EXISTS))
    {
      if (g_file_test (index, G_FILE_TEST_EXISTS))
        {
          w->index_path = g_steal_pointer (&index);
          if (!open_index (w, error))
            return NULL;
          return g_steal_pointer (&w);
        }
      g_autofree char *bin = g_build_filename (dir, "pytorch_model.bin", NULL);
      wf_fail (error, STOW_SAFETENSORS_ERROR_IO,
               "%s: no model.safetensors or model.safetensors.index.json "
               "(the weights as transformers saves them)%s",
               dir,
               g_file_test (bin, G_FILE_TEST_EXISTS)
                   ? "; it has pytorch_model.bin, which stowage does not "
                     "read: save the model again with safe_serialization"
                   : "");
      return NULL;
    }
  StowSafetensors *st = stow_safetensors_open (single, error);
  if (st == NULL)
    return NULL;
  g_ptr_array_add (w->files, st);
  if (!add_file_tensors (w, 0, error))
    return NULL;
  return g_steal_pointer (&w);
}

const char *
stow_weight_files_dir (const StowWeightFiles *w)
{
  g_return_val_if_fail (w != NULL, NULL);
  return w->dir;
}

const StowSafetensor *
stow_weight_files_find (const StowWeightFiles *w, const char *name,
                        StowSafetensors **file)
{
  g_return_val_if_fail (w != NULL && name != NULL, NULL);
  guint fi = GPOINTER_TO_UINT (g_hash_table_lookup (w->where, name));
  if (fi == 0)
    return NULL;
  StowSafetensors *st = g_ptr_array_index (w->files, fi - 1);
  if (file)
    *file = st;
  return stow_safetensors_find (st, name);
}

static int
by_string (const void *a, const void *b)
{
  return strcmp (*(char *const *)a, *(char *const *)b);
}

char **
stow_weight_files_names (const StowWeightFiles *w)
{
  g_return_val_if_fail (w != NULL, NULL);
  guint n = 0;
  char **names = (char **)g_hash_table_get_keys_as_array (w->where, &n);
  qsort (names, n, sizeof (char *), by_string);
  char **out = g_new0 (char *, n + 1);
  for (guint i = 0; i < n; i++)
    out[i] = g_strdup (names[i]);
  g_free (names);
  return out;
}

/* ---- loading
 * ------------------------------------------------------------------ */

/* The index of the first element of @n of @dtype ("F32", "BF16", "F16")
 * at @p that is not finite, or G_MAXUINT64. */
static guint64
first_nonfinite (const void *p, const char *dtype, guint64 n)
{
  if (g_str_equal (dtype, "F32"))
    {
      for (guint64 i = 0; i < n; i++)
        if (!isfinite (((const float *)p)[i]))
          return i;
      return G_MAXUINT64;
    }
  /* bf16: exponent bits 0x7f80 all set; fp16: 0x7c00. */
  guint16 mask = g_str_equal (dtype, "BF16") ? 0x7f80 : 0x7c00;
  for (guint64 i = 0; i < n; i++)
    if ((((const guint16 *)p)[i] & mask) == mask)
      return i;
  return G_MAXUINT64;
}

static gboolean
refuse_nonfinite (const StowSafetensors *st, const StowSafetensor *s, guint64 i,
                  GError **error)
{
  return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                  "%s: tensor \"%s\": element %" G_GUINT64_FORMAT
                  " is not finite (NaN or infinity): weights like these "
                  "cannot train",
                  stow_safetensors_path (st), s->name, i);
}

static gboolean
check_shape (const StowSafetensors *st, const StowSafetensor *s,
             const StowUnitTensor *t, GError **error)
{
  gboolean shape_ok = s->n_dims == t->n_dims;
  for (guint d = 0; shape_ok && d < t->n_dims; d++)
    shape_ok = s->shape[d] == t->shape[d];
  if (shape_ok)
    return TRUE;
  g_autoptr (GString) want = g_string_new ("[");
  g_autoptr (GString) got = g_string_new ("[");
  for (guint d = 0; d < t->n_dims; d++)
    g_string_append_printf (want, "%s%" G_GUINT64_FORMAT, d ? ", " : "",
                            t->shape[d]);
  for (guint d = 0; d < s->n_dims; d++)
    g_string_append_printf (got, "%s%" G_GUINT64_FORMAT, d ? ", " : "",
                            s->shape[d]);
  return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                  "%s: tensor \"%s\": shape %s], the model's config.json "
                  "makes it %s]",
                  stow_safetensors_path (st), t->name, got->str, want->str);
}

/* Tensor @t from @w into @out (@dtype), converted, finite. */
static gboolean
load_tensor (const StowWeightFiles *w, const StowUnitTensor *t, StowDtype dtype,
             guint8 *out, guint8 **stage, GError **error)
{
  StowSafetensors *st = NULL;
  const StowSafetensor *s = stow_weight_files_find (w, t->name, &st);
  if (s == NULL)
    return wf_fail (
        error, STOW_SAFETENSORS_ERROR_MISSING, "%s: tensor \"%s\" is missing",
        w->index_path ? w->index_path
                      : stow_safetensors_path (g_ptr_array_index (w->files, 0)),
        t->name);
  if (!check_shape (st, s, t, error))
    return FALSE;
  if (!g_str_equal (s->dtype, "F32") && !g_str_equal (s->dtype, "BF16")
      && !g_str_equal (s->dtype, "F16"))
    return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                    "%s: tensor \"%s\": dtype %s (expected F32, BF16 or "
                    "F16)",
                    stow_safetensors_path (st), t->name, s->dtype);
  guint esz = stow_dtype_size (dtype);
  guint ssz = stow_safetensors_dtype_size (s->dtype);
  if (same_dtype (s->dtype, dtype))
    {
      if (!stow_safetensors_read (st, s, 0, out, s->nbytes, error))
        return FALSE;
      guint64 bad = first_nonfinite (out, s->dtype, t->numel);
      return bad == G_MAXUINT64 || refuse_nonfinite (st, s, bad, error);
    }
  if (*stage == NULL)
    *stage = g_malloc (PIECE * 4);
  for (guint64 i = 0; i < t->numel; i += PIECE)
    {
      guint64 c = MIN (PIECE, t->numel - i);
      if (!stow_safetensors_read (st, s, i * ssz, *stage, c * ssz, error))
        return FALSE;
      guint64 bad = first_nonfinite (*stage, s->dtype, c);
      if (bad != G_MAXUINT64)
        return refuse_nonfinite (st, s, i + bad, error);
      convert (*stage, s->dtype, out + i * esz, dtype, c);
    }
  return TRUE;
}

gboolean
stow_model_io_load (const StowProgram *p, const StowWeightFiles *w,
                    StowDtype dtype, StowUnitWeightsFn get, gpointer user,
                    GError **error)
{
  g_return_val_if_fail (p != NULL && w != NULL && get != NULL, FALSE);
  guint esz = stow_dtype_size (dtype);
  g_autofree guint8 *stage = NULL;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      guint8 *dst = get (user, ui);
      if (dst == NULL)
        continue;
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = tensor_at (p, u, k);
          if (!load_tensor (w, t, dtype, dst + t->offset * esz, &stage, error))
            return FALSE;
        }
    }
  return TRUE;
}

/* Whether tensors @a and @b (same shape and dtype) hold the same bytes,
 * read a piece at a time. */
static gboolean
same_bytes (StowSafetensors *fa, const StowSafetensor *a, StowSafetensors *fb,
            const StowSafetensor *b, gboolean *same, GError **error)
{
  *same = g_str_equal (a->dtype, b->dtype) && a->nbytes == b->nbytes;
  g_autofree guint8 *x = *same ? g_malloc (PIECE) : NULL;
  g_autofree guint8 *y = *same ? g_malloc (PIECE) : NULL;
  for (guint64 o = 0; *same && o < a->nbytes; o += PIECE)
    {
      guint64 c = MIN (PIECE, a->nbytes - o);
      if (!stow_safetensors_read (fa, a, o, x, c, error)
          || !stow_safetensors_read (fb, b, o, y, c, error))
        return FALSE;
      *same = memcmp (x, y, c) == 0;
    }
  return TRUE;
}

gboolean
stow_model_io_check_extra (const StowProgram *p, const StowWeightFiles *w,
                           gboolean ignore, char **dropped, GError **error)
{
  g_return_val_if_fail (p != NULL && w != NULL, FALSE);
  if (dropped)
    *dropped = NULL;
  g_autoptr (GHashTable) ours = g_hash_table_new (g_str_hash, g_str_equal);
  for (guint i = 0; i < p->unit_tensors->len; i++)
    g_hash_table_add (
        ours,
        (gpointer)g_array_index (p->unit_tensors, StowUnitTensor, i).name);
  /* A model without a head of its own ties it to the embedding. */
  gboolean tied = !g_hash_table_contains (ours, "lm_head.weight");
  g_auto (GStrv) names = stow_weight_files_names (w);
  g_autoptr (GString) extra = g_string_new (NULL);
  guint n_extra = 0;
  for (guint i = 0; names[i] != NULL; i++)
    {
      if (g_hash_table_contains (ours, names[i]))
        continue;
      /* A tied model may store its head, as the embedding's copy. */
      if (tied && g_str_equal (names[i], "lm_head.weight"))
        {
          StowSafetensors *fh = NULL, *fe = NULL;
          const StowSafetensor *h = stow_weight_files_find (w, names[i], &fh);
          const StowSafetensor *e
              = stow_weight_files_find (w, "model.embed_tokens.weight", &fe);
          gboolean same = FALSE;
          if (e != NULL && !same_bytes (fh, h, fe, e, &same, error))
            return FALSE;
          if (same)
            continue;
          return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                          "%s: tensor \"lm_head.weight\" differs from "
                          "\"model.embed_tokens.weight\", but config.json "
                          "ties them (tie_word_embeddings): the checkpoint "
                          "and the config disagree",
                          stow_safetensors_path (fh));
        }
      if (n_extra < 8)
        g_string_append_printf (extra, "%s\"%s\"", n_extra ? ", " : "",
                                names[i]);
      n_extra++;
    }
  if (n_extra == 0)
    return TRUE;
  if (n_extra > 8)
    g_string_append_printf (extra, " and %u more", n_extra - 8);
  if (ignore)
    {
      if (dropped)
        *dropped
            = g_strdup_printf ("%u tensor%s the model does not have: %s",
                               n_extra, n_extra == 1 ? "" : "s", extra->str);
      return TRUE;
    }
  return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                  "%s holds %u tensor%s the model's config.json does not "
                  "make: %s (another model's checkpoint, or layers past "
                  "num_hidden_layers?); --ignore-extra-tensors drops them",
                  w->dir, n_extra, n_extra == 1 ? "" : "s", extra->str);
}

/* ---- saving
 * ------------------------------------------------------------------- */

guint
stow_model_io_cut_shards (const guint64 *bytes, guint n, guint64 max_bytes,
                          guint *shard_of)
{
  /* Groups get ids as they open, and shard numbers as they close. */
  g_autofree guint *number = g_new (guint, 2 * (gsize)n + 1);
  guint groups = 0, closed = 0, open = groups++;
  guint64 in_open = 0;
  for (guint i = 0; i < n; i++)
    {
      if (max_bytes > 0 && bytes[i] > max_bytes)
        {
          number[groups] = closed++;
          shard_of[i] = groups++;
          continue;
        }
      if (max_bytes > 0 && in_open > 0 && in_open + bytes[i] > max_bytes)
        {
          number[open] = closed++;
          open = groups++;
          in_open = 0;
        }
      shard_of[i] = open;
      in_open += bytes[i];
    }
  if (in_open > 0 || closed == 0)
    number[open] = closed++;
  for (guint i = 0; i < n; i++)
    shard_of[i] = number[shard_of[i]];
  return closed;
}

/* The shard of each of @p's tensors (stow_model_io_cut_shards). */
static guint
cut_shards (const StowProgram *p, guint64 esz, guint64 max_bytes,
            guint *shard_of)
{
  guint n = p->unit_tensors->len;
  g_autofree guint64 *bytes = g_new (guint64, MAX (n, 1));
  for (guint i = 0; i < n; i++)
    bytes[i] = g_array_index (p->unit_tensors, StowUnitTensor, i).numel * esz;
  return stow_model_io_cut_shards (bytes, n, max_bytes, shard_of);
}

static char *
shard_name (guint i, guint n)
{
  if (n == 1)
    return g_strdup ("model.safetensors");
  return g_strdup_printf ("model-%05u-of-%05u.safetensors", i + 1, n);
}

typedef struct
{
  const char *name;
  guint shard;
} NameShard;

static int
by_name (const void *a, const void *b)
{
  return strcmp (((const NameShard *)a)->name, ((const NameShard *)b)->name);
}

/* model.safetensors.index.json as transformers' save_pretrained writes it
 * (json.dumps (index, indent=2, sort_keys=True) and a newline). */
static gboolean
write_index (const StowProgram *p, const char *dir, const guint *shard_of,
             guint n, guint64 total, GError **error)
{
  guint nt = p->unit_tensors->len;
  g_autofree NameShard *ns = g_new (NameShard, MAX (nt, 1));
  for (guint i = 0; i < nt; i++)
    ns[i]
        = (NameShard){ g_array_index (p->unit_tensors, StowUnitTensor, i).name,
                       shard_of[i] };
  qsort (ns, nt, sizeof *ns, by_name);
  /* transformers 5 writes the parameter count beside the bytes. */
  guint64 params = 0;
  for (guint i = 0; i < nt; i++)
    params += g_array_index (p->unit_tensors, StowUnitTensor, i).numel;
  g_autoptr (GString) s = g_string_new (NULL);
  g_string_append_printf (s,
                          "{\n  \"metadata\": {\n    \"total_parameters\": "
                          "%" G_GUINT64_FORMAT ",\n    \"total_size\": "
                          "%" G_GUINT64_FORMAT "\n  },\n  \"weight_map\": {\n",
                          params, total);
  for (guint i = 0; i < nt; i++)
    {
      g_autofree char *file = shard_name (ns[i].shard, n);
      g_string_append_printf (s, "    \"%s\": \"%s\"%s\n", ns[i].name, file,
                              i + 1 < nt ? "," : "");
    }
  g_string_append (s, "  }\n}\n");
  g_autofree char *path
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  return stow_file_write_atomic (path, s->str, (gssize)s->len, error);
}

/* Whether @name is a weights file save_pretrained writes: the one file,
 * the index, or a shard "model-0000k-of-0000n.safetensors". */
static gboolean
is_weights_file (const char *name)
{
  static const char pattern[] = "model-#####-of-#####.safetensors";
  if (g_str_equal (name, "model.safetensors")
      || g_str_equal (name, "model.safetensors.index.json"))
    return TRUE;
  if (strlen (name) != sizeof pattern - 1)
    return FALSE;
  for (gsize i = 0; pattern[i] != '\0'; i++)
    if (pattern[i] == '#' ? !g_ascii_isdigit (name[i]) : name[i] != pattern[i])
      return FALSE;
  return TRUE;
}

/* Removes the weights files of an earlier save into @dir that this save
 * (of @n files) did not write over, so that transformers and stowage read
 * this save's files alone (both prefer model.safetensors to an index). */
static gboolean
remove_stale (const char *dir, guint n, GError **error)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, error);
  if (d == NULL)
    return FALSE;
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      if (!is_weights_file (name))
        continue;
      gboolean ours = FALSE;
      for (guint i = 0; i < n && !ours; i++)
        {
          g_autofree char *f = shard_name (i, n);
          ours = g_str_equal (name, f);
        }
      if (ours || (n > 1 && g_str_equal (name, "model.safetensors.index.json")))
        continue;
      g_autofree char *path = g_build_filename (dir, name, NULL);
      if (g_unlink (path) != 0)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "%s: removing the earlier save's file: %s", path,
                       g_strerror (e));
          return FALSE;
        }
    }
  return TRUE;
}

gboolean
stow_model_io_save (const StowProgram *p, const char *dir, StowDtype dtype,
                    guint64 max_shard_bytes, StowUnitWeightsFn get,
                    gpointer user, GError **error)
{
  g_return_val_if_fail (p != NULL && dir != NULL && get != NULL, FALSE);
  guint nt = p->unit_tensors->len;
  guint esz = stow_dtype_size (dtype);
  g_autofree guint *shard_of = g_new0 (guint, MAX (nt, 1));
  guint n = cut_shards (p, esz, max_shard_bytes, shard_of);
  g_autoptr (GPtrArray) writers = g_ptr_array_new_with_free_func (
      (GDestroyNotify)stow_safetensors_writer_free);
  guint64 total = 0;
  for (guint f = 0; f < n; f++)
    {
      g_autoptr (GArray) specs
          = g_array_new (FALSE, TRUE, sizeof (StowSafetensorSpec));
      for (guint i = 0; i < nt; i++)
        {
          if (shard_of[i] != f)
            continue;
          const StowUnitTensor *t
              = &g_array_index (p->unit_tensors, StowUnitTensor, i);
          StowSafetensorSpec s
              = { t->name, stow_dtype_name (dtype), { 0 }, t->n_dims };
          for (guint d = 0; d < t->n_dims; d++)
            s.shape[d] = t->shape[d];
          g_array_append_val (specs, s);
          total += t->numel * esz;
        }
      g_autofree char *name = shard_name (f, n);
      g_autofree char *path = g_build_filename (dir, name, NULL);
      StowSafetensorsWriter *w = stow_safetensors_writer_new (
          path, (StowSafetensorSpec *)specs->data, specs->len, NULL, error);
      if (w == NULL)
        return FALSE;
      g_ptr_array_add (writers, w);
    }
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      const guint8 *src = get (user, ui);
      if (src == NULL)
        return wf_fail (error, STOW_SAFETENSORS_ERROR_INVALID,
                        "%s: the weights of unit %u are not at hand", dir, ui);
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = tensor_at (p, u, k);
          StowSafetensorsWriter *w
              = g_ptr_array_index (writers, shard_of[u->first_tensor + k]);
          if (!stow_safetensors_writer_write (w, src + t->offset * esz,
                                              t->numel * esz, error))
            return FALSE;
        }
    }
  for (guint f = 0; f < n; f++)
    if (!stow_safetensors_writer_finish (g_ptr_array_index (writers, f), error))
      return FALSE;
  return (n == 1 || write_index (p, dir, shard_of, n, total, error))
         && remove_stale (dir, n, error);
}

/* ---- initialisation -------------------------------------------------------
 */

typedef struct
{
  guint64 s[4];
} Rng;

static guint64
splitmix64 (guint64 *x)
{
  guint64 z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static guint64
rotl (guint64 x, int k)
{
  return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman and Vigna 2018). */
static guint64
next (Rng *r)
{
  guint64 *s = r->s;
  guint64 result = rotl (s[1] * 5, 7) * 9;
  guint64 t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl (s[3], 45);
  return result;
}

/* A uniform double in (0, 1]. */
static double
uniform (Rng *r)
{
  return ((double)(next (r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void
stow_model_io_init_unit (const StowProgram *p, guint unit, double std,
                         guint64 seed, StowDtype dtype, void *dst)
{
  const StowUnit *u = &g_array_index (p->units, StowUnit, unit);
  guint64 x = seed ^ (0xa0761d6478bd642fULL * (unit + 1));
  Rng r;
  for (int i = 0; i < 4; i++)
    r.s[i] = splitmix64 (&x);
  guint esz = stow_dtype_size (dtype);
  for (guint k = 0; k < u->n_tensors; k++)
    {
      const StowUnitTensor *t = tensor_at (p, u, k);
      guint8 *out = (guint8 *)dst + t->offset * esz;
      gboolean is_bias = g_str_has_suffix (t->name, ".bias");
      gboolean is_norm = t->role == STOW_ROLE_NORM;
      for (guint64 i = 0; i < t->numel; i++)
        {
          float v;
          if (is_norm)
            v = 1.0f;
          else if (is_bias)
            v = 0.0f;
          else
            {
              /* Box-Muller: one normal per pair of uniforms (the second is
               * dropped, so element i depends on i alone). */
              double u1 = uniform (&r), u2 = uniform (&r);
              v = (float)(std * sqrt (-2.0 * log (u1)) * cos (2.0 * G_PI * u2));
            }
          convert (&v, "F32", out + i * esz, dtype, 1);
        }
    }
}
