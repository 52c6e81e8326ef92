// SPDX-License-Identifier: MIT
//
// serve/page/app.js: the page's one script.  The form's fields are the
// API's parameters (the CLI's flags without their dashes), the question
// lives in the URL (/?model=llama-65b&gpus=8xA100-80GB answers itself on
// load), and every number shown is the JSON the API answered: /api/fit for
// the verdict and the terms, its HTML format for the report's chart,
// /api/plan for the ranked layouts and fit's all-offloads for the table.
'use strict';

const FIELDS = ['model', 'gpus', 'seq', 'global-batch', 'micro-batch',
  'precision', 'optimizer', 'finetune', 'engine', 'zero',
  'offload-optimizer', 'offload-params', 'recompute', 'tp', 'pp',
  'host-ram', 'nvme'];
// fit --all-offloads searches these itself.
const OFFLOAD_FIELDS = ['zero', 'offload-optimizer', 'offload-params'];

const $ = (id) => document.getElementById(id);
const field = (name) => document.querySelector(`#question [name="${name}"]`);

let current = null; // the question being answered: its AbortController

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `the server answered ${status}`);
    this.status = status;
    this.field = body ? body.field : undefined;
    this.hint = body ? body.hint : undefined;
  }
}

function gib(bytes) {
  return (bytes / 2 ** 30).toFixed(2) + ' GiB';
}

function grouped(n) {
  return Math.round(n).toLocaleString('en-US');
}

function seconds(s) {
  if (s < 60) return s.toFixed(3) + ' s';
  if (s < 3600) return (s / 60).toFixed(2) + ' min';
  return (s / 3600).toFixed(2) + ' h';
}

// "dp 8, tp 1, pp 1, ZeRO 3, optimizer on cpu, micro-batch 1 x 1, stowage"
function describe(l) {
  const p = [`dp ${l.dp}`, `tp ${l.tp}${l.sp ? ' (sp)' : ''}`, `pp ${l.pp}`];
  if (l.vpp > 1) p.push(`vpp ${l.vpp}`);
  if (l.cp > 1) p.push(`cp ${l.cp}`);
  if (l.ep > 1) p.push(`ep ${l.ep}`);
  p.push(`ZeRO ${l.zero}${l.hybrid_shard ? ' (hybrid shard)' : ''}`);
  if (l.offload_optimizer !== 'none') p.push(`optimizer on ${l.offload_optimizer}`);
  if (l.offload_params !== 'none') p.push(`parameters on ${l.offload_params}`);
  if (l.offload_activations && l.offload_activations !== 'none') {
    p.push(`checkpoints on ${l.offload_activations}`);
  }
  if (l.recompute !== 'none') {
    p.push(`recompute ${l.recompute}${l.recompute_layers ? ':' + l.recompute_layers : ''}`);
  }
  p.push(`micro-batch ${l.micro_batch} x ${l.grad_accum}`);
  p.push(l.engine);
  return p.join(', ');
}

function formParams() {
  const p = new URLSearchParams();
  for (const name of FIELDS) {
    const v = field(name).value.trim();
    if (v !== '') p.append(name, v);
  }
  return p;
}

function fillForm(p) {
  for (const name of FIELDS) field(name).value = p.get(name) || '';
}

// One API call: GET with the parameters in the query, or POST with them
// and a pasted config.json as a JSON body.
async function request(endpoint, params, extra, config, signal, text) {
  const all = new URLSearchParams(params);
  for (const [k, v] of Object.entries(extra || {})) all.set(k, v);
  let resp;
  if (config) {
    const body = Object.fromEntries(all);
    body.config = config;
    resp = await fetch(`/api/${endpoint}`, {
      method: 'POST', signal, body: JSON.stringify(body),
      headers: { 'Content-Type': 'application/json' },
    });
  } else {
    resp = await fetch(`/api/${endpoint}?${all}`, { signal });
  }
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch (e) { /* not JSON */ }
    throw new ApiError(resp.status, body);
  }
  return { resp, data: text ? await resp.text() : await resp.json() };
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function setStatus(text) {
  const s = $('status');
  if (text === null) {
    s.hidden = true;
    return;
  }
  $('status-text').textContent = text;
  s.hidden = false;
}

function clearError() {
  $('error').hidden = true;
  for (const el of document.querySelectorAll('[aria-invalid]')) {
    el.removeAttribute('aria-invalid');
    el.removeAttribute('aria-describedby');
  }
}

function showError(e) {
  const box = $('error');
  box.replaceChildren();
  const p = document.createElement('p');
  p.textContent = e.message;
  box.appendChild(p);
  if (e.hint) {
    const h = document.createElement('p');
    h.className = 'hint';
    h.textContent = e.hint;
    box.appendChild(h);
  }
  box.hidden = false;
  const input = e.field && field(e.field === 'config' ? 'config' : e.field);
  if (input) {
    input.setAttribute('aria-invalid', 'true');
    input.setAttribute('aria-describedby', 'error');
    if (e.field === 'config') $('paste').open = true;
    else if (input.closest('details')) input.closest('details').open = true;
    input.focus();
  }
}

function renderFit(f, question) {
  const fits = f.fits === true;
  const v = $('verdict');
  v.textContent = `${fits ? 'Fits' : 'Does not fit'}: ${f.model.name} on ${f.cluster.spec}`;
  v.dataset.fits = String(fits);
  v.className = fits ? 'fits' : 'nofit';
  $('layout').textContent = describe(f.layout);
  const dev = f.device;
  $('per-gpu').textContent = gib(dev.total_bytes);
  $('per-gpu').dataset.bytes = dev.total_bytes;
  $('capacity').textContent = gib(dev.capacity_bytes);
  $('capacity').dataset.bytes = dev.capacity_bytes;
  $('host').textContent = `${gib(f.host.total_bytes)} of ${gib(f.host.capacity_bytes)}`;
  $('host').dataset.bytes = f.host.total_bytes;
  for (const el of document.querySelectorAll('.if-fits')) el.hidden = !f.predicted;
  if (f.predicted) {
    $('step').textContent = seconds(f.predicted.step_time_s);
    $('step').dataset.s = f.predicted.step_time_s;
    $('tokens').textContent = grouped(f.predicted.tokens_per_s);
    $('tokens').dataset.value = f.predicted.tokens_per_s;
    $('mfu').textContent = (100 * f.predicted.mfu).toFixed(1) + '%';
    $('mfu').dataset.value = f.predicted.mfu;
  }
  $('counts').textContent =
    `${grouped(f.layouts_fitting)} of ${grouped(f.layouts_evaluated)} searched fit`;

  const alts = f.alternatives || [];
  $('alternatives').hidden = alts.length === 0;
  const list = $('alternatives-list');
  list.replaceChildren();
  for (const a of alts) {
    const li = document.createElement('li');
    const what = a.kind === 'finetune' ? `--finetune ${a.finetune}`
      : a.kind === 'more_host_memory' ? `${gib(a.host_bytes)} host RAM per node`
        : a.gpus;
    li.textContent = `${what}: ${describe(a.layout)} (${gib(a.total_bytes)} per GPU)`;
    list.appendChild(li);
  }

  const stage = dev.stages.find((s) => s.stage === dev.peak_stage) || dev.stages[0];
  const body = $('terms').tBodies[0];
  body.replaceChildren();
  for (const t of stage.terms) {
    const tr = document.createElement('tr');
    cell(tr, t.name);
    cell(tr, grouped(t.bytes), 'num').dataset.bytes = t.bytes;
    cell(tr, (t.bytes / 2 ** 30).toFixed(2), 'num');
    cell(tr, t.formula, 'formula');
    body.appendChild(tr);
  }
  $('downloads').dataset.question = question;
}

function renderChart(html) {
  const fig = $('chart');
  const doc = new DOMParser().parseFromString(html, 'text/html');
  const svg = doc.querySelector('svg');
  const cap = document.createElement('figcaption');
  cap.className = 'note';
  if (!svg) {
    cap.textContent = 'This stowage was built without cairo and draws no charts; the table has every term.';
    fig.replaceChildren(cap);
    return;
  }
  for (const s of svg.querySelectorAll('script, foreignObject')) s.remove();
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', 'Memory per GPU by term for each pipeline stage, against the usable capacity');
  cap.textContent = 'Each pipeline stage\u2019s memory by term against the usable capacity (the report\u2019s chart).';
  fig.replaceChildren(document.importNode(svg, true), cap);
}

function renderPlans(p) {
  const body = $('plans').tBodies[0];
  body.replaceChildren();
  $('plan-note').textContent =
    `${grouped(p.fitting)} of ${grouped(p.candidates_evaluated)} layouts fit ` +
    `(${grouped(p.out_of_memory)} over the GPU memory, ${grouped(p.out_of_host_or_nvme)} ` +
    `over the host RAM or NVMe), ranked by the time model; searched in ${p.search_time_s.toFixed(2)} s.`;
  if (p.plans.length === 0) {
    const tr = document.createElement('tr');
    cell(tr, 'No layout fits.').colSpan = 8;
    body.appendChild(tr);
  }
  for (const c of p.plans) {
    const tr = document.createElement('tr');
    cell(tr, String(c.rank), 'num');
    cell(tr, describe(c.layout));
    cell(tr, gib(c.total_bytes), 'num').dataset.bytes = c.total_bytes;
    cell(tr, gib(Math.max(c.headroom_bytes, 0)), 'num');
    cell(tr, c.step_time_s.toPrecision(4), 'num').dataset.s = c.step_time_s;
    cell(tr, grouped(c.tokens_per_s), 'num').dataset.value = c.tokens_per_s;
    cell(tr, (100 * c.mfu).toFixed(1) + '%', 'num');
    const k = c.dominant;
    cell(tr, `${k} ${c.exposed_s[k].toPrecision(3)} s`);
    body.appendChild(tr);
  }
}

function renderOffloads(o) {
  const body = $('offloads').tBodies[0];
  body.replaceChildren();
  $('offloads-note').textContent =
    'The fastest layout that fits with each choice, else the closest.';
  for (const r of o.rows) {
    const tr = document.createElement('tr');
    cell(tr, String(r.zero), 'num');
    cell(tr, r.offload_optimizer);
    cell(tr, r.offload_params);
    if (r.same_as_lower_stage) {
      cell(tr, `same as ZeRO ${r.zero - 1}: one data-parallel rank`).colSpan = 6;
    } else {
      cell(tr, gib(r.gpu_bytes), 'num').dataset.bytes = r.gpu_bytes;
      cell(tr, gib(r.host_bytes_per_node), 'num');
      cell(tr, gib(r.nvme_bytes_per_node), 'num');
      cell(tr, r.fits ? 'yes' : 'no', r.fits ? 'fits' : 'nofit');
      cell(tr, seconds(r.step_time_s), 'num');
      cell(tr, `dp ${r.dp} tp ${r.tp} pp ${r.pp}, micro-batch ${r.micro_batch}, recompute ${r.recompute}`);
    }
    body.appendChild(tr);
  }
}

function sectionFailed(note, e) {
  if (e.name === 'AbortError') return;
  note.textContent = e.message;
}

async function ask(params, config) {
  if (current) current.abort();
  const ctl = new AbortController();
  current = ctl;
  clearError();
  document.body.dataset.state = 'waiting';
  $('ask').disabled = true;
  $('answer').setAttribute('aria-busy', 'true');
  const what = `${config ? 'the pasted config' : params.get('model') || 'the model'} on ${params.get('gpus') || 'the GPUs'}`;
  const t0 = performance.now();
  let waiting = `Searching every layout of ${what}`;
  const tick = () => setStatus(`${waiting}\u2026 ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  tick();
  const timer = setInterval(tick, 100);

  const get = (endpoint, extra, text) =>
    request(endpoint, params, extra, config, ctl.signal, text);
  const fit = get('fit', {});
  const chart = get('fit', { format: 'html' }, true);
  const plans = get('plan', { top: '10' });
  const open = OFFLOAD_FIELDS.every((n) => !params.has(n));
  const offloads = open ? get('fit', { 'all-offloads': 'true' }) : null;
  for (const p of [chart, plans, offloads]) if (p) p.catch(() => {});

  const done = (state) => {
    if (current !== ctl) return;
    clearInterval(timer);
    setStatus(null);
    $('ask').disabled = false;
    $('answer').removeAttribute('aria-busy');
    document.body.dataset.state = state;
  };
  try {
    const f = await fit;
    if (current !== ctl) return;
    renderFit(f.data, params.toString());
    $('chart').replaceChildren(Object.assign(document.createElement('figcaption'),
      { className: 'note', textContent: 'Drawing the chart\u2026' }));
    $('plans').tBodies[0].replaceChildren();
    $('offloads').tBodies[0].replaceChildren();
    $('plan-note').textContent = 'Ranking every layout that fits\u2026';
    $('offloads-note').textContent = open ? 'Pricing every ZeRO stage and offload\u2026'
      : 'With ZeRO or an offload pinned above, this table has one row to show: clear them to compare every choice.';
    $('download-status').textContent = '';
    $('answer').hidden = false;
    waiting = `Ranking the layouts of ${what}`;
    tick();
  } catch (e) {
    if (e.name === 'AbortError') return;
    done('error');
    $('answer').hidden = true;
    showError(e);
    return;
  }
  await Promise.all([
    chart.then((r) => renderChart(r.data), (e) => sectionFailed($('chart'), e)),
    plans.then((r) => renderPlans(r.data), (e) => sectionFailed($('plan-note'), e)),
    offloads ? offloads.then((r) => renderOffloads(r.data),
      (e) => sectionFailed($('offloads-note'), e)) : null,
  ]);
  if (current !== ctl) return;
  done('done');
  $('answer').focus({ preventScroll: true });
}

function currentConfig() {
  const c = field('config').value.trim();
  return c === '' ? null : c;
}

function submit(ev) {
  ev.preventDefault();
  const params = formParams();
  const config = currentConfig();
  if (config) params.delete('model');
  // The question goes in the URL (not a pasted config: it is too long).
  const url = `/?${params}`;
  if (url !== location.pathname + location.search) history.pushState(null, '', url);
  const share = $('share');
  share.href = url;
  share.hidden = config !== null;
  ask(params, config);
}

async function download(ev) {
  const btn = ev.target.closest('button[data-emit]');
  if (!btn) return;
  const kind = btn.dataset.emit;
  const status = $('download-status');
  const params = new URLSearchParams($('downloads').dataset.question || '');
  status.textContent = `Writing the ${kind} config\u2026`;
  try {
    const { resp, data } = await request('fit', params, { emit: kind },
      currentConfig(), undefined, true);
    const cd = resp.headers.get('Content-Disposition') || '';
    const m = /filename="([^"]+)"/.exec(cd);
    const a = document.createElement('a');
    a.href = URL.createObjectURL(new Blob([data], { type: resp.headers.get('Content-Type') }));
    a.download = m ? m[1] : `${kind}.txt`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    status.textContent = `Saved ${a.download}.`;
  } catch (e) {
    status.textContent = e.message + (e.hint ? ` (${e.hint})` : '');
  }
}

function fromUrl() {
  const p = new URLSearchParams(location.search);
  fillForm(p);
  if (p.has('gpus') && p.has('model')) {
    $('share').href = `/?${formParams()}`;
    $('share').hidden = false;
    ask(formParams(), null);
  }
}

// The catalogs for the fields' suggestions; the page works without them.
async function fillLists() {
  try {
    const { data } = await request('models', new URLSearchParams(), {}, null);
    const list = $('models');
    for (const m of data.models) {
      const o = document.createElement('option');
      o.value = m.name;
      o.label = `${m.family}, ${(m.params / 1e9).toFixed(1)}B parameters`;
      list.appendChild(o);
    }
  } catch (e) { /* suggestions only */ }
  try {
    const { data } = await request('gpus', new URLSearchParams(), {}, null);
    const list = $('gpu-presets');
    const seen = new Set();
    const add = (value, label) => {
      if (seen.has(value)) return;
      seen.add(value);
      const o = document.createElement('option');
      o.value = value;
      o.label = label;
      list.appendChild(o);
    };
    for (const n of data.nodes) add(`${n.gpus_per_node}x${n.gpu.name}`, n.description);
    for (const g of data.gpus) add(`1x${g.name}`, g.description);
  } catch (e) { /* suggestions only */ }
}

document.addEventListener('DOMContentLoaded', () => {
  $('question').addEventListener('submit', submit);
  $('downloads').addEventListener('click', download);
  window.addEventListener('popstate', fromUrl);
  fillLists();
  fromUrl();
});
