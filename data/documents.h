/* SPDX-License-Identifier: MIT
 *
 * data/documents.h: documents to tokenize, from the files people have: a
 * text file (one document, or one per line), or JSONL (one JSON object per
 * line) with the text in a field, or with a prompt and a completion
 * (supervised fine-tuning, as TRL's prompt-completion datasets).  Reading
 * a file (records: the whole file, or its lines) is apart from making a
 * document of a record (checking and, for JSONL, parsing it), so that
 * threads can do the second.  Every error names the file and the line:
 * "train.jsonl:12: no \"text\" field".
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define STOW_DOCS_ERROR (stow_docs_error_quark ())
GQuark stow_docs_error_quark (void);

typedef enum
{
  STOW_DOCS_ERROR_IO,      /* a file cannot be opened or read */
  STOW_DOCS_ERROR_INVALID, /* not JSON, not an object, a field missing or
                              not a string, not UTF-8 */
  STOW_DOCS_ERROR_EMPTY,   /* an empty document or completion */
} StowDocsError;

typedef enum
{
  STOW_DOC_TEXT,       /* the record is the text */
  STOW_DOC_JSONL_TEXT, /* a JSON object with the text in a field */
  STOW_DOC_JSONL_SFT,  /* a JSON object with a prompt and a completion */
} StowDocKind;

typedef struct
{
  const char *text;       /* default "text" */
  const char *prompt;     /* default "prompt" */
  const char *completion; /* default "completion" */
} StowDocFields;

/* One document: @text (for STOW_DOC_JSONL_SFT the completion) and @prompt
 * (NULL unless SFT), valid UTF-8, @text never empty; borrowed from the
 * record (text) or from @holder (JSONL), which stow_document_clear
 * releases. */
typedef struct
{
  const char *prompt;
  gsize prompt_len;
  const char *text;
  gsize text_len;
  JsonNode *holder;
} StowDocument;

void stow_document_clear (StowDocument *d);

/* The document in @len bytes of @record (line @line of @path; 0 for a
 * whole file), read as @kind with @fields; messages begin "path:line: ".
 * Errors: STOW_DOCS_ERROR_INVALID, _EMPTY. */
gboolean stow_document_parse (StowDocKind kind, const StowDocFields *fields,
                              const char *record, gsize len, const char *path,
                              guint64 line, StowDocument *out, GError **error);

/* The kind of the JSONL file @path by its first record: SFT when it has
 * both the prompt and the completion field, text otherwise.  Errors: _IO,
 * _INVALID (the first record is no JSON object), _EMPTY (no record). */
gboolean stow_jsonl_detect (const char *path, const StowDocFields *fields,
                            StowDocKind *out, GError **error);

/* A file read record by record, with bounded memory (one line at a
 * time; a whole file at once with @whole). */
typedef struct _StowRecordReader StowRecordReader;

StowRecordReader *stow_record_reader_open (const char *path, gboolean whole,
                                           GError **error);
/* The next record (borrowed until the next call), without its line end
 * ("\n" or "\r\n"), and its line number (1-based; 0 for a whole file).
 * Blank lines are no records.  FALSE at the end (error unset) or on a
 * read error. */
gboolean stow_record_reader_next (StowRecordReader *r, const char **record,
                                  gsize *len, guint64 *line, GError **error);
/* A whole file's record, taken over by the caller (g_free), so that a
 * large document is not copied; NULL for a reader of lines. */
char *stow_record_reader_steal (StowRecordReader *r);
/* Bytes of the file consumed so far. */
guint64 stow_record_reader_offset (const StowRecordReader *r);
void stow_record_reader_free (StowRecordReader *r);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowRecordReader, stow_record_reader_free)

G_END_DECLS
