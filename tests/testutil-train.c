/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-train.c: see testutil-train.h.
 */
#include "testutil-train.h"
#include "testutil-io.h"

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

/* A small LLaMA (GQA, untied) and its vocabulary. */
const char *const stow_train_small_config
    = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
      "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"intermediate_size\":96,\"vocab_size\":300,\"rope_theta\":500000.0,"
      "\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":false,"
      "\"initializer_range\":0.05}";

void
write_shard (const char *path, guint32 magic, guint32 version, guint32 count,
             guint32 written, guint32 vocab)
{
  g_autoptr (GByteArray) b = g_byte_array_new ();
  gint32 header[256] = { (gint32)magic, (gint32)version, (gint32)count };
  g_byte_array_append (b, (const guint8 *)header, sizeof header);
  GRand *r = g_rand_new_with_seed (5);
  for (guint32 i = 0; i < written; i++)
    {
      guint16 t = (guint16)g_rand_int_range (r, 0, (gint32)vocab);
      g_byte_array_append (b, (const guint8 *)&t, 2);
    }
  g_rand_free (r);
  g_assert_true (
      g_file_set_contents (path, (const char *)b->data, b->len, NULL));
}

void
fixture_init (Fixture *f)
{
  g_autoptr (GError) error = NULL;
  f->dir = g_dir_make_tmp ("stow-train-XXXXXX", &error);
  g_assert_no_error (error);
  f->config = g_build_filename (f->dir, "config.json", NULL);
  f->model = g_build_filename (f->dir, "model", NULL);
  f->shard = g_build_filename (f->dir, "train.bin", NULL);
  f->text = g_build_filename (f->dir, "train.txt", NULL);
  g_assert_true (
      g_file_set_contents (f->config, stow_train_small_config, -1, NULL));
  write_shard (f->shard, 20240520, 1, 20000, 20000, 300);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "init-model", f->config, "-o", f->model, "--seed", "3", NULL);
  g_assert_cmpint (r.status, ==, 0);
}

void
fixture_clear (Fixture *f)
{
  g_autofree char *cmd = g_strdup_printf ("rm -rf '%s'", f->dir);
  g_assert_cmpint (system (cmd), ==, 0);
  g_free (f->dir);
  g_free (f->config);
  g_free (f->model);
  g_free (f->shard);
  g_free (f->text);
}

GPtrArray *
args_join (const char *const *first, const char *const *second)
{
  GPtrArray *a = g_ptr_array_new ();
  for (guint i = 0; first[i]; i++)
    g_ptr_array_add (a, (char *)first[i]);
  for (guint i = 0; second && second[i]; i++)
    g_ptr_array_add (a, (char *)second[i]);
  g_ptr_array_add (a, NULL);
  return a;
}

GPtrArray *
train_argv (Fixture *f, const char *out, const char *const *extra)
{
  const char *base[] = { g_getenv ("STOWAGE"),
                         "train",
                         "--model",
                         f->model,
                         "--data",
                         f->shard,
                         "--seq",
                         "16",
                         "--micro-batch",
                         "2",
                         "--global-batch",
                         "4",
                         "--lr",
                         "0.003",
                         "--out",
                         out,
                         NULL };
  GPtrArray *a = args_join (base, extra);
  /* fp32 unless the test names a precision: the figures these tests hold
   * (the oracle's tolerances, faults counted in I/O requests) are fp32's,
   * which is no longer train's default (bf16, as every command). */
  gboolean named = FALSE;
  for (guint i = 0; extra && extra[i]; i++)
    named |= g_str_equal (extra[i], "--precision");
  if (!named)
    {
      g_ptr_array_insert (a, (gint)a->len - 1, (gpointer) "--precision");
      g_ptr_array_insert (a, (gint)a->len - 1, (gpointer) "fp32");
    }
  return a;
}

void
trainv (StowRun *r, Fixture *f, const char *out, const char *const *extra)
{
  g_autoptr (GPtrArray) a = train_argv (f, out, extra);
  stow_runv (r, (const char *const *)a->pdata + 1);
}

/* Runs train on the fixture with @out and the extra flags (NULL ended). */
void
train (StowRun *r, Fixture *f, const char *out, ...)
{
  g_autoptr (GPtrArray) a = g_ptr_array_new ();
  va_list ap;
  va_start (ap, out);
  for (const char *s = va_arg (ap, const char *); s;
       s = va_arg (ap, const char *))
    g_ptr_array_add (a, (char *)s);
  va_end (ap);
  g_ptr_array_add (a, NULL);
  trainv (r, f, out, (const char *const *)a->pdata);
}

char *
contents (const char *dir, const char *file)
{
  g_autofree char *p = g_build_filename (dir, "latest", file, NULL);
  char *c = NULL;
  gsize n = 0;
  g_autoptr (GError) error = NULL;
  g_file_get_contents (p, &c, &n, &error);
  g_assert_no_error (error);
  return c;
}

gboolean
same_file (const char *a_dir, const char *b_dir, const char *file)
{
  g_autofree char *pa = g_build_filename (a_dir, "latest", file, NULL);
  g_autofree char *pb = g_build_filename (b_dir, "latest", file, NULL);
  g_autofree char *a = NULL, *b = NULL;
  gsize na = 0, nb = 0;
  g_assert_true (g_file_get_contents (pa, &a, &na, NULL));
  g_assert_true (g_file_get_contents (pb, &b, &nb, NULL));
  return na == nb && memcmp (a, b, na) == 0;
}

void
stow_train_oracle (const char *backend, const char *const *pythons)
{
  g_autofree char *script
      = g_test_build_filename (G_TEST_DIST, "oracle", "train_oracle.py", NULL);
  g_autoptr (GError) error = NULL;
  g_autofree char *work = g_dir_make_tmp ("stow-oracle-XXXXXX", &error);
  g_assert_no_error (error);
  g_autoptr (GPtrArray) pys = g_ptr_array_new ();
  if (g_getenv ("STOW_PYTHON"))
    g_ptr_array_add (pys, (char *)g_getenv ("STOW_PYTHON"));
  for (guint i = 0; pythons[i]; i++)
    g_ptr_array_add (pys, (char *)pythons[i]);
  for (guint i = 0; i < pys->len; i++)
    {
      const char *argv[] = { g_ptr_array_index (pys, i),
                             script,
                             "--stowage",
                             g_getenv ("STOWAGE"),
                             "--workdir",
                             work,
                             "--backend",
                             backend,
                             NULL };
      g_autofree char *out = NULL, *err = NULL;
      int status = 0;
      if (!g_spawn_sync (NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL,
                         NULL, &out, &err, &status, NULL))
        continue;
      if (WIFEXITED (status) && WEXITSTATUS (status) == 77)
        continue; /* this python has no torch */
      g_test_message ("%s%s", out, err);
      g_autofree char *cmd = g_strdup_printf ("rm -rf '%s'", work);
      g_assert_cmpint (system (cmd), ==, 0);
      g_assert_true (WIFEXITED (status));
      g_assert_cmpint (WEXITSTATUS (status), ==, 0);
      return;
    }
  g_rmdir (work);
  g_test_skip ("python3 with torch not found (Debian: python3-torch)");
}

void
assert_same_checkpoint (const char *a, const char *b)
{
  g_autofree char *la = g_build_filename (a, "latest", NULL);
  g_autofree char *lb = g_build_filename (b, "latest", NULL);
  g_autofree char *files = stow_test_list_dir (la);
  g_autofree char *files_b = stow_test_list_dir (lb);
  g_assert_cmpstr (files, ==, files_b);
  g_auto (GStrv) names = g_strsplit (files, " ", -1);
  for (guint i = 0; names[i] != NULL; i++)
    {
      /* run.json records how each run ran (placement, paths): not state. */
      if (g_str_equal (names[i], "run.json"))
        continue;
      gboolean same = same_file (a, b, names[i]);
      g_test_message ("%s against %s: %s %s", b, a, names[i],
                      same ? "same" : "DIFFER");
      g_assert_true (same);
    }
}

/* The run's "@what peak:" line within 2% of the simulation. */
static void
assert_line_within (const StowRun *r, const char *what)
{
  const char *p = strstr (r->err, what);
  g_assert_nonnull (p);
  g_autofree char *line = g_strndup (p, strcspn (p, "\n"));
  const char *pct = strrchr (line, '(');
  g_assert_nonnull (pct);
  double d = g_ascii_strtod (pct + 1, NULL);
  g_test_message ("%s", line);
  g_assert_cmpfloat (d, <=, 2.0);
  g_assert_cmpfloat (d, >=, -2.0);
}

void
assert_peak_as_simulated (const StowRun *r)
{
  assert_line_within (r, "device peak: ");
}

void
assert_pinned_as_simulated (const StowRun *r)
{
  assert_line_within (r, "pinned host peak: ");
}

guint
latest_step (const char *out)
{
  g_autofree char *link = g_build_filename (out, "latest", NULL);
  g_autofree char *target = g_file_read_link (link, NULL);
  if (target == NULL)
    return 0;
  const char *dash = strrchr (target, '-');
  return dash ? (guint)g_ascii_strtoull (dash + 1, NULL, 10) : 0;
}

char *
make_dir (const Fixture *f, const char *name)
{
  char *d = g_build_filename (f->dir, name, NULL);
  g_assert_cmpint (g_mkdir_with_parents (d, 0755), ==, 0);
  return d;
}

guint
entries (const char *dir)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  guint n = 0;
  while (d && g_dir_read_name (d))
    n++;
  return n;
}

GPid
spawn_quiet (const char *const *argv)
{
  GPid pid;
  g_autoptr (GError) error = NULL;
  g_assert_true (g_spawn_async (NULL, (char **)argv, NULL,
                                G_SPAWN_DO_NOT_REAP_CHILD
                                    | G_SPAWN_STDOUT_TO_DEV_NULL
                                    | G_SPAWN_STDERR_TO_DEV_NULL,
                                NULL, NULL, &pid, &error));
  g_assert_no_error (error);
  return pid;
}

GPid
spawn_logged (const char *const *argv, const char *err_path)
{
  int fd = open (err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  g_assert_cmpint (fd, >=, 0);
  GPid pid;
  g_autoptr (GError) error = NULL;
  g_assert_true (g_spawn_async_with_fds (NULL, (char **)argv, NULL,
                                         G_SPAWN_DO_NOT_REAP_CHILD
                                             | G_SPAWN_STDOUT_TO_DEV_NULL,
                                         NULL, NULL, &pid, -1, -1, fd, &error));
  g_assert_no_error (error);
  close (fd);
  return pid;
}

gboolean
wait_for_text (const char *path, const char *text, guint timeout_ms)
{
  for (guint waited = 0; waited <= timeout_ms; waited++)
    {
      g_autofree char *c = NULL;
      if (g_file_get_contents (path, &c, NULL, NULL) && strstr (c, text))
        return TRUE;
      g_usleep (1000);
    }
  return FALSE;
}

int
kill_and_wait (GPid pid, int sig)
{
  kill (pid, sig);
  int st = 0;
  waitpid (pid, &st, 0);
  g_spawn_close_pid (pid);
  return st;
}

GArray *
log_losses (const char *log)
{
  g_autofree char *text = NULL;
  GArray *a = g_array_new (FALSE, FALSE, sizeof (double));
  g_assert_true (g_file_get_contents (log, &text, NULL, NULL));
  if (text == NULL)
    return a;
  g_auto (GStrv) lines = g_strsplit (g_strstrip (text), "\n", -1);
  for (guint i = 0; lines[i]; i++)
    {
      g_autoptr (JsonParser) p = json_parser_new ();
      g_assert_true (json_parser_load_from_data (p, lines[i], -1, NULL));
      double l = json_object_get_double_member (
          json_node_get_object (json_parser_get_root (p)), "loss");
      g_array_append_val (a, l);
    }
  return a;
}
