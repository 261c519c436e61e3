"""Line framing fed whole, in random chunks and one byte at a time gives the same lines."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.tcp.framing import LineFramer, LineTooLong
from ingest.tcp.lines import LineStream


def _feed(framer: LineFramer, data: bytes, sizes: list[int]) -> list[bytes | LineTooLong]:
    out: list[bytes | LineTooLong] = []
    pos = 0
    for size in sizes:
        out += framer.feed(data[pos : pos + size])
        pos += size
    out += framer.feed(data[pos:])
    return out + framer.end()


STREAM = b'{"a": 1}\r\n\n{"b": 2}\n' + b"x" * 50 + b"\nshort\r\n" + b"y" * 33 + b"\nlast-no-newline"
EXPECTED: list[bytes | LineTooLong] = [
    b'{"a": 1}', b"", b'{"b": 2}', LineTooLong(b"x" * 16, 50), b"short", LineTooLong(b"y" * 16, 33),
    b"last-no-newline",
]


def test_whole() -> None:
    assert _feed(LineFramer(16), STREAM, []) == EXPECTED


def test_one_byte_at_a_time() -> None:
    framer = LineFramer(16)
    out: list[bytes | LineTooLong] = []
    for i in range(len(STREAM)):
        out += framer.feed(STREAM[i : i + 1])
        assert len(framer._buf) <= 16  # the buffer never grows past the limit
    assert out + framer.end() == EXPECTED


@pytest.mark.parametrize("seed", range(20))
def test_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(0, 12) for _ in range(40)]
    assert _feed(LineFramer(16), STREAM, sizes) == EXPECTED


def test_pending_counts_unreturned_bytes() -> None:
    framer = LineFramer(8)
    assert framer.feed(b"abc\nde") == [b"abc"]
    assert framer.pending == 2
    assert framer.feed(b"fghijklmn") == []
    assert framer.pending == 11  # an overlong line in progress
    assert framer.feed(b"o\n") == [LineTooLong(b"defghijk", 12)]
    assert framer.pending == 0


def test_overlong_line_at_end_of_stream() -> None:
    framer = LineFramer(4)
    assert framer.feed(b"123456789") == []
    assert framer.end() == [LineTooLong(b"1234", 9)]
    assert framer.end() == []


def test_line_stream_numbers_skips_and_csv_header() -> None:
    stream = LineStream("csv")
    items: list[bytes | LineTooLong] = [b"", b"device_id,temp", b"d1,1.5", LineTooLong(b"zz", 99), b"  ", b"d2,2"]
    messages, numbers = stream.messages(items, 5)
    assert numbers == [3, 4, 6]
    assert stream.columns == ("device_id", "temp") and stream.line_no == 6
    assert [getattr(m, "columns", None) for m in messages] == [("device_id", "temp"), None, ("device_id", "temp")]
    bad = LineStream("csv")
    rejected, nums = bad.messages([b"a,,b", b"a,b", b"1,2"], 5)
    assert nums == [1, 3] and "csv header" in getattr(rejected[0], "reason", "")
    influx = LineStream("influx")
    msgs, nums = influx.messages([b"# comment", b"m v=1"], 5)
    assert nums == [2] and len(msgs) == 1


def _model(stream: bytes, limit: int) -> list[bytes | LineTooLong]:
    """The module docstring's rules, applied to the whole stream at once."""
    out: list[bytes | LineTooLong] = []
    lines = stream.split(b"\n")
    for i, line in enumerate(lines):
        if i == len(lines) - 1 and not line:
            break  # the stream ended with a newline
        if line.endswith(b"\r"):
            line = line[:-1]
        out.append(LineTooLong(line[:limit], len(line)) if len(line) > limit else line)
    return out


# Without "\r": a line of exactly the limit followed by "\r" is cut or not depending on whether its "\n"
# came in the same read (the buffer holds the "\r" until then); reads with "\r" take the per-line loop.
@given(pieces=st.lists(st.sampled_from([b"\n", b"ab", b"x" * 7, b"y" * 20, b""]), max_size=30),
       cuts=st.lists(st.integers(1, 25), max_size=10), limit=st.integers(1, 24))
def test_framing_follows_its_rules_for_any_chunking(pieces: list[bytes], cuts: list[int], limit: int) -> None:
    stream = b"".join(pieces)
    assert _feed(LineFramer(limit), stream, cuts) == _model(stream, limit)
