"""What a newcomer meets in the first hour: their own processor module, and the errors of a wrong start.

Each error is one line on stderr saying what to do, with exit code 2 (usage) or 1 (runtime), never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

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


def test_a_port_in_use_names_the_listener_and_the_setting_to_change(tmp_path: Path) -> None:
    """Before: `cannot start: [Errno 98] Address already in use`, naming neither the listener nor the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = serve(tmp_path, "--mqtt-port", str(port))
    assert_one_line_error(result, 1, "the mqtt listener cannot bind its port", f"SLUICE_MQTT__PORT (now {port})",
                          "--mqtt-port", "0 picks a free one")


def test_a_wrong_value_names_the_setting_and_its_variable(tmp_path: Path) -> None:
    result = serve(tmp_path, env={"SLUICE_KAFKA__PORT": "abc"})
    assert_one_line_error(result, 2, "kafka.port (SLUICE_KAFKA__PORT or --kafka-port): Input should be a valid integer",
                          "got 'abc'")
    assert "errors.pydantic.dev" not in result.stderr
    assert_one_line_error(serve(tmp_path, "--log-level", "verbose"), 2, "log_level (SLUICE_LOG_LEVEL or --log-level)",
                          "'VERBOSE'")
    assert_one_line_error(serve(tmp_path, "--storage", "memry"), 2,
                          "storage.backend (SLUICE_STORAGE__BACKEND or --storage)", "got 'memry'")
    half_tls = serve(tmp_path, env={"SLUICE_SECURITY__TLS_CERT": str(tmp_path / "cert.pem")})
    assert_one_line_error(half_tls, 2, "invalid configuration: security.tls_cert and security.tls_key are set together")
    assert "Value error" not in half_tls.stderr


def test_a_misspelt_key_in_the_config_file_is_refused_with_a_guess(tmp_path: Path) -> None:
    """Before: `[kafka] prot = 19092` was ignored and Sluice started on 9092."""
    (tmp_path / "sluice.toml").write_text("[kafka]\nprot = 19092\n")
    assert_one_line_error(serve(tmp_path, "--config", "sluice.toml"), 2,
                          "kafka.prot: no such setting (did you mean kafka.port?)")
    assert_one_line_error(serve(tmp_path, env={"SLUICE_TCP__PROT": "1"}), 2, "tcp.prot: no such setting")


def test_a_config_file_that_is_not_toml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "sluice.toml").write_text("[kafka\nport = 1\n")
    assert_one_line_error(serve(tmp_path, "--config", "sluice.toml"), 2, "sluice.toml is not valid TOML",
                          "line 1")


def test_a_bad_routing_rule_is_one_line(tmp_path: Path) -> None:
    result = serve(tmp_path, env={"SLUICE_INGEST__ROUTES": '[{"topic": "x"}]'})
    assert_one_line_error(result, 2, "invalid configuration: ingest.routes[0]")


def test_an_environment_variable_that_sets_nothing_is_warned_about(tmp_path: Path) -> None:
    """`SLUICE_KAFKA_PORT` (one underscore) is ignored by the settings loader: say so at start."""
    server = SluiceProcess(tmp_path / "data", cwd=tmp_path,
                           env={"SLUICE_KAFKA_PORT": "19092", "SLUICE_USER": "someone"}).start()
    try:
        log = server.log.read_text()
    finally:
        server.stop()
    warnings = [line for line in log.splitlines() if "is not a setting" in line]
    assert len(warnings) == 1, log[-3000:]
    assert "SLUICE_KAFKA_PORT" in warnings[0] and "did you mean SLUICE_KAFKA__PORT?" in warnings[0]


def _without_root_powers() -> list[str]:
    """A prefix that runs a command without root's permission override (root would write anywhere)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file permissions cannot be tested")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]


@pytest.mark.parametrize("case", ["uncreatable", "not writable", "logs not writable"])
def test_a_data_directory_this_user_cannot_write_says_how_to_fix_it(tmp_path: Path, case: str) -> None:
    locked = tmp_path / "locked"
    (locked / "logs").mkdir(parents=True)
    data, needle = {
        "uncreatable": (locked / "logs" / "data", "create it and give this user write access, or pass --data-dir"),
        "not writable": (locked / "logs", "fix its permissions or pass --data-dir"),
        "logs not writable": (locked, "need this user's write access (chown -R), or pass another --data-dir"),
    }[case]
    (locked / "logs").chmod(0o555)
    try:
        result = subprocess.run([*_without_root_powers(), *serve_command(), "--data-dir", str(data)], cwd=tmp_path,
                                env={**os.environ, **FREE_PORTS}, capture_output=True, text=True, timeout=120,
                                check=False)
    finally:
        (locked / "logs").chmod(0o755)
    assert_one_line_error(result, 1, needle)


def test_a_data_directory_in_use_says_which_way_out(tmp_path: Path) -> None:
    first = SluiceProcess(tmp_path / "data", cwd=tmp_path, env={"SLUICE_STORAGE__BACKEND": "segment"}).start()
    try:
        second = serve(tmp_path, env={"SLUICE_STORAGE__BACKEND": "segment"})
    finally:
        first.stop()
    assert_one_line_error(second, 1, "is in use by another Sluice process",
                          "stop that one, or give this one its own --data-dir")
