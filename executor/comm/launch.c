/* SPDX-License-Identifier: MIT
 *
 * executor/comm/launch.c: rank, world size, local rank and rendezvous from
 * the launchers' environment variables and the explicit flags (launch.h
 * has the rules).  Every refusal names the variable and its value.
 */
#include "executor/comm/launch.h"

#include "executor/comm/rendezvous.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* clang-format off */
G_DEFINE_QUARK (stow-launch-error-quark, stow_launch_error)
/* clang-format on */

typedef struct
{
  StowLaunchSource source;
  const char *rank, *size, *local; /* variable names */
} Launcher;

/* Nearest first (launch.h). */
static const Launcher launchers[] = {
  { STOW_LAUNCH_MPIRUN, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK" },
  { STOW_LAUNCH_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK" },
  { STOW_LAUNCH_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" },
};

const char *
stow_launch_source_name (StowLaunchSource s)
{
  static const char *const names[] = {
    [STOW_LAUNCH_NONE] = "none",         [STOW_LAUNCH_MPIRUN] = "mpirun",
    [STOW_LAUNCH_TORCHRUN] = "torchrun", [STOW_LAUNCH_SLURM] = "slurm",
    [STOW_LAUNCH_FLAGS] = "flags",
  };
  return (guint)s < G_N_ELEMENTS (names) ? names[s] : "?";
}

/* A decimal integer in [min, G_MAXINT]; @what names it in the error. */
static gboolean
parse_int (const char *what, const char *s, int min, int *out, GError **error)
{
  char *end = NULL;
  errno = 0;
  gint64 v = s[0] >= '0' && s[0] <= '9' ? g_ascii_strtoll (s, &end, 10) : -1;
  if (end == NULL || *end != '\0' || errno != 0 || v < min || v > G_MAXINT)
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "%s: \"%s\" is not an integer >= %d", what, s, min);
      return FALSE;
    }
  *out = (int)v;
  return TRUE;
}

/* The rendezvous's own parser (rendezvous.h), so that what launch
 * accepts the rendezvous can use. */
static gboolean
check_tcp (const char *what, const char *url, GError **error)
{
  g_autoptr (GError) e = NULL;
  if (stow_rendezvous_parse_init (url, NULL, NULL, &e))
    return TRUE;
  g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID, "%s: %s",
               what, e->message);
  return FALSE;
}

/* torchrun's rendezvous, or NULL with an error naming what is missing. */
static char *
torchrun_init (const char *const *envp, GError **error)
{
  const char *addr = g_environ_getenv ((char **)envp, "MASTER_ADDR");
  const char *port = g_environ_getenv ((char **)envp, "MASTER_PORT");
  if (addr == NULL || *addr == '\0' || port == NULL)
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "MASTER_ADDR and MASTER_PORT: %s unset (torchrun's "
                   "rendezvous, needed above one rank)",
                   addr == NULL || *addr == '\0' ? "MASTER_ADDR"
                                                 : "MASTER_PORT");
      return NULL;
    }
  int p = 0;
  if (!parse_int ("MASTER_PORT", port, 1, &p, NULL) || p > 65535)
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "MASTER_PORT: \"%s\" is not a port (1-65535)", port);
      return NULL;
    }
  /* An IPv6 address in brackets (tcp://[fe80::1]:29500), as URLs write
   * it; a name that is no host refused here, naming the variable. */
  g_autofree char *init = strchr (addr, ':') && addr[0] != '['
                              ? g_strdup_printf ("tcp://[%s]:%d", addr, p)
                              : g_strdup_printf ("tcp://%s:%d", addr, p);
  if (!stow_rendezvous_parse_init (init, NULL, NULL, NULL))
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "MASTER_ADDR: \"%s\" is not a host name or address", addr);
      return NULL;
    }
  return g_steal_pointer (&init);
}

gboolean
stow_launch_resolve (const char *const *envp, const StowLaunchFlags *flags,
                     StowLaunch *out, GError **error)
{
  static const StowLaunchFlags none = { 0 };
  flags = flags ? flags : &none;
  *out = (StowLaunch){ .world_size = 1, .source = STOW_LAUNCH_NONE };
  const Launcher *from = NULL;
  for (guint i = 0; i < G_N_ELEMENTS (launchers) && from == NULL; i++)
    {
      const Launcher *l = &launchers[i];
      const char *names[] = { l->rank, l->size, l->local };
      guint set = 0;
      for (guint k = 0; k < 3; k++)
        set += g_environ_getenv ((char **)envp, names[k]) != NULL;
      if (set == 0)
        continue;
      if (set < 3)
        {
          for (guint k = 0; k < 3; k++)
            if (g_environ_getenv ((char **)envp, names[k]) == NULL)
              {
                g_set_error (error, STOW_LAUNCH_ERROR,
                             STOW_LAUNCH_ERROR_INVALID,
                             "%s: unset beside %s (%s's variables are set "
                             "only in part)",
                             names[k], names[(k + 1) % 3],
                             stow_launch_source_name (l->source));
                return FALSE;
              }
        }
      if (!parse_int (l->rank, g_environ_getenv ((char **)envp, l->rank), 0,
                      &out->rank, error)
          || !parse_int (l->size, g_environ_getenv ((char **)envp, l->size), 1,
                         &out->world_size, error)
          || !parse_int (l->local, g_environ_getenv ((char **)envp, l->local),
                         0, &out->local_rank, error))
        return FALSE;
      from = l;
      out->source = l->source;
    }
  const char *rank_name = from ? from->rank : "--rank";
  const char *size_name = from ? from->size : "--world-size";
  if (flags->world_size != NULL)
    {
      if (!parse_int ("--world-size", flags->world_size, 1, &out->world_size,
                      error))
        return FALSE;
      size_name = "--world-size";
    }
  if (flags->rank != NULL)
    {
      if (!parse_int ("--rank", flags->rank, 0, &out->rank, error))
        return FALSE;
      rank_name = "--rank";
      if (from == NULL)
        out->local_rank = out->rank;
    }
  if (from == NULL && (flags->rank != NULL || flags->world_size != NULL))
    out->source = STOW_LAUNCH_FLAGS;
  if (out->rank >= out->world_size)
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "%s: rank %d not below the world size %d (%s)", rank_name,
                   out->rank, out->world_size, size_name);
      return FALSE;
    }
  if (out->local_rank >= out->world_size)
    {
      g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                   "%s: local rank %d not below the world size %d (%s)",
                   from ? from->local : "--rank", out->local_rank,
                   out->world_size, size_name);
      return FALSE;
    }
  if (flags->init != NULL)
    {
      if (g_str_equal (flags->init, "mpi"))
        out->init = g_strdup ("mpi");
      else if (g_str_equal (flags->init, "env"))
        {
          out->init = torchrun_init (envp, error);
          if (out->init == NULL)
            {
              g_prefix_error (error, "--init env: ");
              return FALSE;
            }
        }
      else if (g_str_has_prefix (flags->init, "tcp://"))
        {
          if (!check_tcp ("--init", flags->init, error))
            return FALSE;
          out->init = g_strdup (flags->init);
        }
      else
        {
          g_set_error (error, STOW_LAUNCH_ERROR, STOW_LAUNCH_ERROR_INVALID,
                       "--init: \"%s\" is not mpi, env or tcp://HOST:PORT",
                       flags->init);
          return FALSE;
        }
    }
  else if (out->world_size == 1)
    out->init = g_strdup ("none");
  else if (out->source == STOW_LAUNCH_TORCHRUN)
    {
      out->init = torchrun_init (envp, error);
      if (out->init == NULL)
        return FALSE;
    }
  else
    out->init = g_strdup ("mpi");
  return TRUE;
}

void
stow_launch_clear (StowLaunch *l)
{
  g_clear_pointer (&l->init, g_free);
}
