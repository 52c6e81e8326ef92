/* SPDX-License-Identifier: MIT
 *
 * tests/test-published-runs.c: `stowage plan` against published H100 runs,
 * as docs/time-model.md tabulates them.  Every run ran, so every one must
 * be predicted to fit.  The twelve of issue 23 (copied from the project's
 * reference, tests/data/published-runs/h100-runs.json) within 10% each;
 * every other row (h100-heldout.json: the calibration set and the
 * development rows; the sealed rows only under STOW_SEALED=1) within its
 * group's bound, which the file states with the rule it follows.  A
 * summary prints each set's count, mean and worst |error| as claims
 * (docs/testing.md) and holds the means to their bounds.  `--verbose`
 * prints every case's prediction and error.
 */
#include <math.h>
#include <string.h>

#include <glib/gstdio.h>

#include "core/json.h"
#include "tests/testutil-claim.h"
#include "tests/testutil.h"

/* The twelve: issue 23's target, 10% each (its worst, the 70B, is at
 * +9.5%: the target is within 1.25 times that).  Their mean |error| was
 * 3.4% when issue 42 set this bound: 1.25 times that, rounded up. */
#define TWELVE_MAX_ABS_ERROR  0.10
#define TWELVE_MEAN_ABS_ERROR 0.05

typedef struct
{
  const char *set;   /* "twelve", "calibration", "development", "sealed" */
  const char *group; /* its bound's key in h100-heldout.json's "bounds" */
  JsonObject *run;   /* owned by the parsed file */
  double bound;      /* on |predicted / published - 1| */
  /* predict ()'s answer, kept for the summary */
  gboolean predicted, fits;
  double err;
} Case;

static char *
data_path (const char *rel)
{
  return g_test_build_filename (G_TEST_DIST, "data", "published-runs", rel,
                                NULL);
}

/* A model or cluster file named relative to the data folder (as the
 * reference's README runs them from its folder), or a catalog name. */
static char *
resolve (const char *name)
{
  if (g_str_has_prefix (name, "configs/"))
    return data_path (name);
  return g_strdup (name);
}

/* The row's model with "config_overrides" set over its config.json, in a
 * folder of the model's own name (the model's name is its folder's):
 * llm-foundry sets MPT's max_seq_len to each run's sequence, which sizes
 * its learned position table.  The caller removes @dir. */
static char *
overridden_model (const char *path, JsonObject *overrides, char **dir)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonParser) p = json_parser_new ();
  g_assert_true (json_parser_load_from_file (p, path, &error));
  g_assert_no_error (error);
  JsonObject *o = json_node_get_object (json_parser_get_root (p));
  g_autoptr (GList) members = json_object_get_members (overrides);
  for (GList *m = members; m != NULL; m = m->next)
    json_object_set_member (o, m->data,
                            json_object_dup_member (overrides, m->data));
  *dir = g_dir_make_tmp ("stow-published-XXXXXX", &error);
  g_assert_no_error (error);
  g_autofree char *parent = g_path_get_dirname (path);
  g_autofree char *folder = g_path_get_basename (parent);
  g_autofree char *sub = g_build_filename (*dir, folder, NULL);
  g_assert_cmpint (g_mkdir (sub, 0700), ==, 0);
  char *out = g_build_filename (sub, "config.json", NULL);
  g_autoptr (JsonGenerator) gen = json_generator_new ();
  json_generator_set_root (gen, json_parser_get_root (p));
  g_assert_true (json_generator_to_file (gen, out, &error));
  g_assert_no_error (error);
  return out;
}

static void
remove_model (const char *dir, const char *config)
{
  g_autofree char *sub = g_path_get_dirname (config);
  g_assert_cmpint (g_unlink (config), ==, 0);
  g_assert_cmpint (g_rmdir (sub), ==, 0);
  g_assert_cmpint (g_rmdir (dir), ==, 0);
}

/* Runs @c's plan once and keeps whether it fits and its error. */
static void
predict (Case *c)
{
  if (c->predicted)
    return;
  c->predicted = TRUE;
  JsonObject *r = c->run;
  const char *name = json_object_get_string_member (r, "name");
  const char *metric = json_object_get_string_member (r, "metric");
  double measured = json_object_get_double_member (r, "measured");
  g_autoptr (GPtrArray) argv = g_ptr_array_new_with_free_func (g_free);
  g_ptr_array_add (argv, g_strdup ("plan"));
  g_autofree char *model = resolve (json_object_get_string_member (r, "model"));
  g_autofree char *tmp = NULL;
  if (json_object_has_member (r, "config_overrides"))
    {
      char *path = overridden_model (
          model, json_object_get_object_member (r, "config_overrides"), &tmp);
      g_free (model);
      model = path;
    }
  g_ptr_array_add (argv, g_strdup (model));
  if (json_object_has_member (r, "cluster")
      && !json_object_get_null_member (r, "cluster"))
    {
      g_ptr_array_add (argv, g_strdup ("--cluster"));
      g_ptr_array_add (argv,
                       resolve (json_object_get_string_member (r, "cluster")));
    }
  else
    {
      g_ptr_array_add (argv, g_strdup ("--gpus"));
      g_ptr_array_add (argv,
                       g_strdup (json_object_get_string_member (r, "gpus")));
    }
  /* NeMo's rows run under --engine nemo (NeMo 24.07's recipes: Apex's
   * distributed Adam, bf16 gradients; docs/memory-model.md), not the
   * Megatron-LM defaults they are listed with. */
  gboolean nemo = g_str_has_prefix (name, "nemo-");
  JsonArray *args = json_object_get_array_member (r, "args");
  for (guint i = 0; i < json_array_get_length (args); i++)
    {
      const char *a = json_array_get_string_element (args, i);
      gboolean engine
          = i > 0
            && g_strcmp0 (json_array_get_string_element (args, i - 1),
                          "--engine")
                   == 0;
      g_ptr_array_add (argv, g_strdup (engine && nemo ? "nemo" : a));
    }
  g_ptr_array_add (argv, g_strdup ("--top"));
  g_ptr_array_add (argv, g_strdup ("1"));
  g_ptr_array_add (argv, g_strdup ("--json"));
  g_ptr_array_add (argv, NULL);

  g_auto (StowRun) run = { 0 };
  stow_runv (&run, (const char *const *)argv->pdata);
  if (tmp != NULL)
    remove_model (tmp, model);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = stow_json_parse_data (run.out, -1, name, &error);
  g_assert_no_error (error);
  JsonArray *plans
      = json_object_get_array_member (json_node_get_object (root), "plans");
  c->fits = json_array_get_length (plans) > 0;
  if (!c->fits)
    {
      g_test_message ("%s [%s]: does not fit (published %.6g)", name, c->set,
                      measured);
      g_assert_cmpint (run.status, ==, 1);
      return;
    }
  g_assert_cmpint (run.status, ==, 0);
  JsonObject *plan = json_array_get_object_element (plans, 0);
  double predicted = json_object_get_double_member (plan, metric);
  c->err = predicted / measured - 1.0;
  g_test_message ("%s [%s]: %s predicted %.6g, published %.6g (%+.1f%%)", name,
                  c->set, metric, predicted, measured, 100.0 * c->err);
}

/* Every published run ran: a plan that fits must exist, and its error
 * stays within the row's bound. */
static void
test_case (gconstpointer data)
{
  Case *c = (Case *)data;
  predict (c);
  const char *name = json_object_get_string_member (c->run, "name");
  if (!c->fits)
    {
      g_test_fail_printf ("%s: predicted not to fit", name);
      return;
    }
  g_autofree char *claim = g_strdup_printf ("published.row.%s", name);
  stow_test_claim (claim, 100.0 * c->err);
  g_assert_cmpfloat (fabs (c->err), <=, c->bound);
}

static JsonNode *
load (const char *file, JsonParser *p)
{
  g_autofree char *path = data_path (file);
  g_autoptr (GError) error = NULL;
  g_assert_true (json_parser_load_from_file (p, path, &error));
  g_assert_no_error (error);
  return json_parser_get_root (p);
}

static GArray *all_cases;   /* of Case, every row registered */
static JsonObject *bounds;  /* h100-heldout.json's "bounds" */
static guint n_sealed_rows; /* in h100-heldout.json, run or not */

typedef struct
{
  guint n, fits, within_10;
  double sum, worst;
} Tally;

static void
tally_add (Tally *t, const Case *c)
{
  t->n++;
  if (!c->fits)
    return;
  t->fits++;
  double e = fabs (c->err);
  t->sum += e;
  t->worst = MAX (t->worst, e);
  t->within_10 += e <= 0.10;
}

static double
tally_mean (const Tally *t)
{
  return t->fits ? t->sum / t->fits : 0;
}

/* The figures docs/time-model.md and README.md quote for a set of rows. */
static void
tally_claim (const char *key, const Tally *t)
{
  static const char *const what[]
      = { "count", "fit", "mean-pct", "worst-pct", "within-10" };
  const double value[]
      = { t->n, t->fits, 100 * tally_mean (t), 100 * t->worst, t->within_10 };
  for (gsize i = 0; i < G_N_ELEMENTS (what); i++)
    {
      g_autofree char *name = g_strdup_printf ("published.%s.%s", key, what[i]);
      stow_test_claim (name, value[i]);
    }
}

/* Every row fits; each set's mean within its bound; no group's bound
 * wider than twice its worst row today unless the file says why. */
static void
test_summary (void)
{
  Tally all = { 0 }, twelve = { 0 }, development = { 0 }, foundry = { 0 };
  g_autoptr (GHashTable) groups
      = g_hash_table_new_full (g_str_hash, g_str_equal, NULL, g_free);
  for (guint i = 0; i < all_cases->len; i++)
    {
      Case *c = &g_array_index (all_cases, Case, i);
      predict (c);
      tally_add (&all, c);
      if (g_str_equal (c->set, "twelve"))
        {
          tally_add (&twelve, c);
          continue;
        }
      Tally *g = g_hash_table_lookup (groups, c->group);
      if (g == NULL)
        {
          g = g_new0 (Tally, 1);
          g_hash_table_insert (groups, (gpointer)c->group, g);
        }
      tally_add (g, c);
      if (g_str_equal (c->set, "development"))
        tally_add (&development, c);
      if (g_str_has_prefix (c->group, "llm-foundry"))
        tally_add (&foundry, c);
    }
  tally_claim ("all", &all);
  tally_claim ("twelve", &twelve);
  tally_claim ("development", &development);
  tally_claim ("llm-foundry-all", &foundry);
  stow_test_claim ("published.sealed.count", n_sealed_rows);
  g_assert_cmpuint (all.fits, ==, all.n);
  g_assert_cmpfloat (tally_mean (&twelve), <=, TWELVE_MEAN_ABS_ERROR);
  g_assert_cmpfloat (TWELVE_MAX_ABS_ERROR, <=, 2 * twelve.worst);

  g_autoptr (GList) keys = json_object_get_members (bounds);
  for (GList *k = keys; k != NULL; k = k->next)
    {
      const char *key = k->data;
      const Tally *g = g_hash_table_lookup (groups, key);
      g_assert_nonnull (g);
      tally_claim (key, g);
      JsonObject *b = json_object_get_object_member (bounds, key);
      double max_bound = json_object_get_double_member (b, "max_abs_error");
      double mean_bound = json_object_get_double_member (b, "mean_abs_error");
      g_test_message ("%s: %u rows, mean |error| %.1f%% (bound %.0f%%), worst "
                      "%.1f%% (bound %.0f%%)",
                      key, g->n, 100 * tally_mean (g), 100 * mean_bound,
                      100 * g->worst, 100 * max_bound);
      g_assert_cmpfloat (tally_mean (g), <=, mean_bound);
      if (!json_object_has_member (b, "wide_because"))
        g_assert_cmpfloat (max_bound, <=, 2 * g->worst);
    }
}

/* Every row of h100-heldout.json, sealed ones too, names a group with a
 * bound, a metric and a published figure, under a name no other row has. */
static void
test_data (void)
{
  g_autoptr (JsonParser) twelve = json_parser_new ();
  g_autoptr (JsonParser) others = json_parser_new ();
  JsonArray *a = json_node_get_array (load ("h100-runs.json", twelve));
  JsonObject *file = json_node_get_object (load ("h100-heldout.json", others));
  g_autoptr (GHashTable) names = g_hash_table_new (g_str_hash, g_str_equal);
  for (guint i = 0; i < json_array_get_length (a); i++)
    g_assert_true (g_hash_table_add (
        names, (gpointer)json_object_get_string_member (
                   json_array_get_object_element (a, i), "name")));
  JsonObject *b = json_object_get_object_member (file, "bounds");
  static const char *const sets[] = { "development", "sealed" };
  for (gsize s = 0; s < G_N_ELEMENTS (sets); s++)
    {
      JsonArray *rows = json_object_get_array_member (file, sets[s]);
      for (guint i = 0; i < json_array_get_length (rows); i++)
        {
          JsonObject *r = json_array_get_object_element (rows, i);
          const char *name = json_object_get_string_member (r, "name");
          g_test_message ("%s row %s", sets[s], name);
          g_assert_true (g_hash_table_add (names, (gpointer)name));
          g_assert_true (json_object_has_member (
              b, json_object_get_string_member (r, "group")));
          g_assert_nonnull (json_object_get_string_member (r, "metric"));
          g_assert_nonnull (json_object_get_string_member (r, "source"));
          g_assert_cmpfloat (json_object_get_double_member (r, "measured"), >,
                             0);
        }
    }
}

static void
add_rows (GArray *cases, const char *set, JsonArray *rows)
{
  for (guint i = 0; i < json_array_get_length (rows); i++)
    {
      JsonObject *o = json_array_get_object_element (rows, i);
      const char *group = json_object_get_string_member (o, "group");
      JsonObject *b = json_object_get_object_member (bounds, group);
      Case c
          = { .set = g_str_equal (group, "calibration") ? "calibration" : set,
              .group = group,
              .run = o,
              .bound = json_object_get_double_member (b, "max_abs_error") };
      g_array_append_val (cases, c);
    }
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  /* The sealed rows run apart (meson's published-runs-sealed): a tuning
   * pass runs the rest and never sees their errors (docs/testing.md). */
  gboolean sealed = g_getenv ("STOW_SEALED") != NULL;
  g_autoptr (JsonParser) twelve = json_parser_new ();
  g_autoptr (JsonParser) others = json_parser_new ();
  JsonArray *a = json_node_get_array (load ("h100-runs.json", twelve));
  JsonObject *file = json_node_get_object (load ("h100-heldout.json", others));
  bounds = json_object_get_object_member (file, "bounds");
  n_sealed_rows
      = json_array_get_length (json_object_get_array_member (file, "sealed"));
  g_autoptr (GArray) cases = g_array_new (FALSE, TRUE, sizeof (Case));
  if (sealed)
    add_rows (cases, "sealed", json_object_get_array_member (file, "sealed"));
  else
    {
      for (guint i = 0; i < json_array_get_length (a); i++)
        {
          Case c = { .set = "twelve",
                     .group = "twelve",
                     .run = json_array_get_object_element (a, i),
                     .bound = TWELVE_MAX_ABS_ERROR };
          g_array_append_val (cases, c);
        }
      add_rows (cases, "development",
                json_object_get_array_member (file, "development"));
    }
  all_cases = cases;
  for (guint i = 0; i < cases->len; i++)
    {
      const Case *c = &g_array_index (cases, Case, i);
      g_autofree char *path
          = g_strdup_printf ("/published/h100/%s/%s", c->set,
                             json_object_get_string_member (c->run, "name"));
      g_test_add_data_func (path, c, test_case);
    }
  g_test_add_func ("/published/data/well-formed", test_data);
  /* After the rows (a suite's own cases run before its sub-suites), so
   * that it finds their predictions made. */
  if (!sealed)
    g_test_add_func ("/published/summary/h100", test_summary);
  return g_test_run ();
}
