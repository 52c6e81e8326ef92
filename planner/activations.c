/* SPDX-License-Identifier: MIT
 *
 * planner/activations.c: what one layer keeps for backward, counted from
 * the model's own shapes for each engine, precision and recompute mode,
 * and the ends of a micro-batch (input ids, logits, the loss's gradient).
 * planner/memory.c charges these per stage and micro-batch in flight; the
 * step program (schedule.c) and the time model (cost.c) read the same
 * counts.  The sources of every count are in docs/memory-model.md.
 */
#include <math.h>

#include "planner/memory-private.h"
#include "planner/plan.h"

/* Bytes one GPU keeps for backward for one layer and one micro-batch, when
 * nothing is recomputed.  Korthikanti et al. 2022 count 34 sbh + 5 a s^2 b
 * for a GPT layer (11 sbh attention, 19 sbh MLP, 4 sbh two LayerNorm
 * inputs); here each saved tensor is counted from the model's own shapes so
 * GQA (fewer K/V heads), gated MLPs (gate, up and their product: 6 s b f),
 * explicit head_dim and flash attention (no s^2 term, an fp32 logsumexp)
 * come out right.  Tensor parallelism splits what is inside the attention
 * and MLP blocks; sequence parallelism also splits the LayerNorm inputs,
 * the linear inputs and the dropout masks (Table 2).  Context parallelism
 * splits the sequence. */
/* Bytes of one activation element: training in fp32 keeps fp32
 * activations; mixed precision and fp8 GEMMs keep 16-bit ones. */
static double
activation_bytes (const StowTraining *t)
{
  return t->precision == STOW_PRECISION_FP32 ? 4.0 : 2.0;
}

/* 16-bit compute over fp32 weights that are themselves the master copy
 * (FSDP's and autocast's mixed precision keep no separate one): every
 * precision but fp32 and pure bf16. */
gboolean
stow_mem_mixed_over_fp32 (const StowTraining *t)
{
  return t->precision != STOW_PRECISION_FP32
         && t->precision != STOW_PRECISION_BF16_PURE;
}

/* torch.autocast over fp32 weights: the pytorch engine in mixed precision
 * (the HF Trainer's fp16 and bf16 flags, accelerate).  The residual stream,
 * which the norms read, stays fp32; each linear casts its input to 16 bits
 * and keeps that copy for backward; softmax runs in fp32. */
gboolean
stow_mem_autocast (const StowTraining *t, const StowLayout *l)
{
  return l->engine == STOW_ENGINE_PYTORCH && stow_mem_mixed_over_fp32 (t);
}

/* Bytes per element of the residual stream: a layer's input (the full-
 * recompute checkpoint), the norms' inputs, the embedding output and the
 * gradient the loss hands the last layer. */
double
stow_mem_residual_bytes (const StowTraining *t, const StowLayout *l)
{
  return stow_mem_autocast (t, l) ? 4.0 : activation_bytes (t);
}

/* Logits of one micro-batch, per element: the output layer's logits (e B),
 * the fp32 copy the cross-entropy takes and its gradient (4 + 4 B).  A
 * chunked loss (torchtune's compiled chunked cross-entropy) fuses the
 * upcast into the loss and runs its backward a chunk of eight at a time:
 * the logits plus one chunk's gradient.
 *
 * Megatron-core's vocab-parallel cross-entropy (fused or not) works in
 * place: its forward takes one fp32 copy of the logits, exponentiates it
 * in place and saves it as the softmax; its backward turns that softmax
 * into the gradient in place and hands back an e-byte copy (Megatron-LM
 * core_r0.8.0, megatron/core/tensor_parallel/cross_entropy.py:
 * calculate_logits_max's .float(), torch.exp (out=exp_logits),
 * grad_input = softmax; megatron/core/fusions/fused_cross_entropy.py,
 * NeMo 24.07's cross_entropy_loss_fusion).  Either pass holds e + 4 B a
 * logit at its peak.  The in-place subtraction came with core_r0.8.0
 * (Megatron-LM 9634c0e4a3, June 2024; NeMo 2.0.0rc1's pin 338af51 has it).
 * fp32 runs keep the general count: the one measured fp32 Megatron run
 * (bigcode's 2023 fork, test-memory's /memory/calibration/bigcode-gpt)
 * predates it, and no fp32 run of core_r0.8.0 is at hand to check its
 * 4 B (where .float() returns the logits themselves).
 *
 * A fused loss (--fused-loss: flash-attn's CrossEntropyLoss, llm-foundry's
 * default loss_fn "fused_crossentropy" for MPT, ComposerMPTCausalLM in
 * llmfoundry/models/mpt/modeling_mpt.py) reads the e-byte logits in one
 * kernel that keeps them and the per-token log-sum-exp, and its backward
 * writes an e-byte gradient (xentropy_cuda_lib's forward and backward,
 * inplace_backward off): e + e B a logit at its peak, no fp32 copy. */
double
stow_mem_logits_element_bytes (const StowTraining *t, const StowLayout *l)
{
  double e = activation_bytes (t);
  if (t->chunked_loss)
    return e * (1.0 + 1.0 / 8.0);
  if (t->fused_loss)
    return 2.0 * e;
  if (stow_engine_is_mcore (l->engine) && e < 4.0)
    return e + 4.0;
  return e + 8.0;
}

/* The stowage engine's output layer and cross-entropy run fused, a chunk
 * of tokens at a time (executor/llama.h), unless --chunked-loss asks for
 * torchtune's chunked loss. */
gboolean
stow_mem_fused_head_loss (const StowTraining *t, const StowLayout *l)
{
  return l->engine == STOW_ENGINE_STOWAGE && !t->chunked_loss;
}

StowLayerKind
stow_mem_layer_kind (const StowModel *m, guint64 i)
{
  if (m->layers[i].is_moe)
    return STOW_LAYER_MOE;
  if (m->n_encoder_layers > 0 && m->layers[i].is_decoder)
    return STOW_LAYER_CROSS;
  return STOW_LAYER_DENSE;
}

/* Tokens per sequence the decoder and the loss see: --decoder-seq for an
 * encoder-decoder model, else the sequence length. */
guint64
stow_mem_decoder_seq (const StowModel *m, const StowTraining *t)
{
  return m->n_encoder_layers > 0 && t->decoder_seq_len ? t->decoder_seq_len
                                                       : t->seq_len;
}

/* Whether the layers run as eager PyTorch modules (HF transformers,
 * torchtune), which keep more than fused kernels do: the engines that run
 * those modules, unless torch.compile fuses their elementwise ops. */
static gboolean
eager_modules (const StowTraining *t, const StowLayout *l)
{
  return !t->compiled
         && (l->engine == STOW_ENGINE_PYTORCH
             || l->engine == STOW_ENGINE_DEEPSPEED
             || l->engine == STOW_ENGINE_FSDP);
}

/* Whether the layers are Transformer Engine modules running fp8 GEMMs:
 * Megatron-core's TE layer spec (Megatron-LM core_r0.8.0 defaults to
 * --transformer-impl transformer_engine; NeMo 24.07's recipes set
 * transformer_engine: true) under --precision fp8, full fine-tuning. */
gboolean
stow_mem_te_fp8_layers (const StowTraining *t, const StowLayout *l)
{
  return stow_engine_is_mcore (l->engine) && t->precision == STOW_PRECISION_FP8
         && t->finetune == STOW_FINETUNE_FULL;
}

/* Rotary embeddings on q and k: decoder-only models without learned
 * positions, but not those without rotary embeddings (BLOOM's and MPT's
 * ALiBi) nor MLA, whose rotary part is small. */
static gboolean
has_rope (const StowModel *m)
{
  return m->max_positions == 0 && m->n_encoder_layers == 0 && !m->rope_free
         && m->qk_rope_head_dim == 0;
}

/* Whether LoRA's frozen linears keep no input: autograd saves a linear's
 * input only for its weight's gradient, which a frozen weight does not
 * want.  DeepSpeed ZeRO-3 runs every linear through its own autograd
 * function (LinearFunctionForZeroStage3), which saves the input anyway. */
static gboolean
frozen_inputs_dropped (const StowLayout *l)
{
  return l->engine == STOW_ENGINE_PYTORCH || l->engine == STOW_ENGINE_FSDP
         || (l->engine == STOW_ENGINE_DEEPSPEED && l->zero < 3);
}

/* What one input of width @w (elements per token) costs in bytes per token
 * beyond the e w the full fine-tuning count charges, when @n adapters read
 * it.  With lora_dropout each adapter keeps its dropped copy and mask.
 * Otherwise an adapter keeps the input itself, which nothing keeps when
 * no adapter reads it and frozen linears keep no input (@dropped). */
static double
lora_input_delta (const StowTraining *t, gboolean dropped, double e, double w,
                  guint n)
{
  double copies = t->lora_dropout ? (double)n * (e + 1.0) * w : 0.0;
  if (!dropped)
    return copies;
  if (n == 0)
    return -e * w;
  return t->lora_dropout ? copies - e * w : 0.0;
}

static guint
count_bits (guint x)
{
  guint n = 0;
  for (; x; x &= x - 1)
    n++;
  return n;
}

void
stow_mem_layer_activation_parts (const StowModel *m, const StowTraining *t,
                                 const StowLayout *l, StowLayerKind kind,
                                 guint64 *block, guint64 *core)
{
  /* s: the tokens the layer runs on (a decoder layer: the decoder's);
   * s_enc: the encoder's, which cross-attention's keys and values see. */
  double s_enc = (double)t->seq_len / l->cp;
  double s = kind == STOW_LAYER_CROSS
                 ? (double)stow_mem_decoder_seq (m, t) / l->cp
                 : s_enc;
  double b = (double)l->micro_batch;
  double h = (double)m->hidden;
  double a = (double)m->n_heads;
  double k = (double)m->n_kv_heads;
  double dq = (double)m->head_dim, dv = (double)m->head_dim;
  double tp = (double)l->tp;
  double rep = l->sp ? tp : 1.0; /* divisor of the replicated parts */
  double drop = t->dropout ? 1.0 : 0.0;
  double e = activation_bytes (t);
  double r = stow_mem_residual_bytes (t, l);
  gboolean eager = eager_modules (t, l);
  gboolean ac = stow_mem_autocast (t, l);
  /* Transformer Engine's fp8 linears save their input for the weight
   * gradient as the fp8 cast the forward GEMM read, 1 B an element:
   * te.Linear keeps inputmat (or its fp8 transpose), te.LayerNormLinear
   * writes its norm's output straight to fp8 (ln_out_dtype uint8) and
   * keeps that (TransformerEngine v1.8, transformer_engine/pytorch/module/
   * linear.py and layernorm_linear.py; NeMo 2.0.0rc1 pins 7d576ed, in
   * v1.8).  So the QKV and fc1 inputs (the norms' outputs) and fc2's input
   * (the activation's output) cost 1 B; the attention output, which the
   * attention kernel keeps in 16 bits, gains the projection's fp8 copy. */
  gboolean te_fp8 = stow_mem_te_fp8_layers (t, l);
  double lin = te_fp8 ? 1.0 : e; /* a linear's saved input, per element */
  /* A gated MLP keeps the gate's output, the up projection's and their
   * product; eager, the activation's output too (silu(g) apart from g).
   * Eager "gelu_new" is HF's Python formula 0.5 x (1 + tanh(c (x + 0.044715
   * x^3))): autograd keeps the tanh, 0.5 x and 1 + tanh besides x.  The
   * last of them is fc2's (down's) input. */
  double mlp_mats = m->gated_mlp ? (eager ? 4.0 : 3.0) : 2.0;
  if (eager && m->gelu_new)
    mlp_mats += 3.0;
  double mlp_per_f = (mlp_mats - 1.0) * e + lin; /* bytes per ffn element */
  double mlp_inner;

  if (m->qk_nope_head_dim + m->qk_rope_head_dim > 0)
    {
      /* DeepSeek MLA: q and k heads of nope+rope, v heads of v_head_dim,
       * all a heads after the latent up-projection. */
      dq = (double)(m->qk_nope_head_dim + m->qk_rope_head_dim);
      dv = (double)m->v_head_dim;
      k = a;
    }
  if (kind == STOW_LAYER_MOE && m->n_experts > 0)
    {
      /* Each token visits top-k experts: the permuted inputs and the expert
       * MLPs' tensors are top-k times those of one MLP of width moe_ffn
       * (mixtral: ffn), plus the shared experts as a dense MLP. */
      double fe = (double)(m->moe_ffn ? m->moe_ffn : m->ffn);
      double per = mlp_per_f * fe;
      mlp_inner = (double)m->experts_per_token * (lin * h + per)
                  + (double)m->n_shared_experts * per
                  + 4.0 * (double)m->n_experts; /* fp32 router logits */
    }
  else
    {
      double f = (double)m->ffn;
      mlp_inner = mlp_per_f * f;
    }

  /* Replicated under plain TP: two norm inputs (the residual stream), the
   * QKV and MLP inputs, two dropout masks (1 byte each). */
  double replicated = (2.0 * r + 2.0 * lin + 2.0 * drop) * h;
  if (eager && ac)
    /* Eager autocast keeps one 16-bit copy of the norm's output per linear
     * that reads it: q, k and v apart, or gate and up. */
    replicated
        += e * h
           * (double)(m->attn_input_linears - 1 + m->mlp_input_linears - 1);
  /* Split by TP: Q, K, V, the attention output feeding o_proj, and the
   * MLP's inner tensors. */
  double split = e * (a * dq + k * dq + k * dv) + e * a * dv + mlp_inner;
  if (m->qk_norm && l->engine == STOW_ENGINE_STOWAGE)
    /* Qwen3's per-head q and k norms: the stowage executor keeps their
     * inputs, q and k as projected, beside the normed and rotated ones
     * (executor/llama.h's qr and kr).  The other engines' counts leave
     * them out, as their sources do. */
    split += e * (a * dq + k * dq);
  if (te_fp8)
    split += a * dv; /* o_proj's fp8 copy of the attention output */
  if (m->ffn_dropout && drop > 0)
    split += (double)m->ffn; /* T5: the mask of the dropout inside the MLP */
  if (eager)
    {
      /* Eager modules keep, beyond the fused kernels' tensors: per RMSNorm
       * the fp32 copy of its input (4 B, in place of the input) and the
       * normalised tensor the weight multiplies (e); rotary embeddings' two
       * e-byte products per q and k element (HF's q cos + rotate_half(q)
       * sin; torchtune's fp32 copy, 4 B); K and V repeated to every query
       * head for GQA; and the attention output twice, as the SDPA kernel
       * saves it and as the contiguous copy o_proj reads. */
      double norms = kind == STOW_LAYER_CROSS ? 3.0 : 2.0;
      if (m->norm == STOW_NORM_RMSNORM)
        replicated += norms * 4.0 * h;
      if (has_rope (m))
        split += 2.0 * e * (a * dq + k * dq);
      if (k < a)
        split += e * (a - k) * (dq + dv);
      if (t->flash_attention)
        split += e * a * dv;
    }
  double scores = 1.0, score_cols = s, enc_side = 0;
  if (kind == STOW_LAYER_CROSS)
    {
      /* Cross-attention: its norm input and query input (replicated), its
       * Q, its output and dropout mask over the decoder's tokens; the K
       * and V projected from the encoder output over the encoder's; and a
       * second set of attention scores, decoder by encoder tokens. */
      replicated += (r + e + drop) * h;
      split += e * (a * dq + a * dv);
      enc_side = s_enc * b * e * (k * dq + k * dv) / tp;
      if (eager && ac)
        /* The k and v linears each cast the fp32 encoder output. */
        enc_side += 2.0 * s_enc * b * e * h;
      scores = 2.0;
      score_cols = s + s_enc;
    }
  if (t->finetune != STOW_FINETUNE_FULL && !ac)
    {
      /* LoRA: the inputs of the block's linears (the attention input, the
       * MLP input, o's and down's inputs; cross-attention's query and
       * output, and its k and v over the encoder's tokens) are kept only
       * where adapters read them; each adapter keeps its rank-r
       * intermediate too.  A fused qkv (or gate-up) counts as one linear.
       * Under autocast the casts the linears keep are charged as for full
       * fine-tuning. */
      gboolean dropped = frozen_inputs_dropped (l);
      guint tg
          = t->lora_targets ? t->lora_targets : (STOW_LORA_Q | STOW_LORA_V);
      guint n_attn
          = MIN (count_bits (tg & (STOW_LORA_Q | STOW_LORA_K | STOW_LORA_V)),
                 (guint)m->attn_input_linears);
      guint n_mlp
          = MIN (count_bits (tg
                             & (m->gated_mlp ? STOW_LORA_GATE | STOW_LORA_UP
                                             : STOW_LORA_UP)),
                 (guint)m->mlp_input_linears);
      guint n_o = (tg & STOW_LORA_O) != 0, n_down = (tg & STOW_LORA_DOWN) != 0;
      guint n_adapters = n_attn + n_o;
      replicated += lora_input_delta (t, dropped, e, h, n_attn);
      split += lora_input_delta (t, dropped, e, a * dv, n_o);
      if (kind != STOW_LAYER_MOE)
        {
          replicated += lora_input_delta (t, dropped, e, h, n_mlp);
          split += lora_input_delta (t, dropped, e, (double)m->ffn, n_down);
          n_adapters += n_mlp + n_down;
        }
      if (kind == STOW_LAYER_CROSS)
        {
          guint n_q = (tg & STOW_LORA_Q) != 0;
          guint n_kv = count_bits (tg & (STOW_LORA_K | STOW_LORA_V));
          replicated += lora_input_delta (t, dropped, e, h, n_q);
          split += lora_input_delta (t, dropped, e, a * dv, n_o);
          if (t->lora_dropout)
            enc_side += s_enc * b * (double)n_kv * (e + 1.0) * h;
          n_adapters += n_q + n_o + n_kv;
        }
      replicated += (double)n_adapters * e * (double)t->lora_rank;
    }
  double sb = s * b;
  *block = stow_mem_round (sb * (replicated / rep + split / tp) + enc_side);

  if (t->flash_attention)
    *core = stow_mem_round (scores * 4.0 * sb * a / tp); /* fp32 lse */
  else if (ac)
    /* Autocast: the fp32 softmax output (4 B), with dropout its mask, and
     * the 16-bit copy of the probabilities the PV product casts and keeps
     * (7 B a score with dropout, against 5 B in Korthikanti et al.). */
    *core = stow_mem_round ((4.0 + drop + e) * a * s * score_cols * b / tp);
  else
    /* The softmax output, and with dropout its mask (1 B) and output:
     * 5 a s^2 b at 16 bits in Korthikanti et al.; a decoder layer's self-
     * and cross-attention scores have s and s_enc columns. */
    *core
        = stow_mem_round ((e + drop * (1.0 + e)) * a * s * score_cols * b / tp);
}

/* What full recompute keeps of a layer: its input, s b h elements of the
 * residual stream (split by TP under sequence parallelism). */
guint64
stow_mem_checkpoint_bytes (const StowModel *m, const StowTraining *t,
                           const StowLayout *l)
{
  double s_local = (double)t->seq_len / l->cp;
  guint64 sbh
      = stow_mem_round (s_local * (double)l->micro_batch * (double)m->hidden);
  return stow_mem_round (stow_mem_residual_bytes (t, l) * (double)sbh)
         / (l->sp ? l->tp : 1);
}

/* What torchtitan's selective op checkpointing keeps of a dense layer
 * (--recompute selective-op; torchtitan/models/llama/parallelize_llama.py,
 * _apply_ac_to_transformer_block at 9dec370, Dec 2024, the policy its Llama
 * recipes run, selective_ac_option "op"): the layer's input, which the
 * checkpoint keeps; the flash SDPA kernel's output and its fp32 log-sum-
 * exp; and the outputs of every second aten.mm, counted per layer from
 * the first (the policy saves "all compute ops, except every second mm").
 * A layer runs its matmuls as q, k, v (or one fused qkv), o, then gate and
 * up (or one fused gate_up, or up alone) and down; everything else is
 * rebuilt in backward.  Split by TP as layer_activation_parts splits. */
guint
stow_mem_layer_matmuls (const StowModel *m, StowMatmul *mm)
{
  double a = (double)m->n_heads, k = (double)m->n_kv_heads;
  double d = (double)m->head_dim, h = (double)m->hidden;
  double f = (double)m->ffn;
  guint n = 0;
  if (m->attn_input_linears >= 3)
    {
      mm[n++] = (StowMatmul){ h, a * d, FALSE };
      mm[n++] = (StowMatmul){ h, k * d, FALSE };
      mm[n++] = (StowMatmul){ h, k * d, FALSE };
    }
  else
    mm[n++] = (StowMatmul){ h, (a + 2.0 * k) * d, FALSE };
  mm[n++] = (StowMatmul){ a * d, h, TRUE }; /* o */
  if (m->gated_mlp && m->mlp_input_linears >= 2)
    {
      mm[n++] = (StowMatmul){ h, f, FALSE };
      mm[n++] = (StowMatmul){ h, f, FALSE };
    }
  else
    mm[n++] = (StowMatmul){ h, m->gated_mlp ? 2.0 * f : f, FALSE };
  mm[n++] = (StowMatmul){ f, h, TRUE }; /* down */
  return n;
}

guint64
stow_mem_op_checkpoint_bytes (const StowModel *m, const StowTraining *t,
                              const StowLayout *l)
{
  double a = (double)m->n_heads, d = (double)m->head_dim;
  double tp = (double)l->tp;
  StowMatmul mm[STOW_MAX_LAYER_MATMULS];
  guint n = stow_mem_layer_matmuls (m, mm);
  double saved = 0;
  for (guint i = 0; i < n; i += 2) /* the 1st, 3rd, ... matmul */
    saved += mm[i].out;
  double e = activation_bytes (t);
  double s = (double)t->seq_len / l->cp, b = (double)l->micro_batch;
  double per_token = (e * (saved + a * d) + 4.0 * a) / tp;
  return stow_mem_round (s * b * per_token)
         + stow_mem_checkpoint_bytes (m, t, l);
}

guint64
stow_mem_layer_activations (const StowModel *m, const StowTraining *t,
                            const StowLayout *l)
{
  guint64 block, core;
  /* The time model reads this as the layer's element-wise traffic, which
   * Transformer Engine's fp8 copies of the linear inputs do not shrink
   * (their casts add to it): it counts the tensors at 16 bits, as a bf16
   * run saves them.  The memory totals charge the fp8 copies. */
  StowTraining t16 = *t;
  if (stow_mem_te_fp8_layers (t, l))
    t16.precision = STOW_PRECISION_BF16;
  stow_mem_layer_activation_parts (m, &t16, l, STOW_LAYER_DENSE, &block, &core);
  if (l->recompute == STOW_RECOMPUTE_SELECTIVE && !t->flash_attention)
    core = 0;
  return block + core;
}

/* The per-layer sizes activations() charges, shared with the step program
 * (planner/lower.c) so that both count the same tensors: @full is what a
 * layer keeps for backward (the larger of a dense and an MoE layer, so
 * every layer is charged alike), @block its activation gradients during
 * backward, @ckpt the input a fully recomputed layer keeps (2 s b h; split
 * by TP under sequence parallelism). */
void
stow_mem_activation_sizes (const StowModel *m, const StowTraining *t,
                           const StowLayout *l, guint64 *full, guint64 *block,
                           guint64 *ckpt)
{
  /* The largest kind of layer the model has (dense, MoE, decoder with
   * cross-attention): the step program sizes every layer's buffers alike. */
  *full = *block = 0;
  for (int k = 0; k < STOW_N_LAYER_KINDS; k++)
    {
      if ((k == STOW_LAYER_MOE && m->n_experts == 0)
          || (k == STOW_LAYER_CROSS && m->n_encoder_layers == 0))
        continue;
      guint64 b, core;
      stow_mem_layer_activation_parts (m, t, l, (StowLayerKind)k, &b, &core);
      if (l->recompute == STOW_RECOMPUTE_SELECTIVE && !t->flash_attention)
        core = 0;
      *full = MAX (*full, b + core);
      *block = MAX (*block, b);
    }
  *ckpt = stow_mem_checkpoint_bytes (m, t, l);
}

/* The ends of one micro-batch, shared with the step program: @input, the
 * first stage's int64 token ids and embedding output (8 s b + e s b h);
 * @logits, the last stage's logits as the loss holds them (s b V / tp
 * elements, over the decoder's tokens); @loss_grad, the gradient the loss
 * hands the last layer (e s b h, over the decoder's tokens).  Under
 * sequence parallelism the s b h tensors are split by TP. */
void
stow_mem_end_sizes (const StowModel *m, const StowTraining *t,
                    const StowLayout *l, guint64 *input, guint64 *logits,
                    guint64 *loss_grad)
{
  double r = stow_mem_residual_bytes (t, l);
  double s_in = (double)t->seq_len / l->cp;
  double s_out = (double)stow_mem_decoder_seq (m, t) / l->cp;
  double b = (double)l->micro_batch, h = (double)m->hidden;
  guint64 spdiv = l->sp ? l->tp : 1;
  guint64 sbh = stow_mem_round (s_in * b * h);
  *input = stow_mem_round (8.0 * s_in * b)
           + stow_mem_round (r * (double)sbh / spdiv);
  guint64 sbv = stow_mem_round (s_out * b * (double)m->vocab / l->tp);
  *logits = stow_bytes (sbv, stow_mem_logits_element_bytes (t, l));
  *loss_grad = stow_mem_round (r * s_out * b * h) / spdiv;
  if (stow_mem_fused_head_loss (t, l))
    {
      /* stowage's output layer runs fused with the loss, a chunk of tokens
       * at a time (program/program.h), and hands the last layer its
       * gradient in the place of that layer's output. */
      *logits = stow_loss_scratch_bytes (m->vocab / l->tp, m->hidden,
                                         stow_mem_round (s_out * b));
      *loss_grad = 0;
    }
}

guint64
stow_memory_layer_activations (const StowPlan *p)
{
  g_return_val_if_fail (p != NULL && p->model != NULL, 0);
  return stow_mem_layer_activations (p->model, &p->training, &p->layout);
}
