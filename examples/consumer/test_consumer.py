#!/usr/bin/env python3
"""End-to-end test of consumer.py against a running RabbitMQ and PostgreSQL.

Publishes payment messages with duplicates (the same id twice in a row, and
again at the end), a message whose id was applied with another amount
(mismatch), one without an id and one whose id idem_inbox refuses, then:

  1. consumer A stops before the COMMIT of its third batch; another
     transaction's idem_inbox for a message of that batch answers
     in_progress; A is killed (SIGKILL), its transaction is gone;
  2. consumer B stops after the COMMIT of its second batch, before the
     acknowledgement, and is killed: the broker redelivers that batch;
  3. the test holds one message id in an uncommitted transaction of its
     own; consumer C answers in_progress for it and requeues it, the test
     rolls back, and C applies it; the queue drains; C stops on SIGTERM;

and checks that every message's payment exists exactly once with the
amount of its first message, that the redelivered batch came back as
duplicates, and that the dead-letter queue holds the mismatch, the message
without id and the one with the refused id, and nothing else.

AMQP_URL names the broker, libpq's environment (PGHOST, PGPORT, PGDATABASE,
PGUSER) the database, which must hold examples/schema.sql and
examples/consumer/schema.sql; scripts/suite_consumer.sh sets all of that up.
Prints one line per check and ends with "N passed, N failed"; exits 1 when a
check failed.  Every wait is bounded; the consumers are killed whatever
happens.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pika
import psycopg2
from psycopg2.extras import Json

from consumer import DEAD_LETTER_QUEUE, QUEUE
from publish import open_channel, publish

HERE = os.path.dirname(os.path.abspath(__file__))
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
CONSUMER_NAME = "payments-consumer"
BATCH = 25
DISTINCT = 300
WAIT = 60  # seconds, for anything the test waits for

passed = failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print("ok     " + name, flush=True)
    else:
        failed += 1
        print("FAILED " + name + (": " + str(detail) if detail != "" else ""), flush=True)


def wait_until(what, predicate, timeout=WAIT):
    """Poll predicate until it is true, for timeout seconds at most."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(0.05)


class ConsumerProcess:
    """consumer.py in a child process, its stdout lines collected."""

    def __init__(self, name, *args):
        self.name = name
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", os.path.join(HERE, "consumer.py"),
             "--batch-size", str(BATCH), "--consumer-name", CONSUMER_NAME,
             "--retry-delay-ms", "200"] + list(args),
            stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_line(self, prefix, timeout=WAIT):
        """The first line starting with prefix, or None after timeout s or
        once the process ended without printing it."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    return None
                self.cond.wait(min(left, 0.2))

    def batches(self):
        """The counters of each "batch N: k=v ..." line."""
        with self.cond:
            lines = [l for l in self.lines if l.startswith("batch ")]
        return [dict((k, int(v)) for k, v in (kv.split("=") for kv in l.split(": ", 1)[1].split()))
                for l in lines]

    def total(self, counter):
        return sum(b[counter] for b in self.batches())

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)


def amount_of(i):
    return 100 + i


def main():
    run = uuid.uuid4().hex[:8]
    ids = ["%s-%04d" % (run, i) for i in range(1, DISTINCT + 1)]
    body = {mid: {"amount": amount_of(i), "currency": "EUR"} for i, mid in enumerate(ids, 1)}

    db = psycopg2.connect("", application_name="test_consumer")
    db.autocommit = True

    def effects():
        """{message id: number of payments} for this run's messages."""
        with db.cursor() as cur:
            cur.execute("SELECT idempotency_key, count(*) FROM payments"
                        " WHERE idempotency_key LIKE %s GROUP BY 1", (run + "-%",))
            return dict(cur.fetchall())

    connection, channel = open_channel(AMQP_URL)
    channel.queue_purge(QUEUE)
    channel.queue_purge(DEAD_LETTER_QUEUE)

    # Every 5th message twice in a row (often in the same batch), every 7th
    # again after all the others; then message 42 with another amount, and
    # a message without id.
    sent = []
    for i, mid in enumerate(ids, 1):
        sent.append(mid)
        if i % 5 == 0:
            sent.append(mid)
    sent += [mid for i, mid in enumerate(ids, 1) if i % 7 == 0]
    for mid in sent:
        publish(channel, mid, json.dumps(body[mid]).encode())
    mismatch_id = ids[41]
    publish(channel, mismatch_id, json.dumps({"amount": 1, "currency": "EUR"}).encode())
    publish(channel, None, b'{"amount": 5, "currency": "EUR"}',
            properties=pika.BasicProperties(content_type="application/json", delivery_mode=2))
    # idem_inbox refuses an id with a control character (22023): its whole
    # batch rolls back, runs again one message per transaction, and only
    # that message is dead-lettered.
    refused = run + "-refused\tid"
    publish(channel, refused, b'{"amount": 7, "currency": "EUR"}')
    published = len(sent) + 3
    ready = channel.queue_declare(QUEUE, passive=True).method.message_count
    check("the broker holds the %d messages published (%d distinct ids)" % (published, DISTINCT),
          ready == published, ready)

    consumers = []
    holder = None
    try:
        # 1. Killed before the commit of its third batch.
        a = ConsumerProcess("A", "--pause-before-commit", "3")
        consumers.append(a)
        line = a.wait_line("paused before commit of batch 3: ")
        check("consumer A stops before the commit of its third batch", line is not None, a.lines[-5:])
        held = line.split(": ", 1)[1].split(",") if line else []
        applied = a.total("proceed")
        check("  ... the payments of its two committed batches exist, no others",
              applied > 0 and sum(effects().values()) == applied, (applied, sum(effects().values())))
        with db.cursor() as cur:
            cur.execute("SET idempotency.claim_wait = 0")
            answer = None
            if held:
                cur.execute("SELECT idem_inbox(%s, %s, %s)", (CONSUMER_NAME, held[0], Json(body[held[0]])))
                answer = cur.fetchone()[0]
        check("  ... another transaction's idem_inbox for a message of its open batch answers in_progress",
              answer == "in_progress", answer)
        a.kill()
        check("  ... killed (SIGKILL) in the middle of the batch", a.proc.returncode == -signal.SIGKILL,
              a.proc.returncode)
        # Its server backend ends when it sees the connection closed: the
        # transaction aborts, and the open batch's payments never exist.
        wait_until("A's transaction gone", lambda: not in_transaction(db))
        check("  ... the payments of the open batch do not exist", not any(e in effects() for e in held))

        # 2. Killed after the commit of its second batch, before the ack.
        b = ConsumerProcess("B", "--pause-after-commit", "2")
        consumers.append(b)
        line = b.wait_line("paused after commit of batch 2: ")
        check("consumer B stops after the commit of its second batch, before the acknowledgement",
              line is not None, b.lines[-5:])
        unacked = line.split(": ", 1)[1].split(",") if line else []
        got = effects()
        check("  ... the payments of that batch exist", unacked and all(got.get(m) == 1 for m in unacked),
              [m for m in unacked if got.get(m) != 1])
        b.kill()
        check("  ... killed (SIGKILL) before it acknowledged", b.proc.returncode == -signal.SIGKILL,
              b.proc.returncode)

        # 3. A message held by an uncommitted transaction of the test.
        late = ids[-3]
        holder = psycopg2.connect("", application_name="test_consumer holder")
        with holder.cursor() as cur:
            cur.execute("SELECT idem_inbox(%s, %s, %s)", (CONSUMER_NAME, late, Json(body[late])))
            answer = cur.fetchone()[0]
        check("the test holds a later message id in an open transaction (proceed)", answer == "proceed", answer)
        c = ConsumerProcess("C")
        consumers.append(c)
        wait_until("C answers in_progress", lambda: c.total("in_progress") > 0)
        check("consumer C answers in_progress for it and requeues it", c.total("in_progress") > 0,
              c.lines[-5:])
        holder.rollback()
        holder.close()
        holder = None

        def drained():
            # C has settled every message it received (its last line is
            # "idle"), none is ready in the queue, every payment exists.
            with c.cond:
                idle = c.lines[-1:] == ["idle"]
            return (idle and channel.queue_declare(QUEUE, passive=True).method.message_count == 0
                    and len(effects()) == DISTINCT)
        check("after the rollback, consumer C drains the queue", wait_until("drained", drained),
              (len(effects()), c.lines[-3:]))
        c.proc.send_signal(signal.SIGTERM)
        totals = c.wait_line("totals: ")
        try:
            c.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            pass
        check("consumer C stops on SIGTERM and exits 0", totals is not None and c.proc.returncode == 0,
              (c.proc.returncode, c.lines[-3:]))
    finally:
        if holder is not None:
            holder.close()
        for p in consumers:
            p.kill()

    # Once no consumer is connected, a message left unacknowledged would be
    # back in the queue.
    left = channel.queue_declare(QUEUE, passive=True).method.message_count
    check("nothing is left in the queue, acknowledged or not", left == 0, left)

    got = effects()
    check("every message id has exactly one payment (%d ids)" % DISTINCT,
          sorted(got) == ids and set(got.values()) == {1},
          {m: n for m, n in got.items() if n != 1} or len(got))
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments WHERE idempotency_key LIKE %s", (run + "-%",))
        total = cur.fetchone()[0]
        cur.execute("SELECT idempotency_key, amount FROM payments WHERE idempotency_key LIKE %s",
                    (run + "-%",))
        amounts = dict(cur.fetchall())
    check("  ... %d payments in all" % DISTINCT, total == DISTINCT, total)
    check("  ... each with the amount of its first message (the mismatch changed nothing)",
          all(amounts.get(m) == body[m]["amount"] for m in ids),
          [m for m in ids if amounts.get(m) != body[m]["amount"]][:5])

    redelivered_duplicates = c.total("redelivered_duplicate")
    check("the batch committed but not acknowledged came back and was answered duplicate (%d messages)"
          % len(unacked), redelivered_duplicates >= len(unacked) > 0, redelivered_duplicates)
    duplicates = sum(p.total("duplicate") for p in consumers)
    check("the ids sent again were answered duplicate", duplicates >= len(sent) - DISTINCT, duplicates)
    check("one message answered mismatch", sum(p.total("mismatch") for p in consumers) == 1,
          [p.total("mismatch") for p in consumers])

    dead = []
    while True:
        method, properties, raw = channel.basic_get(DEAD_LETTER_QUEUE, auto_ack=True)
        if method is None:
            break
        dead.append((properties.message_id, json.loads(raw)))
    check("the dead-letter queue holds the mismatch, the message without id and the one whose id was refused",
          sorted(dead, key=lambda d: d[0] or "") ==
          [(None, {"amount": 5, "currency": "EUR"}), (mismatch_id, {"amount": 1, "currency": "EUR"}),
           (refused, {"amount": 7, "currency": "EUR"})],
          dead)
    connection.close()
    db.close()

    if failed:
        for p in consumers:
            print("===== consumer %s's output" % p.name)
            print("\n".join(p.lines))
    print("%d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


def in_transaction(db):
    """Whether a consumer's database session is in an open transaction."""
    with db.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND state = 'idle in transaction'", (CONSUMER_NAME,))
        return cur.fetchone()[0] > 0


if __name__ == "__main__":
    sys.exit(main())
