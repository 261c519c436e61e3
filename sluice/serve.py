"""``sluice serve``: one asyncio process holding the log store and every front door.

Start-up: refuse an unauthenticated broker bound beyond loopback (``sluice.exposure``), open (and recover)
the store, start components in order, write endpoints.json.
SIGHUP reloads the TLS certificate and key (``sluice.components.tls``) without dropping connections.
Shutdown on SIGINT/SIGTERM: stop components in reverse (stop accepting, finish in-flight appends),
flush the store, close it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib.util
import logging
import os
import signal
from pathlib import Path

from broker.errors import StorageError
from broker.log.api import LogStore
from broker.log.cleaner import LogCleaner
from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore
from broker.security.tls import ReloadableTls
from sluice.components import build_components
from sluice.components.tls import tls_files
from sluice.config import Settings
from sluice.exposure import check_advertised_hosts, check_exposure
from sluice.gc_tuning import tune_for_serving
from sluice.malloc_tuning import return_large_buffers
from sluice.runtime import Component, Runtime

__all__ = ["PortInUseError", "check_data_dir", "open_store", "run_server", "serve"]

log = logging.getLogger("sluice.serve")


def _port_settings(component: str, settings: Settings) -> str:
    """Where the ports of ``component``'s listeners are set (its flag and variables), with their values."""
    if component == "kafka":
        extra = ", kafka.extra_listeners[].port" if settings.kafka.extra_listeners else ""
        return f"--kafka-port or SLUICE_KAFKA__PORT (now {settings.kafka.port}){extra}"
    if component == "mqtt":
        mqtt = settings.mqtt
        return (f"--mqtt-port or SLUICE_MQTT__PORT (now {mqtt.port}), SLUICE_MQTT__TLS_PORT ({mqtt.tls_port}), "
                f"SLUICE_MQTT__WS_PORT ({mqtt.ws_port}), SLUICE_MQTT__WSS_PORT ({mqtt.wss_port})")
    if component == "tcp":
        extra = ", tcp.listeners[].port" if settings.tcp.listeners else ""
        return f"--tcp-port or SLUICE_TCP__PORT (now {settings.tcp.port}){extra}"
    if component == "http":
        return f"--http-port or SLUICE_HTTP__PORT (now {settings.http.port})"
    return "its port setting (docs/configuration.md)"


class PortInUseError(OSError):
    """A listener's port is held by another program: which listener, and how to pick another port."""

    def __init__(self, component: str, settings: Settings, cause: OSError) -> None:
        reason = str(cause).removeprefix(f"[Errno {cause.errno}] ")
        super().__init__(
            f"the {component} listener cannot bind its port ({reason}): another program holds it (another "
            f"`sluice serve`? `ss -ltnp` names it). Stop it, or choose another port: "
            f"{_port_settings(component, settings)}; 0 picks a free one")


def check_data_dir(path: Path) -> None:
    """Create the data directory if needed and fail early, in one sentence, if it is unusable."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create data directory {path}: {exc.strerror}; create it and give this user "
                           "write access, or pass --data-dir (SLUICE_DATA_DIR) a directory this user may create"
                           ) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StorageError(
            f"data directory {path} is not writable by this user; fix its permissions or pass --data-dir"
        )


def open_store(settings: Settings) -> LogStore:
    storage = settings.storage
    common = {
        "default_config": storage.topic_defaults(),
        "default_partitions": storage.default_partitions,
        "auto_create_topics": storage.auto_create_topics,
        "limits": storage.partition_limits(),
    }
    if storage.backend == "memory":
        return MemoryLogStore(**common)  # type: ignore[arg-type]
    return SegmentLogStore(settings.data_dir / "logs", **common,  # type: ignore[arg-type]
                           max_open_files=storage.max_open_files or None, visibility=storage.visibility,
                           index_cache_bytes=storage.index_cache_bytes or None,
                           preallocate_bytes=storage.preallocate_bytes)


async def _retention_loop(store: LogStore, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        removed = store.enforce_retention()
        if removed:
            log.info("retention removed old segments", extra={"bytes": removed})


async def serve(settings: Settings, stop: asyncio.Event | None = None, *, tune_gc: bool = False) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM arrives). ``tune_gc``: the process is ours alone
    (``run_server``), so set its garbage collector for serving once started (``sluice.gc_tuning``)."""
    stop = stop or asyncio.Event()
    check_exposure(settings)  # before anything is opened: an open broker on the network refuses to start
    check_advertised_hosts(settings)  # and a Kafka listener that would send its clients to 0.0.0.0
    check_data_dir(settings.data_dir)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    files = tls_files(settings.security)
    tls = ReloadableTls(files) if files is not None else None  # a bad certificate fails here, before the store opens

    store = open_store(settings)
    await store.start()
    runtime = Runtime(settings, store)
    if tls is not None:
        runtime.registries["tls"] = tls
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, tls.reload)  # new handshakes use the new certificate
    started: list[Component] = []
    retention = asyncio.create_task(_retention_loop(store, settings.storage.retention_check_interval_s))
    cleaner = asyncio.create_task(LogCleaner(store).run(settings.storage.cleaner_interval_s))
    try:
        for component in build_components(runtime):
            try:
                await component.start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUseError(component.name, settings, exc) from exc
                raise
            started.append(component)
        runtime.write_endpoints()
        if tune_gc:
            tune_for_serving()
        log.info("sluice ready", extra={"data_dir": str(settings.data_dir), "components": [c.name for c in started]})
        await stop.wait()
        log.info("shutting down")
    finally:
        if tls is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGHUP)
        retention.cancel()
        cleaner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cleaner  # no rename may land after the store closes
        for component in reversed(started):
            try:
                await component.stop()
            except Exception:
                log.exception("component failed to stop cleanly", extra={"component": component.name})
        await store.flush()
        await store.close()
        log.info("stopped")


def run_server(settings: Settings) -> None:
    """Blocking entry point: picks the event loop (uvloop when available and not disabled)."""
    return_large_buffers()  # the process is ours alone: large request buffers go back to the system
    use_uvloop = settings.event_loop == "uvloop"
    if settings.event_loop == "auto":
        use_uvloop = importlib.util.find_spec("uvloop") is not None
    if use_uvloop:
        import uvloop

        uvloop.run(serve(settings, tune_gc=True))
    else:
        asyncio.run(serve(settings, tune_gc=True))
