/* SPDX-License-Identifier: MIT
 *
 * executor/backends/swap.c: the optimizer states on NVMe
 * (executor/backends/swap.h).
 */
#include "executor/backends/swap.h"

#include <string.h>

#include "offload/swapper.h"
#include "program/backend.h"

typedef struct
{
  guint64 first, count; /* of the rank's flat parameters */
} Chunk;

struct _StowStateSwap
{
  const StowTensorMap *map;
  guint n_sections; /* 3 (master, m, v) or 2 (m, v) */
  GArray *chunks;   /* Chunk, by the program's shard index */
  guint64 max_bytes;
  StowNvmeStore *store;
  StowSwapper *swapper; /* the chunks as its shards, and the ring */
  GMutex lock;
  char *dirs; /* for messages */
  StowNvmeFault fault;
  guint64 fault_nth;
};

static guint64
chunk_bytes (const StowStateSwap *sw, const Chunk *c)
{
  return c->count * sw->n_sections * 4;
}

static const Chunk *
chunk_at (const StowStateSwap *sw, guint i)
{
  return &g_array_index (sw->chunks, Chunk, i);
}

/* The chunks, from the program's host optimizer steps over them. */
static gboolean
find_chunks (StowStateSwap *sw, GError **error)
{
  const StowProgram *p = sw->map->p;
  guint64 total = stow_tensor_map_flat_numel (sw->map);
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->kind != STOW_OP_OPTIM_STEP || op->on_gpu || op->unit != STOW_NONE)
        continue;
      if (op->shard >= sw->chunks->len)
        g_array_set_size (sw->chunks, op->shard + 1);
      Chunk *c = &g_array_index (sw->chunks, Chunk, op->shard);
      c->first = op->first, c->count = op->count;
    }
  guint64 next = 0;
  for (guint i = 0; i < sw->chunks->len; i++)
    {
      const Chunk *c = chunk_at (sw, i);
      if (c->count == 0 || c->first != next)
        {
          g_set_error (
              error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
              "the program's optimizer chunks do not cover the "
              "parameters in order (chunk %u starts at %" G_GUINT64_FORMAT
              ", expected %" G_GUINT64_FORMAT ")",
              i, c->first, next);
          return FALSE;
        }
      next += c->count;
      sw->max_bytes = MAX (sw->max_bytes, chunk_bytes (sw, c));
    }
  if (next != total)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "the program's optimizer chunks cover %" G_GUINT64_FORMAT
                   " of %" G_GUINT64_FORMAT " parameters",
                   next, total);
      return FALSE;
    }
  return TRUE;
}

StowNvmeStore *
stow_swap_store_new (const StowSwapSetup *setup, const char *flag,
                     GError **error)
{
  if (setup->dirs == NULL || setup->dirs[0] == NULL)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "%s needs --nvme-dir", flag);
      return NULL;
    }
  StowNvmeOptions no = { 0 };
  no.dirs = setup->dirs;
  no.checksum = TRUE;
  return stow_nvme_store_new (&no, error);
}

StowStateSwap *
stow_state_swap_new (const StowTensorMap *map, const StowSwapSetup *setup,
                     GError **error)
{
  g_return_val_if_fail (map != NULL && setup != NULL, NULL);
  g_autoptr (StowStateSwap) sw = g_new0 (StowStateSwap, 1);
  g_mutex_init (&sw->lock);
  sw->map = map;
  sw->n_sections = map->p->master_weights ? 3 : 2;
  sw->chunks = g_array_new (FALSE, TRUE, sizeof (Chunk));
  sw->fault = setup->fault, sw->fault_nth = setup->fault_nth;
  if (!find_chunks (sw, error))
    return NULL;
  sw->store = stow_swap_store_new (setup, "--offload-optimizer nvme", error);
  if (sw->store == NULL)
    return NULL;
  sw->dirs = g_strjoinv (",", (char **)setup->dirs);
  g_autofree guint64 *sizes = g_new (guint64, sw->chunks->len);
  for (guint i = 0; i < sw->chunks->len; i++)
    sizes[i] = chunk_bytes (sw, chunk_at (sw, i));
  /* Every chunk starts as zeros: the moments of a fresh run. */
  StowSwapperOptions so = { .mode = STOW_SWAP_NVME,
                            .shard_sizes = sizes,
                            .n_shards = sw->chunks->len,
                            .store = sw->store,
                            .name_prefix = "optimizer chunk ",
                            .zero_fill = TRUE };
  sw->swapper = stow_swapper_new (&so, error);
  if (sw->swapper == NULL)
    return NULL;
  return g_steal_pointer (&sw);
}

void
stow_state_swap_free (StowStateSwap *sw)
{
  if (sw == NULL)
    return;
  /* The store first: freeing it unregisters the swap buffers from
   * io_uring before their pool is unmapped. */
  if (sw->store)
    stow_nvme_store_free (sw->store);
  if (sw->swapper)
    stow_swapper_free (sw->swapper);
  if (sw->chunks)
    g_array_unref (sw->chunks);
  g_free (sw->dirs);
  g_mutex_clear (&sw->lock);
  g_free (sw);
}

guint64
stow_state_swap_buffer_bytes (const StowStateSwap *sw)
{
  return stow_swapper_get_buffer_bytes (sw->swapper);
}

char *
stow_state_swap_describe (const StowStateSwap *sw)
{
  g_autofree char *buf
      = g_format_size_full (sw->max_bytes, G_FORMAT_SIZE_IEC_UNITS);
  g_autofree char *pool
      = stow_pinned_pool_describe (stow_swapper_get_pool (sw->swapper));
  guint n_ring = stow_swapper_get_n_buffers (sw->swapper);
  const char *stale = stow_nvme_store_get_note (sw->store);
  return g_strdup_printf (
      "optimizer states on NVMe: %u chunk%s in %s (%s, %s), %u swap buffer%s "
      "of %s; %s%s%s",
      sw->chunks->len, sw->chunks->len == 1 ? "" : "s", sw->dirs,
      stow_nvme_engine_name (stow_nvme_store_get_engine (sw->store)),
      stow_nvme_store_is_direct (sw->store) ? "O_DIRECT" : "buffered", n_ring,
      n_ring == 1 ? "" : "s", buf, pool, stale ? "; " : "", stale ? stale : "");
}

/* ---- the ring ------------------------------------------------------------ */

void *
stow_state_swap_take (StowStateSwap *sw, guint64 bytes, GError **error)
{
  if (bytes > sw->max_bytes)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "a swap buffer of %" G_GUINT64_FORMAT
                   " B; the largest chunk holds %" G_GUINT64_FORMAT " B",
                   bytes, sw->max_bytes);
      return NULL;
    }
  void *got = stow_swapper_take_buffer (sw->swapper);
  if (got == NULL)
    g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                 "the program holds more than %u swap buffers at once",
                 stow_swapper_get_n_buffers (sw->swapper));
  return got;
}

void
stow_state_swap_give (StowStateSwap *sw, void *buf)
{
  stow_swapper_give_buffer (sw->swapper, buf);
}

/* ---- I/O -------------------------------------------------------------------
 */

static gboolean
check_chunk (StowStateSwap *sw, guint chunk, guint64 bytes, GError **error)
{
  if (chunk < sw->chunks->len
      && chunk_bytes (sw, chunk_at (sw, chunk)) == bytes)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
               "optimizer chunk %u of %" G_GUINT64_FORMAT
               " B: the program has %u chunks%s",
               chunk, bytes, sw->chunks->len,
               chunk < sw->chunks->len ? " of other sizes" : "");
  return FALSE;
}

/* Tests' fault, armed at the first I/O of a step. */
static void
arm_fault (StowStateSwap *sw)
{
  g_mutex_lock (&sw->lock);
  if (sw->fault != STOW_NVME_FAULT_NONE)
    {
      stow_nvme_store_inject_fault (sw->store, sw->fault_nth, sw->fault);
      sw->fault = STOW_NVME_FAULT_NONE;
    }
  g_mutex_unlock (&sw->lock);
}

gboolean
stow_state_swap_read (StowStateSwap *sw, guint chunk, void *buf, guint64 bytes,
                      GError **error)
{
  if (!check_chunk (sw, chunk, bytes, error))
    return FALSE;
  arm_fault (sw);
  return stow_swapper_read (sw->swapper, chunk, buf, error);
}

gboolean
stow_state_swap_write (StowStateSwap *sw, guint chunk, const void *buf,
                       guint64 bytes, GError **error)
{
  if (!check_chunk (sw, chunk, bytes, error))
    return FALSE;
  return stow_swapper_write (sw->swapper, chunk, buf, error);
}

/* ---- the update
 * -------------------------------------------------------------- */

gboolean
stow_state_swap_update (StowStateSwap *sw, StowAdam *adam,
                        const StowAdamStep *step, double lr, guint64 first,
                        guint64 count, void *buf, GError **error)
{
  const StowTensorMap *m = sw->map;
  const StowProgram *p = m->p;
  const gsize gsz = stow_dtype_size (p->grad_dtype);
  const guint8 *grads = m->addr[m->host_grads_buf];
  float *f = buf;
  float *master = sw->n_sections == 3 ? f : NULL;
  float *mom = f + (sw->n_sections - 2) * count;
  float *vel = mom + count;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      /* Where the rank's elements [pf, pf + pv) of the unit are among its
       * flat parameters (the host buffers' and the chunks' layout). */
      guint64 pf = 0, pv = 0;
      guint64 u0 = stow_tensor_map_flat_unit (m, ui, &pf, &pv);
      if (u0 >= first + count || u0 + pv <= first)
        continue;
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, u->first_tensor + k);
          guint64 e0 = MAX (t->offset, pf);
          guint64 e1 = MIN (t->offset + t->numel, pf + pv);
          if (e0 >= e1)
            continue;
          guint64 t0 = u0 + (e0 - pf);
          guint64 lo = MAX (t0, first),
                  hi = MIN (t0 + (e1 - e0), first + count);
          if (lo >= hi)
            continue;
          StowAdamConfig cfg;
          stow_tensor_map_adam_config (m, ui, k, lr, &cfg);
          StowAdamTensor at = { 0 };
          at.m = mom + (lo - first);
          at.v = vel + (lo - first);
          at.grad = grads + lo * gsz;
          at.grad_type = p->grad_dtype;
          at.n = hi - lo;
          if (master != NULL)
            {
              at.param = master + (lo - first);
              at.param_out = m->host_weights + lo * m->esize;
              at.out_type = m->ftype;
            }
          else
            {
              at.param = (float *)m->host_weights + lo;
              at.out_type = STOW_DTYPE_NONE;
            }
          if (!stow_adam_step (adam, &cfg, step, &at, error))
            return FALSE;
        }
    }
  return TRUE;
}

/* ---- outside a step --------------------------------------------------------
 */

gboolean
stow_state_swap_access (StowStateSwap *sw, gboolean write, guint unit,
                        guint which, guint64 first, guint64 n, float *data,
                        GError **error)
{
  g_return_val_if_fail (which < 3 && (which > 0 || sw->n_sections == 3), FALSE);
  guint64 pf = 0, pv = 0;
  guint64 at = stow_tensor_map_flat_unit (sw->map, unit, &pf, &pv);
  if (first < pf || first + n > pf + pv)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
                   "optimizer states [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                   ") of unit %u: this rank holds [%" G_GUINT64_FORMAT
                   ", %" G_GUINT64_FORMAT ")",
                   first, first + n, unit, pf, pf + pv);
      return FALSE;
    }
  at += first - pf;
  guint sec = which - (3 - sw->n_sections);
  /* Chunks are in order: find the first that holds @at. */
  guint c = 0;
  while (c + 1 < sw->chunks->len && chunk_at (sw, c + 1)->first <= at)
    c++;
  while (n > 0)
    {
      const Chunk *ch = chunk_at (sw, c);
      guint64 off = at - ch->first;
      guint64 piece = MIN (n, ch->count - off);
      /* A chunk holds its sections one after the other, fp32. */
      if (!stow_swapper_access (sw->swapper, write, c,
                                ((guint64)sec * ch->count + off) * 4, piece * 4,
                                data, error))
        return FALSE;
      data += piece, at += piece, n -= piece;
      c++;
    }
  return TRUE;
}

gboolean
stow_state_swap_flush (StowStateSwap *sw, GError **error)
{
  return stow_swapper_flush (sw->swapper, error);
}
