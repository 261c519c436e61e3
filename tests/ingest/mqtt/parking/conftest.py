"""The parking tests run on asyncio's own loop and on uvloop (what ``sluice serve`` runs on by default):
parking leans on each loop's transports (``connect_accepted_socket``, closing a transport whose socket
was duplicated)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
