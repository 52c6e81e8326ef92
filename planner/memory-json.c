/* SPDX-License-Identifier: MIT
 *
 * planner/memory-json.c: the one writer of a StowMemory as JSON.  The
 * reports and the plan file name its figures differently (both names are
 * contracts: docs/json.md, docs/plan-file.md), so each figure is listed
 * once below with its name in either shape.
 */
#include "planner/memory-json.h"

#include "core/json.h"

static void
terms_json (JsonBuilder *b, const char *key, GArray *terms)
{
  json_builder_set_member_name (b, key);
  json_builder_begin_array (b);
  for (guint i = 0; i < terms->len; i++)
    {
      StowMemTerm *t = &g_array_index (terms, StowMemTerm, i);
      json_builder_begin_object (b);
      stow_json_set_string (b, "name", t->name);
      stow_json_set_u64 (b, "bytes", t->bytes);
      stow_json_set_string (b, "tier", stow_tier_name (t->tier));
      stow_json_set_string (b, "formula", t->formula);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
}

static void
stages_json (JsonBuilder *b, const StowMemory *m)
{
  json_builder_set_member_name (b, "stages");
  json_builder_begin_array (b);
  for (guint i = 0; i < m->n_stages; i++)
    {
      const StowStageMemory *s = &m->stages[i];
      json_builder_begin_object (b);
      stow_json_set_u64 (b, "stage", s->stage);
      stow_json_set_u64 (b, "layers", s->layers);
      stow_json_set_u64 (b, "params", s->params);
      stow_json_set_u64 (b, "allocated_bytes", s->allocated_bytes);
      stow_json_set_u64 (b, "reserved_bytes", s->reserved_bytes);
      stow_json_set_u64 (b, "total_bytes", s->total_bytes);
      terms_json (b, "terms", s->terms);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
}

enum
{
  DEVICE,
  HOST,
  NVME,
};

void
stow_memory_json_members (JsonBuilder *b, const StowMemory *m,
                          StowMemoryJsonShape shape)
{
  g_return_if_fail (b != NULL && m != NULL);
  gboolean plan = shape == STOW_MEMORY_JSON_PLAN;
  /* In the order both documents have always written them: the plan file
   * gained the figures it lacked (allocated and reserved bytes, the host's
   * split and capacity, the drives' capacity) in their report places. */
  const struct
  {
    guint tier;
    const char *report, *plan;
    guint64 value;
  } figures[] = {
    { DEVICE, "allocated_peak_bytes", "device_allocated_peak_bytes",
      m->allocated_peak_bytes },
    { DEVICE, "reserved_bytes", "device_reserved_bytes", m->reserved_bytes },
    { DEVICE, "total_bytes", "device_total_bytes", m->total_bytes },
    { DEVICE, "capacity_bytes", "device_capacity_bytes", m->capacity_bytes },
    { DEVICE, "peak_stage", "peak_stage", m->peak_stage },
    { HOST, "pinned_bytes", "host_pinned_bytes", m->host_pinned_bytes },
    { HOST, "pageable_bytes", "host_pageable_bytes", m->host_pageable_bytes },
    { HOST, "total_bytes", "host_total_bytes", m->host_total_bytes },
    { HOST, "capacity_bytes", "host_capacity_bytes", m->host_capacity_bytes },
    { NVME, "bytes", "nvme_bytes", m->nvme_bytes },
    { NVME, "capacity_bytes", "nvme_capacity_bytes", m->nvme_capacity_bytes },
  };
  /* After its figures, a tier's stages (device) or terms. */
  const struct
  {
    const char *report, *plan_terms;
    GArray *terms;
  } tiers[] = {
    [DEVICE] = { "device", NULL, NULL },
    [HOST] = { "host", "host_terms", m->host_terms },
    [NVME] = { "nvme", "nvme_terms", m->nvme_terms },
  };

  if (plan)
    stow_json_set_bool (b, "fits", m->fits);
  for (guint t = 0; t < G_N_ELEMENTS (tiers); t++)
    {
      if (!plan)
        {
          json_builder_set_member_name (b, tiers[t].report);
          json_builder_begin_object (b);
        }
      for (gsize i = 0; i < G_N_ELEMENTS (figures); i++)
        if (figures[i].tier == t)
          stow_json_set_u64 (b, plan ? figures[i].plan : figures[i].report,
                             figures[i].value);
      if (t == DEVICE)
        stages_json (b, m);
      else
        terms_json (b, plan ? tiers[t].plan_terms : "terms", tiers[t].terms);
      if (!plan)
        json_builder_end_object (b);
    }
}
