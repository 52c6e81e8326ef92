/* SPDX-License-Identifier: MIT
 *
 * core/dtype.c: element types (core/dtype.h).
 */
#include "core/dtype.h"

#include <string.h>

const char *
stow_dtype_name (StowDtype d)
{
  static const char *const names[] = { "F32", "BF16", "F16" };
  g_return_val_if_fail (d <= STOW_DTYPE_F16, "?");
  return names[d];
}

const char *
stow_dtype_nick (StowDtype d)
{
  switch (d)
    {
    case STOW_DTYPE_NONE:
      return "none";
    case STOW_DTYPE_F32:
      return "fp32";
    case STOW_DTYPE_BF16:
      return "bf16";
    case STOW_DTYPE_F16:
      return "fp16";
    }
  return "?";
}

gboolean
stow_dtype_from_nick (const char *name, StowDtype *out)
{
  static const struct
  {
    const char *name;
    StowDtype type;
  } names[] = {
    { "none", STOW_DTYPE_NONE },   { "fp32", STOW_DTYPE_F32 },
    { "f32", STOW_DTYPE_F32 },     { "float32", STOW_DTYPE_F32 },
    { "bf16", STOW_DTYPE_BF16 },   { "bfloat16", STOW_DTYPE_BF16 },
    { "fp16", STOW_DTYPE_F16 },    { "f16", STOW_DTYPE_F16 },
    { "float16", STOW_DTYPE_F16 },
  };
  g_return_val_if_fail (name != NULL && out != NULL, FALSE);
  for (gsize i = 0; i < G_N_ELEMENTS (names); i++)
    if (g_ascii_strcasecmp (name, names[i].name) == 0)
      {
        *out = names[i].type;
        return TRUE;
      }
  return FALSE;
}

guint
stow_dtype_size (StowDtype d)
{
  switch (d)
    {
    case STOW_DTYPE_F32:
      return 4;
    case STOW_DTYPE_BF16:
    case STOW_DTYPE_F16:
      return 2;
    default:
      return 0;
    }
}
