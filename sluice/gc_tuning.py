"""Garbage-collector settings for a long-running ``sluice serve`` process.

Every device message allocates a handful of container objects (the decoded packet, the routed record
tuples, the batch lists), so CPython's default generation-0 threshold (700 allocations) starts a
collection every ~100 messages, and each of those ages the survivors towards the full collections that
walk every object of the process (the web app, the routing caches, one set of objects per connection).
Measured on the MQTT ingest path (bench/RESULTS.md, "MQTT"): about a quarter of the CPU per message.

``tune_for_serving`` is called once every component has started: it moves everything allocated so far
(modules, the web app, settings) out of the collector's reach with ``gc.freeze()`` — it lives as long as
the process — and raises the generation-0 threshold to ``GEN0_THRESHOLD``. Cyclic garbage is still
collected, only in larger, rarer rounds; reference counting frees everything else at once as before.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "tune_for_serving"]

GEN0_THRESHOLD = 20_000


def tune_for_serving() -> None:
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
