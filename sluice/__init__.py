"""The assembly: `sluice serve`, the CLI and the HTTP API, wiring broker, ingest and processors."""

__version__ = "0.1.0"
__all__ = ["__version__"]
