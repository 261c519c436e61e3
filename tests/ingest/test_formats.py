"""Payload parsers: valid lines in every InfluxDB field type, and garbage of every kind."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.errors import FormatError
from ingest.formats import parse_csv_header, parse_csv_row, parse_influx, parse_json, parse_payload


def test_influx_all_field_types_and_escapes() -> None:
    line = (
        b'my\\ meas\\,x,tag\\=k=v\\ 1,host=h1 i=-12i,u=7u,f=1.5e3,b1=t,b2=FALSE,'
        b's="say \\"hi\\", a=b\\\\c",plain=3 1700000000000000000'
    )
    point = parse_influx(line).point
    assert point is not None
    assert point.measurement == "my meas,x"
    assert point.tags == (("tag=k", "v 1"), ("host", "h1"))
    assert point.fields == {
        "i": -12, "u": 7, "f": 1500.0, "b1": True, "b2": False, "s": 'say "hi", a=b\\c', "plain": 3.0,
    }
    assert point.timestamp == 1_700_000_000_000_000_000
    assert point.series_key() == "my\\ meas\\,x,host=h1,tag\\=k=v\\ 1"


def test_influx_fast_path_matches_slow_path() -> None:
    fast = parse_influx(b"cpu,host=a,region=x usage=1i,idle=0.5 123").point
    slow = parse_influx(b'cpu,host=a,region=x usage=1i,idle=0.5,s="q" 123').point
    assert fast is not None and slow is not None
    assert fast.tags == slow.tags and fast.fields["usage"] == slow.fields["usage"] == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"", "empty line"),
        (b"# comment", "comment"),
        (b"cpu", "expected 'measurement"),
        (b"cpu  usage=1", "expected 'measurement"),
        (b"cpu usage=1 123 extra", "expected 'measurement"),
        (b",host=a usage=1", "missing measurement"),
        (b"cpu,host usage=1", "is not key=value"),
        (b"cpu,host= usage=1", "empty value"),
        (b"cpu usage", "is not key=value"),
        (b"cpu usage=", "empty value"),
        (b"cpu usage=abc", "invalid field value"),
        (b"cpu usage=12x", "invalid field value"),
        (b"cpu usage=1.5i", "invalid integer"),
        (b"cpu usage=-1u", "unsigned field value is negative"),
        (b"cpu usage=99999999999999999999i", "out of range"),
        (b"cpu usage=nan", "not a finite number"),
        (b'cpu s="open', "unterminated"),
        (b"cpu usage=1 12:00", "invalid timestamp"),
        (b"cpu usage=1 \xff", "not UTF-8"),
    ],
)
def test_influx_garbage_is_a_format_error(line: bytes, reason: str) -> None:
    with pytest.raises(FormatError, match=reason):
        parse_influx(line)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_parsers_never_raise_anything_but_format_error(data: bytes) -> None:
    for fmt in ("json", "influx", "csv", "raw"):
        try:
            parse_payload(fmt, data, ("a", "b"))
        except FormatError:
            pass


def test_random_mutations_of_valid_lines() -> None:
    rng = random.Random(7)
    base = b'weather,station=s1 temp=21.5,ok=t,name="x y" 1700000000000000000'
    for _ in range(2000):
        mutated = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.choice(b' ,="\\=ti0\xff')
        try:
            parse_influx(bytes(mutated))
        except FormatError:
            pass


def test_json_errors_say_where() -> None:
    with pytest.raises(FormatError, match="invalid JSON: .* at byte 9"):
        parse_json(b'{"a": 1, ]')
    assert parse_json(b'{"a": {"b": 2}}').lookup("a.b") == 2


def test_csv_header_and_rows() -> None:
    cols = parse_csv_header(b"device_id, temp ,note\r\n")
    assert cols == ("device_id", "temp", "note")
    row = parse_csv_row(b'd1,21.5,"a, quoted"', cols).document
    assert row == {"device_id": "d1", "temp": 21.5, "note": "a, quoted"}
    assert parse_csv_row(b"7,-3,", cols).document == {"device_id": 7, "temp": -3, "note": ""}
    with pytest.raises(FormatError, match="2 columns, the header has 3"):
        parse_csv_row(b"d1,1", cols)
    with pytest.raises(FormatError, match="before a header"):
        parse_csv_row(b"d1,1,2", None)
    with pytest.raises(FormatError, match="empty column"):
        parse_csv_header(b"a,,b")
    with pytest.raises(FormatError, match="repeats"):
        parse_csv_header(b"a,b,a")
    with pytest.raises(FormatError):
        parse_csv_row(b'd1,"unterminated,2', cols)
