"""The CLI's tables take their width from the command's environment when they print, not at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Imported under COLUMNS=80 (as in a pytest-xdist worker), then printing for a caller that asks for 200
# columns (CliRunner's env, a shell's COLUMNS): a 150-column table row must stay whole.
SCRIPT = """
import os
from rich.table import Table
from sluice.cli_common import console
os.environ["COLUMNS"] = "200"
table = Table("broker", "last error")
table.add_row("127.0.0.1:50669", "x" * 120)
console.print(table)
print(console.width)
"""


def test_the_width_is_read_when_printing_not_at_import() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "LINES": "24"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr
    *table, width = done.stdout.splitlines()
    assert width == "200"
    assert any("127.0.0.1:50669" in line and "x" * 120 in line for line in table), done.stdout
