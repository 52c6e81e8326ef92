/* SPDX-License-Identifier: MIT
 *
 * executor/backends/param-swap.c: the weights on NVMe
 * (executor/backends/param-swap.h).
 */
#include "executor/backends/param-swap.h"

#include "core/zero.h"

#include <string.h>
#include <xxhash.h>

#include "program/backend.h"

struct _StowParamSwap
{
  const StowTensorMap *map;
  StowNvmeStore *store;
  guint n_units;
  guint64 *bytes;    /* [unit] */
  gboolean *written; /* [unit]: stored at least once */
  char *dirs;        /* for messages */
  GMutex lock;
  StowNvmeFault fault;
  guint64 fault_nth;
  /* outside a step: one unit */
  guint8 *cache;
  guint cached; /* G_MAXUINT: none */
  XXH64_hash_t cached_hash;
};

StowParamSwap *
stow_param_swap_new (const StowTensorMap *map, const StowSwapSetup *setup,
                     GError **error)
{
  g_return_val_if_fail (map != NULL && setup != NULL, NULL);
  const StowProgram *p = map->p;
  g_autoptr (StowParamSwap) ps = g_new0 (StowParamSwap, 1);
  g_mutex_init (&ps->lock);
  ps->map = map;
  ps->cached = G_MAXUINT;
  ps->fault = setup->fault, ps->fault_nth = setup->fault_nth;
  ps->n_units = p->units->len;
  ps->bytes = g_new0 (guint64, MAX (ps->n_units, 1));
  ps->written = g_new0 (gboolean, MAX (ps->n_units, 1));
  ps->store = stow_swap_store_new (setup, "--offload-params nvme", error);
  if (ps->store == NULL)
    return NULL;
  ps->dirs = g_strjoinv (",", (char **)setup->dirs);
  guint64 most = 0;
  for (guint u = 0; u < ps->n_units; u++)
    {
      const StowUnit *unit = &g_array_index (p->units, StowUnit, u);
      /* On several ranks, the rank's partition of the unit (core/zero.h's,
       * padding included). */
      ps->bytes[u]
          = (map->dp > 1 ? stow_zero_part (unit->numel, map->dp) : unit->numel)
            * map->esize;
      most = MAX (most, ps->bytes[u]);
      g_autofree char *name = g_strdup_printf ("weights of unit %u", u);
      guint id = stow_nvme_store_add_tensor (ps->store, name, ps->bytes[u]);
      g_assert (id == u);
    }
  if (!stow_nvme_store_prepare (ps->store, error))
    return NULL;
  ps->cache = g_aligned_alloc0 (1, MAX (most, 1), STOW_NVME_ALIGN);
  return g_steal_pointer (&ps);
}

void
stow_param_swap_free (StowParamSwap *ps)
{
  if (ps == NULL)
    return;
  if (ps->store)
    stow_nvme_store_free (ps->store);
  g_aligned_free (ps->cache);
  g_free (ps->bytes);
  g_free (ps->written);
  g_free (ps->dirs);
  g_mutex_clear (&ps->lock);
  g_free (ps);
}

char *
stow_param_swap_describe (const StowParamSwap *ps)
{
  const char *stale = stow_nvme_store_get_note (ps->store);
  return g_strdup_printf (
      "weights on NVMe: %u unit%s in %s (%s, %s)%s%s", ps->n_units,
      ps->n_units == 1 ? "" : "s", ps->dirs,
      stow_nvme_engine_name (stow_nvme_store_get_engine (ps->store)),
      stow_nvme_store_is_direct (ps->store) ? "O_DIRECT" : "buffered",
      stale ? "; " : "", stale ? stale : "");
}

static gboolean
check_unit (StowParamSwap *ps, guint unit, GError **error)
{
  if (unit < ps->n_units)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
               "the weights of unit %u: the program has %u units", unit,
               ps->n_units);
  return FALSE;
}

gboolean
stow_param_swap_read (StowParamSwap *ps, guint unit, void *buf, GError **error)
{
  if (!check_unit (ps, unit, error))
    return FALSE;
  g_mutex_lock (&ps->lock);
  if (ps->fault != STOW_NVME_FAULT_NONE)
    {
      /* Tests' fault, armed at the first read of a step. */
      stow_nvme_store_inject_fault (ps->store, ps->fault_nth, ps->fault);
      ps->fault = STOW_NVME_FAULT_NONE;
    }
  gboolean written = ps->written[unit];
  g_mutex_unlock (&ps->lock);
  if (!written)
    {
      memset (buf, 0, ps->bytes[unit]);
      return TRUE;
    }
  return stow_nvme_store_read (ps->store, unit, buf, error);
}

gboolean
stow_param_swap_write (StowParamSwap *ps, guint unit, const void *buf,
                       GError **error)
{
  if (!check_unit (ps, unit, error))
    return FALSE;
  if (!stow_nvme_store_write (ps->store, unit, buf, error))
    return FALSE;
  g_mutex_lock (&ps->lock);
  ps->written[unit] = TRUE;
  g_mutex_unlock (&ps->lock);
  return TRUE;
}

void *
stow_param_swap_unit (StowParamSwap *ps, guint unit, GError **error)
{
  if (ps->cached == unit)
    return ps->cache;
  if (!check_unit (ps, unit, error) || !stow_param_swap_flush (ps, error))
    return NULL;
  if (ps->written[unit])
    {
      if (!stow_nvme_store_read (ps->store, unit, ps->cache, error))
        return NULL;
    }
  else
    memset (ps->cache, 0, ps->bytes[unit]);
  ps->cached = unit;
  ps->cached_hash = XXH3_64bits (ps->cache, ps->bytes[unit]);
  return ps->cache;
}

gboolean
stow_param_swap_flush (StowParamSwap *ps, GError **error)
{
  if (ps->cached == G_MAXUINT)
    return TRUE;
  guint u = ps->cached;
  ps->cached = G_MAXUINT;
  if (ps->written[u]
      && XXH3_64bits (ps->cache, ps->bytes[u]) == ps->cached_hash)
    return TRUE;
  return stow_param_swap_write (ps, u, ps->cache, error);
}
