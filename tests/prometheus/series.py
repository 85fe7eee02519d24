"""Scrapes of a relay's /metrics turned into promtool `input_series` (pure: no I/O).

One scrape is one sample of every series it holds; scrape i sits at i x `interval` in promtool's
time. Real time is compressed by `scale` (promtool's interval over the seconds between two real
scrapes), so what the relay measures in time is multiplied by it to stay consistent with the
compressed clock: the oldest message's age, and the latency histogram's bucket bounds (`le`).
Counts and states are kept as scraped. As Prometheus does, a series missing from a scrape (or
every series, when the scrape failed) gets one stale marker, then no samples until it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Key = tuple[str, Labels]  # metric name and labels: one series
Scrape = Mapping[Key, float] | None  # None: nothing answered at /metrics

# Seconds, and what piles up with time (the WAL a slot keeps grows with the WAL written while no
# relay confirms it: a real second's worth is what a minute would leave): scaled.
TIME_VALUED = frozenset({"outbox_oldest_ready_age_seconds", "outbox_capture_lag_bytes"})
TIME_BUCKETED = frozenset({"outbox_publish_latency_milliseconds_bucket"})  # `le` in ms: scaled


def parse(text: str, keep: Collection[str]) -> dict[Key, float]:
    """The samples of the metrics named in `keep` in a Prometheus text exposition."""
    samples: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in keep:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return samples


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.1f}"


def rescale(
    scrape: Mapping[Key, float], scale: float, rename: Callable[[str], str]
) -> dict[Key, float]:
    """`scrape` on the compressed clock, its label values passed through `rename`."""
    out: dict[Key, float] = {}
    for (name, labels), value in scrape.items():
        relabelled = []
        for label, text in labels:
            if label == "le" and name in TIME_BUCKETED and text != "+Inf":
                text = _number(float(text) * scale)
            relabelled.append((label, rename(text)))
        out[(name, tuple(relabelled))] = round(value * scale if name in TIME_VALUED else value, 1)
    return out


def tokens(key: Key, scrapes: Sequence[Scrape]) -> list[float | str]:
    """The series `key` over `scrapes`: a value, "stale" (first scrape without it) or "_"."""
    out: list[float | str] = []
    for scrape in scrapes:
        value = None if scrape is None else scrape.get(key)
        if value is not None:
            out.append(value)
        elif out and not isinstance(out[-1], str):
            out.append("stale")
        else:
            out.append("_")
    return out


def compress(values: Sequence[float | str]) -> str:
    """promtool's notation: runs of equal steps as `a+bxN` (N+1 values), of blanks as `_xN`."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        v = values[i]
        j = i + 1
        if v == "_":
            while j < len(values) and values[j] == "_":
                j += 1
            parts.append("_" if j - i == 1 else f"_x{j - i}")
        elif isinstance(v, str):
            parts.append(v)
        else:
            step = None
            while j < len(values) and not isinstance(values[j], str):
                d = float(values[j]) - float(values[j - 1])
                if step is not None and not math.isclose(d, step, abs_tol=1e-6):
                    break
                step = d
                j += 1
            if j - i == 2:
                j = i + 1  # two values are no run: the second may start a longer one
            if j - i == 1:
                parts.append(_number(v))
            else:
                parts.append(f"{_number(v)}{_step(round(step or 0.0, 1))}x{j - i - 1}")
        i = j
    return " ".join(parts)


def _step(step: float) -> str:
    return f"+{_number(step)}" if step >= 0 else f"-{_number(-step)}"


def input_series(scrapes: Sequence[Scrape], target: Mapping[str, str]) -> list[dict[str, str]]:
    """promtool `input_series` for `scrapes` of one target (`target`: its job and instance
    labels), with Prometheus's `up` beside them: 1 when the scrape answered, else 0."""
    keys = sorted({k for s in scrapes if s is not None for k in s})
    up = [1.0 if s is not None else 0.0 for s in scrapes]
    rows = [{"series": _selector("up", (), target), "values": compress(up)}]
    for name, labels in keys:
        values = compress(tokens((name, labels), scrapes))
        rows.append({"series": _selector(name, labels, target), "values": values})
    return rows


def _selector(name: str, labels: Labels, target: Mapping[str, str]) -> str:
    pairs = sorted({**dict(labels), **target}.items())
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
