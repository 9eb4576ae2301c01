// Everything the page computes, on top of the engine component. Every decision
// (normalization, warnings, preview, churn, usage) is the engine's; this file only
// keeps the simulated pools between calls, the way a datastore keeps them for the
// plugin, and shapes the engine's answers for the page.
//
// The engine is passed in (the jco-transpiled component's `engine` export), so the
// same code runs in the browser and under Node.

export const MAX_PODS = 10000;

/** The CNI numbers of the WIT's `error-code`s, as the plugin's error document prints them. */
const CNI_CODES = { 'incompatible-cni-version': 1, 'invalid-environment-variables': 4, 'undecodable-content': 6, 'invalid-network-config': 7 };

/** A ConfigError thrown by the component (jco throws ComponentError with .payload). */
export function configErrorOf(e) {
  const p = e && e.payload;
  if (p && typeof p === 'object' && 'message' in p) return { code: CNI_CODES[p.code], field: p.field, message: p.message };
  return null;
}

export const offsetKey = (o) => (BigInt(o.high) << 64n) | BigInt(o.low);

export const toOffset = (v) => ({ high: v >> 64n, low: v & 0xffffffffffffffffn });

/**
 * Normalize with the engine. Returns {config} or {errors}. The first error is the
 * plugin's (the engine stops at the first problem, as the plugin does); when it
 * concerns one address range, every other range entry is also checked on its own
 * with the engine, so all broken entries show at once.
 */
export function normalize(engine, configText) {
  try {
    return { config: engine.normalize(configText, undefined, '') };
  } catch (e) {
    const first = configErrorOf(e);
    if (!first) throw e;
    return { errors: [{ ...first, source: 'plugin' }, ...moreRangeErrors(engine, configText, first)] };
  }
}

function moreRangeErrors(engine, configText, first) {
  if (!/^ipam\.(ipRanges\[\d+\]|range|range_start|range_end|exclude)/.test(first.field)) return [];
  let doc;
  try { doc = JSON.parse(configText); } catch { return []; }
  // Conflists: the first plugin with an ipam section, as the engine picks it.
  const holder = Array.isArray(doc?.plugins) ? doc.plugins.find((p) => p && typeof p === 'object' && p.ipam) : doc;
  const ipam = holder?.ipam;
  if (!ipam || typeof ipam !== 'object' || !Array.isArray(ipam.ipRanges)) return [];
  const errors = [];
  ipam.ipRanges.forEach((entry, i) => {
    const field = `ipam.ipRanges[${i}]`;
    if (first.field.startsWith(field + '.') || first.field === field) return;
    const probeIpam = { ...ipam, ipRanges: [entry] };
    for (const k of Object.keys(probeIpam)) if (/^(range|range_start|range_end|exclude)$/i.test(k)) delete probeIpam[k];
    const probe = Array.isArray(doc.plugins)
      ? { ...doc, plugins: doc.plugins.map((p) => (p === holder ? { ...p, ipam: probeIpam } : p)) }
      : { ...doc, ipam: probeIpam };
    try {
      engine.normalize(JSON.stringify(probe), undefined, '');
    } catch (e) {
      const err = configErrorOf(e);
      if (err && err.field.startsWith('ipam.ipRanges[0]')) {
        const rewrite = (s) => s.replace('ipam.ipRanges[0]', field);
        errors.push({ code: err.code, field: rewrite(err.field), message: rewrite(err.message), source: 'entry' });
      }
    }
  });
  return errors;
}

/** Warnings about a normalized config (overlapping ranges, gateways a pod could get): the engine's. */
export function configWarnings(engine, config) {
  return engine.warnings(config).map((w) => ({ kind: w.kind, text: w.text }));
}

/**
 * The simulation state: the pods that hold addresses, built from the engine's
 * preview and changed by churn. `pods` is ordered by pod number; each has one
 * cell per range: {ip, address, offset: {high, low}}, {exhausted|rejected|failed: message},
 * or {none: true} for a range a served pod gets nothing from (`ipRangesAllocation`
 * `first_available`: one address, from the first range with room).
 */
export class Simulation {
  /**
   * `cluster`: the engine's `cluster-state` of a pasted cluster (lib/cluster.js),
   * whose pools the pods start from; null for empty pools.
   */
  constructor(engine, config, count, cluster = null) {
    this.engine = engine;
    this.config = config;
    this.cluster = cluster;
    this.nextPod = 1;
    this.pods = [];
    this.log = [];
    const rs = config.ranges;
    // The engine's preview is bulk-shaped: one string and two integer lists
    // instead of 20 000 records (jco decodes every string and offset separately).
    const table = engine.preview(config, Simulation.lower(this.basePools()), count);
    const lines = table.served > 0 ? table.addresses.split('\n') : [];
    const n = rs.length;
    for (let p = 0; p < table.served; p++) {
      // `-`: a range this pod gets nothing from (first_available).
      const cells = lines[p].split(' ').map((address, i) => (address === '-' ? { none: true } : {
        ip: address.slice(0, address.lastIndexOf('/')),
        address,
        offset: { high: table.offsetsHigh[p * n + i], low: table.offsetsLow[p * n + i] },
      }));
      this.pods.push({ pod: this.nextPod++, cells, added: false });
    }
    const failure = table.failure;
    for (let p = table.served; p < count; p++) {
      const cells = rs.map((_, i) => (i === failure.rangeIndex ? { exhausted: failure.exhausted } : { rejected: failure.rejected }));
      this.pods.push({ pod: this.nextPod++, cells, added: false });
    }
  }

  /** True when the pod got its addresses (otherwise ADD failed and it holds nothing). */
  static served(p) {
    return p.cells.every((c) => c.ip || c.none);
  }

  /**
   * The pools as a datastore would hold them: each pod that got its addresses has
   * one entry per range, in the pool that range writes to (its `poolName`). The
   * engine maps ranges onto pools and derives overlapping-range reservations.
   */
  pools() {
    const pools = this.basePools();
    for (const p of this.pods) if (Simulation.served(p)) this.hold(pools, p.cells);
    return pools;
  }

  /**
   * The pasted cluster's pools (entries and other reservations), as new
   * lists the simulated pods are added to; empty without a cluster.
   */
  basePools() {
    const pools = new Map();
    for (const p of this.cluster?.pools ?? []) {
      pools.set(p.name, { name: p.name, taken: [...p.taken], takenWide: [...p.takenWide], reserved: [...p.reserved], held: [] });
    }
    return pools;
  }

  /** Records a pod's addresses in the pools, as a committed ADD does. */
  hold(pools, cells) {
    cells.forEach((c, i) => {
      if (!c.ip) return;
      const name = this.config.ranges[i].poolName;
      let pool = pools.get(name);
      if (!pool) pools.set(name, (pool = { name, taken: [], takenWide: [], reserved: [], held: [] }));
      if (c.offset.high === 0n) pool.taken.push(c.offset.low);
      else pool.takenWide.push(c.offset);
    });
  }

  /** The pools in the component's shape (`pool-state`: `taken` is a list<u64>). */
  static lower(pools) {
    return [...pools.values()].map((p) => ({ ...p, taken: BigUint64Array.from(p.taken) }));
  }

  /** Deletes the given pod numbers (unknown ones are reported), then adds `add` pods. */
  churn(deleteList, add) {
    const want = new Set(deleteList);
    const deleted = this.pods.filter((p) => want.has(p.pod)).map((p) => p.pod);
    this.pods = this.pods.filter((p) => !want.has(p.pod));
    for (const p of this.pods) p.added = false;
    const missing = [...want].filter((n) => !deleted.includes(n));
    const added = [];
    const pools = this.pools();
    for (let k = 0; k < add; k++) {
      const pod = this.nextPod++;
      const req = { containerId: `playground-${pod}`, podRef: `playground/pod-${pod}`, ifname: 'net1', contention: 0, guidance: undefined, preferred: [] };
      let cells;
      try {
        // The simulated pools are the whole cluster: the engine reserves in each
        // range what the other pools hold (with enable_overlapping_ranges).
        const outcomes = this.engine.planAll(this.config, Simulation.lower(pools), 'from-pools', req);
        cells = cellsOf(this.config, outcomes);
        this.hold(pools, cells);
      } catch (e) {
        // plan-all fails as a whole when one range cannot be served: the plugin
        // stores nothing and the pod gets no address at all.
        const outcome = e && e.payload && e.payload.tag ? cellOf(e.payload) : { failed: String(e) };
        const why = outcome.exhausted || outcome.rejected || outcome.failed;
        cells = this.config.ranges.map(() => ({ failed: why }));
      }
      const entry = { pod, cells, added: true };
      this.pods.push(entry);
      added.push(entry);
    }
    this.log.push({ deleted, missing, added });
    return { deleted, missing, added };
  }
}

/** A served pod's cells from plan-all's outcomes: each names its range; a range not served (first_available) gives nothing. */
export function cellsOf(config, outcomes) {
  const cells = config.ranges.map(() => ({ none: true }));
  for (const o of outcomes) cells[(o.tag === 'reuse' ? o.val.assignment : o.val).rangeIndex] = cellOf(o);
  return cells;
}

function cellOf(outcome) {
  switch (outcome.tag) {
    case 'fresh': return { ip: outcome.val.ip, address: outcome.val.address, offset: outcome.val.offset };
    case 'reuse': return { ip: outcome.val.assignment.ip, address: outcome.val.assignment.address, offset: outcome.val.assignment.offset };
    // plan-all's failure variant.
    case 'exhausted': return { exhausted: outcome.val };
    case 'rejected': return { rejected: outcome.val };
    default: return { failed: JSON.stringify(outcome) };
  }
}

/**
 * Per range: addresses its pool holds now that the range hands out (the engine's
 * `usage`, as `thereabouts pools` counts them), usable total, and the first pod
 * for which it ran out.
 */
export function usage(sim) {
  const counted = sim.engine.usage(sim.config, Simulation.lower(sim.pools()));
  return sim.config.ranges.map((r, i) => {
    let firstExhausted = null;
    for (const p of sim.pods) {
      // Only the range that ran out; the pod's other ranges are `rejected` (ADD stores nothing).
      if (p.cells[i].exhausted) { firstExhausted = { pod: p.pod, message: p.cells[i].exhausted }; break; }
    }
    return { used: counted[i].allocated, usable: BigInt(r.usable), firstExhausted };
  });
}

/** "1, 3-5, 9" -> [1,3,4,5,9]; throws on anything else. */
export function parsePodList(text, limit = MAX_PODS * 10) {
  const out = [];
  for (const part of text.split(/[\s,]+/).filter(Boolean)) {
    const m = part.match(/^(\d+)(?:-(\d+))?$/);
    if (!m) throw new Error(`"${part}" is not a pod number or a range like 3-7`);
    const a = Number(m[1]);
    const b = m[2] === undefined ? a : Number(m[2]);
    if (b < a) throw new Error(`"${part}": the range runs backwards`);
    if (out.length + (b - a + 1) > limit) throw new Error('too many pods listed');
    for (let n = a; n <= b; n++) out.push(n);
  }
  return out;
}
