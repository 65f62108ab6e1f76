#!/usr/bin/env python3
"""POST /payments with an Idempotency-Key, on the idempotency extension.

A small HTTP service on idempotency_pg (clients/python): the claim, the
business write (a row in payments) and the completion commit together, and
every outcome of idem_claim becomes its HTTP answer (README, "HTTP
mapping").  What is left here is the business logic and the routes.

    POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
    GET  /payments/<id>

    payments_service.py [--port N] [--framework wsgi|asgi] [--driver psycopg2|psycopg]
                        [--no-prepared-statements] [--quiet]

wsgi: Flask on werkzeug's threaded server, over psycopg2 (default) or
psycopg 3; asgi: Starlette on uvicorn, over psycopg 3's async API.
--no-prepared-statements keeps psycopg 3 from preparing statements, for
pgbouncer in transaction mode.

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
import os
import re
import socket
import sys

try:
    import idempotency_pg
except ImportError:  # run from a source tree: the library beside examples/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import idempotency_pg

from idempotency_pg import HttpError

POOL_SIZE = 10
JSON = ("Content-Type", "application/json")
OPERATION = "payments.create"
INSERT = "INSERT INTO payments (idempotency_key, amount, currency) VALUES (%s, %s, %s) RETURNING id"
SELECT = "SELECT id, amount, currency FROM payments WHERE id = %s"


def encode(value):
    return json.dumps(value).encode()


def check_request(req, body):
    """Checks before the claim: answered, never stored."""
    if not isinstance(body, dict):
        raise HttpError(400, "INVALID_JSON", "the body must be a JSON object")
    if not re.fullmatch(r"\d+", req.headers.get("Simulate-Delay-Ms") or "0"):
        raise HttpError(400, "INVALID_HEADER", "Simulate-Delay-Ms must be an integer")


def validate(request):
    """The handler's own checks: a failure is stored and replayed."""
    amount, currency = request.get("amount"), request.get("currency")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return "amount must be a positive integer (minor units)"
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return "currency must be a three-letter ISO 4217 code"
    return None


def misbehave(headers):
    """The test hooks: (seconds to sleep after the write, whether to raise)."""
    return (min(int(headers.get("Simulate-Delay-Ms") or 0), 10000) / 1000,
            (headers.get("Simulate-Failure") or "").lower() == "true")


def refused(body):
    problem = validate(body)
    if problem is None:
        return None
    return {"status": 400, "body": encode({"error_code": "VALIDATION_FAILED", "message": problem}),
            "headers": [JSON], "failed": True}


def created(payment_id, body):
    return {"status": 201, "headers": [JSON, ("Location", "/payments/" + payment_id)],
            "body": encode({"id": payment_id, "amount": body["amount"], "currency": body["currency"],
                            "status": "created"}),
            "resource_id": payment_id}


def found(row):
    if row is None:
        return 404, encode({"error_code": "NOT_FOUND", "message": "no such payment"})
    return 200, encode({"id": row[0], "amount": row[1], "currency": row[2], "status": "created"})


def wsgi_app(driver, prepare):
    """Flask over psycopg2 or psycopg 3."""
    import time

    from flask import Flask, Response

    from idempotency_pg.wsgi import idempotent

    if driver == "psycopg2":
        from psycopg2.pool import ThreadedConnectionPool
        pool = ThreadedConnectionPool(1, POOL_SIZE, "")
    else:
        from psycopg_pool import ConnectionPool
        kwargs = {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}
        pool = ConnectionPool("", kwargs=kwargs, min_size=1, max_size=POOL_SIZE)
    idem = idempotency_pg.Idempotency(pool)
    app = Flask(__name__)

    def query(conn, sql, params):
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
            return cur.fetchone()
        finally:
            cur.close()

    @app.post("/payments")
    @idempotent(idem, operation=OPERATION, validate_request=check_request)
    def create_payment(conn, ctx):
        body = ctx["body"]
        answer = refused(body)
        if answer is not None:
            return answer
        (payment_id,) = query(conn, INSERT, (ctx["key"], body["amount"], body["currency"]))
        delay, fail = misbehave(ctx["request"].headers)
        time.sleep(delay)
        if fail:
            raise RuntimeError("simulated failure after the write")
        return created(payment_id, body)

    @app.get("/payments/<payment_id>")
    def get_payment(payment_id):
        with idem.pool.connection() as conn:
            status, body = found(query(conn, SELECT, (payment_id,)))
        return Response(body, status=status, headers=[JSON])

    @app.errorhandler(Exception)
    def internal_error(err):
        status = getattr(err, "code", None)
        if isinstance(status, int) and status < 500:  # werkzeug's 404, 405, ...
            return Response(encode({"error_code": "NOT_FOUND", "message": str(err)}), status=status,
                            headers=[JSON])
        app.logger.error("request failed: %s", err)
        return Response(encode({"error_code": "INTERNAL_ERROR", "message": "try again"}), status=500,
                        headers=[JSON])

    return app


def asgi_app(prepare):
    """Starlette over psycopg 3's async API."""
    import asyncio

    from psycopg_pool import AsyncConnectionPool
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from idempotency_pg.aio import AsyncIdempotency
    from idempotency_pg.asgi import idempotent

    kwargs = {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}
    pool = AsyncConnectionPool("", kwargs=kwargs, min_size=1, max_size=POOL_SIZE, open=False)
    idem = AsyncIdempotency(pool)

    @idempotent(idem, operation=OPERATION, validate_request=check_request)
    async def create_payment(conn, ctx):
        body = ctx["body"]
        answer = refused(body)
        if answer is not None:
            return answer
        cur = await conn.execute(INSERT, (ctx["key"], body["amount"], body["currency"]))
        (payment_id,) = await cur.fetchone()
        delay, fail = misbehave(ctx["request"].headers)
        await asyncio.sleep(delay)
        if fail:
            raise RuntimeError("simulated failure after the write")
        return created(payment_id, body)

    async def get_payment(request):
        async with pool.connection() as conn:
            row = await (await conn.execute(SELECT, (request.path_params["payment_id"],))).fetchone()
        status, body = found(row)
        return Response(body, status_code=status, media_type="application/json")

    async def internal_error(request, err):
        print("%s %s failed: %s" % (request.method, request.url.path, err), file=sys.stderr, flush=True)
        return Response(encode({"error_code": "INTERNAL_ERROR", "message": "try again"}), status_code=500,
                        media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await pool.open()
        try:
            yield
        finally:
            await idem.drain()
            await pool.close()

    return Starlette(routes=[Route("/payments", create_payment, methods=["POST"]),
                             Route("/payments/{payment_id}", get_payment, methods=["GET"])],
                     exception_handlers={Exception: internal_error}, lifespan=lifespan)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--framework", choices=["wsgi", "asgi"], default="wsgi")
    parser.add_argument("--driver", choices=["psycopg2", "psycopg"], default="psycopg2",
                        help="the WSGI service's driver (ASGI: psycopg)")
    parser.add_argument("--no-prepared-statements", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no access log")
    args = parser.parse_args()
    prepare = not args.no_prepared_statements
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections whose
    # socket says TCP, and an accepted one takes the listener's protocol.
    # Without it, uvicorn's two writes (the headers, then the body) meet
    # Nagle's algorithm and the client's delayed ACK: 40 ms per request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # 20 clients at once must not overflow the backlog
    print("listening on http://127.0.0.1:%d" % sock.getsockname()[1], flush=True)
    if args.framework == "asgi":
        import uvicorn
        config = uvicorn.Config(asgi_app(prepare), log_level="warning", access_log=not args.quiet)
        uvicorn.Server(config).run(sockets=[sock])
    else:
        import logging

        from werkzeug.serving import make_server
        if args.quiet:
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = make_server("127.0.0.1", 0, wsgi_app(args.driver, prepare), threaded=True, fd=sock.fileno())
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
