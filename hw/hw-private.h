/* SPDX-License-Identifier: MIT
 *
 * hw/hw-private.h: helpers shared by the files of the hw room and not part
 * of its contract: name folding, catalog lookups without errors, and the
 * reader of node objects that both the presets and cluster.json use.
 */
#pragma once

#include <json-glib/json-glib.h>

#include "hw/hw.h"

G_BEGIN_DECLS

/* Lower case with ' ' and '_' turned into '-'.  Free with g_free. */
char *stow_hw_fold_name (const char *name);
/* Exact (folded) match of a name or alias; NULL when none. */
const StowGpu *stow_hw_gpu_find (const char *name);
/* The catalog entry for a device name as CUDA, NVML or ROCm report it
 * ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB"); NULL when none. */
const StowGpu *stow_hw_gpu_find_device (const char *device_name);
/* "A10, A100-40GB, ..." for messages. */
char *stow_hw_gpu_names (void);

/* Applies the members of a node object (a preset file, or the top of a
 * cluster.json) onto @node.  With @preset every member a preset needs must
 * be present; otherwise members are overrides and cluster-only members
 * ("preset", "nodes", "profile") are accepted and skipped here. */
gboolean stow_hw_node_from_json (JsonObject *obj, const char *where,
                                 gboolean preset, StowNode *node,
                                 GError **error);

G_END_DECLS
