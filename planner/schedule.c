/* SPDX-License-Identifier: MIT
 *
 * planner/schedule.c: the step program and the lowering of a plan into it.
 * One program per pipeline stage; its buffers are exactly the tensors the
 * memory model (planner/memory.c) counts, sized by the same functions, so
 * that a simulated peak can be compared with the predicted one.  Rules:
 * ZeRO 0-3 with their collectives, ZeRO-Offload (per-layer gradient copies,
 * CPU Adam as gradients arrive), parameter streaming with the two-layer
 * prefetch schedule (BMInf), the three-stage NVMe optimizer swap, 1F1B,
 * interleaved 1F1B and GPipe.
 */
#include "planner/schedule.h"


#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "planner/memory-private.h"

#define MiB ((guint64)1 << 20)

void
stow_schedule_options_init (StowScheduleOptions *o)
{
  memset (o, 0, sizeof *o);
  o->resident_layers = G_MAXUINT;
  stow_optim_settings_init (&o->optim);
}

/* ---- lowering ----------------------------------------------------------- */

typedef enum
{
  PASS_F,
  PASS_B
} Pass;

/* A unit of parameters that is gathered or streamed as one: the embedding,
 * a layer, the output layer. */
typedef struct
{
  gint layer;        /* model layer or STOW_LAYER_EMBEDDING / _HEAD */
  guint pu;          /* the program's unit (planner/program.h) */
  gboolean grad_written; /* a gradient write of this step has happened */
  guint64 params;    /* owned on this GPU: gradients and updates */
  guint64 gparams;   /* gathered for compute (tied head: the embedding) */
  gboolean streamed; /* gathered per use into a rotating slot */
  guint resident;    /* persistent gathered buffer, or STOW_NONE */
  gboolean recompute;
  guint last_grad_item; /* item index of its last gradient */
  guint grads_ready;    /* event: its gradients are complete */
  guint last_down;      /* event: its last micro-batch's gradients are
                           down on the host (optimizer offload), or none */
  guint last_use;       /* event: its last compute in the step */
} Unit;

typedef struct
{
  guint chunk, unit; /* unit index within the rank's unit array */
  guint mb;
  Pass pass;
  guint use; /* index into the rank's uses, or STOW_NONE */
} Item;

typedef struct
{
  guint unit;
  guint first_item, last_item;
  guint buffer;        /* slot buffer */
  guint loaded;        /* event */
  guint freed;         /* event */
  guint staging_freed; /* event (NVMe) */
  gboolean emitted;
} Use;

typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowLayout *l;
  const StowMemOptions *mo;
  const StowScheduleOptions *so;
  StowProgram *p;
  double w, g, master, opt, wg; /* bytes per parameter; wg gathered */
  guint64 n;                    /* ZeRO shard degree */
  guint64 full, block, ckpt;
  guint64 input_bytes, logits_bytes, loss_grad_bytes, sbh_send;
  gboolean gather; /* ZeRO 3: units are gathered or streamed */
  gboolean lora;   /* frozen weights, fp32 adapters train */
  double wb;       /* frozen linear weights' bytes (QLoRA: NF4) */
  gboolean off_opt, off_par, nvme_opt, nvme_par;
  GHashTable *xevents; /* "F vs mb" -> event id, across ranks */
  guint k_resident;
  StowDtype wdt, gdt; /* weights' and gradients' element types */
} Lower;

/* Says what buffer @b holds. */
static guint
holds (Lower *L, guint b, StowBufferKind kind, guint unit, guint n_units,
       StowDtype dtype, gint layer, guint mb)
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
      const Unit *u = &g_array_index (units, Unit, i);
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

/* The accumulate flag of an op that writes @u's gradients (and @v's, the
 * tied embedding a loss writes, or NULL): the first write of the step
 * overwrites, which is the zero-grad. */
static gboolean
grad_write (Unit *u, Unit *v)
{
  gboolean acc = u->grad_written;
  g_assert (v == NULL || v->grad_written == acc);
  u->grad_written = TRUE;
  if (v)
    v->grad_written = TRUE;
  return acc;
}

typedef struct
{
  guint rank;
  StowStageParams sp;
  GArray *units;                     /* Unit */
  GArray *chunk_first, *chunk_count; /* guint: unit ranges per chunk */
  GArray *items;                     /* Item */
  GArray *uses;                      /* Use */
  guint params_buf, grads_buf, host_grads_buf, bucket_buf[2];
  /* Parameters on NVMe: the pinned buffer a unit's updated weights pass
   * through on their way to the store (O_DIRECT needs an aligned one). */
  guint write_buf;
  guint grad_slot_freed[2]; /* events of the last two gradient slots */
  guint grad_slot_count;
  GArray *pending; /* guint units whose updated weights wait to go up */
  /* The item loop's state (items_init).  Per (unit, micro-batch): */
  guint *acts;            /* activations or checkpoint on the device */
  guint *host_acts;       /* checkpoints moved to pinned host memory
                             (--offload-activations) */
  guint *host_ready;      /* ... and the events of their copies down */
  guint *inputs, *logits; /* per micro-batch */
  guint last_compute;     /* the rank's latest forward or backward */
  GArray *ready_order;    /* guint units, as their gradients complete */
  guint64 tp_bytes;       /* TP traffic of one layer pass */
} Rank;

static guint64
div_ceil (guint64 a, guint64 b)
{
  return (a + b - 1) / b;
}

static guint
xevent (Lower *L, guint rank, Pass pass, guint vs, guint mb)
{
  g_autofree char *key
      = g_strdup_printf ("%c %u %u", pass == PASS_F ? 'F' : 'B', vs, mb);
  gpointer v;
  if (g_hash_table_lookup_extended (L->xevents, key, NULL, &v))
    return GPOINTER_TO_UINT (v);
  guint e = stow_program_event (L->p, rank, "%s to virtual stage %u mb%u",
                                pass == PASS_F ? "activations" : "gradients",
                                pass == PASS_F ? vs + 1 : vs - 1, mb);
  g_hash_table_insert (L->xevents, g_steal_pointer (&key),
                       GUINT_TO_POINTER (e));
  return e;
}

/* Appends @op with @n waits; when @want, a fresh event it records. */
static guint
emit (Lower *L, StowOp *op, const guint *waits, guint n, gboolean want,
      const char *ename)
{
  if (want && op->record == STOW_NONE)
    op->record = stow_program_event (L->p, op->rank, "%s", ename);
  stow_program_add (L->p, op, waits, n);
  return op->record;
}

static guint
emit_alloc (Lower *L, guint rank, StowStream s, guint buf, const guint *waits,
            guint n)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_ALLOC, s, rank);
  op.buffer = buf;
  stow_program_add (L->p, &op, waits, n);
  return L->p->ops->len - 1;
}

static guint
emit_free (Lower *L, guint rank, StowStream s, guint buf, const guint *waits,
           guint n, gboolean want)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_FREE, s, rank);
  op.buffer = buf;
  return emit (L, &op, waits, n, want, "free");
}

static void
op_io (StowOp *op, guint r0, guint r1, guint w0)
{
  if (r0 != STOW_NONE)
    op->reads[op->n_reads++] = r0;
  if (r1 != STOW_NONE)
    op->reads[op->n_reads++] = r1;
  if (w0 != STOW_NONE)
    op->writes[op->n_writes++] = w0;
}

static StowOp
copy_op (guint rank, StowStream s, StowTier src, StowTier dst, guint64 bytes,
         gint layer)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_COPY, s, rank);
  op.src = src, op.dst = dst, op.bytes = bytes, op.layer = layer;
  return op;
}

static StowOp
coll_op (Lower *L, guint rank, StowCollective kind, guint64 bytes, gint layer)
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
static StowOp
send_op (Lower *L, guint rank, gint layer, guint mb)
{
  const StowLayout *l = L->l;
  StowOp op = coll_op (L, rank, STOW_COLL_SEND, L->sbh_send, layer);
  op.group = STOW_GROUP_PP, op.group_size = 2;
  op.intra_node
      = l->tp * l->cp * L->n * l->pp <= MAX (L->c->node.gpus_per_node, 1);
  op.micro_batch = mb;
  return op;
}

/* ---- units and the item order ------------------------------------------ */

static void
build_units (Lower *L, Rank *R, const guint64 *counts, guint64 n_layers_total)
{
  const StowLayout *l = L->l;
  guint p = l->pp, v = l->vpp;
  guint64 per_chunk = n_layers_total / ((guint64)p * v);
  guint64 sum_layers = 0;
  R->units = g_array_new (FALSE, TRUE, sizeof (Unit));
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
          Unit u = { .layer = STOW_LAYER_EMBEDDING };
          u.pu = stow_program_unit_of_layer (L->p, u.layer);
          g_array_append_val (R->units, u);
        }
      for (guint64 i = lo; i < lo + nl; i++)
        {
          Unit u = { .layer = (gint)i };
          u.pu = stow_program_unit_of_layer (L->p, u.layer);
          u.params = u.gparams = stow_mem_layer_params_on_gpu (L->m, l, i);
          sum_layers += u.params;
          g_array_append_val (R->units, u);
        }
      if (vs == p * v - 1)
        {
          Unit u = { .layer = STOW_LAYER_HEAD };
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
      Unit *u = &g_array_index (R->units, Unit, i);
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
          Unit *u = &g_array_index (R->units, Unit, i);
          u->params = u->gparams = stow_program_unit (L->p, u->pu)->numel;
          if (u->layer == STOW_LAYER_EMBEDDING)
            emb_numel = u->params;
        }
      for (guint i = 0; i < R->units->len; i++)
        {
          Unit *u = &g_array_index (R->units, Unit, i);
          if (u->layer == STOW_LAYER_HEAD && L->m->tied_embeddings)
            u->gparams = u->params + emb_numel;
        }
    }
}

static void
add_items (Rank *R, guint chunk, guint mb, Pass pass)
{
  guint first = g_array_index (R->chunk_first, guint, chunk);
  guint count = g_array_index (R->chunk_count, guint, chunk);
  for (guint j = 0; j < count; j++)
    {
      guint u = pass == PASS_F ? first + j : first + count - 1 - j;
      gint layer = g_array_index (R->units, Unit, u).layer;
      /* The loss op runs the output layer forward and backward. */
      if (pass == PASS_B && layer == STOW_LAYER_HEAD)
        continue;
      Item it = { chunk, u, mb, pass, STOW_NONE };
      g_array_append_val (R->items, it);
    }
}

/* The order of (pass, chunk, micro-batch) on one stage: GPipe, 1F1B
 * (Narayanan et al. 2021, PipeDream-Flush), or Megatron's interleaved 1F1B
 * (warm-up 2 (p - s - 1) + (v - 1) p model chunks). */
static void
build_items (Lower *L, Rank *R)
{
  const StowLayout *l = L->l;
  guint p = l->pp, v = l->vpp, s = R->rank;
  guint m = (guint)l->grad_accum;
  R->items = g_array_new (FALSE, TRUE, sizeof (Item));
  if (l->schedule == STOW_SCHEDULE_GPIPE)
    {
      for (guint j = 0; j < m; j++)
        add_items (R, 0, j, PASS_F);
      for (guint j = 0; j < m; j++)
        add_items (R, 0, j, PASS_B);
      return;
    }
  if (v == 1)
    {
      guint warm = MIN (p - s - 1, m);
      for (guint j = 0; j < warm; j++)
        add_items (R, 0, j, PASS_F);
      for (guint j = 0; j < m - warm; j++)
        {
          add_items (R, 0, warm + j, PASS_F);
          add_items (R, 0, j, PASS_B);
        }
      for (guint j = m - warm; j < m; j++)
        add_items (R, 0, j, PASS_B);
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
    add_items (R, fc[k], fm[k], PASS_F);
  for (k = 0; k < total - warm; k++)
    {
      add_items (R, fc[warm + k], fm[warm + k], PASS_F);
      add_items (R, bc[k], bm[k], PASS_B);
    }
  for (k = total - warm; k < total; k++)
    add_items (R, bc[k], bm[k], PASS_B);
}

/* Layer-major accumulation: with one stage, forward every micro-batch
 * through a layer before the next layer, and backward likewise, so each
 * streamed layer is loaded once per pass. */
static void
build_items_layer_major (Lower *L, Rank *R)
{
  guint m = (guint)L->l->grad_accum;
  guint count = g_array_index (R->chunk_count, guint, 0);
  R->items = g_array_new (FALSE, TRUE, sizeof (Item));
  for (guint u = 0; u < count; u++)
    for (guint j = 0; j < m; j++)
      {
        Item it = { 0, u, j, PASS_F, STOW_NONE };
        g_array_append_val (R->items, it);
      }
  for (guint k = 0; k < count; k++)
    {
      guint u = count - 1 - k;
      if (g_array_index (R->units, Unit, u).layer == STOW_LAYER_HEAD)
        continue;
      for (guint j = 0; j < m; j++)
        {
          Item it = { 0, u, j, PASS_B, STOW_NONE };
          g_array_append_val (R->items, it);
        }
    }
}

/* Whether an item needs the unit's weights: every forward, and backward
 * of layers (the embedding's backward is a scatter into its gradient). */
static gboolean
needs_weights (const Unit *u, const Item *it)
{
  if (u->gparams == 0)
    return FALSE;
  return it->pass == PASS_F || u->layer >= 0;
}

/* Uses: maximal runs of items on the same streamed unit share one load. */
static void
build_uses (Lower *L, Rank *R)
{
  R->uses = g_array_new (FALSE, TRUE, sizeof (Use));
  for (guint i = 0; i < R->items->len; i++)
    {
      Item *it = &g_array_index (R->items, Item, i);
      Unit *u = &g_array_index (R->units, Unit, it->unit);
      if (!u->streamed || !needs_weights (u, it))
        continue;
      Use *prev = R->uses->len ? &g_array_index (R->uses, Use, R->uses->len - 1)
                               : NULL;
      if (prev && prev->unit == it->unit && prev->last_item + 1 == i
          && g_array_index (R->items, Item, prev->first_item).pass == it->pass)
        {
          prev->last_item = i;
          it->use = R->uses->len - 1;
          continue;
        }
      Use use = { it->unit,  i,         i,         STOW_NONE,
                  STOW_NONE, STOW_NONE, STOW_NONE, FALSE };
      g_array_append_val (R->uses, use);
      it->use = R->uses->len - 1;
    }
}

static void flush_refreshes (Lower *L, Rank *R);

/* Loads use @k into its slot: read from NVMe into a staging buffer, copy
 * to the device, all-gather the shards (the stages present in this plan). */
static void
emit_load (Lower *L, Rank *R, guint k)
{
  Use *use = &g_array_index (R->uses, Use, k);
  if (use->emitted)
    return;
  use->emitted = TRUE;
  const Unit *u = &g_array_index (R->units, Unit, use->unit);
  guint slot = k % 2;
  guint prev = k >= 2 ? g_array_index (R->uses, Use, k - 2).freed : STOW_NONE;
  guint64 bytes = stow_bytes (u->gparams, L->wg);
  guint64 shard = stow_bytes (div_ceil (u->gparams, L->n), L->w);
  StowOp op;
  /* The slot's bytes are the persistent slot buffer's; this buffer names
   * its occupant, so that reuse and loads can be checked. */
  use->buffer = stow_program_buffer (L->p, R->rank, STOW_TIER_DEVICE, 0,
                                     (gint)slot, FALSE, "slot %u: %s%d", slot,
                                     u->layer >= 0 ? "L" : "unit ", u->layer);
  holds (L, use->buffer, STOW_BUF_WEIGHTS, u->pu, 1, L->wdt, u->layer, 0);
  guint ready = STOW_NONE;
  if (L->off_par)
    {
      guint staging = STOW_NONE;
      if (L->nvme_par)
        {
          /* Four staging buffers in pinned memory (the memory model's
           * "parameter staging buffers"). */
          guint sprev = k >= 4
                            ? g_array_index (R->uses, Use, k - 4).staging_freed
                            : STOW_NONE;
          staging = stow_program_buffer (L->p, R->rank, STOW_TIER_PINNED, 0,
                                         4 + (gint)(k % 4), FALSE,
                                         "staging %u: %d", k % 4, u->layer);
          emit_alloc (L, R->rank, STOW_STREAM_NVME_READ, staging, &sprev, 1);
          op = copy_op (R->rank, STOW_STREAM_NVME_READ, STOW_TIER_NVME,
                        STOW_TIER_PINNED, shard, u->layer);
          op.unit = u->pu, op.count = div_ceil (u->gparams, L->n);
          op_io (&op, STOW_NONE, STOW_NONE, staging);
          ready = emit (L, &op, NULL, 0, TRUE, "staged");
        }
      emit_alloc (L, R->rank, STOW_STREAM_H2D, use->buffer, &prev, 1);
      op = copy_op (R->rank, STOW_STREAM_H2D, STOW_TIER_PINNED,
                    STOW_TIER_DEVICE, shard, u->layer);
      op.unit = u->pu, op.count = div_ceil (u->gparams, L->n);
      op_io (&op, staging, STOW_NONE, use->buffer);
      ready = emit (L, &op, &ready, 1, TRUE, "copied up");
      if (staging != STOW_NONE)
        use->staging_freed
            = emit_free (L, R->rank, STOW_STREAM_H2D, staging, NULL, 0, TRUE);
      if (L->n > 1)
        {
          op = coll_op (L, R->rank, STOW_COLL_ALL_GATHER, bytes, u->layer);
          op_io (&op, use->buffer, STOW_NONE, use->buffer);
          ready = emit (L, &op, &ready, 1, TRUE, "gathered");
        }
    }
  else
    {
      emit_alloc (L, R->rank, STOW_STREAM_COMM, use->buffer, &prev, 1);
      op = coll_op (L, R->rank, STOW_COLL_ALL_GATHER, bytes, u->layer);
      op_io (&op, R->params_buf, STOW_NONE, use->buffer);
      ready = emit (L, &op, NULL, 0, TRUE, "gathered");
    }
  use->loaded = ready;
  /* Updated weights queued since the last load go up behind this one, so
   * that they never hold up a prefetch. */
  flush_refreshes (L, R);
}

/* The buffer holding a unit's weights for an item. */
static guint
weights_of (Lower *L, Rank *R, const Unit *u, const Item *it)
{
  if (!needs_weights (u, it))
    return STOW_NONE;
  if (it->use != STOW_NONE)
    return g_array_index (R->uses, Use, it->use).buffer;
  if (u->resident != STOW_NONE)
    return u->resident;
  return R->params_buf;
}

/* ---- gradients and the optimizer ---------------------------------------- */

static gboolean
uses_grad_slots (Lower *L)
{
  if (L->lora)
    return FALSE; /* adapters' gradients are small and persistent */
  guint64 gdiv = L->l->zero >= 2 ? L->n : 1;
  return L->off_opt || L->off_par || gdiv > 1;
}

/* Allocates gradient slot @grad for @u's next gradient write.  With the
 * optimizer on the host and one rank, the unit's earlier micro-batches
 * of the step are on the host: they go back up into the slot (on the
 * h2d stream, which then allocates it) so that the next write adds to
 * them, as the kernels add into the old gradients on the device, and the
 * sum is formed exactly as the device-resident run forms it.  One copy
 * of the unit's partial gradients per micro-batch after the first.
 * Returns that copy's event (the write waits for it and accumulates), or
 * STOW_NONE (the write starts the slot afresh). */
static guint
emit_grad_slot (Lower *L, Rank *R, Unit *u, guint grad, guint slot_index)
{
  guint *freed = &R->grad_slot_freed[slot_index];
  /* Layer-major accumulation (simulate --layer-major) runs a unit's
   * micro-batches back to back, where a copy up behind each copy down
   * would serialise them: its program accumulates on the host (priced,
   * not run by the executor). */
  if (!L->off_opt || L->n > 1 || L->so->layer_major
      || u->last_down == STOW_NONE)
    {
      emit_alloc (L, R->rank, STOW_STREAM_COMPUTE, grad, freed, 1);
      return STOW_NONE;
    }
  emit_alloc (L, R->rank, STOW_STREAM_H2D, grad, freed, 1);
  StowOp op = copy_op (R->rank, STOW_STREAM_H2D, STOW_TIER_PINNED,
                       STOW_TIER_DEVICE, stow_bytes (u->params, L->g),
                       u->layer);
  op.unit = u->pu;
  op_io (&op, R->host_grads_buf, STOW_NONE, grad);
  return emit (L, &op, &u->last_down, 1, TRUE, "partial gradients up");
}

/* After the backward (or loss) op of @u wrote its gradient to @slot (or to
 * the persistent gradients): reduce, copy down, free the slot.  Returns the
 * event after which the gradient of this micro-batch is in place. */
static guint
emit_grad_path (Lower *L, Rank *R, Unit *u, guint slot, guint done,
                gboolean last_mb)
{
  StowOp op;
  guint64 gbytes = stow_bytes (u->params, L->g);
  guint ev = done;
  if (slot == STOW_NONE)
    {
      /* Persistent full gradients: reduce once, after the last
       * micro-batch, through the gradient buckets. */
      if (last_mb && L->n > 1)
        {
          op = coll_op (L, R->rank,
                        L->l->zero == 0 ? STOW_COLL_ALL_REDUCE
                                        : STOW_COLL_REDUCE_SCATTER,
                        gbytes, u->layer);
          op_io (&op, R->grads_buf, R->bucket_buf[0], R->grads_buf);
          ev = emit (L, &op, &done, 1, TRUE, "reduced");
        }
      return ev;
    }
  StowStream free_on = STOW_STREAM_COMPUTE;
  if (L->n > 1)
    {
      /* In place: each rank keeps its 1/n slice of the slot. */
      op = coll_op (L, R->rank, STOW_COLL_REDUCE_SCATTER, gbytes, u->layer);
      op_io (&op, slot, STOW_NONE, L->off_opt ? slot : R->grads_buf);
      ev = emit (L, &op, &ev, 1, TRUE, "reduce-scattered");
      free_on = STOW_STREAM_COMM;
    }
  if (L->off_opt)
    {
      op = copy_op (R->rank, STOW_STREAM_D2H, STOW_TIER_DEVICE,
                    STOW_TIER_PINNED,
                    stow_bytes (div_ceil (u->params, L->n), L->g), u->layer);
      op_io (&op, slot, STOW_NONE, R->host_grads_buf);
      ev = emit (L, &op, &ev, 1, TRUE, "gradients down");
      u->last_down = ev;
      free_on = STOW_STREAM_D2H;
    }
  else if (L->n == 1)
    {
      /* Accumulate the slot into the gradients (device to device). */
      op = copy_op (R->rank, STOW_STREAM_COMPUTE, STOW_TIER_DEVICE,
                    STOW_TIER_DEVICE, gbytes, u->layer);
      op_io (&op, slot, STOW_NONE, R->grads_buf);
      ev = emit (L, &op, &ev, 1, TRUE, "accumulated");
    }
  guint fr = emit_free (L, R->rank, free_on, slot, &ev, 1, TRUE);
  R->grad_slot_freed[R->grad_slot_count % 2] = fr;
  R->grad_slot_count++;
  return ev;
}

/* What CPU Adam writes besides the states: with the parameters on NVMe
 * there is no host copy of the weights, so the updated weights take the
 * place of the gradients they were computed from (same type, same unit
 * layout; offload/adam.h allows the alias), until stored. */
static guint
adam_out (const Lower *L, const Rank *R)
{
  return L->nvme_par && L->off_opt ? R->host_grads_buf : STOW_NONE;
}

/* Refreshes the device copy of a unit's weights after its update. */
static void
emit_param_refresh (Lower *L, Rank *R, Unit *u, const guint *waits, guint nw,
                    guint64 params, StowStream up_stream)
{
  StowOp op;
  guint ev = STOW_NONE;
  guint64 shard_bytes = stow_bytes (params, L->w);
  if (L->off_par)
    {
      /* With CPU Adam and the parameters on NVMe, the updated weights are
       * in the host gradients' place (emit_optimizer): from there to the
       * store, and up to a resident unit. */
      guint from = adam_out (L, R);
      if (L->nvme_par)
        {
          op = copy_op (R->rank, STOW_STREAM_NVME_WRITE, STOW_TIER_PINNED,
                        STOW_TIER_NVME, shard_bytes, u->layer);
          if (from != STOW_NONE)
            {
              op.unit = u->pu, op.count = params;
              op_io (&op, from, R->write_buf, STOW_NONE);
            }
          emit (L, &op, waits, nw, FALSE, NULL);
        }
      if (u->resident == STOW_NONE)
        return;
      op = copy_op (R->rank, STOW_STREAM_H2D, STOW_TIER_PINNED,
                    STOW_TIER_DEVICE, shard_bytes, u->layer);
      op.unit = u->pu;
      op_io (&op, from, STOW_NONE, u->resident);
      ev = emit (L, &op, waits, nw, TRUE, "updated up");
      if (L->n > 1)
        {
          op = coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                        stow_bytes (u->gparams, L->wg), u->layer);
          op_io (&op, u->resident, STOW_NONE, u->resident);
          emit (L, &op, &ev, 1, FALSE, NULL);
        }
      return;
    }
  if (up_stream == STOW_STREAM_H2D)
    {
      op = copy_op (R->rank, STOW_STREAM_H2D, STOW_TIER_PINNED,
                    STOW_TIER_DEVICE, shard_bytes, u->layer);
      op_io (&op, STOW_NONE, STOW_NONE, R->params_buf);
      ev = emit (L, &op, waits, nw, TRUE, "updated up");
      waits = &ev, nw = 1;
    }
  /* ZeRO 1 and 2 keep full weights: gather the updated shards. */
  if (L->l->zero >= 1 && L->l->zero < 3 && L->n > 1)
    {
      op = coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                    stow_bytes (params * L->n, L->w), u->layer);
      op_io (&op, R->params_buf, STOW_NONE, R->params_buf);
      emit (L, &op, waits, nw, FALSE, NULL);
    }
}

/* CPU Adam's updated weights for the units in R->pending, after the last
 * read of the old ones. */
static void
flush_refreshes (Lower *L, Rank *R)
{
  for (guint i = 0; i < R->pending->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit,
                                g_array_index (R->pending, guint, i));
      guint w2[2] = { u->grads_ready, u->last_use };
      emit_param_refresh (L, R, u, w2, 2, div_ceil (u->params, L->n),
                          STOW_STREAM_H2D);
    }
  g_array_set_size (R->pending, 0);
}

/* Clipping by the global gradient norm: every update waits for it. */
static gboolean
clipping (const Lower *L)
{
  return L->so->optim.max_grad_norm > 0 && !L->so->delayed_update;
}

/* The global norm of the step's gradients, once every unit's are in
 * place (on the host for an offloaded optimizer); returns its event. */
static guint
emit_grad_norm (Lower *L, Rank *R, GArray *ready_order)
{
  StowOp op;
  gboolean host = L->off_opt;
  stow_op_init (&op, STOW_OP_GRAD_NORM,
                host ? STOW_STREAM_CPU_OPTIM : STOW_STREAM_COMPUTE, R->rank);
  op.on_gpu = !host;
  op.count = div_ceil (R->sp.params, L->l->zero >= 2 || host ? L->n : 1);
  op_io (&op, host ? R->host_grads_buf : R->grads_buf, STOW_NONE, STOW_NONE);
  g_autofree guint *waits = g_new (guint, ready_order->len + 1);
  guint nw = 0;
  for (guint i = 0; i < ready_order->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit,
                                g_array_index (ready_order, guint, i));
      if (u->grads_ready != STOW_NONE)
        waits[nw++] = u->grads_ready;
    }
  return emit (L, &op, waits, nw, TRUE, "gradient norm");
}

/* The updated weights of swap chunk @c (@cp parameters from c * @chunk
 * of the rank's flat parameters, updated by the op recording @up) back
 * where they live.  With the parameters on NVMe each unit the chunk
 * completes goes to the store (and up, resident) whole: the store holds
 * units, not chunks; @done_units and @unit_end carry the units done so
 * far from chunk to chunk. */
static void
refresh_swap_chunk (Lower *L, Rank *R, guint c, guint nchunks, guint64 chunk,
                    guint64 cp, guint up, guint *done_units, guint64 *unit_end)
{
  if (L->nvme_par)
    {
      for (; *done_units < R->units->len; (*done_units)++)
        {
          Unit *u = &g_array_index (R->units, Unit, *done_units);
          guint64 end = *unit_end + div_ceil (u->params, L->n);
          if (end > (guint64)c * chunk + cp && c + 1 < nchunks)
            break;
          *unit_end = end;
          if (u->params > 0)
            emit_param_refresh (L, R, u, &up, 1, div_ceil (u->params, L->n),
                                STOW_STREAM_H2D);
        }
      return;
    }
  /* The chunk's updated weights go back to where they live. */
  Unit dummy = { .layer = STOW_LAYER_NONE, .resident = STOW_NONE };
  guint first_op = L->p->ops->len;
  emit_param_refresh (L, R, &dummy, &up, 1, cp, STOW_STREAM_H2D);
  /* The copies say which parameters: the chunk's range. */
  for (guint o = first_op; o < L->p->ops->len; o++)
    {
      StowOp *e = &g_array_index (L->p->ops, StowOp, o);
      if (e->kind == STOW_OP_COPY)
        e->first = (guint64)c * chunk, e->count = cp, e->shard = c;
    }
}

/* The three-stage swap pipeline (ZeRO-Infinity; DeepSpeed's pipelined
 * optimizer swapper): read chunk i+1 while Adam updates chunk i while
 * chunk i-1 is written back; three pinned buffers.  Every chunk waits
 * for the last unit's gradients and for the gradient norm @norm. */
static void
emit_swap_pipeline (Lower *L, Rank *R, GArray *ready_order, guint norm)
{
  StowOp op;
  guint64 shard = div_ceil (R->sp.params, L->n);
  guint64 chunk = MAX (1, MIN (shard, L->mo->swap_shard_params));
  guint nchunks = (guint)div_ceil (shard, chunk);
  guint last_grads = STOW_NONE;
  for (guint i = 0; i < ready_order->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit,
                                g_array_index (ready_order, guint, i));
      if (u->grads_ready != STOW_NONE)
        last_grads = u->grads_ready;
    }
  g_autofree guint *freed = g_new (guint, nchunks);
  double per = L->master + L->opt;
  guint done_units = 0;
  guint64 unit_end = 0;
  for (guint c = 0; c < nchunks; c++)
    {
      guint64 cp = MIN (chunk, shard - (guint64)c * chunk);
      guint buf = stow_program_buffer (L->p, R->rank, STOW_TIER_PINNED,
                                       stow_bytes (cp, per), -1, FALSE,
                                       "swap buffer %u", c % 3);
      /* A chunk of the states (master, if any, then m, then v of its
       * parameters), the rank's flat parameters [first, first + cp). */
      holds (L, buf, STOW_BUF_STATES, STOW_NONE, 0, STOW_DTYPE_F32,
             STOW_LAYER_NONE, 0);
      guint prev = c >= 3 ? freed[c - 3] : STOW_NONE;
      emit_alloc (L, R->rank, STOW_STREAM_NVME_READ, buf, &prev, 1);
      op = copy_op (R->rank, STOW_STREAM_NVME_READ, STOW_TIER_NVME,
                    STOW_TIER_PINNED, stow_bytes (cp, per), STOW_LAYER_NONE);
      op.shard = c;
      op_io (&op, STOW_NONE, STOW_NONE, buf);
      guint rd = emit (L, &op, NULL, 0, TRUE, "states read");
      stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
      op.count = cp, op.shard = c;
      op.first = (guint64)c * chunk;
      op_io (&op, buf, R->host_grads_buf, buf);
      if (adam_out (L, R) != STOW_NONE)
        op.writes[op.n_writes++] = adam_out (L, R);
      guint w3[3] = { rd, last_grads, norm };
      guint up = emit (L, &op, w3, 3, TRUE, "updated");
      op = copy_op (R->rank, STOW_STREAM_NVME_WRITE, STOW_TIER_PINNED,
                    STOW_TIER_NVME, stow_bytes (cp, per), STOW_LAYER_NONE);
      op.shard = c;
      op_io (&op, buf, STOW_NONE, STOW_NONE);
      guint wr = emit (L, &op, &up, 1, TRUE, "states written");
      freed[c]
          = emit_free (L, R->rank, STOW_STREAM_NVME_WRITE, buf, &wr, 1, TRUE);
      refresh_swap_chunk (L, R, c, nchunks, chunk, cp, up, &done_units,
                          &unit_end);
    }
  /* Resident streamed layers take their updated weights from the host
   * once the pipeline is through. */
  for (guint i = 0; L->off_par && !L->nvme_par && i < R->units->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit, i);
      if (u->resident != STOW_NONE)
        emit_param_refresh (L, R, u, &freed[nchunks - 1], 1,
                            div_ceil (u->params, L->n), STOW_STREAM_H2D);
    }
}

/* Clipping with the optimizer on the host: CPU Adam on @u's shard once
 * the norm (@norm) is known, its updated weights up after the unit's
 * last use. */
static void
emit_clipped_host_step (Lower *L, Rank *R, Unit *u, guint norm)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
  op.count = div_ceil (u->params, L->n), op.layer = u->layer;
  op.unit = u->pu;
  op_io (&op, R->host_grads_buf, STOW_NONE, adam_out (L, R));
  guint w2[2] = { u->grads_ready, norm };
  guint up = emit (L, &op, w2, 2, TRUE, "updated");
  guint w3[2] = { up, u->last_use };
  emit_param_refresh (L, R, u, w3, 2, div_ceil (u->params, L->n),
                      STOW_STREAM_H2D);
}

/* One-step delayed update (ZeRO-Offload's DPU): the previous step's
 * gradients of @u are updated while this step runs; the new weights are
 * copied up after this step's last use. */
static void
emit_delayed_update (Lower *L, Rank *R, Unit *u)
{
  StowOp op;
  guint64 shard = div_ceil (u->params, L->n);
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
  op.count = shard, op.layer = u->layer, op.unit = u->pu;
  guint up = emit (L, &op, NULL, 0, TRUE, "updated (delayed)");
  guint w2[2] = { up, u->last_use };
  guint both = STOW_NONE;
  StowOp join;
  stow_op_init (&join, STOW_OP_COPY, STOW_STREAM_H2D, R->rank);
  join.src = STOW_TIER_PINNED, join.dst = STOW_TIER_DEVICE;
  join.bytes = stow_bytes (shard, L->w), join.layer = u->layer;
  if (!L->off_par)
    op_io (&join, STOW_NONE, STOW_NONE, R->params_buf);
  else if (u->resident != STOW_NONE)
    op_io (&join, STOW_NONE, STOW_NONE, u->resident);
  else
    return;
  both = emit (L, &join, w2, 2, TRUE, "updated up");
  if (L->l->zero >= 1 && L->l->zero < 3 && L->n > 1)
    {
      op = coll_op (L, R->rank, STOW_COLL_ALL_GATHER,
                    stow_bytes (shard * L->n, L->w), u->layer);
      op_io (&op, R->params_buf, STOW_NONE, R->params_buf);
      emit (L, &op, &both, 1, FALSE, NULL);
    }
}

/* Optimizer on the GPU, per unit as its gradients are reduced (and the
 * norm @norm is known, with clipping); with offloaded parameters the
 * updated shard goes back to the host copy. */
static void
emit_device_step (Lower *L, Rank *R, Unit *u, guint norm)
{
  StowOp op;
  guint64 odiv = L->l->zero >= 1 ? L->n : 1;
  stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_COMPUTE, R->rank);
  op.on_gpu = TRUE;
  op.layer = u->layer, op.unit = u->pu;
  op.count = div_ceil (u->params, odiv);
  op_io (&op, R->grads_buf, STOW_NONE, L->off_par ? STOW_NONE : R->params_buf);
  guint w2[2] = { u->grads_ready, norm };
  guint up = emit (L, &op, w2, 2, TRUE, "updated");
  if (L->off_par)
    {
      /* The updated shard goes back to the host copy. */
      op = copy_op (R->rank, STOW_STREAM_D2H, STOW_TIER_DEVICE,
                    STOW_TIER_PINNED,
                    stow_bytes (div_ceil (u->params, L->n), L->w), u->layer);
      guint down = emit (L, &op, &up, 1, TRUE, "updated down");
      emit_param_refresh (L, R, u, &down, 1, div_ceil (u->params, L->n),
                          STOW_STREAM_D2H);
    }
  else
    emit_param_refresh (L, R, u, &up, 1, div_ceil (u->params, odiv),
                        STOW_STREAM_COMPUTE);
}

/* The optimizer step of the units in @ready_order (the order their
 * gradients completed), after the gradient norm when clipping. */
static void
emit_optimizer (Lower *L, Rank *R, GArray *ready_order)
{
  guint norm = clipping (L) ? emit_grad_norm (L, R, ready_order) : STOW_NONE;
  if (L->nvme_opt)
    {
      emit_swap_pipeline (L, R, ready_order, norm);
      return;
    }
  for (guint i = 0; i < ready_order->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit,
                                g_array_index (ready_order, guint, i));
      if (u->params == 0)
        continue;
      if (L->off_opt && !L->so->delayed_update && norm != STOW_NONE)
        emit_clipped_host_step (L, R, u, norm);
      else if (L->off_opt && L->so->delayed_update)
        emit_delayed_update (L, R, u);
      else if (L->off_opt)
        continue; /* emitted as the gradients arrived (item_end) */
      else
        emit_device_step (L, R, u, norm);
    }
}

/* Full fine-tuning: every parameter trains (LoRA sizes its own). */
static gboolean
t_full (const Lower *L)
{
  return L->t->finetune == STOW_FINETUNE_FULL;
}

/* ---- one stage ------------------------------------------------------------
 */

/* What @R keeps of a state of @N parameters ZeRO shards @d ways, as
 * memory.c counts it: routed experts over their expert-data-parallel
 * group only. */
static guint64
rank_shard (const Rank *R, const StowLayout *l, guint64 N, guint64 d)
{
  return stow_mem_sharded_params (l, N, R->sp.experts, d);
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
emit_lora_states (Lower *L, Rank *R, const StateSizes *z)
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
      Unit *u = &g_array_index (R->units, Unit, i);
      u->params = u->layer >= 0 ? T / MAX (R->sp.layers, 1) : 0;
    }
}

/* The weights: on the host or NVMe (offloaded), else on the device, whole
 * or (ZeRO 3) a shard. */
static void
emit_weights (Lower *L, Rank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  guint64 N = z->N, n = L->n;
  guint ufirst = z->ufirst, ucount = z->ucount;
  if (L->off_par)
    holds (L,
           stow_program_buffer (p, rank,
                                L->nvme_par ? STOW_TIER_NVME : STOW_TIER_PINNED,
                                stow_bytes (rank_shard (R, l, N, n), L->w), -1,
                                TRUE, "offloaded parameters"),
           STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0);
  else
    R->params_buf = holds (
        L,
        stow_program_buffer (
            p, rank, STOW_TIER_DEVICE,
            stow_bytes (rank_shard (R, l, N, l->zero >= 3 ? n : 1), L->w), -1,
            TRUE, l->zero >= 3 ? "parameter shard" : "parameters"),
        STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0);
}

/* Gradients, master weights and optimizer states on the device. */
static void
emit_device_states (Lower *L, Rank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  guint64 N = z->N;
  guint64 odiv = z->odiv, gdiv = z->gdiv;
  guint ufirst = z->ufirst, ucount = z->ucount;
  R->grads_buf = holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                           stow_bytes (rank_shard (R, l, N, gdiv), L->g), -1,
                           TRUE, "gradients"),
      STOW_BUF_GRADS, ufirst, ucount, L->gdt, STOW_LAYER_NONE, 0);
  holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                           stow_bytes (rank_shard (R, l, N, odiv), L->master),
                           -1, TRUE, "master weights"),
      STOW_BUF_MASTER, ufirst, ucount, STOW_DTYPE_F32, STOW_LAYER_NONE, 0);
  holds (L,
         stow_program_buffer (p, rank, STOW_TIER_DEVICE,
                              stow_bytes (rank_shard (R, l, N, odiv), L->opt),
                              -1, TRUE, "optimizer states"),
         STOW_BUF_OPT_STATES, ufirst, ucount, STOW_DTYPE_F32, STOW_LAYER_NONE,
         0);
}

/* The offloaded optimizer's gradients, master weights and states on the
 * host (the states on NVMe with --offload-optimizer nvme). */
static void
emit_host_states (Lower *L, Rank *R, const StateSizes *z)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  guint64 N = z->N, n = L->n;
  guint ufirst = z->ufirst, ucount = z->ucount;
  R->host_grads_buf
      = holds (L,
               stow_program_buffer (p, rank, STOW_TIER_PINNED,
                                    stow_bytes (rank_shard (R, l, N, n), L->g),
                                    -1, TRUE, "offloaded gradients"),
               STOW_BUF_GRADS, ufirst, ucount, L->gdt, STOW_LAYER_NONE, 0);
  /* The delayed update applies the last step's gradients while this
   * step's come down: a second host copy of them, which the backends
   * trade places with the first at each step's start. */
  if (L->so->delayed_update)
    stow_program_buffer (p, rank, STOW_TIER_PINNED,
                         stow_bytes (rank_shard (R, l, N, n), L->g), -1, TRUE,
                         STOW_DELAYED_GRADS_NAME);
  holds (L,
         stow_program_buffer (
             p, rank, L->nvme_opt ? STOW_TIER_NVME : STOW_TIER_PINNED,
             stow_bytes (rank_shard (R, l, N, n), L->master + L->opt), -1, TRUE,
             "master weights and optimizer states"),
         STOW_BUF_STATES, ufirst, ucount, STOW_DTYPE_F32, STOW_LAYER_NONE, 0);
  /* Where CPU Adam writes the updated weights, the "updated up"
   * copies' source (memory.c's "host copy of the weights"); with
   * offloaded parameters those are the weights themselves. */
  if (!L->off_par)
    holds (L,
           stow_program_buffer (p, rank, STOW_TIER_PINNED,
                                stow_bytes (rank_shard (R, l, N, n), L->w), -1,
                                TRUE, "host copy of the weights"),
           STOW_BUF_WEIGHTS, ufirst, ucount, L->wdt, STOW_LAYER_NONE, 0);
}

/* Persistent state, sized as the memory model sizes it. */
static void
emit_persistent_state (Lower *L, Rank *R)
{
  const StowLayout *l = L->l;
  guint64 N = R->sp.params, n = L->n;
  /* Unsharded on one stage the units are exact (build_units): the state
   * buffers hold exactly their tensors, which a real backend fills. */
  if (l->tp == 1 && l->ep == 1 && l->pp == 1 && l->vpp == 1 && t_full (L))
    {
      N = 0;
      for (guint i = 0; i < R->units->len; i++)
        N += g_array_index (R->units, Unit, i).params;
    }
  StateSizes z = { .N = N };
  z.odiv = l->zero >= 1 ? n : 1, z.gdiv = l->zero >= 2 ? n : 1;
  rank_unit_run (R->units, &z.ufirst, &z.ucount);
  R->params_buf = R->grads_buf = R->host_grads_buf = STOW_NONE;
  R->bucket_buf[0] = R->bucket_buf[1] = STOW_NONE;
  R->grad_slot_freed[0] = R->grad_slot_freed[1] = STOW_NONE;
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
  if (l->zero < 2 && n > 1)
    for (guint i = 0; i < 2; i++)
      R->bucket_buf[i]
          = stow_program_buffer (L->p, R->rank, STOW_TIER_DEVICE, 25 * MiB, -1,
                                 TRUE, "gradient bucket %u", i);
}

/* Which units stream, which stay: the two-layer rule.  Returns the
 * rank's layer units. */
static guint
choose_resident (Lower *L, Rank *R)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint n_layer_units = 0;
  for (guint i = 0; i < R->units->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit, i);
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
          Unit *u = &g_array_index (R->units, Unit, i);
          if (u->layer < 0)
            continue;
          guint pos = S ? (guint)(((guint64)(next + 1) * n_layer_units) / S) - 1
                        : G_MAXUINT;
          if (S && idx == pos && next < S)
            next++;
          else
            {
              u->streamed = FALSE;
              u->resident = holds (
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
      Unit *u = &g_array_index (R->units, Unit, i);
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
emit_slots (Lower *L, Rank *R, guint n_layer_units)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  guint64 wmax = 0, gmax = 0;
  for (guint i = 0; i < R->units->len; i++)
    {
      Unit *u = &g_array_index (R->units, Unit, i);
      if (u->streamed)
        wmax = MAX (wmax, stow_bytes (u->gparams, L->wg));
      gmax = MAX (gmax, stow_bytes (u->params, L->g));
    }
  guint n_slots = MIN (2, MAX (n_layer_units, 1));
  /* Four pinned staging buffers for NVMe parameters, each one rank's
   * shard of the largest unit (slots 4-7). */
  guint64 big = 0;
  for (guint j = 0; j < R->units->len; j++)
    big = MAX (big, g_array_index (R->units, Unit, j).gparams);
  for (guint i = 0; L->nvme_par && wmax > 0 && i < 4; i++)
    stow_program_buffer (p, rank, STOW_TIER_PINNED,
                         stow_bytes (div_ceil (big, L->n), L->w), -1, TRUE,
                         "parameter staging buffer %u", i);
  /* ... and one that the updated units pass through to the store. */
  R->write_buf = STOW_NONE;
  if (L->nvme_par && L->off_opt && t_full (L) && big > 0)
    R->write_buf = stow_program_buffer (p, rank, STOW_TIER_PINNED,
                                        stow_bytes (div_ceil (big, L->n), L->w),
                                        -1, TRUE, "parameter write buffer");
  for (guint i = 0; wmax > 0 && i < n_slots; i++)
    stow_program_buffer (p, rank, STOW_TIER_DEVICE, wmax, -1, TRUE,
                         "layer slot %u", i);
  for (guint i = 0; uses_grad_slots (L) && i < n_slots; i++)
    stow_program_buffer (p, rank, STOW_TIER_DEVICE, gmax, -1, TRUE,
                         "gradient slot %u", i);
}

/* The order of the rank's items, the uses of its streamed units, and
 * each unit's last gradient write. */
static void
order_items (Lower *L, Rank *R)
{
  const StowLayout *l = L->l;
  if (L->so->layer_major && l->pp == 1 && l->vpp == 1)
    build_items_layer_major (L, R);
  else
    build_items (L, R);
  build_uses (L, R);
  for (guint i = 0; i < R->items->len; i++)
    {
      Item *it = &g_array_index (R->items, Item, i);
      Unit *u = &g_array_index (R->units, Unit, it->unit);
      gboolean grads = (it->pass == PASS_B && u->layer != STOW_LAYER_HEAD)
                       || (it->pass == PASS_F && u->layer == STOW_LAYER_HEAD);
      if (grads)
        u->last_grad_item = i;
    }
}

/* Recomputed layers: the first k of the stage, or of each model chunk
 * when interleaved (all when k = 0). */
static void
mark_recomputed (Lower *L, Rank *R)
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
          Unit *u = &g_array_index (R->units, Unit, i);
          if (u->layer >= 0)
            u->recompute = seen++ < n_rec;
        }
    }
}

/* ---- the item loop ------------------------------------------------------ */

/* The item being lowered and what its ops share. */
typedef struct
{
  guint i; /* its index in R->items */
  Item *it;
  Unit *u;
  Use *use; /* the load of its weights, or NULL */
  guint vs; /* its virtual stage */
  gboolean first_of_chunk, last_layer_of_chunk;
  guint waits[6]; /* what its compute op waits for */
  guint nw;
  guint wbuf; /* the buffer holding the unit's weights, or STOW_NONE */
  /* The gradient slot it writes and the copy of the unit's earlier
   * micro-batches into it (emit_grad_slot), or STOW_NONE. */
  guint grad, up;
  guint act_idx; /* (unit, micro-batch) in R->acts */
} ItemCtx;

/* Allocates the item loop's state: per micro-batch and layer,
 * activations; per micro-batch, inputs and logits. */
static void
items_init (Lower *L, Rank *R)
{
  const StowLayout *l = L->l;
  guint m = (guint)l->grad_accum;
  guint n_units = R->units->len;
  R->acts = g_new (guint, (gsize)n_units * m);
  R->host_acts = g_new (guint, (gsize)n_units * m);
  R->host_ready = g_new (guint, (gsize)n_units * m);
  R->last_compute = STOW_NONE;
  R->inputs = g_new (guint, m);
  R->logits = g_new (guint, m);
  R->ready_order = g_array_new (FALSE, FALSE, sizeof (guint));
  R->pending = g_array_new (FALSE, FALSE, sizeof (guint));
  for (guint i = 0; i < (guint)(n_units * m); i++)
    R->acts[i] = R->host_acts[i] = STOW_NONE;
  for (guint j = 0; j < m; j++)
    R->inputs[j] = R->logits[j] = STOW_NONE;
  /* Two all-reduces of the s b h activations per layer and pass under
   * tensor parallelism (Shoeybi et al. 2019); reduce-scatter plus
   * all-gather under sequence parallelism move the same bytes. */
  R->tp_bytes
      = l->tp > 1 ? 2
                        * (guint64)llround (2.0 * (double)L->t->seq_len / l->cp
                                            * l->micro_batch * L->m->hidden)
                  : 0;
}

/* Sets up item @i: where it sits in its chunk, the gradient slot it
 * writes, the load of its weights (and the prefetch of the next). */
static void
item_begin (Lower *L, Rank *R, guint i, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  Item *it = &g_array_index (R->items, Item, i);
  Unit *u = &g_array_index (R->units, Unit, it->unit);
  guint cfirst = g_array_index (R->chunk_first, guint, it->chunk);
  guint ccount = g_array_index (R->chunk_count, guint, it->chunk);
  *X = (ItemCtx){ .i = i, .it = it, .u = u };
  X->vs = it->chunk * l->pp + rank;
  X->first_of_chunk = it->unit == cfirst;
  X->last_layer_of_chunk
      = it->unit + 1 == cfirst + ccount
        || (it->unit + 2 == cfirst + ccount
            && g_array_index (R->units, Unit, it->unit + 1).layer
                   == STOW_LAYER_HEAD);
  for (guint k = 0; k < G_N_ELEMENTS (X->waits); k++)
    X->waits[k] = STOW_NONE;
  X->use = it->use != STOW_NONE ? &g_array_index (R->uses, Use, it->use) : NULL;
  /* The gradient slot this item writes (the head's loss, a layer's or
   * the embedding's backward), set up before the next use's prefetch
   * so that bringing earlier micro-batches up (emit_grad_slot) is not
   * queued behind it on the h2d stream. */
  X->grad = X->up = STOW_NONE;
  if (uses_grad_slots (L) && u->params > 0
      && (it->pass == PASS_F ? u->layer == STOW_LAYER_HEAD
                             : u->layer != STOW_LAYER_HEAD))
    {
      guint sl = R->grad_slot_count % 2;
      g_autofree char *what = u->layer == STOW_LAYER_HEAD ? g_strdup ("head")
                              : u->layer == STOW_LAYER_EMBEDDING
                                  ? g_strdup ("embedding")
                                  : g_strdup_printf ("L%d", u->layer);
      X->grad = holds (L,
                       stow_program_buffer (p, rank, STOW_TIER_DEVICE, 0,
                                            2 + (gint)sl, FALSE,
                                            "gradient slot %u: %s", sl, what),
                       STOW_BUF_GRADS, u->pu, 1, L->gdt, u->layer, it->mb);
      X->up = emit_grad_slot (L, R, u, X->grad, sl);
    }
  if (X->use)
    {
      emit_load (L, R, it->use);
      /* Prefetch: the next use's load is queued before this compute,
       * so its stream runs it as soon as its slot is free. */
      if (it->use + 1 < R->uses->len)
        emit_load (L, R, it->use + 1);
      X->waits[X->nw++] = X->use->loaded;
    }
  X->wbuf = weights_of (L, R, u, it);
  X->act_idx = it->unit * (guint)l->grad_accum + it->mb;
}

/* The gradient path of an op that wrote the item's gradients (@done):
 * reduced, copied down, the slot freed; the unit's gradients are ready
 * after its last. */
static void
item_grads (Lower *L, Rank *R, ItemCtx *X, guint done)
{
  Unit *u = X->u;
  guint ev = emit_grad_path (L, R, u, X->grad, done, X->i == u->last_grad_item);
  if (X->i == u->last_grad_item)
    u->grads_ready = ev;
}

/* The embedding's forward: the micro-batch's tokens and targets into its
 * input buffer, then the lookup. */
static guint
emit_embedding_forward (Lower *L, Rank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  StowOp op;
  R->inputs[it->mb] = holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->input_bytes, -1, FALSE,
                           "input ids and embeddings mb%u", it->mb),
      STOW_BUF_INPUT, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, R->inputs[it->mb], NULL, 0);
  /* Tokens and targets of the micro-batch. */
  stow_op_init (&op, STOW_OP_DATA, STOW_STREAM_COMPUTE, rank);
  op.micro_batch = it->mb;
  op_io (&op, STOW_NONE, STOW_NONE, R->inputs[it->mb]);
  emit (L, &op, NULL, 0, FALSE, NULL);
  stow_op_init (&op, STOW_OP_FORWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op_io (&op, X->wbuf, R->inputs[it->mb], R->inputs[it->mb]);
  return emit (L, &op, X->waits, X->nw, TRUE, "forward");
}

/* The loss: the output layer forward and backward into the logits, and
 * its gradients (a tied head's into the embedding's too). */
static guint
emit_loss (Lower *L, Rank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  StowOp op;
  R->logits[it->mb]
      = holds (L,
               stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->logits_bytes,
                                    -1, FALSE, "logits mb%u", it->mb),
               STOW_BUF_LOGITS, STOW_NONE, 0, STOW_DTYPE_F32, u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, R->logits[it->mb], NULL, 0);
  guint grad = X->grad, up = X->up;
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_LOSS, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  /* A tied head writes the embedding's gradient too. */
  Unit *tied = NULL;
  if (u->params < u->gparams)
    for (guint k = 0; k < R->units->len; k++)
      if (g_array_index (R->units, Unit, k).layer == STOW_LAYER_EMBEDDING)
        tied = &g_array_index (R->units, Unit, k);
  op.accumulate = grad_write (u, tied);
  if (grad != STOW_NONE)
    op.accumulate = up != STOW_NONE;
  op_io (&op, X->wbuf, STOW_NONE, R->logits[it->mb]);
  if (grad != STOW_NONE)
    op.writes[op.n_writes++] = grad;
  else if (R->grads_buf != STOW_NONE && u->params > 0)
    op.writes[op.n_writes++] = R->grads_buf;
  guint done = emit (L, &op, X->waits, X->nw, TRUE, "loss");
  if (u->params > 0)
    item_grads (L, R, X, done);
  return done;
}

/* --offload-activations: the checkpoint goes down as soon as the layer's
 * forward (@done) has written it; the device copy is freed after. */
static void
emit_checkpoint_down (Lower *L, Rank *R, ItemCtx *X, guint done)
{
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  guint a = X->act_idx;
  guint hb
      = stow_program_buffer (L->p, rank, STOW_TIER_PINNED, L->ckpt, -1, FALSE,
                             "checkpoint L%d mb%u (host)", u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, hb, NULL, 0);
  StowOp c = copy_op (rank, STOW_STREAM_D2H, STOW_TIER_DEVICE, STOW_TIER_PINNED,
                      L->ckpt, u->layer);
  c.micro_batch = it->mb;
  op_io (&c, R->acts[a], STOW_NONE, hb);
  guint down = emit (L, &c, &done, 1, TRUE, "checkpoint down");
  emit_free (L, rank, STOW_STREAM_D2H, R->acts[a], &down, 1, FALSE);
  R->acts[a] = STOW_NONE;
  R->host_acts[a] = hb;
  R->host_ready[a] = down;
}

/* A layer's forward: its activations (a checkpoint only, when it is
 * recomputed) kept for the backward. */
static guint
emit_layer_forward (Lower *L, Rank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  guint a = X->act_idx;
  StowOp op;
  guint64 bytes = u->recompute ? L->ckpt : L->full;
  R->acts[a]
      = holds (L,
               stow_program_buffer (p, rank, STOW_TIER_DEVICE, bytes, -1, FALSE,
                                    "activations L%d mb%u", u->layer, it->mb),
               u->recompute ? STOW_BUF_CHECKPOINT : STOW_BUF_ACTIVATIONS,
               STOW_NONE, 0, L->wdt, u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, R->acts[a], NULL, 0);
  stow_op_init (&op, STOW_OP_FORWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  /* A recomputed layer's forward still computes what it does not keep: a
   * working set for it, freed at once. */
  guint fws = STOW_NONE;
  if (u->recompute && L->full > L->ckpt)
    {
      fws = holds (L,
                   stow_program_buffer (
                       p, rank, STOW_TIER_DEVICE, L->full - L->ckpt, -1, FALSE,
                       "forward working set L%d mb%u", u->layer, it->mb),
                   STOW_BUF_RECOMPUTED, STOW_NONE, 0, L->wdt, u->layer, it->mb);
      emit_alloc (L, rank, STOW_STREAM_COMPUTE, fws, NULL, 0);
    }
  op_io (&op, X->wbuf, STOW_NONE, R->acts[a]);
  if (fws != STOW_NONE)
    op.writes[op.n_writes++] = fws;
  guint done = emit (L, &op, X->waits, X->nw, TRUE, "forward");
  if (fws != STOW_NONE)
    emit_free (L, rank, STOW_STREAM_COMPUTE, fws, NULL, 0, FALSE);
  R->last_compute = done;
  if (l->offload_activations && u->recompute)
    emit_checkpoint_down (L, R, X, done);
  return done;
}

/* A forward item: after the previous stage's activations, and its own
 * sent on to the next stage at the end of the chunk. */
static guint
emit_forward (Lower *L, Rank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  guint done;
  if (X->first_of_chunk && X->vs > 0)
    X->waits[X->nw++] = xevent (L, rank, PASS_F, X->vs - 1, it->mb);
  if (u->layer == STOW_LAYER_EMBEDDING)
    done = emit_embedding_forward (L, R, X);
  else if (u->layer == STOW_LAYER_HEAD)
    done = emit_loss (L, R, X);
  else
    done = emit_layer_forward (L, R, X);
  if (X->last_layer_of_chunk && X->vs + 1 < l->pp * l->vpp)
    {
      StowOp op = send_op (L, rank, u->layer, it->mb);
      op.record = xevent (L, rank, PASS_F, X->vs, it->mb);
      emit (L, &op, &done, 1, FALSE, NULL);
    }
  return done;
}

/* The embedding's backward: a scatter of the input gradient into its
 * gradients. */
static guint
emit_embedding_backward (Lower *L, Rank *R, ItemCtx *X)
{
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  StowOp op;
  guint grad = X->grad, up = X->up;
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_BACKWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.accumulate = grad_write (u, NULL);
  if (grad != STOW_NONE)
    op.accumulate = up != STOW_NONE;
  op_io (&op, R->inputs[it->mb], STOW_NONE,
         grad != STOW_NONE ? grad : R->grads_buf);
  guint done = emit (L, &op, X->waits, X->nw, TRUE, "backward");
  emit_free (L, rank, STOW_STREAM_COMPUTE, R->inputs[it->mb], NULL, 0, FALSE);
  if (u->params > 0)
    item_grads (L, R, X, done);
  return done;
}

/* The loss's backward has run: the last layer's backward frees the
 * logits and holds the loss gradient instead.  Returns that buffer, or
 * STOW_NONE. */
static guint
emit_loss_grad (Lower *L, Rank *R, ItemCtx *X)
{
  guint rank = R->rank;
  Item *it = X->it;
  guint n_units = R->units->len;
  if (R->logits[it->mb] == STOW_NONE || it->unit + 2 != n_units
      || g_array_index (R->units, Unit, n_units - 1).layer != STOW_LAYER_HEAD)
    return STOW_NONE;
  /* The checkpoint upload waits for this free: the loss's peak does not
   * hold the prefetched checkpoint. */
  R->last_compute = emit_free (L, rank, STOW_STREAM_COMPUTE, R->logits[it->mb],
                               NULL, 0, TRUE);
  R->logits[it->mb] = STOW_NONE;
  guint dh = holds (
      L,
      stow_program_buffer (L->p, rank, STOW_TIER_DEVICE, L->loss_grad_bytes, -1,
                           FALSE, "loss gradient mb%u", it->mb),
      STOW_BUF_LOSS_GRAD, STOW_NONE, 0, L->wdt, X->u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, dh, NULL, 0);
  return dh;
}

/* Brings a checkpoint on the host back for its recomputation; the
 * backward waits for it. */
static void
emit_checkpoint_up (Lower *L, Rank *R, ItemCtx *X)
{
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  guint a = X->act_idx;
  if (R->host_acts[a] == STOW_NONE)
    return;
  R->acts[a] = holds (
      L,
      stow_program_buffer (L->p, rank, STOW_TIER_DEVICE, L->ckpt, -1, FALSE,
                           "checkpoint L%d mb%u", u->layer, it->mb),
      STOW_BUF_CHECKPOINT, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  /* One checkpoint of prefetch: the upload starts once the compute op
   * before this backward has (the memory model's two checkpoints on the
   * device). */
  guint gate[2] = { R->host_ready[a], R->last_compute };
  guint ngate = R->last_compute != STOW_NONE ? 2 : 1;
  emit_alloc (L, rank, STOW_STREAM_H2D, R->acts[a], gate, ngate);
  StowOp c = copy_op (rank, STOW_STREAM_H2D, STOW_TIER_PINNED, STOW_TIER_DEVICE,
                      L->ckpt, u->layer);
  c.micro_batch = it->mb;
  op_io (&c, R->host_acts[a], STOW_NONE, R->acts[a]);
  guint ck = emit (L, &c, gate, ngate, TRUE, "checkpoint up");
  emit_free (L, rank, STOW_STREAM_H2D, R->host_acts[a], &ck, 1, FALSE);
  R->host_acts[a] = STOW_NONE;
  g_assert (X->nw < G_N_ELEMENTS (X->waits));
  X->waits[X->nw++] = ck;
}

/* Full recomputation: the layer's forward again from its checkpoint,
 * into a buffer of what it did not keep.  Returns that buffer. */
static guint
emit_recompute (Lower *L, Rank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  StowOp op;
  guint rec
      = holds (L,
               stow_program_buffer (L->p, rank, STOW_TIER_DEVICE,
                                    L->full - MIN (L->ckpt, L->full), -1, FALSE,
                                    "recomputed L%d mb%u", u->layer, it->mb),
               STOW_BUF_RECOMPUTED, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, rec, NULL, 0);
  stow_op_init (&op, STOW_OP_RECOMPUTE, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  op_io (&op, X->wbuf, R->acts[X->act_idx], rec);
  emit (L, &op, X->waits, X->nw, FALSE, NULL);
  X->nw = 0; /* the stream orders the backward after it */
  return rec;
}

/* A layer's backward: the loss gradient or the next layer's, its
 * checkpoint back and recomputed when it was, a working set; then its
 * gradients' path and the input gradient sent to the previous stage at
 * the start of the chunk. */
static guint
emit_layer_backward (Lower *L, Rank *R, ItemCtx *X)
{
  StowProgram *p = L->p;
  const StowLayout *l = L->l;
  guint rank = R->rank;
  Item *it = X->it;
  Unit *u = X->u;
  guint a = X->act_idx;
  StowOp op;
  guint rec = STOW_NONE;
  guint dh = emit_loss_grad (L, R, X);
  emit_checkpoint_up (L, R, X);
  if (u->recompute)
    rec = emit_recompute (L, R, X);
  guint ws = holds (
      L,
      stow_program_buffer (p, rank, STOW_TIER_DEVICE, L->block, -1, FALSE,
                           "backward working set L%d mb%u", u->layer, it->mb),
      STOW_BUF_WORKSPACE, STOW_NONE, 0, L->wdt, u->layer, it->mb);
  emit_alloc (L, rank, STOW_STREAM_COMPUTE, ws, NULL, 0);
  guint grad = X->grad, up = X->up; /* up: partial gradients up */
  if (up != STOW_NONE)
    X->waits[X->nw++] = up;
  stow_op_init (&op, STOW_OP_BACKWARD, STOW_STREAM_COMPUTE, rank);
  op.layer = u->layer, op.unit = u->pu, op.micro_batch = it->mb;
  /* A gradient slot holds this micro-batch's gradients, added to the
   * earlier ones brought up (emit_grad_slot). */
  op.accumulate = grad != STOW_NONE ? up != STOW_NONE : grad_write (u, NULL);
  op.bytes = R->tp_bytes, op.group = STOW_GROUP_TP, op.group_size = l->tp,
  op.intra_node = TRUE;
  op_io (&op, X->wbuf, R->acts[a], grad != STOW_NONE ? grad : R->grads_buf);
  if (rec != STOW_NONE)
    op.reads[op.n_reads++] = rec;
  op.writes[op.n_writes++] = ws;
  guint done = emit (L, &op, X->waits, X->nw, TRUE, "backward");
  R->last_compute = done;
  emit_free (L, rank, STOW_STREAM_COMPUTE, R->acts[a], NULL, 0, FALSE);
  if (rec != STOW_NONE)
    emit_free (L, rank, STOW_STREAM_COMPUTE, rec, NULL, 0, FALSE);
  emit_free (L, rank, STOW_STREAM_COMPUTE, ws, NULL, 0, FALSE);
  if (dh != STOW_NONE)
    emit_free (L, rank, STOW_STREAM_COMPUTE, dh, NULL, 0, FALSE);
  item_grads (L, R, X, done);
  if (X->first_of_chunk && X->vs > 0)
    {
      op = send_op (L, rank, u->layer, it->mb);
      op.record = xevent (L, rank, PASS_B, X->vs, it->mb);
      emit (L, &op, &done, 1, FALSE, NULL);
    }
  return done;
}

/* A backward item: after the next stage's gradients at the end of the
 * chunk. */
static guint
emit_backward (Lower *L, Rank *R, ItemCtx *X)
{
  const StowLayout *l = L->l;
  if (X->last_layer_of_chunk && X->vs + 1 < l->pp * l->vpp)
    X->waits[X->nw++] = xevent (L, R->rank, PASS_B, X->vs + 1, X->it->mb);
  if (X->u->layer == STOW_LAYER_EMBEDDING)
    return emit_embedding_backward (L, R, X);
  return emit_layer_backward (L, R, X);
}

/* After item's compute (@done): its slot freed after the use's last
 * item; the unit's gradients complete after its last, and with
 * ZeRO-Offload CPU Adam on its shard as soon as they are down (Ren et
 * al. 2021, §4.1). */
static void
item_end (Lower *L, Rank *R, ItemCtx *X, guint done)
{
  Item *it = X->it;
  Unit *u = X->u;
  Use *use = X->use;
  if (use && X->i == use->last_item)
    use->freed = emit_free (L, R->rank, STOW_STREAM_COMPUTE, use->buffer, NULL,
                            0, TRUE);
  u->last_use = done;
  if (X->i != u->last_grad_item || u->params == 0)
    return;
  g_array_append_val (R->ready_order, it->unit);
  if (L->off_opt && !L->nvme_opt && !L->so->delayed_update && !clipping (L))
    {
      StowOp op;
      guint64 shard = div_ceil (u->params, L->n);
      stow_op_init (&op, STOW_OP_OPTIM_STEP, STOW_STREAM_CPU_OPTIM, R->rank);
      op.count = shard, op.layer = u->layer, op.unit = u->pu;
      op_io (&op, R->host_grads_buf, STOW_NONE, adam_out (L, R));
      u->grads_ready = emit (L, &op, &u->grads_ready, 1, TRUE, "updated");
      u->last_use = done;
      g_array_append_val (R->pending, it->unit);
    }
}

static void
lower_rank (Lower *L, Rank *R)
{
  emit_persistent_state (L, R);
  guint n_layer_units = choose_resident (L, R);
  emit_slots (L, R, n_layer_units);
  order_items (L, R);
  mark_recomputed (L, R);
  items_init (L, R);

  if (R->uses->len > 0)
    emit_load (L, R, 0);
  for (guint i = 0; i < R->items->len; i++)
    {
      ItemCtx X;
      item_begin (L, R, i, &X);
      guint done = X.it->pass == PASS_F ? emit_forward (L, R, &X)
                                        : emit_backward (L, R, &X);
      item_end (L, R, &X, done);
    }
  /* Logits not freed by a layer's backward (a stage with no layers). */
  for (guint j = 0; j < (guint)L->l->grad_accum; j++)
    if (R->logits[j] != STOW_NONE)
      emit_free (L, R->rank, STOW_STREAM_COMPUTE, R->logits[j], NULL, 0, FALSE);

  flush_refreshes (L, R);
  emit_optimizer (L, R, R->ready_order);
  g_array_unref (R->pending);
  g_array_unref (R->ready_order);
  g_free (R->acts);
  g_free (R->host_acts);
  g_free (R->host_ready);
  g_free (R->inputs);
  g_free (R->logits);

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
lower_init (Lower *L, const StowModel *m, const StowCluster *c,
            const StowTraining *t, const StowLayout *l,
            const StowMemOptions *mo, const StowScheduleOptions *so)
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
  L->p->loss_scale = 1.0
                     / ((double)MAX (t->global_batch, 1)
                        * (double)stow_mem_decoder_seq (m, t));
  L->p->optim = so->optim;
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
  L->xevents = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
}

/* The device budget: what the memory model leaves of the capacity,
 * counted in tensor bytes (the allocator's slack grows with them). */
static void
set_device_budget (Lower *L, const StowMemory *mem)
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
layer_major_extra (Lower *L, const StowMemory *mem, guint64 *extra_out,
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
choose_k_resident (Lower *L, const StowMemory *mem, guint64 extra,
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
      if (!stow_layout_resolve_resident (m, L->c, L->t, &r, L->mo, error))
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
stow_schedule_lower (const StowModel *m, const StowCluster *c,
                     const StowTraining *t, const StowLayout *l,
                     const StowMemOptions *mo_in,
                     const StowScheduleOptions *so_in, GError **error)
{
  StowMemOptions mo_default;
  StowScheduleOptions so_default;
  g_return_val_if_fail (m != NULL && c != NULL && t != NULL && l != NULL, NULL);
  if (mo_in == NULL)
    stow_mem_options_init (&mo_default), mo_in = &mo_default;
  if (so_in == NULL)
    stow_schedule_options_init (&so_default), so_in = &so_default;
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
  g_autoptr (StowMemory) mem = stow_memory_estimate (m, c, t, l, mo_in, error);
  if (mem == NULL)
    return NULL;

  Lower L = { 0 };
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
      Rank R = { 0 };
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
