/* SPDX-License-Identifier: MIT
 *
 * executor/backends/sim.c: the simulator backend.  No data: op times come
 * from the cluster's FLOP rates and bandwidths (planner/schedule-cost.c,
 * the same numbers the time model uses) and buffers only count bytes
 * against a per-rank, per-tier capacity.
 */
#include "executor/backend.h"

typedef struct
{
  StowBackend parent;
  StowCluster *cluster;
  StowTraining training;
  guint64 capacity[STOW_N_TIERS];
  GHashTable *used; /* (rank * tiers + tier) -> guint64 bytes, boxed */
} SimBackend;

static double
sim_op_seconds (StowBackend *b, const StowProgram *p, const StowOp *op)
{
  SimBackend *s = (SimBackend *)b;
  return stow_schedule_op_seconds (s->cluster, &s->training, op);
}

static guint64 *
used_slot (SimBackend *s, guint rank, StowTier tier)
{
  gpointer key = GUINT_TO_POINTER (rank * STOW_N_TIERS + tier + 1);
  guint64 *v = g_hash_table_lookup (s->used, key);
  if (v == NULL)
    {
      v = g_new0 (guint64, 1);
      g_hash_table_insert (s->used, key, v);
    }
  return v;
}

static gboolean
sim_buffer_alloc (StowBackend *b, const StowBuffer *buf, GError **error)
{
  SimBackend *s = (SimBackend *)b;
  guint64 *used = used_slot (s, buf->rank, buf->tier);
  guint64 cap = s->capacity[buf->tier];
  if (cap > 0 && *used + buf->bytes > cap)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "%s \"%s\" (%" G_GUINT64_FORMAT
                   " B) on rank %u: %" G_GUINT64_FORMAT
                   " B in use of %" G_GUINT64_FORMAT " B",
                   stow_tier_name (buf->tier), buf->name, buf->bytes, buf->rank,
                   *used, cap);
      return FALSE;
    }
  *used += buf->bytes;
  return TRUE;
}

static void
sim_buffer_free (StowBackend *b, const StowBuffer *buf)
{
  SimBackend *s = (SimBackend *)b;
  guint64 *used = used_slot (s, buf->rank, buf->tier);
  *used -= MIN (*used, buf->bytes);
}

static void
sim_destroy (StowBackend *b)
{
  SimBackend *s = (SimBackend *)b;
  stow_cluster_unref (s->cluster);
  g_hash_table_unref (s->used);
  g_free (s);
}

static const StowBackendVtable sim_vtable = {
  "sim", sim_op_seconds, sim_buffer_alloc, sim_buffer_free, sim_destroy,
};

StowBackend *
stow_backend_sim_new (const StowCluster *cluster, const StowTraining *training,
                      const guint64 *capacity_bytes)
{
  g_return_val_if_fail (cluster != NULL && training != NULL, NULL);
  SimBackend *s = g_new0 (SimBackend, 1);
  s->parent.vt = &sim_vtable;
  s->cluster = stow_cluster_ref ((StowCluster *)cluster);
  s->training = *training;
  for (guint i = 0; capacity_bytes && i < STOW_N_TIERS; i++)
    s->capacity[i] = capacity_bytes[i];
  s->used = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  return &s->parent;
}
