"""``sluice topics create|list|describe|config|delete`` — over the Kafka protocol (clients.AsyncAdmin), so they
work against a Kafka cluster too. ``config --set/--delete`` uses IncrementalAlterConfigs (as ``rpk topic
alter-config`` and ``kafka-configs --alter`` do): the configs not named keep their values."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from clients import AsyncAdmin
from clients.admin import ConfigEntry
from clients.errors import TopicExistsError
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    EXIT_USAGE,
    Bootstrap,
    JsonFlag,
    console,
    err_console,
    fail,
    name_value_pairs,
    plural,
    print_json,
    run,
)
from sluice.cli_progress import Activity

__all__ = ["is_internal_topic", "register"]

topics_app = typer.Typer(no_args_is_help=True, help="Create, list, describe, configure and delete topics.")


@topics_app.command("create")
def create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1, help="Partition count.")] = 1,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="Topic config name=value.")] = None,
    if_not_exists: Annotated[bool, typer.Option(help="Succeed when the topic already exists (init scripts).")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Create a topic."""
    configs = name_value_pairs(config, "--config takes name=value (e.g. retention.ms=3600000)")

    async def go() -> bool:
        async with AsyncAdmin(bootstrap) as admin:
            try:
                await admin.create_topic(name, partitions, configs)
            except TopicExistsError:
                if not if_not_exists:
                    raise
                return False
            return True

    created = run(go(), topic=name)
    if json_out:
        print_json({"topic": name, "partitions": partitions, "config": configs, "created": created})
    elif not created:
        console.print(f"topic {name} already exists")
    else:
        console.print(f"created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}")


def is_internal_topic(name: str) -> bool:
    """Sluice's own topics (``_dead_letters``, ``_checkpoints.<group>``) and Kafka's (``__consumer_offsets``)."""
    return name.startswith("_")


@topics_app.command("list")
def list_topics(
    show_all: Annotated[
        bool, typer.Option("--all", "-a", "--internal", help="Include internal topics (names starting with _).")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """List topics with their partition and record counts (internal topics, names starting with _, only with --all)."""

    async def go() -> tuple[list[dict[str, object]], int]:
        async with AsyncAdmin(bootstrap) as admin:
            rows = []
            names = await admin.list_topics(internal=True)
            shown = [n for n in names if show_all or not is_internal_topic(n)]
            with Activity("describing", "topic", delay_s=1.0, detail=f"of {len(shown)}") as progress:
                for name in shown:
                    desc = await admin.describe_topic(name)
                    progress.advance()
                    rows.append(
                        {
                            "topic": name,
                            "partitions": len(desc.partitions),
                            "records": sum(p.records for p in desc.partitions),
                        }
                    )
            return rows, len(names) - len(shown)

    rows, hidden = run(go())
    if json_out:
        print_json(rows)
        return
    table = Table("topic", "partitions", "records")
    for row in rows:
        table.add_row(str(row["topic"]), str(row["partitions"]), str(row["records"]))
    console.print(table)
    if hidden:
        err_console.print(f"({plural(hidden, 'internal topic')} hidden; sluice topics list --all includes them)")


@topics_app.command("describe")
def describe(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, json_out: JsonFlag = False) -> None:
    """Partitions (start and end offsets) and configuration of a topic."""

    async def go():  # type: ignore[no-untyped-def]
        async with AsyncAdmin(bootstrap) as admin:
            return await admin.describe_topic(name)

    desc = run(go(), topic=name)
    if json_out:
        print_json(
            {
                "topic": desc.name,
                "partitions": [
                    {"partition": p.partition, "start_offset": p.start_offset, "end_offset": p.end_offset}
                    for p in desc.partitions
                ],
                "config": desc.config,
            }
        )
        return
    table = Table("partition", "start offset", "end offset", "records", title=f"topic {desc.name}")
    for p in desc.partitions:
        table.add_row(str(p.partition), str(p.start_offset), str(p.end_offset), str(p.records))
    console.print(table)
    if desc.config:
        cfg = Table("config", "value")
        for k, v in sorted(desc.config.items()):
            cfg.add_row(k, v)
        console.print(cfg)


@topics_app.command("config")
def config(
    name: str,
    set_pairs: Annotated[list[str] | None, typer.Option(
        "--set", "-s", help="Set a config, name=value (repeatable), e.g. retention.ms=3600000.")] = None,
    delete_names: Annotated[list[str] | None, typer.Option(
        "--delete", "-d", help="Remove a topic-level config so its default applies again (repeatable).")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Show a topic's configs and where each value comes from; change them with --set and --delete."""
    to_set = name_value_pairs(set_pairs, "--set takes name=value (e.g. retention.ms=3600000)")
    to_delete = list(delete_names or [])
    both = sorted(set(to_set) & set(to_delete))
    if both:
        fail(f"{', '.join(both)}: --set and --delete name the same config", EXIT_USAGE)

    async def go() -> list[ConfigEntry]:
        async with AsyncAdmin(bootstrap) as admin:
            if to_set or to_delete:
                await admin.alter_topic_config(name, to_set, to_delete)
            return await admin.topic_config(name)

    entries = run(go(), topic=name)
    changed = set(to_set) | set(to_delete)
    if json_out:
        print_json({"topic": name, "changed": sorted(changed),
                    "config": [{"name": e.name, "value": e.value, "source": e.source, "read_only": e.read_only}
                               for e in entries]})
        return
    table = Table("config", "value", "source", title=f"topic {name}")
    for e in entries:
        value = "(sensitive)" if e.sensitive else ("-" if e.value is None else e.value)
        mark = "[bold]" if e.name in changed else ""
        table.add_row(f"{mark}{e.name}", value, e.source)
    console.print(table)
    if changed:
        done = [f"set {k}={v}" for k, v in to_set.items()] + [f"deleted {k}" for k in to_delete]
        err_console.print(f"topic {name}: {', '.join(done)}")


@topics_app.command("delete")
def delete(
    name: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Delete a topic and all its records."""
    if not yes and not typer.confirm(f"delete topic {name} and all its records?"):
        raise typer.Exit(1)

    async def go() -> None:
        async with AsyncAdmin(bootstrap) as admin:
            await admin.delete_topic(name)

    run(go(), topic=name)
    if json_out:
        print_json({"deleted": name})
    else:
        console.print(f"deleted topic {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(topics_app, name="topics")
