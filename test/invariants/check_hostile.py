#!/usr/bin/python3
"""A more hostile run of check_invariants.py: the same clients and checks,
plus claims in savepoints rolled back or released, claims in prepared
transactions committed or rolled back prepared, claims that wait, and a
thread that cancels random clients' statements (pg_cancel_backend).  A
cancelled statement (57014) is expected; anything else is checked as in
check_invariants.py.

  check_hostile.py --dsn DSN [--seconds 60] [--clients 12] [--keys 1]
                   [--cancel-every 0.05]
"""

import os
import random
import sys
import threading
import time
import uuid

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_invariants as ci  # noqa: E402

CANCELLED = "57014"


class Hostile(ci.Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cur.execute("SELECT pg_backend_pid()")
        self.pid = self.cur.fetchone()[0]
        self.gid = None

    def actions(self):
        return [(20, self.in_block), (10, self.external), (10, self.claim_many),
                (8, self.inbox), (4, self.replay), (3, self.resolve),
                (6, self.maintenance), (15, self.in_savepoint),
                (10, self.prepared), (10, self.waiting)]

    def failed(self, where, err):
        if self.gid is not None:
            # a prepared transaction left by an error of COMMIT PREPARED's caller
            try:
                self.cur.execute("ROLLBACK")
            except psycopg2.Error:
                pass
            try:
                self.cur.execute("ROLLBACK PREPARED %s", (self.gid,))
            except psycopg2.Error:
                pass
            self.gid = None
        if getattr(err, "pgcode", None) == CANCELLED:
            try:
                self.cur.execute("ROLLBACK")
            except psycopg2.Error:
                pass
            self.log.count("statements cancelled")
            return
        super().failed(where, err)

    def committed(self, op, key, record_id, attempt, how, policy, left):
        """A proceed whose transaction committed, and what its attempt left."""
        self.log.proceeded(op, key, record_id, attempt, how, policy)
        if left is not None:
            self.log.stored(left[0], op, key, record_id)
            if left[1]:
                self.log.left_retryable(op, key, record_id, attempt)

    def in_savepoint(self):
        """Claim in a savepoint, maybe complete there, roll back or release it."""
        op, key, policy, lease = self.operation(), self.key(), self.policy(), self.lease()
        self.begin()
        if self.rng.random() < 0.5:
            self.cur.execute("SELECT 1 FROM idem_replay(%s, %s)", (op, self.key()))
        self.cur.execute("SAVEPOINT a")
        outcome, token, record_id, attempt, body = self.claim(op, key, policy, lease)
        self.saw(op, key, outcome, record_id, body)
        left = None
        if outcome == "proceed" and self.rng.random() < 0.7:
            deeper = self.rng.random() < 0.5
            if deeper:
                self.cur.execute("SAVEPOINT b")
            left = self.finish(token, key, record_id, attempt)
            if deeper and self.rng.random() < 0.4:
                self.cur.execute("ROLLBACK TO SAVEPOINT b")
                left = None
            elif deeper:
                self.cur.execute("RELEASE SAVEPOINT b")
        kept = self.rng.random() < 0.6
        self.cur.execute("RELEASE SAVEPOINT a" if kept else "ROLLBACK TO SAVEPOINT a")
        # a second claim in the same transaction, often of the same key: it
        # may replay this transaction's own record, which counts only once
        # committed
        op2, key2 = self.operation(), self.key()
        o2, t2, r2, a2, b2 = self.claim(op2, key2, policy, lease)
        self.log.count("idem_claim %s: %s" % (op2, o2))
        left2 = self.finish(t2, key2, r2, a2) if o2 == "proceed" else None
        self.cur.execute("COMMIT")
        if o2 == "replay":
            self.log.replayed(op2, key2, r2, b2)
        if outcome == "proceed" and kept:
            self.committed(op, key, record_id, attempt, "claim in a savepoint", policy, left)
        if o2 == "proceed":
            self.committed(op2, key2, r2, a2, "second claim after a savepoint", policy, left2)

    def prepared(self):
        """Claim (maybe complete) in a transaction that is prepared, then
        committed or rolled back prepared."""
        op, key, policy, lease = self.operation(), self.key(), self.policy(), self.lease()
        self.begin()
        outcome, token, record_id, attempt, body = self.claim(op, key, policy, lease)
        self.saw(op, key, outcome, record_id, body)
        left = None
        if outcome == "proceed" and self.rng.random() < 0.6:
            left = self.finish(token, key, record_id, attempt)
        gid = "h" + uuid.uuid4().hex
        self.cur.execute("PREPARE TRANSACTION %s", (gid,))
        self.gid = gid
        time.sleep(self.rng.choice((0, 0, 0.01)))
        commit = self.rng.random() < 0.8
        self.cur.execute(("COMMIT PREPARED %s" if commit else "ROLLBACK PREPARED %s"), (gid,))
        self.gid = None
        if outcome == "proceed" and commit:
            self.committed(op, key, record_id, attempt, "claim prepared", policy, left)

    def waiting(self):
        """A claim in a block that waits up to 300 ms for the key."""
        op, key, policy, lease = self.operation(), self.key(), self.policy(), self.lease()
        self.begin()
        self.cur.execute(
            "SELECT outcome, token, record_id, attempt, body::text"
            "  FROM idem_claim(%s, %s, jsonb_build_object('key', %s::text),"
            "                  ttl => %s::interval, lease => %s::interval,"
            "                  on_lease_expiry => %s, wait => '300 ms')",
            (op, key, key, ci.TTL[op], lease, policy))
        outcome, token, record_id, attempt, body = self.cur.fetchone()
        self.saw(op, key, outcome, record_id, body, "idem_claim wait")
        left = self.finish(token, key, record_id, attempt) if outcome == "proceed" else None
        self.cur.execute("COMMIT")
        if outcome == "proceed":
            self.committed(op, key, record_id, attempt, "claim that waited", policy, left)


def canceller(dsn, clients, deadline, every, rng):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    n = 0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0, 2 * every))
        cur.execute("SELECT pg_cancel_backend(%s)", (rng.choice(clients).pid,))
        n += 1
    conn.close()
    return n


def main():
    args, seed = ci.parse_arguments(__doc__, 60, 12, 1,
                                    [("--cancel-every", float, 0.05)])
    print("seed %d, %d clients, %d keys, %g s, a cancel every %g s"
          % (seed, args.clients, args.keys, args.seconds, args.cancel_every))
    log = ci.Log()
    ci.make_app_role(args.dsn)
    deadline = time.monotonic() + args.seconds
    clients = [Hostile(args.dsn, log, args.keys, deadline, seed + i)
               for i in range(args.clients)]
    for c in clients:
        c.start()
    if args.cancel_every > 0:
        canceller(args.dsn, clients, deadline, args.cancel_every, random.Random(seed))
    for c in clients:
        c.join()
    return ci.report(log)


if __name__ == "__main__":
    sys.exit(main())
