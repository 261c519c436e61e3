"""The Kafka front door as a ``sluice serve`` component: listener + group coordinator.

The coordinator is published as ``runtime.registries["groups"]`` so the HTTP API and CLI can read
groups, committed offsets and lag; the listener's counters go to ``/metrics`` through a KafkaCollector.
Before the listener opens, idempotent-producer state is rebuilt from the log tails and producer ids
continue after every id used before (``producer_state.rebuild``; with the segment store the id
high-water mark is kept in ``<data_dir>/producer-ids.json``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.groups.coordinator import GroupCoordinator
from broker.groups.group import GroupSettings
from broker.groups.offsets import DurableOffsetStore, MemoryOffsetStore, OffsetStore
from broker.security import Authorizer, Operation, ResourceType, UserStore
from broker.security.quotas import ProduceQuotas
from broker.server.handlers_common import ConnectionInfo
from broker.server.kafka import KafkaListenerConfig, KafkaServer, KafkaServerConfig
from broker.server.producer_state import ProducerIdAllocator, ProducerStateTable, rebuild
from broker.txn import TxnSettings
from sluice.components.security import authenticator, authorizer
from sluice.components.tls import handshake_timeout, server_context
from sluice.front_metrics import KafkaCollector, publish_collector
from sluice.runtime import Runtime

__all__ = ["GroupStoreCollector", "KafkaComponent", "kafka_component"]


class KafkaComponent:
    name = "kafka"

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        settings = runtime.settings
        offsets: OffsetStore
        if settings.storage.backend == "memory":
            offsets = MemoryOffsetStore()
            self.producer_ids = ProducerIdAllocator()
        else:
            offsets = DurableOffsetStore(settings.data_dir / "groups")
            self.producer_ids = ProducerIdAllocator(path=settings.data_dir / "producer-ids.json")
        kafka = settings.kafka
        self.coordinator = GroupCoordinator(
            offsets, settings=GroupSettings(initial_rebalance_delay_ms=kafka.group_initial_rebalance_delay_ms,
                                            empty_group_check_interval_ms=kafka.offsets_retention_check_interval_ms,
                                            offsets_retention_ms=round(kafka.offsets_retention_minutes * 60_000)),
        )
        self.server = KafkaServer(
            runtime.store,
            self.coordinator,
            KafkaServerConfig(
                host=settings.host,
                port=kafka.port,
                advertised_host=kafka.advertised_host,
                advertised_port=kafka.advertised_port,
                max_request_bytes=kafka.max_request_bytes,
                sasl_max_receive_bytes=kafka.sasl_max_receive_bytes,
                connections_max_idle_ms=kafka.connections_max_idle_ms,
                max_connections=kafka.max_connections,
                max_connections_per_address=kafka.max_connections_per_address,
                super_users=tuple(settings.security.super_users),
                transactions=TxnSettings(
                    max_timeout_ms=kafka.transaction_max_timeout_ms,
                    abort_check_interval_ms=kafka.transaction_abort_check_interval_ms,
                    id_expiration_ms=kafka.transactional_id_expiration_ms,
                ),
                extra_listeners=tuple(
                    KafkaListenerConfig(**extra.model_dump()) for extra in kafka.extra_listeners
                ),
            ),
            authenticator=authenticator(runtime),
            authorizer=authorizer(runtime),
            users=UserStore(settings.data_dir),
            tls=server_context(runtime),
            tls_handshake_timeout_s=handshake_timeout(runtime),
        )
        self.server.ctx.producer_ids = self.producer_ids
        # attached exactly-once processors write their transactions through this coordinator
        runtime.registries["transactions"] = self.server.ctx.transactions
        security = settings.security
        quotas = ProduceQuotas(security.produce_quota_bytes_per_s, security.produce_quota_overrides,
                               samples=security.quota_window_num, window_s=security.quota_window_size_s)
        if quotas.enabled:
            self.server.quotas = quotas
            publish_collector(runtime, QuotaCollector(quotas))
        authz = authorizer(runtime)
        if authz is not None:  # the SCRAM admin APIs ask the ACLs (CLUSTER describe / alter)
            self.server.ctx.cluster_access = _cluster_access(authz)
        self.server.ctx.producer_state = ProducerStateTable(
            expiration_ms=kafka.producer_id_expiration_ms,
            check_interval_ms=kafka.producer_id_expiration_check_interval_ms,
        )
        publish_collector(runtime, KafkaCollector(self.server.stats))
        publish_collector(runtime, GroupStoreCollector(self.coordinator))

    async def start(self) -> None:
        ctx = self.server.ctx
        rebuild(self.runtime.store, ctx.producer_state, ctx.producer_ids,
                self.runtime.settings.kafka.producer_state_scan_bytes)
        await self.coordinator.start()
        self.runtime.registries["groups"] = self.coordinator
        await self.server.start()
        settings = self.runtime.settings
        self.runtime.announce("kafka", settings.host, self.server.port)
        for extra in settings.kafka.extra_listeners:
            port = self.server.listener_ports[extra.name]
            self.runtime.announce(f"kafka:{extra.name}", extra.host or settings.host, port)

    async def stop(self) -> None:
        await self.server.stop()
        await self.coordinator.stop()


class QuotaCollector(Collector):
    def __init__(self, quotas: ProduceQuotas) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("sluice_kafka_produce_throttled", "Produce answers over a principal's quota "
                                  "(throttle_time_ms > 0, connection muted)", value=self.quotas.throttled)
        yield CounterMetricFamily("sluice_kafka_produce_throttle_seconds", "Throttle time told to producers over "
                                  "their quota", value=self.quotas.throttle_ms_total / 1000)


class GroupStoreCollector(Collector):
    """What the group coordinator could not store (broker.groups.coordinator, rule 13 of group.py)."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("sluice_group_metadata_write_failures", "Group metadata records not stored "
                                  "(the disk failed, or Kafka's record format cannot hold them); the SyncGroup or "
                                  "JoinGroup waiting for it was answered with an error",
                                  value=self.coordinator.metadata_write_failures)
        yield CounterMetricFamily("sluice_group_offsets_expired", "Committed offsets removed because they "
                                  "expired (kafka.offsets_retention_minutes, docs/kafka.md)",
                                  value=self.coordinator.offsets_expired)


def _cluster_access(authz: Authorizer) -> Callable[[ConnectionInfo, str], bool]:
    def check(conn: ConnectionInfo, operation: str) -> bool:
        return authz.check("kafka", conn.principal, conn.peer_host, Operation[operation.upper()],
                           ResourceType.CLUSTER)
    return check


def kafka_component(runtime: Runtime) -> KafkaComponent | None:
    return KafkaComponent(runtime) if runtime.settings.kafka.enabled else None
