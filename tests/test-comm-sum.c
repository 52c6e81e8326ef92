/* SPDX-License-Identifier: MIT
 *
 * tests/test-comm-sum.c: the rank-order sum (executor/comm/comm.h), the
 * rule that makes N ranks' gradients one rank's bytes, against the same
 * additions written one element at a time: fp32 and bf16, 2 to 4
 * contributions, counts around its block of 1,024, and @out a buffer of
 * its own or the first contribution (the in-place path gradient
 * accumulation takes).
 */
#include <string.h>

#include "core/dtype.h"
#include "executor/comm/comm.h"

/* ((c0 + c1) + c2) + ..., rounded to the dtype after each addition. */
static void
reference (void *out, guint8 *const *c, guint n, guint64 count, gboolean bf16)
{
  for (guint64 i = 0; i < count; i++)
    {
      if (bf16)
        {
          guint16 acc = ((const guint16 *)c[0])[i];
          for (guint q = 1; q < n; q++)
            acc = stow_f32_to_bf16 (
                stow_bf16_to_f32 (acc)
                + stow_bf16_to_f32 (((const guint16 *)c[q])[i]));
          ((guint16 *)out)[i] = acc;
        }
      else
        {
          float acc = ((const float *)c[0])[i];
          for (guint q = 1; q < n; q++)
            acc = acc + ((const float *)c[q])[i];
          ((float *)out)[i] = acc;
        }
    }
}

static void
test_rank_order (void)
{
  const guint64 counts[] = { 1, 1023, 1024, 1025, 4100 };
  GRand *rng = g_rand_new_with_seed (7);
  for (guint bf16 = 0; bf16 < 2; bf16++)
    for (guint n = 2; n <= 4; n++)
      for (guint ci = 0; ci < G_N_ELEMENTS (counts); ci++)
        {
          guint64 count = counts[ci], es = bf16 ? 2 : 4;
          guint8 *c[4];
          for (guint q = 0; q < n; q++)
            {
              c[q] = g_malloc (count * es);
              for (guint64 i = 0; i < count; i++)
                {
                  /* Magnitudes apart, so that the order of additions shows. */
                  float v = (float)g_rand_double_range (rng, -1, 1)
                            * (q % 2 ? 1e-3f : 1.0f);
                  if (bf16)
                    ((guint16 *)c[q])[i] = stow_f32_to_bf16 (v);
                  else
                    ((float *)c[q])[i] = v;
                }
            }
          g_autofree void *want = g_malloc (count * es);
          g_autofree void *got = g_malloc (count * es);
          reference (want, c, n, count, bf16);
          StowDtype dt = bf16 ? STOW_DTYPE_BF16 : STOW_DTYPE_F32;
          stow_comm_sum_rank_order (got, (const void *const *)c, n, count, dt);
          g_assert_cmpmem (got, count * es, want, count * es);
          /* Into the first contribution. */
          stow_comm_sum_rank_order (c[0], (const void *const *)c, n, count, dt);
          g_assert_cmpmem (c[0], count * es, want, count * es);
          for (guint q = 0; q < n; q++)
            g_free (c[q]);
        }
  g_rand_free (rng);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/comm/rank-order-sum", test_rank_order);
  return g_test_run ();
}
