/* SPDX-License-Identifier: MIT
 *
 * hw/cluster.c: clusters of identical nodes, built from a --gpus spec
 * ("8xA100-80GB", "64xH100-SXM", "4x8xH200", "local") or a cluster.json (a
 * preset or a GPU plus overrides).  Every error names the input and, for
 * files, the field and the value.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/strutil.h"
#include "core/units.h"
#include "hw/hw-private.h"
#include "hw/hw.h"
#include "hw/machine.h"

/* More GPUs than this in one spec is a typo, not a cluster. */
#define STOW_HW_MAX_GPUS     (1u << 20)
#define STOW_HW_MAX_PER_NODE 1024u
/* Rates and sizes past these are typos too (the fastest GPU in the catalog
 * does 2,250 bf16 TFLOP/s and 7.7 TB/s): refused, the limit named, so
 * that no product of them overflows into nonsense. */
#define STOW_HW_MAX_TFLOPS  1e6                /* 1 EFLOP/s per GPU */
#define STOW_HW_MAX_BW      1e15               /* 1 PB/s */
#define STOW_HW_MAX_BYTES   ((guint64)1 << 60) /* 1 EiB */
#define STOW_HW_MAX_SECONDS 60.0
/* ... and rates so small that a step would take longer than a double can
 * count (1e-320 TFLOP/s made the step time infinite). */
#define STOW_HW_MIN_TFLOPS 1e-3 /* 1 GFLOP/s */
#define STOW_HW_MIN_BW     1e6  /* 1 MB/s */

/* ---- values of cluster.json and preset files ---------------------------- */

/* "-1", "\"4k\"", "an object": the value as the user wrote it. */
static char *
describe (JsonNode *n)
{
  if (JSON_NODE_HOLDS_VALUE (n))
    {
      GType t = json_node_get_value_type (n);
      if (t == G_TYPE_INT64)
        return g_strdup_printf ("%" G_GINT64_FORMAT, json_node_get_int (n));
      if (t == G_TYPE_DOUBLE)
        return g_strdup_printf ("%g", json_node_get_double (n));
      if (t == G_TYPE_STRING)
        return g_strdup_printf ("\"%s\"", json_node_get_string (n));
    }
  return stow_json_describe (n);
}

static gboolean
bad_value (JsonNode *n, const char *where, const char *member,
           const char *expected, GError **error)
{
  g_autofree char *desc = describe (n);
  g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
               "%s: %s: expected %s, got %s", where, member, expected, desc);
  return FALSE;
}

/* The member's value, or NULL when absent or null. */
static JsonNode *
member (JsonObject *obj, const char *name)
{
  JsonNode *n = json_object_get_member (obj, name);
  return n && !JSON_NODE_HOLDS_NULL (n) ? n : NULL;
}

static gboolean
number_of (JsonNode *n, double *out)
{
  if (!JSON_NODE_HOLDS_VALUE (n))
    return FALSE;
  GType t = json_node_get_value_type (n);
  if (t != G_TYPE_INT64 && t != G_TYPE_DOUBLE)
    return FALSE;
  *out = json_node_get_double (n);
  return isfinite (*out);
}

static gboolean
get_uint (JsonObject *obj, const char *where, const char *name, guint max,
          guint *out, GError **error)
{
  JsonNode *n = member (obj, name);
  double d;
  if (n == NULL)
    return TRUE;
  if (!number_of (n, &d) || d != floor (d) || d < 1)
    return bad_value (n, where, name, "a positive integer", error);
  if (d > max)
    {
      g_autofree char *desc = describe (n);
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: %s: %s is too large (at most %u)", where, name, desc,
                   max);
      return FALSE;
    }
  *out = (guint)d;
  return TRUE;
}

static const char *
get_str (JsonObject *obj, const char *where, const char *name, GError **error)
{
  JsonNode *n = member (obj, name);
  if (n == NULL)
    return NULL;
  if (!JSON_NODE_HOLDS_VALUE (n)
      || json_node_get_value_type (n) != G_TYPE_STRING)
    {
      bad_value (n, where, name, "a string", error);
      return NULL;
    }
  return json_node_get_string (n);
}

typedef enum
{
  QTY_SIZE,
  QTY_BANDWIDTH,
  QTY_DURATION,
} Quantity;

/* A size, bandwidth or duration: a number in base units (bytes, bytes/s,
 * seconds) or a string with a unit ("2TiB", "400Gb/s", "2us").  Zero is
 * refused unless @allow_zero. */
static gboolean
get_qty (JsonObject *obj, const char *where, const char *name, Quantity q,
         gboolean allow_zero, double *out, GError **error)
{
  static const char *const expected[] = {
    [QTY_SIZE] = "a size such as \"512GiB\" or a positive number of bytes",
    [QTY_BANDWIDTH]
    = "a bandwidth such as \"25GB/s\" or a positive number of bytes/s",
    [QTY_DURATION] = "a duration such as \"2us\" or a number of seconds",
  };
  JsonNode *n = member (obj, name);
  double v = 0;
  if (n == NULL)
    return TRUE;
  if (JSON_NODE_HOLDS_VALUE (n)
      && json_node_get_value_type (n) == G_TYPE_STRING)
    {
      const char *text = json_node_get_string (n);
      g_autoptr (GError) local = NULL;
      gboolean ok;
      if (q == QTY_SIZE)
        {
          guint64 bytes = 0;
          ok = stow_parse_size (text, &bytes, &local);
          v = (double)bytes;
        }
      else if (q == QTY_BANDWIDTH)
        ok = stow_parse_bandwidth (text, &v, &local);
      else
        ok = stow_parse_duration (text, &v, &local);
      if (!ok)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: %s: %s", where, name, local->message);
          return FALSE;
        }
    }
  else if (!number_of (n, &v))
    return bad_value (n, where, name, expected[q], error);
  if (v < 0 || (v == 0 && !allow_zero) || !isfinite (v))
    return bad_value (n, where, name, expected[q], error);
  static const double max[] = { [QTY_SIZE] = (double)STOW_HW_MAX_BYTES,
                                [QTY_BANDWIDTH] = STOW_HW_MAX_BW,
                                [QTY_DURATION] = STOW_HW_MAX_SECONDS };
  static const char *const max_text[] = {
    [QTY_SIZE] = "1 EiB", [QTY_BANDWIDTH] = "1 PB/s", [QTY_DURATION] = "60 s"
  };
  if (v > max[q])
    {
      g_autofree char *desc = describe (n);
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: %s: %s is too large (at most %s)", where, name, desc,
                   max_text[q]);
      return FALSE;
    }
  if (q == QTY_SIZE && v != floor (v))
    return bad_value (n, where, name, expected[q], error);
  if (q == QTY_BANDWIDTH && v > 0 && v < STOW_HW_MIN_BW)
    {
      g_autofree char *desc = describe (n);
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: %s: %s is too small (at least 1 MB/s)", where, name,
                   desc);
      return FALSE;
    }
  *out = v;
  return TRUE;
}

static gboolean
get_size (JsonObject *obj, const char *where, const char *name, guint64 *out,
          GError **error)
{
  double v = (double)*out;
  if (!get_qty (obj, where, name, QTY_SIZE, FALSE, &v, error))
    return FALSE;
  *out = (guint64)v;
  return TRUE;
}

/* Unknown members are refused (a typo would otherwise be ignored
 * silently), with a did-you-mean hint. */
static gboolean
check_members (JsonObject *obj, const char *where, const char *const *known,
               GError **error)
{
  g_autoptr (GList) names = json_object_get_members (obj);
  for (GList *l = names; l; l = l->next)
    {
      if (g_strv_contains (known, l->data))
        continue;
      const char *hint
          = stow_suggest (l->data, known, g_strv_length ((char **)known));
      if (hint)
        g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                     "%s: unknown field \"%s\" (did you mean %s?)", where,
                     (const char *)l->data, hint);
      else
        g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                     "%s: unknown field \"%s\"", where, (const char *)l->data);
      return FALSE;
    }
  return TRUE;
}

static gboolean
get_object (JsonObject *obj, const char *where, const char *name,
            JsonObject **out, GError **error)
{
  JsonNode *n = member (obj, name);
  *out = NULL;
  if (n == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_OBJECT (n))
    return bad_value (n, where, name, "an object", error);
  *out = json_node_get_object (n);
  return TRUE;
}

/* ---- GPU overrides ------------------------------------------------------ */

static const char *const gpu_fields[] = {
  "name",        "total_memory", "bf16_tflops", "fp16_tflops", "fp32_tflops",
  "tf32_tflops", "fp8_tflops",   "hbm_bw",      "nvlink_bw",   "nvlink_domain",
  "pcie_gen",    "pcie_bw",      "comment",     NULL,
};

/* "gpu": "H100-SXM", or an object with "name" plus overrides, or an object
 * without a name describing a GPU the catalog lacks. */
static gboolean
gpu_from_json (JsonNode *n, const char *where, StowGpu *gpu, GError **error)
{
  g_autoptr (GError) local = NULL;
  if (JSON_NODE_HOLDS_VALUE (n)
      && json_node_get_value_type (n) == G_TYPE_STRING)
    {
      const StowGpu *g = stow_gpu_lookup (json_node_get_string (n), &local);
      if (g == NULL)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                       "%s: gpu: %s", where, local->message);
          return FALSE;
        }
      stow_gpu_clear (gpu);
      stow_gpu_copy (g, gpu);
      return TRUE;
    }
  if (!JSON_NODE_HOLDS_OBJECT (n))
    return bad_value (n, where, "gpu",
                      "a GPU name such as \"H100-SXM\" or an object", error);

  JsonObject *o = json_node_get_object (n);
  g_autofree char *w = g_strdup_printf ("%s: gpu", where);
  if (!check_members (o, w, gpu_fields, error))
    return FALSE;
  const char *name = get_str (o, w, "name", &local);
  if (local)
    {
      g_propagate_error (error, g_steal_pointer (&local));
      return FALSE;
    }
  if (name)
    {
      const StowGpu *g = stow_gpu_lookup (name, &local);
      if (g == NULL)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                       "%s: name: %s", w, local->message);
          return FALSE;
        }
      stow_gpu_clear (gpu);
      stow_gpu_copy (g, gpu);
    }
  else
    {
      /* A GPU the catalog does not know: memory and bf16 rate are the least
       * the planner needs. */
      if (!member (o, "total_memory") || !member (o, "bf16_tflops"))
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: expected \"name\" (a catalog GPU) or both "
                       "\"total_memory\" and \"bf16_tflops\"",
                       w);
          return FALSE;
        }
      stow_gpu_clear (gpu);
      memset (gpu, 0, sizeof *gpu);
      gpu->name = g_strdup ("custom");
      gpu->aliases = g_new0 (char *, 1);
      gpu->vendor = g_strdup ("unknown");
      gpu->description = g_strdup ("described in the cluster file");
      gpu->nvlink_domain = 1;
    }

  struct
  {
    const char *name;
    double *field;
  } tflops[] = {
    { "bf16_tflops", &gpu->bf16_flops }, { "fp16_tflops", &gpu->fp16_flops },
    { "fp32_tflops", &gpu->fp32_flops }, { "tf32_tflops", &gpu->tf32_flops },
    { "fp8_tflops", &gpu->fp8_flops },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (tflops); i++)
    {
      JsonNode *v = member (o, tflops[i].name);
      double d;
      if (v == NULL)
        continue;
      /* A GPU the catalog lacks is planned on its bf16 rate: it must be
       * positive. */
      if (!number_of (v, &d) || d < 0 || (d == 0 && !name && i == 0))
        return bad_value (v, w, tflops[i].name,
                          !name && i == 0 ? "a positive number of TFLOP/s"
                                          : "a non-negative number of TFLOP/s",
                          error);
      if (d > 0 && d < STOW_HW_MIN_TFLOPS)
        {
          g_autofree char *desc = describe (v);
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: %s: %s is too small (at least 0.001 TFLOP/s, or "
                       "0 for none)",
                       w, tflops[i].name, desc);
          return FALSE;
        }
      if (d > STOW_HW_MAX_TFLOPS)
        {
          g_autofree char *desc = describe (v);
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: %s: %s is too large (at most %.0f TFLOP/s)", w,
                       tflops[i].name, desc, STOW_HW_MAX_TFLOPS);
          return FALSE;
        }
      *tflops[i].field = d * 1e12;
    }
  if (!get_size (o, w, "total_memory", &gpu->total_bytes, error)
      || !get_qty (o, w, "hbm_bw", QTY_BANDWIDTH, FALSE, &gpu->hbm_bw, error)
      || !get_qty (o, w, "nvlink_bw", QTY_BANDWIDTH, TRUE, &gpu->nvlink_bw,
                   error)
      || !get_uint (o, w, "nvlink_domain", STOW_HW_MAX_PER_NODE,
                    &gpu->nvlink_domain, error)
      || !get_uint (o, w, "pcie_gen", 7, &gpu->pcie_gen, error)
      || !get_qty (o, w, "pcie_bw", QTY_BANDWIDTH, FALSE, &gpu->pcie_bw, error))
    return FALSE;
  /* Every precision falls back to bf16 or fp16 (planner/cost.c): one of
   * them must be left. */
  if (gpu->bf16_flops <= 0 && gpu->fp16_flops <= 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: bf16_tflops and fp16_tflops are both 0; give the "
                   "GPU's dense bf16 (or fp16) rate",
                   w);
      return FALSE;
    }
  stow_gpu_fill_defaults (gpu);
  return TRUE;
}

double
stow_pcie_practical_bw (guint gen)
{
  /* Gen3 12, Gen4 25, Gen5 50 GB/s per direction: about 80% of an x16
   * link's 15.8, 31.5 and 63 GB/s; each generation doubles. */
  static const double bw[] = { 3e9, 6e9, 12e9, 25e9, 50e9, 100e9, 200e9 };
  return bw[CLAMP (gen, 1, G_N_ELEMENTS (bw)) - 1];
}

void
stow_gpu_fill_defaults (StowGpu *gpu)
{
  g_return_if_fail (gpu != NULL);
  if (gpu->fp16_flops <= 0 && gpu->bf16_flops > 0)
    {
      gpu->fp16_flops = gpu->bf16_flops;
      gpu->defaulted |= STOW_GPU_DEFAULT_FP16;
    }
  if (gpu->hbm_bw <= 0)
    {
      double peak = gpu->bf16_flops > 0 ? gpu->bf16_flops : gpu->fp16_flops;
      gpu->hbm_bw = peak > 0 ? peak / 200.0 : 1e12;
      gpu->defaulted |= STOW_GPU_DEFAULT_HBM;
    }
  if (gpu->pcie_gen == 0)
    {
      gpu->pcie_gen = 4;
      gpu->defaulted |= STOW_GPU_DEFAULT_PCIE_GEN;
    }
  if (gpu->pcie_bw <= 0)
    {
      gpu->pcie_bw = stow_pcie_practical_bw (gpu->pcie_gen);
      gpu->defaulted |= STOW_GPU_DEFAULT_PCIE_BW;
    }
}

/* ---- node objects ------------------------------------------------------- */

static const char *const node_fields[] = {
  "name",       "description", "gpu",       "gpus_per_node",
  "host_ram",   "host_mem_bw", "cpu_cores", "sockets",
  "numa_nodes", "nvme",        "network",   "sources",
  "comment",    "format",      "version",   NULL,
};
static const char *const cluster_fields[] = {
  "name",       "description", "gpu",       "gpus_per_node",
  "host_ram",   "host_mem_bw", "cpu_cores", "sockets",
  "numa_nodes", "nvme",        "network",   "sources",
  "comment",    "format",      "version",   "preset",
  "nodes",      "profile",     NULL,
};
static const char *const nvme_fields[]
    = { "path", "count", "capacity", "read_bw", "write_bw", "comment", NULL };
static const char *const net_fields[]
    = { "kind", "per_gpu", "latency", "comment", NULL };

static gboolean
nvme_from_json (JsonNode *n, const char *where, StowNode *node, GError **error)
{
  if (!JSON_NODE_HOLDS_ARRAY (n))
    return bad_value (n, where, "nvme", "an array of drives", error);
  JsonArray *arr = json_node_get_array (n);
  GArray *drives = g_array_new (FALSE, TRUE, sizeof (StowNvme));
  for (guint i = 0; i < json_array_get_length (arr); i++)
    {
      g_autofree char *w = g_strdup_printf ("%s: nvme[%u]", where, i);
      JsonNode *e = json_array_get_element (arr, i);
      StowNvme d = { 0 };
      guint count = 1;
      const char *path;
      JsonObject *o;
      GError *local = NULL;
      if (!JSON_NODE_HOLDS_OBJECT (e))
        {
          g_autofree char *desc = describe (e);
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: expected an object with capacity, read_bw and "
                       "write_bw, got %s",
                       w, desc);
          goto fail;
        }
      o = json_node_get_object (e);
      path = get_str (o, w, "path", &local);
      if (local)
        {
          g_propagate_error (error, local);
          goto fail;
        }
      if (!check_members (o, w, nvme_fields, error)
          || !get_uint (o, w, "count", 64, &count, error)
          || !get_size (o, w, "capacity", &d.capacity_bytes, error)
          || !get_qty (o, w, "read_bw", QTY_BANDWIDTH, FALSE, &d.read_bw, error)
          || !get_qty (o, w, "write_bw", QTY_BANDWIDTH, FALSE, &d.write_bw,
                       error))
        goto fail;
      if (path && count != 1)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: count: a drive with a path is one drive, got %u", w,
                       count);
          goto fail;
        }
      if (d.capacity_bytes == 0 || d.read_bw == 0 || d.write_bw == 0)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: %s: required field is missing", w,
                       d.capacity_bytes == 0 ? "capacity"
                       : d.read_bw == 0      ? "read_bw"
                                             : "write_bw");
          goto fail;
        }
      for (guint k = 0; k < count; k++)
        {
          StowNvme c = d;
          c.path = g_strdup (path);
          g_array_append_val (drives, c);
        }
      if (drives->len > 256)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: more than 256 drives per node", w);
          goto fail;
        }
    }
  for (guint i = 0; i < node->n_nvme; i++)
    g_free (node->nvme[i].path);
  g_free (node->nvme);
  node->n_nvme = drives->len;
  node->nvme = (StowNvme *)g_array_free (drives, FALSE);
  return TRUE;

fail:
  for (guint i = 0; i < drives->len; i++)
    g_free (g_array_index (drives, StowNvme, i).path);
  g_array_free (drives, TRUE);
  return FALSE;
}

gboolean
stow_hw_node_from_json (JsonObject *obj, const char *where, gboolean preset,
                        StowNode *node, GError **error)
{
  GError *local = NULL;
  JsonNode *n;
  JsonObject *net = NULL;
  const char *s;

  if (!check_members (obj, where, preset ? node_fields : cluster_fields, error))
    return FALSE;
  if (preset)
    {
      static const char *const required[]
          = { "name",        "gpu",       "gpus_per_node", "host_ram",
              "host_mem_bw", "cpu_cores", "numa_nodes",    NULL };
      for (const char *const *r = required; *r; r++)
        if (!member (obj, *r))
          {
            g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                         "%s: %s: required field is missing", where, *r);
            return FALSE;
          }
    }

  if ((s = get_str (obj, where, "name", &local)) != NULL)
    {
      g_free (node->name);
      node->name = g_strdup (s);
    }
  if (!local && (s = get_str (obj, where, "description", &local)) != NULL)
    {
      g_free (node->description);
      node->description = g_strdup (s);
    }
  if (local)
    {
      g_propagate_error (error, local);
      return FALSE;
    }
  if ((n = member (obj, "gpu")) != NULL
      && !gpu_from_json (n, where, &node->gpu, error))
    return FALSE;

  double ram = (double)node->host_ram_bytes;
  if (!get_uint (obj, where, "gpus_per_node", STOW_HW_MAX_PER_NODE,
                 &node->gpus_per_node, error)
      || !get_qty (obj, where, "host_ram", QTY_SIZE, FALSE, &ram, error)
      || !get_qty (obj, where, "host_mem_bw", QTY_BANDWIDTH, FALSE,
                   &node->host_mem_bw, error)
      || !get_uint (obj, where, "cpu_cores", 1u << 20, &node->cpu_cores, error)
      || !get_uint (obj, where, "sockets", 64, &node->sockets, error)
      || !get_uint (obj, where, "numa_nodes", 1024, &node->numa_nodes, error))
    return FALSE;
  node->host_ram_bytes = (guint64)ram;

  if ((n = member (obj, "nvme")) != NULL
      && !nvme_from_json (n, where, node, error))
    return FALSE;

  if (!get_object (obj, where, "network", &net, error))
    return FALSE;
  if (net)
    {
      g_autofree char *w = g_strdup_printf ("%s: network", where);
      if (!check_members (net, w, net_fields, error)
          || !get_qty (net, w, "per_gpu", QTY_BANDWIDTH, TRUE,
                       &node->net_bw_per_gpu, error)
          || !get_qty (net, w, "latency", QTY_DURATION, TRUE,
                       &node->net_latency_s, error))
        return FALSE;
      if ((s = get_str (net, w, "kind", &local)) != NULL)
        {
          g_free (node->net_kind);
          node->net_kind = g_strdup (s);
        }
      if (local)
        {
          g_propagate_error (error, local);
          return FALSE;
        }
    }

  if (preset)
    {
      if (node->gpu.name == NULL)
        g_error ("%s: gpu not resolved", where);
      if (node->sockets == 0)
        node->sockets = 1;
      if (node->nvme == NULL)
        node->nvme = g_new0 (StowNvme, 1);
    }
  /* A GPU's NVLink domain cannot reach past its node. */
  node->gpu.nvlink_domain
      = MAX (1u, MIN (node->gpu.nvlink_domain, node->gpus_per_node));
  return TRUE;
}

/* ---- clusters ----------------------------------------------------------- */

StowCluster *
stow_cluster_new (const StowNode *node, guint n_nodes, const char *spec)
{
  g_return_val_if_fail (node != NULL, NULL);
  g_return_val_if_fail (n_nodes > 0, NULL);
  StowCluster *c = g_new0 (StowCluster, 1);
  c->ref_count = 1;
  stow_node_copy (node, &c->node);
  /* No rate the time model divides by is left at zero, whoever built the
   * node (a cluster file, a plan file, this machine). */
  stow_gpu_fill_defaults (&c->node.gpu);
  c->node.gpu.nvlink_domain
      = MAX (1u, MIN (c->node.gpu.nvlink_domain, c->node.gpus_per_node));
  c->n_nodes = n_nodes;
  c->n_gpus = n_nodes * node->gpus_per_node;
  c->spec = g_strdup (spec ? spec : node->name);
  return c;
}

StowCluster *
stow_cluster_ref (StowCluster *cluster)
{
  g_return_val_if_fail (cluster != NULL, NULL);
  g_atomic_int_inc (&cluster->ref_count);
  return cluster;
}

void
stow_cluster_unref (StowCluster *cluster)
{
  if (cluster == NULL)
    return;
  if (!g_atomic_int_dec_and_test (&cluster->ref_count))
    return;
  stow_node_clear (&cluster->node);
  g_free (cluster->spec);
  g_free (cluster);
}

/* The node a GPU runs in when only its name is given: its preset with the
 * GPU swapped in (an A100-40GB runs in a DGX A100 chassis). */
static void
default_node (const StowGpu *gpu, StowNode *out)
{
  const StowNode *preset = stow_node_preset_lookup (gpu->preset, NULL);
  if (preset == NULL)
    g_error ("built-in catalog: %s: preset \"%s\" does not exist", gpu->name,
             gpu->preset);
  stow_node_copy (preset, out);
  stow_gpu_clear (&out->gpu);
  stow_gpu_copy (gpu, &out->gpu);
}

static StowCluster *spec_error (GError **error, gint code, const char *spec,
                                const char *fmt, ...) G_GNUC_PRINTF (4, 5);

static StowCluster *
spec_error (GError **error, gint code, const char *spec, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  g_autofree char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error (error, STOW_HW_ERROR, code, "--gpus \"%s\": %s", spec, msg);
  return NULL;
}

static StowCluster *
cluster_local (const char *spec, GError **error)
{
  g_autoptr (GError) local = NULL;
  g_autoptr (StowMachine) m = stow_machine_discover (NULL, &local);
  if (m == NULL)
    return spec_error (error, STOW_HW_ERROR_NOT_FOUND, spec,
                       "cannot inspect this machine: %s", local->message);
  StowCluster *c = stow_cluster_new_from_machine (m, &local);
  if (c == NULL)
    return spec_error (
        error,
        g_error_matches (local, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND)
            ? STOW_HW_ERROR_NOT_FOUND
            : STOW_HW_ERROR_INVALID,
        spec, "%s", local->message);
  g_free (c->spec);
  c->spec = g_strdup (spec);
  return c;
}

StowCluster *
stow_cluster_new_from_spec (const char *spec, GError **error)
{
  g_return_val_if_fail (spec != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  g_autofree char *text = g_strstrip (g_strdup (spec));
  if (*text == '\0')
    return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                       "empty GPU spec (expected COUNTxGPU such as "
                       "8xA100-80GB, or NODESxGPUSxGPU such as 4x8xH200)");
  if (g_ascii_strcasecmp (text, "local") == 0)
    return cluster_local (spec, error);

  /* Leading counts, each followed by 'x': "4x8xH200" -> {4, 8}, "H200".
   * Digits not followed by 'x' belong to the name ("8x4090"). */
  guint64 counts[2] = { 0, 0 };
  guint n_counts = 0;
  const char *p = text;
  if (*p == '-' || *p == '+')
    return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                       "a GPU count must be a positive integer");
  while (g_ascii_isdigit (*p))
    {
      const char *q = p;
      while (g_ascii_isdigit (*q))
        q++;
      if (*q != 'x' && *q != 'X')
        break;
      if (n_counts == 2)
        return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                           "too many counts (expected COUNTxGPU or "
                           "NODESxGPUSxGPU)");
      g_autofree char *digits = g_strndup (p, (gsize)(q - p));
      guint64 v = 0;
      if (!g_ascii_string_to_unsigned (digits, 10, 0, G_MAXUINT64, &v, NULL)
          || v > STOW_HW_MAX_GPUS)
        return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                           "count %s is too large (at most %u GPUs)", digits,
                           STOW_HW_MAX_GPUS);
      if (v == 0)
        return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                           "a GPU count must be a positive integer, got 0");
      counts[n_counts++] = v;
      p = q + 1;
    }
  if (*p == '\0')
    return spec_error (error, STOW_HW_ERROR_INVALID, spec,
                       "missing the GPU name after the count (e.g. "
                       "%sxA100-80GB)",
                       n_counts ? "8" : "");

  g_autoptr (GError) local = NULL;
  const StowGpu *gpu = stow_gpu_lookup (p, &local);
  if (gpu == NULL)
    return spec_error (error, STOW_HW_ERROR_NOT_FOUND, spec, "%s",
                       local->message);

  StowNode node = { 0 };
  default_node (gpu, &node);
  guint per_node = node.gpus_per_node;
  guint64 n_nodes = 1, gpn = 1;
  StowCluster *c = NULL;

  if (n_counts == 1)
    {
      guint64 n = counts[0];
      if (n <= per_node)
        gpn = n;
      else if (n % per_node == 0)
        {
          gpn = per_node;
          n_nodes = n / per_node;
        }
      else
        {
          guint64 lo = n / per_node * per_node;
          spec_error (error, STOW_HW_ERROR_INVALID, spec,
                      "%" G_GUINT64_FORMAT " GPUs is not a multiple of the "
                      "%u GPUs in a %s node (hint: %" G_GUINT64_FORMAT
                      "x%s or %" G_GUINT64_FORMAT "x%s, or give nodes and "
                      "GPUs per node as NODESxGPUSx%s)",
                      n, per_node, node.name, lo, gpu->name, lo + per_node,
                      gpu->name, gpu->name);
          goto out;
        }
    }
  else if (n_counts == 2)
    {
      n_nodes = counts[0];
      gpn = counts[1];
      if (gpn > per_node)
        {
          spec_error (error, STOW_HW_ERROR_INVALID, spec,
                      "%" G_GUINT64_FORMAT " GPUs per node, but a %s node "
                      "holds at most %u (describe larger nodes in a "
                      "--cluster file)",
                      gpn, node.name, per_node);
          goto out;
        }
      if (n_nodes * gpn > STOW_HW_MAX_GPUS)
        {
          spec_error (error, STOW_HW_ERROR_INVALID, spec,
                      "%" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
                      " GPUs is too many (at most %u)",
                      n_nodes, gpn, STOW_HW_MAX_GPUS);
          goto out;
        }
    }
  node.gpus_per_node = (guint)gpn;
  c = stow_cluster_new (&node, (guint)n_nodes, spec);
  /* The host side is the preset's, a guess at the user's machine. */
  c->host_ram_assumed = c->nvme_assumed = TRUE;
out:
  stow_node_clear (&node);
  return c;
}

/* @base_dir: where a relative "profile" path starts (NULL: the current
 * directory). */
static StowCluster *
cluster_from_json (JsonObject *obj, const char *where, const char *base_dir,
                   GError **error)
{
  g_autoptr (GError) local = NULL;
  StowNode node = { 0 };
  StowCluster *c = NULL;
  guint n_nodes = 1;
  g_autofree char *profile_path = NULL;
  const char *profile;

  if (!check_members (obj, where, cluster_fields, error))
    return NULL;
  const char *preset_name = get_str (obj, where, "preset", &local);
  if (local)
    {
      g_propagate_error (error, g_steal_pointer (&local));
      return NULL;
    }
  JsonNode *gpu = member (obj, "gpu");
  if (preset_name)
    {
      const StowNode *preset = stow_node_preset_lookup (preset_name, &local);
      if (preset == NULL)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                       "%s: preset: %s", where, local->message);
          return NULL;
        }
      stow_node_copy (preset, &node);
    }
  else if (gpu)
    {
      /* The GPU's own preset supplies the host side; a custom GPU object
       * gets the generic PCIe server. */
      StowGpu g = { 0 };
      if (!gpu_from_json (gpu, where, &g, error))
        {
          /* it may have filled some of g before the bad field */
          stow_gpu_clear (&g);
          return NULL;
        }
      const StowNode *preset
          = stow_node_preset_lookup (g.preset ? g.preset : "pcie-8gpu", NULL);
      g_assert (preset != NULL);
      stow_node_copy (preset, &node);
      stow_gpu_clear (&g);
    }
  else
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: expected \"preset\" (e.g. \"dgx-h100\") or \"gpu\" "
                   "(e.g. \"H100-SXM\")",
                   where);
      return NULL;
    }
  g_free (node.name);
  node.name = g_strdup (preset_name ? preset_name : "custom");

  if (!stow_hw_node_from_json (obj, where, FALSE, &node, error)
      || !get_uint (obj, where, "nodes", STOW_HW_MAX_GPUS, &n_nodes, error))
    goto out;
  if ((guint64)n_nodes * node.gpus_per_node > STOW_HW_MAX_GPUS)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: nodes: %u nodes of %u GPUs is too many (at most %u "
                   "GPUs)",
                   where, n_nodes, node.gpus_per_node, STOW_HW_MAX_GPUS);
      goto out;
    }
  profile = get_str (obj, where, "profile", &local);
  if (local)
    {
      g_propagate_error (error, g_steal_pointer (&local));
      goto out;
    }
  profile_path = profile && base_dir && !g_path_is_absolute (profile)
                     ? g_build_filename (base_dir, profile, NULL)
                     : g_strdup (profile);
  if (profile && !stow_node_apply_profile (&node, profile_path, &local))
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: profile: %s", where, local->message);
      goto out;
    }
  c = stow_cluster_new (&node, n_nodes, where);
  c->host_ram_assumed = !member (obj, "host_ram") && !profile;
  c->nvme_assumed = !member (obj, "nvme");
out:
  stow_node_clear (&node);
  return c;
}

StowCluster *
stow_cluster_with_host (const StowCluster *cluster, guint64 host_ram_bytes,
                        gboolean set_nvme, guint n_nvme,
                        guint64 nvme_capacity_bytes)
{
  g_return_val_if_fail (cluster != NULL, NULL);
  StowNode node;
  stow_node_copy (&cluster->node, &node);
  if (host_ram_bytes)
    node.host_ram_bytes = host_ram_bytes;
  if (set_nvme)
    {
      /* Gen4 M.2: 7 GB/s read, 5 GB/s write (the workstation preset's). */
      StowNvme like = { NULL, 0, 7e9, 5e9 };
      if (node.n_nvme > 0)
        like.read_bw = node.nvme[0].read_bw,
        like.write_bw = node.nvme[0].write_bw;
      for (guint i = 0; i < node.n_nvme; i++)
        g_free (node.nvme[i].path);
      g_free (node.nvme);
      node.nvme = g_new0 (StowNvme, MAX (n_nvme, 1));
      for (guint i = 0; i < n_nvme; i++)
        {
          node.nvme[i] = like;
          node.nvme[i].capacity_bytes = nvme_capacity_bytes;
        }
      node.n_nvme = n_nvme;
    }
  StowCluster *c = stow_cluster_new (&node, cluster->n_nodes, cluster->spec);
  stow_node_clear (&node);
  c->host_ram_assumed = cluster->host_ram_assumed && host_ram_bytes == 0;
  c->nvme_assumed = cluster->nvme_assumed && !set_nvme;
  return c;
}

/* A probe profile given as the cluster: one node of its GPUs, their
 * catalog preset for what was not measured. */
static StowCluster *
cluster_from_profile (JsonObject *obj, const char *path, GError **error)
{
  JsonArray *gpus = NULL;
  if (!stow_json_get_array (obj, path, "gpus", FALSE, &gpus, error))
    return NULL;
  guint n = gpus ? json_array_get_length (gpus) : 0;
  if (n == 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND,
                   "%s: gpus: the profile lists no GPU; name it as "
                   "\"profile\" in a cluster.json with a \"preset\" or a "
                   "\"gpu\"",
                   path);
      return NULL;
    }
  const StowGpu *kind = NULL;
  guint64 total = 0;
  for (guint i = 0; i < n; i++)
    {
      g_autofree char *w = g_strdup_printf ("%s: gpus[%u]", path, i);
      JsonNode *e = json_array_get_element (gpus, i);
      if (!JSON_NODE_HOLDS_OBJECT (e))
        {
          g_autofree char *desc = describe (e);
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: expected an object, got %s", w, desc);
          return NULL;
        }
      JsonObject *o = json_node_get_object (e);
      GError *local = NULL;
      const char *name = get_str (o, w, "catalog", &local);
      if (local)
        {
          g_propagate_error (error, local);
          return NULL;
        }
      const StowGpu *g = name ? stow_gpu_lookup (name, &local) : NULL;
      if (g == NULL)
        {
          g_set_error (
              error, STOW_HW_ERROR, STOW_HW_ERROR_NOT_FOUND, "%s: catalog: %s",
              w, local ? local->message : "the GPU is not in the catalog");
          g_clear_error (&local);
          return NULL;
        }
      if (kind && g != kind)
        {
          g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                       "%s: catalog: %s differs from %s; plans need "
                       "identical GPUs",
                       w, g->name, kind->name);
          return NULL;
        }
      kind = g;
      if (!get_size (o, w, "total_bytes", &total, error))
        return NULL;
    }
  StowNode node = { 0 };
  default_node (kind, &node);
  g_free (node.name);
  node.name = g_strdup ("profile");
  node.gpus_per_node = n;
  node.gpu.nvlink_domain = MAX (1u, MIN (node.gpu.nvlink_domain, n));
  if (total)
    node.gpu.total_bytes = total;
  StowCluster *c = NULL;
  if (stow_node_apply_profile (&node, path, error))
    c = stow_cluster_new (&node, 1, path);
  stow_node_clear (&node);
  return c;
}

StowCluster *
stow_cluster_new_from_json (JsonObject *obj, const char *where, GError **error)
{
  g_return_val_if_fail (obj != NULL, NULL);
  g_return_val_if_fail (where != NULL, NULL);
  return cluster_from_json (obj, where, NULL, error);
}

StowCluster *
stow_cluster_new_from_file (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_autoptr (JsonNode) root
      = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, error);
  if (root == NULL)
    return NULL;
  JsonObject *obj = stow_json_root_object (root, path, error);
  if (obj == NULL)
    return NULL;
  const char *format = NULL;
  if (stow_json_has (obj, "format")
      && stow_json_get_string (obj, path, "format", FALSE, &format, NULL)
      && format && strcmp (format, "stowage-hw-profile") == 0)
    return cluster_from_profile (obj, path, error);

  /* A relative profile path is relative to the cluster file. */
  g_autofree char *dir = g_path_get_dirname (path);
  return cluster_from_json (obj, path, dir, error);
}

/* ---- probe profiles ----------------------------------------------------- */

gboolean
stow_node_apply_profile (StowNode *node, const char *path, GError **error)
{
  g_return_val_if_fail (node != NULL && path != NULL, FALSE);
  g_autoptr (JsonNode) root
      = stow_json_parse_file (path, STOW_JSON_MAX_BYTES, error);
  if (root == NULL)
    return FALSE;
  JsonObject *obj = stow_json_root_object (root, path, error);
  if (obj == NULL)
    return FALSE;
  const char *format = NULL;
  GError *local = NULL;
  format = get_str (obj, path, "format", &local);
  if (local)
    {
      g_propagate_error (error, local);
      return FALSE;
    }
  if (format == NULL || strcmp (format, "stowage-hw-profile") != 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: format: expected \"stowage-hw-profile\", got %s%s%s",
                   path, format ? "\"" : "", format ? format : "nothing",
                   format ? "\"" : "");
      return FALSE;
    }
  JsonObject *host = NULL;
  if (!get_object (obj, path, "host", &host, error))
    return FALSE;
  if (host == NULL)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: host: required field is missing", path);
      return FALSE;
    }
  g_autofree char *w = g_strdup_printf ("%s: host", path);
  double bw = 0;
  if (!get_qty (host, w, "mem_bw_triad", QTY_BANDWIDTH, FALSE, &bw, error)
      || !get_uint (host, w, "cores", 1u << 20, &node->cpu_cores, error)
      || !get_uint (host, w, "numa_nodes", 1024, &node->numa_nodes, error)
      || !get_uint (host, w, "sockets", 64, &node->sockets, error)
      || !get_size (host, w, "ram_bytes", &node->host_ram_bytes, error))
    return FALSE;
  if (bw == 0)
    {
      g_set_error (error, STOW_HW_ERROR, STOW_HW_ERROR_INVALID,
                   "%s: mem_bw_triad: required field is missing", w);
      return FALSE;
    }
  node->host_mem_bw = bw;
  g_free (node->profile);
  node->profile = g_strdup (path);
  return TRUE;
}

/* ---- JSON views --------------------------------------------------------- */

JsonNode *
stow_gpu_to_json (const StowGpu *g)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "name", g->name);
  json_builder_set_member_name (b, "aliases");
  json_builder_begin_array (b);
  for (char **a = g->aliases; a && *a; a++)
    json_builder_add_string_value (b, *a);
  json_builder_end_array (b);
  stow_json_set_string (b, "vendor", g->vendor);
  stow_json_set_string (b, "description", g->description);
  struct
  {
    const char *name;
    guint64 v;
  } ints[] = {
    { "marketing_bytes", g->marketing_bytes },
    { "total_bytes", g->total_bytes },
    { "smi_bytes", g->smi_bytes },
    { "nvlink_domain", g->nvlink_domain },
    { "pcie_gen", g->pcie_gen },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ints); i++)
    {
      stow_json_set_i64 (b, ints[i].name, (gint64)ints[i].v);
    }
  struct
  {
    const char *name;
    double v;
  } dbl[] = {
    { "bf16_flops", g->bf16_flops }, { "fp16_flops", g->fp16_flops },
    { "fp32_flops", g->fp32_flops }, { "tf32_flops", g->tf32_flops },
    { "fp8_flops", g->fp8_flops },   { "hbm_bw", g->hbm_bw },
    { "nvlink_bw", g->nvlink_bw },   { "pcie_bw", g->pcie_bw },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (dbl); i++)
    {
      stow_json_set_double (b, dbl[i].name, dbl[i].v);
    }
  if (g->preset)
    {
      stow_json_set_string (b, "preset", g->preset);
    }
  if (g->defaulted)
    {
      /* the rates stowage filled in (docs/hardware.md) */
      static const struct
      {
        guint bit;
        const char *field;
      } bits[] = { { STOW_GPU_DEFAULT_FP16, "fp16_flops" },
                   { STOW_GPU_DEFAULT_HBM, "hbm_bw" },
                   { STOW_GPU_DEFAULT_PCIE_GEN, "pcie_gen" },
                   { STOW_GPU_DEFAULT_PCIE_BW, "pcie_bw" } };
      json_builder_set_member_name (b, "defaulted");
      json_builder_begin_array (b);
      for (gsize i = 0; i < G_N_ELEMENTS (bits); i++)
        if (g->defaulted & bits[i].bit)
          json_builder_add_string_value (b, bits[i].field);
      json_builder_end_array (b);
    }
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

JsonNode *
stow_node_to_json (const StowNode *n)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "name", n->name);
  if (n->description)
    {
      stow_json_set_string (b, "description", n->description);
    }
  json_builder_set_member_name (b, "gpu");
  json_builder_add_value (b, stow_gpu_to_json (&n->gpu));
  stow_json_set_i64 (b, "gpus_per_node", n->gpus_per_node);
  stow_json_set_i64 (b, "host_ram_bytes", (gint64)n->host_ram_bytes);
  stow_json_set_double (b, "host_mem_bw", n->host_mem_bw);
  stow_json_set_i64 (b, "cpu_cores", n->cpu_cores);
  stow_json_set_i64 (b, "sockets", n->sockets);
  stow_json_set_i64 (b, "numa_nodes", n->numa_nodes);
  json_builder_set_member_name (b, "nvme");
  json_builder_begin_array (b);
  for (guint i = 0; i < n->n_nvme; i++)
    {
      json_builder_begin_object (b);
      if (n->nvme[i].path)
        {
          stow_json_set_string (b, "path", n->nvme[i].path);
        }
      stow_json_set_i64 (b, "capacity_bytes",
                         (gint64)n->nvme[i].capacity_bytes);
      stow_json_set_double (b, "read_bw", n->nvme[i].read_bw);
      stow_json_set_double (b, "write_bw", n->nvme[i].write_bw);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
  stow_json_set_double (b, "net_bw_per_gpu", n->net_bw_per_gpu);
  stow_json_set_double (b, "net_latency_s", n->net_latency_s);
  if (n->net_kind)
    {
      stow_json_set_string (b, "net_kind", n->net_kind);
    }
  if (n->profile)
    {
      stow_json_set_string (b, "profile", n->profile);
    }
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

JsonNode *
stow_cluster_to_json (const StowCluster *c)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  stow_json_set_string (b, "spec", c->spec);
  stow_json_set_i64 (b, "n_nodes", c->n_nodes);
  stow_json_set_i64 (b, "n_gpus", c->n_gpus);
  json_builder_set_member_name (b, "node");
  json_builder_add_value (b, stow_node_to_json (&c->node));
  json_builder_end_object (b);
  return json_builder_get_root (b);
}
