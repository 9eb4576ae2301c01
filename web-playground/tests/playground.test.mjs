// Browser tests of the playground: headless Debian Chromium driven by playwright-core.
// Run by tests/playground.sh, which builds the engine, serves the page and sets
// PLAYGROUND_URL (and THEREABOUTS_BIN for the parity test).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, mkdirSync, copyFileSync, writeFileSync } from 'node:fs';
import { tmpdir, loadavg, cpus } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync, spawnSync } from 'node:child_process';
import { chromium } from 'playwright-core';
import { EXAMPLES, BIG } from '../lib/examples.js';
import { extractConfig } from '../lib/nad.js';

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
