"""The console's pages: server-rendered Jinja2 templates that htmx refreshes in place.

Every page is a full HTML document; its ``#live`` part re-fetches the same URL every ``REFRESH`` and htmx
swaps in the new ``#live`` (``hx-select``), so a page works without JavaScript too (it just does not update).
The live tail is the API's own SSE loop (``sluice.http.stream.record_events``) with records rendered as
HTML fragments, which htmx's SSE extension prepends. On pages, an unknown topic or group is a 404 page in the
console's layout and bad input to the message browser is shown next to its form; elsewhere (the tail, failed
logins) errors are the API's problem documents, raised by the same readers.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from fastapi.templating import Jinja2Templates

import sluice
from broker.errors import BrokerError, UnknownTopicError
from broker.protocol.records import Record
from sluice.console import views
from sluice.console.rates import RateTracker
from sluice.console.render import VIEWS, View, show_record
from sluice.http.context import Ctx
from sluice.http.limits import INT32_MAX, INT64_MAX
from sluice.http.problems import ProblemError
from sluice.http.stream import record_events, start_cursors

__all__ = ["PREFIX", "REFRESH", "STATIC_DIR", "router"]

PREFIX = "/console"
REFRESH = "2s"
STATIC_DIR = Path(__file__).parent / "static"
TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")

router = APIRouter(prefix=PREFIX, include_in_schema=False, default_response_class=HTMLResponse)


def _time(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 1:
        return f"{ms:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _ago(ms: int | None) -> str:
    if ms is None:
        return "never"
    return _duration(max(dt.datetime.now(dt.UTC).timestamp() * 1000 - ms, 0)) + " ago"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _rate(value: float | None, unit: str = "/s") -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}{unit}" if value < 100 else f"{value:,.0f}{unit}"


TEMPLATES.env.filters.update(time=_time, ago=_ago, duration=_duration, size=_size, rate=_rate)
TEMPLATES.env.globals.update(version=sluice.__version__, refresh=REFRESH, prefix=PREFIX, views=VIEWS)


def _rates(request: Request) -> RateTracker:
    tracker: RateTracker = request.app.state.console_rates  # one per app (install_console)
    return tracker


def _page(request: Request, name: str, section: str, **context: Any) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, name, {"section": section, **context})


def _missing(request: Request, section: str, title: str, detail: str) -> HTMLResponse:
    """A page for a topic or group that is not there (a stale link): 404, in the console's own layout."""
    page = _page(request, "error.html", section, title=title, detail=detail)
    page.status_code = 404
    return page


@router.get("")
async def overview(request: Request, ctx: Ctx) -> HTMLResponse:
    return _page(request, "overview.html", "overview", o=views.overview(ctx, _rates(request)))


@router.get("/topics")
async def topics(request: Request, ctx: Ctx, internal: bool = False) -> HTMLResponse:
    rows = views.topics(ctx, _rates(request), internal=internal)
    return _page(request, "topics.html", "topics", topics=rows, internal=internal)


@router.get("/topics/{topic}")
async def topic(request: Request, ctx: Ctx, topic: str) -> HTMLResponse:
    try:
        detail = views.topic_detail(ctx, _rates(request), topic)
    except UnknownTopicError as exc:
        return _missing(request, "topics", "Unknown topic", str(exc))
    return _page(request, "topic.html", "topics", t=detail)


def _parse_time(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    text = text.strip()
    if text.isascii() and text.isdigit():  # "²" is a digit to isdigit, not to int()
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        detail = f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 time such as 2026-12-01T18:00:00"
        raise ProblemError(400, "invalid-time", "Invalid time", detail) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


@router.get("/topics/{topic}/messages")
async def messages(
    request: Request,
    ctx: Ctx,
    topic: str,
    partition: Annotated[str, Query(description="A partition number, or empty for all")] = "",
    offset: Annotated[str, Query()] = "",
    at: Annotated[str, Query(description="Event time: ms since the epoch or ISO 8601 (UTC)")] = "",
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
    view: View = "auto",
) -> HTMLResponse:
    try:
        detail = views.topic_detail(ctx, _rates(request), topic)
    except UnknownTopicError as exc:
        return _missing(request, "topics", "Unknown topic", str(exc))
    form = {"partition": partition, "offset": offset, "at": at, "limit": limit, "view": view}
    try:
        part = _number(partition, "partition", INT32_MAX)
        start = _number(offset, "offset", INT64_MAX)
        if start is not None and part is None:
            detail_text = "an offset only means something within one partition: choose a partition as well"
            raise ProblemError(400, "offset-needs-partition", "Offset needs a partition", detail_text)
        at_ms = _parse_time(at) if at.strip() and start is None else None
        records = views.browse(ctx, topic, partition=part, offset=start, at_ms=at_ms, limit=limit, view=view)
    except (ProblemError, BrokerError) as exc:  # the form's input: shown on the page, next to the form
        error = exc.detail if isinstance(exc, ProblemError) else str(exc)
        page = _page(request, "messages.html", "topics", t=detail, records=[], form=form, error=error)
        page.status_code = exc.status if isinstance(exc, ProblemError) else 400
        return page
    return _page(request, "messages.html", "topics", t=detail, records=records, form=form, error=None)


def _number(text: str, name: str, upper: int) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > upper:  # ASCII: "²" and "١" are isdigit too
        raise ProblemError(400, f"invalid-{name}", f"Invalid {name}", f"{name} must be a number from 0 to {upper}")
    return int(text)


@router.get("/topics/{topic}/tail", response_class=StreamingResponse)
async def tail(
    ctx: Ctx,
    topic: str,
    partition: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
    start: Literal["latest", "earliest"] = "latest",
    view: View = "auto",
) -> StreamingResponse:
    """The topic as SSE ``record`` events whose data is the HTML of one record (``_record.html``)."""
    ctx.store.topic(topic)
    logs = [ctx.store.partition(topic, partition)] if partition is not None else ctx.store.partitions(topic)
    fragment = TEMPLATES.env.get_template("_record.html")

    def render(p: int, record: Record) -> str:
        return fragment.render(r=show_record(p, record, view), live=True)

    return StreamingResponse(
        record_events(ctx, topic, logs, start_cursors(logs, None, start), None, render),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/groups")
async def groups(request: Request, ctx: Ctx) -> HTMLResponse:
    return _page(request, "groups.html", "groups", groups=views.groups(ctx))


@router.get("/groups/{group_id}")
async def group(request: Request, ctx: Ctx, group_id: str) -> HTMLResponse:
    try:
        detail = views.group_detail(ctx, group_id)
    except ProblemError as exc:  # 404 unknown-group
        return _missing(request, "groups", exc.title, exc.detail)
    return _page(request, "group.html", "groups", g=detail)


@router.get("/sources")
async def sources(request: Request, ctx: Ctx) -> HTMLResponse:
    return _page(request, "sources.html", "sources", s=await views.sources(ctx))


@router.get("/processors")
async def processors(request: Request, ctx: Ctx) -> HTMLResponse:
    return _page(request, "processors.html", "processors", processors=await views.processors(ctx))
