/* SPDX-License-Identifier: MIT
 *
 * executor/comm/comm-private.h: what a transport (mpi.c, nccl.c)
 * implements behind comm.h: a class of three functions and the request it
 * is handed.  comm.c checks the arguments before a transport sees them.
 */
#pragma once

#include "executor/comm/comm.h"

G_BEGIN_DECLS

typedef enum
{
  STOW_COMM_OP_ALL_REDUCE,
  STOW_COMM_OP_REDUCE_SCATTER,
  STOW_COMM_OP_ALL_GATHER,
  STOW_COMM_OP_BROADCAST,
  STOW_COMM_OP_BARRIER,
  STOW_COMM_OP_ALL_TO_ALL,
} StowCommOp;

struct _StowCommRequest
{
  StowCommOp op;
  StowCommMode mode; /* the communicator's when started */
  const void *send;  /* == recv for the in-place ones */
  void *recv;
  guint64 count;       /* elements of the whole (unpartitioned) buffer */
  guint64 part;        /* stow_comm_partition_numel (count, N, align) */
  gboolean accumulate; /* reduce-scatter: recv's elements are added to */
  StowDtype dtype;
  int root;
  gpointer transport; /* the transport's own state for this request */
};

typedef struct
{
  const char *name;
  /* The largest count a collective takes (0: no limit). */
  guint64 max_count;
  /* Queue @r; FALSE (nothing queued) with a GError. */
  gboolean (*start) (StowComm *c, StowCommRequest *r, GError **error);
  /* Block until @r is done; release r->transport. */
  gboolean (*wait) (StowComm *c, StowCommRequest *r, GError **error);
  /* Drain and release everything. */
  void (*free) (StowComm *c);
} StowCommClass;

struct _StowComm
{
  const StowCommClass *klass;
  int rank, world;
  StowCommMode mode;
};

G_END_DECLS
