"""Attached stream processors as a ``sluice serve`` component (``--processor module:pipeline``).

``load_pipeline`` resolves a ``module:attribute`` reference (also used by ``sluice process``), looking in
the working directory first (a console script does not have it on ``sys.path``).
The component is published as ``runtime.registries["processors"]``; its ``status()`` is a JSON-ready
list with one dict per pipeline (per-partition offset lag and event-time lag, queues, checkpoints).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from broker.log.api import LogStore
from broker.txn.coordinator import TransactionCoordinator
from processors.errors import PipelineDefinitionError
from processors.hosting import AttachedRunner
from processors.pipeline import Pipeline, Stream
from processors.runner import RunnerConfig
from processors.time import Clock
from sluice.runtime import Runtime

__all__ = ["AttachedProcessors", "load_pipeline", "processors_component"]


def load_pipeline(ref: str | Pipeline | Stream) -> Pipeline:
    """``"module:attr"`` → the Pipeline (``attr`` may be a Pipeline, a Stream of one, or a
    function returning either)."""
    if isinstance(ref, Pipeline):
        return ref
    if isinstance(ref, Stream):
        return ref.pipeline
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise PipelineDefinitionError(f"processor reference {ref!r} must look like 'module:attribute'")
    if "" not in sys.path and "." not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, "")  # `module:attr` resolves against the working directory first, like uvicorn
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineDefinitionError(f"cannot import {module_name!r} for processor {ref!r}: {exc}") from exc
    obj: Any = getattr(module, attr, None)
    if obj is None:
        raise PipelineDefinitionError(f"module {module_name!r} has no attribute {attr!r}")
    if callable(obj) and not isinstance(obj, Pipeline | Stream):
        obj = obj()
    if isinstance(obj, Stream):
        obj = obj.pipeline
    if not isinstance(obj, Pipeline):
        raise PipelineDefinitionError(f"{ref!r} is a {type(obj).__name__}, not a Pipeline")
    obj.validate()
    return obj


class AttachedProcessors:
    """The ``sluice serve`` component: every ``--processor module:pipeline``, attached."""

    name = "processors"

    def __init__(self, store: LogStore, refs: list[str], *, clock: Clock | None = None,
                 config: RunnerConfig | None = None, transactions: TransactionCoordinator | None = None) -> None:
        self.store = store
        self.transactions = transactions
        self.refs = refs
        self.clock = clock
        self.config = config
        self.runners: list[AttachedRunner] = []

    async def start(self) -> None:
        for ref in self.refs:
            runner = AttachedRunner(load_pipeline(ref), self.store, clock=self.clock, config=self.config,
                                    transactions=self.transactions)
            await runner.start()
            self.runners.append(runner)

    async def stop(self) -> None:
        for runner in reversed(self.runners):
            await runner.stop()

    def status(self) -> list[dict[str, Any]]:
        """One JSON-ready status dict per pipeline (what ``GET /processors`` lists)."""
        return [r.status() for r in self.runners]


def processors_component(runtime: Runtime) -> AttachedProcessors | None:
    refs = runtime.settings.processors
    if not refs:
        return None
    settings = runtime.settings
    config = RunnerConfig(guarantee=settings.processor_guarantee,
                          checkpoint_interval_ms=settings.processor_checkpoint_interval_ms,
                          state_max_keys=settings.processor_state_max_keys,
                          state_dir=str(settings.data_dir / "processor-state"))
    transactions = runtime.registries.get("transactions")  # published by the Kafka component, built before
    component = AttachedProcessors(runtime.store, list(refs), config=config, transactions=transactions)
    runtime.registries["processors"] = component
    return component
