"""The outbox relay: claims outbox rows and publishes them to RabbitMQ with publisher confirms."""

from relay.loop.relay import Relay, RunSummary
from relay.runtime.config import RelayConfig

__all__ = ["Relay", "RelayConfig", "RunSummary"]
