// The Idempotency-Key pattern on the idempotency PostgreSQL extension, over
// node-postgres (`pg`).
//
// Two forms, each one call:
//
//   idem.run(call, handler)          one transaction: the claim, the
//                                    handler's writes (on the claim's
//                                    client) and the completion commit
//                                    together;
//   idem.runExternal(call, handler)  three: the claim commits with a lease,
//                                    the handler calls something outside the
//                                    database while the lease is extended,
//                                    then the outcome commits.
//
// Both resolve to the HTTP answer, { status, headers, body, outcome,
// replayed }, every outcome of idem_claim mapped as the README's table says.
//
// Round trips of run(): a new key takes three (BEGIN with the claim, the
// handler's own statements, the completion with COMMIT), a retry one (the
// answer is returned as soon as the claim is; the replay's transaction,
// which wrote nothing, is committed by the next claim on the connection,
// COMMIT;BEGIN;EXECUTE in one round trip, or by a COMMIT of its own after a
// millisecond).  To fold statements into one query string the values are written
// into the SQL as literals, quoted as libpq's PQescapeLiteral does, which is
// exact for UTF-8, the only client encoding node-postgres speaks.
//
// Plans are kept per connection: the claim, idem_complete and idem_fail are
// PREPAREd together, once per physical connection (and shape of the claim's
// options), and run() sends `BEGIN;EXECUTE ...(literals)` and
// `EXECUTE ...(literals);COMMIT`, which the server neither parses nor plans
// again.  Behind a pooler that moves a client between server connections
// (pgbouncer in transaction mode, which keeps no prepared statements), a
// statement prepared on one server connection is missing on the next: the
// first sign of it (SQLSTATE 26000 at the claim, the transaction's first
// statement, with nothing written yet; or 42P05 at a PREPARE) rolls back,
// and the instance goes on unprepared for good.  preparedStatements: false
// never prepares.
'use strict';

const { createHash } = require('node:crypto');
const { validateHeaderName, validateHeaderValue } = require('node:http');

// SQLSTATEs of idem_claim's invalid input: a missing or invalid key.
const BAD_KEY = new Set(['22023', '22004']);
// The request was not JSON that jsonb accepts (a \u0000 escape, say),
// a number outside numeric's range (22003), or bytes that are not UTF-8 (22021).
const BAD_REQUEST = new Set(['22P02', '22P05', '22003', '22021']);
const STALE_TOKEN = '55000';
// A prepared statement missing (26000), or one of that name already there
// (42P05): the connection is not the one the statements were prepared on.
const NOT_PREPARED = '26000';
const ALREADY_PREPARED = '42P05';
// idem_claim_text refused after the question at the first call said it was
// usable: EXECUTE revoked (42501), or the function gone (42883).
const CLAIM_TEXT_REFUSED = new Set(['42501', '42883']);
// run()'s claim refused by idem_claim_text: sent again to idem_claim.
const AGAIN = Symbol('again');

const JSON_TYPE = ['Content-Type', 'application/json'];
const EMPTY = Buffer.alloc(0);

// The columns of idem_claim's row that the answer needs.
// body as jsonb's text: a body stored without raw_body is replayed as that
// text, compacted (compactJson), as every library replays it; parsed into
// JavaScript values, its numbers would change (1.10 as 1.1, big integers
// rounded).
const DECISION_COLUMNS =
  'outcome, token, attempt, recovery_point, http_status, headers, body::text AS body, error_code, retry_after, raw_body';

// JSON text without the whitespace outside its strings.
function compactJson(text) {
  let out = '';
  let from = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) {
      out += text.slice(from, i);
      from = i + 1;
    }
  }
  return out + text.slice(from);
}

const MESSAGES = {
  in_progress: 'a request with this Idempotency-Key is still being processed; retry after Retry-After seconds',
  mismatch: 'this Idempotency-Key was used for a different request',
  unknown: 'the outcome of an earlier attempt with this Idempotency-Key is unknown; query the resource before retrying',
  expired: 'this Idempotency-Key has expired; look the resource up by its business reference before sending the command again with a new key',
  rate_limited: 'too many new requests; send it again after Retry-After seconds, with the same Idempotency-Key',
};

// An answer that is not stored: thrown by a handler, the transaction rolls
// back (a retry proceeds) and the client gets this status and error code.
class HttpError extends Error {
  constructor(status, errorCode, message) {
    super(message);
    this.name = 'HttpError';
    this.status = status;
    this.errorCode = errorCode;
  }

  toResponse() {
    return jsonResponse(this.status, { error_code: this.errorCode, message: this.message });
  }
}

// Thrown by an external-call handler that failed before any side effect:
// the attempt is recorded as retryable (idem_fail(retryable => true)), so
// that a retry with the same key runs again, and the client gets 503.
class RetryableError extends Error {
  constructor(message, { status = 503, retryAfter = 1 } = {}) {
    super(message);
    this.name = 'RetryableError';
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// A completion refused because the attempt lost its lease to another one
// (SQLSTATE 55000): its outcome was not stored.
class LeaseLostError extends Error {
  constructor(cause) {
    super(`the attempt lost its lease; its outcome was not stored: ${cause.message}`);
    this.name = 'LeaseLostError';
    this.cause = cause;
  }
}

// A string as an SQL literal, as PQescapeLiteral writes it: quotes doubled,
// and with a backslash, E'' with backslashes doubled, so that it reads the
// same whatever standard_conforming_strings says.  NUL cannot be sent.
function literal(value) {
  const s = String(value);
  if (s.includes('\0')) throw new RangeError('a string sent to PostgreSQL cannot contain NUL');
  const quoted = s.replace(/'/g, "''");
  return s.includes('\\') ? ` E'${quoted.replace(/\\/g, '\\\\')}'` : `'${quoted}'`;
}

function identifier(name) {
  if (name.includes('\0')) throw new RangeError('an identifier cannot contain NUL');
  return `"${name.replace(/"/g, '""')}"`;
}

function bytea(buffer) {
  return `decode('${buffer.toString('hex')}', 'hex')`;
}

// An interval argument: a number of milliseconds or PostgreSQL interval text.
function interval(value) {
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0) throw new RangeError(`not a duration: ${value}`);
    return literal(`${value} milliseconds`);
  }
  return literal(value);
}

const jsonResponse = (status, value, extra = []) =>
  ({ status, headers: [JSON_TYPE, ...extra], body: Buffer.from(JSON.stringify(value)) });

function errorResponse(status, errorCode, message, extra) {
  return jsonResponse(status, { error_code: errorCode, message }, extra);
}

// The answer to an outcome other than proceed (README, "HTTP mapping").
function answer(decision) {
  const { outcome } = decision;
  let response;
  switch (outcome) {
    case 'replay': {
      const headers = decision.headers == null ? []
        : Array.isArray(decision.headers) ? decision.headers.slice()
          : Object.entries(decision.headers);
      headers.push(['Idempotent-Replayed', 'true']);
      let body = decision.raw_body;
      if (body == null) body = decision.body == null ? EMPTY : Buffer.from(compactJson(decision.body));
      response = { status: decision.http_status, headers, body };
      break;
    }
    case 'in_progress':
    case 'rate_limited':
      response = errorResponse(decision.http_status, decision.error_code, MESSAGES[outcome],
        [['Retry-After', String(decision.retry_after)]]);
      break;
    case 'mismatch':
    case 'unknown':
    case 'expired':
      response = errorResponse(decision.http_status, decision.error_code, MESSAGES[outcome]);
      break;
    default:
      throw new Error(`unexpected outcome of idem_claim: ${outcome}`);
  }
  response.outcome = outcome;
  response.replayed = outcome === 'replay';
  return response;
}

// A handler's header pairs, each one node:http can send (checked before it
// is stored: a header it refuses, a character above U+00FF say, would make
// the answer and every replay of it throw where it is written).
function headerPairs(headers) {
  if (headers == null) return [];
  const pairs = Array.isArray(headers) ? headers : Object.entries(headers);
  return pairs.map(([name, value]) => {
    const pair = [String(name), String(value)];
    validateHeaderName(pair[0]);
    validateHeaderValue(pair[0], pair[1]);
    return pair;
  });
}

const hasHeader = (pairs, name) => pairs.some(([n]) => n.toLowerCase() === name);

// What a handler returns, as the bytes and header pairs sent and stored:
// { status, headers (object or [name, value] pairs), body (Buffer, string,
// or any other value, sent as JSON), resourceId, failed, retryable }.
function toResponse(result) {
  if (result === null || typeof result !== 'object') {
    throw new TypeError('an idempotent handler must return { status, headers, body }');
  }
  const status = result.status === undefined ? 200 : result.status;
  if (!Number.isInteger(status) || status < 100 || status > 599) {
    throw new RangeError(`not an HTTP status: ${status}`);
  }
  const headers = headerPairs(result.headers);
  let { body } = result;
  if (body == null) {
    body = EMPTY;
  } else if (typeof body === 'string') {
    body = Buffer.from(body);
  } else if (body instanceof Uint8Array) {
    body = Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  } else {
    body = Buffer.from(JSON.stringify(body));
    if (!hasHeader(headers, 'content-type')) headers.unshift(JSON_TYPE);
  }
  return {
    status, headers, body,
    resourceId: result.resourceId == null ? null : String(result.resourceId),
    failed: Boolean(result.failed || result.retryable),
    retryable: Boolean(result.retryable),
  };
}

// The claim's options: the call's name, idem_claim's argument, its type,
// the quoting of a value.
const claimOptions = [
  ['tenant', 'tenant', 'text', literal], ['caller', 'caller', 'text', literal],
  ['ttl', 'ttl', 'interval', interval], ['lease', 'lease', 'interval', interval],
  ['wait', 'wait', 'interval', interval],
  ['onLeaseExpiry', 'on_lease_expiry', 'text', literal], ['onExpired', 'on_expired', 'text', literal],
];

// The statements prepared on each physical connection: the client object
// (pg.Pool hands out the same one for a connection) -> the names of the
// statement sets prepared on it.
const preparedOn = new WeakMap();

// bytea as a literal in hex: '\x...' read the same whatever
// standard_conforming_strings says.
const byteaLiteral = (buffer) => `E'\\\\x${buffer.toString('hex')}'`;

class Idempotency {
  // pool: a pg.Pool (anything with connect() and query()).  options: the
  // defaults of every call (operation, tenant, caller, ttl, lease, wait,
  // onLeaseExpiry, onExpired), schema (the extension's schema when it is not
  // on the search_path) and preparedStatements (default true: prepared per
  // connection, unprepared for good at the first sign of a pooler that
  // moves the client between server connections; false: never prepared).
  // Durations are milliseconds or interval text.
  constructor(pool, options = {}) {
    if (!pool || typeof pool.connect !== 'function' || typeof pool.query !== 'function') {
      throw new TypeError('new Idempotency(pool): a pg.Pool is required');
    }
    const { schema, preparedStatements = true, ...defaults } = options;
    this.pool = pool;
    this.defaults = defaults;
    this.prefix = schema ? `${identifier(schema)}.` : '';
    // Whether run() prepares its statements; false once a pooler was seen.
    this.preparedStatements = Boolean(preparedStatements);
    this.statementSets = new Map(); // the claim's options present -> its statement set
    // Clients whose replay's transaction (read-only) is still open: the next
    // claim takes one and sends COMMIT in front of its BEGIN; the rest are
    // committed and released within a millisecond.
    this.parked = []; // [client, its 'error' listener]
    this.parkTimer = null;
    this.parkMillis = 1;
    // Whether claims can go to idem_claim_text: undefined until asked (at
    // the first call), then true or false.
    this.claimText = undefined;
  }

  // Whether a claim of this shape goes to idem_claim_text: no option given
  // but the tenant, and the function there for this role.
  textClaim(shape) {
    return this.claimText === true && (shape === '' || shape === '0');
  }

  // Ask the server, once, whether idem_claim_text is there for this role.
  // An error leaves it unknown (asked again at the next call); the call
  // goes to idem_claim meanwhile.
  async learnClaimText() {
    const name = `${this.prefix}idem_claim_text(text, text, text, text)`;
    try {
      const { rows: [row] } = await this.pool.query(
        "SELECT coalesce(has_function_privilege(to_regprocedure($1), 'EXECUTE'), false) AS usable", [name]);
      this.claimText = row.usable === true;
    } catch {
      this.claimText = undefined;
    }
  }

  // A call with the instance's defaults, its values as literals: args, the
  // claim's arguments in order (operation, key, request, then the options
  // given), and shape, the options given (their places in claimOptions).
  claimArguments(call) {
    const c = { ...this.defaults, ...call };
    if (typeof c.operation !== 'string' || c.operation === '') {
      throw new TypeError('an idempotent call needs an operation');
    }
    let request = 'NULL';
    if (c.request !== undefined && c.request !== null) {
      request = literal(c.rawRequest ? c.request : JSON.stringify(c.request));
    }
    const args = [literal(c.operation), literal(c.key), request];
    let shape = '';
    for (let i = 0; i < claimOptions.length; i++) {
      const [option, , , quote] = claimOptions[i];
      if (c[option] !== undefined && c[option] !== null) {
        args.push(quote(c[option]));
        shape += i;
      }
    }
    // idem_claim_text takes its four arguments all given (a default would
    // be read back from the catalog at every call).
    if (shape === '' && this.textClaim(shape)) args.push("''");
    return { args, shape };
  }

  // idem_claim's SELECT over the arguments given: literals, or parameters.
  // A call with no option but the tenant goes to idem_claim_text where the
  // server has it (version 1.2) and lets this role run it: the same answer
  // and records, its request read from the text, four arguments all given.
  claimSelect(args, shape, castRequest) {
    if (this.textClaim(shape)) {
      return `SELECT ${DECISION_COLUMNS} FROM ${this.prefix}idem_claim_text(${args.join(', ')})`;
    }
    let sql = `SELECT ${DECISION_COLUMNS} FROM ${this.prefix}idem_claim(${args[0]}, ${args[1]}, ${
      castRequest && args[2] !== 'NULL' ? `${args[2]}::jsonb` : args[2]}`;
    for (let i = 0, next = 3; i < claimOptions.length; i++) {
      if (shape.includes(i)) sql += `, ${claimOptions[i][1]} => ${args[next++]}`;
    }
    return `${sql})`;
  }

  // The SELECT of idem_claim for a call, every value a literal.
  claimSql(call) {
    const { args, shape } = this.claimArguments(call);
    return this.claimSelect(args, shape, true);
  }

  // The statements prepared together for a shape of the claim's options:
  // the claim, idem_complete and idem_fail, named after a hash of their
  // text, so that a name always means the same statements.
  statementSet(shape) {
    const text = this.textClaim(shape);
    let set = this.statementSets.get(`${text}:${shape}`);
    if (set !== undefined) return set;
    const types = text ? ['text', 'text', 'text', 'text'] : ['text', 'text', 'jsonb'];
    if (!text) claimOptions.forEach(([, , type], i) => { if (shape.includes(i)) types.push(type); });
    const claim = this.claimSelect(types.map((t, i) => `$${i + 1}`), shape, false);
    const complete = `SELECT ${this.prefix}idem_complete($1, $2, headers => $3, raw_body => $4, resource_id => $5)`;
    const fail = `SELECT ${this.prefix}idem_fail($1, $2, headers => $3, raw_body => $4, retryable => $5)`;
    const base = `idem_${createHash('sha256').update(`${claim}\n${complete}\n${fail}`).digest('hex').slice(0, 24)}`;
    set = {
      base, claim: `${base}_c`, complete: `${base}_k`, fail: `${base}_f`,
      prepare: `PREPARE ${base}_c(${types.join(', ')}) AS ${claim};`
        + `PREPARE ${base}_k(text, integer, jsonb, bytea, text) AS ${complete};`
        + `PREPARE ${base}_f(text, integer, jsonb, bytea, boolean) AS ${fail}`,
    };
    this.statementSets.set(`${text}:${shape}`, set);
    return set;
  }

  // The statement set of a shape, prepared on the client's connection if it
  // was not yet; null when run() is to go unprepared.  A set is prepared in
  // one query string, all three or (when the first name exists) none: a
  // server connection that has the claim has the completions too.
  async prepareOn(client, shape) {
    if (!this.preparedStatements) return null;
    const set = this.statementSet(shape);
    let names = preparedOn.get(client);
    if (names === undefined) {
      names = new Set();
      preparedOn.set(client, names);
    }
    if (names.has(set.base)) return set;
    try {
      await client.query(set.prepare);
    } catch (err) {
      if (err.code !== ALREADY_PREPARED) throw err;
      // Already there though never prepared on this client: a pooler's
      // server connection, prepared through another client.
      this.preparedStatements = false;
      return null;
    }
    names.add(set.base);
    return set;
  }

  // BEGIN and the claim, one round trip: [the row of idem_claim, the
  // statement set the transaction goes on with, null for none].  A prepared
  // claim that the server connection does not have (26000) did nothing:
  // rolled back, and sent again unprepared, as every later call is.
  // With pending, the client's transaction is a replay's still open: its
  // COMMIT goes in front.
  async claimOn(client, set, args, shape, pending) {
    const commit = pending ? 'COMMIT;' : '';
    if (set !== null) {
      try {
        return [(await client.query(`${commit}BEGIN;EXECUTE ${set.claim}(${args.join(', ')})`)).at(-1).rows[0], set];
      } catch (err) {
        if (err.code !== NOT_PREPARED) throw err;
        await client.query('ROLLBACK');
        preparedOn.delete(client);
        this.preparedStatements = false;
      }
    }
    return [(await client.query(`${commit}BEGIN;${this.claimSelect(args, shape, true)}`)).at(-1).rows[0], null];
  }

  // A replay's client, its read-only transaction open (idem_claim's replay
  // writes nothing, locks no row): kept for the next claim, which commits
  // it in the same round trip as its own BEGIN, instead of a COMMIT of its
  // own; committed and released after a millisecond if no claim comes.
  // While parked, no query is running on the client: an error of its
  // connection (the server ended it) comes as an 'error' event, which the
  // pool does not listen to on a client it handed out; it is caught here and
  // the client released as broken.
  park(client) {
    const onError = (err) => {
      const i = this.parked.findIndex(([c]) => c === client);
      if (i >= 0) this.parked.splice(i, 1);
      client.removeListener('error', onError);
      client.on('error', () => {}); // later errors of the same broken connection
      client.release(err);
    };
    if (typeof client.on === 'function') client.on('error', onError);
    this.parked.push([client, onError]);
    if (this.parkTimer === null) this.parkTimer = setTimeout(() => this.unpark(), this.parkMillis);
  }

  // A parked client back in use: its 'error' listener removed.
  static unparked([client, onError]) {
    if (typeof client.removeListener === 'function') client.removeListener('error', onError);
    return client;
  }

  // Commit the parked clients' transactions and release them.
  unpark() {
    clearTimeout(this.parkTimer);
    this.parkTimer = null;
    for (const entry of this.parked.splice(0)) Idempotency.commitAndRelease(Idempotency.unparked(entry));
  }

  static commitAndRelease(client) {
    client.query('COMMIT').then(() => client.release(), (err) => client.release(err));
  }

  // A parked client that can run the claim of this shape as it is (with its
  // statements prepared, when they are to be), or null.
  takeParked(shape) {
    while (this.parked.length > 0) {
      const client = Idempotency.unparked(this.parked.pop());
      if (!this.preparedStatements) return client;
      const names = preparedOn.get(client);
      if (names !== undefined && names.has(this.statementSet(shape).base)) return client;
      Idempotency.commitAndRelease(client);
    }
    return null;
  }

  // The completion of an attempt with the handler's response: the EXECUTE
  // of the set's statement, or without one, the SELECT.
  finishSql(token, response, set = null) {
    const headers = literal(JSON.stringify(response.headers));
    if (set !== null) {
      const last = response.failed ? String(response.retryable)
        : response.resourceId === null ? 'NULL' : literal(response.resourceId);
      return `EXECUTE ${response.failed ? set.fail : set.complete}(${literal(token)}, ${response.status}, ${
        headers}, ${byteaLiteral(response.body)}, ${last})`;
    }
    let sql = response.failed ? `SELECT ${this.prefix}idem_fail(` : `SELECT ${this.prefix}idem_complete(`;
    sql += `${literal(token)}, ${response.status}, headers => ${headers}::jsonb, raw_body => ${
      bytea(response.body)}`;
    if (response.failed) sql += `, retryable => ${response.retryable}`;
    else if (response.resourceId !== null) sql += `, resource_id => ${literal(response.resourceId)}`;
    return `${sql})`;
  }

  // The 400 of a key that is missing or cannot be sent; null when it can.
  static checkKey(key) {
    if (key === undefined || key === null) {
      return errorResponse(400, 'IDEMPOTENCY_KEY_MISSING', 'the Idempotency-Key header is required');
    }
    if (typeof key !== 'string' || key.includes('\0')) {
      return errorResponse(400, 'IDEMPOTENCY_KEY_INVALID', 'the Idempotency-Key must be printable ASCII');
    }
    return null;
  }

  // A claim that raised: the client's fault (400) or a real error (thrown).
  static claimError(err) {
    if (BAD_KEY.has(err.code)) return errorResponse(400, 'IDEMPOTENCY_KEY_INVALID', err.message);
    if (BAD_REQUEST.has(err.code)) return errorResponse(400, 'INVALID_REQUEST', err.message);
    throw err;
  }

  // One transaction.  call: { operation, key, request, tenant, ... } (the
  // request is any JSON value, or JSON text with rawRequest: true).
  // handler(client, ctx) runs only for a new key (or a new attempt), inside
  // the claim's transaction, on its client; ctx holds key, token, attempt
  // and recoveryPoint.  It returns the response (see toResponse); with
  // failed: true it is stored with idem_fail and replayed.  When it throws,
  // everything rolls back and the error is thrown again: a retry proceeds.
  async run(call, handler) {
    const bad = Idempotency.checkKey(call.key);
    if (bad) return { ...bad, outcome: null, replayed: false };
    if (this.claimText === undefined) await this.learnClaimText();
    const result = await this.runOnce(call, handler);
    // idem_claim_text refused the claim (nothing was written, the client is
    // back in the pool): this call and every later one go to idem_claim.
    return result === AGAIN ? this.runOnce(call, handler) : result;
  }

  async runOnce(call, handler) {
    const { args, shape } = this.claimArguments(call);
    const text = this.textClaim(shape);
    let client = this.takeParked(shape);
    const pending = client !== null;
    if (!pending) client = await this.pool.connect();
    let open = true;
    // While the call holds the client, an error of its connection with no
    // query running (the server ended it while the handler awaits
    // something else) comes as an 'error' event, which the pool does not
    // listen to on a client it handed out: caught here, and the client
    // released as broken.  The listener stays on a broken client.
    let broken;
    const onError = (err) => { broken = broken ?? err; };
    const listens = typeof client.on === 'function';
    if (listens) client.on('error', onError);
    const letGo = () => { if (listens && broken === undefined) client.removeListener('error', onError); };
    try {
      let decision;
      let set;
      try {
        [decision, set] = await this.claimOn(client, await this.prepareOn(client, shape), args, shape, pending);
      } catch (err) {
        if (text && CLAIM_TEXT_REFUSED.has(err.code)) {
          this.claimText = false;
          return AGAIN;
        }
        return { ...Idempotency.claimError(err), outcome: null, replayed: false };
      }
      if (decision.outcome !== 'proceed') {
        // Answered now; the claim's transaction commits behind the answer
        // (a claim that found an ended lease may have made the record
        // unknown), before the client goes back to the pool; a replay's,
        // which wrote nothing, with the next claim's BEGIN.
        open = false;
        letGo();
        if (decision.outcome === 'replay') this.park(client);
        else Idempotency.commitAndRelease(client);
        return answer(decision);
      }
      const ctx = {
        key: call.key, token: decision.token, attempt: decision.attempt,
        recoveryPoint: decision.recovery_point,
      };
      const response = toResponse(await handler(client, ctx));
      try {
        await client.query(`${this.finishSql(decision.token, response, set)};COMMIT`);
      } catch (err) {
        // Not committed: rolled back below.  A prepared completion missing
        // (the handler deallocated it) is prepared again next time.
        if (err.code === NOT_PREPARED) preparedOn.delete(client);
        throw err;
      }
      open = false;
      letGo();
      client.release();
      return {
        status: response.status, headers: response.headers, body: response.body,
        outcome: 'proceed', replayed: false,
      };
    } finally {
      if (open) {
        await client.query('ROLLBACK').catch((err) => { broken = broken ?? err; });
        letGo();
        client.release(broken);
      }
    }
  }

  // Three transactions, for a side effect outside the database.  The claim
  // commits a processing record with a lease (call.lease, milliseconds,
  // default 30 s), extended every third of it while handler(ctx) runs; the
  // response it returns is then committed with idem_complete (idem_fail
  // with failed: true).  ctx: key, token, attempt, recoveryPoint, signal
  // (aborted when the lease is lost), checkpoint(point), deriveKey(step).
  // When the handler throws RetryableError the attempt is stored as
  // retryable; any other error leaves the record processing, and once its
  // lease ends, retries answer unknown (409 IDEMPOTENCY_OUTCOME_UNKNOWN) or,
  // with onLeaseExpiry: 'retry', proceed from the last checkpoint.
  async runExternal(call, handler) {
    const bad = Idempotency.checkKey(call.key);
    if (bad) return { ...bad, outcome: null, replayed: false };
    const lease = call.lease ?? this.defaults.lease ?? 30000;
    if (typeof lease !== 'number' || !(lease > 0)) {
      throw new RangeError('runExternal: lease must be a positive number of milliseconds');
    }
    let decision;
    try {
      decision = (await this.pool.query(this.claimSql({ ...call, lease }))).rows[0];
    } catch (err) {
      return { ...Idempotency.claimError(err), outcome: null, replayed: false };
    }
    if (decision.outcome !== 'proceed') return answer(decision);

    const { token } = decision;
    const controller = new AbortController();
    const onLost = (err) => {
      if (err.code === STALE_TOKEN) controller.abort(new LeaseLostError(err));
    };
    const heartbeat = setInterval(() => {
      this.pool.query(`SELECT ${this.prefix}idem_heartbeat(${literal(token)}, ${interval(lease)})`)
        .catch(onLost);
    }, Math.max(lease / 3, 10));
    heartbeat.unref();
    const ctx = {
      key: call.key, token, attempt: decision.attempt, recoveryPoint: decision.recovery_point,
      signal: controller.signal,
      checkpoint: (point) => this.pool.query(
        `SELECT ${this.prefix}idem_checkpoint(${literal(token)}, ${literal(point)})`).then(() => undefined),
      deriveKey: async (step) => (await this.pool.query(
        `SELECT ${this.prefix}idem_derive_key(${literal(call.key)}, ${literal(step)}) AS k`)).rows[0].k,
    };
    let response;
    try {
      response = toResponse(await handler(ctx));
    } catch (err) {
      clearInterval(heartbeat);
      if (!(err instanceof RetryableError)) throw err;
      response = toResponse({
        ...errorResponse(err.status, 'RETRYABLE_FAILURE', err.message,
          [['Retry-After', String(err.retryAfter)]]),
        retryable: true,
      });
    }
    clearInterval(heartbeat);
    try {
      await this.pool.query(this.finishSql(token, response));
    } catch (err) {
      if (err.code === STALE_TOKEN) throw new LeaseLostError(err);
      throw err;
    }
    return {
      status: response.status, headers: response.headers, body: response.body,
      outcome: 'proceed', replayed: false,
    };
  }
}

module.exports = {
  Idempotency, HttpError, RetryableError, LeaseLostError, answer, toResponse, literal, compactJson,
};
