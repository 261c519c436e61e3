"""The Eclipse Paho MQTT interoperability tests against ``sluice serve`` and Mosquitto, side by side.

    python -m bench.client_suites.paho_interop --suite-dir PATH/interoperability [--brokers sluice,mosquitto]
        [--suites 311,5] [--timeout 90] [--only test_name ...] [--markdown]

PATH is a checkout of eclipse/paho.mqtt.testing (``run_paho_interop.sh`` fetches one). Its
``client_test.py`` (MQTT 3.1.1) and ``client_test5.py`` (MQTT 5.0) are unittest modules whose ``__main__``
sets the module globals ``host``/``port``/``topics``...; this driver sets the same globals (the values their
``__main__`` sets) and runs each test method in its own interpreter with a deadline, because several tests
wait in unbounded loops for messages a failing broker never sends. Each test's ``setUpClass`` cleans the
clients' sessions and the retained messages first, as a whole-module run does.

Both brokers run with the reference broker's settings the suite assumes: anonymous clients, keep alive capped
at 60 s (``test_server_keep_alive`` expects Server Keep Alive 60 for a client asking 120). Sluice: a fresh
``sluice serve`` with its default durable segment store in a temporary data directory; Mosquitto: ``mosquitto
-c`` with ``max_keepalive 60`` on a free port. Expected failures of the suite itself (the same on every
broker) are in ``bench/RESULTS.md`` with their reasons.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Outcome", "main", "run_suite"]

# What each suite's ``__main__`` sets before ``unittest.main()`` (client_test5's setUpClass then resets
# ``topics``/``wildtopics`` to the unprefixed names; ``topic_prefix`` stays for the shared-subscription test).
SUITES = {
    "311": ("client_test", {
        "topics": ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA"),
        "wildtopics": ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#"),
        "nosubscribe_topics": ("test/nosubscribe",),
    }),
    "5": ("client_test5", {
        "topic_prefix": "client_test5/",
        "topics": [f"client_test5/{t}" for t in ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")],
        "wildtopics": [f"client_test5/{t}" for t in ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")],
        "nosubscribe_topics": ("test/nosubscribe",),
    }),
}

# Runs one test method of one suite module in this interpreter: argv = module, test, port, globals (JSON).
RUN_ONE = """
import json, sys, unittest, logging
module_name, test_name, port, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
module = __import__(module_name)
module.host, module.port = "127.0.0.1", port
for key, value in names.items():
    setattr(module, key, value)
logging.getLogger().setLevel(logging.ERROR)
suite = unittest.defaultTestLoader.loadTestsFromName("Test." + test_name, module)
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
"""

# The whole module in one interpreter, as its ``__main__`` runs it (state carries over between the tests).
RUN_ALL = RUN_ONE.replace('loadTestsFromName("Test." + test_name, module)', 'loadTestsFromTestCase(module.Test)')

LIST_TESTS = """
import sys, unittest
module = __import__(sys.argv[1])
print("\\n".join(unittest.defaultTestLoader.getTestCaseNames(module.Test)))
"""


@dataclass
class Outcome:
    suite: str
    test: str
    broker: str
    passed: bool
    seconds: float
    detail: str  # the end of the test's output when it failed ("timeout" when it hung)
    client_errors: int = 0  # tracebacks the suite's client threads printed (a pass can hide an unexpected packet)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    name = ""
    port = 0

    def start(self, workdir: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class SluiceBroker(Broker):
    """``python -m sluice.cli serve`` with its defaults (durable segment store), MQTT on a port of its own;
    with ``websockets`` the suite's TCP clients reach its WebSocket door through ``ws_bridge``."""

    name = "sluice"

    def __init__(self, websockets: bool = False) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.bridge: subprocess.Popen[str] | None = None
        self.websockets = websockets
        if websockets:
            self.name = "sluice-ws"

    def start(self, workdir: Path) -> None:
        data = workdir / "sluice-data"
        data.mkdir()
        env = {**os.environ, "SLUICE_MQTT__PORT": "0", "SLUICE_KAFKA__PORT": "0", "SLUICE_TCP__PORT": "0",
               "SLUICE_HTTP__PORT": "0", "SLUICE_MQTT__MAX_KEEPALIVE_S": "60",
               "SLUICE_MQTT__WEBSOCKETS": str(self.websockets).lower(), "SLUICE_MQTT__WS_PORT": "0"}
        self.log = workdir / "sluice.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        endpoints = data / "endpoints.json"
        deadline = time.monotonic() + 120
        door = "mqtt-ws" if self.websockets else "mqtt"
        while not endpoints.exists() or door not in json.loads(endpoints.read_text() or "{}"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sluice serve did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.port = int(json.loads(endpoints.read_text())[door]["port"])
        if self.websockets:
            uri, self.port = f"ws://127.0.0.1:{self.port}/mqtt", free_port()
            self.bridge = subprocess.Popen([sys.executable, "-m", "bench.client_suites.ws_bridge", str(self.port), uri],
                                           stdout=subprocess.PIPE, text=True)
            assert self.bridge.stdout is not None
            if self.bridge.stdout.readline().strip() != "listening":
                self.stop()
                raise RuntimeError("the WebSocket bridge did not start")

    def stop(self) -> None:
        if self.bridge and self.bridge.poll() is None:
            self.bridge.terminate()
            self.bridge.wait(20)
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class MosquittoBroker(Broker):
    name = "mosquitto"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, workdir: Path) -> None:
        self.port = free_port()
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\nmax_keepalive 60\n")
        self.log = workdir / "mosquitto.log"
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("wb"))
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mosquitto did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def list_tests(suite_dir: Path, module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", LIST_TESTS, module], cwd=suite_dir, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


def run_suite(suite_dir: Path, suite: str, broker: Broker, timeout: float, only: list[str]) -> list[Outcome]:
    module, names = SUITES[suite]
    outcomes = []
    for test in list_tests(suite_dir, module):
        if only and test not in only:
            continue
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", RUN_ONE, module, test, str(broker.port), json.dumps(names)],
                                  cwd=suite_dir, capture_output=True, text=True, timeout=timeout)
            output = done.stdout + done.stderr
            passed, detail = done.returncode == 0, output[-1500:]
            errors = output.count("unexpected exception")
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"") + (exc.stderr or b"")
            text = out.decode(errors="replace") if isinstance(out, bytes) else out
            passed, detail, errors = False, f"timeout after {timeout:.0f} s\n{text[-1200:]}", 0
        outcome = Outcome(suite, test, broker.name, passed, time.monotonic() - started,
                          "" if passed and not errors else detail, errors)
        note = f" ({errors} client-side exceptions)" if errors else ""
        print(f"{broker.name:9} {suite:3} {test:32} {'pass' if passed else 'FAIL'} {outcome.seconds:5.1f} s{note}",
              flush=True)
        outcomes.append(outcome)
    return outcomes


def run_whole_module(suite_dir: Path, suite: str, broker: Broker, timeout: float) -> list[Outcome]:
    """One interpreter for every test of the suite (``unittest.main()``'s way); a test still running at the
    deadline and those after it count as failed ("timeout")."""
    module, names = SUITES[suite]
    tests = list_tests(suite_dir, module)
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", RUN_ALL, module, "-", str(broker.port), json.dumps(names)],
                              cwd=suite_dir, capture_output=True, text=True, timeout=timeout)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        output = out.decode(errors="replace") if isinstance(out, bytes) else out
    seconds = time.monotonic() - started
    verdicts = dict(re.findall(r"^(\w+) \(\S+\)(?:\n.*?)? \.\.\. .*?(ok|FAIL|ERROR)$", output, re.M | re.S))
    outcomes = []
    for test in tests:
        verdict = verdicts.get(test, "timeout")
        outcomes.append(Outcome(suite, test, broker.name, verdict == "ok", seconds,
                                "" if verdict == "ok" else f"{verdict} (whole-module run)\n{output[-1500:]}"))
        print(f"{broker.name:9} {suite:3} {test:32} {'pass' if verdict == 'ok' else verdict}", flush=True)
    return outcomes


def markdown(outcomes: list[Outcome], brokers: list[str]) -> str:
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for o in outcomes:
        rows.setdefault((o.suite, o.test), {})[o.broker] = "pass" if o.passed else "**fail**"
    lines = ["| suite | test | " + " | ".join(brokers) + " |", "| --- | --- |" + " --- |" * len(brokers)]
    for (suite, test), by_broker in rows.items():
        lines.append(f"| {suite} | {test} | " + " | ".join(by_broker.get(b, "-") for b in brokers) + " |")
    for b in brokers:
        mine = [o for o in outcomes if o.broker == b]
        lines.append(f"\n{b}: {sum(o.passed for o in mine)} passed, {sum(not o.passed for o in mine)} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite-dir", type=Path, required=True, help="paho.mqtt.testing/interoperability")
    parser.add_argument("--brokers", default="sluice,mosquitto",
                        help="sluice, sluice-ws (its WebSocket door through ws_bridge), mosquitto")
    parser.add_argument("--suites", default="311,5")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per test")
    parser.add_argument("--only", nargs="*", default=[], help="test method names to run")
    parser.add_argument("--whole-module", action="store_true",
                        help="run each suite in one interpreter (timeout applies to the whole suite)")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--markdown", action="store_true", help="print the pass/fail table")
    args = parser.parse_args(argv)
    brokers = args.brokers.split(",")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="paho-interop-") as tmp:
        for name in brokers:
            broker: Broker = MosquittoBroker() if name == "mosquitto" else SluiceBroker(name == "sluice-ws")
            workdir = Path(tmp) / name
            workdir.mkdir()
            broker.start(workdir)
            try:
                for suite in args.suites.split(","):
                    if args.whole_module:
                        outcomes += run_whole_module(args.suite_dir.resolve(), suite, broker, args.timeout)
                    else:
                        outcomes += run_suite(args.suite_dir.resolve(), suite, broker, args.timeout, args.only)
            finally:
                broker.stop()
    for o in outcomes:
        if o.detail:
            print(f"\n--- {o.broker} {o.suite} {o.test} ---\n{o.detail}")
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    if args.markdown:
        print("\n" + markdown(outcomes, brokers))
    uptime = os.getloadavg()
    print(f"\nload average at the end: {uptime[0]:.1f} {uptime[1]:.1f} {uptime[2]:.1f}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
