/* SPDX-License-Identifier: MIT
 *
 * core/error.c: the core error domain.
 */
#include "core/error.h"

/* clang-format off */
G_DEFINE_QUARK (stow-core-error-quark, stow_core_error)
/* clang-format on */
