"""The console's views of record bytes: JSON, text, hex, and the fallbacks when bytes do not fit a view."""

from __future__ import annotations

from broker.protocol.records import Record
from sluice.console.render import MAX_SHOWN, hex_dump, show_bytes, show_record


def test_auto_picks_json_then_text_then_hex() -> None:
    assert show_bytes(b'{"a":[1,2]}').view == "json"
    assert show_bytes(b'{"a":[1,2]}').text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert show_bytes("héllo wörld".encode()).view == "text"
    binary = show_bytes(b"\x00\x01\xffabc")
    assert binary.view == "hex" and binary.text.startswith("00000000  00 01 ff 61 62 63") and binary.note is None
    assert show_bytes(None).view == "null"


def test_asked_views_fall_back_and_say_so() -> None:
    as_json = show_bytes(b"plain words", "json")
    assert as_json.view == "text" and as_json.note == "not JSON: shown as text"
    as_text = show_bytes(b"\x00\x9f", "text")
    assert as_text.view == "hex" and as_text.note == "not UTF-8 text: shown as hex"
    assert show_bytes(b'{"a":1}', "hex").view == "hex"
    assert show_bytes(b'{"a":1}', "text").text == '{"a":1}'


def test_large_values_are_cut_for_display() -> None:
    shown = show_bytes(b"x" * (MAX_SHOWN + 10))
    assert shown.view == "text" and len(shown.text) == MAX_SHOWN and shown.size == MAX_SHOWN + 10
    assert shown.note is not None and "first" in shown.note


def test_hex_dump_lines() -> None:
    dump = hex_dump(bytes(range(20)))
    lines = dump.split("\n")
    assert len(lines) == 2 and lines[1].startswith("00000010  10 11 12 13")


def test_record_headers_and_key() -> None:
    headers = (("reason", b"bad"), ("bin", b"\x00\x01"), ("n", None))
    record = Record(7, 1_700_000_000_000, b"sensor-1", b'{"t":1}', headers)
    shown = show_record(2, record, "json")
    assert (shown.partition, shown.offset, shown.key.text, shown.value.view) == (2, 7, "sensor-1", "json")
    assert shown.headers == (("reason", "bad"), ("bin", "0001"), ("n", "null"))
