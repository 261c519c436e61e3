"""A minimal Kafka client over asyncio sockets, built on the sans-IO codec (tests only)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from broker.protocol.kafka import FrameDecoder, RequestHeader, decode_response_body, encode_request, is_flexible


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[bytes] = []
        self._corr = itertools.count(1)

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send(self, api_key: int, version: int, body: Any) -> int:
        corr = next(self._corr)
        header = RequestHeader(api_key, version, corr, "raw-client", is_flexible(api_key, version))
        self.writer.write(encode_request(header, body))
        return corr

    async def next_frame(self, timeout: float = 10) -> bytes:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionResetError("server closed the connection")
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    async def receive(self, api_key: int, version: int, timeout: float = 10) -> tuple[int, Any]:
        return decode_response_body(api_key, version, await self.next_frame(timeout), is_flexible(api_key, version))

    async def request(self, api_key: int, version: int, body: Any, timeout: float = 10) -> Any:
        corr = self.send(api_key, version, body)
        got, response = await self.receive(api_key, version, timeout)
        assert got == corr
        return response

    async def closed_by_server(self, timeout: float = 5) -> bool:
        try:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
