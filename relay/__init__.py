"""The outbox relay: claims outbox rows and publishes them to RabbitMQ with publisher confirms."""

from relay.loop.counts import Counts
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig

__all__ = ["Counts", "Relay", "RelayConfig", "wire_relay"]
