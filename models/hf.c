/* SPDX-License-Identifier: MIT
 *
 * models/hf.c: HuggingFace config.json -> tensor inventory, one importer per
 * model_type.  Field names, defaults and tensor names follow the
 * transformers configuration and modeling code of each family (see
 * /work/shared/reference/ecosystem.md section 1.1 for the field table and
 * 1.2 for the count formulas the inventories reproduce).  Only shapes are
 * produced here; model.c turns them into counts.
 */
#include "models/model-private.h"

#include <stdarg.h>
#include <string.h>

#include "core/json.h"

#define E_INVALID(error, ...)                                                  \
  (g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,             \
                __VA_ARGS__),                                                  \
   FALSE)

/* Reads the first present member of @names (a config may use a family's
 * legacy spelling, e.g. bloom's n_embed for hidden_size).  Missing and
 * @required: an error naming names[0].  @positive rejects 0. */
static gboolean
get_u64 (JsonObject *o, const char *where, const char *const *names,
         gboolean required, gboolean positive, guint64 *out, GError **error)
{
  for (guint i = 0; names[i] != NULL; i++)
    {
      if (!stow_json_has (o, names[i]))
        continue;
      if (!stow_json_get_u64 (o, where, names[i], TRUE, out, error))
        return FALSE;
      /* Bounding every size keeps each shape expression (3h, (a+2k)d, ...)
       * inside 64 bits; tensor sizes and sums are checked separately. */
      if (*out > STOW_MODEL_MAX_DIM)
        return E_INVALID (error,
                          "%s: %s (%" G_GUINT64_FORMAT
                          ") is absurd: sizes above %u are not supported",
                          where, names[i], *out, STOW_MODEL_MAX_DIM);
      if (positive && *out == 0)
        return E_INVALID (error, "%s: %s must be positive, got 0", where,
                          names[i]);
      return TRUE;
    }
  if (required)
    return stow_json_get_u64 (o, where, names[0], TRUE, out, error);
  return TRUE;
}

#define NAMES(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define REQ(o, b, out, ...)                                                    \
  get_u64 (o, (b)->where, NAMES (__VA_ARGS__), TRUE, TRUE, out, error)
#define OPT(o, b, out, ...)                                                    \
  get_u64 (o, (b)->where, NAMES (__VA_ARGS__), FALSE, TRUE, out, error)

static gboolean
get_bool (JsonObject *o, const char *where, const char *name, gboolean *out,
          GError **error)
{
  return stow_json_get_bool (o, where, name, FALSE, out, error);
}

static gboolean
check_layers (StowModelBuilder *b, const char *field, guint64 n, GError **error)
{
  if (n > STOW_MODEL_MAX_LAYERS)
    return E_INVALID (error,
                      "%s: %s (%" G_GUINT64_FORMAT
                      ") is absurd: at most %d layers are supported",
                      b->where, field, n, STOW_MODEL_MAX_LAYERS);
  return TRUE;
}

static gboolean
check_experts (StowModelBuilder *b, const char *field, guint64 experts,
               guint64 moe_layers, GError **error)
{
  if (experts > STOW_MODEL_MAX_EXPERTS
      || experts * moe_layers > STOW_MODEL_MAX_EXPERT_LAYERS)
    return E_INVALID (error,
                      "%s: %s (%" G_GUINT64_FORMAT
                      ") is absurd: at most %u experts over all layers",
                      b->where, field, experts, STOW_MODEL_MAX_EXPERT_LAYERS);
  return TRUE;
}

/* Head arithmetic shared by the decoder families.  Without an explicit head
 * dimension the heads must split the hidden size evenly; grouped-query
 * attention needs whole groups. */
static gboolean
check_heads (StowModelBuilder *b, guint64 hidden, const char *hidden_field,
             guint64 heads, const char *heads_field, guint64 kv,
             const char *kv_field, gboolean explicit_head_dim, GError **error)
{
  if (!explicit_head_dim && hidden % heads != 0)
    return E_INVALID (error,
                      "%s: %s (%" G_GUINT64_FORMAT
                      ") must divide %s (%" G_GUINT64_FORMAT ")",
                      b->where, heads_field, heads, hidden_field, hidden);
  if (kv > heads || heads % kv != 0)
    return E_INVALID (error,
                      "%s: %s (%" G_GUINT64_FORMAT
                      ") must divide %s (%" G_GUINT64_FORMAT ")",
                      b->where, kv_field, kv, heads_field, heads);
  return TRUE;
}

/* Ties the output projection to the token embedding when @tied (stored,
 * but shares storage: HF num_parameters() counts it once). */
static void
add_lm_head (StowModelBuilder *b, const char *name, guint64 vocab,
             guint64 width, gboolean tied)
{
  stow_model_add_tensor (b, STOW_ROLE_HEAD, -1, tied, 2, vocab, width, "%s",
                         name);
}

/* The add_* helpers take their tensor-name prefix as a printf format, so a
 * builder names "%s.mlp.fc1" against its layer prefix in one call; every
 * name stays far below PREFIX_MAX. */
#define PREFIX_MAX 192
#define FORMAT_PREFIX(prefix, fmt)                                             \
  char prefix[PREFIX_MAX];                                                     \
  va_list ap;                                                                  \
  va_start (ap, fmt);                                                          \
  g_vsnprintf (prefix, sizeof prefix, fmt, ap);                                \
  va_end (ap)

static void add_norm (StowModelBuilder *b, gint layer, guint64 n,
                      const char *fmt, ...) G_GNUC_PRINTF (4, 5);
static void add_linear (StowModelBuilder *b, StowTensorRole role, gint layer,
                        guint64 out, guint64 in, gboolean bias, const char *fmt,
                        ...) G_GNUC_PRINTF (7, 8);
static void add_conv1d (StowModelBuilder *b, StowTensorRole role, gint layer,
                        guint64 in, guint64 out, const char *fmt, ...)
    G_GNUC_PRINTF (6, 7);

/* A LayerNorm (weight and bias) or RMSNorm (weight) named by @fmt. */
static void
add_norm (StowModelBuilder *b, gint layer, guint64 n, const char *fmt, ...)
{
  FORMAT_PREFIX (prefix, fmt);
  stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, n, 0, "%s.weight",
                         prefix);
  if (b->model->norm == STOW_NORM_LAYERNORM)
    stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, n, 0, "%s.bias",
                           prefix);
}

/* A linear layer out x in, with an optional bias. */
static void
add_linear (StowModelBuilder *b, StowTensorRole role, gint layer, guint64 out,
            guint64 in, gboolean bias, const char *fmt, ...)
{
  FORMAT_PREFIX (prefix, fmt);
  stow_model_add_tensor (b, role, layer, FALSE, 2, out, in, "%s.weight",
                         prefix);
  if (bias)
    stow_model_add_tensor (
        b, role == STOW_ROLE_ROUTER ? STOW_ROLE_ROUTER : STOW_ROLE_BIAS, layer,
        FALSE, 1, out, 0, "%s.bias", prefix);
}

/* GPT-2's Conv1D stores weights as in x out. */
static void
add_conv1d (StowModelBuilder *b, StowTensorRole role, gint layer, guint64 in,
            guint64 out, const char *fmt, ...)
{
  FORMAT_PREFIX (prefix, fmt);
  stow_model_add_tensor (b, role, layer, FALSE, 2, in, out, "%s.weight",
                         prefix);
  stow_model_add_tensor (b, STOW_ROLE_BIAS, layer, FALSE, 1, out, 0, "%s.bias",
                         prefix);
}

/* Shape products needed to validate before building (a*d and friends);
 * an overflow here is reported like any other. */
static gboolean
mul_checked (StowModelBuilder *b, guint64 x, guint64 y, guint64 *out,
             const char *what, GError **error)
{
  if (!g_uint64_checked_mul (out, x, y))
    return E_INVALID (error, "%s: sizes are absurd: %s overflows 64-bit counts",
                      b->where, what);
  return TRUE;
}

/* The dense-transformer sizes under their usual names, in this order;
 * @ffn_field names the MLP width (intermediate_size, or OPT's ffn_dim). */
static gboolean
read_dims (StowModelBuilder *b, JsonObject *o, const char *ffn_field,
           guint64 *h, guint64 *L, guint64 *a, guint64 *f, guint64 *V,
           GError **error)
{
  return REQ (o, b, h, "hidden_size") && REQ (o, b, L, "num_hidden_layers")
         && REQ (o, b, a, "num_attention_heads") && REQ (o, b, f, ffn_field)
         && REQ (o, b, V, "vocab_size");
}

/* check_layers and check_heads for a config whose errors name
 * num_hidden_layers, hidden_size and num_attention_heads (whatever legacy
 * spelling it was read from); @kv_field names the kv heads @k. */
static gboolean
check_dims (StowModelBuilder *b, guint64 h, guint64 L, guint64 a, guint64 k,
            const char *kv_field, gboolean explicit_head_dim, GError **error)
{
  return check_layers (b, "num_hidden_layers", L, error)
         && check_heads (b, h, "hidden_size", a, "num_attention_heads", k,
                         kv_field, explicit_head_dim, error);
}

/* The shape fields every family sets: hidden size, layers, query and kv
 * heads, head dimension, MLP width and vocabulary. */
static void
set_dims (StowModel *m, guint64 h, guint64 L, guint64 a, guint64 k, guint64 d,
          guint64 f, guint64 V)
{
  m->hidden = h;
  m->n_layers = L;
  m->n_heads = a;
  m->n_kv_heads = k;
  m->head_dim = d;
  m->ffn = f;
  m->vocab = V;
}

/* A gated MLP (llama's and deepseek's mlp, each deepseek expert and the
 * shared experts): gate_proj and up_proj (f x h), then down_proj. */
static void add_gated_mlp (StowModelBuilder *b, StowTensorRole role, gint l,
                           guint64 h, guint64 f, gboolean bias, const char *fmt,
                           ...) G_GNUC_PRINTF (7, 8);
static void
add_gated_mlp (StowModelBuilder *b, StowTensorRole role, gint l, guint64 h,
               guint64 f, gboolean bias, const char *fmt, ...)
{
  FORMAT_PREFIX (prefix, fmt);
  add_linear (b, role, l, f, h, bias, "%s.gate_proj", prefix);
  add_linear (b, role, l, f, h, bias, "%s.up_proj", prefix);
  add_linear (b, role, l, h, f, bias, "%s.down_proj", prefix);
}

/* The fused attention of gpt_neox, falcon and bloom: query_key_value
 * (@qkv rows) and the dense output projection. */
static void add_fused_attention (StowModelBuilder *b, gint l, guint64 h,
                                 guint64 qkv, gboolean bias, const char *fmt,
                                 ...) G_GNUC_PRINTF (6, 7);
static void
add_fused_attention (StowModelBuilder *b, gint l, guint64 h, guint64 qkv,
                     gboolean bias, const char *fmt, ...)
{
  FORMAT_PREFIX (prefix, fmt);
  add_linear (b, STOW_ROLE_ATTENTION, l, qkv, h, bias, "%s.query_key_value",
              prefix);
  add_linear (b, STOW_ROLE_ATTENTION, l, h, h, bias, "%s.dense", prefix);
}

/* Their MLP: @layer.mlp.dense_h_to_4h and dense_4h_to_h, of width @f. */
static void
add_h_to_4h_mlp (StowModelBuilder *b, gint l, guint64 h, guint64 f,
                 gboolean bias, const char *layer)
{
  add_linear (b, STOW_ROLE_MLP, l, f, h, bias, "%s.mlp.dense_h_to_4h", layer);
  add_linear (b, STOW_ROLE_MLP, l, h, f, bias, "%s.mlp.dense_4h_to_h", layer);
}

/* ---- llama, mistral, mixtral, qwen2, gemma, gemma2, phi3 ---------------- */

/* What running a llama-like model needs: rope_theta, rms_norm_eps,
 * hidden_act, initializer_range (HF LlamaConfig's defaults) and Llama 3's
 * rope_scaling. */
static gboolean
read_runtime (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  const char *act = "silu";
  m->rope_theta = 10000.0;
  m->norm_eps = 1e-6;
  m->initializer_range = 0.02;
  if (!stow_json_get_double (o, b->where, "rope_theta", FALSE, &m->rope_theta,
                             error)
      || !stow_json_get_double (o, b->where, "rms_norm_eps", FALSE,
                                &m->norm_eps, error)
      || !stow_json_get_double (o, b->where, "initializer_range", FALSE,
                                &m->initializer_range, error)
      || !stow_json_get_string (o, b->where, "hidden_act", FALSE, &act, error))
    return FALSE;
  if (!(m->rope_theta > 0) || !(m->norm_eps > 0) || !(m->initializer_range >= 0))
    return E_INVALID (error,
                      "%s: rope_theta (%g), rms_norm_eps (%g) and "
                      "initializer_range (%g) must be positive",
                      b->where, m->rope_theta, m->norm_eps,
                      m->initializer_range);
  m->hidden_act = g_strdup (act);
  JsonObject *rs = NULL;
  if (stow_json_has (o, "rope_scaling"))
    {
      g_autofree char *w = g_strdup_printf ("%s: rope_scaling", b->where);
      const char *type = NULL;
      if (!stow_json_get_object (o, b->where, "rope_scaling", FALSE, &rs, error)
          || !stow_json_get_string (rs, w, "rope_type", FALSE, &type, error))
        return FALSE;
      if (type == NULL
          && !stow_json_get_string (rs, w, "type", FALSE, &type, error))
        return FALSE;
      m->rope_type = g_strdup (type ? type : "default");
      m->rope_factor = 1.0;
      m->rope_low_freq_factor = 1.0;
      m->rope_high_freq_factor = 4.0;
      m->rope_original_max_positions = 8192;
      if (!stow_json_get_double (rs, w, "factor", FALSE, &m->rope_factor,
                                 error)
          || !stow_json_get_double (rs, w, "low_freq_factor", FALSE,
                                    &m->rope_low_freq_factor, error)
          || !stow_json_get_double (rs, w, "high_freq_factor", FALSE,
                                    &m->rope_high_freq_factor, error)
          || !stow_json_get_u64 (rs, w, "original_max_position_embeddings",
                                 FALSE, &m->rope_original_max_positions, error))
        return FALSE;
    }
  return TRUE;
}

/* TRUE when the JSON array @a (of integers; may be NULL) holds @v. */
static gboolean
in_int_array (JsonArray *a, guint64 v)
{
  for (guint i = 0; a && i < json_array_get_length (a); i++)
    if (json_node_get_value_type (json_array_get_element (a, i)) == G_TYPE_INT64
        && (guint64)json_array_get_int_element (a, i) == v)
      return TRUE;
  return FALSE;
}

/* The llama-like decoders.  @prefix goes before every tensor name (""; a
 * multimodal wrapper's "language_model."). */
static gboolean
import_llama_like (StowModelBuilder *b, JsonObject *o, const char *type,
                   const char *prefix, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, k = 0, d = 0, f = 0, V = 0, qd;
  gboolean explicit_d = stow_json_has (o, "head_dim");
  gboolean is_gemma = g_str_equal (type, "gemma");
  gboolean is_gemma3 = g_str_equal (type, "gemma3_text");
  /* Gemma-2 and Gemma-3 norm both sides of each block. */
  gboolean is_gemma2 = g_str_equal (type, "gemma2") || is_gemma3;
  gboolean is_phi3 = g_str_equal (type, "phi3");
  gboolean is_qwen2 = g_str_equal (type, "qwen2");
  gboolean is_qwen3_moe = g_str_equal (type, "qwen3_moe");
  /* Qwen3 and Gemma-3 RMS-normalise each head's queries and keys
   * (q_norm, k_norm: head_dim weights each). */
  gboolean qk_norm = g_str_equal (type, "qwen3") || is_qwen3_moe || is_gemma3;
  gboolean is_mixtral = g_str_equal (type, "mixtral");
  /* The gemma families tie by default; the others default to untied. */
  gboolean tied = is_gemma || is_gemma2;
  guint64 sparse_step = 1;
  JsonArray *mlp_only = NULL;
  gboolean attn_bias = FALSE, mlp_bias = FALSE;

  if (!read_dims (b, o, "intermediate_size", &h, &L, &a, &f, &V, error))
    return FALSE;
  k = a;
  if (!OPT (o, b, &k, "num_key_value_heads") || !OPT (o, b, &d, "head_dim")
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error)
      || !get_bool (o, b->where, "attention_bias", &attn_bias, error)
      || !get_bool (o, b->where, "mlp_bias", &mlp_bias, error))
    return FALSE;
  if (!check_dims (b, h, L, a, k, "num_key_value_heads", explicit_d, error))
    return FALSE;
  if (!explicit_d)
    d = h / a;
  if (!mul_checked (b, a, d, &qd, "num_attention_heads x head_dim", error))
    return FALSE;

  set_dims (m, h, L, a, k, d, f, V);
  m->gated_mlp = TRUE;
  m->linear_bias = attn_bias || mlp_bias;
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_RMSNORM;
  if (!read_runtime (b, o, error))
    return FALSE;
  m->qkv_bias = is_qwen2 || attn_bias;
  m->o_bias = attn_bias;
  m->mlp_bias = mlp_bias;

  if (is_qwen3_moe)
    {
      /* Qwen3-MoE: routed experts of moe_intermediate_size in every
       * decoder_sparse_step-th layer not listed in mlp_only_layers, no
       * shared experts (configuration_qwen3_moe.py). */
      guint64 E = 0, topk = 0, fe = 0;
      if (!REQ (o, b, &E, "num_experts")
          || !REQ (o, b, &topk, "num_experts_per_tok")
          || !REQ (o, b, &fe, "moe_intermediate_size")
          || !OPT (o, b, &sparse_step, "decoder_sparse_step")
          || !stow_json_get_array (o, b->where, "mlp_only_layers", FALSE,
                                   &mlp_only, error)
          || !check_experts (b, "num_experts", E, L, error))
        return FALSE;
      if (topk > E)
        return E_INVALID (error,
                          "%s: num_experts_per_tok (%" G_GUINT64_FORMAT
                          ") exceeds num_experts (%" G_GUINT64_FORMAT ")",
                          b->where, topk, E);
      if (mlp_only)
        for (guint i = 0; i < json_array_get_length (mlp_only); i++)
          {
            JsonNode *n = json_array_get_element (mlp_only, i);
            if (json_node_get_value_type (n) != G_TYPE_INT64
                || json_node_get_int (n) < 0
                || (guint64)json_node_get_int (n) >= L)
              return E_INVALID (
                  error,
                  "%s: mlp_only_layers[%u]: expected a layer "
                  "index below num_hidden_layers (%" G_GUINT64_FORMAT ")",
                  b->where, i, L);
          }
      m->n_experts = E;
      m->experts_per_token = topk;
      m->moe_ffn = fe;
    }
  if (is_mixtral)
    {
      guint64 E = 0, topk = 0;
      if (!REQ (o, b, &E, "num_local_experts")
          || !REQ (o, b, &topk, "num_experts_per_tok")
          || !check_experts (b, "num_local_experts", E, L, error))
        return FALSE;
      if (topk > E)
        return E_INVALID (error,
                          "%s: num_experts_per_tok (%" G_GUINT64_FORMAT
                          ") exceeds num_local_experts (%" G_GUINT64_FORMAT ")",
                          b->where, topk, E);
      m->n_experts = E;
      m->experts_per_token = topk;
      m->moe_ffn = f;
    }

  /* The qwen2 q/k/v biases are built into the modeling code (no config
   * flag); llama's attention_bias puts biases on all four projections. */
  gboolean qkv_bias = is_qwen2 || attn_bias;
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "%smodel.embed_tokens.weight", prefix);
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "%smodel.layers.%d", prefix, l);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                             "%s.input_layernorm.weight", p);
      if (is_phi3)
        {
          /* Fused q, k, v: the same count as three projections. */
          stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2,
                                 (a + 2 * k) * d, h,
                                 "%s.self_attn.qkv_proj.weight", p);
        }
      else
        {
          add_linear (b, STOW_ROLE_ATTENTION, l, a * d, h, qkv_bias,
                      "%s.self_attn.q_proj", p);
          add_linear (b, STOW_ROLE_ATTENTION, l, k * d, h, qkv_bias,
                      "%s.self_attn.k_proj", p);
          add_linear (b, STOW_ROLE_ATTENTION, l, k * d, h, qkv_bias,
                      "%s.self_attn.v_proj", p);
        }
      add_linear (b, STOW_ROLE_ATTENTION, l, h, a * d, attn_bias,
                  "%s.self_attn.o_proj", p);
      if (qk_norm)
        {
          stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                                 "%s.self_attn.q_norm.weight", p);
          stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                                 "%s.self_attn.k_norm.weight", p);
        }
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                             "%s.post_attention_layernorm.weight", p);
      if (is_gemma2)
        {
          /* Gemma-2 norms both sides of each block: four per layer. */
          stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                                 "%s.pre_feedforward_layernorm.weight", p);
          stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                                 "%s.post_feedforward_layernorm.weight", p);
        }
      if (is_mixtral)
        {
          stow_model_add_tensor (b, STOW_ROLE_ROUTER, l, FALSE, 2, m->n_experts,
                                 h, "%s.block_sparse_moe.gate.weight", p);
          for (guint64 e = 0; e < m->n_experts; e++)
            {
#define EXPERT_W "%s.block_sparse_moe.experts.%u.w%d.weight"
              stow_model_add_tensor (b, STOW_ROLE_EXPERT, l, FALSE, 2, f, h,
                                     EXPERT_W, p, (guint)e, 1);
              stow_model_add_tensor (b, STOW_ROLE_EXPERT, l, FALSE, 2, h, f,
                                     EXPERT_W, p, (guint)e, 2);
              stow_model_add_tensor (b, STOW_ROLE_EXPERT, l, FALSE, 2, f, h,
                                     EXPERT_W, p, (guint)e, 3);
#undef EXPERT_W
            }
        }
      else if (is_qwen3_moe && (i + 1) % sparse_step == 0
               && !in_int_array (mlp_only, i))
        {
          stow_model_add_tensor (b, STOW_ROLE_ROUTER, l, FALSE, 2, m->n_experts,
                                 h, "%s.mlp.gate.weight", p);
          for (guint64 e = 0; e < m->n_experts; e++)
            add_gated_mlp (b, STOW_ROLE_EXPERT, l, h, m->moe_ffn, FALSE,
                           "%s.mlp.experts.%u", p, (guint)e);
        }
      else if (is_phi3)
        {
          stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, 2 * f, h,
                                 "%s.mlp.gate_up_proj.weight", p);
          stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, h, f,
                                 "%s.mlp.down_proj.weight", p);
        }
      else
        add_gated_mlp (b, STOW_ROLE_MLP, l, h, f, mlp_bias, "%s.mlp", p);
    }
  stow_model_add_tensor (b, STOW_ROLE_NORM, -1, FALSE, 1, h, 0,
                         "%smodel.norm.weight", prefix);
  g_autofree char *head = g_strconcat (prefix, "lm_head.weight", NULL);
  add_lm_head (b, head, V, h, tied);
  return TRUE;
}

/* ---- gpt2 (also GPT-3 and the Megatron GPT shapes) ---------------------- */

static gboolean
import_gpt2 (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0, P = 0, f = 0;
  const char *act = "gelu_new"; /* GPT2Config's default */

  if (!REQ (o, b, &h, "n_embd") || !REQ (o, b, &L, "n_layer")
      || !REQ (o, b, &a, "n_head") || !REQ (o, b, &V, "vocab_size")
      || !REQ (o, b, &P, "n_positions", "n_ctx")
      || !stow_json_get_string (o, b->where, "activation_function", FALSE, &act,
                                error))
    return FALSE;
  if (!mul_checked (b, 4, h, &f, "4 x n_embd", error)
      || !OPT (o, b, &f, "n_inner"))
    return FALSE;
  if (!check_layers (b, "n_layer", L, error)
      || !check_heads (b, h, "n_embd", a, "n_head", a, "n_head", FALSE, error))
    return FALSE;

  set_dims (m, h, L, a, a, h / a, f, V);
  m->max_positions = P;
  m->linear_bias = TRUE;
  m->tied_embeddings = TRUE;
  m->norm = STOW_NORM_LAYERNORM;
  m->gelu_new = g_str_equal (act, "gelu_new");

  /* Names as GPT2LMHeadModel saves them ("transformer." prefix; the
   * original hub files omit it). */
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "transformer.wte.weight");
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, P, h,
                         "transformer.wpe.weight");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "transformer.h.%d", l);
      add_norm (b, l, h, "%s.ln_1", p);
      add_conv1d (b, STOW_ROLE_ATTENTION, l, h, 3 * h, "%s.attn.c_attn", p);
      add_conv1d (b, STOW_ROLE_ATTENTION, l, h, h, "%s.attn.c_proj", p);
      add_norm (b, l, h, "%s.ln_2", p);
      add_conv1d (b, STOW_ROLE_MLP, l, h, f, "%s.mlp.c_fc", p);
      add_conv1d (b, STOW_ROLE_MLP, l, f, h, "%s.mlp.c_proj", p);
    }
  add_norm (b, -1, h, "transformer.ln_f");
  add_lm_head (b, "lm_head.weight", V, h, TRUE);
  return TRUE;
}

/* ---- gpt_neox (Pythia, GPT-NeoX-20B) ------------------------------------ */

static gboolean
import_gpt_neox (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0, f = 0;
  gboolean tied = FALSE;

  if (!read_dims (b, o, "intermediate_size", &h, &L, &a, &f, &V, error)
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error))
    return FALSE;
  if (!check_dims (b, h, L, a, a, "num_attention_heads", FALSE, error))
    return FALSE;

  set_dims (m, h, L, a, a, h / a, f, V);
  m->linear_bias = TRUE;
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_LAYERNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "gpt_neox.embed_in.weight");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "gpt_neox.layers.%d", l);
      add_norm (b, l, h, "%s.input_layernorm", p);
      add_norm (b, l, h, "%s.post_attention_layernorm", p);
      add_fused_attention (b, l, h, 3 * h, TRUE, "%s.attention", p);
      add_h_to_4h_mlp (b, l, h, f, TRUE, p);
    }
  add_norm (b, -1, h, "gpt_neox.final_layer_norm");
  /* embed_out has no bias. */
  add_lm_head (b, "embed_out.weight", V, h, tied);
  return TRUE;
}

/* ---- mpt (MosaicML MPT: llm-foundry's MPTConfig) ----------------------- */

/* A norm of width @n under MPT's norm_type: LayerNorms have a bias unless
 * no_bias (llm-foundry drops every bias parameter then), RMSNorms never. */
static void
add_mpt_norm (StowModelBuilder *b, gint layer, guint64 n, gboolean bias,
              const char *name, const char *prefix)
{
  stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, n, 0,
                         "%s%s.weight", prefix, name);
  if (bias && b->model->norm == STOW_NORM_LAYERNORM)
    stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, n, 0,
                           "%s%s.bias", prefix, name);
}

/* Field names and defaults are llm-foundry's MPTConfig (llmfoundry/models/
 * mpt/configuration_mpt.py, the configuration_mpt.py the mosaicml/mpt-*
 * repositories ship): d_model, n_heads, n_layers, expansion_ratio 4 (or
 * ffn_config.ffn_hidden_size), max_seq_len 2048, vocab_size 50368, no_bias
 * false, learned_pos_emb true, tie_word_embeddings true, norm_type
 * low_precision_layernorm; attn_config: attn_type multihead_attention
 * (multiquery_attention: one kv head; grouped_query_attention: kv_n_heads,
 * default 1), alibi false, rope false, qk_ln false; ffn_config: ffn_type
 * mptmlp (up_proj, down_proj) or mptglu (gate_proj too).  transformers'
 * own MptConfig defaults differ (no_bias and alibi true), but a config.json
 * either writes carries every field. */
static gboolean
import_mpt (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, k = 0, f = 0, V = 50368, P = 2048;
  double ratio = 4.0;
  gboolean no_bias = FALSE, learned = TRUE, tied = TRUE, alibi = FALSE,
           rope = FALSE, qk_ln = FALSE, glu = FALSE;
  const char *norm = "low_precision_layernorm",
             *attn_type = "multihead_attention", *ffn_type = "mptmlp";
  JsonObject *attn = NULL, *ffn = NULL;
  g_autofree char *attn_where = g_strdup_printf ("%s: attn_config", b->where);
  g_autofree char *ffn_where = g_strdup_printf ("%s: ffn_config", b->where);

  if (!REQ (o, b, &h, "d_model") || !REQ (o, b, &L, "n_layers")
      || !REQ (o, b, &a, "n_heads") || !OPT (o, b, &V, "vocab_size")
      || !OPT (o, b, &P, "max_seq_len")
      || !stow_json_get_double (o, b->where, "expansion_ratio", FALSE, &ratio,
                                error)
      || !get_bool (o, b->where, "no_bias", &no_bias, error)
      || !get_bool (o, b->where, "learned_pos_emb", &learned, error)
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error)
      || !stow_json_get_string (o, b->where, "norm_type", FALSE, &norm, error)
      || !stow_json_get_object (o, b->where, "attn_config", FALSE, &attn, error)
      || !stow_json_get_object (o, b->where, "ffn_config", FALSE, &ffn, error))
    return FALSE;
  if (attn
      && (!stow_json_get_string (attn, attn_where, "attn_type", FALSE,
                                 &attn_type, error)
          || !get_bool (attn, attn_where, "alibi", &alibi, error)
          || !get_bool (attn, attn_where, "rope", &rope, error)
          || !get_bool (attn, attn_where, "qk_ln", &qk_ln, error)))
    return FALSE;
  if (ffn
      && !stow_json_get_string (ffn, ffn_where, "ffn_type", FALSE, &ffn_type,
                                error))
    return FALSE;

  if (g_str_equal (attn_type, "multihead_attention"))
    k = a;
  else if (g_str_equal (attn_type, "multiquery_attention"))
    k = 1;
  else if (g_str_equal (attn_type, "grouped_query_attention"))
    {
      k = 1;
      if (attn
          && !get_u64 (attn, attn_where, NAMES ("kv_n_heads"), FALSE, TRUE, &k,
                       error))
        return FALSE;
    }
  else
    {
      g_autofree char *esc = g_strescape (attn_type, NULL);
      return E_INVALID (error,
                        "%s: attn_type \"%.60s\" is not supported (expected "
                        "multihead_attention, multiquery_attention or "
                        "grouped_query_attention)",
                        attn_where, esc);
    }
  if (g_str_equal (ffn_type, "mptglu"))
    glu = TRUE;
  else if (!g_str_equal (ffn_type, "mptmlp"))
    {
      g_autofree char *esc = g_strescape (ffn_type, NULL);
      return E_INVALID (error,
                        "%s: ffn_type \"%.60s\" is not supported (expected "
                        "mptmlp or mptglu)",
                        ffn_where, esc);
    }
  if (g_str_has_suffix (norm, "rmsnorm"))
    m->norm = STOW_NORM_RMSNORM;
  else if (g_str_has_suffix (norm, "layernorm"))
    m->norm = STOW_NORM_LAYERNORM;
  else
    {
      g_autofree char *esc = g_strescape (norm, NULL);
      return E_INVALID (error,
                        "%s: norm_type \"%.60s\" is not supported (expected a "
                        "layernorm or an rmsnorm kind)",
                        b->where, esc);
    }
  if (!check_layers (b, "n_layers", L, error)
      || !check_heads (b, h, "d_model", a, "n_heads", k, "kv_n_heads", FALSE,
                       error))
    return FALSE;
  /* resolve_ffn_hidden_size: an explicit width wins over the ratio. */
  if (ffn && stow_json_has (ffn, "ffn_hidden_size"))
    {
      if (!get_u64 (ffn, ffn_where, NAMES ("ffn_hidden_size"), TRUE, TRUE, &f,
                    error))
        return FALSE;
    }
  else
    {
      if (!(ratio > 0) || ratio * (double)h > (double)STOW_MODEL_MAX_DIM)
        return E_INVALID (error,
                          "%s: expansion_ratio (%g) must be positive and keep "
                          "d_model x expansion_ratio at most %u",
                          b->where, ratio, STOW_MODEL_MAX_DIM);
      f = (guint64)(ratio * (double)h); /* int(d_model * expansion_ratio) */
      if (f == 0)
        return E_INVALID (
            error,
            "%s: expansion_ratio (%g) x d_model (%" G_GUINT64_FORMAT
            ") leaves no MLP",
            b->where, ratio, h);
    }

  guint64 d = h / a;
  set_dims (m, h, L, a, k, d, f, V);
  m->max_positions = learned ? P : 0;
  m->rope_free = !rope;
  m->gated_mlp = glu;
  m->linear_bias = !no_bias;
  m->tied_embeddings = tied;
  (void)alibi; /* a bias on the scores: no parameters, no rotary products */

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "transformer.wte.weight");
  if (learned)
    stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, P, h,
                           "transformer.wpe.weight");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "transformer.blocks.%d", l);
      add_mpt_norm (b, l, h, !no_bias, ".norm_1", p);
      add_linear (b, STOW_ROLE_ATTENTION, l, h + 2 * k * d, h, !no_bias,
                  "%s.attn.Wqkv", p);
      if (qk_ln)
        {
          add_mpt_norm (b, l, h, !no_bias, ".attn.q_ln", p);
          add_mpt_norm (b, l, k * d, !no_bias, ".attn.k_ln", p);
        }
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, !no_bias, "%s.attn.out_proj",
                  p);
      add_mpt_norm (b, l, h, !no_bias, ".norm_2", p);
      if (glu)
        add_linear (b, STOW_ROLE_MLP, l, f, h, !no_bias, "%s.ffn.gate_proj", p);
      add_linear (b, STOW_ROLE_MLP, l, f, h, !no_bias, "%s.ffn.up_proj", p);
      add_linear (b, STOW_ROLE_MLP, l, h, f, !no_bias, "%s.ffn.down_proj", p);
    }
  add_mpt_norm (b, -1, h, !no_bias, ".norm_f", "transformer");
  add_lm_head (b, "lm_head.weight", V, h, tied);
  return TRUE;
}

/* ---- falcon ------------------------------------------------------------- */

static gboolean
import_falcon (StowModelBuilder *b, JsonObject *o, const char *type,
               GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0, f = 0, k = 0, n_ln = 0;
  /* Legacy RefinedWeb (40B-style) configs imply the new architecture. */
  gboolean new_arch = g_str_equal (type, "RefinedWeb");
  gboolean multi_query = TRUE, parallel_attn = TRUE, bias = FALSE;
  gboolean tied = TRUE;

  if (!REQ (o, b, &h, "hidden_size", "n_embed")
      || !REQ (o, b, &L, "num_hidden_layers", "n_layer")
      || !REQ (o, b, &a, "num_attention_heads", "n_head")
      || !REQ (o, b, &V, "vocab_size")
      || !get_bool (o, b->where, "new_decoder_architecture", &new_arch, error)
      || !get_bool (o, b->where, "multi_query", &multi_query, error)
      || !get_bool (o, b->where, "parallel_attn", &parallel_attn, error)
      || !get_bool (o, b->where, "bias", &bias, error)
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error))
    return FALSE;
  if (!mul_checked (b, 4, h, &f, "4 x hidden_size", error)
      || !OPT (o, b, &f, "ffn_hidden_size"))
    return FALSE;
  /* Three ways to count kv heads (FalconAttention): the new decoder
   * architecture reads num_kv_heads, multi-query has one, else one per
   * query head. */
  if (new_arch)
    {
      k = a;
      if (!OPT (o, b, &k, "num_kv_heads", "n_head_kv"))
        return FALSE;
    }
  else
    k = multi_query ? 1 : a;
  if (!check_dims (b, h, L, a, k, "num_kv_heads", FALSE, error))
    return FALSE;
  n_ln = new_arch ? 2 : 1;
  if (new_arch && !OPT (o, b, &n_ln, "num_ln_in_parallel_attn"))
    return FALSE;

  guint64 d = h / a;
  set_dims (m, h, L, a, k, d, f, V);
  m->linear_bias = bias;
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_LAYERNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "transformer.word_embeddings.weight");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "transformer.h.%d", l);
      if (new_arch && n_ln == 2)
        {
          add_norm (b, l, h, "%s.ln_attn", p);
          add_norm (b, l, h, "%s.ln_mlp", p);
        }
      else
        {
          add_norm (b, l, h, "%s.input_layernorm", p);
        }
      add_fused_attention (b, l, h, (a + 2 * k) * d, bias, "%s.self_attention",
                           p);
      if (!new_arch && !parallel_attn)
        {
          add_norm (b, l, h, "%s.post_attention_layernorm", p);
        }
      add_h_to_4h_mlp (b, l, h, f, bias, p);
    }
  add_norm (b, -1, h, "transformer.ln_f");
  add_lm_head (b, "lm_head.weight", V, h, tied);
  return TRUE;
}

/* ---- bloom -------------------------------------------------------------- */

static gboolean
import_bloom (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0;

  if (!REQ (o, b, &h, "hidden_size", "n_embed")
      || !REQ (o, b, &L, "n_layer", "num_hidden_layers")
      || !REQ (o, b, &a, "n_head", "num_attention_heads")
      || !REQ (o, b, &V, "vocab_size"))
    return FALSE;
  if (!check_layers (b, "n_layer", L, error)
      || !check_heads (b, h, "hidden_size", a, "n_head", a, "n_head", FALSE,
                       error))
    return FALSE;

  set_dims (m, h, L, a, a, h / a, 4 * h, V); /* ffn fixed in BloomMLP */
  m->rope_free = TRUE;                       /* ALiBi */
  m->linear_bias = TRUE;
  m->tied_embeddings = TRUE;
  m->norm = STOW_NORM_LAYERNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "transformer.word_embeddings.weight");
  add_norm (b, -1, h, "transformer.word_embeddings_layernorm");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      g_snprintf (p, sizeof p, "transformer.h.%d", l);
      add_norm (b, l, h, "%s.input_layernorm", p);
      add_fused_attention (b, l, h, 3 * h, TRUE, "%s.self_attention", p);
      add_norm (b, l, h, "%s.post_attention_layernorm", p);
      add_h_to_4h_mlp (b, l, h, 4 * h, TRUE, p);
    }
  add_norm (b, -1, h, "transformer.ln_f");
  add_lm_head (b, "lm_head.weight", V, h, TRUE);
  return TRUE;
}

/* ---- opt ---------------------------------------------------------------- */

static gboolean
import_opt (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0, P = 0, f = 0, p = 0;
  gboolean ln_before = TRUE, remove_final = FALSE, bias = TRUE, tied = TRUE;

  if (!read_dims (b, o, "ffn_dim", &h, &L, &a, &f, &V, error)
      || !REQ (o, b, &P, "max_position_embeddings"))
    return FALSE;
  p = h;
  if (!OPT (o, b, &p, "word_embed_proj_dim")
      || !get_bool (o, b->where, "do_layer_norm_before", &ln_before, error)
      || !get_bool (o, b->where, "_remove_final_layer_norm", &remove_final,
                    error)
      || !get_bool (o, b->where, "enable_bias", &bias, error)
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error))
    return FALSE;
  if (!check_dims (b, h, L, a, a, "num_attention_heads", FALSE, error))
    return FALSE;
  if (P > G_MAXUINT64 - 2)
    return E_INVALID (error, "%s: max_position_embeddings is absurd", b->where);

  set_dims (m, h, L, a, a, h / a, f, V);
  m->max_positions = P;
  m->linear_bias = bias;
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_LAYERNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, p,
                         "model.decoder.embed_tokens.weight");
  /* OPTLearnedPositionalEmbedding keeps 2 extra rows (a fairseq offset). */
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, P + 2, h,
                         "model.decoder.embed_positions.weight");
  /* The final LayerNorm exists only with pre-LN (opt-350m is post-LN). */
  if (ln_before && !remove_final)
    add_norm (b, -1, h, "model.decoder.final_layer_norm");
  if (p != h)
    {
      stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, p, h,
                             "model.decoder.project_out.weight");
      stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, h, p,
                             "model.decoder.project_in.weight");
    }
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char pre[96];
      g_snprintf (pre, sizeof pre, "model.decoder.layers.%d", l);
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, bias, "%s.self_attn.k_proj",
                  pre);
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, bias, "%s.self_attn.v_proj",
                  pre);
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, bias, "%s.self_attn.q_proj",
                  pre);
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, bias,
                  "%s.self_attn.out_proj", pre);
      add_norm (b, l, h, "%s.self_attn_layer_norm", pre);
      add_linear (b, STOW_ROLE_MLP, l, f, h, bias, "%s.fc1", pre);
      add_linear (b, STOW_ROLE_MLP, l, h, f, bias, "%s.fc2", pre);
      add_norm (b, l, h, "%s.final_layer_norm", pre);
    }
  add_lm_head (b, "lm_head.weight", V, p, tied);
  return TRUE;
}

/* ---- t5 ----------------------------------------------------------------- */

static void
add_t5_attention (StowModelBuilder *b, gint l, guint64 d, guint64 inner,
                  const char *prefix)
{
  stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, inner, d,
                         "%s.q.weight", prefix);
  stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, inner, d,
                         "%s.k.weight", prefix);
  stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, inner, d,
                         "%s.v.weight", prefix);
  stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, d, inner,
                         "%s.o.weight", prefix);
}

static void
add_t5_ff (StowModelBuilder *b, gint l, guint64 d, guint64 ff, gboolean gated,
           const char *prefix)
{
  if (gated)
    {
      stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, ff, d,
                             "%s.DenseReluDense.wi_0.weight", prefix);
      stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, ff, d,
                             "%s.DenseReluDense.wi_1.weight", prefix);
    }
  else
    stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, ff, d,
                           "%s.DenseReluDense.wi.weight", prefix);
  stow_model_add_tensor (b, STOW_ROLE_MLP, l, FALSE, 2, d, ff,
                         "%s.DenseReluDense.wo.weight", prefix);
  stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                         "%s.layer_norm.weight", prefix);
}

static gboolean
import_t5 (StowModelBuilder *b, JsonObject *o, gboolean tied, GError **error)
{
  StowModel *m = b->model;
  guint64 d = 0, dkv = 64, a = 0, ff = 0, V = 0, Le = 0, Ld = 0, B = 32, inner;
  const char *proj = "relu";

  if (!REQ (o, b, &d, "d_model") || !OPT (o, b, &dkv, "d_kv")
      || !REQ (o, b, &a, "num_heads") || !REQ (o, b, &ff, "d_ff")
      || !REQ (o, b, &V, "vocab_size") || !REQ (o, b, &Le, "num_layers"))
    return FALSE;
  Ld = Le;
  if (!OPT (o, b, &Ld, "num_decoder_layers")
      || !OPT (o, b, &B, "relative_attention_num_buckets")
      || !stow_json_get_string (o, b->where, "feed_forward_proj", FALSE, &proj,
                                error)
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error))
    return FALSE;
  if (!check_layers (b, "num_layers", Le, error)
      || !check_layers (b, "num_decoder_layers", Ld, error)
      || !check_layers (b, "num_layers + num_decoder_layers", Le + Ld, error))
    return FALSE;
  /* T5 heads need not divide d_model: the inner width is heads x d_kv. */
  if (!mul_checked (b, a, dkv, &inner, "num_heads x d_kv", error))
    return FALSE;
  /* "gated-gelu" (v1.1, flan-T5) has two input projections (GeGLU). */
  gboolean gated = g_str_has_prefix (proj, "gated-");

  set_dims (m, d, Le + Ld, a, a, dkv, ff, V);
  m->n_encoder_layers = Le;
  m->gated_mlp = gated;
  m->ffn_dropout = TRUE; /* T5DenseActDense: wi, act, dropout, wo */
  /* T5Config maps "gated-gelu" to the "gelu_new" activation. */
  m->gelu_new = g_str_equal (proj, "gated-gelu");
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_RMSNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, d,
                         "shared.weight");
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, TRUE, 2, V, d,
                         "encoder.embed_tokens.weight");
  for (guint64 i = 0; i < Le; i++)
    {
      gint l = (gint)i;
      char p[96], q[128];
      g_snprintf (p, sizeof p, "encoder.block.%d.layer", l);
      g_snprintf (q, sizeof q, "%s.0.SelfAttention", p);
      add_t5_attention (b, l, d, inner, q);
      /* Relative position buckets: one table per stack, in block 0. */
      if (i == 0)
        stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, l, FALSE, 2, B, a,
                               "%s.relative_attention_bias.weight", q);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                             "%s.0.layer_norm.weight", p);
      g_snprintf (q, sizeof q, "%s.1", p);
      add_t5_ff (b, l, d, ff, gated, q);
    }
  stow_model_add_tensor (b, STOW_ROLE_NORM, -1, FALSE, 1, d, 0,
                         "encoder.final_layer_norm.weight");
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, TRUE, 2, V, d,
                         "decoder.embed_tokens.weight");
  for (guint64 i = 0; i < Ld; i++)
    {
      gint l = (gint)(Le + i);
      char p[96], q[128];
      g_snprintf (p, sizeof p, "decoder.block.%u.layer", (guint)i);
      g_snprintf (q, sizeof q, "%s.0.SelfAttention", p);
      add_t5_attention (b, l, d, inner, q);
      if (i == 0)
        stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, l, FALSE, 2, B, a,
                               "%s.relative_attention_bias.weight", q);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                             "%s.0.layer_norm.weight", p);
      g_snprintf (q, sizeof q, "%s.1.EncDecAttention", p);
      add_t5_attention (b, l, d, inner, q);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, d, 0,
                             "%s.1.layer_norm.weight", p);
      g_snprintf (q, sizeof q, "%s.2", p);
      add_t5_ff (b, l, d, ff, gated, q);
    }
  stow_model_add_tensor (b, STOW_ROLE_NORM, -1, FALSE, 1, d, 0,
                         "decoder.final_layer_norm.weight");
  add_lm_head (b, "lm_head.weight", V, d, tied);
  return TRUE;
}

/* ---- deepseek_v2 / deepseek_v3 (MLA + MoE) ----------------------------- */

static gboolean
import_deepseek (StowModelBuilder *b, JsonObject *o, const char *type,
                 GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, f = 0, V = 0, k = 0;
  guint64 E = 0, topk = 0, shared = 0, moe_f = 0, first_dense = 0, freq = 1;
  guint64 rq = 0, rkv = 0, nope = 0, rope = 0, vd = 0, qh, kvb, ov;
  const char *topk_method = NULL;
  gboolean tied = FALSE;

  if (!read_dims (b, o, "intermediate_size", &h, &L, &a, &f, &V, error)
      || !REQ (o, b, &rkv, "kv_lora_rank")
      || !REQ (o, b, &nope, "qk_nope_head_dim")
      || !REQ (o, b, &rope, "qk_rope_head_dim")
      || !REQ (o, b, &vd, "v_head_dim"))
    return FALSE;
  k = a;
  /* q_lora_rank null (V2-Lite) means a plain q_proj. */
  if (!OPT (o, b, &k, "num_key_value_heads") || !OPT (o, b, &rq, "q_lora_rank")
      || !OPT (o, b, &E, "n_routed_experts", "num_local_experts")
      || !get_bool (o, b->where, "tie_word_embeddings", &tied, error)
      || !stow_json_get_string (o, b->where, "topk_method", FALSE, &topk_method,
                                error))
    return FALSE;
  if (!check_dims (b, h, L, a, k, "num_key_value_heads", TRUE, error))
    return FALSE;
  if (E > 0)
    {
      if (!REQ (o, b, &topk, "num_experts_per_tok")
          || !REQ (o, b, &moe_f, "moe_intermediate_size")
          || !get_u64 (o, b->where, NAMES ("n_shared_experts"), FALSE, FALSE,
                       &shared, error)
          || !get_u64 (o, b->where, NAMES ("first_k_dense_replace"), FALSE,
                       FALSE, &first_dense, error)
          || !OPT (o, b, &freq, "moe_layer_freq")
          || !check_experts (b, "n_routed_experts", E, L, error))
        return FALSE;
      if (topk > E)
        return E_INVALID (error,
                          "%s: num_experts_per_tok (%" G_GUINT64_FORMAT
                          ") exceeds n_routed_experts (%" G_GUINT64_FORMAT ")",
                          b->where, topk, E);
      if (shared > STOW_MODEL_MAX_EXPERTS)
        return check_experts (b, "n_shared_experts", shared, 1, error);
    }
  if (!mul_checked (b, a, nope + rope, &qh, "heads x q head dim", error)
      || !mul_checked (b, a, nope + vd, &kvb, "heads x kv head dim", error)
      || !mul_checked (b, a, vd, &ov, "heads x v_head_dim", error)
      || !mul_checked (b, shared, moe_f, &shared, "shared expert width", error))
    return FALSE;

  set_dims (m, h, L, a, k, nope + rope, f, V);
  m->gated_mlp = TRUE;
  m->tied_embeddings = tied;
  m->norm = STOW_NORM_RMSNORM;
  m->n_experts = E;
  m->experts_per_token = topk;
  m->n_shared_experts = moe_f ? shared / moe_f : 0;
  m->moe_ffn = moe_f;
  m->first_dense_layers = E ? MIN (first_dense, L) : L;
  m->q_lora_rank = rq;
  m->kv_lora_rank = rkv;
  m->qk_nope_head_dim = nope;
  m->qk_rope_head_dim = rope;
  m->v_head_dim = vd;
  /* V3's aux-loss-free routing keeps a per-expert score correction in the
   * checkpoint (gate.e_score_correction_bias); it is in the published
   * 671,026,419,200. */
  gboolean score_bias
      = (topk_method && g_str_equal (topk_method, "noaux_tc"))
        || (topk_method == NULL && g_str_equal (type, "deepseek_v3"));

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "model.embed_tokens.weight");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      gboolean moe = E > 0 && i >= first_dense && i % freq == 0;
      g_snprintf (p, sizeof p, "model.layers.%d", l);
      if (rq > 0)
        {
          stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, rq, h,
                                 "%s.self_attn.q_a_proj.weight", p);
          stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, rq, 0,
                                 "%s.self_attn.q_a_layernorm.weight", p);
          stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, qh, rq,
                                 "%s.self_attn.q_b_proj.weight", p);
        }
      else
        stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, qh, h,
                               "%s.self_attn.q_proj.weight", p);
      stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, rkv + rope, h,
                             "%s.self_attn.kv_a_proj_with_mqa.weight", p);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, rkv, 0,
                             "%s.self_attn.kv_a_layernorm.weight", p);
      stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, kvb, rkv,
                             "%s.self_attn.kv_b_proj.weight", p);
      stow_model_add_tensor (b, STOW_ROLE_ATTENTION, l, FALSE, 2, h, ov,
                             "%s.self_attn.o_proj.weight", p);
      if (!moe)
        add_gated_mlp (b, STOW_ROLE_MLP, l, h, f, FALSE, "%s.mlp", p);
      else
        {
          for (guint64 e = 0; e < E; e++)
            add_gated_mlp (b, STOW_ROLE_EXPERT, l, h, moe_f, FALSE,
                           "%s.mlp.experts.%u", p, (guint)e);
          stow_model_add_tensor (b, STOW_ROLE_ROUTER, l, FALSE, 2, E, h,
                                 "%s.mlp.gate.weight", p);
          if (score_bias)
            stow_model_add_tensor (b, STOW_ROLE_ROUTER, l, FALSE, 1, E, 0,
                                   "%s.mlp.gate.e_score_correction_bias", p);
          /* Shared experts are one MLP of width n_shared x moe_f. */
          if (shared > 0)
            add_gated_mlp (b, STOW_ROLE_MLP, l, h, shared, FALSE,
                           "%s.mlp.shared_experts", p);
        }
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                             "%s.input_layernorm.weight", p);
      stow_model_add_tensor (b, STOW_ROLE_NORM, l, FALSE, 1, h, 0,
                             "%s.post_attention_layernorm.weight", p);
    }
  stow_model_add_tensor (b, STOW_ROLE_NORM, -1, FALSE, 1, h, 0,
                         "model.norm.weight");
  add_lm_head (b, "lm_head.weight", V, h, tied);
  return TRUE;
}

/* ---- bert (encoder only) ------------------------------------------------- */

/* BertModel as the BertFor* heads save it ("bert." prefix): word, position
 * and token-type embeddings with a LayerNorm, post-norm layers with biases
 * everywhere, and the pooler.  No language-model head: the classification
 * heads are a few thousand parameters and the MLM head is tied. */
static gboolean
import_bert (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  guint64 h = 0, L = 0, a = 0, V = 0, f = 0, P = 512, T = 2;

  if (!read_dims (b, o, "intermediate_size", &h, &L, &a, &f, &V, error)
      || !OPT (o, b, &P, "max_position_embeddings")
      || !OPT (o, b, &T, "type_vocab_size"))
    return FALSE;
  if (!check_dims (b, h, L, a, a, "num_attention_heads", FALSE, error))
    return FALSE;

  set_dims (m, h, L, a, a, h / a, f, V);
  m->max_positions = P;
  m->linear_bias = TRUE;
  m->no_lm_head = TRUE;
  m->norm = STOW_NORM_LAYERNORM;

  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, V, h,
                         "bert.embeddings.word_embeddings.weight");
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, P, h,
                         "bert.embeddings.position_embeddings.weight");
  stow_model_add_tensor (b, STOW_ROLE_EMBEDDING, -1, FALSE, 2, T, h,
                         "bert.embeddings.token_type_embeddings.weight");
  add_norm (b, -1, h, "bert.embeddings.LayerNorm");
  for (guint64 i = 0; i < L; i++)
    {
      gint l = (gint)i;
      char p[96];
      static const char *const qkv[] = { "query", "key", "value" };
      g_snprintf (p, sizeof p, "bert.encoder.layer.%d", l);
      for (guint k = 0; k < 3; k++)
        {
          add_linear (b, STOW_ROLE_ATTENTION, l, h, h, TRUE,
                      "%s.attention.self.%s", p, qkv[k]);
        }
      add_linear (b, STOW_ROLE_ATTENTION, l, h, h, TRUE,
                  "%s.attention.output.dense", p);
      add_norm (b, l, h, "%s.attention.output.LayerNorm", p);
      add_linear (b, STOW_ROLE_MLP, l, f, h, TRUE, "%s.intermediate.dense", p);
      add_linear (b, STOW_ROLE_MLP, l, h, f, TRUE, "%s.output.dense", p);
      add_norm (b, l, h, "%s.output.LayerNorm", p);
    }
  add_linear (b, STOW_ROLE_HEAD, -1, h, h, TRUE, "bert.pooler.dense");
  return TRUE;
}

/* ---- gemma3 (Gemma3ForConditionalGeneration) ----------------------------- */

/* A copy of @o with @defaults (name, integer value pairs) where @o has
 * none: the multimodal config.json spells out only what differs from the
 * sub-config classes' defaults. */
static JsonObject *
with_defaults (JsonObject *o, const char *const *names, const gint64 *values)
{
  JsonObject *c = json_object_new ();
  if (o)
    {
      g_autoptr (GList) members = json_object_get_members (o);
      for (GList *l = members; l; l = l->next)
        json_object_set_member (
            c, l->data, json_node_copy (json_object_get_member (o, l->data)));
    }
  for (guint i = 0; names[i]; i++)
    if (!stow_json_has (c, names[i]))
      json_object_set_int_member (c, names[i], values[i]);
  return c;
}

/* Gemma 3 (4B, 12B, 27B): the gemma3_text decoder under
 * "language_model.", a SigLIP vision tower and the projector between
 * them (modeling_gemma3.py, modeling_siglip.py).  Absent fields take the
 * defaults of Gemma3TextConfig and SiglipVisionConfig.  The vision tower
 * counts as input-side (embedding) parameters: it runs before the first
 * decoder layer, on the first pipeline stage. */
static gboolean
import_gemma3 (StowModelBuilder *b, JsonObject *o, GError **error)
{
  static const char *const text_names[] = { "vocab_size",
                                            "hidden_size",
                                            "intermediate_size",
                                            "num_hidden_layers",
                                            "num_attention_heads",
                                            "num_key_value_heads",
                                            "head_dim",
                                            NULL };
  static const gint64 text_values[] = { 262208, 2304, 9216, 26, 8, 4, 256 };
  static const char *const vision_names[]
      = { "hidden_size",       "intermediate_size",
          "num_hidden_layers", "num_attention_heads",
          "num_channels",      "image_size",
          "patch_size",        NULL };
  static const gint64 vision_values[] = { 768, 3072, 12, 12, 3, 224, 16 };
  JsonObject *tc = NULL, *vc = NULL;
  guint64 vh = 0, vf = 0, vL = 0, va = 0, ch = 0, img = 0, patch = 0, th = 0;
  if (!stow_json_get_object (o, b->where, "text_config", FALSE, &tc, error)
      || !stow_json_get_object (o, b->where, "vision_config", FALSE, &vc,
                                error))
    return FALSE;
  g_autoptr (JsonObject) text = with_defaults (tc, text_names, text_values);
  g_autoptr (JsonObject) vision
      = with_defaults (vc, vision_names, vision_values);
  g_autofree char *tw = g_strdup_printf ("%s: text_config", b->where);
  g_autofree char *vw = g_strdup_printf ("%s: vision_config", b->where);
  const char *where = b->where;
  b->where = tw;
  gboolean ok
      = import_llama_like (b, text, "gemma3_text", "language_model.", error);
  b->where = where;
  if (!ok)
    return FALSE;
  th = b->model->hidden;

  b->where = vw;
  ok = REQ (vision, b, &vh, "hidden_size")
       && REQ (vision, b, &vf, "intermediate_size")
       && REQ (vision, b, &vL, "num_hidden_layers")
       && REQ (vision, b, &va, "num_attention_heads")
       && REQ (vision, b, &ch, "num_channels")
       && REQ (vision, b, &img, "image_size")
       && REQ (vision, b, &patch, "patch_size")
       && check_layers (b, "num_hidden_layers", vL, error)
       && check_heads (b, vh, "hidden_size", va, "num_attention_heads", va,
                       "num_attention_heads", FALSE, error);
  if (ok && img % patch != 0)
    ok = E_INVALID (error,
                    "%s: patch_size (%" G_GUINT64_FORMAT
                    ") must divide image_size (%" G_GUINT64_FORMAT ")",
                    vw, patch, img);
  b->where = where;
  if (!ok)
    return FALSE;
  guint64 n_patches = (img / patch) * (img / patch);
  const StowTensorRole E = STOW_ROLE_EMBEDDING;
#define VT "vision_tower.vision_model."
  /* Conv2d(channels, vh, patch, patch), stored as [vh, channels x patch^2]. */
  stow_model_add_tensor (b, E, -1, FALSE, 2, vh, ch * patch * patch,
                         VT "embeddings.patch_embedding.weight");
  stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0,
                         VT "embeddings.patch_embedding.bias");
  stow_model_add_tensor (b, E, -1, FALSE, 2, n_patches, vh,
                         VT "embeddings.position_embedding.weight");
  for (guint64 i = 0; i < vL; i++)
    {
      char p[96];
      g_snprintf (p, sizeof p, VT "encoder.layers.%u", (guint)i);
      static const char *const ln[] = { "layer_norm1", "layer_norm2" };
      static const char *const proj[]
          = { "q_proj", "k_proj", "v_proj", "out_proj" };
      stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, "%s.%s.weight", p,
                             ln[0]);
      stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, "%s.%s.bias", p, ln[0]);
      for (guint j = 0; j < G_N_ELEMENTS (proj); j++)
        {
          stow_model_add_tensor (b, E, -1, FALSE, 2, vh, vh,
                                 "%s.self_attn.%s.weight", p, proj[j]);
          stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0,
                                 "%s.self_attn.%s.bias", p, proj[j]);
        }
      stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, "%s.%s.weight", p,
                             ln[1]);
      stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, "%s.%s.bias", p, ln[1]);
      stow_model_add_tensor (b, E, -1, FALSE, 2, vf, vh, "%s.mlp.fc1.weight",
                             p);
      stow_model_add_tensor (b, E, -1, FALSE, 1, vf, 0, "%s.mlp.fc1.bias", p);
      stow_model_add_tensor (b, E, -1, FALSE, 2, vh, vf, "%s.mlp.fc2.weight",
                             p);
      stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, "%s.mlp.fc2.bias", p);
    }
  stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, VT "post_layernorm.weight");
  stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0, VT "post_layernorm.bias");
#undef VT
  /* Gemma3MultiModalProjector: a plain [vh, th] matrix and an RMSNorm. */
  stow_model_add_tensor (b, E, -1, FALSE, 2, vh, th,
                         "multi_modal_projector.mm_input_projection_weight");
  stow_model_add_tensor (b, E, -1, FALSE, 1, vh, 0,
                         "multi_modal_projector.mm_soft_emb_norm.weight");
  return TRUE;
}

/* ---- dispatch ----------------------------------------------------------- */

static const char *const llama_like[]
    = { "llama",     "mistral", "mixtral", "qwen2",       "qwen3",
        "qwen3_moe", "gemma",   "gemma2",  "gemma3_text", "phi3" };

gboolean
stow_model_import (StowModelBuilder *b, JsonObject *o, const char *type,
                   GError **error)
{
  for (guint i = 0; i < G_N_ELEMENTS (llama_like); i++)
    if (g_str_equal (type, llama_like[i]))
      return import_llama_like (b, o, type, "", error);
  if (g_str_equal (type, "gemma3"))
    return import_gemma3 (b, o, error);
  if (g_str_equal (type, "gpt2"))
    return import_gpt2 (b, o, error);
  if (g_str_equal (type, "gpt_neox"))
    return import_gpt_neox (b, o, error);
  if (g_str_equal (type, "falcon") || g_str_equal (type, "RefinedWeb")
      || g_str_equal (type, "RefinedWebModel"))
    return import_falcon (b, o, type, error);
  if (g_str_equal (type, "bloom"))
    return import_bloom (b, o, error);
  if (g_str_equal (type, "mpt"))
    return import_mpt (b, o, error);
  if (g_str_equal (type, "opt"))
    return import_opt (b, o, error);
  /* mT5 (mt0) is T5 v1.1 with its own config class, whose
   * tie_word_embeddings defaults to false. */
  if (g_str_equal (type, "t5") || g_str_equal (type, "mt5"))
    return import_t5 (b, o, g_str_equal (type, "t5"), error);
  if (g_str_equal (type, "bert"))
    return import_bert (b, o, error);
  if (g_str_equal (type, "deepseek_v2") || g_str_equal (type, "deepseek_v3"))
    return import_deepseek (b, o, type, error);

  /* Many newer decoders are llama with a new name; count them as llama
   * when they carry llama's fields, and say so. */
  static const char *const fields[]
      = { "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size", "vocab_size" };
  for (guint i = 0; i < G_N_ELEMENTS (fields); i++)
    if (!stow_json_has (o, fields[i]))
      {
        g_autofree char *esc = g_strescape (type, NULL);
        g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_UNSUPPORTED,
                     "%s: model_type \"%.60s\" is not supported (and has no "
                     "%s for a llama-like import); supported: llama, "
                     "mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, "
                     "gemma2, gemma3, gemma3_text, phi3, gpt2, "
                     "gpt_neox, falcon, bloom, mpt, opt, t5, mt5, bert, "
                     "deepseek_v2, deepseek_v3",
                     b->where, esc, fields[i]);
        return FALSE;
      }
  /* A llama-like import would drop the experts of an unknown MoE. */
  static const char *const moe_fields[]
      = { "num_experts", "num_local_experts", "n_routed_experts",
          "moe_intermediate_size" };
  for (guint i = 0; i < G_N_ELEMENTS (moe_fields); i++)
    if (stow_json_has (o, moe_fields[i]))
      {
        g_autofree char *esc = g_strescape (type, NULL);
        g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_UNSUPPORTED,
                     "%s: model_type \"%.60s\" is not supported: it has "
                     "mixture-of-experts fields (%s) that a llama-like import "
                     "would not count",
                     b->where, esc, moe_fields[i]);
        return FALSE;
      }
  {
    g_autofree char *esc = g_strescape (type, NULL);
    g_warning ("%s: model_type \"%.60s\" is not known; counting it as a "
               "llama-style decoder from its standard fields",
               b->where, esc);
  }
  return import_llama_like (b, o, "llama", "", error);
}
