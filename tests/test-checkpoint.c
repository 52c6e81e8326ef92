/* SPDX-License-Identifier: MIT
 *
 * tests/test-checkpoint.c: the checkpoint directory protocol (latest names
 * the newest step; a step written twice is replaced; an abandoned or
 * killed writer leaves the previous checkpoint and `latest` intact, and
 * the next begin clears what it left), and the optimizer-state file: round
 * trips of 2 and 3 sections, checksums that catch a flipped byte, truncated
 * files, wrong versions and unfinished writers.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <xxhash.h>

#include "executor/checkpoint-private.h"
#include "executor/checkpoint.h"
#include "executor/optim-state.h"
#include "testutil-io.h"

typedef struct
{
  char *dir; /* scratch */
  char *out; /* dir/out: the checkpoint directory */
} Fixture;

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("checkpoint-test");
  f->out = g_build_filename (f->dir, "out", NULL);
  stow_checkpoint_use_exchange = TRUE;
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  stow_test_rm_rf (f->dir);
  g_free (f->out);
  g_free (f->dir);
}

/* ---- the directory protocol ---------------------------------------------- */

/* Writes "step N" into FILE in the writer's directory. */
static void
write_marker (StowCheckpointWriter *w, const char *file, guint64 step)
{
  g_autofree char *path
      = g_build_filename (stow_checkpoint_writer_dir (w), file, NULL);
  g_autofree char *text = g_strdup_printf ("step %" G_GUINT64_FORMAT, step);
  stow_test_write_file (path, text, strlen (text));
}

/* A whole checkpoint of @step: two files and a subdirectory. */
static void
commit_step (const char *out, guint64 step, const char *tag)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (out, step, &error);
  g_assert_no_error (error);
  write_marker (w, "config.json", step);
  g_autofree char *sub
      = g_build_filename (stow_checkpoint_writer_dir (w), "sub", NULL);
  g_assert_cmpint (g_mkdir (sub, 0755), ==, 0);
  g_autofree char *tag_path = g_build_filename (sub, "tag", NULL);
  stow_test_write_file (tag_path, tag, strlen (tag));
  g_assert_true (stow_checkpoint_commit (w, &error));
  g_assert_no_error (error);
}

static char *
read_text (const char *dir, const char *file)
{
  g_autofree char *path = g_build_filename (dir, file, NULL);
  g_autoptr (GBytes) b = stow_test_read_file (path);
  return g_strndup (g_bytes_get_data (b, NULL), g_bytes_get_size (b));
}

static char *
latest_ok (const char *out)
{
  g_autoptr (GError) error = NULL;
  char *dir = stow_checkpoint_latest (out, &error);
  g_assert_no_error (error);
  return dir;
}

static void
test_commit (Fixture *f, gconstpointer data)
{
  /* Nothing yet: no OUT, then an OUT with no link. */
  g_autofree char *none = latest_ok (f->out);
  g_assert_null (none);

  commit_step (f->out, 1, "a");
  g_autofree char *l1 = latest_ok (f->out);
  g_autofree char *step1 = g_build_filename (f->out, "step-000001", NULL);
  g_assert_cmpstr (l1, ==, step1);
  g_autofree char *c1 = read_text (l1, "config.json");
  g_assert_cmpstr (c1, ==, "step 1");

  commit_step (f->out, 20, "b");
  g_autofree char *l2 = latest_ok (f->out);
  g_autofree char *step20 = g_build_filename (f->out, "step-000020", NULL);
  g_assert_cmpstr (l2, ==, step20);
  /* The link is relative, so OUT can move. */
  g_autofree char *link = g_build_filename (f->out, "latest", NULL);
  g_autofree char *target = g_file_read_link (link, NULL);
  g_assert_cmpstr (target, ==, "step-000020");
  /* Nothing else is left: no temporary directory, no spare link. */
  g_autofree char *listing = stow_test_list_dir (f->out);
  g_assert_cmpstr (listing, ==, "latest step-000001 step-000020");

  /* Steps past six digits keep all of them. */
  commit_step (f->out, 12345678, "c");
  g_autofree char *l3 = latest_ok (f->out);
  g_assert_true (g_str_has_suffix (l3, "/step-12345678"));
}

static void
replace_same_step (Fixture *f, gboolean exchange)
{
  stow_checkpoint_use_exchange = exchange;
  commit_step (f->out, 3, "first");
  commit_step (f->out, 3, "second");
  g_autofree char *l = latest_ok (f->out);
  g_autofree char *tag = read_text (l, "sub/tag");
  g_assert_cmpstr (tag, ==, "second");
  g_autofree char *listing = stow_test_list_dir (f->out);
  g_assert_cmpstr (listing, ==, "latest step-000003");
}

static void
test_replace_exchange (Fixture *f, gconstpointer data)
{
  replace_same_step (f, TRUE);
}

static void
test_replace_aside (Fixture *f, gconstpointer data)
{
  replace_same_step (f, FALSE);
}

static void
test_abandoned (Fixture *f, gconstpointer data)
{
  commit_step (f->out, 2, "kept");
  g_autoptr (GError) error = NULL;
  StowCheckpointWriter *w = stow_checkpoint_begin (f->out, 3, &error);
  g_assert_no_error (error);
  g_assert_true (g_str_has_prefix (stow_checkpoint_writer_dir (w), f->out));
  g_autofree char *base = g_path_get_basename (stow_checkpoint_writer_dir (w));
  g_assert_true (g_str_has_prefix (base, ".step-000003.tmp-"));
  write_marker (w, "model.safetensors", 3);
  stow_checkpoint_writer_free (w);
  g_autofree char *listing = stow_test_list_dir (f->out);
  g_assert_cmpstr (listing, ==, "latest step-000002");
  g_autofree char *l = latest_ok (f->out);
  g_autofree char *tag = read_text (l, "sub/tag");
  g_assert_cmpstr (tag, ==, "kept");
}

/* A writer whose process dies before commit (no cleanup runs): the
 * previous checkpoint stands, and the next begin clears the leftovers,
 * including those of the move-aside path of a file system without
 * RENAME_EXCHANGE. */
static void
test_crash_before_commit (Fixture *f, gconstpointer data)
{
  commit_step (f->out, 2, "kept");
  pid_t pid = fork ();
  g_assert_cmpint (pid, >=, 0);
  if (pid == 0)
    {
      StowCheckpointWriter *w = stow_checkpoint_begin (f->out, 3, NULL);
      if (w != NULL)
        write_marker (w, "config.json", 3);
      _exit (w != NULL ? 0 : 1);
    }
  int status = 0;
  g_assert_cmpint (waitpid (pid, &status, 0), ==, pid);
  g_assert_true (WIFEXITED (status));
  g_assert_cmpint (WEXITSTATUS (status), ==, 0);
  g_autofree char *before = stow_test_list_dir (f->out);
  g_assert_true (g_str_has_prefix (before, ".step-000003.tmp-"));
  g_assert_true (g_str_has_suffix (before, " latest step-000002"));

  /* As a crash would leave them: a link about to become `latest`, and a
   * step moved aside whose replacement never landed (it goes back). */
  g_autofree char *spare
      = g_build_filename (f->out, ".latest.tmp-1234abcd", NULL);
  g_assert_cmpint (symlink ("step-000002", spare), ==, 0);
  g_autofree char *aside
      = g_build_filename (f->out, ".step-000001.old-Ab12Cd", NULL);
  g_assert_cmpint (g_mkdir (aside, 0755), ==, 0);
  g_autofree char *moved = g_build_filename (aside, "config.json", NULL);
  stow_test_write_file (moved, "step 1", 6);
  /* And one whose replacement did land (it goes). */
  g_autofree char *stale
      = g_build_filename (f->out, ".step-000002.old-Zz99Yy", NULL);
  g_assert_cmpint (g_mkdir (stale, 0755), ==, 0);

  g_autofree char *l = latest_ok (f->out);
  g_autofree char *tag = read_text (l, "sub/tag");
  g_assert_cmpstr (tag, ==, "kept");

  g_autoptr (GError) error = NULL;
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (f->out, 4, &error);
  g_assert_no_error (error);
  g_autofree char *base = g_path_get_basename (stow_checkpoint_writer_dir (w));
  g_autofree char *after = stow_test_list_dir (f->out);
  g_autofree char *want
      = g_strdup_printf ("%s latest step-000001 step-000002", base);
  g_assert_cmpstr (after, ==, want);
  g_autofree char *step1 = g_build_filename (f->out, "step-000001", NULL);
  g_autofree char *c1 = read_text (step1, "config.json");
  g_assert_cmpstr (c1, ==, "step 1");
}

/* Killed between the two renames of the move-aside path: `latest` names
 * a step that is not there, and its old directory is aside. */
static void
test_crash_mid_replace (Fixture *f, gconstpointer data)
{
  commit_step (f->out, 1, "old");
  g_autofree char *step1 = g_build_filename (f->out, "step-000001", NULL);
  g_autofree char *aside
      = g_build_filename (f->out, ".step-000001.old-Qw12Er", NULL);
  g_assert_cmpint (g_rename (step1, aside), ==, 0);
  g_autofree char *l = latest_ok (f->out);
  g_assert_cmpstr (l, ==, aside);
  g_autofree char *tag = read_text (l, "sub/tag");
  g_assert_cmpstr (tag, ==, "old");

  g_autoptr (GError) error = NULL;
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (f->out, 2, &error);
  g_assert_no_error (error);
  g_autofree char *back = latest_ok (f->out);
  g_assert_cmpstr (back, ==, step1);
  g_autofree char *tag_back = read_text (back, "sub/tag");
  g_assert_cmpstr (tag_back, ==, "old");
}

/* kill -9 at arbitrary moments of a loop of commits: whenever it lands,
 * `latest` names a complete checkpoint, every step-N directory is whole,
 * and the next begin leaves only those. */
static void
test_kill_during_commits (Fixture *f, gconstpointer data)
{
  GRand *rand = g_rand_new_with_seed (20240520);
  commit_step (f->out, 0, "0");
  for (guint round = 0; round < 12; round++)
    {
      stow_checkpoint_use_exchange = round % 3 != 2;
      int ready[2];
      g_assert_cmpint (pipe (ready), ==, 0);
      pid_t pid = fork ();
      g_assert_cmpint (pid, >=, 0);
      if (pid == 0)
        {
          close (ready[0]);
          gboolean told = FALSE;
          /* Steps repeat (mod 4) so that replacements are killed too. */
          for (guint64 step = 1;; step++)
            {
              g_autofree char *tag
                  = g_strdup_printf ("%" G_GUINT64_FORMAT, step % 4);
              commit_step (f->out, step % 4, tag);
              if (!told)
                {
                  told = write (ready[1], "r", 1) == 1;
                  close (ready[1]);
                }
            }
        }
      close (ready[1]);
      char c;
      g_assert_cmpint (read (ready[0], &c, 1), ==, 1);
      close (ready[0]);
      g_usleep (g_rand_int_range (rand, 0, 30000));
      g_assert_cmpint (kill (pid, SIGKILL), ==, 0);
      int status = 0;
      g_assert_cmpint (waitpid (pid, &status, 0), ==, pid);
      /* Killed by us, not by a failed assertion in the child. */
      g_assert_true (WIFSIGNALED (status));
      g_assert_cmpint (WTERMSIG (status), ==, SIGKILL);

      g_autofree char *l = latest_ok (f->out);
      g_assert_nonnull (l);
      g_autoptr (GDir) d = g_dir_open (f->out, 0, NULL);
      const char *name;
      while ((name = g_dir_read_name (d)) != NULL)
        {
          if (!g_str_has_prefix (name, "step-"))
            continue;
          g_autofree char *dir = g_build_filename (f->out, name, NULL);
          g_autofree char *config = read_text (dir, "config.json");
          g_autofree char *tag = read_text (dir, "sub/tag");
          guint64 step = g_ascii_strtoull (name + 5, NULL, 10);
          g_autofree char *want
              = g_strdup_printf ("step %" G_GUINT64_FORMAT, step);
          g_assert_cmpstr (config, ==, want);
          g_assert_cmpuint (g_ascii_strtoull (tag, NULL, 10), ==, step);
        }
    }
  g_rand_free (rand);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCheckpointWriter) w
      = stow_checkpoint_begin (f->out, 9, &error);
  g_assert_no_error (error);
  g_autoptr (GDir) d = g_dir_open (f->out, 0, NULL);
  const char *name;
  guint n = 0;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      n++;
      g_assert_true (g_str_has_prefix (name, "step-")
                     || strcmp (name, "latest") == 0
                     || g_str_has_prefix (name, ".step-000009.tmp-"));
    }
  g_assert_cmpuint (n, >=, 3);
}

static void
assert_latest_invalid (const char *out, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *l = stow_checkpoint_latest (out, &error);
  g_assert_null (l);
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_INVALID);
  g_autofree char *link = g_build_filename (out, "latest", NULL);
  if (!g_str_has_prefix (error->message, link)
      || strstr (error->message, fragment) == NULL)
    g_error ("expected \"%s\" in: %s", fragment, error->message);
}

static void
test_latest_invalid (Fixture *f, gconstpointer data)
{
  g_assert_cmpint (g_mkdir (f->out, 0755), ==, 0);
  g_autofree char *none = latest_ok (f->out);
  g_assert_null (none);
  g_autofree char *link = g_build_filename (f->out, "latest", NULL);

  g_assert_cmpint (symlink ("step-000007", link), ==, 0);
  assert_latest_invalid (f->out, "points to step-000007, which does not "
                                 "exist");
  g_unlink (link);

  g_autofree char *tmp
      = g_build_filename (f->out, ".step-000007.tmp-abcdef", NULL);
  g_assert_cmpint (g_mkdir (tmp, 0755), ==, 0);
  g_assert_cmpint (symlink (".step-000007.tmp-abcdef", link), ==, 0);
  assert_latest_invalid (f->out, "points to .step-000007.tmp-abcdef, which "
                                 "is not a complete checkpoint");
  g_unlink (link);

  g_autofree char *file = g_build_filename (f->out, "step-000008", NULL);
  stow_test_write_file (file, "x", 1);
  g_assert_cmpint (symlink ("step-000008", link), ==, 0);
  assert_latest_invalid (f->out, "which is not a complete checkpoint");
  g_unlink (link);

  stow_test_write_file (link, "step-000001", 11);
  assert_latest_invalid (f->out, "not a symbolic link");
}

/* A commit that cannot replace `latest` (here a directory is in its way)
 * undoes its rename: what existed before is as it was. */
static void
test_commit_failure_rolls_back (Fixture *f, gconstpointer data)
{
  for (int exchange = 1; exchange >= 0; exchange--)
    {
      stow_checkpoint_use_exchange = exchange;
      commit_step (f->out, 5, "old");
      g_autofree char *link = g_build_filename (f->out, "latest", NULL);
      g_assert_cmpint (g_unlink (link), ==, 0);
      g_autofree char *blocker = g_build_filename (link, "x", NULL);
      g_assert_cmpint (g_mkdir_with_parents (blocker, 0755), ==, 0);

      g_autoptr (GError) error = NULL;
      g_autoptr (StowCheckpointWriter) w
          = stow_checkpoint_begin (f->out, 5, &error);
      write_marker (w, "config.json", 5);
      g_assert_false (stow_checkpoint_commit (w, &error));
      g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_IO);
      g_assert_nonnull (strstr (error->message, "replacing latest"));
      g_clear_error (&error);
      g_autofree char *step5 = g_build_filename (f->out, "step-000005", NULL);
      g_autofree char *tag = read_text (step5, "sub/tag");
      g_assert_cmpstr (tag, ==, "old");
      g_clear_pointer (&w, stow_checkpoint_writer_free);

      /* A new step: it is not left behind as step-000006 either. */
      w = stow_checkpoint_begin (f->out, 6, &error);
      g_assert_false (stow_checkpoint_commit (w, &error));
      g_clear_pointer (&w, stow_checkpoint_writer_free);
      g_autofree char *listing = stow_test_list_dir (f->out);
      g_assert_cmpstr (listing, ==, "latest step-000005");
      stow_test_rm_rf (link);
    }
}

/* ---- the optimizer-state file -------------------------------------------- */

/* Float i of a section, distinct per tensor and section. */
static float
value (guint t, guint s, guint64 i)
{
  return (float)t * 1000.0f + (float)s * 100.0f + (float)i * 0.25f;
}

static JsonObject *
make_state (void)
{
  g_autoptr (JsonParser) p = json_parser_new ();
  g_assert_true (json_parser_load_from_data (
      p,
      "{\"step\": 42, \"lr\": 0.0003, \"data\": {\"position\": 123456},"
      " \"rng\": [1, 2, 3], \"beta1\": 0.9, \"name\": \"adamw\"}",
      -1, NULL));
  return json_object_ref (json_node_get_object (json_parser_get_root (p)));
}

static const StowOptimStateSpec opt_specs[] = {
  { .name = "model.layers.0.mlp.up_proj.weight",
    .n = 1000,
    .n_sections = 2,
    .sections = { "m", "v" } },
  { .name = "model.norm.weight",
    .n = 7,
    .n_sections = 3,
    .sections = { "master", "m", "v" } },
  { .name = "empty", .n = 0, .n_sections = 2, .sections = { "m", "v" } },
  { .name = "lm_head.weight",
    .n = 33,
    .n_sections = 3,
    .sections = { "master", "m", "v" } },
};

/* Streams every section of opt_specs in pieces of 1 to 97 floats (pieces
 * run across sections and tensors). */
static StowOptimStateWriter *
write_opt (const char *path, gboolean finish)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonObject) state = make_state ();
  StowOptimStateWriter *w = stow_optim_state_writer_new (
      path, opt_specs, G_N_ELEMENTS (opt_specs), state, &error);
  g_assert_no_error (error);
  /* The caller may change its object afterwards: the header has a copy. */
  json_object_set_string_member (state, "name", "changed after the fact");
  g_autoptr (GArray) all = g_array_new (FALSE, FALSE, sizeof (float));
  for (guint t = 0; t < G_N_ELEMENTS (opt_specs); t++)
    for (guint s = 0; s < opt_specs[t].n_sections; s++)
      for (guint64 i = 0; i < opt_specs[t].n; i++)
        {
          float v = value (t, s, i);
          g_array_append_val (all, v);
        }
  guint64 done = 0;
  for (guint piece = 1; done < all->len; piece = piece * 7 % 97 + 1)
    {
      guint64 n = MIN (piece, all->len - done);
      g_assert_true (stow_optim_state_writer_write (
          w, &g_array_index (all, float, done), n, &error));
      g_assert_no_error (error);
      done += n;
    }
  if (finish)
    {
      g_assert_true (stow_optim_state_writer_finish (w, &error));
      g_assert_no_error (error);
    }
  return w;
}

static void
read_section_ok (StowOptimState *s, guint t, guint sec)
{
  const StowOptimStateSpec *sp = &opt_specs[t];
  g_autoptr (GError) error = NULL;
  g_autofree float *buf = g_new (float, sp->n + 1);
  g_assert_true (stow_optim_state_read (s, sp->name, sp->sections[sec], 0,
                                        sp->n, buf, &error));
  g_assert_no_error (error);
  for (guint64 i = 0; i < sp->n; i++)
    g_assert_cmpfloat (buf[i], ==, value (t, sec, i));
}

static void
test_optim_round_trip (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "optimizer.stow", NULL);
  g_autoptr (StowOptimStateWriter) w = write_opt (path, TRUE);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
  g_assert_no_error (error);
  JsonObject *state = stow_optim_state_get_state (s);
  g_assert_cmpint (json_object_get_int_member (state, "step"), ==, 42);
  g_assert_cmpfloat (json_object_get_double_member (state, "lr"), ==, 0.0003);
  g_assert_cmpstr (json_object_get_string_member (state, "name"), ==, "adamw");
  g_assert_cmpint (
      json_object_get_int_member (json_object_get_object_member (state, "data"),
                                  "position"),
      ==, 123456);
  g_assert_cmpuint (stow_optim_state_n_tensors (s), ==,
                    G_N_ELEMENTS (opt_specs));
  for (guint t = 0; t < G_N_ELEMENTS (opt_specs); t++)
    {
      const StowOptimStateSpec *sp = &opt_specs[t];
      g_assert_cmpuint (stow_optim_state_tensor_n (s, sp->name), ==, sp->n);
      for (guint sec = 0; sec < sp->n_sections; sec++)
        {
          g_assert_true (
              stow_optim_state_has_section (s, sp->name, sp->sections[sec]));
          read_section_ok (s, t, sec);
        }
      g_assert_false (stow_optim_state_has_section (s, sp->name, "other"));
    }
  g_assert_cmpuint (stow_optim_state_tensor_n (s, "absent"), ==, 0);
  g_assert_false (stow_optim_state_has_section (s, "absent", "m"));

  /* Pieces from the middle, and consecutive pieces that cover a section. */
  float buf[1000];
  const char *big = opt_specs[0].name;
  g_assert_true (stow_optim_state_read (s, big, "v", 500, 3, buf, &error));
  for (guint i = 0; i < 3; i++)
    g_assert_cmpfloat (buf[i], ==, value (0, 1, 500 + i));
  for (guint64 first = 0; first < 1000; first += 300)
    {
      guint64 n = MIN (300, 1000 - first);
      g_assert_true (
          stow_optim_state_read (s, big, "m", first, n, buf, &error));
      g_assert_no_error (error);
      g_assert_cmpfloat (buf[0], ==, value (0, 0, first));
    }

  /* Unknown names and ranges past the tensor are a mismatch. */
  g_assert_false (stow_optim_state_read (s, "absent", "m", 0, 1, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH);
  g_assert_nonnull (strstr (error->message, "no tensor \"absent\""));
  g_clear_error (&error);
  g_assert_false (stow_optim_state_read (s, big, "m", 999, 2, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH);
  g_clear_error (&error);

  /* The layout the format promises: every section 64-byte aligned in the
   * file, data right after the padded header. */
  g_autoptr (GBytes) bytes = stow_test_read_file (path);
  const guint8 *raw = g_bytes_get_data (bytes, NULL);
  g_assert_cmpmem (raw, 8, "STOWOPT\0", 8);
  guint32 version;
  guint64 hlen;
  memcpy (&version, raw + 8, 4);
  memcpy (&hlen, raw + 12, 8);
  g_assert_cmpuint (GUINT32_FROM_LE (version), ==, 1);
  hlen = GUINT64_FROM_LE (hlen);
  guint64 data_start = 28 + hlen;
  g_assert_cmpuint (data_start % 64, ==, 0);
  g_autoptr (JsonParser) p = json_parser_new ();
  g_assert_true (json_parser_load_from_data (p, (const char *)raw + 28,
                                             (gssize)hlen, &error));
  JsonObject *root = json_node_get_object (json_parser_get_root (p));
  JsonArray *tensors = json_object_get_array_member (root, "tensors");
  g_assert_cmpuint (json_array_get_length (tensors), ==, 4);
  JsonObject *t1 = json_array_get_object_element (tensors, 1);
  g_assert_cmpstr (json_object_get_string_member (t1, "name"), ==,
                   "model.norm.weight");
  JsonArray *secs = json_object_get_array_member (t1, "sections");
  g_assert_cmpuint (json_array_get_length (secs), ==, 3);
  for (guint k = 0; k < 3; k++)
    {
      JsonObject *sec = json_array_get_object_element (secs, k);
      guint64 off = (guint64)json_object_get_int_member (sec, "offset");
      g_assert_cmpuint ((data_start + off) % 64, ==, 0);
      g_assert_cmpint (json_object_get_int_member (sec, "bytes"), ==, 28);
      /* The streamed checksum is libxxhash's one-shot XXH3 of the bytes. */
      g_autofree char *sum
          = g_strdup_printf ("%016" G_GINT64_MODIFIER "x",
                             (guint64)XXH3_64bits (raw + data_start + off, 28));
      g_assert_cmpstr (json_object_get_string_member (sec, "xxh3"), ==, sum);
    }
  guint64 header_sum;
  memcpy (&header_sum, raw + 20, 8);
  g_assert_cmpuint (GUINT64_FROM_LE (header_sum), ==,
                    (guint64)XXH3_64bits (raw + 28, hlen));
}

/* Flips one bit of @path at @offset. */
static void
flip_byte (const char *path, guint64 offset)
{
  g_autoptr (GBytes) b = stow_test_read_file (path);
  gsize len;
  const guint8 *raw = g_bytes_get_data (b, &len);
  g_autofree guint8 *copy = g_memdup2 (raw, len);
  g_assert_cmpuint (offset, <, len);
  copy[offset] ^= 0x10;
  stow_test_write_file (path, copy, len);
}

/* The file offset of a section, from the file's own header. */
static guint64
section_offset (const char *path, guint t, guint sec)
{
  g_autoptr (GBytes) b = stow_test_read_file (path);
  const guint8 *raw = g_bytes_get_data (b, NULL);
  guint64 hlen;
  memcpy (&hlen, raw + 12, 8);
  hlen = GUINT64_FROM_LE (hlen);
  g_autoptr (JsonParser) p = json_parser_new ();
  g_assert_true (json_parser_load_from_data (p, (const char *)raw + 28,
                                             (gssize)hlen, NULL));
  JsonObject *root = json_node_get_object (json_parser_get_root (p));
  JsonObject *tensor = json_array_get_object_element (
      json_object_get_array_member (root, "tensors"), t);
  JsonObject *s = json_array_get_object_element (
      json_object_get_array_member (tensor, "sections"), sec);
  return 28 + hlen + (guint64)json_object_get_int_member (s, "offset");
}

static void
test_optim_checksum (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "optimizer.stow", NULL);
  g_autoptr (StowOptimStateWriter) w = write_opt (path, TRUE);
  guint64 v_at = section_offset (path, 0, 1);
  flip_byte (path, v_at + 4 * 321 + 2);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
  g_assert_no_error (error);
  read_section_ok (s, 0, 0); /* "m" is intact */
  float buf[1000];
  const char *name = opt_specs[0].name;
  g_assert_false (stow_optim_state_read (s, name, "v", 0, 1000, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_autofree char *want = g_strdup_printf (
      "%s: tensor \"%s\": section \"v\" (file offset %" G_GUINT64_FORMAT
      ", 4000 bytes): xxh3 is ",
      path, name, v_at);
  if (!g_str_has_prefix (error->message, want))
    g_error ("expected \"%s\" in: %s", want, error->message);
  g_clear_error (&error);
  /* Read in pieces, the section is caught at its last piece. */
  g_assert_true (stow_optim_state_read (s, name, "v", 0, 600, buf, &error));
  g_assert_false (stow_optim_state_read (s, name, "v", 600, 400, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_clear_error (&error);
  /* A piece that does not cover the section is not checked. */
  g_assert_true (stow_optim_state_read (s, name, "v", 300, 100, buf, &error));
  g_clear_pointer (&s, stow_optim_state_close);

  /* A flipped byte in the header (here inside the caller's state). */
  g_autoptr (GBytes) b = stow_test_read_file (path);
  const char *raw = g_bytes_get_data (b, NULL);
  const char *step = g_strstr_len (raw + 28, 200, "\"step\":42");
  g_assert_nonnull (step);
  flip_byte (path, (guint64)(step - raw) + 7);
  g_assert_null (stow_optim_state_open (path, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_autofree char *hdr = g_strdup_printf ("%s: header: xxh3 is ", path);
  g_assert_true (g_str_has_prefix (error->message, hdr));
}

static void
assert_open_invalid (const char *path, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
  g_assert_null (s);
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_INVALID);
  if (!g_str_has_prefix (error->message, path)
      || strstr (error->message, fragment) == NULL)
    g_error ("expected \"%s\" in: %s", fragment, error->message);
}

static void
test_optim_truncated_and_version (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "optimizer.stow", NULL);
  g_autoptr (StowOptimStateWriter) w = write_opt (path, TRUE);
  g_autoptr (GBytes) good = stow_test_read_file (path);
  gsize len;
  const guint8 *raw = g_bytes_get_data (good, &len);

  /* Cut inside the last section. */
  stow_test_write_file (path, raw, len - 10);
  assert_open_invalid (path, "tensor \"lm_head.weight\": section \"v\": "
                             "offset");
  assert_open_invalid (path, "the file is truncated");
  /* Cut inside the prefix, and before the header's end. */
  stow_test_write_file (path, raw, 20);
  assert_open_invalid (path, "20 bytes, shorter than the 28-byte prefix");
  stow_test_write_file (path, raw, 100);
  assert_open_invalid (path, "past the end of the file (100 bytes)");
  /* Bytes after the last section. */
  g_autofree guint8 *longer = g_malloc0 (len + 64);
  memcpy (longer, raw, len);
  stow_test_write_file (path, longer, len + 64);
  assert_open_invalid (path, "64 bytes of data after the last section");

  /* Another version, another magic. */
  g_autofree guint8 *copy = g_memdup2 (raw, len);
  guint32 v2 = GUINT32_TO_LE (2);
  memcpy (copy + 8, &v2, 4);
  stow_test_write_file (path, copy, len);
  assert_open_invalid (path, "version is 2, this build reads version 1");
  memcpy (copy, "STOWOPT\1", 8);
  stow_test_write_file (path, copy, len);
  assert_open_invalid (path, "magic: not an optimizer-state file");

  g_autoptr (GError) error = NULL;
  g_autofree char *missing = g_build_filename (f->dir, "missing.stow", NULL);
  g_assert_null (stow_optim_state_open (missing, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_IO);
  g_assert_true (g_str_has_prefix (error->message, missing));
}

static void
test_optim_unfinished (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "optimizer.stow", NULL);
  /* All data written, never finished: the checksums are still pending
   * (as a writer killed at that moment leaves the file). */
  StowOptimStateWriter *w = write_opt (path, FALSE);
  g_autoptr (GBytes) partial = stow_test_read_file (path);
  g_autofree char *copy = g_build_filename (f->dir, "copy.stow", NULL);
  stow_test_write_file (copy, g_bytes_get_data (partial, NULL),
                        g_bytes_get_size (partial));
  assert_open_invalid (copy, "xxh3 is pending: the writer never finished");
  /* Freeing it removes the file. */
  stow_optim_state_writer_free (w);
  g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));

  /* Too few floats, too many. */
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonObject) state = make_state ();
  w = stow_optim_state_writer_new (path, opt_specs, 2, state, &error);
  float buf[1200] = { 0 };
  g_assert_true (stow_optim_state_writer_write (w, buf, 1003, &error));
  g_assert_false (stow_optim_state_writer_finish (w, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "tensor \"model.layers.0.mlp."
                                            "up_proj.weight\": section \"v\" "
                                            "got 3 of its 1000 floats"));
  g_clear_error (&error);
  stow_optim_state_writer_free (w);
  g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));

  w = stow_optim_state_writer_new (path, opt_specs, 2, state, &error);
  g_assert_true (stow_optim_state_writer_write (w, buf, 1200, &error));
  g_assert_false (stow_optim_state_writer_write (w, buf, 822, &error));
  g_assert_nonnull (strstr (error->message, "1 floats past the declared "
                                            "sections (821 left)"));
  g_clear_error (&error);
  g_assert_false (stow_optim_state_writer_finish (w, &error));
  g_clear_error (&error);
  stow_optim_state_writer_free (w);

  /* Specs that cannot be written. */
  static const StowOptimStateSpec twice[] = {
    { .name = "a", .n = 1, .n_sections = 2, .sections = { "m", "m" } },
  };
  g_assert_null (stow_optim_state_writer_new (path, twice, 1, state, &error));
  g_assert_nonnull (strstr (error->message, "tensor \"a\": section 1 has no "
                                            "name or repeats one"));
  g_clear_error (&error);
  static const StowOptimStateSpec none[] = {
    { .name = "a", .n = 1, .n_sections = 0 },
  };
  g_assert_null (stow_optim_state_writer_new (path, none, 1, state, &error));
  g_assert_nonnull (strstr (error->message, "0 sections, expected 1 to 4"));
  g_clear_error (&error);

  /* A state that JSON cannot carry. */
  json_object_set_double_member (state, "loss", NAN);
  g_assert_null (
      stow_optim_state_writer_new (path, opt_specs, 2, state, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "state: not JSON once written"));
  g_clear_error (&error);
  g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
}

/* ---- one writer per directory, the committed checkpoints --------------- */

/* The lock is the kernel's: a second taker is refused naming the first's
 * pid (flock conflicts between two open file descriptions of one process
 * as between two processes), a child that dies with it held leaves it
 * free, and releasing it leaves OUT as it was. */
static void
test_run_lock (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  StowRunLock *a = stow_run_lock_take (f->out, &error);
  g_assert_no_error (error);
  g_assert_nonnull (a);
  g_assert_true (stow_run_lock_created_dir (a));
  g_autofree char *holder = read_text (f->out, ".lock");
  g_autofree char *pid = g_strdup_printf ("pid %d\n", (int)getpid ());
  g_assert_true (g_str_has_prefix (holder, pid));
  g_assert_null (stow_run_lock_take (f->out, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_BUSY);
  g_autofree char *named = g_strdup_printf ("%s is being trained by pid %d on ",
                                            f->out, (int)getpid ());
  g_assert_true (g_str_has_prefix (error->message, named));
  g_assert_nonnull (
      strstr (error->message, "wait for it or use another --out"));
  g_clear_error (&error);
  stow_run_lock_release (a, TRUE);
  /* Released: the file is gone, and so is the OUT it created. */
  g_assert_false (g_file_test (f->out, G_FILE_TEST_EXISTS));

  /* Held by a process killed with SIGKILL: free again at once. */
  pid_t child = fork ();
  g_assert_cmpint (child, >=, 0);
  if (child == 0)
    {
      StowRunLock *c = stow_run_lock_take (f->out, NULL);
      if (c == NULL)
        _exit (3);
      raise (SIGKILL);
      _exit (4);
    }
  int st = 0;
  g_assert_cmpint (waitpid (child, &st, 0), ==, child);
  g_assert_true (WIFSIGNALED (st));
  g_autofree char *lock = g_build_filename (f->out, ".lock", NULL);
  g_assert_true (g_file_test (lock, G_FILE_TEST_EXISTS)); /* left, unlocked */
  StowRunLock *b = stow_run_lock_take (f->out, &error);
  g_assert_no_error (error);
  g_assert_false (stow_run_lock_created_dir (b));
  stow_run_lock_release (b, TRUE);
  /* An OUT the lock did not create stays. */
  g_assert_true (g_file_test (f->out, G_FILE_TEST_IS_DIR));
  g_assert_false (g_file_test (lock, G_FILE_TEST_EXISTS));
}

static void
test_list_and_remove (Fixture *f, gconstpointer data)
{
  g_autoptr (GError) error = NULL;
  g_auto (GStrv) none = stow_checkpoint_list (f->out, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (g_strv_length (none), ==, 0);
  commit_step (f->out, 20, "a");
  commit_step (f->out, 3, "b");
  commit_step (f->out, 1000000, "c");
  /* Neither a file named like a step nor a temporary directory counts. */
  g_autofree char *file = g_build_filename (f->out, "step-000004", NULL);
  stow_test_write_file (file, "x", 1);
  g_autofree char *tmp
      = g_build_filename (f->out, ".step-000005.tmp-AAAAAA", NULL);
  g_assert_cmpint (g_mkdir (tmp, 0755), ==, 0);
  g_auto (GStrv) names = stow_checkpoint_list (f->out, &error);
  g_assert_no_error (error);
  g_autofree char *joined = g_strjoinv (" ", names);
  g_assert_cmpstr (joined, ==, "step-000003 step-000020 step-1000000");
  g_assert_cmpuint (stow_checkpoint_name_step (names[2]), ==, 1000000);
  g_assert_true (stow_checkpoint_remove_others (f->out, "step-000020", &error));
  g_assert_no_error (error);
  g_autofree char *listing = stow_test_list_dir (f->out);
  g_assert_cmpstr (listing, ==,
                   ".step-000005.tmp-AAAAAA latest step-000004 step-000020");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  umask (022);
#define ADD(path, fn)                                                          \
  g_test_add (path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD ("/checkpoint/commit", test_commit);
  ADD ("/checkpoint/replace/exchange", test_replace_exchange);
  ADD ("/checkpoint/replace/aside", test_replace_aside);
  ADD ("/checkpoint/abandoned", test_abandoned);
  ADD ("/checkpoint/crash-before-commit", test_crash_before_commit);
  ADD ("/checkpoint/crash-mid-replace", test_crash_mid_replace);
  ADD ("/checkpoint/kill-during-commits", test_kill_during_commits);
  ADD ("/checkpoint/latest-invalid", test_latest_invalid);
  ADD ("/checkpoint/commit-failure-rolls-back", test_commit_failure_rolls_back);
  ADD ("/checkpoint/run-lock", test_run_lock);
  ADD ("/checkpoint/list-and-remove", test_list_and_remove);
  ADD ("/optim/round-trip", test_optim_round_trip);
  ADD ("/optim/checksum", test_optim_checksum);
  ADD ("/optim/truncated-and-version", test_optim_truncated_and_version);
  ADD ("/optim/unfinished", test_optim_unfinished);
#undef ADD
  return g_test_run ();
}
