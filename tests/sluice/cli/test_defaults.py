"""The CLI against a ``sluice serve`` with the defaults (``make run``, on free ports).

``sluice simulate --transport tcp`` with no TCP ack mode (the default):

Before: simulate waited for acks the default listener never sends, resent every batch after each
10 s timeout (each reading stored 1-8 times) and exited 1 blaming the port. Now it asks the listener
on each connection and, without acks, sends every reading exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.sluice_server import SluiceProcess

pytestmark = pytest.mark.slow  # sluice serve as make run starts it, and the CLI as subprocesses


def sluice(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def read_topic(bootstrap: str, topic: str, at_least: int, timeout: float = 30) -> list[str]:
    """Lines ``key<TAB>value`` of the whole topic, once it holds ``at_least`` records (or the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k\t%s\n"],
            capture_output=True, text=True, timeout=60,
        )
        lines = done.stdout.splitlines()
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)  # polling the log: no event to wait on from outside the server


def test_simulate_tcp_against_the_defaults_writes_each_reading_once(default_server: SluiceProcess) -> None:
    host, port = default_server.address("tcp").rsplit(":", 1)
    started = time.monotonic()
    done = sluice("simulate", "--transport", "tcp", "--host", host, "--port", port, "--sensors", "3",
                  "--first-id", "500", "--profile", "steady", "--duration", "1.5", "--seed", "3", "--json")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tcp_acks"] is False and report["unconfirmed"] == 0
    sent = sum(r["sent"] for r in report["sensors"])
    assert sent > 0 and all(r["delivered"] == r["sent"] and r["undelivered"] == 0 for r in report["sensors"])
    assert elapsed < 30  # it used to wait 10 s per batch for acks that never came

    lines = read_topic(default_server.bootstrap, "sensors", sent)
    assert len(lines) == sent  # exactly N records for N readings
    readings = [json.loads(line.split("\t", 1)[1]) for line in lines]
    assert max(Counter((r["sensor"], r["ts"], r["temp"]) for r in readings).values()) == 1
    assert Counter(line.split("\t", 1)[0] for line in lines) == {r["sensor"]: r["sent"] for r in report["sensors"]}


def test_simulate_tcp_shorter_than_the_ack_probe_delivers_every_reading(default_server: SluiceProcess) -> None:
    """A run that ends while each connection still asks the listener whether it acks (``probe_timeout``,
    2 s, unanswered by the default listener) waits for that answer and delivers: it used to see no
    completed connection yet, wait 0.5 s as if the listener were absent, and report readings undelivered
    (seen under load in the test above; here every time)."""
    host, port = default_server.address("tcp").rsplit(":", 1)
    before = len(read_topic(default_server.bootstrap, "sensors", 0))
    done = sluice("simulate", "--transport", "tcp", "--host", host, "--port", port, "--sensors", "2",
                  "--first-id", "600", "--profile", "steady", "--duration", "0.3", "--seed", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tcp_acks"] is False
    assert all(r["sent"] > 0 and r["delivered"] == r["sent"] and r["undelivered"] == 0 for r in report["sensors"])
    lines = read_topic(default_server.bootstrap, "sensors", before + sum(r["sent"] for r in report["sensors"]))
    stored = Counter(line.split("\t", 1)[0] for line in lines)
    assert {s: stored[s] for s in ("sensor_600", "sensor_601")} == {r["sensor"]: r["sent"] for r in report["sensors"]}


def test_version() -> None:
    from sluice import __version__

    done = sluice("--version", timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"sluice {__version__}"


def test_produce_counts_with_grammar_and_internal_topics_are_hidden(default_server: SluiceProcess) -> None:
    b = default_server.bootstrap
    one = subprocess.run([sys.executable, "-m", "sluice.cli", "produce", "grammar-1", "-b", b],
                         input="a\n", capture_output=True, text=True, timeout=60)
    assert one.returncode == 0 and "produced 1 record to grammar-1" in one.stderr, one.stderr
    two = subprocess.run([sys.executable, "-m", "sluice.cli", "produce", "grammar-2", "-b", b],
                         input="a\nb\n", capture_output=True, text=True, timeout=60)
    assert two.returncode == 0 and "produced 2 records to grammar-2" in two.stderr, two.stderr

    # A line no route can parse makes the dead-letter topic exist (an MQTT publish on sensors/<id>).
    pub = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", default_server.address("mqtt").rsplit(":", 1)[1],
                          "-q", "1", "-t", "sensors/broken", "-m", "not json"], capture_output=True, timeout=30)
    assert pub.returncode == 0, pub.stderr
    shown = json.loads(sluice("topics", "list", "--json", "-b", b).stdout)
    listed = sluice("topics", "list", "-b", b)
    assert "_dead_letters" not in {row["topic"] for row in shown} and "grammar-1" in {r["topic"] for r in shown}
    assert "internal topic" in listed.stderr and "--all" in listed.stderr
    everything = json.loads(sluice("topics", "list", "--all", "--json", "-b", b).stdout)
    assert "_dead_letters" in {row["topic"] for row in everything}


def _produce(bootstrap: str, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "produce", *args, "-b", bootstrap],
                          input=stdin, capture_output=True, text=True, timeout=60)


def _count(bootstrap: str, topic: str) -> int:
    done = sluice("consume", topic, "--format", "kv", "-b", bootstrap)
    assert done.returncode == 0, done.stderr
    return len(done.stdout.splitlines())


def test_produce_says_what_it_wrote_before_a_bad_line(default_server: SluiceProcess) -> None:
    b = default_server.bootstrap
    bad = _produce(b, "partial-1", "--format", "json", stdin='{"a": 1}\n{"a": 2}\n{nope\n{"a": 4}\n')
    assert bad.returncode == 2
    assert "line 3 is not JSON" in bad.stderr and "the 2 records before it were written to partial-1" in bad.stderr
    assert _count(b, "partial-1") == 2  # what it says it wrote is there; nothing after the bad line

    first = _produce(b, "partial-2", "--format", "json", stdin="{nope\n")
    assert first.returncode == 2 and "nothing was written" in first.stderr


def test_produce_key_field_missing_is_an_error_unless_allowed(default_server: SluiceProcess) -> None:
    b = default_server.bootstrap
    lines = '{"sensor": "s1", "t": 1}\n{"t": 2}\n'
    missing = _produce(b, "keys-1", "--format", "json", "--key-field", "sensor", stdin=lines)
    assert missing.returncode == 2
    assert "line 2 has no 'sensor' field" in missing.stderr and "--allow-null-key" in missing.stderr
    assert "the record before it was written to keys-1" in missing.stderr
    allowed = _produce(b, "keys-2", "--format", "json", "--key-field", "sensor", "--allow-null-key", "--json",
                       stdin=lines)
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["records"] == 2
