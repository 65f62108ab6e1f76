"""The Idempotency-Key pattern on the idempotency PostgreSQL extension.

What every form shares: the SQL of the calls, the answer to each outcome of
idem_claim (the README's HTTP mapping), and what a handler returns.  The
synchronous core, over psycopg 3 or psycopg2, is `Idempotency`; the
asynchronous one (psycopg 3) is `idempotency_pg.aio.AsyncIdempotency`.

A call is one transaction: the claim, the handler's writes on the claim's
connection, and the completion commit together.  Round trips for a new key:
three (BEGIN with the claim, the handler's statements, the completion with
COMMIT), each pair one query string of literals (Calls) that both drivers
send as it is, in the simple protocol: nothing to prepare, so it works
through pgbouncer in transaction mode, and it costs the service less CPU
than binding parameters or pipeline mode.  A retry: one round trip before
its answer (the claim), then its COMMIT.
"""

import json
import logging
import re
import sys
import threading
from contextlib import contextmanager

# SQLSTATEs of idem_claim's invalid input: a missing or invalid key.
BAD_KEY = ("22023", "22004")
# The request was not JSON that jsonb accepts (a \\u0000 escape, say), a
# number beyond numeric's range (22003), or bytes that are not UTF-8 (22021).
BAD_REQUEST = ("22P02", "22P05", "22003", "22021")
STALE_TOKEN = "55000"
# idem_claim_text refused after the question at the first call said it was
# usable: EXECUTE revoked (42501), or the function gone (42883).
CLAIM_TEXT_REFUSED = ("42501", "42883")
# run()'s claim refused by idem_claim_text: sent again to idem_claim.
AGAIN = object()

JSON_TYPE = ("Content-Type", "application/json")

COLUMNS = ("outcome", "token", "attempt", "recovery_point", "http_status", "headers",
           "body", "error_code", "retry_after", "raw_body")

# body as jsonb's text: a body stored without raw_body is replayed as that
# text, compacted (compact_json), as every library replays it; parsed, its
# numbers would change (1.10 as 1.1).
SELECT_LIST = ", ".join("body::text" if c == "body" else c for c in COLUMNS)


def compact_json(text):
    """JSON text without the whitespace outside its strings."""
    out, start, in_string, escaped = [], 0, False, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in " \t\n\r":
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return "".join(out)


MESSAGES = {
    "in_progress": "a request with this Idempotency-Key is still being processed; retry after Retry-After seconds",
    "mismatch": "this Idempotency-Key was used for a different request",
    "unknown": "the outcome of an earlier attempt with this Idempotency-Key is unknown; query the resource before retrying",
    "expired": "this Idempotency-Key has expired; look the resource up by its business reference before sending the command again with a new key",
    "rate_limited": "too many new requests; send it again after Retry-After seconds, with the same Idempotency-Key",
}

# The claim's options and their SQL argument names.
CLAIM_OPTIONS = (("tenant", "tenant", ""), ("caller", "caller", ""), ("ttl", "ttl", "::interval"),
                 ("lease", "lease", "::interval"), ("wait", "wait", "::interval"),
                 ("on_lease_expiry", "on_lease_expiry", ""), ("on_expired", "on_expired", ""))


class Response:
    """The answer to send: status, headers ([name, value] pairs, in order,
    repeats kept), body (bytes); outcome (None when the key was refused
    before the claim) and replayed."""

    __slots__ = ("status", "headers", "body", "outcome", "replayed", "close")

    def __init__(self, status, headers, body, outcome=None, replayed=False):
        self.status, self.headers, self.body = status, headers, body
        self.outcome, self.replayed = outcome, replayed
        self.close = _nothing  # what is left once the answer is sent (Idempotency.run's defer_commit)

    def header(self, name):
        name = name.lower()
        return next((v for n, v in self.headers if n.lower() == name), None)

    def __repr__(self):
        return "Response(%r, %r, %r, outcome=%r)" % (self.status, self.headers, self.body[:80], self.outcome)


def _nothing():
    pass


class _Commit:
    """The close() of a Response whose claim's COMMIT was deferred: sends it
    and gives the connection back, once.  A COMMIT that fails then (the
    answer is sent) is logged, and its connection closed."""

    def __init__(self, idem, conn, driver):
        self.idem, self.conn, self.driver = idem, conn, driver

    def __call__(self):
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            self.idem._end(conn, self.driver, "COMMIT")
        except Exception as err:
            logging.getLogger("idempotency_pg").error("the COMMIT of a claim after its answer failed: %s", err)


class HttpError(Exception):
    """An answer that is not stored: raised by a handler, the transaction
    rolls back (a retry proceeds) and the client gets this status."""

    def __init__(self, status, error_code, message):
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message

    def response(self):
        return error_response(self.status, self.error_code, self.message)


class RetryableError(Exception):
    """Raised by an external-call handler that failed before any side effect:
    stored as retryable (a retry runs again); the client gets 503."""

    def __init__(self, message, status=503, retry_after=1):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class LeaseLostError(Exception):
    """The attempt's lease was taken over (SQLSTATE 55000): its outcome was
    not stored."""


# An HTTP token (RFC 9110): what a header name may be.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# What a header value may not hold, as the strictest server (node:http)
# checks it: a control character other than HTAB, DEL, or a character above
# U+00FF (which servers that write latin-1 refuse, or write as one byte each).
_BAD_VALUE = re.compile(r"[^\t\x20-\x7e\x80-\xff]")


def header_problem(name, value):
    """Why the strictest server (node:http) would refuse to send a header,
    or None when it sends it."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return "invalid header name %r" % (name,)
    if not isinstance(value, str) or _BAD_VALUE.search(value):
        return "invalid character in the value of header %r" % (name,)
    return None


def encode(value):
    return json.dumps(value, separators=(",", ":")).encode()


def error_response(status, error_code, message, extra=()):
    return Response(status, [JSON_TYPE, *extra], encode({"error_code": error_code, "message": message}))


def answer(d):
    """The answer to a decision (a dict of idem_claim's row) other than proceed."""
    outcome = d["outcome"]
    if outcome == "replay":
        stored = d["headers"]
        headers = [tuple(h) for h in stored] if isinstance(stored, list) else list((stored or {}).items())
        # Stored by another client of the records: a header no server may
        # send is never sent (an error: the adapters answer 500).
        for n, v in headers:
            problem = header_problem(n, v)
            if problem is not None:
                raise ValueError("the stored answer cannot be replayed: " + problem)
        headers.append(("Idempotent-Replayed", "true"))
        body = d["raw_body"]
        body = bytes(body) if body is not None else (b"" if d["body"] is None else compact_json(d["body"]).encode())
        return Response(d["http_status"], headers, body, outcome, True)
    if outcome in ("in_progress", "rate_limited"):
        r = error_response(d["http_status"], d["error_code"], MESSAGES[outcome],
                           [("Retry-After", str(d["retry_after"]))])
    elif outcome in ("mismatch", "unknown", "expired"):
        r = error_response(d["http_status"], d["error_code"], MESSAGES[outcome])
    else:
        raise ValueError("unexpected outcome of idem_claim: %r" % outcome)
    r.outcome = outcome
    return r


def check_key(key):
    """The 400 of a key that is missing or cannot be sent; None when it can."""
    if key is None:
        return error_response(400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required")
    if not isinstance(key, str) or "\0" in key:
        return error_response(400, "IDEMPOTENCY_KEY_INVALID", "the Idempotency-Key must be printable ASCII")
    return None


def refuse(err):
    """The 400 answer to a claim that raised for the client's input (a bad
    key, a request jsonb refuses); any other error is raised again."""
    state = sqlstate(err)
    if state in BAD_KEY:
        return error_response(400, "IDEMPOTENCY_KEY_INVALID", err.diag.message_primary or str(err))
    if state in BAD_REQUEST:
        return error_response(400, "INVALID_REQUEST", str(err).strip())
    raise err


def lease_lost(err):
    """A completion that raised: LeaseLostError for a stale token, else the error."""
    if sqlstate(err) == STALE_TOKEN:
        raise LeaseLostError(str(err)) from err
    raise err


def attempt(key, d, **extra):
    """The handler's ctx for a decision that proceeds."""
    return dict(key=key, token=d["token"], attempt=d["attempt"], recovery_point=d["recovery_point"], **extra)


class Result:
    """What a handler returns: status, headers (a dict or [name, value]
    pairs), body (bytes, str, or any other value, sent as JSON),
    resource_id, failed (stored with idem_fail and replayed), retryable."""

    def __init__(self, status=200, headers=None, body=None, resource_id=None, failed=False, retryable=False):
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError("not an HTTP status: %r" % (status,))
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        pairs = [(str(n), str(v)) for n, v in pairs]
        # Checked before they are stored: a header no server may send would
        # fail the answer and every replay (or split it).
        for n, v in pairs:
            problem = header_problem(n, v)
            if problem is not None:
                raise ValueError(problem)
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode()
        elif isinstance(body, (bytes, bytearray, memoryview)):
            body = bytes(body)
        else:
            body = encode(body)
            if not any(n.lower() == "content-type" for n, _ in pairs):
                pairs.insert(0, JSON_TYPE)
        self.status, self.headers, self.body = status, pairs, body
        self.resource_id = None if resource_id is None else str(resource_id)
        self.failed, self.retryable = bool(failed or retryable), bool(retryable)

    @classmethod
    def retryable_failure(cls, err):
        """A RetryableError as the failure stored: a retry runs again."""
        return cls(err.status, [JSON_TYPE, ("Retry-After", str(err.retry_after))],
                   encode({"error_code": "RETRYABLE_FAILURE", "message": str(err)}), retryable=True)

    @classmethod
    def of(cls, value):
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, tuple):
            return cls(*value)
        raise TypeError("an idempotent handler returns a Result, a dict or (status, headers, body)")

    def response(self):
        return Response(self.status, self.headers, self.body, "proceed", False)


def literal(value):
    """A value as an SQL literal, as libpq's PQescapeLiteral writes it:
    quotes doubled, and with a backslash, E'' with backslashes doubled, so
    that it reads the same whatever standard_conforming_strings says.  NUL
    cannot be sent."""
    s = str(value)
    if "\0" in s:
        raise ValueError("a string sent to PostgreSQL cannot contain NUL")
    s = s.replace("'", "''")
    if "\\" in s:
        return " E'%s'" % s.replace("\\", "\\\\")
    return "'%s'" % s


def interval(value):
    """An interval argument: seconds (a number) or PostgreSQL interval text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = "%s seconds" % value
    return literal(value) + "::interval"


def bytea(value):
    return "decode('%s', 'hex')" % bytes(value).hex()


class Calls:
    """The SQL of the calls, every value a literal: one query string that
    any driver sends as it is, in one round trip with the BEGIN before it
    or the COMMIT after it, and that needs no prepared statement (pgbouncer
    in transaction mode)."""

    def __init__(self, schema=None, **defaults):
        if schema and "\0" in schema:
            raise ValueError("an identifier cannot contain NUL")
        self.prefix = "" if not schema else '"%s".' % schema.replace('"', '""')
        self.defaults = defaults
        self.head = "SELECT %s FROM %sidem_claim(" % (SELECT_LIST, self.prefix)
        self.text_head = "SELECT %s FROM %sidem_claim_text(" % (SELECT_LIST, self.prefix)
        # Whether a claim with no option but the tenant goes to
        # idem_claim_text (version 1.2: the same answer and records, the
        # request read from its text, four arguments all given): None until
        # the server was asked (learn()), then True or False.
        self.text = None

    def learn(self):
        """The question asked once: is idem_claim_text there for this role?"""
        return ("SELECT coalesce(has_function_privilege(to_regprocedure(%s), 'EXECUTE'), false)"
                % literal(self.prefix + "idem_claim_text(text, text, text, text)"))

    def refused(self, sql, err):
        """Whether err is idem_claim_text refusing the claim sql; if so, the
        claims go to idem_claim from now on."""
        if self.text_head in sql and sqlstate(err) in CLAIM_TEXT_REFUSED:
            self.text = False
            return True
        return False

    def claim(self, operation, key, request, raw_request=False, **options):
        """The SELECT of idem_claim; request is any JSON value, or JSON text
        with raw_request=True."""
        opts = {**self.defaults, **options} if self.defaults else options
        if not operation:
            operation = opts.get("operation")
        if not operation:
            raise TypeError("an idempotent call needs an operation")
        if request is not None and not raw_request:
            request = json.dumps(request, separators=(",", ":"))
        if self.text and all(opts.get(option) is None for option, _, _ in CLAIM_OPTIONS[1:]):
            return "%s%s, %s, %s, %s)" % (self.text_head, literal(operation), literal(key),
                                          "NULL" if request is None else literal(request),
                                          literal(opts.get("tenant") or ""))
        request = "NULL" if request is None else literal(request) + "::jsonb"
        sql = "%s%s, %s, %s" % (self.head, literal(operation), literal(key), request)
        for option, argument, cast in CLAIM_OPTIONS:
            value = opts.get(option)
            if value is not None:
                sql += ", %s => %s" % (argument, interval(value) if cast else literal(value))
        return sql + ")"

    def finish(self, token, result):
        if result.failed:
            return ("SELECT %sidem_fail(%s, %d, headers => %s::jsonb, raw_body => %s, retryable => %s)"
                    % (self.prefix, literal(token), result.status, literal(json.dumps(result.headers)),
                       bytea(result.body), "true" if result.retryable else "false"))
        return ("SELECT %sidem_complete(%s, %d, headers => %s::jsonb, raw_body => %s, resource_id => %s)"
                % (self.prefix, literal(token), result.status, literal(json.dumps(result.headers)),
                   bytea(result.body), "NULL" if result.resource_id is None else literal(result.resource_id)))

    def heartbeat(self, token, lease):
        return "SELECT %sidem_heartbeat(%s, %s)" % (self.prefix, literal(token), interval(lease))

    def checkpoint(self, token, point):
        return "SELECT %sidem_checkpoint(%s, %s)" % (self.prefix, literal(token), literal(point))

    def derive_key(self, key, step):
        return "SELECT %sidem_derive_key(%s, %s)" % (self.prefix, literal(key), literal(step))


def sqlstate(err):
    """The SQLSTATE of a psycopg 3 or psycopg2 error."""
    return getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)


def _driver(conn):
    ext = sys.modules.get("psycopg2.extensions")
    return _PSYCOPG2 if ext is not None and isinstance(conn, ext.connection) else _PSYCOPG3


class _Psycopg3:
    """A query string in the simple protocol (no parameters: psycopg sends
    it as it is, more than one statement allowed), never prepared."""

    @staticmethod
    def claim(conn, sql):
        cur = conn.execute("BEGIN;" + sql, prepare=False)
        cur.nextset()
        return cur.fetchone()

    @staticmethod
    def finish(conn, sql):
        conn.execute(sql + ";COMMIT", prepare=False)

    @staticmethod
    def query(conn, sql):
        return conn.execute(sql, prepare=False).fetchone()

    @staticmethod
    def commit(conn):
        conn.commit()  # COMMIT whenever a transaction is open, autocommit or not

    @staticmethod
    def rollback(conn):
        conn.rollback()


class _Psycopg2:
    """A query string with no parameters: psycopg2 sends it as it is and
    returns the last statement's rows."""

    @staticmethod
    def query(conn, sql):
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone() if cur.description else None

    @classmethod
    def claim(cls, conn, sql):
        return cls.query(conn, "BEGIN;" + sql)

    @classmethod
    def finish(cls, conn, sql):
        cls.query(conn, sql + ";COMMIT")

    @classmethod
    def commit(cls, conn):
        cls.query(conn, "COMMIT")

    @classmethod
    def rollback(cls, conn):
        cls.query(conn, "ROLLBACK")


_PSYCOPG3, _PSYCOPG2 = _Psycopg3(), _Psycopg2()


class Pool:
    """Connections in autocommit mode from a psycopg_pool.ConnectionPool,
    a psycopg2.pool pool (waiting for a free connection where psycopg2's
    would raise), or a function that opens one."""

    def __init__(self, source):
        self.source = source
        pools = sys.modules.get("psycopg2.pool")
        self.psycopg2 = pools is not None and isinstance(source, pools.AbstractConnectionPool)
        self.free = threading.BoundedSemaphore(source.maxconn) if self.psycopg2 else None
        self.opens = not hasattr(source, "getconn")

    def get(self):
        src = self.source
        if self.opens:
            conn = src()
        else:
            if self.free is not None:
                self.free.acquire()
            try:
                conn = src.getconn()
            except BaseException:
                if self.free is not None:
                    self.free.release()
                raise
        if not conn.autocommit:
            conn.autocommit = True
        return conn

    def put(self, conn):
        src = self.source
        if self.opens:
            conn.close()
            return
        try:
            if self.psycopg2:
                src.putconn(conn, close=bool(conn.closed))
            else:
                src.putconn(conn)
        finally:
            if self.free is not None:
                self.free.release()

    @contextmanager
    def connection(self):
        conn = self.get()
        try:
            yield conn
        finally:
            self.put(conn)


class Idempotency:
    """The synchronous core.  pool: a psycopg_pool.ConnectionPool (its
    connections in autocommit mode: kwargs={"autocommit": True}), a
    psycopg2.pool pool, or a function that opens a connection.  defaults:
    operation, tenant, caller, ttl, lease, wait (seconds or interval text),
    on_lease_expiry, on_expired; schema, the extension's schema when it is
    not on the search_path."""

    def __init__(self, pool, schema=None, **defaults):
        self.pool = pool if isinstance(pool, Pool) else Pool(pool)
        self.calls = Calls(schema, **defaults)

    def run(self, handler, key, request=None, operation=None, raw_request=False, defer_commit=False,
            **options):
        """One transaction.  handler(conn, ctx) runs only for a new key (or a
        new attempt) inside the claim's transaction, on its connection; ctx
        holds key, token, attempt and recovery_point.  It returns a Result (or
        a dict of its arguments); with failed=True it is stored with
        idem_fail and replayed.  When it raises, everything rolls back and the
        error goes on: a retry proceeds.

        A claim that does not proceed is answered after one round trip, but
        its transaction must still commit (a claim that found an ended lease
        may have made the record unknown).  By default run() sends that
        COMMIT before it returns; with defer_commit=True it returns at once
        and the Response's close() sends it and gives the connection back:
        call it once the answer is sent (a WSGI response's close(), which
        the server calls after the last byte)."""
        bad = check_key(key)
        if bad is not None:
            return bad
        if self.calls.text is None:
            self._learn()
        response = self._run(handler, key, request, operation, raw_request, defer_commit, options)
        if response is AGAIN:  # the connection is back in the pool
            response = self._run(handler, key, request, operation, raw_request, defer_commit, options)
        return response

    def _run(self, handler, key, request, operation, raw_request, defer_commit, options):
        sql = self.calls.claim(operation, key, request, raw_request, **options)
        conn = self.pool.get()
        driver = _driver(conn)
        end = "ROLLBACK"  # how the finally ends the transaction; None: handed over
        try:
            try:
                d = dict(zip(COLUMNS, driver.claim(conn, sql)))
            except Exception as err:
                return AGAIN if self.calls.refused(sql, err) else refuse(err)
            if d["outcome"] != "proceed":
                response = answer(d)
                if defer_commit:
                    response.close = _Commit(self, conn, driver)
                    end = None
                else:
                    end = "COMMIT"
                return response
            result = Result.of(handler(conn, attempt(key, d)))
            driver.finish(conn, self.calls.finish(d["token"], result))
            end = ""
            return result.response()
        finally:
            if end is not None:
                self._end(conn, driver, end)

    def _end(self, conn, driver, how):
        """End the call's transaction (how: COMMIT, ROLLBACK, or "" when it
        has ended) and give the connection back, closed when its transaction
        could not end.  A COMMIT that fails raises."""
        try:
            if how and not conn.closed:
                (driver.commit if how == "COMMIT" else driver.rollback)(conn)
        except Exception:
            conn.close()
            if how == "COMMIT":
                raise
        finally:
            self.pool.put(conn)

    def _call(self, sql):
        """One statement in a transaction of its own; its first row."""
        with self.pool.connection() as conn:
            return _driver(conn).query(conn, sql)

    def _learn(self):
        """Ask once whether idem_claim_text is there; an error leaves it
        unknown (asked again at the next call), the claim going to
        idem_claim meanwhile."""
        try:
            self.calls.text = self._call(self.calls.learn())[0] is True
        except Exception:
            self.calls.text = None

    def run_external(self, handler, key, request=None, operation=None, raw_request=False, lease=30, **options):
        """Three transactions, for a side effect outside the database: the
        claim commits with a lease (seconds), extended every third of it while
        handler(ctx) runs, then the response is committed.  ctx: key, token,
        attempt, recovery_point, lost (a threading.Event set when the lease
        was lost), checkpoint(point), derive_key(step).  RetryableError stores
        a retryable failure; any other error leaves the record processing,
        and once its lease ends, retries answer unknown (409) or, with
        on_lease_expiry="retry", proceed from the last checkpoint."""
        bad = check_key(key)
        if bad is not None:
            return bad
        sql = self.calls.claim(operation, key, request, raw_request, lease=lease, **options)
        try:
            d = dict(zip(COLUMNS, self._call(sql)))
        except Exception as err:
            return refuse(err)
        if d["outcome"] != "proceed":
            return answer(d)
        token = d["token"]
        stop, lost = threading.Event(), threading.Event()

        def beat():
            while not stop.wait(lease / 3):
                try:
                    self._call(self.calls.heartbeat(token, lease))
                except Exception as err:
                    if sqlstate(err) == STALE_TOKEN:
                        lost.set()
                        return

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        ctx = attempt(key, d, lost=lost,
                      checkpoint=lambda point: self._call(self.calls.checkpoint(token, point)) and None,
                      derive_key=lambda step: self._call(self.calls.derive_key(key, step))[0])
        try:
            result = Result.of(handler(ctx))
        except RetryableError as err:
            result = Result.retryable_failure(err)
        finally:
            stop.set()
            beater.join()
        try:
            self._call(self.calls.finish(token, result))
        except Exception as err:
            lease_lost(err)
        return result.response()
