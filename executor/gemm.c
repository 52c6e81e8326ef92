/* SPDX-License-Identifier: MIT
 *
 * executor/gemm.c: the cpu backend's matrix-product kernels (gemm.h):
 * the CPU's features from cpuid and XCR0, the OpenBLAS core type they call
 * for, OpenBLAS loaded with dlopen after OPENBLAS_CORETYPE is set (its
 * constructor reads the variable once, when the library is loaded), and
 * oneDNN's matmul with one primitive per shape, created for one thread and
 * run on the caller's.  Not here: tiling and threads (llama-kernels.c).
 */
#include "config.h"

#include "executor/gemm.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <omp.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "executor/llama.h" /* STOW_LLAMA_ERROR */

/* ---- the CPU's features -------------------------------------------------- */

void
stow_cpu_features_probe (StowCpuFeatures *f)
{
  memset (f, 0, sizeof *f);
  guint a, b, c, d, max;
  if (!__get_cpuid (0, &max, &b, &c, &d))
    return;
  /* "AuthenticAMD": ebx "Auth", edx "enti", ecx "cAMD"; Hygon too. */
  f->amd = (b == 0x68747541 && c == 0x444d4163)
           || (b == 0x6f677948 && c == 0x656e6975);
  __cpuid (1, a, b, c, d);
  gboolean osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1;
  guint64 xcr0 = 0;
  if (osxsave)
    {
      guint lo, hi;
      __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      xcr0 = ((guint64)hi << 32) | lo;
    }
  /* The OS saves xmm and ymm (bits 1, 2), the opmask and zmm (5-7), the
   * tile config and data (17, 18). */
  gboolean os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
  gboolean os_tile = (xcr0 & 0x60000) == 0x60000;
  if (max < 7)
    return;
  __cpuid_count (7, 0, a, b, c, d);
  f->avx2 = avx && fma && os_ymm && ((b >> 5) & 1);
  /* F (b16), DQ (b17), CD (b28), BW (b30), VL (b31): Skylake-SP's set,
   * the one OpenBLAS's SkylakeX and oneDNN's avx512_core kernels use. */
  guint32 skx = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  f->avx512 = f->avx2 && os_zmm && (b & skx) == skx;
  gboolean amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  f->amx = f->avx512 && os_tile && amx_bf16 && amx_tile;
  __cpuid_count (7, 1, a, b, c, d);
  f->bf16 = f->avx512 && ((a >> 5) & 1);
}

char *
stow_cpu_features_string (const StowCpuFeatures *f)
{
  GString *s = g_string_new (NULL);
  struct
  {
    gboolean on;
    const char *name;
  } names[] = {
    { f->avx2, "avx2" },
    { f->avx512, "avx512" },
    { f->bf16, "avx512_bf16" },
    { f->amx, "amx_bf16" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    if (names[i].on)
      g_string_append_printf (s, "%s%s", s->len ? " " : "", names[i].name);
  if (s->len == 0)
    g_string_append (s, "none");
  return g_string_free (s, FALSE);
}

const char *
stow_openblas_core_for (const StowCpuFeatures *f)
{
  /* OpenBLAS 0.3.21 picks a core by family and model number and falls
   * back to Prescott (SSE3) for a model it does not list, even one with
   * AVX-512 (4096^2 sgemm at 37 GFLOP/s instead of 264, issue 40).  The
   * features decide here.  Cooperlake carries SkylakeX's sgemm kernels
   * (kernel/x86_64/KERNEL.COOPERLAKE includes KERNEL.SKYLAKEX) and adds
   * bf16 ones: the same fp32 bits either way.  Zen runs Haswell's kernels
   * with its own blocking. */
  if (f->avx512)
    return f->bf16 ? "Cooperlake" : "SkylakeX";
  if (f->avx2)
    return f->amd ? "Zen" : "Haswell";
  return NULL;
}

/* ---- OpenBLAS ------------------------------------------------------------ */

/* cblas_sgemm's enums (cblas.h): row-major 101, no transpose 111,
 * transpose 112. */
typedef void (*SgemmFn) (int order, int ta, int tb, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc);

static struct
{
  void *lib;
  SgemmFn sgemm;
  void (*set_threads) (int);
  char *(*corename) (void);
  char *(*config) (void);
} ob;

static gboolean
openblas_load (const char *core, GError **error)
{
  /* OpenBLAS picks its core in a constructor, when it is loaded: the
   * variable must be in the environment before dlopen, and nothing in
   * the process may link OpenBLAS itself (the build only uses its
   * headers). */
  if (core != NULL && g_getenv ("OPENBLAS_CORETYPE") == NULL)
    g_setenv ("OPENBLAS_CORETYPE", core, TRUE);
  const char *names[]
      = { "libopenblas.so.0", STOW_OPENBLAS_LIBDIR "/libopenblas.so.0" };
  for (guint i = 0; i < G_N_ELEMENTS (names) && ob.lib == NULL; i++)
    ob.lib = dlopen (names[i], RTLD_NOW | RTLD_LOCAL);
  if (ob.lib == NULL)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_KERNEL,
                   "OpenBLAS: cannot load libopenblas.so.0: %s", dlerror ());
      return FALSE;
    }
  ob.sgemm = (SgemmFn)dlsym (ob.lib, "cblas_sgemm");
  ob.set_threads = (void (*) (int))dlsym (ob.lib, "openblas_set_num_threads");
  ob.corename = (char *(*)(void))dlsym (ob.lib, "openblas_get_corename");
  ob.config = (char *(*)(void))dlsym (ob.lib, "openblas_get_config");
  if (ob.sgemm == NULL || ob.set_threads == NULL || ob.corename == NULL
      || ob.config == NULL)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_KERNEL,
                   "OpenBLAS: libopenblas.so.0 lacks cblas_sgemm or "
                   "openblas_get_corename");
      return FALSE;
    }
  /* Every call comes from one thread of an OpenMP region, on its own
   * tile: OpenBLAS's pthreads would only spin against OpenMP's. */
  ob.set_threads (1);
  return TRUE;
}

/* "OpenBLAS 0.3.21" from openblas_get_config's "OpenBLAS 0.3.21 ...". */
static char *
openblas_version (void)
{
  g_auto (GStrv) w = g_strsplit (ob.config (), " ", 3);
  return g_strdup_printf ("%s %s", w[0] ? w[0] : "OpenBLAS",
                          w[0] && w[1] ? w[1] : "?");
}

/* ---- oneDNN -------------------------------------------------------------- */

/* One product's shape: the key of its primitive. */
typedef struct
{
  dnnl_data_type_t dt;
  gboolean ta, tb;
  guint64 M, N, K, lda, ldb, ldc;
  float alpha, beta;
} MatmulKey;

typedef struct
{
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a, b, c, scratch;
  guint64 scratch_bytes;
} Matmul;

static struct
{
  dnnl_engine_t engine;
  GMutex lock;
  GHashTable *cache; /* MatmulKey -> Matmul */
} dn;

/* Per thread: its stream and its scratchpad (primitives are created with
 * user scratchpads, so two threads never share one). */
typedef struct
{
  dnnl_stream_t stream;
  void *scratch;
  guint64 scratch_bytes;
  /* The primitives this thread has run, by key: looked up without the
   * lock, which two threads asking thousands of times a step would
   * otherwise fight over. */
  GHashTable *seen;
} DnThread;

static void
dn_thread_free (gpointer p)
{
  DnThread *t = p;
  if (t->stream != NULL)
    dnnl_stream_destroy (t->stream);
  if (t->seen != NULL)
    g_hash_table_destroy (t->seen);
  g_free (t->scratch);
  g_free (t);
}

static GPrivate dn_thread = G_PRIVATE_INIT (dn_thread_free);

static guint key_hash (gconstpointer p);
static gboolean key_equal (gconstpointer a, gconstpointer b);

static guint
key_hash (gconstpointer p)
{
  const MatmulKey *k = p;
  guint64 h = (guint64)k->dt * 31 + (guint64)k->ta * 7 + (guint64)k->tb;
  guint64 v[] = { k->M, k->N, k->K, k->lda, k->ldb, k->ldc };
  for (guint i = 0; i < G_N_ELEMENTS (v); i++)
    h = h * 1000003u ^ v[i];
  guint32 ab[2];
  memcpy (&ab[0], &k->alpha, 4);
  memcpy (&ab[1], &k->beta, 4);
  h = h * 1000003u ^ ab[0];
  h = h * 1000003u ^ ab[1];
  return (guint)(h ^ (h >> 32));
}

static gboolean
key_equal (gconstpointer a, gconstpointer b)
{
  const MatmulKey *x = a, *y = b;
  return x->dt == y->dt && x->ta == y->ta && x->tb == y->tb && x->M == y->M
         && x->N == y->N && x->K == y->K && x->lda == y->lda && x->ldb == y->ldb
         && x->ldc == y->ldc && memcmp (&x->alpha, &y->alpha, 4) == 0
         && memcmp (&x->beta, &y->beta, 4) == 0;
}

static void
matmul_free (gpointer p)
{
  Matmul *m = p;
  if (m->prim != NULL)
    dnnl_primitive_destroy (m->prim);
  g_free (m);
}

/* The primitive of @k, NULL when oneDNN refuses the shape; its
 * implementation's name in *@impl when asked (static storage). */
static Matmul *
matmul_create (const MatmulKey *k, const char **impl)
{
  dnnl_memory_desc_t a, b, c;
  dnnl_dims_t ad = { (dnnl_dim_t)k->M, (dnnl_dim_t)k->K };
  dnnl_dims_t bd = { (dnnl_dim_t)k->K, (dnnl_dim_t)k->N };
  dnnl_dims_t cd = { (dnnl_dim_t)k->M, (dnnl_dim_t)k->N };
  /* A stored (K, M) is op(A) with strides (1, lda): no copy. */
  dnnl_dims_t as
      = { k->ta ? 1 : (dnnl_dim_t)k->lda, k->ta ? (dnnl_dim_t)k->lda : 1 };
  dnnl_dims_t bs
      = { k->tb ? 1 : (dnnl_dim_t)k->ldb, k->tb ? (dnnl_dim_t)k->ldb : 1 };
  dnnl_dims_t cs = { (dnnl_dim_t)k->ldc, 1 };
  if (dnnl_memory_desc_init_by_strides (&a, 2, ad, k->dt, as) != dnnl_success
      || dnnl_memory_desc_init_by_strides (&b, 2, bd, k->dt, bs) != dnnl_success
      || dnnl_memory_desc_init_by_strides (&c, 2, cd, dnnl_f32, cs)
             != dnnl_success)
    return NULL;
  dnnl_matmul_desc_t md;
  if (dnnl_matmul_desc_init (&md, &a, &b, NULL, &c) != dnnl_success)
    return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  Matmul *m = NULL;
  if (dnnl_primitive_attr_create (&attr) != dnnl_success)
    return NULL;
  dnnl_primitive_attr_set_scratchpad_mode (attr, dnnl_scratchpad_mode_user);
  if (k->alpha != 1.0f)
    dnnl_primitive_attr_set_output_scales (attr, 1, 0, &k->alpha);
  if (k->beta != 0.0f)
    {
      /* C = alpha A B + beta C: the sum post-op adds the old C. */
      dnnl_post_ops_create (&po);
      dnnl_post_ops_append_sum (po, k->beta);
      dnnl_primitive_attr_set_post_ops (attr, po);
    }
  /* Created for one thread: the blocking (and with it every sum's order)
   * then depends on the shape alone, and the primitive runs whole on the
   * calling thread inside the callers' OpenMP regions. */
  int threads = omp_get_max_threads ();
  omp_set_num_threads (1);
  dnnl_status_t st
      = dnnl_primitive_desc_create (&pd, &md, attr, dn.engine, NULL);
  omp_set_num_threads (threads);
  if (st == dnnl_success)
    {
      m = g_new0 (Matmul, 1);
      if (dnnl_primitive_create (&m->prim, pd) != dnnl_success)
        g_clear_pointer (&m, matmul_free);
    }
  if (m != NULL)
    {
      m->a = *dnnl_primitive_desc_query_md (pd, dnnl_query_src_md, 0);
      m->b = *dnnl_primitive_desc_query_md (pd, dnnl_query_weights_md, 0);
      m->c = *dnnl_primitive_desc_query_md (pd, dnnl_query_dst_md, 0);
      m->scratch
          = *dnnl_primitive_desc_query_md (pd, dnnl_query_scratchpad_md, 0);
      m->scratch_bytes = dnnl_memory_desc_get_size (&m->scratch);
      if (impl != NULL)
        {
          const char *s = NULL;
          dnnl_primitive_desc_query (pd, dnnl_query_impl_info_str, 0, &s);
          static char name[64];
          g_strlcpy (name, s ? s : "?", sizeof name);
          *impl = name;
        }
    }
  if (pd != NULL)
    dnnl_primitive_desc_destroy (pd);
  if (po != NULL)
    dnnl_post_ops_destroy (po);
  dnnl_primitive_attr_destroy (attr);
  return m;
}

static const Matmul *
matmul_get (const MatmulKey *k)
{
  g_mutex_lock (&dn.lock);
  Matmul *m = g_hash_table_lookup (dn.cache, k);
  if (m == NULL)
    {
      m = matmul_create (k, NULL);
      if (m == NULL)
        g_error ("oneDNN: no matmul for %" G_GUINT64_FORMAT
                 " x %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT,
                 k->M, k->N, k->K);
      g_hash_table_insert (dn.cache, g_memdup2 (k, sizeof *k), m);
    }
  g_mutex_unlock (&dn.lock);
  return m;
}

static void
matmul_run (const MatmulKey *k, const void *A, const void *B, float *C)
{
  DnThread *t = g_private_get (&dn_thread);
  if (t == NULL)
    {
      t = g_new0 (DnThread, 1);
      if (dnnl_stream_create (&t->stream, dn.engine, dnnl_stream_default_flags)
          != dnnl_success)
        g_error ("oneDNN: cannot create a stream");
      t->seen = g_hash_table_new_full (key_hash, key_equal, g_free, NULL);
      g_private_set (&dn_thread, t);
    }
  const Matmul *m = g_hash_table_lookup (t->seen, k);
  if (m == NULL)
    {
      m = matmul_get (k);
      g_hash_table_insert (t->seen, g_memdup2 (k, sizeof *k), (gpointer)m);
    }
  if (m->scratch_bytes > t->scratch_bytes)
    {
      g_free (t->scratch);
      t->scratch = g_malloc (m->scratch_bytes);
      t->scratch_bytes = m->scratch_bytes;
    }
  dnnl_memory_t ma, mb, mc, ms = NULL;
  dnnl_memory_create (&ma, &m->a, dn.engine, (void *)A);
  dnnl_memory_create (&mb, &m->b, dn.engine, (void *)B);
  dnnl_memory_create (&mc, &m->c, dn.engine, C);
  dnnl_exec_arg_t args[4] = {
    { DNNL_ARG_SRC, ma },
    { DNNL_ARG_WEIGHTS, mb },
    { DNNL_ARG_DST, mc },
  };
  int n_args = 3;
  if (m->scratch_bytes > 0)
    {
      dnnl_memory_create (&ms, &m->scratch, dn.engine, t->scratch);
      args[n_args++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, ms };
    }
  /* oneDNN opens a parallel region of omp_get_max_threads () threads in
   * a call unless OpenMP says it runs inside an active one, and a team of
   * one thread (--threads 1) is not active: each call then made a nested
   * team (a thread created and joined per call, a second core taken) and
   * split some products otherwise (an fp32 512 x 768 x 2048 onto the
   * residual: other bits on 1 thread than on 2, /gemm/thread-bits).  The
   * primitive is the calling thread's alone: one thread while it runs. */
  int threads = omp_get_max_threads ();
  omp_set_num_threads (1);
  dnnl_status_t st = dnnl_primitive_execute (m->prim, t->stream, n_args, args);
  omp_set_num_threads (threads);
  if (st != dnnl_success)
    g_error ("oneDNN: matmul %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
             " x %" G_GUINT64_FORMAT " failed",
             k->M, k->N, k->K);
  dnnl_memory_destroy (ma);
  dnnl_memory_destroy (mb);
  dnnl_memory_destroy (mc);
  if (ms != NULL)
    dnnl_memory_destroy (ms);
}

/* The implementation oneDNN runs for a representative product of @dt, or
 * NULL; a brgemm one ("brg:...") is a kernel for this CPU's vector unit,
 * the others (gemm:jit, ref) are not what it is chosen for. */
static const char *
onednn_probe (dnnl_data_type_t dt)
{
  MatmulKey k = { .dt = dt,
                  .M = 256,
                  .N = 512,
                  .K = 768,
                  .lda = 768,
                  .ldb = 512,
                  .ldc = 512,
                  .alpha = 1,
                  .beta = 0 };
  const char *impl = NULL;
  Matmul *m = matmul_create (&k, &impl);
  if (m == NULL)
    return NULL;
  matmul_free (m);
  return impl;
}

static gboolean
onednn_init (void)
{
  /* No VTune task marks around each execution (a few percent of a tile
   * at these sizes), unless asked for. */
  if (g_getenv ("ONEDNN_ITT_TASK_LEVEL") == NULL)
    g_setenv ("ONEDNN_ITT_TASK_LEVEL", "0", TRUE);
  if (dnnl_engine_create (&dn.engine, dnnl_cpu, 0) != dnnl_success)
    return FALSE;
  g_mutex_init (&dn.lock);
  dn.cache = g_hash_table_new_full (key_hash, key_equal, g_free, matmul_free);
  return TRUE;
}

/* ---- the choice ---------------------------------------------------------- */

static StowGemmChoice choice;
static GError *init_error;

static gboolean
choose (GError **error)
{
  StowCpuFeatures f;
  stow_cpu_features_probe (&f);
  g_autofree char *feat = stow_cpu_features_string (&f);
  const char *force = g_getenv ("STOWAGE_GEMM");
  if (force != NULL && !g_str_equal (force, "openblas")
      && !g_str_equal (force, "onednn"))
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_KERNEL,
                   "STOWAGE_GEMM \"%s\": expected openblas or onednn", force);
      return FALSE;
    }
  const dnnl_version_t *v = dnnl_version ();
  g_autofree char *dnnl_name
      = g_strdup_printf ("oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  const char *f32_impl = NULL, *bf16_impl = NULL;
  if (onednn_init ())
    {
      f32_impl = onednn_probe (dnnl_f32);
      if (f32_impl != NULL)
        f32_impl = g_intern_string (f32_impl);
      bf16_impl = onednn_probe (dnnl_bf16);
    }
  /* oneDNN where it has a brgemm kernel (AVX-512 and up): 286-323 GFLOP/s
   * on the bench model's products against 225-255 for OpenBLAS's
   * SkylakeX and BLIS's skx (docs/executor.md). */
  gboolean use_dnn = f32_impl != NULL && g_str_has_prefix (f32_impl, "brg:");
  if (force != NULL)
    use_dnn = g_str_equal (force, "onednn") && f32_impl != NULL;
  if (force != NULL && g_str_equal (force, "onednn") && f32_impl == NULL)
    {
      g_set_error (error, STOW_LLAMA_ERROR, STOW_LLAMA_ERROR_KERNEL,
                   "STOWAGE_GEMM onednn: oneDNN has no fp32 matmul here");
      return FALSE;
    }
  if (use_dnn)
    {
      choice.f32 = STOW_GEMM_ONEDNN;
      g_snprintf (choice.f32_kernel, sizeof choice.f32_kernel, "%s %s",
                  dnnl_name, f32_impl);
    }
  else
    {
      const char *core = stow_openblas_core_for (&f);
      gboolean preset = g_getenv ("OPENBLAS_CORETYPE") != NULL;
      if (!openblas_load (core, error))
        return FALSE;
      g_autofree char *ver = openblas_version ();
      choice.f32 = STOW_GEMM_OPENBLAS;
      g_snprintf (choice.f32_kernel, sizeof choice.f32_kernel, "%s %s%s", ver,
                  ob.corename (),
                  preset ? " (OPENBLAS_CORETYPE)"
                  : core ? ""
                         : " (its own choice)");
    }
  /* bf16 in bf16 where oneDNN multiplies bf16 natively (AVX512-BF16,
   * AMX): brg:avx512_core_bf16, brg:avx512_core_amx. */
  choice.bf16_native = use_dnn && bf16_impl != NULL
                       && g_str_has_prefix (bf16_impl, "brg:")
                       && (strstr (bf16_impl, "bf16") != NULL
                           || strstr (bf16_impl, "amx") != NULL);
  if (choice.bf16_native)
    g_snprintf (choice.bf16_kernel, sizeof choice.bf16_kernel, "%s %s",
                dnnl_name, bf16_impl);
  g_snprintf (choice.reason, sizeof choice.reason, "%s%s",
              force ? "" : "cpuid: ", force ? "STOWAGE_GEMM" : feat);
  return TRUE;
}

gboolean
stow_gemm_init (GError **error)
{
  static gsize done = 0;
  if (g_once_init_enter (&done))
    {
      GError *e = NULL;
      if (!choose (&e))
        init_error = e;
      g_once_init_leave (&done, 1);
    }
  if (init_error != NULL)
    {
      g_propagate_error (error, g_error_copy (init_error));
      return FALSE;
    }
  return TRUE;
}

const StowGemmChoice *
stow_gemm_choice (void)
{
  return &choice;
}

char *
stow_gemm_describe (void)
{
  return g_strdup_printf ("fp32 %s, bf16 %s (%s)", choice.f32_kernel,
                          choice.bf16_native ? choice.bf16_kernel
                                             : "widened to fp32",
                          choice.reason);
}

/* ---- products ------------------------------------------------------------ */

/* C = beta C, as sgemm leaves C when K is 0 (a product oneDNN refuses). */
static void
scale_c (guint64 M, guint64 N, float beta, float *C, guint64 ldc)
{
  for (guint64 i = 0; i < M; i++)
    for (guint64 j = 0; j < N; j++)
      C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

/* A product in oneDNN's matmul of data type @dt (its operands' type; C is
 * fp32 either way). */
static void
dnnl_product (dnnl_data_type_t dt, gboolean ta, gboolean tb, guint64 M,
              guint64 N, guint64 K, float alpha, const void *A, guint64 lda,
              const void *B, guint64 ldb, float beta, float *C, guint64 ldc)
{
  if (K == 0)
    {
      scale_c (M, N, beta, C, ldc);
      return;
    }
  MatmulKey k = { .dt = dt,
                  .ta = ta,
                  .tb = tb,
                  .M = M,
                  .N = N,
                  .K = K,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta };
  matmul_run (&k, A, B, C);
}

void
stow_gemm_f32 (gboolean ta, gboolean tb, guint64 M, guint64 N, guint64 K,
               float alpha, const float *A, guint64 lda, const float *B,
               guint64 ldb, float beta, float *C, guint64 ldc)
{
  g_return_if_fail (dn.engine != NULL || ob.sgemm != NULL);
  if (M == 0 || N == 0)
    return;
  if (choice.f32 == STOW_GEMM_OPENBLAS)
    {
      ob.sgemm (101, ta ? 112 : 111, tb ? 112 : 111, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
      return;
    }
  dnnl_product (dnnl_f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void
stow_gemm_bf16 (gboolean ta, gboolean tb, guint64 M, guint64 N, guint64 K,
                float alpha, const guint16 *A, guint64 lda, const guint16 *B,
                guint64 ldb, float beta, float *C, guint64 ldc)
{
  g_return_if_fail (choice.bf16_native);
  if (M == 0 || N == 0)
    return;
  dnnl_product (dnnl_bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}
