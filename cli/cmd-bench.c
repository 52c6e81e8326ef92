/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-bench.c: `stowage bench SUB ...`, micro-benchmarks of the offload
 * engine against the machine's physical limits: `adam` (one CPU Adam step
 * over N parameters) and `memcpy` (a STREAM-style triad and copy with the
 * same threads and binding, the bandwidth Adam is bounded by).  Other rooms
 * add their benchmarks as rows of the table below.
 */
#include "config.h"

#include <errno.h>
#include <immintrin.h>
#include <json-glib/json-glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "core/json.h"
#include "core/strutil.h"
#include "core/units.h"
#include "offload/adam.h"
#include "offload/cpu.h"

static int bench_adam (int argc, char **argv);
static int bench_memcpy (int argc, char **argv);

typedef struct
{
  const char *name;
  const char *summary;
  int (*run) (int argc, char **argv); /* argv[0] is the benchmark's name */
} BenchRow;

/* One row per benchmark; "stowage bench NAME ..." runs it. */
static const BenchRow benches[] = {
  { "adam", "One CPU Adam step over N parameters", bench_adam },
  { "memcpy", "STREAM-style triad and copy bandwidth", bench_memcpy },
  { "nvme", "NVMe store read and write bandwidth", stow_bench_nvme },
  { "swapper", "Optimizer swapper: pipelined step and each stage alone",
    stow_bench_swapper },
};

static void
print_benches (FILE *out)
{
  fprintf (out, "Usage: stowage bench BENCHMARK [OPTION...]\n\nBenchmarks:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
    fprintf (out, "  %-10s  %s\n", benches[i].name, benches[i].summary);
  fprintf (out, "\nRun 'stowage bench BENCHMARK --help' for its options.\n");
}

int
stow_cmd_bench (int argc, char **argv)
{
  if (argc < 2)
    {
      print_benches (stderr);
      return STOW_EXIT_FAILURE;
    }
  if (strcmp (argv[1], "--help") == 0 || strcmp (argv[1], "-h") == 0)
    {
      print_benches (stdout);
      return STOW_EXIT_OK;
    }
  const char *names[G_N_ELEMENTS (benches)];
  for (gsize i = 0; i < G_N_ELEMENTS (benches); i++)
    {
      names[i] = benches[i].name;
      if (strcmp (benches[i].name, argv[1]) == 0)
        return benches[i].run (argc - 1, argv + 1);
    }
  const char *near = stow_suggest (argv[1], names, G_N_ELEMENTS (benches));
  if (near != NULL)
    return stow_cli_failf ("see 'stowage bench --help'",
                           "bench: unknown benchmark \"%s\"; did you mean "
                           "\"%s\"?",
                           argv[1], near);
  return stow_cli_failf ("see 'stowage bench --help'",
                         "bench: unknown benchmark \"%s\"", argv[1]);
}

/* ---- shared helpers ----------------------------------------------------- */

static void *
alloc_aligned (guint64 bytes, const char *what, GError **error)
{
  void *p = NULL;
  if (bytes > G_MAXSIZE || posix_memalign (&p, 64, MAX (bytes, 64)) != 0)
    {
      g_autofree char *size = stow_format_bytes (bytes);
      g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                   "bench: cannot allocate %s for %s", size, what);
      return NULL;
    }
  return p;
}

static gboolean
parse_count_opt (const char *opt, const char *text, guint64 *out, gboolean size)
{
  g_autoptr (GError) error = NULL;
  gboolean ok = size ? stow_parse_size (text, out, &error)
                     : stow_parse_count (text, out, &error);
  if (!ok)
    {
      stow_cli_failf (NULL, "bench: %s: %s", opt, error->message);
      return FALSE;
    }
  if (*out == 0)
    {
      stow_cli_failf (NULL, "bench: %s (%s) must be > 0", opt, text);
      return FALSE;
    }
  return TRUE;
}

/* ---- adam ------------------------------------------------------------- */

typedef struct
{
  StowAdamTensor *t;
  guint64 n;
} InitJob;

/* First touch with the step's own partition, so each page sits on the NUMA
 * node of the thread that will update it. */
static void
adam_init_job (gpointer data, guint index, guint n_threads)
{
  InitJob *j = data;
  StowAdamTensor *t = j->t;
  guint64 b0, b1;
  guint64 n_blocks = (j->n + STOW_ADAM_BLOCK - 1) / STOW_ADAM_BLOCK;
  stow_cpu_partition (n_blocks, index, n_threads, &b0, &b1);
  guint64 end = MIN (b1 * STOW_ADAM_BLOCK, j->n);
  for (guint64 i = MIN (b0 * STOW_ADAM_BLOCK, end); i < end; i++)
    {
      float x = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
      t->param[i] = x;
      t->m[i] = 1e-3f * x;
      t->v[i] = 1e-6f * x * x;
      float g = 1e-2f * x;
      switch (t->grad_type)
        {
        case STOW_DTYPE_BF16:
          ((guint16 *)t->grad)[i] = stow_f32_to_bf16 (g);
          break;
        case STOW_DTYPE_F16:
          ((guint16 *)t->grad)[i] = stow_f32_to_f16 (g);
          break;
        default:
          ((float *)t->grad)[i] = g;
        }
      switch (t->out_type)
        {
        case STOW_DTYPE_F32:
          ((float *)t->param_out)[i] = 0;
          break;
        case STOW_DTYPE_BF16:
        case STOW_DTYPE_F16:
          ((guint16 *)t->param_out)[i] = 0;
          break;
        default:
          break;
        }
    }
}

static int
bench_adam (int argc, char **argv)
{
  g_autofree char *opt_params = NULL, *opt_grad = NULL, *opt_out = NULL;
  g_autofree char *opt_isa = NULL;
  int opt_threads = 0, opt_reps = 5;
  gboolean opt_json = FALSE, opt_check = FALSE;
  const GOptionEntry entries[] = {
    { "params", 'n', 0, G_OPTION_ARG_STRING, &opt_params,
      "Parameters to update (\"64M\", \"1B\"; default 64M)", "N" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &opt_threads,
      "Worker threads (default: one per core)", "T" },
    { "grad", 0, 0, G_OPTION_ARG_STRING, &opt_grad,
      "Gradient type: bf16 (default), fp16 or fp32", "TYPE" },
    { "out", 0, 0, G_OPTION_ARG_STRING, &opt_out,
      "Low-precision parameter copy: bf16 (default), fp16, fp32 or none",
      "TYPE" },
    { "isa", 0, 0, G_OPTION_ARG_STRING, &opt_isa,
      "Kernels: auto (default), scalar, avx2, avx512, avx512-bf16", "ISA" },
    { "reps", 'r', 0, G_OPTION_ARG_INT, &opt_reps,
      "Timed steps after one warm-up step; the fastest is reported "
      "(default 5)",
      "K" },
    { "check", 0, 0, G_OPTION_ARG_NONE, &opt_check,
      "Include the step's own pass checking the gradients for NaN/Inf "
      "(by default they count as verified by the grad-norm pass)",
      NULL },
    { "json", 0, 0, G_OPTION_ARG_NONE, &opt_json, "Print JSON", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "bench adam", NULL,
      "Time one CPU Adam (AdamW) step over fp32 master weights and moments, "
      "with the low-precision copy written in the same pass.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!stow_cli_parse (ctx, "bench adam", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage bench adam --help'",
                           "bench adam: unexpected argument \"%s\"", argv[1]);

  guint64 n = 64000000;
  if (opt_params != NULL
      && !parse_count_opt ("--params", opt_params, &n, FALSE))
    return STOW_EXIT_FAILURE;
  if (opt_threads < 0 || opt_threads > 4096)
    return stow_cli_failf (
        NULL, "bench adam: --threads (%d) must be in 0..4096", opt_threads);
  if (opt_reps < 1 || opt_reps > 100000)
    return stow_cli_failf (NULL, "bench adam: --reps (%d) must be in 1..100000",
                           opt_reps);
  StowDtype grad_type = STOW_DTYPE_BF16, out_type = STOW_DTYPE_BF16;
  if (opt_grad != NULL
      && (!stow_dtype_from_nick (opt_grad, &grad_type)
          || grad_type == STOW_DTYPE_NONE))
    return stow_cli_failf (
        NULL, "bench adam: --grad \"%s\": use bf16, fp16 or fp32", opt_grad);
  if (opt_out != NULL && !stow_dtype_from_nick (opt_out, &out_type))
    return stow_cli_failf (
        NULL, "bench adam: --out \"%s\": use bf16, fp16, fp32 or none",
        opt_out);
  StowIsa isa = STOW_ISA_AUTO;
  if (opt_isa != NULL && !stow_isa_from_name (opt_isa, &isa))
    return stow_cli_failf (NULL,
                           "bench adam: --isa \"%s\": use auto, scalar, avx2, "
                           "avx512 or avx512-bf16",
                           opt_isa);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowAdam) adam = stow_adam_new ((guint)opt_threads, isa, &error);
  if (adam == NULL)
    return stow_cli_fail (error, NULL);

  StowAdamTensor t = { .grad_type = grad_type, .out_type = out_type, .n = n };
  t.param = alloc_aligned (n * 4, "the master weights", &error);
  t.m = t.param ? alloc_aligned (n * 4, "the first moment", &error) : NULL;
  t.v = t.m ? alloc_aligned (n * 4, "the second moment", &error) : NULL;
  void *grad = t.v ? alloc_aligned (n * stow_dtype_size (grad_type),
                                    "the gradients", &error)
                   : NULL;
  t.grad = grad;
  if (grad != NULL && out_type != STOW_DTYPE_NONE)
    t.param_out = alloc_aligned (n * stow_dtype_size (out_type),
                                 "the parameter copy", &error);
  int rc = STOW_EXIT_FAILURE;
  if (error != NULL)
    {
      stow_cli_fail (error, "try a smaller --params");
      goto out;
    }

  InitJob init = { &t, n };
  stow_cpu_pool_run (stow_adam_get_pool (adam), adam_init_job, &init);

  StowAdamConfig config;
  stow_adam_config_init (&config);
  StowAdamStep step = { .step = 1,
                        .loss_scale = 1024,
                        .clip_coef = 0.5,
                        .grads_verified = !opt_check };
  double best = G_MAXDOUBLE, total = 0;
  for (int r = 0; r <= opt_reps; r++)
    {
      gint64 t0 = g_get_monotonic_time ();
      int err = stow_adam_step_raw (adam, &config, &step, &t);
      double s = (double)(g_get_monotonic_time () - t0) * 1e-6;
      if (err < 0)
        {
          stow_cli_failf (NULL, "bench adam: step failed: %s",
                          g_strerror (-err));
          goto out;
        }
      step.step++;
      if (r == 0)
        continue; /* warm-up: page faults, thread wake-up */
      best = MIN (best, s);
      total += s;
    }

  guint bpp = stow_adam_bytes_per_param (grad_type, out_type, !opt_check);
  double bytes_per_s = (double)bpp * (double)n / best;
  double params_per_s = (double)n / best;
  StowCpuPool *pool = stow_adam_get_pool (adam);
  if (opt_json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_string (b, "benchmark", "adam");
      stow_json_set_string (b, "isa", stow_isa_name (stow_adam_get_isa (adam)));
      stow_json_set_i64 (b, "threads", stow_adam_get_n_threads (adam));
      stow_json_set_i64 (b, "threads_bound", stow_cpu_pool_n_bound (pool));
      stow_json_set_i64 (b, "params", (gint64)n);
      stow_json_set_string (b, "grad", stow_dtype_nick (grad_type));
      stow_json_set_string (b, "out", stow_dtype_nick (out_type));
      stow_json_set_bool (b, "grads_checked", opt_check);
      stow_json_set_i64 (b, "reps", opt_reps);
      stow_json_set_double (b, "seconds", best);
      stow_json_set_double (b, "seconds_mean", total / opt_reps);
      stow_json_set_i64 (b, "bytes_per_param", bpp);
      stow_json_set_double (b, "bytes_per_s", bytes_per_s);
      stow_json_set_double (b, "params_per_s", params_per_s);
      json_builder_end_object (b);
      stow_cli_print_json (json_builder_get_root (b));
    }
  else
    {
      g_autofree char *count = stow_format_count_short (n);
      g_autofree char *bw = stow_format_bandwidth (bytes_per_s);
      g_autofree char *dur = stow_format_duration (best);
      printf ("adam: %s params, grad %s, out %s, %s, %u threads (%u bound)\n",
              count, stow_dtype_nick (grad_type), stow_dtype_nick (out_type),
              stow_isa_name (stow_adam_get_isa (adam)),
              stow_adam_get_n_threads (adam), stow_cpu_pool_n_bound (pool));
      printf ("step: %s (best of %d), %u bytes/param, %s, %.3g params/s\n", dur,
              opt_reps, bpp, bw, params_per_s);
    }
  rc = STOW_EXIT_OK;
out:
  free (t.param);
  free (t.m);
  free (t.v);
  free (grad);
  free (t.param_out);
  return rc;
}

/* ---- memcpy (STREAM triad and copy) -------------------------------------- */

typedef struct
{
  float *a, *b, *c;
  guint64 n;
  float scalar;
  int op; /* 0 init, 1 triad, 2 copy */
  StowIsa isa;
} StreamJob;

/* STREAM's loops with explicit vectors, as wide as the Adam kernels use and
 * with ordinary (write-allocating) stores as compiled STREAM has: GCC -O2
 * leaves the plain loops scalar and turns the copy into memcpy, whose
 * non-temporal stores would not be the same game. */
__attribute__ ((target ("avx512f"))) static void
triad_avx512 (float *a, const float *b, const float *c, float s, guint64 n)
{
  const __m512 vs = _mm512_set1_ps (s);
  guint64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps (a + i, _mm512_fmadd_ps (vs, _mm512_loadu_ps (c + i),
                                              _mm512_loadu_ps (b + i)));
  for (; i < n; i++)
    a[i] = b[i] + s * c[i];
}

__attribute__ ((target ("avx2,fma"))) static void
triad_avx2 (float *a, const float *b, const float *c, float s, guint64 n)
{
  const __m256 vs = _mm256_set1_ps (s);
  guint64 i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps (a + i, _mm256_fmadd_ps (vs, _mm256_loadu_ps (c + i),
                                              _mm256_loadu_ps (b + i)));
  for (; i < n; i++)
    a[i] = b[i] + s * c[i];
}

static void
triad_scalar (float *a, const float *b, const float *c, float s, guint64 n)
{
  for (guint64 i = 0; i < n; i++)
    a[i] = b[i] + s * c[i];
}

__attribute__ ((target ("avx512f"))) static void
copy_avx512 (float *a, const float *b, guint64 n)
{
  guint64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps (a + i, _mm512_loadu_ps (b + i));
  for (; i < n; i++)
    a[i] = b[i];
}

__attribute__ ((target ("avx2"))) static void
copy_avx2 (float *a, const float *b, guint64 n)
{
  guint64 i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps (a + i, _mm256_loadu_ps (b + i));
  for (; i < n; i++)
    a[i] = b[i];
}

static void
copy_scalar (float *a, const float *b, guint64 n)
{
  for (volatile guint64 i = 0; i < n; i++) /* volatile: no memcpy call */
    a[i] = b[i];
}

static void
stream_job (gpointer data, guint index, guint n_threads)
{
  StreamJob *j = data;
  guint64 b0, b1;
  /* The Adam step's partition: the same threads touch the same ranges. */
  guint64 n_blocks = (j->n + STOW_ADAM_BLOCK - 1) / STOW_ADAM_BLOCK;
  stow_cpu_partition (n_blocks, index, n_threads, &b0, &b1);
  guint64 end = MIN (b1 * STOW_ADAM_BLOCK, j->n);
  guint64 begin = MIN (b0 * STOW_ADAM_BLOCK, end);
  switch (j->op)
    {
    case 0:
      for (guint64 i = begin; i < end; i++)
        {
          j->a[i] = 0;
          j->b[i] = 1.0f;
          j->c[i] = 2.0f;
        }
      break;
    case 1:
      if (j->isa >= STOW_ISA_AVX512)
        triad_avx512 (j->a + begin, j->b + begin, j->c + begin, j->scalar,
                      end - begin);
      else if (j->isa == STOW_ISA_AVX2)
        triad_avx2 (j->a + begin, j->b + begin, j->c + begin, j->scalar,
                    end - begin);
      else
        triad_scalar (j->a + begin, j->b + begin, j->c + begin, j->scalar,
                      end - begin);
      break;
    default:
      if (j->isa >= STOW_ISA_AVX512)
        copy_avx512 (j->a + begin, j->b + begin, end - begin);
      else if (j->isa == STOW_ISA_AVX2)
        copy_avx2 (j->a + begin, j->b + begin, end - begin);
      else
        copy_scalar (j->a + begin, j->b + begin, end - begin);
      break;
    }
}

static double
time_stream (StowCpuPool *pool, StreamJob *job, int op, int reps, double *mean)
{
  double best = G_MAXDOUBLE, total = 0;
  job->op = op;
  for (int r = 0; r <= reps; r++)
    {
      gint64 t0 = g_get_monotonic_time ();
      stow_cpu_pool_run (pool, stream_job, job);
      double s = (double)(g_get_monotonic_time () - t0) * 1e-6;
      if (r == 0)
        continue;
      best = MIN (best, s);
      total += s;
    }
  *mean = total / reps;
  return best;
}

static int
bench_memcpy (int argc, char **argv)
{
  g_autofree char *opt_size = NULL;
  int opt_threads = 0, opt_reps = 5;
  gboolean opt_json = FALSE;
  const GOptionEntry entries[] = {
    { "size", 's', 0, G_OPTION_ARG_STRING, &opt_size,
      "Bytes per array (\"256MiB\", default 256MiB); three arrays are used",
      "BYTES" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &opt_threads,
      "Worker threads (default: one per core)", "T" },
    { "reps", 'r', 0, G_OPTION_ARG_INT, &opt_reps,
      "Timed repetitions after one warm-up; the fastest is reported "
      "(default 5)",
      "K" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &opt_json, "Print JSON", NULL },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "bench memcpy", NULL,
      "STREAM-style memory bandwidth with the CPU Adam thread pool and "
      "binding: triad a[i] = b[i] + s*c[i] counted as 3 arrays x 4 bytes per "
      "element, and copy a[i] = b[i] counted as 2 x 4, as STREAM counts.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!stow_cli_parse (ctx, "bench memcpy", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage bench memcpy --help'",
                           "bench memcpy: unexpected argument \"%s\"", argv[1]);
  guint64 size = 256 * 1024 * 1024;
  if (opt_size != NULL && !parse_count_opt ("--size", opt_size, &size, TRUE))
    return STOW_EXIT_FAILURE;
  if (size < 4)
    return stow_cli_failf (NULL, "bench memcpy: --size (%s) must be >= 4 bytes",
                           opt_size);
  if (opt_threads < 0 || opt_threads > 4096)
    return stow_cli_failf (
        NULL, "bench memcpy: --threads (%d) must be in 0..4096", opt_threads);
  if (opt_reps < 1 || opt_reps > 100000)
    return stow_cli_failf (
        NULL, "bench memcpy: --reps (%d) must be in 1..100000", opt_reps);

  g_autoptr (GError) error = NULL;
  g_autoptr (StowCpuPool) pool
      = stow_cpu_pool_new ((guint)opt_threads, TRUE, &error);
  if (pool == NULL)
    return stow_cli_fail (error, NULL);
  guint64 n = size / 4;
  StreamJob job = { .n = n, .scalar = 3.0f, .isa = stow_isa_best () };
  job.a = alloc_aligned (n * 4, "array a", &error);
  job.b = job.a ? alloc_aligned (n * 4, "array b", &error) : NULL;
  job.c = job.b ? alloc_aligned (n * 4, "array c", &error) : NULL;
  int rc = STOW_EXIT_FAILURE;
  if (error != NULL)
    {
      stow_cli_fail (error, "try a smaller --size");
      goto out;
    }
  job.op = 0;
  stow_cpu_pool_run (pool, stream_job, &job);

  double triad_mean, copy_mean;
  double triad_s = time_stream (pool, &job, 1, opt_reps, &triad_mean);
  double copy_s = time_stream (pool, &job, 2, opt_reps, &copy_mean);
  /* Check the triad's result so the loops cannot be dropped. */
  if (job.a[n - 1] != 1.0f)
    {
      stow_cli_failf (NULL, "bench memcpy: copy produced %g, expected 1",
                      (double)job.a[n - 1]);
      goto out;
    }
  double triad_bw = 12.0 * (double)n / triad_s;
  double copy_bw = 8.0 * (double)n / copy_s;
  if (opt_json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      stow_json_set_string (b, "benchmark", "memcpy");
      stow_json_set_string (b, "isa", stow_isa_name (job.isa));
      stow_json_set_i64 (b, "threads", stow_cpu_pool_n_threads (pool));
      stow_json_set_i64 (b, "threads_bound", stow_cpu_pool_n_bound (pool));
      stow_json_set_i64 (b, "size", (gint64)(n * 4));
      stow_json_set_i64 (b, "reps", opt_reps);
      stow_json_set_double (b, "seconds", triad_s);
      stow_json_set_double (b, "bytes_per_s", triad_bw);
      stow_json_set_double (b, "triad_seconds_mean", triad_mean);
      stow_json_set_double (b, "copy_seconds", copy_s);
      stow_json_set_double (b, "copy_bytes_per_s", copy_bw);
      stow_json_set_double (b, "copy_seconds_mean", copy_mean);
      json_builder_end_object (b);
      stow_cli_print_json (json_builder_get_root (b));
    }
  else
    {
      g_autofree char *sz = stow_format_bytes (n * 4);
      g_autofree char *tb = stow_format_bandwidth (triad_bw);
      g_autofree char *cb = stow_format_bandwidth (copy_bw);
      printf ("memcpy: 3 arrays of %s, %u threads (%u bound)\n", sz,
              stow_cpu_pool_n_threads (pool), stow_cpu_pool_n_bound (pool));
      printf ("triad: %s (best of %d)\ncopy:  %s\n", tb, opt_reps, cb);
    }
  rc = STOW_EXIT_OK;
out:
  free (job.a);
  free (job.b);
  free (job.c);
  return rc;
}
