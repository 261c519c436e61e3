"""Where a pipeline's Runner (``processors.runner``) gets its source, sink and checkpoints.

* ``AttachedRunner`` reads every partition of the source topics straight from the in-process
  ``LogStore``, appends results through it, and checkpoints to ``_checkpoints.<pipeline>`` in the
  same store (``sluice.components.processors`` holds one per ``--processor`` in ``sluice serve``).
  With ``guarantee="exactly-once"`` each checkpoint interval is a transaction of the broker's own
  coordinator (``processors.attached_txn``).
* ``run_standalone`` (``sluice process module:pipeline --bootstrap host:port``) runs the same
  pipeline as a member of the consumer group ``pipeline.name`` over the Kafka protocol
  (``processors.kafka``); start more instances to split the partitions. With
  ``guarantee="exactly-once"`` its producer is transactional with ``transactional.id``
  ``<pipeline>-<instance id>`` (``--instance-id``, default the host name): two instances of one
  pipeline must have different instance ids, and a restarted instance must keep its own. A pipeline
  whose ``key_by`` repartitions runs as two stages, two groups and (exactly-once) two transactional
  ids, ``<group>-<instance id>`` and ``<group>.repartition.<n>-<instance id>`` (``processors.repartition``,
  ``processors.scaleout``). Attached runners never repartition: one node holds every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from broker.log.api import LogStore
from processors.attached_txn import (
    AttachedTransaction,
    TxnCheckpointStore,
    TxnLogSink,
    TxnLogSource,
    attached_transactional_id,
)
from processors.checkpoint import LogCheckpointStore
from processors.errors import PipelineDefinitionError
from processors.pipeline import Pipeline
from processors.runner import EXACTLY_ONCE, Runner, RunnerConfig
from processors.sources import LogSink, LogSource
from processors.time import Clock

if TYPE_CHECKING:
    from broker.txn.coordinator import TransactionCoordinator

__all__ = ["AttachedRunner", "run_standalone", "transactional_id"]

log = logging.getLogger("processors.hosting")


class AttachedRunner(Runner):
    """A pipeline reading partitions of an in-process store."""

    def __init__(self, pipeline: Pipeline, store: LogStore, *, clock: Clock | None = None,
                 config: RunnerConfig | None = None, transactions: TransactionCoordinator | None = None) -> None:
        topics = pipeline.source_config.topics
        if config is not None and config.guarantee == EXACTLY_ONCE:
            if transactions is None:
                raise PipelineDefinitionError(
                    f"pipeline {pipeline.name!r}: exactly-once for attached processors needs the broker's "
                    "transaction coordinator (the Kafka listener enabled)")
            # a transaction outliving a few intervals is a stuck runner: the coordinator aborts it
            timeout_ms = max(60_000, 6 * config.checkpoint_interval_ms)
            txn = AttachedTransaction(store, transactions, attached_transactional_id(pipeline.name),
                                      timeout_ms=timeout_ms)
            super().__init__(pipeline, TxnLogSource(store, topics, txn), TxnLogSink(txn),
                             TxnCheckpointStore(txn, pipeline.name), clock=clock, config=config)
            return
        super().__init__(pipeline, LogSource(store, topics), LogSink(store), LogCheckpointStore(store, pipeline.name),
                         clock=clock, config=config)


def transactional_id(pipeline: Pipeline, instance_id: str | None) -> str:
    """``<pipeline>-<instance id>``: the same across restarts of one instance (its InitProducerId
    fences the predecessor and aborts what it left open), different between instances."""
    return f"{pipeline.name}-{instance_id or socket.gethostname()}"


async def run_standalone(
    pipeline: Pipeline,
    bootstrap: str,
    *,
    config: RunnerConfig | None = None,
    stop: asyncio.Event | None = None,
    client_id: str | None = None,
    session_timeout_ms: int = 10_000,
    instance_id: str | None = None,
    on_started: Callable[[Runner], None] | None = None,
) -> list[Runner]:
    """Run ``pipeline`` as a consumer-group member until ``stop`` is set, SIGINT/SIGTERM, or a stage
    fails. Returns its stages' runners: one, or two (upstream, downstream) when a ``key_by``
    repartitions (``processors.repartition``); ``on_started`` is called for each."""
    from processors.repartition import plan_shuffle
    from processors.scaleout import build_stages

    config = config or RunnerConfig()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    instance = instance_id or socket.gethostname()
    if config.state_max_keys is not None:  # instances on one host must not share a spill store
        base = Path(config.state_dir) if config.state_dir else Path(tempfile.gettempdir()) / "sluice-state"
        config = replace(config, state_dir=str(base / instance))
    stages = await build_stages(pipeline, plan_shuffle(pipeline), bootstrap, config, client_id=client_id,
                                session_timeout_ms=session_timeout_ms, instance_id=instance)
    runners = [stage.runner for stage in stages]
    try:
        for runner in reversed(runners):  # downstream first: it is ready when the first records arrive
            await runner.start()
        for stage in stages:  # their producers started beside the consumers' group joins: fail here if one did not
            await stage.sink.ready()
        for runner in runners:
            if on_started is not None:
                on_started(runner)
        waits = [asyncio.ensure_future(r.stopped.wait()) for r in runners] + [asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
    finally:
        # upstream first: its final checkpoint flushes (commits) what it wrote to the repartition topic
        for stage in stages:
            await stage.runner.stop()  # its final checkpoint commits the open transaction
            await stage.sink.abort()  # left open only when the runner failed: its outputs must not be committed
            await stage.sink.stop()
    return runners
