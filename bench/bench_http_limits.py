"""What a 100 MB request body costs the HTTP API, with the body cap (default 8 MiB) and without one.

    python -m bench.bench_http_limits [--mb 100]

One ``sluice serve`` subprocess per case (memory storage). Each case sends one ``--mb`` MB body to
``POST /topics/t/records`` twice: with curl (Content-Length, so curl sends ``Expect: 100-continue``),
then chunked (no Content-Length) from a Python socket. Reported per upload: the status, the seconds to
the answer, the bytes the client got to send, and the server's peak RSS (VmHWM) against its RSS before.
"Without a cap" is the same server with ``http.max_body_bytes`` set above the body size, which is how
the API behaved before the cap existed.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

from tests.sluice_server import SluiceProcess

MiB = 1024 * 1024


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def curl_upload(url: str, body: Path) -> tuple[str, float, int]:
    started = time.perf_counter()
    out = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-H", "Content-Type: application/json", "--data-binary", f"@{body}",
         "-w", "%{http_code} %{size_upload}", url],
        capture_output=True, text=True, timeout=600, check=False,
    ).stdout
    status, uploaded = out.split()
    return status, time.perf_counter() - started, int(uploaded)


async def chunked_upload(host: str, port: int, total: int) -> tuple[str, float, int]:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"POST /topics/t/records HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    chunk = 256 * 1024
    frame = f"{chunk:x}\r\n".encode() + b'{"records": [' + b" " * (chunk - 13) + b"\r\n"
    answer = asyncio.create_task(reader.readline())
    sent = 0
    try:
        while not answer.done() and sent < total:
            writer.write(frame)
            await writer.drain()
            sent += chunk
        if not answer.done():
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except ConnectionError:
        pass
    status_line = await asyncio.wait_for(answer, 600)
    writer.close()
    return status_line.split()[1].decode() if status_line else "closed", time.perf_counter() - started, sent


def run_case(cap: int, mb: int, body: Path) -> list[tuple[str, str, float, int, int, int]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-http-limits-") as tmp:
        server = SluiceProcess(Path(tmp) / "data", env={"SLUICE_HTTP__MAX_BODY_BYTES": str(cap)}).start()
        try:
            assert server.proc is not None
            pid = server.proc.pid
            endpoint = server.endpoints["http"]
            url = f"http://{endpoint['host']}:{endpoint['port']}/topics/t/records"
            before = memory_kib(pid)["VmRSS"]
            status, seconds, sent = curl_upload(url, body)
            rows.append(("curl, Content-Length", status, seconds, sent, before, memory_kib(pid)["VmHWM"]))
            before = memory_kib(pid)["VmRSS"]
            status, seconds, sent = asyncio.run(chunked_upload(endpoint["host"], endpoint["port"], mb * 1_000_000))
            rows.append(("chunked", status, seconds, sent, before, memory_kib(pid)["VmHWM"]))
        finally:
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        with body.open("wb") as f:
            f.write(b'{"records": [{"value": "')
            f.truncate(args.mb * 1_000_000)  # zeros after the prefix: not JSON, as the 422 case
        print("| cap | upload | status | s to answer | bytes sent | RSS before MiB | peak RSS MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for label, cap in (("8 MiB (default)", 8 * MiB), ("none (cap above the body)", 4 * args.mb * MiB)):
            for upload, status, seconds, sent, before, peak in run_case(cap, args.mb, body):
                print(f"| {label} | {upload} | {status} | {seconds:.2f} | {sent:,} | {before / 1024:.0f} | "
                      f"{peak / 1024:.0f} |")


if __name__ == "__main__":
    main()
