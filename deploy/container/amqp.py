#!/usr/bin/env python3
"""RabbitMQ side of deploy/container/test.sh.

    amqp.py declare EXCHANGE QUEUE ROUTING_KEY   durable direct exchange and a
                                                 queue bound to it
    amqp.py drain QUEUE --expect N --timeout T   take every message off QUEUE
                                                 until N arrived and nothing
                                                 more for 1 s (or T seconds
                                                 passed); print one body per line
    amqp.py delete EXCHANGE QUEUE                remove both again

The broker URL comes from DELAYD_TEST_AMQP_URL. Needs pika (the script
installs it in a venv under .local/).
"""

import argparse
import os
import sys
import time

import pika


def connect():
    url = os.environ.get("DELAYD_TEST_AMQP_URL")
    if not url:
        sys.exit("amqp.py: DELAYD_TEST_AMQP_URL is not set")
    params = pika.URLParameters(url)
    params.connection_attempts = 5
    params.retry_delay = 1
    return pika.BlockingConnection(params)


def declare(args):
    with connect() as conn:
        ch = conn.channel()
        ch.exchange_declare(args.exchange, exchange_type="direct", durable=True)
        ch.queue_declare(args.queue, durable=True)
        ch.queue_bind(args.queue, args.exchange, routing_key=args.routing_key)


def drain(args):
    """Bodies as they came, one per line; a quiet second after the expected
    count ends the wait, so a duplicate that follows still shows up."""
    bodies = []
    deadline = time.monotonic() + args.timeout
    quiet_since = None
    with connect() as conn:
        ch = conn.channel()
        while time.monotonic() < deadline:
            method, _props, body = ch.basic_get(args.queue, auto_ack=True)
            if method is not None:
                bodies.append(body)
                quiet_since = None
                continue
            if len(bodies) >= args.expect:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 1.0:
                    break
            time.sleep(0.05)
    for body in bodies:
        sys.stdout.buffer.write(body + b"\n")


def delete(args):
    with connect() as conn:
        ch = conn.channel()
        ch.queue_delete(args.queue)
        ch.exchange_delete(args.exchange)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("declare")
    p.add_argument("exchange")
    p.add_argument("queue")
    p.add_argument("routing_key")
    p.set_defaults(fn=declare)
    p = sub.add_parser("drain")
    p.add_argument("queue")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--timeout", type=float, default=60)
    p.set_defaults(fn=drain)
    p = sub.add_parser("delete")
    p.add_argument("exchange")
    p.add_argument("queue")
    p.set_defaults(fn=delete)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
