/* SPDX-License-Identifier: MIT
 *
 * planner/memory-private.h: helpers shared by the memory model
 * (memory.c) and the peer conventions (conventions.c).
 */
#pragma once

#include "planner/memory.h"

GArray *stow_mem_terms_new (void);
GArray *stow_mem_sink_new (void);
void stow_mem_add (GArray *terms, const char *name, guint64 bytes,
                   StowTier tier, const char *format, ...) G_GNUC_PRINTF (5, 6);
guint64 stow_mem_sum (GArray *terms, int tier);
guint64 stow_bytes (guint64 count, double bytes_per);
StowMemory *stow_memory_alloc (guint n_stages);
void stow_memory_finish (StowMemory *mem, const StowCluster *c,
                         const StowMemOptions *o);
StowMemory *
stow_memory_estimate_convention (const StowModel *m, const StowCluster *c,
                                 const StowTraining *t, const StowLayout *l,
                                 const StowMemOptions *o, GError **error);
