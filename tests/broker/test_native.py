"""broker.native: a compiled build runs only when it was built from the source beside it."""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import shutil
import sys
import tomllib
import types
from pathlib import Path

import pytest

from broker import native
from broker.protocol import record_walk

SOURCE = Path(record_walk.__file__).parent / "record_walk.py"


def _built_module(folder: Path, digest: str | None) -> types.ModuleType:
    """A module object laid out as setup.py leaves a build: an extension file, the source beside it,
    and (unless None) the digest the build recorded."""
    shutil.copy(SOURCE, folder / "record_walk.py")
    if digest is not None:
        (folder / ("record_walk" + native.DIGEST_SUFFIX)).write_text(digest + "\n")
    module = types.ModuleType("broker.protocol.record_walk")
    module.__file__ = str(folder / "record_walk.cpython-311-x86_64-linux-gnu.so")
    return module


def test_a_build_of_the_current_source_is_kept(tmp_path: Path) -> None:
    module = _built_module(tmp_path, hashlib.sha256(SOURCE.read_bytes()).hexdigest())
    assert native.is_compiled(module)
    assert native.select(module) is module


def test_a_build_older_than_its_source_gives_way_to_the_source(tmp_path: Path) -> None:
    module = _built_module(tmp_path, hashlib.sha256(b"an older version").hexdigest())
    chosen = native.select(module)
    assert chosen is not module and not native.is_compiled(chosen)
    assert chosen.walk_records(bytes(61) + b"\x0c" + bytes(6), 61, 68, 1) == (0, [])


def test_a_build_without_its_digest_gives_way_to_the_source(tmp_path: Path) -> None:
    chosen = native.select(_built_module(tmp_path, None))
    assert not native.is_compiled(chosen)


def test_pure_always_runs_the_source() -> None:
    module = native.pure("broker.protocol.record_walk")
    assert Path(str(module.__file__)).name == "record_walk.py"
    assert native.pure("broker.protocol.record_walk") is module
    assert not native.is_compiled(native.select(module))


def test_importers_take_every_name_of_a_compiled_module_from_select() -> None:
    """A stale build is still what ``import`` returns; only ``native.select`` falls back to the source.
    A name read from the imported module beside ``select``'s choice mixed the two (``batch_validation``
    read ``record_walk.LONGEST_DELTA`` and ``finish_walk`` so: with a stale build every Produce failed)."""
    import ast

    root = Path(native.__file__).parent.parent
    compiled = [line.split("#")[0].strip() for line in (root / "native-modules.txt").read_text().splitlines()]
    names = {Path(path).stem: path.removesuffix(".py").replace("/", ".") for path in compiled if path}
    direct_reads = []
    for source in root.glob("[a-z]*/**/*.py"):
        if "tests" in source.parts or "bench" in source.parts or ".venv" in source.parts:
            continue
        tree = ast.parse(source.read_text(encoding="utf-8"))
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if f"{node.module}.{alias.name}" in names.values()}
        direct_reads += [f"{source.relative_to(root)}:{node.lineno} {node.value.id}.{node.attr}"
                         for node in ast.walk(tree)
                         if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                         and node.value.id in imported]
    assert direct_reads == []


def test_every_library_a_compiled_module_imports_is_a_build_requirement() -> None:
    """mypyc type-checks the modules in pip's isolated build environment: a library missing there fails the
    build on a fresh machine (pure Python in CI) while a developer's venv, which has it, builds fine."""
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    requires = project["build-system"]["requires"]
    available = {req.split(">")[0].split("<")[0].split("=")[0].strip().replace("-", "_") for req in requires}
    available |= {module for override in project["tool"]["mypy"]["overrides"]  # typed as Any when missing
                  if override.get("ignore_missing_imports") for module in override["module"]}
    first_party = {"broker", "ingest", "clients", "processors", "sluice"}
    for line in (root / "native-modules.txt").read_text().splitlines():
        source = line.split("#")[0].strip()
        if not source:
            continue
        tree = ast.parse((root / source).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        third_party = imported - set(sys.stdlib_module_names) - first_party - {"mypy_extensions"}
        assert third_party <= available, f"{source} imports {sorted(third_party - available)}: add to build-system"


def test_every_listed_module_runs_compiled_where_the_install_could_build_it() -> None:
    """CI installs with a compiler (make test): there every module of native-modules.txt must run its
    compiled build of the current source, or a failed build (pure Python, ~2-3x slower on the hot paths)
    would pass unnoticed, as it did when orjson was missing from the build requirements."""
    if not os.environ.get("CI"):
        pytest.skip("outside CI a tree may run the pure modules on purpose (no `make native`)")
    root = Path(__file__).resolve().parents[2]
    sources = [line.split("#")[0].strip() for line in (root / "native-modules.txt").read_text().splitlines()]
    pure = [source for source in sources if source and not native.is_compiled(
        native.select(importlib.import_module(source.removesuffix(".py").replace("/", "."))))]
    assert pure == [], f"running the pure source in CI (the mypyc build failed? see the install log): {pure}"
