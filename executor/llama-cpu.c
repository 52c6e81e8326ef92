/* SPDX-License-Identifier: MIT
 *
 * executor/llama-cpu.c: the cpu runtime, the cpu backend's provider of the
 * decoder's kernels (executor/kernels.h): its configuration checks, rotary
 * tables and workspace, the embedding and the softmax cross-entropy, and
 * the table over those and the kernels of llama-kernels.c and
 * llama-attention.c.  The recipe that calls them is executor/llama.c.
 */
#include "executor/llama-private.h"

#include <omp.h>

/* ---- embedding ----------------------------------------------------------- */

/* Every token in [0, V); with @targets, negative ones (ignored) too. */
static gboolean
tokens_ok (const StowLlama *L, const gint32 *tokens, guint64 n,
           gboolean targets)
{
  for (guint64 i = 0; i < n; i++)
    if ((tokens[i] < 0 && !targets)
        || (tokens[i] >= 0 && (guint64)tokens[i] >= L->config.vocab))
      {
        g_critical ("llama: token %" G_GUINT64_FORMAT " is %d, outside the "
                    "vocabulary [0, %" G_GUINT64_FORMAT ")",
                    i, tokens[i], L->config.vocab);
        return FALSE;
      }
  return TRUE;
}

static void
embed_forward (void *ctx, const void *embed, const gint32 *tokens, guint64 n,
               void *x)
{
  StowLlama *L = ctx;
  g_return_if_fail (embed != NULL && tokens != NULL && x != NULL);
  g_return_if_fail (tokens_ok (L, tokens, n, FALSE));
  guint64 row = L->esize * L->config.hidden;
#pragma omp parallel for schedule(static) num_threads(L->n_threads)
  for (guint64 r = 0; r < n; r++)
    memcpy ((guint8 *)x + r * row,
            (const guint8 *)embed + (guint64)tokens[r] * row, row);
}

typedef struct
{
  gint32 token;
  guint32 pos;
} TokenPos;

static int
token_pos_cmp (const void *a, const void *b)
{
  const TokenPos *x = a, *y = b;
  if (x->token != y->token)
    return x->token < y->token ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static void
embed_backward (void *ctx, const gint32 *tokens, guint64 n, const void *dx,
                void *dembed, gboolean accumulate)
{
  StowLlama *L = ctx;
  g_return_if_fail (tokens != NULL && dx != NULL && dembed != NULL);
  g_return_if_fail (n <= G_MAXUINT32);
  g_return_if_fail (tokens_ok (L, tokens, n, FALSE));
  guint64 h = L->config.hidden, V = L->config.vocab, e = L->esize;
  if (!accumulate)
    {
#pragma omp parallel for schedule(static) num_threads(L->n_threads)
      for (guint64 r = 0; r < V; r++)
        memset ((guint8 *)dembed + r * h * e, 0, h * e);
    }
  /* Positions grouped by token, in token order within a group: each row
   * of dembed is one thread's, summed in fp32 in position order and
   * rounded once. */
  g_autofree TokenPos *tp = g_new (TokenPos, MAX (n, 1));
  for (guint64 i = 0; i < n; i++)
    tp[i] = (TokenPos){ tokens[i], (guint32)i };
  qsort (tp, n, sizeof *tp, token_pos_cmp);
  g_autofree guint64 *starts = g_new (guint64, n + 1);
  guint64 n_groups = 0;
  for (guint64 i = 0; i < n; i++)
    if (i == 0 || tp[i].token != tp[i - 1].token)
      starts[n_groups++] = i;
  starts[n_groups] = n;
  guint64 W = L->row_floats;
#pragma omp parallel num_threads(L->n_threads)
  {
    float *ws = stow_llama_thread_ws (L, (guint)omp_get_thread_num ());
#pragma omp for schedule(dynamic, 16)
    for (guint64 gi = 0; gi < n_groups; gi++)
      {
        guint64 tok = (guint64)tp[starts[gi]].token;
        void *drow = (guint8 *)dembed + tok * h * e;
        float *acc = ws;
        if (L->bf16)
          stow_llama_row_in (L, drow, h, 0, h, acc);
        else
          acc = drow;
        for (guint64 i = starts[gi]; i < starts[gi + 1]; i++)
          {
            const float *g = stow_llama_row_in (L, dx, h, tp[i].pos, h, ws + W);
#pragma omp simd
            for (guint64 j = 0; j < h; j++)
              acc[j] += g[j];
          }
        if (L->bf16)
          stow_llama_store (L, acc, drow, h);
      }
  }
}

/* ---- the loss -------------------------------------------------------------
 */

/* Row @l (V floats) rounded to bf16 into its own first half, in place:
 * each block is read whole before it is written, and a write reaches only
 * floats read before it (element j's two bytes lie in float j / 2). */
STOW_LLAMA_VEC static void
row_to_bf16_in_place (float *l, guint64 V)
{
  enum
  {
    BLK = 256
  };
  guint16 tmp[BLK];
  for (guint64 j0 = 0; j0 < V; j0 += BLK)
    {
      guint64 nb = MIN ((guint64)BLK, V - j0);
#pragma omp simd
      for (guint64 j = 0; j < nb; j++)
        tmp[j] = stow_f32_to_bf16 (l[j0 + j]);
      memcpy ((guint16 *)l + j0, tmp, nb * sizeof (guint16));
    }
}

/* Softmax cross-entropy of rows [0, cn) of logits (cn, V), in place: each
 * row becomes scale (softmax - onehot (target)) and loss[i] gets
 * logsumexp - logit[target]; a row whose target is negative (ignored)
 * becomes 0 and its loss 0.  With the decoder's loss_lowp (bf16) the
 * gradient row is rounded once to bf16 into the row's first half. */
static void
softmax_xent (StowLlama *L, guint64 cn, float *logits, const gint32 *targets,
              float scale, float *loss)
{
  guint64 V = L->config.vocab;
  gboolean lowp = L->decoder.loss_lowp;
#pragma omp parallel for schedule(dynamic) num_threads(L->n_threads)
  for (guint64 i = 0; i < cn; i++)
    {
      float *l = logits + i * V;
      if (targets[i] < 0)
        {
          memset (l, 0, V * sizeof (float));
          loss[i] = 0;
          continue;
        }
      guint64 t = (guint64)targets[i];
      float lt = l[t], m = stow_llama_row_max (l, V);
      stow_llama_row_exp (l, V, m);
      float sum = stow_llama_row_sum (l, V);
      loss[i] = (m - lt) + logf (sum);
      stow_llama_row_scale (l, V, scale / sum);
      l[t] -= scale;
      if (lowp)
        row_to_bf16_in_place (l, V);
    }
}

static void
xent (void *ctx, guint64 n, float *logits, const gint32 *targets, float scale,
      float *loss, double *loss_sum)
{
  StowLlama *L = ctx;
  g_return_if_fail (tokens_ok (L, targets, n, TRUE));
  softmax_xent (L, n, logits, targets, scale, loss);
  for (guint64 i = 0; i < n; i++)
    *loss_sum += loss[i];
}

/* ---- the table ------------------------------------------------------------
 */

static void
gemm (void *ctx, guint64 M, guint64 N, guint64 K, float alpha, StowMat A,
      StowMat B, void *C, gboolean c_bf16, guint64 ldc, gboolean accumulate,
      const void *R, guint64 ldr, const void *bias)
{
  stow_llama_gemm (ctx, M, N, K, alpha, A, B, C, c_bf16, ldc, accumulate, R,
                   ldr, bias);
}

static void
rmsnorm (void *ctx, guint64 n, guint64 cols, const void *x, const void *w,
         void *y, gboolean y_f32)
{
  stow_llama_rmsnorm (ctx, n, cols, x, w, y, y_f32, NULL);
}

static void
rms_rstd (void *ctx, guint64 n, guint64 cols, const void *x, float *rstd)
{
  stow_llama_rms_rstd (ctx, n, cols, x, rstd);
}

static void
rmsnorm_backward (void *ctx, guint64 n, guint64 cols, const void *dy,
                  gboolean dy_f32, const void *x, const void *w,
                  const float *rstd, const void *dres, void *dx)
{
  stow_llama_rmsnorm_backward (ctx, n, cols, dy, dy_f32, x, w, rstd, dres, dx);
}

static void
rope (void *ctx, guint64 n, guint64 seq, guint64 heads, void *p,
      gboolean inverse)
{
  stow_llama_rope (ctx, n, seq, heads, p, inverse);
}

static void
swiglu (void *ctx, guint64 n, const void *gate, const void *up, void *act)
{
  stow_llama_swiglu (ctx, n, gate, up, act);
}

static void
swiglu_backward (void *ctx, guint64 n, const void *dact, void *gate, void *up)
{
  stow_llama_swiglu_backward (ctx, n, dact, gate, up);
}

static void
colsum (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
        const void *x, const float *rstd, void *g, gboolean accumulate)
{
  stow_llama_colsum (ctx, n, cols, y, y_f32, x, rstd, g, accumulate);
}

static void
colsum_acc_zero (void *ctx)
{
  StowLlama *L = ctx;
  memset (L->col_acc, 0, L->config.hidden * sizeof (double));
}

static void
colsum_acc (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
            const void *x, const float *rstd)
{
  StowLlama *L = ctx;
  g_return_if_fail (cols <= L->config.hidden);
  stow_llama_colsum_acc (L, n, cols, y, y_f32, x, rstd, L->col_acc);
}

static void
colsum_acc_store (void *ctx, guint64 cols, void *g, gboolean accumulate)
{
  StowLlama *L = ctx;
  g_return_if_fail (cols <= L->config.hidden);
  for (guint64 j = 0; j < cols; j++)
    {
      double v = L->col_acc[j];
      if (accumulate)
        v += stow_llama_load1 (L, g, j);
      if (L->bf16)
        ((guint16 *)g)[j] = stow_f32_to_bf16 ((float)v);
      else
        ((float *)g)[j] = (float)v;
    }
}

static void
attention_forward (void *ctx, guint64 batch, guint64 seq, const void *q,
                   const void *k, const void *v, void *o, float *lse)
{
  stow_llama_attention_forward (ctx, batch, seq, q, k, v, o, lse);
}

static void
attention_backward (void *ctx, guint64 batch, guint64 seq, const void *q,
                    const void *k, const void *v, const void *o,
                    const float *lse, const void *dout, void *dq, void *dk,
                    void *dv)
{
  stow_llama_attention_backward (ctx, batch, seq, q, k, v, o, lse, dout, dq, dk,
                                 dv);
}

static void
zero (void *ctx, void *p, guint64 bytes)
{
  memset (p, 0, bytes);
}

static const StowKernels cpu_kernels = {
  .name = "cpu",
  .gemm = gemm,
  .rmsnorm = rmsnorm,
  .rms_rstd = rms_rstd,
  .rmsnorm_backward = rmsnorm_backward,
  .rope = rope,
  .swiglu = swiglu,
  .swiglu_backward = swiglu_backward,
  .colsum = colsum,
  .colsum_acc_zero = colsum_acc_zero,
  .colsum_acc = colsum_acc,
  .colsum_acc_store = colsum_acc_store,
  .attention_forward = attention_forward,
  .attention_backward = attention_backward,
  .embed_forward = embed_forward,
  .embed_backward = embed_backward,
  .xent = xent,
  .zero = zero,
};

/* ---- the runtime ----------------------------------------------------------
 */

static gboolean
check_config (const StowLlamaConfig *c, StowDtype dtype, guint64 max_seq,
              GError **error)
{
  if (!stow_llama_config_check (c, error))
    return FALSE;
  /* cblas takes int sizes: every GEMM dimension must fit one. */
  if (max_seq == 0 || max_seq > G_MAXINT)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama runtime: max_seq (%" G_GUINT64_FORMAT
                   ") must be 1 to %d",
                   max_seq, G_MAXINT);
      return FALSE;
    }
  if (dtype != STOW_DTYPE_F32 && dtype != STOW_DTYPE_BF16)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_INVALID,
                   "llama runtime: dtype %s: runs fp32 and bf16",
                   stow_dtype_nick (dtype));
      return FALSE;
    }
  return TRUE;
}

/* Inverse frequency i of d/2, with Llama 3's scaling as HF's
 * _compute_llama3_parameters applies it: long wavelengths divided by the
 * factor, short ones kept, the band between interpolated. */
static double
rope_inv_freq (const StowLlamaConfig *c, guint64 i)
{
  double d = (double)c->head_dim;
  double inv = 1.0 / pow (c->rope_theta, (double)(2 * i) / d);
  if (c->rope_factor == 0)
    return inv;
  double old = (double)c->rope_original_max_positions;
  double low_wavelen = old / c->rope_low_freq_factor;
  double high_wavelen = old / c->rope_high_freq_factor;
  double wavelen = 2 * G_PI / inv;
  if (wavelen < high_wavelen)
    return inv;
  if (wavelen > low_wavelen)
    return inv / c->rope_factor;
  double smooth = (old / wavelen - c->rope_low_freq_factor)
                  / (c->rope_high_freq_factor - c->rope_low_freq_factor);
  return (1 - smooth) * inv / c->rope_factor + smooth * inv;
}

StowLlama *
stow_llama_new (const StowLlamaConfig *config, StowDtype dtype, guint64 max_seq,
                guint n_threads, GError **error)
{
  g_return_val_if_fail (config != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  if (!check_config (config, dtype, max_seq, error))
    return NULL;
  if (!stow_gemm_init (error))
    return NULL;

  StowLlama *L = g_new0 (StowLlama, 1);
  const StowLlamaConfig *c = &L->config;
  L->config = *config;
  L->dtype = dtype;
  L->bf16 = dtype == STOW_DTYPE_BF16;
  L->attn_lowp = L->bf16 && stow_gemm_choice ()->bf16_native;
  L->esize = stow_dtype_size (dtype);
  L->max_seq = max_seq;
  L->n_threads = n_threads ? n_threads : g_get_num_processors ();

  guint64 d = c->head_dim, half = d / 2;
  L->row_floats = MAX (MAX (c->hidden, c->ffn), c->n_heads * d);
  guint64 per_thread
      = MAX (4 * L->row_floats,
             stow_llama_attention_thread_floats (max_seq, d, L->attn_lowp));
  /* Whole cache lines per thread: no two threads share one. */
  L->thread_floats = (per_thread + 15) / 16 * 16;
  L->thread_ws
      = g_aligned_alloc (L->thread_floats * L->n_threads, sizeof (float), 64);
  L->rope_cos = g_aligned_alloc (max_seq * half, sizeof (float), 64);
  L->rope_sin = g_aligned_alloc (max_seq * half, sizeof (float), 64);
  L->col_acc = g_aligned_alloc (c->hidden, sizeof (double), 64);
  guint64 tile_floats = 0, panel_floats = 0;
  if (L->bf16)
    {
      /* The tiles of products with a bf16 C, the panels of products with
       * one bf16 operand (the loss's) or two the kernel does not multiply
       * (llama-kernels.c's tiled_product). */
      tile_floats
          = (guint64)L->n_threads * STOW_LLAMA_TILE_M * STOW_LLAMA_TILE_N;
      panel_floats = (guint64)L->n_threads
                     * (STOW_LLAMA_TILE_M + STOW_LLAMA_TILE_N)
                     * STOW_LLAMA_STAGE_K;
      L->tile_ws = g_aligned_alloc (tile_floats, sizeof (float), 64);
      L->panel_ws = g_aligned_alloc (panel_floats, sizeof (float), 64);
    }
  L->ws_bytes = 4
                    * (L->thread_floats * L->n_threads + 2 * max_seq * half
                       + tile_floats + panel_floats)
                + 8 * c->hidden;
  L->decoder = (StowDecoder){
    .k = &cpu_kernels,
    .ctx = L,
    .config = *config,
    .bf16 = L->bf16,
    .esize = L->esize,
    .max_seq = max_seq,
    /* At bf16 the fused loss's products take bf16 operands, xn and the
     * logits' gradient rounded once each (as the cuda runtime does, and
     * PyTorch's autocast, whose lm_head runs in bf16): they run on the
     * kernel's bf16 path (AMX), not staged to fp32 beside the bf16 head.
     * The loss itself, the softmax and the logits stay fp32. */
    .loss_lowp = L->bf16,
  };
  /* A bench's hook: every kernel call timed (executor/kernel-times.h),
   * the calls written out when the runtime is freed. */
  const char *times_path = g_getenv ("STOWAGE_KERNEL_TIMES");
  if (times_path != NULL && times_path[0] != '\0')
    {
      L->times = stow_kernel_times_new (&cpu_kernels, L);
      L->times_path = g_strdup (times_path);
      L->decoder.k = stow_kernel_times_table ();
      L->decoder.ctx = L->times;
    }

  /* Angles in double, rounded once: positions times frequencies stay
   * exact far past where an fp32 product would lose the phase. */
  for (guint64 i = 0; i < half; i++)
    {
      double inv = rope_inv_freq (c, i);
      for (guint64 t = 0; t < max_seq; t++)
        {
          L->rope_cos[t * half + i] = (float)cos ((double)t * inv);
          L->rope_sin[t * half + i] = (float)sin ((double)t * inv);
        }
    }
  return L;
}

void
stow_llama_free (StowLlama *L)
{
  if (L == NULL)
    return;
  if (L->times != NULL)
    {
      g_autofree char *described = stow_gemm_describe ();
      g_autofree char *kernel = g_strescape (described, NULL);
      g_autofree char *header = g_strdup_printf (
          "\"dtype\": \"%s\", \"threads\": %u, \"gemm\": \"%s\"",
          stow_dtype_nick (L->dtype), L->n_threads, kernel);
      g_autoptr (GError) error = NULL;
      if (!stow_kernel_times_write (L->times, L->times_path, header, &error))
        g_warning ("%s", error->message);
      stow_kernel_times_free (L->times);
      g_free (L->times_path);
    }
  g_aligned_free (L->thread_ws);
  g_aligned_free (L->rope_cos);
  g_aligned_free (L->rope_sin);
  g_aligned_free (L->col_acc);
  g_aligned_free (L->tile_ws);
  g_aligned_free (L->panel_ws);
  g_free (L);
}

const StowLlamaConfig *
stow_llama_get_config (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, NULL);
  return &L->config;
}

StowDtype
stow_llama_get_dtype (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, STOW_DTYPE_NONE);
  return L->dtype;
}

guint
stow_llama_get_n_threads (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, 0);
  return L->n_threads;
}

guint64
stow_llama_workspace_bytes (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, 0);
  return L->ws_bytes;
}

const StowDecoder *
stow_llama_decoder (const StowLlama *L)
{
  g_return_val_if_fail (L != NULL, NULL);
  return &L->decoder;
}

const float *
stow_llama_rope_table (const StowLlama *L, gboolean sin)
{
  g_return_val_if_fail (L != NULL, NULL);
  return sin ? L->rope_sin : L->rope_cos;
}

guint64
stow_llama_saved_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_saved_bytes (&L->config, L->esize, n_tokens);
}

guint64
stow_llama_out_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_out_bytes (&L->config, L->esize, n_tokens);
}

guint64
stow_llama_backward_ws_bytes (const StowLlama *L, guint64 n_tokens)
{
  g_return_val_if_fail (L != NULL, 0);
  return stow_llama_config_backward_ws_bytes (&L->config, L->esize, n_tokens);
}

void
stow_llama_saved_carve (const StowLlama *L, guint64 n, void *rest, void *out,
                        StowLlamaSaved *s)
{
  g_return_if_fail (L != NULL);
  stow_llama_config_saved_carve (&L->config, L->esize, n, rest, out, s);
}
