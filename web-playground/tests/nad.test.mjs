// The NetworkAttachmentDefinition extractor (no browser needed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { extractConfig, ExtractError } from '../lib/nad.js';

const CONFIG = '{"cniVersion":"1.0.0","name":"n","ipam":{"type":"whereabouts","range":"192.0.2.0/24"}}';
const head = 'apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: n1\n  annotations:\n    config: "not this"\n';

test('JSON passes through untouched', () => {
  assert.deepEqual(extractConfig(`  ${CONFIG}\n`), { kind: 'json', config: CONFIG });
  assert.equal(extractConfig('').config, '');
});

test('block scalars: |, |-, |+, >, with comments and an indentation indicator', () => {
  const pretty = JSON.stringify(JSON.parse(CONFIG), null, 2);
  const indented = pretty.split('\n').map((l) => '    ' + l).join('\n');
  for (const style of ['|', '|-', '|+', '>', '|  # comment']) {
    const r = extractConfig(`${head}spec:\n  config: ${style}\n${indented}\n\n# trailing comment at column 0\n`);
    assert.equal(r.kind, 'nad');
    assert.equal(r.name, 'n1');
    assert.deepEqual(JSON.parse(r.config), JSON.parse(CONFIG), style);
  }
  const r = extractConfig(`${head}spec:\n  config: |2\n     ${CONFIG}\n`);
  assert.equal(r.config, ' ' + CONFIG);
});

test('quoted strings: single, double (with escapes), over several lines, CRLF', () => {
  assert.equal(extractConfig(`${head}spec:\n  config: '${CONFIG}'\n`).config, CONFIG);
  assert.equal(extractConfig(`${head}spec:\n  config: "${CONFIG.replace(/"/g, '\\"')}"  # c\n`).config, CONFIG);
  assert.equal(extractConfig(`spec:\n  config: '{"a":\n    1, "b": ''x''}'\n`).config, `{"a": 1, "b": 'x'}`);
  assert.equal(extractConfig(`spec:\n  config: "{\\"a\\": \\u0031,\\\n    \\"b\\": 2}"\n`).config, '{"a": 1,"b": 2}');
  assert.equal(extractConfig(`${head}spec:\r\n  config: '${CONFIG}'\r\n`.replace(/\n/g, '\r\n').replace(/\r\r/g, '\r')).config, CONFIG);
});

test('finds spec.config in the right document and at the right level', () => {
  const yaml = `kind: ConfigMap\ndata:\n  config: nope\n---\n${head}spec:\n  other:\n    config: nested\n  config: '${CONFIG}'\n`;
  assert.equal(extractConfig(yaml).config, CONFIG);
});

test('clear errors for the shapes it cannot use', () => {
  const err = (text, re) => assert.throws(() => extractConfig(text), (e) => e instanceof ExtractError && e.field === 'spec.config' && re.test(e.message));
  err(`${head}spec:\n  foo: 1\n`, /no spec\.config/);
  err('hello: world\n', /not JSON, and not a NetworkAttachmentDefinition/);
  err(`spec:\n  config: "{unterminated\n`, /never closed/);
  err(`spec:\n\tconfig: x\n`, /tabs/);
  err(`spec:\n  config:\n`, /has no value/);
  err(`spec:\n  config: |\n\n`, /empty/);
});
