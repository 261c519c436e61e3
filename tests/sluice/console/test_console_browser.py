"""The web console in a real headless Chromium (Debian's), driven by Playwright, against a real ``sluice serve``.

Data comes from clients nobody here wrote: confluent-kafka (librdkafka) produces to ``orders``, kcat consumes it
as a member of group ``console-readers``, mosquitto_pub publishes sensor readings (and one that is not JSON, a
dead letter) that the attached example processor windows. Every request the browser makes to a host other than
the broker is refused and recorded; each page must show its data with none. Screenshots at desktop (1280×800)
and phone (390×844) widths go to ``test-artifacts/console/``.
The browser helpers and why Playwright: ``browser.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from playwright.sync_api import Browser, Page, expect

from tests.sluice.console.browser import VIEWPORTS, Offline, shoot
from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow  # a real browser against sluice serve

TOPIC, GROUP, PARTITIONS = "orders", "console-readers", 3
DEVICES = ("sensor_a", "sensor_b")
WAIT_MS = 15_000
ORIGIN = [("origin", b"shop")]
HOSTILE = """<img src="x" onerror="window.pwned = 1"><script>window.pwned = 2</script>"""


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``check`` (an HTTP read of the server's state) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def produce(bootstrap: str, records: list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition, key, value, headers in records:
        producer.produce(TOPIC, value=value, key=key, partition=partition, headers=headers)
    assert producer.flush(15) == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = Path(tmp_path_factory.mktemp("console")) / "data"
    proc = SluiceProcess(data, args=["--processor", "processors.examples.sensors:pipeline"]).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def seeded(server: SluiceProcess) -> Iterator[dict[str, Any]]:
    """Topic ``orders`` (3 partitions) with JSON, text and binary records; a kcat group member; MQTT devices."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(15)
    records: list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]] = [
        (i % PARTITIONS, f"order-{i}".encode(), json.dumps({"order": i, "item": "widget"}).encode(), ORIGIN)
        for i in range(9)
    ]
    records.append((0, b"note", b"plain words, not JSON", []))
    records.append((1, None, bytes([0, 1, 2, 0xFF, 0xFE]), [("kind", b"binary")]))
    records.append((2, b"<b>k</b>", HOSTILE.encode(), [("note", b"<i>x</i>")]))  # shown as text, never run
    produce(server.bootstrap, records)

    member = subprocess.Popen(
        ["kcat", "-b", server.bootstrap, "-G", GROUP, "-X", "auto.commit.interval.ms=100",
         "-X", "auto.offset.reset=earliest", "-q", TOPIC],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    host, port = server.address("mqtt").rsplit(":", 1)
    mqtt = ["mosquitto_pub", "-h", host, "-p", port, "-q", "1"]
    now = int(time.time() * 1000)
    for device in DEVICES:
        lines = "\n".join(
            json.dumps({"sensor": device, "temp": 20 + i, "ts": now - 5_000 + i * 500}) for i in range(6)
        )
        subprocess.run([*mqtt, "-i", device, "-t", f"sensors/{device}", "-l"], input=lines, text=True, check=True,
                       timeout=30)
    subprocess.run([*mqtt, "-i", "sensor_bad", "-t", "sensors/sensor_bad", "-m", "oops"], check=True, timeout=30)
    http = httpx.Client(base_url=server.http, timeout=10)

    def group_caught_up() -> bool:
        r = http.get(f"/groups/{GROUP}")
        return r.status_code == 200 and bool(r.json()["members"]) and r.json()["total_lag"] == 0

    wait_until(group_caught_up, "kcat's group to commit everything")
    wait_until(lambda: any(r["errors"] for r in http.get("/sources").json() if r["type"] == "source"),
               "the dead letter")
    wait_until(lambda: http.get("/processors").json()[0]["records_in"] >= 12, "the processor to read the readings")
    yield {"records": len(records), "http": http}
    member.terminate()
    member.wait(10)
    http.close()


@pytest.fixture
def pages(browser: Browser, server: SluiceProcess) -> Iterator[dict[str, Offline]]:
    opened = {name: Offline(browser, server.http, size) for name, size in VIEWPORTS.items()}
    yield opened
    for offline in opened.values():
        offline.close()


def check_overview(page: Page, seeded: dict[str, Any]) -> None:
    expect(page.locator("#storage")).to_contain_text("partitions")
    expect(page.locator("#connections")).to_contain_text("Kafka")
    expect(page.locator("#throughput-in")).to_contain_text("rec/s")
    expect(page.locator(".endpoints")).to_contain_text("kafka")


def check_topics(page: Page, seeded: dict[str, Any]) -> None:
    row = page.locator(f"tr[data-topic='{TOPIC}']")
    expect(row).to_contain_text(str(PARTITIONS))
    expect(row).to_contain_text(str(seeded["records"]))
    expect(page.locator("tr[data-topic='sensors']")).to_be_visible()


def check_topic(page: Page, seeded: dict[str, Any]) -> None:
    expect(page.locator("table.partitions tbody tr")).to_have_count(PARTITIONS)
    expect(page.locator("table.partitions td.hw").first).to_have_text("4")  # 3 orders + the text note
    expect(page.locator("table.config")).to_contain_text("retention.ms")


def check_messages(page: Page, seeded: dict[str, Any]) -> None:
    browse = page.locator("#browse")
    expect(browse.locator(".record")).to_have_count(seeded["records"])
    expect(browse.locator("pre.view-json").first).to_contain_text('"item": "widget"')  # pretty-printed
    expect(browse).to_contain_text("plain words, not JSON")
    expect(browse.locator("pre.view-hex")).to_contain_text("00 01 02 ff fe")
    expect(browse.locator(".headers").first).to_contain_text("origin")
    expect(browse.locator(".record[data-partition='2'] pre").last).to_have_text(HOSTILE)  # escaped, as text
    expect(browse.locator(".record[data-partition='2'] .headers").last).to_contain_text("<i>x</i>")
    assert page.evaluate("window.pwned") is None


def check_groups(page: Page, seeded: dict[str, Any]) -> None:
    row = page.locator(f"tr[data-group='{GROUP}']")
    expect(row).to_contain_text("Stable")
    expect(row.locator("td.n")).to_have_text(["1", "0"])  # one member (kcat), no lag


def check_group(page: Page, seeded: dict[str, Any]) -> None:
    expect(page.locator("table.members tbody tr")).to_have_count(1)
    expect(page.locator("table.members")).to_contain_text("rdkafka")
    expect(page.locator("table.lag tbody tr")).to_have_count(PARTITIONS)
    expect(page.locator("table.lag td.lag")).to_have_text(["0"] * PARTITIONS)
    expect(page.locator(".total-lag")).to_have_text("0")


def check_sources(page: Page, seeded: dict[str, Any]) -> None:
    for device in DEVICES:
        expect(page.locator(f"tr[data-device='{device}']")).to_contain_text("mqtt:default")
    expect(page.locator("tr[data-source='mqtt:default'] .state")).to_have_count(1)
    expect(page.locator("table.dead-letters")).to_contain_text("sensor_bad")
    expect(page.locator("table.dead-letters td.reason").first).not_to_be_empty()


def check_processors(page: Page, seeded: dict[str, Any]) -> None:
    section = page.locator("section.processor[data-processor='sensor-avg']")
    expect(section).to_contain_text("running")
    expect(section.locator("table.partitions tbody tr").first).to_be_visible()
    expect(section.locator(".late")).to_contain_text("late")
    expect(section.locator(".checkpoint-age")).not_to_be_empty()


PAGES: list[tuple[str, str, Callable[[Page, dict[str, Any]], None]]] = [
    ("overview", "/console", check_overview),
    ("topics", "/console/topics", check_topics),
    ("topic", f"/console/topics/{TOPIC}", check_topic),
    ("messages", f"/console/topics/{TOPIC}/messages?limit=50", check_messages),
    ("groups", "/console/groups", check_groups),
    ("group", f"/console/groups/{GROUP}", check_group),
    ("sources", "/console/sources", check_sources),
    ("processors", "/console/processors", check_processors),
]


@pytest.mark.parametrize(("name", "path", "check"), PAGES, ids=[p[0] for p in PAGES])
def test_page_shows_its_data_offline_at_both_widths(
    pages: dict[str, Offline], seeded: dict[str, Any], server: SluiceProcess, name: str, path: str,
    check: Callable[[Page, dict[str, Any]], None],
) -> None:
    for viewport, offline in pages.items():
        response = offline.page.goto(server.http + path)
        assert response is not None and response.status == 200
        check(offline.page, seeded)
        shoot(offline, viewport, name)
        if viewport == "phone":  # nothing wider than the screen but inside the tables' own scroll boxes
            overflow = offline.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} is {overflow}px wider than a phone"


def test_live_tail_shows_a_new_record(pages: dict[str, Offline], seeded: dict[str, Any], server: SluiceProcess) -> None:
    page = pages["desktop"].page
    page.goto(f"{server.http}/console/topics/{TOPIC}/messages")
    expect(page.locator("#tail.connected")).to_be_visible(timeout=WAIT_MS)  # htmx's EventSource is open
    marker = uuid.uuid4().hex
    produce(server.bootstrap, [(2, b"tail", json.dumps({"marker": marker, "n": 1}).encode(), [("live", b"yes")])])
    fresh = page.locator("#tail-records .record").filter(has_text=marker)
    expect(fresh).to_be_visible(timeout=WAIT_MS)
    expect(fresh.locator("pre.view-json")).to_contain_text(f'"marker": "{marker}"')
    expect(fresh.locator(".headers")).to_contain_text("live")
    shoot(pages["desktop"], "desktop", "messages-tail")


def test_pages_update_without_a_reload(
    pages: dict[str, Offline], seeded: dict[str, Any], server: SluiceProcess
) -> None:
    page = pages["desktop"].page
    page.goto(f"{server.http}/console/topics/{TOPIC}")
    high = page.locator("table.partitions td.hw").nth(1)
    before = int(high.inner_text().replace(",", ""))
    page.evaluate("window.notReloaded = true")
    produce(server.bootstrap, [(1, None, b'{"more": true}', [])])
    expect(high).to_have_text(str(before + 1), timeout=WAIT_MS)  # htmx swapped in the new #live
    assert page.evaluate("window.notReloaded") is True


def test_messages_by_offset_by_time_and_as_hex(
    pages: dict[str, Offline], seeded: dict[str, Any], server: SluiceProcess
) -> None:
    page = pages["phone"].page
    page.goto(f"{server.http}/console/topics/{TOPIC}/messages")
    page.select_option("select[name=partition]", "0")
    page.fill("input[name=offset]", "2")
    page.select_option("select[name=view]", "hex")
    page.click("form.browse button")
    records = page.locator("#browse .record")
    expect(records.first).to_have_attribute("data-offset", "2")
    expect(records).to_have_count(2)  # offsets 2 and 3 of partition 0
    expect(records.locator("pre.view-hex").first).to_contain_text("7b 22")  # '{"' as hex
    page.goto(f"{server.http}/console/topics/{TOPIC}/messages?at=2000-01-01T00:00:00Z&limit=3")
    expect(page.locator("#browse .record")).to_have_count(3)
    before = list(pages["phone"].errors)
    response = page.goto(f"{server.http}/console/topics/{TOPIC}/messages?offset=1")
    assert response is not None and response.status == 400
    expect(page.locator("#live p.error")).to_contain_text("choose a partition")  # an offset needs one
    expect(page.locator("form.browse")).to_be_visible()  # the form stays, to fix the input
    assert [e for e in pages["phone"].errors if e not in before] == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]
    pages["phone"].errors[:] = before  # that 400 was the point


def test_api_docs_work_offline(pages: dict[str, Offline], server: SluiceProcess) -> None:
    page = pages["desktop"].page
    page.goto(f"{server.http}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Sluice", timeout=WAIT_MS)
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    shoot(pages["desktop"], "desktop", "docs")
    page.goto(f"{server.http}/redoc")
    expect(page.locator("h1").first).to_contain_text("Sluice", timeout=WAIT_MS)
    expect(page.get_by_text("/topics/{topic}/records").first).to_be_attached()
    shoot(pages["desktop"], "desktop", "redoc")
    # ReDoc's bundle always asks for its "API docs by Redocly" logo from its CDN (hard-coded; it hides the image
    # when that fails): the one request refused, and the page works without it
    assert pages["desktop"].refused == ["https://cdn.redoc.ly/redoc/logo-mini.svg"]
    assert [e for e in pages["desktop"].errors if "ERR_BLOCKED_BY_CLIENT" not in e] == []
    pages["desktop"].refused.clear()
    pages["desktop"].errors.clear()
