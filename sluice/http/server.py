"""The HTTP API as a ``sluice serve`` component: uvicorn in the broker's own process and event loop.

uvicorn runs as a task on a socket bound here (so port 0 works and a busy port fails ``start``), with
lifespan events off and signal handling left to ``sluice serve``. With ``security.tls_cert`` set it serves
HTTPS only, with the TLS context every listener shares (``sluice.components.tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn

from sluice.components.tls import server_context
from sluice.http.app import create_app
from sluice.http.context import ApiContext
from sluice.runtime import Runtime

__all__ = ["HttpComponent", "http_component"]

log = logging.getLogger("sluice.http")


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # sluice serve owns SIGINT/SIGTERM
        yield


class HttpComponent:
    name = "http"

    def __init__(self, runtime: Runtime, host: str | None = None, port: int | None = None) -> None:
        self.runtime = runtime
        self.host = host if host is not None else runtime.settings.host
        self.port = port if port is not None else runtime.settings.http.port
        self.app = create_app(runtime)
        self.ctx: ApiContext = self.app.state.ctx
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.bound_port = 0

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"HTTP API cannot bind {self.host}:{self.port}: {exc.strerror}") from exc
        sock.listen(1024)
        sock.setblocking(False)
        self.bound_port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
            loop="none",
            http="httptools",  # h11 logged LocalProtocolError tracebacks on malformed chunked bodies (bench.fuzz)
        )
        tls = server_context(self.runtime)
        if tls is not None:  # HTTPS with the shared context (reloaded in place on SIGHUP)
            config.load()
            config.ssl = tls
        server = _EmbeddedServer(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="sluice-http")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise OSError("HTTP API stopped while starting")
            await asyncio.sleep(0.01)
        self.ctx.accepting = True
        self.runtime.announce("http", self.host, self.bound_port)  # https when TLS is configured

    async def stop(self) -> None:
        self.ctx.accepting = False
        self.ctx.stopping.set()  # ends open SSE streams
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(self._task, timeout=10)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        log.info("http api stopped")


def http_component(runtime: Runtime) -> HttpComponent | None:
    if not runtime.settings.http.enabled:
        return None
    return HttpComponent(runtime)
