"""The broker under test and the campaign loop every target shares.

A campaign starts a fresh ``sluice serve`` (own temporary data dir, ephemeral ports, segment storage),
then asks its target for one input at a time. After every input it looks at the broker: has it exited
(crash), did its log grow a traceback or an ERROR line, did the target see a hang (no answer and no close
within the deadline). Each finding is saved as a reproducer: the bytes the connection had sent, in order,
under ``<out>/<kind>-<n>.bin`` with a ``.json`` beside it saying what was seen. At the end every
connection is closed, the broker gets a few seconds to let go of them, and its fds and RSS are compared
with the figures taken before the first input; then a real client must still work.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = [
    "SocketTarget",
    "answer_contains",
    "BrokerProcess",
    "Campaign",
    "CampaignReport",
    "Finding",
    "Hang",
    "Mismatch",
    "ProcessFigures",
    "Target",
    "closes_after_eof",
    "free_port",
    "recv_exactly",
    "send_split",
    "signature",
]

_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", re.MULTILINE)
_BAD_LEVEL = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) ")
_TRACEBACK = "Traceback (most recent call last)"
_REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    """``size`` bytes, or None when the peer closed first (socket.timeout propagates)."""
    chunks = bytearray()
    while len(chunks) < size:
        try:
            chunk = sock.recv(size - len(chunks))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def signature(kind: str, detail: str) -> str:
    """What makes two findings the same bug: the exception and where it was raised, or the log message."""
    if _TRACEBACK in detail:
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', detail)
        last = re.findall(r"^(\w[\w.]*(?:Error|Exception|Exit|Interrupt)\b[^\n]{0,80})", detail, re.MULTILINE)
        ours = [f for f in frames if "site-packages" not in f[0] and "/lib/python3" not in f[0]] or frames
        where = f"{Path(ours[-1][0]).name}:{ours[-1][1]} {ours[-1][2]}" if ours else "?"
        return f"{kind}: {last[-1] if last else '?'} at {where}"
    if kind == "error-log":
        words = detail.split()
        logger = words[3] if len(words) > 3 else ""
        message = re.split(r" \w+=", detail.split(": ", 1)[-1].splitlines()[0])[0][:120]
        return f"{kind}: {logger} {message}"
    first = re.sub(r"[0-9]+", "N", detail.splitlines()[0] if detail else "")
    return f"{kind}: {first[:160]}"


def _record_complete(record: str) -> bool:
    if not record.endswith("\n"):
        return False
    if _TRACEBACK not in record:
        return True
    last = record.rstrip("\n").rsplit("\n", 1)[-1]
    return not last.startswith((" ", "Traceback"))


def closes_after_eof(sock: socket.socket, limit: float) -> bool:
    """End our side of ``sock``; True when the peer then closes (after any answers) within ``limit`` s."""
    end = time.monotonic() + limit
    try:
        sock.shutdown(socket.SHUT_WR)
        while time.monotonic() < end:
            sock.settimeout(max(end - time.monotonic(), 0.001))
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


class Hang(Exception):
    """The broker neither answered nor closed within the deadline."""


class Mismatch(Exception):
    """What the broker acknowledged does not read back as it was sent (stored data corrupted or lost)."""


def send_split(sock: socket.socket, data: bytes, rng: random.Random) -> None:
    """Send ``data`` in pieces cut at random places (at every byte for short inputs, now and then), with a
    short pause between pieces so that the broker sees them as separate reads: frames, lines and packets
    split at every kind of boundary (inside a size prefix, a header, a body, between two of them)."""
    if len(data) <= 64 and rng.random() < 0.3:
        cuts = list(range(1, len(data)))
    else:
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice((1, 2, 3, 8))))) if len(
            data) > 1 else []
    start = 0
    for cut in [*cuts, len(data)]:
        sock.sendall(data[start:cut])
        start = cut
        if cut < len(data):
            time.sleep(0.0005)


def answer_contains(address: tuple[str, int], request: bytes, marker: bytes, timeout: float) -> bool:
    """Send ``request`` on a fresh connection; True once the answer holds ``marker`` (a probe)."""
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(request)
            got = b""
            while marker not in got:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                got += chunk
            return True
    except OSError:
        return False


class SocketTarget:
    """What every target shares: one fuzzing connection, the inputs sent on it, and those of the last
    closed connections (``recent`` is the reproducer a finding saves)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.broker: BrokerProcess | None = None
        self.sock: socket.socket | None = None
        self.sent: list[bytes] = []
        self.history: deque[list[bytes]] = deque(maxlen=8)  # the inputs of the last closed connections

    def _retire(self) -> None:
        """The current connection's inputs move to the history (its socket is closed or parked)."""
        self.sock = None
        if self.sent:
            self.history.append(self.sent)
        self.sent = []

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self._retire()

    def recent(self) -> list[list[bytes]]:
        return [*self.history, *([self.sent] if self.sent else [])]

    def close_all(self) -> None:
        self._drop()


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    fds: int
    sockets: int
    rss_kib: int
    partitions: int = -1  # topic partitions in the broker (segment files hold fds)

    @classmethod
    def of(cls, pid: int, partitions: int = -1) -> ProcessFigures:
        fds = sockets = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(f"/proc/{pid}/fd"):
                fds += 1
                with contextlib.suppress(OSError):
                    if os.readlink(entry.path).startswith("socket:"):
                        sockets += 1
        rss = 0
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return cls(fds, sockets, rss, partitions)


class BrokerProcess:
    """``python -m sluice.cli serve`` on ephemeral ports with a fresh data dir; its log in a file."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.extra_env = env
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoints: dict[str, tuple[str, int]] = {}
        self.http_tls: ssl.SSLContext | None = None  # set when the broker's HTTP API speaks TLS
        self.http_headers: dict[str, str] = {}  # e.g. credentials, when the broker requires them
        self.prepare: Callable[[Path], None] | None = None  # fills a fresh data dir (users) before each start
        self.starts = 0
        self.log_path = workdir / "broker.log"
        self._log_offset = 0
        self.data_dir = workdir / "data"

    def start(self, timeout: float = 120.0) -> None:
        """Start `sluice serve`; ``timeout`` is a deadline for a loaded machine (the suite's first campaign
        once took over 60 s, its workers importing side by side at load 16), not a wait."""
        self.starts += 1
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a restart after a crash starts clean too
        self.data_dir.mkdir(parents=True)
        if self.prepare is not None:
            self.prepare(self.data_dir)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")])),
            "SLUICE_KAFKA__PORT": "0",
            "SLUICE_MQTT__PORT": "0",
            "SLUICE_TCP__PORT": "0",
            "SLUICE_HTTP__PORT": "0",
            **self.extra_env,
        }
        log = self.log_path.open("ab")
        log.write(f"==== broker start #{self.starts}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(self.data_dir)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=self.workdir,
        )
        log.close()
        self._log_offset = self.log_path.stat().st_size
        endpoints = self.data_dir / "endpoints.json"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited with {self.proc.returncode}; see {self.log_path}")
            if endpoints.exists():
                found = json.loads(endpoints.read_text())
                if {"http", "kafka"} <= set(found):
                    self.endpoints = {k: (v["host"], int(v["port"])) for k, v in found.items()}
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sluice serve did not become ready; see {self.log_path}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def figures(self) -> ProcessFigures:
        return ProcessFigures.of(self.pid, self.partitions())

    def partitions(self) -> int:
        """Partitions of every topic (internal ones too), from the HTTP API; -1 when it cannot say."""
        host, port = self.endpoints["http"]
        scheme = "https" if self.http_tls is not None else "http"
        try:
            request = urllib.request.Request(f"{scheme}://{host}:{port}/topics?internal=true",
                                             headers=self.http_headers)
            with urllib.request.urlopen(request, timeout=30, context=self.http_tls) as answer:
                return sum(int(t["partitions"]) for t in json.loads(answer.read()))
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def new_log_findings(self, final: bool = False) -> list[str]:
        """ERROR/CRITICAL records and tracebacks written since the last call. A last record still being
        written (no newline yet, or a traceback without its exception line) waits for the next call."""
        size = self.log_path.stat().st_size
        if size <= self._log_offset:
            return []
        with self.log_path.open("rb") as f:
            f.seek(self._log_offset)
            raw = f.read(size - self._log_offset)
        text = raw.decode("utf-8", "surrogateescape")  # round-trips, so offsets can be counted back in bytes
        starts = [m.start() for m in _RECORD_START.finditer(text)]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)  # output before the first record (e.g. a bare traceback on stderr)
        records = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
        consumed = len(raw)
        if not final and records and not _record_complete(records[-1]):
            consumed = len(text[: starts[-1]].encode("utf-8", "surrogateescape"))
            records.pop()
        self._log_offset += consumed
        found = [r[:8000] for r in records if _BAD_LEVEL.match(r) or _TRACEBACK in r]
        return [r.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for r in found]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass(slots=True)
class Finding:
    kind: str  # crash | hang | mismatch | unresponsive | traceback | error-log | fd-leak | rss-growth | client-check
    detail: str
    connections: list[list[bytes]] = field(default_factory=list)  # inputs per connection, the last one last

    @property
    def signature(self) -> str:
        return signature(self.kind, self.detail)


class Target(Protocol):
    """One front door. ``step`` generates one input, sends it and waits for its answer or the close."""

    name: str

    def broker_env(self) -> dict[str, str]: ...

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None: ...

    def step(self, rng: random.Random) -> None:
        """Raise Hang when the broker neither answered nor closed in time."""
        ...

    def recent(self) -> list[list[bytes]]:
        """The inputs of the last few connections, oldest first; the last is the current (the reproducer)."""
        ...

    def flush(self) -> None:
        """Wait for the answers to inputs sent but not yet checked (raise Hang as step does)."""
        ...

    def close_all(self) -> None: ...

    def probe(self) -> bool:
        """A fresh, well-formed request on a new connection gets its answer."""
        ...

    def client_check(self) -> list[str]:
        """Real clients (kcat, mosquitto, curl/httpx) still work; the failures, empty when fine."""
        ...


@dataclass(slots=True)
class CampaignReport:
    target: str
    seed: int
    inputs: int
    seconds: float
    before: ProcessFigures
    after: ProcessFigures
    findings: list[Finding]
    broker_starts: int
    command: str
    out_dir: Path
    verified: int = 0  # acknowledged items read back intact (targets that check: kafka_verify.py)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    def render(self) -> str:
        c = self.counts()
        lines = [
            f"target {self.target}: {self.inputs:,} inputs in {self.seconds:.0f} s "
            f"({self.inputs / max(self.seconds, 1e-9):,.0f}/s), seed {self.seed}",
            f"  crashes {c.get('crash', 0)}, hangs {c.get('hang', 0)}, unresponsive {c.get('unresponsive', 0)}, "
            f"tracebacks {c.get('traceback', 0)}, ERROR lines {c.get('error-log', 0)}, "
            f"acknowledged data not read back intact {c.get('mismatch', 0)}",
            f"  fds {self.before.fds} -> {self.after.fds} (sockets {self.before.sockets} -> {self.after.sockets}; "
            f"partitions {self.before.partitions} -> {self.after.partitions}), "
            f"RSS {self.before.rss_kib / 1024:.0f} -> {self.after.rss_kib / 1024:.0f} MiB, "
            f"broker started {self.broker_starts}x",
            f"  leaks: fd {c.get('fd-leak', 0)}, rss {c.get('rss-growth', 0)}; real client check failures "
            f"{c.get('client-check', 0)}",
            *([f"  acknowledged batches read back byte-identical: {self.verified:,}"] if self.verified else []),
            f"  reproducers and broker log: {self.out_dir}",
            f"  command: {self.command}",
        ]
        by_signature: dict[str, int] = {}
        for f in self.findings:
            by_signature[f.signature] = by_signature.get(f.signature, 0) + 1
        for sig, n in sorted(by_signature.items(), key=lambda kv: -kv[1]):
            lines.append(f"  - {n} x {sig}")
        return "\n".join(lines)


class Campaign:
    """Sends ``inputs`` inputs of one target to a fresh broker over ``len(targets)`` concurrent client
    connections (one thread each, their own random streams) and collects findings."""

    def __init__(
        self,
        targets: Target | list[Target],
        *,
        inputs: int,
        seed: int,
        out_dir: Path,
        rate: float = 0.0,
        fd_slack: int = 64,
        rss_growth_mib: int = 256,
        max_restarts: int = 5,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.targets = targets if isinstance(targets, list) else [targets]
        self.target = self.targets[0]
        self.inputs = inputs
        self.seed = seed
        self.out_dir = out_dir
        self.rate = rate
        self.fd_slack = fd_slack
        self.rss_growth_mib = rss_growth_mib
        self.max_restarts = max_restarts
        self.progress = progress or (lambda _msg: None)
        self.findings: list[Finding] = []
        self._saved_log_findings = 0
        self._sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._broken = threading.Event()  # a worker found the broker unresponsive

    def _save(self, finding: Finding) -> None:
        with self._lock:
            self.findings.append(finding)
            n = len(self.findings)
        stem = self.out_dir / f"{finding.kind}-{n:04d}"
        if finding.connections:
            stem.with_suffix(".bin").write_bytes(b"".join(finding.connections[-1]))
        meta = {
            "kind": finding.kind,
            "signature": finding.signature,
            "detail": finding.detail,
            "connections": [[chunk.hex() for chunk in conn[-64:]] for conn in finding.connections],
        }
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))
        self.progress(f"FINDING {finding.kind}: {finding.detail.splitlines()[0][:160] if finding.detail else ''}")

    def _check_log(self, broker: BrokerProcess, final: bool = False) -> None:
        for text in broker.new_log_findings(final):
            kind = "traceback" if _TRACEBACK in text else "error-log"
            finding = Finding(kind, text, self._recent())
            if self._saved_log_findings < 200:  # the count keeps going; the files stop at 200
                self._save(finding)
            else:
                self.findings.append(finding)
            self._saved_log_findings += 1

    @contextlib.contextmanager
    def _broker(self) -> Iterator[BrokerProcess]:
        workdir = Path(tempfile.mkdtemp(prefix=f"sluice-fuzz-{self.target.name}-"))
        broker = BrokerProcess(self.target.broker_env(), workdir)
        broker.http_tls = getattr(self.target, "http_tls", None)
        broker.http_headers = getattr(self.target, "http_headers", {})
        broker.prepare = getattr(self.target, "prepare_data_dir", None)
        try:
            yield broker
        finally:
            broker.stop()
            with contextlib.suppress(OSError):
                shutil.copy(broker.log_path, self.out_dir / "broker.log")
            shutil.rmtree(workdir, ignore_errors=True)

    def run(self, command: str) -> CampaignReport:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rngs = [random.Random(self.seed * 1000 + i) for i in range(len(self.targets))]
        with self._broker() as broker:
            broker.start()
            for target, rng in zip(self.targets, rngs, strict=True):
                target.attach(broker, rng)
            time.sleep(1.0)  # let startup settle before the baseline figures
            before = broker.figures()
            started = time.monotonic()
            while self._sent < self.inputs:
                self._stop.clear()
                workers = [
                    threading.Thread(target=self._work, args=(target, rng, started), daemon=True)
                    for target, rng in zip(self.targets, rngs, strict=True)
                ]
                for worker in workers:
                    worker.start()
                broken = self._supervise(broker, workers, started)
                self._stop.set()
                for worker in workers:
                    worker.join()
                if broken is None:
                    continue  # every input sent
                code = broker.exited()
                self._check_log(broker, final=True)
                if code is not None:
                    self._save(Finding("crash", f"broker exited with {code}", self._recent()))
                if not self._restart(broker, rngs):
                    break
            seconds = time.monotonic() - started
            for target in self.targets:
                target.close_all()
            after = self._settled_figures(broker, before)
            self._check_log(broker)
            if broker.exited() is None:
                self._leak_findings(before, after)
                for failure in self.targets[0].client_check():
                    self._save(Finding("client-check", failure))
            self._check_log(broker, final=True)
            return CampaignReport(
                self.target.name, self.seed, self._sent, seconds, before, after, self.findings,
                broker.starts, command, self.out_dir, sum(getattr(t, "verified", 0) for t in self.targets),
            )

    def _recent(self) -> list[list[bytes]]:
        """The recent connections of every worker (read while they run: retried if one changed meanwhile)."""
        for _ in range(10):
            try:
                return [list(conn) for target in self.targets for conn in target.recent()]
            except RuntimeError:  # a deque mutated during iteration
                continue
        return []

    def _take_input(self) -> bool:
        with self._lock:
            if self._sent >= self.inputs or self._stop.is_set():
                return False
            self._sent += 1
            return True

    def _work(self, target: Target, rng: random.Random, started: float) -> None:
        """One client connection's loop (a thread): inputs until the campaign has sent them all, then the
        answers to what it still has pending."""
        more = True
        while more:
            more = self._take_input()
            try:
                if more:
                    target.step(rng)
                else:
                    target.flush()
            except Mismatch as exc:
                self._save(Finding("mismatch", str(exc), target.recent()))
                target.close_all()
            except Hang as exc:
                self._save(Finding("hang", str(exc), target.recent()))
                target.close_all()
                if not target.probe():
                    self._save(Finding("unresponsive", f"no answer to a probe after: {exc}"))
                    self._broken.set()
                    return
            except OSError as exc:  # the broker refused or reset a new connection: judged by the probe
                target.close_all()
                if not target.probe():
                    self._save(Finding("unresponsive", f"cannot connect: {exc!r}", target.recent()))
                    self._broken.set()
                    return
            if more and self.rate > 0:
                ahead = self._sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)

    def _supervise(self, broker: BrokerProcess, workers: list[threading.Thread], started: float) -> str | None:
        """Watch the broker while the workers run: its log after every few milliseconds (findings keep the
        connections that were open), its exit. Returns why the run must stop early, or None when done."""
        last_report = time.monotonic()
        while any(w.is_alive() for w in workers):
            time.sleep(0.01)
            if broker.exited() is not None:
                return "crash"
            if self._broken.is_set():
                return "unresponsive"
            self._check_log(broker)
            now = time.monotonic()
            if now - last_report >= 30:
                last_report = now
                fig = broker.figures()
                self.progress(
                    f"{self._sent:,}/{self.inputs:,} inputs, {self._sent / (now - started):,.0f}/s, "
                    f"fds {fig.fds} sockets {fig.sockets} partitions {fig.partitions} "
                    f"RSS {fig.rss_kib // 1024} MiB, findings {len(self.findings)}"
                )
        return "crash" if broker.exited() is not None else None

    def _restart(self, broker: BrokerProcess, rngs: list[random.Random]) -> bool:
        if broker.starts > self.max_restarts:
            return False
        for target in self.targets:
            target.close_all()
        broker.stop()
        broker.start()
        for target, rng in zip(self.targets, rngs, strict=True):
            target.attach(broker, rng)
        self._broken.clear()
        return True

    def _settled_figures(self, broker: BrokerProcess, before: ProcessFigures) -> ProcessFigures:
        """Figures once the broker has let go of the closed connections (or after 15 s)."""
        deadline = time.monotonic() + 15
        fig = broker.figures()
        while time.monotonic() < deadline and broker.exited() is None:
            fig = broker.figures()
            if fig.sockets <= before.sockets:
                break
            time.sleep(0.25)
        return fig

    def _leak_findings(self, before: ProcessFigures, after: ProcessFigures) -> None:
        if after.sockets > before.sockets:
            self._save(Finding("fd-leak", f"sockets {before.sockets} -> {after.sockets} after every connection closed"))
        # other fds: segment files of the partitions the inputs created may stay open (3 each at most)
        explained = 3 * max(after.partitions - before.partitions, 0)
        if after.fds - after.sockets > before.fds - before.sockets + explained + self.fd_slack:
            self._save(Finding("fd-leak", f"non-socket fds {before.fds - before.sockets} -> "
                               f"{after.fds - after.sockets} with {after.partitions - before.partitions} new "
                               f"partitions (3 fds each allowed, slack {self.fd_slack})"))
        if after.rss_kib - before.rss_kib > self.rss_growth_mib * 1024:
            self._save(
                Finding("rss-growth", f"RSS {before.rss_kib // 1024} -> {after.rss_kib // 1024} MiB "
                        f"(limit +{self.rss_growth_mib} MiB)")
            )


def restart_on_same_data(broker: BrokerProcess, env: dict[str, str], round_: int, needs: set[str],
                         *, kill: bool = True, timeout: float = 120.0) -> float:
    """Stop ``broker`` (SIGKILL, else SIGTERM), then ``sluice serve`` on the same data dir with ``env``;
    returns the seconds until it announced the listeners in ``needs`` (``timeout``: a deadline for a
    loaded machine, not a wait). For the campaigns about what survives a restart."""
    assert broker.proc is not None
    os.kill(broker.pid, signal.SIGKILL if kill else signal.SIGTERM)
    broker.proc.wait(60)
    endpoints = broker.data_dir / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    with broker.log_path.open("ab") as log:
        log.write(f"==== restart after {'kill -9' if kill else 'SIGTERM'} #{round_}\n".encode())
        log.flush()
        started = time.monotonic()
        broker.proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir",
                                        str(broker.data_dir)], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                       cwd=broker.workdir)
    while True:
        if broker.proc.poll() is not None:
            raise RuntimeError(f"the broker exited on restart; see {broker.log_path}")
        if endpoints.exists():
            found = json.loads(endpoints.read_text())
            if needs <= set(found):
                broker.endpoints = {k: (v["host"], int(v["port"])) for k, v in found.items()}
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"the restarted broker did not come up; see {broker.log_path}")
        time.sleep(0.05)
