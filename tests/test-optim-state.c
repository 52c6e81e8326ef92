/* SPDX-License-Identifier: MIT
 *
 * tests/test-optim-state.c: a checkpoint's optimizer files written by
 * several ranks (executor/optim-state.h): each rank's partition of every
 * tensor in its own file, read back as whole tensors by any number of
 * readers, every refusal of a set that does not tile, and the one-rank
 * file still the bytes it was.  The single file's own cases are in
 * test-checkpoint.c (/optim/...).
 */
#include "config.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <xxhash.h>

#include "executor/optim-state.h"
#include "testutil-io.h"

typedef struct
{
  char *dir; /* scratch: the checkpoint directory */
} Fixture;

static void
fixture_set_up (Fixture *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("optim-state-test");
}

static void
fixture_tear_down (Fixture *f, gconstpointer data)
{
  stow_test_rm_rf (f->dir);
  g_free (f->dir);
}

static JsonObject *
make_state (guint step)
{
  JsonObject *o = json_object_new ();
  json_object_set_int_member (o, "step", step);
  json_object_set_double_member (o, "lr", 0.25);
  json_object_set_string_member (o, "name", "adamw");
  return o;
}

/* Element @i of section @s of tensor @t, exact in fp32 for the sizes
 * here (below 2^24), and different for every (t, s, i). */
static float
value (guint t, guint s, guint64 i)
{
  return (float)(t * 100000 + s * 20000 + i) * 0.5f - 3.0f;
}

/* ---- the one-rank file, as before ---------------------------------------- */

static const StowOptimStateSpec golden_specs[] = {
  { .name = "model.embed_tokens.weight",
    .n = 37,
    .n_sections = 3,
    .sections = { "master", "m", "v" } },
  { .name = "model.norm.weight",
    .n = 0,
    .n_sections = 2,
    .sections = { "m", "v" } },
  { .name = "lm_head.weight",
    .n = 130,
    .n_sections = 3,
    .sections = { "m", "v", "pending" } },
};

/* The golden file's values (its own formula, fixed with its hash). */
static float
golden_value (guint t, guint s, guint64 i)
{
  return (float)(t * 1000 + s * 100 + i) * 0.25f - 7.0f;
}

static char *
write_golden (const char *dir, const char *file, gboolean ranked,
              const StowOptimStateSpec *specs)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonObject) state = json_object_new ();
  json_object_set_int_member (state, "step", 3);
  json_object_set_double_member (state, "lr", 0.25);
  json_object_set_string_member (state, "name", "adamw");
  char *path = g_build_filename (dir, file, NULL);
  guint n = G_N_ELEMENTS (golden_specs);
  g_autoptr (StowOptimStateWriter) w
      = ranked ? stow_optim_state_writer_new_rank (path, 0, 1, specs, n, state,
                                                   &error)
               : stow_optim_state_writer_new (path, specs, n, state, &error);
  g_assert_no_error (error);
  for (guint t = 0; t < n; t++)
    for (guint s = 0; s < specs[t].n_sections; s++)
      for (guint64 i = 0; i < specs[t].n; i++)
        {
          float v = golden_value (t, s, i);
          g_assert_true (stow_optim_state_writer_write (w, &v, 1, &error));
          g_assert_no_error (error);
        }
  g_assert_true (stow_optim_state_writer_finish (w, &error));
  g_assert_no_error (error);
  return path;
}

static char *
file_sha256 (const char *path)
{
  g_autoptr (GBytes) bytes = stow_test_read_file (path);
  return g_compute_checksum_for_bytes (G_CHECKSUM_SHA256, bytes);
}

/* The hash of this file as main wrote it before partitions existed
 * (commit 212eca0's writer, these specs, state and values): callers that
 * set neither "first" nor "total" must keep writing those bytes. */
#define GOLDEN_SHA256                                                          \
  "b4ef34345bc6628c9f036629f0d16d02e4ec8233a519a3b2ab483a43fc36ea33"

static void
test_golden_bytes (Fixture *f, gconstpointer data)
{
  g_autofree char *old = write_golden (f->dir, "a.stow", FALSE, golden_specs);
  g_autofree char *sum = file_sha256 (old);
  g_assert_cmpstr (sum, ==, GOLDEN_SHA256);
  /* Rank 0 of 1, and whole tensors said out loud, are the same file. */
  g_autofree char *ranked = write_golden (f->dir, "b.stow", TRUE, golden_specs);
  g_autofree char *sum_ranked = file_sha256 (ranked);
  g_assert_cmpstr (sum_ranked, ==, GOLDEN_SHA256);
  StowOptimStateSpec whole[G_N_ELEMENTS (golden_specs)];
  memcpy (whole, golden_specs, sizeof whole);
  for (guint t = 0; t < G_N_ELEMENTS (whole); t++)
    whole[t].total = whole[t].n;
  g_autofree char *said = write_golden (f->dir, "c.stow", TRUE, whole);
  g_autofree char *sum_said = file_sha256 (said);
  g_assert_cmpstr (sum_said, ==, GOLDEN_SHA256);

  /* And it reads as one rank of one, each tensor whole. */
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimState) s = stow_optim_state_open (old, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_optim_state_rank (s), ==, 0);
  g_assert_cmpuint (stow_optim_state_world (s), ==, 1);
  guint64 first = 99, total = 99;
  g_assert_true (
      stow_optim_state_tensor_range (s, "lm_head.weight", &first, &total));
  g_assert_cmpuint (first, ==, 0);
  g_assert_cmpuint (total, ==, 130);
  g_assert_false (stow_optim_state_tensor_range (s, "absent", NULL, NULL));
}

static void
test_file_name (Fixture *f, gconstpointer data)
{
  static const struct
  {
    guint rank, world;
    const char *name;
  } cases[] = {
    { .rank = 0, .world = 1, .name = "optimizer.stow" },
    { .rank = 0, .world = 2, .name = "optimizer-rank00000-of-00002.stow" },
    { .rank = 2, .world = 4, .name = "optimizer-rank00002-of-00004.stow" },
    { .rank = 1023,
      .world = 1024,
      .name = "optimizer-rank01023-of-01024.stow" },
    { .rank = 5,
      .world = 123456,
      .name = "optimizer-rank00005-of-123456.stow" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *name
          = stow_optim_state_file_name (cases[i].rank, cases[i].world);
      g_assert_cmpstr (name, ==, cases[i].name);
    }
}

/* ---- writing a set ------------------------------------------------------- */

typedef struct
{
  const char *name;
  guint64 total;
  guint n_sections;
  const char *sections[4];
} Tensor;

/* Where each rank's part of each tensor lies: parts[t * world + r]. */
typedef struct
{
  guint64 first, n;
} Range;

/* ZeRO's split: ceil(total / world) elements per rank, in rank order, the
 * last ranks short or empty. */
static Range *
zero_parts (const Tensor *tensors, guint n_tensors, guint world)
{
  Range *parts = g_new0 (Range, n_tensors * world);
  for (guint t = 0; t < n_tensors; t++)
    {
      guint64 chunk = (tensors[t].total + world - 1) / world;
      for (guint r = 0; r < world; r++)
        {
          guint64 a = MIN (r * chunk, tensors[t].total);
          guint64 b = MIN (a + chunk, tensors[t].total);
          parts[t * world + r] = (Range){ .first = a, .n = b - a };
        }
    }
  return parts;
}

/* Rank @rank's file: its part of every tensor, streamed in pieces of 1 to
 * 61 floats that run across sections and tensors. */
static void
write_rank (const char *dir, guint rank, guint world, const Tensor *tensors,
            guint n_tensors, const Range *parts)
{
  g_autoptr (GError) error = NULL;
  g_autofree StowOptimStateSpec *specs = g_new0 (StowOptimStateSpec, n_tensors);
  g_autoptr (GArray) all = g_array_new (FALSE, FALSE, sizeof (float));
  for (guint t = 0; t < n_tensors; t++)
    {
      const Range *p = &parts[t * world + rank];
      specs[t] = (StowOptimStateSpec){ .name = tensors[t].name,
                                       .n = p->n,
                                       .n_sections = tensors[t].n_sections,
                                       .first = p->first,
                                       .total = tensors[t].total };
      memcpy (specs[t].sections, tensors[t].sections, sizeof specs[t].sections);
      for (guint s = 0; s < tensors[t].n_sections; s++)
        for (guint64 i = p->first; i < p->first + p->n; i++)
          {
            float v = value (t, s, i);
            g_array_append_val (all, v);
          }
    }
  g_autofree char *name = stow_optim_state_file_name (rank, world);
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autoptr (JsonObject) state = make_state (100 + rank);
  g_autoptr (StowOptimStateWriter) w = stow_optim_state_writer_new_rank (
      path, rank, world, specs, n_tensors, state, &error);
  g_assert_no_error (error);
  guint64 done = 0;
  for (guint piece = rank + 1; done < all->len; piece = piece * 7 % 61 + 1)
    {
      guint64 n = MIN (piece, all->len - done);
      g_assert_true (stow_optim_state_writer_write (
          w, &g_array_index (all, float, done), n, &error));
      g_assert_no_error (error);
      done += n;
    }
  g_assert_true (stow_optim_state_writer_finish (w, &error));
  g_assert_no_error (error);
}

static void
write_set (const char *dir, guint world, const Tensor *tensors, guint n_tensors,
           const Range *parts)
{
  for (guint r = 0; r < world; r++)
    write_rank (dir, r, world, tensors, n_tensors, parts);
}

/* Reads [first, first + n) of every section of tensor @t through @set and
 * compares it with the values written. */
static void
check_range (StowOptimStateSet *set, const Tensor *tensors, guint t,
             guint64 first, guint64 n)
{
  g_autoptr (GError) error = NULL;
  g_autofree float *buf = g_new (float, n + 1);
  for (guint s = 0; s < tensors[t].n_sections; s++)
    {
      gboolean ok = stow_optim_state_set_read (
          set, tensors[t].name, tensors[t].sections[s], first, n, buf, &error);
      g_assert_no_error (error);
      g_assert_true (ok);
      for (guint64 i = 0; i < n; i++)
        if (buf[i] != value (t, s, first + i))
          g_assert_cmpfloat (buf[i], ==, value (t, s, first + i));
    }
}

static const Tensor tensors[] = {
  { .name = "model.embed_tokens.weight",
    .total = 1000,
    .n_sections = 3,
    .sections = { "master", "m", "v" } },
  /* Smaller than most worlds here: some ranks hold none of it. */
  { .name = "model.norm.weight",
    .total = 3,
    .n_sections = 2,
    .sections = { "m", "v" } },
  { .name = "empty", .total = 0, .n_sections = 2, .sections = { "m", "v" } },
  { .name = "lm_head.weight",
    .total = 97,
    .n_sections = 4,
    .sections = { "master", "m", "v", "pending" } },
  { .name = "one", .total = 1, .n_sections = 2, .sections = { "m", "v" } },
};

/* Worlds of 1 to 5 ranks, ZeRO's split, read back whole, by every other
 * world's partitions (what a resume with another number of ranks reads),
 * and in ranges that start and end anywhere. */
static void
test_set_worlds (Fixture *f, gconstpointer data)
{
  guint nt = G_N_ELEMENTS (tensors);
  for (guint world = 1; world <= 5; world++)
    {
      g_autofree char *dir = g_strdup_printf ("%s/w%u", f->dir, world);
      g_assert_cmpint (g_mkdir (dir, 0755), ==, 0);
      g_autofree Range *parts = zero_parts (tensors, nt, world);
      write_set (dir, world, tensors, nt, parts);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowOptimStateSet) set
          = stow_optim_state_set_open (dir, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (stow_optim_state_set_world (set), ==, world);
      /* Rank 0's state, whichever rank wrote last. */
      JsonObject *state = stow_optim_state_set_get_state (set);
      g_assert_cmpint (json_object_get_int_member (state, "step"), ==, 100);
      g_assert_cmpuint (stow_optim_state_set_n_tensors (set), ==, nt);
      for (guint t = 0; t < nt; t++)
        {
          g_assert_cmpstr (stow_optim_state_set_tensor_name (set, t), ==,
                           tensors[t].name);
          g_assert_cmpuint (
              stow_optim_state_set_tensor_total (set, tensors[t].name), ==,
              tensors[t].total);
          g_assert_true (stow_optim_state_set_has_section (
              set, tensors[t].name, tensors[t].sections[1]));
          g_assert_false (
              stow_optim_state_set_has_section (set, tensors[t].name, "x"));
          check_range (set, tensors, t, 0, tensors[t].total);
          for (guint other = 1; other <= 5; other++)
            {
              g_autofree Range *mine = zero_parts (tensors, nt, other);
              for (guint r = 0; r < other; r++)
                check_range (set, tensors, t, mine[t * other + r].first,
                             mine[t * other + r].n);
            }
          guint64 total = tensors[t].total;
          for (guint64 a = 0; a <= total; a += 1 + total / 7)
            for (guint64 b = a; b <= total; b += 1 + total / 5)
              check_range (set, tensors, t, a, b - a);
        }
      g_assert_cmpuint (stow_optim_state_set_tensor_total (set, "absent"), ==,
                        0);

      /* The files of a single rank, opened alone, say which part they hold. */
      g_autofree char *name = stow_optim_state_file_name (world - 1, world);
      g_autofree char *path = g_build_filename (dir, name, NULL);
      g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
      g_assert_no_error (error);
      g_assert_cmpuint (stow_optim_state_rank (s), ==, world - 1);
      g_assert_cmpuint (stow_optim_state_world (s), ==, world);
      guint64 first = 0, total = 0;
      g_assert_true (
          stow_optim_state_tensor_range (s, tensors[0].name, &first, &total));
      g_assert_cmpuint (first, ==, parts[0 * world + world - 1].first);
      g_assert_cmpuint (total, ==, 1000);
      g_assert_cmpuint (stow_optim_state_tensor_n (s, tensors[0].name), ==,
                        parts[0 * world + world - 1].n);
    }
}

/* Random tensors, worlds, partitions (any contiguous split, given to the
 * ranks in any order, empty parts anywhere) and reads, whole ranges and
 * ranges streamed in consecutive pieces. */
static void
test_set_property (Fixture *f, gconstpointer data)
{
  static const char *const names[]
      = { "t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7" };
  for (guint round = 0; round < 40; round++)
    {
      g_autofree char *dir = g_strdup_printf ("%s/p%u", f->dir, round);
      g_assert_cmpint (g_mkdir (dir, 0755), ==, 0);
      guint world = g_test_rand_int_range (1, 8);
      guint nt = g_test_rand_int_range (1, G_N_ELEMENTS (names) + 1);
      g_autofree Tensor *ts = g_new0 (Tensor, nt);
      g_autofree Range *parts = g_new0 (Range, nt * world);
      for (guint t = 0; t < nt; t++)
        {
          ts[t].name = names[t];
          ts[t].total = g_test_rand_bit () ? g_test_rand_int_range (0, 12)
                                           : g_test_rand_int_range (0, 3000);
          ts[t].n_sections = 2 + g_test_rand_bit ();
          ts[t].sections[0] = "m";
          ts[t].sections[1] = "v";
          ts[t].sections[2] = "master";
          /* world - 1 sorted cuts in [0, total], the parts between them
           * dealt to the ranks in a shuffled order. */
          g_autofree guint64 *cuts = g_new (guint64, world + 1);
          cuts[0] = 0;
          cuts[world] = ts[t].total;
          for (guint k = 1; k < world; k++)
            cuts[k] = g_test_rand_int_range (0, ts[t].total + 1);
          for (guint k = 1; k < world; k++)
            for (guint j = k; j > 1 && cuts[j - 1] > cuts[j]; j--)
              {
                guint64 tmp = cuts[j];
                cuts[j] = cuts[j - 1];
                cuts[j - 1] = tmp;
              }
          g_autofree guint *order = g_new (guint, world);
          for (guint k = 0; k < world; k++)
            order[k] = k;
          for (guint k = world; k > 1; k--)
            {
              guint j = g_test_rand_int_range (0, k);
              guint tmp = order[k - 1];
              order[k - 1] = order[j];
              order[j] = tmp;
            }
          for (guint k = 0; k < world; k++)
            parts[t * world + order[k]]
                = (Range){ .first = cuts[k], .n = cuts[k + 1] - cuts[k] };
        }
      write_set (dir, world, ts, nt, parts);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowOptimStateSet) set
          = stow_optim_state_set_open (dir, &error);
      g_assert_no_error (error);
      for (guint k = 0; k < 20; k++)
        {
          guint t = g_test_rand_int_range (0, nt);
          guint64 a = g_test_rand_int_range (0, ts[t].total + 1);
          guint64 b = g_test_rand_int_range (a, ts[t].total + 1);
          check_range (set, ts, t, a, b - a);
        }
      /* A range in pieces, as a reader streaming through a small buffer. */
      guint t = g_test_rand_int_range (0, nt);
      guint64 a = g_test_rand_int_range (0, ts[t].total + 1);
      for (guint64 at = a; at < ts[t].total;)
        {
          /* MIN evaluates its arguments twice: draw once. */
          guint64 want = g_test_rand_int_range (1, 300);
          guint64 n = MIN (want, ts[t].total - at);
          check_range (set, ts, t, at, n);
          at += n;
        }
    }
}

/* ---- refusals ------------------------------------------------------------ */

static const Tensor small[] = {
  { .name = "a", .total = 10, .n_sections = 2, .sections = { "m", "v" } },
  { .name = "b", .total = 2, .n_sections = 2, .sections = { "m", "v" } },
};

static char *
rank_path (const char *dir, guint rank, guint world)
{
  g_autofree char *name = stow_optim_state_file_name (rank, world);
  return g_build_filename (dir, name, NULL);
}

/* Opening @dir fails with @code and a message holding every @want. */
static void
refused (const char *dir, int code, const char *want, ...)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimStateSet) set = stow_optim_state_set_open (dir, &error);
  g_assert_null (set);
  g_assert_error (error, STOW_CHECKPOINT_ERROR, code);
  va_list ap;
  va_start (ap, want);
  for (const char *w = want; w != NULL; w = va_arg (ap, const char *))
    if (strstr (error->message, w) == NULL)
      g_error ("\"%s\" not in: %s", w, error->message);
  va_end (ap);
}

static void
test_set_refusals (Fixture *f, gconstpointer data)
{
  guint nt = G_N_ELEMENTS (small);
  const char *dir = f->dir;
  g_autofree Range *p4 = zero_parts (small, nt, 4); /* a: 3 3 3 1; b: 1 1 */
  g_autofree Range *p2 = zero_parts (small, nt, 2);

  refused (dir, STOW_CHECKPOINT_ERROR_IO, "neither optimizer.stow", NULL);

  /* A missing rank: the middle one, then the last. */
  write_rank (dir, 0, 4, small, nt, p4);
  write_rank (dir, 1, 4, small, nt, p4);
  write_rank (dir, 3, 4, small, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "optimizer-rank00002-of-00004.stow missing", "3 of the 4", NULL);
  g_autofree char *r3 = rank_path (dir, 3, 4);
  g_autofree char *r2 = rank_path (dir, 2, 4);
  {
    /* Rank 3's file under rank 2's name: its header says otherwise. */
    g_autoptr (GBytes) bytes = stow_test_read_file (r3);
    stow_test_write_file (r2, g_bytes_get_data (bytes, NULL),
                          g_bytes_get_size (bytes));
  }
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "optimizer-rank00002-of-00004",
           "the header says rank 3 of 4", NULL);
  write_rank (dir, 2, 4, small, nt, p4);
  g_assert_cmpint (g_unlink (r3), ==, 0);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "optimizer-rank00003-of-00004.stow missing", NULL);
  write_rank (dir, 3, 4, small, nt, p4);
  {
    g_autoptr (GError) error = NULL;
    g_autoptr (StowOptimStateSet) set = stow_optim_state_set_open (dir, &error);
    g_assert_no_error (error);
  }

  /* Mixed N: a file of a two-rank run beside the four. */
  write_rank (dir, 0, 2, small, nt, p2);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "mixed N", "-of-00002.stow",
           "-of-00004.stow", NULL);
  g_autofree char *r0of2 = rank_path (dir, 0, 2);
  g_assert_cmpint (g_unlink (r0of2), ==, 0);

  /* Both kinds of file. */
  g_autofree char *single = g_build_filename (dir, "optimizer.stow", NULL);
  stow_test_write_file (single, "x", 1);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "both optimizer.stow",
           "optimizer-rank00000-of-00004.stow", NULL);
  g_assert_cmpint (g_unlink (single), ==, 0);

  /* Names this build never writes. */
  static const char *const strays[] = {
    "optimizer-rank2-of-4.stow",
    "optimizer-rank00004-of-00004.stow",
    "optimizer-rank00000-of-00001.stow",
    "optimizer-rank00000-of-00004.stow.bak",
  };
  for (guint i = 0; i < G_N_ELEMENTS (strays); i++)
    {
      g_autofree char *path = g_build_filename (dir, strays[i], NULL);
      stow_test_write_file (path, "x", 1);
      refused (dir, STOW_CHECKPOINT_ERROR_INVALID, strays[i],
               "not the name of a rank's optimizer file", NULL);
      g_assert_cmpint (g_unlink (path), ==, 0);
    }

  /* A gap: rank 1's part of "a" one element short. */
  Range saved = p4[0 * 4 + 1];
  p4[0 * 4 + 1].n--;
  write_rank (dir, 1, 4, small, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "tensor \"a\"",
           "elements [5, 6) of 10 are in no file",
           "between optimizer-rank00001-of-00004.stow and "
           "optimizer-rank00002-of-00004.stow",
           NULL);
  /* An overlap: one element more. */
  p4[0 * 4 + 1].n += 2;
  write_rank (dir, 1, 4, small, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "tensor \"a\"",
           "elements [6, 7) are in both optimizer-rank00001-of-00004.stow and "
           "optimizer-rank00002-of-00004.stow",
           NULL);
  p4[0 * 4 + 1] = saved;
  write_rank (dir, 1, 4, small, nt, p4);
  /* A gap at the start (rank 0 holds none of "a") and at the end. */
  Range saved0 = p4[0];
  p4[0] = (Range){ .first = 3, .n = 0 };
  write_rank (dir, 0, 4, small, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "elements [0, 3) of 10 are in no file",
           "a gap before optimizer-rank00001-of-00004.stow", NULL);
  p4[0] = saved0;
  write_rank (dir, 0, 4, small, nt, p4);
  Range saved3 = p4[0 * 4 + 3];
  p4[0 * 4 + 3].n = 0;
  write_rank (dir, 3, 4, small, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "elements [9, 10) of 10 are in no file",
           "a gap after optimizer-rank00002-of-00004.stow", NULL);
  p4[0 * 4 + 3] = saved3;
  write_rank (dir, 3, 4, small, nt, p4);

  /* A total that disagrees: rank 2 thinks "b" has 3 elements. */
  Tensor other[G_N_ELEMENTS (small)];
  memcpy (other, small, sizeof other);
  other[1].total = 3;
  write_rank (dir, 2, 4, other, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "tensor \"b\"",
           "optimizer-rank00002-of-00004.stow says 3 elements in all",
           "optimizer-rank00000-of-00004.stow 2", NULL);
  /* Other sections. */
  memcpy (other, small, sizeof other);
  other[0].sections[1] = "w";
  write_rank (dir, 2, 4, other, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID, "tensor \"a\"",
           "optimizer-rank00002-of-00004.stow has 2 sections, without \"v\"",
           NULL);
  /* Another tensor in place of "b", then one tensor fewer. */
  memcpy (other, small, sizeof other);
  other[1].name = "c";
  write_rank (dir, 2, 4, other, nt, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "optimizer-rank00002-of-00004.stow has no tensor \"b\"", NULL);
  write_rank (dir, 2, 4, small, 1, p4);
  refused (dir, STOW_CHECKPOINT_ERROR_INVALID,
           "optimizer-rank00002-of-00004.stow has 1 tensors", NULL);
  write_rank (dir, 2, 4, small, nt, p4);

  /* Reads outside the tensors. */
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimStateSet) set = stow_optim_state_set_open (dir, &error);
  g_assert_no_error (error);
  float buf[16];
  g_assert_false (stow_optim_state_set_read (set, "a", "m", 9, 2, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH);
  g_assert_nonnull (strstr (error->message, "[9, +2) past its 10"));
  g_clear_error (&error);
  g_assert_false (
      stow_optim_state_set_read (set, "a", "master", 0, 1, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH);
  g_clear_error (&error);
  g_assert_false (stow_optim_state_set_read (set, "z", "m", 0, 1, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_MISMATCH);
}

/* One rank's optimizer.stow holding part of a tensor is a gap too. */
static void
test_set_single_partial (Fixture *f, gconstpointer data)
{
  Range part[] = { { .first = 0, .n = 7 }, { .first = 0, .n = 2 } };
  write_rank (f->dir, 0, 1, small, G_N_ELEMENTS (small), part);
  refused (f->dir, STOW_CHECKPOINT_ERROR_INVALID, "tensor \"a\"",
           "elements [7, 10) of 10 are in no file",
           "a gap after optimizer.stow", NULL);
  part[0].n = 10;
  write_rank (f->dir, 0, 1, small, G_N_ELEMENTS (small), part);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimStateSet) set
      = stow_optim_state_set_open (f->dir, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_optim_state_set_world (set), ==, 1);
  check_range (set, small, 0, 2, 5);
}

static void
test_writer_refusals (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "x.stow", NULL);
  g_autoptr (JsonObject) state = make_state (1);
  static const struct
  {
    guint64 first, n, total;
    const char *want;
  } cases[] = {
    { .first = 3, .n = 8, .total = 10, .want = "[3, +8) pass its total 10" },
    { .first = 2, .n = 1, .total = 0, .want = "first 2 without a total" },
    { .first = G_MAXUINT64, .n = 2, .total = 5, .want = "pass its total 5" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      StowOptimStateSpec spec = { .name = "a",
                                  .n = cases[i].n,
                                  .n_sections = 1,
                                  .sections = { "m" },
                                  .first = cases[i].first,
                                  .total = cases[i].total };
      g_autoptr (GError) error = NULL;
      g_autoptr (StowOptimStateWriter) w = stow_optim_state_writer_new_rank (
          path, 1, 2, &spec, 1, state, &error);
      g_assert_null (w);
      g_assert_error (error, STOW_CHECKPOINT_ERROR,
                      STOW_CHECKPOINT_ERROR_INVALID);
      g_assert_nonnull (strstr (error->message, "tensor \"a\""));
      if (strstr (error->message, cases[i].want) == NULL)
        g_error ("\"%s\" not in: %s", cases[i].want, error->message);
      g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
    }
}

/* A file made by hand, @header as given: what the reader makes of fields
 * no writer of ours writes. */
static void
write_raw (const char *path, const char *header, guint64 data_bytes)
{
  GString *h = g_string_new (header);
  while ((28 + h->len) % 64 != 0)
    g_string_append_c (h, ' ');
  guint8 prefix[28];
  guint32 version = GUINT32_TO_LE (1);
  guint64 len = GUINT64_TO_LE ((guint64)h->len);
  guint64 sum = GUINT64_TO_LE ((guint64)XXH3_64bits (h->str, h->len));
  memcpy (prefix, "STOWOPT", 8);
  memcpy (prefix + 8, &version, 4);
  memcpy (prefix + 12, &len, 8);
  memcpy (prefix + 20, &sum, 8);
  GByteArray *all = g_byte_array_new ();
  g_byte_array_append (all, prefix, sizeof prefix);
  g_byte_array_append (all, (const guint8 *)h->str, h->len);
  g_autofree guint8 *zeros = g_malloc0 (data_bytes + 1);
  g_byte_array_append (all, zeros, data_bytes);
  stow_test_write_file (path, all->data, all->len);
  g_byte_array_unref (all);
  g_string_free (h, TRUE);
}

static void
test_open_refusals (Fixture *f, gconstpointer data)
{
  g_autofree char *path = g_build_filename (f->dir, "x.stow", NULL);
#define SEC                                                                    \
  "\"sections\":[{\"name\":\"m\",\"offset\":0,\"bytes\":8,"                    \
  "\"xxh3\":\"0000000000000000\"}]"
  static const struct
  {
    const char *header, *want;
  } cases[] = {
    { .header = "{\"rank\":2,\"world\":2,\"state\":{},\"tensors\":[]}",
      .want = "rank 2 of world 2" },
    { .header = "{\"world\":0,\"state\":{},\"tensors\":[]}",
      .want = "rank 0 of world 0" },
    { .header = "{\"world\":8589934592,\"state\":{},\"tensors\":[]}",
      .want = "world 8589934592" },
    { .header = "{\"state\":{},\"tensors\":[{\"name\":\"a\",\"n\":2,"
                "\"first\":5,\"total\":6," SEC "}]}",
      .want = "tensor \"a\": first 5 + n 2 pass total 6" },
    { .header = "{\"state\":{},\"tensors\":[{\"name\":\"a\",\"n\":2,"
                "\"first\":5," SEC "}]}",
      .want = "total" },
    { .header = "{\"state\":{},\"tensors\":[{\"name\":\"a\",\"n\":2,"
                "\"first\":-1,\"total\":6," SEC "}]}",
      .want = "first" },
  };
#undef SEC
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      write_raw (path, cases[i].header, 8);
      g_autoptr (GError) error = NULL;
      g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
      g_assert_null (s);
      g_assert_error (error, STOW_CHECKPOINT_ERROR,
                      STOW_CHECKPOINT_ERROR_INVALID);
      g_assert_nonnull (strstr (error->message, path));
      if (strstr (error->message, cases[i].want) == NULL)
        g_error ("\"%s\" not in: %s", cases[i].want, error->message);
    }
  /* And what is right opens. */
  write_raw (
      path,
      "{\"rank\":1,\"world\":3,\"state\":{},\"tensors\":[{\"name\":\"a\","
      "\"n\":2,\"first\":4,\"total\":6,\"sections\":[{\"name\":\"m\","
      "\"offset\":0,\"bytes\":8,\"xxh3\":\"0000000000000000\"}]}]}",
      8);
  g_autoptr (GError) error = NULL;
  g_autoptr (StowOptimState) s = stow_optim_state_open (path, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (stow_optim_state_rank (s), ==, 1);
  g_assert_cmpuint (stow_optim_state_world (s), ==, 3);
  guint64 first = 0, total = 0;
  g_assert_true (stow_optim_state_tensor_range (s, "a", &first, &total));
  g_assert_cmpuint (first, ==, 4);
  g_assert_cmpuint (total, ==, 6);
}

/* ---- damaged files ------------------------------------------------------- */

/* Flips a bit of the byte @back bytes before the end of @path. */
static void
flip_from_end (const char *path, goffset back)
{
  g_autoptr (GBytes) bytes = stow_test_read_file (path);
  gsize len = g_bytes_get_size (bytes);
  guint8 *data = g_memdup2 (g_bytes_get_data (bytes, NULL), len);
  data[len - back] ^= 0x40;
  stow_test_write_file (path, data, len);
  g_free (data);
}

static void
test_set_damage (Fixture *f, gconstpointer data)
{
  /* One tensor, four ranks of 250: the last section of rank 2's file is
   * "v" of its 250 elements, ending the file. */
  static const Tensor one[] = {
    { .name = "w", .total = 1000, .n_sections = 2, .sections = { "m", "v" } },
  };
  g_autofree Range *parts = zero_parts (one, 1, 4);
  write_set (f->dir, 4, one, 1, parts);
  g_autofree char *r2 = rank_path (f->dir, 2, 4);
  flip_from_end (r2, 4); /* element 749 of "v" */

  g_autoptr (GError) error = NULL;
  g_autofree float *buf = g_new (float, 1000);
  g_autoptr (StowOptimStateSet) set
      = stow_optim_state_set_open (f->dir, &error);
  g_assert_no_error (error);
  /* Untouched files and sections read. */
  check_range (set, one, 0, 0, 500);
  g_assert_true (
      stow_optim_state_set_read (set, "w", "m", 400, 600, buf, &error));
  g_assert_no_error (error);
  /* A range that holds only the first elements of rank 2's "v", not the
   * damaged one, still fails: a part of a file is never served unchecked
   * (a resume on 3 ranks reads [334, 667), half of rank 2's). */
  g_assert_false (
      stow_optim_state_set_read (set, "w", "v", 334, 333, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_assert_nonnull (strstr (error->message, r2));
  g_assert_nonnull (strstr (error->message, "tensor \"w\": section \"v\""));
  g_clear_error (&error);
  /* The whole tensor, and rank 2's part exactly. */
  g_assert_false (
      stow_optim_state_set_read (set, "w", "v", 0, 1000, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_assert_nonnull (strstr (error->message, r2));
  g_clear_error (&error);
  g_assert_false (
      stow_optim_state_set_read (set, "w", "v", 500, 250, buf, &error));
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_clear_error (&error);
  /* Streamed in pieces from the start of rank 2's part. */
  gboolean failed = FALSE;
  for (guint64 at = 500; at < 750 && !failed; at += 50)
    failed = !stow_optim_state_set_read (set, "w", "v", at, 50, buf, &error);
  g_assert_true (failed);
  g_assert_error (error, STOW_CHECKPOINT_ERROR, STOW_CHECKPOINT_ERROR_CHECKSUM);
  g_clear_error (&error);
  g_clear_pointer (&set, stow_optim_state_set_close);

  /* Truncated: to nothing, then by its last 100 bytes. */
  g_assert_cmpint (truncate (r2, 0), ==, 0);
  refused (f->dir, STOW_CHECKPOINT_ERROR_INVALID, r2, NULL);
  write_rank (f->dir, 2, 4, one, 1, parts);
  struct stat sb;
  g_assert_cmpint (stat (r2, &sb), ==, 0);
  g_assert_cmpint (truncate (r2, sb.st_size - 100), ==, 0);
  refused (f->dir, STOW_CHECKPOINT_ERROR_INVALID, r2, "section \"v\"",
           "the file is truncated", NULL);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
#define ADD(path, fn)                                                          \
  g_test_add (path, Fixture, NULL, fixture_set_up, fn, fixture_tear_down)
  ADD ("/optim-state/golden-bytes", test_golden_bytes);
  ADD ("/optim-state/file-name", test_file_name);
  ADD ("/optim-state/writer-refusals", test_writer_refusals);
  ADD ("/optim-state/open-refusals", test_open_refusals);
  ADD ("/optim-state/set/worlds", test_set_worlds);
  ADD ("/optim-state/set/property", test_set_property);
  ADD ("/optim-state/set/refusals", test_set_refusals);
  ADD ("/optim-state/set/single-partial", test_set_single_partial);
  ADD ("/optim-state/set/damage", test_set_damage);
#undef ADD
  return g_test_run ();
}
