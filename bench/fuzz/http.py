"""HTTP API: every route of the live OpenAPI schema, with generated and mutated bodies, parameters and
headers, over raw keep-alive sockets (so framing itself can be fuzzed).

Bodies are generated from the operation's JSON schema, then mutated at the JSON level (wrong types,
boundary numbers such as 2**63, deep nesting, huge strings, missing and unknown keys) or at the byte level;
parameters get boundary and hostile values; headers get wrong content types, length lies, chunked
encodings and oversized values. A well-framed request must get a whole response within the deadline
(long-polls: within their ``timeout_ms``); a request whose framing promises more bytes than it has, or
whose framing was mutated, is sent and its connection dropped. SSE streams are read up to their headers.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import ssl
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any

from bench.fuzz.harness import BrokerProcess, Hang, SocketTarget, closes_after_eof, recv_exactly
from bench.fuzz.mutate import mutate

__all__ = ["HttpTarget", "Operation", "value_from_schema"]

TOPICS = ("fuzz", "fuzz-b", "t")
HOSTILE_STRINGS = (
    "", " ", "..", "../..", "%2e%2e%2f", "a%00b", "\u00e9\u4e2d", "x" * 300, "x" * 20000, "_internal", "__consumer",
    "a/b", "%ff", "\ud800", "{topic}", "-1", "9223372036854775808", "null", "$SYS",
    "\u00b2", "\u0661\u0662",  # digits to str.isdigit, not to int()
)
HOSTILE_NUMBERS = (0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308)
_LONG_POLL_CAP_S = 30.0  # create_app's max_wait_ms
_SHORT_WAIT_S = 0.3


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    params: tuple[tuple[str, str, dict[str, Any]], ...]  # (name, in, schema)
    body_schema: dict[str, Any] | None

    @property
    def streams(self) -> bool:
        return self.path.endswith("/stream")


_TEXT: dict[str, Any] = {"type": "string"}
# The console's pages (not in the OpenAPI schema): their path and query parameters; the SSE tail is left out
CONSOLE_OPERATIONS = tuple(
    Operation("GET", path, tuple((name, "query", _TEXT) for name in query) + tuple(
        (name, "path", _TEXT) for name in re.findall(r"{(\w+)}", path)), None)
    for path, query in (
        ("/console", ()), ("/console/topics", ()), ("/console/topics/{topic}", ()),
        ("/console/topics/{topic}/messages", ("partition", "offset", "at", "limit", "view")),
        ("/console/groups", ()), ("/console/groups/{group_id}", ()), ("/console/sources", ()),
        ("/console/processors", ()),
    )
)


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = spec
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def value_from_schema(schema: dict[str, Any], spec: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A value the schema allows (mostly), with boundary numbers and odd strings now and then."""
    schema = _resolve(schema, spec)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return value_from_schema(rng.choice(schema[key]), spec, rng, depth + 1)
    if "allOf" in schema:
        return value_from_schema(schema["allOf"][0], spec, rng, depth + 1)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        out = {}
        required = set(schema.get("required", ()))
        for name, sub in schema.get("properties", {}).items():
            if name in required or rng.random() < 0.6:
                out[name] = value_from_schema(sub, spec, rng, depth + 1)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                out[rng.choice(("retention.ms", "segment.bytes", "cleanup.policy", "x", "max.message.bytes"))] = (
                    value_from_schema(extra, spec, rng, depth + 1))
        return out
    if kind == "array":
        n = rng.choice((0, 1, 1, 2, 3, 10)) if depth < 4 else 0
        return [value_from_schema(schema.get("items", {}), spec, rng, depth + 1) for _ in range(n)]
    if kind == "integer":
        if rng.random() < 0.2:
            return rng.choice([n for n in HOSTILE_NUMBERS if isinstance(n, int)])
        low = schema.get("minimum", 0)
        return rng.randint(int(low), int(schema.get("maximum", low + 100)))
    if kind == "number":
        return rng.choice((0.5, 1e308, -1.0, 12.25))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "string":
        return rng.choice(TOPICS) if rng.random() < 0.6 else rng.choice(HOSTILE_STRINGS)
    # untyped (Any): anything JSON
    return rng.choice(({"temp": 21.5}, "text", 42, None, [1, 2], {"a": {"b": [None]}}))


def _quote(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def _json_mutation(doc: Any, rng: random.Random) -> Any:
    """Replace one node of ``doc`` with a hostile value, or drop/add a key."""
    hostile: tuple[Any, ...] = (None, "", "x" * 100_000, 2**63, -(2**63) - 1, 10**40, 1e308, -1, [], {}, True,
               json.loads("[" * 200 + "]" * 200), "\u0000", {"__proto__": 1})
    if isinstance(doc, dict) and doc and rng.random() < 0.7:
        key = rng.choice(list(doc))
        roll = rng.random()
        if roll < 0.3:
            return {k: v for k, v in doc.items() if k != key}
        if roll < 0.6:
            return {**doc, key: _json_mutation(doc[key], rng)}
        return {**doc, key: rng.choice(hostile), "unknown-" + str(rng.randrange(9)): 1}
    if isinstance(doc, list) and doc and rng.random() < 0.7:
        i = rng.randrange(len(doc))
        return [*doc[:i], _json_mutation(doc[i], rng), *doc[i + 1 :]]
    return rng.choice(hostile)


class HttpTarget(SocketTarget):
    name = "http"

    def __init__(self, deadline: float = 10.0) -> None:
        super().__init__(deadline)
        self.spec: dict[str, Any] = {}
        self.operations: list[Operation] = []
        self.conn_budget = 0
        self.corpus: list[bytes] = []
        self.http_tls: ssl.SSLContext | None = None  # https (``tls.py``): the client side of TLS
        self.ca_file: str | None = None  # the CA the real clients (httpx, curl) verify the broker with

    def broker_env(self) -> dict[str, str]:
        return {"SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false"}

    def attach(self, broker: BrokerProcess, rng: random.Random) -> None:
        self.broker = broker
        with urllib.request.urlopen(f"{self._base()}/openapi.json", timeout=30, context=self.http_tls) as answer:
            self.spec = json.loads(answer.read())
        self.operations = []
        for path, ops in self.spec["paths"].items():
            for method, op in ops.items():
                params = tuple((p["name"], p["in"], p.get("schema", {})) for p in op.get("parameters", ()))
                content = op.get("requestBody", {}).get("content", {}).get("application/json")
                self.operations.append(Operation(method.upper(), path, params, content and content["schema"]))
        self.operations += CONSOLE_OPERATIONS
        for topic in TOPICS:  # something to read, configure and delete
            self._roundtrip_ok(f"POST /topics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               f"Content-Length: {len(json.dumps({'name': topic, 'partitions': 2}))}\r\n\r\n"
                               f"{json.dumps({'name': topic, 'partitions': 2})}".encode())
        if not self.corpus:
            self.corpus = [self._request(rng, op, mutate_body=False)[0] for op in self.operations for _ in range(5)]

    # ------------------------------------------------------------------ requests

    def _param_value(self, name: str, schema: dict[str, Any], rng: random.Random) -> str:
        if name in ("topic",):
            value: Any = rng.choice(TOPICS) if rng.random() < 0.7 else rng.choice(HOSTILE_STRINGS)
        elif name == "timeout_ms":
            value = rng.choice((0, 0, 0, 0, 10, 100, -1, 2**63, 40000, "x"))
        elif name in ("offset", "timestamp", "partition", "max", "limit", "at"):
            value = rng.choice((0, 1, 5, -1, -2, 2**31, 2**63, -(2**63) - 1, 10**30, "earliest", "latest", "1.5",
                                "2024-05-01T00:00:00Z", "", "x", "\u00b2", "\u0661\u0662", " 7 "))
        elif rng.random() < 0.7:
            value = value_from_schema(schema, self.spec, rng)
        else:
            value = rng.choice(HOSTILE_STRINGS)
        if isinstance(value, bool):
            value = str(value).lower()
        return str(value)

    def _request(self, rng: random.Random, op: Operation, mutate_body: bool = True) -> tuple[bytes, str, float]:
        """(bytes, framing, declared wait): framing is "whole", "incomplete" or "unknown"."""
        path = op.path
        query: list[tuple[str, str]] = []
        wait = 0.0
        for name, where, schema in op.params:
            if where == "path":
                path = path.replace("{" + name + "}", _quote(self._param_value(name, schema, rng)))
            elif where == "query" and rng.random() < 0.6:
                value = self._param_value(name, schema, rng)
                query.append((name, _quote(value)))
                if name == "timeout_ms" and value.lstrip("-").isascii() and value.lstrip("-").isdigit():
                    wait = min(max(int(value), 0) / 1000, _LONG_POLL_CAP_S)
        if rng.random() < 0.05:
            query.append((rng.choice(("x", "partition", "")), _quote(rng.choice(HOSTILE_STRINGS))))
        target = path + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
        body = b""
        headers = [("Host", "sluice"), ("User-Agent", "sluice-fuzz")]
        if op.body_schema is not None or rng.random() < 0.05:
            doc = value_from_schema(op.body_schema or {}, self.spec, rng)
            roll = rng.random() if mutate_body else 0.0
            if roll < 0.45:
                body = json.dumps(doc).encode()
            elif roll < 0.75:
                body = json.dumps(_json_mutation(doc, rng)).encode()
            elif roll < 0.92:
                body = mutate(json.dumps(doc).encode(), rng, self.corpus)
            else:
                body = rng.choice((b"[" * 100_000, b'{"records": [' + b"{}," * 200_000 + b"{}]}", b"\xff\xfe",
                                   b"x" * rng.choice((1000, 2_000_000)), b"null", b""))
            headers.append(("Content-Type", rng.choice(("application/json",) * 8 + (
                "text/plain", "application/json; charset=latin-1", "multipart/form-data; boundary=x", ""))))
        framing = "whole"
        roll = rng.random() if mutate_body else 1.0
        if roll < 0.03:  # a length lie: more promised than sent
            headers.append(("Content-Length", str(len(body) + rng.choice((1, 100, 10**9)))))
            framing = "incomplete"
        elif roll < 0.06 and body:
            chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
            headers.append(("Transfer-Encoding", "chunked"))
            body = chunked if rng.random() < 0.7 else mutate(chunked, rng)
            framing = "whole" if body == chunked else "unknown"
        else:
            headers.append(("Content-Length", str(len(body))))
        if rng.random() < 0.03:
            headers.append((rng.choice(("X-Big", "Cookie", "Accept")), "a" * rng.choice((100, 10_000, 100_000))))
        if rng.random() < 0.02:
            headers.append(("Content-Length", "5"))  # a second, conflicting length
            framing = "unknown"
        method = op.method if rng.random() > 0.02 else rng.choice(("PUT", "TRACE", "OPTIONS", "HEAD", "GETT"))
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        data = head.encode("utf-8", "surrogatepass") + body
        if mutate_body and rng.random() < 0.08:  # byte-level damage anywhere, framing included
            data = mutate(data, rng, self.corpus)
            framing = "unknown"
        return data, framing, wait

    # ------------------------------------------------------------------ connections

    def _base(self) -> str:
        assert self.broker is not None
        host, port = self.broker.endpoints["http"]
        return f"{'https' if self.http_tls is not None else 'http'}://{host}:{port}"

    def _connect(self) -> socket.socket:
        assert self.broker is not None
        sock = socket.create_connection(self.broker.endpoints["http"], timeout=self.deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.http_tls is None:
            return sock
        try:
            return self.http_tls.wrap_socket(sock, server_hostname="localhost")
        except BaseException:
            sock.close()
            raise

    def step(self, rng: random.Random) -> None:
        op = rng.choice(self.operations)
        data, framing, wait = self._request(rng, op)
        if self.sock is None or self.conn_budget <= 0:
            self._drop()
            self.sock = self._connect()
            self.conn_budget = rng.choice((1, 10, 100))
        self.conn_budget -= 1
        self.sent.append(data)
        try:
            self.sock.sendall(data)
        except OSError:
            self._drop()
            return
        if framing != "whole":
            # the request may be waiting for bytes that never come: end our side; the server must then
            # answer or close within the deadline
            if closes_after_eof(self.sock, self.deadline):
                self._drop()
                return
            raise Hang(f"no close within {self.deadline:.1f} s after EOF on a {framing} {op.method} {op.path}")
        # a long-poll longer than a moment: give it the moment, then drop (the close-while-waiting path)
        limit = self.deadline + wait if wait <= _SHORT_WAIT_S else _SHORT_WAIT_S
        outcome = self._read_response(limit, head_only=op.streams or data.startswith(b"HEAD"))
        if outcome == "timeout":
            if wait <= _SHORT_WAIT_S:
                raise Hang(f"no response to {op.method} {op.path} within {limit:.1f} s")
            self._drop()
        elif outcome == "close" or op.streams:
            self._drop()

    def _read_response(self, limit: float, head_only: bool = False) -> str:
        """"ok" (a whole response read, connection reusable), "close" or "timeout"."""
        assert self.sock is not None
        end = time.monotonic() + limit
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                self.sock.settimeout(max(end - time.monotonic(), 0.001))
                chunk = self.sock.recv(65536)
                if not chunk:
                    return "close"
                buf += chunk
                if time.monotonic() > end:
                    return "timeout"
            head, rest = buf.split(b"\r\n\r\n", 1)
            if head_only:
                return "close"
            lower = head.lower()
            match = re.search(rb"\r\ncontent-length:\s*(\d+)", lower)
            if match:
                need = int(match.group(1)) - len(rest)
                self.sock.settimeout(max(end - time.monotonic(), 0.001))
                if need > 0 and recv_exactly(self.sock, need) is None:
                    return "close"
            elif b"transfer-encoding: chunked" in lower:
                while not rest.endswith(b"0\r\n\r\n"):
                    self.sock.settimeout(max(end - time.monotonic(), 0.001))
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        return "close"
                    rest += chunk
            else:
                return "close"  # body until close
            return "close" if b"\r\nconnection: close" in lower else "ok"
        except TimeoutError:
            return "timeout"
        except OSError:
            return "close"

    def _roundtrip_ok(self, data: bytes) -> bool:
        try:
            with self._connect() as sock:
                sock.sendall(data)
                got = sock.recv(65536)
                return got.startswith(b"HTTP/1.1 2")
        except OSError:
            return False

    def flush(self) -> None:
        """Every input is answered before step returns: nothing pending."""

    def probe(self) -> bool:
        return self._roundtrip_ok(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")

    def client_check(self) -> list[str]:
        """httpx (a real client) produces a record and reads it back; curl answers /ready."""
        import subprocess

        import httpx

        base = self._base()
        failures = []
        topic = f"check-{uuid.uuid4().hex[:8]}"
        try:
            with httpx.Client(base_url=base, timeout=30, verify=self.ca_file or True) as client:
                client.post("/topics", json={"name": topic, "partitions": 1}).raise_for_status()
                client.post(f"/topics/{topic}/records", json={"records": [{"value": {"after": "fuzz"}}]}
                            ).raise_for_status()
                got = client.get(f"/topics/{topic}/records", params={"partition": 0, "offset": 0})
                got.raise_for_status()
                if "fuzz" not in got.text:
                    failures.append(f"httpx read back {got.text[:200]!r}")
        except httpx.HTTPError as exc:
            failures.append(f"httpx: {exc!r}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            cafile = ["--cacert", self.ca_file] if self.ca_file else []
            ready = subprocess.run(["curl", "-sf", *cafile, f"{base}/health"], capture_output=True, timeout=30)
            if ready.returncode != 0:
                failures.append(f"curl /health exited {ready.returncode}")
        return failures
