/* SPDX-License-Identifier: MIT
 *
 * cli/corpus.c: text and JSONL to token shards for train (corpus.h).
 */
#include "cli/corpus.h"
#include "cli/model-source.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "core/error.h"
#include "executor/train.h"

/* The only special added token, which ends documents when no config names
 * an EOS (a bare tokenizer.json, as GPT-2's <|endoftext|>). */
static gint64
sole_special (StowHfTokenizer *t)
{
  gint64 found = -1;
  for (guint32 id = 0; id < stow_hf_tokenizer_n_ids (t); id++)
    if (stow_hf_tokenizer_is_special (t, id))
      {
        if (found >= 0)
          return -1;
        found = id;
      }
  return found;
}

StowHfTokenizer *
stow_cli_tokenizer_open (const char *path, gint64 *bos, gint64 *eos,
                         GError **error)
{
  g_autoptr (StowHfTokenizer) t = stow_hf_tokenizer_new_from_path (path, error);
  if (t == NULL)
    return NULL;
  *bos = stow_hf_tokenizer_adds_bos (t) ? stow_hf_tokenizer_bos_id (t) : -1;
  *eos = stow_hf_tokenizer_eos_id (t);
  if (*eos >= 0)
    return g_steal_pointer (&t);
  *eos = sole_special (t);
  if (*eos < 0)
    {
      g_set_error (error, STOW_TOKENIZER_ERROR,
                   STOW_TOKENIZER_ERROR_UNSUPPORTED,
                   "%s names no EOS token, and documents need one to end "
                   "with: pass a model directory whose tokenizer_config.json "
                   "names eos_token",
                   stow_hf_tokenizer_name (t));
      return NULL;
    }
  fprintf (stderr,
           "stowage: %s names no EOS token (no tokenizer_config.json): "
           "documents end with its only special token \"%s\" (%" G_GINT64_FORMAT
           ")\n",
           stow_hf_tokenizer_name (t),
           stow_hf_tokenizer_id_to_token (t, (guint32)*eos), *eos);
  return g_steal_pointer (&t);
}

static gint
by_name (gconstpointer a, gconstpointer b)
{
  return strcmp (*(char *const *)a, *(char *const *)b);
}

/* The files @spec names (paths, globs, joined by ','), in the order the
 * trainer reads them (sorted), each once. */
static char **
spec_files (const char *flag, const char *spec, GError **error)
{
  g_autoptr (GPtrArray) files = g_ptr_array_new_with_free_func (g_free);
  g_auto (GStrv) parts = g_strsplit (spec, ",", -1);
  for (guint i = 0; parts[i] != NULL; i++)
    {
      if (parts[i][0] == '\0')
        continue;
      glob_t g;
      int rc = glob (parts[i], GLOB_NOCHECK, NULL, &g);
      if (rc != 0)
        {
          g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
                       "%s %s: cannot expand \"%s\"", flag, spec, parts[i]);
          return NULL;
        }
      for (gsize k = 0; k < g.gl_pathc; k++)
        g_ptr_array_add (files, g_strdup (g.gl_pathv[k]));
      globfree (&g);
    }
  g_ptr_array_sort (files, by_name);
  for (guint i = 1; i < files->len;)
    if (g_str_equal (files->pdata[i], files->pdata[i - 1]))
      g_ptr_array_remove_index (files, i);
    else
      i++;
  g_ptr_array_add (files, NULL);
  return (char **)g_ptr_array_free (g_steal_pointer (&files), FALSE);
}

/* Adds @path's bytes (when it exists) to @sum. */
static void
hash_file (GChecksum *sum, const char *path)
{
  g_autofree char *data = NULL;
  gsize n = 0;
  if (!g_file_get_contents (path, &data, &n, NULL))
    return;
  g_checksum_update (sum, (const guchar *)path, strlen (path) + 1);
  g_checksum_update (sum, (const guchar *)data, n);
}

/* The cache key: the tokenizer's files (what decides the ids and the
 * document ends) and each input's name, size and modification time. */
static char *
cache_key (const char *tok_path, char **inputs, GError **error)
{
  g_autoptr (GChecksum) sum = g_checksum_new (G_CHECKSUM_SHA256);
  g_checksum_update (sum, (const guchar *)"stowage-tokens-1", 17);
  if (g_file_test (tok_path, G_FILE_TEST_IS_DIR))
    {
      static const char *const files[]
          = { "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "config.json" };
      for (guint i = 0; i < G_N_ELEMENTS (files); i++)
        {
          g_autofree char *p = g_build_filename (tok_path, files[i], NULL);
          hash_file (sum, p);
        }
    }
  else
    hash_file (sum, tok_path);
  for (guint i = 0; inputs[i] != NULL; i++)
    {
      struct stat sb;
      if (stat (inputs[i], &sb) != 0)
        {
          int e = errno;
          g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO, "%s: %s",
                       inputs[i], g_strerror (e));
          return NULL;
        }
      g_autofree char *abs = g_canonicalize_filename (inputs[i], NULL);
      g_autofree char *stamp = g_strdup_printf (
          "%s\n%" G_GINT64_FORMAT "\n%" G_GINT64_FORMAT ".%09ld\n", abs,
          (gint64)sb.st_size, (gint64)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
      g_checksum_update (sum, (const guchar *)stamp, strlen (stamp));
    }
  return g_strndup (g_checksum_get_string (sum), 16);
}

char *
stow_cli_train_tokens (const char *flag, const char *spec,
                       const char *tokenizer, const char *model_dir,
                       guint threads, GError **error)
{
  g_return_val_if_fail (flag != NULL && spec != NULL, NULL);
  g_auto (GStrv) inputs = spec_files (flag, spec, error);
  if (inputs == NULL)
    return NULL;
  guint n_bin = 0, n = g_strv_length (inputs);
  for (guint i = 0; i < n; i++)
    n_bin += g_str_has_suffix (inputs[i], ".bin");
  if (n == 0 || n_bin == n)
    return NULL; /* shards (or nothing: the trainer says so) */
  if (n_bin > 0)
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s %s: token shards (*.bin) and text or JSONL files "
                   "mixed; pass one kind",
                   flag, spec);
      return NULL;
    }
  g_autofree char *named
      = tokenizer ? stow_cli_tokenizer_source (tokenizer, NULL, error) : NULL;
  if (tokenizer && named == NULL)
    return NULL;
  const char *tok_path = named ? named : model_dir;
  g_autofree char *tok_json
      = g_file_test (tok_path, G_FILE_TEST_IS_DIR)
            ? g_build_filename (tok_path, "tokenizer.json", NULL)
            : g_strdup (tok_path);
  if (!g_file_test (tok_json, G_FILE_TEST_EXISTS))
    {
      g_set_error (error, STOW_TRAIN_ERROR, STOW_TRAIN_ERROR_INVALID,
                   "%s %s: text to tokenize, and %s has no tokenizer.json: "
                   "pass --tokenizer DIR|FILE (the model's tokenizer), or "
                   "--tokenizer bytes (one token per byte)",
                   flag, spec, tok_path);
      return NULL;
    }
  g_autofree char *key = cache_key (tok_path, inputs, error);
  if (key == NULL)
    return NULL;
  g_autofree char *dir = g_build_filename (g_get_user_cache_dir (), "stowage",
                                           "tokens", key, NULL);
  g_autofree char *prefix = g_build_filename (dir, "data", NULL);
  char *shard = g_strconcat (prefix, "_train.bin", NULL);
  if (g_file_test (shard, G_FILE_TEST_IS_REGULAR))
    {
      fprintf (stderr, "%s: tokens of %s, tokenized before: %s\n", flag, spec,
               shard);
      return shard;
    }
  g_free (shard);
  if (g_mkdir_with_parents (dir, 0755) != 0)
    {
      int e = errno;
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO, "%s: %s", dir,
                   g_strerror (e));
      return NULL;
    }
  gint64 bos = -1, eos = -1;
  g_autoptr (StowHfTokenizer) t
      = stow_cli_tokenizer_open (tok_path, &bos, &eos, error);
  if (t == NULL)
    return NULL;
  StowTokenizeJob job = {
    .tokenizer = t,
    .inputs = (const char *const *)inputs,
    .out_prefix = prefix,
    .format = STOW_INPUT_AUTO,
    .fields
    = { .text = "text", .prompt = "prompt", .completion = "completion" },
    .threads = threads,
    .bos_id = bos,
    .eos_id = eos,
  };
  StowTokenizeResult r;
  gint64 t0 = g_get_monotonic_time ();
  if (!stow_tokenize_corpus (&job, &r, error))
    {
      g_prefix_error (error, "%s: ", flag);
      g_rmdir (dir); /* empty: the tokenizer left nothing */
      return NULL;
    }
  fprintf (stderr,
           "%s: %s tokenized with %s: %" G_GUINT64_FORMAT " documents, "
           "%" G_GUINT64_FORMAT " tokens%s in %.1f s (%s)\n",
           flag, spec, stow_hf_tokenizer_name (t), r.documents[0], r.tokens[0],
           r.mask[0] ? ", prompts masked" : "",
           (double)(g_get_monotonic_time () - t0) / 1e6, r.shard[0]);
  shard = g_strdup (r.shard[0]);
  stow_tokenize_result_clear (&r);
  return shard;
}
