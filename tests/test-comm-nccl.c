/* SPDX-License-Identifier: MIT
 *
 * tests/test-comm-nccl.c: the NCCL transport of executor/comm/ on one
 * rank of one GPU, against the host's rank-order sum: every collective,
 * both modes, fp32 and bf16, requests in flight together.  Exits 77
 * (skip) without a CUDA device or libnccl.so.2.  Several ranks need
 * several GPUs (or NCCL 2.30's NCCL_MULTI_RANK_GPU_ENABLE); the id's
 * rendezvous (stow_comm_nccl_join) runs for one rank, and for two ranks
 * one of which has no device (both fail by name, before NCCL's init).
 */
#include <cuda_runtime_api.h>
#include <gio/gio.h>
#include <stdio.h>
#include <string.h>

#include "executor/comm/comm.h"
#include "executor/comm/nccl.h"
#include "executor/comm/rendezvous.h"
#include "offload/adam.h"

static StowComm *comm;

static void *
to_device (const void *host, gsize bytes)
{
  void *d = NULL;
  g_assert_cmpint (cudaMalloc (&d, MAX (bytes, 1)), ==, cudaSuccess);
  if (bytes > 0)
    g_assert_cmpint (cudaMemcpy (d, host, bytes, cudaMemcpyHostToDevice), ==,
                     cudaSuccess);
  return d;
}

static void
assert_device_bytes (const void *d, const void *want, gsize bytes)
{
  g_autofree guint8 *h = g_malloc (MAX (bytes, 1));
  if (bytes > 0)
    g_assert_cmpint (cudaMemcpy (h, d, bytes, cudaMemcpyDeviceToHost), ==,
                     cudaSuccess);
  g_assert_cmpmem (h, bytes, want, bytes);
}

static void
wait_ok (StowCommRequest *r)
{
  g_autoptr (GError) error = NULL;
  g_assert_nonnull (r);
  g_assert_true (stow_comm_wait (comm, r, &error));
  g_assert_no_error (error);
}

static void
test_collectives (void)
{
  const guint64 counts[] = { 0, 1, 7, 4099 };
  const StowDtype dtypes[] = { STOW_DTYPE_F32, STOW_DTYPE_BF16 };
  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (guint k = 0; k < G_N_ELEMENTS (counts); k++)
      for (int mode = 0; mode < 2; mode++)
        {
          StowDtype t = dtypes[d];
          guint64 n = counts[k];
          gsize bytes = n * stow_dtype_size (t);
          g_autofree guint8 *c = g_malloc (MAX (bytes, 1));
          for (guint64 i = 0; i < n; i++)
            {
              float v = (float)((i * 7919) % 1000) / 37.0f - 13.0f;
              if (t == STOW_DTYPE_F32)
                ((float *)c)[i] = v;
              else
                ((guint16 *)c)[i] = stow_f32_to_bf16 (v);
            }
          /* One rank: every sum is its one contribution. */
          g_autofree guint8 *want = g_malloc (MAX (bytes, 1));
          const void *one[] = { c };
          stow_comm_sum_rank_order (want, one, 1, n, t);
          g_assert_cmpmem (want, bytes, c, bytes);
          stow_comm_set_mode (comm, (StowCommMode)mode);
          void *a = to_device (c, bytes);
          void *b = to_device (c, bytes);
          void *rs = to_device (c, bytes);
          void *ag = to_device (c, bytes);
          g_assert_cmpint (cudaMemset (ag, 0, MAX (bytes, 1)), ==, cudaSuccess);
          StowCommRequest *r[4] = {
            stow_comm_all_reduce (comm, a, n, t, NULL),
            stow_comm_reduce_scatter (comm, b, rs, n, t, NULL),
            stow_comm_broadcast (comm, b, n, t, 0, NULL),
            stow_comm_barrier (comm, NULL),
          };
          for (int i = 3; i >= 0; i--)
            wait_ok (r[i]);
          wait_ok (stow_comm_all_gather (comm, rs, ag, n, t, NULL));
          assert_device_bytes (a, want, bytes);
          assert_device_bytes (rs, want, bytes);
          assert_device_bytes (b, c, bytes);
          assert_device_bytes (ag, want, bytes);
          cudaFree (a);
          cudaFree (b);
          cudaFree (rs);
          cudaFree (ag);
        }
}

static guint16
free_port (void)
{
  g_autoptr (GSocket) s = g_socket_new (
      G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP, NULL);
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (lo, 0);
  g_assert_nonnull (s);
  g_assert_true (g_socket_bind (s, sa, TRUE, NULL));
  g_autoptr (GSocketAddress) got = g_socket_get_local_address (s, NULL);
  return g_inet_socket_address_get_port (G_INET_SOCKET_ADDRESS (got));
}

typedef struct
{
  StowLaunch launch;
  int device;
  GError *error;
} JoinRank;

static gpointer
join_rank (gpointer data)
{
  JoinRank *j = data;
  StowComm *c
      = stow_comm_nccl_join (&j->launch, j->device, NULL, 30.0, &j->error);
  g_assert_null (c);
  return NULL;
}

static void
test_join (void)
{
  /* One rank: the id made here, or through the rendezvous (which opens no
   * socket for one rank). */
  const char *const inits[] = { "none", "tcp://127.0.0.1:29500" };
  for (guint i = 0; i < G_N_ELEMENTS (inits); i++)
    {
      g_autoptr (GError) error = NULL;
      StowLaunch l = { .rank = 0, .world_size = 1, .init = (char *)inits[i] };
      StowComm *c = stow_comm_nccl_join (&l, 0, NULL, 10.0, &error);
      g_assert_no_error (error);
      g_assert_cmpstr (stow_comm_backend_name (c), ==, "nccl");
      g_assert_cmpint (stow_comm_world_size (c), ==, 1);
      StowCommRequest *r = stow_comm_barrier (c, &error);
      g_assert_nonnull (r);
      g_assert_true (stow_comm_wait (c, r, &error));
      stow_comm_free (c);
    }
  g_autoptr (GError) error = NULL;
  StowLaunch mpi = { .rank = 0, .world_size = 2, .init = (char *)"mpi" };
  g_assert_null (stow_comm_nccl_join (&mpi, 0, NULL, 10.0, &error));
  g_assert_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "--init mpi"));

  /* Two ranks, rank 1 on a device that is not there: both fail at once,
   * naming it, and neither reaches ncclCommInitRank. */
  g_autofree char *init = g_strdup_printf ("tcp://127.0.0.1:%u", free_port ());
  JoinRank j[2];
  for (int q = 0; q < 2; q++)
    j[q] = (JoinRank){ .launch = { .rank = q, .world_size = 2, .init = init },
                       .device = q == 0 ? 0 : 999 };
  GThread *t[2];
  for (int q = 0; q < 2; q++)
    t[q] = g_thread_new ("rank", join_rank, &j[q]);
  for (int q = 0; q < 2; q++)
    g_thread_join (t[q]);
  g_assert_error (j[1].error, STOW_COMM_ERROR, STOW_COMM_ERROR_UNAVAILABLE);
  g_assert_nonnull (strstr (j[1].error->message, "no CUDA device 999"));
  g_assert_error (j[0].error, STOW_RENDEZVOUS_ERROR,
                  STOW_RENDEZVOUS_ERROR_FAILED);
  g_assert_nonnull (strstr (j[0].error->message, "rank 1 failed"));
  g_assert_nonnull (strstr (j[0].error->message, "no CUDA device 999"));
  for (int q = 0; q < 2; q++)
    g_clear_error (&j[q].error);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_autoptr (GError) error = NULL;
  int devices = 0, version = 0;
  /* The library first: its fifteen entry points resolve without a GPU. */
  if (!stow_comm_nccl_load (&version, &error))
    {
      printf ("SKIP: %s\n", error->message);
      return 77;
    }
  printf ("# NCCL %d loaded\n", version);
  if (cudaGetDeviceCount (&devices) != cudaSuccess || devices == 0)
    {
      printf ("SKIP: no CUDA device (NCCL %d loaded)\n", version);
      return 77;
    }
  guint8 id[STOW_COMM_NCCL_ID_BYTES];
  g_assert_true (stow_comm_nccl_unique_id (id, &error));
  comm = stow_comm_nccl_new (0, 1, id, 0, NULL, &error);
  g_assert_no_error (error);
  g_test_message ("NCCL %d on %d device(s)", version, devices);
  g_assert_cmpstr (stow_comm_backend_name (comm), ==, "nccl");
  g_test_add_func ("/comm-nccl/collectives", test_collectives);
  g_test_add_func ("/comm-nccl/join", test_join);
  int rc = g_test_run ();
  stow_comm_free (comm);
  return rc;
}
