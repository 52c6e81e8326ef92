/* SPDX-License-Identifier: MIT
 *
 * tests/test-json.c: bounded JSON input with positioned errors, typed
 * getters naming the member, atomic output.
 */
#include <errno.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"

typedef struct
{
  char *dir;
} Fixture;

static void
fixture_setup (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  f->dir = g_dir_make_tmp ("stow-json-XXXXXX", &error);
  g_assert_no_error (error);
}

static void
fixture_teardown (Fixture *f, gconstpointer data)
{
  g_autoptr (GDir) d = g_dir_open (f->dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (f->dir, name, NULL);
      g_unlink (p);
    }
  g_rmdir (f->dir);
  g_free (f->dir);
}

static char *
write_file (Fixture *f, const char *name, const char *text)
{
  char *path = g_build_filename (f->dir, name, NULL);
  g_assert_true (g_file_set_contents (path, text, -1, NULL));
  return path;
}

static void
test_parse_ok (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *path
      = write_file (f, "ok.json", "{\"hidden_size\": 4096, \"x\": null}");
  g_autoptr (JsonNode) root
      = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, &error);
  g_assert_no_error (error);
  JsonObject *o = stow_json_root_object (root, path, &error);
  g_assert_no_error (error);
  g_assert_true (stow_json_has (o, "hidden_size"));
  g_assert_false (stow_json_has (o, "x")); /* null is absent */
  g_assert_false (stow_json_has (o, "y"));
}

static void
test_parse_errors (Fixture *f, gconstpointer data)
{
  static const struct
  {
    const char *name, *text, *fragment;
    int code;
  } cases[] = {
    { "empty.json", "", "empty", STOW_CORE_ERROR_JSON },
    { "blank.json", "   \n", "", STOW_CORE_ERROR_JSON },
    { "notjson.json", "hidden_size = 4096\n", ":1:", STOW_CORE_ERROR_JSON },
    { "truncated.json", "{\n  \"a\": 1,\n  \"b\": [1, 2",
      ":3:", STOW_CORE_ERROR_JSON },
    { "trailing.json", "{\"a\": 1}\n}", ":2:", STOW_CORE_ERROR_JSON },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *path = write_file (f, cases[i].name, cases[i].text);
      g_autoptr (JsonNode) root
          = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, &error);
      g_test_message ("%s: %s", cases[i].name,
                      error ? error->message : "(no error)");
      g_assert_null (root);
      g_assert_error (error, STOW_CORE_ERROR, cases[i].code);
      g_assert_true (g_str_has_prefix (error->message, path));
      g_assert_nonnull (strstr (error->message, cases[i].fragment));
    }

  g_autoptr (GError) error = NULL;
  g_autofree char *missing = g_build_filename (f->dir, "missing.json", NULL);
  g_assert_null (stow_json_parse_file (missing, STOW_JSON_MAX_BYTES, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);
  g_assert_true (g_str_has_prefix (error->message, missing));
  g_clear_error (&error);

  g_assert_null (stow_json_parse_file (f->dir, STOW_JSON_MAX_BYTES, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);
  g_clear_error (&error);

  /* Over the limit: refused before reading, with the size in the message. */
  g_autofree char *big = write_file (f, "big.json", "[1, 2, 3, 4, 5, 6]");
  g_assert_null (stow_json_parse_file (big, 8, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_TOO_LARGE);
  g_assert_nonnull (strstr (error->message, "18 bytes"));
  g_clear_error (&error);

  g_autofree char *arr = write_file (f, "array.json", "[1]");
  g_autoptr (JsonNode) root
      = stow_json_parse_file (arr, STOW_JSON_MAX_BYTES, &error);
  g_assert_no_error (error);
  g_assert_null (stow_json_root_object (root, arr, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
  g_assert_nonnull (strstr (error->message, "an array"));
}

/* Issue 24: json-glib recurses per nesting level, so 100,000 levels used to
 * crash every reader (SIGSEGV); and it read 2^64 as -1. */
static void
test_parse_bounds (void)
{
  g_autoptr (GError) error = NULL;
  gsize n = 100000;
  g_autofree char *deep = g_malloc (2 * n + 1);
  memset (deep, '[', n);
  memset (deep + n, ']', n);
  deep[2 * n] = '\0';
  g_autoptr (JsonNode) none = stow_json_parse_data (deep, -1, "d.json", &error);
  g_assert_null (none);
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
  g_assert_cmpstr (error->message, ==,
                   "d.json:1:65: nested deeper than 64 arrays and objects "
                   "(the limit)");
  g_clear_error (&error);

  /* Objects count as levels too, and brackets inside strings do not. */
  GString *obj = g_string_new (NULL);
  for (int i = 0; i < STOW_JSON_MAX_DEPTH; i++)
    g_string_append (obj, "{\"a[{\\\"\": ");
  g_string_append (obj, "1");
  for (int i = 0; i < STOW_JSON_MAX_DEPTH; i++)
    g_string_append_c (obj, '}');
  g_autoptr (JsonNode) at_limit
      = stow_json_parse_data (obj->str, -1, "o.json", &error);
  g_assert_no_error (error);
  g_assert_nonnull (at_limit);
  g_string_prepend (obj, "[");
  g_string_append (obj, "]");
  g_assert_null (stow_json_parse_data (obj->str, -1, "o.json", &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
  g_clear_error (&error);
  g_string_free (obj, TRUE);

  /* Integers beyond 64 bits are named, not read as -1. */
  static const struct
  {
    const char *text;
    gboolean ok;
  } ints[] = {
    { "{\"h\": 9223372036854775807}", TRUE },
    { "{\"h\": -9223372036854775808}", TRUE },
    { "{\"h\": 000009223372036854775807}", FALSE }, /* json-glib: junk */
    { "{\"h\": 18446744073709551616.0}", TRUE },    /* a double */
    { "{\"h\": 1.8e19}", TRUE },
    { "{\"h\": 9223372036854775808}", FALSE },
    { "{\"h\": -9223372036854775809}", FALSE },
    { "{\"h\":\n 18446744073709551616}", FALSE },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ints); i++)
    {
      g_autoptr (JsonNode) r
          = stow_json_parse_data (ints[i].text, -1, "i.json", &error);
      g_test_message ("%s: %s", ints[i].text,
                      error ? error->message : "(parsed)");
      if (ints[i].ok)
        {
          g_assert_no_error (error);
          continue;
        }
      g_assert_null (r);
      g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
      g_clear_error (&error);
    }
  g_autoptr (JsonNode) r = stow_json_parse_data (
      "{\"h\":\n 18446744073709551616}", -1, "i.json", &error);
  g_assert_cmpstr (error->message, ==,
                   "i.json:2:2: the integer 18446744073709551616 is out of "
                   "range (64-bit integers run from -9223372036854775808 "
                   "to 9223372036854775807)");
  g_clear_error (&error);

  /* Data over the size limit is refused before parsing. */
  gsize big = STOW_JSON_MAX_BYTES + 1;
  g_autofree char *spaces = g_malloc (big + 1);
  memset (spaces, ' ', big);
  spaces[0] = '1';
  spaces[big] = '\0';
  g_assert_null (stow_json_parse_data (spaces, (gssize)big, "big", &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_TOO_LARGE);
}

static JsonObject *
parse_object (const char *text, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  *root = stow_json_parse_data (text, -1, "t.json", &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

static void
test_getters (void)
{
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = parse_object (
      "{\"u\": 4096, \"ud\": 4096.0, \"neg\": -1, \"frac\": 1.5,"
      " \"s\": \"4k\", \"b\": true, \"n\": null, \"o\": {}, \"a\": [],"
      " \"huge\": 1e300, \"i\": -7, \"d\": 0.25}",
      &root);
  g_autoptr (GError) error = NULL;
  guint64 u = 0;
  gint64 i = 0;
  double d = 0;
  gboolean b = FALSE;
  const char *s = NULL;
  JsonObject *obj = NULL;
  JsonArray *arr = NULL;

  g_assert_true (stow_json_get_u64 (o, "t.json", "u", TRUE, &u, &error));
  g_assert_cmpuint (u, ==, 4096);
  g_assert_true (stow_json_get_u64 (o, "t.json", "ud", TRUE, &u, &error));
  g_assert_cmpuint (u, ==, 4096);
  g_assert_true (stow_json_get_i64 (o, "t.json", "i", TRUE, &i, &error));
  g_assert_cmpint (i, ==, -7);
  g_assert_true (stow_json_get_double (o, "t.json", "d", TRUE, &d, &error));
  g_assert_cmpfloat (d, ==, 0.25);
  g_assert_true (stow_json_get_double (o, "t.json", "u", TRUE, &d, &error));
  g_assert_cmpfloat (d, ==, 4096.0);
  g_assert_true (stow_json_get_bool (o, "t.json", "b", TRUE, &b, &error));
  g_assert_true (b);
  g_assert_true (stow_json_get_string (o, "t.json", "s", TRUE, &s, &error));
  g_assert_cmpstr (s, ==, "4k");
  g_assert_true (stow_json_get_object (o, "t.json", "o", TRUE, &obj, &error));
  g_assert_nonnull (obj);
  g_assert_true (stow_json_get_array (o, "t.json", "a", TRUE, &arr, &error));
  g_assert_nonnull (arr);
  g_assert_no_error (error);

  /* Optional and absent (or null): TRUE, value untouched. */
  u = 77;
  g_assert_true (stow_json_get_u64 (o, "t.json", "n", FALSE, &u, &error));
  g_assert_true (stow_json_get_u64 (o, "t.json", "zz", FALSE, &u, &error));
  g_assert_cmpuint (u, ==, 77);
  g_assert_no_error (error);

  static const struct
  {
    const char *member;
    int kind; /* 0 u64, 1 i64, 2 double, 3 bool, 4 string, 5 obj, 6 array */
    int code;
    const char *fragment;
  } bad[] = {
    { "neg", 0, STOW_CORE_ERROR_JSON, "got number -1" },
    { "frac", 0, STOW_CORE_ERROR_JSON, "got number 1.5" },
    { "s", 0, STOW_CORE_ERROR_JSON, "got string \"4k\"" },
    { "huge", 0, STOW_CORE_ERROR_JSON, "non-negative integer" },
    { "huge", 1, STOW_CORE_ERROR_JSON, "an integer" },
    { "frac", 1, STOW_CORE_ERROR_JSON, "an integer" },
    { "missing", 0, STOW_CORE_ERROR_MISSING, "required" },
    { "n", 1, STOW_CORE_ERROR_MISSING, "required" },
    { "s", 2, STOW_CORE_ERROR_JSON, "a number" },
    { "u", 3, STOW_CORE_ERROR_JSON, "true or false" },
    { "u", 4, STOW_CORE_ERROR_JSON, "a string" },
    { "a", 5, STOW_CORE_ERROR_JSON, "got an array" },
    { "o", 6, STOW_CORE_ERROR_JSON, "got an object" },
  };
  for (gsize k = 0; k < G_N_ELEMENTS (bad); k++)
    {
      g_autoptr (GError) e = NULL;
      gboolean ok = TRUE;
      switch (bad[k].kind)
        {
        case 0:
          ok = stow_json_get_u64 (o, "t.json", bad[k].member, TRUE, &u, &e);
          break;
        case 1:
          ok = stow_json_get_i64 (o, "t.json", bad[k].member, TRUE, &i, &e);
          break;
        case 2:
          ok = stow_json_get_double (o, "t.json", bad[k].member, TRUE, &d, &e);
          break;
        case 3:
          ok = stow_json_get_bool (o, "t.json", bad[k].member, TRUE, &b, &e);
          break;
        case 4:
          ok = stow_json_get_string (o, "t.json", bad[k].member, TRUE, &s, &e);
          break;
        case 5:
          ok = stow_json_get_object (o, "t.json", bad[k].member, TRUE, &obj,
                                     &e);
          break;
        default:
          ok = stow_json_get_array (o, "t.json", bad[k].member, TRUE, &arr, &e);
          break;
        }
      g_test_message ("%s: %s", bad[k].member, e ? e->message : "no error");
      g_assert_false (ok);
      g_assert_error (e, STOW_CORE_ERROR, bad[k].code);
      g_autofree char *prefix = g_strdup_printf ("t.json: %s: ", bad[k].member);
      g_assert_true (g_str_has_prefix (e->message, prefix));
      g_assert_nonnull (strstr (e->message, bad[k].fragment));
    }
}

static void
test_atomic_write (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *path = g_build_filename (f->dir, "out.json", NULL);
  g_autofree char *contents = NULL;
  g_assert_true (stow_file_write_atomic (path, "{\"a\": 1}\n", -1, &error));
  g_assert_no_error (error);
  g_assert_true (stow_file_write_atomic (path, "{\"a\": 2}\n", -1, &error));
  g_assert_true (g_file_get_contents (path, &contents, NULL, NULL));
  g_assert_cmpstr (contents, ==, "{\"a\": 2}\n");

  /* A directory that does not exist: an error, and nothing written. */
  g_autofree char *bad
      = g_build_filename (f->dir, "no", "such", "x.json", NULL);
  g_assert_false (stow_file_write_atomic (bad, "x", -1, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);
  g_assert_false (g_file_test (bad, G_FILE_TEST_EXISTS));

  /* Only out.json is in the directory: no temporaries left behind. */
  g_autoptr (GDir) d = g_dir_open (f->dir, 0, NULL);
  int n = 0;
  while (g_dir_read_name (d))
    n++;
  g_assert_cmpint (n, ==, 1);
}

typedef struct
{
  char *path;
  char *got;
} FifoReader;

static gpointer
read_fifo (gpointer data)
{
  FifoReader *r = data;
  g_file_get_contents (r->path, &r->got, NULL, NULL);
  return NULL;
}

static int
count_entries (const char *dir)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  int n = 0;
  while (g_dir_read_name (d))
    n++;
  return n;
}

/* Issue 24, item 2: -o writes where the user meant.  A symlink used to be
 * replaced by a regular file (as root, /dev/stdout was), a device node or
 * a FIFO too, and errors named the temporary ("x.html.7579Y3"). */
static void
test_write_through (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *contents = NULL;

  /* A symlink to a file: the file changes, the link stays a link. */
  g_autofree char *target = write_file (f, "target.html", "old");
  g_autofree char *link = g_build_filename (f->dir, "link.html", NULL);
  g_assert_cmpint (symlink ("target.html", link), ==, 0);
  g_assert_true (stow_file_write_atomic (link, "new", -1, &error));
  g_assert_no_error (error);
  g_assert_true (g_file_test (link, G_FILE_TEST_IS_SYMLINK));
  g_assert_true (g_file_get_contents (target, &contents, NULL, NULL));
  g_assert_cmpstr (contents, ==, "new");
  g_clear_pointer (&contents, g_free);

  /* A dangling symlink: its target is created. */
  g_autofree char *dangling = g_build_filename (f->dir, "dangling", NULL);
  g_autofree char *made = g_build_filename (f->dir, "made.json", NULL);
  g_assert_cmpint (symlink ("made.json", dangling), ==, 0);
  g_assert_true (stow_file_write_atomic (dangling, "{}", -1, &error));
  g_assert_no_error (error);
  g_assert_true (g_file_test (dangling, G_FILE_TEST_IS_SYMLINK));
  g_assert_true (g_file_get_contents (made, &contents, NULL, NULL));
  g_assert_cmpstr (contents, ==, "{}");
  g_clear_pointer (&contents, g_free);

  /* An existing file keeps its mode. */
  g_assert_cmpint (g_chmod (target, 0600), ==, 0);
  g_assert_true (stow_file_write_atomic (target, "again", -1, &error));
  GStatBuf st;
  g_assert_cmpint (g_stat (target, &st), ==, 0);
  g_assert_cmpuint (st.st_mode & 0777, ==, 0600);

  /* A FIFO: written through to the reader, still a FIFO afterwards. */
  g_autofree char *fifo = g_build_filename (f->dir, "fifo", NULL);
  g_assert_cmpint (mkfifo (fifo, 0600), ==, 0);
  FifoReader r = { fifo, NULL };
  GThread *t = g_thread_new ("reader", read_fifo, &r);
  g_assert_true (stow_file_write_atomic (fifo, "through a pipe", -1, &error));
  g_assert_no_error (error);
  g_thread_join (t);
  g_assert_cmpstr (r.got, ==, "through a pipe");
  g_free (r.got);
  g_assert_cmpint (g_lstat (fifo, &st), ==, 0);
  g_assert_true (S_ISFIFO (st.st_mode));

  /* A character device: written through, never replaced.  /dev/null is
   * safe to write; a node of our own is checked when we may make one. */
  g_assert_true (stow_file_write_atomic ("/dev/null", "x", -1, &error));
  g_assert_no_error (error);
  g_assert_cmpint (g_lstat ("/dev/null", &st), ==, 0);
  g_assert_true (S_ISCHR (st.st_mode));
  g_autofree char *node = g_build_filename (f->dir, "null", NULL);
  if (mknod (node, S_IFCHR | 0666, makedev (1, 3)) == 0)
    {
      g_assert_true (stow_file_write_atomic (node, "x", -1, &error));
      g_assert_no_error (error);
      g_assert_cmpint (g_lstat (node, &st), ==, 0);
      g_assert_true (S_ISCHR (st.st_mode));
    }
  else
    g_test_message ("mknod: %s (not root): /dev/null only", g_strerror (errno));

  /* Anything else is refused, naming it. */
  g_autofree char *sub = g_build_filename (f->dir, "sub", NULL);
  g_assert_cmpint (g_mkdir (sub, 0700), ==, 0);
  g_autofree char *to_dir = g_build_filename (f->dir, "to-dir", NULL);
  g_assert_cmpint (symlink ("sub", to_dir), ==, 0);
  const char *refused[] = { sub, to_dir };
  for (gsize i = 0; i < G_N_ELEMENTS (refused); i++)
    {
      g_assert_false (stow_file_write_atomic (refused[i], "x", -1, &error));
      g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);
      g_autofree char *want
          = g_strdup_printf ("%s: is a directory; stowage writes regular "
                             "files, character devices and FIFOs only",
                             refused[i]);
      g_assert_cmpstr (error->message, ==, want);
      g_clear_error (&error);
    }
  g_assert_cmpint (g_rmdir (sub), ==, 0);

  /* Errors name the target, not a temporary beside it. */
  g_autofree char *missing_dir
      = g_build_filename (f->dir, "no", "x.html", NULL);
  g_assert_false (stow_file_write_atomic (missing_dir, "x", -1, &error));
  g_autofree char *want = g_strdup_printf (
      "%s: cannot create a file in %s/no: No such file or directory",
      missing_dir, f->dir);
  g_assert_cmpstr (error->message, ==, want);
  g_clear_error (&error);
  g_assert_false (stow_file_write_atomic ("", "x", -1, &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO);

  /* target.html, link.html, dangling, made.json, fifo, to-dir, maybe
   * null: no temporary was left. */
  g_assert_cmpint (count_entries (f->dir), <=, 7);
  g_assert_cmpint (count_entries (f->dir), >=, 6);
}

static void
test_to_string (void)
{
  g_autoptr (JsonNode) root = NULL;
  parse_object ("{\"a\": [1, 2], \"b\": \"x\"}", &root);
  g_autofree char *compact = stow_json_to_string (root, FALSE);
  g_assert_cmpstr (compact, ==, "{\"a\":[1,2],\"b\":\"x\"}");
  g_autofree char *pretty = stow_json_to_string (root, TRUE);
  g_assert_true (g_str_has_suffix (pretty, "}\n"));
  g_autoptr (JsonNode) again = stow_json_parse_data (pretty, -1, "p", NULL);
  g_assert_true (json_node_equal (root, again));
}

/* Issue 24, item 3: whatever the values, the text parses.  json-glib 1.6
 * wrote NaN as "-nan.0", 1e42 as "1e+42.0" and U+001F raw. */
static void
test_to_string_valid (void)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_double (b, "nan", NAN);
  stow_json_set_double (b, "inf", INFINITY);
  stow_json_set_double (b, "ninf", -INFINITY);
  stow_json_set_double (b, "big", 1e42);
  stow_json_set_double (b, "tiny", 1e-300);
  stow_json_set_double (b, "three", 3.0);
  stow_json_set_double (b, "zero", -0.0);
  stow_json_set_string (b, "ctl", "a\x1f\x01\x7f\"\\/b\n");
  stow_json_set_string (b, "bad\xff", "x\xc3y\xe2\x82");
  stow_json_set_string (b, "utf8", "\xc3\xa9\xe2\x80\xa8");
  json_builder_set_member_name (b, "empty_obj");
  json_builder_begin_object (b);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "empty_arr");
  json_builder_begin_array (b);
  json_builder_end_array (b);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *pretty = stow_json_to_string (root, TRUE);
  g_autofree char *compact = stow_json_to_string (root, FALSE);
  g_test_message ("%s", pretty);
  g_assert_cmpstr (compact, ==,
                   "{\"nan\":null,\"inf\":null,\"ninf\":null,\"big\":1e+42,"
                   "\"tiny\":1e-300,\"three\":3.0,\"zero\":-0.0,"
                   "\"ctl\":\"a\\u001f\\u0001\\u007f\\\"\\\\/b\\n\","
                   "\"bad\\ufffd\":\"x\\ufffdy\\ufffd\\ufffd\","
                   "\"utf8\":\"\xc3\xa9\xe2\x80\xa8\","
                   "\"empty_obj\":{},\"empty_arr\":[]}");
  const char *texts[] = { pretty, compact };
  for (gsize i = 0; i < G_N_ELEMENTS (texts); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (JsonNode) again
          = stow_json_parse_data (texts[i], -1, "w", &error);
      g_assert_no_error (error);
      JsonObject *o = json_node_get_object (again);
      g_assert_true (JSON_NODE_HOLDS_NULL (json_object_get_member (o, "nan")));
      g_assert_cmpfloat (json_object_get_double_member (o, "big"), ==, 1e42);
      g_assert_cmpstr (json_object_get_string_member (o, "ctl"), ==,
                       "a\x1f\x01\x7f\"\\/b\n");
    }
}

/* The writer lays out finite values exactly as json-glib's generator did,
 * so files and golden outputs are unchanged. */
static void
test_to_string_layout (void)
{
  static const char *const docs[] = {
    "{\"a\": [1, -2, 0.25, 0.1, 1e-7, 123456789012.5, true, false, null,"
    " {\"b\": [[], [3]], \"c\": \"q\\\"\\\\\\t\\u0001 \\u00e9\"}],"
    " \"d\": {\"e\": {\"f\": 4096.0}}, \"g\": -9223372036854775808}",
    "[]",
    "[{\"x\": 1}]",
    "\"s\"",
    "12",
  };
  for (gsize i = 0; i < G_N_ELEMENTS (docs); i++)
    for (int pretty = 0; pretty < 2; pretty++)
      {
        g_autoptr (JsonNode) root
            = stow_json_parse_data (docs[i], -1, "l", NULL);
        g_assert_nonnull (root);
        g_autoptr (JsonGenerator) gen = json_generator_new ();
        json_generator_set_root (gen, root);
        json_generator_set_pretty (gen, pretty);
        json_generator_set_indent (gen, 2);
        g_autofree char *theirs = json_generator_to_data (gen, NULL);
        g_autofree char *ours = stow_json_to_string (root, pretty);
        g_autofree char *expect
            = g_strconcat (theirs, pretty ? "\n" : "", NULL);
        g_assert_cmpstr (ours, ==, expect);
      }
}

/* Random byte strings never crash the parser and always come back with a
 * message naming the input. */
static void
test_random_bytes (void)
{
  static const char alphabet[] = "{}[]\":,0123456789.eE-+ truefalsn\\\n\x01";
  GRand *r = g_rand_new_with_seed (7);
  for (int i = 0; i < 20000; i++)
    {
      char text[40];
      int n = g_rand_int_range (r, 1, (int)sizeof text);
      for (int j = 0; j < n; j++)
        text[j] = alphabet[g_rand_int_range (r, 0, sizeof alphabet - 1)];
      text[n] = '\0';
      g_autoptr (GError) error = NULL;
      g_autoptr (JsonNode) node
          = stow_json_parse_data (text, n, "fuzz", &error);
      if (node == NULL)
        g_assert_true (g_str_has_prefix (error->message, "fuzz"));
    }
  g_rand_free (r);
}

/* The pre-scan that keeps json-glib's recursive parser off deep input:
 * brackets inside strings (escaped quotes too) do not count, and the lexical
 * extensions json-glib accepts (comments, single quotes) are refused, since
 * they could hide brackets from the scan. */
static void
test_check_nesting (void)
{
  static const struct
  {
    const char *text;
    guint max_depth;
    const char *fragment; /* NULL: accepted */
  } cases[] = {
    { "{\"a\": [[1, 2], {\"b\": true}], \"c\": null}", 3, NULL },
    { "{\"a\": [[1, 2], {\"b\": true}]}", 2,
      "byte 7: JSON nested deeper than 2" },
    { "{\"a[[[[\": \"}}\\\"[[[\"}", 1, NULL },
    { "[[[[[[[[[[[[[[[[[[[[", 8, "byte 8:" },
    { "]]]]{}", 1, NULL },
    { "{\"a\": 1} /* [[[[ */", 8, "byte 9: unexpected character 0x2f" },
    { "{'a': '\"'}", 8, "byte 1: unexpected character 0x27" },
    { "{\"a\": 1e-5, \"b\": -0.5E+3, \"c\": false}", 1, NULL },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GError) error = NULL;
      gboolean ok
          = stow_json_check_nesting (cases[i].text, strlen (cases[i].text),
                                     cases[i].max_depth, "in", &error);
      if (cases[i].fragment == NULL)
        {
          g_assert_no_error (error);
          g_assert_true (ok);
        }
      else
        {
          g_assert_false (ok);
          g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
          g_assert_true (g_str_has_prefix (error->message, "in: "));
          g_assert_nonnull (strstr (error->message, cases[i].fragment));
        }
    }
  /* A NUL byte outside a string is not JSON either. */
  g_autoptr (GError) error = NULL;
  g_assert_false (stow_json_check_nesting ("[1,\0]", 5, 8, "in", &error));
  g_assert_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_JSON);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add ("/json/parse/ok", Fixture, NULL, fixture_setup, test_parse_ok,
              fixture_teardown);
  g_test_add ("/json/parse/errors", Fixture, NULL, fixture_setup,
              test_parse_errors, fixture_teardown);
  g_test_add_func ("/json/parse/bounds", test_parse_bounds);
  g_test_add_func ("/json/getters", test_getters);
  g_test_add ("/json/atomic-write", Fixture, NULL, fixture_setup,
              test_atomic_write, fixture_teardown);
  g_test_add ("/json/write-through", Fixture, NULL, fixture_setup,
              test_write_through, fixture_teardown);
  g_test_add_func ("/json/to-string", test_to_string);
  g_test_add_func ("/json/to-string/valid", test_to_string_valid);
  g_test_add_func ("/json/to-string/layout", test_to_string_layout);
  g_test_add_func ("/json/random-bytes", test_random_bytes);
  g_test_add_func ("/json/check-nesting", test_check_nesting);
  return g_test_run ();
}
