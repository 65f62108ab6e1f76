// The Express adapter: route middleware that runs a handler once per
// Idempotency-Key.
//
//   const { idempotent } = require('@idempotency/pg/express');
//   app.post('/payments', express.json(), idempotent(idem, { operation: 'payments.create' },
//     async (client, { body }) => ({ status: 201, body: { ... } })));
'use strict';

const {
  readText, parseJson, checkOptions, execute, writeResponse, sendResponse, MAX_BODY,
} = require('./lib/adapter');
const { HttpError } = require('./index');

// (req, res, next) middleware.  The request is req.body when a body parser
// ran (express.json()), else the body is read and parsed here.  An HttpError
// is answered; other errors go to next(err), the app's error handler.
function idempotent(idem, options, handler) {
  checkOptions(idem, options, handler);
  const { maxBody = MAX_BODY, ...rest } = options;
  return function idempotentMiddleware(req, res, next) {
    (async () => {
      let { body } = req;
      let text;
      if (body === undefined) {
        text = await readText(req, maxBody);
        body = parseJson(text);
      }
      return execute(idem, rest, { req, key: req.headers['idempotency-key'], body, text }, handler);
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
