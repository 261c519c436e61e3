"""TCP line ingest: sans-IO line framing and an asyncio listener for NDJSON, InfluxDB lines and CSV."""

from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.listener import LISTENER_FORMATS, TcpLineListener, TcpListenerConfig

__all__ = ["LISTENER_FORMATS", "LineFramer", "LineTooLong", "TcpLineListener", "TcpListenerConfig"]
