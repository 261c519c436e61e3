"""Attached stream processors as a ``sluice serve`` component (``--processor module:pipeline``).

Published as ``runtime.registries["processors"]``; its ``status()`` is a JSON-ready list with one
dict per pipeline (per-partition offset lag and event-time lag, queues, checkpoints).
"""

from __future__ import annotations

from processors.runners import AttachedProcessors
from sluice.runtime import Runtime

__all__ = ["processors_component"]


def processors_component(runtime: Runtime) -> AttachedProcessors | None:
    refs = runtime.settings.processors
    if not refs:
        return None
    component = AttachedProcessors(runtime.store, list(refs))
    runtime.registries["processors"] = component
    return component
