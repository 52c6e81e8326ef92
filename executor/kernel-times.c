/* SPDX-License-Identifier: MIT
 *
 * executor/kernel-times.c: the timing kernel table (kernel-times.h): one
 * wrapper per entry of kernels.h that calls the inner table's, and the
 * calls it saw, in memory until written.  A bench hook: nothing here
 * changes what a kernel computes.
 */
#include "executor/kernel-times.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

typedef enum
{
  E_GEMM,
  E_RMSNORM,
  E_RMS_RSTD,
  E_RMSNORM_BACKWARD,
  E_ROPE,
  E_SWIGLU,
  E_SWIGLU_BACKWARD,
  E_COLSUM,
  E_COLSUM_ACC_ZERO,
  E_COLSUM_ACC,
  E_COLSUM_ACC_STORE,
  E_ATTENTION_FORWARD,
  E_ATTENTION_BACKWARD,
  E_EMBED_FORWARD,
  E_EMBED_BACKWARD,
  E_XENT,
  E_ZERO,
  E_N
} Entry;

/* kernels.h's field names. */
static const char *const entry_names[E_N] = {
  [E_GEMM] = "gemm",
  [E_RMSNORM] = "rmsnorm",
  [E_RMS_RSTD] = "rms_rstd",
  [E_RMSNORM_BACKWARD] = "rmsnorm_backward",
  [E_ROPE] = "rope",
  [E_SWIGLU] = "swiglu",
  [E_SWIGLU_BACKWARD] = "swiglu_backward",
  [E_COLSUM] = "colsum",
  [E_COLSUM_ACC_ZERO] = "colsum_acc_zero",
  [E_COLSUM_ACC] = "colsum_acc",
  [E_COLSUM_ACC_STORE] = "colsum_acc_store",
  [E_ATTENTION_FORWARD] = "attention_forward",
  [E_ATTENTION_BACKWARD] = "attention_backward",
  [E_EMBED_FORWARD] = "embed_forward",
  [E_EMBED_BACKWARD] = "embed_backward",
  [E_XENT] = "xent",
  [E_ZERO] = "zero",
};

enum
{
  A_BF16 = 1,
  B_BF16 = 2,
  C_BF16 = 4,
};

typedef struct
{
  guint32 entry, flags;
  guint64 m, n, k;
  gint64 t0_ns, ns, cpu_ns;
} Call;

struct StowKernelTimes
{
  const StowKernels *inner;
  void *ctx;
  GMutex lock;
  GArray *calls; /* Call */
};

static gint64
clock_ns (clockid_t id)
{
  struct timespec ts;
  clock_gettime (id, &ts);
  return (gint64)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A call's start: the monotonic clock and the process's CPU time. */
typedef struct
{
  gint64 wall, cpu;
} Start;

static Start
start (void)
{
  return (Start){ clock_ns (CLOCK_MONOTONIC),
                  clock_ns (CLOCK_PROCESS_CPUTIME_ID) };
}

static void
record (StowKernelTimes *t, Entry e, Start t0, guint32 flags, guint64 m,
        guint64 n, guint64 k)
{
  gint64 cpu = clock_ns (CLOCK_PROCESS_CPUTIME_ID);
  Call c = {
    e,           flags, m, n, k, t0.wall, clock_ns (CLOCK_MONOTONIC) - t0.wall,
    cpu - t0.cpu
  };
  g_mutex_lock (&t->lock);
  g_array_append_val (t->calls, c);
  g_mutex_unlock (&t->lock);
}

/* ---- the wrappers -------------------------------------------------------- */

/* Runs @call (an inner entry on t->ctx) and records it as @e. */
#define TIMED(e, call)                                                         \
  do                                                                           \
    {                                                                          \
      StowKernelTimes *t = ctx;                                                \
      Start t0 = start ();                                                     \
      t->inner->call;                                                          \
      record (t, e, t0, 0, 0, 0, 0);                                           \
    }                                                                          \
  while (0)

static void
t_gemm (void *ctx, guint64 M, guint64 N, guint64 K, float alpha, StowMat A,
        StowMat B, void *C, gboolean c_bf16, guint64 ldc, gboolean accumulate,
        const void *R, guint64 ldr, const void *bias)
{
  StowKernelTimes *t = ctx;
  Start t0 = start ();
  t->inner->gemm (t->ctx, M, N, K, alpha, A, B, C, c_bf16, ldc, accumulate, R,
                  ldr, bias);
  guint32 flags
      = (A.bf16 ? A_BF16 : 0) | (B.bf16 ? B_BF16 : 0) | (c_bf16 ? C_BF16 : 0);
  record (t, E_GEMM, t0, flags, M, N, K);
}

static void
t_rmsnorm (void *ctx, guint64 n, guint64 cols, const void *x, const void *w,
           void *y, gboolean y_f32)
{
  TIMED (E_RMSNORM, rmsnorm (t->ctx, n, cols, x, w, y, y_f32));
}

static void
t_rms_rstd (void *ctx, guint64 n, guint64 cols, const void *x, float *rstd)
{
  TIMED (E_RMS_RSTD, rms_rstd (t->ctx, n, cols, x, rstd));
}

static void
t_rmsnorm_backward (void *ctx, guint64 n, guint64 cols, const void *dy,
                    gboolean dy_f32, const void *x, const void *w,
                    const float *rstd, const void *dres, void *dx)
{
  TIMED (E_RMSNORM_BACKWARD,
         rmsnorm_backward (t->ctx, n, cols, dy, dy_f32, x, w, rstd, dres, dx));
}

static void
t_rope (void *ctx, guint64 n, guint64 seq, guint64 heads, void *p,
        gboolean inverse)
{
  TIMED (E_ROPE, rope (t->ctx, n, seq, heads, p, inverse));
}

static void
t_swiglu (void *ctx, guint64 n, const void *gate, const void *up, void *act)
{
  TIMED (E_SWIGLU, swiglu (t->ctx, n, gate, up, act));
}

static void
t_swiglu_backward (void *ctx, guint64 n, const void *dact, void *gate, void *up)
{
  TIMED (E_SWIGLU_BACKWARD, swiglu_backward (t->ctx, n, dact, gate, up));
}

static void
t_colsum (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
          const void *x, const float *rstd, void *g, gboolean accumulate)
{
  TIMED (E_COLSUM, colsum (t->ctx, n, cols, y, y_f32, x, rstd, g, accumulate));
}

static void
t_colsum_acc_zero (void *ctx)
{
  TIMED (E_COLSUM_ACC_ZERO, colsum_acc_zero (t->ctx));
}

static void
t_colsum_acc (void *ctx, guint64 n, guint64 cols, const void *y, gboolean y_f32,
              const void *x, const float *rstd)
{
  TIMED (E_COLSUM_ACC, colsum_acc (t->ctx, n, cols, y, y_f32, x, rstd));
}

static void
t_colsum_acc_store (void *ctx, guint64 cols, void *g, gboolean accumulate)
{
  TIMED (E_COLSUM_ACC_STORE, colsum_acc_store (t->ctx, cols, g, accumulate));
}

static void
t_attention_forward (void *ctx, guint64 batch, guint64 seq, const void *q,
                     const void *k, const void *v, void *o, float *lse)
{
  TIMED (E_ATTENTION_FORWARD,
         attention_forward (t->ctx, batch, seq, q, k, v, o, lse));
}

static void
t_attention_backward (void *ctx, guint64 batch, guint64 seq, const void *q,
                      const void *k, const void *v, const void *o,
                      const float *lse, const void *dout, void *dq, void *dk,
                      void *dv)
{
  TIMED (E_ATTENTION_BACKWARD, attention_backward (t->ctx, batch, seq, q, k, v,
                                                   o, lse, dout, dq, dk, dv));
}

static void
t_embed_forward (void *ctx, const void *embed, const gint32 *tokens, guint64 n,
                 void *x)
{
  TIMED (E_EMBED_FORWARD, embed_forward (t->ctx, embed, tokens, n, x));
}

static void
t_embed_backward (void *ctx, const gint32 *tokens, guint64 n, const void *dx,
                  void *dembed, gboolean accumulate)
{
  TIMED (E_EMBED_BACKWARD,
         embed_backward (t->ctx, tokens, n, dx, dembed, accumulate));
}

static void
t_xent (void *ctx, guint64 n, float *logits, const gint32 *targets, float scale,
        float *loss, double *loss_sum)
{
  TIMED (E_XENT, xent (t->ctx, n, logits, targets, scale, loss, loss_sum));
}

static void
t_zero (void *ctx, void *p, guint64 bytes)
{
  TIMED (E_ZERO, zero (t->ctx, p, bytes));
}

static gboolean
t_failed (void *ctx)
{
  StowKernelTimes *t = ctx;
  return t->inner->failed != NULL && t->inner->failed (t->ctx);
}

#undef TIMED

static const StowKernels timed_kernels = {
  .name = "timed",
  .gemm = t_gemm,
  .rmsnorm = t_rmsnorm,
  .rms_rstd = t_rms_rstd,
  .rmsnorm_backward = t_rmsnorm_backward,
  .rope = t_rope,
  .swiglu = t_swiglu,
  .swiglu_backward = t_swiglu_backward,
  .colsum = t_colsum,
  .colsum_acc_zero = t_colsum_acc_zero,
  .colsum_acc = t_colsum_acc,
  .colsum_acc_store = t_colsum_acc_store,
  .attention_forward = t_attention_forward,
  .attention_backward = t_attention_backward,
  .embed_forward = t_embed_forward,
  .embed_backward = t_embed_backward,
  .xent = t_xent,
  .zero = t_zero,
  .failed = t_failed,
};

/* ---- the object ---------------------------------------------------------- */

StowKernelTimes *
stow_kernel_times_new (const StowKernels *inner, void *inner_ctx)
{
  g_return_val_if_fail (inner != NULL, NULL);
  StowKernelTimes *t = g_new0 (StowKernelTimes, 1);
  t->inner = inner;
  t->ctx = inner_ctx;
  g_mutex_init (&t->lock);
  t->calls = g_array_new (FALSE, FALSE, sizeof (Call));
  return t;
}

void
stow_kernel_times_free (StowKernelTimes *t)
{
  if (t == NULL)
    return;
  g_array_unref (t->calls);
  g_mutex_clear (&t->lock);
  g_free (t);
}

const StowKernels *
stow_kernel_times_table (void)
{
  return &timed_kernels;
}

gboolean
stow_kernel_times_total (const StowKernelTimes *t, const char *entry,
                         StowKernelTotal *total)
{
  g_return_val_if_fail (t != NULL && entry != NULL && total != NULL, FALSE);
  guint e = 0;
  while (e < E_N && !g_str_equal (entry_names[e], entry))
    e++;
  if (e == E_N)
    return FALSE;
  *total = (StowKernelTotal){ 0 };
  for (guint i = 0; i < t->calls->len; i++)
    {
      const Call *c = &g_array_index (t->calls, Call, i);
      if (c->entry != e)
        continue;
      total->calls++;
      total->seconds += (double)c->ns * 1e-9;
      total->flops += 2.0 * (double)c->m * (double)c->n * (double)c->k;
    }
  return TRUE;
}

gboolean
stow_kernel_times_write (const StowKernelTimes *t, const char *path,
                         const char *header, GError **error)
{
  g_return_val_if_fail (t != NULL && path != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);
  FILE *f = fopen (path, "a");
  if (f == NULL)
    {
      int e = errno;
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
                   "STOWAGE_KERNEL_TIMES %s: %s", path, g_strerror (e));
      return FALSE;
    }
  fprintf (f, "{\"kernel_times\": 1%s%s}\n", header ? ", " : "",
           header ? header : "");
  for (guint i = 0; i < t->calls->len; i++)
    {
      const Call *c = &g_array_index (t->calls, Call, i);
      fprintf (f,
               "{\"entry\": \"%s\", \"t0_ns\": %" G_GINT64_FORMAT
               ", \"ns\": %" G_GINT64_FORMAT ", \"cpu_ns\": %" G_GINT64_FORMAT,
               entry_names[c->entry], c->t0_ns, c->ns, c->cpu_ns);
      if (c->entry == E_GEMM)
        fprintf (f,
                 ", \"m\": %" G_GUINT64_FORMAT ", \"n\": %" G_GUINT64_FORMAT
                 ", \"k\": %" G_GUINT64_FORMAT
                 ", \"a_bf16\": %s, \"b_bf16\": %s, \"c_bf16\": %s",
                 c->m, c->n, c->k, c->flags & A_BF16 ? "true" : "false",
                 c->flags & B_BF16 ? "true" : "false",
                 c->flags & C_BF16 ? "true" : "false");
      fputs ("}\n", f);
    }
  gboolean ok = !ferror (f);
  if (fclose (f) != 0)
    ok = FALSE;
  if (!ok)
    g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_IO,
                 "STOWAGE_KERNEL_TIMES %s: write failed", path);
  return ok;
}
