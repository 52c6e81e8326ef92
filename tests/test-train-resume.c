/* SPDX-License-Identifier: MIT
 *
 * tests/test-train-resume.c: `stowage train` keeps every checkpoint it
 * promised (issue 36): one writer per --out (a second run is refused
 * naming the first, two started at once leave one run's bytes), a run
 * that would replace another's checkpoints refused without --overwrite,
 * --resume and --resume-from refusing every change that would break the
 * bit-identity promise and allowing the rest, SIGTERM and SIGUSR1
 * stopping with a checkpoint that resumes to the uninterrupted bytes, the
 * log after a resume, and kill -9 at every syscall of the checkpoint
 * protocol (tests/checkpoint-killer.c, preloaded).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "testutil-train.h"

static gboolean
has (const char *out, const char *name)
{
  g_autofree char *p = g_build_filename (out, name, NULL);
  return g_file_test (p, G_FILE_TEST_EXISTS);
}

static char *
read_all (const char *path)
{
  char *text = NULL;
  g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
  return text;
}

static gint
by_name (gconstpointer a, gconstpointer b)
{
  return g_strcmp0 (*(const char *const *)a, *(const char *const *)b);
}

/* ---- one writer ---------------------------------------------------------- */

/* A second run on a live run's --out is refused naming the first, with
 * or without --resume, and changes nothing: the first goes on and is
 * stopped normally afterwards. */
static void
test_one_writer (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "a.err", NULL);
  g_autoptr (GPtrArray) a = train_argv (
      &f, out,
      (const char *const[]){ "--steps", "100000", "--save-every", "3", NULL });
  GPid pid = spawn_logged ((const char *const *)a->pdata, log);
  g_assert_true (wait_for_text (log, "step 4/", 20000));
  g_autofree char *named
      = g_strdup_printf ("%s is being trained by pid %d on ", out, (int)pid);
  const char *const *seconds[] = {
    (const char *const[]){ "--steps", "50", "--resume", NULL },
    (const char *const[]){ "--steps", "50", NULL },
    (const char *const[]){ "--steps", "50", "--overwrite", NULL },
  };
  for (guint i = 0; i < G_N_ELEMENTS (seconds); i++)
    {
      g_auto (StowRun) r = { 0 };
      trainv (&r, &f, out, seconds[i]);
      g_test_message ("%s", r.err);
      g_assert_cmpint (r.status, ==, 2);
      g_assert_nonnull (strstr (r.err, named));
      g_assert_nonnull (strstr (r.err, "wait for it or use another --out"));
      g_assert_null (strstr (r.err, "step 1/"));
    }
  /* The first run was not disturbed: it goes on, and stops as asked. */
  g_autofree char *later = g_strdup_printf ("step %u/", latest_step (out) + 6);
  g_assert_true (wait_for_text (log, later, 20000));
  int st = kill_and_wait (pid, SIGTERM);
  g_assert_true (WIFSIGNALED (st));
  g_assert_cmpint (WTERMSIG (st), ==, SIGTERM);
  g_autofree char *err = read_all (log);
  g_autofree char *stopped = g_strdup_printf (
      "stopped at step %u; continue with --resume", latest_step (out));
  g_assert_nonnull (strstr (err, stopped));
  g_assert_false (has (out, ".lock"));
  fixture_clear (&f);
}

/* Two runs started at once on one --out: one trains, the other is
 * refused (by the lock, or by the checkpoints the first left when it was
 * quicker still), and OUT holds the one run's bytes. */
static void
test_two_at_once (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *straight = g_build_filename (f.dir, "straight", NULL);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  const char *const flags[]
      = { "--steps", "60", "--save-every", "5", "--threads", "1", NULL };
  g_auto (StowRun) r0 = { 0 };
  trainv (&r0, &f, straight, flags);
  g_assert_cmpint (r0.status, ==, 0);
  g_autoptr (GPtrArray) argv = train_argv (&f, out, flags);
  g_autofree char *log_a = g_build_filename (f.dir, "a.err", NULL);
  g_autofree char *log_b = g_build_filename (f.dir, "b.err", NULL);
  GPid pa = spawn_logged ((const char *const *)argv->pdata, log_a);
  GPid pb = spawn_logged ((const char *const *)argv->pdata, log_b);
  int sa = 0, sb = 0;
  waitpid (pa, &sa, 0);
  waitpid (pb, &sb, 0);
  g_spawn_close_pid (pa);
  g_spawn_close_pid (pb);
  g_assert_true (WIFEXITED (sa) && WIFEXITED (sb));
  g_test_message ("exit statuses %d and %d", WEXITSTATUS (sa),
                  WEXITSTATUS (sb));
  g_assert_cmpint (WEXITSTATUS (sa) + WEXITSTATUS (sb), ==, 2);
  g_assert_cmpint (MIN (WEXITSTATUS (sa), WEXITSTATUS (sb)), ==, 0);
  g_autofree char *loser = read_all (WEXITSTATUS (sa) == 2 ? log_a : log_b);
  g_test_message ("%s", loser);
  g_assert_true (strstr (loser, "is being trained by pid") != NULL
                 || strstr (loser, "already holds checkpoints") != NULL);
  assert_same_checkpoint (straight, out);
  fixture_clear (&f);
}

/* ---- another run's checkpoints --------------------------------------------
 */

static void
test_overwrite (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *fresh = g_build_filename (f.dir, "fresh", NULL);
  g_autofree char *swap = make_dir (&f, "swap");
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, out, "--steps", "3", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_autofree char *before = contents (out, "optimizer.stow");
  /* Without --resume: refused, nothing touched. */
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, out, "--steps", "2", NULL);
  g_assert_cmpint (r2.status, ==, 2);
  g_assert_nonnull (strstr (r2.err, "already holds checkpoints (step-000003)"));
  g_assert_nonnull (strstr (r2.err, "--overwrite"));
  g_assert_cmpuint (latest_step (out), ==, 3);
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, out, "--steps", "2", "--overwrite", "--resume", NULL);
  g_assert_cmpint (r3.status, ==, 2);
  g_assert_nonnull (strstr (r3.err, "--overwrite and --resume"));
  /* --overwrite with a run that fails at its first step: the old
   * checkpoints stay, latest with them. */
  g_auto (StowRun) r4 = { 0 };
  train (&r4, &f, out, "--steps", "2", "--overwrite", "--offload-optimizer",
         "nvme", "--nvme-dir", swap, "--test-nvme-fault", "eio:1", NULL);
  g_assert_cmpint (r4.status, ==, 2);
  g_assert_cmpuint (latest_step (out), ==, 3);
  g_assert_true (has (out, "step-000003"));
  g_autofree char *after = contents (out, "optimizer.stow");
  g_assert_cmpstr (after, ==, before);
  /* --overwrite with a run that succeeds: only its checkpoints remain,
   * the bytes of the same run into a fresh directory. */
  g_auto (StowRun) r5 = { 0 };
  train (&r5, &f, out, "--steps", "2", "--seed", "9", "--shuffle",
         "--overwrite", NULL);
  g_assert_cmpint (r5.status, ==, 0);
  g_autofree char *listing = NULL;
  {
    g_autoptr (GDir) d = g_dir_open (out, 0, NULL);
    g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
    const char *n;
    while ((n = g_dir_read_name (d)) != NULL)
      g_ptr_array_add (names, g_strdup (n));
    g_ptr_array_sort (names, by_name);
    g_ptr_array_add (names, NULL);
    listing = g_strjoinv (" ", (char **)names->pdata);
  }
  g_assert_cmpstr (listing, ==, "latest step-000002");
  g_auto (StowRun) r6 = { 0 };
  train (&r6, &f, fresh, "--steps", "2", "--seed", "9", "--shuffle", NULL);
  g_assert_cmpint (r6.status, ==, 0);
  assert_same_checkpoint (fresh, out);
  fixture_clear (&f);
}

/* Where a resume starts: the newest complete checkpoint when `latest` is
 * gone, --resume-from a step of OUT or a directory elsewhere; each gives
 * the uninterrupted run's bytes. */
static void
test_resume_from (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *straight = g_build_filename (f.dir, "straight", NULL);
  g_autofree char *a = g_build_filename (f.dir, "a", NULL);
  g_autofree char *b = g_build_filename (f.dir, "b", NULL);
  g_autofree char *c = g_build_filename (f.dir, "c", NULL);
  g_autofree char *d = g_build_filename (f.dir, "d", NULL);
  g_auto (StowRun) r0 = { 0 };
  train (&r0, &f, straight, "--steps", "6", NULL);
  g_assert_cmpint (r0.status, ==, 0);

  /* latest removed: --resume said "no checkpoint" and wrote over them. */
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, a, "--steps", "4", "--save-every", "1", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_autofree char *link = g_build_filename (a, "latest", NULL);
  g_assert_cmpint (g_unlink (link), ==, 0);
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, a, "--steps", "6", "--resume", NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_assert_nonnull (strstr (r2.err, "latest is missing; resuming from the "
                                    "newest complete checkpoint"));
  g_assert_nonnull (strstr (r2.err, "resuming from step 4"));
  assert_same_checkpoint (straight, a);

  /* --resume-from STEP: an earlier step of OUT. */
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, b, "--steps", "4", "--save-every", "1", NULL);
  g_assert_cmpint (r3.status, ==, 0);
  g_auto (StowRun) r4 = { 0 };
  train (&r4, &f, b, "--steps", "6", "--resume-from", "2", NULL);
  g_assert_cmpint (r4.status, ==, 0);
  g_assert_nonnull (strstr (r4.err, "resuming from step 2"));
  assert_same_checkpoint (straight, b);
  g_auto (StowRun) r5 = { 0 };
  train (&r5, &f, b, "--steps", "6", "--resume-from", "5", NULL);
  g_assert_cmpint (r5.status, ==, 2);
  g_assert_nonnull (strstr (r5.err, "--resume-from 5: "));
  g_assert_nonnull (strstr (r5.err, "is not a checkpoint"));

  /* --resume-from DIR elsewhere, into a fresh OUT. */
  g_autofree char *a4 = g_build_filename (a, "step-000004", NULL);
  g_auto (StowRun) r6 = { 0 };
  train (&r6, &f, c, "--steps", "6", "--resume-from", a4, NULL);
  g_assert_cmpint (r6.status, ==, 0);
  g_assert_nonnull (strstr (r6.err, "resuming from step 4"));
  assert_same_checkpoint (straight, c);
  /* ... and into an OUT holding a run of its own: --overwrite. */
  g_auto (StowRun) r7 = { 0 };
  train (&r7, &f, d, "--steps", "1", "--seed", "4", NULL);
  g_assert_cmpint (r7.status, ==, 0);
  g_auto (StowRun) r8 = { 0 };
  train (&r8, &f, d, "--steps", "6", "--resume-from", a4, NULL);
  g_assert_cmpint (r8.status, ==, 2);
  g_assert_nonnull (strstr (r8.err, "not --resume-from's run"));
  g_auto (StowRun) r9 = { 0 };
  train (&r9, &f, d, "--steps", "6", "--resume-from", a4, "--overwrite", NULL);
  g_assert_cmpint (r9.status, ==, 0);
  assert_same_checkpoint (straight, d);
  g_assert_false (has (d, "step-000001"));
  fixture_clear (&f);
}

/* ---- what a resume checks --------------------------------------------------
 */

/* Every setting that changes the arithmetic or the data order, changed on
 * --resume: refused with the flag and both values, OUT untouched. */
static void
test_refused_changes (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *fewer = g_build_filename (f.dir, "fewer.bin", NULL);
  g_autofree char *other = g_build_filename (f.dir, "other.bin", NULL);
  g_autofree char *moved = g_build_filename (f.dir, "moved.bin", NULL);
  write_shard (fewer, 20240520, 1, 10000, 10000, 300);
  /* The same count, other tokens (write_shard's generator, other seed by
   * another vocabulary). */
  write_shard (other, 20240520, 1, 20000, 20000, 299);
  /* Another model: the same parameters, another rope_theta. */
  g_autofree char *cfg2 = g_strdup (stow_train_small_config);
  char *at = strstr (cfg2, "500000.0");
  memcpy (at, "400000.0", 8);
  g_autofree char *cfg2_path = g_build_filename (f.dir, "theta.json", NULL);
  g_autofree char *model2 = g_build_filename (f.dir, "theta", NULL);
  g_assert_true (g_file_set_contents (cfg2_path, cfg2, -1, NULL));
  g_auto (StowRun) ri = { 0 };
  stow_run (&ri, "init-model", cfg2_path, "-o", model2, "--seed", "3", NULL);
  g_assert_cmpint (ri.status, ==, 0);
  g_auto (StowRun) r0 = { 0 };
  train (&r0, &f, out, "--steps", "2", NULL);
  g_assert_cmpint (r0.status, ==, 0);
  g_autofree char *before = contents (out, "optimizer.stow");
  const struct
  {
    const char *flags[5];
    const char *said;
  } cases[] = {
    { { "--seed", "5" }, "--seed 0; this run has 5" },
    { { "--shuffle" }, "--shuffle off; this run has on" },
    { { "--lr", "0.002" }, "--lr 0.003; this run has 0.002" },
    { { "--min-lr", "0.0001" }, "--min-lr 0; this run has 0.0001" },
    { { "--warmup", "2" }, "--warmup 0; this run has 2" },
    { { "--lr-schedule", "cosine" },
      "--lr-schedule constant; this run has cosine" },
    { { "--weight-decay", "0.1" }, "--weight-decay 0.01; this run has 0.1" },
    { { "--beta1", "0.8" }, "--beta1 0.9; this run has 0.8" },
    { { "--beta2", "0.99" }, "--beta2 0.999; this run has 0.99" },
    { { "--eps", "1e-6" }, "--eps 1e-08; this run has 1e-06" },
    { { "--max-grad-norm", "0.5" }, "--max-grad-norm 1; this run has 0.5" },
    { { "--global-batch", "8" }, "--global-batch 4; this run has 8" },
    { { "--micro-batch", "4" }, "--micro-batch 2; this run has 4" },
    { { "--seq", "32" }, "--seq 16; this run has 32" },
    { { "--precision", "bf16" }, "--precision fp32; this run has bf16" },
    { { "--data", fewer }, "--data 20000 tokens; this run has 10000 tokens" },
    { { "--data", other }, "--data tokens whose sample has sha256 " },
    { { "--model", model2 }, "--model a config.json of sha256 " },
    { { "--offload-optimizer", "cpu", "--delayed-update" },
      "--delayed-update off; this run has on" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GPtrArray) flags = g_ptr_array_new ();
      for (guint j = 0; j < 5 && cases[i].flags[j]; j++)
        g_ptr_array_add (flags, (char *)cases[i].flags[j]);
      g_ptr_array_add (flags, "--steps");
      g_ptr_array_add (flags, "4");
      g_ptr_array_add (flags, "--resume");
      g_ptr_array_add (flags, NULL);
      g_auto (StowRun) r = { 0 };
      trainv (&r, &f, out, (const char *const *)flags->pdata);
      g_test_message ("%s %s: %s", cases[i].flags[0],
                      cases[i].flags[1] ? cases[i].flags[1] : "", r.err);
      g_assert_cmpint (r.status, ==, 2);
      g_assert_nonnull (strstr (r.err, "the checkpoint ran with "));
      g_assert_nonnull (strstr (r.err, cases[i].said));
      g_assert_null (strstr (r.err, "step 3/"));
      g_assert_cmpuint (latest_step (out), ==, 2);
    }
  g_autofree char *after = contents (out, "optimizer.stow");
  g_assert_cmpstr (after, ==, before);
  /* The same tokens under another name are the same data: said, and the
   * run continues. */
  g_assert_cmpint (rename (f.shard, moved), ==, 0);
  g_auto (StowRun) rm = { 0 };
  stow_run (&rm, "train", "--model", f.model, "--data", moved, "--seq", "16",
            "--micro-batch", "2", "--global-batch", "4", "--lr", "0.003",
            "--out", out, "--steps", "3", "--resume", "--precision", "fp32",
            NULL);
  g_assert_cmpint (rm.status, ==, 0);
  g_assert_nonnull (strstr (rm.err, "the same tokens"));
  fixture_clear (&f);
}

/* What may change: a longer run and another placement (logged, the
 * uninterrupted bytes); --steps at or below the checkpoint's: nothing to
 * do, exit 0, no peak line; a checkpoint from before run.json existed:
 * resumed, with what was not compared said. */
static void
test_allowed_changes (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *straight = g_build_filename (f.dir, "straight", NULL);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_auto (StowRun) r0 = { 0 };
  train (&r0, &f, straight, "--steps", "6", "--precision", "bf16", NULL);
  g_assert_cmpint (r0.status, ==, 0);
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, out, "--steps", "3", "--precision", "bf16", NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, out, "--steps", "6", "--precision", "bf16", "--resume",
         "--offload-optimizer", "cpu", "--recompute", "full", NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_assert_nonnull (strstr (r2.err, "--steps 6: the checkpoint's run was for "
                                    "3 steps"));
  g_assert_nonnull (strstr (r2.err, "the layout is now "));
  g_assert_nonnull (strstr (r2.err, "optimizer cpu"));
  assert_same_checkpoint (straight, out);
  const char *const at_or_below[] = { "6", "4" };
  for (guint i = 0; i < G_N_ELEMENTS (at_or_below); i++)
    {
      g_auto (StowRun) r = { 0 };
      train (&r, &f, out, "--steps", at_or_below[i], "--precision", "bf16",
             "--resume", NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_autofree char *said = g_strdup_printf (
          "is at step 6; --steps %s: nothing to do", at_or_below[i]);
      g_assert_nonnull (strstr (r.err, said));
      g_assert_null (strstr (r.err, "device peak"));
      g_assert_null (strstr (r.err, "step 7/"));
    }
  /* A checkpoint written before run.json: the header's settings are
   * compared, the rest said. */
  g_autofree char *run = g_build_filename (out, "latest", "run.json", NULL);
  g_assert_true (g_file_test (run, G_FILE_TEST_IS_REGULAR));
  g_assert_cmpint (g_unlink (run), ==, 0);
  g_auto (StowRun) r3 = { 0 };
  train (&r3, &f, out, "--steps", "7", "--precision", "bf16", "--resume", NULL);
  g_assert_cmpint (r3.status, ==, 0);
  g_assert_nonnull (strstr (r3.err, "predates the record of --tokenizer, "
                                    "--data, --model, --min-lr"));
  g_auto (StowRun) r4 = { 0 };
  train (&r4, &f, out, "--steps", "8", "--precision", "fp32", "--resume", NULL);
  g_assert_cmpint (r4.status, ==, 2);
  g_assert_nonnull (strstr (r4.err, "--precision bf16; this run has fp32"));
  fixture_clear (&f);
}

/* --log-json after a resume says what the final weights saw: the lines
 * past the checkpoint (and a line cut by a kill) go, and the run's lines
 * follow, the same as the first run's. */
static void
test_log_after_resume (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "log.jsonl", NULL);
  g_auto (StowRun) r1 = { 0 };
  train (&r1, &f, out, "--steps", "5", "--save-every", "3", "--log-json", log,
         NULL);
  g_assert_cmpint (r1.status, ==, 0);
  g_autofree char *first = read_all (log);
  FILE *fp = fopen (log, "a");
  fputs ("{\"step\":6,\"lo", fp);
  fclose (fp);
  g_auto (StowRun) r2 = { 0 };
  train (&r2, &f, out, "--steps", "6", "--resume-from", "3", "--log-json", log,
         NULL);
  g_assert_cmpint (r2.status, ==, 0);
  g_autofree char *text = read_all (log);
  g_auto (GStrv) lines = g_strsplit (g_strstrip (text), "\n", -1);
  g_auto (GStrv) before = g_strsplit (g_strstrip (first), "\n", -1);
  g_assert_cmpuint (g_strv_length (lines), ==, 6);
  for (guint i = 0; i < 6; i++)
    {
      g_autoptr (JsonNode) n = stow_json_parse_data (lines[i], -1, log, NULL);
      g_assert_nonnull (n);
      JsonObject *o = json_node_get_object (n);
      g_assert_cmpint (json_object_get_int_member (o, "step"), ==, i + 1);
      if (i >= 5)
        continue;
      /* Steps 4 and 5 ran twice, to the same loss. */
      g_autoptr (JsonNode) m = stow_json_parse_data (before[i], -1, log, NULL);
      g_assert_cmpfloat (
          json_object_get_double_member (o, "loss"), ==,
          json_object_get_double_member (json_node_get_object (m), "loss"));
    }
  fixture_clear (&f);
}

/* ---- preemption ------------------------------------------------------------
 */

/* @sig after a random step of a 40-step run with @flags (NULL ended,
 * checkpoints only at the end): the step in flight finishes and is saved,
 * "stopped at step N; continue with --resume", the exit status is the
 * signal's, the swap files and OUT's lock are gone; --resume gives the
 * uninterrupted run's bytes. */
static void
assert_signal_resumes (const char *const *flags, int sig)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *swap = make_dir (&f, "swap");
  g_autofree char *straight = g_build_filename (f.dir, "straight", NULL);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "run.err", NULL);
  g_autoptr (GPtrArray) own = g_ptr_array_new ();
  for (guint i = 0; flags[i]; i++)
    g_ptr_array_add (own,
                     g_str_equal (flags[i], "SWAP") ? swap : (char *)flags[i]);
  g_ptr_array_add (own, "--steps");
  g_ptr_array_add (own, "40");
  g_ptr_array_add (own, NULL);
  g_auto (StowRun) r0 = { 0 };
  trainv (&r0, &f, straight, (const char *const *)own->pdata);
  g_assert_cmpint (r0.status, ==, 0);
  g_autoptr (GPtrArray) argv
      = train_argv (&f, out, (const char *const *)own->pdata);
  GPid pid = spawn_logged ((const char *const *)argv->pdata, log);
  gint32 k = g_test_rand_int_range (1, 20);
  g_autofree char *after = g_strdup_printf ("step %d/", k);
  g_assert_true (wait_for_text (log, after, 20000));
  g_usleep ((gulong)g_test_rand_int_range (0, 3000));
  int st = kill_and_wait (pid, sig);
  g_autofree char *err = read_all (log);
  g_test_message ("%s after step %d:\n%s", g_strsignal (sig), k, err);
  g_assert_true (WIFSIGNALED (st));
  g_assert_cmpint (WTERMSIG (st), ==, sig);
  guint at = latest_step (out);
  g_assert_cmpuint (at, >=, (guint)k);
  g_assert_cmpuint (at, <, 40);
  g_autofree char *said
      = g_strdup_printf ("stopped at step %u; continue with --resume", at);
  g_assert_nonnull (strstr (err, said));
  g_assert_cmpuint (entries (swap), ==, 0);
  g_assert_false (has (out, ".lock"));
  g_ptr_array_remove_index (own, own->len - 1);
  g_ptr_array_add (own, "--resume");
  g_ptr_array_add (own, NULL);
  g_auto (StowRun) r1 = { 0 };
  trainv (&r1, &f, out, (const char *const *)own->pdata);
  g_assert_cmpint (r1.status, ==, 0);
  g_autofree char *from = g_strdup_printf ("resuming from step %u", at);
  g_assert_nonnull (strstr (r1.err, from));
  assert_same_checkpoint (straight, out);
  fixture_clear (&f);
}

static void
test_sigterm_fp32 (void)
{
  assert_signal_resumes ((const char *const[]){ NULL }, SIGTERM);
}

static void
test_sigusr1_bf16_host (void)
{
  assert_signal_resumes ((const char *const[]){ "--precision", "bf16",
                                                "--offload-optimizer", "cpu",
                                                NULL },
                         SIGUSR1);
}

static void
test_sigterm_bf16_nvme (void)
{
  assert_signal_resumes ((const char *const[]){ "--precision", "bf16",
                                                "--offload-optimizer", "nvme",
                                                "--nvme-dir", "SWAP", NULL },
                         SIGTERM);
}

static void
test_sigusr1_fp32_nvme (void)
{
  assert_signal_resumes ((const char *const[]){ "--offload-optimizer", "nvme",
                                                "--nvme-dir", "SWAP", NULL },
                         SIGUSR1);
}

/* SIGTERM before the first step (the run held at opening its --log-json,
 * a FIFO nobody reads yet): no step runs, nothing is saved, the run says
 * so and ends by the signal, and the OUT it created is gone again. */
static void
test_stop_before_first_step (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "run.err", NULL);
  g_autofree char *fifo = g_build_filename (f.dir, "log.fifo", NULL);
  g_assert_cmpint (mkfifo (fifo, 0600), ==, 0);
  g_autoptr (GPtrArray) argv = train_argv (
      &f, out,
      (const char *const[]){ "--steps", "5", "--log-json", fifo, NULL });
  GPid pid = spawn_logged ((const char *const *)argv->pdata, log);
  g_assert_true (wait_for_text (log, "planned layout: ", 20000));
  g_usleep (300000); /* into the open of the FIFO */
  kill (pid, SIGTERM);
  int fd = open (fifo, O_RDONLY);
  g_assert_cmpint (fd, >=, 0);
  char buf[256];
  while (read (fd, buf, sizeof buf) > 0)
    ;
  close (fd);
  int st = kill_and_wait (pid, 0);
  g_autofree char *err = read_all (log);
  g_test_message ("%s", err);
  g_assert_true (WIFSIGNALED (st));
  g_assert_cmpint (WTERMSIG (st), ==, SIGTERM);
  g_assert_nonnull (strstr (err, "stopped before step 1; nothing to save"));
  g_assert_null (strstr (err, "step 1/5"));
  g_assert_false (g_file_test (out, G_FILE_TEST_EXISTS));
  fixture_clear (&f);
}

/* --save-on-signal off: SIGTERM ends the run at once, as before. */
static void
test_no_save_on_signal (void)
{
  Fixture f;
  fixture_init (&f);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  g_autofree char *log = g_build_filename (f.dir, "run.err", NULL);
  g_autoptr (GPtrArray) argv
      = train_argv (&f, out,
                    (const char *const[]){ "--steps", "100000",
                                           "--save-on-signal", "off", NULL });
  GPid pid = spawn_logged ((const char *const *)argv->pdata, log);
  g_assert_true (wait_for_text (log, "step 3/", 20000));
  int st = kill_and_wait (pid, SIGTERM);
  g_assert_true (WIFSIGNALED (st));
  g_assert_cmpint (WTERMSIG (st), ==, SIGTERM);
  g_assert_cmpuint (latest_step (out), ==, 0);
  g_autofree char *err = read_all (log);
  g_assert_null (strstr (err, "stopped at step"));
  fixture_clear (&f);
}

/* ---- kill -9 at every syscall of a save ---------------------------------- */

/* Runs @argv under the killer, dying at call @at (0: never); the count of
 * calls into *@count when it lived. */
static int
run_killed (const char *const *argv, const char *out, guint at, guint *count)
{
  g_autofree char *count_path = g_strdup_printf ("%s.count", out);
  g_auto (GStrv) env = g_get_environ ();
  const char *asan = g_environ_getenv (env, "ASAN_OPTIONS");
  /* The killer comes before the sanitizer's runtime in the link order. */
  g_autofree char *asan_opts = g_strdup_printf (
      "%s%sverify_asan_link_order=0", asan ? asan : "", asan ? ":" : "");
  g_autofree char *at_s = g_strdup_printf ("%u", at);
  env = g_environ_setenv (env, "LD_PRELOAD", g_getenv ("STOW_KILLER"), TRUE);
  env = g_environ_setenv (env, "ASAN_OPTIONS", asan_opts, TRUE);
  env = g_environ_setenv (env, "STOW_KILL_DIR", out, TRUE);
  env = g_environ_setenv (env, "STOW_KILL_AT", at_s, TRUE);
  env = g_environ_setenv (env, "STOW_KILL_COUNT", count_path, TRUE);
  int st = 0;
  g_autoptr (GError) error = NULL;
  g_assert_true (
      g_spawn_sync (NULL, (char **)argv, env,
                    G_SPAWN_STDOUT_TO_DEV_NULL | G_SPAWN_STDERR_TO_DEV_NULL,
                    NULL, NULL, NULL, NULL, &st, &error));
  g_assert_no_error (error);
  if (count != NULL)
    {
      g_autofree char *text = read_all (count_path);
      *count = (guint)g_ascii_strtoull (text, NULL, 10);
    }
  g_unlink (count_path);
  return st;
}

/* kill -9 at every call that changes OUT (-m slow: the slow suite's
 * train-kill-every-syscall) or at a seeded sample of them, in a run of 3 steps
 * saving each: after each kill `latest` is absent (no checkpoint yet) or names
 * a complete checkpoint, and --resume gives the uninterrupted bytes. */
static void
test_kill_every_syscall (void)
{
  if (g_getenv ("STOW_KILLER") == NULL)
    {
      g_test_skip ("STOW_KILLER (tests/checkpoint-killer.c) not set");
      return;
    }
  Fixture f;
  fixture_init (&f);
  g_autofree char *straight = g_build_filename (f.dir, "straight", NULL);
  g_autofree char *out = g_build_filename (f.dir, "out", NULL);
  const char *const flags[]
      = { "--steps", "3", "--save-every", "1", "--threads", "1", NULL };
  g_auto (StowRun) r0 = { 0 };
  trainv (&r0, &f, straight, flags);
  g_assert_cmpint (r0.status, ==, 0);
  g_autoptr (GPtrArray) argv = train_argv (&f, out, flags);
  guint total = 0;
  int st = run_killed ((const char *const *)argv->pdata, out, 0, &total);
  g_assert_true (WIFEXITED (st) && WEXITSTATUS (st) == 0);
  assert_same_checkpoint (straight, out);
  g_test_message ("%u calls change OUT in a run of 3 checkpoints", total);
  /* The lock, three begins and commits, the files in between. */
  g_assert_cmpuint (total, >, 30);
  gboolean all = g_test_slow ();
  g_autoptr (GArray) points = g_array_new (FALSE, FALSE, sizeof (guint));
  for (guint k = 1; k <= total; k++)
    if (all || k == 1 || k == total
        || g_test_rand_int_range (0, (gint32)total) < 12)
      g_array_append_val (points, k);
  g_autoptr (GPtrArray) resume_flags
      = args_join (flags, (const char *const[]){ "--resume", NULL });
  for (guint i = 0; i < points->len; i++)
    {
      guint k = g_array_index (points, guint, i);
      g_autofree char *cmd = g_strdup_printf ("rm -rf '%s'", out);
      g_assert_cmpint (system (cmd), ==, 0);
      st = run_killed ((const char *const *)argv->pdata, out, k, NULL);
      g_assert_true (WIFSIGNALED (st));
      g_assert_cmpint (WTERMSIG (st), ==, SIGKILL);
      guint at = latest_step (out);
      if (at > 0)
        {
          /* Complete: the files a checkpoint has, whole. */
          const char *files[] = { "config.json", "model.safetensors",
                                  "optimizer.stow", "run.json" };
          for (guint j = 0; j < G_N_ELEMENTS (files); j++)
            {
              g_autofree char *p
                  = g_build_filename (out, "latest", files[j], NULL);
              g_assert_true (g_file_test (p, G_FILE_TEST_IS_REGULAR));
            }
        }
      g_auto (StowRun) r = { 0 };
      trainv (&r, &f, out, (const char *const *)resume_flags->pdata);
      if (r.status != 0)
        g_test_message ("killed at call %u of %u (latest at step %u): %s", k,
                        total, at, r.err);
      g_assert_cmpint (r.status, ==, 0);
      assert_same_checkpoint (straight, out);
    }
  g_test_message ("killed at %u of the %u calls; each resumed to the same "
                  "bytes",
                  points->len, total);
  fixture_clear (&f);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/train-resume/one-writer", test_one_writer);
  g_test_add_func ("/train-resume/two-at-once", test_two_at_once);
  g_test_add_func ("/train-resume/overwrite", test_overwrite);
  g_test_add_func ("/train-resume/resume-from", test_resume_from);
  g_test_add_func ("/train-resume/refused-changes", test_refused_changes);
  g_test_add_func ("/train-resume/allowed-changes", test_allowed_changes);
  g_test_add_func ("/train-resume/log", test_log_after_resume);
  g_test_add_func ("/train-resume/sigterm-fp32", test_sigterm_fp32);
  g_test_add_func ("/train-resume/sigusr1-bf16-host", test_sigusr1_bf16_host);
  g_test_add_func ("/train-resume/sigterm-bf16-nvme", test_sigterm_bf16_nvme);
  g_test_add_func ("/train-resume/sigusr1-fp32-nvme", test_sigusr1_fp32_nvme);
  g_test_add_func ("/train-resume/stop-before-first-step",
                   test_stop_before_first_step);
  g_test_add_func ("/train-resume/no-save-on-signal", test_no_save_on_signal);
  g_test_add_func ("/train-resume/kill-every-syscall", test_kill_every_syscall);
  return g_test_run ();
}
