/* SPDX-License-Identifier: MIT
 *
 * executor/preflight.c: what `stowage train` checks before anything is
 * loaded (executor/preflight.h).
 */
#include "executor/preflight.h"

#include <string.h>
#include <sys/resource.h>

#include "core/units.h"

/* clang-format off */
G_DEFINE_QUARK (stow-preflight-error-quark, stow_preflight_error)
/* clang-format on */

/* Bytes of memory the kernel says a new process can have without
 * swapping (MemAvailable), or 0 when it does not say. */
static guint64
mem_available (void)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents ("/proc/meminfo", &text, NULL, NULL))
    return 0;
  const char *p = strstr (text, "MemAvailable:");
  if (p == NULL)
    return 0;
  return g_ascii_strtoull (p + strlen ("MemAvailable:"), NULL, 10) * 1024;
}

/* Before anything is loaded: the host memory the simulated step holds at
 * its peak (the program's pinned and pageable host buffers; with the cpu
 * backend the device arena's peak too) against what the host has free.
 * Refused with the figures rather than found by the OOM killer half way
 * through a load.  The NVMe directories are checked when the store
 * reserves their space. */
gboolean
stow_preflight_host (const StowTrace *tr, gboolean cuda, GError **error)
{
  guint64 pinned = tr->peak_bytes[STOW_TIER_PINNED];
  guint64 pageable = tr->peak_bytes[STOW_TIER_HOST];
  guint64 arena = cuda ? 0 : tr->peak_bytes[STOW_TIER_DEVICE];
  guint64 need = pinned + pageable + arena;
  guint64 avail = mem_available ();
  if (avail == 0 || need <= avail)
    return TRUE;
  g_autofree char *n = stow_format_bytes (need);
  g_autofree char *a = stow_format_bytes (avail);
  g_autofree char *pi = stow_format_bytes (pinned);
  g_autofree char *pa = stow_format_bytes (pageable);
  g_autofree char *ar = stow_format_bytes (arena);
  g_set_error (error, STOW_PREFLIGHT_ERROR, STOW_PREFLIGHT_ERROR_HOST_MEMORY,
               "host memory: the planned step holds %s at its peak (pinned "
               "buffers %s, pageable %s%s%s) and this host has %s available "
               "(MemAvailable); put the optimizer on NVMe "
               "(--offload-optimizer nvme), or lower --micro-batch or "
               "--device-memory",
               n, pi, pa, cuda ? "" : ", the cpu backend's device arena ",
               cuda ? "" : ar, a);
  return FALSE;
}

/* TRUE when the process may lock any amount of memory (CAP_IPC_LOCK in
 * its effective set, from /proc/self/status). */
static gboolean
can_lock_any (void)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents ("/proc/self/status", &text, NULL, NULL))
    return FALSE;
  const char *p = strstr (text, "CapEff:");
  if (p == NULL)
    return FALSE;
  guint64 caps = g_ascii_strtoull (p + strlen ("CapEff:"), NULL, 16);
  return (caps >> 14) & 1; /* CAP_IPC_LOCK */
}

/* The cpu backend locks the program's pinned buffers (mlock): before
 * anything is loaded, RLIMIT_MEMLOCK must cover the simulated pinned peak
 * (plus a page per buffer of rounding).  The soft limit is raised to the
 * hard one when that is enough; otherwise refused with the figures and
 * the ways to raise it, or, with --allow-unpinned, run pageable. */
gboolean
stow_preflight_memlock (const StowProgram *p, const StowTrace *tr,
                        guint64 test_limit, gboolean allow_unpinned,
                        char **pageable, GError **error)
{
  *pageable = NULL;
  guint64 need = tr->peak_bytes[STOW_TIER_PINNED];
  if (need == 0)
    return TRUE;
  guint n_pinned = 0;
  for (guint i = 0; i < p->buffers->len; i++)
    n_pinned
        += g_array_index (p->buffers, StowBuffer, i).tier == STOW_TIER_PINNED;
  need += (guint64)n_pinned * 4096;
  struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };
  gboolean any = FALSE;
  if (test_limit)
    rl.rlim_cur = rl.rlim_max = test_limit;
  else
    {
      any = can_lock_any ();
      getrlimit (RLIMIT_MEMLOCK, &rl);
    }
  if (any || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
    return TRUE;
  if (!test_limit && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need))
    {
      struct rlimit up = { rl.rlim_max, rl.rlim_max };
      if (setrlimit (RLIMIT_MEMLOCK, &up) == 0)
        return TRUE;
    }
  g_autofree char *n = stow_format_bytes (need);
  g_autofree char *soft = stow_format_bytes (rl.rlim_cur);
  g_autofree char *hard = rl.rlim_max == RLIM_INFINITY
                              ? g_strdup ("unlimited")
                              : stow_format_bytes (rl.rlim_max);
  if (allow_unpinned)
    {
      *pageable = g_strdup_printf (
          "pinned host buffers: %s to lock, RLIMIT_MEMLOCK %s (hard %s): "
          "running them pageable (--allow-unpinned)",
          n, soft, hard);
      return TRUE;
    }
  g_set_error (error, STOW_PREFLIGHT_ERROR, STOW_PREFLIGHT_ERROR_MEMLOCK,
               "pinned host memory: the planned step locks %s (the program's "
               "pinned buffers at their peak) and RLIMIT_MEMLOCK is %s (hard "
               "limit %s); raise it ('ulimit -l %" G_GUINT64_FORMAT
               "' or unlimited, a memlock line in "
               "/etc/security/limits.conf, LimitMEMLOCK= in a systemd unit), "
               "or run with the buffers pageable (--allow-unpinned)",
               n, soft, hard, (need + 1023) / 1024);
  return FALSE;
}
