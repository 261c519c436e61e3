"""Byte-level mutations of a well-formed input, the classic AFL-style set plus length-field lies.

Every mutation is a pure function of (input, rng): a campaign with the same seed sends the same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

__all__ = ["INTERESTING_I16", "INTERESTING_I32", "MUTATIONS", "mutate", "random_bytes"]

INTERESTING_I16 = (-1, -2, 0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000, 0x100)
INTERESTING_I32 = (-1, -2, 0, 1, 0x7FFFFFFF, -0x80000000, 0x10000, 0xFFFF, 0x7FFF, 100_000_000, 0x01000000)


def random_bytes(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def _pos(rng: random.Random, data: bytes | bytearray) -> int:
    return rng.randrange(len(data)) if data else 0


def bit_flip(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        i = _pos(rng, out)
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def byte_set(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    out[_pos(rng, out)] = rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01, rng.randrange(256)))
    return bytes(out)


def truncate(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    return data[: rng.randrange(len(data) + 1)] if data else data


def cut_middle(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if len(data) < 2:
        return data
    a = _pos(rng, data)
    b = min(len(data), a + rng.randint(1, 16))
    return data[:a] + data[b:]


def insert_random(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    i = _pos(rng, data)
    return data[:i] + rng.randbytes(rng.choice((1, 2, 4, 8, 32))) + data[i:]


def duplicate_chunk(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    a = _pos(rng, data)
    b = min(len(data), a + rng.randint(1, 64))
    return data[:b] + data[a:b] * rng.choice((1, 2, 16)) + data[b:]


def splice(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """The head of this input glued to the tail of another one."""
    other = rng.choice(corpus) if corpus else data
    return data[: _pos(rng, data)] + other[_pos(rng, other) :]


def int_lie(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """Overwrite a 2- or 4-byte big-endian field with a boundary value: length/count lies, negative sizes,
    null (-1) arrays and strings, huge counts."""
    if len(data) < 4:
        return data
    out = bytearray(data)
    if rng.random() < 0.5:
        i = rng.randrange(len(out) - 1)
        out[i : i + 2] = (rng.choice(INTERESTING_I16) & 0xFFFF).to_bytes(2, "big")
    else:
        i = rng.randrange(len(out) - 3)
        out[i : i + 4] = (rng.choice(INTERESTING_I32) & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(out)


def varint_lie(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """Overwrite a byte with a long or maximal (unsigned/zigzag) varint: compact arrays/strings, MQTT lengths."""
    if not data:
        return data
    i = _pos(rng, data)
    lie = rng.choice((b"\x00", b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x01", b"\x01",
                      b"\xff\x7f", b"\xfe\xff\xff\xff\x0f"))
    return data[:i] + lie + data[i + 1 :]


MUTATIONS: tuple[Callable[[bytes, random.Random, Sequence[bytes]], bytes], ...] = (
    bit_flip,
    byte_set,
    truncate,
    cut_middle,
    insert_random,
    duplicate_chunk,
    splice,
    int_lie,
    int_lie,
    varint_lie,
)


def mutate(data: bytes, rng: random.Random, corpus: Sequence[bytes] = (), rounds: int | None = None) -> bytes:
    """``data`` after 1-4 (or ``rounds``) random mutations."""
    for _ in range(rounds if rounds is not None else rng.choice((1, 1, 1, 2, 3, 4))):
        data = rng.choice(MUTATIONS)(data, rng, corpus)
    return data
