// The Fastify adapter: a route handler that runs a handler once per
// Idempotency-Key.
//
//   const { idempotent } = require('@idempotency/pg/fastify');
//   fastify.post('/payments', idempotent(idem, { operation: 'payments.create' },
//     async (client, { body }) => ({ status: 201, body: { ... } })));
'use strict';

const {
  decodeText, parseJson, keyOf, checkOptions, execute,
} = require('./lib/adapter');
const { HttpError } = require('./index');

// The request is the body as the client sent it, which Fastify's own
// parsers do not keep (they decode leniently: U+FFFD for bytes that are not
// UTF-8, Infinity for 1e1000000).  rawBodies(scope) makes every body of a
// scope's routes its bytes, for the idempotent routes registered there:
//
//   fastify.register(async (scope) => {
//     rawBodies(scope);
//     scope.post('/payments', idempotent(idem, options, handler));
//   });
//
// Fastify's bodyLimit applies.
function rawBodies(scope) {
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser('*', { parseAs: 'buffer' }, (request, body, done) => done(null, body));
}

// An async (request, reply) handler, in a scope of rawBodies: the body's
// bytes are decoded and parsed here (not UTF-8 or not JSON: 400
// INVALID_JSON).  A body Fastify parsed itself is refused (an error to
// Fastify's error handler): it may not be what was sent.  An HttpError is
// answered; other errors are thrown to Fastify's error handler.
function idempotent(idem, options, handler) {
  checkOptions(idem, options, handler);
  const { maxBody, ...rest } = options; // Fastify's own bodyLimit applies
  return async function idempotentRoute(request, reply) {
    let response;
    try {
      let text = '';
      if (Buffer.isBuffer(request.body)) {
        text = decodeText(request.body);
      } else if (request.body !== undefined && request.body !== null) {
        throw new TypeError('@idempotency/pg/fastify: the body was parsed by Fastify; register the idempotent '
          + 'route in a scope of rawBodies(scope), which keeps its bytes');
      }
      const body = parseJson(text);
      response = await execute(idem, rest,
        { req: request, key: keyOf(request.raw || request), body, text }, handler);
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

module.exports = { idempotent, rawBodies };
