"""The HTTP API (FastAPI): admin, produce, long-poll fetch, Server-Sent Events, groups, sources, metrics."""

from sluice.http.app import create_app
from sluice.http.server import HttpComponent, http_component

__all__ = ["HttpComponent", "create_app", "http_component"]
