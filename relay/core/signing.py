"""Which secrets sign the messages of each exchange (the scheme itself is outbox/signing.py).

`OUTBOX_SIGNING_KEYS` gives the secrets of every exchange; `OUTBOX_SIGNING_KEYS_FILE` (TOML) gives
secrets per exchange, and optionally a default for the rest:

    default = ["whsec_..."]                   # exchanges not listed below; optional
    [exchanges]
    orders = ["whsec_...", "whsec_..."]       # both sign while consumers move to the second
    payments = "whsec_..."                    # one secret, or several separated by commas

A Keyring holds ready `Signer`s, so nothing is decoded per message, and never shows a secret:
not in its repr, not in an error.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.signing import InvalidSecret, Signer, secret_keys

_FILE_KEYS = frozenset({"default", "exchanges"})


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Keyring:
    """The signer of each exchange: its own, else the default, else none (sent unsigned)."""

    default: Signer | None = None
    exchanges: Mapping[str, Signer] = field(default_factory=dict)

    def for_exchange(self, exchange: str) -> Signer | None:
        return self.exchanges.get(exchange, self.default)

    def __repr__(self) -> str:  # never a secret
        listed = ", ".join(sorted(map(repr, self.exchanges)))
        return f"Keyring(default={self.default!r}, exchanges=[{listed}])"

    def merged(self, other: Keyring) -> Keyring:
        """`other`'s exchanges over this one's; ValueError when both have a default."""
        if self.default is not None and other.default is not None:
            raise ValueError(
                "OUTBOX_SIGNING_KEYS and the default of OUTBOX_SIGNING_KEYS_FILE both give the "
                "secrets of every exchange: keep one"
            )
        return Keyring(self.default or other.default, {**self.exchanges, **other.exchanges})


def keys_text(raw: str) -> Keyring:
    """OUTBOX_SIGNING_KEYS: secrets separated by commas, each signing every exchange's messages.
    ValueError (InvalidSecret) naming the position of a bad one, never its text."""
    if not raw.strip():
        raise InvalidSecret("is empty: give whsec_<base64> secrets, separated by commas")
    return Keyring(default=Signer(secret_keys(raw)))


def keys_toml(text: str) -> Keyring:
    """The TOML of OUTBOX_SIGNING_KEYS_FILE; ValueError saying where it is wrong."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says where (line, column), not what stands there: no secret in the message.
        raise ValueError(f"is not TOML: {exc}") from None
    unknown = sorted(set(table) - _FILE_KEYS)
    if unknown:
        raise ValueError(f"has unknown keys {', '.join(unknown)} (expected default, exchanges)")
    default = _signer("default", table["default"]) if "default" in table else None
    exchanges = table.get("exchanges", {})
    if not isinstance(exchanges, dict):
        raise ValueError('exchanges must be a table: [exchanges] name = ["whsec_..."]')
    signers = {str(name): _signer(f"exchanges.{name}", value) for name, value in exchanges.items()}
    if default is None and not signers:
        raise ValueError("names no secret: give default = [...] or an [exchanges] table")
    return Keyring(default, signers)


def _signer(where: str, value: Any) -> Signer:
    if isinstance(value, list) and not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: secrets must be strings")
    if not isinstance(value, str | list):
        raise ValueError(f"{where}: give a list of secrets, or one string")
    if isinstance(value, list) and not value:
        raise ValueError(f"{where}: the list of secrets is empty")
    try:
        return Signer(secret_keys(value))
    except InvalidSecret as exc:
        raise ValueError(f"{where}: {exc}") from None


def keyring_of(*parts: Keyring | None) -> Keyring | None:
    """The keyring the relay signs with, from the variable's and the file's; None: unsigned."""
    given = [part for part in parts if part is not None]
    if not given:
        return None
    ring = given[0]
    for part in given[1:]:
        ring = ring.merged(part)
    return ring
