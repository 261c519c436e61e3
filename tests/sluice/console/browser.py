"""Shared by the console's browser tests: the system Chromium, a page that may reach only the broker, screenshots.

Playwright rather than Selenium: it drives Debian's chromium without a separate driver binary, its request
routing is how "no network but the broker" is enforced, and its expectations wait on the page (no sleeps).
Chromium missing: the tests skip, except under CI (``CI`` set), where scripts/install-system-deps.sh
installs it and a skip would hide a broken install.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Route

__all__ = ["ARTIFACTS", "VIEWPORTS", "Offline", "chromium_or_skip", "shoot"]

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "console"
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}


def chromium_or_skip() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: scripts/install-system-deps.sh installs it for the console tests")
        pytest.skip("Debian's chromium is not installed (bash scripts/install-system-deps.sh)")
    return found


class Offline:
    """A browser page that may reach only the broker's HTTP address; everything else is refused and recorded."""

    def __init__(self, browser: Browser, origin: str, viewport: tuple[int, int], **context: Any) -> None:
        self.origin = origin
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, **context)
        self.context.route("**/*", self._route)
        self.page: Page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route: Route) -> None:
        parts = urlsplit(route.request.url)
        if f"{parts.scheme}://{parts.netloc}" == self.origin:
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort("blockedbyclient")

    def close(self, expected_error: str | None = None) -> None:
        """Close, then check nothing went beyond the broker and the page logged no error other than ones
        containing ``expected_error`` (Chromium reports a refused load asynchronously, maybe after close)."""
        self.context.close()
        assert not self.refused, f"requests beyond the broker: {self.refused}"
        errors = [e for e in self.errors if expected_error is None or expected_error not in e]
        assert not errors, f"errors in the page: {errors}"


def shoot(offline: Offline, viewport: str, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}-{viewport}.png"
    offline.page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5_000
