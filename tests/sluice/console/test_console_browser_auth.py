"""The console behind ``security.auth = required``, in headless Chromium: the same authentication as the API.

Without credentials the browser gets the 401 (with the Basic challenge that makes a person's browser ask for
the password); with a user's Basic credentials every page loads, and the live tail's EventSource (which cannot
set headers itself) is let in with the browser's credentials, showing a record produced afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect
from playwright.sync_api import Error as PlaywrightError

from broker.security import UserStore
from tests.sluice.console.browser import VIEWPORTS, Offline, shoot
from tests.sluice_server import SluiceProcess

USER, PASSWORD = "operator", "operator-pw"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = Path(tmp_path_factory.mktemp("console-auth")) / "data"
    UserStore(data).add(USER, PASSWORD)
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required", "SLUICE_SECURITY__SUPER_USERS": f'["{USER}"]'})
    proc.start()
    with httpx.Client(base_url=proc.http, auth=(USER, PASSWORD)) as http:
        assert http.post("/topics", json={"name": "meters", "partitions": 1}).status_code == 201
        body = {"records": [{"key": "m1", "value": {"kwh": 1.5}}]}
        assert http.post("/topics/meters/records", json=body).status_code == 200
    yield proc
    proc.stop()


def test_console_asks_for_credentials(browser: Browser, server: SluiceProcess) -> None:
    offline = Offline(browser, server.http, VIEWPORTS["desktop"])
    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):  # challenged, nothing to answer with
        offline.page.goto(f"{server.http}/console")
    response = offline.context.request.get(f"{server.http}/console/topics/meters/messages")
    assert response.status == 401
    assert 'Basic realm="sluice"' in (response.headers.get("www-authenticate") or "")
    assert "kwh" not in response.text()
    offline.close(expected_error="status of 401")  # the refused load, logged by the browser


def test_console_with_credentials_and_the_live_tail(browser: Browser, server: SluiceProcess) -> None:
    offline = Offline(browser, server.http, VIEWPORTS["desktop"], http_credentials={"username": USER,
                                                                                   "password": PASSWORD})
    page = offline.page
    for path in ("/console", "/console/topics", "/console/groups", "/console/sources", "/console/processors"):
        response = page.goto(server.http + path)
        assert response is not None and response.status == 200, path
    page.goto(f"{server.http}/console/topics/meters/messages")
    expect(page.locator("#browse .record")).to_have_count(1)
    expect(page.locator("#tail.connected")).to_be_visible(timeout=WAIT_MS)
    marker = uuid.uuid4().hex
    with httpx.Client(base_url=server.http, auth=(USER, PASSWORD)) as http:
        body = {"records": [{"key": "m2", "value": {"marker": marker}}]}
        assert http.post("/topics/meters/records", json=body).status_code == 200
    expect(page.locator("#tail-records .record").filter(has_text=marker)).to_be_visible(timeout=WAIT_MS)
    assert json.dumps({"marker": marker}, indent=2) in page.locator("#tail-records pre").first.inner_text()
    shoot(offline, "desktop", "auth-messages-tail")
    offline.close()
