// The page's side of the policy worker: sends loads and calls, one at a time,
// and enforces each call's deadline by terminating the worker, which is the
// only way to stop a policy that loops (a worker cannot be interrupted from
// inside). The next call starts a new worker and loads its policy again.
//
// Deadline: max(timeout_ms, TIMEOUT_FLOOR_MS), measured on the page from
// sending the call to its answer (so it includes the message round trip and
// instantiation). The floor keeps a busy 2-core machine from failing policies
// that the plugin, with its 1 ms watchdog, would let through.

export const TIMEOUT_FLOOR_MS = 500;
/** Compiling a policy's core modules (once per worker) is not the policy's time. */
const LOAD_TIMEOUT_MS = 30000;

export const deadlineOf = (timeoutMs) => Math.max(timeoutMs, TIMEOUT_FLOOR_MS);

export class PolicyRunner {
  constructor(workerUrl) {
    this.workerUrl = workerUrl;
    this.worker = null;
    this.loaded = new Set();   // keys loaded in the current worker
    this.sources = new Map();  // key -> {js, cores, memoryMib}, to load again after a restart
    this.pending = null;       // {id, resolve, timer}
    this.nextId = 1;
    this.queue = Promise.resolve();
    this.restarts = 0;
    this.generation = 0;       // bumped by reset(): queued jobs of an older one do not run
  }

  /** Remembers a policy's transpiled source under `key` and loads it. */
  load(key, source) {
    this.sources.set(key, source);
    return this.enqueue(() => this.ensureLoaded(key));
  }

  /** One call on a fresh instance; resolves {ok} or {fail: text}, never rejects. */
  call(key, hook, args, timeoutMs) {
    return this.enqueue(async () => {
      const loaded = await this.ensureLoaded(key);
      if (loaded.fail) return loaded;
      const deadline = deadlineOf(timeoutMs);
      const why = deadline > timeoutMs
        ? `timed out after ${deadline} ms (the playground's floor; timeout_ms is ${timeoutMs})`
        : `timed out after ${timeoutMs} ms`;
      return this.send({ type: 'call', key, hook, args }, deadline, why);
    });
  }

  /**
   * Cancels what was asked so far (a superseded preview): queued calls answer
   * `cancelled`, and a call in flight is stopped with its worker.
   */
  reset() {
    this.generation++;
    if (this.pending) this.kill({ fail: 'cancelled' });
  }

  enqueue(job) {
    const generation = this.generation;
    const run = this.queue.then(() => (generation === this.generation ? job() : { fail: 'cancelled' }));
    this.queue = run.catch(() => {});
    return run;
  }

  async ensureLoaded(key) {
    if (this.worker && this.loaded.has(key)) return { ok: true };
    const source = this.sources.get(key);
    if (!source) return { fail: 'not loaded' };
    const answer = await this.send({ type: 'load', key, ...source }, LOAD_TIMEOUT_MS, `took more than ${LOAD_TIMEOUT_MS} ms to compile`);
    if (answer.ok) this.loaded.add(key);
    return answer;
  }

  spawn() {
    const worker = new Worker(this.workerUrl, { type: 'module' });
    worker.onmessage = ({ data }) => {
      if (!this.pending || data.id !== this.pending.id) return;
      this.settle(data.fail !== undefined ? { fail: data.fail } : { ok: data.ok });
    };
    // An uncaught error or a worker the browser killed (out of memory): the call failed.
    worker.onerror = (ev) => {
      ev.preventDefault();
      this.kill({ fail: `crashed the policy worker: ${ev.message || 'no message'}` });
    };
    worker.onmessageerror = () => this.kill({ fail: 'gave an answer that cannot be passed to the page' });
    this.worker = worker;
    this.loaded = new Set();
  }

  send(message, ms, timeoutText) {
    if (!this.worker) this.spawn();
    const id = this.nextId++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => this.kill({ fail: timeoutText }), ms);
      this.pending = { id, resolve, timer };
      this.worker.postMessage({ id, ...message });
    });
  }

  settle(answer) {
    const p = this.pending;
    if (!p) return;
    this.pending = null;
    clearTimeout(p.timer);
    p.resolve(answer);
  }

  /** Terminates the worker (stopping a looping policy) and answers the call in flight. */
  kill(answer) {
    if (this.worker) {
      this.worker.terminate();
      this.worker = null;
      this.restarts++;
    }
    this.loaded = new Set();
    this.settle(answer);
  }
}
