"""A real Sluice as a subprocess (`python -m sluice.cli serve`) on free ports, for client and CLI tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TypedDict

__all__ = ["Endpoint", "SluiceProcess", "serve_command"]


def serve_command() -> list[str]:
    """``sluice serve`` as the installed console script runs it: ``-P`` keeps the working directory off
    ``sys.path`` (``python -m`` would put it there, and the script does not)."""
    return [sys.executable, "-P", "-m", "sluice.cli", "serve"]


class Endpoint(TypedDict):
    """One entry of ``<data_dir>/endpoints.json`` (written by ``Runtime.write_endpoints``)."""

    host: str
    port: int


class SluiceProcess:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: list[str] | None = None,
                 cwd: Path | None = None) -> None:
        """``cwd``: run there, as the console script runs (``serve_command``: the directory is not on sys.path)."""
        self.data_dir = data_dir
        self.env = env or {}
        self.args = args or []
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.log = data_dir.parent / f"{data_dir.name}.log"

    # A deadline, not a wait: start-up takes ~1 s, but on a machine shared by several suites (load 20 on two
    # cores) the interpreter's imports alone took 15 s and 43 tests failed "did not become ready" at 30 s.
    def start(self, timeout: float = 120.0) -> SluiceProcess:
        env = {
            **os.environ,
            "SLUICE_KAFKA__PORT": "0",
            "SLUICE_MQTT__PORT": "0",
            "SLUICE_TCP__PORT": "0",
            "SLUICE_HTTP__PORT": "0",
            "SLUICE_STORAGE__BACKEND": "memory",
            "SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS": "0",  # groups form at once in tests
            **self.env,
        }
        endpoints = self.data_dir / "endpoints.json"
        endpoints.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [*(serve_command() if self.cwd is not None else [sys.executable, "-m", "sluice.cli", "serve"]),
             "--data-dir", str(self.data_dir), *self.args],
            env=env,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
            text=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if endpoints.exists():
                found = json.loads(endpoints.read_text())
                if "http" in found and "kafka" in found:
                    self.endpoints = found
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError("sluice serve did not become ready")
            time.sleep(0.05)

    def address(self, name: str) -> str:
        e = self.endpoints[name]
        return f"{e['host']}:{e['port']}"

    @property
    def bootstrap(self) -> str:
        return self.address("kafka")

    @property
    def http(self) -> str:
        return f"http://{self.address('http')}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
