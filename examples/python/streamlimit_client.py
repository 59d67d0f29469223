#!/usr/bin/env python3
"""Publish hits to streamlimit and read their count back, with confluent-kafka.

A service in any language takes part in a global limit by publishing JSON hit records to
the hits topic, keyed by the counter key, and reads the aggregated sliding-window counts
from the compacted counts topic. This script does both:

    python3 streamlimit_client.py --brokers localhost:9092 --key 'api|user=42#60s' --hits 5

publishes 5 hits of 1 for the key at site "py", then prints the key's count as the
aggregator publishes it (total and per site) once it includes them, and exits 0; it exits 1
if the count does not arrive within --timeout seconds.
"""

import argparse
import json
import math
import struct
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition


def hit_record(key, site, window_ms, n):
    """A hit in the contract's JSON form. ts, w and n must be JSON integers."""
    return json.dumps({
        "key": key,
        "site": site,
        "ts": int(time.time() * 1000),  # an int: a float would be rejected as bad_json
        "w": int(window_ms),
        "n": int(n),
    })


def publish(brokers, topic, key, site, window_ms, hits):
    # murmur2_random is the Java client's default partitioner: the hit lands on the
    # partition that owns its key, as the Go producer places it.
    p = Producer({"bootstrap.servers": brokers, "partitioner": "murmur2_random"})
    for _ in range(hits):
        p.produce(topic, key=key.encode(), value=hit_record(key, site, window_ms, 1).encode())
    if p.flush(30) != 0:
        raise SystemExit("hits not delivered within 30 s")


def uvarint(b, i):
    x, shift = 0, 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        if c < 0x80:
            return x, i
        shift += 7


def zigzag(b, i):
    u, i = uvarint(b, i)
    return (u >> 1) ^ -(u & 1), i


def decode_count(value):
    """Decodes a counts record: JSON, binary version 2 or version 1 (see docs/records.md)."""
    if value[:1] == b"{":
        c = json.loads(value)
        return {"key": c["key"], "w": c["w"], "total": c["total"], "sites": c.get("sites", {})}
    version = value[0]
    if version not in (1, 2):
        raise ValueError("unknown count version %d" % version)
    i = 1
    n, i = uvarint(value, i)
    key = value[i:i + n].decode()
    i += n
    w, i = uvarint(value, i)
    _asof, i = zigzag(value, i)
    if version == 2:
        _sub, i = uvarint(value, i)
    (total,) = struct.unpack_from("<d", value, i)
    i += 8
    nsites, i = uvarint(value, i)
    sites = {}
    for _ in range(nsites):
        n, i = uvarint(value, i)
        site = value[i:i + n].decode()
        i += n
        (count,) = struct.unpack_from("<d", value, i)
        i += 8
        if version == 2:
            i += 8  # demand
        sites[site] = count
    return {"key": key, "w": w, "total": total, "sites": sites}


def await_count(brokers, topic, key, site, want, timeout):
    """Reads the counts topic until key's count at site reaches want; returns the count."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "streamlimit-example-py",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    # Every partition from the start: the compacted topic holds every key's latest count.
    # The start is the log start offset, which compaction moves past 0 (a fetch at 0 would
    # be answered "offset out of range" and reset with a warning).
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() or m.key() is None or m.key().decode() != key:
                continue
            if m.value() is None:
                continue  # a tombstone: the count fell to zero
            count = decode_count(m.value())
            if math.isclose(count["sites"].get(site, 0), want):
                return count
    finally:
        c.close()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="localhost:9092")
    ap.add_argument("--hits-topic", default="hits")
    ap.add_argument("--counts-topic", default="counts")
    ap.add_argument("--key", required=True, help="counter key, e.g. 'api|user=42#60s'")
    ap.add_argument("--site", default="py")
    ap.add_argument("--window-ms", type=int, default=60000)
    ap.add_argument("--hits", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()

    publish(a.brokers, a.hits_topic, a.key, a.site, a.window_ms, a.hits)
    count = await_count(a.brokers, a.counts_topic, a.key, a.site, a.hits, a.timeout)
    if count is None:
        print("no count of %d for %s at site %s within %gs" % (a.hits, a.key, a.site, a.timeout), file=sys.stderr)
        return 1
    sites = " ".join("%s=%g" % kv for kv in sorted(count["sites"].items()))
    print("count %s total=%g %s" % (count["key"], count["total"], sites))
    return 0


if __name__ == "__main__":
    sys.exit(main())
