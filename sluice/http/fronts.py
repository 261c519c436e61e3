"""Device front doors beyond ingest health: ``/bridges`` (MQTT bridges) and ``/mqtt`` (the MQTT listener).

``/sources`` shows what arrived, per source and device (ingest health). These routes show the doors
themselves: whether a bridge is connected to its external broker, when it last moved a message, its last
error; how many clients, sessions and subscriptions the MQTT listener holds. They read
``runtime.registries["bridges"]`` (name -> MqttBridge) and ``runtime.registries["mqtt"]`` (the hub).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from broker.security import Operation, ResourceType
from sluice.front_metrics import bridge_statuses, mqtt_status
from sluice.http.auth import allow
from sluice.http.context import ApiContext, Ctx
from sluice.http.problems import PROBLEM_RESPONSES, ProblemError

__all__ = ["BridgeStatusOut", "MqttListenerStatus", "router"]

# The status of the front doors is the cluster's: describe on it (with security.auth = required).
router = APIRouter(tags=["operations"], responses={500: PROBLEM_RESPONSES[500]},
                   dependencies=[Depends(allow(Operation.DESCRIBE, ResourceType.CLUSTER))])


class BridgeStatusOut(BaseModel):
    """One MQTT bridge: a persistent QoS 1 subscription on an external broker, acked after the append."""

    name: str
    broker: str = Field(description="host:port of the external MQTT broker")
    topics: list[str]
    connected: bool
    connects: int = Field(description="Successful connections so far")
    messages: int = Field(description="Messages moved into the log")
    bytes: int
    acked: int = Field(description="QoS 1 messages acknowledged to the external broker after the append")
    last_message_at: float | None = Field(description="Unix seconds of the last message")
    last_message_age_s: float | None = Field(description="Seconds since the last message (null: none yet)")
    last_connected_at: float | None
    last_error: str | None = Field(description="The last connection or append failure")
    last_error_at: float | None
    subscriptions_refused: int = Field(description="SUBACKs in which the external broker refused a filter")


class MqttListenerStatus(BaseModel):
    """The built-in MQTT listener: live sizes and counters since start."""

    endpoint: str | None = Field(description="host:port it listens on")
    connections: int = Field(description="Open client connections")
    sessions: int = Field(description="Sessions, connected or kept for a persistent client")
    offline_sessions: int
    subscriptions: int
    retained_messages: int
    wills_pending: int = Field(0, description="Wills of ended connections waiting for their Will Delay Interval")
    connections_total: int
    connections_refused: int = Field(0, description="Connections closed at accept for a connection cap")
    messages_in: int
    bytes_in: int
    duplicates: int
    delivered: int
    dropped_deliveries: int
    protocol_errors: int
    refused_logins: int = Field(0, description="CONNECTs refused for their credentials (or lack of them)")
    append_errors: int
    wills_published: int
    read_pauses: int
    queue_drops: int = Field(0, description="QoS 1/2 messages dropped because a session's queue was full")
    sessions_expired: int = Field(0, description="Offline sessions dropped at the end of their expiry interval")
    max_queued: int
    connections_parked: int = Field(0, description="Open plain-TCP connections served without a transport (idle)")
    parks: int = Field(0, description="Times a connection gave up its transport after mqtt.park_after_s quiet")
    unparks: int = Field(0, description="Times a parked connection got a transport (busy, or a write that did not fit)")
    accept_errors: int = Field(0, description="accept() failures on the plain-TCP doors (out of file descriptors...)")


def _bridges(ctx: ApiContext) -> list[BridgeStatusOut]:
    return [BridgeStatusOut(**s) for s in bridge_statuses(ctx.runtime.registries.get("bridges"))]


@router.get("/bridges", response_model=list[BridgeStatusOut], summary="MQTT bridges: connected, messages, last message")
async def bridges(ctx: Ctx) -> list[BridgeStatusOut]:
    return _bridges(ctx)


@router.get(
    "/bridges/{name}",
    response_model=BridgeStatusOut,
    summary="One MQTT bridge",
    responses={404: PROBLEM_RESPONSES[404]},
)
async def bridge(ctx: Ctx, name: str) -> BridgeStatusOut:
    for status in _bridges(ctx):
        if status.name == name:
            return status
    detail = f"no MQTT bridge named {name!r}: GET /bridges lists the configured ones"
    raise ProblemError(404, "unknown-bridge", "Unknown bridge", detail)


@router.get(
    "/mqtt",
    response_model=MqttListenerStatus,
    summary="The MQTT listener: connections, sessions, subscriptions, counters",
    responses={404: PROBLEM_RESPONSES[404]},
)
async def mqtt(ctx: Ctx) -> MqttListenerStatus:
    hub = ctx.runtime.registries.get("mqtt")
    if hub is None:
        detail = "the MQTT listener is off: enable it with mqtt.enabled = true (SLUICE_MQTT__ENABLED=true)"
        raise ProblemError(404, "mqtt-disabled", "MQTT listener not running", detail)
    endpoint = ctx.runtime.endpoints.get("mqtt")
    return MqttListenerStatus(**mqtt_status(hub, f"{endpoint.host}:{endpoint.port}" if endpoint else None))
