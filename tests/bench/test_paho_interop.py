"""bench.client_suites.paho_interop on a stand-in suite (the real one is fetched by run_paho_interop.sh, which CI
cannot do): each test runs alone against a real Mosquitto with the suite's globals set, a failure and a test
past its deadline are failures with their output kept, a pass whose client threads printed an exception is
counted, and the table has one row per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.client_suites.paho_interop import main

STAND_IN = '''
import socket, sys, time, unittest

class Test(unittest.TestCase):
    def test_connects_to_the_broker(self):
        sock = socket.create_connection((host, port))
        sock.sendall(bytes([0x10, 13, 0, 4]) + b"MQTT" + bytes([5, 2, 0, 0, 0, 0, 0]))  # CONNECT 5.0, id ""
        self.assertEqual(sock.recv(1), bytes([0x20]))  # CONNACK
        self.assertTrue(topics[0].startswith(topic_prefix))

    def test_fails(self):
        self.fail("as the suite's own failure")

    def test_hangs(self):
        time.sleep(600)

    def test_passes_with_a_client_error(self):
        print("call: unexpected exception (ConnectionResetError)", file=sys.stderr)
'''


def test_each_test_alone_with_its_deadline_and_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "client_test5.py").write_text(STAND_IN)
    out = tmp_path / "outcomes.json"
    code = main(["--suite-dir", str(tmp_path), "--brokers", "mosquitto", "--suites", "5", "--timeout", "4",
                 "--json", str(out), "--markdown"])
    assert code == 1
    outcomes = {o["test"]: o for o in json.loads(out.read_text())}
    assert set(outcomes) == {"test_connects_to_the_broker", "test_fails", "test_hangs",
                             "test_passes_with_a_client_error"}
    assert outcomes["test_connects_to_the_broker"]["passed"], outcomes["test_connects_to_the_broker"]["detail"]
    assert not outcomes["test_fails"]["passed"] and "as the suite's own failure" in outcomes["test_fails"]["detail"]
    assert not outcomes["test_hangs"]["passed"] and outcomes["test_hangs"]["detail"].startswith("timeout after 4 s")
    assert outcomes["test_passes_with_a_client_error"]["passed"]
    assert outcomes["test_passes_with_a_client_error"]["client_errors"] == 1
    printed = capsys.readouterr().out
    assert "| 5 | test_hangs | **fail** |" in printed and "mosquitto: 2 passed, 2 failed" in printed
