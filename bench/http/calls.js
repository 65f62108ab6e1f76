#!/usr/bin/env node
// The payments service's database calls without HTTP, one after the other on
// one connection: what the server does per request, to count in
// instructions (a server under valgrind's callgrind, as bench/run.sh
// instructions runs it: the backend's count after 50 calls and after 250,
// the difference divided by 200).
//
//   node calls.js none|library|unprepared new|replay N [LIBRARY]
//
// none: BEGIN; INSERT; COMMIT, as none.js; library: idem.run() with the
// example's handler (prepared statements); unprepared: the same with
// preparedStatements: false.  replay: 50 keys paid first, then cycled
// through.  LIBRARY: the library's folder (default clients/node), to
// count another version of it.  libpq's environment variables say where.
'use strict';

const path = require('node:path');
const { randomUUID } = require('node:crypto');

const [variant, workload, count, library] = process.argv.slice(2);
const root = path.join(__dirname, '..', '..');
const { Pool } = require(require.resolve('pg', { paths: [path.join(root, 'clients', 'node')] }));
const { Idempotency } = require(library ? path.resolve(library) : path.join(root, 'clients', 'node'));

const pool = new Pool({ max: 1 });
const body = JSON.stringify({ amount: 1250, currency: 'EUR' });
const INSERT = 'INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, $2, $3) RETURNING id';

async function pay(client, { key }) {
  const { rows: [p] } = await client.query(INSERT, [key, 1250, 'EUR']);
  return {
    status: 201,
    headers: [['Content-Type', 'application/json'], ['Location', `/payments/${p.id}`]],
    body: Buffer.from(JSON.stringify({ id: p.id, amount: 1250, currency: 'EUR', status: 'created' })),
    resourceId: p.id,
  };
}

async function none() {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(INSERT, ['-', 1250, 'EUR']);
    await client.query('COMMIT');
  } finally {
    client.release();
  }
}

async function main() {
  const idem = new Idempotency(pool, { preparedStatements: variant === 'library' });
  const call = (key) => idem.run({ operation: 'payments.create', key, request: body, rawRequest: true }, pay);
  const keys = Array.from({ length: 50 }, () => randomUUID());
  if (variant !== 'none' && workload === 'replay') for (const key of keys) await call(key);
  for (let i = 0; i < Number(count); i++) {
    if (variant === 'none') {
      await none();
    } else {
      const r = await call(workload === 'replay' ? keys[i % keys.length] : randomUUID());
      if (r.status !== 201) throw new Error(`answered ${r.status}`);
    }
  }
  await pool.end();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
