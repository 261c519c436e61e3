"""Which build of a hot module runs: its mypyc-compiled twin, or the pure-Python source.

``setup.py`` compiles the modules listed in ``native-modules.txt`` (how to add one: its header). Python
imports a compiled extension ahead of the ``.py`` beside it, so an ordinary import already gets the
compiled module when it was built. ``select`` makes that safe: it keeps the compiled module only when
the ``<module>.native-sha256`` written by the build matches the current source, and otherwise loads
the source itself (a build older than the code it sits beside must not run). ``pure`` always loads
the source, for differential tests and benchmarks. The choice is logged once per module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["DIGEST_SUFFIX", "is_compiled", "pure", "select"]

DIGEST_SUFFIX = ".native-sha256"  # setup.py writes it beside each extension it builds

log = logging.getLogger("broker.native")
_PURE_SUFFIX = "__pure"
_chosen: dict[ModuleType, ModuleType] = {}  # imported module -> the build select() chose: decided and logged once


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a C extension rather than Python source."""
    return not str(getattr(module, "__file__", "") or "").endswith(".py")


def _source_path(module: ModuleType) -> Path:
    """The ``.py`` a module (compiled or not) comes from: beside it, named after its last component."""
    return Path(str(module.__file__)).parent / (module.__name__.rpartition(".")[2] + ".py")


def pure(name: str) -> ModuleType:
    """A fresh module object run from ``name``'s Python source (registered as ``name + "__pure"``),
    whether or not a compiled build exists."""
    cached = sys.modules.get(name + _PURE_SUFFIX)
    if cached is not None:
        return cached
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module named {name!r}")
    source = Path(spec.origin).parent / (name.rpartition(".")[2] + ".py")
    pure_spec = importlib.util.spec_from_file_location(name + _PURE_SUFFIX, source)
    if pure_spec is None or pure_spec.loader is None:
        raise ImportError(f"cannot load the source of {name!r} from {source}")
    module = importlib.util.module_from_spec(pure_spec)
    sys.modules[pure_spec.name] = module
    pure_spec.loader.exec_module(module)
    return module


def select(module: ModuleType) -> ModuleType:
    """``module`` when it is the pure source or a compiled build of the current source; else the pure
    module (logged: the build is stale, rebuild with ``make native``)."""
    chosen = _chosen.get(module)
    if chosen is None:
        chosen = _chosen[module] = _choose(module)
    return chosen


def _choose(module: ModuleType) -> ModuleType:
    if not is_compiled(module):
        log.info("%s runs as pure Python (no compiled build; see setup.py)", module.__name__)
        return module
    source = _source_path(module)
    digest_file = source.with_suffix(DIGEST_SUFFIX)
    try:
        built_from = digest_file.read_text(encoding="utf-8").strip()
        current = hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError as exc:
        log.warning("%s: compiled build not verifiable (%s); running the pure source", module.__name__, exc)
        return pure(module.__name__)
    if built_from != current:
        log.warning("%s: compiled build is older than its source; running the pure source (rebuild: make native)",
                    module.__name__)
        return pure(module.__name__)
    log.info("%s runs compiled (%s)", module.__name__, Path(str(module.__file__)).name)
    return module
