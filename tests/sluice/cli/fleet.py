"""`sluice simulate` as a subprocess that runs until stopped, and a wait for a device's state in ``/sources``.

A device is idle after ``ingest.idle_timeout_s`` of silence, so a check that one device went idle while its
peers did not is only sound while the peers are still sending: run the fleet with ``--duration 0``, wait
until the idle one is idle, look, then stop the fleet with SIGTERM (it finishes and prints its report).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

__all__ = ["RunningFleet", "wait_until_idle"]

ROOT = Path(__file__).resolve().parents[3]


class RunningFleet:
    """``sluice simulate --duration 0 --json ARGS`` in its own process; ``stop()`` returns its JSON report."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "simulate", "--duration", "0", "--json", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)  # simulate stops its devices, flushes what they hold, reports
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return dict(json.loads(out))

    def __enter__(self) -> RunningFleet:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)


def wait_until_idle(
    http: str, device: str, fleet: RunningFleet, *, source: str | None = None, timeout: float = 120.0
) -> None:
    """Until ``/sources`` shows ``device`` (of ``source``, if given) idle; the timeout is a deadline for a loaded
    machine, not a wait."""
    deadline = time.monotonic() + timeout
    while True:
        assert fleet.running(), fleet.proc.communicate()[1]
        rows = httpx.get(f"{http}/sources", timeout=30).json()
        if any(
            r.get("type") == "device"
            and r.get("device") == device
            and source in (None, r.get("source"))
            and r.get("idle")
            for r in rows
        ):
            return
        assert time.monotonic() < deadline, f"{device} never went idle: {rows}"
        time.sleep(0.1)
