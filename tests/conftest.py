"""Suite-wide: the order test files reach pytest-xdist's workers (``make test`` runs ``-n 3 --dist loadfile``)."""

from __future__ import annotations

import os

import pytest


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
