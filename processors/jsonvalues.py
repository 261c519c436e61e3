"""JSON record values for the processors' hot path: orjson where it agrees with the stdlib.

``loads(raw)`` returns what ``json.loads(raw.decode())`` returns and raises what it raises, about
four times faster on sensor-sized documents (bench/RESULTS.md, "Stream processors"). The rule (when
orjson's reading is kept, when the stdlib reads the value again) is ``processors.record_kernels``'s,
whose compiled build this uses when there is one. ``loads`` is also the decoder of values that cross
a repartition topic (see ``processors.repartition``).
"""

from __future__ import annotations

from broker.native import select
from processors import record_kernels

__all__ = ["loads"]

loads = select(record_kernels).loads
