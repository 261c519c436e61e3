"""Smoke runs of the fuzz campaigns (``python -m bench.fuzz``, and the restart and same-turn campaigns
``bench.fuzz.group_restarts``, ``tcp_turns``, ``file_restarts``): about 10^4 inputs over the front doors
against a live ``sluice serve``; any crash, hang, traceback or ERROR line, leaked socket or failing real
client afterwards fails the test with the findings' signatures (reproducers in the test's tmp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fuzz.__main__ import build_target
from bench.fuzz.harness import Campaign

SMOKE_INPUTS = {"kafka": 3000, "kafka-sasl": 400, "mqtt": 3000, "mqtt-tls": 1000, "mqtt-ws": 1500, "tcp": 2000,
                "http": 2000}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(SMOKE_INPUTS))
def test_fuzz_smoke_finds_nothing(target: str, tmp_path: Path) -> None:
    fuzz_target = build_target(target, deadline=10.0, kafka_seeds_per_version=4)
    campaign = Campaign(fuzz_target, inputs=SMOKE_INPUTS[target], seed=7, out_dir=tmp_path)
    report = campaign.run(f"pytest smoke {target}")
    assert report.inputs == SMOKE_INPUTS[target]
    assert not report.findings, report.render()


@pytest.mark.slow
def test_group_restarts_smoke(tmp_path: Path) -> None:
    """Hostile group requests, then restarts on the same data (bench/fuzz/group_restarts.py): the broker
    starts, the bystander group's offsets read back, a confluent-kafka group joins, no traceback."""
    from bench.fuzz import group_restarts

    assert group_restarts.main(["--inputs", "200", "--rounds", "1", "--seed", "7", "--out", str(tmp_path)]) == 0


@pytest.mark.slow
def test_tcp_turns_smoke(tmp_path: Path) -> None:
    """Many connections, some hostile, sending in the same loop turns (bench/fuzz/tcp_turns.py): clean
    connections get exact ACKs, every acknowledged valid line reads back once, byte for byte."""
    from bench.fuzz import tcp_turns

    assert tcp_turns.main(["--rounds", "3", "--connections", "24", "--seed", "7", "--out", str(tmp_path)]) == 0


@pytest.mark.slow
def test_file_restarts_smoke(tmp_path: Path) -> None:
    """A tailed file with garbage and lines cut across kill -9 (bench/fuzz/file_restarts.py): every valid
    line reads back exactly once."""
    from bench.fuzz import file_restarts

    assert file_restarts.main(["--rounds", "1", "--seed", "7", "--out", str(tmp_path)]) == 0
