/* SPDX-License-Identifier: MIT
 *
 * models/hub-download.c: a model's snapshot in the Hugging Face cache
 * (models/hub-download.h).  Per file, as huggingface_hub's hf_hub_download
 * does: a HEAD for the commit, the etag and the size (relative redirects
 * followed, a CDN's not), then a GET streamed into blobs/ETAG.incomplete,
 * checked against the etag, renamed, and linked from the snapshot.
 */
#include "models/hub-download.h"
#include "models/hub-private.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "core/units.h"

const char *const stow_hub_optional_files[] = {
  "generation_config.json",  "tokenizer.json",  "tokenizer_config.json",
  "special_tokens_map.json", "tokenizer.model", NULL,
};

#define INDEX_FILE  "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"
/* Redirects followed for one file (a renamed repository takes one). */
#define MAX_REDIRECTS 10
/* Bytes read at a time when a file on disk is hashed. */
#define HASH_CHUNK_BYTES ((gsize)1 << 20)

typedef struct
{
  StowHubEnv h;
  const StowHubDownload *opts;
  char *repo_path; /* HF_HUB_CACHE/models--ORG--NAME */
  char *commit;    /* NULL until known */
  char *snap;      /* repo_path/snapshots/COMMIT */
} Dl;

static void
dl_clear (Dl *d)
{
  stow_hub_env_clear (&d->h);
  g_free (d->repo_path);
  g_free (d->commit);
  g_free (d->snap);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Dl, dl_clear)

static gboolean
io_fail (GError **error, const char *what, const char *path, int err)
{
  return E (IO, "%s %s: %s", what, path, g_strerror (err));
}

/* ---- the cache on disk -------------------------------------------------- */

static void
set_commit (Dl *d, const char *commit)
{
  g_free (d->commit);
  g_free (d->snap);
  d->commit = g_strdup (commit);
  d->snap = g_build_filename (d->repo_path, "snapshots", commit, NULL);
}

/* The commit refs/REV names, or NULL. */
static char *
read_ref (const Dl *d)
{
  g_autofree char *ref
      = g_build_filename (d->repo_path, "refs", d->h.rev, NULL);
  g_autofree char *text = NULL;
  gsize len = 0;
  if (!g_file_get_contents (ref, &text, &len, NULL) || len > 256)
    return NULL;
  g_strstrip (text);
  return stow_hub_is_commit (text) ? g_steal_pointer (&text) : NULL;
}

static gboolean
write_ref (const Dl *d, GError **error)
{
  if (g_str_equal (d->h.rev, d->commit))
    return TRUE;
  g_autofree char *ref
      = g_build_filename (d->repo_path, "refs", d->h.rev, NULL);
  g_autofree char *dir = g_path_get_dirname (ref);
  if (g_mkdir_with_parents (dir, 0755) != 0)
    return io_fail (error, "cannot create", dir, errno);
  g_autoptr (GError) local = NULL;
  if (!stow_file_write_atomic (ref, d->commit, -1, &local))
    return E (IO, "%s", local->message);
  return TRUE;
}

/* A file of the snapshot that is there: a link whose blob exists. */
static gboolean
in_snapshot (const Dl *d, const char *file)
{
  g_autofree char *path = g_build_filename (d->snap, file, NULL);
  return g_file_test (path, G_FILE_TEST_IS_REGULAR);
}

/* huggingface_hub's mark for a file the commit does not have. */
static char *
no_exist_path (const Dl *d, const char *file)
{
  return g_build_filename (d->repo_path, ".no_exist", d->commit, file, NULL);
}

static gboolean
known_absent (const Dl *d, const char *file)
{
  g_autofree char *path = no_exist_path (d, file);
  return g_file_test (path, G_FILE_TEST_EXISTS);
}

/* Only a mark that spares a request next time: failing to write it is not
 * an error. */
static void
mark_absent (const Dl *d, const char *file)
{
  g_autofree char *path = no_exist_path (d, file);
  g_autofree char *dir = g_path_get_dirname (path);
  if (g_mkdir_with_parents (dir, 0755) == 0)
    g_file_set_contents (path, "", 0, NULL);
}

/* snapshots/COMMIT/FILE -> ../../blobs/ETAG, replacing what was there in
 * one rename. */
static gboolean
link_blob (const Dl *d, const char *file, const char *etag, GError **error)
{
  g_autofree char *path = g_build_filename (d->snap, file, NULL);
  g_autofree char *target = g_build_filename ("..", "..", "blobs", etag, NULL);
  g_autofree char *tmp = g_strdup_printf ("%s.tmp-%d", path, (int)getpid ());
  if (g_mkdir_with_parents (d->snap, 0755) != 0)
    return io_fail (error, "cannot create", d->snap, errno);
  g_unlink (tmp);
  if (symlink (target, tmp) != 0)
    return io_fail (error, "cannot link", tmp, errno);
  if (g_rename (tmp, path) != 0)
    {
      int e = errno;
      g_unlink (tmp);
      return io_fail (error, "cannot link", path, e);
    }
  return TRUE;
}

/* A name a snapshot file may have: one plain file name, as the shards
 * model.safetensors.index.json names (executor/model-io.c refuses others
 * too). */
static gboolean
plain_file_name (const char *name)
{
  return name[0] != '\0' && name[0] != '.' && strchr (name, '/') == NULL
         && strchr (name, '\\') == NULL && strlen (name) <= 255;
}

static gint
compare_names (gconstpointer a, gconstpointer b)
{
  return strcmp (*(const char *const *)a, *(const char *const *)b);
}

/* The files @index (a path) maps tensors to, each once, sorted. */
static GPtrArray *
index_shards (const char *index, GError **error)
{
  g_autoptr (GError) local = NULL;
  g_autoptr (JsonNode) root
      = stow_json_parse_file (index, STOW_HUB_MAX_FILE_BYTES, &local);
  JsonObject *o = root ? stow_json_root_object (root, index, &local) : NULL;
  JsonObject *map = NULL;
  if (o == NULL
      || !stow_json_get_object (o, index, "weight_map", TRUE, &map, &local))
    {
      E (INVALID, "%s", local->message);
      return NULL;
    }
  g_autoptr (GHashTable) seen
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  g_autoptr (GList) names = json_object_get_members (map);
  for (GList *l = names; l; l = l->next)
    {
      JsonNode *v = json_object_get_member (map, l->data);
      const char *file = JSON_NODE_HOLDS_VALUE (
                             v) && json_node_get_value_type (v) == G_TYPE_STRING
                             ? json_node_get_string (v)
                             : NULL;
      if (file == NULL || !plain_file_name (file))
        {
          E (INVALID,
             "%s: weight_map: \"%s\": expected the name of a file beside "
             "the index",
             index, (const char *)l->data);
          return NULL;
        }
      g_hash_table_add (seen, g_strdup (file));
    }
  if (g_hash_table_size (seen) == 0)
    {
      E (INVALID, "%s: weight_map names no file", index);
      return NULL;
    }
  GPtrArray *files = g_ptr_array_new_with_free_func (g_free);
  GHashTableIter it;
  gpointer key;
  g_hash_table_iter_init (&it, seen);
  while (g_hash_table_iter_next (&it, &key, NULL))
    {
      g_hash_table_iter_steal (&it);
      g_ptr_array_add (files, key);
    }
  g_ptr_array_sort (files, compare_names);
  return files;
}

/* What the snapshot lacks: required files (@missing) and optional files
 * neither there nor known absent (@unknown). */
static gboolean
scan (const Dl *d, GPtrArray *missing, GPtrArray *unknown, GError **error)
{
  if (!in_snapshot (d, "config.json"))
    g_ptr_array_add (missing, g_strdup ("config.json"));
  if (d->opts && d->opts->no_weights)
    ; /* the tokenizer's files alone */
  else if (!in_snapshot (d, SINGLE_FILE))
    {
      if (!in_snapshot (d, INDEX_FILE))
        g_ptr_array_add (missing, g_strdup (SINGLE_FILE " or " INDEX_FILE));
      else
        {
          g_autofree char *index = g_build_filename (d->snap, INDEX_FILE, NULL);
          g_autoptr (GPtrArray) shards = index_shards (index, error);
          if (shards == NULL)
            return FALSE;
          for (guint i = 0; i < shards->len; i++)
            if (!in_snapshot (d, g_ptr_array_index (shards, i)))
              g_ptr_array_add (missing,
                               g_strdup (g_ptr_array_index (shards, i)));
        }
    }
  for (guint i = 0; stow_hub_optional_files[i]; i++)
    if (!in_snapshot (d, stow_hub_optional_files[i])
        && !known_absent (d, stow_hub_optional_files[i]))
      g_ptr_array_add (unknown, g_strdup (stow_hub_optional_files[i]));
  return TRUE;
}

/* "a, b, c and 4 more" */
static char *
name_list (GPtrArray *names)
{
  GString *s = g_string_new (NULL);
  guint shown = MIN (names->len, 3);
  for (guint i = 0; i < shown; i++)
    g_string_append_printf (s, "%s%s", i ? ", " : "",
                            (const char *)g_ptr_array_index (names, i));
  if (names->len > shown)
    g_string_append_printf (s, " and %u more", names->len - shown);
  return g_string_free (s, FALSE);
}

/* ---- asking the Hub about a file (HEAD) --------------------------------- */

typedef struct
{
  long status;
  char *error_code; /* X-Error-Code */
  char *commit;     /* X-Repo-Commit */
  char *etag;       /* X-Linked-Etag, else ETag; normalized */
  char *location;   /* where to GET it: a 3xx's absolute Location */
  guint64 size;     /* X-Linked-Size, else Content-Length */
  gboolean has_size, linked_etag, linked_size;
} Meta;

static void
meta_clear (Meta *m)
{
  g_free (m->error_code);
  g_free (m->commit);
  g_free (m->etag);
  g_free (m->location);
  memset (m, 0, sizeof *m);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Meta, meta_clear)

/* huggingface_hub's _normalize_etag: no W/ and no quotes. */
static char *
normalize_etag (const char *v)
{
  if (g_str_has_prefix (v, "W/"))
    v += 2;
  g_autofree char *s = g_strdup (v);
  gsize n = strlen (s);
  if (n >= 2 && s[0] == '"' && s[n - 1] == '"')
    return g_strndup (s + 1, n - 2);
  return g_steal_pointer (&s);
}

static gboolean
parse_u64 (const char *v, guint64 *out)
{
  return g_ascii_string_to_unsigned (v, 10, 0, G_MAXUINT64, out, NULL);
}

static size_t
on_meta_header (char *data, size_t size, size_t n, void *user)
{
  Meta *m = user;
  gsize len = size * n;
  char *v;
  if (len > 5 && strncmp (data, "HTTP/", 5) == 0)
    {
      long status = m->status;
      meta_clear (m);
      m->status = status;
      return len;
    }
  if ((v = stow_hub_header_value (data, len, "X-Error-Code")) != NULL)
    g_free (m->error_code), m->error_code = v;
  else if ((v = stow_hub_header_value (data, len, "X-Repo-Commit")) != NULL)
    g_free (m->commit), m->commit = v;
  else if ((v = stow_hub_header_value (data, len, "X-Linked-Etag")) != NULL)
    {
      g_free (m->etag);
      m->etag = normalize_etag (v);
      m->linked_etag = TRUE;
      g_free (v);
    }
  else if ((v = stow_hub_header_value (data, len, "ETag")) != NULL)
    {
      if (!m->linked_etag)
        {
          g_free (m->etag);
          m->etag = normalize_etag (v);
        }
      g_free (v);
    }
  else if ((v = stow_hub_header_value (data, len, "X-Linked-Size")) != NULL)
    {
      m->has_size = parse_u64 (v, &m->size);
      m->linked_size = m->has_size;
      g_free (v);
    }
  else if ((v = stow_hub_header_value (data, len, "Content-Length")) != NULL)
    {
      if (!m->linked_size)
        m->has_size = parse_u64 (v, &m->size);
      g_free (v);
    }
  else if ((v = stow_hub_header_value (data, len, "Location")) != NULL)
    g_free (m->location), m->location = v;
  return len;
}

/* A Location with no scheme and no host: the same server (RFC 7231). */
static gboolean
is_relative (const char *location)
{
  return g_uri_peek_scheme (location) == NULL
         && !g_str_has_prefix (location, "//");
}

/* HEAD of @file at @rev.  Answers with @m->status set for any HTTP status
 * (the caller decides what a 404 means); FALSE on a transport failure. */
static gboolean
head_file (const Dl *d, const char *rev, const char *file, Meta *m,
           GError **error)
{
  g_autofree char *url = stow_hub_file_url (&d->h, rev, file);
  for (int hop = 0;; hop++)
    {
      char errbuf[CURL_ERROR_SIZE];
      struct curl_slist *headers
          = curl_slist_append (NULL, "Accept-Encoding: identity");
      CURL *c = stow_hub_curl_new (&d->h, url, TRUE, &headers, errbuf);
      if (c == NULL)
        {
          curl_slist_free_all (headers);
          return E (NETWORK, "%s: libcurl could not start a transfer",
                    d->h.repo);
        }
      meta_clear (m);
      curl_easy_setopt (c, CURLOPT_NOBODY, 1L);
      curl_easy_setopt (c, CURLOPT_TIMEOUT_MS, (long)(d->h.timeout_s * 1000));
      curl_easy_setopt (c, CURLOPT_HEADERFUNCTION, on_meta_header);
      curl_easy_setopt (c, CURLOPT_HEADERDATA, m);
      CURLcode rc = curl_easy_perform (c);
      curl_easy_getinfo (c, CURLINFO_RESPONSE_CODE, &m->status);
      curl_easy_cleanup (c);
      curl_slist_free_all (headers);
      if (rc != CURLE_OK)
        return stow_hub_transport_error (&d->h, rc, errbuf, url, error);
      if (m->status < 300 || m->status > 399)
        return TRUE;
      if (m->location == NULL)
        return E (NETWORK,
                  "%s: %s answered HTTP %ld for %s without a "
                  "Location",
                  d->h.repo, d->h.endpoint, m->status, file);
      if (!is_relative (m->location))
        return TRUE; /* a CDN: the GET goes there, without the token */
      if (hop == MAX_REDIRECTS)
        return E (NETWORK, "%s: more than %d redirects for %s", d->h.repo,
                  MAX_REDIRECTS, file);
      /* A renamed repository: follow on the same server. */
      g_autofree char *next
          = g_uri_resolve_relative (url, m->location, G_URI_FLAGS_NONE, NULL);
      if (next == NULL)
        return E (NETWORK, "%s: %s redirected %s to \"%.200s\"", d->h.repo,
                  d->h.endpoint, file, m->location);
      g_free (url);
      url = g_steal_pointer (&next);
    }
}

/* A blob's name must stay a file name in blobs/. */
static gboolean
etag_ok (const char *etag)
{
  gsize n = strlen (etag);
  if (n == 0 || n > 200 || etag[0] == '.')
    return FALSE;
  for (const char *p = etag; *p; p++)
    if (!g_ascii_isalnum (*p) && *p != '-' && *p != '_' && *p != '.')
      return FALSE;
  return TRUE;
}

/* HEAD of @file: FALSE with the Hub's error for any status but 2xx and
 * 3xx, or when the answer lacks what hf_hub_download needs (a commit, an
 * etag).  With @optional, a missing file (EntryNotFound) is *@absent. */
static gboolean
file_meta (const Dl *d, const char *rev, const char *file, gboolean optional,
           Meta *m, gboolean *absent, GError **error)
{
  if (absent)
    *absent = FALSE;
  if (!head_file (d, rev, file, m, error))
    return FALSE;
  if (optional && m->status == 404
      && g_strcmp0 (m->error_code, "EntryNotFound") == 0)
    {
      *absent = TRUE;
      return TRUE;
    }
  if (m->status < 200 || m->status > 399)
    return stow_hub_status_error (&d->h, m->status, m->error_code, file, error);
  /* huggingface_hub refuses both (FileMetadataError). */
  if (m->commit == NULL || !stow_hub_is_commit (m->commit))
    return E (NETWORK,
              "%s: %s sent %s without a commit (X-Repo-Commit): is "
              "HF_ENDPOINT a Hugging Face Hub? a proxy or firewall may be "
              "in the way",
              d->h.repo, d->h.endpoint, file);
  if (m->etag == NULL)
    return E (NETWORK,
              "%s: %s sent %s without an ETag, so the download could not be "
              "checked or cached: is HF_ENDPOINT a Hugging Face Hub?",
              d->h.repo, d->h.endpoint, file);
  if (!etag_ok (m->etag))
    return E (INVALID, "%s: %s's etag \"%.80s\" cannot name a cache file",
              d->h.repo, file, m->etag);
  return TRUE;
}

/* ---- fetching a file (GET) ---------------------------------------------- */

typedef struct
{
  const Dl *d;
  const char *file;
  int fd;
  const char *path; /* the .incomplete */
  CURL *curl;
  guint64 resumed; /* bytes on disk when the transfer began */
  guint64 written; /* by this transfer */
  guint64 expect;  /* 0: unknown */
  GChecksum *sha256;
  gboolean started, too_long, bad_range;
  int write_errno;
  gint64 t0_us, last_report_us;
  guint64 range_start; /* Content-Range's first byte; G_MAXUINT64 if none */
  char *error_code;    /* X-Error-Code of an error answer */
} Sink;

static void
report (Sink *s, gboolean finished)
{
  const StowHubDownload *o = s->d->opts;
  if (o == NULL || o->progress == NULL)
    return;
  gint64 now = g_get_monotonic_time ();
  if (!finished && now - s->last_report_us < G_USEC_PER_SEC / 10)
    return;
  s->last_report_us = now;
  StowHubProgress p = {
    .repo = s->d->h.repo,
    .file = s->file,
    .done_bytes = s->resumed + s->written,
    .total_bytes = s->expect,
    .resumed_bytes = s->resumed,
    .elapsed_s = (double)(now - s->t0_us) / G_USEC_PER_SEC,
    .finished = finished,
  };
  o->progress (&p, o->user);
}

static size_t
on_sink_header (char *data, size_t size, size_t n, void *user)
{
  Sink *s = user;
  gsize len = size * n;
  char *v;
  guint64 a;
  /* Each answer (a redirect, then the file) has its own headers. */
  if (len > 5 && strncmp (data, "HTTP/", 5) == 0)
    {
      s->range_start = G_MAXUINT64;
      g_clear_pointer (&s->error_code, g_free);
    }
  else if ((v = stow_hub_header_value (data, len, "Content-Range")) != NULL)
    {
      if (sscanf (v, "bytes %" G_GUINT64_FORMAT "-", &a) == 1)
        s->range_start = a;
      g_free (v);
    }
  else if ((v = stow_hub_header_value (data, len, "X-Error-Code")) != NULL)
    g_free (s->error_code), s->error_code = v;
  return len;
}

/* Hashes the first @len bytes of @fd into @sum. */
static gboolean
hash_prefix (int fd, guint64 len, GChecksum *sum)
{
  g_autofree guint8 *buf = g_malloc (HASH_CHUNK_BYTES);
  guint64 off = 0;
  while (off < len)
    {
      ssize_t got = pread (fd, buf, (size_t)MIN (HASH_CHUNK_BYTES, len - off),
                           (off_t)off);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        return FALSE;
      g_checksum_update (sum, buf, got);
      off += (guint64)got;
    }
  return TRUE;
}

/* Drops what @s->fd holds: the transfer starts from byte 0. */
static gboolean
sink_restart (Sink *s)
{
  if (ftruncate (s->fd, 0) != 0)
    return FALSE;
  s->resumed = s->written = 0;
  if (s->sha256)
    g_checksum_reset (s->sha256);
  return TRUE;
}

static size_t
on_sink_body (char *data, size_t size, size_t n, void *user)
{
  Sink *s = user;
  gsize len = size * n;
  if (!s->started)
    {
      s->started = TRUE;
      long status = 0;
      curl_easy_getinfo (s->curl, CURLINFO_RESPONSE_CODE, &status);
      /* A server that ignores Range sends the whole file (200): start
       * over instead of appending it to what is there. */
      if (s->resumed > 0 && status == 200 && !sink_restart (s))
        {
          s->write_errno = errno;
          return 0;
        }
      if (s->resumed > 0 && status != 200 && s->range_start != s->resumed)
        {
          s->bad_range = TRUE;
          return 0;
        }
    }
  if (s->expect > 0 && s->resumed + s->written + len > s->expect)
    {
      s->too_long = TRUE;
      return 0;
    }
  for (gsize off = 0; off < len;)
    {
      ssize_t w = pwrite (s->fd, data + off, len - off,
                          (off_t)(s->resumed + s->written + off));
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        {
          s->write_errno = w < 0 ? errno : EIO;
          return 0;
        }
      off += (gsize)w;
    }
  if (s->sha256)
    g_checksum_update (s->sha256, (const guchar *)data, (gssize)len);
  s->written += len;
  report (s, FALSE);
  return len;
}

/* Whether @a and @b are on one server (scheme, host and port). */
static gboolean
same_server (const char *a, const char *b)
{
  g_autofree char *sa = NULL, *ha = NULL, *sb = NULL, *hb = NULL;
  gint pa = -1, pb = -1;
  if (!g_uri_split_network (a, G_URI_FLAGS_NONE, &sa, &ha, &pa, NULL)
      || !g_uri_split_network (b, G_URI_FLAGS_NONE, &sb, &hb, &pb, NULL))
    return FALSE;
  return g_ascii_strcasecmp (sa, sb) == 0 && g_ascii_strcasecmp (ha, hb) == 0
         && pa == pb;
}

/* GETs @url into @s->fd from @s->resumed on; *@status is the last HTTP
 * status (0 without one). */
static CURLcode
get_into (Sink *s, const char *url, long *status, char *errbuf)
{
  const Dl *d = s->d;
  struct curl_slist *headers = NULL;
  /* The token goes to the Hub only, never to a CDN's signed URL (libcurl
   * drops it itself on a redirect to another host). */
  CURL *c = stow_hub_curl_new (&d->h, url, same_server (url, d->h.endpoint),
                               &headers, errbuf);
  if (c == NULL)
    return CURLE_FAILED_INIT;
  g_autofree char *range = NULL;
  if (s->resumed > 0)
    {
      range = g_strdup_printf ("%" G_GUINT64_FORMAT "-", s->resumed);
      curl_easy_setopt (c, CURLOPT_RANGE, range);
    }
  curl_easy_setopt (c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt (c, CURLOPT_MAXREDIRS, (long)MAX_REDIRECTS);
  curl_easy_setopt (c, CURLOPT_FAILONERROR, 1L);
  /* No limit on the whole transfer (weights take minutes); a stall of
   * STOW_HUB_TIMEOUT seconds ends it. */
  curl_easy_setopt (c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt (c, CURLOPT_LOW_SPEED_TIME,
                    (long)MAX (1.0, d->h.timeout_s + 0.5));
  curl_easy_setopt (c, CURLOPT_WRITEFUNCTION, on_sink_body);
  curl_easy_setopt (c, CURLOPT_WRITEDATA, s);
  curl_easy_setopt (c, CURLOPT_HEADERFUNCTION, on_sink_header);
  curl_easy_setopt (c, CURLOPT_HEADERDATA, s);
  s->range_start = G_MAXUINT64;
  s->started = FALSE;
  s->written = 0;
  s->curl = c;
  CURLcode rc = curl_easy_perform (c);
  curl_easy_getinfo (c, CURLINFO_RESPONSE_CODE, status);
  curl_easy_cleanup (c);
  curl_slist_free_all (headers);
  return rc;
}

static gboolean
is_hex (const char *s, gsize len)
{
  if (strlen (s) != len)
    return FALSE;
  for (; *s; s++)
    if (!g_ascii_isxdigit (*s) || g_ascii_isupper (*s))
      return FALSE;
  return TRUE;
}

/* The transfer of @file into @s (its .incomplete open), with the error
 * that says whether what arrived was kept to resume. */
static gboolean
transfer (Sink *s, const Meta *m, GError **error)
{
  const Dl *d = s->d;
  const char *file = s->file;
  g_autofree char *url = m->location
                             ? g_strdup (m->location)
                             : stow_hub_file_url (&d->h, d->commit, file);
  char errbuf[CURL_ERROR_SIZE];
  long status = 0;
  CURLcode rc = CURLE_OK;
  for (int attempt = 0; attempt < 2; attempt++)
    {
      rc = get_into (s, url, &status, errbuf);
      /* The server cannot resume from there: once more, from the start. */
      if (rc == CURLE_HTTP_RETURNED_ERROR && status == 416 && s->resumed > 0
          && attempt == 0)
        {
          if (!sink_restart (s))
            return io_fail (error, "cannot truncate", s->path, errno);
          continue;
        }
      break;
    }
  guint64 have = s->resumed + s->written;
  g_autofree char *have_s = stow_format_bytes (have);
  g_autofree char *expect_s = stow_format_bytes (s->expect);
  if (s->write_errno != 0)
    return E (IO,
              "cannot write %s: %s (the %s written are kept: run the command "
              "again to resume)",
              s->path, g_strerror (s->write_errno), have_s);
  if (s->too_long)
    {
      g_unlink (s->path);
      return E (NETWORK,
                "%s: %s: the server sent more than the %" G_GUINT64_FORMAT
                " bytes it announced; nothing was kept: run the command "
                "again",
                d->h.repo, file, s->expect);
    }
  if (s->bad_range)
    return E (NETWORK,
              "%s: %s: asked for the bytes from %" G_GUINT64_FORMAT
              " on, the server sent others (%s); the %s kept are in %s",
              d->h.repo, file, s->resumed, url, have_s, s->path);
  if (rc == CURLE_HTTP_RETURNED_ERROR)
    return stow_hub_status_error (&d->h, status, s->error_code, file, error);
  if (rc != CURLE_OK && have == 0)
    return stow_hub_transport_error (&d->h, rc, errbuf, url, error);
  if (rc != CURLE_OK || (s->expect > 0 && have < s->expect))
    return E (NETWORK,
              "%s: %s: the transfer stopped after %s of %s (%s): run the "
              "command again to resume from there (%s)",
              d->h.repo, file, have_s, s->expect ? expect_s : "an unknown size",
              rc != CURLE_OK ? (errbuf[0] ? errbuf : curl_easy_strerror (rc))
                             : "the server closed the connection",
              s->path);
  return TRUE;
}

/* git's object id of a file: sha1 of "blob LEN\0" and the contents. */
static char *
git_blob_sha1 (int fd, guint64 len)
{
  g_autoptr (GChecksum) sum = g_checksum_new (G_CHECKSUM_SHA1);
  g_autofree char *head = g_strdup_printf ("blob %" G_GUINT64_FORMAT, len);
  g_checksum_update (sum, (const guchar *)head, (gssize)strlen (head) + 1);
  if (!hash_prefix (fd, len, sum))
    return NULL;
  return g_strdup (g_checksum_get_string (sum));
}

/* Under the blob's lock: the .incomplete filled, checked and renamed to
 * @blob. */
static gboolean
fetch_locked (const Dl *d, const char *file, const Meta *m, const char *blob,
              GError **error)
{
  if (g_file_test (blob, G_FILE_TEST_IS_REGULAR))
    return TRUE; /* another process finished it while we waited */
  g_autofree char *part = g_strconcat (blob, ".incomplete", NULL);
  int fd = open (part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  struct stat st;
  if (fd < 0 || fstat (fd, &st) != 0)
    {
      int e = errno;
      if (fd >= 0)
        close (fd);
      return io_fail (error, "cannot open", part, e);
    }
  Sink s = {
    .d = d,
    .file = file,
    .fd = fd,
    .path = part,
    .resumed = (guint64)st.st_size,
    .expect = m->has_size ? m->size : 0,
    .t0_us = g_get_monotonic_time (),
  };
  gboolean lfs = is_hex (m->etag, 64);
  if (lfs)
    s.sha256 = g_checksum_new (G_CHECKSUM_SHA256);
  gboolean ok = TRUE;
  /* What an earlier transfer left: longer than the file, or unreadable,
   * is dropped; otherwise the checksum starts from it. */
  if ((m->has_size && s.resumed > m->size)
      || (s.resumed > 0 && lfs && !hash_prefix (fd, s.resumed, s.sha256)))
    ok = sink_restart (&s) || io_fail (error, "cannot truncate", part, errno);
  if (ok && !(m->has_size && s.resumed == m->size))
    ok = transfer (&s, m, error);

  guint64 len = s.resumed + s.written;
  g_autofree char *got = NULL;
  const char *algo = NULL;
  if (ok && lfs)
    got = g_strdup (g_checksum_get_string (s.sha256)), algo = "sha256";
  else if (ok && is_hex (m->etag, 40))
    {
      got = git_blob_sha1 (fd, len), algo = "git blob sha1";
      if (got == NULL)
        ok = io_fail (error, "cannot read", part, errno ? errno : EIO);
    }
  if (ok && got && !g_str_equal (got, m->etag))
    {
      g_unlink (part);
      ok = E (NETWORK,
              "%s: %s: the download's %s is %s, but the Hub's etag says %s: "
              "it was damaged on the way and is removed; run the command "
              "again",
              d->h.repo, file, algo, got, m->etag);
    }
  if (ok && fsync (fd) != 0)
    ok = io_fail (error, "cannot write", part, errno);
  if (s.sha256)
    g_checksum_free (s.sha256);
  g_free (s.error_code);
  if (close (fd) != 0 && ok)
    ok = io_fail (error, "cannot write", part, errno);
  if (ok && g_rename (part, blob) != 0)
    ok = io_fail (error, "cannot rename to", blob, errno);
  if (ok && s.written > 0)
    report (&s, TRUE);
  return ok;
}

/* @file (as @m describes it) into blobs/ETAG, linked from the snapshot.  A
 * blob already there (another commit's same file) is only linked. */
static gboolean
fetch_file (const Dl *d, const char *file, const Meta *m, GError **error)
{
  g_autofree char *blobs = g_build_filename (d->repo_path, "blobs", NULL);
  g_autofree char *blob = g_build_filename (blobs, m->etag, NULL);
  if (!g_file_test (blob, G_FILE_TEST_IS_REGULAR))
    {
      /* One writer per blob, with huggingface_hub's lock file (it takes
       * the same flock), so two downloads never interleave. */
      g_autofree char *locks
          = g_build_filename (d->h.hf_cache, ".locks", d->h.repo_dir, NULL);
      g_autofree char *lock_name = g_strconcat (m->etag, ".lock", NULL);
      g_autofree char *lock_path = g_build_filename (locks, lock_name, NULL);
      if (g_mkdir_with_parents (blobs, 0755) != 0)
        return io_fail (error, "cannot create", blobs, errno);
      if (g_mkdir_with_parents (locks, 0755) != 0)
        return io_fail (error, "cannot create", locks, errno);
      int lock = open (lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (lock < 0)
        return io_fail (error, "cannot open", lock_path, errno);
      int rc;
      while ((rc = flock (lock, LOCK_EX)) != 0 && errno == EINTR)
        ;
      gboolean ok = rc == 0 ? fetch_locked (d, file, m, blob, error)
                            : io_fail (error, "cannot lock", lock_path, errno);
      close (lock);
      if (!ok)
        return FALSE;
    }
  return link_blob (d, file, m->etag, error);
}

/* @file at the snapshot's commit, unless the snapshot has it.  With
 * @optional, a file the commit lacks is marked so and skipped. */
static gboolean
ensure_file (const Dl *d, const char *file, gboolean optional, GError **error)
{
  if (in_snapshot (d, file) || (optional && known_absent (d, file)))
    return TRUE;
  g_auto (Meta) m = { 0 };
  gboolean absent = FALSE;
  if (!file_meta (d, d->commit, file, optional, &m, &absent, error))
    return FALSE;
  if (absent)
    {
      mark_absent (d, file);
      return TRUE;
    }
  return fetch_file (d, file, &m, error);
}

/* model.safetensors, or the index and every shard it names (transformers
 * looks for the single file first). */
static gboolean
fetch_weights (const Dl *d, GError **error)
{
  if (in_snapshot (d, SINGLE_FILE))
    return TRUE;
  if (!in_snapshot (d, INDEX_FILE))
    {
      g_auto (Meta) m = { 0 };
      gboolean absent = FALSE;
      if (!file_meta (d, d->commit, SINGLE_FILE, TRUE, &m, &absent, error))
        return FALSE;
      if (!absent)
        return fetch_file (d, SINGLE_FILE, &m, error);
      g_auto (Meta) mi = { 0 };
      if (!file_meta (d, d->commit, INDEX_FILE, TRUE, &mi, &absent, error))
        return FALSE;
      if (absent)
        return E (NOT_FOUND,
                  "%s@%s has neither " SINGLE_FILE " nor " INDEX_FILE
                  ": stowage reads weights as transformers saves them "
                  "(save_pretrained with safe_serialization); pass a local "
                  "model directory",
                  d->h.repo, d->h.rev);
      if (!fetch_file (d, INDEX_FILE, &mi, error))
        return FALSE;
    }
  g_autofree char *index = g_build_filename (d->snap, INDEX_FILE, NULL);
  g_autoptr (GPtrArray) shards = index_shards (index, error);
  if (shards == NULL)
    return FALSE;
  for (guint i = 0; i < shards->len; i++)
    if (!ensure_file (d, g_ptr_array_index (shards, i), FALSE, error))
      return FALSE;
  return TRUE;
}

static gboolean
fetch_optional (const Dl *d, GError **error)
{
  for (guint i = 0; stow_hub_optional_files[i]; i++)
    if (!ensure_file (d, stow_hub_optional_files[i], TRUE, error))
      return FALSE;
  return TRUE;
}

static gboolean
check_config (const Dl *d, GError **error)
{
  if (d->opts == NULL || d->opts->check_config == NULL)
    return TRUE;
  g_autofree char *cfg = g_build_filename (d->snap, "config.json", NULL);
  return d->opts->check_config (cfg, d->opts->user, error);
}

/* Online: the revision's commit from config.json's HEAD, then each file
 * the snapshot lacks. */
static gboolean
download (Dl *d, GError **error)
{
  g_auto (Meta) m = { 0 };
  if (!file_meta (d, d->h.rev, "config.json", FALSE, &m, NULL, error))
    return FALSE;
  set_commit (d, m.commit);
  if (!in_snapshot (d, "config.json")
      && !fetch_file (d, "config.json", &m, error))
    return FALSE;
  return write_ref (d, error) && check_config (d, error)
         && (d->opts && d->opts->no_weights ? TRUE : fetch_weights (d, error))
         && fetch_optional (d, error);
}

char *
stow_hub_download_model (const char *repo_id, const char *revision,
                         const StowHubDownload *opts, GError **error)
{
  g_return_val_if_fail (repo_id != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  g_auto (Dl) d = { .opts = opts };
  if (!stow_hub_env_init (&d.h, repo_id, revision, error))
    return NULL;
  d.h.instead = "a local model directory";
  d.h.cli_files = "";
  d.repo_path = g_build_filename (d.h.hf_cache, d.h.repo_dir, NULL);

  g_autofree char *known
      = stow_hub_is_commit (d.h.rev) ? g_strdup (d.h.rev) : read_ref (&d);
  if (known == NULL)
    {
      if (d.h.offline)
        {
          g_autofree char *ref
              = g_build_filename (d.repo_path, "refs", d.h.rev, NULL);
          E (NOT_FOUND,
             "%s@%s is not in the Hugging Face cache (no %s), and "
             "HF_HUB_OFFLINE forbids downloading: unset HF_HUB_OFFLINE, or "
             "pass a local model directory",
             repo_id, d.h.rev, ref);
          return NULL;
        }
      return download (&d, error) ? g_steal_pointer (&d.snap) : NULL;
    }

  /* A snapshot already there (ours, or huggingface-cli download's) is
   * used as it is: no request for a file it has. */
  set_commit (&d, known);
  g_autoptr (GPtrArray) missing = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GPtrArray) unknown = g_ptr_array_new_with_free_func (g_free);
  if (!scan (&d, missing, unknown, error))
    return NULL;
  if (missing->len > 0 && d.h.offline)
    {
      g_autofree char *names = name_list (missing);
      E (NOT_FOUND,
         "%s@%s: the Hugging Face cache lacks %s (looked in %s), and "
         "HF_HUB_OFFLINE forbids downloading: unset HF_HUB_OFFLINE, or pass "
         "a local model directory",
         repo_id, d.h.rev, names, d.snap);
      return NULL;
    }
  if (missing->len > 0)
    return download (&d, error) ? g_steal_pointer (&d.snap) : NULL;
  /* Complete: only the optional files nobody has asked about yet, at the
   * snapshot's own commit. */
  if (!check_config (&d, error)
      || (!d.h.offline && unknown->len > 0 && !fetch_optional (&d, error)))
    return NULL;
  return g_steal_pointer (&d.snap);
}
