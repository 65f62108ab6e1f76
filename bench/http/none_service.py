#!/usr/bin/env python3
"""The payments service without idempotency, bench/http's floor: POST
/payments writes a payment in BEGIN; INSERT; COMMIT and answers 201, on
Starlette and uvicorn over psycopg 3's async API (the ASGI framework of
examples/python/payments_service.py).  --port N (0: a free one, printed
first as "listening on http://127.0.0.1:PORT")."""

import argparse
import contextlib
import json
import socket

import uvicorn
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

pool = AsyncConnectionPool("", kwargs={"autocommit": True}, min_size=1, max_size=10, open=False)


async def create_payment(request):
    body = json.loads(await request.body())
    async with pool.connection() as conn:
        async with conn.transaction():
            cur = await conn.execute("INSERT INTO payments (idempotency_key, amount, currency)"
                                     " VALUES ('-', %s, %s) RETURNING id", (body["amount"], body["currency"]))
            (payment_id,) = await cur.fetchone()
    content = json.dumps({"id": payment_id, "amount": body["amount"], "currency": body["currency"],
                          "status": "created"}).encode()
    return Response(content, status_code=201, media_type="application/json",
                    headers={"Location": "/payments/" + payment_id})


@contextlib.asynccontextmanager
async def lifespan(app):
    await pool.open()
    yield
    await pool.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections whose
    # socket says TCP, and an accepted one takes the listener's protocol.
    # Without it, uvicorn's two writes (the headers, then the body) meet
    # Nagle's algorithm and the client's delayed ACK: 40 ms per request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    print("listening on http://127.0.0.1:%d" % sock.getsockname()[1], flush=True)
    app = Starlette(routes=[Route("/payments", create_payment, methods=["POST"])], lifespan=lifespan)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


if __name__ == "__main__":
    main()
