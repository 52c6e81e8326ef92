/* SPDX-License-Identifier: MIT
 *
 * tests/test-comm-rendezvous.c: the TCP rendezvous (executor/comm/
 * rendezvous.h) with 1 to 4 ranks as threads on a free port of this host:
 * the broadcast and the barrier; a rank that never comes, leaves or fails;
 * world sizes that differ; a port taken by something else; bad init
 * strings; and random bytes from a peer, on either side, for the parsers.
 */
#include <gio/gio.h>
#include <string.h>

#include "executor/comm/rendezvous.h"

/* Generous where a test succeeds (CI's two cores are shared), short where
 * the test waits for a timeout to pass. */
#define LONG_S  20.0
#define SHORT_S 1.0

static guint16
free_port (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GSocket) s
      = g_socket_new (G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM,
                      G_SOCKET_PROTOCOL_TCP, &error);
  g_assert_no_error (error);
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (lo, 0);
  g_assert_true (g_socket_bind (s, sa, TRUE, &error));
  g_autoptr (GSocketAddress) got = g_socket_get_local_address (s, &error);
  g_assert_no_error (error);
  return g_inet_socket_address_get_port (G_INET_SOCKET_ADDRESS (got));
}

static char *
local_init (guint16 port)
{
  return g_strdup_printf ("tcp://127.0.0.1:%u", port);
}

/* One rank, run on a thread. */
typedef struct
{
  const char *init;
  int rank, world;
  int claimed_world; /* announced instead of world when > 0 */
  double timeout_s;
  guint delay_ms;    /* before joining */
  gsize size;        /* of the broadcast */
  gboolean exchange; /* stow_rendezvous_exchange instead of the steps */
  const char *fail;  /* the prepare fails with this message */
  guint8 blob[STOW_RENDEZVOUS_MAX_BLOB_BYTES];
  GError *error;
  double elapsed_s;
  gint joined; /* set once stow_rendezvous_new returned */
} Rank;

static Rank
rank_at (const char *init, int rank, int world, double timeout_s, gsize size)
{
  return (Rank){ .init = init,
                 .rank = rank,
                 .world = world,
                 .timeout_s = timeout_s,
                 .size = size };
}

static void
fill (guint8 *blob, gsize size, guint seed)
{
  for (gsize i = 0; i < size; i++)
    blob[i] = (guint8)(i * 131 + seed * 7 + 1);
}

static gboolean
prepare (int rank, void *blob, gsize size, gpointer data, GError **error)
{
  Rank *k = data;
  if (k->fail != NULL)
    {
      g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_FAILED, k->fail);
      return FALSE;
    }
  if (rank == 0)
    fill (blob, size, 77);
  return TRUE;
}

static gpointer
run_rank (gpointer data)
{
  Rank *k = data;
  g_usleep (k->delay_ms * 1000);
  gint64 t0 = g_get_monotonic_time ();
  int world = k->claimed_world > 0 ? k->claimed_world : k->world;
  if (k->exchange)
    {
      stow_rendezvous_exchange (k->init, k->rank, world, k->timeout_s, prepare,
                                k, k->blob, k->size, &k->error);
      g_atomic_int_set (&k->joined, 1);
    }
  else
    {
      if (k->rank == 0)
        fill (k->blob, k->size, 77);
      StowRendezvous *r = stow_rendezvous_new (k->init, k->rank, world,
                                               k->timeout_s, &k->error);
      g_atomic_int_set (&k->joined, 1);
      if (r != NULL)
        {
          /* Twice each, in both orders: messages stay in step. */
          if (stow_rendezvous_broadcast (r, k->blob, k->size, &k->error)
              && stow_rendezvous_barrier (r, &k->error)
              && stow_rendezvous_barrier (r, &k->error))
            stow_rendezvous_broadcast (r, k->blob, k->size, &k->error);
          stow_rendezvous_free (r);
        }
    }
  k->elapsed_s = (double)(g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  return NULL;
}

static void
run_ranks (Rank *ranks, guint n)
{
  GThread *t[8];
  g_assert_cmpuint (n, <=, G_N_ELEMENTS (t));
  for (guint i = 0; i < n; i++)
    t[i] = g_thread_new ("rank", run_rank, &ranks[i]);
  for (guint i = 0; i < n; i++)
    g_thread_join (t[i]);
}

static void
clear_ranks (Rank *ranks, guint n)
{
  for (guint i = 0; i < n; i++)
    g_clear_error (&ranks[i].error);
}

static void
assert_all_got_rank0 (Rank *ranks, guint n)
{
  guint8 want[STOW_RENDEZVOUS_MAX_BLOB_BYTES];
  fill (want, ranks[0].size, 77);
  for (guint i = 0; i < n; i++)
    {
      g_assert_no_error (ranks[i].error);
      g_assert_cmpmem (ranks[i].blob, ranks[i].size, want, ranks[0].size);
    }
}

static void
assert_error_has (const GError *e, int code, const char *const *words)
{
  g_assert_nonnull (e);
  g_test_message ("error: %s", e->message);
  g_assert_cmpstr (g_quark_to_string (e->domain), ==,
                   g_quark_to_string (STOW_RENDEZVOUS_ERROR));
  g_assert_cmpint (e->code, ==, code);
  for (guint i = 0; words[i] != NULL; i++)
    if (strstr (e->message, words[i]) == NULL)
      g_error ("\"%s\" lacks \"%s\"", e->message, words[i]);
}

/* ------------------------------------------------------------------ */

static void
test_parse (void)
{
  static const struct
  {
    const char *init, *host;
    guint16 port;
  } good[] = {
    { "tcp://127.0.0.1:29500", "127.0.0.1", 29500 },
    { "tcp://[::1]:1", "::1", 1 },
    { "tcp://::1:29500", "::1", 29500 },
    { "tcp://fe80::1:65535", "fe80::1", 65535 },
    { "tcp://node-01.cluster.example:80", "node-01.cluster.example", 80 },
    { "tcp://localhost:00080", "localhost", 80 },
  };
  for (guint i = 0; i < G_N_ELEMENTS (good); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *host = NULL;
      guint16 port = 0;
      g_assert_true (
          stow_rendezvous_parse_init (good[i].init, &host, &port, &error));
      g_assert_no_error (error);
      g_assert_cmpstr (host, ==, good[i].host);
      g_assert_cmpuint (port, ==, good[i].port);
    }
  static const char *const bad[] = {
    "",
    "mpi",
    "tcp://",
    "tcp://host",
    "tcp://host:",
    "tcp://:29500",
    "tcp://host:0",
    "tcp://host:65536",
    "tcp://host:123456",
    "tcp://host:12x",
    "tcp://host:-1",
    "tcp://host:+1",
    "tcp:// host:1",
    "udp://host:1",
    "tcp://[::1:5",
    "tcp://[host]:5",
    "tcp://[]:5",
    "tcp://::1",
    "tcp://user@host:5",
    "tcp://a b:5",
    "tcp://host/path:5",
  };
  for (guint i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *host = NULL;
      g_assert_false (stow_rendezvous_parse_init (bad[i], &host, NULL, &error));
      g_assert_null (host);
      g_autofree char *quoted = g_strdup_printf ("\"%s\"", bad[i]);
      assert_error_has (error, STOW_RENDEZVOUS_ERROR_INVALID,
                        (const char *[]){ quoted, "tcp://HOST:PORT", NULL });
      /* The constructor refuses it the same way, before any socket. */
      g_clear_error (&error);
      g_assert_null (stow_rendezvous_new (bad[i], 1, 2, SHORT_S, &error));
      assert_error_has (error, STOW_RENDEZVOUS_ERROR_INVALID,
                        (const char *[]){ quoted, NULL });
    }
  static const struct
  {
    int rank, world;
    double timeout_s;
  } out_of_range[] = { { 2, 2, 1 }, { -1, 2, 1 }, { 0, 0, 1 }, { 0, 2, 0 } };
  for (guint i = 0; i < G_N_ELEMENTS (out_of_range); i++)
    {
      g_autoptr (GError) error = NULL;
      g_assert_null (stow_rendezvous_new (
          "tcp://127.0.0.1:9", out_of_range[i].rank, out_of_range[i].world,
          out_of_range[i].timeout_s, &error));
      assert_error_has (error, STOW_RENDEZVOUS_ERROR_INVALID,
                        (const char *[]){ "tcp://127.0.0.1:9", "rank", NULL });
    }
}

/* 1 to 4 ranks meet; rank 0 starts last, so the others retry. */
static void
test_meet (void)
{
  for (int n = 1; n <= 4; n++)
    for (int exchange = 0; exchange < 2; exchange++)
      {
        g_autofree char *init = local_init (free_port ());
        Rank ranks[4];
        for (int q = 0; q < n; q++)
          {
            ranks[q] = rank_at (init, q, n, LONG_S, exchange ? 128 : 4096);
            ranks[q].delay_ms = q == 0 ? 200 : 0;
            ranks[q].exchange = exchange;
          }
        run_ranks (ranks, n);
        assert_all_got_rank0 (ranks, n);
        clear_ranks (ranks, n);
      }
}

/* A blob of 0 bytes, and a blob over the limit. */
static void
test_sizes (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank ranks[2];
  for (int q = 0; q < 2; q++)
    ranks[q] = rank_at (init, q, 2, LONG_S, 0);
  run_ranks (ranks, 2);
  assert_all_got_rank0 (ranks, 2);
  clear_ranks (ranks, 2);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowRendezvous) one = stow_rendezvous_new (init, 0, 1, 1, &error);
  g_assert_no_error (error);
  g_autofree guint8 *big = g_malloc0 (STOW_RENDEZVOUS_MAX_BLOB_BYTES + 1);
  g_assert_false (stow_rendezvous_broadcast (
      one, big, STOW_RENDEZVOUS_MAX_BLOB_BYTES + 1, &error));
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_INVALID,
                    (const char *[]){ "4097 bytes", "at most 4096", NULL });
}

/* Ranks given different sizes: the rank that differs says both, and rank
 * 0 names it at the barrier. */
static void
test_size_mismatch (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank ranks[2];
  for (int q = 0; q < 2; q++)
    ranks[q] = rank_at (init, q, 2, LONG_S, q == 0 ? 128 : 64);
  run_ranks (ranks, 2);
  assert_error_has (ranks[1].error, STOW_RENDEZVOUS_ERROR_FAILED,
                    (const char *[]){ init, "rank 0 broadcast 128 bytes",
                                      "rank 1 expected 64", NULL });
  assert_error_has (
      ranks[0].error, STOW_RENDEZVOUS_ERROR_FAILED,
      (const char *[]){ init, "rank 1 failed", "expected 64", NULL });
  clear_ranks (ranks, 2);
}

/* Rank 2 of 3 never comes: rank 0 and rank 1 fail by the timeout, both
 * naming rank 2. */
static void
test_missing_rank (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank ranks[2];
  for (int q = 0; q < 2; q++)
    ranks[q] = rank_at (init, q, 3, SHORT_S, 128);
  run_ranks (ranks, 2);
  assert_error_has (
      ranks[0].error, STOW_RENDEZVOUS_ERROR_TIMEOUT,
      (const char *[]){ init, "rank 2 of 3 did not join within 1.", NULL });
  assert_error_has (ranks[1].error, STOW_RENDEZVOUS_ERROR_TIMEOUT,
                    (const char *[]){ init, "rank 0 stopped the rendezvous",
                                      "rank 2 of 3 did not join", NULL });
  for (int q = 0; q < 2; q++)
    {
      g_assert_cmpfloat (ranks[q].elapsed_s, >=, SHORT_S - 0.2);
      g_assert_cmpfloat (ranks[q].elapsed_s, <, SHORT_S + 3.0);
    }
  clear_ranks (ranks, 2);

  /* Ranks 1, 2 and 3 of 4 missing: one list. */
  GError *error = NULL;
  g_assert_null (stow_rendezvous_new (init, 0, 4, 0.3, &error));
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_TIMEOUT,
                    (const char *[]){ "ranks 1, 2, 3 of 4", NULL });
  g_clear_error (&error);
}

/* Rank 0 never comes: rank 1 retries until the timeout and says so. */
static void
test_missing_rank0 (void)
{
  guint16 port = free_port ();
  g_autofree char *init = local_init (port);
  g_autofree char *port_text = g_strdup_printf ("port %u", port);
  GError *error = NULL;
  gint64 t0 = g_get_monotonic_time ();
  g_assert_null (stow_rendezvous_new (init, 1, 2, 0.5, &error));
  double s = (double)(g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_TIMEOUT,
                    (const char *[]){ init, "rank 0 not reachable", port_text,
                                      "within 0.", NULL });
  g_assert_cmpfloat (s, <, 2.0);
  g_clear_error (&error);
}

/* A rank that joined and left while rank 0 waits for another (that
 * never comes): rank 0 fails at once, not at its timeout, naming it, and
 * tells the rank still there. */
static void
test_rank_left (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank r0 = rank_at (init, 0, 4, LONG_S, 8);
  Rank r2 = rank_at (init, 2, 4, LONG_S, 8);
  GThread *t0 = g_thread_new ("rank 0", run_rank, &r0);
  GThread *t2 = g_thread_new ("rank 2", run_rank, &r2);
  while (!g_atomic_int_get (&r2.joined))
    g_usleep (10 * 1000);
  GError *error = NULL;
  StowRendezvous *r1 = stow_rendezvous_new (init, 1, 4, LONG_S, &error);
  g_assert_no_error (error);
  stow_rendezvous_free (r1);
  g_thread_join (t0);
  g_thread_join (t2);
  assert_error_has (r0.error, STOW_RENDEZVOUS_ERROR_FAILED,
                    (const char *[]){ init, "rank 1 (127.0.0.1:",
                                      "closed its connection after joining",
                                      NULL });
  assert_error_has (r2.error, STOW_RENDEZVOUS_ERROR_FAILED,
                    (const char *[]){ "rank 0 stopped the rendezvous", "rank 1",
                                      "closed its connection", NULL });
  g_assert_cmpfloat (r0.elapsed_s, <, LONG_S / 2);
  g_assert_cmpfloat (r2.elapsed_s, <, LONG_S / 2);
  g_clear_error (&r0.error);
  g_clear_error (&r2.error);

  /* Rank 1 leaves after the broadcast: rank 0's barrier names it. */
  g_autofree char *init2 = local_init (free_port ());
  Rank lone = rank_at (init2, 0, 2, LONG_S, 8);
  t0 = g_thread_new ("rank 0", run_rank, &lone);
  r1 = stow_rendezvous_new (init2, 1, 2, LONG_S, &error);
  g_assert_no_error (error);
  guint8 blob[8];
  g_assert_true (stow_rendezvous_broadcast (r1, blob, sizeof blob, &error));
  stow_rendezvous_free (r1);
  g_thread_join (t0);
  assert_error_has (lone.error, STOW_RENDEZVOUS_ERROR_FAILED,
                    (const char *[]){ init2, "rank 1 (127.0.0.1:",
                                      "closed its connection during the "
                                      "barrier",
                                      NULL });
  g_assert_cmpfloat (lone.elapsed_s, <, LONG_S / 2);
  g_clear_error (&lone.error);

  /* Rank 0 leaves before the broadcast: rank 1 says so at once. */
  g_autofree char *init3 = local_init (free_port ());
  Rank r1b = rank_at (init3, 1, 2, LONG_S, 8);
  GThread *t1 = g_thread_new ("rank 1", run_rank, &r1b);
  StowRendezvous *r0b = stow_rendezvous_new (init3, 0, 2, LONG_S, &error);
  g_assert_no_error (error);
  stow_rendezvous_free (r0b);
  g_thread_join (t1);
  assert_error_has (
      r1b.error, STOW_RENDEZVOUS_ERROR_FAILED,
      (const char *[]){ init3, "rank 0 (", "closed the connection",
                        "rank 1 waiting for its broadcast", NULL });
  g_assert_cmpfloat (r1b.elapsed_s, <, LONG_S / 2);
  g_clear_error (&r1b.error);
}

/* A rank whose preparation fails (no device, say): every rank fails at
 * once with its reason. */
static void
test_prepare_fails (void)
{
  for (int bad = 0; bad < 3; bad++)
    {
      g_autofree char *init = local_init (free_port ());
      Rank ranks[3];
      for (int q = 0; q < 3; q++)
        {
          ranks[q] = rank_at (init, q, 3, LONG_S, 128);
          ranks[q].exchange = TRUE;
          ranks[q].fail = q == bad ? "no CUDA device 7" : NULL;
        }
      run_ranks (ranks, 3);
      g_autofree char *failed = g_strdup_printf ("rank %d failed", bad);
      for (int q = 0; q < 3; q++)
        {
          g_assert_nonnull (ranks[q].error);
          g_test_message ("rank %d: %s", q, ranks[q].error->message);
          if (q != bad)
            g_assert_nonnull (strstr (ranks[q].error->message, failed));
          g_assert_nonnull (
              strstr (ranks[q].error->message, "no CUDA device 7"));
          g_assert_cmpfloat (ranks[q].elapsed_s, <, LONG_S / 2);
        }
      clear_ranks (ranks, 3);
    }
}

/* Ranks launched with different world sizes, or a second job on the same
 * port: the stray rank is refused at once by name, rank 0 keeps waiting
 * for its own rank and names the stray when it gives up. */
static void
test_world_mismatch (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank r0 = rank_at (init, 0, 2, LONG_S, 16);
  GThread *t0 = g_thread_new ("rank 0", run_rank, &r0);
  GError *error = NULL;
  gint64 t = g_get_monotonic_time ();
  g_assert_null (stow_rendezvous_new (init, 1, 3, LONG_S, &error));
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_REFUSED,
                    (const char *[]){ init, "rank 0 refused rank 1 of 3",
                                      "world size 3, rank 0 2", NULL });
  g_assert_cmpfloat ((double)(g_get_monotonic_time () - t) / G_USEC_PER_SEC, <,
                     LONG_S / 2);
  g_clear_error (&error);
  /* Rank 0 still waits for its own rank 1. */
  Rank r1 = rank_at (init, 1, 2, LONG_S, 16);
  GThread *t1 = g_thread_new ("rank 1", run_rank, &r1);
  g_thread_join (t0);
  g_thread_join (t1);
  g_assert_no_error (r0.error);
  g_assert_no_error (r1.error);

  /* Only the stray comes: rank 0's timeout names it. */
  g_autofree char *init2 = local_init (free_port ());
  Rank pair[2] = { rank_at (init2, 0, 2, SHORT_S, 16),
                   rank_at (init2, 1, 2, SHORT_S, 16) };
  pair[1].claimed_world = 5;
  run_ranks (pair, 2);
  assert_error_has (pair[0].error, STOW_RENDEZVOUS_ERROR_TIMEOUT,
                    (const char *[]){ "rank 1 of 2 did not join", "refused",
                                      "world size 5", NULL });
  assert_error_has (pair[1].error, STOW_RENDEZVOUS_ERROR_REFUSED,
                    (const char *[]){ "world size 5, rank 0 2", NULL });
  clear_ranks (pair, 2);
}

/* The same rank twice while rank 0 still waits for a third. */
static void
test_duplicate_rank (void)
{
  g_autofree char *init = local_init (free_port ());
  Rank ranks[3];
  for (int q = 0; q < 3; q++)
    ranks[q] = rank_at (init, q, 3, LONG_S, 32);
  GThread *t[3];
  for (int q = 0; q < 2; q++)
    t[q] = g_thread_new ("rank", run_rank, &ranks[q]);
  while (!g_atomic_int_get (&ranks[1].joined))
    g_usleep (10 * 1000);
  GError *error = NULL;
  g_assert_null (stow_rendezvous_new (init, 1, 3, LONG_S, &error));
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_REFUSED,
                    (const char *[]){ "rank 0 refused rank 1 of 3",
                                      "which joined from 127.0.0.1:", NULL });
  g_clear_error (&error);
  t[2] = g_thread_new ("rank", run_rank, &ranks[2]);
  for (int q = 0; q < 3; q++)
    g_thread_join (t[q]);
  assert_all_got_rank0 (ranks, 3);
}

/* Something else on the port: rank 0 cannot listen there; a rank that
 * reaches it is told it is no rendezvous. */
static gpointer
foreign_server (gpointer data)
{
  GSocket *l = data;
  g_autoptr (GSocket) c = g_socket_accept (l, NULL, NULL);
  if (c != NULL)
    {
      const char reply[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
      g_socket_send (c, reply, sizeof reply - 1, NULL, NULL);
      g_socket_shutdown (c, FALSE, TRUE, NULL);
      char sink[64];
      g_socket_receive (c, sink, sizeof sink, NULL, NULL);
    }
  return NULL;
}

static GSocket *
listen_on (GInetAddress *a, guint16 port)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GSocket) s
      = g_socket_new (g_inet_address_get_family (a), G_SOCKET_TYPE_STREAM,
                      G_SOCKET_PROTOCOL_TCP, &error);
  g_assert_no_error (error);
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (a, port);
  if (!g_socket_bind (s, sa, TRUE, &error) || !g_socket_listen (s, &error))
    return NULL;
  return g_steal_pointer (&s);
}

static void
test_port_in_use (void)
{
  guint16 port = free_port ();
  g_autofree char *init = local_init (port);
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocket) l = listen_on (lo, port);
  g_assert_nonnull (l);
  GError *error = NULL;
  g_autofree char *port_text
      = g_strdup_printf ("cannot listen on port %u", port);
  g_assert_null (stow_rendezvous_new (init, 0, 2, SHORT_S, &error));
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_FAILED,
                    (const char *[]){ init, port_text, "in use", NULL });
  g_clear_error (&error);

  GThread *t = g_thread_new ("foreign", foreign_server, l);
  g_assert_null (stow_rendezvous_new (init, 1, 2, LONG_S, &error));
  g_thread_join (t);
  assert_error_has (error, STOW_RENDEZVOUS_ERROR_REFUSED,
                    (const char *[]){ init, "is not a stowage rendezvous",
                                      "48 54 54 50", NULL });
  g_clear_error (&error);
}

/* IPv6 (where this host has ::1) and a host name. */
static void
test_addresses (void)
{
  g_autoptr (GInetAddress) lo6
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV6);
  guint16 port = free_port ();
  g_autoptr (GSocket) probe = listen_on (lo6, port);
  gboolean v6 = probe != NULL;
  g_clear_object (&probe);
  const char *const forms[] = { "[::1]", "::1", "localhost" };
  for (guint f = 0; f < G_N_ELEMENTS (forms); f++)
    {
      if (f < 2 && !v6)
        {
          g_test_message ("no IPv6 loopback here: %s not tried", forms[f]);
          continue;
        }
      g_autofree char *init
          = g_strdup_printf ("tcp://%s:%u", forms[f], free_port ());
      Rank ranks[3];
      for (int q = 0; q < 3; q++)
        ranks[q] = rank_at (init, q, 3, LONG_S, 128);
      run_ranks (ranks, 3);
      assert_all_got_rank0 (ranks, 3);
    }
}

/* ---- random bytes from a peer -------------------------------------- */

static const guint8 the_magic[8] = { 's', 't', 'o', 'w', '-', 'r', 'd', 'v' };

static void
put32 (guint8 *p, guint32 v)
{
  p[0] = v >> 24;
  p[1] = v >> 16;
  p[2] = v >> 8;
  p[3] = v;
}

static void
random_bytes (guint8 *p, gsize n)
{
  for (gsize i = 0; i < n; i++)
    p[i] = (guint8)g_test_rand_int_range (0, 256);
}

static GSocket *
connect_to (guint16 port)
{
  /* A plain socket, not GSocketClient: no proxy resolver is consulted. */
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (lo, port);
  for (int i = 0; i < 500; i++)
    {
      g_autoptr (GSocket) s
          = g_socket_new (G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM,
                          G_SOCKET_PROTOCOL_TCP, NULL);
      g_assert_nonnull (s);
      if (g_socket_connect (s, sa, NULL, NULL))
        return g_steal_pointer (&s);
      g_usleep (10 * 1000);
    }
  g_error ("rank 0 never listened on port %u", port);
}

/* Rank 0 takes hundreds of connections that send garbage, hellos with
 * random fields or cut short, and still meets its rank 1. */
static void
test_fuzz_rank0 (void)
{
  guint16 port = free_port ();
  g_autofree char *init = local_init (port);
  Rank r0 = rank_at (init, 0, 2, LONG_S, 128);
  GThread *t0 = g_thread_new ("rank 0", run_rank, &r0);
  guint n = g_test_slow () ? 2000 : 300;
  for (guint i = 0; i < n; i++)
    {
      guint8 buf[64];
      gsize len = (gsize)g_test_rand_int_range (0, sizeof buf + 1);
      random_bytes (buf, sizeof buf);
      int kind = g_test_rand_int_range (0, 3);
      if (kind >= 1)
        {
          /* A hello: the magic, then random or nearly valid fields. */
          memcpy (buf, the_magic, 8);
          if (kind == 2)
            {
              put32 (buf + 8, 1);
              put32 (buf + 12, (guint32)g_test_rand_int_range (0, 4));
              put32 (buf + 16, (guint32)g_test_rand_int_range (0, 4));
            }
          len = MAX (len, (gsize)g_test_rand_int_range (8, 25));
        }
      /* Never the hello of the real rank 1, world 2. */
      if (len >= 20 && memcmp (buf, the_magic, 8) == 0 && buf[11] == 1
          && buf[15] == 2 && buf[19] == 1)
        buf[19] = 3;
      g_autoptr (GSocket) s = connect_to (port);
      g_socket_set_timeout (s, 5);
      g_socket_send (s, (const char *)buf, len, NULL, NULL);
      if (g_test_rand_bit ())
        {
          /* Read whatever rank 0 answers before closing. */
          g_socket_shutdown (s, FALSE, TRUE, NULL);
          char sink[256];
          while (g_socket_receive (s, sink, sizeof sink, NULL, NULL) > 0)
            ;
        }
    }
  g_autoptr (GError) error = NULL;
  g_autoptr (StowRendezvous) r1
      = stow_rendezvous_new (init, 1, 2, LONG_S, &error);
  g_assert_no_error (error);
  guint8 blob[128] = { 0 };
  g_assert_true (stow_rendezvous_broadcast (r1, blob, sizeof blob, &error));
  g_assert_true (stow_rendezvous_barrier (r1, &error));
  g_assert_true (stow_rendezvous_barrier (r1, &error));
  g_assert_true (stow_rendezvous_broadcast (r1, blob, sizeof blob, &error));
  g_thread_join (t0);
  g_assert_no_error (r0.error);
  guint8 want[128];
  fill (want, sizeof want, 77);
  g_assert_cmpmem (blob, sizeof blob, want, sizeof want);
}

/* A rank whose rank 0 answers garbage: random bytes, a greeting then a
 * random message, a welcome then random messages.  Every one ends in an
 * error (or, for the valid sequence, the blob), never a crash or a hang. */
static void
test_fuzz_peer (void)
{
  guint16 port = free_port ();
  g_autofree char *init = local_init (port);
  g_autoptr (GInetAddress) lo
      = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr (GSocket) l = listen_on (lo, port);
  g_assert_nonnull (l);
  g_socket_set_timeout (l, 10);
  guint n = g_test_slow () ? 1000 : 200, failed = 0;
  for (guint i = 0; i < n; i++)
    {
      Rank r1 = rank_at (init, 1, 2, 5.0, 16);
      r1.exchange = TRUE;
      GThread *t = g_thread_new ("rank 1", run_rank, &r1);
      g_autoptr (GSocket) c = g_socket_accept (l, NULL, NULL);
      g_assert_nonnull (c);
      g_socket_set_timeout (c, 10);
      guint8 hello[20];
      gsize got = 0;
      while (got < sizeof hello)
        {
          gssize k = g_socket_receive (c, (char *)hello + got,
                                       sizeof hello - got, NULL, NULL);
          g_assert_cmpint (k, >, 0);
          got += (gsize)k;
        }
      g_assert_cmpmem (hello, 8, the_magic, 8);
      guint8 reply[128];
      gsize len = (gsize)g_test_rand_int_range (0, sizeof reply + 1);
      random_bytes (reply, sizeof reply);
      int kind = g_test_rand_int_range (0, 4);
      gsize at = 0;
      if (kind >= 1)
        {
          memcpy (reply, the_magic, 8);
          put32 (reply + 8, 1);
          at = 12;
        }
      if (kind >= 2)
        {
          /* A welcome. */
          put32 (reply + 12, 1);
          put32 (reply + 16, 4);
          put32 (reply + 20, (guint32)g_test_rand_int_range (0, 100));
          at = 24;
        }
      if (kind >= 1 && at + 8 <= sizeof reply)
        {
          /* Then a header with a small tag and a length near the end. */
          put32 (reply + at, (guint32)g_test_rand_int_range (0, 8));
          put32 (reply + at + 4, (guint32)g_test_rand_int_range (0, 40)
                                     | (g_test_rand_bit () ? 0 : 0x10000u));
        }
      if (kind == 3)
        {
          /* The valid sequence: the ends of the two barriers, the blob. */
          put32 (reply + 24, 5);
          put32 (reply + 28, 0);
          put32 (reply + 32, 5);
          put32 (reply + 36, 0);
          put32 (reply + 40, 3);
          put32 (reply + 44, 16);
          fill (reply + 48, 16, 77);
          len = 64;
        }
      g_socket_send (c, (const char *)reply, len, NULL, NULL);
      if (kind == 3)
        {
          /* Rank 1's two barrier messages, read before closing (no
           * reset). */
          char sink[16];
          gsize in = 0;
          gssize k;
          while (in < sizeof sink
                 && (k = g_socket_receive (c, sink + in, sizeof sink - in, NULL,
                                           NULL))
                        > 0)
            in += (gsize)k;
        }
      g_socket_shutdown (c, FALSE, TRUE, NULL);
      g_thread_join (t);
      if (kind == 3)
        {
          g_assert_no_error (r1.error);
          guint8 want[16];
          fill (want, sizeof want, 77);
          g_assert_cmpmem (r1.blob, 16, want, 16);
        }
      else
        {
          g_assert_nonnull (r1.error);
          g_assert_cmpint (r1.error->domain, ==, STOW_RENDEZVOUS_ERROR);
          g_assert_true (g_utf8_validate (r1.error->message, -1, NULL));
          failed++;
        }
      g_assert_cmpfloat (r1.elapsed_s, <, 5.0);
      g_clear_error (&r1.error);
    }
  g_test_message ("%u of %u garbage answers refused", failed, n);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/rendezvous/parse", test_parse);
  g_test_add_func ("/rendezvous/meet", test_meet);
  g_test_add_func ("/rendezvous/sizes", test_sizes);
  g_test_add_func ("/rendezvous/size-mismatch", test_size_mismatch);
  g_test_add_func ("/rendezvous/missing-rank", test_missing_rank);
  g_test_add_func ("/rendezvous/missing-rank0", test_missing_rank0);
  g_test_add_func ("/rendezvous/rank-left", test_rank_left);
  g_test_add_func ("/rendezvous/prepare-fails", test_prepare_fails);
  g_test_add_func ("/rendezvous/world-mismatch", test_world_mismatch);
  g_test_add_func ("/rendezvous/duplicate-rank", test_duplicate_rank);
  g_test_add_func ("/rendezvous/port-in-use", test_port_in_use);
  g_test_add_func ("/rendezvous/addresses", test_addresses);
  g_test_add_func ("/rendezvous/fuzz-rank0", test_fuzz_rank0);
  g_test_add_func ("/rendezvous/fuzz-peer", test_fuzz_peer);
  return g_test_run ();
}
