/* SPDX-License-Identifier: MIT
 *
 * tests/test-program.c: what the step program carries for real training:
 * the model's units (one flat layout of tensors each, checked against the
 * published parameter counts), the buffers' contents, the data, loss,
 * gradient-norm and optimizer ops with their overwrite/accumulate flags,
 * and the learning-rate schedule.
 */
#include <math.h>
#include <string.h>

#include "planner/lower.h"
#include "program/program.h"
#include "tests/testutil-planner.h"

static StowModel *
model (const char *name)
{
  g_autoptr (GError) error = NULL;
  StowModel *m = stow_model_lookup (name, &error);
  g_assert_no_error (error);
  return m;
}

/* Llama-2-7B: 6,738,415,616 parameters (Touvron et al. 2023; HF
 * num_parameters()), in 34 units whose offsets tile the model. */
static void
test_units (void)
{
  g_autoptr (StowModel) m = model ("llama-2-7b");
  g_autoptr (StowProgram) p = stow_program_new (1);
  stow_program_set_units (p, m);
  g_assert_cmpuint (p->units->len, ==, 32 + 2);
  guint64 sum = 0;
  for (guint i = 0; i < p->units->len; i++)
    {
      const StowUnit *u = stow_program_unit (p, i);
      g_assert_cmpuint (u->offset, ==, sum);
      guint64 t_sum = 0;
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, u->first_tensor + k);
          g_assert_cmpuint (t->offset, ==, t_sum);
          t_sum += t->numel;
        }
      g_assert_cmpuint (t_sum, ==, u->numel);
      sum += u->numel;
    }
  g_assert_cmpuint (sum, ==, 6738415616ULL);
  guint emb = stow_program_unit_of_layer (p, STOW_LAYER_EMBEDDING);
  guint head = stow_program_unit_of_layer (p, STOW_LAYER_HEAD);
  g_assert_cmpuint (emb, ==, 0);
  g_assert_cmpuint (head, ==, 33);
  g_assert_cmpuint (stow_program_unit (p, emb)->numel, ==, 32000ULL * 4096);
  /* The head: the final norm and the untied lm_head. */
  g_assert_cmpuint (stow_program_unit (p, head)->numel, ==,
                    4096 + 32000ULL * 4096);
  g_assert_nonnull (stow_program_unit_tensor (p, head, "lm_head.weight"));
  const StowUnitTensor *q
      = stow_program_unit_tensor (p, stow_program_unit_of_layer (p, 3),
                                  "model.layers.3.self_attn.q_proj.weight");
  g_assert_nonnull (q);
  g_assert_cmpuint (q->n_dims, ==, 2);
  g_assert_cmpuint (q->shape[0], ==, 4096);
  g_assert_cmpuint (q->shape[1], ==, 4096);
  g_assert_null (stow_program_unit_tensor (p, head, "no.such.tensor"));
}

/* Tied embeddings (Llama-3.2-1B: 1,235,814,400 parameters): the head
 * holds the final norm only. */
static void
test_units_tied (void)
{
  g_autoptr (StowModel) m = model ("llama-3.2-1b");
  g_autoptr (StowProgram) p = stow_program_new (1);
  stow_program_set_units (p, m);
  guint64 sum = 0;
  for (guint i = 0; i < p->units->len; i++)
    sum += stow_program_unit (p, i)->numel;
  g_assert_cmpuint (sum, ==, 1235814400ULL);
  guint head = stow_program_unit_of_layer (p, STOW_LAYER_HEAD);
  g_assert_cmpuint (stow_program_unit (p, head)->numel, ==, 2048);
}

static StowProgram *
lower_small (guint64 grad_accum, double max_grad_norm, StowRecompute rec)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = model ("llama-3.2-1b");
  g_autoptr (StowCluster) c
      = stow_cluster_new_from_spec ("1xA100-80GB", &error);
  g_assert_no_error (error);
  StowTraining t;
  stow_training_init (&t);
  t.seq_len = 256;
  t.global_batch = 2 * grad_accum;
  t.optim.max_grad_norm = max_grad_norm;
  StowLayout l;
  stow_layout_init (&l);
  l.micro_batch = 2, l.grad_accum = grad_accum, l.recompute = rec;
  StowLowerOptions so;
  stow_lower_options_init (&so);
  StowProgram *p = stow_lower (
      test_lower_plan (TEST_PLAN (m, c, &t, &l, NULL), &so), &error);
  g_assert_no_error (error);
  return p;
}

static guint
count_ops (const StowProgram *p, StowOpKind kind)
{
  guint n = 0;
  for (guint i = 0; i < p->ops->len; i++)
    n += g_array_index (p->ops, StowOp, i).kind == kind;
  return n;
}

/* Per micro-batch a data op before the embedding's forward; the first
 * gradient write of each unit in the step overwrites, every later one
 * accumulates; the tied embedding's first write is the loss's. */
static void
test_training_ops (void)
{
  g_autoptr (StowProgram) p = lower_small (3, 0, STOW_RECOMPUTE_NONE);
  g_assert_cmpuint (count_ops (p, STOW_OP_DATA), ==, 3);
  g_assert_cmpuint (count_ops (p, STOW_OP_GRAD_NORM), ==, 0);
  g_assert_cmpuint (p->weight_dtype, ==, STOW_DTYPE_BF16);
  g_assert_true (p->master_weights);
  g_autofree guint *writes = g_new0 (guint, p->units->len);
  gboolean seen_data = FALSE;
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->kind == STOW_OP_DATA)
        seen_data = TRUE;
      if (op->kind == STOW_OP_FORWARD && op->layer == STOW_LAYER_EMBEDDING)
        g_assert_true (seen_data);
      if (op->kind != STOW_OP_BACKWARD && op->kind != STOW_OP_LOSS)
        continue;
      g_assert_cmpuint (op->unit, <, p->units->len);
      guint u = op->unit;
      if (op->kind == STOW_OP_LOSS)
        {
          /* The tied head writes the embedding's gradient first. */
          guint emb = stow_program_unit_of_layer (p, STOW_LAYER_EMBEDDING);
          g_assert_cmpint (op->accumulate, ==, writes[emb] > 0);
          writes[emb]++;
        }
      g_assert_cmpint (op->accumulate, ==,
                       writes[u] > 0
                           || (op->layer == STOW_LAYER_EMBEDDING
                               && op->kind == STOW_OP_BACKWARD));
      writes[u]++;
    }
  /* Every unit's gradient written once per micro-batch. */
  for (guint u = 0; u < p->units->len; u++)
    g_assert_cmpuint (writes[u], >=, 3);
  /* Buffers say what they hold. */
  gboolean weights = FALSE, acts = FALSE;
  for (guint b = 0; b < p->buffers->len; b++)
    {
      const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
      if (buf->kind == STOW_BUF_WEIGHTS && buf->persistent)
        {
          weights = TRUE;
          g_assert_cmpuint (buf->unit_first, ==, 0);
          g_assert_cmpuint (buf->n_units, ==, p->units->len);
        }
      if (buf->kind == STOW_BUF_ACTIVATIONS)
        {
          acts = TRUE;
          g_assert_cmpint (buf->layer, >=, 0);
          g_assert_cmpuint (buf->micro_batch, <, 3);
        }
    }
  g_assert_true (weights && acts);
}

/* With clipping every update waits for the norm, which waits for every
 * unit's gradients. */
static void
test_grad_norm (void)
{
  g_autoptr (StowProgram) p = lower_small (2, 1.0, STOW_RECOMPUTE_NONE);
  g_assert_cmpuint (count_ops (p, STOW_OP_GRAD_NORM), ==, 1);
  guint norm_ev = STOW_NONE;
  for (guint i = 0; i < p->ops->len; i++)
    {
      const StowOp *op = &g_array_index (p->ops, StowOp, i);
      if (op->kind == STOW_OP_GRAD_NORM)
        {
          norm_ev = op->record;
          g_assert_cmpuint (op->n_waits, ==, p->units->len);
        }
      if (op->kind == STOW_OP_OPTIM_STEP)
        {
          gboolean waits_norm = FALSE;
          for (guint w = 0; w < op->n_waits; w++)
            waits_norm |= g_array_index (p->waits, guint, op->wait_first + w)
                          == norm_ev;
          g_assert_true (waits_norm);
        }
    }
  g_assert_cmpuint (norm_ev, !=, STOW_NONE);
}

/* Full recompute: checkpoints, the forward's working sets and the
 * rebuilt parts, and the recompute ops name their unit. */
static void
test_recompute_buffers (void)
{
  g_autoptr (StowProgram) p = lower_small (1, 0, STOW_RECOMPUTE_FULL);
  guint ck = 0, rec = 0;
  for (guint b = 0; b < p->buffers->len; b++)
    {
      const StowBuffer *buf = &g_array_index (p->buffers, StowBuffer, b);
      ck += buf->kind == STOW_BUF_CHECKPOINT;
      rec += buf->kind == STOW_BUF_RECOMPUTED;
    }
  g_assert_cmpuint (ck, ==, 16);
  /* Per layer: the forward's working set and the rebuilt part. */
  g_assert_cmpuint (rec, ==, 2 * 16);
  g_assert_cmpuint (count_ops (p, STOW_OP_RECOMPUTE), ==, 16);
}

/* nanoGPT's and Megatron's schedule shape: linear warmup from lr /
 * warmup, cosine to min_lr at the last step; computed from the step. */
static void
test_lr_schedule (void)
{
  StowOptimSettings o;
  stow_optim_settings_init (&o);
  /* One default for every command: clipping at 1.0, the HF Trainer's
   * max_grad_norm and Megatron-LM's --clip-grad. */
  g_assert_cmpfloat (o.max_grad_norm, ==, 1.0);
  o.lr = 6e-4, o.min_lr = 6e-5, o.warmup_steps = 10, o.total_steps = 110;
  g_assert_cmpfloat (stow_optim_lr_at (&o, 5), ==, 6e-4 * 5 / 10);
  g_assert_cmpfloat (stow_optim_lr_at (&o, 10), ==, 6e-4);
  o.schedule = STOW_LR_COSINE;
  g_assert_cmpfloat_with_epsilon (stow_optim_lr_at (&o, 60),
                                  6e-5 + (6e-4 - 6e-5) * 0.5, 1e-15);
  g_assert_cmpfloat_with_epsilon (stow_optim_lr_at (&o, 110), 6e-5, 1e-15);
  o.schedule = STOW_LR_LINEAR;
  g_assert_cmpfloat_with_epsilon (stow_optim_lr_at (&o, 35),
                                  6e-4 - (6e-4 - 6e-5) * 0.25, 1e-15);
  StowLrSchedule s;
  g_autoptr (GError) error = NULL;
  g_assert_true (stow_lr_schedule_parse ("cosine", &s, &error));
  g_assert_cmpint (s, ==, STOW_LR_COSINE);
  g_assert_false (stow_lr_schedule_parse ("step", &s, &error));
  g_assert_nonnull (strstr (error->message, "\"step\""));
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/program/units", test_units);
  g_test_add_func ("/program/units-tied", test_units_tied);
  g_test_add_func ("/program/training-ops", test_training_ops);
  g_test_add_func ("/program/grad-norm", test_grad_norm);
  g_test_add_func ("/program/recompute-buffers", test_recompute_buffers);
  g_test_add_func ("/program/lr-schedule", test_lr_schedule);
  return g_test_run ();
}
