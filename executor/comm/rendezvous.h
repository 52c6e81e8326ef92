/* SPDX-License-Identifier: MIT
 *
 * executor/comm/rendezvous.h: how ranks launched with --init
 * tcp://HOST:PORT (torchrun's MASTER_ADDR and MASTER_PORT) meet: rank 0
 * listens, the others connect; rank 0 broadcasts a small blob (NCCL's
 * unique id), a barrier, and the sockets close.  Not a transport: the
 * collectives run over NCCL or MPI (comm.h); this only hands out their id.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_RENDEZVOUS_ERROR (stow_rendezvous_error_quark ())
GQuark stow_rendezvous_error_quark (void);

typedef enum
{
  STOW_RENDEZVOUS_ERROR_INVALID, /* a bad init string, rank or size */
  STOW_RENDEZVOUS_ERROR_TIMEOUT, /* a rank did not come (or answer) in time */
  STOW_RENDEZVOUS_ERROR_REFUSED, /* another job, world size or program */
  STOW_RENDEZVOUS_ERROR_FAILED,  /* a socket error, a rank that left */
} StowRendezvousErrorCode;

/* The largest blob stow_rendezvous_broadcast carries (an ncclUniqueId is
 * 128 bytes). */
#define STOW_RENDEZVOUS_MAX_BLOB_BYTES 4096

/* torch.distributed's TCPStore waits 300 s by default (its `timeout`). */
#define STOW_RENDEZVOUS_DEFAULT_TIMEOUT_S 300.0

typedef struct _StowRendezvous StowRendezvous;

/* Splits "tcp://HOST:PORT" (HOST a name, an IPv4 address, or an IPv6
 * address with or without brackets: tcp://[::1]:29500, tcp://::1:29500)
 * into @host (newly allocated, brackets removed) and @port.  FALSE with
 * STOW_RENDEZVOUS_ERROR_INVALID naming the string otherwise.  Either out
 * pointer may be NULL. */
gboolean stow_rendezvous_parse_init (const char *init, char **host,
                                     guint16 *port, GError **error);

/* Rank @rank of @world meets the others at @init ("tcp://HOST:PORT").
 *
 * Rank 0 listens on PORT on every address of this host (IPv6 and IPv4, as
 * torchrun's TCPStore does: MASTER_ADDR may name this host by an address
 * it cannot bind, Debian's 127.0.1.1), with SO_REUSEADDR, and returns once
 * every other rank has joined; the others resolve HOST and connect,
 * retrying until rank 0 listens, and return once rank 0 has accepted
 * them.  Each rank announces a magic, the protocol's version, its world
 * size and its rank; rank 0 refuses, by name, a peer of another program,
 * version or world size, a rank out of range and a rank that already
 * joined, and keeps waiting for its own ranks (so that a second job on the
 * same port does not end the first).  One rank (@world 1) opens no socket.
 *
 * Every wait is bounded by @timeout_s (> 0), counted from this call.
 * NULL and an error naming @init otherwise: _INVALID for a bad @init,
 * @rank or @world; _TIMEOUT naming the ranks that did not join within the
 * time waited (rank 0, and the ranks it had accepted, which it tells
 * before closing), or rank 0 when it was not reachable; _REFUSED with rank
 * 0's reason, or when what answers at HOST:PORT is not a stowage
 * rendezvous; _FAILED when PORT is in use on rank 0, HOST does not
 * resolve, or a rank left after joining (rank 0 then tells the others
 * which). */
StowRendezvous *stow_rendezvous_new (const char *init, int rank, int world,
                                     double timeout_s, GError **error);

int stow_rendezvous_rank (const StowRendezvous *r);
int stow_rendezvous_world_size (const StowRendezvous *r);

/* @buf (@size bytes, at most STOW_RENDEZVOUS_MAX_BLOB_BYTES) on every rank
 * becomes rank 0's.  Every rank passes the same @size; a rank given
 * another size fails naming both.  Waits at most the timeout beyond the
 * time rank 0 still waited for the others when it accepted this rank.
 * FALSE with _TIMEOUT, _FAILED (a rank left; rank 0 names it to the
 * others) or _REFUSED (rank 0 stopped the rendezvous: its reason). */
gboolean stow_rendezvous_broadcast (StowRendezvous *r, void *buf, gsize size,
                                    GError **error);

/* Returns once every rank has entered its barrier; waits at most the
 * timeout (after the time rank 0 announced, as above, when nothing came
 * from rank 0 yet).  Errors as for the broadcast, naming the ranks that
 * did not come. */
gboolean stow_rendezvous_barrier (StowRendezvous *r, GError **error);

/* This rank cannot go on: rank 0 tells every other rank @reason (and why
 * it stops) at once; another rank tells rank 0, which tells the others at
 * its next wait.  Best effort, bounded by the timeout; the rendezvous
 * refuses every later call. */
void stow_rendezvous_abort (StowRendezvous *r, const char *reason);

/* Closes the sockets. */
void stow_rendezvous_free (StowRendezvous *r);

/* What a transport's bootstrap does on every rank: meet at @init; once
 * all have joined (a barrier), @prepare (may be NULL) checks this rank
 * and, on rank 0, fills @blob (@size bytes); a second barrier; rank 0's
 * @blob to every rank; close.  A rank whose @prepare fails aborts the
 * rendezvous with its message, so that every other rank fails at once
 * naming it ("rank 2 failed: ...") instead of waiting.  On success @blob
 * holds rank 0's bytes everywhere and every rank's @prepare succeeded. */
typedef gboolean (*StowRendezvousPrepare) (int rank, void *blob, gsize size,
                                           gpointer data, GError **error);
gboolean stow_rendezvous_exchange (const char *init, int rank, int world,
                                   double timeout_s,
                                   StowRendezvousPrepare prepare, gpointer data,
                                   void *blob, gsize size, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowRendezvous, stow_rendezvous_free)

G_END_DECLS
