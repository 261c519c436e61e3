"""``sluice groups list|describe`` (Kafka protocol, clients.AsyncAdmin) and ``sluice sources`` (HTTP API:
ingest health lives in the server, not in the log).

``sluice sources`` reads ``/sources`` (per source and device) twice for rates, then ``/bridges`` and ``/mqtt``
(the MQTT listener; absent when it is off). ``--json`` prints one list of rows told apart by ``type``:
``source`` and ``device`` rows as ``/sources`` gives them, then one ``bridge`` row per MQTT bridge and one
``mqtt_listener`` row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from clients import AsyncAdmin, TopicPartition
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_HTTP,
    Bootstrap,
    HttpUrl,
    JsonFlag,
    console,
    http_get,
    print_json,
    run,
)
from sluice.cli_progress import Activity

__all__ = ["register"]

groups_app = typer.Typer(no_args_is_help=True, help="Consumer groups: members, assignment, lag; move or delete.")


@groups_app.command("list")
def groups_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, json_out: JsonFlag = False) -> None:
    """List consumer groups with their state and member count."""

    async def go() -> list[dict[str, Any]]:
        async with AsyncAdmin(bootstrap) as admin:
            rows = []
            names = await admin.list_groups()
            with Activity("describing", "group", delay_s=1.0, detail=f"of {len(names)}") as progress:
                for group_id in names:
                    desc = await admin.describe_group(group_id)
                    lag = await admin.group_lag(group_id)
                    rows.append(
                        {
                            "group": group_id,
                            "state": desc.state,
                            "members": len(desc.members),
                            "lag": sum(p.lag for p in lag),
                        }
                    )
                    progress.advance()
            return rows

    rows = run(go())
    if json_out:
        print_json(rows)
        return
    table = Table("group", "state", "members", "lag")
    for r in rows:
        table.add_row(r["group"], r["state"], str(r["members"]), str(r["lag"]))
    console.print(table)


@groups_app.command("describe")
def groups_describe(group: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, json_out: JsonFlag = False) -> None:
    """Members, assignment, and per partition: committed offset, end offset, offset lag, event-time lag."""

    async def go() -> dict[str, Any]:
        async with AsyncAdmin(bootstrap) as admin:
            desc = await admin.describe_group(group)
            owner = {
                TopicPartition(t, p): m.member_id for m in desc.members for t, ps in m.assignment.items() for p in ps
            }
            partitions = []
            lags = await admin.group_lag(group, list(owner))
            with Activity("reading lag of", "partition", delay_s=1.0, detail=f"of {len(lags)}") as progress:
                for lag in lags:
                    partitions.append(
                        {
                            "topic": lag.topic,
                            "partition": lag.partition,
                            "committed": lag.committed,
                            "end_offset": lag.end_offset,
                            "lag": lag.lag,
                            "event_time_lag_ms": await admin.event_time_lag_ms(lag),
                            "member": owner.get(TopicPartition(lag.topic, lag.partition)),
                        }
                    )
                    progress.advance()
            return {
                "group": desc.group_id,
                "state": desc.state,
                "protocol": desc.protocol,
                "members": [
                    {
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "host": m.client_host,
                        "assignment": m.assignment,
                    }
                    for m in desc.members
                ],
                "partitions": partitions,
            }

    info = run(go(), group=group)
    if json_out:
        print_json(info)
        return
    console.print(f"group [bold]{info['group']}[/] state {info['state']} protocol {info['protocol'] or '-'}")
    members = Table("member", "client", "host", "assignment", title="members")
    for m in info["members"]:
        assigned = ", ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in m["assignment"].items())
        members.add_row(m["member_id"], m["client_id"], m["host"], assigned or "-")
    console.print(members)
    parts = Table("topic", "partition", "committed", "end", "lag", "event-time lag", "member", title="lag")
    for p in info["partitions"]:
        etl = p["event_time_lag_ms"]
        parts.add_row(
            p["topic"],
            str(p["partition"]),
            str(p["committed"] if p["committed"] is not None else "-"),
            str(p["end_offset"]),
            str(p["lag"]),
            "-" if etl is None else f"{etl / 1000:.1f} s",
            p["member"] or "-",
        )
    console.print(parts)


_STATE_STYLE = {"idle": "[yellow]{}[/]", "slow": "[magenta]{}[/]", "bursty": "[cyan]{}[/]"}  # see ingest/arrivals.py


def _state(row: dict[str, Any]) -> str:
    state = str(row.get("state") or ("idle" if row.get("idle") else "active"))
    return _STATE_STYLE.get(state, "{}").format(state)


def _ago(ms: int | None, now: float) -> str:
    if ms is None:
        return "never"
    seconds = max(now - ms / 1000, 0)
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.1f} min ago"


def sources(
    http: HttpUrl = DEFAULT_HTTP,
    interval: Annotated[float, typer.Option(help="Seconds between two snapshots to compute rates (0: none).")] = 1.0,
    idle_only: Annotated[bool, typer.Option("--idle", help="Only idle sources and devices.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Ingest health per source and device (message rate, bytes, errors, last seen, idle), MQTT bridges and the
    MQTT listener."""

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
        first = await http_get(http, "/sources")
        bridges = list(await http_get(http, "/bridges"))
        listener = await http_get(http, "/mqtt", missing_ok=True)
        if interval <= 0:
            return list(first), bridges, listener
        t0 = time.monotonic()
        with Activity("measuring rates", "", detail=f"over {interval:g} s", enabled=not json_out):
            await asyncio.sleep(interval)
        second = await http_get(http, "/sources")
        elapsed = time.monotonic() - t0
        before = {(r.get("type"), r.get("source"), r.get("device")): r for r in first}
        for row in second:
            prev = before.get((row.get("type"), row.get("source"), row.get("device")))
            delta = row.get("messages", 0) - (prev.get("messages", 0) if prev else 0)
            row["rate_per_s"] = round(delta / elapsed, 2)
        return list(second), bridges, listener

    rows, bridges, listener = asyncio.run(go())
    if idle_only:
        rows = [r for r in rows if r.get("idle")]
    if json_out:
        extra = [{"type": "bridge", **b} for b in bridges]
        if listener is not None:
            extra.append({"type": "mqtt_listener", **listener})
        print_json(rows + extra)
        return
    now = time.time()
    table = Table("source", "device", "messages", "rate/s", "bytes", "errors", "last seen", "state")
    for r in rows:
        table.add_row(
            str(r.get("source", "")),
            str(r.get("device") or ("(all)" if r.get("type") == "source" else "")),
            str(r.get("messages", 0)),
            str(r.get("rate_per_s", "-")),
            str(r.get("bytes", 0)),
            str(r.get("errors", 0)),
            _ago(r.get("last_seen_ms"), now),
            _state(r),
        )
    console.print(table)
    if bridges:
        console.print(_bridge_table(bridges, now))
    if listener is not None:
        console.print(
            f"MQTT listener {listener.get('endpoint') or '-'}: {listener['connections']} connections, "
            f"{listener['sessions']} sessions, {listener['subscriptions']} subscriptions, "
            f"{listener['messages_in']} messages in"
        )


def _bridge_table(bridges: list[dict[str, Any]], now: float) -> Table:
    columns = ("bridge", "broker", "connected", "messages", "acked", "last message", "last error")
    table = Table(*columns, title="MQTT bridges")
    for b in bridges:
        last = b.get("last_message_at")
        table.add_row(
            str(b["name"]),
            str(b["broker"]),
            "[green]yes[/]" if b.get("connected") else "[red]no[/]",
            str(b.get("messages", 0)),
            str(b.get("acked", 0)),
            _ago(None if last is None else int(last * 1000), now),
            str(b.get("last_error") or "-"),
        )
    return table


def register(app: typer.Typer) -> None:
    from sluice import cli_groups

    cli_groups.register(groups_app)
    app.add_typer(groups_app, name="groups")
    app.command("sources")(sources)
