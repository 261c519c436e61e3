"""The console's templates and static files are package data: every one of them matches pyproject's globs,
so a wheel (`pip install .`, the Docker image) carries what `sluice serve` serves at /console."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import sluice.console

ROOT = Path(__file__).resolve().parents[3]


def test_every_console_file_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sluice.console"]
    package = Path(sluice.console.__file__).parent
    files = [p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file() and p.suffix != ".pyc"]
    data = [f for f in files if not f.endswith(".py")]
    assert {"templates/base.html", "static/htmx.min.js", "static/htmx-ext-sse.min.js"} <= set(data)
    missing = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"not in [tool.setuptools.package-data] of pyproject.toml: {missing}"
