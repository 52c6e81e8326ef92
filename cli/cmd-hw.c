/* SPDX-License-Identifier: MIT
 *
 * cli/cmd-hw.c: `stowage hw` (this machine: CPUs, memory, GPUs, drives, the
 * NVMe path, the host pages the pinned pool gets) and `stowage gpus` (the
 * catalog, or what a --gpus spec or a
 * --cluster file resolves to).  Text for people, --json for programs.
 */
#include <stdio.h>
#include <string.h>

#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "core/json.h"
#include "core/units.h"
#include "hw/hw.h"
#include "hw/machine.h"
#include "offload/pinned.h"

/* What the pinned pool gets on this machine: the kernel's THP mode, the
 * hugetlb pages reserved, and the kind a small pool (two 2 MiB pages,
 * locked, so that its pages are in) was given. */
typedef struct
{
  const char *thp;
  StowHugePages asked;
  guint64 hugetlb_total, hugetlb_free, hugetlb_page_bytes;
  StowPageKind got;
  guint64 huge_bytes, probe_bytes;
  char *note;
} HostPages;

static guint64
meminfo_value (const char *text, const char *key)
{
  const char *p = text ? strstr (text, key) : NULL;
  return p ? g_ascii_strtoull (p + strlen (key), NULL, 10) : 0;
}

static void
probe_host_pages (StowHugePages asked, HostPages *out)
{
  memset (out, 0, sizeof *out);
  out->thp = stow_thp_mode ();
  out->asked = asked;
  g_autofree char *mi = NULL;
  g_file_get_contents ("/proc/meminfo", &mi, NULL, NULL);
  out->hugetlb_total = meminfo_value (mi, "HugePages_Total:");
  out->hugetlb_free = meminfo_value (mi, "HugePages_Free:");
  out->hugetlb_page_bytes = meminfo_value (mi, "Hugepagesize:") * 1024;
  out->probe_bytes = 4u << 20;
  StowPinnedOptions o = { .slab_bytes = out->probe_bytes,
                          .numa_node = -1,
                          .no_cuda = TRUE,
                          .huge_pages = asked };
  g_autoptr (StowPinnedPool) pool = stow_pinned_pool_new (&o);
  guint8 *p = stow_pinned_pool_alloc (pool, out->probe_bytes, NULL);
  if (p != NULL)
    memset (p, 0, out->probe_bytes); /* in, if mlock was refused */
  out->got = stow_pinned_pool_get_page_kind (pool, &out->huge_bytes);
  out->note = g_strdup (stow_pinned_pool_get_page_note (pool));
}

static void
print_host_pages (const HostPages *h)
{
  char b[STOW_FORMAT_BUF];
  printf ("Host pages: THP %s; hugetlb %" G_GUINT64_FORMAT
          " of %" G_GUINT64_FORMAT
          " reserved pages free (%s each); the pinned pool "
          "(--huge-pages %s) gets %s\n",
          h->thp, h->hugetlb_free, h->hugetlb_total,
          stow_format_bytes_into (b, sizeof b, h->hugetlb_page_bytes),
          stow_huge_pages_name (h->asked),
          h->got == STOW_PAGE_SMALL   ? "ordinary pages (small)"
          : h->got == STOW_PAGE_MIXED ? "some 2 MiB pages (mixed)"
          : h->got == STOW_PAGE_THP   ? "2 MiB pages (thp)"
                                      : "2 MiB pages (hugetlb)");
  if (h->note)
    printf ("  note: %s\n", h->note);
}

static void
host_pages_to_json (JsonObject *o, const HostPages *h)
{
  JsonObject *p = json_object_new ();
  json_object_set_string_member (p, "thp", h->thp);
  json_object_set_int_member (p, "hugetlb_total", (gint64)h->hugetlb_total);
  json_object_set_int_member (p, "hugetlb_free", (gint64)h->hugetlb_free);
  json_object_set_int_member (p, "hugetlb_page_bytes",
                              (gint64)h->hugetlb_page_bytes);
  json_object_set_string_member (p, "huge_pages",
                                 stow_huge_pages_name (h->asked));
  json_object_set_string_member (p, "page_kind", stow_page_kind_name (h->got));
  json_object_set_int_member (p, "huge_bytes", (gint64)h->huge_bytes);
  json_object_set_int_member (p, "probe_bytes", (gint64)h->probe_bytes);
  if (h->note)
    json_object_set_string_member (p, "note", h->note);
  json_object_set_object_member (o, "host_pages", p);
}

static void
print_machine (const StowMachine *m)
{
  char b1[STOW_FORMAT_BUF], b2[STOW_FORMAT_BUF];

  printf ("Machine: %s\n", m->hostname ? m->hostname : "(injected topology)");
  printf ("  CPU:    %s\n", m->cpu_model ? m->cpu_model : "unknown model");
  printf ("  Layout: %u socket%s, %u NUMA node%s, %u core%s, %u PU%s\n",
          m->sockets, m->sockets == 1 ? "" : "s", m->numa_nodes,
          m->numa_nodes == 1 ? "" : "s", m->cores, m->cores == 1 ? "" : "s",
          m->pus, m->pus == 1 ? "" : "s");
  printf ("  RAM:    %s\n",
          stow_format_bytes_into (b1, sizeof b1, m->ram_bytes));
  for (guint i = 0; i < m->numa->len; i++)
    {
      StowNumaInfo *n = &g_array_index (m->numa, StowNumaInfo, i);
      printf ("  NUMA node %u: %s, %u cores, %u PUs\n", n->os_index,
              stow_format_bytes_into (b1, sizeof b1, n->local_bytes), n->cores,
              n->pus);
    }
  if (m->caches->len)
    {
      printf ("  Caches:");
      for (guint i = 0; i < m->caches->len; i++)
        {
          StowCacheInfo *c = &g_array_index (m->caches, StowCacheInfo, i);
          const char *kind = g_str_equal (c->type, "data")          ? "d"
                             : g_str_equal (c->type, "instruction") ? "i"
                                                                    : "";
          printf ("%s L%u%s %s x%u", i ? "," : "", c->level, kind,
                  stow_format_bytes_into (b1, sizeof b1, c->size_bytes),
                  c->count);
        }
      printf ("\n");
    }

  if (m->gpus->len == 0)
    printf ("GPUs: none (%s)\n", m->gpu_status ? m->gpu_status : "unknown");
  else
    {
      printf ("GPUs: %u%s%s%s\n", m->gpus->len,
              m->cuda_driver ? " (CUDA driver " : "",
              m->cuda_driver ? m->cuda_driver : "", m->cuda_driver ? ")" : "");
      if (m->gpu_status)
        printf ("  note: %s\n", m->gpu_status);
      printf ("  %-3s %-28s %-15s %12s %5s %-12s %s\n", "#", "NAME", "CATALOG",
              "MEMORY", "NUMA", "PCI", "LINK");
      for (guint i = 0; i < m->gpus->len; i++)
        {
          StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
          g_autofree char *numa = g->numa_node >= 0
                                      ? g_strdup_printf ("%d", g->numa_node)
                                      : g_strdup ("?");
          g_autofree char *link = NULL;
          if (g->pcie_gen && g->pcie_width)
            link = g_strdup_printf ("Gen%u x%u", g->pcie_gen, g->pcie_width);
          else if (g->link_bw > 0)
            link = g_strdup_printf ("%.1f GB/s", g->link_bw / 1e9);
          else
            link = g_strdup ("?");
          printf ("  %-3u %-28s %-15s %12s %5s %-12s %s\n", g->index,
                  g->name ? g->name : "?",
                  g->catalog ? g->catalog->name : "(not in catalog)",
                  g->total_bytes
                      ? stow_format_bytes_into (b1, sizeof b1, g->total_bytes)
                      : "?",
                  numa, g->pci_busid ? g->pci_busid : "?", link);
        }
    }

  if (m->blocks->len)
    {
      printf ("Block devices:\n");
      for (guint i = 0; i < m->blocks->len; i++)
        {
          StowBlockDevice *d = &g_array_index (m->blocks, StowBlockDevice, i);
          printf ("  %-12s %12s  %-10s %s\n", d->name,
                  stow_format_bytes_into (b1, sizeof b1, d->size_bytes),
                  d->rotational ? "rotational" : "solid",
                  d->model ? d->model : "");
        }
    }
  if (m->path)
    printf ("NVMe path: %s: %s free of %s, %s on %s (mounted at %s)\n",
            m->path->path,
            stow_format_bytes_into (b1, sizeof b1, m->path->free_bytes),
            stow_format_bytes_into (b2, sizeof b2, m->path->total_bytes),
            m->path->fs_type ? m->path->fs_type : "?",
            m->path->source ? m->path->source : "?",
            m->path->mount_point ? m->path->mount_point : "?");
}

int
stow_cmd_hw (int argc, char **argv)
{
  gboolean json = FALSE;
  g_autofree char *nvme_path = NULL, *topology = NULL, *synthetic = NULL;
  g_autofree char *sysfs = NULL, *save = NULL, *probe_size = NULL;
  g_autofree char *huge = NULL;
  gboolean probe = FALSE;
  int threads = 0, repeats = 10;
  const GOptionEntry entries[] = {
    { "probe", 0, 0, G_OPTION_ARG_NONE, &probe,
      "Measure host memory bandwidth (STREAM-style triad on every thread)",
      NULL },
    { "save", 0, 0, G_OPTION_ARG_FILENAME, &save,
      "With --probe: write the profile JSON that cluster files can use",
      "FILE" },
    { "threads", 0, 0, G_OPTION_ARG_INT, &threads,
      "With --probe: threads to use (default: one per PU)", "N" },
    { "probe-size", 0, 0, G_OPTION_ARG_STRING, &probe_size,
      "With --probe: bytes per array (default: 4x the last-level caches, "
      "at least 64 MiB)",
      "SIZE" },
    { "repeats", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_INT, &repeats,
      "With --probe: passes, the best counts (default 10)", "N" },
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL },
    { "huge-pages", 0, 0, G_OPTION_ARG_STRING, &huge,
      "The pages to try for the pinned pool: auto (default), thp, hugetlb "
      "or off",
      "KIND" },
    { "nvme-path", 0, 0, G_OPTION_ARG_FILENAME, &nvme_path,
      "Report the free space and filesystem of DIR", "DIR" },
    { "topology", 0, 0, G_OPTION_ARG_FILENAME, &topology,
      "Describe the machine in an hwloc XML file instead of this one", "FILE" },
    { "synthetic", 0, 0, G_OPTION_ARG_STRING, &synthetic,
      "Describe a synthetic hwloc topology (\"pack:2 numa:2 core:8 pu:2\")",
      "DESC" },
    { "sysfs", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_FILENAME, &sysfs,
      "Read block devices from this sysfs tree (tests)", "DIR" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_context_new (
      "hw", NULL,
      "Describe this machine: sockets, NUMA nodes, cores, caches and RAM "
      "(hwloc), CUDA GPUs with their NUMA node and PCIe link, block devices, "
      "the free space of --nvme-path, and the host pages (THP, hugetlb) the "
      "pinned pool gets.  No GPU is a normal answer.");
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!stow_cli_parse (ctx, "hw", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_failf ("see 'stowage hw --help'",
                           "hw: unexpected argument \"%s\"", argv[1]);
  if (topology && synthetic)
    return stow_cli_failf (NULL, "hw: --topology and --synthetic exclude "
                                 "each other");
  if ((save || threads || probe_size) && !probe)
    return stow_cli_failf ("add --probe", "hw: --save, --threads and "
                                          "--probe-size go with --probe");
  if (probe && (topology || synthetic))
    return stow_cli_failf (NULL, "hw: --probe measures this machine; it "
                                 "does not go with --topology/--synthetic");
  if (threads < 0 || threads > 4096)
    return stow_cli_failf (NULL, "hw: --threads: expected 1 to 4096, got %d",
                           threads);
  if (repeats < 1 || repeats > 1000)
    return stow_cli_failf (NULL, "hw: --repeats: expected 1 to 1000, got %d",
                           repeats);
  StowHugePages asked = STOW_HUGE_PAGES_AUTO;
  if (huge && !stow_huge_pages_parse (huge, &asked))
    return stow_cli_failf ("kinds: auto, thp, hugetlb, off",
                           "hw: --huge-pages \"%s\": unknown kind", huge);
  guint64 array_bytes = 0;
  if (probe_size)
    {
      g_autoptr (GError) perr = NULL;
      if (!stow_parse_size (probe_size, &array_bytes, &perr))
        return stow_cli_failf (NULL, "hw: --probe-size: %s", perr->message);
    }

  g_autoptr (GError) error = NULL;
  g_autoptr (StowMachine) m = NULL;
  if (topology || synthetic)
    {
      m = topology ? stow_machine_new_from_xml (topology, &error)
                   : stow_machine_new_from_synthetic (synthetic, &error);
      if (m && nvme_path
          && (m->path = stow_path_info_new (nvme_path, &error)) == NULL)
        g_clear_pointer (&m, stow_machine_free);
      if (m && sysfs && !stow_machine_scan_block_devices (m, sysfs, &error))
        g_clear_pointer (&m, stow_machine_free);
    }
  else
    {
      StowDiscoverOptions opts
          = { .nvme_path = nvme_path, .sysfs_root = sysfs };
      m = stow_machine_discover (&opts, &error);
    }
  if (m == NULL)
    return stow_cli_fail (error, NULL);
  /* Pages are this machine's: not for a topology read from a file. */
  HostPages pages = { 0 };
  gboolean live = !topology && !synthetic;
  if (live)
    probe_host_pages (asked, &pages);

  StowMemProbe result = { 0 };
  if (probe)
    {
      guint n = threads > 0 ? (guint)threads : MAX (1u, m->pus);
      if (array_bytes == 0)
        array_bytes = stow_probe_default_array_bytes (m);
      if (!stow_probe_host_memory (n, array_bytes, (guint)repeats, &result,
                                   &error))
        return stow_cli_fail (error, NULL);
    }
  if (save)
    {
      g_autoptr (JsonNode) profile = stow_probe_profile_to_json (m, &result);
      g_autofree char *text = stow_json_to_string (profile, TRUE);
      if (!stow_file_write_atomic (save, text, -1, &error))
        return stow_cli_fail (error, NULL);
    }

  if (json)
    {
      JsonNode *node = stow_machine_to_json (m);
      if (probe)
        {
          JsonObject *o = json_node_get_object (node);
          JsonObject *p = json_object_new ();
          json_object_set_double_member (p, "mem_bw_triad", result.triad_bw);
          json_object_set_int_member (p, "threads", result.threads);
          json_object_set_int_member (p, "array_bytes",
                                      (gint64)result.array_bytes);
          json_object_set_int_member (p, "repeats", result.repeats);
          json_object_set_double_member (p, "best_s", result.best_s);
          json_object_set_object_member (o, "probe", p);
        }
      if (live)
        host_pages_to_json (json_node_get_object (node), &pages);
      stow_cli_print_json (node);
    }
  else
    {
      print_machine (m);
      if (live)
        print_host_pages (&pages);
      if (probe)
        {
          char b[STOW_FORMAT_BUF];
          printf ("Probe: host memory triad %.2f GB/s (%u thread%s, 3 x %s, "
                  "best of %u)\n",
                  result.triad_bw / 1e9, result.threads,
                  result.threads == 1 ? "" : "s",
                  stow_format_bytes_into (b, sizeof b, result.array_bytes),
                  result.repeats);
        }
      if (save)
        printf ("Profile written to %s\n", save);
    }
  g_free (pages.note);
  return STOW_EXIT_OK;
}

static void
print_cluster (GString *out, const StowCluster *c)
{
  char b1[STOW_FORMAT_BUF], b2[STOW_FORMAT_BUF];
  const StowNode *n = &c->node;
  g_string_append_printf (out, "Cluster \"%s\": %u node%s x %u GPU%s = %u %s\n",
                          c->spec, c->n_nodes, c->n_nodes == 1 ? "" : "s",
                          n->gpus_per_node, n->gpus_per_node == 1 ? "" : "s",
                          c->n_gpus, n->gpu.name);
  g_string_append_printf (
      out, "  Node: %s%s%s%s\n", n->name, n->description ? " (" : "",
      n->description ? n->description : "", n->description ? ")" : "");
  const StowGpu *g = &n->gpu;
  g_string_append_printf (
      out,
      "  GPU: %s, %s usable (torch total_memory), bf16 %.1f TFLOP/s, "
      "HBM %.0f GB/s%s\n",
      g->name, stow_format_bytes_into (b1, sizeof b1, g->total_bytes),
      g->bf16_flops / 1e12, g->hbm_bw / 1e9,
      g->defaulted & STOW_GPU_DEFAULT_HBM
          ? " (default: 5 GB/s per bf16 TFLOP/s; set hbm_bw)"
          : "");
  if (g->defaulted & STOW_GPU_DEFAULT_FP16)
    g_string_append_printf (out,
                            "  fp16: %.1f TFLOP/s (default: the bf16 rate; set "
                            "fp16_tflops)\n",
                            g->fp16_flops / 1e12);
  if (g->nvlink_bw > 0)
    g_string_append_printf (
        out, "  GPU link: %.1f GB/s per direction, domain of %u; ",
        g->nvlink_bw / 1e9, g->nvlink_domain);
  else
    g_string_append_printf (
        out, "  GPU link: none (GPUs exchange data over PCIe); ");
  g_string_append_printf (
      out, "PCIe Gen%u%s %.0f GB/s pinned%s\n", g->pcie_gen,
      g->defaulted & STOW_GPU_DEFAULT_PCIE_GEN ? " (default)" : "",
      g->pcie_bw / 1e9,
      g->defaulted & STOW_GPU_DEFAULT_PCIE_BW
          ? " (default for the generation; set pcie_bw)"
          : "");
  g_string_append_printf (
      out, "  Host: %s RAM, %.0f GB/s memory, %u cores, %u NUMA node%s%s%s\n",
      stow_format_bytes_into (b1, sizeof b1, n->host_ram_bytes),
      n->host_mem_bw / 1e9, n->cpu_cores, n->numa_nodes,
      n->numa_nodes == 1 ? "" : "s", n->profile ? ", measured in " : "",
      n->profile ? n->profile : "");
  for (guint i = 0; i < n->n_nvme; i++)
    g_string_append_printf (
        out, "  NVMe %u: %s%s%s, read %.1f GB/s, write %.1f GB/s\n", i,
        stow_format_bytes_into (b2, sizeof b2, n->nvme[i].capacity_bytes),
        n->nvme[i].path ? " at " : "", n->nvme[i].path ? n->nvme[i].path : "",
        n->nvme[i].read_bw / 1e9, n->nvme[i].write_bw / 1e9);
  g_string_append_printf (
      out, "  Network: %.2f GB/s per GPU per direction, %.1f us%s%s\n",
      n->net_bw_per_gpu / 1e9, n->net_latency_s * 1e6, n->net_kind ? "; " : "",
      n->net_kind ? n->net_kind : "");
}

int
stow_gpus_run (StowCliCall *call, int argc, char **argv)
{
  gboolean json = FALSE;
  g_autofree char *spec = NULL, *cluster_file = NULL;
  const GOptionEntry entries[] = {
    { "json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL },
    { "gpus", 0, 0, G_OPTION_ARG_STRING, &spec,
      "Show what a spec resolves to: 8xA100-80GB, 64xH100-SXM, 4x8xH200, "
      "local",
      "SPEC" },
    { "cluster", 0, 0, G_OPTION_ARG_FILENAME, &cluster_file,
      "Show what a cluster.json resolves to", "FILE" },
    { NULL },
  };
  g_autoptr (GOptionContext) ctx = stow_cli_call_context_new (
      call, "gpus", NULL,
      "List the GPU catalog and the node presets (memory is what torch's "
      "total_memory reports; TFLOP/s are dense), or resolve a --gpus spec "
      "or a --cluster file.");
  stow_cli_add_entries (call, ctx, entries);
  if (!stow_cli_call_parse (call, ctx, "gpus", &argc, &argv))
    return STOW_EXIT_FAILURE;
  if (argc > 1)
    return stow_cli_call_failf (call, "see 'stowage gpus --help'",
                                "gpus: unexpected argument \"%s\"", argv[1]);
  if (spec && cluster_file)
    return stow_cli_call_failf (call, NULL,
                                "gpus: --gpus and --cluster exclude each "
                                "other");
  g_autoptr (GString) out = g_string_new (NULL);

  if (spec || cluster_file)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (StowCluster) c
          = spec ? stow_cluster_new_from_spec (spec, &error)
                 : stow_cluster_new_from_file (cluster_file, &error);
      if (c == NULL)
        return stow_cli_call_fail (
            call, error,
            g_error_matches (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND)
                    && spec && g_ascii_strcasecmp (spec, "local") != 0
                ? "see 'stowage gpus' for the names"
                : NULL);
      if (json)
        return stow_cli_call_answer_json (call, stow_cluster_to_json (c),
                                          STOW_EXIT_OK);
      print_cluster (out, c);
      return stow_cli_call_answer (call, NULL, out->str, STOW_EXIT_OK);
    }

  gsize n_gpus, n_nodes;
  const StowGpu *const *gpus = stow_gpu_catalog (&n_gpus);
  const StowNode *const *nodes = stow_node_presets (&n_nodes);
  if (json)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "gpus");
      json_builder_begin_array (b);
      for (gsize i = 0; i < n_gpus; i++)
        json_builder_add_value (b, stow_gpu_to_json (gpus[i]));
      json_builder_end_array (b);
      json_builder_set_member_name (b, "nodes");
      json_builder_begin_array (b);
      for (gsize i = 0; i < n_nodes; i++)
        json_builder_add_value (b, stow_node_to_json (nodes[i]));
      json_builder_end_array (b);
      json_builder_end_object (b);
      return stow_cli_call_answer_json (call, json_builder_get_root (b),
                                        STOW_EXIT_OK);
    }

  g_string_append_printf (out, "%-15s %11s %9s %9s %9s %10s %10s %-6s %s\n",
                          "GPU", "MEMORY", "BF16 TF", "FP8 TF", "FP32 TF",
                          "HBM GB/s", "LINK GB/s", "PCIE", "PRESET");
  for (gsize i = 0; i < n_gpus; i++)
    {
      const StowGpu *g = gpus[i];
      g_autofree char *mem = stow_format_bytes (g->total_bytes);
      g_autofree char *pcie = g_strdup_printf ("Gen%u", g->pcie_gen);
      g_string_append_printf (
          out, "%-15s %11s %9.1f %9.1f %9.1f %10.0f %10.1f %-6s %s\n", g->name,
          mem, g->bf16_flops / 1e12, g->fp8_flops / 1e12, g->fp32_flops / 1e12,
          g->hbm_bw / 1e9, g->nvlink_bw / 1e9, pcie, g->preset);
    }
  g_string_append_printf (
      out, "\nMEMORY is torch's total_memory; TF are dense; LINK is NVLink "
           "(or bridge/fabric) per direction.\n\n");
  g_string_append_printf (out, "%-12s %-10s %5s %10s %9s %6s %-20s %s\n",
                          "PRESET", "GPU", "GPUS", "HOST RAM", "MEM GB/s",
                          "CORES", "NVME", "NETWORK/GPU");
  for (gsize i = 0; i < n_nodes; i++)
    {
      const StowNode *n = nodes[i];
      g_autofree char *ram = stow_format_bytes (n->host_ram_bytes);
      g_autofree char *nvme = NULL;
      if (n->n_nvme)
        {
          char cap[STOW_FORMAT_BUF];
          nvme = g_strdup_printf (
              "%ux %s", n->n_nvme,
              stow_format_bytes_into (cap, sizeof cap,
                                      n->nvme[0].capacity_bytes));
        }
      g_string_append_printf (
          out, "%-12s %-10s %5u %10s %9.0f %6u %-20s %.1f Gb/s\n", n->name,
          n->gpu.name, n->gpus_per_node, ram, n->host_mem_bw / 1e9,
          n->cpu_cores, nvme ? nvme : "none", n->net_bw_per_gpu * 8 / 1e9);
    }
  return stow_cli_call_answer (call, NULL, out->str, STOW_EXIT_OK);
}

int
stow_cmd_gpus (int argc, char **argv)
{
  return stow_gpus_run (NULL, argc, argv);
}
