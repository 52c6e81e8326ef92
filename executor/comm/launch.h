/* SPDX-License-Identifier: MIT
 *
 * executor/comm/launch.h: which rank this process is, of how many, and
 * how the ranks meet, from the launcher's environment (mpirun, torchrun,
 * Slurm's srun) and the explicit flags over it.  Pure: no MPI, no network;
 * the transports (mpi.h, nccl.h) take what this decides.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_LAUNCH_ERROR (stow_launch_error_quark ())
GQuark stow_launch_error_quark (void);

typedef enum
{
  STOW_LAUNCH_ERROR_INVALID, /* a malformed or conflicting value */
} StowLaunchErrorCode;

typedef enum
{
  STOW_LAUNCH_NONE = 0, /* no launcher: one rank */
  STOW_LAUNCH_MPIRUN,   /* OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} */
  STOW_LAUNCH_TORCHRUN, /* RANK, WORLD_SIZE, LOCAL_RANK, MASTER_{ADDR,PORT} */
  STOW_LAUNCH_SLURM,    /* SLURM_{PROCID,NTASKS,LOCALID} */
  STOW_LAUNCH_FLAGS,    /* --rank and --world-size alone */
} StowLaunchSource;

/* Explicit flags, each NULL when not given (the strings as typed). */
typedef struct
{
  const char *rank;       /* --rank */
  const char *world_size; /* --world-size */
  const char *init;       /* --init */
} StowLaunchFlags;

typedef struct
{
  int rank, world_size, local_rank;
  StowLaunchSource source; /* where rank and world size came from */
  /* How the ranks meet: "none" (one rank), "mpi" (MPI_Init: mpirun, srun
   * with PMIx) or "tcp://HOST:PORT" (torchrun's MASTER_ADDR and
   * MASTER_PORT: rank 0 listens there and hands out the NCCL id,
   * rendezvous.h; an IPv6 MASTER_ADDR is written in brackets). */
  char *init;
} StowLaunch;

/* Fills @out from @envp (g_get_environ's form; NULL: no variables) and
 * @flags (NULL: none).  The launcher whose variables are nearest to the
 * process wins: mpirun's, then torchrun's, then Slurm's (mpirun and
 * torchrun run inside Slurm allocations whose SLURM_PROCID is the
 * allocation's, not the rank's); --rank, --world-size and --init override
 * each value they give.  Without a launcher, the local rank is the rank
 * (one node).  Refused with STOW_LAUNCH_ERROR_INVALID, naming the variable
 * or flag and its value: a value that is not a decimal integer in range
 * (ranks >= 0, world size >= 1), a launcher's variables only partly set, a
 * rank or local rank not below the world size, a --rank without a world
 * size above it, torchrun's world above 1 without MASTER_ADDR and
 * MASTER_PORT or with a MASTER_ADDR that is no host, an --init other
 * than mpi, env or tcp://HOST:PORT as stow_rendezvous_parse_init reads it
 * (env: torchrun's MASTER_ADDR and MASTER_PORT).  Free with
 * stow_launch_clear. */
gboolean stow_launch_resolve (const char *const *envp,
                              const StowLaunchFlags *flags, StowLaunch *out,
                              GError **error);
void stow_launch_clear (StowLaunch *l);

/* "mpirun", "torchrun", "slurm", "flags" or "none". */
const char *stow_launch_source_name (StowLaunchSource s);

G_END_DECLS
