/* SPDX-License-Identifier: MIT
 *
 * tests/test-search.c: the search.  The totals-only memory path agrees
 * with the full estimate on every layout it visits; a fully pinned search
 * evaluates exactly one layout; the ranking is ordered; and for each
 * published Megatron layout (Korthikanti et al. 2022 Table 5, Narayanan et
 * al. 2021 Table 1) the search's best is either that layout or predicted
 * faster, with the difference stated.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "planner/search.h"
#include "tests/testutil-claim.h"
#include "tests/testutil-planner.h"

/* Every candidate of a small search, re-estimated the full way. */
static void
test_totals_match_full (void)
{
  const char *models[] = { "llama-7b", "mixtral-8x7b", "gpt2-xl" };
  for (gsize i = 0; i < G_N_ELEMENTS (models); i++)
    {
      g_autoptr (StowModel) m = stow_test_model (models[i]);
      g_autoptr (StowCluster) c = stow_test_cluster ("16xA100-80GB");
      StowTraining t;
      StowLayout base;
      StowMemOptions mo;
      stow_training_init (&t);
      t.global_batch = 64;
      stow_layout_init (&base);
      stow_mem_options_init (&mo);
      g_autoptr (StowSearch) s
          = test_search (TEST_PLAN (m, c, &t, &base, &mo), 0, 0);
      g_assert_cmpuint (s->fits->len, >, 0);
      g_assert_cmpuint (s->fits->len, ==, s->fitting);
      for (guint k = 0; k < s->fits->len; k += 7)
        {
          const StowCandidate *cand
              = &g_array_index (s->fits, StowCandidate, k);
          g_autoptr (GError) error = NULL;
          g_autoptr (StowMemory) full = stow_memory_estimate (
              TEST_PLAN (m, c, &t, &cand->layout, &mo), &error);
          g_assert_no_error (error);
          g_assert_cmpuint (full->total_bytes, ==, cand->total_bytes);
          g_assert_cmpuint (full->host_total_bytes, ==, cand->host_bytes);
          g_assert_cmpuint (full->nvme_bytes, ==, cand->nvme_bytes);
          g_assert_true (full->fits);
        }
      /* best first */
      for (guint k = 1; k < s->fits->len; k++)
        g_assert_cmpfloat (g_array_index (s->fits, StowCandidate, k - 1).score,
                           <=, g_array_index (s->fits, StowCandidate, k).score);
    }
}

static void
test_pinned_evaluates_one (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = stow_test_cluster ("64xA100-80GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions mo;
  stow_training_init (&t);
  t.global_batch = 128;
  stow_layout_init (&l);
  stow_mem_options_init (&mo);
  l.tp = 8, l.pp = 8, l.dp = 1, l.zero = 1, l.micro_batch = 1;
  l.vpp = 1, l.sp = TRUE, l.recompute = STOW_RECOMPUTE_SELECTIVE;
  l.grad_accum = 128;
  StowPins all = STOW_PIN_DP | STOW_PIN_TP | STOW_PIN_PP | STOW_PIN_VPP
                 | STOW_PIN_CP | STOW_PIN_EP | STOW_PIN_SP | STOW_PIN_ZERO
                 | STOW_PIN_OFFLOAD_OPTIMIZER | STOW_PIN_OFFLOAD_PARAMS
                 | STOW_PIN_OFFLOAD_ACTIVATIONS | STOW_PIN_RECOMPUTE
                 | STOW_PIN_MICRO_BATCH | STOW_PIN_SCHEDULE;
  g_autoptr (StowSearch) s
      = test_search (TEST_PLAN (m, c, &t, &l, &mo), all, 1);
  g_assert_cmpuint (s->evaluated, ==, 1);
  g_assert_cmpuint (s->fitting, ==, 1);
  const StowCandidate *cand = &g_array_index (s->fits, StowCandidate, 0);
  g_assert_cmpuint (cand->layout.tp, ==, 8);
  g_assert_cmpuint (cand->layout.grad_accum, ==, 128);
  g_assert_cmpfloat (cand->cost.step_time_s, >, 0);
}

static gboolean
tp_one_only (const StowPlan *candidate, gpointer data)
{
  guint *calls = data;
  (*calls)++;
  return candidate->layout.tp == 1;
}

/* A filter removes layouts before they are priced, counted as invalid,
 * and leaves every other layout as it was. */
static void
test_filter (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-80GB");
  StowTraining t;
  StowLayout base;
  StowMemOptions mo;
  stow_test_defaults (&t, &base, &mo);
  t.global_batch = 32;
  StowSearchOptions so;
  stow_search_options_init (&so);
  g_autoptr (StowSearch) all
      = stow_search_run (TEST_PLAN (m, c, &t, &base, &mo), 0, &so);
  guint calls = 0;
  so.accept = tp_one_only;
  so.accept_data = &calls;
  g_autoptr (StowSearch) one
      = stow_search_run (TEST_PLAN (m, c, &t, &base, &mo), 0, &so);
  guint64 tp1 = 0;
  for (guint k = 0; k < all->fits->len; k++)
    tp1 += g_array_index (all->fits, StowCandidate, k).layout.tp == 1;
  g_assert_cmpuint (calls, >, 0);
  g_assert_cmpuint (one->fitting, ==, tp1);
  g_assert_cmpuint (one->fitting, <, all->fitting);
  g_assert_cmpuint (one->invalid, >, all->invalid);
  for (guint k = 0; k < one->fits->len; k++)
    g_assert_cmpuint (g_array_index (one->fits, StowCandidate, k).layout.tp, ==,
                      1);
  /* the same best layout when the best had tp 1 */
  const StowCandidate *a = &g_array_index (all->fits, StowCandidate, 0);
  if (a->layout.tp == 1)
    g_assert_cmpfloat (a->score, ==,
                       g_array_index (one->fits, StowCandidate, 0).score);
}

/* Several engines: each engine's layouts priced by its own memory model,
 * ranked together; the same as the engines' searches one by one. */
static void
test_engines (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-80GB");
  StowTraining t;
  StowLayout base;
  StowMemOptions mo;
  stow_test_defaults (&t, &base, &mo);
  static const StowEngine engines[]
      = { STOW_ENGINE_DEEPSPEED, STOW_ENGINE_MEGATRON, STOW_ENGINE_FSDP };
  StowSearchOptions so;
  stow_search_options_init (&so);
  so.max_keep = 1;
  guint64 fitting = 0;
  double best = G_MAXDOUBLE;
  StowEngine best_engine = STOW_ENGINE_STOWAGE;
  for (gsize i = 0; i < G_N_ELEMENTS (engines); i++)
    {
      base.engine = engines[i];
      g_autoptr (StowSearch) s
          = stow_search_run (TEST_PLAN (m, c, &t, &base, &mo), 0, &so);
      g_assert_cmpuint (s->fits->len, ==, 1);
      const StowCandidate *b = &g_array_index (s->fits, StowCandidate, 0);
      g_assert_cmpint (b->layout.engine, ==, engines[i]);
      fitting += s->fitting;
      if (b->score < best)
        best = b->score, best_engine = engines[i];
    }
  base.engine = STOW_ENGINE_STOWAGE;
  so.engines = (1u << STOW_ENGINE_DEEPSPEED) | (1u << STOW_ENGINE_MEGATRON)
               | (1u << STOW_ENGINE_FSDP);
  g_autoptr (StowSearch) s
      = stow_search_run (TEST_PLAN (m, c, &t, &base, &mo), 0, &so);
  g_assert_cmpuint (s->fitting, ==, fitting);
  const StowCandidate *b = &g_array_index (s->fits, StowCandidate, 0);
  g_assert_cmpint (b->layout.engine, ==, best_engine);
  g_assert_cmpfloat (b->score, ==, best);
}

/* fp8 on a GPU without fp8 tensor cores is no layout at all (Transformer
 * Engine needs compute capability 8.9; the A100 is 8.0), and the reason
 * names the GPU; on an H100 the same search finds layouts. */
static void
test_precision_gpu (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) a100 = stow_test_cluster ("8xA100-80GB");
  g_autoptr (StowCluster) h100 = stow_test_cluster ("8xH100-SXM");
  StowTraining t;
  StowLayout base;
  StowMemOptions mo;
  stow_test_defaults (&t, &base, &mo);
  t.precision = STOW_PRECISION_FP8;
  g_autoptr (StowSearch) none
      = test_search (TEST_PLAN (m, a100, &t, &base, &mo), 0, 1);
  g_assert_cmpuint (none->evaluated, ==, 0);
  g_assert_cmpuint (none->invalid, >, 0);
  g_autoptr (GError) error = NULL;
  g_assert_false (stow_training_check_gpu (&t, &a100->node.gpu, NULL, &error));
  g_assert_error (error, STOW_PLAN_ERROR, STOW_PLAN_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "A100-80GB"));
  g_autoptr (StowSearch) some
      = test_search (TEST_PLAN (m, h100, &t, &base, &mo), 0, 1);
  g_assert_cmpuint (some->fitting, >, 0);

  /* bf16 on a V100: allowed, with the reason in a warning. */
  g_autoptr (StowCluster) v100 = stow_test_cluster ("8xV100");
  g_autofree char *warning = NULL;
  t.precision = STOW_PRECISION_BF16;
  g_assert_true (stow_training_check_gpu (&t, &v100->node.gpu, &warning, NULL));
  g_assert_nonnull (warning);
  g_assert_nonnull (strstr (warning, "no bf16 tensor cores"));
  g_autofree char *none_warning = NULL;
  g_assert_true (
      stow_training_check_gpu (&t, &h100->node.gpu, &none_warning, NULL));
  g_assert_null (none_warning);
}

/* Too little memory for stored activations: the search finds the fewest
 * recomputed layers (full:K) that fit. */
static void
test_partial_recompute (void)
{
  g_autoptr (StowModel) m = stow_test_model ("llama-7b");
  g_autoptr (StowCluster) c = stow_test_cluster ("8xA100-40GB");
  StowTraining t;
  StowLayout l;
  StowMemOptions mo;
  stow_training_init (&t);
  t.global_batch = 64;
  t.seq_len = 4096;
  stow_layout_init (&l);
  stow_mem_options_init (&mo);
  l.tp = 1, l.pp = 1, l.dp = 8, l.zero = 3, l.micro_batch = 2;
  StowPins pins = STOW_PIN_TP | STOW_PIN_PP | STOW_PIN_DP | STOW_PIN_CP
                  | STOW_PIN_ZERO | STOW_PIN_OFFLOAD_OPTIMIZER
                  | STOW_PIN_OFFLOAD_PARAMS | STOW_PIN_OFFLOAD_ACTIVATIONS
                  | STOW_PIN_MICRO_BATCH;
  g_autoptr (StowSearch) s
      = test_search (TEST_PLAN (m, c, &t, &l, &mo), pins, 0);
  gboolean partial = FALSE;
  for (guint k = 0; k < s->fits->len; k++)
    {
      const StowLayout *x = &g_array_index (s->fits, StowCandidate, k).layout;
      if (x->recompute == STOW_RECOMPUTE_FULL && x->recompute_layers > 0)
        {
          partial = TRUE;
          /* one layer fewer does not fit */
          StowLayout y = *x;
          y.recompute_layers--;
          StowMemTotals mt;
          if (y.recompute_layers > 0)
            {
              g_assert_true (stow_memory_estimate_totals (
                  TEST_PLAN (m, c, &t, &y, &mo), NULL, &mt, NULL));
              g_assert_false (mt.fits);
            }
        }
    }
  g_assert_true (partial);
}

typedef struct
{
  const char *model;
  const char *gpus;
  guint tp, pp, vpp;
  guint64 gb, mbs;
  StowRecompute rc;
} Published;

static const Published published[] = {
  { "korthikanti-22b", "8xA100-80GB", 8, 1, 1, 4, 4, STOW_RECOMPUTE_SELECTIVE },
  { "korthikanti-175b", "64xA100-80GB", 8, 8, 3, 64, 1,
    STOW_RECOMPUTE_SELECTIVE },
  { "mt-nlg-530b", "280xA100-80GB", 8, 35, 3, 280, 1,
    STOW_RECOMPUTE_SELECTIVE },
  { "korthikanti-1t", "512xA100-80GB", 8, 64, 1, 512, 1,
    STOW_RECOMPUTE_SELECTIVE },
  { "megatron-1.7b", "32xA100-80GB", 1, 1, 1, 512, 1, STOW_RECOMPUTE_FULL },
  { "megatron-7.5b", "128xA100-80GB", 4, 1, 1, 512, 1, STOW_RECOMPUTE_FULL },
  { "megatron-39.1b", "512xA100-80GB", 8, 2, 1, 1536, 1, STOW_RECOMPUTE_FULL },
};

/* Megatron's own space (ZeRO <= 1, no parameter or NVMe offload), fp16,
 * the 2021/22 attention kernels. */
static void
test_published (gconstpointer data)
{
  const Published *p = data;
  g_autoptr (StowModel) m = stow_test_model (p->model);
  g_autoptr (StowCluster) c = stow_test_cluster (p->gpus);
  StowTraining t;
  StowLayout base, pub;
  StowMemOptions mo;
  stow_training_init (&t);
  t.seq_len = 2048;
  t.global_batch = p->gb;
  t.precision = STOW_PRECISION_FP16;
  t.flash_attention = FALSE;
  stow_mem_options_init (&mo);
  stow_layout_init (&base);
  base.engine = STOW_ENGINE_MEGATRON;
  pub = base;
  pub.tp = p->tp, pub.pp = p->pp, pub.vpp = p->vpp;
  pub.dp = c->n_gpus / (p->tp * p->pp);
  pub.sp = p->tp > 1 && p->rc == STOW_RECOMPUTE_SELECTIVE;
  pub.micro_batch = p->mbs;
  pub.grad_accum = p->gb / (p->mbs * pub.dp);
  pub.recompute = p->rc;
  pub.schedule = p->vpp > 1 ? STOW_SCHEDULE_INTERLEAVED : STOW_SCHEDULE_1F1B;

  g_autoptr (StowSearch) s
      = test_search (TEST_PLAN (m, c, &t, &base, &mo), 0, 1);
  g_assert_cmpuint (s->fits->len, ==, 1);
  const StowCandidate *best = &g_array_index (s->fits, StowCandidate, 0);
  StowCost pc;
  g_autoptr (GError) error = NULL;
  g_assert_true (stow_cost_estimate_checked (TEST_PLAN (m, c, &t, &pub, NULL),
                                             NULL, &pc, &error));
  g_autoptr (GString) why = g_string_new (NULL);
  stow_cost_explain_difference (why, &best->layout, &best->cost, &pub, &pc);
  g_test_message ("%s: best %.4g s vs published layout %.4g s: %s", p->model,
                  best->cost.step_time_s, pc.step_time_s, why->str);
  gboolean same = best->layout.tp == pub.tp && best->layout.pp == pub.pp
                  && best->layout.vpp == pub.vpp
                  && best->layout.micro_batch == pub.micro_batch
                  && best->layout.recompute == pub.recompute;
  if (!same)
    {
      g_assert_cmpfloat (best->cost.step_time_s, <=, pc.step_time_s);
      /* the explanation names at least one differing field and term */
      g_assert_null (strstr (why->str, "layout: same"));
      g_assert_nonnull (strstr (why->str, " s;"));
    }
}

/* The bound: LLaMA-65B on 1024 A100s, every dimension, in under a
 * second on one core.  The machine running the tests may be shared, so
 * the assertion allows 3x; bench/search.sh measures it properly.  The
 * number of layouts it evaluates is the claim README.md quotes beside the
 * benchmark's time: 141,867 when issue 42 counted them (168,744 when the
 * benchmark ran), held within a quarter either way. */
static void
quiet (const char *domain, GLogLevelFlags level, const char *message,
       gpointer data)
{
}

static void
test_speed (void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
  g_test_skip ("timing is meaningless under sanitizers");
  return;
#endif
  if (g_getenv ("STOW_VALGRIND"))
    {
      g_test_skip ("timing is meaningless under valgrind");
      return;
    }
  /* The validator's g_debug for unfilled pipelines would be printed by
   * the test harness for every such layout: not what is timed here. */
  guint h = g_log_set_handler ("stowage", G_LOG_LEVEL_DEBUG, quiet, NULL);
  g_autoptr (StowModel) m = stow_test_model ("llama-65b");
  g_autoptr (StowCluster) c = stow_test_cluster ("1024xA100-80GB");
  StowTraining t;
  StowLayout base;
  StowMemOptions mo;
  stow_training_init (&t);
  t.global_batch = 2048;
  stow_layout_init (&base);
  stow_mem_options_init (&mo);
  /* The bound is on the process's CPU time, not the wall clock: CI runs
   * two test programs at once on two cores, which stretches the wall time
   * of whichever is slower, not the work done (1.9-2.1 s on the
   * development VM alone). */
  struct timespec c0, c1;
  clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &c0);
  g_autoptr (StowSearch) s
      = test_search (TEST_PLAN (m, c, &t, &base, &mo), 0, 10);
  clock_gettime (CLOCK_PROCESS_CPUTIME_ID, &c1);
  double cpu = (double)(c1.tv_sec - c0.tv_sec)
               + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
  g_test_message ("%" G_GUINT64_FORMAT " layouts in %.3f s wall, %.3f s CPU "
                  "(%.0f per CPU second)",
                  s->evaluated, s->search_time_s, cpu,
                  (double)s->evaluated / cpu);
  stow_test_claim ("search.llama-65b-1024.layouts", (double)s->evaluated);
  g_assert_cmpuint (s->evaluated, >=, 141867 * 4 / 5);
  g_assert_cmpuint (s->evaluated, <=, 141867 * 5 / 4);
  g_assert_cmpuint (s->fits->len, ==, 10);
  g_assert_cmpfloat (cpu, <, 3.0);
  g_log_remove_handler ("stowage", h);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/search/totals-match-full", test_totals_match_full);
  g_test_add_func ("/search/pinned-evaluates-one", test_pinned_evaluates_one);
  g_test_add_func ("/search/partial-recompute", test_partial_recompute);
  g_test_add_func ("/search/filter", test_filter);
  g_test_add_func ("/search/engines", test_engines);
  g_test_add_func ("/search/precision-gpu", test_precision_gpu);
  g_test_add_func ("/search/speed", test_speed);
  for (gsize i = 0; i < G_N_ELEMENTS (published); i++)
    {
      g_autofree char *p
          = g_strdup_printf ("/search/published/%s", published[i].model);
      g_test_add_data_func (p, &published[i], test_published);
    }
  return g_test_run ();
}
