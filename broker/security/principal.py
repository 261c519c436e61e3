"""Who a connection acts as, once authenticated (Kafka's ``KafkaPrincipal``: a type and a name)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANONYMOUS", "Principal"]


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    kind: str = "User"

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"  # as Kafka prints principals (ACLs name them this way)


ANONYMOUS = Principal("ANONYMOUS")  # Kafka's principal for unauthenticated connections
