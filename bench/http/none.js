#!/usr/bin/env node
// The payments service without idempotency, bench/http's floor: POST
// /payments writes a payment in BEGIN; INSERT; COMMIT and answers 201, on
// node:http or Express, over node-postgres.  Same command line as
// examples/node/server.js: --port N (0: a free one, printed first as
// "listening on http://127.0.0.1:PORT"), --framework http|express.
'use strict';

const http = require('node:http');
const { Pool } = require('pg');

const args = process.argv.slice(2);
const option = (name, fallback) => (args.includes(name) ? args[args.indexOf(name) + 1] : fallback);
const pool = new Pool({ max: 10 });

async function pay(request) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: [p] } = await client.query(
      'INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, $2, $3) RETURNING id',
      ['-', request.amount, request.currency]);
    await client.query('COMMIT');
    return p.id;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

function answer(res, id, request) {
  const body = Buffer.from(JSON.stringify({ id, amount: request.amount, currency: request.currency, status: 'created' }));
  res.writeHead(201, ['Content-Type', 'application/json', 'Location', `/payments/${id}`, 'Content-Length', String(body.length)]);
  res.end(body);
}

let server;
if (option('--framework', 'http') === 'express') {
  const express = require('express');
  const app = express();
  app.post('/payments', express.json(), (req, res, next) => {
    pay(req.body).then((id) => answer(res, id, req.body), next);
  });
  server = http.createServer(app);
} else {
  server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const request = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      pay(request).then((id) => answer(res, id, request), () => {
        res.writeHead(500);
        res.end();
      });
    });
  });
}
server.listen(Number(option('--port', 8000)), '127.0.0.1', 511, () => {
  console.log(`listening on http://127.0.0.1:${server.address().port}`);
});
process.on('SIGTERM', () => { server.close(); pool.end().finally(() => process.exit(0)); });
