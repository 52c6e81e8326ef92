/* SPDX-License-Identifier: MIT
 *
 * cli/model-source.c: `--model DIR|ORG/NAME` and init-model's argument as
 * files on disk (cli/model-source.h), and the download's progress on
 * stderr.
 */
#include "cli/model-source.h"

#include <stdio.h>
#include <unistd.h>

#include "core/log.h"
#include "core/units.h"
#include "executor/llama.h"
#include "models/hub-download.h"
#include "models/hub.h"

/* --revision with something that is not a Hub id. */
static gboolean
revision_needs_hub_id (const char *arg, const char *what, GError **error)
{
  g_autofree char *esc = g_strescape (arg, NULL);
  g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,
               "--revision applies to Hub ids (ORG/NAME); \"%.80s\" is %s", esc,
               what);
  return FALSE;
}

/* ---- progress --------------------------------------------------------- */

typedef struct
{
  gboolean tty, quiet;
} Bar;

#define BAR_CELLS 20

static void
on_progress (const StowHubProgress *p, gpointer user)
{
  const Bar *b = user;
  if (b->quiet || (!b->tty && !p->finished))
    return;
  char done[STOW_FORMAT_BUF], total[STOW_FORMAT_BUF], rate[STOW_FORMAT_BUF];
  stow_format_bytes_into (done, sizeof done, p->done_bytes);
  stow_format_bytes_into (total, sizeof total, p->total_bytes);
  /* This transfer's bytes over its time: a resumed part came earlier. */
  double bytes = (double)(p->done_bytes - p->resumed_bytes);
  stow_format_bytes_into (rate, sizeof rate,
                          p->elapsed_s > 0 ? (guint64)(bytes / p->elapsed_s)
                                           : 0);
  if (b->tty)
    {
      GString *line = g_string_new ("\r");
      g_string_append_printf (line, "%s  [", p->file);
      guint filled = p->total_bytes
                         ? (guint)(BAR_CELLS * p->done_bytes / p->total_bytes)
                         : 0;
      for (guint i = 0; i < BAR_CELLS; i++)
        g_string_append_c (line, i < filled ? '#' : '.');
      g_string_append_printf (line, "]  %s / %s  %s/s\033[K%s", done,
                              p->total_bytes ? total : "?", rate,
                              p->finished ? "\n" : "");
      fputs (line->str, stderr);
      g_string_free (line, TRUE);
      fflush (stderr);
      return;
    }
  char resumed[STOW_FORMAT_BUF] = "";
  if (p->resumed_bytes > 0)
    {
      char r[STOW_FORMAT_BUF];
      g_snprintf (resumed, sizeof resumed, ", resumed at %s",
                  stow_format_bytes_into (r, sizeof r, p->resumed_bytes));
    }
  fprintf (stderr, "%s: downloaded %s, %s in %.1f s (%s/s%s)\n", p->repo,
           p->file, done, p->elapsed_s, rate, resumed);
}

/* ---- train's directory ------------------------------------------------ */

/* A model train runs (a LLaMA-family config), checked before the weights
 * are fetched. */
static gboolean
check_trainable (const char *config_path, gpointer user, GError **error)
{
  g_autoptr (StowModel) m = stow_model_new_from_file (config_path, error);
  StowLlamaConfig lc;
  return m != NULL && stow_llama_config_from_model (m, &lc, error);
}

char *
stow_cli_model_dir (const char *arg, const char *revision, GError **error)
{
  g_return_val_if_fail (arg != NULL, NULL);
  if (g_file_test (arg, G_FILE_TEST_IS_DIR))
    {
      if (revision != NULL)
        return revision_needs_hub_id (arg, "a directory", error), NULL;
      return g_strdup (arg);
    }
  if (!stow_hub_is_repo_id (arg))
    {
      g_autofree char *esc = g_strescape (arg, NULL);
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                   "--model \"%.100s\": %s, and not a Hub id (ORG/NAME)", esc,
                   g_file_test (arg, G_FILE_TEST_EXISTS)
                       ? "not a directory (config.json and the safetensors)"
                       : "no such directory");
      return NULL;
    }
  Bar bar = { isatty (2), stow_log_get_level () == STOW_LOG_QUIET };
  StowHubDownload how = {
    .progress = on_progress,
    .check_config = check_trainable,
    .user = &bar,
  };
  return stow_hub_download_model (arg, revision, &how, error);
}

char *
stow_cli_tokenizer_source (const char *arg, const char *revision,
                           GError **error)
{
  g_return_val_if_fail (arg != NULL, NULL);
  if (g_file_test (arg, G_FILE_TEST_EXISTS) || !stow_hub_is_repo_id (arg))
    {
      if (revision != NULL)
        return revision_needs_hub_id (arg, "a file or directory", error), NULL;
      return g_strdup (arg);
    }
  Bar bar = { isatty (2), stow_log_get_level () == STOW_LOG_QUIET };
  StowHubDownload how = {
    .progress = on_progress,
    .user = &bar,
    .no_weights = TRUE,
  };
  return stow_hub_download_model (arg, revision, &how, error);
}

/* ---- init-model's config ------------------------------------------------ */

char *
stow_cli_model_config (const char *arg, const char *revision, GError **error)
{
  g_return_val_if_fail (arg != NULL, NULL);
  if (g_file_test (arg, G_FILE_TEST_EXISTS) || !stow_hub_is_repo_id (arg))
    {
      if (revision != NULL)
        return revision_needs_hub_id (arg, "a file", error), NULL;
      return g_strdup (arg);
    }
  g_autoptr (StowModel) m = stow_hub_load_model (arg, revision, error);
  if (m == NULL)
    return NULL;
  /* hub.c reads it from a cache file, or caches what it fetched. */
  if (m->source == NULL || !g_file_test (m->source, G_FILE_TEST_IS_REGULAR))
    {
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_IO,
                   "%s: config.json could not be cached (%s): check that "
                   "the cache folder is writable",
                   arg, m->source ? m->source : "no file");
      return NULL;
    }
  return g_strdup (m->source);
}
