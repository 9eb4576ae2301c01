// A cluster's state pasted into the page: the output of
//   kubectl get ippools,overlappingrangeipreservations,nodeslicepools,ipamclaims -o yaml
// (or -o json). The page only turns YAML into JSON (js-yaml, pinned in
// package-lock.json, copied by build.sh to vendor/); which pools the config
// reads, their entries and owners, the reservations and IPAMClaims are the
// engine's `cluster-pools`, the same call `thereabouts preview --from-objects`
// makes, so the next pods here are the CLI's.

import { loadAll, YAMLException } from '../vendor/js-yaml.mjs';
import { configErrorOf } from './model.js';

/** The most base64url characters of pasted state the share link carries. */
export const MAX_SHARED_CLUSTER = 6000;

export class ClusterError extends Error {
  constructor(message, line = null) {
    super(message);
    this.line = line;
  }
}

/**
 * The pasted text as the JSON `kubectl -o json` prints: JSON is passed as is,
 * YAML converted (several `---` documents become one List). Null for blank text
 * (no cluster: the preview starts from empty pools). Throws ClusterError.
 */
export function objectsJson(text) {
  if (!text.trim()) return null;
  if (/^\s*[{[]/.test(text)) {
    try {
      JSON.parse(text);
      return text;
    } catch {
      // Not JSON after all: YAML's flow style also starts with `{`.
    }
  }
  let docs;
  try {
    docs = loadAll(text).filter((d) => d !== null && d !== undefined);
  } catch (e) {
    if (!(e instanceof YAMLException)) throw e;
    throw new ClusterError(`not YAML or JSON: ${e.reason}`, e.mark ? e.mark.line + 1 : null);
  }
  const doc = docs.length === 1 ? docs[0] : { apiVersion: 'v1', kind: 'List', items: docs };
  // YAML timestamps become Dates; JSON.stringify writes them back as text.
  return JSON.stringify(doc);
}

/**
 * The config's pools in the pasted cluster (the engine's `cluster-state`), or
 * {error} with the engine's or the YAML reader's message. Null: none pasted.
 */
export function readCluster(engine, config, text) {
  let json;
  try {
    json = objectsJson(text);
  } catch (e) {
    if (!(e instanceof ClusterError)) throw e;
    return { error: { field: 'cluster state', message: e.message + (e.line ? ` (line ${e.line})` : ''), source: 'cluster' } };
  }
  if (json === null) return null;
  try {
    return engine.clusterPools(config, json);
  } catch (e) {
    const err = configErrorOf(e);
    if (!err) throw e;
    return { error: { ...err, source: 'cluster' } };
  }
}

/** Who owns an entry, as the page says it. */
export function ownerOf(claim) {
  if (!claim) return { kind: 'pod', text: 'pod' };
  if (claim.tag === 'ipam-claim') return { kind: 'ipam-claim', text: `held by IPAMClaim ${claim.val}` };
  return { kind: 'resource-claim', text: `DRA claim ${claim.val}` };
}
