/* SPDX-License-Identifier: MIT
 *
 * executor/backends/cpu.c: the cpu backend (executor/backends/cpu.h).  The
 * driver issues each stream's ops in program order; here each stream is a
 * worker thread with a queue of tasks (wait for an event, alloc, free, an
 * op, record an event), so the streams run concurrently as the program's
 * events allow.  Tensors live in program buffers: the buffers say which
 * units, layer and micro-batch they hold, the units' flat layouts say
 * where each tensor is.
 */
#include "executor/backends/cpu.h"

#include <math.h>
#include <string.h>

#include "executor/arena.h"
#include "executor/trace.h"
#include "offload/adam.h"

/* ---- the model's runtime config ----------------------------------------- */

gboolean
stow_llama_config_from_model (const StowModel *m, StowLlamaConfig *c,
                              GError **error)
{
  memset (c, 0, sizeof *c);
  const char *fam = m->family ? m->family : "?";
  if (!g_str_equal (fam, "llama") && !g_str_equal (fam, "mistral")
      && !g_str_equal (fam, "qwen2"))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: model_type \"%s\": the executor runs LLaMA-family "
                   "decoders (llama, mistral, qwen2)",
                   m->name, fam);
      return FALSE;
    }
  if (m->n_experts > 0 || !m->gated_mlp || m->norm != STOW_NORM_RMSNORM
      || m->n_encoder_layers > 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: mixture-of-experts and other variants of %s are not "
                   "run by the executor",
                   m->name, fam);
      return FALSE;
    }
  if (g_strcmp0 (m->hidden_act, "silu") != 0)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: hidden_act \"%s\": the executor runs silu (SwiGLU)",
                   m->name, m->hidden_act ? m->hidden_act : "");
      return FALSE;
    }
  if (m->rope_type != NULL && !g_str_equal (m->rope_type, "default")
      && !g_str_equal (m->rope_type, "llama3"))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: rope_scaling.rope_type \"%s\": the executor runs "
                   "default and llama3 rotary embeddings",
                   m->name, m->rope_type);
      return FALSE;
    }
  c->hidden = m->hidden;
  c->n_layers = m->n_layers;
  c->n_heads = m->n_heads;
  c->n_kv_heads = m->n_kv_heads;
  c->head_dim = m->head_dim;
  c->ffn = m->ffn;
  c->vocab = m->vocab;
  c->rope_theta = m->rope_theta;
  c->rms_norm_eps = m->norm_eps;
  if (g_strcmp0 (m->rope_type, "llama3") == 0)
    {
      c->rope_factor = m->rope_factor;
      c->rope_low_freq_factor = m->rope_low_freq_factor;
      c->rope_high_freq_factor = m->rope_high_freq_factor;
      c->rope_original_max_positions = m->rope_original_max_positions;
    }
  c->qkv_bias = m->qkv_bias;
  c->o_bias = m->o_bias;
  c->mlp_bias = m->mlp_bias;
  c->tied = m->tied_embeddings;
  return TRUE;
}

/* ---- the backend ---------------------------------------------------------- */

typedef enum
{
  TASK_WAIT,
  TASK_RECORD,
  TASK_ALLOC,
  TASK_FREE,
  TASK_OP,
  TASK_FENCE,
  TASK_STOP,
} TaskKind;

typedef struct
{
  TaskKind kind;
  guint index; /* event, buffer or op */
  guint op;    /* alloc/free: the op; STOW_NONE for persistent buffers */
} Task;

typedef struct _CpuBackend CpuBackend;

typedef struct
{
  CpuBackend *b;
  StowStream stream;
  GThread *thread;
  GAsyncQueue *queue;
} Worker;

/* The slots of a layer's weights, in StowLlamaLayerWeights order. */
static const char *const layer_names[] = {
  "input_layernorm.weight",          "self_attn.q_proj.weight",
  "self_attn.k_proj.weight",         "self_attn.v_proj.weight",
  "self_attn.o_proj.weight",         "self_attn.q_proj.bias",
  "self_attn.k_proj.bias",           "self_attn.v_proj.bias",
  "self_attn.o_proj.bias",           "post_attention_layernorm.weight",
  "mlp.gate_proj.weight",            "mlp.up_proj.weight",
  "mlp.down_proj.weight",            "mlp.gate_proj.bias",
  "mlp.up_proj.bias",                "mlp.down_proj.bias",
};
#define N_LAYER_SLOTS G_N_ELEMENTS (layer_names)

struct _CpuBackend
{
  StowBackend parent;
  const StowProgram *p;
  StowModel *model;
  StowLlama *llama;
  StowAdam *adam;
  StowArena *arena;
  StowCpuDataFn data;
  gpointer data_user;
  guint copy_delay_us;
  guint64 n_tokens; /* per micro-batch: B T */
  guint64 chunk;    /* the fused loss's tokens per chunk */
  gsize esize;      /* bytes of a weight / activation element */
  StowFloatType ftype;
  /* per unit of a layer: element offsets of its tensors within the unit
   * in StowLlamaLayerWeights order, G_MAXUINT64 when absent */
  guint64 *slot_offset; /* [unit * N_LAYER_SLOTS + slot] */
  guint64 *head_norm, *head_lm; /* offsets in the head unit */
  guint emb_unit, head_unit;
  /* buffers */
  guint n_buffers;
  void **addr;          /* [buffer] while allocated */
  guint *act_of;        /* [layer * m + mb]: ACTIVATIONS or CHECKPOINT */
  guint *input_of;      /* [mb] */
  guint weights_buf, grads_buf, master_buf, states_buf;
  /* streams */
  Worker workers[STOW_N_STREAMS];
  GMutex lock;
  GCond cond;
  gboolean *recorded; /* [event] */
  guint fences;
  GError *error; /* the first failure */
  /* timing */
  gint64 t0_us;
  double *op_start, *op_end;
  /* the step */
  guint64 step;
  double loss_sum; /* sum of token losses, scaled at the end */
  double grad_norm, clip_coef, lr;
  gboolean skip;
};

static double
now_s (CpuBackend *b)
{
  return (double)(g_get_monotonic_time () - b->t0_us) / 1e6;
}

static void
fail (CpuBackend *b, GError *e)
{
  g_mutex_lock (&b->lock);
  if (b->error == NULL)
    b->error = e;
  else
    g_error_free (e);
  g_cond_broadcast (&b->cond);
  g_mutex_unlock (&b->lock);
}

static gboolean
failed (CpuBackend *b)
{
  g_mutex_lock (&b->lock);
  gboolean f = b->error != NULL;
  g_mutex_unlock (&b->lock);
  return f;
}

static const StowBuffer *
buf_of (CpuBackend *b, guint i)
{
  return &g_array_index (b->p->buffers, StowBuffer, i);
}

static const StowUnit *
unit_of (CpuBackend *b, guint u)
{
  return &g_array_index (b->p->units, StowUnit, u);
}

/* Bytes per element of what a persistent buffer of @kind holds. */
static gsize
kind_elem (CpuBackend *b, StowBufferKind kind)
{
  switch (kind)
    {
    case STOW_BUF_WEIGHTS:
      return stow_dtype_size (b->p->weight_dtype);
    case STOW_BUF_GRADS:
      return stow_dtype_size (b->p->grad_dtype);
    case STOW_BUF_MASTER:
      return 4;
    case STOW_BUF_OPT_STATES:
      return 8; /* m and v */
    default:
      return 0;
    }
}

/* Where @unit starts in persistent buffer @bi (holding a run of units). */
static guint8 *
unit_ptr (CpuBackend *b, guint bi, guint unit)
{
  const StowBuffer *buf = buf_of (b, bi);
  g_assert (buf->unit_first != STOW_NONE && unit >= buf->unit_first
            && unit < buf->unit_first + buf->n_units);
  guint64 off = unit_of (b, unit)->offset - unit_of (b, buf->unit_first)->offset;
  return (guint8 *)b->addr[bi] + off * kind_elem (b, buf->kind);
}

static void
layer_tensors (CpuBackend *b, guint8 *base, guint unit, gsize elem,
               StowLlamaLayerWeights *w)
{
  void **slots = (void **)w;
  memset (w, 0, sizeof *w);
  for (guint s = 0; s < N_LAYER_SLOTS; s++)
    {
      guint64 off = b->slot_offset[unit * N_LAYER_SLOTS + s];
      if (off != G_MAXUINT64)
        slots[s] = base + off * elem;
    }
}

/* ---- checks and layout ---------------------------------------------------- */

static gboolean
check_size (const StowBuffer *buf, guint64 need, GError **error)
{
  if (buf->bytes >= need)
    return TRUE;
  g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_INVALID,
               "program buffer \"%s\" has %" G_GUINT64_FORMAT
               " B; the cpu backend keeps %" G_GUINT64_FORMAT " B there",
               buf->name, buf->bytes, need);
  return FALSE;
}

static guint64
units_numel (CpuBackend *b, const StowBuffer *buf)
{
  guint64 n = 0;
  for (guint u = buf->unit_first; u < buf->unit_first + buf->n_units; u++)
    n += unit_of (b, u)->numel;
  return n;
}

/* Indexes the program's buffers and checks each holds what the runtime
 * puts there: the memory model's sizes against the runtime's. */
static gboolean
index_buffers (CpuBackend *b, GError **error)
{
  const StowProgram *p = b->p;
  guint m = (guint)p->grad_accum;
  guint64 n = b->n_tokens;
  guint64 h = b->model->hidden;
  guint64 x_bytes = n * h * b->esize;
  guint L = (guint)b->model->n_layers;
  b->act_of = g_new (guint, (gsize)L * m);
  b->input_of = g_new (guint, m);
  for (guint i = 0; i < L * m; i++)
    b->act_of[i] = STOW_NONE;
  for (guint i = 0; i < m; i++)
    b->input_of[i] = STOW_NONE;
  b->weights_buf = b->grads_buf = b->master_buf = b->states_buf = STOW_NONE;
  guint64 saved = stow_llama_saved_bytes (b->llama, n);
  guint64 out = stow_llama_out_bytes (b->llama, n);
  for (guint i = 0; i < p->buffers->len; i++)
    {
      const StowBuffer *buf = buf_of (b, i);
      if (buf->rank != 0)
        continue;
      gboolean ok = TRUE;
      switch (buf->kind)
        {
        case STOW_BUF_WEIGHTS:
        case STOW_BUF_GRADS:
        case STOW_BUF_MASTER:
        case STOW_BUF_OPT_STATES:
          if (!buf->persistent || buf->tier != STOW_TIER_DEVICE)
            break;
          if (buf->unit_first != 0 || buf->n_units != p->units->len)
            {
              g_set_error (error, STOW_BACKEND_ERROR,
                           STOW_BACKEND_ERROR_UNSUPPORTED,
                           "program buffer \"%s\": the cpu backend runs one "
                           "device holding every unit",
                           buf->name);
              return FALSE;
            }
          if (buf->kind == STOW_BUF_MASTER && !p->master_weights)
            break;
          ok = check_size (buf, units_numel (b, buf) * kind_elem (b, buf->kind),
                           error);
          if (buf->kind == STOW_BUF_WEIGHTS)
            b->weights_buf = i;
          else if (buf->kind == STOW_BUF_GRADS)
            b->grads_buf = i;
          else if (buf->kind == STOW_BUF_MASTER)
            b->master_buf = i;
          else
            b->states_buf = i;
          break;
        case STOW_BUF_INPUT:
          ok = check_size (buf, 8 * n + x_bytes, error);
          if (buf->micro_batch < m)
            b->input_of[buf->micro_batch] = i;
          break;
        case STOW_BUF_ACTIVATIONS:
        case STOW_BUF_CHECKPOINT:
          ok = check_size (buf, buf->kind == STOW_BUF_ACTIVATIONS ? saved : out,
                           error);
          if (buf->layer >= 0 && (guint)buf->layer < L && buf->micro_batch < m)
            b->act_of[buf->layer * m + buf->micro_batch] = i;
          break;
        case STOW_BUF_RECOMPUTED:
          ok = check_size (buf, saved - out, error);
          break;
        case STOW_BUF_WORKSPACE:
          ok = check_size (buf, stow_llama_backward_ws_bytes (b->llama, n),
                           error);
          break;
        case STOW_BUF_LOGITS:
          ok = check_size (buf,
                           4 * stow_llama_loss_scratch_floats (
                                   b->model->vocab, h, b->chunk),
                           error);
          break;
        default:
          break;
        }
      if (!ok)
        return FALSE;
    }
  if (b->weights_buf == STOW_NONE || b->grads_buf == STOW_NONE
      || b->states_buf == STOW_NONE
      || (p->master_weights && b->master_buf == STOW_NONE))
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs layouts that keep the weights, "
                   "gradients and optimizer states on the device (%s)",
                   p->description ? p->description : "this program");
      return FALSE;
    }
  return TRUE;
}

/* Element offsets of each layer's tensors and of the head's. */
static gboolean
index_units (CpuBackend *b, GError **error)
{
  const StowProgram *p = b->p;
  b->slot_offset = g_new (guint64, (gsize)p->units->len * N_LAYER_SLOTS);
  for (gsize i = 0; i < (gsize)p->units->len * N_LAYER_SLOTS; i++)
    b->slot_offset[i] = G_MAXUINT64;
  b->emb_unit = stow_program_unit_of_layer (p, STOW_LAYER_EMBEDDING);
  b->head_unit = stow_program_unit_of_layer (p, STOW_LAYER_HEAD);
  for (guint u = 0; u < p->units->len; u++)
    {
      const StowUnit *unit = unit_of (b, u);
      if (unit->layer < 0)
        continue;
      g_autofree char *prefix
          = g_strdup_printf ("model.layers.%d.", unit->layer);
      for (guint k = 0; k < unit->n_tensors; k++)
        {
          const StowUnitTensor *t = &g_array_index (
              p->unit_tensors, StowUnitTensor, unit->first_tensor + k);
          gboolean known = FALSE;
          if (g_str_has_prefix (t->name, prefix))
            for (guint s = 0; s < N_LAYER_SLOTS; s++)
              if (g_str_equal (t->name + strlen (prefix), layer_names[s]))
                {
                  b->slot_offset[u * N_LAYER_SLOTS + s] = t->offset;
                  known = TRUE;
                }
          if (!known)
            {
              g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                           "%s: tensor %s is not one the runtime runs",
                           b->model->name, t->name);
              return FALSE;
            }
        }
    }
  const StowUnitTensor *norm
      = stow_program_unit_tensor (p, b->head_unit, "model.norm.weight");
  const StowUnitTensor *lm
      = stow_program_unit_tensor (p, b->head_unit, "lm_head.weight");
  if (norm == NULL || (lm == NULL && !b->model->tied_embeddings))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "%s: the output layer needs model.norm.weight and "
                   "lm_head.weight (or tied embeddings)",
                   b->model->name);
      return FALSE;
    }
  b->head_norm = g_new (guint64, 1);
  *b->head_norm = norm->offset;
  b->head_lm = g_new (guint64, 1);
  *b->head_lm = lm ? lm->offset : G_MAXUINT64;
  return TRUE;
}

/* ---- the ops ---------------------------------------------------------------- */

/* The output of layer @layer for micro-batch @mb (the next layer's
 * input); for layer -1 the embedding's. */
static guint8 *
layer_output (CpuBackend *b, gint layer, guint mb)
{
  guint m = (guint)b->p->grad_accum;
  if (layer < 0)
    return (guint8 *)b->addr[b->input_of[mb]] + 8 * b->n_tokens;
  guint bi = b->act_of[layer * m + mb];
  const StowBuffer *buf = buf_of (b, bi);
  guint8 *base = b->addr[bi];
  if (buf->kind == STOW_BUF_CHECKPOINT)
    return base;
  return base + stow_llama_saved_bytes (b->llama, b->n_tokens)
         - stow_llama_out_bytes (b->llama, b->n_tokens);
}

/* A buffer of @kind among the op's reads (or writes), or STOW_NONE. */
static guint
io_of (const StowOp *op, gboolean writes, StowBufferKind kind, CpuBackend *b)
{
  const guint *io = writes ? op->writes : op->reads;
  guint n = writes ? op->n_writes : op->n_reads;
  for (guint i = 0; i < n; i++)
    if (buf_of (b, io[i])->kind == kind)
      return io[i];
  return STOW_NONE;
}

static void
saved_of (CpuBackend *b, const StowOp *op, gboolean rebuilt,
          StowLlamaSaved *s)
{
  guint m = (guint)b->p->grad_accum;
  guint bi = b->act_of[op->layer * m + op->micro_batch];
  guint8 *base = b->addr[bi];
  if (buf_of (b, bi)->kind == STOW_BUF_ACTIVATIONS)
    {
      stow_llama_saved_carve (b->llama, b->n_tokens, base,
                              base + stow_llama_saved_bytes (b->llama,
                                                             b->n_tokens)
                                  - stow_llama_out_bytes (b->llama,
                                                          b->n_tokens),
                              s);
      return;
    }
  /* Full recompute: the output in the checkpoint, the rest in the
   * rebuilt part (written by the forward's working set, or the
   * recomputation). */
  guint rest = io_of (op, !rebuilt, STOW_BUF_RECOMPUTED, b);
  if (rest == STOW_NONE)
    rest = io_of (op, rebuilt, STOW_BUF_RECOMPUTED, b);
  g_assert (rest != STOW_NONE);
  stow_llama_saved_carve (b->llama, b->n_tokens, b->addr[rest], base, s);
}

static gboolean
run_forward (CpuBackend *b, const StowOp *op, GError **error)
{
  guint8 *w = unit_ptr (b, b->weights_buf, op->unit);
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = b->addr[b->input_of[op->micro_batch]];
      stow_llama_embed_forward (b->llama, w, (gint32 *)in, b->n_tokens,
                                in + 8 * b->n_tokens);
      return TRUE;
    }
  StowLlamaLayerWeights lw;
  layer_tensors (b, w, op->unit, b->esize, &lw);
  StowLlamaSaved s;
  saved_of (b, op, FALSE, &s);
  if (op->kind == STOW_OP_RECOMPUTE)
    s.out = NULL; /* kept in the checkpoint, which now holds its gradient */
  stow_llama_layer_forward (b->llama, b->p->micro_batch, b->p->seq_len, &lw,
                            layer_output (b, op->layer - 1, op->micro_batch),
                            &s);
  return TRUE;
}

static gboolean
run_loss (CpuBackend *b, const StowOp *op, GError **error)
{
  guint64 n = b->n_tokens;
  guint8 *in = b->addr[b->input_of[op->micro_batch]];
  guint8 *head = unit_ptr (b, b->weights_buf, b->head_unit);
  guint8 *dhead = unit_ptr (b, b->grads_buf, b->head_unit);
  gsize ge = stow_dtype_size (b->p->grad_dtype);
  void *lm, *dlm;
  if (*b->head_lm != G_MAXUINT64)
    lm = head + *b->head_lm * b->esize, dlm = dhead + *b->head_lm * ge;
  else
    lm = unit_ptr (b, b->weights_buf, b->emb_unit),
    dlm = unit_ptr (b, b->grads_buf, b->emb_unit);
  guint logits = io_of (op, TRUE, STOW_BUF_LOGITS, b);
  g_assert (logits != STOW_NONE);
  guint8 *x = layer_output (b, (gint)b->model->n_layers - 1, op->micro_batch);
  double sum = stow_llama_head_loss (
      b->llama, n, head + *b->head_norm * b->esize, lm, x,
      (gint32 *)(in + 4 * n), b->p->loss_scale, dhead + *b->head_norm * ge, dlm,
      op->accumulate, x, b->addr[logits], b->chunk);
  b->loss_sum += sum;
  return TRUE;
}

static gboolean
run_backward (CpuBackend *b, const StowOp *op, GError **error)
{
  if (op->layer == STOW_LAYER_EMBEDDING)
    {
      guint8 *in = b->addr[b->input_of[op->micro_batch]];
      stow_llama_embed_backward (b->llama, (gint32 *)in, b->n_tokens,
                                 in + 8 * b->n_tokens,
                                 unit_ptr (b, b->grads_buf, op->unit),
                                 op->accumulate);
      return TRUE;
    }
  StowLlamaLayerWeights lw, lg;
  layer_tensors (b, unit_ptr (b, b->weights_buf, op->unit), op->unit,
                 b->esize, &lw);
  layer_tensors (b, unit_ptr (b, b->grads_buf, op->unit), op->unit,
                 stow_dtype_size (b->p->grad_dtype), &lg);
  StowLlamaSaved s;
  saved_of (b, op, TRUE, &s);
  guint ws = io_of (op, TRUE, STOW_BUF_WORKSPACE, b);
  g_assert (ws != STOW_NONE);
  guint8 *x = layer_output (b, op->layer - 1, op->micro_batch);
  stow_llama_layer_backward (b->llama, b->p->micro_batch, b->p->seq_len, &lw,
                             x, &s, &lg, op->accumulate, b->addr[ws], x);
  return TRUE;
}

static StowFloatType
float_type (StowDtype d)
{
  return d == STOW_DTYPE_F32    ? STOW_FLOAT_F32
         : d == STOW_DTYPE_BF16 ? STOW_FLOAT_BF16
                                : STOW_FLOAT_F16;
}

/* The global L2 norm of every unit's gradients (sums of squares in
 * double, in unit order: the same bits for any thread count), the clip
 * coefficient and whether the step must be skipped. */
static gboolean
run_grad_norm (CpuBackend *b, const StowOp *op, GError **error)
{
  double total = 0;
  StowFloatType gt = float_type (b->p->grad_dtype);
  for (guint u = 0; u < b->p->units->len; u++)
    {
      double s = 0;
      stow_adam_grad_sumsq (b->adam, unit_ptr (b, b->grads_buf, u), gt,
                            unit_of (b, u)->numel, &s);
      total += s;
    }
  b->grad_norm = sqrt (total);
  b->skip = !isfinite (b->grad_norm);
  b->clip_coef = stow_adam_clip_coef (b->grad_norm, b->p->optim.max_grad_norm);
  return TRUE;
}

/* AdamW on one unit, tensor by tensor: weight decay on tensors of two or
 * more dimensions only (the convention nanoGPT and HF's Trainer use). */
static gboolean
run_optim (CpuBackend *b, const StowOp *op, GError **error)
{
  if (!op->on_gpu)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend does not run a host optimizer yet "
                   "(--offload-optimizer)");
      return FALSE;
    }
  if (b->skip)
    return TRUE;
  const StowProgram *p = b->p;
  const StowUnit *u = unit_of (b, op->unit);
  guint8 *w = unit_ptr (b, b->weights_buf, op->unit);
  guint8 *g = unit_ptr (b, b->grads_buf, op->unit);
  float *master = p->master_weights
                      ? (float *)unit_ptr (b, b->master_buf, op->unit)
                      : NULL;
  float *mv = (float *)unit_ptr (b, b->states_buf, op->unit);
  gsize ge = stow_dtype_size (p->grad_dtype);
  StowAdamConfig cfg;
  stow_adam_config_init (&cfg);
  cfg.lr = b->lr;
  cfg.beta1 = p->optim.beta1, cfg.beta2 = p->optim.beta2;
  cfg.eps = p->optim.eps;
  StowAdamStep st = { b->step, 1.0, b->clip_coef, FALSE };
  for (guint k = 0; k < u->n_tensors; k++)
    {
      const StowUnitTensor *t = &g_array_index (p->unit_tensors,
                                                StowUnitTensor,
                                                u->first_tensor + k);
      cfg.weight_decay = t->n_dims >= 2 ? p->optim.weight_decay : 0.0;
      StowAdamTensor at = { 0 };
      at.m = mv + t->offset;
      at.v = mv + u->numel + t->offset;
      at.grad = g + t->offset * ge;
      at.grad_type = float_type (p->grad_dtype);
      at.n = t->numel;
      if (master)
        {
          at.param = master + t->offset;
          at.param_out = w + t->offset * b->esize;
          at.out_type = b->ftype;
        }
      else
        {
          at.param = (float *)(w + t->offset * 4);
          at.out_type = STOW_FLOAT_NONE;
        }
      if (!stow_adam_step (b->adam, &cfg, &st, &at, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
run_op (CpuBackend *b, guint i, GError **error)
{
  const StowOp *op = &g_array_index (b->p->ops, StowOp, i);
  switch (op->kind)
    {
    case STOW_OP_DATA:
      {
        guint8 *in = b->addr[b->input_of[op->micro_batch]];
        guint64 n = b->n_tokens;
        return b->data (b->data_user, b->step, op->micro_batch, (gint32 *)in,
                        (gint32 *)(in + 4 * n), n, error);
      }
    case STOW_OP_FORWARD:
    case STOW_OP_RECOMPUTE:
      return run_forward (b, op, error);
    case STOW_OP_LOSS:
      return run_loss (b, op, error);
    case STOW_OP_BACKWARD:
      return run_backward (b, op, error);
    case STOW_OP_GRAD_NORM:
      return run_grad_norm (b, op, error);
    case STOW_OP_OPTIM_STEP:
      return run_optim (b, op, error);
    default:
      {
        g_autofree char *what = stow_op_describe (b->p, i);
        g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                     "op %s: the cpu backend does not run %s ops yet "
                     "(offloaded and multi-device layouts)",
                     what, stow_op_kind_name (op->kind));
        return FALSE;
      }
    }
}

/* ---- buffers ------------------------------------------------------------- */

static gboolean
alloc_buffer (CpuBackend *b, guint bi, GError **error)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->addr[bi] != NULL)
    return TRUE; /* persistent, from an earlier step */
  if (buf->slot >= 0 && buf->bytes == 0)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "\"%s\": the cpu backend does not run rotating slots yet "
                   "(streamed layers, gradient slots)",
                   buf->name);
      return FALSE;
    }
  if (buf->tier != STOW_TIER_DEVICE)
    {
      /* Host tiers: plain memory, not counted against the device. */
      b->addr[bi] = g_try_malloc0 (MAX (buf->bytes, 1));
      if (b->addr[bi] == NULL)
        {
          g_set_error (error, STOW_BACKEND_ERROR,
                       STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                       "%s \"%s\" (%" G_GUINT64_FORMAT " B): out of host memory",
                       stow_tier_name (buf->tier), buf->name, buf->bytes);
          return FALSE;
        }
      return TRUE;
    }
  g_mutex_lock (&b->lock);
  gboolean frag = FALSE;
  void *p = stow_arena_alloc (b->arena, buf->bytes, &frag);
  guint64 in_use = stow_arena_in_use (b->arena);
  g_mutex_unlock (&b->lock);
  if (p == NULL)
    {
      g_autofree char *need = g_format_size_full (buf->bytes, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *used = g_format_size_full (in_use, G_FORMAT_SIZE_IEC_UNITS);
      g_autofree char *cap = g_format_size_full (stow_arena_capacity (b->arena),
                                                 G_FORMAT_SIZE_IEC_UNITS);
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_OUT_OF_MEMORY,
                   "device memory: \"%s\" (%s) does not fit%s: %s in use of "
                   "%s (--device-memory)",
                   buf->name, need,
                   frag ? " in one free run (fragmented)" : "", used, cap);
      return FALSE;
    }
  b->addr[bi] = p;
  return TRUE;
}

static void
free_buffer (CpuBackend *b, guint bi)
{
  const StowBuffer *buf = buf_of (b, bi);
  if (b->addr[bi] == NULL)
    return;
  if (buf->tier != STOW_TIER_DEVICE)
    g_free (b->addr[bi]);
  else
    {
      g_mutex_lock (&b->lock);
      stow_arena_release (b->arena, b->addr[bi]);
      g_mutex_unlock (&b->lock);
    }
  b->addr[bi] = NULL;
}

/* ---- workers -------------------------------------------------------------- */

static void
push (CpuBackend *b, StowStream s, TaskKind kind, guint index, guint op)
{
  Task *t = g_new (Task, 1);
  t->kind = kind, t->index = index, t->op = op;
  g_async_queue_push (b->workers[s].queue, t);
}

static gpointer
worker_main (gpointer data)
{
  Worker *w = data;
  CpuBackend *b = w->b;
  for (;;)
    {
      g_autofree Task *t = g_async_queue_pop (w->queue);
      if (t->kind == TASK_STOP)
        break;
      switch (t->kind)
        {
        case TASK_WAIT:
          g_mutex_lock (&b->lock);
          while (!b->recorded[t->index] && b->error == NULL)
            g_cond_wait (&b->cond, &b->lock);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_RECORD:
          g_mutex_lock (&b->lock);
          b->recorded[t->index] = TRUE;
          g_cond_broadcast (&b->cond);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_FENCE:
          g_mutex_lock (&b->lock);
          b->fences++;
          g_cond_broadcast (&b->cond);
          g_mutex_unlock (&b->lock);
          break;
        case TASK_ALLOC:
        case TASK_FREE:
        case TASK_OP:
          {
            if (failed (b))
              break;
            double t0 = now_s (b);
            GError *e = NULL;
            gboolean ok = TRUE;
            if (t->kind == TASK_ALLOC)
              ok = alloc_buffer (b, t->index, &e);
            else if (t->kind == TASK_FREE)
              free_buffer (b, t->index);
            else
              {
                const StowOp *op = &g_array_index (b->p->ops, StowOp, t->index);
                if (op->kind == STOW_OP_COPY && b->copy_delay_us)
                  g_usleep (b->copy_delay_us);
                ok = run_op (b, t->index, &e);
              }
            if (!ok)
              {
                guint at = t->kind == TASK_OP ? t->index : t->op;
                if (at != STOW_NONE)
                  {
                    g_autofree char *what = stow_op_describe (b->p, at);
                    g_prefix_error (&e, "op %s: ", what);
                  }
                fail (b, e);
              }
            guint at = t->kind == TASK_OP ? t->index : t->op;
            if (at != STOW_NONE)
              {
                b->op_start[at] = t0;
                b->op_end[at] = now_s (b);
              }
          }
          break;
        case TASK_STOP:
          break;
        }
    }
  return NULL;
}

/* ---- the table ------------------------------------------------------------ */

static void
cpu_event_wait (StowBackend *bb, guint rank, StowStream s, guint event)
{
  push ((CpuBackend *)bb, s, TASK_WAIT, event, STOW_NONE);
}

static gboolean
cpu_buffer_alloc (StowBackend *bb, const StowProgram *p, guint buffer, guint op,
                  GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (op == STOW_NONE)
    return alloc_buffer (b, buffer, error); /* persistent: now */
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  push (b, o->stream, TASK_ALLOC, buffer, op);
  return TRUE;
}

static void
cpu_buffer_free (StowBackend *bb, const StowProgram *p, guint buffer, guint op)
{
  CpuBackend *b = (CpuBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  push (b, o->stream, TASK_FREE, buffer, op);
}

static gboolean
cpu_issue (StowBackend *bb, const StowProgram *p, guint op, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  const StowOp *o = &g_array_index (p->ops, StowOp, op);
  if (o->rank != 0)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs one rank; the program has %u",
                   p->n_ranks);
      return FALSE;
    }
  push (b, o->stream, TASK_OP, op, op);
  return TRUE;
}

static void
cpu_event_record (StowBackend *bb, guint rank, StowStream s, guint event,
                  guint op)
{
  push ((CpuBackend *)bb, s, TASK_RECORD, event, op);
}

static gboolean
cpu_synchronize (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  g_mutex_lock (&b->lock);
  b->fences = 0;
  g_mutex_unlock (&b->lock);
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    push (b, s, TASK_FENCE, 0, STOW_NONE);
  g_mutex_lock (&b->lock);
  while (b->fences < STOW_N_STREAMS)
    g_cond_wait (&b->cond, &b->lock);
  GError *e = b->error;
  b->error = NULL;
  g_mutex_unlock (&b->lock);
  if (e != NULL)
    {
      g_propagate_error (error, e);
      return FALSE;
    }
  return TRUE;
}

static double
cpu_now (StowBackend *bb)
{
  return now_s ((CpuBackend *)bb);
}

static void
cpu_op_times (StowBackend *bb, guint op, double *start, double *end)
{
  CpuBackend *b = (CpuBackend *)bb;
  *start = b->op_start[op];
  *end = MAX (b->op_end[op], b->op_start[op]);
}

static void
cpu_fill_memory (StowBackend *bb, const StowProgram *p, StowTrace *t)
{
  CpuBackend *b = (CpuBackend *)bb;
  t->peak_bytes[STOW_TIER_DEVICE] = stow_arena_peak (b->arena);
}

static void
cpu_destroy (StowBackend *bb)
{
  CpuBackend *b = (CpuBackend *)bb;
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    if (b->workers[s].thread)
      {
        push (b, s, TASK_STOP, 0, STOW_NONE);
        g_thread_join (b->workers[s].thread);
        g_async_queue_unref (b->workers[s].queue);
      }
  for (guint i = 0; b->addr && i < b->n_buffers; i++)
    if (b->addr[i] && buf_of (b, i)->tier != STOW_TIER_DEVICE)
      g_free (b->addr[i]);
  g_free (b->addr);
  g_free (b->act_of);
  g_free (b->input_of);
  g_free (b->slot_offset);
  g_free (b->head_norm);
  g_free (b->head_lm);
  g_free (b->recorded);
  g_free (b->op_start);
  g_free (b->op_end);
  if (b->error)
    g_error_free (b->error);
  if (b->arena)
    stow_arena_free (b->arena);
  if (b->adam)
    stow_adam_free (b->adam);
  if (b->llama)
    stow_llama_free (b->llama);
  if (b->model)
    stow_model_unref (b->model);
  g_mutex_clear (&b->lock);
  g_cond_clear (&b->cond);
  g_free (b);
}

static const StowBackendVtable cpu_vtable = {
  .name = "cpu",
  .virtual_time = FALSE,
  .event_wait = cpu_event_wait,
  .buffer_alloc = cpu_buffer_alloc,
  .buffer_free = cpu_buffer_free,
  .issue = cpu_issue,
  .event_record = cpu_event_record,
  .synchronize = cpu_synchronize,
  .now = cpu_now,
  .op_times = cpu_op_times,
  .fill_memory = cpu_fill_memory,
  .destroy = cpu_destroy,
};

StowBackend *
stow_backend_cpu_new (const StowCpuSetup *setup, GError **error)
{
  g_return_val_if_fail (setup != NULL && setup->program != NULL
                            && setup->model != NULL && setup->data != NULL,
                        NULL);
  const StowProgram *p = setup->program;
  if (p->n_ranks != 1)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "the cpu backend runs one device; the layout has %u "
                   "pipeline stages",
                   p->n_ranks);
      return NULL;
    }
  if (p->weight_dtype == STOW_DTYPE_F16)
    {
      g_set_error (error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
                   "--precision fp16: the cpu backend runs fp32 and bf16");
      return NULL;
    }
  StowLlamaConfig cfg;
  if (!stow_llama_config_from_model (setup->model, &cfg, error))
    return NULL;
  CpuBackend *b = g_new0 (CpuBackend, 1);
  b->parent.vt = &cpu_vtable;
  g_mutex_init (&b->lock);
  g_cond_init (&b->cond);
  b->p = p;
  b->model = stow_model_ref ((StowModel *)setup->model);
  b->data = setup->data;
  b->data_user = setup->data_user;
  b->copy_delay_us = setup->copy_delay_us;
  b->ftype = float_type (p->weight_dtype);
  b->esize = stow_dtype_size (p->weight_dtype);
  b->n_tokens = p->micro_batch * p->seq_len;
  b->chunk = stow_llama_loss_chunk_tokens (cfg.vocab, cfg.hidden, b->n_tokens);
  b->n_buffers = p->buffers->len;
  b->addr = g_new0 (void *, MAX (b->n_buffers, 1));
  b->recorded = g_new0 (gboolean, MAX (p->events->len, 1));
  b->op_start = g_new0 (double, MAX (p->ops->len, 1));
  b->op_end = g_new0 (double, MAX (p->ops->len, 1));
  b->t0_us = g_get_monotonic_time ();
  b->llama = stow_llama_new (&cfg, b->ftype, p->seq_len, setup->n_threads,
                             error);
  if (b->llama == NULL || !index_units (b, error) || !index_buffers (b, error))
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  b->adam = stow_adam_new (setup->n_threads, STOW_ISA_AUTO, error);
  if (b->adam == NULL)
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  b->arena = stow_arena_new (setup->device_capacity_bytes, error);
  if (b->arena == NULL)
    {
      cpu_destroy (&b->parent);
      return NULL;
    }
  for (guint s = 0; s < STOW_N_STREAMS; s++)
    {
      Worker *w = &b->workers[s];
      w->b = b;
      w->stream = s;
      w->queue = g_async_queue_new ();
      g_autofree char *name = g_strdup_printf ("stow-%s", stow_stream_name (s));
      w->thread = g_thread_new (name, worker_main, w);
    }
  return &b->parent;
}

gboolean
stow_backend_cpu_alloc_persistent (StowBackend *bb, GError **error)
{
  CpuBackend *b = (CpuBackend *)bb;
  for (guint i = 0; i < b->n_buffers; i++)
    if (buf_of (b, i)->persistent && !alloc_buffer (b, i, error))
      return FALSE;
  return TRUE;
}

void
stow_backend_cpu_begin_step (StowBackend *bb, guint64 step)
{
  CpuBackend *b = (CpuBackend *)bb;
  b->step = step;
  b->loss_sum = 0;
  b->grad_norm = NAN;
  b->clip_coef = 1.0;
  b->skip = FALSE;
  b->lr = stow_optim_lr_at (&b->p->optim, step);
  memset (b->recorded, 0, sizeof (gboolean) * MAX (b->p->events->len, 1));
  memset (b->op_start, 0, sizeof (double) * MAX (b->p->ops->len, 1));
  memset (b->op_end, 0, sizeof (double) * MAX (b->p->ops->len, 1));
}

void
stow_backend_cpu_step_stats (StowBackend *bb, StowCpuStepStats *out)
{
  CpuBackend *b = (CpuBackend *)bb;
  out->loss = b->loss_sum * b->p->loss_scale;
  out->grad_norm = b->grad_norm;
  out->skipped = b->skip;
  out->lr = b->lr;
}

guint64
stow_backend_cpu_peak_bytes (StowBackend *bb)
{
  return stow_arena_peak (((CpuBackend *)bb)->arena);
}

void
stow_backend_cpu_reset_peak (StowBackend *bb)
{
  stow_arena_reset_peak (((CpuBackend *)bb)->arena);
}

void *
stow_backend_cpu_weights (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  return b->addr[b->weights_buf] ? unit_ptr (b, b->weights_buf, unit) : NULL;
}

float *
stow_backend_cpu_master (StowBackend *bb, guint unit)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (!b->p->master_weights || b->addr[b->master_buf] == NULL)
    return NULL;
  return (float *)unit_ptr (b, b->master_buf, unit);
}

float *
stow_backend_cpu_moment (StowBackend *bb, guint unit, guint which)
{
  CpuBackend *b = (CpuBackend *)bb;
  if (b->addr[b->states_buf] == NULL)
    return NULL;
  float *mv = (float *)unit_ptr (b, b->states_buf, unit);
  return which == 0 ? mv : mv + unit_of (b, unit)->numel;
}
