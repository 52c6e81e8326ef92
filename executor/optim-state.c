/* SPDX-License-Identifier: MIT
 *
 * executor/optim-state.c: the optimizer-state file (optim-state.h),
 * streamed through XXH3 as it is written and checked section by section
 * as it is read (docs/checkpoint-format.md).
 */
#include "executor/optim-state.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <xxhash.h>

#include "core/json.h"
#include "executor/fileio.h"

static gboolean G_GNUC_PRINTF (4, 5)
    fail (GError **error, StowCheckpointError code, const char *path,
          const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_CHECKPOINT_ERROR, code, "%s: %s", path, what);
  return FALSE;
}

/* ---- the optimizer-state file --------------------------------------------
 * Offsets in the fixed prefix: magic 0, version 8, header length 12, header
 * xxh3 20; the JSON header at 28.  See docs/checkpoint-format.md. */

#define OPT_MAGIC        "STOWOPT"
#define OPT_VERSION      1
#define OPT_PREFIX_BYTES 28
#define OPT_ALIGN        64
/* Tens of thousands of tensors fit in a few MB of header. */
#define OPT_MAX_HEADER ((guint64)64 << 20)
/* The format needs four levels below the caller's state; the state itself
 * (hyperparameters, RNG) is shallow. */
#define OPT_MAX_DEPTH 32
/* Written in place of each checksum until finish knows it: same width as
 * 16 hex digits, so the final header has the same length. */
#define OPT_XXH3_PENDING "----------------"

typedef struct
{
  char *name;
  guint64 offset; /* from the start of the data, a multiple of 64 */
  guint64 bytes;
  XXH64_hash_t xxh3;
  gboolean verified; /* read and checked by a set (reading only) */
} OptSection;

typedef struct
{
  char *name;
  guint64 n;
  guint64 first, total; /* elements [first, first + n) of total */
  gboolean ranged;      /* the header says "first" and "total" */
  guint n_sections;
  OptSection sec[4];
} OptTensor;

static void
opt_tensors_free (OptTensor *t, guint n)
{
  for (guint i = 0; i < n; i++)
    {
      g_free (t[i].name);
      for (guint s = 0; s < t[i].n_sections; s++)
        g_free (t[i].sec[s].name);
    }
  g_free (t);
}

static guint64
align_up (guint64 v)
{
  return (v + OPT_ALIGN - 1) / OPT_ALIGN * OPT_ALIGN;
}

/* The JSON header, with @final checksums or OPT_XXH3_PENDING, padded with
 * spaces so that the data begins right after it, at a multiple of 64.
 * "rank", "world", "first" and "total" only where they say something
 * (several ranks, or a part of a tensor): a one-rank file of whole tensors
 * stays the bytes it was before they existed. */
static char *
opt_header (guint rank, guint world, JsonNode *state, const OptTensor *tensors,
            guint n_tensors, gboolean final, gsize *len)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  if (world > 1)
    {
      stow_json_set_u64 (b, "rank", rank);
      stow_json_set_u64 (b, "world", world);
    }
  json_builder_set_member_name (b, "state");
  json_builder_add_value (b, json_node_copy (state));
  json_builder_set_member_name (b, "tensors");
  json_builder_begin_array (b);
  for (guint i = 0; i < n_tensors; i++)
    {
      const OptTensor *t = &tensors[i];
      json_builder_begin_object (b);
      stow_json_set_string (b, "name", t->name);
      stow_json_set_u64 (b, "n", t->n);
      if (t->ranged)
        {
          stow_json_set_u64 (b, "first", t->first);
          stow_json_set_u64 (b, "total", t->total);
        }
      json_builder_set_member_name (b, "sections");
      json_builder_begin_array (b);
      for (guint s = 0; s < t->n_sections; s++)
        {
          char hex[17];
          g_snprintf (hex, sizeof hex, "%016" G_GINT64_MODIFIER "x",
                      (guint64)t->sec[s].xxh3);
          json_builder_begin_object (b);
          stow_json_set_string (b, "name", t->sec[s].name);
          stow_json_set_u64 (b, "offset", t->sec[s].offset);
          stow_json_set_u64 (b, "bytes", t->sec[s].bytes);
          stow_json_set_string (b, "xxh3", final ? hex : OPT_XXH3_PENDING);
          json_builder_end_object (b);
        }
      json_builder_end_array (b);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *text = stow_json_to_string (root, FALSE);
  GString *s = g_string_new (text);
  while ((OPT_PREFIX_BYTES + s->len) % OPT_ALIGN != 0)
    g_string_append_c (s, ' ');
  *len = s->len;
  return g_string_free (s, FALSE);
}

/* The 28-byte prefix for a header of @len bytes. */
static void
opt_prefix (guint8 *out, const char *header, gsize len)
{
  guint32 version = GUINT32_TO_LE (OPT_VERSION);
  guint64 hlen = GUINT64_TO_LE ((guint64)len);
  guint64 sum = GUINT64_TO_LE ((guint64)XXH3_64bits (header, len));
  memcpy (out, OPT_MAGIC, 8); /* with its NUL */
  memcpy (out + 8, &version, 4);
  memcpy (out + 12, &hlen, 8);
  memcpy (out + 20, &sum, 8);
}

struct _StowOptimStateWriter
{
  char *path;
  int fd;
  guint rank, world;
  JsonNode *state;
  OptTensor *tensors;
  guint n_tensors;
  guint64 data_start; /* file offset of the data */
  guint64 data_bytes; /* end of the last section */
  guint64 pos;        /* data bytes written, padding included */
  guint t, s;         /* the section being written */
  guint64 done;       /* its bytes written */
  XXH3_state_t *xxh;  /* over the current section's bytes so far */
  gboolean created;   /* @path exists because of us */
  gboolean failed;
  gboolean finished;
};

static gboolean G_GNUC_PRINTF (4, 5)
    writer_fail (StowOptimStateWriter *w, GError **error,
                 StowCheckpointError code, const char *format, ...)
{
  va_list ap;
  va_start (ap, format);
  g_autofree char *what = g_strdup_vprintf (format, ap);
  va_end (ap);
  g_set_error (error, STOW_CHECKPOINT_ERROR, code, "%s: %s", w->path, what);
  w->failed = TRUE;
  return FALSE;
}

static gboolean
writer_check_specs (StowOptimStateWriter *w, const StowOptimStateSpec *specs,
                    guint n_specs, GError **error)
{
  g_autoptr (GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  guint64 end = 0;
  w->tensors = g_new0 (OptTensor, n_specs);
  w->n_tensors = n_specs;
  for (guint i = 0; i < n_specs; i++)
    {
      const StowOptimStateSpec *sp = &specs[i];
      OptTensor *t = &w->tensors[i];
      if (sp->name == NULL)
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "spec %u: a tensor needs a name", i);
      if (!g_hash_table_add (seen, (gpointer)sp->name))
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "tensor \"%s\" is named twice", sp->name);
      if (sp->n_sections == 0 || sp->n_sections > G_N_ELEMENTS (sp->sections))
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "tensor \"%s\": %u sections, expected 1 to 4",
                            sp->name, sp->n_sections);
      guint64 bytes;
      if (!g_uint64_checked_mul (&bytes, sp->n, 4)
          || bytes > (guint64)G_MAXINT64 / 2)
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "tensor \"%s\": %" G_GUINT64_FORMAT
                            " elements do not fit a file",
                            sp->name, sp->n);
      t->name = g_strdup (sp->name);
      t->n = sp->n;
      t->first = sp->first;
      t->total = sp->total == 0 ? sp->n : sp->total;
      guint64 end_elem;
      if (sp->total == 0 && sp->first != 0)
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "tensor \"%s\": first %" G_GUINT64_FORMAT
                            " without a total",
                            sp->name, sp->first);
      if (!g_uint64_checked_add (&end_elem, sp->first, sp->n)
          || end_elem > t->total)
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                            "tensor \"%s\": elements [%" G_GUINT64_FORMAT
                            ", +%" G_GUINT64_FORMAT
                            ") pass its total %" G_GUINT64_FORMAT,
                            sp->name, sp->first, sp->n, t->total);
      t->ranged = w->world > 1 || t->first != 0 || t->total != t->n;
      for (guint s = 0; s < sp->n_sections; s++)
        {
          const char *sn = sp->sections[s];
          for (guint k = 0; k < s && sn != NULL; k++)
            if (strcmp (sn, t->sec[k].name) == 0)
              sn = NULL;
          if (sn == NULL)
            return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                                "tensor \"%s\": section %u has no name or "
                                "repeats one",
                                sp->name, s);
          t->sec[s].name = g_strdup (sn);
          t->n_sections = s + 1;
          t->sec[s].offset = align_up (end);
          t->sec[s].bytes = bytes;
          end = t->sec[s].offset + bytes;
          if (end > (guint64)G_MAXINT64 / 2)
            return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                                "tensor \"%s\": the sections pass 2^62 bytes",
                                sp->name);
        }
    }
  w->data_bytes = end;
  return TRUE;
}

/* Whether a number in @o (or in objects and arrays inside it) is NaN or
 * infinite. */
static gboolean
has_nonfinite_node (JsonNode *n)
{
  if (JSON_NODE_HOLDS_VALUE (n)
      && json_node_get_value_type (n) == G_TYPE_DOUBLE)
    return !isfinite (json_node_get_double (n));
  if (JSON_NODE_HOLDS_OBJECT (n))
    {
      g_autoptr (GList) members
          = json_object_get_values (json_node_get_object (n));
      for (GList *i = members; i; i = i->next)
        if (has_nonfinite_node (i->data))
          return TRUE;
    }
  if (JSON_NODE_HOLDS_ARRAY (n))
    {
      JsonArray *a = json_node_get_array (n);
      for (guint i = 0; i < json_array_get_length (a); i++)
        if (has_nonfinite_node (json_array_get_element (a, i)))
          return TRUE;
    }
  return FALSE;
}

static gboolean
has_nonfinite (JsonObject *o)
{
  g_autoptr (JsonNode) n = json_node_init_object (json_node_alloc (), o);
  return has_nonfinite_node (n);
}

char *
stow_optim_state_file_name (guint rank, guint world)
{
  g_return_val_if_fail (rank < world, NULL);
  if (world == 1)
    return g_strdup ("optimizer.stow");
  return g_strdup_printf ("optimizer-rank%05u-of-%05u.stow", rank, world);
}

StowOptimStateWriter *
stow_optim_state_writer_new (const char *path, const StowOptimStateSpec *specs,
                             guint n_specs, JsonObject *state, GError **error)
{
  return stow_optim_state_writer_new_rank (path, 0, 1, specs, n_specs, state,
                                           error);
}

StowOptimStateWriter *
stow_optim_state_writer_new_rank (const char *path, guint rank, guint world,
                                  const StowOptimStateSpec *specs,
                                  guint n_specs, JsonObject *state,
                                  GError **error)
{
  g_return_val_if_fail (path != NULL && state != NULL, NULL);
  g_return_val_if_fail (specs != NULL || n_specs == 0, NULL);
  g_return_val_if_fail (rank < world, NULL);
  g_autoptr (StowOptimStateWriter) w = g_new0 (StowOptimStateWriter, 1);
  w->path = g_strdup (path);
  w->fd = -1;
  w->rank = rank;
  w->world = world;
  /* A deep copy through text: the header is generated twice (pending,
   * then final checksums) and must come out the same length, whatever the
   * caller does to @state in between. */
  g_autoptr (JsonNode) state_node
      = json_node_init_object (json_node_alloc (), state);
  g_autofree char *state_text = stow_json_to_string (state_node, FALSE);
  w->state = stow_json_parse_data (state_text, -1, path, NULL);
  w->xxh = XXH3_createState ();
  XXH3_64bits_reset (w->xxh);
  /* A NaN or an infinity cannot be carried: the writer makes it null, a
   * value the run never wrote; refuse it rather than resume from it. */
  if (w->state == NULL || has_nonfinite (state))
    {
      writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                   "state: not JSON once written (a NaN or an infinity?): %s",
                   state_text);
      return NULL;
    }
  if (!writer_check_specs (w, specs, n_specs, error))
    return NULL;
  gsize len;
  g_autofree char *header = opt_header (w->rank, w->world, w->state, w->tensors,
                                        w->n_tensors, FALSE, &len);
  w->data_start = OPT_PREFIX_BYTES + len;
  w->fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0)
    {
      writer_fail (w, error, STOW_CHECKPOINT_ERROR_IO, "create: %s",
                   g_strerror (errno));
      return NULL;
    }
  w->created = TRUE;
  /* The header goes first, with its checksums pending, so that the data
   * can stream behind it; finish rewrites it in place. */
  guint8 prefix[OPT_PREFIX_BYTES];
  opt_prefix (prefix, header, len);
  int rc = stow_fd_write_all (w->fd, prefix, sizeof prefix);
  if (rc == 0)
    rc = stow_fd_write_all (w->fd, header, len);
  if (rc < 0)
    {
      writer_fail (w, error, STOW_CHECKPOINT_ERROR_IO, "writing the header: %s",
                   g_strerror (-rc));
      return NULL;
    }
  return g_steal_pointer (&w);
}

/* Closes every section whose bytes are all written (empty ones too) and
 * moves to the next. */
static void
writer_settle (StowOptimStateWriter *w)
{
  while (w->t < w->n_tensors && w->done == w->tensors[w->t].sec[w->s].bytes)
    {
      w->tensors[w->t].sec[w->s].xxh3 = XXH3_64bits_digest (w->xxh);
      XXH3_64bits_reset (w->xxh);
      w->done = 0;
      if (++w->s == w->tensors[w->t].n_sections)
        {
          w->s = 0;
          w->t++;
        }
    }
}

/* Zeros from the current position to data offset @to. */
static int
writer_pad (StowOptimStateWriter *w, guint64 to)
{
  static const guint8 zeros[OPT_ALIGN];
  while (w->pos < to)
    {
      guint64 n = MIN (to - w->pos, sizeof zeros);
      int rc = stow_fd_write_all (w->fd, zeros, n);
      if (rc < 0)
        return rc;
      w->pos += n;
    }
  return 0;
}

gboolean
stow_optim_state_writer_write (StowOptimStateWriter *w, const float *data,
                               guint64 n, GError **error)
{
  g_return_val_if_fail (w != NULL && (data != NULL || n == 0), FALSE);
  if (w->failed || w->finished)
    return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                        "the writer already failed or finished");
  /* What is left to declare, counted before anything is written. */
  guint64 left = 0;
  for (guint t = w->t; t < w->n_tensors; t++)
    for (guint s = (t == w->t ? w->s : 0); s < w->tensors[t].n_sections; s++)
      left += w->tensors[t].sec[s].bytes;
  left -= w->done;
  if (n > left / 4)
    return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                        "%" G_GUINT64_FORMAT " floats past the declared "
                        "sections (%" G_GUINT64_FORMAT " left)",
                        n - left / 4, left / 4);
  const guint8 *p = (const guint8 *)data;
  guint64 bytes = n * 4;
  while (bytes > 0)
    {
      writer_settle (w);
      OptSection *sec = &w->tensors[w->t].sec[w->s];
      int rc = w->done == 0 ? writer_pad (w, sec->offset) : 0;
      guint64 take = MIN (bytes, sec->bytes - w->done);
      if (rc == 0)
        rc = stow_fd_write_all (w->fd, p, take);
      if (rc < 0)
        return writer_fail (w, error, STOW_CHECKPOINT_ERROR_IO,
                            "tensor \"%s\": section \"%s\": write: %s",
                            w->tensors[w->t].name, sec->name, g_strerror (-rc));
      XXH3_64bits_update (w->xxh, p, take);
      w->done += take;
      w->pos += take;
      p += take;
      bytes -= take;
    }
  writer_settle (w);
  return TRUE;
}

gboolean
stow_optim_state_writer_finish (StowOptimStateWriter *w, GError **error)
{
  g_return_val_if_fail (w != NULL, FALSE);
  if (w->failed || w->finished)
    return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                        "the writer already failed or finished");
  writer_settle (w);
  if (w->t < w->n_tensors)
    {
      const OptTensor *t = &w->tensors[w->t];
      return writer_fail (w, error, STOW_CHECKPOINT_ERROR_INVALID,
                          "tensor \"%s\": section \"%s\" got %" G_GUINT64_FORMAT
                          " of its %" G_GUINT64_FORMAT " floats",
                          t->name, t->sec[w->s].name, w->done / 4, t->n);
    }
  gsize len;
  g_autofree char *header = opt_header (w->rank, w->world, w->state, w->tensors,
                                        w->n_tensors, TRUE, &len);
  /* Same members, same numbers, checksums of the same width. */
  g_assert (OPT_PREFIX_BYTES + len == w->data_start);
  guint8 prefix[OPT_PREFIX_BYTES];
  opt_prefix (prefix, header, len);
  int rc = writer_pad (w, w->data_bytes);
  if (rc == 0)
    rc = stow_fd_pwrite_all (w->fd, header, len, OPT_PREFIX_BYTES);
  if (rc == 0)
    rc = stow_fd_pwrite_all (w->fd, prefix, sizeof prefix, 0);
  if (rc == 0 && fsync (w->fd) < 0)
    rc = -errno;
  if (rc == 0)
    {
      rc = close (w->fd) < 0 ? -errno : 0;
      w->fd = -1;
    }
  if (rc < 0)
    return writer_fail (w, error, STOW_CHECKPOINT_ERROR_IO,
                        "writing the checksums or fsync: %s", g_strerror (-rc));
  w->finished = TRUE;
  return TRUE;
}

void
stow_optim_state_writer_free (StowOptimStateWriter *w)
{
  if (w == NULL)
    return;
  if (w->fd >= 0)
    close (w->fd);
  /* An unfinished file has no checksums: nobody should find it. */
  if (w->created && !w->finished)
    g_unlink (w->path);
  if (w->xxh != NULL)
    XXH3_freeState (w->xxh);
  g_clear_pointer (&w->state, json_node_unref);
  opt_tensors_free (w->tensors, w->n_tensors);
  g_free (w->path);
  g_free (w);
}

/* ---- reading ------------------------------------------------------------- */

struct _StowOptimState
{
  char *path;
  int fd;
  guint rank, world; /* the header's, or 0 of 1 */
  JsonNode *root;
  JsonObject *state; /* in root */
  OptTensor *tensors;
  guint n_tensors;
  GHashTable *by_name; /* name -> OptTensor * */
  guint64 data_start;
  guint64 data_bytes;
  /* Reads of one section in consecutive pieces from its start are hashed
   * as they come, so that a section streamed through a small buffer is
   * verified too. */
  const OptSection *chain_s;
  guint64 chain_next; /* the byte the next piece must start at */
  XXH3_state_t *xxh;
};

static gboolean
parse_xxh3 (const char *text, XXH64_hash_t *out)
{
  if (strlen (text) != 16)
    return FALSE;
  guint64 v = 0;
  for (guint i = 0; i < 16; i++)
    {
      int d = g_ascii_xdigit_value (text[i]);
      if (d < 0)
        return FALSE;
      v = v << 4 | (guint64)d;
    }
  *out = v;
  return TRUE;
}

/* A core JSON getter's message, in this module's domain. */
static gboolean
rewrap (GError **error, GError *local)
{
  g_set_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_INVALID,
               "%s", local->message);
  g_error_free (local);
  return FALSE;
}

static gboolean
parse_section (StowOptimState *s, OptTensor *t, guint i, JsonNode *node,
               GError **error)
{
  g_autofree char *where = g_strdup_printf ("%s: tensor \"%s\": sections[%u]",
                                            s->path, t->name, i);
  if (!JSON_NODE_HOLDS_OBJECT (node))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "expected an object");
  JsonObject *o = json_node_get_object (node);
  OptSection *sec = &t->sec[i];
  GError *local = NULL;
  const char *name = NULL, *sum = NULL;
  if (!stow_json_get_string (o, where, "name", TRUE, &name, &local))
    return rewrap (error, local);
  for (guint k = 0; k < i; k++)
    if (strcmp (t->sec[k].name, name) == 0)
      return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                   "section \"%s\" appears twice", name);
  sec->name = g_strdup (name);
  t->n_sections = i + 1;
  g_free (where);
  where = g_strdup_printf ("%s: tensor \"%s\": section \"%s\"", s->path,
                           t->name, name);
  if (!stow_json_get_u64 (o, where, "offset", TRUE, &sec->offset, &local)
      || !stow_json_get_u64 (o, where, "bytes", TRUE, &sec->bytes, &local)
      || !stow_json_get_string (o, where, "xxh3", TRUE, &sum, &local))
    return rewrap (error, local);
  if (sec->offset % OPT_ALIGN != 0)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "offset %" G_GUINT64_FORMAT " is not a multiple of %d",
                 sec->offset, OPT_ALIGN);
  if (t->n > G_MAXUINT64 / 4 || sec->bytes != 4 * t->n)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "bytes is %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                 " floats need %" G_GUINT64_FORMAT,
                 sec->bytes, t->n, t->n * 4);
  if (sec->offset > s->data_bytes || sec->bytes > s->data_bytes - sec->offset)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "offset %" G_GUINT64_FORMAT " + bytes %" G_GUINT64_FORMAT
                 " run past the data (%" G_GUINT64_FORMAT
                 " bytes): the file is truncated",
                 sec->offset, sec->bytes, s->data_bytes);
  if (strcmp (sum, OPT_XXH3_PENDING) == 0)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "xxh3 is pending: the writer never finished this file");
  if (!parse_xxh3 (sum, &sec->xxh3))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "xxh3 \"%s\" is not 16 hex digits", sum);
  return TRUE;
}

static gboolean
parse_tensor (StowOptimState *s, guint i, JsonNode *node, GError **error)
{
  g_autofree char *where = g_strdup_printf ("%s: tensors[%u]", s->path, i);
  if (!JSON_NODE_HOLDS_OBJECT (node))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "expected an object");
  JsonObject *o = json_node_get_object (node);
  OptTensor *t = &s->tensors[i];
  GError *local = NULL;
  const char *name = NULL;
  if (!stow_json_get_string (o, where, "name", TRUE, &name, &local))
    return rewrap (error, local);
  if (g_hash_table_contains (s->by_name, name))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "tensor \"%s\" appears twice", name);
  t->name = g_strdup (name);
  g_hash_table_insert (s->by_name, t->name, t);
  g_free (where);
  where = g_strdup_printf ("%s: tensor \"%s\"", s->path, name);
  JsonArray *sections = NULL;
  if (!stow_json_get_u64 (o, where, "n", TRUE, &t->n, &local)
      || !stow_json_get_array (o, where, "sections", TRUE, &sections, &local))
    return rewrap (error, local);
  /* A part of a tensor says where it lies; a whole one needs not. */
  t->ranged = stow_json_has (o, "first") || stow_json_has (o, "total");
  t->first = 0;
  t->total = t->n;
  if (t->ranged
      && (!stow_json_get_u64 (o, where, "first", TRUE, &t->first, &local)
          || !stow_json_get_u64 (o, where, "total", TRUE, &t->total, &local)))
    return rewrap (error, local);
  if (t->first > t->total || t->n > t->total - t->first)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "first %" G_GUINT64_FORMAT " + n %" G_GUINT64_FORMAT
                 " pass total %" G_GUINT64_FORMAT,
                 t->first, t->n, t->total);
  guint n = json_array_get_length (sections);
  if (n == 0 || n > G_N_ELEMENTS (t->sec))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, where,
                 "sections: %u of them, expected 1 to %u", n,
                 (guint)G_N_ELEMENTS (t->sec));
  for (guint k = 0; k < n; k++)
    if (!parse_section (s, t, k, json_array_get_element (sections, k), error))
      return FALSE;
  return TRUE;
}

typedef struct
{
  const OptTensor *t;
  const OptSection *sec;
} SectionRef;

static gint
by_offset (gconstpointer pa, gconstpointer pb)
{
  const SectionRef *a = pa, *b = pb;
  if (a->sec->offset != b->sec->offset)
    return a->sec->offset < b->sec->offset ? -1 : 1;
  return a->sec->bytes < b->sec->bytes ? -1 : a->sec->bytes > b->sec->bytes;
}

/* No byte in two sections, and none after the last. */
static gboolean
check_layout (StowOptimState *s, GError **error)
{
  g_autoptr (GArray) refs = g_array_new (FALSE, FALSE, sizeof (SectionRef));
  for (guint i = 0; i < s->n_tensors; i++)
    for (guint k = 0; k < s->tensors[i].n_sections; k++)
      {
        SectionRef r = { &s->tensors[i], &s->tensors[i].sec[k] };
        g_array_append_val (refs, r);
      }
  g_array_sort (refs, by_offset);
  guint64 end = 0;
  const SectionRef *owner = NULL;
  for (guint i = 0; i < refs->len; i++)
    {
      const SectionRef *r = &g_array_index (refs, SectionRef, i);
      if (r->sec->bytes == 0)
        continue;
      if (owner != NULL && r->sec->offset < end)
        return fail (error, STOW_CHECKPOINT_ERROR_INVALID, s->path,
                     "tensor \"%s\": section \"%s\": offset %" G_GUINT64_FORMAT
                     " overlaps tensor \"%s\" section \"%s\"",
                     r->t->name, r->sec->name, r->sec->offset, owner->t->name,
                     owner->sec->name);
      owner = r;
      end = r->sec->offset + r->sec->bytes;
    }
  for (guint i = 0; i < refs->len; i++)
    {
      const SectionRef *r = &g_array_index (refs, SectionRef, i);
      end = MAX (end, r->sec->offset + r->sec->bytes);
    }
  if (end != s->data_bytes)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, s->path,
                 "%" G_GUINT64_FORMAT " bytes of data after the last section "
                 "(which ends at %" G_GUINT64_FORMAT ")",
                 s->data_bytes - end, end);
  return TRUE;
}

static gboolean
parse_opt_header (StowOptimState *s, const char *text, gsize len,
                  GError **error)
{
  const char *bad = NULL;
  if (!g_utf8_validate (text, (gssize)len, &bad))
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, s->path,
                 "header byte %" G_GSIZE_FORMAT " is not UTF-8 text",
                 (gsize)(bad - text));
  GError *local = NULL;
  g_autofree char *name = g_strdup_printf ("%s: header", s->path);
  if (!stow_json_check_nesting (text, len, OPT_MAX_DEPTH, name, &local))
    return rewrap (error, local);
  s->root = stow_json_parse_data (text, (gssize)len, name, &local);
  if (s->root == NULL)
    return rewrap (error, local);
  JsonObject *top = stow_json_root_object (s->root, name, &local);
  JsonArray *tensors = NULL;
  guint64 rank = 0, world = 1;
  if (top == NULL
      || !stow_json_get_u64 (top, name, "rank", FALSE, &rank, &local)
      || !stow_json_get_u64 (top, name, "world", FALSE, &world, &local)
      || !stow_json_get_object (top, name, "state", TRUE, &s->state, &local)
      || !stow_json_get_array (top, name, "tensors", TRUE, &tensors, &local))
    return rewrap (error, local);
  if (world == 0 || world > G_MAXUINT || rank >= world)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, name,
                 "rank %" G_GUINT64_FORMAT " of world %" G_GUINT64_FORMAT
                 ": expected a rank below a world of 1 to %u",
                 rank, world, G_MAXUINT);
  s->rank = (guint)rank;
  s->world = (guint)world;
  s->n_tensors = json_array_get_length (tensors);
  s->tensors = g_new0 (OptTensor, s->n_tensors);
  for (guint i = 0; i < s->n_tensors; i++)
    if (!parse_tensor (s, i, json_array_get_element (tensors, i), error))
      return FALSE;
  return check_layout (s, error);
}

StowOptimState *
stow_optim_state_open (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_autoptr (StowOptimState) s = g_new0 (StowOptimState, 1);
  s->path = g_strdup (path);
  s->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  s->xxh = XXH3_createState ();
  s->fd = open (path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (s->fd < 0 || fstat (s->fd, &sb) < 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, path, "%s", g_strerror (errno));
      return NULL;
    }
  guint64 size = (guint64)sb.st_size;
  guint8 prefix[OPT_PREFIX_BYTES];
  if (!S_ISREG (sb.st_mode) || size < OPT_PREFIX_BYTES
      || stow_fd_pread_all (s->fd, prefix, sizeof prefix, 0)
             != OPT_PREFIX_BYTES)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, path,
            "%" G_GUINT64_FORMAT " bytes, shorter than the %d-byte prefix "
            "of an optimizer-state file (or not a regular file)",
            size, OPT_PREFIX_BYTES);
      return NULL;
    }
  guint32 version;
  guint64 hlen, sum;
  memcpy (&version, prefix + 8, 4);
  memcpy (&hlen, prefix + 12, 8);
  memcpy (&sum, prefix + 20, 8);
  version = GUINT32_FROM_LE (version);
  hlen = GUINT64_FROM_LE (hlen);
  sum = GUINT64_FROM_LE (sum);
  if (memcmp (prefix, OPT_MAGIC, 8) != 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, path,
            "magic: not an optimizer-state file (no \"STOWOPT\\0\")");
      return NULL;
    }
  if (version != OPT_VERSION)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, path,
            "version is %u, this build reads version %d", version, OPT_VERSION);
      return NULL;
    }
  if (hlen > OPT_MAX_HEADER || hlen > size - OPT_PREFIX_BYTES)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, path,
            "header length %" G_GUINT64_FORMAT
            " is over the limit (%" G_GUINT64_FORMAT
            ") or past the end of the file (%" G_GUINT64_FORMAT " bytes)",
            hlen, OPT_MAX_HEADER, size);
      return NULL;
    }
  g_autofree char *text = g_malloc (hlen + 1);
  gint64 got = stow_fd_pread_all (s->fd, text, hlen, OPT_PREFIX_BYTES);
  if (got < 0 || (guint64)got != hlen)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, path, "reading the header: %s",
            got < 0 ? g_strerror ((int)-got) : "short read");
      return NULL;
    }
  text[hlen] = '\0';
  guint64 actual = XXH3_64bits (text, hlen);
  if (actual != sum)
    {
      fail (error, STOW_CHECKPOINT_ERROR_CHECKSUM, path,
            "header: xxh3 is %016" G_GINT64_MODIFIER
            "x, the prefix says %016" G_GINT64_MODIFIER "x",
            actual, sum);
      return NULL;
    }
  s->data_start = align_up (OPT_PREFIX_BYTES + hlen);
  if (s->data_start > size)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, path,
            "the data would begin at %" G_GUINT64_FORMAT ", past the end of "
            "the file (%" G_GUINT64_FORMAT " bytes)",
            s->data_start, size);
      return NULL;
    }
  s->data_bytes = size - s->data_start;
  if (!parse_opt_header (s, text, hlen, error))
    return NULL;
  return g_steal_pointer (&s);
}

void
stow_optim_state_close (StowOptimState *s)
{
  if (s == NULL)
    return;
  if (s->fd >= 0)
    close (s->fd);
  if (s->xxh != NULL)
    XXH3_freeState (s->xxh);
  g_clear_pointer (&s->by_name, g_hash_table_unref);
  opt_tensors_free (s->tensors, s->n_tensors);
  g_clear_pointer (&s->root, json_node_unref);
  g_free (s->path);
  g_free (s);
}

JsonObject *
stow_optim_state_get_state (const StowOptimState *s)
{
  g_return_val_if_fail (s != NULL, NULL);
  return s->state;
}

guint
stow_optim_state_n_tensors (const StowOptimState *s)
{
  g_return_val_if_fail (s != NULL, 0);
  return s->n_tensors;
}

guint64
stow_optim_state_tensor_n (const StowOptimState *s, const char *name)
{
  g_return_val_if_fail (s != NULL && name != NULL, 0);
  const OptTensor *t = g_hash_table_lookup (s->by_name, name);
  return t ? t->n : 0;
}

guint
stow_optim_state_rank (const StowOptimState *s)
{
  g_return_val_if_fail (s != NULL, 0);
  return s->rank;
}

guint
stow_optim_state_world (const StowOptimState *s)
{
  g_return_val_if_fail (s != NULL, 1);
  return s->world;
}

gboolean
stow_optim_state_tensor_range (const StowOptimState *s, const char *name,
                               guint64 *first, guint64 *total)
{
  g_return_val_if_fail (s != NULL && name != NULL, FALSE);
  const OptTensor *t = g_hash_table_lookup (s->by_name, name);
  if (t == NULL)
    return FALSE;
  if (first != NULL)
    *first = t->first;
  if (total != NULL)
    *total = t->total;
  return TRUE;
}

static OptSection *
find_section (const OptTensor *t, const char *section)
{
  for (guint k = 0; t != NULL && k < t->n_sections; k++)
    if (strcmp (t->sec[k].name, section) == 0)
      return (OptSection *)&t->sec[k];
  return NULL;
}

/* @bytes of section @sec of @t from its byte @at into @dst. */
static gboolean
read_bytes (StowOptimState *s, const OptTensor *t, const OptSection *sec,
            guint64 at, guint64 bytes, void *dst, GError **error)
{
  guint64 where = s->data_start + sec->offset + at;
  gint64 got = stow_fd_pread_all (s->fd, dst, bytes, where);
  if (got < 0 || (guint64)got != bytes)
    return fail (error, STOW_CHECKPOINT_ERROR_IO, s->path,
                 "tensor \"%s\": section \"%s\": reading at file offset "
                 "%" G_GUINT64_FORMAT ": %s",
                 t->name, sec->name, where,
                 got < 0 ? g_strerror ((int)-got) : "short read");
  return TRUE;
}

static gboolean
checksum_fail (StowOptimState *s, const OptTensor *t, const OptSection *sec,
               XXH64_hash_t actual, GError **error)
{
  return fail (error, STOW_CHECKPOINT_ERROR_CHECKSUM, s->path,
               "tensor \"%s\": section \"%s\" (file offset %" G_GUINT64_FORMAT
               ", %" G_GUINT64_FORMAT " bytes): xxh3 is %016" G_GINT64_MODIFIER
               "x, the header says %016" G_GINT64_MODIFIER "x",
               t->name, sec->name, s->data_start + sec->offset, sec->bytes,
               (guint64)actual, (guint64)sec->xxh3);
}

gboolean
stow_optim_state_has_section (const StowOptimState *s, const char *name,
                              const char *section)
{
  g_return_val_if_fail (s != NULL && name != NULL && section != NULL, FALSE);
  return find_section (g_hash_table_lookup (s->by_name, name), section) != NULL;
}

gboolean
stow_optim_state_read (StowOptimState *s, const char *name, const char *section,
                       guint64 first, guint64 n, float *dst, GError **error)
{
  g_return_val_if_fail (s != NULL && name != NULL && section != NULL, FALSE);
  g_return_val_if_fail (dst != NULL || n == 0, FALSE);
  const OptTensor *t = g_hash_table_lookup (s->by_name, name);
  const OptSection *sec = find_section (t, section);
  if (sec == NULL)
    return fail (error, STOW_CHECKPOINT_ERROR_MISMATCH, s->path,
                 "no tensor \"%s\" with a section \"%s\"", name, section);
  if (first > t->n || n > t->n - first)
    return fail (error, STOW_CHECKPOINT_ERROR_MISMATCH, s->path,
                 "tensor \"%s\": section \"%s\": floats [%" G_GUINT64_FORMAT
                 ", +%" G_GUINT64_FORMAT ") past its %" G_GUINT64_FORMAT,
                 name, section, first, n, t->n);
  if (!read_bytes (s, t, sec, first * 4, n * 4, dst, error))
    return FALSE;
  /* Extend the chain of pieces, or start one at the section's start. */
  if (first == 0)
    {
      s->chain_s = sec;
      s->chain_next = 0;
      XXH3_64bits_reset (s->xxh);
    }
  if (s->chain_s != sec || s->chain_next != first * 4)
    {
      s->chain_s = NULL;
      return TRUE;
    }
  XXH3_64bits_update (s->xxh, dst, n * 4);
  s->chain_next += n * 4;
  if (s->chain_next < sec->bytes)
    return TRUE;
  s->chain_s = NULL;
  XXH64_hash_t actual = XXH3_64bits_digest (s->xxh);
  if (actual != sec->xxh3)
    return checksum_fail (s, t, sec, actual, error);
  return TRUE;
}

/* ---- a checkpoint's files together --------------------------------------- */

/* Verifying a section read in part passes the rest through this much. */
#define SET_VERIFY_PIECE ((guint64)1 << 20)

struct _StowOptimStateSet
{
  char *dir;
  guint world;
  StowOptimState **files; /* [world], by rank */
  char **names;           /* [world + 1], the files' base names */
};

void
stow_optim_state_set_close (StowOptimStateSet *set)
{
  if (set == NULL)
    return;
  for (guint r = 0; set->files != NULL && r < set->world; r++)
    stow_optim_state_close (set->files[r]);
  g_free (set->files);
  g_strfreev (set->names);
  g_free (set->dir);
  g_free (set);
}

typedef struct
{
  guint rank, world;
  char *name;
} RankFile;

static void
rank_file_clear (gpointer p)
{
  g_free (((RankFile *)p)->name);
}

static gint
by_rank (gconstpointer pa, gconstpointer pb)
{
  const RankFile *a = pa, *b = pb;
  return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* The rank files in @dir, sorted by rank, all of one world (or an error);
 * *@single when optimizer.stow is there too. */
static GArray *
list_rank_files (const char *dir, gboolean *single, GError **error)
{
  g_autoptr (GError) local = NULL;
  g_autoptr (GDir) d = g_dir_open (dir, 0, &local);
  if (d == NULL)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, dir, "%s", local->message);
      return NULL;
    }
  g_autoptr (GArray) files = g_array_new (FALSE, FALSE, sizeof (RankFile));
  g_array_set_clear_func (files, rank_file_clear);
  *single = FALSE;
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      if (strcmp (name, "optimizer.stow") == 0)
        *single = TRUE;
      if (!g_str_has_prefix (name, "optimizer-rank"))
        continue;
      /* Only the names this build writes: a file renamed by hand or of
       * another scheme is refused, not skipped, since skipping it could
       * only surface later as a gap. */
      RankFile f = { 0 };
      int end = 0;
      g_autofree char *want = NULL;
      if (sscanf (name, "optimizer-rank%u-of-%u.stow%n", &f.rank, &f.world,
                  &end)
              == 2
          && name[end] == '\0' && f.rank < f.world && f.world > 1)
        want = stow_optim_state_file_name (f.rank, f.world);
      if (want == NULL || strcmp (want, name) != 0)
        {
          fail (error, STOW_CHECKPOINT_ERROR_INVALID, dir,
                "%s: not the name of a rank's optimizer file "
                "(optimizer-rankRRRRR-of-NNNNN.stow, rank below N, N above 1)",
                name);
          return NULL;
        }
      if (files->len > 0 && g_array_index (files, RankFile, 0).world != f.world)
        {
          fail (error, STOW_CHECKPOINT_ERROR_INVALID, dir,
                "%s and %s: the files of runs of %u and of %u ranks "
                "(mixed N)",
                g_array_index (files, RankFile, 0).name, name,
                g_array_index (files, RankFile, 0).world, f.world);
          return NULL;
        }
      f.name = g_strdup (name);
      g_array_append_val (files, f);
    }
  g_array_sort (files, by_rank);
  return g_steal_pointer (&files);
}

/* Tensor @t0 of rank 0 against the same tensor of rank @r. */
static gboolean
set_check_tensor (StowOptimStateSet *set, guint r, const OptTensor *t0,
                  GError **error)
{
  const OptTensor *t = g_hash_table_lookup (set->files[r]->by_name, t0->name);
  if (t == NULL)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                 "%s has no tensor \"%s\" (%s has)", set->names[r], t0->name,
                 set->names[0]);
  if (t->total != t0->total)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                 "tensor \"%s\": %s says %" G_GUINT64_FORMAT
                 " elements in all, %s %" G_GUINT64_FORMAT,
                 t0->name, set->names[r], t->total, set->names[0], t0->total);
  for (guint k = 0; k < t0->n_sections; k++)
    if (t->n_sections != t0->n_sections
        || find_section (t, t0->sec[k].name) == NULL)
      return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                   "tensor \"%s\": %s has %u sections, without \"%s\"; "
                   "%s has %u",
                   t0->name, set->names[r], t->n_sections, t0->sec[k].name,
                   set->names[0], t0->n_sections);
  return TRUE;
}

typedef struct
{
  guint64 first, n;
  guint rank;
} Part;

static gint
by_first (gconstpointer pa, gconstpointer pb)
{
  const Part *a = pa, *b = pb;
  if (a->first != b->first)
    return a->first < b->first ? -1 : 1;
  return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* The ranks' parts of @t0's tensor cover [0, total) once: no element in
 * no file, none in two. */
static gboolean
set_check_coverage (StowOptimStateSet *set, const OptTensor *t0, Part *parts,
                    GError **error)
{
  for (guint r = 0; r < set->world; r++)
    {
      const OptTensor *t
          = g_hash_table_lookup (set->files[r]->by_name, t0->name);
      parts[r] = (Part){ .first = t->first, .n = t->n, .rank = r };
    }
  qsort (parts, set->world, sizeof *parts, by_first);
  guint64 pos = 0;
  const Part *prev = NULL; /* the last non-empty part before pos */
  for (guint i = 0; i < set->world; i++)
    {
      const Part *p = &parts[i];
      if (p->n == 0)
        continue;
      if (p->first > pos)
        return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                     "tensor \"%s\": elements [%" G_GUINT64_FORMAT
                     ", %" G_GUINT64_FORMAT ") of %" G_GUINT64_FORMAT
                     " are in no file (a gap %s%s%s %s)",
                     t0->name, pos, p->first, t0->total, prev ? "between " : "",
                     prev ? set->names[prev->rank] : "",
                     prev ? " and" : "before", set->names[p->rank]);
      if (p->first < pos)
        return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                     "tensor \"%s\": elements [%" G_GUINT64_FORMAT
                     ", %" G_GUINT64_FORMAT ") are in both %s and %s "
                     "(an overlap)",
                     t0->name, p->first, MIN (pos, p->first + p->n),
                     set->names[prev->rank], set->names[p->rank]);
      pos = p->first + p->n;
      prev = p;
    }
  if (pos != t0->total)
    return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                 "tensor \"%s\": elements [%" G_GUINT64_FORMAT
                 ", %" G_GUINT64_FORMAT ") of %" G_GUINT64_FORMAT
                 " are in no file (a gap after %s)",
                 t0->name, pos, t0->total, t0->total,
                 prev ? set->names[prev->rank] : "the start");
  return TRUE;
}

/* Every file's header against rank 0's, then the coverage. */
static gboolean
set_check (StowOptimStateSet *set, GError **error)
{
  const StowOptimState *s0 = set->files[0];
  for (guint r = 0; r < set->world; r++)
    {
      const StowOptimState *s = set->files[r];
      if (s->rank != r || s->world != set->world)
        return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                     "%s: the header says rank %u of %u", set->names[r],
                     s->rank, s->world);
      if (s->n_tensors != s0->n_tensors)
        return fail (error, STOW_CHECKPOINT_ERROR_INVALID, set->dir,
                     "%s has %u tensors, %s %u", set->names[r], s->n_tensors,
                     set->names[0], s0->n_tensors);
    }
  /* Same count and unique names: a tensor of rank 0 in every file is
   * every tensor of every file. */
  g_autofree Part *parts = g_new (Part, set->world);
  for (guint i = 0; i < s0->n_tensors; i++)
    {
      for (guint r = 1; r < set->world; r++)
        if (!set_check_tensor (set, r, &s0->tensors[i], error))
          return FALSE;
      if (!set_check_coverage (set, &s0->tensors[i], parts, error))
        return FALSE;
    }
  return TRUE;
}

StowOptimStateSet *
stow_optim_state_set_open (const char *dir, GError **error)
{
  g_return_val_if_fail (dir != NULL, NULL);
  gboolean single = FALSE;
  g_autoptr (GArray) ranks = list_rank_files (dir, &single, error);
  if (ranks == NULL)
    return NULL;
  if (single && ranks->len > 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_INVALID, dir,
            "both optimizer.stow (one rank's) and %s: which run wrote this "
            "checkpoint?",
            g_array_index (ranks, RankFile, 0).name);
      return NULL;
    }
  if (!single && ranks->len == 0)
    {
      fail (error, STOW_CHECKPOINT_ERROR_IO, dir,
            "neither optimizer.stow nor optimizer-rank*-of-*.stow");
      return NULL;
    }
  g_autoptr (StowOptimStateSet) set = g_new0 (StowOptimStateSet, 1);
  set->dir = g_strdup (dir);
  set->world = single ? 1 : g_array_index (ranks, RankFile, 0).world;
  /* Distinct ranks below N, sorted: the first rank not at its index is
   * missing, or rank len when all below it are there. */
  for (guint i = 0; i < set->world && !single; i++)
    if (i == ranks->len || g_array_index (ranks, RankFile, i).rank != i)
      {
        g_autofree char *name = stow_optim_state_file_name (i, set->world);
        fail (error, STOW_CHECKPOINT_ERROR_INVALID, dir,
              "%s missing (%u of the %u ranks' files are here)", name,
              ranks->len, set->world);
        return NULL;
      }
  set->files = g_new0 (StowOptimState *, set->world);
  set->names = g_new0 (char *, set->world + 1);
  for (guint r = 0; r < set->world; r++)
    {
      set->names[r] = stow_optim_state_file_name (r, set->world);
      g_autofree char *path = g_build_filename (dir, set->names[r], NULL);
      set->files[r] = stow_optim_state_open (path, error);
      if (set->files[r] == NULL)
        return NULL;
    }
  if (!set_check (set, error))
    return NULL;
  return g_steal_pointer (&set);
}

guint
stow_optim_state_set_world (const StowOptimStateSet *set)
{
  g_return_val_if_fail (set != NULL, 0);
  return set->world;
}

JsonObject *
stow_optim_state_set_get_state (const StowOptimStateSet *set)
{
  g_return_val_if_fail (set != NULL, NULL);
  return set->files[0]->state;
}

guint
stow_optim_state_set_n_tensors (const StowOptimStateSet *set)
{
  g_return_val_if_fail (set != NULL, 0);
  return set->files[0]->n_tensors;
}

const char *
stow_optim_state_set_tensor_name (const StowOptimStateSet *set, guint i)
{
  g_return_val_if_fail (set != NULL && i < set->files[0]->n_tensors, NULL);
  return set->files[0]->tensors[i].name;
}

guint64
stow_optim_state_set_tensor_total (const StowOptimStateSet *set,
                                   const char *name)
{
  g_return_val_if_fail (set != NULL && name != NULL, 0);
  const OptTensor *t = g_hash_table_lookup (set->files[0]->by_name, name);
  return t ? t->total : 0;
}

gboolean
stow_optim_state_set_has_section (const StowOptimStateSet *set,
                                  const char *name, const char *section)
{
  g_return_val_if_fail (set != NULL, FALSE);
  return stow_optim_state_has_section (set->files[0], name, section);
}

/* Floats [@lo, @lo + @n) of section @sec into @dst, hashing the whole
 * section on the way: the part asked for lands in @dst, the rest passes
 * through a bounded buffer. */
static gboolean
read_verifying (StowOptimState *s, const OptTensor *t, OptSection *sec,
                guint64 lo, guint64 n, float *dst, GError **error)
{
  guint64 a = lo * 4, b = (lo + n) * 4;
  g_autofree guint8 *buf = g_malloc (MIN (SET_VERIFY_PIECE, sec->bytes) + 1);
  XXH3_state_t *xxh = XXH3_createState ();
  XXH3_64bits_reset (xxh);
  gboolean ok = TRUE;
  for (guint64 pos = 0; ok && pos < sec->bytes;)
    {
      void *to = pos == a ? (void *)dst : buf;
      guint64 take
          = pos == a ? b - a
                     : MIN (SET_VERIFY_PIECE, (pos < a ? a : sec->bytes) - pos);
      ok = read_bytes (s, t, sec, pos, take, to, error);
      XXH3_64bits_update (xxh, to, take);
      pos += take;
    }
  XXH64_hash_t actual = XXH3_64bits_digest (xxh);
  XXH3_freeState (xxh);
  if (!ok)
    return FALSE;
  if (actual != sec->xxh3)
    return checksum_fail (s, t, sec, actual, error);
  sec->verified = TRUE;
  return TRUE;
}

gboolean
stow_optim_state_set_read (StowOptimStateSet *set, const char *name,
                           const char *section, guint64 first, guint64 n,
                           float *dst, GError **error)
{
  g_return_val_if_fail (set != NULL && name != NULL && section != NULL, FALSE);
  g_return_val_if_fail (dst != NULL || n == 0, FALSE);
  const OptTensor *t0 = g_hash_table_lookup (set->files[0]->by_name, name);
  if (find_section (t0, section) == NULL)
    return fail (error, STOW_CHECKPOINT_ERROR_MISMATCH, set->dir,
                 "no tensor \"%s\" with a section \"%s\"", name, section);
  if (first > t0->total || n > t0->total - first)
    return fail (error, STOW_CHECKPOINT_ERROR_MISMATCH, set->dir,
                 "tensor \"%s\": section \"%s\": elements [%" G_GUINT64_FORMAT
                 ", +%" G_GUINT64_FORMAT ") past its %" G_GUINT64_FORMAT,
                 name, section, first, n, t0->total);
  /* The coverage check made the files' parts tile the tensor: each
   * element of the range comes from exactly one of them. */
  for (guint r = 0; r < set->world; r++)
    {
      StowOptimState *s = set->files[r];
      const OptTensor *t = g_hash_table_lookup (s->by_name, name);
      guint64 lo = MAX (first, t->first);
      guint64 hi = MIN (first + n, t->first + t->n);
      if (lo >= hi)
        continue;
      OptSection *sec = find_section (t, section);
      float *to = dst + (lo - first);
      gboolean whole = lo == t->first && hi == t->first + t->n;
      if (sec->verified || whole)
        {
          /* A whole read is hashed by stow_optim_state_read itself. */
          if (!stow_optim_state_read (s, name, section, lo - t->first, hi - lo,
                                      to, error))
            return FALSE;
          sec->verified = TRUE;
        }
      else if (!read_verifying (s, t, sec, lo - t->first, hi - lo, to, error))
        return FALSE;
    }
  return TRUE;
}
