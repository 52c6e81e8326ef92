/* SPDX-License-Identifier: MIT
 *
 * models/hub-private.h: what the Hub's config reader (hub.c) and its
 * snapshot downloader (hub-download.c) share: the environment as
 * huggingface_hub reads it (endpoint, token, offline, the caches), one
 * libcurl transfer set up alike for both, and the one-line errors for an
 * HTTP status or a failed transfer (hub-http.c).  Not a public interface.
 */
#pragma once

#include <curl/curl.h>

#include "models/hub.h"

G_BEGIN_DECLS

typedef struct
{
  const char *repo; /* ORG/NAME */
  const char *rev;  /* "main" unless given */
  char *repo_dir;   /* models--ORG--NAME */
  char *endpoint;   /* no trailing '/' */
  char *token;      /* NULL without one */
  double timeout_s;
  gboolean offline;
  char *hf_cache;   /* the Hugging Face hub cache */
  char *stow_cache; /* stowage's cache folder of this repo and revision */
  /* What an error suggests instead of the Hub: "a local config.json"
   * (the default) or "a local model directory" (the downloader's). */
  const char *instead;
  /* The files a `huggingface-cli download` hint names after the id: "
   * config.json" (the default) or "" (the whole repository). */
  const char *cli_files;
} StowHubEnv;

/* Checks @repo (stow_hub_is_repo_id) and @rev (stow_hub_is_revision; NULL:
 * "main") and reads the environment: HF_ENDPOINT, HF_TOKEN (else
 * HF_TOKEN_PATH or HF_HOME/token), HF_HUB_OFFLINE, STOW_HUB_TIMEOUT,
 * HF_HUB_CACHE (else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub).
 * @h borrows @repo and @rev.  STOW_MODEL_ERROR_INVALID names the argument
 * or the variable. */
gboolean stow_hub_env_init (StowHubEnv *h, const char *repo, const char *rev,
                            GError **error);
void stow_hub_env_clear (StowHubEnv *h);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (StowHubEnv, stow_hub_env_clear)

/* TRUE for a full commit hash: 40 lowercase hex digits. */
gboolean stow_hub_is_commit (const char *rev);

/* The snapshot folder of @h->rev in the Hugging Face cache (refs/REV's
 * commit, or the revision itself when it is a commit), or NULL. */
char *stow_hub_hf_snapshot (const StowHubEnv *h);

/* {endpoint}/ORG/NAME/resolve/{@rev quoted}/{@file}. */
char *stow_hub_file_url (const StowHubEnv *h, const char *rev,
                         const char *file);

/* A transfer of @url with what every Hub request shares: the user agent,
 * http(s) only, the connect timeout, no signals, @errbuf
 * (CURL_ERROR_SIZE bytes) for the reason; and, when @with_token and @h
 * has one, "Authorization: Bearer" in *@headers (the caller frees the
 * list with curl_slist_free_all after the transfer).  NULL when libcurl
 * cannot start one. */
CURL *stow_hub_curl_new (const StowHubEnv *h, const char *url,
                         gboolean with_token, struct curl_slist **headers,
                         char *errbuf);

/* The value of header @name in the raw header line @line (@len bytes),
 * trimmed, or NULL when the line is another header. */
char *stow_hub_header_value (const char *line, gsize len, const char *name);

/* FALSE, with the one-line error for a transfer (of @what, a file or a
 * URL) that failed with @rc: a timeout, an unreachable endpoint, anything
 * else in libcurl's words (@errbuf, else its name for @rc). */
gboolean stow_hub_transport_error (const StowHubEnv *h, CURLcode rc,
                                   const char *errbuf, const char *what,
                                   GError **error);

/* FALSE, with the one-line error for HTTP @status (not 2xx) on @file
 * with the Hub's X-Error-Code @code (NULL when none): gated (with or
 * without a token), private, a missing revision, repository or file, a
 * server error; each says what to do. */
gboolean stow_hub_status_error (const StowHubEnv *h, long status,
                                const char *code, const char *file,
                                GError **error);

gboolean stow_hub_fail (GError **error, int code, const char *fmt, ...)
    G_GNUC_PRINTF (3, 4);

/* E (INVALID, "...", ...): sets *error in STOW_MODEL_ERROR and is FALSE. */
#define E(code, ...) stow_hub_fail (error, STOW_MODEL_ERROR_##code, __VA_ARGS__)

G_END_DECLS
