"""``sluice topics create|list|describe|delete`` — over the Kafka protocol (clients.AsyncAdmin), so they work
against a Kafka cluster too."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from clients import AsyncAdmin
from clients.errors import TopicExistsError
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    JsonFlag,
    console,
    err_console,
    name_value_pairs,
    plural,
    print_json,
    run,
)

__all__ = ["is_internal_topic", "register"]

topics_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete topics.")


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
            for name in shown:
                desc = await admin.describe_topic(name)
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
