/* SPDX-License-Identifier: MIT
 *
 * tests/test-comm-mpi.c: the collectives of executor/comm/ over Open MPI,
 * 1 to 4 ranks under mpirun --oversubscribe (tests/comm-mpi-rank.c
 * does the checking), and a rank that dies early ending the job in bounded
 * time.  Exits 77 (skip) without mpirun or a build with MPI.
 */
#include <glib.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static const char *mpirun, *rank_exe;

/* mpirun -np @n rank_exe @what, under timeout(1): the exit status, the
 * wall time in @seconds and the output in @out. */
static int
run_ranks (int n, const char *what, int limit_s, double *seconds, char **out)
{
  g_autofree char *np = g_strdup_printf ("%d", n);
  g_autofree char *limit = g_strdup_printf ("%d", limit_s);
  const char *argv[] = { "timeout",
                         "-k",
                         "5",
                         limit,
                         mpirun,
                         "--oversubscribe",
                         "--allow-run-as-root",
                         "-np",
                         np,
                         rank_exe,
                         what,
                         NULL };
  g_autoptr (GError) error = NULL;
  int status = 0;
  gint64 t0 = g_get_monotonic_time ();
  g_assert_true (g_spawn_sync (NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH,
                               NULL, NULL, out, NULL, &status, &error));
  g_assert_no_error (error);
  *seconds = (g_get_monotonic_time () - t0) / 1e6;
  return WIFEXITED (status) ? WEXITSTATUS (status) : 128 + WTERMSIG (status);
}

static void
test_check (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  g_autofree char *out = NULL;
  double s = 0;
  int rc = run_ranks (n, "check", 60, &s, &out);
  g_test_message ("%d ranks: %.1f s: %s", n, s, out);
  g_assert_cmpint (rc, ==, 0);
  g_autofree char *agree = g_strdup_printf ("%d ranks agree", n);
  g_assert_nonnull (strstr (out, agree));
}

/* Open MPI's default: when a rank exits without MPI_Finalize, mpirun kills
 * the others and exits non-zero ("...exited without calling finalize"),
 * so the ranks blocked in the all-reduce end within seconds, not never. */
static void
test_early_exit (void)
{
  g_autofree char *out = NULL;
  double s = 0;
  int rc = run_ranks (3, "early-exit", 30, &s, &out);
  g_test_message ("a rank exited early: mpirun exit %d after %.1f s", rc, s);
  g_assert_cmpint (rc, !=, 0);
  g_assert_cmpint (rc, !=, 124); /* timeout(1): the job hung */
  g_assert_cmpint (rc, !=, 137);
  g_assert_cmpfloat (s, <, 20.0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_autofree char *found = g_find_program_in_path ("mpirun");
  rank_exe = g_getenv ("STOW_COMM_MPI_RANK");
  if (found == NULL || rank_exe == NULL || *rank_exe == '\0')
    {
      printf ("SKIP: %s\n",
              found == NULL ? "no mpirun on PATH" : "built without MPI");
      return 77;
    }
  mpirun = found;
  /* Idle ranks yield their core: four ranks share CI's two. */
  g_setenv ("OMPI_MCA_mpi_yield_when_idle", "1", TRUE);
  /* Under the sanitizers (the asan setup): Open MPI keeps what MPI_Init
   * allocates until exit, which LeakSanitizer would report in every rank
   * (executor/comm/'s own leaks in the ranks go unchecked there). */
  const char *asan = g_getenv ("ASAN_OPTIONS");
  if (asan != NULL)
    {
      g_autofree char *opts = g_strconcat (asan, ":detect_leaks=0", NULL);
      g_setenv ("ASAN_OPTIONS", opts, TRUE);
    }
  for (int n = 1; n <= 4; n++)
    {
      g_autofree char *path = g_strdup_printf ("/comm-mpi/check/%d", n);
      g_test_add_data_func (path, GINT_TO_POINTER (n), test_check);
    }
  g_test_add_func ("/comm-mpi/early-exit", test_early_exit);
  return g_test_run ();
}
