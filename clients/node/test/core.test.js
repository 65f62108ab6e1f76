// Tests of the core (index.js) against a running PostgreSQL with the
// extension and examples/schema.sql: node --test test/
//
// The connection comes from libpq's environment (PGHOST, PGPORT, PGDATABASE,
// PGUSER, the role examples/schema.sql grants the API to); IDEM_ADMIN_DSN, a
// superuser connection to the same database, enables the checks that read
// idem_records.  Every operation name is this run's own.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const { Pool, Client } = require('pg');
const { Idempotency, HttpError, RetryableError, answer, literal } = require('..');

const pool = new Pool({ max: 4 });
const run = randomUUID().slice(0, 8);
const op = (name) => `test.node.${name}.${run}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const idem = new Idempotency(pool);

after(() => pool.end());

async function paymentsFor(key) {
  const { rows } = await pool.query('SELECT id FROM payments WHERE idempotency_key = $1', [key]);
  return rows.length;
}

// IDEM_ADMIN_DSN, libpq's key=value form (without quoting), as pg's config.
function adminConfig() {
  const names = { host: 'host', port: 'port', dbname: 'database', user: 'user', password: 'password' };
  const config = {};
  for (const pair of process.env.IDEM_ADMIN_DSN.trim().split(/\s+/)) {
    const [k, v] = pair.split('=');
    if (names[k]) config[names[k]] = v;
  }
  return config;
}

// A handler that writes a payment on the claim's client.
const pay = (amount) => async (client, ctx) => {
  const { rows: [p] } = await client.query(
    "INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, $2, 'EUR') RETURNING id",
    [ctx.key, amount]);
  return {
    status: 201,
    headers: [['Location', `/payments/${p.id}`], ['X-Tag', 'a'], ['X-Tag', 'b']],
    body: { id: p.id, amount },
    resourceId: p.id,
  };
};

// A pool whose clients count the queries sent on them: the same wrapper for
// the same connection, as pg.Pool hands out the same client, unless fresh
// (a new wrapper at each connect, as a library sees a pooler's server
// connections that it cannot tell apart).  from: the pool to draw on.
function countingPool({ from = pool, fresh = false } = {}) {
  const counted = { queries: [], releases: 0, onRelease: () => {} };
  // resolves at the next release of a client
  counted.released = () => new Promise((resolve) => { counted.onRelease = resolve; });
  const wrappers = new Map();
  counted.connect = async () => {
    const client = await from.connect();
    let wrapper = fresh ? undefined : wrappers.get(client);
    if (wrapper === undefined) {
      wrapper = {
        query: (...args) => { counted.queries.push(args[0]); return client.query(...args); },
        release: (err) => {
          client.release(err);
          counted.releases++;
          counted.onRelease();
        },
        on: (...args) => client.on(...args),
        removeListener: (...args) => client.removeListener(...args),
      };
      wrappers.set(client, wrapper);
    }
    return wrapper;
  };
  // The instance's one question at its first call (is idem_claim_text
  // there?) is kept apart: the counts are those of the calls.
  counted.learned = [];
  counted.query = (...args) => {
    (String(args[0]).includes('to_regprocedure') ? counted.learned : counted.queries).push(args[0]);
    return from.query(...args);
  };
  return counted;
}

// A pool of one client object that is moved to the next of two server
// connections between transactions, as pgbouncer in transaction mode does:
// after a query outside a transaction block and at release.
async function poolerPool() {
  const servers = [new Client(), new Client()];
  await Promise.all(servers.map((c) => c.connect()));
  const counted = { queries: [], servers };
  let current = 0;
  let inBlock = false;
  const client = {
    query: async (text, ...rest) => {
      // the instance's one question at its first call is not counted
      if (!String(text).includes('to_regprocedure')) counted.queries.push(text);
      try {
        return await servers[current].query(text, ...rest);
      } finally {
        if (/^BEGIN;/.test(text)) inBlock = true;
        if (/(^|;)(COMMIT|ROLLBACK)$/.test(text)) inBlock = false;
        if (!inBlock) current = 1 - current;
      }
    },
    release: () => { inBlock = false; current = 1 - current; },
  };
  counted.connect = async () => client;
  counted.query = client.query;
  counted.end = () => Promise.all(servers.map((c) => c.end()));
  return counted;
}

// Claim outcomes for a key until one is not in_progress, for 20 s at most.
async function settled(call) {
  const deadline = Date.now() + 20000;
  for (;;) {
    const r = await idem.run(call, () => { throw new Error('must not run'); });
    if (r.outcome !== 'in_progress' || Date.now() > deadline) return r;
    await sleep(20);
  }
}

test('literal() quotes as PQescapeLiteral: any text reads back unchanged, with either standard_conforming_strings', async () => {
  const nasty = ["it's", "'); DROP TABLE payments; --", 'back\\slash', "\\'", "\\\\''", 'E\'x\'', 'ünïcødé ✓', '$$', '"q"', ''];
  const client = new Client();
  await client.connect();
  try {
    for (const scs of ['on', 'off']) {
      await client.query(`SET standard_conforming_strings = ${scs}`);
      for (const s of nasty) {
        const { rows: [{ v }] } = await client.query(`SELECT ${literal(s)}::text AS v`);
        assert.equal(v, s, `standard_conforming_strings = ${scs}`);
      }
    }
  } finally {
    await client.end();
  }
  assert.throws(() => literal('a\0b'), RangeError);
});

test('a new key runs the handler inside the claim transaction and answers its response', async () => {
  const key = randomUUID();
  const r = await idem.run({ operation: op('new'), key, request: { amount: 10 } }, pay(10));
  assert.equal(r.outcome, 'proceed');
  assert.equal(r.replayed, false);
  assert.equal(r.status, 201);
  assert.deepEqual(r.headers.map(([n]) => n), ['Content-Type', 'Location', 'X-Tag', 'X-Tag']);
  assert.equal(JSON.parse(r.body).amount, 10);
  assert.equal(await paymentsFor(key), 1);
});

test('a retry replays the stored status, header pairs and body bytes, with Idempotent-Replayed', async () => {
  const key = randomUUID();
  const call = { operation: op('replay'), key, request: { amount: 11, currency: 'EUR' } };
  const first = await idem.run(call, pay(11));
  const again = await idem.run({ ...call, request: { currency: 'EUR', amount: 11 } },
    () => { throw new Error('the handler must not run for a replay'); });
  assert.equal(again.outcome, 'replay');
  assert.equal(again.replayed, true);
  assert.equal(again.status, 201);
  assert.deepEqual(again.headers, [...first.headers, ['Idempotent-Replayed', 'true']]);
  assert.ok(again.body.equals(first.body));
  assert.equal(await paymentsFor(key), 1);
});

test('a handler that throws rolls everything back and the retry proceeds', async () => {
  const key = randomUUID();
  const call = { operation: op('throw'), key, request: { amount: 12 } };
  await assert.rejects(idem.run(call, async (client, ctx) => {
    await pay(12)(client, ctx);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await paymentsFor(key), 0);
  const r = await idem.run(call, pay(12));
  assert.equal(r.outcome, 'proceed');
  assert.equal(await paymentsFor(key), 1);
  // an HttpError is thrown the same way, for the adapters to answer
  await assert.rejects(idem.run({ ...call, key: randomUUID() }, () => {
    throw new HttpError(503, 'BUSY', 'later');
  }), HttpError);
});

test('failed: true is stored with idem_fail and replayed', async () => {
  const call = { operation: op('fail'), key: randomUUID(), request: { amount: -1 } };
  const r = await idem.run(call, () => ({ status: 400, body: { error_code: 'VALIDATION_FAILED' }, failed: true }));
  assert.equal(r.status, 400);
  const again = await idem.run(call, () => { throw new Error('must not run'); });
  assert.equal(again.status, 400);
  assert.equal(again.replayed, true);
  assert.ok(again.body.equals(r.body));
});

test('the same key for another request: 422 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST', async () => {
  const call = { operation: op('mismatch'), key: randomUUID(), request: { amount: 13 } };
  await idem.run(call, pay(13));
  const r = await idem.run({ ...call, request: { amount: 14 } }, () => { throw new Error('must not run'); });
  assert.equal(r.status, 422);
  assert.equal(r.outcome, 'mismatch');
  assert.equal(JSON.parse(r.body).error_code, 'IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST');
});

test('a key held by a running attempt: 409 IDEMPOTENCY_REQUEST_IN_PROGRESS with Retry-After', async () => {
  const call = { operation: op('busy'), key: randomUUID(), request: { amount: 15 } };
  let release;
  const held = new Promise((resolve) => { release = resolve; });
  let entered;
  const inside = new Promise((resolve) => { entered = resolve; });
  const first = idem.run(call, async (client, ctx) => {
    entered();
    await held;
    return pay(15)(client, ctx);
  });
  await inside;
  const r = await idem.run(call, () => { throw new Error('must not run'); });
  release();
  assert.equal(r.status, 409);
  assert.equal(JSON.parse(r.body).error_code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
  assert.match(Object.fromEntries(r.headers)['Retry-After'], /^[1-9]\d*$/);
  assert.equal((await first).status, 201);
});

test('a missing key is 400 IDEMPOTENCY_KEY_MISSING; an invalid one 400 IDEMPOTENCY_KEY_INVALID, nothing run', async () => {
  const never = () => { throw new Error('must not run'); };
  for (const key of [undefined, null]) {
    const r = await idem.run({ operation: op('keys'), key, request: {} }, never);
    assert.equal(r.status, 400);
    assert.equal(JSON.parse(r.body).error_code, 'IDEMPOTENCY_KEY_MISSING');
  }
  for (const key of ['', 'k'.repeat(300), 'caf\u00e9', 'a\0b']) {
    const r = await idem.run({ operation: op('keys'), key, request: {} }, never);
    assert.equal(r.status, 400, JSON.stringify(key));
    assert.equal(JSON.parse(r.body).error_code, 'IDEMPOTENCY_KEY_INVALID');
  }
});

test('keys, requests and headers with quotes and backslashes are sent as written', async () => {
  const key = `x'); SELECT 1; --\\'\\`;
  const request = { note: "it's \\' \"q\" $$" };
  const call = { operation: op("quo'te"), key, request, tenant: "t\\'" };
  const first = await idem.run(call, () => ({ status: 200, headers: [['X-Q', "a'b\\c"]], body: "'\\" }));
  assert.equal(first.status, 200);
  const again = await idem.run(call, () => { throw new Error('must not run'); });
  assert.equal(again.outcome, 'replay');
  assert.deepEqual(again.headers[0], ['X-Q', "a'b\\c"]);
  assert.equal(again.body.toString(), "'\\");
  const other = await idem.run({ ...call, request: { note: 'x' } }, () => { throw new Error('must not run'); });
  assert.equal(other.outcome, 'mismatch');
});

test('a request that jsonb refuses is 400 INVALID_REQUEST', async () => {
  const r = await idem.run({ operation: op('json'), key: randomUUID(), request: { s: '\u0000' } },
    () => { throw new Error('must not run'); });
  assert.equal(r.status, 400);
  assert.equal(JSON.parse(r.body).error_code, 'INVALID_REQUEST');
});

test('round trips: a new key is two queries besides the handler\'s, a replay one before the answer', async () => {
  const one = new Pool({ max: 1 });
  try {
    const counted = countingPool({ from: one });
    const i = new Idempotency(counted);
    const call = { operation: op('trips'), key: randomUUID(), request: { amount: 16 } };
    // the connection's first call prepares the statements, once
    await i.run(call, pay(16));
    assert.equal(counted.queries.length, 4, counted.queries.join('\n'));
    assert.match(counted.queries[0], /^PREPARE (idem_\w+)_c\(.*;PREPARE \1_k\(.*;PREPARE \1_f\(/);
    assert.match(counted.queries[1], /^BEGIN;EXECUTE idem_\w+_c\('test\.node\.trips/);
    assert.match(counted.queries[3], /^EXECUTE idem_\w+_k\('.*', 201, '\[.*\]', E'\\\\x[0-9a-f]+', 'pay_\w+'\);COMMIT$/);
    counted.queries.length = 0;
    await i.run({ ...call, key: randomUUID() }, pay(16));
    assert.equal(counted.queries.length, 3, counted.queries.join('\n'));
    assert.match(counted.queries[0], /^BEGIN;EXECUTE /);
    // a replay: the claim, answered; its transaction (read-only) is
    // committed by the next claim, in front of its BEGIN
    counted.queries.length = 0;
    const r = await i.run(call, () => { throw new Error('must not run'); });
    assert.equal(r.outcome, 'replay');
    assert.equal(counted.queries.length, 1);
    const next = await i.run({ ...call, key: randomUUID() }, pay(16));
    assert.equal(next.status, 201);
    assert.equal(counted.queries.length, 4, counted.queries.join('\n'));
    assert.match(counted.queries[1], /^COMMIT;BEGIN;EXECUTE /);
    // ... or on its own when no claim comes
    counted.queries.length = 0;
    const released = counted.released();
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    await released;
    assert.deepEqual(counted.queries.slice(1), ['COMMIT']);
    // another instance with the same options shares the connection's statements
    counted.queries.length = 0;
    await new Idempotency(counted).run({ ...call, key: randomUUID() }, pay(16));
    assert.equal(counted.queries.length, 3, counted.queries.join('\n'));
    assert.equal(i.preparedStatements, true);
    // nothing is left open on the connection
    const { rows: [{ own }] } = await one.query(
      'SELECT xact_start = query_start AS own FROM pg_stat_activity WHERE pid = pg_backend_pid()');
    assert.equal(own, true);
  } finally {
    await one.end();
  }
});

test('a replay\'s open transaction: the next claim commits it, with any options, and an error there keeps nothing of the next', async () => {
  const one = new Pool({ max: 1 });
  try {
    const counted = countingPool({ from: one });
    const i = new Idempotency(counted);
    const call = { operation: op('parked'), key: randomUUID(), request: { amount: 17 } };
    assert.equal((await i.run(call, pay(17))).status, 201);
    // a replay, then a claim with options not prepared yet on the connection:
    // the replay's transaction is committed on its own first
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    counted.queries.length = 0;
    const withTtl = { ...call, key: randomUUID(), ttl: '1 day' };
    assert.equal((await i.run(withTtl, pay(17))).status, 201);
    assert.deepEqual(counted.queries.map((q) => q.slice(0, 13)),
      ['COMMIT', 'PREPARE idem_', 'BEGIN;EXECUTE', 'INSERT INTO p', 'EXECUTE idem_']);
    // a replay, then a claim that refuses its key: 400, and the connection goes on
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    counted.queries.length = 0;
    const bad = await i.run({ ...call, key: '' }, () => { throw new Error('must not run'); });
    assert.equal(bad.status, 400);
    assert.match(counted.queries[0], /^COMMIT;BEGIN;EXECUTE /);
    assert.equal(counted.queries[1], 'ROLLBACK');
    // a replay, then a claim whose handler throws after its write: nothing kept
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    const key = randomUUID();
    await assert.rejects(i.run({ ...call, key }, async (client, ctx) => {
      await pay(17)(client, ctx);
      throw new Error('boom');
    }), /boom/);
    assert.equal(await paymentsFor(key), 0);
    assert.equal((await i.run({ ...call, key }, pay(17))).status, 201);
    assert.equal(await paymentsFor(key), 1);
    assert.equal(await paymentsFor(call.key), 1);
  } finally {
    await one.end();
  }
});

test('a header that node:http cannot send (CR LF, a character above U+00FF, a bad name) is refused before it is stored: rolled back, the retry proceeds', async () => {
  for (const headers of [{ Location: '/p\r\nSet-Cookie: a=b' }, { 'X-Note': '10 \u20ac' }, [['Bad Name', 'x']]]) {
    const call = { operation: op('badheader'), key: randomUUID(), request: { amount: 18 } };
    await assert.rejects(idem.run(call, async (client, ctx) => {
      await pay(18)(client, ctx);
      return { status: 201, headers, body: {} };
    }), { code: /^ERR_INVALID_(CHAR|HTTP_TOKEN)$/ });
    assert.equal(await paymentsFor(call.key), 0);
    assert.equal((await idem.run(call, pay(18))).status, 201);
    assert.equal(await paymentsFor(call.key), 1);
  }
});

test('the connection ended by the server while the handler awaits something else: run() rejects, no crash, the connection dropped', async () => {
  const one = new Pool({ max: 1 });
  const admin = new Client();
  await admin.connect();
  const i = new Idempotency(one);
  try {
    const call = { operation: op('handlerend'), key: randomUUID(), request: { amount: 18 } };
    await assert.rejects(i.run(call, async (client) => {
      const { rows: [{ pid }] } = await client.query('SELECT pg_backend_pid() AS pid');
      const ended = new Promise((resolve) => client.once('end', resolve));
      await admin.query('SELECT pg_terminate_backend($1)', [pid]);
      await ended; // no query running on the client meanwhile
      return { status: 201, body: {} };
    }));
    // nothing stored: the retry proceeds, on a new connection
    const r = await i.run(call, pay(18));
    assert.equal(r.status, 201);
    assert.equal(await paymentsFor(call.key), 1);
  } finally {
    i.unpark();
    await admin.end();
    await one.end();
  }
});

test('a replay\'s connection ended by the server while it waits for the next claim: released as broken, no crash', async () => {
  const one = new Pool({ max: 1 });
  const admin = new Client();
  await admin.connect();
  const i = new Idempotency(one);
  try {
    i.parkMillis = 600000; // kept until a claim comes: the error must be what releases it
    const call = { operation: op('parkedend'), key: randomUUID(), request: { amount: 18 } };
    assert.equal((await i.run(call, pay(18))).status, 201);
    const { rows: [{ pid }] } = await one.query('SELECT pg_backend_pid() AS pid');
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    const released = new Promise((resolve) => one.once('release', (err) => resolve(err)));
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const err = await released;
    assert.ok(err, 'released with the connection\'s error');
    assert.equal(i.parked.length, 0);
    // the next claim gets a new connection, prepared anew
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    const r = await i.run({ ...call, key: randomUUID() }, pay(18));
    assert.equal(r.status, 201);
    assert.equal(i.preparedStatements, true);
  } finally {
    i.unpark(); // the last replay's, kept for 600 s otherwise
    await admin.end();
    await one.end();
  }
});

test('preparedStatements: false sends the claim and the completion as SELECTs, never PREPARE', async () => {
  const counted = countingPool();
  const i = new Idempotency(counted, { preparedStatements: false });
  const call = { operation: op('unprepared'), key: randomUUID(), request: { amount: 17 } };
  const first = await i.run(call, pay(17));
  assert.equal(first.status, 201);
  assert.deepEqual(counted.queries.map((q) => q.slice(0, 12)), ['BEGIN;SELECT', 'INSERT INTO ', 'SELECT idem_']);
  assert.match(counted.queries[0], /FROM idem_claim_text\('test\.node\.unprepared/);
  assert.match(counted.queries[2], /^SELECT idem_complete\(.*\);COMMIT$/);
  const again = await i.run(call, () => { throw new Error('must not run'); });
  assert.equal(again.outcome, 'replay');
  assert.ok(again.body.equals(first.body));
  assert.ok(!counted.queries.some((q) => /PREPARE|EXECUTE/.test(q)));
  assert.equal(await paymentsFor(call.key), 1);
});

test('a claim with no option but the tenant goes to idem_claim_text, whose records idem_claim answers alike', async () => {
  for (const preparedStatements of [true, false]) {
    const counted = countingPool();
    const text = new Idempotency(counted, { preparedStatements, tenant: 'tenant \\ \'t\'' });
    const call = { operation: op(`text.${preparedStatements}`), key: randomUUID(), request: { amount: 19, note: 'a "b" \\ é' } };
    const first = await text.run(call, pay(19));
    assert.equal(first.status, 201);
    assert.equal(text.claimText, true);
    assert.equal(counted.learned.length, 1);
    assert.match(counted.queries.find((q) => q.includes('idem_claim')), /idem_claim_text\(/);
    assert.ok(!counted.queries.some((q) => /idem_claim\(/.test(q)));
    // the same key through idem_claim: the same fingerprint, the same answer
    const full = new Idempotency(pool, { preparedStatements, tenant: 'tenant \\ \'t\'' });
    full.claimText = false;
    const again = await full.run({ ...call, request: { note: 'a "b" \\ é', amount: 19.0 } }, () => { throw new Error('must not run'); });
    assert.equal(again.outcome, 'replay');
    assert.ok(again.body.equals(first.body));
    const other = await full.run({ ...call, request: { amount: 20 } }, () => { throw new Error('must not run'); });
    assert.equal(other.outcome, 'mismatch');
    assert.equal((await text.run({ ...call, request: { amount: 20 } }, () => { throw new Error('must not run'); })).outcome, 'mismatch');
    assert.equal(await paymentsFor(call.key), 1);
    text.unpark();
    full.unpark();
  }
});

test('idem_claim_text not there: claims go to idem_claim', async () => {
  const i = new Idempotency(pool, { schema: 'pg_catalog' });
  await i.learnClaimText();
  assert.equal(i.claimText, false);
  assert.match(i.claimSql({ operation: 'o', key: 'k', request: { a: 1 } }), /"pg_catalog"\.idem_claim\('o', 'k', '\{"a":1\}'::jsonb\)$/);
});

test('every claim option, prepared and not, with quotes and backslashes in the values', async () => {
  for (const preparedStatements of [true, false]) {
    const i = new Idempotency(pool, { preparedStatements, tenant: "t'\\" });
    const call = {
      operation: op(`options.${preparedStatements}`), key: randomUUID(), request: { amount: 18, note: "a'\\b" },
      caller: "c'\\", ttl: '1 day', lease: 60000, wait: 0, onLeaseExpiry: 'retry', onExpired: 'proceed',
    };
    const first = await i.run(call, pay(18));
    assert.equal(first.status, 201);
    const again = await i.run(call, () => { throw new Error('must not run'); });
    assert.equal(again.outcome, 'replay', `preparedStatements: ${preparedStatements}`);
    const other = await i.run({ ...call, tenant: 'another' }, pay(18));
    assert.equal(other.outcome, 'proceed', 'the tenant is part of the key');
    assert.equal(await paymentsFor(call.key), 2);
    assert.equal(i.preparedStatements, preparedStatements);
  }
});

test('behind a pooler that moves the client between server connections: 26000 at the claim, rolled back, unprepared from then on', async () => {
  const pooler = await poolerPool();
  try {
    const i = new Idempotency(pooler);
    const call = { operation: op('pooler'), key: randomUUID(), request: { amount: 19 } };
    // PREPARE on one server connection, the claim on the other
    const first = await i.run(call, pay(19));
    assert.equal(first.status, 201);
    assert.equal(i.preparedStatements, false);
    assert.deepEqual(pooler.queries.map((q) => q.slice(0, 13)),
      ['PREPARE idem_', 'BEGIN;EXECUTE', 'ROLLBACK', 'BEGIN;SELECT ', 'INSERT INTO p', 'SELECT idem_c']);
    assert.equal(await paymentsFor(call.key), 1);
    pooler.queries.length = 0;
    const again = await i.run(call, () => { throw new Error('must not run'); });
    assert.equal(again.outcome, 'replay');
    assert.ok(again.body.equals(first.body));
    const r = await i.run({ ...call, key: randomUUID() }, pay(19));
    assert.equal(r.status, 201);
    assert.ok(!pooler.queries.some((q) => /PREPARE|EXECUTE/.test(q)), pooler.queries.join('\n'));
  } finally {
    await pooler.end();
  }
});

test('statements already prepared on a connection the library has not seen (42P05): unprepared from then on', async () => {
  const one = new Pool({ max: 1 });
  try {
    const i = new Idempotency(countingPool({ from: one, fresh: true }));
    const call = { operation: op('exists'), key: randomUUID(), request: { amount: 20 } };
    assert.equal((await i.run(call, pay(20))).status, 201);
    assert.equal(i.preparedStatements, true);
    const r = await i.run({ ...call, key: randomUUID() }, pay(20));
    assert.equal(r.status, 201);
    assert.equal(i.preparedStatements, false);
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
  } finally {
    await one.end();
  }
});

test('prepared: an error at the claim, in the handler or at the completion commits nothing, and the connection goes on', async () => {
  const one = new Pool({ max: 1 });
  try {
    const counted = countingPool({ from: one });
    const i = new Idempotency(counted);
    const call = { operation: op('midway'), key: randomUUID(), request: { amount: 21 } };
    // the claim refuses the key: 400, rolled back
    const bad = await i.run({ ...call, key: '' }, () => { throw new Error('must not run'); });
    assert.equal(bad.status, 400);
    // the handler throws after its write
    await assert.rejects(i.run(call, async (client, ctx) => {
      await pay(21)(client, ctx);
      throw new Error('boom');
    }), /boom/);
    assert.equal(await paymentsFor(call.key), 0);
    // the completion fails: the handler dropped the connection's statements
    await assert.rejects(i.run(call, async (client, ctx) => {
      const r = await pay(21)(client, ctx);
      await client.query('DEALLOCATE ALL');
      return r;
    }), (err) => err.code === '26000');
    assert.equal(await paymentsFor(call.key), 0);
    // each time the key was left free: the retry proceeds, prepared again
    counted.queries.length = 0;
    const r = await i.run(call, pay(21));
    assert.equal(r.status, 201);
    assert.match(counted.queries[0], /^PREPARE /);
    assert.equal(i.preparedStatements, true);
    assert.equal(await paymentsFor(call.key), 1);
    assert.equal((await i.run(call, () => { throw new Error('must not run'); })).outcome, 'replay');
    // statements dropped between calls: 26000 at the claim, which goes on unprepared
    await one.query('DEALLOCATE ALL');
    const key = randomUUID();
    assert.equal((await i.run({ ...call, key }, pay(21))).status, 201);
    assert.equal(i.preparedStatements, false);
    assert.equal(await paymentsFor(key), 1);
  } finally {
    await one.end();
  }
});

test('answer() maps every outcome as the README says', () => {
  const headersOf = (r) => Object.fromEntries(r.headers);
  const code = (r) => JSON.parse(r.body).error_code;
  let r = answer({ outcome: 'expired', http_status: 409, error_code: 'IDEMPOTENCY_KEY_EXPIRED' });
  assert.deepEqual([r.status, code(r), headersOf(r)['Retry-After']], [409, 'IDEMPOTENCY_KEY_EXPIRED', undefined]);
  r = answer({ outcome: 'rate_limited', http_status: 429, error_code: 'IDEMPOTENCY_RATE_LIMITED', retry_after: 3 });
  assert.deepEqual([r.status, code(r), headersOf(r)['Retry-After']], [429, 'IDEMPOTENCY_RATE_LIMITED', '3']);
  r = answer({ outcome: 'unknown', http_status: 409, error_code: 'IDEMPOTENCY_OUTCOME_UNKNOWN' });
  assert.deepEqual([r.status, code(r), headersOf(r)['Retry-After']], [409, 'IDEMPOTENCY_OUTCOME_UNKNOWN', undefined]);
  r = answer({ outcome: 'in_progress', http_status: 409, error_code: 'IDEMPOTENCY_REQUEST_IN_PROGRESS', retry_after: 2 });
  assert.deepEqual([r.status, headersOf(r)['Retry-After']], [409, '2']);
  // a response stored as jsonb (by another client) replays as its JSON text
  r = answer({ outcome: 'replay', http_status: 200, headers: { 'X-A': '1' }, body: '{"a": 1}', raw_body: null });
  assert.deepEqual([r.status, r.body.toString(), r.headers], [200, '{"a":1}', [['X-A', '1'], ['Idempotent-Replayed', 'true']]]);
  assert.throws(() => answer({ outcome: 'proceed' }));
});

test('external form: the claim commits with a lease, a retry meanwhile is 409, the outcome commits after', async () => {
  const call = { operation: op('ext'), key: randomUUID(), request: { amount: 20 }, lease: 5000 };
  let release;
  const held = new Promise((resolve) => { release = resolve; });
  let entered;
  const inside = new Promise((resolve) => { entered = resolve; });
  const first = idem.runExternal(call, async (ctx) => {
    assert.equal(ctx.attempt, 1);
    entered(await ctx.deriveKey('charge'));
    await held;
    return { status: 201, body: { charged: true } };
  });
  const derived = await inside;
  assert.match(derived, /^[0-9a-f-]{36}$/);
  // committed: another connection sees the attempt running
  const busy = await idem.runExternal(call, () => { throw new Error('must not run'); });
  assert.equal(busy.status, 409);
  assert.equal(busy.outcome, 'in_progress');
  release();
  const r = await first;
  assert.equal(r.status, 201);
  const again = await idem.runExternal(call, () => { throw new Error('must not run'); });
  assert.equal(again.replayed, true);
  assert.ok(again.body.equals(r.body));
});

test('external form: an error leaves the outcome unknown once the lease ends (409 IDEMPOTENCY_OUTCOME_UNKNOWN)', async () => {
  const call = { operation: op('unknown'), key: randomUUID(), request: { amount: 21 }, lease: 50 };
  await assert.rejects(idem.runExternal(call, () => { throw new Error('provider timed out'); }), /provider/);
  const r = await settled(call);
  assert.equal(r.status, 409);
  assert.equal(r.outcome, 'unknown');
  assert.equal(JSON.parse(r.body).error_code, 'IDEMPOTENCY_OUTCOME_UNKNOWN');
});

test('external form: RetryableError stores a retryable failure (503) and the retry runs as attempt 2', async () => {
  const call = { operation: op('retryable'), key: randomUUID(), request: { amount: 22 } };
  const r = await idem.runExternal(call, () => { throw new RetryableError('provider unavailable'); });
  assert.equal(r.status, 503);
  assert.equal(Object.fromEntries(r.headers)['Retry-After'], '1');
  const again = await idem.runExternal(call, (ctx) => ({ status: 201, body: { attempt: ctx.attempt } }));
  assert.equal(again.status, 201);
  assert.equal(JSON.parse(again.body).attempt, 2);
});

test('external form: with onLeaseExpiry retry, the next attempt resumes from the last checkpoint', async () => {
  const call = { operation: op('resume'), key: randomUUID(), request: { amount: 23 }, lease: 50, onLeaseExpiry: 'retry' };
  await assert.rejects(idem.runExternal(call, async (ctx) => {
    await ctx.checkpoint('charged');
    throw new Error('crashed after the charge');
  }));
  const deadline = Date.now() + 20000;
  let r;
  do {
    r = await idem.runExternal({ ...call, lease: 5000 }, (ctx) => ({ status: 201, body: { resumed: ctx.recoveryPoint } }));
  } while (r.outcome === 'in_progress' && Date.now() < deadline && await sleep(20) === undefined);
  assert.equal(r.status, 201);
  assert.deepEqual(JSON.parse(r.body), { resumed: 'charged' });
});

test('external form: the lease is extended while the handler runs', { skip: !process.env.IDEM_ADMIN_DSN && 'no IDEM_ADMIN_DSN' }, async () => {
  const admin = new Client(adminConfig());
  await admin.connect();
  try {
    const call = { operation: op('heartbeat'), key: randomUUID(), request: { amount: 24 }, lease: 600 };
    const lockedUntil = async () => (await admin.query(
      'SELECT locked_until FROM idem_records WHERE operation = $1 AND key = $2', [call.operation, call.key])).rows[0].locked_until;
    const r = await idem.runExternal(call, async () => {
      const start = await lockedUntil();
      const deadline = Date.now() + 20000;
      let now = start;
      while (now.getTime() <= start.getTime() && Date.now() < deadline) {
        await sleep(20);
        now = await lockedUntil();
      }
      assert.ok(now > start, 'a heartbeat moved locked_until');
      return { status: 200, body: 'ok' };
    });
    assert.equal(r.status, 200);
  } finally {
    await admin.end();
  }
});

test('idem_claim_text no longer usable after the first call (EXECUTE revoked): that claim and the later ones go to idem_claim', { skip: !process.env.IDEM_ADMIN_DSN && 'no IDEM_ADMIN_DSN' }, async () => {
  const admin = new Client(adminConfig());
  await admin.connect();
  const role = `idem_revoked_${run}`;
  const grant = 'EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_fail';
  await admin.query(`CREATE ROLE ${role}; GRANT ${grant} TO ${role}`);
  const roled = new Pool({ ...adminConfig(), max: 1, options: `-c role=${role}` });
  try {
    for (const preparedStatements of [true, false]) {
      const i = new Idempotency(roled, { preparedStatements });
      const ok = () => ({ status: 201, body: { ok: true } });
      const call = { operation: op(`revoked.${preparedStatements}`), request: { amount: 1 } };
      assert.equal((await i.run({ ...call, key: randomUUID() }, ok)).status, 201);
      assert.equal(i.claimText, true);
      await admin.query(`REVOKE EXECUTE ON FUNCTION idem_claim_text FROM ${role}`);
      const key = randomUUID();
      assert.equal((await i.run({ ...call, key }, ok)).status, 201);
      assert.equal(i.claimText, false);
      assert.equal((await i.run({ ...call, key }, () => { throw new Error('must not run'); })).outcome, 'replay');
      i.unpark();
      await admin.query(`GRANT EXECUTE ON FUNCTION idem_claim_text TO ${role}`);
    }
  } finally {
    await roled.end();
    await admin.query(`DROP OWNED BY ${role}; DROP ROLE ${role}`);
    await admin.end();
  }
});

test('a body stored as jsonb (no raw_body) is replayed as its text compacted, numbers as written, prepared or not', async () => {
  for (const preparedStatements of [true, false]) {
    const operation = `test.node.jsonb-body.${preparedStatements}.${run}`;
    const key = randomUUID();
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { rows: [{ token }] } = await client.query('SELECT token FROM idem_claim($1, $2)', [operation, key]);
      await client.query('SELECT idem_complete($1, 200, $2::jsonb)',
        [token, '{"a": 1.10, "b": 12345678901234567890, "s": "x, y: z"}']);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const r = await new Idempotency(pool, { preparedStatements }).run({ operation, key }, () => {
      throw new Error('must not run');
    });
    assert.equal(r.replayed, true);
    assert.equal(r.body.toString(), '{"a":1.10,"b":12345678901234567890,"s":"x, y: z"}');
  }
});
