/* SPDX-License-Identifier: MIT
 *
 * hw/catalog.c: the GPU and node-preset catalog.  The JSON files under
 * hw/catalog/ are compiled into the binary as a GResource and parsed once,
 * on first use; the catalog is immutable afterwards.  Reading node objects
 * (shared with cluster.json) lives in hw/cluster.c.
 */
#include <string.h>

#include "core/json.h"
#include "core/strutil.h"
#include "hw/hw-private.h"
#include "hw/hw.h"

#include "hw-catalog-resource.h"

#define CATALOG_PREFIX "/org/stowage/hw/catalog"

typedef struct
{
  GPtrArray *gpus;  /* StowGpu* */
  GPtrArray *nodes; /* StowNode* */
} Catalog;

/* clang-format off */
G_DEFINE_QUARK (stow-hw-error-quark, stow_hw_error)
/* clang-format on */

/* Names compare with case, spaces and underscores folded, so that CUDA's
 * "NVIDIA H100 80GB HBM3" finds the alias "H100-80GB-HBM3". */
char *
stow_hw_fold_name (const char *name)
{
  char *s = g_ascii_strdown (name, -1);
  for (char *p = s; *p; p++)
    if (*p == ' ' || *p == '_')
      *p = '-';
  return s;
}

static double
num (JsonObject *obj, const char *where, const char *member)
{
  double v = 0;
  g_autoptr (GError) error = NULL;
  if (!stow_json_get_double (obj, where, member, TRUE, &v, &error) || v < 0)
    g_error ("built-in catalog: %s", error ? error->message : member);
  return v;
}

static JsonObject *
obj_member (JsonObject *obj, const char *where, const char *member)
{
  JsonObject *o = NULL;
  g_autoptr (GError) error = NULL;
  if (!stow_json_get_object (obj, where, member, TRUE, &o, &error))
    g_error ("built-in catalog: %s", error->message);
  return o;
}

static const char *
str_member (JsonObject *obj, const char *where, const char *member)
{
  const char *s = NULL;
  g_autoptr (GError) error = NULL;
  if (!stow_json_get_string (obj, where, member, TRUE, &s, &error))
    g_error ("built-in catalog: %s", error->message);
  return s;
}

static StowGpu *
gpu_from_json (JsonObject *root, const char *where)
{
  StowGpu *g = g_new0 (StowGpu, 1);
  g->name = g_strdup (str_member (root, where, "name"));
  g->vendor = g_strdup (str_member (root, where, "vendor"));
  g->description = g_strdup (str_member (root, where, "description"));
  g->preset = g_strdup (str_member (root, where, "preset"));

  JsonArray *aliases = json_object_get_array_member (root, "aliases");
  guint n = aliases ? json_array_get_length (aliases) : 0;
  g->aliases = g_new0 (char *, n + 1);
  for (guint i = 0; i < n; i++)
    g->aliases[i] = g_strdup (json_array_get_string_element (aliases, i));

  /* Sizes: the box says GB (10^9); torch and nvidia-smi report MiB. */
  JsonObject *mem = obj_member (root, where, "memory");
  g->marketing_bytes = (guint64)num (mem, where, "marketing_bytes");
  g->total_bytes = (guint64)num (mem, where, "torch_total_mib") << 20;
  if (stow_json_has (mem, "smi_mib"))
    g->smi_bytes = (guint64)num (mem, where, "smi_mib") << 20;

  JsonObject *tf = obj_member (root, where, "dense_tflops");
  g->bf16_flops = num (tf, where, "bf16") * 1e12;
  g->fp16_flops = num (tf, where, "fp16") * 1e12;
  g->tf32_flops = num (tf, where, "tf32") * 1e12;
  g->fp32_flops = num (tf, where, "fp32") * 1e12;
  g->fp8_flops = num (tf, where, "fp8") * 1e12;
  g->hbm_bw = num (root, where, "hbm_gb_per_s") * 1e9;

  /* Vendors quote the GPU link bidirectionally; the cost model moves bytes
   * one way, so it gets half (ecosystem.md section 3). */
  JsonObject *link = obj_member (root, where, "gpu_link");
  g->nvlink_bw = num (link, where, "bidirectional_gb_per_s") * 1e9 / 2;
  g->nvlink_domain = (guint)num (link, where, "domain");
  if (g->nvlink_domain == 0)
    g->nvlink_domain = 1;

  JsonObject *pcie = obj_member (root, where, "pcie");
  g->pcie_gen = (guint)num (pcie, where, "gen");
  g->pcie_bw = num (pcie, where, "practical_gb_per_s") * 1e9;
  return g;
}

static void
gpu_free (gpointer p)
{
  StowGpu *g = p;
  stow_gpu_clear (g);
  g_free (g);
}

static void
node_free (gpointer p)
{
  StowNode *n = p;
  stow_node_clear (n);
  g_free (n);
}

static gint
compare_gpu (gconstpointer a, gconstpointer b)
{
  const StowGpu *x = *(StowGpu *const *)a, *y = *(StowGpu *const *)b;
  return g_ascii_strcasecmp (x->name, y->name);
}

static gint
compare_node (gconstpointer a, gconstpointer b)
{
  const StowNode *x = *(StowNode *const *)a, *y = *(StowNode *const *)b;
  return g_ascii_strcasecmp (x->name, y->name);
}

/* Calls @fn on every JSON file under @dir of the compiled-in resource. */
static void
load_dir (GResource *res, const char *dir, Catalog *cat,
          void (*fn) (Catalog *, JsonObject *, const char *))
{
  g_autofree char *path = g_strconcat (CATALOG_PREFIX "/", dir, NULL);
  g_autoptr (GError) error = NULL;
  g_auto (GStrv) names = g_resource_enumerate_children (
      res, path, G_RESOURCE_LOOKUP_FLAGS_NONE, &error);
  if (names == NULL)
    g_error ("built-in catalog: %s: %s", path, error->message);
  for (char **p = names; *p; p++)
    {
      if (!g_str_has_suffix (*p, ".json"))
        continue;
      g_autofree char *file = g_strconcat (path, "/", *p, NULL);
      g_autoptr (GBytes) bytes = g_resource_lookup_data (
          res, file, G_RESOURCE_LOOKUP_FLAGS_NONE, &error);
      if (bytes == NULL)
        g_error ("built-in catalog: %s: %s", file, error->message);
      gsize len;
      const char *data = g_bytes_get_data (bytes, &len);
      g_autofree char *where = g_strconcat ("hw/catalog/", dir, "/", *p, NULL);
      g_autoptr (JsonNode) root
          = stow_json_parse_data (data, (gssize)len, where, &error);
      JsonObject *obj
          = root ? stow_json_root_object (root, where, &error) : NULL;
      if (obj == NULL)
        g_error ("built-in catalog: %s", error->message);
      fn (cat, obj, where);
    }
}

static void
add_gpu (Catalog *cat, JsonObject *obj, const char *where)
{
  g_ptr_array_add (cat->gpus, gpu_from_json (obj, where));
}

static void
add_node (Catalog *cat, JsonObject *obj, const char *where)
{
  g_autoptr (GError) error = NULL;
  StowNode *n = g_new0 (StowNode, 1);
  if (!stow_hw_node_from_json (obj, where, TRUE, n, &error))
    g_error ("built-in catalog: %s", error->message);
  g_ptr_array_add (cat->nodes, n);
}

/* Set while node presets load, so that their GPU lookups see the GPUs
 * already loaded instead of waiting on the once-guard they are inside. */
static Catalog *loading;

static Catalog *
catalog (void)
{
  static gsize once = 0;
  static Catalog cat;
  if (loading)
    return loading;
  if (g_once_init_enter (&once))
    {
      GResource *res = stow_hw_catalog_get_resource ();
      cat.gpus = g_ptr_array_new_with_free_func (gpu_free);
      cat.nodes = g_ptr_array_new_with_free_func (node_free);
      /* GPUs first: node presets name their GPU. */
      load_dir (res, "gpus", &cat, add_gpu);
      g_ptr_array_sort (cat.gpus, compare_gpu);
      g_ptr_array_add (cat.gpus, NULL);
      loading = &cat;
      load_dir (res, "nodes", &cat, add_node);
      loading = NULL;
      g_ptr_array_sort (cat.nodes, compare_node);
      g_ptr_array_add (cat.nodes, NULL);
      g_once_init_leave (&once, 1);
    }
  return &cat;
}

const StowGpu *const *
stow_gpu_catalog (gsize *n)
{
  Catalog *cat = catalog ();
  if (n)
    *n = cat->gpus->len - 1;
  return (const StowGpu *const *)cat->gpus->pdata;
}

const StowNode *const *
stow_node_presets (gsize *n)
{
  Catalog *cat = catalog ();
  if (n)
    *n = cat->nodes->len - 1;
  return (const StowNode *const *)cat->nodes->pdata;
}

/* Exact (folded) match over names and aliases; NULL when none. */
const StowGpu *
stow_hw_gpu_find (const char *name)
{
  gsize n;
  const StowGpu *const *gpus = stow_gpu_catalog (&n);
  g_autofree char *want = stow_hw_fold_name (name);
  for (gsize i = 0; i < n; i++)
    {
      g_autofree char *canon = stow_hw_fold_name (gpus[i]->name);
      if (strcmp (canon, want) == 0)
        return gpus[i];
      for (char **a = gpus[i]->aliases; *a; a++)
        {
          g_autofree char *alias = stow_hw_fold_name (*a);
          if (strcmp (alias, want) == 0)
            return gpus[i];
        }
    }
  return NULL;
}

const StowGpu *
stow_hw_gpu_find_device (const char *device_name)
{
  static const char *const prefixes[] = { "nvidia ", "amd ", "instinct " };
  const StowGpu *g = stow_hw_gpu_find (device_name);
  const char *p = device_name;
  gboolean stripped = TRUE;
  while (g == NULL && stripped)
    {
      stripped = FALSE;
      for (gsize i = 0; i < G_N_ELEMENTS (prefixes); i++)
        if (g_ascii_strncasecmp (p, prefixes[i], strlen (prefixes[i])) == 0)
          {
            p += strlen (prefixes[i]);
            stripped = TRUE;
          }
      if (stripped)
        g = stow_hw_gpu_find (p);
    }
  return g;
}

/* The canonical name of the entry closest to @name, or NULL. */
static const char *
suggest_gpu (const char *name)
{
  gsize n;
  const StowGpu *const *gpus = stow_gpu_catalog (&n);
  g_autoptr (GPtrArray) words = g_ptr_array_new ();
  g_autoptr (GPtrArray) owners = g_ptr_array_new ();
  for (gsize i = 0; i < n; i++)
    {
      g_ptr_array_add (words, gpus[i]->name);
      g_ptr_array_add (owners, (gpointer)gpus[i]);
      for (char **a = gpus[i]->aliases; *a; a++)
        {
          g_ptr_array_add (words, *a);
          g_ptr_array_add (owners, (gpointer)gpus[i]);
        }
    }
  const char *best
      = stow_suggest (name, (const char *const *)words->pdata, words->len);
  if (best == NULL)
    return NULL;
  for (guint i = 0; i < words->len; i++)
    if (words->pdata[i] == best)
      return ((const StowGpu *)owners->pdata[i])->name;
  return NULL;
}

char *
stow_hw_gpu_names (void)
{
  gsize n;
  const StowGpu *const *gpus = stow_gpu_catalog (&n);
  GString *s = g_string_new (NULL);
  for (gsize i = 0; i < n; i++)
    g_string_append_printf (s, "%s%s", i ? ", " : "", gpus[i]->name);
  return g_string_free (s, FALSE);
}

const StowGpu *
stow_gpu_lookup (const char *name, GError **error)
{
  g_return_val_if_fail (name != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  const StowGpu *g = stow_hw_gpu_find (name);
  if (g)
    return g;
  const char *hint = suggest_gpu (name);
  if (hint)
    g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                 "unknown GPU \"%s\" (did you mean %s?)", name, hint);
  else
    {
      g_autofree char *all = stow_hw_gpu_names ();
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                   "unknown GPU \"%s\" (known: %s; see 'stowage gpus')", name,
                   all);
    }
  return NULL;
}

const StowNode *
stow_node_preset_lookup (const char *name, GError **error)
{
  g_return_val_if_fail (name != NULL, NULL);
  gsize n;
  const StowNode *const *nodes = stow_node_presets (&n);
  for (gsize i = 0; i < n; i++)
    if (g_ascii_strcasecmp (nodes[i]->name, name) == 0)
      return nodes[i];

  g_autoptr (GPtrArray) words = g_ptr_array_new ();
  GString *all = g_string_new (NULL);
  for (gsize i = 0; i < n; i++)
    {
      g_ptr_array_add (words, nodes[i]->name);
      g_string_append_printf (all, "%s%s", i ? ", " : "", nodes[i]->name);
    }
  g_autofree char *known = g_string_free (all, FALSE);
  const char *hint
      = stow_suggest (name, (const char *const *)words->pdata, words->len);
  if (hint)
    g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                 "unknown node preset \"%s\" (did you mean %s?)", name, hint);
  else
    g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                 "unknown node preset \"%s\" (known: %s)", name, known);
  return NULL;
}

void
stow_gpu_copy (const StowGpu *src, StowGpu *dst)
{
  *dst = *src;
  dst->name = g_strdup (src->name);
  dst->aliases = g_strdupv (src->aliases);
  dst->vendor = g_strdup (src->vendor);
  dst->description = g_strdup (src->description);
  dst->preset = g_strdup (src->preset);
}

void
stow_gpu_clear (StowGpu *gpu)
{
  g_clear_pointer (&gpu->name, g_free);
  g_clear_pointer (&gpu->aliases, g_strfreev);
  g_clear_pointer (&gpu->vendor, g_free);
  g_clear_pointer (&gpu->description, g_free);
  g_clear_pointer (&gpu->preset, g_free);
}

void
stow_node_copy (const StowNode *src, StowNode *dst)
{
  *dst = *src;
  dst->name = g_strdup (src->name);
  dst->description = g_strdup (src->description);
  dst->net_kind = g_strdup (src->net_kind);
  dst->profile = g_strdup (src->profile);
  stow_gpu_copy (&src->gpu, &dst->gpu);
  dst->nvme = g_new0 (StowNvme, src->n_nvme ? src->n_nvme : 1);
  for (guint i = 0; i < src->n_nvme; i++)
    {
      dst->nvme[i] = src->nvme[i];
      dst->nvme[i].path = g_strdup (src->nvme[i].path);
    }
}

void
stow_node_clear (StowNode *node)
{
  g_clear_pointer (&node->name, g_free);
  g_clear_pointer (&node->description, g_free);
  g_clear_pointer (&node->net_kind, g_free);
  g_clear_pointer (&node->profile, g_free);
  stow_gpu_clear (&node->gpu);
  for (guint i = 0; i < node->n_nvme; i++)
    g_free (node->nvme[i].path);
  g_clear_pointer (&node->nvme, g_free);
  node->n_nvme = 0;
}

const StowGpu *
stow_gpu_find_device (const char *device_name)
{
  return stow_hw_gpu_find_device (device_name);
}
