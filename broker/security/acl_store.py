"""The ACL store: every binding in ``<data_dir>/security/acls.json`` (``filestore.JsonDocument``).

The data directory, not an internal topic: ACLs are few, change rarely, must be readable before any
listener opens and editable offline (``sluice acl add --data-dir``, how the first ones are made), and the
user store already lives there. Writes are atomic under a lock; a running broker sees offline changes at
its next check (the file's mtime), its own changes at once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker.security.acl import AclBinding, AclFilter
from broker.security.errors import UserStoreError
from broker.security.filestore import JsonDocument

__all__ = ["ACLS_FILE", "AclStore"]

log = logging.getLogger("broker.security")

ACLS_FILE = Path("security") / "acls.json"


class AclStore:
    def __init__(self, data_dir: Path) -> None:
        self._doc = JsonDocument(Path(data_dir) / ACLS_FILE, "acls", "the ACL store")
        self.path = self._doc.path
        self._version = -1
        self._bindings: tuple[AclBinding, ...] = ()

    @property
    def version(self) -> int:
        """Changes whenever the bindings may have changed (callers key caches on it)."""
        self.bindings()
        return self._version

    def bindings(self) -> tuple[AclBinding, ...]:
        content = self._doc.read()
        if self._doc.version != self._version:
            try:
                self._bindings = tuple(_decode(content))
            except UserStoreError as exc:
                if self._version == -1:
                    raise  # never read: start-up or the command reports it
                log.error(f"{exc}; the ACLs read before stay in use until it is fixed")
            self._version = self._doc.version
        return self._bindings

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings() if acl_filter.matches(b)]

    def add(self, bindings: list[AclBinding]) -> int:
        """Store ``bindings``; how many were new (one that exists already is not an error, as in Kafka)."""
        with self._doc.locked() as content:
            new = 0
            for binding in bindings:
                if binding.key not in content:
                    content[binding.key] = binding.to_json()
                    new += 1
        return new

    def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Remove every binding each filter matches; per filter, the bindings it removed."""
        with self._doc.locked() as content:
            existing = list(_decode(content))
            removed: list[list[AclBinding]] = []
            for acl_filter in filters:
                gone = [b for b in existing if acl_filter.matches(b)]
                for binding in gone:
                    content.pop(binding.key, None)
                removed.append(gone)
        return removed


def _decode(content: dict[str, object]) -> list[AclBinding]:
    out = []
    for key, entry in content.items():
        try:
            out.append(AclBinding.from_json(entry))  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserStoreError(f"the ACL store holds an invalid binding {key!r}: {exc}") from exc
    return sorted(out, key=lambda b: b.key)
