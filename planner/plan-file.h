/* SPDX-License-Identifier: MIT
 *
 * planner/plan-file.h: stowage's own plan file ("format": "stowage-plan",
 * "version": 1): the model (enough to reload it), the cluster (as a
 * cluster.json object), training, layout, memory options, the predicted
 * memory and the streaming parameters the executor needs.  Written and read
 * by this one module, so the planner and the executor cannot disagree on it.
 */
#pragma once

#include <json-glib/json-glib.h>

#include "planner/memory.h"

G_BEGIN_DECLS

#define STOW_PLAN_FILE_FORMAT  "stowage-plan"
#define STOW_PLAN_FILE_VERSION 1

/* How the executor streams and swaps the layout (the plan file's
 * "schedule" section): what stays on the GPU, how far ahead layers are
 * fetched, the swap buffers and the NVMe I/O shape. */
typedef struct
{
  guint64 resident_layers;      /* per pipeline rank, kept on the GPU; the
                                   rest stream through two slots */
  guint prefetch_depth;         /* layers fetched ahead (0: nothing streamed) */
  guint optimizer_swap_buffers; /* NVMe optimizer swap (0 without) */
  guint param_swap_buffers;     /* NVMe parameter swap (0 without) */
  guint64 param_buffer_elems;   /* elements per parameter swap buffer */
  char **nvme_paths;            /* NULL-terminated; empty without NVMe */
  guint io_queue_depth;         /* io_uring submission queue depth */
  guint64 io_block_bytes;       /* bytes per NVMe request */
} StowPlanStreaming;

/* Where NVMe swap files go when neither the cluster nor --nvme-path names
 * a directory (DeepSpeed's own examples use it): a placeholder the user
 * must replace, which emitted configs warn about. */
#define STOW_PLAN_NVME_PLACEHOLDER "/local_nvme"

/* TRUE when @streaming's swap directory is the placeholder (written so, or
 * read back from a plan that was). */
gboolean
stow_plan_streaming_nvme_placeholder (const StowPlanStreaming *streaming);

/* Derives the streaming of @layout from its memory: resident layers fill
 * the peak stage's headroom, buffer counts and I/O shape follow DeepSpeed's
 * defaults (offload_config.py, aio).  @nvme_path (may be NULL) overrides
 * the cluster's drive paths. */
void stow_plan_streaming_init (StowPlanStreaming *s, const StowModel *model,
                               const StowCluster *cluster,
                               const StowLayout *layout, const StowMemory *mem,
                               const char *nvme_path);
void stow_plan_streaming_clear (StowPlanStreaming *s);

typedef struct
{
  StowModel *model;     /* owned */
  StowCluster *cluster; /* owned */
  StowTraining training;
  StowLayout layout;
  StowMemOptions mem_options;
  StowPlanStreaming streaming; /* the file's "schedule" section */
  /* From a file that was read: the totals it predicted (0 if absent). */
  guint64 predicted_device_bytes, predicted_host_bytes, predicted_nvme_bytes;
} StowPlanFile;

/* A plan for @layout: copies the settings and refs @model and @cluster;
 * the streaming comes from stow_plan_streaming_init on @mem. */
StowPlanFile *stow_plan_file_new (StowModel *model, StowCluster *cluster,
                                  const StowTraining *training,
                                  const StowLayout *layout,
                                  const StowMemOptions *options,
                                  const StowMemory *mem, const char *nvme_path);
void stow_plan_file_free (StowPlanFile *plan);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowPlanFile, stow_plan_file_free)

/* The layout's members from dp to grad_accum, as the plan file and the
 * reports' "layout" objects spell them (names of docs/json.md). */
void stow_layout_json_members (JsonBuilder *b, const StowLayout *layout);

/* The plan as JSON, with @mem's terms as the predicted memory.  A model
 * read from a config.json is embedded ("config") so the plan reloads
 * without the file. */
JsonNode *stow_plan_file_to_json (const StowPlanFile *plan,
                                  const StowMemory *mem);
/* Written atomically (STOW_CORE_ERROR_IO on failure, nothing left). */
gboolean stow_plan_file_write (const StowPlanFile *plan, const StowMemory *mem,
                               const char *path, GError **error);

/* Reads and validates a plan: every field is checked and errors name the
 * file and the field ("plan.json: layout.tp: expected ...").  Fails with
 * STOW_CORE_ERROR_* for I/O and JSON types, STOW_PLAN_ERROR_* for values
 * and layouts that cannot run, and the model or hardware room's errors
 * for a model or cluster that does not load. */
StowPlanFile *stow_plan_file_read (const char *path, GError **error);
StowPlanFile *stow_plan_file_from_data (const char *data, gssize len,
                                        const char *name, GError **error);
StowPlanFile *stow_plan_file_from_json (JsonNode *root, const char *name,
                                        GError **error);

G_END_DECLS
