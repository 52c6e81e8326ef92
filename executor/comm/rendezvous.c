/* SPDX-License-Identifier: MIT
 *
 * executor/comm/rendezvous.c: the TCP rendezvous of rendezvous.h over
 * GSocket.  Every socket is non-blocking and every wait is a g_poll or a
 * timed condition wait against a deadline, so nothing blocks past the
 * timeout.  Rank 0 serves the connections that have not said who they are
 * from one poll loop: a slow or foreign peer never holds up the ranks.
 */
#include "executor/comm/rendezvous.h"

#include <gio/gio.h>
#include <string.h>

/* clang-format off */
G_DEFINE_QUARK (stow-rendezvous-error-quark, stow_rendezvous_error)
/* clang-format on */

/* The wire, every integer a big-endian u32:
 *   hello, rank r to rank 0:  MAGIC version world rank
 *   rank 0's first answer:    MAGIC version, then a message
 *   a message, either way:    tag length payload[length]
 * A new wire format bumps VERSION: ranks of two builds are refused by
 * name rather than misread. */
static const guint8 magic[8] = { 's', 't', 'o', 'w', '-', 'r', 'd', 'v' };
enum
{
  VERSION = 1,
  HELLO_BYTES = 20,
  GREETING_BYTES = 12,
  HEADER_BYTES = 8,
  MAX_PAYLOAD = STOW_RENDEZVOUS_MAX_BLOB_BYTES,
  /* Connections rank 0 keeps while they have not said who they are. */
  MAX_PENDING = 256,
  /* Refused peers rank 0 names when it gives up. */
  MAX_NOTES = 4,
};

typedef enum
{
  TAG_WELCOME = 1, /* 0 to r: u32, ms rank 0 still waits for the others */
  TAG_REFUSED,     /* 0 to a peer: why (text) */
  TAG_BLOB,        /* 0 to r: the broadcast */
  TAG_BARRIER,     /* r to 0: entered the barrier */
  TAG_GO,          /* 0 to r: every rank entered it */
  TAG_ABORT,       /* either way: u32 error code, then why (text) */
  TAG_LAST = TAG_ABORT,
} Tag;

static const char *const tag_names[] = {
  [TAG_WELCOME] = "welcome",  [TAG_REFUSED] = "refusal",
  [TAG_BLOB] = "broadcast",   [TAG_BARRIER] = "barrier",
  [TAG_GO] = "barrier's end", [TAG_ABORT] = "abort",
};

typedef struct
{
  guint32 tag, len;
  guint8 payload[MAX_PAYLOAD + 1]; /* NUL after len */
} Message;

struct _StowRendezvous
{
  char *init;
  int rank, world;
  double timeout_s;
  /* Rank 0: peers[q] and addrs[q] for q in 1..world-1; another rank:
   * peers[0], rank 0. */
  GSocket **peers;
  char **addrs;
  /* Another rank, until rank 0's first message after the welcome: the
   * monotonic time (us) up to which rank 0 waits for the others. */
  gint64 rank0_until;
  /* Rank 0: the ranks whose barrier message came (a rank may enter the
   * barrier while rank 0 still waits for others to join). */
  gboolean *barrier_in;
  gboolean failed; /* every later call is refused */
};

static void
put32 (guint8 *p, guint32 v)
{
  p[0] = v >> 24;
  p[1] = v >> 16;
  p[2] = v >> 8;
  p[3] = v;
}

static guint32
get32 (const guint8 *p)
{
  return (guint32)p[0] << 24 | (guint32)p[1] << 16 | (guint32)p[2] << 8 | p[3];
}

static double
seconds_since (gint64 t0)
{
  return (double)(g_get_monotonic_time () - t0) / G_USEC_PER_SEC;
}

static gint64
after (double seconds)
{
  return g_get_monotonic_time () + (gint64)(seconds * G_USEC_PER_SEC);
}

static gboolean
is_ipv6 (const char *s)
{
  /* Not g_hostname_is_ip_address: it takes ":" for an address. */
  g_autoptr (GInetAddress) a = g_inet_address_new_from_string (s);
  return a != NULL && g_inet_address_get_family (a) == G_SOCKET_FAMILY_IPV6;
}

gboolean
stow_rendezvous_parse_init (const char *init, char **host, guint16 *port,
                            GError **error)
{
  g_return_val_if_fail (init != NULL, FALSE);
  const char *hp = g_str_has_prefix (init, "tcp://") ? init + 6 : NULL;
  const char *colon = hp ? strrchr (hp, ':') : NULL;
  g_autofree char *h = colon ? g_strndup (hp, colon - hp) : NULL;
  gsize hl = h ? strlen (h) : 0;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']')
    {
      memmove (h, h + 1, hl - 2);
      h[hl - 2] = '\0';
      if (!is_ipv6 (h))
        g_clear_pointer (&h, g_free);
    }
  /* A colon left in the host: an IPv6 address without brackets, split
   * at the last colon (the port has none). */
  else if (h != NULL
           && (hl == 0 || strpbrk (h, "[]/@ \t") != NULL
               || (strchr (h, ':') != NULL && !is_ipv6 (h))))
    g_clear_pointer (&h, g_free);
  const char *p = colon ? colon + 1 : "";
  guint64 v = 0;
  gboolean digits
      = *p != '\0' && strspn (p, "0123456789") == strlen (p) && strlen (p) <= 5;
  if (digits)
    v = g_ascii_strtoull (p, NULL, 10);
  if (h == NULL || *h == '\0' || !digits || v < 1 || v > 65535)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_INVALID,
                   "\"%s\" is not tcp://HOST:PORT (a host name or address, "
                   "a port 1-65535)",
                   init);
      return FALSE;
    }
  if (host != NULL)
    *host = g_steal_pointer (&h);
  if (port != NULL)
    *port = (guint16)v;
  return TRUE;
}

/* --- deadline-bounded I/O on a non-blocking socket ---------------------
 * Errors are GIO's (G_IO_ERROR_TIMED_OUT, _CONNECTION_CLOSED, ...); the
 * public entries turn them into messages that name ranks. */

static gboolean
wait_for (GSocket *s, GIOCondition cond, gint64 deadline, GError **error)
{
  gint64 left = deadline - g_get_monotonic_time ();
  return g_socket_condition_timed_wait (s, cond, MAX (left, 0), NULL, error);
}

static gboolean
send_all (GSocket *s, const void *buf, gsize n, gint64 deadline, GError **error)
{
  const guint8 *p = buf;
  while (n > 0)
    {
      GError *e = NULL;
      gssize k = g_socket_send (s, (const char *)p, n, NULL, &e);
      if (k < 0)
        {
          if (!g_error_matches (e, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
            {
              g_propagate_error (error, e);
              return FALSE;
            }
          g_error_free (e);
          if (!wait_for (s, G_IO_OUT, deadline, error))
            return FALSE;
          continue;
        }
      p += k;
      n -= (gsize)k;
    }
  return TRUE;
}

static gboolean
recv_all (GSocket *s, void *buf, gsize n, gint64 deadline, GError **error)
{
  guint8 *p = buf;
  while (n > 0)
    {
      GError *e = NULL;
      gssize k = g_socket_receive (s, (char *)p, n, NULL, &e);
      if (k < 0)
        {
          if (!g_error_matches (e, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
            {
              g_propagate_error (error, e);
              return FALSE;
            }
          g_error_free (e);
          if (!wait_for (s, G_IO_IN, deadline, error))
            return FALSE;
          continue;
        }
      if (k == 0)
        {
          g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED,
                               "closed the connection");
          return FALSE;
        }
      p += k;
      n -= (gsize)k;
    }
  return TRUE;
}

static gboolean
send_message (GSocket *s, Tag tag, const void *payload, gsize len,
              gint64 deadline, GError **error)
{
  guint8 buf[HEADER_BYTES + MAX_PAYLOAD];
  g_assert (len <= MAX_PAYLOAD);
  put32 (buf, tag);
  put32 (buf + 4, (guint32)len);
  if (len > 0)
    memcpy (buf + HEADER_BYTES, payload, len);
  return send_all (s, buf, HEADER_BYTES + len, deadline, error);
}

/* A text payload: at most MAX_PAYLOAD bytes, cut at a character. */
static gboolean
send_text (GSocket *s, Tag tag, guint32 code, const char *text, gint64 deadline,
           GError **error)
{
  guint8 buf[MAX_PAYLOAD];
  gsize off = tag == TAG_ABORT ? 4 : 0;
  gsize n = MIN (strlen (text), sizeof buf - off);
  while (n > 0 && n < strlen (text) && (text[n] & 0xc0) == 0x80)
    n--;
  if (tag == TAG_ABORT)
    put32 (buf, code);
  memcpy (buf + off, text, n);
  return send_message (s, tag, buf, off + n, deadline, error);
}

static gboolean
recv_message (GSocket *s, Message *m, gint64 deadline, GError **error)
{
  guint8 h[HEADER_BYTES];
  if (!recv_all (s, h, sizeof h, deadline, error))
    return FALSE;
  m->tag = get32 (h);
  m->len = get32 (h + 4);
  if (m->tag < TAG_WELCOME || m->tag > TAG_LAST || m->len > MAX_PAYLOAD
      || (m->tag == TAG_WELCOME && m->len != 4)
      || (m->tag == TAG_ABORT && m->len < 4)
      || ((m->tag == TAG_BARRIER || m->tag == TAG_GO) && m->len != 0))
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                   "sent a malformed message (tag %u, %u bytes)", m->tag,
                   m->len);
      return FALSE;
    }
  if (!recv_all (s, m->payload, m->len, deadline, error))
    return FALSE;
  m->payload[m->len] = '\0';
  return TRUE;
}

/* A peer's text, made printable: valid UTF-8, no control characters. */
static char *
message_text (const Message *m)
{
  gsize off = m->tag == TAG_ABORT ? 4 : 0;
  g_autofree char *raw = g_memdup2 (m->payload + off, m->len - off + 1);
  for (gsize i = 0; i < m->len - off; i++)
    if ((guchar)raw[i] < 0x20 || raw[i] == 0x7f)
      raw[i] = '?';
  return g_utf8_make_valid (raw, (gssize)(m->len - off));
}

static int
abort_code (const Message *m)
{
  guint32 c = get32 (m->payload);
  return c <= STOW_RENDEZVOUS_ERROR_FAILED ? (int)c
                                           : STOW_RENDEZVOUS_ERROR_FAILED;
}

static char *
address_text (GSocket *s, gboolean remote)
{
  g_autoptr (GSocketAddress) a = remote ? g_socket_get_remote_address (s, NULL)
                                        : g_socket_get_local_address (s, NULL);
  if (a == NULL || !G_IS_INET_SOCKET_ADDRESS (a))
    return g_strdup ("an unknown address");
  GInetSocketAddress *ia = G_INET_SOCKET_ADDRESS (a);
  g_autofree char *ip
      = g_inet_address_to_string (g_inet_socket_address_get_address (ia));
  guint16 port = g_inet_socket_address_get_port (ia);
  return strchr (ip, ':') ? g_strdup_printf ("[%s]:%u", ip, port)
                          : g_strdup_printf ("%s:%u", ip, port);
}

/* "rank 2", "ranks 2, 3", "ranks 2, 3, ... and 5 more" for the q in
 * [1, world) with !present[q]. */
static char *
missing_ranks (const gboolean *present, int world)
{
  GString *s = g_string_new (NULL);
  int n = 0;
  for (int q = 0; q < world; q++)
    if (!present[q])
      {
        if (n < 8)
          g_string_append_printf (s, "%s%d", n ? ", " : "", q);
        n++;
      }
  if (n > 8)
    g_string_append_printf (s, " and %d more", n - 8);
  g_string_prepend (s, n == 1 ? "rank " : "ranks ");
  return g_string_free (s, FALSE);
}

/* --- rank 0 --------------------------------------------------------- */

/* Every address of this host on @port, IPv6 with IPv4 mapped into it
 * (GLib makes IPv6 sockets dual-stack), IPv4 alone where IPv6 is off. */
static GSocket *
listen_any (guint16 port, GError **error)
{
  GError *e = NULL;
  for (int v6 = 1; v6 >= 0; v6--)
    {
      GSocketFamily family = v6 ? G_SOCKET_FAMILY_IPV6 : G_SOCKET_FAMILY_IPV4;
      g_clear_error (&e);
      g_autoptr (GSocket) s = g_socket_new (family, G_SOCKET_TYPE_STREAM,
                                            G_SOCKET_PROTOCOL_TCP, &e);
      if (s == NULL)
        continue;
      g_autoptr (GInetAddress) any = g_inet_address_new_any (family);
      g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (any, port);
      g_socket_set_blocking (s, FALSE);
      g_socket_set_listen_backlog (s, 512);
      /* allow_reuse: SO_REUSEADDR, so that the connections of a job that
       * just ended (TIME_WAIT) do not keep the next from the port. */
      if (g_socket_bind (s, sa, TRUE, &e) && g_socket_listen (s, &e))
        return g_steal_pointer (&s);
      if (g_error_matches (e, G_IO_ERROR, G_IO_ERROR_ADDRESS_IN_USE))
        break;
    }
  g_propagate_error (error, e);
  return NULL;
}

typedef struct
{
  GSocket *s;
  char *addr;
  guint8 hello[HELLO_BYTES];
  gsize got;
} Pending;

static void
pending_free (gpointer p)
{
  Pending *c = p;
  g_object_unref (c->s);
  g_free (c->addr);
  g_free (c);
}

/* Tells every rank still connected why rank 0 stops (best effort, one
 * second at most), and marks the rendezvous failed. */
static void
tell_all (StowRendezvous *r, int code, const char *why)
{
  gint64 deadline = after (MIN (r->timeout_s, 1.0));
  for (int q = 1; q < r->world; q++)
    if (r->peers[q] != NULL)
      send_text (r->peers[q], TAG_ABORT, (guint32)code, why, deadline, NULL);
  r->failed = TRUE;
}

/* Rank 0's failure: the others are told @error's message, then it is
 * prefixed with the address. */
static gboolean
fail0 (StowRendezvous *r, GError **error, GError *e)
{
  tell_all (r, e->code, e->message);
  g_propagate_prefixed_error (error, e, "%s: ", r->init);
  return FALSE;
}

/* What rank @q sent when rank 0 expected @expect (0: nothing).  TRUE when
 * it was that; else an error naming the rank. */
static gboolean
read_from (StowRendezvous *r, int q, Tag expect, const char *during,
           gint64 deadline, GError **error)
{
  Message m;
  GError *e = NULL;
  if (!recv_message (r->peers[q], &m, deadline, &e))
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR,
                   g_error_matches (e, G_IO_ERROR, G_IO_ERROR_TIMED_OUT)
                       ? STOW_RENDEZVOUS_ERROR_TIMEOUT
                       : STOW_RENDEZVOUS_ERROR_FAILED,
                   "rank %d (%s) %s %s", q, r->addrs[q],
                   g_error_matches (e, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED)
                       ? "closed its connection"
                       : e->message,
                   during);
      g_error_free (e);
      return FALSE;
    }
  if (m.tag == expect && expect != 0)
    return TRUE;
  if (m.tag == TAG_ABORT)
    {
      g_autofree char *why = message_text (&m);
      g_set_error (error, STOW_RENDEZVOUS_ERROR, abort_code (&m),
                   "rank %d failed: %s", q, why);
      return FALSE;
    }
  g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
               "rank %d (%s) sent a %s %s (the ranks run different steps)", q,
               r->addrs[q], tag_names[m.tag], during);
  return FALSE;
}

/* A complete hello from @c: NULL and the rank admitted, or why not (a
 * peer of another program gets no answer: @answer FALSE). */
static char *
check_hello (StowRendezvous *r, const Pending *c, int *rank, gboolean *answer)
{
  *answer = TRUE;
  if (memcmp (c->hello, magic, sizeof magic) != 0)
    {
      *answer = FALSE;
      return g_strdup_printf (
          "%s is not a stowage rank (its first bytes: %02x %02x %02x %02x)",
          c->addr, c->hello[0], c->hello[1], c->hello[2], c->hello[3]);
    }
  guint32 version = get32 (c->hello + 8), world = get32 (c->hello + 12),
          q = get32 (c->hello + 16);
  if (version != VERSION)
    return g_strdup_printf ("%s speaks the rendezvous protocol version %u, "
                            "rank 0 version %d (another stowage build)",
                            c->addr, version, VERSION);
  if (world != (guint32)r->world)
    return g_strdup_printf (
        "%s has world size %u, rank 0 %d (ranks launched with different "
        "world sizes, or two jobs on one port)",
        c->addr, world, r->world);
  if (q == 0 || q >= world)
    return g_strdup_printf ("%s says it is rank %u, not one of 1..%d (two "
                            "jobs on one port?)",
                            c->addr, q, r->world - 1);
  if (r->peers[q] != NULL)
    return g_strdup_printf ("%s says it is rank %u, which joined from %s "
                            "(two jobs on one port?)",
                            c->addr, q, r->addrs[q]);
  *rank = (int)q;
  return NULL;
}

/* Rank 0: accept until every rank has joined, or fail by the deadline. */
static gboolean
serve (StowRendezvous *r, guint16 port, gint64 t0, gint64 deadline,
       GError **error)
{
  GError *e = NULL;
  g_autoptr (GSocket) listener = listen_any (port, &e);
  if (listener == NULL)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                   "%s: rank 0 cannot listen on port %u: %s", r->init, port,
                   e->message);
      g_error_free (e);
      return FALSE;
    }
  g_autoptr (GPtrArray) pending = g_ptr_array_new_with_free_func (pending_free);
  g_autoptr (GPtrArray) notes = g_ptr_array_new_with_free_func (g_free);
  guint n_notes = 0;
  g_autofree gboolean *present = g_new0 (gboolean, r->world);
  present[0] = TRUE;
  int joined = 1;
  g_autofree GPollFD *fds = g_new (GPollFD, 1 + r->world + MAX_PENDING);
  while (joined < r->world)
    {
      gint64 now = g_get_monotonic_time ();
      if (now >= deadline)
        {
          g_autofree char *who = missing_ranks (present, r->world);
          GString *s = g_string_new (NULL);
          g_string_printf (s, "%s of %d did not join within %.1f s", who,
                           r->world, seconds_since (t0));
          for (guint i = 0; i < notes->len; i++)
            g_string_append_printf (
                s, "%s%s", i ? "; " : " (refused: ", (char *)notes->pdata[i]);
          if (n_notes > notes->len)
            g_string_append_printf (s, "; %u more", n_notes - notes->len);
          if (notes->len > 0)
            g_string_append_c (s, ')');
          e = g_error_new_literal (STOW_RENDEZVOUS_ERROR,
                                   STOW_RENDEZVOUS_ERROR_TIMEOUT, s->str);
          g_string_free (s, TRUE);
          return fail0 (r, error, e);
        }
      guint n = 0;
      fds[n++]
          = (GPollFD){ .fd = g_socket_get_fd (listener), .events = G_IO_IN };
      for (int q = 1; q < r->world; q++)
        if (r->peers[q] != NULL)
          fds[n++] = (GPollFD){ .fd = g_socket_get_fd (r->peers[q]),
                                .events = G_IO_IN };
      guint first_pending = n;
      for (guint i = 0; i < pending->len; i++)
        fds[n++] = (GPollFD){ .fd = g_socket_get_fd (
                                  ((Pending *)pending->pdata[i])->s),
                              .events = G_IO_IN };
      /* EINTR and the like: the loop polls again, the deadline holds. */
      if (g_poll (fds, n, (int)((deadline - now + 999) / 1000)) <= 0)
        continue;

      /* A rank that joined may enter its barrier; anything else (end of
       * file, an abort) means it left: fail now, not at the deadline. */
      guint k = 1;
      for (int q = 1; q < r->world; q++)
        if (r->peers[q] != NULL && fds[k++].revents != 0)
          {
            if (!read_from (r, q, r->barrier_in[q] ? 0 : TAG_BARRIER,
                            "after joining", after (0.1), &e))
              return fail0 (r, error, e);
            r->barrier_in[q] = TRUE;
          }

      for (guint i = pending->len; i-- > 0;)
        {
          Pending *c = pending->pdata[i];
          if (fds[first_pending + i].revents == 0)
            continue;
          gssize got = g_socket_receive (c->s, (char *)c->hello + c->got,
                                         HELLO_BYTES - c->got, NULL, NULL);
          if (got < 0 && fds[first_pending + i].revents == G_IO_IN)
            continue; /* spurious */
          if (got <= 0)
            {
              /* Gone before saying who it was: a port probe, a peer that
               * gave up.  Nothing to refuse. */
              g_ptr_array_remove_index_fast (pending, i);
              continue;
            }
          c->got += (gsize)got;
          if (c->got < HELLO_BYTES)
            continue;
          int q = 0;
          gboolean answer = TRUE;
          g_autofree char *why = check_hello (r, c, &q, &answer);
          if (why == NULL)
            {
              guint32 left_ms = (guint32)MAX (
                  (deadline - g_get_monotonic_time ()) / 1000, 0);
              guint8 greeting[GREETING_BYTES + HEADER_BYTES + 4];
              memcpy (greeting, magic, sizeof magic);
              put32 (greeting + 8, VERSION);
              put32 (greeting + 12, TAG_WELCOME);
              put32 (greeting + 16, 4);
              put32 (greeting + 20, left_ms);
              if (!send_all (c->s, greeting, sizeof greeting, deadline, NULL))
                {
                  g_ptr_array_remove_index_fast (pending, i);
                  continue;
                }
              r->peers[q] = g_object_ref (c->s);
              r->addrs[q] = g_steal_pointer (&c->addr);
              present[q] = TRUE;
              joined++;
            }
          else
            {
              if (answer)
                {
                  guint8 greeting[GREETING_BYTES];
                  memcpy (greeting, magic, sizeof magic);
                  put32 (greeting + 8, VERSION);
                  gint64 soon = after (MIN (r->timeout_s, 1.0));
                  if (send_all (c->s, greeting, sizeof greeting, soon, NULL))
                    send_text (c->s, TAG_REFUSED, 0, why, soon, NULL);
                }
              if (notes->len < MAX_NOTES)
                g_ptr_array_add (notes, g_steal_pointer (&why));
              n_notes++;
            }
          g_ptr_array_remove_index_fast (pending, i);
        }

      if (fds[0].revents != 0)
        for (;;)
          {
            GSocket *s = g_socket_accept (listener, NULL, NULL);
            if (s == NULL)
              break;
            if (pending->len >= MAX_PENDING)
              {
                g_object_unref (s);
                continue;
              }
            g_socket_set_blocking (s, FALSE);
            Pending *c = g_new0 (Pending, 1);
            c->s = s;
            c->addr = address_text (s, TRUE);
            g_ptr_array_add (pending, c);
          }
    }
  /* The listener closes here: a stray connection now meets a refused
   * port at once rather than a silent one. */
  return TRUE;
}

/* --- the other ranks ------------------------------------------------ */

typedef struct
{
  GList *addresses;
  GError *error;
  gboolean done;
} Lookup;

static void
looked_up (GObject *source, GAsyncResult *res, gpointer data)
{
  Lookup *l = data;
  l->addresses
      = g_resolver_lookup_by_name_finish (G_RESOLVER (source), res, &l->error);
  l->done = TRUE;
}

static gboolean
cancel_lookup (gpointer c)
{
  g_cancellable_cancel (c);
  return G_SOURCE_REMOVE;
}

/* @host's addresses, the resolver cancelled at @deadline (GLib 2.74's
 * resolver has no timeout of its own). */
static GList *
resolve (const char *host, gint64 deadline, GError **error)
{
  GInetAddress *literal = g_inet_address_new_from_string (host);
  if (literal != NULL)
    return g_list_append (NULL, literal);
  g_autoptr (GMainContext) ctx = g_main_context_new ();
  g_autoptr (GResolver) resolver = g_resolver_get_default ();
  g_autoptr (GCancellable) cancel = g_cancellable_new ();
  g_main_context_push_thread_default (ctx);
  Lookup l = { 0 };
  g_resolver_lookup_by_name_async (resolver, host, cancel, looked_up, &l);
  gint64 left = MAX (deadline - g_get_monotonic_time (), 0);
  GSource *timer = g_timeout_source_new ((guint)(left / 1000));
  g_source_set_callback (timer, cancel_lookup, cancel, NULL);
  g_source_attach (timer, ctx);
  while (!l.done)
    g_main_context_iteration (ctx, TRUE);
  g_source_destroy (timer);
  g_source_unref (timer);
  g_main_context_pop_thread_default (ctx);
  if (l.error != NULL)
    g_propagate_error (error, l.error);
  return l.addresses;
}

static GSocket *
try_connect (GInetAddress *a, guint16 port, gint64 deadline, GError **error)
{
  g_autoptr (GSocket) s
      = g_socket_new (g_inet_address_get_family (a), G_SOCKET_TYPE_STREAM,
                      G_SOCKET_PROTOCOL_TCP, error);
  if (s == NULL)
    return NULL;
  g_socket_set_blocking (s, FALSE);
  g_autoptr (GSocketAddress) sa = g_inet_socket_address_new (a, port);
  GError *e = NULL;
  if (!g_socket_connect (s, sa, NULL, &e))
    {
      if (!g_error_matches (e, G_IO_ERROR, G_IO_ERROR_PENDING))
        {
          g_propagate_error (error, e);
          return NULL;
        }
      g_error_free (e);
      if (!wait_for (s, G_IO_OUT, deadline, error)
          || !g_socket_check_connect_result (s, error))
        return NULL;
    }
  /* Connecting to a port of this host that nobody listens on can meet
   * itself (TCP's simultaneous open picks the same ephemeral port): the
   * rank would read its own hello as rank 0's answer. */
  g_autofree char *local = address_text (s, FALSE);
  g_autofree char *remote = address_text (s, TRUE);
  if (g_str_equal (local, remote))
    {
      g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_CONNECTION_REFUSED,
                           "connected to itself");
      return NULL;
    }
  return g_steal_pointer (&s);
}

/* Rank > 0: connect (retrying until rank 0 listens), hello, welcome. */
static gboolean
join (StowRendezvous *r, const char *host, guint16 port, gint64 t0,
      gint64 deadline, GError **error)
{
  GError *e = NULL;
  GList *addresses = resolve (host, deadline, &e);
  if (addresses == NULL)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                   "%s: cannot resolve %s: %s", r->init, host,
                   e ? e->message : "no address");
      g_clear_error (&e);
      return FALSE;
    }
  GSocket *s = NULL;
  g_autofree char *last = NULL;
  guint tries = 0;
  gint64 pause = 20 * 1000;
  while (s == NULL)
    {
      for (GList *a = addresses; a != NULL && s == NULL; a = a->next)
        {
          s = try_connect (a->data, port, deadline, &e);
          if (s == NULL)
            {
              g_free (last);
              last = g_strdup (e->message);
              g_clear_error (&e);
            }
        }
      tries++;
      gint64 left = deadline - g_get_monotonic_time ();
      if (s == NULL && left <= 0)
        break;
      if (s == NULL)
        {
          /* Rank 0 may start after this rank: back off up to 0.5 s. */
          g_usleep ((gulong)MIN (pause, left));
          pause = MIN (pause * 2, 500 * 1000);
        }
    }
  g_list_free_full (addresses, g_object_unref);
  if (s == NULL)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_TIMEOUT,
                   "%s: rank 0 not reachable at %s port %u within %.1f s "
                   "(rank %d of %d, %u attempts; the last: %s)",
                   r->init, host, port, seconds_since (t0), r->rank, r->world,
                   tries, last);
      return FALSE;
    }
  r->peers[0] = s;
  r->addrs[0] = address_text (s, TRUE);

  /* Rank 0 answers a hello at once: the handshake gets the timeout from
   * the connection, however late that came. */
  gint64 hs = after (r->timeout_s);
  guint8 hello[HELLO_BYTES], greeting[GREETING_BYTES];
  memcpy (hello, magic, sizeof magic);
  put32 (hello + 8, VERSION);
  put32 (hello + 12, (guint32)r->world);
  put32 (hello + 16, (guint32)r->rank);
  Message m;
  if (!send_all (s, hello, sizeof hello, hs, &e)
      || !recv_all (s, greeting, sizeof greeting, hs, &e))
    {
      /* GIO maps EPIPE and ECONNRESET to CONNECTION_CLOSED too. */
      gboolean closed
          = g_error_matches (e, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED);
      g_set_error (error, STOW_RENDEZVOUS_ERROR,
                   closed ? STOW_RENDEZVOUS_ERROR_REFUSED
                   : g_error_matches (e, G_IO_ERROR, G_IO_ERROR_TIMED_OUT)
                       ? STOW_RENDEZVOUS_ERROR_TIMEOUT
                       : STOW_RENDEZVOUS_ERROR_FAILED,
                   "%s: %s %s before the rendezvous's greeting%s", r->init,
                   r->addrs[0], e->message,
                   closed ? " (not a stowage rendezvous?)" : "");
      g_error_free (e);
      return FALSE;
    }
  if (memcmp (greeting, magic, sizeof magic) != 0)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_REFUSED,
                   "%s: %s is not a stowage rendezvous (it answered %02x %02x "
                   "%02x %02x ...)",
                   r->init, r->addrs[0], greeting[0], greeting[1], greeting[2],
                   greeting[3]);
      return FALSE;
    }
  if (get32 (greeting + 8) != VERSION)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_REFUSED,
                   "%s: rank 0 speaks the rendezvous protocol version %u, "
                   "rank %d version %d (another stowage build)",
                   r->init, get32 (greeting + 8), r->rank, VERSION);
      return FALSE;
    }
  if (!recv_message (s, &m, hs, &e))
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                   "%s: rank 0 (%s) %s", r->init, r->addrs[0], e->message);
      g_error_free (e);
      return FALSE;
    }
  if (m.tag == TAG_WELCOME)
    {
      r->rank0_until = g_get_monotonic_time ()
                       + (gint64)get32 (m.payload) * G_TIME_SPAN_MILLISECOND;
      return TRUE;
    }
  g_autofree char *why = m.tag == TAG_REFUSED || m.tag == TAG_ABORT
                             ? message_text (&m)
                             : g_strdup_printf ("a %s", tag_names[m.tag]);
  g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_REFUSED,
               "%s: rank 0 refused rank %d of %d: %s", r->init, r->rank,
               r->world, why);
  return FALSE;
}

/* Another rank: rank 0's next message, which must be @expect. */
static gboolean
from_rank0 (StowRendezvous *r, Tag expect, Message *m, GError **error)
{
  gint64 t0 = g_get_monotonic_time ();
  /* Rank 0 may still wait for the others until rank0_until: the timeout
   * runs from then. */
  gint64 deadline
      = MAX (t0, r->rank0_until) + (gint64)(r->timeout_s * G_USEC_PER_SEC);
  GError *e = NULL;
  if (!recv_message (r->peers[0], m, deadline, &e))
    {
      r->failed = TRUE;
      gboolean timeout = g_error_matches (e, G_IO_ERROR, G_IO_ERROR_TIMED_OUT);
      if (timeout)
        g_set_error (error, STOW_RENDEZVOUS_ERROR,
                     STOW_RENDEZVOUS_ERROR_TIMEOUT,
                     "%s: rank 0 sent no %s within %.1f s (rank %d waited)",
                     r->init, tag_names[expect], seconds_since (t0), r->rank);
      else
        g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                     "%s: rank 0 (%s) %s, rank %d waiting for its %s", r->init,
                     r->addrs[0], e->message, r->rank, tag_names[expect]);
      g_error_free (e);
      return FALSE;
    }
  r->rank0_until = 0;
  if (m->tag == expect)
    return TRUE;
  r->failed = TRUE;
  if (m->tag == TAG_ABORT)
    {
      g_autofree char *why = message_text (m);
      g_set_error (error, STOW_RENDEZVOUS_ERROR, abort_code (m),
                   "%s: rank 0 stopped the rendezvous: %s", r->init, why);
    }
  else
    g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                 "%s: rank 0 sent a %s, rank %d expected its %s (the ranks "
                 "run different steps)",
                 r->init, tag_names[m->tag], r->rank, tag_names[expect]);
  return FALSE;
}

/* --- the entries ---------------------------------------------------- */

StowRendezvous *
stow_rendezvous_new (const char *init, int rank, int world, double timeout_s,
                     GError **error)
{
  g_return_val_if_fail (init != NULL, NULL);
  g_autofree char *host = NULL;
  guint16 port = 0;
  if (!stow_rendezvous_parse_init (init, &host, &port, error))
    return NULL;
  if (world < 1 || rank < 0 || rank >= world || !(timeout_s > 0))
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_INVALID,
                   "%s: rank %d of %d with a timeout of %g s (want 0 <= "
                   "rank < world size, a timeout above 0)",
                   init, rank, world, timeout_s);
      return NULL;
    }
  g_autoptr (StowRendezvous) r = g_new0 (StowRendezvous, 1);
  r->init = g_strdup (init);
  r->rank = rank;
  r->world = world;
  r->timeout_s = timeout_s;
  r->peers = g_new0 (GSocket *, world);
  r->addrs = g_new0 (char *, world);
  r->barrier_in = g_new0 (gboolean, world);
  if (world == 1)
    return g_steal_pointer (&r);
  gint64 t0 = g_get_monotonic_time ();
  gint64 deadline = t0 + (gint64)(timeout_s * G_USEC_PER_SEC);
  if (rank == 0 ? !serve (r, port, t0, deadline, error)
                : !join (r, host, port, t0, deadline, error))
    return NULL;
  return g_steal_pointer (&r);
}

int
stow_rendezvous_rank (const StowRendezvous *r)
{
  return r->rank;
}

int
stow_rendezvous_world_size (const StowRendezvous *r)
{
  return r->world;
}

static gboolean
usable (StowRendezvous *r, GError **error)
{
  if (!r->failed)
    return TRUE;
  g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
               "%s: the rendezvous already failed", r->init);
  return FALSE;
}

gboolean
stow_rendezvous_broadcast (StowRendezvous *r, void *buf, gsize size,
                           GError **error)
{
  g_return_val_if_fail (r != NULL && (buf != NULL || size == 0), FALSE);
  if (size > MAX_PAYLOAD)
    {
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_INVALID,
                   "%s: a broadcast of %" G_GSIZE_FORMAT " bytes (at most %d)",
                   r->init, size, MAX_PAYLOAD);
      return FALSE;
    }
  if (!usable (r, error))
    return FALSE;
  if (r->rank == 0)
    {
      gint64 deadline = after (r->timeout_s);
      for (int q = 1; q < r->world; q++)
        {
          GError *e = NULL;
          if (!send_message (r->peers[q], TAG_BLOB, buf, size, deadline, &e))
            {
              GError *named = g_error_new (
                  STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                  "rank %d (%s) did not take the broadcast: %s", q, r->addrs[q],
                  e->message);
              g_error_free (e);
              return fail0 (r, error, named);
            }
        }
      return TRUE;
    }
  Message m;
  if (!from_rank0 (r, TAG_BLOB, &m, error))
    return FALSE;
  if (m.len != size)
    {
      g_autofree char *why = g_strdup_printf (
          "rank 0 broadcast %u bytes, rank %d expected %" G_GSIZE_FORMAT, m.len,
          r->rank, size);
      stow_rendezvous_abort (r, why);
      g_set_error (error, STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
                   "%s: %s", r->init, why);
      return FALSE;
    }
  memcpy (buf, m.payload, size);
  return TRUE;
}

gboolean
stow_rendezvous_barrier (StowRendezvous *r, GError **error)
{
  g_return_val_if_fail (r != NULL, FALSE);
  if (!usable (r, error))
    return FALSE;
  if (r->world == 1)
    return TRUE;
  if (r->rank != 0)
    {
      GError *e = NULL;
      Message m;
      if (!send_message (r->peers[0], TAG_BARRIER, NULL, 0,
                         after (r->timeout_s), &e))
        {
          r->failed = TRUE;
          g_set_error (error, STOW_RENDEZVOUS_ERROR,
                       STOW_RENDEZVOUS_ERROR_FAILED,
                       "%s: rank 0 (%s) %s, rank %d entering the barrier",
                       r->init, r->addrs[0], e->message, r->rank);
          g_error_free (e);
          return FALSE;
        }
      return from_rank0 (r, TAG_GO, &m, error);
    }
  gint64 t0 = g_get_monotonic_time ();
  gint64 deadline = after (r->timeout_s);
  gboolean *in = r->barrier_in;
  g_autofree GPollFD *fds = g_new (GPollFD, r->world);
  g_autofree int *who = g_new (int, r->world);
  in[0] = TRUE;
  int arrived = 0;
  for (int q = 0; q < r->world; q++)
    arrived += in[q];
  while (arrived < r->world)
    {
      gint64 now = g_get_monotonic_time ();
      if (now >= deadline)
        {
          g_autofree char *missing = missing_ranks (in, r->world);
          GError *e = g_error_new (
              STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_TIMEOUT,
              "%s of %d did not reach the barrier within %.1f s", missing,
              r->world, seconds_since (t0));
          return fail0 (r, error, e);
        }
      /* The ranks already in too: one that leaves fails the barrier. */
      guint n = 0;
      for (int q = 1; q < r->world; q++)
        {
          who[n] = q;
          fds[n++] = (GPollFD){ .fd = g_socket_get_fd (r->peers[q]),
                                .events = G_IO_IN };
        }
      if (g_poll (fds, n, (int)((deadline - now + 999) / 1000)) <= 0)
        continue;
      for (guint i = 0; i < n; i++)
        if (fds[i].revents != 0)
          {
            GError *e = NULL;
            if (!read_from (r, who[i], in[who[i]] ? 0 : TAG_BARRIER,
                            "during the barrier", deadline, &e))
              return fail0 (r, error, e);
            in[who[i]] = TRUE;
            arrived++;
          }
    }
  memset (in, 0, r->world * sizeof *in);
  deadline = after (r->timeout_s);
  for (int q = 1; q < r->world; q++)
    {
      GError *e = NULL;
      if (!send_message (r->peers[q], TAG_GO, NULL, 0, deadline, &e))
        {
          GError *named = g_error_new (
              STOW_RENDEZVOUS_ERROR, STOW_RENDEZVOUS_ERROR_FAILED,
              "rank %d (%s) left at the end of the barrier: %s", q, r->addrs[q],
              e->message);
          g_error_free (e);
          return fail0 (r, error, named);
        }
    }
  return TRUE;
}

void
stow_rendezvous_abort (StowRendezvous *r, const char *reason)
{
  g_return_if_fail (r != NULL && reason != NULL);
  if (r->failed || r->world == 1)
    {
      r->failed = TRUE;
      return;
    }
  if (r->rank == 0)
    {
      g_autofree char *why = g_strdup_printf ("rank 0 failed: %s", reason);
      tell_all (r, STOW_RENDEZVOUS_ERROR_FAILED, why);
      return;
    }
  send_text (r->peers[0], TAG_ABORT, STOW_RENDEZVOUS_ERROR_FAILED, reason,
             after (MIN (r->timeout_s, 1.0)), NULL);
  r->failed = TRUE;
}

void
stow_rendezvous_free (StowRendezvous *r)
{
  if (r == NULL)
    return;
  for (int q = 0; q < r->world; q++)
    {
      g_clear_object (&r->peers[q]);
      g_free (r->addrs[q]);
    }
  g_free (r->peers);
  g_free (r->addrs);
  g_free (r->barrier_in);
  g_free (r->init);
  g_free (r);
}

gboolean
stow_rendezvous_exchange (const char *init, int rank, int world,
                          double timeout_s, StowRendezvousPrepare prepare,
                          gpointer data, void *blob, gsize size, GError **error)
{
  g_autoptr (StowRendezvous) r
      = stow_rendezvous_new (init, rank, world, timeout_s, error);
  if (r == NULL)
    return FALSE;
  /* A first barrier: every rank has joined before any prepares, so that
   * a failure reaches them all (rank 0 stops listening once it fails).
   * The second: a rank whose @prepare failed has said so (its abort)
   * before rank 0 writes to it, so rank 0 reads the reason rather than a
   * reset connection, and names it to the others. */
  if (!stow_rendezvous_barrier (r, error))
    return FALSE;
  GError *e = NULL;
  if (prepare != NULL && !prepare (rank, blob, size, data, &e))
    {
      stow_rendezvous_abort (r, e->message);
      g_propagate_error (error, e);
      return FALSE;
    }
  return stow_rendezvous_barrier (r, error)
         && stow_rendezvous_broadcast (r, blob, size, error);
}
