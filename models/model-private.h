/* SPDX-License-Identifier: MIT
 *
 * models/model-private.h: what the importer (hf.c), the catalog (catalog.c)
 * and the counting code (model.c) share inside the models room.  A builder
 * collects the tensor inventory with overflow-checked shapes; finishing a
 * model derives every count from that inventory, so the counts and the
 * names the executor loads can never disagree.
 */
#pragma once

#include "models/model.h"

G_BEGIN_DECLS

/* Structural limits.  Real models stay far below them (the largest layer
 * stack we know is 315 layers, the widest MoE 256 experts x 58 layers); they
 * keep a hostile config from asking for millions of tensor records. */
#define STOW_MODEL_MAX_DIM           (1u << 24) /* any single size field */
#define STOW_MODEL_MAX_LAYERS        16384
#define STOW_MODEL_MAX_EXPERTS       65536
#define STOW_MODEL_MAX_EXPERT_LAYERS (1u << 17) /* experts x MoE layers */
/* Configs are a few KiB; anything past this is not a config.json. */
#define STOW_MODEL_MAX_CONFIG_BYTES ((gsize)4 * 1024 * 1024)
/* Bytes per parameter the planner may multiply by (ZeRO-Infinity's 20 B of
 * model states per parameter); totals must stay representable after it. */
#define STOW_MODEL_MAX_BYTES_PER_PARAM 20

typedef struct
{
  StowModel *model;
  const char *where;
  gboolean overflow; /* a shape product overflowed 64 bits */
  const char *overflow_name;
} StowModelBuilder;

StowModel *stow_model_alloc (const char *family, const char *where);

/* Appends a tensor; shapes are multiplied with overflow checks (an overflow
 * is remembered and reported by stow_model_finish). */
void stow_model_add_tensor (StowModelBuilder *b, StowTensorRole role,
                            gint layer, gboolean tied, guint n_dims, guint64 d0,
                            guint64 d1, const char *fmt, ...)
    G_GNUC_PRINTF (8, 9);

/* Sums the inventory into params, active_params, by_role, layers[] and the
 * largest module; fails on overflow (naming @where). */
gboolean stow_model_finish (StowModelBuilder *b, GError **error);

/* quantization_config and torch_dtype into @m->quant and @m->torch_dtype
 * (quant.c); needs @m->hidden. */
gboolean stow_model_read_quant (StowModel *m, JsonObject *config,
                                const char *where, GError **error);
/* linear_params and the estimated checkpoint_bytes, after the counts. */
void stow_model_estimate_checkpoint (StowModel *m);

/* The per-family importers (hf.c). */
gboolean stow_model_import (StowModelBuilder *b, JsonObject *config,
                            const char *model_type, GError **error);

G_END_DECLS
