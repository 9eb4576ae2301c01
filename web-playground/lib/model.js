// Everything the page computes, on top of the engine component. Allocation
// decisions (normalization, preview, churn) are the engine's; this file only keeps
// the pool state between calls and derives the warnings from engine answers.
//
// The engine is passed in (the jco-transpiled component's `engine` export), so the
// same code runs in the browser and under Node.

export const MAX_PODS = 10000;

/** A ConfigError thrown by the component (jco throws ComponentError with .payload). */
export function configErrorOf(e) {
  const p = e && e.payload;
  if (p && typeof p === 'object' && 'message' in p) return { code: p.code, field: p.field, message: p.message };
  return null;
}

export const offsetKey = (o) => (BigInt(o.high) << 64n) | BigInt(o.low);

/** A pool-snapshot as the WIT has it: offsets below 2^64 in `taken` (a list<u64>), wider ones in `takenWide`. */
function emptyPool() {
  return { taken: new BigUint64Array(0), takenWide: [], reserved: [], held: [] };
}
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

/** True when `ip` lies in the network of `range` (engine's offset-of). */
function offsetIn(engine, range, ip) {
  try { return offsetKey(engine.offsetOf(range, ip)); } catch { return null; }
}

/** Warnings about a normalized config (overlaps, gateways inside the span). */
export function configWarnings(engine, config) {
  const warnings = [];
  const rs = config.ranges;
  for (let i = 0; i < rs.length; i++) {
    for (let j = i + 1; j < rs.length; j++) {
      const a = rs[i], b = rs[j];
      if (a.family !== b.family) continue;
      if (a.cidr === b.cidr) {
        warnings.push({ kind: 'overlap', ranges: [i, j], text: `Ranges ${i + 1} and ${j + 1} are the same network ${a.cidr}: they share the IPPool ${a.poolName}, and each pod takes two addresses from it.` });
        continue;
      }
      // The larger network contains the smaller one's addresses, if they overlap at all.
      const [outer, inner] = a.prefixLen <= b.prefixLen ? [a, b] : [b, a];
      const points = [a.first, a.last, b.first, b.last].map((ip) => offsetIn(engine, outer, ip));
      if (points.some((p) => p === null)) continue;
      const [af, al, bf, bl] = points;
      if (af <= bl && bf <= al) {
        const lo = af > bf ? a.first : b.first;
        const hi = al < bl ? a.last : b.last;
        warnings.push({
          kind: 'overlap', ranges: [i, j],
          text: `Ranges ${i + 1} (${a.cidr}) and ${j + 1} (${b.cidr}) overlap (${lo} – ${hi}). ` +
            (config.enableOverlappingRanges
              ? 'With enable_overlapping_ranges (on) an address taken in one is skipped in the other.'
              : 'enable_overlapping_ranges is off: the plugin may hand the same address out from both pools.'),
        });
      }
    }
  }
  rs.forEach((r, i) => {
    if (!r.gateway) return;
    const g = offsetIn(engine, r, r.gateway);
    if (g === null) {
      warnings.push({ kind: 'gateway', ranges: [i], text: `Range ${i + 1} (${r.cidr}): gateway ${r.gateway} is outside the range's network.` });
      return;
    }
    if (g < offsetKey(r.firstOffset) || g > offsetKey(r.lastOffset)) return;
    // Inside [first, last]: ask the engine whether a pod could actually be given it
    // (a request for exactly that address on an empty pool; excluded => rejected).
    const outcome = engine.plan(r, emptyPool(),
      { containerId: 'playground-gateway-check', podRef: 'playground/gateway-check', ifname: 'net1', requestedIp: r.gateway, contention: 0 });
    if (outcome.tag === 'fresh') {
      warnings.push({ kind: 'gateway', ranges: [i], text: `Range ${i + 1} (${r.cidr}): gateway ${r.gateway} is inside the allocatable span ${r.first} – ${r.last} and not excluded, so a pod can be given the gateway's address. Exclude it or move range_start past it.` });
    }
  });
  return warnings;
}

/**
 * The simulation state: the pods that hold addresses, built from the engine's
 * preview and changed by churn. `pods` is ordered by pod number; each has one
 * cell per range: {ip, address, offset: {high, low}} or {exhausted|rejected|failed: message}.
 */
export class Simulation {
  constructor(engine, config, count) {
    this.engine = engine;
    this.config = config;
    this.nextPod = 1;
    this.pods = [];
    this.log = [];
    // Which pairs of ranges share addresses (networks nest, so one contains the
    // other's first address), to look for overlapping reservations only there.
    const rs = config.ranges;
    this.overlaps = rs.map((a, i) => rs.map((b, j) => i !== j && a.poolName !== b.poolName && a.family === b.family &&
      (offsetIn(engine, a, b.first) !== null || offsetIn(engine, b, a.first) !== null)));
    // The bulk form of the engine's preview: one string and two integer lists
    // instead of 20 000 records (jco decodes every string and offset separately).
    const table = engine.previewTable(config, [], count);
    const lines = table.served > 0 ? table.addresses.split('\n') : [];
    const n = rs.length;
    for (let p = 0; p < table.served; p++) {
      const cells = lines[p].split(' ').map((address, i) => ({
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

  /** True when the pod got an address in every range (otherwise ADD failed and it holds nothing). */
  static served(p) {
    return p.cells.every((c) => c.ip);
  }

  /**
   * One pool snapshot per range, as the plugin would read them: the offsets held
   * in the range's IPPool (ranges with the same pool name share it), plus, when
   * enable_overlapping_ranges is on, the addresses held in other pools that fall
   * inside this range (their overlapping-range reservations).
   */
  snapshots() {
    const work = this.config.ranges.map(() => ({ taken: [], takenWide: [], reserved: [], held: [] }));
    for (const p of this.pods) if (Simulation.served(p)) this.hold(work, p.cells);
    return work;
  }

  /** Records a pod's addresses in the working snapshots. */
  hold(work, cells) {
    const rs = this.config.ranges;
    cells.forEach((c, i) => {
      const r = rs[i];
      rs.forEach((other, j) => {
        if (other.poolName === r.poolName) {
          if (c.offset.high === 0n) work[j].taken.push(c.offset.low);
          else work[j].takenWide.push(c.offset);
        } else if (this.config.enableOverlappingRanges && this.overlaps[i][j]) {
          const o = offsetIn(this.engine, other, c.ip);
          if (o !== null) work[j].reserved.push(toOffset(o));
        }
      });
    });
  }

  /** The working snapshots in the component's shape. */
  static lower(work) {
    return work.map((w) => ({ taken: BigUint64Array.from(w.taken), takenWide: w.takenWide, reserved: w.reserved, held: w.held }));
  }

  /** Deletes the given pod numbers (unknown ones are reported), then adds `add` pods. */
  churn(deleteList, add) {
    const want = new Set(deleteList);
    const deleted = this.pods.filter((p) => want.has(p.pod)).map((p) => p.pod);
    this.pods = this.pods.filter((p) => !want.has(p.pod));
    for (const p of this.pods) p.added = false;
    const missing = [...want].filter((n) => !deleted.includes(n));
    const added = [];
    const work = this.snapshots();
    for (let k = 0; k < add; k++) {
      const pod = this.nextPod++;
      const req = { containerId: `playground-${pod}`, podRef: `playground/pod-${pod}`, ifname: 'net1', requestedIp: undefined, contention: 0 };
      let cells;
      try {
        cells = this.engine.planAll(this.config, Simulation.lower(work), req).map(cellOf);
        this.hold(work, cells);
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

function cellOf(outcome) {
  switch (outcome.tag) {
    case 'fresh': return { ip: outcome.val.ip, address: outcome.val.address, offset: outcome.val.offset };
    case 'reuse': return { ip: outcome.val.assignment.ip, address: outcome.val.assignment.address, offset: outcome.val.assignment.offset };
    case 'exhausted': return { exhausted: outcome.val };
    case 'rejected': return { rejected: outcome.val };
    default: return { failed: JSON.stringify(outcome) };
  }
}

/** Per range: addresses held now (by pods whose ADD succeeded), usable total, and when it first ran out. */
export function usage(sim) {
  return sim.config.ranges.map((r, i) => {
    let used = 0;
    let firstExhausted = null;
    for (const p of sim.pods) {
      const c = p.cells[i];
      if (c.ip) { if (Simulation.served(p)) used++; }
      // Only the range that ran out; the pod's other ranges are `rejected` (ADD stores nothing).
      else if (firstExhausted === null && c.exhausted) firstExhausted = { pod: p.pod, message: c.exhausted };
    }
    const usable = BigInt(r.usable);
    return { used, usable, firstExhausted };
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
