/* SPDX-License-Identifier: MIT
 *
 * core/json.h: reading and writing JSON through json-glib.  Inputs are read
 * with a size limit and parse errors name the file, line and column; typed
 * getters name the member on a wrong type ("config.json: hidden_size:
 * expected an integer, got string \"4k\"").  JSON null counts as absent, as
 * HuggingFace configs use it for "not set".
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

/* Default limit for JSON inputs (configs, cluster files, plans). */
#define STOW_JSON_MAX_BYTES ((gsize)16 * 1024 * 1024)
/* Deepest nesting of arrays and objects any input may have.  json-glib's
 * parser recurses once per level, so an input nested 100,000 deep would
 * exhaust the stack; stowage's own files nest 5 deep, HF configs 3. */
#define STOW_JSON_MAX_DEPTH 64

/* Reads and parses @path; fails with STOW_CORE_ERROR_IO, _TOO_LARGE (file
 * over @max_bytes) or _JSON ("path:LINE:COL: message").  Returns a new node. */
JsonNode *stow_json_parse_file (const char *path, gsize max_bytes,
                                GError **error);
/* Parses @len bytes (-1: NUL-terminated) of @data; @name stands in for the
 * file name in messages.  Every reader comes through here, so the bounds
 * are checked here, before json-glib sees the text: input over
 * STOW_JSON_MAX_BYTES is STOW_CORE_ERROR_TOO_LARGE; nesting deeper than
 * STOW_JSON_MAX_DEPTH, and an integer outside the signed 64-bit range
 * (which json-glib would read as -1), are STOW_CORE_ERROR_JSON naming the
 * line and column. */
JsonNode *stow_json_parse_data (const char *data, gssize len, const char *name,
                                GError **error);
/* stow_json_parse_data with another size limit than STOW_JSON_MAX_BYTES:
 * for the few inputs that are large by nature (a tokenizer.json holds a
 * vocabulary of up to a few hundred thousand entries and their merges). */
JsonNode *stow_json_parse_data_limit (const char *data, gssize len,
                                      const char *name, gsize max_bytes,
                                      GError **error);
/* The root as an object, or STOW_CORE_ERROR_JSON naming @name. */
JsonObject *stow_json_root_object (JsonNode *root, const char *name,
                                   GError **error);

/* TRUE when @member is present and not null. */
gboolean stow_json_has (JsonObject *obj, const char *member);

/* Typed getters.  @where names the object in messages (a file name, or
 * "cluster.json: nodes[2]").  When the member is absent or null: with
 * @required an error (STOW_CORE_ERROR_MISSING), otherwise TRUE with *out
 * untouched, so callers pre-set defaults.  A wrong type or a value out of
 * range is STOW_CORE_ERROR_JSON.  Integers accept integral doubles (4096.0). */
gboolean stow_json_get_u64 (JsonObject *obj, const char *where,
                            const char *member, gboolean required, guint64 *out,
                            GError **error);
gboolean stow_json_get_i64 (JsonObject *obj, const char *where,
                            const char *member, gboolean required, gint64 *out,
                            GError **error);
gboolean stow_json_get_double (JsonObject *obj, const char *where,
                               const char *member, gboolean required,
                               double *out, GError **error);
gboolean stow_json_get_bool (JsonObject *obj, const char *where,
                             const char *member, gboolean required,
                             gboolean *out, GError **error);
/* *out is borrowed from @obj. */
gboolean stow_json_get_string (JsonObject *obj, const char *where,
                               const char *member, gboolean required,
                               const char **out, GError **error);
gboolean stow_json_get_object (JsonObject *obj, const char *where,
                               const char *member, gboolean required,
                               JsonObject **out, GError **error);
gboolean stow_json_get_array (JsonObject *obj, const char *where,
                              const char *member, gboolean required,
                              JsonArray **out, GError **error);

/* Builder setters: each names @member and adds one value to the object
 * @b is building.  Integers are signed 64-bit in json-glib, so a guint64
 * over G_MAXINT64 is clamped to G_MAXINT64; a NULL string is written as
 * null. */
void stow_json_set_u64 (JsonBuilder *b, const char *member, guint64 v);
void stow_json_set_i64 (JsonBuilder *b, const char *member, gint64 v);
void stow_json_set_double (JsonBuilder *b, const char *member, double v);
void stow_json_set_bool (JsonBuilder *b, const char *member, gboolean v);
void stow_json_set_string (JsonBuilder *b, const char *member, const char *v);

/* A short description of a value for messages: "string \"4k\"", "number
 * 3.5", "an object", "null". */
char *stow_json_describe (JsonNode *node);

/* Serialises @node; pretty output is indented by two spaces and ends with a
 * newline. */
char *stow_json_to_string (JsonNode *node, gboolean pretty);

/* Scans @len bytes of @data before json-glib is given them, and refuses
 * (STOW_CORE_ERROR_JSON naming @name and the byte offset) arrays and
 * objects nested deeper than @max_depth, and any byte outside a string that
 * cannot be part of a strict JSON token.  json-glib's parser recurses once
 * per level, so a few MB of '[' exhaust the stack; and it also accepts
 * single-quoted strings and comments, which would hide brackets from a scan
 * that knew only double quotes.  TRUE when the data may be parsed. */
gboolean stow_json_check_nesting (const char *data, gsize len, guint max_depth,
                                  const char *name, GError **error);

/* Writes @len bytes (-1: NUL-terminated) of output to @path, where the user
 * meant it to go:
 *  - a regular file, or nothing yet: atomically (a temporary beside it,
 *    fsync, rename; an existing file keeps its mode; on error nothing is
 *    left behind and the old file is untouched);
 *  - a symbolic link: through it, to its target by the same rules (the
 *    link stays a link);
 *  - a character device or a FIFO (/dev/stdout, /dev/null, a terminal, a
 *    pipe): opened and written in place, never replaced;
 *  - anything else (a directory, a block device, a socket): refused.
 * Errors (STOW_CORE_ERROR_IO) name @path, never a temporary file. */
gboolean stow_file_write_atomic (const char *path, const char *data, gssize len,
                                 GError **error);

G_END_DECLS
