"""The TCP line path stage by stage, on one socket read's worth of bench_tcp's lines, in process.

    python -m bench.bench_tcp_stages [--repeat 9] [--number 20]

For NDJSON and InfluxDB line protocol (bench_tcp's generator: 1,000 devices): framing, the skip rules,
routing (the old per-line ``SourceRoutes.route`` and the read's ``LinePlan.route``), encoding (the old
``encode_record_tuples`` and ``encode_prepared_records``, compiled when built and pure) and the health
registry's per-read bookkeeping. CPU time of this thread (``time.thread_time``: less disturbed by other
processes than wall time on a shared machine), the minimum of ``--repeat`` rounds of ``--number`` calls,
in ns per line. The plan has seen every device before it is timed (as on a long-lived connection).
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable

from bench.bench_tcp import make_lines
from broker import native
from broker.protocol import prepared_records
from broker.protocol.records import encode_record_tuples
from ingest.health import HealthRegistry
from ingest.line_routes import line_plan
from ingest.routing import RawMessage, SourceRef
from ingest.tcp.framing import LineFramer
from ingest.tcp.lines import LineStream, payload_format
from sluice.components.ingest_core import build_router
from sluice.config import load_settings


def _stages(fmt: str, repeat: int, number: int) -> dict[str, float]:
    """ns per line of each stage for one read of ``fmt`` lines."""
    compiled = native.select(prepared_records)
    pure = native.pure("broker.protocol.prepared_records")
    router = build_router(load_settings(None).ingest)
    source = SourceRef("tcp", "default", payload_format(fmt))
    everything = make_lines(fmt, 20_000)
    read = everything[:65536]
    read = read[: read.rfind(b"\n") + 1]
    lines = read.split(b"\n")[:-1]
    routes = router.for_source(source)
    plan = line_plan(routes)
    assert plan is not None
    plan.route(everything.split(b"\n")[:-1], 1)  # every device learned
    targets, stamps = plan.route(lines, 1)
    prepared = []
    tuples = []
    seen: dict[str | None, list[int]] = {}
    for i, (line, target) in enumerate(zip(lines, targets, strict=True)):
        assert target is not None
        stamp = stamps[i] if stamps is not None else 1
        prepared.append((line, target.key_part, target.header_part, stamp))
        tuples.append((line, target.key, target.headers, stamp))
        seen.setdefault(target.device, [0, 0])[0] += 1
    health = HealthRegistry()
    items = LineFramer().feed(read)
    stages: dict[str, Callable[[], object]] = {
        "framing (LineFramer.feed)": lambda: LineFramer().feed(read),
        "skip rules (LineStream.lines)": lambda: LineStream(fmt).lines(list(items)),
        "route: SourceRoutes.route per line (old)": lambda: [routes.route(RawMessage(line, None, None, 1))
                                                              for line in lines],
        "route: LinePlan.route": lambda: plan.route(lines, 1),
        "encode: encode_record_tuples (old)": lambda: encode_record_tuples(tuples, header_cache={}),
        "encode: encode_prepared_records, selected": lambda: compiled.encode_prepared_records(prepared),
        "encode: encode_prepared_records, pure": lambda: pure.encode_prepared_records(prepared),
        f"health: record_batch, {len(seen)} devices, same 100 ms bucket": lambda: health.record_batch(source, seen),
    }
    out: dict[str, float] = {}
    for name, call in stages.items():
        best = min(timeit.repeat(call, number=number, repeat=repeat, timer=time.thread_time))
        out[name.split(",")[0] if name.startswith("health") else name] = best / number / len(lines) * 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()
    print(f"encoder compiled: {native.is_compiled(native.select(prepared_records))}")
    ndjson = _stages("ndjson", args.repeat, args.number)
    influx = _stages("influx", args.repeat, args.number)
    print("| stage | NDJSON ns/line | InfluxDB ns/line |")
    print("| --- | ---: | ---: |")
    for name, value in ndjson.items():
        print(f"| {name} | {value:,.0f} | {influx[name]:,.0f} |")


if __name__ == "__main__":
    main()
