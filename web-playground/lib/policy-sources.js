// Where the page finds the component a config's policy `path` names: by the
// path's file name, first among the .wasm files the user picked (transpiled in
// the browser), then among the example policies build.sh transpiled
// (policies/manifest.json). The plugin reads `path` from disk; a page cannot,
// so the file name is the link between the config and what was loaded.

import { fileNameOf as basename } from './config-policies.js';

const TRANSPILE_TIMEOUT_MS = 60000;

export class PolicySources {
  constructor(runner) {
    this.runner = runner;
    this.examples = new Map();   // file name -> {name, dir, js, cores: [file]}
    this.picked = new Map();     // file name -> {js, cores, version}
    this.fetched = new Map();    // example file name -> Promise<{js, cores}>
    this.transpiler = null;
    this.nextId = 1;
    this.version = 0;
  }

  /** Reads the examples' manifest; the page works without it (no policies built). */
  async init() {
    try {
      const manifest = await (await fetch('policies/manifest.json')).json();
      for (const p of manifest.policies) this.examples.set(p.file, p);
    } catch {
      // build.sh did not transpile examples: only picked files can run.
    }
  }

  exampleNames() {
    return [...this.examples.values()].map((p) => p.name);
  }

  /** What a policy path resolves to, for showing: 'picked', 'example' or null. */
  kindOf(path) {
    const file = basename(path);
    return this.picked.has(file) ? 'picked' : this.examples.has(file) ? 'example' : null;
  }

  /** Transpiles a picked file in the transpile worker; {ok: file name} or {fail}. */
  async addFile(name, bytes) {
    if (!this.transpiler) this.transpiler = new Worker(new URL('../transpile-worker.js', import.meta.url), { type: 'module' });
    const id = this.nextId++;
    const worker = this.transpiler;
    const answer = await new Promise((resolve) => {
      // jco runs none of the policy's code, but a huge or crafted file may keep it busy.
      const timer = setTimeout(() => {
        worker.terminate();
        if (this.transpiler === worker) this.transpiler = null;
        resolve({ fail: `took more than ${TRANSPILE_TIMEOUT_MS / 1000} s to transpile` });
      }, TRANSPILE_TIMEOUT_MS);
      const onMessage = ({ data }) => {
        if (data.id !== id) return;
        clearTimeout(timer);
        worker.removeEventListener('message', onMessage);
        resolve(data);
      };
      worker.addEventListener('message', onMessage);
      worker.postMessage({ id, bytes });
    });
    if (answer.fail) return { fail: `${name} ${answer.fail}` };
    this.picked.set(name, { js: answer.js, cores: answer.cores, version: ++this.version });
    return { ok: name };
  }

  async example(file) {
    if (!this.fetched.has(file)) {
      const p = this.examples.get(file);
      this.fetched.set(file, (async () => {
        const at = (f) => `policies/${p.dir}/${f}`;
        const js = await (await fetch(at(p.js))).text();
        const cores = {};
        for (const f of p.cores) cores[f] = new Uint8Array(await (await fetch(at(f))).arrayBuffer());
        return { js, cores };
      })());
    }
    return this.fetched.get(file);
  }

  /** The source of a policy path: {key, source} or {fail}. */
  async resolve(path, memoryMib) {
    const file = basename(path);
    const picked = this.picked.get(file);
    if (picked) return { key: `picked:${file}:${picked.version}:${memoryMib}`, source: { js: picked.js, cores: picked.cores, memoryMib } };
    if (this.examples.has(file)) {
      try {
        return { key: `example:${file}:${memoryMib}`, source: { ...(await this.example(file)), memoryMib } };
      } catch (e) {
        this.fetched.delete(file);
        return { fail: `cannot fetch the example ${file}: ${e.message}` };
      }
    }
    const known = [...this.picked.keys(), ...this.examples.keys()];
    return { fail: `${path}: no ${file} in the playground (load it with “Load a policy .wasm”${known.length ? `, or use one of ${known.join(', ')}` : ''})` };
  }

  /** The `host` lib/policies.js asks, for the config's `policies`. */
  hostFor(policies) {
    const keys = [];
    return {
      load: async (i) => {
        const found = await this.resolve(policies[i].path, policies[i].memoryMib);
        if (found.fail) return found;
        keys[i] = found.key;
        return this.runner.load(found.key, found.source);
      },
      call: (i, hook, args) => this.runner.call(keys[i], hook, args, policies[i].timeoutMs),
    };
  }
}
