"""The ``sluice`` command line (typer). ``serve`` starts the broker; other commands talk to one."""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from broker.errors import BrokerError
from broker.security import SecurityError
from sluice.config import describe_errors, load_settings, unknown_variables
from sluice.logs import configure_logging

__all__ = ["app", "main"]

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Sluice: a stream broker for device and sensor data."
)

EXIT_CONFIG = 2  # bad flags, config file or environment
EXIT_RUNTIME = 1  # the server could not start or failed


def _version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    from sluice import __version__

    try:
        return version("sluice")
    except PackageNotFoundError:
        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"sluice {_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    _show_version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Sluice: a stream broker for device and sensor data."""


# The settings `sluice serve`'s flags set (error messages name the flag beside the variable).
_SERVE_FLAGS = {"data_dir": "--data-dir", "host": "--host", "kafka.port": "--kafka-port", "mqtt.port": "--mqtt-port",
                "tcp.port": "--tcp-port", "http.port": "--http-port", "storage.backend": "--storage",
                "storage.flush": "--flush", "processors": "--processor", "log_level": "--log-level",
                "log_format": "--log-format"}


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where logs and metadata live (default ./sluice-data).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address for every listener (default 127.0.0.1).")] = None,
    kafka_port: Annotated[int | None, typer.Option(help="Kafka protocol port (default 9092).")] = None,
    mqtt_port: Annotated[int | None, typer.Option(help="MQTT port (default 1883).")] = None,
    tcp_port: Annotated[int | None, typer.Option(help="TCP line-ingest port (default 8094).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP API port (default 8080).")] = None,
    storage: Annotated[str | None, typer.Option(help="segment (files) or memory.")] = None,
    flush: Annotated[str | None, typer.Option(help="Default flush policy: always, interval or os.")] = None,
    processor: Annotated[
        list[str] | None, typer.Option(help="module:pipeline to run inside the broker (repeatable).")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = None,
    log_format: Annotated[str | None, typer.Option(help="text or json.")] = None,
) -> None:
    """Start Sluice: the log, the Kafka protocol, MQTT, TCP ingest and the HTTP API in one process."""
    from ingest.errors import ConfigError as IngestConfigError
    from processors.errors import ProcessorError
    from sluice.exposure import UnroutableAdvertisedHostError
    from sluice.serve import run_server

    overrides: dict[str, Any] = {
        "data_dir": data_dir,
        "host": host,
        "log_level": log_level,
        "log_format": log_format,
        "processors": processor or None,
    }
    sections: dict[str, dict[str, Any]] = {
        "kafka": {"port": kafka_port},
        "mqtt": {"port": mqtt_port},
        "tcp": {"port": tcp_port},
        "http": {"port": http_port},
        "storage": {"backend": storage, "flush": flush},
    }
    for section, values in sections.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            overrides[section] = given
    try:
        settings = load_settings(config, **overrides)
    except ValidationError as exc:
        raise _fail(f"invalid configuration: {describe_errors(exc, _SERVE_FLAGS)}", EXIT_CONFIG) from None
    except FileNotFoundError as exc:
        raise _fail(f"invalid configuration: {exc}", EXIT_CONFIG) from None
    except tomllib.TOMLDecodeError as exc:
        raise _fail(f"invalid configuration: {config} is not valid TOML: {exc}", EXIT_CONFIG) from None
    configure_logging(settings.log_level, settings.log_format)
    for problem in unknown_variables(os.environ):
        logging.getLogger("sluice.config").warning(problem)
    try:
        run_server(settings)
    # a --processor that cannot be loaded, a bad route, a Kafka listener that would advertise 0.0.0.0
    except (ProcessorError, IngestConfigError, UnroutableAdvertisedHostError) as exc:
        raise _fail(f"invalid configuration: {exc}", EXIT_CONFIG) from None
    except (BrokerError, SecurityError) as exc:
        raise _fail(str(exc), EXIT_RUNTIME) from None
    except OSError as exc:
        raise _fail(f"cannot start: {exc}", EXIT_RUNTIME) from None


@app.command()
def process(
    pipeline: Annotated[str, typer.Argument(help="module:attribute of the Pipeline to run.")],
    bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap host:port (Sluice or any Kafka cluster).")],
    checkpoint_interval: Annotated[float, typer.Option(help="Seconds between checkpoints.")] = 10.0,
    session_timeout_ms: Annotated[int, typer.Option(help="Group session timeout (failover time).")] = 10_000,
    guarantee: Annotated[str, typer.Option(
        help="at-least-once (a crash may repeat results) or exactly-once (Kafka transactions; "
             "read outputs with isolation.level=read_committed).")] = "at-least-once",
    instance_id: Annotated[str | None, typer.Option(
        help="exactly-once: this instance's name in its transactional.id <pipeline>-<instance id> (default: the "
             "host name). Keep it across restarts; two instances on one host need different ids.")] = None,
    state_max_keys: Annotated[int | None, typer.Option(
        help="Keys whose state each keyed operator keeps in memory; the rest spill to RocksDB (default: no bound).")
    ] = None,
    state_dir: Annotated[str | None, typer.Option(
        help="Where spilled state goes (scratch, emptied at start; default <tmp>/sluice-state).")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run a stream processor standalone, as a member of its consumer group (start more to scale out)."""
    from sluice.cli_process import run_process

    configure_logging(log_level, "text")
    raise typer.Exit(run_process(pipeline, bootstrap, checkpoint_interval, session_timeout_ms,
                                 guarantee=guarantee, instance_id=instance_id, state_max_keys=state_max_keys,
                                 state_dir=state_dir))


def _register_client_commands() -> None:
    from sluice import (
        cli_acl,
        cli_certs,
        cli_data,
        cli_demo,
        cli_ops,
        cli_simulate,
        cli_tokens,
        cli_topics,
        cli_users,
    )

    for module in (cli_topics, cli_data, cli_ops, cli_simulate, cli_demo, cli_users, cli_tokens, cli_certs, cli_acl):
        module.register(app)


_register_client_commands()


def main() -> None:
    app(prog_name="sluice")


if __name__ == "__main__":
    main()
