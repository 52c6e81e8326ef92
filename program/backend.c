/* SPDX-License-Identifier: MIT
 *
 * program/backend.c: what all backends share: the error domain and the
 * generic destructor.
 */
#include "program/backend.h"

/* clang-format off */
G_DEFINE_QUARK (stow-backend-error-quark, stow_backend_error)
/* clang-format on */

void
stow_backend_free (StowBackend *b)
{
  if (b != NULL && b->vt->destroy != NULL)
    b->vt->destroy (b);
}
