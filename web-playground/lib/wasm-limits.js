// The browser has no store limiter like the plugin's wasmtime: the only way to
// bound a policy's linear memory is the memory's own declared maximum. This
// rewrites the memory section of a core module so that every memory it defines
// has at most `memory_mib`: `memory.grow` past it then fails (-1), as the
// plugin's limiter makes it fail, and a Rust policy aborts (a trap) instead of
// eating the tab's memory.

const PAGE = 65536;
const MEMORY_SECTION = 5;

function readLeb(bytes, at) {
  let value = 0;
  let shift = 0;
  for (;;) {
    const b = bytes[at++];
    if (b === undefined) throw new Error('truncated LEB128');
    value += (b & 0x7f) * 2 ** shift;
    shift += 7;
    if (!(b & 0x80)) return { value, next: at };
    if (shift > 35) throw new Error('LEB128 too long for a u32');
  }
}

function leb(value) {
  const out = [];
  do {
    let b = value % 128;
    value = Math.floor(value / 128);
    if (value) b |= 0x80;
    out.push(b);
  } while (value);
  return out;
}

/**
 * `bytes` (a core module) with each defined memory's maximum at most
 * `maxPages`. Throws when a memory starts above the limit (the plugin cannot
 * instantiate it either) or is one this cannot bound (shared, 64-bit).
 * A module without a memory section is returned as is.
 */
export function capMemory(bytes, maxPages) {
  if (bytes[0] !== 0 || bytes[1] !== 0x61 || bytes[2] !== 0x73 || bytes[3] !== 0x6d) throw new Error('not a core WebAssembly module');
  const parts = [bytes.subarray(0, 8)];
  let at = 8;
  while (at < bytes.length) {
    const id = bytes[at];
    const size = readLeb(bytes, at + 1);
    const end = size.next + size.value;
    if (end > bytes.length) throw new Error('truncated section');
    if (id !== MEMORY_SECTION) {
      parts.push(bytes.subarray(at, end));
    } else {
      const body = [];
      const count = readLeb(bytes, size.next);
      body.push(...leb(count.value));
      let p = count.next;
      for (let i = 0; i < count.value; i++) {
        const flags = bytes[p++];
        if (flags > 1) throw new Error(`memory ${i} is shared or 64-bit (flags ${flags}): the playground cannot bound it`);
        const min = readLeb(bytes, p);
        p = min.next;
        let max = Infinity;
        if (flags === 1) {
          const m = readLeb(bytes, p);
          max = m.value;
          p = m.next;
        }
        if (min.value > maxPages) {
          throw new Error(`memory ${i} starts at ${(min.value * PAGE / 2 ** 20).toFixed(2)} MiB, more than its memory limit of ${maxPages * PAGE / 2 ** 20} MiB`);
        }
        body.push(1, ...leb(min.value), ...leb(Math.min(max, maxPages)));
      }
      if (p !== end) throw new Error('unexpected bytes in the memory section');
      parts.push(Uint8Array.of(MEMORY_SECTION, ...leb(body.length), ...body));
    }
    at = end;
  }
  const out = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let o = 0;
  for (const part of parts) { out.set(part, o); o += part.length; }
  return out;
}

export const mibToPages = (mib) => Math.floor(mib * 2 ** 20 / PAGE);
