"""``streameval produce``: impression, judgment or click records from Avro files into a Kafka topic.

    streameval produce --bootstrap-servers HOST:PORT --topic TOPIC [--kind impression|judgment|click]
                       [--create-topic N] [--rate R] [--order time|files] AVRO [AVRO ...]

Each record becomes one Kafka record (through ``confluent-kafka``, librdkafka's Python client):

* its value: the record as JSON (:func:`streameval.io.records.to_json_text`), which ``streameval stream
  --kafka-impressions`` (``--kafka-judgments``, ``--kafka-clicks``) reads;
* its timestamp: the record's event time (``timestamp``, microseconds) in milliseconds, so that the
  job's watermark (``--kafka-timestamp-policy create_time``, the default) follows event time, and a
  backlog produced now of events of the past is not late data; a record without a timestamp gets
  the broker's time;
* its key: ``request_id`` (impressions, clicks) or ``query_id`` (judgments): the records of one
  request land in one partition, in the order given.

The records go in event-time order (``--order time``, the default: all files' records sorted by
``timestamp``, stable, records without one first), as a live log has them: Kafka's watermark in the
job is each partition's latest record timestamp, so a partition that goes back in time by more than
``--allowed-lateness`` sends the older records to late data (two files of a week each, one after the
other, made half of a week's impressions late on Flink). ``--order files``: the files in the order
given (globs expand in name order), each file's records in its own order, read as they go (for logs
larger than memory). ``--create-topic N`` creates the topic with N partitions first (an existing topic is kept);
``--rate R`` sends at most R records a second (a live stream for tests and demos; default: as fast as
the broker takes them). Prints one JSON object (topic, records produced, first and last timestamp) and
exits 0; 1 when a record was not delivered or confluent-kafka is missing (one line); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable

from ..exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE, one_line

__all__ = ["main", "produce", "KEYS"]

#: the field each kind of record is keyed by
KEYS = {"impression": "request_id", "click": "request_id", "judgment": "query_id"}


def produce(bootstrap_servers: str, topic: str, records, kind: str = "impression", rate: float | None = None,
            producer=None) -> dict:
    """Send ``records`` (dicts of the ``kind`` schema) to ``topic``; returns ``{"topic", "produced",
    "first_timestamp", "last_timestamp"}`` (event times in microseconds). Raises ``RuntimeError``
    (one line) when a record was not delivered. ``producer``: a confluent-kafka ``Producer`` (tests)."""
    from ..io.records import to_json_text

    if producer is None:
        from confluent_kafka import Producer

        # idempotent: a retried send is not written twice; librdkafka logs errors only (not its retries)
        producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "enable.idempotence": True,
                             "log_level": 3})
    failed: list = []

    def delivered(err, _msg):
        if err is not None:
            failed.append(str(err))

    key_field = KEYS[kind]
    n, first, last = 0, None, None
    start = time.monotonic()
    for rec in records:
        ts = rec.get("timestamp")
        kw = {"timestamp": ts // 1000} if isinstance(ts, int) else {}
        key = rec.get(key_field)
        while True:
            try:
                producer.produce(topic, to_json_text(rec).encode("utf-8"),
                                 key=None if key is None else str(key).encode("utf-8"), on_delivery=delivered, **kw)
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.1)
        n += 1
        if isinstance(ts, int):
            first = ts if first is None else min(first, ts)
            last = ts if last is None else max(last, ts)
        producer.poll(0)
        if rate:
            ahead = n / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    left = producer.flush(60)
    if failed or left:
        raise RuntimeError(f"{len(failed) + left} of {n} records not delivered to {topic}"
                           + (f": {failed[0]}" if failed else " within 60 s"))
    return {"topic": topic, "produced": n, "first_timestamp": first, "last_timestamp": last}


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> bool:
    """Create ``topic`` with ``partitions`` partitions (replication factor 1); False when it exists."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)
    except KafkaException as e:
        if e.args and getattr(e.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
            return False
        raise
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streameval produce", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", metavar="AVRO", help="Avro files or globs of the records, in this order")
    p.add_argument("--bootstrap-servers", required=True, help="Kafka's bootstrap servers (host:port,...)")
    p.add_argument("--topic", required=True)
    p.add_argument("--kind", choices=sorted(KEYS), default="impression",
                   help="the records' schema (default impression)")
    p.add_argument("--create-topic", type=int, default=None, metavar="N",
                   help="create the topic with N partitions first (kept when it exists)")
    p.add_argument("--rate", type=float, default=None, metavar="R", help="at most R records a second")
    p.add_argument("--order", choices=("time", "files"), default="time",
                   help="time: every record sorted by its timestamp (default); files: as the files hold them")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.rate is not None and not args.rate > 0:
        print(f"streameval produce: --rate must be a positive number of records a second, got {args.rate}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.create_topic is not None and args.create_topic < 1:
        print(f"streameval produce: --create-topic must be at least 1, got {args.create_topic}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("streameval produce: needs confluent-kafka (pip install 'streameval[kafka]')", file=sys.stderr)
        return EXIT_FAILED
    from ..io import avro

    try:
        paths = avro.expand_paths(args.paths)
    except (OSError, ValueError) as e:
        print(f"streameval produce: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.create_topic:
            create_topic(args.bootstrap_servers, args.topic, args.create_topic)
        records: Iterable[dict] = avro.read_records(paths, args.kind)
        if args.order == "time":
            records = sorted(records, key=lambda r: (r.get("timestamp") is not None, r.get("timestamp") or 0))
        done = produce(args.bootstrap_servers, args.topic, records, args.kind, args.rate)
    except Exception as e:  # noqa: BLE001 (the broker's, the client's and the files' errors: one line)
        print(f"streameval produce: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(done))
    return EXIT_OK
