"""The outbox relay: claims outbox rows and publishes them to RabbitMQ with publisher confirms.

Glossary: one word per thing, used in this sense only (docs/getting-started/glossary.md).

- row: an `outbox_message` row; its `seq` is the number enqueue gave it, the one id the loop uses.
- claim: one short transaction leasing ready rows to this relay under a fresh token (one
  statement on PostgreSQL).
- lease: the rows of one claim and their token, held until each is settled or released.
- in flight: claimed and not yet settled; `max_in_flight` is the one flow-control limit.
- run: up to 127 more rows of a key a claim takes with its head; published as a chain.
- chain: a key's rows sent one at a time, each once the one before it is confirmed.
- chunk: rows of a lease handed to the publisher together (a chain's: answered together).
- window: rows sent and not yet settled, sized to the broker's confirm round, at most
  `max_in_flight` (core/window.py).
- answer: what the broker said of a message (`Outcome`); a chunk's answers are an `Answer`.
- settle: write answers to the database (mark published; retry, defer or dead-letter). Only this.
- mark: the statement of settling that records confirmed rows as published.
- release: hand claimed rows back unsent, charging no attempt.
- suspect: a row whose relay died holding it, published apart (loop/suspects.py).
- resource: what fails together (the broker, an exchange, ...); its circuit and rate bucket.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and IDEs
    from relay.loop.counts import Counts
    from relay.loop.relay import Relay
    from relay.loop.wiring import wire_relay
    from relay.runtime.config import RelayConfig

# Name -> the module that holds it, imported on first use (PEP 562): `outbox-relay` checks that
# the relay extra is installed (relay/cli/entry.py) before anything imports tenacity or pika.
_LAZY = {
    "Counts": "relay.loop.counts",
    "Relay": "relay.loop.relay",
    "wire_relay": "relay.loop.wiring",
    "RelayConfig": "relay.runtime.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'relay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Counts", "Relay", "RelayConfig", "wire_relay"]
