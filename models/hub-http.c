/* SPDX-License-Identifier: MIT
 *
 * models/hub-http.c: the Hub's environment and HTTP, shared by the config
 * reader (hub.c) and the snapshot downloader (hub-download.c): the
 * variables huggingface_hub reads, one libcurl transfer set up alike for
 * both, and one line per failure that says what to do
 * (models/hub-private.h).
 */
#include "models/hub-private.h"

#include "config.h"

#include <stdarg.h>
#include <string.h>

#include "core/error.h"

gboolean
stow_hub_fail (GError **error, int code, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  if (error != NULL)
    *error = g_error_new_valist (STOW_MODEL_ERROR, code, fmt, ap);
  va_end (ap);
  return FALSE;
}

gboolean
stow_hub_is_commit (const char *rev)
{
  if (strlen (rev) != 40)
    return FALSE;
  for (const char *p = rev; *p; p++)
    if (!g_ascii_isxdigit (*p) || g_ascii_isupper (*p))
      return FALSE;
  return TRUE;
}

/* ---- the environment ---------------------------------------------------- */

void
stow_hub_env_clear (StowHubEnv *h)
{
  g_free (h->repo_dir);
  g_free (h->endpoint);
  if (h->token)
    memset (h->token, 0, strlen (h->token));
  g_free (h->token);
  g_free (h->hf_cache);
  g_free (h->stow_cache);
}

/* huggingface_hub's reading of a boolean variable (constants._is_true). */
static gboolean
env_true (const char *name)
{
  const char *v = g_getenv (name);
  return v != NULL
         && (g_ascii_strcasecmp (v, "1") == 0
             || g_ascii_strcasecmp (v, "true") == 0
             || g_ascii_strcasecmp (v, "yes") == 0
             || g_ascii_strcasecmp (v, "on") == 0);
}

static const char *
env_nonempty (const char *name)
{
  const char *v = g_getenv (name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

/* HF_HOME, else ~/.cache/huggingface (huggingface_hub's constants.py; it
 * also honours XDG_CACHE_HOME for the default). */
static char *
hf_home (void)
{
  const char *v = env_nonempty ("HF_HOME");
  if (v)
    return g_strdup (v);
  const char *xdg = env_nonempty ("XDG_CACHE_HOME");
  if (xdg)
    return g_build_filename (xdg, "huggingface", NULL);
  return g_build_filename (g_get_home_dir (), ".cache", "huggingface", NULL);
}

/* A token without whitespace around it; NULL when it holds a control
 * character (it would end the Authorization header early). */
static char *
clean_token (const char *raw)
{
  g_autofree char *t = g_strstrip (g_strdup (raw));
  if (t[0] == '\0')
    return NULL;
  for (const char *p = t; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return NULL;
  return g_steal_pointer (&t);
}

static gboolean
read_token (StowHubEnv *h, GError **error)
{
  const char *v = g_getenv ("HF_TOKEN");
  if (v != NULL && v[0] != '\0')
    {
      h->token = clean_token (v);
      if (h->token == NULL)
        return E (INVALID, "HF_TOKEN: holds a control character or only "
                           "spaces; set it to the token alone");
      return TRUE;
    }
  /* The file huggingface-cli login writes. */
  g_autofree char *home = hf_home ();
  g_autofree char *path = env_nonempty ("HF_TOKEN_PATH")
                              ? g_strdup (g_getenv ("HF_TOKEN_PATH"))
                              : g_build_filename (home, "token", NULL);
  g_autofree char *text = NULL;
  gsize len = 0;
  if (g_file_get_contents (path, &text, &len, NULL) && len < 4096)
    h->token = clean_token (text);
  return TRUE;
}

gboolean
stow_hub_env_init (StowHubEnv *h, const char *repo, const char *rev,
                   GError **error)
{
  if (!stow_hub_is_repo_id (repo))
    {
      g_autofree char *esc = g_strescape (repo, NULL);
      return E (INVALID,
                "\"%.100s\" is not a Hub id (ORG/NAME of letters, digits, "
                "'-', '_' and '.') nor a file",
                esc);
    }
  if (rev == NULL)
    rev = "main";
  else if (!stow_hub_is_revision (rev))
    {
      g_autofree char *esc = g_strescape (rev, NULL);
      return E (INVALID,
                "--revision \"%.100s\": expected a branch, tag or commit "
                "(letters, digits, '-', '_', '.', '/')",
                esc);
    }
  const char *slash = strchr (repo, '/');
  h->repo = repo;
  h->rev = rev;
  h->repo_dir = g_strdup_printf ("models--%.*s--%s", (int)(slash - repo), repo,
                                 slash + 1);
  h->offline = env_true ("HF_HUB_OFFLINE");
  h->instead = "a local config.json";
  h->cli_files = " config.json";

  const char *ep = env_nonempty ("HF_ENDPOINT");
  h->endpoint = g_strdup (ep ? ep : "https://huggingface.co");
  while (g_str_has_suffix (h->endpoint, "/"))
    h->endpoint[strlen (h->endpoint) - 1] = '\0';
  if (!g_str_has_prefix (h->endpoint, "https://")
      && !g_str_has_prefix (h->endpoint, "http://"))
    return E (INVALID,
              "HF_ENDPOINT \"%.100s\": expected an http:// or https:// URL",
              h->endpoint);
  for (const char *p = h->endpoint; *p; p++)
    if ((unsigned char)*p <= 0x20 || *p == 0x7f)
      return E (INVALID, "HF_ENDPOINT: holds a space or control character");

  h->timeout_s = STOW_HUB_DEFAULT_TIMEOUT_S;
  const char *to = env_nonempty ("STOW_HUB_TIMEOUT");
  if (to)
    {
      char *end = NULL;
      double v = g_ascii_strtod (to, &end);
      if (end == to || *end != '\0' || !(v > 0 && v <= 3600))
        return E (INVALID,
                  "STOW_HUB_TIMEOUT \"%.40s\": expected seconds, more than 0 "
                  "and at most 3600",
                  to);
      h->timeout_s = v;
    }
  if (!read_token (h, error))
    return FALSE;

  const char *hc = env_nonempty ("HF_HUB_CACHE");
  if (hc)
    h->hf_cache = g_strdup (hc);
  else
    {
      g_autofree char *home = hf_home ();
      h->hf_cache = g_build_filename (home, "hub", NULL);
    }
  /* A revision may hold '/' (refs/pr/1): one folder level per revision. */
  g_autofree char *rev_dir = g_strdup (rev);
  g_strdelimit (rev_dir, "/", '+');
  h->stow_cache = g_build_filename (g_get_user_cache_dir (), "stowage", "hub",
                                    h->repo_dir, rev_dir, NULL);
  return TRUE;
}

/* ---- the Hugging Face cache --------------------------------------------- */

/* The snapshot folder of the revision in the HF cache, or NULL. */
char *
stow_hub_hf_snapshot (const StowHubEnv *h)
{
  g_autofree char *commit = NULL;
  if (stow_hub_is_commit (h->rev))
    commit = g_strdup (h->rev);
  else
    {
      g_autofree char *ref
          = g_build_filename (h->hf_cache, h->repo_dir, "refs", h->rev, NULL);
      gsize len = 0;
      if (!g_file_get_contents (ref, &commit, &len, NULL) || len > 256)
        return NULL;
      g_strstrip (commit);
      if (!stow_hub_is_commit (commit))
        return NULL;
    }
  g_autofree char *snap
      = g_build_filename (h->hf_cache, h->repo_dir, "snapshots", commit, NULL);
  return g_file_test (snap, G_FILE_TEST_IS_DIR) ? g_steal_pointer (&snap)
                                                : NULL;
}

/* ---- HTTP ---------------------------------------------------------------- */

char *
stow_hub_header_value (const char *line, gsize len, const char *name)
{
  gsize n = strlen (name);
  if (len <= n + 1 || g_ascii_strncasecmp (line, name, n) != 0
      || line[n] != ':')
    return NULL;
  g_autofree char *v = g_strndup (line + n + 1, len - n - 1);
  return g_strdup (g_strstrip (v));
}

static void
curl_init_once (void)
{
  static gsize done;
  if (g_once_init_enter (&done))
    {
      curl_global_init (CURL_GLOBAL_DEFAULT);
      g_once_init_leave (&done, 1);
    }
}

char *
stow_hub_file_url (const StowHubEnv *h, const char *rev, const char *file)
{
  /* huggingface_hub quotes the revision with no safe characters. */
  g_autofree char *quoted = g_uri_escape_string (rev, NULL, FALSE);
  return g_strdup_printf ("%s/%s/resolve/%s/%s", h->endpoint, h->repo, quoted,
                          file);
}

CURL *
stow_hub_curl_new (const StowHubEnv *h, const char *url, gboolean with_token,
                   struct curl_slist **headers, char *errbuf)
{
  errbuf[0] = '\0';
  curl_init_once ();
  CURL *c = curl_easy_init ();
  if (c == NULL)
    return NULL;
  if (with_token && h->token)
    {
      g_autofree char *auth
          = g_strdup_printf ("Authorization: Bearer %s", h->token);
      *headers = curl_slist_append (*headers, auth);
      memset (auth, 0, strlen (auth));
    }
  curl_easy_setopt (c, CURLOPT_URL, url);
  curl_easy_setopt (c, CURLOPT_HTTPHEADER, *headers);
  curl_easy_setopt (c, CURLOPT_USERAGENT, "stowage/" STOW_VERSION);
  curl_easy_setopt (c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt (c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt (c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt (c, CURLOPT_CONNECTTIMEOUT_MS, (long)(h->timeout_s * 1000));
  curl_easy_setopt (c, CURLOPT_ERRORBUFFER, errbuf);
  return c;
}

gboolean
stow_hub_transport_error (const StowHubEnv *h, CURLcode rc, const char *errbuf,
                          const char *what, GError **error)
{
  const char *why = errbuf[0] ? errbuf : curl_easy_strerror (rc);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return E (NETWORK,
              "%s: %s did not answer within %g s: try again, raise "
              "STOW_HUB_TIMEOUT, or pass %s",
              h->repo, h->endpoint, h->timeout_s, h->instead);
  if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT
      || rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_SEND_ERROR
      || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING)
    return E (NETWORK,
              "%s: cannot reach %s (%s): check the network or HF_ENDPOINT, "
              "or download the model once (huggingface-cli download %s%s) "
              "and use HF_HUB_OFFLINE=1, or pass %s",
              h->repo, h->endpoint, why, h->repo, h->cli_files, h->instead);
  return E (NETWORK, "%s: fetching %s failed: %s", h->repo, what, why);
}

gboolean
stow_hub_status_error (const StowHubEnv *h, long status, const char *code,
                       const char *file, GError **error)
{
  g_autofree char *page = g_strdup_printf ("%s/%s", h->endpoint, h->repo);
  if (code == NULL)
    code = "";

  if (g_str_equal (code, "GatedRepo"))
    {
      if (h->token == NULL)
        return E (ACCESS,
                  "%s is gated (HTTP %ld): accept its license at %s, then "
                  "set HF_TOKEN (or run huggingface-cli login), or pass %s",
                  h->repo, status, page, h->instead);
      return E (ACCESS,
                "%s is gated and your token has no access to it (HTTP %ld): "
                "request access at %s, or pass %s",
                h->repo, status, page, h->instead);
    }
  if (g_str_equal (code, "RevisionNotFound"))
    return E (NOT_FOUND,
              "%s has no revision \"%s\" (HTTP %ld): check --revision (a "
              "branch, tag or commit of %s)",
              h->repo, h->rev, status, page);
  if (g_str_equal (code, "EntryNotFound"))
    return E (NOT_FOUND,
              "%s@%s has no %s (HTTP %ld): is it a model repository? pass "
              "%s",
              h->repo, h->rev, file, status, h->instead);
  if (status == 401 || status == 403)
    {
      if (h->token == NULL)
        return E (ACCESS,
                  "%s: not found, private or gated (HTTP %ld): check the id; "
                  "if it is private or gated, set HF_TOKEN (or run "
                  "huggingface-cli login); or pass %s",
                  h->repo, status, h->instead);
      if (status == 401)
        return E (ACCESS,
                  "%s: HF_TOKEN was refused (HTTP 401): check the token, or "
                  "pass %s",
                  h->repo, h->instead);
      return E (ACCESS,
                "%s: not found, or your token cannot read it (HTTP %ld): "
                "check the id and the token's access, or pass %s",
                h->repo, status, h->instead);
    }
  if (status == 404)
    return E (NOT_FOUND,
              "%s: no such model on %s (HTTP %ld)%s: check the id and "
              "--revision, or pass %s",
              h->repo, h->endpoint, status,
              h->token ? "" : " (or it is private: set HF_TOKEN)", h->instead);
  return E (NETWORK,
            "%s: %s answered HTTP %ld for %s: try again later, or "
            "pass %s",
            h->repo, h->endpoint, status, file, h->instead);
}
