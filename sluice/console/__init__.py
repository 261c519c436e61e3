"""The web console at ``/console``: pages over the HTTP API's data, served from files in this package.

Server-rendered Jinja2 templates (``templates/``) refreshed in place by htmx, and a live tail over SSE;
htmx and its SSE extension are vendored in ``static/`` (versions and licences in ``static/VENDORED.md``),
so the console works with no network beyond the broker. ``install_console`` adds the pages and the static
files to the API's FastAPI app; the pages take the same dependencies (authentication) as the API routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

__all__ = ["install_console"]


def install_console(app: FastAPI, dependencies: Sequence[Any] = ()) -> None:
    # imported here: the pages read sluice.http's modules, and sluice.http's create_app calls this
    from sluice.console.rates import RateTracker
    from sluice.console.routes import PREFIX, STATIC_DIR, router

    app.state.console_rates = RateTracker()
    app.include_router(router, dependencies=list(dependencies))
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="console-static")
