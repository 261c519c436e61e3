"""Whether a TLS client has ended its side of the connection, where the TLS layer does not say so.

On a TCP end of stream that comes without a TLS close_notify (a client that shuts its socket down, or
dies), uvloop's TLS layer (asyncio's alike) starts its own shutdown without calling the protocol's
``eof_received``, and its app transport's ``is_closing()`` stays false until ``connection_lost``. That waits
for the bytes not yet sent to drain: for as long as the client does not read them. Every write meanwhile
is dropped, and from the fifth one on each is logged as ``WARNING asyncio: SSL connection is closed``, a
line the operator can do nothing about. (With close_notify the layer does tell: ``eof_received``, then
``is_closing()``.) The kernel knows at once: once the peer's FIN has arrived the socket leaves
ESTABLISHED (CLOSE_WAIT). ``peer_ended`` reads that state, one ``getsockopt(TCP_INFO)``, so that the MQTT
adapter stops writing there (``session.py``). Linux only (TCP_INFO); elsewhere it never says so.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["peer_ended", "tls_socket"]

_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP_ESTABLISHED = 1  # tcpi_state, the first byte of struct tcp_info


def tls_socket(transport: Any) -> Any | None:
    """The TCP socket under a TLS transport (uvloop's pseudo-socket), or None: not TLS, or no TCP_INFO."""
    if _TCP_INFO is None or transport.get_extra_info("ssl_object") is None:
        return None
    return transport.get_extra_info("socket")


def peer_ended(sock: Any) -> bool:
    """True once the peer's end of stream has arrived (or the socket is gone)."""
    try:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0] != _TCP_ESTABLISHED)
    except (OSError, ValueError):  # closed meanwhile
        return True
