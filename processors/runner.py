"""The async runner: source → operators → sink with bounded queues, checkpoints and status.

Three tasks and two bounded queues::

    fetch ──in_q (≤ queue_batches)──▶ process (Executor) ──out_q (≤ queue_batches)──▶ sink
    tick (clock) ──────▲

A slow sink fills ``out_q``, which blocks ``process``, which fills ``in_q``, which blocks
``fetch``: nothing is read from the log faster than results can be written, so a burst waits in
the log, not in memory (at most ``2·queue_batches·max_batch_records`` records are in flight).

Checkpoints are taken in ``process`` between batches (state encoded at once, so it is consistent)
and travel through ``out_q`` behind the outputs they cover; ``sink`` flushes those outputs first,
then stores the checkpoint and commits the offsets (exactly-once: the checkpoint, the offsets and the
outputs before them commit as one transaction, see ``processors.kafka``). Rebalances (standalone
mode) use the same path: a revoke waits until a checkpoint of the revoked partitions is stored, then drops their state.

Lost partitions (exactly-once, standalone): when the group has given this member's partitions to
others (it stalled past its session timeout; they restore from the last committed checkpoint), nothing
processed since that checkpoint may be committed. Either the source reports them lost (``on_lost``)
or the group refuses the interval's commit (``PartitionsLostError``); then ``process`` drops the state
of every partition (the open transaction holds results of all of them) and sends a reset through
``out_q``, ``sink`` aborts the transaction and discards every item before the reset, and the next
assignment restores from the committed checkpoints, as Kafka Streams closes lost tasks dirty.

A rebalance during ``stop`` (another member joining or leaving): the revoke (or lost) listener waits
for stop's final checkpoint before it returns, as Kafka's consumers run ``onPartitionsRevoked``, its
commit included, before they rejoin. It returned at once, so the consumer rejoined while the final
commit was still on its way: it named a generation the group had left (ILLEGAL_GENERATION, the
interval aborted), or the new one, and then committed the offsets of the partitions of the new
assignment only, with a checkpoint of them all. An assignment that reaches a stopping runner is not
restored: nothing will read it, and the member leaves the group once its consumer stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from processors.checkpoint import (
    CheckpointRecord,
    CheckpointStore,
    PartitionRestore,
    restore_executor,
    take_checkpoint,
)
from processors.errors import PartitionsLostError, PipelineDefinitionError, ProcessorError
from processors.executor import Executor, KeyedStateFactory, TopicPartition, output_records
from processors.fastdecode import Fetched, StoredRecords, first_offset, next_offset
from processors.pipeline import Pipeline
from processors.sources import Sink, Source
from processors.time import NO_TIME, Clock, SystemClock

__all__ = ["AT_LEAST_ONCE", "EXACTLY_ONCE", "GUARANTEES", "Guarantee", "Runner", "RunnerConfig"]

log = logging.getLogger("processors.runner")


Guarantee = Literal["at-least-once", "exactly-once"]
AT_LEAST_ONCE: Guarantee = "at-least-once"
EXACTLY_ONCE: Guarantee = "exactly-once"
GUARANTEES: tuple[Guarantee, ...] = (AT_LEAST_ONCE, EXACTLY_ONCE)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    # at-least-once: outputs are flushed before the checkpoint, a crash replays (and may repeat) them.
    # exactly-once (standalone only): outputs, checkpoint and offsets of an interval in one transaction.
    guarantee: Guarantee = AT_LEAST_ONCE
    max_batch_records: int = 2_000
    # deep enough to cover a fetch round trip: aiokafka asks for a partition again only once its buffered
    # records are used up (4 -> 16: standalone throughput +35-45 %, bench/RESULTS.md "Per-record kernels")
    queue_batches: int = 16
    tick_ms: int = 200
    checkpoint_interval_ms: int = 10_000
    fetch_timeout_s: float = 0.5
    stop_timeout_s: float = 30.0  # how long stop() waits for the final checkpoint
    # at most this many keys' state live in memory per keyed operator, the rest spilled to RocksDB
    # under state_dir (processors.state_store); None: all in memory
    state_max_keys: int | None = None
    state_dir: str | None = None


def keyed_state_factory(config: RunnerConfig, name: str) -> KeyedStateFactory | None:
    """The spill store of the keyed operators of pipeline (or stage) ``name`` under ``config``'s bound
    (None: every key in memory)."""
    if config.state_max_keys is None:
        return None
    from processors.state_store import spilling_factory  # rocksdict only when asked for

    base = Path(config.state_dir) if config.state_dir else Path(tempfile.gettempdir()) / "sluice-state"
    return spilling_factory(config.state_max_keys, base / name)


class Runner:
    def __init__(
        self,
        pipeline: Pipeline,
        source: Source,
        sink: Sink,
        checkpoints: CheckpointStore,
        *,
        clock: Clock | None = None,
        config: RunnerConfig | None = None,
        name: str | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.source = source
        self.sink = sink
        self.checkpoints = checkpoints
        self.clock = clock or SystemClock()
        self.config = config or RunnerConfig()
        self.name = name or f"processor:{pipeline.name}"
        # a given executor: a subclass for one stage of a repartitioned pipeline (processors.repartition)
        self.executor = executor or Executor(pipeline, self.clock.now_ms(),
                                             keyed_state=keyed_state_factory(self.config, pipeline.name))
        self.positions: dict[TopicPartition, int] = {}
        self.in_q: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue(self.config.queue_batches)
        self.out_q: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue(self.config.queue_batches)
        self._tasks: list[asyncio.Task[None]] = []
        self._last_cp = self.clock.now_ms()
        self._last_progress: tuple[Any, ...] = ()
        self._known: set[TopicPartition] = set()  # assigned, and the processor has been told so
        self._pending: set[TopicPartition] = set()  # being assigned (checkpoint loading)
        # Per partition, a generation bumped when it is revoked or positioned by an assignment: a
        # batch fetched (or queued) under an older one may predate that and is dropped; the
        # assignment's seek (``_target``) reads it again. ``_held``: first offset held back while
        # the partition's assignment was loading its checkpoint.
        self._gen: dict[TopicPartition, int] = {}
        self._target: dict[TopicPartition, int] = {}
        self._held: dict[TopicPartition, int] = {}
        self._assigned = asyncio.Event()
        self._revokes: set[asyncio.Future[None]] = set()
        self._stopping = False
        # stop(): resolved once its final checkpoint is stored and committed, or given up (see _hand_back)
        self._final_checkpoint: asyncio.Future[None] | None = None
        # set by sink when the group refused a commit (the reason): process drops all state before its next item
        self._lost_pending: str | None = None
        self._discarding = False  # sink: skip everything until process's reset arrives
        self.partitions_lost = 0
        self.checkpoints_written = 0
        self.last_checkpoint_ms: int | None = None
        self.records_out = 0
        self._outputs_taken = 0
        self.max_in_q = 0
        self.max_out_q = 0
        self.failed: BaseException | None = None
        self.stopped = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._guard(self._process_loop()), name=f"{self.name}:process"),
            asyncio.create_task(self._guard(self._sink_loop()), name=f"{self.name}:sink"),
        ]
        await self.source.start(self._on_assigned, self._on_revoked, self._on_lost)
        self._tasks += [
            asyncio.create_task(self._guard(self._fetch_loop()), name=f"{self.name}:fetch"),
            asyncio.create_task(self._guard(self._tick_loop()), name=f"{self.name}:tick"),
        ]
        log.info("processor started", extra={"pipeline": self.pipeline.name, "partitions": len(self.positions)})

    async def stop(self, *, checkpoint: bool = True) -> None:
        """Stop reading; with ``checkpoint`` write a final checkpoint of everything processed."""
        self._stopping = True
        # before the first await: a rebalance listener called from here on waits for it (_hand_back)
        final = self._final_checkpoint = asyncio.get_running_loop().create_future()
        try:
            await self._write_final_checkpoint(checkpoint)
        finally:
            final.set_result(None)
        for task in self._tasks[:2]:
            await _cancelled(task)
        for waiting in self._revokes:  # a rebalance listener must not wait for loops that are gone
            if not waiting.done():
                waiting.set_result(None)
        await self.source.stop()
        state = self.state_status()
        self.executor.close()
        self.stopped.set()
        log.info("processor stopped",
                 extra={"pipeline": self.pipeline.name, **{f"state_{k}": v for k, v in state.items()}})

    async def _write_final_checkpoint(self, checkpoint: bool) -> None:
        for task in self._tasks[2:]:  # the fetchers
            await _cancelled(task)
        if not (checkpoint and self.failed is None and self._tasks and not self._tasks[0].done()):
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.in_q.put(("checkpoint", None, done)), self.config.stop_timeout_s)
            await asyncio.wait_for(done, self.config.stop_timeout_s)
        if self._lost_pending is not None:  # else only logged when the process loop goes on: never now
            log.warning("the final checkpoint was refused: results since the last committed checkpoint "
                        "are recomputed by the partitions' next owner",
                        extra={"pipeline": self.pipeline.name, "reason": self._lost_pending})

    def state_status(self) -> dict[str, int]:
        """Keyed state over every keyed operator: keys, keys in memory, spills and loads (spill store)."""
        out = {"keys": 0, "keys_in_memory": 0, "spilled": 0, "loaded": 0}
        for node in self.executor.keyed.values():
            logics = node.rt.logics
            out["keys"] += len(logics)
            out["keys_in_memory"] += int(getattr(logics, "in_memory", len(logics)))
            out["spilled"] += int(getattr(logics, "spilled", 0))
            out["loaded"] += int(getattr(logics, "loaded", 0))
        return out

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        if isinstance(exc, PipelineDefinitionError):  # the user's pipeline, not a defect: the reason, no traceback
            log.error(f"processor failed: {exc}", extra={"pipeline": self.pipeline.name})
        else:
            log.exception("processor failed", extra={"pipeline": self.pipeline.name})
        self.stopped.set()

    # -- assignment -----------------------------------------------------------------------------

    async def _on_assigned(self, tps: list[TopicPartition]) -> None:
        if self._stopping:  # a rebalance during stop: nothing reads them, their next owner restores them
            return
        try:
            await self._assign_partitions(tps)
        except Exception as exc:
            # A consumer logs a rebalance listener's exception and goes on as the partitions' owner
            # (aiokafka does): they stayed pending, nothing of them read or committed, and the processor
            # hung for good (a broker killed while the checkpoints loaded). It fails instead, and its
            # supervisor restarts it from the committed checkpoints.
            self._fail(exc)
            raise

    async def _assign_partitions(self, tps: list[TopicPartition]) -> None:
        self._pending.update(tps)  # before any await: the fetcher must not pass their data on yet
        self._assigned.clear()
        restores = await self.checkpoints.load(tps)
        await self.in_q.put(("assign", [(tp, restores.get(tp)) for tp in tps], None))
        # from here to the end no await: the fetcher sees these partitions pending, or positioned
        for tp in tps:
            r = restores.get(tp)
            held = self._held.pop(tp, None)
            target = r.offset if r is not None and r.offset >= 0 else held
            if target is not None:  # the checkpoint's offset, else the first record held back
                self._gen[tp] = self._gen.get(tp, 0) + 1
                self._target[tp] = target
                self.source.seek(tp, target)
        self._pending.difference_update(tps)
        self._known.update(tps)
        self._assigned.set()

    async def _on_revoked(self, tps: list[TopicPartition]) -> None:
        await self._hand_back("revoke", tps)  # resolved once their checkpoint is stored (or by stop())

    async def _on_lost(self, tps: list[TopicPartition]) -> None:
        await self._hand_back("lost", tps)  # resolved once every state is dropped and the transaction aborted

    async def _hand_back(self, kind: str, tps: list[TopicPartition]) -> None:
        self._known.difference_update(tps)
        for tp in tps:
            self._gen[tp] = self._gen.get(tp, 0) + 1
            self._target.pop(tp, None)
        final = self._final_checkpoint
        if tps and final is not None and not final.done():
            # Stopping: the final checkpoint covers these partitions, and the consumer rejoins as soon as
            # this returns. Committed now, it names the generation the group is rebalancing from, which
            # the group accepts until every member has rejoined (lost: the member has none, so it aborts)
            log.info("a rebalance reached the stopping processor: its consumer rejoins once the final "
                     "checkpoint is committed", extra={"pipeline": self.pipeline.name, "kind": kind,
                                                       "partitions": tps})
            await asyncio.shield(final)
            return
        if not tps or self._stopping or self._tasks[0].done():
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._revokes.add(done)
        put = asyncio.ensure_future(self.in_q.put((kind, tps, done)))
        try:
            await done
        finally:
            if not put.done():
                put.cancel()
            self._revokes.discard(done)

    # -- loops ------------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        cfg = self.config
        while True:
            paused = {tp for tp in self.executor.tracker.paused(self.clock.now_ms()) if isinstance(tp, tuple)}
            before = dict(self._gen)
            batches = await self.source.fetch(cfg.max_batch_records, cfg.fetch_timeout_s, paused)
            gens = [self._gen.get(tp, 0) for tp, _ in batches]  # now, before the puts below yield
            held_back = False
            for (tp, records), gen in zip(batches, gens, strict=True):
                if not records:
                    continue
                if gen != before.get(tp, 0):
                    # revoked or repositioned while this fetch was in flight: the records may come from
                    # before that. Read again from where the assignment put the partition (nowhere: from
                    # these records, none of which was processed under any checkpoint)
                    first = first_offset(records)
                    if tp in self._known:
                        self.source.seek(tp, self._target.get(tp, first))
                    elif tp in self._pending:
                        self._held[tp] = min(self._held.get(tp, first), first)
                        held_back = True
                    continue
                if tp in self._known:
                    await self.in_q.put(("data", tp, (gen, records)))
                    self.max_in_q = max(self.max_in_q, self.in_q.qsize())
                elif tp in self._pending:
                    # fetched before its assignment (and restore) reached the processor: the assignment
                    # seeks to its checkpoint, or back to the first record held back
                    first = first_offset(records)
                    self._held[tp] = min(self._held.get(tp, first), first)
                    held_back = True
            if held_back:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._assigned.wait(), cfg.fetch_timeout_s)

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.tick_ms / 1000)
            await self.in_q.put(("tick", None, None))

    async def _process_loop(self) -> None:
        ex = self.executor
        interval = self.config.checkpoint_interval_ms
        while True:
            kind, arg, done = await self.in_q.get()
            now = self.clock.now_ms()
            if self._lost_pending is not None or kind == "lost":  # before anything else, an assignment above all
                self._drop_everything(self._lost_pending or "the consumer found itself out of the group")
                self._lost_pending = None
                await self._put_out(("reset", None, done if kind == "lost" else None))
                if kind == "lost":
                    continue
            if kind == "data":
                tp, (epoch, records) = arg, done
                if epoch == self._gen.get(tp, 0):  # else fetched before a revoke or repositioning
                    self._process(tp, records, now)
            elif kind == "tick":
                ex.tick(now)
            elif kind == "assign":
                self._assign(arg, now)
            elif kind == "revoke":
                await self._put_out(("checkpoint", self._checkpoint(now, set(arg)), done))
                ex.drop_partitions(set(arg))
                for tp in arg:
                    self.positions.pop(tp, None)
                    self.checkpoints.codec.delta.forget(tp)
                continue
            elif kind == "checkpoint":
                await self._flush_outputs()
                await self._put_out(("checkpoint", self._checkpoint(now, None), done))
                continue
            await self._flush_outputs()
            if now - self._last_cp >= interval and self.positions:
                # outputs too: those written since the last checkpoint (an open transaction) get one
                progress = (ex.records_in, ex.watermark, tuple(self.positions.values()), self._outputs_taken)
                if progress != self._last_progress:  # nothing new since the last one: skip it
                    self._last_progress = progress
                    await self._put_out(("checkpoint", self._checkpoint(now, None), None))

    def _drop_everything(self, reason: str) -> None:
        """Lost partitions: the state of every partition goes, and outputs not yet taken with it."""
        self.partitions_lost += 1
        everything = set(self.positions)
        self.executor.take_outputs()
        self.executor.drop_partitions(everything)
        for tp in everything:
            self.positions.pop(tp, None)
            self.checkpoints.codec.delta.forget(tp)
        self._last_progress = ()
        log.warning("partitions lost to a group rebalance: their state since the last committed checkpoint "
                    "is dropped", extra={"pipeline": self.pipeline.name, "partitions": sorted(everything),
                                         "reason": reason, "partitions_lost": self.partitions_lost})

    def _process(self, tp: TopicPartition, records: Fetched, now: int) -> None:
        if tp not in self.positions or not records:
            return  # revoked while the batch was queued
        if isinstance(records, StoredRecords):
            self.executor.process_stored(tp, records, now)
        else:
            self.executor.process(tp, records, now)
        self.positions[tp] = next_offset(records)

    def _assign(self, entries: list[tuple[TopicPartition, PartitionRestore | None]], now: int) -> None:
        restore_executor(self.executor, entries, now)
        for tp, restore in entries:
            self.positions[tp] = -1 if restore is None else restore.offset  # -1: unknown until the first record
            # incremental checkpoints go on from the restored base and delta (none: the next is a base)
            self.checkpoints.codec.delta.adopt(tp, None if restore is None else restore.base,
                                               {} if restore is None else restore.touched)
        restored = {f"{tp[0]}/{tp[1]}": r.offset for tp, r in entries if r is not None}
        log.info("partitions assigned",
                 extra={"pipeline": self.pipeline.name, "partitions": [e[0] for e in entries], "restored": restored})

    async def _flush_outputs(self) -> None:
        outputs = self.executor.take_outputs()
        if outputs:
            self._outputs_taken += len(outputs)
            await self._put_out(("out", outputs, None))

    async def _put_out(self, item: tuple[Any, ...]) -> None:
        await self.out_q.put(item)
        self.max_out_q = max(self.max_out_q, self.out_q.qsize())

    def _checkpoint(self, now: int, tps: set[TopicPartition] | None
                    ) -> tuple[list[CheckpointRecord], dict[TopicPartition, int]]:
        """Encode the state now (between batches, so it is consistent) for ``tps`` (None = all)."""
        self._last_cp = now
        # partitions with nothing read yet are listed too (offset -1): their time and idleness count
        chosen = {tp: off for tp, off in self.positions.items() if tps is None or tp in tps}
        cp = take_checkpoint(self.pipeline.name, self.executor, chosen, now, self.checkpoints.codec.delta)
        return self.checkpoints.codec.encode(cp), chosen

    async def _sink_loop(self) -> None:
        while True:
            kind, arg, done = await self.out_q.get()
            try:
                if kind == "reset":  # process has dropped the lost state: what follows is clean
                    self._discarding = False
                    await self.sink.abort()
                    if done is not None and not done.done():
                        done.set_result(None)
                elif self._discarding:  # results and checkpoints of lost state: never written
                    if done is not None and not done.done():
                        done.set_result(None)
                elif kind == "out":
                    await self.sink.write(arg)
                    self.records_out += output_records(arg)
                else:
                    data, offsets = arg
                    await self.sink.flush()
                    if offsets:
                        await self.checkpoints.save(data)
                    # exactly-once: this commits the interval's transaction (outputs and checkpoint with the
                    # offsets), so it runs even when there is no offset to commit
                    await self.source.commit({tp: off for tp, off in offsets.items() if off >= 0})
                    if offsets:
                        self.checkpoints_written += 1
                        self.last_checkpoint_ms = self.clock.now_ms()
                    if done is not None and not done.done():
                        done.set_result(None)
            except PartitionsLostError as exc:  # aborted already; process drops the state (and logs it)
                self._discarding = True
                self._lost_pending = f"the group refused this member's commit: {exc}"
                if done is not None and not done.done():
                    done.set_result(None)
                with contextlib.suppress(asyncio.QueueFull):
                    self.in_q.put_nowait(("tick", None, None))  # wake process (a tick changes nothing)
            except ProcessorError as exc:
                if done is not None and not done.done():
                    done.set_exception(exc)
                raise

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """JSON-ready: per-partition offset lag and event-time lag, queue sizes, counters."""
        now = self.clock.now_ms()
        ex = self.executor
        parts = []
        for tp, pos in sorted(self.positions.items()):
            pw = ex.tracker.partitions.get(tp)
            end = self.source.end_offset(tp)
            wm = pw.watermark if pw is not None else NO_TIME
            parts.append({
                "topic": tp[0],
                "partition": tp[1],
                "position": pos if pos >= 0 else None,
                "end_offset": end,
                "offset_lag": None if end is None else max(end - max(pos, 0), 0),
                "watermark": None if wm == NO_TIME else wm,
                "event_time_lag_ms": None if wm == NO_TIME else now - wm,
                "idle": bool(pw is not None and pw.idle(now)),
            })
        wm = ex.watermark
        lags = [p["offset_lag"] for p in parts if p["offset_lag"] is not None]
        return {
            "name": self.pipeline.name,
            "pipeline": self.pipeline.name,
            "running": bool(self._tasks) and not self.stopped.is_set(),
            "failed": repr(self.failed) if self.failed else None,
            "watermark": None if wm == NO_TIME else wm,
            "event_time_lag_ms": None if wm == NO_TIME else now - wm,
            "partitions": parts,
            "offset_lag": sum(lags),
            "records_in": ex.records_in,
            "records_out": self.records_out,
            "late_records": ex.late_count,
            "partitions_lost": self.partitions_lost,
            "dead_letters": ex.dead_letters,
            "queues": {"in": self.in_q.qsize(), "out": self.out_q.qsize(), "max": self.config.queue_batches,
                       "max_in_seen": self.max_in_q, "max_out_seen": self.max_out_q},
            "state": self.state_status(),
            "checkpoints": {"written": self.checkpoints_written, "last_ms": self.last_checkpoint_ms,
                            "interval_ms": self.config.checkpoint_interval_ms},
        }


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again while it goes on: a cancellation
    can be swallowed. Python 3.11's ``asyncio.wait_for`` returns its future's result instead of raising
    when the cancellation arrives as that future completes (the attached source's ``wait_for_data``
    waits so): the fetch loop went on, and ``stop`` waited for it forever (seen in bench_processors)."""
    while not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # as before: stop() itself is not cut short
            await asyncio.wait([task], timeout=0.5)
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()  # retrieved (the runner's _guard has recorded and logged any failure)
