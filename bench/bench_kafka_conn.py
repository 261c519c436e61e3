"""Per-connection cost of the Kafka listener: raw Produce and Fetch requests over one loopback socket.

Run: ``python -m bench.bench_kafka_conn [--rounds 4] [--against REF] [--base REF]``. The listener (``KafkaServer`` on a
memory store, uvloop, in a child process together with its client) answers:

- pipelined Produce: 1,000 requests in flight (acks=1, one batch of 10 × 100 B records each);
- Produce round trips: one request at a time;
- Fetch round trips: one request at a time, at the high watermark with max_wait 0 (an empty answer:
  the per-request cost of the connection, not of reading records).

With ``--against REF`` (e.g. a commit before a change to ``broker/server``) the same measurement runs on
a temporary ``git worktree`` of REF too, alternating A/B/A/B so that the noise of a shared machine falls
on both; the table gives the best round of each and their ratio. ``--base REF`` measures REF instead of
the working tree (e.g. a change against its parent: ``--base C --against C~1``). Besides the rates it
reports CPU time per request (``time.process_time`` of the process running server and client): on a
shared machine the rates move with other load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
PIPELINED = 1000
ROUND_TRIPS = 2000
END = (PIPELINED + ROUND_TRIPS) * 10  # the high watermark once the produce rounds are done


async def _measure() -> dict[str, float]:
    from kio.index import load_request_schema

    from broker.log.memory import MemoryLogStore
    from broker.protocol.kafka import FrameDecoder, RequestHeader, build_entity, encode_request
    from broker.protocol.records import RecordSpec, encode_batch
    from broker.server.kafka import KafkaServer, KafkaServerConfig

    server = KafkaServer(MemoryLogStore(default_partitions=1), None, KafkaServerConfig(port=0))
    await server.start()
    batch = encode_batch([RecordSpec(b"x" * 100) for _ in range(10)])
    produce = build_entity(load_request_schema(0, 8), {
        "transactional_id": None, "acks": 1, "timeout": 5000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
    fetch = build_entity(load_request_schema(1, 11), {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": END,
                                                   "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    produce_frames = [encode_request(RequestHeader(0, 8, i, "bench"), produce) for i in range(PIPELINED)]
    fetch_frame = encode_request(RequestHeader(1, 11, 0, "bench"), fetch)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    decoder = FrameDecoder()

    async def answers(count: int) -> None:
        got = 0
        while got < count:
            got += len(decoder.feed(await reader.read(1 << 20)))

    results: dict[str, float] = {}

    def record(name: str, count: int, wall: float, cpu: float) -> None:
        results[name] = count / (time.perf_counter() - wall)
        results[f"{name} cpu"] = (time.process_time() - cpu) / count * 1e6

    wall, cpu = time.perf_counter(), time.process_time()
    writer.write(b"".join(produce_frames))
    await answers(PIPELINED)
    record("produce pipelined", PIPELINED, wall, cpu)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(ROUND_TRIPS):
        writer.write(produce_frames[i % PIPELINED])
        await answers(1)
    record("produce round trip", ROUND_TRIPS, wall, cpu)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(ROUND_TRIPS):
        writer.write(fetch_frame)
        await answers(1)
    record("fetch round trip", ROUND_TRIPS, wall, cpu)
    writer.close()
    await server.stop()
    return results


def _child() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(_measure())))


def _run(tree: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _best(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per figure the best round: the highest rate, the lowest CPU time."""
    return {key: (min if key.endswith("cpu") else max)(run[key] for run in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--against", help="a git ref to measure side by side (temporary worktree)")
    parser.add_argument("--base", help="measure this git ref instead of the working tree (temporary worktree)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child()
        return
    refs = [ref for ref in (args.base, args.against) if ref]
    with tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, Path] = {} if args.base else {"this tree": REPO}
        for ref in refs:
            trees[ref] = Path(tmp) / ref.replace("/", "_")
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(trees[ref]), ref],
                           check=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(_run(tree))
        finally:
            for ref in refs:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees[ref])],
                               check=False)
    best = {name: _best(r) for name, r in runs.items()}
    names = list(trees)
    ratio_head = " ratio |" if len(names) == 2 else ""
    print(f"| best of {args.rounds} rounds | {' | '.join(names)} |{ratio_head}")
    print("|---|" + "---|" * len(names) + ("---|" if len(names) == 2 else ""))
    for key in best[names[0]]:
        unit = "µs CPU per request (server + client)" if key.endswith("cpu") else "requests/s"
        label = key.removesuffix(" cpu")
        cells = " | ".join(f"{best[n][key]:,.1f}" if key.endswith("cpu") else f"{best[n][key]:,.0f}" for n in names)
        ratio = f" {best[names[0]][key] / best[names[1]][key]:.2f} |" if len(names) == 2 else ""
        print(f"| {label}: {unit} | {cells} |{ratio}")


if __name__ == "__main__":
    main()
