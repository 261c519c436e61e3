"""Blocking ``Producer``, ``Consumer`` and ``Admin`` for scripts and threads: the async classes driven on
one background event loop thread that the library owns (started on first use, a daemon)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from clients._kafka import DEFAULT_BOOTSTRAP
from clients.admin import AsyncAdmin, GroupDescription, TopicDescription
from clients.consumer import AsyncConsumer
from clients.producer import AsyncProducer, Headers
from clients.records import ConsumerRecord, PartitionLag, RecordMetadata, TopicPartition

__all__ = ["Admin", "Consumer", "Producer"]

T = TypeVar("T")


class _LoopThread:
    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sluice-client-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop


def _run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _LoopThread.loop()).result(timeout)


def _build(factory: Any, *args: Any, **kwargs: Any) -> Any:
    async def make() -> Any:  # aiokafka objects must be created on the loop that runs them
        return factory(*args, **kwargs)

    return _run(make())


class Producer:
    """Blocking producer: ``send`` returns the stored record's metadata."""

    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, **kwargs: Any) -> None:
        self._p: AsyncProducer = _build(AsyncProducer, bootstrap, **kwargs)
        _run(self._p.start())

    def send(
        self,
        topic: str,
        value: Any = None,
        *,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        return _run(
            self._p.send(topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms)
        )

    def send_many(self, topic: str, values: Iterable[Any], *, key: Any = None) -> list[RecordMetadata]:
        return _run(self._p.send_many(topic, list(values), key=key))

    def flush(self) -> None:
        _run(self._p.flush())

    def close(self) -> None:
        _run(self._p.stop())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """Blocking consumer: iterate it, or ``poll`` for batches."""

    def __init__(self, *topics: str, bootstrap: str = DEFAULT_BOOTSTRAP, **kwargs: Any) -> None:
        self._c: AsyncConsumer = _build(AsyncConsumer, *topics, bootstrap=bootstrap, **kwargs)
        _run(self._c.start())

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord[Any]]:
        return _run(self._c.getmany(timeout_ms, max_records))

    def __iter__(self) -> Iterator[ConsumerRecord[Any]]:
        while True:
            yield from self.poll()

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        _run(self._c.commit(offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        async def seek() -> None:
            self._c.seek(tp, offset)

        _run(seek())

    def seek_to_timestamp(self, timestamp_ms: int, tps: Iterable[TopicPartition] | None = None) -> None:
        _run(self._c.seek_to_timestamp(timestamp_ms, list(tps) if tps is not None else None))

    def wait_for_assignment(self, timeout: float = 30.0) -> set[TopicPartition]:
        return _run(self._c.wait_for_assignment(timeout))

    def assignment(self) -> set[TopicPartition]:
        return self._c.assignment()

    def pause(self, *tps: TopicPartition) -> None:
        async def pause() -> None:
            self._c.pause(*tps)

        _run(pause())

    def resume(self, *tps: TopicPartition) -> None:
        async def resume() -> None:
            self._c.resume(*tps)

        _run(resume())

    def close(self) -> None:
        _run(self._c.stop())

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Admin:
    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, **kwargs: Any) -> None:
        self._a: AsyncAdmin = _build(AsyncAdmin, bootstrap, **kwargs)
        _run(self._a.start())

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        _run(self._a.create_topic(name, partitions, config))

    def delete_topic(self, name: str) -> None:
        _run(self._a.delete_topic(name))

    def list_topics(self, *, internal: bool = False) -> list[str]:
        return _run(self._a.list_topics(internal=internal))

    def describe_topic(self, name: str) -> TopicDescription:
        return _run(self._a.describe_topic(name))

    def list_groups(self) -> list[str]:
        return _run(self._a.list_groups())

    def describe_group(self, group_id: str) -> GroupDescription:
        return _run(self._a.describe_group(group_id))

    def group_lag(self, group_id: str) -> list[PartitionLag]:
        return _run(self._a.group_lag(group_id))

    def close(self) -> None:
        _run(self._a.close())

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
