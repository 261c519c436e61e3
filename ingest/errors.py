"""Errors raised by the ingest package.

One root, so a listener can catch everything ingest raises::

    IngestError
    ├── PayloadError            the device sent something we cannot use (its fault)
    │   ├── FormatError         not valid JSON / InfluxDB line protocol / CSV for the header
    │   └── RouteError          parsed, but no key / event time / log topic can be derived
    ├── ConfigError             a routing rule or source definition is invalid (the operator's fault)
    └── SinkError               our side: the log refused an append (storage failure, topic limits)

``PayloadError``s never leave the ingest core as exceptions: the router turns them into
``Rejected`` results and the sink writes those to the dead-letter topic with the reason.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "FormatError",
    "IngestError",
    "PayloadError",
    "RouteError",
    "SinkError",
]


class IngestError(Exception):
    """Root of every error the ingest package raises."""


class PayloadError(IngestError):
    """The device's bytes cannot be used; they go to the dead-letter topic with this reason."""


class FormatError(PayloadError):
    """Not valid for the declared payload format."""


class RouteError(PayloadError):
    """Parsed fine, but the rule cannot derive a key, event time or topic from it."""


class ConfigError(IngestError, ValueError):
    """A routing rule or source definition is invalid."""


class SinkError(IngestError):
    """The log could not take an append (our side); the caller must not acknowledge."""
