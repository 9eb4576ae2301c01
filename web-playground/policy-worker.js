// The policy worker: every policy call runs here, never on the page's thread,
// so that a policy that loops can be stopped by terminating this worker
// (lib/policy-runner.js does, at the deadline). Messages:
//   {id, type: 'load', key, js, cores, memoryMib}  -> {id, ok: true} | {id, fail}
//   {id, type: 'call', key, hook, args}            -> {id, ok: answer} | {id, fail}
import { compilePolicy, callPolicy } from './lib/policy-instance.js';

const compiled = new Map();

self.onmessage = async ({ data }) => {
  const { id } = data;
  try {
    if (data.type === 'load') {
      compiled.set(data.key, await compilePolicy(data));
      self.postMessage({ id, ok: true });
    } else if (data.type === 'call') {
      const policy = compiled.get(data.key);
      if (!policy) { self.postMessage({ id, fail: 'not loaded in the worker' }); return; }
      self.postMessage({ id, ...(await callPolicy(policy, data.hook, data.args)) });
    }
  } catch (e) {
    // postMessage can fail too (an answer that cannot be cloned): still an answer.
    self.postMessage({ id, fail: String(e && e.message ? e.message : e) });
  }
};
