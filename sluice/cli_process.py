"""``sluice process module:pipeline --bootstrap host:port``: a standalone processor."""

from __future__ import annotations

import asyncio
import sys

from processors.errors import ProcessorError
from processors.hosting import run_standalone
from processors.runner import GUARANTEES, RunnerConfig
from sluice.components.processors import load_pipeline

__all__ = ["run_process"]


def run_process(ref: str, bootstrap: str, checkpoint_interval_s: float, session_timeout_ms: int = 10_000, *,
                guarantee: str = "at-least-once", instance_id: str | None = None,
                state_max_keys: int | None = None, state_dir: str | None = None) -> int:
    """Exit code: 0 after a clean stop, 1 when the processor failed, 2 for a bad pipeline reference
    or option."""
    chosen = next((g for g in GUARANTEES if g == guarantee), None)
    if chosen is None:
        print(f"error: --guarantee must be one of {', '.join(GUARANTEES)}, not {guarantee!r}", file=sys.stderr)
        return 2
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # `module:attr` resolves against the working directory, like uvicorn
    try:
        pipeline = load_pipeline(ref)
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = RunnerConfig(guarantee=chosen, checkpoint_interval_ms=round(checkpoint_interval_s * 1000),
                          state_max_keys=state_max_keys, state_dir=state_dir)
    try:
        runners = asyncio.run(run_standalone(pipeline, bootstrap, config=config, session_timeout_ms=session_timeout_ms,
                                            instance_id=instance_id))
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [r.failed for r in runners if r.failed is not None]
    if failed:
        print(f"error: processor failed: {failed[0]!r}", file=sys.stderr)
        return 1
    return 0
