"""Why MQTT over WebSockets uses ``websockets``' sans-IO protocol: client frames parsed per second, against wsproto.

Run: ``python -m bench.bench_ws_frames`` (seconds). wsproto is not a dependency: to compare, install it aside
(``pip install --target /tmp/wsproto-only --no-deps wsproto``) and run with ``PYTHONPATH=.:/tmp/wsproto-only``.

Input: masked binary frames as a client sends them (64 B, 1 KiB, 64 KiB payloads), fed in 64 KiB reads to
each library's server-side frame parser (no handshake, no sockets): the per-frame cost the WebSocket layer
adds to every MQTT packet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

READ = 64 * 1024


def client_frames(payload: int, count: int) -> bytes:
    return Frame(Opcode.BINARY, os.urandom(payload)).serialize(mask=True, extensions=[]) * count


def websockets_parse(data: bytes) -> tuple[float, int]:
    protocol = Protocol(Side.SERVER, state=State.OPEN, max_size=None)
    started, got = time.perf_counter(), 0
    for i in range(0, len(data), READ):
        protocol.receive_data(data[i:i + READ])
        got += sum(len(event.data) for event in protocol.events_received() if isinstance(event, Frame))
    return time.perf_counter() - started, got


def wsproto_parse(data: bytes) -> tuple[float, int]:
    from wsproto.frame_protocol import FrameProtocol  # type: ignore[import-not-found]  # optional: see the docstring

    protocol = FrameProtocol(client=False, extensions=[])
    started, got = time.perf_counter(), 0
    for i in range(0, len(data), READ):
        protocol.receive_bytes(data[i:i + READ])
        got += sum(len(frame.payload) for frame in protocol.received_frames())
    return time.perf_counter() - started, got


def main() -> None:
    parsers: dict[str, Callable[[bytes], tuple[float, int]]] = {"websockets": websockets_parse}
    try:
        import wsproto  # type: ignore[import-not-found]  # noqa: F401

        parsers["wsproto"] = wsproto_parse
    except ImportError:
        print("wsproto not importable: websockets only (see the module docstring)")
    for payload, count in ((64, 100_000), (1024, 30_000), (65536, 500)):
        data = client_frames(payload, count)
        cells = []
        for name, parse in parsers.items():
            elapsed, got = min((parse(data) for _ in range(3)), key=lambda r: r[0])
            assert got == payload * count
            cells.append(f"{name} {count / elapsed:,.0f} frames/s ({len(data) / elapsed / 1e6:,.0f} MB/s)")
        print(f"{payload:>6} B frames: " + " | ".join(cells))


if __name__ == "__main__":
    main()
