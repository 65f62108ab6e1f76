"""The ASGI adapter, for Starlette and FastAPI, over AsyncIdempotency.

    from idempotency_pg.asgi import idempotent

    @idempotent(idem, operation="payments.create")
    async def create_payment(conn, ctx):          # ctx: key, attempt, request, body, ...
        cur = await conn.execute("INSERT ... RETURNING id", (...))
        (payment_id,) = await cur.fetchone()
        return {"status": 201, "headers": {"Location": f"/payments/{payment_id}"}, "body": {...}}

    app = Starlette(routes=[Route("/payments", create_payment, methods=["POST"])])
    # FastAPI: app.add_api_route("/payments", create_payment, methods=["POST"])
"""

import inspect

from ._adapter import MAX_BODY, call_arguments, key_of, parse
from .core import HttpError


def to_starlette(response):
    """A core Response as Starlette's, its header pairs kept in order."""
    from starlette.responses import Response

    r = Response(content=response.body, status_code=response.status)
    r.raw_headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
    r.raw_headers.append((b"content-length", str(len(response.body)).encode()))
    return r


def idempotent(idem, operation, external=False, max_body=MAX_BODY, **options):
    """A decorator that makes `async def handler(conn, ctx)` (or, with
    external=True, `async def handler(ctx)`) a Starlette endpoint taking the
    request.  ctx adds request (Starlette's) and body (the parsed JSON).
    An HttpError is answered; other errors go to the framework (500)."""

    def wrap(handler):
        async def endpoint(request):
            try:
                text, body = parse(await request.body(), max_body)
                kwargs = call_arguments(options, request, key_of(request.headers.getlist("idempotency-key")), text, body)
                extra = {"request": request, "body": body}
                if external:
                    response = await idem.run_external(
                        lambda ctx: handler({**ctx, **extra}), operation=operation, **kwargs)
                else:
                    response = await idem.run(
                        lambda conn, ctx: handler(conn, {**ctx, **extra}), operation=operation, **kwargs)
            except HttpError as err:
                response = err.response()
            return to_starlette(response)

        # FastAPI reads the signature: the endpoint takes the request.
        from starlette.requests import Request

        endpoint.__signature__ = inspect.Signature(
            [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)])
        endpoint.__name__, endpoint.__qualname__ = handler.__name__, handler.__qualname__
        endpoint.__doc__ = handler.__doc__
        return endpoint

    return wrap
