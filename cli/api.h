/* SPDX-License-Identifier: MIT
 *
 * cli/api.h: the JSON API's endpoints for serve/: the planning commands
 * run for a request (cli/api.c).
 */
#pragma once

#include "serve/serve.h"

G_BEGIN_DECLS

/* /api/fit, plan, mem, simulate, model, gpus and models; static. */
const StowServeEndpoint *stow_cli_api_endpoints (gsize *n);

G_END_DECLS
