#!/usr/bin/env python3
"""examples/sharding/citus/test_citus.py: end-to-end test of the Citus layout.

Runs against a coordinator and two workers (on 127.0.0.1) where the database
idem_citus holds the layout of schema.sql, and the databases
idem_citus_distributed, idem_citus_reference and idem_citus_local have Citus
and nothing else:

    python3 test_citus.py --coordinator 5432 --workers 5433,5434

Application calls are made as the role idem_app on the coordinator (Citus
delegates them to the tenant's node); the checks read each node directly as
postgres.  In those three, idem_records is made a Citus table in each way
Citus allows (distributed, reference, added to the metadata as a local
table): every claim, completion and maintenance pass
must refuse there with 55000 on every node where it is a Citus table,
including a session that had used the extension before, and write nothing.
Prints a line per check and "N passed, N failed"; exits non-zero on a
failure.
"""

import argparse
import re
import sys
import threading
import time

import psycopg2
import psycopg2.errors

passed = 0
failed = 0
DB = "idem_citus"
# idem_records made a Citus table, one database per way
REFUSED_DBS = ("idem_citus_distributed", "idem_citus_reference", "idem_citus_local")


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok     " + name, flush=True)
    else:
        failed += 1
        print("FAILED " + name + (": " + detail if detail else ""), flush=True)


def connect(port, user="postgres", dbname=DB):
    conn = psycopg2.connect(host="127.0.0.1", port=port, user=user, dbname=dbname)
    conn.autocommit = True
    return conn


def query(conn, sql, args=()):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def one(conn, sql, args=()):
    return query(conn, sql, args)[0][0]


def sqlstate_of(fn):
    """The SQLSTATE fn raises, or None."""
    try:
        fn()
    except psycopg2.Error as e:
        return e.pgcode
    return None


class Cluster:
    def __init__(self, coordinator, workers):
        self.coord_port = coordinator
        self.worker_ports = workers
        self.admin = {p: connect(p) for p in [coordinator] + workers}
        self.coord = self.admin[coordinator]
        self.app = connect(coordinator, "idem_app")

    def pay(self, tenant, key, conn=None, amount=100):
        return query(conn or self.app,
                     "SELECT outcome, payment_id FROM pay(%s, %s, %s, 'EUR')",
                     (tenant, key, amount))[0]

    def payments(self, tenant, key):
        return one(self.coord, "SELECT count(*) FROM payments WHERE tenant = %s AND idempotency_key = %s",
                   (tenant, key))

    def records(self, tenant, key):
        """The records of (tenant, key) on each node: {port: count}."""
        return {p: one(c, "SELECT count(*) FROM idem_records WHERE tenant = %s AND key = %s",
                       (tenant, key))
                for p, c in self.admin.items()}

    def node_of(self, tenant):
        """The port of the node where the tenant's payments shard is placed."""
        return one(self.coord, """
            SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
             WHERE p.shardid = get_shard_id_for_distribution_column('payments', %s)""", (tenant,))

    def tenant_on(self, port, prefix):
        """A tenant name whose shard is placed on the node of port."""
        for i in range(1000):
            t = "%s-%03d" % (prefix, i)
            if self.node_of(t) == port:
                return t
        raise RuntimeError("no tenant placed on %s" % port)


def test_layout(c):
    w1, w2 = c.worker_ports
    t = c.tenant_on(w1, "tenant")

    # A new key, then its retry: delegated to the tenant's node.
    first = c.pay(t, "k-new")
    again = c.pay(t, "k-new")
    check("a new key proceeds on the tenant's node, its retry replays the same payment",
          first[0] == "proceed" and again == ("replay", first[1]), "%r then %r" % (first, again))
    check("  ... one payment", c.payments(t, "k-new") == 1)
    check("  ... its record is on the tenant's node only",
          c.records(t, "k-new") == {c.coord_port: 0, w1: 1, w2: 0}, repr(c.records(t, "k-new")))

    # Inside BEGIN ... COMMIT: force_delegation sends the call, and the rest
    # of the transaction, to the tenant's node.
    conn = connect(c.coord_port, "idem_app")
    conn.autocommit = False
    a = c.pay(t, "k-tx", conn)[0]
    b = c.pay(t, "k-tx", conn)[0]
    conn.commit()
    after = c.pay(t, "k-tx")[0]
    check("in BEGIN ... COMMIT: proceed, replay in the same transaction, replay after",
          (a, b, after) == ("proceed", "replay", "replay"), repr((a, b, after)))
    check("  ... one payment, its record on the tenant's node only",
          c.payments(t, "k-tx") == 1 and c.records(t, "k-tx") == {c.coord_port: 0, w1: 1, w2: 0},
          repr(c.records(t, "k-tx")))
    a = c.pay(t, "k-rollback", conn)[0]
    conn.rollback()
    b = c.pay(t, "k-rollback")[0]
    check("in BEGIN ... ROLLBACK: the key proceeds again afterwards, one payment",
          (a, b) == ("proceed", "proceed") and c.payments(t, "k-rollback") == 1, repr((a, b)))

    # An attempt still open in one transaction: the same key from another
    # session answers in_progress, then replay once the first commits.
    a = c.pay(t, "k-open", conn)[0]
    b = c.pay(t, "k-open")[0]
    conn.commit()
    d = c.pay(t, "k-open")[0]
    check("a retry while the first attempt's transaction is open answers in_progress, then replay",
          (a, b, d) == ("proceed", "in_progress", "replay"), repr((a, b, d)))
    check("  ... one payment", c.payments(t, "k-open") == 1)
    conn.close()

    # Calls that Citus does not delegate run where they are called: the
    # placement check refuses them with 22023, and nothing is written.
    def refused(name, port, sql, key, in_block=False):
        before = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
        conn = connect(port, "idem_app")
        conn.autocommit = not in_block
        state = sqlstate_of(lambda: query(conn, sql, (t, key)))
        conn.close()
        after = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
        check(name + ": refused with 22023", state == "22023", "got %s" % state)
        check("  ... nothing written on any node, no payment",
              before == after and c.payments(t, key) == 0, "%r -> %r" % (before, after))

    refused("not delegated (the tenant from a subquery) on the coordinator", c.coord_port,
            "SELECT (pay(v.t, v.k, 100, 'EUR')).outcome FROM (SELECT %s::text AS t, %s::text AS k) v",
            "k-subquery")
    refused("not delegated (the tenant from a subquery) on the worker without the tenant's shard",
            w2, "SELECT (pay(v.t, v.k, 100, 'EUR')).outcome FROM (SELECT %s::text AS t, %s::text AS k) v",
            "k-subquery-w2")
    query(c.coord, """SELECT create_distributed_function('pay_delegated(text, pay_call)', 'tenant',
                                 colocate_with => 'payments', force_delegation => false)""")
    try:
        refused("without force_delegation, inside BEGIN (the call runs on the coordinator)",
                c.coord_port, "SELECT outcome FROM pay(%s, %s, 100, 'EUR')", "k-no-force", in_block=True)
    finally:
        query(c.coord, """SELECT create_distributed_function('pay_delegated(text, pay_call)', 'tenant',
                                     colocate_with => 'payments', force_delegation => true)""")
    # Called on the worker without the shard, with the tenant as a
    # constant, the call is delegated like on the coordinator.
    x = c.pay(t, "k-from-w2", connect(w2, "idem_app"))[0]
    check("called on the other worker with a constant tenant, the call is delegated: proceed on the tenant's node",
          x == "proceed" and c.records(t, "k-from-w2") == {c.coord_port: 0, w1: 1, w2: 0},
          "%s %r" % (x, c.records(t, "k-from-w2")))


def test_roles(c):
    """The application role reaches the records through the layout's
    functions only: they run as the layout's owner, and the extension's
    functions are not the application's on any node."""
    w1, w2 = c.worker_ports
    ports = [c.coord_port] + c.worker_ports
    t = c.tenant_on(w1, "direct")
    first = c.pay(t, "k-direct")
    check("through the layout: a new key proceeds", first[0] == "proceed", repr(first))
    before = c.records(t, "k-direct")
    for port in ports:
        where = "the tenant's node" if port == w1 else "a node without the tenant's shard"
        app = connect(port, "idem_app")
        st = sqlstate_of(lambda: query(app, """
            SELECT outcome FROM idem_claim('payments.create', 'k-direct',
                                           '{"amount": 100, "currency": "EUR"}', tenant => %s)""", (t,)))
        check("node %s (%s): idem_claim called directly by the application role is refused with 42501"
              % (port, where), st == "42501", "got %s" % st)
        forged = "1.1." + "0" * 32
        shard = one(c.coord, "SELECT get_shard_id_for_distribution_column('payments', %s)", (t,))
        for name, sql, args in (
                ("idem_replay", "SELECT idem_replay('payments.create', 'k-direct', tenant => %s)", (t,)),
                ("idem_complete", "SELECT idem_complete(%s, 200)", (forged,)),
                ("idem_fail", "SELECT idem_fail(%s, 503)", (forged,)),
                ("tenant_check", "SELECT tenant_check(%s)", (t,)),
                ("tenant_of_token", "SELECT tenant_of_token(%s)", (forged,)),
                ("tenant_shard_lock", "SELECT tenant_shard_lock(%s)", (shard,))):
            st = sqlstate_of(lambda: query(app, sql, args))
            check("  ... and so is %s" % name, st == "42501", "got %s" % st)
        app.close()
    check("  ... nothing written on any node: one payment, the record on the tenant's node only",
          c.records(t, "k-direct") == before == {c.coord_port: 0, w1: 1, w2: 0}
          and c.payments(t, "k-direct") == 1, "%r -> %r" % (before, c.records(t, "k-direct")))
    again = c.pay(t, "k-direct")
    check("  ... and the retry through the layout replays the same payment",
          again == ("replay", first[1]), repr(again))
    owners = {p: query(c.admin[p], """
        SELECT DISTINCT pg_get_userbyid(proowner)::text || ' ' || prosecdef::text || ' '
               || coalesce(array_to_string(proconfig, ','), '')
          FROM pg_proc WHERE proname IN ('pay_delegated', 'claim_delegated', 'complete_delegated',
                                         'fail_delegated')
                         AND pronamespace = 'public'::regnamespace""") for p in ports}
    check("on every node, the four delegated functions are SECURITY DEFINER, owned by idem_layout, "
          "search_path pinned",
          all(len(o) == 1 and o[0][0].startswith("idem_layout true search_path=pg_catalog,")
              and o[0][0].endswith("pg_temp") for o in owners.values()), repr(owners))
    role = one(c.admin[w1], "SELECT role::text FROM idem_records WHERE tenant = %s AND key = 'k-direct'", (t,))
    check("  ... so the records belong to the layout's owner", role == "idem_layout", repr(role))

    # The tenant is in the scope: the same key under two tenants of one node
    # is two commands, and a token goes back with its own tenant only.
    t2 = c.tenant_on(w1, "other")
    a = c.pay(t, "k-shared")
    b = c.pay(t2, "k-shared")
    check("the same key under two tenants of one node: each proceeds, two payments",
          a[0] == b[0] == "proceed" and a[1] != b[1]
          and c.payments(t, "k-shared") == 1 and c.payments(t2, "k-shared") == 1, "%r %r" % (a, b))
    d = query(c.app, "SELECT outcome, token FROM claim(%s, 'ship', 'k-token', '{}', '1 hour')", (t,))[0]
    st = sqlstate_of(lambda: query(c.app, "SELECT complete(%s, %s, 200, '{}', NULL)", (t2, d[1])))
    state = one(c.admin[w1], "SELECT state::text FROM idem_records WHERE tenant = %s AND key = 'k-token'", (t,))
    check("a token sent with another tenant of its node is refused with 55000, the attempt stays open",
          d[0] == "proceed" and st == "55000" and state == "processing", "%r %s %s" % (d, st, state))
    ok = one(c.app, "SELECT complete(%s, %s, 200, '{}', NULL)", (t, d[1]))
    state = one(c.admin[w1], "SELECT state::text FROM idem_records WHERE tenant = %s AND key = 'k-token'", (t,))
    check("  ... and with its own tenant it completes", ok is True and state == "succeeded", "%s %s" % (ok, state))


def test_null_tenant(c):
    """A NULL tenant is refused with 22004 while the call is planned, before
    Citus's delegation (which ends the backend on a NULL distribution
    argument): in every form of call, on the coordinator and on a worker."""
    w1, w2 = c.worker_ports
    t = c.tenant_on(w1, "nulls")
    calls = [
        ("SELECT * FROM pay(NULL, ...)", "SELECT * FROM pay(NULL, 'k-null', 100, 'EUR')"),
        ("SELECT pay(NULL, ...)", "SELECT pay(NULL, 'k-null', 100, 'EUR')"),
        ("SELECT * FROM claim(NULL, ...)", "SELECT * FROM claim(NULL, 'ship', 'k-null', '{}', '1 hour')"),
        ("SELECT claim(NULL, ...)", "SELECT claim(NULL, 'ship', 'k-null', '{}', '1 hour')"),
        ("SELECT * FROM complete(NULL, ...)", "SELECT * FROM complete(NULL, '1.1.x', 200, '{}', NULL)"),
        ("SELECT fail(NULL, ...)", "SELECT fail(NULL, '1.1.x', 503, '{}', true)"),
        ("pay(NULL::text, ...) inside BEGIN", "BEGIN; SELECT * FROM pay(NULL::text, 'k-null', 100, 'EUR')"),
        ("the tenant NULL from a subquery",
         "SELECT (pay(v.t, 'k-null', 100, 'EUR')).outcome FROM (SELECT NULL::text AS t) v"),
    ]
    before = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
    for port in (c.coord_port, w2):
        app = connect(port, "idem_app")
        for name, sql in calls:
            st = sqlstate_of(lambda: query(app, sql))
            query(app, "ROLLBACK")
            alive = sqlstate_of(lambda: query(app, "SELECT 1"))
            check("node %s: %s refused with 22004, the session goes on" % (port, name),
                  st == "22004" and alive is None and not app.closed, "got %s, then %s" % (st, alive))
        # A prepared statement: each execution plans the call with its
        # tenant as a constant (Citus turns generic plans away), so it is
        # delegated, and a NULL is refused the same way.
        query(app, "PREPARE p(text, text) AS SELECT outcome FROM pay($1, $2, 100, 'EUR')")
        outcomes = [one(app, "EXECUTE p(%s, %s)", (t, "k-prepared-%s-%d" % (port, i))) for i in range(7)]
        records = [c.records(t, "k-prepared-%s-%d" % (port, i)) for i in range(7)]
        st = sqlstate_of(lambda: query(app, "EXECUTE p(NULL, 'k-null')"))
        check("node %s: a prepared pay, executed 7 times, proceeds on the tenant's node each time; "
              "executed with a NULL tenant, refused with 22004" % port,
              outcomes == ["proceed"] * 7 and st == "22004"
              and all(r == {c.coord_port: 0, w1: 1, w2: 0} for r in records),
              "%r %s %r" % (outcomes, st, records))
        app.close()
    after = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
    check("  ... no record of a NULL tenant anywhere, nothing else written",
          after[w1] == before[w1] + 14 and after[c.coord_port] == before[c.coord_port]
          and after[w2] == before[w2], "%r -> %r" % (before, after))


def test_null_direct(c):
    """The delegated functions called directly with a NULL tenant, around
    pay, claim, complete and fail: by the application role (which has
    EXECUTE on them, as inlining needs) and by a role without EXECUTE (the
    planner reaches Citus's delegation before any permission check).  Citus
    13.2.2 ends the backend when it delegates a call with a NULL
    distribution argument; the delegated functions are STRICT, so the
    planner makes such a call NULL first: no crash, nothing written."""
    query(c.coord, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_stranger') "
                   "THEN CREATE ROLE idem_stranger LOGIN; END IF; END $$")
    # Every argument NULL, so that the calls hold whatever the functions'
    # other arguments are.
    nargs = dict(query(c.coord, """SELECT proname::text, pronargs FROM pg_proc
                                   WHERE proname IN ('pay_delegated', 'claim_delegated',
                                                     'complete_delegated', 'fail_delegated')
                                     AND pronamespace = 'public'::regnamespace"""))
    nulls = {f: ", ".join(["NULL"] * (n - 1)) for f, n in nargs.items()}
    calls = [
        ("SELECT pay_delegated(NULL, ...)", "SELECT pay_delegated(NULL, %s)" % nulls["pay_delegated"]),
        ("SELECT * FROM pay_delegated(NULL::text, ...)",
         "SELECT * FROM pay_delegated(NULL::text, %s)" % nulls["pay_delegated"]),
        ("SELECT * FROM claim_delegated(NULL, ...)",
         "SELECT * FROM claim_delegated(NULL, %s)" % nulls["claim_delegated"]),
        ("SELECT complete_delegated(NULL, ...)",
         "SELECT complete_delegated(NULL, %s)" % nulls["complete_delegated"]),
        ("SELECT * FROM fail_delegated(NULL, ...) inside BEGIN",
         "BEGIN; SELECT * FROM fail_delegated(NULL, %s)" % nulls["fail_delegated"]),
    ]
    started = {p: one(x, "SELECT pg_postmaster_start_time()") for p, x in c.admin.items()}
    before = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
    for port in [c.coord_port] + c.worker_ports:
        for role in ("idem_app", "idem_stranger"):
            conn = connect(port, role)
            for name, sql in calls:
                st = sqlstate_of(lambda: query(conn, sql))
                query(conn, "ROLLBACK")
                alive = sqlstate_of(lambda: query(conn, "SELECT 1"))
                check("node %s, as %s: %s answers NULL without error, the session goes on"
                      % (port, role, name), st is None and alive is None and not conn.closed,
                      "got %s, then %s" % (st, alive))
            # A prepared statement: Citus plans each execution with the
            # tenant as a constant.
            query(conn, "PREPARE d(text) AS SELECT (claim_delegated($1, %s)).outcome"
                  % nulls["claim_delegated"])
            outs = [sqlstate_of(lambda: query(conn, "EXECUTE d(NULL)")) for _ in range(7)]
            check("node %s, as %s: a prepared claim_delegated executed 7 times with a NULL tenant, no error"
                  % (port, role), outs == [None] * 7, repr(outs))
            conn.close()
    after = {p: one(x, "SELECT count(*) FROM idem_records") for p, x in c.admin.items()}
    check("  ... nothing written on any node", before == after, "%r -> %r" % (before, after))
    now = {p: one(x, "SELECT pg_postmaster_start_time()") for p, x in c.admin.items()}
    check("  ... and no node restarted", now == started, "%r -> %r" % (started, now))


def test_concurrent(c):
    w1, w2 = c.worker_ports
    t = c.tenant_on(w2, "busy")
    clients = 8
    barrier = threading.Barrier(clients)
    answers = []
    errors = []
    lock = threading.Lock()

    def client():
        conn = connect(c.coord_port, "idem_app")
        try:
            barrier.wait()
            for _ in range(1000):
                outcome, payment = c.pay(t, "k-race", conn)
                if outcome != "in_progress":
                    with lock:
                        answers.append((outcome, payment))
                    return
            with lock:
                errors.append("in_progress 1000 times")
        except psycopg2.Error as e:
            with lock:
                errors.append("%s %s" % (e.pgcode, e))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    proceeds = [a for a in answers if a[0] == "proceed"]
    ids = {a[1] for a in answers}
    check("%d concurrent sends of one key: one proceed, the others replay the same payment" % clients,
          not errors and len(answers) == clients and len(proceeds) == 1 and len(ids) == 1
          and all(a[0] in ("proceed", "replay") for a in answers),
          "answers %r, errors %r" % (answers, errors))
    check("  ... one payment, one record, on the tenant's node",
          c.payments(t, "k-race") == 1 and c.records(t, "k-race") == {c.coord_port: 0, w1: 0, w2: 1},
          repr(c.records(t, "k-race")))


def test_maintenance(c):
    """The passes on each node, by SQL and by the worker: each serves the
    records of its own idem_records."""
    for port in c.worker_ports:
        t = c.tenant_on(port, "lease")
        node = c.admin[port]
        d = query(c.app, "SELECT outcome, token FROM claim(%s, 'ship', 'k-lease', '{}', '1 microsecond')",
                  (t,))[0]
        expired = one(node, "SELECT idem_expire_leases()")
        state = one(node, "SELECT state::text FROM idem_records WHERE tenant = %s AND key = 'k-lease'", (t,))
        check("node %s: idem_expire_leases() ends the lease of a claim delegated there" % port,
              d[0] == "proceed" and expired >= 1 and state == "unknown", "%r %s %s" % (d, expired, state))
        st = sqlstate_of(lambda: query(c.app, "SELECT complete(%s, %s, 200, '{}', NULL)", (t, d[1])))
        check("  ... its token is refused afterwards (no effect recorded after the lease)", st is not None,
              "completed")
        # A record past its expiry, written on the node by a claim there.
        query(node, """SELECT idem_complete(token, 200)
                         FROM idem_claim('ship', 'k-expired', tenant => %s, ttl => '1 microsecond')""",
              (t,))
        deleted = one(node, "SELECT idem_cleanup()")
        left = one(node, "SELECT count(*) FROM idem_records WHERE tenant = %s AND key = 'k-expired'", (t,))
        check("node %s: idem_cleanup() deletes its expired records" % port, deleted >= 1 and left == 0,
              "deleted %s, left %s" % (deleted, left))
    check("the coordinator: idem_expire_leases() and idem_cleanup() run, with no record to pass over",
          one(c.coord, "SELECT idem_expire_leases() + idem_cleanup()") == 0
          and one(c.coord, "SELECT count(*) FROM idem_records") == 0)

    # The worker of each node, started from SQL: a lease that ended on each
    # worker node is expired by that node's worker.
    keys = {}
    for port in c.worker_ports:
        t = c.tenant_on(port, "bgw")
        query(c.app, "SELECT claim(%s, 'ship', 'k-bgw', '{}', '1 microsecond')", (t,))
        keys[port] = t
    for port, conn in c.admin.items():
        query(conn, "SELECT idem_launch_worker()")
    deadline = time.monotonic() + 60
    states = {}
    while time.monotonic() < deadline:
        states = {p: one(c.admin[p], "SELECT state::text FROM idem_records WHERE tenant = %s AND key = 'k-bgw'",
                         (t,)) for p, t in keys.items()}
        cycles = {p: query(x, """SELECT cycles, last_error FROM idem_worker_status()
                                  WHERE database = current_database()""")
                  for p, x in c.admin.items()}
        if all(s == "unknown" for s in states.values()) and \
                all(r and r[0][0] >= 1 for r in cycles.values()):
            break
        time.sleep(0.2)
    check("each worker node's background worker expires the leases of its own records",
          all(s == "unknown" for s in states.values()), repr(states))
    check("  ... and the three nodes' workers run their cycles without an error",
          all(r and r[0][0] >= 1 and r[0][1] is None for r in cycles.values()), repr(cycles))


def test_move(c):
    w1, w2 = c.worker_ports
    t = c.tenant_on(w1, "moving")
    shard = one(c.coord, "SELECT get_shard_id_for_distribution_column('payments', %s)", (t,))
    first = c.pay(t, "k-move")
    check("before the move: the key proceeds", first[0] == "proceed", repr(first))

    def move(src, dst):
        query(c.coord, """SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,
                                                              shard_transfer_mode => 'block_writes')""",
              (shard, src, dst))

    move(w1, w2)
    check("citus_move_shard_placement moved the tenant's shard", c.node_of(t) == w2)
    before = c.records(t, "k-move")
    st = sqlstate_of(lambda: c.pay(t, "k-move"))
    check("after the move, the retry (delegated to the new node, which has no record of it) is refused with 22023",
          st == "22023", "got %s" % st)
    st = sqlstate_of(lambda: c.pay(t, "k-after-move"))
    check("  ... and so is a new key of the tenant", st == "22023", "got %s" % st)
    # The refusal tells the application role nothing it cannot read:
    # records_home, where the records of the shard are, is not its.
    home = one(c.coord, "SELECT groupid FROM records_home WHERE shardid = %s", (shard,))
    denied = sqlstate_of(lambda: one(c.app, "SELECT count(*) FROM records_home"))
    try:
        c.pay(t, "k-after-move")
        said = ""
    except psycopg2.Error as e:
        said = " ".join(x or "" for x in (e.diag.message_primary, e.diag.message_detail, e.diag.message_hint))
    check("  ... its message, detail and hint do not show the application role the group of the "
          "shard's records (records_home, which it may not read)",
          denied == "42501" and said and not re.search(r"\bgroup %d\b" % home, said),
          "%s %r" % (denied, said))
    st = sqlstate_of(lambda: query(connect(w1, "idem_app"),
                                   "SELECT (pay(v.t, 'k-move', 100, 'EUR')).outcome FROM (SELECT %s::text AS t) v",
                                   (t,)))
    check("  ... and a call on the old node, not delegated", st == "22023", "got %s" % st)
    check("  ... nothing written: one payment, the record on the old node only",
          c.payments(t, "k-move") == 1 and c.payments(t, "k-after-move") == 0
          and c.records(t, "k-move") == before == {c.coord_port: 0, w1: 1, w2: 0}, repr(before))
    move(w2, w1)
    again = c.pay(t, "k-move")
    check("moved back to the node of its records: the retry replays the same payment",
          again == ("replay", first[1]) and c.payments(t, "k-move") == 1, repr(again))


def placements(c):
    return query(c.coord, "SELECT shardid, groupid FROM pg_dist_placement ORDER BY shardid")


def test_pinned(c):
    """The rebalancer and citus_drain_node leave the shards of payments'
    colocation group where they are (the default strategy, pin_records)."""
    w1, w2 = c.worker_ports
    t = c.tenant_on(w1, "pinned")
    first = c.pay(t, "k-pinned")
    # The coordinator may hold shards: the rebalancer then wants to move some there.
    query(c.coord, "SELECT citus_set_node_property('127.0.0.1', %s, 'shouldhaveshards', true)", (c.coord_port,))
    try:
        by_count = one(c.coord, """SELECT count(*) FROM get_rebalance_table_shards_plan('payments',
                                           rebalance_strategy => 'by_shard_count')""")
        pinned = one(c.coord, "SELECT count(*) FROM get_rebalance_table_shards_plan('payments')")
        check("with a node that has no shards, the strategy by_shard_count would move shards of payments,"
              " the default strategy pin_records none", by_count > 0 and pinned == 0,
              "%s moves, then %s" % (by_count, pinned))
        before = placements(c)
        query(c.coord, "SELECT rebalance_table_shards('payments')")
        check("  ... rebalance_table_shards moves none", placements(c) == before)
        query(c.coord, "SELECT citus_drain_node('127.0.0.1', %s)", (w1,))
        check("  ... nor does citus_drain_node of the tenant's node", placements(c) == before)
    finally:
        query(c.coord, "SELECT citus_set_node_property('127.0.0.1', %s, 'shouldhaveshards', true)", (w1,))
        query(c.coord, "SELECT citus_set_node_property('127.0.0.1', %s, 'shouldhaveshards', false)",
              (c.coord_port,))
    again = c.pay(t, "k-pinned")
    check("  ... and the retry replays the same payment on the tenant's node",
          first[0] == "proceed" and again == ("replay", first[1]), "%r then %r" % (first, again))


SHARD_ROWS = "SELECT * FROM idem_records WHERE get_shard_id_for_distribution_column('payments', tenant) = %d"


def test_carried(c):
    """A shard moved by hand with its records (README.md, "Moving a shard
    with its records"): retries replay on the new node, open attempts'
    tokens still work there, a claim in flight when the move starts is
    waited for and carried, and the calls in between are refused."""
    import io
    w1, w2 = c.worker_ports
    t = c.tenant_on(w1, "carried")
    shard = one(c.coord, "SELECT get_shard_id_for_distribution_column('payments', %s)", (t,))
    paid = c.pay(t, "k-carried")
    opened = query(c.app, "SELECT outcome, token FROM claim(%s, 'ship', 'k-open', '{}', '1 hour')", (t,))[0]
    # A claim in flight: its transaction is open on the tenant's node.
    inflight = connect(c.coord_port, "idem_app")
    inflight.autocommit = False
    flying = c.pay(t, "k-inflight", inflight)

    # 1. Block the shard's tenants: no node holds their records now.
    query(c.coord, "DELETE FROM records_home WHERE shardid = %s", (shard,))
    st = sqlstate_of(lambda: c.pay(t, "k-blocked"))
    check("moving by hand: once its records_home row is deleted, the shard's tenants are refused (22023)",
          paid[0] == opened[0] == flying[0] == "proceed" and st == "22023",
          "%r %r %r %s" % (paid, opened, flying, st))
    # 2. Wait, on the old node, for the claims that passed the check.
    lock = connect(w1)
    lock.autocommit = False
    done = threading.Event()

    def take_lock():
        query(lock, "SELECT lock_shard_metadata(7, ARRAY[%s]::bigint[])", (shard,))
        lock.commit()
        done.set()

    th = threading.Thread(target=take_lock)
    th.start()
    deadline = time.monotonic() + 60
    waiting = False
    while time.monotonic() < deadline and not waiting:
        waiting = one(c.admin[w1], """SELECT count(*) FROM pg_stat_activity
                                       WHERE wait_event_type = 'Lock'
                                         AND position('lock_shard_metadata(7' IN query) > 0""") > 0
        if not waiting:
            time.sleep(0.1)
    check("  ... the exclusive lock of the shard's metadata on the old node waits for the claim in flight",
          waiting and not done.is_set())
    inflight.commit()
    inflight.close()
    th.join(60)
    check("  ... and is granted once it commits", done.is_set())
    lock.close()
    # 3. Copy the shard's records, ids and tokens as they are, to the new node.
    buf = io.StringIO()
    with c.admin[w1].cursor() as cur:
        cur.copy_expert("COPY (%s) TO STDOUT" % (SHARD_ROWS % shard), buf)
    buf.seek(0)
    with c.admin[w2].cursor() as cur:
        cur.copy_expert("COPY idem_records FROM STDIN", buf)
    # 4. Move the shard.  5. Its records are on the new node.
    query(c.coord, """SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,
                                                          shard_transfer_mode => 'block_writes')""",
          (shard, w1, w2))
    query(c.coord, """INSERT INTO records_home (shardid, groupid)
                      SELECT %s, groupid FROM pg_dist_node WHERE nodeport = %s""", (shard, w2))
    # 6. Delete them on the old node.
    query(c.admin[w1], "DELETE FROM idem_records WHERE get_shard_id_for_distribution_column('payments', tenant) = %s",
          (shard,))

    again = c.pay(t, "k-carried")
    late = c.pay(t, "k-inflight")
    check("after the move: the retry of a key paid before it replays the same payment, on the new node",
          c.node_of(t) == w2 and again == ("replay", paid[1]) and c.payments(t, "k-carried") == 1,
          "%r then %r" % (paid, again))
    check("  ... so does the key claimed in flight when the move started",
          late == ("replay", flying[1]) and c.payments(t, "k-inflight") == 1, "%r then %r" % (flying, late))
    done_ok = sqlstate_of(lambda: query(c.app, "SELECT complete(%s, %s, 200, '{}', NULL)", (t, opened[1])))
    state = one(c.admin[w2], "SELECT state::text FROM idem_records WHERE tenant = %s AND key = 'k-open'", (t,))
    check("  ... the token of an attempt opened before the move completes it on the new node",
          done_ok is None and state == "succeeded", "%s %s" % (done_ok, state))
    check("  ... the tenant's records are on the new node only, none was refused a key",
          {k: c.records(t, k) for k in ("k-carried", "k-open", "k-inflight", "k-blocked")}
          == {"k-carried": {c.coord_port: 0, w1: 0, w2: 1}, "k-open": {c.coord_port: 0, w1: 0, w2: 1},
              "k-inflight": {c.coord_port: 0, w1: 0, w2: 1}, "k-blocked": {c.coord_port: 0, w1: 0, w2: 0}},
          repr({k: c.records(t, k) for k in ("k-carried", "k-open", "k-inflight")}))
    new = c.pay(t, "k-after-carry")
    check("  ... and a new key proceeds there", new[0] == "proceed"
          and c.records(t, "k-after-carry") == {c.coord_port: 0, w1: 0, w2: 1}, repr(new))


def test_refusals(c):
    """idem_records made a Citus table in each way: refused everywhere it is one."""
    ports = [c.coord_port] + c.worker_ports
    kinds = [
        ("distributed by tenant", ["SET citus.enable_unsafe_triggers = on",
                                   "ALTER TABLE idem_records DROP CONSTRAINT idem_records_pkey, ADD PRIMARY KEY (id, tenant)",
                                   "SELECT create_distributed_table('idem_records', 'tenant')"]),
        ("a reference table", ["SET citus.enable_unsafe_triggers = on",
                               "SELECT create_reference_table('idem_records')"]),
        ("added to the metadata as a local table", ["SET citus.enable_unsafe_triggers = on",
                                                    "SELECT citus_add_local_table_to_metadata('idem_records')"]),
    ]
    for (kind, steps), db in zip(kinds, REFUSED_DBS):
        admin = {p: connect(p, dbname=db) for p in ports}
        coord = admin[c.coord_port]
        query(coord, "CREATE EXTENSION IF NOT EXISTS idempotency")
        query(coord, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
        # A session on each node that has used the extension (its lookups
        # are made), holding a token of an open attempt.
        warm = {p: connect(p, dbname=db) for p in ports}
        tokens = {p: one(w, "SELECT token FROM idem_claim('op', 'warm', lease => '1h')")
                  for p, w in warm.items()}
        # Emptied (DELETE keeps the sessions' lookups): Citus copies a
        # table's rows into its new shards, where the extension's trigger
        # refuses them on a node where idem_records is already a Citus table.
        for p in ports:
            query(admin[p], "DELETE FROM idem_records")
        try:
            for step in steps:
                query(coord, step)
        except psycopg2.Error as e:
            # Citus 13.2 refuses this way itself: it would drop the
            # identity's sequence, which belongs to the extension.
            nowhere = all(one(admin[p], """SELECT count(*) FROM pg_dist_partition
                                            WHERE logicalrelid = 'idem_records'::regclass""") == 0
                          for p in ports)
            check("idem_records %s: Citus refuses (%s), and it stays an ordinary table on every node"
                  % (kind, e.pgcode), nowhere and kind == "added to the metadata as a local table",
                  str(e).splitlines()[0])
            continue
        changed_at = one(coord, "SELECT now()")
        for p in ports:
            cit = one(admin[p], """SELECT count(*) FROM pg_dist_partition
                                    WHERE logicalrelid = 'idem_records'::regclass""")
            where = "coordinator" if p == c.coord_port else "worker %s" % p
            if kind != "added to the metadata as a local table" or p == c.coord_port:
                check("idem_records %s: a Citus table on the %s%s" % (
                      kind, where, "" if p == c.coord_port else " (its shell)"), cit == 1)
            if cit == 0:
                st = sqlstate_of(lambda: query(admin[p], "SELECT idem_claim('op', 'local')"))
                check("  ... not one on the %s: a claim there writes its own ordinary table" % where,
                      st is None, "got %s" % st)
                continue
            heap = "SELECT tuple_count + dead_tuple_count FROM pgstattuple('idem_records')"
            before = one(admin[p], heap)
            calls = [
                ("a claim", "SELECT idem_claim('op', 'k1')"),
                ("a claim with the text API", "SELECT idem_claim_text('op', 'k1', '{}')"),
                ("claims of many keys", "SELECT idem_claim_many('op', ARRAY['a', 'b'])"),
                ("a completion", "SELECT idem_complete('%s', 200)" % tokens[p]),
                ("a failure", "SELECT idem_fail('%s', 503)" % tokens[p]),
                ("a heartbeat", "SELECT idem_heartbeat('%s', '1h')" % tokens[p]),
                ("idem_expire_leases()", "SELECT idem_expire_leases()"),
                ("idem_cleanup()", "SELECT idem_cleanup()"),
            ]
            fresh = connect(p, dbname=db)
            states = {}
            for name, sql in calls:
                for who, conn in (("a new session", fresh), ("a session that used it before", warm[p])):
                    states["%s, %s" % (name, who)] = sqlstate_of(lambda: query(conn, sql))
            bad = {k: v for k, v in states.items() if v != "55000"}
            check("  ... on the %s: every claim, completion and pass refused with 55000, "
                  "in new sessions and in one that used the extension before" % where, not bad, repr(bad))
            after = one(admin[p], heap)
            check("  ... and nothing written to the node's idem_records", before == after,
                  "%s tuples, then %s" % (before, after))
            fresh.close()
            # The node's background worker refuses its passes the same way.
            query(admin[p], "SELECT idem_launch_worker() WHERE NOT EXISTS "
                            "(SELECT 1 FROM idem_worker_status() WHERE database = current_database() AND pid IS NOT NULL)")
            deadline = time.monotonic() + 60
            err = None
            while time.monotonic() < deadline:
                r = query(admin[p], """SELECT last_error FROM idem_worker_status()
                                        WHERE database = current_database() AND last_error_at > %s""",
                          (changed_at,))
                if r:
                    err = r[0][0]
                    break
                time.sleep(0.2)
            check("  ... and the node's background worker fails its cycles with the same error",
                  err is not None and "is a Citus table" in err, repr(err))
            check("  ... still nothing written", one(admin[p], heap) == after)
        for w in list(warm.values()) + list(admin.values()):
            w.close()


def test_hostile(c):
    """Attacks by the application role itself, on the coordinator."""
    w1, w2 = c.worker_ports
    # The check reads pg_dist_local_group, pg_dist_placement and records_home
    # by the caller's search_path, where pg_temp comes first: temporary
    # tables of those names make a call that Citus did not delegate pass it
    # on the coordinator, which claims in its own idem_records.
    t = c.tenant_on(w1, "spoof")
    app = connect(c.coord_port, "idem_app")
    shard = one(app, "SELECT get_shard_id_for_distribution_column('payments', %s)", (t,))
    query(app, "CREATE TEMP TABLE pg_dist_local_group (groupid integer); "
               "INSERT INTO pg_dist_local_group VALUES (0)")
    query(app, "CREATE TEMP TABLE pg_dist_placement (shardid bigint, groupid integer); "
               "INSERT INTO pg_dist_placement VALUES (%s, 0)", (shard,))
    query(app, "CREATE TEMP TABLE records_home (shardid bigint, groupid integer); "
               "INSERT INTO records_home VALUES (%s, 0)", (shard,))
    st = sqlstate_of(lambda: query(app, "SELECT (pay(v.t, 'k-spoof', 100, 'EUR')).outcome "
                                        "FROM (SELECT %s::text AS t) v", (t,)))
    app.close()
    again = c.pay(t, "k-spoof")[0]
    check("temporary tables named like the check's catalogs: the call not delegated is refused with 22023",
          st == "22023", "got %s" % st)
    check("  ... and the key proceeds once: one payment, its record on the tenant's node only",
          again == "proceed" and c.payments(t, "k-spoof") == 1
          and c.records(t, "k-spoof") == {c.coord_port: 0, w1: 1, w2: 0},
          "%s, %s payments, records %r" % (again, c.payments(t, "k-spoof"), c.records(t, "k-spoof")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", type=int, required=True)
    ap.add_argument("--workers", required=True)
    args = ap.parse_args()
    c = Cluster(args.coordinator, [int(p) for p in args.workers.split(",")])
    for test in (test_layout, test_roles, test_null_tenant, test_null_direct, test_concurrent, test_maintenance, test_move, test_pinned,
                 test_carried, test_refusals, test_hostile):
        try:
            test(c)
        except Exception as e:  # a test that broke counts as a failure
            check(test.__name__ + " ran to its end", False, "%s: %s" % (type(e).__name__, e))
    print("%d passed, %d failed" % (passed, failed), flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
