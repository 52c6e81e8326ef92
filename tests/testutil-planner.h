/* SPDX-License-Identifier: MIT
 *
 * tests/testutil-planner.h: set-up shared by the planner tests (a catalog
 * model, a cluster from a spec, stowage's default training run).  Header
 * only, so the unit tests need not link tests/testutil.c.
 */
#pragma once

#include "hw/hw.h"
#include "models/model.h"
#include "planner/memory.h"
#include "planner/plan.h"
#include "planner/search.h"

G_BEGIN_DECLS

/* The catalog model @name; fails the test if there is none. */
static inline StowModel *
stow_test_model (const char *name)
{
  g_autoptr (GError) error = NULL;
  StowModel *m = stow_model_lookup (name, &error);
  g_assert_no_error (error);
  return m;
}

/* The cluster of @spec ("8xA100-80GB"); fails the test if it is refused. */
static inline StowCluster *
stow_test_cluster (const char *spec)
{
  g_autoptr (GError) error = NULL;
  StowCluster *c = stow_cluster_new_from_spec (spec, &error);
  g_assert_no_error (error);
  return c;
}

/* stowage's defaults for a training run, a layout and the options. */
static inline void
stow_test_defaults (StowTraining *t, StowLayout *l, StowMemOptions *o)
{
  stow_training_init (t);
  stow_layout_init (l);
  stow_mem_options_init (o);
}

/* A run as the calibration sources measured it: stowage's defaults, then
 * @precision, @seq tokens, eager attention with dropout, @engine and
 * @micro_batch sequences per GPU. */
static inline void
stow_test_eager_run (StowTraining *t, StowLayout *l, StowMemOptions *o,
                     StowPrecision precision, guint64 seq, StowEngine engine,
                     guint64 micro_batch)
{
  stow_test_defaults (t, l, o);
  t->precision = precision;
  t->seq_len = seq;
  t->flash_attention = FALSE;
  t->dropout = TRUE;
  l->engine = engine;
  l->micro_batch = micro_batch;
}

/* @p as the plan of these parts (NULL: a part's defaults), for tests that
 * hold the parts apart: TEST_PLAN (m, c, &t, &l, &o) is a pointer to a
 * plan that lives until the end of the enclosing block. */
static inline const StowPlan *
stow_test_plan (StowPlan *p, const StowModel *m, const StowCluster *c,
                const StowTraining *t, const StowLayout *l,
                const StowMemOptions *o)
{
  *p = stow_plan_of (m, c, t, l, o);
  return p;
}
#define TEST_PLAN(m, c, t, l, o)                                               \
  stow_test_plan (&(StowPlan){ 0 }, (m), (c), (t), (l), (o))

/* A search of @plan keeping the @max_keep fastest (0: all). */
static inline StowSearch *
test_search (const StowPlan *plan, StowPins pins, guint max_keep)
{
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = max_keep;
  return stow_search_run (plan, pins, &so);
}

/* @plan (a TEST_PLAN's) with the lowering's options @lower (NULL: the
 * defaults). */
static inline const StowPlan *
test_lower_plan (const StowPlan *plan, const StowLowerOptions *lower)
{
  if (lower != NULL)
    ((StowPlan *)plan)->lower = *lower;
  return plan;
}

/* stow_plan_resolve_resident on these parts, the resident count written
 * back into @l. */
static inline gboolean
test_resolve_resident (const StowModel *m, const StowCluster *c,
                       const StowTraining *t, StowLayout *l,
                       const StowMemOptions *o, GError **error)
{
  StowPlan p = stow_plan_of (m, c, t, l, o);
  if (!stow_plan_resolve_resident (&p, error))
    return FALSE;
  *l = p.layout;
  return TRUE;
}

G_END_DECLS
