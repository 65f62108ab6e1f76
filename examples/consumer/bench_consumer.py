#!/usr/bin/env python3
"""How fast consumer.py applies messages, by batch size.

    bench_consumer.py [--count 5000] [--batch-sizes 1,10,100,1000]

For each batch size: fills the queue with --count payment messages of new
ids, starts consumer.py with that batch size, and measures from its
"consuming" line until its batch lines have counted every message; prints
one line per batch size with the messages per second, and the payments
checked (exactly one per id).  The same environment as test_consumer.py
(AMQP_URL, libpq's PG* variables); scripts/suite_consumer.sh runs it before
the test when CONSUMER_BENCH names the batch sizes:

    CONSUMER_BENCH=1,10,100,1000 bash scripts/test.sh consumer
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pika
import psycopg2

from consumer import DEAD_LETTER_QUEUE, QUEUE, declare_queues

HERE = os.path.dirname(os.path.abspath(__file__))
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def fill(channel, prefix, count):
    """Publish count messages (without confirms, for speed) and wait until
    the queue holds them all."""
    for i in range(count):
        mid = "%s-%06d" % (prefix, i)
        properties = pika.BasicProperties(message_id=mid, content_type="application/json",
                                          delivery_mode=2)
        channel.basic_publish("", QUEUE, json.dumps({"amount": 100 + i, "currency": "EUR"}).encode(),
                              properties)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if channel.queue_declare(QUEUE, passive=True).method.message_count >= count:
            return True
        time.sleep(0.05)
    return False


def run_consumer(batch_size, count):
    """Seconds from "consuming" until count messages were in batch lines,
    or None."""
    proc = subprocess.Popen(
        [sys.executable, "-u", os.path.join(HERE, "consumer.py"), "--batch-size", str(batch_size),
         "--consumer-name", "bench-consumer"],
        stdout=subprocess.PIPE, text=True)
    times = {}

    def read():
        seen = 0
        for line in proc.stdout:
            now = time.monotonic()
            if line.startswith("consuming"):
                times["start"] = now
            elif line.startswith("batch "):
                seen += int(line.split("messages=")[1].split()[0])
                if seen >= count and "end" not in times:
                    times["end"] = now
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while "end" not in times and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if "start" in times and "end" in times:
        return times["end"] - times["start"]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--batch-sizes", default="1,10,100,1000")
    args = parser.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    declare_queues(channel)
    channel.queue_purge(QUEUE)
    channel.queue_purge(DEAD_LETTER_QUEUE)
    db = psycopg2.connect("")
    db.autocommit = True
    ok = True
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        prefix = "bench-%s-%d" % (uuid.uuid4().hex[:8], size)
        if not fill(channel, prefix, args.count):
            print("batch size %d: the queue did not fill" % size, flush=True)
            ok = False
            continue
        seconds = run_consumer(size, args.count)
        with db.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM payments"
                        " WHERE idempotency_key LIKE %s", (prefix + "-%",))
            rows, ids = cur.fetchone()
        exact = rows == ids == args.count
        ok = ok and exact and seconds is not None
        print("batch size %5d: %d messages in %s, %s messages/s; payments: %d for %d ids%s" % (
            size, args.count, "%.2f s" % seconds if seconds else "-",
            "%.0f" % (args.count / seconds) if seconds else "-", rows, ids,
            "" if exact else " (WRONG)"), flush=True)
        channel.queue_purge(QUEUE)
        connection.process_data_events(0)
    connection.close()
    db.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
