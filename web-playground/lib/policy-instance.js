// One policy component, as jco transpiled it (`--instantiation async`: an ES
// module exporting `instantiate` plus its core modules), compiled once and
// instantiated afresh for every call: the WIT says a policy keeps nothing
// between calls, and an instance that trapped is never entered again.
// Runs in the policy worker (and in the Node tests); never on the page's thread.

import { capMemory, mibToPages } from './wasm-limits.js';
import { checkSettings, checkRanges, checkPick, failure } from './policy-answers.js';

const MIB = 2 ** 20;

/** Imports an ES module from its text (a data: URL works in workers and in Node). */
async function importText(js) {
  const bytes = new TextEncoder().encode(js);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return import(`data:text/javascript;base64,${btoa(bin)}`);
}

/**
 * Compiles a transpiled policy: `js` the module's text, `cores` {file name:
 * bytes} of its core modules, `memoryMib` the config's `memory_mib` (every
 * defined memory is capped to it). Throws with a message on anything that is
 * not a policy-extension component as transpiled.
 */
export async function compilePolicy({ js, cores, memoryMib }) {
  const bindings = await importText(js);
  if (typeof bindings.instantiate !== 'function') throw new Error('the transpiled module has no `instantiate` (transpile with --instantiation async)');
  const modules = new Map();
  for (const [name, bytes] of Object.entries(cores)) {
    modules.set(name, await WebAssembly.compile(capMemory(new Uint8Array(bytes), mibToPages(memoryMib))));
  }
  return { bindings, modules, memoryMib };
}

function policyExport(root) {
  const p = root.policy ?? root['thereabouts:ipam/policy@0.1.0'] ?? Object.entries(root).find(([k]) => k.startsWith('thereabouts:ipam/policy@'))?.[1];
  if (!p || typeof p.pickAddress !== 'function') throw new Error('the component does not export thereabouts:ipam/policy');
  return p;
}

/** jco throws a ComponentError carrying the `err` of a `result` export. */
const isResultErr = (e) => e && typeof e === 'object' && 'payload' in e && e.constructor?.name === 'ComponentError';

/**
 * Calls `hook` on a fresh instance. Returns the checked answer, {ok} or {fail: text}
 * in the plugin's words (a trap, the memory limit, the stack, a bad answer).
 */
export async function callPolicy(compiled, hook, args) {
  const memories = [];
  // Every core instance's exported memories, to tell a failed memory.grow from another trap.
  const instantiateCore = async (module, imports) => {
    const instance = await WebAssembly.instantiate(module, imports);
    for (const v of Object.values(instance.exports)) if (v instanceof WebAssembly.Memory) memories.push(v);
    return instance;
  };
  let policy;
  try {
    const root = await compiled.bindings.instantiate((name) => {
      const m = compiled.modules.get(name);
      if (!m) throw new Error(`no core module ${name}`);
      return m;
    }, {}, instantiateCore);
    policy = policyExport(root);
  } catch (e) {
    return { fail: `could not be instantiated: ${e && e.message ? e.message : e}` };
  }
  const run = (fn) => {
    try {
      return { ok: fn() };
    } catch (e) {
      if (isResultErr(e)) return { err: e.payload };
      return { thrown: e };
    }
  };
  let answer;
  if (hook === 'validate-settings') answer = run(() => policy.validateSettings(args[0]));
  else if (hook === 'select-ranges') answer = run(() => policy.selectRanges(args[0]));
  else if (hook === 'pick-address') answer = run(() => policy.pickAddress(args[0], args[1], args[2]));
  else return { fail: `unknown hook ${hook}` };
  if (answer.thrown) return { fail: classify(answer.thrown, memories, compiled.memoryMib) };
  if (hook === 'validate-settings') return checkSettings(answer);
  if (hook === 'select-ranges') return checkRanges(answer, args[1]);
  return checkPick(answer.ok);
}

/**
 * What a thrown error means. A trap with a memory within 2 MiB of its limit is
 * taken for a failed grow (a Rust policy aborts when its allocator gets no
 * memory; the largest chunk the hostile fixture asks for is 1 MiB).
 */
function classify(e, memories, memoryMib) {
  if (e instanceof RangeError && /call stack/i.test(e.message)) return failure.stack();
  if (e instanceof WebAssembly.RuntimeError) {
    if (memories.some((m) => m.buffer.byteLength + 2 * MIB > memoryMib * MIB)) return failure.memory(memoryMib);
    return failure.trap(e.message);
  }
  return failure.trap(`${e && e.name ? e.name + ': ' : ''}${e && e.message ? e.message : e}`);
}
