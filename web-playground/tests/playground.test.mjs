// Browser tests of the playground: headless Debian Chromium driven by playwright-core.
// Run by tests/playground.sh, which builds the engine, serves the page and sets
// PLAYGROUND_URL (and THEREABOUTS_BIN for the parity test).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, mkdirSync, copyFileSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir, loadavg, cpus } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync, spawnSync } from 'node:child_process';
import { chromium } from 'playwright-core';
import { EXAMPLES, BIG } from '../lib/examples.js';
import { extractConfig } from '../lib/nad.js';
import { dump as yamlDump } from 'js-yaml';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const URL_BASE = process.env.PLAYGROUND_URL || 'http://127.0.0.1:8080/';
const BIN = process.env.THEREABOUTS_BIN || join(root, 'target/debug/thereabouts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = join(root, 'tests/artifacts');

let context;
let userDataDir;

before(async () => {
  userDataDir = mkdtempSync(join(tmpdir(), 'thereabouts-playground-'));
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1200, height: 900 },
  });
  // No network at run time: anything that is not the local server is a failure.
  await context.route('**/*', (route) => {
    const url = new URL(route.request().url());
    if (url.hostname === '127.0.0.1' || url.hostname === 'localhost') return route.continue();
    external.push(url.href);
    return route.abort();
  });
});

const external = [];

after(async () => {
  await context?.close();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
});

test('the page loads nothing but its own files', async () => {
  const page = await open();
  await pickExample(page, 'dual-stack');
  assert.deepEqual(external, []);
  await page.close();
});

async function open(hash = '') {
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  await page.goto(URL_BASE + hash);
  await page.waitForSelector('html[data-ready="true"]', { timeout: 30000 });
  page.problems = problems;
  return page;
}

/** The pod table as [[pod, addr, addr...], ...] (first `limit` rows). */
async function rows(page, limit = 1e9) {
  return page.evaluate((limit) => {
    const out = [];
    for (const tr of document.querySelectorAll('#pods-table .pbody .prow')) {
      if (out.length >= limit) break;
      const cells = [...tr.children].map((td) => td.textContent.trim());
      out.push(cells);
    }
    return out;
  }, limit);
}

/** Only the address columns (drops the pod number and the Result column). */
async function addressRows(page, nRanges, limit) {
  return (await rows(page, limit)).map((r) => r.slice(1, 1 + nRanges));
}

async function pickExample(page, id) {
  await page.selectOption('#example', id);
  await page.waitForFunction(() => document.querySelector('#pods-table .pbody .prow') || !document.querySelector('#errors-section').hidden);
}

async function setPods(page, n) {
  await page.fill('#pods', String(n));
  await page.press('#pods', 'Enter');
}

test('two IPv4 ranges: first pods, excludes skipped', async () => {
  const page = await open();
  await pickExample(page, 'two-ipv4');
  assert.deepEqual(await addressRows(page, 2, 8), [
    ['192.0.2.2/27', '198.51.100.10/24'],
    ['192.0.2.3/27', '198.51.100.11/24'],
    ['192.0.2.4/27', '198.51.100.12/24'],
    ['192.0.2.5/27', '198.51.100.13/24'],
    ['192.0.2.6/27', '198.51.100.14/24'],
    ['192.0.2.7/27', '198.51.100.15/24'],
    ['192.0.2.12/27', '198.51.100.16/24'],
    ['192.0.2.13/27', '198.51.100.17/24'],
  ]);
  const ranges = await page.$$eval('#ranges tbody tr', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent.trim())));
  assert.deepEqual(ranges.map((r) => r.slice(0, 5)), [
    ['1', '192.0.2.0/27', '192.0.2.1', '192.0.2.30', '25'],
    ['2', '198.51.100.0/24', '198.51.100.10', '198.51.100.254', '245'],
  ]);
  assert.match(ranges[0][5], /^5/);
  assert.equal(ranges[0][7], '192.0.2.0-27');
  assert.equal(ranges[1][6], '198.51.100.1');
  assert.equal(await page.isHidden('#errors-section'), true);
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('dual-stack NetworkAttachmentDefinition: pairs side by side', async () => {
  const page = await open();
  await pickExample(page, 'dual-stack');
  assert.deepEqual(await addressRows(page, 2, 3), [
    ['192.0.2.2/24', '2001:db8:1::2/64'],
    ['192.0.2.3/24', '2001:db8:1::3/64'],
    ['192.0.2.4/24', '2001:db8:1::4/64'],
  ]);
  assert.match(await page.textContent('#network-info'), /from spec\.config of dual-stack/);
  const pools = await page.$$eval('#ranges tbody tr td:last-child', (tds) => tds.map((td) => td.textContent));
  assert.deepEqual(pools, ['192.0.2.0-24', '2001-db8-1---64']);
  // Gateways are excluded, so no gateway warning; 10 pods fit, so no warnings at all.
  assert.equal(await page.isHidden('#warnings-section'), true);
  await page.close();
});

test('legacy range + ipRanges: legacy range first, runs out after 4 pods', async () => {
  const page = await open();
  await pickExample(page, 'legacy-plus-ipranges');
  const all = await rows(page);
  assert.equal(all.length, 10);
  assert.deepEqual(all.slice(0, 4).map((r) => r.slice(1, 3)), [
    ['203.0.113.100/24', '2001:db8:2::1/120'],
    ['203.0.113.101/24', '2001:db8:2::2/120'],
    ['203.0.113.102/24', '2001:db8:2::3/120'],
    ['203.0.113.103/24', '2001:db8:2::4/120'],
  ]);
  assert.equal(all[4][1], 'exhausted');
  assert.match(all[4][3], /^ADD fails: Could not allocate IP in range: ip: 203\.0\.113\.100 \/ - 203\.0\.113\.103 \/ range: 203\.0\.113\.0\/24/);
  const pools = await page.$$eval('#ranges tbody tr td:last-child', (tds) => tds.map((td) => td.textContent));
  assert.deepEqual(pools, ['tenant-a-203.0.113.0-24', 'tenant-a-2001-db8-2---120']);
  const warnings = await page.$$eval('#warnings li', (lis) => lis.map((li) => li.textContent));
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /^Range 1 \(203\.0\.113\.0\/24\) runs out at pod 5/);
  await page.close();
});

test('a broken config shows the plugin\'s error: field and message', async () => {
  const page = await open();
  await pickExample(page, 'broken');
  await page.waitForSelector('#errors-section:not([hidden])');
  assert.equal(await page.textContent('#errors .error[data-index="0"] .field'), 'ipam.ipRanges[1].range');
  assert.equal(await page.textContent('#errors .error[data-index="0"] .message'),
    'ipam.ipRanges[1].range: invalid CIDR "198.51.100.0/33" (expected e.g. 192.0.2.0/24 or 2001:db8::/64)');
  assert.match(await page.textContent('#errors .error[data-index="0"]'), /CNI error 7/);
  assert.equal(await page.isHidden('#preview-section'), true);

  // The same message the engine gives the plugin (the component, imported in Node).
  const { engine } = await import('../engine/engine.js');
  const text = EXAMPLES.find((e) => e.id === 'broken').text;
  assert.throws(() => engine.normalize(text, undefined, ''), (e) => e.payload.message === 'ipam.ipRanges[1].range: invalid CIDR "198.51.100.0/33" (expected e.g. 192.0.2.0/24 or 2001:db8::/64)');

  // ... and the message the CLI prints for the same file.
  const dir = mkdtempSync(join(tmpdir(), 'thereabouts-broken-'));
  try {
    writeFileSync(join(dir, 'broken.json'), text);
    const cli = spawnSync(BIN, ['preview', '--config', join(dir, 'broken.json'), '--pods', '1', '--output', 'json'], { encoding: 'utf8' });
    assert.notEqual(cli.status, 0);
    assert.ok(cli.stderr.includes(await page.textContent('#errors .error[data-index="0"] .message')), cli.stderr);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }

  // Typing a fix updates the view.
  await page.fill('#config', text.replace('/33', '/24'));
  await page.waitForSelector('#errors-section', { state: 'hidden' });
  assert.deepEqual(await addressRows(page, 2, 1), [['192.0.2.1/24', '198.51.100.1/24']]);

  // Several broken entries: the plugin's error first, then the others.
  const multi = JSON.stringify({ cniVersion: '1.0.0', name: 'm', ipam: { type: 'whereabouts', ipRanges: [{ range: '192.0.2.0/24', exclude: ['nope'] }, { range: '2001:db8::/129' }] } });
  await page.fill('#config', multi);
  await page.waitForSelector('#errors .error[data-index="1"]');
  const fields = await page.$$eval('#errors .field', (els) => els.map((e) => e.textContent));
  assert.deepEqual(fields, ['ipam.ipRanges[0].exclude[0]', 'ipam.ipRanges[1].range']);

  // A JSON syntax error: the document as a whole.
  await page.fill('#config', '{"cniVersion": "1.0.0", "name": "x", "ipam": {');
  await page.waitForFunction(() => document.querySelector('#errors .field')?.textContent === '(the whole document)');
  assert.match(await page.textContent('#errors .message'), /^network config: JSON parsing error: EOF while parsing/);

  // YAML without spec.config.
  await page.fill('#config', 'apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: x\nspec:\n  other: 1\n');
  await page.waitForFunction(() => document.querySelector('#errors .field')?.textContent === 'spec.config');
  assert.match(await page.textContent('#errors .message'), /no spec\.config/);
  await page.close();
});

test('warnings: overlapping ranges; a gateway inside the span is skipped, not warned about', async () => {
  const page = await open();
  await page.fill('#config', JSON.stringify({ cniVersion: '1.0.0', name: 'w', ipam: { type: 'whereabouts', ipRanges: [
    { range: '192.0.2.0/24', gateway: '192.0.2.3' }, { range: '192.0.2.128/25', gateway: '192.0.2.129', exclude: ['192.0.2.129/32'] }] } }));
  await page.click('#run');
  const warnings = await page.$$eval('#warnings li', (lis) => lis.map((li) => [li.dataset.kind, li.textContent]));
  assert.deepEqual(warnings.map((w) => w[0]), ['overlap']);
  assert.match(warnings[0][1], /Ranges 1 \(192\.0\.2\.0\/24\) and 2 \(192\.0\.2\.128\/25\) overlap \(192\.0\.2\.129 – 192\.0\.2\.254\)/);
  // The engine never hands out the gateway: pod 3 gets .4.
  assert.deepEqual((await addressRows(page, 2, 3)).map((r) => r[0]), ['192.0.2.1/24', '192.0.2.2/24', '192.0.2.4/24']);
  await page.close();
});

test('NAD with a quoted spec.config string', async () => {
  const page = await open();
  const config = JSON.stringify({ cniVersion: '0.3.1', name: 'quoted', type: 'macvlan', ipam: { type: 'whereabouts', range: '198.51.100.0/29', exclude: ['198.51.100.1'] } });
  const yaml = `# a comment\napiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: quoted\n  annotations:\n    config: "not this one"\nspec:\n  config: '${config.replace(/'/g, "''")}'\n`;
  await page.fill('#config', yaml);
  await page.click('#run');
  assert.deepEqual(await addressRows(page, 1, 3), [['198.51.100.2/29'], ['198.51.100.3/29'], ['198.51.100.4/29']]);
  await page.close();
});

test('churn: deleted pods leave holes that new pods refill lowest-first', async () => {
  const page = await open();
  await pickExample(page, 'two-ipv4');
  await page.click('#churn-box summary');
  await page.fill('#churn-delete', '2, 4-5');
  await page.fill('#churn-add', '4');
  await page.click('#churn-apply');
  await page.waitForSelector('#pods-table .prow.new');
  const all = await rows(page);
  assert.deepEqual(all.map((r) => r[0].replace(/\s*new$/, '')), ['1', '3', '6', '7', '8', '9', '10', '11', '12', '13', '14']);
  const added = await page.$$eval('#pods-table .prow.new', (trs) => trs.map((tr) => [...tr.children].slice(1).map((td) => td.textContent)));
  assert.deepEqual(added, [
    ['192.0.2.3/27', '198.51.100.11/24'],
    ['192.0.2.5/27', '198.51.100.13/24'],
    ['192.0.2.6/27', '198.51.100.14/24'],
    ['192.0.2.16/27', '198.51.100.20/24'],
  ]);
  assert.match(await page.textContent('#churn-log li'), /^Deleted pods 2, 4–5; added 4 pods: 11 → 192\.0\.2\.3 \+ 198\.51\.100\.11/);

  // A second step: delete the lowest and add one; it takes the lowest hole.
  await page.fill('#churn-delete', '1');
  await page.fill('#churn-add', '1');
  await page.press('#churn-add', 'Enter');
  await page.waitForFunction(() => document.querySelectorAll('#churn-log li').length === 2);
  assert.deepEqual(await page.$$eval('#pods-table .prow.new', (trs) => trs.map((tr) => [...tr.children].slice(1).map((td) => td.textContent))),
    [['192.0.2.2/27', '198.51.100.10/24']]);

  // The link reproduces the view, churn included.
  const url = page.url();
  assert.match(url, /#n=10&churn=/);
  const before = await rows(page);
  const page2 = await open(url.slice(url.indexOf('#')));
  await page2.waitForSelector('#pods-table .prow.new');
  assert.deepEqual(await rows(page2), before);
  assert.equal(await page2.inputValue('#config'), await page.inputValue('#config'));
  await page2.close();
  await page.close();
});

test('keyboard only: pods count and Ctrl+Enter', async () => {
  const page = await open();
  await pickExample(page, 'dual-stack');
  await page.focus('#pods');
  await page.keyboard.press('Control+a');
  await page.keyboard.type('3');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelectorAll('#pods-table .pbody .prow').length === 3);
  // Tab from the pods field reaches the buttons.
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'run');
  await page.focus('#config');
  await page.keyboard.press('Control+End');
  await page.keyboard.type(' ');
  await page.keyboard.press('Control+Enter');
  assert.equal((await rows(page)).length, 3);
  await page.close();
});

test('mobile width: nothing overflows the page; screenshots', async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  const page = await open();
  await pickExample(page, 'dual-stack');
  await page.click('#churn-box summary');
  await page.fill('#churn-delete', '3-4');
  await page.fill('#churn-add', '2');
  await page.click('#churn-apply');
  await page.waitForSelector('#pods-table .prow.new');
  await page.screenshot({ path: join(ARTIFACTS, 'playground.png'), fullPage: true });
  copyFileSync(join(ARTIFACTS, 'playground.png'), join(root, 'web-playground/screenshot.png'));

  await page.setViewportSize({ width: 375, height: 800 });
  await pickExample(page, 'legacy-plus-ipranges');
  const widths = await page.evaluate(() => ({ doc: document.documentElement.scrollWidth, view: window.innerWidth }));
  assert.ok(widths.doc <= widths.view, `page is ${widths.doc}px wide in a ${widths.view}px viewport`);
  await page.screenshot({ path: join(ARTIFACTS, 'playground-mobile.png'), fullPage: true });
  await page.close();
});

// ---------------------------------------------------------------- parity with the CLI

const PARITY = [
  ...EXAMPLES.filter((e) => e.id !== 'broken').map((e) => ({ id: e.id, json: extractConfig(e.text).config, pods: 4 })),
  {
    id: 'overlapping',
    pods: 40,
    json: JSON.stringify({ cniVersion: '1.0.0', name: 'ov', type: 'macvlan', ipam: { type: 'whereabouts', ipRanges: [{ range: '192.0.2.0/26', range_start: '192.0.2.30' }, { range: '192.0.2.32/27' }, { range: '192.0.2.0/24' }] } }),
  },
  {
    id: 'excludes-and-end',
    pods: 25,
    json: JSON.stringify({ cniVersion: '0.4.0', name: 'ex', type: 'macvlan', ipam: { type: 'thereabouts', range: '203.0.113.0/24', range_start: '203.0.113.5', range_end: '203.0.113.60', exclude: ['203.0.113.8/29', '203.0.113.20', '203.0.113.33/32'], ipRanges: [{ range: '2001:db8:abcd::/112', exclude: ['2001:db8:abcd::/125'] }] } }),
  },
  {
    id: 'conflist-ipv6',
    pods: 12,
    json: JSON.stringify({ cniVersion: '1.0.0', name: 'cl', plugins: [{ type: 'macvlan', ipam: { type: 'whereabouts', network_name: 'blue', ipRanges: [{ range: '2001:db8::/64', range_start: '2001:db8::ffff' }, { range: '198.51.100.128/25', gateway: '198.51.100.129' }] } }, { type: 'tuning' }] }),
  },
];

function cliPreview(json, pods) {
  const dir = mkdtempSync(join(tmpdir(), 'thereabouts-parity-'));
  try {
    const file = join(dir, 'config.json');
    writeFileSync(file, json);
    return JSON.parse(execFileSync(BIN, ['preview', '--config', file, '--pods', String(pods), '--output', 'json'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('parity: the page shows the addresses `thereabouts preview --output json` prints', async (t) => {
  const page = await open();
  for (const c of PARITY) {
    await t.test(c.id, async () => {
      const cli = cliPreview(c.json, c.pods);
      assert.equal(cli.pods.length, c.pods);
      await page.fill('#pods', String(c.pods));
      await page.fill('#config', c.json);
      await page.click('#run');
      const n = cli.ranges.length;
      // The CLI prints null where a range is exhausted; the page shows a marker there.
      const shown = (await rows(page)).map((r) => ({ pod: Number(r[0]), addresses: r.slice(1, 1 + n).map((a) => (a.includes('/') ? a : null)) }));
      assert.equal(shown.length, c.pods);
      for (let i = 0; i < c.pods; i++) {
        assert.equal(shown[i].pod, cli.pods[i].pod, `pod number of row ${i + 1}`);
        assert.deepEqual(shown[i].addresses, cli.pods[i].addresses, `${c.id}: pod ${cli.pods[i].pod}`);
      }
    });
  }
  await page.close();
});

// ---------------------------------------------------------------- a pasted cluster

const WHEREABOUTS = 'whereabouts.cni.cncf.io/v1alpha1';
const ippool = (name, range, allocations) => ({ apiVersion: WHEREABOUTS, kind: 'IPPool', metadata: { name, namespace: 'kube-system' }, spec: { range, allocations } });
const orip = (name, podref) => ({ apiVersion: WHEREABOUTS, kind: 'OverlappingRangeIPReservation', metadata: { name, namespace: 'kube-system' }, spec: { podref, ifname: 'net1' } });
/** A cluster of network `blue`, as `kubectl get ippools,overlappingrangeipreservations,nodeslicepools,ipamclaims -o json` prints it. */
const CLUSTER = {
  apiVersion: 'v1', kind: 'List', items: [
    ippool('blue-192.0.2.0-28', '192.0.2.0/28', {
      1: { id: 'c-a', podref: 'ns/a', ifname: 'net1' },
      2: { id: 'c-vm', podref: 'ns/virt-launcher-vm-x1', ifname: 'net1', ipamclaimref: 'ns/vm.blue' },
      4: { id: 'c-b', podref: 'ns/b', ifname: 'net1' },
    }),
    ippool('blue-2001-db8---124', '2001:db8::/124', {
      1: { id: 'c-a', podref: 'ns/a', ifname: 'net1' },
      2: { id: 'c-vm', podref: 'ns/virt-launcher-vm-x1', ifname: 'net1', ipamclaimref: 'ns/vm.blue' },
      3: { id: 'c-b', podref: 'ns/b', ifname: 'net1' },
    }),
    // The entry's own reservation, and one of an ADD whose pool write is not in yet.
    orip('blue-192.0.2.1', 'ns/a'),
    orip('blue-192.0.2.3', 'ns/racer'),
    { apiVersion: 'k8s.cni.cncf.io/v1alpha1', kind: 'IPAMClaim', metadata: { name: 'vm.blue', namespace: 'ns' },
      spec: { network: 'blue', interface: 'net1' }, status: { ips: ['192.0.2.2/28', '2001:db8::2/124'], ownerPod: { name: 'virt-launcher-vm-x1' } } },
  ],
};
const CLUSTER_CONFIG = JSON.stringify({ cniVersion: '1.0.0', name: 'blue', type: 'macvlan',
  ipam: { type: 'whereabouts', network_name: 'blue', ipRanges: [{ range: '192.0.2.0/28' }, { range: '2001:db8::/124' }] } }, null, 2);

test('a pasted cluster: the next pods are `thereabouts preview --from-objects`\'s, a claim\'s entry is shown as the claim\'s', async () => {
  const pods = 6;
  const dir = mkdtempSync(join(tmpdir(), 'thereabouts-cluster-'));
  let cli;
  try {
    writeFileSync(join(dir, 'config.json'), CLUSTER_CONFIG);
    writeFileSync(join(dir, 'cluster.json'), JSON.stringify(CLUSTER));
    cli = JSON.parse(execFileSync(BIN, ['preview', '--config', join(dir, 'config.json'), '--from-objects', join(dir, 'cluster.json'), '--pods', String(pods), '--output', 'json'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  // Around the entries (a claim's among them) and the racer's reservation, in both.
  assert.deepEqual(cli.pods[0].addresses, ['192.0.2.5/28', '2001:db8::4/124']);

  const page = await open();
  await page.fill('#pods', String(pods));
  await page.fill('#config', CLUSTER_CONFIG);
  await page.click('#cluster-box summary');
  // Pasted as kubectl prints it with -o yaml.
  await page.fill('#cluster', yamlDump(CLUSTER));
  await page.waitForFunction(() => !document.querySelector('#cluster-section').hidden && document.querySelector('#pods-table .pbody .prow'));
  const shown = (await rows(page)).map((r) => r.slice(1, 3).map((a) => (a.includes('/') ? a : null)));
  assert.deepEqual(shown, cli.pods.map((p) => p.addresses));

  // The claim's entries are the claim's, the pods' the pods'; the claim lists what it holds.
  const entries = await page.$$eval('#cluster-entries tbody tr', (trs) => trs.map((tr) => [tr.dataset.ip, tr.dataset.owner, tr.querySelector('.owner').textContent]));
  assert.deepEqual(entries.filter(([, owner]) => owner !== 'pod'), [
    ['192.0.2.2', 'ipam-claim', 'held by IPAMClaim ns/vm.blue'],
    ['2001:db8::2', 'ipam-claim', 'held by IPAMClaim ns/vm.blue'],
  ]);
  assert.equal(entries.length, 6);
  assert.match(await page.textContent('#cluster-claims li[data-claim="ns/vm.blue"]'), /holds 192\.0\.2\.2, 2001:db8::2/);
  assert.deepEqual(await page.$$eval('#cluster-reserved li', (lis) => lis.map((li) => li.dataset.ip)), ['192.0.2.3']);
  assert.match(await page.textContent('#usage'), /3 in the cluster \(1 held by claims\)/);

  // The link carries the (small) pasted state: opened anew, the same view.
  const hash = new URL(page.url()).hash;
  assert.match(hash, /[#&]cluster=/);
  const again = await open(hash);
  assert.deepEqual((await rows(again)).map((r) => r.slice(1, 3)), (await rows(page)).map((r) => r.slice(1, 3)));
  assert.equal(await again.isHidden('#cluster-section'), false);

  // A dump the engine cannot read: the error names the object; no preview.
  await page.fill('#cluster', JSON.stringify({ kind: 'List', items: [ippool('blue-192.0.2.0-28', '192.0.2.0/28', ['x'])] }));
  await page.waitForFunction(() => !document.querySelector('#errors-section').hidden);
  assert.match(await page.textContent('#errors'), /Could not read the cluster state:[\s\S]*objects\.items\[0\]\.spec\.allocations[\s\S]*not an object/);
  assert.deepEqual(page.problems, []);
  assert.deepEqual(again.problems, []);
  await again.close();
  await page.close();
});

// ---------------------------------------------------------------- policies

const POLICY_WASM = join(root, 'target/policies');
const policyPath = (file) => `/etc/cni/net.d/thereabouts.d/policies/${file}`;
const withPolicies = (ipam, policies) => JSON.stringify({ cniVersion: '1.0.0', name: 'pol', type: 'macvlan', ipam: { type: 'whereabouts', ...ipam, policies } }, null, 2);

/** Sets the pod identity, the pod count and the config; previews and waits for the policies' result. */
async function previewWithPolicies(page, config, { pods = 4, namespace = 'default', prefix = 'pod-', labels = '' } = {}) {
  await page.fill('#pod-namespace', namespace);
  await page.fill('#pod-prefix', prefix);
  await page.fill('#pod-labels', labels);
  await page.fill('#pods', String(pods));
  await page.evaluate(() => { window.playground.policyPreview = null; });
  await page.fill('#config', config);
  await page.click('#run');
  await page.waitForFunction(() => window.playground.policyPreview && document.querySelector('#preview-section').dataset.policies === 'done', null, { timeout: 60000 });
  return page.evaluate(() => window.playground.policyPreview);
}

test('policies: keep-addresses, added from the example picker, refuses its deny list with reasons', async () => {
  const page = await open();
  await pickExample(page, 'two-ipv4');
  await page.fill('#pods', '4');
  await page.selectOption('#policy-example', 'keep-addresses');
  await page.waitForFunction(() => document.querySelector('#preview-section').dataset.policies === 'done' && window.playground.policyPreview, null, { timeout: 60000 });
  const config = JSON.parse(await page.inputValue('#config'));
  assert.deepEqual(config.ipam.policies.map((p) => [p.name, p.path, p.settings.deny]), [['keep-addresses', policyPath('keep-addresses.wasm'), ['192.0.2.2', '192.0.2.4/31']]]);
  const { pods } = await page.evaluate(() => window.playground.policyPreview);
  // 192.0.2.1 and .8/30 are the config's excludes; .2, .4 and .5 the policy's.
  assert.deepEqual(pods.map((p) => p.addresses), [
    ['192.0.2.3/27', '198.51.100.10/24'], ['192.0.2.6/27', '198.51.100.11/24'], ['192.0.2.7/27', '198.51.100.12/24'], ['192.0.2.12/27', '198.51.100.13/24'],
  ]);
  assert.deepEqual(pods[0].refused.map((r) => [r.range, r.address, r.policy, r.reason]), [
    [0, '192.0.2.2', 'keep-addresses', 'deny-listed by settings'], [0, '192.0.2.4', 'keep-addresses', 'deny-listed by settings'], [0, '192.0.2.5', 'keep-addresses', 'deny-listed by settings'],
  ]);
  // The table shows them, on the pod's row.
  const shown = await page.$$eval('#pods-table .pbody .prow', (trs) => trs.map((tr) => tr.querySelector('.refused').textContent));
  assert.match(shown[0], /192\.0\.2\.2 \(range 1\) by keep-addresses: deny-listed by settings/);
  assert.equal((await rows(page))[0][0], '1 default/pod-0');
  assert.match(await page.textContent('#policy-list'), /keep-addresses: keep-addresses\.wasm \(example policy\) · enforce · on_error deny · timeout_ms 10 \(the page waits 500 ms\) · memory_mib 4/);
  assert.equal(await page.isHidden('#churn-box'), true, 'churn does not run policies');
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('policies: sticky-ordinal gives web-N its address; namespace-ranges by namespace and label', async () => {
  const page = await open();
  const ranges = { ipRanges: [{ range: '192.0.2.0/24' }, { range: '2001:db8::/64' }] };
  const sticky = await previewWithPolicies(page, withPolicies(ranges, [{ name: 'sticky', path: policyPath('sticky-ordinal.wasm'), settings: { base: 20, statefulsets: ['web'] } }]), { pods: 3, prefix: 'web-' });
  assert.deepEqual(sticky.pods.map((p) => [p.name, ...p.addresses]), [
    ['default/web-0', '192.0.2.21/24', '2001:db8::15/64'], ['default/web-1', '192.0.2.22/24', '2001:db8::16/64'], ['default/web-2', '192.0.2.23/24', '2001:db8::17/64'],
  ]);
  // The link keeps the pods' identity.
  const link = page.url();
  assert.match(link, /&prefix=web-&/);
  const page2 = await open(link.slice(link.indexOf('#')));
  await page2.waitForSelector('#preview-section[data-policies="done"]', { timeout: 60000 });
  assert.deepEqual(await page2.evaluate(() => window.playground.policyPreview), sticky);
  await page2.close();
  // Not a pod of the StatefulSet: the built-in choice.
  const other = await previewWithPolicies(page, withPolicies(ranges, [{ name: 'sticky', path: policyPath('sticky-ordinal.wasm'), settings: { base: 20, statefulsets: ['web'] } }]), { pods: 1, prefix: 'db-' });
  assert.deepEqual(other.pods[0].addresses, ['192.0.2.1/24', '2001:db8::1/64']);

  const ns = withPolicies({ ipRanges: [{ range: '192.0.2.0/24' }, { range: '198.51.100.0/24' }] },
    [{ name: 'zones', path: policyPath('namespace-ranges.wasm'), settings: { namespaces: { 'team-a': [1] }, labels: [{ key: 'tier', value: 'db', ranges: [0] }], default: [] } }]);
  const teamA = await previewWithPolicies(page, ns, { pods: 2, namespace: 'team-a' });
  assert.deepEqual(teamA.pods.map((p) => [p.name, ...p.addresses]), [['team-a/pod-0', null, '198.51.100.1/24'], ['team-a/pod-1', null, '198.51.100.2/24']]);
  const db = await previewWithPolicies(page, ns, { pods: 1, namespace: 'team-a', labels: 'tier=db, app=x' });
  assert.deepEqual(db.pods[0].addresses, ['192.0.2.1/24', null]);
  const nobody = await previewWithPolicies(page, ns, { pods: 2, namespace: 'elsewhere' });
  assert.deepEqual(nobody.pods.map((p) => p.failure), Array(2).fill('policy "zones" refused the attachment: namespace-ranges: default gives this pod no range'));
  assert.match((await rows(page))[0][3], /^ADD fails: policy "zones" refused the attachment/);
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('policies: a .wasm picked from disk is transpiled in the page and runs', async () => {
  const page = await open();
  await pickExample(page, 'two-ipv4');
  await page.setInputFiles('#policy-file', { name: 'my-keep.wasm', mimeType: 'application/wasm', buffer: readFileSync(join(POLICY_WASM, 'keep-addresses.wasm')) });
  await page.waitForFunction(() => /Loaded my-keep\.wasm and added it/.test(document.querySelector('#policy-status').textContent), null, { timeout: 60000 });
  const config = JSON.parse(await page.inputValue('#config'));
  assert.deepEqual(config.ipam.policies, [{ name: 'my-keep', path: policyPath('my-keep.wasm'), settings: {} }]);
  assert.match(await page.textContent('#policy-list'), /my-keep\.wasm \(loaded from disk\)/);
  config.ipam.policies[0].settings = { deny: ['198.51.100.10'] };
  const { pods } = await previewWithPolicies(page, JSON.stringify(config), { pods: 2 });
  assert.deepEqual(pods.map((p) => p.addresses[1]), ['198.51.100.11/24', '198.51.100.12/24']);
  assert.deepEqual(pods[0].refused, [{ range: 1, address: '198.51.100.10', policy: 'my-keep', reason: 'deny-listed by settings' }]);
  // Not a component: the transpiler says so, nothing else changes.
  await page.setInputFiles('#policy-file', { name: 'junk.wasm', mimeType: 'application/wasm', buffer: Buffer.from('not wasm at all') });
  await page.waitForFunction(() => /^junk\.wasm cannot be transpiled: /.test(document.querySelector('#policy-status').textContent), null, { timeout: 60000 });
  assert.equal(JSON.parse(await page.inputValue('#config')).ipam.policies.length, 1);
  assert.deepEqual(page.problems, []);
  await page.close();
});

const hostile = (hook, action, extra = {}) => ({ name: 'hostile', path: policyPath('hostile-fixtures.wasm'), settings: { hook, do: action }, ...extra });
const oneRange = { range: '192.0.2.0/24' };

test('policies: a policy that loops is stopped at its deadline; the page stays responsive', async () => {
  const page = await open();
  const timeoutMs = 1000;
  const pods = 2;
  await page.fill('#pods', String(pods));
  await page.fill('#config', withPolicies(oneRange, [hostile('pick-address', 'loop', { timeout_ms: timeoutMs })]));
  const started = Date.now();
  await page.click('#run');
  await page.waitForSelector('#preview-section[data-policies="running"]');
  // While the policy spins in its worker, the page answers and reacts.
  const probes = [];
  for (let i = 0; i < 5; i++) {
    const t = Date.now();
    assert.equal(await page.evaluate(() => 6 * 7), 42);
    probes.push(Date.now() - t);
    await new Promise((r) => setTimeout(r, 100));
  }
  await page.click('#share');
  await page.waitForFunction(() => document.querySelector('#share-status').textContent !== '', null, { timeout: 2000 });
  assert.equal(await page.getAttribute('#preview-section', 'data-policies'), 'running', 'the loop is still being waited for');
  assert.ok(Math.max(...probes) < 500, `page answered in ${probes.join(', ')} ms`);
  await page.waitForSelector('#preview-section[data-policies="done"]', { timeout: pods * timeoutMs + 10000 });
  const elapsed = Date.now() - started;
  const { pods: result } = await page.evaluate(() => window.playground.policyPreview);
  assert.deepEqual(result.map((p) => p.failure), Array(pods).fill(`policy "hostile", pick-address: timed out after ${timeoutMs} ms`));
  // Each pod waited for one deadline, plus a new worker.
  assert.ok(elapsed >= pods * timeoutMs && elapsed < pods * timeoutMs + 6000, `took ${elapsed} ms`);
  // The next preview gets a fresh worker and runs normally.
  const after = await previewWithPolicies(page, withPolicies(oneRange, [hostile('pick-address', 'loop', { timeout_ms: 50, on_error: 'ignore' })]), { pods: 1 });
  assert.deepEqual(after.pods[0].addresses, ['192.0.2.1/24']);
  assert.match(after.pods[0].failure ?? '', /^$/);
  assert.match(await page.textContent('#pods-table .pbody .refused'), /timed out after 500 ms \(the playground's floor; timeout_ms is 50\); ignored \(on_error: ignore\)/);
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('policies: a trap, a memory bomb and deep recursion are reported as policy errors', async () => {
  const page = await open();
  // A generous deadline: these are about what is reported, not how fast (the loop test is).
  const failureOf = async (p) => (await previewWithPolicies(page, withPolicies(oneRange, [{ timeout_ms: 1000, ...p }]), { pods: 1 })).pods[0].failure;
  assert.match(await failureOf(hostile('pick-address', 'trap')), /^policy "hostile", pick-address: trapped: .*unreachable/);
  assert.equal(await failureOf(hostile('pick-address', 'memory-bomb')), 'policy "hostile", pick-address: went over its memory limit of 4 MiB');
  assert.equal(await failureOf(hostile('select-ranges', 'memory-bomb', { memory_mib: 16 })), 'policy "hostile", select-ranges: went over its memory limit of 16 MiB');
  assert.equal(await failureOf(hostile('select-ranges', 'recursion')), 'policy "hostile", select-ranges: overflowed its stack');
  assert.equal(await failureOf(hostile('validate-settings', 'huge-output', { memory_mib: 64 })), 'policy "hostile", validate-settings: gave a bad answer: a text of 16777216 bytes, more than 1024');
  assert.equal(await failureOf(hostile('pick-address', 'huge-output', { memory_mib: 64 })), 'policy "hostile", pick-address: gave a bad answer: 1000000 preferred addresses, more than 256');
  assert.equal(await failureOf(hostile('validate-settings', 'reject-settings')), 'policy "hostile", validate-settings: rejected its settings: hostile-fixtures: settings rejected on purpose');
  // monitor: it runs and is logged, the built-in choice decides.
  const monitored = await previewWithPolicies(page, withPolicies(oneRange, [hostile('pick-address', 'trap', { mode: 'monitor' })]), { pods: 1 });
  assert.deepEqual([monitored.pods[0].addresses, monitored.pods[0].failure], [['192.0.2.1/24'], null]);
  assert.deepEqual(page.problems, []);
  await page.close();
});

test('policies: a config naming a .wasm the page does not have says so', async () => {
  const page = await open();
  const { pods } = await previewWithPolicies(page, withPolicies(oneRange, [{ name: 'gone', path: '/opt/none.wasm' }]), { pods: 1 });
  assert.match(pods[0].failure, /^policy "gone": \/opt\/none\.wasm: no none\.wasm in the playground/);
  await page.close();
});

test('policies: the page shows what `thereabouts preview --output json` prints with the same policies', async (t) => {
  const cache = mkdtempSync(join(tmpdir(), 'thereabouts-policy-cache-'));
  const page = await open();
  try {
    for (const name of ['keep-addresses', 'sticky-ordinal', 'namespace-ranges']) {
      execFileSync(BIN, ['policy', 'compile', join(POLICY_WASM, `${name}.wasm`), '--cache', cache], { stdio: ['ignore', 'pipe', 'pipe'] });
    }
    const cases = [
      {
        id: 'keep + sticky, dual-stack', pods: 6, namespace: 'shop', prefix: 'web-', labels: [],
        ipam: { ipRanges: [{ range: '192.0.2.0/28', exclude: ['192.0.2.1/32'] }, { range: '2001:db8::/120' }] },
        policies: [
          { name: 'keep', file: 'keep-addresses.wasm', settings: { deny: ['192.0.2.3', '2001:db8::2'] } },
          { name: 'sticky', file: 'sticky-ordinal.wasm', settings: { base: 4, statefulsets: ['web'] } },
        ],
      },
      {
        id: 'namespace-ranges with a label', pods: 3, namespace: 'team-a', prefix: 'db-', labels: ['tier=db'],
        ipam: { ipRanges: [{ range: '192.0.2.0/24' }, { range: '198.51.100.0/24' }] },
        policies: [{ name: 'zones', file: 'namespace-ranges.wasm', settings: { labels: [{ key: 'tier', value: 'db', ranges: [1] }], default: [0] } }],
      },
      {
        // Failures: a range vetoed (sticky's only address refused by keep), an attachment refused.
        id: 'vetoes and refusals', pods: 3, namespace: 'ops', prefix: 'web-', labels: [],
        ipam: { ipRanges: [{ range: '192.0.2.0/28' }] },
        policies: [
          { name: 'keep', file: 'keep-addresses.wasm', settings: { deny: ['192.0.2.9'] } },
          { name: 'sticky', file: 'sticky-ordinal.wasm', settings: { addresses: { 'web-1': ['192.0.2.9'] } } },
          { name: 'zones', file: 'namespace-ranges.wasm', settings: { namespaces: { ops: [0] }, labels: [], default: [] } },
        ],
      },
    ];
    cases.push({ ...cases.at(-1), id: 'an attachment refused', namespace: 'elsewhere', pods: 2 });
    for (const c of cases) {
      await t.test(c.id, async () => {
        // The CLI reads the built files; the page matches `path` by file name.
        const cliConfig = withPolicies(c.ipam, c.policies.map(({ name, file, settings }) => ({ name, path: join(POLICY_WASM, file), settings })));
        const dir = mkdtempSync(join(tmpdir(), 'thereabouts-policy-parity-'));
        let cli;
        try {
          writeFileSync(join(dir, 'config.json'), cliConfig);
          const args = ['preview', '--config', join(dir, 'config.json'), '--pods', String(c.pods), '--output', 'json', '--namespace', c.namespace, '--pod-prefix', c.prefix, ...c.labels.flatMap((l) => ['--label', l])];
          cli = JSON.parse(execFileSync(BIN, args, { encoding: 'utf8', env: { ...process.env, THEREABOUTS_POLICY_CACHE: cache }, stdio: ['ignore', 'pipe', 'pipe'] }));
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
        const shown = await previewWithPolicies(page, cliConfig, { pods: c.pods, namespace: c.namespace, prefix: c.prefix, labels: c.labels.join(', ') });
        assert.equal(cli.pods.length, c.pods);
        for (let i = 0; i < c.pods; i++) {
          const { pod, name, addresses, refused, failure } = cli.pods[i];
          assert.deepEqual(shown.pods[i], { pod, name, addresses, refused, failure: failure ?? null }, `${c.id}: pod ${i + 1}`);
        }
      });
    }
  } finally {
    await page.close();
    rmSync(cache, { recursive: true, force: true });
  }
});

// ---------------------------------------------------------------- performance (printed, not asserted)

test('performance: 10 000 pods over a /16 + a /64 (printed, not asserted)', async () => {
  const page = await open();
  await page.evaluate(() => window.playground.measure('', 1)); // clear
  const runs = [];
  for (let i = 0; i < 9; i++) {
    // compute + render + forced layout, inside the page; then the time to the next frame.
    const r = await page.evaluate(async (text) => {
      const t0 = performance.now();
      const timing = window.playground.measure(text, 10000);
      await new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
      return { ...timing, painted: performance.now() - t0 };
    }, BIG);
    assert.equal(r.pods, 10000);
    runs.push(r);
  }
  const lastRow = (await rows(page)).at(-1);
  assert.deepEqual(lastRow.slice(0, 3), ['10000', '198.18.39.16/16', '2001:db8:ffff::2710/64']);
  const median = (k) => { const v = runs.map((r) => r[k]).sort((a, b) => a - b); return v[Math.floor(v.length / 2)]; };
  const line = `10000 pods (/16 + /64) in headless Chromium: median ${median('total').toFixed(1)} ms compute+render ` +
    `(engine ${median('compute').toFixed(1)} ms, DOM ${median('render').toFixed(1)} ms), ${median('painted').toFixed(1)} ms to the next frame; ` +
    `best ${Math.min(...runs.map((r) => r.total)).toFixed(1)} ms; runs: ${runs.map((r) => r.total.toFixed(0)).join(', ')} ms; ` +
    `load average ${loadavg()[0].toFixed(2)} on ${cpus().length} CPUs`;
  console.log(`PERF: ${line}`);
  mkdirSync(ARTIFACTS, { recursive: true });
  writeFileSync(join(ARTIFACTS, 'playground-perf.txt'), line + '\n');
  await page.close();
});
