// The config's policies for a preview, applied the way the plugin applies them
// for one ADD (host/src/policy/decide.rs): settings validated once, then per
// pod: select-ranges of every policy (the first list, narrowed by each later
// one), the engine's candidates, pick-address of every policy per range
// (merged: a veto wins, refusals add up, the first preference counts and later
// ones narrow it), and plan-all with that guidance. `on_error` and `mode` are
// applied here and nowhere else.
//
// Policies are reached through a `host` ({load(i), call(i, hook, args)}, each
// resolving to {ok} or {fail: text}): a Web Worker in the page, an in-process
// instance in the Node tests. This file never runs policy code itself.

import { Simulation, cellsOf } from './model.js';

/** How many free addresses a policy is offered per range (the plugin's `CANDIDATES`). */
export const CANDIDATES = 32;
/** Most pods a preview with policies plans: each is several calls into a worker. */
export const MAX_POLICY_PODS = 1000;

const q = (s) => JSON.stringify(s);

/** A failure that stops the pod's ADD (what the plugin's CNI error would say). */
class Stop extends Error {}

/**
 * Why a failure of this policy does not stop the ADD, or null: a policy on
 * trial (`mode: monitor`) never stops a pod, whatever its `on_error`; an
 * enforcing one only with `on_error: ignore` (the plugin's `tolerated`).
 */
function tolerated(config) {
  if (config.mode === 'monitor') return 'mode: monitor';
  return config.onError === 'ignore' ? 'on_error: ignore' : null;
}

/** One failed call: logged with its cause when tolerated, else it stops the ADD. */
function fail(p, hook, what, log) {
  const text = `policy ${q(p.config.name)}, ${hook}: ${what}`;
  const why = tolerated(p.config);
  if (why) {
    log.push(`${text}; ignored (${why}), the built-in choice stands`);
    return;
  }
  throw new Stop(text);
}

/**
 * Loads every policy and validates its settings, once per preview (the
 * plugin does it at every ADD; the answer cannot differ, the hook is pure).
 * Returns {active: [{index, config, needs}], stop: text|null, log}.
 */
export async function preparePolicies(policies, host) {
  const active = [];
  const log = [];
  try {
    for (const [index, config] of policies.entries()) {
      const loaded = await host.load(index);
      if (loaded.fail) {
        const why = tolerated(config);
        if (why) {
          log.push(`policy ${q(config.name)} not loaded, ignored (${why}): ${loaded.fail}`);
          continue;
        }
        throw new Stop(`policy ${q(config.name)}: ${loaded.fail}`);
      }
      const p = { index, config, needs: { labels: false, annotations: false } };
      const answer = await host.call(index, 'validate-settings', [config.settings]);
      if (answer.fail) fail(p, 'validate-settings', answer.fail, log);
      else active.push({ ...p, needs: answer.ok });
    }
  } catch (e) {
    if (e instanceof Stop) return { active: [], stop: e.message, log };
    throw e;
  }
  return { active, stop: null, log };
}

/** The config as a policy sees it: no datastore credentials, no policies. */
export function redacted(config) {
  const none = undefined;
  return {
    ...config,
    policies: [],
    datastore: { ...config.datastore, etcdUsername: none, etcdPassword: none, etcdKeyFile: none, etcdCertFile: none, etcdCaCertFile: none, kubeconfig: none },
  };
}

/** Who pod `i` (0-based) of a preview is: named like `thereabouts preview` names it. */
export function subjectOf(i, identity) {
  const namespace = identity.namespace || 'default';
  const podName = `${identity.prefix ?? 'pod-'}${i}`;
  const containerId = `preview-${i}`;
  return {
    podNamespace: namespace,
    podName,
    containerId,
    ifname: 'net1',
    cniArgs: [['K8S_POD_NAMESPACE', namespace], ['K8S_POD_NAME', podName], ['K8S_POD_INFRA_CONTAINER_ID', containerId]],
    labels: identity.labels || [],
  };
}

function inputFor(p, subject, seen) {
  const { needs } = p;
  return {
    podNamespace: subject.podNamespace,
    podName: subject.podName,
    containerId: subject.containerId,
    ifname: subject.ifname,
    cniArgs: subject.cniArgs,
    config: seen,
    pod: needs.labels || needs.annotations ? { labels: needs.labels ? subject.labels : [], annotations: [] } : undefined,
    settings: p.config.settings,
  };
}

/** The ranges to serve, or null when no enforcing policy chose. */
async function select(active, host, subject, seen, log) {
  let selection = null;
  for (const p of active) {
    const answer = await host.call(p.index, 'select-ranges', [inputFor(p, subject, seen), seen.ranges.length]);
    if (answer.fail) { fail(p, 'select-ranges', answer.fail, log); continue; }
    if (p.config.mode === 'monitor') {
      log.push(`policy ${q(p.config.name)} (monitor) select-ranges: ${'veto' in answer.ok ? `refused: ${answer.ok.veto}` : `[${answer.ok.ranges.join(', ')}]`}`);
      continue;
    }
    if ('veto' in answer.ok) throw new Stop(`policy ${q(p.config.name)} refused the attachment: ${answer.ok.veto}`);
    const keep = new Set(answer.ok.ranges);
    selection = selection === null ? answer.ok.ranges : selection.filter((r) => keep.has(r));
    if (!selection.length) throw new Stop(`policy ${q(p.config.name)} refused the attachment: no range is left that every policy selected`);
  }
  return selection;
}

/**
 * Each policy's pick in every offered range, merged per range. `skip` holds
 * "policy:range" picks to leave out (an `ignore` policy whose preference the
 * engine found bad). Each merged pick keeps who refused what, for the preview.
 */
async function picks(active, host, subject, seen, offered, skip, log) {
  const merged = [];
  for (const range of offered.filter((r) => r.held === undefined || r.held === null)) {
    const m = { rangeIndex: range.rangeIndex, prefer: [], refuse: [], veto: undefined, preferOf: null, refusals: [] };
    let free = [...range.free];
    for (const p of active) {
      if (skip.has(`${p.index}:${range.rangeIndex}`)) continue;
      const answer = await host.call(p.index, 'pick-address', [inputFor(p, subject, seen), range.rangeIndex, free]);
      if (answer.fail) { fail(p, 'pick-address', answer.fail, log); continue; }
      const pick = answer.ok;
      if (p.config.mode === 'monitor') {
        log.push(`policy ${q(p.config.name)} (monitor) pick-address in range ${range.rangeIndex + 1}: ${describePick(pick)}`);
        continue;
      }
      const refused = new Set(pick.refused.map((r) => r.address));
      free = free.filter((a) => !refused.has(a));
      m.prefer = m.prefer.filter((a) => !refused.has(a));
      m.refuse.push(...refused);
      for (const r of pick.refused) m.refusals.push({ range: range.rangeIndex, address: r.address, policy: p.config.name, reason: r.reason });
      const { tag, val } = pick.choice;
      if (tag === 'veto') {
        m.veto ??= `policy ${q(p.config.name)}: ${val}`;
      } else if (tag === 'prefer' && m.preferOf === null) {
        const refuse = new Set(m.refuse);
        m.prefer = val.filter((a) => !refuse.has(a));
        m.preferOf = p.index;
        if (!m.prefer.length) m.veto ??= `policy ${q(p.config.name)}: every address it preferred was refused`;
      } else if (tag === 'prefer') {
        const later = new Set(val);
        m.prefer = m.prefer.filter((a) => later.has(a));
        if (!m.prefer.length) m.veto ??= `policy ${q(p.config.name)}: none of the addresses it preferred is one an earlier policy preferred`;
      }
    }
    merged.push(m);
  }
  return merged;
}

function describePick(pick) {
  const { tag, val } = pick.choice;
  const choice = tag === 'prefer' ? `prefer ${val.join(', ')}` : tag === 'veto' ? `veto: ${val}` : 'built-in';
  return pick.refused.length ? `${choice}; refused ${pick.refused.map((r) => r.address).join(', ')}` : choice;
}

const guidanceOf = (selection, merged) => ({
  ranges: selection === null ? undefined : Uint32Array.from(selection),
  picks: merged.map((m) => ({ rangeIndex: m.rangeIndex, prefer: m.prefer, refuse: [...new Set(m.refuse)], veto: m.veto })),
});

/** The engine's plan-failure (or anything else it threw) as the ADD's error text. */
function planFailureText(e) {
  const p = e && e.payload;
  if (p && p.tag === 'bad-pick') return p.val.message;
  if (p && typeof p.val === 'string') return p.val;
  throw e;
}

/**
 * Plans one pod with the policies: {outcomes, refused, log} or {failure, refused, log}.
 * `pools`: the pools in the component's shape (`Simulation.lower`).
 */
export async function planPod({ engine, config, pools, subject, active, host }) {
  const log = [];
  let refused = [];
  const request = { containerId: subject.containerId, podRef: `${subject.podNamespace}/${subject.podName}`, ifname: subject.ifname, contention: 0, guidance: undefined, preferred: [] };
  const seen = redacted(config);
  try {
    const selection = await select(active, host, subject, seen, log);
    const ranges = selection ?? config.ranges.map((_, i) => i);
    const offered = engine.candidates(config, pools, 'from-pools', request, Uint32Array.from(ranges), CANDIDATES);
    const skip = new Set();
    for (;;) {
      const merged = await picks(active, host, subject, seen, offered, skip, log);
      refused = merged.flatMap((m) => m.refusals);
      try {
        const outcomes = engine.planAll(config, pools, 'from-pools', { ...request, guidance: guidanceOf(selection, merged) });
        return { outcomes, refused, log };
      } catch (e) {
        const bad = e && e.payload && e.payload.tag === 'bad-pick' ? e.payload.val : null;
        const m = bad && merged.find((x) => x.rangeIndex === bad.rangeIndex);
        if (!m || m.preferOf === null) return { failure: planFailureText(e), refused, log };
        const p = active.find((x) => x.index === m.preferOf);
        fail(p, 'pick-address', `gave a bad answer: ${bad.message}`, log);
        skip.add(`${p.index}:${bad.rangeIndex}`);
      }
    }
  } catch (e) {
    if (e instanceof Stop) return { failure: e.message, refused, log };
    throw e;
  }
}

/**
 * `count` pods planned one at a time with the policies, each served pod
 * committed to the simulated pools before the next; a failing pod does not
 * stop later ones. Returns a Simulation whose pods also carry `name`,
 * `refused`, `failure` and `log`; `cancelled()` true abandons the run (null).
 * `cluster`: a pasted cluster's state to start from (see Simulation).
 */
export async function previewWithPolicies({ engine, config, count, identity, host, cluster = null, cancelled = () => false, progress = () => {} }) {
  const sim = new Simulation(engine, config, 0, cluster);
  const prepared = await preparePolicies(config.policies, host);
  const pools = sim.basePools();
  for (let i = 0; i < count; i++) {
    if (cancelled()) return null;
    const subject = subjectOf(i, identity);
    const name = `${subject.podNamespace}/${subject.podName}`;
    const planned = prepared.stop
      ? { failure: prepared.stop, refused: [], log: [] }
      : await planPod({ engine, config, pools: Simulation.lower(pools), subject, active: prepared.active, host });
    let cells;
    if (planned.outcomes) {
      cells = cellsOf(config, planned.outcomes);
      sim.hold(pools, cells);
    } else {
      cells = config.ranges.map(() => ({ failed: planned.failure }));
    }
    // What loading logged (an ignored policy) is shown once, with the first pod.
    sim.pods.push({ pod: sim.nextPod++, name, cells, added: false, refused: planned.refused, failure: planned.failure ?? null, log: [...(i ? [] : prepared.log), ...planned.log] });
    progress(i + 1);
  }
  return sim;
}

/** The preview in `thereabouts preview --output json`'s `pods` shape. */
export function podsJson(sim) {
  return sim.pods.map((p) => ({
    pod: p.pod,
    name: p.name,
    addresses: p.cells.map((c) => c.address ?? null),
    refused: p.refused,
    failure: p.failure,
  }));
}
