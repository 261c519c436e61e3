"""``TcpDevice``: a sensor that writes newline-delimited readings to Sluice's TCP listener.

Dependency-free (asyncio streams only). Readings are JSON objects (NDJSON), or lines of another
format (InfluxDB line protocol, CSV) passed as ``str``/``bytes`` with no newline.

Ack mode (``ack=True``, listener started with ``tcp.ack = true``): after each batch of lines is durable
the listener answers (``ingest/tcp/listener.py``)::

    ERR <line> <reason>                 a line that went to the dead-letter topic (counted in stats.rejected)
    OK <topic> <partition> <offset>     the last offset written to a partition
    ACK <line>                          every line up to <line> (counted from 1 per connection) is durable
    FATAL <reason>                      the log could not take the batch; the connection closes

The device keeps lines in its buffer until an ``ACK`` covers them and sends them again after a
reconnect (at-least-once).

``ack="auto"`` asks the listener on each connection: the device first writes one empty line (stored
nowhere; an ack-mode listener answers ``ACK 1``) and uses ack mode if an answer comes within
``probe_timeout``, plain mode otherwise (``acking`` says which). Plain mode never resends a line it
has written: a batch whose write fails part-way counts as sent and in ``unconfirmed`` (at most once),
since without acks the device cannot know which of its lines arrived, and resending would store
them twice.

Login (a listener with ``security.auth = "required"``): with ``username`` and ``password`` the device's
first line on each connection is ``AUTH <username> <password>`` (line 1). An ack-mode listener answers
``ACK 1``, which also serves as the ``ack="auto"`` probe; a refused login is answered
``FATAL authentication failed`` and closed (the device reconnects with backoff, as after any link error).
Use TLS where the network is not trusted: the password crosses it in that line.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from typing import Any, Literal

from clients.devices.base import BufferedDevice, Overflow
from clients.errors import DeviceError

__all__ = ["AckProtocolError", "TcpDevice", "parse_answer"]

_ANSWER = re.compile(rb"^(ACK|OK|ERR|FATAL)(?: (.*))?$")


class AckProtocolError(DeviceError, ConnectionError):
    """The listener's answer was not understood, or was FATAL; the link is dropped and the lines resent."""


def parse_answer(line: bytes) -> tuple[str, str]:
    """One answer line as (kind, rest): kind is ACK, OK, ERR or FATAL."""
    match = _ANSWER.match(line.rstrip(b"\r\n"))
    if match is None:
        raise AckProtocolError(f"unexpected answer from the TCP listener: {line[:80]!r}")
    return match.group(1).decode(), (match.group(2) or b"").decode("utf-8", "replace")


class TcpDevice(BufferedDevice):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8094,
        *,
        ack: bool | Literal["auto"] = False,
        ack_timeout: float = 10.0,
        probe_timeout: float = 2.0,
        connect_timeout: float = 5.0,
        buffer_size: int = 10_000,
        overflow: Overflow = "block",
        max_batch: int = 500,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        name: str | None = None,
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,  # TLS to the listener (security.tls_cert on the broker)
    ) -> None:
        if (username is None) != (password is None) or (username is not None and " " in username):
            raise ValueError("give both username and password (a user name without spaces), or neither")
        super().__init__(
            buffer_size=buffer_size,
            overflow=overflow,
            max_batch=max_batch,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            name=name or f"tcp:{host}:{port}",
        )
        self.host = host
        self.port = port
        self.ack = ack
        self.acking: bool | None = None if ack == "auto" else bool(ack)  # None: not asked yet
        self.ack_timeout = ack_timeout
        self.probe_timeout = probe_timeout
        self.unconfirmed = 0  # plain mode: lines written on a link that broke before the write completed
        self.connect_timeout = connect_timeout
        self.tls_context = tls_context
        self._credentials = (username, password) if username is not None and password is not None else None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._line_no = 0  # lines written on the current connection
        self.rejected = 0  # lines the listener sent to the dead-letter topic (ERR answers)
        self.last_error_line: str | None = None
        self._link_errors = (*BufferedDevice._link_errors, TimeoutError, AckProtocolError)

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.tls_context), self.connect_timeout
        )
        self._line_no = 0
        if self._credentials is not None:
            await self._login(*self._credentials)
        elif self.ack == "auto":
            self.acking = await self._probe()

    async def _login(self, username: str, password: str) -> None:
        """Send the AUTH line; in ack (or auto) mode its answer says whether the login was accepted."""
        writer, reader = self._writer, self._reader
        assert writer is not None and reader is not None
        writer.write(f"AUTH {username} {password}\n".encode())
        await writer.drain()
        self._line_no = 1
        if self.ack is False:
            return  # a plain listener answers nothing; a refusal shows as the connection closing
        try:
            line = await asyncio.wait_for(reader.readline(),
                                          self.probe_timeout if self.ack == "auto" else self.ack_timeout)
        except TimeoutError:
            if self.ack == "auto":
                self.acking = False
                return
            raise
        if not line:
            raise ConnectionError("the TCP listener closed the connection")
        kind, rest = parse_answer(line)
        if kind == "FATAL":
            raise AckProtocolError(f"the TCP listener refused the connection: {rest}")
        self.acking = True

    async def _probe(self) -> bool:
        """One empty line: an ack-mode listener answers ``ACK 1`` (or FATAL), a plain one says nothing."""
        writer, reader = self._writer, self._reader
        assert writer is not None and reader is not None
        writer.write(b"\n")
        await writer.drain()
        self._line_no = 1
        try:
            line = await asyncio.wait_for(reader.readline(), self.probe_timeout)
        except TimeoutError:
            return False
        if not line:
            raise ConnectionError("the TCP listener closed the connection")
        kind, rest = parse_answer(line)
        if kind == "FATAL":
            raise AckProtocolError(f"the TCP listener refused the connection: {rest}")
        return True

    async def _deliver(self, items: list[bytes]) -> None:
        writer, reader = self._writer, self._reader
        if writer is None or reader is None:
            raise ConnectionError("not connected")
        for item in items:
            if b"\n" in item:
                raise DeviceError(f"a reading for {self.name} contains a newline; the line protocol cannot carry it")
        writer.write(b"\n".join(items) + b"\n")
        if not self.acking:
            try:
                await writer.drain()
            except self._link_errors:
                # Some of these lines may have arrived: sending them again could store them twice.
                self.unconfirmed += len(items)
                self._writer = self._reader = None  # the next batch reconnects
                writer.close()
            self._line_no += len(items)
            return
        await writer.drain()
        self._line_no += len(items)
        while True:
            line = await asyncio.wait_for(reader.readline(), self.ack_timeout)
            if not line:
                raise ConnectionError("the TCP listener closed the connection before acknowledging")
            kind, rest = parse_answer(line)
            if kind == "ACK" and int(rest.split()[0]) >= self._line_no:
                return
            if kind == "ERR":
                self.rejected += 1
                self.last_error_line = rest
            elif kind == "FATAL":
                raise AckProtocolError(f"the TCP listener could not store the batch: {rest}")

    async def _drop_connection(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def send_reading(self, device_id: str, **fields: Any) -> None:
        """Convenience: ``{"device": device_id, **fields}`` as one NDJSON line."""
        await self.send({"device": device_id, **fields})
