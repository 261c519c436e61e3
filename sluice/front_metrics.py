"""Status and Prometheus series of the front doors: the Kafka listener, the MQTT listener, the MQTT bridges.

The front doors keep plain int counters (``broker.server.stats.KafkaStats``, ``ingest.mqtt.hub.HubStats``,
``MqttBridge.status()``); nothing here runs on their hot paths. Each component publishes a collector into
``runtime.registries["metrics"]`` (a list the HTTP API's ``/metrics`` reads at scrape time, see
``sluice/http/metrics.py``) with ``publish_collector``. ``bridge_statuses`` and ``mqtt_status`` are the
JSON-ready views ``/bridges`` and ``/mqtt`` (and through them ``sluice sources``) show.

Series (``_total`` is added to counters by the exposition format):

- ``sluice_kafka_connections{listener}`` (gauge), ``sluice_kafka_connections_accepted_total{listener}``,
  ``sluice_kafka_requests_total{api}``, ``sluice_kafka_produce_records_total``,
  ``sluice_kafka_produce_bytes_total``, ``sluice_kafka_produce_storage_errors_total``,
  ``sluice_kafka_fetch_bytes_total``,
  ``sluice_kafka_errors_total{code,error}``, ``sluice_kafka_connections_closed_bad_input_total``,
  ``sluice_kafka_connections_refused_total{reason}``, ``sluice_kafka_connections_closed_idle_total``,
  ``sluice_kafka_requests_cancelled_total``.
- ``sluice_mqtt_connections`` (gauge), ``sluice_mqtt_sessions`` (gauge), ``sluice_mqtt_subscriptions``
  (gauge), ``sluice_mqtt_retained_messages`` (gauge), ``sluice_mqtt_wills_pending`` (gauge), and counters
  ``sluice_mqtt_connections_accepted``,
  ``sluice_mqtt_messages_in``, ``sluice_mqtt_bytes_in``, ``sluice_mqtt_messages_delivered``,
  ``sluice_mqtt_deliveries_dropped``, ``sluice_mqtt_duplicates``, ``sluice_mqtt_protocol_errors``,
  ``sluice_mqtt_refused_logins``, ``sluice_mqtt_queue_drops``, ``sluice_mqtt_sessions_expired``,
  ``sluice_mqtt_connections_refused{reason}`` (and ``sluice_tcp_connections_refused{reason}``: connection
  caps, ``reason`` = ``max_connections`` | ``max_connections_per_address``),
  ``sluice_mqtt_append_errors``, ``sluice_mqtt_wills_published``, ``sluice_mqtt_read_pauses``,
  ``sluice_mqtt_journal_records``, ``sluice_mqtt_journal_errors`` (durable sessions, ``session_store.py``);
  ``sluice_mqtt_connections_parked`` (gauge: idle connections without a transport, ``parking.py``) and
  counters ``sluice_mqtt_connections_parks``, ``sluice_mqtt_connections_unparks``, ``sluice_mqtt_accept_errors``.
- ``sluice_bridge_connected{bridge,broker}`` (gauge 0/1), ``sluice_bridge_last_message_age_seconds``
  (gauge, absent before the first message), counters ``sluice_bridge_messages``, ``sluice_bridge_bytes``,
  ``sluice_bridge_acked``, ``sluice_bridge_connects``, ``sluice_bridge_subscriptions_refused``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.protocol.kafka import ApiKey
from broker.protocol.kafka_codes import ErrorCode
from broker.server.stats import KafkaStats
from ingest.mqtt.session_store import SessionStore
from sluice.runtime import Runtime

if TYPE_CHECKING:
    from ingest.admission import Admission
    from ingest.bridge import MqttBridge
    from ingest.mqtt.hub import Hub
    from ingest.mqtt.websocket import WebSocketStats

__all__ = [
    "AdmissionCollector",
    "BridgeCollector",
    "KafkaCollector",
    "MqttCollector",
    "WebSocketCollector",
    "bridge_statuses",
    "mqtt_status",
    "publish_collector",
]


def publish_collector(runtime: Runtime, collector: Collector) -> None:
    """Add ``collector`` to what ``/metrics`` reads (``runtime.registries["metrics"]``), once."""
    collectors: list[Collector] = runtime.registries.setdefault("metrics", [])
    if collector not in collectors:
        collectors.append(collector)


def _api_name(key: int) -> str:
    try:
        return ApiKey(key).name.lower()
    except ValueError:
        return "unknown"  # KafkaStats already folds unserved keys into one entry


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


class KafkaCollector(Collector):
    """The Kafka front door's counters (``KafkaServer.stats``), read at scrape time."""

    def __init__(self, stats: KafkaStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        open_ = GaugeMetricFamily("sluice_kafka_connections", "Open Kafka-protocol connections", labels=["listener"])
        total = CounterMetricFamily(
            "sluice_kafka_connections_accepted", "Kafka-protocol connections accepted", labels=["listener"]
        )
        for listener, n in sorted(s.connections_total.items()):
            open_.add_metric([listener], s.connections_open.get(listener, 0))
            total.add_metric([listener], n)
        yield from (open_, total)
        requests = CounterMetricFamily("sluice_kafka_requests", "Kafka requests decoded, by API", labels=["api"])
        for key, n in sorted(s.requests.items()):
            requests.add_metric([_api_name(key)], n)
        yield requests
        yield CounterMetricFamily(
            "sluice_kafka_produce_records", "Records appended by Kafka Produce requests", value=s.produce_records
        )
        yield CounterMetricFamily(
            "sluice_kafka_produce_bytes", "Record batch bytes appended by Kafka Produce requests", value=s.produce_bytes
        )
        yield CounterMetricFamily(
            "sluice_kafka_produce_storage_errors",
            "Produce partitions answered KAFKA_STORAGE_ERROR (a write or its fsync failed)",
            value=s.produce_storage_errors,
        )
        yield CounterMetricFamily(
            "sluice_kafka_fetch_bytes", "Record batch bytes returned by Kafka Fetch responses", value=s.fetch_bytes
        )
        errors = CounterMetricFamily(
            "sluice_kafka_errors", "Non-zero error codes in Kafka responses", labels=["code", "error"]
        )
        for code, n in sorted(s.errors.items()):
            errors.add_metric([str(code), _error_name(code)], n)
        yield errors
        yield CounterMetricFamily(
            "sluice_kafka_connections_closed_bad_input",
            "Kafka connections closed for a malformed frame or request",
            value=s.closed_bad_input,
        )
        yield CounterMetricFamily(
            "sluice_kafka_connections_closed_acks_zero",
            "Kafka connections closed because an acks=0 produce failed (Kafka's way of telling the producer)",
            value=s.acks_zero_closed,
        )
        refused = CounterMetricFamily(
            "sluice_kafka_connections_refused", "Kafka connections refused by a connection limit", labels=["reason"]
        )
        for reason, n in sorted(s.connections_refused.items()):
            refused.add_metric([reason], n)
        yield refused
        yield CounterMetricFamily(
            "sluice_kafka_connections_closed_idle",
            "Kafka connections closed after kafka.connections_max_idle_ms without traffic",
            value=s.closed_idle,
        )
        yield CounterMetricFamily(
            "sluice_kafka_requests_cancelled",
            "Kafka requests still pending when their connection ended (peer gone, idle, bad input)",
            value=s.requests_cancelled,
        )


def mqtt_status(hub: Hub, endpoint: str | None = None) -> dict[str, Any]:
    """The MQTT listener: address, open connections, sessions, subscriptions, retained, and its counters."""
    offline = sum(1 for session in hub.sessions.values() if session.connection is None)
    return {
        "endpoint": endpoint,
        "connections": len(hub.connections),
        "sessions": len(hub.sessions),
        "offline_sessions": offline,
        "subscriptions": len(hub.tree),
        "retained_messages": len(hub.retained),
        "wills_pending": len(hub.delayed_wills),
        "connections_refused": sum(hub.admission.refused.values()),
        **asdict(hub.stats),
        **_journal_counts(hub),
    }


def _journal_counts(hub: Hub) -> dict[str, int]:
    store = hub.store
    if not isinstance(store, SessionStore):  # mqtt.durable = false
        return {"journal_records": 0, "journal_errors": 0}
    return {"journal_records": store.records_written, "journal_errors": store.write_errors}


_MQTT_COUNTERS = (
    ("connections_total", "sluice_mqtt_connections_accepted", "MQTT connections accepted"),
    ("messages_in", "sluice_mqtt_messages_in", "PUBLISH packets from clients appended"),
    ("bytes_in", "sluice_mqtt_bytes_in", "Payload bytes of PUBLISH packets from clients"),
    ("delivered", "sluice_mqtt_messages_delivered", "Messages delivered to subscribers"),
    ("dropped_deliveries", "sluice_mqtt_deliveries_dropped", "Deliveries dropped (slow or too-small client)"),
    ("duplicates", "sluice_mqtt_duplicates", "QoS 1/2 retries recognised as duplicates"),
    ("protocol_errors", "sluice_mqtt_protocol_errors", "Connections ended for a protocol error"),
    ("refused_logins", "sluice_mqtt_refused_logins", "CONNECTs refused for their credentials (or lack of them)"),
    ("append_errors", "sluice_mqtt_append_errors", "Appends of MQTT messages that failed"),
    ("wills_published", "sluice_mqtt_wills_published", "Will messages published"),
    ("read_pauses", "sluice_mqtt_read_pauses", "Times a connection's reads paused for backpressure"),
    ("queue_drops", "sluice_mqtt_queue_drops", "QoS 1/2 messages dropped because a session queue was full"),
    ("sessions_expired", "sluice_mqtt_sessions_expired", "Offline sessions dropped at the end of their expiry"),
    ("sessions_evicted", "sluice_mqtt_sessions_evicted",
     "Offline sessions ended early because mqtt.max_offline_sessions were kept"),
    ("parks", "sluice_mqtt_connections_parks", "Times an idle MQTT connection gave up its transport"),
    ("unparks", "sluice_mqtt_connections_unparks", "Times a parked MQTT connection got a transport back"),
    ("accept_errors", "sluice_mqtt_accept_errors", "accept() failures on the plain-TCP MQTT doors"),
    ("messages_expired", "sluice_mqtt_messages_expired",
     "Queued or retained messages dropped at the end of their Message Expiry Interval"),
    ("log_records_delivered", "sluice_mqtt_log_records_delivered",
     "Records others wrote to deliver_from_topics sent to MQTT subscribers"),
    ("log_records_skipped", "sluice_mqtt_log_records_skipped",
     "Records of deliver_from_topics without a valid mqtt_topic header"),
    ("journal_records", "sluice_mqtt_journal_records",
     "Records written to the durable session and retained-message journals (__mqtt_sessions, __mqtt_retained)"),
    ("journal_errors", "sluice_mqtt_journal_errors",
     "Journal appends that failed (what they protect was not acknowledged)"),
)


class AdmissionCollector(Collector):
    """A device front door's connection caps (``ingest.admission.Admission``): refusals by reason."""

    def __init__(self, door: str, admission: Admission) -> None:
        self.door = door
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            f"sluice_{self.door}_connections_refused",
            f"{self.door.upper()} connections closed at accept for a connection cap, by the setting reached",
            labels=["reason"],
        )
        for reason in ("max_connections", "max_connections_per_address"):
            refused.add_metric([reason], self.admission.refused.get(reason, 0))
        yield refused


class WebSocketCollector(Collector):
    """MQTT over WebSockets (``ingest.mqtt.websocket``): handshakes and connections refused or failed."""

    def __init__(self, stats: WebSocketStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        for name, value, text in (
            ("handshakes", s.handshakes, "WebSocket handshakes completed on the ws/wss MQTT ports"),
            ("handshake_refusals", s.handshake_refusals, "WebSocket handshakes refused (not an upgrade, wrong "
                                                         "subprotocol, too slow)"),
            ("text_frames", s.text_frames, "MQTT WebSocket connections closed for a text frame (1003)"),
            ("protocol_errors", s.protocol_errors, "MQTT WebSocket connections failed for bad framing (1002, 1009)"),
        ):
            yield CounterMetricFamily(f"sluice_mqtt_websocket_{name}", text, value=value)


class MqttCollector(Collector):
    """The MQTT listener's hub: live sizes as gauges, ``HubStats`` as counters."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        yield from AdmissionCollector("mqtt", self.hub.admission).collect()
        status = mqtt_status(self.hub)
        yield GaugeMetricFamily("sluice_mqtt_connections", "Open MQTT connections", value=status["connections"])
        yield GaugeMetricFamily("sluice_mqtt_sessions", "MQTT sessions (connected or kept)", value=status["sessions"])
        yield GaugeMetricFamily(
            "sluice_mqtt_subscriptions", "MQTT subscriptions (filter, session)", value=status["subscriptions"]
        )
        yield GaugeMetricFamily(
            "sluice_mqtt_retained_messages", "Retained MQTT messages", value=status["retained_messages"]
        )
        yield GaugeMetricFamily(
            "sluice_mqtt_connections_parked", "Open MQTT connections parked without a transport (idle)",
            value=status["connections_parked"],
        )
        yield GaugeMetricFamily(
            "sluice_mqtt_wills_pending", "Wills waiting for their Will Delay Interval", value=status["wills_pending"]
        )
        for field, name, doc in _MQTT_COUNTERS:
            yield CounterMetricFamily(name, doc, value=status[field])


def bridge_statuses(bridges: Mapping[str, MqttBridge] | None, now: float | None = None) -> list[dict[str, Any]]:
    """Each bridge's ``status()`` plus ``last_message_age_s`` (seconds since its last message, or None)."""
    now = time.time() if now is None else now
    out: list[dict[str, Any]] = []
    for bridge in (bridges or {}).values():
        status = bridge.status()
        last = status.get("last_message_at")
        status["last_message_age_s"] = None if last is None else round(max(now - last, 0.0), 3)
        out.append(status)
    return out


class BridgeCollector(Collector):
    """Every MQTT bridge of ``runtime.registries["bridges"]`` (read at scrape time)."""

    def __init__(self, bridges: Callable[[], Mapping[str, MqttBridge] | None]) -> None:
        self.bridges = bridges

    def collect(self) -> Iterator[Metric]:
        labels = ["bridge", "broker"]
        connected = GaugeMetricFamily("sluice_bridge_connected", "1 while the bridge is connected", labels=labels)
        age = GaugeMetricFamily(
            "sluice_bridge_last_message_age_seconds", "Seconds since the bridge's last message", labels=labels
        )
        counters = {
            field: CounterMetricFamily(f"sluice_bridge_{field}", doc, labels=labels)
            for field, doc in (
                ("messages", "Messages moved from the external broker into the log"),
                ("bytes", "Payload bytes moved by the bridge"),
                ("acked", "Messages acknowledged to the external broker after the append"),
                ("connects", "Successful connections to the external broker"),
                ("subscriptions_refused", "SUBACKs in which the external broker refused a filter"),
            )
        }
        for status in bridge_statuses(self.bridges()):
            values = [str(status["name"]), str(status["broker"])]
            connected.add_metric(values, 1.0 if status["connected"] else 0.0)
            if status["last_message_age_s"] is not None:
                age.add_metric(values, status["last_message_age_s"])
            for field, family in counters.items():
                family.add_metric(values, status[field])
        yield from (connected, age, *counters.values())
