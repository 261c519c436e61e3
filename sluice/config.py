"""Typed configuration: defaults < TOML file < ``SLUICE_*`` environment < command-line flags.

Nested sections use a double underscore in the environment: ``SLUICE_KAFKA__PORT=19092``.
Each front door owns one section; a port of 0 binds an ephemeral port (tests), ``enabled=false``
switches a listener off.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from broker.log.api import MAX_PARTITIONS, PartitionLimits
from broker.log.config import FlushPolicy, TopicConfig, Visibility
from broker.log.indexcache import DEFAULT_INDEX_CACHE_BYTES

__all__ = [
    "FileSourceSettings",
    "HttpSettings",
    "IngestSettings",
    "KafkaListenerSettings",
    "KafkaSettings",
    "MqttBridgeSettings",
    "MqttSettings",
    "SecuritySettings",
    "Settings",
    "StorageSettings",
    "TcpListenerSettings",
    "TcpSettings",
    "describe_errors",
    "load_settings",
    "setting_variables",
    "unknown_variables",
]


class _Section(BaseModel):
    """A settings section: a key it does not have (a typo in the TOML file or in ``SLUICE_SECTION__KEY``) is
    refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


class StorageSettings(_Section):
    backend: Literal["segment", "memory"] = "segment"
    flush: FlushPolicy = FlushPolicy.ALWAYS
    flush_interval_ms: int = 1000
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    max_message_bytes: int = 1024 * 1024 + 12
    default_partitions: int = 1
    auto_create_topics: bool = True
    retention_check_interval_s: float = 60.0
    cleaner_interval_s: float = 15.0  # log compaction passes (Kafka's log.cleaner.backoff.ms)
    # With flush=always, consumers see a record once it is fsynced ("durable") or once written ("written").
    visibility: Visibility = Visibility.DURABLE
    # Descriptors segment files may hold at once, all partitions together; 0 = half the soft RLIMIT_NOFILE.
    max_open_files: int = Field(default=0, ge=0)  # otherwise at least 4 (one segment's files)
    # Memory closed segments' sparse indexes may hold, all partitions together (least recently used
    # dropped and read from their files again on use); 0 = no bound.
    index_cache_bytes: int = Field(default=DEFAULT_INDEX_CACHE_BYTES, ge=0)
    # Partitions one request may create (Kafka's controller: 10,000), and the most the broker holds.
    max_partitions_per_request: int = Field(default=MAX_PARTITIONS, ge=1)
    max_partitions: int = Field(default=50_000, ge=1)
    # Disk blocks each partition's active segment reserves ahead of its end (fallocate, the file size
    # unchanged; given back when the segment rolls or the partition closes): appends then skip ext4's
    # delayed allocation per page. 0 turns it off (file systems that cannot do it are skipped).
    preallocate_bytes: int = Field(default=4 * 1024 * 1024, ge=0)

    def partition_limits(self) -> PartitionLimits:
        return PartitionLimits(per_request=self.max_partitions_per_request, total=self.max_partitions)

    def topic_defaults(self) -> TopicConfig:
        return TopicConfig(
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            flush=self.flush,
            flush_interval_ms=self.flush_interval_ms,
            max_message_bytes=self.max_message_bytes,
        )


class KafkaListenerSettings(_Section):
    """A second Kafka port (``[[kafka.extra_listeners]]``) whose clients are told its own advertised address.

    Environment form: ``SLUICE_KAFKA__EXTRA_LISTENERS='[{"name":"internal","port":29092,"advertised_host":"sluice"}]'``.
    """

    name: str
    port: int
    host: str | None = None  # bind address; defaults to the top-level host
    advertised_host: str | None = None  # defaults to the bind host
    advertised_port: int | None = None  # defaults to the bound port


class KafkaSettings(_Section):
    enabled: bool = True
    port: int = 9092
    advertised_host: str | None = None  # defaults to the bind host
    advertised_port: int | None = None  # defaults to the bound port
    max_request_bytes: int = 100 * 1024 * 1024
    # With security.auth = "required": a frame before the SASL login may be at most this (Kafka's
    # sasl.server.max.receive.size); a larger one closes the connection unanswered.
    sasl_max_receive_bytes: int = Field(default=512 * 1024, ge=1)
    extra_listeners: list[KafkaListenerSettings] = Field(default_factory=list)
    # Bytes at the end of each partition read on start to rebuild idempotent-producer sequence state.
    producer_state_scan_bytes: int = 8 * 1024 * 1024
    # Kafka's connections.max.idle.ms: close a connection with no traffic for this long (0 = never).
    connections_max_idle_ms: int = 10 * 60 * 1000
    # Connections over a limit are closed at once, counted and logged (0 = no limit).
    max_connections: int = 1000  # all Kafka listeners together
    max_connections_per_address: int = 0  # per client IP address (Kafka's max.connections.per.ip)
    group_initial_rebalance_delay_ms: int = Field(default=3000, ge=0)  # Kafka's group.initial.rebalance.delay.ms
    offsets_retention_check_interval_ms: int = Field(default=600_000, gt=0)  # offsets.retention.check.interval.ms
    # Kafka's offsets.retention.minutes (7 days); fractions allowed (Kafka's is whole minutes)
    offsets_retention_minutes: float = Field(default=10_080, gt=0)
    producer_id_expiration_ms: int = Field(default=86_400_000, ge=1)  # Kafka's producer.id.expiration.ms
    producer_id_expiration_check_interval_ms: int = Field(default=600_000, ge=1)  # how often idle ids are swept
    # Transactions (Kafka's names): the longest transaction.timeout.ms a producer may ask for, how often
    # transactions past their timeout are aborted, and how long an unused transactional.id is kept.
    transaction_max_timeout_ms: int = Field(default=900_000, gt=0)
    transaction_abort_check_interval_ms: int = Field(default=10_000, gt=0)
    transactional_id_expiration_ms: int = Field(default=7 * 24 * 3600 * 1000, gt=0)

    @field_validator("extra_listeners")
    @classmethod
    def _unique_listener_names(cls, value: list[KafkaListenerSettings]) -> list[KafkaListenerSettings]:
        names = [listener.name for listener in value]
        if len(set(names)) != len(names) or "default" in names:
            raise ValueError(f"extra listener names must be unique and not 'default': {names}")
        return value


class MqttBridgeSettings(_Section):
    """An external MQTT broker to subscribe to (``[[mqtt.bridges]]``); acks it only after the durable append."""

    name: str = "default"  # routing source name: SourceRef("bridge", name)
    host: str = "127.0.0.1"
    port: int = 1883
    topics: list[str] = Field(default_factory=lambda: ["#"])
    client_id: str = "sluice-bridge"  # fixed: the broker keeps our persistent session under it
    username: str | None = None
    password: str | None = None
    protocol: Literal[4, 5] = 4  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
    keepalive_s: int = 30
    max_inflight: int = 100  # QoS 1 messages the broker may send before our acks
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


class MqttSettings(_Section):
    enabled: bool = True
    port: int = 1883  # plain MQTT (Mosquitto's default listener)
    # Listeners, each on its own port as in Mosquitto: plain MQTT on ``port`` (and WebSockets on ``ws_port``)
    # unless ``plaintext`` is false; with security.tls_cert/tls_key also MQTT over TLS on ``tls_port`` (and
    # secure WebSockets on ``wss_port``). WebSockets (subprotocol "mqtt", EMQX's ports) are off unless
    # ``websockets`` is true. All of them share one hub: a client may take its session across them.
    plaintext: bool = True
    tls_port: int = 8883
    websockets: bool = False
    ws_port: int = 8083
    wss_port: int = 8084
    allow_anonymous: bool = True
    users: dict[str, str] = Field(default_factory=dict)  # username -> password for the built-in auth hook
    max_packet_bytes: int = 1024 * 1024 + 1024
    receive_maximum: int = 1024  # inbound QoS 1/2 in flight per connection; reads pause at this many
    topic_alias_maximum: int = 32
    max_queued_messages: int = 10_000  # per persistent session
    max_queued_bytes: int = 16 * 1024 * 1024  # per session: payload bytes waiting for an offline or slow client
    max_queued_bytes_total: int = Field(default=256 * 1024 * 1024, ge=0)  # all sessions together (0 = no bound)
    max_offline_sessions: int = Field(default=100_000, ge=0)  # beyond it the client away longest loses its session
    session_expiry_s: int = Field(default=86_400, ge=0, le=0xFFFFFFFF)  # 3.1.1 clean session = 0 sessions
    max_session_expiry_s: int = Field(default=86_400, ge=0, le=0xFFFFFFFF)  # cap on MQTT 5 Session Expiry
    connect_timeout_s: float = 10.0
    # Mosquitto's max_keepalive: a client asking for more, or for 0, is held to it.
    max_keepalive_s: int = Field(default=65_535, ge=0, le=65_535)  # given to clients asking more or 0; 0 = no max
    max_connections: int = Field(default=10_000, ge=0)  # open at once; more are closed at accept (0 = no limit)
    max_connections_per_address: int = Field(default=0, ge=0)  # open at once from one client IP (0 = no limit)
    protocol_versions: list[int] = Field(default_factory=lambda: [4, 5])  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
    deliver_from_topics: list[str] = Field(default_factory=list)  # topics whose records (mqtt_topic header) reach MQTT
    durable: bool = True  # persistent sessions and retained messages survive restarts (internal compacted topics)
    backlog: int = 4096
    # Idle plain-TCP connections give up their asyncio transport (~1.3 KB each) and wait on one shared epoll
    # (ingest/mqtt/parking.py; Linux); they get one back when busy.
    park_idle: bool = True  # idle plain-TCP connections hold no transport (false: every connection keeps one)
    park_after_s: float = Field(default=10.0, ge=0)  # a busy connection is parked again after this long without reads
    bridges: list[MqttBridgeSettings] = Field(default_factory=list)


class TcpListenerSettings(_Section):
    """An extra TCP line listener (``[[tcp.listeners]]``), e.g. one per payload format."""

    name: str
    port: int
    format: Literal["ndjson", "influx", "csv"] = "ndjson"
    ack: bool = False


class TcpSettings(_Section):
    enabled: bool = True
    port: int = 8094
    format: Literal["ndjson", "influx", "csv"] = "ndjson"
    ack: bool = False  # answer each batch of lines once durable (docs/ingest.md: ack mode)
    max_line_bytes: int = 64 * 1024  # longer lines go to the dead-letter topic (truncated), not a crash
    idle_timeout_s: float = 300.0  # close connections silent for this long (0 = never)
    read_bytes: int = 64 * 1024  # bytes read per batch of lines
    backlog: int = 4096
    max_connections: int = Field(default=10_000, ge=0)  # all TCP listeners together; more are closed (0 = no limit)
    max_connections_per_address: int = Field(default=0, ge=0)  # open at once from one client IP (0 = no limit)
    auth_timeout_s: float = Field(default=10.0, gt=0)  # security.auth = required: time for the first AUTH line
    listeners: list[TcpListenerSettings] = Field(default_factory=list)


class FileSourceSettings(_Section):
    """A file replayed or tailed into the log (``[[ingest.files]]``)."""

    name: str
    path: Path
    topic: str | None = None  # None: routed by the rules / default topic "file"
    format: Literal["ndjson", "influx", "csv", "raw"] = "raw"
    mode: Literal["replay", "tail"] = "tail"
    start: Literal["beginning", "end"] = "beginning"  # where to start when no position is saved
    key: str = "default"  # key spec, as in routes
    time_field: str = "default"
    time_format: str = "epoch_ms"
    poll_interval_s: float = 0.5
    max_line_bytes: int = 64 * 1024
    read_bytes: int = 64 * 1024


class IngestSettings(_Section):
    """Routing rules, dead letters, backpressure and source health for every device front door."""

    routes: list[dict[str, Any]] = Field(default_factory=list)  # see ingest.routing.RouteRule.from_mapping
    dead_letter_topic: str = "_dead_letters"
    default_mqtt_topic: str = "mqtt"
    default_tcp_topic: str = "tcp"
    default_file_topic: str = "file"
    # Sensor readings (MQTT ``sensors/<id>``; TCP JSON lines with a ``sensor`` field) go here, keyed by
    # sensor, event time from ``ts`` (epoch ms), before the catch-alls above; "" switches this off.
    sensors_topic: str = "sensors"
    max_pending_bytes: int = 64 * 1024 * 1024  # accepted-but-not-durable bytes before sources are paused
    # TCP lines without ack mode and file lines: a small write following the source's last one by less than
    # this waits until then, with the reads that come meanwhile (docs/ingest.md; 0 = write every loop turn)
    coalesce_ms: float = Field(default=1.0, ge=0, le=1000)
    idle_timeout_s: float = 300.0  # a source/device silent this long is reported idle
    max_devices_per_source: int = 100_000
    files: list[FileSourceSettings] = Field(default_factory=list)


class HttpSettings(_Section):
    enabled: bool = True
    port: int = 8080
    console: bool = True  # the web console at /console (sluice/console)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)  # larger request bodies: 413, refused while streaming


class SecuritySettings(_Section):
    """Who may use the front doors (``broker.security``). Users live in ``<data_dir>/security/users.json``
    (``sluice users add NAME --data-dir DIR``), bearer tokens in ``tokens.json``, ACLs in ``acls.json``."""

    # "required": Kafka clients log in with SASL (PLAIN, SCRAM-SHA-256/512), MQTT clients with a user name
    # and password from the user store, TCP line senders with a first "AUTH user password" line, HTTP callers
    # with Basic or a bearer token; the ACLs are enforced on every front door. "off": nobody is asked, nothing
    # is checked (MQTT keeps mqtt.allow_anonymous/mqtt.users), and every listener must be bound to loopback.
    auth: Literal["off", "required"] = "off"
    super_users: list[str] = Field(default_factory=list)  # principals every ACL allows ("alice" or "User:alice")
    open_metrics: bool = False  # /metrics without credentials (else: describe on the cluster) when auth is required
    # With auth off, a listener bound beyond loopback refuses to start unless this is true (then a WARNING).
    allow_insecure: bool = False  # start with auth off on non-loopback addresses (an open broker)
    # Kafka produce quota per principal (bytes/s over 11 one-second windows; 0 = none): over it, Produce answers
    # carry throttle_time_ms and the connection is muted that long (Kafka's user quota, producer_byte_rate).
    produce_quota_bytes_per_s: int = Field(default=0, ge=0)  # the default for every principal (0 = no quota)
    produce_quota_overrides: dict[str, int] = Field(default_factory=dict)  # user name -> bytes/s (0 = unlimited)
    quota_window_num: int = Field(default=11, ge=2)  # samples the rate is measured over (Kafka's quota.window.num)
    quota_window_size_s: float = Field(default=1.0, gt=0)  # one sample's length (quota.window.size.seconds)
    # TLS (docs/security.md): with both set, every listener speaks TLS — Kafka (SSL / SASL_SSL on its port),
    # HTTPS, the TCP line listeners, MQTT on mqtt.tls_port (and mqtt.wss_port). PEM files; SIGHUP reloads them.
    tls_cert: Path | None = None  # the server's certificate, followed by any intermediate CA certificates
    tls_key: Path | None = None  # its private key
    tls_key_password: SecretStr | None = None  # only for an encrypted key
    tls_client_ca: Path | None = None  # CA(s) client certificates must chain to; set: clients may log in by certificate
    # "requested": a client without a certificate logs in as usual; "required": the handshake needs one
    tls_client_auth: Literal["requested", "required"] = "requested"
    tls_handshake_timeout_s: float = Field(default=10.0, gt=0)  # an unfinished handshake is closed after this

    @model_validator(mode="after")
    def _tls_pair(self) -> SecuritySettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("security.tls_cert and security.tls_key are set together (or neither)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("security.tls_client_ca needs security.tls_cert and security.tls_key")
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SLUICE_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    data_dir: Path = Path("./sluice-data")
    host: str = "127.0.0.1"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    storage: StorageSettings = Field(default_factory=StorageSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    tcp: TcpSettings = Field(default_factory=TcpSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    processors: list[str] = Field(default_factory=list)  # "module:attribute" pipelines run in-process
    # attached processors: at-least-once, or exactly-once (each checkpoint interval one transaction of
    # the broker's coordinator; needs the Kafka listener; readers use read_committed)
    processor_guarantee: Literal["at-least-once", "exactly-once"] = "at-least-once"
    processor_checkpoint_interval_ms: int = 10_000
    # at most this many keys' state live in memory per keyed operator; the rest spill to RocksDB under
    # <data_dir>/processor-state (scratch, emptied at start). None: no bound
    processor_state_max_keys: int | None = None

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _an_mqtt_listener_is_left(self) -> Settings:
        if self.mqtt.enabled and not self.mqtt.plaintext and not self.security.tls_enabled:
            raise ValueError("mqtt.plaintext = false leaves no MQTT listener without security.tls_cert and "
                             "security.tls_key: set them, or mqtt.enabled = false")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win; pydantic-settings deep-merges nested sections.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings; ``overrides`` are flag values (nested as dicts, e.g. ``kafka={"port": 0}``)."""
    settings_cls: type[Settings] = Settings
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"config file {config_file} does not exist")

        class FileSettings(Settings):
            model_config = SettingsConfigDict(**{**Settings.model_config, "toml_file": config_file})

        settings_cls = FileSettings
    return settings_cls(**{k: v for k, v in overrides.items() if v is not None})


# -- telling a user what is wrong -----------------------------------------------------------------------------

# SLUICE_* variables that are not settings of `sluice serve`: the clients' login (clients/security.py), the
# CLI's addresses (sluice/cli_common.py), the compose stack's first password, the build and the tests.
OTHER_VARIABLES = frozenset({"SLUICE_USER", "SLUICE_PASSWORD", "SLUICE_TLS_CA", "SLUICE_SASL_MECHANISM",
                             "SLUICE_TOKEN", "SLUICE_HTTP", "SLUICE_BOOTSTRAP", "SLUICE_ADMIN_PASSWORD",
                             "SLUICE_PURE_PYTHON"})
_OTHER_PREFIXES = ("SLUICE_TEST_",)


def _variable_of(loc: tuple[int | str, ...]) -> str | None:
    """The environment variable that sets the setting at ``loc`` (None inside a list given as one JSON value)."""
    parts: list[str] = []
    model: type[BaseModel] | None = Settings
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        parts.append(part.upper())
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return "SLUICE_" + "__".join(parts) if parts else None


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc))


def _section_fields(loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the section holding ``loc``'s last part (for a "did you mean")."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = typing.get_args(annotation)
        inner = args[0] if typing.get_origin(annotation) is list and args else annotation
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return list(model.model_fields)


def describe_errors(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """One line per wrong setting: where it is, which variable (or ``flags``: setting path -> command-line
    flag) sets it, what is wrong, and the value given."""
    lines = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        where = _path(loc)
        if error["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(loc[-1]), _section_fields(loc), n=1)
            hint = f" (did you mean {_path((*loc[:-1], guess[0]))}?)" if guess else ""
            lines.append(f"{where}: no such setting{hint}; every setting is listed in docs/configuration.md")
            continue
        message = error["msg"].removeprefix("Value error, ")  # our validators' sentences stand alone
        if error["type"] == "value_error":
            lines.append(message if not where or where in message else f"{where}: {message}")
            continue
        variable = _variable_of(loc)
        given = f", got {error['input']!r}" if not isinstance(error["input"], dict | list) else ""
        flag = (flags or {}).get(where)
        source = f" ({variable}{' or ' + flag if flag else ''})" if variable and where else ""
        lines.append(f"{where or 'settings'}{source}: {message}{given}")
    return "; ".join(lines)


def setting_variables() -> set[str]:
    """Every ``SLUICE_*`` variable that sets something (a list of sections is one variable)."""
    found: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name.upper()}__")
            else:
                found.add(f"{prefix}{name.upper()}")

    walk(Settings, "SLUICE_")
    return found


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A sentence for each ``SLUICE_*`` variable that sets nothing (a typo such as ``SLUICE_KAFKA_PORT``):
    pydantic-settings ignores them, so ``sluice serve`` warns."""
    known = setting_variables()
    sections = {name.split("__")[0] for name in known if "__" in name}
    out = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("SLUICE_") or upper in known or upper in OTHER_VARIABLES:
            continue
        if upper.startswith(_OTHER_PREFIXES) or upper.split("__")[0] in sections:
            continue  # a section's own keys are checked by the section (extra = "forbid")
        guess = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        hint = f" (did you mean {guess[0]}? sections nest with a double underscore)" if guess else ""
        out.append(f"environment variable {name} is not a setting and is ignored{hint}; every setting is "
                   "listed in docs/configuration.md")
    return out
