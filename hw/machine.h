/* SPDX-License-Identifier: MIT
 *
 * hw/machine.h: what this machine has, discovered at run time: sockets,
 * NUMA nodes, cores, caches and RAM (hwloc); GPUs (the CUDA driver loaded
 * with dlopen, never linked; hwloc PCI objects); block devices (sysfs); the
 * free space of a directory (statvfs).  Tests inject hwloc topologies
 * (synthetic or XML) and a fake sysfs tree, as hwloc tests itself.
 */
#pragma once

#include <glib.h>
#include <hwloc.h>
#include <json-glib/json-glib.h>

#include "hw/hw.h"

G_BEGIN_DECLS

typedef struct
{
  guint level;        /* 1, 2, 3 */
  char *type;         /* "data", "unified", "instruction" */
  guint64 size_bytes; /* of one cache */
  guint count;        /* how many of them */
} StowCacheInfo;

typedef struct
{
  guint os_index;
  guint64 local_bytes;
  guint cores;
  guint pus;
} StowNumaInfo;

typedef struct
{
  guint index;     /* CUDA ordinal, or order of discovery */
  char *name;      /* "NVIDIA H100 80GB HBM3"; NULL unknown */
  char *pci_busid; /* "0000:17:00.0"; NULL unknown */
  guint vendor_id, device_id;
  guint64 total_bytes; /* what CUDA reports (= torch total_memory); 0 unknown */
  int numa_node;       /* OS index of the local NUMA node; -1 unknown */
  double link_bw;      /* PCIe link bytes/s (hwloc, from sysfs); 0 unknown */
  guint pcie_gen;      /* from sysfs current_link_speed; 0 unknown */
  guint pcie_width;    /* lanes; 0 unknown */
  guint cc_major, cc_minor; /* CUDA compute capability; 0 unknown */
  const StowGpu *catalog;   /* the catalog entry the name matched, or NULL */
  char *source;             /* "cuda", "hwloc-cuda", "hwloc-nvml", "pci" */
} StowLocalGpu;

typedef struct
{
  char *name; /* "nvme0n1" */
  guint64 size_bytes;
  gboolean rotational;
  char *model; /* NULL when sysfs has none */
} StowBlockDevice;

typedef struct
{
  char *path;    /* as given */
  char *fs_type; /* "ext4", "xfs", "tmpfs" */
  char *source;  /* the mounted device, "/dev/nvme0n1p1"; may be NULL */
  char *mount_point;
  guint64 free_bytes; /* available to an unprivileged user */
  guint64 total_bytes;
} StowPathInfo;

typedef struct _StowMachine StowMachine;
struct _StowMachine
{
  char *hostname;  /* NULL for injected topologies */
  char *cpu_model; /* of the first package; NULL unknown */
  guint sockets, numa_nodes, cores, pus;
  guint64 ram_bytes;
  GArray *caches;     /* StowCacheInfo, by level */
  GArray *numa;       /* StowNumaInfo */
  GArray *gpus;       /* StowLocalGpu */
  GArray *blocks;     /* StowBlockDevice */
  char *gpu_status;   /* why the GPU list is empty: "no CUDA GPU found:
                       * libcuda.so.1: cannot open shared object file" */
  char *cuda_driver;  /* "12.4" when the driver answered; NULL otherwise */
  StowPathInfo *path; /* --nvme-path, when asked for */
};

/* Reads CPUs, memory, caches and PCI GPUs (with their OS devices: cuda,
 * nvml, rsmi) from a loaded topology.  The topology is only read. */
StowMachine *stow_machine_new_from_topology (hwloc_topology_t topo,
                                             GError **error);
/* Loads an hwloc 2.x XML file (I/O objects kept) and reads it.  Errors:
 * STOW_HW_ERROR_INVALID naming the file. */
StowMachine *stow_machine_new_from_xml (const char *path, GError **error);
/* A synthetic topology such as "pack:2 numa:2 core:8 pu:2". */
StowMachine *stow_machine_new_from_synthetic (const char *description,
                                              GError **error);

typedef struct
{
  const char *nvme_path;    /* statvfs this directory; NULL skips */
  const char *sysfs_root;   /* NULL: "/sys" */
  const char *cuda_library; /* NULL: $STOW_CUDA_LIBRARY or "libcuda.so.1" */
} StowDiscoverOptions;

/* This machine: hwloc, then the CUDA driver (no GPU is a normal answer
 * recorded in gpu_status, not an error), block devices and the path.
 * Fails only when hwloc cannot read the machine or the path is unusable. */
StowMachine *stow_machine_discover (const StowDiscoverOptions *options,
                                    GError **error);

/* Adds GPUs from the CUDA driver API (cuInit, cuDeviceGet*), matched to
 * the topology's PCI GPUs by bus id.  Returns FALSE with *reason set when
 * there is no usable driver or device; the machine is unchanged then. */
gboolean stow_machine_add_cuda (StowMachine *machine, const char *library,
                                char **reason);
/* Scans SYSFS_ROOT/block (loop and ram devices skipped). */
gboolean stow_machine_scan_block_devices (StowMachine *machine,
                                          const char *sysfs_root,
                                          GError **error);
/* Free space, size, filesystem type and device of the mount holding
 * @path.  STOW_HW_ERROR_INVALID naming the path when it is not a
 * directory. */
StowPathInfo *stow_path_info_new (const char *path, GError **error);
void stow_path_info_free (StowPathInfo *info);

/* A cluster of one node made of this machine's GPUs (all of one catalog
 * kind).  STOW_HW_ERROR_NOT_FOUND when there is none, saying why. */
StowCluster *stow_cluster_new_from_machine (const StowMachine *machine,
                                            GError **error);

/* Host memory bandwidth, STREAM-style: a[i] = b[i] + 3 c[i] over three
 * arrays of @array_bytes, split over @threads threads (each first-touches
 * its slice), best of @repeats passes, 24 bytes counted per element as
 * STREAM does.  Results are checked; errors are STOW_HW_ERROR_INVALID. */
typedef struct
{
  double triad_bw; /* bytes/s, best pass */
  guint threads;
  guint64 array_bytes; /* per array */
  guint repeats;
  double best_s;  /* the fastest pass */
  double total_s; /* the whole probe, first touch included */
} StowMemProbe;

gboolean stow_probe_host_memory (guint threads, guint64 array_bytes,
                                 guint repeats, StowMemProbe *out,
                                 GError **error);
/* 4x the last-level caches (STREAM's rule), at least 64 MiB, at most a
 * 48th of RAM per array. */
guint64 stow_probe_default_array_bytes (const StowMachine *machine);
/* The profile `stowage hw --probe --save FILE` writes ("format":
 * "stowage-hw-profile"): host.mem_bw_triad, cores, sockets, numa_nodes,
 * ram_bytes, and the GPUs found.  Read by stow_node_apply_profile and by
 * stow_cluster_new_from_file. */
JsonNode *stow_probe_profile_to_json (const StowMachine *machine,
                                      const StowMemProbe *probe);

JsonNode *stow_machine_to_json (const StowMachine *machine);
void stow_machine_free (StowMachine *machine);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowMachine, stow_machine_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowPathInfo, stow_path_info_free)

G_END_DECLS
