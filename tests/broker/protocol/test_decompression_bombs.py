"""Decompression bombs: a small compressed batch never makes the broker allocate what it decompresses to.

Each codec's bomb (512 MiB of zeros in 27 KiB (zstd) to 24 MiB (snappy)) is decoded in a fresh interpreter, through
the reader (``decode_records``, what ListOffsets, HTTP reads and processors use) and through Produce's
validation, and that interpreter's peak RSS growth is measured: unbounded, it would be ≥ 512 MiB.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import cramjam
import crc32c
import pytest

from broker.protocol.records import Compression

BOMB_BYTES = 512 * 1024 * 1024
MIB = 1024 * 1024
PRODUCE_LIMIT = MIB + 12

_CHILD = """
import json, resource, sys
from broker.errors import BrokerError
from broker.protocol.batch_validation import validate_produce_batch
from broker.protocol.records import decode_records

batch = open(sys.argv[1], "rb").read()
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = {}
limit = int(sys.argv[2])
calls = (("produce", lambda: validate_produce_batch(batch, limit)), ("reader", lambda: decode_records(batch)))
for name, call in calls:
    before = peak()
    try:
        call()
        out[name] = ["accepted", 0]
    except BrokerError as exc:
        out[name] = [type(exc).__name__, peak() - before]
print(json.dumps(out))
"""


def _bomb_payload(codec: Compression) -> bytes:
    mib = bytes(MIB)
    copies = BOMB_BYTES // MIB
    if codec is Compression.GZIP:
        return gzip.compress(mib) * copies  # concatenated members decode as one stream
    if codec is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(mib)) * copies  # concatenated frames likewise
    if codec is Compression.LZ4:
        return bytes(cramjam.lz4.compress(mib)) * copies
    # snappy expands at most ~21x per block, so its bomb is many blocks: Java's xerial framing
    block = bytes(cramjam.snappy.compress_raw(mib))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + (struct.pack(">i", len(block)) + block) * copies


def _batch(payload: bytes, codec: Compression) -> bytes:
    after_crc = struct.pack(">hiqqqhii", int(codec), 0, 0, 0, -1, -1, -1, 1) + payload
    head = struct.pack(">qiib", 0, 49 + len(payload), 0, 2)
    return head + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_a_bomb_costs_at_most_the_limit_not_what_it_decompresses_to(codec: Compression, tmp_path: Path) -> None:
    path = tmp_path / "bomb"
    path.write_bytes(_batch(_bomb_payload(codec), codec))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(PRODUCE_LIMIT)], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    result = json.loads(done.stdout)
    produce_error, produce_growth = result["produce"]
    reader_error, reader_growth = result["reader"]
    assert produce_error == "RecordTooLargeError"
    assert reader_error == "RecordTooLargeError"
    assert produce_growth < 16 * MIB  # the topic's max.message.bytes (1 MiB) and copies of it
    assert reader_growth < 160 * MIB  # the readers' 64 MiB ceiling and copies of it
