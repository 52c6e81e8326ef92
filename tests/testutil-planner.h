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

G_END_DECLS
