"""The `sluice` client commands against a real Sluice: happy paths, main errors and their exit codes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aiomqtt
import httpx
import pytest
from typer.testing import CliRunner

from sluice.cli import app
from tests.clients.mosquitto import Mosquitto, free_port
from tests.sluice.cli.fleet import RunningFleet, wait_until_idle
from tests.sluice_server import SluiceProcess

runner = CliRunner()


def sluice(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


def name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_topics_lifecycle(server: SluiceProcess) -> None:
    t = name()
    code, out, _ = sluice("topics", "create", t, "-p", "3", "-c", "retention.ms=3600000", "-b", server.bootstrap)
    assert code == 0 and f"created topic {t}" in out
    code, out, _ = sluice("topics", "list", "--json", "-b", server.bootstrap)
    assert code == 0 and {"topic": t, "partitions": 3, "records": 0} in json.loads(out)
    code, out, _ = sluice("topics", "list", "-b", server.bootstrap)
    assert code == 0 and t in out  # table
    code, out, _ = sluice("topics", "describe", t, "--json", "-b", server.bootstrap)
    assert code == 0 and [p["partition"] for p in json.loads(out)["partitions"]] == [0, 1, 2]
    code, _, err = sluice("topics", "create", t, "-b", server.bootstrap)
    assert code == 1 and "already exists" in err
    code, out, _ = sluice("topics", "delete", t, "--yes", "-b", server.bootstrap)
    assert code == 0 and f"deleted topic {t}" in out
    code, _, err = sluice("topics", "describe", t, "-b", server.bootstrap)
    assert code == 4 and f"unknown topic '{t}': create it with `sluice topics create {t}`" in err


def test_broker_down_exits_3_with_the_fix() -> None:
    address = f"127.0.0.1:{free_port()}"
    for args in (["topics", "list"], ["consume", "x"], ["groups", "list"]):
        code, _, err = sluice(*args, "-b", address)
        assert code == 3, (args, err)
        assert f"cannot reach Sluice at {address}: is `sluice serve` running? pass --bootstrap" in err
    code, _, err = sluice("sources", "--http", f"http://{address}")
    assert code == 3 and "pass --http" in err


def test_usage_errors_exit_2(server: SluiceProcess) -> None:
    assert sluice("consume", "t", "--from", "yesterday", "-b", server.bootstrap)[0] == 2
    assert sluice("produce", "t", "--format", "xml", "-b", server.bootstrap)[0] == 2
    assert sluice("topics", "create")[0] == 2


def test_produce_json_and_consume_formats(server: SluiceProcess) -> None:
    t = name()
    sluice("topics", "create", t, "-p", "2", "-b", server.bootstrap)
    lines = "\n".join(json.dumps({"sensor": f"sensor_{i % 2}", "temp": 60 + i}) for i in range(6)) + "\n"
    code, out, _ = sluice(
        "produce",
        t,
        "--format",
        "json",
        "--key-field",
        "sensor",
        "-H",
        "unit=F",
        "--json",
        "-b",
        server.bootstrap,
        input=lines,
    )
    assert code == 0 and json.loads(out)["records"] == 6
    code, out, _ = sluice("consume", t, "--format", "json", "-b", server.bootstrap)
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["value"]["temp"] for r in records) == list(range(60, 66))
    assert all(r["key"] == r["value"]["sensor"] and r["headers"] == {"unit": "F"} for r in records)
    code, out, _ = sluice("consume", t, "--max", "2", "-b", server.bootstrap)
    assert code == 0 and len(out.splitlines()) == 2

    code, _, err = sluice("produce", t, "--format", "json", "-b", server.bootstrap, input="{not json\n")
    assert code == 2 and "line 1 is not JSON" in err


def test_consume_from_offset_and_time(server: SluiceProcess) -> None:
    t = name()
    sluice("topics", "create", t, "-b", server.bootstrap)
    sluice("produce", t, "-b", server.bootstrap, input="a\nb\nc\n")
    code, out, _ = sluice("consume", t, "--from", "offset:1", "-b", server.bootstrap)
    assert out.splitlines() == ["b", "c"]
    marker = int(time.time() * 1000) + 1
    time.sleep(0.01)
    sluice("produce", t, "-b", server.bootstrap, input="d\n")
    code, out, _ = sluice("consume", t, "--from", f"time:{marker}", "--format", "kv", "-b", server.bootstrap)
    assert code == 0 and out.splitlines() == ["\td"]
    code, _, err = sluice("consume", name(), "-b", server.bootstrap)
    assert code == 4 and "unknown topic" in err


def test_produce_rate_limit(server: SluiceProcess) -> None:
    t = name()
    started = time.monotonic()
    code, out, _ = sluice(
        "produce", t, "--rate", "40", "--json", "-b", server.bootstrap, input="".join(f"{i}\n" for i in range(9))
    )
    assert code == 0 and json.loads(out)["records"] == 9
    assert time.monotonic() - started >= 8 / 40  # nine records at 40/s need at least 0.2 s


def test_groups_list_and_describe_with_lag(server: SluiceProcess) -> None:
    t, g = name(), name()
    sluice("topics", "create", t, "-p", "2", "-b", server.bootstrap)
    sluice("produce", t, "-b", server.bootstrap, input="1\n2\n3\n4\n")
    code, out, _ = sluice("consume", t, "--group", g, "-b", server.bootstrap)
    assert code == 0 and sorted(out.splitlines()) == ["1", "2", "3", "4"]
    code, out, _ = sluice("groups", "list", "--json", "-b", server.bootstrap)
    row = next(r for r in json.loads(out) if r["group"] == g)
    assert row["lag"] == 0
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(3))
    sluice("produce", t, "--format", "json", "-p", "0", "-b", server.bootstrap, input=lines)
    code, out, _ = sluice("groups", "describe", g, "--json", "-b", server.bootstrap)
    info = json.loads(out)
    p0 = next(p for p in info["partitions"] if p["partition"] == 0)
    assert p0["lag"] == 3 and p0["event_time_lag_ms"] is not None and p0["event_time_lag_ms"] >= 0
    assert sum(p["lag"] for p in info["partitions"]) == 3
    code, out, _ = sluice("groups", "describe", g, "-b", server.bootstrap)
    assert code == 0 and "event-time lag" in out
    code, _, err = sluice("groups", "describe", "nobody-" + g, "-b", server.bootstrap)
    assert code == 4 and "unknown consumer group" in err

    detail = httpx.get(f"{server.http}/groups/{g}").json()  # the HTTP API reads the same coordinator
    assert detail["total_lag"] == 3 and detail["partitions"][0]["committed_offset"] is not None


def test_simulate_over_tcp_and_sources_shows_a_device_going_idle(server: SluiceProcess) -> None:
    host, port = server.address("tcp").rsplit(":", 1)
    with RunningFleet("--transport", "tcp", "--host", host, "--port", port, "--sensors", "4", "--seed", "7") as fleet:
        # sensor_0 ("steady") keeps sending while sources is asked; sensor_2 ("idle") stopped after three readings
        wait_until_idle(server.http, "sensor_2", fleet)
        code, out, _ = sluice("sources", "--json", "--interval", "0.5", "--http", server.http)
        assert code == 0
        devices = {r["device"]: r for r in json.loads(out) if r.get("type") == "device"}
        assert devices["sensor_2"]["idle"] is True
        assert devices["sensor_0"]["idle"] is False
        assert devices["sensor_2"]["messages"] == 3
        code, out, _ = sluice("sources", "--idle", "--interval", "0", "--http", server.http)
        assert code == 0 and "sensor_2" in out and "sensor_0" not in out
        report = fleet.stop()
    assert report["tcp_acks"] is True  # this server runs tcp.ack = true: simulate found out and used it
    assert all(s["undelivered"] == 0 and s["delivered"] == s["sent"] > 0 for s in report["sensors"])

    metrics = httpx.get(f"{server.http}/metrics").text
    assert 'sluice_ingest_messages_total{device="sensor_0"' in metrics
    code, out, _ = sluice("consume", "sensors", "--format", "json", "--max", "1", "-b", server.bootstrap)
    assert code == 0 and json.loads(out)["value"]["sensor"].startswith("sensor_")


def test_simulate_over_mqtt(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path)
    broker.start()
    try:
        got: list[bytes] = []

        async def watch(ready: asyncio.Event, stop: asyncio.Event) -> None:
            async with aiomqtt.Client("127.0.0.1", broker.port) as client:
                await client.subscribe("sensors/#", qos=1)
                ready.set()
                async for message in client.messages:
                    got.append(bytes(message.payload))

        async def scenario() -> tuple[int, str]:
            ready, stop = asyncio.Event(), asyncio.Event()
            watcher = asyncio.create_task(watch(ready, stop))
            await ready.wait()
            result = await asyncio.to_thread(
                runner.invoke,
                app,
                [
                    "simulate",
                    "--port",
                    str(broker.port),
                    "--sensors",
                    "2",
                    "--profile",
                    "steady",
                    "--duration",
                    "1",
                    "--json",
                ],
            )
            await asyncio.sleep(0.3)
            watcher.cancel()
            return result.exit_code, result.stdout

        code, out = asyncio.run(scenario())
        assert code == 0
        sent = sum(s["delivered"] for s in json.loads(out)["sensors"])
        assert sent >= 10 and len(got) == sent
        assert {json.loads(p)["sensor"] for p in got} == {"sensor_0", "sensor_1"}
    finally:
        broker.cleanup()


def test_simulate_with_nobody_listening_exits_3() -> None:
    code, _, err = sluice(
        "simulate", "--transport", "tcp", "--port", str(free_port()), "--sensors", "1", "--duration", "0.3"
    )
    assert code == 3 and "not delivered" in err and "pass --port" in err


@pytest.mark.parametrize("args", [["--help"], ["topics", "--help"], ["groups", "--help"]])
def test_help(args: list[str]) -> None:
    assert sluice(*args)[0] == 0
