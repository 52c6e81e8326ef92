/* SPDX-License-Identifier: MIT
 *
 * planner/schedule-cost.c: seconds for one step-program op.  Ops the
 * lowering priced with the time model (planner/cost.c: layers, the
 * embedding and loss, collectives, sends) carry their seconds; copies and
 * Adam, and the ops of hand-built programs, are priced here from the
 * cluster's FLOP rates and bandwidths.
 */
#include "planner/schedule.h"

#include "planner/cost.h"

#include <math.h>

/* Achieved fraction of the tensor-core peak for transformer GEMMs: a
 * planning default (Megatron-LM reports 40-55% MFU at scale, Narayanan et
 * al. 2021, Table 1). */
#define STOW_SCHED_MFU 0.5
/* Bytes of memory traffic per parameter of an Adam update: read fp32
 * master, exp_avg, exp_avg_sq and write them back (24), read the gradient
 * and write the low-precision weight (2 + 2).  CPU Adam streams at about
 * STREAM-triad speed (bench/results/adam-vm-*.md). */
#define STOW_SCHED_ADAM_BYTES_PER_PARAM 28.0
#define STOW_SCHED_INTRA_LATENCY_S      10e-6

double
stow_schedule_layer_flops (const StowModel *m, const StowTraining *t,
                           const StowLayout *l, guint64 layer)
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
      lat = STOW_SCHED_INTRA_LATENCY_S;
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

static double
copy_seconds (const StowCluster *c, const StowOp *op)
{
  const StowNode *node = &c->node;
  double per_gpu = MAX (node->gpus_per_node, 1);
  double nvme_r = 0, nvme_w = 0;
  for (guint i = 0; i < node->n_nvme; i++)
    nvme_r += node->nvme[i].read_bw, nvme_w += node->nvme[i].write_bw;
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
  /* The node's drives are shared by its GPUs' ranks. */
  if (op->src == STOW_TIER_NVME)
    return nvme_r > 0 ? bytes / (nvme_r / per_gpu) : 0;
  if (op->dst == STOW_TIER_NVME)
    return nvme_w > 0 ? bytes / (nvme_w / per_gpu) : 0;
  return 2.0 * bytes / (node->host_mem_bw / per_gpu);
}

double
stow_schedule_op_seconds (const StowCluster *c, const StowTraining *t,
                          const StowOp *op)
{
  const StowNode *node = &c->node;
  /* Ops the lowering priced with the time model (planner/cost.c). */
  if (op->seconds > 0)
    return op->seconds;
  switch (op->kind)
    {
    case STOW_OP_ALLOC:
    case STOW_OP_FREE:
      return 0;
    case STOW_OP_COPY:
      return copy_seconds (c, op);
    case STOW_OP_FORWARD:
    case STOW_OP_BACKWARD:
    case STOW_OP_RECOMPUTE:
    case STOW_OP_LOSS:
      {
        double s = op->flops
                   / (stow_cost_peak_flops (&node->gpu, t->precision)
                      * STOW_SCHED_MFU);
        /* Tensor-parallel all-reduces sit inside the layer, on its
         * critical path. */
        if (op->bytes > 0 && op->group_size > 1)
          {
            StowOp ar = *op;
            ar.coll = STOW_COLL_ALL_REDUCE;
            s += collective_seconds (c, &ar);
          }
        return s;
      }
    case STOW_OP_OPTIM_STEP:
      {
        double bytes = (double)op->params * STOW_SCHED_ADAM_BYTES_PER_PARAM;
        if (op->on_gpu)
          return bytes / node->gpu.hbm_bw;
        /* The node's memory bandwidth is shared by its GPUs' ranks. */
        return bytes / (node->host_mem_bw / MAX (node->gpus_per_node, 1));
      }
    case STOW_OP_COLLECTIVE:
      return collective_seconds (c, op);
    case STOW_N_OP_KINDS:
      break;
    }
  return 0;
}
