/* SPDX-License-Identifier: MIT
 *
 * models/catalog.c: the built-in catalog (models/catalog/NAME.json, compiled
 * into the binary as a GResource) and stow_model_lookup, which resolves a
 * catalog name, an alias or a path to a config.json.  Each catalog file is
 * an HF config.json plus a "stowage" block: {"name", "aliases", "source"}.
 */
#include "models/model-private.h"

#include <gio/gio.h>
#include <string.h>

#include "core/json.h"
#include "core/strutil.h"
#include "models/hub.h"
#include "models/stow-models-resources.h"

#define CATALOG_PATH "/org/stowage/models/catalog/"

typedef struct
{
  char *name;
  char **aliases; /* NULL-terminated */
} CatalogEntry;

typedef struct
{
  CatalogEntry *entries; /* sorted by name */
  gsize n;
  const char **names;      /* n + 1, NULL-terminated */
  const char **candidates; /* names and aliases, for did-you-mean */
  gsize n_candidates;
} Catalog;

static int
entry_cmp (gconstpointer a, gconstpointer b)
{
  return strcmp (((const CatalogEntry *)a)->name,
                 ((const CatalogEntry *)b)->name);
}

static GBytes *
catalog_bytes (const char *file)
{
  g_autofree char *path = g_strconcat (CATALOG_PATH, file, NULL);
  return g_resource_lookup_data (stow_models_get_resource (), path,
                                 G_RESOURCE_LOOKUP_FLAGS_NONE, NULL);
}

/* The index is built once per process from the "stowage" blocks and kept
 * for its lifetime (the planner looks a model up once per run). */
static const Catalog *
catalog_get (void)
{
  static Catalog *catalog;
  if (g_once_init_enter (&catalog))
    {
      Catalog *c = g_new0 (Catalog, 1);
      g_auto (GStrv) files = g_resource_enumerate_children (
          stow_models_get_resource (), CATALOG_PATH,
          G_RESOURCE_LOOKUP_FLAGS_NONE, NULL);
      GArray *entries = g_array_new (FALSE, TRUE, sizeof (CatalogEntry));
      GPtrArray *cands = g_ptr_array_new ();

      for (guint i = 0; files && files[i]; i++)
        {
          g_autoptr (GBytes) bytes = NULL;
          g_autoptr (JsonNode) root = NULL;
          JsonObject *obj, *st = NULL;
          JsonArray *aliases = NULL;
          const char *name = NULL;
          CatalogEntry e = { 0 };
          gsize len;
          const char *data;

          if (!g_str_has_suffix (files[i], ".json"))
            continue;
          bytes = catalog_bytes (files[i]);
          data = g_bytes_get_data (bytes, &len);
          root = stow_json_parse_data (data, (gssize)len, files[i], NULL);
          /* A broken catalog file is a build defect; tests/test-models.c
           * loads every entry, so skipping here cannot go unnoticed. */
          if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
            continue;
          obj = json_node_get_object (root);
          if (!stow_json_get_object (obj, files[i], "stowage", TRUE, &st, NULL)
              || !stow_json_get_string (st, files[i], "name", TRUE, &name,
                                        NULL))
            continue;
          e.name = g_strdup (name);
          if (stow_json_get_array (st, files[i], "aliases", FALSE, &aliases,
                                   NULL)
              && aliases != NULL)
            {
              guint n = json_array_get_length (aliases);
              e.aliases = g_new0 (char *, n + 1);
              for (guint j = 0, k = 0; j < n; j++)
                {
                  const char *s = json_array_get_string_element (aliases, j);
                  if (s != NULL)
                    e.aliases[k++] = g_strdup (s);
                }
            }
          else
            e.aliases = g_new0 (char *, 1);
          g_array_append_val (entries, e);
        }
      g_array_sort (entries, entry_cmp);
      c->n = entries->len;
      c->entries = (CatalogEntry *)(void *)g_array_free (entries, FALSE);
      c->names = g_new0 (const char *, c->n + 1);
      for (gsize i = 0; i < c->n; i++)
        {
          c->names[i] = c->entries[i].name;
          g_ptr_array_add (cands, c->entries[i].name);
          for (char **a = c->entries[i].aliases; *a; a++)
            g_ptr_array_add (cands, *a);
        }
      c->n_candidates = cands->len;
      c->candidates = (const char **)g_ptr_array_free (cands, FALSE);
      g_once_init_leave (&catalog, c);
    }
  return catalog;
}

const char *const *
stow_model_catalog_names (gsize *n)
{
  const Catalog *c = catalog_get ();
  if (n != NULL)
    *n = c->n;
  return c->names;
}

static const CatalogEntry *
catalog_find (const char *name)
{
  const Catalog *c = catalog_get ();
  for (gsize i = 0; i < c->n; i++)
    {
      if (g_ascii_strcasecmp (c->entries[i].name, name) == 0)
        return &c->entries[i];
      for (char **a = c->entries[i].aliases; *a; a++)
        if (g_ascii_strcasecmp (*a, name) == 0)
          return &c->entries[i];
    }
  return NULL;
}

const char *const *
stow_model_catalog_aliases (const char *name)
{
  g_return_val_if_fail (name != NULL, NULL);
  const Catalog *c = catalog_get ();
  for (gsize i = 0; i < c->n; i++)
    if (strcmp (c->entries[i].name, name) == 0)
      return (const char *const *)c->entries[i].aliases;
  return NULL;
}

static StowModel *
catalog_load (const CatalogEntry *e, GError **error)
{
  g_autofree char *file = g_strconcat (e->name, ".json", NULL);
  g_autofree char *where = g_strconcat ("catalog/", file, NULL);
  g_autoptr (GBytes) bytes = catalog_bytes (file);
  g_autoptr (JsonNode) root = NULL;
  JsonObject *obj, *st = NULL;
  const char *source = NULL;
  gsize len;
  const char *data;
  StowModel *m;

  if (bytes == NULL)
    {
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                   "%s: catalog entry \"%s\" is not in the file named after "
                   "it",
                   where, e->name);
      return NULL;
    }
  data = g_bytes_get_data (bytes, &len);
  root = stow_json_parse_data (data, (gssize)len, where, error);
  if (root == NULL
      || (obj = stow_json_root_object (root, where, error)) == NULL)
    return NULL;
  m = stow_model_new_from_json (obj, where, error);
  if (m == NULL)
    return NULL;
  g_free (m->name);
  m->name = g_strdup (e->name);
  g_strfreev (m->aliases);
  m->aliases = g_strdupv (e->aliases);
  g_free (m->source);
  m->source = g_strdup ("catalog");
  if (stow_json_get_object (obj, where, "stowage", FALSE, &st, NULL)
      && st != NULL
      && stow_json_get_string (st, where, "source", FALSE, &source, NULL)
      && source != NULL)
    m->reference = g_strdup (source);
  return m;
}

StowModel *
stow_model_lookup (const char *name_or_path, GError **error)
{
  return stow_model_lookup_revision (name_or_path, NULL, error);
}

/* A Hub id rather than a path: ORG/NAME that names no file here. */
static gboolean
looks_like_hub_id (const char *s)
{
  return stow_hub_is_repo_id (s) && !g_str_has_suffix (s, ".json")
         && !g_file_test (s, G_FILE_TEST_EXISTS);
}

/* "unknown model ...", with a did-you-mean from the catalog's names and
 * aliases; @files says whether a file was a possible reading. */
static void
set_unknown (const char *name, gboolean files, GError **error)
{
  const Catalog *c = catalog_get ();
  const char *hint = stow_suggest (name, c->candidates, c->n_candidates);
  g_autofree char *esc = g_strescape (name, NULL);
  if (hint != NULL)
    g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                 "unknown model \"%.80s\"; did you mean \"%s\"? (see "
                 "'stowage models')",
                 esc, hint);
  else
    g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                 "unknown model \"%.80s\": not in the catalog%s (see "
                 "'stowage models')",
                 esc, files ? " and not a file" : " nor a Hub id (ORG/NAME)");
}

static gboolean
revision_applies (const char *name, gboolean hub_id, const char *revision,
                  GError **error)
{
  if (revision == NULL || hub_id)
    return TRUE;
  g_autofree char *esc = g_strescape (name, NULL);
  g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_INVALID,
               "--revision applies to Hub ids (ORG/NAME); \"%.80s\" is "
               "a catalog name or a file",
               esc);
  return FALSE;
}

StowModel *
stow_model_lookup_revision (const char *name_or_path, const char *revision,
                            GError **error)
{
  const CatalogEntry *e;

  g_return_val_if_fail (name_or_path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!revision_applies (name_or_path, looks_like_hub_id (name_or_path),
                         revision, error))
    return NULL;
  if (name_or_path[0] != '\0' && looks_like_hub_id (name_or_path))
    return stow_hub_load_model (name_or_path, revision, error);

  if (name_or_path[0] == '\0')
    {
      g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                   "model name is empty (see 'stowage models')");
      return NULL;
    }
  e = catalog_find (name_or_path);
  if (e != NULL)
    return catalog_load (e, error);

  /* Anything that looks like a path is read as one. */
  if (strchr (name_or_path, '/') != NULL
      || g_str_has_suffix (name_or_path, ".json")
      || g_file_test (name_or_path, G_FILE_TEST_EXISTS))
    {
      if (g_file_test (name_or_path, G_FILE_TEST_IS_DIR))
        {
          g_autofree char *cfg
              = g_build_filename (name_or_path, "config.json", NULL);
          return stow_model_new_from_file (cfg, error);
        }
      return stow_model_new_from_file (name_or_path, error);
    }

  set_unknown (name_or_path, TRUE, error);
  return NULL;
}

StowModel *
stow_model_lookup_named (const char *name, const char *revision, GError **error)
{
  g_return_val_if_fail (name != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* The catalog first: no catalog name has a '/', so a Hub id never
   * shadows one. */
  const CatalogEntry *e = name[0] ? catalog_find (name) : NULL;
  gboolean hub_id = e == NULL && stow_hub_is_repo_id (name);
  if (!revision_applies (name, hub_id, revision, error))
    return NULL;
  if (e != NULL)
    return catalog_load (e, error);
  if (hub_id)
    return stow_hub_load_model (name, revision, error);
  if (name[0] == '\0')
    g_set_error (error, STOW_MODEL_ERROR, STOW_MODEL_ERROR_NOT_FOUND,
                 "model name is empty (see 'stowage models')");
  else
    set_unknown (name, FALSE, error);
  return NULL;
}
