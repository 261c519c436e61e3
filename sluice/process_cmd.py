"""``sluice process module:pipeline --bootstrap host:port``: a standalone processor."""

from __future__ import annotations

import asyncio
import sys

from processors.errors import ProcessorError
from processors.runner import RunnerConfig
from processors.runners import load_pipeline, run_standalone

__all__ = ["run_process"]


def run_process(ref: str, bootstrap: str, checkpoint_interval_s: float, session_timeout_ms: int = 10_000) -> int:
    """Exit code: 0 after a clean stop, 1 when the processor failed, 2 for a bad pipeline reference."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # `module:attr` resolves against the working directory, like uvicorn
    try:
        pipeline = load_pipeline(ref)
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = RunnerConfig(checkpoint_interval_ms=round(checkpoint_interval_s * 1000))
    try:
        runner = asyncio.run(run_standalone(pipeline, bootstrap, config=config, session_timeout_ms=session_timeout_ms))
    except ProcessorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if runner.failed is not None:
        print(f"error: processor failed: {runner.failed!r}", file=sys.stderr)
        return 1
    return 0
