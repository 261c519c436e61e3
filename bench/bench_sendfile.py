"""Should Fetch use sendfile? Serving segment bytes to a socket: pread + writelines vs loop.sendfile.

Run: ``python -m bench.bench_sendfile [--gib 2] [--runs 2]``. The issue asks Fetch to serve stored
bytes without copying them through Python *if that measures faster*. This isolates the mechanism: a
server in a child process sends ``--gib`` GiB from a 64 MiB file (cycled) over loopback, in responses
of one small header plus ``chunk`` bytes of the file, to a client that reads and discards. Variants:

- ``uvloop pread+writelines``: what the broker does (``PartitionLog.read`` is a pread into ``bytes``,
  Fetch hands header and data to ``writelines``); one copy into Python, one into the socket;
- ``asyncio pread+writelines``: the same on the stdlib loop, to tell the loop's share from the copy's;
- ``asyncio sendfile``: the stdlib loop's ``loop.sendfile`` (``os.sendfile``: page cache to socket,
  no copy in user space); the transport must be drained before each call.

uvloop (what ``sluice serve`` runs) has no ``loop.sendfile`` at all: it raises NotImplementedError, so
sendfile would mean leaving uvloop for the stdlib loop.

Reported per variant: GiB/s and the server's CPU seconds per GiB (from its own rusage), so the
broker-side saving per 100 B or 1 KiB record can be read off directly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILE_BYTES = 64 << 20
HEADER = b"\x00" * 64  # stands in for the encoded Fetch response fields around the records


async def serve(variant: str, path: Path, port_file: Path, total: int, chunk: int) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fd = os.open(path, os.O_RDONLY)
        offset = sent = 0
        with open(path, "rb") as fileobj:
            while sent < total:
                if offset + chunk > FILE_BYTES:
                    offset = 0
                if variant.endswith("sendfile"):
                    writer.write(HEADER)
                    await writer.drain()
                    await loop.sendfile(writer.transport, fileobj, offset, chunk)
                else:
                    writer.writelines([HEADER, os.pread(fd, chunk, offset)])
                    await writer.drain()
                offset += chunk
                sent += chunk
        os.close(fd)
        writer.close()
        done.set()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await done.wait()
    server.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{usage.ru_utime + usage.ru_stime:.6f}")


def child_main(variant: str, path: Path, port_file: Path, total: int, chunk: int) -> None:
    if variant.startswith("uvloop"):
        import uvloop

        uvloop.run(serve(variant, path, port_file, total, chunk))
    else:
        asyncio.run(serve(variant, path, port_file, total, chunk))


def one_run(variant: str, path: Path, total: int, chunk: int) -> tuple[float, float]:
    """(seconds the client took to receive everything, the server process's CPU seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_sendfile", "--child", variant, str(path), str(port_file),
             str(total), str(chunk)], stdout=subprocess.PIPE, text=True)
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.01)
        buf = bytearray(1 << 20)
        received = 0
        expected = total + (total // chunk) * len(HEADER)
        with socket.create_connection(("127.0.0.1", int(port_file.read_text()))) as sock:
            started = time.perf_counter()
            while received < expected:
                n = sock.recv_into(buf)
                if n == 0:
                    break
                received += n
            elapsed = time.perf_counter() - started
        out, _ = child.communicate(timeout=60)
        if received != expected:
            raise RuntimeError(f"{variant}: received {received} of {expected} bytes")
        return elapsed, float(out.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="GiB sent per run")
    parser.add_argument("--runs", type=int, default=2, help="interleaved rounds")
    args = parser.parse_args()
    total = int(args.gib * (1 << 30))
    variants = ("uvloop pread+writelines", "asyncio pread+writelines", "asyncio sendfile")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "segment.log"
        path.write_bytes(os.urandom(FILE_BYTES))
        # The child's start-up CPU (imports, loop), from a 1 MiB transfer, is subtracted from every run.
        startup = {v: one_run(v, path, 1 << 20, 1 << 20)[1] for v in variants}
        for chunk in (64 << 10, 1 << 20):
            rates: dict[str, list[float]] = {v: [] for v in variants}
            cpus: dict[str, list[float]] = {v: [] for v in variants}
            whole = total // chunk * chunk  # the server sends whole responses
            gib = whole / (1 << 30)
            for _ in range(args.runs):
                for variant in variants:
                    elapsed, cpu = one_run(variant, path, whole, chunk)
                    rates[variant].append(gib / elapsed)
                    cpus[variant].append((cpu - startup[variant]) / gib)
            print(f"\nchunk {chunk >> 10} KiB, {args.gib:g} GiB per run, {args.runs} rounds (median)")
            print("| variant | GiB/s | server CPU s per GiB | µs per 1 KiB record | µs per 100 B record |")
            print("|---|---:|---:|---:|---:|")
            for variant in variants:
                cpu = statistics.median(cpus[variant])
                print(f"| {variant} | {statistics.median(rates[variant]):.2f} | {cpu:.3f} | "
                      f"{cpu * 1e6 / (1 << 20):.4f} | {cpu * 1e6 / (1 << 30) * 110:.4f} |")


if __name__ == "__main__":
    main()
