/* SPDX-License-Identifier: MIT
 *
 * hw/hw.h: the hardware a plan runs on: GPUs, nodes (host RAM, CPU memory
 * bandwidth, NVMe drives, network) and clusters of identical nodes.  Built
 * from the catalog (hw/catalog/), from a spec such as "8xA100-80GB" or
 * "4x8xH200", from a cluster.json, or from the local machine.
 * Units: bytes, FLOP/s, bytes/s, seconds.
 */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define STOW_HW_ERROR (stow_hw_error_quark ())
GQuark stow_hw_error_quark (void);

typedef enum
{
  STOW_HW_ERROR_NOT_FOUND, /* unknown GPU or preset name */
  STOW_HW_ERROR_INVALID,   /* malformed spec or cluster file */
} StowHwError;

typedef struct
{
  char *name;              /* canonical: "A100-80GB", "H100-SXM" */
  char **aliases;          /* NULL-terminated */
  char *vendor;            /* "nvidia", "amd" */
  guint64 marketing_bytes; /* the "80GB" on the box, as bytes (80e9) */
  guint64 total_bytes;     /* what torch's total_memory reports */
  double bf16_flops;       /* dense tensor-core FLOP/s; 0 = unsupported */
  double fp16_flops;
  double fp32_flops; /* non-tensor fp32 */
  double tf32_flops;
  double fp8_flops;
  double hbm_bw;       /* bytes/s */
  double nvlink_bw;    /* per GPU, per direction, bytes/s; 0 = none */
  guint nvlink_domain; /* GPUs per NVLink domain (8 on HGX); 1 = none */
  guint pcie_gen;
  double pcie_bw; /* practical pinned host<->device, per direction */
  /* Added beside the planner's contract: */
  char *description; /* "NVIDIA H100 SXM5 80GB (HBM3)" */
  char *preset;      /* the node preset a bare spec uses ("dgx-h100") */
  guint64 smi_bytes; /* nvidia-smi memory.total; 0 = not published */
  guint defaulted;   /* STOW_GPU_DEFAULT_* bits: rates a cluster
                      * file left out, filled by stow_gpu_fill_defaults */
} StowGpu;

/* Which of a GPU's rates are stowage's defaults rather than given. */
enum
{
  STOW_GPU_DEFAULT_FP16 = 1 << 0,
  STOW_GPU_DEFAULT_HBM = 1 << 1,
  STOW_GPU_DEFAULT_PCIE_GEN = 1 << 2,
  STOW_GPU_DEFAULT_PCIE_BW = 1 << 3,
};

/* Defaults for a GPU described by its memory and bf16 rate alone
 * (docs/hardware.md, "Cluster files"): fp16 = bf16; HBM 5 GB/s per bf16
 * TFLOP/s (200 FLOP per byte, the median of the catalog, from the RTX-3090's
 * 76 to the L40S's 419); PCIe Gen4; a pinned copy rate by generation (Gen3
 * 12, Gen4 25, Gen5 50 GB/s per direction, doubling per generation).  Only
 * zero fields are filled, each recorded in @gpu->defaulted. */
void stow_gpu_fill_defaults (StowGpu *gpu);
/* The practical pinned host<->device rate of a PCIe generation, per
 * direction, bytes/s (1-7). */
double stow_pcie_practical_bw (guint gen);

typedef struct
{
  char *path; /* mount point or directory, NULL in presets */
  guint64 capacity_bytes;
  double read_bw; /* bytes/s, sequential at large blocks */
  double write_bw;
} StowNvme;

typedef struct
{
  char *name;  /* preset name ("dgx-a100") or "custom" */
  StowGpu gpu; /* every GPU of a node is this kind */
  guint gpus_per_node;
  guint64 host_ram_bytes;
  double host_mem_bw; /* bytes/s, STREAM-triad class, whole node */
  guint cpu_cores;    /* physical cores per node */
  guint numa_nodes;
  StowNvme *nvme; /* n_nvme drives */
  guint n_nvme;
  double net_bw_per_gpu; /* inter-node, per GPU, per direction, bytes/s */
  double net_latency_s;
  /* Added beside the planner's contract: */
  char *description; /* one line for tables */
  guint sockets;
  char *net_kind; /* "8x 400 Gb/s NDR InfiniBand" */
  char *profile;  /* the probe profile the host numbers came from */
} StowNode;

typedef struct _StowCluster StowCluster;
struct _StowCluster
{
  gint ref_count;
  char *spec; /* what the user typed, for messages */
  StowNode node;
  guint n_nodes;
  guint n_gpus; /* n_nodes * node.gpus_per_node */
  /* TRUE when the host RAM, or the NVMe drives, are a node preset's
   * guess rather than given (a bare --gpus spec, a cluster file without
   * them): reports say so, since offload answers depend on them. */
  gboolean host_ram_assumed, nvme_assumed;
};

/* The GPU catalog.  Lookup is case-insensitive over names and aliases;
 * unknown names fail with a did-you-mean hint. */
const StowGpu *stow_gpu_lookup (const char *name, GError **error);
/* The catalog entry for a device name as CUDA, NVML or ROCm report it
 * ("NVIDIA H100 80GB HBM3"); NULL when the catalog has no such card. */
const StowGpu *stow_gpu_find_device (const char *device_name);
const StowGpu *const *stow_gpu_catalog (gsize *n);

/* Messages begin with `--gpus "SPEC": ` since that is the option these
 * specs are typed into; STOW_HW_ERROR_INVALID for malformed specs,
 * _NOT_FOUND for unknown GPUs (with a did-you-mean hint) and for "local"
 * on a machine with no GPU.
 * "8xA100-80GB" (one node of the GPU's default preset when it fits, else
 * nodes of the preset's size), "64xH100-SXM", "4x8xH200" (nodes x GPUs per
 * node), "A100-80GB" (one GPU), "local" (this machine). */
StowCluster *stow_cluster_new_from_spec (const char *spec, GError **error);
/* A cluster.json: a preset or a GPU plus overrides (host RAM, NVMe paths
 * and bandwidth, network); every field named in errors. */
StowCluster *stow_cluster_new_from_file (const char *path, GError **error);
StowCluster *stow_cluster_new_from_json (JsonObject *obj, const char *where,
                                         GError **error);

/* Node presets (hw/catalog/nodes/): "dgx-a100", "dgx-h100", "hgx-h200",
 * "dgx-b200", "pcie-8gpu", "workstation".  Case-insensitive, with a
 * did-you-mean hint (STOW_HW_ERROR_NOT_FOUND). */
const StowNode *stow_node_preset_lookup (const char *name, GError **error);
const StowNode *const *stow_node_presets (gsize *n);

/* Deep copies and clears of the value types (every string is owned). */
void stow_gpu_copy (const StowGpu *src, StowGpu *dst);
void stow_gpu_clear (StowGpu *gpu);
void stow_node_copy (const StowNode *src, StowNode *dst);
void stow_node_clear (StowNode *node);

/* A cluster of @n_nodes copies of @node (copied).  @spec is kept for
 * messages (NULL: the node's name). */
StowCluster *stow_cluster_new (const StowNode *node, guint n_nodes,
                               const char *spec);
/* A copy of @cluster whose nodes have @host_ram_bytes of RAM (0: as
 * before) and, when @set_nvme, @n_nvme drives of @nvme_capacity_bytes each
 * (read and write rates of the node's first drive, or of a Gen4 M.2 drive,
 * 7 and 5 GB/s, when it has none).  What is set is no longer assumed. */
StowCluster *stow_cluster_with_host (const StowCluster *cluster,
                                     guint64 host_ram_bytes, gboolean set_nvme,
                                     guint n_nvme, guint64 nvme_capacity_bytes);

/* JSON views (raw bytes, bytes/s, FLOP/s, seconds). */
JsonNode *stow_gpu_to_json (const StowGpu *gpu);
JsonNode *stow_node_to_json (const StowNode *node);
JsonNode *stow_cluster_to_json (const StowCluster *cluster);

/* Reads a probe profile written by `stowage hw --probe --save FILE` (see
 * hw/machine.h) into @node: measured host memory bandwidth, cores, RAM.
 * Errors name the file and the field. */
gboolean stow_node_apply_profile (StowNode *node, const char *path,
                                  GError **error);

StowCluster *stow_cluster_ref (StowCluster *cluster);
void stow_cluster_unref (StowCluster *cluster);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowCluster, stow_cluster_unref)

G_END_DECLS
