"""What all MQTT connections of one listener share: sessions by client id, subscriptions, retained messages.

The hub never touches sockets. It owns the ``IngestPort`` (the durable append, passed in by the assembly),
the subscription trie and retained store, and routes each durably appended message to matching sessions.
It sees connections only as ``Link``s (``ports.py``), so it imports neither the connection state machine
(``machine.py``) nor its asyncio adapter (``session.py``); both import the hub.
With a ``SessionJournal`` (``session_store.py``), persistent sessions are journaled (with a
``DurableRetainedStore``, retained messages too) and ``journaled`` says what must be durable before a
publisher's PUBACK/PUBREC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ingest.admission import Admission
from ingest.errors import IngestError
from ingest.mqtt.hub_config import HubConfig, HubStats
from ingest.mqtt.packets import Publish, Subscription, Will
from ingest.mqtt.ports import Accepted, Authenticator, IngestPort, Link, Refusal, TopicAccess
from ingest.mqtt.properties import expires_at, for_delivery, forwarded
from ingest.mqtt.session_state import NONE_YET, CompactSet, QueueBudget, SessionJournal, SessionState
from ingest.mqtt.shared import SHARE_PREFIX, Granted, SharedGroup, parse_shared
from ingest.mqtt.subscriptions import RetainedStore, SubscriptionTree

# Accepted ... Refusal: defined in ports.py / hub_config.py, re-exported for the assembly and tests
__all__ = ["Accepted", "Authenticator", "Hub", "HubConfig", "HubStats", "IngestPort", "Refusal"]

log = logging.getLogger("ingest.mqtt")
_MATCHES_KEPT = 4096  # topics whose subscribers the hub remembers (Hub._matches)


@dataclass(eq=False)
class Hub:
    port: IngestPort
    config: HubConfig = field(default_factory=HubConfig)
    authenticator: Authenticator | None = None
    access: TopicAccess | None = None  # the ACLs on topics (security.auth = required); None: all allowed
    sessions: dict[str, SessionState] = field(default_factory=dict)
    offline: OrderedDict[str, SessionState] = field(default_factory=OrderedDict)  # away longest first
    connections: CompactSet[Link] = field(default_factory=CompactSet)  # every open connection (its adapter)
    tree: SubscriptionTree[SessionState | SharedGroup, Granted] = field(default_factory=SubscriptionTree)
    shared: dict[tuple[str, str], SharedGroup] = field(default_factory=dict)  # (group, filter) -> members
    retained: RetainedStore = field(default_factory=RetainedStore)
    stats: HubStats = field(default_factory=HubStats)
    admission: Admission = field(init=False)
    queue_budget: QueueBudget = field(init=False)  # payload bytes queued in all sessions together
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    delayed_wills: dict[str, tuple[float, Will]] = field(default_factory=dict)  # client id -> (due, will)
    _messages_expired: int = 0
    _evicting: bool = False  # the offline-session cap was reached and that was logged
    store: SessionJournal | None = None  # journals persistent sessions (None: they live in memory only)
    # topic -> tree.match(topic), for the topics published lately (devices repeat theirs); emptied when a
    # subscription is added or removed, and when it holds _MATCHES_KEPT topics
    _matches: dict[str, list[tuple[SessionState | SharedGroup, Granted]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.admission = Admission("MQTT", self.config.connection_limits, log)
        self.queue_budget = QueueBudget(self.config.max_queued_bytes_total)

    # ------------------------------------------------------------------ connect / sessions
    @property
    def nobody_can_log_in(self) -> bool:
        """Anonymous clients are refused and there is no user database: every CONNECT is refused."""
        return not self.config.allow_anonymous and self.authenticator is None

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> Refusal | None:
        """None when the client may connect, else why not (the session maps it to a CONNACK code)."""
        if username is None and password is None:
            return None if self.config.allow_anonymous else "anonymous"
        if self.authenticator is None:
            # No user database: credentials cannot be checked, so they only pass where anyone may connect
            # (Mosquitto does the same). allow_anonymous = false without users locks everybody out.
            return None if self.config.allow_anonymous else "no-users"
        return None if self.authenticator(client_id, username, password) else "bad-credentials"

    def attach(self, connection: Link, client_id: str, clean: bool, expiry_s: float,
               will: Will | None = None) -> tuple[SessionState, bool]:
        """Bind ``connection`` (its CONNECT's ``will``) to the session of ``client_id``; returns (session,
        session_present)."""
        existing = self.sessions.get(client_id)
        self.offline.pop(client_id, None)
        if existing is not None and existing.connection is not None and existing.connection is not connection:
            existing.connection.take_over()
        if existing is not None and (clean or existing.expired(time.monotonic())):
            self.drop_session(existing)
            existing = None
        pending = self.delayed_wills.pop(client_id, None)
        if pending is not None:
            if existing is None:  # the session it belonged to has ended: send it now
                self.publish_will(client_id, pending[1])
            elif self.store is not None:  # cancelled: the client is back in time
                self.store.will_gone(client_id, pending[1])
        if self.store is not None:  # journaled while the connection is open (session_store.py rule 8)
            if will is not None:
                self.store.will_stored(client_id, will)
            else:
                self.store.will_gone(client_id)
        present = existing is not None
        session = existing or SessionState(client_id, self.queue_budget)
        session.expiry_s = expiry_s
        session.connection = connection
        session.ended_at = None
        self.sessions[client_id] = session
        if self.store is not None:
            self.store.attached(session)
        return session, present

    def detach(self, connection: Link, session: SessionState) -> None:
        if session.connection is not connection:
            return
        session.connection = None
        if session.expiry_s <= 0:
            self.drop_session(session)
        else:
            session.ended_at = time.monotonic()
            if self.store is not None:
                self.store.detached(session)
            self.offline[session.client_id] = session
            self._evict_offline()

    def _evict_offline(self) -> None:
        """Keep at most ``max_offline_sessions`` sessions of absent clients: end the one away longest
        (its delayed will, if any, goes out as at any session end), counted and logged once per episode."""
        cap = self.config.max_offline_sessions
        if not cap:
            return
        while len(self.offline) > cap:
            client_id, oldest = self.offline.popitem(last=False)
            self.stats.sessions_evicted += 1
            if not self._evicting:
                self._evicting = True
                log.warning("max_offline_sessions reached: the sessions of clients away longest are ended early",
                            extra={"max_offline_sessions": cap, "client_id": client_id})
            pending = self.delayed_wills.pop(client_id, None)
            self.drop_session(oldest)
            if pending is not None:
                self.publish_will(client_id, pending[1])
        if len(self.offline) < cap // 2:
            self._evicting = False

    def drop_session(self, session: SessionState) -> None:
        # Unbound first: a connection taken over by a clean start reports its loss later, and must then
        # find nothing to detach (it would park this ended session offline and journal it again).
        session.connection = None
        if self.store is not None:
            self.store.dropped(session)  # first: the unsubscribes below journal nothing then
        for topic_filter in list(session.subscriptions):
            self.unsubscribe(session, topic_filter)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if self.offline.get(session.client_id) is session:
            del self.offline[session.client_id]
        session.release()
        self._messages_expired += session.messages_expired
        session.messages_expired = 0

    # ------------------------------------------------------------------ subscriptions
    def subscribe(self, session: SessionState, sub: Subscription, sub_id: int = 0) -> bool:
        """Add (or replace) a subscription; True when the session had none on this filter."""
        topic_filter = sub.topic_filter
        if session.subscriptions is NONE_YET:
            session.subscriptions = {}
        session.subscriptions[topic_filter] = sub
        if self.store is not None:
            self.store.subscribed(session, sub, sub_id)
        if topic_filter.startswith(SHARE_PREFIX):
            parsed = parse_shared(topic_filter)
            assert parsed is not None  # validated by the connection
            group = self.shared.get(parsed)
            if group is None:
                group = self.shared[parsed] = SharedGroup(*parsed)
                self._matches.clear()
                self.tree.add(parsed[1], group, (sub, 0))
            new = session not in group.members
            group.members[session] = (sub, sub_id)
            return new
        self._matches.clear()
        return self.tree.add(topic_filter, session, (sub, sub_id))

    def unsubscribe(self, session: SessionState, topic_filter: str) -> bool:
        if session.subscriptions.pop(topic_filter, None) is None:
            return False
        if self.store is not None:
            self.store.unsubscribed(session, topic_filter)
        self._matches.clear()
        if not topic_filter.startswith(SHARE_PREFIX):
            return self.tree.remove(topic_filter, session)
        parsed = parse_shared(topic_filter)
        group = self.shared.get(parsed) if parsed is not None else None
        if group is None or group.members.pop(session, None) is None:
            return False
        if not group.members:
            del self.shared[(group.name, group.topic_filter)]
            self.tree.remove(group.topic_filter, group)
        for packet, expiry in session.take_shared(group):  # shared rule 4
            self._offer_shared(group, packet, expiry, packet.qos)
        return True

    # ------------------------------------------------------------------ routing
    def journaled(self, session: SessionState, batch: Sequence[Accepted]) -> Awaitable[object] | None:
        """``batch`` of ``session``'s client is appended and routed: what must complete before its
        PUBACK/PUBREC go out (the copies for persistent sessions and the retained messages it caused, its
        inbound QoS 2 ids: ``session_store.py`` rule 4); None when nothing is left to wait for."""
        store = self.store
        if store is None:
            return None
        if session.store is store:
            for msg, pid, _ in batch:
                if msg.qos == 2:
                    store.awaiting(session, pid)
        return store.durable()

    def deliver(self, client_id: str, messages: Sequence[Accepted]) -> None:
        """Route durably appended messages: retained store, then every matching subscriber."""
        tree = self.tree
        now = time.monotonic()
        if not len(tree):  # nobody subscribed (devices that only publish): only retained messages matter
            messages = [m for m in messages if m[0].retain]
        cache = self._matches
        config, stats = self.config, self.stats
        for msg, _, _ in messages:
            props = forwarded(msg.properties)
            expiry = expires_at(props, now)
            if msg.retain:
                self.retained.store(msg if props is msg.properties else replace(msg, properties=props), expiry)
            if not len(tree):
                continue
            matches = cache.get(msg.topic)
            if matches is None:
                if len(cache) >= _MATCHES_KEPT:
                    cache.clear()
                matches = cache[msg.topic] = tree.match(msg.topic)
            if not matches:
                continue
            if len(matches) == 1:  # the common case, without the merging below
                key, (sub, sub_id) = matches[0]
                if type(key) is SessionState:
                    if not (sub.no_local and key.client_id == client_id):
                        key.offer(Publish(msg.topic, msg.payload, min(msg.qos, sub.qos),
                                          msg.retain and sub.retain_as_published, False, None,
                                          props if not sub_id else replace(props, subscription_identifier=(sub_id,))),
                                  expiry, config, stats)
                    continue
            best: dict[SessionState, list[Any]] = {}  # session -> [qos, retain as published, ids]
            for key, (sub, sub_id) in matches:
                if isinstance(key, SharedGroup):
                    self._offer_shared(key, Publish(msg.topic, msg.payload, 0, False, False, None, props), expiry,
                                       msg.qos)
                    continue
                if sub.no_local and key.client_id == client_id:
                    continue
                entry = best.get(key)
                if entry is None:
                    best[key] = [sub.qos, sub.retain_as_published, (sub_id,) if sub_id else ()]
                else:  # overlapping subscriptions: one delivery, the highest QoS, every identifier (§3.3.4)
                    entry[0] = max(entry[0], sub.qos)
                    entry[1] = entry[1] or sub.retain_as_published
                    if sub_id:
                        entry[2] += (sub_id,)
            for session, (qos, rap, ids) in best.items():
                out_props = props if not ids else replace(props, subscription_identifier=ids)
                session.offer(
                    Publish(msg.topic, msg.payload, min(msg.qos, qos), msg.retain and rap, False, None, out_props),
                    expiry, self.config, self.stats,
                )

    def _offer_shared(self, group: SharedGroup, packet: Publish, expiry: float | None, qos: int,
                      exclude: SessionState | None = None) -> None:
        chosen = group.choose(exclude)
        if chosen is None:
            self.stats.dropped_deliveries += 1
            return
        session, (sub, sub_id) = chosen
        ids = (sub_id,) if sub_id else ()
        props = packet.properties
        if props.subscription_identifier != ids:  # this member's own (a message moved from another has theirs)
            props = replace(props, subscription_identifier=ids)
        session.offer(replace(packet, qos=min(qos, sub.qos), retain=False, properties=props), expiry, self.config,
                      self.stats, group)

    def send_retained(self, session: SessionState, sub: Subscription, sub_id: int) -> None:
        """The retained messages matching a new subscription (RETAIN=1, remaining expiry)."""
        now = time.monotonic()
        for msg, expiry in self.retained.matching(sub.topic_filter, now):
            props = msg.properties if not sub_id else replace(msg.properties, subscription_identifier=(sub_id,))
            packet = for_delivery(
                Publish(msg.topic, msg.payload, min(msg.qos, sub.qos), True, False, None, props), expiry, now
            )
            if packet is not None:
                session.offer(packet, expiry, self.config, self.stats)  # if it waits in the queue, it still expires

    # ------------------------------------------------------------------ wills
    def will_due(self, client_id: str, will: Will, session_expiry_s: float) -> None:
        """A connection ended without a normal DISCONNECT: publish its will now, or after its Will Delay
        Interval, or when its session ends if that is sooner (§3.1.3.2.2); a reconnect in time cancels it."""
        delay = min(float(will.properties.will_delay_interval or 0), session_expiry_s)
        if delay <= 0:
            self.publish_will(client_id, will)
        else:
            self.delayed_wills[client_id] = (time.monotonic() + delay, will)
            if self.store is not None:
                self.store.will_stored(client_id, will, int(time.time() * 1000 + delay * 1000))

    def will_discarded(self, client_id: str) -> None:
        """A normal DISCONNECT deleted the connection's will (§3.1.2.5)."""
        if self.store is not None:
            self.store.will_gone(client_id)

    def publish_will(self, client_id: str, will: Will) -> None:
        """Publish a will: appended like any message (with its properties), then delivered."""
        msg = Publish(will.topic, will.payload, will.qos, will.retain, False, None, forwarded(will.properties))
        self.stats.wills_published += 1
        log.info("publishing will", extra={"client_id": client_id, "topic": will.topic})
        self.spawn(self._append_and_deliver(client_id, [(msg, 0, int(time.time() * 1000))], will))

    async def _append_and_deliver(self, client_id: str, messages: list[Accepted], will: Will | None = None) -> None:
        try:
            await self.port.ingest(client_id, messages)
        except Exception as exc:
            self.stats.append_errors += 1
            if isinstance(exc, IngestError):  # a storage failure: the sink has logged why
                log.error("will message not stored", extra={"client_id": client_id, "topic": messages[0][0].topic})
            else:
                log.exception("append of will message failed", extra={"topic": messages[0][0].topic})
            return  # a journaled will stays journaled: a restart publishes it
        if will is not None and self.store is not None:
            self.store.will_gone(client_id, will)
        self.deliver(client_id, messages)

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ housekeeping
    def sweep(self, now: float) -> None:
        """Keepalive (1.5 × the client's value), connect timeouts, delayed wills, expired messages and
        expired offline sessions."""
        for connection in list(self.connections):
            connection.check_timeout(now)
        for client_id, (due, will) in list(self.delayed_wills.items()):
            if due <= now:
                del self.delayed_wills[client_id]
                self.publish_will(client_id, will)
        self._messages_expired += self.retained.drop_expired(now)
        for session in list(self.sessions.values()):
            if session.connection is None and session.expired(now):
                self.stats.sessions_expired += 1
                log.info("session expired", extra={"client_id": session.client_id, "expiry_s": session.expiry_s})
                self.drop_session(session)
                continue
            session.drop_expired(now)
            self._messages_expired += session.messages_expired
            session.messages_expired = 0
        self.stats.messages_expired = self._messages_expired

    async def drain(self, timeout: float) -> None:
        """Wait for in-flight appends (connection workers, wills) to finish, up to ``timeout``."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
