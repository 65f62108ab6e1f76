"""Fixtures: pools of both drivers against a running PostgreSQL with the
extension and examples/schema.sql, from libpq's environment (PGHOST, PGPORT,
PGDATABASE, PGUSER, the role the schema grants the API to)."""

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUN = uuid.uuid4().hex[:8]


def psycopg3_pool():
    from psycopg_pool import ConnectionPool
    return ConnectionPool("", kwargs={"autocommit": True}, min_size=1, max_size=4)


def psycopg2_pool():
    from psycopg2.pool import ThreadedConnectionPool
    return ThreadedConnectionPool(1, 4, "")


@pytest.fixture(params=["psycopg", "psycopg2"])
def pool(request):
    p = psycopg3_pool() if request.param == "psycopg" else psycopg2_pool()
    yield p
    p.close() if request.param == "psycopg" else p.closeall()


@pytest.fixture
def db():
    import psycopg
    with psycopg.connect("", autocommit=True) as conn:
        yield conn


@pytest.fixture
def op(request):
    """An operation name of this test and run."""
    return "test.python.%s.%s" % (request.node.name, RUN)


def in_use(pool):
    """How many of a pool's connections are out (either driver's pool)."""
    if hasattr(pool, "get_stats"):
        stats = pool.get_stats()
        return stats["pool_size"] - stats["pool_available"]
    return len(pool._used)


def payments_for(db, key):
    return db.execute("SELECT count(*) FROM payments WHERE idempotency_key = %s", (key,)).fetchone()[0]


def pytest_terminal_summary(terminalreporter):
    """The count line the test scripts read: N passed, N failed."""
    stats = terminalreporter.stats
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    terminalreporter.write_line("%d passed, %d failed" % (len(stats.get("passed", [])), failed))
