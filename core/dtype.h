/* SPDX-License-Identifier: MIT
 *
 * core/dtype.h: the one element-type enum: what a tensor's elements are
 * (weights, gradients, activations, optimizer states, a checkpoint's
 * tensors), with the names users type and the names safetensors writes.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* F32 is 0, so that a zeroed buffer description holds fp32. */
typedef enum
{
  STOW_DTYPE_F32,
  STOW_DTYPE_BF16,
  STOW_DTYPE_F16,
  STOW_DTYPE_NONE, /* no tensor (CPU Adam with no output copy) */
} StowDtype;

/* safetensors' names: "F32", "BF16", "F16" ("?" for NONE). */
const char *stow_dtype_name (StowDtype d);
/* What users type and stowage prints: "fp32", "bf16", "fp16", "none". */
const char *stow_dtype_nick (StowDtype d);
/* Accepts the nicks and "f32", "float32", "float16", "bfloat16". */
gboolean stow_dtype_from_nick (const char *name, StowDtype *out);
/* Bytes of one element: 4, 2, 2; 0 for NONE. */
guint stow_dtype_size (StowDtype d);

G_END_DECLS
