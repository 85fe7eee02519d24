"""How the settings' text is read, and the rule each value keeps.

Each reader turns a flag's or a variable's text into a value, or raises ValueError with a message
that starts with the text: "'abc' is not an integer". A reader that is also a Rule checks a value
given in code (RelayConfig(max_in_flight=0)) by the same rule, so each rule is written once, here:
RelayConfig declares which reader's rule each of its fields keeps.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from relay.core.durations import MAX_SECONDS as MAX_DURATION_SECONDS
from relay.core.durations import positive_duration
from relay.core.failures import FailureClass
from relay.core.signing import Keyring, keys_toml
from relay.core.topology import Topology, read_topology
from relay.errors import ConfigError

# The largest count accepted: what a database INTEGER holds (attempts, limits are bound into SQL).
MAX_INT = 2**31 - 1
# The longest time in seconds accepted: longer is a typo, and would overflow a wait
# (threading.TIMEOUT_MAX) or a database interval.
MAX_SECONDS = MAX_DURATION_SECONDS

N = TypeVar("N", int, float)


class Rule(Protocol):
    def check(self, name: str, value: Any) -> None:
        """ConfigError naming `name` when `value` breaks the rule."""


@dataclass(frozen=True, slots=True)
class Ranged(Generic[N]):
    """A number: `parse` reads the text, `problem` says what is wrong with the number, if
    anything ("must be positive"); both a reader and a Rule."""

    parse: Callable[[str], N]  # ValueError "'abc' is not an integer"
    problem: Callable[[N], str | None]

    def __call__(self, raw: str) -> N:
        value = self.parse(raw)
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{raw!r} {problem}")
        return value

    def check(self, name: str, value: N) -> None:
        problem = self.problem(value)
        if problem is not None:
            raise ConfigError(f"{name} {problem}, got {value!r}")


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an integer") from None


def _count_problem(value: int) -> str | None:
    if value <= 0:
        return "must be positive"
    if value > MAX_INT:
        return f"is too large (at most {MAX_INT})"
    return None


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None


def _seconds_problem(value: float) -> str | None:
    if not math.isfinite(value):
        return "is not a finite number"
    if abs(value) > MAX_SECONDS:
        return f"is too large (at most {MAX_SECONDS:.0f} seconds, 100 years)"
    return None


def _positive_seconds(value: float) -> str | None:
    problem = _seconds_problem(value)
    return problem or (None if value > 0 else "must be positive")


def _seconds_or_zero(value: float) -> str | None:
    problem = _seconds_problem(value)
    return problem or (None if value >= 0 else "must not be negative")


def _port_number(raw: str) -> int:
    # isascii: isdigit() alone accepts "²", which int() refuses.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5):
        raise ValueError(f"{raw!r} is not a port number (0 to 65535)")
    return int(raw)


def _port_problem(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "is not a port number (0 to 65535)"


positive_int = Ranged(_integer, _count_problem)
positive_number = Ranged(_number, _positive_seconds)
non_negative_number = Ranged(_number, _seconds_or_zero)
port = Ranged(_port_number, _port_problem)


@dataclass(frozen=True, slots=True)
class OneOf:
    """A reader that accepts one of `choices` (upper-cased first when `upper`); a Rule too."""

    choices: tuple[str, ...]
    upper: bool = False

    def __call__(self, raw: str) -> str:
        value = raw.strip().upper() if self.upper else raw.strip()
        if value not in self.choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(self.choices)}")
        return value

    def check(self, name: str, value: str) -> None:
        if value not in self.choices:
            raise ConfigError(f"{name} must be one of {', '.join(self.choices)}, not {value!r}")


def age(raw: str) -> float | None:
    """A positive duration, or 'forever' (None)."""
    return None if raw.strip().lower() == "forever" else positive_duration(raw)


def duration_or_zero(raw: str) -> float:
    """A positive duration, or 0 (off)."""
    return 0.0 if raw.strip() in ("0", "0s") else positive_duration(raw)


def switch(raw: str) -> bool:
    words = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}  # fmt: skip
    try:
        return words[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{raw!r} is not on or off (use 1/0, true/false, yes/no)") from None


@dataclass(frozen=True, slots=True)
class SlotName:
    """A replication slot's (and publication's) name as PostgreSQL takes one unquoted: lower
    case letters, digits and underscores, 63 at most; a Rule too."""

    def __call__(self, raw: str) -> str:
        value = raw.strip()
        if not _SLOT.fullmatch(value):
            raise ValueError(
                f"{raw!r} is not a slot name (lower case letters, digits and _, 63 at most)"
            )
        return value

    def check(self, name: str, value: str) -> None:
        if not _SLOT.fullmatch(value):
            raise ConfigError(f"{name} must be a slot name (lower case letters, digits and _)")


_SLOT = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def text(raw: str) -> str:
    if not raw.strip():
        raise ValueError(f"{raw!r} is empty")
    return raw.strip()


def failure_classes(raw: str) -> frozenset[FailureClass]:
    """Comma-separated failure class names, or 'none'."""
    if raw.strip().lower() == "none":
        return frozenset()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    known = {c.value: c for c in FailureClass}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"{raw!r} names an unknown failure class {', '.join(unknown)} "
            f"(known: {', '.join(known)})"
        )
    return frozenset(known[n] for n in names)


def _pairs(raw: str, read: Callable[[str, str], tuple[str, Any]]) -> dict[str, Any]:
    return dict(read(item.strip(), raw) for item in raw.split(",") if item.strip())


def exchange_limits(raw: str) -> dict[str, int]:
    """Comma-separated EXCHANGE=N."""

    def read(item: str, whole: str) -> tuple[str, int]:
        name, sep, number = item.rpartition("=")
        ok = number.isascii() and number.isdigit() and len(number) <= 10
        if not sep or not ok or not 1 <= int(number) <= MAX_INT:
            raise ValueError(f"{whole!r}: {item!r} is not EXCHANGE=N with 1 <= N <= {MAX_INT}")
        return name, int(number)

    return _pairs(raw, read)


class RateLimits:
    """Comma-separated RESOURCE=RATE, in messages per second; a Rule too."""

    def __call__(self, raw: str) -> dict[str, float]:
        def read(item: str, whole: str) -> tuple[str, float]:
            name, sep, number = item.rpartition("=")
            try:
                rate = float(number)
            except ValueError:
                rate = 0.0
            if not sep or not self._fine(rate):
                raise ValueError(
                    f"{whole!r}: {item!r} is not RESOURCE=RATE with RATE > 0 messages per second"
                )
            return name, rate

        return _pairs(raw, read)

    def check(self, name: str, value: Mapping[str, float]) -> None:
        for part, rate in value.items():
            if not self._fine(rate):
                raise ConfigError(f"rate limit for {part!r} must be positive, got {rate}")

    @staticmethod
    def _fine(rate: float) -> bool:
        return rate > 0 and math.isfinite(rate)


rate_limits = RateLimits()


def readable_file(raw: str) -> str:
    """A path to a file this process can read (its content is checked where it is used)."""
    path = raw.strip()
    if not path:
        raise ValueError(f"{raw!r} is empty")
    if not os.path.exists(path):
        raise ValueError(f"{raw!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"{raw!r} is not a file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"{raw!r} cannot be read: {exc.strerror or exc}") from None
    return path


def host_name(raw: str) -> str:
    """A DNS name or an IP address, as a TLS certificate carries it."""
    name = raw.strip()
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    labels = name.rstrip(".").split(".")
    ok = 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in labels)
    if not ok:
        raise ValueError(f"{raw!r} is not a host name (e.g. rabbit.example.com)")
    return name


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def signing_keys_file(raw: str) -> Keyring:
    """A readable TOML file of signing secrets per exchange (relay/core/signing.py)."""
    if "whsec_" in raw:
        # A secret given where its file's path belongs: say so without echoing it.
        raise ValueError(
            "holds a secret, not a path: secrets go in the file or in OUTBOX_SIGNING_KEYS"
        )
    path = readable_file(raw)
    try:
        with open(path, "rb") as f:
            content = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{raw!r} cannot be read as UTF-8 text: {exc}") from None
    try:
        return keys_toml(content)
    except ValueError as exc:
        raise ValueError(f"{raw!r}: {exc}") from None


def topology_file(raw: str) -> Topology:
    """A readable TOML file describing exchanges and queues (relay/core/topology.py)."""
    path = readable_file(raw)
    try:
        with open(path, "rb") as f:
            content = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{raw!r} cannot be read as UTF-8 text: {exc}") from None
    try:
        return read_topology(content, path)
    except ValueError as exc:
        raise ValueError(f"{raw!r}: {exc}") from None
