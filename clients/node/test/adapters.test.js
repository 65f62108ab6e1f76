// Tests of the node:http, Express and Fastify adapters: each serves a route
// on 127.0.0.1 against a running PostgreSQL (see core.test.js), and real
// requests check what the client gets.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const http = require('node:http');
const { Pool } = require('pg');
const express = require('express');
const fastify = require('fastify');
const { Idempotency, HttpError } = require('..');
const httpAdapter = require('../http');
const expressAdapter = require('../express');
const fastifyAdapter = require('../fastify');

const pool = new Pool({ max: 4 });
const idem = new Idempotency(pool);
const run = randomUUID().slice(0, 8);
after(() => pool.end());

// The route's handler: 201 with repeated headers, unless the body asks for
// an HttpError or a crash.  It counts its runs per key.
const runs = new Map();
async function handler(client, { key, body, attempt }) {
  runs.set(key, (runs.get(key) || 0) + 1);
  if (body && body.httpError) throw new HttpError(503, 'NOT_NOW', 'try later');
  if (body && body.crash) throw new Error('crash');
  const { rows: [{ n }] } = await client.query('SELECT $1::int + 1 AS n', [body.n]);
  return { status: 201, headers: [['X-Tag', 'a'], ['X-Tag', 'b'], ['Location', `/things/${n}`]], body: { n, attempt } };
}

function externalHandler({ body, token }) {
  return { status: 202, body: { accepted: body.n, hasToken: typeof token === 'string' } };
}

const servers = {
  http: async (operation) => {
    const post = httpAdapter.idempotent(idem, { operation }, handler);
    const ext = httpAdapter.idempotent(idem, { operation: `${operation}.ext`, external: true }, externalHandler);
    return http.createServer((req, res) => (req.url === '/ext' ? ext : post)(req, res));
  },
  express: async (operation) => {
    const app = express();
    app.post('/things', expressAdapter.idempotent(idem, { operation }, handler));
    app.post('/ext', expressAdapter.idempotent(idem, { operation: `${operation}.ext`, external: true }, externalHandler));
    return http.createServer(app);
  },
  fastify: async (operation) => {
    const app = fastify();
    app.register(async (scope) => {
      fastifyAdapter.rawBodies(scope);
      scope.post('/things', fastifyAdapter.idempotent(idem, { operation }, handler));
      scope.post('/ext', fastifyAdapter.idempotent(idem, { operation: `${operation}.ext`, external: true }, externalHandler));
    });
    await app.ready();
    return app.server;
  },
};

function send(port, path, key, body) {
  return new Promise((resolve, reject) => {
    const headers = { 'Content-Type': 'application/json' };
    if (key !== undefined) headers['Idempotency-Key'] = key;
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const raw = Buffer.concat(chunks);
        const pairs = [];
        for (let i = 0; i < res.rawHeaders.length; i += 2) pairs.push([res.rawHeaders[i], res.rawHeaders[i + 1]]);
        let json = null;
        try { json = JSON.parse(raw); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, pairs, raw, json });
      });
    });
    req.on('error', reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

for (const [name, make] of Object.entries(servers)) {
  test(`${name}: new key, replay, mismatch, bad key, HttpError and crash`, async (t) => {
    const server = await make(`test.node.${name}.${run}`);
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    t.after(() => new Promise((resolve) => server.close(resolve)));
    const { port } = server.address();
    const key = randomUUID();

    const first = await send(port, '/things', key, { n: 41 });
    assert.equal(first.status, 201);
    assert.deepEqual(first.json, { n: 42, attempt: 1 });
    assert.equal(first.headers['x-tag'], 'a, b');
    assert.equal(first.headers['idempotent-replayed'], undefined);

    const again = await send(port, '/things', key, { n: 41 });
    assert.equal(again.status, 201);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.ok(again.raw.equals(first.raw));
    const stored = (r) => r.pairs.filter(([n]) => /^(x-tag|location|content-type)$/i.test(n));
    assert.deepEqual(stored(again), stored(first));
    assert.equal(runs.get(key), 1);

    const other = await send(port, '/things', key, { n: 7 });
    assert.equal(other.status, 422);
    assert.equal(other.json.error_code, 'IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST');

    const missing = await send(port, '/things', undefined, { n: 1 });
    assert.equal(missing.status, 400);
    assert.equal(missing.json.error_code, 'IDEMPOTENCY_KEY_MISSING');
    const invalid = await send(port, '/things', 'k'.repeat(300), { n: 1 });
    assert.equal(invalid.status, 400);
    assert.equal(invalid.json.error_code, 'IDEMPOTENCY_KEY_INVALID');

    // an HttpError is answered and stores nothing: the retry runs again
    const busyKey = randomUUID();
    const busy = await send(port, '/things', busyKey, { n: 1, httpError: true });
    assert.equal(busy.status, 503);
    assert.equal(busy.json.error_code, 'NOT_NOW');
    await send(port, '/things', busyKey, { n: 1, httpError: true });
    assert.equal(runs.get(busyKey), 2);

    const crashKey = randomUUID();
    const crash = await send(port, '/things', crashKey, { n: 1, crash: true });
    assert.equal(crash.status, 500);
    await send(port, '/things', crashKey, { n: 1, crash: true });
    assert.equal(runs.get(crashKey), 2);

    const extKey = randomUUID();
    const ext = await send(port, '/ext', extKey, { n: 5 });
    assert.equal(ext.status, 202);
    assert.deepEqual(ext.json, { accepted: 5, hasToken: true });
    const extAgain = await send(port, '/ext', extKey, { n: 5 });
    assert.equal(extAgain.status, 202);
    assert.equal(extAgain.headers['idempotent-replayed'], 'true');
  });
}

// A record whose header node:http cannot send (a character above U+00FF,
// which the extension accepts), stored by another client of the same
// records: its replay is a 500, not an exception that ends the process.
for (const [name, make] of Object.entries(servers)) {
  test(`${name}: a stored header that cannot be sent answers 500`, async (t) => {
    const operation = `test.node.${name}.unsendable.${run}`;
    const server = await make(operation);
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    t.after(() => new Promise((resolve) => server.close(resolve)));
    const key = randomUUID();
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { rows: [{ token }] } = await client.query(
        "SELECT token FROM idem_claim($1, $2, '{\"n\":1}'::jsonb)", [operation, key]);
      await client.query(
        "SELECT idem_complete($1, 201, headers => '[[\"X-Note\", \"10 \u20ac\"]]'::jsonb, raw_body => '\\x7b7d'::bytea)", [token]);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const replay = await send(server.address().port, '/things', key, { n: 1 });
    assert.equal(replay.status, 500);
    assert.equal(runs.get(key), undefined);
  });
}

// What the client sent, as it sent it, in every adapter: the parsers of
// Express and Fastify decode bodies leniently (U+FFFD for bytes that are
// not UTF-8), turn 1e1000000 into Infinity (null once encoded again) and an
// empty body into {}.
function sendBytes(port, path, key, bytes) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port, method: 'POST', path, agent: false,
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key, 'Content-Length': bytes.length },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        let json = null;
        try { json = JSON.parse(Buffer.concat(chunks)); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, json });
      });
    });
    req.on('error', reject);
    req.end(bytes);
  });
}

const rawServers = {
  ...servers,
  // express.json() before the adapter, keeping the bytes it parsed
  'express with express.json({ verify })': async (operation) => {
    const app = express();
    app.use(express.json({ verify: (req, res, buf) => { req.rawBody = buf; } }));
    app.post('/things', expressAdapter.idempotent(idem, { operation }, handler));
    return http.createServer(app);
  },
};

for (const [name, make] of Object.entries(rawServers)) {
  test(`${name}: the request is the bytes sent: not UTF-8 is 400 INVALID_JSON, 1e1000000 400 INVALID_REQUEST, nothing stored`, async (t) => {
    const server = await make(`test.node.${name}.raw.${run}`);
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    t.after(() => new Promise((resolve) => server.close(resolve)));
    const { port } = server.address();
    const key = randomUUID();
    for (const bad of [0xff, 0xfe]) {
      const r = await sendBytes(port, '/things', key,
        Buffer.concat([Buffer.from('{"n": 1, "note": "'), Buffer.from([bad]), Buffer.from('"}')]));
      assert.equal(r.status, 400);
      assert.equal(r.json.error_code, 'INVALID_JSON');
    }
    const huge = await sendBytes(port, '/things', key, Buffer.from('{"n": 1e1000000}'));
    assert.equal(huge.status, 400);
    assert.equal(huge.json.error_code, 'INVALID_REQUEST');
    assert.equal(runs.get(key), undefined);
    const good = await sendBytes(port, '/things', key, Buffer.from('{"n": 1}'));
    assert.equal(good.status, 201);
    assert.equal(runs.get(key), 1);
    // an empty body is no request (null), not {}
    const empty = randomUUID();
    const e = await sendBytes(port, '/things', empty, Buffer.alloc(0));
    assert.equal(e.status, 500); // the handler reads body.n of null
    assert.equal(runs.get(empty), 1);
  });
}

test('http: a body that is not UTF-8 is 400 INVALID_JSON, not read as U+FFFD (two such bodies were one request)', async (t) => {
  const server = await servers.http(`test.node.http.utf8.${run}`);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => server.close(resolve)));
  const key = randomUUID();
  const sendRaw = (bytes) => new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: server.address().port, method: 'POST', path: '/things', agent: false,
      headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, json: JSON.parse(Buffer.concat(chunks)) }));
    });
    req.on('error', reject);
    req.end(bytes);
  });
  for (const bad of [0xff, 0xfe]) {
    const r = await sendRaw(Buffer.concat([Buffer.from('{"n": 1, "note": "'), Buffer.from([bad]), Buffer.from('"}')]));
    assert.equal(r.status, 400);
    assert.equal(r.json.error_code, 'INVALID_JSON');
  }
  assert.equal(runs.get(key), undefined);
});
