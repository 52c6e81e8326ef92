/* SPDX-License-Identifier: MIT
 *
 * planner/resident.c: how many streamed layers stay on the device, decided
 * in this one place.  With --offload-params every layer's weights live off
 * the device and two slots rotate; whatever the device budget leaves
 * after the memory model's peak holds further layers whole, which then
 * need no transfer.  The memory model, the time model, the lowering and
 * the plan file all read the decided count from the layout.
 */
#include "planner/memory.h"

#include "planner/memory-private.h"
#include "planner/plan.h"

gboolean
stow_mem_resolve_resident (const StowModel *m, const StowCluster *c,
                           const StowTraining *t, StowLayout *l,
                           const StowMemOptions *o, GError **error)
{
  g_return_val_if_fail (m != NULL && c != NULL && t != NULL && l != NULL,
                        FALSE);
  /* Only stowage's own engine keeps streamed layers resident; DeepSpeed
   * and FSDP fetch every offloaded layer. */
  if (l->offload_params == STOW_OFFLOAD_NONE || l->engine != STOW_ENGINE_STOWAGE
      || l->resident_layers != STOW_RESIDENT_AUTO)
    return TRUE;
  StowMemOptions defaults;
  if (o == NULL)
    stow_mem_options_init (&defaults), o = &defaults;
  StowLayout none = *l;
  none.resident_layers = 0;
  StowMemTotals mt;
  if (!stow_mem_estimate_totals (m, c, t, &none, o, NULL, &mt, error))
    return FALSE;
  l->resident_layers
      = (guint)stow_mem_resident_from_totals (m, t, l, o, &mt, NULL);
  return TRUE;
}

gboolean
stow_plan_resolve_resident (StowPlan *p, GError **error)
{
  g_return_val_if_fail (p != NULL, FALSE);
  return stow_mem_resolve_resident (p->model, p->cluster, &p->training,
                                    &p->layout, &p->mem, error);
}

guint64
stow_mem_resident_from_totals (const StowModel *m, const StowTraining *t,
                               const StowLayout *l, const StowMemOptions *o,
                               const StowMemTotals *mt, StowMemScratch *scratch)
{
  /* The device's tensor budget: the capacity less what is not tensors
   * (context, workspaces, NCCL), less the allocator's slack on what the
   * tensors take; the same budget the lowering checks against. */
  guint64 reserved = mt->allocated_peak_bytes
                     + stow_bytes (mt->allocated_peak_bytes, o->fragmentation);
  guint64 non_tensor
      = mt->total_bytes > reserved ? mt->total_bytes - reserved : 0;
  guint64 cap
      = mt->capacity_bytes > non_tensor ? mt->capacity_bytes - non_tensor : 0;
  guint64 budget = (guint64)((double)cap / (1.0 + o->fragmentation));
  guint64 free_b = budget > mt->allocated_peak_bytes
                       ? budget - mt->allocated_peak_bytes
                       : 0;
  /* A layer in compute precision, as the slots and the memory model's
   * "resident layers" hold it. */
  double w, g, master, opt;
  stow_mem_state_bytes (m, t, &w, &g, &master, &opt);
  guint64 layer_bytes = stow_bytes (
      stow_mem_largest_layer_params_on_gpu (m, l, scratch), MIN (w, 2.0));
  guint64 most = 0;
  g_autofree guint64 *counts = g_new0 (guint64, l->pp);
  stow_layout_stage_layers (l, m->n_layers, counts);
  for (guint s = 0; s < l->pp; s++)
    most = MAX (most, counts[s]);
  if (layer_bytes == 0)
    return most;
  return MIN (most, free_b / layer_bytes);
}
