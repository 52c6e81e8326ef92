/* SPDX-License-Identifier: MIT
 *
 * executor/dl.c: the run-time loading that backends/cuda/cublas-dl.cu and
 * comm/nccl.c share (dl.h).  Not here: which symbols each resolves.
 */
#include "executor/dl.h"

#include <dlfcn.h>

void *
stow_dlopen_first (const char *const *names, guint n, const char *what,
                   GQuark domain, int code, GError **error)
{
  g_autoptr (GString) tried = g_string_new (NULL);
  for (guint i = 0; i < n; i++)
    {
      void *lib = dlopen (names[i], RTLD_NOW | RTLD_LOCAL);
      if (lib != NULL)
        return lib;
      g_string_append_printf (tried, "%s%s", tried->len ? "; " : "",
                              dlerror ());
    }
  g_set_error (error, domain, code, "%s not found: %s", what, tried->str);
  return NULL;
}

gboolean
stow_dl_once (StowDlOnce *once, gboolean (*load) (GError **error),
              GQuark domain, int code, GError **error)
{
  g_mutex_lock (&once->lock);
  if (!once->loaded && once->failure == NULL)
    {
      GError *local = NULL;
      if (load (&local))
        once->loaded = TRUE;
      else
        {
          once->failure = g_strdup (local->message);
          g_error_free (local);
        }
    }
  gboolean ok = once->loaded;
  if (!ok)
    g_set_error_literal (error, domain, code, once->failure);
  g_mutex_unlock (&once->lock);
  return ok;
}
