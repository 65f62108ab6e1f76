// The node:http adapter: a request listener (or a route of one) that runs a
// handler once per Idempotency-Key.
//
//   const { idempotent } = require('@idempotency/pg/http');
//   const createPayment = idempotent(idem, { operation: 'payments.create' },
//     async (client, { body }) => {
//       const { rows: [p] } = await client.query('INSERT ... RETURNING id', [...]);
//       return { status: 201, headers: { Location: `/payments/${p.id}` }, body: { id: p.id } };
//     });
//   http.createServer((req, res) => createPayment(req, res));
'use strict';

const {
  readText, parseJson, keyOf, checkOptions, execute, errorAnswer, writeResponse, sendResponse, MAX_BODY,
} = require('./lib/adapter');

// A (req, res) listener.  The body is read (options.maxBody bytes at most,
// 1 MiB by default) and parsed as JSON for the handler; the fingerprint is
// of its text as sent.  Errors other than HttpError answer 500 and go to
// options.onError(err, req).
function idempotent(idem, options, handler) {
  checkOptions(idem, options, handler);
  const { maxBody = MAX_BODY, onError, ...rest } = options;
  return async function idempotentListener(req, res) {
    let response;
    try {
      const text = await readText(req, maxBody);
      const body = parseJson(text);
      response = await execute(idem, rest, { req, key: keyOf(req), body, text }, handler);
    } catch (err) {
      response = errorAnswer(err, onError, req);
    }
    const err = sendResponse(res, response);
    if (err !== null) {
      response = errorAnswer(err, onError, req);
      writeResponse(res, response);
    }
    return response;
  };
}

module.exports = { idempotent, send: writeResponse };
