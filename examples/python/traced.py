"""Trace context through the delay, with OpenTelemetry and redis-py.

    traced.py produce   schedules one id-mode task whose envelope carries the
                        current span's traceparent/tracestate; prints its
                        trace id
    traced.py consume   takes one delivery from QUEUE (pika), extracts the
                        context from its headers, starts a consumer span
                        linked to it; prints the extracted trace id

The business needs member = "id" and envelopes = true (docs/wire-format.md,
"Envelope" and "Trace context"). Environment: REDIS_URL, ID_KEY, DUE_MS,
ROUTING_KEY (produce); AMQP_URL, QUEUE (consume).
"""

import os
import struct
import sys
import time

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("delayd-example")


def short_str(s):
    b = s.encode()
    return bytes([len(b)]) + b


def envelope(routing_key, headers, body, content_type=None):
    """An envelope, version 1: 0xFF 0x01, the routing key, the AMQP
    properties (content type, string headers, persistent), the body."""
    flags, props = 0, b""
    if content_type is not None:
        flags |= 1 << 15
        props += short_str(content_type)
    table = b"".join(
        short_str(k) + b"S" + struct.pack(">I", len(v.encode())) + v.encode()
        for k, v in headers.items()
    )
    flags |= (1 << 13) | (1 << 12)  # headers, delivery-mode
    props += struct.pack(">I", len(table)) + table + bytes([2])
    return bytes([0xFF, 1]) + short_str(routing_key) + struct.pack(">H", flags) + props + body


def helper_key(key, suffix):
    """{K}:suffix, or K:suffix when K already has a {hash tag}."""
    open_ = key.find("{")
    tagged = open_ >= 0 and key.find("}", open_ + 1) > open_ + 1
    return f"{key}:{suffix}" if tagged else f"{{{key}}}:{suffix}"


def produce():
    import redis

    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    key = os.environ["ID_KEY"]
    with tracer.start_as_current_span("schedule order-42 expiry") as span:
        headers = {}
        propagate.inject(headers)  # traceparent (and tracestate, if any)
        stored = envelope(
            os.environ.get("ROUTING_KEY", "order.timeout"),
            headers,
            b'{"order":42,"action":"expire"}',
            content_type="application/json",
        )
        p = r.pipeline(transaction=True)
        p.hset(helper_key(key, "body"), "order-42", stored)
        p.zadd(key, {"order-42": int(os.environ["DUE_MS"])})
        p.execute()
        print(format(span.get_span_context().trace_id, "032x"))


def consume():
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    ch = conn.channel()
    deadline = time.monotonic() + 20
    while True:
        method, props, body = ch.basic_get(os.environ["QUEUE"], auto_ack=True)
        if method is not None:
            break
        if time.monotonic() > deadline:
            sys.exit("no delivery within 20 s")
        time.sleep(0.05)
    carrier = {k: v.decode() if isinstance(v, bytes) else v for k, v in (props.headers or {}).items()}
    producer = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    # A long delay: link to the producer's span rather than continue its trace.
    with tracer.start_as_current_span(
        "process order-42 expiry", links=[trace.Link(producer)], kind=trace.SpanKind.CONSUMER
    ):
        print(format(producer.trace_id, "032x"))
    conn.close()


{"produce": produce, "consume": consume}[sys.argv[1]]()
