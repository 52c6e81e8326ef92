/* SPDX-License-Identifier: MIT
 *
 * cli/api.c: the JSON API's endpoints, /api/fit, /api/plan, /api/mem,
 * /api/simulate, /api/model, /api/gpus and /api/models: each is the
 * command of that name run for the request (cli/call.h), so its answer is
 * the command's own bytes; a failure becomes the HTTP status that fits (400
 * bad input naming the parameter, 404 an unknown model, 422 nothing to
 * emit, 502/403 from the Hub).
 */
#include "cli/api.h"

#include <string.h>

#include "cli/call.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "reports/emit.h"
#include "reports/report.h"

typedef struct
{
  int (*run) (StowCliCall *call, int argc, char **argv);
  gboolean takes_model;
} Command;

static const Command fit = { .run = stow_fit_run, .takes_model = TRUE };
static const Command plan = { .run = stow_plan_run, .takes_model = TRUE };
static const Command mem = { .run = stow_mem_run, .takes_model = TRUE };
static const Command simulate
    = { .run = stow_simulate_run, .takes_model = TRUE };
static const Command model = { .run = stow_model_run, .takes_model = TRUE };
static const Command gpus = { .run = stow_gpus_run, .takes_model = FALSE };
static const Command models = { .run = stow_models_run, .takes_model = FALSE };

static guint
status_of (const GError *error)
{
  if (error->domain == STOW_CLI_ERROR)
    return error->code == STOW_CLI_ERROR_NO_FIT ? 422 : 400;
  if (error->domain == STOW_MODEL_ERROR)
    switch ((StowModelError)error->code)
      {
      case STOW_MODEL_ERROR_NOT_FOUND:
        return 404;
      case STOW_MODEL_ERROR_ACCESS:
        return 403;
      case STOW_MODEL_ERROR_NETWORK:
        return 502;
      default:
        return 400;
      }
  return 400;
}

/* The answer's content type and, for a config, the name to save it as. */
static const char *
answer_type (const StowServeParams *p, const char *model_name, char **filename)
{
  const char *emit = stow_serve_params_get (p, "emit");
  const char *format = stow_serve_params_get (p, "format");
  const char *json = stow_serve_params_get (p, "json");
  *filename = NULL;
  if (emit != NULL)
    {
      static const struct
      {
        StowEmitKind kind;
        const char *suffix, *type;
      } kinds[] = {
        { STOW_EMIT_DEEPSPEED, "ds_config.json",
          "application/json; charset=utf-8" },
        { STOW_EMIT_MEGATRON, "megatron-args.txt",
          "text/plain; charset=utf-8" },
        { STOW_EMIT_FSDP, "fsdp.py", "text/x-python; charset=utf-8" },
        { STOW_EMIT_ACCELERATE, "accelerate.yaml",
          "application/yaml; charset=utf-8" },
        { STOW_EMIT_PLAN, "plan.json", "application/json; charset=utf-8" },
      };
      StowEmitKind kind;
      if (!stow_emit_kind_parse (emit, "emit", &kind, NULL))
        return "text/plain; charset=utf-8";
      /* A name safe in a header and on any file system. */
      g_autofree char *base = g_strdup (model_name ? model_name : "stowage");
      for (char *c = base; *c; c++)
        if (!(g_ascii_isalnum (*c) || *c == '.' || *c == '-' || *c == '_'))
          *c = '_';
      for (gsize i = 0; i < G_N_ELEMENTS (kinds); i++)
        if (kinds[i].kind == kind)
          {
            *filename = g_strdup_printf ("%.80s-%s", base, kinds[i].suffix);
            return kinds[i].type;
          }
    }
  if (format != NULL)
    {
      StowFormat f;
      if (!stow_format_parse (format, "format", &f, NULL))
        return "text/plain; charset=utf-8";
      switch (f)
        {
        case STOW_FORMAT_JSON:
          return "application/json; charset=utf-8";
        case STOW_FORMAT_CSV:
          return "text/csv; charset=utf-8";
        case STOW_FORMAT_MD:
          return "text/markdown; charset=utf-8";
        case STOW_FORMAT_HTML:
          return "text/html; charset=utf-8";
        case STOW_FORMAT_TEXT:
          return "text/plain; charset=utf-8";
        }
    }
  if (json != NULL && strcmp (json, "") != 0 && strcmp (json, "1") != 0
      && g_ascii_strcasecmp (json, "true") != 0
      && g_ascii_strcasecmp (json, "yes") != 0
      && g_ascii_strcasecmp (json, "on") != 0)
    return "text/plain; charset=utf-8";
  return "application/json; charset=utf-8";
}

static void
run_command (const StowServeEndpoint *endpoint, const StowServeParams *params,
             const StowServeOptions *options, StowServeReply *reply)
{
  const Command *cmd = endpoint->data;
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) pasted = NULL;
  if (params->config != NULL)
    {
      if (!cmd->takes_model)
        error = g_error_new (STOW_CLI_ERROR, STOW_CLI_ERROR_PARAM,
                             "parameter \"config\": /api/%s takes no model",
                             endpoint->name);
      else if (stow_serve_params_get (params, "model") != NULL)
        error = g_error_new_literal (
            STOW_CLI_ERROR, STOW_CLI_ERROR_PARAM,
            "parameters \"model\" and \"config\" both given; a pasted "
            "config.json is the model: give one");
      else
        /* The limits of a config.json file (size, nesting). */
        pasted = stow_model_new_from_data (params->config, -1, "config.json",
                                           &error);
      if (error != NULL)
        {
          stow_serve_reply_fail (reply, 400, error, NULL, "config");
          return;
        }
    }

  StowCliCall call;
  stow_cli_call_init (&call, (const char *const *)params->names->pdata,
                      (const char *const *)params->values->pdata,
                      params->names->len, cmd->takes_model, pasted);
  call.max_sim_passes = options->max_sim_passes;
  call.max_top = options->max_top;
  call.max_answer_bytes = options->max_answer_bytes;
  char *argv[] = { (char *)endpoint->name, NULL };
  int code = cmd->run (&call, 1, argv);
  reply->exit_code = code;
  for (guint i = 0; i < call.warnings->len; i++)
    g_ptr_array_add (reply->warnings, g_strdup (call.warnings->pdata[i]));
  if (call.error != NULL || code == STOW_EXIT_FAILURE)
    {
      if (call.error == NULL)
        call.error = g_error_new_literal (STOW_CLI_ERROR, STOW_CLI_ERROR_PARAM,
                                          "failed");
      stow_serve_reply_fail (reply, status_of (call.error), call.error,
                             call.hint, call.field);
      reply->exit_code = code;
    }
  else
    {
      reply->status = 200;
      g_string_assign (reply->body, call.answer->str);
      const char *name
          = pasted ? pasted->name : stow_serve_params_get (params, "model");
      reply->content_type = answer_type (params, name, &reply->filename);
    }
  stow_cli_call_clear (&call);
}

static const StowServeEndpoint endpoints[] = {
  { .name = "fit", .run = run_command, .data = &fit },
  { .name = "plan", .run = run_command, .data = &plan },
  { .name = "mem", .run = run_command, .data = &mem },
  { .name = "simulate", .run = run_command, .data = &simulate },
  { .name = "model", .run = run_command, .data = &model },
  { .name = "gpus", .run = run_command, .data = &gpus },
  { .name = "models", .run = run_command, .data = &models },
};

const StowServeEndpoint *
stow_cli_api_endpoints (gsize *n)
{
  *n = G_N_ELEMENTS (endpoints);
  return endpoints;
}
