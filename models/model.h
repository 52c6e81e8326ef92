/* SPDX-License-Identifier: MIT
 *
 * models/model.h: a model architecture as the planner and executor see it:
 * the shape numbers, the exact parameter count, and the tensor inventory
 * (HF checkpoint names, shapes, roles).  Built from a HuggingFace
 * config.json or from the built-in catalog (models/catalog/).  Pure data: no
 * weights are ever loaded here.
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define STOW_MODEL_ERROR (stow_model_error_quark ())
GQuark stow_model_error_quark (void);

typedef enum
{
  STOW_MODEL_ERROR_NOT_FOUND,   /* unknown catalog name, missing file */
  STOW_MODEL_ERROR_INVALID,     /* malformed config: wrong type, bad value */
  STOW_MODEL_ERROR_UNSUPPORTED, /* a model_type we cannot count */
  STOW_MODEL_ERROR_ACCESS,      /* a gated or private Hub repository */
  STOW_MODEL_ERROR_NETWORK,     /* the Hub did not answer, or not usefully */
  STOW_MODEL_ERROR_IO,          /* the model cache could not be written */
} StowModelError;

typedef enum
{
  STOW_ROLE_EMBEDDING, /* token, position and relative-position tables */
  STOW_ROLE_ATTENTION, /* q/k/v/o and MLA projections (weights) */
  STOW_ROLE_MLP,       /* dense MLP and shared-expert weights */
  STOW_ROLE_EXPERT,    /* routed-expert weights */
  STOW_ROLE_ROUTER,    /* MoE gate / router (and its bias) */
  STOW_ROLE_NORM,      /* LayerNorm / RMSNorm weights and biases */
  STOW_ROLE_BIAS,      /* biases of linear layers */
  STOW_ROLE_HEAD,      /* untied output projection (lm_head) */
  STOW_N_ROLES
} StowTensorRole;

/* "embedding", "attention", ... as used in JSON. */
const char *stow_tensor_role_name (StowTensorRole role);

typedef enum
{
  STOW_NORM_LAYERNORM, /* weight and bias */
  STOW_NORM_RMSNORM,   /* weight only */
} StowNormKind;

typedef struct
{
  char *name; /* HF checkpoint name: "model.layers.3.mlp.up_proj.weight" */
  guint64 shape[4]; /* row-major, as stored in the checkpoint */
  guint n_dims;
  guint64 numel;
  StowTensorRole role;
  gint layer;    /* index in the layer stack, -1 outside it */
  gboolean tied; /* shares storage with an earlier tensor: not counted */
} StowTensor;

/* Per-layer summary for the planner (pipeline splits, streaming). */
typedef struct
{
  guint64 params;        /* all parameters of the layer */
  guint64 active_params; /* per token: routed experts counted top-k times */
  gboolean is_moe;       /* routed experts in this layer */
  gboolean is_decoder;   /* T5: FALSE for encoder layers */
} StowLayerInfo;

/* How a checkpoint stores its linear layers' weights (config.json's
 * quantization_config); embeddings, norms and, unless the config says
 * otherwise, lm_head stay in torch_dtype. */
typedef enum
{
  STOW_QUANT_NONE,
  STOW_QUANT_BNB_4BIT, /* bitsandbytes load_in_4bit: nf4 / fp4 */
  STOW_QUANT_BNB_8BIT, /* bitsandbytes load_in_8bit: LLM.int8() */
  STOW_QUANT_GPTQ,
  STOW_QUANT_AWQ,
  STOW_QUANT_FP8, /* fp8 e4m3 weights with per-block or per-tensor scales */
} StowQuantMethod;

typedef struct
{
  StowQuantMethod method;
  guint bits;            /* bits per weight: 4, 8, 3, 2 */
  guint64 group_size;    /* weights per scale (GPTQ / AWQ / bnb block;
                            fp8: block rows x columns); 0 = per row */
  gboolean double_quant; /* bnb 4-bit: the block scales quantised again */
  char *type;            /* "nf4", "fp4", "int8", "e4m3", "gemm", ... */
  /* Bytes per linear weight, scales and zero points included. */
  double linear_bytes_per_param;
} StowQuant;

/* "bitsandbytes-4bit", "gptq", ... ("none" for STOW_QUANT_NONE). */
const char *stow_quant_method_name (StowQuantMethod method);

typedef struct _StowModel StowModel;
struct _StowModel
{
  gint ref_count;
  char *name;     /* catalog short name, or the file's directory name */
  char *family;   /* HF model_type: "llama", "gpt2", "t5", ... */
  char **aliases; /* NULL-terminated, may be empty */
  char *source;   /* "catalog" or the config.json path */

  /* Shape.  For T5, n_layers = encoder + decoder layers. */
  guint64 hidden;           /* h */
  guint64 n_layers;         /* L (the layer stack the planner splits) */
  guint64 n_encoder_layers; /* T5 only, else 0 */
  guint64 n_heads;          /* a */
  guint64 n_kv_heads;       /* k (GQA / MQA); = a for MHA */
  guint64 head_dim;         /* d (explicit head_dim, d_kv, or h/a) */
  guint64 ffn;              /* dense MLP width f (per expert for mixtral) */
  guint64 vocab;            /* V */
  guint64 max_positions;    /* learned positions; 0 for RoPE / ALiBi */
  gboolean rope_free;       /* no rotary embedding: ALiBi or no positions
                               at all (bloom; MPT without attn_config.rope) */
  gboolean gated_mlp;       /* SwiGLU / GeGLU: 3 matrices instead of 2 */
  gboolean linear_bias;     /* biases on linears (gpt2, bloom, opt, ...) */
  gboolean tied_embeddings;
  gboolean no_lm_head;  /* encoders (BERT): no vocabulary logits */
  gboolean ffn_dropout; /* dropout inside the MLP, after the activation
                           (T5's DenseReluDense) */
  gboolean gelu_new;    /* HF's NewGELUActivation ("gelu_new": GPT-2, T5
                           v1.1's gated-gelu): a Python tanh formula */
  StowNormKind norm;

  /* Mixture of experts (0 when dense). */
  guint64 n_experts;         /* routed experts per MoE layer */
  guint64 experts_per_token; /* top-k */
  guint64 n_shared_experts;
  guint64 moe_ffn; /* expert width (deepseek moe_intermediate_size) */
  guint64 first_dense_layers; /* deepseek first_k_dense_replace */

  /* Multi-head latent attention (deepseek); 0 when absent. */
  guint64 q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
      v_head_dim;

  /* Counts.  Tied tensors are counted once, as HF num_parameters() does. */
  guint64 params;                /* total */
  guint64 active_params;         /* per token (MoE); = params when dense */
  guint64 embedding_params;      /* input-side embedding tables */
  guint64 head_params;           /* untied lm_head, 0 when tied */
  guint64 largest_module_params; /* DeepSpeed's "largest layer": the
                                    largest leaf module's own parameters */
  guint64 by_role[STOW_N_ROLES];
  StowLayerInfo *layers; /* n_layers entries */
  GPtrArray *tensors;    /* StowTensor *, checkpoint order */

  /* Added by the models room (beyond the planner's contract). */
  char *largest_module; /* that module's name: "model.embed_tokens" */
  char *reference;      /* catalog: where its configuration comes from */
  /* Linear layers that read the attention's input in the first layer (q,
   * k and v: 3; a fused qkv: 1; MLA's q_a and kv_a: 2) and the MLP's
   * (gate and up: 2; a fused or plain input projection: 1); at least 1.
   * torch.autocast casts that input to 16 bits once per linear. */
  guint attn_input_linears, mlp_input_linears;

  /* What running the model needs beyond counting it, from config.json
   * (llama, mistral, qwen2; HF's defaults where absent).  The executor
   * refuses families it does not run by name. */
  double rope_theta;        /* 10000 */
  double norm_eps;          /* rms_norm_eps: 1e-6 */
  double initializer_range; /* 0.02 */
  char *hidden_act;         /* "silu" */
  gboolean qkv_bias;        /* q, k, v biases (qwen2; attention_bias) */
  gboolean o_bias;          /* o_proj bias (attention_bias) */
  gboolean mlp_bias;        /* gate, up, down biases (mlp_bias) */
  /* rope_scaling: rope_type "llama3" and its numbers; NULL when none. */
  char *rope_type;
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  guint64 rope_original_max_positions;

  /* The checkpoint as stored: torch_dtype ("bfloat16"; NULL when the config
   * has none), its quantization, and its bytes (a safetensors index's
   * total_size or header when one was read, else estimated from the count:
   * linear weights at the quantized width, the rest at torch_dtype). */
  char *torch_dtype;
  StowQuant quant;
  guint64 linear_params; /* weights of the linear layers quantization
                            applies to (attention, MLP, experts) */
  guint64 checkpoint_bytes;
  gboolean checkpoint_bytes_measured; /* from the checkpoint's own files */

  /* Hub models (ORG/NAME): the id and revision; NULL otherwise. */
  char *hub_id;
  char *revision;
};

/* From a parsed config.json object; @where names it in errors. */
StowModel *stow_model_new_from_json (JsonObject *config, const char *where,
                                     GError **error);
/* From a config.json file (size-limited read). */
StowModel *stow_model_new_from_file (const char *path, GError **error);
/* From a config.json's text (@len bytes, -1: NUL-terminated), with the
 * limits of a file (size, nesting); @name names it in errors and becomes
 * the model's name and source. */
StowModel *stow_model_new_from_data (const char *data, gssize len,
                                     const char *name, GError **error);
/* A catalog name or alias (case-insensitive), or a path to a config.json
 * (or a directory holding one).  Unknown names get a did-you-mean hint. */
StowModel *stow_model_lookup (const char *name_or_path, GError **error);
/* The same, with Hub ids (ORG/NAME, see models/hub.h) at @revision (NULL:
 * "main").  A name holding '/' that is neither an existing file nor a
 * .json path is a Hub id.  @revision with anything but a Hub id is
 * STOW_MODEL_ERROR_INVALID. */
StowModel *stow_model_lookup_revision (const char *name_or_path,
                                       const char *revision, GError **error);
/* A catalog name or alias, or a Hub id at @revision, and never a file: for
 * names that come from someone other than the user at this machine (the
 * server's requests).  Errors as stow_model_lookup_revision's. */
StowModel *stow_model_lookup_named (const char *name, const char *revision,
                                    GError **error);
/* Bytes per parameter of a torch_dtype name ("bfloat16": 2), 0 when
 * unknown. */
guint stow_dtype_bytes (const char *torch_dtype);
/* Catalog short names, sorted; owned by the library. */
const char *const *stow_model_catalog_names (gsize *n);
/* The catalog entry's aliases (NULL-terminated, owned by the library), or
 * NULL when @name is not a catalog short name. */
const char *const *stow_model_catalog_aliases (const char *name);

StowModel *stow_model_ref (StowModel *model);
void stow_model_unref (StowModel *model);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowModel, stow_model_unref)

G_END_DECLS
