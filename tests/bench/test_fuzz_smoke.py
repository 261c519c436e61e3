"""Smoke runs of the fuzz campaigns (``python -m bench.fuzz``): about 10^4 inputs over the four front doors
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
