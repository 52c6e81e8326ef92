/* SPDX-License-Identifier: MIT
 *
 * models/quant.c: a checkpoint's quantization_config (bitsandbytes 4- and
 * 8-bit, GPTQ, AWQ, fp8) read into the bytes each linear weight takes, and
 * the checkpoint's size from it.  Counting parameters is model.c's; this
 * file only says how wide they are stored.
 */
#include "models/model-private.h"

#include <string.h>

#include "core/json.h"

#define E_INVALID(error, ...)                                                  \
  (g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,             \
                __VA_ARGS__),                                                  \
   FALSE)

const char *
stow_quant_method_name (StowQuantMethod method)
{
  switch (method)
    {
    case STOW_QUANT_NONE:
      return "none";
    case STOW_QUANT_BNB_4BIT:
      return "bitsandbytes-4bit";
    case STOW_QUANT_BNB_8BIT:
      return "bitsandbytes-8bit";
    case STOW_QUANT_GPTQ:
      return "gptq";
    case STOW_QUANT_AWQ:
      return "awq";
    case STOW_QUANT_FP8:
      return "fp8";
    }
  return "unknown";
}

guint
stow_dtype_bytes (const char *torch_dtype)
{
  static const struct
  {
    const char *name;
    guint bytes;
  } t[] = {
    { "float32", 4 },       { "float", 4 },       { "bfloat16", 2 },
    { "float16", 2 },       { "half", 2 },        { "float64", 8 },
    { "float8_e4m3fn", 1 }, { "float8_e5m2", 1 },
  };
  for (gsize i = 0; torch_dtype && i < G_N_ELEMENTS (t); i++)
    if (g_ascii_strcasecmp (torch_dtype, t[i].name) == 0)
      return t[i].bytes;
  return 0;
}

/* An integer member that may be absent (@def), -1 (per row: 0) or in
 * [1, @max]. */
static gboolean
quant_group (JsonObject *q, const char *where, const char *name, guint64 def,
             guint64 *out, GError **error)
{
  gint64 v = (gint64)def;
  if (!stow_json_get_i64 (q, where, name, FALSE, &v, error))
    return FALSE;
  if (!stow_json_has (q, name))
    v = (gint64)def;
  if (v == -1)
    {
      *out = 0;
      return TRUE;
    }
  if (v < 1 || v > (1 << 20))
    return E_INVALID (error,
                      "%s: %s (%" G_GINT64_FORMAT
                      ") must be -1 (per row) or from 1 to %d",
                      where, name, v, 1 << 20);
  *out = (guint64)v;
  return TRUE;
}

static gboolean
bits_member (JsonObject *q, const char *where, const char *name, guint *out,
             GError **error)
{
  gint64 v = 4;
  if (!stow_json_get_i64 (q, where, name, FALSE, &v, error))
    return FALSE;
  if (!stow_json_has (q, name))
    v = 4;
  if (v != 2 && v != 3 && v != 4 && v != 8)
    return E_INVALID (error,
                      "%s: %s (%" G_GINT64_FORMAT ") must be 2, 3, 4 or 8",
                      where, name, v);
  *out = (guint)v;
  return TRUE;
}

/* GPTQ and AWQ keep per group of @g input weights of one output column an
 * fp16 scale and a @bits-wide zero point (packed), beside the packed
 * weights (AutoGPTQ's qweight/qzeros/scales; AutoAWQ's WQLinear); @g = 0
 * groups a whole row of @h.  GPTQ adds g_idx, an int32 per input
 * channel: 4 B per column of (about) @h weights. */
static double
grouped_bytes (guint bits, guint64 g, guint64 h, gboolean g_idx)
{
  double per = g ? (double)g : (double)h;
  return bits / 8.0 + (2.0 + bits / 8.0) / per + (g_idx ? 4.0 / (double)h : 0);
}

static gboolean
read_bnb (StowQuant *qt, JsonObject *q, const char *where, guint64 h,
          GError **error)
{
  gboolean b4 = FALSE, b8 = FALSE, dq = FALSE;
  const char *type = NULL;
  if (!stow_json_get_bool (q, where, "load_in_4bit", FALSE, &b4, error)
      || !stow_json_get_bool (q, where, "load_in_8bit", FALSE, &b8, error)
      || !stow_json_get_bool (q, where, "bnb_4bit_use_double_quant", FALSE, &dq,
                              error)
      || !stow_json_get_string (q, where, "bnb_4bit_quant_type", FALSE, &type,
                                error))
    return FALSE;
  if (b4 == b8)
    return E_INVALID (error,
                      "%s: bitsandbytes needs exactly "
                      "one of load_in_4bit and load_in_8bit true",
                      where);
  if (b8)
    {
      /* LLM.int8(): int8 weights and an fp32 absmax per output row (the
       * SCB buffer of bitsandbytes' Int8Params), 4 B per row of h. */
      qt->method = STOW_QUANT_BNB_8BIT;
      qt->bits = 8;
      qt->type = g_strdup ("int8");
      qt->linear_bytes_per_param = 1.0 + 4.0 / (double)h;
      return TRUE;
    }
  if (type == NULL)
    type = "fp4"; /* BitsAndBytesConfig's default */
  if (!g_str_equal (type, "nf4") && !g_str_equal (type, "fp4"))
    {
      g_autofree char *esc = g_strescape (type, NULL);
      return E_INVALID (error,
                        "%s: bnb_4bit_quant_type "
                        "\"%.40s\": expected nf4 or fp4",
                        where, esc);
    }
  /* 4-bit weights in blocks of 64 with an fp32 absmax each; double
   * quantisation stores those absmaxes in 8 bits with one fp32 constant
   * per 256 of them (Dettmers et al. 2023, QLoRA, section 3: 0.5 -> 0.127
   * bits of scale per weight). */
  qt->method = STOW_QUANT_BNB_4BIT;
  qt->bits = 4;
  qt->group_size = 64;
  qt->double_quant = dq;
  qt->type = g_strdup (type);
  qt->linear_bytes_per_param
      = 0.5 + (dq ? 1.0 / 64.0 + 4.0 / (64.0 * 256.0) : 4.0 / 64.0);
  return TRUE;
}

gboolean
stow_model_read_quant (StowModel *m, JsonObject *config, const char *where,
                       GError **error)
{
  JsonObject *q = NULL;
  const char *method = NULL, *dtype = NULL;
  StowQuant *qt = &m->quant;

  /* transformers 5 writes "dtype" where 4 wrote "torch_dtype". */
  if (!stow_json_get_string (config, where, "torch_dtype", FALSE, &dtype, error)
      || (dtype == NULL
          && !stow_json_get_string (config, where, "dtype", FALSE, &dtype,
                                    error))
      || !stow_json_get_object (config, where, "quantization_config", FALSE, &q,
                                error))
    return FALSE;
  g_free (m->torch_dtype);
  m->torch_dtype = g_strdup (dtype);
  if (q == NULL)
    return TRUE;
  g_autofree char *qwhere = g_strdup_printf ("%s: quantization_config", where);
  where = qwhere;
  if (!stow_json_get_string (q, where, "quant_method", FALSE, &method, error))
    return FALSE;
  /* Configs saved before transformers 4.30 carry load_in_4bit alone. */
  if (method == NULL
      && (stow_json_has (q, "load_in_4bit")
          || stow_json_has (q, "load_in_8bit")))
    method = "bitsandbytes";
  if (method == NULL)
    return E_INVALID (error,
                      "%s: no quant_method "
                      "(bitsandbytes, gptq, awq, fp8 or fbgemm_fp8)",
                      where);
  if (g_str_equal (method, "bitsandbytes"))
    return read_bnb (qt, q, where, m->hidden, error);
  if (g_str_equal (method, "gptq") || g_str_equal (method, "awq"))
    {
      gboolean awq = g_str_equal (method, "awq");
      /* AutoAWQ's own files name them w_bit and q_group_size. */
      const char *bits_name
          = awq && !stow_json_has (q, "bits") && stow_json_has (q, "w_bit")
                ? "w_bit"
                : "bits";
      const char *group_name = awq && !stow_json_has (q, "group_size")
                                       && stow_json_has (q, "q_group_size")
                                   ? "q_group_size"
                                   : "group_size";
      const char *version = NULL;
      if (!bits_member (q, where, bits_name, &qt->bits, error)
          || !quant_group (q, where, group_name, 128, &qt->group_size, error))
        return FALSE;
      if (awq
          && !stow_json_get_string (q, where, "version", FALSE, &version,
                                    error))
        return FALSE;
      qt->method = awq ? STOW_QUANT_AWQ : STOW_QUANT_GPTQ;
      qt->type = g_strdup (awq ? (version ? version : "gemm") : "int");
      qt->linear_bytes_per_param
          = grouped_bytes (qt->bits, qt->group_size, m->hidden, !awq);
      return TRUE;
    }
  if (g_str_equal (method, "fp8") || g_str_equal (method, "fbgemm_fp8"))
    {
      JsonArray *block = NULL;
      qt->method = STOW_QUANT_FP8;
      qt->bits = 8;
      qt->type = g_strdup ("e4m3");
      if (g_str_equal (method, "fbgemm_fp8"))
        {
          /* One fp32 scale per output row. */
          qt->linear_bytes_per_param = 1.0 + 4.0 / (double)m->hidden;
          return TRUE;
        }
      if (!stow_json_get_array (q, where, "weight_block_size", FALSE, &block,
                                error))
        return FALSE;
      if (block == NULL)
        {
          qt->linear_bytes_per_param = 1.0; /* one scale per tensor */
          return TRUE;
        }
      /* DeepSeek-V3's layout: an fp32 weight_scale_inv per block of
       * rows x columns. */
      JsonNode *rn = json_array_get_length (block) == 2
                         ? json_array_get_element (block, 0)
                         : NULL;
      JsonNode *cn = rn ? json_array_get_element (block, 1) : NULL;
      if (rn == NULL || !JSON_NODE_HOLDS_VALUE (rn)
          || json_node_get_value_type (rn) != G_TYPE_INT64
          || !JSON_NODE_HOLDS_VALUE (cn)
          || json_node_get_value_type (cn) != G_TYPE_INT64)
        return E_INVALID (error,
                          "%s: weight_block_size: "
                          "expected [rows, columns] of integers",
                          where);
      gint64 r = json_node_get_int (rn);
      gint64 c = json_node_get_int (cn);
      if (r < 1 || c < 1 || r > 65536 || c > 65536)
        return E_INVALID (error,
                          "%s: weight_block_size [%" G_GINT64_FORMAT
                          ", %" G_GINT64_FORMAT
                          "]: each must be from 1 to 65536",
                          where, r, c);
      qt->group_size = (guint64)(r * c);
      qt->linear_bytes_per_param = 1.0 + 4.0 / (double)qt->group_size;
      return TRUE;
    }
  g_autofree char *esc = g_strescape (method, NULL);
  g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_UNSUPPORTED,
               "%s: quant_method \"%.40s\" is not "
               "supported (bitsandbytes, gptq, awq, fp8 and fbgemm_fp8 are)",
               where, esc);
  return FALSE;
}

void
stow_model_estimate_checkpoint (StowModel *m)
{
  /* Quantizers replace nn.Linear modules: the attention and MLP
   * projections, the experts and routers.  Embeddings, norms, biases and
   * lm_head (every quantizer's default skip) keep torch_dtype. */
  m->linear_params = m->by_role[STOW_ROLE_ATTENTION] + m->by_role[STOW_ROLE_MLP]
                     + m->by_role[STOW_ROLE_EXPERT]
                     + m->by_role[STOW_ROLE_ROUTER];
  guint db = stow_dtype_bytes (m->torch_dtype);
  double other_b = db ? db : 2.0;
  double lin_b = m->quant.method != STOW_QUANT_NONE
                     ? m->quant.linear_bytes_per_param
                     : other_b;
  m->checkpoint_bytes
      = (guint64)((double)m->linear_params * lin_b
                  + (double)(m->params - m->linear_params) * other_b + 0.5);
  m->checkpoint_bytes_measured = FALSE;
}
