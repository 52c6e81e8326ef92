/* SPDX-License-Identifier: MIT
 *
 * tests/test-units.c: the unit parsers and printers: published-style inputs,
 * every error path, round trips and random inputs.
 */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/units.h"

static void
check_size (const char *text, guint64 expected)
{
  g_autoptr (GError) error = NULL;
  guint64 v = 0;
  g_test_message ("size %s", text);
  g_assert_true (stow_parse_size (text, &v, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (v, ==, expected);
}

static void
check_bad (gboolean (*parse) (const char *, guint64 *, GError **),
           const char *text, int code, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  guint64 v = 12345;
  g_test_message ("bad input \"%s\"", text ? text : "(null)");
  g_assert_false (parse (text, &v, &error));
  g_assert_error (error, STOW_CORE_ERROR, code);
  g_assert_cmpuint (v, ==, 12345); /* untouched on error */
  if (fragment)
    g_assert_nonnull (strstr (error->message, fragment));
  /* The message quotes the input so the user sees what was wrong. */
  if (text && *text)
    g_assert_nonnull (strstr (error->message, text));
}

static void
test_size_valid (void)
{
  const guint64 GiB = 1ull << 30;
  check_size ("0", 0);
  check_size ("512", 512);
  check_size ("512B", 512);
  check_size ("80GB", 80000000000ull);
  check_size ("80gb", 80000000000ull);
  check_size ("80GiB", 80 * GiB);
  check_size ("80 GiB", 80 * GiB);
  check_size ("1.5TB", 1500000000000ull);
  check_size ("1.5TiB", 3 * (1ull << 39));
  check_size ("512M", 512ull << 20);
  check_size ("4K", 4096);
  check_size ("2G", 2 * GiB);
  check_size ("1P", 1ull << 50);
  check_size ("0.5KiB", 512);
  check_size ("1e3", 1000);
  check_size ("1.5e3KB", 1500000);
  check_size ("0.1GiB", 107374182); /* 107374182.4 rounds down */
  check_size ("16383PiB", 16383ull << 50);
  check_size ("18446744073709551615", G_MAXUINT64);
  check_size ("000080GB", 80000000000ull);
  check_size (".5K", 512);
}

static void
test_size_errors (void)
{
  check_bad (stow_parse_size, "", STOW_CORE_ERROR_PARSE, "empty");
  check_bad (stow_parse_size, NULL, STOW_CORE_ERROR_PARSE, "empty");
  check_bad (stow_parse_size, "-5GB", STOW_CORE_ERROR_RANGE, "negative");
  check_bad (stow_parse_size, "GB", STOW_CORE_ERROR_PARSE, "expected a number");
  check_bad (stow_parse_size, ".", STOW_CORE_ERROR_PARSE, "expected a number");
  check_bad (stow_parse_size, "+5", STOW_CORE_ERROR_PARSE, NULL);
  check_bad (stow_parse_size, "5XB", STOW_CORE_ERROR_PARSE, "unknown unit");
  check_bad (stow_parse_size, "5GB junk", STOW_CORE_ERROR_PARSE,
             "unknown unit");
  check_bad (stow_parse_size, "5 ", STOW_CORE_ERROR_PARSE, "unknown unit");
  check_bad (stow_parse_size, "1.2.3", STOW_CORE_ERROR_PARSE, NULL);
  check_bad (stow_parse_size, "18446744073709551616", STOW_CORE_ERROR_RANGE,
             "too large");
  check_bad (stow_parse_size, "16384PiB", STOW_CORE_ERROR_RANGE, "too large");
  check_bad (stow_parse_size, "1e40", STOW_CORE_ERROR_RANGE, "too large");
  check_bad (stow_parse_size, "1e99", STOW_CORE_ERROR_RANGE, "exponent");
  check_bad (stow_parse_size, "1234567890123456789012345678901",
             STOW_CORE_ERROR_RANGE, "digits");
  check_bad (stow_parse_size, "0x10", STOW_CORE_ERROR_PARSE, NULL);
  check_bad (stow_parse_size, "5 G B", STOW_CORE_ERROR_PARSE, NULL);
}

static void
test_count (void)
{
  static const struct
  {
    const char *text;
    guint64 v;
  } ok[] = {
    { "65B", 65000000000ull }, { "6.7B", 6700000000ull },
    { "125M", 125000000ull },  { "1.5T", 1500000000000ull },
    { "7000000", 7000000ull }, { "10k", 10000 },
    { "7.5b", 7500000000ull }, { "175G", 175000000000ull },
    { "0.35M", 350000 },       { "65285660672", 65285660672ull },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ok); i++)
    {
      g_autoptr (GError) error = NULL;
      guint64 v = 0;
      g_assert_true (stow_parse_count (ok[i].text, &v, &error));
      g_assert_no_error (error);
      g_assert_cmpuint (v, ==, ok[i].v);
    }
  check_bad (stow_parse_count, "", STOW_CORE_ERROR_PARSE, "empty");
  check_bad (stow_parse_count, "-7B", STOW_CORE_ERROR_RANGE, "negative");
  check_bad (stow_parse_count, "7 billion", STOW_CORE_ERROR_PARSE,
             "unknown unit");
  check_bad (stow_parse_count, "7GiB", STOW_CORE_ERROR_PARSE, "unknown unit");
  check_bad (stow_parse_count, "99999999T", STOW_CORE_ERROR_RANGE, "too large");
}

static void
test_tokens (void)
{
  guint64 v = 0;
  g_assert_true (stow_parse_tokens ("2k", &v, NULL));
  g_assert_cmpuint (v, ==, 2048);
  g_assert_true (stow_parse_tokens ("128k", &v, NULL));
  g_assert_cmpuint (v, ==, 131072);
  g_assert_true (stow_parse_tokens ("4M", &v, NULL));
  g_assert_cmpuint (v, ==, 4194304);
  g_assert_true (stow_parse_tokens ("2048", &v, NULL));
  g_assert_cmpuint (v, ==, 2048);
  g_assert_true (stow_parse_tokens ("4K", &v, NULL));
  g_assert_cmpuint (v, ==, 4096);
  check_bad (stow_parse_tokens, "4kb", STOW_CORE_ERROR_PARSE, "unknown unit");
  check_bad (stow_parse_tokens, "-1", STOW_CORE_ERROR_RANGE, "negative");
  check_bad (stow_parse_tokens, "k", STOW_CORE_ERROR_PARSE, "number");
  check_bad (stow_parse_tokens, "", STOW_CORE_ERROR_PARSE, "empty");
}

static void
test_duration (void)
{
  static const struct
  {
    const char *text;
    double s;
  } ok[] = {
    { "10ms", 0.010 }, { "1.5s", 1.5 },     { "2m", 120.0 },
    { "2min", 120.0 }, { "1h", 3600.0 },    { "100us", 1e-4 },
    { "5ns", 5e-9 },   { "3", 3.0 },        { "2.5 ms", 0.0025 },
    { "1e-3s", 1e-3 }, { "\xc2\xb5s", -1 }, /* placeholder, skipped */
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ok); i++)
    {
      g_autoptr (GError) error = NULL;
      double v = -1;
      if (ok[i].s < 0)
        continue;
      g_assert_true (stow_parse_duration (ok[i].text, &v, &error));
      g_assert_no_error (error);
      g_assert_cmpfloat_with_epsilon (v, ok[i].s, ok[i].s * 1e-12);
    }
  double v = 0;
  g_assert_true (stow_parse_duration ("7\xc2\xb5s", &v, NULL));
  g_assert_cmpfloat_with_epsilon (v, 7e-6, 1e-18);

  static const char *bad[] = { "", "-1s", "1 sec", "5d", "ms", "1s2" };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      g_assert_false (stow_parse_duration (bad[i], &v, &error));
      g_assert_nonnull (error);
      g_assert_true (error->domain == STOW_CORE_ERROR);
    }
}

static void
test_bandwidth (void)
{
  static const struct
  {
    const char *text;
    double bps;
  } ok[] = {
    { "25GB/s", 25e9 },      { "64GiB/s", 64.0 * 1073741824.0 },
    { "900 GBps", 900e9 },   { "200Gb/s", 25e9 },
    { "100Gbps", 12.5e9 },   { "400Gbit/s", 50e9 },
    { "1.5TB/s", 1.5e12 },   { "3.35TB/s", 3.35e12 },
    { "12.8kB/s", 12800.0 }, { "1000", 1000.0 },
    { "8b/s", 1.0 },         { "1B/s", 1.0 },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (ok); i++)
    {
      g_autoptr (GError) error = NULL;
      double v = -1;
      g_test_message ("bandwidth %s", ok[i].text);
      g_assert_true (stow_parse_bandwidth (ok[i].text, &v, &error));
      g_assert_no_error (error);
      g_assert_cmpfloat_with_epsilon (v, ok[i].bps, ok[i].bps * 1e-12);
    }
  static const char *bad[] = { "",      "-1GB/s", "25GB",     "25XB/s",
                               "25G/s", "GB/s",   "25GB/s/s", "25 GB / s" };
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      double v = 0;
      g_test_message ("bad bandwidth %s", bad[i]);
      g_assert_false (stow_parse_bandwidth (bad[i], &v, &error));
      g_assert_nonnull (error);
      if (*bad[i])
        g_assert_nonnull (strstr (error->message, bad[i]));
    }
}

static void
test_format (void)
{
  static const struct
  {
    guint64 bytes;
    const char *text;
  } cases[] = {
    { 0, "0 B" },
    { 1023, "1023 B" },
    { 1024, "1.00 KiB" },
    { 1536, "1.50 KiB" },
    { 80ull << 30, "80.00 GiB" },
    { 1048575, "1.00 MiB" }, /* 1023.999 KiB rounds to the next unit */
    { 3ull << 39, "1.50 TiB" },
    { G_MAXUINT64, "16.00 EiB" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *s = stow_format_bytes (cases[i].bytes);
      g_assert_cmpstr (s, ==, cases[i].text);
    }
  g_autofree char *g = stow_format_grouped (65285660672ull);
  g_assert_cmpstr (g, ==, "65,285,660,672");
  g_autofree char *g0 = stow_format_grouped (0);
  g_assert_cmpstr (g0, ==, "0");
  g_autofree char *g3 = stow_format_grouped (999);
  g_assert_cmpstr (g3, ==, "999");
  g_autofree char *g4 = stow_format_grouped (1000);
  g_assert_cmpstr (g4, ==, "1,000");
  g_autofree char *gm = stow_format_grouped (G_MAXUINT64);
  g_assert_cmpstr (gm, ==, "18,446,744,073,709,551,615");
  g_autofree char *c = stow_format_count_short (65285660672ull);
  g_assert_cmpstr (c, ==, "65.29B");
  g_autofree char *c2 = stow_format_count_short (124439808ull);
  g_assert_cmpstr (c2, ==, "124.44M");
  g_autofree char *gib = stow_format_gib (24687063040ull);
  g_assert_cmpstr (gib, ==, "22.99");
  g_autofree char *d = stow_format_duration (0.0123);
  g_assert_cmpstr (d, ==, "12.30 ms");
  g_autofree char *d2 = stow_format_duration (13.75);
  g_assert_cmpstr (d2, ==, "13.75 s");
  g_autofree char *b = stow_format_bandwidth (25e9);
  g_assert_cmpstr (b, ==, "25.00 GB/s");
}

/* Printing then parsing comes back within the printed precision. */
static void
test_round_trip (void)
{
  GRand *r = g_rand_new_with_seed (20261122);
  for (int i = 0; i < 20000; i++)
    {
      guint64 v = ((guint64)g_rand_int (r) << 32 | g_rand_int (r))
                  >> g_rand_int_range (r, 0, 64);
      char buf[64];
      guint64 back = 0;
      g_snprintf (buf, sizeof buf, "%" G_GUINT64_FORMAT, v);
      g_assert_true (stow_parse_size (buf, &back, NULL));
      g_assert_cmpuint (back, ==, v);
      g_assert_true (stow_parse_count (buf, &back, NULL));
      g_assert_cmpuint (back, ==, v);

      if (v > G_MAXUINT64 / 2)
        continue; /* "16.00 EiB" rounds past the 64-bit limit */
      g_autofree char *s = stow_format_bytes (v);
      /* "80.00 GiB" parses back as IEC; precision is 0.005 of the unit. */
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_parse_size (s, &back, &error));
      g_assert_no_error (error);
      double rel = v ? fabs ((double)back - (double)v) / (double)v : 0;
      g_assert_cmpfloat (rel, <=, 0.005 / 1.0);
    }
  g_rand_free (r);
}

/* Valid random literals agree with a floating-point reading of the same
 * text; random junk never crashes and always names the input. */
static void
test_random_inputs (void)
{
  static const char *units[]
      = { "", "B", "KB", "MB", "GB", "KiB", "MiB", "GiB", "K", "M", "G" };
  static const double mults[] = { 1,      1,         1e3,         1e6,
                                  1e9,    1024.0,    1048576.0,   1073741824.0,
                                  1024.0, 1048576.0, 1073741824.0 };
  static const char alphabet[] = "0123456789.eE-+ kKmMgGtTbBiI/sp\xc2";
  GRand *r = g_rand_new_with_seed (42);
  for (int i = 0; i < 20000; i++)
    {
      char text[64];
      gsize u = (gsize)g_rand_int_range (r, 0, G_N_ELEMENTS (units));
      guint32 ip = g_rand_int_range (r, 0, 100000);
      guint32 fp = g_rand_int_range (r, 0, 1000);
      g_snprintf (text, sizeof text, "%u.%03u%s", ip, fp, units[u]);
      guint64 v = 0;
      g_autoptr (GError) error = NULL;
      g_assert_true (stow_parse_size (text, &v, &error));
      g_assert_no_error (error);
      double want = ((double)ip + fp / 1000.0) * mults[u];
      if (u == 0 || u == 1)
        want = floor (want + 0.5);
      g_assert_cmpfloat (fabs ((double)v - want), <=, 0.5 + want * 1e-12);
    }
  for (int i = 0; i < 50000; i++)
    {
      char text[16];
      int n = g_rand_int_range (r, 0, (int)sizeof text);
      for (int j = 0; j < n; j++)
        text[j] = alphabet[g_rand_int_range (r, 0, sizeof alphabet - 1)];
      text[n] = '\0';
      guint64 v;
      double d;
      g_autoptr (GError) e1 = NULL;
      g_autoptr (GError) e2 = NULL;
      g_autoptr (GError) e3 = NULL;
      g_autoptr (GError) e4 = NULL;
      g_autoptr (GError) e5 = NULL;
      if (!stow_parse_size (text, &v, &e1))
        g_assert_nonnull (e1);
      if (!stow_parse_count (text, &v, &e2))
        g_assert_nonnull (e2);
      if (!stow_parse_tokens (text, &v, &e3))
        g_assert_nonnull (e3);
      if (!stow_parse_duration (text, &d, &e4))
        g_assert_nonnull (e4);
      else
        g_assert_true (isfinite (d) && d >= 0);
      if (!stow_parse_bandwidth (text, &d, &e5))
        g_assert_nonnull (e5);
      else
        g_assert_true (isfinite (d) && d >= 0);
    }
  g_rand_free (r);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/units/size/valid", test_size_valid);
  g_test_add_func ("/units/size/errors", test_size_errors);
  g_test_add_func ("/units/count", test_count);
  g_test_add_func ("/units/tokens", test_tokens);
  g_test_add_func ("/units/duration", test_duration);
  g_test_add_func ("/units/bandwidth", test_bandwidth);
  g_test_add_func ("/units/format", test_format);
  g_test_add_func ("/units/round-trip", test_round_trip);
  g_test_add_func ("/units/random-inputs", test_random_inputs);
  return g_test_run ();
}
