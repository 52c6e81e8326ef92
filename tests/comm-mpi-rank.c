/* SPDX-License-Identifier: MIT
 *
 * tests/comm-mpi-rank.c: one rank of test-comm-mpi, run under mpirun.
 * "check": every collective of executor/comm/comm.h against the serial
 * rank-order sum each rank computes from all ranks' contributions;
 * "early-exit": rank 1 leaves before an all-reduce the others wait in;
 * "bench": all-reduce bandwidth.  Exits 0, or prints why and aborts the job.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "executor/comm/comm.h"
#include "executor/comm/mpi.h"
#include "offload/adam.h"

static StowComm *comm;

static G_NORETURN void fail (const char *fmt, ...) G_GNUC_PRINTF (1, 2);

static G_NORETURN void
fail (const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  fprintf (stderr, "comm-mpi-rank %d of %d: FAIL: %s\n", stow_comm_rank (comm),
           stow_comm_world_size (comm), msg);
  fflush (stderr);
  stow_comm_mpi_abort (1);
}

static void
wait_ok (StowCommRequest *r, const char *what)
{
  g_autoptr (GError) error = NULL;
  if (r == NULL || !stow_comm_wait (comm, r, &error))
    fail ("%s: %s", what, error ? error->message : "not started");
}

/* Rank q's element i: varied signs and magnitudes (2^-12 .. 2^12), so the
 * order of summation shows in the last bits. */
static float
value (int q, guint64 i)
{
  guint32 h = (guint32)(i * 2654435761u) ^ (guint32)(q * 40503u + 17u);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  float m = (float)(h % 20011u) / 20011.0f - 0.5f;
  return ldexpf (m, (int)((h >> 16) % 25u) - 12);
}

static void *
contribution (int q, guint64 count, StowDtype dtype)
{
  guint es = stow_dtype_size (dtype);
  guint8 *b = g_malloc (MAX (count * es, 1));
  for (guint64 i = 0; i < count; i++)
    if (dtype == STOW_DTYPE_F32)
      ((float *)b)[i] = value (q, i);
    else
      ((guint16 *)b)[i] = stow_f32_to_bf16 (value (q, i));
  return b;
}

static double
as_double (const void *b, guint64 i, StowDtype dtype)
{
  return dtype == STOW_DTYPE_F32 ? ((const float *)b)[i]
                                 : stow_bf16_to_f32 (((const guint16 *)b)[i]);
}

/* The native sums: within (N - 1) unit roundoffs of the sum of magnitudes,
 * the bound of any order of N - 1 rounded additions (Higham, 2002, 4.2),
 * with 1% slack for the second-order term. */
static void
check_close (const char *what, const void *got, const void *const *c, int n,
             guint64 off, guint64 len, StowDtype dtype)
{
  double u = dtype == STOW_DTYPE_F32 ? ldexp (1, -24) : ldexp (1, -8);
  for (guint64 i = 0; i < len; i++)
    {
      double exact = 0, mag = 0;
      for (int q = 0; q < n; q++)
        {
          exact += as_double (c[q], off + i, dtype);
          mag += fabs (as_double (c[q], off + i, dtype));
        }
      double g = as_double (got, i, dtype);
      if (fabs (g - exact) > 1.01 * (n - 1) * u * mag)
        fail ("%s: element %" G_GUINT64_FORMAT ": %.9g, exact %.9g", what,
              off + i, g, exact);
    }
}

static void
check_bytes (const char *what, const void *got, const void *want, guint64 len,
             StowDtype dtype)
{
  guint es = stow_dtype_size (dtype);
  for (guint64 i = 0; i < len; i++)
    if (memcmp ((const guint8 *)got + i * es, (const guint8 *)want + i * es, es)
        != 0)
      fail ("%s: element %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT
            ": %.9g, want %.9g",
            what, i, len, as_double (got, i, dtype),
            as_double (want, i, dtype));
}

static void
check_zero (const char *what, const void *b, guint64 from, guint64 to,
            StowDtype dtype)
{
  guint es = stow_dtype_size (dtype);
  for (guint64 i = from; i < to; i++)
    for (guint k = 0; k < es; k++)
      if (((const guint8 *)b)[i * es + k] != 0)
        fail ("%s: padding element %" G_GUINT64_FORMAT " not zero", what, i);
}

static guint64 native_differ; /* elements where native != deterministic */

static void
check_one (guint64 count, StowDtype dtype)
{
  int n = stow_comm_world_size (comm), me = stow_comm_rank (comm);
  guint es = stow_dtype_size (dtype);
  guint64 part = stow_comm_partition_numel (count, n, 1);
  g_autofree void **c = g_new0 (void *, (guint)n);
  for (int q = 0; q < n; q++)
    c[q] = contribution (q, count, dtype);
  g_autofree guint8 *want = g_malloc (MAX (part * n * es, 1));
  memset (want, 0, MAX (part * n * es, 1));
  stow_comm_sum_rank_order (want, (const void *const *)c, (guint)n, count,
                            dtype);
  g_autofree char *tag = g_strdup_printf ("%s count %" G_GUINT64_FORMAT,
                                          stow_dtype_nick (dtype), count);
  guint64 mine = me * part >= count ? 0 : MIN (part, count - me * part);

  /* Deterministic: the bytes of the serial rank-order sum. */
  stow_comm_set_mode (comm, STOW_COMM_DETERMINISTIC);
  g_autofree guint8 *buf = g_memdup2 (c[me], MAX (count * es, 1));
  wait_ok (stow_comm_all_reduce (comm, buf, count, dtype, NULL), tag);
  check_bytes ("deterministic all-reduce", buf, want, count, dtype);
  g_autofree guint8 *rs = g_malloc (MAX (part * es, 1));
  memset (rs, 0xa5, MAX (part * es, 1));
  wait_ok (stow_comm_reduce_scatter (comm, c[me], rs, count, dtype, NULL), tag);
  check_bytes ("deterministic reduce-scatter", rs, want + me * part * es, mine,
               dtype);
  check_zero ("deterministic reduce-scatter", rs, mine, part, dtype);
  g_autofree guint8 *ag = g_malloc (MAX (count * es, 1));
  wait_ok (stow_comm_all_gather (comm, rs, ag, count, dtype, NULL), tag);
  check_bytes ("all-gather", ag, want, count, dtype);

  /* Native: the library's order, within the rounding bound. */
  stow_comm_set_mode (comm, STOW_COMM_NATIVE);
  memcpy (buf, c[me], count * es);
  wait_ok (stow_comm_all_reduce (comm, buf, count, dtype, NULL), tag);
  check_close ("native all-reduce", buf, (const void *const *)c, n, 0, count,
               dtype);
  for (guint64 i = 0; i < count; i++)
    native_differ += memcmp (buf + i * es, want + i * es, es) != 0;
  memset (rs, 0xa5, MAX (part * es, 1));
  wait_ok (stow_comm_reduce_scatter (comm, c[me], rs, count, dtype, NULL), tag);
  check_close ("native reduce-scatter", rs, (const void *const *)c, n,
               me * part, mine, dtype);
  check_zero ("native reduce-scatter", rs, mine, part, dtype);
  memcpy (rs, want + me * part * es, part * es);
  memset (ag, 0, count * es);
  wait_ok (stow_comm_all_gather (comm, rs, ag, count, dtype, NULL), tag);
  check_bytes ("native all-gather", ag, want, count, dtype);

  /* Broadcast from the last rank and from rank 0. */
  for (int root = n - 1; root >= 0; root -= MAX (n - 1, 1))
    {
      memcpy (buf, c[me], count * es);
      wait_ok (stow_comm_broadcast (comm, buf, count, dtype, root, NULL), tag);
      check_bytes ("broadcast", buf, c[root], count, dtype);
    }
  for (int q = 0; q < n; q++)
    g_free (c[q]);
}

/* ZeRO's forms, in both modes, as executor/backends/cpu-ranks.c calls them
 * for every gradient: partitions aligned to @align (a norm block there,
 * so that the last ranks may own nothing but padding), the sum added
 * after what the partition holds (@acc's slice: the earlier micro-batches'
 * sum), and the all-gather of such partitions. */
static void
check_ex (guint64 count, guint64 align, StowDtype dtype)
{
  int n = stow_comm_world_size (comm), me = stow_comm_rank (comm);
  guint es = stow_dtype_size (dtype);
  guint64 part = stow_comm_partition_numel (count, n, (guint)align);
  guint64 pb = part * es, whole = MAX (pb * n, 1);
  /* c[0] is what the partitions hold before (the same on every rank),
   * c[1 + q] rank q's contribution. */
  g_autofree void **c = g_new0 (void *, (guint)n + 1);
  for (int q = 0; q <= n; q++)
    c[q] = contribution (q == 0 ? n : q - 1, count, dtype);
  g_autofree guint8 *want = g_malloc0 (whole);
  g_autofree guint8 *want_acc = g_malloc0 (whole);
  stow_comm_sum_rank_order (want, (const void *const *)c + 1, (guint)n, count,
                            dtype);
  stow_comm_sum_rank_order (want_acc, (const void *const *)c, (guint)n + 1,
                            count, dtype);
  g_autofree char *tag = g_strdup_printf (
      "%s count %" G_GUINT64_FORMAT " align %" G_GUINT64_FORMAT,
      stow_dtype_nick (dtype), count, align);
  guint64 mine = me * part >= count ? 0 : MIN (part, count - me * part);
  g_autofree guint8 *rs = g_malloc (MAX (pb, 1));
  g_autofree guint8 *ag = g_malloc (MAX (count * es, 1));
  for (int mode = 0; mode < 2; mode++)
    {
      gboolean native = mode == STOW_COMM_NATIVE;
      stow_comm_set_mode (comm, (StowCommMode)mode);
      g_autofree char *what = g_strdup_printf (
          "%s reduce-scatter-ex %s", native ? "native" : "deterministic", tag);

      memset (rs, 0xa5, MAX (pb, 1));
      wait_ok (stow_comm_reduce_scatter_ex (comm, c[me + 1], rs, count, align,
                                            FALSE, dtype, NULL),
               what);
      if (native)
        check_close (what, rs, (const void *const *)c + 1, n, me * part, mine,
                     dtype);
      else
        check_bytes (what, rs, want + me * part * es, mine, dtype);
      check_zero (what, rs, mine, part, dtype);

      /* Accumulating: the partition holds its earlier sum, padding zero. */
      memset (rs, 0, MAX (pb, 1));
      memcpy (rs, (const guint8 *)c[0] + me * part * es, mine * es);
      wait_ok (stow_comm_reduce_scatter_ex (comm, c[me + 1], rs, count, align,
                                            TRUE, dtype, NULL),
               what);
      if (native)
        check_close (what, rs, (const void *const *)c, n + 1, me * part, mine,
                     dtype);
      else
        check_bytes (what, rs, want_acc + me * part * es, mine, dtype);
      check_zero (what, rs, mine, part, dtype);

      memcpy (rs, want + me * part * es, MAX (pb, 1));
      memset (ag, 0, MAX (count * es, 1));
      wait_ok (
          stow_comm_all_gather_ex (comm, rs, ag, count, align, dtype, NULL),
          what);
      check_bytes ("all-gather-ex", ag, want, count, dtype);
    }
  for (int q = 0; q <= n; q++)
    g_free (c[q]);
}

/* Several collectives in flight at once, waited on out of order. */
static void
check_async (void)
{
  int n = stow_comm_world_size (comm), me = stow_comm_rank (comm);
  guint64 count = 1001;
  guint64 part = stow_comm_partition_numel (count, n, 1);
  stow_comm_set_mode (comm, STOW_COMM_DETERMINISTIC);
  g_autofree void **c = g_new0 (void *, (guint)n);
  for (int q = 0; q < n; q++)
    c[q] = contribution (q, count, STOW_DTYPE_F32);
  g_autofree float *want = g_new0 (float, part *n);
  stow_comm_sum_rank_order (want, (const void *const *)c, (guint)n, count,
                            STOW_DTYPE_F32);
  g_autofree float *a = g_memdup2 (c[me], count * 4);
  g_autofree float *b = g_new0 (float, part);
  g_autofree float *d = g_memdup2 (c[me], count * 4);
  StowCommRequest *r[4] = {
    stow_comm_all_reduce (comm, a, count, STOW_DTYPE_F32, NULL),
    stow_comm_reduce_scatter (comm, c[me], b, count, STOW_DTYPE_F32, NULL),
    stow_comm_broadcast (comm, d, count, STOW_DTYPE_F32, 0, NULL),
    stow_comm_barrier (comm, NULL),
  };
  for (int i = 3; i >= 0; i--)
    wait_ok (r[i], "async");
  check_bytes ("async all-reduce", a, want, count, STOW_DTYPE_F32);
  guint64 mine = me * part >= count ? 0 : MIN (part, count - me * part);
  check_bytes ("async reduce-scatter", b, want + me * part, mine,
               STOW_DTYPE_F32);
  check_bytes ("async broadcast", d, c[0], count, STOW_DTYPE_F32);
  for (int q = 0; q < n; q++)
    g_free (c[q]);
}

static void
check_refusals (void)
{
  g_autoptr (GError) error = NULL;
  float x = 0;
  if (stow_comm_all_reduce (comm, &x, 1, STOW_DTYPE_F16, &error) != NULL
      || !g_error_matches (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID)
      || strstr (error->message, "fp16") == NULL)
    fail ("an fp16 all-reduce was not refused by name");
  g_clear_error (&error);
  int n = stow_comm_world_size (comm);
  if (stow_comm_broadcast (comm, &x, 1, STOW_DTYPE_F32, n, &error) != NULL
      || strstr (error->message, "root") == NULL)
    fail ("a broadcast from root %d was not refused", n);
}

int
main (int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  if (argc != 2)
    {
      fprintf (stderr, "usage: comm-mpi-rank check|early-exit|bench\n");
      return 2;
    }
  comm = stow_comm_mpi_new (&error);
  if (comm == NULL)
    {
      fprintf (stderr, "comm-mpi-rank: %s\n", error->message);
      return 1;
    }
  int n = stow_comm_world_size (comm), me = stow_comm_rank (comm);
  if (g_str_equal (argv[1], "early-exit"))
    {
      if (me == 1)
        _exit (3); /* no MPI_Finalize: a crash, as far as MPI knows */
      float x = 1;
      wait_ok (stow_comm_all_reduce (comm, &x, 1, STOW_DTYPE_F32, NULL),
               "all-reduce beside a dead rank");
      fail ("the all-reduce completed without rank 1");
    }
  if (g_str_equal (argv[1], "bench"))
    {
      guint64 count = 16u << 20; /* 64 MiB of fp32 */
      g_autofree float *b = g_new0 (float, count);
      for (int mode = 0; mode < 2; mode++)
        {
          stow_comm_set_mode (comm, (StowCommMode)mode);
          wait_ok (stow_comm_all_reduce (comm, b, count, STOW_DTYPE_F32, NULL),
                   "warm-up");
          wait_ok (stow_comm_barrier (comm, NULL), "barrier");
          gint64 t0 = g_get_monotonic_time ();
          for (int i = 0; i < 3; i++)
            wait_ok (
                stow_comm_all_reduce (comm, b, count, STOW_DTYPE_F32, NULL),
                "all-reduce");
          double s = (g_get_monotonic_time () - t0) / 3e6;
          /* Bus bandwidth as nccl-tests defines it: 2 (N-1) / N bytes. */
          if (me == 0)
            printf ("%d ranks, %s all-reduce of 64 MiB fp32: %.1f ms, bus "
                    "bandwidth %.2f GB/s\n",
                    n, mode == 0 ? "deterministic" : "native", s * 1e3,
                    2.0 * (n - 1) / n * count * 4 / s / 1e9);
        }
      stow_comm_free (comm);
      return 0;
    }
  const guint64 counts[] = { 0, 1, (guint64)n - 1, 7, 1000, 4099, 65537 };
  const StowDtype dtypes[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16 };
  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (guint i = 0; i < G_N_ELEMENTS (counts); i++)
      check_one (counts[i], dtypes[d]);
  const guint64 ex_counts[] = { 0, 1, 1000, 20000 };
  const guint64 aligns[] = { 2, 8192 };
  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (guint i = 0; i < G_N_ELEMENTS (ex_counts); i++)
      for (guint a = 0; a < G_N_ELEMENTS (aligns); a++)
        check_ex (ex_counts[i], aligns[a], dtypes[d]);
  check_async ();
  check_refusals ();
  wait_ok (stow_comm_barrier (comm, NULL), "barrier");
  if (me == 0)
    printf ("comm-mpi-rank: %d ranks agree; native sums differ from the "
            "rank-order sums in %" G_GUINT64_FORMAT " elements\n",
            n, native_differ);
  stow_comm_free (comm);
  return 0;
}
