// Takes the CNI config out of what a person pasted: either the config JSON itself,
// or a NetworkAttachmentDefinition in YAML, whose `spec.config` holds that JSON as a
// string. This is not a YAML parser: it understands exactly the shapes a NAD's
// `spec.config` is written in (a block scalar `config: |`, or a single- or
// double-quoted string, possibly spanning lines), which keeps the page free of a
// YAML dependency. Everything else is left to the engine, which gets the JSON text
// verbatim so that its errors are the plugin's errors.

/** Thrown when the YAML has no usable `spec.config`. */
export class ExtractError extends Error {
  constructor(message, line) {
    super(message);
    this.field = 'spec.config';
    this.line = line;
  }
}

/**
 * @param {string} text what the person pasted
 * @returns {{kind: 'json'|'nad', config: string, name?: string}}
 */
export function extractConfig(text) {
  const trimmed = text.replace(/^\uFEFF/, '').trim();
  if (trimmed === '' || trimmed.startsWith('{') || trimmed.startsWith('[')) {
    // JSON (or nothing): the engine reports what is wrong with it.
    return { kind: 'json', config: trimmed };
  }
  return extractFromNad(text);
}

const indentOf = (line) => line.match(/^ */)[0].length;
const isBlank = (line) => /^\s*(#.*)?$/.test(line);

/** `key:` at the start of a (trimmed) line; the key may be quoted. */
function keyValue(trimmedLine) {
  const m = trimmedLine.match(/^(?:"([^"]*)"|'([^']*)'|([^\s:#'"][^:#]*?))\s*:(?:\s+|$)(.*)$/);
  if (!m) return null;
  return { key: m[1] ?? m[2] ?? m[3], rest: m[4] };
}

function extractFromNad(text) {
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  if (lines.some((l) => /^\t/.test(l))) {
    throw new ExtractError('YAML does not allow tabs for indentation; indent with spaces', lines.findIndex((l) => /^\t/.test(l)) + 1);
  }
  // Documents are separated by `---`; use the first with a spec.config.
  const docs = [];
  let start = 0;
  for (let i = 0; i <= lines.length; i++) {
    if (i === lines.length || /^---(\s|$)/.test(lines[i]) || /^\.\.\.(\s|$)/.test(lines[i])) {
      docs.push([start, i]);
      start = i + 1;
    }
  }
  let sawSpec = false;
  for (const [from, to] of docs) {
    const found = findSpecConfig(lines, from, to);
    if (found === 'spec-without-config') sawSpec = true;
    else if (found) return found;
  }
  if (sawSpec) throw new ExtractError('the NetworkAttachmentDefinition has a spec but no spec.config');
  throw new ExtractError('not JSON, and not a NetworkAttachmentDefinition: expected a CNI config starting with "{", or YAML with spec.config');
}

function findSpecConfig(lines, from, to) {
  let name;
  let inMetadata = false;
  for (let i = from; i < to; i++) {
    const line = lines[i];
    if (isBlank(line) || indentOf(line) !== 0) {
      // metadata.name, for display only
      if (inMetadata && !isBlank(line)) {
        const kv = keyValue(line.trim());
        if (kv && kv.key === 'name' && !name) name = unquoteScalar(kv.rest);
      }
      continue;
    }
    const kv = keyValue(line.trim());
    inMetadata = kv?.key === 'metadata';
    if (!kv || kv.key !== 'spec') continue;
    if (kv.rest.trim().startsWith('{')) {
      throw new ExtractError('spec is written as a YAML flow mapping; write it as a block (spec:\\n  config: |) instead', i + 1);
    }
    // Children of spec: the lines after it that are indented.
    let childIndent = -1;
    for (let j = i + 1; j < to; j++) {
      const child = lines[j];
      if (isBlank(child)) continue;
      const ind = indentOf(child);
      if (ind === 0) break;
      if (childIndent < 0) childIndent = ind;
      if (ind !== childIndent) continue;
      const ckv = keyValue(child.trim());
      if (ckv && ckv.key === 'config') {
        return { kind: 'nad', name, config: scalarAt(lines, j, to, ind, ckv.rest) };
      }
    }
    return 'spec-without-config';
  }
  return null;
}

function unquoteScalar(s) {
  s = s.replace(/\s+#.*$/, '').trim();
  if (s.startsWith('"') && s.endsWith('"')) {
    try { return JSON.parse(s); } catch { return s.slice(1, -1); }
  }
  if (s.startsWith("'") && s.endsWith("'")) return s.slice(1, -1).replace(/''/g, "'");
  return s;
}

/** The string value of the key on line `at` (indented `keyIndent`), whose text after the colon is `rest`. */
function scalarAt(lines, at, to, keyIndent, rest) {
  const value = rest.trim();
  // Block scalar: | |- |+ > >- with an optional indentation indicator, and an optional comment.
  const block = value.match(/^([|>])([+-]?)([1-9]?)([+-]?)\s*(#.*)?$/);
  if (block) {
    const explicit = Number(block[3]) || 0;
    const body = [];
    let indent = explicit ? keyIndent + explicit : -1;
    for (let j = at + 1; j < to; j++) {
      const line = lines[j];
      if (line.trim() === '') { body.push(''); continue; }
      const ind = indentOf(line);
      if (ind <= keyIndent) break;
      if (indent < 0) indent = ind;
      if (ind < indent) {
        throw new ExtractError(`spec.config: line ${j + 1} is indented less than the first line of the block`, j + 1);
      }
      body.push(line.slice(indent));
    }
    while (body.length && body[body.length - 1] === '') body.pop();
    if (body.length === 0) throw new ExtractError('spec.config is empty', at + 1);
    // Folded (>) scalars join lines with spaces; for JSON text that is the same thing.
    return body.join(block[1] === '>' ? ' ' : '\n');
  }
  if (value.startsWith('"') || value.startsWith("'")) {
    const quote = value[0];
    // Gather the quoted scalar, which may continue on following lines.
    let textSoFar = value.slice(1);
    let j = at;
    for (;;) {
      const end = closingQuote(textSoFar, quote);
      if (end >= 0) {
        const tail = textSoFar.slice(end + 1).trim();
        if (tail && !tail.startsWith('#')) {
          throw new ExtractError(`spec.config: unexpected text after the closing quote: ${tail.slice(0, 40)}`, j + 1);
        }
        return quote === "'" ? foldSingle(textSoFar.slice(0, end)) : unescapeDouble(textSoFar.slice(0, end), j + 1);
      }
      j++;
      if (j >= to) throw new ExtractError(`spec.config: the ${quote === '"' ? 'double' : 'single'}-quoted string is never closed`, at + 1);
      textSoFar += '\n' + lines[j];
    }
  }
  if (value === '' || value.startsWith('#')) {
    throw new ExtractError('spec.config has no value: write it as a block scalar (config: |) or a quoted string', at + 1);
  }
  if (value.startsWith('{')) {
    // A flow mapping, not a string. Accept it when it is also valid JSON spanning the
    // following more-indented lines, which is how people usually mean it.
    let candidate = value;
    for (let j = at + 1; j < to && (lines[j].trim() === '' || indentOf(lines[j]) > keyIndent); j++) candidate += '\n' + lines[j];
    try {
      JSON.parse(candidate);
      return candidate;
    } catch {
      throw new ExtractError('spec.config must be a string holding JSON: write it as a block scalar (config: |) or a quoted string', at + 1);
    }
  }
  // A plain scalar: rarely JSON, but let the engine say what is wrong with it.
  return value.replace(/\s+#.*$/, '');
}

function closingQuote(s, quote) {
  for (let i = 0; i < s.length; i++) {
    if (quote === '"' && s[i] === '\\') { i++; continue; }
    if (s[i] === quote) {
      if (quote === "'" && s[i + 1] === "'") { i++; continue; }
      return i;
    }
  }
  return -1;
}

/** YAML flow folding: a single line break becomes a space, n blank lines become n-1 newlines. */
function fold(s) {
  return s.replace(/[ \t]*\n[ \t]*/g, '\n').replace(/(^|[^\n])\n(?!\n)/g, '$1 ').replace(/\n(\n+)/g, '$1');
}

function foldSingle(s) {
  return fold(s).replace(/''/g, "'");
}

const YAML_ESCAPES = { '0': '\0', a: '\x07', b: '\b', t: '\t', '\t': '\t', n: '\n', v: '\v', f: '\f', r: '\r', e: '\x1b', ' ': ' ', '"': '"', '/': '/', '\\': '\\', N: '\x85', _: '\xa0', L: '\u2028', P: '\u2029' };

function unescapeDouble(s, line) {
  // An escaped line break joins lines without a space.
  s = s.replace(/\\\n[ \t]*/g, '');
  s = fold(s);
  return s.replace(/\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)/g, (_, e) => {
    if (e.length > 1) return String.fromCodePoint(parseInt(e.slice(1), 16));
    if (e in YAML_ESCAPES) return YAML_ESCAPES[e];
    throw new ExtractError(`spec.config: unknown escape \\${e} in the double-quoted string`, line);
  });
}
