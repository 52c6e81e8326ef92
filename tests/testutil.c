/* SPDX-License-Identifier: MIT
 *
 * tests/testutil.c: running the stowage binary from tests.
 */
#include "tests/testutil.h"

#include <glib/gstdio.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "core/json.h"

void
stow_run_clear (StowRun *run)
{
  g_clear_pointer (&run->out, g_free);
  g_clear_pointer (&run->err, g_free);
}

/* TRUE when this process may not lock 64 MiB (no CAP_IPC_LOCK, and a hard
 * RLIMIT_MEMLOCK below it): `stowage train`, which locks its pinned
 * buffers and refuses when it cannot, then runs them pageable, so that
 * the suite passes on such a machine too (what it then does not check is
 * said in the test log). */
static gboolean
memlock_short (void)
{
  g_autofree char *text = NULL;
  if (g_file_get_contents ("/proc/self/status", &text, NULL, NULL))
    {
      const char *p = strstr (text, "CapEff:");
      if (p && (g_ascii_strtoull (p + 7, NULL, 16) >> 14) & 1)
        return FALSE;
    }
  struct rlimit rl;
  if (getrlimit (RLIMIT_MEMLOCK, &rl) != 0)
    return FALSE;
  return rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (64u << 20);
}

void
stow_runv (StowRun *run, const char *const *args)
{
  const char *exe = g_getenv ("STOWAGE");
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_autoptr (GError) error = NULL;
  int wait_status = 0;

  g_assert_nonnull (exe);
  g_ptr_array_add (argv, (gpointer)exe);
  for (gsize i = 0; args[i] != NULL; i++)
    g_ptr_array_add (argv, (gpointer)args[i]);
  if (args[0] != NULL && g_str_equal (args[0], "train") && memlock_short ())
    {
      g_test_message ("RLIMIT_MEMLOCK is low here: --allow-unpinned");
      g_ptr_array_add (argv, (gpointer) "--allow-unpinned");
    }
  g_ptr_array_add (argv, NULL);
  run->out = run->err = NULL;
  g_spawn_sync (NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL,
                &run->out, &run->err, &wait_status, &error);
  g_assert_no_error (error);
  run->status = WIFEXITED (wait_status) ? WEXITSTATUS (wait_status) : -1;
  g_test_message ("stowage %s -> %d\nstdout: %s\nstderr: %s",
                  args[0] ? args[0] : "", run->status, run->out, run->err);
}

/* Appends @first_arg and the rest of @ap, up to its NULL, to @args. */
static void
add_args (GPtrArray *args, const char *first_arg, va_list ap)
{
  for (const char *a = first_arg; a != NULL; a = va_arg (ap, const char *))
    g_ptr_array_add (args, (gpointer)a);
}

void
stow_run (StowRun *run, const char *first_arg, ...)
{
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  va_list ap;
  va_start (ap, first_arg);
  add_args (args, first_arg, ap);
  va_end (ap);
  g_ptr_array_add (args, NULL);
  stow_runv (run, (const char *const *)args->pdata);
}

void
stow_assert_usage_error (const char *const *args, const char *fragment)
{
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, args);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpstr (r.out, ==, "");
  g_assert_nonnull (strstr (r.err, fragment));
  g_assert_cmpuint (stow_count_lines (r.err), <=, 2);
}

char *
stow_run_to_file (const char *file_name, const char *first_arg, ...)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-test-XXXXXX", NULL);
  g_assert_nonnull (dir);
  g_autofree char *path = g_build_filename (dir, file_name, NULL);
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  va_list ap;
  va_start (ap, first_arg);
  add_args (args, first_arg, ap);
  va_end (ap);
  g_ptr_array_add (args, (gpointer) "-o");
  g_ptr_array_add (args, path);
  g_ptr_array_add (args, NULL);

  g_auto (StowRun) r = { 0 };
  stow_runv (&r, (const char *const *)args->pdata);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.out, ==, "");
  char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  g_assert_cmpint (g_unlink (path), ==, 0);
  g_assert_cmpint (g_rmdir (dir), ==, 0); /* nothing else was left */
  return text;
}

/* Members whose value may be null: strings stowage does not know. */
static const char *const nullable[] = {
  "cuda_driver", "model",  "hostname",  "cpu_model", "profile",   "net_kind",
  "description", "path",   "preset",    "source",    "pci_busid", "catalog",
  "name",        "vendor", "reference", NULL,
};

/* The first null outside the nullable members, or NULL. */
static char *
find_null (JsonNode *n, const char *key)
{
  switch (json_node_get_node_type (n))
    {
    case JSON_NODE_NULL:
      if (key == NULL || !g_strv_contains (nullable, key))
        return g_strdup_printf ("\"%s\" is null: a NaN or an infinity got "
                                "out",
                                key ? key : "(array element)");
      return NULL;
    case JSON_NODE_OBJECT:
      {
        JsonObject *o = json_node_get_object (n);
        g_autoptr (GList) names = json_object_get_members (o);
        for (GList *l = names; l; l = l->next)
          {
            char *why
                = find_null (json_object_get_member (o, l->data), l->data);
            if (why)
              return why;
          }
        return NULL;
      }
    case JSON_NODE_ARRAY:
      {
        JsonArray *a = json_node_get_array (n);
        for (guint i = 0; i < json_array_get_length (a); i++)
          {
            char *why = find_null (json_array_get_element (a, i), key);
            if (why)
              return why;
          }
        return NULL;
      }
    case JSON_NODE_VALUE:
      break;
    }
  return NULL;
}

char *
stow_json_problem (const char *text)
{
  g_autoptr (GError) error = NULL;
  if (text == NULL)
    return g_strdup ("no text");
  /* Outputs may be larger than stowage accepts as input (a simulated
   * step's every op): json-glib directly then; our writer nests shallow. */
  if (strlen (text) > STOW_JSON_MAX_BYTES)
    {
      g_autoptr (JsonParser) p = json_parser_new ();
      if (!json_parser_load_from_data (p, text, -1, &error))
        return g_strdup_printf ("not JSON: %s", error->message);
      return find_null (json_parser_get_root (p), NULL);
    }
  g_autoptr (JsonNode) root = stow_json_parse_data (text, -1, "output", &error);
  if (root == NULL)
    return g_strdup_printf ("not JSON: %s", error->message);
  return find_null (root, NULL);
}

void
stow_assert_json_valid (const char *text, const char *what)
{
  g_autofree char *why = stow_json_problem (text);
  if (why != NULL)
    g_error ("%s: %s", what, why);
}

gboolean
stow_text_has_nonfinite (const char *text)
{
  for (const char *p = text; p && *p; p++)
    {
      if (g_ascii_isalnum (*p) && p > text && g_ascii_isalnum (p[-1]))
        continue;
      for (gsize k = 0; k < 2; k++)
        {
          const char *w = k ? "inf" : "nan";
          if (g_ascii_strncasecmp (p, w, 3) == 0 && !g_ascii_isalpha (p[3]))
            return TRUE;
        }
    }
  return FALSE;
}

guint
stow_count_lines (const char *text)
{
  guint n = 0;
  for (const char *p = text; p && *p; p++)
    if (*p == '\n')
      n++;
  return n;
}
