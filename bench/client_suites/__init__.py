"""Conformance suites other projects wrote, run against ``sluice serve`` and a reference broker side by side."""
