"""CONNECT (MQTT 3.1.1 §3.1, 5.0 §3.1): whether a client gets in, and on what terms. A pure function.

Rules
-----
1. A protocol level the hub does not accept gets CONNACK 0x01 in 3.1.1 format (levels < 5) or 0x84 in
   5.0 format. An empty client id is refused (3.1.1, 0x02) unless the session is clean; under 5.0 one
   is assigned (``auto-<uuid>``, told in the CONNACK). An Authentication Method (enhanced auth, not
   supported) gets 0x8C.
2. Credentials go through the hub's authentication hook (anonymous only when allowed): 3.1.1 refusals
   are 0x04 (bad credentials) / 0x05 (not authorised), 5.0 are 0x86 / 0x87. With anonymous clients
   refused and no user database, nobody gets in: 3.1.1 0x05, 5.0 0x86 (0x87 when no credentials were
   sent). A client whose TLS certificate was verified against ``security.tls_client_ca`` logs in as its
   certificate's Common Name instead (Mosquitto's ``use_identity_as_username``): that is its user name, and
   the user name and password in the CONNECT are not checked. Only then is a 5.0 Receive Maximum or
   Maximum Packet Size of 0 a protocol error (§3.1.2.11.3, §3.1.2.11.4): CONNACK 0x82 (Mosquitto closes
   without a CONNACK).
3. Terms: the keep alive is capped by ``max_keepalive`` (``HubConfig.granted_keepalive``); the session
   expiry is the 5.0 Session Expiry Interval capped at ``max_session_expiry_s`` (0xFFFFFFFF: never) or,
   for 3.1.1 clean session = 0, ``session_expiry_s``. A 5.0 CONNACK says what was changed (Assigned
   Client Identifier, Session Expiry Interval, Server Keep Alive) and what the server supports.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import MQTT_5, NO_PROPERTIES, Connect, Properties, Reason

__all__ = ["FOREVER", "Admitted", "Refused", "admit", "expiry_seconds"]

FOREVER = float("inf")
# CONNACK code per ``Hub.authenticate`` refusal: (3.1.1, 5.0). Without a user database nobody is "not
# authorised" under 3.1.1 (as Mosquitto answers); 5.0 says the credentials were not accepted.
_LOGIN_REFUSALS: dict[str, tuple[int, int]] = {
    "anonymous": (0x05, Reason.NOT_AUTHORIZED),
    "no-users": (0x05, Reason.BAD_USERNAME_OR_PASSWORD),
    "bad-credentials": (0x04, Reason.BAD_USERNAME_OR_PASSWORD),
}


@dataclass(frozen=True, slots=True)
class Refused:
    """CONNACK ``code`` in the format of protocol ``level``, then close; ``protocol_error``: rule 2's 0x82,
    answered like any protocol error (5.0 CONNACK 0x82)."""

    code: int
    level: int
    protocol_error: bool = False
    login: bool = False  # refused for its credentials (counted in ``HubStats.refused_logins``)
    why: str = ""  # for the log line of a protocol error


@dataclass(frozen=True, slots=True)
class Admitted:
    client_id: str
    username: str | None  # who the client logged in as: its certificate's CN, else the CONNECT's user name
    keepalive: int
    expiry_s: float  # how long the session outlives the connection
    connack_properties: Properties  # 5.0: what the CONNACK carries besides session present


def expiry_seconds(interval: int) -> float:
    """A Session Expiry Interval in seconds (0xFFFFFFFF: never expires)."""
    return FOREVER if interval == 0xFFFFFFFF else float(interval)


def admit(hub: Hub, packet: Connect, certificate_user: str | None = None) -> Admitted | Refused:
    """Rules 1–3 for ``packet``; ``certificate_user``: the CN of the client's verified TLS certificate."""
    level = packet.protocol_level
    cfg = hub.config
    if level not in cfg.protocol_versions:
        return Refused(0x01 if level < MQTT_5 else Reason.UNSUPPORTED_PROTOCOL_VERSION, level)
    v5 = level == MQTT_5
    props = packet.properties
    client_id = packet.client_id
    assigned = None
    if not client_id:
        if not v5 and not packet.clean_start:
            return Refused(0x02, level)
        client_id = assigned = "auto-" + uuid.uuid4().hex
    if v5 and props.authentication_method is not None:
        return Refused(Reason.BAD_AUTHENTICATION_METHOD, level)
    username = packet.username
    if certificate_user is not None:
        username = certificate_user
    else:
        refusal = hub.authenticate(client_id, packet.username, packet.password)
        if refusal is not None:
            return Refused(_LOGIN_REFUSALS[refusal][1 if v5 else 0], level, login=True)
    if v5 and props.receive_maximum == 0:
        return Refused(Reason.PROTOCOL_ERROR, level, protocol_error=True, why="Receive Maximum of 0")
    if v5 and props.maximum_packet_size == 0:
        return Refused(Reason.PROTOCOL_ERROR, level, protocol_error=True, why="Maximum Packet Size of 0")
    keepalive = cfg.granted_keepalive(packet.keepalive)
    # 5.0: the Session Expiry Interval says how long, up to our maximum (the CONNACK tells the client
    # when it was cut, §3.2.2.3.2); 3.1.1: clean session 0 keeps it for the configured time.
    requested = expiry_seconds(props.session_expiry_interval or 0)
    persistent_311 = 0.0 if packet.clean_start else cfg.session_expiry_s
    expiry = min(requested, cfg.max_session_expiry_s) if v5 else persistent_311
    ack_props = NO_PROPERTIES
    if v5:
        ack_props = cfg.connack_properties(
            assigned_client_id=assigned,
            session_expiry=int(expiry) if expiry != requested else None,
            server_keep_alive=keepalive if keepalive != packet.keepalive else None,
        )
    return Admitted(client_id, username, keepalive, expiry, ack_props)
