#!/usr/bin/env node
// One measurement of bench/http: autocannon against a payments service.
//
//   node load.js URL new|replay SECONDS CONNECTIONS
//
// new: every request a key of its own; replay: KEYS (200) keys are paid
// once first, then requests cycle through them.  The body differs per key
// (its amount), as real requests do: a retry sends its key's body again.
// Prints one JSON line:
// {"rps": ..., "p50": ms, "p99": ms, "non2xx": n, "errors": n}.
'use strict';

const autocannon = require('autocannon');
const { randomUUID } = require('node:crypto');

const [url, mode, seconds, connections] = process.argv.slice(2);
const bodyOf = (n) => JSON.stringify({ amount: 1000 + (n % 900000), currency: 'EUR' });
const prefix = randomUUID();
const KEYS = 200;

async function payOnce(key, n) {
  const res = await fetch(`${url}/payments`, {
    method: 'POST', body: bodyOf(n), headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
  });
  await res.arrayBuffer();
  if (res.status !== 201) throw new Error(`setup: ${res.status}`);
}

async function main() {
  let n = 0;
  if (mode === 'replay') {
    for (let i = 0; i < KEYS; i++) await payOnce(`${prefix}-${i}`, i);
  }
  const result = await autocannon({
    url: `${url}/payments`,
    method: 'POST',
    connections: Number(connections),
    duration: Number(seconds),
    headers: { 'Content-Type': 'application/json' },
    body: bodyOf(0),
    requests: [{
      setupRequest: (req) => {
        const i = mode === 'replay' ? n++ % KEYS : n++;
        return { ...req, body: bodyOf(i), headers: { ...req.headers, 'Idempotency-Key': `${prefix}-${i}` } };
      },
    }],
  });
  console.log(JSON.stringify({
    rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99,
    non2xx: result.non2xx, errors: result.errors + result.timeouts,
  }));
}

main().catch((err) => { console.error(err); process.exit(1); });
