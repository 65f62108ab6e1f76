"""The asynchronous core, over psycopg 3's AsyncConnection (for ASGI).

As the synchronous one (core.py): a new key in three round trips, a retry
in one before its answer: the retry's COMMIT is sent behind the answer, and
the connection goes back to the pool once it is done.
"""

import asyncio
import json
import warnings

from psycopg import DatabaseError, errors, pq

from .core import (AGAIN, COLUMNS, STALE_TOKEN, Calls, Result, RetryableError, answer, attempt, check_key,
                   lease_lost, refuse, sqlstate)


_FATAL = pq.ExecStatus.FATAL_ERROR


async def _ready(loop, fd, write=False):
    done = loop.create_future()
    (loop.add_writer if write else loop.add_reader)(fd, done.set_result, None)
    try:
        await done
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _send(conn, sql):
    """One query string in the simple protocol on conn, sent and read
    through libpq (psycopg.pq) rather than a cursor: the library's own
    statements need none of a cursor's adaptation, and skipping it costs
    the service a third of the CPU per statement.  Its results; the first
    error raised as psycopg raises it."""
    pgconn, encoding = conn.pgconn, conn.info.encoding
    pgconn.send_query(sql.encode(encoding))
    loop = asyncio.get_running_loop()
    fd = pgconn.socket
    while pgconn.flush():  # the rest of the query once the socket takes it
        await _ready(loop, fd, write=True)
    results = []
    while True:
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                for result in results:
                    if result.status == _FATAL:
                        raise _error(result, encoding)
                return results
            results.append(result)
        await _ready(loop, fd)


def _error(result, encoding):
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    try:
        cls = errors.lookup(state.decode()) if state else DatabaseError
    except KeyError:
        cls = DatabaseError
    message = (result.error_message or b"").decode(encoding, "replace")
    return cls(message, info=result, encoding=encoding)


def _decision(result, encoding):
    """idem_claim's row (the columns of COLUMNS, in text) as a dict."""
    v = [result.get_value(0, i) for i in range(len(COLUMNS))]
    outcome, token, attempt_, point, status, headers, body, code, retry_after, raw = v
    if raw is not None:
        raw = bytes.fromhex(raw[2:].decode()) if raw.startswith(b"\\x") else pq.Escaping().unescape_bytea(raw)
    return {
        "outcome": outcome.decode(encoding),
        "token": None if token is None else token.decode(encoding),
        "attempt": None if attempt_ is None else int(attempt_),
        "recovery_point": None if point is None else point.decode(encoding),
        "http_status": None if status is None else int(status),
        "headers": None if headers is None else json.loads(headers),
        "body": None if body is None else body.decode(encoding),
        "error_code": None if code is None else code.decode(encoding),
        "retry_after": None if retry_after is None else int(retry_after),
        "raw_body": raw,
    }


class AsyncIdempotency:
    """pool: a psycopg_pool.AsyncConnectionPool whose connections are in
    autocommit mode (kwargs={"autocommit": True}).  Defaults as
    Idempotency's.  BEGIN with the claim, and the completion with COMMIT,
    go as one query string each, every value a literal (core.Calls): one
    round trip each, nothing prepared."""

    def __init__(self, pool, schema=None, pipeline=None, **defaults):
        if pipeline is not None:
            warnings.warn("AsyncIdempotency(pipeline=...) is ignored: the calls are query strings of"
                          " literals, which cost the service less CPU than pipeline mode", DeprecationWarning,
                          stacklevel=2)
        self.pool = pool
        self.calls = Calls(schema, **defaults)
        self._pending = set()

    async def drain(self):
        """Wait for the COMMITs sent behind answers (before closing the pool)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def _end(self, conn, commit):
        """COMMIT or ROLLBACK, then give the connection back (closed when
        its transaction could not end)."""
        try:
            if not conn.closed:
                await (_send(conn, "COMMIT") if commit else conn.rollback())
        except Exception:
            await conn.close()
        finally:
            await self.pool.putconn(conn)

    async def run(self, handler, key, request=None, operation=None, raw_request=False, **options):
        """One transaction: await handler(conn, ctx) runs inside the claim's
        transaction, on its connection (see Idempotency.run).  A claim that
        does not proceed is answered after one round trip; its COMMIT
        follows on the connection, which then goes back to the pool."""
        bad = check_key(key)
        if bad is not None:
            return bad
        if self.calls.text is None:
            try:
                self.calls.text = (await self._call(self.calls.learn()))[0] is True
            except Exception:  # unknown: asked again at the next call
                self.calls.text = None
        response = await self._run(handler, key, request, operation, raw_request, options)
        if response is AGAIN:  # the connection is back in the pool
            response = await self._run(handler, key, request, operation, raw_request, options)
        return response

    async def _run(self, handler, key, request, operation, raw_request, options):
        sql = "BEGIN;" + self.calls.claim(operation, key, request, raw_request, **options)
        conn = await self.pool.getconn()
        handed_over = False
        try:
            try:
                d = _decision((await _send(conn, sql))[1], conn.info.encoding)
            except Exception as err:
                return AGAIN if self.calls.refused(sql, err) else refuse(err)
            if d["outcome"] != "proceed":
                # answered now; the COMMIT follows on the connection (a claim
                # that found an ended lease may have made the record unknown)
                task = asyncio.ensure_future(self._end(conn, True))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
                handed_over = True
                return answer(d)
            result = Result.of(await handler(conn, attempt(key, d)))
            await _send(conn, self.calls.finish(d["token"], result) + ";COMMIT")
            handed_over = True
            await self.pool.putconn(conn)
            return result.response()
        finally:
            if not handed_over:
                await self._end(conn, False)

    async def _call(self, sql):
        async with self.pool.connection() as conn:
            return await (await conn.execute(sql, prepare=False)).fetchone()

    async def run_external(self, handler, key, request=None, operation=None, raw_request=False, lease=30,
                           **options):
        """Three transactions (see Idempotency.run_external); ctx["lost"] is
        an asyncio.Event, checkpoint and derive_key coroutines."""
        bad = check_key(key)
        if bad is not None:
            return bad
        sql = self.calls.claim(operation, key, request, raw_request, lease=lease, **options)
        try:
            d = dict(zip(COLUMNS, await self._call(sql)))
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
                    await self._call(self.calls.heartbeat(token, lease))
                except Exception as err:
                    if sqlstate(err) == STALE_TOKEN:
                        lost.set()
                        return

        async def checkpoint(point):
            await self._call(self.calls.checkpoint(token, point))

        async def derive_key(step):
            return (await self._call(self.calls.derive_key(key, step)))[0]

        beater = asyncio.ensure_future(beat())
        ctx = attempt(key, d, lost=lost, checkpoint=checkpoint, derive_key=derive_key)
        try:
            result = Result.of(await handler(ctx))
        except RetryableError as err:
            result = Result.retryable_failure(err)
        finally:
            beater.cancel()
        try:
            await self._call(self.calls.finish(token, result))
        except Exception as err:
            lease_lost(err)
        return result.response()
