// Adds an entry to the `policies` list of the config the user edits (the
// list the engine normalizes, and the source of truth for which policies run),
// so that the config the page previews is the one the plugin would be given.

export class PolicyEditError extends Error {}

/**
 * `text` (the config textarea) with `entry` appended to its ipam section's
 * `policies` (a conflist: the first plugin with ipam, as the engine picks it).
 * Its name gets a `-2`, `-3`... suffix when taken. JSON only: a
 * NetworkAttachmentDefinition's spec.config is a string inside YAML.
 */
export function addPolicy(text, entry) {
  if (!text.trim().startsWith('{')) throw new PolicyEditError('add policies to spec.config by hand (the page only rewrites a JSON config)');
  let doc;
  try { doc = JSON.parse(text); } catch (e) { throw new PolicyEditError(`the config is not JSON yet: ${e.message}`); }
  const holder = Array.isArray(doc?.plugins) ? doc.plugins.find((p) => p && typeof p === 'object' && p.ipam) : doc;
  const ipam = holder?.ipam;
  if (!ipam || typeof ipam !== 'object') throw new PolicyEditError('the config has no ipam section');
  if (ipam.policies !== undefined && !Array.isArray(ipam.policies)) throw new PolicyEditError('ipam.policies is not a list');
  const list = ipam.policies || [];
  const taken = new Set(list.map((p) => p && p.name));
  let name = entry.name;
  for (let n = 2; taken.has(name); n++) name = `${entry.name}-${n}`;
  ipam.policies = [...list, { ...entry, name }];
  return JSON.stringify(doc, null, 2);
}

/** A policy path's file name: what links a config's policy to a loaded component. */
export const fileNameOf = (path) => path.slice(path.lastIndexOf('/') + 1);

/** Whether some policy of `policies` (normalized) has a path ending in `file`. */
export const usesFile = (policies, file) => policies.some((p) => fileNameOf(p.path) === file);

/** Where example and picked policies are said to live (the plugin's path must be absolute). */
export const POLICY_DIR = '/etc/cni/net.d/thereabouts.d/policies';

/** "tier=db, app=web" -> [['tier', 'db'], ['app', 'web']]; throws on a token without `=`. */
export function parseLabels(text) {
  return text.split(/[\s,]+/).filter(Boolean).map((t) => {
    const at = t.indexOf('=');
    if (at < 1) throw new PolicyEditError(`label "${t}" is not key=value`);
    return [t.slice(0, at), t.slice(at + 1)];
  });
}
