"""Typed configuration: defaults < TOML file < ``SLUICE_*`` environment < command-line flags.

Nested sections use a double underscore in the environment: ``SLUICE_KAFKA__PORT=19092``.
Each front door owns one section; a port of 0 binds an ephemeral port (tests), ``enabled=false``
switches a listener off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from broker.log.config import FlushPolicy, TopicConfig

__all__ = [
    "HttpSettings",
    "KafkaSettings",
    "MqttSettings",
    "Settings",
    "StorageSettings",
    "TcpSettings",
    "load_settings",
]


class StorageSettings(BaseModel):
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


class KafkaSettings(BaseModel):
    enabled: bool = True
    port: int = 9092
    advertised_host: str | None = None  # defaults to the bind host
    advertised_port: int | None = None  # defaults to the bound port
    max_request_bytes: int = 100 * 1024 * 1024


class MqttSettings(BaseModel):
    enabled: bool = True
    port: int = 1883
    allow_anonymous: bool = True


class TcpSettings(BaseModel):
    enabled: bool = True
    port: int = 8094
    format: Literal["ndjson", "influx", "csv"] = "ndjson"


class HttpSettings(BaseModel):
    enabled: bool = True
    port: int = 8080


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SLUICE_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    data_dir: Path = Path("./sluice-data")
    host: str = "127.0.0.1"
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    storage: StorageSettings = Field(default_factory=StorageSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    tcp: TcpSettings = Field(default_factory=TcpSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    processors: list[str] = Field(default_factory=list)  # "module:attribute" pipelines run in-process

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
