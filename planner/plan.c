/* SPDX-License-Identifier: MIT
 *
 * planner/plan.c: the plan value's defaults (planner/plan.h).
 */
#include "planner/plan.h"

#include <string.h>

void
stow_lower_options_init (StowLowerOptions *o)
{
  memset (o, 0, sizeof *o);
  o->resident_layers = G_MAXUINT;
}

void
stow_plan_init (StowPlan *p, const StowModel *model, const StowCluster *cluster)
{
  g_return_if_fail (p != NULL);
  memset (p, 0, sizeof *p);
  p->model = model;
  p->cluster = cluster;
  stow_training_init (&p->training);
  stow_layout_init (&p->layout);
  stow_mem_options_init (&p->mem);
  stow_lower_options_init (&p->lower);
}

StowPlan
stow_plan_of (const StowModel *model, const StowCluster *cluster,
              const StowTraining *training, const StowLayout *layout,
              const StowMemOptions *mem)
{
  StowPlan p;
  stow_plan_init (&p, model, cluster);
  if (training)
    p.training = *training;
  if (layout)
    p.layout = *layout;
  if (mem)
    p.mem = *mem;
  return p;
}
