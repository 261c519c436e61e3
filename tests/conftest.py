"""Suite-wide: the order test files reach pytest-xdist's workers (``make test`` runs ``-n 3 --dist loadfile``)."""

from __future__ import annotations

import os

import pytest

# schemathesis's pytest plugin imports its report writers in pytest_sessionfinish, in every process: that
# import parses their source (assertion rewriting) after the tests, when threads a test left may run code
# too, and Python 3.11.7's AST construction is not safe against that (CPython gh-106905, fixed in 3.11.8):
# a session whose tests had all passed ended in "SystemError: AST constructor recursion depth mismatch"
# here. Imported now, before any test runs, the plugin's import at the end finds them loaded.
import schemathesis.reporting.html.writer
import schemathesis.reporting.junitxml  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, files with a ``slow`` test go first: a long file handed out last would leave the
    other workers idle while it runs (longest first keeps the workers' finishing times close). Within a
    file the order is unchanged; a serial run keeps pytest's order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files stay together, in order


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist 3 hands out the files with the most tests first (``--loadscope-reorder``, on by default),
    which undid the order above: the long kill -9 files, with a few tests each, started last. Keep ours."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
