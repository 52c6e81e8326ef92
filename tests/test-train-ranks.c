/* SPDX-License-Identifier: MIT
 *
 * tests/test-train-ranks.c: `stowage train` on 2, 3 and 4 ranks under
 * mpirun --oversubscribe, the cpu backend: every ZeRO stage gives the
 * weights and optimizer states of the one rank that accumulates the same
 * global batch, byte for byte (each rank writing its own partition of the
 * states from ZeRO 1 on); a resume across rank counts (4 -> 2 -> 1
 * -> 3) gives the uninterrupted run's bytes; each rank's arena peak is the
 * simulated one; a killed rank ends the job in bounded time with `latest`
 * whole, and --resume continues bit for bit; --reduction native keeps the
 * losses within a bound of the one rank's (how far they moved reported).
 * Exits 77 (skip) without mpirun or a build with MPI.
 */
#include <glib.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

#include "executor/optim-state.h"
#include "testutil-train.h"

static const char *mpirun;
/* run_ranks leaves OMP_WAIT_POLICY out of the ranks' environment. */
static gboolean no_wait_policy;
static Fixture fx;
/* A model whose output layer is its embedding (tie_word_embeddings), the
 * fixture's shape otherwise. */
static char *tied_model;

static void
make_tied_model (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *cfg = g_build_filename (fx.dir, "tied.json", NULL);
  const char *json
      = "{\"model_type\":\"llama\",\"hidden_size\":64,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"intermediate_size\":96,"
        "\"vocab_size\":300,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-5,"
        "\"tie_word_embeddings\":true,\"initializer_range\":0.05}";
  g_assert_true (g_file_set_contents (cfg, json, -1, &error));
  tied_model = g_build_filename (fx.dir, "tied-model", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "init-model", cfg, "-o", tied_model, "--seed", "5", NULL);
  g_assert_cmpint (r.status, ==, 0);
}

/* The ranks' environment.  Under AddressSanitizer, leaks are not checked
 * in the ranks: Open MPI's plugins, unloaded by MPI_Finalize, leave
 * allocations no suppression can name (memory errors still abort them;
 * the one-rank runs keep their leak check); and a library preloaded
 * ahead of ASan's runtime is allowed (test_disk_full's, as
 * test-train-resume's kills do). */
static char **
ranks_env (void)
{
  char **env = g_get_environ ();
  const char *asan = g_environ_getenv (env, "ASAN_OPTIONS");
  if (asan != NULL)
    {
      g_autofree char *opts = g_strconcat (
          asan, ":detect_leaks=0:verify_asan_link_order=0", NULL);
      env = g_environ_setenv (env, "ASAN_OPTIONS", opts, TRUE);
    }
  return env;
}

/* `mpirun -np @n stowage train` on the fixture (as trainv) with @extra,
 * under timeout(1) (@limit_s): the exit status, the output in @out and
 * the seconds it took in @seconds (each may be NULL). */
static int
run_ranks (int n, const char *out_dir, const char *const *extra, int limit_s,
           char **out, double *seconds)
{
  g_autofree char *np = g_strdup_printf ("%d", n);
  g_autofree char *limit = g_strdup_printf ("%d", limit_s);
  const char *pre[] = { "timeout",
                        "-k",
                        "5",
                        limit,
                        mpirun,
                        "--oversubscribe",
                        "--allow-run-as-root",
                        "-np",
                        np,
                        NULL };
  g_autoptr (GPtrArray) train = train_argv (&fx, out_dir, extra);
  g_autoptr (GPtrArray) argv
      = args_join (pre, (const char *const *)train->pdata);
  g_autoptr (GError) error = NULL;
  int status = 0;
  char *text = NULL;
  g_auto (GStrv) env = ranks_env ();
  if (no_wait_policy)
    env = g_environ_unsetenv (env, "OMP_WAIT_POLICY");
  gint64 t0 = g_get_monotonic_time ();
  g_assert_true (g_spawn_sync (NULL, (char **)argv->pdata, env,
                               G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL,
                               NULL, NULL, NULL, &text, &status, &error));
  g_assert_no_error (error);
  if (seconds)
    *seconds = (g_get_monotonic_time () - t0) / 1e6;
  if (out)
    *out = text;
  else
    g_free (text);
  return WIFEXITED (status) ? WEXITSTATUS (status) : 128 + WTERMSIG (status);
}

static char *
out_dir (const char *name)
{
  return g_build_filename (fx.dir, name, NULL);
}

/* One rank, the reference: @extra as the ranks' runs have them. */
static char *
reference (const char *name, const char *const *extra)
{
  char *out = out_dir (name);
  if (g_file_test (out, G_FILE_TEST_IS_DIR))
    return out; /* run once, shared by the tests that compare with it */
  g_auto (StowRun) r = { 0 };
  trainv (&r, &fx, out, extra);
  if (r.status != 0)
    g_printerr ("%s\n", r.err);
  g_assert_cmpint (r.status, ==, 0);
  return out;
}

/* The latest checkpoints of @a and @b: the same weights file, byte for
 * byte, and the same optimizer states, every section of every tensor,
 * whether one rank's optimizer.stow or the ranks' files hold them. */
static void
assert_same_run (const char *a, const char *b)
{
  g_assert_true (same_file (a, b, "model.safetensors"));
  g_assert_true (same_file (a, b, "config.json"));
  g_autofree char *da = g_build_filename (a, "latest", NULL);
  g_autofree char *db = g_build_filename (b, "latest", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimStateSet) sa = stow_optim_state_set_open (da, &error);
  g_assert_no_error (error);
  g_autoptr (StowOptimStateSet) sb = stow_optim_state_set_open (db, &error);
  g_assert_no_error (error);
  guint n = stow_optim_state_set_n_tensors (sa);
  g_assert_cmpuint (n, ==, stow_optim_state_set_n_tensors (sb));
  g_assert_cmpuint (n, >, 0);
  static const char *const sections[] = { "master", "weights", "m", "v" };
  guint compared = 0;
  for (guint i = 0; i < n; i++)
    {
      const char *name = stow_optim_state_set_tensor_name (sa, i);
      guint64 total = stow_optim_state_set_tensor_total (sa, name);
      g_assert_cmpuint (total, ==,
                        stow_optim_state_set_tensor_total (sb, name));
      for (guint k = 0; k < G_N_ELEMENTS (sections); k++)
        {
          gboolean has
              = stow_optim_state_set_has_section (sa, name, sections[k]);
          g_assert_cmpint (
              has, ==,
              stow_optim_state_set_has_section (sb, name, sections[k]));
          if (!has)
            continue;
          g_autofree float *x = g_new (float, MAX (total, 1));
          g_autofree float *y = g_new (float, MAX (total, 1));
          g_assert_true (stow_optim_state_set_read (sa, name, sections[k], 0,
                                                    total, x, &error));
          g_assert_true (stow_optim_state_set_read (sb, name, sections[k], 0,
                                                    total, y, &error));
          g_assert_cmpmem (x, total * 4, y, total * 4);
          compared++;
        }
    }
  g_test_message ("%s against %s: weights and %u state sections the same", b, a,
                  compared);
}

/* Every @what line ("device peak: ", "pinned host peak: "; one per rank)
 * within 2% of the simulated. */
static void
assert_each_peak (const char *err, const char *what, int n)
{
  int lines = 0;
  for (const char *p = err; (p = strstr (p, what)) != NULL; p++)
    {
      const char *pct = strstr (p, "simulated (");
      g_assert_nonnull (pct);
      double d = g_ascii_strtod (pct + strlen ("simulated ("), NULL);
      g_assert_cmpfloat (ABS (d), <=, 2.0);
      lines++;
    }
  g_assert_cmpint (lines, ==, n);
}

typedef struct
{
  int n;
  const char *zero, *precision, *global;
  gboolean tied;
  const char *offload; /* --offload-optimizer, or NULL */
  const char *params;  /* --offload-params (then every layer streamed) */
} Case;

/* N ranks at one ZeRO stage against one rank with the same global
 * batch: the same checkpoint, byte for byte. */
static void
test_same_bytes (gconstpointer data)
{
  const Case *c = data;
  const char *one[] = { "--steps",
                        "3",
                        "--precision",
                        c->precision,
                        "--global-batch",
                        c->global,
                        "--threads",
                        "1",
                        "--model",
                        c->tied ? tied_model : fx.model,
                        NULL };
  g_autofree char *ref_name = g_strdup_printf (
      "ref-%s-%s%s", c->precision, c->global, c->tied ? "-tied" : "");
  g_autofree char *ref_dir = out_dir (ref_name);
  if (!g_file_test (ref_dir, G_FILE_TEST_IS_DIR))
    g_free (reference (ref_name, one)); /* one rank, nothing sharded */
  g_autofree char *name = g_strdup_printf (
      "z%s-n%d-%s%s%s%s%s", c->zero, c->n, c->precision, c->tied ? "-tied" : "",
      c->offload ? "-offload-" : "", c->offload ? c->offload : "",
      c->params ? "-params" : "");
  g_autofree char *dir = out_dir (name);
  g_autofree char *nvme = g_strconcat (dir, "-nvme", NULL);
  g_autoptr (GPtrArray) more = g_ptr_array_new ();
  g_ptr_array_add (more, (gpointer) "--zero");
  g_ptr_array_add (more, (gpointer)c->zero);
  if (c->offload)
    {
      g_ptr_array_add (more, (gpointer) "--offload-optimizer");
      g_ptr_array_add (more, (gpointer)c->offload);
    }
  if (g_strcmp0 (c->offload, "nvme") == 0 || g_strcmp0 (c->params, "nvme") == 0)
    {
      g_assert_cmpint (g_mkdir_with_parents (nvme, 0700), ==, 0);
      g_ptr_array_add (more, (gpointer) "--nvme-dir");
      g_ptr_array_add (more, nvme);
    }
  if (c->params)
    {
      g_ptr_array_add (more, (gpointer) "--offload-params");
      g_ptr_array_add (more, (gpointer)c->params);
      g_ptr_array_add (more, (gpointer) "--resident-layers");
      g_ptr_array_add (more, (gpointer) "0");
    }
  g_ptr_array_add (more, NULL);
  g_autoptr (GPtrArray) extra
      = args_join (one, (const char *const *)more->pdata);
  g_autofree char *err = NULL;
  double s = 0;
  int rc
      = run_ranks (c->n, dir, (const char *const *)extra->pdata, 120, &err, &s);
  g_test_message ("%d ranks, ZeRO %s, %s%s%s%s: %.1f s", c->n, c->zero,
                  c->precision, c->offload ? ", optimizer offloaded to " : "",
                  c->offload ? c->offload : "",
                  c->params ? ", parameters streamed" : "", s);
  if (rc != 0)
    g_printerr ("%s\n", err);
  g_assert_cmpint (rc, ==, 0);
  assert_same_run (ref_dir, dir);
  assert_each_peak (err, "device peak: ", c->n);
  if (c->offload)
    assert_each_peak (err, "pinned host peak: ", c->n);
  /* From ZeRO 1 on each rank wrote its own partition of the states. */
  for (int r = 0; r < c->n; r++)
    {
      g_autofree char *f = g_strdup_printf (
          "%s/latest/optimizer-rank%05d-of-%05d.stow", dir, r, c->n);
      g_assert_cmpint (g_file_test (f, G_FILE_TEST_IS_REGULAR), ==,
                       !g_str_equal (c->zero, "0"));
    }
}

typedef struct
{
  int n;
  const char *zero, *precision, *global;
  /* One micro-batch per rank on 2 ranks: nothing accumulates, and a + b
   * is b + a, so the native sums are the rank-order ones. */
  gboolean same;
} NativeCase;

/* The native runs' flags: 4 steps of @global sequences at @precision. */
static GPtrArray *
native_args (const char *precision, const char *global)
{
  const char *a[]
      = { "--steps", "4",         "--precision", precision, "--global-batch",
          global,    "--threads", "1",           NULL };
  return args_join (a, NULL);
}

/* One rank's run of native_args (the deterministic bytes of any number
 * of ranks), its --log-json in @log. */
static char *
native_reference (const char *precision, const char *global, char **log)
{
  g_autofree char *name
      = g_strdup_printf ("ref-native-%s-%s", precision, global);
  *log = g_strdup_printf ("%s/%s.jsonl", fx.dir, name);
  g_autoptr (GPtrArray) base = native_args (precision, global);
  const char *more[] = { "--log-json", *log, NULL };
  g_autoptr (GPtrArray) a = args_join ((const char *const *)base->pdata, more);
  return reference (name, (const char *const *)a->pdata);
}

/* --reduction native: MPI_Reduce_scatter_block's order of summation in
 * place of the rank order, and each micro-batch's sum added to the
 * accumulated one after it rather than contribution by contribution.
 * The run completes; step 1's loss, computed before any reduction, is the
 * one rank's to the bit.  A reduced gradient moves by up to (N - 1) unit
 * roundoffs of its terms (Higham 2002, 4.2), and so, Adam being
 * scale-free, does each update, and the step's change of the loss (under
 * 1e-2 relative here) by about that fraction: on 4 ranks some 2e-9 a
 * step in fp32 (u = 2^-24) and 1.2e-4 in bf16 (the gradients' u = 2^-8).
 * Over 4 steps: within 1e-6 (fp32) and 1e-3 (bf16) of the one rank's
 * losses, twice the bf16 bound's sum (measured: 5e-9 and 7e-5).  How far
 * they moved, and whether the weights' bytes did, is reported. */
static void
test_native (gconstpointer data)
{
  const NativeCase *c = data;
  g_autofree char *ref_log = NULL;
  g_autofree char *ref = native_reference (c->precision, c->global, &ref_log);
  g_autoptr (GPtrArray) base = native_args (c->precision, c->global);
  g_autofree char *name = g_strdup_printf ("native-n%d-%s-z%s-%s", c->n,
                                           c->precision, c->zero, c->global);
  g_autofree char *dir = out_dir (name);
  g_autofree char *log = g_strdup_printf ("%s/%s.jsonl", fx.dir, name);
  const char *more[]
      = { "--reduction", "native", "--zero", c->zero, "--log-json", log, NULL };
  g_autoptr (GPtrArray) args
      = args_join ((const char *const *)base->pdata, more);
  g_autofree char *err = NULL;
  int rc = run_ranks (c->n, dir, (const char *const *)args->pdata, 120, &err,
                      NULL);
  if (rc != 0)
    g_printerr ("%s\n", err);
  g_assert_cmpint (rc, ==, 0);
  g_assert_nonnull (strstr (err, "--reduction native"));
  g_assert_cmpuint (latest_step (dir), ==, 4);
  g_autoptr (GArray) want = log_losses (ref_log);
  g_autoptr (GArray) got = log_losses (log);
  g_assert_cmpuint (got->len, ==, 4);
  g_assert_cmpuint (want->len, ==, got->len);
  g_assert_cmpfloat (g_array_index (got, double, 0), ==,
                     g_array_index (want, double, 0));
  double tol = g_str_equal (c->precision, "fp32") ? 1e-6 : 1e-3;
  double worst = 0;
  guint worst_step = 0;
  for (guint i = 0; i < got->len; i++)
    {
      double w = g_array_index (want, double, i);
      double rel = fabs (g_array_index (got, double, i) - w) / fabs (w);
      g_assert_cmpfloat (rel, <=, tol);
      if (rel > worst)
        worst = rel, worst_step = i + 1;
    }
  gboolean same = same_file (ref, dir, "model.safetensors");
  g_test_message ("%d ranks, ZeRO %s, %s, global batch %s, --reduction "
                  "native: largest relative loss difference %.3g (step %u) "
                  "over %u steps; weights %s the one rank's bytes",
                  c->n, c->zero, c->precision, c->global, worst, worst_step,
                  got->len, same ? "are" : "are not");
  if (c->same)
    assert_same_run (ref, dir);
}

/* One rank adds nothing up: --reduction native is accepted and gives the
 * same run; a value other than the two is refused by name. */
static void
test_native_one_rank (void)
{
  g_autofree char *ref_log = NULL;
  g_autofree char *ref = native_reference ("fp32", "24", &ref_log);
  g_autoptr (GPtrArray) base = native_args ("fp32", "24");
  g_autofree char *dir = out_dir ("native-one-rank");
  const char *native[] = { "--reduction", "native", NULL };
  g_autoptr (GPtrArray) args
      = args_join ((const char *const *)base->pdata, native);
  g_auto (StowRun) r = { 0 };
  trainv (&r, &fx, dir, (const char *const *)args->pdata);
  g_assert_cmpint (r.status, ==, 0);
  assert_same_run (ref, dir);
  const char *bad[] = { "--reduction", "ring", NULL };
  g_autoptr (GPtrArray) refused = train_argv (&fx, dir, bad);
  stow_assert_usage_error ((const char *const *)refused->pdata + 1,
                           "--reduction \"ring\": expected deterministic or "
                           "native");
}

/* 4 ranks (ZeRO 3), 2 (ZeRO 2), 1, 3 (ZeRO 1), each resuming the last:
 * the uninterrupted run's bytes. */
static void
test_resume_across_ranks (void)
{
  const char *base[] = { "--precision", "bf16",      "--global-batch",
                         "24",          "--threads", "1",
                         NULL };
  const char *full[] = { "--steps", "4", NULL };
  g_autoptr (GPtrArray) ref_args = args_join (base, full);
  g_autofree char *ref
      = reference ("ref-resume", (const char *const *)ref_args->pdata);
  g_autofree char *dir = out_dir ("resumed");
  /* The first leg's weights and states in each rank's host memory
   * (ZeRO-Infinity, every layer streamed), the second's states there, the
   * last's on NVMe. */
  g_autofree char *swap = out_dir ("resumed-swap");
  g_assert_cmpint (g_mkdir_with_parents (swap, 0700), ==, 0);
  struct
  {
    int n;
    const char *zero, *steps, *off_opt, *off_par;
  } legs[] = { { 4, "3", "1", "cpu", "cpu" },
               { 2, "2", "2", "cpu", "none" },
               { 1, "0", "3", "none", "none" },
               { 3, "1", "4", "nvme", "none" } };
  for (guint i = 0; i < G_N_ELEMENTS (legs); i++)
    {
      gboolean streamed = !g_str_equal (legs[i].off_par, "none");
      gboolean nvme = g_str_equal (legs[i].off_opt, "nvme");
      const char *more[] = { nvme ? "--nvme-dir" : "--steps",
                             nvme ? swap : legs[i].steps,
                             "--steps",
                             legs[i].steps,
                             "--zero",
                             legs[i].zero,
                             "--offload-optimizer",
                             legs[i].off_opt,
                             "--offload-params",
                             legs[i].off_par,
                             i > 0 ? "--resume" : "--overwrite",
                             streamed ? "--resident-layers" : NULL,
                             "0",
                             NULL };
      g_autoptr (GPtrArray) a = args_join (base, more);
      g_autofree char *err = NULL;
      int rc = run_ranks (legs[i].n, dir, (const char *const *)a->pdata, 120,
                          &err, NULL);
      if (rc != 0)
        g_printerr ("%s\n", err);
      g_assert_cmpint (rc, ==, 0);
      g_assert_cmpuint (latest_step (dir), ==, i + 1);
    }
  assert_same_run (ref, dir);
}

/* --log-json with {rank}: one log per rank, the same steps and losses. */
static void
test_rank_logs (void)
{
  g_autofree char *dir = out_dir ("logs");
  g_autofree char *log = g_build_filename (fx.dir, "log-{rank}.json", NULL);
  const char *extra[] = { "--steps", "2",         "--zero", "2", "--log-json",
                          log,       "--threads", "1",      NULL };
  g_autofree char *err = NULL;
  /* Launched without an OpenMP wait policy, the ranks, which share the
   * cores, take the passive one (cmd-train.c). */
  no_wait_policy = TRUE;
  int rc = run_ranks (2, dir, extra, 120, &err, NULL);
  no_wait_policy = FALSE;
  g_assert_cmpint (rc, ==, 0);
  g_assert_nonnull (strstr (err, "OMP_WAIT_POLICY=passive"));
  /* Rank 0 alone prints the progress. */
  g_assert_cmpint (stow_count_lines (err), >, 0);
  g_autofree char *l0 = NULL, *l1 = NULL;
  g_autofree char *p0 = g_build_filename (fx.dir, "log-0.json", NULL);
  g_autofree char *p1 = g_build_filename (fx.dir, "log-1.json", NULL);
  g_assert_true (g_file_get_contents (p0, &l0, NULL, NULL));
  g_assert_true (g_file_get_contents (p1, &l1, NULL, NULL));
  g_assert_cmpuint (stow_count_lines (l0), ==, 2);
  g_assert_cmpuint (stow_count_lines (l1), ==, 2);
  g_assert_nonnull (strstr (l0, "\"loss\""));
  guint steps = 0;
  for (const char *p = err; (p = strstr (p, "step ")) != NULL; p++)
    steps
        += g_str_has_prefix (p, "step 1/2") || g_str_has_prefix (p, "step 2/2");
  g_assert_cmpuint (steps, ==, 2); /* not once per rank */
}

/* The faults' run: 3 ranks at ZeRO 2, a checkpoint every 2 of 4 steps
 * (one rank alone as the reference). */
static const char *const fault_run[] = { "--steps",
                                         "4",
                                         "--save-every",
                                         "2",
                                         "--global-batch",
                                         "6",
                                         "--zero",
                                         "2",
                                         "--threads",
                                         "1",
                                         NULL };

/* A rank killed (SIGKILL) after logging step 3, before its checkpoint:
 * the job ends within seconds, `latest` names step 2, whole, and a resume
 * gives the uninterrupted run's bytes. */
static void
test_killed_rank (void)
{
  const char *const *base = fault_run;
  g_autofree char *ref = reference ("ref-faults", base);
  g_autofree char *dir = out_dir ("killed");
  const char *die[] = { "--test-die-at", "1:3", NULL };
  g_autoptr (GPtrArray) a = args_join (base, die);
  g_autofree char *err = NULL;
  double s = 0;
  int rc = run_ranks (3, dir, (const char *const *)a->pdata, 60, &err, &s);
  g_test_message ("rank 1 killed: mpirun exit %d after %.1f s: %s", rc, s, err);
  g_assert_cmpint (rc, !=, 0);
  /* Not timeout(1)'s end (124) of a job that hung: mpirun's own, with
   * the killed rank's status (137), well before the limit. */
  g_assert_cmpint (rc, !=, 124);
  g_assert_cmpfloat (s, <, 45.0);
  g_assert_cmpuint (latest_step (dir), ==, 2);
  const char *resume[] = { "--resume", NULL };
  g_autoptr (GPtrArray) b = args_join (base, resume);
  g_autofree char *err2 = NULL;
  g_assert_cmpint (
      run_ranks (3, dir, (const char *const *)b->pdata, 120, &err2, NULL), ==,
      0);
  assert_same_run (ref, dir);
}

/* Entries in directory @path. */
static guint
count_entries (const char *path)
{
  g_autoptr (GDir) d = g_dir_open (path, 0, NULL);
  g_assert_nonnull (d);
  guint n = 0;
  while (g_dir_read_name (d) != NULL)
    n++;
  return n;
}

/* Waits (up to 30 s) until no process that left a swap directory
 * ("stowage-PID-XXXXXX") in @path runs any more: mpirun returns when a
 * rank dies while the ranks it signals may still be ending. */
static void
wait_swap_owners (const char *path)
{
  for (int tries = 0; tries < 300; tries++)
    {
      gboolean alive = FALSE;
      g_autoptr (GDir) d = g_dir_open (path, 0, NULL);
      const char *name;
      while (d && (name = g_dir_read_name (d)) != NULL)
        {
          long pid = 0;
          if (sscanf (name, "stowage-%ld-", &pid) == 1 && pid > 0
              && (kill ((pid_t)pid, 0) == 0 || errno != ESRCH))
            alive = TRUE;
        }
      if (!alive)
        return;
      g_usleep (100000);
    }
  g_assert_not_reached ();
}

/* ZeRO-Infinity on 2 ranks with the weights and the optimizer's states on
 * NVMe, rank 1 killed after logging step 3: the job ends within seconds
 * with `latest` at step 2; a killed rank cannot remove its swap directory
 * (nor can the rank mpirun ends with it), and the resume's stores remove
 * what dead processes left there: after it the swap directory is empty
 * and the weights and states are the uninterrupted run's. */
static void
test_killed_rank_nvme (void)
{
  const char *base[] = {
    "--steps", "4",           "--save-every", "2",         "--global-batch",
    "8",       "--precision", "bf16",         "--threads", "1",
    NULL
  };
  g_autofree char *ref = reference ("ref-killed-nvme", base);
  g_autofree char *dir = out_dir ("killed-nvme");
  g_autofree char *swap = out_dir ("killed-nvme-swap");
  g_assert_cmpint (g_mkdir_with_parents (swap, 0700), ==, 0);
  const char *infinity[] = { "--zero",
                             "3",
                             "--offload-optimizer",
                             "nvme",
                             "--offload-params",
                             "nvme",
                             "--resident-layers",
                             "0",
                             "--nvme-dir",
                             swap,
                             NULL };
  g_autoptr (GPtrArray) a = args_join (base, infinity);
  g_autoptr (GPtrArray) die = g_ptr_array_copy (a, NULL, NULL);
  g_ptr_array_insert (die, (gint)die->len - 1, (gpointer) "--test-die-at");
  g_ptr_array_insert (die, (gint)die->len - 1, (gpointer) "1:3");
  g_autofree char *err = NULL;
  double s = 0;
  int rc = run_ranks (2, dir, (const char *const *)die->pdata, 60, &err, &s);
  guint left = count_entries (swap);
  g_test_message ("rank 1 killed: mpirun exit %d after %.1f s, %u swap "
                  "directories left",
                  rc, s, left);
  g_assert_cmpint (rc, !=, 0);
  g_assert_cmpint (rc, !=, 124);
  g_assert_cmpfloat (s, <, 45.0);
  g_assert_cmpuint (latest_step (dir), ==, 2);
  wait_swap_owners (swap);
  g_autoptr (GPtrArray) b = g_ptr_array_copy (a, NULL, NULL);
  g_ptr_array_insert (b, (gint)b->len - 1, (gpointer) "--resume");
  g_autofree char *err2 = NULL;
  rc = run_ranks (2, dir, (const char *const *)b->pdata, 120, &err2, NULL);
  if (rc != 0)
    g_printerr ("%s\n", err2);
  g_assert_cmpint (rc, ==, 0);
  assert_same_run (ref, dir);
  g_assert_cmpuint (count_entries (swap), ==, 0);
}

/* Rank 1 of 3 finds its disk full when it writes its part of the step-4
 * checkpoint (tests/checkpoint-killer.c's $STOW_FULL_AT, on that rank
 * only): every rank stops within seconds, the error names what filled,
 * nothing of step 4 is committed (latest stays at step 2), and a resume
 * gives the uninterrupted run's bytes. */
static void
test_disk_full (void)
{
  const char *killer = g_getenv ("STOW_KILLER");
  if (killer == NULL || !g_file_test (killer, G_FILE_TEST_EXISTS))
    {
      g_test_skip ("no tests/checkpoint-killer library");
      return;
    }
  const char *const *base = fault_run;
  g_autofree char *ref = reference ("ref-faults", base);
  g_autofree char *dir = out_dir ("full");
  const char *two[] = { "--steps", "2", NULL };
  g_autoptr (GPtrArray) a = args_join (base, two);
  g_assert_cmpint (
      run_ranks (3, dir, (const char *const *)a->pdata, 120, NULL, NULL), ==,
      0);
  g_assert_cmpuint (latest_step (dir), ==, 2);
  /* mpirun's three app contexts, rank 1's under the library. */
  const char *resume[] = { "--resume", NULL };
  g_autoptr (GPtrArray) t = train_argv (&fx, dir, base);
  g_ptr_array_insert (t, (gint)t->len - 1, (gpointer) "--resume");
  g_autofree char *preload = g_strdup_printf ("LD_PRELOAD=%s", killer);
  g_autofree char *kill_dir = g_strdup_printf ("STOW_KILL_DIR=%s", dir);
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  const char *pre[] = { "timeout",
                        "-k",
                        "5",
                        "60",
                        mpirun,
                        "--oversubscribe",
                        "--allow-run-as-root",
                        NULL };
  for (guint i = 0; pre[i]; i++)
    g_ptr_array_add (argv, (char *)pre[i]);
  for (guint r = 0; r < 3; r++)
    {
      if (r > 0)
        g_ptr_array_add (argv, (char *)":");
      g_ptr_array_add (argv, (char *)"-np");
      g_ptr_array_add (argv, (char *)"1");
      if (r == 1)
        {
          g_ptr_array_add (argv, (char *)"env");
          g_ptr_array_add (argv, preload);
          g_ptr_array_add (argv, kill_dir);
          g_ptr_array_add (argv, (char *)"STOW_FULL_AT=1");
        }
      for (guint i = 0; i + 1 < t->len; i++)
        g_ptr_array_add (argv, g_ptr_array_index (t, i));
    }
  g_ptr_array_add (argv, NULL);
  g_autofree char *err = NULL;
  int status = 0;
  g_autoptr (GError) error = NULL;
  g_auto (GStrv) env = ranks_env ();
  gint64 t0 = g_get_monotonic_time ();
  g_assert_true (g_spawn_sync (NULL, (char **)argv->pdata, env,
                               G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL,
                               NULL, NULL, NULL, &err, &status, &error));
  g_assert_no_error (error);
  double s = (g_get_monotonic_time () - t0) / 1e6;
  g_test_message ("rank 1's disk full: exit %d after %.1f s: %s", status, s,
                  err);
  g_assert_false (WIFEXITED (status) && WEXITSTATUS (status) == 0);
  g_assert_cmpfloat (s, <, 45.0);
  g_assert_nonnull (strstr (err, "No space left on device"));
  g_assert_cmpuint (latest_step (dir), ==, 2);
  /* No step-4 directory, whole or half. */
  g_autofree char *step4 = g_build_filename (dir, "step-000004", NULL);
  g_assert_false (g_file_test (step4, G_FILE_TEST_EXISTS));
  g_autoptr (GPtrArray) b = args_join (base, resume);
  g_assert_cmpint (
      run_ranks (3, dir, (const char *const *)b->pdata, 120, NULL, NULL), ==,
      0);
  assert_same_run (ref, dir);
}

/* A plan file of 2 data-parallel ranks at ZeRO 2 (stowage fit --emit plan)
 * runs on 2 ranks as the flags would: the one rank's bytes. */
static void
test_plan_file (void)
{
  g_autofree char *plan = g_build_filename (fx.dir, "plan.json", NULL);
  g_auto (StowRun) fit = { 0 };
  stow_run (&fit, "fit", fx.config, "--gpus", "2xA100-80GB", "--zero", "2",
            "--tp", "1", "--pp", "1", "--seq", "16", "--micro-batch", "2",
            "--global-batch", "4", "--precision", "fp32", "--emit", "plan",
            "-o", plan, NULL);
  g_assert_cmpint (fit.status, ==, 0);
  const char *ref_extra[] = { "--steps", "3", "--threads", "1", NULL };
  g_autofree char *ref = reference ("ref-plan", ref_extra);
  g_autofree char *dir = out_dir ("planned");
  const char *extra[]
      = { "--plan", plan, "--steps", "3", "--threads", "1", NULL };
  g_autofree char *err = NULL;
  int rc = run_ranks (2, dir, extra, 120, &err, NULL);
  if (rc != 0)
    g_printerr ("%s\n", err);
  g_assert_cmpint (rc, ==, 0);
  g_assert_nonnull (strstr (err, "plan file's layout"));
  g_assert_nonnull (strstr (err, "dp 2 tp 1 pp 1 zero 2"));
  assert_same_run (ref, dir);
  /* On one rank the plan's two are refused by name. */
  g_auto (StowRun) one = { 0 };
  g_autofree char *dir1 = out_dir ("planned-one");
  trainv (&one, &fx, dir1, extra);
  g_assert_cmpint (one.status, !=, 0);
  g_assert_nonnull (strstr (one.err, "launch dp ranks (mpirun -np 2)"));
}

/* The optimizer on NVMe in chunks of 3000 parameters (a plan file's
 * swap_shard_params), so that chunks cut through the ranks' partitions
 * and tensors: 3 ranks at ZeRO 2, bf16, the one rank's bytes; the swap
 * files gone afterwards. */
static void
test_nvme_chunks (void)
{
  g_autofree char *plan = g_build_filename (fx.dir, "plan-nvme.json", NULL);
  g_auto (StowRun) fit = { 0 };
  stow_run (&fit, "fit", fx.config, "--gpus", "3xA100-80GB", "--zero", "2",
            "--tp", "1", "--pp", "1", "--offload-optimizer", "nvme", "--seq",
            "16", "--micro-batch", "2", "--global-batch", "12", "--precision",
            "bf16", "--emit", "plan", "-o", plan, NULL);
  g_assert_cmpint (fit.status, ==, 0);
  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (plan, &text, NULL, NULL));
  g_autoptr (GRegex) re
      = g_regex_new ("\"swap_shard_params\" : [0-9]+", 0, 0, NULL);
  g_autofree char *edited = g_regex_replace_literal (
      re, text, -1, 0, "\"swap_shard_params\" : 3000", 0, NULL);
  g_assert_cmpstr (edited, !=, text);
  g_assert_true (g_file_set_contents (plan, edited, -1, NULL));
  const char *one[] = { "--steps",        "3",      "--precision", "bf16",
                        "--global-batch", "12",     "--threads",   "1",
                        "--model",        fx.model, NULL };
  g_autofree char *ref = reference ("ref-bf16-12", one);
  g_autofree char *dir = out_dir ("nvme-chunks");
  g_autofree char *swap = out_dir ("nvme-chunks-swap");
  g_assert_cmpint (g_mkdir_with_parents (swap, 0700), ==, 0);
  const char *extra[] = { "--plan",
                          plan,
                          "--steps",
                          "3",
                          "--threads",
                          "1",
                          "--offload-optimizer",
                          "nvme",
                          "--nvme-dir",
                          swap,
                          NULL };
  g_autofree char *err = NULL;
  int rc = run_ranks (3, dir, extra, 120, &err, NULL);
  if (rc != 0)
    g_printerr ("%s\n", err);
  g_assert_cmpint (rc, ==, 0);
  g_assert_nonnull (strstr (err, "optimizer nvme"));
  const char *chunks = strstr (err, "optimizer states on NVMe: ");
  g_assert_nonnull (chunks);
  g_assert_cmpuint (g_ascii_strtoull (chunks + 26, NULL, 10), >=, 4);
  assert_same_run (ref, dir);
  assert_each_peak (err, "device peak: ", 3);
  /* Each rank's private swap directory is gone with it. */
  g_autoptr (GDir) d = g_dir_open (swap, 0, NULL);
  g_assert_nonnull (d);
  g_assert_null (g_dir_read_name (d));
}

/* ZeRO-Offload's delayed update on several ranks: each rank's partition
 * of the last step's gradients applied while the step runs.  2 ranks for
 * 2 steps, then 3 ranks resuming (the pending gradients in each rank's
 * file, repartitioned) for 2 more: one rank's 4 delayed steps, byte for
 * byte. */
static void
test_delayed (void)
{
  const char *base[]
      = { "--precision",      "bf16", "--global-batch",      "12",
          "--threads",        "1",    "--offload-optimizer", "cpu",
          "--delayed-update", NULL };
  const char *four[] = { "--steps", "4", NULL };
  g_autoptr (GPtrArray) ref_args = args_join (base, four);
  g_autofree char *ref
      = reference ("ref-delayed", (const char *const *)ref_args->pdata);
  g_autofree char *dir = out_dir ("delayed");
  const char *legs[][6] = { { "2", "--steps", "2", "--zero", "2" },
                            { "3", "--steps", "4", "--resume", NULL } };
  for (guint i = 0; i < G_N_ELEMENTS (legs); i++)
    {
      g_autoptr (GPtrArray) a = args_join (base, legs[i] + 1);
      g_autofree char *err = NULL;
      int rc = run_ranks (atoi (legs[i][0]), dir, (const char *const *)a->pdata,
                          120, &err, NULL);
      if (rc != 0)
        g_printerr ("%s\n", err);
      g_assert_cmpint (rc, ==, 0);
      assert_each_peak (err, "device peak: ", atoi (legs[i][0]));
      assert_each_peak (err, "pinned host peak: ", atoi (legs[i][0]));
    }
  assert_same_run (ref, dir);
}

/* A global batch the ranks cannot share is refused by name on every
 * rank. */
static void
test_refusals (void)
{
  g_autofree char *dir = out_dir ("refused");

  const char *odd[] = { "--steps", "1", "--global-batch", "6", NULL };
  g_autofree char *err2 = NULL;
  g_assert_cmpint (run_ranks (4, dir, odd, 60, &err2, NULL), !=, 0);
  g_assert_nonnull (strstr (err2, "x 4 ranks"));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_autofree char *found = g_find_program_in_path ("mpirun");
  if (found == NULL || g_strcmp0 (g_getenv ("STOW_HAVE_MPI"), "1") != 0)
    {
      g_printerr ("skipped: no mpirun or a build without MPI\n");
      return 77;
    }
  mpirun = found;
  fixture_init (&fx);
  make_tied_model ();
  static const Case cases[] = {
    { 2, "0", "fp32", "4" },
    { 2, "1", "fp32", "4" },
    { 2, "2", "fp32", "4" },
    { 2, "3", "fp32", "4" },
    { 4, "0", "fp32", "8" },
    { 4, "3", "fp32", "8" },
    { 3, "1", "fp32", "12" },
    { 3, "2", "bf16", "12" },
    { 4, "2", "bf16", "8" },
    { 3, "3", "bf16", "12" },
    /* Tied embeddings: the loss's and the embedding's gradients of each
     * micro-batch reduced as one rank adds them. */
    { 2, "1", "fp32", "4", TRUE },
    { 3, "2", "bf16", "12", TRUE },
    { 4, "0", "bf16", "8", TRUE },
    /* ZeRO 3 of a tied model: the output layer's slot gathers the head
     * and the embedding it reads. */
    { 2, "3", "fp32", "8", TRUE },
    { 3, "3", "bf16", "12", TRUE },
    /* ZeRO-Offload on each rank: CPU Adam over the rank's partition in
     * host memory, the partition of the step's gradients brought up into
     * the slot behind each micro-batch's and reduced into it. */
    { 2, "1", "fp32", "8", FALSE, "cpu" },
    { 3, "2", "bf16", "12", FALSE, "cpu" },
    { 4, "3", "bf16", "16", FALSE, "cpu" },
    { 2, "2", "bf16", "12", TRUE, "cpu" },
    /* ZeRO-Infinity on each rank: the weights too in host memory, every
     * layer's partitions copied up into a layer slot and gathered. */
    { 2, "3", "fp32", "8", FALSE, "cpu", "cpu" },
    { 3, "3", "bf16", "12", FALSE, "cpu", "cpu" },
    /* The optimizer's states on NVMe, each rank's partitions in chunks
     * of its own store. */
    { 2, "2", "fp32", "8", FALSE, "nvme" },
    { 3, "1", "bf16", "12", FALSE, "nvme" },
    { 4, "3", "bf16", "16", FALSE, "nvme" },
    /* ZeRO-Infinity with the weights on NVMe too: each rank's store holds
     * its partitions of the units, staged, copied up into their places in
     * a layer slot and gathered there. */
    { 2, "3", "bf16", "8", FALSE, "cpu", "nvme" },
    { 3, "3", "bf16", "12", FALSE, "nvme", "nvme" },
    /* ... of a tied model: each rank's parts of the head and of the
     * embedding copied up into the output layer's slot and gathered. */
    { 2, "3", "fp32", "8", TRUE, "cpu", "cpu" },
    { 3, "3", "bf16", "12", TRUE, "nvme", "nvme" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strdup_printf (
          "/train-ranks/zero%s-%dranks-%s%s%s%s", cases[i].zero, cases[i].n,
          cases[i].precision, cases[i].tied ? "-tied" : "",
          cases[i].offload ? (g_str_equal (cases[i].offload, "nvme")
                                  ? "-offload-optimizer-nvme"
                                  : "-offload-optimizer")
                           : "",
          cases[i].params ? "-offload-params" : "");
      g_test_add_data_func (path, &cases[i], test_same_bytes);
    }
  /* 24 sequences: 6, 4 or 3 micro-batches of 2 on each rank. */
  static const NativeCase natives[] = {
    { 2, "1", "fp32", "24" },      { 3, "2", "fp32", "24" },
    { 4, "3", "fp32", "24" },      { 2, "3", "bf16", "24" },
    { 3, "2", "bf16", "24" },      { 4, "1", "bf16", "24" },
    { 2, "2", "bf16", "4", TRUE },
  };
  for (guint i = 0; i < G_N_ELEMENTS (natives); i++)
    {
      g_autofree char *path = g_strdup_printf (
          "/train-ranks/native-%dranks-%s%s", natives[i].n,
          natives[i].precision, natives[i].same ? "-one-micro-batch" : "");
      g_test_add_data_func (path, &natives[i], test_native);
    }
  g_test_add_func ("/train-ranks/native-one-rank", test_native_one_rank);
  g_test_add_func ("/train-ranks/resume-across-ranks",
                   test_resume_across_ranks);
  g_test_add_func ("/train-ranks/rank-logs", test_rank_logs);
  g_test_add_func ("/train-ranks/killed-rank", test_killed_rank);
  g_test_add_func ("/train-ranks/killed-rank-nvme", test_killed_rank_nvme);
  g_test_add_func ("/train-ranks/disk-full", test_disk_full);
  g_test_add_func ("/train-ranks/plan-file", test_plan_file);
  g_test_add_func ("/train-ranks/nvme-chunks", test_nvme_chunks);
  g_test_add_func ("/train-ranks/delayed-update", test_delayed);
  g_test_add_func ("/train-ranks/refusals", test_refusals);
  int rc = g_test_run ();
  fixture_clear (&fx);
  g_free (tied_model);
  return rc;
}
