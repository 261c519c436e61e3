"""Where a file source is in its file, saved so that a restart resumes without storing a line twice or
skipping one, even after ``kill -9``.

A ``Position`` is the byte offset of the next line to read (with the file's inode and device, and the CSV
header in force there). While a read is being written it also holds the read's ``Pending`` state: the end
of the read and, for every batch the sink appends for it, the (topic, partition, base offset, owners)
that ``ingest/append_journal.py`` reports *before* the append. That state is saved (and fsynced) before
each append, so whatever the moment of a crash, the file says which batches may be in the log; after the
read is durable the plain position (the read's end, nothing pending) replaces it.

On restart the pending batches are looked up in the log (``stored_entries``): the batch at the base offset
is the source's own when it starts there, holds as many records as the entry has owners and carries the
source's ``source`` header (no other writer uses it). The read is then framed again from its start (the
same bytes, the same lines, in the same order) and the lines none of whose records reached the log are
written again (``lines_done`` says which).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.errors import BrokerError
from broker.log.api import LogStore
from broker.protocol.records import decode_records, iter_batches
from ingest.append_journal import AppendEntry

__all__ = ["Pending", "Position", "PositionStore", "lines_done", "stored_entries"]

log = logging.getLogger("ingest.file")


@dataclass(frozen=True, slots=True)
class Pending:
    """A read in flight: it ends at byte ``end``; ``appends`` are the sink's batches for it so far."""

    end: int
    appends: tuple[AppendEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class Position:
    path: str
    inode: int
    device: int
    offset: int
    columns: tuple[str, ...] | None = None  # the CSV header in force at ``offset`` (None: not read yet)
    pending: Pending | None = field(default=None)


def _to_json(position: Position) -> dict[str, Any]:
    out: dict[str, Any] = {"path": position.path, "inode": position.inode, "device": position.device,
                           "offset": position.offset}
    if position.columns is not None:
        out["columns"] = list(position.columns)
    if position.pending is not None:
        out["pending"] = {"end": position.pending.end,
                          "appends": [[t, p, b, owners] for t, p, b, owners in position.pending.appends]}
    return out


def _from_json(data: dict[str, Any]) -> Position:
    columns = data.get("columns")
    pending = data.get("pending")
    return Position(
        str(data["path"]), int(data["inode"]), int(data["device"]), int(data["offset"]),
        tuple(str(c) for c in columns) if columns is not None else None,
        Pending(int(pending["end"]), tuple((str(t), int(p), int(b), [int(o) for o in owners])
                                           for t, p, b, owners in pending["appends"]))
        if pending is not None else None,
    )


class PositionStore:
    """One small JSON file per source, replaced atomically (written to a temporary file, then renamed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _file(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def load(self, name: str) -> Position | None:
        path = self._file(name)
        try:
            return _from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable file position", extra={"file": str(path), "error": str(exc)})
            return None

    def save(self, name: str, position: Position, *, sync: bool = True) -> None:
        """Replace the saved position. ``sync``: fsync it first (a pending read's state must be on disk
        before its appends; the plain position after them need not be: the pending state it replaces
        resolves to the same place)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._file(name)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(_to_json(position)))
            if sync:
                f.flush()
                os.fsync(f.fileno())
        tmp.replace(path)


def _stored(store: LogStore, label: bytes, entry: AppendEntry) -> bool:
    topic, partition, base, owners = entry
    if base < 0 or not store.has_topic(topic):
        return False
    try:
        plog = store.partition(topic, partition)
        if plog.log_end_offset < base + len(owners) or base < plog.log_start_offset:
            return False
        data = plog.read(base, 1)
    except BrokerError:
        return False
    for pos, header in iter_batches(data, verify=False):
        if header.base_offset != base or header.record_count != len(owners):
            return False
        records = decode_records(memoryview(data)[pos:pos + header.size], header)
        return all(record.header("source") == label for record in records)
    return False


def stored_entries(store: LogStore, label: str, entries: tuple[AppendEntry, ...]) -> list[AppendEntry]:
    """The entries whose batch is in the log (the module docstring says how that is told)."""
    raw = label.encode()
    return [entry for entry in entries if _stored(store, raw, entry)]


def lines_done(entries: tuple[AppendEntry, ...], stored: list[AppendEntry], dead_letter_topic: str) -> set[int]:
    """The owners (lines of the read) not to write again: those with a stored dead letter (dead letters are
    appended after every record of their call, so that line's records were all appended or refused), and
    those whose every record batch is stored."""
    kept = {id(entry) for entry in stored}
    done: set[int] = set()
    missing: set[int] = set()
    for entry in entries:
        topic, _, _, owners = entry
        if topic == dead_letter_topic:
            if id(entry) in kept:
                done.update(owners)
        elif id(entry) in kept:
            done.update(owners)
        else:
            missing.update(owners)
    dead = {o for entry in stored if entry[0] == dead_letter_topic for o in entry[3]}
    return (done - missing) | dead
