"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44).

Topic configs are described, changed and validated through ``broker.log.config`` (the one source
of truth; the HTTP API uses it too). Sources as Kafka reports them: ``DYNAMIC_TOPIC_CONFIG`` for a
value set on the topic, ``STATIC_BROKER_CONFIG`` for a Sluice broker default that differs from
Kafka's (``SLUICE_STORAGE__*``), ``DEFAULT_CONFIG`` otherwise; with synonyms (v1+) listed most
specific first, as Kafka does. Broker configs are described read-only: they are set at start.

AlterConfigs replaces a topic's whole set of overrides (what it does not name reverts to the
default); IncrementalAlterConfigs applies SET/DELETE/APPEND/SUBTRACT to single configs. Both check
every config of a resource before changing any, honour ``validate_only``, and log each refusal once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from broker.errors import BrokerError, InvalidConfigError
from broker.log.config import KAFKA_CONFIG_NAMES, TopicConfig, validate_kafka_configs
from broker.log.config_defs import CONFIG_DEFS, SLUICE_CONFIGS, ConfigDef, ConfigType, parse_config
from broker.protocol.kafka_codes import ErrorCode
from broker.server.handlers_common import NODE_ID, BrokerContext, ConnectionInfo, error_code_for

__all__ = ["created_topic_configs", "handle_alter_configs", "handle_describe_configs",
           "handle_incremental_alter_configs"]

log = logging.getLogger("broker.server.kafka")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

_DOCS = {
    "single-node": "Accepted and reported; no effect on a single-node broker.",
    "accepted": "Accepted, validated and reported; Sluice does not act on it.",
}


def _definition(name: str) -> ConfigDef:
    return CONFIG_DEFS.get(name) or SLUICE_CONFIGS[name]


def _topic_entry(name: str, config: TopicConfig, defaults: TopicConfig, synonyms: bool) -> dict[str, Any]:
    definition = _definition(name)
    broker_name = definition.broker_synonyms[0] if definition.broker_synonyms else name
    default_value = defaults.kafka_value(name)
    chain: list[dict[str, Any]] = []
    overrides = config.overridden()
    if name in overrides:
        chain.append({"name": name, "value": overrides[name], "source": SOURCE_TOPIC})
    if default_value != definition.default:
        chain.append({"name": broker_name, "value": default_value, "source": SOURCE_STATIC_BROKER})
    chain.append({"name": broker_name, "value": definition.default, "source": SOURCE_DEFAULT})
    return {
        "name": name, "value": config.kafka_value(name), "read_only": False,
        "config_source": chain[0]["source"], "is_default": chain[0]["source"] == SOURCE_DEFAULT,
        "is_sensitive": False, "synonyms": chain if synonyms else [], "config_type": int(definition.type),
        "documentation": _DOCS.get(definition.effect),
    }


def created_topic_configs(ctx: BrokerContext, config: TopicConfig) -> list[dict[str, Any]]:
    """Every config of a topic just created (or validated), as CreateTopics v5+ answers them."""
    entries = [_topic_entry(name, config, ctx.store.default_config, False) for name in KAFKA_CONFIG_NAMES]
    return [{k: e[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")} for e in entries]


def broker_configs(ctx: BrokerContext) -> dict[str, tuple[str, str, ConfigType]]:
    """Broker config name -> (value, Kafka's default, type): the broker-level synonyms of every topic
    config Sluice's defaults decide, plus the broker settings clients ask about."""
    defaults = ctx.store.default_config
    out: dict[str, tuple[str, str, ConfigType]] = {
        "broker.id": (str(NODE_ID), "-1", ConfigType.INT),
        "num.partitions": (str(ctx.store.default_partitions), "1", ConfigType.INT),
        "auto.create.topics.enable": (str(ctx.store.auto_create_topics).lower(), "true", ConfigType.BOOLEAN),
        "default.replication.factor": ("1", "1", ConfigType.INT),
        "offsets.topic.replication.factor": ("1", "3", ConfigType.SHORT),
    }
    for name in KAFKA_CONFIG_NAMES:
        definition = _definition(name)
        if definition.broker_synonyms:
            out[definition.broker_synonyms[0]] = (defaults.kafka_value(name), definition.default, definition.type)
    return out


async def handle_describe_configs(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    synonyms = bool(getattr(body, "include_synonyms", False))
    for resource in body.resources:
        rtype, rname = int(resource.resource_type), str(resource.resource_name)
        keys = None if resource.configuration_keys is None else set(resource.configuration_keys)
        result: dict[str, Any] = {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": rtype,
                                  "resource_name": rname, "configs": []}
        results.append(result)
        if rtype == RESOURCE_TOPIC:
            try:
                config = ctx.store.topic(rname).config
            except BrokerError as exc:
                _refuse(result, error_code_for(exc), str(exc), conn, "DescribeConfigs")
                continue
            result["configs"] = [_topic_entry(name, config, ctx.store.default_config, synonyms)
                                 for name in KAFKA_CONFIG_NAMES if keys is None or name in keys]
        elif rtype == RESOURCE_BROKER and rname in ("", str(NODE_ID)):
            result["configs"] = [
                {"name": name, "value": value, "read_only": True,
                 "config_source": SOURCE_DEFAULT if value == default else SOURCE_STATIC_BROKER,
                 "is_default": value == default, "is_sensitive": False, "config_type": int(kind),
                 "synonyms": [{"name": name, "value": value,
                               "source": SOURCE_DEFAULT if value == default else SOURCE_STATIC_BROKER}]
                 if synonyms else [],
                 "documentation": None}
                for name, (value, default, kind) in sorted(broker_configs(ctx).items())
                if keys is None or name in keys
            ]
        else:
            _refuse(result, ErrorCode.INVALID_REQUEST, _unsupported_resource(rtype, rname), conn, "DescribeConfigs")
    return {"throttle_time": 0, "results": results}


def _unsupported_resource(rtype: int, rname: str) -> str:
    if rtype == RESOURCE_BROKER:
        return f"broker {rname!r} is not this broker (node id {NODE_ID})"
    return f"config resource type {rtype} is not served by Sluice (topics: 2, broker: 4)"


def _refuse(result: dict[str, Any], code: ErrorCode, message: str, conn: ConnectionInfo, api: str) -> None:
    result["error_code"], result["error_message"] = code, message
    log.warning(f"{api} refused: {message}", extra={
        "resource": result.get("resource_name"), "error": code.name, "peer": conn.peer_host})


async def _apply(
    ctx: BrokerContext, result: dict[str, Any], overrides: Mapping[str, str], validate_only: bool,
    conn: ConnectionInfo, api: str,
) -> None:
    """Validate a topic's new override set and store it unless ``validate_only``."""
    name = str(result["resource_name"])
    try:
        new = ctx.store.default_config.from_overrides(overrides)
        if not validate_only:
            await ctx.store.alter_topic_config(name, new)
            log.info("topic config changed", extra={"topic": name, "overrides": dict(new.overrides),
                                                    "peer": conn.peer_host})
    except InvalidConfigError as exc:
        _refuse(result, ErrorCode.INVALID_CONFIG, str(exc), conn, api)
    except BrokerError as exc:
        _refuse(result, error_code_for(exc), str(exc), conn, api)


def _start(ctx: BrokerContext, resource: Any, conn: ConnectionInfo, api: str) -> tuple[dict[str, Any], bool]:
    """The response entry for one resource and whether the resource can be altered at all."""
    rtype, rname = int(resource.resource_type), str(resource.resource_name)
    result: dict[str, Any] = {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": rtype,
                              "resource_name": rname}
    if rtype == RESOURCE_BROKER:
        _refuse(result, ErrorCode.INVALID_REQUEST,
                "Sluice's broker configs are static: set them with SLUICE_STORAGE__* settings and restart",
                conn, api)
        return result, False
    if rtype != RESOURCE_TOPIC:
        _refuse(result, ErrorCode.INVALID_REQUEST, _unsupported_resource(rtype, rname), conn, api)
        return result, False
    if not ctx.store.has_topic(rname):
        _refuse(result, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {rname!r}", conn, api)
        return result, False
    duplicates = sorted(name for name, n in Counter(str(c.name) for c in resource.configs).items() if n > 1)
    if duplicates:  # Kafka (KRaft) refuses these in AlterConfigs too, where ZooKeeper-era brokers kept the last
        _refuse(result, ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys: {duplicates}", conn, api)
        return result, False
    return result, True


async def handle_alter_configs(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for resource in body.resources:
        result, ok = _start(ctx, resource, conn, "AlterConfigs")
        responses.append(result)
        if not ok:
            continue
        try:
            overrides = validate_kafka_configs({str(c.name): c.value for c in resource.configs})
        except InvalidConfigError as exc:
            _refuse(result, ErrorCode.INVALID_CONFIG, str(exc), conn, "AlterConfigs")
            continue
        await _apply(ctx, result, overrides, bool(body.validate_only), conn, "AlterConfigs")
    return {"throttle_time": 0, "responses": responses}


def _incremental(current: TopicConfig, ops: list[tuple[str, int, str | None]]) -> dict[str, str]:
    """The topic's override set after SET/DELETE/APPEND/SUBTRACT (Kafka's rules for list configs)."""
    overrides = current.overridden()
    for name, op, value in ops:
        definition = CONFIG_DEFS.get(name) or SLUICE_CONFIGS.get(name)
        if definition is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        if op == OP_SET:
            overrides[name] = "" if value is None else value
        elif op == OP_DELETE:
            overrides.pop(name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if definition.type is not ConfigType.LIST:
                verb = "append" if op == OP_APPEND else "subtract"
                raise InvalidConfigError(f"Config value {verb} is not allowed for config key: {name}")
            have = parse_config(name, current.kafka_value(name))
            given = parse_config(name, value or "")
            assert isinstance(have, tuple) and isinstance(given, tuple)
            items = ([*have, *(v for v in given if v not in have)] if op == OP_APPEND
                     else [v for v in have if v not in given])
            overrides[name] = ",".join(items)
        else:
            raise ValueError(f"unknown config operation {op} for {name}")
    return overrides


async def handle_incremental_alter_configs(ctx: BrokerContext, body: Any, conn: ConnectionInfo) -> dict[str, Any]:
    responses: list[dict[str, Any]] = []
    for resource in body.resources:
        result, ok = _start(ctx, resource, conn, "IncrementalAlterConfigs")
        responses.append(result)
        if not ok:
            continue
        ops = [(str(c.name), int(c.config_operation), c.value) for c in resource.configs]
        try:
            overrides = _incremental(ctx.store.topic(str(resource.resource_name)).config, ops)
        except InvalidConfigError as exc:
            _refuse(result, ErrorCode.INVALID_CONFIG, str(exc), conn, "IncrementalAlterConfigs")
            continue
        except ValueError as exc:
            _refuse(result, ErrorCode.INVALID_REQUEST, str(exc), conn, "IncrementalAlterConfigs")
            continue
        await _apply(ctx, result, overrides, bool(body.validate_only), conn, "IncrementalAlterConfigs")
    return {"throttle_time": 0, "responses": responses}
