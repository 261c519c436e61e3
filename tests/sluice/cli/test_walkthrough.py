"""The README's first screen and its walkthrough ("Five minutes with Sluice"), run as written.

The walkthrough's ``sh`` blocks are run in README order against a real ``sluice serve`` with the
defaults ``make run`` uses (segment store, no config file), checking what each command prints: a ``#``
line right after a command is a line it must print (``…`` stands for anything, a ``…`` line alone for
any number of lines, 13-digit numbers for any epoch-ms time); a command with no ``#`` lines must print
nothing. What the test changes, and only that: ``make run`` and ``.venv/bin/sluice serve ARGS`` start
(or restart, on the same data directory) ``python -m sluice.serve`` of this checkout on free ports;
the default ports in a command become those ports (``sluice simulate`` gets ``--port``; the CLI reads
``SLUICE_BOOTSTRAP``/``SLUICE_HTTP``); ``. .venv/bin/activate`` puts this checkout's ``sluice`` first
on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
WALKTHROUGH = "## Five minutes with Sluice"
READERS = ("kcat ", "sluice consume", "curl ")  # read-only: run again while records are on their way


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def walkthrough_steps(text: str | None = None) -> list[Step]:
    text = README.read_text() if text is None else text
    start = text.index(WALKTHROUGH)
    end = text.find("\n## ", start + len(WALKTHROUGH))
    section = text[start:end if end >= 0 else len(text)]
    steps: list[Step] = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        after_command = False
        for line in block.splitlines():
            if not line.strip():
                after_command = False
            elif line.startswith("#"):
                if after_command:
                    steps[-1].expected.append(line[1:].strip(" "))
            else:
                steps.append(Step(line))
                after_command = True
    return steps


def output_pattern(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line == "…":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        text = re.escape(line).replace("…", ".*")
        parts.append(re.sub(r"\d{13}", r"\\d{13}", text) + r"\n")
    return re.compile("".join(parts))


def _matches(expected: list[str], stdout: str) -> bool:
    out = stdout if stdout.endswith("\n") or not stdout else stdout + "\n"
    return output_pattern(expected).fullmatch(out) is not None


class Walkthrough:
    """The user's first terminal (``sluice serve``) and second terminal (the shell commands)."""

    def __init__(self, tmp_path: Path) -> None:
        self.data = tmp_path / "sluice-data"
        self.server: SluiceProcess | None = None
        shim = tmp_path / "bin" / "sluice"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sluice.cli "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
        self.path = f"{shim.parent}:{os.environ['PATH']}"

    def serve(self, args: list[str]) -> None:
        self.stop()
        # make run: segment store (the test helper's default is memory), everything else as shipped
        self.server = SluiceProcess(self.data, env={"SLUICE_STORAGE__BACKEND": "segment"}, args=args).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def env(self) -> dict[str, str]:
        assert self.server is not None, "a command ran before `make run`"
        return {**os.environ, "PATH": self.path,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                "SLUICE_BOOTSTRAP": self.server.bootstrap, "SLUICE_HTTP": self.server.http}

    def localise(self, command: str) -> str:
        assert self.server is not None
        port = {name: self.server.address(name).rsplit(":", 1)[1] for name in ("mqtt", "tcp", "kafka", "http")}
        local = (command.replace("-p 1883 ", f"-p {port['mqtt']} ")
                 .replace("localhost 8094", f"localhost {port['tcp']}")
                 .replace("localhost:9092", f"localhost:{port['kafka']}")
                 .replace("localhost:8080", f"localhost:{port['http']}"))
        if local.startswith("sluice simulate") and "--port" not in local:
            local = local.replace("sluice simulate", f"sluice simulate --port {port['mqtt']}", 1)
        return local


@pytest.fixture
def walkthrough(tmp_path: Path) -> Iterator[Walkthrough]:
    w = Walkthrough(tmp_path)
    yield w
    w.stop()


@pytest.mark.slow
def test_the_walkthrough_prints_what_the_readme_shows(walkthrough: Walkthrough) -> None:
    steps = walkthrough_steps()
    commands = [s.command for s in steps]
    assert commands[0] == "make run"
    for needed in ("mosquitto_pub ", " | nc ", "kcat ", "sluice consume sensors", "--processor processors.examples",
                   "sluice consume sensor-avg", "/console"):
        assert any(needed in c for c in commands), f"the walkthrough no longer shows {needed!r}"
    for step in steps:
        command = step.command
        if command == "make run":
            walkthrough.serve([])
            continue
        if command == ". .venv/bin/activate":
            continue
        if command.startswith((".venv/bin/sluice serve", "sluice serve")):
            walkthrough.serve(shlex.split(command)[2:])
            continue
        local = walkthrough.localise(command)
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(["bash", "-c", local], capture_output=True, text=True, env=walkthrough.env(),
                                  timeout=120)
            assert done.returncode == 0, f"{command}\n{done.stderr}"
            if _matches(step.expected, done.stdout) or not command.startswith(READERS):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)  # records sent without acks (TCP), or windows still closing: read again
        assert _matches(step.expected, done.stdout), (
            f"{command}\nprinted:\n{done.stdout}\nREADME shows:\n" + "\n".join(step.expected))


def test_output_patterns() -> None:
    assert _matches(["a …", "…", "z"], "a b\nx\ny\nz\n")
    assert _matches(["a", "…", "z"], "a\nz\n")
    assert not _matches(["a"], "a\nb\n")
    assert not _matches([], "something\n")
    assert _matches(["t=1796043361667"], "t=1800000000000")


def test_the_first_screen_gives_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    first = re.search(r"```sh\n(.*?)```", text, flags=re.S)
    assert first is not None and text.index(first.group(0)) < text.index(WALKTHROUGH)
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, flags=re.M) and re.search(r"^test: ", makefile, flags=re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec make test$", ci, flags=re.M), "CI must run the README's test command"


def test_the_readme_stays_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250, "the README is a walkthrough: reference material goes to docs/"
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
