/* SPDX-License-Identifier: MIT
 *
 * models/hub.h: models by their Hugging Face Hub id (ORG/NAME).  The
 * config.json comes from the local Hugging Face cache, then stowage's own
 * cache, then HTTPS (libcurl) from HF_ENDPOINT; the checkpoint's
 * safetensors index or header, when there is one, checks the count.  Not a
 * downloader of weights: at most a safetensors header is read.
 */
#pragma once

#include "models/model.h"

G_BEGIN_DECLS

/* Limits on what the Hub may send for one file: configs are a few KiB, the
 * largest safetensors indices a few MiB; a safetensors header may be up to
 * 100 MB by its format, but we read only those within this bound. */
#define STOW_HUB_MAX_FILE_BYTES ((gsize)16 * 1024 * 1024)
/* The default for STOW_HUB_TIMEOUT (seconds per file). */
#define STOW_HUB_DEFAULT_TIMEOUT_S 30.0

/* TRUE when @s has the shape of a Hub repository id: ORG/NAME, each part
 * of letters, digits, '-', '_' and '.', neither starting nor ending with '-'
 * or '.', no "--" or "..", 96 characters at most (huggingface_hub's
 * validate_repo_id). */
gboolean stow_hub_is_repo_id (const char *s);

/* TRUE when @rev is a usable revision (a branch, tag or commit): 1 to 255
 * characters of letters, digits, '-', '_', '.' and '/', no "..", not
 * starting with '/' or '-'. */
gboolean stow_hub_is_revision (const char *rev);

/* Loads the model @repo_id (ORG/NAME) at @revision (NULL: "main").  The
 * model's name is @repo_id, its source the config.json file it was read
 * from (a cache file), hub_id and revision are set.  When a safetensors
 * index or header is at hand, a parameter count that disagrees with it is
 * a warning (g_warning), not an error.
 * Errors: STOW_MODEL_ERROR_INVALID (bad id, revision or environment
 * variable; a malformed config), _NOT_FOUND (missing repository, revision
 * or file; offline and not cached), _ACCESS (gated or private), _NETWORK
 * (timeout, no network, an unexpected HTTP status); every message is one
 * line that says what to do. */
StowModel *stow_hub_load_model (const char *repo_id, const char *revision,
                                GError **error);

G_END_DECLS
