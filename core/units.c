/* SPDX-License-Identifier: MIT
 *
 * core/units.c: strict parsers and printers for sizes, counts, durations and
 * bandwidths.  Integer quantities are computed exactly (128-bit decimal
 * arithmetic, no floating point), so "6.7B" is 6,700,000,000 and not one
 * parameter off.
 */
#include "core/units.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

typedef unsigned __int128 u128;

/* A decimal literal split out of the input: value = mantissa * 10^dexp. */
typedef struct
{
  u128 mantissa;
  int dexp;
  const char *num_start;
  const char *num_end;
  const char *unit; /* the rest of the text after optional blanks */
} Literal;

#define MAX_DIGITS 30
#define MAX_DEXP   40

static gboolean
lex_literal (const char *what, const char *text, Literal *lit, GError **error)
{
  const char *p = text;
  int digits = 0, frac_digits = 0, sig = 0;
  gboolean seen_point = FALSE;

  memset (lit, 0, sizeof *lit);
  if (text == NULL || *text == '\0')
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
                   "%s: empty value", what);
      return FALSE;
    }
  if (*p == '-')
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "%s \"%s\": must not be negative", what, text);
      return FALSE;
    }
  lit->num_start = p;
  for (;; p++)
    {
      if (g_ascii_isdigit (*p))
        {
          digits++;
          if (seen_point)
            frac_digits++;
          if (sig > 0 || *p != '0')
            sig++;
          if (sig > MAX_DIGITS)
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                           "%s \"%s\": too many digits", what, text);
              return FALSE;
            }
          lit->mantissa = lit->mantissa * 10 + (u128)(*p - '0');
        }
      else if (*p == '.' && !seen_point)
        seen_point = TRUE;
      else
        break;
    }
  if (digits == 0)
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
                   "%s \"%s\": expected a number", what, text);
      return FALSE;
    }
  lit->dexp = -frac_digits;
  /* An exponent only when digits follow, so "5EB" stays a unit. */
  if ((*p == 'e' || *p == 'E')
      && (g_ascii_isdigit (p[1])
          || ((p[1] == '-' || p[1] == '+') && g_ascii_isdigit (p[2]))))
    {
      int sign = 1, e = 0;
      p++;
      if (*p == '-' || *p == '+')
        sign = (*p++ == '-') ? -1 : 1;
      for (; g_ascii_isdigit (*p); p++)
        {
          e = e * 10 + (*p - '0');
          if (e > MAX_DEXP)
            {
              g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                           "%s \"%s\": exponent out of range", what, text);
              return FALSE;
            }
        }
      lit->dexp += sign * e;
    }
  lit->num_end = p;
  while (*p == ' ')
    p++;
  lit->unit = p;
  return TRUE;
}

/* value = mantissa * 10^dexp * mult, exactly, rounded half up. */
static gboolean
literal_to_u64 (const char *what, const char *text, const Literal *lit,
                u128 mult, guint64 *out, GError **error)
{
  u128 v;
  if (__builtin_mul_overflow (lit->mantissa, mult, &v))
    goto too_large;
  for (int i = 0; i < lit->dexp; i++)
    if (__builtin_mul_overflow (v, (u128)10, &v))
      goto too_large;
  if (lit->dexp < 0)
    {
      u128 den = 1;
      int n = -lit->dexp;
      if (n > 38)
        v = 0;
      else
        {
          for (int i = 0; i < n; i++)
            den *= 10;
          u128 q = v / den, r = v % den;
          v = q + (2 * r >= den ? 1 : 0);
        }
    }
  if (v > (u128)G_MAXUINT64)
    goto too_large;
  *out = (guint64)v;
  return TRUE;

too_large:
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
               "%s \"%s\": too large (the limit is %" G_GUINT64_FORMAT ")",
               what, text, G_MAXUINT64);
  return FALSE;
}

static double
literal_to_double (const Literal *lit)
{
  g_autofree char *num
      = g_strndup (lit->num_start, (gsize)(lit->num_end - lit->num_start));
  return g_ascii_strtod (num, NULL);
}

typedef struct
{
  const char *name;
  u128 mult;
} UnitDef;

#define KI ((u128)1024)
#define KD ((u128)1000)

static const UnitDef size_units[] = {
  { "", 1 },
  { "b", 1 },
  { "k", KI },
  { "m", KI *KI },
  { "g", KI *KI *KI },
  { "t", KI *KI *KI *KI },
  { "p", KI *KI *KI *KI *KI },
  { "e", KI *KI *KI *KI *KI *KI },
  { "kb", KD },
  { "mb", KD *KD },
  { "gb", KD *KD *KD },
  { "tb", KD *KD *KD *KD },
  { "pb", KD *KD *KD *KD *KD },
  { "eb", KD *KD *KD *KD *KD *KD },
  { "kib", KI },
  { "mib", KI *KI },
  { "gib", KI *KI *KI },
  { "tib", KI *KI *KI *KI },
  { "pib", KI *KI *KI *KI *KI },
  { "eib", KI *KI *KI *KI *KI *KI },
};

static const UnitDef count_units[] = {
  { "", 1 },           { "k", KD },         { "m", KD *KD },
  { "b", KD *KD *KD }, { "g", KD *KD *KD }, { "t", KD *KD *KD *KD },
};

static const UnitDef token_units[] = {
  { "", 1 },
  { "k", KI },
  { "m", KI *KI },
};

static gboolean
parse_with_units (const char *what, const char *text, const UnitDef *units,
                  gsize n_units, const char *hint, guint64 *out, GError **error)
{
  Literal lit;
  g_return_val_if_fail (out != NULL, FALSE);
  if (!lex_literal (what, text, &lit, error))
    return FALSE;
  for (gsize i = 0; i < n_units; i++)
    if (g_ascii_strcasecmp (lit.unit, units[i].name) == 0)
      {
        if (lit.unit != lit.num_end && *lit.unit == '\0')
          break; /* trailing blanks with no unit */
        return literal_to_u64 (what, text, &lit, units[i].mult, out, error);
      }
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
               "%s \"%s\": unknown unit \"%s\" (%s)", what, text, lit.unit,
               hint);
  return FALSE;
}

gboolean
stow_parse_size (const char *text, guint64 *out_bytes, GError **error)
{
  return parse_with_units ("size", text, size_units, G_N_ELEMENTS (size_units),
                           "use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, or "
                           "K, M, G, T for powers of 1024",
                           out_bytes, error);
}

gboolean
stow_parse_count (const char *text, guint64 *out, GError **error)
{
  return parse_with_units ("count", text, count_units,
                           G_N_ELEMENTS (count_units),
                           "use K, M, B or T, e.g. 6.7B", out, error);
}

gboolean
stow_parse_tokens (const char *text, guint64 *out, GError **error)
{
  return parse_with_units ("token count", text, token_units,
                           G_N_ELEMENTS (token_units),
                           "use k or M as powers of 1024, e.g. 4k", out, error);
}

static gboolean
check_finite (const char *what, const char *text, double v, GError **error)
{
  if (!isfinite (v))
    {
      g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_RANGE,
                   "%s \"%s\": out of range", what, text);
      return FALSE;
    }
  return TRUE;
}

gboolean
stow_parse_duration (const char *text, double *out_s, GError **error)
{
  static const struct
  {
    const char *name;
    double mult;
  } units[] = {
    { "", 1.0 },           { "ns", 1e-9 },  { "us", 1e-6 },
    { "\xc2\xb5s", 1e-6 }, { "ms", 1e-3 },  { "s", 1.0 },
    { "m", 60.0 },         { "min", 60.0 }, { "h", 3600.0 },
  };
  Literal lit;
  g_return_val_if_fail (out_s != NULL, FALSE);
  if (!lex_literal ("duration", text, &lit, error))
    return FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS (units); i++)
    if (strcmp (lit.unit, units[i].name) == 0
        && !(lit.unit != lit.num_end && *lit.unit == '\0'))
      {
        double v = literal_to_double (&lit) * units[i].mult;
        if (!check_finite ("duration", text, v, error))
          return FALSE;
        *out_s = v;
        return TRUE;
      }
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
               "duration \"%s\": unknown unit \"%s\" (use ns, us, ms, s, min "
               "or h)",
               text, lit.unit);
  return FALSE;
}

gboolean
stow_parse_bandwidth (const char *text, double *out_bytes_per_s, GError **error)
{
  static const char prefixes[] = "KMGTP";
  Literal lit;
  const char *p, *hit;
  double mult = 1.0;
  g_return_val_if_fail (out_bytes_per_s != NULL, FALSE);
  if (!lex_literal ("bandwidth", text, &lit, error))
    return FALSE;
  p = lit.unit;
  if (*p == '\0' && p == lit.num_end)
    goto done;
  if (*p != '\0' && (hit = strchr (prefixes, g_ascii_toupper (*p))) != NULL)
    {
      int power = (int)(hit - prefixes) + 1;
      gboolean binary = (p[1] == 'i');
      mult = pow (binary ? 1024.0 : 1000.0, power);
      p += binary ? 2 : 1;
    }
  if (g_str_has_prefix (p, "bit"))
    {
      mult /= 8.0;
      p += 3;
    }
  else if (*p == 'B')
    p++;
  else if (*p == 'b')
    {
      mult /= 8.0;
      p++;
    }
  else
    goto bad_unit;
  if (strcmp (p, "/s") != 0 && strcmp (p, "ps") != 0)
    goto bad_unit;
done:
  {
    double v = literal_to_double (&lit) * mult;
    if (!check_finite ("bandwidth", text, v, error))
      return FALSE;
    *out_bytes_per_s = v;
    return TRUE;
  }
bad_unit:
  g_set_error (error, STOW_CORE_ERROR, STOW_CORE_ERROR_PARSE,
               "bandwidth \"%s\": unknown unit \"%s\" (use e.g. GB/s, GiB/s, "
               "Gb/s or Gbps; lower-case b means bits)",
               text, lit.unit);
  return FALSE;
}

const char *
stow_format_bytes_into (char *buf, gsize size, guint64 bytes)
{
  static const char *const names[]
      = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
  if (bytes < 1024)
    {
      g_snprintf (buf, size, "%" G_GUINT64_FORMAT " B", bytes);
      return buf;
    }
  double v = (double)bytes / 1024.0;
  gsize i = 0;
  /* Switch unit once the two-decimal rendering would reach 1024.00. */
  while (v >= 1023.995 && i + 1 < G_N_ELEMENTS (names))
    {
      v /= 1024.0;
      i++;
    }
  g_snprintf (buf, size, "%.2f %s", v, names[i]);
  return buf;
}

char *
stow_format_bytes (guint64 bytes)
{
  char buf[STOW_FORMAT_BUF];
  return g_strdup (stow_format_bytes_into (buf, sizeof buf, bytes));
}

char *
stow_format_gib (guint64 bytes)
{
  return g_strdup_printf ("%.2f", (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

const char *
stow_format_grouped_into (char *buf, gsize size, guint64 value)
{
  char digits[24];
  int n = g_snprintf (digits, sizeof digits, "%" G_GUINT64_FORMAT, value);
  gsize o = 0;
  g_return_val_if_fail (size >= 28, NULL);
  for (int i = 0; i < n; i++)
    {
      if (i > 0 && (n - i) % 3 == 0)
        buf[o++] = ',';
      buf[o++] = digits[i];
    }
  buf[o] = '\0';
  return buf;
}

char *
stow_format_grouped (guint64 value)
{
  char buf[STOW_FORMAT_BUF];
  return g_strdup (stow_format_grouped_into (buf, sizeof buf, value));
}

char *
stow_format_count_short (guint64 value)
{
  static const struct
  {
    double scale;
    const char *suffix;
  } steps[] = { { 1e12, "T" }, { 1e9, "B" }, { 1e6, "M" }, { 1e3, "K" } };
  for (gsize i = 0; i < G_N_ELEMENTS (steps); i++)
    if ((double)value >= steps[i].scale)
      return g_strdup_printf ("%.2f%s", (double)value / steps[i].scale,
                              steps[i].suffix);
  return g_strdup_printf ("%" G_GUINT64_FORMAT, value);
}

char *
stow_format_duration (double s)
{
  if (!isfinite (s))
    return g_strdup ("inf");
  if (s >= 3600.0)
    return g_strdup_printf ("%.2f h", s / 3600.0);
  if (s >= 60.0)
    return g_strdup_printf ("%.2f min", s / 60.0);
  if (s >= 1.0 || s == 0.0)
    return g_strdup_printf ("%.2f s", s);
  if (s >= 1e-3)
    return g_strdup_printf ("%.2f ms", s * 1e3);
  if (s >= 1e-6)
    return g_strdup_printf ("%.2f us", s * 1e6);
  return g_strdup_printf ("%.0f ns", s * 1e9);
}

char *
stow_format_bandwidth (double bps)
{
  if (bps >= 1e12)
    return g_strdup_printf ("%.2f TB/s", bps / 1e12);
  if (bps >= 1e9)
    return g_strdup_printf ("%.2f GB/s", bps / 1e9);
  if (bps >= 1e6)
    return g_strdup_printf ("%.2f MB/s", bps / 1e6);
  return g_strdup_printf ("%.0f B/s", bps);
}
