"""What a newcomer meets in the first hour: their own processor module, and the errors of a wrong start.

Each error is one line on stderr saying what to do, with exit code 2 (usage) or 1 (runtime), never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

from tests.sluice_server import SluiceProcess, serve_command

MY_PIPELINE = '''
from processors import BoundedOutOfOrderness, Mean, Pipeline, Tumbling

stream = Pipeline.source("sensors", group="avg-temp", event_time=lambda v: v["ts"],
                         watermarks=BoundedOutOfOrderness(5_000, idle_timeout=30_000))
(stream.key_by(lambda v: v["sensor"])
       .window(Tumbling(10_000), allowed_lateness=5_000, late_topic="temp-late")
       .aggregate(Mean("temp"))
       .sink("temp-avg"))
pipeline = stream.pipeline
'''

FREE_PORTS = {"SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0", "SLUICE_HTTP__PORT": "0"}


def serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sluice serve`` that is expected to refuse to start (a deadline in case it does start)."""
    return subprocess.run([*serve_command(), "--data-dir", str(cwd / "data"), *args], cwd=cwd,
                          env={**os.environ, **FREE_PORTS, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "╭" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_a_processor_module_in_the_working_directory_is_found(tmp_path: Path) -> None:
    """docs/processors.md: `sluice serve --processor mymodule:pipeline` beside mymodule.py (before: No module
    named 'mymodule', with a traceback)."""
    (tmp_path / "mymodule.py").write_text(MY_PIPELINE)
    server = SluiceProcess(tmp_path / "data", cwd=tmp_path, args=["--processor", "mymodule:pipeline"]).start()
    try:
        with urllib.request.urlopen(f"{server.http}/processors", timeout=30) as answer:
            status = json.load(answer)
        assert [p["pipeline"] for p in status] == ["avg-temp"]
        assert status[0]["failed"] is None
    finally:
        server.stop()


def test_a_processor_that_cannot_be_loaded_is_one_line_and_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(serve(tmp_path, "--processor", "nosuchmodule:pipeline"), 2,
                          "cannot import 'nosuchmodule'")
    (tmp_path / "mymodule.py").write_text(MY_PIPELINE)
    assert_one_line_error(serve(tmp_path, "--processor", "mymodule:pipline"), 2,
                          "module 'mymodule' has no attribute 'pipline'")
