#!/usr/bin/env python3
"""A stand-in for Kafka's ``bin/kafka-topics.sh`` for librdkafka's test suite (test_kafka_topics()).

librdkafka's tests 0045, 0052 and 0077 shell out to the Kafka distribution's kafka-topics.sh, which no
package registry ships. This covers the invocations those tests make (``--create`` with ``--partitions``,
``--replication-factor`` and repeated ``--config k=v``; ``--alter --partitions``; ``--delete``) through
confluent-kafka's AdminClient, so the request the broker sees is a CreateTopics / CreatePartitions /
DeleteTopics like the real tool's. Exit status 0 on success, 1 with the broker's error on stderr.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kafka-topics.sh")
    parser.add_argument("--bootstrap-server", required=True)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true")
    action.add_argument("--alter", action="store_true")
    action.add_argument("--delete", action="store_true")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=-1)
    parser.add_argument("--replication-factor", type=int, default=-1)
    parser.add_argument("--config", action="append", default=[])
    args = parser.parse_args(argv)
    admin = AdminClient({"bootstrap.servers": args.bootstrap_server})
    if args.create:
        configs = dict(item.split("=", 1) for item in args.config)
        futures = admin.create_topics([NewTopic(args.topic, args.partitions, args.replication_factor,
                                                config=configs)], operation_timeout=30)
    elif args.alter:
        futures = admin.create_partitions([NewPartitions(args.topic, args.partitions)], operation_timeout=30)
    else:
        futures = admin.delete_topics([args.topic], operation_timeout=30)
    try:
        for future in futures.values():
            future.result(timeout=60)
    except Exception as exc:  # the tool's behaviour: print the error, exit non-zero
        print(f"Error while executing topic command : {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
