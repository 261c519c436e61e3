"""The Kafka door with ``security.auth = "required"``: SASL logins (PLAIN, SCRAM-SHA-256/512), right and wrong.

One input is one login conversation on a fresh connection, driven step by step (SCRAM needs the server's
nonce and salt): an optional ApiVersions, SaslHandshake v1 (or v0, then raw tokens), SaslAuthenticate
steps, and after a successful login requests that must be served (ApiVersions) or refused in place
(a second SaslHandshake/SaslAuthenticate: ILLEGAL_SASL_STATE, the connection stays). The conversation is
well-formed or breaks one thing: wrong passwords and unknown users, malformed PLAIN tokens, malformed SCRAM
client-first messages (channel binding flags, authzid, bad saslname escapes, no nonce) and client-final
messages (a nonce not ending with the server's, bad base64 in ``c=``/``p=``, a wrong channel binding, a
proof of the wrong length or value, extra attributes), tokens that are not UTF-8, huge tokens, unsupported
mechanisms, out-of-order steps (SaslAuthenticate before the handshake, another API before or during the
login, a second ApiVersions, a second SaslHandshake or an ApiVersions while authenticating), versions the
broker does not serve, and byte mutations of any frame.

Every step is judged against Kafka's ``SaslServerAuthenticator``: each request is answered (with the error
code Kafka sends: UNSUPPORTED_SASL_MECHANISM 33, ILLEGAL_SASL_STATE 34, SASL_AUTHENTICATION_FAILED 58) or the
connection is closed, as Kafka does for that step; a difference is a ``mismatch`` finding, neither within
the deadline a ``hang``. The probe is a PLAIN login; the real clients afterwards are kcat (SCRAM-SHA-512,
PLAIN) and confluent-kafka (SCRAM-SHA-256), producing and reading back.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import socket
import struct
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.fuzz.harness import BrokerProcess, Hang, Mismatch, SocketTarget, closes_after_eof, recv_exactly
from bench.fuzz.mutate import mutate

__all__ = ["KafkaSaslTarget", "ScramClient", "parse_answer", "request_frame"]

USER, PASSWORD = "fuzz", "fuzz-secret"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
NONE, UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 0, 33, 34, 58
PRE_LOGIN_MAX_FRAME = 512 * 1024  # Kafka's sasl.server.max.receive.size default


def _string(text: str | bytes | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return struct.pack(">h", len(raw)) + raw


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def request_frame(api: int, version: int, corr: int, body: bytes, client_id: str | None = "fuzz-sasl") -> bytes:
    """A request frame written from the protocol guide: size, header (v2 for flexible versions), body."""
    flexible = api == SASL_AUTHENTICATE and version >= 2 or api == API_VERSIONS and version >= 3
    head = struct.pack(">hhi", api, version, corr) + _string(client_id) + (b"\x00" if flexible else b"")
    payload = head + body
    return struct.pack(">i", len(payload)) + payload


def handshake(version: int, corr: int, mechanism: str | bytes) -> bytes:
    return request_frame(SASL_HANDSHAKE, version, corr, _string(mechanism))


def authenticate(version: int, corr: int, token: bytes) -> bytes:
    if version >= 2:  # compact bytes, then empty tagged fields
        return request_frame(SASL_AUTHENTICATE, version, corr, _uvarint(len(token) + 1) + token + b"\x00")
    return request_frame(SASL_AUTHENTICATE, version, corr, struct.pack(">i", len(token)) + token)


def api_versions(version: int, corr: int) -> bytes:
    body = _uvarint(len(b"fuzz") + 1) + b"fuzz" + _uvarint(2) + b"1" + b"\x00" if version >= 3 else b""
    return request_frame(API_VERSIONS, version, corr, body)


@dataclass(frozen=True, slots=True)
class Answer:
    closed: bool  # the broker closed the connection instead of answering
    corr: int = -1
    error: int = -1
    token: bytes = b""  # SaslAuthenticate's auth_bytes, or a raw token (handshake v0)


def parse_answer(api: int, version: int, payload: bytes) -> Answer:
    """Correlation id, error code and token of a response payload (size prefix removed)."""
    corr = struct.unpack_from(">i", payload)[0]
    pos = 4 + (1 if api == SASL_AUTHENTICATE and version >= 2 else 0)  # response header v1: tagged fields
    error = struct.unpack_from(">h", payload, pos)[0]
    pos += 2
    token = b""
    if api == SASL_AUTHENTICATE and error == NONE:
        if version >= 2:
            size, pos = _read_uvarint(payload, pos)  # compact nullable string: the error message
            pos += max(size - 1, 0)
            size, pos = _read_uvarint(payload, pos)
            token = payload[pos:pos + size - 1]
        else:
            size = struct.unpack_from(">h", payload, pos)[0]
            pos += 2 + max(size, 0)
            size = struct.unpack_from(">i", payload, pos)[0]
            token = payload[pos + 4:pos + 4 + size]
    return Answer(False, corr, error, token)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


class ScramClient:
    """RFC 5802 client side, written here (not the broker's code): first and final messages, proof."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str) -> None:
        self.hash = "sha256" if mechanism.endswith("256") else "sha512"
        self.digest_size = hashlib.new(self.hash).digest_size
        self.user, self.password, self.nonce = user, password, nonce
        self.first_bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        self.server_first = ""
        self.salted = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes, *, nonce: str | None = None, channel: str = "biws",
              proof: bytes | None = None, extra: str = "") -> bytes:
        self.server_first = server_first.decode()
        attrs = dict(part.split("=", 1) for part in self.server_first.split(","))
        self.salted = hashlib.pbkdf2_hmac(self.hash, self.password.encode(), base64.b64decode(attrs["s"]),
                                          int(attrs["i"]))
        without_proof = f"c={channel},r={attrs['r'] if nonce is None else nonce}{extra}"
        auth_message = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        client_key = hmac.digest(self.salted, b"Client Key", self.hash)
        signature = hmac.digest(hashlib.new(self.hash, client_key).digest(), auth_message, self.hash)
        real = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.expected_server = hmac.digest(hmac.digest(self.salted, b"Server Key", self.hash), auth_message,
                                           self.hash)
        return f"{without_proof},p={base64.b64encode(real if proof is None else proof).decode()}".encode()


class KafkaSaslTarget(SocketTarget):
    name = "kafka-sasl"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.corr = 0
        self.raw = False  # SaslHandshake v0 was accepted: tokens go without a request header
        self.http_headers = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
        self.corpus: list[bytes] = []

    def broker_env(self) -> dict[str, str]:
        return {"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
                "SLUICE_SECURITY__AUTH": "required", "SLUICE_SECURITY__SUPER_USERS": f'["{USER}"]'}

    def prepare_data_dir(self, data_dir: Path) -> None:
        """The campaign's user, in the store the broker reads at start."""
        from broker.security import UserStore

        UserStore(data_dir).add(USER, PASSWORD)

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        self.broker = broker
        if not self.corpus:
            self.corpus = [handshake(1, 1, m) for m in MECHANISMS] + [
                authenticate(v, 2, t) for v in (0, 1, 2) for t in (b"\0fuzz\0fuzz-secret", b"n,,n=fuzz,r=abc")]

    # ------------------------------------------------------------------ one step of a conversation

    def _open(self) -> socket.socket:
        assert self.broker is not None
        sock = socket.create_connection(self.broker.endpoints["kafka"], timeout=self.deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _next_corr(self) -> int:
        self.corr = (self.corr + 1) % 0x7FFFFFFF
        return self.corr

    def _exchange(self, frame: bytes, api: int, version: int) -> Answer:
        """Send one frame; its answer, or ``closed`` when the broker closed the connection instead."""
        assert self.sock is not None
        self.sent.append(frame)
        try:
            self.sock.sendall(frame)
        except OSError:
            return Answer(True)
        try:
            self.sock.settimeout(self.deadline)
            head = recv_exactly(self.sock, 4)
            if head is None:
                return Answer(True)
            size = struct.unpack(">i", head)[0]
            if size < 0 or size > 16 * 1024 * 1024:
                raise Mismatch(f"answer of size {size} to {frame[:40].hex()}")
            payload = recv_exactly(self.sock, size) if size else b""
            if payload is None:
                return Answer(True)
        except TimeoutError:
            raise Hang(f"no answer and no close within {self.deadline:.1f} s (API {api} v{version})") from None
        except OSError:
            return Answer(True)
        if self.raw:
            return Answer(False, token=payload, error=NONE)
        try:
            return parse_answer(api, version, payload)
        except (struct.error, IndexError):
            raise Mismatch(f"unreadable answer {payload[:60].hex()} to API {api} v{version}") from None

    def _expect(self, answer: Answer, what: str, *, error: int | None = None, closed: bool | None = None) -> None:
        if closed is True and not answer.closed:
            raise Mismatch(f"{what}: answered (error {answer.error}) where Kafka closes the connection")
        if closed is False and answer.closed:
            raise Mismatch(f"{what}: connection closed where Kafka answers")
        if error is not None and not answer.closed and answer.error != error:
            raise Mismatch(f"{what}: error {answer.error}, Kafka answers {error}")

    def _must_close(self, what: str) -> None:
        """After a refusal Kafka closes the connection: the broker must too (after its answer)."""
        assert self.sock is not None
        if not closes_after_eof(self.sock, self.deadline):
            raise Hang(f"{what}: the connection stays open after the refusal")

    def step(self, rng: random.Random) -> None:
        self._drop()
        self.sock = self._open()
        self.raw = False
        try:
            self._conversation(rng)
        finally:
            self._drop()

    # ------------------------------------------------------------------ conversations

    def _conversation(self, rng: random.Random) -> None:
        roll = rng.random()
        if roll < 0.08:
            return self._before_handshake(rng)
        if rng.random() < 0.4:  # librdkafka and the Java client ask for the versions first
            version = rng.choice((0, 1, 2, 3, 3, 9))
            answer = self._exchange(api_versions(version, self._next_corr()), API_VERSIONS, version)
            if version == 9:  # unsupported: answered UNSUPPORTED_VERSION (35), and it may be retried
                self._expect(answer, "ApiVersions v9", error=35, closed=False)
                answer = self._exchange(api_versions(0, self._next_corr()), API_VERSIONS, 0)
            self._expect(answer, "ApiVersions before the handshake", error=NONE, closed=False)
        mechanism = rng.choice(MECHANISMS)
        if roll < 0.16:
            bad = rng.choice(("GSSAPI", "OAUTHBEARER", "", "plain", "SCRAM-SHA-1", "PLAIN\0", "x" * 30000,
                              "SCRAM-SHA-256 "))
            answer = self._exchange(handshake(1, self._next_corr(), bad), SASL_HANDSHAKE, 1)
            self._expect(answer, f"SaslHandshake {bad[:20]!r}", error=UNSUPPORTED_SASL_MECHANISM, closed=False)
            return self._must_close("unsupported mechanism")
        version = 0 if rng.random() < 0.15 else 1
        answer = self._exchange(handshake(version, self._next_corr(), mechanism), SASL_HANDSHAKE, version)
        self._expect(answer, f"SaslHandshake v{version} {mechanism}", error=NONE, closed=False)
        self.raw = version == 0
        if roll < 0.24 and not self.raw:
            return self._out_of_order_during_login(rng)
        if roll < 0.32:
            return self._mutated_login(rng, mechanism)
        if roll < 0.36:
            return self._huge_token(rng)
        if self._plain(rng) if mechanism == "PLAIN" else self._scram(rng, mechanism):
            self._after_login(rng)

    def _send_token(self, token: bytes, rng: random.Random) -> tuple[Answer, int]:
        if self.raw:  # after SaslHandshake v0: the token alone, size-prefixed
            return self._exchange(struct.pack(">i", len(token)) + token, SASL_AUTHENTICATE, 0), 0
        version = rng.choice((0, 1, 2))
        return self._exchange(authenticate(version, self._next_corr(), token), SASL_AUTHENTICATE, version), version

    def _refused(self, answer: Answer, what: str, *, or_closed: bool = False) -> None:
        """A failed exchange: SASL_AUTHENTICATION_FAILED then the close (raw tokens: the close alone).
        ``or_closed``: Kafka closes without an answer here (an unexpected exception in its SASL server)."""
        if self.raw or (or_closed and answer.closed):
            self._expect(answer, what, closed=True)
            return
        self._expect(answer, what, error=SASL_AUTHENTICATION_FAILED, closed=False)
        self._must_close(what)

    def _plain(self, rng: random.Random) -> bool:
        good = f"\0{USER}\0{PASSWORD}".encode()
        bad = rng.choice((
            None, None, None,
            f"\0{USER}\0wrong".encode(), f"\0nobody\0{PASSWORD}".encode(), f"other\0{USER}\0{PASSWORD}".encode(),
            f"{USER}\0{USER}\0{PASSWORD}\0".encode(), b"", b"\0\0", f"\0{USER}\0".encode(),
            f"\0\0{PASSWORD}".encode(), b"\xff\xfe\0a\0b", f"\0{USER}\0{PASSWORD}\0extra".encode(),
            f"\0{USER}\0\ud800".encode("utf-8", "surrogatepass"),
        ))
        if bad is None:
            answer, _ = self._send_token(good, rng)
            self._expect(answer, "PLAIN with the right password", error=NONE, closed=False)
            return True
        answer, _ = self._send_token(bad, rng)
        self._refused(answer, f"PLAIN {bad[:30]!r}")
        return False

    def _any_then_close(self, answer: Answer) -> bool:
        if not answer.closed:
            self._must_close("after a refused token")
        return False

    def _scram(self, rng: random.Random, mechanism: str) -> bool:
        client = ScramClient(mechanism, USER, PASSWORD, base64.b64encode(rng.randbytes(18)).decode())
        first_roll = rng.random()
        if first_roll < 0.25:
            bad_first = rng.choice((
                b"y,,n=fuzz,r=abc", b"p=tls-unique,,n=fuzz,r=abc", b"n,a=other,n=fuzz,r=abc", b"n,,n=nobody,r=abc",
                b"n,,n=fu=zz,r=abc", b"n,,n=fuzz", b"n,,n=fuzz,r=", b"n,,r=abc", b"", b"n,,", b"\xff\xfe",
                b"n=fuzz,r=abc", b"n,,n=\xed\xa0\x80,r=a",
            ))
            answer, _ = self._send_token(bad_first, rng)
            self._refused(answer, f"SCRAM client-first {bad_first!r}")
            return False
        if first_roll < 0.9:
            first = client.first()
        else:  # an authzid (the user's own) and an extension: both are in client-first-bare's proof
            client.first_bare += ",tokenauth=false"
            first = f"n,a={USER},{client.first_bare}".encode()
        answer, version = self._send_token(first, rng)
        self._expect(answer, "SCRAM client-first", error=NONE, closed=False)
        if not answer.token.startswith(b"r=" + client.nonce.encode()):
            raise Mismatch(f"server-first {answer.token[:80]!r} does not extend the client nonce")
        gs2 = "biws" if first_roll < 0.9 else base64.b64encode(f"n,a={USER},".encode()).decode()
        final_roll = rng.random()
        if final_roll < 0.55:
            final = client.final(answer.token, channel=gs2)
            reply, _ = self._send_token(final, rng)
            self._expect(reply, "SCRAM client-final", error=NONE, closed=False)
            if reply.token != b"v=" + base64.b64encode(client.expected_server):
                raise Mismatch(f"server-final {reply.token[:80]!r} is not the server signature")
            return True
        server_nonce = dict(p.split("=", 1) for p in answer.token.decode().split(","))["r"]
        # (the final message, its verdict): "refused" as Kafka (58 then the close), "refused-or-closed" (Kafka
        # closes without an answer: its xor of a proof of the wrong length throws), "any" (Kafka accepts what
        # Sluice may refuse: a channel binding other than the GS2 header, which Kafka leaves to the proof;
        # extra attributes, which Kafka takes as extensions)
        choices: list[tuple[bytes, str]] = [
            (client.final(answer.token, nonce=client.nonce, channel=gs2), "refused"),  # the client nonce alone
            (client.final(answer.token, nonce=server_nonce[:-1], channel=gs2), "refused"),
            (client.final(answer.token, nonce=server_nonce + "x", channel=gs2), "refused"),
            (client.final(answer.token, channel="biws!"), "refused"),
            (client.final(answer.token, channel=base64.b64encode(b"y,,").decode()), "any"),
            (client.final(answer.token, channel=gs2, proof=rng.randbytes(client.digest_size)), "refused"),
            (client.final(answer.token, channel=gs2, proof=rng.randbytes(rng.choice((1, 31, 65, 200)))),
             "refused-or-closed"),
            (client.final(answer.token, channel=gs2)[:-3] + b"!!=", "refused"),  # bad base64 in p=
            (client.final(answer.token, channel=gs2).rsplit(b",p=", 1)[0], "refused"),  # no proof
            (f"c={gs2},p=abcd".encode(), "refused"),  # no nonce
            (b"\xff" + client.final(answer.token, channel=gs2), "refused"),
            (client.final(answer.token, channel=gs2, extra=",x=1"), "any"),
            (client.final(answer.token, channel=gs2, extra=",m=mandatory"), "any"),
            (client.final(answer.token, channel=gs2) + b",", "refused"),
            (b"", "refused"),
        ]
        bad_final, verdict = rng.choice(choices)
        reply, _ = self._send_token(bad_final, rng)
        if verdict == "any":
            if not reply.closed and reply.error == NONE:
                return True
            return self._any_then_close(reply)
        self._refused(reply, f"SCRAM client-final {bad_final[:60]!r}", or_closed=verdict == "refused-or-closed")
        return False

    def _after_login(self, rng: random.Random) -> None:
        """Logged in: SaslHandshake/SaslAuthenticate are answered ILLEGAL_SASL_STATE in place, the rest served."""
        self.raw = False
        for _ in range(rng.choice((1, 2, 3))):
            roll = rng.random()
            if roll < 0.3:
                answer = self._exchange(handshake(1, self._next_corr(), "PLAIN"), SASL_HANDSHAKE, 1)
                self._expect(answer, "SaslHandshake after the login", error=ILLEGAL_SASL_STATE, closed=False)
            elif roll < 0.6:
                version = rng.choice((0, 1, 2))
                answer = self._exchange(authenticate(version, self._next_corr(), b"\0fuzz\0x"), SASL_AUTHENTICATE,
                                        version)
                self._expect(answer, "SaslAuthenticate after the login", error=ILLEGAL_SASL_STATE, closed=False)
            version = rng.choice((0, 1, 2, 3))
            answer = self._exchange(api_versions(version, self._next_corr()), API_VERSIONS, version)
            self._expect(answer, "ApiVersions after the login", error=NONE, closed=False)

    def _before_handshake(self, rng: random.Random) -> None:
        """Kafka closes without an answer: SaslAuthenticate or another API before the handshake, a second
        ApiVersions; a frame that is not a Kafka request at all."""
        roll = rng.random()
        if roll < 0.3:
            answer = self._exchange(authenticate(rng.choice((0, 1, 2)), self._next_corr(), b"\0fuzz\0fuzz-secret"),
                                    SASL_AUTHENTICATE, 1)
            self._expect(answer, "SaslAuthenticate before the handshake", closed=True)
        elif roll < 0.6:
            answer = self._exchange(request_frame(METADATA, 1, self._next_corr(), struct.pack(">i", -1)), METADATA, 1)
            self._expect(answer, "Metadata before the handshake", closed=True)
        elif roll < 0.8:
            answer = self._exchange(api_versions(0, self._next_corr()), API_VERSIONS, 0)
            self._expect(answer, "ApiVersions", error=NONE, closed=False)
            answer = self._exchange(api_versions(0, self._next_corr()), API_VERSIONS, 0)
            self._expect(answer, "a second ApiVersions before the handshake", closed=True)
        else:
            body = rng.randbytes(rng.choice((0, 1, 3, 50)))
            answer = self._exchange(struct.pack(">i", len(body)) + body, -1, 0)
            self._expect(answer, "a frame that is not a Kafka request", closed=True)

    def _out_of_order_during_login(self, rng: random.Random) -> None:
        """After SaslHandshake v1, Kafka wants SaslAuthenticate: anything else is answered ILLEGAL_SASL_STATE
        in its own response and the connection closed (Kafka's handleSaslToken)."""
        roll = rng.random()
        if roll < 0.4:
            answer = self._exchange(handshake(1, self._next_corr(), "PLAIN"), SASL_HANDSHAKE, 1)
            what = "a second SaslHandshake"
        elif roll < 0.7:
            answer = self._exchange(api_versions(0, self._next_corr()), API_VERSIONS, 0)
            what = "ApiVersions after the handshake"
        else:
            answer = self._exchange(request_frame(METADATA, 1, self._next_corr(), struct.pack(">i", -1)), METADATA, 1)
            if not answer.closed:
                return self._must_close("Metadata after the handshake")  # its body: not parsed here
            return
        self._expect(answer, what, error=ILLEGAL_SASL_STATE, closed=False)
        self._must_close(what)

    def _mutated_login(self, rng: random.Random, mechanism: str) -> None:
        """A mutated SaslAuthenticate (or raw token) frame: answered or closed, never a hang or a traceback."""
        token = f"\0{USER}\0{PASSWORD}".encode() if mechanism == "PLAIN" else b"n,,n=fuzz,r=abcdef"
        frame = struct.pack(">i", len(token)) + token if self.raw else authenticate(rng.choice((0, 1, 2)), 77, token)
        mutated = mutate(frame, rng, self.corpus)
        declared = int.from_bytes(mutated[:4], "big", signed=True) if len(mutated) >= 4 else -1
        assert self.sock is not None
        self.sent.append(mutated)
        try:
            self.sock.sendall(mutated)
        except OSError:
            return
        if len(mutated) >= 4 and not 0 <= declared <= 100 * 1024 * 1024 or 0 <= declared <= len(mutated) - 4:
            self._answered_or_closed("a mutated SaslAuthenticate")  # a bad size, or a whole frame
        elif not closes_after_eof(self.sock, self.deadline):  # the broker waits for the rest of the frame
            raise Hang("no close after EOF in the middle of a SASL frame")

    def _answered_or_closed(self, what: str) -> None:
        assert self.sock is not None
        try:
            self.sock.settimeout(self.deadline)
            if recv_exactly(self.sock, 4) is None:
                return
        except TimeoutError:
            raise Hang(f"{what}: no answer and no close within {self.deadline:.1f} s") from None
        except OSError:
            return

    def _huge_token(self, rng: random.Random) -> None:
        """A token far larger than any login needs: Kafka refuses a frame over sasl.server.max.receive.size
        (512 KiB) before reading it, and closes the connection without an answer."""
        size = rng.choice((PRE_LOGIN_MAX_FRAME + 1, 2 * 1024 * 1024, 8 * 1024 * 1024))
        token = b"\0" + USER.encode() + b"\0" + b"p" * size
        frame = struct.pack(">i", len(token)) + token if self.raw else authenticate(1, self._next_corr(), token)
        answer = self._exchange(frame, SASL_AUTHENTICATE, 1)
        self._expect(answer, f"a SASL frame of {len(frame) - 4} bytes before the login", closed=True)

    # ------------------------------------------------------------------ the harness's checks

    def flush(self) -> None:
        """Every conversation ends within its step."""

    def probe(self) -> bool:
        try:
            with self._open() as sock:
                sock.settimeout(self.deadline)
                sock.sendall(handshake(1, 1, "PLAIN") + authenticate(1, 2, f"\0{USER}\0{PASSWORD}".encode())
                             + api_versions(0, 3))
                for _ in range(3):
                    head = recv_exactly(sock, 4)
                    if head is None or recv_exactly(sock, int.from_bytes(head, "big")) is None:
                        return False
                return True
        except OSError:
            return False

    def client_check(self) -> list[str]:
        assert self.broker is not None
        host, port = self.broker.endpoints["kafka"]
        failures: list[str] = []
        for mechanism in ("SCRAM-SHA-512", "PLAIN"):
            topic = f"fuzz-check-{uuid.uuid4().hex[:8]}"
            sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}", "-X",
                    f"sasl.username={USER}", "-X", f"sasl.password={PASSWORD}"]
            produce = subprocess.run(["kcat", "-b", f"{host}:{port}", *sasl, "-P", "-t", topic, "-X",
                                      "allow.auto.create.topics=true"], input=b"after-fuzz\n", capture_output=True,
                                     timeout=60)
            if produce.returncode != 0:
                failures.append(f"kcat {mechanism} produce failed: {produce.stderr.decode()[-500:]}")
            consume = subprocess.run(["kcat", "-b", f"{host}:{port}", *sasl, "-C", "-t", topic, "-o", "beginning",
                                      "-c", "1", "-e"], capture_output=True, timeout=60)
            if consume.stdout.strip() != b"after-fuzz":
                failures.append(f"kcat {mechanism} consume got {consume.stdout[:200]!r}: "
                                f"{consume.stderr.decode()[-500:]}")
        failures += self._confluent_check(f"{host}:{port}")
        return failures

    def _confluent_check(self, bootstrap: str) -> list[str]:
        from confluent_kafka import Consumer, Producer

        sasl = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": USER, "sasl.password": PASSWORD}
        topic = f"fuzz-check-ck-{uuid.uuid4().hex[:8]}"
        producer = Producer(sasl)
        producer.produce(topic, b"after-fuzz")
        if producer.flush(30) != 0:
            return ["confluent-kafka SCRAM-SHA-256: produce not delivered within 30 s"]
        consumer = Consumer({**sasl, "group.id": topic, "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    return [] if message.value() == b"after-fuzz" else [
                        f"confluent-kafka SCRAM-SHA-256 read {message.value()!r}"]
            return ["confluent-kafka SCRAM-SHA-256: nothing read back within 30 s"]
        finally:
            consumer.close()
