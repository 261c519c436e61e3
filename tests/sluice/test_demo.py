"""The compose stack without Docker, end to end: ``sluice demo``'s launcher with real processes.

A real Mosquitto, ``sluice serve`` with the bridge subscribed to it, three simulators (MQTT to Sluice,
MQTT to Mosquitto through the bridge, TCP to Sluice; each a mix of steady, slow, idle and bursty
devices with injected jumps) and the standalone sensor processor run for ~30 s. Then the simulators
stop, the processor catches up (group lag 0) and stops, and kcat reads every topic back. The window
results must equal a batch computation over the input records read back from the log, the alerts must
equal the alerts computed over the same input, idle devices must not hold back anybody's windows, and
every injected jump must raise an alert.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.cli_demo import GROUP, TOPICS, DemoConfig, DemoStack

pytestmark = pytest.mark.slow  # a ~30 s run of the whole stack, shared by the module

RUN_S = 32.0
WINDOW_MS = 10_000
BOUND_MS = 5_000  # the sensor pipeline's out-of-orderness bound
SENSORS = 8  # per simulator: ids 0.., 100.., 200..; the mix profile makes i % 4 == 2 idle


@dataclass
class Message:
    partition: int
    offset: int
    key: str | None
    value: dict[str, Any]
    headers: dict[str, str]


def kcat(bootstrap: str, topic: str, *, may_be_missing: bool = False) -> list[Message]:
    out = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-J"],
                         capture_output=True, text=True, timeout=60)
    if may_be_missing and "Unknown topic or partition" in out.stderr:
        return []  # created on the first late record; none is fine
    assert out.returncode == 0, out.stderr
    messages = []
    for line in out.stdout.splitlines():
        m = json.loads(line)
        raw = m.get("headers") or []
        headers = dict(zip(raw[0::2], raw[1::2], strict=True))
        messages.append(Message(m["partition"], m["offset"], m["key"], json.loads(m["payload"]), headers))
    return sorted(messages, key=lambda m: (m.partition, m.offset))


def _http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class Run:
    stack: DemoStack
    inputs: list[Message]
    outputs: list[Message]
    late: list[Message]
    alerts: list[Message]
    sim_reports: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    assert shutil.which("kcat") and (shutil.which("mosquitto") or os.path.exists("/usr/sbin/mosquitto")), \
        "kcat and mosquitto are installed by scripts/install-system-deps.sh"
    data = tmp_path_factory.mktemp("demo")
    stack = DemoStack(DemoConfig(data_dir=data, free_ports=True, sensors=SENSORS, jump_every=20, seed=11,
                                 checkpoint_interval_s=1.0))
    stack.start()
    try:
        assert stack.ports is not None and stack.ports.mosquitto is not None
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            assert stack.failed() is None, stack.failed()
            time.sleep(0.5)
        stack.stop_simulators()
        reports = {}
        for name in ("sim-mqtt", "sim-bridge", "sim-tcp"):
            assert stack.procs[name].returncode == 0, (stack.logs / f"{name}.log").read_text()[-2000:]
            reports[name] = json.loads((stack.logs / f"{name}.log").read_text().strip().splitlines()[-1])
        # sim-bridge's readings were acknowledged by Mosquitto: the bridge may still be moving them into Sluice
        # (a loaded machine puts it behind), and lag 0 says nothing of records not yet in the log. Wait until
        # the bridge has acknowledged as many as the simulator delivered (it acks after the durable append).
        bridged = sum(row["delivered"] for row in reports["sim-bridge"]["sensors"])
        url = f"http://127.0.0.1:{stack.ports.http}/bridges/site"
        deadline = time.monotonic() + 45
        while (bridge := _http_json(url))["acked"] < bridged:
            assert stack.failed() is None, stack.failed()
            assert time.monotonic() < deadline, f"the bridge moved {bridge['acked']} of {bridged} readings"
            time.sleep(0.2)
        # Let the processor catch up with everything the simulators wrote (lag 0 once checkpointed).
        url = f"http://127.0.0.1:{stack.ports.http}/groups/{GROUP}"
        deadline = time.monotonic() + 45
        while True:
            group = _http_json(url)
            if group["total_lag"] == 0 and group["partitions"]:
                break
            assert stack.failed() is None, stack.failed()
            assert time.monotonic() < deadline, f"processor did not catch up: {group}"
            time.sleep(0.5)
        assert stack.stop_one("processor") == 0, (stack.logs / "processor.log").read_text()[-3000:]
        b = stack.bootstrap
        late = kcat(b, TOPICS["late"], may_be_missing=True)
        yield Run(stack, kcat(b, TOPICS["input"]), kcat(b, TOPICS["output"]), late, kcat(b, TOPICS["alerts"]), reports)
    finally:
        stack.stop()


def _sensor_no(name: str) -> int:
    return int(name.removeprefix("sensor_"))


def test_devices_reach_sluice_over_mqtt_the_bridge_and_tcp(run: Run) -> None:
    sources: dict[int, set[str]] = defaultdict(set)
    for m in run.inputs:
        sources[_sensor_no(m.value["sensor"])].add(m.headers["source"].split(":")[0])
        assert m.key == m.value["sensor"]
    assert sorted(sources) == [base + i for base in (0, 100, 200) for i in range(SENSORS)]
    for n, kinds in sources.items():
        assert kinds == {"mqtt" if n < 100 else "bridge" if n < 200 else "tcp"}, (n, kinds)
    # Every reading a simulator had acknowledged is in the log (at least once; MQTT/TCP may resend).
    stored: dict[str, int] = defaultdict(int)
    for m in run.inputs:
        stored[m.value["sensor"]] += 1
    for report in run.sim_reports.values():
        for row in report["sensors"]:
            assert row["undelivered"] == 0 and stored[row["sensor"]] >= row["delivered"] == row["sent"] > 0


def _batch_windows(run: Run) -> dict[tuple[str, int], list[float]]:
    late = {(m.value["sensor"], m.value["ts"], m.value["temp"]) for m in run.late}
    windows: dict[tuple[str, int], list[float]] = defaultdict(list)
    for m in run.inputs:  # partition, offset order: the order the processor added them in
        v = m.value
        if (v["sensor"], v["ts"], v["temp"]) not in late:
            windows[(v["sensor"], v["ts"] - v["ts"] % WINDOW_MS)].append(v["temp"])
    return windows


def _final_results(run: Run) -> dict[tuple[str, int], dict[str, Any]]:
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for m in run.outputs:  # one window's emissions share a key, hence a partition: offset order is emit order
        v = m.value
        assert m.headers["sluice-emit"] == v["emit"] and v["emit"] in ("first", "update")
        assert json.loads(m.key or "null") == [v["window_start"], v["window_end"], v["key"]]
        assert v["window_end"] - v["window_start"] == WINDOW_MS
        latest[(v["key"], v["window_start"])] = v
    return latest


def test_window_results_match_a_batch_computation_over_the_input(run: Run) -> None:
    batch = _batch_windows(run)
    results = _final_results(run)
    assert len(results) >= 3 * SENSORS  # several windows of every sensor
    for (sensor, start), result in results.items():
        temps = batch[(sensor, start)]
        assert result["count"] == len(temps), (sensor, start)
        assert result["value"] == pytest.approx(sum(temps) / len(temps), rel=1e-12), (sensor, start)
    # Completeness: every window the final watermark has passed was emitted, for every sensor.
    max_ts: dict[int, int] = defaultdict(int)
    for m in run.inputs:
        max_ts[m.partition] = max(max_ts[m.partition], m.value["ts"])
    watermark = min(max_ts.values()) - BOUND_MS
    due = {key for key in batch if key[1] + WINDOW_MS - 1 <= watermark - 1000}
    assert due and due <= set(results), sorted(due - set(results))[:5]


def test_idle_devices_do_not_hold_back_other_windows(run: Run) -> None:
    idle = {f"sensor_{base + i}" for base in (0, 100, 200) for i in range(SENSORS) if i % 4 == 2}
    last_idle = max(m.value["ts"] for m in run.inputs if m.value["sensor"] in idle)
    readings: defaultdict[str, int] = defaultdict(int)
    for m in run.inputs:
        readings[m.value["sensor"]] += 1
    assert all(readings[s] == 3 for s in idle)  # the idle profile: three readings, then silence
    results = _final_results(run)
    # The idle devices' own windows closed, and active devices' windows kept closing long after they fell silent.
    assert {s for s, _ in results} >= idle
    # Had the silent devices held time back, no window ending after last_idle - BOUND_MS could have closed.
    # (A window starting after last_idle ends at least WINDOW_MS after it.)
    later = {s for s, start in results if s not in idle and start >= last_idle}
    active = {f"sensor_{base + i}" for base in (0, 100, 200) for i in range(SENSORS) if i % 4 != 2}
    assert later == active
    # Every partition holding an idle device also holds active ones (the premise of the check above).
    idle_parts = {m.partition for m in run.inputs if m.value["sensor"] in idle}
    assert idle_parts <= {m.partition for m in run.inputs if m.value["sensor"] in active}


def test_alerts_match_a_batch_computation_and_catch_every_injected_jump(run: Run) -> None:
    previous: dict[str, float] = {}
    expected: list[tuple[str, int, float]] = []
    jumps_with_history = []
    for m in run.inputs:  # per key, the processor sees records in offset order
        v = m.value
        prev = previous.get(v["sensor"])
        if prev is not None and prev > 0 and v["temp"] > 1.1 * prev:
            expected.append((v["sensor"], v["ts"], v["temp"]))
        if v.get("jump") and prev is not None and prev > 0:
            jumps_with_history.append((v["sensor"], v["ts"], v["temp"]))
        previous[v["sensor"]] = v["temp"]
    got = [(a.value["sensor"], a.value["ts"], a.value["temp"]) for a in run.alerts]
    assert sorted(got) == sorted(expected)
    assert len(jumps_with_history) >= 10
    assert set(jumps_with_history) <= set(got)
    for a in run.alerts:
        assert a.value["temp"] > 1.1 * a.value["previous"] and a.value["ratio"] > 1.1


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_command_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "demo", "--data-dir", str(tmp_path / "d"),
                             "--free-ports", "--sensors", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not lines or lines[-1] != "Ctrl-C stops everything.":
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            lines.append(line.rstrip("\n"))
            assert time.monotonic() < deadline
        text = "\n".join(lines)
        assert "kcat -b 127.0.0.1:" in text and "curl -N http://127.0.0.1:" in text and "Mosquitto" in text
        children = _children(proc.pid)
        assert len(children) == 6  # mosquitto, sluice, three simulators, processor
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped cleanly" in err
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_duration_without_mosquitto(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "sluice.cli", "demo", "--data-dir", str(tmp_path / "d"),
                             "--free-ports", "--sensors", "2", "--no-mosquitto", "--duration", "4"],
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert "Mosquitto" not in result.stdout and "sim-bridge" not in result.stdout
    assert sorted(p.stem for p in (tmp_path / "d" / "logs").iterdir()) == ["processor", "sim-mqtt", "sim-tcp", "sluice"]
