/* SPDX-License-Identifier: MIT
 *
 * cli/model-source.h: what `train --model` and `init-model`'s argument
 * name, as files on disk: a local directory or config.json as given, or a
 * Hub id resolved through the Hugging Face cache (models/hub-download.h for
 * the weights, models/hub.h for a config alone).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The model directory (config.json and the safetensors) @arg names: an
 * existing directory as it is, or a Hub id's snapshot in the Hugging Face
 * cache, downloaded as needed with progress on stderr (a bar on a
 * terminal, a line per file otherwise, none with --quiet); its config is
 * checked to be one `train` runs before any weights are fetched.
 * @revision (NULL: main) only with a Hub id.  Errors name --model or
 * --revision and the value, or come from the Hub (STOW_MODEL_ERROR). */
char *stow_cli_model_dir (const char *arg, const char *revision,
                          GError **error);

/* The directory of the tokenizer files @arg names: an existing file or
 * directory as it is, or a Hub id's snapshot holding its config and
 * tokenizer files (no weights), downloaded as stow_cli_model_dir does.
 * Errors name --tokenizer and the value. */
char *stow_cli_tokenizer_source (const char *arg, const char *revision,
                                 GError **error);

/* The config.json file @arg names: a path as given (an existing one, or
 * anything that is not a Hub id: its reader says what is wrong), or a Hub
 * id's config.json from the caches or the Hub (models/hub.h; no weights).
 * @revision only with a Hub id. */
char *stow_cli_model_config (const char *arg, const char *revision,
                             GError **error);

G_END_DECLS
