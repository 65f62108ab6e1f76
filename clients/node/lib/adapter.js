// What the framework adapters share: reading and parsing the body, the
// call of the core, and the answer to an error.
'use strict';

const { HttpError } = require('../index');

const MAX_BODY = 1 << 20;

// The body of a node:http request as a Buffer, at most `limit` bytes (413
// beyond).
function readBody(req, limit = MAX_BODY) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > limit) reject(new HttpError(413, 'BODY_TOO_LARGE', 'the body is too large'));
      else chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// The body as text: JSON is UTF-8, and bytes that are not (which a lenient
// decoding would turn into U+FFFD, different bodies into the same request
// and fingerprint) are the client's bad request.
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function decodeText(raw) {
  try {
    return utf8.decode(raw);
  } catch {
    throw new HttpError(400, 'INVALID_JSON', 'the body is not valid JSON');
  }
}

async function readText(req, maxBody) {
  return decodeText(await readBody(req, maxBody));
}

// How deep a body may nest arrays and objects (the outer one counts): the
// same limit in every library (clients/conformance.json), checked before
// any parser runs, so that no parser's recursion (or the server's) meets a
// body nested thousands deep.
const MAX_NESTING = 512;

// Whether JSON text nests arrays and objects deeper than limit (brackets
// inside strings are not counted).
function tooDeep(text, limit = MAX_NESTING) {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}

// JSON text as a value; an empty body is null.  Nested deeper than
// MAX_NESTING: 400 JSON_TOO_DEEP.  Not JSON: 400 INVALID_JSON.
function parseJson(text) {
  if (text === '') return null;
  if (tooDeep(text)) {
    throw new HttpError(400, 'JSON_TOO_DEEP', `the body nests arrays and objects more than ${MAX_NESTING} deep`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new HttpError(400, 'INVALID_JSON', 'the body is not valid JSON');
  }
}

// The Idempotency-Key of a node:http request (undefined: missing).  The
// header holds one key: two header lines (which node:http joins with ", ")
// or a comma in the value (HTTP lets a proxy join two lines so) are the
// client's bad key, 400.
const ONE_KEY = 'send one Idempotency-Key header, holding one key (no comma)';

function keyOf(req) {
  const raw = req.rawHeaders || [];
  let lines = 0;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].length === 15 && raw[i].toLowerCase() === 'idempotency-key') lines++;
  }
  const key = req.headers['idempotency-key'];
  if (lines > 1 || (typeof key === 'string' && key.includes(','))) {
    throw new HttpError(400, 'IDEMPOTENCY_KEY_INVALID', ONE_KEY);
  }
  return key;
}

function checkOptions(idem, options, handler) {
  if (!idem || typeof idem.run !== 'function') throw new TypeError('an Idempotency instance is required');
  if (!options || typeof options.operation !== 'string') throw new TypeError('options.operation is required');
  if (typeof handler !== 'function') throw new TypeError('a handler function is required');
}

// Run the handler for a request through the core: key and body as the
// framework gives them; `text` is the body's JSON text when the adapter
// read it itself (sent as is, so the fingerprint is of what the client
// sent), else the parsed body is sent.  options: operation, the claim's
// options, external (the three-transaction form), validateRequest(req,
// body) (checks before the claim: an HttpError it throws is answered and
// nothing is stored), request(req, body) (what the fingerprint covers,
// default the body), tenant(req) (default options.tenant).
async function execute(idem, options, { req, key, body, text }, handler) {
  const { request, tenant, external, operation, validateRequest, ...claim } = options;
  if (validateRequest) await validateRequest(req, body);
  const call = { ...claim, operation, key };
  if (typeof tenant === 'function') call.tenant = tenant(req);
  else if (tenant !== undefined) call.tenant = tenant;
  if (request) {
    call.request = request(req, body);
  } else if (text !== undefined) {
    call.request = text === '' ? null : text;
    call.rawRequest = true;
  } else {
    call.request = body === undefined ? null : body;
  }
  if (external) return idem.runExternal(call, (ctx) => handler({ ...ctx, req, body }));
  return idem.run(call, (client, ctx) => handler(client, { ...ctx, req, body }));
}

// The answer to an error that the framework does not handle itself: an
// HttpError's own, else 500 (the transaction rolled back: a retry proceeds).
function errorAnswer(err, onError, req) {
  if (err instanceof HttpError) return err.toResponse();
  if (onError) onError(err, req);
  return new HttpError(500, 'INTERNAL_ERROR', 'the request failed; try again').toResponse();
}

// Send { status, headers ([name, value] pairs, in order, repeats kept),
// body } on a node:http response.  Headers set before (by a framework) stay;
// writeHead would then set each name once, so the pairs are appended.
function writeResponse(res, response) {
  const length = String(response.body.length);
  if (res.getHeaderNames().length === 0) {
    const flat = [];
    for (const [name, value] of response.headers) flat.push(name, value);
    flat.push('Content-Length', length);
    res.writeHead(response.status, flat);
  } else {
    for (const [name, value] of response.headers) res.appendHeader(name, value);
    res.setHeader('Content-Length', length);
    res.writeHead(response.status);
  }
  res.end(response.body);
}

// writeResponse, for an answer that node:http may refuse (a replay of a
// header it cannot send, stored by another client of the records): the
// error returned, the headers set dropped, for the caller to answer it; the
// connection ended when the head was already out.
function sendResponse(res, response) {
  try {
    writeResponse(res, response);
    return null;
  } catch (err) {
    if (res.headersSent) {
      res.destroy(err);
      return null;
    }
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    return err;
  }
}

module.exports = {
  readBody, readText, decodeText, parseJson, checkOptions, execute, errorAnswer, writeResponse, sendResponse, MAX_BODY,
  MAX_NESTING, tooDeep, keyOf,
};
