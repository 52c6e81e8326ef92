/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-tokenize.c: "stowage tokenize": text and JSONL files to llm.c
 * token shards with the model's own tokenizer (data/tokenize.c), for
 * `stowage train --data`.  Prints what it wrote on stdout; a progress bar
 * on stderr when stderr is a terminal.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/corpus.h"
#include "cli/model-source.h"
#include "core/units.h"
#include "data/shards.h"
#include "data/tokenize.h"
#include "models/hub.h"

typedef struct
{
  gboolean tty;
  gint64 start_us, last_us;
} Progress;

static void
progress (const StowTokenizeProgress *p, gpointer user)
{
  Progress *pr = user;
  if (!pr->tty)
    return;
  gint64 now = g_get_monotonic_time ();
  /* Ten updates a second are enough for the eye. */
  if (now - pr->last_us < 100000 && p->bytes_done < p->bytes_total)
    return;
  pr->last_us = now;
  double frac
      = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
  guint filled = (guint)(20 * MIN (frac, 1.0));
  char bar[21];
  for (guint i = 0; i < 20; i++)
    bar[i] = i < filled ? '#' : '.';
  bar[20] = '\0';
  double s = MAX ((double)(now - pr->start_us) / 1e6, 1e-6);
  g_autofree char *done = stow_format_bytes (p->bytes_done);
  g_autofree char *tokens = stow_format_count_short (p->tokens);
  g_autofree char *rate = stow_format_bandwidth ((double)p->bytes_done / s);
  fprintf (stderr, "\r[%s] %3.0f%%  %s  %s tokens  %s\033[K", bar, 100.0 * frac,
           done, tokens, rate);
  fflush (stderr);
}

static gboolean
parse_fraction (const char *text, double *out)
{
  char *end;
  double v = g_ascii_strtod (text, &end);
  if (*text == '\0' || *end != '\0' || !isfinite (v) || v < 0 || v >= 1)
    return FALSE;
  *out = v;
  return TRUE;
}

static gboolean
parse_u64 (const char *text, guint64 *out)
{
  return g_ascii_string_to_unsigned (text, 10, 0, G_MAXUINT64, out, NULL);
}

int
stow_cmd_tokenize (int argc, char **argv)
{
  g_autofree char *tok_path = NULL, *out = NULL, *format = NULL;
  g_autofree char *text_field = NULL, *prompt_field = NULL;
  g_autofree char *completion_field = NULL, *threads_s = NULL;
  g_autofree char *val_s = NULL, *seed_s = NULL;
  gboolean split_lines = FALSE;
  const GOptionEntry entries[] = {
    { "tokenizer", 0, 0, G_OPTION_ARG_FILENAME, &tok_path,
      "The model's directory (its tokenizer.json, tokenizer_config.json, "
      "generation_config.json), a tokenizer.json, or a Hub id whose "
      "tokenizer files are fetched into the Hugging Face cache (required)",
      "DIR|FILE|ORG/NAME" },
    { "out", 0, 0, G_OPTION_ARG_FILENAME, &out,
      "Write PREFIX_train.bin (and PREFIX_val.bin, PREFIX_*.mask) "
      "(required)",
      "PREFIX" },
    { "split-lines", 0, 0, G_OPTION_ARG_NONE, &split_lines,
      "Text files: one document per line, blank lines skipped (default: "
      "one document per file)",
      NULL },
    { "format", 0, 0, G_OPTION_ARG_STRING, &format,
      "auto, text or jsonl (default auto: jsonl for .jsonl and .ndjson)", "F" },
    { "text-field", 0, 0, G_OPTION_ARG_STRING, &text_field,
      "JSONL: the field that holds a document's text (default text)", "NAME" },
    { "prompt-field", 0, 0, G_OPTION_ARG_STRING, &prompt_field,
      "JSONL: the prompt of prompt/completion records (default prompt); a "
      "file whose first record has both is fine-tuning data, trained on "
      "its completions only (loss masks beside the shards)",
      "NAME" },
    { "completion-field", 0, 0, G_OPTION_ARG_STRING, &completion_field,
      "JSONL: the completion (default completion)", "NAME" },
    { "threads", 0, 0, G_OPTION_ARG_STRING, &threads_s,
      "Tokenizer threads (default: one per core); the output is the same "
      "for any number",
      "N" },
    { "val-fraction", 0, 0, G_OPTION_ARG_STRING, &val_s,
      "Hold out this fraction of the documents, chosen by --seed, in "
      "PREFIX_val.bin (default 0: none)",
      "F" },
    { "seed", 0, 0, G_OPTION_ARG_STRING, &seed_s,
      "Seed of the held-out choice (default 0)", "N" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "tokenize", "INPUTS...",
      "Tokenize text and JSONL files with a model's own tokenizer into "
      "llm.c token shards for `stowage train --data`: uint16 tokens when "
      "the vocabulary fits, uint32 otherwise; each document as [BOS, when "
      "the tokenizer adds it] + its tokens + EOS.  The ids are those of HF "
      "tokenizers.  Nothing is written unless every input is good.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!stow_cli_parse (ctx, "tokenize", &argc, &argv))
    return STOW_EXIT_FAILURE;
  const char *hint = "see 'stowage tokenize --help'";
  if (tok_path == NULL)
    return stow_cli_failf (hint, "tokenize: --tokenizer DIR|FILE is required");
  if (out == NULL)
    return stow_cli_failf (hint, "tokenize: --out PREFIX is required");
  if (argc < 2)
    return stow_cli_failf (hint, "tokenize: no input files");

  StowTokenizeJob job = {
    .inputs = (const char *const *)argv + 1,
    .out_prefix = out,
    .format = STOW_INPUT_AUTO,
    .split_lines = split_lines,
    .fields
    = { .text = text_field ? text_field : "text",
        .prompt = prompt_field ? prompt_field : "prompt",
        .completion = completion_field ? completion_field : "completion" },
  };
  if (format != NULL)
    {
      if (strcmp (format, "auto") == 0)
        job.format = STOW_INPUT_AUTO;
      else if (strcmp (format, "text") == 0)
        job.format = STOW_INPUT_TEXT;
      else if (strcmp (format, "jsonl") == 0)
        job.format = STOW_INPUT_JSONL;
      else
        return stow_cli_failf (hint,
                               "tokenize: --format \"%s\": expected auto, "
                               "text or jsonl",
                               format);
    }
  guint64 v;
  if (threads_s != NULL)
    {
      if (!parse_u64 (threads_s, &v) || v == 0 || v > 1024)
        return stow_cli_failf (hint,
                               "tokenize: --threads \"%s\": expected a whole "
                               "number from 1 to 1024",
                               threads_s);
      job.threads = (guint)v;
    }
  if (val_s != NULL && !parse_fraction (val_s, &job.val_fraction))
    return stow_cli_failf (hint,
                           "tokenize: --val-fraction \"%s\": expected a "
                           "number in [0, 1)",
                           val_s);
  if (seed_s != NULL && !parse_u64 (seed_s, &job.seed))
    return stow_cli_failf (
        hint, "tokenize: --seed \"%s\": expected a whole number", seed_s);
  if (split_lines && job.format == STOW_INPUT_JSONL)
    return stow_cli_failf (hint, "tokenize: --split-lines is for text files; "
                                 "JSONL is one document per line already");

  g_autoptr (GError) error = NULL;
  /* A Hub id: its tokenizer files, fetched into the Hugging Face cache
   * where `train --model` finds them (with the weights then). */
  g_autofree char *tok_dir = stow_cli_tokenizer_source (tok_path, NULL, &error);
  if (tok_dir == NULL)
    return stow_cli_fail (error, NULL);
  g_autoptr (StowHfTokenizer) t
      = stow_cli_tokenizer_open (tok_dir, &job.bos_id, &job.eos_id, &error);
  if (t == NULL)
    return stow_cli_fail (error, NULL);
  job.tokenizer = t;

  Progress pr = { .tty = isatty (2), .start_us = g_get_monotonic_time () };
  job.progress = progress;
  job.user = &pr;
  /* --out data/qa: the folder made for it, and taken away again when
   * nothing was written there. */
  g_autofree char *out_dir = g_path_get_dirname (out);
  gboolean made = !g_file_test (out_dir, G_FILE_TEST_IS_DIR);
  if (made && g_mkdir_with_parents (out_dir, 0755) != 0)
    return stow_cli_failf (NULL, "tokenize: --out \"%s\": %s", out,
                           g_strerror (errno));
  StowTokenizeResult r;
  gboolean ok = stow_tokenize_corpus (&job, &r, &error);
  if (pr.tty)
    fprintf (stderr, "\r\033[K");
  if (!ok)
    {
      if (made)
        g_rmdir (out_dir);
      return stow_cli_fail (error, NULL);
    }

  char count[STOW_FORMAT_BUF], docs[STOW_FORMAT_BUF];
  printf ("tokenizer: %s, %u ids: uint%u tokens; each document: ",
          stow_hf_tokenizer_name (t), stow_hf_tokenizer_n_ids (t),
          r.token_bytes * 8);
  if (job.bos_id >= 0)
    printf ("%s + ", stow_hf_tokenizer_id_to_token (t, (guint32)job.bos_id));
  printf ("its tokens + %s\n",
          stow_hf_tokenizer_id_to_token (t, (guint32)job.eos_id));
  for (guint k = 0; k < 2; k++)
    {
      if (r.shard[k] == NULL)
        continue;
      printf ("wrote %s: %s tokens, %s documents\n", r.shard[k],
              stow_format_grouped_into (count, sizeof count, r.tokens[k]),
              stow_format_grouped_into (docs, sizeof docs, r.documents[k]));
      if (r.mask[k])
        printf ("wrote %s: the loss mask (prompt tokens 0)\n", r.mask[k]);
    }
  if (job.val_fraction > 0 && r.documents[1] == 0)
    fprintf (stderr,
             "stowage: warning: --val-fraction %g held out no "
             "document of %" G_GUINT64_FORMAT "\n",
             job.val_fraction, r.documents[0]);
  double s = (double)(g_get_monotonic_time () - pr.start_us) / 1e6;
  g_info ("tokenized in %.2f s with %u threads", s, r.threads);
  stow_tokenize_result_clear (&r);
  return STOW_EXIT_OK;
}
