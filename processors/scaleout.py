"""Standalone stage runners over the Kafka protocol: one runner for a pipeline, two when a
``key_by`` repartitions (``processors.repartition``).

Each stage is a ``Runner`` with its own consumer group, producer, checkpoint topic and (exactly-once)
``transactional.id`` ``<stage group>-<instance id>``: the upstream stage's transaction holds the
repartition records, the marks, its checkpoint and the input offsets; the downstream stage's holds the
results, its checkpoint and the repartition offsets. Rebalances of either group move partitions with
their state (checkpoint on revoke, restore on assign), as for an unshuffled pipeline.

The repartition topic is created before the stages start, with the partition count the ``key_by``
asks for, else the most partitions of any input topic (Kafka Streams' rule); an existing one is used
with the partitions it has (every instance reads the same metadata, so all agree on the owner of a
key). Records the downstream stage has committed are deleted from it (DeleteRecords after each
commit, as Kafka Streams does: ``processors.purge``), so it holds about a checkpoint interval of data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from processors.errors import SourceError
from processors.executor import Executor
from processors.hosting import transactional_id
from processors.kafka import KafkaCheckpointStore, KafkaSink
from processors.kafka_source import KafkaSource
from processors.pipeline import Pipeline
from processors.purge import RepartitionPurger
from processors.repartition import ShufflePlan, ShuffleReader, ShuffleWriter
from processors.runner import EXACTLY_ONCE, Runner, RunnerConfig, keyed_state_factory
from processors.time import SystemClock

__all__ = ["Stage", "build_stages"]

_TOPIC_ALREADY_EXISTS = 36
log = logging.getLogger("processors.scaleout")


@dataclass
class Stage:
    runner: Runner
    sink: KafkaSink


async def _partition_count(sink: KafkaSink, topic: str) -> int:
    try:
        partitions = await sink.producer.partitions_for(topic)
    except KafkaError as exc:
        raise SourceError(f"cannot read the metadata of {topic}: {exc}") from exc
    return len(partitions)


async def _ensure_repartition_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        response = await admin.create_topics([NewTopic(topic, partitions, 1)])
    except KafkaError as exc:
        raise SourceError(f"cannot create the repartition topic {topic}: {exc}") from exc
    finally:
        await admin.close()
    for _name, code, *rest in getattr(response, "topic_errors", []):
        if code not in (0, _TOPIC_ALREADY_EXISTS):
            raise SourceError(f"cannot create the repartition topic {topic} (error {code}): {rest[0] if rest else ''}")


async def _stage(pipeline: Pipeline, bootstrap: str, config: RunnerConfig, txn_id: str | None, *,
                 client_id: str | None, session_timeout_ms: int, executor: Executor | None = None,
                 extra_topics: tuple[str, ...] = (), purge: frozenset[str] = frozenset(),
                 raw_batches: bool = False, stored_records: bool = False) -> Stage:
    exactly_once = config.guarantee == EXACTLY_ONCE
    # a transaction spans one checkpoint interval: its timeout leaves room for a slow commit
    txn_timeout_ms = min(max(60_000, 3 * config.checkpoint_interval_ms), 900_000)
    sink = KafkaSink(bootstrap, client_id=client_id, transactional_id=txn_id if exactly_once else None,
                     transaction_timeout_ms=txn_timeout_ms)
    # while the stage's consumer joins its group; exactly-once, it fences this instance's predecessor
    # (aborting its open transaction) before the checkpoint load, which waits for it (sink.ready)
    sink.start_in_background([*pipeline.sink_topics(), *extra_topics])
    try:
        source = KafkaSource(bootstrap, pipeline.source_config.topics, pipeline.name, client_id=client_id,
                             session_timeout_ms=session_timeout_ms, transactions=sink if exactly_once else None,
                             purger=RepartitionPurger(bootstrap, purge, client_id=client_id) if purge else None,
                             raw_batches=raw_batches, stored_records=stored_records)
        checkpoints = KafkaCheckpointStore(bootstrap, pipeline.name, sink)
        return Stage(Runner(pipeline, source, sink, checkpoints, config=config, executor=executor), sink)
    except BaseException:
        await sink.stop()
        raise


async def build_stages(pipeline: Pipeline, plan: ShufflePlan | None, bootstrap: str, config: RunnerConfig, *,
                       client_id: str | None, session_timeout_ms: int, instance_id: str) -> list[Stage]:
    """The stages of ``pipeline``, upstream first, not started (their producers are starting: ``sink.ready``
    waits for them). Exactly-once transactional ids: ``<stage pipeline name>-<instance_id>``
    (``hosting.transactional_id``)."""
    if plan is None:  # one stage, a plain Executor: fetched batches read in place (Executor.process_stored)
        return [await _stage(pipeline, bootstrap, config, transactional_id(pipeline, instance_id), client_id=client_id,
                             session_timeout_ms=session_timeout_ms, stored_records=True)]
    stages: list[Stage] = []
    try:
        now = SystemClock().now_ms()
        down = await _stage(plan.downstream, bootstrap, config, transactional_id(plan.downstream, instance_id),
                            client_id=client_id, session_timeout_ms=session_timeout_ms,
                            executor=ShuffleReader(plan.downstream, now,
                                                   keyed_state=keyed_state_factory(config, plan.downstream.name)),
                            purge=frozenset({plan.topic}), raw_batches=True)
        stages.append(down)
        await down.sink.ready()
        counts = {t: await _partition_count(down.sink, t) for t in plan.upstream.source_config.topics}
        await _ensure_repartition_topic(bootstrap, plan.topic, plan.partitions or max(counts.values()))
        partitions = await _partition_count(down.sink, plan.topic)
        writer = ShuffleWriter(plan.upstream, now, partitions=partitions, partition_counts=lambda: dict(counts),
                               keyed_state=keyed_state_factory(config, plan.upstream.name))
        up = await _stage(plan.upstream, bootstrap, config, transactional_id(plan.upstream, instance_id),
                          client_id=client_id, session_timeout_ms=session_timeout_ms, executor=writer,
                          extra_topics=(plan.topic,))
        stages.insert(0, up)
        log.info("repartitioned pipeline", extra={"pipeline": pipeline.name, "topic": plan.topic,
                                                  "partitions": partitions, "inputs": counts})
        return stages
    except BaseException:
        for stage in stages:
            await stage.sink.stop()
        raise
