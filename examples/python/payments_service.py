#!/usr/bin/env python3
"""POST /payments with an Idempotency-Key, on the idempotency extension.

A small HTTP service (standard library http.server, psycopg2) that shows the
one-transaction pattern: the claim, the business write (a row in payments)
and idem_complete commit together, and every outcome of idem_claim becomes
its HTTP answer (README, "HTTP mapping").

    POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
    GET  /payments/<id>

Connection settings come from libpq's environment (PGHOST, PGPORT,
PGDATABASE, PGUSER, ...).  Listens on 127.0.0.1; `--port 0` picks a free
port.  The first line on stdout is "listening on http://127.0.0.1:PORT".

For tests, two request headers that are not part of the request (and so not
of its fingerprint) make the handler misbehave:
    Simulate-Delay-Ms: N      the handler sleeps N ms (at most 10000) after its
                              write, inside the transaction
    Simulate-Failure: true    the handler raises after its write: the
                              transaction rolls back and the claim with it
"""

import argparse
import contextlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import psycopg2.pool
from psycopg2.extras import Json

OPERATION = "payments.create"
POOL_SIZE = 10

# SQLSTATEs idem_claim raises for a bad key: invalid_parameter_value and
# null_value_not_allowed.  The client sent it: 400.
BAD_INPUT = {"22023", "22004"}

CLAIM_SQL = """
    SELECT outcome, token, http_status, headers, body, raw_body, error_code, retry_after
      FROM idem_claim(%(operation)s, %(key)s, %(request)s::jsonb)
"""

JSON = ("Content-Type", "application/json")


def encode(value):
    """A JSON answer as the bytes sent.  The stored response is these very
    bytes (raw_body), so a replay is the same bytes whatever the encoder."""
    return json.dumps(value).encode()


class Pool:
    """A ThreadedConnectionPool that waits for a free connection instead of
    raising when all are in use."""

    def __init__(self, size):
        self._pool = psycopg2.pool.ThreadedConnectionPool(1, size, "")
        self._free = threading.BoundedSemaphore(size)

    @contextlib.contextmanager
    def connection(self):
        with self._free:
            conn = self._pool.getconn()
            broken = False
            try:
                yield conn
            except psycopg2.OperationalError:
                broken = True
                raise
            finally:
                if not conn.closed and conn.status != psycopg2.extensions.STATUS_READY:
                    conn.rollback()
                self._pool.putconn(conn, close=broken or bool(conn.closed))


class ClientError(Exception):
    def __init__(self, status, error_code, message):
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message


def validate(request):
    """The handler's own checks: a failure is stored and replayed."""
    amount = request.get("amount")
    currency = request.get("currency")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return "amount must be a positive integer (minor units)"
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return "currency must be a three-letter ISO 4217 code"
    return None


def answer(decision):
    """Map an outcome other than proceed to (status, headers, body bytes)."""
    outcome = decision["outcome"]
    if outcome == "replay":
        # The stored status, headers (a list of [name, value] pairs, in
        # order) and body bytes, exactly as first sent, and the marker.
        headers = [tuple(h) for h in decision["headers"] or []]
        headers.append(("Idempotent-Replayed", "true"))
        return decision["http_status"], headers, bytes(decision["raw_body"] or b"")
    error = {"error_code": decision["error_code"]}
    if outcome == "in_progress":
        error["message"] = "a request with this Idempotency-Key is still being processed"
        return 409, [JSON, ("Retry-After", str(decision["retry_after"]))], encode(error)
    if outcome == "mismatch":
        error["message"] = "this Idempotency-Key was used for a different request"
        return 422, [JSON], encode(error)
    if outcome == "unknown":
        error["message"] = "the outcome of the first attempt is unknown; query the payment before retrying"
        return 409, [JSON], encode(error)
    if outcome == "expired":
        error["message"] = "this Idempotency-Key has expired; look the payment up by its reference before sending it again with a new key"
        return 409, [JSON], encode(error)
    if outcome == "rate_limited":
        # Nothing was written: the same request, same key, may come again.
        error["message"] = "too many new requests from this client; send it again after Retry-After seconds, with the same Idempotency-Key"
        return 429, [JSON, ("Retry-After", str(decision["retry_after"]))], encode(error)
    raise RuntimeError("unexpected outcome %r" % outcome)


def create_payment(pool, key, request, delay_ms=0, fail=False):
    """Claim, write, complete: one transaction.  Returns (status, headers, body)."""
    with pool.connection() as conn:
        with conn:  # commits when the block ends, rolls back on an exception
            with conn.cursor() as cur:
                try:
                    cur.execute(CLAIM_SQL, {"operation": OPERATION, "key": key,
                                            "request": Json(request)})
                except psycopg2.Error as e:
                    if e.pgcode in BAD_INPUT:
                        raise ClientError(400, "IDEMPOTENCY_KEY_INVALID",
                                          e.diag.message_primary)
                    raise
                names = [c.name for c in cur.description]
                decision = dict(zip(names, cur.fetchone()))
                if decision["outcome"] != "proceed":
                    # Commit all the same: a claim that found an ended lease
                    # may have moved the record to unknown.
                    result = answer(decision)
                else:
                    token = decision["token"]
                    problem = validate(request)
                    if problem is not None:
                        # A stable failure: stored, replayed to every retry.
                        headers = [JSON]
                        body = encode({"error_code": "VALIDATION_FAILED", "message": problem})
                        cur.execute("SELECT idem_fail(%s, 400, headers => %s, raw_body => %s)",
                                    (token, Json(headers), psycopg2.Binary(body)))
                        result = (400, headers, body)
                    else:
                        cur.execute(
                            "INSERT INTO payments (idempotency_key, amount, currency)"
                            " VALUES (%s, %s, %s) RETURNING id",
                            (key, request["amount"], request["currency"]))
                        payment_id = cur.fetchone()[0]
                        if delay_ms:
                            time.sleep(delay_ms / 1000.0)
                        if fail:
                            raise RuntimeError("simulated failure after the write")
                        body = encode({"id": payment_id, "amount": request["amount"],
                                       "currency": request["currency"], "status": "created"})
                        headers = [JSON, ("Location", "/payments/" + payment_id)]
                        cur.execute("SELECT idem_complete(%s, 201, headers => %s,"
                                    " resource_id => %s, raw_body => %s)",
                                    (token, Json(headers), payment_id, psycopg2.Binary(body)))
                        result = (201, headers, body)
    return result  # only once the transaction has committed


def get_payment(pool, payment_id):
    with pool.connection() as conn:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT id, amount, currency FROM payments WHERE id = %s",
                        (payment_id,))
            row = cur.fetchone()
    if row is None:
        return 404, [JSON], encode({"error_code": "NOT_FOUND", "message": "no such payment"})
    return 200, [JSON], encode({"id": row[0], "amount": row[1], "currency": row[2],
                                "status": "created"})


class Handler(BaseHTTPRequestHandler):
    server_version = "idempotency-example-python"

    def do_POST(self):
        try:
            if self.path != "/payments":
                raise ClientError(404, "NOT_FOUND", "no such resource")
            key = self.headers.get("Idempotency-Key")
            if key is None:
                raise ClientError(400, "IDEMPOTENCY_KEY_MISSING",
                                  "the Idempotency-Key header is required")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                request = None
            if not isinstance(request, dict):
                raise ClientError(400, "INVALID_JSON", "the body must be a JSON object")
            try:
                delay_ms = min(max(int(self.headers.get("Simulate-Delay-Ms") or 0), 0), 10000)
            except ValueError:
                raise ClientError(400, "INVALID_HEADER", "Simulate-Delay-Ms must be an integer")
            fail = self.headers.get("Simulate-Failure", "").lower() == "true"
            self.respond(*create_payment(self.server.pool, key, request, delay_ms, fail))
        except ClientError as e:
            self.respond(e.status, [JSON],
                         encode({"error_code": e.error_code, "message": e.message}))
        except Exception as e:  # the transaction rolled back: a retry proceeds
            self.log_error("POST /payments failed: %s", e)
            self.respond(500, [JSON],
                         encode({"error_code": "INTERNAL_ERROR", "message": "try again"}))

    def do_GET(self):
        try:
            m = re.fullmatch(r"/payments/([A-Za-z0-9_]+)", self.path)
            if m is None:
                raise ClientError(404, "NOT_FOUND", "no such resource")
            self.respond(*get_payment(self.server.pool, m.group(1)))
        except ClientError as e:
            self.respond(e.status, [JSON],
                         encode({"error_code": e.error_code, "message": e.message}))
        except Exception as e:
            self.log_error("GET %s failed: %s", self.path, e)
            self.respond(500, [JSON],
                         encode({"error_code": "INTERNAL_ERROR", "message": "try again"}))

    def respond(self, status, headers, body):
        """Send status, headers (name, value pairs, repeats kept) and body bytes."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_request(self, code="-", size="-"):
        if self.server.verbose:  # errors are logged whatever --quiet says
            super().log_request(code, size)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # 20 clients at once must not overflow the backlog


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--quiet", action="store_true", help="no access log")
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    server.pool = Pool(POOL_SIZE)
    server.verbose = not args.quiet
    print("listening on http://127.0.0.1:%d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
