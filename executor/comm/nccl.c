/* SPDX-License-Identifier: MIT
 *
 * executor/comm/nccl.c: comm.h over NCCL, loaded with dlopen on first use
 * (as backends/cuda/cublas-dl.cu loads cuBLAS): the entry points are
 * declared here from nccl.h's ABI, so neither the header nor the library
 * is needed to build.  Each collective is queued on the comm's CUDA stream
 * and followed by an event the wait synchronises on.  Deterministic
 * reductions: partitions to their owners (ncclSend/ncclRecv), the sum in
 * rank order (nccl-sum.cu), then an all-gather.
 */
#include "executor/comm/nccl.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <string.h>

#include "executor/comm/comm-private.h"
#include "executor/comm/nccl-private.h"
#include "executor/comm/rendezvous.h"
#include "executor/dl.h"

/* nccl.h's ABI (stable since NCCL 2.0; send/recv since 2.7). */
typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef struct
{
  char internal[STOW_COMM_NCCL_ID_BYTES];
} ncclUniqueId;
enum
{
  NCCL_SUM = 0,
  NCCL_FLOAT32 = 7,
  NCCL_BFLOAT16 = 9,
};

typedef struct
{
  ncclResult_t (*get_version) (int *);
  ncclResult_t (*get_unique_id) (ncclUniqueId *);
  ncclResult_t (*comm_init_rank) (ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy) (ncclComm_t);
  ncclResult_t (*comm_abort) (ncclComm_t);
  ncclResult_t (*comm_get_async_error) (ncclComm_t, ncclResult_t *);
  const char *(*error_string) (ncclResult_t);
  ncclResult_t (*all_reduce) (const void *, void *, size_t, int, int,
                              ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter) (const void *, void *, size_t, int, int,
                                  ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather) (const void *, void *, size_t, int, ncclComm_t,
                              cudaStream_t);
  ncclResult_t (*broadcast) (const void *, void *, size_t, int, int, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*send) (const void *, size_t, int, int, ncclComm_t,
                        cudaStream_t);
  ncclResult_t (*recv) (void *, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start) (void);
  ncclResult_t (*group_end) (void);
} NcclFns;

static StowDlOnce nccl_once;
static NcclFns nccl;

static gboolean
load_locked (GError **error)
{
  const char *names[] = {
    "libnccl.so.2",
    "libnccl.so",
#ifdef STOW_CUDA_LIBDIR
    STOW_CUDA_LIBDIR "/libnccl.so.2",
#endif
  };
  void *lib
      = stow_dlopen_first (names, G_N_ELEMENTS (names), "NCCL", STOW_COMM_ERROR,
                           STOW_COMM_ERROR_UNAVAILABLE, error);
  if (lib == NULL)
    return FALSE;
  static const struct
  {
    const char *name;
    gsize offset;
  } syms[] = {
    { "ncclGetVersion", G_STRUCT_OFFSET (NcclFns, get_version) },
    { "ncclGetUniqueId", G_STRUCT_OFFSET (NcclFns, get_unique_id) },
    { "ncclCommInitRank", G_STRUCT_OFFSET (NcclFns, comm_init_rank) },
    { "ncclCommDestroy", G_STRUCT_OFFSET (NcclFns, comm_destroy) },
    { "ncclCommAbort", G_STRUCT_OFFSET (NcclFns, comm_abort) },
    { "ncclCommGetAsyncError",
      G_STRUCT_OFFSET (NcclFns, comm_get_async_error) },
    { "ncclGetErrorString", G_STRUCT_OFFSET (NcclFns, error_string) },
    { "ncclAllReduce", G_STRUCT_OFFSET (NcclFns, all_reduce) },
    { "ncclReduceScatter", G_STRUCT_OFFSET (NcclFns, reduce_scatter) },
    { "ncclAllGather", G_STRUCT_OFFSET (NcclFns, all_gather) },
    { "ncclBroadcast", G_STRUCT_OFFSET (NcclFns, broadcast) },
    { "ncclSend", G_STRUCT_OFFSET (NcclFns, send) },
    { "ncclRecv", G_STRUCT_OFFSET (NcclFns, recv) },
    { "ncclGroupStart", G_STRUCT_OFFSET (NcclFns, group_start) },
    { "ncclGroupEnd", G_STRUCT_OFFSET (NcclFns, group_end) },
  };
  NcclFns f;
  for (guint i = 0; i < G_N_ELEMENTS (syms); i++)
    {
      void *p = dlsym (lib, syms[i].name);
      if (p == NULL)
        {
          g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_UNAVAILABLE,
                       "NCCL: symbol %s not found (%s)", syms[i].name,
                       dlerror ());
          dlclose (lib);
          return FALSE;
        }
      memcpy ((char *)&f + syms[i].offset, &p, sizeof p);
    }
  nccl = f;
  return TRUE;
}

gboolean
stow_comm_nccl_load (int *version, GError **error)
{
  if (!stow_dl_once (&nccl_once, load_locked, STOW_COMM_ERROR,
                     STOW_COMM_ERROR_UNAVAILABLE, error))
    return FALSE;
  if (version != NULL && nccl.get_version (version) != 0)
    *version = 0;
  return TRUE;
}

typedef struct
{
  StowComm base;
  ncclComm_t comm;
  int device;
  cudaStream_t stream;
  gboolean own_stream;
  /* Scratch for padding and the partitions in flight; the stream orders
   * every use, so one region serves all queued collectives. */
  void *staging;
  guint64 staging_bytes;
  float *one; /* the barrier's element */
} NcclComm;

static gboolean
nccl_ok (ncclResult_t rc, const char *what, GError **error)
{
  if (rc == 0)
    return TRUE;
  g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_FAILED, "NCCL: %s: %s",
               what, nccl.error_string (rc));
  return FALSE;
}

static gboolean
cuda_ok (cudaError_t rc, const char *what, GError **error)
{
  if (rc == cudaSuccess)
    return TRUE;
  g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_FAILED, "CUDA: %s: %s",
               what, cudaGetErrorString (rc));
  return FALSE;
}

static guint8 *
staging (NcclComm *m, guint64 bytes, GError **error)
{
  if (bytes > m->staging_bytes)
    {
      /* The queued collectives may still use the old region. */
      if (!cuda_ok (cudaStreamSynchronize (m->stream), "staging", error))
        return NULL;
      cudaFree (m->staging);
      m->staging = NULL;
      m->staging_bytes = 0;
      if (!cuda_ok (cudaMalloc (&m->staging, bytes), "staging", error))
        return NULL;
      m->staging_bytes = bytes;
    }
  return m->staging;
}

static guint64
valid_len (const StowCommRequest *r, int q)
{
  guint64 start = (guint64)q * r->part;
  return start >= r->count ? 0 : MIN (r->part, r->count - start);
}

/* @send (count elements) padded with zeros to N partitions, in @pad
 * unless already whole. */
static const guint8 *
padded (NcclComm *m, const StowCommRequest *r, const void *send, guint8 *pad,
        GError **error)
{
  guint es = stow_dtype_size (r->dtype);
  guint64 whole = r->part * (guint64)m->base.world;
  if (whole == r->count)
    return send;
  if (!cuda_ok (cudaMemcpyAsync (pad, send, r->count * es,
                                 cudaMemcpyDeviceToDevice, m->stream),
                "padding", error)
      || !cuda_ok (cudaMemsetAsync (pad + r->count * es, 0,
                                    (whole - r->count) * es, m->stream),
                   "padding", error))
    return NULL;
  return pad;
}

static gboolean
reduce_scatter_det (NcclComm *m, const StowCommRequest *r, const void *send,
                    void *recv, guint8 *pad, guint8 *in, GError **error)
{
  int n = m->base.world, me = m->base.rank;
  int t = r->dtype == STOW_DTYPE_F32 ? NCCL_FLOAT32 : NCCL_BFLOAT16;
  guint64 pb = r->part * stow_dtype_size (r->dtype);
  const guint8 *src = padded (m, r, send, pad, error);
  if (src == NULL)
    return FALSE;
  if (!nccl_ok (nccl.group_start (), "group", error))
    return FALSE;
  for (int q = 0; q < n && r->part > 0; q++)
    if (q != me
        && (!nccl_ok (
                nccl.send (src + q * pb, r->part, t, q, m->comm, m->stream),
                "reduce-scatter: send", error)
            || !nccl_ok (
                nccl.recv (in + q * pb, r->part, t, q, m->comm, m->stream),
                "reduce-scatter: recv", error)))
      {
        nccl.group_end ();
        return FALSE;
      }
  if (!nccl_ok (nccl.group_end (), "reduce-scatter", error))
    return FALSE;
  return cuda_ok (
      stow_comm_nccl_sum_rank_order (recv, src + me * pb, in, n, me, r->part,
                                     r->dtype == STOW_DTYPE_BF16, m->stream),
      "reduce-scatter: the rank-order sum", error);
}

static gboolean
all_gather_det (NcclComm *m, const StowCommRequest *r, const void *send,
                void *recv, GError **error)
{
  int n = m->base.world, me = m->base.rank;
  int t = r->dtype == STOW_DTYPE_F32 ? NCCL_FLOAT32 : NCCL_BFLOAT16;
  guint es = stow_dtype_size (r->dtype);
  guint64 mine = valid_len (r, me);
  if (mine > 0
      && !cuda_ok (cudaMemcpyAsync ((guint8 *)recv + me * r->part * es, send,
                                    mine * es, cudaMemcpyDeviceToDevice,
                                    m->stream),
                   "all-gather", error))
    return FALSE;
  if (!nccl_ok (nccl.group_start (), "group", error))
    return FALSE;
  for (int q = 0; q < n; q++)
    {
      if (q == me)
        continue;
      guint64 len = valid_len (r, q);
      if ((mine > 0
           && !nccl_ok (nccl.send (send, mine, t, q, m->comm, m->stream),
                        "all-gather: send", error))
          || (len > 0
              && !nccl_ok (nccl.recv ((guint8 *)recv + q * r->part * es, len, t,
                                      q, m->comm, m->stream),
                           "all-gather: recv", error)))
        {
          nccl.group_end ();
          return FALSE;
        }
    }
  return nccl_ok (nccl.group_end (), "all-gather", error);
}

static gboolean
queue (NcclComm *m, const StowCommRequest *r, GError **error)
{
  int n = m->base.world;
  int t = r->dtype == STOW_DTYPE_F32 ? NCCL_FLOAT32 : NCCL_BFLOAT16;
  guint es = stow_dtype_size (r->dtype);
  guint64 whole = r->part * (guint64)n * es;
  /* [padded send | N partitions in | this rank's partition] */
  guint8 *s = NULL;
  if (r->op == STOW_COMM_OP_REDUCE_SCATTER || r->op == STOW_COMM_OP_ALL_REDUCE)
    {
      s = staging (m, MAX (2 * whole + r->part * es, 1), error);
      if (s == NULL)
        return FALSE;
    }
  switch (r->op)
    {
    case STOW_COMM_OP_BARRIER:
      return nccl_ok (nccl.all_reduce (m->one, m->one, 1, NCCL_FLOAT32,
                                       NCCL_SUM, m->comm, m->stream),
                      "barrier", error);
    case STOW_COMM_OP_BROADCAST:
      return nccl_ok (nccl.broadcast (r->recv, r->recv, r->count, t, r->root,
                                      m->comm, m->stream),
                      "broadcast", error);
    case STOW_COMM_OP_ALL_GATHER:
      if (r->mode == STOW_COMM_DETERMINISTIC || whole != r->count * es)
        return all_gather_det (m, r, r->send, r->recv, error);
      return nccl_ok (
          nccl.all_gather (r->send, r->recv, r->part, t, m->comm, m->stream),
          "all-gather", error);
    case STOW_COMM_OP_REDUCE_SCATTER:
      if (r->mode == STOW_COMM_DETERMINISTIC)
        return reduce_scatter_det (m, r, r->send, r->recv, s, s + whole, error);
      {
        const guint8 *src = padded (m, r, r->send, s, error);
        return src != NULL
               && nccl_ok (nccl.reduce_scatter (src, r->recv, r->part, t,
                                                NCCL_SUM, m->comm, m->stream),
                           "reduce-scatter", error);
      }
    case STOW_COMM_OP_ALL_REDUCE:
      if (r->mode == STOW_COMM_NATIVE)
        return nccl_ok (nccl.all_reduce (r->recv, r->recv, r->count, t,
                                         NCCL_SUM, m->comm, m->stream),
                        "all-reduce", error);
      {
        guint8 *mine = s + 2 * whole;
        return reduce_scatter_det (m, r, r->recv, mine, s, s + whole, error)
               && all_gather_det (m, r, mine, r->recv, error);
      }
    case STOW_COMM_OP_ALL_TO_ALL:
      break; /* refused by nccl_start */
    }
  g_assert_not_reached ();
}

static gboolean
nccl_start (StowComm *c, StowCommRequest *r, GError **error)
{
  NcclComm *m = (NcclComm *)c;
  cudaEvent_t ev = NULL;
  if (r->accumulate || r->op == STOW_COMM_OP_ALL_TO_ALL)
    {
      g_set_error_literal (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                           "an accumulating reduce-scatter or an all-to-all "
                           "runs on the mpi transport only");
      return FALSE;
    }
  if (!cuda_ok (cudaSetDevice (m->device), "cudaSetDevice", error)
      || !queue (m, r, error)
      || !cuda_ok (cudaEventCreateWithFlags (&ev, cudaEventDisableTiming),
                   "event", error)
      || !cuda_ok (cudaEventRecord (ev, m->stream), "event", error))
    {
      if (ev != NULL)
        cudaEventDestroy (ev);
      return FALSE;
    }
  r->transport = ev;
  return TRUE;
}

static gboolean
nccl_wait (StowComm *c, StowCommRequest *r, GError **error)
{
  NcclComm *m = (NcclComm *)c;
  cudaEvent_t ev = r->transport;
  gboolean ok = cuda_ok (cudaEventSynchronize (ev), "wait", error);
  cudaEventDestroy (ev);
  r->transport = NULL;
  ncclResult_t async = 0;
  if (ok && nccl.comm_get_async_error (m->comm, &async) == 0 && async != 0)
    ok = nccl_ok (async, "collective", error);
  return ok;
}

static void
nccl_free (StowComm *c)
{
  NcclComm *m = (NcclComm *)c;
  cudaSetDevice (m->device);
  cudaStreamSynchronize (m->stream);
  nccl.comm_destroy (m->comm);
  cudaFree (m->staging);
  cudaFree (m->one);
  if (m->own_stream)
    cudaStreamDestroy (m->stream);
  g_free (m);
}

static const StowCommClass nccl_class = {
  .name = "nccl",
  .start = nccl_start,
  .wait = nccl_wait,
  .free = nccl_free,
};

gboolean
stow_comm_nccl_unique_id (guint8 id[STOW_COMM_NCCL_ID_BYTES], GError **error)
{
  if (!stow_comm_nccl_load (NULL, error))
    return FALSE;
  ncclUniqueId u;
  if (!nccl_ok (nccl.get_unique_id (&u), "ncclGetUniqueId", error))
    return FALSE;
  memcpy (id, u.internal, sizeof u.internal);
  return TRUE;
}

static gboolean
device_ok (int device, GError **error)
{
  int devices = 0;
  if (cudaGetDeviceCount (&devices) != cudaSuccess || device < 0
      || device >= devices)
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_UNAVAILABLE,
                   "NCCL: no CUDA device %d (%d here)", device, devices);
      return FALSE;
    }
  return TRUE;
}

StowComm *
stow_comm_nccl_new (int rank, int world,
                    const guint8 id[STOW_COMM_NCCL_ID_BYTES], int device,
                    void *stream, GError **error)
{
  if (world < 1 || rank < 0 || rank >= world)
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                   "NCCL: rank %d of %d out of range", rank, world);
      return NULL;
    }
  if (!stow_comm_nccl_load (NULL, error) || !device_ok (device, error))
    return NULL;
  NcclComm *m = g_new0 (NcclComm, 1);
  m->base = (StowComm){
    .klass = &nccl_class,
    .rank = rank,
    .world = world,
    .mode = STOW_COMM_DETERMINISTIC,
  };
  m->device = device;
  m->stream = stream;
  ncclUniqueId u;
  memcpy (u.internal, id, sizeof u.internal);
  if (!cuda_ok (cudaSetDevice (device), "cudaSetDevice", error)
      || (stream == NULL
          && !cuda_ok (
              cudaStreamCreateWithFlags (&m->stream, cudaStreamNonBlocking),
              "stream", error))
      || !cuda_ok (cudaMalloc ((void **)&m->one, sizeof (float)), "barrier",
                   error)
      || !cuda_ok (cudaMemset (m->one, 0, sizeof (float)), "barrier", error)
      || !nccl_ok (nccl.comm_init_rank (&m->comm, world, u, rank),
                   "ncclCommInitRank", error))
    {
      if (stream == NULL && m->stream != NULL)
        cudaStreamDestroy (m->stream);
      cudaFree (m->one);
      g_free (m);
      return NULL;
    }
  m->own_stream = stream == NULL;
  return &m->base;
}

/* Every rank: NCCL and the device are here; rank 0 also makes the id. */
static gboolean
prepare_id (int rank, void *blob, gsize size, gpointer data, GError **error)
{
  const int *device = data;
  g_assert (size == STOW_COMM_NCCL_ID_BYTES);
  if (!stow_comm_nccl_load (NULL, error) || !device_ok (*device, error))
    return FALSE;
  return rank != 0 || stow_comm_nccl_unique_id (blob, error);
}

StowComm *
stow_comm_nccl_join (const StowLaunch *launch, int device, void *stream,
                     double timeout_s, GError **error)
{
  g_return_val_if_fail (launch != NULL && launch->init != NULL, NULL);
  guint8 id[STOW_COMM_NCCL_ID_BYTES];
  if (g_str_has_prefix (launch->init, "tcp://"))
    {
      if (!stow_rendezvous_exchange (launch->init, launch->rank,
                                     launch->world_size, timeout_s, prepare_id,
                                     &device, id, sizeof id, error))
        return NULL;
    }
  else if (g_str_equal (launch->init, "none") && launch->world_size == 1)
    {
      if (!prepare_id (0, id, sizeof id, &device, error))
        return NULL;
    }
  else
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                   "NCCL: --init %s with %d ranks: NCCL's id is handed out by "
                   "a tcp://HOST:PORT rendezvous (torchrun's MASTER_ADDR and "
                   "MASTER_PORT, or --init tcp://HOST:PORT)",
                   launch->init, launch->world_size);
      return NULL;
    }
  return stow_comm_nccl_new (launch->rank, launch->world_size, id, device,
                             stream, error);
}
