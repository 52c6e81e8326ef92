/* SPDX-License-Identifier: MIT
 *
 * offload/nvme.c: the NVMe store (see nvme.h).  One queue of requests feeds
 * a fixed set of slots (queue_depth operations in flight); an engine moves
 * the slots' bytes: an io_uring thread that submits in batches and sleeps in
 * io_uring_submit_and_wait, or queue_depth pread/pwrite threads.  Everything
 * a request needs is allocated when the store is made: the hot path never
 * allocates and reports negative errno; GError is made once, in wait.
 */
#include "config.h"

#include "offload/nvme.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <xxhash.h>

#if STOW_HAVE_IO_URING
#include <liburing.h>
#endif
/* Memcheck cannot see the kernel write into buffers through io_uring; the
 * client request tells it (and costs nothing outside valgrind). */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef VALGRIND_MAKE_MEM_DEFINED
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)0)
#endif

#include "core/units.h"

/* clang-format off */
G_DEFINE_QUARK (stow-io-error-quark, stow_io_error)
/* clang-format on */

#define MAX_DIRS 64
#define MAX_REGS 64

/* --- removal from a signal handler -------------------------------------- */

/* Every live store's files and private directories, in fixed storage that
 * a signal handler may read while another thread frees a store: a slot is
 * claimed (0 -> 1), filled, published (2), and emptied (0) before its store
 * removes the files itself.  Paths that do not fit, or stores beyond the
 * slots, are still removed on a normal exit, only not from a handler. */
#define SIG_SLOTS    128
#define SIG_PATH_MAX 1024
typedef struct
{
  volatile gint state; /* 0 free, 1 being written, 2 live */
  char file[SIG_PATH_MAX];
  char dir[SIG_PATH_MAX];
} SigSlot;
static SigSlot sig_slots[SIG_SLOTS];

static int
sig_register (const char *file, const char *dir)
{
  if (strlen (file) >= SIG_PATH_MAX || strlen (dir) >= SIG_PATH_MAX)
    return -1;
  for (int i = 0; i < SIG_SLOTS; i++)
    if (g_atomic_int_compare_and_exchange (&sig_slots[i].state, 0, 1))
      {
        g_strlcpy (sig_slots[i].file, file, SIG_PATH_MAX);
        g_strlcpy (sig_slots[i].dir, dir, SIG_PATH_MAX);
        g_atomic_int_set (&sig_slots[i].state, 2);
        return i;
      }
  g_debug ("nvme store: over %d stores; %s is not removed on a signal",
           SIG_SLOTS, file);
  return -1;
}

static void
sig_unregister (int slot)
{
  if (slot >= 0)
    g_atomic_int_set (&sig_slots[slot].state, 0);
}

void
stow_nvme_remove_files_on_signal (void)
{
  /* unlink and rmdir only: both are async-signal-safe.  Open descriptors
   * keep the inodes until the process ends, so I/O in flight is harmless
   * and the space comes back when the process goes. */
  for (int i = 0; i < SIG_SLOTS; i++)
    if (g_atomic_int_get (&sig_slots[i].state) == 2)
      {
        unlink (sig_slots[i].file);
        rmdir (sig_slots[i].dir);
      }
}
/* io_uring refuses a registered buffer over 1 GiB (io_buffer_validate). */
#define MAX_REG_BYTES (1ull << 30)

enum
{
  BLOCK_EMPTY = 0, /* never written */
  BLOCK_PENDING,   /* a write is in flight */
  BLOCK_GOOD,
  BLOCK_BAD, /* its last write failed */
};

typedef struct
{
  char *name;
  guint64 bytes;
  guint64 start; /* logical offset, block-aligned */
  guint64 n_blocks;
  guint8 *state; /* (n_blocks) BLOCK_* */
  guint64 *sums; /* (n_blocks) XXH3 of each block's bytes */
  gboolean prepared;
} Tensor;

struct _StowNvmeRequest
{
  StowNvmeRequest *next; /* pending queue or free list */
  gboolean write;
  gboolean in_use;
  gboolean queued; /* on the pending queue: segments left to issue */
  gboolean done;
  guint tensor;
  guint64 offset, end; /* tensor-relative byte range */
  guint64 pos;         /* next byte to issue */
  guint8 *buf;         /* holds [offset, end) */
  guint inflight;      /* slots working for this request */
  int err;             /* first failure, negative errno */
  guint64 err_pos;
  const char *err_what;
};

typedef struct Slot Slot;
struct Slot
{
  Slot *next; /* free list or retry queue */
  StowNvmeRequest *req;
  guint8 *buf; /* where the next transfer goes */
  guint64 len; /* bytes left to transfer */
  guint64 file_off;
  guint file;
  guint64 pos;      /* tensor-relative start of the segment */
  guint8 *bounce;   /* this slot's 4 KiB page for unaligned tails */
  guint8 *user;     /* for a bounced tail: the caller's bytes */
  guint64 copy_len; /* ... and how many */
  gboolean bounced;
  StowNvmeFault fault;
  gboolean eof_next;
};

struct _StowNvmeStore
{
  StowNvmeEngine engine;
  guint64 block;
  guint64 stripe;
  guint qd;
  guint max_requests;
  gboolean checksum;
  gboolean direct;

  guint n_dirs;
  char *stale_note; /* what remove_stale found, or NULL */
  char **priv_dirs; /* (n_dirs) */
  char **paths;     /* (n_dirs) */
  int fds[MAX_DIRS];
  int sig_slot[MAX_DIRS];           /* in sig_slots, or -1 */
  guint64 prepared_bytes[MAX_DIRS]; /* file bytes reserved so far */

  GPtrArray *tensors; /* of Tensor* */
  guint64 logical_end;

  GMutex lock;
  GCond done_cond;
  GCond work_cond;
  StowNvmeRequest *reqs; /* (max_requests) */
  StowNvmeRequest *free_reqs;
  StowNvmeRequest *pending_head, *pending_tail;
  Slot *slots; /* (qd) */
  Slot *free_slots;
  Slot *retry_head, *retry_tail;
  guint8 *bounce_area; /* (qd * 4 KiB) */
  gboolean started;
  gboolean stopping;
  guint64 seq; /* operations issued */
  guint64 fault_seq;
  StowNvmeFault fault;

  GThread **threads;
  guint n_threads;

#if STOW_HAVE_IO_URING
  struct io_uring ring;
  gboolean ring_ok;
  gboolean fixed_files;
  gboolean sparse_bufs;
  int efd;
  guint64 efd_buf;
  gboolean sleeping;
  gboolean wake_armed;
  guint ring_inflight;
  guint64 fixed_ops; /* issued with a registered buffer */
  struct
  {
    guint8 *addr;
    guint64 len;
  } regs[MAX_REGS];
  guint n_regs;
#endif
};

static inline guint64
round_up (guint64 x, guint64 a)
{
  return (x + a - 1) / a * a;
}

const char *
stow_nvme_engine_name (StowNvmeEngine engine)
{
  switch (engine)
    {
    case STOW_NVME_ENGINE_IO_URING:
      return "io_uring";
    case STOW_NVME_ENGINE_THREADS:
      return "threads";
    case STOW_NVME_ENGINE_AUTO:
    default:
      return "auto";
    }
}

/* Logical offset -> (file, offset in file).  Stripe s goes to directory
 * s mod n, at row s div n of that file. */
static inline void
map_logical (StowNvmeStore *store, guint64 logical, guint *file,
             guint64 *file_off)
{
  guint64 s = logical / store->stripe;
  *file = (guint)(s % store->n_dirs);
  *file_off = (s / store->n_dirs) * store->stripe + logical % store->stripe;
}

/* --- the request queue (lock held) ------------------------------------- */

static void
pending_remove (StowNvmeStore *store, StowNvmeRequest *req)
{
  StowNvmeRequest **p = &store->pending_head, *prev = NULL;
  while (*p != NULL && *p != req)
    {
      prev = *p;
      p = &(*p)->next;
    }
  if (*p == NULL)
    return;
  *p = req->next;
  if (store->pending_tail == req)
    store->pending_tail = prev;
  req->next = NULL;
  req->queued = FALSE;
}

static void
request_finish_if_done (StowNvmeStore *store, StowNvmeRequest *req)
{
  if (req->inflight > 0 || req->queued || req->done)
    return;
  if (req->write)
    {
      Tensor *t = g_ptr_array_index (store->tensors, req->tensor);
      guint64 b0 = req->offset / store->block;
      guint64 b1 = (req->end + store->block - 1) / store->block;
      /* A failed write marks its whole range bad: which of its blocks
       * reached the disk is not known, so none of them may be trusted. */
      memset (t->state + b0, req->err ? BLOCK_BAD : BLOCK_GOOD, b1 - b0);
    }
  req->done = TRUE;
  g_cond_broadcast (&store->done_cond);
}

static void
request_fail (StowNvmeStore *store, StowNvmeRequest *req, int err, guint64 pos,
              const char *what)
{
  if (req->err == 0)
    {
      req->err = err;
      req->err_pos = pos;
      req->err_what = what;
    }
  if (req->queued)
    pending_remove (store, req);
}

static void
slot_release (StowNvmeStore *store, Slot *s)
{
  StowNvmeRequest *req = s->req;
  s->req = NULL;
  s->next = store->free_slots;
  store->free_slots = s;
  req->inflight--;
  request_finish_if_done (store, req);
}

static void
retry_push (StowNvmeStore *store, Slot *s)
{
  s->next = NULL;
  if (store->retry_tail)
    store->retry_tail->next = s;
  else
    store->retry_head = s;
  store->retry_tail = s;
}

/* Next operation to issue, or NULL.  A retried slot goes first; otherwise
 * the head request gives its next segment: one block, cut at the tensor's
 * end, where a tail that is not a multiple of 4 KiB goes through the slot's
 * bounce page so the caller's buffer needs no padding. */
static Slot *
take_slot (StowNvmeStore *store)
{
  while (store->retry_head != NULL)
    {
      Slot *s = store->retry_head;
      store->retry_head = s->next;
      if (store->retry_head == NULL)
        store->retry_tail = NULL;
      s->next = NULL;
      if (s->req->err == 0)
        return s;
      slot_release (store, s); /* its request failed meanwhile */
    }
  StowNvmeRequest *req = store->pending_head;
  if (req == NULL || store->free_slots == NULL)
    return NULL;
  Slot *s = store->free_slots;
  store->free_slots = s->next;
  s->next = NULL;

  Tensor *t = g_ptr_array_index (store->tensors, req->tensor);
  guint64 pos = req->pos;
  guint64 blk_end
      = MIN (pos / store->block * store->block + store->block, req->end);
  guint64 len = blk_end - pos;
  s->req = req;
  s->pos = pos;
  s->bounced = FALSE;
  s->eof_next = FALSE;
  guint64 logical = t->start + pos;
  if (len % STOW_NVME_ALIGN != 0 && len >= STOW_NVME_ALIGN)
    len &= ~(guint64)(STOW_NVME_ALIGN - 1);
  if (len % STOW_NVME_ALIGN != 0)
    {
      s->bounced = TRUE;
      s->user = req->buf + (pos - req->offset);
      s->copy_len = len;
      s->buf = s->bounce;
      s->len = STOW_NVME_ALIGN;
      if (req->write)
        {
          memcpy (s->bounce, s->user, len);
          memset (s->bounce + len, 0, STOW_NVME_ALIGN - len);
        }
    }
  else
    {
      s->buf = req->buf + (pos - req->offset);
      s->len = len;
    }
  map_logical (store, logical, &s->file, &s->file_off);
  req->pos += len;
  req->inflight++;
  if (req->pos == req->end)
    pending_remove (store, req);

  store->seq++;
  s->fault = STOW_NVME_FAULT_NONE;
  if (store->fault != STOW_NVME_FAULT_NONE && store->seq == store->fault_seq)
    {
      s->fault = store->fault;
      store->fault = STOW_NVME_FAULT_NONE;
    }
  return s;
}

/* One transfer of @s finished with @res (bytes, or negative errno). */
static void
complete_slot (StowNvmeStore *store, Slot *s, gint64 res)
{
  StowNvmeRequest *req = s->req;
  switch (s->fault)
    {
    case STOW_NVME_FAULT_EIO:
      res = -EIO;
      break;
    case STOW_NVME_FAULT_ENOSPC:
      res = -ENOSPC;
      break;
    case STOW_NVME_FAULT_SHORT_EOF:
      s->eof_next = TRUE;
      /* fall through */
    case STOW_NVME_FAULT_SHORT:
      /* Half, kept 4 KiB-aligned so the O_DIRECT retry stays legal; a
       * single page cannot be cut, so it transfers nothing (an EOF). */
      if (res > 0 && s->len >= 2 * STOW_NVME_ALIGN)
        res = (gint64)((s->len / 2) & ~(guint64)(STOW_NVME_ALIGN - 1));
      else if (res > 0 && s->eof_next)
        res = 0;
      break;
    case STOW_NVME_FAULT_NONE:
    default:
      if (s->eof_next && res > 0)
        res = 0;
      break;
    }
  s->fault = STOW_NVME_FAULT_NONE;

  if (res == -EINTR || res == -EAGAIN)
    {
      retry_push (store, s);
      return;
    }
  if (res < 0)
    {
      request_fail (store, req, (int)res, s->pos, NULL);
      slot_release (store, s);
      return;
    }
  if (res == 0)
    {
      request_fail (store, req, -EIO, s->pos,
                    req->write ? "the disk accepted no bytes"
                               : "unexpected end of file");
      slot_release (store, s);
      return;
    }
  if ((guint64)res < s->len)
    {
      /* A short transfer: carry on from where it stopped. */
      s->buf += res;
      s->len -= res;
      s->file_off += res;
      retry_push (store, s);
      return;
    }
  if (s->bounced && !req->write)
    memcpy (s->user, s->bounce, s->copy_len);
  slot_release (store, s);
}

/* --- the thread engine -------------------------------------------------- */

static gint64
slot_do_io (StowNvmeStore *store, Slot *s)
{
  for (;;)
    {
      ssize_t r = s->req->write ? pwrite (store->fds[s->file], s->buf, s->len,
                                          (off_t)s->file_off)
                                : pread (store->fds[s->file], s->buf, s->len,
                                         (off_t)s->file_off);
      if (r >= 0)
        return r;
      if (errno != EINTR)
        return -errno;
    }
}

static gpointer
worker_main (gpointer data)
{
  StowNvmeStore *store = data;
  g_mutex_lock (&store->lock);
  for (;;)
    {
      Slot *s = take_slot (store);
      if (s == NULL)
        {
          if (store->stopping)
            break;
          g_cond_wait (&store->work_cond, &store->lock);
          continue;
        }
      g_mutex_unlock (&store->lock);
      gint64 res = slot_do_io (store, s);
      g_mutex_lock (&store->lock);
      complete_slot (store, s, res);
      if (store->retry_head != NULL)
        g_cond_signal (&store->work_cond);
    }
  g_mutex_unlock (&store->lock);
  return NULL;
}

/* --- the io_uring engine ------------------------------------------------ */

#if STOW_HAVE_IO_URING
static int
reg_index (StowNvmeStore *store, const guint8 *buf, guint64 len)
{
  for (guint i = 0; i < store->n_regs; i++)
    if (buf >= store->regs[i].addr
        && buf + len <= store->regs[i].addr + store->regs[i].len)
      return (int)i;
  return -1;
}

static void
uring_prep (StowNvmeStore *store, Slot *s)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&store->ring);
  /* The ring has room for every slot plus the wake-up read. */
  g_assert (sqe != NULL);
  int fd = store->fixed_files ? (int)s->file : store->fds[s->file];
  int idx = reg_index (store, s->buf, s->len);
  if (idx >= 0)
    store->fixed_ops++;
  if (s->req->write)
    {
      if (idx >= 0)
        io_uring_prep_write_fixed (sqe, fd, s->buf, (unsigned)s->len,
                                   s->file_off, idx);
      else
        io_uring_prep_write (sqe, fd, s->buf, (unsigned)s->len, s->file_off);
    }
  else
    {
      if (idx >= 0)
        io_uring_prep_read_fixed (sqe, fd, s->buf, (unsigned)s->len,
                                  s->file_off, idx);
      else
        io_uring_prep_read (sqe, fd, s->buf, (unsigned)s->len, s->file_off);
    }
  if (store->fixed_files)
    sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data (sqe, s);
}

/* Fills the ring from the queue, submits the batch with one system call and
 * sleeps there until at least one completion arrives (no spinning); a
 * read on an eventfd wakes it when new requests come in while it sleeps.
 * With nothing in flight it sleeps on work_cond instead. */
static gpointer
uring_main (gpointer data)
{
  StowNvmeStore *store = data;
  gboolean warned = FALSE;
  g_mutex_lock (&store->lock);
  for (;;)
    {
      Slot *s;
      while ((s = take_slot (store)) != NULL)
        {
          uring_prep (store, s);
          store->ring_inflight++;
        }
      if (store->stopping && store->ring_inflight == 0
          && store->pending_head == NULL && store->retry_head == NULL)
        break;
      if (store->ring_inflight == 0)
        {
          /* Idle: sleep on the condition, not in the kernel.  (Valgrind
           * holds its big lock across io_uring_enter, so a thread parked
           * there with nothing in flight would never be woken.) */
          g_cond_wait (&store->work_cond, &store->lock);
          continue;
        }
      store->sleeping = TRUE;
      if (!store->wake_armed)
        {
          struct io_uring_sqe *sqe = io_uring_get_sqe (&store->ring);
          g_assert (sqe != NULL);
          io_uring_prep_read (sqe, store->efd, &store->efd_buf,
                              sizeof store->efd_buf, 0);
          io_uring_sqe_set_data (sqe, NULL);
          store->wake_armed = TRUE;
        }
      g_mutex_unlock (&store->lock);
      int ret = io_uring_submit_and_wait (&store->ring, 1);
      if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY
          && !warned)
        {
          g_warning ("nvme store: io_uring_submit_and_wait: %s",
                     g_strerror (-ret));
          warned = TRUE;
        }
      g_mutex_lock (&store->lock);
      store->sleeping = FALSE;
      struct io_uring_cqe *cqe;
      unsigned head, n = 0;
      io_uring_for_each_cqe (&store->ring, head, cqe)
      {
        n++;
        Slot *done = io_uring_cqe_get_data (cqe);
        if (done == NULL)
          {
            store->wake_armed = FALSE;
            continue;
          }
        store->ring_inflight--;
        if (cqe->res > 0 && !done->req->write)
          VALGRIND_MAKE_MEM_DEFINED (done->buf, cqe->res);
        complete_slot (store, done, cqe->res);
      }
      io_uring_cq_advance (&store->ring, n);
    }
  g_mutex_unlock (&store->lock);
  return NULL;
}

static void
uring_wake (StowNvmeStore *store)
{
  guint64 one = 1;
  if (store->sleeping)
    {
      ssize_t r = write (store->efd, &one, sizeof one);
      (void)r; /* a full counter still wakes the reader */
    }
}

static gboolean
uring_setup (StowNvmeStore *store, GError **error)
{
  /* Room for every slot and the wake-up read. */
  /* Completions are reaped only by this thread when it enters the
   * kernel, so it need not be interrupted to run them (5.19+). */
  int ret = io_uring_queue_init (store->qd + 1, &store->ring,
                                 IORING_SETUP_COOP_TASKRUN);
  if (ret == -EINVAL)
    ret = io_uring_queue_init (store->qd + 1, &store->ring, 0);
  if (ret < 0)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED,
                   "io_uring is not available here (io_uring_queue_init: "
                   "%s)",
                   g_strerror (-ret));
      return FALSE;
    }
  store->ring_ok = TRUE;
  store->efd = eventfd (0, EFD_CLOEXEC);
  if (store->efd < 0)
    {
      int e = errno;
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED,
                   "eventfd: %s", g_strerror (e));
      return FALSE;
    }
  store->fixed_files
      = io_uring_register_files (&store->ring, store->fds, store->n_dirs) == 0;
  /* A sparse table lets buffers be added later, while I/O is in flight. */
  ret = io_uring_register_buffers_sparse (&store->ring, MAX_REGS);
  store->sparse_bufs = ret == 0;
  if (ret < 0)
    g_debug ("nvme store: no registered buffers: %s", g_strerror (-ret));
  return TRUE;
}
#endif

static gboolean
engine_start (StowNvmeStore *store)
{
  if (store->started)
    return TRUE;
  store->started = TRUE;
#if STOW_HAVE_IO_URING
  if (store->engine == STOW_NVME_ENGINE_IO_URING)
    {
      store->n_threads = 1;
      store->threads = g_new0 (GThread *, 1);
      store->threads[0] = g_thread_new ("stow-uring", uring_main, store);
      return TRUE;
    }
#endif
  store->n_threads = store->qd;
  store->threads = g_new0 (GThread *, store->n_threads);
  for (guint i = 0; i < store->n_threads; i++)
    store->threads[i] = g_thread_new ("stow-io", worker_main, store);
  return TRUE;
}

static void
engine_kick (StowNvmeStore *store)
{
#if STOW_HAVE_IO_URING
  if (store->engine == STOW_NVME_ENGINE_IO_URING)
    uring_wake (store);
#endif
  g_cond_broadcast (&store->work_cond);
}

/* --- the store ---------------------------------------------------------- */

static gboolean
open_store_file (StowNvmeStore *store, guint i, gboolean want_direct,
                 GError **error)
{
  int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = open (store->paths[i], flags | (want_direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && errno == EINVAL && want_direct)
    {
      /* tmpfs and some FUSE filesystems refuse O_DIRECT at open. */
      g_unlink (store->paths[i]);
      fd = open (store->paths[i], flags, 0600);
      if (fd >= 0)
        {
          g_warning ("nvme store: %s refuses O_DIRECT; using buffered I/O "
                     "(slower, and it goes through the page cache)",
                     store->priv_dirs[i]);
          store->direct = FALSE;
        }
    }
  if (fd < 0)
    {
      int e = errno;
      g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                   "%s: cannot create: %s", store->paths[i], g_strerror (e));
      return FALSE;
    }
  if (fchmod (fd, 0600) != 0)
    g_debug ("fchmod %s: %s", store->paths[i], g_strerror (errno));
  store->fds[i] = fd;
  return TRUE;
}

/* Private directories a killed process left in @dir ("stowage-PID-XXXXXX"
 * whose PID no longer runs: kill -9 gives no chance to clean up): their
 * swap file and the directory go.  Only what this user may remove, only a
 * real directory (not a link) holding nothing but the swap file; a PID
 * that is alive, perhaps reused, is left alone. */
static void
remove_stale (StowNvmeStore *store, const char *dir)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name (d)) != NULL)
    {
      long pid = 0;
      char tail[8] = "";
      if (sscanf (name, "stowage-%ld-%6[A-Za-z0-9]", &pid, tail) != 2
          || strlen (tail) != 6 || pid <= 0 || pid == (long)getpid ()
          || (kill ((pid_t)pid, 0) == 0 || errno != ESRCH))
        continue;
      g_autofree char *path = g_build_filename (dir, name, NULL);
      struct stat st;
      if (lstat (path, &st) != 0 || !S_ISDIR (st.st_mode)
          || st.st_uid != geteuid ())
        continue;
      g_autofree char *file = g_build_filename (path, "store.swp", NULL);
      g_unlink (file);
      if (g_rmdir (path) != 0)
        continue;
      char *was = store->stale_note;
      store->stale_note
          = g_strdup_printf ("%s%sremoved %s (its process %ld is gone)",
                             was ? was : "", was ? "; " : "", path, pid);
      g_free (was);
    }
}

const char *
stow_nvme_store_get_note (StowNvmeStore *store)
{
  return store->stale_note;
}

StowNvmeStore *
stow_nvme_store_new (const StowNvmeOptions *opts, GError **error)
{
  g_return_val_if_fail (opts != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  guint n_dirs = opts->dirs ? g_strv_length ((char **)opts->dirs) : 0;
  guint64 block = opts->block_bytes ? opts->block_bytes : 1u << 20;
  guint64 stripe = opts->stripe_bytes ? opts->stripe_bytes : 4 * block;
  guint qd = opts->queue_depth ? opts->queue_depth : 32;
  guint max_req = opts->max_requests ? opts->max_requests : 64;
  if (n_dirs == 0 || n_dirs > MAX_DIRS)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "nvme store: %u directories given; need 1 to %u", n_dirs,
                   MAX_DIRS);
      return NULL;
    }
  if (block % STOW_NVME_ALIGN != 0 || block > (64u << 20))
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "nvme store: block size %" G_GUINT64_FORMAT
                   " must be a multiple of 4096 and at most 64 MiB",
                   block);
      return NULL;
    }
  if (stripe % block != 0)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "nvme store: stripe size %" G_GUINT64_FORMAT
                   " must be a multiple of the block size %" G_GUINT64_FORMAT,
                   stripe, block);
      return NULL;
    }
  if (qd > 1024)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "nvme store: queue depth %u is over 1024", qd);
      return NULL;
    }

  StowNvmeStore *store = g_new0 (StowNvmeStore, 1);
  store->block = block;
  store->stripe = stripe;
  store->qd = qd;
  store->max_requests = max_req;
  store->checksum = opts->checksum;
  store->direct = !opts->buffered;
  store->n_dirs = n_dirs;
  store->priv_dirs = g_new0 (char *, n_dirs + 1);
  store->paths = g_new0 (char *, n_dirs + 1);
  for (guint i = 0; i < MAX_DIRS; i++)
    store->fds[i] = -1, store->sig_slot[i] = -1;
  store->tensors = g_ptr_array_new ();
  g_mutex_init (&store->lock);
  g_cond_init (&store->done_cond);
  g_cond_init (&store->work_cond);
#if STOW_HAVE_IO_URING
  store->efd = -1;
#endif

  for (guint i = 0; i < n_dirs; i++)
    {
      remove_stale (store, opts->dirs[i]);
      g_autofree char *leaf
          = g_strdup_printf ("stowage-%ld-XXXXXX", (long)getpid ());
      char *tmpl = g_build_filename (opts->dirs[i], leaf, NULL);
      if (g_mkdtemp_full (tmpl, 0700) == NULL)
        {
          int e = errno;
          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e),
                       "nvme store: cannot make a private directory in "
                       "%s: %s",
                       opts->dirs[i], g_strerror (e));
          g_free (tmpl);
          stow_nvme_store_free (store);
          return NULL;
        }
      store->priv_dirs[i] = tmpl;
      store->paths[i] = g_build_filename (tmpl, "store.swp", NULL);
      store->sig_slot[i] = sig_register (store->paths[i], tmpl);
      if (!open_store_file (store, i, store->direct, error))
        {
          stow_nvme_store_free (store);
          return NULL;
        }
    }

  store->reqs = g_new0 (StowNvmeRequest, max_req);
  for (guint i = max_req; i-- > 0;)
    {
      store->reqs[i].next = store->free_reqs;
      store->free_reqs = &store->reqs[i];
    }
  store->slots = g_new0 (Slot, qd);
  store->bounce_area = g_aligned_alloc0 (qd, STOW_NVME_ALIGN, STOW_NVME_ALIGN);
  for (guint i = qd; i-- > 0;)
    {
      store->slots[i].bounce = store->bounce_area + (gsize)i * STOW_NVME_ALIGN;
      store->slots[i].next = store->free_slots;
      store->free_slots = &store->slots[i];
    }

  store->engine = STOW_NVME_ENGINE_THREADS;
#if STOW_HAVE_IO_URING
  if (opts->engine != STOW_NVME_ENGINE_THREADS)
    {
      g_autoptr (GError) local = NULL;
      if (uring_setup (store, &local))
        {
          store->engine = STOW_NVME_ENGINE_IO_URING;
          stow_nvme_store_register_buffer (store, store->bounce_area,
                                           (guint64)qd * STOW_NVME_ALIGN);
        }
      else if (opts->engine == STOW_NVME_ENGINE_IO_URING)
        {
          g_propagate_error (error, g_steal_pointer (&local));
          stow_nvme_store_free (store);
          return NULL;
        }
      else
        g_info ("nvme store: %s; using the thread engine", local->message);
    }
#else
  if (opts->engine == STOW_NVME_ENGINE_IO_URING)
    {
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_UNSUPPORTED,
                   "io_uring is not available: built without liburing");
      stow_nvme_store_free (store);
      return NULL;
    }
#endif
  return store;
}

void
stow_nvme_store_free (StowNvmeStore *store)
{
  if (store == NULL)
    return;
  g_mutex_lock (&store->lock);
  store->stopping = TRUE;
  engine_kick (store);
  g_cond_broadcast (&store->work_cond);
  g_mutex_unlock (&store->lock);
  for (guint i = 0; i < store->n_threads; i++)
    g_thread_join (store->threads[i]);
  g_free (store->threads);
#if STOW_HAVE_IO_URING
  g_debug ("nvme store: %" G_GUINT64_FORMAT " operations, %" G_GUINT64_FORMAT
           " with registered buffers",
           store->seq, store->fixed_ops);
  if (store->ring_ok)
    io_uring_queue_exit (&store->ring);
  if (store->efd >= 0)
    close (store->efd);
#endif
  for (guint i = 0; i < store->n_dirs; i++)
    {
      sig_unregister (store->sig_slot[i]);
      if (store->fds[i] >= 0)
        close (store->fds[i]);
      if (store->paths[i] != NULL && g_unlink (store->paths[i]) != 0
          && errno != ENOENT)
        g_warning ("nvme store: cannot remove %s: %s", store->paths[i],
                   g_strerror (errno));
      if (store->priv_dirs[i] != NULL && g_rmdir (store->priv_dirs[i]) != 0)
        g_warning ("nvme store: cannot remove %s: %s", store->priv_dirs[i],
                   g_strerror (errno));
    }
  g_strfreev (store->priv_dirs);
  g_strfreev (store->paths);
  g_free (store->stale_note);
  for (guint i = 0; i < store->tensors->len; i++)
    {
      Tensor *t = g_ptr_array_index (store->tensors, i);
      g_free (t->name);
      g_free (t->state);
      g_free (t->sums);
      g_free (t);
    }
  g_ptr_array_unref (store->tensors);
  g_free (store->reqs);
  g_free (store->slots);
  g_aligned_free (store->bounce_area);
  g_mutex_clear (&store->lock);
  g_cond_clear (&store->done_cond);
  g_cond_clear (&store->work_cond);
  g_free (store);
}

StowNvmeEngine
stow_nvme_store_get_engine (StowNvmeStore *store)
{
  return store->engine;
}

guint64
stow_nvme_store_get_block_bytes (StowNvmeStore *store)
{
  return store->block;
}

guint
stow_nvme_store_get_queue_depth (StowNvmeStore *store)
{
  return store->qd;
}

gboolean
stow_nvme_store_is_direct (StowNvmeStore *store)
{
  return store->direct;
}

guint
stow_nvme_store_get_n_dirs (StowNvmeStore *store)
{
  return store->n_dirs;
}

const char *
stow_nvme_store_get_private_dir (StowNvmeStore *store, guint i)
{
  g_return_val_if_fail (i < store->n_dirs, NULL);
  return store->priv_dirs[i];
}

const char *
stow_nvme_store_get_file (StowNvmeStore *store, guint i)
{
  g_return_val_if_fail (i < store->n_dirs, NULL);
  return store->paths[i];
}

guint
stow_nvme_store_add_tensor (StowNvmeStore *store, const char *name,
                            guint64 bytes)
{
  g_return_val_if_fail (store != NULL && name != NULL, G_MAXUINT);
  Tensor *t = g_new0 (Tensor, 1);
  t->name = g_strdup (name);
  t->bytes = bytes;
  t->n_blocks = MAX ((bytes + store->block - 1) / store->block, 1);
  g_mutex_lock (&store->lock);
  t->start = store->logical_end;
  store->logical_end += t->n_blocks * store->block;
  g_ptr_array_add (store->tensors, t);
  guint id = store->tensors->len - 1;
  g_mutex_unlock (&store->lock);
  return id;
}

guint64
stow_nvme_store_get_tensor_bytes (StowNvmeStore *store, guint tensor)
{
  g_return_val_if_fail (tensor < store->tensors->len, 0);
  return ((Tensor *)g_ptr_array_index (store->tensors, tensor))->bytes;
}

/* Bytes of the logical range [0, end) that land in directory @d. */
static guint64
dir_share (StowNvmeStore *store, guint64 end, guint d)
{
  guint64 full = end / store->stripe, rem = end % store->stripe;
  guint64 bytes = (full / store->n_dirs) * store->stripe;
  if (d < full % store->n_dirs)
    bytes += store->stripe;
  if (d == full % store->n_dirs)
    bytes += rem;
  return bytes;
}

gboolean
stow_nvme_store_prepare (StowNvmeStore *store, GError **error)
{
  g_return_val_if_fail (store != NULL, FALSE);
  guint64 need[MAX_DIRS];
  dev_t dev[MAX_DIRS];
  guint64 end = store->logical_end;
  for (guint d = 0; d < store->n_dirs; d++)
    {
      guint64 share = dir_share (store, end, d);
      need[d] = share > store->prepared_bytes[d]
                    ? share - store->prepared_bytes[d]
                    : 0;
      struct stat st;
      dev[d] = fstat (store->fds[d], &st) == 0 ? st.st_dev : 0;
    }
  /* Directories on one filesystem share its free space. */
  for (guint d = 0; d < store->n_dirs; d++)
    {
      guint64 fs_need = 0;
      for (guint e = 0; e < store->n_dirs; e++)
        if (dev[e] == dev[d])
          fs_need += need[e];
      struct statvfs sv;
      if (fs_need == 0 || fstatvfs (store->fds[d], &sv) != 0)
        continue;
      guint64 avail = (guint64)sv.f_bavail * sv.f_frsize;
      if (avail < fs_need)
        {
          char a[STOW_FORMAT_BUF], b[STOW_FORMAT_BUF];
          g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_SPACE,
                       "nvme store: %s needs %s for the store but only %s "
                       "is free",
                       store->priv_dirs[d],
                       stow_format_bytes_into (a, sizeof a, fs_need),
                       stow_format_bytes_into (b, sizeof b, avail));
          return FALSE;
        }
    }
  for (guint d = 0; d < store->n_dirs; d++)
    {
      if (need[d] == 0)
        continue;
      guint64 size = store->prepared_bytes[d] + need[d];
      /* Reserving the blocks now means a later write cannot meet a full
       * disk halfway through a step. */
      if (fallocate (store->fds[d], 0, (off_t)store->prepared_bytes[d],
                     (off_t)need[d])
          != 0)
        {
          int e = errno;
          if (e == ENOSPC)
            {
              g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_SPACE,
                           "nvme store: %s: no space for %" G_GUINT64_FORMAT
                           " more bytes",
                           store->paths[d], need[d]);
              return FALSE;
            }
          if (ftruncate (store->fds[d], (off_t)size) != 0)
            {
              e = errno;
              g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_FAILED,
                           "nvme store: %s: cannot grow to %" G_GUINT64_FORMAT
                           " bytes: %s",
                           store->paths[d], size, g_strerror (e));
              return FALSE;
            }
        }
      store->prepared_bytes[d] = size;
    }
  /* The per-block tables are made only now that the size has passed the
   * preflight. */
  g_mutex_lock (&store->lock);
  for (guint i = 0; i < store->tensors->len; i++)
    {
      Tensor *t = g_ptr_array_index (store->tensors, i);
      if (t->prepared)
        continue;
      t->state = g_try_new0 (guint8, t->n_blocks);
      t->sums = g_try_new0 (guint64, t->n_blocks);
      if (t->state == NULL || t->sums == NULL)
        {
          g_mutex_unlock (&store->lock);
          g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                       "nvme store: tensor \"%s\": no memory for the "
                       "table of its %" G_GUINT64_FORMAT " blocks",
                       t->name, t->n_blocks);
          return FALSE;
        }
      t->prepared = TRUE;
    }
  g_mutex_unlock (&store->lock);
  return TRUE;
}

void
stow_nvme_store_locate (StowNvmeStore *store, guint tensor, guint64 block,
                        const char **path, guint64 *file_offset)
{
  g_return_if_fail (tensor < store->tensors->len);
  Tensor *t = g_ptr_array_index (store->tensors, tensor);
  guint file;
  map_logical (store, t->start + block * store->block, &file, file_offset);
  *path = store->paths[file];
}

gboolean
stow_nvme_store_register_buffer (StowNvmeStore *store, void *addr,
                                 guint64 bytes)
{
  g_return_val_if_fail (store != NULL && addr != NULL, FALSE);
#if STOW_HAVE_IO_URING
  if (store->engine != STOW_NVME_ENGINE_IO_URING || !store->sparse_bufs)
    return FALSE;
  gboolean ok = TRUE;
  for (guint64 off = 0; off < bytes; off += MAX_REG_BYTES)
    {
      g_mutex_lock (&store->lock);
      guint idx = store->n_regs;
      g_mutex_unlock (&store->lock);
      if (idx >= MAX_REGS)
        return FALSE;
      struct iovec iov
          = { (guint8 *)addr + off, MIN (bytes - off, MAX_REG_BYTES) };
      __u64 tag = 0;
      int ret = io_uring_register_buffers_update_tag (&store->ring, idx, &iov,
                                                      &tag, 1);
      if (ret < 0)
        {
          g_debug ("nvme store: cannot register a buffer of %zu bytes: %s",
                   iov.iov_len, g_strerror (-ret));
          ok = FALSE;
          break;
        }
      g_mutex_lock (&store->lock);
      store->regs[idx].addr = iov.iov_base;
      store->regs[idx].len = iov.iov_len;
      store->n_regs = idx + 1;
      g_mutex_unlock (&store->lock);
    }
  return ok;
#else
  return FALSE;
#endif
}

void
stow_nvme_store_inject_fault (StowNvmeStore *store, guint64 nth,
                              StowNvmeFault fault)
{
  g_return_if_fail (store != NULL && nth > 0);
  g_mutex_lock (&store->lock);
  store->fault = fault;
  store->fault_seq = store->seq + nth;
  g_mutex_unlock (&store->lock);
}

/* --- the hot path --------------------------------------------------------- */

static int
submit (StowNvmeStore *store, gboolean write, guint tensor, guint64 offset,
        guint8 *buf, guint64 bytes, StowNvmeRequest **out)
{
  if (G_UNLIKELY (tensor >= store->tensors->len || buf == NULL || out == NULL
                  || ((guintptr)buf % STOW_NVME_ALIGN) != 0))
    return -EINVAL;
  Tensor *t = g_ptr_array_index (store->tensors, tensor);
  guint64 end = offset + bytes;
  if (G_UNLIKELY (!t->prepared || offset % store->block != 0 || end < offset
                  || end > t->bytes
                  || (end != t->bytes && end % store->block != 0)))
    return -EINVAL;
  guint64 b0 = offset / store->block;
  guint64 b1 = (end + store->block - 1) / store->block;
  if (write && store->checksum)
    for (guint64 b = b0; b < b1; b++)
      {
        guint64 s = b * store->block, e = MIN (s + store->block, t->bytes);
        t->sums[b] = XXH3_64bits (buf + (s - offset), e - s);
      }

  g_mutex_lock (&store->lock);
  if (G_UNLIKELY (store->stopping))
    {
      g_mutex_unlock (&store->lock);
      return -ESHUTDOWN;
    }
  StowNvmeRequest *req = store->free_reqs;
  if (G_UNLIKELY (req == NULL))
    {
      g_mutex_unlock (&store->lock);
      return -EAGAIN;
    }
  store->free_reqs = req->next;
  memset (req, 0, sizeof *req);
  req->in_use = TRUE;
  req->write = write;
  req->tensor = tensor;
  req->offset = req->pos = offset;
  req->end = end;
  req->buf = buf;
  *out = req;

  if (write)
    memset (t->state + b0, BLOCK_PENDING, b1 - b0);
  else
    for (guint64 b = b0; b < b1; b++)
      if (t->state[b] != BLOCK_GOOD)
        {
          /* Never hand out bytes that were not written whole. */
          req->err = -ENODATA;
          req->err_pos = b * store->block;
          req->done = TRUE;
          g_mutex_unlock (&store->lock);
          return 0;
        }
  if (bytes == 0)
    {
      req->done = TRUE;
      g_mutex_unlock (&store->lock);
      return 0;
    }
  req->queued = TRUE;
  if (store->pending_tail)
    store->pending_tail->next = req;
  else
    store->pending_head = req;
  store->pending_tail = req;
  engine_start (store);
  engine_kick (store);
  g_mutex_unlock (&store->lock);
  return 0;
}

int
stow_nvme_read_async (StowNvmeStore *store, guint tensor, guint64 offset,
                      void *buf, guint64 bytes, StowNvmeRequest **out)
{
  return submit (store, FALSE, tensor, offset, buf, bytes, out);
}

int
stow_nvme_write_async (StowNvmeStore *store, guint tensor, guint64 offset,
                       const void *buf, guint64 bytes, StowNvmeRequest **out)
{
  return submit (store, TRUE, tensor, offset, (guint8 *)buf, bytes, out);
}

static void
set_request_error (StowNvmeStore *store, StowNvmeRequest *req, int err,
                   guint64 pos, const char *what, GError **error)
{
  Tensor *t = g_ptr_array_index (store->tensors, req->tensor);
  guint64 block = pos / store->block;
  const char *path;
  guint64 file_off;
  stow_nvme_store_locate (store, req->tensor, block, &path, &file_off);
  const char *op = req->write ? "write" : "read";
  if (err == -ENODATA)
    g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_NO_DATA,
                 "nvme store: tensor \"%s\" block %" G_GUINT64_FORMAT
                 " holds no valid data (never written, or its last write "
                 "failed)",
                 t->name, block);
  else if (err == -EBADMSG)
    g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_CHECKSUM,
                 "nvme store: tensor \"%s\" block %" G_GUINT64_FORMAT
                 " (%s at offset %" G_GUINT64_FORMAT
                 "): checksum mismatch: the bytes read back differ from "
                 "those written",
                 t->name, block, path, file_off);
  else
    g_set_error (error, STOW_IO_ERROR,
                 err == -ENOSPC ? STOW_IO_ERROR_NO_SPACE : STOW_IO_ERROR_FAILED,
                 "nvme store: tensor \"%s\" block %" G_GUINT64_FORMAT
                 " (%s at offset %" G_GUINT64_FORMAT "): %s failed: %s",
                 t->name, block, path, file_off, op,
                 what ? what : g_strerror (-err));
}

gboolean
stow_nvme_request_wait (StowNvmeStore *store, StowNvmeRequest *req,
                        GError **error)
{
  g_return_val_if_fail (store != NULL && req != NULL && req->in_use, FALSE);
  g_mutex_lock (&store->lock);
  while (!req->done)
    g_cond_wait (&store->done_cond, &store->lock);
  g_mutex_unlock (&store->lock);

  int err = req->err;
  guint64 err_pos = req->err_pos;
  const char *what = req->err_what;
  if (err == 0 && !req->write && store->checksum)
    {
      /* Verified here, on the waiting thread, so the I/O thread only
       * moves bytes. */
      Tensor *t = g_ptr_array_index (store->tensors, req->tensor);
      for (guint64 s = req->offset; s < req->end; s += store->block)
        {
          guint64 e = MIN (s + store->block, req->end);
          if (XXH3_64bits (req->buf + (s - req->offset), e - s)
              != t->sums[s / store->block])
            {
              err = -EBADMSG;
              err_pos = s;
              break;
            }
        }
    }
  gboolean ok = err == 0;
  if (!ok)
    set_request_error (store, req, err, err_pos, what, error);

  g_mutex_lock (&store->lock);
  req->in_use = FALSE;
  req->next = store->free_reqs;
  store->free_reqs = req;
  g_mutex_unlock (&store->lock);
  return ok;
}

static gboolean
sync_io (StowNvmeStore *store, gboolean write, guint tensor, void *buf,
         GError **error)
{
  g_return_val_if_fail (store != NULL && tensor < store->tensors->len, FALSE);
  StowNvmeRequest *req;
  guint64 bytes = stow_nvme_store_get_tensor_bytes (store, tensor);
  int ret = submit (store, write, tensor, 0, buf, bytes, &req);
  if (ret < 0)
    {
      Tensor *t = g_ptr_array_index (store->tensors, tensor);
      g_set_error (error, STOW_IO_ERROR, STOW_IO_ERROR_INVALID,
                   "nvme store: tensor \"%s\": cannot start the %s: %s%s",
                   t->name, write ? "write" : "read", g_strerror (-ret),
                   t->prepared ? "" : " (call stow_nvme_store_prepare first)");
      return FALSE;
    }
  return stow_nvme_request_wait (store, req, error);
}

gboolean
stow_nvme_store_write (StowNvmeStore *store, guint tensor, const void *buf,
                       GError **error)
{
  return sync_io (store, TRUE, tensor, (void *)buf, error);
}

gboolean
stow_nvme_store_read (StowNvmeStore *store, guint tensor, void *buf,
                      GError **error)
{
  return sync_io (store, FALSE, tensor, buf, error);
}
