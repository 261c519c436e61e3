"""File source: replay or tail a file into the log, remembering its position across restarts."""

from ingest.file.source import FileSource, FileSourceConfig, Position, PositionStore

__all__ = ["FileSource", "FileSourceConfig", "Position", "PositionStore"]
