"""Sans-IO line framing for TCP streams and files: bytes in, lines out.

Rules:
- a line ends at ``\\n``; one trailing ``\\r`` is removed (``\\r\\n`` senders are fine);
- empty lines are returned too (as ``b""``) so callers can count line numbers; they skip them;
- a line longer than ``max_line_bytes`` never grows the buffer past that: its first
  ``max_line_bytes`` are kept, the rest is skipped up to the next newline, and a ``LineTooLong``
  event (with the kept prefix and the full length) takes the line's place;
- ``end()`` (end of stream) returns the last line when it had no newline.

``pending`` is the number of bytes fed but not yet returned as a line (or a ``LineTooLong``):
a file source saves ``read_offset - pending`` as the position of the next unread line.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LineFramer", "LineTooLong"]


@dataclass(frozen=True, slots=True)
class LineTooLong:
    prefix: bytes  # the first max_line_bytes of the line
    length: int  # the line's full length in bytes (without the newline)


class LineFramer:
    def __init__(self, max_line_bytes: int = 64 * 1024) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = False
        self._prefix = b""
        self._skipped = 0  # bytes of the overlong line seen so far

    @property
    def pending(self) -> int:
        return len(self._buf) + (self._skipped if self._discarding else 0)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        if not data:
            return out
        if not self._buf and not self._discarding and data[-1] == 0x0A and type(data) is bytes and (
            len(data) <= self.max_line_bytes + 1 and 0x0D not in data  # 0x0A, 0x0D: b"\n", b"\r" as ints
        ):
            # The usual read of a device: whole lines, none too long, nothing held from the last read.
            return data[:-1].split(b"\n")  # type: ignore[return-value]  # (a list of bytes only)
        if self._discarding:
            nl = bytes(data).find(b"\n") if not isinstance(data, bytes) else data.find(b"\n")
            if nl < 0:
                self._skipped += len(data)
                return out
            self._skipped += nl
            out.append(self._finish_overlong())
            data = data[nl + 1 :]
        buf = self._buf
        buf += data
        last = buf.rfind(b"\n")
        if last >= 0:
            complete = bytes(buf[:last])
            del buf[: last + 1]
            limit = self.max_line_bytes
            lines = complete.split(b"\n")
            # 0x0D is b"\r" as an int: `b"\r" in` would first build a TypeError (see line_kernels)
            if 0x0D not in complete and (len(complete) <= limit or max(map(len, lines)) <= limit):
                out.extend(lines)  # the usual read: nothing to strip or cut, no loop over the lines
            else:
                for line in lines:
                    if line.endswith(b"\r"):
                        line = line[:-1]
                    if len(line) > limit:
                        out.append(LineTooLong(line[:limit], len(line)))
                    else:
                        out.append(line)
        if len(buf) > self.max_line_bytes:
            self._discarding = True
            self._prefix = bytes(buf[: self.max_line_bytes])
            self._skipped = len(buf)
            buf.clear()
        return out

    def end(self) -> list[bytes | LineTooLong]:
        """End of stream: the unterminated last line, if any."""
        if self._discarding:
            return [self._finish_overlong()]
        if not self._buf:
            return []
        line = bytes(self._buf)
        self._buf.clear()
        if line.endswith(b"\r"):
            line = line[:-1]
        return [line]

    def _finish_overlong(self) -> LineTooLong:
        length = self._skipped
        prefix = self._prefix
        self._discarding = False
        self._prefix = b""
        self._skipped = 0
        return LineTooLong(prefix, length)
