"""``sluice serve`` components for the TCP line listeners and the file sources.

Both take the shared ingest core from ``sluice.components.ingest_core.ingest_core`` (the MQTT listener and
bridge use the same one), so every front door shares one router, one backpressure budget and one
health registry.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ingest.admission import Admission, ConnectionLimits
from ingest.file.source import FileSource, FileSourceConfig, PositionStore
from ingest.routing import KeySpec, RouteRule, TimeSpec
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from sluice.components.ingest_core import ingest_core
from sluice.components.mqtt_access import tcp_writer_check
from sluice.components.security import authenticator, authorizer
from sluice.components.tls import handshake_timeout, server_context
from sluice.front_metrics import AdmissionCollector, publish_collector
from sluice.runtime import Runtime

__all__ = ["FileIngestComponent", "TcpIngestComponent", "file_component", "tcp_component"]


class TcpIngestComponent:
    """The ``tcp`` listener (settings.tcp) plus any ``[[tcp.listeners]]``."""

    name = "tcp"

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        settings = runtime.settings
        tcp = settings.tcp
        core = ingest_core(runtime)
        base = TcpListenerConfig(
            name="default",
            host=settings.host,
            port=tcp.port,
            format=tcp.format,
            ack=tcp.ack,
            max_line_bytes=tcp.max_line_bytes,
            idle_timeout_s=tcp.idle_timeout_s,
            read_bytes=tcp.read_bytes,
            backlog=tcp.backlog,
            auth_timeout_s=tcp.auth_timeout_s,
        )
        configs = [base]
        for extra in tcp.listeners:
            configs.append(replace(base, name=extra.name, port=extra.port, format=extra.format, ack=extra.ack))
        # One admission for every TCP listener: the caps count their connections together.
        self.admission = Admission("TCP", ConnectionLimits(tcp.max_connections, tcp.max_connections_per_address),
                                   logging.getLogger("ingest.tcp"))
        auth = authenticator(runtime)  # security.auth = required: a first AUTH line (ingest/tcp/auth.py)
        tls = server_context(runtime)
        authz = authorizer(runtime)
        self.listeners = [TcpLineListener(c, core.sink, core.health, admission=self.admission, authenticator=auth,
                                          tls=tls, tls_handshake_timeout_s=handshake_timeout(runtime))
                          for c in configs]
        for listener in self.listeners:  # the ACLs: checked once per login (mqtt_access.tcp_writer_check)
            if authz is not None:
                listener.may_write = tcp_writer_check(authz, core.router, listener.source)
        publish_collector(runtime, AdmissionCollector("tcp", self.admission))

    async def start(self) -> None:
        for listener in self.listeners:
            await listener.start()
            endpoint = "tcp" if listener.config.name == "default" else f"tcp:{listener.config.name}"
            self.runtime.announce(endpoint, listener.host, listener.port)

    async def stop(self) -> None:
        for listener in self.listeners:
            await listener.stop()


class FileIngestComponent:
    """Every ``[[ingest.files]]`` source; positions live under ``<data_dir>/ingest/files``."""

    name = "files"

    def __init__(self, runtime: Runtime) -> None:
        core = ingest_core(runtime)
        positions = PositionStore(runtime.settings.data_dir / "ingest" / "files")
        self.sources: list[FileSource] = []
        for fs in runtime.settings.ingest.files:
            config = FileSourceConfig(
                name=fs.name,
                path=fs.path,
                format=fs.format,
                mode=fs.mode,
                start=fs.start,
                poll_interval_s=fs.poll_interval_s,
                max_line_bytes=fs.max_line_bytes,
                read_bytes=fs.read_bytes,
            )
            if fs.topic is not None:
                core.router.add_rule(
                    RouteRule(
                        name=f"file:{fs.name}",
                        topic=fs.topic,
                        source_kind="file",
                        source_name=fs.name,
                        key=KeySpec.parse(fs.key),
                        time=TimeSpec(fs.time_field, fs.time_format),
                    ),
                    replace=True,
                )
            self.sources.append(FileSource(config, core.sink, core.health, positions))

    async def start(self) -> None:
        for source in self.sources:
            await source.start()

    async def stop(self) -> None:
        for source in self.sources:
            await source.stop()


def tcp_component(runtime: Runtime) -> TcpIngestComponent | None:
    return TcpIngestComponent(runtime) if runtime.settings.tcp.enabled else None


def file_component(runtime: Runtime) -> FileIngestComponent | None:
    return FileIngestComponent(runtime) if runtime.settings.ingest.files else None
