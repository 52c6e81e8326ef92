/* SPDX-License-Identifier: MIT
 *
 * core/dtype.h: the one element-type enum: what a tensor's elements are
 * (weights, gradients, activations, optimizer states, a checkpoint's
 * tensors), with the names users type and the names safetensors writes.
 */
#pragma once

#include <glib.h>
#include <string.h>

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

/* An fp32's bits, and back (inline: the conversions' loops vectorise). */
static inline guint32
stow_f32_bits (float x)
{
  guint32 b;
  memcpy (&b, &x, sizeof b);
  return b;
}

static inline float
stow_bits_f32 (guint32 b)
{
  float x;
  memcpy (&x, &b, sizeof x);
  return x;
}

/* bf16 <-> fp32.  Widening is exact; narrowing rounds to nearest even on
 * the 16 bits dropped (a carry into the exponent is the right answer, up
 * to infinity), and a NaN becomes the quiet 0x7fc0. */
static inline float
stow_bf16_to_f32 (guint16 h)
{
  return stow_bits_f32 ((guint32)h << 16);
}

static inline guint16
stow_f32_to_bf16 (float x)
{
  guint32 b = stow_f32_bits (x);
  guint16 r = (guint16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  return (b & 0x7fffffffu) > 0x7f800000u ? (guint16)0x7fc0 : r;
}

G_END_DECLS
