"""The synchronous core over psycopg 3 and psycopg2, and the asynchronous
one over psycopg 3, against a running PostgreSQL."""

import asyncio
import json
import os
import threading
import time
import uuid

import pytest

from conftest import in_use, payments_for, psycopg2_pool, psycopg3_pool
from idempotency_pg import HttpError, Idempotency, Result, RetryableError, answer
from idempotency_pg.aio import AsyncIdempotency


def insert(cursor_owner, key, amount):
    """A payment written on the claim's connection (either driver)."""
    if hasattr(cursor_owner, "execute"):
        cur = cursor_owner.execute(
            "INSERT INTO payments (idempotency_key, amount, currency) VALUES (%s, %s, 'EUR') RETURNING id",
            (key, amount))
        return cur.fetchone()[0]
    with cursor_owner.cursor() as cur:
        cur.execute("INSERT INTO payments (idempotency_key, amount, currency) VALUES (%s, %s, 'EUR') RETURNING id",
                    (key, amount))
        return cur.fetchone()[0]


def pay(amount):
    def handler(conn, ctx):
        pid = insert(conn, ctx["key"], amount)
        return {"status": 201, "headers": [("Location", "/payments/" + pid), ("X-Tag", "a"), ("X-Tag", "b")],
                "body": {"id": pid, "amount": amount}, "resource_id": pid}
    return handler


def never(*_):
    raise AssertionError("the handler must not run")


def test_new_key_and_replay(pool, db, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    first = idem.run(pay(10), key, {"amount": 10, "currency": "EUR"}, operation=op)
    assert (first.status, first.outcome, first.replayed) == (201, "proceed", False)
    assert [n for n, _ in first.headers] == ["Content-Type", "Location", "X-Tag", "X-Tag"]
    again = idem.run(never, key, {"currency": "EUR", "amount": 10}, operation=op)
    assert (again.status, again.outcome, again.replayed) == (201, "replay", True)
    assert again.headers == first.headers + [("Idempotent-Replayed", "true")]
    assert again.body == first.body
    assert payments_for(db, key) == 1


def test_handler_error_rolls_back_and_retry_proceeds(pool, db, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())

    def crash(conn, ctx):
        pay(11)(conn, ctx)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        idem.run(crash, key, {"amount": 11}, operation=op)
    assert payments_for(db, key) == 0
    with pytest.raises(HttpError):
        idem.run(lambda c, x: (_ for _ in ()).throw(HttpError(503, "BUSY", "later")), key, {"amount": 11},
                 operation=op)
    r = idem.run(pay(11), key, {"amount": 11}, operation=op)
    assert (r.status, r.outcome) == (201, "proceed")
    assert payments_for(db, key) == 1


def test_failed_is_stored_and_replayed(pool, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    r = idem.run(lambda c, x: Result(400, body={"error_code": "VALIDATION_FAILED"}, failed=True), key, {"a": 0},
                 operation=op)
    again = idem.run(never, key, {"a": 0}, operation=op)
    assert (r.status, again.status, again.replayed, again.body) == (400, 400, True, r.body)


def test_mismatch_and_bad_keys(pool, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    idem.run(pay(12), key, {"amount": 12}, operation=op)
    r = idem.run(never, key, {"amount": 13}, operation=op)
    assert (r.status, json.loads(r.body)["error_code"]) == (422, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST")
    r = idem.run(never, None, {}, operation=op)
    assert (r.status, json.loads(r.body)["error_code"]) == (400, "IDEMPOTENCY_KEY_MISSING")
    for bad in ["", "k" * 300, "caf\u00e9", "a\0b"]:
        r = idem.run(never, bad, {}, operation=op)
        assert (r.status, json.loads(r.body)["error_code"]) == (400, "IDEMPOTENCY_KEY_INVALID"), bad
    r = idem.run(never, str(uuid.uuid4()), '{"s": "\\u0000"}', raw_request=True, operation=op)
    assert (r.status, json.loads(r.body)["error_code"]) == (400, "INVALID_REQUEST")


def test_quotes_and_backslashes_are_sent_as_written(pool, op):
    idem = Idempotency(pool)
    key = "x'); SELECT 1; --\\'\\"
    call = dict(operation=op + "'", tenant="t\\'")
    first = idem.run(lambda c, x: Result(200, [("X-Q", "a'b\\c")], "'\\"), key, {"n": "it's \\'"}, **call)
    again = idem.run(never, key, {"n": "it's \\'"}, **call)
    assert (first.status, again.outcome, again.headers[0], again.body) == (200, "replay", ("X-Q", "a'b\\c"), b"'\\")
    assert idem.run(never, key, {"n": "x"}, **call).outcome == "mismatch"


def test_in_progress(pool, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    inside, release = threading.Event(), threading.Event()
    results = {}

    def slow(conn, ctx):
        inside.set()
        assert release.wait(30)
        return pay(14)(conn, ctx)

    t = threading.Thread(target=lambda: results.setdefault("first", idem.run(slow, key, {"a": 14}, operation=op)))
    t.start()
    assert inside.wait(30)
    r = idem.run(never, key, {"a": 14}, operation=op)
    release.set()
    t.join(30)
    assert (r.status, json.loads(r.body)["error_code"]) == (409, "IDEMPOTENCY_REQUEST_IN_PROGRESS")
    assert int(r.header("Retry-After")) >= 1
    assert results["first"].status == 201


def test_answer_maps_every_outcome():
    def code(r):
        return json.loads(r.body)["error_code"]
    r = answer({"outcome": "expired", "http_status": 409, "error_code": "IDEMPOTENCY_KEY_EXPIRED"})
    assert (r.status, code(r), r.header("Retry-After")) == (409, "IDEMPOTENCY_KEY_EXPIRED", None)
    r = answer({"outcome": "rate_limited", "http_status": 429, "error_code": "IDEMPOTENCY_RATE_LIMITED",
                "retry_after": 3})
    assert (r.status, code(r), r.header("Retry-After")) == (429, "IDEMPOTENCY_RATE_LIMITED", "3")
    r = answer({"outcome": "unknown", "http_status": 409, "error_code": "IDEMPOTENCY_OUTCOME_UNKNOWN"})
    assert (r.status, code(r)) == (409, "IDEMPOTENCY_OUTCOME_UNKNOWN")
    r = answer({"outcome": "replay", "http_status": 200, "headers": {"X-A": "1"}, "body": "{\"a\": 1}",
                "raw_body": None})
    assert (r.status, r.body, r.headers) == (200, b'{"a":1}', [("X-A", "1"), ("Idempotent-Replayed", "true")])
    with pytest.raises(ValueError):
        answer({"outcome": "proceed"})


def settled(idem, key, request, op, timeout=20, **options):
    deadline = time.monotonic() + timeout
    while True:
        r = idem.run_external(never, key, request, operation=op, **options)
        if r.outcome != "in_progress" or time.monotonic() > deadline:
            return r
        time.sleep(0.02)


def test_external_lease_unknown_retryable_and_resume(pool, op):
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    inside, release = threading.Event(), threading.Event()
    results = {}

    def call_provider(ctx):
        results["derived"] = ctx["derive_key"]("charge")
        inside.set()
        assert release.wait(30)
        return {"status": 201, "body": {"charged": True}}

    t = threading.Thread(target=lambda: results.setdefault(
        "first", idem.run_external(call_provider, key, {"a": 1}, operation=op, lease=5)))
    t.start()
    assert inside.wait(30)
    busy = idem.run_external(never, key, {"a": 1}, operation=op)
    release.set()
    t.join(30)
    assert (busy.status, busy.outcome) == (409, "in_progress")
    assert results["first"].status == 201 and len(results["derived"]) == 36
    assert idem.run_external(never, key, {"a": 1}, operation=op).replayed

    # an error: unknown once the lease ends
    key = str(uuid.uuid4())
    with pytest.raises(RuntimeError):
        idem.run_external(lambda ctx: (_ for _ in ()).throw(RuntimeError("timeout")), key, {}, operation=op,
                          lease=0.05)
    r = settled(idem, key, {}, op)
    assert (r.status, json.loads(r.body)["error_code"]) == (409, "IDEMPOTENCY_OUTCOME_UNKNOWN")

    # retryable: the retry runs as attempt 2
    key = str(uuid.uuid4())
    r = idem.run_external(lambda ctx: (_ for _ in ()).throw(RetryableError("down")), key, {}, operation=op)
    assert (r.status, r.header("Retry-After")) == (503, "1")
    r = idem.run_external(lambda ctx: {"status": 200, "body": {"attempt": ctx["attempt"]}}, key, {}, operation=op)
    assert json.loads(r.body) == {"attempt": 2}

    # on_lease_expiry retry: the next attempt resumes from the checkpoint
    key = str(uuid.uuid4())

    def crash_after_charge(ctx):
        ctx["checkpoint"]("charged")
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        idem.run_external(crash_after_charge, key, {}, operation=op, lease=0.05, on_lease_expiry="retry")
    deadline = time.monotonic() + 20
    while True:
        r = idem.run_external(lambda ctx: {"status": 200, "body": {"resumed": ctx["recovery_point"]}}, key, {},
                              operation=op, on_lease_expiry="retry")
        if r.outcome != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert json.loads(r.body) == {"resumed": "charged"}


def test_async_core(db, op):
    from psycopg_pool import AsyncConnectionPool

    async def main():
        pool = AsyncConnectionPool("", kwargs={"autocommit": True}, min_size=1, max_size=4)
        await pool.open()
        idem = AsyncIdempotency(pool)
        try:
            key = str(uuid.uuid4())

            async def apay(conn, ctx):
                cur = await conn.execute("INSERT INTO payments (idempotency_key, amount, currency)"
                                         " VALUES (%s, 20, 'EUR') RETURNING id", (ctx["key"],))
                (pid,) = await cur.fetchone()
                return {"status": 201, "body": {"id": pid}}

            async def anever(*_):
                raise AssertionError("must not run")

            async def crash(conn, ctx):
                await apay(conn, ctx)
                raise RuntimeError("boom")

            with pytest.raises(RuntimeError):
                await idem.run(crash, key, {"amount": 20}, operation=op)
            first = await idem.run(apay, key, {"amount": 20}, operation=op)
            again = await idem.run(anever, key, {"amount": 20}, operation=op)
            other = await idem.run(anever, key, {"amount": 21}, operation=op)
            bad = await idem.run(anever, "", {}, operation=op)
            ext_key = str(uuid.uuid4())

            async def provider(ctx):
                return {"status": 202, "body": {"derived": await ctx["derive_key"]("x")}}

            ext = await idem.run_external(provider, ext_key, {}, operation=op)
            ext_again = await idem.run_external(anever, ext_key, {}, operation=op)
            return key, first, again, other, bad, ext, ext_again
        finally:
            await idem.drain()  # the COMMITs sent behind the answers
            await pool.close()

    key, first, again, other, bad, ext, ext_again = asyncio.run(main())
    assert (first.status, again.replayed, again.body) == (201, True, first.body)
    assert (other.status, bad.status) == (422, 400)
    assert (ext.status, ext_again.replayed) == (202, True)
    assert payments_for(db, key) == 1


class _Counting3:
    """psycopg 3: a connection class that records each query string it sends."""

    @staticmethod
    def pool():
        import psycopg
        from psycopg_pool import ConnectionPool

        class Counting(psycopg.Connection):
            def execute(self, query, *args, **kwargs):
                self.sent.append(query)
                return super().execute(query, *args, **kwargs)

            def commit(self):
                self.sent.append("COMMIT")
                return super().commit()

            def rollback(self):
                self.sent.append("ROLLBACK")
                return super().rollback()

        def configure(conn):
            conn.sent = SENT

        SENT = []
        pool = ConnectionPool("", connection_class=Counting, kwargs={"autocommit": True}, min_size=1, max_size=1,
                              configure=configure)
        return pool, SENT


class _Counting2:
    """psycopg2: a connection whose cursors record each query string."""

    @staticmethod
    def pool():
        import psycopg2.extensions
        from psycopg2.pool import ThreadedConnectionPool

        SENT = []

        class Cursor(psycopg2.extensions.cursor):
            def execute(self, query, vars=None):
                SENT.append(query)
                return super().execute(query, vars)

        class Counting(psycopg2.extensions.connection):
            def cursor(self, *args, **kwargs):
                kwargs.setdefault("cursor_factory", Cursor)
                return super().cursor(*args, **kwargs)

        return ThreadedConnectionPool(1, 1, "", connection_factory=Counting), SENT


@pytest.fixture(params=["psycopg", "psycopg2"])
def counted(request):
    """(pool of one connection, the list of query strings sent on it)."""
    pool, sent = (_Counting3 if request.param == "psycopg" else _Counting2).pool()
    yield pool, sent
    pool.close() if request.param == "psycopg" else pool.closeall()


def shapes(sent):
    """Each query string sent, named by what it does."""
    names = []
    for sql in sent:
        sql = str(sql)
        if "to_regprocedure" in sql:  # the instance's one question, at its first call
            continue
        if sql.startswith("BEGIN;SELECT outcome") and ("idem_claim(" in sql or "idem_claim_text(" in sql):
            names.append("BEGIN;claim")
        elif sql.startswith("SELECT ") and "idem_complete(" in sql and sql.endswith(";COMMIT"):
            names.append("complete;COMMIT")
        elif sql.startswith("INSERT INTO payments"):
            names.append("INSERT")
        else:
            names.append(sql)
    return names


def test_round_trips(counted, db, op):
    pool, sent = counted
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    assert idem.run(pay(30), key, {"amount": 30}, operation=op).status == 201
    assert shapes(sent) == ["BEGIN;claim", "INSERT", "complete;COMMIT"]
    del sent[:]
    r = idem.run(never, key, {"amount": 30}, operation=op)
    assert (r.replayed, shapes(sent)) == (True, ["BEGIN;claim", "COMMIT"])
    r.close()  # nothing left: a no-op
    assert shapes(sent) == ["BEGIN;claim", "COMMIT"]
    # deferred: answered after the claim alone; close() sends the COMMIT and
    # gives the connection back, once
    del sent[:]
    r = idem.run(never, key, {"amount": 30}, operation=op, defer_commit=True)
    assert (r.replayed, shapes(sent)) == (True, ["BEGIN;claim"])
    assert in_use(pool) == 1
    r.close()
    r.close()
    assert (shapes(sent), in_use(pool)) == (["BEGIN;claim", "COMMIT"], 0)
    # a handler that raises: ROLLBACK, and a retry proceeds
    del sent[:]
    key = str(uuid.uuid4())
    with pytest.raises(RuntimeError):
        idem.run(lambda conn, ctx: (_ for _ in ()).throw(RuntimeError("boom")), key, {}, operation=op,
                 defer_commit=True)
    assert (shapes(sent), in_use(pool)) == (["BEGIN;claim", "ROLLBACK"], 0)
    assert idem.run(pay(31), key, {}, operation=op, defer_commit=True).outcome == "proceed"
    assert in_use(pool) == 0


def test_claims_go_to_idem_claim_text_whose_records_idem_claim_answers_alike(counted, db, op):
    pool, sent = counted
    text = Idempotency(pool, tenant="t \\ 'x'")
    key = str(uuid.uuid4())
    assert text.run(pay(33), key, {"amount": 33, "note": "a \"b\" \\ \u00e9"}, operation=op).status == 201
    assert text.calls.text is True
    assert "idem_claim_text(" in str(sent[1]) and not any("idem_claim(" in str(q) for q in sent)
    # the same key through idem_claim: the same fingerprint, the same answer
    full = Idempotency(pool, tenant="t \\ 'x'")
    full.calls.text = False
    again = full.run(never, key, '{"note": "a \\"b\\" \\\\ \u00e9", "amount": 33.0}', raw_request=True,
                     operation=op)
    assert (again.outcome, again.replayed) == ("replay", True)
    assert full.run(never, key, {"amount": 34}, operation=op).outcome == "mismatch"
    assert "idem_claim(" in str(sent[-2])
    assert text.run(never, key, {"amount": 34}, operation=op).outcome == "mismatch"
    assert "idem_claim_text(" in str(sent[-2])
    # where it is not there (a schema without it), claims go to idem_claim
    elsewhere = Idempotency(pool, schema="pg_catalog")
    elsewhere._learn()
    assert elsewhere.calls.text is False
    assert '"pg_catalog".idem_claim(' in elsewhere.calls.claim(op, key, {"a": 1})


def test_deferred_commit_keeps_what_the_claim_wrote(pool, db, op):
    """A claim that finds an ended lease makes the record unknown: with the
    COMMIT deferred, that write commits on close()."""
    idem = Idempotency(pool)
    key = str(uuid.uuid4())
    with pytest.raises(RuntimeError):
        idem.run_external(lambda ctx: (_ for _ in ()).throw(RuntimeError("timeout")), key, {}, operation=op,
                          lease=0.05)
    deadline = time.monotonic() + 20
    while db.execute("SELECT outcome FROM idem_replay(%s, %s)", (op, key)).fetchone()[0] != "unknown":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = idem.run(never, key, {}, operation=op, defer_commit=True)
    assert (r.status, json.loads(r.body)["error_code"]) == (409, "IDEMPOTENCY_OUTCOME_UNKNOWN")
    holder = db.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                        " AND usename = current_user AND pid <> pg_backend_pid()").fetchone()[0]
    assert holder >= 1
    r.close()
    assert in_use(pool) == 0
    # committed: the record is unknown for good, a retry is told so
    assert idem.run(never, key, {}, operation=op).outcome == "unknown"


def test_literal():
    from idempotency_pg.core import literal

    assert literal("a'b") == "'a''b'"
    assert literal("a\\'b") == " E'a\\\\''b'"
    with pytest.raises(ValueError):
        literal("a\0b")


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_literals_read_back_as_sent(db, conforming):
    from idempotency_pg.core import bytea, interval, literal

    db.execute("SET standard_conforming_strings = " + conforming)
    for s in ["", "plain", "it's", "\\", "a\\'b", "\\x41", "'; SELECT 1; --", "caf\u00e9 \u2603", "%s %(x)s", "E'x'"]:
        assert db.execute("SELECT " + literal(s)).fetchone()[0] == s
    assert bytes(db.execute("SELECT " + bytea(b"\x00\\'\xff")).fetchone()[0]) == b"\x00\\'\xff"
    assert db.execute("SELECT extract(epoch FROM %s)" % interval(1.5)).fetchone()[0] == 1.5
    assert db.execute("SELECT %s = '2 minutes'::interval" % interval("2 minutes")).fetchone()[0]


@pytest.mark.parametrize("settings", [[], ["SET bytea_output = 'escape'", "SET standard_conforming_strings = off"]])
def test_async_core_sends_and_reads_values_as_written(op, settings):
    """The asynchronous core reads idem_claim's row itself: every column,
    in either bytea output, and values with quotes and backslashes."""
    from psycopg_pool import AsyncConnectionPool

    async def configure(conn):
        for sql in settings:
            await conn.execute(sql)

    async def main():
        pool = AsyncConnectionPool("", kwargs={"autocommit": True}, min_size=1, max_size=2, configure=configure)
        await pool.open()
        idem = AsyncIdempotency(pool)
        try:
            key = "x'); SELECT 1; --\\'\\"
            call = dict(operation=op + "'\\", tenant="t\\'")
            body = bytes(range(256)) + b"\\x00'"

            async def handler(conn, ctx):
                assert isinstance(ctx["token"], str) and ctx["attempt"] == 1
                return Result(207, [("X-Q", "a'b\\c"), ("X-Q", "2")], body, resource_id="r'\\")

            async def anever(*_):
                raise AssertionError("must not run")

            first = await idem.run(handler, key, {"n": "it's \\'"}, **call)
            again = await idem.run(anever, key, {"n": "it's \\'"}, **call)
            other = await idem.run(anever, key, {"n": "x"}, **call)
            bad = await idem.run(anever, "caf\u00e9", {}, **call)
            return first, again, other, bad
        finally:
            await idem.drain()
            await pool.close()

    first, again, other, bad = asyncio.run(main())
    assert (first.status, again.status, again.replayed) == (207, 207, True)
    assert again.headers == [("X-Q", "a'b\\c"), ("X-Q", "2"), ("Idempotent-Replayed", "true")]
    assert again.body == bytes(range(256)) + b"\\x00'"
    assert (other.status, other.outcome) == (422, "mismatch")
    assert (bad.status, json.loads(bad.body)["error_code"]) == (400, "IDEMPOTENCY_KEY_INVALID")
    # the server's primary message, read from its error as psycopg reads it
    assert json.loads(bad.body)["message"] == "idempotency key must be printable ASCII"


def test_async_pipeline_option_is_ignored_with_a_warning():
    with pytest.warns(DeprecationWarning):
        idem = AsyncIdempotency(object(), pipeline=True)
    assert idem.calls.claim("op", "k", None).endswith("idem_claim('op', 'k', NULL)")


@pytest.mark.skipif(not os.environ.get("IDEM_ADMIN_DSN"), reason="no IDEM_ADMIN_DSN")
@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "async"])
def test_idem_claim_text_revoked_after_the_first_call_the_claim_goes_to_idem_claim(op, driver):
    """EXECUTE on idem_claim_text revoked once the first call found it
    usable: that claim and the later ones go to idem_claim."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
    from psycopg2.pool import ThreadedConnectionPool
    role = "idem_revoked_%s" % uuid.uuid4().hex[:8]
    dsn = os.environ["IDEM_ADMIN_DSN"] + " options='-c role=%s'" % role
    ok = {"status": 201, "body": {"ok": True}}
    with psycopg.connect(os.environ["IDEM_ADMIN_DSN"], autocommit=True) as admin:
        admin.execute("CREATE ROLE %s" % role)
        admin.execute("GRANT EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_fail TO %s"
                      % role)
        revoke = lambda: admin.execute("REVOKE EXECUTE ON FUNCTION idem_claim_text FROM %s" % role)  # noqa: E731
        key = str(uuid.uuid4())
        try:
            if driver == "async":
                async def main():
                    async def handler(conn, ctx):
                        return ok
                    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True}, min_size=1, max_size=1) as pool:
                        idem = AsyncIdempotency(pool)
                        first = await idem.run(handler, str(uuid.uuid4()), {"a": 1}, operation=op)
                        text = idem.calls.text
                        revoke()
                        return (first, text, await idem.run(handler, key, {"a": 1}, operation=op),
                                await idem.run(never, key, {"a": 1}, operation=op), idem.calls.text)
                first, text, second, again, after = asyncio.run(main())
            else:
                if driver == "psycopg":
                    pool = ConnectionPool(dsn, kwargs={"autocommit": True}, min_size=1, max_size=1)
                else:
                    pool = ThreadedConnectionPool(1, 1, dsn)
                try:
                    idem = Idempotency(pool)
                    first = idem.run(lambda conn, ctx: ok, str(uuid.uuid4()), {"a": 1}, operation=op)
                    text = idem.calls.text
                    revoke()
                    second = idem.run(lambda conn, ctx: ok, key, {"a": 1}, operation=op)
                    again = idem.run(never, key, {"a": 1}, operation=op)
                    after = idem.calls.text
                finally:
                    pool.close() if driver == "psycopg" else pool.closeall()
            assert (first.status, text) == (201, True)
            assert (second.status, second.outcome) == (201, "proceed")
            assert (again.outcome, after) == ("replay", False)
        finally:
            admin.execute("DROP OWNED BY %s" % role)
            admin.execute("DROP ROLE %s" % role)


JSONB_BODY = '{"a": 1.10, "b": 12345678901234567890, "s": "x, y: z"}'
JSONB_REPLAY = b'{"a":1.10,"b":12345678901234567890,"s":"x, y: z"}'


def store_jsonb_body(db, op, key):
    """A record completed with a jsonb body and no raw_body (as idem_complete
    allows), by another client of the records."""
    with db.transaction():
        (token,) = db.execute("SELECT token FROM idem_claim(%s, %s)", (op, key)).fetchone()
        db.execute("SELECT idem_complete(%s, 200, %s::jsonb)", (token, JSONB_BODY))


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "async"])
def test_a_jsonb_body_is_replayed_as_its_text_compacted(db, op, driver):
    """As every library replays it: numbers as written (1.10, not 1.1; a
    big integer exact), whitespace inside strings kept."""
    import asyncio

    key = str(uuid.uuid4())
    store_jsonb_body(db, op, key)
    never = lambda *_: pytest.fail("must not run")  # noqa: E731
    if driver == "async":
        from psycopg_pool import AsyncConnectionPool

        async def main():
            pool = AsyncConnectionPool("", kwargs={"autocommit": True}, min_size=1, max_size=1)
            await pool.open()
            try:
                r = await AsyncIdempotency(pool).run(never, key, None, operation=op)
                await asyncio.sleep(0)
                return r
            finally:
                await pool.close()

        r = asyncio.run(main())
    else:
        p = psycopg3_pool() if driver == "psycopg" else psycopg2_pool()
        try:
            r = Idempotency(p).run(never, key, None, operation=op)
        finally:
            p.close() if driver == "psycopg" else p.closeall()
    assert r.replayed and r.body == JSONB_REPLAY
