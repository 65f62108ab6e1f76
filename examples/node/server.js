#!/usr/bin/env node
// POST /payments with an Idempotency-Key, on the idempotency extension.
//
// A small HTTP service (node's http module, node-postgres) that shows the
// one-transaction pattern: the claim, the business write (a row in payments)
// and idem_complete commit together, and every outcome of idem_claim becomes
// its HTTP answer (README, "HTTP mapping").
//
//     POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
//     GET  /payments/<id>
//
// Connection settings come from libpq's environment variables, which
// node-postgres reads too (PGHOST, PGPORT, PGDATABASE, PGUSER, ...).
// Listens on 127.0.0.1; `--port 0` picks a free port.  The first line on
// stdout is "listening on http://127.0.0.1:PORT".
//
// For tests, two request headers that are not part of the request (and so
// not of its fingerprint) make the handler misbehave:
//     Simulate-Delay-Ms: N      the handler sleeps N ms (at most 10000) after
//                               its write, inside the transaction
//     Simulate-Failure: true    the handler throws after its write: the
//                               transaction rolls back and the claim with it
'use strict';

const http = require('node:http');
const { Pool } = require('pg');

const OPERATION = 'payments.create';
const POOL_SIZE = 10;
const MAX_BODY = 1 << 20;

// SQLSTATEs idem_claim raises for a bad key: invalid_parameter_value and
// null_value_not_allowed.  The client sent it: 400.
const BAD_INPUT = new Set(['22023', '22004']);

const CLAIM_SQL = `
    SELECT outcome, token, http_status, headers, raw_body, error_code, retry_after
      FROM idem_claim($1, $2, $3::jsonb)`;

const JSON_TYPE = ['Content-Type', 'application/json'];

class ClientError extends Error {
  constructor(status, errorCode, message) {
    super(message);
    this.status = status;
    this.errorCode = errorCode;
  }
}

// A JSON answer as the bytes sent.  The stored response is these very bytes
// (raw_body), so a replay is the same bytes.
const encode = (value) => Buffer.from(JSON.stringify(value));

// The handler's own checks: a failure is stored and replayed.
function validate(request) {
  const { amount, currency } = request;
  if (!Number.isSafeInteger(amount) || amount <= 0) {
    return 'amount must be a positive integer (minor units)';
  }
  if (typeof currency !== 'string' || !/^[A-Z]{3}$/.test(currency)) {
    return 'currency must be a three-letter ISO 4217 code';
  }
  return null;
}

// Map an outcome other than proceed to [status, headers, body]: headers a
// list of [name, value] pairs, body a Buffer.
function answer(decision) {
  const error = { error_code: decision.error_code };
  switch (decision.outcome) {
    case 'replay':
      // The stored status, headers (in order, repeats kept) and body bytes,
      // exactly as first sent, and the marker.
      return [decision.http_status,
        [...(decision.headers || []), ['Idempotent-Replayed', 'true']],
        decision.raw_body || Buffer.alloc(0)];
    case 'in_progress':
      error.message = 'a request with this Idempotency-Key is still being processed';
      return [409, [JSON_TYPE, ['Retry-After', String(decision.retry_after)]], encode(error)];
    case 'mismatch':
      error.message = 'this Idempotency-Key was used for a different request';
      return [422, [JSON_TYPE], encode(error)];
    case 'unknown':
      error.message = 'the outcome of the first attempt is unknown; query the payment before retrying';
      return [409, [JSON_TYPE], encode(error)];
    case 'expired':
      error.message = 'this Idempotency-Key has expired; look the payment up by its reference before sending it again with a new key';
      return [409, [JSON_TYPE], encode(error)];
    case 'rate_limited':
      // Nothing was written: the same request, same key, may come again.
      error.message = 'too many new requests from this client; send it again after Retry-After seconds, with the same Idempotency-Key';
      return [429, [JSON_TYPE, ['Retry-After', String(decision.retry_after)]], encode(error)];
    default:
      throw new Error(`unexpected outcome ${decision.outcome}`);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Claim, write, complete: one transaction.  Resolves to [status, headers, body].
async function createPayment(pool, key, request, { delayMs = 0, fail = false } = {}) {
  const client = await pool.connect();
  let committed = false;
  let broken = null;
  try {
    await client.query('BEGIN');
    let decision;
    try {
      ({ rows: [decision] } = await client.query(
        CLAIM_SQL, [OPERATION, key, JSON.stringify(request)]));
    } catch (err) {
      if (BAD_INPUT.has(err.code)) throw new ClientError(400, 'IDEMPOTENCY_KEY_INVALID', err.message);
      throw err;
    }
    let result;
    if (decision.outcome !== 'proceed') {
      // Commit all the same: a claim that found an ended lease may have
      // moved the record to unknown.
      result = answer(decision);
    } else {
      const problem = validate(request);
      if (problem !== null) {
        // A stable failure: stored, replayed to every retry.
        const headers = [JSON_TYPE];
        const body = encode({ error_code: 'VALIDATION_FAILED', message: problem });
        await client.query('SELECT idem_fail($1, 400, headers => $2, raw_body => $3)',
          [decision.token, JSON.stringify(headers), body]);
        result = [400, headers, body];
      } else {
        const { rows: [payment] } = await client.query(
          `INSERT INTO payments (idempotency_key, amount, currency)
           VALUES ($1, $2, $3) RETURNING id`, [key, request.amount, request.currency]);
        if (delayMs > 0) await sleep(delayMs);
        if (fail) throw new Error('simulated failure after the write');
        const body = encode({ id: payment.id, amount: request.amount, currency: request.currency, status: 'created' });
        const headers = [JSON_TYPE, ['Location', `/payments/${payment.id}`]];
        await client.query(
          'SELECT idem_complete($1, 201, headers => $2, resource_id => $3, raw_body => $4)',
          [decision.token, JSON.stringify(headers), payment.id, body]);
        result = [201, headers, body];
      }
    }
    await client.query('COMMIT');
    committed = true;
    return result; // only once the transaction has committed
  } finally {
    if (!committed) {
      await client.query('ROLLBACK').catch((err) => { broken = err; });
    }
    client.release(broken || undefined);
  }
}

async function getPayment(pool, id) {
  const { rows } = await pool.query('SELECT id, amount, currency FROM payments WHERE id = $1', [id]);
  if (rows.length === 0) return [404, [JSON_TYPE], encode({ error_code: 'NOT_FOUND', message: 'no such payment' })];
  const p = rows[0]; // bigint comes back as a string
  return [200, [JSON_TYPE], encode({ id: p.id, amount: Number(p.amount), currency: p.currency, status: 'created' })];
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) reject(new ClientError(413, 'BODY_TOO_LARGE', 'the body is too large'));
      else chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

// Send status, headers ([name, value] pairs, in order, repeats kept) and body.
function respond(res, [status, headers, body]) {
  res.writeHead(status, [...headers, ['Content-Length', String(body.length)]].flat());
  res.end(body);
}

async function handle(pool, req) {
  if (req.method === 'POST' && req.url === '/payments') {
    const key = req.headers['idempotency-key'];
    if (key === undefined) {
      throw new ClientError(400, 'IDEMPOTENCY_KEY_MISSING', 'the Idempotency-Key header is required');
    }
    let request = null;
    try {
      request = JSON.parse(await readBody(req));
    } catch (err) {
      if (err instanceof ClientError) throw err;
    }
    if (request === null || typeof request !== 'object' || Array.isArray(request)) {
      throw new ClientError(400, 'INVALID_JSON', 'the body must be a JSON object');
    }
    const delay = req.headers['simulate-delay-ms'] || '0';
    if (!/^\d+$/.test(delay)) throw new ClientError(400, 'INVALID_HEADER', 'Simulate-Delay-Ms must be an integer');
    return createPayment(pool, key, request, {
      delayMs: Math.min(Number(delay), 10000),
      fail: (req.headers['simulate-failure'] || '').toLowerCase() === 'true',
    });
  }
  const m = req.method === 'GET' && /^\/payments\/([A-Za-z0-9_]+)$/.exec(req.url);
  if (m) return getPayment(pool, m[1]);
  throw new ClientError(404, 'NOT_FOUND', 'no such resource');
}

function createServer(pool, { verbose = true } = {}) {
  return http.createServer((req, res) => {
    handle(pool, req).then((result) => result, (err) => {
      if (err instanceof ClientError) {
        return [err.status, [JSON_TYPE], encode({ error_code: err.errorCode, message: err.message })];
      }
      // The transaction rolled back: a retry proceeds.
      console.error(`${req.method} ${req.url} failed: ${err.message}`);
      return [500, [JSON_TYPE], encode({ error_code: 'INTERNAL_ERROR', message: 'try again' })];
    }).then((result) => {
      respond(res, result);
      if (verbose) console.error(`${req.method} ${req.url} ${result[0]}`);
    });
  });
}

function main() {
  const args = process.argv.slice(2);
  const portArg = args.indexOf('--port');
  const port = portArg >= 0 ? Number(args[portArg + 1]) : 8000;
  const pool = new Pool({ max: POOL_SIZE, connectionTimeoutMillis: 30000 });
  pool.on('error', (err) => console.error(`idle connection lost: ${err.message}`));
  const server = createServer(pool, { verbose: !args.includes('--quiet') });
  server.listen(port, '127.0.0.1', 511, () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
  const stop = () => {
    server.close();
    server.closeAllConnections?.();
    pool.end().finally(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) main();

module.exports = { createServer, createPayment };
