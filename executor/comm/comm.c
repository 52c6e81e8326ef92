/* SPDX-License-Identifier: MIT
 *
 * executor/comm/comm.c: the transport-independent half of comm.h: argument
 * checks, the partition rule and the rank-order sum every deterministic
 * reduction ends in.  The transports are mpi.c and nccl.c.
 */
#include "executor/comm/comm-private.h"

#include "core/dtype.h" /* stow_f32_to_bf16: the one rounding */
#include "core/zero.h"

/* clang-format off */
G_DEFINE_QUARK (stow-comm-error-quark, stow_comm_error)
/* clang-format on */

guint64
stow_comm_partition_numel (guint64 count, int world, guint align)
{
  g_return_val_if_fail (world > 0, 0);
  return stow_partition_numel (count, (guint)world, align);
}

int
stow_comm_rank (const StowComm *c)
{
  return c->rank;
}

int
stow_comm_world_size (const StowComm *c)
{
  return c->world;
}

const char *
stow_comm_backend_name (const StowComm *c)
{
  return c->klass->name;
}

StowCommMode
stow_comm_mode (const StowComm *c)
{
  return c->mode;
}

void
stow_comm_set_mode (StowComm *c, StowCommMode mode)
{
  c->mode = mode;
}

static StowCommRequest *
start_ex (StowComm *c, StowCommOp op, const void *send, void *recv,
          guint64 count, guint64 align, gboolean accumulate, StowDtype dtype,
          int root, GError **error)
{
  static const char *const names[] = {
    [STOW_COMM_OP_ALL_REDUCE] = "all-reduce",
    [STOW_COMM_OP_REDUCE_SCATTER] = "reduce-scatter",
    [STOW_COMM_OP_ALL_GATHER] = "all-gather",
    [STOW_COMM_OP_BROADCAST] = "broadcast",
    [STOW_COMM_OP_BARRIER] = "barrier",
    [STOW_COMM_OP_ALL_TO_ALL] = "all-to-all",
  };
  if (op != STOW_COMM_OP_BARRIER && dtype != STOW_DTYPE_F32
      && dtype != STOW_DTYPE_BF16)
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                   "%s: dtype %s (fp32 or bf16 only)", names[op],
                   stow_dtype_nick (dtype));
      return NULL;
    }
  if (op == STOW_COMM_OP_BROADCAST && (root < 0 || root >= c->world))
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                   "broadcast: root %d out of range (%d ranks)", root,
                   c->world);
      return NULL;
    }
  if (c->klass->max_count != 0 && count > c->klass->max_count)
    {
      g_set_error (error, STOW_COMM_ERROR, STOW_COMM_ERROR_INVALID,
                   "%s: %" G_GUINT64_FORMAT
                   " elements, over %s's limit of %" G_GUINT64_FORMAT,
                   names[op], count, c->klass->name, c->klass->max_count);
      return NULL;
    }
  StowCommRequest *r = g_new0 (StowCommRequest, 1);
  *r = (StowCommRequest){
    .op = op,
    .mode = c->mode,
    .send = send,
    .recv = recv,
    .count = count,
    .part = stow_partition_numel (count, (guint)c->world, align),
    .accumulate = accumulate,
    .dtype = dtype,
    .root = root,
  };
  if (!c->klass->start (c, r, error))
    {
      g_free (r);
      return NULL;
    }
  return r;
}

static StowCommRequest *
start (StowComm *c, StowCommOp op, const void *send, void *recv, guint64 count,
       StowDtype dtype, int root, GError **error)
{
  return start_ex (c, op, send, recv, count, 1, FALSE, dtype, root, error);
}

StowCommRequest *
stow_comm_reduce_scatter_ex (StowComm *c, const void *send, void *recv,
                             guint64 count, guint64 align, gboolean accumulate,
                             StowDtype dtype, GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  g_return_val_if_fail (count == 0 || (send != NULL && recv != NULL), NULL);
  return start_ex (c, STOW_COMM_OP_REDUCE_SCATTER, send, recv, count, align,
                   accumulate, dtype, 0, error);
}

StowCommRequest *
stow_comm_all_to_all_ex (StowComm *c, const void *send, void *recv,
                         guint64 count, guint64 align, StowDtype dtype,
                         GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  g_return_val_if_fail (count == 0 || (send != NULL && recv != NULL), NULL);
  return start_ex (c, STOW_COMM_OP_ALL_TO_ALL, send, recv, count, align, FALSE,
                   dtype, 0, error);
}

StowCommRequest *
stow_comm_all_gather_ex (StowComm *c, const void *send, void *recv,
                         guint64 count, guint64 align, StowDtype dtype,
                         GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  g_return_val_if_fail (count == 0 || (send != NULL && recv != NULL), NULL);
  return start_ex (c, STOW_COMM_OP_ALL_GATHER, send, recv, count, align, FALSE,
                   dtype, 0, error);
}

StowCommRequest *
stow_comm_all_reduce (StowComm *c, void *buf, guint64 count, StowDtype dtype,
                      GError **error)
{
  g_return_val_if_fail (c != NULL && (buf != NULL || count == 0), NULL);
  return start (c, STOW_COMM_OP_ALL_REDUCE, buf, buf, count, dtype, 0, error);
}

StowCommRequest *
stow_comm_reduce_scatter (StowComm *c, const void *send, void *recv,
                          guint64 count, StowDtype dtype, GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  g_return_val_if_fail (count == 0 || (send != NULL && recv != NULL), NULL);
  return start (c, STOW_COMM_OP_REDUCE_SCATTER, send, recv, count, dtype, 0,
                error);
}

StowCommRequest *
stow_comm_all_gather (StowComm *c, const void *send, void *recv, guint64 count,
                      StowDtype dtype, GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  g_return_val_if_fail (count == 0 || (send != NULL && recv != NULL), NULL);
  return start (c, STOW_COMM_OP_ALL_GATHER, send, recv, count, dtype, 0, error);
}

StowCommRequest *
stow_comm_broadcast (StowComm *c, void *buf, guint64 count, StowDtype dtype,
                     int root, GError **error)
{
  g_return_val_if_fail (c != NULL && (buf != NULL || count == 0), NULL);
  return start (c, STOW_COMM_OP_BROADCAST, buf, buf, count, dtype, root, error);
}

StowCommRequest *
stow_comm_barrier (StowComm *c, GError **error)
{
  g_return_val_if_fail (c != NULL, NULL);
  return start (c, STOW_COMM_OP_BARRIER, NULL, NULL, 0, STOW_DTYPE_F32, 0,
                error);
}

gboolean
stow_comm_wait (StowComm *c, StowCommRequest *r, GError **error)
{
  g_return_val_if_fail (c != NULL && r != NULL, FALSE);
  gboolean ok = c->klass->wait (c, r, error);
  g_free (r);
  return ok;
}

gboolean
stow_comm_wait_all (StowComm *c, StowCommRequest **r, guint n, GError **error)
{
  gboolean ok = TRUE;
  for (guint i = 0; i < n; i++)
    if (!stow_comm_wait (c, r[i], ok ? error : NULL))
      ok = FALSE;
  return ok;
}

void
stow_comm_free (StowComm *c)
{
  if (c != NULL)
    c->klass->free (c);
}

guint8 *
stow_scratch_get (StowScratch *s, gsize bytes)
{
  if (bytes > s->bytes || s->p == NULL)
    {
      g_free (s->p);
      s->bytes = MAX (bytes, 1);
      s->p = g_malloc (s->bytes);
    }
  return s->p;
}

guint8 *
stow_comm_pad_copy (guint8 *dst, const void *src, gsize valid, gsize bytes)
{
  if (valid > 0)
    memcpy (dst, src, valid);
  memset (dst + valid, 0, bytes - valid);
  return dst;
}

void
stow_scratch_clear (StowScratch *s)
{
  g_clear_pointer (&s->p, g_free);
  s->bytes = 0;
}

/* Built for AVX-512, AVX2 and the baseline, picked at load (element-wise:
 * the same bits at every width). */
__attribute__ ((target_clones ("avx512f", "avx2", "default"))) void
stow_comm_add_bf16 (guint16 *acc, const guint16 *c, guint64 n)
{
#pragma omp simd
  for (guint64 i = 0; i < n; i++)
    acc[i] = stow_f32_to_bf16 (stow_bf16_to_f32 (acc[i])
                               + stow_bf16_to_f32 (c[i]));
}

/* acc[i] += c[i] for @n elements of @dtype, each sum rounded to it. */
static void
add_block (void *acc, const void *c, guint64 n, StowDtype dtype)
{
  if (dtype == STOW_DTYPE_BF16)
    {
      stow_comm_add_bf16 (acc, c, n);
      return;
    }
  float *a = acc;
  const float *b = c;
#pragma omp simd
  for (guint64 i = 0; i < n; i++)
    a[i] = a[i] + b[i];
}

void
stow_comm_sum_rank_order (void *out, const void *const *contributions, guint n,
                          guint64 count, StowDtype dtype)
{
  g_return_if_fail (n > 0);
  g_return_if_fail (dtype == STOW_DTYPE_F32 || dtype == STOW_DTYPE_BF16);
  /* Block by block: each element is still ((c0 + c1) + c2) + ..., rounded
   * to @dtype after each addition, while every loop runs over contiguous
   * elements (and vectorises).  The sums go straight into @out when it is
   * the first contribution and no other; else they are formed aside, so
   * that @out may be any of the contributions. */
  enum
  {
    BLOCK = 1024
  };
  gboolean in_place = out == contributions[0];
  for (guint q = 1; q < n; q++)
    in_place = in_place && contributions[q] != out;
  gsize es = stow_dtype_size (dtype);
  union
  {
    float f[BLOCK];
    guint16 h[BLOCK];
  } aside;
  void *block = dtype == STOW_DTYPE_F32 ? (void *)aside.f : (void *)aside.h;
  for (guint64 i0 = 0; i0 < count; i0 += BLOCK)
    {
      guint64 nb = MIN ((guint64)BLOCK, count - i0);
      void *acc = in_place ? (guint8 *)out + i0 * es : block;
      if (!in_place)
        memcpy (acc, (const guint8 *)contributions[0] + i0 * es, nb * es);
      for (guint q = 1; q < n; q++)
        add_block (acc, (const guint8 *)contributions[q] + i0 * es, nb, dtype);
      if (!in_place)
        memcpy ((guint8 *)out + i0 * es, acc, nb * es);
    }
}
