// End-to-end test of server.js against a running PostgreSQL: run with
//     node --test test/payments.test.js
//
// Starts the service on a free port of 127.0.0.1, sends it real HTTP
// requests and checks the answers and the payments table.  The database
// comes from libpq's environment (PGHOST, PGPORT, PGDATABASE, PGUSER) and
// must hold examples/schema.sql; scripts/test.sh sets all of that up.  Every
// wait is bounded; the service is stopped whatever happens.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { Client } = require('pg');

const SERVER = path.join(__dirname, '..', 'server.js');
const IN_PROGRESS = 'IDEMPOTENCY_REQUEST_IN_PROGRESS';
const MISMATCH = 'IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST';

let service;
let port;
let serviceLog = '';
let db;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms); }),
  ]).finally(() => clearTimeout(timer));
}

function startService() {
  // FRAMEWORK (http, express or fastify) picks the service's framework.
  const framework = process.env.FRAMEWORK ? ['--framework', process.env.FRAMEWORK] : [];
  service = spawn(process.execPath, [SERVER, '--port', '0', '--quiet', ...framework], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  service.stderr.on('data', (d) => { serviceLog += d; });
  return withTimeout(new Promise((resolve, reject) => {
    let out = '';
    service.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    service.on('exit', (code) => reject(new Error(`service exited (${code}): ${serviceLog}`)));
  }), 30000, 'service start');
}

async function waitForPort(p, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const ok = await new Promise((resolve) => {
      const s = net.connect(p, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error('service does not accept connections');
    await sleep(50);
  }
}

function request(method, urlPath, { body, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request({
      host: '127.0.0.1', port, method, path: urlPath, agent: false, timeout: 30000,
      headers: { 'Content-Type': 'application/json', ...headers },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks).toString('utf8');
        let json = null;
        try { json = raw ? JSON.parse(raw) : null; } catch { /* not JSON */ }
        resolve({
          status: res.statusCode,
          headers: res.headers,
          raw,
          json,
          errorCode: json && json.error_code,
          replayed: res.headers['idempotent-replayed'] === 'true',
        });
      });
    });
    req.on('timeout', () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}

function post(key, body, extra = {}) {
  const headers = { ...extra };
  if (key !== undefined) headers['Idempotency-Key'] = key;
  return request('POST', '/payments', { body, headers });
}

// A well-behaved client: on 409 in progress, wait Retry-After (plus a little
// jitter) and try again; bounded in tries and time.
async function postUntilDone(key, body, extra = {}, { maxTries = 30, budgetMs = 60000 } = {}) {
  const deadline = Date.now() + budgetMs;
  let conflicts = 0;
  for (let i = 0; i < maxTries; i++) {
    const r = await post(key, body, extra);
    if (r.status !== 409 || r.errorCode !== IN_PROGRESS) return { r, conflicts };
    conflicts++;
    const wait = Math.min(Number(r.headers['retry-after']) || 1, 5) * 1000 + Math.random() * 200;
    if (Date.now() + wait > deadline) break;
    await sleep(wait);
  }
  return { r: null, conflicts };
}

async function paymentsFor(key) {
  const { rows } = await db.query('SELECT id FROM payments WHERE idempotency_key = $1', [key]);
  return rows.map((row) => row.id);
}

// True once a transaction that wrote idem_records has not committed yet
// (docs/api.md, "Locks": it holds ROW EXCLUSIVE on the table until it ends):
// the first request has claimed and is inside its handler.  Any claim in the
// database counts: this test must be the only client of its database.
async function waitForClaimLock(ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const { rows: [{ n }] } = await db.query(`
      SELECT count(*)::int AS n FROM pg_locks
       WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND granted
         AND pid <> pg_backend_pid()
         AND relation = (SELECT oid FROM pg_class WHERE relname = 'idem_records' AND relkind = 'r')
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`);
    if (n > 0) return true;
    await sleep(50);
  }
  return false;
}

before(async () => {
  db = new Client();
  await withTimeout(db.connect(), 30000, 'database connection');
  port = await startService();
  await waitForPort(port, 30000);
});

after(async () => {
  if (service && service.exitCode === null) {
    const exited = new Promise((resolve) => service.once('exit', resolve));
    service.kill('SIGTERM');
    await withTimeout(exited, 10000, 'service stop').catch(() => service.kill('SIGKILL'));
  }
  if (db) await db.end();
});

test('a missing Idempotency-Key gets 400 IDEMPOTENCY_KEY_MISSING', async () => {
  const r = await post(undefined, { amount: 100, currency: 'EUR' });
  assert.equal(r.status, 400);
  assert.equal(r.errorCode, 'IDEMPOTENCY_KEY_MISSING');
});

test('an invalid key gets 400 IDEMPOTENCY_KEY_INVALID (SQLSTATE 22023 from idem_claim)', async () => {
  for (const key of ['', 'k'.repeat(300), 'caf\u00e9-key']) {
    const r = await post(key, { amount: 100, currency: 'EUR' });
    assert.equal(r.status, 400, `key of ${key.length} bytes: ${r.raw}`);
    assert.equal(r.errorCode, 'IDEMPOTENCY_KEY_INVALID');
    assert.deepEqual(await paymentsFor(key), []);
  }
});

let concurrent; // { key, body, first }

test('20 concurrent identical requests create exactly one payment and all get the same answer', async (t) => {
  const key = randomUUID();
  const body = { amount: 1250, currency: 'EUR', reference: 'order-17' };
  // The winner's handler sleeps 1 s inside its transaction, so the others
  // meet a claim that is still running and retry after Retry-After.
  const results = await withTimeout(Promise.all(Array.from({ length: 20 },
    () => postUntilDone(key, body, { 'Simulate-Delay-Ms': '1000' }))), 90000, '20 clients');
  const finals = results.map((x) => x.r);
  assert.ok(finals.every((r) => r !== null), 'every client finishes within its retries');
  assert.deepEqual(finals.map((r) => r.status), Array(20).fill(201));
  assert.equal(new Set(finals.map((r) => r.raw)).size, 1, 'one body');
  assert.equal(new Set(finals.map((r) => r.headers.location)).size, 1, 'one Location');
  assert.equal(finals.filter((r) => !r.replayed).length, 1, 'one original answer');
  assert.equal(finals.filter((r) => r.replayed).length, 19, '19 replays');
  const ids = await paymentsFor(key);
  assert.equal(ids.length, 1, 'exactly one payment row');
  assert.equal(finals[0].json.id, ids[0]);
  const conflicts = results.reduce((n, x) => n + x.conflicts, 0);
  t.diagnostic(`${conflicts} answers 409 in progress were met and retried on the way`);
  concurrent = { key, body, first: finals[0] };
});

test('a retry after success replays the stored answer with Idempotent-Replayed: true', async () => {
  assert.ok(concurrent, 'needs the previous test');
  const { key, body, first } = concurrent;
  const r = await post(key, body);
  assert.equal(r.status, 201);
  assert.equal(r.replayed, true);
  assert.equal(r.raw, first.raw);
  assert.equal(r.headers.location, first.headers.location);
  // the same request with its fields in another order: same fingerprint
  const reordered = Object.fromEntries(Object.entries(body).reverse());
  const r2 = await post(key, reordered);
  assert.equal(r2.status, 201);
  assert.equal(r2.replayed, true);
  const g = await request('GET', first.headers.location);
  assert.equal(g.status, 200);
  assert.deepEqual(g.json, first.json);
});

test('the same key with another body gets 422 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST', async () => {
  assert.ok(concurrent, 'needs the previous test');
  const { key, body } = concurrent;
  const r = await post(key, { ...body, amount: 9999 });
  assert.equal(r.status, 422);
  assert.equal(r.errorCode, MISMATCH);
  assert.equal(r.replayed, false);
  assert.equal((await paymentsFor(key)).length, 1);
});

test('a request while the first is still running gets 409 with Retry-After', async () => {
  const key = randomUUID();
  const body = { amount: 700, currency: 'USD' };
  const slow = post(key, body, { 'Simulate-Delay-Ms': '4000' });
  slow.catch(() => {}); // awaited below
  assert.ok(await waitForClaimLock(20000), 'the slow first request claims its key');
  const r = await post(key, body);
  assert.equal(r.status, 409);
  assert.equal(r.errorCode, IN_PROGRESS);
  assert.match(r.headers['retry-after'] || '', /^[1-9]\d*$/);
  const first = await withTimeout(slow, 60000, 'the slow request');
  assert.equal(first.status, 201);
  assert.equal(first.replayed, false);
  const { r: again } = await postUntilDone(key, body);
  assert.ok(again);
  assert.equal(again.status, 201);
  assert.equal(again.replayed, true);
  assert.equal(again.raw, first.raw);
  assert.equal((await paymentsFor(key)).length, 1);
});

test('a handler that fails after its write leaves nothing; its retry proceeds', async () => {
  const key = randomUUID();
  const body = { amount: 300, currency: 'EUR' };
  const r = await post(key, body, { 'Simulate-Failure': 'true' });
  assert.equal(r.status, 500);
  assert.deepEqual(await paymentsFor(key), []);
  const r2 = await post(key, body);
  assert.equal(r2.status, 201);
  assert.equal(r2.replayed, false);
  assert.equal((await paymentsFor(key)).length, 1);
});

test('a validation failure is stored with idem_fail and replayed', async () => {
  const key = randomUUID();
  const body = { amount: 0, currency: 'EUR' };
  const r = await post(key, body);
  assert.equal(r.status, 400);
  assert.equal(r.errorCode, 'VALIDATION_FAILED');
  assert.equal(r.replayed, false);
  const r2 = await post(key, body);
  assert.equal(r2.status, 400);
  assert.equal(r2.replayed, true);
  assert.equal(r2.raw, r.raw);
});

process.on('exit', (code) => {
  if (code !== 0 && serviceLog) console.error(`----- service log\n${serviceLog}`);
});
