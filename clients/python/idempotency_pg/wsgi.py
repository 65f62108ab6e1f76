"""The WSGI adapter, for Flask, over Idempotency (psycopg 3 or psycopg2).

    from idempotency_pg.wsgi import idempotent

    @app.post("/payments")
    @idempotent(idem, operation="payments.create")
    def create_payment(conn, ctx):               # ctx: key, attempt, request, body, ...
        ...
        return {"status": 201, "headers": {"Location": ...}, "body": {...}}
"""

import functools

from ._adapter import MAX_BODY, call_arguments, key_of, parse
from .core import HttpError


def to_flask(response):
    """A core Response as Flask's, its header pairs kept in order."""
    from flask import Response

    return Response(response.body, status=response.status, headers=response.headers)


def idempotent(idem, operation, external=False, max_body=MAX_BODY, **options):
    """A decorator that makes `handler(conn, ctx)` (or, with external=True,
    `handler(ctx)`) a Flask view.  ctx adds request (flask.request) and body
    (the parsed JSON).  An HttpError is answered; other errors go to Flask
    (500).  A retry is answered after one round trip: the COMMIT of its
    claim runs from the response's close(), which the WSGI server calls
    once the answer is sent."""

    def wrap(handler):
        @functools.wraps(handler)
        def view(*args, **kwargs):
            from flask import request

            try:
                text, body = parse(request.get_data(cache=False), max_body)
                call = call_arguments(options, request, key_of(request.headers.getlist("Idempotency-Key")), text, body)
                extra = {"request": request, "body": body, "args": args, "kwargs": kwargs}
                if external:
                    response = idem.run_external(lambda ctx: handler({**ctx, **extra}),
                                                 operation=operation, **call)
                else:
                    response = idem.run(lambda conn, ctx: handler(conn, {**ctx, **extra}),
                                        operation=operation, defer_commit=True, **call)
            except HttpError as err:
                response = err.response()
            try:
                r = to_flask(response)
            except BaseException:
                response.close()
                raise
            # a retry's COMMIT, once the answer is sent (WSGI's close())
            r.call_on_close(response.close)
            return r

        return view

    return wrap
