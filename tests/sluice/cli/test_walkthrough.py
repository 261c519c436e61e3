"""The README's device walkthrough ("Publishing from a device", "Consuming"), run as written against a
``sluice serve`` with the defaults (``make run``), checking what each command prints.

The ``sh`` blocks are found by what they contain (the MQTT publish to port 1883, the kcat read of
``sensors``), so they may move within the README or into ``docs/``. In a block, a ``#`` line right
after a command is the output the command must print (``…`` stands for anything, 13-digit numbers for
any epoch-ms time); other ``#`` lines are prose. The only changes made to a command: the default ports
become the test server's free ports, and ``sluice`` runs this checkout's CLI.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]
MARKERS = ("mosquitto_pub -h localhost -p 1883", "-C -t sensors -o beginning")
# Not run here: reading the processor's output needs the processor attached (its own walkthrough step),
# and an SSE stream never ends by itself.
SKIPPED = ("-G dashboard", "curl -N")


def _docs() -> str:
    texts = [(ROOT / "README.md").read_text()]
    docs = ROOT / "docs"
    if docs.is_dir():
        texts += [p.read_text() for p in sorted(docs.rglob("*.md"))]
    return "\n".join(texts)


def walkthrough_steps() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) in README order, from the blocks holding the markers."""
    blocks = re.findall(r"```sh\n(.*?)```", _docs(), flags=re.S)
    steps: list[tuple[str, list[str]]] = []
    for marker in MARKERS:
        found = [b for b in blocks if marker in b]
        assert found, f"no sh block with {marker!r} in README.md or docs/: the walkthrough moved?"
        after_command = False
        for line in found[0].splitlines():
            if not line.strip():
                after_command = False
            elif line.startswith("#"):
                if after_command:
                    steps[-1][1].append(line[1:].strip(" "))
            else:
                steps.append((line, []))
                after_command = True
    return steps


def _pattern(expected: str) -> re.Pattern[str]:
    text = re.escape(expected).replace("…", ".*")
    return re.compile(re.sub(r"\d{13}", r"\\d{13}", text) + "$")


@pytest.fixture
def shell_env(default_server: SluiceProcess, tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "bin" / "sluice"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sluice.cli "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return {
        **os.environ,
        "PATH": f"{shim.parent}:{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SLUICE_BOOTSTRAP": default_server.bootstrap,
        "SLUICE_HTTP": default_server.http,
    }


def _localise(command: str, server: SluiceProcess) -> str:
    port = {name: server.address(name).rsplit(":", 1)[1] for name in ("mqtt", "tcp", "kafka", "http")}
    return (command.replace("-p 1883 ", f"-p {port['mqtt']} ")
            .replace("localhost 8094", f"localhost {port['tcp']}")
            .replace("localhost:9092", f"localhost:{port['kafka']}")
            .replace("localhost:8080", f"localhost:{port['http']}"))


def test_the_device_walkthrough_prints_what_the_readme_shows(
    default_server: SluiceProcess, shell_env: dict[str, str]
) -> None:
    steps = walkthrough_steps()
    assert any("mosquitto_pub" in c for c, _ in steps) and any(" nc " in c for c, _ in steps)
    assert any(c.startswith("sluice consume") for c, _ in steps)
    ran = 0
    for command, expected in steps:
        if any(skip in command for skip in SKIPPED):
            continue
        local = _localise(command, default_server)
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(["bash", "-c", local], capture_output=True, text=True, env=shell_env, timeout=60)
            assert done.returncode == 0, f"{command}\n{done.stderr}"
            lines = done.stdout.splitlines()
            # Readings sent over TCP without acks may still be on their way into the log: read again.
            if len(lines) >= len(expected) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(lines) == len(expected), f"{command}\nprinted:\n{done.stdout}"
        for got, want in zip(lines, expected, strict=True):
            assert _pattern(want).match(got), f"{command}\nprinted: {got}\nREADME:  {want}"
        ran += 1
    assert ran >= 6
