"""The Kafka listener: asyncio sockets around the sans-IO codec in ``broker.protocol.kafka``.

Per connection, a reader task decodes frames and dispatches requests one after another (Kafka's
ordering: a request is handled only after the previous one was dispatched), and a writer task
sends the responses in request order. Produce appends synchronously at dispatch and waits for
durability in the writer, so pipelined produces keep their order and share fsyncs.

Extra listeners (``KafkaServerConfig.extra_listeners``) bind more ports serving the same broker; a
connection is told (in Metadata and FindCoordinator) the advertised address of the listener it came in
on — e.g. ``localhost:9092`` for clients on the host and ``sluice:29092`` inside a compose network.

Bad input never takes the broker down: a negative or oversized length, a truncated frame at EOF or
an undecodable request closes that connection with a WARNING; an unknown API key or version is
answered UNSUPPORTED_VERSION and the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.log.api import LogStore
from broker.protocol.kafka import (
    ApiKey,
    FrameDecoder,
    FrameError,
    MalformedRequestError,
    Request,
    RequestHeader,
    UnsupportedRequestError,
    decode_request,
    encode_response_parts,
    encode_unsupported_version,
)
from broker.protocol.kafka_codes import ErrorCode
from broker.server import handlers_admin as admin
from broker.server import handlers_configs as configs
from broker.server import handlers_fetch as fetching
from broker.server import handlers_groups as groups
from broker.server import handlers_produce as producing
from broker.server.handlers_common import DEFAULT_LISTENER, BrokerContext, ConnectionInfo

__all__ = ["KafkaListenerConfig", "KafkaServer", "KafkaServerConfig", "handle_request"]

log = logging.getLogger("broker.server.kafka")

_READ_CHUNK = 256 * 1024
_PIPELINE_DEPTH = 64  # responses queued per connection before reading pauses (backpressure)

Handler = Callable[[BrokerContext, RequestHeader, Any, ConnectionInfo], Awaitable[Any]]

_HANDLERS: dict[int, Handler] = {
    ApiKey.FETCH: lambda c, h, b, n: fetching.handle_fetch(c, b, n),
    ApiKey.LIST_OFFSETS: lambda c, h, b, n: fetching.handle_list_offsets(c, b, n),
    ApiKey.METADATA: lambda c, h, b, n: admin.handle_metadata(c, b, n, h.api_version),
    ApiKey.OFFSET_COMMIT: lambda c, h, b, n: groups.handle_offset_commit(c, b, n),
    ApiKey.OFFSET_FETCH: lambda c, h, b, n: groups.handle_offset_fetch(c, b, n),
    ApiKey.FIND_COORDINATOR: lambda c, h, b, n: groups.handle_find_coordinator(c, b, n),
    ApiKey.JOIN_GROUP: lambda c, h, b, n: groups.handle_join_group(c, b, n, h.api_version, h.client_id),
    ApiKey.HEARTBEAT: lambda c, h, b, n: groups.handle_heartbeat(c, b, n),
    ApiKey.LEAVE_GROUP: lambda c, h, b, n: groups.handle_leave_group(c, b, n, h.api_version),
    ApiKey.SYNC_GROUP: lambda c, h, b, n: groups.handle_sync_group(c, b, n),
    ApiKey.DESCRIBE_GROUPS: lambda c, h, b, n: groups.handle_describe_groups(c, b, n),
    ApiKey.LIST_GROUPS: lambda c, h, b, n: groups.handle_list_groups(c, b, n),
    ApiKey.API_VERSIONS: lambda c, h, b, n: admin.handle_api_versions(c, b, n),
    ApiKey.CREATE_TOPICS: lambda c, h, b, n: admin.handle_create_topics(c, b, n),
    ApiKey.DELETE_TOPICS: lambda c, h, b, n: admin.handle_delete_topics(c, b, n),
    ApiKey.INIT_PRODUCER_ID: lambda c, h, b, n: producing.handle_init_producer_id(c, b, n),
    ApiKey.DESCRIBE_CONFIGS: lambda c, h, b, n: configs.handle_describe_configs(c, b, n),
    ApiKey.ALTER_CONFIGS: lambda c, h, b, n: configs.handle_alter_configs(c, b, n),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: lambda c, h, b, n: configs.handle_incremental_alter_configs(c, b, n),
}


async def handle_request(ctx: BrokerContext, request: Request, conn: ConnectionInfo) -> Any:
    """The response body for a decoded request (None: no response, acks=0); no sockets involved."""
    header = request.header
    if header.api_key == ApiKey.PRODUCE:
        return await producing.handle_produce(ctx, request.body, conn)
    return await _HANDLERS[header.api_key](ctx, header, request.body, conn)


@dataclass(frozen=True, slots=True)
class KafkaListenerConfig:
    """One more port serving the same broker, with the address clients arriving on it are told."""

    name: str
    port: int
    host: str | None = None  # default: the main listener's bind host
    advertised_host: str | None = None  # default: the bind host
    advertised_port: int | None = None  # default: the bound port


@dataclass(frozen=True, slots=True)
class KafkaServerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None  # default: the bind host
    advertised_port: int | None = None  # default: the bound port
    max_request_bytes: int = 100 * 1024 * 1024
    extra_listeners: tuple[KafkaListenerConfig, ...] = ()

    def __post_init__(self) -> None:
        names = [DEFAULT_LISTENER, *(extra.name for extra in self.extra_listeners)]
        if len(set(names)) != len(names):
            raise ValueError(f"Kafka listener names must be unique and not {DEFAULT_LISTENER!r}: {names[1:]}")


class _CloseConnection(Exception):
    """Internal: stop serving this connection (already logged)."""


class KafkaServer:
    """Serves the Kafka protocol for one LogStore and one group coordinator."""

    def __init__(self, store: LogStore, coordinator: Any, config: KafkaServerConfig) -> None:
        self.config = config
        self.ctx = BrokerContext(store, coordinator, config.advertised_host or config.host,
                                 config.advertised_port or config.port)
        self.stats = self.ctx.stats  # plain counters, read at scrape time (broker.server.stats)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.port = config.port
        self.listener_ports: dict[str, int] = {}  # extra listener name -> bound port

    async def start(self) -> None:
        try:
            main = await asyncio.start_server(self._on_connect, self.config.host, self.config.port)
            self._servers.append(main)
            self.port = main.sockets[0].getsockname()[1]
            if self.config.advertised_port is None:
                self.ctx.advertised_port = self.port
            for extra in self.config.extra_listeners:
                host = extra.host or self.config.host
                server = await asyncio.start_server(
                    functools.partial(self._on_connect, listener=extra.name), host, extra.port)
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                self.listener_ports[extra.name] = port
                self.ctx.listener_addresses[extra.name] = (extra.advertised_host or host, extra.advertised_port or port)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers = []

    # -- connections ------------------------------------------------------------------------

    async def _on_connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener: str = DEFAULT_LISTENER
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername") or ("?", 0)
        conn = ConnectionInfo(str(peer[0]), int(peer[1]), listener)
        self.stats.connected(listener)
        queue: asyncio.Queue[tuple[RequestHeader | None, Any]] = asyncio.Queue(_PIPELINE_DEPTH)
        sender = asyncio.create_task(self._send_loop(queue, writer, conn))
        cancelled = False
        try:
            await self._receive_loop(reader, queue, conn)
        except (_CloseConnection, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            cancelled = True  # server stopping: the connection ends here (not re-raised: nobody awaits it)
        except Exception:
            log.exception("Kafka connection failed; closing it", extra={"peer": conn.peer_host})
        finally:
            if cancelled:
                sender.cancel()
            else:
                try:
                    await queue.put((None, None))  # let queued responses go out, then stop
                    await asyncio.wait_for(sender, 30)
                except (Exception, asyncio.CancelledError):
                    sender.cancel()
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()
            self._connections.discard(task)
            self.stats.disconnected(listener)

    async def _receive_loop(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[RequestHeader | None, Any]],
        conn: ConnectionInfo,
    ) -> None:
        decoder = FrameDecoder(self.config.max_request_bytes)
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                if decoder.pending_bytes:
                    log.warning("closing Kafka connection: truncated frame at end of stream",
                                extra={"peer": conn.peer_host, "pending_bytes": decoder.pending_bytes})
                return
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                self.stats.closed_bad_input += 1
                log.warning(f"closing Kafka connection: {exc}", extra={"peer": conn.peer_host})
                raise _CloseConnection from exc
            for frame in frames:
                await queue.put(await self._dispatch(frame, conn))

    async def _dispatch(self, frame: bytes, conn: ConnectionInfo) -> tuple[RequestHeader | None, Any]:
        try:
            request = decode_request(frame)
        except UnsupportedRequestError as exc:
            self.stats.request(exc.api_key)
            self.stats.error(ErrorCode.UNSUPPORTED_VERSION)
            log.warning(f"answering UNSUPPORTED_VERSION: {exc}",
                        extra={"peer": conn.peer_host, "api_key": exc.api_key, "api_version": exc.api_version})
            return None, encode_unsupported_version(exc.api_key, exc.api_version, exc.correlation_id)
        except MalformedRequestError as exc:
            self.stats.closed_bad_input += 1
            log.warning(f"closing Kafka connection: {exc}", extra={"peer": conn.peer_host})
            raise _CloseConnection from exc
        header, body = request.header, request.body
        self.stats.request(header.api_key)
        if header.api_key == ApiKey.PRODUCE:
            return header, producing.handle_produce(self.ctx, body, conn)
        return header, await _HANDLERS[header.api_key](self.ctx, header, body, conn)

    async def _send_loop(
        self, queue: asyncio.Queue[tuple[RequestHeader | None, Any]], writer: asyncio.StreamWriter,
        conn: ConnectionInfo,
    ) -> None:
        while True:
            header, item = await queue.get()
            if header is None and item is None:
                return
            if inspect.isawaitable(item):
                item = await item
            if item is None:
                continue  # acks=0
            if header is None:
                writer.write(item)
            else:
                self.stats.count_response(item)
                writer.writelines(encode_response_parts(header, item))
            if writer.transport.get_write_buffer_size() > 4 * 1024 * 1024 or queue.empty():
                await writer.drain()
