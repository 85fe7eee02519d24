"""What the loop reads of the relay's configuration.

The configuration itself (relay.runtime.config.RelayConfig: validated, built from flags and
environment) sits above the loop; the loop only names the settings it uses, so it runs with any
object that has them, the real configuration or a test's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from relay.core.circuit import CircuitSettings
from relay.core.policy import RetryPolicy
from relay.core.retention import RetentionPolicy


class LoopSettings(Protocol):
    @property
    def relay_id(self) -> str: ...
    @property
    def amqp_url(self) -> str: ...  # names this broker's resources (relay/core/resources.py)
    @property
    def max_in_flight(self) -> int: ...  # the one limit: rows held, claimed and not settled
    @property
    def claim_max(self) -> int: ...  # rows one claim statement takes at most
    @property
    def poll_interval(self) -> float: ...
    @property
    def min_poll_interval(self) -> float: ...
    @property
    def lease_seconds(self) -> float: ...
    @property
    def drain_timeout(self) -> float: ...
    @property
    def max_batch_life(self) -> float: ...  # seconds a sent batch may wait for its outcomes
    @property
    def reclaim_interval(self) -> float: ...
    @property
    def heartbeat_interval(self) -> float: ...  # seconds between beats (relay/loop/pulse.py)
    @property
    def dead_after(self) -> float: ...  # a heartbeat this old is a dead relay's
    @property
    def sweep_interval(self) -> float: ...
    @property
    def policy(self) -> RetryPolicy: ...
    @property
    def retention(self) -> RetentionPolicy | None: ...
    @property
    def circuit(self) -> CircuitSettings: ...
    @property
    def circuit_scope(self) -> str: ...
    @property
    def circuit_refresh(self) -> float: ...
    @property
    def rate_limits(self) -> Mapping[str, float]: ...
