"""How many published and cancelled messages a large outbox holds, without counting them.

Counting rows by state reads the whole table, and the table is large: at the default 3-day
retention and 1,000 msg/s it holds about 260 M rows. Every other state is counted exactly, through
the partial indexes (relay/store/counting.py), so only these two are estimated, from what
PostgreSQL keeps without reading the table:

- how many rows are live: the statistics system's running count (`n_live_tup`: every insert and
  delete adds to it when its transaction ends, so it follows the table within seconds), or, when
  the statistics were reset since the table was last measured (a crash resets them), the
  planner's `reltuples` scaled to the heap's size now, as the planner itself scales it;
- ANALYZE's share of each state among the rows (pg_stats), to split what is in neither counted
  state between published and cancelled, and its share of each exchange, to spread that over the
  exchanges.

A small table (EXACT_PAGES) is counted exactly instead: scanning it costs a few milliseconds.
Everything here is pure: counting.py reads the figures and applies these rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from outbox.states import State

# A heap of at most this many pages (8 KiB each: 8 MiB, 7,000 rows of 1 KiB payloads or 60,000
# small ones) is counted exactly; above it, published and cancelled are estimated.
EXACT_PAGES = 1024

# Counted exactly at any size: each has a partial index (outbox/schema.py), so counting them
# reads the backlog and the failures, never a published row.
COUNTED: tuple[str, ...] = (
    State.PENDING.value,
    State.IN_FLIGHT.value,
    State.DEAD.value,
    State.DISCARDED.value,
)
# Estimated beside a large table: no index holds them apart from the published rows.
ESTIMATED: frozenset[str] = frozenset({State.PUBLISHED.value, State.CANCELLED.value})


def shares(values: Iterable[str] | None, freqs: Iterable[float] | None) -> dict[str, float]:
    """pg_stats' most common values and their frequencies, as {value: fraction of rows}."""
    if values is None or freqs is None:
        return {}
    return {str(v): float(f) for v, f in zip(values, freqs, strict=False)}


@dataclass(frozen=True, slots=True)
class TableStats:
    """What PostgreSQL knows about outbox_message without reading it."""

    pages: int  # the heap's size now
    live_tuples: int  # the statistics system's running count of live rows
    # A VACUUM or ANALYZE since the statistics began (its time is recorded): live_tuples was then
    # set from the table itself, and has followed every change since.
    measured: bool
    reltuples: float  # the rows the last VACUUM or ANALYZE found (-1: never ran)
    relpages: int  # the heap's size then
    state_shares: Mapping[str, float] = field(default_factory=dict)
    exchange_shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def small(self) -> bool:
        """Whether counting every row exactly is cheap."""
        return self.pages <= EXACT_PAGES

    def rows(self) -> float:
        """How many rows the table holds, as best known."""
        if self.measured or self.reltuples < 0 or self.relpages <= 0:
            # Measured since the statistics began, or never measured at all (then the running
            # count has seen every row since the table was made).
            return float(max(0, self.live_tuples))
        # The statistics were reset after the table was last measured: the running count
        # restarted from zero then, while the planner's figure survived. Scaled to the heap's size
        # now, as the planner does.
        return self.reltuples / self.relpages * self.pages


def settled(stats: TableStats, counted: Mapping[str, int]) -> dict[str, int]:
    """Published and cancelled, estimated: the rows the table holds less those `counted` exactly
    (the COUNTED states), split between the two by ANALYZE's shares."""
    rest = max(0, round(stats.rows()) - sum(counted.get(s, 0) for s in COUNTED))
    return split(rest, stats.state_shares)


def split(rest: int, state_shares: Mapping[str, float]) -> dict[str, int]:
    """`rest` rows between published and cancelled in the proportion of their shares; all of it
    published when neither has one (never analyzed, or too rare for ANALYZE's sample)."""
    published = state_shares.get(State.PUBLISHED.value, 0.0)
    cancelled = state_shares.get(State.CANCELLED.value, 0.0)
    if published + cancelled <= 0:
        return {State.PUBLISHED.value: rest, State.CANCELLED.value: 0}
    gone = round(rest * cancelled / (published + cancelled))
    return {State.PUBLISHED.value: rest - gone, State.CANCELLED.value: gone}


def per_exchange(
    stats: TableStats,
    totals: Mapping[str, int],
    counted: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, int | None]]:
    """Published and cancelled per exchange, estimated: each exchange's share of the table's rows
    (ANALYZE's, for the exchanges common enough to have one; 0 for the rest) less its rows
    `counted` exactly, split as `totals` (the table's estimates) are. None for every exchange
    when ANALYZE has not run: nothing says how the rows spread."""
    names = sorted(set(counted) | set(stats.exchange_shares))
    if not stats.exchange_shares:
        return {name: dict.fromkeys(sorted(ESTIMATED)) for name in names}
    rows = stats.rows()
    ratio = {s: float(totals.get(s, 0)) for s in ESTIMATED}
    out: dict[str, dict[str, int | None]] = {}
    for name in names:
        known = sum(counted.get(name, {}).get(s, 0) for s in COUNTED)
        rest = max(0, round(stats.exchange_shares.get(name, 0.0) * rows) - known)
        share = split(rest, ratio)
        out[name] = {s: share[s] for s in sorted(ESTIMATED)}
    return out
