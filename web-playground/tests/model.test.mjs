// The page's model (lib/model.js) and examples (lib/examples.js) under Node, on
// the engine component as build.sh transpiled it: no browser needed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { engine } from '../engine/engine.js';
import { normalize, configErrorOf, configWarnings, Simulation, usage, parsePodList, offsetKey, toOffset } from '../lib/model.js';
import { EXAMPLES } from '../lib/examples.js';
import { extractConfig } from '../lib/nad.js';

const cni = (ipam) => JSON.stringify({ cniVersion: '1.0.0', name: 'n', ipam: { type: 'whereabouts', ...ipam } });
const configOf = (ipam) => normalize(engine, cni(ipam)).config;
const addresses = (sim) => sim.pods.map((p) => p.cells.map((c) => c.address ?? null));

test('every example but the broken one normalizes; the broken one fails where it says', () => {
  for (const e of EXAMPLES) {
    const result = normalize(engine, extractConfig(e.text).config);
    assert.equal(Boolean(result.errors), e.id === 'broken', e.id);
  }
});

test('normalize: the plugin\'s error first, then every other broken ipRanges entry on its own', () => {
  const { errors } = normalize(engine, cni({ ipRanges: [{ range: '192.0.2.0/24', exclude: ['nope'] }, { range: '192.0.2.0/24' }, { range: '2001:db8::/129' }] }));
  assert.deepEqual(errors.map((e) => [e.source, e.field, e.code]), [['plugin', 'ipam.ipRanges[0].exclude[0]', 7], ['entry', 'ipam.ipRanges[2].range', 7]]);
  assert.match(errors[1].message, /^ipam\.ipRanges\[2\]\.range: /);
  assert.deepEqual(normalize(engine, '{').errors.map((e) => [e.field, e.code]), [['', 6]]);
  assert.equal(configErrorOf(new Error('not a component error')), null);
});

test('warnings are the engine\'s: overlapping ranges; a gateway inside its network is excluded, not warned about', () => {
  const config = configOf({ ipRanges: [{ range: '192.0.2.0/24', gateway: '192.0.2.3' }, { range: '192.0.2.128/25', gateway: '192.0.2.129', exclude: ['192.0.2.129/32'] }] });
  const warnings = configWarnings(engine, config);
  assert.deepEqual(warnings.map((w) => w.kind), ['overlap']);
  assert.match(warnings[0].text, /^Ranges 1 \(192\.0\.2\.0\/24\) and 2 \(192\.0\.2\.128\/25\) overlap \(192\.0\.2\.129 – 192\.0\.2\.254\)\. With enable_overlapping_ranges \(on\)/);
  assert.deepEqual(configWarnings(engine, configOf({ range: '192.0.2.0/24', range_start: '192.0.2.10', gateway: '192.0.2.1' })), []);
});

test('a simulation starts from the engine\'s preview; failing pods get nothing', () => {
  const sim = new Simulation(engine, configOf({ ipRanges: [{ range: '2001:db8::/64' }, { range: '192.0.2.0/30' }] }), 3);
  assert.deepEqual(addresses(sim), [['2001:db8::1/64', '192.0.2.1/30'], ['2001:db8::2/64', '192.0.2.2/30'], [null, null]]);
  assert.deepEqual(sim.pods.map(Simulation.served), [true, true, false]);
  assert.match(sim.pods[2].cells[1].exhausted, /^Could not allocate IP in range: ip: 192\.0\.2\.1/);
  assert.match(sim.pods[2].cells[0].rejected, /^not allocated/);
  const use = usage(sim);
  assert.deepEqual(use.map((u) => [u.used, u.usable]), [[2n, 2n ** 64n - 2n], [2n, 2n]]);
  assert.deepEqual(use.map((u) => u.firstExhausted?.pod ?? null), [null, 3]);
});

test('churn: holes refill lowest-first; a full range fails the whole ADD', () => {
  const sim = new Simulation(engine, configOf({ range: '192.0.2.0/29' }), 4);
  const { deleted, missing, added } = sim.churn(parsePodList('2, 3, 9'), 4);
  assert.deepEqual([deleted, missing], [[2, 3], [9]]);
  assert.deepEqual(added.map((p) => p.cells[0].address ?? p.cells[0].failed), ['192.0.2.2/29', '192.0.2.3/29', '192.0.2.5/29', '192.0.2.6/29']);
  const next = sim.churn([], 1).added[0];
  assert.match(next.cells[0].failed, /^Could not allocate IP in range/);
  assert.equal(usage(sim)[0].used, 6n);
});

test('churn: with overlapping ranges on, an address one pool holds is skipped in the other', () => {
  const ranges = [{ range: '192.0.2.0/28' }, { range: '192.0.2.0/24' }];
  const churned = (on) => {
    const sim = new Simulation(engine, configOf({ enable_overlapping_ranges: on, ipRanges: ranges }), 1);
    sim.churn([], 1);
    return addresses(sim);
  };
  assert.deepEqual(churned(true), [['192.0.2.1/28', '192.0.2.2/24'], ['192.0.2.3/28', '192.0.2.4/24']]);
  // Off: the pools do not see each other (the plugin without reservations does the
  // same): pod 2 gets the addresses pod 1 holds in the other pool.
  assert.deepEqual(churned(false), [['192.0.2.1/28', '192.0.2.2/24'], ['192.0.2.2/28', '192.0.2.1/24']]);
});

test('usage counts the pool: one network listed twice fills twice as fast', () => {
  const sim = new Simulation(engine, configOf({ ipRanges: [{ range: '192.0.2.0/29' }, { range: '192.0.2.0/29' }] }), 2);
  assert.deepEqual(addresses(sim), [['192.0.2.1/29', '192.0.2.2/29'], ['192.0.2.3/29', '192.0.2.4/29']]);
  assert.deepEqual(usage(sim).map((u) => u.used), [4n, 4n]);
});

test('first_available: each pod gets one address, from the first range with room', () => {
  const sim = new Simulation(engine, configOf({ ipRangesAllocation: 'first_available', ipRanges: [{ range: '192.0.2.0/30' }, { range: '198.51.100.0/30' }] }), 3);
  assert.deepEqual(addresses(sim), [['192.0.2.1/30', null], ['192.0.2.2/30', null], [null, '198.51.100.1/30']]);
  assert.deepEqual(sim.pods.map(Simulation.served), [true, true, true]);
  // Churn plans each new pod like the plugin's ADD: the freed address first, then the next range.
  const { added } = sim.churn(parsePodList('1'), 2);
  assert.deepEqual(added.map((p) => p.cells.map((c) => c.address ?? null)), [['192.0.2.1/30', null], [null, '198.51.100.2/30']]);
  assert.deepEqual(usage(sim).map((u) => u.used), [2n, 2n]);
});

test('pod lists: numbers and ranges, clear errors', () => {
  assert.deepEqual(parsePodList(' 1, 3-5 9'), [1, 3, 4, 5, 9]);
  assert.deepEqual(parsePodList(''), []);
  assert.throws(() => parsePodList('x'), /"x" is not a pod number/);
  assert.throws(() => parsePodList('5-3'), /runs backwards/);
  assert.throws(() => parsePodList('1-20', 10), /too many pods/);
});

test('offsets split and join at 2^64', () => {
  const v = (1n << 80n) + 5n;
  assert.deepEqual(toOffset(v), { high: 1n << 16n, low: 5n });
  assert.equal(offsetKey(toOffset(v)), v);
});
