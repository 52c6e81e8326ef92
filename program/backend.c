/* SPDX-License-Identifier: MIT
 *
 * program/backend.c: what all backends share: the error domain and the
 * generic destructor.
 */
#include "program/backend.h"

/* clang-format off */
G_DEFINE_QUARK (stow-backend-error-quark, stow_backend_error)
/* clang-format on */

gboolean
stow_backend_unsupported_op (const StowProgram *p, guint op,
                             const char *backend, const char *why,
                             GError **error)
{
  g_autofree char *what = stow_op_describe (p, op);
  g_set_error (
      error, STOW_BACKEND_ERROR, STOW_BACKEND_ERROR_UNSUPPORTED,
      "op %s: the %s backend does not run %s ops yet (%s)", what, backend,
      stow_op_kind_name (g_array_index (p->ops, StowOp, op).kind), why);
  return FALSE;
}

void
stow_backend_free (StowBackend *b)
{
  if (b != NULL && b->vt->destroy != NULL)
    b->vt->destroy (b);
}
