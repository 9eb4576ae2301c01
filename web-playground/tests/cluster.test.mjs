// A pasted cluster's state (lib/cluster.js) under Node, on the transpiled
// engine: YAML or JSON in, the engine's pools out, and the simulation
// starting from them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { dump } from 'js-yaml';
import { engine } from '../engine/engine.js';
import { normalize, Simulation, usage } from '../lib/model.js';
import { objectsJson, readCluster, ownerOf, ClusterError } from '../lib/cluster.js';

const config = normalize(engine, JSON.stringify({ cniVersion: '1.0.0', name: 'blue', ipam: { type: 'whereabouts', range: '192.0.2.0/28', network_name: 'blue' } })).config;

const dumpOf = (allocations, more = []) => ({
  apiVersion: 'v1', kind: 'List', items: [
    { apiVersion: 'whereabouts.cni.cncf.io/v1alpha1', kind: 'IPPool', metadata: { name: 'blue-192.0.2.0-28', namespace: 'kube-system', creationTimestamp: '2026-01-01T00:00:00Z' },
      spec: { range: '192.0.2.0/28', allocations } },
    ...more,
  ],
});

test('YAML and JSON give the same objects; several documents become one List; blank is no cluster', () => {
  const objects = dumpOf({ 1: { id: '1234e5', podref: 'ns/a', ifname: 'net1' } });
  const yaml = dump(objects);
  assert.deepEqual(JSON.parse(objectsJson(yaml)), JSON.parse(objectsJson(JSON.stringify(objects))));
  // A container ID that looks like a number stays text when kubectl quotes it.
  assert.equal(JSON.parse(objectsJson(yaml)).items[0].spec.allocations['1'].id, '1234e5');
  const two = objectsJson('kind: IPPool\nmetadata: {name: a}\n---\nkind: IPAMClaim\nmetadata: {name: b}\n');
  assert.deepEqual(JSON.parse(two).items.map((o) => o.kind), ['IPPool', 'IPAMClaim']);
  assert.equal(objectsJson('  \n'), null);
  assert.throws(() => objectsJson('items: [\n  - a\n b: :'), (e) => e instanceof ClusterError && e.line > 0);
});

test('the simulation starts from the cluster\'s pools: its entries, a claim\'s entry and another reservation are taken', () => {
  const objects = dumpOf(
    { 1: { id: 'c1', podref: 'ns/a', ifname: 'net1' }, 2: { id: 'c2', podref: 'ns/virt-launcher-vm', ifname: 'net1', ipamclaimref: 'ns/vm.blue' } },
    [{ apiVersion: 'whereabouts.cni.cncf.io/v1alpha1', kind: 'OverlappingRangeIPReservation', metadata: { name: 'blue-192.0.2.3' }, spec: { podref: 'ns/racer', ifname: 'net1' } }],
  );
  const cluster = readCluster(engine, config, dump(objects));
  assert.deepEqual(cluster.entries.map((e) => [e.ip, ownerOf(e.allocation.claim).text]), [['192.0.2.1', 'pod'], ['192.0.2.2', 'held by IPAMClaim ns/vm.blue']]);
  assert.deepEqual(cluster.reserved.map((r) => r.ip), ['192.0.2.3']);
  const sim = new Simulation(engine, config, 2, cluster);
  assert.deepEqual(sim.pods.map((p) => p.cells[0].address), ['192.0.2.4/28', '192.0.2.5/28']);
  assert.equal(usage(sim)[0].used, 4n, 'the cluster\'s two entries and the two pods');
  // Churn plans against the cluster's pools too.
  sim.churn([1], 1);
  assert.equal(sim.pods.at(-1).cells[0].address, '192.0.2.4/28');
  assert.equal(readCluster(engine, config, ''), null);
});

test('a dump the engine cannot read is an error naming the object', () => {
  const bad = readCluster(engine, config, JSON.stringify(dumpOf(['not', 'a', 'map'])));
  assert.equal(bad.error.field, 'objects.items[0].spec.allocations');
  assert.match(bad.error.message, /IPPool blue-192\.0\.2\.0-28: spec\.allocations is not an object/);
  assert.equal(readCluster(engine, config, '[1, 2]').error.code, 6);
  assert.equal(readCluster(engine, config, 'a: [').error.source, 'cluster');
});
