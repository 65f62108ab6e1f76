"""The asynchronous core, over psycopg 3's AsyncConnection (for ASGI).

As the synchronous one (core.py), with one round trip before the answer to
a retry: its COMMIT is sent behind the answer, and the connection goes back
to the pool once it is done.
"""

import asyncio

from psycopg import AsyncClientCursor

from .core import (COLUMNS, STALE_TOKEN, Calls, Result, RetryableError, answer, attempt, check_key,
                   lease_lost, refuse, sqlstate)


class AsyncIdempotency:
    """pool: a psycopg_pool.AsyncConnectionPool whose connections are in
    autocommit mode (kwargs={"autocommit": True}).  Defaults as
    Idempotency's.  BEGIN with the claim, and the completion with COMMIT,
    go as one query string whose values psycopg binds on the client
    (AsyncClientCursor), or with pipeline=True in pipeline mode: both one
    round trip, but under asyncio pipeline mode costs the service about a
    third more CPU per new key (its many small flushes and waits)."""

    def __init__(self, pool, schema=None, pipeline=False, **defaults):
        self.pool = pool
        self.pipeline = pipeline
        self.calls = Calls(schema, **defaults)
        self._pending = set()

    async def drain(self):
        """Wait for the COMMITs sent behind answers (before closing the pool)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _end(self, conn, sql):
        try:
            await conn.execute(sql)
        except Exception:
            await conn.close()
        finally:
            await self.pool.putconn(conn)

    async def _pair(self, conn, first, first_params, second, second_params):
        """Two statements in one round trip; the first row of the one that
        has a result (the claim)."""
        if self.pipeline:
            async with conn.pipeline():
                cur1 = await conn.execute(first, first_params)
                cur2 = await conn.execute(second, second_params)
            cur = cur2 if second_params is not None else cur1
            return await cur.fetchone()
        # one query string, the values bound by psycopg on the client
        async with AsyncClientCursor(conn) as cur:
            await cur.execute(first + ";" + second, (first_params or []) + (second_params or []))
            if first_params is None:
                cur.nextset()
            return await cur.fetchone()

    async def run(self, handler, key, request=None, operation=None, raw_request=False, **options):
        """One transaction: await handler(conn, ctx) runs inside the claim's
        transaction, on its connection (see Idempotency.run)."""
        bad = check_key(key)
        if bad is not None:
            return bad
        sql, params = self.calls.claim(operation, key, request, raw_request, **options)
        conn = await self.pool.getconn()
        handed_over = False
        try:
            try:
                d = dict(zip(COLUMNS, await self._pair(conn, "BEGIN", None, sql, params)))
            except Exception as err:
                return refuse(err)
            if d["outcome"] != "proceed":
                # answered now; the COMMIT follows on the connection
                task = asyncio.ensure_future(self._end(conn, "COMMIT"))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
                handed_over = True
                return answer(d)
            result = Result.of(await handler(conn, attempt(key, d)))
            fsql, fparams = self.calls.finish(d["token"], result)
            await self._pair(conn, fsql, fparams, "COMMIT", None)
            handed_over = True
            await self.pool.putconn(conn)
            return result.response()
        finally:
            if not handed_over:
                await self._end(conn, "ROLLBACK")

    async def _call(self, sql, params):
        async with self.pool.connection() as conn:
            return await (await conn.execute(sql, params)).fetchone()

    async def run_external(self, handler, key, request=None, operation=None, raw_request=False, lease=30,
                           **options):
        """Three transactions (see Idempotency.run_external); ctx["lost"] is
        an asyncio.Event, checkpoint and derive_key coroutines."""
        bad = check_key(key)
        if bad is not None:
            return bad
        sql, params = self.calls.claim(operation, key, request, raw_request, lease=lease, **options)
        try:
            d = dict(zip(COLUMNS, await self._call(sql, params)))
        except Exception as err:
            return refuse(err)
        if d["outcome"] != "proceed":
            return answer(d)
        token = d["token"]
        lost = asyncio.Event()

        async def beat():
            while True:
                await asyncio.sleep(lease / 3)
                try:
                    await self._call(*self.calls.heartbeat(token, lease))
                except Exception as err:
                    if sqlstate(err) == STALE_TOKEN:
                        lost.set()
                        return

        async def checkpoint(point):
            await self._call(*self.calls.checkpoint(token, point))

        async def derive_key(step):
            return (await self._call(*self.calls.derive_key(key, step)))[0]

        beater = asyncio.ensure_future(beat())
        ctx = attempt(key, d, lost=lost, checkpoint=checkpoint, derive_key=derive_key)
        try:
            result = Result.of(await handler(ctx))
        except RetryableError as err:
            result = Result.retryable_failure(err)
        finally:
            beater.cancel()
        try:
            await self._call(*self.calls.finish(token, result))
        except Exception as err:
            lease_lost(err)
        return result.response()
