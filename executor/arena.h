/* SPDX-License-Identifier: MIT
 *
 * executor/arena.h: a capacity-limited region of host memory standing for
 * a device's memory (for the cuda backend, the bookkeeping over the
 * device's own): one reservation (mmap, touched as used and kept for
 * the run, so a step's buffers fault their pages in once), carved
 * first-fit into 64-byte-aligned blocks.  It counts the bytes in use and
 * their peak, which is what the planner predicts.  Not thread-safe: the
 * cpu backend serialises alloc and free.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define STOW_ARENA_ALIGN 64

typedef struct _StowArena StowArena;

/* Reserves @capacity_bytes of address space (no memory is committed until
 * touched).  NULL with G_FILE_ERROR_NOMEM when even the reservation
 * fails. */
StowArena *stow_arena_new (guint64 capacity_bytes, GError **error);
/* The same bookkeeping over memory the caller owns (a device allocation
 * of at least @capacity_bytes rounded up to STOW_ARENA_ALIGN): the arena
 * never touches it, and hands out addresses inside it. */
StowArena *stow_arena_new_over (void *base, guint64 capacity_bytes);
void stow_arena_free (StowArena *arena);

/* A block of @bytes (rounded up to STOW_ARENA_ALIGN), or NULL when the
 * arena cannot hold it; *@fragmented (may be NULL) then says whether the
 * bytes would fit but no single free run does.  Never fails for 0 bytes
 * (a non-NULL pointer to no bytes). */
void *stow_arena_alloc (StowArena *arena, guint64 bytes, gboolean *fragmented);
void stow_arena_release (StowArena *arena, void *block);

guint64 stow_arena_capacity (const StowArena *arena);
guint64 stow_arena_in_use (const StowArena *arena);
guint64 stow_arena_peak (const StowArena *arena);
void stow_arena_reset_peak (StowArena *arena);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowArena, stow_arena_free)

G_END_DECLS
