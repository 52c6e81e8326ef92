/* SPDX-License-Identifier: MIT
 *
 * planner/collectives.c: what the time model (cost.c) and the simulator
 * charge for communication: the link a group of ranks uses, ring
 * collectives on it, and the data-parallel collectives as each engine
 * launches them (NCCL's latency per collective, the engines' buckets).
 * Constants and their sources: docs/time-model.md, "Communication".
 */
#include <math.h>

#include "planner/cost-private.h"

/* Whether @span consecutive ranks sit in one NVLink domain of a node. */
static gboolean
over_nvlink (const StowCluster *c, guint64 span)
{
  guint per_node = MAX (c->node.gpus_per_node, 1);
  guint domain = MIN (MAX (c->node.gpu.nvlink_domain, 1), per_node);
  return span <= domain && c->node.gpu.nvlink_bw > 0;
}

/* The link a group of @size ranks, @stride apart in rank order, uses:
 * NVLink when the whole span sits in one NVLink domain of a node, else the
 * network (its ring goes through the NICs). */
StowLink
stow_comm_link (const StowCluster *c, const StowCostOptions *o, guint64 size,
                guint64 stride)
{
  guint per_node = MAX (c->node.gpus_per_node, 1);
  guint64 span = size * stride;
  StowLink l;
  if (over_nvlink (c, span))
    {
      l.bw = c->node.gpu.nvlink_bw * o->nvlink_eff;
      l.lat = o->nvlink_latency_s;
    }
  else if (span <= per_node)
    {
      /* Inside a node without NVLink between these GPUs: PCIe peer. */
      l.bw = c->node.gpu.pcie_bw * 0.8;
      l.lat = 10e-6;
    }
  else
    {
      l.bw = (c->node.net_bw_per_gpu > 0 ? c->node.net_bw_per_gpu : 12.5e9)
             * o->net_eff;
      l.lat = c->node.net_latency_s > 0 ? c->node.net_latency_s : 5e-6;
    }
  return l;
}

/* Ring all-reduce of @bytes over @n ranks: reduce-scatter then all-gather,
 * each moving (n-1)/n of the data (Patarasuk & Yuan 2009). */
double
stow_comm_ring_allreduce (double bytes, guint64 n, StowLink l)
{
  if (n <= 1 || bytes <= 0)
    return 0;
  return 2.0 * (double)(n - 1) / (double)n * bytes / l.bw
         + 2.0 * (double)(n - 1) * l.lat;
}

/* How a data-parallel group of @n ranks @stride apart sits on the nodes:
 * @local of its ranks share a node, over @nodes nodes. */
typedef struct
{
  guint per_node;
  guint64 local, nodes;
} RingShape;

static RingShape
ring_shape (const StowCluster *c, guint64 n, guint64 stride)
{
  RingShape r;
  r.per_node = MAX (c->node.gpus_per_node, 1);
  r.local = stride >= r.per_node ? 1 : MIN (n, r.per_node / stride);
  r.nodes = (n + r.local - 1) / r.local;
  return r;
}

/* The latency of one NCCL ring collective over @n ranks @stride apart,
 * as NCCL's cost model has it (tuning.cc, v2.18.3-1): the ring is flat,
 * through every rank, so a reduce-scatter or all-gather (@half) takes
 * n - 1 steps, nodes - 1 of them across nodes, and an all-reduce twice
 * the steps, 2 x nodes of them across nodes. */
static double
nccl_ring_latency (const StowCluster *c, const StowCostOptions *o, guint64 n,
                   guint64 stride, RingShape r, gboolean half)
{
  double steps = (half ? 1.0 : 2.0) * (double)(n - 1);
  double inter = r.nodes <= 1 ? 0
                 : half       ? (double)(r.nodes - 1)
                              : 2.0 * (double)r.nodes;
  double intra = r.local > 1 && !over_nvlink (c, r.local * stride)
                     ? o->nccl_pci_step_s
                     : o->nccl_intra_step_s;
  return o->nccl_ring_base_s + MAX (0.0, steps - inter) * intra
         + inter * o->nccl_inter_step_s;
}

/* A data-parallel collective over @n ranks @stride apart.  Its bandwidth
 * term is hierarchical: inside a node over NVLink, then across nodes with
 * each GPU moving 1/local of the data over its own NIC (as NCCL's
 * tree/ring mix and DeepSpeed/Megatron's bucketing achieve).  Its latency
 * is NCCL's for the flat ring.  @half: a reduce-scatter or
 * all-gather instead of an all-reduce. */
static double
dp_collective (const StowCluster *c, const StowCostOptions *o, double bytes,
               guint64 n, guint64 stride, gboolean half)
{
  if (n <= 1 || bytes <= 0)
    return 0;
  RingShape r = ring_shape (c, n, stride);
  double share = half ? 1.0 : 2.0, t = 0;
  if (r.local > 1)
    t += share * (double)(r.local - 1) / (double)r.local * bytes
         / stow_comm_link (c, o, r.local, stride).bw;
  if (r.nodes > 1)
    t += share * (double)(r.nodes - 1) / (double)r.nodes
         * (bytes / (double)r.local)
         / stow_comm_link (c, o, r.nodes, r.per_node).bw;
  return t + nccl_ring_latency (c, o, n, stride, r, half);
}

/* @bytes moved as @count equal collectives, each paying its latency. */
double
stow_comm_dp_n (const StowCluster *c, const StowCostOptions *o, double bytes,
                double count, guint64 n, guint64 stride, gboolean half)
{
  count = MAX (1.0, ceil (count));
  return count * dp_collective (c, o, bytes / count, n, stride, half);
}

/* How many data-parallel collectives move a stage's @params parameters
 * of @elem bytes each in one pass, as each engine groups them by default:
 * - ZeRO-3 (and FSDP's every sharding) gathers and reduces per layer
 *   (FSDP wraps each block, plus the root; DeepSpeed fetches per module,
 *   at least one per layer; stowage's step program per layer);
 * - Megatron-core's buckets hold max(40,000,000, 1,000,000 x dp)
 *   parameters, per model chunk (core_r0.8,
 *   distributed_data_parallel.py);
 * - NeMo's distributed Adam (Apex DistributedFusedAdam) buckets
 *   bucket_cap_mb, 100 MiB of its gradients by default;
 * - DeepSpeed ZeRO-0/1/2 reduce_bucket_size and allgather_bucket_size,
 *   500,000,000 elements by default;
 * - PyTorch DDP bucket_cap_mb, 25 MiB. */
double
stow_comm_dp_buckets (const StowLayout *l, guint64 ndp, double params,
                      double elem, double v, guint64 layers)
{
  if (params <= 0)
    return 1;
  gboolean sharded = l->zero >= 3
                     || (l->zero >= 1
                         && (l->engine == STOW_ENGINE_FSDP
                             || l->engine == STOW_ENGINE_PYTORCH));
  if (sharded || l->engine == STOW_ENGINE_STOWAGE)
    return (double)layers + 1.0;
  switch (l->engine)
    {
    case STOW_ENGINE_MEGATRON:
    case STOW_ENGINE_NEMO:
      if (l->engine == STOW_ENGINE_NEMO && l->zero >= 1)
        return ceil (params * elem / (100.0 * 1048576.0));
      return v * ceil (params / v / MAX (40e6, 1e6 * (double)ndp));
    case STOW_ENGINE_DEEPSPEED:
      return ceil (params / 5e8);
    default:
      return ceil (params * elem / (25.0 * 1048576.0));
    }
}

double
stow_cost_dp_collective_seconds (const StowCluster *c,
                                 const StowCostOptions *options, double bytes,
                                 guint64 n, guint64 stride, gboolean half)
{
  StowCostOptions o;
  if (options == NULL)
    stow_cost_options_init (&o), options = &o;
  return dp_collective (c, options, bytes, n, MAX (stride, 1), half);
}

double
stow_cost_p2p_seconds (const StowCluster *c, const StowCostOptions *options,
                       double bytes, guint64 stride)
{
  StowCostOptions o;
  if (options == NULL)
    stow_cost_options_init (&o), options = &o;
  StowLink pl = stow_comm_link (c, options, 2, MAX (stride, 1));
  return bytes / pl.bw + pl.lat;
}
