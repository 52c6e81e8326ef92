/* SPDX-License-Identifier: MIT
 *
 * models/hub-download.h: a model's files from the Hub into the Hugging Face
 * cache, laid out as huggingface_hub lays them out, so that either tool
 * finds what the other downloaded.  Only the files training needs:
 * config.json, the safetensors weights and the tokenizer and generation
 * files; never pytorch_model.bin, never the whole repository.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The optional files fetched beside the config and the weights when the
 * repository has them, NULL ended. */
extern const char *const stow_hub_optional_files[];

/* One file's transfer, reported as it goes. */
typedef struct
{
  const char *repo;      /* ORG/NAME */
  const char *file;      /* the file in the repository */
  guint64 done_bytes;    /* on disk now, a resumed part included */
  guint64 total_bytes;   /* the Hub's size; 0 when it gave none */
  guint64 resumed_bytes; /* what an earlier, cut transfer had left */
  double elapsed_s;      /* since this transfer began */
  gboolean finished;     /* the last report: verified and in the cache */
} StowHubProgress;

typedef struct
{
  /* Called at most every 0.1 s while a file downloads, and once when it
   * is in place (finished); never for a file already in the cache.  NULL:
   * silent. */
  void (*progress) (const StowHubProgress *p, gpointer user);
  /* Called with the snapshot's config.json before any weights are
   * fetched, so that a model the caller cannot use fails before
   * gigabytes arrive.  NULL: no check. */
  gboolean (*check_config) (const char *config_path, gpointer user,
                            GError **error);
  gpointer user;
  /* The config and the optional files alone (a tokenizer's files for
   * `stowage tokenize`), no weights. */
  gboolean no_weights;
} StowHubDownload;

/* Returns the snapshot directory of @repo_id at @revision (NULL: "main")
 * in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub), holding
 * config.json, the weights (model.safetensors, or
 * model.safetensors.index.json and every shard it names) and those of
 * stow_hub_optional_files the repository has:
 *   models--ORG--NAME/blobs/ETAG            the contents
 *   models--ORG--NAME/snapshots/COMMIT/FILE -> ../../blobs/ETAG
 *   models--ORG--NAME/refs/REVISION         the commit
 *   models--ORG--NAME/.no_exist/COMMIT/FILE an optional file it lacks
 * When the cached snapshot has the config and the weights and each
 * optional file is there or known absent, no request is made.  Otherwise
 * (unless HF_HUB_OFFLINE) each missing file is asked for by HEAD and
 * fetched into blobs/ETAG.incomplete, resuming an earlier cut transfer by
 * HTTP Range; a complete file is checked against its etag (a sha256 for
 * LFS files, git's blob sha1 for the others) before it is renamed into
 * place.  Memory stays bounded: files stream to disk.
 * Errors (STOW_MODEL_ERROR): _INVALID (bad id, revision or environment;
 * a malformed index; an etag that cannot name a file), _NOT_FOUND (no such
 * repository, revision or weights; offline and the cache lacks a file,
 * named), _ACCESS (gated or private), _NETWORK (no answer, a cut transfer
 * (kept to resume), a checksum mismatch (nothing kept)), _IO (the cache
 * cannot be written); or the error @opts->check_config set. */
char *stow_hub_download_model (const char *repo_id, const char *revision,
                               const StowHubDownload *opts, GError **error);

G_END_DECLS
