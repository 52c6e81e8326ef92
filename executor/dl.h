/* SPDX-License-Identifier: MIT
 *
 * executor/dl.h: libraries loaded at run time (cuBLAS, NCCL), so that no
 * binary links them and every one starts without them: the first of
 * several sonames that loads, and a load done once per process whose
 * failure every later caller hears again.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* dlopen (RTLD_NOW | RTLD_LOCAL) of the first of @names that loads; NULL
 * with @code in @domain, "@what not found: " and each attempt's dlerror,
 * when none does. */
void *stow_dlopen_first (const char *const *names, guint n, const char *what,
                         GQuark domain, int code, GError **error);

/* One load per process, under a lock (zero-initialised, static). */
typedef struct
{
  GMutex lock;
  gboolean loaded;
  char *failure; /* the first failure's message, kept for later calls */
} StowDlOnce;

/* Runs @load the first time; TRUE once it succeeded, else FALSE with its
 * message again (in @domain, @code) on every call. */
gboolean stow_dl_once (StowDlOnce *once, gboolean (*load) (GError **error),
                       GQuark domain, int code, GError **error);

G_END_DECLS
