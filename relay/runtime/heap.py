"""The relay process's garbage collector, set for a loop that allocates per message.

A drain makes a few objects a message (the claimed row, its frames, its outcome) that live for a
pass or two of the loop. CPython's defaults collect the young objects every 700 allocations, and
now and then every object of the process: with a claim of 500 rows in flight, that costs about a
tenth of the relay's CPU per message (gc.callbacks over an 80-byte drain of `python -m
benchmarks --phases small`), spent finding no garbage. So once
the relay is built: what starting allocated (modules, engines, pika, OpenTelemetry), which lives
as long as the process, is moved out of every later collection (`gc.freeze`), and a young
collection waits for YOUNG allocations. Cycles are still found and freed, a little later.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between young collections (CPython's default: 700)


def settle() -> None:
    """Collect once, freeze what survives, and space the young collections. Process-wide: the
    runner calls it, before the loop starts (and the in-process benchmark, as the runner does)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
