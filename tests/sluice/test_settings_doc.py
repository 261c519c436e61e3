"""The configuration reference (docs/configuration.md) matches the Settings model: every field is documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from sluice.config import Settings
from sluice.settings_doc import BEGIN, END, markdown_table, rows

README = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGENERATE = "python -m sluice.settings_doc --write docs/configuration.md"


def _all_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        item = getattr(annotation, "__args__", (None,))[0] if getattr(annotation, "__origin__", None) is list else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out |= _all_paths(annotation, f"{path}.")
            continue
        out.add(path)
        if isinstance(item, type) and issubclass(item, BaseModel):
            out |= _all_paths(item, f"{path}[].")
    return out


def test_every_settings_field_is_in_the_readme() -> None:
    text = README.read_text()
    paths = _all_paths(Settings)
    assert {"kafka.extra_listeners[].advertised_host", "storage.flush", "processors"} <= paths
    missing = sorted(p for p in paths if f"| `{p}` |" not in text)
    assert not missing, f"undocumented settings {missing}: run `{REGENERATE}`"
    assert {r.path for r in rows()} == paths


def test_the_generated_table_is_current() -> None:
    text = README.read_text()
    block = text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()
    assert block == markdown_table(), f"stale: run `{REGENERATE}`"


def test_environment_names_are_the_ones_pydantic_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    for row in rows():
        if row.env is None or row.default == "(required)" or row.type.startswith("list of"):
            continue
        if row.path in ("data_dir", "host"):
            continue  # other tests set these; the loop below covers the same mechanism
        value = {"bool": "true", "int": "7", "float": "7.5"}.get(row.type)
        if value is None:
            continue
        monkeypatch.setenv(row.env, value)
        obj: object = Settings()
        for part in row.path.split("."):
            obj = getattr(obj, part)
        assert str(obj).lower() == value, row
        monkeypatch.delenv(row.env)
