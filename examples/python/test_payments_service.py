#!/usr/bin/env python3
"""End-to-end test of an example payments service against a running PostgreSQL.

Starts the service on a free port of 127.0.0.1, sends it real HTTP requests
and checks the answers and the payments table.  The database comes from
libpq's environment (PGHOST, PGPORT, PGDATABASE, PGUSER) and must hold
examples/schema.sql; scripts/test.sh sets all of that up.

The service is payments_service.py beside this file, or the one that
--service-command starts: any of the examples, which all take "--port 0
--quiet" and print "listening on http://127.0.0.1:PORT" first:

    test_payments_service.py --service-command "node ../node/server.js"

The checks of the expired and rate_limited answers need a superuser
connection besides (--admin-dsn, or IDEM_ADMIN_DSN in the environment): one
moves a record's expiry into the past, the other sets
idempotency.max_new_keys_per_second, a server-wide setting applied by a
reload, and resets it afterwards.  Without it they are skipped, and say so.
--no-rate-limit leaves out the rate_limited check, for a server that has no
rate limit (the SQL edition, docs/editions.md).

Prints one line per check and ends with "N passed, N failed"; exits 1 when a
check failed.  Every wait is bounded; the service is stopped whatever happens.
"""

import argparse
import http.client
import json
import os
import random
import select
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICE = os.path.join(HERE, "payments_service.py")
IN_PROGRESS = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
MISMATCH = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"
EXPIRED = "IDEMPOTENCY_KEY_EXPIRED"
RATE_LIMITED = "IDEMPOTENCY_RATE_LIMITED"
RATE_SETTING = "idempotency.max_new_keys_per_second"

passed = failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print("ok     " + name, flush=True)
    else:
        failed += 1
        print("FAILED " + name + (": " + str(detail) if detail else ""), flush=True)
    return condition


class Service:
    """The service under test as a child process: COMMAND --port 0 --quiet."""

    def __init__(self, command):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            command + ["--port", "0", "--quiet"],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        self.port = self._read_port(timeout=30)
        self._wait_for_port(timeout=30)

    def _read_port(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening on http://127.0.0.1:"):
            raise RuntimeError("service did not start: %r\n%s" % (line, self.stderr()))
        return int(line.rsplit(":", 1)[1])

    def _wait_for_port(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("service does not accept connections\n" + self.stderr())
                time.sleep(0.05)

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdout.close()


class Response:
    def __init__(self, status, header_list, raw):
        self.status, self.raw = status, raw
        self.header_list = header_list      # (name, value) in the order sent
        self.headers = {k.lower(): v for k, v in header_list}
        try:
            self.json = json.loads(raw) if raw else None
        except ValueError:
            self.json = None

    @property
    def error_code(self):
        return self.json.get("error_code") if isinstance(self.json, dict) else None

    @property
    def replayed(self):
        return self.headers.get("idempotent-replayed") == "true"

    def __repr__(self):
        return "%s %r %s" % (self.status, self.headers, self.raw[:200])


def request(port, method, path, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return Response(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


def post(port, key, body, **extra):
    headers = dict(extra)
    if key is not None:
        headers["Idempotency-Key"] = key
    return request(port, "POST", "/payments", body, headers)


def post_until_done(port, key, body, headers=None, max_tries=30, budget=60.0):
    """A well-behaved client: on 409 in progress, wait Retry-After (plus a
    little jitter) and try again; bounded in tries and time.  Returns the
    final response and how many 409s it met, or (None, n) when it gave up."""
    deadline = time.monotonic() + budget
    conflicts = 0
    for _ in range(max_tries):
        r = post(port, key, body, **(headers or {}))
        if r.status != 409 or r.error_code != IN_PROGRESS:
            return r, conflicts
        conflicts += 1
        wait = min(int(r.headers.get("retry-after", "1")), 5) + random.uniform(0, 0.2)
        if time.monotonic() + wait > deadline:
            break
        time.sleep(wait)
    return None, conflicts


def payments_for(db, key):
    with db.cursor() as cur:
        cur.execute("SELECT id FROM payments WHERE idempotency_key = %s", (key,))
        return [row[0] for row in cur.fetchall()]


def wait_for_claim_lock(db, timeout=20.0):
    """True once a transaction that wrote idem_records has not committed
    yet (docs/api.md, "Locks": it holds ROW EXCLUSIVE on the table until it
    ends): the first request has claimed and is inside its handler.  Any
    claim in the database counts: this test must be the only client of its
    database."""
    deadline = time.monotonic() + timeout
    with db.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute("""SELECT count(*) FROM pg_locks
                            WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND granted
                              AND pid <> pg_backend_pid()
                              AND relation = (SELECT oid FROM pg_class
                                               WHERE relname = 'idem_records' AND relkind = 'r')
                              AND database = (SELECT oid FROM pg_database
                                               WHERE datname = current_database())""")
            if cur.fetchone()[0] > 0:
                return True
            time.sleep(0.05)
    return False


def new_key():
    return str(uuid.uuid4())


def test_bad_keys(port, db):
    body = {"amount": 100, "currency": "EUR"}
    r = post(port, None, body)
    check("missing Idempotency-Key -> 400 IDEMPOTENCY_KEY_MISSING",
          r.status == 400 and r.error_code == "IDEMPOTENCY_KEY_MISSING", r)
    for name, key in [("empty", ""), ("too long (300 bytes)", "k" * 300),
                      ("non-ASCII", b"caf\xc3\xa9-key")]:
        r = post(port, key, body)
        check("%s Idempotency-Key -> 400 IDEMPOTENCY_KEY_INVALID (SQLSTATE 22023 from idem_claim)" % name,
              r.status == 400 and r.error_code == "IDEMPOTENCY_KEY_INVALID", r)
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments WHERE idempotency_key IN ('', %s)", ("k" * 300,))
        n = cur.fetchone()[0]
    check("no payment written for a bad key", n == 0, n)


def test_concurrent(port, db):
    key = new_key()
    body = {"amount": 1250, "currency": "EUR", "reference": "order-17"}
    results = [None] * 20
    start = threading.Barrier(20)

    def client(i):
        try:
            start.wait(30)
            # The winner's handler sleeps 1 s inside its transaction, so the
            # others meet a claim that is still running.
            results[i] = post_until_done(port, key, body, {"Simulate-Delay-Ms": "1000"})
        except Exception as e:  # reported by the checks below
            results[i] = (e, 0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    finals = [r[0] if r else None for r in results]
    conflicts = sum(r[1] for r in results if r)
    done = [r for r in finals if isinstance(r, Response)]
    check("20 concurrent identical requests all finish (retrying on 409 after Retry-After)",
          len(done) == 20, finals)
    check("all 20 end with 201", all(r.status == 201 for r in done),
          [r.status for r in done])
    check("all 20 end with the same body and Location",
          len({r.raw for r in done}) == 1 and len({r.headers.get("location") for r in done}) == 1,
          {r.raw for r in done})
    check("exactly one answer is the original, 19 are replays (Idempotent-Replayed: true)",
          sum(not r.replayed for r in done) == 1 and sum(r.replayed for r in done) == 19,
          [r.replayed for r in done])
    ids = payments_for(db, key)
    check("exactly one payment row for the key", len(ids) == 1, ids)
    check("the body names that payment",
          len(ids) == 1 and done and done[0].json.get("id") == ids[0], (ids, done[:1]))
    print("       (%d answers 409 in progress were met and retried on the way)" % conflicts, flush=True)
    return key, body, done[0] if done else None


def test_replay_and_mismatch(port, db, key, body, first):
    r = post(port, key, body)
    check("a retry after success replays: 201 with Idempotent-Replayed: true",
          r.status == 201 and r.replayed, r)
    check("the replay has the stored body and Location",
          first is not None and r.raw == first.raw
          and r.headers.get("location") == first.headers.get("location"), (r, first))

    def stored(resp):  # the headers the service stored, in order
        per_connection = ("date", "server", "content-length", "idempotent-replayed")
        return [(k, v) for k, v in resp.header_list if k.lower() not in per_connection]
    check("the replay sends the stored headers in their order",
          first is not None and stored(r) == stored(first) and len(stored(r)) >= 2,
          (stored(r), first and stored(first)))
    reordered = {k: body[k] for k in reversed(list(body))}
    r = post(port, key, reordered)
    check("the same request with its fields in another order replays (canonical fingerprint)",
          r.status == 201 and r.replayed, r)
    if first is not None and first.headers.get("location"):
        g = request(port, "GET", first.headers["location"])
        check("GET Location finds the payment", g.status == 200 and g.json == {
            k: first.json[k] for k in ("id", "amount", "currency", "status")}, g)
    r = post(port, key, dict(body, amount=9999))
    check("the same key with another body -> 422 IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST",
          r.status == 422 and r.error_code == MISMATCH and not r.replayed, r)
    ids = payments_for(db, key)
    check("still exactly one payment row for the key", len(ids) == 1, ids)


def test_in_progress(port, db):
    key = new_key()
    body = {"amount": 700, "currency": "USD"}
    slow = {}

    def first():
        try:
            slow["r"] = post(port, key, body, **{"Simulate-Delay-Ms": "4000"})
        except Exception as e:
            slow["r"] = e

    t = threading.Thread(target=first)
    t.start()
    locked = wait_for_claim_lock(db)
    check("the slow first request claims its key", locked)
    r = post(port, key, body)
    check("a request while the first is still running -> 409 IDEMPOTENCY_REQUEST_IN_PROGRESS",
          r.status == 409 and r.error_code == IN_PROGRESS, r)
    check("  ... with Retry-After: a positive number of seconds",
          r.headers.get("retry-after", "").isdigit() and int(r.headers["retry-after"]) > 0,
          r.headers)
    t.join(60)
    first_r = slow.get("r")
    check("the first request then ends with 201",
          isinstance(first_r, Response) and first_r.status == 201 and not first_r.replayed, first_r)
    r, _ = post_until_done(port, key, body)
    check("the retry now replays the first answer",
          r is not None and r.status == 201 and r.replayed
          and isinstance(first_r, Response) and r.raw == first_r.raw, (r, first_r))
    ids = payments_for(db, key)
    check("exactly one payment row for the key", len(ids) == 1, ids)


def test_rollback_and_failure(port, db):
    key = new_key()
    body = {"amount": 300, "currency": "EUR"}
    r = post(port, key, body, **{"Simulate-Failure": "true"})
    check("a handler that fails after its write -> 500, and nothing is kept",
          r.status == 500 and payments_for(db, key) == [], r)
    r = post(port, key, body)
    check("its retry proceeds as a new request: 201, not a replay",
          r.status == 201 and not r.replayed and len(payments_for(db, key)) == 1, r)

    key = new_key()
    body = {"amount": 0, "currency": "EUR"}
    r = post(port, key, body)
    check("a validation failure is stored with idem_fail -> 400 VALIDATION_FAILED",
          r.status == 400 and r.error_code == "VALIDATION_FAILED" and not r.replayed, r)
    r2 = post(port, key, body)
    check("its retry replays the same 400", r2.status == 400 and r2.replayed and r2.raw == r.raw, r2)


CONFORMANCE = os.path.join(HERE, "..", "..", "clients", "conformance.json")
GOOD = {"amount": 100, "currency": "EUR"}


def send_raw(port, keys, body_bytes, timeout=30):
    """POST /payments with each of keys (bytes or str) as an Idempotency-Key
    header, in order, and the body's bytes as they are."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest("POST", "/payments")
        conn.putheader("Content-Type", "application/json")
        for k in keys:
            conn.putheader("Idempotency-Key", k.encode("latin-1") if isinstance(k, str) else k)
        conn.putheader("Content-Length", str(len(body_bytes)))
        conn.endheaders(body_bytes)
        r = conn.getresponse()
        return Response(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


def hostile_body(row):
    if "body_hex" in row:
        return bytes.fromhex(row["body_hex"])
    if "body_text" in row:
        return row["body_text"].encode()
    if "body_nesting" in row:
        n = row["body_nesting"] - 1
        return (json.dumps(dict(GOOD, s="[" * 600))[:-1] + ', "n": ' + "[" * n + "]" * n + "}").encode()
    return json.dumps(row.get("body", GOOD)).encode()


def test_hostile(port, db, known_limits=()):
    """The hostile rows of clients/conformance.json: every library answers
    them alike, and a refused request stores nothing.  known_limits: the
    names of the service's limits (a row's known_limits) that the docs
    give: what happens instead is checked to be what they say."""
    with open(CONFORMANCE) as f:
        rows = json.load(f)["hostile"]["rows"]
    key = None
    for i, row in enumerate(rows):
        if not row.get("same_key_as_previous"):
            key = new_key()
        if "key_hex" in row:
            keys = [bytes.fromhex(row["key_hex"])]
        elif "keys" in row:
            keys = [k.replace("{key}", key) for k in row["keys"]]
        elif "key_suffix_hex" in row:
            keys = [key.encode() + bytes.fromhex(row["key_suffix_hex"])]
        else:
            keys = [key]
        r = send_raw(port, keys, hostile_body(row))
        limit = next((n for n in known_limits if n in row.get("known_limits", {})), None)
        if limit is not None:
            # the documented limit, or (a server release that refuses the
            # request itself) the row's own answer, nothing paid
            limited = r.status == 201 and not r.replayed and len(payments_for(db, key)) == 1
            refused = (r.status == row["status"] and not r.replayed
                       and len(payments_for(db, key)) == 0)
            check("hostile: %s -> known limit of %s: %s (or refused %d)"
                  % (row["name"], limit, row["known_limits"][limit], row["status"]),
                  limited or refused, r)
            continue
        ours = (r.status == row["status"] and not r.replayed
                and (r.error_code == row["error_code"] or row["error_code"] is None))
        by_server = row.get("server_may_refuse") and r.status == row["status"] and r.error_code is None
        check("hostile: %s -> %d %s" % (row["name"], row["status"], row["error_code"]), ours or by_server, r)
        last = i + 1 == len(rows) or not rows[i + 1].get("same_key_as_previous")
        if not row["stored"] and last and "key_hex" not in row:
            again = post(port, key, GOOD)
            check("  ... nothing was stored: the key with a good body then proceeds (201, not a replay)",
                  again.status == 201 and not again.replayed and len(payments_for(db, key)) == 1, again)


def test_expired(port, db, admin):
    """A retry that comes after the record expired is told so, and runs
    nothing.  The superuser moves the record's expiry into the past rather
    than waiting for it."""
    key = new_key()
    body = {"amount": 4200, "currency": "EUR", "reference": "order-late"}
    r = post(port, key, body)
    check("a new payment -> 201", r.status == 201 and not r.replayed, r)
    with admin.cursor() as cur:
        cur.execute("""UPDATE idem_records SET expires_at = now() - interval '1 second'
                        WHERE operation = 'payments.create' AND key = %s""", (key,))
        moved = cur.rowcount
    check("its record's expiry is moved into the past", moved == 1, moved)
    r = post(port, key, body)
    check("a retry after the expiry -> 409 IDEMPOTENCY_KEY_EXPIRED, not a replay",
          r.status == 409 and r.error_code == EXPIRED and not r.replayed, r)
    check("  ... without Retry-After: retrying will not help", "retry-after" not in r.headers, r.headers)
    ids = payments_for(db, key)
    check("still exactly one payment row for the key", len(ids) == 1, ids)


def set_rate(admin_dsn, rate, timeout=30.0):
    """Set the server's new-key rate (None: reset it) and wait, bounded,
    until new sessions read it.  The service's open sessions were signalled
    by then, and read it before their next command."""
    conn = psycopg2.connect(admin_dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            if rate is None:
                cur.execute("ALTER SYSTEM RESET " + RATE_SETTING)
            else:
                cur.execute("ALTER SYSTEM SET %s = %d" % (RATE_SETTING, rate))
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()
    want = "0" if rate is None else str(rate)
    deadline = time.monotonic() + timeout
    while True:
        conn = psycopg2.connect(admin_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT current_setting(%s)", (RATE_SETTING,))
                if cur.fetchone()[0] == want:
                    return True
        finally:
            conn.close()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_rate_limited(port, db, admin_dsn):
    """With one new key a second allowed, new payments sent back to back are
    soon answered 429 with Retry-After, and write nothing; a replay is not
    limited; the refused request succeeds later with the same key."""
    body = {"amount": 990, "currency": "EUR"}
    check("the rate is set to 1 new key a second (ALTER SYSTEM, reload)", set_rate(admin_dsn, 1))
    limited = None
    first = None
    try:
        # Bounded: of 50 new payments in a row, two come within a second
        # of each other unless every request takes a second.
        for _ in range(50):
            key = new_key()
            r = post(port, key, body)
            if r.status == 429:
                limited = (key, r)
                break
            if first is None and r.status == 201:
                first = (key, r)
        key, r = limited if limited else (None, None)
        check("new payments beyond the rate -> 429 IDEMPOTENCY_RATE_LIMITED",
              r is not None and r.error_code == RATE_LIMITED and not r.replayed, r)
        check("  ... with Retry-After: a positive number of seconds",
              r is not None and r.headers.get("retry-after", "").isdigit()
              and int(r.headers["retry-after"]) > 0, r and r.headers)
        check("  ... and no payment for it", key is not None and payments_for(db, key) == [], key)
        if first is not None:
            r = post(port, first[0], body)
            check("a retry of a payment already made replays (replays are never limited)",
                  r.status == 201 and r.replayed and r.raw == first[1].raw, r)
        else:
            check("a payment was made before the limit was met", False)
    finally:
        reset = set_rate(admin_dsn, None)
    check("the rate is reset (0: no limit)", reset)
    if limited is not None:
        r = post(port, limited[0], body)
        check("the refused request sent again with its key proceeds: 201, not a replay",
              r.status == 201 and not r.replayed and len(payments_for(db, limited[0])) == 1, r)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--service-command", metavar="COMMAND",
        help="the command that starts the service, as one shell-quoted string;"
             " it must exec the service, which gets SIGTERM at the end"
             " (default: payments_service.py)")
    parser.add_argument(
        "--admin-dsn", metavar="DSN", default=os.environ.get("IDEM_ADMIN_DSN"),
        help="a superuser connection to the same database, for the expired and"
             " rate_limited checks (default: $IDEM_ADMIN_DSN; skipped without)")
    parser.add_argument(
        "--no-rate-limit", action="store_true",
        help="the server has no rate of new keys (the SQL edition): no rate_limited check")
    parser.add_argument(
        "--known-limit", metavar="NAME", action="append", default=[],
        help="a limit of the service's HTTP server that clients/conformance.json"
             " names (a hostile row's known_limits), checked as documented")
    args = parser.parse_args()
    command = ([sys.executable, "-u", SERVICE] if args.service_command is None
               else shlex.split(args.service_command))
    service = None
    db = None
    admin = None
    try:
        db = psycopg2.connect("")
        db.autocommit = True
        if args.admin_dsn:
            admin = psycopg2.connect(args.admin_dsn)
            admin.autocommit = True
        service = Service(command)
        print("service on 127.0.0.1:%d" % service.port, flush=True)
        test_bad_keys(service.port, db)
        key, body, first = test_concurrent(service.port, db)
        test_replay_and_mismatch(service.port, db, key, body, first)
        test_in_progress(service.port, db)
        test_rollback_and_failure(service.port, db)
        test_hostile(service.port, db, args.known_limit)
        if admin is not None:
            test_expired(service.port, db, admin)
            if args.no_rate_limit:
                print("skip   rate_limited: --no-rate-limit (a server without the rate limit)", flush=True)
            else:
                test_rate_limited(service.port, db, args.admin_dsn)
        else:
            print("skip   expired and rate_limited: no --admin-dsn", flush=True)
    except Exception as e:
        check("the test ran to its end", False, "%s: %s" % (type(e).__name__, e))
    finally:
        if service is not None:
            service.stop()
            if failed:
                print("----- service log\n" + service.stderr(), flush=True)
        if db is not None:
            db.close()
        if admin is not None:
            admin.close()
    print("%d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
