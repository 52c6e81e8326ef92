/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-hw.c: `stowage hw` and `stowage gpus` as a user runs
 * them: this machine described truthfully (checked against what the OS
 * says), injected topologies, the catalog, specs and cluster files, and
 * one-line errors with exit code 2.
 */
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "tests/testutil.h"

static JsonObject *
parse_object (const char *text, JsonParser **parser)
{
  g_autoptr (GError) error = NULL;
  *parser = json_parser_new ();
  g_assert_true (json_parser_load_from_data (*parser, text, -1, &error));
  g_assert_no_error (error);
  JsonNode *root = json_parser_get_root (*parser);
  g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
  return json_node_get_object (root);
}

static void
check_error (const char *const *args, const char *fragment)
{
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, args);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpstr (r.out, ==, "");
  g_assert_true (g_str_has_prefix (r.err, "stowage: "));
  g_assert_cmpuint (stow_count_lines (r.err), <=, 2);
  if (!strstr (r.err, fragment))
    g_error ("expected \"%s\" in: %s", fragment, r.err);
}

/* This machine, in text: the counts must be the OS's. */
static void
test_hw_text (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.err, ==, "");
  g_assert_true (g_str_has_prefix (r.out, "Machine: "));
  g_autofree char *pus
      = g_strdup_printf (", %u PU%s\n", g_get_num_processors (),
                         g_get_num_processors () == 1 ? "" : "s");
  g_assert_nonnull (strstr (r.out, pus));
  g_assert_nonnull (strstr (r.out, "RAM: "));
  g_assert_nonnull (strstr (r.out, "GPUs: "));
  /* No GPU is an answer, said plainly, not an error. */
  if (strstr (r.out, "GPUs: none"))
    g_assert_nonnull (strstr (r.out, "no CUDA GPU found: "));
}

static void
test_hw_json (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (r.out, &p);
  g_assert_cmpint (json_object_get_int_member (o, "pus"), ==,
                   g_get_num_processors ());
  g_assert_cmpint (json_object_get_int_member (o, "cores"), >=, 1);
  g_assert_cmpint (json_object_get_int_member (o, "cores"), <=,
                   g_get_num_processors ());
  /* RAM as the kernel counts it (sysconf), within a page. */
  gint64 ram = json_object_get_int_member (o, "ram_bytes");
  gint64 phys = (gint64)sysconf (_SC_PHYS_PAGES) * sysconf (_SC_PAGESIZE);
  g_assert_cmpint (ram, >=, phys / 2);
  g_assert_cmpint (ram, <=, phys + (1 << 20));
  g_assert_cmpstr (json_object_get_string_member (o, "hostname"), ==,
                   g_get_host_name ());
  JsonArray *gpus = json_object_get_array_member (o, "gpus");
  if (json_array_get_length (gpus) == 0)
    g_assert_true (g_str_has_prefix (
        json_object_get_string_member (o, "gpu_status"), "no "));
  g_assert_true (json_object_has_member (o, "block_devices"));
  g_assert_false (json_object_has_member (o, "nvme_path"));
}

static void
test_hw_nvme_path (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-cli-hw-XXXXXX", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", "--json", "--nvme-path", dir, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (r.out, &p);
  JsonObject *n = json_object_get_object_member (o, "nvme_path");
  g_assert_nonnull (n);
  g_assert_cmpstr (json_object_get_string_member (n, "path"), ==, dir);
  g_assert_cmpint (json_object_get_int_member (n, "total_bytes"), >, 0);
  g_assert_nonnull (json_object_get_string_member (n, "fs_type"));

  g_auto (StowRun) t = { 0 };
  stow_run (&t, "hw", "--nvme-path", dir, NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_autofree char *line = g_strdup_printf ("NVMe path: %s: ", dir);
  g_assert_nonnull (strstr (t.out, line));
  g_rmdir (dir);

  const char *bad[] = { "hw", "--nvme-path", "/nonexistent/stow", NULL };
  check_error (bad, "--nvme-path \"/nonexistent/stow\"");
}

static void
test_hw_injected (void)
{
  g_autofree char *xml = g_test_build_filename (G_TEST_DIST, "data", "topology",
                                                "dgx-h100-like.xml", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", "--topology", xml, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "2 sockets, 2 NUMA nodes, 8 cores, 16 PUs"));
  g_assert_nonnull (strstr (r.out, "GPUs: 8"));
  /* Every GPU row names the catalog entry. */
  const char *p = r.out;
  guint rows = 0;
  while ((p = strstr (p, "H100-SXM")) != NULL)
    rows++, p++;
  g_assert_cmpuint (rows, ==, 8);

  g_auto (StowRun) s = { 0 };
  stow_run (&s, "hw", "--json", "--synthetic", "pack:2 numa:2 core:8 pu:2",
            NULL);
  g_assert_cmpint (s.status, ==, 0);
  g_autoptr (JsonParser) jp = NULL;
  JsonObject *o = parse_object (s.out, &jp);
  g_assert_cmpint (json_object_get_int_member (o, "numa_nodes"), ==, 4);
  g_assert_cmpint (json_object_get_int_member (o, "cores"), ==, 32);
  g_assert_cmpint (json_object_get_int_member (o, "pus"), ==, 64);

  const char *bad[] = { "hw", "--synthetic", "pack:zero", NULL };
  check_error (bad, "synthetic topology \"pack:zero\"");
  const char *missing[] = { "hw", "--topology", "/nonexistent.xml", NULL };
  check_error (missing, "/nonexistent.xml");
  const char *extra[] = { "hw", "extra", NULL };
  check_error (extra, "unexpected argument \"extra\"");
}

static void
test_gpus_list (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "gpus", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "H100-SXM"));
  g_assert_nonnull (strstr (r.out, "dgx-a100"));
  g_assert_nonnull (strstr (r.out, "79.18 GiB")); /* H100's torch total */

  g_auto (StowRun) j = { 0 };
  stow_run (&j, "gpus", "--json", NULL);
  g_assert_cmpint (j.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (j.out, &p);
  JsonArray *gpus = json_object_get_array_member (o, "gpus");
  g_assert_cmpuint (json_array_get_length (gpus), ==, 25);
  gboolean found = FALSE;
  for (guint i = 0; i < json_array_get_length (gpus); i++)
    {
      JsonObject *g = json_array_get_object_element (gpus, i);
      if (g_str_equal (json_object_get_string_member (g, "name"), "A100-80GB"))
        {
          found = TRUE;
          g_assert_cmpfloat (json_object_get_double_member (g, "nvlink_bw"), ==,
                             300e9);
          g_assert_cmpfloat (json_object_get_double_member (g, "bf16_flops"),
                             ==, 312e12);
        }
    }
  g_assert_true (found);
}

static void
test_gpus_spec (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "gpus", "--gpus", "64xH100-SXM", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_true (g_str_has_prefix (
      r.out, "Cluster \"64xH100-SXM\": 8 nodes x 8 GPUs = 64 H100-SXM\n"));

  g_auto (StowRun) j = { 0 };
  stow_run (&j, "gpus", "--json", "--gpus", "4x8xh200", NULL);
  g_assert_cmpint (j.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (j.out, &p);
  g_assert_cmpint (json_object_get_int_member (o, "n_nodes"), ==, 4);
  g_assert_cmpint (json_object_get_int_member (o, "n_gpus"), ==, 32);

  const char *unknown[] = { "gpus", "--gpus", "8xA100-80G", NULL };
  check_error (unknown, "--gpus \"8xA100-80G\": unknown GPU \"A100-80G\" "
                        "(did you mean A100-80GB?)");
  const char *multiple[] = { "gpus", "--gpus", "12xH100", NULL };
  check_error (multiple, "not a multiple of the 8 GPUs");
  const char *zero[] = { "gpus", "--gpus", "0xH100", NULL };
  check_error (zero, "got 0");
}

static void
test_gpus_cluster_file (void)
{
  g_autofree char *ok = g_test_build_filename (G_TEST_DIST, "data", "cluster",
                                               "dgx-h100-overrides.json", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "gpus", "--cluster", ok, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "4 nodes x 8 GPUs = 32 H100-SXM"));
  g_assert_nonnull (strstr (r.out, "/mnt/nvme1"));

  g_autofree char *bad = g_test_build_filename (
      G_TEST_DIST, "data", "cluster", "bad-nodes-negative.json", NULL);
  g_autofree char *msg
      = g_strdup_printf ("%s: nodes: expected a positive integer, got -1", bad);
  const char *args[] = { "gpus", "--cluster", bad, NULL };
  check_error (args, msg);
}

/* "--gpus local" on a machine without GPUs is a clear planning error. */
static void
test_gpus_local (void)
{
  g_auto (StowRun) probe = { 0 };
  stow_run (&probe, "hw", "--json", NULL);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (probe.out, &p);
  if (json_array_get_length (json_object_get_array_member (o, "gpus")) > 0)
    {
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "gpus", "--gpus", "local", NULL);
      g_assert_cmpint (r.status, ==, 0);
      g_assert_nonnull (strstr (r.out, "Cluster \"local\": 1 node"));
      return;
    }
  const char *args[] = { "gpus", "--gpus", "local", NULL };
  check_error (args, "--gpus \"local\": this machine has no GPU to plan for");
}

/* --probe measures, --save writes a profile a cluster file can name. */
static void
test_hw_probe (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-cli-probe-XXXXXX", NULL);
  g_autofree char *prof = g_build_filename (dir, "profile.json", NULL);
  g_autofree char *clus = g_build_filename (dir, "cluster.json", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", "--probe", "--probe-size", "16MiB", "--save", prof, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "Probe: host memory triad "));
  g_assert_nonnull (strstr (r.out, "Profile written to "));

  g_autofree char *text = NULL;
  g_assert_true (g_file_get_contents (prof, &text, NULL, NULL));
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (text, &p);
  g_assert_cmpstr (json_object_get_string_member (o, "format"), ==,
                   "stowage-hw-profile");
  JsonObject *host = json_object_get_object_member (o, "host");
  double bw = json_object_get_double_member (host, "mem_bw_triad");
  g_assert_cmpfloat (bw, >, 1e8);
  g_assert_cmpint (json_object_get_int_member (host, "threads"), ==,
                   g_get_num_processors ());

  g_assert_true (g_file_set_contents (
      clus, "{ \"preset\": \"workstation\", \"profile\": \"profile.json\" }",
      -1, NULL));
  g_auto (StowRun) c = { 0 };
  stow_run (&c, "gpus", "--json", "--cluster", clus, NULL);
  g_assert_cmpint (c.status, ==, 0);
  g_autoptr (JsonParser) cp = NULL;
  JsonObject *co = parse_object (c.out, &cp);
  JsonObject *node = json_object_get_object_member (co, "node");
  g_assert_cmpfloat (json_object_get_double_member (node, "host_mem_bw"), ==,
                     bw);
  g_assert_cmpstr (json_object_get_string_member (node, "profile"), ==, prof);

  g_unlink (prof);
  g_unlink (clus);
  g_rmdir (dir);

  const char *nosave[] = { "hw", "--save", "x.json", NULL };
  check_error (nosave, "go with --probe");
  const char *badsize[] = { "hw", "--probe", "--probe-size", "lots", NULL };
  check_error (badsize, "--probe-size");
}

/* With a (stand-in) CUDA driver: its GPUs are listed and "--gpus local"
 * plans for them. */
static void
test_hw_fake_cuda (void)
{
  const char *lib = g_getenv ("STOW_FAKE_CUDA");
  if (lib == NULL)
    {
      g_test_skip ("STOW_FAKE_CUDA is not set (run through meson test)");
      return;
    }
  g_setenv ("STOW_CUDA_LIBRARY", lib, TRUE);
  g_setenv ("STOW_FAKE_CUDA_DEVICES", "2", TRUE);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "GPUs: 2 (CUDA driver 12.4)"));
  g_assert_nonnull (strstr (r.out, "NVIDIA H100 80GB HBM3"));

  g_auto (StowRun) l = { 0 };
  stow_run (&l, "gpus", "--gpus", "local", NULL);
  g_assert_cmpint (l.status, ==, 0);
  g_assert_true (g_str_has_prefix (
      l.out, "Cluster \"local\": 1 node x 2 GPUs = 2 H100-SXM\n"));

  g_setenv ("STOW_FAKE_CUDA_DEVICES", "0", TRUE);
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "hw", NULL);
  g_assert_cmpint (n.status, ==, 0);
  g_assert_nonnull (strstr (n.out, "no CUDA-capable device is detected"));
  g_unsetenv ("STOW_CUDA_LIBRARY");
  g_unsetenv ("STOW_FAKE_CUDA_DEVICES");
}

/* The host pages the pinned pool gets (issue 26): the kernel's THP mode,
 * the hugetlb reserve, and the kind measured; THP "never" (by
 * STOWAGE_THP) gives ordinary pages; hugetlb without reserved pages falls
 * back with a note; an unknown kind is a usage error. */
static void
test_hw_host_pages (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "hw", "--json", NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autoptr (JsonParser) p = NULL;
  JsonObject *o = parse_object (r.out, &p);
  JsonObject *h = json_object_get_object_member (o, "host_pages");
  g_assert_nonnull (h);
  const char *thp = json_object_get_string_member (h, "thp");
  g_assert_true (g_str_equal (thp, "always") || g_str_equal (thp, "madvise")
                 || g_str_equal (thp, "never"));
  g_assert_cmpstr (json_object_get_string_member (h, "huge_pages"), ==, "auto");
  const char *kind = json_object_get_string_member (h, "page_kind");
  g_assert_true (g_str_equal (kind, "small") || g_str_equal (kind, "mixed")
                 || g_str_equal (kind, "thp"));
  if (g_str_equal (thp, "never"))
    g_assert_cmpstr (kind, ==, "small");

  g_setenv ("STOWAGE_THP", "never", TRUE);
  g_auto (StowRun) n = { 0 };
  stow_run (&n, "hw", NULL);
  g_auto (StowRun) nj = { 0 };
  stow_run (&nj, "hw", "--json", "--huge-pages", "thp", NULL);
  g_unsetenv ("STOWAGE_THP");
  g_assert_cmpint (n.status, ==, 0);
  g_assert_cmpstr (n.err, ==, "");
  g_assert_nonnull (strstr (n.out, "Host pages: THP never;"));
  g_assert_nonnull (strstr (n.out, "gets ordinary pages (small)"));
  g_autoptr (JsonParser) pn = NULL;
  JsonObject *hn = json_object_get_object_member (parse_object (nj.out, &pn),
                                                  "host_pages");
  g_assert_cmpstr (json_object_get_string_member (hn, "page_kind"), ==,
                   "small");
  g_assert_cmpint (json_object_get_int_member (hn, "huge_bytes"), ==, 0);
  g_assert_nonnull (
      strstr (json_object_get_string_member (hn, "note"), "never"));

  g_auto (StowRun) t = { 0 };
  stow_run (&t, "hw", "--json", "--huge-pages", "hugetlb", NULL);
  g_assert_cmpint (t.status, ==, 0);
  g_autoptr (JsonParser) pt = NULL;
  JsonObject *ht
      = json_object_get_object_member (parse_object (t.out, &pt), "host_pages");
  if (json_object_get_int_member (ht, "hugetlb_free") < 2)
    {
      g_assert_cmpstr (json_object_get_string_member (ht, "page_kind"), !=,
                       "hugetlb");
      g_assert_nonnull (strstr (json_object_get_string_member (ht, "note"),
                                "hugetlb: cannot map"));
    }
  const char *bad[] = { "hw", "--huge-pages", "giant", NULL };
  stow_assert_usage_error (bad, "--huge-pages \"giant\": unknown kind");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  /* Under the sanitizers: hwloc's PCI plugin (libpciaccess) leaks a few
   * allocations and is dlclose()d before LeakSanitizer reports, so the
   * report names no module and no suppression can match it.  Leave that
   * plugin out there; the unit tests cover PCI parsing through XML. */
  if (g_getenv ("ASAN_OPTIONS"))
    g_setenv ("HWLOC_PLUGINS_BLACKLIST", "hwloc_pci", TRUE);
  g_test_add_func ("/cli/hw/text", test_hw_text);
  g_test_add_func ("/cli/hw/json", test_hw_json);
  g_test_add_func ("/cli/hw/host-pages", test_hw_host_pages);
  g_test_add_func ("/cli/hw/nvme-path", test_hw_nvme_path);
  g_test_add_func ("/cli/hw/injected", test_hw_injected);
  g_test_add_func ("/cli/hw/probe", test_hw_probe);
  g_test_add_func ("/cli/hw/fake-cuda", test_hw_fake_cuda);
  g_test_add_func ("/cli/gpus/list", test_gpus_list);
  g_test_add_func ("/cli/gpus/spec", test_gpus_spec);
  g_test_add_func ("/cli/gpus/cluster-file", test_gpus_cluster_file);
  g_test_add_func ("/cli/gpus/local", test_gpus_local);
  return g_test_run ();
}
