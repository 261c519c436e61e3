"""Coverage-guided fuzzing (atheris, libFuzzer) of the sans-IO decoders, in this process.

    python -m bench.fuzz.inprocess <kafka-codec|mqtt-codec|ingest-formats> [-max_total_time=60] [corpus dir]

The socket campaigns (``python -m bench.fuzz``) judge the live broker: handlers, state, concurrency,
hangs, fds. The decoders underneath are pure functions of their bytes, and libFuzzer mutating them in
process runs ~20x more inputs per second, guided by coverage. Each harness states the contract: only the
module's own error types may escape; anything else (and any abort in native code) is a crash that atheris
reports with the input, written to ``crash-*`` in the working directory. Measured in bench/RESULTS.md:
on the Kafka codec before the compact-length check, atheris found the kio abort within seconds, as the
socket campaign did.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["HARNESSES", "main"]


def _kafka_codec() -> Callable[[bytes], None]:
    from broker.protocol.kafka import KafkaProtocolError, decode_request

    def one(data: bytes) -> None:
        try:
            decode_request(data)
        except KafkaProtocolError:
            pass

    return one


def _mqtt_codec() -> Callable[[bytes], None]:
    from ingest.mqtt.codec import Decoder
    from ingest.mqtt.errors import MqttError

    def one(data: bytes) -> None:
        if not data:
            return
        version = (None, 4, 5)[data[0] % 3]  # None: before CONNECT, the decoder learns the version
        try:
            Decoder(version).feed(data[1:])
        except MqttError:
            pass

    return one


def _ingest_formats() -> Callable[[bytes], None]:
    from ingest.errors import PayloadError
    from ingest.formats import parse_payload

    def one(data: bytes) -> None:
        if not data:
            return
        fmt = ("json", "influx", "csv", "raw")[data[0] % 4]
        columns = ("device", "ts", "temp") if data[0] & 4 else None
        try:
            parse_payload(fmt, data[1:], columns)
        except PayloadError:
            pass

    return one


HARNESSES: dict[str, Callable[[], Callable[[bytes], None]]] = {
    "kafka-codec": _kafka_codec,
    "mqtt-codec": _mqtt_codec,
    "ingest-formats": _ingest_formats,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in HARNESSES:
        print(f"usage: python -m bench.fuzz.inprocess <{'|'.join(HARNESSES)}> [libFuzzer flags] [corpus]",
              file=sys.stderr)
        return 2
    import atheris  # type: ignore[import-untyped,unused-ignore]

    with atheris.instrument_imports():
        test_one = HARNESSES[argv[0]]()
    atheris.Setup([sys.argv[0], *argv[1:]], test_one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
