/* SPDX-License-Identifier: MIT
 *
 * planner/lower.c: the step program and the lowering of a plan into it.
 * One program per pipeline stage; its buffers are exactly the tensors the
 * memory model (planner/memory.c) counts, sized by the same functions, so
 * that a simulated peak can be compared with the predicted one.  Rules:
 * ZeRO 0-3 with their collectives, ZeRO-Offload (per-layer gradient copies,
 * CPU Adam as gradients arrive), parameter streaming with the two-layer
 * prefetch schedule (BMInf), the three-stage NVMe optimizer swap, 1F1B,
 * interleaved 1F1B and GPipe.  This file sets each rank up (its units,
 * the order of its items, its persistent state and slots);
 * schedule-step.c emits its step.
 */
#include "planner/lower.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "planner/lower-private.h"

#include "core/zero.h"
#include "planner/memory-private.h"

#define MiB ((guint64)1 << 20)

/* ---- lowering ----------------------------------------------------------- */

/* Says what buffer @b holds. */
guint
stow_lower_holds (StowLower *L, guint b, StowBufferKind kind, guint unit,
                  guint n_units, StowDtype dtype, gint layer, guint mb)
{
  stow_program_buffer_holds (L->p, b, kind, unit, n_units, dtype, layer, mb);
  return b;
}

/* The first of a rank's units and their count when they are contiguous in
 * the model's unit order, else (STOW_NONE, 0). */
static void
rank_unit_run (GArray *units, guint *first, guint *count)
{
  *first = STOW_NONE, *count = 0;
  for (guint i = 0; i < units->len; i++)
    {
      const StowLowerUnit *u = &g_array_index (units, StowLowerUnit, i);
      if (i == 0)
        *first = u->pu;
      else if (u->pu != *first + i)
        {
          *first = STOW_NONE, *count = 0;
          return;
        }
    }
  *count = units->len;
}

guint
stow_lower_xevent (StowLower *L, guint rank, StowPass pass, guint vs, guint mb)
{
  g_autofree char *key
      = g_strdup_printf ("%c %u %u", pass == STOW_PASS_F ? 'F' : 'B', vs, mb);
  gpointer v;
  if (g_hash_table_lookup_extended (L->xevents, key, NULL, &v))
    return GPOINTER_TO_UINT (v);
  guint e
      = stow_program_event (L->p, rank, "%s to virtual stage %u mb%u",
                            pass == STOW_PASS_F ? "activations" : "gradients",
                            pass == STOW_PASS_F ? vs + 1 : vs - 1, mb);
  g_hash_table_insert (L->xevents, g_steal_pointer (&key),
                       GUINT_TO_POINTER (e));
  return e;
}

/* Appends @op with @n waits; when @want, a fresh event it records. */
guint
stow_lower_emit (StowLower *L, StowOp *op, const guint *waits, guint n,
                 gboolean want, const char *ename)
{
  if (want && op->record == STOW_NONE)
    op->record = stow_program_event (L->p, op->rank, "%s", ename);
  stow_program_add (L->p, op, waits, n);
  return op->record;
}

guint64
stow_lower_load_part (const StowLower *L, const StowLowerUnit *u)
{
  if (!L->exact || L->n <= 1)
    return stow_lower_div_ceil (u->gparams, L->n);
  /* Exact units on several ranks: core/zero.h's partition, padding
   * included; a tied output layer's brings the embedding's partition
   * behind its own. */
  return stow_zero_part (u->params, (guint)L->n)
         + stow_zero_part (u->gparams - u->params, (guint)L->n);
}

guint
stow_lower_alloc (StowLower *L, guint rank, StowStream s, guint buf,
                  const guint *waits, guint n)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_ALLOC, s, rank);
  op.buffer = buf;
  stow_program_add (L->p, &op, waits, n);
  return L->p->ops->len - 1;
}

guint
stow_lower_free (StowLower *L, guint rank, StowStream s, guint buf,
                 const guint *waits, guint n, gboolean want)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_FREE, s, rank);
  op.buffer = buf;
  return stow_lower_emit (L, &op, waits, n, want, "free");
}

void
stow_lower_op_io (StowOp *op, guint r0, guint r1, guint w0)
{
  if (r0 != STOW_NONE)
    op->reads[op->n_reads++] = r0;
  if (r1 != STOW_NONE)
    op->reads[op->n_reads++] = r1;
  if (w0 != STOW_NONE)
    op->writes[op->n_writes++] = w0;
}

StowOp
stow_lower_copy_op (guint rank, StowStream s, StowCopyKind what, StowTier src,
                    StowTier dst, guint64 bytes, gint layer)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_COPY, s, rank);
  op.copy = what;
  op.src = src, op.dst = dst, op.bytes = bytes, op.layer = layer;
  return op;
}

StowOp
stow_lower_coll_op (StowLower *L, guint rank, StowCollective kind,
                    guint64 bytes, gint layer)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_COLLECTIVE, STOW_STREAM_COMM, rank);
  op.coll = kind, op.bytes = bytes, op.layer = layer;
  op.group = STOW_GROUP_DP;
  op.group_size = (guint)L->n;
  /* Megatron's rank order puts tp and cp inside dp. */
  guint64 span = (guint64)L->l->tp * L->l->cp * L->n;
  op.intra_node = span <= MAX (L->c->node.gpus_per_node, 1);
  return op;
}

/* A stage's activation (or its gradient) to the next (previous) stage. */
StowOp
stow_lower_send_op (StowLower *L, guint rank, gint layer, guint mb)
{
  const StowLayout *l = L->l;
  StowOp op = stow_lower_coll_op (L, rank, STOW_COLL_SEND, L->sbh_send, layer);
  op.group = STOW_GROUP_PP, op.group_size = 2;
  op.intra_node
      = l->tp * l->cp * L->n * l->pp <= MAX (L->c->node.gpus_per_node, 1);
  op.micro_batch = mb;
  return op;
}

/* ---- units and the item order ------------------------------------------ */

static void
build_units (StowLower *L, StowLowerRank *R, const guint64 *counts,
             guint64 n_layers_total)
{
  const StowLayout *l = L->l;
  guint p = l->pp, v = l->vpp;
  guint64 per_chunk = n_layers_total / ((guint64)p * v);
  guint64 sum_layers = 0;
  R->units = g_array_new (FALSE, TRUE, sizeof (StowLowerUnit));
  R->chunk_first = g_array_new (FALSE, FALSE, sizeof (guint));
  R->chunk_count = g_array_new (FALSE, FALSE, sizeof (guint));
  guint64 first_layer = 0;
  for (guint s = 0; s < R->rank; s++)
    first_layer += counts[s];
  for (guint ch = 0; ch < v; ch++)
    {
      guint vs = ch * p + R->rank;
      guint start = R->units->len;
      guint64 lo, nl;
      if (v > 1)
        lo = vs * per_chunk, nl = per_chunk;
      else
        lo = first_layer, nl = counts[R->rank];
      if (vs == 0)
        {
          StowLowerUnit u = { .layer = STOW_LAYER_EMBEDDING };
          u.pu = stow_program_unit_of_layer (L->p, u.layer);
          g_array_append_val (R->units, u);
        }
      for (guint64 i = lo; i < lo + nl; i++)
        {
          StowLowerUnit u = { .layer = (gint)i };
          u.pu = stow_program_unit_of_layer (L->p, u.layer);
          u.params = u.gparams = stow_mem_layer_params_on_gpu (L->m, l, i);
          sum_layers += u.params;
          g_array_append_val (R->units, u);
        }
      if (vs == p * v - 1)
        {
          StowLowerUnit u = { .layer = STOW_LAYER_HEAD };
          u.pu = stow_program_unit_of_layer (L->p, u.layer);
          g_array_append_val (R->units, u);
        }
      guint count = R->units->len - start;
      g_array_append_val (R->chunk_first, start);
      g_array_append_val (R->chunk_count, count);
    }
  /* What is not in the layers is the embedding (first stage) and the
   * output layer (last stage). */
  guint64 rest = R->sp.params > sum_layers ? R->sp.params - sum_layers : 0;
  guint64 emb = MIN (rest, L->m->embedding_params / l->tp);
  for (guint i = 0; i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      if (u->layer == STOW_LAYER_EMBEDDING)
        u->params = u->gparams = emb;
      else if (u->layer == STOW_LAYER_HEAD)
        {
          u->params = R->sp.first ? rest - emb : rest;
          /* Tied on one stage: the output layer reads the embedding. */
          u->gparams = u->params ? u->params : L->m->embedding_params / l->tp;
        }
    }
  /* Unsharded on one stage, each unit holds exactly its own tensors (the
   * memory model spreads the final norm over the layers): what a backend
   * that runs the program updates. */
  if (l->tp == 1 && l->ep == 1 && l->pp == 1 && l->vpp == 1)
    {
      guint64 emb_numel = 0;
      for (guint i = 0; i < R->units->len; i++)
        {
          StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
          u->params = u->gparams = stow_program_unit (L->p, u->pu)->numel;
          if (u->layer == STOW_LAYER_EMBEDDING)
            emb_numel = u->params;
        }
      for (guint i = 0; i < R->units->len; i++)
        {
          StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
          if (u->layer == STOW_LAYER_HEAD && L->m->tied_embeddings)
            u->gparams = u->params + emb_numel;
        }
    }
}

static void
add_items (StowLowerRank *R, guint chunk, guint mb, StowPass pass)
{
  guint first = g_array_index (R->chunk_first, guint, chunk);
  guint count = g_array_index (R->chunk_count, guint, chunk);
  for (guint j = 0; j < count; j++)
    {
      guint u = pass == STOW_PASS_F ? first + j : first + count - 1 - j;
      gint layer = g_array_index (R->units, StowLowerUnit, u).layer;
      /* The loss op runs the output layer forward and backward. */
      if (pass == STOW_PASS_B && layer == STOW_LAYER_HEAD)
        continue;
      StowLowerItem it = { chunk, u, mb, pass, STOW_NONE };
      g_array_append_val (R->items, it);
    }
}

/* The order of (pass, chunk, micro-batch) on one stage: GPipe, 1F1B
 * (Narayanan et al. 2021, PipeDream-Flush), or Megatron's interleaved 1F1B
 * (warm-up 2 (p - s - 1) + (v - 1) p model chunks). */
static void
build_items (StowLower *L, StowLowerRank *R)
{
  const StowLayout *l = L->l;
  guint p = l->pp, v = l->vpp, s = R->rank;
  guint m = (guint)l->grad_accum;
  R->items = g_array_new (FALSE, TRUE, sizeof (StowLowerItem));
  if (l->schedule == STOW_SCHEDULE_GPIPE)
    {
      for (guint j = 0; j < m; j++)
        add_items (R, 0, j, STOW_PASS_F);
      for (guint j = 0; j < m; j++)
        add_items (R, 0, j, STOW_PASS_B);
      return;
    }
  if (v == 1)
    {
      guint warm = MIN (p - s - 1, m);
      for (guint j = 0; j < warm; j++)
        add_items (R, 0, j, STOW_PASS_F);
      for (guint j = 0; j < m - warm; j++)
        {
          add_items (R, 0, warm + j, STOW_PASS_F);
          add_items (R, 0, j, STOW_PASS_B);
        }
      for (guint j = m - warm; j < m; j++)
        add_items (R, 0, j, STOW_PASS_B);
      return;
    }
  /* Forward order: groups of p micro-batches through each chunk in turn
   * (the last group smaller when p does not divide m); backward the same
   * with the chunks reversed. */
  guint total = m * v;
  g_autofree guint *fc = g_new (guint, total), *fm = g_new (guint, total);
  g_autofree guint *bc = g_new (guint, total), *bm = g_new (guint, total);
  guint k = 0;
  for (guint g0 = 0; g0 < m; g0 += p)
    for (guint ch = 0; ch < v; ch++)
      for (guint j = g0; j < MIN (m, g0 + p); j++, k++)
        fc[k] = ch, fm[k] = j, bc[k] = v - 1 - ch, bm[k] = j;
  guint warm = MIN ((p - s - 1) * 2 + (v - 1) * p, total);
  for (k = 0; k < warm; k++)
    add_items (R, fc[k], fm[k], STOW_PASS_F);
  for (k = 0; k < total - warm; k++)
    {
      add_items (R, fc[warm + k], fm[warm + k], STOW_PASS_F);
      add_items (R, bc[k], bm[k], STOW_PASS_B);
    }
  for (k = total - warm; k < total; k++)
    add_items (R, bc[k], bm[k], STOW_PASS_B);
}

/* Layer-major accumulation: with one stage, forward every micro-batch
 * through a layer before the next layer, and backward likewise, so each
 * streamed layer is loaded once per pass. */
static void
build_items_layer_major (StowLower *L, StowLowerRank *R)
{
  guint m = (guint)L->l->grad_accum;
  guint count = g_array_index (R->chunk_count, guint, 0);
  R->items = g_array_new (FALSE, TRUE, sizeof (StowLowerItem));
  for (guint u = 0; u < count; u++)
    for (guint j = 0; j < m; j++)
      {
        StowLowerItem it = { 0, u, j, STOW_PASS_F, STOW_NONE };
        g_array_append_val (R->items, it);
      }
  for (guint k = 0; k < count; k++)
    {
      guint u = count - 1 - k;
      if (g_array_index (R->units, StowLowerUnit, u).layer == STOW_LAYER_HEAD)
        continue;
      for (guint j = 0; j < m; j++)
        {
          StowLowerItem it = { 0, u, j, STOW_PASS_B, STOW_NONE };
          g_array_append_val (R->items, it);
        }
    }
}

/* Whether an item needs the unit's weights: every forward, and backward
 * of layers (the embedding's backward is a scatter into its gradient). */
gboolean
stow_lower_needs_weights (const StowLowerUnit *u, const StowLowerItem *it)
{
  if (u->gparams == 0)
    return FALSE;
  return it->pass == STOW_PASS_F || u->layer >= 0;
}

/* Uses: maximal runs of items on the same streamed unit share one load. */
static void
build_uses (StowLower *L, StowLowerRank *R)
{
  R->uses = g_array_new (FALSE, TRUE, sizeof (StowLowerUse));
  for (guint i = 0; i < R->items->len; i++)
    {
      StowLowerItem *it = &g_array_index (R->items, StowLowerItem, i);
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, it->unit);
      if (!u->streamed || !stow_lower_needs_weights (u, it))
        continue;
      StowLowerUse *prev = R->uses->len ? &g_array_index (R->uses, StowLowerUse,
                                                          R->uses->len - 1)
                                        : NULL;
      if (prev && prev->unit == it->unit && prev->last_item + 1 == i
          && g_array_index (R->items, StowLowerItem, prev->first_item).pass
                 == it->pass)
        {
          prev->last_item = i;
          it->use = R->uses->len - 1;
          continue;
        }
      StowLowerUse use = { it->unit,  i,         i,         STOW_NONE,
                           STOW_NONE, STOW_NONE, STOW_NONE, FALSE };
      g_array_append_val (R->uses, use);
      it->use = R->uses->len - 1;
    }
}

/* Full fine-tuning: every parameter trains (LoRA sizes its own). */
static gboolean
t_full (const StowLower *L)
{
  return L->t->finetune == STOW_FINETUNE_FULL;
}

/* ---- one stage ------------------------------------------------------------
 */

/* What @R keeps of a state of @N parameters ZeRO shards @d ways, as
 * memory.c counts it: routed experts over their expert-data-parallel
 * group only. */
static guint64
rank_shard (const StowLowerRank *R, const StowLayout *l, guint64 N, guint64 d)
{
  return stow_mem_sharded_params (l, N, R->sp.experts, d);
}

/* The elements a buffer of @R's state sharded @d ways holds: with exact
 * units, each unit's ZeRO partition (core/zero.h) padded as the ranks
 * keep it; else memory.c's share. */
static guint64
part_params (const StowLower *L, const StowLowerRank *R, guint64 N, guint64 d)
{
  if (!L->exact || d <= 1)
    return rank_shard (R, L->l, N, d);
  guint64 sum = 0;
  for (guint i = 0; i < R->units->len; i++)
    sum += stow_zero_part (g_array_index (R->units, StowLowerUnit, i).params,
                           (guint)d);
  return sum;
}

/* Buffer @b holds its units' partitions when sharded @d ways over exact
 * units. */
static guint
partitioned (StowLower *L, guint b, guint64 d)
{
  if (L->exact && d > 1)
    stow_program_buffer_partition (L->p, b, (guint)d);
  return b;
}

/* What the persistent state buffers hold: the rank's parameters, their
 * ZeRO divisors, and the run of units they cover. */
typedef struct
{
  guint64 N;            /* parameters */
  guint64 odiv, gdiv;   /* optimizer states' and gradients' shard degrees */
  guint ufirst, ucount; /* rank_unit_run */
} StateSizes;

/* memory.c's LoRA states: frozen weights (NF4 under QLoRA) and the fp32
 * adapters, their gradients and optimizer states. */
static void
emit_lora_states (StowLower *L, StowLowerRank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  guint64 N = z->N, n = L->n;
  guint64 odiv = z->odiv, gdiv = z->gdiv;
  guint64 E = R->sp.experts;
  guint64 wdiv = l->zero >= 3 ? n : 1, T = R->sp.trainable;
  R->params_buf = stow_program_buffer (
      p, rank, STOW_TIER_DEVICE,
      stow_mem_frozen_linear_bytes (l, R->sp.linear, E, L->wb, wdiv), -1, TRUE,
      "frozen parameters");
  stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                       stow_bytes (N - R->sp.linear, 2.0) / wdiv, -1, TRUE,
                       "frozen parameters (non-linear)");
  stow_program_buffer (p, rank, STOW_TIER_DEVICE, T * 4 / wdiv, -1, TRUE,
                       "lora adapters");
  R->grads_buf = stow_program_buffer (p, rank, STOW_TIER_DEVICE, T * 4 / gdiv,
                                      -1, TRUE, "gradients");
  stow_program_buffer (p, rank, STOW_TIER_DEVICE, stow_bytes (T, L->opt) / odiv,
                       -1, TRUE, "optimizer states");
  for (guint i = 0; i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      u->params = u->layer >= 0 ? T / MAX (R->sp.layers, 1) : 0;
    }
}

/* The weights: on the host or NVMe (offloaded), else on the device, whole
 * or (ZeRO 3) a shard. */
static void
emit_weights (StowLower *L, StowLowerRank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  guint64 N = z->N, n = L->n;
  guint ufirst = z->ufirst, ucount = z->ucount;
  if (L->off_par)
    partitioned (
        L,
        stow_lower_holds (
            L,
            stow_program_buffer (
                p, rank, L->nvme_par ? STOW_TIER_NVME : STOW_TIER_PINNED,
                stow_bytes (part_params (L, R, N, n), L->w), -1, TRUE,
                "offloaded parameters"),
            STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0),
        n);
  else
    R->params_buf = partitioned (
        L,
        stow_lower_holds (
            L,
            stow_program_buffer (
                p, rank, STOW_TIER_DEVICE,
                stow_bytes (part_params (L, R, N, l->zero >= 3 ? n : 1), L->w),
                -1, TRUE, l->zero >= 3 ? "parameter shard" : "parameters"),
            STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0),
        l->zero >= 3 ? n : 1);
}

/* Gradients, master weights and optimizer states on the device. */
static void
emit_device_states (StowLower *L, StowLowerRank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint64 N = z->N;
  guint64 odiv = z->odiv, gdiv = z->gdiv;
  guint ufirst = z->ufirst, ucount = z->ucount;
  R->grads_buf = partitioned (
      L,
      stow_lower_holds (
          L,
          stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                               stow_bytes (part_params (L, R, N, gdiv), L->g),
                               -1, TRUE, "gradients"),
          STOW_BUF_GRADS, ufirst, ucount, L->gdt, STOW_LAYER_NONE, 0),
      gdiv);
  partitioned (
      L,
      stow_lower_holds (L,
                        stow_program_buffer (
                            p, rank, STOW_TIER_DEVICE,
                            stow_bytes (part_params (L, R, N, odiv), L->master),
                            -1, TRUE, "master weights"),
                        STOW_BUF_MASTER, ufirst, ucount, STOW_DTYPE_F32,
                        STOW_LAYER_NONE, 0),
      odiv);
  partitioned (
      L,
      stow_lower_holds (
          L,
          stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                               stow_bytes (part_params (L, R, N, odiv), L->opt),
                               -1, TRUE, "optimizer states"),
          STOW_BUF_OPT_STATES, ufirst, ucount, STOW_DTYPE_F32, STOW_LAYER_NONE,
          0),
      odiv);
}

/* The offloaded optimizer's gradients, master weights and states on the
 * host (the states on NVMe with --offload-optimizer nvme). */
static void
emit_host_states (StowLower *L, StowLowerRank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint64 N = z->N, n = L->n;
  guint ufirst = z->ufirst, ucount = z->ucount;
  R->host_grads_buf = stow_lower_holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_PINNED,
                           stow_bytes (part_params (L, R, N, n), L->g), -1,
                           TRUE, "offloaded gradients"),
      STOW_BUF_GRADS, ufirst, ucount, L->gdt, STOW_LAYER_NONE, 0);
  /* The delayed update applies the last step's gradients while this
   * step's come down: a second host copy of them, which the backends
   * trade places with the first at each step's start. */
  if (L->so->delayed_update)
    stow_program_buffer_role (
        p,
        stow_program_buffer (p, rank, STOW_TIER_PINNED,
                             stow_bytes (part_params (L, R, N, n), L->g), -1,
                             TRUE, STOW_DELAYED_GRADS_NAME),
        STOW_ROLE_DELAYED_GRADS, 0);
  partitioned (
      L,
      stow_lower_holds (
          L,
          stow_program_buffer (
              p, rank, L->nvme_opt ? STOW_TIER_NVME : STOW_TIER_PINNED,
              stow_bytes (part_params (L, R, N, n), L->master + L->opt), -1,
              TRUE, "master weights and optimizer states"),
          STOW_BUF_STATES, ufirst, ucount, STOW_DTYPE_F32, STOW_LAYER_NONE, 0),
      n);
  partitioned (L, R->host_grads_buf, n);
  /* Where CPU Adam writes the updated weights, the "updated up"
   * copies' source (memory.c's "host copy of the weights"); with
   * offloaded parameters those are the weights themselves. */
  if (!L->off_par)
    partitioned (
        L,
        stow_lower_holds (
            L,
            stow_program_buffer (p, rank, STOW_TIER_PINNED,
                                 stow_bytes (part_params (L, R, N, n), L->w),
                                 -1, TRUE, "host copy of the weights"),
            STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0),
        n);
}

/* Persistent state, sized as the memory model sizes it. */
/* The index in @R's units of the embedding whose gradient a tied head on
 * the same rank writes, when gradients pass through slots; else
 * STOW_NONE. */
static guint
tied_unit (StowLower *L, const StowLowerRank *R)
{
  guint emb = STOW_NONE;
  gboolean tied = FALSE;
  for (guint k = 0; k < R->units->len; k++)
    {
      const StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, k);
      emb = u->layer == STOW_LAYER_EMBEDDING ? k : emb;
      tied = tied || (u->layer == STOW_LAYER_HEAD && u->params < u->gparams);
    }
  /* Several ranks over exact units reduce the loss's write and the
   * embedding backward's apart (lower-optim.c, stow_lower_grad_path); other
   * layouts of several ranks keep the schedule of before, whose loss
   * leaves the tied write out: its timing and memory are what the memory
   * model's search was checked against. */
  return tied && (L->n == 1 || L->exact) && stow_lower_uses_grad_slots (L)
             ? emb
             : STOW_NONE;
}

static void
emit_persistent_state (StowLower *L, StowLowerRank *R)
{
  const StowLayout *l = L->l;
  guint64 N = R->sp.params, n = L->n;
  /* Unsharded on one stage the units are exact (build_units): the state
   * buffers hold exactly their tensors, which a real backend fills. */
  if (l->tp == 1 && l->ep == 1 && l->pp == 1 && l->vpp == 1 && t_full (L))
    {
      N = 0;
      for (guint i = 0; i < R->units->len; i++)
        N += g_array_index (R->units, StowLowerUnit, i).params;
    }
  StateSizes z = { .N = N };
  z.odiv = l->zero >= 1 ? n : 1, z.gdiv = l->zero >= 2 ? n : 1;
  rank_unit_run (R->units, &z.ufirst, &z.ucount);
  R->params_buf = R->grads_buf = R->host_grads_buf = STOW_NONE;
  R->bucket_buf[0] = R->bucket_buf[1] = STOW_NONE;
  R->grad_slot_freed[0] = R->grad_slot_freed[1] = STOW_NONE;
  R->tied_unit = tied_unit (L, R);
  R->tied_freed = STOW_NONE;
  R->tied_grad = NULL;
  if (L->lora)
    emit_lora_states (L, R, &z);
  else
    {
      emit_weights (L, R, &z);
      if (!L->off_opt)
        emit_device_states (L, R, &z);
      else
        emit_host_states (L, R, &z);
    }
  if (l->zero < 2 && n > 1 && !L->exact)
    for (guint i = 0; i < 2; i++)
      R->bucket_buf[i]
          = stow_program_buffer (L->p, R->rank, STOW_TIER_DEVICE, 25 * MiB, -1,
                                 TRUE, "gradient bucket %u", i);
}

/* Which units stream, which stay: the two-layer rule.  Returns the
 * rank's layer units. */
static guint
choose_resident (StowLower *L, StowLowerRank *R)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint n_layer_units = 0;
  for (guint i = 0; i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      u->resident = STOW_NONE;
      u->grads_ready = u->last_use = u->last_down = STOW_NONE;
      u->streamed = L->gather && u->gparams > 0;
      if (u->layer >= 0)
        n_layer_units++;
    }
  if (L->off_par && L->k_resident > 0)
    {
      guint k = MIN (L->k_resident, n_layer_units);
      guint S = n_layer_units - k, idx = 0, next = 0;
      /* Spread the S streamed layers evenly (BMInf): streamed layer j is
       * at position floor((j + 1) L / S) - 1, so each load has the
       * resident layers before it to hide behind. */
      for (guint i = 0; i < R->units->len; i++)
        {
          StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
          if (u->layer < 0)
            continue;
          guint pos = S ? (guint)(((guint64)(next + 1) * n_layer_units) / S) - 1
                        : G_MAXUINT;
          if (S && idx == pos && next < S)
            next++;
          else
            {
              u->streamed = FALSE;
              u->resident = stow_lower_holds (
                  L,
                  stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                                       stow_bytes (u->gparams, L->wg), -1, TRUE,
                                       "resident L%d", u->layer),
                  STOW_BUF_WEIGHTS, u->pu, 1, L->wdt, u->layer, 0);
            }
          idx++;
        }
      p->resident_layers = k;
    }
  p->streamed_layers = 0;
  for (guint i = 0; i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      p->streamed_layers += u->layer >= 0 && u->streamed;
    }
  if (!L->off_par)
    p->resident_layers = n_layer_units - p->streamed_layers;
  return n_layer_units;
}

/* The two layer slots and the two gradient slots are fixed regions of
 * the arena, sized for the largest unit that passes through them (the
 * memory model's "gathered parameters" and "gradient slots"). */
static void
emit_slots (StowLower *L, StowLowerRank *R, guint n_layer_units)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint64 wmax = 0, gmax = 0;
  /* A tied embedding's gradients have a buffer of their own. */
  guint tied = R->tied_unit;
  for (guint i = 0; i < R->units->len; i++)
    {
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
      if (u->streamed)
        wmax = MAX (wmax, stow_bytes (u->gparams, L->wg));
      /* (On several ranks its backward uses the slots too.) */
      if (i != tied || L->n > 1)
        gmax = MAX (gmax, stow_bytes (u->params
                                          + (stow_lower_slot_tail (L)
                                                 ? stow_zero_part (u->params,
                                                                   (guint)L->n)
                                                 : 0),
                                      L->g));
    }
  guint n_slots = MIN (2, MAX (n_layer_units, 1));
  /* Four pinned staging buffers for NVMe parameters, each one rank's
   * shard of the largest unit (slots 4-7). */
  guint64 staged = 0; /* as the loads bring it */
  for (guint j = 0; j < R->units->len; j++)
    staged = MAX (staged, stow_lower_load_part (
                              L, &g_array_index (R->units, StowLowerUnit, j)));
  for (guint i = 0; L->nvme_par && wmax > 0 && i < 4; i++)
    stow_program_buffer_role (
        p,
        stow_program_buffer (p, rank, STOW_TIER_PINNED,
                             stow_bytes (staged, L->w), -1, TRUE,
                             "parameter staging buffer %u", i),
        STOW_ROLE_PARAM_STAGING, i);
  /* ... and one that the updated units pass through to the store. */
  R->write_buf = STOW_NONE;
  if (L->nvme_par && L->off_opt && t_full (L) && staged > 0)
    {
      R->write_buf = stow_program_buffer (p, rank, STOW_TIER_PINNED,
                                          stow_bytes (staged, L->w), -1, TRUE,
                                          "parameter write buffer");
      stow_program_buffer_role (p, R->write_buf, STOW_ROLE_PARAM_WRITE, 0);
    }
  for (guint i = 0; wmax > 0 && i < n_slots; i++)
    stow_program_buffer_role (p,
                              stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                                                   wmax, -1, TRUE,
                                                   "layer slot %u", i),
                              STOW_ROLE_LAYER_SLOT, i);
  for (guint i = 0; stow_lower_uses_grad_slots (L) && i < n_slots; i++)
    stow_program_buffer_role (p,
                              stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                                                   gmax, -1, TRUE,
                                                   "gradient slot %u", i),
                              STOW_ROLE_GRAD_SLOT, i);
}

/* The order of the rank's items, the uses of its streamed units, and
 * each unit's last gradient write. */
static void
order_items (StowLower *L, StowLowerRank *R)
{
  const StowLayout *l = L->l;
  if (L->so->layer_major && l->pp == 1 && l->vpp == 1)
    build_items_layer_major (L, R);
  else
    build_items (L, R);
  build_uses (L, R);
  for (guint i = 0; i < R->items->len; i++)
    {
      StowLowerItem *it = &g_array_index (R->items, StowLowerItem, i);
      StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, it->unit);
      gboolean grads
          = (it->pass == STOW_PASS_B && u->layer != STOW_LAYER_HEAD)
            || (it->pass == STOW_PASS_F && u->layer == STOW_LAYER_HEAD);
      if (grads)
        u->last_grad_item = i;
    }
}

/* Recomputed layers: the first k of the stage, or of each model chunk
 * when interleaved (all when k = 0). */
static void
mark_recomputed (StowLower *L, StowLowerRank *R)
{
  const StowLayout *l = L->l;
  guint v = MAX (l->vpp, 1);
  guint64 n_rec
      = stow_layout_recomputed_layers (l, L->m->n_layers, R->sp.layers) / v;
  for (guint ch = 0; ch < R->chunk_first->len; ch++)
    {
      guint first = g_array_index (R->chunk_first, guint, ch);
      guint count = g_array_index (R->chunk_count, guint, ch);
      guint64 seen = 0;
      for (guint i = first; i < first + count; i++)
        {
          StowLowerUnit *u = &g_array_index (R->units, StowLowerUnit, i);
          if (u->layer >= 0)
            u->recompute = seen++ < n_rec;
        }
    }
}

static void
lower_rank (StowLower *L, StowLowerRank *R)
{
  emit_persistent_state (L, R);
  guint n_layer_units = choose_resident (L, R);
  emit_slots (L, R, n_layer_units);
  order_items (L, R);
  mark_recomputed (L, R);
  stow_lower_step (L, R);
  g_array_unref (R->units);
  g_array_unref (R->chunk_first);
  g_array_unref (R->chunk_count);
  g_array_unref (R->items);
  g_array_unref (R->uses);
}

/* The lowering's plan-wide state: the program with its training facts,
 * the element types and bytes per parameter, the activation sizes, what
 * is offloaded. */
static void
lower_init (StowLower *L, const StowModel *m, const StowCluster *c,
            const StowTraining *t, const StowLayout *l,
            const StowMemOptions *mo, const StowLowerOptions *so)
{
  L->m = m, L->c = c, L->t = t, L->l = l, L->mo = mo, L->so = so;
  L->p = stow_program_new (l->pp);
  stow_program_set_units (L->p, m);
  /* The stowage engine keeps gradients in the weights' type (memory.c's
   * bytes per parameter); fp32 training needs no master copy. */
  L->wdt = t->precision == STOW_PRECISION_FP32   ? STOW_DTYPE_F32
           : t->precision == STOW_PRECISION_FP16 ? STOW_DTYPE_F16
                                                 : STOW_DTYPE_BF16;
  L->gdt = L->wdt;
  L->p->weight_dtype = L->wdt, L->p->grad_dtype = L->gdt;
  L->p->seq_len = t->seq_len;
  L->p->micro_batch = l->micro_batch;
  L->p->grad_accum = l->grad_accum;
  L->p->global_batch = t->global_batch;
  L->p->optim = t->optim;
  stow_mem_state_bytes (m, t, &L->w, &L->g, &L->master, &L->opt);
  L->wg = stow_mem_gathered_weight_bytes (t, L->w);
  if (t->finetune != STOW_FINETUNE_FULL)
    {
      /* Frozen weights (NF4 under QLoRA, as memory.c); adapters train in
       * fp32 with no master. */
      L->lora = TRUE;
      L->wb = stow_mem_frozen_weight_bytes (m, t, L->w);
      L->w = L->g = 4.0;
      L->master = 0;
    }
  L->p->master_weights = L->master > 0;
  L->n = stow_mem_shard_degree (l, c);
  stow_mem_activation_sizes (m, t, l, &L->full, &L->block, &L->ckpt);
  double s_local = (double)t->seq_len / l->cp;
  guint64 sbh
      = (guint64)llround (s_local * (double)l->micro_batch * (double)m->hidden);
  guint64 spdiv = l->sp ? l->tp : 1;
  stow_mem_end_sizes (m, t, l, &L->input_bytes, &L->logits_bytes,
                      &L->loss_grad_bytes);
  L->sbh_send = 2 * sbh / spdiv;
  L->gather = l->zero >= 3;
  L->off_opt = l->offload_optimizer != STOW_OFFLOAD_NONE;
  L->off_par = l->offload_params != STOW_OFFLOAD_NONE;
  L->nvme_opt = l->offload_optimizer == STOW_OFFLOAD_NVME;
  L->nvme_par = l->offload_params == STOW_OFFLOAD_NVME;
  L->exact = l->tp == 1 && l->ep == 1 && l->pp == 1 && l->vpp == 1 && l->cp == 1
             && !L->lora;
  L->p->dp = (guint)L->n;
  L->p->zero = l->zero;
  L->xevents = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
}

/* The device budget: what the memory model leaves of the capacity,
 * counted in tensor bytes (the allocator's slack grows with them). */
static void
set_device_budget (StowLower *L, const StowMemory *mem)
{
  StowProgram *p = L->p;
  p->fragmentation = L->mo->fragmentation;
  p->overhead_bytes = mem->total_bytes - mem->allocated_peak_bytes;
  guint64 non_tensor = mem->total_bytes - mem->reserved_bytes;
  guint64 cap
      = mem->capacity_bytes > non_tensor ? mem->capacity_bytes - non_tensor : 0;
  p->device_capacity_bytes
      = (guint64)((double)cap / (1.0 + L->mo->fragmentation));
}

/* Layer-major accumulation keeps every micro-batch's activations (and
 * logits) at once: (m - 1) micro-batches more than the memory model's
 * 1F1B count.  It must come out of the budget before resident layers:
 * sets @extra to those bytes.  FALSE, with @error, when layer-major does
 * not apply or they do not fit. */
static gboolean
layer_major_extra (StowLower *L, const StowMemory *mem, guint64 *extra_out,
                   GError **error)
{
  const StowModel *m = L->m;
  const StowLayout *l = L->l;
  StowProgram *p = L->p;
  if (!L->off_par || l->pp > 1)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--layer-major needs streamed layers on one stage "
                   "(--offload-params cpu or nvme, --pp 1)");
      return FALSE;
    }
  guint64 n_rec = 0;
  if (l->recompute == STOW_RECOMPUTE_FULL)
    n_rec = l->recompute_layers ? MIN (l->recompute_layers, m->n_layers)
                                : m->n_layers;
  guint64 per_mb = (m->n_layers - n_rec) * L->full + n_rec * L->ckpt
                   + L->input_bytes + L->logits_bytes;
  guint64 extra = (l->grad_accum - 1) * per_mb;
  if (mem->allocated_peak_bytes + extra > p->device_capacity_bytes)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--layer-major keeps %" G_GUINT64_FORMAT
                   " micro-batches of activations: %" G_GUINT64_FORMAT
                   " B more than the device budget of %" G_GUINT64_FORMAT
                   " B allows",
                   l->grad_accum,
                   mem->allocated_peak_bytes + extra - p->device_capacity_bytes,
                   p->device_capacity_bytes);
      return FALSE;
    }
  *extra_out = extra;
  return TRUE;
}

/* How many streamed layers stay on the device (L->k_resident): as asked,
 * as the plan decided, or what the budget leaves room for (after
 * layer-major's @extra bytes). */
static gboolean
choose_k_resident (StowLower *L, const StowMemory *mem, guint64 extra,
                   GError **error)
{
  const StowModel *m = L->m;
  const StowLayout *l = L->l;
  StowProgram *p = L->p;
  guint64 layer_bytes = 0;
  for (guint64 i = 0; i < m->n_layers; i++)
    layer_bytes
        = MAX (layer_bytes,
               stow_bytes (stow_mem_layer_params_on_gpu (m, l, i), L->wg));
  if (L->so->resident_layers != G_MAXUINT)
    L->k_resident = L->so->resident_layers;
  else if (l->resident_layers != STOW_RESIDENT_AUTO)
    L->k_resident = l->resident_layers; /* as the plan decided it */
  else if (!L->so->layer_major)
    {
      StowLayout r = *l;
      if (!stow_mem_resolve_resident (m, L->c, L->t, &r, L->mo, error))
        return FALSE;
      L->k_resident = r.resident_layers;
    }
  else
    {
      /* Layer-major keeps every micro-batch's activations: what they
       * take beyond the memory model comes out of the budget first. */
      guint64 used = mem->allocated_peak_bytes + extra;
      guint64 free_b = p->device_capacity_bytes > used
                           ? p->device_capacity_bytes - used
                           : 0;
      L->k_resident = layer_bytes ? (guint)(free_b / layer_bytes) : 0;
    }
  return TRUE;
}

StowProgram *
stow_lower (const StowPlan *plan, GError **error)
{
  g_return_val_if_fail (
      plan != NULL && plan->model != NULL && plan->cluster != NULL, NULL);
  const StowModel *m = plan->model;
  const StowCluster *c = plan->cluster;
  const StowTraining *t = &plan->training;
  const StowLayout *l = &plan->layout;
  const StowMemOptions *mo_in = &plan->mem;
  const StowLowerOptions *so_in = &plan->lower;
  if (!stow_layout_validate (l, t, m, c, error))
    return NULL;
  if (l->engine != STOW_ENGINE_STOWAGE)
    {
      g_set_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID,
                   "--engine %s: the step program lowers stowage's own engine "
                   "only (use --engine stowage)",
                   stow_engine_name (l->engine));
      return NULL;
    }
  g_autoptr (StowMemory) mem = stow_memory_estimate (plan, error);
  if (mem == NULL)
    return NULL;

  StowLower L = { 0 };
  lower_init (&L, m, c, t, l, mo_in, so_in);
  StowProgram *p = L.p;
  set_device_budget (&L, mem);
  guint64 extra = 0;
  if ((so_in->layer_major && !layer_major_extra (&L, mem, &extra, error))
      || (L.off_par && !choose_k_resident (&L, mem, extra, error)))
    {
      g_hash_table_unref (L.xevents);
      stow_program_free (L.p);
      return NULL;
    }

  g_autofree guint64 *counts = g_new0 (guint64, l->pp);
  stow_layout_stage_layers (l, m->n_layers, counts);
  guint64 first = 0;
  for (guint s = 0; s < l->pp; s++)
    {
      StowLowerRank R = { 0 };
      R.rank = s;
      R.sp = stow_mem_stage_params (m, t, l, mo_in, s, first, counts[s]);
      build_units (&L, &R, counts, m->n_layers);
      lower_rank (&L, &R);
      first += counts[s];
    }
  g_hash_table_unref (L.xevents);
  L.xevents = NULL;
  p->description = g_strdup_printf (
      "%s on %s: dp %u tp %u pp %u%s zero %u, optimizer %s, parameters %s, "
      "recompute %s, micro-batch %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
      ", %u resident / %u streamed layers per rank",
      m->name, c->spec ? c->spec : "cluster", l->dp, l->tp, l->pp,
      l->vpp > 1 ? " (interleaved)" : "", l->zero,
      stow_offload_name (l->offload_optimizer),
      stow_offload_name (l->offload_params), stow_recompute_name (l->recompute),
      l->micro_batch, l->grad_accum, p->resident_layers, p->streamed_layers);
  if (!stow_program_validate (p, error))
    {
      stow_program_free (p);
      return NULL;
    }
  return p;
}
