"""Live progress for ``sluice`` commands that take a while: a count, its rate and the elapsed time, on stderr.

Shown only when stderr is a terminal (``err_console.is_terminal``), so piped or redirected output carries
data and nothing else; it disappears when the command ends (the command prints its own summary).
With ``delay_s`` the display starts only once the work has run that long: a listing that answers at once
shows nothing, one that takes more than a second gets a counter.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from sluice.cli_common import err_console

__all__ = ["Activity"]


class _CountColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        noun = task.fields["noun"]
        if not noun:  # a wait with nothing to count
            return Text("")
        count = int(task.completed)
        return Text(f"{count:,} {noun if count == 1 else task.fields['nouns']}")


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


class Activity:
    """``with Activity("producing", "record") as a: … a.advance()`` (or ``a.set(n)``)."""

    def __init__(self, what: str, noun: str, nouns: str | None = None, *, delay_s: float = 0.0,
                 enabled: bool = True, detail: str = "", console: Console | None = None) -> None:
        console = console or err_console
        self.enabled = enabled and console.is_terminal
        self.delay_s = delay_s
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), _CountColumn(), _RateColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
            console=console, transient=True, disable=not self.enabled,
            # rich would otherwise capture sys.stdout and print it to the terminal above the bar: records meant
            # for a file or a pipe must go there, untouched
            redirect_stdout=False, redirect_stderr=False,
        )
        self._task = self._progress.add_task(what, total=None, noun=noun, nouns=nouns or noun + "s", detail=detail)
        self._began = time.monotonic()
        self._live = False
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> Activity:
        self._maybe_show()
        if self.enabled and not self._live:
            try:  # in a command's event loop: show after delay_s even if no step has finished by then
                self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._maybe_show)
            except RuntimeError:
                pass
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._live:
            self._progress.stop()
            self._live = False

    def advance(self, count: int = 1) -> None:
        self._progress.advance(self._task, count)
        self._maybe_show()

    def set(self, completed: int, *, detail: str | None = None) -> None:
        if detail is None:
            self._progress.update(self._task, completed=completed)
        else:
            self._progress.update(self._task, completed=completed, detail=detail)
        self._maybe_show()

    def describe(self, what: str) -> None:
        self._progress.update(self._task, description=what)
        self._maybe_show()

    @property
    def shown(self) -> bool:
        return self._live

    def _maybe_show(self) -> None:
        if self.enabled and not self._live and time.monotonic() - self._began >= self.delay_s:
            self._progress.start()
            self._live = True
