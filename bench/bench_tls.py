"""What TLS and SASL cost: Kafka produce and MQTT ingest against plaintext, side by side in one run.

Run: ``python -m bench.bench_tls [--records 300000] [--mqtt-messages 25000] [--rounds 3]`` (~2 min).

Four ``sluice serve`` processes (segment store, flush=os so that the fsync does not hide the transport's
cost; uvloop), one per Kafka security protocol: PLAINTEXT (auth off, no TLS), SSL (TLS), SASL_PLAINTEXT
(``security.auth = required``) and SASL_SSL (both). Dev certificates (``sluice.dev_certs``, ECDSA P-256)
and one SCRAM user are made in a temporary directory.

* Kafka: one ``kcat -P -l`` (C, librdkafka; acks=all, idempotent, linger 5 ms) sends ``--records`` lines of
  100 B to a partition of each server in turn, round after round (interleaved); records/s from start to
  kcat's exit (every record acknowledged), the count checked against the high watermark. SASL logins
  use SCRAM-SHA-512 (one login per connection: its cost is per connection, not per record).
* MQTT: the SSL server also keeps plain MQTT on, so plain and TLS doors are the same process. 4
  ``mosquitto_pub -l -q 1 -M 1000`` (C) publishers send ``--mqtt-messages`` 100 B lines each to the plain
  port, then to the TLS port (``--cafile``); time = until every publisher exited, i.e. until every PUBACK
  came back, and Sluice sends a PUBACK only after the durable append.

Ratios are to the plaintext figure of the same round, for throughput and for the broker process's CPU time
per record (``/proc/<pid>/stat``; steadier than throughput on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from broker.security import UserStore
from sluice.dev_certs import DevCertificates, write_dev_certificates

PASSWORD = "bench-password"
MODES = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class Server:
    def __init__(self, root: Path, name: str, env: dict[str, str]) -> None:
        self.data = root / name
        self.log = root / f"{name}.log"
        if "SLUICE_SECURITY__AUTH" in env:
            UserStore(self.data).add("bench", PASSWORD)
        full = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_MQTT__TLS_PORT": "0",
                "SLUICE_TCP__ENABLED": "false", "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__FLUSH": "os",
                "SLUICE_EVENT_LOOP": "uvloop", "SLUICE_LOG_LEVEL": "WARNING", **env}
        self.proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(self.data)],
                                     env=full, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        endpoints = self.data / "endpoints.json"
        wanted = {"kafka", "mqtt", *(["mqtt-tls"] if "SLUICE_SECURITY__TLS_CERT" in env else [])}
        deadline = time.monotonic() + 60
        while not (endpoints.exists() and wanted <= set(json.loads(endpoints.read_text() or "{}"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.ports = {k: int(v["port"]) for k, v in json.loads(endpoints.read_text()).items()}

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far (``/proc/<pid>/stat``)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def kafka_options(mode: str, certs: DevCertificates) -> list[str]:
    options = ["-X", f"security.protocol={mode}"]
    if "SSL" in mode:
        options += ["-X", f"ssl.ca.location={certs.ca}"]
    if mode.startswith("SASL"):
        options += ["-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=bench", "-X",
                    f"sasl.password={PASSWORD}"]
    return options


def librdkafka_config(mode: str, certs: DevCertificates, bootstrap: str) -> dict[str, str]:
    options = kafka_options(mode, certs)
    return {"bootstrap.servers": bootstrap, "group.id": "hw",
            **dict(options[i + 1].split("=", 1) for i in range(0, len(options), 2))}


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "n/a"  # tiny --quick runs can use no measurable CPU


def high_watermark(config: dict[str, str], topic: str) -> int:
    # log_level 2: closing at once races the group coordinator's SASL login, which librdkafka reports as an error
    consumer = Consumer({**config, "log_level": 2})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def kafka_round(server: Server, mode: str, certs: DevCertificates, lines: Path, records: int,
                topic: str) -> tuple[float, float]:
    bootstrap = f"127.0.0.1:{server.ports['kafka']}"
    args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0", *kafka_options(mode, certs),
            "-X", "linger.ms=5", "-X", "batch.num.messages=10000", "-X", "queue.buffering.max.messages=1000000",
            "-X", "queue.buffering.max.kbytes=1048576", "-X", "acks=all", "-X", "enable.idempotence=true"]
    subprocess.run(args, input=b"warm-up\n", check=True, timeout=60)  # creates the topic, untimed
    config = librdkafka_config(mode, certs, bootstrap)
    before = high_watermark(config, topic)
    cpu = server.cpu_seconds()
    started = time.perf_counter()
    done = subprocess.run([*args, "-l", str(lines)], capture_output=True, timeout=600)
    elapsed = time.perf_counter() - started
    cpu = server.cpu_seconds() - cpu
    if done.returncode or done.stderr.strip():
        raise SystemExit(f"kcat {mode} failed: {done.stderr.decode(errors='replace')}")
    stored = high_watermark(config, topic) - before
    if stored != records:
        raise SystemExit(f"kcat {mode}: {records} produced, {stored} stored")
    return records / elapsed, cpu / records * 1e6


def mqtt_round(server: Server, port: int, certs: DevCertificates | None, files: list[Path], total: int,
               tag: str) -> tuple[float, float]:
    tls = ["--cafile", str(certs.ca), "-h", "localhost"] if certs is not None else ["-h", "127.0.0.1"]
    cpu = server.cpu_seconds()
    started = time.perf_counter()
    procs = [subprocess.Popen(["mosquitto_pub", *tls, "-p", str(port), "-V", "mqttv5", "-q", "1", "-M", "1000",
                               "-i", f"bench-{tag}-{i}", "-t", f"bench/dev{i}/reading", "-l"],
                              stdin=f.open("rb"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i, f in enumerate(files)]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    elapsed = time.perf_counter() - started
    cpu = server.cpu_seconds() - cpu
    if any(p.returncode for p in procs) or any(e.strip() for e in errors):
        raise SystemExit(f"mosquitto_pub failed: {errors}")
    return total / elapsed, cpu / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000, help="Kafka records per run")
    parser.add_argument("--mqtt-messages", type=int, default=25_000, help="messages per MQTT publisher")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for tool in ("kcat", "mosquitto_pub"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (scripts/install-system-deps.sh)")
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        root = Path(tmp)
        certs = write_dev_certificates(root / "tls")
        tls = {"SLUICE_SECURITY__TLS_CERT": str(certs.cert), "SLUICE_SECURITY__TLS_KEY": str(certs.key)}
        auth = {"SLUICE_SECURITY__AUTH": "required"}
        envs = {"PLAINTEXT": {}, "SSL": tls, "SASL_PLAINTEXT": auth, "SASL_SSL": {**tls, **auth}}
        lines = root / "lines"
        lines.write_bytes((b"x" * 100 + b"\n") * args.records)
        files = []
        for i in range(args.publishers):
            f = root / f"mqtt-{i}"
            f.write_bytes(b"".join(b'{"v": %d, "pad": "%s"}\n' % (n, b"p" * 80) for n in range(args.mqtt_messages)))
            files.append(f)
        servers = {mode: Server(root, mode.lower(), env) for mode, env in envs.items()}
        try:
            print(f"Kafka: kcat -P, {args.records} x 100 B, acks=all; MQTT: {args.publishers} x mosquitto_pub "
                  f"QoS 1, {args.mqtt_messages} x ~100 B each; flush=os")
            for n in range(1, args.rounds + 1):
                rates = {mode: kafka_round(servers[mode], mode, certs, lines, args.records, f"r{n}")
                         for mode in MODES}
                base, base_cpu = rates["PLAINTEXT"]
                print(f"round {n} Kafka produce: " + ", ".join(
                    f"{mode} {rate:,.0f} rec/s ({ratio(rate, base)}), broker {cpu:.2f} µs CPU/rec "
                    f"({ratio(cpu, base_cpu)})" for mode, (rate, cpu) in rates.items()))
                total = args.publishers * args.mqtt_messages
                ssl_server = servers["SSL"]
                plain, plain_cpu = mqtt_round(ssl_server, ssl_server.ports["mqtt"], None, files, total, f"p{n}")
                secure, secure_cpu = mqtt_round(ssl_server, ssl_server.ports["mqtt-tls"], certs, files, total,
                                                f"t{n}")
                print(f"round {n} MQTT QoS 1 ingest: plain {plain:,.0f} msg/s, broker {plain_cpu:.2f} µs CPU/msg; "
                      f"TLS {secure:,.0f} msg/s ({ratio(secure, plain)}), broker {secure_cpu:.2f} µs CPU/msg "
                      f"({ratio(secure_cpu, plain_cpu)})")
        finally:
            for server in servers.values():
                server.stop()


if __name__ == "__main__":
    main()
