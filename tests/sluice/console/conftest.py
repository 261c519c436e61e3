from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.sluice.console.browser import chromium_or_skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per test module."""
    executable = chromium_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        yield b
        b.close()
