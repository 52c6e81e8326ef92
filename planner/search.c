/* SPDX-License-Identifier: MIT
 *
 * planner/search.c: brute force over the layout space (tp, pp, vpp, cp,
 * ep, dp, ZeRO stage, every offload option, recomputation including the
 * smallest partial recomputation that fits, micro-batch), pruned by
 * divisibility, then by the memory model's totals-only path, then ranked
 * by the time model.  Nothing is allocated per candidate: the best
 * max_keep are kept in a sorted array.
 */
#include "planner/search.h"

#include <string.h>

#include "planner/cost-private.h"
#include "planner/memory-private.h"
#include "planner/plan.h"

void
stow_search_options_init (StowSearchOptions *o)
{
  memset (o, 0, sizeof *o);
}

/* Divisors of @n no larger than @limit that also divide @also (0: any). */
static guint
divisors (guint64 n, guint64 limit, guint64 also, guint *out, guint max)
{
  guint k = 0;
  for (guint64 d = 1; d <= n && d <= limit && k < max; d++)
    if (n % d == 0 && (also == 0 || also % d == 0))
      out[k++] = (guint)d;
  return k;
}

static int
compare_candidates (gconstpointer a, gconstpointer b)
{
  const StowCandidate *x = a, *y = b;
  if (x->score != y->score)
    return x->score < y->score ? -1 : 1;
  return x->headroom_bytes > y->headroom_bytes   ? -1
         : x->headroom_bytes < y->headroom_bytes ? 1
                                                 : 0;
}

/* Keeps the best @max candidates sorted (insertion from the back). */
static void
keep (GArray *fits, const StowCandidate *c, guint max)
{
  if (max == 0)
    {
      g_array_append_val (fits, *c);
      return;
    }
  if (fits->len == max
      && compare_candidates (
             c, &g_array_index (fits, StowCandidate, fits->len - 1))
             >= 0)
    return;
  guint i = fits->len;
  while (i > 0
         && compare_candidates (c, &g_array_index (fits, StowCandidate, i - 1))
                < 0)
    i--;
  g_array_insert_val (fits, i, *c);
  if (fits->len > max)
    g_array_set_size (fits, max);
}

typedef struct
{
  const StowModel *m;
  const StowCluster *c;
  const StowTraining *t;
  const StowMemOptions *mo;
  const StowCostOptions *co;
  StowSearch *r;
  guint max_keep;
  StowMemScratch *scratch;
  StowPins pins;
  gboolean (*accept) (const StowPlan *candidate, gpointer data);
  gpointer accept_data;
  StowPlan cand; /* the base plan, its layout set to the candidate's */
} Ctx;

/* ZeRO 1 and 2 shard over the data-parallel ranks: over one rank they are
 * the stage below unless the engine keeps other buffers for them
 * (DeepSpeed's and FSDP's differ).  TRUE when @l, with the stage left to
 * the search, costs exactly what the stage below costs, in memory and in
 * time: the same layout, which a table would list twice. */
static gboolean
same_as_lower_zero (Ctx *x, const StowLayout *l, const StowMemTotals *mt)
{
  if ((x->pins & STOW_PIN_ZERO) || (l->zero != 1 && l->zero != 2)
      || l->hybrid_shard || stow_mem_shard_degree (l, x->c) != 1)
    return FALSE;
  StowLayout lower = *l;
  lower.zero--;
  StowMemTotals lt;
  if (!stow_mem_estimate_totals (x->m, x->c, x->t, &lower, x->mo, x->scratch,
                                 &lt, NULL)
      || lt.total_bytes != mt->total_bytes
      || lt.host_total_bytes != mt->host_total_bytes
      || lt.nvme_bytes != mt->nvme_bytes || lt.fits != mt->fits)
    return FALSE;
  StowCost a, b;
  stow_cost_estimate_parts (x->m, x->c, x->t, l, x->co, &a);
  stow_cost_estimate_parts (x->m, x->c, x->t, &lower, x->co, &b);
  return a.step_time_s == b.step_time_s;
}

/* Memory first; if it fits, the time model.  Returns TRUE if it fits. */
static gboolean
evaluate (Ctx *x, const StowLayout *l_in)
{
  StowMemTotals mt;
  StowSearch *r = x->r;
  StowLayout resolved = *l_in;
  const StowLayout *l = &resolved;
  /* What the caller cannot use (a config an engine cannot express) is
   * rejected before it is priced, like a layout that breaks a rule. */
  if (x->accept != NULL)
    {
      x->cand.layout = *l;
      if (!x->accept (&x->cand, x->accept_data))
        {
          r->invalid++;
          return FALSE;
        }
    }
  if (!stow_mem_estimate_totals (x->m, x->c, x->t, l, x->mo, x->scratch, &mt,
                                 NULL))
    {
      r->invalid++;
      return FALSE;
    }
  /* Streamed parameters: the layers the budget leaves room for stay on
   * the device (decided once, planner/resident.c), and the layout is
   * priced and reported with them. */
  if (mt.fits && x->m != NULL && l->offload_params != STOW_OFFLOAD_NONE
      && l->engine == STOW_ENGINE_STOWAGE
      && l->resident_layers == STOW_RESIDENT_AUTO)
    {
      resolved.resident_layers = (guint)stow_mem_resident_from_totals (
          x->m, x->t, l, x->mo, &mt, x->scratch);
      if (!stow_mem_estimate_totals (x->m, x->c, x->t, l, x->mo, x->scratch,
                                     &mt, NULL))
        {
          r->invalid++;
          return FALSE;
        }
    }
  if (same_as_lower_zero (x, l, &mt))
    {
      r->same_as_lower_zero++;
      return mt.fits;
    }
  r->evaluated++;
  StowCandidate cand;
  memset (&cand, 0, sizeof cand);
  cand.layout = *l;
  cand.total_bytes = mt.total_bytes;
  cand.host_bytes = mt.host_total_bytes;
  cand.nvme_bytes = mt.nvme_bytes;
  cand.headroom_bytes = (gint64)mt.capacity_bytes - (gint64)mt.total_bytes;
  if (!mt.fits)
    {
      if (!mt.fits_device)
        r->out_of_memory++;
      else
        r->host_or_nvme++;
      if (!r->have_miss || cand.headroom_bytes > r->best_miss.headroom_bytes)
        {
          stow_cost_estimate_parts (x->m, x->c, x->t, l, x->co, &cand.cost);
          cand.score = cand.cost.tokens_per_s > 0 ? 1.0 / cand.cost.tokens_per_s
                                                  : G_MAXDOUBLE;
          r->best_miss = cand, r->have_miss = TRUE;
        }
      return FALSE;
    }
  stow_cost_estimate_parts (x->m, x->c, x->t, l, x->co, &cand.cost);
  /* Seconds per token: the step time when the global batch is fixed,
   * and comparable across layouts when it is not. */
  cand.score
      = cand.cost.tokens_per_s > 0 ? 1.0 / cand.cost.tokens_per_s : G_MAXDOUBLE;
  r->fitting++;
  keep (r->fits, &cand, x->max_keep);
  return TRUE;
}

/* Full recomputation of the first K layers of each stage (each model
 * chunk when interleaved): memory falls and time rises with K, so only
 * the smallest K that fits matters; found by bisection on the memory
 * totals. */
static void
partial_recompute (Ctx *x, StowLayout l)
{
  guint64 run = stow_layout_recompute_run (&l, x->m->n_layers);
  if (run < 2)
    return;
  guint lo = 1, hi = (guint)run - 1, found = 0;
  l.recompute = STOW_RECOMPUTE_FULL;
  while (lo <= hi)
    {
      guint mid = lo + (hi - lo) / 2;
      StowMemTotals mt;
      l.recompute_layers = mid;
      if (stow_mem_estimate_totals (x->m, x->c, x->t, &l, x->mo, x->scratch,
                                    &mt, NULL)
          && mt.fits)
        found = mid, hi = mid - 1;
      else
        lo = mid + 1;
    }
  if (found)
    {
      l.recompute_layers = found;
      evaluate (x, &l);
    }
}

/* The values each searched dimension takes (a pinned one takes one). */
typedef struct
{
  guint tps[64], pps[512], cps[64], eps[64];
  guint ntp, npp, ncp, nep;
} Dims;

/* Every layout of @base (its engine fixed) over @d's degrees, the ZeRO
 * stages, offloads, recomputation and micro-batches the pins leave open. */
static void
enumerate (Ctx *x, const StowLayout *base, const Dims *d)
{
  const StowModel *m = x->m;
  const StowTraining *t = x->t;
  StowSearch *r = x->r;
  StowPins pins = x->pins;
  guint64 gpus = x->c->n_gpus;
  guint mbs[256], vpps[128];
  static const StowOffload offs[]
      = { STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, STOW_OFFLOAD_NVME };
  static const StowRecompute recs[]
      = { STOW_RECOMPUTE_NONE, STOW_RECOMPUTE_SELECTIVE, STOW_RECOMPUTE_FULL };

  for (guint i = 0; i < d->ntp; i++)
    {
      guint tp = d->tps[i];
      if (m->n_heads % tp != 0
          || (m->n_kv_heads % tp != 0 && tp % m->n_kv_heads != 0))
        {
          r->invalid++;
          continue;
        }
      for (guint j = 0; j < d->npp; j++)
        for (guint q = 0; q < d->ncp; q++)
          {
            guint pp = d->pps[j], cp = d->cps[q];
            guint64 mp = (guint64)tp * pp * cp;
            if (gpus % mp != 0 || pp > m->n_layers || t->seq_len % cp != 0)
              {
                r->invalid++;
                continue;
              }
            guint dp = (guint)(gpus / mp);
            if ((pins & STOW_PIN_DP) && dp != base->dp)
              {
                r->invalid++;
                continue;
              }
            /* Virtual stages: 1, or every v >= 2 with pp v dividing L.
             * Megatron-core's MoE-era split (--pp-split-ends: embedding
             * and loss in the split) when pp does not divide L but does
             * L + 2: then every v with pp v dividing L + 2 (Llama 3 405B,
             * 126 layers on 16 stages of 8 slots). */
            guint nv = 0;
            gboolean ends = (pins & STOW_PIN_PP_SPLIT_ENDS)
                                ? base->pp_split_ends
                                : (stow_engine_is_mcore (base->engine) && pp > 1
                                   && m->n_layers % pp != 0
                                   && (m->n_layers + 2) % pp == 0);
            guint64 slots = m->n_layers + (ends ? 2 : 0);
            if (pins & STOW_PIN_VPP)
              vpps[nv++] = base->vpp;
            else
              {
                vpps[nv++] = 1;
                for (guint v = 2; pp > 1 && (guint64)pp * v <= slots
                                  && nv < G_N_ELEMENTS (vpps);
                     v++)
                  if (slots % ((guint64)pp * v) == 0)
                    vpps[nv++] = v;
              }
            /* Micro-batches: the divisors of a replica's share of the
             * global batch; without a batch, 1 (or the pinned size). */
            guint nmb = 0;
            if (pins & STOW_PIN_MICRO_BATCH)
              mbs[nmb++] = (guint)base->micro_batch;
            else if (t->global_batch)
              {
                if (t->global_batch % dp != 0)
                  {
                    r->invalid++;
                    continue;
                  }
                nmb = divisors (t->global_batch / dp, 256, 0, mbs, 256);
              }
            else
              mbs[nmb++] = 1;
            /* Expert tensor parallelism: as --tp (0), or, for Megatron-
             * core's MoE models, also 1 (experts whole, spread by ep). */
            guint etps[2] = { (pins & STOW_PIN_ETP) ? base->etp : 0, 1 };
            guint netp = (!(pins & STOW_PIN_ETP) && m->n_experts > 0 && tp > 1
                          && stow_engine_is_mcore (base->engine))
                             ? 2
                             : 1;
            for (guint e = 0; e < d->nep; e++)
              for (guint et = 0; et < netp; et++)
                for (guint vi = 0; vi < nv; vi++)
                  for (guint b = 0; b < nmb; b++)
                    {
                      StowLayout l = *base;
                      l.tp = tp, l.pp = pp, l.cp = cp, l.dp = dp;
                      l.ep = d->eps[e];
                      l.etp = etps[et];
                      l.vpp = vpps[vi];
                      l.pp_split_ends = ends;
                      l.micro_batch = mbs[b];
                      /* The experts' grid, etp x ep x expert dp, tiles the
                       * tp x cp x dp ranks of a stage (with etp = tp: ep
                       * divides dp x cp). */
                      guint64 grid = (guint64)stow_layout_etp (&l) * l.ep;
                      if (l.ep > 1 && ((guint64)tp * dp * cp) % grid != 0)
                        {
                          r->invalid++;
                          continue;
                        }
                      if (!(pins & STOW_PIN_SP))
                        l.sp = tp > 1;
                      if (!(pins & STOW_PIN_SCHEDULE))
                        l.schedule = l.vpp > 1 ? STOW_SCHEDULE_INTERLEAVED
                                               : STOW_SCHEDULE_1F1B;
                      if (t->global_batch)
                        {
                          guint64 per = (guint64)l.micro_batch * dp;
                          if (t->global_batch % per != 0)
                            {
                              r->invalid++;
                              continue;
                            }
                          l.grad_accum = t->global_batch / per;
                        }
                      else
                        l.grad_accum = MAX (base->grad_accum, (guint64)l.pp);
                      for (guint z = 0; z <= 3; z++)
                        for (guint oo = 0; oo < 3; oo++)
                          for (guint op = 0; op < 3; op++)
                            {
                              if (!(pins & STOW_PIN_ZERO))
                                l.zero = z, l.hybrid_shard = FALSE;
                              else if (z != 0)
                                continue;
                              if (!(pins & STOW_PIN_OFFLOAD_OPTIMIZER))
                                l.offload_optimizer = offs[oo];
                              else if (oo != 0)
                                continue;
                              if (!(pins & STOW_PIN_OFFLOAD_PARAMS))
                                l.offload_params = offs[op];
                              else if (op != 0)
                                continue;
                              /* Parameter offload needs ZeRO-3; optimizer
                               * offload without sharding only on one
                               * replica: rejected before the memory model. */
                              if ((l.offload_params != STOW_OFFLOAD_NONE
                                   && l.zero != 3)
                                  || (l.offload_optimizer != STOW_OFFLOAD_NONE
                                      && l.zero == 0 && dp > 1))
                                {
                                  r->invalid++;
                                  continue;
                                }
                              gboolean none_fits = FALSE;
                              for (guint rc = 0; rc < 3; rc++)
                                for (guint ao = 0; ao < 2; ao++)
                                  {
                                    if (!(pins & STOW_PIN_RECOMPUTE))
                                      l.recompute = recs[rc],
                                      l.recompute_layers = 0;
                                    else if (rc != 0)
                                      continue;
                                    if (!(pins & STOW_PIN_OFFLOAD_ACTIVATIONS))
                                      l.offload_activations = ao == 1;
                                    else if (ao != 0)
                                      continue;
                                    if (l.offload_activations
                                        && l.recompute != STOW_RECOMPUTE_FULL)
                                      continue; /* needs checkpoints */
                                    /* With flash attention there are no s^2
                                     * scores to drop: selective recompute
                                     * saves nothing and costs time. */
                                    if (l.recompute == STOW_RECOMPUTE_SELECTIVE
                                        && x->t->flash_attention
                                        && !(pins & STOW_PIN_RECOMPUTE))
                                      continue;
                                    gboolean fit = evaluate (x, &l);
                                    if (rc == 0 && ao == 0)
                                      none_fits = fit;
                                  }
                              /* Nothing stored fits: the fewest recomputed
                               * layers that fit, if fewer than all. */
                              if (!(pins & STOW_PIN_RECOMPUTE) && !none_fits)
                                {
                                  l.offload_activations
                                      = (pins & STOW_PIN_OFFLOAD_ACTIVATIONS)
                                            ? base->offload_activations
                                            : FALSE;
                                  partial_recompute (x, l);
                                }
                            }
                    }
          }
    }
}

StowSearch *
stow_search_run (const StowPlan *plan, StowPins pins,
                 const StowSearchOptions *so)
{
  g_return_val_if_fail (
      plan != NULL && plan->model != NULL && plan->cluster != NULL, NULL);
  const StowModel *m = plan->model;
  const StowCluster *c = plan->cluster;
  const StowTraining *t = &plan->training;
  const StowLayout *base = &plan->layout;
  const StowMemOptions *o = &plan->mem;
  StowSearchOptions sdef;
  if (so == NULL)
    {
      stow_search_options_init (&sdef);
      so = &sdef;
    }
  gint64 t0 = g_get_monotonic_time ();
  StowSearch *r = g_new0 (StowSearch, 1);
  guint64 gpus = c->n_gpus;
  guint per_node = MAX (c->node.gpus_per_node, 1);
  guint domain = MIN (MAX (c->node.gpu.nvlink_domain, 1), per_node);
  /* The time model's per-model sums, once for the whole search. */
  StowCostOptions co;
  if (so->cost)
    co = *so->cost;
  else
    stow_cost_options_init (&co);
  g_autoptr (StowCostPrep) prep = stow_cost_prepare (m);
  co.prep = prep;
  g_autoptr (StowMemScratch) scratch = stow_mem_scratch_new (m);
  Ctx x = {
    m,
    c,
    t,
    o,
    &co,
    r,
    so->max_keep,
    scratch,
    pins,
    so->accept,
    so->accept_data,
    *plan,
  };

  r->fits = g_array_new (FALSE, FALSE, sizeof (StowCandidate));
  Dims d;
  /* tp inside the NVLink domain (a node's GPUs when the catalog has no
   * NVLink) unless allowed across nodes. */
  guint64 tp_limit = so->allow_cross_node_tp ? gpus : MAX (domain, 1);
  if (c->node.gpu.nvlink_domain <= 1 && !so->allow_cross_node_tp)
    tp_limit = per_node;
  d.ntp = (pins & STOW_PIN_TP) ? (d.tps[0] = base->tp, 1)
                               : divisors (gpus, tp_limit, 0, d.tps, 64);
  d.npp = (pins & STOW_PIN_PP)
              ? (d.pps[0] = base->pp, 1)
              : divisors (gpus, MIN (m->n_layers, 512), 0, d.pps, 512);
  /* cp divides the sequence; chunks shorter than 128 tokens are never
   * worth their ring steps. */
  d.ncp
      = (pins & STOW_PIN_CP)
            ? (d.cps[0] = base->cp, 1)
            : divisors (t->seq_len, MAX (t->seq_len / 128, 1), gpus, d.cps, 64);
  if (m->n_experts == 0)
    d.nep = (pins & STOW_PIN_EP) ? (d.eps[0] = base->ep, 1) : (d.eps[0] = 1, 1);
  else
    d.nep = (pins & STOW_PIN_EP) ? (d.eps[0] = base->ep, 1)
                                 : divisors (m->n_experts, gpus, 0, d.eps, 64);

  /* Each engine keeps its own buffers, so each is a search of its own
   * over the same degrees; the candidates compete in one ranking. */
  if (so->engines == 0)
    enumerate (&x, base, &d);
  for (guint e = 0; e < 32; e++)
    if (so->engines & (1u << e))
      {
        StowLayout b = *base;
        b.engine = (StowEngine)e;
        enumerate (&x, &b, &d);
      }
  if (so->max_keep == 0)
    g_array_sort (r->fits, compare_candidates);
  r->search_time_s = (double)(g_get_monotonic_time () - t0) / 1e6;
  return r;
}

void
stow_search_free (StowSearch *s)
{
  if (s == NULL)
    return;
  g_array_unref (s->fits);
  g_free (s);
}
