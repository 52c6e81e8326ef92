/* SPDX-License-Identifier: MIT
 *
 * data/tokenize.c: a corpus to shards (see tokenize.h).  The calling
 * thread reads records into batches and writes finished batches in order;
 * workers parse and encode batches.  At most a few batches per worker are
 * in flight, which bounds memory; a batch's documents keep their order and
 * their train/val split is decided when they are read, so the output does
 * not depend on the threads.
 */
#include "data/tokenize.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "data/shards.h"

/* A batch closes at this much text or this many documents. */
#define BATCH_BYTES   ((gsize)1 << 20)
#define BATCH_RECORDS 8192
/* Batches in flight per worker. */
#define BATCHES_PER_THREAD 2

typedef struct
{
  guint file;
  guint64 line;
  gsize off, len;
  char *owned; /* a whole file's text, instead of the arena */
  gboolean val;
} Rec;

typedef struct
{
  GByteArray *arena;
  GArray *recs;
  guint64 bytes_end; /* input bytes read when the batch closed */
  /* Outputs, [0] train and [1] val. */
  GArray *ids[2];
  GByteArray *mask[2];
  guint64 docs[2];
  GError *error;
  gboolean done;
} Batch;

typedef struct
{
  const StowTokenizeJob *job;
  StowDocKind *kinds; /* per input */
  gboolean masked;
  GAsyncQueue *todo;
  GMutex lock;
  GCond cond;
} Shared;

static Batch stop_batch; /* tells a worker to finish */

static Batch *
batch_new (void)
{
  Batch *b = g_new0 (Batch, 1);
  b->arena = g_byte_array_new ();
  b->recs = g_array_new (FALSE, FALSE, sizeof (Rec));
  for (guint s = 0; s < 2; s++)
    {
      b->ids[s] = g_array_new (FALSE, FALSE, sizeof (guint32));
      b->mask[s] = g_byte_array_new ();
    }
  return b;
}

static void
batch_free (Batch *b)
{
  if (b == NULL)
    return;
  for (guint i = 0; i < b->recs->len; i++)
    g_free (g_array_index (b->recs, Rec, i).owned);
  g_byte_array_unref (b->arena);
  g_array_unref (b->recs);
  for (guint s = 0; s < 2; s++)
    {
      g_array_unref (b->ids[s]);
      g_byte_array_unref (b->mask[s]);
    }
  g_clear_error (&b->error);
  g_free (b);
}

/* Held out for validation: a seeded hash of the document's index below
 * @fraction (SplitMix64's finaliser, uniform to 2^-53). */
static gboolean
held_out (guint64 seed, guint64 index, double fraction)
{
  if (fraction <= 0)
    return FALSE;
  guint64 x = seed + 0x9e3779b97f4a7c15ULL * (index + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return (double)(x >> 11) * 0x1.0p-53 < fraction;
}

static void
append_mask (GByteArray *m, guint8 v, gsize n)
{
  gsize at = m->len;
  g_byte_array_set_size (m, (guint)(at + n));
  memset (m->data + at, v, n);
}

/* One document's ids and mask: [BOS] + tokens + [EOS].  A prompt and
 * completion are tokenized together, and the prompt's tokens (the first
 * len(encode(prompt)) of them, as TRL's SFTTrainer counts) and BOS are
 * masked out; EOS counts, so that the model learns to stop. */
static gboolean
encode_document (const Shared *s, StowHfEncoder *e, const StowDocument *d,
                 GArray *ids, GByteArray *mask, GArray *scratch,
                 GString *joined, GError **error)
{
  const StowTokenizeJob *job = s->job;
  guint start = ids->len;
  if (job->bos_id >= 0)
    {
      guint32 bos = (guint32)job->bos_id;
      g_array_append_val (ids, bos);
    }
  guint body = ids->len;
  guint prompt_tokens = 0;
  if (d->prompt != NULL)
    {
      g_string_truncate (joined, 0);
      g_string_append_len (joined, d->prompt, (gssize)d->prompt_len);
      g_string_append_len (joined, d->text, (gssize)d->text_len);
      if (!stow_hf_encoder_encode (e, joined->str, (gssize)joined->len, FALSE,
                                   ids, error))
        return FALSE;
      g_array_set_size (scratch, 0);
      if (!stow_hf_encoder_encode (e, d->prompt, (gssize)d->prompt_len, FALSE,
                                   scratch, error))
        return FALSE;
      prompt_tokens = MIN (scratch->len, ids->len - body);
    }
  else if (!stow_hf_encoder_encode (e, d->text, (gssize)d->text_len, FALSE, ids,
                                    error))
    return FALSE;
  guint32 eos = (guint32)job->eos_id;
  g_array_append_val (ids, eos);
  if (s->masked)
    {
      append_mask (mask, 0, (body - start) + prompt_tokens);
      append_mask (mask, 1, ids->len - body - prompt_tokens);
    }
  return TRUE;
}

static void
process_batch (const Shared *s, StowHfEncoder *e, Batch *b)
{
  const StowTokenizeJob *job = s->job;
  g_autoptr (GArray) scratch = g_array_new (FALSE, FALSE, sizeof (guint32));
  g_autoptr (GString) joined = g_string_new (NULL);
  for (guint i = 0; i < b->recs->len; i++)
    {
      const Rec *r = &g_array_index (b->recs, Rec, i);
      const char *path = job->inputs[r->file];
      const char *text
          = r->owned ? r->owned : (const char *)b->arena->data + r->off;
      StowDocument d;
      if (!stow_document_parse (s->kinds[r->file], &job->fields, text, r->len,
                                path, r->line, &d, &b->error))
        return;
      guint k = r->val ? 1 : 0;
      gboolean ok = encode_document (s, e, &d, b->ids[k], b->mask[k], scratch,
                                     joined, &b->error);
      stow_document_clear (&d);
      if (!ok)
        {
          if (r->line)
            g_prefix_error (&b->error, "%s:%" G_GUINT64_FORMAT ": ", path,
                            r->line);
          else
            g_prefix_error (&b->error, "%s: ", path);
          return;
        }
      b->docs[k]++;
    }
}

static gpointer
worker (gpointer data)
{
  Shared *s = data;
  g_autoptr (StowHfEncoder) e = stow_hf_encoder_new (s->job->tokenizer);
  for (;;)
    {
      Batch *b = g_async_queue_pop (s->todo);
      if (b == &stop_batch)
        break;
      process_batch (s, e, b);
      g_mutex_lock (&s->lock);
      b->done = TRUE;
      g_cond_broadcast (&s->cond);
      g_mutex_unlock (&s->lock);
    }
  return NULL;
}

typedef struct
{
  Shared shared;
  StowShardWriter *writer[2];
  StowTokenizeResult *result;
  StowTokenizeProgress progress;
  GThread **threads;
  guint n_threads;
  StowHfEncoder *inline_encoder; /* one thread: no workers */
  GQueue in_flight;
} Run;

static gboolean
write_batch (Run *run, Batch *b, GError **error)
{
  if (b->error != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&b->error));
      return FALSE;
    }
  for (guint k = 0; k < 2; k++)
    {
      if (b->ids[k]->len == 0)
        continue;
      if (!stow_shard_writer_append (
              run->writer[k], (const guint32 *)b->ids[k]->data,
              run->shared.masked ? b->mask[k]->data : NULL, b->ids[k]->len,
              error))
        return FALSE;
      run->result->documents[k] += b->docs[k];
      run->result->tokens[k] += b->ids[k]->len;
      run->progress.documents += b->docs[k];
      run->progress.tokens += b->ids[k]->len;
    }
  run->progress.bytes_done = b->bytes_end;
  if (run->shared.job->progress)
    run->shared.job->progress (&run->progress, run->shared.job->user);
  return TRUE;
}

/* Waits for the oldest batch in flight, writes and frees it. */
static gboolean
retire_oldest (Run *run, GError **error)
{
  Batch *b = g_queue_pop_head (&run->in_flight);
  g_mutex_lock (&run->shared.lock);
  while (!b->done)
    g_cond_wait (&run->shared.cond, &run->shared.lock);
  g_mutex_unlock (&run->shared.lock);
  gboolean ok = write_batch (run, b, error);
  batch_free (b);
  return ok;
}

static gboolean
submit (Run *run, Batch *b, GError **error)
{
  if (run->n_threads == 0)
    {
      process_batch (&run->shared, run->inline_encoder, b);
      gboolean ok = write_batch (run, b, error);
      batch_free (b);
      return ok;
    }
  g_queue_push_tail (&run->in_flight, b);
  g_async_queue_push (run->shared.todo, b);
  while (run->in_flight.length >= BATCHES_PER_THREAD * run->n_threads)
    if (!retire_oldest (run, error))
      return FALSE;
  return TRUE;
}

static void
stop_workers (Run *run)
{
  for (guint i = 0; i < run->n_threads; i++)
    g_async_queue_push (run->shared.todo, &stop_batch);
  for (guint i = 0; i < run->n_threads; i++)
    g_thread_join (run->threads[i]);
  run->n_threads = 0;
  Batch *b;
  while ((b = g_queue_pop_head (&run->in_flight)))
    batch_free (b);
}

static char *
out_name (const char *prefix, const char *split, const char *ext)
{
  return g_strdup_printf ("%s_%s.%s", prefix, split, ext);
}

/* Reads every input into batches and submits them. */
static gboolean
read_inputs (Run *run, const guint64 *sizes, GError **error)
{
  const StowTokenizeJob *job = run->shared.job;
  guint64 before = 0, index = 0;
  Batch *b = batch_new ();
  for (guint f = 0; job->inputs[f]; f++)
    {
      gboolean whole
          = run->shared.kinds[f] == STOW_DOC_TEXT && !job->split_lines;
      g_autoptr (StowRecordReader) r
          = stow_record_reader_open (job->inputs[f], whole, error);
      if (r == NULL)
        {
          batch_free (b);
          return FALSE;
        }
      const char *rec;
      gsize len;
      guint64 line, n_records = 0;
      while (stow_record_reader_next (r, &rec, &len, &line, error))
        {
          Rec x = { .file = f,
                    .line = line,
                    .len = len,
                    .val = held_out (job->seed, index++, job->val_fraction) };
          if (whole)
            x.owned = stow_record_reader_steal (r);
          else
            {
              x.off = b->arena->len;
              g_byte_array_append (b->arena, (const guint8 *)rec, (guint)len);
            }
          g_array_append_val (b->recs, x);
          n_records++;
          b->bytes_end = before + stow_record_reader_offset (r);
          if (b->arena->len >= BATCH_BYTES || b->recs->len >= BATCH_RECORDS
              || whole)
            {
              Batch *full = b;
              b = batch_new ();
              if (!submit (run, full, error))
                {
                  batch_free (b);
                  return FALSE;
                }
            }
        }
      if (error && *error)
        {
          batch_free (b);
          return FALSE;
        }
      if (n_records == 0)
        {
          g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_EMPTY,
                       "%s: no document: the file is empty", job->inputs[f]);
          batch_free (b);
          return FALSE;
        }
      before += sizes[f];
    }
  if (b->recs->len == 0)
    {
      batch_free (b);
      return TRUE;
    }
  return submit (run, b, error);
}

void
stow_tokenize_result_clear (StowTokenizeResult *r)
{
  for (guint k = 0; k < 2; k++)
    {
      g_clear_pointer (&r->shard[k], g_free);
      g_clear_pointer (&r->mask[k], g_free);
    }
  memset (r, 0, sizeof *r);
}

gboolean
stow_tokenize_corpus (const StowTokenizeJob *job, StowTokenizeResult *result,
                      GError **error)
{
  g_return_val_if_fail (job != NULL && job->tokenizer != NULL
                            && job->inputs != NULL && job->out_prefix != NULL
                            && job->eos_id >= 0,
                        FALSE);
  g_return_val_if_fail (job->val_fraction >= 0 && job->val_fraction < 1, FALSE);
  memset (result, 0, sizeof *result);
  guint n_inputs = g_strv_length ((char **)job->inputs);
  Run run = { .result = result };
  run.shared.job = job;
  g_autofree StowDocKind *kinds = g_new0 (StowDocKind, MAX (n_inputs, 1));
  g_autofree guint64 *sizes = g_new0 (guint64, MAX (n_inputs, 1));
  run.shared.kinds = kinds;
  for (guint f = 0; f < n_inputs; f++)
    {
      const char *path = job->inputs[f];
      GStatBuf st;
      if (g_stat (path, &st) != 0 || !S_ISREG (st.st_mode))
        {
          int err = errno;
          g_set_error (error, STOW_DOCS_ERROR, STOW_DOCS_ERROR_IO, "%s: %s",
                       path,
                       g_stat (path, &st) != 0 ? g_strerror (err)
                                               : "not a regular file");
          return FALSE;
        }
      sizes[f] = (guint64)st.st_size;
      run.progress.bytes_total += sizes[f];
      gboolean jsonl = job->format == STOW_INPUT_JSONL
                       || (job->format == STOW_INPUT_AUTO
                           && (g_str_has_suffix (path, ".jsonl")
                               || g_str_has_suffix (path, ".ndjson")));
      kinds[f] = STOW_DOC_TEXT;
      if (jsonl && !stow_jsonl_detect (path, &job->fields, &kinds[f], error))
        return FALSE;
      run.shared.masked = run.shared.masked || kinds[f] == STOW_DOC_JSONL_SFT;
    }

  result->token_bytes
      = stow_shard_token_bytes (stow_hf_tokenizer_n_ids (job->tokenizer));
  guint n_splits = job->val_fraction > 0 ? 2 : 1;
  static const char *splits[] = { "train", "val" };
  for (guint k = 0; k < n_splits; k++)
    {
      result->shard[k] = out_name (job->out_prefix, splits[k], "bin");
      if (run.shared.masked)
        result->mask[k] = out_name (job->out_prefix, splits[k], "mask");
      run.writer[k] = stow_shard_writer_new (result->shard[k], result->mask[k],
                                             result->token_bytes, error);
      if (run.writer[k] == NULL)
        {
          stow_shard_writer_free (run.writer[0]);
          stow_tokenize_result_clear (result);
          return FALSE;
        }
    }

  guint threads = job->threads ? job->threads : g_get_num_processors ();
  result->threads = threads;
  run.shared.todo = g_async_queue_new ();
  g_mutex_init (&run.shared.lock);
  g_cond_init (&run.shared.cond);
  if (threads > 1)
    {
      run.threads = g_new0 (GThread *, threads);
      for (guint i = 0; i < threads; i++)
        run.threads[i] = g_thread_new ("tokenize", worker, &run.shared);
      run.n_threads = threads;
    }
  else
    run.inline_encoder = stow_hf_encoder_new (job->tokenizer);

  gboolean ok = read_inputs (&run, sizes, error);
  while (ok && run.in_flight.length > 0)
    ok = retire_oldest (&run, error);
  stop_workers (&run);
  for (guint k = 0; ok && k < n_splits; k++)
    ok = stow_shard_writer_finish (run.writer[k], error);
  /* Renamed only when every file of the set is complete. */
  for (guint k = 0; ok && k < n_splits; k++)
    ok = stow_shard_writer_commit (run.writer[k], error);
  for (guint k = 0; k < n_splits; k++)
    stow_shard_writer_free (run.writer[k]);
  g_free (run.threads);
  stow_hf_encoder_free (run.inline_encoder);
  g_async_queue_unref (run.shared.todo);
  g_mutex_clear (&run.shared.lock);
  g_cond_clear (&run.shared.cond);
  if (!ok)
    {
      stow_tokenize_result_clear (result);
      return FALSE;
    }
  return TRUE;
}
