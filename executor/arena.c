/* SPDX-License-Identifier: MIT
 *
 * executor/arena.c: the cpu backend's device memory (executor/arena.h).
 * Free runs are kept in address order and merged with their neighbours
 * on release; allocation takes the first run that fits, so a step's
 * stack-like pattern (persistent state first, then activations in forward
 * order, freed in reverse) reuses the same addresses every step.
 */
#include "executor/arena.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

typedef struct
{
  guint64 offset, bytes;
} Run;

struct _StowArena
{
  guint8 *base;
  gboolean owned; /* base was mapped here (else the caller's memory) */
  guint64 capacity;
  guint64 in_use, peak;
  GArray *free_runs;  /* Run, by offset */
  GHashTable *blocks; /* offset -> rounded bytes */
};

static guint64
round_up (guint64 n)
{
  return (n + STOW_ARENA_ALIGN - 1) / STOW_ARENA_ALIGN * STOW_ARENA_ALIGN;
}

StowArena *
stow_arena_new (guint64 capacity_bytes, GError **error)
{
  guint64 cap = round_up (MAX (capacity_bytes, 1));
  void *p = mmap (NULL, cap, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    {
      int e = errno;
      g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_NOMEM,
                   "cannot reserve %" G_GUINT64_FORMAT
                   " bytes for the device arena: %s",
                   cap, g_strerror (e));
      return NULL;
    }
  StowArena *a = stow_arena_new_over (p, capacity_bytes);
  a->owned = TRUE;
  return a;
}

StowArena *
stow_arena_new_over (void *base, guint64 capacity_bytes)
{
  guint64 cap = round_up (MAX (capacity_bytes, 1));
  StowArena *a = g_new0 (StowArena, 1);
  a->base = base;
  a->capacity = capacity_bytes;
  a->free_runs = g_array_new (FALSE, FALSE, sizeof (Run));
  Run all = { 0, cap };
  g_array_append_val (a->free_runs, all);
  a->blocks
      = g_hash_table_new_full (g_int64_hash, g_int64_equal, g_free, g_free);
  return a;
}

void
stow_arena_free (StowArena *a)
{
  if (a == NULL)
    return;
  if (a->owned)
    munmap (a->base, round_up (MAX (a->capacity, 1)));
  g_array_unref (a->free_runs);
  g_hash_table_unref (a->blocks);
  g_free (a);
}

void *
stow_arena_alloc (StowArena *a, guint64 bytes, gboolean *fragmented)
{
  static guint8 empty[STOW_ARENA_ALIGN]
      __attribute__ ((aligned (STOW_ARENA_ALIGN)));
  if (fragmented)
    *fragmented = FALSE;
  if (bytes == 0)
    return empty;
  guint64 need = round_up (bytes);
  if (need > a->capacity || a->in_use + need > a->capacity)
    return NULL;
  for (guint i = 0; i < a->free_runs->len; i++)
    {
      Run *r = &g_array_index (a->free_runs, Run, i);
      if (r->bytes < need)
        continue;
      guint64 off = r->offset;
      r->offset += need, r->bytes -= need;
      if (r->bytes == 0)
        g_array_remove_index (a->free_runs, i);
      gint64 *key = g_new (gint64, 1);
      guint64 *val = g_new (guint64, 1);
      *key = (gint64)off, *val = need;
      g_hash_table_insert (a->blocks, key, val);
      a->in_use += need;
      a->peak = MAX (a->peak, a->in_use);
      return a->base + off;
    }
  if (fragmented)
    *fragmented = TRUE;
  return NULL;
}

void
stow_arena_release (StowArena *a, void *block)
{
  if (block == NULL || (guint8 *)block < a->base
      || (guint8 *)block >= a->base + round_up (MAX (a->capacity, 1)))
    return; /* NULL, or the empty block of a 0-byte buffer */
  gint64 off = (guint8 *)block - a->base;
  guint64 *sz = g_hash_table_lookup (a->blocks, &off);
  g_return_if_fail (sz != NULL);
  Run run = { (guint64)off, *sz };
  g_hash_table_remove (a->blocks, &off);
  a->in_use -= run.bytes;
  /* Insert in address order, merging with the neighbours. */
  guint i = 0;
  while (i < a->free_runs->len
         && g_array_index (a->free_runs, Run, i).offset < run.offset)
    i++;
  g_array_insert_val (a->free_runs, i, run);
  if (i + 1 < a->free_runs->len)
    {
      Run *cur = &g_array_index (a->free_runs, Run, i);
      Run *next = &g_array_index (a->free_runs, Run, i + 1);
      if (cur->offset + cur->bytes == next->offset)
        {
          cur->bytes += next->bytes;
          g_array_remove_index (a->free_runs, i + 1);
        }
    }
  if (i > 0)
    {
      Run *prev = &g_array_index (a->free_runs, Run, i - 1);
      Run *cur = &g_array_index (a->free_runs, Run, i);
      if (prev->offset + prev->bytes == cur->offset)
        {
          prev->bytes += cur->bytes;
          g_array_remove_index (a->free_runs, i);
        }
    }
}

guint64
stow_arena_capacity (const StowArena *a)
{
  return a->capacity;
}

guint64
stow_arena_in_use (const StowArena *a)
{
  return a->in_use;
}

guint64
stow_arena_peak (const StowArena *a)
{
  return a->peak;
}

void
stow_arena_reset_peak (StowArena *a)
{
  a->peak = a->in_use;
}
