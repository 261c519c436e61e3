"""Progress (count, rate, elapsed) shows on stderr only when stderr is a terminal, and never touches stdout.

The commands run as subprocesses with stderr on a real pseudo-terminal and stdout on a pipe (the user's
``sluice consume t > file`` or ``… | head``), then with stderr on a pipe too.
"""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from rich.console import Console

from sluice.cli_progress import Activity
from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
N = 20_000


def _run(args: list[str], server: SluiceProcess, *, stdin: bytes = b"", tty: bool) -> tuple[int, bytes, str]:
    """(exit code, stdout bytes, stderr text without escape codes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": "120",
           "SLUICE_BOOTSTRAP": server.bootstrap}
    env.pop("NO_COLOR", None)
    command = [sys.executable, "-m", "sluice.cli", *args]
    if not tty:
        done = subprocess.run(command, input=stdin, capture_output=True, env=env, timeout=120)
        return done.returncode, done.stdout, done.stderr.decode()
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:  # the terminal's side, read while stdout is read (a full pty would block the command)
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command's end of the terminal is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    out = proc.stdout.read()  # until the command closes stdout (it exits)
    code = proc.wait(60)
    reader.join(10)
    os.close(leader)
    return code, out, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r", "\n")


def test_produce_and_consume_show_progress_on_a_terminal_only(server: SluiceProcess) -> None:
    topic = f"pg-{uuid.uuid4().hex[:8]}"
    lines = "".join(f"{i}\n" for i in range(N)).encode()
    code, out, err = _run(["produce", topic], server, stdin=lines, tty=True)
    assert code == 0 and out == b"", err
    assert re.search(r"producing [\d,]+ records [\d,]+/s \d+:\d\d:\d\d to " + topic, err), err
    assert f"produced {N} records to {topic}" in err

    code, out, err = _run(["consume", topic], server, tty=True)  # stdout is a pipe: records only
    assert code == 0 and out.decode().splitlines() == [str(i) for i in range(N)]
    assert re.search(r"consuming [\d,]+ records .*\d+:\d\d:\d\d from " + topic, err), err

    code, out, err = _run(["consume", topic, "--max", "3"], server, tty=False)
    assert code == 0 and out == b"0\n1\n2\n" and err == ""
    code, out, err = _run(["produce", topic], server, stdin=b"a\nb\n", tty=False)
    assert code == 0 and out == b""
    assert re.fullmatch(rf"produced 2 records to {topic} in [\d.]+ s\n", err), err  # the summary, no progress


def test_activity_shows_only_on_a_terminal_and_after_its_delay() -> None:
    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Activity("describing", "topic", console=terminal) as shown:
        shown.advance(3)
        assert shown.shown
    assert "describing 3 topics" in ANSI.sub("", terminal.file.getvalue())  # type: ignore[attr-defined]

    pipe = Console(file=io.StringIO(), force_terminal=False)
    with Activity("describing", "topic", console=pipe) as hidden:
        hidden.advance()
        assert not hidden.shown
    assert pipe.file.getvalue() == ""  # type: ignore[attr-defined]

    later = Console(file=io.StringIO(), force_terminal=True)
    with Activity("describing", "topic", console=later, delay_s=3600) as quick:
        quick.advance()
        assert not quick.shown  # a command done within its delay shows nothing
    assert later.file.getvalue() == ""  # type: ignore[attr-defined]
