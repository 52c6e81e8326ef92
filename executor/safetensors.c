/* SPDX-License-Identifier: MIT
 *
 * executor/safetensors.c: the safetensors reader and streaming writer (see
 * safetensors.h).  The reader checks the whole header against the file's
 * size before it reads a byte of data; the writer sends its header first
 * and the data after it in pieces, into a temporary file renamed into place.
 */
#include "executor/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "core/json.h"
#include "executor/fileio.h"

/* clang-format off */
G_DEFINE_QUARK (stow-safetensors-error-quark, stow_safetensors_error)
/* clang-format on */

/* The format needs three levels (the root, a tensor, its shape); the
 * reference reader ignores unknown members, which may nest a little. */
#define MAX_HEADER_DEPTH 8

/* The dtypes of the reference implementation (safetensors 0.4) that have
 * whole bytes per element. */
static const struct
{
  const char *name;
  guint size;
} dtypes[] = {
  { "F64", 8 }, { "F32", 4 }, { "F16", 2 },  { "BF16", 2 },    { "I64", 8 },
  { "I32", 4 }, { "I16", 2 }, { "I8", 1 },   { "U64", 8 },     { "U32", 4 },
  { "U16", 2 }, { "U8", 1 },  { "BOOL", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
};

guint
stow_safetensors_dtype_size (const char *dtype)
{
  g_return_val_if_fail (dtype != NULL, 0);
  for (guint i = 0; i < G_N_ELEMENTS (dtypes); i++)
    if (strcmp (dtypes[i].name, dtype) == 0)
      return dtypes[i].size;
  return 0;
}

/* "[4, 8]" */
static char *
shape_text (const guint64 *shape, guint n_dims)
{
  GString *s = g_string_new ("[");
  for (guint i = 0; i < n_dims; i++)
    g_string_append_printf (s, "%s%" G_GUINT64_FORMAT, i ? ", " : "", shape[i]);
  g_string_append_c (s, ']');
  return g_string_free (s, FALSE);
}

/* numel and nbytes of a shape, FALSE when either passes 2^63 (a file
 * offset could not hold it). */
static gboolean
shape_bytes (const guint64 *shape, guint n_dims, guint elem_size,
             guint64 *numel, guint64 *nbytes)
{
  guint64 n = 1;
  for (guint i = 0; i < n_dims; i++)
    if (!g_uint64_checked_mul (&n, n, shape[i]) || n > (guint64)G_MAXINT64)
      return FALSE;
  guint64 b;
  if (!g_uint64_checked_mul (&b, n, elem_size) || b > (guint64)G_MAXINT64)
    return FALSE;
  *numel = n;
  *nbytes = b;
  return TRUE;
}

/* ---- reader -------------------------------------------------------------- */

struct _StowSafetensors
{
  char *path;
  int fd;
  guint64 data_start; /* 8 + the header length */
  guint64 data_bytes;
  GArray *tensors;      /* StowSafetensor, by data offset */
  GHashTable *by_name;  /* name -> StowSafetensor * into tensors */
  GHashTable *metadata; /* char * -> char * */
};

static void
safetensor_clear (gpointer p)
{
  StowSafetensor *t = p;
  g_free (t->name);
  g_free (t->dtype);
}

static gboolean G_GNUC_PRINTF (4, 5)
    invalid (GError **error, const char *path, const char *tensor,
             const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  if (tensor != NULL)
    g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_INVALID,
                 "%s: tensor \"%s\": %s", path, tensor, what);
  else
    g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_INVALID,
                 "%s: %s", path, what);
  return FALSE;
}

/* A JSON integer in [0, 2^63).  json-glib saturates literals past 64 bits
 * (to -1 or G_MAXINT64), which the range checks after this one catch. */
static gboolean
json_u64 (JsonNode *node, guint64 *out)
{
  if (!JSON_NODE_HOLDS_VALUE (node)
      || json_node_get_value_type (node) != G_TYPE_INT64)
    return FALSE;
  gint64 v = json_node_get_int (node);
  if (v < 0)
    return FALSE;
  *out = (guint64)v;
  return TRUE;
}

static gboolean
parse_shape (const char *path, const char *name, JsonNode *node,
             StowSafetensor *t, GError **error)
{
  if (!JSON_NODE_HOLDS_ARRAY (node))
    {
      g_autofree char *got = stow_json_describe (node);
      return invalid (error, path, name,
                      "shape: expected an array of integers, got %s", got);
    }
  JsonArray *a = json_node_get_array (node);
  guint n = json_array_get_length (a);
  if (n > STOW_SAFETENSORS_MAX_DIMS)
    return invalid (error, path, name,
                    "shape has %u dimensions, at most %u are supported", n,
                    STOW_SAFETENSORS_MAX_DIMS);
  for (guint i = 0; i < n; i++)
    {
      JsonNode *d = json_array_get_element (a, i);
      if (!json_u64 (d, &t->shape[i]))
        {
          g_autofree char *got = stow_json_describe (d);
          return invalid (error, path, name,
                          "shape[%u]: expected a non-negative integer, got %s",
                          i, got);
        }
    }
  t->n_dims = n;
  return TRUE;
}

/* One tensor's entry: dtype, shape, data_offsets, each checked against the
 * data section of @data_bytes. */
static gboolean
parse_tensor (const char *path, const char *name, JsonNode *node,
              guint64 data_bytes, StowSafetensor *t, GError **error)
{
  if (!JSON_NODE_HOLDS_OBJECT (node))
    {
      g_autofree char *got = stow_json_describe (node);
      return invalid (error, path, name, "expected an object, got %s", got);
    }
  JsonObject *o = json_node_get_object (node);
  static const char *const members[] = { "dtype", "shape", "data_offsets" };
  for (guint i = 0; i < G_N_ELEMENTS (members); i++)
    if (!json_object_has_member (o, members[i]))
      return invalid (error, path, name, "%s is missing", members[i]);

  JsonNode *dn = json_object_get_member (o, "dtype");
  if (!JSON_NODE_HOLDS_VALUE (dn)
      || json_node_get_value_type (dn) != G_TYPE_STRING)
    {
      g_autofree char *got = stow_json_describe (dn);
      return invalid (error, path, name, "dtype: expected a string, got %s",
                      got);
    }
  const char *dtype = json_node_get_string (dn);
  guint elem = stow_safetensors_dtype_size (dtype);
  if (elem == 0)
    {
      g_autofree char *got = stow_json_describe (dn);
      return invalid (error, path, name,
                      "dtype %s is not a safetensors dtype (F64, F32, F16, "
                      "BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, "
                      "F8_E4M3, F8_E5M2)",
                      got);
    }
  t->dtype = g_strdup (dtype);

  if (!parse_shape (path, name, json_object_get_member (o, "shape"), t, error))
    return FALSE;
  g_autofree char *shape = shape_text (t->shape, t->n_dims);
  if (!shape_bytes (t->shape, t->n_dims, elem, &t->numel, &t->nbytes))
    return invalid (error, path, name,
                    "shape %s of %s holds more than 2^63 bytes", shape, dtype);

  JsonNode *on = json_object_get_member (o, "data_offsets");
  JsonArray *oa = JSON_NODE_HOLDS_ARRAY (on) ? json_node_get_array (on) : NULL;
  guint64 begin = 0, end = 0;
  if (oa == NULL || json_array_get_length (oa) != 2
      || !json_u64 (json_array_get_element (oa, 0), &begin)
      || !json_u64 (json_array_get_element (oa, 1), &end))
    {
      g_autofree char *got = stow_json_describe (on);
      return invalid (error, path, name,
                      "data_offsets: expected [begin, end] of non-negative "
                      "integers, got %s",
                      got);
    }
  if (end < begin)
    return invalid (error, path, name,
                    "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    "): begin is past end",
                    begin, end);
  if (end - begin != t->nbytes)
    return invalid (error, path, name,
                    "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    ") hold %" G_GUINT64_FORMAT " bytes, shape %s of %s needs "
                    "%" G_GUINT64_FORMAT,
                    begin, end, end - begin, shape, dtype, t->nbytes);
  if (end > data_bytes)
    return invalid (error, path, name,
                    "data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    ") end past the data section (%" G_GUINT64_FORMAT
                    " bytes): the file is shorter than its header says",
                    begin, end, data_bytes);
  t->offset = begin;
  return TRUE;
}

static gboolean
parse_metadata (StowSafetensors *st, JsonNode *node, GError **error)
{
  if (JSON_NODE_HOLDS_NULL (node))
    return TRUE; /* the reference reader's Option: null is none */
  if (!JSON_NODE_HOLDS_OBJECT (node))
    {
      g_autofree char *got = stow_json_describe (node);
      return invalid (error, st->path, NULL,
                      "__metadata__: expected an object of strings, got %s",
                      got);
    }
  JsonObjectIter it;
  const char *key;
  JsonNode *v;
  json_object_iter_init (&it, json_node_get_object (node));
  while (json_object_iter_next (&it, &key, &v))
    {
      if (!JSON_NODE_HOLDS_VALUE (v)
          || json_node_get_value_type (v) != G_TYPE_STRING)
        {
          g_autofree char *got = stow_json_describe (v);
          return invalid (error, st->path, NULL,
                          "__metadata__: \"%s\": expected a string, got %s",
                          key, got);
        }
      g_hash_table_insert (st->metadata, g_strdup (key),
                           g_strdup (json_node_get_string (v)));
    }
  return TRUE;
}

static gint
tensor_by_offset (gconstpointer pa, gconstpointer pb)
{
  const StowSafetensor *a = pa, *b = pb;
  if (a->offset != b->offset)
    return a->offset < b->offset ? -1 : 1;
  if (a->nbytes != b->nbytes)
    return a->nbytes < b->nbytes ? -1 : 1;
  return strcmp (a->name, b->name);
}

/* Tensors need not be contiguous, but no byte may belong to two of them.
 * Empty tensors own no bytes. */
static gboolean
check_overlaps (StowSafetensors *st, GError **error)
{
  const StowSafetensor *owner = NULL;
  for (guint i = 0; i < st->tensors->len; i++)
    {
      const StowSafetensor *t = &g_array_index (st->tensors, StowSafetensor, i);
      if (t->nbytes == 0)
        continue;
      if (owner != NULL && t->offset < owner->offset + owner->nbytes)
        return invalid (error, st->path, t->name,
                        "data_offsets [%" G_GUINT64_FORMAT
                        ", %" G_GUINT64_FORMAT ") overlap tensor \"%s\" "
                        "[%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ")",
                        t->offset, t->offset + t->nbytes, owner->name,
                        owner->offset, owner->offset + owner->nbytes);
      if (owner == NULL
          || t->offset + t->nbytes > owner->offset + owner->nbytes)
        owner = t;
    }
  return TRUE;
}

static gboolean
parse_header (StowSafetensors *st, const char *text, gsize len, GError **error)
{
  /* Strict UTF-8 with no NUL, as the reference reader demands (it decodes
   * the header as a Rust str); json-glib would stop at a NUL silently. */
  const char *bad = NULL;
  if (!g_utf8_validate (text, (gssize)len, &bad))
    return invalid (error, st->path, NULL,
                    "header byte %" G_GSIZE_FORMAT " is not UTF-8 text",
                    (gsize)(bad - text));
  g_autoptr (GError) local = NULL;
  if (!stow_json_check_nesting (text, len, MAX_HEADER_DEPTH, "header", &local))
    return invalid (error, st->path, NULL, "%s", local->message);
  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  if (!json_parser_load_from_data (parser, text, (gssize)len, &local))
    {
      const char *msg = local->message;
      if (g_str_has_prefix (msg, "<data>"))
        msg += strlen ("<data>");
      return invalid (error, st->path, NULL, "header%s%s",
                      msg[0] == ':' ? "" : ": ", msg);
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      g_autofree char *got = root ? stow_json_describe (root) : NULL;
      return invalid (error, st->path, NULL,
                      "header: expected a JSON object, got %s",
                      got ? got : "nothing");
    }
  JsonObjectIter it;
  const char *name;
  JsonNode *node;
  json_object_iter_init (&it, json_node_get_object (root));
  while (json_object_iter_next (&it, &name, &node))
    {
      if (strcmp (name, "__metadata__") == 0)
        {
          if (!parse_metadata (st, node, error))
            return FALSE;
          continue;
        }
      StowSafetensor t = { .name = g_strdup (name) };
      if (!parse_tensor (st->path, name, node, st->data_bytes, &t, error))
        {
          safetensor_clear (&t);
          return FALSE;
        }
      g_array_append_val (st->tensors, t);
    }
  g_array_sort (st->tensors, tensor_by_offset);
  if (!check_overlaps (st, error))
    return FALSE;
  for (guint i = 0; i < st->tensors->len; i++)
    {
      StowSafetensor *t = &g_array_index (st->tensors, StowSafetensor, i);
      g_hash_table_insert (st->by_name, t->name, t);
    }
  return TRUE;
}

static gboolean G_GNUC_PRINTF (4, 5)
    io_failed (GError **error, int neg_errno, const char *path,
               const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO,
               "%s: %s: %s", path, what, g_strerror (-neg_errno));
  return FALSE;
}

StowSafetensors *
stow_safetensors_open (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_autoptr (StowSafetensors) st = g_new0 (StowSafetensors, 1);
  st->path = g_strdup (path);
  st->tensors = g_array_new (FALSE, TRUE, sizeof (StowSafetensor));
  g_array_set_clear_func (st->tensors, safetensor_clear);
  st->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  st->metadata
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  st->fd = open (path, O_RDONLY | O_CLOEXEC);
  if (st->fd < 0)
    {
      io_failed (error, -errno, path, "open");
      return NULL;
    }
  struct stat sb;
  if (fstat (st->fd, &sb) < 0)
    {
      io_failed (error, -errno, path, "stat");
      return NULL;
    }
  if (!S_ISREG (sb.st_mode))
    {
      invalid (error, path, NULL, "not a regular file");
      return NULL;
    }
  guint64 file_bytes = (guint64)sb.st_size;
  if (file_bytes < 8)
    {
      invalid (error, path, NULL,
               "%" G_GUINT64_FORMAT " bytes is shorter than the 8-byte "
               "header length",
               file_bytes);
      return NULL;
    }
  guint64 header_le;
  gint64 got = stow_fd_pread_all (st->fd, &header_le, 8, 0);
  if (got != 8)
    {
      io_failed (error, got < 0 ? (int)got : -EIO, path,
                 "reading the header length");
      return NULL;
    }
  guint64 header_bytes = GUINT64_FROM_LE (header_le);
  if (header_bytes > STOW_SAFETENSORS_MAX_HEADER)
    {
      invalid (error, path, NULL,
               "header length %" G_GUINT64_FORMAT
               " is over the %" G_GUINT64_FORMAT "-byte limit",
               header_bytes, STOW_SAFETENSORS_MAX_HEADER);
      return NULL;
    }
  if (header_bytes > file_bytes - 8)
    {
      invalid (error, path, NULL,
               "header length %" G_GUINT64_FORMAT " runs past the end of the "
               "file (%" G_GUINT64_FORMAT " bytes)",
               header_bytes, file_bytes);
      return NULL;
    }
  st->data_start = 8 + header_bytes;
  st->data_bytes = file_bytes - st->data_start;
  g_autofree char *text = g_malloc (header_bytes + 1);
  got = stow_fd_pread_all (st->fd, text, header_bytes, 8);
  if (got < 0 || (guint64)got != header_bytes)
    {
      io_failed (error, got < 0 ? (int)got : -EIO, path, "reading the header");
      return NULL;
    }
  text[header_bytes] = '\0';
  if (!parse_header (st, text, header_bytes, error))
    return NULL;
  return g_steal_pointer (&st);
}

void
stow_safetensors_close (StowSafetensors *st)
{
  if (st == NULL)
    return;
  if (st->fd >= 0)
    close (st->fd);
  g_clear_pointer (&st->by_name, g_hash_table_unref);
  g_clear_pointer (&st->metadata, g_hash_table_unref);
  g_clear_pointer (&st->tensors, g_array_unref);
  g_free (st->path);
  g_free (st);
}

const char *
stow_safetensors_path (const StowSafetensors *st)
{
  g_return_val_if_fail (st != NULL, NULL);
  return st->path;
}

guint
stow_safetensors_n_tensors (const StowSafetensors *st)
{
  g_return_val_if_fail (st != NULL, 0);
  return st->tensors->len;
}

const StowSafetensor *
stow_safetensors_nth (const StowSafetensors *st, guint i)
{
  g_return_val_if_fail (st != NULL && i < st->tensors->len, NULL);
  return &g_array_index (st->tensors, StowSafetensor, i);
}

const StowSafetensor *
stow_safetensors_find (const StowSafetensors *st, const char *name)
{
  g_return_val_if_fail (st != NULL && name != NULL, NULL);
  return g_hash_table_lookup (st->by_name, name);
}

const char *
stow_safetensors_metadata (const StowSafetensors *st, const char *key)
{
  g_return_val_if_fail (st != NULL && key != NULL, NULL);
  return g_hash_table_lookup (st->metadata, key);
}

gboolean
stow_safetensors_read (StowSafetensors *st, const StowSafetensor *tensor,
                       guint64 offset, void *dst, guint64 bytes, GError **error)
{
  g_return_val_if_fail (st != NULL && tensor != NULL, FALSE);
  g_return_val_if_fail (dst != NULL || bytes == 0, FALSE);
  g_return_val_if_fail (
      offset <= tensor->nbytes && bytes <= tensor->nbytes - offset, FALSE);
  /* Offsets were checked against the file's size at open, so this only
   * fails when the file shrank since. */
  guint64 at = st->data_start + tensor->offset + offset;
  gint64 got = stow_fd_pread_all (st->fd, dst, bytes, at);
  if (got < 0)
    return io_failed (error, (int)got, st->path,
                      "tensor \"%s\": reading %" G_GUINT64_FORMAT
                      " bytes at file offset %" G_GUINT64_FORMAT,
                      tensor->name, bytes, at);
  if ((guint64)got != bytes)
    {
      g_set_error (
          error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO,
          "%s: tensor \"%s\": short read at file offset %" G_GUINT64_FORMAT
          ": %" G_GINT64_FORMAT " of %" G_GUINT64_FORMAT
          " bytes (the file shrank after it was opened)",
          st->path, tensor->name, at + (guint64)got, got, bytes);
      return FALSE;
    }
  return TRUE;
}

/* ---- writer -------------------------------------------------------------- */

struct _StowSafetensorsWriter
{
  char *path;
  char *tmp_path; /* NULL once renamed or removed */
  int fd;
  guint n_tensors;
  char **names;  /* (n_tensors) */
  guint64 *ends; /* (n_tensors) end of each tensor's data */
  guint64 total; /* bytes of data declared */
  guint64 written;
  gboolean failed; /* a call failed: finish refuses */
};

static gboolean G_GNUC_PRINTF (3, 4)
    writer_invalid (StowSafetensorsWriter *w, GError **error,
                    const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_INVALID,
               "%s: %s", w->path, what);
  w->failed = TRUE;
  return FALSE;
}

static gboolean
writer_io (StowSafetensorsWriter *w, GError **error, int neg_errno,
           const char *what)
{
  g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO,
               "%s: %s %s: %s", w->path, what, w->tmp_path ? w->tmp_path : "",
               g_strerror (-neg_errno));
  w->failed = TRUE;
  return FALSE;
}

static void
writer_remove_tmp (StowSafetensorsWriter *w)
{
  if (w->fd >= 0)
    {
      close (w->fd);
      w->fd = -1;
    }
  if (w->tmp_path != NULL)
    {
      g_unlink (w->tmp_path);
      g_clear_pointer (&w->tmp_path, g_free);
    }
}

static gint
compare_strings (gconstpointer a, gconstpointer b)
{
  return strcmp (*(const char *const *)a, *(const char *const *)b);
}

/* The JSON header, padded with spaces to a multiple of 8 bytes as the
 * reference writer does (so the data of an 8-byte dtype is aligned). */
static char *
writer_header (const StowSafetensorSpec *specs, guint n_specs,
               const guint64 *ends, GHashTable *metadata, gsize *len)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "__metadata__");
  json_builder_begin_object (b);
  /* "pt": transformers' from_pretrained refuses a file without it. */
  if (metadata == NULL || !g_hash_table_contains (metadata, "format"))
    stow_json_set_string (b, "format", "pt");
  if (metadata != NULL)
    {
      /* Sorted, so that the same inputs always give the same bytes. */
      g_autofree gpointer *keys
          = g_hash_table_get_keys_as_array (metadata, NULL);
      guint n = g_hash_table_size (metadata);
      qsort (keys, n, sizeof (gpointer), compare_strings);
      for (guint i = 0; i < n; i++)
        stow_json_set_string (b, keys[i],
                              g_hash_table_lookup (metadata, keys[i]));
    }
  json_builder_end_object (b);
  for (guint i = 0; i < n_specs; i++)
    {
      json_builder_set_member_name (b, specs[i].name);
      json_builder_begin_object (b);
      stow_json_set_string (b, "dtype", specs[i].dtype);
      json_builder_set_member_name (b, "shape");
      json_builder_begin_array (b);
      for (guint d = 0; d < specs[i].n_dims; d++)
        json_builder_add_int_value (b, (gint64)specs[i].shape[d]);
      json_builder_end_array (b);
      json_builder_set_member_name (b, "data_offsets");
      json_builder_begin_array (b);
      json_builder_add_int_value (b, (gint64)(i ? ends[i - 1] : 0));
      json_builder_add_int_value (b, (gint64)ends[i]);
      json_builder_end_array (b);
      json_builder_end_object (b);
    }
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *text = stow_json_to_string (root, FALSE);
  GString *s = g_string_new (text);
  while (s->len % 8 != 0)
    g_string_append_c (s, ' ');
  *len = s->len;
  return g_string_free (s, FALSE);
}

static gboolean
writer_check_specs (StowSafetensorsWriter *w, const StowSafetensorSpec *specs,
                    guint n_specs, GError **error)
{
  g_autoptr (GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  guint64 end = 0;
  for (guint i = 0; i < n_specs; i++)
    {
      const StowSafetensorSpec *s = &specs[i];
      if (s->name == NULL || strcmp (s->name, "__metadata__") == 0)
        return writer_invalid (w, error,
                               "spec %u: a tensor needs a name "
                               "other than __metadata__",
                               i);
      if (!g_hash_table_add (seen, (gpointer)s->name))
        return writer_invalid (w, error, "tensor \"%s\" is named twice",
                               s->name);
      guint elem = s->dtype ? stow_safetensors_dtype_size (s->dtype) : 0;
      if (elem == 0)
        return writer_invalid (w, error, "tensor \"%s\": unknown dtype %s",
                               s->name, s->dtype ? s->dtype : "(null)");
      if (s->n_dims > STOW_SAFETENSORS_MAX_DIMS)
        return writer_invalid (w, error,
                               "tensor \"%s\": %u dimensions, at "
                               "most %u",
                               s->name, s->n_dims, STOW_SAFETENSORS_MAX_DIMS);
      guint64 numel, nbytes;
      if (!shape_bytes (s->shape, s->n_dims, elem, &numel, &nbytes)
          || !g_uint64_checked_add (&end, end, nbytes)
          || end > (guint64)G_MAXINT64)
        {
          g_autofree char *shape = shape_text (s->shape, s->n_dims);
          return writer_invalid (w, error,
                                 "tensor \"%s\": shape %s of %s "
                                 "passes 2^63 bytes",
                                 s->name, shape, s->dtype);
        }
      w->names[i] = g_strdup (s->name);
      w->ends[i] = end;
    }
  w->total = end;
  return TRUE;
}

StowSafetensorsWriter *
stow_safetensors_writer_new (const char *path, const StowSafetensorSpec *specs,
                             guint n_specs, GHashTable *metadata,
                             GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (specs != NULL || n_specs == 0, NULL);
  g_autoptr (StowSafetensorsWriter) w = g_new0 (StowSafetensorsWriter, 1);
  w->path = g_strdup (path);
  w->fd = -1;
  w->n_tensors = n_specs;
  w->names = g_new0 (char *, n_specs + 1);
  w->ends = g_new0 (guint64, n_specs);
  if (!writer_check_specs (w, specs, n_specs, error))
    return NULL;

  gsize header_len;
  g_autofree char *header
      = writer_header (specs, n_specs, w->ends, metadata, &header_len);

  /* Beside the target, so the final rename stays in one file system. */
  g_autofree char *dir = g_path_get_dirname (path);
  g_autofree char *base = g_path_get_basename (path);
  g_autofree char *tmpl = g_strdup_printf ("%s/.%s.tmp-XXXXXX", dir, base);
  w->fd = g_mkstemp_full (tmpl, O_RDWR | O_CLOEXEC, 0644);
  if (w->fd < 0)
    {
      int e = errno;
      g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO,
                   "%s: creating a temporary file beside it: %s", path,
                   g_strerror (e));
      return NULL;
    }
  w->tmp_path = g_steal_pointer (&tmpl);
  guint64 len_le = GUINT64_TO_LE ((guint64)header_len);
  int rc = stow_fd_write_all (w->fd, &len_le, 8);
  if (rc == 0)
    rc = stow_fd_write_all (w->fd, header, header_len);
  if (rc < 0)
    {
      writer_io (w, error, rc, "writing the header to");
      return NULL;
    }
  return g_steal_pointer (&w);
}

/* The first tensor whose data is not all written. */
static guint
writer_current (const StowSafetensorsWriter *w)
{
  guint i = 0;
  while (i < w->n_tensors && w->ends[i] <= w->written)
    i++;
  return i;
}

gboolean
stow_safetensors_writer_write (StowSafetensorsWriter *w, const void *data,
                               guint64 bytes, GError **error)
{
  g_return_val_if_fail (w != NULL, FALSE);
  g_return_val_if_fail (data != NULL || bytes == 0, FALSE);
  if (w->failed || w->tmp_path == NULL)
    return writer_invalid (w, error, "the writer already failed or finished");
  if (bytes > w->total - w->written)
    return writer_invalid (w, error,
                           "%" G_GUINT64_FORMAT " bytes past the declared "
                           "data (%" G_GUINT64_FORMAT " bytes in %u tensors, "
                           "%" G_GUINT64_FORMAT " written)",
                           bytes - (w->total - w->written), w->total,
                           w->n_tensors, w->written);
  int rc = stow_fd_write_all (w->fd, data, bytes);
  if (rc < 0)
    return writer_io (w, error, rc, "writing data to");
  w->written += bytes;
  return TRUE;
}

gboolean
stow_safetensors_writer_finish (StowSafetensorsWriter *w, GError **error)
{
  g_return_val_if_fail (w != NULL, FALSE);
  if (w->failed || w->tmp_path == NULL)
    {
      writer_remove_tmp (w);
      return writer_invalid (w, error, "the writer already failed or finished");
    }
  if (w->written < w->total)
    {
      guint i = writer_current (w);
      guint64 begin = i ? w->ends[i - 1] : 0;
      writer_invalid (w, error,
                      "tensor \"%s\" got %" G_GUINT64_FORMAT
                      " of its %" G_GUINT64_FORMAT " bytes",
                      w->names[i], w->written - begin, w->ends[i] - begin);
      writer_remove_tmp (w);
      return FALSE;
    }
  int rc = fsync (w->fd) < 0 ? -errno : 0;
  if (rc == 0)
    {
      rc = close (w->fd) < 0 ? -errno : 0;
      w->fd = -1;
    }
  if (rc == 0 && rename (w->tmp_path, w->path) < 0)
    rc = -errno;
  if (rc < 0)
    {
      writer_io (w, error, rc, "fsync, close or rename of");
      writer_remove_tmp (w);
      return FALSE;
    }
  g_clear_pointer (&w->tmp_path, g_free);
  /* The rename is durable only once the directory is. */
  g_autofree char *dir = g_path_get_dirname (w->path);
  rc = stow_fsync_path (dir);
  if (rc < 0)
    {
      g_set_error (error, STOW_SAFETENSORS_ERROR, STOW_SAFETENSORS_ERROR_IO,
                   "%s: fsync of its directory: %s", w->path, g_strerror (-rc));
      w->failed = TRUE;
      return FALSE;
    }
  return TRUE;
}

void
stow_safetensors_writer_free (StowSafetensorsWriter *w)
{
  if (w == NULL)
    return;
  writer_remove_tmp (w);
  g_strfreev (w->names);
  g_free (w->ends);
  g_free (w->path);
  g_free (w);
}
