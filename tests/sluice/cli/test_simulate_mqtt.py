"""`sluice simulate --transport mqtt` into Sluice's own MQTT listener, and `sluice sources` seeing a device go idle.

The MQTT twin of the TCP case in test_cli.py: the simulated fleet publishes at QoS 1 to the running Sluice
(PUBACK only after the durable append), the readings land in the default log topic ``sensors`` keyed by the
sensor id, and the ingest health of source ``mqtt:default`` shows the "idle" profile's device going idle
while the "steady" one, still publishing, stays active.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

from typer.testing import CliRunner

from sluice.cli import app
from tests.sluice.cli.fleet import RunningFleet, wait_until_idle
from tests.sluice_server import SluiceProcess

FIRST = 300  # sensor_300.. keeps these devices apart from the other CLI tests on the shared server


def sluice(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_simulate_over_sluice_mqtt_and_sources_shows_a_device_going_idle(server: SluiceProcess) -> None:
    host, port = server.address("mqtt").rsplit(":", 1)
    steady, slow, idle, bursty = (f"sensor_{FIRST + i}" for i in range(4))  # simulate's profiles, in turn
    with RunningFleet("--transport", "mqtt", "--host", host, "--port", port, "--sensors", "4",
                      "--first-id", str(FIRST), "--seed", "11") as fleet:
        # The peers keep sending while sources is asked: only the "idle" profile's silence can make a device idle.
        wait_until_idle(server.http, idle, fleet, source="mqtt:default")
        code, out, _ = sluice("sources", "--json", "--interval", "0.5", "--http", server.http)
        assert code == 0
        rows = json.loads(out)
        devices = {r["device"]: r for r in rows if r.get("type") == "device" and r.get("source") == "mqtt:default"}
        assert devices[idle]["idle"] is True  # three readings, then silence longer than the idle timeout
        assert devices[steady]["idle"] is False  # still publishing
        assert devices[idle]["messages"] == 3
        # states (ingest/arrivals.py): 1/s next to 10/s peers is slow, 20 readings at once are a burst; a steady
        # sender may look bursty if the loaded server took several of its readings in one 100 ms, never slow or idle
        assert (devices[idle]["state"], devices[slow]["state"], devices[bursty]["state"]) == ("idle", "slow", "bursty")
        assert devices[steady]["state"] in ("active", "bursty")

        code, out, _ = sluice("sources", "--idle", "--interval", "0", "--http", server.http)
        assert code == 0
        idle_lines = [line for line in out.splitlines() if line.startswith("│ mqtt:default")]
        assert any(idle in line for line in idle_lines) and not any(steady in line for line in idle_lines), out
        report = {s["sensor"]: s for s in fleet.stop()["sensors"]}

    assert all(s["undelivered"] == 0 and s["delivered"] == s["sent"] > 0 for s in report.values())
    assert (report[steady]["profile"], report[slow]["profile"]) == ("steady", "slow")
    assert (report[idle]["profile"], report[bursty]["profile"]) == ("idle", "bursty")
    assert report[idle]["sent"] == 3
    code, out, _ = sluice("sources", "--json", "--interval", "0", "--http", server.http)
    assert code == 0
    rows = json.loads(out)
    devices = {r["device"]: r for r in rows if r.get("type") == "device" and r.get("source") == "mqtt:default"}
    assert {d: devices[d]["messages"] for d in report} == {d: s["delivered"] for d, s in report.items()}
    (listener,) = [r for r in rows if r.get("type") == "mqtt_listener"]
    assert listener["messages_in"] >= sum(s["delivered"] for s in report.values())

    # Every acknowledged reading is in the log: default topic "sensors", keyed by the sensor id.
    done = subprocess.run(
        ["kcat", "-C", "-b", server.bootstrap, "-t", "sensors", "-o", "beginning", "-e", "-q", "-f", "%k\n"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    keys = Counter(done.stdout.splitlines())
    for sensor, s in report.items():
        assert keys[sensor] == s["delivered"]
