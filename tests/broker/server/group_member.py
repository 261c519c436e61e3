"""One consumer-group member in its own process (confluent-kafka), for the group tests.

Usage: python -m tests.broker.server.group_member BOOTSTRAP TOPIC GROUP OUT_FILE
Appends "partition offset value" per consumed record to OUT_FILE and "assigned p,p,…" on each
assignment; commits synchronously after each batch it has written down (at-least-once).
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, TopicPartition


def main() -> None:
    bootstrap, topic, group, out_path = sys.argv[1:5]
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range", "topic.metadata.refresh.interval.ms": 1000,
    })

    def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
        out.write("assigned " + ",".join(str(p.partition) for p in partitions) + "\n")

    consumer.subscribe([topic], on_assign=on_assign)
    try:
        while True:
            messages = consumer.consume(200, timeout=0.2)
            good = [m for m in messages if m.error() is None]
            for m in good:
                value = m.value()
                assert value is not None  # every record the group tests produce has a value
                out.write(f"{m.partition()} {m.offset()} {value.decode()}\n")
            if good:
                consumer.commit(asynchronous=False)
                time.sleep(0.02)  # a slow worker, so that the group is mid-stream when one dies
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
