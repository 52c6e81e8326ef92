/* SPDX-License-Identifier: MIT
 *
 * core/units.h: parse and print the quantities stowage deals in: bytes,
 * parameter and token counts, durations and bandwidths.  Parsers are strict:
 * empty text, a sign, trailing junk, an unknown unit or a value that does not
 * fit 64 bits is an error whose message quotes the input.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Sizes in bytes.  "80GB" = 80e9 (SI), "80GiB" = 80 * 2^30 (IEC); a bare
 * prefix with no B ("512M", "4K", "2G") is IEC as in dd(1); a bare number is
 * bytes.  Fractions are allowed ("1.5TB") and rounded to the nearest byte.
 * Letter case does not matter.  Sets STOW_CORE_ERROR_PARSE or _RANGE. */
gboolean stow_parse_size (const char *text, guint64 *out_bytes, GError **error);

/* Parameter counts: decimal prefixes K, M, B (or G), T, case-insensitive:
 * "65B", "6.7B", "125M", "1.5T", "7000000".  Rounded to the nearest whole
 * parameter. */
gboolean stow_parse_count (const char *text, guint64 *out, GError **error);

/* Token counts, as context lengths are named: "2k" = 2048, "128k" = 131072,
 * "4M" = 4 * 2^20; a bare number is tokens. */
gboolean stow_parse_tokens (const char *text, guint64 *out, GError **error);

/* Durations: ns, us, ms, s, m or min, h; a bare number is seconds. */
gboolean stow_parse_duration (const char *text, double *out_s, GError **error);

/* Bandwidths in bytes per second: "25GB/s", "64GiB/s", "900 GBps"; a
 * lower-case b means bits: "200Gb/s", "100Gbps", "400Gbit/s".  SI prefixes
 * are decimal, IEC prefixes binary; a bare number is bytes per second. */
gboolean stow_parse_bandwidth (const char *text, double *out_bytes_per_s,
                               GError **error);

/* Printing.  Byte counts are IEC with two decimals ("80.00 GiB", "512 B");
 * the _into variants write into a caller's buffer and never allocate. */
#define STOW_FORMAT_BUF 48
const char *stow_format_bytes_into (char *buf, gsize size, guint64 bytes);
char *stow_format_bytes (guint64 bytes);
/* bytes / 2^30 with two decimals, no unit: for tables headed "GiB". */
char *stow_format_gib (guint64 bytes);
/* 65285660672 -> "65,285,660,672" */
const char *stow_format_grouped_into (char *buf, gsize size, guint64 value);
char *stow_format_grouped (guint64 value);
/* 65285660672 -> "65.29B", 124439808 -> "124.44M" (decimal prefixes) */
char *stow_format_count_short (guint64 value);
/* 0.0123 -> "12.30 ms", 95.5 -> "1.59 min" */
char *stow_format_duration (double seconds);
/* 2.5e10 -> "25.00 GB/s" (decimal, as vendors quote bandwidth) */
char *stow_format_bandwidth (double bytes_per_s);

G_END_DECLS
