"""Build hook: compile the hot pure-Python modules listed in ``native-modules.txt`` with mypyc.

Metadata and dependencies live in pyproject.toml; this file only adds the compiled twins. Every listed
module is ordinary, mypy-strict Python that works as it is. Compiled, the same source becomes a C
extension beside the ``.py`` (Python imports the extension first), so compiled and pure give the same
answers. ``pip install [-e] .`` (hence ``make run``, ``make test`` and the Dockerfile) runs this; mypy
(which ships mypyc) is a build requirement in pyproject.toml, the C compiler and headers come from
``scripts/install-system-deps.sh build``.

The build is best-effort, never a reason for an install to fail: without mypyc, a C compiler or
Python's headers, or on a compile error, it prints one line saying so and the pure modules are used
(``SLUICE_PURE_PYTHON=1`` skips compiling on purpose). Each built extension gets a
``<module>.native-sha256`` beside it: the digest of the source it was built from, so that
``broker.native.select`` falls back to the pure module when the source changed since (a stale build
would otherwise shadow the new code). Built files are not committed (.gitignore).

To add a module (e.g. a parser on the ingest hot path):
1. keep it to what mypyc compiles well: typed locals and arguments, ``bytes``/``int``/``list`` work,
   no closures, generators or monkey-patching in the hot loop; it must pass ``mypy`` as it is;
2. add its path to ``native-modules.txt`` (the Makefile rebuilds when a listed source changes);
3. import it where it is used through ``broker.native.select(module)``;
4. add a differential test of ``broker.native.pure("package.module")`` against the selected module on
   valid and corrupted input (``tests/broker/protocol/test_record_walk.py`` is the model), and measure
   both in ``bench/``. Rebuild in a work tree with ``make native`` (``make native VENV=/path/to/venv`` to
   use another tree's virtualenv; it builds a wheel aside and unpacks the extensions here).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE_LIST = ROOT / "native-modules.txt"
DIGEST_SUFFIX = ".native-sha256"


def native_sources() -> list[str]:
    """The listed module paths (relative to the repository root), comments and blanks skipped."""
    lines = NATIVE_LIST.read_text(encoding="utf-8").splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def _say(message: str) -> None:
    print(f"sluice native build: {message}", file=sys.stderr, flush=True)


def _module_name(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


class BestEffortBuildExt(build_ext):
    """build_ext that never fails the install, and records which source each extension came from."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, a missing compiler or Python.h
            reason = f"{type(exc).__name__}: {exc}"
            reason = reason if len(reason) <= 300 else reason[:150] + " … " + reason[-120:]
            _say(f"compiling failed ({reason}); the pure-Python modules are used")
            return
        for source in native_sources():
            digest = hashlib.sha256((ROOT / source).read_bytes()).hexdigest()
            built = Path(self.get_ext_fullpath(_module_name(source)))
            targets = {built.parent}
            if self.inplace or getattr(self, "editable_mode", False):
                targets.add(ROOT / Path(source).parent)
            targets.add(Path(self.build_lib) / Path(source).parent)
            for folder in targets:
                if folder.is_dir():
                    (folder / (Path(source).stem + DIGEST_SUFFIX)).write_text(digest + "\n", encoding="utf-8")
        _say(f"compiled {', '.join(native_sources())}")


def native_extensions() -> list[Any]:
    if os.environ.get("SLUICE_PURE_PYTHON") == "1":
        _say("SLUICE_PURE_PYTHON=1: not compiling; the pure-Python modules are used")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc (mypy) is not installed; the pure-Python modules are used")
        return []
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)  # mypyc names modules by their path from here
        return list(mypycify(native_sources(), opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypy's type errors end in SystemExit
        _say(f"mypyc could not translate the modules ({exc!r}); the pure-Python modules are used")
        return []
    finally:
        os.chdir(cwd)


setup(ext_modules=native_extensions(), cmdclass={"build_ext": BestEffortBuildExt})
