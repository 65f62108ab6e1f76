#!/usr/bin/env node
// POST /payments with an Idempotency-Key, on the idempotency extension.
//
// A small HTTP service on @idempotency/pg (clients/node): the claim, the
// business write (a row in payments) and the completion commit together,
// and every outcome of idem_claim becomes its HTTP answer (README, "HTTP
// mapping").  What is left here is the business logic and the routes.
//
//     POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
//     GET  /payments/<id>
//
//     node server.js [--port N] [--framework http|express|fastify] [--quiet]
//                    [--no-prepared-statements]
//
// Connection settings come from libpq's environment variables, which
// node-postgres reads too (PGHOST, PGPORT, PGDATABASE, PGUSER, ...).
// Listens on 127.0.0.1; `--port 0` picks a free port.  The first line on
// stdout is "listening on http://127.0.0.1:PORT".  The library prepares its
// statements on each connection and goes on without them by itself behind
// pgbouncer in transaction mode; --no-prepared-statements never prepares.
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
const { Idempotency, HttpError } = require('@idempotency/pg');

const POOL_SIZE = 10;
const JSON_TYPE = ['Content-Type', 'application/json'];
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

// Checks before the claim: answered, never stored.
function checkRequest(req, body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new HttpError(400, 'INVALID_JSON', 'the body must be a JSON object');
  }
  if (!/^\d+$/.test(req.headers['simulate-delay-ms'] || '0')) {
    throw new HttpError(400, 'INVALID_HEADER', 'Simulate-Delay-Ms must be an integer');
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Runs once per key, inside the claim's transaction, on its client.
async function createPayment(client, { key, body, req }) {
  const problem = validate(body);
  if (problem !== null) {
    return { status: 400, body: { error_code: 'VALIDATION_FAILED', message: problem }, failed: true };
  }
  const { rows: [payment] } = await client.query(
    'INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, $2, $3) RETURNING id',
    [key, body.amount, body.currency]);
  const delay = Math.min(Number(req.headers['simulate-delay-ms'] || 0), 10000);
  if (delay > 0) await sleep(delay);
  if ((req.headers['simulate-failure'] || '').toLowerCase() === 'true') {
    throw new Error('simulated failure after the write');
  }
  return {
    status: 201,
    headers: [JSON_TYPE, ['Location', `/payments/${payment.id}`]],
    body: encode({ id: payment.id, amount: body.amount, currency: body.currency, status: 'created' }),
    resourceId: payment.id,
  };
}

async function getPayment(pool, id) {
  const { rows } = await pool.query('SELECT id, amount, currency FROM payments WHERE id = $1', [id]);
  if (rows.length === 0) return { status: 404, body: { error_code: 'NOT_FOUND', message: 'no such payment' } };
  const p = rows[0]; // bigint comes back as a string
  return { status: 200, body: { id: p.id, amount: Number(p.amount), currency: p.currency, status: 'created' } };
}

const PAYMENT_PATH = /^\/payments\/([A-Za-z0-9_]+)$/;
const OPTIONS = { operation: 'payments.create', validateRequest: checkRequest };
const internalError = { error_code: 'INTERNAL_ERROR', message: 'try again' };

// The same routes in each framework.  log(method, url, status) is called
// once per request.
const frameworks = {
  http(pool, idem, log) {
    const { idempotent, send } = require('@idempotency/pg/http');
    const onError = (err, req) => console.error(`${req.method} ${req.url} failed: ${err.message}`);
    const create = idempotent(idem, { ...OPTIONS, onError }, createPayment);
    return http.createServer(async (req, res) => {
      let response;
      const m = PAYMENT_PATH.exec(req.url);
      if (req.method === 'POST' && req.url === '/payments') {
        response = await create(req, res);
      } else if (req.method === 'GET' && m) {
        const r = await getPayment(pool, m[1]).catch((err) => {
          onError(err, req);
          return { status: 500, body: internalError };
        });
        response = { status: r.status, headers: [JSON_TYPE], body: encode(r.body) };
        send(res, response);
      } else {
        response = new HttpError(404, 'NOT_FOUND', 'no such resource').toResponse();
        send(res, response);
      }
      log(req.method, req.url, response.status);
    });
  },

  express(pool, idem, log) {
    const express = require('express');
    const { idempotent } = require('@idempotency/pg/express');
    const app = express();
    app.disable('x-powered-by');
    app.use((req, res, next) => {
      res.on('finish', () => log(req.method, req.originalUrl, res.statusCode));
      next();
    });
    // No body parser: the adapter reads the body as sent (1 MiB at most).
    app.post('/payments', idempotent(idem, OPTIONS, createPayment));
    app.get('/payments/:id', (req, res, next) => {
      if (!PAYMENT_PATH.test(req.path)) return next();
      return getPayment(pool, req.params.id).then((r) => res.status(r.status).json(r.body), next);
    });
    app.use((req, res) => res.status(404).json({ error_code: 'NOT_FOUND', message: 'no such resource' }));
    app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
      if (err.status >= 400 && err.status < 500) {
        return res.status(err.status).json({ error_code: 'INVALID_JSON', message: err.message });
      }
      console.error(`${req.method} ${req.originalUrl} failed: ${err.message}`);
      return res.status(500).json(internalError);
    });
    return http.createServer(app);
  },

  fastify(pool, idem, log) {
    const fastify = require('fastify')({ bodyLimit: 1 << 20 });
    const { idempotent, rawBodies } = require('@idempotency/pg/fastify');
    fastify.addHook('onResponse', async (request, reply) => log(request.method, request.url, reply.statusCode));
    // The route's body as sent, not as Fastify's parsers decode it.
    fastify.register(async (scope) => {
      rawBodies(scope);
      scope.post('/payments', idempotent(idem, OPTIONS, createPayment));
    });
    fastify.get('/payments/:id', async (request, reply) => {
      if (!PAYMENT_PATH.test(request.url)) return reply.code(404).send({ error_code: 'NOT_FOUND', message: 'no such resource' });
      const r = await getPayment(pool, request.params.id);
      return reply.code(r.status).send(r.body);
    });
    fastify.setNotFoundHandler((request, reply) => reply.code(404).send({ error_code: 'NOT_FOUND', message: 'no such resource' }));
    fastify.setErrorHandler((err, request, reply) => {
      if (err.statusCode >= 400 && err.statusCode < 500) {
        return reply.code(err.statusCode).send({ error_code: 'INVALID_JSON', message: err.message });
      }
      console.error(`${request.method} ${request.url} failed: ${err.message}`);
      return reply.code(500).send(internalError);
    });
    return fastify;
  },
};

async function main() {
  const args = process.argv.slice(2);
  const option = (name, fallback) => (args.includes(name) ? args[args.indexOf(name) + 1] : fallback);
  const port = Number(option('--port', 8000));
  const framework = option('--framework', 'http');
  if (!Object.hasOwn(frameworks, framework)) {
    console.error(`--framework must be one of ${Object.keys(frameworks).join(', ')}`);
    process.exit(2);
  }
  const quiet = args.includes('--quiet');
  const log = quiet ? () => {} : (method, url, status) => console.error(`${method} ${url} ${status}`);
  const pool = new Pool({ max: POOL_SIZE, connectionTimeoutMillis: 30000 });
  pool.on('error', (err) => console.error(`idle connection lost: ${err.message}`));
  const idem = new Idempotency(pool, { preparedStatements: !args.includes('--no-prepared-statements') });
  const app = frameworks[framework](pool, idem, log);
  let server;
  if (framework === 'fastify') {
    await app.listen({ port, host: '127.0.0.1' });
    server = app.server;
  } else {
    server = app;
    await new Promise((resolve) => server.listen(port, '127.0.0.1', 511, resolve));
  }
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
  const stop = () => {
    server.close();
    server.closeAllConnections?.();
    pool.end().finally(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}

module.exports = { createPayment, frameworks };
