/* SPDX-License-Identifier: MIT
 *
 * executor/model-io.c: weights between safetensors files and units
 * (executor/model-io.h).
 */
#include "executor/model-io.h"

#include <math.h>
#include <string.h>

#include "executor/safetensors.h"
#include "offload/adam.h" /* the bf16/fp16 conversions */

/* Elements converted per piece: bounds the staging memory. */
#define PIECE ((guint64)1 << 20)

static const StowUnitTensor *
tensor_at (const StowProgram *p, const StowUnit *u, guint k)
{
  return &g_array_index (p->unit_tensors, StowUnitTensor, u->first_tensor + k);
}

static void
convert (const void *src, const char *sdt, void *dst, StowDtype ddt, guint64 n)
{
  for (guint64 i = 0; i < n; i++)
    {
      float x;
      if (g_str_equal (sdt, "F32"))
        x = ((const float *)src)[i];
      else if (g_str_equal (sdt, "BF16"))
        x = stow_bf16_to_f32 (((const guint16 *)src)[i]);
      else
        x = stow_f16_to_f32 (((const guint16 *)src)[i]);
      if (ddt == STOW_DTYPE_F32)
        ((float *)dst)[i] = x;
      else if (ddt == STOW_DTYPE_BF16)
        ((guint16 *)dst)[i] = stow_f32_to_bf16 (x);
      else
        ((guint16 *)dst)[i] = stow_f32_to_f16 (x);
    }
}

static gboolean
same_dtype (const char *sdt, StowDtype d)
{
  return g_str_equal (sdt, stow_dtype_name (d));
}

gboolean
stow_model_io_load (const StowProgram *p, const char *path, StowDtype dtype,
                    StowUnitWeightsFn get, gpointer user, GError **error)
{
  g_autoptr (StowSafetensors) st = stow_safetensors_open (path, error);
  if (st == NULL)
    return FALSE;
  guint esz = stow_dtype_size (dtype);
  g_autofree guint8 *stage = NULL;
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      guint8 *dst = get (user, ui);
      if (dst == NULL)
        continue;
      for (guint k = 0; k < u->n_tensors; k++)
        {
          const StowUnitTensor *t = tensor_at (p, u, k);
          const StowSafetensor *s = stow_safetensors_find (st, t->name);
          if (s == NULL)
            {
              g_set_error (error, STOW_SAFETENSORS_ERROR,
                           STOW_SAFETENSORS_ERROR_MISSING,
                           "%s: tensor \"%s\" is missing", path, t->name);
              return FALSE;
            }
          gboolean shape_ok = s->n_dims == t->n_dims;
          for (guint d = 0; shape_ok && d < t->n_dims; d++)
            shape_ok = s->shape[d] == t->shape[d];
          if (!shape_ok)
            {
              GString *want = g_string_new ("[");
              GString *got = g_string_new ("[");
              for (guint d = 0; d < t->n_dims; d++)
                g_string_append_printf (want, "%s%" G_GUINT64_FORMAT,
                                        d ? ", " : "", t->shape[d]);
              for (guint d = 0; d < s->n_dims; d++)
                g_string_append_printf (got, "%s%" G_GUINT64_FORMAT,
                                        d ? ", " : "", s->shape[d]);
              g_set_error (error, STOW_SAFETENSORS_ERROR,
                           STOW_SAFETENSORS_ERROR_INVALID,
                           "%s: tensor \"%s\": shape %s], the model's "
                           "config.json makes it %s]",
                           path, t->name, got->str, want->str);
              g_string_free (want, TRUE);
              g_string_free (got, TRUE);
              return FALSE;
            }
          if (!g_str_equal (s->dtype, "F32") && !g_str_equal (s->dtype, "BF16")
              && !g_str_equal (s->dtype, "F16"))
            {
              g_set_error (error, STOW_SAFETENSORS_ERROR,
                           STOW_SAFETENSORS_ERROR_INVALID,
                           "%s: tensor \"%s\": dtype %s (expected F32, BF16 "
                           "or F16)",
                           path, t->name, s->dtype);
              return FALSE;
            }
          guint8 *out = dst + t->offset * esz;
          if (same_dtype (s->dtype, dtype))
            {
              if (!stow_safetensors_read (st, s, 0, out, s->nbytes, error))
                return FALSE;
              continue;
            }
          guint ssz = stow_safetensors_dtype_size (s->dtype);
          if (stage == NULL)
            stage = g_malloc (PIECE * 4);
          for (guint64 i = 0; i < t->numel; i += PIECE)
            {
              guint64 c = MIN (PIECE, t->numel - i);
              if (!stow_safetensors_read (st, s, i * ssz, stage, c * ssz,
                                          error))
                return FALSE;
              convert (stage, s->dtype, out + i * esz, dtype, c);
            }
        }
    }
  return TRUE;
}

gboolean
stow_model_io_save (const StowProgram *p, const char *path, StowDtype dtype,
                    StowUnitWeightsFn get, gpointer user, GError **error)
{
  g_autoptr (GArray) specs
      = g_array_new (FALSE, TRUE, sizeof (StowSafetensorSpec));
  for (guint i = 0; i < p->unit_tensors->len; i++)
    {
      const StowUnitTensor *t
          = &g_array_index (p->unit_tensors, StowUnitTensor, i);
      StowSafetensorSpec s
          = { t->name, stow_dtype_name (dtype), { 0 }, t->n_dims };
      for (guint d = 0; d < t->n_dims; d++)
        s.shape[d] = t->shape[d];
      g_array_append_val (specs, s);
    }
  g_autoptr (StowSafetensorsWriter) w = stow_safetensors_writer_new (
      path, (StowSafetensorSpec *)specs->data, specs->len, NULL, error);
  if (w == NULL)
    return FALSE;
  guint esz = stow_dtype_size (dtype);
  for (guint ui = 0; ui < p->units->len; ui++)
    {
      const StowUnit *u = &g_array_index (p->units, StowUnit, ui);
      const guint8 *src = get (user, ui);
      if (src == NULL)
        {
          g_set_error (error, STOW_SAFETENSORS_ERROR,
                       STOW_SAFETENSORS_ERROR_INVALID,
                       "%s: the weights of unit %u are not at hand", path, ui);
          return FALSE;
        }
      if (!stow_safetensors_writer_write (w, src, u->numel * esz, error))
        return FALSE;
    }
  return stow_safetensors_writer_finish (w, error);
}

/* ---- initialisation -------------------------------------------------------
 */

typedef struct
{
  guint64 s[4];
} Rng;

static guint64
splitmix64 (guint64 *x)
{
  guint64 z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static guint64
rotl (guint64 x, int k)
{
  return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman and Vigna 2018). */
static guint64
next (Rng *r)
{
  guint64 *s = r->s;
  guint64 result = rotl (s[1] * 5, 7) * 9;
  guint64 t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl (s[3], 45);
  return result;
}

/* A uniform double in (0, 1]. */
static double
uniform (Rng *r)
{
  return ((double)(next (r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void
stow_model_io_init_unit (const StowProgram *p, guint unit, double std,
                         guint64 seed, StowDtype dtype, void *dst)
{
  const StowUnit *u = &g_array_index (p->units, StowUnit, unit);
  guint64 x = seed ^ (0xa0761d6478bd642fULL * (unit + 1));
  Rng r;
  for (int i = 0; i < 4; i++)
    r.s[i] = splitmix64 (&x);
  guint esz = stow_dtype_size (dtype);
  for (guint k = 0; k < u->n_tensors; k++)
    {
      const StowUnitTensor *t = tensor_at (p, u, k);
      guint8 *out = (guint8 *)dst + t->offset * esz;
      gboolean is_bias = g_str_has_suffix (t->name, ".bias");
      gboolean is_norm = t->role == STOW_ROLE_NORM;
      for (guint64 i = 0; i < t->numel; i++)
        {
          float v;
          if (is_norm)
            v = 1.0f;
          else if (is_bias)
            v = 0.0f;
          else
            {
              /* Box-Muller: one normal per pair of uniforms (the second is
               * dropped, so element i depends on i alone). */
              double u1 = uniform (&r), u2 = uniform (&r);
              v = (float)(std * sqrt (-2.0 * log (u1)) * cos (2.0 * G_PI * u2));
            }
          convert (&v, "F32", out + i * esz, dtype, 1);
        }
    }
}
