"""CPU per record of the standalone processor rows of ``bench.bench_processors``, without and with the shuffle.

Run: ``python -m bench.bench_shuffle_cpu [--records N] [--rounds R]``. One ``sluice serve`` (as
``bench_processors`` starts it), N readings produced once, then R rounds of the standalone at-least-once
row and its repartitioned twin (``run_standalone_bench``: a fresh group per round, timed to the final
checkpoint, results checked). Per row and round it prints the rate, the CPU time this process spent
per record (both stages of the processor, their clients and the event loop) and the broker's
(``/proc/<pid>/stat``). Wall rates on a shared machine swing with its load; CPU per record much less,
so it is the figure to compare trees by (``bench/RESULTS.md``, the shuffle sections).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench import bench_processors as bp
from sluice.cli_process import run_event_loop
from sluice.gc_tuning import tune_for_serving

__all__ = ["main"]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(n: int, rounds: int) -> None:
    rows = bp.make_input(n)
    want = bp.closed(bp.batch_job(rows), rows)
    tune_for_serving()  # as bench_processors and sluice process run
    with tempfile.TemporaryDirectory() as tmp:
        proc, bootstrap = bp.start_sluice(Path(tmp))
        try:
            bp.produce_confluent(bootstrap, "bench-sa-in", rows)
            for round_ in range(rounds):
                for repartition in (False, True):
                    cpu, broker = time.process_time(), _cpu_seconds(proc.pid)
                    elapsed, got = await bp.run_standalone_bench(rows, bootstrap, round_, repartition=repartition)
                    cpu, broker = time.process_time() - cpu, _cpu_seconds(proc.pid) - broker
                    print(f"round {round_} {'repartitioned' if repartition else 'not repartitioned':17} "
                          f"{n / elapsed:9,.0f} rec/s  processor CPU {cpu / n * 1e6:5.2f} us/record  "
                          f"broker {broker / n * 1e6:5.2f} us/record  {bp.check('', got, want)}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    run_event_loop(_run(args.records, args.rounds))


if __name__ == "__main__":
    main()
