"""The outbox relay: claims outbox rows and publishes them to RabbitMQ with publisher confirms."""

from relay.config import RelayConfig
from relay.relay import Relay, RunSummary

__all__ = ["Relay", "RelayConfig", "RunSummary"]
