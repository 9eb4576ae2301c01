// The policy orchestration (lib/policies.js) and the policy plumbing the worker
// uses (lib/policy-instance.js, policy-answers.js, wasm-limits.js) under Node:
// first against scripted policies and a recording engine (the merge rules of
// host/src/policy/decide.rs), then the example policies build.sh transpiled,
// instantiated in-process on the real engine component.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { planPod, preparePolicies, previewWithPolicies, podsJson, subjectOf, redacted } from '../lib/policies.js';
import { compilePolicy, callPolicy } from '../lib/policy-instance.js';
import { checkPick, checkRanges, checkSettings } from '../lib/policy-answers.js';
import { capMemory, mibToPages } from '../lib/wasm-limits.js';
import { addPolicy, parseLabels, PolicyEditError } from '../lib/config-policies.js';
import { normalize } from '../lib/model.js';

const here = dirname(fileURLToPath(import.meta.url));
const POLICIES = join(here, '../policies');

// ---------------------------------------------------------------- scripted policies, recording engine

const policy = (name, extra = {}) => ({ name, path: `/p/${name}.wasm`, settings: '{}', timeoutMs: 10, memoryMib: 4, onError: 'deny', mode: 'enforce', ...extra });

/** A host whose policies answer from `script[name][hook](args)`; records every call. */
function scripted(policies, script) {
  const calls = [];
  return {
    calls,
    load: async () => ({ ok: true }),
    call: async (i, hook, args) => {
      const name = policies[i].name;
      calls.push({ name, hook, args });
      const answer = script[name]?.[hook];
      if (answer) return answer(...args);
      if (hook === 'validate-settings') return { ok: { labels: false, annotations: false } };
      if (hook === 'select-ranges') return { ok: { ranges: args[0].config.ranges.map((_, r) => r) } };
      return { ok: { choice: { tag: 'built-in' }, refused: [] } };
    },
  };
}

/** An engine that offers three free addresses per range and records the guidance it planned with. */
function recordingEngine(fail = []) {
  const guidance = [];
  return {
    guidance,
    candidates: (config, pools, res, req, ranges) => [...ranges].map((rangeIndex) => ({ rangeIndex, free: ['192.0.2.1', '192.0.2.2', '192.0.2.3'], held: undefined })),
    planAll: (config, pools, res, req) => {
      guidance.push(req.guidance);
      const f = fail.shift();
      if (f) throw Object.assign(new Error('plan failure'), { payload: f });
      return [];
    },
  };
}

const CONFIG = { ranges: [{ cidr: '192.0.2.0/24' }, { cidr: '198.51.100.0/24' }], policies: [], datastore: { kubeconfig: '/secret', etcdPassword: 'pw' } };

async function plan(policies, script, engine = recordingEngine()) {
  // Without a select-ranges of its own, a scripted policy selects every range.
  const host = scripted(policies, script);
  const prepared = await preparePolicies(policies, host);
  const planned = await planPod({ engine, config: CONFIG, pools: [], subject: subjectOf(0, { prefix: 'web-' }), active: prepared.active, host });
  return { planned, host, engine, prepared };
}

const pick = (choice, refused = []) => () => ({ ok: { choice, refused: refused.map(([address, reason]) => ({ address, reason })) } });

test('picks merge: refusals add up, the first preference counts and later ones narrow it, a veto wins', async () => {
  const policies = [policy('a'), policy('b'), policy('c')];
  const { planned, host, engine } = await plan(policies, {
    a: { 'pick-address': pick({ tag: 'prefer', val: ['192.0.2.2', '192.0.2.3', '192.0.2.9'] }, [['192.0.2.1', 'kept']]) },
    b: { 'pick-address': (input, range) => pick(range === 1 ? { tag: 'veto', val: 'not here' } : { tag: 'prefer', val: ['192.0.2.3', '192.0.2.9'] }, [['192.0.2.9', 'no']])() },
  });
  assert.ok(planned.outcomes, planned.failure);
  const [g] = engine.guidance;
  assert.deepEqual([...g.ranges], [0, 1], 'each policy selected every range');
  assert.deepEqual(g.picks.map((p) => [p.rangeIndex, p.prefer, p.refuse, p.veto]), [
    [0, ['192.0.2.3'], ['192.0.2.1', '192.0.2.9'], undefined],
    [1, ['192.0.2.2', '192.0.2.3'], ['192.0.2.1', '192.0.2.9'], 'policy "b": not here'],
  ]);
  // Later policies are offered what earlier ones did not refuse.
  const offered = host.calls.filter((c) => c.hook === 'pick-address' && c.args[1] === 0).map((c) => [c.name, c.args[2]]);
  assert.deepEqual(offered, [['a', ['192.0.2.1', '192.0.2.2', '192.0.2.3']], ['b', ['192.0.2.2', '192.0.2.3']], ['c', ['192.0.2.2', '192.0.2.3']]]);
  assert.deepEqual(planned.refused.filter((r) => r.range === 0), [
    { range: 0, address: '192.0.2.1', policy: 'a', reason: 'kept' },
    { range: 0, address: '192.0.2.9', policy: 'b', reason: 'no' },
  ]);
  // What the policies see: the pod, and the config without credentials or policies.
  const input = host.calls.find((c) => c.hook === 'select-ranges').args[0];
  assert.deepEqual([input.podNamespace, input.podName, input.containerId, input.ifname], ['default', 'web-0', 'preview-0', 'net1']);
  assert.equal(input.config.datastore.kubeconfig, undefined);
  assert.equal(input.config.datastore.etcdPassword, undefined);
  assert.equal(input.pod, undefined, 'no policy declared a need for labels');
});

test('select-ranges: the first list narrowed by later ones; a veto or an empty intersection refuses the pod', async () => {
  const policies = [policy('a'), policy('b')];
  const ranges = (list) => () => ({ ok: { ranges: list } });
  let { engine } = await plan(policies, { a: { 'select-ranges': ranges([1, 0]) }, b: { 'select-ranges': ranges([0]) } });
  assert.deepEqual([...engine.guidance[0].ranges], [0]);
  let { planned } = await plan(policies, { a: { 'select-ranges': ranges([1]) }, b: { 'select-ranges': ranges([0]) } });
  assert.equal(planned.failure, 'policy "b" refused the attachment: no range is left that every policy selected');
  ({ planned } = await plan(policies, { b: { 'select-ranges': () => ({ ok: { veto: 'not this team' } }) } }));
  assert.equal(planned.failure, 'policy "b" refused the attachment: not this team');
});

test('on_error: deny fails the pod naming policy and hook; ignore logs and the built-in choice stands', async () => {
  const timeout = () => ({ fail: 'timed out after 10 ms' });
  let { planned } = await plan([policy('slow')], { slow: { 'pick-address': timeout } });
  assert.equal(planned.failure, 'policy "slow", pick-address: timed out after 10 ms');
  let engine;
  ({ planned, engine } = await plan([policy('slow', { onError: 'ignore' })], { slow: { 'pick-address': timeout } }));
  assert.ok(planned.outcomes);
  assert.deepEqual(engine.guidance[0].picks.map((p) => p.prefer), [[], []]);
  assert.match(planned.log[0], /^policy "slow", pick-address: timed out after 10 ms; ignored \(on_error: ignore\)/);
});

test('monitor: every failure is logged and the built-in choice stands, whatever on_error says', async () => {
  const failures = { fail: 'trapped: unreachable' };
  for (const hook of ['validate-settings', 'select-ranges', 'pick-address']) {
    const { planned, prepared } = await plan([policy('trial', { mode: 'monitor' })], { trial: { [hook]: () => failures } });
    assert.ok(planned.outcomes, `${hook}: ${planned.failure}`);
    const log = [...prepared.log, ...planned.log];
    assert.ok(log.includes(`policy "trial", ${hook}: trapped: unreachable; ignored (mode: monitor), the built-in choice stands`), log.join('\n'));
  }
});

test('monitor: the policy runs, its verdict is logged, the built-in choice decides', async () => {
  const { planned, engine } = await plan([policy('watch', { mode: 'monitor' })], {
    watch: { 'select-ranges': () => ({ ok: { veto: 'would refuse' } }), 'pick-address': pick({ tag: 'veto', val: 'no' }, [['192.0.2.1', 'r']]) },
  });
  assert.ok(planned.outcomes);
  assert.deepEqual(planned.refused, []);
  assert.equal(engine.guidance[0].picks.every((p) => p.veto === undefined && p.refuse.length === 0), true);
  assert.deepEqual(planned.log.slice(0, 2), ['policy "watch" (monitor) select-ranges: refused: would refuse', 'policy "watch" (monitor) pick-address in range 1: veto: no; refused 192.0.2.1']);
});

test('a bad pick: from a deny policy the pod fails, from an ignore one it is planned again without that pick', async () => {
  const badPick = { tag: 'bad-pick', val: { rangeIndex: 0, message: '192.0.2.70 is excluded in 192.0.2.0/24' } };
  const prefers = { p: { 'pick-address': pick({ tag: 'prefer', val: ['192.0.2.70'] }) } };
  let { planned } = await plan([policy('p')], prefers, recordingEngine([badPick]));
  assert.equal(planned.failure, 'policy "p", pick-address: gave a bad answer: 192.0.2.70 is excluded in 192.0.2.0/24');
  const engine = recordingEngine([badPick]);
  ({ planned } = await plan([policy('p', { onError: 'ignore' })], prefers, engine));
  assert.ok(planned.outcomes);
  // Planned again with range 0 left to the built-in choice.
  assert.deepEqual(engine.guidance.map((g) => g.picks.map((p) => p.prefer)), [[['192.0.2.70'], ['192.0.2.70']], [[], ['192.0.2.70']]]);
  // An engine failure that is nobody's pick is the pod's failure as the engine words it.
  ({ planned } = await plan([policy('p')], {}, recordingEngine([{ tag: 'exhausted', val: 'Could not allocate IP in range: …' }])));
  assert.equal(planned.failure, 'Could not allocate IP in range: …');
});

test('settings: a deny policy that rejects them fails every pod; an ignore one is left out', async () => {
  const rejects = { v: { 'validate-settings': () => ({ fail: 'rejected its settings: bad' }) } };
  let prepared = await preparePolicies([policy('v')], scripted([policy('v')], rejects));
  assert.equal(prepared.stop, 'policy "v", validate-settings: rejected its settings: bad');
  prepared = await preparePolicies([policy('v', { onError: 'ignore' }), policy('w')], scripted([policy('v'), policy('w')], rejects));
  assert.deepEqual([prepared.stop, prepared.active.map((p) => p.config.name)], [null, ['w']]);
  const notFound = { load: async () => ({ fail: 'no v.wasm in the playground' }), call: async () => assert.fail('not loaded') };
  prepared = await preparePolicies([policy('v')], notFound);
  assert.equal(prepared.stop, 'policy "v": no v.wasm in the playground');
});

test('answers are bounded like the plugin bounds them', () => {
  assert.deepEqual(checkRanges({ ok: Uint32Array.of(1, 0) }, 2), { ok: { ranges: [1, 0] } });
  assert.deepEqual(checkRanges({ ok: [2] }, 2), { fail: 'gave a bad answer: range index 2 is out of bounds (the config has 2)' });
  assert.deepEqual(checkRanges({ ok: [0, 0] }, 2), { fail: 'gave a bad answer: range index 0 is listed twice' });
  assert.deepEqual(checkRanges({ ok: [] }, 2), { fail: 'gave a bad answer: no range selected (answer an error to refuse the attachment)' });
  assert.deepEqual(checkRanges({ err: 'no' }, 2), { ok: { veto: 'no' } });
  assert.deepEqual(checkSettings({ err: 'x'.repeat(2000) }), { fail: 'gave a bad answer: a text of 2000 bytes, more than 1024' });
  assert.deepEqual(checkSettings({ ok: { podLabels: true } }), { ok: { labels: true, annotations: false } });
  assert.deepEqual(checkPick({ choice: { tag: 'prefer', val: new Array(257).fill('192.0.2.1') }, refused: [] }), { fail: 'gave a bad answer: 257 preferred addresses, more than 256' });
  assert.deepEqual(checkPick({ choice: { tag: 'prefer', val: [] }, refused: [] }), { fail: 'gave a bad answer: an empty preference (answer built-in instead)' });
  assert.deepEqual(checkPick({ choice: { tag: 'built-in' }, refused: new Array(1025).fill({ address: 'a', reason: 'r' }) }), { fail: 'gave a bad answer: 1025 refusals, more than 1024' });
});

// ---------------------------------------------------------------- memory limit

/** A module with one memory of `min` pages (and `max`, if given). */
const moduleWithMemory = (min, max) => Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 5, max === undefined ? 3 : 4, 1, max === undefined ? 0 : 1, min, ...(max === undefined ? [] : [max])]);

test('capMemory bounds every defined memory by memory_mib; memory.grow past it fails', async () => {
  assert.equal(mibToPages(4), 64);
  const capped = capMemory(moduleWithMemory(2), 64);
  assert.deepEqual([...capped.slice(8)], [5, 4, 1, 1, 2, 64]);
  // An exported memory shows the limit at work.
  const exported = Uint8Array.from([...capMemory(moduleWithMemory(2), 3), 7, 7, 1, 3, 0x6d, 0x65, 0x6d, 2, 0]);
  const { instance } = await WebAssembly.instantiate(exported);
  assert.equal(instance.exports.mem.grow(1), 2);
  assert.throws(() => instance.exports.mem.grow(1), RangeError);
  assert.deepEqual([...capMemory(moduleWithMemory(2, 10), 64).slice(8)], [5, 4, 1, 1, 2, 10], 'a lower maximum stays');
  assert.throws(() => capMemory(moduleWithMemory(100), 64), /starts at 6\.25 MiB, more than its memory limit of 4 MiB/);
  assert.throws(() => capMemory(Uint8Array.of(1, 2, 3, 4), 64), /not a core WebAssembly module/);
});

// ---------------------------------------------------------------- config edits

test('adding a policy entry to the config: unique names, JSON only; labels', () => {
  const text = JSON.stringify({ cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'macvlan', ipam: { type: 'whereabouts', range: '192.0.2.0/24' } }] });
  const once = addPolicy(text, { name: 'keep', path: '/p/keep.wasm' });
  const twice = JSON.parse(addPolicy(once, { name: 'keep', path: '/p/keep.wasm' }));
  assert.deepEqual(twice.plugins[0].ipam.policies.map((p) => p.name), ['keep', 'keep-2']);
  assert.throws(() => addPolicy('apiVersion: v1\n', { name: 'x' }), PolicyEditError);
  assert.throws(() => addPolicy('{"cniVersion": "1.0.0"}', { name: 'x' }), /no ipam section/);
  assert.deepEqual(parseLabels(' tier=db,app=web  a= '), [['tier', 'db'], ['app', 'web'], ['a', '']]);
  assert.throws(() => parseLabels('tier'), /not key=value/);
});

// ---------------------------------------------------------------- the example policies, on the engine

/** These tests need build.sh's outputs: missing, they fail (a skip would pass). */
function assertBuilt() {
  const built = existsSync(join(POLICIES, 'manifest.json')) && existsSync(join(here, '../engine/engine.js'));
  assert.ok(built, 'web-playground/policies/ or engine/ not built: run bash web-playground/build.sh first');
}

function exampleSource(name) {
  assertBuilt();
  const manifest = JSON.parse(readFileSync(join(POLICIES, 'manifest.json'), 'utf8'));
  const p = manifest.policies.find((x) => x.name === name);
  const dir = join(POLICIES, p.dir);
  return { js: readFileSync(join(dir, p.js), 'utf8'), cores: Object.fromEntries(p.cores.map((f) => [f, readFileSync(join(dir, f))])) };
}

/** The worker's job, in-process: fine for everything but a policy that never returns. */
function inProcessHost(policies) {
  const compiled = [];
  return {
    load: async (i) => {
      try {
        const name = policies[i].path.slice(policies[i].path.lastIndexOf('/') + 1, -'.wasm'.length);
        compiled[i] = await compilePolicy({ ...exampleSource(name), memoryMib: policies[i].memoryMib });
        return { ok: true };
      } catch (e) {
        return { fail: e.message };
      }
    },
    call: (i, hook, args) => callPolicy(compiled[i], hook, args),
  };
}

async function previewOf(ipam, count, identity = {}) {
  assertBuilt();
  const { engine } = await import('../engine/engine.js');
  const { config, errors } = normalize(engine, JSON.stringify({ cniVersion: '1.0.0', name: 'p', ipam: { type: 'whereabouts', ...ipam } }));
  assert.equal(errors, undefined, JSON.stringify(errors));
  const sim = await previewWithPolicies({ engine, config, count, identity, host: inProcessHost(config.policies) });
  return podsJson(sim);
}

const examplePolicy = (name, settings, extra = {}) => ({ name, path: `/etc/cni/net.d/thereabouts.d/policies/${name}.wasm`, settings, ...extra });

test('keep-addresses: deny-listed addresses are refused, with the reason, and skipped', async () => {
  const pods = await previewOf({ range: '192.0.2.0/24', policies: [examplePolicy('keep-addresses', { deny: ['192.0.2.2', '192.0.2.4/31'] })] }, 4);
  assert.deepEqual(pods.map((p) => p.addresses[0]), ['192.0.2.1/24', '192.0.2.3/24', '192.0.2.6/24', '192.0.2.7/24']);
  assert.deepEqual(pods[1].refused, [
    { range: 0, address: '192.0.2.2', policy: 'keep-addresses', reason: 'deny-listed by settings' },
    { range: 0, address: '192.0.2.4', policy: 'keep-addresses', reason: 'deny-listed by settings' },
    { range: 0, address: '192.0.2.5', policy: 'keep-addresses', reason: 'deny-listed by settings' },
  ]);
  assert.deepEqual(pods.map((p) => p.failure), [null, null, null, null]);
});

test('sticky-ordinal: web-N gets first + base + N in every range; namespace-ranges by namespace and label', async () => {
  const sticky = await previewOf({ ipRanges: [{ range: '192.0.2.0/24' }, { range: '2001:db8::/64' }], policies: [examplePolicy('sticky-ordinal', { base: 10 })] }, 3, { prefix: 'web-' });
  assert.deepEqual(sticky.map((p) => [p.name, ...p.addresses]), [
    ['default/web-0', '192.0.2.11/24', '2001:db8::b/64'],
    ['default/web-1', '192.0.2.12/24', '2001:db8::c/64'],
    ['default/web-2', '192.0.2.13/24', '2001:db8::d/64'],
  ]);
  const settings = { namespaces: { 'team-a': [1] }, labels: [{ key: 'tier', value: 'db', ranges: [0] }], default: [] };
  const ipam = { ipRanges: [{ range: '192.0.2.0/24' }, { range: '198.51.100.0/24' }], policies: [examplePolicy('namespace-ranges', settings)] };
  assert.deepEqual((await previewOf(ipam, 1, { namespace: 'team-a' }))[0].addresses, [null, '198.51.100.1/24']);
  assert.deepEqual((await previewOf(ipam, 1, { namespace: 'team-a', labels: [['tier', 'db']] }))[0].addresses, ['192.0.2.1/24', null]);
  assert.equal((await previewOf(ipam, 1, { namespace: 'other' }))[0].failure, 'policy "namespace-ranges" refused the attachment: namespace-ranges: default gives this pod no range');
});

test('hostile policies in-process: a trap, the memory limit, the stack and a huge answer are policy errors', async () => {
  const hostile = (hook, action, extra) => examplePolicy('hostile-fixtures', { hook, do: action }, extra);
  const failureOf = async (p) => (await previewOf({ range: '192.0.2.0/24', policies: [p] }, 1))[0].failure;
  assert.match(await failureOf(hostile('pick-address', 'trap')), /^policy "hostile-fixtures", pick-address: trapped: .*unreachable/);
  assert.equal(await failureOf(hostile('pick-address', 'memory-bomb')), 'policy "hostile-fixtures", pick-address: went over its memory limit of 4 MiB');
  assert.equal(await failureOf(hostile('select-ranges', 'recursion')), 'policy "hostile-fixtures", select-ranges: overflowed its stack');
  assert.equal(await failureOf(hostile('validate-settings', 'huge-output', { memory_mib: 64 })), 'policy "hostile-fixtures", validate-settings: gave a bad answer: a text of 16777216 bytes, more than 1024');
  // One allocation far over the limit fails without filling the memory: the page
  // cannot tell it from another trap (the plugin's limiter can).
  assert.match(await failureOf(hostile('pick-address', 'huge-output')), /^policy "hostile-fixtures", pick-address: trapped: /);
  assert.match(await failureOf(hostile('pick-address', 'excluded', { settings: { hook: 'pick-address', do: 'excluded', address: '192.0.2.255' } })), /^policy "hostile-fixtures", pick-address: gave a bad answer: /);
  // With on_error ignore, the same trap leaves the built-in choice.
  const ignored = await previewOf({ range: '192.0.2.0/24', policies: [hostile('pick-address', 'trap', { on_error: 'ignore' })] }, 1);
  assert.deepEqual([ignored[0].addresses, ignored[0].failure], [['192.0.2.1/24'], null]);
  // In monitor mode too, with on_error left at its default (deny): a policy on trial never stops a pod.
  const monitored = await previewOf({ range: '192.0.2.0/24', policies: [hostile('pick-address', 'trap', { mode: 'monitor' })] }, 1);
  assert.deepEqual([monitored[0].addresses, monitored[0].failure], [['192.0.2.1/24'], null]);
});

test('pod identity matches `thereabouts preview --pod-prefix`', () => {
  assert.deepEqual(subjectOf(3, { namespace: 'ns', prefix: 'web-' }).podName, 'web-3');
  assert.deepEqual(subjectOf(0, {}).containerId, 'preview-0');
  assert.equal(redacted({ datastore: { etcdKeyFile: 'k', kind: 'file' }, policies: [1] }).datastore.kind, 'file');
});
