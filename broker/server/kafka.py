"""The Kafka listener: asyncio sockets around the sans-IO codec in ``broker.protocol.kafka``.

Each accepted socket is served by a ``KafkaConnection`` (``kafka_connection.py``: reading, in-order
dispatch and answers, cancellation when the peer leaves, the idle timeout); this module owns the
listeners, the admission rules and the handler table.

Admission: a connection beyond ``max_connections`` (all listeners together) or beyond
``max_connections_per_address`` from one client address is closed at once, counted by reason, and
logged (WARNING; at most one line per reason every ``_REFUSAL_LOG_INTERVAL_S``, saying how many were
refused since the previous line). 0 means no limit.

Extra listeners (``KafkaServerConfig.extra_listeners``) bind more ports serving the same broker; a
connection is told (in Metadata and FindCoordinator) the advertised address of the listener it came in
on — e.g. ``localhost:9092`` for clients on the host and ``sluice:29092`` inside a compose network.

Authentication: with an ``Authenticator`` (``security.auth = "required"``) each connection must log in with
SASL (PLAIN, SCRAM-SHA-256/512) before any request but ApiVersions is served (``sasl_gate.py``); without
one, SaslHandshake and SaslAuthenticate are answered ILLEGAL_SASL_STATE, as by Kafka on a PLAINTEXT listener.
Authorization: with an ``Authorizer`` every request is checked against the ACLs before its handler runs, in
Kafka's order and codes (``authz.py``); without one everything is allowed.

TLS: with a server ``SSLContext`` (``security.tls_cert``) every listener of this server speaks TLS, so one port
is Kafka's ``SSL`` (auth off, or a client certificate) and ``SASL_SSL`` (SASL over TLS). A verified client
certificate makes the connection's principal its subject DN (``broker.security.tls``); a handshake that
fails (plaintext or garbage on the port, an untrusted certificate) closes the socket before any request,
logged at DEBUG by asyncio, never with a traceback.

Bad input never takes the broker down: a negative or oversized length, a truncated frame at EOF or
an undecodable request closes that connection with a WARNING; an unknown API key or version is
answered UNSUPPORTED_VERSION and the connection stays open. A request that fails inside the broker (a
bug) is answered as Kafka does, UNKNOWN_SERVER_ERROR in every error code of its response
(``broker.protocol.kafka.error_responses``), logged once with its traceback; the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import resource
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.log.api import LogStore
from broker.protocol.kafka import (
    ApiKey,
    FramePool,
    MalformedRequestError,
    Request,
    RequestHeader,
    UnsupportedRequestError,
    decode_request,
    encode_unsupported_version,
)
from broker.protocol.kafka.error_responses import error_response
from broker.protocol.kafka.produce import ProduceResponse
from broker.protocol.kafka_codes import ErrorCode
from broker.security import ANONYMOUS, Authenticator, Authorizer, UserStore
from broker.security.quotas import ProduceQuotas
from broker.security.tls import peer_principal
from broker.server import authz
from broker.server import handlers_acls as acls
from broker.server import handlers_admin as admin
from broker.server import handlers_configs as configs
from broker.server import handlers_fetch as fetching
from broker.server import handlers_groups as groups
from broker.server import handlers_logdirs as logdirs
from broker.server import handlers_partitions as partitions
from broker.server import handlers_produce as producing
from broker.server import handlers_scram as scram
from broker.server import handlers_txn as txn
from broker.server.handlers_common import DEFAULT_LISTENER, BrokerContext, ConnectionInfo
from broker.server.kafka_connection import (
    CloseConnection,
    Dispatch,
    Frame,
    KafkaConnection,
    KafkaStreamProtocol,
    Response,
)
from broker.server.sasl_gate import SaslGate, outside_login
from broker.txn.coordinator import TxnSettings

__all__ = ["KafkaListenerConfig", "KafkaServer", "KafkaServerConfig", "fd_headroom_warning", "handle_request"]

log = logging.getLogger("broker.server.kafka")

_REFUSAL_LOG_INTERVAL_S = 10.0

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
    ApiKey.INIT_PRODUCER_ID: lambda c, h, b, n: producing.handle_init_producer_id(c, b, n, h.api_version),
    ApiKey.ADD_PARTITIONS_TO_TXN: lambda c, h, b, n: txn.handle_add_partitions_to_txn(c, b, n, h.api_version),
    ApiKey.ADD_OFFSETS_TO_TXN: lambda c, h, b, n: txn.handle_add_offsets_to_txn(c, b, n, h.api_version),
    ApiKey.END_TXN: lambda c, h, b, n: txn.handle_end_txn(c, b, n, h.api_version),
    ApiKey.TXN_OFFSET_COMMIT: lambda c, h, b, n: txn.handle_txn_offset_commit(c, b, n),
    ApiKey.DESCRIBE_TRANSACTIONS: lambda c, h, b, n: txn.handle_describe_transactions(c, b, n),
    ApiKey.LIST_TRANSACTIONS: lambda c, h, b, n: txn.handle_list_transactions(c, b, n),
    ApiKey.DESCRIBE_PRODUCERS: lambda c, h, b, n: txn.handle_describe_producers(c, b, n),
    ApiKey.DESCRIBE_CONFIGS: lambda c, h, b, n: configs.handle_describe_configs(c, b, n),
    ApiKey.ALTER_CONFIGS: lambda c, h, b, n: configs.handle_alter_configs(c, b, n),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: lambda c, h, b, n: configs.handle_incremental_alter_configs(c, b, n),
    ApiKey.DELETE_GROUPS: lambda c, h, b, n: groups.handle_delete_groups(c, b, n),
    ApiKey.OFFSET_DELETE: lambda c, h, b, n: groups.handle_offset_delete(c, b, n),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: lambda c, h, b, n: partitions.handle_offset_for_leader_epoch(c, b, n),
    ApiKey.DELETE_RECORDS: lambda c, h, b, n: partitions.handle_delete_records(c, b, n),
    ApiKey.CREATE_PARTITIONS: lambda c, h, b, n: partitions.handle_create_partitions(c, b, n),
    ApiKey.ELECT_LEADERS: lambda c, h, b, n: partitions.handle_elect_leaders(c, b, n),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: lambda c, h, b, n: partitions.handle_list_partition_reassignments(c, b, n),
    ApiKey.DESCRIBE_LOG_DIRS: lambda c, h, b, n: logdirs.handle_describe_log_dirs(c, b, n),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: lambda c, h, b, n: scram.handle_describe_user_scram_credentials(c, b, n),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: lambda c, h, b, n: scram.handle_alter_user_scram_credentials(c, b, n),
    ApiKey.DESCRIBE_ACLS: lambda c, h, b, n: acls.handle_describe_acls(c, b, n),
    ApiKey.CREATE_ACLS: lambda c, h, b, n: acls.handle_create_acls(c, b, n),
    ApiKey.DELETE_ACLS: lambda c, h, b, n: acls.handle_delete_acls(c, b, n),
    ApiKey.SASL_HANDSHAKE: lambda c, h, b, n: _answered(outside_login(h.api_key)),
    ApiKey.SASL_AUTHENTICATE: lambda c, h, b, n: _answered(outside_login(h.api_key)),
}

# Handlers that may be cancelled when their connection ends: they only read, or wait without changing
# anything on the way (a long-poll Fetch; JoinGroup/SyncGroup parked until the rebalance completes —
# the coordinator forgets the waiter). Every other handler may change state across awaits (offsets,
# topics, configs, transactions), so it runs to its end even if its client left and only its answer
# is dropped, as in Kafka, where the request is completed whatever became of the connection.
_CANCEL_SAFE = frozenset({
    ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR,
    ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP, ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS,
    ApiKey.API_VERSIONS, ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.LIST_TRANSACTIONS, ApiKey.DESCRIBE_CONFIGS,
    ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ApiKey.DESCRIBE_ACLS,
    ApiKey.DESCRIBE_LOG_DIRS, ApiKey.DESCRIBE_PRODUCERS, ApiKey.LIST_PARTITION_REASSIGNMENTS,
})
_DETACHED_STOP_TIMEOUT_S = 10.0  # on stop, time left to handlers whose clients are gone


async def _answered(body: Any) -> Any:
    return body


async def handle_request(ctx: BrokerContext, request: Request, conn: ConnectionInfo) -> Any:
    """The response body for a decoded request (None: no response, acks=0); no sockets involved."""
    header = request.header
    if header.api_key == ApiKey.PRODUCE:
        return await producing.handle_produce(ctx, request.body, conn, header.api_version)
    return await _HANDLERS[header.api_key](ctx, header, request.body, conn)


def fd_headroom_warning(max_connections: int, fd_soft_limit: int) -> str | None:
    """Why ``max_connections`` does not protect the process's file descriptors, or None.

    Each connection holds one fd; if the cap can take more than half of the soft limit (``ulimit -n``),
    Kafka clients alone can leave segment files, the HTTP API and other listeners without fds.
    """
    if fd_soft_limit == resource.RLIM_INFINITY:
        return None
    if max_connections > 0 and max_connections <= fd_soft_limit // 2:
        return None
    cap = "no limit" if max_connections <= 0 else str(max_connections)
    return (f"kafka.max_connections ({cap}) can use more than half of the {fd_soft_limit} file descriptors "
            f"this process may open (ulimit -n): raise the limit or lower kafka.max_connections")


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
    sasl_max_receive_bytes: int = 512 * 1024  # a frame before the SASL login (Kafka's sasl.server.max.receive.size)
    extra_listeners: tuple[KafkaListenerConfig, ...] = ()
    transactions: TxnSettings = TxnSettings()
    connections_max_idle_ms: int = 10 * 60 * 1000  # Kafka's connections.max.idle.ms; 0 = never
    max_connections: int = 1000  # all listeners together; 0 = no limit
    max_connections_per_address: int = 0  # per client IP address; 0 = no limit (Kafka's default)
    super_users: tuple[str, ...] = ()  # with an authenticator, the only principals with cluster access

    def __post_init__(self) -> None:
        names = [DEFAULT_LISTENER, *(extra.name for extra in self.extra_listeners)]
        if len(set(names)) != len(names):
            raise ValueError(f"Kafka listener names must be unique and not {DEFAULT_LISTENER!r}: {names[1:]}")


class KafkaServer:
    """Serves the Kafka protocol for one LogStore and one group coordinator."""

    def __init__(self, store: LogStore, coordinator: Any, config: KafkaServerConfig,
                 authenticator: Authenticator | None = None, users: UserStore | None = None,
                 tls: ssl.SSLContext | None = None, tls_handshake_timeout_s: float = 10.0,
                 authorizer: Authorizer | None = None) -> None:
        self.config = config
        self.authenticator = authenticator  # set: every connection logs in with SASL first (sasl_gate.py)
        self.tls = tls  # set: every listener speaks TLS (Kafka's SSL / SASL_SSL)
        self._tls_options: dict[str, Any] = (
            {"ssl": tls, "ssl_handshake_timeout": tls_handshake_timeout_s} if tls is not None else {})
        self.ctx = BrokerContext(store, coordinator, config.advertised_host or config.host,
                                 config.advertised_port or config.port)
        self.ctx.users = authenticator.users if authenticator is not None else users
        self.ctx.authorizer = authorizer  # set: every request is checked against the ACLs (authz.py)
        if authenticator is not None:
            super_users = frozenset(config.super_users)
            # Until the assembly hands over the ACL authorizer (sluice.components.kafka), super users only.
            self.ctx.cluster_access = lambda conn, _operation: conn.principal.name in super_users
        self.ctx.transactions.settings = config.transactions
        self.stats = self.ctx.stats  # plain counters, read at scrape time (broker.server.stats)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._per_address: dict[str, int] = {}  # open connections by client address
        self._detached: set[asyncio.Future[Any]] = set()  # handlers run to completion (see _CANCEL_SAFE)
        self._refusals_logged: dict[str, tuple[float, int]] = {}  # reason -> (last logged, refused since)
        self.port = config.port
        self.listener_ports: dict[str, int] = {}  # extra listener name -> bound port
        self.quotas: ProduceQuotas | None = None  # set by the assembly: per-principal produce quotas
        self._muted_until: dict[tuple[str, int, str], float] = {}  # throttled connections (loop time)
        self._frame_pool = FramePool()  # large request buffers, reused across connections (framing.py)

    async def start(self) -> None:
        warning = fd_headroom_warning(self.config.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        if warning is not None:
            log.warning(warning)
        await self.ctx.transactions.start()  # finishes transactions a crash left prepared, before any client
        try:
            main = await self._listen(self._on_connect, self.config.host, self.config.port)
            self._servers.append(main)
            self.port = main.sockets[0].getsockname()[1]
            if self.config.advertised_port is None:
                self.ctx.advertised_port = self.port
            for extra in self.config.extra_listeners:
                host = extra.host or self.config.host
                server = await self._listen(functools.partial(self._on_connect, listener=extra.name), host, extra.port)
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                self.listener_ports[extra.name] = port
                self.ctx.listener_addresses[extra.name] = (extra.advertised_host or host, extra.advertised_port or port)
        except BaseException:
            await self.stop()
            raise

    async def _listen(
        self, on_connect: Callable[[KafkaStreamProtocol, asyncio.StreamWriter], Coroutine[Any, Any, None]], host: str,
        port: int,
    ) -> asyncio.Server:
        """A listening socket whose connections are read by ``KafkaStreamProtocol`` (frames straight into
        their own buffers) and served by ``on_connect``, as ``asyncio.start_server`` would with streams."""
        loop = asyncio.get_running_loop()
        max_request_bytes, pool = self.config.max_request_bytes, self._frame_pool
        return await loop.create_server(lambda: KafkaStreamProtocol(on_connect, max_request_bytes, loop, pool),
                                        host, port, **self._tls_options)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._detached:
            _done, late = await asyncio.wait(set(self._detached), timeout=_DETACHED_STOP_TIMEOUT_S)
            for leftover in late:
                leftover.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers = []
        await self.ctx.transactions.stop()

    # -- connections ------------------------------------------------------------------------

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from ``host`` is refused (the limit's setting name), or None."""
        limit = self.config.max_connections
        if limit > 0 and len(self._connections) >= limit:
            return "max_connections"
        limit = self.config.max_connections_per_address
        if limit > 0 and self._per_address.get(host, 0) >= limit:
            return "max_connections_per_address"
        return None

    def _log_refusal(self, reason: str, host: str) -> None:
        now = time.monotonic()
        logged_at, unlogged = self._refusals_logged.get(reason, (float("-inf"), 0))
        if now - logged_at < _REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged[reason] = (logged_at, unlogged + 1)
            return
        limit = getattr(self.config, reason)
        since = f" ({unlogged} more refused since the previous line)" if unlogged else ""
        log.warning(f"refused Kafka connection from {host}: {reason} = {limit} reached{since}",
                    extra={"peer": host, "reason": reason, "limit": limit})
        self._refusals_logged[reason] = (now, 0)

    async def _on_connect(
        self, stream: KafkaStreamProtocol, writer: asyncio.StreamWriter, listener: str = DEFAULT_LISTENER
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername") or ("?", 0)
        host = str(peer[0])
        reason = self._refusal(host)
        if reason is not None:
            self.stats.refused(reason)
            self._log_refusal(reason, host)
            writer.transport.abort()
            return
        self._connections.add(task)
        self._per_address[host] = self._per_address.get(host, 0) + 1
        cert_principal = peer_principal(writer.get_extra_info("ssl_object")) if self.tls is not None else None
        conn = ConnectionInfo(host, int(peer[1]), listener, cert_principal or ANONYMOUS)
        self.stats.connected(listener)
        dispatch: Dispatch = self._dispatch
        if self.authenticator is not None:
            on_login = None
            if cert_principal is None:  # a verified certificate is a login already: no lower limit for it
                stream.limit_frames(self.config.sasl_max_receive_bytes, "kafka.sasl_max_receive_bytes before the login")
                on_login = functools.partial(stream.limit_frames, self.config.max_request_bytes,
                                             "the maximum request size")
            dispatch = SaslGate(self.authenticator, self.stats, self._dispatch, cert_principal, on_login).dispatch
        connection = KafkaConnection(
            stream, writer, conn, dispatch=dispatch, stats=self.stats, max_idle_ms=self.config.connections_max_idle_ms,
        )
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass  # server stopping: the connection ends here (not re-raised: nobody awaits it)
        finally:
            self._connections.discard(task)
            self._muted_until.pop((conn.peer_host, conn.peer_port, listener), None)
            left = self._per_address.get(host, 1) - 1
            if left > 0:
                self._per_address[host] = left
            else:
                self._per_address.pop(host, None)
            self.stats.disconnected(listener)

    async def _dispatch(self, frame: Frame, conn: ConnectionInfo) -> Response:
        if self._muted_until:
            await self._unmuted(conn)
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
            raise CloseConnection from exc
        header, body = request.header, request.body
        self.stats.request(header.api_key)
        try:
            if header.api_key == ApiKey.PRODUCE:
                pending = authz.gate(self.ctx, header, body, conn,
                                     lambda b: producing.handle_produce(self.ctx, b, conn, header.api_version))
                throttle_ms = self._throttle(conn, len(frame)) if self.quotas is not None else 0
                return header, self._answer_failure(header, body, conn, pending, throttle_ms)
            handler = _HANDLERS[header.api_key]
            work = authz.gate(self.ctx, header, body, conn, lambda b: handler(self.ctx, header, b, conn))
            if header.api_key in _CANCEL_SAFE:
                return header, await work
            return header, await self._to_completion(work, header, conn)
        except Exception as exc:
            return header, self._internal_error(header, body, conn, exc)

    async def _to_completion(self, work: Awaitable[Any], header: RequestHeader, conn: ConnectionInfo) -> Any:
        """Await ``work`` in a task of its own that outlives this connection (see ``_CANCEL_SAFE``)."""
        task = asyncio.ensure_future(work)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # the connection ended: nobody hears the outcome, so log a failure here
                task.add_done_callback(functools.partial(self._log_orphan_failure, header, conn))
            raise

    @staticmethod
    def _log_orphan_failure(header: RequestHeader, conn: ConnectionInfo, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error(f"{ApiKey(header.api_key).name} v{header.api_version} request failed after its client left",
                  exc_info=task.exception(), extra={"peer": conn.peer_host})

    async def _answer_failure(self, header: RequestHeader, body: Any, conn: ConnectionInfo,
                              pending: Awaitable[Any], throttle_ms: int = 0) -> Any:
        try:
            response = await pending
        except Exception as exc:
            return self._internal_error(header, body, conn, exc)
        if int(body.acks) == 0:
            return self._acks_zero_outcome(header, conn, response)
        if throttle_ms and isinstance(response, ProduceResponse):
            response = dataclasses.replace(response, throttle_time_ms=throttle_ms)
        return response

    def _acks_zero_outcome(self, header: RequestHeader, conn: ConnectionInfo, response: Any) -> None:
        """acks=0 hears nothing; if a partition failed (or the whole request was refused), Kafka closes the
        connection so the producer notices and refreshes its metadata (KafkaApis.handleProduceRequest)."""
        if not isinstance(response, ProduceResponse) or not producing.has_errors(response):
            return None
        self.stats.acks_zero_closed += 1
        failed = sorted({(t.name, p.index, ErrorCode(p.error_code).name)
                         for t in response.topics for p in t.partitions if p.error_code != ErrorCode.NONE})
        log.info("closing Kafka connection: an acks=0 produce failed", extra={
            "peer": conn.peer_host, "correlation_id": header.correlation_id, "failed": failed[:10]})
        raise CloseConnection

    # -- produce quotas (broker.security.quotas) ----------------------------------------------

    def _throttle(self, conn: ConnectionInfo, size: int) -> int:
        """Record a Produce of ``size`` bytes; over quota, mute the connection for the throttle time, as Kafka
        does after sending the answer (KIP-219): the answer goes out at once, the next request waits."""
        assert self.quotas is not None
        throttle_ms = self.quotas.record(conn.principal.name, size)
        if throttle_ms > 0:
            until = asyncio.get_running_loop().time() + throttle_ms / 1000
            self._muted_until[(conn.peer_host, conn.peer_port, conn.listener)] = until
        return throttle_ms

    async def _unmuted(self, conn: ConnectionInfo) -> None:
        until = self._muted_until.pop((conn.peer_host, conn.peer_port, conn.listener), None)
        if until is not None:
            delay = until - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)

    def _internal_error(self, header: RequestHeader, body: Any, conn: ConnectionInfo, exc: Exception) -> Any:
        """Kafka's answer to a request that failed inside the broker (a bug): UNKNOWN_SERVER_ERROR wherever
        the response has an error code, the connection kept; logged once with the traceback, counted in
        the errors metric like every answered error code."""
        api = f"{ApiKey(header.api_key).name} v{header.api_version}"
        extra = {"peer": conn.peer_host, "api_key": header.api_key, "correlation_id": header.correlation_id}
        try:
            response = error_response(header.api_key, header.api_version, body, ErrorCode.UNKNOWN_SERVER_ERROR)
        except LookupError:
            log.error(f"{api} request failed; closing the connection", exc_info=exc, extra=extra)
            raise CloseConnection from exc
        log.error(f"{api} request failed; answered UNKNOWN_SERVER_ERROR", exc_info=exc, extra=extra)
        if header.api_key == ApiKey.PRODUCE and int(body.acks) == 0:
            self.stats.count_response(response)
            raise CloseConnection from exc  # acks=0 hears nothing: the closed socket tells it, as Kafka does
        return response
