/* SPDX-License-Identifier: MIT
 *
 * hw/machine.c: discovery of the local machine.  hwloc gives the CPU,
 * memory and PCI picture; the CUDA driver, opened with dlopen at run time
 * (never linked, so the binary starts without a driver), gives each GPU's
 * name and memory; sysfs gives block devices and PCIe link generation;
 * statvfs and mountinfo describe the NVMe path.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/json.h"
#include "hw/hw-private.h"
#include "hw/machine.h"

/* ---- lifecycle ---------------------------------------------------------- */

static void
cache_clear (gpointer p)
{
  StowCacheInfo *c = p;
  g_free (c->type);
}

static void
gpu_clear (gpointer p)
{
  StowLocalGpu *g = p;
  g_free (g->name);
  g_free (g->pci_busid);
  g_free (g->source);
}

static void
block_clear (gpointer p)
{
  StowBlockDevice *b = p;
  g_free (b->name);
  g_free (b->model);
}

static StowMachine *
machine_new (void)
{
  StowMachine *m = g_new0 (StowMachine, 1);
  m->caches = g_array_new (FALSE, TRUE, sizeof (StowCacheInfo));
  g_array_set_clear_func (m->caches, cache_clear);
  m->numa = g_array_new (FALSE, TRUE, sizeof (StowNumaInfo));
  m->gpus = g_array_new (FALSE, TRUE, sizeof (StowLocalGpu));
  g_array_set_clear_func (m->gpus, gpu_clear);
  m->blocks = g_array_new (FALSE, TRUE, sizeof (StowBlockDevice));
  g_array_set_clear_func (m->blocks, block_clear);
  return m;
}

void
stow_machine_free (StowMachine *m)
{
  if (m == NULL)
    return;
  g_free (m->hostname);
  g_free (m->cpu_model);
  g_array_unref (m->caches);
  g_array_unref (m->numa);
  g_array_unref (m->gpus);
  g_array_unref (m->blocks);
  g_free (m->gpu_status);
  g_free (m->cuda_driver);
  stow_path_info_free (m->path);
  g_free (m);
}

void
stow_path_info_free (StowPathInfo *info)
{
  if (info == NULL)
    return;
  g_free (info->path);
  g_free (info->fs_type);
  g_free (info->source);
  g_free (info->mount_point);
  g_free (info);
}

/* ---- hwloc -------------------------------------------------------------- */

static guint
count_in (hwloc_topology_t topo, hwloc_obj_type_t type, hwloc_cpuset_t set)
{
  return (guint)hwloc_get_nbobjs_inside_cpuset_by_type (topo, set, type);
}

/* CUDA's memory size as the hwloc cuda backend records it (KiB). */
static guint64
info_kib (hwloc_obj_t obj, const char *name)
{
  const char *v = hwloc_obj_get_info_by_name (obj, name);
  guint64 kib = 0;
  if (v && g_ascii_string_to_unsigned (v, 10, 0, G_MAXUINT64 >> 10, &kib, NULL))
    return kib << 10;
  return 0;
}

static gboolean
is_gpu_pci (hwloc_obj_t pci)
{
  guint base = pci->attr->pcidev.class_id >> 8;
  guint vendor = pci->attr->pcidev.vendor_id;
  /* Display controllers (0x03xx) from NVIDIA or AMD; AMD Instinct parts
   * report 0x0380 (other display), NVIDIA datacenter parts 0x0302 (3D). */
  return base == 0x03 && (vendor == 0x10de || vendor == 0x1002);
}

static int
local_numa (hwloc_topology_t topo, hwloc_obj_t obj)
{
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj (topo, obj);
  if (anc == NULL || anc->nodeset == NULL
      || hwloc_bitmap_weight (anc->nodeset) != 1)
    return -1;
  return hwloc_bitmap_first (anc->nodeset);
}

static void
read_pci_gpus (StowMachine *m, hwloc_topology_t topo)
{
  hwloc_obj_t pci = NULL;
  while ((pci = hwloc_get_next_pcidev (topo, pci)) != NULL)
    {
      if (!is_gpu_pci (pci))
        continue;
      StowLocalGpu g = { 0 };
      g.index = m->gpus->len;
      g.pci_busid = g_strdup_printf (
          "%04x:%02x:%02x.%x", (guint)pci->attr->pcidev.domain,
          pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
      g.vendor_id = pci->attr->pcidev.vendor_id;
      g.device_id = pci->attr->pcidev.device_id;
      g.numa_node = local_numa (topo, pci);
      g.link_bw = (double)pci->attr->pcidev.linkspeed * 1e9;
      g.source = g_strdup ("pci");
      const char *pci_name = hwloc_obj_get_info_by_name (pci, "PCIDevice");
      if (pci_name)
        g.name = g_strdup (pci_name);

      /* OS devices below the PCI device carry what the cuda/nvml/rsmi
       * backends learnt: model name and memory. */
      for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling)
        {
          if (os->type != HWLOC_OBJ_OS_DEVICE)
            continue;
          const char *model = hwloc_obj_get_info_by_name (os, "GPUModel");
          if (model)
            {
              g_free (g.name);
              g.name = g_strdup (model);
            }
          guint64 mem = info_kib (os, "CUDAGlobalMemorySize");
          if (mem)
            {
              g.total_bytes = mem;
              g_free (g.source);
              g.source = g_strdup ("hwloc-cuda");
            }
          else if (os->name && g_str_has_prefix (os->name, "nvml")
                   && strcmp (g.source, "pci") == 0)
            {
              g_free (g.source);
              g.source = g_strdup ("hwloc-nvml");
            }
        }
      g_array_append_val (m->gpus, g);
    }
}

static void
read_caches (StowMachine *m, hwloc_topology_t topo)
{
  static const struct
  {
    hwloc_obj_type_t type;
    guint level;
  } kinds[] = {
    { HWLOC_OBJ_L1CACHE, 1 }, { HWLOC_OBJ_L1ICACHE, 1 },
    { HWLOC_OBJ_L2CACHE, 2 }, { HWLOC_OBJ_L3CACHE, 3 },
    { HWLOC_OBJ_L4CACHE, 4 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (kinds); i++)
    {
      int n = hwloc_get_nbobjs_by_type (topo, kinds[i].type);
      if (n <= 0)
        continue;
      hwloc_obj_t c = hwloc_get_obj_by_type (topo, kinds[i].type, 0);
      StowCacheInfo info = { 0 };
      info.level = kinds[i].level;
      info.size_bytes = c->attr->cache.size;
      info.count = (guint)n;
      switch (c->attr->cache.type)
        {
        case HWLOC_OBJ_CACHE_DATA:
          info.type = g_strdup ("data");
          break;
        case HWLOC_OBJ_CACHE_INSTRUCTION:
          info.type = g_strdup ("instruction");
          break;
        default:
          info.type = g_strdup ("unified");
          break;
        }
      g_array_append_val (m->caches, info);
    }
}

StowMachine *
stow_machine_new_from_topology (hwloc_topology_t topo, GError **error)
{
  g_return_val_if_fail (topo != NULL, NULL);
  StowMachine *m = machine_new ();
  hwloc_obj_t root = hwloc_get_root_obj (topo);

  m->sockets
      = (guint)MAX (0, hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_PACKAGE));
  m->numa_nodes
      = (guint)MAX (0, hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_NUMANODE));
  m->cores = (guint)MAX (0, hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_CORE));
  m->pus = (guint)MAX (0, hwloc_get_nbobjs_by_type (topo, HWLOC_OBJ_PU));
  if (m->cores == 0)
    m->cores = m->pus;
  if (m->sockets == 0)
    m->sockets = 1;
  m->ram_bytes = root->total_memory;

  hwloc_obj_t pkg = hwloc_get_obj_by_type (topo, HWLOC_OBJ_PACKAGE, 0);
  const char *model = pkg ? hwloc_obj_get_info_by_name (pkg, "CPUModel") : NULL;
  if (model)
    m->cpu_model = g_strdup (model);

  for (guint i = 0; i < m->numa_nodes; i++)
    {
      hwloc_obj_t node = hwloc_get_obj_by_type (topo, HWLOC_OBJ_NUMANODE, i);
      StowNumaInfo info = { 0 };
      info.os_index = node->os_index;
      info.local_bytes = node->attr->numanode.local_memory;
      info.cores = count_in (topo, HWLOC_OBJ_CORE, node->cpuset);
      info.pus = count_in (topo, HWLOC_OBJ_PU, node->cpuset);
      g_array_append_val (m->numa, info);
    }
  read_caches (m, topo);
  read_pci_gpus (m, topo);
  for (guint i = 0; i < m->gpus->len; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      if (g->name)
        g->catalog = stow_hw_gpu_find_device (g->name);
    }
  if (m->gpus->len == 0)
    m->gpu_status = g_strdup ("no GPU among the PCI devices");
  return m;
}

typedef int (*topo_setter) (hwloc_topology_t, const char *);

static StowMachine *
from_source (topo_setter set, const char *what, const char *arg, GError **error)
{
  hwloc_topology_t topo;
  if (hwloc_topology_init (&topo) != 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "hwloc: cannot create a topology: %s", g_strerror (errno));
      return NULL;
    }
  hwloc_topology_set_io_types_filter (topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (set (topo, arg) != 0)
    {
      int e = errno;
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s \"%s\": hwloc cannot read it (%s)", what, arg,
                   g_strerror (e));
      hwloc_topology_destroy (topo);
      return NULL;
    }
  if (hwloc_topology_load (topo) != 0)
    {
      int e = errno;
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s \"%s\": hwloc cannot load it (%s)", what, arg,
                   g_strerror (e));
      hwloc_topology_destroy (topo);
      return NULL;
    }
  StowMachine *m = stow_machine_new_from_topology (topo, error);
  hwloc_topology_destroy (topo);
  return m;
}

StowMachine *
stow_machine_new_from_xml (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  if (!g_file_test (path, G_FILE_TEST_IS_REGULAR))
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "topology XML \"%s\": no such file", path);
      return NULL;
    }
  return from_source (hwloc_topology_set_xml, "topology XML", path, error);
}

StowMachine *
stow_machine_new_from_synthetic (const char *description, GError **error)
{
  g_return_val_if_fail (description != NULL, NULL);
  return from_source (hwloc_topology_set_synthetic, "synthetic topology",
                      description, error);
}

/* ---- sysfs -------------------------------------------------------------- */

static char *
read_line (const char *path)
{
  char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, NULL))
    return NULL;
  return g_strstrip (text);
}

/* "16.0 GT/s PCIe" -> 4: each generation doubles the per-lane rate from
 * Gen3's 8 GT/s (PCI-SIG base specifications). */
static guint
pcie_gen_of (const char *speed)
{
  double gts = g_ascii_strtod (speed, NULL);
  if (gts >= 60)
    return 6;
  if (gts >= 30)
    return 5;
  if (gts >= 15)
    return 4;
  if (gts >= 7.5)
    return 3;
  if (gts >= 4.5)
    return 2;
  if (gts > 0)
    return 1;
  return 0;
}

static void
read_pcie_links (StowMachine *m, const char *sysfs_root)
{
  for (guint i = 0; i < m->gpus->len; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      if (g->pci_busid == NULL)
        continue;
      g_autofree char *dir = g_build_filename (sysfs_root, "bus", "pci",
                                               "devices", g->pci_busid, NULL);
      g_autofree char *sp = g_build_filename (dir, "current_link_speed", NULL);
      g_autofree char *wp = g_build_filename (dir, "current_link_width", NULL);
      g_autofree char *speed = read_line (sp);
      g_autofree char *width = read_line (wp);
      if (speed)
        g->pcie_gen = pcie_gen_of (speed);
      if (width)
        g->pcie_width = (guint)g_ascii_strtoull (width, NULL, 10);
    }
}

static gint
compare_block (gconstpointer a, gconstpointer b)
{
  return strcmp (((const StowBlockDevice *)a)->name,
                 ((const StowBlockDevice *)b)->name);
}

gboolean
stow_machine_scan_block_devices (StowMachine *m, const char *sysfs_root,
                                 GError **error)
{
  g_return_val_if_fail (m != NULL, FALSE);
  g_autofree char *dir_path
      = g_build_filename (sysfs_root ? sysfs_root : "/sys", "block", NULL);
  g_autoptr (GError) local = NULL;
  g_autoptr (GDir) dir = g_dir_open (dir_path, 0, &local);
  if (dir == NULL)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID, "%s: %s",
                   dir_path, local->message);
      return FALSE;
    }
  const char *name;
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      /* Loop and RAM disks are not places to put optimizer states. */
      if (g_str_has_prefix (name, "loop") || g_str_has_prefix (name, "ram"))
        continue;
      g_autofree char *size_p = g_build_filename (dir_path, name, "size", NULL);
      g_autofree char *rot_p
          = g_build_filename (dir_path, name, "queue", "rotational", NULL);
      g_autofree char *model_p
          = g_build_filename (dir_path, name, "device", "model", NULL);
      g_autofree char *size = read_line (size_p);
      g_autofree char *rot = read_line (rot_p);
      StowBlockDevice b = { 0 };
      b.name = g_strdup (name);
      /* sysfs counts 512-byte sectors whatever the device's block size
       * (Documentation/ABI/stable/sysfs-block). */
      if (size)
        b.size_bytes = g_ascii_strtoull (size, NULL, 10) * 512;
      b.rotational = rot && strcmp (rot, "1") == 0;
      b.model = read_line (model_p);
      if (b.model && *b.model == '\0')
        g_clear_pointer (&b.model, g_free);
      g_array_append_val (m->blocks, b);
    }
  g_array_sort (m->blocks, compare_block);
  return TRUE;
}

/* ---- the NVMe path ------------------------------------------------------ */

/* mountinfo escapes spaces and such as \040 (proc(5)). */
static char *
unescape_mount (const char *s)
{
  GString *out = g_string_new (NULL);
  for (const char *p = s; *p; p++)
    {
      if (p[0] == '\\' && g_ascii_isdigit (p[1]) && g_ascii_isdigit (p[2])
          && g_ascii_isdigit (p[3]))
        {
          g_string_append_c (
              out, (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0')));
          p += 3;
        }
      else
        g_string_append_c (out, *p);
    }
  return g_string_free (out, FALSE);
}

/* The longest mount point containing @real: its fs type and source. */
static void
find_mount (StowPathInfo *info, const char *real)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents ("/proc/self/mountinfo", &text, NULL, NULL))
    return;
  g_auto (GStrv) lines = g_strsplit (text, "\n", -1);
  gsize best = 0;
  for (char **l = lines; *l; l++)
    {
      g_auto (GStrv) f = g_strsplit (*l, " ", -1);
      guint n = g_strv_length (f);
      if (n < 10)
        continue;
      g_autofree char *mp = unescape_mount (f[4]);
      gsize len = strlen (mp);
      gboolean inside = strcmp (mp, "/") == 0
                        || (g_str_has_prefix (real, mp)
                            && (real[len] == '/' || real[len] == '\0'));
      if (!inside || len < best)
        continue;
      /* After the optional fields comes "-", then fstype and source. */
      guint dash = 6;
      while (dash < n && strcmp (f[dash], "-") != 0)
        dash++;
      if (dash + 2 >= n)
        continue;
      best = len;
      g_free (info->mount_point);
      g_free (info->fs_type);
      g_free (info->source);
      info->mount_point = g_steal_pointer (&mp);
      info->fs_type = g_strdup (f[dash + 1]);
      info->source = unescape_mount (f[dash + 2]);
    }
}

StowPathInfo *
stow_path_info_new (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  struct stat st;
  if (stat (path, &st) != 0 || !S_ISDIR (st.st_mode))
    {
      int e = errno;
      g_set_error (
          error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID, "--nvme-path \"%s\": %s",
          path, S_ISDIR (st.st_mode) || e ? g_strerror (e) : "not a directory");
      return NULL;
    }
  struct statvfs vfs;
  if (statvfs (path, &vfs) != 0)
    {
      int e = errno;
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "--nvme-path \"%s\": statvfs: %s", path, g_strerror (e));
      return NULL;
    }
  StowPathInfo *info = g_new0 (StowPathInfo, 1);
  info->path = g_strdup (path);
  info->free_bytes = (guint64)vfs.f_bavail * vfs.f_frsize;
  info->total_bytes = (guint64)vfs.f_blocks * vfs.f_frsize;
  g_autofree char *real = realpath (path, NULL);
  if (real)
    find_mount (info, real);
  if (info->fs_type == NULL)
    {
      /* No mountinfo (a container without /proc): name the magic. */
      static const struct
      {
        unsigned long magic;
        const char *name;
      } magics[] = {
        { 0xEF53, "ext4" },        { 0x58465342, "xfs" },
        { 0x9123683E, "btrfs" },   { 0x01021994, "tmpfs" },
        { 0x794c7630, "overlay" }, { 0x6969, "nfs" },
        { 0x2fc12fc1, "zfs" },     { 0xF2F52010, "f2fs" },
      };
      struct statfs sf;
      if (statfs (path, &sf) == 0)
        {
          for (gsize i = 0; i < G_N_ELEMENTS (magics); i++)
            if ((unsigned long)sf.f_type == magics[i].magic)
              info->fs_type = g_strdup (magics[i].name);
          if (info->fs_type == NULL)
            info->fs_type = g_strdup_printf ("0x%lx", (unsigned long)sf.f_type);
        }
    }
  return info;
}

/* ---- CUDA, through the driver API opened at run time -------------------- */

typedef int (*cu_init_fn) (unsigned int);
typedef int (*cu_count_fn) (int *);
typedef int (*cu_get_fn) (int *, int);
typedef int (*cu_name_fn) (char *, int, int);
typedef int (*cu_mem_fn) (size_t *, int);
typedef int (*cu_attr_fn) (int *, int, int);
typedef int (*cu_version_fn) (int *);
typedef int (*cu_errstr_fn) (int, const char **);

/* CUdevice_attribute values from cuda.h (stable across releases). */
enum
{
  CU_ATTR_PCI_BUS_ID = 33,
  CU_ATTR_PCI_DEVICE_ID = 34,
  CU_ATTR_PCI_DOMAIN_ID = 50,
  CU_ATTR_CC_MAJOR = 75,
  CU_ATTR_CC_MINOR = 76,
};

static char *
cu_error (cu_errstr_fn errstr, int rc)
{
  const char *s = NULL;
  if (errstr && errstr (rc, &s) == 0 && s)
    return g_strdup_printf ("%s (CUDA error %d)", s, rc);
  return g_strdup_printf ("CUDA error %d", rc);
}

gboolean
stow_machine_add_cuda (StowMachine *m, const char *library, char **reason)
{
  g_return_val_if_fail (m != NULL, FALSE);
  if (library == NULL)
    library = g_getenv ("STOW_CUDA_LIBRARY");
  if (library == NULL || *library == '\0')
    library = "libcuda.so.1";

  void *lib = dlopen (library, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    {
      const char *e = dlerror ();
      *reason = g_strdup_printf ("cannot load the CUDA driver: %s",
                                 e ? e : library);
      return FALSE;
    }
  cu_init_fn init = (cu_init_fn)dlsym (lib, "cuInit");
  cu_count_fn count = (cu_count_fn)dlsym (lib, "cuDeviceGetCount");
  cu_get_fn get = (cu_get_fn)dlsym (lib, "cuDeviceGet");
  cu_name_fn name = (cu_name_fn)dlsym (lib, "cuDeviceGetName");
  cu_mem_fn mem = (cu_mem_fn)dlsym (lib, "cuDeviceTotalMem_v2");
  cu_attr_fn attr = (cu_attr_fn)dlsym (lib, "cuDeviceGetAttribute");
  cu_version_fn version = (cu_version_fn)dlsym (lib, "cuDriverGetVersion");
  cu_errstr_fn errstr = (cu_errstr_fn)dlsym (lib, "cuGetErrorString");
  if (!init || !count || !get || !name || !mem || !attr)
    {
      *reason = g_strdup_printf ("%s is not a CUDA driver (cuInit and "
                                 "cuDeviceGet* missing)",
                                 library);
      dlclose (lib);
      return FALSE;
    }
  int rc = init (0), n = 0;
  if (rc == 0)
    rc = count (&n);
  if (rc != 0)
    {
      *reason = cu_error (errstr, rc);
      dlclose (lib);
      return FALSE;
    }
  if (n <= 0)
    {
      *reason = g_strdup ("the CUDA driver reports no device");
      dlclose (lib);
      return FALSE;
    }
  int v = 0;
  if (version && version (&v) == 0 && v > 0)
    {
      g_free (m->cuda_driver);
      m->cuda_driver = g_strdup_printf ("%d.%d", v / 1000, (v % 1000) / 10);
    }

  GArray *found = g_array_new (FALSE, TRUE, sizeof (StowLocalGpu));
  for (int i = 0; i < n; i++)
    {
      int dev = 0, bus = 0, slot = 0, domain = 0;
      char buf[256] = { 0 };
      size_t bytes = 0;
      StowLocalGpu g = { 0 };
      if (get (&dev, i) != 0)
        continue;
      g.index = (guint)i;
      if (name (buf, sizeof buf - 1, dev) == 0)
        g.name = g_strdup (buf);
      if (mem (&bytes, dev) == 0)
        g.total_bytes = bytes;
      int maj = 0, min = 0;
      attr (&maj, CU_ATTR_CC_MAJOR, dev);
      attr (&min, CU_ATTR_CC_MINOR, dev);
      g.cc_major = (guint)MAX (maj, 0);
      g.cc_minor = (guint)MAX (min, 0);
      g.numa_node = -1;
      g.vendor_id = 0x10de;
      if (attr (&bus, CU_ATTR_PCI_BUS_ID, dev) == 0
          && attr (&slot, CU_ATTR_PCI_DEVICE_ID, dev) == 0
          && attr (&domain, CU_ATTR_PCI_DOMAIN_ID, dev) == 0)
        g.pci_busid = g_strdup_printf ("%04x:%02x:%02x.0", (guint)domain,
                                       (guint)bus, (guint)slot);
      g.source = g_strdup ("cuda");

      /* The topology knows where the GPU sits: NUMA node and link. */
      for (guint k = 0; k < m->gpus->len && g.pci_busid; k++)
        {
          StowLocalGpu *t = &g_array_index (m->gpus, StowLocalGpu, k);
          if (t->pci_busid
              && g_ascii_strcasecmp (t->pci_busid, g.pci_busid) == 0)
            {
              g.numa_node = t->numa_node;
              g.link_bw = t->link_bw;
              g.device_id = t->device_id;
            }
        }
      if (g.name)
        g.catalog = stow_hw_gpu_find_device (g.name);
      g_array_append_val (found, g);
    }
  dlclose (lib);
  /* CUDA's list replaces hwloc's PCI list (same GPUs, better names);
   * non-CUDA GPUs the topology saw are kept after them. */
  for (guint k = 0; k < m->gpus->len; k++)
    {
      StowLocalGpu *t = &g_array_index (m->gpus, StowLocalGpu, k);
      gboolean dup = FALSE;
      for (guint j = 0; j < found->len; j++)
        {
          StowLocalGpu *f = &g_array_index (found, StowLocalGpu, j);
          if (t->pci_busid && f->pci_busid
              && g_ascii_strcasecmp (t->pci_busid, f->pci_busid) == 0)
            dup = TRUE;
        }
      if (!dup && t->vendor_id != 0x10de)
        {
          StowLocalGpu c = *t;
          c.name = g_strdup (t->name);
          c.pci_busid = g_strdup (t->pci_busid);
          c.source = g_strdup (t->source);
          g_array_append_val (found, c);
        }
    }
  g_array_set_clear_func (found, gpu_clear);
  g_array_unref (m->gpus);
  m->gpus = found;
  g_clear_pointer (&m->gpu_status, g_free);
  return TRUE;
}

/* ---- the whole machine -------------------------------------------------- */

StowMachine *
stow_machine_discover (const StowDiscoverOptions *options, GError **error)
{
  StowDiscoverOptions none = { 0 };
  const StowDiscoverOptions *o = options ? options : &none;
  const char *sysfs = o->sysfs_root ? o->sysfs_root : "/sys";
  g_autoptr (StowPathInfo) path = NULL;

  /* The path first: a bad --nvme-path is the user's error, and cheap. */
  if (o->nvme_path && (path = stow_path_info_new (o->nvme_path, error)) == NULL)
    return NULL;

  hwloc_topology_t topo;
  if (hwloc_topology_init (&topo) != 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "hwloc: cannot create a topology: %s", g_strerror (errno));
      return NULL;
    }
  hwloc_topology_set_io_types_filter (topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load (topo) != 0)
    {
      int e = errno;
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "hwloc: cannot read this machine's topology: %s",
                   g_strerror (e));
      hwloc_topology_destroy (topo);
      return NULL;
    }
  StowMachine *m = stow_machine_new_from_topology (topo, error);
  hwloc_topology_destroy (topo);
  if (m == NULL)
    return NULL;
  m->hostname = g_strdup (g_get_host_name ());
  /* Some virtual machines hot-plug memory that the per-node counts hwloc
   * reads do not show; the kernel's own total is the truth for planning. */
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  if (pages > 0 && page > 0 && (guint64)pages * (guint64)page > m->ram_bytes)
    m->ram_bytes = (guint64)pages * (guint64)page;

  g_autofree char *reason = NULL;
  if (!stow_machine_add_cuda (m, o->cuda_library, &reason))
    {
      g_free (m->gpu_status);
      if (m->gpus->len > 0)
        m->gpu_status = g_strdup_printf (
            "%u GPU(s) on the PCI bus but CUDA is unusable: %s", m->gpus->len,
            reason);
      else
        m->gpu_status = g_strdup_printf ("no CUDA GPU found: %s", reason);
    }
  read_pcie_links (m, sysfs);
  /* Block devices are informative; a sysfs without them is no failure. */
  stow_machine_scan_block_devices (m, sysfs, NULL);
  m->path = g_steal_pointer (&path);
  return m;
}

/* ---- a cluster of this machine ------------------------------------------ */

StowCluster *
stow_cluster_new_from_machine (const StowMachine *m, GError **error)
{
  g_return_val_if_fail (m != NULL, NULL);
  if (m->gpus->len == 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                   "this machine has no GPU to plan for (%s); name the "
                   "GPUs instead, e.g. --gpus 8xA100-80GB",
                   m->gpu_status ? m->gpu_status : "none found");
      return NULL;
    }
  const StowLocalGpu *first = &g_array_index (m->gpus, StowLocalGpu, 0);
  for (guint i = 0; i < m->gpus->len; i++)
    {
      const StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      if (g->catalog == NULL)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                       "GPU %u (\"%s\") is not in the catalog; describe it "
                       "in a --cluster file",
                       i, g->name ? g->name : "unnamed");
          return NULL;
        }
      if (g->catalog != first->catalog)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "this machine mixes GPU kinds (%s and %s); plans "
                       "need identical GPUs",
                       first->catalog->name, g->catalog->name);
          return NULL;
        }
    }
  const StowNode *preset
      = stow_node_preset_lookup (first->catalog->preset, NULL);
  g_assert (preset != NULL);
  StowNode node = { 0 };
  stow_node_copy (preset, &node);
  stow_gpu_clear (&node.gpu);
  stow_gpu_copy (first->catalog, &node.gpu);
  g_free (node.name);
  node.name = g_strdup ("local");
  g_free (node.description);
  node.description
      = g_strdup_printf ("this machine (%s)", m->hostname ? m->hostname : "?");
  /* What was measured replaces what the catalog assumes. */
  if (first->total_bytes)
    node.gpu.total_bytes = first->total_bytes;
  node.gpus_per_node = m->gpus->len;
  node.host_ram_bytes = m->ram_bytes;
  node.cpu_cores = m->cores;
  node.sockets = m->sockets;
  node.numa_nodes = MAX (1u, m->numa_nodes);
  /* The host memory bandwidth and the drives stay the preset's guesses
   * until `stowage hw --probe` measures them. */
  StowCluster *c = stow_cluster_new (&node, 1, "local");
  stow_node_clear (&node);
  return c;
}

/* ---- JSON --------------------------------------------------------------- */

JsonNode *
stow_machine_to_json (const StowMachine *m)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "hostname", m->hostname);
  stow_json_set_string (b, "cpu_model", m->cpu_model);
  stow_json_set_i64 (b, "sockets", m->sockets);
  stow_json_set_i64 (b, "numa_nodes", m->numa_nodes);
  stow_json_set_i64 (b, "cores", m->cores);
  stow_json_set_i64 (b, "pus", m->pus);
  stow_json_set_i64 (b, "ram_bytes", (gint64)m->ram_bytes);

  json_builder_set_member_name (b, "numa");
  json_builder_begin_array (b);
  for (guint i = 0; i < m->numa->len; i++)
    {
      StowNumaInfo *n = &g_array_index (m->numa, StowNumaInfo, i);
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "os_index", n->os_index);
      stow_json_set_i64 (b, "local_bytes", (gint64)n->local_bytes);
      stow_json_set_i64 (b, "cores", n->cores);
      stow_json_set_i64 (b, "pus", n->pus);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);

  json_builder_set_member_name (b, "caches");
  json_builder_begin_array (b);
  for (guint i = 0; i < m->caches->len; i++)
    {
      StowCacheInfo *c = &g_array_index (m->caches, StowCacheInfo, i);
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "level", c->level);
      stow_json_set_string (b, "type", c->type);
      stow_json_set_i64 (b, "size_bytes", (gint64)c->size_bytes);
      stow_json_set_i64 (b, "count", c->count);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);

  json_builder_set_member_name (b, "gpus");
  json_builder_begin_array (b);
  for (guint i = 0; i < m->gpus->len; i++)
    {
      StowLocalGpu *g = &g_array_index (m->gpus, StowLocalGpu, i);
      json_builder_begin_object (b);
      stow_json_set_i64 (b, "index", g->index);
      stow_json_set_string (b, "name", g->name);
      stow_json_set_string (b, "catalog", g->catalog ? g->catalog->name : NULL);
      stow_json_set_string (b, "pci_busid", g->pci_busid);
      stow_json_set_i64 (b, "total_bytes", (gint64)g->total_bytes);
      stow_json_set_i64 (b, "numa_node", g->numa_node);
      stow_json_set_double (b, "pcie_link_bw", g->link_bw);
      stow_json_set_i64 (b, "pcie_gen", g->pcie_gen);
      stow_json_set_i64 (b, "pcie_width", g->pcie_width);
      if (g->cc_major)
        {
          g_autofree char *cc
              = g_strdup_printf ("%u.%u", g->cc_major, g->cc_minor);
          stow_json_set_string (b, "compute_capability", cc);
        }
      stow_json_set_string (b, "source", g->source);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  stow_json_set_string (b, "gpu_status", m->gpu_status);
  stow_json_set_string (b, "cuda_driver", m->cuda_driver);

  json_builder_set_member_name (b, "block_devices");
  json_builder_begin_array (b);
  for (guint i = 0; i < m->blocks->len; i++)
    {
      StowBlockDevice *d = &g_array_index (m->blocks, StowBlockDevice, i);
      json_builder_begin_object (b);
      stow_json_set_string (b, "name", d->name);
      stow_json_set_i64 (b, "size_bytes", (gint64)d->size_bytes);
      stow_json_set_bool (b, "rotational", d->rotational);
      stow_json_set_string (b, "model", d->model);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);

  if (m->path)
    {
      json_builder_set_member_name (b, "nvme_path");
      json_builder_begin_object (b);
      stow_json_set_string (b, "path", m->path->path);
      stow_json_set_string (b, "fs_type", m->path->fs_type);
      stow_json_set_string (b, "source", m->path->source);
      stow_json_set_string (b, "mount_point", m->path->mount_point);
      stow_json_set_i64 (b, "free_bytes", (gint64)m->path->free_bytes);
      stow_json_set_i64 (b, "total_bytes", (gint64)m->path->total_bytes);
      json_builder_end_object (b);
    }
  json_builder_end_object (b);
  return json_builder_get_root (b);
}
