"""A real Mosquitto on a free port, started and stopped by the test (restartable on the same port)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["Mosquitto", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    def __init__(self, tmp: Path, port: int | None = None) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.exe = exe
        self.port = port or free_port()
        self.conf = tmp / "mosquitto.conf"
        # mosquitto started as root drops to its own user, which must reach and write the db directory
        self.db_dir = Path(tempfile.mkdtemp(prefix="sluice-mosquitto-"))
        self.db_dir.chmod(0o777)
        # Persistence keeps sessions and queued QoS 1 messages across a restart (written on SIGTERM).
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {self.db_dir}/\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.db_dir, ignore_errors=True)
