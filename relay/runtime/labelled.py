"""Metrics of several databases' loops in one registry, each under its `database` label.

Each database's loop has its own Observer (relay/loop/observer.py), which creates its instruments
by name. OpenTelemetry keeps one instrument per name and meter: a second counter of one name is
the first again (with a warning), and a second observable gauge's callbacks are never called. So
the loops share the instruments through `Labelled`, each with a `meter_for(database)` that adds
its label to what it records and registers its gauges' callbacks with the one gauge of that name;
`close()` takes them back when the database leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import (
    CallbackOptions,
    CallbackT,
    Counter,
    Histogram,
    Meter,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    Observation,
    UpDownCounter,
)
from opentelemetry.metrics import _Gauge as Gauge
from opentelemetry.util.types import Attributes

from relay.runtime.logs import DATABASE

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def _merged(labels: Mapping[str, str], attributes: Attributes) -> dict[str, Any]:
    return {**(attributes or {}), **labels}


class Labelled:
    """The instruments every database's loop records with, made once per name."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self._lock = threading.Lock()
        self._instruments: dict[str, Any] = {}
        # name -> the callbacks of every database's gauge of that name, by database
        self._callbacks: dict[str, dict[str, list[Callback]]] = {}

    def meter_for(self, database: str) -> DatabaseMeter:
        return DatabaseMeter(self, {"database": database})

    def instrument(self, name: str, make: Callable[[Meter], Any]) -> Any:
        with self._lock:
            if name not in self._instruments:
                self._instruments[name] = make(self._meter)
            return self._instruments[name]

    def observe(
        self,
        name: str,
        database: str,
        callbacks: Sequence[Callback],
        make: Callable[[Meter, Sequence[CallbackT]], Any],
    ) -> Any:
        with self._lock:
            if name not in self._callbacks:
                self._callbacks[name] = {}
                self._instruments[name] = make(self._meter, [self._fan_out(name)])
            self._callbacks[name].setdefault(database, []).extend(callbacks)
            return self._instruments[name]

    def forget(self, database: str) -> None:
        with self._lock:
            for by_database in self._callbacks.values():
                by_database.pop(database, None)

    def _fan_out(self, name: str) -> Callback:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                callbacks = [c for cs in self._callbacks[name].values() for c in cs]
            found: list[Observation] = []
            for each in callbacks:
                found.extend(each(options))
            return found

        return callback


class _LabelledCounter(Counter):
    def __init__(self, inner: Counter, labels: Mapping[str, str]) -> None:
        self._inner, self._labels = inner, labels

    def add(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._inner.add(amount, _merged(self._labels, attributes), context)


class _LabelledUpDown(UpDownCounter):
    def __init__(self, inner: UpDownCounter, labels: Mapping[str, str]) -> None:
        self._inner, self._labels = inner, labels

    def add(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._inner.add(amount, _merged(self._labels, attributes), context)


class _LabelledHistogram(Histogram):
    def __init__(self, inner: Histogram, labels: Mapping[str, str]) -> None:
        self._inner, self._labels = inner, labels

    def record(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._inner.record(amount, _merged(self._labels, attributes), context)


class _LabelledGauge(Gauge):
    def __init__(self, inner: Gauge, labels: Mapping[str, str]) -> None:
        self._inner, self._labels = inner, labels

    def set(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._inner.set(amount, _merged(self._labels, attributes), context)


class DatabaseMeter(Meter):
    """One database's view of the shared instruments: its label on everything it records."""

    def __init__(self, shared: Labelled, labels: Mapping[str, str]) -> None:
        super().__init__("outbox-relay")
        self._shared = shared
        self._labels = dict(labels)
        self._database = labels["database"]

    def close(self) -> None:
        """Its gauges report nothing more (the database left)."""
        self._shared.forget(self._database)

    def _labelled(self, callbacks: Sequence[CallbackT] | None) -> list[Callback]:
        labels = self._labels

        database = self._database

        def labelled(callback: Callback) -> Callback:
            def observe(options: CallbackOptions) -> Iterable[Observation]:
                # Read on the HTTP thread: what it logs (an outage) names the database too.
                token = DATABASE.set(database)
                try:
                    return [
                        Observation(o.value, _merged(labels, o.attributes), o.context)
                        for o in callback(options)
                    ]
                finally:
                    DATABASE.reset(token)

            return observe

        return [labelled(c) for c in callbacks or () if callable(c)]

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        inner = self._shared.instrument(name, lambda m: m.create_counter(name, unit, description))
        return _LabelledCounter(inner, self._labels)

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        inner = self._shared.instrument(
            name, lambda m: m.create_up_down_counter(name, unit, description)
        )
        return _LabelledUpDown(inner, self._labels)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> Histogram:
        inner = self._shared.instrument(
            name,
            lambda m: m.create_histogram(
                name,
                unit,
                description,
                explicit_bucket_boundaries_advisory=explicit_bucket_boundaries_advisory,
            ),
        )
        return _LabelledHistogram(inner, self._labels)

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Gauge:
        inner = self._shared.instrument(name, lambda m: m.create_gauge(name, unit, description))
        return _LabelledGauge(inner, self._labels)

    def create_observable_gauge(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableGauge:
        return self._shared.observe(  # type: ignore[no-any-return]
            name,
            self._database,
            self._labelled(callbacks),
            lambda m, cs: m.create_observable_gauge(name, cs, unit, description),
        )

    def create_observable_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableCounter:
        return self._shared.observe(  # type: ignore[no-any-return]
            name,
            self._database,
            self._labelled(callbacks),
            lambda m, cs: m.create_observable_counter(name, cs, unit, description),
        )

    def create_observable_up_down_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableUpDownCounter:
        return self._shared.observe(  # type: ignore[no-any-return]
            name,
            self._database,
            self._labelled(callbacks),
            lambda m, cs: m.create_observable_up_down_counter(name, cs, unit, description),
        )
