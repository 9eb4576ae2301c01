// The playground page: reads the config, asks the engine component, renders.
import { extractConfig, ExtractError } from './lib/nad.js';
import { normalize, configWarnings, Simulation, usage, parsePodList, offsetKey, MAX_PODS } from './lib/model.js';
import { EXAMPLES, POLICY_SETTINGS } from './lib/examples.js';
import { previewWithPolicies, podsJson, MAX_POLICY_PODS } from './lib/policies.js';
import { PolicyRunner, deadlineOf } from './lib/policy-runner.js';
import { PolicySources } from './lib/policy-sources.js';
import { addPolicy, usesFile, fileNameOf, parseLabels, PolicyEditError, POLICY_DIR } from './lib/config-policies.js';
import { readCluster, ownerOf, MAX_SHARED_CLUSTER } from './lib/cluster.js';

const $ = (id) => document.getElementById(id);
const els = {
  example: $('example'), config: $('config'), pods: $('pods'), run: $('run'), share: $('share'), shareStatus: $('share-status'),
  errorsSection: $('errors-section'), errors: $('errors'),
  rangesSection: $('ranges-section'), ranges: $('ranges').tBodies[0], networkInfo: $('network-info'), statics: $('statics'),
  warningsSection: $('warnings-section'), warnings: $('warnings'),
  previewSection: $('preview-section'), usage: $('usage'), summary: $('preview-summary'), podsTable: $('pods-table'),
  podsHead: document.querySelector('#pods-table .phead'), podsBody: document.querySelector('#pods-table .pbody'),
  churnDelete: $('churn-delete'), churnAdd: $('churn-add'), churnApply: $('churn-apply'), churnReset: $('churn-reset'), churnLog: $('churn-log'),
  engineInfo: $('engine-info'), churnBox: $('churn-box'),
  policyExample: $('policy-example'), policyFile: $('policy-file'), policyStatus: $('policy-status'), policyList: $('policy-list'),
  podNamespace: $('pod-namespace'), podPrefix: $('pod-prefix'), podLabels: $('pod-labels'),
  cluster: $('cluster'), clusterBox: $('cluster-box'), clusterSection: $('cluster-section'), clusterSummary: $('cluster-summary'),
  clusterEntries: $('cluster-entries').tBodies[0], clusterMore: $('cluster-more'),
};

const CODE_NAMES = { 1: 'incompatible CNI version', 4: 'invalid environment variables', 6: 'undecodable content', 7: 'invalid network configuration' };
const ROWS_PER_CHUNK = 250;   // rows per content-visibility chunk
const ROW_PX = 28;            // estimated row height, for chunks not yet laid out
const MAX_CHURN_ADD = 200;    // each added pod is one plan-all call over the whole pools (~6 ms at 10 000 pods)
const MAX_CLUSTER_ROWS = 1000; // entries listed in "In the cluster" (all of them count)

let engine = null;
let sim = null;          // the current Simulation, or null when the config is broken
let churnSteps = [];     // [[deleteText, addCount], ...] applied since the last preview, for the link
let baseWarnings = [];
let lastHash = '';
let clusterShared = true; // whether the link carries the pasted cluster state (small enough)
// Policies run in a worker (lib/policy-runner.js); a preview with policies is
// asynchronous, and a newer one supersedes it (policyRun counts them).
const runner = new PolicyRunner(new URL('./policy-worker.js', import.meta.url));
const sources = new PolicySources(runner);
let policyRun = 0;
let lastConfig = null;   // the last config that normalized, for the policy file picker

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
const fmt = (n) => (typeof n === 'bigint' ? n : BigInt(n)).toLocaleString('en-US');

// ---------------------------------------------------------------- URL fragment

function toBase64Url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
function fromBase64Url(s) {
  const bin = atob(s.replace(/-/g, '+').replace(/_/g, '/'));
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}

function currentHash() {
  const params = new URLSearchParams();
  params.set('n', String(podCount()));
  const identity = { ns: [els.podNamespace.value, 'default'], prefix: [els.podPrefix.value, 'pod-'], labels: [els.podLabels.value, ''] };
  for (const [k, [v, dflt]] of Object.entries(identity)) if (v !== dflt) params.set(k, v);
  if (churnSteps.length) params.set('churn', churnSteps.map(([d, a]) => `${d.replace(/\s+/g, '')}~${a}`).join('|'));
  params.set('config', toBase64Url(els.config.value));
  // The pasted cluster state only when small: a link of a whole cluster's
  // pools would be too long to share (and browsers cap URLs).
  const cluster = els.cluster.value.trim() ? toBase64Url(els.cluster.value) : '';
  clusterShared = cluster.length <= MAX_SHARED_CLUSTER;
  if (cluster && clusterShared) params.set('cluster', cluster);
  return '#' + params.toString();
}

function writeHash() {
  lastHash = currentHash();
  if (location.hash !== lastHash) history.replaceState(null, '', lastHash);
}

/** Loads the view from the fragment; false if there is nothing to load. */
function readHash() {
  if (!location.hash || location.hash.length < 2) return false;
  const params = new URLSearchParams(location.hash.slice(1));
  const encoded = params.get('config');
  if (encoded === null) return false;
  try {
    els.config.value = fromBase64Url(encoded);
    const cluster = params.get('cluster');
    els.cluster.value = cluster === null ? '' : fromBase64Url(cluster);
    if (cluster !== null) els.clusterBox.open = true;
  } catch {
    showErrors([{ field: '#config', message: 'The link\'s config could not be decoded (was it cut short?).', source: 'playground' }]);
    return true;
  }
  els.podNamespace.value = params.get('ns') ?? 'default';
  els.podPrefix.value = params.get('prefix') ?? 'pod-';
  els.podLabels.value = params.get('labels') ?? '';
  const n = Number(params.get('n'));
  if (Number.isInteger(n) && n >= 1) els.pods.value = String(Math.min(n, MAX_PODS));
  els.example.value = '';
  const steps = (params.get('churn') || '').split('|').filter(Boolean).map((s) => {
    const [d, a] = s.split('~');
    return [d || '', Number(a) || 0];
  });
  run();
  for (const [d, a] of steps) applyChurn(d, a);
  writeHash();
  return true;
}

// ---------------------------------------------------------------- running

function podCount() {
  const n = Math.floor(Number(els.pods.value));
  if (!Number.isFinite(n) || n < 1) return 10;
  return Math.min(n, MAX_PODS);
}

/** Computes and renders the whole view. Returns timings in ms (null when the config is broken). */
function run() {
  if (!engine) return null;
  try {
    return compute();
  } catch (e) {
    // Not a ConfigError: the component trapped (a bug in the engine, worth a report).
    showBroken([{ field: '', message: `The engine failed: ${e && e.message ? e.message : e}. Please report this config; reload the page to continue.`, source: 'playground' }]);
    console.error(e);
    return null;
  }
}

function compute() {
  const t0 = performance.now();
  // A preview with policies still running is superseded.
  policyRun++;
  runner.reset();
  delete els.previewSection.dataset.policies;
  churnSteps = [];
  els.churnLog.innerHTML = '';
  let text;
  try {
    text = extractConfig(els.config.value);
  } catch (e) {
    if (!(e instanceof ExtractError)) throw e;
    showBroken([{ field: e.field, message: e.message + (e.line ? ` (line ${e.line})` : ''), source: 'yaml' }]);
    return null;
  }
  const result = normalize(engine, text.config);
  if (result.errors) {
    showBroken(result.errors);
    return null;
  }
  const config = result.config;
  lastConfig = config;
  const cluster = readCluster(engine, config, els.cluster.value);
  if (cluster?.error) {
    showBroken([cluster.error]);
    return null;
  }
  baseWarnings = configWarnings(engine, config);
  renderPolicyList(config);
  renderCluster(config, cluster);
  if (config.policies.length) {
    startPolicyPreview(config, text, cluster);
    return null;
  }
  sim = new Simulation(engine, config, podCount(), cluster);
  els.churnBox.hidden = false;
  const t1 = performance.now();
  showErrors([]);
  renderRanges(config, text);
  renderPreview();
  // Force style and layout so the figure includes them.
  void els.podsTable.offsetHeight;
  const t2 = performance.now();
  const timing = { compute: t1 - t0, render: t2 - t1, total: t2 - t0, pods: sim.pods.length };
  els.summary.textContent = `${fmt(sim.pods.length)} pods · computed by the engine in ${timing.compute.toFixed(1)} ms, rendered in ${timing.render.toFixed(1)} ms.`;
  window.playground.lastTiming = timing;
  return timing;
}

// ---------------------------------------------------------------- policies

/** The pods' identity from the Policies section; throws PolicyEditError on bad labels. */
function identity() {
  return { namespace: els.podNamespace.value.trim() || 'default', prefix: els.podPrefix.value, labels: parseLabels(els.podLabels.value) };
}

/** Pods planned one at a time through the policies (in the worker), then rendered. */
function startPolicyPreview(config, text, cluster) {
  const run = policyRun;
  const count = Math.min(podCount(), MAX_POLICY_PODS);
  let who;
  try {
    who = identity();
  } catch (e) {
    if (!(e instanceof PolicyEditError)) throw e;
    showBroken([{ field: 'Labels', message: e.message, source: 'playground' }]);
    return;
  }
  sim = null;
  showErrors([]);
  renderRanges(config, text);
  els.warningsSection.hidden = true;
  els.previewSection.hidden = false;
  els.previewSection.dataset.policies = 'running';
  els.churnBox.hidden = true;
  els.usage.innerHTML = '';
  els.podsHead.innerHTML = '';
  els.podsBody.innerHTML = '';
  const t0 = performance.now();
  const capped = count < podCount() ? ` (at most ${fmt(MAX_POLICY_PODS)} with policies)` : '';
  els.summary.textContent = `Running ${config.policies.length} polic${config.policies.length === 1 ? 'y' : 'ies'} for ${fmt(count)} pods${capped}…`;
  previewWithPolicies({
    engine, config, count, identity: who, host: sources.hostFor(config.policies), cluster,
    cancelled: () => run !== policyRun,
    progress: (done) => { if (run === policyRun && done % 10 === 0) els.summary.textContent = `Planned ${fmt(done)} of ${fmt(count)} pods with the policies…`; },
  }).then((result) => {
    if (!result || run !== policyRun) return;
    sim = result;
    renderPreview();
    const failed = sim.pods.filter((p) => p.failure).length;
    els.summary.textContent = `${fmt(sim.pods.length)} pods${capped} planned one at a time with ${config.policies.length} polic${config.policies.length === 1 ? 'y' : 'ies'} in ${(performance.now() - t0).toFixed(0)} ms` +
      `${failed ? `; ${fmt(failed)} got no address` : ''}. Each policy call ran in a worker, on a fresh instance.`;
    window.playground.policyPreview = { ranges: config.ranges.map((r) => r.cidr), pods: podsJson(sim) };
    els.previewSection.dataset.policies = 'done';
  }).catch((e) => {
    if (run !== policyRun) return;
    console.error(e);
    showBroken([{ field: '', message: `The preview with policies failed: ${e && e.message ? e.message : e}`, source: 'playground' }]);
  });
}

/** The config's policies, what each resolves to, and the deadline the page enforces. */
function renderPolicyList(config) {
  els.policyList.innerHTML = config.policies.map((p) => {
    const file = fileNameOf(p.path);
    const kind = { picked: 'loaded from disk', example: 'example policy' }[sources.kindOf(p.path)] ?? 'not in the playground';
    const deadline = deadlineOf(p.timeoutMs);
    return `<li data-policy="${esc(p.name)}"><code>${esc(p.name)}</code>: ${esc(file)} (${kind}) · ${p.mode} · on_error ${p.onError} · timeout_ms ${p.timeoutMs}` +
      `${deadline > p.timeoutMs ? ` (the page waits ${deadline} ms)` : ''} · memory_mib ${p.memoryMib}</li>`;
  }).join('');
}

function policyStatus(text, isError = false) {
  els.policyStatus.textContent = text;
  els.policyStatus.classList.toggle('error-line', isError);
}

/** Appends a policy entry to the config (its `policies` are the source of truth) and previews. */
function addPolicyEntry(entry) {
  try {
    els.config.value = addPolicy(els.config.value, entry);
  } catch (e) {
    if (!(e instanceof PolicyEditError)) throw e;
    policyStatus(`Could not add ${entry.name}: ${e.message}.`, true);
    return false;
  }
  els.example.value = '';
  runNow();
  return true;
}

function addExamplePolicy(name) {
  if (!name) return;
  const entry = { name, path: `${POLICY_DIR}/${name}.wasm`, settings: POLICY_SETTINGS[name] ?? {}, timeout_ms: 10, memory_mib: 4, on_error: 'deny', mode: 'enforce' };
  if (addPolicyEntry(entry)) policyStatus(`Added ${name} to the config's policies: edit its settings there.`);
  els.policyExample.value = '';
}

async function loadPolicyFile(file) {
  if (!file) return;
  policyStatus(`Transpiling ${file.name} with jco…`);
  const added = await sources.addFile(file.name, await file.arrayBuffer());
  if (added.fail) { policyStatus(added.fail, true); return; }
  if (lastConfig && usesFile(lastConfig.policies, file.name)) {
    policyStatus(`Loaded ${file.name}: the config's policy with that file name runs it.`);
    runNow();
    return;
  }
  const name = file.name.replace(/\.wasm$/i, '').replace(/[^A-Za-z0-9_.-]/g, '-') || 'policy';
  if (addPolicyEntry({ name, path: `${POLICY_DIR}/${file.name}`, settings: {} })) policyStatus(`Loaded ${file.name} and added it to the config's policies.`);
}

function showBroken(errors) {
  sim = null;
  policyRun++;
  showErrors(errors);
  els.rangesSection.hidden = true;
  els.clusterSection.hidden = true;
  els.warningsSection.hidden = true;
  els.previewSection.hidden = true;
  els.podsBody.innerHTML = '';
}

function showErrors(errors) {
  els.errorsSection.hidden = errors.length === 0;
  els.errors.innerHTML = errors.map((e, i) => {
    const origin = {
      plugin: 'The plugin rejects this config:',
      entry: `Also wrong (this ipRanges entry checked on its own):`,
      yaml: 'Could not read the NetworkAttachmentDefinition:',
      cluster: 'Could not read the cluster state:',
      playground: 'Playground:',
    }[e.source] || '';
    const code = e.code ? `<span class="code">CNI error ${e.code}${CODE_NAMES[e.code] ? ' (' + CODE_NAMES[e.code] + ')' : ''}</span>` : '';
    return `<div class="error" data-index="${i}"><div>${esc(origin)} ${code}</div>
      <div>Field: <span class="field">${e.field ? esc(e.field) : '(the whole document)'}</span></div>
      <p class="message">${esc(e.message)}</p></div>`;
  }).join('');
}

function renderRanges(config, text) {
  els.rangesSection.hidden = false;
  const bits = [];
  if (text.kind === 'nad') bits.push(`from spec.config${text.name ? ' of ' + text.name : ''}`);
  bits.push(`network ${config.name || '(unnamed)'}`);
  if (config.networkName) bits.push(`network_name ${config.networkName}`);
  bits.push(`CNI ${config.cniVersion}`);
  els.networkInfo.textContent = '— ' + bits.join(' · ');
  els.ranges.innerHTML = config.ranges.map((r, i) => {
    const span = offsetKey(r.lastOffset) - offsetKey(r.firstOffset) + 1n;
    const excluded = span - BigInt(r.usable);
    const blocks = r.excludeCidrs.length ? `<br><span class="hint">${r.excludeCidrs.map(esc).join(', ')}</span>` : '';
    return `<tr><td>${i + 1}</td><td>${esc(r.cidr)}</td><td>${esc(r.first)}</td><td>${esc(r.last)}</td>
      <td class="num">${fmt(r.usable)}</td><td class="num">${fmt(excluded < 0n ? 0n : excluded)}${blocks}</td>
      <td>${r.gateway ? esc(r.gateway) : '<span class="hint">none</span>'}</td><td>${esc(r.poolName)}</td></tr>`;
  }).join('');
  if (config.addresses.length) {
    els.statics.hidden = false;
    els.statics.textContent = 'Static addresses every pod also gets, after the allocated ones: ' + config.addresses.map((a) => a.address).join(', ');
  } else {
    els.statics.hidden = true;
  }
}

/**
 * What the pasted cluster holds for the config (the engine's `cluster-state`):
 * every entry with its owner (a pod, an IPAMClaim, a DRA ResourceClaim), the
 * addresses other reservations take, the IPAMClaims, what was ignored.
 */
function renderCluster(config, cluster) {
  els.clusterSection.hidden = !cluster;
  if (!cluster) return;
  const claims = cluster.entries.filter((e) => e.allocation.claim).length;
  els.clusterSummary.textContent = `${fmt(cluster.entries.length)} entr${cluster.entries.length === 1 ? 'y' : 'ies'} in this config's pools (${fmt(claims)} owned by a claim), ` +
    `${fmt(cluster.reserved.length)} other reservation${cluster.reserved.length === 1 ? '' : 's'}, ${fmt(cluster.ipamClaims.length)} IPAMClaim${cluster.ipamClaims.length === 1 ? '' : 's'}, ` +
    `${fmt(cluster.ignored.length)} object${cluster.ignored.length === 1 ? '' : 's'} ignored. The pods below come after them.`;
  els.clusterEntries.innerHTML = cluster.entries.slice(0, MAX_CLUSTER_ROWS).map((e) => {
    const a = e.allocation;
    const owner = ownerOf(a.claim);
    const range = config.ranges[e.rangeIndex];
    return `<tr data-owner="${owner.kind}" data-ip="${esc(e.ip)}"><td>${e.rangeIndex + 1}: ${esc(range.cidr)}</td><td>${esc(e.ip)}</td>` +
      `<td>${a.podRef ? esc(a.podRef) : '<span class="hint">none</span>'}</td><td>${esc(a.ifname)}</td>` +
      `<td class="owner owner-${owner.kind}">${esc(owner.text)}</td><td>${esc(e.poolObject)}</td></tr>`;
  }).join('');
  const more = [];
  if (cluster.entries.length > MAX_CLUSTER_ROWS) more.push(`<p class="hint">The first ${fmt(MAX_CLUSTER_ROWS)} entries are listed; all of them count.</p>`);
  const list = (id, title, items) => items.length ? `<h3>${title}</h3><ul id="${id}">${items.join('')}</ul>` : '';
  more.push(list('cluster-reserved', 'Reserved by other reservations', cluster.reserved.map((r) =>
    `<li data-ip="${esc(r.ip)}"><code>${esc(r.ip)}</code> (range ${r.rangeIndex + 1}): reservation ${esc(r.name)}` +
    `${r.podRef ? ` of ${esc(r.podRef)}` : ''}${r.claim ? `, ${esc(ownerOf(r.claim).text)}` : ''}</li>`)));
  more.push(list('cluster-claims', 'IPAMClaims', cluster.ipamClaims.map((c) => {
    const held = cluster.entries.filter((e) => e.allocation.claim?.tag === 'ipam-claim' && e.allocation.claim.val === c.name).map((e) => e.ip);
    return `<li data-claim="${esc(c.name)}"><code>${esc(c.name)}</code>${c.network ? ` network ${esc(c.network)}` : ''}${c.interface ? ` interface ${esc(c.interface)}` : ''}` +
      `${c.ips.length ? ` · status.ips ${esc(c.ips.join(', '))}` : ''}${c.ownerPod ? ` · owner pod ${esc(c.ownerPod)}` : ''}` +
      ` · ${held.length ? `holds ${esc(held.join(', '))} in this config's pools` : 'holds nothing in this config\'s pools'}</li>`;
  })));
  more.push(list('cluster-ignored', 'Ignored', cluster.ignored.map((i) =>
    `<li>${esc(i.kind || '(no kind)')} ${esc(i.name)}: ${esc(i.reason)}</li>`)));
  els.clusterMore.innerHTML = more.join('');
}

function renderPreview() {
  const config = sim.config;
  const use = usage(sim);
  els.previewSection.hidden = false;

  // Usage bars; with a pasted cluster, how much of it is the cluster's.
  const fromCluster = config.ranges.map((_, i) => {
    const here = (sim.cluster?.entries ?? []).filter((e) => e.rangeIndex === i);
    return { entries: here.length, claims: here.filter((e) => e.allocation.claim).length };
  });
  els.usage.innerHTML = config.ranges.map((r, i) => {
    const { used, usable } = use[i];
    const pct = usable === 0n ? 100 : Number((BigInt(used) * 1000000n) / usable) / 10000;
    const shown = pct > 0 && pct < 0.01 ? '<0.01' : pct.toFixed(pct < 10 ? 2 : 1);
    const full = usable > 0n && BigInt(used) >= usable;
    return `<div class="bar-row"><span class="label">${esc(r.cidr)}</span>
      <div class="bar${full ? ' full' : ''}" role="meter" aria-label="${esc(r.cidr)} usage" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${Math.min(100, pct)}"><span style="width:${Math.min(100, pct)}%"></span></div>
      <span class="figure">${fmt(used)} / ${fmt(usable)} used (${shown}%)${sim.cluster ? `, ${fmt(fromCluster[i].entries)} in the cluster (${fmt(fromCluster[i].claims)} held by claims)` : ''}</span></div>`;
  }).join('');

  // Warnings: the config's, and ranges that run out.
  const warnings = [...baseWarnings];
  use.forEach((u, i) => {
    if (u.firstExhausted) {
      const r = config.ranges[i];
      warnings.push({ kind: 'exhausted', text: `Range ${i + 1} (${r.cidr}) runs out at pod ${u.firstExhausted.pod}: it has ${fmt(u.usable)} usable addresses. From that pod on, ADD fails with: ${u.firstExhausted.message}` });
    }
  });
  els.warningsSection.hidden = warnings.length === 0;
  els.warnings.innerHTML = warnings.map((w) => `<li data-kind="${w.kind}">${esc(w.text)}</li>`).join('');

  // The pod table: one column per range, in range order (dual-stack pairs side by side).
  const anyFail = sim.pods.some((p) => !Simulation.served(p));
  // With policies: each pod's name, and what the policies refused it (and logged).
  const withPolicies = sim.pods.length > 0 && sim.pods[0].refused !== undefined;
  const heads = config.ranges.map((r, i) => `Range ${i + 1}: ${r.cidr}`);
  const widths = heads.map((h) => h.length);
  let podWidth = 3;
  const parts = [];
  let lastNote = '';
  const n = sim.pods.length;
  for (let k = 0; k < n; k++) {
    if (k % ROWS_PER_CHUNK === 0) {
      const rowsHere = Math.min(ROWS_PER_CHUNK, n - k);
      // The first chunk is always rendered; later ones only when scrolled near.
      parts.push(k ? `</div><div class="pchunk" role="rowgroup" style="--chunk-h:${rowsHere * ROW_PX}px">` : '<div role="rowgroup">');
    }
    const p = sim.pods[k];
    const ok = Simulation.served(p);
    let cls = 'prow';
    if (p.added) cls += ' new';
    if (!ok) cls += ' fails';
    const name = withPolicies ? ` <span class="podname">${esc(p.name)}</span>` : '';
    let row = `<div class="${cls}" role="row"><div class="pod" role="cell">${p.pod}${name}</div>`;
    for (let i = 0; i < p.cells.length; i++) {
      const c = p.cells[i];
      if (c.ip) {
        if (c.address.length > widths[i]) widths[i] = c.address.length;
        row += `<div role="cell">${c.address}</div>`;
      } else if (c.none) {
        row += '<div class="out" role="cell">–</div>';
      } else {
        row += `<div class="out" role="cell">${c.failed ? 'no address' : 'exhausted'}</div>`;
      }
    }
    if (anyFail) {
      let note = '';
      if (!ok) {
        const c = p.cells.find((x) => !x.ip && !x.none);
        const msg = c.exhausted || c.rejected || c.failed;
        note = msg === lastNote ? 'ADD fails (same error)' : `ADD fails: ${esc(msg)}`;
        lastNote = msg;
      }
      row += `<div class="note" role="cell">${note}</div>`;
    }
    if (withPolicies) row += policyCell(p);
    parts.push(row + '</div>');
  }
  if (n) parts.push('</div>');
  podWidth = Math.max(podWidth, String(sim.nextPod).length + 4);
  if (withPolicies) podWidth = Math.max(podWidth, ...sim.pods.map((p) => String(p.pod).length + p.name.length + 2));
  const cols = [`calc(${podWidth}ch + 1.2rem)`, ...widths.map((w) => `calc(${w}ch + 1.2rem)`)];
  // With policies the texts are long: they wrap in the width left (see .with-policies).
  if (anyFail) cols.push(withPolicies ? 'minmax(12rem, 2fr)' : 'auto');
  if (withPolicies) cols.push('minmax(14rem, 3fr)');
  els.podsTable.classList.toggle('with-policies', withPolicies);
  els.podsTable.style.setProperty('--cols', cols.join(' '));
  els.podsHead.innerHTML = `<div class="prow" role="row"><div class="pod" role="columnheader">Pod</div>${heads.map((h) =>
    `<div role="columnheader">${esc(h)}</div>`).join('')}${anyFail ? '<div role="columnheader">Result</div>' : ''}${withPolicies ? '<div role="columnheader">Refused by policies</div>' : ''}</div>`;
  // Every row in one go.
  els.podsBody.innerHTML = parts.join('');
}

/** A pod's refusals (policy, address, reason) and the policies' log lines (ignored errors, monitor verdicts). */
function policyCell(p) {
  const refused = p.refused.map((r) => `<li class="refusal" data-range="${r.range}" data-address="${esc(r.address)}"><code>${esc(r.address)}</code> (range ${r.range + 1}) by <code>${esc(r.policy)}</code>: ${esc(r.reason)}</li>`);
  const log = p.log.map((line) => `<li class="policy-log">${esc(line)}</li>`);
  const items = [...refused, ...log];
  return `<div class="refused" role="cell">${items.length ? `<ul>${items.join('')}</ul>` : '<span class="hint">none</span>'}</div>`;
}

// ---------------------------------------------------------------- churn

function applyChurn(deleteText, add) {
  if (!sim) return false;
  let list;
  try {
    list = parsePodList(deleteText);
  } catch (e) {
    logChurn(`Could not read “Delete pods”: ${e.message}`, true);
    return false;
  }
  add = Math.max(0, Math.min(MAX_CHURN_ADD, Math.floor(Number(add) || 0)));
  const { deleted, missing, added } = sim.churn(list, add);
  churnSteps.push([deleteText, add]);
  const got = added.filter((p) => Simulation.served(p));
  const failed = added.length - got.length;
  let msg = `Deleted ${deleted.length ? 'pod' + (deleted.length > 1 ? 's ' : ' ') + compactList(deleted) : 'no pods'}`;
  if (missing.length) msg += ` (no pod ${compactList(missing)})`;
  msg += `; added ${added.length} pod${added.length === 1 ? '' : 's'}`;
  if (got.length) {
    const shown = got.slice(0, 8).map((p) => `${p.pod} → ${p.cells.filter((c) => c.ip).map((c) => c.ip).join(' + ')}`).join(', ');
    msg += `: ${shown}${got.length > 8 ? ', …' : ''}`;
  }
  if (failed) msg += `; ${failed} got no address (a range is exhausted)`;
  logChurn(msg + '.');
  renderPreview();
  els.summary.textContent = `${fmt(sim.pods.length)} pods after ${churnSteps.length} churn step${churnSteps.length === 1 ? '' : 's'}. New pods are highlighted.`;
  return true;
}

function compactList(nums) {
  const s = [...nums].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j] + 1) j++;
    out.push(j > i ? `${s[i]}–${s[j]}` : `${s[i]}`);
    i = j;
  }
  return out.join(', ');
}

function logChurn(text, isError = false) {
  const li = document.createElement('li');
  li.textContent = text;
  if (isError) li.className = 'error-line';
  els.churnLog.append(li);
}

// ---------------------------------------------------------------- wiring

let timer = 0;
function schedule() {
  clearTimeout(timer);
  timer = setTimeout(() => { run(); writeHash(); }, 250);
}

function runNow() {
  clearTimeout(timer);
  run();
  writeHash();
}

function loadExample(id) {
  const ex = EXAMPLES.find((e) => e.id === id);
  if (!ex) return;
  els.config.value = ex.text;
  runNow();
}

async function share() {
  writeHash();
  const url = location.href;
  const left = clusterShared ? '' : ' The pasted cluster state is too large for a link and is not in it: the link previews from empty pools.';
  try {
    await navigator.clipboard.writeText(url);
    els.shareStatus.textContent = 'Link copied: it reproduces this view.' + left;
  } catch {
    els.shareStatus.textContent = 'The address bar now holds the link to this view.' + left;
  }
}

function wire() {
  els.example.insertAdjacentHTML('beforeend', EXAMPLES.map((e) => `<option value="${e.id}">${esc(e.title)}</option>`).join(''));
  els.example.addEventListener('change', () => loadExample(els.example.value));
  els.config.addEventListener('input', schedule);
  els.cluster.addEventListener('input', schedule);
  els.config.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); runNow(); }
  });
  els.pods.addEventListener('change', () => {
    els.pods.value = String(podCount());
    runNow();
  });
  els.pods.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') { els.pods.value = String(podCount()); runNow(); } });
  els.run.addEventListener('click', runNow);
  els.share.addEventListener('click', share);
  els.churnApply.addEventListener('click', () => { if (applyChurn(els.churnDelete.value, els.churnAdd.value)) writeHash(); });
  for (const input of [els.churnDelete, els.churnAdd]) {
    input.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') els.churnApply.click(); });
  }
  els.churnReset.addEventListener('click', runNow);
  els.policyExample.addEventListener('change', () => addExamplePolicy(els.policyExample.value));
  els.policyFile.addEventListener('change', () => {
    loadPolicyFile(els.policyFile.files[0])
      .catch((e) => policyStatus(`Could not load the file: ${e.message}`, true))
      // Picking the same file again (after changing it on disk) must fire `change` again.
      .finally(() => { els.policyFile.value = ''; });
  });
  for (const input of [els.podNamespace, els.podPrefix, els.podLabels]) input.addEventListener('input', schedule);
  window.addEventListener('hashchange', () => { if (location.hash !== lastHash) readHash(); });
}

window.playground = {
  lastTiming: null,
  /** For tests and the README figure: set config + pods, compute and render; returns timings. */
  measure(text, pods) {
    els.config.value = text;
    els.pods.value = String(pods);
    return run();
  },
};

window.playground.ready = (async () => {
  wire();
  try {
    ({ engine } = await import('./engine/engine.js'));
  } catch (e) {
    els.engineInfo.textContent = '';
    showErrors([{ field: 'engine/engine.js', message: `The engine component is not built or failed to load (${e.message}). Build it with: bash web-playground/build.sh`, source: 'playground' }]);
    throw e;
  }
  await sources.init();
  els.policyExample.insertAdjacentHTML('beforeend', sources.exampleNames().map((n) => `<option value="${esc(n)}">${esc(n)}</option>`).join(''));
  try {
    const info = await (await fetch('engine/build-info.json')).json();
    els.engineInfo.textContent = `Engine: the thereabouts component (sha256 ${info.component_sha256}…, ${fmt(info.bytes)} bytes), transpiled with jco. Nothing leaves this page.`;
  } catch {
    els.engineInfo.textContent = 'Engine: the thereabouts component, transpiled with jco.';
  }
  if (!readHash()) {
    els.example.value = EXAMPLES[0].id;
    els.config.value = EXAMPLES[0].text;
    runNow();
  }
  document.documentElement.dataset.ready = 'true';
})();
