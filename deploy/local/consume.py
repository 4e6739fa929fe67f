#!/usr/bin/env python3
"""Demo consumer for delayd (deploy/local/demo.sh).

    consume.py declare [--purge]            declare the demo exchanges and queues
    consume.py consume [--count N] [--timeout T]
                                            print each delivery with its delayd
                                            headers and lateness; exit after N
                                            messages or T seconds

Topology (all durable):
    exchange orders    (direct) -> queue orders.timeout  (key order.timeout)
    exchange reminders (direct) -> queue reminders.due   (key reminder.due)

The broker URL comes from --url, else DELAYD_TEST_AMQP_URL, else
amqp://guest:guest@127.0.0.1:5672/%2f. Needs pika (demo.sh installs it in a
venv under .local/).
"""

import argparse
import os
import sys
import time

import pika

TOPOLOGY = [
    # (exchange, queue, routing key)
    ("orders", "orders.timeout", "order.timeout"),
    ("reminders", "reminders.due", "reminder.due"),
]


def connect(url):
    params = pika.URLParameters(url)
    params.connection_attempts = 5
    params.retry_delay = 1
    return pika.BlockingConnection(params)


def declare(url, purge):
    conn = connect(url)
    ch = conn.channel()
    for exchange, queue, key in TOPOLOGY:
        ch.exchange_declare(exchange=exchange, exchange_type="direct", durable=True)
        ch.queue_declare(queue=queue, durable=True)
        ch.queue_bind(queue=queue, exchange=exchange, routing_key=key)
        line = f"declared exchange {exchange!r} -> queue {queue!r} (key {key!r})"
        if purge:
            n = ch.queue_purge(queue=queue).method.message_count
            line += f", purged {n} old message(s)"
        print(line, flush=True)
    conn.close()


def header_int(headers, name):
    """A header as an int, whatever AMQP type the publisher used."""
    value = (headers or {}).get(name)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def show(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return "-" if value is None else str(value)


def consume(url, count, timeout):
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    received = []
    late = []

    def on_message(channel, method, props, body):
        now_ms = time.time() * 1000.0
        headers = props.headers or {}
        # properties = "full" carries the due time to the millisecond in a
        # header; the default message carries the due second in `timestamp`
        # and the business in `type`, and counts attempts only on retries.
        due = header_int(headers, "x-delayd-due")
        business = headers.get("x-delayd-business", props.type)
        attempt = headers.get("x-delayd-attempt", 1 if props.type else None)
        lateness = "-" if due is None else f"{now_ms - due:+.0f} ms"
        if due is not None:
            late.append(now_ms - due)
        received.append(body)
        text = body.decode("utf-8", "replace")
        print(
            f"[{len(received):>3}] {method.routing_key:<14} body={text!r} "
            f"business={show(business)} "
            f"due={show(due if due is not None else props.timestamp)} attempt={show(attempt)} "
            f"lateness={lateness} message_id={show(props.message_id)}",
            flush=True,
        )
        channel.basic_ack(method.delivery_tag)

    for _exchange, queue, _key in TOPOLOGY:
        ch.basic_consume(queue=queue, on_message_callback=on_message)

    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=min(0.1, max(0.0, deadline - time.monotonic())))
    conn.close()

    summary = f"received {len(received)} of {count} message(s)"
    if late:
        late.sort()
        summary += (
            f"; lateness min {late[0]:.0f} ms, median {late[len(late) // 2]:.0f} ms, "
            f"max {late[-1]:.0f} ms"
        )
    print(summary, flush=True)
    return 0 if len(received) >= count else 1


def main():
    default_url = os.environ.get("DELAYD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=default_url, help="AMQP URL (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_declare = sub.add_parser("declare", help="declare the demo exchanges, queues and bindings")
    p_declare.add_argument("--purge", action="store_true", help="also empty the demo queues")
    p_consume = sub.add_parser("consume", help="print deliveries with their lateness")
    p_consume.add_argument("--count", type=int, default=10, help="exit after this many messages")
    p_consume.add_argument("--timeout", type=float, default=30.0, help="exit after this many seconds")
    args = parser.parse_args()

    if args.command == "declare":
        declare(args.url, args.purge)
        return 0
    return consume(args.url, args.count, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
