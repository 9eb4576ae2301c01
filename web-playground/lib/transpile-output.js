// What a transpiled policy must be, wherever it was transpiled (build.sh with
// the jco CLI, or the page with the same jco's `generate`).

/** `generate`'s options: the equivalent of build.sh's `jco transpile --name policy --instantiation async --no-typescript`. */
export const TRANSPILE_OPTIONS = { name: 'policy', instantiation: { tag: 'async' }, noTypescript: true };

/**
 * From jco's {files: [[name, bytes]], imports, exports}: {js, cores} or {fail}.
 * A policy-extension component imports nothing and exports the policy interface.
 */
export function pickFiles({ files, imports, exports }) {
  if (imports.length) return { fail: `imports ${imports.join(', ')}: a policy-extension component imports nothing` };
  if (!exports.some(([name]) => name === 'policy' || name.startsWith('thereabouts:ipam/policy@'))) {
    return { fail: `exports ${exports.map(([n]) => n).join(', ') || 'nothing'}, not thereabouts:ipam/policy` };
  }
  const byName = new Map(files);
  const js = byName.get('policy.js');
  if (!js) return { fail: 'jco produced no policy.js' };
  const cores = {};
  for (const [name, bytes] of files) if (name.endsWith('.wasm')) cores[name] = bytes;
  return { js: new TextDecoder().decode(js), cores };
}
