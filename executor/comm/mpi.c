/* SPDX-License-Identifier: MIT
 *
 * executor/comm/mpi.c: comm.h over MPI.  One thread per communicator runs
 * the queued collectives in order with blocking MPI calls (the comm
 * stream); the deterministic reductions send each partition to its owner,
 * who adds the contributions in rank order (comm.c), then all-gather.
 * MPI's types stay in this file (docs/ARCHITECTURE.md).
 */
#include "config.h"

#include "executor/comm/mpi.h"

#include <string.h>
#include <unistd.h>

#include "executor/comm/comm-private.h"

#if STOW_HAVE_MPI
#include <mpi.h>

typedef struct
{
  StowComm base;
  MPI_Comm comm;
  MPI_Op bf16_sum;
  GThread *thread;
  GAsyncQueue *queue;
  gboolean finalize; /* MPI was initialised here */
  /* The worker's, kept between operations: the padded send of an
   * exchange or a native reduce-scatter, the contributions received, and
   * an accumulating operation's own result (an all-gather's staging
   * too). */
  StowScratch pad, in, mine;
} MpiComm;

typedef struct
{
  GMutex lock;
  GCond cond;
  gboolean done;
  char *error; /* NULL on success */
} MpiDone;

static char quit_marker;

/* NATIVE bf16 sums: MPI has no bf16; 16-bit words with this op
 * (inout + in: addition commutes, so the bits are in + inout's). */
static void
bf16_sum_fn (void *in, void *inout, int *len, MPI_Datatype *type)
{
  stow_comm_add_bf16 (inout, in, (guint64)*len);
}

static char *
mpi_message (const char *what, int rc)
{
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string (rc, text, &len) != MPI_SUCCESS)
    g_snprintf (text, sizeof text, "error %d", rc);
  return g_strdup_printf ("MPI: %s: %s", what, text);
}

static MPI_Datatype
element_type (StowDtype d)
{
  return d == STOW_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

/* The elements of partition @q that lie inside @count (the rest is
 * padding). */
static guint64
valid_len (const StowCommRequest *r, int q)
{
  guint64 start = (guint64)q * r->part;
  return start >= r->count ? 0 : MIN (r->part, r->count - start);
}

/* Every rank sends its partition q of @send to rank q (zeros past
 * @count); this rank's N contributions arrive in @in (N x part elements,
 * rank order), its own among them. */
static char *
exchange (MpiComm *m, const StowCommRequest *r, const void *send, guint8 *in)
{
  int n = m->base.world, me = m->base.rank;
  guint es = stow_dtype_size (r->dtype);
  guint64 part = r->part, pb = part * es;
  guint8 *padded = part * (guint64)n == r->count
                       ? NULL
                       : stow_scratch_get (&m->pad, pb * (guint64)n);
  g_autofree MPI_Request *reqs = g_new (MPI_Request, 2 * (guint)n);
  int nreq = 0;
  for (int q = 0; q < n; q++)
    {
      const guint8 *block = (const guint8 *)send + (guint64)q * pb;
      if (valid_len (r, q) < part)
        {
          block = stow_comm_pad_copy (padded + (guint64)q * pb, block,
                                      valid_len (r, q) * es, pb);
        }
      if (q == me)
        {
          memcpy (in + (guint64)q * pb, block, pb);
          continue;
        }
      int rc
          = MPI_Irecv (in + (guint64)q * pb, (int)part, element_type (r->dtype),
                       q, 0, m->comm, &reqs[nreq++]);
      if (rc == MPI_SUCCESS)
        rc = MPI_Isend (block, (int)part, element_type (r->dtype), q, 0,
                        m->comm, &reqs[nreq++]);
      if (rc != MPI_SUCCESS)
        return mpi_message ("partition exchange", rc);
    }
  int rc = MPI_Waitall (nreq, reqs, MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS ? NULL : mpi_message ("partition exchange", rc);
}

/* Rank q receives the N contributions to its partition and sums them in
 * rank order into @recv (part elements, padding included, as zeros),
 * after what @recv holds when accumulating. */
static char *
reduce_scatter_det (MpiComm *m, const StowCommRequest *r, const void *send,
                    void *recv)
{
  int n = m->base.world;
  guint64 pb = r->part * stow_dtype_size (r->dtype);
  guint8 *in = stow_scratch_get (&m->in, pb * (guint64)n);
  char *e = exchange (m, r, send, in);
  if (e != NULL)
    return e;
  guint acc = r->accumulate ? 1 : 0;
  g_autofree const void **contrib = g_new (const void *, (guint)n + acc);
  if (acc)
    contrib[0] = recv;
  for (int q = 0; q < n; q++)
    contrib[q + acc] = in + (guint64)q * pb;
  stow_comm_sum_rank_order (recv, contrib, (guint)n + acc, r->part, r->dtype);
  return NULL;
}

static char *
all_gather_det (MpiComm *m, const StowCommRequest *r, const void *send,
                void *recv)
{
  int n = m->base.world, me = m->base.rank;
  guint es = stow_dtype_size (r->dtype);
  g_autofree MPI_Request *reqs = g_new (MPI_Request, 2 * (guint)n);
  int nreq = 0;
  /* Only the valid prefix of each partition travels. */
  guint64 mine = valid_len (r, me);
  for (int q = 0; q < n; q++)
    {
      guint64 len = valid_len (r, q);
      if (q == me)
        continue;
      int rc = MPI_SUCCESS;
      if (len > 0)
        rc = MPI_Irecv ((guint8 *)recv + (guint64)q * r->part * es, (int)len,
                        element_type (r->dtype), q, 1, m->comm, &reqs[nreq++]);
      if (rc == MPI_SUCCESS && mine > 0)
        rc = MPI_Isend (send, (int)mine, element_type (r->dtype), q, 1, m->comm,
                        &reqs[nreq++]);
      if (rc != MPI_SUCCESS)
        return mpi_message ("all-gather", rc);
    }
  memmove ((guint8 *)recv + (guint64)me * r->part * es, send, mine * es);
  int rc = MPI_Waitall (nreq, reqs, MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS ? NULL : mpi_message ("all-gather", rc);
}

static char *
run_native (MpiComm *m, const StowCommRequest *r)
{
  int n = m->base.world;
  guint es = stow_dtype_size (r->dtype);
  MPI_Datatype t = element_type (r->dtype);
  MPI_Op sum = r->dtype == STOW_DTYPE_F32 ? MPI_SUM : m->bf16_sum;
  guint64 padded = r->part * (guint64)n;
  int rc;
  switch (r->op)
    {
    case STOW_COMM_OP_ALL_REDUCE:
      rc = MPI_Allreduce (MPI_IN_PLACE, r->recv, (int)r->count, t, sum,
                          m->comm);
      return rc == MPI_SUCCESS ? NULL : mpi_message ("all-reduce", rc);
    case STOW_COMM_OP_REDUCE_SCATTER:
      {
        const void *send = r->send;
        if (padded != r->count)
          {
            send = stow_comm_pad_copy (stow_scratch_get (&m->pad, padded * es),
                                       r->send, r->count * es, padded * es);
          }
        guint8 *mine
            = r->accumulate ? stow_scratch_get (&m->mine, r->part * es) : NULL;
        rc = MPI_Reduce_scatter_block (send, mine ? mine : r->recv,
                                       (int)r->part, t, sum, m->comm);
        if (rc == MPI_SUCCESS && mine)
          {
            const void *two[2] = { r->recv, mine };
            stow_comm_sum_rank_order (r->recv, two, 2, r->part, r->dtype);
          }
        return rc == MPI_SUCCESS ? NULL : mpi_message ("reduce-scatter", rc);
      }
    case STOW_COMM_OP_ALL_GATHER:
      {
        guint8 *staging = NULL;
        void *recv = r->recv;
        if (padded != r->count)
          recv = staging = stow_scratch_get (&m->mine, padded * es);
        rc = MPI_Allgather (r->send, (int)r->part, t, recv, (int)r->part, t,
                            m->comm);
        if (rc == MPI_SUCCESS && staging != NULL)
          memcpy (r->recv, staging, r->count * es);
        return rc == MPI_SUCCESS ? NULL : mpi_message ("all-gather", rc);
      }
    default:
      g_assert_not_reached ();
    }
}

static char *
run (MpiComm *m, const StowCommRequest *r)
{
  int rc;
  switch (r->op)
    {
    case STOW_COMM_OP_BARRIER:
      rc = MPI_Barrier (m->comm);
      return rc == MPI_SUCCESS ? NULL : mpi_message ("barrier", rc);
    case STOW_COMM_OP_BROADCAST:
      rc = MPI_Bcast (r->recv, (int)r->count, element_type (r->dtype), r->root,
                      m->comm);
      return rc == MPI_SUCCESS ? NULL : mpi_message ("broadcast", rc);
    case STOW_COMM_OP_ALL_TO_ALL:
      return exchange (m, r, r->send, r->recv);
    default:
      break;
    }
  if (r->mode == STOW_COMM_NATIVE)
    return run_native (m, r);
  switch (r->op)
    {
    case STOW_COMM_OP_REDUCE_SCATTER:
      return reduce_scatter_det (m, r, r->send, r->recv);
    case STOW_COMM_OP_ALL_GATHER:
      return all_gather_det (m, r, r->send, r->recv);
    case STOW_COMM_OP_ALL_REDUCE:
      {
        void *mine
            = stow_scratch_get (&m->mine, r->part * stow_dtype_size (r->dtype));
        char *e = reduce_scatter_det (m, r, r->recv, mine);
        return e != NULL ? e : all_gather_det (m, r, mine, r->recv);
      }
    default:
      g_assert_not_reached ();
    }
}

static gpointer
worker (gpointer data)
{
  MpiComm *m = data;
  for (;;)
    {
      StowCommRequest *r = g_async_queue_pop (m->queue);
      if ((gpointer)r == (gpointer)&quit_marker)
        return NULL;
      MpiDone *d = r->transport;
      char *e = run (m, r);
      g_mutex_lock (&d->lock);
      d->error = e;
      d->done = TRUE;
      g_cond_signal (&d->cond);
      g_mutex_unlock (&d->lock);
    }
}

static gboolean
mpi_start (StowComm *c, StowCommRequest *r, GError **error)
{
  MpiComm *m = (MpiComm *)c;
  MpiDone *d = g_new0 (MpiDone, 1);
  g_mutex_init (&d->lock);
  g_cond_init (&d->cond);
  r->transport = d;
  g_async_queue_push (m->queue, r);
  return TRUE;
}

static gboolean
mpi_wait (StowComm *c, StowCommRequest *r, GError **error)
{
  MpiDone *d = r->transport;
  g_mutex_lock (&d->lock);
  while (!d->done)
    g_cond_wait (&d->cond, &d->lock);
  g_mutex_unlock (&d->lock);
  gboolean ok = d->error == NULL;
  if (!ok)
    g_set_error_literal (error, STOW_COMM_ERROR, STOW_COMM_ERROR_FAILED,
                         d->error);
  g_free (d->error);
  g_mutex_clear (&d->lock);
  g_cond_clear (&d->cond);
  g_free (d);
  r->transport = NULL;
  return ok;
}

static void
mpi_free (StowComm *c)
{
  MpiComm *m = (MpiComm *)c;
  g_async_queue_push (m->queue, &quit_marker);
  g_thread_join (m->thread);
  g_async_queue_unref (m->queue);
  MPI_Op_free (&m->bf16_sum);
  MPI_Comm_free (&m->comm);
  if (m->finalize)
    MPI_Finalize ();
  stow_scratch_clear (&m->pad);
  stow_scratch_clear (&m->in);
  stow_scratch_clear (&m->mine);
  g_free (m);
}

static const StowCommClass mpi_class = {
  .name = "mpi",
  /* MPI counts are int: every count and partition fits one call. */
  .max_count = G_MAXINT,
  .start = mpi_start,
  .wait = mpi_wait,
  .free = mpi_free,
};

gboolean
stow_comm_mpi_available (void)
{
  return TRUE;
}

StowComm *
stow_comm_mpi_new (GError **error)
{
  int inited = 0, provided = 0, rc;
  MPI_Initialized (&inited);
  if (!inited)
    {
      rc = MPI_Init_thread (NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS)
        {
          g_autofree char *msg = mpi_message ("MPI_Init_thread", rc);
          g_set_error_literal (error, STOW_COMM_ERROR, STOW_COMM_ERROR_FAILED,
                               msg);
          return NULL;
        }
    }
  else
    MPI_Query_thread (&provided);
  if (provided < MPI_THREAD_SERIALIZED)
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_UNAVAILABLE,
                   "MPI: thread level %d, below MPI_THREAD_SERIALIZED (%d)",
                   provided, MPI_THREAD_SERIALIZED);
      if (!inited)
        MPI_Finalize ();
      return NULL;
    }
  MpiComm *m = g_new0 (MpiComm, 1);
  m->base.klass = &mpi_class;
  m->base.mode = STOW_COMM_DETERMINISTIC;
  m->finalize = !inited;
  MPI_Comm_dup (MPI_COMM_WORLD, &m->comm);
  /* Errors come back as codes (and GErrors), never abort from inside. */
  MPI_Comm_set_errhandler (m->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank (m->comm, &m->base.rank);
  MPI_Comm_size (m->comm, &m->base.world);
  MPI_Op_create (bf16_sum_fn, 1, &m->bf16_sum);
  m->queue = g_async_queue_new ();
  m->thread = g_thread_new ("stow-comm-mpi", worker, m);
  return &m->base;
}

void
stow_comm_mpi_abort (int code)
{
  MPI_Abort (MPI_COMM_WORLD, code);
  _exit (code); /* MPI_Abort returns only when it could not abort */
}

#else /* !STOW_HAVE_MPI */

gboolean
stow_comm_mpi_available (void)
{
  return FALSE;
}

StowComm *
stow_comm_mpi_new (GError **error)
{
  g_set_error_literal (error, STOW_COMM_ERROR, STOW_COMM_ERROR_UNAVAILABLE,
                       "MPI: this stowage was built without it (meson "
                       "-Dmpi=enabled, libopenmpi-dev)");
  return NULL;
}

void
stow_comm_mpi_abort (int code)
{
  _exit (code);
}

#endif
