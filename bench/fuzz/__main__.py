"""``python -m bench.fuzz <target> --inputs N [--seed S]``: one fuzz campaign against a live ``sluice serve``.

Targets: kafka, kafka-tls, kafka-sasl, mqtt, mqtt-tls, mqtt-ws, tcp, tcp-tls, http, https (-tls and https: the
same inputs inside TLS; mqtt-ws: MQTT over WebSockets, with hostile upgrades and frames; kafka-sasl: SASL
logins with auth required). Prints progress every 30 s and a report at the end; reproducers (the bytes each
offending connection sent) and the broker log go to ``bench/out/fuzz-<target>-<UTC time>/`` (``--out`` to
change). Exit code 0 when nothing was found, 1 on any finding (crash, hang, traceback or ERROR line in the
broker log, leaked sockets/fds, RSS growth beyond the limit, acknowledged data not read back intact, a real
client failing afterwards), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import sys
from pathlib import Path

from bench.fuzz.harness import Campaign, Target

__all__ = ["build_target", "main"]

TARGETS = ("kafka", "kafka-tls", "kafka-sasl", "mqtt", "mqtt-tls", "mqtt-ws", "tcp", "tcp-tls", "http", "https")


def build_target(name: str, deadline: float, kafka_seeds_per_version: int = 12) -> Target:
    if name == "kafka":
        from bench.fuzz.kafka import KafkaTarget

        return KafkaTarget(deadline, kafka_seeds_per_version)
    if name == "kafka-tls":
        from bench.fuzz.tls import KafkaTlsTarget

        return KafkaTlsTarget(deadline, kafka_seeds_per_version)
    if name == "kafka-sasl":
        from bench.fuzz.kafka_sasl import KafkaSaslTarget

        return KafkaSaslTarget(deadline)
    if name == "tcp-tls":
        from bench.fuzz.tls import TcpTlsTarget

        return TcpTlsTarget(deadline)
    if name == "mqtt":
        from bench.fuzz.mqtt import MqttTarget

        return MqttTarget(deadline)
    if name == "mqtt-tls":
        from bench.fuzz.mqtt_tls import MqttTlsTarget

        return MqttTlsTarget(deadline)
    if name == "mqtt-ws":
        from bench.fuzz.mqtt_ws import MqttWsTarget

        return MqttWsTarget(deadline)
    if name == "tcp":
        from bench.fuzz.tcp import TcpTarget

        return TcpTarget(deadline)
    if name == "http":
        from bench.fuzz.http import HttpTarget

        return HttpTarget(deadline)
    if name == "https":
        from bench.fuzz.tls import HttpsTarget

        return HttpsTarget(deadline)
    raise ValueError(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.0, help="at most this many inputs per second (0: no limit)")
    parser.add_argument("--connections", type=int, default=4, help="concurrent client connections (threads)")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds before a missing answer is a hang")
    parser.add_argument("--fd-slack", type=int, default=64, help="non-socket fds the broker may gain (segments)")
    parser.add_argument("--rss-growth-mib", type=int, default=256, help="RSS growth that counts as a finding")
    parser.add_argument("--kafka-seeds-per-version", type=int, default=12,
                        help="hypothesis-drawn requests per Kafka API version (besides the captured ones)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path(__file__).resolve().parents[1] / "out" / f"fuzz-{args.target}-{stamp}"
    command = "python -m bench.fuzz " + shlex.join(sys.argv[1:] if argv is None else argv)

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"[{datetime.datetime.now(datetime.UTC):%H:%M:%S}] {args.target}: {message}", flush=True)

    # SIGTERM ends the campaign like Ctrl-C does: the broker is stopped and its log kept
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    campaign = Campaign(
        [build_target(args.target, args.deadline, args.kafka_seeds_per_version) for _ in range(args.connections)],
        inputs=args.inputs,
        seed=args.seed,
        out_dir=out,
        rate=args.rate,
        fd_slack=args.fd_slack,
        rss_growth_mib=args.rss_growth_mib,
        progress=progress,
    )
    report = campaign.run(command)
    print(report.render(), flush=True)
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
