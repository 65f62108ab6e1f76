// clients/conformance.json, the answers every library gives the same: each
// decision row's HTTP answer, each SQLSTATE's kind, each header pair a
// handler may return.  (Its hostile rows run end to end against every
// adapter: examples/python/test_payments_service.py.)  No database needed.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const { Idempotency, answer, toResponse } = require('..');
const { MAX_NESTING, tooDeep } = require('../lib/adapter');

const fixture = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance.json'), 'utf8'));
const hex = (h) => (h === null || h === undefined ? null : Buffer.from(h, 'hex'));

for (const row of fixture.decisions.rows) {
  test(`decision: ${row.name}`, () => {
    const r = answer({ ...row.row, body: row.row.body_text ?? null, raw_body: hex(row.row.raw_body_hex) });
    assert.equal(r.status, row.status);
    assert.deepEqual(r.headers, row.headers);
    const body = row.body_hex !== undefined ? hex(row.body_hex) : Buffer.from(row.body_text);
    assert.ok(r.body.equals(body), `${r.body} != ${body}`);
  });
}

const KINDS = { IDEMPOTENCY_KEY_INVALID: 'key_invalid', INVALID_REQUEST: 'request_invalid' };
for (const [code, kind] of Object.entries(fixture.sqlstates.codes)) {
  test(`SQLSTATE ${code} is ${kind}`, () => {
    const err = Object.assign(new Error('refused'), { code });
    let got;
    try {
      const r = Idempotency.claimError(err);
      got = r.status === 400 ? KINDS[JSON.parse(r.body).error_code] : `status ${r.status}`;
    } catch (e) {
      assert.equal(e, err);
      got = 'error';
    }
    assert.equal(got, kind);
  });
}

for (const { name, value, valid } of fixture.header_values.rows) {
  test(`header ${JSON.stringify([name, value])} is ${valid ? 'stored' : 'refused'}`, () => {
    const store = () => toResponse({ status: 200, headers: [[name, value]] });
    if (valid) assert.deepEqual(store().headers, [[name, value]]);
    else assert.throws(store);
  });
}

test(`the nesting limit is the fixture's (${fixture.nesting_limit})`, () => {
  assert.equal(MAX_NESTING, fixture.nesting_limit);
  const at = (n) => '['.repeat(n) + '"[{\\"["' + ']'.repeat(n);
  assert.equal(tooDeep(at(fixture.nesting_limit)), false);
  assert.equal(tooDeep(at(fixture.nesting_limit + 1)), true);
});
