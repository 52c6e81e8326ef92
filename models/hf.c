/* SPDX-License-Identifier: MIT
 *
 * models/hf.c: HuggingFace config.json -> tensor inventory, one table entry
 * per model family (families[], at the end) read and built by one importer.
 * Field names, defaults and tensor names follow the
 * transformers configuration and modeling code of each family (see
 * /work/shared/reference/ecosystem.md section 1.1 for the field table and
 * 1.2 for the count formulas the inventories reproduce).  Only shapes are
 * produced here; model.c turns them into counts.
 */
#include "models/model-private.h"

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

/* A linear layer out x in, with an optional bias (the router's counts as
 * router). */
static void
add_linear (StowModelBuilder *b, StowTensorRole role, gint layer, guint64 out,
            guint64 in, gboolean bias, const char *name)
{
  stow_model_add_tensor (b, role, layer, FALSE, 2, out, in, "%s.weight", name);
  if (bias)
    stow_model_add_tensor (
        b, role == STOW_ROLE_ROUTER ? STOW_ROLE_ROUTER : STOW_ROLE_BIAS, layer,
        FALSE, 1, out, 0, "%s.bias", name);
}

/* GPT-2's Conv1D stores weights as in x out. */
static void
add_conv1d (StowModelBuilder *b, StowTensorRole role, gint layer, guint64 in,
            guint64 out, const char *name)
{
  stow_model_add_tensor (b, role, layer, FALSE, 2, in, out, "%s.weight", name);
  stow_model_add_tensor (b, STOW_ROLE_BIAS, layer, FALSE, 1, out, 0, "%s.bias",
                         name);
}

/* What running a llama-like model needs: rope_theta, rms_norm_eps,
 * hidden_act, initializer_range (HF LlamaConfig's defaults) and Llama 3's
 * rope_scaling.  transformers 5 writes rope_theta and the scaling into one
 * rope_parameters object instead ({"rope_theta": ..., "rope_type":
 * "llama3", "factor": ...}); either form is read, the top level's first. */
static gboolean
read_runtime (StowModelBuilder *b, JsonObject *o, GError **error)
{
  StowModel *m = b->model;
  const char *act = "silu";
  m->rope_theta = 10000.0;
  m->norm_eps = 1e-6;
  m->initializer_range = 0.02;
  JsonObject *rp = NULL;
  g_autofree char *rpw = g_strdup_printf ("%s: rope_parameters", b->where);
  if (stow_json_has (o, "rope_parameters")
      && (!stow_json_get_object (o, b->where, "rope_parameters", FALSE, &rp,
                                 error)
          || !stow_json_get_double (rp, rpw, "rope_theta", FALSE,
                                    &m->rope_theta, error)))
    return FALSE;
  if (!stow_json_get_double (o, b->where, "rope_theta", FALSE, &m->rope_theta,
                             error)
      || !stow_json_get_double (o, b->where, "rms_norm_eps", FALSE,
                                &m->norm_eps, error)
      || !stow_json_get_double (o, b->where, "initializer_range", FALSE,
                                &m->initializer_range, error)
      || !stow_json_get_string (o, b->where, "hidden_act", FALSE, &act, error))
    return FALSE;
  if (!(m->rope_theta > 0) || !(m->norm_eps > 0)
      || !(m->initializer_range >= 0))
    return E_INVALID (error,
                      "%s: rope_theta (%g), rms_norm_eps (%g) and "
                      "initializer_range (%g) must be positive",
                      b->where, m->rope_theta, m->norm_eps,
                      m->initializer_range);
  m->hidden_act = g_strdup (act);
  JsonObject *rs = NULL;
  const char *rp_type = NULL;
  if (rp != NULL
      && !stow_json_get_string (rp, rpw, "rope_type", FALSE, &rp_type, error))
    return FALSE;
  /* rope_parameters of a scaled rope stand for rope_scaling. */
  gboolean scaled_rp = !stow_json_has (o, "rope_scaling") && rp_type != NULL
                       && !g_str_equal (rp_type, "default");
  if (stow_json_has (o, "rope_scaling") || scaled_rp)
    {
      const char *key = scaled_rp ? "rope_parameters" : "rope_scaling";
      g_autofree char *w = g_strdup_printf ("%s: %s", b->where, key);
      const char *type = NULL;
      if (!stow_json_get_object (o, b->where, key, FALSE, &rs, error)
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
      if (!stow_json_get_double (rs, w, "factor", FALSE, &m->rope_factor, error)
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

/* ---- how a family is described ------------------------------------------ */

/* A family is one entry of the table at the end of this file: the
 * model_type values it serves, its config fields (every alias of each size,
 * in the order the family's importer always read them, so the first error
 * a config gets stays the same), its defaults and switches (flags), and its
 * inventory as a recipe of slots.  One reader and one builder serve every
 * family; what no table says (Falcon's kv heads, MPT's attn_config, T5's
 * second stack, the experts of DeepSeek and Qwen-MoE) is a hook named for
 * what it does. */

/* The sizes fields fill and recipes name.  SZ_NONE is 0 everywhere: a 1-D
 * tensor's missing second dimension. */
typedef enum
{
  SZ_NONE,
  SZ_HIDDEN,
  SZ_LAYERS, /* the layer stack (T5: the encoder's) */
  SZ_HEADS,
  SZ_KV_HEADS,
  SZ_HEAD_DIM, /* 0 unless a field or a hook gives it; then hidden / heads */
  SZ_FFN,
  SZ_VOCAB,
  SZ_POSITIONS,      /* learned position embeddings */
  SZ_TOKEN_TYPES,    /* BERT's token_type_embeddings */
  SZ_EMBED_WIDTH,    /* OPT's word_embed_proj_dim */
  SZ_DECODER_LAYERS, /* T5's second stack */
  SZ_BUCKETS,        /* T5's relative position buckets */
  SZ_EXPERTS,        /* routed experts per MoE layer */
  SZ_TOP_K,
  SZ_MOE_FFN, /* one routed expert's width */
  SZ_SHARED_EXPERTS,
  SZ_FIRST_DENSE, /* DeepSeek's first_k_dense_replace */
  SZ_MOE_EVERY,   /* DeepSeek's moe_layer_freq, Qwen's decoder_sparse_step */
  SZ_Q_LORA,      /* DeepSeek's multi-head latent attention (MLA) */
  SZ_KV_LORA,
  SZ_QK_NOPE,
  SZ_QK_ROPE,
  SZ_V_HEAD_DIM,
  SZ_CHANNELS, /* Gemma 3's SigLIP vision tower */
  SZ_IMAGE,
  SZ_PATCH,
  /* Derived once the checks passed (derive_sizes). */
  SZ_Q,             /* heads x head_dim */
  SZ_KV,            /* kv heads x head_dim */
  SZ_QKV,           /* (heads + 2 kv heads) x head_dim: fused q, k, v */
  SZ_FFN_X2,        /* fused gate and up projections */
  SZ_POSITION_ROWS, /* positions + the family's position_offset */
  SZ_SHARED_FFN,    /* shared experts x expert width: one MLP */
  SZ_MLA_KV_A,      /* kv_lora_rank + qk_rope_head_dim */
  SZ_MLA_KV_B,      /* heads x (qk_nope_head_dim + v_head_dim) */
  SZ_MLA_O,         /* heads x v_head_dim */
  SZ_COUNT
} Size;

/* Switches: a family's defaults, flipped by its boolean fields and hooks;
 * a slot is present or has a bias according to them. */
enum
{
  F_TIED = 1u << 0,         /* lm_head shares the token embedding */
  F_BIAS = 1u << 1,         /* biases on every linear (GPT-2, BLOOM, ...) */
  F_QKV_BIAS = 1u << 2,     /* q, k, v biases the code always has (qwen2) */
  F_ATTN_BIAS = 1u << 3,    /* attention_bias: q, k, v and o */
  F_MLP_BIAS = 1u << 4,     /* mlp_bias */
  F_NO_BIAS = 1u << 5,      /* MPT's no_bias: not even on the norms */
  F_GATED = 1u << 6,        /* a gated MLP (SwiGLU, GeGLU) */
  F_FUSED = 1u << 7,        /* phi3: qkv_proj and gate_up_proj */
  F_QK_NORM = 1u << 8,      /* a norm on q and on k */
  F_SANDWICH = 1u << 9,     /* Gemma 2: norms before and after each block */
  F_MOE = 1u << 10,         /* routed experts, in the layers moe_layer picks */
  F_MOE_LAYER = 1u << 11,   /* (per layer) this one has them */
  F_FIRST = 1u << 12,       /* (per layer) the first of its stack */
  F_LEARNED_POS = 1u << 13, /* a learned position table */
  F_ROPE_FREE = 1u << 14,   /* no rotary embedding (ALiBi, none) */
  F_NO_LM_HEAD = 1u << 15,  /* an encoder: no vocabulary logits */
  F_FFN_DROPOUT = 1u << 16, /* T5: dropout inside the MLP */
  F_GELU_NEW = 1u << 17,    /* HF's NewGELUActivation */
  F_NEW_ARCH = 1u << 18,    /* Falcon's new_decoder_architecture */
  F_MULTI_QUERY = 1u << 19, /* Falcon's multi_query: one kv head */
  F_PARALLEL_ATTN = 1u << 20,  /* Falcon's parallel_attn */
  F_TWO_NORMS = 1u << 21,      /* Falcon: ln_attn and ln_mlp */
  F_LN_BEFORE = 1u << 22,      /* OPT's do_layer_norm_before */
  F_NO_FINAL_NORM = 1u << 23,  /* OPT's _remove_final_layer_norm */
  F_PROJECT_EMBED = 1u << 24,  /* OPT: word_embed_proj_dim != hidden_size */
  F_Q_LORA = 1u << 25,         /* MLA: q through q_a_proj and q_b_proj */
  F_SCORE_BIAS = 1u << 26,     /* DeepSeek-V3's e_score_correction_bias */
  F_SHARED_EXPERTS = 1u << 27, /* DeepSeek's n_shared_experts */
};

/* String fields a hook interprets. */
typedef enum
{
  TX_NONE,
  TX_ACTIVATION, /* GPT-2's activation_function, T5's feed_forward_proj */
  TX_TOPK_METHOD,
  TX_COUNT
} Text;

/* One config field, read into a size, a flag, a string or (Qwen-MoE's
 * mlp_only_layers) the layer list; or @include, a list read in its place.
 * When absent a size takes @fallback, or @times x the size @fallback_of
 * (none of them: it is not in the config at all); a flag keeps the
 * family's default. */
typedef struct Field Field;
struct Field
{
  Size size;
  guint flag;
  Text text;
  gboolean layer_list;
  const char *names[4]; /* aliases, first present wins; errors name [0] */
  gboolean required;
  gboolean zero_ok;
  guint64 fallback;
  Size fallback_of;
  guint64 times;
  const char *fallback_text;
  guint when;           /* read only when all these flags are set */
  const Field *include; /* read that list here */
};

typedef enum
{
  SLOT_END,
  SLOT_TENSOR,  /* a plain tensor, named in full */
  SLOT_LINEAR,  /* NAME.weight (rows x cols), NAME.bias */
  SLOT_CONV1D,  /* GPT-2's Conv1D: NAME.weight stored in x out, NAME.bias */
  SLOT_NORM,    /* NAME.weight, and NAME.bias for a LayerNorm */
  SLOT_HEAD,    /* the lm_head: vocab x cols, tied when F_TIED */
  SLOT_GROUP,   /* @each under NAME. */
  SLOT_LAYERS,  /* @each under NAME.i. for each layer i of @count */
  SLOT_EXPERTS, /* @each under NAME.e. for each routed expert */
  SLOT_MOE,     /* the family's MoE block, in this layer */
} SlotKind;

typedef struct Slot Slot;
struct Slot
{
  SlotKind kind;
  const char *name;
  StowTensorRole role;
  Size rows, cols; /* as stored; a norm's width (default hidden) */
  guint bias;      /* a linear's bias is there when any of these is set */
  gboolean tied;   /* shares the token embedding's storage (T5's copies) */
  Size count;      /* SLOT_LAYERS: how many */
  Size first;      /* SLOT_LAYERS: the first one's index in the model */
  const Slot *each;
  guint when, unless; /* there only with all of @when and none of @unless */
};

/* Slots as designated initializers; optional members follow by name. */
/* clang-format off */
#define TENSOR(n, r, rows_, cols_, ...)                                        \
  { .kind = SLOT_TENSOR, .name = n, .role = STOW_ROLE_##r, .rows = rows_,      \
    .cols = cols_, __VA_ARGS__ }
#define LINEAR(n, r, rows_, cols_, ...)                                        \
  { .kind = SLOT_LINEAR, .name = n, .role = STOW_ROLE_##r, .rows = rows_,      \
    .cols = cols_, __VA_ARGS__ }
#define CONV1D(n, r, rows_, cols_, ...)                                        \
  { .kind = SLOT_CONV1D, .name = n, .role = STOW_ROLE_##r, .rows = rows_,      \
    .cols = cols_, __VA_ARGS__ }
#define NORM(n, ...) { .kind = SLOT_NORM, .name = n, __VA_ARGS__ }
#define HEAD(n, cols_, ...)                                                    \
  { .kind = SLOT_HEAD, .name = n, .cols = cols_, __VA_ARGS__ }
#define GROUP(n, recipe, ...)                                                  \
  { .kind = SLOT_GROUP, .name = n, .each = recipe, __VA_ARGS__ }
#define LAYERS(n, count_, recipe, ...)                                         \
  { .kind = SLOT_LAYERS, .name = n, .count = count_, .each = recipe,           \
    __VA_ARGS__ }
#define EXPERTS(n, recipe, ...)                                                \
  { .kind = SLOT_EXPERTS, .name = n, .each = recipe, __VA_ARGS__ }
#define MOE(...) { .kind = SLOT_MOE, __VA_ARGS__ }
#define END { .kind = SLOT_END }
/* clang-format on */

typedef struct Import Import;
typedef gboolean (*ImportHook) (Import *c, GError **error);
typedef struct Family Family;

struct Family
{
  const char *types[3];        /* the model_type values, as advertised */
  const char *legacy_types[3]; /* also accepted, never advertised */
  const Field *fields;         /* read first, in this order */
  guint flags;                 /* defaults */
  StowNormKind norm;
  guint64 position_offset; /* extra rows in the position table */
  /* Also read what running the model needs (read_runtime). */
  gboolean runtime;
  ImportHook derive; /* before the layer and head checks */
  /* The experts' fields, read after the checks when F_MOE is set. */
  const Field *expert_fields;
  ImportHook finish; /* after them */
  /* Whether stack layer @i has the routed experts (all when NULL). */
  gboolean (*moe_layer) (const Import *c, guint64 i);
  const Slot *inventory;
  const Slot *moe; /* what SLOT_MOE builds */
  /* A multimodal wrapper imports itself instead. */
  gboolean (*import) (StowModelBuilder *b, JsonObject *o, GError **error);
};

static const Family *find_family (const char *type);

/* One config.json as a family reads and builds it. */
struct Import
{
  StowModelBuilder *b;
  JsonObject *o;
  const Family *family;
  guint flags;
  StowNormKind norm;
  guint64 size[SZ_COUNT];
  const char *field[SZ_COUNT]; /* the config field each size came from */
  const char *text[TX_COUNT];
  JsonArray *layer_list;
  /* MPT's, between its hooks. */
  double expansion_ratio;
  JsonObject *ffn_config;
};

/* ---- the generic reader and builder ------------------------------------- */

static gboolean
field_end (const Field *f)
{
  return !f->size && !f->flag && !f->text && !f->layer_list && !f->include;
}

static gboolean
read_fields (Import *c, const Field *f, GError **error)
{
  const char *where = c->b->where;
  for (; !field_end (f); f++)
    {
      if ((c->flags & f->when) != f->when)
        continue;
      if (f->include)
        {
          if (!read_fields (c, f->include, error))
            return FALSE;
        }
      else if (f->flag)
        {
          gboolean on = (c->flags & f->flag) != 0;
          if (!get_bool (c->o, where, f->names[0], &on, error))
            return FALSE;
          c->flags = on ? c->flags | f->flag : c->flags & ~f->flag;
        }
      else if (f->text)
        {
          c->text[f->text] = f->fallback_text;
          if (!stow_json_get_string (c->o, where, f->names[0], FALSE,
                                     &c->text[f->text], error))
            return FALSE;
        }
      else if (f->layer_list)
        {
          if (!stow_json_get_array (c->o, where, f->names[0], FALSE,
                                    &c->layer_list, error))
            return FALSE;
        }
      else
        {
          guint64 *v = &c->size[f->size];
          *v = f->fallback_of ? c->size[f->fallback_of] * MAX (f->times, 1)
                              : f->fallback;
          if (f->names[0] == NULL)
            continue;
          c->field[f->size] = f->names[0];
          if (!get_u64 (c->o, where, f->names, f->required, !f->zero_ok, v,
                        error))
            return FALSE;
        }
    }
  return TRUE;
}

/* The layer count, and the heads against the hidden size; messages name
 * the fields the sizes came from (kv heads default to one per head). */
static gboolean
check_shape (Import *c, GError **error)
{
  const guint64 *s = c->size;
  const char *kv_field
      = c->field[SZ_KV_HEADS] ? c->field[SZ_KV_HEADS] : c->field[SZ_HEADS];
  if (s[SZ_KV_HEADS] == 0)
    c->size[SZ_KV_HEADS] = s[SZ_HEADS];
  if (!check_layers (c->b, c->field[SZ_LAYERS], s[SZ_LAYERS], error)
      || !check_heads (c->b, s[SZ_HIDDEN], c->field[SZ_HIDDEN], s[SZ_HEADS],
                       c->field[SZ_HEADS], s[SZ_KV_HEADS], kv_field,
                       s[SZ_HEAD_DIM] != 0, error))
    return FALSE;
  if (s[SZ_HEAD_DIM] == 0)
    c->size[SZ_HEAD_DIM] = s[SZ_HIDDEN] / s[SZ_HEADS];
  return TRUE;
}

/* The expert fields, then how many experts and how many route each token. */
static gboolean
read_experts (Import *c, GError **error)
{
  const guint64 *s = c->size;
  if (!read_fields (c, c->family->expert_fields, error)
      || !check_experts (c->b, c->field[SZ_EXPERTS], s[SZ_EXPERTS],
                         s[SZ_LAYERS], error))
    return FALSE;
  if (s[SZ_TOP_K] > s[SZ_EXPERTS])
    return E_INVALID (error,
                      "%s: %s (%" G_GUINT64_FORMAT
                      ") exceeds %s (%" G_GUINT64_FORMAT ")",
                      c->b->where, c->field[SZ_TOP_K], s[SZ_TOP_K],
                      c->field[SZ_EXPERTS], s[SZ_EXPERTS]);
  return TRUE;
}

/* Every size is at most STOW_MODEL_MAX_DIM (get_u64) and shared experts
 * at most STOW_MODEL_MAX_EXPERTS, so these products stay far inside 64
 * bits; tensor sizes are checked again as they are added. */
static void
derive_sizes (Import *c)
{
  guint64 *s = c->size;
  s[SZ_Q] = s[SZ_HEADS] * s[SZ_HEAD_DIM];
  s[SZ_KV] = s[SZ_KV_HEADS] * s[SZ_HEAD_DIM];
  s[SZ_QKV] = s[SZ_Q] + 2 * s[SZ_KV];
  s[SZ_FFN_X2] = 2 * s[SZ_FFN];
  s[SZ_POSITION_ROWS] = s[SZ_POSITIONS] + c->family->position_offset;
  s[SZ_SHARED_FFN] = s[SZ_SHARED_EXPERTS] * s[SZ_MOE_FFN];
  s[SZ_MLA_KV_A] = s[SZ_KV_LORA] + s[SZ_QK_ROPE];
  s[SZ_MLA_KV_B] = s[SZ_HEADS] * (s[SZ_QK_NOPE] + s[SZ_V_HEAD_DIM]);
  s[SZ_MLA_O] = s[SZ_HEADS] * s[SZ_V_HEAD_DIM];
}

/* The model's shape fields from the sizes and flags (T5's n_layers counts
 * both stacks). */
static void
set_model (const Import *c)
{
  StowModel *m = c->b->model;
  const guint64 *s = c->size;
  guint f = c->flags;
  m->hidden = s[SZ_HIDDEN];
  m->n_layers = s[SZ_LAYERS] + s[SZ_DECODER_LAYERS];
  m->n_encoder_layers = s[SZ_DECODER_LAYERS] ? s[SZ_LAYERS] : 0;
  m->n_heads = s[SZ_HEADS];
  m->n_kv_heads = s[SZ_KV_HEADS];
  m->head_dim = s[SZ_HEAD_DIM];
  m->ffn = s[SZ_FFN];
  m->vocab = s[SZ_VOCAB];
  m->max_positions = (f & F_LEARNED_POS) ? s[SZ_POSITIONS] : 0;
  m->rope_free = (f & F_ROPE_FREE) != 0;
  m->gated_mlp = (f & F_GATED) != 0;
  m->linear_bias = (f & (F_BIAS | F_ATTN_BIAS | F_MLP_BIAS)) != 0;
  m->tied_embeddings = (f & F_TIED) != 0;
  m->no_lm_head = (f & F_NO_LM_HEAD) != 0;
  m->ffn_dropout = (f & F_FFN_DROPOUT) != 0;
  m->gelu_new = (f & F_GELU_NEW) != 0;
  m->norm = c->norm;
  m->qkv_bias = (f & (F_QKV_BIAS | F_ATTN_BIAS)) != 0;
  m->o_bias = (f & F_ATTN_BIAS) != 0;
  m->mlp_bias = (f & F_MLP_BIAS) != 0;
  m->n_experts = s[SZ_EXPERTS];
  m->experts_per_token = s[SZ_TOP_K];
  m->n_shared_experts = s[SZ_SHARED_EXPERTS];
  m->moe_ffn = s[SZ_MOE_FFN];
  m->q_lora_rank = s[SZ_Q_LORA];
  m->kv_lora_rank = s[SZ_KV_LORA];
  m->qk_nope_head_dim = s[SZ_QK_NOPE];
  m->qk_rope_head_dim = s[SZ_QK_ROPE];
  m->v_head_dim = s[SZ_V_HEAD_DIM];
}

#define NAME_MAX_LEN 192

/* Adds the slots of @recipe that @flags select, in order, named under
 * @scope ("", "model.layers.3."); @layer is -1 outside the layer stack. */
static void
build (const Import *c, const Slot *recipe, const char *scope, gint layer,
       guint flags)
{
  StowModelBuilder *b = c->b;
  for (const Slot *s = recipe; s->kind != SLOT_END; s++)
    {
      char name[NAME_MAX_LEN], inner[NAME_MAX_LEN];
      guint64 rows = c->size[s->rows], cols = c->size[s->cols];
      if ((flags & s->when) != s->when || (flags & s->unless) != 0)
        continue;
      g_snprintf (name, sizeof name, "%s%s", scope, s->name ? s->name : "");
      switch (s->kind)
        {
        case SLOT_TENSOR:
          stow_model_add_tensor (b, s->role, layer, s->tied, s->cols ? 2 : 1,
                                 rows, cols, "%s", name);
          break;
        case SLOT_LINEAR:
          add_linear (b, s->role, layer, rows, cols, (flags & s->bias) != 0,
                      name);
          break;
        case SLOT_CONV1D:
          add_conv1d (b, s->role, layer, rows, cols, name);
          break;
        case SLOT_NORM:
          rows = s->rows ? rows : c->size[SZ_HIDDEN];
          stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, rows, 0,
                                 "%s.weight", name);
          if (c->norm == STOW_NORM_LAYERNORM && !(flags & F_NO_BIAS))
            stow_model_add_tensor (b, STOW_ROLE_NORM, layer, FALSE, 1, rows, 0,
                                   "%s.bias", name);
          break;
        case SLOT_HEAD:
          add_lm_head (b, name, c->size[SZ_VOCAB], cols, (flags & F_TIED) != 0);
          break;
        case SLOT_GROUP:
          g_snprintf (inner, sizeof inner, "%s.", name);
          build (c, s->each, inner, layer, flags);
          break;
        case SLOT_LAYERS:
          for (guint64 i = 0; i < c->size[s->count]; i++)
            {
              guint lf = flags | (i == 0 ? F_FIRST : 0);
              if ((flags & F_MOE)
                  && (!c->family->moe_layer || c->family->moe_layer (c, i)))
                lf |= F_MOE_LAYER;
              g_snprintf (inner, sizeof inner, "%s.%u.", name, (guint)i);
              build (c, s->each, inner, (gint)(c->size[s->first] + i), lf);
            }
          break;
        case SLOT_EXPERTS:
          for (guint64 e = 0; e < c->size[SZ_EXPERTS]; e++)
            {
              g_snprintf (inner, sizeof inner, "%s.%u.", name, (guint)e);
              build (c, s->each, inner, layer, flags);
            }
          break;
        case SLOT_MOE:
          build (c, c->family->moe, scope, layer, flags);
          break;
        case SLOT_END:
          break;
        }
    }
}

/* The one importer: fields, the family's derivations, the checks, the
 * runtime fields, the experts, the family's remaining fields, then the
 * inventory.  @prefix goes before every tensor name (""; a multimodal
 * wrapper's "language_model."). */
static gboolean
import_family (StowModelBuilder *b, JsonObject *o, const Family *family,
               const char *prefix, GError **error)
{
  Import c = { .b = b,
               .o = o,
               .family = family,
               .flags = family->flags,
               .norm = family->norm };
  if (!read_fields (&c, family->fields, error))
    return FALSE;
  if (c.size[SZ_EXPERTS] > 0)
    c.flags |= F_MOE;
  if ((family->derive && !family->derive (&c, error))
      || !check_shape (&c, error))
    return FALSE;
  if (family->runtime && !read_runtime (b, o, error))
    return FALSE;
  if ((c.flags & F_MOE) && family->expert_fields && !read_experts (&c, error))
    return FALSE;
  if (family->finish && !family->finish (&c, error))
    return FALSE;
  derive_sizes (&c);
  set_model (&c);
  build (&c, family->inventory, prefix, -1, c.flags);
  return TRUE;
}

/* ---- recipes several families share ------------------------------------- */

/* The names most transformers configs use, in the order the importers have
 * always read them. */
static const Field shape_fields[] = {
  { .size = SZ_HIDDEN, .names = { "hidden_size" }, .required = TRUE },
  { .size = SZ_LAYERS, .names = { "num_hidden_layers" }, .required = TRUE },
  { .size = SZ_HEADS, .names = { "num_attention_heads" }, .required = TRUE },
  { 0 },
};

static const Field common_fields[] = {
  { .include = shape_fields },
  { .size = SZ_FFN, .names = { "intermediate_size" }, .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  { 0 },
};

/* The MLP of GPT-NeoX, Falcon and BLOOM. */
static const Slot h_to_4h_mlp[] = {
  LINEAR ("dense_h_to_4h", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("dense_4h_to_h", MLP, SZ_HIDDEN, SZ_FFN, .bias = F_BIAS),
  END,
};

/* LlamaMLP and its kin: gate_proj and up_proj (ffn x hidden), then
 * down_proj; each routed expert of Qwen-MoE and DeepSeek is one of
 * moe_intermediate_size. */
static const Slot gated_mlp[] = {
  LINEAR ("gate_proj", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_MLP_BIAS),
  LINEAR ("up_proj", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_MLP_BIAS),
  LINEAR ("down_proj", MLP, SZ_HIDDEN, SZ_FFN, .bias = F_MLP_BIAS),
  END,
};

static const Slot gated_expert[] = {
  LINEAR ("gate_proj", EXPERT, SZ_MOE_FFN, SZ_HIDDEN),
  LINEAR ("up_proj", EXPERT, SZ_MOE_FFN, SZ_HIDDEN),
  LINEAR ("down_proj", EXPERT, SZ_HIDDEN, SZ_MOE_FFN),
  END,
};

/* ---- llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2,
 * gemma3_text, phi3 ----------------------------------------------------- */

static const Field llama_fields[] = {
  { .include = common_fields },
  { .size = SZ_KV_HEADS,
    .names = { "num_key_value_heads" },
    .fallback_of = SZ_HEADS },
  { .size = SZ_HEAD_DIM, .names = { "head_dim" } },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { .flag = F_ATTN_BIAS, .names = { "attention_bias" } },
  { .flag = F_MLP_BIAS, .names = { "mlp_bias" } },
  { 0 },
};

/* LlamaDecoderLayer, with the switches its descendants add: phi3 fuses
 * q, k, v and gate, up (the same counts); qwen3 and gemma3 RMS-normalise
 * each head's queries and keys (q_norm, k_norm: head_dim weights each);
 * gemma2 and gemma3 norm both sides of each block; mixtral and qwen3_moe
 * route some layers' MLPs to experts.  The qwen2 q/k/v biases are built
 * into its modeling code (no config flag); attention_bias puts biases on
 * all four projections. */
static const Slot llama_layer[] = {
  NORM ("input_layernorm"),
  LINEAR ("self_attn.q_proj", ATTENTION, SZ_Q, SZ_HIDDEN,
          .bias = F_QKV_BIAS | F_ATTN_BIAS, .unless = F_FUSED),
  LINEAR ("self_attn.k_proj", ATTENTION, SZ_KV, SZ_HIDDEN,
          .bias = F_QKV_BIAS | F_ATTN_BIAS, .unless = F_FUSED),
  LINEAR ("self_attn.v_proj", ATTENTION, SZ_KV, SZ_HIDDEN,
          .bias = F_QKV_BIAS | F_ATTN_BIAS, .unless = F_FUSED),
  LINEAR ("self_attn.qkv_proj", ATTENTION, SZ_QKV, SZ_HIDDEN, .when = F_FUSED),
  LINEAR ("self_attn.o_proj", ATTENTION, SZ_HIDDEN, SZ_Q, .bias = F_ATTN_BIAS),
  NORM ("self_attn.q_norm", .rows = SZ_HEAD_DIM, .when = F_QK_NORM),
  NORM ("self_attn.k_norm", .rows = SZ_HEAD_DIM, .when = F_QK_NORM),
  NORM ("post_attention_layernorm"),
  NORM ("pre_feedforward_layernorm", .when = F_SANDWICH),
  NORM ("post_feedforward_layernorm", .when = F_SANDWICH),
  MOE (.when = F_MOE_LAYER),
  LINEAR ("mlp.gate_up_proj", MLP, SZ_FFN_X2, SZ_HIDDEN, .when = F_FUSED),
  LINEAR ("mlp.down_proj", MLP, SZ_HIDDEN, SZ_FFN, .when = F_FUSED),
  GROUP ("mlp", gated_mlp, .unless = F_MOE_LAYER | F_FUSED),
  END,
};

static const Slot llama_inventory[] = {
  TENSOR ("model.embed_tokens.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  LAYERS ("model.layers", SZ_LAYERS, llama_layer),
  NORM ("model.norm"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* Mixtral: every layer routes to num_local_experts full-width experts. */
static const Field mixtral_expert_fields[] = {
  { .size = SZ_EXPERTS, .names = { "num_local_experts" }, .required = TRUE },
  { .size = SZ_TOP_K, .names = { "num_experts_per_tok" }, .required = TRUE },
  { .size = SZ_MOE_FFN, .fallback_of = SZ_FFN },
  { 0 },
};

static const Slot mixtral_expert[] = {
  LINEAR ("w1", EXPERT, SZ_MOE_FFN, SZ_HIDDEN),
  LINEAR ("w2", EXPERT, SZ_HIDDEN, SZ_MOE_FFN),
  LINEAR ("w3", EXPERT, SZ_MOE_FFN, SZ_HIDDEN),
  END,
};

static const Slot mixtral_moe[] = {
  LINEAR ("block_sparse_moe.gate", ROUTER, SZ_EXPERTS, SZ_HIDDEN),
  EXPERTS ("block_sparse_moe.experts", mixtral_expert),
  END,
};

/* Qwen3-MoE: routed experts of moe_intermediate_size in every
 * decoder_sparse_step-th layer not listed in mlp_only_layers, no shared
 * experts (configuration_qwen3_moe.py). */
static const Field qwen3_moe_expert_fields[] = {
  { .size = SZ_EXPERTS, .names = { "num_experts" }, .required = TRUE },
  { .size = SZ_TOP_K, .names = { "num_experts_per_tok" }, .required = TRUE },
  { .size = SZ_MOE_FFN,
    .names = { "moe_intermediate_size" },
    .required = TRUE },
  { .size = SZ_MOE_EVERY, .names = { "decoder_sparse_step" }, .fallback = 1 },
  { .layer_list = TRUE, .names = { "mlp_only_layers" } },
  { 0 },
};

static gboolean
qwen3_moe_check_mlp_only (Import *c, GError **error)
{
  JsonArray *a = c->layer_list;
  for (guint i = 0; a && i < json_array_get_length (a); i++)
    {
      JsonNode *n = json_array_get_element (a, i);
      if (json_node_get_value_type (n) != G_TYPE_INT64
          || json_node_get_int (n) < 0
          || (guint64)json_node_get_int (n) >= c->size[SZ_LAYERS])
        return E_INVALID (error,
                          "%s: mlp_only_layers[%u]: expected a layer "
                          "index below num_hidden_layers (%" G_GUINT64_FORMAT
                          ")",
                          c->b->where, i, c->size[SZ_LAYERS]);
    }
  return TRUE;
}

static gboolean
qwen3_moe_layer (const Import *c, guint64 i)
{
  return (i + 1) % c->size[SZ_MOE_EVERY] == 0
         && !in_int_array (c->layer_list, i);
}

static const Slot qwen3_moe_block[] = {
  LINEAR ("mlp.gate", ROUTER, SZ_EXPERTS, SZ_HIDDEN),
  EXPERTS ("mlp.experts", gated_expert),
  END,
};

/* ---- gpt2 (also GPT-3 and the Megatron GPT shapes) ---------------------- */

static const Field gpt2_fields[] = {
  { .size = SZ_HIDDEN, .names = { "n_embd" }, .required = TRUE },
  { .size = SZ_LAYERS, .names = { "n_layer" }, .required = TRUE },
  { .size = SZ_HEADS, .names = { "n_head" }, .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  { .size = SZ_POSITIONS,
    .names = { "n_positions", "n_ctx" },
    .required = TRUE },
  { .text = TX_ACTIVATION,
    .names = { "activation_function" },
    .fallback_text = "gelu_new" }, /* GPT2Config's default */
  { .size = SZ_FFN,
    .names = { "n_inner" },
    .fallback_of = SZ_HIDDEN,
    .times = 4 },
  { 0 },
};

static gboolean
gpt2_activation (Import *c, GError **error)
{
  if (g_str_equal (c->text[TX_ACTIVATION], "gelu_new"))
    c->flags |= F_GELU_NEW;
  return TRUE;
}

/* Conv1D weights as stored: in x out. */
static const Slot gpt2_block[] = {
  NORM ("ln_1"),
  CONV1D ("attn.c_attn", ATTENTION, SZ_HIDDEN, SZ_QKV),
  CONV1D ("attn.c_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN),
  NORM ("ln_2"),
  CONV1D ("mlp.c_fc", MLP, SZ_HIDDEN, SZ_FFN),
  CONV1D ("mlp.c_proj", MLP, SZ_FFN, SZ_HIDDEN),
  END,
};

/* Names as GPT2LMHeadModel saves them ("transformer." prefix; the
 * original hub files omit it). */
static const Slot gpt2_inventory[] = {
  TENSOR ("transformer.wte.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  TENSOR ("transformer.wpe.weight", EMBEDDING, SZ_POSITION_ROWS, SZ_HIDDEN),
  LAYERS ("transformer.h", SZ_LAYERS, gpt2_block),
  NORM ("transformer.ln_f"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- gpt_neox (Pythia, GPT-NeoX-20B) ------------------------------------ */

static const Field gpt_neox_fields[] = {
  { .include = common_fields },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { 0 },
};

/* Both norms first (parallel residual), then the fused attention. */
static const Slot gpt_neox_layer[] = {
  NORM ("input_layernorm"),
  NORM ("post_attention_layernorm"),
  LINEAR ("attention.query_key_value", ATTENTION, SZ_QKV, SZ_HIDDEN,
          .bias = F_BIAS),
  LINEAR ("attention.dense", ATTENTION, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  GROUP ("mlp", h_to_4h_mlp),
  END,
};

static const Slot gpt_neox_inventory[] = {
  TENSOR ("gpt_neox.embed_in.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  LAYERS ("gpt_neox.layers", SZ_LAYERS, gpt_neox_layer),
  NORM ("gpt_neox.final_layer_norm"),
  HEAD ("embed_out.weight", SZ_HIDDEN), /* no bias */
  END,
};

/* ---- mpt (MosaicML MPT: llm-foundry's MPTConfig) ----------------------- */

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
static const Field mpt_fields[] = {
  { .size = SZ_HIDDEN, .names = { "d_model" }, .required = TRUE },
  { .size = SZ_LAYERS, .names = { "n_layers" }, .required = TRUE },
  { .size = SZ_HEADS, .names = { "n_heads" }, .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .fallback = 50368 },
  { .size = SZ_POSITIONS, .names = { "max_seq_len" }, .fallback = 2048 },
  { 0 },
};

/* MPT's switches, attn_config (the kv heads) and norm_type; ffn_config's
 * type here, its width after the checks (mpt_ffn_width). */
static gboolean
mpt_config (Import *c, GError **error)
{
  JsonObject *o = c->o, *attn = NULL;
  const char *where = c->b->where;
  gboolean no_bias = FALSE, learned = TRUE, tied = TRUE, alibi = FALSE,
           rope = FALSE, qk_ln = FALSE;
  const char *norm = "low_precision_layernorm",
             *attn_type = "multihead_attention", *ffn_type = "mptmlp";
  g_autofree char *attn_where = g_strdup_printf ("%s: attn_config", where);
  g_autofree char *ffn_where = g_strdup_printf ("%s: ffn_config", where);
  guint64 k = 0;

  c->expansion_ratio = 4.0;
  if (!stow_json_get_double (o, where, "expansion_ratio", FALSE,
                             &c->expansion_ratio, error)
      || !get_bool (o, where, "no_bias", &no_bias, error)
      || !get_bool (o, where, "learned_pos_emb", &learned, error)
      || !get_bool (o, where, "tie_word_embeddings", &tied, error)
      || !stow_json_get_string (o, where, "norm_type", FALSE, &norm, error)
      || !stow_json_get_object (o, where, "attn_config", FALSE, &attn, error)
      || !stow_json_get_object (o, where, "ffn_config", FALSE, &c->ffn_config,
                                error))
    return FALSE;
  if (attn
      && (!stow_json_get_string (attn, attn_where, "attn_type", FALSE,
                                 &attn_type, error)
          || !get_bool (attn, attn_where, "alibi", &alibi, error)
          || !get_bool (attn, attn_where, "rope", &rope, error)
          || !get_bool (attn, attn_where, "qk_ln", &qk_ln, error)))
    return FALSE;
  if (c->ffn_config
      && !stow_json_get_string (c->ffn_config, ffn_where, "ffn_type", FALSE,
                                &ffn_type, error))
    return FALSE;

  if (g_str_equal (attn_type, "multihead_attention"))
    k = c->size[SZ_HEADS];
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
    c->flags |= F_GATED;
  else if (!g_str_equal (ffn_type, "mptmlp"))
    {
      g_autofree char *esc = g_strescape (ffn_type, NULL);
      return E_INVALID (error,
                        "%s: ffn_type \"%.60s\" is not supported (expected "
                        "mptmlp or mptglu)",
                        ffn_where, esc);
    }
  if (g_str_has_suffix (norm, "rmsnorm"))
    c->norm = STOW_NORM_RMSNORM;
  else if (g_str_has_suffix (norm, "layernorm"))
    c->norm = STOW_NORM_LAYERNORM;
  else
    {
      g_autofree char *esc = g_strescape (norm, NULL);
      return E_INVALID (error,
                        "%s: norm_type \"%.60s\" is not supported (expected a "
                        "layernorm or an rmsnorm kind)",
                        where, esc);
    }
  c->size[SZ_KV_HEADS] = k;
  c->field[SZ_KV_HEADS] = "kv_n_heads";
  /* llm-foundry drops every bias parameter with no_bias, the norms' too. */
  c->flags |= no_bias ? F_NO_BIAS : F_BIAS;
  c->flags |= (learned ? F_LEARNED_POS : 0) | (tied ? F_TIED : 0)
              | (rope ? 0 : F_ROPE_FREE) | (qk_ln ? F_QK_NORM : 0);
  (void)alibi; /* a bias on the scores: no parameters, no rotary products */
  return TRUE;
}

/* resolve_ffn_hidden_size: an explicit width wins over the ratio. */
static gboolean
mpt_ffn_width (Import *c, GError **error)
{
  double ratio = c->expansion_ratio;
  guint64 h = c->size[SZ_HIDDEN];
  if (c->ffn_config && stow_json_has (c->ffn_config, "ffn_hidden_size"))
    {
      g_autofree char *ffn_where
          = g_strdup_printf ("%s: ffn_config", c->b->where);
      return get_u64 (c->ffn_config, ffn_where, NAMES ("ffn_hidden_size"), TRUE,
                      TRUE, &c->size[SZ_FFN], error);
    }
  if (!(ratio > 0) || ratio * (double)h > (double)STOW_MODEL_MAX_DIM)
    return E_INVALID (error,
                      "%s: expansion_ratio (%g) must be positive and keep "
                      "d_model x expansion_ratio at most %u",
                      c->b->where, ratio, STOW_MODEL_MAX_DIM);
  c->size[SZ_FFN] = (guint64)(ratio * (double)h); /* int(d_model * ratio) */
  if (c->size[SZ_FFN] == 0)
    return E_INVALID (error,
                      "%s: expansion_ratio (%g) x d_model (%" G_GUINT64_FORMAT
                      ") leaves no MLP",
                      c->b->where, ratio, h);
  return TRUE;
}

static const Slot mpt_block[] = {
  NORM ("norm_1"),
  LINEAR ("attn.Wqkv", ATTENTION, SZ_QKV, SZ_HIDDEN, .bias = F_BIAS),
  NORM ("attn.q_ln", .when = F_QK_NORM),
  NORM ("attn.k_ln", .rows = SZ_KV, .when = F_QK_NORM),
  LINEAR ("attn.out_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  NORM ("norm_2"),
  LINEAR ("ffn.gate_proj", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_BIAS,
          .when = F_GATED),
  LINEAR ("ffn.up_proj", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("ffn.down_proj", MLP, SZ_HIDDEN, SZ_FFN, .bias = F_BIAS),
  END,
};

static const Slot mpt_inventory[] = {
  TENSOR ("transformer.wte.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  TENSOR ("transformer.wpe.weight", EMBEDDING, SZ_POSITION_ROWS, SZ_HIDDEN,
          .when = F_LEARNED_POS),
  LAYERS ("transformer.blocks", SZ_LAYERS, mpt_block),
  NORM ("transformer.norm_f"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- falcon ------------------------------------------------------------- */

static const Field falcon_fields[] = {
  { .size = SZ_HIDDEN,
    .names = { "hidden_size", "n_embed" },
    .required = TRUE },
  { .size = SZ_LAYERS,
    .names = { "num_hidden_layers", "n_layer" },
    .required = TRUE },
  { .size = SZ_HEADS,
    .names = { "num_attention_heads", "n_head" },
    .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  { .flag = F_NEW_ARCH, .names = { "new_decoder_architecture" } },
  { .flag = F_MULTI_QUERY, .names = { "multi_query" } },
  { .flag = F_PARALLEL_ATTN, .names = { "parallel_attn" } },
  { .flag = F_BIAS, .names = { "bias" } },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { .size = SZ_FFN,
    .names = { "ffn_hidden_size" },
    .fallback_of = SZ_HIDDEN,
    .times = 4 },
  /* Only the new decoder architecture reads num_kv_heads. */
  { .size = SZ_KV_HEADS,
    .names = { "num_kv_heads", "n_head_kv" },
    .fallback_of = SZ_HEADS,
    .when = F_NEW_ARCH },
  { 0 },
};

/* The old architecture's kv heads (FalconAttention): one with
 * multi_query, else one per query head. */
static gboolean
falcon_kv_heads (Import *c, GError **error)
{
  if (!(c->flags & F_NEW_ARCH))
    c->size[SZ_KV_HEADS] = (c->flags & F_MULTI_QUERY) ? 1 : c->size[SZ_HEADS];
  return TRUE;
}

/* The new architecture norms the attention's and the MLP's input apart
 * (ln_attn, ln_mlp) unless num_ln_in_parallel_attn says one. */
static gboolean
falcon_input_norms (Import *c, GError **error)
{
  guint64 n = 2;
  if (!(c->flags & F_NEW_ARCH))
    return TRUE;
  if (!get_u64 (c->o, c->b->where, NAMES ("num_ln_in_parallel_attn"), FALSE,
                TRUE, &n, error))
    return FALSE;
  if (n == 2)
    c->flags |= F_TWO_NORMS;
  return TRUE;
}

/* BLOOM's block, and Falcon's: two input norms or one under the new
 * decoder architecture; one under the old, and a second before the MLP
 * unless parallel_attn (BLOOM's layout). */
static const Slot fused_qkv_block[] = {
  NORM ("ln_attn", .when = F_TWO_NORMS),
  NORM ("ln_mlp", .when = F_TWO_NORMS),
  NORM ("input_layernorm", .unless = F_TWO_NORMS),
  LINEAR ("self_attention.query_key_value", ATTENTION, SZ_QKV, SZ_HIDDEN,
          .bias = F_BIAS),
  LINEAR ("self_attention.dense", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  NORM ("post_attention_layernorm", .unless = F_NEW_ARCH | F_PARALLEL_ATTN),
  GROUP ("mlp", h_to_4h_mlp),
  END,
};

static const Slot falcon_inventory[] = {
  TENSOR ("transformer.word_embeddings.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  LAYERS ("transformer.h", SZ_LAYERS, fused_qkv_block),
  NORM ("transformer.ln_f"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- bloom -------------------------------------------------------------- */

static const Field bloom_fields[] = {
  { .size = SZ_HIDDEN,
    .names = { "hidden_size", "n_embed" },
    .required = TRUE },
  { .size = SZ_LAYERS,
    .names = { "n_layer", "num_hidden_layers" },
    .required = TRUE },
  { .size = SZ_HEADS,
    .names = { "n_head", "num_attention_heads" },
    .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  /* BloomMLP's width is fixed. */
  { .size = SZ_FFN, .fallback_of = SZ_HIDDEN, .times = 4 },
  { 0 },
};

static const Slot bloom_inventory[] = {
  TENSOR ("transformer.word_embeddings.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  NORM ("transformer.word_embeddings_layernorm"),
  LAYERS ("transformer.h", SZ_LAYERS, fused_qkv_block),
  NORM ("transformer.ln_f"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- opt ---------------------------------------------------------------- */

static const Field opt_fields[] = {
  { .include = shape_fields },
  { .size = SZ_FFN, .names = { "ffn_dim" }, .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  { .size = SZ_POSITIONS,
    .names = { "max_position_embeddings" },
    .required = TRUE },
  { .size = SZ_EMBED_WIDTH,
    .names = { "word_embed_proj_dim" },
    .fallback_of = SZ_HIDDEN },
  { .flag = F_LN_BEFORE, .names = { "do_layer_norm_before" } },
  { .flag = F_NO_FINAL_NORM, .names = { "_remove_final_layer_norm" } },
  { .flag = F_BIAS, .names = { "enable_bias" } },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { 0 },
};

/* opt-350m's embeddings are narrower than its layers: projected in and
 * out. */
static gboolean
opt_projection (Import *c, GError **error)
{
  if (c->size[SZ_EMBED_WIDTH] != c->size[SZ_HIDDEN])
    c->flags |= F_PROJECT_EMBED;
  return TRUE;
}

static const Slot opt_layer[] = {
  LINEAR ("self_attn.k_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("self_attn.v_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("self_attn.q_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("self_attn.out_proj", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  NORM ("self_attn_layer_norm"),
  LINEAR ("fc1", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("fc2", MLP, SZ_HIDDEN, SZ_FFN, .bias = F_BIAS),
  NORM ("final_layer_norm"),
  END,
};

/* OPTLearnedPositionalEmbedding keeps 2 extra rows (a fairseq offset: the
 * family's position_offset). */
static const Slot opt_inventory[] = {
  TENSOR ("model.decoder.embed_tokens.weight", EMBEDDING, SZ_VOCAB,
          SZ_EMBED_WIDTH),
  TENSOR ("model.decoder.embed_positions.weight", EMBEDDING, SZ_POSITION_ROWS,
          SZ_HIDDEN),
  /* The final LayerNorm exists only with pre-LN (opt-350m is post-LN). */
  NORM ("model.decoder.final_layer_norm", .when = F_LN_BEFORE,
        .unless = F_NO_FINAL_NORM),
  TENSOR ("model.decoder.project_out.weight", EMBEDDING, SZ_EMBED_WIDTH,
          SZ_HIDDEN, .when = F_PROJECT_EMBED),
  TENSOR ("model.decoder.project_in.weight", EMBEDDING, SZ_HIDDEN,
          SZ_EMBED_WIDTH, .when = F_PROJECT_EMBED),
  LAYERS ("model.decoder.layers", SZ_LAYERS, opt_layer),
  HEAD ("lm_head.weight", SZ_EMBED_WIDTH),
  END,
};

/* ---- t5 ----------------------------------------------------------------- */

/* T5 heads need not divide d_model: the inner width is heads x d_kv. */
static const Field t5_fields[] = {
  { .size = SZ_HIDDEN, .names = { "d_model" }, .required = TRUE },
  { .size = SZ_HEAD_DIM, .names = { "d_kv" }, .fallback = 64 },
  { .size = SZ_HEADS, .names = { "num_heads" }, .required = TRUE },
  { .size = SZ_FFN, .names = { "d_ff" }, .required = TRUE },
  { .size = SZ_VOCAB, .names = { "vocab_size" }, .required = TRUE },
  { .size = SZ_LAYERS, .names = { "num_layers" }, .required = TRUE },
  { .size = SZ_DECODER_LAYERS,
    .names = { "num_decoder_layers" },
    .fallback_of = SZ_LAYERS },
  { .size = SZ_BUCKETS,
    .names = { "relative_attention_num_buckets" },
    .fallback = 32 },
  { .text = TX_ACTIVATION,
    .names = { "feed_forward_proj" },
    .fallback_text = "relu" },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { 0 },
};

/* The decoder stack's size, and the MLP: "gated-gelu" (v1.1, flan-T5) has
 * two input projections (GeGLU), and T5Config maps it to the "gelu_new"
 * activation. */
static gboolean
t5_decoder_and_mlp (Import *c, GError **error)
{
  const char *proj = c->text[TX_ACTIVATION];
  const guint64 *s = c->size;
  if (!check_layers (c->b, c->field[SZ_DECODER_LAYERS], s[SZ_DECODER_LAYERS],
                     error)
      || !check_layers (c->b, "num_layers + num_decoder_layers",
                        s[SZ_LAYERS] + s[SZ_DECODER_LAYERS], error))
    return FALSE;
  if (g_str_has_prefix (proj, "gated-"))
    c->flags |= F_GATED;
  if (g_str_equal (proj, "gated-gelu"))
    c->flags |= F_GELU_NEW;
  return TRUE;
}

static const Slot t5_attention[] = {
  LINEAR ("q", ATTENTION, SZ_Q, SZ_HIDDEN),
  LINEAR ("k", ATTENTION, SZ_Q, SZ_HIDDEN),
  LINEAR ("v", ATTENTION, SZ_Q, SZ_HIDDEN),
  LINEAR ("o", ATTENTION, SZ_HIDDEN, SZ_Q),
  END,
};

/* T5DenseActDense or T5DenseGatedActDense, then the sublayer's norm. */
static const Slot t5_ff[] = {
  LINEAR ("DenseReluDense.wi_0", MLP, SZ_FFN, SZ_HIDDEN, .when = F_GATED),
  LINEAR ("DenseReluDense.wi_1", MLP, SZ_FFN, SZ_HIDDEN, .when = F_GATED),
  LINEAR ("DenseReluDense.wi", MLP, SZ_FFN, SZ_HIDDEN, .unless = F_GATED),
  LINEAR ("DenseReluDense.wo", MLP, SZ_HIDDEN, SZ_FFN),
  NORM ("layer_norm"),
  END,
};

/* Relative position buckets: one table per stack, in its first block. */
static const Slot t5_encoder_block[] = {
  GROUP ("layer.0.SelfAttention", t5_attention),
  TENSOR ("layer.0.SelfAttention.relative_attention_bias.weight", EMBEDDING,
          SZ_BUCKETS, SZ_HEADS, .when = F_FIRST),
  NORM ("layer.0.layer_norm"),
  GROUP ("layer.1", t5_ff),
  END,
};

static const Slot t5_decoder_block[] = {
  GROUP ("layer.0.SelfAttention", t5_attention),
  TENSOR ("layer.0.SelfAttention.relative_attention_bias.weight", EMBEDDING,
          SZ_BUCKETS, SZ_HEADS, .when = F_FIRST),
  NORM ("layer.0.layer_norm"),
  GROUP ("layer.1.EncDecAttention", t5_attention),
  NORM ("layer.1.layer_norm"),
  GROUP ("layer.2", t5_ff),
  END,
};

/* The decoder's layers follow the encoder's in the model's layer stack. */
static const Slot t5_inventory[] = {
  TENSOR ("shared.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  TENSOR ("encoder.embed_tokens.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN,
          .tied = TRUE),
  LAYERS ("encoder.block", SZ_LAYERS, t5_encoder_block),
  NORM ("encoder.final_layer_norm"),
  TENSOR ("decoder.embed_tokens.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN,
          .tied = TRUE),
  LAYERS ("decoder.block", SZ_DECODER_LAYERS, t5_decoder_block,
          .first = SZ_LAYERS),
  NORM ("decoder.final_layer_norm"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- deepseek_v2 / deepseek_v3 (MLA + MoE) ----------------------------- */

static const Field deepseek_fields[] = {
  { .include = common_fields },
  { .size = SZ_KV_LORA, .names = { "kv_lora_rank" }, .required = TRUE },
  { .size = SZ_QK_NOPE, .names = { "qk_nope_head_dim" }, .required = TRUE },
  { .size = SZ_QK_ROPE, .names = { "qk_rope_head_dim" }, .required = TRUE },
  { .size = SZ_V_HEAD_DIM, .names = { "v_head_dim" }, .required = TRUE },
  { .size = SZ_KV_HEADS,
    .names = { "num_key_value_heads" },
    .fallback_of = SZ_HEADS },
  /* q_lora_rank null (V2-Lite) means a plain q_proj. */
  { .size = SZ_Q_LORA, .names = { "q_lora_rank" } },
  { .size = SZ_EXPERTS, .names = { "n_routed_experts", "num_local_experts" } },
  { .flag = F_TIED, .names = { "tie_word_embeddings" } },
  { .text = TX_TOPK_METHOD, .names = { "topk_method" } },
  { 0 },
};

/* Read when n_routed_experts is set. */
static const Field deepseek_expert_fields[] = {
  { .size = SZ_TOP_K, .names = { "num_experts_per_tok" }, .required = TRUE },
  { .size = SZ_MOE_FFN,
    .names = { "moe_intermediate_size" },
    .required = TRUE },
  { .size = SZ_SHARED_EXPERTS,
    .names = { "n_shared_experts" },
    .zero_ok = TRUE },
  { .size = SZ_FIRST_DENSE,
    .names = { "first_k_dense_replace" },
    .zero_ok = TRUE },
  { .size = SZ_MOE_EVERY, .names = { "moe_layer_freq" }, .fallback = 1 },
  { 0 },
};

/* A head's query and key: the part without and the part with rotary. */
static gboolean
deepseek_head_dim (Import *c, GError **error)
{
  c->size[SZ_HEAD_DIM] = c->size[SZ_QK_NOPE] + c->size[SZ_QK_ROPE];
  return TRUE;
}

static gboolean
deepseek_switches (Import *c, GError **error)
{
  const guint64 *s = c->size;
  const char *topk_method = c->text[TX_TOPK_METHOD];
  if (s[SZ_SHARED_EXPERTS] > STOW_MODEL_MAX_EXPERTS)
    return check_experts (c->b, c->field[SZ_SHARED_EXPERTS],
                          s[SZ_SHARED_EXPERTS], 1, error);
  /* V3's aux-loss-free routing keeps a per-expert score correction in the
   * checkpoint (gate.e_score_correction_bias); it is in the published
   * 671,026,419,200.  V3 routes so unless topk_method says otherwise. */
  if (topk_method)
    c->flags = g_str_equal (topk_method, "noaux_tc") ? c->flags | F_SCORE_BIAS
                                                     : c->flags & ~F_SCORE_BIAS;
  if (s[SZ_Q_LORA] > 0)
    c->flags |= F_Q_LORA;
  if (s[SZ_SHARED_EXPERTS] > 0)
    c->flags |= F_SHARED_EXPERTS;
  c->b->model->first_dense_layers
      = s[SZ_EXPERTS] ? MIN (s[SZ_FIRST_DENSE], s[SZ_LAYERS]) : s[SZ_LAYERS];
  return TRUE;
}

static gboolean
deepseek_moe_layer (const Import *c, guint64 i)
{
  return i >= c->size[SZ_FIRST_DENSE] && i % c->size[SZ_MOE_EVERY] == 0;
}

/* Multi-head latent attention: q through a low-rank q_a/q_b pair (or a
 * plain q_proj), k and v from one compressed kv_a projection. */
static const Slot deepseek_layer[] = {
  LINEAR ("self_attn.q_a_proj", ATTENTION, SZ_Q_LORA, SZ_HIDDEN,
          .when = F_Q_LORA),
  NORM ("self_attn.q_a_layernorm", .rows = SZ_Q_LORA, .when = F_Q_LORA),
  LINEAR ("self_attn.q_b_proj", ATTENTION, SZ_Q, SZ_Q_LORA, .when = F_Q_LORA),
  LINEAR ("self_attn.q_proj", ATTENTION, SZ_Q, SZ_HIDDEN, .unless = F_Q_LORA),
  LINEAR ("self_attn.kv_a_proj_with_mqa", ATTENTION, SZ_MLA_KV_A, SZ_HIDDEN),
  NORM ("self_attn.kv_a_layernorm", .rows = SZ_KV_LORA),
  LINEAR ("self_attn.kv_b_proj", ATTENTION, SZ_MLA_KV_B, SZ_KV_LORA),
  LINEAR ("self_attn.o_proj", ATTENTION, SZ_HIDDEN, SZ_MLA_O),
  GROUP ("mlp", gated_mlp, .unless = F_MOE_LAYER),
  MOE (.when = F_MOE_LAYER),
  NORM ("input_layernorm"),
  NORM ("post_attention_layernorm"),
  END,
};

/* The shared experts are one MLP of width n_shared_experts x
 * moe_intermediate_size. */
static const Slot shared_experts[] = {
  LINEAR ("gate_proj", MLP, SZ_SHARED_FFN, SZ_HIDDEN),
  LINEAR ("up_proj", MLP, SZ_SHARED_FFN, SZ_HIDDEN),
  LINEAR ("down_proj", MLP, SZ_HIDDEN, SZ_SHARED_FFN),
  END,
};

static const Slot deepseek_moe[] = {
  EXPERTS ("mlp.experts", gated_expert),
  LINEAR ("mlp.gate", ROUTER, SZ_EXPERTS, SZ_HIDDEN),
  TENSOR ("mlp.gate.e_score_correction_bias", ROUTER, SZ_EXPERTS, SZ_NONE,
          .when = F_SCORE_BIAS),
  GROUP ("mlp.shared_experts", shared_experts, .when = F_SHARED_EXPERTS),
  END,
};

static const Slot deepseek_inventory[] = {
  TENSOR ("model.embed_tokens.weight", EMBEDDING, SZ_VOCAB, SZ_HIDDEN),
  LAYERS ("model.layers", SZ_LAYERS, deepseek_layer),
  NORM ("model.norm"),
  HEAD ("lm_head.weight", SZ_HIDDEN),
  END,
};

/* ---- bert (encoder only) ------------------------------------------------- */

static const Field bert_fields[] = {
  { .include = common_fields },
  { .size = SZ_POSITIONS,
    .names = { "max_position_embeddings" },
    .fallback = 512 },
  { .size = SZ_TOKEN_TYPES, .names = { "type_vocab_size" }, .fallback = 2 },
  { 0 },
};

/* Post-norm layers with biases everywhere. */
static const Slot bert_layer[] = {
  LINEAR ("attention.self.query", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  LINEAR ("attention.self.key", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  LINEAR ("attention.self.value", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  LINEAR ("attention.output.dense", ATTENTION, SZ_HIDDEN, SZ_HIDDEN,
          .bias = F_BIAS),
  NORM ("attention.output.LayerNorm"),
  LINEAR ("intermediate.dense", MLP, SZ_FFN, SZ_HIDDEN, .bias = F_BIAS),
  LINEAR ("output.dense", MLP, SZ_HIDDEN, SZ_FFN, .bias = F_BIAS),
  NORM ("output.LayerNorm"),
  END,
};

/* BertModel as the BertFor* heads save it ("bert." prefix): word, position
 * and token-type embeddings with a LayerNorm, the layers, and the pooler.
 * No language-model head: the classification heads are a few thousand
 * parameters and the MLM head is tied. */
static const Slot bert_inventory[] = {
  TENSOR ("bert.embeddings.word_embeddings.weight", EMBEDDING, SZ_VOCAB,
          SZ_HIDDEN),
  TENSOR ("bert.embeddings.position_embeddings.weight", EMBEDDING,
          SZ_POSITION_ROWS, SZ_HIDDEN),
  TENSOR ("bert.embeddings.token_type_embeddings.weight", EMBEDDING,
          SZ_TOKEN_TYPES, SZ_HIDDEN),
  NORM ("bert.embeddings.LayerNorm"),
  LAYERS ("bert.encoder.layer", SZ_LAYERS, bert_layer),
  LINEAR ("bert.pooler.dense", HEAD, SZ_HIDDEN, SZ_HIDDEN, .bias = F_BIAS),
  END,
};

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

static const Field siglip_fields[] = {
  { .size = SZ_HIDDEN, .names = { "hidden_size" }, .required = TRUE },
  { .size = SZ_FFN, .names = { "intermediate_size" }, .required = TRUE },
  { .size = SZ_LAYERS, .names = { "num_hidden_layers" }, .required = TRUE },
  { .size = SZ_HEADS, .names = { "num_attention_heads" }, .required = TRUE },
  { .size = SZ_CHANNELS, .names = { "num_channels" }, .required = TRUE },
  { .size = SZ_IMAGE, .names = { "image_size" }, .required = TRUE },
  { .size = SZ_PATCH, .names = { "patch_size" }, .required = TRUE },
  { 0 },
};

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
  guint64 vh, vf, vL, ch, img, patch, th;
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
  gboolean ok = import_family (b, text, find_family ("gemma3_text"),
                               "language_model.", error);
  b->where = where;
  if (!ok)
    return FALSE;
  th = b->model->hidden;

  Import v = { .b = b, .o = vision };
  b->where = vw;
  ok = read_fields (&v, siglip_fields, error) && check_shape (&v, error);
  vh = v.size[SZ_HIDDEN];
  vf = v.size[SZ_FFN];
  vL = v.size[SZ_LAYERS];
  ch = v.size[SZ_CHANNELS];
  img = v.size[SZ_IMAGE];
  patch = v.size[SZ_PATCH];
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

/* ---- the families ------------------------------------------------------- */

/* clang-format off */
#define LLAMA(flags_)                                                          \
  .fields = llama_fields, .flags = F_GATED | (flags_),                         \
  .norm = STOW_NORM_RMSNORM, .runtime = TRUE, .inventory = llama_inventory
#define T5(flags_)                                                             \
  .fields = t5_fields, .flags = F_FFN_DROPOUT | (flags_),                      \
  .norm = STOW_NORM_RMSNORM, .finish = t5_decoder_and_mlp,                     \
  .inventory = t5_inventory
#define DEEPSEEK(flags_)                                                       \
  .fields = deepseek_fields, .flags = F_GATED | (flags_),                      \
  .norm = STOW_NORM_RMSNORM, .derive = deepseek_head_dim,                      \
  .expert_fields = deepseek_expert_fields, .finish = deepseek_switches,        \
  .moe_layer = deepseek_moe_layer, .inventory = deepseek_inventory,            \
  .moe = deepseek_moe
#define FALCON(flags_)                                                         \
  .fields = falcon_fields,                                                     \
  .flags = F_MULTI_QUERY | F_PARALLEL_ATTN | F_TIED | (flags_),                \
  .norm = STOW_NORM_LAYERNORM, .derive = falcon_kv_heads,                      \
  .finish = falcon_input_norms, .inventory = falcon_inventory
/* clang-format on */

static const Family families[] = {
  { .types = { "llama", "mistral" }, LLAMA (0) },
  { .types = { "mixtral" },
    LLAMA (F_MOE),
    .expert_fields = mixtral_expert_fields,
    .moe = mixtral_moe },
  { .types = { "qwen2" }, LLAMA (F_QKV_BIAS) },
  { .types = { "qwen3" }, LLAMA (F_QK_NORM) },
  { .types = { "qwen3_moe" },
    LLAMA (F_QK_NORM | F_MOE),
    .expert_fields = qwen3_moe_expert_fields,
    .finish = qwen3_moe_check_mlp_only,
    .moe_layer = qwen3_moe_layer,
    .moe = qwen3_moe_block },
  /* The gemma families tie by default. */
  { .types = { "gemma" }, LLAMA (F_TIED) },
  { .types = { "gemma2" }, LLAMA (F_TIED | F_SANDWICH) },
  { .types = { "gemma3" }, .import = import_gemma3 },
  { .types = { "gemma3_text" }, LLAMA (F_TIED | F_SANDWICH | F_QK_NORM) },
  { .types = { "phi3" }, LLAMA (F_FUSED) },
  { .types = { "gpt2" },
    .fields = gpt2_fields,
    .flags = F_BIAS | F_TIED | F_LEARNED_POS,
    .norm = STOW_NORM_LAYERNORM,
    .finish = gpt2_activation,
    .inventory = gpt2_inventory },
  { .types = { "gpt_neox" },
    .fields = gpt_neox_fields,
    .flags = F_BIAS,
    .norm = STOW_NORM_LAYERNORM,
    .inventory = gpt_neox_inventory },
  { .types = { "falcon" }, .legacy_types = { "RefinedWebModel" }, FALCON (0) },
  /* Legacy RefinedWeb (40B-style) configs imply the new architecture. */
  { .legacy_types = { "RefinedWeb" }, FALCON (F_NEW_ARCH) },
  { .types = { "bloom" },
    .fields = bloom_fields,
    .flags = F_BIAS | F_TIED | F_ROPE_FREE, /* ALiBi */
    .norm = STOW_NORM_LAYERNORM,
    .inventory = bloom_inventory },
  { .types = { "mpt" },
    .fields = mpt_fields,
    .derive = mpt_config,
    .finish = mpt_ffn_width,
    .inventory = mpt_inventory },
  { .types = { "opt" },
    .fields = opt_fields,
    .flags = F_LN_BEFORE | F_BIAS | F_TIED | F_LEARNED_POS,
    .norm = STOW_NORM_LAYERNORM,
    .position_offset = 2,
    .finish = opt_projection,
    .inventory = opt_inventory },
  { .types = { "t5" }, T5 (F_TIED) },
  /* mT5 (mt0) is T5 v1.1 with its own config class, whose
   * tie_word_embeddings defaults to false. */
  { .types = { "mt5" }, T5 (0) },
  { .types = { "bert" },
    .fields = bert_fields,
    .flags = F_BIAS | F_LEARNED_POS | F_NO_LM_HEAD,
    .norm = STOW_NORM_LAYERNORM,
    .inventory = bert_inventory },
  { .types = { "deepseek_v2" }, DEEPSEEK (0) },
  { .types = { "deepseek_v3" }, DEEPSEEK (F_SCORE_BIAS) },
};

/* The family serving @type, or NULL. */
static const Family *
find_family (const char *type)
{
  for (guint i = 0; i < G_N_ELEMENTS (families); i++)
    for (guint j = 0; j < G_N_ELEMENTS (families[i].types); j++)
      if ((families[i].types[j] && g_str_equal (type, families[i].types[j]))
          || (families[i].legacy_types[j]
              && g_str_equal (type, families[i].legacy_types[j])))
        return &families[i];
  return NULL;
}

/* ---- dispatch ----------------------------------------------------------- */

/* "llama, mistral, ...": every family's advertised model_type values. */
static char *
advertised_types (void)
{
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < G_N_ELEMENTS (families); i++)
    for (guint j = 0; j < G_N_ELEMENTS (families[i].types); j++)
      if (families[i].types[j])
        g_string_append_printf (s, "%s%s", s->len ? ", " : "",
                                families[i].types[j]);
  return g_string_free (s, FALSE);
}

/* The first of @f's fields (aliases aside) that @o lacks, or NULL. */
static const char *
first_missing (JsonObject *o, const Field *f)
{
  for (; !field_end (f); f++)
    {
      const char *missing = f->include ? first_missing (o, f->include)
                            : f->names[0] && !stow_json_has (o, f->names[0])
                                ? f->names[0]
                                : NULL;
      if (missing)
        return missing;
    }
  return NULL;
}

gboolean
stow_model_import (StowModelBuilder *b, JsonObject *o, const char *type,
                   GError **error)
{
  const Family *family = find_family (type);
  if (family && family->import)
    return family->import (b, o, error);
  if (family)
    return import_family (b, o, family, "", error);

  /* Many newer decoders are llama with a new name; count them as llama
   * when they carry llama's fields, and say so. */
  const char *missing = first_missing (o, common_fields);
  if (missing)
    {
      g_autofree char *esc = g_strescape (type, NULL);
      g_autofree char *supported = advertised_types ();
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_UNSUPPORTED,
                   "%s: model_type \"%.60s\" is not supported (and has no "
                   "%s for a llama-like import); supported: %s",
                   b->where, esc, missing, supported);
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
  return import_family (b, o, find_family ("llama"), "", error);
}
