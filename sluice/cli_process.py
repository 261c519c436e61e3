"""``sluice process module:pipeline --bootstrap host:port``: a standalone processor.

The process is the processor's alone, so it runs as ``sluice serve`` does: on uvloop when it is
installed, and with the serving garbage-collector settings (``sluice.gc_tuning``) once its stages
have started. A standalone processor keeps tens of thousands of fetched records queued between its
fetch and process loops; under CPython's default generation-0 threshold they are rescanned by every
collection on their way to the oldest generation (bench/RESULTS.md, "Standalone processors: the
process settings").
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from processors.errors import ProcessorError
from processors.hosting import run_standalone
from processors.runner import GUARANTEES, Runner, RunnerConfig
from sluice.components.processors import load_pipeline
from sluice.gc_tuning import tune_for_serving

__all__ = ["run_event_loop", "run_process"]

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed (as ``sluice serve``'s ``event_loop = auto``)."""
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def run_process(ref: str, bootstrap: str, checkpoint_interval_s: float, session_timeout_ms: int = 10_000, *,
                guarantee: str = "at-least-once", instance_id: str | None = None,
                state_max_keys: int | None = None, state_dir: str | None = None) -> int:
    """Exit code: 0 after a clean stop, 1 when the processor failed, 2 for a bad pipeline reference
    or option."""
    chosen = next((g for g in GUARANTEES if g == guarantee), None)
    if chosen is None:
        print(f"error: --guarantee must be one of {', '.join(GUARANTEES)}, not {guarantee!r}", file=sys.stderr)
        return 2
    try:
        pipeline = load_pipeline(ref)
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = RunnerConfig(guarantee=chosen, checkpoint_interval_ms=round(checkpoint_interval_s * 1000),
                          state_max_keys=state_max_keys, state_dir=state_dir)
    tuned: list[bool] = []

    def started(_runner: Runner) -> None:  # called once every stage has started
        if not tuned:
            tuned.append(True)
            tune_for_serving()

    try:
        runners = run_event_loop(run_standalone(pipeline, bootstrap, config=config, instance_id=instance_id,
                                                session_timeout_ms=session_timeout_ms, on_started=started))
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [r.failed for r in runners if r.failed is not None]
    if failed:
        print(f"error: processor failed: {failed[0]!r}", file=sys.stderr)
        return 1
    return 0
