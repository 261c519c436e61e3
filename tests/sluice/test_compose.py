"""docker-compose.yml is valid, and everything it asks of Sluice exists.

* Debian's docker-compose (v1, from scripts/install-system-deps.sh) validates the file (`config -q`).
* Every service built from our image runs a real ``sluice`` command line: resolved against the typer app
  and parsed by click (unknown options, bad values and missing arguments fail), with the values that click
  cannot check (transports, profiles, pipeline references) checked against the code.
* Every ``SLUICE_*`` variable of a ``sluice serve`` service is a real Settings field, and the whole
  environment builds valid Settings (routes and bridges included).
* Every ``--bootstrap``/``--host``/``--port`` a container uses points at a listener a service really
  advertises inside the compose network, and the host-published Kafka port advertises ``localhost``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel

from ingest.routing import RouteRule
from sluice.cli import app
from sluice.cli_demo import PIPELINE, SENSOR_ROUTES, TOPICS
from sluice.cli_simulate import PROFILES, TRANSPORTS
from sluice.components.processors import load_pipeline
from sluice.config import Settings
from sluice.exposure import exposed_listeners

pytestmark = pytest.mark.slow  # the compose services' commands run for real

try:  # typer >= 0.2x vendors click
    from typer._click.exceptions import BadParameter, UsageError
except ImportError:  # pragma: no cover - older typer on real click
    from click.exceptions import BadParameter, UsageError  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
IMAGE = "sluice:local"
CLIENT_LOGIN_VARS = {"SLUICE_USER", "SLUICE_PASSWORD", "SLUICE_TLS_CA", "SLUICE_SASL_MECHANISM"}  # clients/security.py


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _ours(service: dict[str, Any]) -> bool:
    return "build" in service or service.get("image") == IMAGE


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def parse_sluice_args(args: list[str]) -> tuple[str, Any]:
    """Resolve ``args`` (what follows the ``sluice`` entrypoint) to its command and parse it strictly:
    returns the command path and click's context (``.params`` holds the parsed values)."""
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    parent = None
    rest = list(args)
    while hasattr(command, "get_command") and hasattr(command, "list_commands"):  # a group
        assert rest, f"`sluice {' '.join(path)}` needs a subcommand"
        parent = command.context_class(command, info_name=" ".join(["sluice", *path]), parent=parent)
        sub = command.get_command(parent, rest[0])
        assert sub is not None, f"`sluice {' '.join([*path, rest[0]])}` is not a sluice command"
        path.append(rest.pop(0))
        command = sub
    ctx = command.make_context(" ".join(["sluice", *path]), rest, parent=parent)
    return " ".join(path), ctx


def test_docker_compose_config_is_valid() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (scripts/install-system-deps.sh installs it)")
    for profile_args in ([], ["--profile", "cluster"]):
        result = subprocess.run([binary, "-f", str(COMPOSE), *profile_args, "config", "-q"],
                                capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert result.returncode == 0, result.stderr


def test_the_parser_rejects_what_the_compose_check_must_catch() -> None:
    with pytest.raises(UsageError):
        parse_sluice_args(["simulate", "--no-such-option", "1"])
    with pytest.raises(BadParameter):
        parse_sluice_args(["simulate", "--sensors", "many"])
    with pytest.raises(AssertionError, match="not a sluice command"):
        parse_sluice_args(["simulator"])
    with pytest.raises(UsageError):
        parse_sluice_args(["process"])  # the pipeline argument is missing
    assert parse_sluice_args(["topics", "create", "t", "-p", "3"])[0] == "topics create"


def _commands(compose: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(where, args after `sluice`) for every service command and `sluice` healthcheck of our image."""
    found: list[tuple[str, list[str]]] = []
    for name, service in compose["services"].items():
        if not _ours(service):
            continue
        command = service.get("command")
        assert isinstance(command, list) and command, f"{name}: command must be an exec-form list"
        assert "entrypoint" not in service, f"{name}: the image's entrypoint is `sluice`; keep it"
        found.append((name, [str(a) for a in command]))
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and len(test) > 1 and test[1] == "sluice":
            found.append((f"{name} healthcheck", [str(a) for a in test[2:]]))
    return found


def test_every_service_of_our_image_runs_a_real_sluice_command(compose: dict[str, Any]) -> None:
    commands = _commands(compose)
    used = {parse_sluice_args(args)[0] for _, args in commands}
    assert {"serve", "simulate", "process", "topics create", "groups describe"} <= used
    for where, args in commands:
        path, ctx = parse_sluice_args(args)
        params = ctx.params
        if path == "simulate":
            assert params["transport"] in TRANSPORTS, where
            assert params["profile"] == "mix" or params["profile"] in PROFILES, where
            assert params["duration"] == 0, f"{where}: a service's simulator runs until stopped"
        if path == "process":
            pipeline = load_pipeline(params["pipeline"])
            assert pipeline.name, where


def test_simulators_cover_every_transport_and_profile(compose: dict[str, Any]) -> None:
    transports = set()
    for _where, args in _commands(compose):
        path, ctx = parse_sluice_args(args)
        if path == "simulate":
            transports.add((ctx.params["transport"], ctx.params["host"]))
            assert ctx.params["profile"] == "mix"  # mix = steady, slow, idle and bursty devices
            assert ctx.params["jump_every"] > 0
    assert {("mqtt", "sluice"), ("mqtt", "mosquitto"), ("tcp", "sluice")} <= transports
    assert "kafka" in {t for t, _ in transports}


def _field_path(model: type[BaseModel], parts: list[str]) -> bool:
    head, rest = parts[0], parts[1:]
    field = model.model_fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel) and _field_path(annotation, rest)


def _serve_services(compose: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(n, s) for n, s in compose["services"].items()
            if _ours(s) and parse_sluice_args([str(a) for a in s["command"]])[0] == "serve"]


def test_every_sluice_variable_is_a_settings_field(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    serving = _serve_services(compose)
    assert [n for n, _ in serving] == ["sluice"]
    for name, service in compose["services"].items():
        env = _env(service)
        sluice_vars = [k for k in env if k.startswith("SLUICE_")]
        if service in [s for _, s in serving]:
            for var in sluice_vars:
                parts = var.removeprefix("SLUICE_").lower().split("__")
                assert _field_path(Settings, parts), f"{name}: {var} is not a Sluice setting"
        else:
            extra = set(sluice_vars) - CLIENT_LOGIN_VARS
            assert not extra, f"{name}: SLUICE_* settings only mean something to `sluice serve` ({extra})"
    _name, service = serving[0]
    for var in [k for k in __import__("os").environ if k.startswith("SLUICE_")]:
        monkeypatch.delenv(var)
    for var, value in _env(service).items():
        monkeypatch.setenv(var, value)
    settings = Settings()  # validates every value, JSON lists included
    for route in settings.ingest.routes:
        RouteRule.from_mapping(route)
    assert settings.host == "0.0.0.0" and str(settings.data_dir) == "/data"
    assert [b.host for b in settings.mqtt.bridges] == ["mosquitto"]


def test_listeners_and_addresses_agree(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    for var in [k for k in __import__("os").environ if k.startswith("SLUICE_")]:
        monkeypatch.delenv(var)
    for var, value in _env(services["sluice"]).items():
        monkeypatch.setenv(var, value)
    s = Settings()
    published = {str(p) for p in services["sluice"]["ports"]}
    # From the host (loopback only): the published Kafka port advertises localhost on that same port.
    assert f"127.0.0.1:{s.kafka.port}:{s.kafka.port}" in published
    assert (s.kafka.advertised_host, s.kafka.advertised_port) == ("localhost", s.kafka.port)
    for port in (s.mqtt.tls_port, s.tcp.port, s.http.port):
        assert f"127.0.0.1:{port}:{port}" in published
    # Inside the network: each extra listener advertises the service name and its own port.
    internal = {f"{x.advertised_host}:{x.advertised_port or x.port}" for x in s.kafka.extra_listeners}
    assert internal == {f"sluice:{x.port}" for x in s.kafka.extra_listeners}
    reachable = {"mqtt": {("sluice", s.mqtt.tls_port), ("mosquitto", 1883)}, "tcp": {("sluice", s.tcp.port)}}
    kafka_addresses = internal | {"redpanda:29092"}
    redpanda_cmd = " ".join(services["redpanda"]["command"])
    assert "internal://redpanda:29092" in redpanda_cmd and "external://localhost:19092" in redpanda_cmd
    for where, args in _commands(compose):
        path, ctx = parse_sluice_args(args)
        bootstrap = ctx.params.get("bootstrap")
        if path == "simulate" and ctx.params["transport"] != "kafka":
            assert (ctx.params["host"], ctx.params["port"]) in reachable[ctx.params["transport"]], where
        elif bootstrap is not None:
            assert bootstrap in kafka_addresses, f"{where}: {bootstrap} is not an advertised in-network listener"


def test_the_stack_is_secured(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Auth and TLS on every listener, never an open broker: the exposure check passes without allow_insecure,
    ports are published on the host's loopback only, and every client of Sluice logs in over TLS."""
    services = compose["services"]
    for var in [k for k in __import__("os").environ if k.startswith("SLUICE_")]:
        monkeypatch.delenv(var)
    for var, value in _env(services["sluice"]).items():
        monkeypatch.setenv(var, value)
    s = Settings()
    assert s.security.auth == "required" and s.security.tls_enabled and not s.security.allow_insecure
    assert exposed_listeners(s) == [] and not s.mqtt.plaintext
    assert s.security.super_users == ["admin"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published beyond the host's loopback"
    # The dev certificate is made once and names the service; the first user comes from the environment.
    certs = parse_sluice_args([str(a) for a in services["certs"]["command"]])
    assert certs[0] == "certs dev" and certs[1].params["if_missing"] and "sluice" in certs[1].params["host"]
    assert str(s.security.tls_cert).startswith(f"{certs[1].params['data_dir']}/tls/")
    users = parse_sluice_args([str(a) for a in services["users"]["command"]])
    assert users[0] == "users add" and users[1].params["name"] == "admin"
    assert users[1].params["password_env"] in _env(services["users"])
    for dep in ("certs", "users"):
        assert services["sluice"]["depends_on"][dep]["condition"] == "service_completed_successfully"
    for where, args in _commands(compose):
        path, ctx = parse_sluice_args(args)
        name = where.split()[0]
        talks_to_sluice = ctx.params.get("host") == "sluice" or str(ctx.params.get("bootstrap", "")).startswith(
            "sluice:")
        if talks_to_sluice:
            env = _env(services[name])
            assert CLIENT_LOGIN_VARS - {"SLUICE_SASL_MECHANISM"} <= set(env), f"{where}: no login for Sluice"
            assert env["SLUICE_PASSWORD"] == _env(services["users"])["ADMIN_PASSWORD"]


def test_dependencies_wait_for_health(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep, rule in (service.get("depends_on") or {}).items():
            condition = rule["condition"]
            if condition == "service_healthy":
                check = services[dep].get("healthcheck") or {}
                assert check.get("test") and not check.get("disable"), f"{name} waits on {dep}, which has no check"
            else:
                assert condition == "service_completed_successfully", f"{name} -> {dep}: {condition}"
                assert services[dep].get("restart") == "no"
    for name, service in services.items():
        assert "healthcheck" in service, f"{name}: state its healthcheck (or disable the image's on purpose)"
    volumes = set(compose["volumes"])
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = str(mount).split(":")[0]
            assert source.startswith("./") or source in volumes, f"{name}: {source} is not a named volume"


def test_compose_and_sluice_demo_run_the_same_pipeline(compose: dict[str, Any]) -> None:
    """`sluice demo` is the stack without Docker: the same routes, pipeline and topics."""
    services = compose["services"]
    assert json.loads(_env(services["sluice"])["SLUICE_INGEST__ROUTES"]) == SENSOR_ROUTES
    for name in ("processor", "processor-cluster"):
        _path, ctx = parse_sluice_args([str(a) for a in services[name]["command"]])
        assert ctx.params["pipeline"] == PIPELINE
        env = _env(services[name])
        assert {k: env[f"SENSORS_{k.upper()}"] for k in TOPICS} == TOPICS


def _dist_closure(requirements: list[str]) -> set[str]:
    """Distribution names installed by ``pip install`` of these requirements (transitively, this platform)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in (md.requires(req.name) or [])]
        except md.PackageNotFoundError:
            pass
    return seen


def test_the_image_installs_every_module_the_shipped_packages_import() -> None:
    """The Dockerfile installs [project.dependencies] only: a dev-only import would break `sluice` there."""
    import ast
    import importlib.metadata as md
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _dist_closure(project["dependencies"])
    ours = {"broker", "ingest", "clients", "processors", "sluice"}
    by_module = md.packages_distributions()
    missing: dict[str, set[str]] = {}
    for package in ours:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            # imports under `if TYPE_CHECKING:` never run (e.g. mypyc's native int types for the compiled modules)
            for_the_checker = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                               and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                               for statement in node.body for inner in ast.walk(statement)}
            for node in ast.walk(tree):
                if id(node) in for_the_checker:
                    continue
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in ours or top in sys.stdlib_module_names or top == "__future__":
                        continue
                    dists = {d.lower().replace("_", "-") for d in by_module.get(top, [top])}
                    if not dists & installed:
                        missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not in [project.dependencies]: {missing}"
