"""Run every benchmark module in turn (what ``make bench`` runs), or the ones named with ``--only``.

Run::

    python -m bench.run_all                         # all of them, one after another (long: tens of minutes)
    python -m bench.run_all --only kafka,tcp        # just these (the ``bench_`` prefix is optional)
    python -m bench.run_all --quick --only mqtt     # the smoke sizes below, to check a module still runs
    python -m bench.run_all --list                  # the modules, in run order, and their quick arguments

Each module runs as its own process (``python -m bench.<module>``), so one's servers, threads and memory
never skew the next. Its output goes to the terminal as it runs and, whole, to
``<out>/<module>.txt`` (default ``bench/out/<UTC timestamp>/``; ``--out`` to change it). At the end a
summary says which modules ran, which failed (exit code), which were not selected, how long each took and
where its output is. The figures are copied into ``bench/RESULTS.md`` by hand, with the command that
produced them: nothing here edits that file. Exit code: 0 when every selected module succeeded, 1 when
one failed (the others still run), 2 for an unknown module name.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODULES", "QUICK_ARGS", "Outcome", "discover", "main", "select"]

BENCH_DIR = Path(__file__).resolve().parent

# Run order: quick in-process figures first, then those that start servers and peers.
MODULES = (
    "bench_kafka_codec",
    "bench_records",
    "bench_produce",
    "bench_kafka_conn",
    "bench_log",
    "bench_health",
    "bench_cleaner",
    "bench_processors",
    "bench_shuffle_cpu",
    "bench_state",
    "bench_tcp_stages",
    "bench_tcp_inproc",
    "bench_tcp",
    "bench_file",
    "bench_mqtt",
    "bench_mqtt_cpu",
    "bench_mqtt_durable",
    "bench_mqtt_idle",
    "bench_ws_frames",
    "bench_tls",
    "bench_kafka",
    "bench_kafka_large",
    "bench_kafka_tail",
    "bench_txn",
    "bench_sendfile",
    "bench_clients",
    "bench_http_limits",
    "bench_pipeline",
    "bench_soak",
    "bench_readback",
    "bench_long_tests",
)

# --quick: small sizes that show a module still works end to end (figures not meant for RESULTS.md).
QUICK_ARGS: dict[str, tuple[str, ...]] = {
    "bench_records": ("--batches", "20"),
    "bench_produce": ("--requests", "200", "--repeat", "1"),
    "bench_kafka_codec": (),
    "bench_kafka_conn": ("--rounds", "1"),
    "bench_log": ("--quick",),
    "bench_health": ("--rounds", "1"),
    "bench_soak": ("--duration", "20", "--devices", "20", "--sample-s", "2"),
    "bench_readback": ("--gib", "0.05"),
    "bench_cleaner": ("--mb", "4", "--seconds", "0.5"),
    "bench_processors": ("--records", "20000"),
    "bench_shuffle_cpu": ("--records", "20000", "--rounds", "1"),
    "bench_state": ("--keys", "2000", "--ops", "4000"),
    "bench_tcp_stages": ("--repeat", "1", "--number", "1"),
    "bench_tcp_inproc": ("--lines", "2000"),
    "bench_tcp": ("--lines", "10000", "--device-seconds", "1"),
    "bench_file": ("--lines", "5000", "--partitions", "2"),
    "bench_mqtt": ("--messages", "2000", "--runs", "1", "--publishers", "2", "--connections", "200"),
    "bench_mqtt_cpu": ("0", "os", "--messages", "2000"),
    "bench_mqtt_durable": ("--messages", "1000", "--runs", "1", "--publishers", "2"),
    "bench_mqtt_idle": ("--connections", "200", "--trace", "200"),
    "bench_ws_frames": (),
    "bench_tls": ("--records", "2000", "--mqtt-messages", "200", "--publishers", "2", "--rounds", "1"),
    "bench_kafka": ("--quick",),
    "bench_kafka_large": ("--quick",),
    "bench_kafka_tail": ("--seconds", "2", "--runs", "1"),
    "bench_txn": ("--records", "5000", "--rounds", "1"),
    "bench_sendfile": ("--gib", "0.1", "--runs", "1"),
    "bench_clients": ("--records", "2000", "--sse-samples", "20"),
    "bench_http_limits": ("--mb", "10"),
    "bench_long_tests": ("--suite-sizes", "--only", "test_runner.py"),
    "bench_pipeline": ("--rate", "500", "--sensors", "20", "--connections", "2", "--warmup", "3",
                       "--duration", "5"),
}


@dataclass(frozen=True, slots=True)
class Outcome:
    module: str
    status: str  # "ok", "failed (exit N)", "timed out", "not selected"
    seconds: float | None = None
    output: Path | None = None


def discover() -> list[str]:
    """Every ``bench/bench_*.py``: the known ones in MODULES order, then any new ones alphabetically."""
    found = sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))
    return [m for m in MODULES if m in found] + [m for m in found if m not in MODULES]


def select(available: list[str], only: list[str]) -> list[str]:
    """The modules named in ``only`` (comma-separated entries, ``bench_`` prefix optional), in run order."""
    if not only:
        return list(available)
    wanted: set[str] = set()
    for entry in only:
        for name in filter(None, (n.strip() for n in entry.split(","))):
            module = name if name.startswith("bench_") else f"bench_{name}"
            module = module.removesuffix(".py")
            if module not in available:
                raise ValueError(f"unknown benchmark {name!r}; choose from: {', '.join(available)}")
            wanted.add(module)
    return [m for m in available if m in wanted]


def run_module(module: str, args: list[str], out: Path, timeout: float | None) -> Outcome:
    """Run ``python -m bench.<module> args``, echoing its output and keeping a copy in ``out/<module>.txt``."""
    path = out / f"{module}.txt"
    command = [sys.executable, "-m", f"bench.{module}", *args]
    started = time.monotonic()
    with path.open("w") as log:
        log.write(f"$ {' '.join(['python', '-m', f'bench.{module}', *args])}\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill) if timeout is not None else None
        if watchdog is not None:
            watchdog.start()
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
            code = proc.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
    seconds = time.monotonic() - started
    if timed_out.is_set():
        return Outcome(module, f"timed out after {timeout:g} s", seconds, path)
    return Outcome(module, "ok" if code == 0 else f"failed (exit {code})", seconds, path)


def summary(outcomes: list[Outcome], out: Path) -> str:
    width = max(len(o.module) for o in outcomes)
    lines = [f"Benchmark summary (output of each module under {out}/):"]
    for o in outcomes:
        took = "" if o.seconds is None else f"{o.seconds:7.1f} s"
        where = "" if o.output is None else f"  {o.output}"
        lines.append(f"  {o.module:<{width}}  {o.status:<22} {took}{where}")
    ran = [o for o in outcomes if o.seconds is not None]
    failed = [o.module for o in ran if o.status != "ok"]
    lines.append(f"{len(ran)} ran, {len(ran) - len(failed)} ok, {len(failed)} failed"
                 + (f" ({', '.join(failed)})" if failed else "")
                 + f", {len(outcomes) - len(ran)} not selected.")
    lines.append("Copy figures into bench/RESULTS.md by hand, with the command shown at the top of each output file.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_all", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--only", action="append", default=[], metavar="NAMES",
                        help="comma-separated modules to run (e.g. kafka,tcp); repeatable; default: all")
    parser.add_argument("--quick", action="store_true", help="smoke sizes (see --list), not figures for RESULTS.md")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the outputs (default: bench/out/<UTC timestamp>)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a module is killed")
    parser.add_argument("--list", action="store_true", help="list the modules in run order and exit")
    args = parser.parse_args(argv)

    available = discover()
    if args.list:
        width = max(len(m) for m in available)
        for module in available:
            quick = " ".join(QUICK_ARGS.get(module, ())) or "(no arguments)"
            print(f"{module:<{width}}  --quick runs: python -m bench.{module} {quick}")
        return 0
    try:
        chosen = select(available, args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out: Path = args.out or BENCH_DIR / "out" / stamp
    out.mkdir(parents=True, exist_ok=True)

    outcomes: list[Outcome] = []
    for module in available:
        if module not in chosen:
            outcomes.append(Outcome(module, "not selected"))
            continue
        extra = list(QUICK_ARGS.get(module, ())) if args.quick else []
        print(f"\n=== bench.{module} {' '.join(extra)}".rstrip() + f"  ({len(outcomes) + 1}/{len(available)})",
              flush=True)
        outcomes.append(run_module(module, extra, out, args.timeout))
    text = summary(outcomes, out)
    print("\n" + text)
    (out / "SUMMARY.txt").write_text(text + "\n")
    return 0 if all(o.status in ("ok", "not selected") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
