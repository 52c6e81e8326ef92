/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-hardening.c: issue 24, as a user meets it: hostile and
 * careless inputs (deep JSON, huge numbers, odd -o targets, a cluster file
 * with only the required fields) end in a clear answer, a clean exit code
 * and valid output, never a crash, a hang or a NaN.
 */
#include <glib/gstdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json.h"
#include "tests/testutil.h"

typedef struct
{
  char *dir;
} Tmp;

static void
tmp_setup (Tmp *t, gconstpointer data)
{
  t->dir = g_dir_make_tmp ("stow-harden-XXXXXX", NULL);
  g_assert_nonnull (t->dir);
}

static void
tmp_teardown (Tmp *t, gconstpointer data)
{
  g_autoptr (GDir) d = g_dir_open (t->dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name (d)) != NULL)
    {
      g_autofree char *p = g_build_filename (t->dir, name, NULL);
      g_unlink (p);
    }
  g_rmdir (t->dir);
  g_free (t->dir);
}

static char *
tmp_file (Tmp *t, const char *name, const char *text)
{
  char *path = g_build_filename (t->dir, name, NULL);
  g_assert_true (g_file_set_contents (path, text, -1, NULL));
  return path;
}

/* 1. Every JSON reader (model config, cluster file, plan file, a cluster's
 * profile) refuses input nested 100,000 deep with one line naming the file
 * and the limit; json-glib used to overflow the stack (SIGSEGV). */
static void
test_deep_json (Tmp *t, gconstpointer data)
{
  gsize n = 100000;
  g_autofree char *deep = g_malloc (2 * n + 2);
  memset (deep, '[', n);
  memset (deep + n, ']', n);
  deep[2 * n] = '\n';
  deep[2 * n + 1] = '\0';
  g_autofree char *path = tmp_file (t, "d.json", deep);
  g_autofree char *with_profile = g_strdup_printf (
      "{\"preset\": \"dgx-a100\", \"profile\": \"%s\"}", path);
  g_autofree char *cluster = tmp_file (t, "c.json", with_profile);
  const char *const runs[][8] = {
    { "model", path, NULL },
    { "gpus", "--cluster", path, NULL },
    { "fit", "--plan", path, NULL },
    { "mem", "--plan", path, NULL },
    { "simulate", "--plan", path, NULL },
    { "plan", "llama-7b", "--cluster", path, NULL },
    { "fit", "llama-7b", "--cluster", cluster, NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (runs); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_runv (&r, runs[i]);
      g_assert_cmpint (r.status, ==, 2);
      g_assert_cmpstr (r.out, ==, "");
      g_assert_nonnull (strstr (r.err, "d.json:1:65: nested deeper than 64"));
      g_assert_cmpuint (stow_count_lines (r.err), ==, 1);
    }
}

/* 2. -o writes through links and devices instead of replacing them: a link
 * to standard output (what /dev/stdout is) used to become a regular file
 * and the report vanished with exit 0. */
static void
test_output_targets (Tmp *t, gconstpointer data)
{
  g_autofree char *out_link = g_build_filename (t->dir, "stdout", NULL);
  g_assert_cmpint (symlink ("/proc/self/fd/1", out_link), ==, 0);
  g_autofree char *file = tmp_file (t, "report.md", "old");
  g_autofree char *file_link = g_build_filename (t->dir, "link.md", NULL);
  g_assert_cmpint (symlink ("report.md", file_link), ==, 0);
  const char *cmds[][2] = { { "fit", "FITS: llama-7b" },
                            { "plan", "llama-7b on 8xA100-80GB" },
                            { "mem", "llama-7b" },
                            { "simulate", "step time" } };
  for (gsize i = 0; i < G_N_ELEMENTS (cmds); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, cmds[i][0], "llama-7b", "--gpus", "8xA100-80GB", "-o",
                out_link, NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_assert_nonnull (strstr (r.out, cmds[i][1]));
      g_assert_true (g_file_test (out_link, G_FILE_TEST_IS_SYMLINK));

      g_auto (StowRun) m = { 0 };
      stow_run (&m, cmds[i][0], "llama-7b", "--gpus", "8xA100-80GB", "--format",
                "md", "-o", file_link, NULL);
      g_assert_cmpint (m.status, ==, 0);
      g_assert_cmpstr (m.out, ==, "");
      g_assert_true (g_file_test (file_link, G_FILE_TEST_IS_SYMLINK));
      g_autofree char *text = NULL;
      g_assert_true (g_file_get_contents (file, &text, NULL, NULL));
      g_assert_true (g_str_has_prefix (text, "#"));

      g_auto (StowRun) d = { 0 };
      stow_run (&d, cmds[i][0], "llama-7b", "--gpus", "8xA100-80GB", "-o",
                t->dir, NULL);
      g_assert_cmpint (d.status, ==, 2);
      g_autofree char *want
          = g_strdup_printf ("stowage: %s: is a directory", t->dir);
      g_assert_true (g_str_has_prefix (d.err, want));
    }
  /* Nothing but the three files: no temporaries left behind. */
  g_autoptr (GDir) dir = g_dir_open (t->dir, 0, NULL);
  guint n = 0;
  while (g_dir_read_name (dir))
    n++;
  g_assert_cmpuint (n, ==, 3);
}

/* 3. A cluster file with only the documented required GPU fields plans
 * with stated defaults; it used to show "HBM 0 GB/s, PCIe Gen0 0 GB/s" and
 * plan a step of -nan. */
static void
test_required_fields_only (Tmp *t, gconstpointer data)
{
  g_autofree char *path = tmp_file (
      t, "F.json",
      "{\"preset\":\"workstation\",\"nodes\":1,\"gpus_per_node\":1,"
      "\"gpu\":{\"total_memory\":\"47.5GiB\",\"bf16_tflops\":154.8},"
      "\"host_ram\":\"128GiB\"}");
  g_auto (StowRun) g = { 0 };
  stow_run (&g, "gpus", "--cluster", path, NULL);
  g_assert_cmpint (g.status, ==, 0);
  g_assert_nonnull (strstr (g.out, "HBM 774 GB/s (default: 5 GB/s per bf16 "
                                   "TFLOP/s; set hbm_bw)"));
  g_assert_nonnull (strstr (g.out, "PCIe Gen4 (default) 25 GB/s pinned"));
  g_assert_null (strstr (g.out, " 0 GB/s"));

  g_auto (StowRun) p = { 0 };
  stow_run (&p, "plan", "llama-2-13b", "--cluster", path, "--json", NULL);
  g_assert_cmpint (p.status, ==, 0);
  stow_assert_json_valid (p.out, "plan --json");
  g_autoptr (JsonNode) root = stow_json_parse_data (p.out, -1, "plan", NULL);
  JsonArray *plans
      = json_object_get_array_member (json_node_get_object (root), "plans");
  g_assert_cmpuint (json_array_get_length (plans), >, 0);
  JsonObject *best = json_array_get_object_element (plans, 0);
  double step = json_object_get_double_member (best, "step_time_s");
  g_assert_cmpfloat (step, >, 0);
  g_assert_cmpfloat (step, <, 1e6);

  const char *formats[] = { "text", "md", "csv", "html" };
  for (gsize i = 0; i < G_N_ELEMENTS (formats); i++)
    {
      g_auto (StowRun) f = { 0 };
      stow_run (&f, "fit", "llama-2-13b", "--cluster", path, "--format",
                formats[i], NULL);
      g_assert_cmpint (f.status, ==, 0);
      g_assert_false (stow_text_has_nonfinite (f.out));
    }
}

/* 4 and 6. Sizes are checked against limits before anything is allocated
 * or searched, and the message says the limit.  Before: the simulator ran
 * out of memory (--global-batch 1G --seq 7) or GLib aborted (--grad-accum
 * 1000000000); --micro-batch=4294967296 answered "no valid layout"; 2^64
 * came back as "got number -1". */
static void
test_limits (Tmp *t, gconstpointer data)
{
  static const struct
  {
    const char *cmd, *flags[4], *message;
  } cases[] = {
    { "simulate",
      { "--global-batch", "1G", "--seq", "7" },
      "stowage: --global-batch 1G: at most 16,777,216 sequences\n" },
    { "simulate",
      { "--grad-accum", "1000000000" },
      "stowage: --grad-accum 1000000000: at most 16,777,216 micro-batches\n" },
    { "simulate",
      { "--grad-accum", "1000000" },
      "stowage: simulate: 1,000,000 micro-batches per step through 32 "
      "layers: over the simulator's limit of 131,072 micro-batch x layer "
      "passes (about 850,000 ops)\nhint: lower --global-batch or "
      "--grad-accum, or raise --micro-batch\n" },
    { "plan",
      { "--seq", "4294967296" },
      "stowage: --seq 4294967296: at most 16,777,216 tokens\n" },
    { "fit",
      { "--micro-batch=4294967296" },
      "stowage: --micro-batch 4294967296: at most 65,536 sequences\n" },
    { "mem",
      { "--micro-batch", "18446744073709551616" },
      "stowage: --micro-batch 18446744073709551616: at most 65,536 "
      "sequences\n" },
    { "fit",
      { "--micro-batch", "128", "--seq", "16M" },
      "stowage: --micro-batch 128 x --seq 16777216: at most 1,073,741,824 "
      "tokens per micro-batch\n" },
    { "plan",
      { "--context-memory", "2EiB" },
      "stowage: --context-memory 2EiB: at most 1,125,899,906,842,624 bytes "
      "(1 PiB)\n" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const char *args[12]
          = { cases[i].cmd, "llama-7b", "--gpus", "8xA100-80GB" };
      for (gsize k = 0; k < 4 && cases[i].flags[k]; k++)
        args[4 + k] = cases[i].flags[k];
      g_auto (StowRun) r = { 0 };
      gint64 t0 = g_get_monotonic_time ();
      stow_runv (&r, args);
      g_assert_cmpint (r.status, ==, 2);
      g_assert_cmpstr (r.out, ==, "");
      g_assert_cmpstr (r.err, ==, cases[i].message);
      g_assert_cmpint (g_get_monotonic_time () - t0, <, 5 * G_USEC_PER_SEC);
    }

  /* A number past 64 bits in a config.json is named as written. */
  g_autofree char *cfg = tmp_file (
      t, "config.json",
      "{\"model_type\": \"llama\", \"hidden_size\": 18446744073709551616}");
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "model", cfg, NULL);
  g_assert_cmpint (m.status, ==, 2);
  const char *said = strstr (m.err, "config.json:1:40: the integer "
                                    "18446744073709551616 is out of range");
  g_assert_nonnull (said);
  /* Not wrapped to -1 (looked for after the path: a temporary directory's
   * random name may hold "-1"). */
  g_assert_null (strstr (said, "-1"));
}

static JsonObject *
json_object_of (const char *text, JsonNode **root)
{
  g_autoptr (GError) error = NULL;
  stow_assert_json_valid (text, "output");
  *root = stow_json_parse_data (text, -1, "output", &error);
  g_assert_no_error (error);
  return json_node_get_object (*root);
}

/* 5. mem and simulate answer as fit does: exit 1 when the layout does not
 * fit (they exited 0 beside DOES NOT FIT and EXCEEDED), and what the flags
 * leave open is filled with fit's choice, said so (ZeRO 0 everywhere put
 * llama-65b at 1,065 GiB per A100). */
static void
test_mem_simulate_like_fit (void)
{
  const char *zero0[]
      = { "--zero", "0", "--offload-optimizer", "none", "--recompute",
          "none",   NULL };
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "mem", "llama-65b", "--gpus", "8xA100-80GB", zero0[0], zero0[1],
            zero0[2], zero0[3], zero0[4], zero0[5], NULL);
  g_assert_cmpint (m.status, ==, 1);
  g_assert_nonnull (strstr (m.out, "DOES NOT FIT: GPU memory\n"));
  g_auto (StowRun) s = { 0 };
  stow_run (&s, "simulate", "llama-65b", "--gpus", "8xA100-80GB", zero0[0],
            zero0[1], zero0[2], zero0[3], zero0[4], zero0[5], NULL);
  g_assert_cmpint (s.status, ==, 1);
  g_assert_nonnull (strstr (s.out, "EXCEEDED"));

  /* Left open: fit's layout, and it fits. */
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "fit", "llama-65b", "--gpus", "8xA100-80GB", "--json", NULL);
  g_assert_cmpint (f.status, ==, 0);
  g_auto (StowRun) mj = { 0 };
  stow_run (&mj, "mem", "llama-65b", "--gpus", "8xA100-80GB", "--json", NULL);
  g_assert_cmpint (mj.status, ==, 0);
  g_autoptr (JsonNode) fr = NULL, mr = NULL;
  JsonObject *fo = json_object_of (f.out, &fr);
  JsonObject *mo = json_object_of (mj.out, &mr);
  g_assert_true (json_node_equal (json_object_get_member (fo, "layout"),
                                  json_object_get_member (mo, "layout")));
  JsonArray *filled = json_object_get_array_member (mo, "filled_like_fit");
  g_assert_cmpuint (json_array_get_length (filled), >, 3);
  g_assert_cmpstr (json_array_get_string_element (filled, 0), ==, "dp");
  JsonObject *dev = json_object_get_object_member (mo, "device");
  g_assert_cmpint (json_object_get_int_member (dev, "total_bytes"), <=,
                   json_object_get_int_member (dev, "capacity_bytes"));

  g_auto (StowRun) mt = { 0 };
  stow_run (&mt, "mem", "llama-65b", "--gpus", "8xA100-80GB", NULL);
  g_assert_cmpint (mt.status, ==, 0);
  g_assert_nonnull (strstr (mt.out, "filled:  as 'stowage fit' would (the "
                                    "fastest layout that fits): --dp"));

  g_auto (StowRun) sj = { 0 };
  stow_run (&sj, "simulate", "llama-65b", "--gpus", "8xA100-80GB", "--json",
            NULL);
  g_assert_cmpint (sj.status, ==, 0);
  g_autoptr (JsonNode) sr = NULL;
  JsonObject *so = json_object_of (sj.out, &sr);
  g_assert_false (json_object_get_boolean_member (so, "exceeded"));
  g_assert_true (json_object_has_member (so, "filled_like_fit"));

  /* Every dimension given: nothing is filled or said. */
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "mem", "llama-7b", "--gpus", "1xA100-80GB", "--zero", "0",
            "--offload-optimizer", "cpu", "--recompute", "none", NULL);
  g_assert_cmpint (p.status, ==, 0);
  g_assert_null (strstr (p.out, "filled:"));
}

/* "2,586 layouts evaluated: 2,574 fit, 12 out of GPU memory, 0 out of
 * host RAM or NVMe; ..." must add up. */
static void
assert_counts_add_up (const char *text)
{
  const char *p = strstr (text, " layouts evaluated");
  g_assert_nonnull (p);
  while (p > text && (g_ascii_isdigit (p[-1]) || p[-1] == ','))
    p--;
  guint64 v[4];
  const char *q = p;
  for (int i = 0; i < 4; i++)
    {
      while (*q && !g_ascii_isdigit (*q))
        q++;
      guint64 n = 0;
      for (; g_ascii_isdigit (*q) || *q == ','; q++)
        if (*q != ',')
          n = n * 10 + (guint64)(*q - '0');
      v[i] = n;
      if (i == 0 && strncmp (q, " layouts evaluated in ", 22) == 0)
        {
          /* skip the search time "in 0.058 s" */
          q += 22;
          while (*q && *q != ':')
            q++;
        }
    }
  g_assert_cmpuint (v[0], ==, v[1] + v[2] + v[3]);
}

/* 6. Words and numbers. */
static void
test_words_and_numbers (Tmp *t, gconstpointer data)
{
  /* Reports say the ranking is the time model's and show its numbers. */
  const char *formats[] = { "md", "html" };
  for (gsize i = 0; i < G_N_ELEMENTS (formats); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "fit", "llama-13b", "--gpus", "8xA100-80GB", "--format",
                formats[i], NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_assert_null (strstr (r.out, "preference order"));
      g_assert_null (strstr (r.out, "once the time model"));
      g_assert_nonnull (strstr (r.out, "time model"));
      g_assert_nonnull (strstr (r.out, "tokens/s"));
      g_assert_nonnull (strstr (r.out, "MFU"));
      assert_counts_add_up (r.out);
    }

  /* Counts add up in fit and plan, text and JSON; grouped digits; no
   * exponent for tokens/s. */
  g_auto (StowRun) f = { 0 };
  stow_run (&f, "fit", "llama-7b", "--gpus", "8xA100-80GB", NULL);
  g_assert_cmpint (f.status, ==, 0);
  assert_counts_add_up (f.out);
  g_assert_null (strstr (f.out, "e+"));
  g_assert_true (g_regex_match_simple ("predicted [0-9.]+ s per step, "
                                       "[0-9]{1,3}(,[0-9]{3})* tokens/s",
                                       f.out, 0, 0));
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "plan", "llama-7b", "--gpus", "1xA100-80GB", "--top", "100",
            "--json", NULL);
  g_assert_cmpint (p.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = json_object_of (p.out, &root);
  g_assert_cmpint (json_object_get_int_member (o, "candidates_evaluated"), ==,
                   json_object_get_int_member (o, "fitting")
                       + json_object_get_int_member (o, "out_of_memory")
                       + json_object_get_int_member (o, "out_of_host_or_nvme"));
  g_assert_cmpint (json_object_get_int_member (o, "same_as_lower_zero"), >, 0);

  /* No two rows that differ only in ZeRO stage cost the same (z0, z1 and
   * z2 over one data-parallel rank were listed three times). */
  JsonArray *plans = json_object_get_array_member (o, "plans");
  guint n = json_array_get_length (plans);
  g_assert_cmpuint (n, >, 4);
  for (guint i = 0; i < n; i++)
    for (guint j = i + 1; j < n; j++)
      {
        JsonObject *a = json_array_get_object_element (plans, i);
        JsonObject *b = json_array_get_object_element (plans, j);
        g_autoptr (JsonNode) la
            = json_node_copy (json_object_get_member (a, "layout"));
        g_autoptr (JsonNode) lb
            = json_node_copy (json_object_get_member (b, "layout"));
        json_object_remove_member (json_node_get_object (la), "zero");
        json_object_remove_member (json_node_get_object (lb), "zero");
        if (!json_node_equal (la, lb))
          continue;
        gboolean same
            = json_object_get_int_member (a, "total_bytes")
                  == json_object_get_int_member (b, "total_bytes")
              && json_object_get_double_member (a, "step_time_s")
                     == json_object_get_double_member (b, "step_time_s");
        g_assert_false (same);
      }

  /* What is short, in words. */
  g_autofree char *small
      = tmp_file (t, "small-host.json",
                  "{\"gpu\": \"A100-80GB\", \"gpus_per_node\": 1, "
                  "\"host_ram\": \"16GiB\"}");
  const char *shown[][2]
      = { { "text", "DOES NOT FIT: GPU memory and host "
                    "RAM\n" },
          { "md", "**DOES NOT FIT**: short of GPU memory "
                  "and host RAM\n" },
          { "html", "short of GPU memory and host RAM</p>" } };
  for (gsize i = 0; i < G_N_ELEMENTS (shown); i++)
    {
      g_auto (StowRun) m = { 0 };
      stow_run (&m, "mem", "llama-65b", "--cluster", small, "--zero", "0",
                "--offload-optimizer", "cpu", "--recompute", "none", "--format",
                shown[i][0], NULL);
      g_assert_cmpint (m.status, ==, 1);
      g_assert_nonnull (strstr (m.out, shown[i][1]));
    }
}

/* 7. The host a preset assumes is said, and --host-ram and --nvme give
 * the user's own ("1xL40S" assumed 1 TiB of RAM and four NVMe drives, and
 * no flag could say otherwise). */
static void
test_host_flags (Tmp *t, gconstpointer data)
{
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "fit", "llama-13b", "--gpus", "1xL40S", NULL);
  g_assert_cmpint (a.status, ==, 0);
  g_assert_nonnull (strstr (a.out, "host:    1.00 TiB RAM and 4 NVMe drives "
                                   "of 3.49 TiB per node (assumed: the "
                                   "pcie-8gpu preset's; give --host-ram and "
                                   "--nvme for yours)\n"));

  /* A workstation: 64 GiB and one 2 TB drive.  The optimizer goes to NVMe
   * and the answer is slower, but true. */
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "fit", "llama-13b", "--gpus", "1xL40S", "--host-ram", "64GiB",
            "--nvme", "1x2TB", "--json", NULL);
  g_assert_cmpint (b.status, ==, 0);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *o = json_object_of (b.out, &root);
  JsonObject *c = json_object_get_object_member (o, "cluster");
  g_assert_cmpint (json_object_get_int_member (c, "host_ram_bytes"), ==,
                   (gint64)64 << 30);
  g_assert_cmpint (json_object_get_int_member (c, "nvme_drives"), ==, 1);
  g_assert_cmpint (json_object_get_int_member (c, "nvme_capacity_bytes"), ==,
                   2000000000000);
  g_assert_false (json_object_get_boolean_member (c, "host_ram_assumed"));
  g_assert_false (json_object_get_boolean_member (c, "nvme_assumed"));
  JsonObject *l = json_object_get_object_member (o, "layout");
  g_assert_cmpstr (json_object_get_string_member (l, "offload_optimizer"), ==,
                   "nvme");

  /* No drive and 64 GiB: it does not fit, and the text says the host. */
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "fit", "llama-13b", "--gpus", "1xL40S", "--host-ram", "64GiB",
            "--nvme", "none", NULL);
  g_assert_cmpint (n.status, ==, 1);
  g_assert_nonnull (strstr (n.out, "host:    64.00 GiB RAM and no NVMe drive "
                                   "per node\n"));

  /* One flag: the other is still said to be assumed; plan and simulate
   * say it too. */
  g_auto (StowRun) p = { 0 };
  stow_run (&p, "plan", "llama-7b", "--gpus", "1xL40S", "--host-ram", "96GiB",
            NULL);
  g_assert_cmpint (p.status, ==, 0);
  g_assert_nonnull (strstr (p.out, "host: 96.00 GiB RAM and 4 NVMe drives of "
                                   "3.49 TiB per node (the drives are "
                                   "assumed"));
  g_auto (StowRun) sim = { 0 };
  stow_run (&sim, "simulate", "llama-7b", "--gpus", "1xL40S", "--nvme", "2x1TB",
            NULL);
  g_assert_cmpint (sim.status, ==, 0);
  g_assert_nonnull (strstr (sim.out, "host: 1.00 TiB RAM and 2 NVMe drives "
                                     "of 931.32 GiB per node (the RAM is "
                                     "assumed"));

  /* The plan file keeps the host; beside --plan the flags are refused. */
  g_autofree char *plan = g_build_filename (t->dir, "plan.json", NULL);
  g_auto (StowRun) e = { 0 };
  stow_run (&e, "fit", "llama-13b", "--gpus", "1xL40S", "--host-ram", "64GiB",
            "--nvme", "1x2TB", "--emit", "plan", "-o", plan, NULL);
  g_assert_cmpint (e.status, ==, 0);
  g_auto (StowRun) m = { 0 };
  stow_run (&m, "mem", "--plan", plan, NULL);
  g_assert_cmpint (m.status, ==, 0);
  g_assert_nonnull (strstr (m.out, "host:    64.00 GiB RAM and 1 NVMe drive "
                                   "of 1.82 TiB per node\n"));
  const char *beside[] = { "mem", "--plan", plan, "--host-ram", "1TiB", NULL };
  stow_assert_usage_error (beside, "--host-ram cannot be combined with a plan");

  const struct
  {
    const char *flag, *value, *message;
  } bad[] = {
    { "--nvme", "3xfoo", "--nvme 3xfoo: expected none, SIZE or COUNTxSIZE" },
    { "--nvme", "65x1TB", "--nvme 65x1TB: the drive count must be 1 to 64" },
    { "--nvme", "0x1TB", "--nvme 0x1TB: the drive count must be 1 to 64" },
    { "--host-ram", "0", "--host-ram 0: must be more than 0" },
    { "--host-ram", "2EiB", "--host-ram 2EiB: at most" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      const char *args[] = { "fit",       "llama-7b",   "--gpus", "1xL40S",
                             bad[i].flag, bad[i].value, NULL };
      stow_assert_usage_error (args, bad[i].message);
    }
}

/* 3. Every JSON document stowage writes parses, with no number JSON cannot
 * carry, for every command that writes one; and no report in any format
 * prints nan or inf. */
static void
test_every_json_parses (Tmp *t, gconstpointer data)
{
  g_autofree char *custom = g_test_build_filename (
      G_TEST_DIST, "data", "cluster", "custom-gpu.json", NULL);
  g_autofree char *hf = g_test_build_filename (G_TEST_DIST, "data", "hf",
                                               "mixtral-8x7b.json", NULL);
  g_autofree char *store = g_build_filename (t->dir, "store", NULL);
  g_assert_cmpint (g_mkdir (store, 0700), ==, 0);
  const char *const planning[] = { "fit", "plan", "mem", "simulate" };
  const char *const stdout_json[][16] = {
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--emit", "plan", NULL },
    { "fit", "llama-13b", "--gpus", "8xA100-80GB", "--emit", "deepspeed",
      NULL },
    { "mem", "llama-7b", "--gpus", "1xA100-80GB", "--emit", "deepspeed", NULL },
    { "fit", "llama-65b", "--gpus", "1xA100-80GB", "--json", NULL },
    { "plan", "mixtral-8x7b", "--gpus", "16xH100-SXM", "--json", "--top", "3",
      "--explain", NULL },
    { "mem", "--params", "7B", "--largest-layer", "200M", "--convention",
      "deepspeed-estimator", "--gpus", "8xA100-80GB", "--zero", "3", "--json",
      NULL },
    { "gpus", "--json", NULL },
    { "gpus", "--gpus", "4x8xH200", "--json", NULL },
    { "gpus", "--cluster", custom, "--json", NULL },
    { "models", "--json", NULL },
    { "model", "llama-7b", "--json", NULL },
    { "model", hf, "--json", NULL },
    { "hw", "--json", "--synthetic", "pack:2 numa:2 core:4 pu:2", NULL },
    { "bench", "adam", "--params", "100K", "--threads", "2", "--reps", "1",
      "--json", NULL },
    { "bench", "memcpy", "--size", "1MiB", "--threads", "2", "--reps", "1",
      "--json", NULL },
    { "bench", "nvme", "--dir", store, "--size", "4MiB", "--block-size",
      "64KiB", "--json", NULL },
    { "bench", "swapper", "--dir", store, "--size", "4MiB", "--shard-size",
      "1MiB", "--block-size", "64KiB", "--repeat", "1", "--json", NULL },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (planning); i++)
    {
      const char *formats[] = { "--json", "json" };
      for (gsize f = 0; f < G_N_ELEMENTS (formats); f++)
        {
          g_auto (StowRun) r = { 0 };
          if (f == 0)
            stow_run (&r, planning[i], "llama-7b", "--gpus", "8xA100-80GB",
                      "--json", NULL);
          else
            stow_run (&r, planning[i], "llama-7b", "--gpus", "8xA100-80GB",
                      "--format", "json", NULL);
          g_assert_cmpint (r.status, ==, 0);
          stow_assert_json_valid (r.out, planning[i]);
        }
      const char *text[] = { "text", "csv", "md", "html" };
      for (gsize f = 0; f < G_N_ELEMENTS (text); f++)
        {
          g_auto (StowRun) r = { 0 };
          stow_run (&r, planning[i], "llama-65b", "--gpus", "8xA100-80GB",
                    "--format", text[f], NULL);
          g_assert_cmpint (r.status, <=, 1);
          g_assert_false (stow_text_has_nonfinite (r.out));
        }
    }
  for (gsize i = 0; i < G_N_ELEMENTS (stdout_json); i++)
    {
      g_auto (StowRun) r = { 0 };
      stow_runv (&r, stdout_json[i]);
      g_assert_cmpint (r.status, <=, 1);
      stow_assert_json_valid (r.out, stdout_json[i][0]);
    }

  /* And the files: a trace, a plan, a probe profile. */
  g_autofree char *trace = g_build_filename (t->dir, "trace.json", NULL);
  g_autofree char *plan = g_build_filename (t->dir, "plan.json", NULL);
  g_autofree char *profile = g_build_filename (t->dir, "profile.json", NULL);
  g_auto (StowRun) a = { 0 };
  stow_run (&a, "simulate", "llama-7b", "--gpus", "8xA100-80GB", "--trace",
            trace, NULL);
  g_assert_cmpint (a.status, ==, 0);
  g_auto (StowRun) b = { 0 };
  stow_run (&b, "fit", "llama-7b", "--gpus", "8xA100-80GB", "--emit", "plan",
            "-o", plan, NULL);
  g_assert_cmpint (b.status, ==, 0);
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "hw", "--probe", "--probe-size", "1MiB", "--threads", "1",
            "--repeats", "1", "--save", profile, NULL);
  g_assert_cmpint (c.status, ==, 0);
  const char *files[] = { trace, plan, profile };
  for (gsize i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *text = NULL;
      g_assert_true (g_file_get_contents (files[i], &text, NULL, NULL));
      stow_assert_json_valid (text, files[i]);
    }
  g_autofree char *cmd = g_strdup_printf ("rm -rf '%s'", store);
  g_assert_cmpint (system (cmd), ==, 0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add ("/hardening/deep-json", Tmp, NULL, tmp_setup, test_deep_json,
              tmp_teardown);
  g_test_add ("/hardening/output-targets", Tmp, NULL, tmp_setup,
              test_output_targets, tmp_teardown);
  g_test_add ("/hardening/required-fields-only", Tmp, NULL, tmp_setup,
              test_required_fields_only, tmp_teardown);
  g_test_add ("/hardening/limits", Tmp, NULL, tmp_setup, test_limits,
              tmp_teardown);
  g_test_add_func ("/hardening/mem-simulate-like-fit",
                   test_mem_simulate_like_fit);
  g_test_add ("/hardening/words-and-numbers", Tmp, NULL, tmp_setup,
              test_words_and_numbers, tmp_teardown);
  g_test_add ("/hardening/host-flags", Tmp, NULL, tmp_setup, test_host_flags,
              tmp_teardown);
  g_test_add ("/hardening/every-json-parses", Tmp, NULL, tmp_setup,
              test_every_json_parses, tmp_teardown);
  return g_test_run ();
}
