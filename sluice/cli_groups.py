"""``sluice groups seek`` and ``sluice groups delete``: consumer-group administration over the Kafka protocol
(clients.AsyncAdmin), so both work against Kafka or Redpanda too.

``seek`` follows ``kafka-consumer-groups --reset-offsets``: it refuses while the group has active members
(their next commit would overwrite the new offsets), even with ``--dry-run``; ``--to <offset>`` is clamped to
each partition's [start, end]; ``--to <time>`` takes the first record at or after that time and, where
there is none, the end offset. Without ``--topic`` it moves every partition the group has committed on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from clients import AsyncAdmin, TopicPartition
from clients.errors import UnknownGroupError
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    EXIT_RUNTIME,
    EXIT_USAGE,
    Bootstrap,
    JsonFlag,
    console,
    err_console,
    fail,
    plural,
    print_json,
    run,
)

__all__ = ["parse_target", "register"]

INACTIVE_STATES = ("Empty", "Dead")  # Kafka resets offsets only in these

def parse_target(text: str) -> tuple[str, int]:
    """``earliest``, ``latest``, an offset (``42``) or an ISO 8601 time (local time when it has no zone)."""
    if text in ("earliest", "beginning", "start"):
        return "earliest", 0
    if text in ("latest", "end"):
        return "latest", 0
    if text.lstrip("-").isdigit():
        return "offset", int(text)
    return "time", int(datetime.fromisoformat(text).timestamp() * 1000)

async def _plan(admin: AsyncAdmin, group: str, topic: str | None, where: str, arg: int,
                notes: list[str]) -> tuple[str, list[dict[str, Any]]]:
    try:
        desc = await admin.describe_group(group)
        state, members = desc.state, len(desc.members)
    except UnknownGroupError:
        if topic is None:
            raise
        state, members = "Dead", 0  # Kafka lets a reset create the group's offsets
    if state not in INACTIVE_STATES:
        fail(f"consumer group {group!r} has {plural(members, 'active member')} (state {state}): offsets can only "
             "be moved while the group is inactive; stop its consumers first", EXIT_RUNTIME)
    committed = await admin.committed_offsets(group) if state != "Dead" else {}
    if topic is not None:
        tps = [TopicPartition(topic, p) for p in await admin.partitions(topic)]
    else:
        tps = sorted(committed)
        if not tps:
            fail(f"consumer group {group!r} has no committed offsets: name the topic with --topic", EXIT_USAGE)
    starts = await admin.beginning_offsets(tps)
    ends = await admin.end_offsets(tps)
    found = await admin.offsets_for_time(tps, arg) if where == "time" else {}
    rows = []
    for tp in tps:
        if where == "earliest":
            new = starts[tp]
        elif where == "latest":
            new = ends[tp]
        elif where == "time":
            at = found.get(tp)
            if at is None:
                notes.append(f"{tp.topic}[{tp.partition}] has no record at or after that time: "
                             f"moved to its end offset {ends[tp]}")
            new = ends[tp] if at is None else at
        else:
            new = min(max(arg, starts[tp]), ends[tp])
            if new != arg:
                notes.append(f"{tp.topic}[{tp.partition}] holds offsets {starts[tp]}..{ends[tp]}: {arg} became {new}")
        rows.append({"topic": tp.topic, "partition": tp.partition, "current": committed.get(tp), "new": new})
    return state, rows

def seek(
    group: str,
    to: Annotated[str, typer.Option("--to", help="earliest, latest, an offset, or an ISO 8601 time "
                                                 "(2026-05-01T10:00:00, local time unless it has a zone).")],
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic's partitions (default: "
                                                                    "every partition the group committed on).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the new offsets without committing them.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Move a consumer group's committed offsets (the group must have no active members)."""
    try:
        where, arg = parse_target(to)
    except ValueError:
        fail(f"--to {to!r} is not earliest, latest, an offset or an ISO 8601 time", EXIT_USAGE)
    notes: list[str] = []

    async def go() -> list[dict[str, Any]]:
        async with AsyncAdmin(bootstrap) as admin:
            _state, rows = await _plan(admin, group, topic, where, arg, notes)
            if not dry_run:
                await admin.commit_group_offsets(
                    group, {TopicPartition(r["topic"], r["partition"]): r["new"] for r in rows})
            return rows

    rows = run(go(), topic=topic, group=group)
    if json_out:
        print_json({"group": group, "dry_run": dry_run, "partitions": rows})
        return
    for note in notes:
        err_console.print(note)
    title = f"group {group}: " + ("dry run, nothing committed" if dry_run else "offsets committed")
    table = Table("topic", "partition", "current", "new", title=title)
    for r in rows:
        current = "-" if r["current"] is None else str(r["current"])
        table.add_row(r["topic"], str(r["partition"]), current, f"→ {r['new']}")
    console.print(table)

def delete(
    group: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    json_out: JsonFlag = False,
) -> None:
    """Delete a consumer group and its committed offsets (the group must have no active members)."""
    if not yes and not typer.confirm(f"delete consumer group {group} and its committed offsets?"):
        raise typer.Exit(EXIT_RUNTIME)

    async def go() -> None:
        async with AsyncAdmin(bootstrap) as admin:
            await admin.delete_group(group)

    run(go(), group=group)
    if json_out:
        print_json({"deleted": group})
    else:
        console.print(f"deleted consumer group {group}")

def register(groups_app: typer.Typer) -> None:
    groups_app.command("seek")(seek)
    groups_app.command("delete")(delete)
