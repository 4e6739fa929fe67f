#!/usr/bin/env python3
"""What producers' far-future writes cost delayd in Redis.

    deploy/local/far-writes.py PORT KEY RATE SECS

Writes RATE members per second due in a week to KEY on the Redis at
127.0.0.1:PORT for SECS seconds (a few per pipeline, as a busy producer
would), with a delayd already running on KEY, then prints from INFO
commandstats how many commands delayd ran per producer write and how much
Redis time they took against the producers' own ZADDs. Use a Redis that
nothing else uses (its stats are reset). Needs redis-py (pip install redis).
"""
import sys
import time

import redis
port, key, rate, secs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
r = redis.Redis(port=port)
def stats():
    s = r.info("commandstats")
    return {k: (v["calls"], v["usec"]) for k, v in s.items()}
time.sleep(1.0)
r.config_resetstat()
week = 7 * 86400 * 1000
t0 = time.time(); n = 0
while True:
    el = time.time() - t0
    if el >= secs: break
    want = int(el * rate)
    if n < want:
        p = r.pipeline(transaction=False)
        now = int(time.time() * 1000)
        for i in range(n, want):
            p.zadd(key, {f"far-{i}-{now}": now + week})
        p.execute()
        n = want
    time.sleep(0.001)
s = stats()
z = s.get("cmdstat_zadd", (0, 0))
others = {k: v for k, v in s.items() if k not in ("cmdstat_zadd", "cmdstat_config", "cmdstat_info")}
dc = sum(v[0] for v in others.values()); du = sum(v[1] for v in others.values())
print(f"writes {z[0]} ({z[0]/secs:.0f}/s), producer usec {z[1]}; delayd calls {dc} ({dc/z[0]:.3f} per write), delayd usec {du} ({du/max(z[1],1):.2f}x producer)")
for k, v in sorted(others.items()): print(f"  {k}: calls {v[0]} usec {v[1]}")
