"""Plain counters of the Kafka front door, read (never reset) by whoever exports metrics.

The hot path only adds to ints and dict entries; turning them into Prometheus series happens at scrape
time in the assembly (``sluice/front_metrics.py``), so the broker imports no metrics library.

- connections: open now and accepted in total, per listener name; refused by admission, per reason
  (the limit's setting name); closed for being idle (``connections_max_idle_ms``).
- requests: by API key, counted when a request is decoded (UNSUPPORTED_VERSION answers included); keys
  we do not serve share one entry, ``UNKNOWN_API`` (-1), so random keys cannot grow the series count.
- produce: records and bytes of batches appended (duplicates of idempotent retries are not counted again).
- fetch: record bytes handed back in Fetch responses.
- produce_storage_errors: Produce partitions answered KAFKA_STORAGE_ERROR because a write or its fsync
  failed (the store logs each failure once, with the partition).
- errors: by Kafka error code, for every non-zero ``error_code`` in a response (per topic, partition or
  group), plus ``closed_bad_input``: connections closed for a malformed frame or request, and
  ``acks_zero_closed``: connections closed because an acks=0 produce failed (it has no answer to carry it).
- requests_cancelled: requests still pending when their connection ended (peer gone, idle, refused input).
"""

from __future__ import annotations

from typing import Any

from broker.protocol.kafka.codec import SUPPORTED_APIS
from broker.protocol.kafka.fetch import FetchResponse
from broker.protocol.kafka.produce import ProduceResponse

__all__ = ["UNKNOWN_API", "KafkaStats"]

UNKNOWN_API = -1  # the ``requests`` key of every API key we do not serve (exported as api="unknown")


class KafkaStats:
    __slots__ = (
        "acks_zero_closed",
        "closed_bad_input",
        "closed_idle",
        "connections_open",
        "connections_refused",
        "connections_total",
        "errors",
        "fetch_bytes",
        "produce_bytes",
        "produce_records",
        "produce_storage_errors",
        "requests",
        "requests_cancelled",
    )

    def __init__(self) -> None:
        self.connections_open: dict[str, int] = {}
        self.connections_total: dict[str, int] = {}
        self.requests: dict[int, int] = {}
        self.produce_records = 0
        self.produce_bytes = 0
        self.produce_storage_errors = 0
        self.fetch_bytes = 0
        self.errors: dict[int, int] = {}
        self.closed_bad_input = 0
        self.acks_zero_closed = 0
        self.closed_idle = 0
        self.connections_refused: dict[str, int] = {}
        self.requests_cancelled = 0

    def connected(self, listener: str) -> None:
        self.connections_open[listener] = self.connections_open.get(listener, 0) + 1
        self.connections_total[listener] = self.connections_total.get(listener, 0) + 1

    def refused(self, reason: str) -> None:
        self.connections_refused[reason] = self.connections_refused.get(reason, 0) + 1

    def disconnected(self, listener: str) -> None:
        self.connections_open[listener] = self.connections_open.get(listener, 1) - 1

    def request(self, api_key: int) -> None:
        if api_key not in SUPPORTED_APIS:
            api_key = UNKNOWN_API
        self.requests[api_key] = self.requests.get(api_key, 0) + 1

    def error(self, code: int, count: int = 1) -> None:
        self.errors[code] = self.errors.get(code, 0) + count

    def count_response(self, body: Any) -> None:
        """Count the non-zero error codes in a response body (and Fetch's record bytes)."""
        if isinstance(body, FetchResponse):
            if body.error_code:
                self.error(body.error_code)
            for topic in body.topics:
                for p in topic.partitions:
                    if p.error_code:
                        self.error(p.error_code)
                    elif p.records:
                        self.fetch_bytes += len(p.records)
        elif isinstance(body, ProduceResponse):
            for ptopic in body.topics:
                for part in ptopic.partitions:
                    if part.error_code:
                        self.error(part.error_code)
        elif isinstance(body, dict):
            self._walk(body)

    def _walk(self, body: dict[str, Any]) -> None:
        for key, value in body.items():
            if key == "error_code":
                if value:
                    self.error(int(value))
            elif isinstance(value, dict):
                self._walk(value)
            elif isinstance(value, list | tuple):
                for item in value:
                    if isinstance(item, dict):
                        self._walk(item)
