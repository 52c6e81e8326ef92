/* SPDX-License-Identifier: MIT
 *
 * tests/test-hw.c: the hw room: the catalog against the published table
 * (ecosystem.md section 3), --gpus specs and their errors (with a fuzz
 * test), cluster.json files, and discovery on injected hwloc topologies
 * (synthetic and a saved XML of a 2-socket, 8-GPU server), a fake sysfs.
 */
#include <string.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "hw/hw.h"
#include "hw/machine.h"

#define MiB ((guint64)1 << 20)
#define GiB ((guint64)1 << 30)

/* ---- catalog ------------------------------------------------------------ */

static const StowGpu *
gpu (const char *name)
{
  g_autoptr (GError) error = NULL;
  const StowGpu *g = stow_gpu_lookup (name, &error);
  g_assert_no_error (error);
  g_assert_nonnull (g);
  return g;
}

static void
test_catalog_reference (void)
{
  /* ecosystem.md section 3: H100 SXM5 989 dense bf16, 1979 fp8, 3.35 TB/s,
   * torch total 81082-81090 MiB, NVLink4 900 GB/s bidirectional. */
  const StowGpu *h = gpu ("H100-SXM");
  g_assert_cmpfloat (h->bf16_flops, ==, 989e12);
  g_assert_cmpfloat (h->fp8_flops, ==, 1979e12);
  g_assert_cmpfloat (h->hbm_bw, ==, 3.35e12);
  g_assert_cmpuint (h->total_bytes, >=, 81082 * MiB);
  g_assert_cmpuint (h->total_bytes, <=, 81090 * MiB);
  g_assert_cmpfloat (h->nvlink_bw, ==, 450e9);
  g_assert_cmpuint (h->nvlink_domain, ==, 8);
  g_assert_cmpuint (h->pcie_gen, ==, 5);
  g_assert_cmpuint (h->marketing_bytes, ==, 80000000000);
  g_assert_cmpuint (h->smi_bytes, ==, 81559 * MiB);
  /* The OOM text says "total capacity of 79.18 GiB". */
  g_assert_cmpfloat_with_epsilon ((double)h->total_bytes / GiB, 79.18, 0.01);

  /* A100 SXM4 80GB: 312 TFLOPS, 2039 GB/s, torch 81038-81251 MiB, NVLink3
   * 600 GB/s bidirectional = 300 per direction. */
  const StowGpu *a = gpu ("A100-80GB");
  g_assert_cmpfloat (a->bf16_flops, ==, 312e12);
  g_assert_cmpfloat (a->hbm_bw, ==, 2039e9);
  g_assert_cmpuint (a->total_bytes, >=, 81038 * MiB);
  g_assert_cmpuint (a->total_bytes, <=, 81251 * MiB);
  g_assert_cmpfloat (a->nvlink_bw, ==, 300e9);
  g_assert_cmpuint (a->pcie_gen, ==, 4);
  /* offload.md section 0: Gen4 pinned about 25 GB/s, Gen5 about 50. */
  g_assert_cmpfloat (a->pcie_bw, ==, 25e9);
  g_assert_cmpfloat (h->pcie_bw, ==, 50e9);

  const StowGpu *h200 = gpu ("H200");
  g_assert_cmpuint (h200->total_bytes, ==, 143156 * MiB);
  g_assert_cmpfloat (h200->hbm_bw, ==, 4.8e12);
  g_assert_cmpfloat (h200->bf16_flops, ==, 989e12);

  const StowGpu *b = gpu ("B200");
  g_assert_cmpuint (b->total_bytes, >=, 182631 * MiB);
  g_assert_cmpuint (b->total_bytes, <=, 182642 * MiB);
  g_assert_cmpfloat (b->nvlink_bw, ==, 900e9);
  g_assert_cmpfloat (b->fp8_flops, ==, 4500e12);

  const StowGpu *v = gpu ("V100-16GB");
  g_assert_cmpfloat (v->bf16_flops, ==, 0); /* Volta has no bf16 */
  g_assert_cmpfloat (v->fp16_flops, ==, 125e12);
  g_assert_cmpuint (v->pcie_gen, ==, 3);
  g_assert_cmpfloat (v->pcie_bw, ==, 12e9);

  const StowGpu *l = gpu ("L40S");
  g_assert_cmpfloat (l->nvlink_bw, ==, 0);
  g_assert_cmpuint (l->nvlink_domain, ==, 1);
  g_assert_cmpfloat (gpu ("RTX-4090")->bf16_flops, ==, 165.2e12);
  g_assert_cmpfloat (gpu ("RTX-3090")->nvlink_bw, ==, 56.25e9);
  g_assert_cmpuint (gpu ("MI300X")->total_bytes, ==, 196592 * MiB);
  g_assert_cmpfloat (gpu ("MI300X")->nvlink_bw, ==, 448e9);
  g_assert_cmpuint (gpu ("A10")->total_bytes, ==, 22589 * MiB);

  /* Issue 25's GPUs, datasheet figures (each file's "sources" names its
   * own).  H800: the H100 die with NVLink cut to 400 GB/s bidirectional. */
  const StowGpu *h800 = gpu ("H800");
  g_assert_cmpfloat (h800->bf16_flops, ==, h->bf16_flops);
  g_assert_cmpfloat (h800->hbm_bw, ==, h->hbm_bw);
  g_assert_cmpfloat (h800->nvlink_bw, ==, 200e9);
  /* H20: 148 TFLOPS bf16 dense, 296 fp8, 4.0 TB/s, 96 GB, NVLink 900. */
  const StowGpu *h20 = gpu ("H20");
  g_assert_cmpfloat (h20->bf16_flops, ==, 148e12);
  g_assert_cmpfloat (h20->fp8_flops, ==, 296e12);
  g_assert_cmpfloat (h20->hbm_bw, ==, 4.0e12);
  g_assert_cmpfloat (h20->nvlink_bw, ==, 450e9);
  g_assert_cmpuint (h20->marketing_bytes, ==, 96000000000);
  /* GH200: Hopper's rates, 96 GB HBM3 at 4 TB/s, NVLink-C2C to the host
   * (450 GB/s per direction, 80% of it practical), one per node. */
  const StowGpu *gh = gpu ("Grace-Hopper");
  g_assert_cmpstr (gh->name, ==, "GH200");
  g_assert_cmpfloat (gh->bf16_flops, ==, 989e12);
  g_assert_cmpfloat (gh->hbm_bw, ==, 4.0e12);
  g_assert_cmpfloat (gh->pcie_bw, ==, 360e9);
  g_assert_cmpuint (stow_node_preset_lookup ("gh200", NULL)->gpus_per_node, ==,
                    1);
  /* Workstation and inference cards: A6000 154.8, RTX 6000 Ada 364.2
   * (fp8 728.5), A40 149.7, L4 121 (fp8 242.5), T4 65 fp16 and no bf16,
   * RTX 5090 209.5 with fp32 accumulate at 1792 GB/s. */
  g_assert_cmpfloat (gpu ("A6000")->bf16_flops, ==, 154.8e12);
  g_assert_cmpfloat (gpu ("A6000")->hbm_bw, ==, 768e9);
  g_assert_cmpuint (gpu ("RTX-6000-Ada")->smi_bytes, ==, 49140 * MiB);
  g_assert_cmpfloat (gpu ("RTX-6000-Ada")->fp8_flops, ==, 728.5e12);
  g_assert_cmpfloat (gpu ("A40")->bf16_flops, ==, 149.7e12);
  g_assert_cmpuint (gpu ("A40")->smi_bytes, ==, 46068 * MiB);
  g_assert_cmpfloat (gpu ("L4")->fp8_flops, ==, 242.5e12);
  g_assert_cmpfloat (gpu ("L4")->hbm_bw, ==, 300e9);
  const StowGpu *t4 = gpu ("T4");
  g_assert_cmpfloat (t4->bf16_flops, ==, 0);
  g_assert_cmpfloat (t4->fp16_flops, ==, 65e12);
  g_assert_cmpuint (t4->pcie_gen, ==, 3);
  /* The lower bound of the observed OOM texts: "14.56 GiB" on a GCP T4
   * (Colab and Kaggle T4s read 14.74 GiB). */
  g_assert_cmpfloat_with_epsilon ((double)t4->total_bytes / GiB, 14.56, 0.005);
  const StowGpu *r5 = gpu ("5090");
  g_assert_cmpfloat (r5->bf16_flops, ==, 209.5e12);
  g_assert_cmpfloat (r5->hbm_bw, ==, 1792e9);
  g_assert_cmpuint (r5->pcie_gen, ==, 5);
}

static void
test_catalog_complete (void)
{
  /* Every GPU of the reference table, each with its preset. */
  static const char *const table[]
      = { "V100-16GB", "V100-32GB", "A100-40GB", "A100-PCIe-40GB", "A100-80GB",
          "A100-PCIe-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "L40S",
          "A10", "RTX-3090", "RTX-4090", "MI250X", "MI300X",
          /* Issue 25: what people train on now. */
          "H800", "H20", "GH200", "RTX-A6000", "RTX-6000-Ada", "A40", "L4",
          "T4", "RTX-5090" };
  gsize n;
  const StowGpu *const *all = stow_gpu_catalog (&n);
  g_assert_cmpuint (n, ==, G_N_ELEMENTS (table));
  g_assert_null (all[n]);
  for (gsize i = 0; i < G_N_ELEMENTS (table); i++)
    {
      const StowGpu *g = gpu (table[i]);
      g_assert_cmpstr (g->name, ==, table[i]);
      /* Usable memory is below the marketing figure's binary reading and
       * close to it: torch loses a few hundred MiB to the driver, GDDR6
       * ECC about 6% more (ecosystem.md section 3). */
      g_assert_cmpuint (g->total_bytes, >, 0);
      g_assert_cmpuint (g->total_bytes, <=,
                        g->marketing_bytes / 1000000000 * GiB);
      g_assert_cmpuint (g->total_bytes, >,
                        g->marketing_bytes / 1000000000 * GiB * 90 / 100);
      if (g->smi_bytes)
        g_assert_cmpuint (g->total_bytes, <=, g->smi_bytes);
      g_assert_cmpfloat (g->fp16_flops, >, 0);
      g_assert_cmpfloat (g->hbm_bw, >, 0);
      g_assert_cmpfloat (g->pcie_bw, >, 0);
      g_assert_nonnull (g->description);
      g_assert_nonnull (stow_node_preset_lookup (g->preset, NULL));
    }

  /* No alias may name two GPUs. */
  g_autoptr (GHashTable) seen
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  for (gsize i = 0; i < n; i++)
    {
      g_assert_true (
          g_hash_table_add (seen, g_ascii_strdown (all[i]->name, -1)));
      for (char **a = all[i]->aliases; *a; a++)
        g_assert_true (g_hash_table_add (seen, g_ascii_strdown (*a, -1)));
    }
}

static void
test_catalog_presets (void)
{
  gsize n;
  const StowNode *const *nodes = stow_node_presets (&n);
  g_assert_cmpuint (n, >=, 5);
  /* DGX A100 datasheet: 8x A100, 2 TB, 2x 64-core EPYC 7742, 8x HDR 200
   * Gb/s = 25 GB/s per GPU. */
  const StowNode *a = stow_node_preset_lookup ("dgx-a100", NULL);
  g_assert_nonnull (a);
  g_assert_cmpstr (a->gpu.name, ==, "A100-80GB");
  g_assert_cmpuint (a->gpus_per_node, ==, 8);
  g_assert_cmpuint (a->host_ram_bytes, ==, 2048 * GiB);
  g_assert_cmpuint (a->cpu_cores, ==, 128);
  g_assert_cmpfloat (a->net_bw_per_gpu, ==, 25e9);
  g_assert_cmpuint (a->n_nvme, ==, 8);
  g_assert_cmpuint (a->nvme[0].capacity_bytes, ==, 3840000000000);
  /* DGX H100: 8x NDR 400 Gb/s = 50 GB/s per GPU, 2x 56 cores. */
  const StowNode *h = stow_node_preset_lookup ("DGX-H100", NULL);
  g_assert_nonnull (h);
  g_assert_cmpfloat (h->net_bw_per_gpu, ==, 50e9);
  g_assert_cmpuint (h->cpu_cores, ==, 112);
  g_assert_nonnull (stow_node_preset_lookup ("hgx-h200", NULL));
  g_assert_nonnull (stow_node_preset_lookup ("pcie-8gpu", NULL));
  const StowNode *w = stow_node_preset_lookup ("workstation", NULL);
  g_assert_nonnull (w);
  g_assert_cmpuint (w->gpus_per_node, ==, 4);
  for (gsize i = 0; i < n; i++)
    {
      g_assert_cmpfloat (nodes[i]->host_mem_bw, >, 0);
      g_assert_cmpuint (nodes[i]->host_ram_bytes, >, 0);
      g_assert_cmpuint (nodes[i]->numa_nodes, >, 0);
    }

  g_autoptr (GError) error = NULL;
  g_assert_null (stow_node_preset_lookup ("dgx-h10", &error));
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND);
  g_assert_nonnull (strstr (error->message, "did you mean dgx-h100?"));
}

/* Every figure of the catalog names where it came from (issue 25): each
 * file has a non-empty "sources" object of non-empty strings, and none is
 * still marked "[mem]" (from memory).  A figure no public page could back
 * says so as "[unsourced: reason]".  Reads the files in the source tree,
 * and counts them against the compiled-in catalog, so a file left out of
 * catalog.gresource.xml fails here too. */
static void
check_sources_in (const char *dir, GString *bad, guint *n_files)
{
  g_autofree char *path
      = g_test_build_filename (G_TEST_DIST, "..", "hw", "catalog", dir, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (GDir) d = g_dir_open (path, 0, &error);
  g_assert_no_error (error);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      if (!g_str_has_suffix (name, ".json"))
        continue;
      g_autofree char *file = g_build_filename (path, name, NULL);
      g_autoptr (JsonNode) root = stow_json_parse_file (file, 1 << 20, &error);
      g_assert_no_error (error);
      JsonObject *obj = stow_json_root_object (root, file, &error);
      g_assert_no_error (error);
      (*n_files)++;
      JsonObject *src = json_object_get_object_member (obj, "sources");
      if (src == NULL || json_object_get_size (src) == 0)
        {
          g_string_append_printf (bad, "%s/%s: no sources\n", dir, name);
          continue;
        }
      g_autoptr (GList) keys = json_object_get_members (src);
      for (GList *k = keys; k; k = k->next)
        {
          const char *text
              = json_object_get_string_member_with_default (src, k->data, NULL);
          if (text == NULL || *text == '\0')
            g_string_append_printf (bad, "%s/%s: sources.%s is empty\n", dir,
                                    name, (const char *)k->data);
          else if (strstr (text, "[mem]") != NULL)
            g_string_append_printf (bad, "%s/%s: sources.%s is \"[mem]\"\n",
                                    dir, name, (const char *)k->data);
        }
    }
}

static void
test_catalog_sourced (void)
{
  g_autoptr (GString) bad = g_string_new (NULL);
  guint n_files = 0;
  check_sources_in ("gpus", bad, &n_files);
  check_sources_in ("nodes", bad, &n_files);
  gsize n_gpus, n_nodes;
  stow_gpu_catalog (&n_gpus);
  stow_node_presets (&n_nodes);
  /* The directories and the compiled-in catalog hold the same files. */
  g_assert_cmpuint (n_files, ==, n_gpus + n_nodes);
  g_assert_cmpstr (bad->str, ==, "");
}

static void
test_lookup (void)
{
  /* Case-insensitive, aliases, and CUDA's own device names. */
  g_assert_cmpstr (gpu ("a100-80gb")->name, ==, "A100-80GB");
  g_assert_cmpstr (gpu ("a100")->name, ==, "A100-80GB");
  g_assert_cmpstr (gpu ("H100")->name, ==, "H100-SXM");
  g_assert_cmpstr (gpu ("h100 80gb hbm3")->name, ==, "H100-SXM");
  g_assert_cmpstr (gpu ("h200")->name, ==, "H200");
  g_assert_cmpstr (gpu ("4090")->name, ==, "RTX-4090");
  g_assert_cmpstr (gpu ("a100_sxm4_40gb")->name, ==, "A100-40GB");

  g_autoptr (GError) error = NULL;
  g_assert_null (stow_gpu_lookup ("A100-80G", &error));
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND);
  g_assert_cmpstr (error->message, ==,
                   "unknown GPU \"A100-80G\" (did you mean A100-80GB?)");
  g_clear_error (&error);
  g_assert_null (stow_gpu_lookup ("TPUv5", &error));
  g_assert_nonnull (strstr (error->message, "unknown GPU \"TPUv5\""));
  g_assert_nonnull (strstr (error->message, "H100-SXM"));
}

/* ---- specs -------------------------------------------------------------- */

static StowCluster *
spec_ok (const char *spec, guint nodes, guint per_node, const char *name)
{
  g_autoptr (GError) error = NULL;
  StowCluster *c = stow_cluster_new_from_spec (spec, &error);
  g_assert_no_error (error);
  g_assert_nonnull (c);
  g_assert_cmpuint (c->n_nodes, ==, nodes);
  g_assert_cmpuint (c->node.gpus_per_node, ==, per_node);
  g_assert_cmpuint (c->n_gpus, ==, nodes * per_node);
  g_assert_cmpstr (c->node.gpu.name, ==, name);
  g_assert_cmpstr (c->spec, ==, spec);
  return c;
}

static void
test_spec_valid (void)
{
  g_autoptr (StowCluster) a = spec_ok ("8xA100-80GB", 1, 8, "A100-80GB");
  g_assert_cmpstr (a->node.name, ==, "dgx-a100");
  g_autoptr (StowCluster) h = spec_ok ("64xH100-SXM", 8, 8, "H100-SXM");
  g_assert_cmpfloat (h->node.net_bw_per_gpu, ==, 50e9);
  g_autoptr (StowCluster) h2 = spec_ok ("4x8xH200", 4, 8, "H200");
  g_assert_cmpstr (h2->node.name, ==, "hgx-h200");
  stow_cluster_unref (spec_ok ("8xa100", 1, 8, "A100-80GB"));
  stow_cluster_unref (spec_ok ("16XH100", 2, 8, "H100-SXM"));
  stow_cluster_unref (spec_ok ("  2x8xh100-sxm  ", 2, 8, "H100-SXM"));
  stow_cluster_unref (spec_ok ("A100-80GB", 1, 1, "A100-80GB"));
  stow_cluster_unref (spec_ok ("8xMI300X", 1, 8, "MI300X"));
  /* Digits that are a name, not a count. */
  g_autoptr (StowCluster) w = spec_ok ("2x4090", 1, 2, "RTX-4090");
  g_assert_cmpstr (w->node.name, ==, "workstation");
  /* A partial node keeps its GPUs' NVLink domain inside the node. */
  g_autoptr (StowCluster) p = spec_ok ("4xH100", 1, 4, "H100-SXM");
  g_assert_cmpuint (p->node.gpu.nvlink_domain, ==, 4);
  g_autoptr (StowCluster) p2 = spec_ok ("2x4xA100", 2, 4, "A100-80GB");
  g_assert_cmpuint (p2->node.gpu.nvlink_domain, ==, 4);

  /* Ref counting and the JSON view. */
  StowCluster *r = stow_cluster_ref (h);
  stow_cluster_unref (r);
  g_autoptr (JsonNode) j = stow_cluster_to_json (h);
  JsonObject *o = json_node_get_object (j);
  g_assert_cmpint (json_object_get_int_member (o, "n_gpus"), ==, 64);
  JsonObject *node = json_object_get_object_member (o, "node");
  JsonObject *g = json_object_get_object_member (node, "gpu");
  g_assert_cmpfloat (json_object_get_double_member (g, "bf16_flops"), ==,
                     989e12);
}

static void
spec_bad (const char *spec, gint code, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCluster) c = stow_cluster_new_from_spec (spec, &error);
  g_assert_null (c);
  g_assert_error (error, STOW_HW_ERROR, code);
  g_autofree char *prefix = g_strdup_printf ("--gpus \"%s\": ", spec);
  if (!g_str_has_prefix (error->message, prefix)
      || !strstr (error->message, fragment))
    g_error ("spec \"%s\": unexpected message: %s", spec, error->message);
}

static void
test_spec_errors (void)
{
  spec_bad ("", STOW_HW_ERROR_INVALID, "empty GPU spec");
  spec_bad ("   ", STOW_HW_ERROR_INVALID, "empty GPU spec");
  spec_bad ("0xA100", STOW_HW_ERROR_INVALID, "positive integer, got 0");
  spec_bad ("4x0xH100", STOW_HW_ERROR_INVALID, "positive integer, got 0");
  spec_bad ("-8xA100", STOW_HW_ERROR_INVALID, "positive integer");
  spec_bad ("8x", STOW_HW_ERROR_INVALID, "missing the GPU name");
  spec_bad ("2x8x", STOW_HW_ERROR_INVALID, "missing the GPU name");
  spec_bad ("2x2x2xH100", STOW_HW_ERROR_INVALID, "too many counts");
  spec_bad ("%$#@", STOW_HW_ERROR_NOT_FOUND, "unknown GPU \"%$#@\"");
  spec_bad ("8xA100-80G", STOW_HW_ERROR_NOT_FOUND,
            "unknown GPU \"A100-80G\" (did you mean A100-80GB?)");
  spec_bad ("8xH10O", STOW_HW_ERROR_NOT_FOUND, "did you mean H100-SXM?");
  spec_bad ("99999999999999999999xA100", STOW_HW_ERROR_INVALID,
            "count 99999999999999999999 is too large");
  spec_bad ("4294967297xA100", STOW_HW_ERROR_INVALID, "too large");
  spec_bad ("1000000x8xA100", STOW_HW_ERROR_INVALID,
            "1000000 x 8 GPUs is too many");
  spec_bad ("12xH100-SXM", STOW_HW_ERROR_INVALID,
            "12 GPUs is not a multiple of the 8 GPUs in a dgx-h100 node "
            "(hint: 8xH100-SXM or 16xH100-SXM");
  spec_bad ("6x4090", STOW_HW_ERROR_INVALID, "not a multiple of the 4 GPUs");
  spec_bad ("2x16xH100", STOW_HW_ERROR_INVALID,
            "16 GPUs per node, but a dgx-h100 node holds at most 8");
}

/* Random specs built from the characters specs are made of: never a crash,
 * and every failure names the input. */
static void
test_spec_fuzz (void)
{
  static const char alphabet[] = "0123456789xX-AHBVLMIRTSPCGe8 _.%";
  GRand *rand = g_rand_new_with_seed (20260422);
  for (int i = 0; i < 3000; i++)
    {
      char buf[24];
      int len = g_rand_int_range (rand, 0, sizeof buf);
      for (int k = 0; k < len; k++)
        buf[k] = alphabet[g_rand_int_range (rand, 0, sizeof alphabet - 1)];
      buf[len] = '\0';
      if (g_rand_int_range (rand, 0, 4) == 0 && len > 2)
        buf[g_rand_int_range (rand, 0, len)]
            = (char)g_rand_int_range (rand, 1, 256);
      g_autofree char *trimmed = g_strstrip (g_strdup (buf));
      if (g_ascii_strcasecmp (trimmed, "local") == 0)
        continue;
      GError *error = NULL;
      StowCluster *c = stow_cluster_new_from_spec (buf, &error);
      if (c)
        {
          g_assert_no_error (error);
          g_assert_cmpuint (c->n_gpus, ==, c->n_nodes * c->node.gpus_per_node);
          g_assert_cmpuint (c->n_gpus, >, 0);
          stow_cluster_unref (c);
          continue;
        }
      g_assert_nonnull (error);
      g_autofree char *prefix = g_strdup_printf ("--gpus \"%s\": ", buf);
      g_assert_true (g_str_has_prefix (error->message, prefix));
      g_error_free (error);
    }
  g_rand_free (rand);
}

/* ---- cluster.json ------------------------------------------------------- */

static char *
fixture (const char *name)
{
  return g_test_build_filename (G_TEST_DIST, "data", "cluster", name, NULL);
}

static StowCluster *
file_ok (const char *name)
{
  g_autofree char *path = fixture (name);
  g_autoptr (GError) error = NULL;
  StowCluster *c = stow_cluster_new_from_file (path, &error);
  g_assert_no_error (error);
  g_assert_nonnull (c);
  return c;
}

static void
test_file_valid (void)
{
  g_autoptr (StowCluster) c = file_ok ("dgx-h100-overrides.json");
  g_assert_cmpuint (c->n_nodes, ==, 4);
  g_assert_cmpuint (c->n_gpus, ==, 32);
  g_assert_cmpstr (c->node.gpu.name, ==, "H100-SXM");
  g_assert_cmpuint (c->node.host_ram_bytes, ==, 1024 * GiB);
  g_assert_cmpfloat (c->node.host_mem_bw, ==, 350e9);
  g_assert_cmpuint (c->node.n_nvme, ==, 2);
  g_assert_cmpstr (c->node.nvme[0].path, ==, "/mnt/nvme0");
  g_assert_cmpstr (c->node.nvme[1].path, ==, "/mnt/nvme1");
  g_assert_cmpuint (c->node.nvme[1].capacity_bytes, ==, 3840000000000);
  g_assert_cmpfloat (c->node.nvme[0].read_bw, ==, 6.8e9);
  g_assert_cmpfloat (c->node.nvme[1].write_bw, ==, 4e9);
  g_assert_cmpfloat (c->node.net_bw_per_gpu, ==, 25e9);
  g_assert_cmpfloat_with_epsilon (c->node.net_latency_s, 3e-6, 1e-12);
  /* Untouched preset values stay. */
  g_assert_cmpuint (c->node.cpu_cores, ==, 112);

  g_autoptr (StowCluster) u = file_ok ("custom-gpu.json");
  g_assert_cmpstr (u->node.gpu.name, ==, "custom");
  g_assert_cmpuint (u->node.gpu.total_bytes, ==, 94 * GiB);
  g_assert_cmpfloat (u->node.gpu.bf16_flops, ==, 835e12);
  g_assert_cmpfloat (u->node.gpu.hbm_bw, ==, 3.9e12);
  g_assert_cmpuint (u->n_gpus, ==, 8);

  g_autoptr (StowCluster) o = file_ok ("gpu-with-override.json");
  g_assert_cmpstr (o->node.gpu.name, ==, "A100-80GB");
  g_assert_cmpuint (o->node.gpu.total_bytes, ==, 80000 * MiB);
  g_assert_cmpfloat (o->node.gpu.bf16_flops, ==, 312e12);
  g_assert_cmpstr (o->node.name, ==, "custom");
  g_assert_cmpuint (o->n_gpus, ==, 16);

  /* A probe profile (relative to the cluster file) replaces the preset's
   * host numbers with measured ones. */
  g_autoptr (StowCluster) p = file_ok ("with-profile.json");
  g_assert_cmpfloat (p->node.host_mem_bw, ==, 61.5e9);
  g_assert_cmpuint (p->node.cpu_cores, ==, 16);
  g_assert_cmpuint (p->node.host_ram_bytes, ==, 128 * GiB);
  g_assert_cmpuint (p->n_gpus, ==, 2);
  g_assert_nonnull (p->node.profile);
}

static void
file_bad (const char *name, const char *fragment)
{
  g_autofree char *path = fixture (name);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCluster) c = stow_cluster_new_from_file (path, &error);
  g_assert_null (c);
  g_assert_nonnull (error);
  if (!g_str_has_prefix (error->message, path)
      || !strstr (error->message, fragment))
    g_error ("%s: unexpected message: %s", name, error->message);
}

static void
test_file_errors (void)
{
  file_bad ("bad-not-json.json", "bad-not-json.json:");
  file_bad ("bad-not-object.json", "expected a JSON object");
  file_bad ("bad-nodes-negative.json",
            ": nodes: expected a positive integer, got -1");
  file_bad ("bad-host-ram-type.json", ": host_ram: expected a size");
  file_bad ("bad-host-ram-unit.json", ": host_ram: ");
  file_bad ("bad-unknown-preset.json",
            ": preset: unknown node preset \"dgx-h1OO\" (did you mean "
            "dgx-h100?)");
  file_bad ("bad-unknown-field.json",
            ": unknown field \"nodez\" (did you mean nodes?)");
  file_bad ("bad-unknown-gpu.json",
            ": gpu: unknown GPU \"H100-SXN\" (did you mean H100-SXM?)");
  file_bad ("bad-nvme-bandwidth.json", ": nvme[0]: read_bw: ");
  file_bad ("bad-network.json", ": network: per_gpu: ");
  file_bad ("bad-no-gpu.json", "expected \"preset\"");
  file_bad ("bad-gpus-per-node.json",
            ": gpus_per_node: expected a positive integer, got 2.5");
  file_bad ("does-not-exist.json", "does-not-exist.json");
}

/* Issue 24, item 3: a GPU given by its two required fields only used to
 * plan with HBM 0 GB/s and PCIe Gen0 0 GB/s, and the step time was NaN.
 * The rates left out take documented defaults, recorded as such; rates
 * that cannot be planned on are refused by name. */
static StowCluster *
cluster_text (const char *text, GError **error)
{
  g_autoptr (JsonNode) root = stow_json_parse_data (text, -1, "F", NULL);
  g_assert_nonnull (root);
  return stow_cluster_new_from_json (json_node_get_object (root), "F", error);
}

static void
test_file_defaults (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCluster) c = cluster_text (
      "{\"preset\":\"workstation\",\"nodes\":1,\"gpus_per_node\":1,"
      "\"gpu\":{\"total_memory\":\"47.5GiB\",\"bf16_tflops\":154.8},"
      "\"host_ram\":\"128GiB\"}",
      &error);
  g_assert_no_error (error);
  const StowGpu *g = &c->node.gpu;
  g_assert_cmpfloat_with_epsilon (g->fp16_flops, 154.8e12, 1);
  g_assert_cmpfloat_with_epsilon (g->hbm_bw, 154.8e12 / 200, 1);
  g_assert_cmpuint (g->pcie_gen, ==, 4);
  g_assert_cmpfloat (g->pcie_bw, ==, 25e9);
  g_assert_cmpuint (g->defaulted, ==,
                    STOW_GPU_DEFAULT_FP16 | STOW_GPU_DEFAULT_HBM
                        | STOW_GPU_DEFAULT_PCIE_GEN | STOW_GPU_DEFAULT_PCIE_BW);

  /* A generation given: its practical rate. */
  g_autoptr (StowCluster) c5 = cluster_text (
      "{\"gpu\":{\"total_memory\":\"94GiB\",\"bf16_tflops\":800,"
      "\"fp16_tflops\":700,\"pcie_gen\":5}}",
      &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (c5->node.gpu.pcie_bw, ==, 50e9);
  g_assert_cmpfloat (c5->node.gpu.fp16_flops, ==, 700e12);
  g_assert_cmpuint (c5->node.gpu.defaulted, ==,
                    STOW_GPU_DEFAULT_HBM | STOW_GPU_DEFAULT_PCIE_BW);

  /* Catalog GPUs and the rates a file gives are nobody's default. */
  gsize n;
  const StowGpu *const *cat = stow_gpu_catalog (&n);
  for (gsize i = 0; i < n; i++)
    {
      g_autofree char *spec = g_strdup_printf ("1x%s", cat[i]->name);
      g_autoptr (StowCluster) k = stow_cluster_new_from_spec (spec, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (k->node.gpu.defaulted, ==, 0);
    }

  static const struct
  {
    const char *gpu, *message;
  } bad[] = {
    { "{\"total_memory\":\"48GiB\",\"bf16_tflops\":0}",
      "F: gpu: bf16_tflops: expected a positive number of TFLOP/s, got 0" },
    { "{\"total_memory\":\"48GiB\",\"bf16_tflops\":100,"
      "\"fp16_tflops\":1e30}",
      "F: gpu: fp16_tflops: 1e+30 is too large (at most 1000000 TFLOP/s)" },
    { "{\"total_memory\":\"48GiB\",\"bf16_tflops\":100,"
      "\"hbm_bw\":\"5000TB/s\"}",
      "F: gpu: hbm_bw: \"5000TB/s\" is too large (at most 1 PB/s)" },
    { "{\"name\":\"A100-80GB\",\"bf16_tflops\":0,\"fp16_tflops\":0}",
      "F: gpu: bf16_tflops and fp16_tflops are both 0; give the GPU's "
      "dense bf16 (or fp16) rate" },
    { "{\"total_memory\":1e30,\"bf16_tflops\":100}",
      "F: gpu: total_memory: 1e+30 is too large (at most 1 EiB)" },
    /* Found by tests/test-fuzz.c: a positive rate so small that the step
     * time came out infinite. */
    { "{\"total_memory\":\"94GiB\",\"bf16_tflops\":1e-320}",
      "F: gpu: bf16_tflops: 9.99989e-321 is too small (at least 0.001 "
      "TFLOP/s, or 0 for none)" },
    { "{\"total_memory\":\"94GiB\",\"bf16_tflops\":100,"
      "\"pcie_bw\":1e-300}",
      "F: gpu: pcie_bw: 1e-300 is too small (at least 1 MB/s)" },
    /* and a GPU refused after some of it was read is freed (ASan) */
    { "{\"name\":\"A100-80GB\",\"hbm_bw\":-1}",
      "F: gpu: hbm_bw: expected a bandwidth such as \"25GB/s\" or a positive "
      "number of bytes/s, got -1" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autofree char *text = g_strdup_printf ("{\"gpu\": %s}", bad[i].gpu);
      g_autoptr (StowCluster) x = cluster_text (text, &error);
      g_assert_null (x);
      g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
      g_assert_cmpstr (error->message, ==, bad[i].message);
      g_clear_error (&error);
    }
}

/* Mutated cluster files: a byte replaced, removed or a value swapped for
 * another JSON value.  Never a crash; every failure names the file. */
static void
test_file_fuzz (void)
{
  static const char *const values[]
      = { "-1",         "0",   "1e400",   "\"\"", "\"2TiB\"",
          "[]",         "{}",  "null",    "true", "18446744073709551616",
          "\"-5GB/s\"", "3.5", "\"h100\"" };
  g_autofree char *path = fixture ("dgx-h100-overrides.json");
  g_autofree char *orig = NULL;
  gsize len;
  g_assert_true (g_file_get_contents (path, &orig, &len, NULL));
  GRand *rand = g_rand_new_with_seed (7);
  for (int i = 0; i < 1500; i++)
    {
      GString *s = g_string_new (orig);
      int kind = g_rand_int_range (rand, 0, 3);
      gsize at = (gsize)g_rand_int_range (rand, 0, (gint32)s->len);
      if (kind == 0)
        s->str[at] = (char)g_rand_int_range (rand, 32, 127);
      else if (kind == 1)
        g_string_erase (s, (gssize)at, 1);
      else
        {
          /* Replace the value after a colon. */
          const char *colon = strchr (s->str + at, ':');
          if (colon)
            {
              gsize from = (gsize)(colon - s->str) + 1, to = from;
              while (to < s->len && s->str[to] != ',' && s->str[to] != '}'
                     && s->str[to] != '\n')
                to++;
              g_string_erase (s, (gssize)from, (gssize)(to - from));
              g_string_insert (
                  s, (gssize)from,
                  values[g_rand_int_range (rand, 0, G_N_ELEMENTS (values))]);
            }
        }
      GError *error = NULL;
      JsonNode *root
          = stow_json_parse_data (s->str, (gssize)s->len, "fuzz.json", &error);
      JsonObject *obj
          = root ? stow_json_root_object (root, "fuzz.json", &error) : NULL;
      StowCluster *c
          = obj ? stow_cluster_new_from_json (obj, "fuzz.json", &error) : NULL;
      if (c)
        {
          g_assert_no_error (error);
          g_assert_cmpuint (c->n_gpus, >, 0);
          stow_cluster_unref (c);
        }
      else
        {
          g_assert_nonnull (error);
          if (!g_str_has_prefix (error->message, "fuzz.json"))
            g_error ("message does not name the file: %s", error->message);
          if (g_test_verbose ())
            g_test_message ("%s", error->message);
          g_error_free (error);
        }
      if (root)
        json_node_unref (root);
      g_string_free (s, TRUE);
    }
  g_rand_free (rand);
}

/* ---- discovery on injected topologies ----------------------------------- */

static void
test_synthetic (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m
      = stow_machine_new_from_synthetic ("pack:2 numa:2 core:8 pu:2", &error);
  g_assert_no_error (error);
  g_assert_cmpuint (m->sockets, ==, 2);
  g_assert_cmpuint (m->numa_nodes, ==, 4);
  g_assert_cmpuint (m->cores, ==, 32);
  g_assert_cmpuint (m->pus, ==, 64);
  g_assert_cmpuint (m->numa->len, ==, 4);
  for (guint i = 0; i < m->numa->len; i++)
    {
      StowNumaInfo *n = &g_array_index (m->numa, StowNumaInfo, i);
      g_assert_cmpuint (n->cores, ==, 8);
      g_assert_cmpuint (n->pus, ==, 16);
    }
  g_assert_cmpuint (m->gpus->len, ==, 0);
  g_assert_nonnull (m->gpu_status);

  g_autoptr (StowMachine) c = stow_machine_new_from_synthetic (
      "pack:1 [numa(memory=68719476736)] l3:1(size=33554432) "
      "l2:4(size=1048576) core:1 pu:2",
      &error);
  g_assert_no_error (error);
  g_assert_cmpuint (c->ram_bytes, ==, 64 * GiB);
  g_assert_cmpuint (c->cores, ==, 4);
  g_assert_cmpuint (c->caches->len, ==, 2);
  StowCacheInfo *l2 = &g_array_index (c->caches, StowCacheInfo, 0);
  StowCacheInfo *l3 = &g_array_index (c->caches, StowCacheInfo, 1);
  g_assert_cmpuint (l2->level, ==, 2);
  g_assert_cmpuint (l2->count, ==, 4);
  g_assert_cmpuint (l2->size_bytes, ==, 1 << 20);
  g_assert_cmpuint (l3->level, ==, 3);
  g_assert_cmpuint (l3->size_bytes, ==, 32 << 20);

  /* No GPU: planning for "this machine" is an error that says why. */
  g_autoptr (StowCluster) none = stow_cluster_new_from_machine (m, &error);
  g_assert_null (none);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND);
  g_assert_nonnull (strstr (error->message, "no GPU"));
  g_clear_error (&error);

  g_autoptr (StowMachine) bad
      = stow_machine_new_from_synthetic ("pack:two core:x", &error);
  g_assert_null (bad);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "\"pack:two core:x\""));
}

static void
test_xml (void)
{
  g_autofree char *path = g_test_build_filename (
      G_TEST_DIST, "data", "topology", "dgx-h100-like.xml", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m = stow_machine_new_from_xml (path, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (m->sockets, ==, 2);
  g_assert_cmpuint (m->numa_nodes, ==, 2);
  g_assert_cmpuint (m->cores, ==, 8);
  g_assert_cmpuint (m->pus, ==, 16);
  g_assert_cmpuint (m->ram_bytes, ==, 512 * GiB);
  g_assert_nonnull (strstr (m->cpu_model, "8480C"));

  /* Eight H100s, four per socket; the BMC's VGA and the NVMe are not. */
  g_assert_cmpuint (m->gpus->len, ==, 8);
  for (guint i = 0; i < 8; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      g_assert_cmpstr (g->name, ==, "NVIDIA H100 80GB HBM3");
      g_assert_true (g->catalog == gpu ("H100-SXM"));
      g_assert_cmpuint (g->total_bytes, ==, 81090 * MiB);
      g_assert_cmpint (g->numa_node, ==, i < 4 ? 0 : 1);
      g_assert_cmpfloat_with_epsilon (g->link_bw, 63.015385e9, 1e4);
      g_assert_cmpuint (g->vendor_id, ==, 0x10de);
      g_assert_cmpstr (g->source, ==, "hwloc-cuda");
    }
  g_assert_cmpstr (g_array_index (m->gpus, StowLocalGpu, 4).pci_busid, ==,
                   "0000:98:00.0");

  /* "--gpus local" on that machine: one node of 8 H100s with the
   * measured memory and the machine's host side. */
  g_autoptr (StowCluster) c = stow_cluster_new_from_machine (m, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (c->n_nodes, ==, 1);
  g_assert_cmpuint (c->n_gpus, ==, 8);
  g_assert_cmpstr (c->node.gpu.name, ==, "H100-SXM");
  g_assert_cmpuint (c->node.gpu.total_bytes, ==, 81090 * MiB);
  g_assert_cmpuint (c->node.host_ram_bytes, ==, 512 * GiB);
  g_assert_cmpuint (c->node.cpu_cores, ==, 8);
  g_assert_cmpuint (c->node.numa_nodes, ==, 2);

  g_autoptr (JsonNode) j = stow_machine_to_json (m);
  JsonObject *o = json_node_get_object (j);
  g_assert_cmpuint (
      json_array_get_length (json_object_get_array_member (o, "gpus")), ==, 8);

  g_autoptr (StowMachine) missing
      = stow_machine_new_from_xml ("/nonexistent/topology.xml", &error);
  g_assert_null (missing);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "/nonexistent/topology.xml"));
}

static void
test_xml_malformed (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-hw-XXXXXX", NULL);
  g_autofree char *path = g_build_filename (dir, "bad.xml", NULL);
  g_assert_true (g_file_set_contents (path, "<topology><object", -1, NULL));
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m = stow_machine_new_from_xml (path, &error);
  g_assert_null (m);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, path));
  g_unlink (path);
  g_rmdir (dir);
}

/* ---- sysfs, paths, CUDA ------------------------------------------------- */

static void
write_file (const char *root, const char *rel, const char *text)
{
  g_autofree char *path = g_build_filename (root, rel, NULL);
  g_autofree char *dir = g_path_get_dirname (path);
  g_assert_cmpint (g_mkdir_with_parents (dir, 0755), ==, 0);
  g_assert_true (g_file_set_contents (path, text, -1, NULL));
}

static void
rm_rf (const char *path)
{
  GDir *d = g_dir_open (path, 0, NULL);
  if (d)
    {
      const char *n;
      while ((n = g_dir_read_name (d)))
        {
          g_autofree char *c = g_build_filename (path, n, NULL);
          rm_rf (c);
        }
      g_dir_close (d);
      g_rmdir (path);
    }
  else
    g_unlink (path);
}

static void
test_block_devices (void)
{
  g_autofree char *root = g_dir_make_tmp ("stow-sysfs-XXXXXX", NULL);
  /* 3.84 TB drive: 7500000000 sectors of 512 bytes. */
  write_file (root, "block/nvme0n1/size", "7500000000\n");
  write_file (root, "block/nvme0n1/queue/rotational", "0\n");
  write_file (root, "block/nvme0n1/device/model",
              "SAMSUNG MZWLR3T8HBLS-00007              \n");
  write_file (root, "block/sda/size", "1953525168\n");
  write_file (root, "block/sda/queue/rotational", "1\n");
  write_file (root, "block/loop0/size", "0\n");

  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m
      = stow_machine_new_from_synthetic ("pack:1 numa:1 core:2 pu:2", &error);
  g_assert_no_error (error);
  g_assert_true (stow_machine_scan_block_devices (m, root, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (m->blocks->len, ==, 2);
  StowBlockDevice *n = &g_array_index (m->blocks, StowBlockDevice, 0);
  StowBlockDevice *s = &g_array_index (m->blocks, StowBlockDevice, 1);
  g_assert_cmpstr (n->name, ==, "nvme0n1");
  g_assert_cmpuint (n->size_bytes, ==, 3840000000000);
  g_assert_false (n->rotational);
  g_assert_cmpstr (n->model, ==, "SAMSUNG MZWLR3T8HBLS-00007");
  g_assert_cmpstr (s->name, ==, "sda");
  g_assert_true (s->rotational);
  g_assert_null (s->model);

  g_autofree char *none = g_build_filename (root, "nothing", NULL);
  g_assert_false (stow_machine_scan_block_devices (m, none, &error));
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
  rm_rf (root);
}

static void
test_path_info (void)
{
  g_autofree char *dir = g_dir_make_tmp ("stow-path-XXXXXX", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowPathInfo) info = stow_path_info_new (dir, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (info->total_bytes, >, 0);
  g_assert_cmpuint (info->free_bytes, <=, info->total_bytes);
  g_assert_nonnull (info->fs_type);
  g_assert_cmpstr (info->path, ==, dir);

  g_autofree char *file = g_build_filename (dir, "f", NULL);
  g_assert_true (g_file_set_contents (file, "x", 1, NULL));
  g_autoptr (StowPathInfo) f = stow_path_info_new (file, &error);
  g_assert_null (f);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);
  g_assert_nonnull (strstr (error->message, "not a directory"));
  g_clear_error (&error);
  g_autoptr (StowPathInfo) m = stow_path_info_new ("/nonexistent/dir", &error);
  g_assert_null (m);
  g_assert_nonnull (strstr (error->message, "/nonexistent/dir"));
  g_unlink (file);
  g_rmdir (dir);
}

static void
test_cuda_missing (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m
      = stow_machine_new_from_synthetic ("pack:1 numa:1 core:2 pu:2", &error);
  g_autofree char *reason = NULL;
  g_assert_false (
      stow_machine_add_cuda (m, "/nonexistent/libcuda.so.1", &reason));
  g_assert_nonnull (strstr (reason, "/nonexistent/libcuda.so.1"));
  g_assert_cmpuint (m->gpus->len, ==, 0);
  g_clear_pointer (&reason, g_free);
  /* A library that is not a CUDA driver. */
  g_assert_false (stow_machine_add_cuda (m, "libm.so.6", &reason));
  g_assert_nonnull (strstr (reason, "not a CUDA driver"));
}

/* The dlopen path against tests/test-hw-fakecuda.c: two "H100s" at the
 * PCI addresses of the XML's first socket get that socket's NUMA node and
 * link from the topology. */
static void
test_cuda_fake (void)
{
  const char *lib = g_getenv ("STOW_FAKE_CUDA");
  if (lib == NULL)
    {
      g_test_skip ("STOW_FAKE_CUDA is not set (run through meson test)");
      return;
    }
  g_autofree char *path = g_test_build_filename (
      G_TEST_DIST, "data", "topology", "dgx-h100-like.xml", NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m = stow_machine_new_from_xml (path, &error);
  g_assert_no_error (error);
  g_autofree char *reason = NULL;
  g_setenv ("STOW_FAKE_CUDA_DEVICES", "2", TRUE);
  g_assert_true (stow_machine_add_cuda (m, lib, &reason));
  g_assert_null (reason);
  g_assert_cmpstr (m->cuda_driver, ==, "12.4");
  g_assert_null (m->gpu_status);
  /* CUDA's list replaces hwloc's NVIDIA devices. */
  g_assert_cmpuint (m->gpus->len, ==, 2);
  for (guint i = 0; i < 2; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      g_assert_cmpuint (g->index, ==, i);
      g_assert_cmpstr (g->source, ==, "cuda");
      g_assert_cmpstr (g->name, ==, "NVIDIA H100 80GB HBM3");
      g_assert_true (g->catalog == gpu ("H100-SXM"));
      g_assert_cmpuint (g->total_bytes, ==, 81090 * MiB);
      g_assert_cmpuint (g->cc_major, ==, 9);
      g_assert_cmpint (g->numa_node, ==, 0);
      g_assert_cmpfloat_with_epsilon (g->link_bw, 63.015385e9, 1e4);
    }
  g_assert_cmpstr (g_array_index (m->gpus, StowLocalGpu, 1).pci_busid, ==,
                   "0000:1a:00.0");

  g_autoptr (StowCluster) c = stow_cluster_new_from_machine (m, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (c->n_gpus, ==, 2);
  g_assert_cmpuint (c->node.gpu.nvlink_domain, ==, 2);

  /* No device: the driver's own words come back as the reason. */
  g_setenv ("STOW_FAKE_CUDA_DEVICES", "0", TRUE);
  g_autoptr (StowMachine) m2 = stow_machine_new_from_xml (path, &error);
  g_assert_false (stow_machine_add_cuda (m2, lib, &reason));
  g_assert_cmpstr (reason, ==,
                   "no CUDA-capable device is detected (CUDA error 100)");
  g_assert_cmpuint (m2->gpus->len, ==, 8);
  g_unsetenv ("STOW_FAKE_CUDA_DEVICES");
}

/* On a machine with a GPU and its driver: what CUDA says must match the
 * catalog's torch total within 1%; skipped elsewhere. */
static void
test_cuda_real (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m
      = stow_machine_new_from_synthetic ("pack:1 numa:1 core:2 pu:2", &error);
  g_autofree char *reason = NULL;
  if (!stow_machine_add_cuda (m, NULL, &reason))
    {
      g_autofree char *msg = g_strdup_printf ("no CUDA GPU: %s", reason);
      g_test_skip (msg);
      return;
    }
  g_assert_cmpuint (m->gpus->len, >, 0);
  for (guint i = 0; i < m->gpus->len; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      g_test_message ("GPU %u: %s, %" G_GUINT64_FORMAT " bytes, %s", i, g->name,
                      g->total_bytes, g->pci_busid);
      g_assert_cmpuint (g->total_bytes, >, 0);
      g_assert_nonnull (g->pci_busid);
      g_assert_cmpuint (g->cc_major, >, 0);
      if (g->catalog)
        {
          double ratio = (double)g->total_bytes / g->catalog->total_bytes;
          g_assert_cmpfloat (ratio, >, 0.99);
          g_assert_cmpfloat (ratio, <, 1.01);
        }
    }
}

/* ---- probe and profiles ------------------------------------------------- */

static void
test_probe (void)
{
  StowMemProbe p;
  g_autoptr (GError) error = NULL;
  /* Small arrays keep the test fast; the result is checked by the probe
   * itself (every element must be 7) and must be a physical number. */
  g_assert_true (stow_probe_host_memory (2, 8 << 20, 3, &p, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (p.threads, ==, 2);
  g_assert_cmpuint (p.array_bytes, ==, 8 << 20);
  g_assert_cmpfloat (p.best_s, >, 0);
  g_assert_cmpfloat (p.triad_bw, ==, 3.0 * (8 << 20) / p.best_s);
  g_assert_cmpfloat (p.triad_bw, >, 1e8);
  g_assert_cmpfloat (p.triad_bw, <, 1e13);

  g_assert_false (stow_probe_host_memory (4, 1024, 1, &p, &error));
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID);

  g_autoptr (StowMachine) m = stow_machine_new_from_synthetic (
      "pack:1 [numa(memory=68719476736)] l3:1(size=33554432) core:4 pu:2",
      NULL);
  /* 4x a 32 MiB L3 (STREAM's rule). */
  g_assert_cmpuint (stow_probe_default_array_bytes (m), ==, 128 << 20);
}

static void
test_profile_roundtrip (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m
      = stow_machine_new_from_synthetic ("pack:2 numa:1 core:6 pu:2", &error);
  g_assert_no_error (error);
  StowMemProbe p = { .triad_bw = 123.5e9,
                     .threads = 24,
                     .array_bytes = 1 << 28,
                     .repeats = 10,
                     .best_s = 0.01 };
  g_autoptr (JsonNode) j = stow_probe_profile_to_json (m, &p);
  g_autofree char *text = stow_json_to_string (j, TRUE);
  g_autofree char *dir = g_dir_make_tmp ("stow-profile-XXXXXX", NULL);
  g_autofree char *prof = g_build_filename (dir, "p.json", NULL);
  g_autofree char *clus = g_build_filename (dir, "c.json", NULL);
  g_assert_true (g_file_set_contents (prof, text, -1, NULL));
  g_assert_true (g_file_set_contents (
      clus, "{ \"gpu\": \"A100\", \"profile\": \"p.json\" }", -1, NULL));
  g_autoptr (StowCluster) c = stow_cluster_new_from_file (clus, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (c->node.host_mem_bw, ==, 123.5e9);
  g_assert_cmpuint (c->node.cpu_cores, ==, 12);
  g_assert_cmpuint (c->node.sockets, ==, 2);
  g_assert_cmpuint (c->node.numa_nodes, ==, 2);
  g_assert_cmpstr (c->node.gpu.name, ==, "A100-80GB");

  /* The profile alone as a cluster: it lists no GPU. */
  g_autoptr (StowCluster) none = stow_cluster_new_from_file (prof, &error);
  g_assert_null (none);
  g_assert_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND);
  g_assert_true (g_str_has_prefix (error->message, prof));
  g_assert_nonnull (strstr (error->message, "lists no GPU"));
  g_unlink (prof);
  g_unlink (clus);
  g_rmdir (dir);

  /* A saved profile of an 8-GPU server is a cluster by itself. */
  g_autoptr (StowCluster) h = file_ok ("profile-8xh100.json");
  g_assert_cmpuint (h->n_gpus, ==, 8);
  g_assert_cmpstr (h->node.gpu.name, ==, "H100-SXM");
  g_assert_cmpuint (h->node.gpu.total_bytes, ==, 81086 * MiB);
  g_assert_cmpfloat (h->node.host_mem_bw, ==, 421e9);
  g_assert_cmpuint (h->node.cpu_cores, ==, 112);
  g_assert_cmpfloat (h->node.net_bw_per_gpu, ==, 50e9); /* from dgx-h100 */

  /* The cluster file names the profile, the profile names its field. */
  file_bad ("bad-with-profile.json",
            ": profile: " /* the profile's own path follows */);
  file_bad ("bad-with-profile.json", "bad-profile-bandwidth.json: host: "
                                     "mem_bw_triad: expected a bandwidth");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/hw/catalog/reference", test_catalog_reference);
  g_test_add_func ("/hw/catalog/complete", test_catalog_complete);
  g_test_add_func ("/hw/catalog/presets", test_catalog_presets);
  g_test_add_func ("/hw/catalog/sourced", test_catalog_sourced);
  g_test_add_func ("/hw/catalog/lookup", test_lookup);
  g_test_add_func ("/hw/spec/valid", test_spec_valid);
  g_test_add_func ("/hw/spec/errors", test_spec_errors);
  g_test_add_func ("/hw/spec/fuzz", test_spec_fuzz);
  g_test_add_func ("/hw/file/valid", test_file_valid);
  g_test_add_func ("/hw/file/errors", test_file_errors);
  g_test_add_func ("/hw/file/defaults", test_file_defaults);
  g_test_add_func ("/hw/file/fuzz", test_file_fuzz);
  g_test_add_func ("/hw/machine/synthetic", test_synthetic);
  g_test_add_func ("/hw/machine/xml", test_xml);
  g_test_add_func ("/hw/machine/xml-malformed", test_xml_malformed);
  g_test_add_func ("/hw/machine/block-devices", test_block_devices);
  g_test_add_func ("/hw/machine/path", test_path_info);
  g_test_add_func ("/hw/machine/cuda-missing", test_cuda_missing);
  g_test_add_func ("/hw/machine/cuda-fake", test_cuda_fake);
  g_test_add_func ("/hw/machine/cuda-real", test_cuda_real);
  g_test_add_func ("/hw/probe/triad", test_probe);
  g_test_add_func ("/hw/probe/profile", test_profile_roundtrip);
  return g_test_run ();
}
