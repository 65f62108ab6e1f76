#!/usr/bin/env python3
"""A RabbitMQ consumer that applies each payment message exactly once.

Reads payment messages ({"amount": 1250, "currency": "EUR"}, the message id
in the AMQP message_id property) from the queue "payments" in batches, and
applies each batch in one database transaction with the inbox pattern:

    for each message:  idem_inbox(consumer, message_id, message)
        'proceed'      INSERT the payment (its idempotency_key is the message id)
        'duplicate'    nothing: an earlier delivery's transaction committed it
        'in_progress'  nothing now: another uncommitted transaction holds the
                       id; the message is handed back to the broker (nack,
                       requeue) after --retry-delay-ms, and comes back later as
                       a duplicate (that transaction committed) or a proceed
                       (it aborted, and the abort forgot the id)
        'mismatch'     nothing: the id was applied before with another
                       message; the message is rejected without requeue, so
                       the broker dead-letters it to "payments.dead", and a
                       line is logged
    COMMIT, and only then acknowledge the batch to the broker.

A crash before the commit loses the transaction, inbox records included, and
the broker redelivers the unacknowledged messages: they proceed again. A
crash after the commit and before the acknowledgement also gets them
redelivered: the inbox answers 'duplicate' and nothing is applied twice.
A message that is not a valid payment (no message id, not JSON, a bad amount
or currency) is dead-lettered without touching the database. When the batch
fails in the database with a serialization failure or a deadlock, it is
rolled back and requeued whole; for another reason (a constraint, an
invalid message id), it is rolled back and run again one message per
transaction, so that only the message that fails is dead-lettered.  A lost
connection ends the process, and what was not acknowledged is redelivered
to the next consumer.  A message id sent twice within one batch is
answered 'duplicate' the second time: the batch's own transaction sees its
inbox record.

Connection settings: libpq's environment for PostgreSQL (PGHOST, PGPORT,
PGDATABASE, PGUSER, ...), the role needs EXECUTE on idem_inbox and INSERT on
payments (examples/schema.sql, examples/consumer/schema.sql); AMQP_URL (or
--amqp-url) for RabbitMQ.  On stdout, "consuming from QUEUE, batch size N"
once connected, then one line per batch:

    batch 3: messages=100 proceed=97 duplicate=2 in_progress=0 mismatch=1 dead_lettered=1 redelivered=0 redelivered_duplicate=0

When every message received is settled and none came for --batch-wait-ms,
it prints "idle" (once, until the next batch).  SIGTERM or SIGINT: the batch
in hand is finished and acknowledged, messages received but not yet in a
batch go back to the queue, and the consumer prints a "totals:" line and
exits 0.

Two options for tests stop the consumer in the middle of a batch, print
"paused before commit of batch N: ID,ID,..." (or "after commit") with the
ids of the messages applied or found done in that batch, and wait there to
be killed:
    --pause-before-commit N   after the batch's writes, before COMMIT
    --pause-after-commit N    after COMMIT, before the acknowledgement
"""

import argparse
import json
import os
import re
import signal
import sys
import time

import pika
import psycopg2
from psycopg2.extras import Json

QUEUE = "payments"
DEAD_LETTER_QUEUE = "payments.dead"

INBOX_SQL = "SELECT idem_inbox(%s, %s, %s::jsonb)"
PAYMENT_SQL = "INSERT INTO payments (idempotency_key, amount, currency) VALUES (%s, %s, %s)"

COUNTERS = ("messages", "proceed", "duplicate", "in_progress", "mismatch",
            "dead_lettered", "redelivered", "redelivered_duplicate")


def declare_queues(channel, queue=QUEUE, dead_letter_queue=DEAD_LETTER_QUEUE):
    """The durable queue and its dead-letter queue.  A message the consumer
    rejects without requeue goes, through the default exchange, to the
    dead-letter queue.  Publishers declare the same (declaring is idempotent
    when the arguments are equal)."""
    channel.queue_declare(dead_letter_queue, durable=True)
    channel.queue_declare(queue, durable=True, arguments={
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead_letter_queue,
    })


def short(message_id):
    """A message id as logged: its first characters only."""
    return message_id[:8] + "..." if len(message_id) > 8 else message_id


def parse(properties, body):
    """(message id, payment) of a delivery, or (None, reason) when it is not
    a valid payment message."""
    message_id = properties.message_id
    if not message_id:
        return None, "no message id"
    try:
        payment = json.loads(body)
    except ValueError:
        return None, "body is not JSON"
    if not isinstance(payment, dict):
        return None, "body is not a JSON object"
    amount = payment.get("amount")
    currency = payment.get("currency")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return None, "amount must be a positive integer (minor units)"
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return None, "currency must be a three-letter ISO 4217 code"
    return message_id, payment


class Consumer:
    def __init__(self, args):
        self.args = args
        self.batches = 0
        self.totals = dict.fromkeys(COUNTERS, 0)
        self.stopping = False
        # A message id held by another transaction is answered in_progress
        # at once, not waited for inside the batch: it is requeued instead.
        self.db = psycopg2.connect("", application_name=args.consumer_name,
                                   options="-c idempotency.claim_wait=0")
        self.amqp = pika.BlockingConnection(pika.URLParameters(args.amqp_url))
        self.channel = self.amqp.channel()
        declare_queues(self.channel, args.queue, args.queue + ".dead")
        # At most this many unacknowledged messages: one batch in hand.
        self.channel.basic_qos(prefetch_count=args.prefetch or args.batch_size)

    def run(self):
        batch = []
        busy = False
        wait = self.args.batch_wait_ms / 1000.0
        print("consuming from %s, batch size %d" % (self.args.queue, self.args.batch_size),
              flush=True)
        for method, properties, body in self.channel.consume(self.args.queue,
                                                             inactivity_timeout=wait):
            if method is not None:
                if not batch:
                    started = time.monotonic()
                batch.append((method, properties, body))
            # A batch is full, or its first message came --batch-wait-ms ago,
            # or no message came for that long.
            if batch and (method is None or len(batch) >= self.args.batch_size
                          or time.monotonic() - started >= wait):
                self.process(batch)
                batch = []
                busy = True
            elif method is None and busy:
                # Every message received is settled, none is waiting.
                print("idle", flush=True)
                busy = False
            if self.stopping and not batch:
                break
        # Messages received but not yet in a batch go back to the queue.
        self.channel.cancel()
        self.amqp.close()
        self.db.close()
        print("totals: " + " ".join("%s=%d" % (k, self.totals[k]) for k in COUNTERS),
              flush=True)

    def process(self, batch):
        """Apply a batch in one transaction, commit, then settle it with the
        broker: ack, nack (requeue) or reject (dead-letter) each message."""
        self.batches += 1
        counts = dict.fromkeys(COUNTERS, 0)
        notes = []
        try:
            actions = self.apply(batch, counts, notes, self.batches)
        except psycopg2.extensions.TransactionRollbackError as e:
            # A serialization failure or a deadlock: the whole batch again,
            # later.
            self.db.rollback()
            print("requeueing a batch of %d: %s" % (len(batch), e.diag.message_primary),
                  file=sys.stderr, flush=True)
            actions = {m.delivery_tag: "requeue" for m, p, b in batch}
            counts = dict.fromkeys(COUNTERS, 0)
            counts["messages"] = len(batch)
        except psycopg2.OperationalError:
            raise  # the connection is gone: end, the broker redelivers
        except psycopg2.Error as e:
            self.db.rollback()
            if len(batch) == 1:
                print("dead-lettering message %s: %s" % (
                    short(batch[0][1].message_id or ""), e.diag.message_primary),
                    file=sys.stderr, flush=True)
                actions = {batch[0][0].delivery_tag: "reject"}
                counts = dict.fromkeys(COUNTERS, 0)
                counts["messages"] = counts["dead_lettered"] = 1
            else:
                # Find the message that fails: one transaction each.
                for delivery in batch:
                    self.process([delivery])
                return
        for note in notes:
            print(note, file=sys.stderr, flush=True)
        if self.args.pause_after_commit == self.batches:
            self.pause("after commit", batch, actions)
        self.settle(actions)
        for k in COUNTERS:
            self.totals[k] += counts[k]
        print("batch %d: " % self.batches
              + " ".join("%s=%d" % (k, counts[k]) for k in COUNTERS), flush=True)

    def apply(self, batch, counts, notes, number):
        """The batch's transaction.  Returns {delivery tag: action}, and adds
        to notes what to log once it has committed; commits."""
        actions = {}
        with self.db.cursor() as cur:
            for method, properties, body in batch:
                tag = method.delivery_tag
                counts["messages"] += 1
                counts["redelivered"] += method.redelivered
                message_id, payment = parse(properties, body)
                if message_id is None:
                    notes.append("dead-lettering a message: %s" % payment)
                    actions[tag] = "reject"
                    counts["dead_lettered"] += 1
                    continue
                cur.execute(INBOX_SQL, (self.args.consumer_name, message_id, Json(payment)))
                answer = cur.fetchone()[0]
                if answer == "proceed":
                    cur.execute(PAYMENT_SQL, (message_id, payment["amount"], payment["currency"]))
                    actions[tag] = "ack"
                elif answer == "duplicate":
                    actions[tag] = "ack"
                    counts["redelivered_duplicate"] += method.redelivered
                elif answer == "in_progress":
                    actions[tag] = "requeue"
                elif answer == "mismatch":
                    notes.append("dead-lettering message %s: its id was applied before with another message"
                                 % short(message_id))
                    actions[tag] = "reject"
                    counts["dead_lettered"] += 1
                else:
                    raise RuntimeError("unexpected idem_inbox answer %r" % answer)
                counts[answer] += 1
        if self.args.pause_before_commit == number:
            self.pause("before commit", batch, actions)
        self.db.commit()
        return actions

    def settle(self, actions):
        """After the commit: dead-letter what was rejected, acknowledge what
        was applied or found done, and requeue what another transaction
        holds, after a delay, so that it does not come straight back."""
        by_action = {"ack": [], "reject": [], "requeue": []}
        for tag, action in sorted(actions.items()):
            by_action[action].append(tag)
        for tag in by_action["reject"]:
            self.channel.basic_reject(tag, requeue=False)
        if not by_action["requeue"]:
            if by_action["ack"]:
                # Every unsettled delivery up to this tag is this batch's.
                self.channel.basic_ack(by_action["ack"][-1], multiple=True)
            return
        for tag in by_action["ack"]:
            self.channel.basic_ack(tag)
        self.amqp.sleep(self.args.retry_delay_ms / 1000.0)
        for tag in by_action["requeue"]:
            self.channel.basic_nack(tag, multiple=False, requeue=True)

    def pause(self, where, batch, actions):
        ids = [p.message_id for m, p, b in batch if actions.get(m.delivery_tag) == "ack"]
        print("paused %s of batch %d: %s" % (where, self.batches, ",".join(ids)), flush=True)
        while True:
            time.sleep(3600)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--amqp-url", default=os.environ.get(
        "AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--queue", default=QUEUE)
    parser.add_argument("--consumer-name", default="payments-consumer",
                        help="the consumer argument of idem_inbox: message ids are unique per consumer")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=0,
                        help="unacknowledged messages the broker sends ahead (default: the batch size)")
    parser.add_argument("--batch-wait-ms", type=int, default=200,
                        help="a batch that is not full is applied this long after its first message")
    parser.add_argument("--retry-delay-ms", type=int, default=500,
                        help="how long an in_progress message is held before it is requeued")
    parser.add_argument("--pause-before-commit", type=int, metavar="N")
    parser.add_argument("--pause-after-commit", type=int, metavar="N")
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")

    consumer = Consumer(args)

    def stop(signum, frame):
        consumer.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    consumer.run()


if __name__ == "__main__":
    main()
