#!/usr/bin/env python3
"""Publish payment messages to the queue that consumer.py reads.

    publish.py MESSAGE_ID '{"amount": 1250, "currency": "EUR"}' [MESSAGE_ID JSON ...]

Each message is persistent, carries its id in the AMQP message_id property
and is confirmed by the broker before the next one is sent (publisher
confirms): when publish.py exits 0, the broker has every message.  Sending
the same id again is what a publisher does when it does not know whether
its first send arrived; the consumer's inbox makes that harmless.

The id must be stable: the same event gets the same id however often it is
sent.  A publisher that relays an outbox table sends the event id stored
with the event, for instance idem_derive_key(idempotency_key, 'payment.created')
computed in the transaction that wrote the payment (docs/consumers.md).

AMQP_URL (or --amqp-url) names the broker.
"""

import argparse
import os

import pika

from consumer import QUEUE, declare_queues


def publish(channel, message_id, body, queue=QUEUE, properties=None):
    """Send one message (body: bytes) and wait for the broker's confirm.
    The channel must be in confirm mode (channel.confirm_delivery())."""
    if properties is None:
        properties = pika.BasicProperties(
            message_id=message_id, content_type="application/json",
            delivery_mode=pika.spec.PERSISTENT_DELIVERY_MODE)
    channel.basic_publish("", queue, body, properties, mandatory=True)


def open_channel(amqp_url, queue=QUEUE):
    """A connection and a channel in confirm mode, the queues declared."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    declare_queues(channel, queue, queue + ".dead")
    channel.confirm_delivery()
    return connection, channel


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--amqp-url", default=os.environ.get(
        "AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--queue", default=QUEUE)
    parser.add_argument("messages", nargs="+", metavar="MESSAGE_ID JSON")
    args = parser.parse_args()
    if len(args.messages) % 2:
        parser.error("give a JSON body after each message id")
    connection, channel = open_channel(args.amqp_url, args.queue)
    try:
        for message_id, body in zip(args.messages[::2], args.messages[1::2]):
            publish(channel, message_id, body.encode(), args.queue)
    finally:
        connection.close()


if __name__ == "__main__":
    main()
