/* SPDX-License-Identifier: MIT
 *
 * models/hub.c: a model's config.json by its Hub id.  Looks in the local
 * Hugging Face cache (the models--ORG--NAME/{refs,snapshots} layout that
 * huggingface_hub writes), then in stowage's own cache, then fetches
 * {HF_ENDPOINT}/ORG/NAME/resolve/REV/FILE through libcurl.  Fetches only
 * configs, safetensors indices and safetensors headers (by HTTP Range),
 * never weights (hub-download.c does).  The environment and the HTTP
 * errors are hub-http.c's.
 */
#include "models/hub.h"
#include "models/hub-private.h"

#include "config.h"

#include <curl/curl.h>
#include <errno.h>
#include <glib/gstdio.h>
#include <stdarg.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "models/model-private.h"

/* ---- names ----------------------------------------------------------------
 */

static gboolean
id_char (char c)
{
  return g_ascii_isalnum (c) || c == '-' || c == '_' || c == '.';
}

static gboolean
id_part_ok (const char *s, gsize len)
{
  if (len == 0)
    return FALSE;
  if (s[0] == '-' || s[0] == '.' || s[len - 1] == '-' || s[len - 1] == '.')
    return FALSE;
  for (gsize i = 0; i < len; i++)
    {
      if (!id_char (s[i]))
        return FALSE;
      if (i > 0 && (s[i] == '-' || s[i] == '.') && s[i - 1] == s[i])
        return FALSE;
    }
  return TRUE;
}

gboolean
stow_hub_is_repo_id (const char *s)
{
  g_return_val_if_fail (s != NULL, FALSE);
  gsize len = strlen (s);
  const char *slash = strchr (s, '/');
  if (len > 96 || slash == NULL || strchr (slash + 1, '/') != NULL)
    return FALSE;
  return id_part_ok (s, (gsize)(slash - s))
         && id_part_ok (slash + 1, len - (gsize)(slash - s) - 1);
}

gboolean
stow_hub_is_revision (const char *rev)
{
  g_return_val_if_fail (rev != NULL, FALSE);
  gsize len = strlen (rev);
  if (len == 0 || len > 255 || rev[0] == '/' || rev[0] == '-'
      || strstr (rev, "..") != NULL || strstr (rev, "//") != NULL)
    return FALSE;
  for (gsize i = 0; i < len; i++)
    if (!id_char (rev[i]) && rev[i] != '/')
      return FALSE;
  return TRUE;
}

/* ---- HTTP -----------------------------------------------------------------
 */

typedef struct
{
  GByteArray *body;
  gsize max_bytes;
  gboolean too_large;
  char *error_code; /* X-Error-Code: GatedRepo, RepoNotFound, ... */
  char *commit;     /* X-Repo-Commit */
} Response;

static void
response_clear (Response *r)
{
  if (r->body)
    g_byte_array_unref (r->body);
  g_free (r->error_code);
  g_free (r->commit);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Response, response_clear)

static size_t
on_body (char *data, size_t size, size_t n, void *user)
{
  Response *r = user;
  gsize len = size * n;
  if (r->body->len + len > r->max_bytes)
    {
      r->too_large = TRUE;
      return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
    }
  g_byte_array_append (r->body, (const guint8 *)data, (guint)len);
  return len;
}

static size_t
on_header (char *data, size_t size, size_t n, void *user)
{
  Response *r = user;
  gsize len = size * n;
  char *v;
  /* A new status line (after a redirect) starts a new set of headers. */
  if (len > 5 && strncmp (data, "HTTP/", 5) == 0)
    {
      g_clear_pointer (&r->error_code, g_free);
      return len;
    }
  if ((v = stow_hub_header_value (data, len, "X-Error-Code")) != NULL)
    {
      g_free (r->error_code);
      r->error_code = v;
    }
  else if ((v = stow_hub_header_value (data, len, "X-Repo-Commit")) != NULL)
    {
      g_free (r->commit);
      r->commit = v;
    }
  return len;
}

/* GETs @file of the repository (@range: "0-7" or NULL).  Returns the HTTP
 * status (0 when no answer came), or FALSE with @error on a transport
 * failure (timeout, no connection) that a caller reports as is. */
static gboolean
hub_get (const StowHubEnv *h, const char *file, const char *range,
         gsize max_bytes, Response *r, long *status, GError **error)
{
  g_autofree char *url = stow_hub_file_url (h, h->rev, file);
  char errbuf[CURL_ERROR_SIZE];
  struct curl_slist *headers = NULL;
  CURLcode rc;

  r->body = g_byte_array_new ();
  r->max_bytes = max_bytes;
  *status = 0;
  CURL *c = stow_hub_curl_new (h, url, TRUE, &headers, errbuf);
  if (c == NULL)
    return E (NETWORK, "%s: libcurl could not start a transfer", h->repo);
  /* The Hub redirects renamed repositories and LFS files (to a CDN, with
   * a signed URL); libcurl keeps custom headers such as Authorization to
   * the first host only. */
  curl_easy_setopt (c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt (c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt (c, CURLOPT_TIMEOUT_MS, (long)(h->timeout_s * 1000));
  curl_easy_setopt (c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt (c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt (c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt (c, CURLOPT_HEADERDATA, r);
  if (range)
    curl_easy_setopt (c, CURLOPT_RANGE, range);
  rc = curl_easy_perform (c);
  curl_easy_getinfo (c, CURLINFO_RESPONSE_CODE, status);
  curl_easy_cleanup (c);
  curl_slist_free_all (headers);

  if (rc == CURLE_OK)
    return TRUE;
  if (rc == CURLE_WRITE_ERROR && r->too_large)
    return E (NETWORK, "%s: %s is larger than %" G_GSIZE_FORMAT " bytes",
              h->repo, file, max_bytes);
  return stow_hub_transport_error (h, rc, errbuf, url, error);
}

/* ---- checking the count against the checkpoint -------------------------- */

/* Element @i of @a as an integer; FALSE when it is not one (json-glib's
 * own getter warns on arrays and objects). */
static gboolean
int_element (JsonArray *a, guint i, gint64 *out)
{
  JsonNode *n = json_array_get_element (a, i);
  if (n == NULL || !JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_INT64)
    return FALSE;
  *out = json_node_get_int (n);
  return TRUE;
}

/* model.safetensors.index.json: metadata.total_size (bytes) against the
 * count at the config's dtype. */
static void
check_index (StowModel *m, JsonNode *root, const char *what)
{
  JsonObject *o, *meta = NULL;
  gint64 total = 0;
  if (!JSON_NODE_HOLDS_OBJECT (root))
    return;
  o = json_node_get_object (root);
  if (!json_object_has_member (o, "metadata")
      || !JSON_NODE_HOLDS_OBJECT (json_object_get_member (o, "metadata")))
    return;
  meta = json_object_get_object_member (o, "metadata");
  if (!json_object_has_member (meta, "total_size"))
    return;
  JsonNode *n = json_object_get_member (meta, "total_size");
  if (JSON_NODE_HOLDS_VALUE (n) && json_node_get_value_type (n) == G_TYPE_INT64)
    total = json_node_get_int (n);
  if (total <= 0)
    return;
  m->checkpoint_bytes = (guint64)total;
  m->checkpoint_bytes_measured = TRUE;
  guint db = stow_dtype_bytes (m->torch_dtype);
  if (db == 0 || m->quant.method != STOW_QUANT_NONE)
    return;
  guint64 expect = m->params * db;
  if ((guint64)total == expect)
    return;
  g_warning ("%s: %s's total_size is %" G_GINT64_FORMAT
             " bytes, %" G_GUINT64_FORMAT "%s parameters at %s, but "
             "config.json counts %" G_GUINT64_FORMAT " (%" G_GUINT64_FORMAT
             " bytes): the count may miss a tensor of this architecture",
             m->name, what, total, (guint64)total / db,
             (guint64)total % db ? " and a part" : "", m->torch_dtype,
             m->params, expect);
}

/* A safetensors header: every tensor's shape, summed, against the count. */
static void
check_header (StowModel *m, JsonNode *root, const char *what)
{
  JsonObject *o;
  guint64 params = 0, bytes = 0;
  const char *extra = NULL;
  if (!JSON_NODE_HOLDS_OBJECT (root))
    return;
  o = json_node_get_object (root);
  g_autoptr (GList) names = json_object_get_members (o);
  g_autoptr (GHashTable) known = g_hash_table_new (g_str_hash, g_str_equal);
  for (guint i = 0; i < m->tensors->len; i++)
    {
      const StowTensor *t = g_ptr_array_index (m->tensors, i);
      if (!t->tied)
        g_hash_table_add (known, t->name);
    }
  for (GList *l = names; l; l = l->next)
    {
      const char *name = l->data;
      if (g_str_equal (name, "__metadata__"))
        continue;
      JsonNode *tn = json_object_get_member (o, name);
      if (!JSON_NODE_HOLDS_OBJECT (tn))
        return;
      JsonObject *t = json_node_get_object (tn);
      if (!json_object_has_member (t, "shape")
          || !JSON_NODE_HOLDS_ARRAY (json_object_get_member (t, "shape")))
        return;
      JsonArray *shape = json_object_get_array_member (t, "shape");
      guint64 numel = 1;
      for (guint d = 0; d < json_array_get_length (shape); d++)
        {
          gint64 v = 0;
          if (!int_element (shape, d, &v) || v < 0
              || !g_uint64_checked_mul (&numel, numel, (guint64)v))
            return;
        }
      if (json_object_has_member (t, "data_offsets")
          && JSON_NODE_HOLDS_ARRAY (json_object_get_member (t, "data_offsets")))
        {
          JsonArray *off = json_object_get_array_member (t, "data_offsets");
          gint64 end = 0;
          if (json_array_get_length (off) == 2 && int_element (off, 1, &end)
              && end > 0 && (guint64)end > bytes)
            bytes = (guint64)end;
        }
      if (!g_uint64_checked_add (&params, params, numel))
        return;
      if (!g_hash_table_remove (known, name) && extra == NULL)
        extra = name;
    }
  m->checkpoint_bytes = bytes;
  m->checkpoint_bytes_measured = bytes > 0;
  if (m->quant.method != STOW_QUANT_NONE || params == m->params)
    return;
  GHashTableIter it;
  gpointer missing = NULL;
  g_hash_table_iter_init (&it, known);
  g_hash_table_iter_next (&it, &missing, NULL);
  g_warning (
      "%s: %s holds %" G_GUINT64_FORMAT
      " parameters but config.json counts %" G_GUINT64_FORMAT "%s%s%s%s%s",
      m->name, what, params, m->params, extra ? "; the checkpoint has " : "",
      extra ? extra : "", missing ? "; the count has " : "",
      missing ? (const char *)missing : "",
      missing ? ", which the checkpoint lacks" : "");
}

/* The safetensors header's JSON from the first bytes of a file. */
static gboolean
header_length (const guint8 *p, gsize len, guint64 *n)
{
  if (len < 8)
    return FALSE;
  *n = 0;
  for (int i = 7; i >= 0; i--)
    *n = (*n << 8) | p[i];
  return *n >= 2 && *n <= STOW_HUB_MAX_FILE_BYTES;
}

static void
check_local_snapshot (StowModel *m, const char *dir)
{
  g_autofree char *index
      = g_build_filename (dir, "model.safetensors.index.json", NULL);
  g_autofree char *st = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *hdr
      = g_build_filename (dir, "model.safetensors.header.json", NULL);
  if (g_file_test (index, G_FILE_TEST_IS_REGULAR))
    {
      g_autoptr (JsonNode) root
          = stow_json_parse_file (index, STOW_HUB_MAX_FILE_BYTES, NULL);
      if (root)
        check_index (m, root, "model.safetensors.index.json");
    }
  else if (g_file_test (hdr, G_FILE_TEST_IS_REGULAR))
    {
      g_autoptr (JsonNode) root
          = stow_json_parse_file (hdr, STOW_HUB_MAX_FILE_BYTES, NULL);
      if (root)
        check_header (m, root, "model.safetensors");
    }
  else if (g_file_test (st, G_FILE_TEST_IS_REGULAR))
    {
      FILE *f = fopen (st, "rb");
      guint8 head[8];
      guint64 n;
      if (f == NULL)
        return;
      if (fread (head, 1, 8, f) == 8 && header_length (head, 8, &n))
        {
          g_autofree char *text = g_malloc ((gsize)n);
          if (fread (text, 1, (gsize)n, f) == n)
            {
              g_autoptr (JsonNode) root = stow_json_parse_data (
                  text, (gssize)n, "model.safetensors", NULL);
              if (root)
                check_header (m, root, "model.safetensors");
            }
        }
      fclose (f);
    }
}

static void
cache_write (const char *dir, const char *file, const guint8 *data, gsize len)
{
  g_autofree char *path = g_build_filename (dir, file, NULL);
  g_autoptr (GError) e = NULL;
  if (g_mkdir_with_parents (dir, 0755) != 0)
    {
      g_info ("cannot create the cache folder %s: %s", dir, g_strerror (errno));
      return;
    }
  if (!stow_file_write_atomic (path, (const char *)data, (gssize)len, &e))
    g_info ("cannot cache %s: %s", file, e->message);
}

/* Fetches the index, or else the single file's header, caches it beside
 * the config and checks the count.  Failures only mean no check. */
static void
check_remote (StowModel *m, const StowHubEnv *h)
{
  g_auto (Response) r = { 0 };
  long status = 0;
  if (!hub_get (h, "model.safetensors.index.json", NULL,
                STOW_HUB_MAX_FILE_BYTES, &r, &status, NULL))
    return;
  if (status == 200)
    {
      g_autoptr (JsonNode) root = stow_json_parse_data (
          (const char *)r.body->data, (gssize)r.body->len,
          "model.safetensors.index.json", NULL);
      if (root)
        {
          cache_write (h->stow_cache, "model.safetensors.index.json",
                       r.body->data, r.body->len);
          check_index (m, root, "model.safetensors.index.json");
        }
      return;
    }
  if (status != 404)
    return;

  /* One file: its first 8 bytes say how long the JSON header after them
   * is (the safetensors format). */
  g_auto (Response) a = { 0 };
  guint64 n;
  if (!hub_get (h, "model.safetensors", "0-7", 8, &a, &status, NULL)
      || status != 206 || !header_length (a.body->data, a.body->len, &n))
    return;
  g_auto (Response) b = { 0 };
  g_autofree char *range = g_strdup_printf ("8-%" G_GUINT64_FORMAT, 8 + n - 1);
  if (!hub_get (h, "model.safetensors", range, (gsize)n, &b, &status, NULL)
      || status != 206 || b.body->len != n)
    return;
  g_autoptr (JsonNode) root
      = stow_json_parse_data ((const char *)b.body->data, (gssize)b.body->len,
                              "model.safetensors", NULL);
  if (root)
    {
      cache_write (h->stow_cache, "model.safetensors.header.json", b.body->data,
                   b.body->len);
      check_header (m, root, "model.safetensors");
    }
}

/* ---- loading ----------------------------------------------------------------
 */

static void
set_hub_fields (StowModel *m, const StowHubEnv *h)
{
  g_free (m->name);
  m->name = g_strdup (h->repo);
  g_free (m->hub_id);
  m->hub_id = g_strdup (h->repo);
  g_free (m->revision);
  m->revision = g_strdup (h->rev);
}

/* Reads a cached config.json; a model error names the file. */
static StowModel *
load_cached (const StowHubEnv *h, const char *dir, GError **error)
{
  g_autofree char *cfg = g_build_filename (dir, "config.json", NULL);
  StowModel *m = stow_model_new_from_file (cfg, error);
  if (m == NULL)
    return NULL;
  set_hub_fields (m, h);
  check_local_snapshot (m, dir);
  return m;
}

StowModel *
stow_hub_load_model (const char *repo_id, const char *revision, GError **error)
{
  g_auto (StowHubEnv) h = { 0 };

  g_return_val_if_fail (repo_id != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!stow_hub_env_init (&h, repo_id, revision, error))
    return NULL;

  /* 1. The Hugging Face cache: what the user has downloaded works
   * offline. */
  g_autofree char *snap = stow_hub_hf_snapshot (&h);
  if (snap != NULL)
    {
      g_autofree char *cfg = g_build_filename (snap, "config.json", NULL);
      if (g_file_test (cfg, G_FILE_TEST_EXISTS))
        {
          g_debug ("%s: from the Hugging Face cache, %s", repo_id, cfg);
          return load_cached (&h, snap, error);
        }
    }

  /* 2. stowage's own cache of earlier fetches. */
  g_autofree char *cached
      = g_build_filename (h.stow_cache, "config.json", NULL);
  if (g_file_test (cached, G_FILE_TEST_IS_REGULAR))
    {
      g_debug ("%s: from stowage's cache, %s", repo_id, cached);
      return load_cached (&h, h.stow_cache, error);
    }

  /* 3. The network. */
  if (h.offline)
    {
      E (NOT_FOUND,
         "%s@%s is in neither the Hugging Face cache (%s) nor stowage's "
         "(%s), and HF_HUB_OFFLINE forbids downloading: unset "
         "HF_HUB_OFFLINE, or pass a local config.json",
         repo_id, h.rev, h.hf_cache, h.stow_cache);
      return NULL;
    }
  g_auto (Response) r = { 0 };
  long status = 0;
  if (!hub_get (&h, "config.json", NULL, STOW_MODEL_MAX_CONFIG_BYTES, &r,
                &status, error))
    return NULL;
  if (status != 200)
    {
      stow_hub_status_error (&h, status, r.error_code, "config.json", error);
      return NULL;
    }

  g_autofree char *where
      = g_strdup_printf ("%s@%s: config.json", repo_id, h.rev);
  g_autoptr (JsonNode) root = stow_json_parse_data (
      (const char *)r.body->data, (gssize)r.body->len, where, error);
  JsonObject *obj;
  if (root == NULL
      || (obj = stow_json_root_object (root, where, error)) == NULL)
    {
      if (error && *error && (*error)->domain != STOW_MODEL_ERROR)
        {
          (*error)->domain = STOW_MODEL_ERROR;
          (*error)->code = STOW_MODEL_ERROR_INVALID;
        }
      return NULL;
    }
  g_autoptr (StowModel) m = stow_model_new_from_json (obj, where, error);
  if (m == NULL)
    return NULL;
  /* Cached only once it imports, so a broken download never sticks. */
  cache_write (h.stow_cache, "config.json", r.body->data, r.body->len);
  g_free (m->source);
  m->source = g_file_test (cached, G_FILE_TEST_IS_REGULAR)
                  ? g_strdup (cached)
                  : stow_hub_file_url (&h, h.rev, "config.json");
  set_hub_fields (m, &h);
  check_remote (m, &h);
  return g_steal_pointer (&m);
}
