"""The settings of one MQTT hub and its counters (shared by the hub, the sessions and the connections)."""

from __future__ import annotations

from dataclasses import dataclass

from ingest.admission import ConnectionLimits
from ingest.mqtt.packets import MQTT_5, MQTT_311, Properties

__all__ = ["HubConfig", "HubStats"]


@dataclass(frozen=True, slots=True)
class HubConfig:
    allow_anonymous: bool = True
    max_packet_size: int = 1024 * 1024 + 1024
    receive_maximum: int = 1024  # inbound QoS 1/2 in flight per connection (advertised in MQTT 5)
    topic_alias_maximum: int = 32
    max_queued_messages: int = 10_000  # per session, QoS 1/2 waiting for an offline or busy client (0: no bound)
    max_queued_bytes: int = 16 * 1024 * 1024  # per session, payload bytes of those messages (0: no bound)
    max_queued_bytes_total: int = 256 * 1024 * 1024  # all sessions together (0: no bound)
    # sessions kept for clients that are away (0: no bound); beyond it the one away longest is ended, so
    # clients inventing client ids cannot hold memory for the whole session expiry
    max_offline_sessions: int = 100_000
    session_expiry_s: float = 86_400.0  # 3.1.1 clean session = 0: kept this long after the client leaves
    max_session_expiry_s: float = 86_400.0  # 5.0: a longer Session Expiry Interval (or "never") is cut to this
    connect_timeout_s: float = 10.0
    max_keepalive: int = 65_535  # a client asking for more, or 0, gets this (5.0: told by Server Keep Alive)
    backlog_high_bytes: int = 64 * 1024 * 1024
    max_write_buffer: int = 4 * 1024 * 1024  # QoS 0 deliveries beyond this to a slow client are dropped
    protocol_versions: tuple[int, ...] = (MQTT_311, MQTT_5)
    connection_limits: ConnectionLimits = ConnectionLimits()  # refused at accept beyond these (admission.py)


    def granted_keepalive(self, asked: int) -> int:
        """A keep alive above ``max_keepalive``, or 0 (none), becomes ``max_keepalive``: 5.0 clients are told
        (Server Keep Alive, §3.2.2.3.14); 3.1.1 ones cannot be and are held to it all the same (as Mosquitto,
        which accepts them)."""
        if self.max_keepalive and (asked == 0 or asked > self.max_keepalive):
            return self.max_keepalive
        return asked

    def connack_properties(self, *, assigned_client_id: str | None, session_expiry: int | None,
                           server_keep_alive: int | None) -> Properties:
        """What a 5.0 CONNACK advertises: exactly what this server supports. Maximum QoS is absent: QoS 2
        is supported (a value of 2 may not be sent, §3.2.2.3.4)."""
        return Properties(
            receive_maximum=self.receive_maximum,
            topic_alias_maximum=self.topic_alias_maximum,
            maximum_packet_size=self.max_packet_size,
            retain_available=1,
            wildcard_subscription_available=1,
            subscription_identifier_available=1,
            shared_subscription_available=1,
            assigned_client_identifier=assigned_client_id,
            session_expiry_interval=session_expiry,
            server_keep_alive=server_keep_alive,
        )


@dataclass(slots=True)
class HubStats:
    connections_total: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    duplicates: int = 0
    delivered: int = 0
    dropped_deliveries: int = 0  # counted and logged, never silent
    protocol_errors: int = 0
    refused_logins: int = 0  # CONNECTs refused for their credentials (or for having none)
    append_errors: int = 0
    wills_published: int = 0
    read_pauses: int = 0  # times a connection's socket reads were paused for backpressure
    queue_drops: int = 0  # QoS 1/2 messages dropped because a session's queue was full (also in dropped_deliveries)
    sessions_expired: int = 0  # offline sessions dropped at the end of their expiry interval
    sessions_evicted: int = 0  # offline sessions ended early because max_offline_sessions were kept
    max_queued: int = 0  # most messages one connection ever had waiting for the append
    log_records_delivered: int = 0  # records written by others (Kafka, HTTP) sent to MQTT subscribers (from_log.py)
    log_records_skipped: int = 0  # records of a followed topic without a valid mqtt_topic header
    log_headers_skipped: int = 0  # headers of those records that cannot be MQTT properties (not UTF-8)
    messages_expired: int = 0  # queued or retained messages dropped at the end of their Message Expiry Interval
    # Plain-TCP connections served without a transport (parking.py): a gauge, then counters
    connections_parked: int = 0  # parked now
    parks: int = 0  # connections whose transport was dropped after park_after_s without reads
    unparks: int = 0  # parked connections that got a transport (busy, or a write that did not fit)
    accept_errors: int = 0  # accept() failures on the plain-TCP doors (out of file descriptors ...)
