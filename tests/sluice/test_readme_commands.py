"""Every `sluice …` command the README and docs/ show parses against the real CLI with the options it shows.

Code blocks (``sh``) and inline code spans are scanned. The README's shorthand is expanded before parsing:
``[--opt value]`` brackets are dropped (optional parts are checked too) and ``a|b|c`` checks each
alternative of an option's value; ``--help`` is left out (it would print and exit); inline spans with a
``<placeholder>`` (``sluice <command> --help``) are not commands and are skipped.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from sluice.cli import app
from tests.sluice.test_compose import parse_sluice_args

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_NAME_ONLY = re.compile(r"^sluice ([a-z]+)$")  # a command named in prose, not run
_ENTRY = re.compile(r"(?:^|[|;]\s*|&&\s*)(?:\.venv/bin/)?sluice\s+(.*)$")


def _shell_commands(text: str) -> list[str]:
    """What follows ``sluice`` in each command of the README's ``sh`` blocks and inline code spans."""
    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            match = _ENTRY.search(line.strip())
            if match:
                found.append(match.group(1))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose):
        span = " ".join(span.split())
        if span.startswith("sluice ") and "<" not in span and not _NAME_ONLY.match(span):
            found.append(span.removeprefix("sluice "))
    return found


def named_commands() -> list[str]:
    """Commands prose names without arguments (```sluice process` exits 1 …``): they must exist."""
    names: list[str] = []
    for page in PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        names += [m.group(1) for m in (_NAME_ONLY.match(" ".join(span.split()))
                                      for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose)) if m]
    return names


def _variants(rest: str) -> list[list[str]]:
    rest = re.split(r"\s+#\s", rest, maxsplit=1)[0]  # a trailing comment
    rest = re.split(r"\s[|>]\s", rest, maxsplit=1)[0]  # piped into, or redirected to, something else
    tokens = [t.strip("[]") for t in shlex.split(rest)]
    tokens = [t for t in tokens if t and t != "--help"]
    variants = [tokens]
    for i, token in enumerate(tokens):
        if "|" in token and i > 0 and tokens[i - 1].startswith("-"):
            variants = [[*v[:i], alt, *v[i + 1:]] for v in variants for alt in token.split("|")]
    return variants


def commands() -> list[list[str]]:
    out: list[list[str]] = []
    for page in PAGES:
        for rest in _shell_commands(page.read_text()):
            out.extend(_variants(rest))
    return out


def test_the_docs_show_the_main_commands() -> None:
    shown = {tuple(c[:2]) if c[0] in ("topics", "groups") else (c[0],) for c in commands()}
    for expected in [("serve",), ("topics", "create"), ("topics", "list"), ("topics", "describe"),
                     ("topics", "delete"), ("produce",), ("consume",), ("groups", "list"), ("groups", "describe"),
                     ("simulate",), ("sources",), ("process",), ("demo",)]:
        assert expected in shown, expected


def test_commands_named_in_prose_exist() -> None:
    names = named_commands()
    assert "process" in names
    group: Any = typer.main.get_command(app)
    known = set(group.list_commands(group.context_class(group)))
    for name in names:
        assert name in known, f"`sluice {name}` is not a sluice command"


@pytest.mark.parametrize("args", commands(), ids=lambda a: " ".join(a))
def test_readme_command_parses(args: list[str]) -> None:
    parse_sluice_args(args)  # unknown commands or options, bad values, missing arguments raise
