/* SPDX-License-Identifier: MIT
 *
 * planner/sim.c: the simulator backend (planner/sim.h).
 * Each (rank, stream) has a virtual clock; an op starts when its stream is
 * free and its events are recorded, and a rank's NVMe read and write
 * streams share its drives.  Layer, embedding, loss, collective and send
 * ops of a lowered plan are priced by the time model (planner/cost.c);
 * copies, Adam and hand-built ops from the cluster's rates here.
 */
#include "planner/sim.h"

#include <math.h>

#include "planner/cost.h"
#include "planner/memory.h"
#include "planner/plan.h"

/* Achieved fraction of the tensor-core peak for transformer GEMMs: a
 * planning default (Megatron-LM reports 40-55% MFU at scale, Narayanan et
 * al. 2021, Table 1). */
#define STOW_SIM_MFU             0.5
#define STOW_SIM_INTRA_LATENCY_S 10e-6

typedef struct
{
  StowBackend parent;
  StowModel *model;
  StowCluster *cluster;
  StowTraining training;
  StowLayout layout;
  gboolean have_layout;
  guint64 capacity[STOW_N_TIERS];
  GHashTable *used; /* (rank * tiers + tier) -> guint64 bytes, boxed */
  /* the time model's prices, when a layout is known */
  StowLayerSeconds ls[2]; /* dense and MoE layers */
  StowEndsSeconds ends;
  StowCostOptions co;
  GHashTable *fixed; /* op -> double seconds, boxed (tests) */
  /* virtual clocks */
  guint n_ranks;
  double *qtime;      /* [rank * streams + stream] */
  guint *qlast;       /* the last op on each queue */
  double *drive_time; /* [rank] */
  guint *drive_last;
  GArray *ev_time; /* double per event, -1 before it is recorded */
  GArray *ev_op;   /* guint */
  GArray *op_start, *op_end, *op_flops; /* double per op */
} SimBackend;

/* Forward FLOPs of one layer for one micro-batch on one GPU (Narayanan et
 * al. 2021: 24 B s h^2 + 4 B s^2 h per layer, here from the layer's own
 * parameter count). */
static double
layer_flops (const StowModel *m, const StowTraining *t, const StowLayout *l,
             guint64 layer)
{
  double tokens = (double)t->seq_len / l->cp * (double)l->micro_batch;
  double active = (double)m->layers[layer].active_params / l->tp;
  /* 2 FLOPs per weight per token, and QK^T plus AV: 4 s per token per
   * (heads x head_dim) of this GPU. */
  double attn = 4.0 * tokens * ((double)t->seq_len / l->cp)
                * (double)(m->n_heads * m->head_dim) / l->tp;
  return 2.0 * active * tokens + attn;
}

/* Ring collectives (Patarasuk and Yuan 2009): all-reduce moves
 * 2 (n-1)/n of the payload, reduce-scatter and all-gather (n-1)/n. */
static double
collective_seconds (const StowCluster *c, const StowOp *op)
{
  const StowNode *node = &c->node;
  double bw, lat;
  if (op->intra_node)
    {
      bw = node->gpu.nvlink_bw > 0 ? node->gpu.nvlink_bw : node->gpu.pcie_bw;
      lat = STOW_SIM_INTRA_LATENCY_S;
    }
  else
    {
      bw = node->net_bw_per_gpu > 0 ? node->net_bw_per_gpu : node->gpu.pcie_bw;
      lat = node->net_latency_s > 0 ? node->net_latency_s : 5e-6;
    }
  double n = MAX (op->group_size, 1);
  double bytes = (double)op->bytes;
  switch (op->coll)
    {
    case STOW_COLL_ALL_REDUCE:
      return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
    case STOW_COLL_REDUCE_SCATTER:
    case STOW_COLL_ALL_GATHER:
      return (n - 1) / n * bytes / bw + (n - 1) * lat;
    case STOW_COLL_SEND:
      return bytes / bw + lat;
    }
  return 0;
}

/* An NVMe read or write of @bytes by one rank.  The node's drives are
 * shared by its GPUs' ranks, the data is striped evenly over them, and a
 * rank's reads and writes share one queue (its nvme_read and nvme_write
 * streams take turns on one clock, see advance()), so each is priced at the
 * rates of the drive that bounds a read-and-write step: the busiest one,
 * core/drives.h's rule, as the time model prices the NVMe optimizer step. */
static double
nvme_seconds (const StowNode *node, double bytes, gboolean write)
{
  if (node->n_nvme == 0)
    return 0;
  double per_gpu = MAX (node->gpus_per_node, 1);
  StowDriveSeconds drives[node->n_nvme];
  guint n = stow_cost_nvme_drive_seconds (node, bytes * per_gpu,
                                          bytes * per_gpu, drives);
  guint b = 0;
  stow_drives_io_s (drives, n, &b);
  return write ? drives[b].write_s : drives[b].read_s;
}

static double
copy_seconds (const StowCluster *c, const StowOp *op)
{
  const StowNode *node = &c->node;
  double per_gpu = MAX (node->gpus_per_node, 1);
  double bytes = (double)op->bytes;
  gboolean dev_src = op->src == STOW_TIER_DEVICE,
           dev_dst = op->dst == STOW_TIER_DEVICE;
  if (dev_src && dev_dst)
    return 2.0 * bytes / node->gpu.hbm_bw; /* read and write */
  if (dev_src || dev_dst)
    {
      /* Pageable memory goes through a bounce buffer: about half. */
      gboolean pageable
          = op->src == STOW_TIER_HOST || op->dst == STOW_TIER_HOST;
      return bytes / (node->gpu.pcie_bw * (pageable ? 0.5 : 1.0));
    }
  if (op->src == STOW_TIER_NVME)
    return nvme_seconds (node, bytes, FALSE);
  if (op->dst == STOW_TIER_NVME)
    return nvme_seconds (node, bytes, TRUE);
  return 2.0 * bytes / (node->host_mem_bw / per_gpu);
}

/* FLOPs of a compute op of a lowered plan (reports), 0 otherwise. */
static double
compute_flops (const SimBackend *s, const StowOp *op)
{
  const StowModel *m = s->model;
  const StowLayout *l = &s->layout;
  const StowTraining *t = &s->training;
  if (!s->have_layout || m == NULL)
    return 0;
  if (op->kind == STOW_OP_LOSS)
    /* forward and backward of the output layer: 6 s b h V */
    return 6.0 * (double)t->seq_len / l->cp * (double)l->micro_batch
           * (double)m->hidden * (double)m->vocab / l->tp;
  if (op->layer < 0 || (guint64)op->layer >= m->n_layers)
    return 0;
  double f = layer_flops (m, t, l, (guint64)op->layer);
  if (op->kind == STOW_OP_BACKWARD)
    {
      f *= 2.0;
      if (l->recompute == STOW_RECOMPUTE_SELECTIVE)
        /* Rebuild the attention core: the 4 s^2 h part. */
        f += 4.0 * (double)t->seq_len / l->cp * (double)l->micro_batch
             * (double)t->seq_len / l->cp * (double)(m->n_heads * m->head_dim)
             / l->tp;
    }
  return op->kind == STOW_OP_FORWARD || op->kind == STOW_OP_RECOMPUTE
                 || op->kind == STOW_OP_BACKWARD
             ? f
             : 0;
}

/* A compute op as the time model prices it (planner/cost.c), so that
 * simulated and predicted steps agree where they should; 0 where it does
 * not price it. */
static double
time_model_seconds (const SimBackend *s, const StowOp *op)
{
  const StowModel *m = s->model;
  if (!s->have_layout || m == NULL)
    return 0;
  gint layer = op->layer;
  switch (op->kind)
    {
    case STOW_OP_FORWARD:
    case STOW_OP_BACKWARD:
    case STOW_OP_RECOMPUTE:
      if (layer == STOW_LAYER_EMBEDDING)
        return op->kind == STOW_OP_FORWARD
                   ? s->ends.embedding_fwd_s + s->ends.embedding_tp_s
                   : s->ends.embedding_bwd_s;
      if (layer < 0 || (guint64)layer >= m->n_layers)
        return 0;
      {
        const StowLayerSeconds *ls = &s->ls[m->layers[layer].is_moe ? 1 : 0];
        if (op->kind == STOW_OP_BACKWARD)
          return ls->backward_s
                 + (s->layout.recompute == STOW_RECOMPUTE_SELECTIVE
                        ? ls->selective_s
                        : 0);
        return ls->forward_s;
      }
    case STOW_OP_LOSS: /* forward and backward of the output layer */
      return s->ends.head_fwd_s + s->ends.head_bwd_s;
    case STOW_OP_COLLECTIVE:
      {
        const StowLayout *l = &s->layout;
        if (op->coll == STOW_COLL_SEND)
          return stow_cost_p2p_seconds (s->cluster, &s->co, (double)op->bytes,
                                        (guint64)l->tp * l->cp * l->dp);
        /* Hierarchical over the ranks tp apart, as the time model. */
        return stow_cost_dp_collective_seconds (
            s->cluster, &s->co, (double)op->bytes, op->group_size, l->tp,
            op->coll != STOW_COLL_ALL_REDUCE);
      }
    default:
      return 0;
    }
}

double
stow_sim_op_seconds (StowBackend *b, const StowProgram *p, guint i,
                     double *flops_out)
{
  SimBackend *s = (SimBackend *)b;
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  const StowCluster *c = s->cluster;
  const StowNode *node = &c->node;
  double flops = compute_flops (s, op);
  if (flops_out)
    *flops_out = flops;
  gpointer fixed;
  if (g_hash_table_lookup_extended (s->fixed, GUINT_TO_POINTER (i), NULL,
                                    &fixed))
    return *(double *)fixed;
  double tm = time_model_seconds (s, op);
  if (tm > 0)
    return tm;
  switch (op->kind)
    {
    case STOW_OP_ALLOC:
    case STOW_OP_FREE:
    case STOW_OP_DATA:
      return 0;
    case STOW_OP_COPY:
      return copy_seconds (c, op);
    case STOW_OP_FORWARD:
    case STOW_OP_BACKWARD:
    case STOW_OP_RECOMPUTE:
    case STOW_OP_LOSS:
      {
        double sec = flops
                     / (stow_cost_peak_flops (&node->gpu, s->training.precision)
                        * STOW_SIM_MFU);
        /* Tensor-parallel all-reduces sit inside the layer, on its
         * critical path. */
        if (op->bytes > 0 && op->group_size > 1)
          {
            StowOp ar = *op;
            ar.coll = STOW_COLL_ALL_REDUCE;
            sec += collective_seconds (c, &ar);
          }
        return sec;
      }
    case STOW_OP_OPTIM_STEP:
      {
        double bytes = (double)op->count * STOW_SIM_ADAM_BYTES_PER_PARAM;
        if (op->on_gpu)
          return bytes / node->gpu.hbm_bw;
        /* The node's memory bandwidth is shared by its GPUs' ranks. */
        return bytes / (node->host_mem_bw / MAX (node->gpus_per_node, 1));
      }
    case STOW_OP_GRAD_NORM:
      {
        /* One read of the gradients (op->count of them). */
        double bytes = (double)op->count * stow_dtype_size (p->grad_dtype);
        if (op->on_gpu)
          return bytes / node->gpu.hbm_bw;
        return bytes / (node->host_mem_bw / MAX (node->gpus_per_node, 1));
      }
    case STOW_OP_COLLECTIVE:
      return collective_seconds (c, op);
    case STOW_N_OP_KINDS:
      break;
    }
  return 0;
}

static gboolean
is_drive_stream (StowStream s)
{
  return s == STOW_STREAM_NVME_READ || s == STOW_STREAM_NVME_WRITE;
}

/* Sizes the clocks for @p on first use. */
static void
ensure_clocks (SimBackend *s, const StowProgram *p)
{
  if (s->qtime != NULL)
    return;
  guint nq = p->n_ranks * STOW_N_STREAMS;
  s->n_ranks = p->n_ranks;
  s->qtime = g_new0 (double, nq);
  s->qlast = g_new (guint, nq);
  for (guint q = 0; q < nq; q++)
    s->qlast[q] = STOW_NONE;
  s->drive_time = g_new0 (double, p->n_ranks);
  s->drive_last = g_new (guint, p->n_ranks);
  for (guint r = 0; r < p->n_ranks; r++)
    s->drive_last[r] = STOW_NONE;
  g_array_set_size (s->ev_time, p->events->len);
  g_array_set_size (s->ev_op, p->events->len);
  for (guint e = 0; e < p->events->len; e++)
    {
      g_array_index (s->ev_time, double, e) = -1;
      g_array_index (s->ev_op, guint, e) = STOW_NONE;
    }
  g_array_set_size (s->op_start, p->ops->len);
  g_array_set_size (s->op_end, p->ops->len);
  g_array_set_size (s->op_flops, p->ops->len);
}

static double
sim_start_time (StowBackend *b, const StowProgram *p, guint i, guint *pred)
{
  SimBackend *s = (SimBackend *)b;
  ensure_clocks (s, p);
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  guint q = op->rank * STOW_N_STREAMS + op->stream;
  double start = s->qtime[q];
  *pred = s->qlast[q];
  if (is_drive_stream (op->stream) && s->drive_time[op->rank] > start)
    start = s->drive_time[op->rank], *pred = s->drive_last[op->rank];
  for (guint w = 0; w < op->n_waits; w++)
    {
      guint e = g_array_index (p->waits, guint, op->wait_first + w);
      double et = g_array_index (s->ev_time, double, e);
      if (et > start)
        start = et, *pred = g_array_index (s->ev_op, guint, e);
    }
  return start;
}

static void
sim_event_wait (StowBackend *b, guint rank, StowStream stream, guint event)
{
  SimBackend *s = (SimBackend *)b;
  guint q = rank * STOW_N_STREAMS + stream;
  double et = g_array_index (s->ev_time, double, event);
  if (et > s->qtime[q])
    {
      s->qtime[q] = et;
      s->qlast[q] = g_array_index (s->ev_op, guint, event);
    }
}

/* Runs op @i on its stream's clock (and its drive's). */
static void
advance (SimBackend *s, const StowProgram *p, guint i, double seconds)
{
  const StowOp *op = &g_array_index (p->ops, StowOp, i);
  guint q = op->rank * STOW_N_STREAMS + op->stream;
  double start = s->qtime[q];
  if (is_drive_stream (op->stream))
    start = MAX (start, s->drive_time[op->rank]);
  double end = start + MAX (seconds, 0.0);
  g_array_index (s->op_start, double, i) = start;
  g_array_index (s->op_end, double, i) = end;
  s->qtime[q] = end;
  s->qlast[q] = i;
  if (is_drive_stream (op->stream))
    s->drive_time[op->rank] = end, s->drive_last[op->rank] = i;
}

static guint64 *
used_slot (SimBackend *s, guint rank, StowTier tier)
{
  gpointer key = GUINT_TO_POINTER (rank * STOW_N_TIERS + tier + 1);
  guint64 *v = g_hash_table_lookup (s->used, key);
  if (v == NULL)
    {
      v = g_new0 (guint64, 1);
      g_hash_table_insert (s->used, key, v);
    }
  return v;
}

static gboolean
sim_buffer_alloc (StowBackend *b, const StowProgram *p, guint buffer, guint op,
                  GError **error)
{
  SimBackend *s = (SimBackend *)b;
  ensure_clocks (s, p);
  const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, buffer);
  guint64 *used = used_slot (s, buf->rank, buf->tier);
  guint64 cap = s->capacity[buf->tier];
  if (op != STOW_NONE)
    advance (s, p, op, 0);
  if (cap > 0 && *used + buf->bytes > cap)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "%s \"%s\" (%" G_GUINT64_FORMAT
                   " B) on rank %u: %" G_GUINT64_FORMAT
                   " B in use of %" G_GUINT64_FORMAT " B",
                   stow_tier_name (buf->tier), buf->name, buf->bytes, buf->rank,
                   *used, cap);
      return FALSE;
    }
  *used += buf->bytes;
  return TRUE;
}

static void
sim_buffer_free (StowBackend *b, const StowProgram *p, guint buffer, guint op)
{
  SimBackend *s = (SimBackend *)b;
  const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, buffer);
  guint64 *used = used_slot (s, buf->rank, buf->tier);
  *used -= MIN (*used, buf->bytes);
  advance (s, p, op, 0);
}

static gboolean
sim_issue (StowBackend *b, const StowProgram *p, guint i, GError **error)
{
  SimBackend *s = (SimBackend *)b;
  ensure_clocks (s, p);
  double flops = 0;
  double sec = stow_sim_op_seconds (b, p, i, &flops);
  g_array_index (s->op_flops, double, i) = flops;
  advance (s, p, i, sec);
  return TRUE;
}

static void
sim_event_record (StowBackend *b, guint rank, StowStream stream, guint event,
                  guint op)
{
  SimBackend *s = (SimBackend *)b;
  g_array_index (s->ev_time, double, event)
      = g_array_index (s->op_end, double, op);
  g_array_index (s->ev_op, guint, event) = op;
}

static gboolean
sim_synchronize (StowBackend *b, GError **error)
{
  return TRUE;
}

static double
sim_now (StowBackend *b)
{
  SimBackend *s = (SimBackend *)b;
  double t = 0;
  for (guint q = 0; s->qtime && q < s->n_ranks * STOW_N_STREAMS; q++)
    t = MAX (t, s->qtime[q]);
  return t;
}

static void
sim_op_times (StowBackend *b, guint op, double *start, double *end)
{
  SimBackend *s = (SimBackend *)b;
  *start = g_array_index (s->op_start, double, op);
  *end = g_array_index (s->op_end, double, op);
}

static double
sim_op_flops (StowBackend *b, guint op)
{
  SimBackend *s = (SimBackend *)b;
  return op < s->op_flops->len ? g_array_index (s->op_flops, double, op) : 0;
}

static void
sim_destroy (StowBackend *b)
{
  SimBackend *s = (SimBackend *)b;
  if (s->model)
    stow_model_unref (s->model);
  stow_cluster_unref (s->cluster);
  g_hash_table_unref (s->used);
  g_hash_table_unref (s->fixed);
  g_free (s->qtime);
  g_free (s->qlast);
  g_free (s->drive_time);
  g_free (s->drive_last);
  g_array_unref (s->ev_time);
  g_array_unref (s->ev_op);
  g_array_unref (s->op_start);
  g_array_unref (s->op_end);
  g_array_unref (s->op_flops);
  g_free (s);
}

static const StowBackendVtable sim_vtable = {
  .name = "sim",
  .virtual_time = TRUE,
  .start_time = sim_start_time,
  .event_wait = sim_event_wait,
  .buffer_alloc = sim_buffer_alloc,
  .buffer_free = sim_buffer_free,
  .issue = sim_issue,
  .event_record = sim_event_record,
  .synchronize = sim_synchronize,
  .now = sim_now,
  .op_times = sim_op_times,
  .op_flops = sim_op_flops,
  .destroy = sim_destroy,
};

StowBackend *
stow_backend_sim_new (const StowPlan *plan, const guint64 *capacity_bytes)
{
  g_return_val_if_fail (plan != NULL && plan->cluster != NULL, NULL);
  SimBackend *s = g_new0 (SimBackend, 1);
  s->parent.vt = &sim_vtable;
  s->cluster = stow_cluster_ref ((StowCluster *)plan->cluster);
  s->training = plan->training;
  stow_cost_options_init (&s->co);
  if (plan->model)
    {
      s->model = stow_model_ref ((StowModel *)plan->model);
      s->layout = plan->layout;
      s->have_layout = TRUE;
      stow_cost_layer_seconds (plan, FALSE, &s->ls[0]);
      stow_cost_layer_seconds (plan, TRUE, &s->ls[1]);
      stow_cost_ends_seconds (plan, &s->ends);
    }
  for (guint i = 0; capacity_bytes && i < STOW_N_TIERS; i++)
    s->capacity[i] = capacity_bytes[i];
  s->used = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  s->fixed
      = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, g_free);
  s->ev_time = g_array_new (FALSE, TRUE, sizeof (double));
  s->ev_op = g_array_new (FALSE, TRUE, sizeof (guint));
  s->op_start = g_array_new (FALSE, TRUE, sizeof (double));
  s->op_end = g_array_new (FALSE, TRUE, sizeof (double));
  s->op_flops = g_array_new (FALSE, TRUE, sizeof (double));
  return &s->parent;
}

void
stow_backend_sim_set_op_seconds (StowBackend *b, guint op, double seconds)
{
  g_return_if_fail (b != NULL && b->vt == &sim_vtable);
  SimBackend *s = (SimBackend *)b;
  double *v = g_new (double, 1);
  *v = seconds;
  g_hash_table_replace (s->fixed, GUINT_TO_POINTER (op), v);
}
