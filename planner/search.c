/* SPDX-License-Identifier: MIT
 *
 * planner/search.c: brute force over the layout space, pruned by
 * divisibility before the memory model runs.  Each layout costs one
 * closed-form memory estimate (microseconds), so even thousands of GPUs
 * take milliseconds.
 */
#include "planner/search.h"

#include <string.h>

static guint
divisors (guint64 n, guint64 limit, guint *out, guint max)
{
  guint k = 0;
  for (guint64 d = 1; d <= n && d <= limit && k < max; d++)
    if (n % d == 0)
      out[k++] = (guint)d;
  return k;
}

/* The stand-in for predicted speed until planner/cost.c: offload and
 * recomputation cost the most, then model parallelism, then small
 * micro-batches. */
static double
preference (const StowLayout *l)
{
  double s = 0;
  s += l->offload_params != STOW_OFFLOAD_NONE
           ? (l->offload_params == STOW_OFFLOAD_NVME ? 4000 : 2000)
           : 0;
  s += l->offload_optimizer != STOW_OFFLOAD_NONE
           ? (l->offload_optimizer == STOW_OFFLOAD_NVME ? 1000 : 500)
           : 0;
  s += l->offload_activations ? 300 : 0;
  s += l->recompute == STOW_RECOMPUTE_FULL        ? 200
       : l->recompute == STOW_RECOMPUTE_SELECTIVE ? 20
                                                  : 0;
  s += 10.0 * (l->tp - 1) + 15.0 * (l->pp - 1) + 10.0 * (l->cp - 1);
  s += 5.0 * l->zero;
  s -= 2.0 * (double)MIN (l->micro_batch, 64);
  return s;
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

StowSearch *
stow_search_run (const StowModel *m, const StowCluster *c,
                 const StowTraining *t, const StowLayout *base, StowPins pins,
                 const StowMemOptions *o, guint max_keep)
{
  StowSearch *r = g_new0 (StowSearch, 1);
  guint tps[64], pps[256], cps[16], mbs[32];
  guint ntp, npp, ncp, nmb;
  guint64 gpus = c->n_gpus;
  guint per_node = MAX (c->node.gpus_per_node, 1);

  r->fits = g_array_new (FALSE, FALSE, sizeof (StowCandidate));
  ntp = (pins & STOW_PIN_TP) ? (tps[0] = base->tp, 1)
                             : divisors (gpus, per_node, tps, 64);
  npp = (pins & STOW_PIN_PP) ? (pps[0] = base->pp, 1)
                             : divisors (m->n_layers, gpus, pps, 256);
  ncp = (pins & STOW_PIN_CP) ? (cps[0] = base->cp, 1) : (cps[0] = 1, 1);
  /* Micro-batch sizes: powers of two up to the per-replica batch. */
  if (pins & STOW_PIN_MICRO_BATCH)
    mbs[0] = (guint)base->micro_batch, nmb = 1;
  else
    {
      nmb = 0;
      for (guint b = 1; b <= 64 && nmb < 32; b *= 2)
        mbs[nmb++] = b;
    }

  static const StowOffload offs[]
      = { STOW_OFFLOAD_NONE, STOW_OFFLOAD_CPU, STOW_OFFLOAD_NVME };
  static const StowRecompute recs[]
      = { STOW_RECOMPUTE_NONE, STOW_RECOMPUTE_SELECTIVE, STOW_RECOMPUTE_FULL };
  for (guint i = 0; i < ntp; i++)
    for (guint j = 0; j < npp; j++)
      for (guint q = 0; q < ncp; q++)
        {
          guint64 mp = (guint64)tps[i] * pps[j] * cps[q];
          if (gpus % mp != 0)
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
          for (guint z = 0; z <= 3; z++)
            for (guint oo = 0; oo < 3; oo++)
              for (guint op = 0; op < 3; op++)
                for (guint rc = 0; rc < 3; rc++)
                  for (guint b = 0; b < nmb; b++)
                    {
                      StowLayout l = *base;
                      l.tp = tps[i], l.pp = pps[j], l.cp = cps[q], l.dp = dp;
                      if (!(pins & STOW_PIN_ZERO))
                        l.zero = z;
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
                      if (!(pins & STOW_PIN_RECOMPUTE))
                        l.recompute = recs[rc], l.recompute_layers = 0;
                      else if (rc != 0)
                        continue;
                      l.micro_batch = mbs[b];
                      if (!(pins & STOW_PIN_SP))
                        l.sp = l.tp > 1;
                      if (!(pins & STOW_PIN_VPP))
                        l.vpp = 1;
                      if (!(pins & STOW_PIN_SCHEDULE))
                        l.schedule = l.vpp > 1 ? STOW_SCHEDULE_INTERLEAVED
                                               : STOW_SCHEDULE_1F1B;
                      /* Accumulation from the global batch when given,
                       * else enough micro-batches to fill the pipeline. */
                      if (t->global_batch)
                        {
                          guint64 per = (guint64)l.micro_batch * l.dp;
                          if (t->global_batch % per != 0)
                            {
                              r->invalid++;
                              continue;
                            }
                          l.grad_accum = t->global_batch / per;
                        }
                      else if (!(pins & STOW_PIN_MICRO_BATCH)
                               && l.micro_batch > 1)
                        continue; /* no batch given: micro-batch 1 */
                      else
                        l.grad_accum = MAX (base->grad_accum, l.pp);
                      /* Offload without sharding is DeepSpeed's and ours
                       * only from stage 1 up. */
                      if (l.offload_optimizer != STOW_OFFLOAD_NONE
                          && l.zero == 0 && dp > 1)
                        {
                          r->invalid++;
                          continue;
                        }
                      r->evaluated++;
                      g_autoptr (GError) error = NULL;
                      g_autoptr (StowMemory) mem
                          = stow_memory_estimate (m, c, t, &l, o, &error);
                      if (mem == NULL)
                        {
                          r->invalid++;
                          continue;
                        }
                      StowCandidate cand = { 0 };
                      cand.layout = l;
                      cand.total_bytes = mem->total_bytes;
                      cand.host_bytes = mem->host_total_bytes;
                      cand.nvme_bytes = mem->nvme_bytes;
                      cand.headroom_bytes = (gint64)mem->capacity_bytes
                                            - (gint64)mem->total_bytes;
                      cand.score = preference (&l);
                      if (!mem->fits)
                        {
                          if (!mem->fits_device)
                            r->out_of_memory++;
                          else
                            r->host_or_nvme++;
                          if (!r->have_miss
                              || cand.headroom_bytes
                                     > r->best_miss.headroom_bytes)
                            r->best_miss = cand, r->have_miss = TRUE;
                          continue;
                        }
                      g_array_append_val (r->fits, cand);
                    }
        }
  g_array_sort (r->fits, compare_candidates);
  if (max_keep > 0 && r->fits->len > max_keep)
    g_array_set_size (r->fits, max_keep);
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
