/* SPDX-License-Identifier: MIT
 *
 * tests/test-comm-launch.c: rank, world size, local rank and rendezvous
 * from each launcher's environment (mpirun, torchrun, Slurm's srun) and
 * the flags over them (executor/comm/launch.h); refusals name the value.
 */
#include <glib.h>
#include <string.h>

#include "executor/comm/launch.h"

typedef struct
{
  const char *name;
  const char *env[12]; /* "NAME=value", NULL-terminated */
  StowLaunchFlags flags;
  /* Expected on success, or the words the error must hold. */
  int rank, world, local;
  StowLaunchSource source;
  const char *init;
  const char *error;
} Case;

static const Case cases[] = {
  { .name = "none",
    .env = { "HOME=/root" },
    .rank = 0,
    .world = 1,
    .source = STOW_LAUNCH_NONE,
    .init = "none" },
  { .name = "mpirun",
    .env = { "OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8",
             "OMPI_COMM_WORLD_LOCAL_RANK=1" },
    .rank = 5,
    .world = 8,
    .local = 1,
    .source = STOW_LAUNCH_MPIRUN,
    .init = "mpi" },
  { .name = "torchrun",
    .env = { "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=3", "MASTER_ADDR=10.0.0.1",
             "MASTER_PORT=29500" },
    .rank = 3,
    .world = 4,
    .local = 3,
    .source = STOW_LAUNCH_TORCHRUN,
    .init = "tcp://10.0.0.1:29500" },
  { .name = "slurm",
    .env = { "SLURM_PROCID=6", "SLURM_NTASKS=16", "SLURM_LOCALID=2" },
    .rank = 6,
    .world = 16,
    .local = 2,
    .source = STOW_LAUNCH_SLURM,
    .init = "mpi" },
  /* mpirun inside an sbatch allocation: SLURM_PROCID is the batch
   * step's 0 on every rank, mpirun's variables are the ranks'. */
  { .name = "mpirun-in-slurm",
    .env = { "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
             "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
             "OMPI_COMM_WORLD_LOCAL_RANK=0" },
    .rank = 2,
    .world = 4,
    .local = 0,
    .source = STOW_LAUNCH_MPIRUN,
    .init = "mpi" },
  { .name = "torchrun-in-slurm",
    .env = { "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "RANK=9",
             "WORLD_SIZE=16", "LOCAL_RANK=1", "MASTER_ADDR=node0",
             "MASTER_PORT=1234" },
    .rank = 9,
    .world = 16,
    .local = 1,
    .source = STOW_LAUNCH_TORCHRUN,
    .init = "tcp://node0:1234" },
  { .name = "flags-alone",
    .flags = { "1", "2", "tcp://127.0.0.1:7000" },
    .rank = 1,
    .world = 2,
    .local = 1,
    .source = STOW_LAUNCH_FLAGS,
    .init = "tcp://127.0.0.1:7000" },
  { .name = "flags-over-mpirun",
    .env = { "OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8",
             "OMPI_COMM_WORLD_LOCAL_RANK=1" },
    .flags = { "1", "2", NULL },
    .rank = 1,
    .world = 2,
    .local = 1,
    .source = STOW_LAUNCH_MPIRUN,
    .init = "mpi" },
  { .name = "flags-world-below-env-local",
    .env = { "OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8",
             "OMPI_COMM_WORLD_LOCAL_RANK=1" },
    .flags = { "0", "1", NULL },
    .error = "OMPI_COMM_WORLD_LOCAL_RANK: local rank 1 not below the world "
             "size 1 (--world-size)" },
  { .name = "init-env",
    .env = { "MASTER_ADDR=h", "MASTER_PORT=80" },
    .flags = { "0", "2", "env" },
    .rank = 0,
    .world = 2,
    .source = STOW_LAUNCH_FLAGS,
    .init = "tcp://h:80" },
  { .name = "init-mpi-torchrun",
    .env = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0" },
    .flags = { NULL, NULL, "mpi" },
    .rank = 0,
    .world = 2,
    .source = STOW_LAUNCH_TORCHRUN,
    .init = "mpi" },
  /* Refusals, each naming the variable or flag and the value. */
  { .name = "malformed-rank",
    .env = { "OMPI_COMM_WORLD_RANK=two", "OMPI_COMM_WORLD_SIZE=4",
             "OMPI_COMM_WORLD_LOCAL_RANK=0" },
    .error = "OMPI_COMM_WORLD_RANK: \"two\"" },
  { .name = "negative-rank",
    .env = { "RANK=-1", "WORLD_SIZE=4", "LOCAL_RANK=0", "MASTER_ADDR=h",
             "MASTER_PORT=1" },
    .error = "RANK: \"-1\"" },
  { .name = "zero-world",
    .env = { "SLURM_PROCID=0", "SLURM_NTASKS=0", "SLURM_LOCALID=0" },
    .error = "SLURM_NTASKS: \"0\"" },
  { .name = "trailing-junk",
    .env = { "SLURM_PROCID=0", "SLURM_NTASKS=4x", "SLURM_LOCALID=0" },
    .error = "SLURM_NTASKS: \"4x\"" },
  { .name = "overflow",
    .env = { "SLURM_PROCID=0", "SLURM_NTASKS=99999999999", "SLURM_LOCALID=0" },
    .error = "SLURM_NTASKS: \"99999999999\"" },
  { .name = "partial-torchrun",
    .env = { "RANK=1", "LOCAL_RANK=1" },
    .error = "WORLD_SIZE: unset" },
  { .name = "rank-past-world",
    .env = { "OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4",
             "OMPI_COMM_WORLD_LOCAL_RANK=0" },
    .error = "OMPI_COMM_WORLD_RANK: rank 4 not below the world size 4" },
  { .name = "local-past-world",
    .env = { "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=2" },
    .error = "SLURM_LOCALID: local rank 2" },
  { .name = "flag-rank-past-env-world",
    .env = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=h",
             "MASTER_PORT=1" },
    .flags = { "2", NULL, NULL },
    .error = "--rank: rank 2 not below the "
             "world size 2 (WORLD_SIZE)" },
  { .name = "flag-rank-alone",
    .flags = { "1", NULL, NULL },
    .error = "--rank: rank 1 not below the world size 1 (--world-size)" },
  { .name = "malformed-world-flag",
    .flags = { NULL, "many", NULL },
    .error = "--world-size: \"many\"" },
  { .name = "torchrun-no-master",
    .env = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0" },
    .error = "MASTER_ADDR and MASTER_PORT: MASTER_ADDR unset" },
  { .name = "torchrun-bad-port",
    .env = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=h",
             "MASTER_PORT=70000" },
    .error = "MASTER_PORT: \"70000\" is not a port" },
  { .name = "init-unknown",
    .flags = { NULL, NULL, "gloo" },
    .error = "--init: \"gloo\"" },
  { .name = "init-no-port",
    .flags = { NULL, NULL, "tcp://host" },
    .error = "--init: \"tcp://host\"" },
  /* The rendezvous's parser: what launch accepts, it can use. */
  { .name = "init-bad-bracket",
    .flags = { NULL, NULL, "tcp://[::1:29500" },
    .error = "--init: \"tcp://[::1:29500\" is not tcp://HOST:PORT" },
  { .name = "init-ipv6",
    .flags = { "1", "2", "tcp://[::1]:29500" },
    .rank = 1,
    .world = 2,
    .local = 1,
    .source = STOW_LAUNCH_FLAGS,
    .init = "tcp://[::1]:29500" },
  { .name = "torchrun-ipv6",
    .env = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=fe80::1",
             "MASTER_PORT=29500" },
    .rank = 1,
    .world = 2,
    .local = 1,
    .source = STOW_LAUNCH_TORCHRUN,
    .init = "tcp://[fe80::1]:29500" },
  { .name = "torchrun-bad-addr",
    .env = { "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=a b",
             "MASTER_PORT=29500" },
    .error = "MASTER_ADDR: \"a b\" is not a host name or address" },
};

static void
test_case (gconstpointer data)
{
  const Case *c = data;
  g_autoptr (GError) error = NULL;
  StowLaunch l;
  gboolean ok = stow_launch_resolve (c->env, &c->flags, &l, &error);
  if (c->error != NULL)
    {
      g_assert_false (ok);
      g_assert_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID);
      g_test_message ("%s", error->message);
      g_assert_nonnull (strstr (error->message, c->error));
      return;
    }
  g_assert_no_error (error);
  g_assert_true (ok);
  g_assert_cmpint (l.rank, ==, c->rank);
  g_assert_cmpint (l.world_size, ==, c->world);
  g_assert_cmpint (l.local_rank, ==, c->local);
  g_assert_cmpstr (stow_launch_source_name (l.source), ==,
                   stow_launch_source_name (c->source));
  g_assert_cmpstr (l.init, ==, c->init);
  stow_launch_clear (&l);
  g_assert_null (l.init);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path
          = g_strdup_printf ("/comm-launch/%s", cases[i].name);
      g_test_add_data_func (path, &cases[i], test_case);
    }
  return g_test_run ();
}
