// The Fastify adapter: a route handler that runs a handler once per
// Idempotency-Key.
//
//   const { idempotent } = require('@idempotency/pg/fastify');
//   fastify.post('/payments', idempotent(idem, { operation: 'payments.create' },
//     async (client, { body }) => ({ status: 201, body: { ... } })));
'use strict';

const { checkOptions, execute } = require('./lib/adapter');
const { HttpError } = require('./index');

// An async (request, reply) handler.  The request is request.body, as
// Fastify's content type parsers left it.  An HttpError is answered; other
// errors are thrown to Fastify's error handler.
function idempotent(idem, options, handler) {
  checkOptions(idem, options, handler);
  const { maxBody, ...rest } = options; // Fastify's own bodyLimit applies
  return async function idempotentRoute(request, reply) {
    let response;
    try {
      response = await execute(idem, rest,
        { req: request, key: request.headers['idempotency-key'], body: request.body }, handler);
    } catch (err) {
      if (!(err instanceof HttpError)) throw err;
      response = err.toResponse();
    }
    // Repeated names become one header with several values, in order.
    const headers = {};
    const names = new Map(); // lower case -> the name as first written
    for (const [name, value] of response.headers) {
      const lower = name.toLowerCase();
      const first = names.get(lower);
      if (first === undefined) {
        names.set(lower, name);
        headers[name] = value;
      } else {
        headers[first] = [].concat(headers[first], value);
      }
    }
    reply.code(response.status).headers(headers);
    return reply.send(response.body);
  };
}

module.exports = { idempotent };
