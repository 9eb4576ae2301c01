// What a policy's answer may be, checked where it is received (the worker),
// with the plugin's bounds and words (host/src/policy/hooks.rs, failure.rs):
// a policy that answers too much or out of bounds has failed, like one that
// trapped. Every function returns {ok: answer} or {fail: "what happened"}.

export const MAX_PREFERRED = 256;
export const MAX_REFUSED = 1024;
export const MAX_TEXT = 1024;
const MAX_ADDRESS = 64;

/** The plugin's CallFailure texts, by kind. */
export const failure = {
  timeout: (ms) => `timed out after ${ms} ms`,
  memory: (mib) => `went over its memory limit of ${mib} MiB`,
  stack: () => 'overflowed its stack',
  trap: (what) => `trapped: ${what}`,
  badAnswer: (what) => `gave a bad answer: ${what}`,
  badSettings: (what) => `rejected its settings: ${what}`,
};

class Bad extends Error {}

const bytes = (s) => new TextEncoder().encode(s).length;

function bounded(text) {
  if (typeof text !== 'string') throw new Bad(`a text that is not a string (${typeof text})`);
  const n = bytes(text);
  if (n > MAX_TEXT) throw new Bad(`a text of ${n} bytes, more than ${MAX_TEXT}`);
  return text;
}

function address(text) {
  if (typeof text !== 'string') throw new Bad('an address that is not a string');
  const n = bytes(text);
  if (n > MAX_ADDRESS) throw new Bad(`an address of ${n} bytes`);
  return text;
}

function checked(fn) {
  try {
    return fn();
  } catch (e) {
    if (e instanceof Bad) return { fail: failure.badAnswer(e.message) };
    throw e;
  }
}

/** `answer`: {ok: needs flags} or {err: string}. */
export function checkSettings(answer) {
  try {
    if ('err' in answer) return { fail: failure.badSettings(bounded(answer.err)) };
  } catch (e) {
    if (e instanceof Bad) return { fail: failure.badAnswer(e.message) };
    throw e;
  }
  const needs = answer.ok || {};
  return { ok: { labels: Boolean(needs.podLabels), annotations: Boolean(needs.podAnnotations) } };
}

/** `answer`: {ok: list of range indexes} or {err: reason (a veto)}; `count`: the config's ranges. */
export function checkRanges(answer, count) {
  return checked(() => {
    if ('err' in answer) return { ok: { veto: bounded(answer.err) } };
    const ranges = Array.from(answer.ok ?? []);
    const seen = new Set();
    for (const r of ranges) {
      if (!Number.isInteger(r) || r < 0 || r >= count) throw new Bad(`range index ${r} is out of bounds (the config has ${count})`);
      if (seen.has(r)) throw new Bad(`range index ${r} is listed twice`);
      seen.add(r);
    }
    if (!ranges.length) throw new Bad('no range selected (answer an error to refuse the attachment)');
    return { ok: { ranges } };
  });
}

/** `pick`: the WIT `pick` as jco lifts it ({choice: {tag, val}, refused: [{address, reason}]}). */
export function checkPick(pick) {
  return checked(() => {
    const refusedIn = pick?.refused ?? [];
    if (refusedIn.length > MAX_REFUSED) throw new Bad(`${refusedIn.length} refusals, more than ${MAX_REFUSED}`);
    const refused = Array.from(refusedIn, (r) => ({ address: address(r.address), reason: bounded(r.reason) }));
    const choice = pick?.choice ?? {};
    switch (choice.tag) {
      case 'built-in': return { ok: { choice: { tag: 'built-in' }, refused } };
      case 'veto': return { ok: { choice: { tag: 'veto', val: bounded(choice.val) }, refused } };
      case 'prefer': {
        const list = choice.val ?? [];
        if (list.length > MAX_PREFERRED) throw new Bad(`${list.length} preferred addresses, more than ${MAX_PREFERRED}`);
        if (!list.length) throw new Bad('an empty preference (answer built-in instead)');
        return { ok: { choice: { tag: 'prefer', val: Array.from(list, address) }, refused } };
      }
      default: throw new Bad(`an unknown choice ${JSON.stringify(choice.tag)}`);
    }
  });
}
