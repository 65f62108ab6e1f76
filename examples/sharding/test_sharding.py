#!/usr/bin/env python3
"""examples/sharding/test_sharding.py: end-to-end test of the PL/Proxy layout.

Runs against the layout of layout.sh (shard.sql in four shard databases,
proxy.sql in the proxy database), already set up in a running cluster:

    PGHOST=127.0.0.1 PGPORT=5432 python3 test_sharding.py \
        --proxy idem_proxy --shards idem_shard0,idem_shard1,idem_shard2,idem_shard3

Application calls go through the proxy as the role idem_app; the checks read
the shards directly as postgres.  Concurrent clients send payments (the
one-transaction pattern) and shipments (the three-transaction pattern) of
many tenants, each key several times at once, and retry while the answer is
in_progress; then every key must have exactly one effect, and every tenant's
rows must be on exactly one shard, the one PL/Proxy routes it to.  Prints a
line per check and "N passed, N failed"; exits non-zero on a failure.
"""

import argparse
import collections
import io
import os
import random
import sys
import threading
import time

import psycopg2
import psycopg2.errors

TENANTS = ["tenant-%02d" % i for i in range(32)]
PAY_KEYS = 6        # payment keys per tenant
SHIP_KEYS = 3       # shipment keys per tenant
SENDS = 3           # each key is sent this many times, by different clients
CLIENTS = 8

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("ok     " + name, flush=True)
    else:
        failed += 1
        print("FAILED " + name + (": " + detail if detail else ""), flush=True)


def connect(dbname, user):
    conn = psycopg2.connect(dbname=dbname, user=user,
                            host=os.environ.get("PGHOST", "127.0.0.1"),
                            port=os.environ.get("PGPORT", "5432"))
    conn.autocommit = True
    return conn


def query(conn, sql, args=()):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def sqlstate_of(fn):
    """The SQLSTATE fn raises, or None."""
    try:
        fn()
    except psycopg2.Error as e:
        return e.pgcode
    return None


def run_clients(proxy, items, call):
    """Send every item SENDS times, by SENDS different clients (threads with
    a connection each) at about the same moment: item i goes to clients i,
    i + 1, ... (modulo CLIENTS), which take their items in order.  Each send
    is call(conn, item), repeated while it answers in_progress.  Returns the
    answers per (tenant, key), the number of retries and the errors."""
    answers = collections.defaultdict(list)
    retries = [0]
    errors = []
    lock = threading.Lock()
    queues = [[] for _ in range(CLIENTS)]
    for i, item in enumerate(items):
        for s in range(SENDS):
            queues[(i + s) % CLIENTS].append(item)

    def client(items):
        try:
            conn = connect(proxy, "idem_app")
            for item in items:
                # Until the answer is not in_progress: the claim of the
                # client that proceeds ends when that client completes it,
                # however slow the machine (a count of retries would depend
                # on its speed); the suite's time limit bounds a key that
                # stays in progress for good.
                while True:
                    answer = call(conn, item)
                    if answer[0] != "in_progress":
                        break
                    with lock:
                        retries[0] += 1
                    # a real client waits retry_after seconds; the test
                    # retries sooner, which changes nothing but the pace
                    time.sleep(0.005)
                with lock:
                    answers[item[:2]].append(answer)
            conn.close()
        except Exception as e:  # reported below, as a failed check
            with lock:
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(q,)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, retries[0], errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proxy", default="idem_proxy")
    parser.add_argument("--shards", default="idem_shard0,idem_shard1,idem_shard2,idem_shard3")
    parser.add_argument("--split", metavar="DB:P",
                        help="a database set up by shard.sql as partition P + 4 of 8, for the"
                             " resharding check")
    args = parser.parse_args()
    shard_dbs = args.shards.split(",")
    rng = random.Random(19)

    admin = connect(args.proxy, "postgres")
    shards = [connect(db, "postgres") for db in shard_dbs]
    app = connect(args.proxy, "idem_app")

    # Where PL/Proxy sends each tenant: partition hashtext(tenant) & 3.
    home = dict(query(admin, "SELECT t, hashtext(t) & %s FROM unnest(%s::text[]) t",
                      (len(shard_dbs) - 1, TENANTS)))
    check("the tenants of the test hash to all %d shards" % len(shard_dbs),
          sorted(set(home.values())) == list(range(len(shard_dbs))), repr(home))

    # -- The one-transaction pattern, concurrently: every key sent SENDS
    # times at about the same moment by different clients.
    amount = {(t, "pay-%d" % k): rng.randint(1, 100000) for t in TENANTS for k in range(PAY_KEYS)}
    work = [(t, k, a) for (t, k), a in amount.items()]
    rng.shuffle(work)

    def pay(conn, item):
        return query(conn, "SELECT outcome, http_status, payment_id FROM pay(%s, %s, %s, 'EUR')",
                     item)[0]

    answers, retries, errors = run_clients(args.proxy, work, pay)
    check("one-transaction pattern: %d clients send %d payment keys %d times each, without error"
          % (CLIENTS, len(amount), SENDS), not errors, "; ".join(errors[:3]))
    print("       (%d in_progress answers retried)" % retries, flush=True)
    bad = {k: v for k, v in answers.items()
           if len(v) != SENDS or sorted(a[0] for a in v) != ["proceed"] + ["replay"] * (SENDS - 1)}
    check("  ... each key answered proceed once and replay for every other send",
          not bad, repr(list(bad.items())[:3]))
    bad = {k: v for k, v in answers.items() if len({a[2] for a in v}) != 1 or v[0][2] is None}
    check("  ... and every answer of a key names the same payment", not bad,
          repr(list(bad.items())[:3]))

    payments = collections.defaultdict(list)
    for i, conn in enumerate(shards):
        for tenant, key, pay_id, amt in query(
                conn, "SELECT tenant, idempotency_key, id, amount FROM payments"):
            payments[(tenant, key)].append((i, pay_id, amt))
    check("  ... exactly one payment per key across all shards, with the key's amount",
          sorted(payments) == sorted(amount)
          and all(len(v) == 1 and v[0][2] == amount[k] for k, v in payments.items()),
          "%d keys, %d with payments" % (len(amount), len(payments)))
    check("  ... the payment is the one the answers name",
          all(payments[k][0][1] == answers[k][0][2] for k in amount if k in payments))

    # A key reused with another amount: 422, and no payment.
    reused = [k for i, k in enumerate(sorted(amount)) if i % 6 == 0]
    outcomes = {query(app, "SELECT outcome || ' ' || http_status FROM pay(%s, %s, %s, 'EUR')",
                      (t, k, amount[(t, k)] + 1))[0][0] for t, k in reused}
    count = sum(query(c, "SELECT count(*) FROM payments")[0][0] for c in shards)
    check("a key reused with another amount answers mismatch 422 on its shard, and pays nothing",
          outcomes == {"mismatch 422"} and count == len(amount), "%r, %d payments" % (outcomes, count))

    # -- The three-transaction pattern, concurrently: claim, the external
    # call, complete with the token and the tenant; other sends of the key
    # answer in_progress until then, and are retried.
    effects = collections.Counter()
    effects_lock = threading.Lock()
    ship_keys = [(t, "ship-%d" % k) for t in TENANTS for k in range(SHIP_KEYS)]
    work = [(t, k, 0) for t, k in ship_keys]
    rng.shuffle(work)

    def ship(conn, item):
        tenant, key, _ = item
        outcome, token, resource = query(
            conn, "SELECT outcome, token, resource_id FROM claim(%s, 'shipments.create', %s, "
                  "'{\"parcel\": 1}', '5min')", (tenant, key))[0]
        if outcome != "proceed":
            return (outcome, None, resource)
        with effects_lock:
            effects[(tenant, key)] += 1          # the external call
        resource = "ship-%s-%s" % (tenant, key)
        query(conn, "SELECT complete(%s, %s, 201, %s, %s)",
              (tenant, token, '{"shipped": true}', resource))
        return ("proceed", None, resource)

    answers, retries, errors = run_clients(args.proxy, work, ship)
    check("three-transaction pattern: %d clients send %d shipment keys %d times each, without error"
          % (CLIENTS, len(ship_keys), SENDS), not errors, "; ".join(errors[:3]))
    print("       (%d in_progress answers retried)" % retries, flush=True)
    check("  ... one external call per key", sorted(effects) == sorted(ship_keys)
          and set(effects.values()) == {1}, repr(effects.most_common(3)))
    bad = {k: v for k, v in answers.items()
           if sorted(a[0] for a in v) != ["proceed"] + ["replay"] * (SENDS - 1)
           or {a[2] for a in v} != {"ship-%s-%s" % k}}
    check("  ... proceed once, then replays of the completed response", not bad,
          repr(list(bad.items())[:3]))

    # -- A token goes back to its shard with its tenant.  Sent with a tenant
    # of another shard, it names nothing there: 55000, and nothing changes.
    tenant = TENANTS[0]
    other = next(t for t in TENANTS if home[t] != home[tenant])
    token = query(app, "SELECT token FROM claim(%s, 'shipments.create', 'routed', NULL, '5min')",
                  (tenant,))[0][0]
    state = sqlstate_of(lambda: query(app, "SELECT complete(%s, %s, 201, NULL, NULL)",
                                      (other, token)))
    still = query(app, "SELECT outcome FROM replay(%s, 'shipments.create', 'routed')", (tenant,))
    check("a token completed with a tenant of another shard raises 55000 and changes nothing",
          state == "55000" and still == [("in_progress",)], "%s, %r" % (state, still))
    query(app, "SELECT complete(%s, %s, 201, NULL, 'routed')", (tenant, token))
    check("  ... with its own tenant it completes the attempt",
          query(app, "SELECT outcome, resource_id FROM replay(%s, 'shipments.create', 'routed')",
                (tenant,)) == [("replay", "routed")])

    # ... and with another tenant of the same shard: the shard checks that
    # the token names an attempt of that tenant, so the call is refused
    # wherever the other tenant hashes.
    neighbour = next(t for t in TENANTS if t != tenant and home[t] == home[tenant])
    token = query(app, "SELECT token FROM claim(%s, 'shipments.create', 'neighbour', NULL,"
                       " '5min')", (tenant,))[0][0]
    state = sqlstate_of(lambda: query(app, "SELECT complete(%s, %s, 201, NULL, NULL)",
                                      (neighbour, token)))
    state_fail = sqlstate_of(lambda: query(app, "SELECT fail(%s, %s, 500, NULL, true)",
                                           (neighbour, token)))
    still = query(app, "SELECT outcome FROM replay(%s, 'shipments.create', 'neighbour')",
                  (tenant,))
    check("a token completed or failed with another tenant of its own shard raises 55000"
          " and changes nothing", state == "55000" and state_fail == "55000"
          and still == [("in_progress",)], "%s, %s, %r" % (state, state_fail, still))

    # A NULL tenant: the proxy cannot route it, and a shard called directly
    # refuses it (hashtext(NULL) is NULL, which no partition check may let
    # through).
    own_app = connect(shard_dbs[home[tenant]], "idem_app")
    state_proxy = sqlstate_of(lambda: query(app, "SELECT complete(NULL, %s, 201, NULL, NULL)",
                                            (token,)))
    state_direct = sqlstate_of(lambda: query(own_app, "SELECT complete(NULL, %s, 201, NULL, NULL)",
                                             (token,)))
    still = query(app, "SELECT outcome FROM replay(%s, 'shipments.create', 'neighbour')",
                  (tenant,))
    check("a NULL tenant is refused by the proxy and by the shard (22004), and changes nothing",
          state_proxy is not None and state_direct == "22004" and still == [("in_progress",)],
          "%s, %s, %r" % (state_proxy, state_direct, still))
    own_app.close()

    # Garbled tokens and odd tenants: a clear error, nothing changed.
    garbled = ["", "x", token + "0", token.split(".")[0] + ".1." + "0" * 32,
               "99999999999999999999.1." + "0" * 32, "1.1.zz", token.replace(".", ";")]
    states = [sqlstate_of(lambda: query(app, "SELECT complete(%s, %s, 201, NULL, NULL)",
                                        (tenant, g))) for g in garbled]
    still = query(app, "SELECT outcome FROM replay(%s, 'shipments.create', 'neighbour')",
                  (tenant,))
    check("garbled or forged tokens raise an error (22023 or 55000) and change nothing",
          all(s in ("22023", "55000", "22P02", "22003") for s in states)
          and still == [("in_progress",)], "%r, %r" % (states, still))
    query(app, "SELECT complete(%s, %s, 201, NULL, 'neighbour')", (tenant, token))
    # A call that reaches the wrong shard (here, directly) writes nothing.
    wrong = shards[(home[tenant] + 1) % len(shards)]
    wrong_app = connect(shard_dbs[(home[tenant] + 1) % len(shards)], "idem_app")
    state = sqlstate_of(lambda: query(wrong_app, "SELECT * FROM pay(%s, 'misrouted', 10, 'EUR')",
                                      (tenant,)))
    left = query(wrong, "SELECT (SELECT count(*) FROM payments WHERE idempotency_key = 'misrouted')"
                        " + (SELECT count(*) FROM idem_records WHERE key = 'misrouted')")[0][0]
    check("a shard refuses a tenant of another shard (22023) and writes nothing",
          state == "22023" and left == 0, "%s, %d rows" % (state, left))
    wrong_app.close()

    # The proxy's transaction does not span the shard's: the call committed
    # on its shard when it returned, and a ROLLBACK on the proxy keeps it.
    txn = connect(args.proxy, "idem_app")
    txn.autocommit = False
    query(txn, "SELECT * FROM pay(%s, 'rolled-back', 10, 'EUR')", (tenant,))
    txn.rollback()
    txn.close()
    check("a ROLLBACK on the proxy keeps what the shard committed (the retry replays)",
          query(app, "SELECT outcome FROM pay(%s, 'rolled-back', 10, 'EUR')", (tenant,))
          == [("replay",)])

    # -- Every tenant's rows on exactly one shard: the one it hashes to.
    where = collections.defaultdict(set)
    for i, conn in enumerate(shards):
        for (t,) in query(conn, "SELECT tenant FROM payments UNION SELECT tenant FROM idem_records"):
            where[t].add(i)
    check("every tenant's payments and records are on one shard, its own",
          sorted(where) == sorted(TENANTS) and all(where[t] == {home[t]} for t in TENANTS),
          repr({t: s for t, s in where.items() if s != {home.get(t)}}))
    check("  ... and all %d shards hold some" % len(shards),
          set().union(*where.values()) == set(range(len(shards))))

    # -- Gathered from all shards (RUN ON ALL).
    stats = {(op, st): (n, s) for op, st, n, s in
             query(admin, "SELECT operation, state, records, shards FROM stats()")}
    n_payments = len(amount) + 1      # and the rolled-back one
    check("stats() sums idem_stats over the shards: %d payment records, on all shards" % n_payments,
          stats.get(("payments.create", "succeeded")) == (n_payments, len(shards)),
          repr(stats))
    check("  ... and %d shipments" % (len(ship_keys) + 2),
          stats.get(("shipments.create", "succeeded")) == (len(ship_keys) + 2, len(shards)),
          repr(stats))

    # -- Resharding: doubling to eight partitions splits partition p into p
    # and p + 4.  A tenant of the new half moves with its business rows:
    # its payments, then its records, copied with COPY (which restores
    # records in any state; the target numbers them anew), then deleted at
    # the source.  The tenant has no open attempt (processing record): the
    # move happens while its writes are held back.
    if args.split:
        split_db, split_of = args.split.split(":")
        split_of = int(split_of)
        moving = next((t for t in TENANTS[1:]
                       if home[t] == split_of and query(admin, "SELECT hashtext(%s) & 7", (t,))[0][0]
                       == split_of + 4), None)
        source, target = shards[split_of], connect(split_db, "postgres")
        cols = query(source, "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)"
                             "  FROM pg_attribute WHERE attrelid = 'idem_records'::regclass"
                             "   AND attnum > 0 AND NOT attisdropped AND attname <> 'id'")[0][0]
        before = query(source, "SELECT key, state::text, response_body FROM idem_records"
                               " WHERE tenant = %s ORDER BY key", (moving,))
        open_attempts = [r for r in before if r[1] == "processing"]
        for table, columns in (("payments", "*"), ("idem_records", cols)):
            buf = io.StringIO()
            with source.cursor() as cur:
                cur.copy_expert(cur.mogrify("COPY (SELECT %s FROM %s WHERE tenant = %%s) TO STDOUT"
                                            % (columns, table), (moving,)).decode(), buf)
            buf.seek(0)
            with target.cursor() as cur:
                cur.copy_expert("COPY %s %s FROM STDIN"
                                % (table, "" if columns == "*" else "(%s)" % columns), buf)
        moved = query(target, "SELECT count(*) FROM payments WHERE tenant = %s", (moving,))[0][0]
        query(source, "BEGIN; DELETE FROM payments WHERE tenant = %s;"
                      " DELETE FROM idem_records WHERE tenant = %s; COMMIT", (moving, moving))
        after = query(target, "SELECT key, state::text, response_body FROM idem_records"
                              " WHERE tenant = %s ORDER BY key", (moving,))
        check("resharding: tenant %s moves from partition %d of 4 to %d of 8 with its %d payments"
              " and %d records, none of them open" % (moving, split_of, split_of + 4,
                                                      moved, len(before)),
              moving is not None and not open_attempts and before and after == before
              and moved == PAY_KEYS, repr(open_attempts))
        split_app = connect(split_db, "idem_app")
        answers = [query(split_app, "SELECT outcome, payment_id FROM pay(%s, %s, %s, 'EUR')",
                         (moving, k, a))[0] for (t, k), a in sorted(amount.items()) if t == moving]
        paid = dict(query(target, "SELECT idempotency_key, id FROM payments WHERE tenant = %s",
                          (moving,)))
        check("  ... where its retries replay the same payments, and pay nothing new",
              len(answers) == PAY_KEYS
              and answers == [("replay", paid["pay-%d" % i]) for i in range(PAY_KEYS)]
              and len(paid) == PAY_KEYS, repr(answers))
        split_app.close()
        target.close()

    # idem_list and idem_stat_operations (version 1.1) through the proxy,
    # once the extension has them.
    has = dict(query(shards[0], "SELECT f, to_regproc(f) IS NOT NULL OR to_regclass(f) IS NOT NULL"
                                " FROM unnest(ARRAY['idem_list', 'idem_stat_operations']) f"))
    if has["idem_list"]:
        for t in TENANTS[:8]:
            query(app, "SELECT * FROM claim(%s, 'left.open', 'open', NULL, '5min')", (t,))
        rows = query(app, "SELECT shard, record ->> 'key' FROM list('processing', 'left.open')")
        check("list() gathers the calling role's processing records from every shard",
              sorted(r[0] for r in rows) == sorted(shard_dbs[home[t]] for t in TENANTS[:8])
              and {r[1] for r in rows} == {"open"}, repr(rows))
    else:
        print("skip   list(): the extension has no idem_list yet", flush=True)
    if has["idem_stat_operations"]:
        rows = query(admin, "SELECT shard, sum((counters ->> 'proceed')::bigint) FROM stat_operations()"
                            " WHERE counters ->> 'operation' = 'payments.create' GROUP BY shard")
        per_shard = collections.Counter(home[t] for t, _ in amount)
        per_shard[home[tenant]] += 1
        check("stat_operations() gathers each shard's proceed count of its own payments",
              sorted(rows) == sorted((shard_dbs[i], n) for i, n in per_shard.items()), repr(rows))
    else:
        print("skip   stat_operations(): the extension has no idem_stat_operations yet", flush=True)

    # -- Roles: PL/Proxy connects to the shard as the role that called the
    # proxy function (no user= in the connection strings), so records are
    # scoped by that role on the shard as on one server.  idem_other has
    # idem_app's privileges (a member of it) but is another role.
    query(admin, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_other')"
                 " THEN CREATE ROLE idem_other LOGIN IN ROLE idem_app; END IF; END $$")
    other_app = connect(args.proxy, "idem_other")
    token = query(app, "SELECT token FROM claim(%s, 'roles.check', 'mine', NULL, '5min')",
                  (tenant,))[0][0]
    theirs = query(other_app, "SELECT outcome FROM claim(%s, 'roles.check', 'mine', NULL, '5min')",
                   (tenant,))[0][0]
    state = sqlstate_of(lambda: query(other_app, "SELECT complete(%s, %s, 201, NULL, NULL)",
                                      (tenant, token)))
    roles = query(shards[home[tenant]], "SELECT role, state::text FROM idem_records"
                                        " WHERE operation = 'roles.check' ORDER BY role")
    check("through the proxy, another role's claim of the same key is its own (proceed), and it"
          " cannot complete the first role's token (55000)",
          theirs == "proceed" and state == "55000"
          and roles == [("idem_app", "processing"), ("idem_other", "processing")],
          "%s, %s, %r" % (theirs, state, roles))
    other_app.close()
    # After SET ROLE on the proxy, the shard sees the role set, not the
    # session's: the role that is current when the proxy function runs,
    # even when the proxy backend already has a connection to that shard
    # for the session's role.
    set_role = connect(args.proxy, "postgres")
    query(set_role, "SELECT * FROM claim(%s, 'roles.check', 'before-set-role', NULL, '5min')",
          (tenant,))
    query(set_role, "SET ROLE idem_other")
    query(set_role, "SELECT * FROM claim(%s, 'roles.check', 'set-role', NULL, '5min')", (tenant,))
    set_role.close()
    roles = query(shards[home[tenant]], "SELECT key, role FROM idem_records"
                                        " WHERE operation = 'roles.check' AND key LIKE '%%set-role'"
                                        " ORDER BY key")
    check("  ... and after SET ROLE on the proxy, PL/Proxy connects as the role set",
          roles == [("before-set-role", "postgres"), ("set-role", "idem_other")], repr(roles))

    # -- A shard that is down: a call routed to it raises an error and
    # changes nothing; calls of the other shards go on; a call gathered from
    # all shards raises rather than answer without the missing shard.
    down = shard_dbs[home[tenant]]
    up_tenant = next(t for t in TENANTS if home[t] != home[tenant])
    query(admin, "ALTER DATABASE %s ALLOW_CONNECTIONS false" % down)
    try:
        fresh = connect(args.proxy, "idem_app")     # no connection to the shard yet
        fresh_admin = connect(args.proxy, "postgres")
        state_down = sqlstate_of(lambda: query(fresh, "SELECT * FROM pay(%s, 'while-down', 7,"
                                                      " 'EUR')", (tenant,)))
        up = query(fresh, "SELECT outcome FROM pay(%s, 'while-down', 7, 'EUR')", (up_tenant,))
        state_all = sqlstate_of(lambda: query(fresh_admin, "SELECT * FROM stats()"))
        fresh.close()
        fresh_admin.close()
    finally:
        query(admin, "ALTER DATABASE %s ALLOW_CONNECTIONS true" % down)
    print("       (the call to the shard that is down: %s; stats(): %s)" % (state_down, state_all),
          flush=True)
    after = query(app, "SELECT outcome FROM pay(%s, 'while-down', 7, 'EUR')", (tenant,))
    check("a shard that is down: its tenant's call raises, another shard's call proceeds, and"
          " stats() raises rather than answer without it; once it is up the call proceeds",
          state_down is not None and up == [("proceed",)] and state_all is not None
          and after == [("proceed",)], "%s, %r, %s, %r" % (state_down, up, state_all, after))

    # -- Odd tenants through the proxy.
    odd = {"": None, " " + tenant: None, tenant + " ": None, "t\u00e9nant": None,
           "te\u0301nant": None, "\U0001f600": None}
    for t in odd:
        odd[t] = query(app, "SELECT outcome FROM pay(%s, 'odd', 5, 'EUR')", (t,))[0][0]
    placed = collections.defaultdict(set)
    for i, conn in enumerate(shards):
        for (t,) in query(conn, "SELECT tenant FROM payments WHERE idempotency_key = 'odd'"):
            placed[t].add(i)
    want = dict(query(admin, "SELECT t, hashtext(t) & %s FROM unnest(%s::text[]) t",
                      (len(shard_dbs) - 1, list(odd))))
    check("empty, space-padded and unicode tenants (composed and not) are distinct tenants,"
          " each paid once on the shard it hashes to",
          set(odd.values()) == {"proceed"} and {t: s for t, s in placed.items()}
          == {t: {want[t]} for t in odd}, "%r, %r" % (odd, dict(placed)))
    huge = "t" * 100000
    state = sqlstate_of(lambda: query(app, "SELECT * FROM pay(%s, 'huge', 5, 'EUR')", (huge,)))
    count = sum(query(c, "SELECT count(*) FROM payments WHERE idempotency_key = 'huge'")[0][0]
                for c in shards)
    check("a tenant longer than the limit raises 22023 through the proxy and pays nothing",
          state == "22023" and count == 0, "%s, %d" % (state, count))

    print("%d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
