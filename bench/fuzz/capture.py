"""Capture the Kafka requests real clients send, as the seed corpus of the Kafka fuzz campaign.

    python -m bench.fuzz.capture [--out bench/fuzz/corpus/kafka-clients.bin]

Starts ``sluice serve`` advertising the port of a recording proxy, so every connection of every client
(bootstrap and the ones Metadata points to) goes through the proxy. Then kcat, confluent-kafka
(librdkafka), aiokafka and kafka-python do what applications do: metadata, produce (each compression,
idempotent), consume, consumer groups with commits, ListOffsets by time, admin (create, describe configs,
list/describe groups, delete). The client-to-broker bytes are split into frames and written,
concatenated, to the corpus file; a summary of API keys and versions is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

from bench.fuzz.harness import BrokerProcess, free_port
from bench.fuzz.kafka import CORPUS, load_captured

__all__ = ["CLIENT_SCRIPTS", "capture", "main"]

CLIENT_SCRIPTS: dict[str, str] = {
    "confluent-kafka": """
        import confluent_kafka as ck, confluent_kafka.admin as ka, time
        conf = {"bootstrap.servers": BOOT}
        admin = ka.AdminClient(conf)
        for f in admin.create_topics([ka.NewTopic("cap-ck", 2, 1)]).values(): f.result()
        for f in admin.describe_configs([ka.ConfigResource("topic", "cap-ck")]).values(): f.result()
        for comp in ("none", "gzip", "snappy", "lz4", "zstd"):
            p = ck.Producer({**conf, "compression.type": comp, "enable.idempotence": comp == "none",
                             "linger.ms": 5})
            for i in range(20): p.produce("cap-ck", key=b"k%d" % i, value=b"v" * i, headers={"h": b"x"})
            p.flush(10)
        c = ck.Consumer({**conf, "group.id": "cap-ck-g", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
        c.subscribe(["cap-ck"])
        got, end = 0, time.time() + 20
        while got < 40 and time.time() < end:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
                c.commit(m, asynchronous=False)
        tp = [ck.TopicPartition("cap-ck", 0, int(time.time() * 1000) - 60000)]
        c.offsets_for_times(tp, 10)
        c.close()
        admin.list_groups(timeout=10)
        admin.describe_consumer_groups(["cap-ck-g"])["cap-ck-g"].result()
        tx = ck.Producer({**conf, "transactional.id": "cap-tx"})
        tx.init_transactions(10)
        tx.begin_transaction()
        tx.produce("cap-ck", b"in-a-transaction")
        c2 = ck.Consumer({**conf, "group.id": "cap-tx-g"})
        tx.send_offsets_to_transaction([ck.TopicPartition("cap-ck", 0, 1)], c2.consumer_group_metadata(), 10)
        tx.commit_transaction(10)
        tx.begin_transaction()
        tx.produce("cap-ck", b"aborted")
        tx.abort_transaction(10)
        c2.close()
        calls = [
            lambda: admin.create_partitions([ka.NewPartitions("cap-ck", 3)]).values(),
            lambda: admin.delete_records([ck.TopicPartition("cap-ck", 0, 1)]).values(),
            lambda: admin.delete_consumer_groups(["cap-ck-g"]).values(),
            lambda: admin.list_offsets({ck.TopicPartition("cap-ck", 0): ka.OffsetSpec.latest()}).values(),
        ]
        for call in calls:  # each API the broker serves; a refusal is fine, the request was captured
            try:
                for f in call(): f.result()
            except Exception as exc:
                print("refused:", exc)
        for f in admin.delete_topics(["cap-ck"]).values(): f.result()
    """,
    "aiokafka": """
        import asyncio, aiokafka
        async def main():
            p = aiokafka.AIOKafkaProducer(bootstrap_servers=BOOT, enable_idempotence=True)
            await p.start()
            for i in range(10): await p.send_and_wait("cap-aio", b"v%d" % i, key=b"k")
            await p.stop()
            c = aiokafka.AIOKafkaConsumer("cap-aio", bootstrap_servers=BOOT, group_id="cap-aio-g",
                                          auto_offset_reset="earliest", enable_auto_commit=False)
            await c.start()
            got = 0
            async with asyncio.timeout(20):
                while got < 10:
                    batch = await c.getmany(timeout_ms=500)
                    got += sum(len(v) for v in batch.values())
            await c.commit()
            await c.stop()
        asyncio.run(main())
    """,
    "kafka-python": """
        import kafka, kafka.admin as ka
        admin = ka.KafkaAdminClient(bootstrap_servers=BOOT)
        admin.create_topics([ka.NewTopic("cap-kp", 1, 1)])
        admin.describe_configs([ka.ConfigResource(ka.ConfigResourceType.TOPIC, "cap-kp")])
        p = kafka.KafkaProducer(bootstrap_servers=BOOT, compression_type="gzip")
        for i in range(10): p.send("cap-kp", b"v%d" % i)
        p.flush(10)
        c = kafka.KafkaConsumer("cap-kp", bootstrap_servers=BOOT, group_id="cap-kp-g",
                                auto_offset_reset="earliest", consumer_timeout_ms=5000)
        for n, _ in enumerate(c):
            if n >= 9: break
        c.commit()
        c.close()
        calls = {"list_consumer_groups": (), "list_groups": (), "describe_consumer_groups": (["cap-kp-g"],),
                 "describe_groups": (["cap-kp-g"],), "list_consumer_group_offsets": ("cap-kp-g",),
                 "list_group_offsets": ("cap-kp-g",)}
        for call, call_args in calls.items():  # names differ between kafka-python 2 and 3
            if hasattr(admin, call):
                getattr(admin, call)(*call_args)
        admin.delete_topics(["cap-kp"])
        admin.close()
    """,
}


def _kcat_commands(boot: str) -> list[tuple[list[str], bytes]]:
    lines = b"".join(b"k%d:value %d\n" % (i, i) for i in range(20))
    out: list[tuple[list[str], bytes]] = [(["kcat", "-b", boot, "-L"], b"")]
    for comp in ("none", "gzip", "snappy", "lz4", "zstd"):
        out.append((["kcat", "-b", boot, "-P", "-t", "cap-kcat", "-K:", "-z", comp], lines))
    out += [
        (["kcat", "-b", boot, "-C", "-t", "cap-kcat", "-o", "beginning", "-e"], b""),
        (["kcat", "-b", boot, "-C", "-t", "cap-kcat", "-o", "s@0", "-e"], b""),
        (["kcat", "-b", boot, "-G", "cap-kcat-g", "-o", "beginning", "-c", "20", "cap-kcat"], b""),
        (["kcat", "-b", boot, "-Q", "-t", "cap-kcat:0:0"], b""),
    ]
    return out


class RecordingProxy:
    """Forwards a local port to the broker, keeping what each client connection sent."""

    def __init__(self, upstream: tuple[str, int], port: int) -> None:
        self.upstream = upstream
        self.port = port
        self.sent: list[bytes] = []  # one entry per connection, in accept order
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if keep is not None:
                    keep += data
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        keep = bytearray()
        await asyncio.gather(self._pipe(reader, up_writer, keep), self._pipe(up_reader, writer, None))
        self.sent.append(bytes(keep))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()
        server.close()

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(10)


def capture(out: Path) -> list[bytes]:
    proxy_port = free_port()
    with tempfile.TemporaryDirectory(prefix="sluice-capture-") as tmp:
        broker = BrokerProcess(
            {"SLUICE_KAFKA__ADVERTISED_PORT": str(proxy_port), "SLUICE_MQTT__ENABLED": "false",
             "SLUICE_TCP__ENABLED": "false"},
            Path(tmp),
        )
        broker.start()
        proxy = RecordingProxy(broker.endpoints["kafka"], proxy_port)
        proxy.start()
        boot = f"127.0.0.1:{proxy_port}"
        try:
            for cmd, stdin in _kcat_commands(boot):
                done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=60)
                print(f"{' '.join(cmd[3:])}: exit {done.returncode}", file=sys.stderr)
            for name, script in CLIENT_SCRIPTS.items():
                code = f"BOOT = {boot!r}\n" + textwrap.dedent(script)
                done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
                print(f"{name}: exit {done.returncode} {done.stderr.decode()[-300:]}", file=sys.stderr)
        finally:
            broker.stop()
            proxy.loop.call_soon_threadsafe(proxy.loop.stop)
    frames = []
    for conn in proxy.sent:
        pos = 0
        while pos + 4 <= len(conn):
            size = int.from_bytes(conn[pos : pos + 4], "big")
            frames.append(conn[pos : pos + 4 + size])
            pos += 4 + size
    # one frame per distinct (api, version, body shape): repeated heartbeats and fetches add nothing
    unique: dict[bytes, bytes] = {}
    for frame in frames:
        unique.setdefault(frame[4:8] + len(frame).to_bytes(4, "big"), frame)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(unique.values()))
    return list(unique.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.capture", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args(argv)
    frames = capture(args.out)
    seen = collections.Counter(
        (int.from_bytes(f[4:6], "big"), int.from_bytes(f[6:8], "big")) for f in load_captured(args.out)
    )
    print(f"{len(frames)} frames in {args.out}")
    for (key, version), n in sorted(seen.items()):
        print(f"  api {key} v{version}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
