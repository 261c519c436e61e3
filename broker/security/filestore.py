"""One JSON document in the data directory, shared by a running broker and offline ``sluice`` commands.

Rules (the user, token and ACL stores all keep their file this way):
- Writes are read-modify-write under an exclusive ``flock`` on a lock file beside the document, and
  replace it atomically (temporary file, fsync, rename, fsync of the directory), mode 0600: two commands
  never lose each other's change, and a crash leaves the old or the new document, never half of one.
- Readers pick up a changed file at their next read (its mtime and size are checked), so a change made
  with ``--data-dir`` reaches a running broker without a restart. A document that breaks while the broker
  runs (edited by hand) is logged once at ERROR and the content read before stays in use; a document
  unreadable at the first read raises ``UserStoreError`` (the caller's start-up or command reports it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.security.errors import UserStoreError

__all__ = ["JsonDocument"]

log = logging.getLogger("broker.security")


class JsonDocument:
    """``{"format": N, <key>: {...}}`` at ``path``; ``read()`` gives the ``<key>`` mapping."""

    def __init__(self, path: Path, key: str, what: str, fmt: int = 1) -> None:
        self.path = path
        self._key = key
        self._what = what  # "the ACL store": how errors name it
        self._format = fmt
        self._content: dict[str, Any] = {}
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) last read; None: never read
        self.version = 0  # bumped whenever the content read changes (callers cache derived views on it)

    def read(self) -> dict[str, Any]:
        """The current content (re-read when the file changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._seen != (0, 0):
                self._content, self._seen = {}, (0, 0)
                self.version += 1
            return self._content
        except OSError as exc:
            raise UserStoreError(f"cannot read {self._what} {self.path}: {exc}") from exc
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return self._content
        try:
            self._content = self._load()
            self.version += 1
        except UserStoreError as exc:
            if self._seen is None:
                raise
            log.error(f"{exc}; the content read before stays in use until it is fixed")
        self._seen = stamp
        return self._content

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
            if not isinstance(data, dict) or data.get("format") != self._format:
                raise ValueError(f"unknown format {data.get('format') if isinstance(data, dict) else data!r}")
            content = data[self._key]
            if not isinstance(content, dict):
                raise ValueError(f"{self._key!r} is not an object")
            return content
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UserStoreError(f"cannot read {self._what} {self.path}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise UserStoreError(f"{self._what} {self.path} is not valid: {exc}") from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under the lock; the mapping yielded is written when the block ends normally."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_suffix(".lock"), "a+b")  # noqa: SIM115 (held across the yield)
        except OSError as exc:
            raise UserStoreError(f"cannot open {self._what} in {self.path.parent}: {exc}") from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            content = self._load()
            yield content
            self._write(content)
            self._content, self._seen = content, None
            self.version += 1

    def _write(self, content: dict[str, Any]) -> None:
        doc = {"format": self._format, self._key: content}
        tmp = self.path.with_suffix(".json.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(json.dumps(doc, indent=1, sort_keys=True).encode())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise UserStoreError(f"cannot write {self._what} {self.path}: {exc}") from exc
