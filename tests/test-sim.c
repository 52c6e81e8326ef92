/* SPDX-License-Identifier: MIT
 *
 * tests/test-sim.c: the interpreter and the sim backend.  Hand-built
 * programs with known timings; the errors it must raise (deadlock, reads
 * of buffers not loaded, a slot taken twice, a free under a running op,
 * out of memory), each naming the op; the two-layer prefetch schedule on
 * synthetic clusters (compute-bound and transfer-bound within 5%, resident
 * layers spread to hide the loads); 1F1B's bubble; the NVMe swap pipeline;
 * the Chrome trace.
 */
#include <math.h>
#include <string.h>

#include <json-glib/json-glib.h>

#include "core/json.h"
#include "planner/cost.h"
#include "planner/lower.h"
#include "planner/sim.h"
#include "program/backend.h"
#include "program/driver.h"
#include "tests/testutil-claim.h"
#include "tests/testutil-planner.h"

static StowCluster *
one_gpu (void)
{
  g_autoptr (GError) error = NULL;
  StowCluster *c = stow_cluster_new_from_spec ("A100-80GB", &error);
  g_assert_no_error (error);
  return c;
}

/* A copy of a catalog GPU's node with chosen bandwidths. */
static StowCluster *
synthetic (double pcie_bw, double host_mem_bw)
{
  g_autoptr (StowCluster) base = one_gpu ();
  StowNode node;
  stow_node_copy (&base->node, &node);
  node.gpus_per_node = 1;
  node.gpu.pcie_bw = pcie_bw;
  node.host_mem_bw = host_mem_bw;
  StowCluster *c = stow_cluster_new (&node, 1, "synthetic");
  stow_node_clear (&node);
  return c;
}

static StowTraining
training (void)
{
  StowTraining t;
  stow_training_init (&t);
  t.seq_len = 2048;
  /* No clipping, as the time model prices a step (and as these programs
   * were written): a clipped step's updates wait for the global norm of
   * every gradient, so CPU Adam no longer runs under the backward. */
  t.optim.max_grad_norm = 0;
  return t;
}

/* Bytes of a copy that takes @s on @c. */
static guint64
bytes_for (const StowCluster *c, double s)
{
  return (guint64)(s * c->node.gpu.pcie_bw);
}

/* What the sim needs to price a program: the model and layout of a
 * lowered one, the fixed seconds of a hand-built one's compute ops. */
typedef struct
{
  StowModel *model;
  StowLayout layout;
  GArray *fixed; /* (guint op, double seconds) pairs as doubles */
} Pricing;

static GHashTable *pricing; /* StowProgram * -> Pricing * */

static void
pricing_free (gpointer data)
{
  Pricing *pr = data;
  if (pr->model)
    stow_model_unref (pr->model);
  if (pr->fixed)
    g_array_unref (pr->fixed);
  g_free (pr);
}

static Pricing *
pricing_of (const StowProgram *p)
{
  if (pricing == NULL)
    pricing = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL,
                                     pricing_free);
  Pricing *pr = g_hash_table_lookup (pricing, p);
  if (pr == NULL)
    {
      pr = g_new0 (Pricing, 1);
      pr->fixed = g_array_new (FALSE, FALSE, sizeof (double));
      g_hash_table_insert (pricing, (gpointer)p, pr);
    }
  return pr;
}

/* stow_lower, remembering what the sim prices the program by. */
static StowProgram *
lower (const StowModel *m, const StowCluster *c, const StowTraining *t,
       const StowLayout *l, const StowMemOptions *mo,
       const StowLowerOptions *so, GError **error)
{
  StowProgram *p
      = stow_lower (test_lower_plan (TEST_PLAN (m, c, t, l, mo), so), error);
  if (p != NULL)
    {
      Pricing *pr = pricing_of (p);
      pr->model = stow_model_ref ((StowModel *)m);
      pr->layout = *l;
    }
  return p;
}

static StowBackend *
sim_for (const StowProgram *p, const StowCluster *c, const StowTraining *t,
         const guint64 *caps)
{
  Pricing *pr = pricing_of (p);
  StowBackend *sim = stow_backend_sim_new (
      TEST_PLAN (pr->model, c, t, pr->model ? &pr->layout : NULL, NULL), caps);
  for (guint i = 0; i + 1 < pr->fixed->len; i += 2)
    stow_backend_sim_set_op_seconds (
        sim, (guint)g_array_index (pr->fixed, double, i),
        g_array_index (pr->fixed, double, i + 1));
  return sim;
}

static guint
add_copy (StowProgram *p, guint64 bytes, guint buf, const guint *waits,
          guint nw, guint record)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_COPY, STOW_STREAM_H2D, 0);
  op.src = STOW_TIER_PINNED, op.dst = STOW_TIER_DEVICE, op.bytes = bytes;
  if (buf != STOW_NONE)
    op.writes[op.n_writes++] = buf;
  op.record = record;
  return stow_program_add (p, &op, waits, nw);
}

/* A forward op that takes @seconds. */
static guint
add_compute (StowProgram *p, double seconds, guint buf, const guint *waits,
             guint nw, guint record)
{
  StowOp op;
  stow_op_init (&op, STOW_OP_FORWARD, STOW_STREAM_COMPUTE, 0);
  op.layer = 0;
  if (buf != STOW_NONE)
    op.reads[op.n_reads++] = buf;
  op.record = record;
  guint i = stow_program_add (p, &op, waits, nw);
  double pair[2] = { i, seconds };
  g_array_append_vals (pricing_of (p)->fixed, pair, 2);
  return i;
}

static guint
add_mem (StowProgram *p, StowOpKind kind, StowStream s, guint buf,
         const guint *waits, guint nw)
{
  StowOp op;
  stow_op_init (&op, kind, s, 0);
  op.buffer = buf;
  return stow_program_add (p, &op, waits, nw);
}

static StowTrace *
run (const StowProgram *p, const StowCluster *c, const StowTraining *t,
     const guint64 *caps, GError **error)
{
  g_autoptr (StowBackend) sim = sim_for (p, c, t, caps);
  return stow_program_run (p, sim, error);
}

/* Copy 0.1 s, compute 0.2 s on it; a second copy overlaps the compute and
 * a second compute waits for it: 0.1 + max(0.2, 0.1) + 0.2 = 0.5 s. */
static void
test_timing (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint a = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 1000, 0, FALSE, "A");
  guint b = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 3000, 1, FALSE, "B");
  guint ea = stow_program_event (p, 0, "A loaded");
  guint eb = stow_program_event (p, 0, "B loaded");
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_H2D, a, NULL, 0);
  add_copy (p, bytes_for (c, 0.1), a, NULL, 0, ea);
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_H2D, b, NULL, 0);
  add_copy (p, bytes_for (c, 0.1), b, NULL, 0, eb);
  add_compute (p, 0.2, a, &ea, 1, STOW_NONE);
  add_compute (p, 0.2, b, &eb, 1, STOW_NONE);
  add_mem (p, STOW_OP_FREE, STOW_STREAM_COMPUTE, a, NULL, 0);
  add_mem (p, STOW_OP_FREE, STOW_STREAM_COMPUTE, b, NULL, 0);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat_with_epsilon (tr->step_time_s, 0.5, 1e-6);
  g_assert_cmpfloat_with_epsilon (tr->busy_s[STOW_STREAM_H2D], 0.2, 1e-6);
  /* The first copy is exposed; the second hides behind compute. */
  g_assert_cmpfloat_with_epsilon (tr->exposed_s[STOW_STREAM_H2D], 0.1, 1e-6);
  g_assert_cmpfloat_with_epsilon (tr->exposed_s[STOW_STREAM_COMPUTE], 0.4,
                                  1e-6);
  /* Both buffers live from 0.1 s: the peak is 4000 B at the second
   * alloc. */
  g_assert_cmpuint (tr->peak_bytes[STOW_TIER_DEVICE], ==, 4000);
  g_assert_cmpuint (tr->peak_op[STOW_TIER_DEVICE], ==, 2);
  g_assert_cmpfloat_with_epsilon (tr->peak_time_s[STOW_TIER_DEVICE], 0.1, 1e-6);
  /* Memory over time ends at zero. */
  GArray *s = tr->samples[STOW_TIER_DEVICE];
  g_assert_cmpuint (g_array_index (s, StowMemSample, s->len - 1).bytes, ==, 0);
  /* The critical path ends with the second compute, after its copy. */
  guint n = tr->critical_path->len;
  g_assert_cmpuint (g_array_index (tr->critical_path, guint, n - 1), ==, 5);
}

static void
test_deadlock (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint ex = stow_program_event (p, 0, "x done");
  guint ey = stow_program_event (p, 0, "y done");
  add_compute (p, 1e-3, STOW_NONE, &ey, 1, ex);
  add_copy (p, 1000, STOW_NONE, &ex, 1, ey);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_DEADLOCK);
  g_assert_nonnull (strstr (error->message, "#0 forward"));
  g_assert_nonnull (strstr (error->message, "\"y done\""));
  g_assert_nonnull (strstr (error->message, "#1 copy"));
}

static void
test_never_recorded (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint e = stow_program_event (p, 0, "weights loaded");
  add_compute (p, 1e-3, STOW_NONE, &e, 1, STOW_NONE);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_PROGRAM_ERROR, STOW_PROGRAM_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "#0 forward"));
  g_assert_nonnull (strstr (error->message, "\"weights loaded\""));
}

/* The compute forgets to wait for the copy that loads its weights. */
static void
test_use_before_load (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint a = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 10, 0, FALSE,
                                 "slot 0: L3");
  guint e = stow_program_event (p, 0, "allocated");
  StowOp op;
  stow_op_init (&op, STOW_OP_ALLOC, STOW_STREAM_H2D, 0);
  op.buffer = a, op.record = e;
  stow_program_add (p, &op, NULL, 0);
  add_copy (p, bytes_for (c, 0.1), a, NULL, 0, STOW_NONE);
  add_compute (p, 1e-3, a, &e, 1, STOW_NONE);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_NOT_RESIDENT);
  g_assert_nonnull (strstr (error->message, "#2 forward"));
  g_assert_nonnull (strstr (error->message, "slot 0: L3"));

  /* Reading a buffer that was never allocated. */
  g_autoptr (StowProgram) q = stow_program_new (1);
  guint b = stow_program_buffer (q, 0, STOW_TIER_DEVICE, 10, -1, FALSE, "L7");
  add_compute (q, 1e-3, b, NULL, 0, STOW_NONE);
  g_clear_error (&error);
  g_autoptr (StowTrace) tq = run (q, c, &t, NULL, &error);
  g_assert_null (tq);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_NOT_RESIDENT);
  g_assert_nonnull (strstr (error->message, "not resident"));
}

static void
test_slot_twice (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint a = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 10, 1, FALSE,
                                 "slot 1: L1");
  guint b = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 10, 1, FALSE,
                                 "slot 1: L3");
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_H2D, a, NULL, 0);
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_H2D, b, NULL, 0);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_NOT_RESIDENT);
  g_assert_nonnull (strstr (error->message, "slot 1 already holds"));
  g_assert_nonnull (strstr (error->message, "slot 1: L1"));
}

static void
test_free_while_used (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint a = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 10, -1, TRUE, "W");
  guint e = stow_program_event (p, 0, "started");
  StowOp op;
  stow_op_init (&op, STOW_OP_RECOMPUTE, STOW_STREAM_COMPUTE, 0);
  op.record = e; /* a marker op with no time */
  stow_program_add (p, &op, NULL, 0);
  add_compute (p, 0.2, a, NULL, 0, STOW_NONE);
  add_mem (p, STOW_OP_FREE, STOW_STREAM_H2D, a, &e, 1);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_NOT_RESIDENT);
  g_assert_nonnull (strstr (error->message, "#2 free W"));
}

static void
test_out_of_memory (void)
{
  g_autoptr (StowCluster) c = one_gpu ();
  StowTraining t = training ();
  g_autoptr (StowProgram) p = stow_program_new (1);
  guint a = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 600, -1, FALSE, "A");
  guint b = stow_program_buffer (p, 0, STOW_TIER_DEVICE, 600, -1, FALSE, "B");
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_COMPUTE, a, NULL, 0);
  add_mem (p, STOW_OP_ALLOC, STOW_STREAM_COMPUTE, b, NULL, 0);
  guint64 caps[STOW_N_TIERS] = { 1000, 0, 0, 0 };
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, caps, &error);
  g_assert_null (tr);
  g_assert_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY);
  g_assert_nonnull (strstr (error->message, "#1 alloc B"));
  g_assert_nonnull (strstr (error->message, "600 B in use of 1000 B"));
}

/* ---- the two-layer schedule --------------------------------------------- */

static StowProgram *
streamed_program (const StowCluster *c, const StowTraining *t, guint resident,
                  guint64 grad_accum)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_assert_no_error (error);
  StowLayout l;
  stow_layout_init (&l);
  l.zero = 3, l.grad_accum = grad_accum;
  l.offload_params = l.offload_optimizer = STOW_OFFLOAD_CPU;
  StowLowerOptions so;
  stow_lower_options_init (&so);
  so.resident_layers = resident;
  StowProgram *p = lower (m, c, t, &l, NULL, &so, &error);
  g_assert_no_error (error);
  return p;
}

/* The work queued on one stream: a lower bound on the step. */
static double
stream_work (const StowProgram *p, const StowCluster *c, const StowTraining *t,
             StowStream s)
{
  double sum = 0;
  g_autoptr (StowBackend) sim = sim_for (p, c, t, NULL);
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->stream == s)
        sum += stow_sim_op_seconds (sim, p, i, NULL);
    }
  return sum;
}

/* Forward seconds of one llama-7b layer on this cluster. */
static double
layer_forward_s (const StowCluster *c, const StowTraining *t)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  StowLayout l;
  stow_layout_init (&l);
  /* Lowering prices layer ops from the planner's cost model; so does
   * this probe, so the synthetic link is set against the real forward. */
  StowLayerSeconds ls;
  stow_cost_layer_seconds (TEST_PLAN (m, c, t, &l, NULL), FALSE, &ls);
  return ls.forward_s;
}

static void
check_bound (double pcie_bw, gboolean compute_bound)
{
  StowTraining t = training ();
  /* Host memory fast enough that CPU Adam never shows: the test is about
   * the layer streams. */
  g_autoptr (StowCluster) c = synthetic (pcie_bw, 10e12);
  g_autoptr (StowProgram) p = streamed_program (c, &t, 0, 2);
  g_assert_cmpuint (p->streamed_layers, ==, 32);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  double comp = stream_work (p, c, &t, STOW_STREAM_COMPUTE);
  double h2d = stream_work (p, c, &t, STOW_STREAM_H2D);
  double bound = MAX (comp, h2d);
  g_test_message ("pcie %.3g B/s: step %.4f s, compute %.4f s, h2d %.4f s",
                  pcie_bw, tr->step_time_s, comp, h2d);
  if (compute_bound)
    g_assert_cmpfloat (comp, >, 2 * h2d);
  else
    g_assert_cmpfloat (h2d, >, 2 * comp);
  g_assert_cmpfloat (tr->step_time_s, >=, bound * (1 - 1e-9));
  g_assert_cmpfloat (tr->step_time_s, <=, bound * 1.05);
  /* Whichever stream bounds the step, the other hides behind it. */
  StowStream other = compute_bound ? STOW_STREAM_H2D : STOW_STREAM_COMPUTE;
  if (compute_bound)
    g_assert_cmpfloat (tr->exposed_s[other], <, 0.05 * tr->step_time_s);
}

static void
test_two_layer_compute_bound (void)
{
  /* 404 MB per layer at 1 TB/s: 0.4 ms per load, 5.8 ms per forward. */
  check_bound (1e12, TRUE);
}

static void
test_two_layer_transfer_bound (void)
{
  /* 16 GB/s: 25 ms per load. */
  check_bound (16e9, FALSE);
}

/* Loads 1.5x a layer's forward: streaming every layer is transfer-bound
 * in forward; keeping half resident, spread evenly, hides every load
 * behind the resident layer before it (BMInf's rule). */
static void
test_resident_spread_hides_loads (void)
{
  StowTraining t = training ();
  g_autoptr (StowCluster) probe = synthetic (1e12, 10e12);
  double fwd = layer_forward_s (probe, &t);
  double layer_bytes = 2.0 * 202383360; /* llama-7b layer, bf16 */
  g_autoptr (StowCluster) c = synthetic (layer_bytes / (1.5 * fwd), 10e12);
  g_autoptr (GError) error = NULL;

  g_autoptr (StowProgram) all = streamed_program (c, &t, 0, 1);
  g_autoptr (StowTrace) ta = run (all, c, &t, NULL, &error);
  g_assert_no_error (error);
  double comp_all = stream_work (all, c, &t, STOW_STREAM_COMPUTE);

  g_autoptr (StowProgram) half = streamed_program (c, &t, 16, 1);
  g_assert_cmpuint (half->streamed_layers, ==, 16);
  g_autoptr (StowTrace) th = run (half, c, &t, NULL, &error);
  g_assert_no_error (error);
  double comp_half = stream_work (half, c, &t, STOW_STREAM_COMPUTE);
  g_test_message ("all streamed: %.4f s (compute %.4f s); half resident: "
                  "%.4f s (compute %.4f s)",
                  ta->step_time_s, comp_all, th->step_time_s, comp_half);
  g_assert_cmpfloat (ta->step_time_s, >, 1.08 * comp_all);
  g_assert_cmpfloat (th->step_time_s, <=, 1.05 * comp_half);
}

/* Layer-major accumulation: each streamed layer is loaded once per pass
 * for all micro-batches (a quarter of the loads with four), at the cost
 * of keeping every micro-batch's checkpoints, inputs and logits:
 * (m - 1) (L 2 s b h + 8 s b + 2 s b h + 10 s b V) bytes more. */
static void
test_layer_major (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_autoptr (StowCluster) c = synthetic (16e9, 10e12);
  StowTraining t = training ();
  StowLayout l;
  stow_layout_init (&l);
  l.zero = 3, l.grad_accum = 4, l.recompute = STOW_RECOMPUTE_FULL;
  l.offload_params = l.offload_optimizer = STOW_OFFLOAD_CPU;
  StowLowerOptions so;
  stow_lower_options_init (&so);
  so.resident_layers = 0;
  g_autoptr (StowProgram) mb = lower (m, c, &t, &l, NULL, &so, &error);
  g_assert_no_error (error);
  so.layer_major = TRUE;
  g_autoptr (StowProgram) lm = lower (m, c, &t, &l, NULL, &so, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) tmb = run (mb, c, &t, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) tlm = run (lm, c, &t, NULL, &error);
  g_assert_no_error (error);
  guint loads_mb = 0, loads_lm = 0;
  for (guint i = 0; i < mb->buffers->len; i++)
    loads_mb += g_array_index (mb->buffers, StowBuffer, i).slot == 0
                || g_array_index (mb->buffers, StowBuffer, i).slot == 1;
  for (guint i = 0; i < lm->buffers->len; i++)
    loads_lm += g_array_index (lm->buffers, StowBuffer, i).slot == 0
                || g_array_index (lm->buffers, StowBuffer, i).slot == 1;
  g_test_message ("micro-batch major: %u loads, %.3f s; layer major: %u "
                  "loads, %.3f s",
                  loads_mb, tmb->step_time_s, loads_lm, tlm->step_time_s);
  /* 4 micro-batches x (embedding, 32 layers and head forward, 32 layers
   * backward) vs once */
  g_assert_cmpuint (loads_mb, ==, 4 * 66);
  g_assert_cmpuint (loads_lm, ==, 66);
  g_assert_cmpfloat (tlm->step_time_s, <, 0.8 * tmb->step_time_s);
  /* Each further micro-batch's activations, input and fused-loss
   * scratch (program/program.h). */
  double sbh = 2048.0 * 4096.0, sb = 2048.0;
  guint64 extra
      = (guint64)(3
                  * (32 * 2 * sbh + 8 * sb + 2 * sbh
                     + (double)stow_loss_scratch_bytes (32000, 4096, 2048)));
  g_assert_cmpuint (tlm->peak_bytes[STOW_TIER_DEVICE], ==,
                    tmb->peak_bytes[STOW_TIER_DEVICE] + extra);
}

/* 1F1B: (m + p - 1) forward-backward slots of one stage plus the
 * optimizer (Narayanan et al. 2021, PipeDream-Flush), and interleaving
 * shrinks the bubble. */
static void
test_pipeline_bubble (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_autoptr (StowCluster) c
      = stow_cluster_new_from_spec ("4xA100-80GB", &error);
  g_assert_no_error (error);
  StowTraining t = training ();
  StowLayout l;
  stow_layout_init (&l);
  l.pp = 4, l.grad_accum = 8;
  g_autoptr (StowProgram) p = lower (m, c, &t, &l, NULL, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  /* One middle stage's forward+backward of one micro-batch. */
  double fb = 0, optim = 0;
  g_autoptr (StowBackend) sim = sim_for (p, c, &t, NULL);
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->rank != 1)
        continue;
      double s = stow_sim_op_seconds (sim, p, i, NULL);
      if ((op->kind == STOW_OP_FORWARD || op->kind == STOW_OP_BACKWARD)
          && op->micro_batch == 0)
        fb += s;
      if (op->kind == STOW_OP_OPTIM_STEP)
        optim += s;
    }
  double expect = (8 + 4 - 1) * fb + optim;
  g_test_message ("1F1B: step %.4f s, (m + p - 1) t_fb + optim = %.4f s",
                  tr->step_time_s, expect);
  g_assert_cmpfloat (tr->step_time_s, >=, 0.95 * expect);
  g_assert_cmpfloat (tr->step_time_s, <=, 1.10 * expect);

  l.vpp = 2, l.schedule = STOW_SCHEDULE_INTERLEAVED;
  g_autoptr (StowProgram) pi = lower (m, c, &t, &l, NULL, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) ti = run (pi, c, &t, NULL, &error);
  g_assert_no_error (error);
  g_test_message ("interleaved: step %.4f s", ti->step_time_s);
  g_assert_cmpfloat (ti->step_time_s, <, tr->step_time_s);
  g_assert_cmpfloat (ti->step_time_s, >=, 8 * fb);
}

/* The NVMe optimizer: Adam overlaps the reads and writes (three buffers),
 * which share the rank's drives one after another. */
static void
test_nvme_swap_pipeline (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_autoptr (StowCluster) c
      = stow_cluster_new_from_spec ("8xA100-80GB", &error);
  g_assert_no_error (error);
  if (c->node.n_nvme == 0)
    {
      g_test_skip ("the preset has no NVMe drives");
      return;
    }
  StowTraining t = training ();
  StowLayout l;
  stow_layout_init (&l);
  l.dp = 8, l.zero = 3, l.grad_accum = 1;
  l.offload_optimizer = STOW_OFFLOAD_NVME;
  g_autoptr (StowProgram) p = lower (m, c, &t, &l, NULL, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  double rd = tr->busy_s[STOW_STREAM_NVME_READ];
  double up = tr->busy_s[STOW_STREAM_CPU_OPTIM];
  double wr = tr->busy_s[STOW_STREAM_NVME_WRITE];
  /* The optimizer phase: from the first Adam to the last write. */
  double first = G_MAXDOUBLE, last = 0;
  guint chunks = 0;
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->kind == STOW_OP_OPTIM_STEP)
        first = MIN (first, tr->ops[i].start_s), chunks++;
      if (op->stream == STOW_STREAM_NVME_WRITE && op->kind == STOW_OP_COPY)
        last = MAX (last, tr->ops[i].end_s);
    }
  g_test_message ("%u chunks: read %.3f s, adam %.3f s, write %.3f s; "
                  "phase %.3f s",
                  chunks, rd, up, wr, last - first);
  g_assert_cmpuint (chunks, >=, 3);
  /* The drive's work bounds the phase (all writes and the reads but those
   * of the three swap buffers, which may precede the first Adam); Adam
   * hides behind it but for one chunk. */
  double phase = last - first;
  g_assert_cmpfloat (phase, >=, rd + wr - 3.0 * rd / chunks);
  g_assert_cmpfloat (phase, <=, rd + wr + 1.5 * up / chunks);
  g_assert_cmpfloat (phase, <, 0.85 * (rd + up + wr));
  /* At most three swap buffers in flight (pinned host), counted by time
   * from the trace. */
  guint live = 0, max_live = 0;
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->kind != STOW_OP_ALLOC
          || !g_str_has_prefix (
              g_array_index (p->buffers, StowBuffer, op->buffer).name,
              "swap buffer"))
        continue;
      live = 0;
      for (guint j = 0; j < p->ops->len; j++)
        {
          const StowOp *o = &g_array_index (p->ops, StowOp, j);
          if (o->kind != STOW_OP_ALLOC
              || !g_str_has_prefix (
                  g_array_index (p->buffers, StowBuffer, o->buffer).name,
                  "swap buffer"))
            continue;
          /* alloc j before or at i's start, and its free after */
          double fr = G_MAXDOUBLE;
          for (guint k = j + 1; k < p->ops->len; k++)
            {
              const StowOp *f = &g_array_index (p->ops, StowOp, k);
              if (f->kind == STOW_OP_FREE && f->buffer == o->buffer)
                {
                  fr = tr->ops[k].start_s;
                  break;
                }
            }
          if (tr->ops[j].start_s <= tr->ops[i].start_s
              && fr > tr->ops[i].start_s)
            live++;
        }
      max_live = MAX (max_live, live);
    }
  g_assert_cmpuint (max_live, ==, 3);
}

static void
test_chrome_trace (void)
{
  StowTraining t = training ();
  g_autoptr (StowCluster) c = synthetic (16e9, 10e12);
  g_autoptr (StowProgram) p = streamed_program (c, &t, 0, 1);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  g_autofree char *js = stow_trace_to_chrome_json (tr, p);
  g_autoptr (JsonNode) root = stow_json_parse_data (js, -1, "trace", &error);
  g_assert_no_error (error);
  JsonArray *ev = json_object_get_array_member (json_node_get_object (root),
                                                "traceEvents");
  g_assert_nonnull (ev);
  guint x = 0, threads = 0, counters = 0;
  double max_end = 0;
  for (guint i = 0; i < json_array_get_length (ev); i++)
    {
      JsonObject *o = json_array_get_object_element (ev, i);
      const char *ph = json_object_get_string_member (o, "ph");
      if (strcmp (ph, "X") == 0)
        {
          x++;
          max_end
              = MAX (max_end, json_object_get_double_member (o, "ts")
                                  + json_object_get_double_member (o, "dur"));
        }
      else if (strcmp (ph, "M") == 0
               && strcmp (json_object_get_string_member (o, "name"),
                          "thread_name")
                      == 0)
        threads++;
      else if (strcmp (ph, "C") == 0)
        counters++;
    }
  g_assert_cmpuint (threads, ==, STOW_N_STREAMS);
  g_assert_cmpuint (x, >, 100);
  g_assert_cmpuint (counters, >, 10);
  g_assert_cmpfloat_with_epsilon (max_end / 1e6, tr->step_time_s, 1e-6);
}

/* The simulator and the planner's cost model price ops the same way
 * (lowering takes layer, embedding, loss, collective and send seconds from
 * cost.c; copies and Adam use the same bandwidths), so the simulated step
 * lands near the predicted one; what is left apart is how each overlaps
 * the rest: the closed form's hidden-communication slowdown and per-layer
 * fetch cost, the program's exact pipelines of copies, CPU Adam and NVMe
 * swaps. */
static void
test_agrees_with_cost (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_assert_no_error (error);
  StowTraining t = training ();
  static const struct
  {
    const char *gpus;
    guint dp, tp, zero;
    guint64 micro_batch, grad_accum;
    StowOffload opt, par;
    double lo, hi;
  } cases[] = {
    { "8xA100-80GB", 8, 1, 1, 1, 4, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 0.95,
      1.06 },
    { "8xA100-80GB", 4, 2, 1, 2, 2, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 0.95,
      1.06 },
    { "8xA100-80GB", 1, 8, 0, 4, 8, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE, 0.95,
      1.06 },
    /* two nodes: hierarchical collectives on both sides */
    { "2x8xA100-80GB", 16, 1, 3, 1, 1, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE,
      0.92, 1.08 },
    { "2x8xA100-80GB", 16, 1, 1, 1, 4, STOW_OFFLOAD_NONE, STOW_OFFLOAD_NONE,
      0.92, 1.08 },
    /* ZeRO-Offload: CPU Adam per layer under the last backward */
    { "8xA100-80GB", 8, 1, 2, 1, 1, STOW_OFFLOAD_CPU, STOW_OFFLOAD_NONE, 0.92,
      1.08 },
    { "8xA100-80GB", 8, 1, 2, 1, 8, STOW_OFFLOAD_CPU, STOW_OFFLOAD_NONE, 0.92,
      1.08 },
    /* ZeRO-Infinity: every layer streamed; NVMe swaps share the drives */
    { "8xA100-80GB", 8, 1, 3, 1, 1, STOW_OFFLOAD_CPU, STOW_OFFLOAD_CPU, 0.92,
      1.08 },
    { "8xA100-80GB", 8, 1, 3, 1, 1, STOW_OFFLOAD_NVME, STOW_OFFLOAD_NVME, 0.92,
      1.08 },
  };
  double worst = 0;
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (StowCluster) c
          = stow_cluster_new_from_spec (cases[i].gpus, &error);
      g_assert_no_error (error);
      StowLayout l;
      stow_layout_init (&l);
      l.dp = cases[i].dp, l.tp = cases[i].tp, l.zero = cases[i].zero;
      l.micro_batch = cases[i].micro_batch;
      l.grad_accum = cases[i].grad_accum;
      l.offload_optimizer = cases[i].opt, l.offload_params = cases[i].par;
      t.global_batch = l.dp * l.micro_batch * l.grad_accum;
      StowCost cost;
      g_assert_true (stow_cost_estimate_checked (TEST_PLAN (m, c, &t, &l, NULL),
                                                 NULL, &cost, &error));
      g_assert_no_error (error);
      StowLowerOptions so;
      stow_lower_options_init (&so);
      so.resident_layers = 0; /* the time model streams every layer */
      g_autoptr (StowProgram) p = lower (m, c, &t, &l, NULL, &so, &error);
      g_assert_no_error (error);
      g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
      g_assert_no_error (error);
      double ratio = tr->step_time_s / cost.step_time_s;
      g_test_message ("%s: simulated %.4f s, predicted %.4f s (%.3f)",
                      p->description, tr->step_time_s, cost.step_time_s, ratio);
      g_assert_cmpfloat (ratio, >=, cases[i].lo);
      g_assert_cmpfloat (ratio, <=, cases[i].hi);
      worst = MAX (worst, fabs (ratio - 1.0));
      g_autofree char *claim
          = g_strdup_printf ("sim.agrees-with-cost.case-%u.ratio", i + 1);
      stow_test_claim (claim, ratio);
    }
  /* The figure README.md and docs/simulator.md quote. */
  stow_test_claim ("sim.agrees-with-cost.worst-pct", 100 * worst);
}

/* The NVMe optimizer step priced by one rule (core/drives.h) in the time
 * model and the simulator: a drive's reads and writes share its queue and
 * the busiest of the striped drives sets the pace.  One drive of the eight
 * made slower stretches both by the same factor, and they agree. */
static double
nvme_phase_ratio (StowCluster *c, const StowModel *m, double *predicted,
                  double *simulated)
{
  g_autoptr (GError) error = NULL;
  StowTraining t = training ();
  StowLayout l;
  stow_layout_init (&l);
  l.dp = 8, l.zero = 3, l.grad_accum = 1;
  l.offload_optimizer = STOW_OFFLOAD_NVME;
  t.global_batch = 8;
  StowCost cost;
  g_assert_true (stow_cost_estimate_checked (TEST_PLAN (m, c, &t, &l, NULL),
                                             NULL, &cost, &error));
  g_autoptr (StowProgram) p = lower (m, c, &t, &l, NULL, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (StowTrace) tr = run (p, c, &t, NULL, &error);
  g_assert_no_error (error);
  /* Busy seconds are summed over the ranks: one rank's share. */
  double io
      = (tr->busy_s[STOW_STREAM_NVME_READ] + tr->busy_s[STOW_STREAM_NVME_WRITE])
        / p->n_ranks;
  *predicted = cost.total_s[STOW_COST_NVME];
  *simulated = io;
  return io / cost.total_s[STOW_COST_NVME];
}

static void
test_nvme_bound_agrees (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_lookup ("llama-7b", &error);
  g_autoptr (StowCluster) c
      = stow_cluster_new_from_spec ("8xA100-80GB", &error);
  g_assert_no_error (error);
  if (c->node.n_nvme < 2)
    {
      g_test_skip ("the preset has fewer than two NVMe drives");
      return;
    }
  double p0, s0, p1, s1;
  double r0 = nvme_phase_ratio (c, m, &p0, &s0);
  /* Drive 0 reads at half speed and writes at a third: it is the busiest,
   * its share takes (2 / R + 3 / W) / (1 / R + 1 / W) as long. */
  double R = c->node.nvme[0].read_bw, W = c->node.nvme[0].write_bw;
  c->node.nvme[0].read_bw = R / 2, c->node.nvme[0].write_bw = W / 3;
  double r1 = nvme_phase_ratio (c, m, &p1, &s1);
  double stretch = (2 / R + 3 / W) / (1 / R + 1 / W);
  g_test_message ("equal drives: predicted %.3f s, simulated %.3f s; one "
                  "slow drive: %.3f s, %.3f s",
                  p0, s0, p1, s1);
  g_assert_cmpfloat_with_epsilon (p1 / p0, stretch, 1e-9 * stretch);
  g_assert_cmpfloat_with_epsilon (s1 / s0, stretch, 1e-9 * stretch);
  g_assert_cmpfloat_with_epsilon (r0, r1, 1e-9);
  g_assert_cmpfloat (r0, >=, 0.9);
  g_assert_cmpfloat (r0, <=, 1.1);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/sim/timing", test_timing);
  g_test_add_func ("/sim/deadlock", test_deadlock);
  g_test_add_func ("/sim/never-recorded", test_never_recorded);
  g_test_add_func ("/sim/use-before-load", test_use_before_load);
  g_test_add_func ("/sim/slot-twice", test_slot_twice);
  g_test_add_func ("/sim/free-while-used", test_free_while_used);
  g_test_add_func ("/sim/out-of-memory", test_out_of_memory);
  g_test_add_func ("/sim/two-layer/compute-bound",
                   test_two_layer_compute_bound);
  g_test_add_func ("/sim/two-layer/transfer-bound",
                   test_two_layer_transfer_bound);
  g_test_add_func ("/sim/two-layer/resident-spread",
                   test_resident_spread_hides_loads);
  g_test_add_func ("/sim/two-layer/layer-major", test_layer_major);
  g_test_add_func ("/sim/pipeline-bubble", test_pipeline_bubble);
  g_test_add_func ("/sim/nvme-swap-pipeline", test_nvme_swap_pipeline);
  g_test_add_func ("/sim/nvme-bound-agrees", test_nvme_bound_agrees);
  g_test_add_func ("/sim/chrome-trace", test_chrome_trace);
  g_test_add_func ("/sim/agrees-with-cost", test_agrees_with_cost);
  int rc = g_test_run ();
  if (pricing)
    g_hash_table_unref (pricing);
  return rc;
}
