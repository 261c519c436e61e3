"""Produce of large records against the disk: Sluice's acks=1 produce at 1 KiB (and 100 B, to check
it does not regress), dd's sequential write and Redis XADD, in one run.

Run: ``python -m bench.bench_kafka_large [--rounds 3] [--broker-pythonpath OLD_TREE] [--quick]`` (gcc and
librdkafka-dev: ``scripts/install-system-deps.sh bench``). Each round measures, in this order:

- dd: ``dd if=/dev/zero of=<tmp>/dd bs=1M count=1024 conv=fdatasync`` on the file system Sluice
  writes to (``BENCH_DIR`` chooses it; the system's temporary directory by default): the rate
  of a sequential write including its final fdatasync, and dd's own CPU time per KiB (the kernel's
  cost of putting a KiB into the page cache and writing it back, that round: on a VM whose fresh pages
  fault on the host it varies tenfold from run to run, and every broker pays it too);
- Sluice (``sluice serve``, segment store, flush=os) fed by ``bench/loadgen/kafka_produce.c``
  (librdkafka, acks=1, linger.ms=5) with 400,000 × 1 KiB and 2,000,000 × 100 B records; broker
  CPU per record from /proc, user and system apart; with ``--broker-pythonpath`` a second Sluice from
  that tree (e.g. a ``git worktree`` of an older commit) runs the same load, first or second in turn,
  for an old/new pair;
- Redis XADD pipelined (``redis-benchmark -P 100``, no persistence) of the same record sizes.

Targets of issue 18: 1 KiB produce broker CPU ≤ 1 µs per record and bytes/s ≥ 0.5 × dd's.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import tempfile
from pathlib import Path

from bench.bench_kafka import (
    build_loadgen,
    loadgen_produce,
    process,
    redis_server,
    redis_xadd_pipelined,
    sluice,
)

SIZES = {1024: 400_000, 100: 2_000_000}


def dd_write(directory: Path, mib: int) -> tuple[float, float]:
    """Bytes/s of a sequential write of ``mib`` MiB with its fdatasync, as dd reports it, and dd's CPU
    time (user + system) per KiB written."""
    target = directory / "dd"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                          capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    target.unlink()
    match = re.search(r"^(\d+) bytes .*copied, ([\d.]+) s,", done.stderr, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"cannot read dd's output: {done.stderr!r}")
    written = int(match.group(1))
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return written / float(match.group(2)), cpu / (written / 1024) * 1e6


def user_system_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds a process has spent in user space and in the kernel (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def sluice_round(
    root: Path, exe: Path, label: str, pythonpath: str | None, sizes: dict[int, int]
) -> dict[int, tuple[float, float, float]]:
    """Per record size: records/s, broker user and system µs per record."""
    saved = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    try:
        with sluice(root / f"sluice-{label}", "os") as (bootstrap, pid):
            out = {}
            for size, total in sizes.items():
                user, system = user_system_seconds(pid)
                rate, _ = loadgen_produce(exe, bootstrap, f"lg{size}", total, size, "1", False)
                user_after, system_after = user_system_seconds(pid)
                out[size] = (rate, (user_after - user) / total * 1e6, (system_after - system) / total * 1e6)
            return out
    finally:
        if pythonpath is not None:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker-pythonpath", help="also run the Sluice of this tree (PYTHONPATH) each round")
    parser.add_argument("--quick", action="store_true", help="one round, a tenth of the records (a smoke run)")
    args = parser.parse_args()
    sizes = {size: total // 10 for size, total in SIZES.items()} if args.quick else SIZES
    rounds, mib = (1, 128) if args.quick else (args.rounds, 1024)
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        exe = build_loadgen(root)
        for r in range(rounds):
            load = os.getloadavg()[0]
            dd, dd_cpu = dd_write(root, mib)
            trees: list[str | None] = [None, args.broker_pythonpath] if args.broker_pythonpath else [None]
            runs = {tree or "this tree": sluice_round(root, exe, f"{i}-{r}", tree, sizes)  # order swapped each round
                    for i, tree in enumerate(trees if r % 2 == 0 else trees[::-1])}
            command, port = redis_server(root, f"redis{r}", False)
            with process(command, port):
                redis = {size: redis_xadd_pipelined(port, total, size) for size, total in sizes.items()}
            for tree, result in runs.items():
                for size, (rate, user, system) in result.items():
                    rows.append((r, load, tree, size, rate, user, system, rate * size / dd, rate / redis[size], dd,
                                 dd_cpu))
            print(f"round {r} done (load {load:.1f})", flush=True)
    print("\n| round | load avg | broker | record | records/s | MB/s | broker CPU µs/record (user + system) | "
          "x dd's MB/s | x Redis XADD | dd MB/s | dd CPU µs/KiB |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r, load, tree, size, rate, user, system, vs_dd, vs_redis, dd, dd_cpu in rows:
        print(f"| {r} | {load:.1f} | {tree} | {size} B | {rate:,.0f} | {rate * size / 1e6:,.0f} | "
              f"{user + system:.2f} ({user:.2f} + {system:.2f}) | {vs_dd:.2f} | {vs_redis:.2f} | {dd / 1e6:,.0f} | "
              f"{dd_cpu:.2f} |")


if __name__ == "__main__":
    main()
