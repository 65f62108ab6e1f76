// The Express adapter: route middleware that runs a handler once per
// Idempotency-Key.
//
//   const { idempotent } = require('@idempotency/pg/express');
//   app.post('/payments', express.json(), idempotent(idem, { operation: 'payments.create' },
//     async (client, { body }) => ({ status: 201, body: { ... } })));
'use strict';

const {
  readText, decodeText, parseJson, keyOf, checkOptions, execute, writeResponse, sendResponse, MAX_BODY,
} = require('./lib/adapter');
const { HttpError } = require('./index');

// (req, res, next) middleware.  The request is the body as the client sent
// it: read here when no body parser ran before (none is needed), or the
// bytes a parser kept in req.rawBody (express.json({ verify: (req, res,
// buf) => { req.rawBody = buf; } })).  A body parsed without its bytes is
// refused (an error to next(err)): its parser decoded it leniently (U+FFFD
// for bytes that are not UTF-8, Infinity for 1e1000000, {} for no body),
// and the request would not be what was sent.  An HttpError is answered;
// other errors go to next(err), the app's error handler.
function idempotent(idem, options, handler) {
  checkOptions(idem, options, handler);
  const { maxBody = MAX_BODY, ...rest } = options;
  return function idempotentMiddleware(req, res, next) {
    (async () => {
      let text;
      if (req.rawBody !== undefined) {
        text = typeof req.rawBody === 'string' ? req.rawBody : decodeText(req.rawBody);
      } else if (req.body === undefined) {
        text = await readText(req, maxBody);
      } else {
        throw new TypeError('@idempotency/pg/express: the body was parsed before the idempotent route without '
          + 'its bytes; remove the body parser, or keep them in req.rawBody (express.json({ verify }))');
      }
      const body = parseJson(text);
      return execute(idem, rest, { req, key: keyOf(req), body, text }, handler);
    })().then((response) => {
      const err = sendResponse(res, response);
      if (err !== null) next(err);
    }, (err) => {
      if (err instanceof HttpError) {
        writeResponse(res, err.toResponse());
      } else {
        next(err);
      }
    });
  };
}

module.exports = { idempotent };
