"""Where a pipeline's Runner (``processors.runner``) gets its source, sink and checkpoints.

* ``AttachedRunner`` reads every partition of the source topics straight from the in-process
  ``LogStore``, appends results through it, and checkpoints to ``_checkpoints.<pipeline>`` in the
  same store (``sluice.components.processors`` holds one per ``--processor`` in ``sluice serve``).
* ``run_standalone`` (``sluice process module:pipeline --bootstrap host:port``) runs the same
  pipeline as a member of the consumer group ``pipeline.name`` over the Kafka protocol
  (``processors.kafka``); start more instances to split the partitions. With
  ``guarantee="exactly-once"`` its producer is transactional with ``transactional.id``
  ``<pipeline>-<instance id>`` (``--instance-id``, default the host name): two instances of one
  pipeline must have different instance ids, and a restarted instance must keep its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable

from broker.log.api import LogStore
from processors.checkpoint import LogCheckpointStore
from processors.errors import PipelineDefinitionError
from processors.pipeline import Pipeline
from processors.runner import EXACTLY_ONCE, Runner, RunnerConfig
from processors.sources import LogSink, LogSource
from processors.time import Clock

__all__ = ["AttachedRunner", "run_standalone", "transactional_id"]

log = logging.getLogger("processors.hosting")


class AttachedRunner(Runner):
    """A pipeline reading partitions of an in-process store."""

    def __init__(self, pipeline: Pipeline, store: LogStore, *, clock: Clock | None = None,
                 config: RunnerConfig | None = None) -> None:
        if config is not None and config.guarantee == EXACTLY_ONCE:
            raise PipelineDefinitionError(
                f"pipeline {pipeline.name!r}: exactly-once is not available for attached processors yet; "
                "run it standalone (sluice process --guarantee exactly-once)")
        source = LogSource(store, pipeline.source_config.topics)
        super().__init__(pipeline, source, LogSink(store), LogCheckpointStore(store, pipeline.name),
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
) -> Runner:
    """Run ``pipeline`` as a consumer-group member until ``stop`` is set or SIGINT/SIGTERM."""
    from processors.kafka import KafkaCheckpointStore, KafkaSink, KafkaSource

    config = config or RunnerConfig()
    exactly_once = config.guarantee == EXACTLY_ONCE
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    txn_id = transactional_id(pipeline, instance_id) if exactly_once else None
    # a transaction spans one checkpoint interval: its timeout leaves room for a slow commit
    txn_timeout_ms = min(max(60_000, 3 * config.checkpoint_interval_ms), 900_000)
    sink = KafkaSink(bootstrap, client_id=client_id, transactional_id=txn_id, transaction_timeout_ms=txn_timeout_ms)
    await sink.start()  # exactly-once: fences this instance's predecessor, aborting its open transaction
    await sink.track(pipeline.sink_topics())
    source = KafkaSource(bootstrap, pipeline.source_config.topics, pipeline.name, client_id=client_id,
                         session_timeout_ms=session_timeout_ms, transactions=sink if exactly_once else None)
    checkpoints = KafkaCheckpointStore(bootstrap, pipeline.name, sink)
    runner = Runner(pipeline, source, sink, checkpoints, config=config)
    try:
        await runner.start()
        if on_started is not None:
            on_started(runner)
        stopped = asyncio.ensure_future(runner.stopped.wait())
        asked = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopped, asked], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        asked.cancel()
    finally:
        await runner.stop()  # its final checkpoint commits the open transaction
        await sink.abort()  # left open only when the runner failed: its outputs must not be committed
        await sink.stop()
    return runner
