#!/usr/bin/python3
"""Randomized invariant checker of the idempotency extension.

Many connections drive a few keys through every path that can decide a key
is free or write its record, at once and at random: idem_claim (and
idem_claim_text, the request as JSON text) in a
transaction block with the completion in it, idem_claim outside a block
(the external-call form: complete, fail, heartbeat, checkpoint or abandon
the lease), idem_claim_many, idem_inbox, idem_replay, idem_resolve of
unknown records, and idem_expire_leases / idem_cleanup besides the
background worker; every transaction at a random isolation level, and some
rolled back.  The clients act as one application role (SET ROLE), the
owner of the records, which another connection renames back and forth all
along: a record belongs to the role, not to its name, so a rename changes
no answer.  This program plays the service: a proceed is acted on at
once.  After the run it checks:

  1. no call of the extension raised unique_violation (23505): neither a
     claim nor a completion nor a COMMIT;
  2. at most one committed proceed per attempt of a command, and attempt
     n+1 only after attempt n was left retryable (failed retryable, its
     lease ended under on_lease_expiry 'retry', or resolved retryable);
     an inbox message proceeds at most once, and a 'pay' key has one
     record (a second is a second command).  Operation 'pay' keeps its
     records for a day, and the keys move on to a new set every few hundred
     requests, all clients together; operation 'brief' keeps its records
     for 100 ms, so that they expire, are purged and deleted while claims
     run, and its keys proceed again as new commands (a claim that reuses
     a record before cleanup deletes it starts over at attempt 1 of the
     same record, so this invariant is checked on 'pay' only);
  3. every replay of a record returns the same body, the one stored by the
     attempt or the resolution that finished it;
  4. nothing else failed: the only errors are serialization failures and
     deadlocks (40001, 40P01), 55000 for a token or a resolution that
     another writer made stale, and 42704 for a resolution of a 'brief'
     record that another operator resolved and cleanup deleted meanwhile.

It prints one line per invariant, "ok" or "FAILED" with examples, and a
closing "N passed, N failed" line; the exit status is 0 only when all hold.

  check_invariants.py --dsn DSN [--seconds 20] [--clients 8] [--keys 3]
                      [--edition c|sql]

With --edition sql (the SQL edition, sql_edition/), the functions reach
the records as the role that installed them, which stays the table's owner:
the application's role gets EXECUTE on every function and SELECT on the
table (to find the unknown records an operator settles) instead of the
table itself.  The maintenance passes are the clients' own calls, as pg_cron
would make them; the invariants are the same.
"""

import argparse
import json
import random
import sys
import threading
import time

import psycopg2
import psycopg2.errorcodes

TTL = {"pay": "1 day", "brief": "100 ms"}
APP_ROLE = "idem_inv_app"
APP_ROLE_RENAMED = "idem_inv_app_renamed"
KEY_GENERATION = 300
LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
RETRIABLE = {"40001", "40P01"}
STALE = "55000"
GONE = "42704"


def canonical(body):
    return json.dumps(json.loads(body), sort_keys=True)


class Log:
    """What the clients saw, shared by all of them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proceeds = {}        # (op, key, record_id, attempt) -> [how]
        self.inbox = {}           # message id -> committed proceeds
        self.retryable = set()    # (op, key, record_id, attempt) left retryable
        self.bodies = {}          # canonical body -> (op, key, record_id)
        self.replays = {}         # (op, key, record_id) -> set of body texts
        self.unique_violations = []
        self.other_errors = []
        self.counts = {}
        self.requests = 0         # all clients' requests so far

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def proceeded(self, op, key, record_id, attempt, how, policy):
        with self.lock:
            self.proceeds.setdefault((op, key, record_id, attempt), []).append(how)
            if policy == "retry":
                self.retryable.add((op, key, record_id, attempt))

    def left_retryable(self, op, key, record_id, attempt):
        with self.lock:
            self.retryable.add((op, key, record_id, attempt))

    def stored(self, body, op, key, record_id):
        with self.lock:
            self.bodies[canonical(body)] = (op, key, record_id)

    def replayed(self, op, key, record_id, body):
        with self.lock:
            self.replays.setdefault((op, key, record_id), set()).add(body)

    def error(self, where, err):
        code = getattr(err, "pgcode", None)
        with self.lock:
            if code == psycopg2.errorcodes.UNIQUE_VIOLATION:
                self.unique_violations.append("%s: %s" % (where, str(err).strip()))
            else:
                self.other_errors.append("%s: %s %s" % (where, code, str(err).strip()))


class Client(threading.Thread):
    """One connection of the service, doing random requests until the end."""

    def __init__(self, dsn, log, keys, deadline, seed, maintainer=None):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.cur = self.conn.cursor()
        # by the role's OID from here on, whatever it is called later
        self.cur.execute("SET ROLE " + APP_ROLE)
        # the SQL edition's passes run with their caller's privileges: as
        # the table's owner, the role pg_cron runs them as, on a connection
        # of their own
        self.maint_cur = self.cur
        if maintainer:
            self.maint_conn = psycopg2.connect(dsn)
            self.maint_conn.autocommit = True
            self.maint_cur = self.maint_conn.cursor()
            self.maint_cur.execute("SET ROLE " + maintainer)
        self.log = log
        self.keys = keys
        self.deadline = deadline
        self.rng = random.Random(seed)

    def actions(self):
        """The requests, with their weights."""
        return [(22, self.in_block), (8, self.in_block_text), (20, self.external),
                (15, self.claim_many),
                (12, self.inbox), (8, self.replay), (5, self.resolve),
                (10, self.maintenance)]

    def run(self):
        actions = self.actions()
        total = sum(w for w, _ in actions)
        while time.monotonic() < self.deadline:
            pick = self.rng.uniform(0, total)
            for weight, action in actions:
                pick -= weight
                if pick <= 0:
                    break
            try:
                action()
            except psycopg2.Error as err:
                self.failed(action.__name__, err)
            except Exception as err:  # a bug of this program: report it
                self.log.other_errors.append("%s: %r" % (action.__name__, err))
        self.conn.close()
        if self.maint_cur is not self.cur:
            self.maint_conn.close()

    # -- helpers ---------------------------------------------------------

    def failed(self, where, err):
        """An error of a statement: roll back, and keep it unless expected."""
        try:
            self.cur.execute("ROLLBACK")
        except psycopg2.Error:
            pass
        code = getattr(err, "pgcode", None)
        if code in RETRIABLE:
            self.log.count("serialization failures and deadlocks")
            return
        if code == STALE and where in ("token", "resolve"):
            self.log.count("stale tokens and resolutions")
            return
        if code == GONE and where == "resolve":
            # resolved by another operator, expired and deleted meanwhile
            self.log.count("resolutions of records deleted since")
            return
        self.log.error(where, err)

    def begin(self):
        self.cur.execute("BEGIN ISOLATION LEVEL " + self.rng.choice(LEVELS))

    def key(self):
        with self.log.lock:
            self.log.requests += 1
            generation = self.log.requests // KEY_GENERATION
        return "k%d.%d" % (self.rng.randint(1, self.keys), generation)

    def lease(self):
        return "%d ms" % self.rng.choice((30, 80, 200, 2000))

    def policy(self):
        return self.rng.choice(("retry", "unknown"))

    def operation(self):
        return "brief" if self.rng.random() < 0.2 else "pay"

    def claim(self, op, key, policy, lease):
        self.cur.execute(
            "SELECT outcome, token, record_id, attempt, body::text"
            "  FROM idem_claim(%s, %s, jsonb_build_object('key', %s::text),"
            "                  ttl => %s::interval, lease => %s::interval,"
            "                  on_lease_expiry => %s, wait => %s::interval)",
            (op, key, key, TTL[op], lease, policy,
             self.rng.choice(("0", "0", "20 ms"))))
        return self.cur.fetchone()

    def saw(self, op, key, outcome, record_id, body, via="idem_claim"):
        self.log.count("%s %s: %s" % (via, op, outcome))
        if outcome == "replay":
            self.log.replayed(op, key, record_id, body)

    def finish(self, token, key, record_id, attempt):
        """Complete or fail the attempt: returns what it left, for the log."""
        body = json.dumps({"token": token})
        how = self.rng.randint(1, 6)
        if how <= 3:
            self.cur.execute("SELECT idem_complete(%s, 201, %s::jsonb)", (token, body))
            return body, False
        retryable = how == 6
        self.cur.execute("SELECT idem_fail(%s, 409, %s::jsonb, retryable => %s)",
                         (token, body, retryable))
        return body, retryable

    # -- the requests ----------------------------------------------------

    def in_block_text(self):
        """As in_block, through idem_claim_text: operation pay (its ttl is
        the setting's day), the request as JSON text, the default lease and
        policy (unknown)."""
        self.in_block(text=True)

    def in_block(self, text=False):
        """Claim, act, complete or fail, and commit (or roll back) at once."""
        op, key, policy, lease = self.operation(), self.key(), self.policy(), self.lease()
        self.begin()
        if text:
            op, policy = "pay", "unknown"
            self.cur.execute(
                "SELECT outcome, token, record_id, attempt, body::text"
                "  FROM idem_claim_text('pay', %s, %s, '')",
                (key, json.dumps({"key": key})))
            outcome, token, record_id, attempt, body = self.cur.fetchone()
        else:
            outcome, token, record_id, attempt, body = self.claim(op, key, policy, lease)
        self.saw(op, key, outcome, record_id, body, "idem_claim_text" if text else "idem_claim")
        left = None
        if outcome == "proceed":
            time.sleep(self.rng.choice((0, 0, 0.002)))
            if self.rng.random() < 0.85:
                left = self.finish(token, key, record_id, attempt)
        if self.rng.random() < 0.1:
            self.cur.execute("ROLLBACK")
            return
        self.cur.execute("COMMIT")
        if outcome == "proceed":
            self.log.proceeded(op, key, record_id, attempt,
                               "idem_claim_text in a block" if text else "claim in a block", policy)
            if left is not None:
                self.log.stored(left[0], op, key, record_id)
                if left[1]:
                    self.log.left_retryable(op, key, record_id, attempt)

    def external(self):
        """The external-call form: the claim commits, then the attempt goes on."""
        op, key, policy, lease = self.operation(), self.key(), self.policy(), self.lease()
        self.cur.execute("SET default_transaction_isolation = '%s'"
                         % self.rng.choice(LEVELS).lower())
        outcome, token, record_id, attempt, body = self.claim(op, key, policy, lease)
        self.saw(op, key, outcome, record_id, body)
        if outcome != "proceed":
            return
        self.log.proceeded(op, key, record_id, attempt, "claim outside a block", policy)
        step = self.rng.randint(1, 5)
        try:
            if step == 1:
                self.cur.execute("SELECT idem_heartbeat(%s, %s::interval)", (token, lease))
            elif step == 2:
                self.cur.execute("SELECT idem_checkpoint(%s, 'charged')", (token,))
            elif step == 3:
                return      # abandoned: its lease ends
            time.sleep(self.rng.choice((0, 0.002, 0.05)))
            body, retryable = self.finish(token, key, record_id, attempt)
            self.log.stored(body, op, key, record_id)
            if retryable:
                self.log.left_retryable(op, key, record_id, attempt)
        except psycopg2.Error as err:
            self.failed("token", err)

    def claim_many(self):
        """Two keys claimed in one call, each proceed completed, then commit."""
        keys = list({self.key() for _ in range(2)})
        op, policy = self.operation(), self.policy()
        self.begin()
        self.cur.execute(
            "SELECT key, outcome, token, record_id, attempt, body::text"
            "  FROM idem_claim_many(%s, %s::text[],"
            "       ARRAY(SELECT jsonb_build_object('key', k)"
            "               FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n),"
            "       ttl => %s::interval, lease => %s::interval, on_lease_expiry => %s)",
            (op, keys, keys, TTL[op], self.lease(), policy))
        rows = self.cur.fetchall()
        done = []
        for key, outcome, token, record_id, attempt, body in rows:
            self.saw(op, key, outcome, record_id, body, "idem_claim_many")
            if outcome == "proceed":
                done.append((key, record_id, attempt,
                             self.finish(token, key, record_id, attempt)))
        if self.rng.random() < 0.1:
            self.cur.execute("ROLLBACK")
            return
        self.cur.execute("COMMIT")
        for key, record_id, attempt, (body, retryable) in done:
            self.log.proceeded(op, key, record_id, attempt, "idem_claim_many", policy)
            self.log.stored(body, op, key, record_id)
            if retryable:
                self.log.left_retryable(op, key, record_id, attempt)

    def inbox(self):
        """A consumed message: proceed once, duplicate afterwards."""
        message = "m" + self.key()[1:]
        self.begin()
        self.cur.execute("SELECT idem_inbox('consumer', %s, jsonb_build_object('m', %s::text))",
                         (message, message))
        answer = self.cur.fetchone()[0]
        self.log.count("inbox " + answer)
        if self.rng.random() < 0.1:
            self.cur.execute("ROLLBACK")
            return
        self.cur.execute("COMMIT")
        if answer == "proceed":
            with self.log.lock:
                self.log.inbox[message] = self.log.inbox.get(message, 0) + 1

    def replay(self):
        op, key = self.operation(), self.key()
        self.cur.execute("SELECT outcome, record_id, body::text FROM idem_replay(%s, %s)",
                         (op, key))
        row = self.cur.fetchone()
        if row is not None:
            self.saw(op, key, row[0], row[1], row[2], "idem_replay")

    def resolve(self):
        """An operator settles an unknown record."""
        self.cur.execute("SELECT id, operation, key, attempt FROM idem_records"
                         " WHERE state = 'unknown' AND operation IN ('pay', 'brief')"
                         " ORDER BY random() LIMIT 1")
        row = self.cur.fetchone()
        if row is None:
            return
        record_id, op, key, attempt = row
        state = self.rng.choice(("succeeded", "failed", "retryable"))
        body = json.dumps({"resolved": record_id, "attempt": attempt})
        try:
            self.cur.execute("SELECT idem_resolve(%s, %s, 200, %s::jsonb)",
                             (record_id, state, body))
        except psycopg2.Error as err:
            self.failed("resolve", err)
            return
        self.log.count("resolve " + state)
        if state == "retryable":
            self.log.left_retryable(op, key, record_id, attempt)
        else:
            self.log.stored(body, op, key, record_id)

    def maintenance(self):
        if self.rng.random() < 0.5:
            self.maint_cur.execute("SELECT idem_expire_leases(10)")
        else:
            self.maint_cur.execute("SELECT idem_cleanup(5, 2)")
        self.log.count("maintenance passes")


def make_app_role(dsn, edition="c"):
    """The application's role, owner of the records (an operator: it may
    resolve and run the maintenance passes), with EXECUTE on every function.
    The SQL edition's table stays its installer's: the role reads it, and
    the maintenance passes run as the installer.  Returns the role the
    passes run as (None: the application's own)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("DROP ROLE IF EXISTS %s" % APP_ROLE_RENAMED)
    cur.execute("CREATE ROLE %s" % APP_ROLE)
    maintainer = None
    if edition == "sql":
        cur.execute("GRANT SELECT ON idem_records TO %s" % APP_ROLE)
        cur.execute("SELECT quote_ident(pg_get_userbyid(relowner)) FROM pg_class"
                    " WHERE oid = 'idem_records'::regclass")
        maintainer = cur.fetchone()[0]
    else:
        cur.execute("ALTER TABLE idem_records OWNER TO %s" % APP_ROLE)
        cur.execute("ALTER TABLE idem_records_archive OWNER TO %s" % APP_ROLE)
    cur.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO %s" % APP_ROLE)
    conn.close()
    return maintainer


def rename_role(dsn, log, deadline, seed):
    """Rename the application's role back and forth until the end, and
    leave it with its first name."""
    rng = random.Random(seed)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    names = [APP_ROLE, APP_ROLE_RENAMED]
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.005, 0.05))
        cur.execute("ALTER ROLE %s RENAME TO %s" % (names[0], names[1]))
        names.reverse()
        log.count("renames of the application's role")
    if names[0] != APP_ROLE:
        cur.execute("ALTER ROLE %s RENAME TO %s" % (names[0], APP_ROLE))
    conn.close()


def check(log):
    """The invariants, as (name, list of counterexamples)."""
    results = []
    results.append(("no call raised unique_violation (23505)", log.unique_violations))

    double = ["%s %s record %s attempt %s: %s" % (k + (v,))
              for k, v in sorted(log.proceeds.items())
              if len(v) > 1 and k[0] == "pay"]
    early = []
    for (op, key, record_id, attempt) in sorted(log.proceeds):
        if op == "pay" and attempt > 1 and \
                (op, key, record_id, attempt - 1) not in log.retryable:
            early.append("%s %s record %s: attempt %d proceeded, attempt %d was not"
                         " left retryable" % (op, key, record_id, attempt, attempt - 1))
    # a 'pay' key keeps its one record all run long: a second record of the
    # key (under another name of the role, say) is a second command
    records = {}
    for (op, key, record_id, attempt) in log.proceeds:
        if op == "pay":
            records.setdefault(key, set()).add(record_id)
    second = ["pay %s proceeded as records %s" % (key, sorted(ids))
              for key, ids in sorted(records.items()) if len(ids) > 1]
    inbox = ["message %s proceeded %d times" % (m, n)
             for m, n in sorted(log.inbox.items()) if n > 1]
    results.append(("at most one committed proceed per attempt of a command",
                    double + early + second + inbox))

    replays = []
    for (op, key, record_id), bodies in sorted(log.replays.items()):
        if len(bodies) > 1 and op != "brief":
            replays.append("%s %s record %s replayed %s" % (op, key, record_id, sorted(bodies)))
        for body in bodies:
            origin = log.bodies.get(canonical(body)) if body else None
            if origin != (op, key, record_id):
                replays.append("%s %s record %s replayed %s, stored by %s"
                               % (op, key, record_id, body, origin))
    results.append(("every replay of a record returns the body that finished it", replays))
    results.append(("no other error", log.other_errors))
    return results


def parse_arguments(doc, seconds, clients, keys, more=()):
    """The command line: the run's options with these defaults, plus more
    (name, type, default) options; returns them and the seed."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--clients", type=int, default=clients)
    parser.add_argument("--keys", type=int, default=keys)
    parser.add_argument("--seed", type=int, default=None)
    for name, kind, default in more:
        parser.add_argument(name, type=kind, default=default)
    args = parser.parse_args()
    return args, (args.seed if args.seed is not None else random.randrange(1 << 30))


def main():
    args, seed = parse_arguments(__doc__, 20, 8, 3,
                                 [("--edition", str, "c")])
    print("seed %d, %d clients, %d keys, %g s, %s edition"
          % (seed, args.clients, args.keys, args.seconds, args.edition.upper()))

    log = Log()
    maintainer = make_app_role(args.dsn, args.edition)
    deadline = time.monotonic() + args.seconds
    clients = [Client(args.dsn, log, args.keys, deadline, seed + i, maintainer)
               for i in range(args.clients)]
    renamer = threading.Thread(target=rename_role, daemon=True,
                               args=(args.dsn, log, deadline, seed - 1))
    for c in clients:
        c.start()
    renamer.start()
    for c in clients:
        c.join()
    renamer.join()

    return report(log)


def report(log):
    """Print the counts and one line per invariant; 0 when all hold, else 1."""
    for what, n in sorted(log.counts.items()):
        print("  %-40s %d" % (what, n))
    print("  %-40s %d" % ("committed proceeds", sum(len(v) for v in log.proceeds.values())))
    passed = failed = 0
    for name, problems in check(log):
        if problems:
            failed += 1
            print("FAILED %s: %d, e.g." % (name, len(problems)))
            for p in problems[:10]:
                print("    " + p)
        else:
            passed += 1
            print("ok     " + name)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
