"""A real Mosquitto broker (Debian package) started by a test on a free port, persistence on."""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.conf = directory / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {directory}/\n"
            "max_queued_messages 0\n"  # no limit: a persistent session keeps everything while we are away
            "max_inflight_messages 100\n"
            f"log_dest file {directory}/mosquitto.log\n"
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information\nlog_type subscribe\n"
            f"user {getpass.getuser()}\n"  # run as root, mosquitto would switch to 'mosquitto' and lose our dir
        )

    @property
    def log(self) -> str:
        path = self.directory / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def subscribed(self, client_id: str, topic_filter: str) -> bool:
        """True once the broker has logged ``client_id``'s SUBSCRIBE to ``topic_filter``."""
        return any(line.split(": ", 1)[-1].startswith(f"{client_id} ") and line.endswith(f" {topic_filter}")
                   for line in self.log.splitlines())

    def start(self) -> Mosquitto:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
