"""Ack mode's answers (the format is in ``ingest/tcp/listener.py``'s docstring): for a read written message by
message (``IngestSink.write``: ``ack_lines``) and for one written by the line path (``write_lines``:
``line_acks``)."""

from __future__ import annotations

from collections.abc import Sequence

from ingest.line_writes import LineOutcome
from ingest.sink import WriteOutcome

__all__ = ["ack_lines", "line_acks", "one_line"]


def one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def ack_lines(
    outcomes: Sequence[WriteOutcome], numbers: Sequence[int], last_line: int, dead_letter_topic: str
) -> bytes:
    """The ack-mode answer for one durable batch (format in the module docstring)."""
    out: list[str] = []
    last: dict[tuple[str, int], int] = {}
    for outcome, number in zip(outcomes, numbers, strict=True):
        for reason in outcome.rejected:
            out.append(f"ERR {number} {one_line(reason)}\n")
        for placement in outcome.placements:
            key = (placement.topic, placement.partition)
            if placement.offset > last.get(key, -1):
                last[key] = placement.offset
    for (topic, partition), offset in last.items():
        if topic != dead_letter_topic:
            out.append(f"OK {topic} {partition} {offset}\n")
    out.append(f"ACK {last_line}\n")
    return "".join(out).encode()


def line_acks(outcome: LineOutcome, numbers: Sequence[int] | None, first: int, last_line: int,
              dead_letter_topic: str) -> bytes:
    """``ack_lines`` for a read written by ``IngestSink.write_lines``: line ``i`` of the read is line number
    ``numbers[i]`` (None: ``first + i``, no line of the read was skipped)."""
    out = [f"ERR {numbers[i] if numbers is not None else first + i} {one_line(reason)}\n"
           for i, reason in outcome.rejected]
    out += [f"OK {topic} {partition} {offset}\n" for (topic, partition), offset in outcome.last_offsets.items()
            if topic != dead_letter_topic]
    out.append(f"ACK {last_line}\n")
    return "".join(out).encode()


